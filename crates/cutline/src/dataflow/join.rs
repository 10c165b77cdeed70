//! Event-time joins of two keyed streams ([`KeyedStream::join`]): a window join (pairs of records
//! with the same key in the same window) and an interval join (pairs whose times are at most a
//! given distance apart).
//!
//! The window join is the window operator over both inputs with the window's records of each side
//! as its accumulator, so it has every kind of window (sessions merge both sides' records); a
//! window's pairs are emitted once, when the watermark reaches its end. The interval join keeps
//! each record only as long as a record of the other side that is not late can still match it,
//! and emits a pair as soon as its second record arrives. Records that arrive late (at or below the
//! operator's watermark; for the window join, after their windows closed) are dropped and counted
//! in a warning.

use super::api::{Either, KeyedStream, Stream};
use super::keyed::{KeyedProcess, Output};
use super::window::{Window, Windows};
use crate::channel::Data;
use crate::state::{Key, StateValue};
use cutline_core::watermark::EventTime;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

type Time<T> = Arc<dyn Fn(&T) -> EventTime + Send + Sync>;
/// Both inputs of a join as one keyed stream, with each side's time.
type Connected<K, A, B> = (KeyedStream<K, Either<A, B>>, Time<A>, Time<B>);

/// Two keyed streams to be joined by event time ([`KeyedStream::join`]): choose the join next.
pub struct JoinedStreams<K, A, B> {
    left: KeyedStream<K, A>,
    right: KeyedStream<K, B>,
    left_time: Time<A>,
    right_time: Time<B>,
}

impl<K: Key, A: Data> KeyedStream<K, A> {
    /// Join this stream with `other` by key and event time; `left_time` and `right_time` read a
    /// record's event time (as the streams' [`WatermarkStrategy`](crate::WatermarkStrategy) does).
    /// Both streams need watermarks: without them pairs appear only at the end of a bounded input.
    /// The join runs at this stream's parallelism.
    pub fn join<B: Data>(
        self,
        other: KeyedStream<K, B>,
        left_time: impl Fn(&A) -> EventTime + Send + Sync + 'static,
        right_time: impl Fn(&B) -> EventTime + Send + Sync + 'static,
    ) -> JoinedStreams<K, A, B> {
        JoinedStreams { left: self, right: other, left_time: Arc::new(left_time), right_time: Arc::new(right_time) }
    }
}

impl<K: Key, A: StateValue, B: StateValue> JoinedStreams<K, A, B> {
    /// Both inputs as one keyed stream of `Either`, keyed at the left stream's parallelism.
    fn connected(self) -> Connected<K, A, B> {
        let (lk, rk) = (self.left.key.clone(), self.right.key.clone());
        let parallelism = self.left.parallelism;
        let mut keyed = self.left.stream.connect(self.right.stream).key_by(move |a: &A| lk(a), move |b: &B| rk(b));
        keyed.parallelism = parallelism;
        (keyed, self.left_time, self.right_time)
    }

    /// Window join: for every window of `windows` and key, `join` of every pair of a left and a
    /// right record in it, emitted when the watermark reaches the window's end (inner join: a
    /// window with records of one side only emits nothing). A pair is in as many windows as both
    /// its records are (sliding windows). Both sides' records of an open window are kept in its
    /// state. `uid` names the state.
    pub fn window<O: Data>(
        self,
        uid: &str,
        windows: Windows,
        join: impl Fn(&K, &Window, &A, &B) -> O + Send + Sync + 'static,
    ) -> Stream<O> {
        let (keyed, lt, rt) = self.connected();
        let time = move |e: &Either<A, B>| match e {
            Either::Left(a) => lt(a),
            Either::Right(b) => rt(b),
        };
        keyed
            .window(windows, time)
            .aggregate(
                uid,
                || (Vec::new(), Vec::new()),
                |acc: &mut (Vec<A>, Vec<B>), e: &Either<A, B>| match e {
                    Either::Left(a) => acc.0.push(a.clone()),
                    Either::Right(b) => acc.1.push(b.clone()),
                },
                |acc, other| {
                    acc.0.extend(other.0);
                    acc.1.extend(other.1);
                },
                move |k, w, (ls, rs)| {
                    let mut pairs = Vec::with_capacity(ls.len() * rs.len());
                    for a in ls {
                        pairs.extend(rs.iter().map(|b| join(k, w, a, b)));
                    }
                    pairs
                },
            )
            .flat_map(|pairs: Vec<O>, out: &mut Vec<O>| out.extend(pairs))
    }

    /// Interval join: `join` of every left record `a` and right record `b` of the same key with
    /// `time(a) + lower_ms <= time(b) <= time(a) + upper_ms`, emitted when the second of the two
    /// arrives. A record is kept only until the watermark shows that no record of the other side
    /// can still match it. `lower_ms` may be negative (the right record earlier than the left);
    /// `lower_ms > upper_ms` is refused when the job is built. `uid` names the state.
    pub fn interval<O: Data>(
        self,
        uid: &str,
        lower_ms: i64,
        upper_ms: i64,
        join: impl Fn(&K, &A, &B) -> O + Send + Sync + 'static,
    ) -> Stream<O> {
        let bound = i64::MAX / 4;
        let (keyed, left_time, right_time) = self.connected();
        if lower_ms > upper_ms || lower_ms.abs() > bound || upper_ms.abs() > bound {
            keyed.stream.job.push_error(format!(
                "{uid}: interval join bounds {lower_ms} ms to {upper_ms} ms: the lower bound must not be above the upper one, and both within ±{bound} ms"
            ));
        }
        let logic = IntervalJoin {
            uid: uid.to_string(),
            lower_ms,
            upper_ms,
            left_time,
            right_time,
            join: Arc::new(join),
            dropped: AtomicU64::new(0),
        };
        keyed.process_with(uid, logic)
    }
}

/// One key's records of each side of an interval join that can still match, sorted by time.
#[derive(Clone, Serialize, Deserialize)]
struct IntervalState<A, B> {
    left: Vec<(EventTime, A)>,
    right: Vec<(EventTime, B)>,
}

type JoinFn<K, A, B, O> = Arc<dyn Fn(&K, &A, &B) -> O + Send + Sync>;

struct IntervalJoin<K, A, B, O> {
    uid: String,
    lower_ms: i64,
    upper_ms: i64,
    left_time: Time<A>,
    right_time: Time<B>,
    join: JoinFn<K, A, B, O>,
    /// Late records dropped (shared by the operator's subtasks in this process).
    dropped: AtomicU64,
}

/// `t + ms` in event time, saturating.
fn shift(t: EventTime, ms: i64) -> EventTime {
    EventTime(t.0.saturating_add(ms))
}

/// Insert `(t, x)` into `v`, kept sorted by time (after records of the same time: arrival order).
fn insert_sorted<X>(v: &mut Vec<(EventTime, X)>, t: EventTime, x: X) {
    let at = v.partition_point(|(u, _)| *u <= t);
    v.insert(at, (t, x));
}

/// The records of `v` with times in `[from, to]`.
fn in_range<X>(v: &[(EventTime, X)], from: EventTime, to: EventTime) -> &[(EventTime, X)] {
    let start = v.partition_point(|(u, _)| *u < from);
    let end = v.partition_point(|(u, _)| *u <= to);
    &v[start..end.max(start)]
}

impl<K: Key, A: StateValue, B: StateValue, O: Send + 'static> IntervalJoin<K, A, B, O> {
    fn late(&self) {
        let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                operator = %self.uid,
                dropped = n,
                "late records dropped by an interval join: they arrived at or below its watermark; raise the watermark's out-of-orderness"
            );
        }
    }
}

impl<K: Key, A: StateValue, B: StateValue, O: Send + 'static> KeyedProcess<K, Either<A, B>, O>
    for IntervalJoin<K, A, B, O>
{
    type State = IntervalState<A, B>;

    fn process(&self, key: &K, state: &mut Option<Self::State>, record: Either<A, B>, out: &mut Output<O>) {
        let watermark = out.watermark();
        let st = state.get_or_insert_with(|| IntervalState { left: Vec::new(), right: Vec::new() });
        match record {
            Either::Left(a) => {
                let t = (self.left_time)(&a);
                if t <= watermark {
                    return self.late();
                }
                for (_, b) in in_range(&st.right, shift(t, self.lower_ms), shift(t, self.upper_ms)) {
                    out.emit((self.join)(key, &a, b));
                }
                // Right records still to come are above the watermark: `a` can match one only
                // while the watermark is below `t + upper`.
                let dead_at = shift(t, self.upper_ms);
                if dead_at > watermark {
                    out.set_timer(dead_at);
                    insert_sorted(&mut st.left, t, a);
                }
            }
            Either::Right(b) => {
                let t = (self.right_time)(&b);
                if t <= watermark {
                    return self.late();
                }
                for (_, a) in in_range(&st.left, shift(t, -self.upper_ms), shift(t, -self.lower_ms)) {
                    out.emit((self.join)(key, a, &b));
                }
                let dead_at = shift(t, -self.lower_ms);
                if dead_at > watermark {
                    out.set_timer(dead_at);
                    insert_sorted(&mut st.right, t, b);
                }
            }
        }
        if st.left.is_empty() && st.right.is_empty() {
            *state = None;
        }
    }

    fn on_timer(&self, _key: &K, state: &mut Option<Self::State>, time: EventTime, _out: &mut Output<O>) {
        let Some(st) = state.as_mut() else { return };
        // The watermark reached `time`: drop the records no later record can match.
        let left_dead = st.left.partition_point(|(t, _)| shift(*t, self.upper_ms) <= time);
        st.left.drain(..left_dead);
        let right_dead = st.right.partition_point(|(t, _)| shift(*t, -self.lower_ms) <= time);
        st.right.drain(..right_dead);
        if st.left.is_empty() && st.right.is_empty() {
            *state = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_range_is_inclusive_at_both_ends_and_empty_when_reversed() {
        let v: Vec<(EventTime, u8)> = [1, 3, 3, 5, 9].iter().map(|t| (EventTime(*t), *t as u8)).collect();
        let times = |from, to| in_range(&v, EventTime(from), EventTime(to)).iter().map(|x| x.1).collect::<Vec<_>>();
        assert_eq!(times(3, 5), [3, 3, 5]);
        assert_eq!(times(2, 2), Vec::<u8>::new());
        assert_eq!(times(5, 3), Vec::<u8>::new());
        assert_eq!(times(-10, 100), [1, 3, 3, 5, 9]);
        let mut w = v.clone();
        insert_sorted(&mut w, EventTime(3), 33);
        assert_eq!(w.iter().map(|x| x.1).collect::<Vec<_>>(), [1, 3, 3, 33, 5, 9]);
    }
}
