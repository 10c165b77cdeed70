//! [`MemStore`]: a checkpoint store held in memory, with the same semantics as
//! [`crate::LocalDirStore`] (the semantics live in [`crate::store`]), for deterministic simulations and
//! tests. Every write is atomic and "durable" at once; nothing survives the value. Directories are
//! implied by the paths of the files in them.

use crate::error::StorageError;
use crate::store::{impl_checkpoint_store, Entry, Files};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// An in-memory checkpoint store (path -> bytes) with the semantics of every other store, for
/// deterministic simulations and tests. Writes are atomic and "durable" at once; nothing survives
/// the value. Share it between threads behind an `Arc`. Its `raw_*` methods and
/// [`MemStore::corrupt`] bypass the store semantics to stage damage and leftovers.
#[derive(Debug, Default)]
pub struct MemStore {
    files: Mutex<BTreeMap<String, Vec<u8>>>,
    /// Reads of each path through the store since the last [`MemStore::take_reads`].
    reads: Mutex<BTreeMap<String, usize>>,
    /// Held by the one run using this store (see `CheckpointStore::lock`).
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Releases a [`MemStore`] when the run holding it ends.
struct MemLock(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for MemLock {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Flips one byte (the middle one) of the file at `path`, to simulate corruption. Panics if there
    /// is no such file or it is empty.
    pub fn corrupt(&self, path: &str) {
        let mut files = self.lock();
        let bytes = files.get_mut(path).unwrap_or_else(|| panic!("MemStore::corrupt: no file {path:?}"));
        assert!(!bytes.is_empty(), "MemStore::corrupt: {path:?} is empty");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xFF;
    }

    /// The paths of all files, sorted.
    pub fn paths(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// The bytes of the file at `path` (relative to the root, as [`MemStore::paths`] names it),
    /// bypassing the store semantics: what a test or simulation inspects, or damages and puts back.
    pub fn raw_get(&self, path: &str) -> Option<Vec<u8>> {
        self.lock().get(path).cloned()
    }

    /// Writes a file bypassing the store semantics (no framing, no checks): to simulate leftovers of a
    /// crash, damage, or files a user moved by hand.
    pub fn raw_put(&self, path: &str, bytes: &[u8]) {
        self.lock().insert(path.to_string(), bytes.to_vec());
    }

    /// Removes a file bypassing the store semantics (a file a user deleted or moved by hand); whether
    /// there was one.
    pub fn raw_remove(&self, path: &str) -> bool {
        self.lock().remove(path).is_some()
    }

    /// How many times the store read each file since the last call (or since it was made), and
    /// start counting again: what a test checks to see that a restore reads each file once.
    pub fn take_reads(&self) -> BTreeMap<String, usize> {
        std::mem::take(&mut *self.reads.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A panic in a test holding the lock must not hide the store from the next assertion.
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn dir_prefix(dir: &str) -> String {
    if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    }
}

impl Files for MemStore {
    fn lock(&self) -> Result<crate::StoreLock, StorageError> {
        if self.held.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(StorageError::Locked { path: "(memory store)".into() });
        }
        Ok(crate::StoreLock::holding(Box::new(MemLock(self.held.clone()))))
    }

    fn display_path(&self, rel: &str) -> PathBuf {
        PathBuf::from(format!("mem:{rel}"))
    }

    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, StorageError> {
        *self.reads.lock().unwrap_or_else(|e| e.into_inner()).entry(rel.to_string()).or_default() += 1;
        Ok(self.lock().get(rel).cloned())
    }

    fn size(&self, rel: &str) -> Result<Option<u64>, StorageError> {
        Ok(self.lock().get(rel).map(|b| b.len() as u64))
    }

    fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StorageError> {
        self.lock().insert(rel.to_string(), bytes.to_vec());
        Ok(())
    }

    fn put_new(&self, rel: &str, bytes: &[u8]) -> Result<bool, StorageError> {
        let mut files = self.lock();
        if files.contains_key(rel) {
            return Ok(false);
        }
        files.insert(rel.to_string(), bytes.to_vec());
        Ok(true)
    }

    fn list(&self, dir: &str) -> Result<Vec<Entry>, StorageError> {
        let prefix = dir_prefix(dir);
        let files = self.lock();
        let mut out: Vec<Entry> = Vec::new();
        let mut from = prefix.clone();
        'seek: loop {
            for (key, _) in files.range(from.clone()..) {
                let Some(rest) = key.strip_prefix(&prefix) else {
                    break 'seek;
                };
                match rest.split_once('/') {
                    Some((first, _)) => {
                        out.push(Entry { name: first.to_string(), is_dir: true });
                        // Skip the rest of that subdirectory: '0' sorts right after '/'.
                        from = format!("{prefix}{first}0");
                        continue 'seek;
                    }
                    None => out.push(Entry { name: rest.to_string(), is_dir: false }),
                }
            }
            break;
        }
        Ok(out)
    }

    fn remove_file(&self, rel: &str) -> Result<(), StorageError> {
        self.lock().remove(rel);
        Ok(())
    }

    fn remove_dir_if_empty(&self, dir: &str) -> Result<bool, StorageError> {
        let prefix = dir_prefix(dir);
        let files = self.lock();
        let empty = !files.range(prefix.clone()..).next().is_some_and(|(k, _)| k.starts_with(&prefix));
        Ok(empty)
    }

    fn sync_dir(&self, _dir: &str) -> Result<(), StorageError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "in-memory store".to_string()
    }
}

impl_checkpoint_store!(MemStore);
