//! The end of a task's chain on an edge: the [`Router`] batches records per output channel and
//! partitions them (forward, hash by key group, rebalance, broadcast); at a barrier or end of input it
//! flushes and forwards the marker on every channel, after every record emitted before it.

use super::emit::Emit;
use crate::channel::{Message, Tx};
use crate::error::TaskError;
use crate::state::{key_group_of_hash, KeyHasher, SnapshotBuilder};
use cutline_core::barrier::Barrier;
use cutline_core::watermark::WatermarkUpdate;
use cutline_core::{CheckpointId, KeyGroup};

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
                let kg = key_group_of_hash(key_hash(&item), *max_parallelism);
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

    fn on_watermark(&mut self, w: WatermarkUpdate) -> Result<(), TaskError> {
        // After every record emitted before it, on every channel: downstream tasks combine them.
        self.send_all(|| Message::Watermark(w))
    }

    fn on_input_end(&mut self) -> Result<(), TaskError> {
        Ok(())
    }

    fn on_end(&mut self) -> Result<(), TaskError> {
        self.send_all(|| Message::End)
    }

    fn on_close(&mut self) -> Result<(), TaskError> {
        Ok(())
    }

    fn on_complete(&mut self, _c: CheckpointId) -> Result<(), TaskError> {
        Ok(())
    }

    fn on_start(&mut self) -> Result<(), TaskError> {
        Ok(())
    }
}
