//! Retention must not fail, nor delete anything of a retained checkpoint, when that checkpoint's
//! manifest is damaged: a restore skips it and may fall back to an older one.

use cutline_core::{CheckpointId, Generation, OperatorId, SubtaskIndex};
use cutline_storage::{CheckpointStore, Manifest, MemStore};

fn commit(store: &MemStore, id: u64) {
    let h =
        store.write_task_state(CheckpointId(id), &OperatorId::new("op"), SubtaskIndex(0), 1, None, b"state").unwrap();
    store.commit_manifest(&Manifest::new("job", CheckpointId(id), Generation(1), 0, false, vec![h])).unwrap();
}

#[test]
fn gc_keeps_a_retained_checkpoint_whose_manifest_is_damaged_whole() {
    let store = MemStore::new();
    for id in 1..=3 {
        commit(&store, id);
    }
    let manifest =
        store.paths().into_iter().find(|p| p.contains("00000000000000000003") && p.ends_with("_MANIFEST")).unwrap();
    store.corrupt(&manifest);
    store.gc(2, &[]).expect("a damaged manifest does not fail retention");
    let paths = store.paths();
    assert_eq!(paths.iter().filter(|p| p.contains("00000000000000000003")).count(), 2, "{paths:?}");
    assert!(paths.iter().any(|p| p.contains("00000000000000000002")), "the fallback stays: {paths:?}");
    assert!(!paths.iter().any(|p| p.contains("00000000000000000001")), "older ones go: {paths:?}");
    assert!(store.verify(CheckpointId(3)).is_err());
    store.verify(CheckpointId(2)).unwrap();
}

#[test]
fn a_local_store_is_held_by_one_job_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let a = cutline_storage::LocalDirStore::open(dir.path()).unwrap();
    let b = cutline_storage::LocalDirStore::open(dir.path()).unwrap();
    let held = a.lock().unwrap();
    let err = b.lock().expect_err("a second holder is refused");
    assert!(matches!(err, cutline_storage::StorageError::Locked { .. }), "{err}");
    drop(held);
    b.lock().expect("free again once the first guard is dropped");
}
