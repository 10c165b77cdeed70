//! Failure injection: a failed operation leaves the wrapped store exactly as it was.

use super::manifest;
use crate::{CheckpointStore, FaultyStore, GenerationRecord, JobMeta, MemStore, StorageError, StoreOp};
use cutline_core::{CheckpointId, Generation, OperatorId, SubtaskIndex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

fn snapshot(store: &MemStore) -> Vec<(String, Vec<u8>)> {
    store
        .paths()
        .into_iter()
        .map(|p| {
            let bytes = store.raw_get(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

fn write(s: &dyn CheckpointStore, id: u64, sub: u32) -> Result<crate::TaskStateHandle, StorageError> {
    s.write_task_state(CheckpointId(id), &OperatorId::new("op"), SubtaskIndex(sub), 2, None, b"state")
}

/// Checkpoint 1 complete, attempt 2 written but not committed, a leftover temp file, job meta.
fn prepared() -> MemStore {
    let store = MemStore::new();
    let a = write(&store, 1, 0).unwrap();
    store.commit_manifest(&manifest(1, vec![a])).unwrap();
    write(&store, 2, 0).unwrap();
    store.raw_put(".FINISHED.1-1.tmp", b"leftover");
    let meta = JobMeta { job_fingerprint: "fp".into(), generation: Generation(1), epoch_lease_end: CheckpointId(10) };
    store.write_meta(&meta).unwrap();
    store
}

#[test]
fn injected_failures_leave_the_inner_store_unchanged() {
    type Action = fn(&dyn CheckpointStore) -> Result<(), StorageError>;
    let actions: Vec<(StoreOp, Action)> = vec![
        (StoreOp::WriteTaskState { checkpoint: CheckpointId(2) }, |s| write(s, 2, 1).map(drop)),
        (StoreOp::CommitManifest { checkpoint: CheckpointId(2) }, |s| {
            let handle = s.read_manifest(CheckpointId(1))?.tasks[0].clone();
            s.commit_manifest(&manifest(2, vec![handle]))
        }),
        (StoreOp::Discard { checkpoint: CheckpointId(2) }, |s| s.discard(CheckpointId(2))),
        (StoreOp::Gc, |s| s.gc(1, &[]).map(drop)),
        (StoreOp::WriteMeta, |s| {
            s.write_meta(&JobMeta {
                job_fingerprint: "fp".into(),
                generation: Generation(2),
                epoch_lease_end: CheckpointId(20),
            })
        }),
        (StoreOp::MarkFinished, |s| s.mark_finished(CheckpointId(1))),
        (StoreOp::ClaimGeneration { generation: Generation(2) }, |s| s.claim_generation(&claim(2))),
    ];
    for (op, action) in actions {
        let faulty = FaultyStore::new(prepared(), move |asked| asked == op);
        let before = snapshot(faulty.inner());
        let err = action(&faulty).unwrap_err();
        assert!(matches!(err, StorageError::Injected(_)), "{op:?}: {err}");
        assert!(err.is_transient());
        assert_eq!(snapshot(faulty.inner()), before, "{op:?} changed the store");
        // Without the fault the same action goes through and changes the store.
        let inner = faulty.into_inner();
        action(&inner).unwrap();
        assert_ne!(snapshot(&inner), before, "{op:?} should change the store");
    }
}

fn claim(generation: u64) -> GenerationRecord {
    GenerationRecord {
        job_fingerprint: "fp".into(),
        generation: Generation(generation),
        restored: Some(CheckpointId(1)),
        created_unix_ms: 5,
        owner: "drill".into(),
    }
}

#[test]
fn claim_failing_after_the_write_is_claimed_anyway() {
    let faulty = FaultyStore::new(prepared(), |op| matches!(op, StoreOp::ClaimGenerationAfterWrite { .. }));
    assert!(matches!(faulty.claim_generation(&claim(2)), Err(StorageError::Injected(_))));
    // The caller could not tell, but the store knows: the generation is taken (by this very record).
    assert_eq!(faulty.inner().latest_generation().unwrap(), Some(claim(2)));
    assert!(matches!(
        faulty.claim_generation(&claim(2)),
        Err(StorageError::GenerationTaken { generation: Generation(2), .. })
    ));
}

#[test]
fn commit_failing_after_the_write_is_committed_anyway() {
    let faulty = FaultyStore::new(prepared(), |op| matches!(op, StoreOp::CommitManifestAfterWrite { .. }));
    let handle = faulty.read_manifest(CheckpointId(1)).unwrap().tasks[0].clone();
    let m = manifest(2, vec![handle]);
    assert!(matches!(faulty.commit_manifest(&m), Err(StorageError::Injected(_))));
    // The caller could not tell, but the store knows: the checkpoint is complete.
    assert_eq!(faulty.inner().read_manifest(CheckpointId(2)).unwrap(), m);
    assert!(matches!(faulty.commit_manifest(&m), Err(StorageError::ManifestExists(CheckpointId(2)))));
}

#[test]
fn policy_is_asked_about_write_like_ops_only() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let faulty = FaultyStore::new(MemStore::new(), move |op| {
        log.lock().unwrap().push(op);
        false
    });
    let a = write(&faulty, 3, 0).unwrap();
    faulty.read_task_state(&a).unwrap();
    faulty.commit_manifest(&manifest(3, vec![a])).unwrap();
    faulty.verify(CheckpointId(3)).unwrap();
    faulty.list_checkpoints().unwrap();
    faulty.mark_finished(CheckpointId(3)).unwrap();
    faulty.finished().unwrap();
    faulty.gc(1, &[]).unwrap();
    faulty.claim_generation(&claim(4)).unwrap();
    faulty.generations().unwrap();
    faulty.latest_generation().unwrap();
    faulty.check_not_fenced(Generation(4)).unwrap();
    let c = CheckpointId(3);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            StoreOp::WriteTaskState { checkpoint: c },
            StoreOp::CommitManifest { checkpoint: c },
            StoreOp::CommitManifestAfterWrite { checkpoint: c },
            StoreOp::MarkFinished,
            StoreOp::Gc,
            StoreOp::ClaimGeneration { generation: Generation(4) },
            StoreOp::ClaimGenerationAfterWrite { generation: Generation(4) },
        ]
    );
    assert!(faulty.describe().contains("injected"));
}

#[test]
fn transient_injected_failures_succeed_on_retry() {
    let failures_left = AtomicUsize::new(2);
    let faulty = FaultyStore::new(MemStore::new(), move |_| {
        failures_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    });
    let mut attempts = 0;
    let handle = loop {
        attempts += 1;
        match write(&faulty, 1, 0) {
            Ok(handle) => break handle,
            Err(e) if e.is_transient() => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(attempts, 3);
    assert_eq!(faulty.read_task_state(&handle).unwrap(), b"state");
}

#[test]
fn faulty_store_works_as_a_shared_trait_object() {
    let other = MemStore::new();
    let faulty: Arc<dyn CheckpointStore> = Arc::new(FaultyStore::new(MemStore::new(), |_| false));
    let a = write(faulty.as_ref(), 1, 0).unwrap();
    faulty.commit_manifest(&manifest(1, vec![a])).unwrap();
    assert_eq!(faulty.latest_complete().unwrap(), Some(CheckpointId(1)));
    assert_eq!(other.latest_complete().unwrap(), None);
}
