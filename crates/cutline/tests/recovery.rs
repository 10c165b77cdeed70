//! Recovery scenarios of the threaded runtime against a real state directory: falling back from a
//! corrupt checkpoint, refusing state that no longer fits the job, and restoring keyed state at another
//! parallelism.

use cutline::CheckpointStore;
use cutline::{
    FaultPoint, Faults, GeneratorSource, Job, JobGraph, LocalDirStore, MemoryTxnSink, MemoryTxnStore, RestartStrategy,
    RunConfig, RunError,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const RECORDS: u64 = 3000;
const KEYS: u64 = 13;

/// source -> (slow map) -> keyed running count with `keyed_parallelism` -> sink of parallelism 1.
fn counting_job(keyed_uid: &str, keyed_parallelism: u32, out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let job = Job::new("counting");
    job.source_with_parallelism("numbers", 1, GeneratorSource::new(RECORDS, |i| i % KEYS))
        .map(|k: u64| {
            std::thread::sleep(Duration::from_micros(20));
            k
        })
        .key_by(|k: &u64| *k)
        .parallelism(keyed_parallelism)
        .aggregate(keyed_uid, || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
        .sink_with_parallelism("out", 1, MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

fn expected() -> Vec<String> {
    let mut per_key: BTreeMap<u64, u64> = BTreeMap::new();
    for i in 0..RECORDS {
        *per_key.entry(i % KEYS).or_default() += 1;
    }
    let mut v: Vec<String> = per_key.iter().flat_map(|(k, n)| (1..=*n).map(move |c| format!("{k}:{c}"))).collect();
    v.sort();
    v
}

fn committed(out: &Arc<Mutex<MemoryTxnStore>>) -> Vec<String> {
    let mut v = out.lock().unwrap().committed_records();
    v.sort();
    v
}

fn config(dir: &std::path::Path) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), "counting-v1");
    cfg.checkpoint.interval_ms = Some(5);
    cfg.batch_size = 16;
    cfg
}

/// Fails the `n`-th sink commit; with no restarts allowed, the run stops there with checkpoints on disk.
fn crash_at_commit(cfg: &mut RunConfig, n: u64) {
    let count = Arc::new(AtomicU64::new(0));
    cfg.faults = Faults::new(move |p| p == FaultPoint::SinkCommit && count.fetch_add(1, Ordering::SeqCst) + 1 == n);
    cfg.restart = RestartStrategy::None;
}

fn flip_a_byte_of_the_latest_state_file(dir: &std::path::Path) -> u64 {
    let ckpts = dir.join("checkpoints");
    let mut complete: Vec<_> = std::fs::read_dir(&ckpts)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("_MANIFEST").exists())
        .collect();
    complete.sort();
    let latest = complete.last().expect("a complete checkpoint").clone();
    let state = std::fs::read_dir(&latest)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "state"))
        .unwrap();
    let mut bytes = std::fs::read(&state).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&state, bytes).unwrap();
    latest.file_name().unwrap().to_string_lossy().trim_start_matches("chk-").parse().unwrap()
}

#[test]
fn a_corrupt_latest_checkpoint_falls_back_to_the_previous_one_and_output_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let graph = counting_job("counts", 2, out.clone());
    let mut cfg = config(dir.path());
    crash_at_commit(&mut cfg, 4);
    let err = cutline::run(&graph, cfg).expect_err("the injected failure stops the run");
    assert!(matches!(err, RunError::GaveUp { .. }), "{err}");
    let corrupted = flip_a_byte_of_the_latest_state_file(dir.path());

    let report = cutline::run(&graph, config(dir.path())).expect("restores an older checkpoint");
    let restored = report.restored_from.expect("restored from a checkpoint").0;
    assert!(restored < corrupted, "restored {restored}, which is not older than the corrupt {corrupted}");
    assert_eq!(committed(&out), expected());
}

/// Fails once, at the first batch after the `n`-th sink commit (so committed output exists), and does
/// not restart.
fn crash_late(cfg: &mut RunConfig, n: u64) {
    let commits = Arc::new(AtomicU64::new(0));
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    cfg.faults = Faults::new(move |p| match p {
        FaultPoint::SinkCommit => {
            commits.fetch_add(1, Ordering::SeqCst);
            false
        }
        FaultPoint::ProcessBatch => commits.load(Ordering::SeqCst) >= n && !fired.swap(true, Ordering::SeqCst),
        _ => false,
    });
    cfg.restart = RestartStrategy::None;
}

/// Run `graph` on `dir` in `mode` until it fails once after the third sink commit (so committed output
/// exists), without restarting.
fn run_until_a_crash_after_commits(graph: &JobGraph, dir: &std::path::Path, mode: cutline::CheckpointMode) {
    let mut cfg = config(dir);
    cfg.checkpoint.mode = mode;
    crash_late(&mut cfg, 3);
    cutline::run(graph, cfg).expect_err("stopped by the injected failure");
}

#[test]
fn falling_back_past_committed_output_is_refused_in_exactly_once_mode() {
    // The latest checkpoint's output is already committed when its files turn out damaged: restoring the
    // previous one would commit that output twice.
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let graph = counting_job("counts", 2, out.clone());
    run_until_a_crash_after_commits(&graph, dir.path(), cutline::CheckpointMode::ExactlyOnce);
    flip_a_byte_of_the_latest_state_file(dir.path());
    let before = committed(&out);
    let err = cutline::run(&graph, config(dir.path())).expect_err("must refuse to duplicate committed output");
    assert!(err.to_string().contains("commit that output twice"), "{err}");
    assert_eq!(committed(&out), before, "nothing more was committed");
}

#[test]
fn falling_back_in_at_least_once_mode_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let graph = counting_job("counts", 2, out.clone());
    run_until_a_crash_after_commits(&graph, dir.path(), cutline::CheckpointMode::AtLeastOnce);
    flip_a_byte_of_the_latest_state_file(dir.path());
    let mut again = config(dir.path());
    again.checkpoint.mode = cutline::CheckpointMode::AtLeastOnce;
    cutline::run(&graph, again).expect("falls back, accepting duplicates");
    let got: std::collections::BTreeSet<String> = committed(&out).into_iter().collect();
    assert!(expected().iter().all(|e| got.contains(e)), "a record of the failure-free run is missing");
}

#[test]
fn state_of_an_operator_the_job_no_longer_has_is_refused_and_nothing_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let mut cfg = config(dir.path());
    crash_at_commit(&mut cfg, 3);
    cutline::run(&counting_job("counts", 2, out.clone()), cfg).expect_err("stopped by the injected failure");
    let before = complete_checkpoint_files(dir.path());

    let err = cutline::run(&counting_job("renamed-counts", 2, out), config(dir.path())).expect_err("must refuse");
    let msg = err.to_string();
    assert!(msg.contains("\"counts\""), "the message names the missing operator: {msg}");
    // Partial attempts of the crashed run are garbage and may go; no complete checkpoint may.
    assert_eq!(complete_checkpoint_files(dir.path()), before);
}

#[test]
fn keyed_state_restores_at_a_higher_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let mut cfg = config(dir.path());
    crash_at_commit(&mut cfg, 4);
    cutline::run(&counting_job("counts", 2, out.clone()), cfg).expect_err("stopped by the injected failure");
    let report = cutline::run(&counting_job("counts", 3, out.clone()), config(dir.path())).expect("rescaled restore");
    assert!(report.restored_from.is_some());
    assert_eq!(committed(&out), expected());
}

/// Every file of every complete checkpoint (a directory with a manifest).
fn complete_checkpoint_files(dir: &std::path::Path) -> Vec<String> {
    walk(dir)
        .into_iter()
        .filter(|p| {
            let parent = std::path::Path::new(p).parent().unwrap();
            parent.to_string_lossy().contains("chk-") && parent.join("_MANIFEST").exists()
        })
        .collect()
}

/// Wait (at most 10 s) until `cond` holds; the machine may be loaded, so no fixed sleep.
fn wait_for(cond: impl Fn() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < until, "condition not reached in 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(walk(&p));
        } else {
            v.push(p.to_string_lossy().into_owned());
        }
    }
    v.sort();
    v
}

/// One failure at the n-th passage through one fault point, then restore: the table of every protocol
/// step a task goes through. Each row must end with the failure-free output.
#[test]
fn one_failure_at_every_protocol_step_then_restore_gives_exact_output() {
    let points = [
        FaultPoint::ProcessBatch,
        FaultPoint::Snapshot,
        FaultPoint::SnapshotWrite,
        FaultPoint::SinkPrepare,
        FaultPoint::SinkCommit,
        FaultPoint::SinkCommitMidway,
        FaultPoint::SinkRecover,
    ];
    for point in points {
        for nth in [1u64, 2, 4] {
            let dir = tempfile::tempdir().unwrap();
            let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
            let graph = counting_job("counts", 2, out.clone());
            let mut cfg = config(dir.path());
            let count = Arc::new(AtomicU64::new(0));
            let fired = Arc::new(AtomicU64::new(0));
            let (c2, f2) = (count.clone(), fired.clone());
            cfg.faults = Faults::new(move |p| {
                let hit = p == point && c2.fetch_add(1, Ordering::SeqCst) + 1 == nth;
                if hit {
                    f2.fetch_add(1, Ordering::SeqCst);
                }
                hit
            });
            cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 };
            let report = cutline::run(&graph, cfg).unwrap_or_else(|e| panic!("failure at {point:?} #{nth}: {e}"));
            assert_eq!(committed(&out), expected(), "failure at {point:?} #{nth}: output differs");
            let fired = fired.load(Ordering::SeqCst);
            // SinkRecover runs once per sink task and deploy, so a high `nth` may never be reached; every
            // other point is passed many times.
            if fired == 1 && point == FaultPoint::SnapshotWrite {
                // A failed state write declines the checkpoint: it is aborted, the job keeps running.
                assert_eq!((report.restarts, report.checkpoints_failed), (0, 1), "failure at {point:?} #{nth}");
            } else if fired == 1 {
                assert_eq!(report.restarts, 1, "failure at {point:?} #{nth}: one failure, one restart");
            } else {
                assert_eq!(point, FaultPoint::SinkRecover, "failure at {point:?} #{nth} never fired");
            }
        }
    }
}

/// A sink whose commit is slow and which records when its last commit ended.
#[derive(Clone)]
struct SlowCommitSink {
    last_commit_end: Arc<Mutex<Option<std::time::Instant>>>,
}

impl cutline::Sink<String> for SlowCommitSink {
    type Committable = u64;
    fn open(&mut self, _ctx: &cutline::SinkContext) -> cutline::ConnectorResult<()> {
        Ok(())
    }
    fn recover(&mut self, _to_commit: &[u64]) -> cutline::ConnectorResult<()> {
        Ok(())
    }
    fn write(&mut self, _item: String) -> cutline::ConnectorResult<()> {
        Ok(())
    }
    fn prepare(&mut self, checkpoint: cutline::CheckpointId) -> cutline::ConnectorResult<Option<u64>> {
        Ok(Some(checkpoint.0))
    }
    fn commit(&mut self, _c: &[u64]) -> cutline::ConnectorResult<()> {
        std::thread::sleep(Duration::from_millis(150));
        *self.last_commit_end.lock().unwrap() = Some(std::time::Instant::now());
        Ok(())
    }
}

#[test]
fn a_fatal_error_mid_run_stops_and_joins_every_thread_before_run_returns() {
    // The fatal error: a newer coordinator takes the job over (a generation record appears), so this
    // one stops at its next manifest commit, while a slow sink commit may be running.
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalDirStore::open(dir.path()).unwrap());
    let last = Arc::new(Mutex::new(None));
    let job = Job::new("slow");
    job.source_with_parallelism("numbers", 1, GeneratorSource::new(RECORDS * 100, |i| i % KEYS))
        .map(|k: u64| {
            std::thread::sleep(Duration::from_micros(20));
            k.to_string()
        })
        .sink("slow", SlowCommitSink { last_commit_end: last.clone() });
    let graph = job.build().unwrap();
    let mut cfg = RunConfig::new(store.clone(), "slow-v1");
    cfg.checkpoint.interval_ms = Some(5);
    let handle = cutline::spawn(graph, cfg);
    wait_for(|| store.latest_complete().unwrap().is_some_and(|c| c.0 >= 2));
    let current = store.latest_generation().unwrap().expect("the run recorded its generation");
    store
        .claim_generation(&cutline::GenerationRecord {
            job_fingerprint: "slow-v1".into(),
            generation: cutline::Generation(current.generation.0 + 10),
            restored: store.latest_complete().unwrap(),
            created_unix_ms: 0,
            owner: "the test".into(),
        })
        .unwrap();
    let err = handle.join().expect_err("the superseded run stops");
    let returned = std::time::Instant::now();
    assert!(matches!(err, RunError::Superseded(_)), "{err}");
    std::thread::sleep(Duration::from_millis(400));
    let end = last.lock().unwrap().expect("some commit ran");
    assert!(end <= returned, "a sink was still committing after run() returned");
}

#[test]
fn a_failed_retention_pass_does_not_stop_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let gcs = Arc::new(AtomicU64::new(0));
    let g2 = gcs.clone();
    let store = cutline_storage::FaultyStore::new(LocalDirStore::open(dir.path()).unwrap(), move |op| {
        op == cutline_storage::StoreOp::Gc && g2.fetch_add(1, Ordering::SeqCst) % 2 == 1
    });
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let graph = counting_job("counts", 2, out.clone());
    let mut cfg = RunConfig::new(Arc::new(store), "counting-v1");
    cfg.checkpoint.interval_ms = Some(5);
    cfg.batch_size = 16;
    let report = cutline::run(&graph, cfg).expect("retention failures are not fatal");
    assert!(gcs.load(Ordering::SeqCst) >= 4, "retention ran and failed several times");
    assert!(report.checkpoints_completed >= 2);
    assert_eq!(committed(&out), expected());
}

/// A state value whose serialisation panics.
#[derive(Clone, serde::Deserialize)]
struct Explosive(#[allow(dead_code)] u64); // the value only travels through serde

impl serde::Serialize for Explosive {
    fn serialize<S: serde::Serializer>(&self, _s: S) -> Result<S::Ok, S::Error> {
        panic!("this state cannot be serialised")
    }
}

#[test]
fn a_panicking_state_serializer_declines_checkpoints_at_once_instead_of_timing_out() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new("explosive");
    job.source_with_parallelism("numbers", 1, GeneratorSource::new(RECORDS, |i| i % KEYS))
        .map(|k: u64| {
            std::thread::sleep(Duration::from_micros(20));
            k
        })
        .key_by(|k: &u64| *k)
        .process("boom", |_k: &u64, s: &mut Option<Explosive>, v: u64, o: &mut cutline::Output<String>| {
            *s = Some(Explosive(v));
            o.emit(v.to_string());
        })
        .sink("out", MemoryTxnSink::new(out));
    let graph = job.build().unwrap();
    let mut cfg = config(dir.path());
    cfg.restart = RestartStrategy::None;
    cfg.checkpoint.tolerable_failures = 0;
    let start = std::time::Instant::now();
    let err = cutline::run(&graph, cfg).expect_err("no checkpoint can succeed");
    assert!(matches!(err, RunError::GaveUp { .. }), "{err}");
    // The default checkpoint timeout is 60 s; a dead writer would only be noticed then.
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
}

#[test]
fn a_spawned_job_takes_new_checkpoint_settings_stops_on_request_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let graph = counting_job("counts", 2, out.clone());
    let mut cfg = config(dir.path());
    cfg.checkpoint.interval_ms = None; // no periodic checkpoints until the settings change
    let handle = cutline::spawn(graph.clone(), cfg.clone());
    let mut bad = cfg.checkpoint.clone();
    bad.max_concurrent = 0;
    assert!(handle.set_checkpoint_config(bad).is_err(), "invalid settings are refused");
    let mut every_5ms = cfg.checkpoint.clone();
    every_5ms.interval_ms = Some(5);
    handle.set_checkpoint_config(every_5ms).unwrap();
    wait_for(|| {
        std::fs::read_dir(dir.path().join("checkpoints"))
            .is_ok_and(|mut d| d.any(|e| e.unwrap().path().join("_MANIFEST").exists()))
    });
    handle.stop();
    let report = handle.join().unwrap();
    assert!(report.stopped, "the run reports it was stopped");
    assert!(!report.checkpoints.is_empty(), "the new interval took effect: {report:?}");
    assert!(report.final_checkpoint.is_none());
    // Run it again on the same store: it resumes and ends with exactly the failure-free output.
    let again = cutline::run(&graph, config(dir.path())).unwrap();
    assert!(again.restored_from.is_some());
    assert_eq!(committed(&out), expected());
}

/// The counting job with a sink of parallelism 2.
fn counting_job_two_sinks(out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let job = Job::new("counting");
    job.source_with_parallelism("numbers", 1, GeneratorSource::new(RECORDS, |i| i % KEYS))
        .map(|k: u64| {
            std::thread::sleep(Duration::from_micros(20));
            k
        })
        .key_by(|k: &u64| *k)
        .parallelism(2)
        .aggregate("counts", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
        .sink_with_parallelism("out", 2, MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

fn latest_complete_dir(dir: &std::path::Path) -> std::path::PathBuf {
    let mut complete: Vec<_> = std::fs::read_dir(dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("_MANIFEST").exists())
        .collect();
    complete.sort();
    complete.pop().expect("a complete checkpoint")
}

#[test]
fn a_deleted_latest_checkpoint_is_not_a_licence_to_commit_output_twice_regression_deleted() {
    // The operator deleted the damaged checkpoint the refusal pointed at; the restore then fell back
    // silently and committed its output again.
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let graph = counting_job("counts", 2, out.clone());
    run_until_a_crash_after_commits(&graph, dir.path(), cutline::CheckpointMode::ExactlyOnce);
    std::fs::remove_dir_all(latest_complete_dir(dir.path())).unwrap();
    let before = committed(&out);
    let err = cutline::run(&graph, config(dir.path())).expect_err("must refuse");
    assert!(err.to_string().contains("commit that output twice"), "{err}");
    assert_eq!(committed(&out), before);
}

#[test]
fn a_refused_fallback_keeps_every_prepared_transaction_so_a_repair_restores_exactly_regression_partial() {
    // Guards against: with two sink subtasks, the first recovered (discarding its newer prepared
    // transactions) before the second refused; after the repair, the first one's output was lost.
    // Every sink now answers `committed_after` before any recovers.
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let graph = counting_job_two_sinks(out.clone());
    run_until_a_crash_after_commits(&graph, dir.path(), cutline::CheckpointMode::ExactlyOnce);
    let latest = latest_complete_dir(dir.path());
    let state = std::fs::read_dir(&latest)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "state"))
        .unwrap();
    let original = std::fs::read(&state).unwrap();
    let mut damaged = original.clone();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0x40;
    std::fs::write(&state, &damaged).unwrap();
    let err = cutline::run(&graph, config(dir.path())).expect_err("refused: output after the fallback point");
    assert!(err.to_string().contains("commit that output twice"), "{err}");
    std::fs::write(&state, &original).unwrap(); // the repair
    cutline::run(&graph, config(dir.path())).expect("the repaired checkpoint restores");
    assert_eq!(committed(&out), expected());
}

#[test]
fn a_second_run_on_a_state_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let graph = counting_job("counts", 2, out.clone());
    let running = cutline::spawn(graph.clone(), config(dir.path()));
    wait_for(|| dir.path().join("job.meta").exists()); // written once the run holds the directory
    let err = cutline::run(&graph, config(dir.path())).expect_err("the directory is in use");
    assert!(err.to_string().contains("another run is using"), "{err}");
    running.join().expect("the first run is unaffected");
    assert_eq!(committed(&out), expected());
}

#[test]
fn a_straggler_times_checkpoints_out_is_named_and_the_job_fails_over_after_the_tolerable_failures() {
    // A task stalls 150 ms three times; checkpoints time out after 40 ms and one failure is tolerable.
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let stalls = Arc::new(AtomicU64::new(0));
    let s2 = stalls.clone();
    let job = Job::new("straggling");
    job.source("numbers", GeneratorSource::new(RECORDS, |i| i % KEYS))
        .rebalance("straggler", 1)
        .map(move |k: u64| {
            if k == 0 && s2.fetch_add(1, Ordering::SeqCst) % 60 == 20 && s2.load(Ordering::SeqCst) < 200 {
                std::thread::sleep(Duration::from_millis(150));
            }
            std::thread::sleep(Duration::from_micros(20));
            k
        })
        .key_by(|k: &u64| *k)
        .aggregate("counts", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
        .sink("out", MemoryTxnSink::new(out.clone()));
    let graph = job.build().unwrap();
    let mut cfg = config(dir.path());
    cfg.checkpoint.interval_ms = Some(10);
    cfg.checkpoint.timeout_ms = 40;
    cfg.checkpoint.tolerable_failures = 1;
    cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 20 };
    let report = cutline::run(&graph, cfg).expect("finishes");
    assert_eq!(committed(&out), expected());
    assert!(report.checkpoints_failed >= 2, "{report:?}");
    let named = report.failed_checkpoints.iter().any(|f| f.held_up_by.iter().any(|t| t == "straggler#0"));
    assert!(named, "the straggler is not named: {:?}", report.failed_checkpoints);
    assert!(report.restarts >= 1, "two consecutive timeouts with one tolerable must fail over");
}

#[test]
fn concurrent_partial_setting_changes_never_undo_each_other() {
    // A job that runs until stopped (a long, slow source).
    let job = Job::new("long");
    job.source("numbers", GeneratorSource::new(u64::MAX / 2, |i| i % KEYS))
        .map(|k: u64| {
            std::thread::sleep(Duration::from_micros(50));
            k
        })
        .key_by(|k: &u64| *k)
        .aggregate("counts", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
        .sink("out", MemoryTxnSink::new(Arc::new(Mutex::new(MemoryTxnStore::default()))));
    let dir = tempfile::tempdir().unwrap();
    let handle = cutline::spawn(job.build().unwrap(), config(dir.path()));
    let (a, b) = (handle.control(), handle.control());
    let t1 = std::thread::spawn(move || {
        for i in 0..50u64 {
            a.update_checkpoint_config(move |c| {
                c.timeout_ms = 10_000 + i;
                Ok(())
            })
            .unwrap();
        }
    });
    let t2 = std::thread::spawn(move || {
        for i in 0..50u32 {
            b.update_checkpoint_config(move |c| {
                c.tolerable_failures = 100 + i;
                Ok(())
            })
            .unwrap();
        }
    });
    t1.join().unwrap();
    t2.join().unwrap();
    let c = handle.checkpoint_config().unwrap();
    assert_eq!((c.timeout_ms, c.tolerable_failures), (10_049, 149), "one writer undid the other's change");
    // An edit that fails, or leaves invalid settings, changes nothing.
    assert!(handle.update_checkpoint_config(|_| Err("no".into())).is_err());
    let invalid = handle.update_checkpoint_config(|c| {
        c.max_concurrent = 0;
        Ok(())
    });
    assert!(invalid.unwrap_err().contains("max concurrent"));
    assert_eq!(handle.checkpoint_config().unwrap(), c);
    handle.stop();
    assert!(handle.join().unwrap().stopped);
}

#[test]
fn a_finished_marker_copied_from_another_store_is_damage_not_the_end_of_a_half_done_job_regression_copied_marker() {
    // A FINISHED marker copied from another store (of this job or another) made a half-done job
    // report "already finished" and exit 0; the marker must name a final checkpoint of this job in
    // this store.
    for other_job in ["counting-v1", "another-job"] {
        let (finished, half_done) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut cfg = config(finished.path());
        cfg.job_fingerprint = other_job.into();
        let report = cutline::run(&counting_job("counts", 2, Arc::default()), cfg).unwrap();
        assert!(report.final_checkpoint.is_some() && finished.path().join("FINISHED").exists());

        let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let graph = counting_job("counts", 2, out.clone());
        let mut cfg = config(half_done.path());
        crash_at_commit(&mut cfg, 3);
        cutline::run(&graph, cfg).expect_err("the injected failure stops the run half-way");
        std::fs::copy(finished.path().join("FINISHED"), half_done.path().join("FINISHED")).unwrap();

        let err = match cutline::run(&graph, config(half_done.path())) {
            Ok(r) => panic!("{other_job}: the copied marker ended the half-done job: {r:?}"),
            Err(e) => e,
        };
        assert!(matches!(err, RunError::Damaged { what: "FINISHED", .. }), "{other_job}: {err}");
        let msg = err.to_string();
        assert!(msg.contains("copied from another job") && msg.contains("delete it"), "{other_job}: {msg}");
        assert!(!msg.contains("already finished"), "{other_job}: {msg}");
        // The advice works: without the marker the job resumes and finishes exactly.
        std::fs::remove_file(half_done.path().join("FINISHED")).unwrap();
        let report = cutline::run(&graph, config(half_done.path())).expect("resumes");
        assert!(report.restored_from.is_some() && !report.already_finished);
        assert_eq!(committed(&out), expected());
    }
}
