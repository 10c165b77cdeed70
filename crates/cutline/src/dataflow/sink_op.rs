//! [`SinkEmit`]: the chain element that drives a [`Sink`] from a task: writes records into the open
//! transaction, prepares at the barrier and keeps the prepared transactions in the task's state until
//! a completed checkpoint commits them, and recovers what a restored checkpoint prepared when the task
//! starts. It decides nothing about checkpoints; it reacts to the task's control hooks.

use super::emit::Emit;
use crate::connectors::{Sink, SinkContext};
use crate::error::{ConnectorError, TaskError};
use crate::fault::{FaultPoint, Faults};
use crate::state::{encode_plain, RestoreIndex, SnapshotBuilder};
use cutline_core::barrier::Barrier;
use cutline_core::CheckpointId;
use std::collections::BTreeMap;

/// What a sink commits when its task starts: its own subtask's prepared transactions, or after a
/// rescale those of each old subtask it took over.
enum ToRecover<C> {
    Own(Vec<C>),
    TakenOver(Vec<(u32, Vec<C>)>),
}

/// Drives a [`Sink`] from the task's chain.
pub(crate) struct SinkEmit<T, S: Sink<T>> {
    uid: String,
    sink: S,
    /// Prepared, not yet committed: part of every snapshot until committed.
    uncommitted: BTreeMap<CheckpointId, S::Committable>,
    /// What the restored checkpoint prepared, committed by `recover` when the task starts.
    to_recover: Option<ToRecover<S::Committable>>,
    faults: Faults,
    _t: std::marker::PhantomData<fn(T)>,
}

impl<T: Send + 'static, S: Sink<T>> SinkEmit<T, S> {
    pub fn open(mut sink: S, ctx: SinkContext, restore: &RestoreIndex, faults: Faults) -> Result<Self, TaskError> {
        let uid = ctx.uid.clone();
        let err = |error: ConnectorError| TaskError::Sink { uid: uid.clone(), error };
        sink.open(&ctx).map_err(err)?;
        let decode = |bytes: &[u8]| -> Result<BTreeMap<CheckpointId, S::Committable>, TaskError> {
            postcard::from_bytes(bytes)
                .map_err(|e| TaskError::State { uid: uid.clone(), message: format!("decoding sink state: {e}") })
        };
        // Prepared transactions of the restored checkpoint this instance commits: its own subtask's,
        // or after a rescale those of the old subtasks it takes over.
        let mut restored: Vec<BTreeMap<CheckpointId, S::Committable>> = Vec::new();
        let mut taken_over = None;
        match restore.plain_rescaled_complete(&uid, ctx.parallelism)? {
            Some((old_parallelism, parts)) => {
                let old_subtasks: Vec<u32> =
                    (0..old_parallelism).filter(|j| j % ctx.parallelism == ctx.subtask).collect();
                if !sink.take_over(&old_subtasks, old_parallelism).map_err(err)? {
                    return Err(TaskError::State {
                        uid: uid.clone(),
                        message: format!(
                            "checkpoint has this sink at parallelism {old_parallelism}, the job now asks for {}; this sink cannot take over the transactions of other subtasks (the transactional file, PostgreSQL and Kafka sinks can). Keep the sink at parallelism {old_parallelism} (Stream::sink_with_parallelism) while the rest of the job rescales",
                            ctx.parallelism
                        ),
                    });
                }
                for &j in &old_subtasks {
                    restored.push(decode(parts[j as usize])?);
                }
                taken_over = Some(old_subtasks);
            }
            None => {
                if let Some(bytes) = restore.plain(&uid, ctx.subtask, ctx.parallelism)? {
                    restored.push(decode(bytes)?);
                }
            }
        }
        if let Some(c) = restore.checkpoint {
            if let Some(k) = restored.iter().flat_map(|m| m.keys()).find(|k| **k > c) {
                return Err(TaskError::State {
                    uid: uid.clone(),
                    message: format!("the checkpoint is damaged: checkpoint {c} holds a transaction prepared by checkpoint {k}, a later one"),
                });
            }
        }
        if !restore.duplicates_allowed {
            // Every sink subtask answers this before any of them recovers (recovery discards prepared
            // transactions; a refusal after that would leave nothing to repair).
            let committed = sink.committed_after(restore.checkpoint).map_err(err)?;
            if committed == Some(true) || (committed.is_none() && !restore.skipped.is_empty()) {
                let from =
                    restore.checkpoint.map(|c| format!("checkpoint {c}")).unwrap_or_else(|| "an empty start".into());
                let why = if restore.skipped.is_empty() {
                    "a newer checkpoint is missing, or the output belongs to another run".to_string()
                } else {
                    format!("newer checkpoint(s) {:?} do not verify", restore.skipped)
                };
                return Err(TaskError::State {
                    uid: uid.clone(),
                    message: format!(
                        "this sink already committed output after {from} ({why}): restoring {from} would commit that output twice. Repair or restore the checkpoint files, use a fresh output, or run in at-least-once mode to accept duplicates"
                    ),
                });
            }
        }
        let to_commit = match taken_over {
            Some(old) => ToRecover::TakenOver(
                old.into_iter().zip(restored).map(|(j, m)| (j, m.into_values().collect())).collect(),
            ),
            None => ToRecover::Own(restored.into_iter().flat_map(|m| m.into_values()).collect()),
        };
        Ok(SinkEmit {
            uid,
            sink,
            uncommitted: BTreeMap::new(),
            to_recover: Some(to_commit),
            faults,
            _t: std::marker::PhantomData,
        })
    }
}

impl<T: Send + 'static, S: Sink<T>> Emit<T> for SinkEmit<T, S> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        self.sink.write(item).map_err(|error| TaskError::Sink { uid: self.uid.clone(), error })
    }
    fn on_start(&mut self) -> Result<(), TaskError> {
        let to_commit = self.to_recover.take().expect("a sink starts once");
        self.faults.check(FaultPoint::SinkRecover)?;
        match to_commit {
            ToRecover::Own(c) => self.sink.recover(&c),
            ToRecover::TakenOver(per_old_subtask) => self.sink.recover_taken_over(&per_old_subtask),
        }
        .map_err(|error| TaskError::Sink { uid: self.uid.clone(), error })
    }
    fn has_credit(&self) -> bool {
        true
    }
    fn flush(&mut self) -> Result<(), TaskError> {
        Ok(())
    }
    fn on_watermark(&mut self, _w: cutline_core::watermark::WatermarkUpdate) -> Result<(), TaskError> {
        Ok(()) // the end of the chain: a sink has no use for event time
    }
    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        self.faults.check(FaultPoint::SinkPrepare)?;
        if let Some(c) =
            self.sink.prepare(b.checkpoint).map_err(|error| TaskError::Sink { uid: self.uid.clone(), error })?
        {
            let prev = self.uncommitted.insert(b.checkpoint, c);
            assert!(prev.is_none(), "{}: prepared twice for {}", self.uid, b.checkpoint);
        }
        snap.add(&self.uid, encode_plain(&self.uid, &self.uncommitted)?);
        Ok(())
    }
    fn on_input_end(&mut self) -> Result<(), TaskError> {
        self.sink.end_of_input().map_err(|error| TaskError::Sink { uid: self.uid.clone(), error })
    }
    fn on_end(&mut self) -> Result<(), TaskError> {
        Ok(())
    }
    fn on_close(&mut self) -> Result<(), TaskError> {
        self.sink.close().map_err(|error| TaskError::Sink { uid: self.uid.clone(), error })
    }
    fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
        let done: Vec<CheckpointId> = self.uncommitted.range(..=checkpoint).map(|(k, _)| *k).collect();
        if done.is_empty() {
            return Ok(());
        }
        let batch: Vec<S::Committable> = done.iter().map(|k| self.uncommitted[k].clone()).collect();
        self.faults.check(FaultPoint::SinkCommit)?;
        let (first, rest) = batch.split_at(1);
        self.sink.commit(first).map_err(|error| TaskError::Sink { uid: self.uid.clone(), error })?;
        // A crash here leaves the commit half done; recovery must finish it.
        self.faults.check(FaultPoint::SinkCommitMidway)?;
        self.sink.commit(rest).map_err(|error| TaskError::Sink { uid: self.uid.clone(), error })?;
        for k in done {
            self.uncommitted.remove(&k);
        }
        Ok(())
    }
    fn on_cancel(&mut self) {
        self.sink.abort();
    }
}
