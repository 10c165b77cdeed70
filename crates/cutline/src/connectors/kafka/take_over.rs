//! A [`KafkaSink`] restored at another parallelism takes over the checkpoints of old subtasks.
//!
//! Its committables ([`KafkaTxn`]) do not say which subtask prepared them, and whether one was
//! committed is told by *that* subtask's marker. So the new instance opens, besides itself, a sink
//! as each old subtask it takes over: that subtask's `transactional.id` (its `init_transactions`
//! fences the old producers and aborts a transaction a dead one left open) and its marker group.
//! Each old subtask's checkpoints are then committed through its own sink, exactly as it would have
//! recovered them itself, and `committed_after` asks every one of their markers. Records of old
//! subtask `j` go where `j`'s would have: with [`super::KafkaPartitioning::Fixed`], to its partition.

use super::sink::{KafkaSink, KafkaSinkMode, KafkaTxn};
use crate::connectors::sink::{Sink, SinkContext};
use crate::error::ConnectorResult;
use cutline_core::CheckpointId;

impl<T: Send + 'static> KafkaSink<T> {
    /// Open a sink as each of `old_subtasks` other than this instance's own (exactly-once; an
    /// at-least-once sink has nothing to take over).
    pub(super) fn open_taken_over(&mut self, old_subtasks: &[u32]) -> ConnectorResult<()> {
        let ctx = self.ctx.clone().expect("KafkaSink::take_over before open");
        if self.config.mode == KafkaSinkMode::AtLeastOnce {
            return Ok(());
        }
        self.taken.clear();
        for &j in old_subtasks.iter().filter(|j| **j != ctx.subtask) {
            let mut as_old = KafkaSink::with_encoder(self.config.clone(), self.encode.clone());
            as_old.open(&SinkContext { subtask: j, ..ctx.clone() })?;
            self.taken.push((j, as_old));
        }
        Ok(())
    }

    /// Recover this instance's own subtask's checkpoints, then each old subtask's through the sink
    /// opened as it, and close those.
    pub(super) fn recover_all_taken_over(&mut self, prepared: &[(u32, Vec<KafkaTxn>)]) -> ConnectorResult<()> {
        let own = self.ctx.as_ref().expect("KafkaSink recovered before open").subtask;
        let none = Vec::new();
        let of = |j: u32| prepared.iter().find(|(s, _)| *s == j).map_or(&none, |(_, t)| t);
        self.recover(of(own))?;
        for (j, mut as_old) in std::mem::take(&mut self.taken) {
            as_old.recover(of(j))?;
            as_old.close()?;
        }
        Ok(())
    }

    /// Has any old subtask taken over committed a checkpoint after `checkpoint`?
    pub(super) fn taken_over_committed_after(&mut self, checkpoint: Option<CheckpointId>) -> ConnectorResult<bool> {
        for (_, as_old) in &mut self.taken {
            if as_old.committed_after(checkpoint)? == Some(true) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
