//! Event time in the threaded runtime: watermarks generated at the sources, carried beside records
//! through every edge kind, windows fired by them; with failures at every protocol step, aligned and
//! unaligned checkpoints, a process crash and a rescale, the committed results equal an independent
//! batch computation (no late records) or the failure-free run (with late records, whose lateness
//! depends on exactly where the watermark was when each record arrived).

use cutline::{
    ConnectorResult, Either, EventTime, FaultPoint, Faults, GeneratorSource, Job, JobGraph, LocalDirStore,
    MemoryTxnSink, MemoryTxnStore, RestartStrategy, RunConfig, RunError, Source, SourceStatus, WatermarkStrategy,
    Windows,
};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const N: u64 = 20_000;
const KEYS: u64 = 7;
const WINDOW_MS: u64 = 500;

/// An event: (key, event time, index).
type Event = (u64, i64, u64);

fn jitter(i: u64, bound: u64) -> i64 {
    (cutline::splitmix64(i) % bound) as i64
}

/// Events about 10 ms apart, up to 399 ms out of order: with a bound of 400 ms none is late.
fn in_bounds(i: u64) -> Event {
    (i % KEYS, i as i64 * 10 - jitter(i, 400), i)
}

/// Events up to 99 ms out of order, with every 50th 3 s late (after its window's lateness: late),
/// every 37th 700 ms late (after its window fired, within the lateness: it updates the window), and
/// every 23rd 200 ms late: whether its window fired before it arrived depends on the last one or
/// two watermarks (16 events, about 160 ms, apart), so a restore that loses one shows.
fn with_late(i: u64) -> Event {
    let t = i as i64 * 10 - jitter(i, 100);
    let t = if i % 50 == 49 {
        t - 3000
    } else if i % 37 == 36 {
        t - 700
    } else if i % 23 == 22 {
        t - 200
    } else {
        t
    };
    (i % KEYS, t, i)
}

struct Shape {
    events: fn(u64) -> Event,
    out_of_orderness_ms: u64,
    sources: u32,
    keyed: u32,
    lateness_ms: u64,
}

/// source(s) -> watermarks -> key_by -> tumbling count (with late records beside) -> rebalance ->
/// sink. `generated` holds the highest index generated and `early` counts window results emitted
/// while the sources were far from done (watermarks, not the end of input, fired them).
fn job(s: &Shape, out: Arc<Mutex<MemoryTxnStore>>, early: Arc<AtomicU64>) -> JobGraph {
    let generated = Arc::new(AtomicU64::new(0));
    let job = Job::new("event-time");
    let events = s.events;
    let g = generated.clone();
    job.source_with_parallelism(
        "events",
        s.sources,
        GeneratorSource::new(N, move |i| {
            g.fetch_max(i, Ordering::Relaxed);
            events(i)
        }),
    )
    .with_watermarks(
        "events-wm",
        WatermarkStrategy::bounded_out_of_orderness(s.out_of_orderness_ms, |e: &Event| EventTime(e.1)),
    )
    .map(|e: Event| {
        // Slow enough that channels fill and many checkpoints happen during a run.
        if e.2.is_multiple_of(4) {
            std::thread::sleep(std::time::Duration::from_micros(1));
        }
        e
    })
    .key_by(|e: &Event| e.0)
    .parallelism(s.keyed)
    .window(Windows::tumbling_ms(WINDOW_MS), |e: &Event| EventTime(e.1))
    .allowed_lateness_ms(s.lateness_ms)
    .aggregate_with_late(
        "counts",
        || 0u64,
        |n, _e| *n += 1,
        |n, m| *n += m,
        move |k, w, n| {
            if generated.load(Ordering::Relaxed) < N / 2 {
                early.fetch_add(1, Ordering::Relaxed);
            }
            format!("{k}@{}:{n}", w.start.0)
        },
    )
    .map(|r| match r {
        Either::Left(result) => result,
        Either::Right((_, _, i)) => format!("late:{i}"),
    })
    .sink_with_parallelism("out", 1, MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

/// Per (key, window start): the number of events, computed directly (no event is late).
fn batch_counts() -> Vec<String> {
    let mut n: BTreeMap<(u64, i64), u64> = BTreeMap::new();
    for i in 0..N {
        let (k, t, _) = in_bounds(i);
        *n.entry((k, t - t.rem_euclid(WINDOW_MS as i64))).or_default() += 1;
    }
    let mut v: Vec<String> = n.iter().map(|((k, s), c)| format!("{k}@{s}:{c}")).collect();
    v.sort();
    v
}

/// `got` equals `want` (both sorted); on a difference, say what is missing and extra, briefly.
fn assert_same(got: &[String], want: &[String], what: &str) {
    if got == want {
        return;
    }
    fn count(v: &[String]) -> BTreeMap<&String, i64> {
        let mut m = BTreeMap::new();
        for r in v {
            *m.entry(r).or_default() += 1;
        }
        m
    }
    let (g, w) = (count(got), count(want));
    let diff = |a: &BTreeMap<&String, i64>, b: &BTreeMap<&String, i64>| -> Vec<String> {
        a.iter().filter(|(r, n)| b.get(*r).copied().unwrap_or(0) < **n).map(|(r, _)| r.to_string()).take(10).collect()
    };
    panic!(
        "{what}: {} records, expected {}; missing (first 10): {:?}; extra (first 10): {:?}",
        got.len(),
        want.len(),
        diff(&w, &g),
        diff(&g, &w)
    );
}

fn committed(out: &Arc<Mutex<MemoryTxnStore>>) -> Vec<String> {
    let mut v = out.lock().unwrap().committed_records();
    v.sort();
    v
}

fn config(dir: &std::path::Path, unaligned: bool) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), "event-time-v1");
    cfg.checkpoint.interval_ms = Some(5);
    cfg.checkpoint.unaligned = unaligned;
    cfg.checkpoint.max_concurrent = if unaligned { 2 } else { 1 };
    cfg.batch_size = 16;
    cfg.channel_capacity = 2;
    cfg
}

const POINTS: [FaultPoint; 6] = [
    FaultPoint::ProcessBatch,
    FaultPoint::Snapshot,
    FaultPoint::SnapshotWrite,
    FaultPoint::SinkPrepare,
    FaultPoint::SinkCommit,
    FaultPoint::SinkCommitMidway,
];

/// Run `shape` once per fault point and `nth`, in both alignments; each run's sorted output.
fn runs_with_one_failure(shape: &Shape, nths: &[u64], check: impl Fn(&str, &[String])) {
    for unaligned in [false, true] {
        let mut in_flight_bytes = 0;
        for point in POINTS {
            for &nth in nths {
                let what = format!("{} failure at {point:?} #{nth}", if unaligned { "unaligned" } else { "aligned" });
                let dir = tempfile::tempdir().unwrap();
                let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
                let mut cfg = config(dir.path(), unaligned);
                let count = Arc::new(AtomicU64::new(0));
                cfg.faults = Faults::new(move |p| p == point && count.fetch_add(1, Ordering::SeqCst) + 1 == nth);
                cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 };
                let early = Arc::new(AtomicU64::new(0));
                let report = cutline::run(&job(shape, out.clone(), early.clone()), cfg)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                // A failed snapshot write fails its checkpoint only; every other point restarts the job.
                let injected =
                    report.restarts >= 1 || (point == FaultPoint::SnapshotWrite && report.checkpoints_failed >= 1);
                assert!(injected, "{what}: the failure was never injected");
                check(&what, &committed(&out));
                in_flight_bytes += report.checkpoints.iter().map(|c| c.channel_state_bytes).sum::<u64>();
            }
        }
        if unaligned {
            assert!(in_flight_bytes > 0, "no checkpoint held records in flight: the unaligned runs prove nothing");
        }
    }
}

#[test]
fn tumbling_counts_equal_a_batch_computation_after_a_failure_at_every_protocol_step() {
    let shape = Shape { events: in_bounds, out_of_orderness_ms: 400, sources: 2, keyed: 2, lateness_ms: 0 };
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let early = Arc::new(AtomicU64::new(0));
    cutline::run(&job(&shape, out.clone(), early.clone()), config(dir.path(), false)).expect("runs");
    assert_same(&committed(&out), &batch_counts(), "failure-free run");
    assert!(early.load(Ordering::Relaxed) > 0, "no window fired before the end of input: watermarks did not flow");
    runs_with_one_failure(&shape, &[2, 6], |what, got| assert_same(got, &batch_counts(), what));
}

#[test]
fn late_records_and_updates_of_fired_windows_are_the_same_after_failures_as_without() {
    // One source subtask: where its watermark stands when each record arrives is decided by the
    // record order alone, so the failure-free run is the reference for every failing one.
    let shape = Shape { events: with_late, out_of_orderness_ms: 100, sources: 1, keyed: 2, lateness_ms: 1000 };
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let early = Arc::new(AtomicU64::new(0));
    cutline::run(&job(&shape, out.clone(), early.clone()), config(dir.path(), false)).expect("runs");
    let reference = committed(&out);
    // Independent checks of the reference: exactly the 3 s late events are late, and every window's
    // last result counts every other event of it.
    let mut late: Vec<String> = (0..N).filter(|i| i % 50 == 49).map(|i| format!("late:{i}")).collect();
    late.sort();
    let got_late: Vec<String> = reference.iter().filter(|r| r.starts_with("late:")).cloned().collect();
    assert_eq!(got_late, late);
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for r in reference.iter().filter(|r| !r.starts_with("late:")) {
        let (w, n) = r.rsplit_once(':').unwrap();
        let n: u64 = n.parse().unwrap();
        let e = last.entry(w.to_string()).or_default();
        *e = (*e).max(n);
    }
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for i in (0..N).filter(|i| i % 50 != 49) {
        let (k, t, _) = with_late(i);
        *want.entry(format!("{k}@{}", t - t.rem_euclid(WINDOW_MS as i64))).or_default() += 1;
    }
    assert_eq!(last, want, "final window counts");
    let updates = reference.len() - late.len() - want.len();
    assert!(updates > 0, "no window was updated within its lateness: the scenario tests nothing");
    runs_with_one_failure(&shape, &[2, 6], |what, got| assert_same(got, &reference, what));
}

#[test]
fn a_crashed_windowed_job_resumes_at_another_parallelism_with_the_same_windows() {
    let shape = Shape { events: in_bounds, out_of_orderness_ms: 400, sources: 2, keyed: 2, lateness_ms: 0 };
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let mut cfg = config(dir.path(), false);
    let count = Arc::new(AtomicU64::new(0));
    cfg.faults = Faults::new(move |p| p == FaultPoint::SinkCommit && count.fetch_add(1, Ordering::SeqCst) + 1 == 4);
    cfg.restart = RestartStrategy::None;
    let early = Arc::new(AtomicU64::new(0));
    assert!(matches!(cutline::run(&job(&shape, out.clone(), early.clone()), cfg), Err(RunError::GaveUp { .. })));
    let rescaled = Shape { keyed: 3, ..shape };
    let report = cutline::run(&job(&rescaled, out.clone(), early), config(dir.path(), false)).expect("resumes");
    assert!(report.restored_from.is_some(), "nothing was restored");
    assert_same(&committed(&out), &batch_counts(), "after the rescale");
}

/// A source that has nothing to read until `released` is set (or `give_up` passed), then ends.
#[derive(Clone)]
struct Silent {
    released: Arc<AtomicBool>,
    give_up: Instant,
}

impl Source for Silent {
    type Item = Event;
    type Offset = ();
    fn open(&mut self, _s: u32, _p: u32, _o: Option<()>) -> ConnectorResult<()> {
        Ok(())
    }
    fn poll(&mut self, _out: &mut Vec<Event>, _max: usize) -> ConnectorResult<SourceStatus> {
        let done = self.released.load(Ordering::SeqCst) || Instant::now() > self.give_up;
        Ok(if done { SourceStatus::Finished } else { SourceStatus::Idle })
    }
    fn offset(&self) {}
}

#[test]
fn an_idle_source_does_not_hold_back_the_windows_of_the_others() {
    // Two sources unioned into one windowed count: "events" produces, "silent" says nothing until a
    // window result was seen (or 20 s passed). Marked idle after 50 ms, it must not hold time back.
    let released = Arc::new(AtomicBool::new(false));
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new("idle");
    let strategy =
        || WatermarkStrategy::bounded_out_of_orderness(400, |e: &Event| EventTime(e.1)).with_idle_timeout_ms(50);
    let events = job.source("events", GeneratorSource::new(N, in_bounds)).with_watermarks("events-wm", strategy()).map(
        |e: Event| {
            if e.2.is_multiple_of(64) {
                std::thread::sleep(Duration::from_millis(1)); // about 300 ms in all: the silent source goes idle
            }
            e
        },
    );
    let silent = job
        .source("silent", Silent { released: released.clone(), give_up: Instant::now() + Duration::from_secs(20) })
        .with_watermarks("silent-wm", strategy());
    let r = released.clone();
    events
        .union(silent)
        .key_by(|e: &Event| e.0)
        .window(Windows::tumbling_ms(WINDOW_MS), |e: &Event| EventTime(e.1))
        .aggregate("counts", || 0u64, |n, _e| *n += 1, |n, m| *n += m, |k, w, n| format!("{k}@{}:{n}", w.start.0))
        .map(move |line: String| {
            r.store(true, Ordering::SeqCst);
            line
        })
        .sink("out", MemoryTxnSink::new(out.clone()));
    let graph = job.build().expect("valid job");
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    cutline::run(&graph, config(dir.path(), false)).expect("runs");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the job waited for the silent source's end: its idleness did not release the windows"
    );
    assert_same(&committed(&out), &batch_counts(), "windows beside an idle source");
}
