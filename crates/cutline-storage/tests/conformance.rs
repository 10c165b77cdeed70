//! The storage conformance suite (`tests/common`) on the stores that need no server: `LocalDirStore`
//! (module `local`) and `MemStore` (module `mem`), one test per scenario and store; plus what only a
//! local directory or only the memory store has. `tests/s3/` runs the same suite on `S3Store`.

#[macro_use]
mod common;

use common::{Budget, Harness};
use cutline_storage::{CheckpointStore, LocalDirStore, MemStore};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A `LocalDirStore` in a temporary directory of its own; raw access through the file system.
struct LocalHarness {
    store: Arc<LocalDirStore>,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl LocalHarness {
    fn new(_test: &str) -> LocalHarness {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = Arc::new(LocalDirStore::open(&root).unwrap());
        LocalHarness { store, root, _dir: dir }
    }
}

fn walk(root: &Path, rel: &str, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(root.join(rel)).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let child = if rel.is_empty() { name } else { format!("{rel}/{name}") };
        if entry.file_type().unwrap().is_dir() {
            walk(root, &child, out);
        } else {
            out.push(child);
        }
    }
}

impl Harness for LocalHarness {
    fn name(&self) -> &'static str {
        "local"
    }
    fn store(&self) -> &dyn CheckpointStore {
        &*self.store
    }
    fn shared(&self) -> Arc<dyn CheckpointStore> {
        self.store.clone()
    }
    fn another_client(&self) -> Arc<dyn CheckpointStore> {
        Arc::new(LocalDirStore::open(&self.root).unwrap())
    }
    fn fresh(&self) -> Box<dyn Harness> {
        Box::new(LocalHarness::new("fresh"))
    }
    fn put_raw(&self, path: &str, bytes: &[u8]) {
        let path = self.root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    /// Also removes the directories it leaves empty, as moving or deleting a directory by hand would
    /// (and as prefixes vanish with their last object on S3).
    fn remove_raw(&self, path: &str) {
        let path = self.root.join(path);
        std::fs::remove_file(&path).unwrap();
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| *d != self.root.join("checkpoints") && d.starts_with(&self.root)) {
            if std::fs::remove_dir(d).is_err() {
                break; // not empty
            }
            dir = d.parent();
        }
    }
    fn get_raw(&self, path: &str) -> Option<Vec<u8>> {
        std::fs::read(self.root.join(path)).ok()
    }
    fn files(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(&self.root, "", &mut out);
        out.sort();
        out
    }
    fn shown(&self, path: &str) -> String {
        self.root.join(path).display().to_string()
    }
    fn budget(&self) -> Budget {
        Budget::LOCAL
    }
}

/// A `MemStore`; raw access through its test hooks.
struct MemHarness {
    store: Arc<MemStore>,
}

impl MemHarness {
    fn new(_test: &str) -> MemHarness {
        MemHarness { store: Arc::new(MemStore::new()) }
    }
}

impl Harness for MemHarness {
    fn name(&self) -> &'static str {
        "mem"
    }
    fn store(&self) -> &dyn CheckpointStore {
        &*self.store
    }
    fn shared(&self) -> Arc<dyn CheckpointStore> {
        self.store.clone()
    }
    /// Nothing else can reach a memory store: the second client is the same store.
    fn another_client(&self) -> Arc<dyn CheckpointStore> {
        self.store.clone()
    }
    fn fresh(&self) -> Box<dyn Harness> {
        Box::new(MemHarness::new("fresh"))
    }
    fn put_raw(&self, path: &str, bytes: &[u8]) {
        self.store.raw_put(path, bytes)
    }
    fn remove_raw(&self, path: &str) {
        assert!(self.store.raw_remove(path), "mem: no file {path}");
    }
    fn get_raw(&self, path: &str) -> Option<Vec<u8>> {
        self.store.raw_get(path)
    }
    fn files(&self) -> Vec<String> {
        self.store.paths()
    }
    fn shown(&self, path: &str) -> String {
        format!("mem:{path}")
    }
    fn budget(&self) -> Budget {
        Budget::MEM
    }
}

/// The suite on a local directory, and what only a real directory has: opening, reopening, bad roots,
/// the lock.
mod local {
    use super::common::manifest;
    use cutline_core::{CheckpointId, OperatorId, SubtaskIndex};
    use cutline_storage::{CheckpointStore, LocalDirStore, StorageError};

    conformance_suite!(super::LocalHarness::new);

    #[test]
    fn open_creates_the_root_and_a_reopened_store_sees_committed_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a/b/store");
        let store = LocalDirStore::open(&root).unwrap();
        assert!(root.join("checkpoints").is_dir());
        assert!(store.describe().contains(&root.display().to_string()));
        let a =
            store.write_task_state(CheckpointId(9), &OperatorId::new("op"), SubtaskIndex(0), 1, None, b"x").unwrap();
        store.commit_manifest(&manifest(9, vec![a])).unwrap();
        drop(store);
        let reopened = LocalDirStore::open(&root).unwrap();
        reopened.verify(CheckpointId(9)).unwrap();
        let names: Vec<String> =
            std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, vec!["checkpoints"], "open must leave no probe behind");
    }

    #[test]
    fn open_rejects_a_root_that_is_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        for root in [file.clone(), file.join("below")] {
            let err = LocalDirStore::open(&root).unwrap_err();
            assert!(matches!(err, StorageError::InvalidRoot { .. }), "{err}");
        }
    }

    #[test]
    fn a_local_store_is_held_by_one_job_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let a = LocalDirStore::open(dir.path()).unwrap();
        let b = LocalDirStore::open(dir.path()).unwrap();
        let held = a.lock().unwrap();
        let err = b.lock().expect_err("a second holder is refused");
        assert!(matches!(err, StorageError::Locked { .. }), "{err}");
        drop(held);
        b.lock().expect("free again once the first guard is dropped");
    }
}

/// The suite in memory, and the memory store's own test hooks.
mod mem {
    use super::common::{dir_of, manifest, write};
    use cutline_core::CheckpointId;
    use cutline_storage::{CheckpointStore, MemStore, StorageError};

    conformance_suite!(super::MemHarness::new);

    #[test]
    fn mem_store_corrupt_flips_a_byte() {
        let store = MemStore::new();
        let a = write(&store, 1, "op", 0, b"payload");
        store.commit_manifest(&manifest(1, vec![a.clone()])).unwrap();
        assert_eq!(store.paths(), vec![format!("{}/_MANIFEST", dir_of(1)), a.file.clone()]);
        store.corrupt(&a.file);
        assert!(matches!(store.verify(CheckpointId(1)), Err(StorageError::ChecksumMismatch { .. })));
    }
}
