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
        }
    }

    fn pending_dir(&self) -> PathBuf {
        self.dir.join(PENDING_DIR)
    }

    fn prefix(&self) -> String {
        let c = self.ctx.as_ref().expect("opened");
        // '@' cannot occur in a uid or the job id, so no sink's prefix is a prefix of another sink's
        // names, nor of the names of the same sink in another job.
        format!("{}@{}@{}@", c.uid, c.subtask, c.job)
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
        let prefix = self.prefix();
        let dir = self.pending_dir();
        let own = self.ctx.as_ref().expect("opened").incarnation;
        let newer = |name: &str| of_a_newer_generation(&name[prefix.len()..], own);
        for entry in fs::read_dir(&dir).map_err(|e| io_err("cannot list", &dir, e))? {
            let entry = entry.map_err(|e| io_err("cannot list", &dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && !keep.contains(name.as_str()) && !newer(&name) {
                fs::remove_file(entry.path()).map_err(|e| io_err("cannot discard", &entry.path(), e))?;
            }
        }
        Ok(())
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
        let prefix = format!("part-{}-{}-", c.uid, c.subtask);
        let after = checkpoint.map(|c| c.0).unwrap_or(0);
        for entry in fs::read_dir(&self.dir).map_err(|e| io_err("cannot list", &self.dir, e))? {
            let name =
                entry.map_err(|e| io_err("cannot list", &self.dir, e))?.file_name().to_string_lossy().into_owned();
            let id = name.strip_prefix(&prefix).filter(|r| r.len() == 12).and_then(|r| r.parse::<u64>().ok());
            if id.is_some_and(|id| id > after) {
                return Ok(Some(true));
            }
        }
        Ok(Some(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(uid: &str, subtask: u32, incarnation: u64) -> SinkContext {
        SinkContext { uid: uid.into(), subtask, parallelism: 2, incarnation, job: "j1".into() }
    }

    fn line_sink(dir: &Path) -> TransactionalFileSink<String> {
        TransactionalFileSink::new(dir, |s: &String, buf: &mut Vec<u8>| buf.extend_from_slice(s.as_bytes()))
    }

    #[test]
    fn recover_of_one_sink_never_discards_another_sinks_pending_files_regression_prefix_collision() {
        // Sink "out" subtask 1 and sink "out-1" subtask 0 share a directory; with names "uid-subtask-..."
        // the first one's recovery took the second one's pending file for its own and deleted it.
        let dir = tempfile::tempdir().unwrap();
        let mut other = line_sink(dir.path());
        other.open(&ctx("out-1", 0, 7)).unwrap();
        other.write("kept".into()).unwrap();
        let prepared = other.prepare(CheckpointId(3)).unwrap().expect("a transaction");
        let mut sink = line_sink(dir.path());
        sink.open(&ctx("out", 1, 9)).unwrap();
        sink.recover(&[]).unwrap();
        other.commit(&[prepared]).unwrap();
        let committed = std::fs::read_to_string(dir.path().join("part-out-1-0-000000000003")).unwrap();
        assert_eq!(committed, "kept\n");
    }

    #[test]
    fn a_stale_incarnation_never_discards_a_newer_generations_transaction_regression_late_worker() {
        // A worker that started its tasks late (its deployment was called off while it restored) ran
        // `recover` after the next generation, on another worker, had prepared its transaction.
        let dir = tempfile::tempdir().unwrap();
        let mut newer = line_sink(dir.path());
        newer.open(&ctx("out", 0, (5 << 32) | 3)).unwrap();
        newer.write("kept".into()).unwrap();
        let prepared = newer.prepare(CheckpointId(9)).unwrap().expect("a transaction");
        let mut stale = line_sink(dir.path());
        stale.open(&ctx("out", 0, (4 << 32) | 3)).unwrap();
        stale.recover(&[]).unwrap();
        newer.commit(&[prepared]).unwrap();
        let committed = std::fs::read_to_string(dir.path().join("part-out-0-000000000009")).unwrap();
        assert_eq!(committed, "kept\n");
    }

    #[test]
    fn commit_is_idempotent_and_recover_discards_newer_pending_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = line_sink(dir.path());
        s.open(&ctx("out", 0, 1)).unwrap();
        s.write("a".into()).unwrap();
        let c1 = s.prepare(CheckpointId(1)).unwrap().unwrap();
        s.write("b".into()).unwrap();
        let _c2 = s.prepare(CheckpointId(2)).unwrap().unwrap();
        s.write("c".into()).unwrap(); // open, never prepared
        s.commit(std::slice::from_ref(&c1)).unwrap();
        s.commit(std::slice::from_ref(&c1)).unwrap(); // again: a no-op
                                                      // A new incarnation restores checkpoint 1: c1 is committed already, c2 and the open file go.
        let mut r = line_sink(dir.path());
        r.open(&ctx("out", 0, 2)).unwrap();
        r.recover(std::slice::from_ref(&c1)).unwrap();
        let pending: Vec<_> = std::fs::read_dir(dir.path().join(PENDING_DIR)).unwrap().collect();
        assert!(pending.is_empty(), "newer transactions must be discarded: {pending:?}");
        let parts: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("part-"))
            .collect();
        assert_eq!(parts, vec!["part-out-0-000000000001".to_string()]);
    }

    #[test]
    fn committing_a_transaction_whose_file_is_gone_is_an_error_not_silent_loss() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = line_sink(dir.path());
        s.open(&ctx("out", 0, 1)).unwrap();
        let ghost = PendingFile {
            pending: "out@0@j1@1-0.pending".into(),
            final_name: "part-out-0-000000000001".into(),
            identity: FileIdentity::Unknown,
        };
        assert!(s.commit(&[ghost]).is_err());
    }

    #[test]
    fn commit_never_replaces_another_runs_output_regression_overwrite() {
        // A second run with a fresh state directory but the same output directory reused checkpoint
        // ids; its commit silently replaced the first run's committed file.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("part-out-0-000000000001"), "first run\n").unwrap();
        let mut s = line_sink(dir.path());
        s.open(&ctx("out", 0, 1)).unwrap();
        s.write("second run".into()).unwrap();
        let c = s.prepare(CheckpointId(1)).unwrap().unwrap();
        let err = s.commit(&[c]).expect_err("must not replace committed output").to_string();
        assert!(err.contains("another run's file"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.path().join("part-out-0-000000000001")).unwrap(), "first run\n");
    }

    /// `cp -a SRC DST` as far as the sink can tell: the same names and bytes, new inodes.
    fn copy_dir(src: &Path, dst: &Path) {
        std::fs::create_dir_all(dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &dst.join(e.file_name()));
            } else {
                std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
            }
        }
    }

    #[test]
    fn a_copied_output_directory_resumes_regression_dev_ino() {
        // Committed files were known by (device, inode): in a copy of the output directory (cp -a, a
        // backup restored, a move to another disk) every recovery commit took its own file for
        // "another run's" and the job could not resume.
        let dir = tempfile::tempdir().unwrap();
        let (orig, copy) = (dir.path().join("orig"), dir.path().join("copy"));
        let mut s = line_sink(&orig);
        s.open(&ctx("out", 0, 1)).unwrap();
        s.write("a".into()).unwrap();
        let c1 = s.prepare(CheckpointId(1)).unwrap().unwrap();
        s.commit(std::slice::from_ref(&c1)).unwrap(); // committed: the pending name is gone
        s.write("b".into()).unwrap();
        let c2 = s.prepare(CheckpointId(2)).unwrap().unwrap();
        // A crash between the link and the unlink of c2's commit.
        std::fs::hard_link(orig.join(PENDING_DIR).join(&c2.pending), orig.join(&c2.final_name)).unwrap();
        copy_dir(&orig, &copy);
        let mut r = line_sink(&copy);
        r.open(&ctx("out", 0, 2)).unwrap();
        r.recover(&[c1.clone(), c2.clone()]).expect("the copy's files are the transactions' own");
        r.commit(&[c1, c2]).expect("and committing them again is a no-op");
        assert_eq!(std::fs::read_to_string(copy.join("part-out-0-000000000001")).unwrap(), "a\n");
        assert_eq!(std::fs::read_to_string(copy.join("part-out-0-000000000002")).unwrap(), "b\n");
        let pending: Vec<_> = std::fs::read_dir(copy.join(PENDING_DIR)).unwrap().collect();
        assert!(pending.is_empty(), "{pending:?}");
    }

    #[test]
    fn a_committed_name_with_other_content_is_another_runs_file_named_with_both_identities() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = line_sink(dir.path());
        s.open(&ctx("out", 0, 1)).unwrap();
        s.write("mine".into()).unwrap();
        let c = s.prepare(CheckpointId(3)).unwrap().unwrap();
        assert_eq!(c.identity, FileIdentity::Content { len: 5, crc32: crc32fast::hash(b"mine\n") });
        s.commit(std::slice::from_ref(&c)).unwrap();
        // Another run's file of the same name (the pending file is gone: committed before).
        std::fs::write(dir.path().join(&c.final_name), "theirs!\n").unwrap();
        let err = s.commit(std::slice::from_ref(&c)).expect_err("not this transaction's file");
        assert!(err.is_permanent(), "{err}");
        let err = err.to_string();
        let theirs = format!("8 bytes, CRC-32 {:08x}", crc32fast::hash(b"theirs!\n"));
        let mine = format!("5 bytes, CRC-32 {:08x}", crc32fast::hash(b"mine\n"));
        assert!(err.contains("another run's file") && err.contains(&theirs) && err.contains(&mine), "{err}");
    }

    #[test]
    fn committables_of_older_versions_still_decode() {
        #[derive(Serialize)]
        struct OldPendingFile {
            pending: String,
            final_name: String,
            file_id: Option<(u64, u64)>,
        }
        let old = |file_id| OldPendingFile { pending: "p".into(), final_name: "f".into(), file_id };
        let decoded: PendingFile = postcard::from_bytes(&postcard::to_allocvec(&old(Some((7, 42)))).unwrap()).unwrap();
        assert_eq!(decoded.identity, FileIdentity::DevIno(7, 42));
        assert_eq!((decoded.pending.as_str(), decoded.final_name.as_str()), ("p", "f"));
        let decoded: PendingFile = postcard::from_bytes(&postcard::to_allocvec(&old(None)).unwrap()).unwrap();
        assert_eq!(decoded.identity, FileIdentity::Unknown);
        // And in the sink's state, a map from checkpoint to committable.
        let map: std::collections::BTreeMap<CheckpointId, OldPendingFile> =
            [(CheckpointId(5), old(Some((1, 2)))), (CheckpointId(6), old(None))].into_iter().collect();
        let decoded: std::collections::BTreeMap<CheckpointId, PendingFile> =
            postcard::from_bytes(&postcard::to_allocvec(&map).unwrap()).unwrap();
        assert_eq!(decoded[&CheckpointId(5)].identity, FileIdentity::DevIno(1, 2));
        assert_eq!(decoded[&CheckpointId(6)].identity, FileIdentity::Unknown);
    }

    #[test]
    fn a_commit_interrupted_between_link_and_unlink_is_finished_by_the_next_commit() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = line_sink(dir.path());
        s.open(&ctx("out", 0, 1)).unwrap();
        s.write("x".into()).unwrap();
        let c = s.prepare(CheckpointId(4)).unwrap().unwrap();
        // The crash left both names pointing at the transaction.
        std::fs::hard_link(dir.path().join(PENDING_DIR).join(&c.pending), dir.path().join(&c.final_name)).unwrap();
        s.commit(std::slice::from_ref(&c)).unwrap();
        assert!(!dir.path().join(PENDING_DIR).join(&c.pending).exists());
        assert_eq!(std::fs::read_to_string(dir.path().join(&c.final_name)).unwrap(), "x\n");
    }

    #[test]
    fn two_jobs_sharing_an_output_directory_never_take_each_others_transactions_regression_shared_output() {
        // Job A started while job B had an open transaction in the same directory: A's recovery
        // deleted B's pending file, and B's commit took A's part file of the same name for its own.
        let dir = tempfile::tempdir().unwrap();
        let job =
            |j: &str| SinkContext { uid: "output".into(), subtask: 0, parallelism: 1, incarnation: 1, job: j.into() };
        let mut b = line_sink(dir.path());
        b.open(&job("b")).unwrap();
        b.write("from b".into()).unwrap();
        let mut a = line_sink(dir.path());
        a.open(&job("a")).unwrap();
        a.recover(&[]).unwrap(); // must not touch b's open transaction
        a.write("from a".into()).unwrap();
        let ca = a.prepare(CheckpointId(1)).unwrap().unwrap();
        a.commit(&[ca]).unwrap();
        let cb = b.prepare(CheckpointId(1)).unwrap().expect("b's transaction survived a's recovery");
        let err = b
            .commit(std::slice::from_ref(&cb))
            .expect_err("a's file of the same name is not b's transaction")
            .to_string();
        assert!(err.contains("another run"), "{err}");
        // And if b's pending file is gone, a's file is still not taken for b's.
        std::fs::remove_file(dir.path().join(PENDING_DIR).join(&cb.pending)).unwrap();
        assert!(b.commit(&[cb]).is_err());
        assert_eq!(std::fs::read_to_string(dir.path().join("part-output-0-000000000001")).unwrap(), "from a\n");
    }
}
