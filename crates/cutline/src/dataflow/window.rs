//! Event-time windows on keyed streams ([`KeyedStream::window`]): tumbling, sliding and session
//! windows with incremental aggregation (one accumulator per key and window, never the elements),
//! allowed lateness, and late records either counted and dropped or emitted beside the results.
//!
//! Built on the keyed operator's state and event-time timers: a window's result is emitted when the
//! watermark reaches its last millisecond, its state is dropped when the watermark passes that plus
//! the allowed lateness, and a record for a window already emitted (but within the lateness)
//! updates it and emits it again.

use super::api::{Either, KeyedStream, Stream};
use super::keyed::{KeyedProcess, Output};
use crate::channel::Data;
use crate::state::{Key, StateValue};
use cutline_core::watermark::EventTime;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One window: the event times from `start` (inclusive) to `end` (exclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Window {
    /// First millisecond of the window.
    pub start: EventTime,
    /// First millisecond after it.
    pub end: EventTime,
}

impl Window {
    /// The last millisecond in the window: its result is emitted when the watermark reaches it.
    pub fn max_timestamp(&self) -> EventTime {
        self.end.minus_ms(1)
    }
    fn intersects(&self, other: &Window) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

/// How records are assigned to windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Windows {
    /// Consecutive windows of `size_ms`, each record in exactly one (starts at multiples of the
    /// size, counted from event time 0).
    Tumbling {
        /// Length of a window.
        size_ms: u64,
    },
    /// Windows of `size_ms` starting every `slide_ms`: a record is in `size_ms / slide_ms` of them.
    Sliding {
        /// Length of a window.
        size_ms: u64,
        /// Distance between window starts.
        slide_ms: u64,
    },
    /// Per key, records closer than `gap_ms` to each other form one window, which ends `gap_ms`
    /// after its last record. Windows merge as records fill the gaps between them.
    Session {
        /// Inactivity that closes a session.
        gap_ms: u64,
    },
}

impl Windows {
    /// Tumbling windows of `size_ms`.
    pub fn tumbling_ms(size_ms: u64) -> Windows {
        Windows::Tumbling { size_ms }
    }
    /// Sliding windows of `size_ms` every `slide_ms`.
    pub fn sliding_ms(size_ms: u64, slide_ms: u64) -> Windows {
        Windows::Sliding { size_ms, slide_ms }
    }
    /// Session windows closed by `gap_ms` of inactivity.
    pub fn session_ms(gap_ms: u64) -> Windows {
        Windows::Session { gap_ms }
    }

    /// Why these windows cannot work, if they cannot.
    fn problem(&self) -> Option<String> {
        let too_big = |ms: u64| ms == 0 || ms > i64::MAX as u64 / 4;
        match *self {
            Windows::Tumbling { size_ms } if too_big(size_ms) => Some(format!("window size {size_ms} ms")),
            Windows::Sliding { size_ms, slide_ms } if too_big(size_ms) || too_big(slide_ms) => {
                Some(format!("window size {size_ms} ms, slide {slide_ms} ms"))
            }
            Windows::Session { gap_ms } if too_big(gap_ms) => Some(format!("session gap {gap_ms} ms")),
            _ => None,
        }
    }

    /// The windows a record at `t` belongs to (a session: its own, before merging).
    fn assign(&self, t: EventTime, out: &mut Vec<Window>) {
        let start_at = |period: u64| EventTime(t.0.saturating_sub(t.0.rem_euclid(period as i64)));
        match *self {
            Windows::Tumbling { size_ms } => {
                let start = start_at(size_ms);
                out.push(Window { start, end: start.plus_ms(size_ms) });
            }
            Windows::Sliding { size_ms, slide_ms } => {
                let mut start = start_at(slide_ms);
                while start > t.minus_ms(size_ms) {
                    out.push(Window { start, end: start.plus_ms(size_ms) });
                    start = start.minus_ms(slide_ms);
                }
            }
            Windows::Session { gap_ms } => out.push(Window { start: t, end: t.plus_ms(gap_ms) }),
        }
    }
}

/// A keyed stream cut into event-time windows: choose the aggregation next.
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    windows: Windows,
    timestamp: Timestamp<T>,
    allowed_lateness_ms: u64,
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Cut each key's records into event-time windows; `timestamp` reads a record's event time (as
    /// the stream's [`WatermarkStrategy`](crate::WatermarkStrategy) does). The stream needs
    /// watermarks ([`Stream::with_watermarks`] upstream): without them results appear only at the
    /// end of a bounded input.
    pub fn window(
        self,
        windows: Windows,
        timestamp: impl Fn(&T) -> EventTime + Send + Sync + 'static,
    ) -> WindowedStream<K, T> {
        WindowedStream { keyed: self, windows, timestamp: Arc::new(timestamp), allowed_lateness_ms: 0 }
    }
}

type Init<A> = Arc<dyn Fn() -> A + Send + Sync>;
type Add<A, T> = Arc<dyn Fn(&mut A, &T) + Send + Sync>;
type Timestamp<T> = Arc<dyn Fn(&T) -> EventTime + Send + Sync>;
type Merge<A> = Arc<dyn Fn(&mut A, A) + Send + Sync>;
type Finish<K, A, O> = Arc<dyn Fn(&K, &Window, &A) -> O + Send + Sync>;

impl<K: Key, T: Data> WindowedStream<K, T> {
    /// Keep a window's state `ms` after its end (in event time): a record that arrives late but
    /// within it updates the window, whose result is emitted again. Default 0.
    pub fn allowed_lateness_ms(mut self, ms: u64) -> Self {
        self.allowed_lateness_ms = ms;
        self
    }

    /// Aggregate each window incrementally: `add` folds a record into the accumulator (from
    /// `init`), `merge` folds one accumulator into another (when session windows merge; tumbling and
    /// sliding windows never call it), `result` makes the record emitted for the window. Late
    /// records (after their windows' lateness) are dropped, and counted in a warning; use
    /// [`WindowedStream::aggregate_with_late`] to receive them. `uid` names the state.
    pub fn aggregate<A: StateValue, O: Send + 'static>(
        self,
        uid: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        add: impl Fn(&mut A, &T) + Send + Sync + 'static,
        merge: impl Fn(&mut A, A) + Send + Sync + 'static,
        result: impl Fn(&K, &Window, &A) -> O + Send + Sync + 'static,
    ) -> Stream<O> {
        let fns = (Arc::new(init) as Init<A>, Arc::new(add) as Add<A, T>, Arc::new(merge) as Merge<A>);
        self.build(uid, fns, Arc::new(result), |o| o, None)
    }

    /// Like [`WindowedStream::aggregate`], with late records emitted as `Either::Right` beside the
    /// window results (`Either::Left`) instead of dropped.
    pub fn aggregate_with_late<A: StateValue, O: Send + 'static>(
        self,
        uid: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        add: impl Fn(&mut A, &T) + Send + Sync + 'static,
        merge: impl Fn(&mut A, A) + Send + Sync + 'static,
        result: impl Fn(&K, &Window, &A) -> O + Send + Sync + 'static,
    ) -> Stream<Either<O, T>> {
        let fns = (Arc::new(init) as Init<A>, Arc::new(add) as Add<A, T>, Arc::new(merge) as Merge<A>);
        self.build(uid, fns, Arc::new(result), Either::Left, Some(Either::Right))
    }

    fn build<A: StateValue, O: Send + 'static, Out: Send + 'static>(
        self,
        uid: &str,
        (init, add, merge): (Init<A>, Add<A, T>, Merge<A>),
        result: Finish<K, A, O>,
        wrap: fn(O) -> Out,
        late: Option<fn(T) -> Out>,
    ) -> Stream<Out> {
        if let Some(p) = self.windows.problem() {
            self.keyed.stream.job.push_error(format!("{uid}: {p}: it must be 1 ms to {} ms", i64::MAX / 4));
        }
        let logic = WindowProcess {
            uid: uid.to_string(),
            windows: self.windows,
            timestamp: self.timestamp,
            lateness_ms: self.allowed_lateness_ms,
            init,
            add,
            merge,
            result,
            wrap,
            late,
            dropped: AtomicU64::new(0),
        };
        self.keyed.process_with(uid, logic)
    }
}

/// One key's open windows and their accumulators, ordered by window.
type WindowState<A> = Vec<(Window, A)>;

struct WindowProcess<K, T, A, O, Out> {
    uid: String,
    windows: Windows,
    timestamp: Timestamp<T>,
    lateness_ms: u64,
    init: Init<A>,
    add: Add<A, T>,
    merge: Merge<A>,
    result: Finish<K, A, O>,
    wrap: fn(O) -> Out,
    late: Option<fn(T) -> Out>,
    /// Late records dropped (shared by the operator's subtasks in this process).
    dropped: AtomicU64,
}

impl<K: Key, T: Data, A: StateValue, O: Send + 'static, Out: Send + 'static> WindowProcess<K, T, A, O, Out> {
    fn cleanup_time(&self, w: &Window) -> EventTime {
        w.max_timestamp().plus_ms(self.lateness_ms)
    }

    /// Timers for a window that is open: its result at its end, its cleanup after the lateness.
    fn arm(&self, w: &Window, out: &mut Output<Out>) {
        out.set_timer(w.max_timestamp());
        if self.lateness_ms > 0 {
            out.set_timer(self.cleanup_time(w));
        }
    }

    fn disarm(&self, w: &Window, out: &mut Output<Out>) {
        out.cancel_timer(w.max_timestamp());
        if self.lateness_ms > 0 {
            out.cancel_timer(self.cleanup_time(w));
        }
    }

    fn emit(&self, key: &K, w: &Window, acc: &A, out: &mut Output<Out>) {
        out.emit((self.wrap)((self.result)(key, w, acc)));
    }

    fn late(&self, record: T, out: &mut Output<Out>) {
        match self.late {
            Some(f) => out.emit(f(record)),
            None => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(
                        operator = %self.uid,
                        dropped = n,
                        "late records dropped: they arrived after their windows closed; raise the allowed lateness or the watermark's out-of-orderness, or use aggregate_with_late to receive them"
                    );
                }
            }
        }
    }

    /// Add `record` to its session window `w`, merging every open window it touches.
    fn add_to_session(&self, key: &K, state: &mut WindowState<A>, mut w: Window, record: &T, out: &mut Output<Out>) {
        let mut acc = (self.init)();
        (self.add)(&mut acc, record);
        let mut i = 0;
        while i < state.len() {
            if state[i].0.intersects(&w) {
                let (old, old_acc) = state.remove(i);
                self.disarm(&old, out);
                w = Window { start: w.start.min(old.start), end: w.end.max(old.end) };
                (self.merge)(&mut acc, old_acc);
            } else {
                i += 1;
            }
        }
        let at = state.partition_point(|(x, _)| *x < w);
        self.finish_update(key, &w, &acc, out);
        state.insert(at, (w, acc));
    }

    /// A window changed: arm its timers, or emit it again if its end already passed.
    fn finish_update(&self, key: &K, w: &Window, acc: &A, out: &mut Output<Out>) {
        self.arm(w, out);
        if w.max_timestamp() <= out.watermark() {
            self.emit(key, w, acc, out);
        }
    }
}

impl<K: Key, T: Data, A: StateValue, O: Send + 'static, Out: Send + 'static> KeyedProcess<K, T, Out>
    for WindowProcess<K, T, A, O, Out>
{
    type State = WindowState<A>;

    fn process(&self, key: &K, state: &mut Option<WindowState<A>>, record: T, out: &mut Output<Out>) {
        let t = (self.timestamp)(&record);
        let mut assigned = Vec::new();
        self.windows.assign(t, &mut assigned);
        let watermark = out.watermark();
        assigned.retain(|w| self.cleanup_time(w) > watermark);
        if assigned.is_empty() {
            return self.late(record, out);
        }
        let st = state.get_or_insert_with(Vec::new);
        if let Windows::Session { .. } = self.windows {
            return self.add_to_session(key, st, assigned[0], &record, out);
        }
        for w in assigned {
            let at = match st.binary_search_by(|(x, _)| x.cmp(&w)) {
                Ok(at) => at,
                Err(at) => {
                    st.insert(at, (w, (self.init)()));
                    at
                }
            };
            (self.add)(&mut st[at].1, &record);
            let (w, acc) = &st[at];
            self.finish_update(key, w, acc, out);
        }
    }

    fn on_timer(&self, key: &K, state: &mut Option<WindowState<A>>, time: EventTime, out: &mut Output<Out>) {
        let Some(st) = state.as_mut() else { return };
        for (w, acc) in st.iter() {
            if w.max_timestamp() == time {
                self.emit(key, w, acc, out);
            }
        }
        st.retain(|(w, _)| self.cleanup_time(w) > time);
        if st.is_empty() {
            *state = None;
        }
    }
}
