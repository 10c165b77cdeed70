//! Streams with several consumers: `tee` (one stage feeding a keyed window through a hash edge and a
//! sink through a rebalance edge at once) and `split` (side outputs: a window's results to one sink,
//! its late records to another). With a failure at a protocol step, aligned and unaligned, each
//! consumer's committed output equals a batch computation over the same events.

use cutline::{
    Either, EventTime, FaultPoint, Faults, GeneratorSource, Job, JobGraph, LocalDirStore, MemoryTxnSink,
    MemoryTxnStore, RestartStrategy, RunConfig, WatermarkStrategy, Windows,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const N: u64 = 20_000;
const KEYS: u64 = 7;
const WINDOW_MS: i64 = 500;

/// An event: (key, event time, index). About 10 ms apart, up to 99 ms out of order; from index
/// 2,000 on, every 50th is 3 s late (its window closed long before: late, whatever the timing).
type Event = (u64, i64, u64);

fn event(i: u64) -> Event {
    let t = i as i64 * 10 - (cutline::splitmix64(i) % 100) as i64;
    let late = i >= 2_000 && i % 50 == 49;
    (i % KEYS, if late { t - 3_000 } else { t }, i)
}

fn is_late(i: u64) -> bool {
    i >= 2_000 && i % 50 == 49
}

type Store = Arc<Mutex<MemoryTxnStore>>;

fn stores<const K: usize>() -> [Store; K] {
    std::array::from_fn(|_| Arc::new(Mutex::new(MemoryTxnStore::default())))
}

fn committed(s: &Store) -> Vec<String> {
    let mut v = s.lock().unwrap().committed_records();
    v.sort();
    v
}

/// events -> watermarks -> slow map, then either
/// - tee: (a) key_by -> tumbling counts -> sink "counts"; (b) index of every 3rd event -> sink
///   "thirds" at parallelism 1 (a rebalance edge beside the hash edge); or
/// - split: key_by -> tumbling counts with late records beside -> split -> results to sink "counts",
///   late records to sink "late".
fn job(tee: bool, [a, b]: [Store; 2]) -> JobGraph {
    let job = Job::new("forks");
    let events = job
        .source_with_parallelism("events", 1, GeneratorSource::new(N, event))
        .with_watermarks("events-wm", WatermarkStrategy::bounded_out_of_orderness(100, |e: &Event| EventTime(e.1)))
        .map(|e: Event| {
            if e.2.is_multiple_of(4) {
                std::thread::sleep(std::time::Duration::from_micros(1));
            }
            e
        });
    let count = |n: &mut u64, _e: &Event| *n += 1;
    let show = |k: &u64, w: &cutline::Window, n: &u64| format!("{k}@{}:{n}", w.start.0);
    if tee {
        let (windowed, all) = events.tee();
        windowed
            .key_by(|e: &Event| e.0)
            .parallelism(2)
            .window(Windows::tumbling_ms(WINDOW_MS as u64), |e: &Event| EventTime(e.1))
            .aggregate("counts", || 0u64, count, |n, m| *n += m, show)
            .sink("counts-out", MemoryTxnSink::new(a));
        all.filter(|e: &Event| e.2.is_multiple_of(3)).map(|e: Event| e.2.to_string()).sink_with_parallelism(
            "thirds",
            1,
            MemoryTxnSink::new(b),
        );
    } else {
        let (results, late) = events
            .key_by(|e: &Event| e.0)
            .parallelism(2)
            .window(Windows::tumbling_ms(WINDOW_MS as u64), |e: &Event| EventTime(e.1))
            .aggregate_with_late("counts", || 0u64, count, |n, m| *n += m, show)
            .split();
        results.sink("counts-out", MemoryTxnSink::new(a));
        late.map(|e: Event| e.2.to_string()).sink_with_parallelism("late", 1, MemoryTxnSink::new(b));
    }
    job.build().expect("valid job")
}

/// Per (key, window): the events that are not late, counted directly.
fn batch_counts() -> Vec<String> {
    let mut n: BTreeMap<(u64, i64), u64> = BTreeMap::new();
    for (k, t, _) in (0..N).filter(|i| !is_late(*i)).map(event) {
        *n.entry((k, t - t.rem_euclid(WINDOW_MS))).or_default() += 1;
    }
    let mut v: Vec<String> = n.iter().map(|((k, s), c)| format!("{k}@{s}:{c}")).collect();
    v.sort();
    v
}

fn indices(f: impl Fn(u64) -> bool) -> Vec<String> {
    let mut v: Vec<String> = (0..N).filter(|i| f(*i)).map(|i| i.to_string()).collect();
    v.sort();
    v
}

fn check(what: &str, got: &[String], want: &[String]) {
    if got != want {
        let missing: Vec<&String> = want.iter().filter(|w| !got.contains(w)).take(5).collect();
        let extra: Vec<&String> = got.iter().filter(|g| !want.contains(g)).take(5).collect();
        panic!("{what}: {} records, expected {}; missing {missing:?}, extra {extra:?}", got.len(), want.len());
    }
}

#[test]
fn both_consumers_of_a_forked_stream_commit_exactly_their_batch_result_across_a_failure() {
    let counts = batch_counts();
    for tee in [true, false] {
        let second = if tee { indices(|i| i % 3 == 0) } else { indices(is_late) };
        let name = if tee { "tee" } else { "split" };
        assert!(second.len() > 300, "{name}: the second consumer's result is too small to show anything");
        let mut in_flight_bytes = 0;
        for (unaligned, point, nth) in
            [(false, FaultPoint::ProcessBatch, 300), (true, FaultPoint::Snapshot, 5), (true, FaultPoint::SinkCommit, 4)]
        {
            let what =
                format!("{name}, {}, failure at {point:?} #{nth}", if unaligned { "unaligned" } else { "aligned" });
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir.path()).unwrap()), "forks-v1");
            cfg.checkpoint.interval_ms = Some(5);
            cfg.checkpoint.unaligned = unaligned;
            cfg.batch_size = 16;
            cfg.channel_capacity = 2;
            cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 };
            let seen = Arc::new(AtomicU64::new(0));
            cfg.faults = Faults::new(move |p| p == point && seen.fetch_add(1, Ordering::SeqCst) + 1 == nth);
            let [a, b] = stores();
            let report = cutline::run(&job(tee, [a.clone(), b.clone()]), cfg).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(report.restarts >= 1, "{what}: the failure was never injected");
            in_flight_bytes += report.checkpoints.iter().map(|c| c.channel_state_bytes).sum::<u64>();
            check(&format!("{what}: window counts"), &committed(&a), &counts);
            check(&format!("{what}: second consumer"), &committed(&b), &second);
        }
        assert!(in_flight_bytes > 0, "{name}: no unaligned checkpoint held records in flight");
    }
}

#[test]
fn a_fork_with_a_branch_left_unconsumed_is_refused_when_the_job_is_built() {
    let job = Job::new("half-fork");
    let (a, _b) = job.source("events", GeneratorSource::new(10, event)).tee();
    a.map(|e: Event| e.2.to_string()).sink("out", MemoryTxnSink::new(Arc::new(Mutex::new(MemoryTxnStore::default()))));
    drop(_b);
    let err = job.build().err().expect("a fork with an unconsumed branch was accepted").to_string();
    assert!(err.contains("never consumed") && err.contains("events"), "{err}");
}

#[test]
fn split_sends_left_and_right_records_to_their_own_consumers() {
    let job = Job::new("split");
    let [l, r] = stores();
    let (evens, odds) = job
        .source("numbers", GeneratorSource::new(1_000, |i| if i % 2 == 0 { Either::Left(i) } else { Either::Right(i) }))
        .split();
    evens.map(|i: u64| i.to_string()).sink("evens", MemoryTxnSink::new(l.clone()));
    odds.map(|i: u64| i.to_string()).sink("odds", MemoryTxnSink::new(r.clone()));
    let dir = tempfile::tempdir().unwrap();
    cutline::run(&job.build().unwrap(), RunConfig::new(Arc::new(LocalDirStore::open(dir.path()).unwrap()), "split-v1"))
        .unwrap();
    check("evens", &committed(&l), &indices(|i| i < 1_000 && i % 2 == 0));
    check("odds", &committed(&r), &indices(|i| i < 1_000 && i % 2 == 1));
}
