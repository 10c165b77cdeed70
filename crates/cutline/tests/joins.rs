//! Event-time joins of two keyed streams (`KeyedStream::join`): window joins over tumbling, sliding
//! and session windows, and interval joins with bounds on either side of zero. Each case runs at
//! keyed parallelism 2 from two sources of out-of-order events, with a failure at a protocol step
//! under aligned and unaligned checkpoints, and its committed pairs must equal a nested-loop batch
//! computation of the same join over the same events (none of them is late).

use cutline::{
    EventTime, FaultPoint, Faults, GeneratorSource, Job, JobGraph, LocalDirStore, MemoryTxnSink, MemoryTxnStore,
    RestartStrategy, RunConfig, Stream, WatermarkStrategy, Windows,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Events per side.
const N: u64 = 3_000;
const KEYS: u64 = 5;
/// How the events of both sides lie in event time.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// How far out of order the events are (up to one less than this), and the watermarks' bound:
    /// none is late, and many arrive just above the watermark, where a join that forgets a record
    /// too early misses pairs. With 0, each source subtask's events are in time order and every
    /// record arrives within a few milliseconds of its side's watermark.
    ooo_ms: u64,
    /// How far the right side's times run ahead of the left's: with a lead, the left side holds the
    /// watermark back, so left records arrive just above it (where forgetting right records too
    /// early shows), and right records far above it.
    right_lead_ms: i64,
}

const SHAPES: [Shape; 3] = [
    Shape { ooo_ms: 200, right_lead_ms: 0 },
    Shape { ooo_ms: 0, right_lead_ms: 0 },
    Shape { ooo_ms: 0, right_lead_ms: 400 },
];

/// An event: (key, event time, index).
type Event = (u64, i64, u64);

/// Event `i` of either side before its jitter: bursts of 100 events 2 ms apart, 300 ms between
/// bursts (so that session windows close), dense so that a source batch spans less event time than
/// the out-of-orderness.
fn burst_time(i: u64) -> i64 {
    (i * 2 + (i / 100) * 300) as i64
}

fn jitter(i: u64, ooo_ms: u64) -> i64 {
    cutline::splitmix64(i).checked_rem(ooo_ms).unwrap_or(0) as i64
}

fn left(i: u64, s: Shape) -> Event {
    (i % KEYS, burst_time(i) - jitter(i, s.ooo_ms), i)
}

fn right(j: u64, s: Shape) -> Event {
    ((j * 3) % KEYS, burst_time(j) + 1 + s.right_lead_ms - jitter(j ^ 0x5151, s.ooo_ms), j)
}

#[derive(Clone, Copy, Debug)]
enum Join {
    Window(Windows),
    Interval { lower_ms: i64, upper_ms: i64 },
}

const CASES: [Join; 6] = [
    Join::Window(Windows::Tumbling { size_ms: 100 }),
    Join::Window(Windows::Sliding { size_ms: 100, slide_ms: 50 }),
    Join::Window(Windows::Session { gap_ms: 40 }),
    Join::Interval { lower_ms: -30, upper_ms: 20 },
    Join::Interval { lower_ms: 1, upper_ms: 1 },
    Join::Interval { lower_ms: 15, upper_ms: 90 },
];

fn side(job: &Job, name: &str, shape: Shape, f: fn(u64, Shape) -> Event) -> Stream<Event> {
    job.source_with_parallelism(name, 2, GeneratorSource::new(N, move |i| f(i, shape)))
        .with_watermarks(
            &format!("{name}-wm"),
            WatermarkStrategy::bounded_out_of_orderness(shape.ooo_ms, |e: &Event| EventTime(e.1)),
        )
        .map(|e: Event| {
            // Slow enough that channels fill and checkpoints happen during a run.
            if e.2.is_multiple_of(8) {
                std::thread::sleep(std::time::Duration::from_micros(5));
            }
            e
        })
}

/// left, right -> join by key -> sink; a pair is `l<i>-r<j>` (and its window for window joins).
fn job(join: Join, shape: Shape, out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let job = Job::new("joins");
    let l = side(&job, "left", shape, left).key_by(|e: &Event| e.0).parallelism(2);
    let r = side(&job, "right", shape, right).key_by(|e: &Event| e.0);
    let joined = l.join(r, |e: &Event| EventTime(e.1), |e: &Event| EventTime(e.1));
    let pairs = match join {
        Join::Window(w) => joined
            .window("pairs", w, |_k, w, a: &Event, b: &Event| format!("{}..{} l{}-r{}", w.start.0, w.end.0, a.2, b.2)),
        Join::Interval { lower_ms, upper_ms } => {
            joined.interval("pairs", lower_ms, upper_ms, |_k, a: &Event, b: &Event| format!("l{}-r{}", a.2, b.2))
        }
    };
    pairs.sink_with_parallelism("out", 1, MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

/// The join computed directly: every pair of a key's left and right events that qualifies.
fn reference(join: Join, shape: Shape) -> Vec<String> {
    let mut by_key: BTreeMap<u64, (Vec<Event>, Vec<Event>)> = BTreeMap::new();
    for i in 0..N {
        let (a, b) = (left(i, shape), right(i, shape));
        by_key.entry(a.0).or_default().0.push(a);
        by_key.entry(b.0).or_default().1.push(b);
    }
    let mut rows = Vec::new();
    for (ls, rs) in by_key.values() {
        match join {
            Join::Interval { lower_ms, upper_ms } => {
                for a in ls {
                    for b in rs.iter().filter(|b| a.1 + lower_ms <= b.1 && b.1 <= a.1 + upper_ms) {
                        rows.push(format!("l{}-r{}", a.2, b.2));
                    }
                }
            }
            Join::Window(Windows::Session { gap_ms }) => {
                // Sessions over both sides' times: a new one where the next time is more than the
                // gap after the last (windows [t, t + gap) that touch merge).
                let mut all: Vec<(i64, bool, u64)> =
                    ls.iter().map(|a| (a.1, true, a.2)).chain(rs.iter().map(|b| (b.1, false, b.2))).collect();
                all.sort();
                let mut sessions: Vec<Vec<(i64, bool, u64)>> = Vec::new();
                for e in all {
                    match sessions.last_mut() {
                        Some(s) if e.0 <= s.last().unwrap().0 + gap_ms as i64 => s.push(e),
                        _ => sessions.push(vec![e]),
                    }
                }
                for s in sessions {
                    let (start, end) = (s[0].0, s.last().unwrap().0 + gap_ms as i64);
                    for a in s.iter().filter(|e| e.1) {
                        for b in s.iter().filter(|e| !e.1) {
                            rows.push(format!("{start}..{end} l{}-r{}", a.2, b.2));
                        }
                    }
                }
            }
            Join::Window(w) => {
                let (size, slide) = match w {
                    Windows::Tumbling { size_ms } => (size_ms as i64, size_ms as i64),
                    Windows::Sliding { size_ms, slide_ms } => (size_ms as i64, slide_ms as i64),
                    Windows::Session { .. } => unreachable!(),
                };
                // Windows [s, s + size) for every multiple s of the slide.
                let starts = |t: i64| {
                    let last = t - t.rem_euclid(slide);
                    (0..).map(move |n| last - n * slide).take_while(move |s| *s > t - size)
                };
                for a in ls {
                    for s in starts(a.1) {
                        for b in rs.iter().filter(|b| s <= b.1 && b.1 < s + size) {
                            rows.push(format!("{s}..{} l{}-r{}", s + size, a.2, b.2));
                        }
                    }
                }
            }
        }
    }
    rows.sort();
    rows
}

fn config(dir: &std::path::Path, unaligned: bool) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), "joins-v1");
    cfg.checkpoint.interval_ms = Some(5);
    cfg.checkpoint.unaligned = unaligned;
    cfg.batch_size = 2;
    cfg.channel_capacity = 2;
    cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 };
    cfg
}

/// `got` equals `want` (both sorted); on a difference, what is missing and extra, briefly.
fn assert_same(got: &[String], want: &[String], what: &str) {
    if got == want {
        return;
    }
    let count = |v: &[String]| {
        let mut m: BTreeMap<String, i64> = BTreeMap::new();
        for r in v {
            *m.entry(r.clone()).or_default() += 1;
        }
        m
    };
    let (g, w) = (count(got), count(want));
    let more = |a: &BTreeMap<String, i64>, b: &BTreeMap<String, i64>| -> Vec<String> {
        a.iter().filter(|(r, n)| b.get(*r).copied().unwrap_or(0) < **n).map(|(r, _)| r.clone()).take(5).collect()
    };
    panic!(
        "{what}: {} pairs, expected {}; missing: {:?}; extra: {:?}",
        got.len(),
        want.len(),
        more(&w, &g),
        more(&g, &w)
    );
}

#[test]
fn joins_after_a_failure_equal_the_nested_loop_join_aligned_and_unaligned() {
    let mut in_flight_bytes = 0;
    for (join, shape) in CASES.iter().flat_map(|j| SHAPES.map(|s| (*j, s))) {
        let want = reference(join, shape);
        println!("{join:?}, {shape:?}: {} pairs", want.len());
        assert!(want.len() > 40, "{join:?}: only {} pairs in the reference: the case tests little", want.len());
        for (unaligned, point, nth) in
            [(false, FaultPoint::ProcessBatch, 150), (true, FaultPoint::Snapshot, 4), (true, FaultPoint::SinkCommit, 2)]
        {
            let what = format!(
                "{join:?}, {shape:?}, {} checkpoints, failure at {point:?} #{nth}",
                if unaligned { "unaligned" } else { "aligned" }
            );
            let dir = tempfile::tempdir().unwrap();
            let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
            let mut cfg = config(dir.path(), unaligned);
            let seen = Arc::new(AtomicU64::new(0));
            cfg.faults = Faults::new(move |p| p == point && seen.fetch_add(1, Ordering::SeqCst) + 1 == nth);
            let report = cutline::run(&job(join, shape, out.clone()), cfg).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(report.restarts >= 1, "{what}: the failure was never injected");
            if unaligned {
                in_flight_bytes += report.checkpoints.iter().map(|c| c.channel_state_bytes).sum::<u64>();
            }
            let mut got = out.lock().unwrap().committed_records();
            got.sort();
            assert_same(&got, &want, &what);
        }
    }
    assert!(in_flight_bytes > 0, "no unaligned checkpoint held records in flight: those runs prove little");
}

#[test]
fn an_interval_join_with_its_bounds_reversed_is_refused_when_the_job_is_built() {
    let job = Job::new("bad-join");
    let l = side(&job, "left", SHAPES[1], left).key_by(|e: &Event| e.0);
    let r = side(&job, "right", SHAPES[1], right).key_by(|e: &Event| e.0);
    l.join(r, |e: &Event| EventTime(e.1), |e: &Event| EventTime(e.1))
        .interval("pairs", 10, -10, |_k, a: &Event, b: &Event| format!("l{}-r{}", a.2, b.2))
        .sink("out", MemoryTxnSink::new(Arc::new(Mutex::new(MemoryTxnStore::default()))));
    let err = job.build().err().expect("reversed bounds accepted").to_string();
    assert!(err.contains("pairs") && err.contains("10 ms to -10 ms"), "{err}");
}
