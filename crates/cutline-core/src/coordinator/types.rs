//! What goes into the coordinator ([`Event`]), what comes out ([`Decision`]), why a checkpoint was
//! aborted, and the statistics it keeps.

use crate::barrier::{Barrier, SnapshotKind};
use crate::ids::{CheckpointId, Generation, TaskId, TimeMs};

/// Inputs to the coordinator. Events that carry a `generation` are ignored when it is not the current
/// one (they were sent before a failover).
#[derive(Clone, Debug)]
pub enum Event<R> {
    /// Time passed; periodic triggers and timeouts are evaluated.
    Tick,
    /// A task's part of `checkpoint` is durable.
    Acked {
        /// The generation of the sending task.
        generation: Generation,
        /// The checkpoint acknowledged.
        checkpoint: CheckpointId,
        /// The task that took its part.
        task: TaskId,
        /// Where its state is (opaque here), handed back in [`Decision::CommitManifest`].
        report: R,
    },
    /// A task could not take its part of `checkpoint` (for example a storage write failed): the
    /// checkpoint is aborted, unless every task had already acknowledged it.
    Declined {
        /// The generation of the sending task.
        generation: Generation,
        /// The checkpoint declined.
        checkpoint: CheckpointId,
        /// The task that declined.
        task: TaskId,
        /// Why, for the abort reason and the logs.
        reason: String,
    },
    /// A task died: the job fails over.
    TaskFailed {
        /// The generation of the failed task.
        generation: Generation,
        /// The task that failed.
        task: TaskId,
        /// Why, for the failover reason.
        reason: String,
        /// The task says restarting cannot mend it (the run lifecycle ends the run; the coordinator
        /// fails over alike).
        permanent: bool,
    },
    /// A bounded source read its last record. Once every source did, the final checkpoint is
    /// triggered at once, whatever the interval.
    SourceFinished {
        /// The generation of the source task.
        generation: Generation,
        /// The source task; a task that is not a source is a [`Violation`].
        task: TaskId,
    },
    /// A task saw end of input everywhere, its final checkpoint (or stop-with-savepoint) is complete
    /// and it closed its operators and sinks. Before that checkpoint completed it is a
    /// [`Violation`]. Once every task finished, [`Decision::JobFinished`] follows.
    TaskFinished {
        /// The generation of the task.
        generation: Generation,
        /// The task that finished.
        task: TaskId,
    },
    /// The manifest asked for by [`Decision::CommitManifest`] is durable: the checkpoint is complete.
    /// Must follow that decision (a manifest outcome of a checkpoint that was not committing panics).
    ManifestCommitted {
        /// The checkpoint whose manifest is durable.
        checkpoint: CheckpointId,
    },
    /// The manifest write failed (it may or may not be durable; storage is the judge at restore).
    /// The checkpoint is aborted; if it was the one that ends the job, the job fails over.
    ManifestFailed {
        /// The checkpoint whose manifest write failed.
        checkpoint: CheckpointId,
        /// The storage error, for the abort reason.
        reason: String,
    },
    /// The lease asked for by [`Decision::ExtendLease`] is durable.
    LeaseExtended {
        /// The new lease end: the one [`Decision::ExtendLease`] asked for. Panics unless it is above
        /// the current one.
        lease_end: CheckpointId,
    },
    /// The user asks for a savepoint now; [`Decision::SavepointRejected`] answers if it cannot start.
    SavepointRequested {
        /// Stop the job once the savepoint is complete: sources end their input after its barrier,
        /// the job drains, commits and stops.
        stop: bool,
    },
}

/// Why a checkpoint was aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// The checkpoint was not complete [`CheckpointConfig::timeout_ms`](super::CheckpointConfig::timeout_ms)
    /// after its trigger (a checkpoint whose manifest is being written never times out).
    Timeout {
        /// The tasks whose acknowledgement was missing, in task id order.
        missing: Vec<TaskId>,
    },
    /// A task reported [`Event::Declined`].
    Declined {
        /// The task that declined.
        task: TaskId,
        /// The reason it gave.
        reason: String,
    },
    /// The runtime reported [`Event::ManifestFailed`] with this reason.
    ManifestFailed(String),
    /// A newer checkpoint completed first.
    Subsumed {
        /// The newer checkpoint that completed.
        by: CheckpointId,
    },
    /// The job is failing over.
    FailOver,
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbortReason::Timeout { missing } => write!(f, "timed out waiting for {missing:?}"),
            AbortReason::Declined { task, reason } => write!(f, "declined by {task}: {reason}"),
            AbortReason::ManifestFailed(r) => write!(f, "manifest write failed: {r}"),
            AbortReason::Subsumed { by } => write!(f, "subsumed by {by}"),
            AbortReason::FailOver => f.write_str("aborted by a failover"),
        }
    }
}

impl AbortReason {
    /// Does this abort count against
    /// [`CheckpointConfig::tolerable_failures`](super::CheckpointConfig::tolerable_failures)? Timeouts,
    /// declines and failed manifest writes do, except those of savepoints (the coordinator reports a
    /// failed savepoint to whoever asked and counts nothing).
    pub fn counts_as_failure(&self) -> bool {
        matches!(self, AbortReason::Timeout { .. } | AbortReason::Declined { .. } | AbortReason::ManifestFailed(_))
    }
}

/// Outputs of the coordinator, to be carried out by the runtime in order.
#[derive(Clone, Debug)]
pub enum Decision<R> {
    /// Durably record that epochs below `lease_end` may be issued, then report [`Event::LeaseExtended`].
    /// Until then nothing is triggered.
    ExtendLease {
        /// The new lease end, [`EPOCH_LEASE_BLOCK`](super::EPOCH_LEASE_BLOCK) above the current one
        /// (less near `u64::MAX`).
        lease_end: CheckpointId,
    },
    /// Every checkpoint id below `lease_end` (`u64::MAX`) is issued and there is no next one: no
    /// further checkpoint can be taken. Only a crafted or damaged `job.meta` starts a job this close
    /// to the end of the id space. End the run with an error; the coordinator triggers nothing more.
    EpochsExhausted {
        /// The lease end reached (`CheckpointId(u64::MAX)`).
        lease_end: CheckpointId,
    },
    /// Inject this barrier at every source task.
    Trigger {
        /// The barrier, with its checkpoint, kind, mode and alignment.
        barrier: Barrier,
    },
    /// Every task acked: write the manifest (the commit point), then report the outcome with
    /// [`Event::ManifestCommitted`] or [`Event::ManifestFailed`].
    CommitManifest {
        /// The checkpoint to commit.
        checkpoint: CheckpointId,
        /// Its kind (the manifest of a [`SnapshotKind::Final`] checkpoint is marked final).
        kind: SnapshotKind,
        /// The generation committing it; storage fences a generation a newer one superseded.
        generation: Generation,
        /// Every task's report, in task id order.
        reports: Vec<(TaskId, R)>,
    },
    /// The checkpoint is complete: tell every task (sinks commit everything up to it) and collect garbage.
    NotifyComplete {
        /// The checkpoint that completed; it is newer than every checkpoint completed before.
        checkpoint: CheckpointId,
    },
    /// Tell tasks the checkpoint will never complete and discard its partial artifacts.
    Abort {
        /// The checkpoint aborted.
        checkpoint: CheckpointId,
        /// Why.
        reason: AbortReason,
    },
    /// Tear the job down and restore it from the latest complete checkpoint (if the restart strategy
    /// allows), then call [`Coordinator::restart`](super::Coordinator::restart).
    FailOver {
        /// Why, for the logs and the restart decision.
        reason: String,
    },
    /// The final checkpoint (or the savepoint of a stop-with-savepoint) is complete and every task
    /// finished: the job is done (`kind` Final) or stopped (`kind` StopSavepoint).
    JobFinished {
        /// The checkpoint that ended the job.
        checkpoint: CheckpointId,
        /// [`SnapshotKind::Final`] or [`SnapshotKind::StopSavepoint`].
        kind: SnapshotKind,
    },
    /// A savepoint request cannot be carried out now.
    SavepointRejected {
        /// Why, and what to do (for example to try again once the job runs).
        reason: String,
    },
}

/// How a checkpoint ended, for statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its manifest is durable.
    Completed,
    /// It was aborted, for this reason.
    Aborted(AbortReason),
}

/// Statistics of one finished checkpoint attempt.
#[derive(Clone, Debug)]
pub struct CheckpointStats {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// What it was for.
    pub kind: SnapshotKind,
    /// When it was triggered (the caller's clock).
    pub triggered_at: TimeMs,
    /// When it completed or was aborted.
    pub ended_at: TimeMs,
    /// Whether it completed.
    pub outcome: Outcome,
    /// The task whose acknowledgement came last (or is still missing): the one that held it up.
    pub slowest_task: Option<TaskId>,
    /// Acknowledgements received.
    pub acked: usize,
}

impl CheckpointStats {
    /// Milliseconds from the trigger to the end.
    pub fn duration_ms(&self) -> u64 {
        self.ended_at.saturating_sub(self.triggered_at)
    }
}

/// An event from a task (or the worker that sent it for the task) that the protocol does not allow:
/// an acknowledgement from a task the generation does not have, of a checkpoint never triggered, or a
/// second one; a task that is not a source reporting its input finished; a task finishing before the
/// checkpoint that ends the job completed. The coordinator ignores the event and changes nothing; the
/// runtime holds the sender responsible (a worker is dropped, a local task fails).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{task} sent an event the protocol does not allow: {what}")]
pub struct Violation {
    /// The task the event came from (or was sent for).
    pub task: TaskId,
    /// What the event was, for the message.
    pub what: String,
}
