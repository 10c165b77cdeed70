//! Unaligned and aligned-with-timeout checkpoints in the threaded runtime, with real threads, real
//! backpressure and a real state directory: records in flight are persisted and replayed after
//! failures at every protocol step, on every edge kind and into a two-input operator; a checkpoint
//! holding records in flight refuses to rescale; an aligned checkpoint stuck behind a backlog switches.

use cutline::{
    CheckpointMode, Either, FaultPoint, Faults, GeneratorSource, Job, JobGraph, LocalDirStore, MemoryTxnSink,
    MemoryTxnStore, RestartStrategy, RunConfig, RunError,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const LEFT: u64 = 3000;
const RIGHT: u64 = 1000;
const RULES: u64 = 50;
const KEYS: u64 = 11;

/// Every edge kind between fast producers and a slow stage, so channels stay full:
/// left(2) ∪ broadcast(rules → 2) connect forward(right → 1)... keyed "join" → rebalance "slow"(`slow_p`)
/// with a slow map → sink of parallelism 1.
fn job(slow_p: u32, out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let job = Job::new("unaligned");
    job.set_parallelism(2);
    let left = job.source_with_parallelism("left", 2, GeneratorSource::new(LEFT, |i| i % KEYS));
    let rules = job
        .source_with_parallelism("rules", 1, GeneratorSource::new(RULES, |i| (i * 3) % KEYS))
        .broadcast("rules-b", 2);
    let right =
        job.source_with_parallelism("right", 1, GeneratorSource::new(RIGHT, |i| (i * 7) % KEYS)).forward("right-f");
    left.union(rules)
        .connect(right)
        .key_by(|l: &u64| *l, |r: &u64| *r)
        .process("join", |k: &u64, s: &mut Option<(u64, u64)>, rec: Either<u64, u64>, out| {
            let c = s.get_or_insert((0, 0));
            match rec {
                Either::Left(_) => {
                    c.0 += 1;
                    out.emit(format!("L{k}:{}", c.0))
                }
                Either::Right(_) => {
                    c.1 += 1;
                    out.emit(format!("R{k}:{}", c.1))
                }
            }
        })
        .rebalance("slow", slow_p)
        .map(|s: String| {
            std::thread::sleep(Duration::from_micros(30));
            s
        })
        .sink_with_parallelism("out", 1, MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

fn expected() -> Vec<String> {
    let mut n: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for i in 0..LEFT {
        n.entry(i % KEYS).or_default().0 += 1;
    }
    for i in 0..RULES {
        n.entry((i * 3) % KEYS).or_default().0 += 2;
    }
    for i in 0..RIGHT {
        n.entry((i * 7) % KEYS).or_default().1 += 1;
    }
    let mut v: Vec<String> = n
        .iter()
        .flat_map(|(k, (l, r))| {
            (1..=*l).map(move |c| format!("L{k}:{c}")).chain((1..=*r).map(move |c| format!("R{k}:{c}")))
        })
        .collect();
    v.sort();
    v
}

fn committed(out: &Arc<Mutex<MemoryTxnStore>>) -> Vec<String> {
    let mut v = out.lock().unwrap().committed_records();
    v.sort();
    v
}

/// Unaligned checkpoints every 5 ms with tiny channels (2 batches of 8 records): the barriers always
/// find records queued in front of them.
fn unaligned_config(dir: &std::path::Path) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), "unaligned-v1");
    cfg.checkpoint.interval_ms = Some(5);
    cfg.checkpoint.unaligned = true;
    cfg.checkpoint.max_concurrent = 2;
    cfg.batch_size = 8;
    cfg.channel_capacity = 2;
    cfg
}

#[test]
fn one_failure_at_every_protocol_step_of_an_unaligned_job_then_restore_gives_exact_output() {
    let points = [
        FaultPoint::ProcessBatch,
        FaultPoint::Snapshot,
        FaultPoint::SnapshotWrite,
        FaultPoint::SinkPrepare,
        FaultPoint::SinkCommit,
        FaultPoint::SinkCommitMidway,
    ];
    let mut in_flight_bytes = 0;
    for point in points {
        for nth in [2u64, 7] {
            let dir = tempfile::tempdir().unwrap();
            let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
            let mut cfg = unaligned_config(dir.path());
            let count = Arc::new(AtomicU64::new(0));
            cfg.faults = Faults::new(move |p| p == point && count.fetch_add(1, Ordering::SeqCst) + 1 == nth);
            cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 };
            let report =
                cutline::run(&job(2, out.clone()), cfg).unwrap_or_else(|e| panic!("failure at {point:?} #{nth}: {e}"));
            assert_eq!(committed(&out), expected(), "failure at {point:?} #{nth}: output differs");
            in_flight_bytes += report.checkpoints.iter().map(|c| c.channel_state_bytes).sum::<u64>();
            assert!(report.checkpoints.iter().any(|c| c.unaligned_tasks > 0), "no unaligned snapshot at all");
        }
    }
    assert!(in_flight_bytes > 0, "no checkpoint persisted records in flight: the test proves nothing");
}

#[test]
fn a_process_crash_after_unaligned_checkpoints_restores_the_records_in_flight_exactly() {
    // Run until the 6th sink commit fails with no restarts allowed (a dead process), then start again.
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let mut cfg = unaligned_config(dir.path());
    let count = Arc::new(AtomicU64::new(0));
    cfg.faults = Faults::new(move |p| p == FaultPoint::SinkCommit && count.fetch_add(1, Ordering::SeqCst) + 1 == 6);
    cfg.restart = RestartStrategy::None;
    assert!(matches!(cutline::run(&job(2, out.clone()), cfg), Err(RunError::GaveUp { .. })));
    let report = cutline::run(&job(2, out.clone()), unaligned_config(dir.path())).expect("resumes");
    assert!(report.restored_from.is_some());
    assert_eq!(committed(&out), expected());
}

#[test]
fn a_checkpoint_holding_records_in_flight_refuses_to_restore_at_another_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    // Stop after checkpoints exist; retry until the latest complete one holds records in flight.
    let mut held = false;
    for attempt in 0..20u64 {
        let mut cfg = unaligned_config(dir.path());
        let count = Arc::new(AtomicU64::new(0));
        let nth = 3 + attempt;
        cfg.faults =
            Faults::new(move |p| p == FaultPoint::SinkCommit && count.fetch_add(1, Ordering::SeqCst) + 1 == nth);
        cfg.restart = RestartStrategy::None;
        match cutline::run(&job(2, out.clone()), cfg) {
            Err(RunError::GaveUp { .. }) => {}
            other => panic!("expected the injected failure, got {other:?}"),
        }
        // Rescaling "slow" from 2 to 3 is refused exactly when its tasks hold records in flight.
        match cutline::run(&job(3, Arc::new(Mutex::new(MemoryTxnStore::default()))), unaligned_config(dir.path())) {
            Err(RunError::Deploy(e)) => {
                let msg = e.to_string();
                assert!(msg.contains("savepoint") && msg.contains("in flight"), "unclear refusal: {msg}");
                held = true;
                break;
            }
            Ok(_) => {
                // The restored checkpoint had nothing in flight into "slow": a legal rescale. Start over.
                let _ = std::fs::remove_dir_all(dir.path());
                std::fs::create_dir_all(dir.path()).unwrap();
                *out.lock().unwrap() = MemoryTxnStore::default();
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert!(held, "never caught a checkpoint with records in flight into the rescaled stage");
}

#[test]
fn aligned_checkpoints_stuck_behind_a_backlog_switch_to_unaligned_after_their_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let mut cfg = unaligned_config(dir.path());
    cfg.checkpoint.unaligned = false;
    cfg.checkpoint.alignment_timeout_ms = Some(2);
    cfg.checkpoint.interval_ms = Some(20);
    let report = cutline::run(&job(2, out.clone()), cfg).expect("runs");
    assert_eq!(committed(&out), expected());
    let switched: u32 = report.checkpoints.iter().map(|c| c.switched_tasks).sum();
    assert!(switched > 0, "no task switched: {:?}", report.checkpoints);
}

#[test]
fn at_least_once_refuses_unaligned_settings_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = unaligned_config(dir.path());
    cfg.checkpoint.mode = CheckpointMode::AtLeastOnce;
    match cutline::run(&job(2, Arc::new(Mutex::new(MemoryTxnStore::default()))), cfg) {
        Err(RunError::Config(m)) => assert!(m.contains("exactly-once"), "{m}"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[test]
fn metrics_show_backpressure_and_bounded_channels_while_a_slow_stage_lags() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let cfg = unaligned_config(dir.path());
    let handle = cutline::spawn(job(1, out.clone()), cfg);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = None;
    while std::time::Instant::now() < deadline && !handle.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        if let Ok(m) = handle.metrics() {
            if m.tasks.iter().any(|t| t.backpressured_ms > 0) {
                seen = Some(m);
                break;
            }
        }
    }
    let m = seen.expect("some task reported backpressure while the slow stage lagged");
    for t in &m.tasks {
        for c in &t.inputs {
            // Credit bounds a channel to its capacity plus the output of the one batch in progress.
            assert!(
                c.high_water_batches <= c.capacity_batches + 8,
                "{} grew to {} batches",
                c.name,
                c.high_water_batches
            );
        }
    }
    handle.join().expect("finishes");
    assert_eq!(committed(&out), expected());
}
