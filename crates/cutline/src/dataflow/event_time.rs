//! Where event time starts: [`WatermarkStrategy`] (how to read a record's time, how late records may
//! be, when an input counts as idle) and the chain element that generates watermarks from it
//! ([`Stream::with_watermarks`]).

use super::api::Stream;
use super::emit::{Emit, Pending};
use super::splits::{restore_splits, SplitClocks, TooManySplits, MAX_SPLITS_PER_SUBTASK};
use super::timers::restore_event_time;
use crate::connectors::SplitId;
use crate::error::TaskError;
use crate::state::{encode_plain, SnapshotBuilder};
use cutline_core::barrier::Barrier;
use cutline_core::watermark::{EventTime, WatermarkUpdate};
use cutline_core::CheckpointId;
use std::sync::Arc;

/// Records a generator reads before it sends a watermark, when records come one at a time (after a
/// `map` or `flat_map`); a whole batch from a source gets one at its end.
pub const WATERMARK_EVERY_RECORDS: usize = 1024;

/// Reads a record's split ([`WatermarkStrategy::per_split`]).
type SplitFn<T> = Arc<dyn Fn(&T) -> SplitId + Send + Sync>;

/// How a stream's event time is read and its watermarks generated (bounded out-of-orderness, as
/// Flink's `forBoundedOutOfOrderness`): after records up to time `t` were seen, the watermark is
/// `t - max_out_of_orderness_ms - 1`, so a record at most that much older than the newest one is
/// never late.
pub struct WatermarkStrategy<T> {
    timestamp: Arc<dyn Fn(&T) -> EventTime + Send + Sync>,
    max_out_of_orderness_ms: u64,
    idle_timeout_ms: Option<u64>,
    split: Option<SplitFn<T>>,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            timestamp: self.timestamp.clone(),
            max_out_of_orderness_ms: self.max_out_of_orderness_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            split: self.split.clone(),
        }
    }
}

impl<T> WatermarkStrategy<T> {
    /// Records arrive at most `max_out_of_orderness_ms` behind the newest one; `timestamp` reads a
    /// record's event time.
    pub fn bounded_out_of_orderness(
        max_out_of_orderness_ms: u64,
        timestamp: impl Fn(&T) -> EventTime + Send + Sync + 'static,
    ) -> WatermarkStrategy<T> {
        WatermarkStrategy {
            timestamp: Arc::new(timestamp),
            max_out_of_orderness_ms,
            idle_timeout_ms: None,
            split: None,
        }
    }

    /// A source subtask that produced nothing for `ms` milliseconds (of processing time) is marked
    /// idle: downstream operators stop waiting for its watermark until it produces records again.
    /// Without it, one silent partition holds event time back everywhere downstream. Only a
    /// generator in a source's own stage sees idleness.
    pub fn with_idle_timeout_ms(mut self, ms: u64) -> WatermarkStrategy<T> {
        self.idle_timeout_ms = Some(ms);
        self
    }

    /// Generate watermarks per split of the subtask's input (a Kafka partition, a file): `split`
    /// reads a record's split, the bound applies within each split, and the subtask's watermark is
    /// the lowest over its active splits. Without it, a subtask that reads one partition ahead of
    /// another (a backlog, a fast producer) makes the other's records late. A split the source
    /// announces ([`Source::splits`](crate::Source::splits)) holds the watermark back until it has
    /// records; with [`with_idle_timeout_ms`](Self::with_idle_timeout_ms), a split without records
    /// for that long stops holding it back.
    pub fn per_split(mut self, split: impl Fn(&T) -> SplitId + Send + Sync + 'static) -> WatermarkStrategy<T> {
        self.split = Some(Arc::new(split));
        self
    }
}

/// The state element of a per-split generator's highest time per split.
pub(crate) fn splits_uid(uid: &str) -> String {
    format!("{uid}/splits")
}

/// The chain element that generates watermarks (one per subtask of the stage it is fused into).
pub(crate) struct WatermarkGen<T> {
    uid: String,
    strategy: WatermarkStrategy<T>,
    /// Highest event time seen (checkpointed: the watermark never goes back across a restore).
    max_seen: EventTime,
    /// The last watermark sent.
    sent: EventTime,
    since_sent: usize,
    idle: bool,
    /// Per-split mode: each split's clock.
    splits: Option<SplitClocks>,
    next: Box<dyn Emit<T>>,
}

impl<T> WatermarkGen<T> {
    fn watermark(&self) -> EventTime {
        let low = match &self.splits {
            None => self.max_seen,
            // No split active: time stays where it is (whole-source idleness tells downstream).
            Some(c) => match c.low() {
                Some(low) => low,
                None => return self.sent,
            },
        };
        if low == EventTime::MIN {
            return EventTime::MIN;
        }
        low.minus_ms(self.strategy.max_out_of_orderness_ms).minus_ms(1)
    }

    fn too_many_splits(&self) -> impl Fn(TooManySplits) -> TaskError + '_ {
        |_| {
            TaskError::State {
            uid: self.uid.clone(),
            message: format!(
                "more than {MAX_SPLITS_PER_SUBTASK} splits in one subtask: the per-split function must return one id per partition or file, not per record"
            ),
        }
        }
    }

    #[inline]
    fn observe(&mut self, item: &T) -> Result<EventTime, TaskError> {
        let t = (self.strategy.timestamp)(item);
        if let (Some(c), Some(split)) = (&mut self.splits, &self.strategy.split) {
            if let Err(e) = c.observe(split(item), t) {
                return Err(self.too_many_splits()(e));
            }
        }
        Ok(t)
    }

    fn send_if_advanced(&mut self) -> Result<(), TaskError> {
        self.since_sent = 0;
        let w = self.watermark();
        if w > self.sent {
            self.sent = w;
            self.next.on_watermark(WatermarkUpdate::At(w))?;
        }
        Ok(())
    }

    /// Records again after idleness: say so before them, so no downstream operator has moved past
    /// them meanwhile on account of this input.
    #[inline]
    fn wake(&mut self) -> Result<(), TaskError> {
        if self.idle {
            self.idle = false;
            self.next.on_watermark(WatermarkUpdate::At(self.sent))?;
        }
        Ok(())
    }
}

impl<T: Send> Emit<T> for WatermarkGen<T> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        self.wake()?;
        let t = self.observe(&item)?;
        self.max_seen = self.max_seen.max(t);
        self.next.emit(item)?;
        self.since_sent += 1;
        if self.since_sent >= WATERMARK_EVERY_RECORDS {
            self.send_if_advanced()?;
        }
        Ok(())
    }

    fn emit_batch(&mut self, batch: Vec<T>) -> Result<(), TaskError> {
        self.wake()?;
        if self.splits.is_some() {
            for r in batch.iter() {
                let t = self.observe(r)?;
                self.max_seen = self.max_seen.max(t);
            }
        } else {
            let ts = &self.strategy.timestamp;
            if let Some(max) = batch.iter().map(|r| ts(r)).max() {
                self.max_seen = self.max_seen.max(max);
            }
        }
        self.next.emit_batch(batch)?;
        self.send_if_advanced()
    }

    fn flush(&mut self) -> Result<(), TaskError> {
        if self.since_sent > 0 {
            self.send_if_advanced()?;
        }
        self.next.flush()
    }

    fn has_credit(&self) -> bool {
        self.next.has_credit()
    }

    fn on_watermark(&mut self, w: WatermarkUpdate) -> Result<(), TaskError> {
        // This element is where event time is decided: upstream watermarks are replaced by its own,
        // except the end of event time when the input is exhausted.
        match w {
            WatermarkUpdate::At(EventTime::MAX) => {
                self.sent = EventTime::MAX;
                self.next.on_watermark(w)
            }
            _ => Ok(()),
        }
    }

    fn on_source_idle(&mut self, idle_ms: u64) -> Result<(), TaskError> {
        if let Some(timeout) = self.strategy.idle_timeout_ms {
            if !self.idle && idle_ms >= timeout && self.sent != EventTime::MAX {
                self.send_if_advanced()?;
                self.idle = true;
                self.next.on_watermark(WatermarkUpdate::Idle)?;
            }
        }
        self.next.on_source_idle(idle_ms)
    }

    fn on_source_splits(&mut self, splits: &[SplitId]) -> Result<(), TaskError> {
        if let Some(c) = &mut self.splits {
            if let Err(e) = c.announce(splits) {
                return Err(self.too_many_splits()(e));
            }
            if self.sent != EventTime::MAX {
                self.send_if_advanced()?;
            }
        }
        self.next.on_source_splits(splits)
    }

    fn on_tick(&mut self, now_ms: u64) -> Result<Pending, TaskError> {
        if let Some(c) = &mut self.splits {
            if c.tick(now_ms, self.strategy.idle_timeout_ms) && !self.idle && self.sent != EventTime::MAX {
                self.send_if_advanced()?;
            }
        }
        self.next.on_tick(now_ms)
    }

    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        match &self.splits {
            None => {
                if self.max_seen != EventTime::MIN {
                    snap.add(&self.uid, encode_plain(&self.uid, &self.max_seen)?);
                }
            }
            Some(c) => {
                // What restores the watermark sent (the same element as without splits), and each
                // split's own time.
                if self.sent != EventTime::MIN && self.sent != EventTime::MAX {
                    let seen = self.sent.plus_ms(self.strategy.max_out_of_orderness_ms).plus_ms(1);
                    snap.add(&self.uid, encode_plain(&self.uid, &seen)?);
                }
                let times = c.snapshot();
                if !times.is_empty() {
                    let suid = splits_uid(&self.uid);
                    snap.add(&suid, encode_plain(&suid, &times)?);
                }
            }
        }
        self.next.on_barrier(b, snap)
    }

    fn on_input_end(&mut self) -> Result<(), TaskError> {
        self.next.on_input_end()
    }
    fn on_end(&mut self) -> Result<(), TaskError> {
        self.next.on_end()
    }
    fn on_close(&mut self) -> Result<(), TaskError> {
        self.next.on_close()
    }
    fn on_complete(&mut self, c: CheckpointId) -> Result<(), TaskError> {
        self.next.on_complete(c)
    }
    fn on_start(&mut self) -> Result<(), TaskError> {
        self.next.on_start()
    }
    fn on_cancel(&mut self) {
        self.next.on_cancel()
    }
}

impl<T: Send + 'static> Stream<T> {
    /// Give the stream event time: read each record's time with `strategy` and generate watermarks
    /// from it (fused into the producing stage). Watermarks from further upstream are replaced by
    /// these. `uid` names the generator's state in checkpoints (the highest time seen, so that the
    /// watermark never goes back after a restore): keep it stable.
    ///
    /// Apply it to each stream before a `union`: on a union it is refused when the job is built.
    pub fn with_watermarks(self, uid: &str, strategy: WatermarkStrategy<T>) -> Stream<T> {
        self.register_state_uid(uid);
        let uid = uid.to_string();
        self.map_parts_ctx(move |ctx, next| {
            let max_seen = restore_event_time(ctx.restore, &uid, ctx.subtask, ctx.parallelism)?;
            let sent = if max_seen == EventTime::MIN {
                EventTime::MIN
            } else {
                max_seen.minus_ms(strategy.max_out_of_orderness_ms).minus_ms(1)
            };
            let splits = match strategy.split {
                Some(_) => Some(SplitClocks::restored(restore_splits(ctx.restore, &uid)?)),
                None => None,
            };
            Ok(Box::new(WatermarkGen {
                splits,
                uid: uid.clone(),
                strategy: strategy.clone(),
                max_seen,
                sent,
                since_sent: 0,
                idle: false,
                next,
            }))
        })
    }
}
