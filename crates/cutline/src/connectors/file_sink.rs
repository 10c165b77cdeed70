//! [`TransactionalFileSink`]: exactly-once files in a directory. Records go to a pending file in
//! `DIR/.pending/`, which is fsynced at the barrier and published (hard link, never replacing a file)
//! as `DIR/part-<uid>-<subtask>-<checkpoint>` when the checkpoint completes. Readers of `DIR` see only
//! committed files.
//!
//! A transaction's file is known by its name and its content: the length and CRC-32 recorded when it
//! was prepared ([`FileIdentity::Content`]). A commit that finds its name taken by a file of that
//! content is done already (after a crash, or in a copy of the directory: `cp -a`, a backup restored,
//! a move to another disk); a file of other content is another run's, and the commit fails
//! permanently naming both. Checkpoints of older versions recorded device and inode instead
//! ([`FileIdentity::DevIno`]), which a copy changes; they still decode and commit where nothing moved.

use super::sink::{of_a_newer_generation, Sink, SinkContext};
use crate::error::{ConnectorError, ConnectorResult};
use cutline_core::CheckpointId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Appends one record's bytes to a buffer.
type FormatFn<T> = Arc<dyn Fn(&T, &mut Vec<u8>) + Send + Sync>;

/// Exactly-once output as files in a directory `DIR`: each record becomes one line (`format`'s bytes
/// and a newline). A subtask writes its records into a pending file in `DIR/.pending/`, fsyncs it at
/// the barrier and, once the checkpoint completes, publishes it as
/// `DIR/part-<uid>-<subtask>-<checkpoint id, 12 digits>` with a hard link that never replaces a file
/// (a rename where the file system has no hard links). Readers of `DIR` see only committed files;
/// a checkpoint in which a subtask wrote nothing publishes no file for it.
///
/// Use one output directory per job: a commit that finds its file name taken by a file of other
/// content (another run's output) fails permanently, naming both, and so does one whose published
/// and pending files were both removed. Do not move or delete `part-*` files while the job can still
/// restore a checkpoint that lists them. A copy of the directory (`cp -a`, a backup) is fine: a
/// commit recognises its own file by length and CRC-32.
pub struct TransactionalFileSink<T> {
    dir: PathBuf,
    format: FormatFn<T>,
    ctx: Option<SinkContext>,
    open: Option<OpenFile>,
    seq: u64,
    line: Vec<u8>,
    /// Old subtasks whose transactions this instance took over at a rescaled restore.
    taken_over: Vec<u32>,
}

/// The open transaction: its pending file, and the length and checksum of what was written to it.
struct OpenFile {
    name: String,
    writer: BufWriter<File>,
    len: u64,
    crc: crc32fast::Hasher,
}

/// A prepared file of a [`TransactionalFileSink`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingFile {
    /// The file's name in `DIR/.pending/` (`<uid>@<subtask>@<job>@<incarnation>-<seq>.pending`).
    pub pending: String,
    /// The name it is published under in `DIR` (`part-<uid>-<subtask>-<checkpoint, 12 digits>`).
    pub final_name: String,
    /// What the file holds, so a commit can tell its own committed file (or a copy of it) from
    /// another run's file of the same name.
    pub identity: FileIdentity,
}

/// How a commit recognises a transaction's file. Encoded where older versions had
/// `Option<(device, inode)>` (postcard: the same tags), so their checkpoints still decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileIdentity {
    /// Nothing recorded (older versions on platforms without inodes): a file of the name is taken
    /// for the transaction's.
    Unknown,
    /// (device, inode) of the prepared file, as older versions recorded it: a link keeps it, a copy
    /// of the directory does not.
    DevIno(u64, u64),
    /// The length and CRC-32 of the file's bytes, recorded at prepare.
    Content {
        /// The file's length in bytes.
        len: u64,
        /// The CRC-32 (IEEE) of its bytes.
        crc32: u32,
    },
}

impl std::fmt::Display for FileIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileIdentity::Unknown => f.write_str("unknown content"),
            FileIdentity::DevIno(d, i) => write!(f, "device {d} inode {i}"),
            FileIdentity::Content { len, crc32 } => write!(f, "{len} bytes, CRC-32 {crc32:08x}"),
        }
    }
}

pub(crate) const PENDING_DIR: &str = ".pending";

impl<T> TransactionalFileSink<T> {
    /// `format` appends one record's bytes (without the newline) to the buffer.
    pub fn new(dir: impl Into<PathBuf>, format: impl Fn(&T, &mut Vec<u8>) + Send + Sync + 'static) -> Self {
        TransactionalFileSink {
            dir: dir.into(),
            format: Arc::new(format),
            ctx: None,
            open: None,
            seq: 0,
            line: Vec::new(),
            taken_over: Vec::new(),
        }
    }

    fn pending_dir(&self) -> PathBuf {
        self.dir.join(PENDING_DIR)
    }

    fn prefix(&self) -> String {
        self.prefix_of(self.ctx.as_ref().expect("opened").subtask)
    }

    /// The pending files' prefix of `subtask` of this sink.
    fn prefix_of(&self, subtask: u32) -> String {
        let c = self.ctx.as_ref().expect("opened");
        // '@' cannot occur in a uid or the job id, so no sink's prefix is a prefix of another sink's
        // names, nor of the names of the same sink in another job.
        format!("{}@{}@{}@", c.uid, subtask, c.job)
    }

    /// The subtasks whose transactions this instance answers for at a recovery: its own, and those it
    /// took over after a rescale.
    fn recovered_subtasks(&self) -> Vec<u32> {
        let own = self.ctx.as_ref().expect("opened").subtask;
        let mut all = vec![own];
        all.extend(self.taken_over.iter().copied().filter(|j| *j != own));
        all
    }
}

impl<T> Clone for TransactionalFileSink<T> {
    fn clone(&self) -> Self {
        TransactionalFileSink {
            dir: self.dir.clone(),
            format: self.format.clone(),
            ctx: None,
            open: None,
            seq: 0,
            line: Vec::new(),
            taken_over: Vec::new(),
        }
    }
}

fn io_err(what: &str, p: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", p.display())
}

/// Make `from` visible as `to` without ever replacing an existing `to` (`AlreadyExists` then). Uses a
/// hard link; on file systems without hard links, a rename after checking that `to` is absent (the
/// sink is the only writer of its own names, so the check cannot race with another commit of them).
fn publish_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    match fs::hard_link(from, to) {
        Err(e) if matches!(e.kind(), std::io::ErrorKind::Unsupported | std::io::ErrorKind::PermissionDenied) => {
            if to.exists() {
                return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "target exists"));
            }
            fs::rename(from, to)?;
            // Renamed, not linked: the pending name is gone already; recreate nothing.
            Ok(())
        }
        r => r,
    }
}

/// (device, inode) of a file, where the platform has them.
#[cfg(unix)]
fn file_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(_p: &Path) -> Option<(u64, u64)> {
    None
}

/// The [`FileIdentity::Content`] of the file at `p`.
fn content_of(p: &Path) -> Result<FileIdentity, String> {
    let mut f = File::open(p).map_err(|e| io_err("cannot read", p, e))?;
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut len = 0u64;
    loop {
        let n = std::io::Read::read(&mut f, &mut buf).map_err(|e| io_err("cannot read", p, e))?;
        if n == 0 {
            break;
        }
        crc.update(&buf[..n]);
        len += n as u64;
    }
    Ok(FileIdentity::Content { len, crc32: crc.finalize() })
}

/// Is the file at `to` the one the transaction `c` prepared (or a copy of it)? `Err` says what it is
/// instead.
fn is_transactions_file(c: &PendingFile, to: &Path) -> Result<Result<(), FileIdentity>, String> {
    match c.identity {
        FileIdentity::Unknown => Ok(Ok(())),
        FileIdentity::DevIno(d, i) => match file_id(to) {
            Some(found) if found == (d, i) => Ok(Ok(())),
            Some((fd, fi)) => Ok(Err(FileIdentity::DevIno(fd, fi))),
            None => Ok(Err(FileIdentity::Unknown)),
        },
        FileIdentity::Content { .. } => {
            let found = content_of(to)?;
            Ok(if found == c.identity { Ok(()) } else { Err(found) })
        }
    }
}

/// The error of a commit that found another file under its transaction's name.
fn another_runs_file(c: &PendingFile, to: &Path, found: FileIdentity) -> ConnectorError {
    let advice = match c.identity {
        FileIdentity::DevIno(..) => "; the checkpoint was written by an older cutline that knew files by device and inode, which copying or restoring the output directory changes: if it was copied, resume from the original directory once, or start on a fresh output and state directory",
        _ => "; use one output directory per job, or a fresh output directory",
    };
    ConnectorError::permanent(format!(
        "{} is another run's file: it holds {found}, and transaction {} wrote {}{advice}",
        to.display(),
        c.pending,
        c.identity
    ))
}

/// Are `a` and `b` the same file (two links to one inode)?
#[cfg(unix)]
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_a: &Path, _b: &Path) -> bool {
    false
}

fn fsync_dir(p: &Path) -> Result<(), String> {
    File::open(p).and_then(|d| d.sync_all()).map_err(|e| io_err("fsync of directory", p, e))
}

impl<T: Send + 'static> Sink<T> for TransactionalFileSink<T> {
    type Committable = PendingFile;

    fn open(&mut self, ctx: &SinkContext) -> ConnectorResult<()> {
        fs::create_dir_all(self.pending_dir()).map_err(|e| io_err("cannot create", &self.pending_dir(), e))?;
        self.ctx = Some(ctx.clone());
        Ok(())
    }

    fn recover(&mut self, to_commit: &[PendingFile]) -> ConnectorResult<()> {
        self.commit(to_commit)?;
        let keep: BTreeSet<&str> = to_commit.iter().map(|c| c.pending.as_str()).collect();
        let prefixes: Vec<String> = self.recovered_subtasks().into_iter().map(|j| self.prefix_of(j)).collect();
        let dir = self.pending_dir();
        let own = self.ctx.as_ref().expect("opened").incarnation;
        for entry in fs::read_dir(&dir).map_err(|e| io_err("cannot list", &dir, e))? {
            let entry = entry.map_err(|e| io_err("cannot list", &dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = prefixes.iter().find(|p| name.starts_with(p.as_str()));
            if let Some(prefix) = ours {
                if !keep.contains(name.as_str()) && !of_a_newer_generation(&name[prefix.len()..], own) {
                    fs::remove_file(entry.path()).map_err(|e| io_err("cannot discard", &entry.path(), e))?;
                }
            }
        }
        Ok(())
    }

    /// Committed names carry the old subtask (`part-<uid>-<old subtask>-<checkpoint>`), and pending
    /// files are found by the old subtask's prefix: taking them over needs nothing more.
    fn take_over(&mut self, old_subtasks: &[u32], _old_parallelism: u32) -> ConnectorResult<bool> {
        self.taken_over = old_subtasks.to_vec();
        Ok(true)
    }

    fn write(&mut self, item: T) -> ConnectorResult<()> {
        if self.open.is_none() {
            let c = self.ctx.as_ref().expect("opened");
            let name = format!("{}{}-{}.pending", self.prefix(), c.incarnation, self.seq);
            self.seq += 1;
            let path = self.pending_dir().join(&name);
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| io_err("cannot create", &path, e))?;
            let writer = BufWriter::with_capacity(1 << 16, f);
            self.open = Some(OpenFile { name, writer, len: 0, crc: crc32fast::Hasher::new() });
        }
        self.line.clear();
        (self.format)(&item, &mut self.line);
        self.line.push(b'\n');
        let o = self.open.as_mut().expect("just opened");
        o.writer.write_all(&self.line).map_err(|e| format!("writing pending output: {e}"))?;
        o.len += self.line.len() as u64;
        o.crc.update(&self.line);
        Ok(())
    }

    fn prepare(&mut self, checkpoint: CheckpointId) -> ConnectorResult<Option<PendingFile>> {
        let Some(o) = self.open.take() else {
            return Ok(None);
        };
        let f = o.writer.into_inner().map_err(|e| format!("flushing pending output: {e}"))?;
        f.sync_all().map_err(|e| format!("fsync of pending output: {e}"))?;
        // The file's directory entry must survive a power loss too: the checkpoint will refer to it.
        fsync_dir(&self.pending_dir())?;
        let c = self.ctx.as_ref().expect("opened");
        Ok(Some(PendingFile {
            pending: o.name,
            final_name: format!("part-{}-{}-{:012}", c.uid, c.subtask, checkpoint.0),
            identity: FileIdentity::Content { len: o.len, crc32: o.crc.finalize() },
        }))
    }

    fn commit(&mut self, committables: &[PendingFile]) -> ConnectorResult<()> {
        if committables.is_empty() {
            return Ok(());
        }
        for c in committables {
            let from = self.pending_dir().join(&c.pending);
            let to = self.dir.join(&c.final_name);
            // Publish with a hard link, which never replaces an existing file, then drop the pending name.
            match publish_no_replace(&from, &to) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A commit interrupted between the link and the unlink (or a copy of the
                    // directory made then): finish it, if the file is this transaction's.
                    if !same_file(&from, &to) {
                        // The pending file is there to compare with, whatever the checkpoint recorded.
                        let mine = match c.identity {
                            FileIdentity::Content { .. } => c.identity,
                            _ => content_of(&from)?,
                        };
                        let found = content_of(&to)?;
                        if found != mine {
                            return Err(another_runs_file(&PendingFile { identity: mine, ..c.clone() }, &to, found));
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => {
                    // Committed before, if `to` is this transaction's file (or a copy) and not another run's.
                    if let Err(found) = is_transactions_file(c, &to)? {
                        return Err(another_runs_file(c, &to, found));
                    }
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(ConnectorError::permanent(format!(
                        "committed output {} and its pending file are both gone: part-* files must not be moved or deleted while the job can still restore a checkpoint that lists them ({e})",
                        to.display()
                    )))
                }
                Err(e) => return Err(io_err("cannot commit", &from, e).into()),
            }
            match fs::remove_file(&from) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // published by rename
                Err(e) => return Err(io_err("cannot remove committed pending file", &from, e).into()),
            }
        }
        Ok(fsync_dir(&self.dir)?)
    }

    fn abort(&mut self) {
        if let Some(o) = self.open.take() {
            let _ = fs::remove_file(self.pending_dir().join(o.name));
        }
    }

    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> ConnectorResult<Option<bool>> {
        let c = self.ctx.as_ref().expect("opened");
        let prefixes: Vec<String> =
            self.recovered_subtasks().into_iter().map(|j| format!("part-{}-{}-", c.uid, j)).collect();
        let after = checkpoint.map(|c| c.0).unwrap_or(0);
        for entry in fs::read_dir(&self.dir).map_err(|e| io_err("cannot list", &self.dir, e))? {
            let name =
                entry.map_err(|e| io_err("cannot list", &self.dir, e))?.file_name().to_string_lossy().into_owned();
            for prefix in &prefixes {
                let id =
                    name.strip_prefix(prefix.as_str()).filter(|r| r.len() == 12).and_then(|r| r.parse::<u64>().ok());
                if id.is_some_and(|id| id > after) {
                    return Ok(Some(true));
                }
            }
        }
        Ok(Some(false))
    }
}

#[cfg(test)]
mod tests;
