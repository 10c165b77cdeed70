//! The simulated job and what a run without failures produces.

use super::SimOptions;
use crate::connectors::{GeneratorSource, MemoryMarkerSink, MemoryTxnSink, MemoryTxnStore};
use crate::dataflow::{Either, Job, JobGraph, KeyedProcess, Output};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

pub(super) fn left_key(i: u64, keys: u64) -> u64 {
    i % keys
}
pub(super) fn right_key(i: u64, keys: u64) -> u64 {
    (i * 3 + 1) % keys
}
pub(super) fn rules_key(i: u64, keys: u64) -> u64 {
    (i * 5 + 2) % keys
}

/// The join of the simulated job: counts each key's records of both inputs, emits the new count after
/// every record, and once per key at the end of the input its totals (`E:key:left:right`), which must be
/// committed exactly once whatever fails around the final checkpoint.
struct Join;

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
        match rec {
            Either::Left(_) => {
                s.0 += 1;
                out.emit(format!("L:{k}:{}", s.0));
            }
            Either::Right(_) => {
                s.1 += 1;
                out.emit(format!("R:{k}:{}", s.1));
            }
        }
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
/// operator whose state both inputs share, then a map and a transactional sink.
pub(super) fn sim_job(o: &SimOptions, out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let keys = o.keys;
    let job = Job::new("sim");
    job.set_parallelism(2).set_max_parallelism(16);
    let left =
        job.source_with_parallelism("left", 2, GeneratorSource::new(o.left_records, move |i| (left_key(i, keys), i)));
    // A broadcast edge: every "rules" record reaches the join once through each of the 2 subtasks of
    // "rules-b", unioned into the left input.
    let rules = job
        .source_with_parallelism("rules", 1, GeneratorSource::new(o.rules_records, move |i| (rules_key(i, keys), i)))
        .broadcast("rules-b", 2);
    // A forward edge on the right input.
    let right = job
        .source_with_parallelism("right", 1, GeneratorSource::new(o.right_records, move |i| (right_key(i, keys), i)))
        .forward("right-fwd");
    let spread = left
        .union(rules)
        .connect(right)
        .key_by(|l: &(u64, u64)| l.0, |r: &(u64, u64)| r.0)
        .process_with("join", Join)
        // A rebalance edge from 2 to 3 subtasks, then the sink fused into them.
        .rebalance("spread", 3)
        .map(|s: String| s);
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
    for (k, (l, r)) in expected_counts(o) {
        out.extend((1..=l).map(|n| format!("L:{k}:{n}")));
        out.extend((1..=r).map(|n| format!("R:{k}:{n}")));
        out.push(format!("E:{k}:{l}:{r}"));
    }
    out.sort();
    out
}
