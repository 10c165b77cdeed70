//! The local store's writer thread: it writes the caches a [`DiskMap`](super::DiskMap) hands over
//! (at a barrier, or when the cache is full) so the task thread does not; and [`Slot`], how what it
//! wrote (the keys, for incremental snapshots) and the store's view after a barrier's cache reach
//! the task and the snapshot writer.
//!
//! **Invariant:** the thread writes one handed-over cache at a time, in the order they were handed
//! over (a restore's pending groups, [`PendingRestore`], before all of them), and a barrier's view
//! is opened right after its cache is written, before the next one: the view holds exactly the
//! state at the barrier. After a failed write it writes nothing more: every later flush fails.

use super::disk_pending::PendingRestore;
use super::hash::{key_group_of_hash, stable_hash};
use super::{Key, StateValue};
use redb::{Database, Durability, ReadOnlyTable, ReadableDatabase, TableDefinition};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};

pub(super) const KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");

/// Keys written to the store between two durable commits. The other commits are not synced to
/// disk, which the store does not need (a restarted task refills a new one from the checkpoint), but
/// it reuses the pages they free only after a durable commit: this bounds the file's growth (about a
/// page per key written) without a sync per flush.
pub const DURABLE_COMMIT_AFTER_WRITES: u64 = 65_536;

pub(super) type View = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// A failure of the local store; the task fails and the job restores.
pub(super) fn store_err(path: &Path, e: impl std::fmt::Display) -> String {
    format!(
        "local state store {}: {e}; check the disk under the state backend's directory (space, permissions)",
        path.display()
    )
}

pub(super) fn open_view(db: &Database, path: &Path) -> Result<View, String> {
    let txn = db.begin_read().map_err(|e| store_err(path, e))?;
    txn.open_table(KV).map_err(|e| store_err(path, e))
}

/// The store's file, removed when the map, its writer and every snapshot reading it are gone.
pub(super) struct StoreFile(pub PathBuf);

impl Drop for StoreFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A cached entry: `None` is a key known to have no state; `dirty` if the store (once every cache
/// handed over before is written) holds another value.
pub(super) struct Cached<V> {
    pub value: Option<V>,
    pub dirty: bool,
}

/// A cache handed to the writer; the task still reads it until the next one is handed over.
pub(super) type Handed<K, V> = Arc<HashMap<K, Cached<V>>>;

/// A value the writer thread produces once, waited for by the task or a snapshot.
pub(super) struct Slot<T> {
    value: Mutex<Option<Result<T, String>>>,
    ready: Condvar,
}

/// The stored keys a flush wrote, each after its length (u32, little-endian); empty when not logged.
pub(super) type KeyLog = Arc<Vec<u8>>;

impl<T> Slot<T> {
    pub fn new() -> Arc<Self> {
        Arc::new(Slot { value: Mutex::new(None), ready: Condvar::new() })
    }

    pub(super) fn put(&self, value: Result<T, String>) {
        let mut slot = self.value.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(value);
            self.ready.notify_all();
        }
    }

    /// Wait for the value, then hand it to `f`.
    fn wait<R>(&self, f: impl FnOnce(&mut Result<T, String>) -> R) -> R {
        let mut slot = self.value.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(value) = slot.as_mut() {
                return f(value);
            }
            slot = self.ready.wait(slot).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl<T> Slot<T> {
    /// Whether the value was written.
    pub fn is_ready(&self) -> bool {
        self.value.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

impl<T: Clone> Slot<T> {
    /// The value, once written.
    pub fn get(&self) -> Result<T, String> {
        self.wait(|v| v.clone())
    }
}

impl<T> Slot<T> {
    /// Take the value once written (a second take is an error).
    pub fn take(&self) -> Result<T, String> {
        self.wait(|v| std::mem::replace(v, Err("the store's view was already taken".into())))
    }
}

/// The writer's end of a slot: filled with an error if the writer drops it unfilled (it stopped).
struct Fill<T>(Arc<Slot<T>>);

impl<T> Drop for Fill<T> {
    fn drop(&mut self) {
        self.0.put(Err("the local store's writer stopped before writing; the task fails and the job restores".into()));
    }
}

/// One handed-over cache to write.
struct Flush<K, V> {
    cache: Handed<K, V>,
    /// Caches handed over before and written, for the writer to free (off the task thread).
    retired: Vec<Handed<K, V>>,
    log_keys: bool,
    done: Fill<KeyLog>,
    view: Option<Fill<View>>,
}

/// What the writer does next.
enum Job<K, V> {
    Flush(Flush<K, V>),
    /// Fill the store with a restore's groups (sent once, before any flush).
    Fill(Arc<PendingRestore>),
}

/// The task's handle on its store's writer thread; dropping it waits for what was handed over (a
/// restore's groups not yet written included).
pub(super) struct Writer<K, V> {
    tx: Option<SyncSender<Job<K, V>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<K: Key, V: StateValue> Writer<K, V> {
    pub fn start(db: Arc<Database>, file: Arc<StoreFile>, max_parallelism: u32) -> Result<Self, String> {
        // The task has at most HANDED_MAX + 1 caches handed over and not yet known written, after
        // a restore's groups.
        let (tx, rx) = sync_channel(super::disk::HANDED_MAX + 2);
        let thread = std::thread::Builder::new()
            .name("cutline-store".into())
            .spawn(move || run(db, file, max_parallelism, rx))
            .map_err(|e| format!("starting the local store's writer thread: {e}"))?;
        Ok(Writer { tx: Some(tx), thread: Some(thread) })
    }

    /// Hand `cache` over; `done` gets the keys written (if `log_keys`), `view` the store's view
    /// right after.
    pub fn hand_over(
        &self,
        cache: Handed<K, V>,
        retired: Vec<Handed<K, V>>,
        log_keys: bool,
        done: &Arc<Slot<KeyLog>>,
        view: Option<&Arc<Slot<View>>>,
    ) -> Result<(), String> {
        let flush = Flush { cache, retired, log_keys, done: Fill(done.clone()), view: view.map(|v| Fill(v.clone())) };
        self.send(Job::Flush(flush))
    }

    /// Have the store filled with `pending`'s groups before anything handed over after.
    pub fn fill(&self, pending: Arc<PendingRestore>) -> Result<(), String> {
        self.send(Job::Fill(pending))
    }

    fn send(&self, job: Job<K, V>) -> Result<(), String> {
        let tx = self.tx.as_ref().expect("open until dropped");
        tx.send(job).map_err(|_| "the local store's writer stopped; the task fails and the job restores".to_string())
    }
}

impl<K, V> Drop for Writer<K, V> {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run<K: Key, V: StateValue>(db: Arc<Database>, file: Arc<StoreFile>, max_parallelism: u32, rx: Receiver<Job<K, V>>) {
    let mut undurable_writes = 0u64;
    // A failed write leaves the store short of it: nothing after it may be written.
    let mut failed: Option<String> = None;
    for job in rx {
        let flush = match job {
            Job::Fill(pending) => {
                if failed.is_none() {
                    failed = pending.fill(|kg, records| write_sorted(&db, &file.0, kg, records)).err();
                }
                continue;
            }
            Job::Flush(flush) => flush,
        };
        drop(flush.retired);
        let written = match &failed {
            Some(e) => Err(e.clone()),
            None => write(&db, &file.0, max_parallelism, &flush.cache, flush.log_keys, &mut undurable_writes),
        };
        if let Err(e) = &written {
            failed = Some(e.clone());
        }
        drop(flush.cache);
        if let Some(view) = &flush.view {
            view.0.put(written.as_ref().map_err(Clone::clone).and_then(|_| open_view(&db, &file.0)));
        }
        flush.done.0.put(written.map(Arc::new));
    }
}

/// Write `cache`'s dirty entries in one transaction, in key order; the stored keys if `log_keys`.
fn write<K: Key, V: StateValue>(
    db: &Database,
    path: &Path,
    max_parallelism: u32,
    cache: &HashMap<K, Cached<V>>,
    log_keys: bool,
    undurable_writes: &mut u64,
) -> Result<Vec<u8>, String> {
    let mut writes: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    for (k, c) in cache.iter().filter(|(_, c)| c.dirty) {
        let mut key = Vec::new();
        let kg = key_group_of_hash(stable_hash(k), max_parallelism);
        key.extend_from_slice(&kg.to_be_bytes());
        key = postcard::to_extend(k, key).map_err(|e| format!("encoding a key: {e}"))?;
        let value = match &c.value {
            Some(v) => Some(postcard::to_allocvec(v).map_err(|e| format!("encoding a value: {e}"))?),
            None => None,
        };
        writes.push((key, value));
    }
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    writes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let err = |e: &dyn std::fmt::Display| store_err(path, e);
    let mut txn = db.begin_write().map_err(|e| err(&e))?;
    *undurable_writes += writes.len() as u64;
    let durability = if *undurable_writes >= DURABLE_COMMIT_AFTER_WRITES {
        *undurable_writes = 0;
        Durability::Immediate
    } else {
        Durability::None
    };
    txn.set_durability(durability).map_err(|e| err(&e))?;
    {
        let mut table = txn.open_table(KV).map_err(|e| err(&e))?;
        for (key, value) in &writes {
            match value {
                Some(v) => drop(table.insert(&key[..], &v[..]).map_err(|e| err(&e))?),
                None => drop(table.remove(&key[..]).map_err(|e| err(&e))?),
            }
        }
    }
    txn.commit().map_err(|e| err(&e))?;
    let mut log = Vec::new();
    if log_keys {
        for (key, _) in &writes {
            log.extend_from_slice(&(key.len() as u32).to_le_bytes());
            log.extend_from_slice(key);
        }
    }
    Ok(log)
}

/// Write restored records of key group `kg` (stored keys without their group, and stored values),
/// sorted by key, in one transaction: in that order the B-tree grows at its end instead of taking a
/// page write per key. A key already stored is a damaged checkpoint or a bug; the task fails.
pub(super) fn write_sorted<'a>(
    db: &Database,
    path: &Path,
    kg: u32,
    records: &mut dyn Iterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| store_err(path, e);
    let mut txn = db.begin_write().map_err(|e| err(&e))?;
    txn.set_durability(Durability::None).map_err(|e| err(&e))?;
    {
        let mut table = txn.open_table(KV).map_err(|e| err(&e))?;
        let mut key = Vec::new();
        for (k, v) in records {
            key.clear();
            key.extend_from_slice(&kg.to_be_bytes());
            key.extend_from_slice(k);
            if table.insert(&key[..], v).map_err(|e| err(&e))?.is_some() {
                return Err(format!(
                    "restoring key group {kg}: a key was stored twice; the checkpoint is inconsistent"
                ));
            }
        }
    }
    txn.commit().map_err(|e| err(&e))
}
