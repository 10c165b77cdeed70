//! [`FileKind`]: what a cutline file holds, as numbered in its frame (see [`format`](super::format)).
//! A module of its own so that both the frame codec and the error type can name it without depending
//! on each other: `format` depends on `error`, and both depend on `kind`.

use std::fmt;

/// What a file holds. Closed: a reader rejects a kind it does not expect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum FileKind {
    TaskState = 1,
    Manifest = 2,
    JobMeta = 3,
    Finished = 4,
    /// A [`crate::GenerationRecord`]: which coordinator started a generation, and from where.
    GenerationRecord = 5,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            FileKind::TaskState => "task state",
            FileKind::Manifest => "manifest",
            FileKind::JobMeta => "job meta",
            FileKind::Finished => "finished marker",
            FileKind::GenerationRecord => "generation record",
        };
        f.write_str(name)
    }
}
