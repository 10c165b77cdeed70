//! Fencing of an older coordinator: once a newer generation is recorded in checkpoint storage (a new
//! coordinator took over, for example after a partition), the old coordinator commits no further
//! manifest, tells no sink to commit, and stops with an error that says why.

use cutline::GenerationRecord;
use cutline::{CheckpointStore, Generation, GeneratorSource, Job, LocalDirStore, MemoryTxnSink, MemoryTxnStore};
use cutline::{RunConfig, RunError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn a_coordinator_superseded_by_a_newer_generation_stops_without_committing_more() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalDirStore::open(dir.path()).unwrap());
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new("fenced");
    job.source("numbers", GeneratorSource::new(2_000_000, |i| i % 7))
        .map(|k: u64| {
            std::thread::sleep(Duration::from_micros(5));
            k
        })
        .key_by(|k: &u64| *k)
        .aggregate("count", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
        .sink("out", MemoryTxnSink::new(out.clone()));
    let mut cfg = RunConfig::new(store.clone(), "fenced-v1");
    cfg.checkpoint.interval_ms = Some(10);
    cfg.batch_size = 64;
    let handle = cutline::spawn(job.build().unwrap(), cfg);
    // Let it complete a few checkpoints.
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.latest_complete().unwrap().is_none_or(|c| c.0 < 3) {
        assert!(Instant::now() < deadline, "no checkpoints");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A newer coordinator takes over: it restored the latest complete checkpoint it saw.
    let restored = store.latest_complete().unwrap();
    let current = store.latest_generation().unwrap().expect("the running job recorded its generation");
    store
        .claim_generation(&GenerationRecord {
            job_fingerprint: "fenced-v1".into(),
            generation: Generation(current.generation.0 + 10),
            restored,
            created_unix_ms: 0,
            owner: "the test".into(),
        })
        .unwrap();
    let committed_then = out.lock().unwrap().committed_records().len();
    let err = handle.join().expect_err("the old coordinator must stop");
    assert!(matches!(err, RunError::Superseded(_)), "{err}");
    assert!(err.to_string().contains("newer coordinator"), "{err}");
    // Nothing the old generation completed after the takeover counts.
    assert_eq!(store.latest_complete().unwrap(), restored, "a fenced manifest must never be the latest complete");
    // Its sinks committed at most what the checkpoint in flight at the takeover had already been
    // told (the manifest committed before the newer record appeared): no commit after the stop.
    let committed_after = out.lock().unwrap().committed_records().len();
    let c_then = committed_then;
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(out.lock().unwrap().committed_records().len(), committed_after, "commits after the job stopped");
    assert!(committed_after >= c_then);
}
