//! Incremental checkpoints in the threaded runtime against a real state directory: a checkpoint
//! writes the keyed state that changed since the task's latest complete one and shares the files
//! before it; restores read the chain (also after falling back past a damaged newest checkpoint);
//! retention never removes a file a retained checkpoint builds on; the setting turns it off.

use cutline::{
    CheckpointStore, FaultPoint, Faults, GeneratorSource, Job, JobGraph, LocalDirStore, Manifest, MemoryTxnSink,
    MemoryTxnStore, RestartStrategy, RunConfig, RunError,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Keys that get state first, one record each; then only the few hot ones change (slowly, while
/// checkpoints are taken); then every key gets one more record, whose count shows whether its state
/// came through the restore.
const KEYS: u64 = 4_000;
const HOT: u64 = 3;
const HOT_RECORDS: u64 = 3_000;
const RECORDS: u64 = 2 * KEYS + HOT_RECORDS;

fn key(i: u64) -> u64 {
    match i {
        i if i < KEYS => i,
        i if i < KEYS + HOT_RECORDS => i % HOT,
        i => i - KEYS - HOT_RECORDS,
    }
}

/// source -> (slow map) -> keyed running count (parallelism 2) -> sink.
fn counting_job(out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let job = Job::new("incremental");
    job.source_with_parallelism("numbers", 1, GeneratorSource::new(RECORDS, |i| i))
        .map(|i: u64| {
            if (KEYS..KEYS + HOT_RECORDS).contains(&i) {
                std::thread::sleep(Duration::from_micros(100));
            }
            key(i)
        })
        .key_by(|k: &u64| *k)
        .parallelism(2)
        .aggregate("counts", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
        .sink_with_parallelism("out", 1, MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

fn expected() -> Vec<String> {
    let mut per_key: BTreeMap<u64, u64> = BTreeMap::new();
    for i in 0..RECORDS {
        *per_key.entry(key(i)).or_default() += 1;
    }
    let mut v: Vec<String> = per_key.iter().flat_map(|(k, n)| (1..=*n).map(move |c| format!("{k}:{c}"))).collect();
    v.sort();
    v
}

/// The committed output is the failure-free run's, each record once (a short message otherwise:
/// the output has thousands of records).
fn assert_exact(out: &Arc<Mutex<MemoryTxnStore>>) {
    let mut got = out.lock().unwrap().committed_records();
    got.sort();
    let want = expected();
    if got != want {
        let first = got.iter().zip(&want).position(|(g, w)| g != w).unwrap_or(got.len().min(want.len()));
        panic!(
            "{} records committed, {} expected; first difference at {first}: {:?} where {:?} was expected",
            got.len(),
            want.len(),
            got.get(first),
            want.get(first)
        );
    }
}

fn config(dir: &Path, incremental: bool) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), "incremental-v1");
    cfg.checkpoint.interval_ms = Some(20);
    cfg.batch_size = 16;
    cfg.retain = 3;
    cfg.incremental_checkpoints = incremental;
    cfg
}

/// Fails the `n`-th sink commit; with no restarts allowed, the run stops there with checkpoints on
/// disk.
fn crash_at_commit(cfg: &mut RunConfig, n: u64) {
    let count = Arc::new(AtomicU64::new(0));
    cfg.faults = Faults::new(move |p| p == FaultPoint::SinkCommit && count.fetch_add(1, Ordering::SeqCst) + 1 == n);
    cfg.restart = RestartStrategy::None;
}

/// Every complete checkpoint's manifest, oldest first; each verifies (its chains included).
fn manifests(dir: &Path) -> Vec<Manifest> {
    let store = LocalDirStore::open(dir).unwrap();
    let complete = store.list_checkpoints().unwrap().into_iter().filter(|l| l.complete);
    complete.map(|l| store.verify(l.id).expect("a retained checkpoint verifies, its chains included")).collect()
}

/// Runs until the `n`-th sink commit fails, then checks the retained checkpoints.
fn run_until_crash(dir: &Path, out: &Arc<Mutex<MemoryTxnStore>>, incremental: bool, n: u64) -> Vec<Manifest> {
    let mut cfg = config(dir, incremental);
    crash_at_commit(&mut cfg, n);
    let err = cutline::run(&counting_job(out.clone()), cfg).expect_err("the injected failure stops the run");
    assert!(matches!(err, RunError::GaveUp { .. }), "{err}");
    manifests(dir)
}

fn keyed_handles(m: &Manifest) -> impl Iterator<Item = &cutline::TaskStateHandle> {
    m.tasks.iter().filter(|t| t.operator.as_str() == "counts")
}

#[test]
fn a_checkpoint_writes_what_changed_on_top_of_shared_files_and_restores_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let retained = run_until_crash(dir.path(), &out, true, 12);
    let latest = retained.last().expect("a complete checkpoint");
    // Once every key has state, a checkpoint holds the few hot keys only: far smaller than the
    // whole file at the start of its chain, which it shares.
    let chained: Vec<_> = keyed_handles(latest).filter(|h| !h.base.is_empty()).collect();
    assert!(!chained.is_empty(), "the latest checkpoint {} is whole: {:?}", latest.checkpoint, latest.tasks);
    for h in &chained {
        let whole = &h.base[0];
        assert!(
            h.size_bytes * 8 < whole.size_bytes,
            "{} bytes on top of a whole file of {}",
            h.size_bytes,
            whole.size_bytes
        );
        assert!(whole.checkpoint < latest.checkpoint && whole.file.contains(&format!("{:020}", whole.checkpoint.0)));
    }
    assert!(latest.full_size_bytes() > 4 * latest.total_size_bytes());

    let report = cutline::run(&counting_job(out.clone()), config(dir.path(), true)).expect("restores");
    assert_eq!(report.restored_from, Some(latest.checkpoint));
    assert_exact(&out);
}

#[test]
fn with_incremental_checkpoints_off_every_checkpoint_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let retained = run_until_crash(dir.path(), &out, false, 12);
    assert!(retained.iter().flat_map(|m| &m.tasks).all(|t| t.base.is_empty()), "{retained:?}");
    cutline::run(&counting_job(out.clone()), config(dir.path(), false)).expect("restores");
    assert_exact(&out);
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_an_older_one_that_shares_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let retained = run_until_crash(dir.path(), &out, true, 12);
    let [.., previous, latest] = &retained[..] else { panic!("two complete checkpoints: {retained:?}") };
    // The previous checkpoint builds on files the damaged one shares: the fallback reads them.
    let own: Vec<&str> = latest.tasks.iter().map(|t| t.file.as_str()).collect();
    let shared =
        keyed_handles(previous).flat_map(|t| &t.base).filter(|b| keyed_handles(latest).any(|l| l.base.contains(b)));
    assert!(shared.count() > 0, "{previous:?} and {latest:?} share no file");
    let damaged = dir.path().join(own.iter().find(|f| f.contains("counts")).expect("a keyed file of its own"));
    let mut bytes = std::fs::read(&damaged).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&damaged, bytes).unwrap();

    let report = cutline::run(&counting_job(out.clone()), config(dir.path(), true)).expect("falls back");
    assert_eq!(report.restored_from, Some(previous.checkpoint));
    assert_exact(&out);
}
