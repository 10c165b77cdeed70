//! [`TransactionalFileSink`]: exactly-once files in a directory. Records go to a pending file in
//! `DIR/.pending/`, which is fsynced at the barrier and published (hard link, never replacing a file)
//! as `DIR/part-<uid>-<subtask>-<checkpoint>` when the checkpoint completes. Readers of `DIR` see only
//! committed files.

use super::sink::{of_a_newer_generation, Sink, SinkContext};
use cutline_core::CheckpointId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Appends one record's bytes to a buffer.
type FormatFn<T> = Arc<dyn Fn(&T, &mut Vec<u8>) + Send + Sync>;

pub struct TransactionalFileSink<T> {
    dir: PathBuf,
    format: FormatFn<T>,
    ctx: Option<SinkContext>,
    open: Option<(String, BufWriter<File>)>,
    seq: u64,
    line: Vec<u8>,
}

/// A prepared file of a [`TransactionalFileSink`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingFile {
    pub pending: String,
    pub final_name: String,
    /// (device, inode) of the prepared file: a link or rename keeps it, so a commit can tell its own
    /// committed file from another run's file of the same name.
    pub file_id: Option<(u64, u64)>,
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

    fn open(&mut self, ctx: &SinkContext) -> Result<(), String> {
        fs::create_dir_all(self.pending_dir()).map_err(|e| io_err("cannot create", &self.pending_dir(), e))?;
        self.ctx = Some(ctx.clone());
        Ok(())
    }

    fn recover(&mut self, to_commit: &[PendingFile]) -> Result<(), String> {
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

    fn write(&mut self, item: T) -> Result<(), String> {
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
            self.open = Some((name, BufWriter::with_capacity(1 << 16, f)));
        }
        self.line.clear();
        (self.format)(&item, &mut self.line);
        self.line.push(b'\n');
        let (_, w) = self.open.as_mut().expect("just opened");
        w.write_all(&self.line).map_err(|e| format!("writing pending output: {e}"))
    }

    fn prepare(&mut self, checkpoint: CheckpointId) -> Result<Option<PendingFile>, String> {
        let Some((name, w)) = self.open.take() else {
            return Ok(None);
        };
        let f = w.into_inner().map_err(|e| format!("flushing pending output: {e}"))?;
        f.sync_all().map_err(|e| format!("fsync of pending output: {e}"))?;
        // The file's directory entry must survive a power loss too: the checkpoint will refer to it.
        fsync_dir(&self.pending_dir())?;
        let c = self.ctx.as_ref().expect("opened");
        let file_id = file_id(&self.pending_dir().join(&name));
        Ok(Some(PendingFile {
            pending: name,
            final_name: format!("part-{}-{}-{:012}", c.uid, c.subtask, checkpoint.0),
            file_id,
        }))
    }

    fn commit(&mut self, committables: &[PendingFile]) -> Result<(), String> {
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
                    if !same_file(&from, &to) {
                        return Err(format!(
                            "{} already exists and is not this job's transaction {}: the output directory holds another run's output; use a fresh output directory",
                            to.display(),
                            c.pending
                        ));
                    }
                    // A commit interrupted between the link and the unlink: finish it.
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => {
                    // Committed before, if `to` is this transaction's file and not another run's.
                    if c.file_id.is_some() && file_id(&to) != c.file_id {
                        return Err(format!(
                            "the pending file of transaction {} is gone and {} is another file: another run shares the output directory; use one output directory per job",
                            c.pending,
                            to.display()
                        ));
                    }
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(format!(
                        "committed output {} and its pending file are both gone: part-* files must not be moved or deleted while the job can still restore a checkpoint that lists them ({e})",
                        to.display()
                    ))
                }
                Err(e) => return Err(io_err("cannot commit", &from, e)),
            }
            match fs::remove_file(&from) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // published by rename
                Err(e) => return Err(io_err("cannot remove committed pending file", &from, e)),
            }
        }
        fsync_dir(&self.dir)
    }

    fn abort(&mut self) {
        if let Some((name, _)) = self.open.take() {
            let _ = fs::remove_file(self.pending_dir().join(name));
        }
    }

    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> Result<Option<bool>, String> {
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
            file_id: None,
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
        let err = s.commit(&[c]).expect_err("must not replace committed output");
        assert!(err.contains("another run's output"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.path().join("part-out-0-000000000001")).unwrap(), "first run\n");
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
        let err = b.commit(std::slice::from_ref(&cb)).expect_err("a's file of the same name is not b's transaction");
        assert!(err.contains("another run"), "{err}");
        // And if b's pending file is gone, a's file is still not taken for b's.
        std::fs::remove_file(dir.path().join(PENDING_DIR).join(&cb.pending)).unwrap();
        assert!(b.commit(&[cb]).is_err());
        assert_eq!(std::fs::read_to_string(dir.path().join("part-output-0-000000000001")).unwrap(), "from a\n");
    }
}
