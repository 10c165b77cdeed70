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
use super::disk_store::{Store, View};
use super::hash::{key_group_of_hash, stable_hash};
use super::{Key, StateValue};
use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};

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

/// What a flush wrote, in [`log_write`]'s format; empty when not logged. An incremental snapshot
/// takes the changes from these logs, never from the store (a point read per changed key in an
/// LSM tree cost a fifth of the job's throughput at 4 M keys).
pub(super) type WriteLog = Arc<Vec<u8>>;

/// A value's length in a [`WriteLog`] that marks the key removed.
const REMOVED: u32 = u32::MAX;

/// Append one write to a [`WriteLog`]: the stored key's length (u32, little-endian), the key, the
/// stored value's length (or [`REMOVED`]) and the value.
fn log_write(log: &mut Vec<u8>, key: &[u8], value: Option<&[u8]>) {
    log.extend_from_slice(&(key.len() as u32).to_le_bytes());
    log.extend_from_slice(key);
    match value {
        Some(v) => {
            log.extend_from_slice(&(v.len() as u32).to_le_bytes());
            log.extend_from_slice(v);
        }
        None => log.extend_from_slice(&REMOVED.to_le_bytes()),
    }
}

/// Call `f` with every `(stored key, stored value or None if removed)` of `log`, in write order.
pub(super) fn read_log<'a>(log: &'a [u8], mut f: impl FnMut(&'a [u8], Option<&'a [u8]>)) -> Result<(), String> {
    let damaged =
        || "a flush's log of written keys is damaged (a bug); the task fails and the job restores".to_string();
    let mut rest = log;
    let take = |n: usize, rest: &mut &'a [u8]| -> Result<&'a [u8], String> {
        let (head, tail) = (rest.get(..n).ok_or_else(damaged)?, &rest[n..]);
        *rest = tail;
        Ok(head)
    };
    while !rest.is_empty() {
        let len = u32::from_le_bytes(take(4, &mut rest)?.try_into().expect("4 bytes"));
        let key = take(len as usize, &mut rest)?;
        let value = match u32::from_le_bytes(take(4, &mut rest)?.try_into().expect("4 bytes")) {
            REMOVED => None,
            len => Some(take(len as usize, &mut rest)?),
        };
        f(key, value);
    }
    Ok(())
}

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
    log_writes: bool,
    done: Fill<WriteLog>,
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
    pub fn start(store: Arc<Store>, max_parallelism: u32) -> Result<Self, String> {
        // The task has at most HANDED_MAX + 1 caches handed over and not yet known written, after
        // a restore's groups.
        let (tx, rx) = sync_channel(super::disk::HANDED_MAX + 2);
        let thread = std::thread::Builder::new()
            .name("cutline-store".into())
            .spawn(move || run(store, max_parallelism, rx))
            .map_err(|e| format!("starting the local store's writer thread: {e}"))?;
        Ok(Writer { tx: Some(tx), thread: Some(thread) })
    }

    /// Hand `cache` over; `done` gets what was written (if `log_writes`), `view` the store's view
    /// right after.
    pub fn hand_over(
        &self,
        cache: Handed<K, V>,
        retired: Vec<Handed<K, V>>,
        log_writes: bool,
        done: &Arc<Slot<WriteLog>>,
        view: Option<&Arc<Slot<View>>>,
    ) -> Result<(), String> {
        let flush = Flush { cache, retired, log_writes, done: Fill(done.clone()), view: view.map(|v| Fill(v.clone())) };
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

fn run<K: Key, V: StateValue>(store: Arc<Store>, max_parallelism: u32, rx: Receiver<Job<K, V>>) {
    // A failed write leaves the store short of it: nothing after it may be written.
    let mut failed: Option<String> = None;
    for job in rx {
        let flush = match job {
            Job::Fill(pending) => {
                if failed.is_none() {
                    failed = pending.fill(|kg, records| write_sorted(&store, kg, records)).err();
                }
                continue;
            }
            Job::Flush(flush) => flush,
        };
        drop(flush.retired);
        let written = match &failed {
            Some(e) => Err(e.clone()),
            None => write(&store, max_parallelism, &flush.cache, flush.log_writes),
        };
        if let Err(e) = &written {
            failed = Some(e.clone());
        }
        drop(flush.cache);
        if let Some(view) = &flush.view {
            view.0.put(written.as_ref().map_err(Clone::clone).map(|_| store.view()));
        }
        flush.done.0.put(written.map(Arc::new));
    }
}

/// Write `cache`'s dirty entries in one batch; what it wrote, logged, if `log_writes`.
fn write<K: Key, V: StateValue>(
    store: &Store,
    max_parallelism: u32,
    cache: &HashMap<K, Cached<V>>,
    log_writes: bool,
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
    store.write(writes.iter().map(|(k, v)| (&k[..], v.as_deref())))?;
    let mut log = Vec::new();
    if log_writes {
        for (key, value) in &writes {
            log_write(&mut log, key, value.as_deref());
        }
    }
    Ok(log)
}

/// Write restored records of key group `kg` (stored keys without their group, and stored values)
/// in one batch. The caller checked them: sorted, each key once, groups each once, into a store
/// nothing else wrote to.
pub(super) fn write_sorted<'a>(
    store: &Store,
    kg: u32,
    records: &mut dyn Iterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<(), String> {
    let mut keys: Vec<u8> = Vec::new();
    let mut ends = Vec::new();
    let mut values = Vec::new();
    for (k, v) in records {
        keys.extend_from_slice(&kg.to_be_bytes());
        keys.extend_from_slice(k);
        ends.push(keys.len());
        values.push(v);
    }
    let mut start = 0;
    store.write(ends.iter().zip(values).map(|(&end, v)| {
        let key = &keys[start..end];
        start = end;
        (key, Some(v))
    }))
}
