//! The contract's panics: asserts on the caller's own arguments, never on what was read from storage.

use super::manifest;
use crate::{CheckpointStore, MemStore};
use cutline_core::{CheckpointId, OperatorId, SubtaskIndex};

#[test]
#[should_panic(expected = "may only reference acknowledged task state writes")]
fn commit_of_a_manifest_with_a_missing_file_panics() {
    let store = MemStore::new();
    let mut a =
        store.write_task_state(CheckpointId(1), &OperatorId::new("op"), SubtaskIndex(0), 2, None, b"x").unwrap();
    a.size_bytes += 1;
    let _ = store.commit_manifest(&manifest(1, vec![a]));
}

#[test]
#[should_panic(expected = "at least one")]
fn gc_must_retain_at_least_one_checkpoint() {
    let _ = MemStore::new().gc(0, &[]);
}
