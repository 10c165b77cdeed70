//! Epoch traces: the path of one checkpoint through the job, from its trigger at the coordinator to
//! the barrier at every input of every task, the snapshot, the upload, the ack, the commit and the
//! notification, with every time measured from the trigger. A completed checkpoint's
//! [`CheckpointRecord`] (its statistics and trace) is written to the store as `stats/chk-<id>`, JSON
//! in a checksummed frame, after the checkpoint completed: `cutline trace`, the dashboard and later
//! runs read it back, so statistics outlive the process that took the checkpoint.
//!
//! Clocks: task times come from the task's process, coordinator times from the coordinator's, both
//! counted from the trigger (whole milliseconds of the coordinator's clock). Within one process the
//! two clocks are one; across processes they differ by the skew between the machines.

use super::report::AckReport;
use crate::dataflow::{EdgeKind, JobGraph};
use cutline_core::barrier::SnapshotKind;
use serde::{Deserialize, Serialize};

/// The format version of [`CheckpointRecord`] (its `version` field).
pub const CHECKPOINT_RECORD_VERSION: u32 = 1;

/// A completed checkpoint's statistics and epoch trace, as kept in the store (`stats/chk-<id>`).
/// Fields missing from a stored record (written by an older cutline) read as their defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointRecord {
    /// [`CHECKPOINT_RECORD_VERSION`] when written.
    pub version: u32,
    /// The checkpoint.
    pub checkpoint: u64,
    /// The generation that took it.
    pub generation: u64,
    /// `checkpoint`, `final`, `savepoint` or `stop-with-savepoint`.
    pub kind: String,
    /// Wall-clock time of the trigger, milliseconds since the Unix epoch.
    pub triggered_at_unix_ms: u64,
    /// Trigger to manifest durable, milliseconds.
    pub duration_ms: u64,
    /// Bytes of state files.
    pub bytes: u64,
    /// Bytes of in-flight records persisted as channel state, over all tasks.
    pub channel_state_bytes: u64,
    /// Tasks that snapshotted unaligned.
    pub unaligned_tasks: u32,
    /// Tasks where the aligned checkpoint switched to unaligned.
    pub switched_tasks: u32,
    /// The task whose ack came last.
    pub slowest_task: String,
    /// Trigger to the last ack at the coordinator, microseconds.
    pub last_ack_us: u64,
    /// Trigger to the manifest being durable (the commit point), microseconds.
    pub committed_us: u64,
    /// Trigger to the tasks being told to commit (notify), microseconds.
    pub notified_us: u64,
    /// Every task's part, in task order (stage by stage).
    pub tasks: Vec<TaskTrace>,
}

/// One task's part in a checkpoint, times in microseconds from the trigger.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskTrace {
    /// `stage#subtask`.
    pub task: String,
    /// The barrier's arrival on each input (empty at a source, where the trigger injects it).
    pub inputs: Vec<InputTrace>,
    /// Trigger to the snapshot: a source's injection of the barrier, the last barrier of an aligned
    /// checkpoint, the first of an unaligned one.
    pub snapshot_us: u64,
    /// The synchronous part of the snapshot (sharing the state, forwarding the barrier).
    pub sync_us: u64,
    /// Trigger to the snapshot being handed to the writers (an unaligned one only once the barrier
    /// arrived on every input: the in-flight records are part of it).
    pub handoff_us: u64,
    /// Trigger to the state being durable (after the asynchronous upload).
    pub durable_us: u64,
    /// Of the asynchronous part: encoding.
    pub encode_us: u64,
    /// Of the asynchronous part: writing to storage.
    pub write_us: u64,
    /// Trigger to the ack arriving at the coordinator.
    pub acked_us: u64,
    /// Bytes of the task's state file.
    pub bytes: u64,
    /// Bytes of in-flight records persisted (unaligned).
    pub channel_state_bytes: u64,
    /// Records that piled up on the other inputs while aligning (aligned).
    pub blocked_records: u64,
    /// The snapshot was unaligned here.
    pub unaligned: bool,
    /// The checkpoint switched from aligned to unaligned here.
    pub switched: bool,
}

/// The barrier on one input of a task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InputTrace {
    /// The upstream task (`stage#subtask`).
    pub from: String,
    /// Trigger to the barrier's arrival; `None` if the input had ended.
    pub barrier_us: Option<u64>,
}

/// One step on a checkpoint's critical path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Where it happened: a task, `upstream -> downstream` for a transit, `coordinator`.
    pub at: String,
    /// What it is.
    pub what: StepKind,
    /// How long it took, microseconds.
    pub us: u64,
}

/// The steps a checkpoint's barrier, snapshot and ack go through, and the question each answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Trigger to the barrier leaving a source: the source was busy with a batch or backpressured.
    Injection,
    /// A task forwarding the barrier to the next task receiving it: the barrier waited behind
    /// records queued in the channel (backpressure).
    Transit,
    /// The synchronous snapshot at a task (sharing its state, forwarding the barrier).
    Sync,
    /// An unaligned snapshot waiting for the barrier on its other inputs while it records the
    /// records they deliver (in-flight data).
    ChannelState,
    /// Handed to the writers to durable: encoding and writing the state (snapshot I/O).
    Upload,
    /// Durable to the ack at the coordinator.
    Ack,
    /// Last ack to the manifest being durable.
    Commit,
    /// Manifest durable to the tasks being notified.
    Notify,
}

impl StepKind {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Injection => "injection",
            StepKind::Transit => "transit",
            StepKind::Sync => "sync snapshot",
            StepKind::ChannelState => "channel state",
            StepKind::Upload => "upload",
            StepKind::Ack => "ack",
            StepKind::Commit => "commit",
            StepKind::Notify => "notify",
        }
    }
    /// What a slow step of this kind means, and so which of the three questions it answers
    /// (propagation, snapshot I/O, buffering).
    pub fn meaning(self) -> &'static str {
        match self {
            StepKind::Injection => {
                "propagation: the barrier waited at the source before it went out (the source was busy with a batch, or backpressured)"
            }
            StepKind::Transit => "propagation: the barrier waited behind records queued in a channel (backpressure)",
            StepKind::Sync => "the task's synchronous snapshot was slow",
            StepKind::ChannelState => {
                "buffering: the unaligned snapshot waited for the barrier on the task's other inputs, recording their records"
            }
            StepKind::Upload => "snapshot I/O: the task was slow to encode and write its state",
            StepKind::Ack => "the ack was slow to reach the coordinator",
            StepKind::Commit => "storage: the manifest was slow to become durable",
            StepKind::Notify => "the coordinator was slow to notify the tasks",
        }
    }
}

impl TaskTrace {
    /// First barrier arrival (or the injection at a source).
    pub fn first_barrier_us(&self) -> u64 {
        self.inputs.iter().filter_map(|i| i.barrier_us).min().unwrap_or(self.snapshot_us)
    }
    /// Last barrier arrival (or the injection at a source).
    pub fn last_barrier_us(&self) -> u64 {
        self.inputs.iter().filter_map(|i| i.barrier_us).max().unwrap_or(self.snapshot_us)
    }
    /// First to last barrier: how long the task aligned (its inputs that delivered the barrier
    /// waited, blocked in exactly-once aligned mode, for the others).
    pub fn alignment_us(&self) -> u64 {
        self.last_barrier_us().saturating_sub(self.first_barrier_us())
    }
    /// When the barrier left this task downstream: at the end of the synchronous snapshot.
    pub fn forwarded_us(&self) -> u64 {
        self.snapshot_us + self.sync_us
    }
}

/// Longest path a critical-path walk follows upstream (a graph has fewer stages than this).
const MAX_PATH_TASKS: usize = 1_000;

impl CheckpointRecord {
    /// The critical path, in order: from the trigger, through the source whose barrier reached the
    /// task acked last by the latest route, along the barrier's transits and snapshots, to that
    /// task's upload and ack, the commit and the notification. At each task it follows the input
    /// whose barrier set off the snapshot (the last of an aligned task, the first of an unaligned
    /// one).
    pub fn critical_path(&self) -> Vec<Step> {
        let by_name: std::collections::HashMap<&str, &TaskTrace> =
            self.tasks.iter().map(|t| (t.task.as_str(), t)).collect();
        let coordinator = |what, us| Step { at: "coordinator".into(), what, us };
        let mut rev = vec![
            coordinator(StepKind::Notify, self.notified_us.saturating_sub(self.committed_us)),
            coordinator(StepKind::Commit, self.committed_us.saturating_sub(self.last_ack_us)),
        ];
        let Some(mut t) = self.tasks.iter().max_by_key(|t| t.acked_us) else {
            rev.reverse();
            return rev;
        };
        let step = |t: &TaskTrace, what, us| Step { at: t.task.clone(), what, us };
        rev.push(step(t, StepKind::Ack, t.acked_us.saturating_sub(t.durable_us)));
        rev.push(step(t, StepKind::Upload, t.durable_us.saturating_sub(t.handoff_us)));
        if t.handoff_us > t.forwarded_us() {
            rev.push(step(t, StepKind::ChannelState, t.handoff_us - t.forwarded_us()));
        }
        for _ in 0..MAX_PATH_TASKS {
            rev.push(step(t, StepKind::Sync, t.sync_us));
            if t.inputs.is_empty() {
                rev.push(step(t, StepKind::Injection, t.snapshot_us));
                break;
            }
            // The arrival that set off the snapshot: the latest one up to it.
            let arrived = t.inputs.iter().filter_map(|i| i.barrier_us.map(|at| (at, i.from.as_str())));
            let gate = arrived.clone().filter(|(at, _)| *at <= t.snapshot_us).max().or_else(|| arrived.min());
            let Some((at, from)) = gate else { break };
            let Some(u) = by_name.get(from).copied().filter(|u| !std::ptr::eq(*u, t)) else { break };
            rev.push(Step {
                at: format!("{from} -> {}", t.task),
                what: StepKind::Transit,
                us: at.saturating_sub(u.forwarded_us()),
            });
            t = u;
        }
        rev.reverse();
        rev
    }
    /// The longest step of the critical path.
    pub fn slowest_step(&self) -> Option<Step> {
        self.critical_path().into_iter().max_by_key(|s| s.us)
    }
    /// The task that aligned longest, with its alignment in microseconds (buffering: what its
    /// blocked inputs held is `blocked_records`).
    pub fn longest_alignment(&self) -> Option<(&TaskTrace, u64)> {
        self.tasks.iter().map(|t| (t, t.alignment_us())).filter(|(_, us)| *us > 0).max_by_key(|(_, us)| *us)
    }
    /// The record as stored (JSON).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record always serializes")
    }
    /// A stored record; an error says what is wrong with it.
    pub fn from_json(bytes: &[u8]) -> Result<CheckpointRecord, String> {
        let r: CheckpointRecord = serde_json::from_slice(bytes).map_err(|e| format!("not a checkpoint record: {e}"))?;
        if r.version > CHECKPOINT_RECORD_VERSION {
            return Err(format!(
                "written by a newer cutline (record version {}, this one reads up to {CHECKPOINT_RECORD_VERSION})",
                r.version
            ));
        }
        Ok(r)
    }
}

/// The name of a snapshot kind in records.
pub fn kind_name(kind: SnapshotKind) -> &'static str {
    match kind {
        SnapshotKind::Checkpoint => "checkpoint",
        SnapshotKind::Final => "final",
        SnapshotKind::Savepoint => "savepoint",
        SnapshotKind::StopSavepoint => "stop-with-savepoint",
    }
}

/// Per task (in task order), the upstream task of each of its inputs, in the order the task reads
/// them: input edges in order, and on each the upstream subtasks in order (one on a forward edge).
pub(crate) fn input_names(graph: &JobGraph) -> Vec<Vec<String>> {
    let mut names = Vec::with_capacity(graph.task_count());
    for st in graph.stages.iter() {
        for sub in 0..st.parallelism {
            let mut inputs = Vec::new();
            for &e in &st.inputs {
                let edge = &graph.edges[e];
                let from = &graph.stages[edge.from];
                if edge.kind == EdgeKind::Forward {
                    inputs.push(format!("{}#{sub}", from.uid));
                } else {
                    inputs.extend((0..from.parallelism).map(|u| format!("{}#{u}", from.uid)));
                }
            }
            names.push(inputs);
        }
    }
    names
}

/// A task's trace from its ack, received `acked_us` after the trigger.
pub(crate) fn task_trace(name: &str, inputs: Option<&Vec<String>>, r: &AckReport, acked_us: u64) -> TaskTrace {
    let t = &r.timings;
    let inputs = t
        .input_barriers_us
        .iter()
        .enumerate()
        .map(|(i, at)| InputTrace {
            from: inputs.and_then(|n| n.get(i)).cloned().unwrap_or_else(|| format!("input {i}")),
            barrier_us: *at,
        })
        .collect();
    TaskTrace {
        task: name.to_string(),
        inputs,
        snapshot_us: t.snapshot_at_us,
        sync_us: t.sync_us,
        handoff_us: t.handoff_at_us,
        durable_us: t.handoff_at_us + r.persist_us,
        encode_us: r.encode_us,
        write_us: r.write_us,
        acked_us,
        bytes: r.handle.size_bytes,
        channel_state_bytes: t.channel_state_bytes,
        blocked_records: t.blocked_records,
        unaligned: t.unaligned,
        switched: t.switched,
    }
}
