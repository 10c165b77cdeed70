//! Incremental checkpoints in the threaded runtime against a real state directory: a checkpoint
//! writes the keyed state that changed since the task's latest complete one and shares the files
//! before it; restores read the chain (also after falling back past a damaged newest checkpoint);
//! retention never removes a file a retained checkpoint builds on; the setting turns it off.
//!
//! A conformance suite of the state backends: every scenario runs with keyed state in memory and
//! (with feature `spill`) on disk behind a cache small enough to flush all the time; a checkpoint
//! written under one backend restores under the other, also at another parallelism.

use cutline::{
    CheckpointStore, FaultPoint, Faults, GeneratorSource, Job, JobGraph, LocalDirStore, Manifest, MemoryTxnSink,
    MemoryTxnStore, RestartStrategy, RunConfig, RunError, StateBackend,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Keys that get state first, one record each; then only the few hot ones change (slowly, while
/// checkpoints are taken), every tenth record of that phase deletes the state of a cold key
/// instead, and the record after it counts that key again (a checkpoint's changes then hold the key
/// both removed and written: written wins); then every key gets one more record, whose count shows
/// whether its state (or its deletion) came through the restore.
const KEYS: u64 = 4_000;
const HOT: u64 = 3;
const HOT_RECORDS: u64 = 3_000;
const RECORDS: u64 = 2 * KEYS + HOT_RECORDS;

/// Record `i`'s key, and whether it deletes the key's state rather than counting.
fn key(i: u64) -> (u64, bool) {
    match i {
        i if i < KEYS => (i, false),
        i if i < KEYS + HOT_RECORDS && i % 10 == 9 => (HOT + (i - KEYS) / 10, true),
        i if KEYS < i && i < KEYS + HOT_RECORDS && i % 10 == 0 => (HOT + (i - 1 - KEYS) / 10, false),
        i if i < KEYS + HOT_RECORDS => (i % HOT, false),
        i => (i - KEYS - HOT_RECORDS, false),
    }
}

/// Every backend of this build: memory, and disk behind a cache of 64 keys (a key in 60 per task)
/// under `dir`.
fn backends(dir: &Path) -> Vec<StateBackend> {
    let mut all = vec![StateBackend::Memory];
    if cfg!(feature = "spill") {
        all.push(StateBackend::Disk { dir: dir.join("local-state"), cache_entries: 64 });
    }
    all
}

/// source -> (slow map) -> keyed running count (parallelism 2) -> sink.
fn counting_job(out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    counting_job_at(out, 2)
}

fn counting_job_at(out: Arc<Mutex<MemoryTxnStore>>, parallelism: u32) -> JobGraph {
    let job = Job::new("incremental");
    job.source_with_parallelism("numbers", 1, GeneratorSource::new(RECORDS, |i| i))
        .map(|i: u64| {
            if (KEYS..KEYS + HOT_RECORDS).contains(&i) {
                std::thread::sleep(Duration::from_micros(100));
            }
            key(i)
        })
        .key_by(|r: &(u64, bool)| r.0)
        .parallelism(parallelism)
        .process("counts", |k, count: &mut Option<u64>, (_, delete): (u64, bool), out| {
            if delete {
                *count = None;
            } else {
                let c = count.get_or_insert(0);
                *c += 1;
                out.emit(format!("{k}:{c}"));
            }
        })
        .sink_with_parallelism("out", 1, MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

fn expected() -> Vec<String> {
    let mut per_key: BTreeMap<u64, u64> = BTreeMap::new();
    let mut v = Vec::new();
    for (k, delete) in (0..RECORDS).map(key) {
        if delete {
            per_key.remove(&k);
        } else {
            let c = per_key.entry(k).or_default();
            *c += 1;
            v.push(format!("{k}:{c}"));
        }
    }
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

fn config(dir: &Path, incremental: bool, backend: &StateBackend) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), "incremental-v1");
    cfg.state_backend = backend.clone();
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
fn run_until_crash(
    dir: &Path,
    out: &Arc<Mutex<MemoryTxnStore>>,
    (incremental, backend): (bool, &StateBackend),
    n: u64,
) -> Vec<Manifest> {
    let mut cfg = config(dir, incremental, backend);
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
    let scratch = tempfile::tempdir().unwrap();
    for backend in backends(scratch.path()) {
        a_checkpoint_writes_what_changed(&backend);
    }
}

fn a_checkpoint_writes_what_changed(backend: &StateBackend) {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let retained = run_until_crash(dir.path(), &out, (true, backend), 12);
    let latest = retained.last().expect("a complete checkpoint");
    // Once every key has state, a checkpoint holds the few hot keys only: far smaller than the
    // whole file at the start of its chain, which it shares.
    let chained: Vec<_> = keyed_handles(latest).filter(|h| !h.base.is_empty()).collect();
    assert!(
        !chained.is_empty(),
        "{backend:?}: the latest checkpoint {} is whole: {:?}",
        latest.checkpoint,
        latest.tasks
    );
    for h in &chained {
        let whole = &h.base[0];
        assert!(
            h.size_bytes * 8 < whole.size_bytes,
            "{backend:?}: {} bytes on top of a whole file of {}",
            h.size_bytes,
            whole.size_bytes
        );
        assert!(whole.checkpoint < latest.checkpoint && whole.file.contains(&format!("{:020}", whole.checkpoint.0)));
    }
    assert!(latest.full_size_bytes() > 4 * latest.total_size_bytes());

    let report = cutline::run(&counting_job(out.clone()), config(dir.path(), true, backend)).expect("restores");
    assert_eq!(report.restored_from, Some(latest.checkpoint));
    assert_exact(&out);
}

/// A restore reads each file of the restored checkpoint once: the verification that checks the
/// chains hands them to the restore, which reads nothing again (a file read twice is a second
/// copy of large state in memory, and twice the time).
#[test]
fn a_restore_reads_each_file_of_its_chains_once() {
    let scratch = tempfile::tempdir().unwrap();
    for backend in backends(scratch.path()) {
        let store = Arc::new(cutline::MemStore::new());
        let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let on = |store: &Arc<cutline::MemStore>| {
            let mut cfg = config(scratch.path(), true, &backend);
            cfg.store = store.clone();
            cfg
        };
        let mut cfg = on(&store);
        crash_at_commit(&mut cfg, 12);
        cutline::run(&counting_job(out.clone()), cfg).expect_err("the injected failure stops the run");
        let latest = store.latest_complete().unwrap().expect("a complete checkpoint");
        let manifest = store.read_manifest(latest).unwrap();
        let files: Vec<String> =
            manifest.tasks.iter().flat_map(|t| t.base.iter().map(|b| b.file.clone()).chain([t.file.clone()])).collect();
        assert!(keyed_handles(&manifest).any(|h| !h.base.is_empty()), "{backend:?}: no chain to read");
        store.take_reads();
        let report = cutline::run(&counting_job(out.clone()), on(&store)).expect("restores");
        assert_eq!(report.restored_from, Some(latest));
        let reads = store.take_reads();
        for f in &files {
            assert_eq!(reads.get(f).copied().unwrap_or(0), 1, "{backend:?}: {f} read that many times at the restore");
        }
        assert_exact(&out);
    }
}

#[test]
fn with_incremental_checkpoints_off_every_checkpoint_is_whole() {
    let scratch = tempfile::tempdir().unwrap();
    for backend in backends(scratch.path()) {
        let dir = tempfile::tempdir().unwrap();
        let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let retained = run_until_crash(dir.path(), &out, (false, &backend), 12);
        assert!(retained.iter().flat_map(|m| &m.tasks).all(|t| t.base.is_empty()), "{backend:?}: {retained:?}");
        cutline::run(&counting_job(out.clone()), config(dir.path(), false, &backend)).expect("restores");
        assert_exact(&out);
    }
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_an_older_one_that_shares_its_files() {
    let scratch = tempfile::tempdir().unwrap();
    for backend in backends(scratch.path()) {
        falls_back_past_a_damaged_checkpoint(&backend);
    }
}

fn falls_back_past_a_damaged_checkpoint(backend: &StateBackend) {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let retained = run_until_crash(dir.path(), &out, (true, backend), 12);
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

    let report = cutline::run(&counting_job(out.clone()), config(dir.path(), true, backend)).expect("falls back");
    assert_eq!(report.restored_from, Some(previous.checkpoint));
    assert_exact(&out);
}

#[test]
fn a_checkpoint_written_under_one_backend_restores_under_the_other_also_rescaled() {
    let scratch = tempfile::tempdir().unwrap();
    let all = backends(scratch.path());
    if all.len() < 2 {
        return; // one backend in this build
    }
    for (from, to, parallelism) in
        [(&all[0], &all[1], 2), (&all[1], &all[0], 2), (&all[0], &all[1], 3), (&all[1], &all[1], 1)]
    {
        let dir = tempfile::tempdir().unwrap();
        let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let retained = run_until_crash(dir.path(), &out, (true, from), 12);
        let latest = retained.last().expect("a complete checkpoint");
        let report = cutline::run(&counting_job_at(out.clone(), parallelism), config(dir.path(), true, to))
            .unwrap_or_else(|e| panic!("{from:?} to {to:?} at parallelism {parallelism}: {e}"));
        assert_eq!(report.restored_from, Some(latest.checkpoint));
        assert_exact(&out);
    }
    let left: Vec<_> = std::fs::read_dir(scratch.path().join("local-state")).unwrap().collect();
    assert!(left.is_empty(), "the disk backend's stores outlived their tasks: {left:?}");
}

#[test]
fn a_disk_backend_that_cannot_create_its_directory_fails_the_run_naming_it() {
    if !cfg!(feature = "spill") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let blocked = dir.path().join("a-file");
    std::fs::write(&blocked, b"in the way").unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let backend = StateBackend::Disk { dir: blocked.join("state"), cache_entries: 64 };
    let mut cfg = config(&dir.path().join("checkpoints"), true, &backend);
    cfg.restart = RestartStrategy::None;
    let err = cutline::run(&counting_job(out), cfg).expect_err("no store can be created").to_string();
    assert!(err.contains("local state store") && err.contains("a-file"), "{err}");
}
