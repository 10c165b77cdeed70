//! What goes into the coordinator ([`Event`]), what comes out ([`Decision`]), why a checkpoint was
//! aborted, and the statistics it keeps.

use crate::barrier::{Barrier, SnapshotKind};
use crate::ids::{CheckpointId, Generation, TaskId, TimeMs};

/// Inputs to the coordinator.
#[derive(Clone, Debug)]
pub enum Event<R> {
    /// Time passed; periodic triggers and timeouts are evaluated.
    Tick,
    /// A task's part of `checkpoint` is durable.
    Acked { generation: Generation, checkpoint: CheckpointId, task: TaskId, report: R },
    /// A task could not take its part of `checkpoint` (for example a storage write failed).
    Declined { generation: Generation, checkpoint: CheckpointId, task: TaskId, reason: String },
    /// A task died.
    TaskFailed {
        generation: Generation,
        task: TaskId,
        reason: String,
        /// The task says restarting cannot mend it (the run lifecycle ends the run; the coordinator
        /// fails over alike).
        permanent: bool,
    },
    /// A bounded source read its last record.
    SourceFinished { generation: Generation, task: TaskId },
    /// A task saw end of input everywhere, its final checkpoint is complete and its sinks committed.
    TaskFinished { generation: Generation, task: TaskId },
    /// The manifest asked for by [`Decision::CommitManifest`] is durable: the checkpoint is complete.
    ManifestCommitted { checkpoint: CheckpointId },
    /// The manifest write failed (it may or may not be durable; storage is the judge at restore).
    ManifestFailed { checkpoint: CheckpointId, reason: String },
    /// The lease asked for by [`Decision::ExtendLease`] is durable.
    LeaseExtended { lease_end: CheckpointId },
    /// The user asks for a savepoint now; with `stop`, the job stops once it is complete.
    SavepointRequested { stop: bool },
}

/// Why a checkpoint was aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortReason {
    Timeout {
        missing: Vec<TaskId>,
    },
    Declined {
        task: TaskId,
        reason: String,
    },
    ManifestFailed(String),
    /// A newer checkpoint completed first.
    Subsumed {
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
    /// Does this abort count against [`CheckpointConfig::tolerable_failures`]?
    pub fn counts_as_failure(&self) -> bool {
        matches!(self, AbortReason::Timeout { .. } | AbortReason::Declined { .. } | AbortReason::ManifestFailed(_))
    }
}

/// Outputs of the coordinator, to be carried out by the runtime in order.
#[derive(Clone, Debug)]
pub enum Decision<R> {
    /// Durably record that epochs below `lease_end` may be issued, then report [`Event::LeaseExtended`].
    ExtendLease { lease_end: CheckpointId },
    /// Every checkpoint id below `lease_end` (`u64::MAX`) is issued and there is no next one: no
    /// further checkpoint can be taken. Only a crafted or damaged `job.meta` starts a job this close
    /// to the end of the id space. End the run with an error; the coordinator triggers nothing more.
    EpochsExhausted { lease_end: CheckpointId },
    /// Inject this barrier at every source task.
    Trigger { barrier: Barrier },
    /// Every task acked: write the manifest (the commit point), then report the outcome.
    CommitManifest { checkpoint: CheckpointId, kind: SnapshotKind, generation: Generation, reports: Vec<(TaskId, R)> },
    /// The checkpoint is complete: tell every task (sinks commit everything up to it) and collect garbage.
    NotifyComplete { checkpoint: CheckpointId },
    /// Tell tasks the checkpoint will never complete and discard its partial artifacts.
    Abort { checkpoint: CheckpointId, reason: AbortReason },
    /// Tear the job down and restore it from the latest complete checkpoint.
    FailOver { reason: String },
    /// The final checkpoint (or the savepoint of a stop-with-savepoint) is complete and every task
    /// finished: the job is done (`kind` Final) or stopped (`kind` StopSavepoint).
    JobFinished { checkpoint: CheckpointId, kind: SnapshotKind },
    /// A savepoint request cannot be carried out now.
    SavepointRejected { reason: String },
}

/// How a checkpoint ended, for statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    Aborted(AbortReason),
}

/// Statistics of one finished checkpoint attempt.
#[derive(Clone, Debug)]
pub struct CheckpointStats {
    pub checkpoint: CheckpointId,
    pub kind: SnapshotKind,
    pub triggered_at: TimeMs,
    pub ended_at: TimeMs,
    pub outcome: Outcome,
    /// The task whose acknowledgement came last (or is still missing): the one that held it up.
    pub slowest_task: Option<TaskId>,
    /// Acknowledgements received.
    pub acked: usize,
}

impl CheckpointStats {
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
    pub task: TaskId,
    pub what: String,
}
