//! What a run reports: the final [`JobReport`], per-checkpoint statistics ([`CheckpointSummary`]),
//! the figures of a running job ([`JobMetrics`], [`TaskReport`]), and a task's acknowledgement
//! ([`AckReport`]).

use super::driver::FailedCheckpoint;
use super::savepoint::SavepointInfo;
use super::task::SnapshotTimings;
use crate::channel::ChannelStats;
use cutline_core::coordinator::CheckpointConfig;
use cutline_core::{CheckpointId, Generation};
use cutline_storage::TaskStateHandle;
use std::sync::atomic::AtomicU64;

/// What a run that did not fail reports (a failed run returns its [`RunError`](super::RunError)
/// instead). A run that found the job already finished reports only `already_finished` and
/// `final_checkpoint`.
#[derive(Clone, Debug, Default)]
pub struct JobReport {
    /// The job had already finished before this run: nothing was done.
    pub already_finished: bool,
    /// The final checkpoint the job finished with (this run's, or the earlier run's when
    /// `already_finished`); `None` if the run was stopped.
    pub final_checkpoint: Option<CheckpointId>,
    /// The checkpoint this run restored at start, if any.
    pub restored_from: Option<CheckpointId>,
    /// Checkpoints (savepoints included) completed during this run.
    pub checkpoints_completed: u64,
    /// Checkpoints that failed during this run (timed out, declined, manifest not written); aborts by
    /// a failover, subsumed checkpoints and failed savepoints do not count.
    pub checkpoints_failed: u64,
    /// Restarts after failures during this run.
    pub restarts: u32,
    /// The checkpoints this run completed, oldest first: the most recent 1,000 of them.
    pub checkpoints: Vec<CheckpointSummary>,
    /// The checkpoints that failed (timed out, declined, manifest not written), with the tasks that
    /// held them up, oldest first: the most recent [`FAILED_CHECKPOINTS_KEPT`](super::FAILED_CHECKPOINTS_KEPT).
    pub failed_checkpoints: Vec<FailedCheckpoint>,
    /// Milliseconds from each failure to the restored job running again, one entry per recovery.
    pub recovery_ms: Vec<u64>,
    /// The run was stopped ([`JobControl::stop`](super::JobControl::stop),
    /// [`JobControl::stop_with_savepoint`](super::JobControl::stop_with_savepoint)) before the job
    /// finished.
    pub stopped: bool,
    /// The savepoint the job stopped with (stop-with-savepoint).
    pub stopped_with_savepoint: Option<SavepointInfo>,
    /// Milliseconds the run took, from its start to its end.
    pub elapsed_ms: u64,
}

/// Statistics of one completed checkpoint. Per-task figures are the maximum over the job's tasks.
#[derive(Clone, Debug, Default)]
pub struct CheckpointSummary {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// What it was for; always set for a completed checkpoint (`None` only in `Default`).
    pub kind: Option<cutline_core::barrier::SnapshotKind>,
    /// It was the final checkpoint, taken at the end of the input.
    pub is_final: bool,
    /// It was a savepoint (or the savepoint of a stop-with-savepoint).
    pub is_savepoint: bool,
    /// Milliseconds from the trigger to the manifest being durable.
    pub duration_ms: u64,
    /// Bytes of state files.
    pub bytes: u64,
    /// Longest barrier alignment at a task, in milliseconds (from its first barrier to its snapshot).
    pub alignment_ms: u64,
    /// Longest delay from the trigger to the first barrier at a task, in milliseconds.
    pub start_delay_ms: u64,
    /// Longest time from a task's snapshot to its state being durable, in milliseconds.
    pub persist_ms: u64,
    /// Longest time a task's state took to encode, in microseconds.
    pub encode_us: u64,
    /// Longest time a task's state took to write durably, in microseconds.
    pub write_us: u64,
    /// Longest synchronous part of the snapshot at a task (sharing its state and forwarding the
    /// barrier), in microseconds.
    pub sync_us: u64,
    /// State pages tasks copied because they wrote to them while the previous snapshot still read
    /// them, summed over tasks.
    pub page_copies: u64,
    /// The task whose acknowledgement came last.
    pub slowest_task: String,
    /// Tasks that snapshotted unaligned (from the start or after switching).
    pub unaligned_tasks: u32,
    /// Tasks where an aligned checkpoint switched to unaligned (alignment timeout or byte limit).
    pub switched_tasks: u32,
    /// Bytes of in-flight records persisted as channel state, summed over tasks.
    pub channel_state_bytes: u64,
}

/// A task's acknowledgement: where its state went and how long it took.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AckReport {
    /// Where the task's state file is, for the manifest.
    pub handle: TaskStateHandle,
    /// How the snapshot went at the task.
    pub timings: SnapshotTimings,
    /// Milliseconds from the task handing its captured state to the writers to the state being
    /// durable (waiting for a writer included).
    pub persist_ms: u64,
    /// Microseconds encoding the state copy (on the writer thread).
    pub encode_us: u64,
    /// Microseconds writing it durably.
    pub write_us: u64,
}
/// Where a task's time goes (since the job started), for metrics.
#[derive(Debug, Default)]
pub(crate) struct TaskMetrics {
    /// Sleeping because an output channel had no credit.
    pub backpressured_us: AtomicU64,
    /// Sleeping with nothing to read.
    pub idle_us: AtomicU64,
}

/// What a running job reports about itself (see [`JobControl::metrics`](super::JobControl::metrics)).
/// While the job waits to restart, only `config` is filled in (the rest is the default).
#[derive(Clone, Debug, Default)]
pub struct JobMetrics {
    /// The generation running now.
    pub generation: Generation,
    /// The checkpoint settings in force.
    pub config: CheckpointConfig,
    /// Every task of the generation, in task id order.
    pub tasks: Vec<TaskReport>,
    /// The most recent completed checkpoints of this run, oldest first (up to [`METRICS_CHECKPOINTS`]).
    pub checkpoints: Vec<CheckpointSummary>,
    /// Checkpoints completed during this run.
    pub checkpoints_completed: u64,
    /// Checkpoints failed during this run (counted as [`JobReport::checkpoints_failed`]).
    pub checkpoints_failed: u64,
    /// The most recent failed checkpoints, with the tasks that held them up, oldest first (up to
    /// [`METRICS_CHECKPOINTS`]).
    pub failed: Vec<FailedCheckpoint>,
    /// Checkpoints in flight now.
    pub pending: Vec<CheckpointId>,
}

/// Completed (and failed) checkpoints a [`JobMetrics`] lists, at most.
pub const METRICS_CHECKPOINTS: usize = 20;

/// One task's flow-control figures since the current generation started.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct TaskReport {
    /// The task: `<stage id>#<subtask>`.
    pub name: String,
    /// Milliseconds spent waiting because an output channel had no credit (backpressure).
    pub backpressured_ms: u64,
    /// Milliseconds spent waiting with nothing to read.
    pub idle_ms: u64,
    /// Occupancy of the channels the task reads.
    pub inputs: Vec<ChannelStats>,
}
