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

/// What a finished run reports.
#[derive(Clone, Debug, Default)]
pub struct JobReport {
    /// The job had already finished before this run: nothing was done.
    pub already_finished: bool,
    pub final_checkpoint: Option<CheckpointId>,
    /// The checkpoint this run restored at start, if any.
    pub restored_from: Option<CheckpointId>,
    pub checkpoints_completed: u64,
    pub checkpoints_failed: u64,
    pub restarts: u32,
    /// Every checkpoint this run completed, in order.
    pub checkpoints: Vec<CheckpointSummary>,
    /// The checkpoints that failed (timed out, declined, manifest not written), with the tasks that
    /// held them up (the most recent 100).
    pub failed_checkpoints: Vec<FailedCheckpoint>,
    /// Time from each failure to the restored job running again.
    pub recovery_ms: Vec<u64>,
    /// The run was stopped through [`JobHandle::stop`] or [`JobHandle::stop_with_savepoint`] before
    /// the job finished.
    pub stopped: bool,
    /// The savepoint the job stopped with (stop-with-savepoint).
    pub stopped_with_savepoint: Option<SavepointInfo>,
    pub elapsed_ms: u64,
}

/// Statistics of one completed checkpoint. Per-task figures are the maximum over the job's tasks.
#[derive(Clone, Debug, Default)]
pub struct CheckpointSummary {
    pub checkpoint: CheckpointId,
    pub kind: Option<cutline_core::barrier::SnapshotKind>,
    pub is_final: bool,
    pub is_savepoint: bool,
    /// Trigger to manifest durable.
    pub duration_ms: u64,
    /// Bytes of state files.
    pub bytes: u64,
    /// Longest barrier alignment at a task (first to last barrier of its inputs).
    pub alignment_ms: u64,
    /// Longest delay from the trigger to the first barrier at a task.
    pub start_delay_ms: u64,
    /// Longest time from a task's snapshot to its state being durable.
    pub persist_ms: u64,
    pub encode_us: u64,
    pub write_us: u64,
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
    pub handle: TaskStateHandle,
    pub timings: SnapshotTimings,
    /// From the barrier at the task to the state being durable.
    pub persist_ms: u64,
    /// Encoding the state copy (on the writer thread).
    pub encode_us: u64,
    /// Writing it durably.
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

/// What a running job reports about itself (see [`JobControl::metrics`]).
#[derive(Clone, Debug, Default)]
pub struct JobMetrics {
    pub generation: Generation,
    pub config: CheckpointConfig,
    pub tasks: Vec<TaskReport>,
    /// The most recent completed checkpoints of this run (up to [`METRICS_CHECKPOINTS`]).
    pub checkpoints: Vec<CheckpointSummary>,
    pub checkpoints_completed: u64,
    pub checkpoints_failed: u64,
    /// The most recent failed checkpoints, with the tasks that held them up.
    pub failed: Vec<FailedCheckpoint>,
    /// Checkpoints in flight now.
    pub pending: Vec<CheckpointId>,
}

/// Completed checkpoints a [`JobMetrics`] lists.
pub const METRICS_CHECKPOINTS: usize = 20;

/// One task's flow-control figures since the current generation started.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct TaskReport {
    pub name: String,
    /// Time spent waiting because an output channel had no credit (backpressure).
    pub backpressured_ms: u64,
    /// Time spent waiting with nothing to read.
    pub idle_ms: u64,
    /// Occupancy of the channels the task reads.
    pub inputs: Vec<ChannelStats>,
}
