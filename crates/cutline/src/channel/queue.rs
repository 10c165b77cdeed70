//! Data channels between tasks: one FIFO of [`Message`]s per (upstream subtask, downstream subtask),
//! with credit-based flow control, barrier overtaking for unaligned checkpoints, and occupancy metrics;
//! the [`Waker`](super::Waker) of each end is rung when the other end may have made work for it.
//!
//! Flow control: a channel holds at most `capacity` data batches *as far as its producer is concerned*:
//! a task only starts work that produces output (reading an input batch, polling its source) while every
//! output channel has credit (fewer than `capacity` batches queued). Pushing itself never blocks, so a
//! task is always free to forward barriers and react to control messages however slow its consumers
//! are; the work it already started may overdraw a channel by the output of one input batch.
//!
//! It does not decide anything about checkpoints: whether a barrier may overtake queued data is the
//! aligner's call, passed in as a predicate.

use super::{InFlight, Message, Waker};
use cutline_core::barrier::Barrier;
use cutline_core::watermark::WatermarkUpdate;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

struct Queue<T> {
    msgs: VecDeque<Message<T>>,
    /// Data batches in `msgs`.
    batches: usize,
    /// Barriers and end-of-stream markers in `msgs` (watermarks are neither batches nor markers).
    markers: usize,
    sender_gone: bool,
    receiver_gone: bool,
    /// Bytes of the first `measured.0` messages (valid until the next pop; see `queued_bytes`).
    measured: (usize, u64),
}

struct Shared<T> {
    q: Mutex<Queue<T>>,
    /// A copy of `Queue::batches` (written under the lock), so that credit checks take no lock.
    batches: AtomicU64,
    /// Set once the receiver is gone.
    receiver_gone: std::sync::atomic::AtomicBool,
    capacity: usize,
    consumer: Arc<Waker>,
    producer: Arc<Waker>,
    /// Highest number of batches ever queued.
    high_water: AtomicU64,
    /// Records the consumer has taken (counted per batch, for metrics).
    records: AtomicU64,
    name: String,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Queue<T>> {
        self.q.lock().expect("channel lock")
    }
}

/// The producing end of a channel.
pub(crate) struct Tx<T>(Arc<Shared<T>>);
/// The consuming end of a channel.
pub(crate) struct Rx<T>(Arc<Shared<T>>);

/// The consumer is gone (its task stopped): the job is being torn down.
#[derive(Debug)]
pub(crate) struct Disconnected;

/// A channel of at most `capacity` batches (see the module docs) from the task woken by `producer` to
/// the task woken by `consumer`. `name` is "upstream#i->downstream#j", for metrics.
pub(crate) fn channel<T>(capacity: usize, producer: Arc<Waker>, consumer: Arc<Waker>, name: String) -> (Tx<T>, Rx<T>) {
    assert!(capacity >= 1, "a channel needs room for one batch");
    let shared = Arc::new(Shared {
        q: Mutex::new(Queue {
            msgs: VecDeque::new(),
            batches: 0,
            markers: 0,
            sender_gone: false,
            receiver_gone: false,
            measured: (0, 0),
        }),
        batches: AtomicU64::new(0),
        receiver_gone: std::sync::atomic::AtomicBool::new(false),
        capacity,
        consumer,
        producer,
        high_water: AtomicU64::new(0),
        records: AtomicU64::new(0),
        name,
    });
    (Tx(shared.clone()), Rx(shared))
}

impl<T> Tx<T> {
    /// Queue `m` without blocking (see the module docs for why that is bounded).
    pub fn push(&self, m: Message<T>) -> Result<(), Disconnected> {
        let s = &self.0;
        let mut q = s.lock();
        if q.receiver_gone {
            return Err(Disconnected);
        }
        let was_empty = q.msgs.is_empty();
        let marker = matches!(m, Message::Barrier(_) | Message::End);
        match &m {
            Message::Data(_) => {
                q.batches += 1;
                s.batches.store(q.batches as u64, Ordering::Relaxed);
                s.high_water.fetch_max(q.batches as u64, Ordering::Relaxed);
            }
            Message::Watermark(w) => {
                // Watermarks only grow: one queued right before this one says less than it, so it is
                // replaced (keeping at most one watermark between two other messages). An `At` after
                // `Idle` replaces it too (active again at that time); `Idle` after `At` does not.
                if let Some(Message::Watermark(prev)) = q.msgs.back_mut() {
                    if matches!(w, WatermarkUpdate::At(_)) || *prev == WatermarkUpdate::Idle {
                        *prev = *w;
                        return Ok(());
                    }
                }
            }
            Message::Barrier(_) | Message::End => q.markers += 1,
        }
        q.msgs.push_back(m);
        drop(q);
        // The consumer needs a ring when it may be asleep waiting for this channel: it was empty, or a
        // barrier arrived that it may take ahead of queued data even while it has no output credit.
        if was_empty || marker {
            s.consumer.ring();
        }
        Ok(())
    }

    /// May the producer start work that adds to this channel? (Lock-free; a stale answer only delays
    /// the producer until the consumer's next ring.)
    pub fn has_credit(&self) -> bool {
        (self.0.batches.load(Ordering::Relaxed) as usize) < self.0.capacity
            || self.0.receiver_gone.load(Ordering::Relaxed)
    }

    /// Data batches queued and not yet taken by the consumer (lock-free, may be stale).
    pub fn queued_batches(&self) -> usize {
        self.0.batches.load(Ordering::Relaxed) as usize
    }
}

impl<T> Drop for Tx<T> {
    fn drop(&mut self) {
        self.0.lock().sender_gone = true;
        self.0.consumer.ring();
    }
}

/// What one poll of a channel gave.
pub(crate) enum Taken<T> {
    Empty,
    Msg(Message<T>),
    /// A barrier taken ahead of the data batches and watermarks queued before it, which stay queued;
    /// `ahead` holds them in order, batches encoded (the channel state of this input for the
    /// barrier's checkpoint).
    Overtook {
        barrier: Barrier,
        ahead: Vec<InFlight>,
    },
    /// The producer is gone without end-of-stream.
    Disconnected,
}

impl<T> Rx<T> {
    /// Take the next message; or, if the first marker in the queue is a barrier behind data and
    /// `overtake` allows it, that barrier (encoding the data ahead of it with `encode`). With `data`
    /// false (the task has no output credit), only a barrier or end-of-stream is taken.
    /// (Markers are barriers and end-of-stream; a watermark is neither, and is overtaken with the
    /// data around it.)
    pub fn poll(
        &self,
        overtake: &dyn Fn(&Barrier) -> bool,
        encode: &dyn Fn(&Vec<T>) -> Vec<u8>,
        data: bool,
    ) -> Taken<T> {
        let s = &self.0;
        let mut q = s.lock();
        if q.markers > 0 && !matches!(q.msgs.front(), Some(Message::Barrier(_) | Message::End)) {
            let at = q
                .msgs
                .iter()
                .position(|m| matches!(m, Message::Barrier(_) | Message::End))
                .expect("a marker is queued");
            if let Message::Barrier(b) = &q.msgs[at] {
                if overtake(b) {
                    let b = *b;
                    q.msgs.remove(at);
                    q.markers -= 1;
                    let ahead = q
                        .msgs
                        .iter()
                        .take(at)
                        .map(|m| match m {
                            Message::Data(batch) => InFlight::Batch(encode(batch)),
                            Message::Watermark(w) => InFlight::Watermark(*w),
                            _ => unreachable!("only data and watermarks ahead of the first marker"),
                        })
                        .collect();
                    q.measured = (0, 0);
                    return Taken::Overtook { barrier: b, ahead };
                }
            }
        }
        // A watermark waits for credit like data: it may fire timers, whose output needs room.
        if !data && matches!(q.msgs.front(), Some(Message::Data(_) | Message::Watermark(_))) {
            return Taken::Empty;
        }
        match q.msgs.pop_front() {
            Some(m) => {
                q.measured = (0, 0);
                let freed = match &m {
                    Message::Data(batch) => {
                        s.records.fetch_add(batch.len() as u64, Ordering::Relaxed);
                        q.batches -= 1;
                        s.batches.store(q.batches as u64, Ordering::Relaxed);
                        // Ring the producer when the queue drains to half its capacity, not at every
                        // freed slot: it then refills in a burst instead of waking once per batch.
                        q.batches == s.capacity / 2
                    }
                    Message::Watermark(_) => false,
                    Message::Barrier(_) | Message::End => {
                        q.markers -= 1;
                        false
                    }
                };
                drop(q);
                if freed {
                    s.producer.ring();
                }
                Taken::Msg(m)
            }
            None if q.sender_gone => Taken::Disconnected,
            None => Taken::Empty,
        }
    }

    /// Is anything queued (or is the producer gone, which a poll reports)?
    pub fn has_message(&self) -> bool {
        let q = self.0.lock();
        !q.msgs.is_empty() || q.sender_gone
    }

    /// Records of the data batches queued here (what piled up behind a barrier, for traces and
    /// metrics): one pass over at most the channel's capacity of batches.
    pub fn queued_records(&self) -> u64 {
        let q = self.0.lock();
        q.msgs.iter().map(|m| if let Message::Data(b) = m { b.len() as u64 } else { 0 }).sum()
    }

    /// Bytes of the data queued here (for the aligned-checkpoint byte limit on blocked inputs): encoded
    /// size, measured once per batch while nothing is taken from the channel.
    pub fn queued_bytes(&self, size: &dyn Fn(&Vec<T>) -> u64) -> u64 {
        let mut q = self.0.lock();
        let (n, mut bytes) = q.measured;
        for m in q.msgs.iter().skip(n) {
            if let Message::Data(batch) = m {
                bytes += size(batch);
            }
        }
        q.measured = (q.msgs.len(), bytes);
        bytes
    }
}

impl<T: Send + 'static> Rx<T> {
    pub fn probe(&self) -> ChannelProbe {
        ChannelProbe(self.0.clone())
    }
}

impl<T> Drop for Rx<T> {
    fn drop(&mut self) {
        self.0.lock().receiver_gone = true;
        self.0.receiver_gone.store(true, Ordering::Relaxed);
        self.0.producer.ring();
    }
}

/// Occupancy of one channel, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChannelStats {
    /// "upstream#i->downstream#j".
    pub name: String,
    /// Data batches queued now, not yet taken by the downstream task.
    pub queued_batches: usize,
    /// Batches the upstream task may queue before it stops starting new work (the run's
    /// `RunConfig::channel_capacity`).
    pub capacity_batches: usize,
    /// The most batches ever queued (it may exceed the capacity by one input batch's output).
    pub high_water_batches: usize,
    /// Records the downstream task has taken from the channel since it was created.
    #[serde(default)]
    pub records: u64,
}

/// A type-erased view of one channel's occupancy.
pub(crate) trait Probe: Send + Sync {
    fn stats(&self) -> ChannelStats;
}

impl<T: Send> Probe for Shared<T> {
    fn stats(&self) -> ChannelStats {
        ChannelStats {
            name: self.name.clone(),
            queued_batches: self.lock().batches,
            capacity_batches: self.capacity,
            high_water_batches: self.high_water.load(Ordering::Relaxed) as usize,
            records: self.records.load(Ordering::Relaxed),
        }
    }
}

#[derive(Clone)]
pub(crate) struct ChannelProbe(Arc<dyn Probe>);

impl ChannelProbe {
    pub fn stats(&self) -> ChannelStats {
        self.0.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cutline_core::barrier::{Alignment, CheckpointMode, SnapshotKind};
    use cutline_core::{CheckpointId, Generation, TimeMs};

    fn barrier(id: u64) -> Barrier {
        Barrier {
            checkpoint: CheckpointId(id),
            generation: Generation(1),
            triggered_at: TimeMs(0),
            kind: SnapshotKind::Checkpoint,
            mode: CheckpointMode::ExactlyOnce,
            alignment: Alignment::Unaligned,
        }
    }
    #[allow(clippy::ptr_arg)] // the encoder type the queue takes: fn(&Vec<T>)
    fn enc(b: &Vec<u32>) -> Vec<u8> {
        b.iter().map(|x| *x as u8).collect()
    }

    #[test]
    fn credit_runs_out_at_capacity_and_returns_when_the_consumer_takes_a_batch() {
        let (p, c) = (Waker::new(), Waker::new());
        let (tx, rx) = channel::<u32>(2, p.clone(), c, "a#0->b#0".into());
        tx.push(Message::Data(vec![1])).unwrap();
        assert!(tx.has_credit());
        tx.push(Message::Data(vec![2])).unwrap();
        assert!(!tx.has_credit());
        tx.push(Message::Data(vec![3])).unwrap(); // overdraft is allowed, never blocks
        let seen = p.rings();
        assert!(matches!(rx.poll(&|_| false, &enc, true), Taken::Msg(Message::Data(v)) if v == [1]));
        assert!(!tx.has_credit(), "still at capacity");
        assert!(matches!(rx.poll(&|_| false, &enc, true), Taken::Msg(Message::Data(v)) if v == [2]));
        assert!(tx.has_credit());
        assert_ne!(p.rings(), seen, "the producer was rung when the queue drained to half its capacity");
        assert_eq!(rx.probe_stats().high_water_batches, 3);
    }

    #[test]
    fn an_allowed_barrier_overtakes_queued_data_which_stays_queued_in_order() {
        let (tx, rx) = channel::<u32>(8, Waker::new(), Waker::new(), "x".into());
        let wm = |t| WatermarkUpdate::At(cutline_core::watermark::EventTime(t));
        tx.push(Message::Data(vec![1, 2])).unwrap();
        tx.push(Message::Watermark(wm(10))).unwrap();
        tx.push(Message::Data(vec![3])).unwrap();
        tx.push(Message::Barrier(barrier(5))).unwrap();
        tx.push(Message::Data(vec![4])).unwrap();
        tx.push(Message::Barrier(barrier(6))).unwrap();
        match rx.poll(&|b| b.checkpoint == CheckpointId(5), &enc, false) {
            Taken::Overtook { barrier, ahead } => {
                assert_eq!(barrier.checkpoint, CheckpointId(5));
                let expected =
                    vec![InFlight::Batch(vec![1u8, 2]), InFlight::Watermark(wm(10)), InFlight::Batch(vec![3])];
                assert_eq!(ahead, expected, "the watermark is channel state too, in its place");
            }
            _ => panic!("expected an overtaking barrier"),
        }
        // Barrier 6 may never jump barrier 5 or the data between them: only the first marker is eligible.
        let order: Vec<String> = std::iter::from_fn(|| match rx.poll(&|_| false, &enc, true) {
            Taken::Msg(Message::Data(v)) => Some(format!("{v:?}")),
            Taken::Msg(Message::Watermark(w)) => Some(format!("{w:?}")),
            Taken::Msg(Message::Barrier(b)) => Some(format!("b{}", b.checkpoint.0)),
            _ => None,
        })
        .collect();
        assert_eq!(order, ["[1, 2]", "At(EventTime(10))", "[3]", "[4]", "b6"]);
    }

    #[test]
    fn consecutive_watermarks_are_kept_as_the_newest_and_wait_for_credit_like_data() {
        let (tx, rx) = channel::<u32>(8, Waker::new(), Waker::new(), "x".into());
        let wm = |t| WatermarkUpdate::At(cutline_core::watermark::EventTime(t));
        tx.push(Message::Watermark(wm(1))).unwrap();
        tx.push(Message::Watermark(wm(2))).unwrap();
        tx.push(Message::Watermark(WatermarkUpdate::Idle)).unwrap();
        tx.push(Message::Watermark(WatermarkUpdate::Idle)).unwrap();
        tx.push(Message::Data(vec![7])).unwrap();
        tx.push(Message::Watermark(WatermarkUpdate::Idle)).unwrap();
        tx.push(Message::Watermark(wm(3))).unwrap();
        assert!(matches!(rx.poll(&|_| false, &enc, false), Taken::Empty), "no credit: the watermark waits");
        let order: Vec<String> = std::iter::from_fn(|| match rx.poll(&|_| false, &enc, true) {
            Taken::Msg(Message::Data(v)) => Some(format!("{v:?}")),
            Taken::Msg(Message::Watermark(w)) => Some(format!("{w:?}")),
            _ => None,
        })
        .collect();
        assert_eq!(order, ["At(EventTime(2))", "Idle", "[7]", "At(EventTime(3))"]);
    }

    #[test]
    fn a_gone_consumer_disconnects_the_producer_and_a_gone_producer_is_reported() {
        let (tx, rx) = channel::<u32>(1, Waker::new(), Waker::new(), "x".into());
        tx.push(Message::Data(vec![1])).unwrap();
        drop(tx);
        assert!(matches!(rx.poll(&|_| false, &enc, true), Taken::Msg(_)));
        assert!(matches!(rx.poll(&|_| false, &enc, true), Taken::Disconnected));
        let (tx, rx) = channel::<u32>(1, Waker::new(), Waker::new(), "x".into());
        drop(rx);
        assert!(tx.push(Message::End).is_err());
    }

    #[test]
    fn queued_bytes_measures_each_batch_once_until_something_is_taken() {
        let (tx, rx) = channel::<u32>(8, Waker::new(), Waker::new(), "x".into());
        let calls = std::cell::Cell::new(0);
        let size = |b: &Vec<u32>| {
            calls.set(calls.get() + 1);
            b.len() as u64 * 4
        };
        tx.push(Message::Data(vec![1, 2])).unwrap();
        assert_eq!(rx.queued_bytes(&size), 8);
        tx.push(Message::Data(vec![3])).unwrap();
        assert_eq!(rx.queued_bytes(&size), 12);
        assert_eq!(calls.get(), 2);
    }

    impl<T: Send + 'static> Rx<T> {
        fn probe_stats(&self) -> ChannelStats {
            self.probe().stats()
        }
    }
}
