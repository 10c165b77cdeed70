//! The per-record data path inside a task: a chain of [`Emit`] elements ending in a [`Router`](super::router::Router) (which
//! batches records per output channel) or a sink. Stateless operators are fused here as chain elements.
//!
//! The chain also carries the control-plane hooks (`on_input_end`, `on_barrier`, `on_end`, `on_complete`, `on_close`) so that
//! stateful elements snapshot and sinks prepare/commit in chain order. It does not decide when those
//! hooks run: the task's control plane does (see `runtime::task`).

use crate::connectors::SplitId;
use crate::error::TaskError;
use crate::state::SnapshotBuilder;
use cutline_core::barrier::Barrier;
use cutline_core::watermark::WatermarkUpdate;
use cutline_core::CheckpointId;
use std::sync::Arc;

/// Records per batch on a channel. A partial batch is flushed when the task has nothing to read.
pub const DEFAULT_BATCH_SIZE: usize = 1024;

/// What the elements of a chain still have to do without new input ([`Emit::on_tick`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Due timers are left over (a step fires at most one batch of them): tick again as soon as
    /// the task has credit.
    pub more: bool,
    /// The earliest pending processing-time timer (milliseconds since the Unix epoch): tick again
    /// by then.
    pub next_timer_ms: Option<u64>,
}

impl Pending {
    /// Both elements' work.
    pub fn and(self, other: Pending) -> Pending {
        let next_timer_ms = match (self.next_timer_ms, other.next_timer_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Pending { more: self.more || other.more, next_timer_ms }
    }
}

/// One element of a task's chain.
pub(crate) trait Emit<T>: Send {
    fn emit(&mut self, item: T) -> Result<(), TaskError>;
    fn emit_batch(&mut self, batch: Vec<T>) -> Result<(), TaskError> {
        for item in batch {
            self.emit(item)?;
        }
        Ok(())
    }
    /// Send buffered records downstream.
    fn flush(&mut self) -> Result<(), TaskError>;
    /// May the task start work that produces output (every output channel has credit)?
    fn has_credit(&self) -> bool;
    /// The task's watermark advanced (or the task became idle): an element with event-time timers
    /// fires those due, then every element passes it on; a router sends it on every channel after
    /// the records emitted before it. Called with a watermark above every earlier one, or (after
    /// `Idle`) with the last one again when the input is active again.
    fn on_watermark(&mut self, watermark: WatermarkUpdate) -> Result<(), TaskError>;
    /// The task has credit and asks for work that needs no new input, at processing time `now_ms`
    /// (milliseconds since the Unix epoch): due event-time timers left over from a watermark (at
    /// most one batch of them fire per call), processing-time timers. Elements without timers pass
    /// it on.
    fn on_tick(&mut self, now_ms: u64) -> Result<Pending, TaskError> {
        let _ = now_ms;
        Ok(Pending::default())
    }
    /// Source tasks: the source has produced nothing for `idle_ms` milliseconds (processing time).
    /// A watermark generator may then mark its output idle; stateless elements pass it on.
    fn on_source_idle(&mut self, idle_ms: u64) -> Result<(), TaskError> {
        let _ = idle_ms;
        Ok(())
    }
    /// Source tasks: the splits the source reads changed (after a poll; [`Source::splits`]). A
    /// per-split watermark generator tracks them; stateless elements pass it on.
    ///
    /// [`Source::splits`]: crate::Source::splits
    fn on_source_splits(&mut self, splits: &[SplitId]) -> Result<(), TaskError> {
        let _ = splits;
        Ok(())
    }
    /// The task aligned `barrier`: add this element's state to `snap`, then pass the hook on. A router
    /// flushes and forwards the barrier; a sink prepares its transaction.
    fn on_barrier(&mut self, barrier: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError>;
    /// The task aligned the final barrier (the job's bounded input is exhausted; never at a
    /// stop-with-savepoint, whose input resumes later): emit what waits for the end of input, then
    /// pass the hook on. Called right before [`Emit::on_barrier`] of that barrier, so what is emitted
    /// here is part of the final checkpoint. Its output is like the output of one batch: it is pushed
    /// whatever the credit.
    fn on_input_end(&mut self) -> Result<(), TaskError>;
    /// Every input ended: flush and forward end-of-stream.
    fn on_end(&mut self) -> Result<(), TaskError>;
    /// The task ends normally: its input ended and the checkpoint that ends it is complete (sinks
    /// close here).
    fn on_close(&mut self) -> Result<(), TaskError>;
    /// `checkpoint` is complete: commit what was prepared up to it.
    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError>;
    /// The task starts running (after every task of the generation was built): sinks recover here.
    fn on_start(&mut self) -> Result<(), TaskError>;
    /// The task is being torn down without finishing (best effort).
    fn on_cancel(&mut self) {}
}

/// Delegates every control hook but `on_barrier` and `on_input_end` to `self.next` (for elements with
/// state of their own).
macro_rules! delegate_lifecycle {
    () => {
        fn flush(&mut self) -> Result<(), TaskError> {
            self.next.flush()
        }
        fn has_credit(&self) -> bool {
            self.next.has_credit()
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
        fn on_cancel(&mut self) {
            self.next.on_cancel()
        }
        fn on_start(&mut self) -> Result<(), TaskError> {
            self.next.on_start()
        }
    };
}
pub(crate) use delegate_lifecycle;

/// Wraps the next element and delegates every control hook to it (stateless elements).
macro_rules! delegate_control {
    () => {
        fn on_watermark(&mut self, w: cutline_core::watermark::WatermarkUpdate) -> Result<(), TaskError> {
            self.next.on_watermark(w)
        }
        fn on_source_idle(&mut self, idle_ms: u64) -> Result<(), TaskError> {
            self.next.on_source_idle(idle_ms)
        }
        fn on_source_splits(&mut self, splits: &[$crate::connectors::SplitId]) -> Result<(), TaskError> {
            self.next.on_source_splits(splits)
        }
        fn on_tick(&mut self, now_ms: u64) -> Result<$crate::dataflow::emit::Pending, TaskError> {
            self.next.on_tick(now_ms)
        }
        fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
            self.next.on_barrier(b, snap)
        }
        fn on_input_end(&mut self) -> Result<(), TaskError> {
            self.next.on_input_end()
        }
        $crate::dataflow::emit::delegate_lifecycle!();
    };
}

pub(crate) struct MapEmit<T, U> {
    pub f: Arc<dyn Fn(T) -> U + Send + Sync>,
    pub next: Box<dyn Emit<U>>,
}

impl<T: Send, U: Send> Emit<T> for MapEmit<T, U> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        self.next.emit((self.f)(item))
    }
    delegate_control!();
}

pub(crate) struct FilterEmit<T> {
    pub f: Arc<dyn Fn(&T) -> bool + Send + Sync>,
    pub next: Box<dyn Emit<T>>,
}

impl<T: Send> Emit<T> for FilterEmit<T> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        if (self.f)(&item) {
            self.next.emit(item)
        } else {
            Ok(())
        }
    }
    delegate_control!();
}

/// A flat-map function: pushes zero or more outputs for one input.
pub(crate) type FlatMapFn<T, U> = Arc<dyn Fn(T, &mut Vec<U>) + Send + Sync>;

pub(crate) struct FlatMapEmit<T, U> {
    pub f: FlatMapFn<T, U>,
    pub buf: Vec<U>,
    pub next: Box<dyn Emit<U>>,
}

impl<T: Send, U: Send> Emit<T> for FlatMapEmit<T, U> {
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        (self.f)(item, &mut self.buf);
        for u in self.buf.drain(..) {
            self.next.emit(u)?;
        }
        Ok(())
    }
    delegate_control!();
}

/// An identity element: passes records through (the head of a union or rebalance stage).
pub(crate) struct Identity<T> {
    pub next: Box<dyn Emit<T>>,
}

impl<T: Send> Emit<T> for Identity<T> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        self.next.emit(item)
    }
    fn emit_batch(&mut self, batch: Vec<T>) -> Result<(), TaskError> {
        self.next.emit_batch(batch)
    }
    delegate_control!();
}
