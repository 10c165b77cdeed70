//! Sinks: the two-phase [`Sink`] contract, the chain element that drives it, and the built-in sinks.
//!
//! The contract: records are written into an open transaction; at a barrier the transaction is
//! *prepared* (made durable but invisible) and its committable is stored in the checkpoint; when a
//! checkpoint completes, everything prepared up to it is *committed* (idempotently); after a restore,
//! *recover* commits what the restored checkpoint prepared and discards anything newer. A completed
//! checkpoint covers every older one, so a lost or late notification loses nothing.
//!
//! This module does not decide when checkpoints complete; it reacts to the task's control hooks.

use crate::emit::Emit;
use crate::fault::{FaultPoint, Faults};
use crate::message::TaskError;
use crate::state::{encode_plain, RestoreIndex, SnapshotBuilder};
use cutline_core::barrier::Barrier;
use cutline_core::CheckpointId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where a sink instance runs.
#[derive(Clone, Debug)]
pub struct SinkContext {
    /// The sink's stable id.
    pub uid: String,
    pub subtask: u32,
    pub parallelism: u32,
    /// Unique for every incarnation of the task, across restarts and processes.
    pub incarnation: u64,
    /// A short id of the job (a hash of its fingerprint): sinks of different jobs writing to one place
    /// must never take each other's transactions for their own.
    pub job: String,
}

/// A two-phase-commit sink. See the module docs for the contract.
pub trait Sink<T>: Send + 'static {
    /// A handle to a prepared transaction, stored in checkpoints.
    type Committable: Serialize + DeserializeOwned + Clone + Send + std::fmt::Debug + 'static;

    /// Called once before anything else, after a restore or at a fresh start.
    fn open(&mut self, ctx: &SinkContext) -> Result<(), String>;
    /// Commit `to_commit` (prepared by the restored, complete checkpoint) and discard every other
    /// uncommitted transaction of this subtask, except those of a newer generation
    /// (`SinkContext::incarnation >> 32` is the generation): in a cluster a stale worker may run its
    /// recovery after a newer generation started elsewhere, and those transactions are not its own.
    fn recover(&mut self, to_commit: &[Self::Committable]) -> Result<(), String>;
    /// Write one record into the open transaction.
    fn write(&mut self, item: T) -> Result<(), String>;
    /// Make the open transaction durable but invisible; `None` if it is empty.
    fn prepare(&mut self, checkpoint: CheckpointId) -> Result<Option<Self::Committable>, String>;
    /// Make prepared transactions visible. Must be idempotent: a committable may be committed again
    /// after a crash.
    fn commit(&mut self, committables: &[Self::Committable]) -> Result<(), String>;
    /// The task is going away without finishing: drop the open transaction (best effort).
    fn abort(&mut self) {}
    /// Has this subtask committed any transaction prepared after `checkpoint` (or at all, for
    /// `None`)? Asked at every exactly-once restore, before any sink recovers. In a healthy store the
    /// answer is always no (sinks commit only what a complete checkpoint prepared, and the latest
    /// complete checkpoint is restored); yes means checkpoints were lost or damaged, or the output
    /// belongs to another run, and restoring would commit output twice, so the restore is refused.
    /// `None` (the default) means the sink cannot tell: the restore is then refused only when it falls
    /// back past a damaged checkpoint.
    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> Result<Option<bool>, String> {
        let _ = checkpoint;
        Ok(None)
    }
}

/// Drives a [`Sink`] from the task's chain.
pub(crate) struct SinkEmit<T, S: Sink<T>> {
    uid: String,
    sink: S,
    /// Prepared, not yet committed: part of every snapshot until committed.
    uncommitted: BTreeMap<CheckpointId, S::Committable>,
    /// What the restored checkpoint prepared, committed by `recover` when the task starts.
    to_recover: Option<Vec<S::Committable>>,
    faults: Faults,
    _t: std::marker::PhantomData<fn(T)>,
}

impl<T: Send + 'static, S: Sink<T>> SinkEmit<T, S> {
    pub fn open(mut sink: S, ctx: SinkContext, restore: &RestoreIndex, faults: Faults) -> Result<Self, TaskError> {
        let uid = ctx.uid.clone();
        let err = |m: String| TaskError::Sink { uid: uid.clone(), message: m };
        sink.open(&ctx).map_err(err)?;
        let restored: BTreeMap<CheckpointId, S::Committable> =
            match restore.plain(&uid, ctx.subtask, ctx.parallelism)? {
                Some(bytes) => postcard::from_bytes(bytes).map_err(|e| err(format!("decoding sink state: {e}")))?,
                None => BTreeMap::new(),
            };
        if let Some(c) = restore.checkpoint {
            assert!(restored.keys().all(|k| *k <= c), "{uid}: restored committables newer than checkpoint {c}");
        }
        if !restore.duplicates_allowed {
            // Every sink subtask answers this before any of them recovers (recovery discards prepared
            // transactions; a refusal after that would leave nothing to repair).
            let committed = sink.committed_after(restore.checkpoint).map_err(err)?;
            if committed == Some(true) || (committed.is_none() && !restore.skipped.is_empty()) {
                let from =
                    restore.checkpoint.map(|c| format!("checkpoint {c}")).unwrap_or_else(|| "an empty start".into());
                let why = if restore.skipped.is_empty() {
                    "a newer checkpoint is missing, or the output belongs to another run".to_string()
                } else {
                    format!("newer checkpoint(s) {:?} do not verify", restore.skipped)
                };
                return Err(TaskError::State {
                    uid: uid.clone(),
                    message: format!(
                        "this sink already committed output after {from} ({why}): restoring {from} would commit that output twice. Repair or restore the checkpoint files, use a fresh output, or run in at-least-once mode to accept duplicates"
                    ),
                });
            }
        }
        let to_commit: Vec<S::Committable> = restored.into_values().collect();
        Ok(SinkEmit {
            uid,
            sink,
            uncommitted: BTreeMap::new(),
            to_recover: Some(to_commit),
            faults,
            _t: std::marker::PhantomData,
        })
    }
}

impl<T: Send + 'static, S: Sink<T>> Emit<T> for SinkEmit<T, S> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        self.sink.write(item).map_err(|m| TaskError::Sink { uid: self.uid.clone(), message: m })
    }
    fn on_start(&mut self) -> Result<(), TaskError> {
        let to_commit = self.to_recover.take().expect("a sink starts once");
        self.faults.check(FaultPoint::SinkRecover)?;
        self.sink.recover(&to_commit).map_err(|m| TaskError::Sink { uid: self.uid.clone(), message: m })
    }
    fn has_credit(&self) -> bool {
        true
    }
    fn flush(&mut self) -> Result<(), TaskError> {
        Ok(())
    }
    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        self.faults.check(FaultPoint::SinkPrepare)?;
        if let Some(c) =
            self.sink.prepare(b.checkpoint).map_err(|m| TaskError::Sink { uid: self.uid.clone(), message: m })?
        {
            let prev = self.uncommitted.insert(b.checkpoint, c);
            assert!(prev.is_none(), "{}: prepared twice for {}", self.uid, b.checkpoint);
        }
        snap.add(&self.uid, encode_plain(&self.uid, &self.uncommitted)?);
        Ok(())
    }
    fn on_end(&mut self) -> Result<(), TaskError> {
        Ok(())
    }
    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        let done: Vec<CheckpointId> = self.uncommitted.range(..=checkpoint).map(|(k, _)| *k).collect();
        if done.is_empty() {
            return Ok(());
        }
        let batch: Vec<S::Committable> = done.iter().map(|k| self.uncommitted[k].clone()).collect();
        self.faults.check(FaultPoint::SinkCommit)?;
        let (first, rest) = batch.split_at(1);
        self.sink.commit(first).map_err(|m| TaskError::Sink { uid: self.uid.clone(), message: m })?;
        // A crash here leaves the commit half done; recovery must finish it.
        self.faults.check(FaultPoint::SinkCommitMidway)?;
        self.sink.commit(rest).map_err(|m| TaskError::Sink { uid: self.uid.clone(), message: m })?;
        for k in done {
            self.uncommitted.remove(&k);
        }
        Ok(())
    }
    fn on_cancel(&mut self) {
        self.sink.abort();
    }
}

/// Writes one line per record into files in a directory, exactly once: records go to a pending file in
/// `DIR/.pending/`, which is fsynced at the barrier and published (hard link, never replacing a file) as `DIR/part-<uid>-<subtask>-<checkpoint>`
/// when the checkpoint completes. Readers of `DIR` see only committed files.
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

/// Does a transaction name (after the sink's prefix: `<incarnation>-<seq>...`) belong to a newer
/// generation than incarnation `own`? Incarnations are `generation << 32 | task`; a newer
/// generation's transaction belongs to a run that took over from this one (a stale worker starting
/// late), and is never this one's to discard.
fn of_a_newer_generation(rest: &str, own: u64) -> bool {
    rest.split('-').next().and_then(|i| i.parse::<u64>().ok()).is_some_and(|incarnation| incarnation >> 32 > own >> 32)
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

/// Prints every record to standard output as it arrives (at-least-once: after a failure, records since
/// the last checkpoint are printed again). For demos.
pub struct PrintSink<T> {
    prefix: String,
    _t: std::marker::PhantomData<fn(T)>,
}

impl<T> PrintSink<T> {
    pub fn new(prefix: impl Into<String>) -> Self {
        PrintSink { prefix: prefix.into(), _t: std::marker::PhantomData }
    }
}

impl<T: std::fmt::Display + Send + 'static> Sink<T> for PrintSink<T> {
    type Committable = ();
    fn open(&mut self, _ctx: &SinkContext) -> Result<(), String> {
        Ok(())
    }
    fn recover(&mut self, _c: &[()]) -> Result<(), String> {
        Ok(())
    }
    fn write(&mut self, item: T) -> Result<(), String> {
        println!("{}{item}", self.prefix);
        Ok(())
    }
    fn committed_after(&mut self, _c: Option<CheckpointId>) -> Result<Option<bool>, String> {
        Ok(Some(false)) // at-least-once by nature
    }
    fn prepare(&mut self, _c: CheckpointId) -> Result<Option<()>, String> {
        Ok(None)
    }
    fn commit(&mut self, _c: &[()]) -> Result<(), String> {
        Ok(())
    }
}

/// Drops every record (benchmarks).
#[derive(Clone, Default)]
pub struct DiscardSink;

impl<T: Send + 'static> Sink<T> for DiscardSink {
    type Committable = ();
    fn open(&mut self, _ctx: &SinkContext) -> Result<(), String> {
        Ok(())
    }
    fn recover(&mut self, _c: &[()]) -> Result<(), String> {
        Ok(())
    }
    #[inline]
    fn write(&mut self, item: T) -> Result<(), String> {
        std::hint::black_box(item);
        Ok(())
    }
    fn committed_after(&mut self, _c: Option<CheckpointId>) -> Result<Option<bool>, String> {
        Ok(Some(false)) // keeps nothing
    }
    fn prepare(&mut self, _c: CheckpointId) -> Result<Option<()>, String> {
        Ok(None)
    }
    fn commit(&mut self, _c: &[()]) -> Result<(), String> {
        Ok(())
    }
}

/// An in-memory transactional store standing in for an external system with prepared transactions
/// (it outlives task crashes): used by the simulation and by tests.
#[derive(Default, Debug)]
pub struct MemoryTxnStore {
    /// Prepared transactions: key -> (the checkpoint that prepared it, records).
    prepared: BTreeMap<String, (CheckpointId, Vec<String>)>,
    /// Committed transactions in commit order: (transaction key, its checkpoint, records).
    committed: Vec<(String, CheckpointId, Vec<String>)>,
    committed_keys: BTreeSet<String>,
}

impl MemoryTxnStore {
    /// Every committed record, in commit order.
    pub fn committed_records(&self) -> Vec<String> {
        self.committed.iter().flat_map(|(_, _, r)| r.iter().cloned()).collect()
    }
    pub fn prepared_count(&self) -> usize {
        self.prepared.len()
    }
}

/// A sink into a shared [`MemoryTxnStore`]; records are formatted with `Display`.
pub struct MemoryTxnSink {
    store: Arc<Mutex<MemoryTxnStore>>,
    ctx: Option<SinkContext>,
    open: Vec<String>,
    seq: u64,
}

impl Clone for MemoryTxnSink {
    /// A fresh, unopened sink into the same store.
    fn clone(&self) -> Self {
        MemoryTxnSink::new(self.store.clone())
    }
}

impl MemoryTxnSink {
    pub fn new(store: Arc<Mutex<MemoryTxnStore>>) -> Self {
        MemoryTxnSink { store, ctx: None, open: Vec::new(), seq: 0 }
    }
    fn prefix(&self) -> String {
        let c = self.ctx.as_ref().expect("opened");
        // '@' cannot occur in a uid or the job id, so no sink's prefix is a prefix of another sink's
        // names, nor of the names of the same sink in another job.
        format!("{}@{}@{}@", c.uid, c.subtask, c.job)
    }
}

impl<T: std::fmt::Display + Send + 'static> Sink<T> for MemoryTxnSink {
    type Committable = String;
    fn open(&mut self, ctx: &SinkContext) -> Result<(), String> {
        self.ctx = Some(ctx.clone());
        Ok(())
    }
    fn recover(&mut self, to_commit: &[String]) -> Result<(), String> {
        <Self as Sink<T>>::commit(self, to_commit)?;
        let prefix = self.prefix();
        let own = self.ctx.as_ref().expect("opened").incarnation;
        let mut s = self.store.lock().expect("store lock");
        s.prepared.retain(|k, _| !k.starts_with(&prefix) || of_a_newer_generation(&k[prefix.len()..], own));
        Ok(())
    }
    fn write(&mut self, item: T) -> Result<(), String> {
        self.open.push(item.to_string());
        Ok(())
    }
    fn prepare(&mut self, checkpoint: CheckpointId) -> Result<Option<String>, String> {
        if self.open.is_empty() {
            return Ok(None);
        }
        let c = self.ctx.as_ref().expect("opened");
        let key = format!("{}{}-{}", self.prefix(), c.incarnation, self.seq);
        self.seq += 1;
        let records = std::mem::take(&mut self.open);
        let mut s = self.store.lock().expect("store lock");
        assert!(!s.committed_keys.contains(&key) && !s.prepared.contains_key(&key), "transaction key {key} reused");
        s.prepared.insert(key.clone(), (checkpoint, records));
        Ok(Some(key))
    }
    fn commit(&mut self, committables: &[String]) -> Result<(), String> {
        let mut s = self.store.lock().expect("store lock");
        for key in committables {
            if s.committed_keys.contains(key) {
                continue; // idempotent
            }
            let Some((checkpoint, records)) = s.prepared.remove(key) else {
                return Err(format!("prepared transaction {key} is gone: committed output would be lost"));
            };
            s.committed_keys.insert(key.clone());
            s.committed.push((key.clone(), checkpoint, records));
        }
        Ok(())
    }
    fn abort(&mut self) {
        self.open.clear();
    }
    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> Result<Option<bool>, String> {
        let prefix = self.prefix();
        let s = self.store.lock().expect("store lock");
        Ok(Some(
            s.committed.iter().any(|(k, c, _)| k.starts_with(&prefix) && checkpoint.is_none_or(|after| *c > after)),
        ))
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
        let err = b.commit(&[cb.clone()]).expect_err("a's file of the same name is not b's transaction");
        assert!(err.contains("another run"), "{err}");
        // And if b's pending file is gone, a's file is still not taken for b's.
        std::fs::remove_file(dir.path().join(PENDING_DIR).join(&cb.pending)).unwrap();
        assert!(b.commit(&[cb]).is_err());
        assert_eq!(std::fs::read_to_string(dir.path().join("part-output-0-000000000001")).unwrap(), "from a\n");
    }
}
