//! The statistics of a run's checkpoints, assembled from acks and the coordinator's decisions: the
//! completed and failed checkpoints kept for reports ([`CheckpointLog`]), each task's part in the
//! latest committed checkpoint ([`TaskCheckpoint`]), the run's counters ([`RunCounters`]) and the
//! distributions metrics export ([`CheckpointHistograms`]).
//!
//! Everything here is bounded: at most [`CHECKPOINTS_KEPT`] completed and [`FAILED_CHECKPOINTS_KEPT`]
//! failed checkpoints, one entry per task, and histograms of fixed buckets.

use super::driver::FailedCheckpoint;
use super::report::{AckReport, CheckpointSummary};
use super::trace::{kind_name, task_trace, CheckpointRecord, CHECKPOINT_RECORD_VERSION};
use cutline_core::barrier::SnapshotKind;
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use std::collections::HashMap;

/// Failed checkpoints a run keeps the reasons of.
pub const FAILED_CHECKPOINTS_KEPT: usize = 100;
/// Completed checkpoints a run keeps the statistics of (the most recent; a run that checkpoints every
/// 100 ms for a day would otherwise keep 864,000).
pub const CHECKPOINTS_KEPT: usize = 1_000;

/// Statistics of the checkpoints of a run, assembled from acks and the coordinator's history.
#[derive(Default)]
pub(crate) struct CheckpointLog {
    /// Checkpoints whose manifest is committed, waiting for the coordinator's completion.
    pub(super) pending: HashMap<CheckpointId, CheckpointSummary>,
    /// Trigger time of each checkpoint in flight, coordinator clock and wall clock (removed when it
    /// completes or aborts).
    pub(super) triggered: HashMap<CheckpointId, (TimeMs, u64)>,
    /// Records of checkpoints whose manifest is committed, waiting for the completion.
    records: HashMap<CheckpointId, CheckpointRecord>,
    /// Per task, the upstream task of each input (see [`super::trace::input_names`]).
    pub(super) inputs: Vec<Vec<String>>,
    /// The job's stages, for [`JobMetrics::stages`](super::JobMetrics::stages).
    pub(super) shape: Vec<super::report::StageShape>,
    /// Completed checkpoints, oldest first, at most [`CHECKPOINTS_KEPT`].
    pub done: Vec<CheckpointSummary>,
    /// Checkpoints that failed (not those aborted by a failover or subsumed), oldest first, at most
    /// [`FAILED_CHECKPOINTS_KEPT`].
    pub failed: Vec<FailedCheckpoint>,
    pub task_names: Vec<String>,
    /// Each task's part in the latest committed checkpoint it took part in, by task id.
    pub parts: Vec<Option<TaskCheckpoint>>,
    pub counters: RunCounters,
    pub histograms: CheckpointHistograms,
    /// Where completed checkpoints' records go (the store, the run's listener).
    pub(crate) keeper: super::keeper::RecordKeeper,
}

/// Checkpoint records a run reads back from the store at its start, the newest (the history that
/// survives a restart of the process).
pub const HISTORY_LOADED: usize = 100;

impl CheckpointLog {
    /// The log of a run of `graph`.
    pub(crate) fn for_graph(graph: &crate::dataflow::JobGraph) -> CheckpointLog {
        CheckpointLog {
            inputs: super::trace::input_names(graph),
            shape: super::report::graph_shape(graph),
            ..Default::default()
        }
    }

    /// Read back the newest [`HISTORY_LOADED`] checkpoint records of earlier runs, as completed
    /// checkpoints. Statistics decide nothing: a record that cannot be read is skipped with a warning.
    pub(crate) fn load_history(&mut self, store: &dyn cutline_storage::CheckpointStore) {
        let ids = match store.list_stats() {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(
                    event = "checkpoint_history_unreadable",
                    "earlier checkpoint statistics cannot be listed: {e}"
                );
                return;
            }
        };
        for id in &ids[ids.len().saturating_sub(HISTORY_LOADED)..] {
            match store.read_stats(*id).map(|b| b.map(|b| CheckpointRecord::from_json(&b))) {
                Ok(Some(Ok(r))) => self.done.push(summary_of(&r)),
                Ok(None) => {}
                Ok(Some(Err(e))) => {
                    tracing::warn!(event = "checkpoint_record_unreadable", chk = %id, "statistics of {id}: {e}")
                }
                Err(e) => tracing::warn!(event = "checkpoint_record_unreadable", chk = %id, "statistics of {id}: {e}"),
            }
        }
    }

    /// What the log knows of a running job's metrics: the recent `checkpoints` completed and failed
    /// ones, `tasks` with their part in the latest checkpoint, the graph, counters and histograms.
    pub(super) fn metrics(
        &self,
        checkpoints: usize,
        mut tasks: Vec<super::TaskReport>,
        uptime_ms: u64,
    ) -> super::JobMetrics {
        for (t, part) in tasks.iter_mut().zip(&self.parts) {
            t.last_checkpoint = part.clone();
        }
        let (done, failed) = (&self.done, &self.failed);
        super::JobMetrics {
            stages: self.shape.clone(),
            tasks,
            checkpoints: done[done.len().saturating_sub(checkpoints)..].to_vec(),
            failed: failed[failed.len().saturating_sub(checkpoints)..].to_vec(),
            counters: self.counters.clone(),
            histograms: self.histograms.clone(),
            uptime_ms,
            ..Default::default()
        }
    }

    /// A checkpoint was triggered at `at` (coordinator clock) and `unix_ms` (wall clock).
    pub(super) fn on_triggered(&mut self, checkpoint: CheckpointId, at: TimeMs, unix_ms: u64) {
        self.triggered.insert(checkpoint, (at, unix_ms));
    }

    /// The acks of a checkpoint about to be committed: every task's part, its trace, and the
    /// per-task distributions.
    pub(super) fn on_acked(
        &mut self,
        checkpoint: CheckpointId,
        generation: Generation,
        kind: SnapshotKind,
        reports: &[(TaskId, AckReport)],
    ) {
        let (at, unix_ms) = self.triggered.get(&checkpoint).copied().unwrap_or((TimeMs(0), 0));
        let origin_us = at.0.saturating_mul(1000);
        let mut record = CheckpointRecord {
            version: CHECKPOINT_RECORD_VERSION,
            checkpoint: checkpoint.0,
            generation: generation.0,
            kind: kind_name(kind).to_string(),
            triggered_at_unix_ms: unix_ms,
            ..Default::default()
        };
        for (task, r) in reports {
            let i = task.0 as usize;
            let name = self.task_names.get(i).cloned().unwrap_or_else(|| task.to_string());
            let trace = task_trace(&name, self.inputs.get(i), r, r.received_at_us.saturating_sub(origin_us));
            let t = &r.timings;
            let ack_us = trace.acked_us.saturating_sub(trace.durable_us);
            let part = TaskCheckpoint {
                checkpoint,
                start_delay_ms: t.start_delay_ms,
                alignment_ms: t.alignment_ms,
                sync_us: t.sync_us,
                persist_ms: r.persist_ms,
                encode_us: r.encode_us,
                write_us: r.write_us,
                ack_latency_ms: ack_us / 1000,
                bytes: r.handle.size_bytes,
                channel_state_bytes: t.channel_state_bytes,
                blocked_records: t.blocked_records,
                unaligned: t.unaligned,
            };
            record.last_ack_us = record.last_ack_us.max(trace.acked_us);
            record.tasks.push(trace);
            let h = &mut self.histograms;
            h.task_start_delay_ms.observe(part.start_delay_ms as f64);
            h.task_alignment_ms.observe(part.alignment_ms as f64);
            h.task_sync_us.observe(part.sync_us as f64);
            h.task_persist_ms.observe(r.persist_us as f64 / 1e3);
            h.task_ack_latency_ms.observe(ack_us as f64 / 1e3);
            h.task_blocked_records.observe(part.blocked_records as f64);
            if i < self.task_names.len() {
                if self.parts.len() < self.task_names.len() {
                    self.parts.resize(self.task_names.len(), None);
                }
                self.parts[i] = Some(part);
            }
        }
        record.tasks.sort_by_key(|t| self.task_names.iter().position(|n| *n == t.task));
        self.records.insert(checkpoint, record);
    }

    /// The manifest of `checkpoint` is durable, `now_us` on the coordinator's clock.
    pub(super) fn on_manifest_durable(&mut self, checkpoint: CheckpointId, now_us: u64) {
        let origin = self.triggered.get(&checkpoint).map_or(0, |(at, _)| at.0.saturating_mul(1000));
        if let Some(r) = self.records.get_mut(&checkpoint) {
            r.committed_us = now_us.saturating_sub(origin);
        }
    }

    /// A checkpoint completed: the tasks are notified at `now_us` (coordinator clock). Returns its
    /// record, for storage.
    pub(super) fn on_completed(&mut self, sum: CheckpointSummary, now_us: u64) -> Option<CheckpointRecord> {
        let origin = self.triggered.remove(&sum.checkpoint).map_or(0, |(at, _)| at.0.saturating_mul(1000));
        let record = self.records.remove(&sum.checkpoint).map(|mut r| {
            r.notified_us = now_us.saturating_sub(origin);
            r.duration_ms = sum.duration_ms;
            r.bytes = sum.bytes;
            r.channel_state_bytes = sum.channel_state_bytes;
            r.unaligned_tasks = sum.unaligned_tasks;
            r.switched_tasks = sum.switched_tasks;
            r.slowest_task = sum.slowest_task.clone();
            r
        });
        self.histograms.checkpoint_duration_ms.observe(sum.duration_ms as f64);
        self.histograms.checkpoint_bytes.observe(sum.bytes as f64);
        self.counters.channel_state_bytes += sum.channel_state_bytes;
        if sum.unaligned_tasks > 0 {
            self.counters.unaligned_checkpoints += 1;
        }
        if self.done.len() == CHECKPOINTS_KEPT {
            self.done.remove(0);
        }
        self.done.push(sum);
        record
    }

    /// A checkpoint was aborted; `failed` if it counts as a failure (then with its reason).
    pub(super) fn on_aborted(&mut self, checkpoint: CheckpointId, failed: Option<FailedCheckpoint>) {
        self.triggered.remove(&checkpoint);
        self.pending.remove(&checkpoint);
        self.records.remove(&checkpoint);
        match failed {
            Some(f) => {
                if self.failed.len() == FAILED_CHECKPOINTS_KEPT {
                    self.failed.remove(0);
                }
                self.failed.push(f);
            }
            None => self.counters.checkpoints_aborted += 1,
        }
    }

    /// A new generation is deployed with `tasks`: the parts of the old one no longer apply.
    pub(super) fn on_deployed(&mut self, tasks: &[String]) {
        self.task_names = tasks.to_vec();
        self.parts = vec![None; tasks.len()];
        // Checkpoints of the old generation were aborted with it.
        self.triggered.clear();
        self.records.clear();
    }
}

/// One task's part in a committed checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TaskCheckpoint {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// Milliseconds from the trigger at the coordinator to the first barrier at the task.
    pub start_delay_ms: u64,
    /// Milliseconds from the first barrier at the task to its snapshot (0 at a source).
    pub alignment_ms: u64,
    /// Microseconds of the snapshot's synchronous part (sharing the state, forwarding the barrier).
    pub sync_us: u64,
    /// Milliseconds of the asynchronous part: from the capture to the state being durable.
    pub persist_ms: u64,
    /// Microseconds encoding the state (part of `persist_ms`).
    pub encode_us: u64,
    /// Microseconds writing it durably (part of `persist_ms`).
    pub write_us: u64,
    /// Milliseconds from the state being durable to the coordinator receiving the ack.
    pub ack_latency_ms: u64,
    /// Bytes of the task's state file.
    pub bytes: u64,
    /// Bytes of in-flight records persisted as channel state (the data that piled up behind the
    /// barrier, for an unaligned snapshot).
    pub channel_state_bytes: u64,
    /// Records queued on the task's other inputs when its aligned snapshot was taken (the data that
    /// piled up behind the barrier, for an aligned snapshot).
    pub blocked_records: u64,
    /// The snapshot was unaligned at this task.
    pub unaligned: bool,
}

/// Counters of a run, from its start (they survive restarts).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunCounters {
    /// Checkpoints aborted without counting as failures (by a failover, subsumed, or declined
    /// because the job was ending).
    pub checkpoints_aborted: u64,
    /// Completed checkpoints where at least one task snapshotted unaligned.
    pub unaligned_checkpoints: u64,
    /// Bytes of in-flight records persisted as channel state, over all completed checkpoints.
    pub channel_state_bytes: u64,
    /// Restarts after failures.
    pub restarts: u64,
    /// Deployments that restored state from a checkpoint or savepoint (at start and at restarts).
    pub restores: u64,
    /// Restores that skipped newer checkpoints they could not read and used an older one.
    pub fallbacks: u64,
}

/// Distributions over a run: per checkpoint, and per task and checkpoint.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CheckpointHistograms {
    /// Checkpoint duration, trigger to manifest durable (ms).
    pub checkpoint_duration_ms: Histogram,
    /// Checkpoint size (bytes of state files).
    pub checkpoint_bytes: Histogram,
    /// Per task: trigger to first barrier (ms).
    pub task_start_delay_ms: Histogram,
    /// Per task: first barrier to snapshot (ms).
    pub task_alignment_ms: Histogram,
    /// Per task: synchronous part of the snapshot (µs).
    pub task_sync_us: Histogram,
    /// Per task: asynchronous part, capture to durable (ms).
    pub task_persist_ms: Histogram,
    /// Per task: durable to the coordinator receiving the ack (ms).
    pub task_ack_latency_ms: Histogram,
    /// Per task: records queued on its other inputs when an aligned snapshot was taken.
    pub task_blocked_records: Histogram,
}

/// Bucket bounds of durations in milliseconds.
const MS_BOUNDS: &[f64] =
    &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1e3, 2.5e3, 5e3, 10e3, 30e3, 60e3, 300e3];
/// Bucket bounds of durations in microseconds.
const US_BOUNDS: &[f64] = &[10.0, 50.0, 100.0, 250.0, 500.0, 1e3, 2.5e3, 5e3, 10e3, 50e3, 100e3, 1e6];
/// Bucket bounds of record counts: 0, then 1 to 16 M by factors of 4.
const RECORD_BOUNDS: &[f64] =
    &[0.0, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0];
/// Bucket bounds of sizes in bytes: 1 KiB to 16 GiB by factors of 4.
const BYTE_BOUNDS: &[f64] = &[
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
    4294967296.0,
    17179869184.0,
];

impl Default for CheckpointHistograms {
    fn default() -> Self {
        CheckpointHistograms {
            checkpoint_duration_ms: Histogram::new(MS_BOUNDS),
            checkpoint_bytes: Histogram::new(BYTE_BOUNDS),
            task_start_delay_ms: Histogram::new(MS_BOUNDS),
            task_alignment_ms: Histogram::new(MS_BOUNDS),
            task_sync_us: Histogram::new(US_BOUNDS),
            task_persist_ms: Histogram::new(MS_BOUNDS),
            task_ack_latency_ms: Histogram::new(MS_BOUNDS),
            task_blocked_records: Histogram::new(RECORD_BOUNDS),
        }
    }
}

/// A histogram of fixed buckets: `counts[i]` observations at most `bounds[i]` and above the bound
/// before it; `counts[bounds.len()]` above the last bound.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Histogram {
    /// Upper bounds of the buckets, ascending.
    pub bounds: &'static [f64],
    /// Observations per bucket (not cumulative), one more than `bounds`.
    pub counts: Vec<u64>,
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram with these bucket bounds.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    /// Count one observation.
    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// `(upper bound, observations at most that)` per bucket, the last bound `+Inf`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        self.counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                total += c;
                (self.bounds.get(i).copied().unwrap_or(f64::INFINITY), total)
            })
            .collect()
    }
}

/// A stored record as the summary of a completed checkpoint.
pub(crate) fn summary_of(r: &CheckpointRecord) -> CheckpointSummary {
    let max = |f: &dyn Fn(&super::trace::TaskTrace) -> u64| r.tasks.iter().map(f).max().unwrap_or(0);
    let kind = match r.kind.as_str() {
        "final" => SnapshotKind::Final,
        "savepoint" => SnapshotKind::Savepoint,
        "stop-with-savepoint" => SnapshotKind::StopSavepoint,
        _ => SnapshotKind::Checkpoint,
    };
    CheckpointSummary {
        checkpoint: CheckpointId(r.checkpoint),
        generation: Generation(r.generation),
        triggered_at_unix_ms: r.triggered_at_unix_ms,
        kind: Some(kind),
        is_final: kind == SnapshotKind::Final,
        is_savepoint: kind.is_savepoint(),
        duration_ms: r.duration_ms,
        bytes: r.bytes,
        alignment_ms: max(&|t| t.last_barrier_us().saturating_sub(t.first_barrier_us())) / 1000,
        start_delay_ms: max(&|t| t.first_barrier_us()) / 1000,
        persist_ms: max(&|t| t.durable_us.saturating_sub(t.snapshot_us + t.sync_us)) / 1000,
        encode_us: max(&|t| t.encode_us),
        write_us: max(&|t| t.write_us),
        sync_us: max(&|t| t.sync_us),
        page_copies: 0,
        saved_entries: 0,
        slowest_task: r.slowest_task.clone(),
        unaligned_tasks: r.unaligned_tasks,
        switched_tasks: r.switched_tasks,
        channel_state_bytes: r.channel_state_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_on_a_bound_counts_in_that_bucket_and_cumulative_counts_end_at_the_total() {
        let mut h = Histogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 1.5, 10.0, 11.0] {
            h.observe(v);
        }
        assert_eq!(h.counts, vec![2, 2, 1]);
        assert_eq!(h.cumulative(), vec![(1.0, 2), (10.0, 4), (f64::INFINITY, 5)]);
        assert_eq!(h.count, 5);
        assert_eq!(h.sum, 24.0);
    }
}
