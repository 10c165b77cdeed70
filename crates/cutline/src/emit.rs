//! The per-record data path inside a task: a chain of [`Emit`] elements ending in a [`Router`] (which
//! batches records per output channel) or a sink. Stateless operators are fused here as chain elements.
//!
//! The chain also carries the control-plane hooks (`on_barrier`, `on_end`, `on_complete`) so that
//! stateful elements snapshot and sinks prepare/commit in chain order. It does not decide when those
//! hooks run: the task's control plane does (see `task.rs`).

use crate::channel::Tx;
use crate::message::{Message, TaskError};
use crate::state::{KeyHasher, SnapshotBuilder};
use cutline_core::barrier::Barrier;
use cutline_core::{CheckpointId, KeyGroup};
use std::sync::Arc;

/// Records per batch on a channel. A partial batch is flushed when the task has nothing to read.
pub const DEFAULT_BATCH_SIZE: usize = 1024;

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
    /// The task aligned `barrier`: add this element's state to `snap`, then pass the hook on. A router
    /// flushes and forwards the barrier; a sink prepares its transaction.
    fn on_barrier(&mut self, barrier: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError>;
    /// Every input ended: flush and forward end-of-stream.
    fn on_end(&mut self) -> Result<(), TaskError>;
    /// `checkpoint` is complete: commit what was prepared up to it.
    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError>;
    /// The task starts running (after every task of the generation was built): sinks recover here.
    fn on_start(&mut self) -> Result<(), TaskError>;
    /// The task is being torn down without finishing (best effort).
    fn on_cancel(&mut self) {}
}

/// Delegates every control hook but `on_barrier` to `self.next` (for elements with state of their own).
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
        fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
            self.next.on_barrier(b, snap)
        }
        $crate::emit::delegate_lifecycle!();
    };
}
pub(crate) use delegate_control;

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

/// How a router spreads records over the downstream subtasks of one edge.
pub(crate) enum Partitioner<T> {
    /// Subtask i sends to subtask i (equal parallelism).
    Forward,
    /// By key group of the record's key.
    Hash { key_hash: KeyHasher<T>, max_parallelism: u32 },
    /// Round robin.
    Rebalance { next: usize },
    /// Every record to every subtask.
    Broadcast { clone: fn(&T) -> T },
}

/// The end of a task's chain on an edge: batches records per output channel and sends them.
pub(crate) struct Router<T> {
    outs: Vec<Tx<T>>,
    bufs: Vec<Vec<T>>,
    part: Partitioner<T>,
    batch_size: usize,
}

impl<T: Send> Router<T> {
    pub fn new(outs: Vec<Tx<T>>, part: Partitioner<T>, batch_size: usize) -> Router<T> {
        assert!(!outs.is_empty(), "a router needs at least one output channel");
        assert!(batch_size >= 1);
        if matches!(part, Partitioner::Forward) {
            assert_eq!(outs.len(), 1, "a forward edge has one channel per upstream subtask");
        }
        let bufs = outs.iter().map(|_| Vec::with_capacity(batch_size)).collect();
        Router { outs, bufs, part, batch_size }
    }

    #[inline]
    fn push(&mut self, i: usize, item: T) -> Result<(), TaskError> {
        let buf = &mut self.bufs[i];
        buf.push(item);
        if buf.len() >= self.batch_size {
            let full = std::mem::replace(buf, Vec::with_capacity(self.batch_size));
            self.outs[i].push(Message::Data(full)).map_err(|_| TaskError::Disconnected)?;
        }
        Ok(())
    }

    fn send_all(&mut self, make: impl Fn() -> Message<T>) -> Result<(), TaskError> {
        self.flush()?;
        for out in &self.outs {
            out.push(make()).map_err(|_| TaskError::Disconnected)?;
        }
        Ok(())
    }
}

impl<T: Send> Emit<T> for Router<T> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        let n = self.outs.len();
        match &mut self.part {
            Partitioner::Forward => self.push(0, item),
            Partitioner::Hash { key_hash, max_parallelism } => {
                let kg = crate::state::key_group_of_hash(key_hash(&item), *max_parallelism);
                let i = cutline_core::subtask_for_key_group(*max_parallelism, n as u32, KeyGroup(kg)) as usize;
                self.push(i, item)
            }
            Partitioner::Rebalance { next } => {
                let i = *next;
                *next = (i + 1) % n;
                self.push(i, item)
            }
            Partitioner::Broadcast { clone } => {
                let clone = *clone;
                for i in 1..n {
                    let c = clone(&item);
                    self.push(i, c)?;
                }
                self.push(0, item)
            }
        }
    }

    fn flush(&mut self) -> Result<(), TaskError> {
        for i in 0..self.outs.len() {
            if !self.bufs[i].is_empty() {
                let full = std::mem::replace(&mut self.bufs[i], Vec::with_capacity(self.batch_size));
                self.outs[i].push(Message::Data(full)).map_err(|_| TaskError::Disconnected)?;
            }
        }
        Ok(())
    }

    fn has_credit(&self) -> bool {
        self.outs.iter().all(|o| o.has_credit())
    }

    fn on_barrier(&mut self, b: &Barrier, _snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        // Every record emitted before the barrier goes out before it, on every channel.
        let b = *b;
        self.send_all(|| Message::Barrier(b))
    }

    fn on_end(&mut self) -> Result<(), TaskError> {
        self.send_all(|| Message::End)
    }

    fn on_complete(&mut self, _c: CheckpointId) -> Result<(), TaskError> {
        Ok(())
    }

    fn on_start(&mut self) -> Result<(), TaskError> {
        Ok(())
    }
}
