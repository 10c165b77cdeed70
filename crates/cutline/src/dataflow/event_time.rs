//! Where event time starts: [`WatermarkStrategy`] (how to read a record's time, how late records may
//! be, when an input counts as idle) and the chain element that generates watermarks from it
//! ([`Stream::with_watermarks`]).

use super::api::Stream;
use super::emit::Emit;
use super::timers::restore_event_time;
use crate::error::TaskError;
use crate::state::{encode_plain, SnapshotBuilder};
use cutline_core::barrier::Barrier;
use cutline_core::watermark::{EventTime, WatermarkUpdate};
use cutline_core::CheckpointId;
use std::sync::Arc;

/// Records a generator reads before it sends a watermark, when records come one at a time (after a
/// `map` or `flat_map`); a whole batch from a source gets one at its end.
pub const WATERMARK_EVERY_RECORDS: usize = 1024;

/// How a stream's event time is read and its watermarks generated (bounded out-of-orderness, as
/// Flink's `forBoundedOutOfOrderness`): after records up to time `t` were seen, the watermark is
/// `t - max_out_of_orderness_ms - 1`, so a record at most that much older than the newest one is
/// never late.
pub struct WatermarkStrategy<T> {
    timestamp: Arc<dyn Fn(&T) -> EventTime + Send + Sync>,
    max_out_of_orderness_ms: u64,
    idle_timeout_ms: Option<u64>,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            timestamp: self.timestamp.clone(),
            max_out_of_orderness_ms: self.max_out_of_orderness_ms,
            idle_timeout_ms: self.idle_timeout_ms,
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
        WatermarkStrategy { timestamp: Arc::new(timestamp), max_out_of_orderness_ms, idle_timeout_ms: None }
    }

    /// A source subtask that produced nothing for `ms` milliseconds (of processing time) is marked
    /// idle: downstream operators stop waiting for its watermark until it produces records again.
    /// Without it, one silent partition holds event time back everywhere downstream. Only a
    /// generator in a source's own stage sees idleness.
    pub fn with_idle_timeout_ms(mut self, ms: u64) -> WatermarkStrategy<T> {
        self.idle_timeout_ms = Some(ms);
        self
    }
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
    next: Box<dyn Emit<T>>,
}

impl<T> WatermarkGen<T> {
    fn watermark(&self) -> EventTime {
        if self.max_seen == EventTime::MIN {
            return EventTime::MIN;
        }
        self.max_seen.minus_ms(self.strategy.max_out_of_orderness_ms).minus_ms(1)
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
        self.max_seen = self.max_seen.max((self.strategy.timestamp)(&item));
        self.next.emit(item)?;
        self.since_sent += 1;
        if self.since_sent >= WATERMARK_EVERY_RECORDS {
            self.send_if_advanced()?;
        }
        Ok(())
    }

    fn emit_batch(&mut self, batch: Vec<T>) -> Result<(), TaskError> {
        self.wake()?;
        let ts = &self.strategy.timestamp;
        if let Some(max) = batch.iter().map(|r| ts(r)).max() {
            self.max_seen = self.max_seen.max(max);
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

    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        if self.max_seen != EventTime::MIN {
            snap.add(&self.uid, encode_plain(&self.uid, &self.max_seen)?);
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
            Ok(Box::new(WatermarkGen {
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
