//! [`DiskMap`]: keyed state on local disk (the disk [`StateBackend`](super::StateBackend), feature
//! `spill`), in an embedded store with a bounded write-back cache in front; and [`DiskFrozen`], the
//! store's view at a barrier, encoded on a snapshot writer thread, whole or as what changed since
//! the snapshot's base.
//!
//! The store (redb) holds one table: the key is the key group (4 bytes, big-endian, so a scan
//! visits the groups in order) followed by the key's postcard encoding, the value the value's
//! postcard encoding. A snapshot's `(key, value)` record is then the stored key without its group
//! followed by the stored value, as [`ElementState`] wants it, without decoding either.

use super::hash::{key_group_of_hash, stable_hash};
use super::snapshot::{ElementState, StateImage};
use super::{Key, StateValue};
use cutline_core::{CheckpointId, KeyGroup, KeyGroupRange};
use redb::{Database, Durability, ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");

/// Keys written to the store between two durable commits. The other commits are not synced to
/// disk, which the store does not need (a restarted task refills a new one from the checkpoint), but
/// it reuses the pages they free only after a durable commit: this bounds the file's growth (about a
/// page per key written) without a sync per flush.
pub const DURABLE_COMMIT_AFTER_WRITES: u64 = 65_536;
/// Snapshots whose changed keys are kept for incremental snapshots built on them (as
/// [`FREEZES_KEPT`](super::cow_map) in memory); an older base means a whole snapshot.
pub const DISK_FREEZES_KEPT: usize = 64;
/// Bytes of changed keys logged between two snapshots; beyond it the log is dropped and the next
/// snapshot is whole (as when checkpoints are off for a long time).
pub const MAX_CHANGED_LOG_BYTES: usize = 256 << 20;
/// The store's own page cache, per task.
pub const DISK_PAGE_CACHE_BYTES: usize = 64 << 20;

type View = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// A failure of the local store; the task fails and the job restores.
fn store_err(path: &Path, e: impl std::fmt::Display) -> String {
    format!(
        "local state store {}: {e}; check the disk under the state backend's directory (space, permissions)",
        path.display()
    )
}

/// The store's file, removed when the map and every snapshot reading it are gone.
struct StoreFile(PathBuf);

impl Drop for StoreFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A cached entry: `None` is a key known to have no state.
struct Cached<V> {
    value: Option<V>,
    dirty: bool,
}

/// Keyed state in a local store behind a write-back cache of at most `cache_max` keys.
pub(crate) struct DiskMap<K, V> {
    // Field order is drop order: the views before the database, the database before its file.
    view: View,
    db: Arc<Database>,
    file: Arc<StoreFile>,
    cache: HashMap<K, Cached<V>>,
    cache_max: usize,
    range: KeyGroupRange,
    max_parallelism: u32,
    /// Keys written since the last durable commit.
    undurable_writes: u64,
    /// Stored keys written since the last freeze, each after its length (u32, little-endian).
    changed: Vec<u8>,
    /// Whether writes are logged in `changed` (not while a restore fills the store).
    tracking: bool,
    /// Per snapshot, its checkpoint and the keys written in the interval it ended, oldest first.
    freezes: VecDeque<(CheckpointId, Arc<Vec<u8>>)>,
    key_buf: Vec<u8>,
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
        let path = dir.join(format!("{}-{safe}-{n}.redb", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let file = Arc::new(StoreFile(path.clone()));
        let db =
            Database::builder().set_cache_size(DISK_PAGE_CACHE_BYTES).create(&path).map_err(|e| store_err(&path, e))?;
        let mut txn = db.begin_write().map_err(|e| store_err(&path, e))?;
        txn.set_durability(Durability::None).map_err(|e| store_err(&path, e))?;
        txn.open_table(KV).map_err(|e| store_err(&path, e))?;
        txn.commit().map_err(|e| store_err(&path, e))?;
        let view = open_view(&db, &path)?;
        Ok(DiskMap {
            view,
            db: Arc::new(db),
            file,
            cache: HashMap::new(),
            cache_max: cache_max.max(1),
            range,
            max_parallelism,
            undurable_writes: 0,
            changed: Vec::new(),
            tracking: true,
            freezes: VecDeque::new(),
            key_buf: Vec::new(),
        })
    }

    fn path(&self) -> &Path {
        &self.file.0
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

    /// `k`'s value in the store.
    fn read(&mut self, k: &K) -> Result<Option<V>, String> {
        let mut buf = std::mem::take(&mut self.key_buf);
        self.encode_key(k, &mut buf)?;
        let got = self.view.get(&buf[..]).map_err(|e| store_err(self.path(), e))?;
        let value = match got {
            None => None,
            Some(g) => Some(
                postcard::from_bytes(g.value())
                    .map_err(|e| format!("decoding a value from the local store: {e}; the store is damaged"))?,
            ),
        };
        self.key_buf = buf;
        Ok(value)
    }

    /// Make room for one more cached key.
    #[inline]
    fn room(&mut self) -> Result<(), String> {
        if self.cache.len() >= self.cache_max {
            self.flush()?;
            self.cache.clear();
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

    /// Start (`false`) or end (`true`) logging writes for incremental snapshots; off while a
    /// restore fills the store (the first snapshot after a restore is whole anyway).
    pub fn track_changes(&mut self, on: bool) -> Result<(), String> {
        if on && !self.tracking {
            self.flush()?;
            self.changed.clear();
        }
        self.tracking = on;
        Ok(())
    }

    /// Write the written keys to the store in one transaction (in key order) and renew the view.
    fn flush(&mut self) -> Result<(), String> {
        let mut writes: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        for (k, c) in self.cache.iter_mut().filter(|(_, c)| c.dirty) {
            c.dirty = false;
            let mut key = Vec::new();
            let kg = key_group_of_hash(stable_hash(k), self.max_parallelism);
            key.extend_from_slice(&kg.to_be_bytes());
            key = postcard::to_extend(k, key).map_err(|e| format!("encoding a key: {e}"))?;
            let value = match &c.value {
                Some(v) => Some(postcard::to_allocvec(v).map_err(|e| format!("encoding a value: {e}"))?),
                None => None,
            };
            writes.push((key, value));
        }
        if writes.is_empty() {
            return Ok(());
        }
        writes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let path = self.file.0.clone();
        let err = |e: &dyn std::fmt::Display| store_err(&path, e);
        let mut txn = self.db.begin_write().map_err(|e| err(&e))?;
        self.undurable_writes += writes.len() as u64;
        let durability = if self.undurable_writes >= DURABLE_COMMIT_AFTER_WRITES {
            self.undurable_writes = 0;
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
        self.view = open_view(&self.db, &path)?;
        if self.tracking {
            for (key, _) in &writes {
                self.changed.extend_from_slice(&(key.len() as u32).to_le_bytes());
                self.changed.extend_from_slice(key);
            }
            if self.changed.len() > MAX_CHANGED_LOG_BYTES {
                // Too much to log: the next snapshot is whole, later ones build on it again.
                self.changed = Vec::new();
                self.freezes.clear();
            }
        }
        Ok(())
    }

    /// Flush what was written and hand the store's view to the snapshot of `checkpoint` (see
    /// [`CowMap::freeze`](super::CowMap::freeze) for `base`). Costs a flush of at most the cache,
    /// not O(entries).
    pub fn freeze(&mut self, checkpoint: CheckpointId, base: Option<CheckpointId>) -> Result<DiskFrozen, String> {
        self.flush()?;
        let sealed = Arc::new(std::mem::take(&mut self.changed));
        let base_kept = base.is_some_and(|b| self.freezes.iter().any(|(c, _)| *c == b));
        if let Some(b) = base {
            while self.freezes.front().is_some_and(|(c, _)| *c < b) {
                self.freezes.pop_front();
            }
        }
        if self.freezes.len() == DISK_FREEZES_KEPT {
            self.freezes.pop_front();
        }
        self.freezes.push_back((checkpoint, sealed));
        let changed = match (base, base_kept) {
            (Some(b), true) => {
                Some(self.freezes.iter().filter(|(c, _)| *c > b).map(|(_, keys)| keys.clone()).collect())
            }
            _ => None,
        };
        Ok(DiskFrozen {
            view: open_view(&self.db, self.path())?,
            _db: self.db.clone(),
            _file: self.file.clone(),
            range: self.range,
            max_parallelism: self.max_parallelism,
            changed,
        })
    }

    /// Call `f` for every key with state (in the store's order), letting it change the value;
    /// stops when `f` returns false.
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&K, &mut Option<V>) -> bool) -> Result<(), String> {
        self.flush()?;
        self.cache.clear();
        let view = open_view(&self.db, self.path())?;
        let iter = view.iter().map_err(|e| store_err(self.path(), e))?;
        for item in iter {
            let (k, v) = item.map_err(|e| store_err(self.path(), e))?;
            let damaged = |e: postcard::Error| format!("decoding the local store: {e}; the store is damaged");
            let key: K = postcard::from_bytes(&k.value()[4..]).map_err(damaged)?;
            let mut slot: Option<V> = Some(postcard::from_bytes(v.value()).map_err(damaged)?);
            let go = f(&key, &mut slot);
            self.room()?;
            self.cache.insert(key, Cached { value: slot, dirty: true });
            if !go {
                break;
            }
        }
        Ok(())
    }
}

fn open_view(db: &Database, path: &Path) -> Result<View, String> {
    let txn = db.begin_read().map_err(|e| store_err(path, e))?;
    txn.open_table(KV).map_err(|e| store_err(path, e))
}

/// Remove the stores in `dir` whose process is gone (`<pid>-*.redb`, left by a process killed
/// before it could remove them).
fn remove_orphans(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((pid, _)) = name.strip_suffix(".redb").and_then(|n| n.split_once('-')) else { continue };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let gone =
            unsafe { libc::kill(pid, 0) } == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A [`DiskMap`]'s store as it was at a barrier, with the keys changed since the base's snapshot if
/// the map still knew them.
pub(crate) struct DiskFrozen {
    // Field order is drop order, as in `DiskMap`: the store must outlive the view.
    view: View,
    _db: Arc<Database>,
    _file: Arc<StoreFile>,
    range: KeyGroupRange,
    max_parallelism: u32,
    changed: Option<Vec<Arc<Vec<u8>>>>,
}

impl DiskFrozen {
    /// Whether [`DiskFrozen::encode`] can hold only what changed since the base.
    #[cfg(test)]
    pub fn can_be_incremental(&self) -> bool {
        self.changed.is_some()
    }

    /// As [`Frozen::encode`](super::Frozen::encode): whole, or what changed since the base.
    pub fn encode(self, uid: &str, incremental: bool) -> Result<ElementState, String> {
        let range = self.range;
        let groups_len = range.len() as usize;
        let changed = self.changed.filter(|_| incremental);
        let mut upserts: Vec<Vec<u8>> = vec![Vec::new(); groups_len];
        let mut removes: Vec<Vec<u8>> = vec![Vec::new(); if changed.is_some() { groups_len } else { 0 }];
        let store = |e: redb::StorageError| format!("{uid}: reading the local state store: {e}");
        let group = |key: &[u8]| -> Result<usize, String> {
            let kg = key.get(..4).map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")));
            match kg {
                // Invariant: only keys of the task's own groups were stored.
                Some(kg) if range.contains(KeyGroup(kg)) => Ok((kg - range.start) as usize),
                _ => Err(format!("{uid}: the local state store holds a key outside key groups {range:?}")),
            }
        };
        match &changed {
            Some(logs) => {
                let mut keys: Vec<&[u8]> = Vec::new();
                for log in logs {
                    let mut rest = &log[..];
                    while let Some(len) = rest.get(..4) {
                        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
                        keys.push(&rest[4..4 + len]);
                        rest = &rest[4 + len..];
                    }
                }
                keys.sort_unstable();
                keys.dedup();
                for key in keys {
                    let g = group(key)?;
                    match self.view.get(key).map_err(store)? {
                        Some(v) => {
                            upserts[g].extend_from_slice(&key[4..]);
                            upserts[g].extend_from_slice(v.value());
                        }
                        None => removes[g].extend_from_slice(&key[4..]),
                    }
                }
            }
            None => {
                for item in self.view.iter().map_err(store)? {
                    let (k, v) = item.map_err(store)?;
                    let g = group(k.value())?;
                    upserts[g].extend_from_slice(&k.value()[4..]);
                    upserts[g].extend_from_slice(v.value());
                }
            }
        }
        Ok(ElementState::keyed(range.start, self.max_parallelism, upserts, changed.map(|_| removes)))
    }
}

/// A [`DiskFrozen`] as a snapshot image of element `uid`.
pub(crate) struct DiskImage {
    pub uid: String,
    pub frozen: DiskFrozen,
}

impl StateImage for DiskImage {
    fn encode(self: Box<Self>, incremental: bool) -> Result<ElementState, String> {
        self.frozen.encode(&self.uid, incremental)
    }
}

#[cfg(test)]
#[path = "disk_tests.rs"]
mod tests;
