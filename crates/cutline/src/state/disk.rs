//! [`DiskMap`]: keyed state on local disk (the disk [`StateBackend`](super::StateBackend), feature
//! `spill`), in an embedded store with a bounded write-back cache in front; and [`DiskFrozen`], the
//! store's view at a barrier, encoded on a snapshot writer thread, whole or as what changed since
//! the snapshot's base.
//!
//! The store ([`Store`], an LSM tree) holds one keyspace: the key is the key group (4 bytes, big-endian, so a scan
//! visits the groups in order) followed by the key's postcard encoding, the value the value's
//! postcard encoding. A snapshot's `(key, value)` record is then the stored key without its group
//! followed by the stored value, as [`ElementState`] wants it, without decoding either.

use super::disk_pending::{check_sorted, held_bytes, Lookup, PendingRestore, LAZY_RESTORE_MAX_BYTES};
use super::disk_store::{remove_orphans, store_err, Store, View};
use super::disk_writer::{read_log, write_sorted, Cached, Handed, Slot, WriteLog, Writer};
use super::freeze_log::FreezeLog;
use super::hash::{key_group_of_hash, stable_hash};
use super::snapshot::{ElementState, EmitGroup, Encoded, KeyedStream, StateImage};
use super::{Key, StateValue};
use cutline_core::{CheckpointId, KeyGroup, KeyGroupRange};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

/// Snapshots whose changed keys are kept for incremental snapshots built on them (as
/// [`FREEZES_KEPT`](super::cow_map) in memory); an older base means a whole snapshot.
pub const DISK_FREEZES_KEPT: usize = 64;
/// Bytes of writes (stored keys and values) logged between two snapshots; beyond it the log is dropped and the next
/// snapshot is whole (as when checkpoints are off for a long time).
pub const MAX_CHANGED_LOG_BYTES: usize = 256 << 20;
/// Caches handed over to the writer and not yet known written before a full cache waits for the
/// oldest; a barrier's cache waits only beyond one more, so a barrier does not wait for a flush of
/// a full cache in progress. At most `HANDED_MAX + 2` caches (the task's own and those handed over)
/// are in memory.
pub const HANDED_MAX: usize = 2;

/// A cache handed over to the writer and its flush.
type InFlight<K, V> = (Handed<K, V>, Arc<Slot<WriteLog>>);

/// The flushes of one interval between snapshots whose writes are logged.
type Interval = Arc<Vec<Arc<Slot<WriteLog>>>>;

/// Keyed state in a local store behind a write-back cache of at most `cache_max` keys. A full
/// cache, or the cache at a barrier, is handed whole to the store's writer thread and the task
/// goes on with an empty one; it reads the caches handed over (newest first) before the store until
/// it knows the writer wrote them, and waits for the writer only when more than [`HANDED_MAX`] are
/// in flight. So at most `HANDED_MAX + 2` caches of `cache_max` keys are in memory, and a barrier
/// costs the task a swap, not a write.
pub(crate) struct DiskMap<K, V> {
    // Field order is drop order: the writer (which waits for what was handed over) before the
    // store. The task reads the store as it is, not a snapshot of it: a key of a cache being
    // written is read from that cache, and every other key's stored value is the same in any
    // snapshot since its cache was written. (An open snapshot holds back the store's garbage
    // collection, so none is kept open longer than a scan.)
    writer: Writer<K, V>,
    store: Arc<Store>,
    cache: HashMap<K, Cached<V>>,
    /// The caches handed over (oldest first) and their flushes, read after `cache` (newest first)
    /// and before the store, until the task knows they were written.
    handed: VecDeque<InFlight<K, V>>,
    cache_max: usize,
    range: KeyGroupRange,
    max_parallelism: u32,
    /// Whether writes are logged for incremental snapshots (not while a restore fills the store).
    tracking: bool,
    /// The logged flushes since the last freeze.
    interval: Vec<Arc<Slot<WriteLog>>>,
    /// Bytes of the written flushes' logs that a later snapshot may still read (those of the kept
    /// freezes and of the current interval), at most `max_logged_bytes`.
    logged_bytes: usize,
    /// [`MAX_CHANGED_LOG_BYTES`] (tests set less).
    max_logged_bytes: usize,
    /// Per snapshot, its checkpoint and the flushes of the interval it ended, oldest first.
    freezes: FreezeLog<Interval>,
    key_buf: Vec<u8>,
    /// A restore's groups while it collects them (until tracking starts again), and the last group
    /// it restored: groups come in ascending order, each once.
    restoring: Option<(PendingRestore, Option<u32>)>,
    /// Restored groups the writer is still writing, read for keys of the groups not known to be in
    /// the store; `None` once the store holds them all.
    pending: Option<Arc<PendingRestore>>,
    /// How many of `pending`'s groups the task knows the store holds.
    pending_in_view: usize,
    /// A barrier's view comes after `pending`'s groups: a snapshot needs them written.
    pending_needed: bool,
    /// [`LAZY_RESTORE_MAX_BYTES`] (tests set less).
    lazy_restore_max_bytes: usize,
}

impl<K: Key, V: StateValue> DiskMap<K, V> {
    /// A new, empty store in `dir` named after `name` (unique per task incarnation). Files that
    /// processes no longer alive left in `dir` are removed first.
    pub fn create(
        dir: &Path,
        name: &str,
        range: KeyGroupRange,
        max_parallelism: u32,
        cache_max: usize,
    ) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| store_err(dir, e))?;
        remove_orphans(dir);
        let safe: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        // Unique in this process too (jobs with the same id may run side by side in one process).
        static STORES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STORES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let store = Store::create(dir.join(format!("{}-{safe}-{n}.store", std::process::id())))?;
        Ok(DiskMap {
            writer: Writer::start(store.clone(), max_parallelism)?,
            store,
            cache: HashMap::new(),
            handed: VecDeque::new(),
            cache_max: cache_max.max(1),
            range,
            max_parallelism,
            tracking: true,
            interval: Vec::new(),
            logged_bytes: 0,
            max_logged_bytes: MAX_CHANGED_LOG_BYTES,
            freezes: FreezeLog::new(DISK_FREEZES_KEPT),
            key_buf: Vec::new(),
            restoring: None,
            pending: None,
            pending_in_view: 0,
            pending_needed: false,
            lazy_restore_max_bytes: LAZY_RESTORE_MAX_BYTES,
        })
    }

    #[cfg(test)]
    fn path(&self) -> &Path {
        self.store.path()
    }

    /// The stored form of `k`'s key into `buf`.
    fn encode_key(&self, k: &K, buf: &mut Vec<u8>) -> Result<(), String> {
        buf.clear();
        let kg = key_group_of_hash(stable_hash(k), self.max_parallelism);
        buf.extend_from_slice(&kg.to_be_bytes());
        let taken = std::mem::take(buf);
        *buf = postcard::to_extend(k, taken).map_err(|e| format!("encoding a key: {e}"))?;
        Ok(())
    }

    /// Count the restored groups the store holds, and drop them once it holds them all.
    fn refresh_filled(&mut self) {
        // A group is counted after its write committed: a read after this holds it.
        let filled = self.pending.as_ref().map(|p| (p.filled(), p.len()));
        match filled {
            Some((filled, len)) if filled == len => self.pending = None,
            Some((filled, _)) => self.pending_in_view = filled,
            None => {}
        }
    }

    /// `k`'s value outside the cache: in the caches handed over (newest first), in the restored
    /// groups not yet written, or in the store.
    fn read(&mut self, k: &K) -> Result<Option<V>, String> {
        if let Some(c) = self.handed.iter().rev().find_map(|(h, _)| h.get(k)) {
            return Ok(c.value.clone());
        }
        if let Some(p) = &self.pending {
            if let Some(e) = p.failure() {
                return Err(format!("writing restored state to the local store: {e}"));
            }
            if p.filled() > self.pending_in_view {
                self.refresh_filled();
            }
        }
        let mut buf = std::mem::take(&mut self.key_buf);
        self.encode_key(k, &mut buf)?;
        let damaged = |e: postcard::Error| format!("decoding a value from the local store: {e}; the store is damaged");
        let value = match self.pending.as_ref().map(|p| p.lookup(&buf, self.pending_in_view)) {
            Some(Lookup::Pending(v)) => v.map(postcard::from_bytes).transpose().map_err(damaged)?,
            None | Some(Lookup::Store) => {
                self.store.get(&buf)?.map(|g| postcard::from_bytes(&g)).transpose().map_err(damaged)?
            }
        };
        self.key_buf = buf;
        Ok(value)
    }

    /// Make room for one more cached key.
    #[inline]
    fn room(&mut self) -> Result<(), String> {
        if self.cache.len() >= self.cache_max {
            self.hand_over(None, HANDED_MAX - 1)?;
        }
        Ok(())
    }

    /// `k`'s value, if it has one, for reading and writing (counted as written).
    pub fn get_mut(&mut self, k: &K) -> Result<Option<&mut Option<V>>, String> {
        if !self.cache.contains_key(k) {
            self.room()?;
            let value = self.read(k)?;
            self.cache.insert(k.clone(), Cached { value, dirty: false });
        }
        let c = self.cache.get_mut(k).expect("cached above");
        if c.value.is_none() {
            return Ok(None);
        }
        c.dirty = true;
        Ok(Some(&mut c.value))
    }

    /// Set `k`'s value (`None`: remove it). Whether it had one.
    pub fn insert(&mut self, k: K, value: Option<V>) -> Result<bool, String> {
        if let Some(c) = self.cache.get_mut(&k) {
            let had = c.value.is_some();
            *c = Cached { value, dirty: true };
            return Ok(had);
        }
        self.room()?;
        let had = self.read(&k)?.is_some();
        self.cache.insert(k, Cached { value, dirty: true });
        Ok(had)
    }

    /// Fill key group `kg` from a checkpoint with `records` (stored keys without their group, and
    /// stored values) sorted by key, written around the cache. Only while a restore fills a store
    /// that nothing else wrote to (before the task processes anything), groups in ascending order.
    /// Up to [`LAZY_RESTORE_MAX_BYTES`] of them are kept for the writer to write once the restore
    /// ends, while the task already processes; the groups beyond are written here.
    pub fn restore_sorted(&mut self, kg: u32, records: &[(&[u8], &[u8])]) -> Result<(), String> {
        if self.tracking || !self.cache.is_empty() || !self.handed.is_empty() || self.pending.is_some() {
            return Err(format!(
                "restoring key group {kg} into a local store that was already written to (a bug); the task fails and the job restores"
            ));
        }
        let (collected, last) = self.restoring.get_or_insert_with(Default::default);
        if last.is_some_and(|last| kg <= last) || !self.range.contains(KeyGroup(kg)) {
            return Err(format!(
                "restoring key group {kg} after group {last:?}, or outside groups {:?}: each group once, in order (a bug); the task fails and the job restores",
                self.range
            ));
        }
        *last = Some(kg);
        if collected.bytes() + held_bytes(records) <= self.lazy_restore_max_bytes {
            collected.push(kg, records)
        } else {
            check_sorted(kg, records)?;
            write_sorted(&self.store, kg, &mut records.iter().copied())
        }
    }

    /// Start (`false`) or end (`true`) logging writes for incremental snapshots; off while a
    /// restore fills the store (the first snapshot after a restore is whole anyway). At the end of
    /// a restore the groups it kept go to the writer, and the task goes on without waiting.
    pub fn track_changes(&mut self, on: bool) -> Result<(), String> {
        if on && !self.tracking {
            match self.restoring.take() {
                Some((collected, _)) => {
                    if !self.cache.is_empty() || !self.handed.is_empty() {
                        return Err("a restore wrote keys one by one and in groups into one local store (a bug); the task fails and the job restores".into());
                    }
                    if !collected.is_empty() {
                        let collected = Arc::new(collected);
                        self.writer.fill(collected.clone())?;
                        self.pending = Some(collected);
                        self.pending_in_view = 0;
                    }
                    self.refresh_filled();
                }
                None => self.write_all()?,
            }
            self.interval.clear();
            self.logged_bytes = 0;
        }
        self.tracking = on;
        Ok(())
    }

    /// Forget the caches handed over that the writer wrote, waiting for the oldest while more than
    /// `keep` are left; the store then holds them. Returns them, to be freed.
    fn settle(&mut self, keep: usize) -> Result<Vec<Handed<K, V>>, String> {
        let mut written = Vec::new();
        while let Some((_, done)) = self.handed.front() {
            if self.handed.len() <= keep && !done.is_ready() {
                break;
            }
            let logged = done.get()?;
            self.logged_bytes += logged.len();
            written.push(self.handed.pop_front().expect("looked at").0);
        }
        if written.is_empty() {
            return Ok(written);
        }
        self.refresh_filled();
        if self.logged_bytes > self.max_logged_bytes {
            // Too much to log: the next snapshot is whole, later ones build on it again.
            self.interval.clear();
            self.freezes.clear();
            self.logged_bytes = 0;
        }
        Ok(written)
    }

    /// Hand the cache over to the writer (once at most `keep` handed over before are in flight)
    /// and go on with an empty one; `view` gets the store's view once it is written.
    fn hand_over(&mut self, view: Option<&Arc<Slot<View>>>, keep: usize) -> Result<(), String> {
        if self.pending.as_ref().is_some_and(|p| p.filled() == p.len()) {
            self.refresh_filled(); // and free the restored records
        }
        self.pending_needed |= view.is_some() && self.pending.is_some();
        let written = self.settle(keep)?;
        let cache: Handed<K, V> = Arc::new(std::mem::take(&mut self.cache));
        let done = Slot::new();
        self.writer.hand_over(cache.clone(), written, self.tracking, &done, view)?;
        if self.tracking {
            self.interval.push(done.clone());
        }
        self.handed.push_back((cache, done));
        Ok(())
    }

    /// Write everything to the store and wait for it; afterwards the store alone holds the state.
    fn write_all(&mut self) -> Result<(), String> {
        self.hand_over(None, HANDED_MAX)?;
        self.settle(0)?;
        Ok(())
    }

    /// Hand the cache over and the store's view after it to the snapshot of `checkpoint` (see
    /// [`CowMap::freeze`](super::CowMap::freeze) for `base`). Costs the task a swap of the cache
    /// (and a wait only if more than [`HANDED_MAX`] caches are still being written), not a write.
    pub fn freeze(&mut self, checkpoint: CheckpointId, base: Option<CheckpointId>) -> Result<DiskFrozen, String> {
        let view = Slot::new();
        self.hand_over(Some(&view), HANDED_MAX)?;
        let sealed = Arc::new(std::mem::take(&mut self.interval));
        let base_kept = base.filter(|b| self.freezes.get(*b).is_some());
        self.freezes.record(checkpoint, base, sealed);
        // The freezes before the base are gone, and their logs with them: count what is left (the
        // flushes still handed over are counted when they settle).
        let handed = |s: &Arc<Slot<WriteLog>>| self.handed.iter().any(|(_, h)| Arc::ptr_eq(h, s));
        self.logged_bytes = (self.freezes.kept().flat_map(|i| i.iter()))
            .filter(|s| !handed(s))
            .map(|s| s.get().map_or(0, |log| log.len()))
            .sum();
        let changed = base_kept.map(|b| self.freezes.after(b).cloned().collect());
        Ok(DiskFrozen {
            view,
            spool: self.store.path().with_extension(format!("{}.spool", checkpoint.0)),
            _store: self.store.clone(),
            range: self.range,
            max_parallelism: self.max_parallelism,
            changed,
        })
    }

    /// Call `f` for every key with state (in the store's order), letting it change the value;
    /// stops when `f` returns false.
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&K, &mut Option<V>) -> bool) -> Result<(), String> {
        self.write_all()?;
        let view = self.store.view();
        for item in view.iter() {
            let (k, v) = item?;
            let damaged = |e: postcard::Error| format!("decoding the local store: {e}; the store is damaged");
            let key: K = postcard::from_bytes(k.get(4..).unwrap_or_default()).map_err(damaged)?;
            let mut slot: Option<V> = Some(postcard::from_bytes(&v).map_err(damaged)?);
            let go = f(&key, &mut slot);
            // Only what `f` changed is written back: rewriting every key (as at the end of
            // input) would make the store write, and the next snapshot hold, the whole state.
            let unchanged = match &slot {
                Some(value) => postcard::to_allocvec(value).map_err(|e| format!("encoding a value: {e}"))? == v[..],
                None => false,
            };
            if !unchanged {
                self.room()?;
                self.cache.insert(key, Cached { value: slot, dirty: true });
            }
            if !go {
                break;
            }
        }
        Ok(())
    }
}

impl<K, V> Drop for DiskMap<K, V> {
    fn drop(&mut self) {
        // The writer (dropped after this) would otherwise finish a restore's groups first.
        if let Some(p) = self.pending.as_ref().filter(|_| !self.pending_needed) {
            p.abandon();
        }
    }
}

/// A [`DiskMap`]'s store as it was at a barrier, with the keys changed since the base's snapshot if
/// the map still knew them.
pub(crate) struct DiskFrozen {
    // Field order is drop order, as in `DiskMap`: the store must outlive the view.
    /// The store's view right after the barrier's cache was written.
    view: Arc<Slot<View>>,
    _store: Arc<Store>,
    range: KeyGroupRange,
    max_parallelism: u32,
    /// The flushes of the intervals since the base, if the map still knew them.
    changed: Option<Vec<Interval>>,
    /// Where a whole snapshot's task state file is built (next to the store; the scratch files of
    /// a process that is gone are removed with its stores).
    spool: std::path::PathBuf,
}

impl DiskFrozen {
    /// Whether [`DiskFrozen::encode`] can hold only what changed since the base.
    #[cfg(test)]
    pub fn can_be_incremental(&self) -> bool {
        self.changed.is_some()
    }

    /// As [`Frozen::encode`](super::Frozen::encode): what changed since the base in memory, or
    /// the whole store streamed a key group at a time ([`KeyedStream`]): a whole snapshot holds one
    /// key group's records in memory, not the state.
    pub fn encode(self, uid: &str, incremental: bool) -> Result<Encoded, String> {
        let DiskFrozen { view, _store, range, max_parallelism, changed, spool } = self;
        let group = group_of(uid, range);
        let Some(logs) = changed.filter(|_| incremental) else {
            // Dropped in field order, the view before the store, whether or not it is produced.
            let held = (view, _store);
            let uid = uid.to_string();
            let produce = move |emit: EmitGroup<'_>| {
                let result = (|| {
                    let view = held.0.take().map_err(|e| format!("{uid}: {e}"))?;
                    let mut blob: Vec<u8> = Vec::new();
                    let mut current = None;
                    for item in view.iter() {
                        let (k, v) = item.map_err(|e| format!("{uid}: {e}"))?;
                        let g = range.start + group(&k)? as u32;
                        if current != Some(g) {
                            if let Some(c) = current {
                                emit(c, &blob)?;
                                blob.clear();
                            }
                            current = Some(g);
                        }
                        blob.extend_from_slice(&k[4..]);
                        blob.extend_from_slice(&v);
                    }
                    match current {
                        Some(c) => emit(c, &blob),
                        None => Ok(()),
                    }
                })();
                drop(held);
                result
            };
            return Ok(Encoded::Stream(KeyedStream { max_parallelism, range, spool, produce: Box::new(produce) }));
        };
        // The writes since the base, from the flushes' logs (oldest first): the latest write of a
        // key is its value in the view.
        view.take().map_err(|e| format!("{uid}: {e}"))?;
        drop(view);
        let groups_len = range.len() as usize;
        let mut upserts: Vec<Vec<u8>> = vec![Vec::new(); groups_len];
        let mut removes: Vec<Vec<u8>> = vec![Vec::new(); groups_len];
        let mut written: Vec<WriteLog> = Vec::new();
        for flush in logs.iter().flat_map(|interval| interval.iter()) {
            written.push(flush.get().map_err(|e| format!("{uid}: {e}"))?);
        }
        let mut latest: HashMap<&[u8], Option<&[u8]>> = HashMap::new();
        for log in &written {
            read_log(log, |key, value| {
                latest.insert(key, value);
            })
            .map_err(|e| format!("{uid}: {e}"))?;
        }
        let mut changes: Vec<(&[u8], Option<&[u8]>)> = latest.into_iter().collect();
        changes.sort_unstable_by_key(|(key, _)| *key);
        for (key, value) in changes {
            let g = group(key)?;
            match value {
                Some(v) => {
                    upserts[g].extend_from_slice(&key[4..]);
                    upserts[g].extend_from_slice(v);
                }
                None => removes[g].extend_from_slice(&key[4..]),
            }
        }
        Ok(ElementState::keyed(range.start, max_parallelism, upserts, Some(removes)).into())
    }
}

/// The index in `range` of a stored key's group.
fn group_of(uid: &str, range: KeyGroupRange) -> impl Fn(&[u8]) -> Result<usize, String> + Send + 'static {
    let uid = uid.to_string();
    move |key: &[u8]| {
        let kg = key.get(..4).map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")));
        match kg {
            // Invariant: only keys of the task's own groups were stored.
            Some(kg) if range.contains(KeyGroup(kg)) => Ok((kg - range.start) as usize),
            _ => Err(format!("{uid}: the local state store holds a key outside key groups {range:?}")),
        }
    }
}

/// A [`DiskFrozen`] as a snapshot image of element `uid`.
pub(crate) struct DiskImage {
    pub uid: String,
    pub frozen: DiskFrozen,
}

impl StateImage for DiskImage {
    fn encode(self: Box<Self>, incremental: bool) -> Result<Encoded, String> {
        self.frozen.encode(&self.uid, incremental)
    }
}

#[cfg(test)]
#[path = "disk_tests.rs"]
mod tests;
