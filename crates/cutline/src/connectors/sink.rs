//! The two-phase [`Sink`] contract and [`SinkContext`], where a sink instance runs.
//!
//! The contract: records are written into an open transaction; at a barrier the transaction is
//! *prepared* (made durable but invisible) and its committable is stored in the checkpoint; when a
//! checkpoint completes, everything prepared up to it is *committed* (idempotently); after a restore,
//! *recover* commits what the restored checkpoint prepared and discards anything newer. A completed
//! checkpoint covers every older one, so a lost or late notification loses nothing.
//!
//! This module does not decide when checkpoints complete; it reacts to the task's control hooks.

use crate::error::ConnectorResult;
use cutline_core::CheckpointId;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Where a sink instance runs.
#[derive(Clone, Debug)]
pub struct SinkContext {
    /// The sink's stable id.
    pub uid: String,
    /// This instance's index within the sink's stage, `0..parallelism`.
    pub subtask: u32,
    /// Instances of the sink's stage.
    pub parallelism: u32,
    /// Unique for every incarnation of the task, across restarts and processes.
    pub incarnation: u64,
    /// A short id of the job (a hash of its fingerprint): sinks of different jobs writing to one place
    /// must never take each other's transactions for their own.
    pub job: String,
}

/// A two-phase-commit sink. See the module docs for the contract.
pub trait Sink<T>: Send + 'static {
    /// A handle to a prepared transaction, stored in checkpoints.
    type Committable: Serialize + DeserializeOwned + Clone + Send + std::fmt::Debug + 'static;

    /// Called once before anything else, after a restore or at a fresh start.
    fn open(&mut self, ctx: &SinkContext) -> ConnectorResult<()>;
    /// Commit `to_commit` (prepared by the restored, complete checkpoint) and discard every other
    /// uncommitted transaction of this subtask, except those of a newer generation
    /// (`SinkContext::incarnation >> 32` is the generation): in a cluster a stale worker may run its
    /// recovery after a newer generation started elsewhere, and those transactions are not its own.
    fn recover(&mut self, to_commit: &[Self::Committable]) -> ConnectorResult<()>;
    /// The restored checkpoint has this sink at another parallelism, `old_parallelism`: this
    /// instance takes over the transactions of the old subtasks `old_subtasks` (those `j` with
    /// `j % parallelism == subtask`; none when the sink scaled up past them) besides its own
    /// subtask's. Called after `open` and before `committed_after` and `recover`, which must then
    /// answer for, commit and discard the transactions of those subtasks too. `false` (the default):
    /// this sink cannot change parallelism, and the restore is refused at start.
    fn take_over(&mut self, old_subtasks: &[u32], old_parallelism: u32) -> ConnectorResult<bool> {
        let _ = (old_subtasks, old_parallelism);
        Ok(false)
    }
    /// `recover` after a restore at another parallelism (`take_over` said yes): `prepared` holds,
    /// per old subtask this instance took over, what the restored checkpoint has it prepared. The
    /// default hands all of it to `recover`, which suits sinks whose committables name the subtask
    /// that prepared them; a sink whose committables do not (the Kafka sink) overrides this.
    fn recover_taken_over(&mut self, prepared: &[(u32, Vec<Self::Committable>)]) -> ConnectorResult<()> {
        let all: Vec<Self::Committable> = prepared.iter().flat_map(|(_, c)| c.iter().cloned()).collect();
        self.recover(&all)
    }
    /// Write one record into the open transaction.
    fn write(&mut self, item: T) -> ConnectorResult<()>;
    /// Make the open transaction durable but invisible; `None` if it is empty.
    fn prepare(&mut self, checkpoint: CheckpointId) -> ConnectorResult<Option<Self::Committable>>;
    /// Make prepared transactions visible. Must be idempotent: a committable may be committed again
    /// after a crash.
    fn commit(&mut self, committables: &[Self::Committable]) -> ConnectorResult<()>;
    /// The job's bounded input is exhausted: write anything still buffered into the open transaction.
    /// Called once, right before `prepare` of the final checkpoint, so what it writes is committed
    /// with that checkpoint. Not called when the job stops with a savepoint (its input resumes later).
    fn end_of_input(&mut self) -> ConnectorResult<()> {
        Ok(())
    }
    /// The task ends normally: its input ended and the checkpoint that ends it (the final checkpoint
    /// or a stop-with-savepoint) is committed. Release connections and files here. Not called when
    /// the task fails or is torn down (`abort` is). An error fails the task, and the job restores.
    fn close(&mut self) -> ConnectorResult<()> {
        Ok(())
    }
    /// The task is going away without finishing: drop the open transaction (best effort).
    fn abort(&mut self) {}
    /// Has this subtask committed any transaction prepared after `checkpoint` (or at all, for
    /// `None`)? Asked at every exactly-once restore, before any sink recovers. In a healthy store the
    /// answer is always no (sinks commit only what a complete checkpoint prepared, and the latest
    /// complete checkpoint is restored); yes means checkpoints were lost or damaged, or the output
    /// belongs to another run, and restoring would commit output twice, so the restore is refused.
    /// `None` (the default) means the sink cannot tell: the restore is then refused only when it falls
    /// back past a damaged checkpoint.
    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> ConnectorResult<Option<bool>> {
        let _ = checkpoint;
        Ok(None)
    }
}

/// Does a transaction name (after the sink's prefix: `<incarnation>-<seq>...`) belong to a newer
/// generation than incarnation `own`? Incarnations are `generation << 32 | task`; a newer
/// generation's transaction belongs to a run that took over from this one (a stale worker starting
/// late), and is never this one's to discard.
pub(crate) fn of_a_newer_generation(rest: &str, own: u64) -> bool {
    rest.split('-').next().and_then(|i| i.parse::<u64>().ok()).is_some_and(|incarnation| incarnation >> 32 > own >> 32)
}
