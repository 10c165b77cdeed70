//! What a run reports: the final [`JobReport`], per-checkpoint statistics ([`CheckpointSummary`]),
//! the figures of a running job ([`JobMetrics`], [`TaskReport`]), and a task's acknowledgement
//! ([`AckReport`]).

use super::driver::FailedCheckpoint;
use super::savepoint::SavepointInfo;
use super::stats::{CheckpointHistograms, RunCounters, TaskCheckpoint};
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
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckpointSummary {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// The generation that took it.
    pub generation: Generation,
    /// Wall-clock time of its trigger, milliseconds since the Unix epoch.
    pub triggered_at_unix_ms: u64,
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
    /// State entries tasks saved for the previous snapshot before overwriting them (instead of
    /// copying their pages), summed over tasks.
    pub saved_entries: u64,
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
    /// `persist_ms` in microseconds.
    pub persist_us: u64,
    /// When the coordinator received the ack (its clock, microseconds since the run started); set on
    /// receipt, never sent.
    #[serde(skip)]
    pub received_at_us: u64,
}
/// Where a task's time goes (since the job started), for metrics.
#[derive(Debug, Default)]
pub(crate) struct TaskMetrics {
    /// Sleeping because an output channel had no credit.
    pub backpressured_us: AtomicU64,
    /// Sleeping with nothing to read.
    pub idle_us: AtomicU64,
    /// Sources: records read from the source.
    pub records_read: AtomicU64,
}

/// What a running job reports about itself (see [`JobControl::metrics`](super::JobControl::metrics)).
/// While the job waits to restart, `tasks` is empty and `generation` is 0; the history, the
/// counters and the settings are there.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct JobMetrics {
    /// The generation running now.
    pub generation: Generation,
    /// The job's stages and the edges between them (the same for every generation).
    pub stages: Vec<StageShape>,
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
    /// The run's counters (aborts, restarts, restores, fallbacks), from its start.
    pub counters: RunCounters,
    /// The run's distributions of checkpoint and per-task snapshot figures, from its start.
    pub histograms: CheckpointHistograms,
    /// Milliseconds since the run started.
    pub uptime_ms: u64,
}

/// Completed (and failed) checkpoints a [`JobMetrics`] lists, at most, unless more are asked for
/// ([`JobControl::metrics_with_history`](super::JobControl::metrics_with_history)).
pub const METRICS_CHECKPOINTS: usize = 20;

/// One stage of a job, for pictures of its graph.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StageShape {
    /// The stage's id (its tasks are `<uid>#<subtask>`).
    pub uid: String,
    /// Its number of tasks.
    pub parallelism: u32,
    /// The edges into it.
    pub inputs: Vec<EdgeShape>,
}

/// An edge into a stage.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EdgeShape {
    /// The upstream stage's id.
    pub from: String,
    /// `forward`, `hash`, `rebalance` or `broadcast`.
    pub kind: String,
}

/// The stages of `graph`.
pub(crate) fn graph_shape(graph: &crate::dataflow::JobGraph) -> Vec<StageShape> {
    use crate::dataflow::EdgeKind;
    graph
        .stages
        .iter()
        .map(|st| StageShape {
            uid: st.uid.clone(),
            parallelism: st.parallelism,
            inputs: st
                .inputs
                .iter()
                .map(|&e| {
                    let edge = &graph.edges[e];
                    let kind = match edge.kind {
                        EdgeKind::Forward => "forward",
                        EdgeKind::Hash => "hash",
                        EdgeKind::Rebalance => "rebalance",
                        EdgeKind::Broadcast => "broadcast",
                    };
                    EdgeShape { from: graph.stages[edge.from].uid.clone(), kind: kind.into() }
                })
                .collect(),
        })
        .collect()
}

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
    /// Records the task took from its inputs, or (a source) read from its source.
    #[serde(default)]
    pub records_in: u64,
    /// Records the downstream tasks took from this task's output channels (0 for a sink).
    #[serde(default)]
    pub records_out: u64,
    /// The task's part in the latest committed checkpoint of this generation (filled in by the
    /// coordinator).
    #[serde(skip)]
    pub last_checkpoint: Option<TaskCheckpoint>,
}

/// Fill in every task's `records_out` from the input channels of the others (a channel is named
/// `upstream#i->downstream#j`).
pub(crate) fn fill_records_out(tasks: &mut [TaskReport]) {
    let mut out: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for c in tasks.iter().flat_map(|t| &t.inputs) {
        if let Some((from, _)) = c.name.split_once("->") {
            *out.entry(from).or_default() += c.records;
        }
    }
    let out: Vec<u64> = tasks.iter().map(|t| out.get(t.name.as_str()).copied().unwrap_or(0)).collect();
    for (t, n) in tasks.iter_mut().zip(out) {
        t.records_out = n;
    }
}

/// Timings and shape of one snapshot at one task.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct SnapshotTimings {
    /// Milliseconds from the first barrier of the checkpoint at this task to its snapshot (0 at a
    /// source).
    pub alignment_ms: u64,
    /// Milliseconds from the trigger at the coordinator to the first barrier at this task.
    pub start_delay_ms: u64,
    /// The snapshot was unaligned here (from the start, or switched).
    pub unaligned: bool,
    /// The checkpoint started aligned and this task switched it to unaligned (alignment timeout or
    /// byte limit, here or upstream).
    pub switched: bool,
    /// Bytes of in-flight records persisted as channel state.
    pub channel_state_bytes: u64,
    /// Microseconds the task spent on the barrier's synchronous part: sharing its state with the
    /// snapshot and forwarding the barrier.
    pub sync_us: u64,
    /// State pages the task copied since its previous snapshot because it wrote to them while
    /// a snapshot still read them (memory that a snapshot cost beyond the state itself).
    pub page_copies: u64,
    /// State entries the task saved since its previous snapshot for a snapshot that still read
    /// them, before overwriting them (the other memory a snapshot costs).
    pub saved_entries: u64,
    /// Microseconds from the trigger (coordinator clock, whole milliseconds) to the snapshot here:
    /// the last barrier of an aligned checkpoint, the first of an unaligned one.
    pub snapshot_at_us: u64,
    /// Per input, microseconds from the trigger to the checkpoint's barrier arriving on it (`None`:
    /// the input had ended).
    pub input_barriers_us: Vec<Option<u64>>,
    /// Records queued on the task's other inputs when an aligned snapshot was taken: the data that
    /// piled up behind barriers during the alignment (0 for unaligned snapshots and sources).
    pub blocked_records: u64,
    /// Microseconds from the trigger to the snapshot being handed to the writers (an unaligned one
    /// once the barrier arrived on every input).
    pub handoff_at_us: u64,
}
