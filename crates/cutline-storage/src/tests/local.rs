//! What only a real directory has: opening, reopening, and bad roots.

use super::manifest;
use crate::{CheckpointStore, LocalDirStore, StorageError};
use cutline_core::{CheckpointId, OperatorId, SubtaskIndex};

#[test]
fn open_creates_the_root_and_a_reopened_store_sees_committed_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a/b/store");
    let store = LocalDirStore::open(&root).unwrap();
    assert!(root.join("checkpoints").is_dir());
    assert!(store.describe().contains(&root.display().to_string()));
    let a = store.write_task_state(CheckpointId(9), &OperatorId::new("op"), SubtaskIndex(0), 1, None, b"x").unwrap();
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
fn listing_survives_a_file_where_a_checkpoint_directory_belongs() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::open(dir.path()).unwrap();
    std::fs::write(dir.path().join("checkpoints/chk-00000000000000000003"), b"x").unwrap();
    assert_eq!(store.list_checkpoints().unwrap(), vec![]);
    store.gc(1, &[]).unwrap();
    assert!(store.read_manifest(CheckpointId(3)).is_err());
}
