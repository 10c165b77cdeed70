//! The embedded store behind a [`DiskMap`](super::DiskMap): one LSM tree (fjall) per task
//! incarnation, in a directory of its own, removed with the last handle on it. Everything the
//! state backend needs of a store is here: write a batch of changes, write a restored key group,
//! and open a [`View`] (a snapshot: later writes do not show in it).
//!
//! Why an LSM tree: a B-tree (redb, before) writes about a page per key for keys spread over a
//! tree larger than its page cache, so a job's first pass over 100 M new keys crawled at 42 k keys
//! a second, slowing as the tree grew. An LSM tree writes sequentially and merges in the
//! background (BENCHMARKS.md "State on disk").
//!
//! **Invariant:** the store is never the durable copy of anything: a restarted task builds a new
//! one from the checkpoint, so nothing is synced to disk and nothing is recovered from the
//! directory (a directory left by a killed process is removed, [`remove_orphans`]).

use fjall::config::PinningPolicy;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, Readable, Slice, Snapshot};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The store's block cache, per task.
pub const DISK_BLOCK_CACHE_BYTES: u64 = 64 << 20;
/// The store's background threads (memtable flushes and compactions), per task. One: with two,
/// fjall's first worker hands every compaction back to the queue while a flush may be pending, and
/// the two spun on that queue (a fifth of a profile's samples at 50 M keys).
pub const DISK_STORE_WORKER_THREADS: usize = 1;
/// The store's memtable (writes not yet flushed to a sorted table), per task; up to four more
/// sealed ones wait for their flush before the writer thread stalls.
pub const DISK_MEMTABLE_BYTES: u64 = 16 << 20;
/// The store's write-ahead journal, per task, beyond which it flushes its memtables to free it
/// (fjall's floor is 64 MiB).
pub const DISK_JOURNAL_MAX_BYTES: u64 = 128 << 20;

/// A failure of the local store; the task fails and the job restores.
pub(super) fn store_err(path: &Path, e: impl std::fmt::Display) -> String {
    format!(
        "local state store {}: {e}; check the disk under the state backend's directory (space, permissions)",
        path.display()
    )
}

/// A task's store. Dropping the last handle closes it (its threads stop) and removes its directory.
pub(super) struct Store {
    // Field order is drop order: the database (and its threads) before its directory.
    db: Database,
    kv: Keyspace,
    dir: StoreDir,
}

struct StoreDir(PathBuf);

impl Drop for StoreDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Store {
    /// A new, empty store in directory `path` (which must not exist yet, or is replaced).
    pub fn create(path: PathBuf) -> Result<Arc<Self>, String> {
        let _ = std::fs::remove_dir_all(&path);
        let dir = StoreDir(path);
        let db = Database::builder(&dir.0)
            .cache_size(DISK_BLOCK_CACHE_BYTES)
            .worker_threads(DISK_STORE_WORKER_THREADS)
            .max_journaling_size(DISK_JOURNAL_MAX_BYTES)
            // Batches are not written through to the OS at each commit: the store is not durable.
            .manual_journal_persist(true)
            .open()
            .map_err(|e| store_err(&dir.0, e))?;
        // A cache miss of a key with no state (every new key) must not read a table's filter
        // from disk: the filters and indexes of every level stay in memory (about 10 bits a key,
        // measured: with the defaults a point read at 16 M keys loaded a large filter block each
        // time, 6 k reads a second).
        let options = || {
            KeyspaceCreateOptions::default()
                .filter_block_pinning_policy(PinningPolicy::all(true))
                .index_block_pinning_policy(PinningPolicy::all(true))
                .max_memtable_size(DISK_MEMTABLE_BYTES)
        };
        let kv = db.keyspace("kv", options).map_err(|e| store_err(&dir.0, e))?;
        Ok(Arc::new(Store { db, kv, dir }))
    }

    pub fn path(&self) -> &Path {
        &self.dir.0
    }

    /// `key`'s stored value, as the store holds it now.
    pub fn get(&self, key: &[u8]) -> Result<Option<Slice>, String> {
        self.kv.get(key).map_err(|e| store_err(self.path(), e))
    }

    /// What the store holds now; later writes do not show in it. Keep it short-lived: while it
    /// is open, the store keeps what later writes replace (memtables, old versions of keys).
    pub fn view(self: &Arc<Self>) -> View {
        View { snapshot: self.db.snapshot(), store: self.clone() }
    }

    /// Apply `writes` (stored key, stored value or `None` to remove) atomically.
    pub fn write<'a>(&self, writes: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>) -> Result<(), String> {
        let mut batch = self.db.batch().durability(None);
        for (key, value) in writes {
            match value {
                Some(v) => batch.insert(&self.kv, key, v),
                None => batch.remove(&self.kv, key),
            }
        }
        batch.commit().map_err(|e| store_err(self.path(), e))?;
        Ok(())
    }
}

/// A store as it was when the view was opened.
pub(super) struct View {
    snapshot: Snapshot,
    store: Arc<Store>,
}

impl View {
    /// Every `(stored key, stored value)` in key order.
    pub fn iter(&self) -> impl Iterator<Item = Result<(Slice, Slice), String>> + '_ {
        self.snapshot.iter(&self.store.kv).map(|g| g.into_inner().map_err(|e| store_err(self.store.path(), e)))
    }
}

/// Remove the stores in `dir` whose process is gone (`<pid>-*.store` directories, and the
/// `<pid>-*.redb` files of older versions), left by a process killed before it could remove them.
pub(super) fn remove_orphans(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let stem = [".store", ".redb", ".spool"].iter().find_map(|suffix| name.strip_suffix(suffix));
        let Some((pid, _)) = stem.and_then(|n| n.split_once('-')) else { continue };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let gone =
            unsafe { libc::kill(pid, 0) } == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let path = e.path();
            let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        }
    }
}
