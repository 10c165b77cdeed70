//! [`FileKind`]: what a cutline file holds, as numbered in its frame (see [`format`](super::format)).
//! A module of its own so that both the frame codec and the error type can name it without depending
//! on each other: `format` depends on `error`, and both depend on `kind`.

use std::fmt;

/// What a file holds, as the `kind` field of its frame numbers it. Closed: a reader rejects a kind it
/// does not expect ([`crate::StorageError::WrongKind`]). The numbers are on disk: never renumber them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum FileKind {
    /// The snapshot of one subtask of one operator: an opaque payload, written by
    /// [`crate::CheckpointStore::write_task_state`] and referenced by a [`crate::TaskStateHandle`].
    TaskState = 1,
    /// A [`crate::Manifest`]: the commit record of one checkpoint (`_MANIFEST` in its directory).
    Manifest = 2,
    /// The [`crate::JobMeta`] of the job (`job.meta` at the store root).
    JobMeta = 3,
    /// The finished marker (`FINISHED` at the store root): the id of the end-of-input checkpoint the
    /// job finished with, written by [`crate::CheckpointStore::mark_finished`].
    Finished = 4,
    /// A [`crate::GenerationRecord`] (`generations/gen-<generation>`): which coordinator started a
    /// generation, and from where.
    GenerationRecord = 5,
    /// The statistics and epoch trace of one completed checkpoint (`stats/chk-<id>`): an opaque
    /// payload the engine writes after the checkpoint completed, kept for dashboards and `cutline
    /// trace` (also after a restart), never read to restore anything.
    CheckpointStats = 6,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            FileKind::TaskState => "task state",
            FileKind::Manifest => "manifest",
            FileKind::JobMeta => "job meta",
            FileKind::Finished => "finished marker",
            FileKind::GenerationRecord => "generation record",
            FileKind::CheckpointStats => "checkpoint statistics",
        };
        f.write_str(name)
    }
}
