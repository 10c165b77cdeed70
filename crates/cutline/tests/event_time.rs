//! Event time in the threaded runtime: watermarks generated at the sources, carried beside records
//! through every edge kind, windows fired by them; with failures at every protocol step, aligned and
//! unaligned checkpoints, a process crash and a rescale, the committed results equal an independent
//! batch computation (no late records) or the failure-free run (with late records, whose lateness
//! depends on exactly where the watermark was when each record arrived).

use cutline::{
    ConnectorResult, Either, EventTime, FaultPoint, Faults, GeneratorSource, Job, JobGraph, KeyedStream, LocalDirStore,
    MemoryTxnSink, MemoryTxnStore, RestartStrategy, RunConfig, RunError, Source, SourceStatus, SplitId, Stream,
    WatermarkStrategy, Windows,
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
    let keyed = job
        .source_with_parallelism(
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
        .parallelism(s.keyed);
    counts(keyed, s.lateness_ms, move || generated.load(Ordering::Relaxed) < N / 2, early).sink_with_parallelism(
        "out",
        1,
        MemoryTxnSink::new(out),
    );
    job.build().expect("valid job")
}

/// Per (key, window start): the number of events, computed directly (no event is late).
fn batch_counts() -> Vec<String> {
    counts_of((0..N).map(in_bounds))
}

/// Tumbling counts per key, `key@window-start:count`, with late records beside as `late:index`;
/// `early` counts results emitted while `soon` holds (the input far from its end).
fn counts(
    keyed: KeyedStream<u64, Event>,
    lateness_ms: u64,
    soon: impl Fn() -> bool + Send + Sync + 'static,
    early: Arc<AtomicU64>,
) -> Stream<String> {
    keyed
        .window(Windows::tumbling_ms(WINDOW_MS), |e: &Event| EventTime(e.1))
        .allowed_lateness_ms(lateness_ms)
        .aggregate_with_late(
            "counts",
            || 0u64,
            |n, _e| *n += 1,
            |n, m| *n += m,
            move |k, w, n| {
                if soon() {
                    early.fetch_add(1, Ordering::Relaxed);
                }
                format!("{k}@{}:{n}", w.start.0)
            },
        )
        .map(|r| match r {
            Either::Left(result) => result,
            Either::Right((_, _, i)) => format!("late:{i}"),
        })
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

/// Records per split of [`Uneven`], and how far split 0 is read ahead of split 1.
const SPLIT_RECORDS: u64 = N / 2;
const HEAD: u64 = N / 4;

/// The `j`th record of `split`: times 10 ms apart, in order within the split; the index tells the
/// split (even: 0, odd: 1).
fn split_event(split: u64, j: u64) -> Event {
    (j % KEYS, j as i64 * 10 + split as i64 * 5, 2 * j + split)
}

/// What [`Uneven`] reads at position `p`: split 0's first [`HEAD`] records (a backlog read ahead,
/// 50 s of event time), then both splits alternately, then the rest of split 1.
fn uneven(p: u64) -> Event {
    let alternating = 2 * (SPLIT_RECORDS - HEAD);
    match p {
        p if p < HEAD => split_event(0, p),
        p if p - HEAD < alternating => {
            let q = p - HEAD;
            if q.is_multiple_of(2) {
                split_event(1, q / 2)
            } else {
                split_event(0, HEAD + q / 2)
            }
        }
        p => split_event(1, SPLIT_RECORDS - HEAD + (p - HEAD - alternating)),
    }
}

/// One source subtask reading two splits unevenly ([`uneven`]); with `silent_split`, split 1 has
/// no records at all (only split 0's are read, in order). It names its splits when `announce`.
#[derive(Clone)]
struct Uneven {
    pos: u64,
    announce: bool,
    silent_split: bool,
    splits: Vec<SplitId>,
    /// The position, for the job's operators to see how far reading got.
    progress: Arc<AtomicU64>,
}

impl Uneven {
    fn new(announce: bool, silent_split: bool, progress: Arc<AtomicU64>) -> Uneven {
        Uneven { pos: 0, announce, silent_split, splits: vec![SplitId(0), SplitId(1)], progress }
    }
    fn len(&self) -> u64 {
        if self.silent_split {
            SPLIT_RECORDS
        } else {
            N
        }
    }
}

impl Source for Uneven {
    type Item = Event;
    type Offset = u64;
    fn open(&mut self, _s: u32, _p: u32, restored: Option<u64>) -> ConnectorResult<()> {
        self.pos = restored.unwrap_or(0);
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Event>, max: usize) -> ConnectorResult<SourceStatus> {
        let end = self.len().min(self.pos + max as u64);
        for p in self.pos..end {
            out.push(if self.silent_split { split_event(0, p) } else { uneven(p) });
        }
        self.pos = end;
        self.progress.store(end, Ordering::Relaxed);
        Ok(if end == self.len() { SourceStatus::Finished } else { SourceStatus::More })
    }
    fn offset(&self) -> u64 {
        self.pos
    }
    fn splits(&self) -> &[SplitId] {
        if self.announce {
            &self.splits
        } else {
            &[]
        }
    }
}

/// Uneven -> watermarks (per split if `per_split`) -> tumbling counts with late records beside.
/// `early` counts results emitted while the source was less than half through.
fn split_job(
    source: Uneven,
    strategy: WatermarkStrategy<Event>,
    out: Arc<Mutex<MemoryTxnStore>>,
    early: Arc<AtomicU64>,
) -> JobGraph {
    let job = Job::new("splits");
    let (progress, half) = (source.progress.clone(), source.len() / 2);
    let keyed = job
        .source("uneven", source)
        .with_watermarks("uneven-wm", strategy)
        .map(|e: Event| {
            if e.2.is_multiple_of(64) {
                std::thread::sleep(Duration::from_millis(1)); // some 300 ms in all: checkpoints and ticks happen
            }
            e
        })
        .key_by(|e: &Event| e.0);
    counts(keyed, 0, move || progress.load(Ordering::Relaxed) < half, early).sink("out", MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

/// Per (key, window start): the number of `events`.
fn counts_of(events: impl Iterator<Item = Event>) -> Vec<String> {
    let mut n: BTreeMap<(u64, i64), u64> = BTreeMap::new();
    for (k, t, _) in events {
        *n.entry((k, t - t.rem_euclid(WINDOW_MS as i64))).or_default() += 1;
    }
    let mut v: Vec<String> = n.iter().map(|((k, s), c)| format!("{k}@{s}:{c}")).collect();
    v.sort();
    v
}

fn per_split(bound_ms: u64) -> WatermarkStrategy<Event> {
    WatermarkStrategy::bounded_out_of_orderness(bound_ms, |e: &Event| EventTime(e.1))
        .per_split(|e: &Event| SplitId(e.2 % 2))
}

#[test]
fn a_split_read_ahead_does_not_make_the_other_splits_records_late() {
    let run = |announce: bool, strategy: WatermarkStrategy<Event>, cfg: RunConfig| {
        let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let source = Uneven::new(announce, false, Arc::new(AtomicU64::new(0)));
        let report = cutline::run(&split_job(source, strategy, out.clone(), Arc::new(AtomicU64::new(0))), cfg);
        (report.expect("runs"), committed(&out))
    };
    let late = |v: &[String]| v.iter().filter(|r| r.starts_with("late:")).count();
    let want = counts_of((0..N).map(uneven));
    // The controls: one watermark for the whole subtask, or per split without the source naming
    // its splits (split 1 counts only from its first record, 50 s of event time behind): late records.
    let dir = tempfile::tempdir().unwrap();
    let whole = WatermarkStrategy::bounded_out_of_orderness(20, |e: &Event| EventTime(e.1));
    let (_, got) = run(true, whole, config(dir.path(), false));
    assert!(
        late(&got) > 1000,
        "a subtask-level watermark made {} records late: the scenario tests nothing",
        late(&got)
    );
    let dir = tempfile::tempdir().unwrap();
    let (_, got) = run(false, per_split(20), config(dir.path(), false));
    assert!(late(&got) > 1000, "per split without announced splits: {} late records", late(&got));
    // Per split, announced: nothing late, the batch computation's counts, also after failures.
    let dir = tempfile::tempdir().unwrap();
    let (_, got) = run(true, per_split(20), config(dir.path(), false));
    assert_same(&got, &want, "per-split watermarks");
    for unaligned in [false, true] {
        for (point, nth) in [(FaultPoint::ProcessBatch, 40), (FaultPoint::SinkCommit, 3)] {
            let what = format!("per split, {point:?} #{nth}, unaligned {unaligned}");
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = config(dir.path(), unaligned);
            let count = Arc::new(AtomicU64::new(0));
            cfg.faults = Faults::new(move |p| p == point && count.fetch_add(1, Ordering::SeqCst) + 1 == nth);
            cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 };
            let (report, got) = run(true, per_split(20), cfg);
            assert!(report.restarts >= 1, "{what}: the failure was never injected");
            assert_same(&got, &want, &what);
        }
    }
}

#[test]
fn a_silent_split_stops_holding_time_back_after_the_idle_timeout() {
    let run = |strategy: WatermarkStrategy<Event>| {
        let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let early = Arc::new(AtomicU64::new(0));
        let source = Uneven::new(true, true, Arc::new(AtomicU64::new(0)));
        let dir = tempfile::tempdir().unwrap();
        cutline::run(&split_job(source, strategy, out.clone(), early.clone()), config(dir.path(), false))
            .expect("runs");
        (early.load(Ordering::Relaxed), committed(&out))
    };
    let want = counts_of((0..SPLIT_RECORDS).map(|j| split_event(0, j)));
    // Without a timeout, announced split 1 holds the watermark until the end of input.
    let (early, got) = run(per_split(20));
    assert_eq!(early, 0, "windows fired while a split without records held time back");
    assert_same(&got, &want, "no idle timeout");
    let (early, got) = run(per_split(20).with_idle_timeout_ms(30));
    assert!(early > 0, "no window fired before the end of input: the silent split held time back");
    assert_same(&got, &want, "split 1 idle");
}
