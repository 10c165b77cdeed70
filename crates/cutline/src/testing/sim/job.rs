//! The simulated job and what a run without failures produces.

use super::SimOptions;
use crate::connectors::{GeneratorSource, MemoryMarkerSink, MemoryTxnSink, MemoryTxnStore};
use crate::dataflow::{Either, Job, JobGraph, KeyedProcess, Output, WatermarkStrategy};
use cutline_core::watermark::EventTime;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

pub(super) fn left_key(i: u64, keys: u64) -> u64 {
    i % keys
}
pub(super) fn right_key(i: u64, keys: u64) -> u64 {
    (i * 3 + 1) % keys
}
/// Every third rules record has a key of its own (`keys + i`): the join sees it twice (once
/// through each broadcast subtask) and removes the key's state at the second, so checkpoints carry
/// removals and a restore that drops one brings the key back.
pub(super) fn rules_key(i: u64, keys: u64) -> u64 {
    if is_removed_key(i) {
        keys + i
    } else {
        (i * 5 + 2) % keys
    }
}

fn is_removed_key(rules_index: u64) -> bool {
    rules_index.is_multiple_of(3)
}

/// Whether `k` is a key of its own of one rules record, whose state the join removes at its second
/// record: `(2, 0)` is then no state at all.
pub(super) fn removed_at(k: u64, counts: (u64, u64), keys: u64) -> bool {
    k >= keys && counts == (2, 0)
}

/// The join of the simulated job: counts each key's records of both inputs, emits the new count after
/// every record, and once per key at the end of the input its totals (`E:key:left:right`), which must be
/// committed exactly once whatever fails around the final checkpoint. Event time: a record's is its
/// index, increasing in every source subtask, so no record is ever late however inputs interleave; each
/// record sets its key's timer at the end of its 10 ms window, and each timer, when the watermark
/// passes it, emits `T:key:time`: once per key and window in any correct run. The state of a rules
/// record's own key ([`rules_key`]) is removed at its second record.
struct Join {
    keys: u64,
}

/// Event time in the simulated job: the index of a record in its source.
fn event_time(r: &(u64, u64)) -> EventTime {
    EventTime(r.1 as i64)
}

/// The timer a record at event time `t` sets: the last millisecond of its 10 ms window.
fn window_end(t: u64) -> u64 {
    t - t % 10 + 9
}

fn watermarks() -> WatermarkStrategy<(u64, u64)> {
    WatermarkStrategy::bounded_out_of_orderness(0, event_time)
}

impl KeyedProcess<u64, Either<(u64, u64), (u64, u64)>, String> for Join {
    type State = (u64, u64);
    fn process(
        &self,
        k: &u64,
        state: &mut Option<(u64, u64)>,
        rec: Either<(u64, u64), (u64, u64)>,
        out: &mut Output<String>,
    ) {
        let s = state.get_or_insert((0, 0));
        let (Either::Left((_, i)) | Either::Right((_, i))) = rec;
        out.set_timer(EventTime(window_end(i) as i64));
        match rec {
            Either::Left(_) => {
                s.0 += 1;
                out.emit(format!("L:{k}:{}", s.0));
                if removed_at(*k, *s, self.keys) {
                    *state = None;
                }
            }
            Either::Right(_) => {
                s.1 += 1;
                out.emit(format!("R:{k}:{}", s.1));
            }
        }
    }
    fn on_timer(&self, k: &u64, _state: &mut Option<(u64, u64)>, time: EventTime, out: &mut Output<String>) {
        out.emit(format!("T:{k}:{}", time.0));
    }
    fn end_of_input(&self, k: &u64, state: &mut Option<(u64, u64)>, out: &mut Output<String>) {
        if let Some((l, r)) = state {
            out.emit(format!("E:{k}:{l}:{r}"));
        }
    }
}

/// An end-of-input line `E:key:left:right` as (key, left, right).
pub(super) fn parse_totals(line: &str) -> Option<(u64, u64, u64)> {
    let mut it = line.strip_prefix("E:")?.split(':').map(|p| p.parse::<u64>().ok());
    Some((it.next()??, it.next()??, it.next()??))
}

/// The simulated job: two sources of different parallelism, connected into one keyed two-input
/// operator whose state both inputs share, then forked: a map and a transactional sink behind a
/// rebalance edge, and a second transactional sink fused into the operator's tasks.
pub(super) fn sim_job(o: &SimOptions, out: Arc<Mutex<MemoryTxnStore>>, copy: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let keys = o.keys;
    let job = Job::new("sim");
    job.set_parallelism(2).set_max_parallelism(16);
    let left = job
        .source_with_parallelism("left", 2, GeneratorSource::new(o.left_records, move |i| (left_key(i, keys), i)))
        .with_watermarks("left-wm", watermarks());
    // A broadcast edge: every "rules" record reaches the join once through each of the 2 subtasks of
    // "rules-b", unioned into the left input.
    let rules = job
        .source_with_parallelism("rules", 1, GeneratorSource::new(o.rules_records, move |i| (rules_key(i, keys), i)))
        .with_watermarks("rules-wm", watermarks())
        .broadcast("rules-b", 2);
    // A forward edge on the right input.
    let right = job
        .source_with_parallelism("right", 1, GeneratorSource::new(o.right_records, move |i| (right_key(i, keys), i)))
        .with_watermarks("right-wm", watermarks())
        .forward("right-fwd");
    let spread = left
        .union(rules)
        .connect(right)
        .key_by(|l: &(u64, u64)| l.0, |r: &(u64, u64)| r.0)
        .process_with("join", Join { keys });
    // A fork: every line of the join also goes to a second sink fused into the join's tasks, which
    // must commit exactly what the first one does.
    let (spread, copied) = spread.tee();
    copied.map(|s: String| s).sink("copy", MemoryTxnSink::new(copy));
    // A rebalance edge from 2 to 3 subtasks, then the sink fused into them.
    let spread = spread.rebalance("spread", 3).map(|s: String| s);
    // The sink in the design of the PostgreSQL sink (prepared transactions) or the Kafka sink
    // (records in the checkpoint, a marker written with them).
    if o.marker_sink {
        spread.sink("out", MemoryMarkerSink::new(out));
    } else {
        spread.sink("out", MemoryTxnSink::new(out));
    }
    job.build().expect("sim job is valid")
}

/// Per key, how many left-input and right-input records the join sees in a run without failures
/// (rules records count twice: they arrive through both broadcast subtasks).
fn expected_counts(o: &SimOptions) -> BTreeMap<u64, (u64, u64)> {
    let mut want: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for i in 0..o.left_records {
        want.entry(left_key(i, o.keys)).or_default().0 += 1;
    }
    for i in 0..o.rules_records {
        want.entry(rules_key(i, o.keys)).or_default().0 += 2;
    }
    for i in 0..o.right_records {
        want.entry(right_key(i, o.keys)).or_default().1 += 1;
    }
    want
}

/// The committed output of a run without failures, sorted.
pub(super) fn expected_output(o: &SimOptions) -> Vec<String> {
    let mut out = Vec::new();
    let mut timers = std::collections::BTreeSet::new();
    for (n, key) in
        [(o.left_records, left_key as fn(u64, u64) -> u64), (o.rules_records, rules_key), (o.right_records, right_key)]
    {
        timers.extend((0..n).map(|i| (key(i, o.keys), window_end(i))));
    }
    out.extend(timers.into_iter().map(|(k, t)| format!("T:{k}:{t}")));
    for (k, (l, r)) in expected_counts(o) {
        out.extend((1..=l).map(|n| format!("L:{k}:{n}")));
        out.extend((1..=r).map(|n| format!("R:{k}:{n}")));
        if !removed_at(k, (l, r), o.keys) {
            out.push(format!("E:{k}:{l}:{r}"));
        }
    }
    out.sort();
    out
}
