//! A running job's [`JobMetrics`] as Prometheus metrics (the OpenMetrics text format, through
//! `prometheus-client`): names start with `cutline_`, durations are in seconds, sizes in bytes,
//! counters end in `_total`.
//!
//! Every scrape renders one snapshot of the job's figures: nothing is registered ahead, so a task of a
//! new generation appears and a task that is gone disappears with no stale series.

use crate::cluster::WorkerState;
use crate::runtime::{Histogram, JobMetrics, TaskReport};
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::fmt::Error;

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `m` in the OpenMetrics text format.
pub fn render(m: &JobMetrics) -> String {
    let mut registry = Registry::with_prefix("cutline");
    registry.register_collector(Box::new(Snapshot(m.clone())));
    let mut out = String::with_capacity(4096 + m.tasks.len() * 2048);
    prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String");
    out
}

#[derive(Debug)]
struct Snapshot(JobMetrics);

/// What a value measures: the unit its metric name ends with, and the factor from our figure to it.
#[derive(Clone, Copy)]
enum U {
    /// A count.
    One,
    /// Milliseconds, exported in seconds.
    Ms,
    /// Microseconds, exported in seconds.
    Us,
    /// Bytes.
    Bytes,
}

impl U {
    fn unit(self) -> Option<Unit> {
        match self {
            U::One => None,
            U::Ms | U::Us => Some(Unit::Seconds),
            U::Bytes => Some(Unit::Bytes),
        }
    }
    fn scale(self, v: f64) -> f64 {
        match self {
            U::Ms => v / 1e3,
            U::Us => v / 1e6,
            U::One | U::Bytes => v,
        }
    }
}

fn one(enc: &mut DescriptorEncoder, name: &str, help: &str, u: U, ty: MetricType, v: f64) -> Result<(), Error> {
    let unit = u.unit();
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), ty)?;
    value(&mut m, ty, u.scale(v))
}

fn value(m: &mut MetricEncoder, ty: MetricType, v: f64) -> Result<(), Error> {
    match ty {
        MetricType::Counter => m.encode_counter::<NoLabelSet, _, f64>(&v, None),
        _ => m.encode_gauge(&v),
    }
}

/// One series per `(label value, value)` of `rows`.
fn family<'a>(
    enc: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    (label, u, ty): (&'static str, U, MetricType),
    rows: impl Iterator<Item = (&'a str, f64)>,
) -> Result<(), Error> {
    let mut rows = rows.peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let unit = u.unit();
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), ty)?;
    for (l, v) in rows {
        let labels = [(label, l)];
        value(&mut m.encode_family(&labels)?, ty, u.scale(v))?;
    }
    Ok(())
}

fn histogram(enc: &mut DescriptorEncoder, name: &str, help: &str, u: U, h: &Histogram) -> Result<(), Error> {
    let unit = u.unit();
    let m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Histogram)?;
    // Per-bucket counts (the encoder sums them up); the last bucket is `+Inf`, which the encoder
    // writes for `f64::MAX`.
    let buckets: Vec<(f64, u64)> =
        h.counts.iter().enumerate().map(|(i, n)| (h.bounds.get(i).map_or(f64::MAX, |b| u.scale(*b)), *n)).collect();
    let mut m = m;
    m.encode_histogram::<NoLabelSet>(u.scale(h.sum), h.count, &buckets, None)
}

impl prometheus_client::collector::Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), Error> {
        use MetricType::{Counter, Gauge};
        let m = &self.0;
        let e = &mut enc;
        let running = !m.tasks.is_empty();
        one(e, "job_running", "1 while the job's tasks run, 0 while it restarts", U::One, Gauge, running as u8 as f64)?;
        one(
            e,
            "job_generation",
            "The generation running now (0 while restarting)",
            U::One,
            Gauge,
            m.generation.0 as f64,
        )?;
        one(e, "job_uptime", "Time since the run started", U::Ms, Gauge, m.uptime_ms as f64)?;
        let c = &m.counters;
        let counts = [
            ("checkpoints_completed", "Checkpoints (savepoints included) completed", m.checkpoints_completed),
            (
                "checkpoints_failed",
                "Checkpoints failed (timed out, declined, manifest not written)",
                m.checkpoints_failed,
            ),
            (
                "checkpoints_aborted",
                "Checkpoints aborted without counting as failed (failover, subsumed)",
                c.checkpoints_aborted,
            ),
            (
                "checkpoints_unaligned",
                "Completed checkpoints where a task snapshotted unaligned",
                c.unaligned_checkpoints,
            ),
            ("restarts", "Restarts after failures", c.restarts),
            ("restores", "Deployments that restored state from a checkpoint or savepoint", c.restores),
            ("restore_fallbacks", "Restores that skipped unreadable newer checkpoints for an older one", c.fallbacks),
        ];
        for (name, help, v) in counts {
            one(e, name, help, U::One, Counter, v as f64)?;
        }
        one(
            e,
            "checkpoint_channel_state",
            "In-flight records persisted as channel state, over all completed checkpoints",
            U::Bytes,
            Counter,
            c.channel_state_bytes as f64,
        )?;
        one(
            e,
            "checkpoints_in_flight",
            "Checkpoints triggered and not yet complete",
            U::One,
            Gauge,
            m.pending.len() as f64,
        )?;
        if let Some(last) = m.checkpoints.last() {
            one(e, "last_checkpoint_id", "The latest completed checkpoint", U::One, Gauge, last.checkpoint.0 as f64)?;
            one(
                e,
                "last_checkpoint_duration",
                "Latest completed checkpoint: trigger to manifest durable",
                U::Ms,
                Gauge,
                last.duration_ms as f64,
            )?;
            one(
                e,
                "last_checkpoint_size",
                "Latest completed checkpoint: bytes of state files",
                U::Bytes,
                Gauge,
                last.bytes as f64,
            )?;
            one(
                e,
                "last_checkpoint_channel_state",
                "Latest completed checkpoint: in-flight bytes persisted",
                U::Bytes,
                Gauge,
                last.channel_state_bytes as f64,
            )?;
            one(
                e,
                "last_checkpoint_unaligned_tasks",
                "Latest completed checkpoint: tasks that snapshotted unaligned",
                U::One,
                Gauge,
                last.unaligned_tasks as f64,
            )?;
        }
        let h = &m.histograms;
        histogram(
            e,
            "checkpoint_duration",
            "Checkpoint duration, trigger to manifest durable",
            U::Ms,
            &h.checkpoint_duration_ms,
        )?;
        histogram(e, "checkpoint_size", "Checkpoint size, bytes of state files", U::Bytes, &h.checkpoint_bytes)?;
        histogram(
            e,
            "task_checkpoint_start_delay",
            "Per task and checkpoint: trigger to the first barrier",
            U::Ms,
            &h.task_start_delay_ms,
        )?;
        histogram(
            e,
            "task_checkpoint_alignment",
            "Per task and checkpoint: first barrier to snapshot",
            U::Ms,
            &h.task_alignment_ms,
        )?;
        histogram(
            e,
            "task_checkpoint_sync",
            "Per task and checkpoint: synchronous part of the snapshot",
            U::Us,
            &h.task_sync_us,
        )?;
        histogram(
            e,
            "task_checkpoint_async",
            "Per task and checkpoint: snapshot captured to durable",
            U::Ms,
            &h.task_persist_ms,
        )?;
        histogram(
            e,
            "task_checkpoint_ack_latency",
            "Per task and checkpoint: state durable to ack at the coordinator",
            U::Ms,
            &h.task_ack_latency_ms,
        )?;
        histogram(
            e,
            "task_checkpoint_blocked_records",
            "Per task and aligned checkpoint: records queued on its other inputs when it snapshotted",
            U::One,
            &h.task_blocked_records,
        )?;
        tasks_and_channels(e, &m.tasks)
    }
}

/// A worker's state ([`WorkerState`]) in the OpenMetrics text format: whether it is joined, the
/// generation it runs, and its tasks' figures (as of its last heartbeat).
pub fn render_worker(s: &WorkerState) -> String {
    let mut registry = Registry::with_prefix("cutline");
    registry.register_collector(Box::new(WorkerSnapshot(s.clone())));
    let mut out = String::with_capacity(1024 + s.tasks.len() * 2048);
    prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String");
    out
}

#[derive(Debug)]
struct WorkerSnapshot(WorkerState);

impl prometheus_client::collector::Collector for WorkerSnapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), Error> {
        use MetricType::{Counter, Gauge};
        let s = &self.0;
        let e = &mut enc;
        one(
            e,
            "worker_connected",
            "1 while the worker is joined to a coordinator",
            U::One,
            Gauge,
            s.connected as u8 as f64,
        )?;
        one(
            e,
            "worker_generation",
            "The generation whose tasks run here (0: none)",
            U::One,
            Gauge,
            s.generation.unwrap_or(0) as f64,
        )?;
        one(e, "worker_joins", "Times this worker joined a coordinator", U::One, Counter, s.joins as f64)?;
        tasks_and_channels(e, &s.tasks)
    }
}

/// The per-task and per-channel families.
fn tasks_and_channels(e: &mut DescriptorEncoder, all: &[TaskReport]) -> Result<(), Error> {
    use MetricType::{Counter, Gauge};
    {
        let tasks = || all.iter();
        let t = ("task", U::One, Counter);
        family(
            e,
            ("task_records_in", "Records a task took from its inputs (a source: read)"),
            t,
            tasks().map(|t| (t.name.as_str(), t.records_in as f64)),
        )?;
        family(
            e,
            ("task_records_out", "Records downstream tasks took from a task's outputs"),
            t,
            tasks().map(|t| (t.name.as_str(), t.records_out as f64)),
        )?;
        let t = ("task", U::Ms, Counter);
        family(
            e,
            ("task_backpressured", "Time a task waited for output credit (this generation)"),
            t,
            tasks().map(|t| (t.name.as_str(), t.backpressured_ms as f64)),
        )?;
        family(
            e,
            ("task_idle", "Time a task waited with nothing to read (this generation)"),
            t,
            tasks().map(|t| (t.name.as_str(), t.idle_ms as f64)),
        )?;
        let parts = || all.iter().filter_map(|t| t.last_checkpoint.as_ref().map(|p| (t.name.as_str(), p)));
        let g = |u| ("task", u, Gauge);
        family(
            e,
            ("task_last_checkpoint_id", "The latest committed checkpoint a task took part in"),
            g(U::One),
            parts().map(|(n, p)| (n, p.checkpoint.0 as f64)),
        )?;
        family(
            e,
            ("task_last_checkpoint_start_delay", "A task's latest checkpoint: trigger to first barrier"),
            g(U::Ms),
            parts().map(|(n, p)| (n, p.start_delay_ms as f64)),
        )?;
        family(
            e,
            ("task_last_checkpoint_alignment", "A task's latest checkpoint: first barrier to snapshot"),
            g(U::Ms),
            parts().map(|(n, p)| (n, p.alignment_ms as f64)),
        )?;
        family(
            e,
            ("task_last_checkpoint_sync", "A task's latest checkpoint: synchronous part"),
            g(U::Us),
            parts().map(|(n, p)| (n, p.sync_us as f64)),
        )?;
        family(
            e,
            ("task_last_checkpoint_async", "A task's latest checkpoint: captured to durable"),
            g(U::Ms),
            parts().map(|(n, p)| (n, p.persist_ms as f64)),
        )?;
        family(
            e,
            ("task_last_checkpoint_ack_latency", "A task's latest checkpoint: durable to ack at the coordinator"),
            g(U::Ms),
            parts().map(|(n, p)| (n, p.ack_latency_ms as f64)),
        )?;
        family(
            e,
            ("task_last_checkpoint_state", "A task's latest checkpoint: bytes of its state file"),
            g(U::Bytes),
            parts().map(|(n, p)| (n, p.bytes as f64)),
        )?;
        family(
            e,
            ("task_last_checkpoint_channel_state", "A task's latest checkpoint: in-flight bytes persisted"),
            g(U::Bytes),
            parts().map(|(n, p)| (n, p.channel_state_bytes as f64)),
        )?;
        family(
            e,
            (
                "task_last_checkpoint_blocked_records",
                "A task's latest checkpoint: records queued on its other inputs when it snapshotted aligned",
            ),
            g(U::One),
            parts().map(|(n, p)| (n, p.blocked_records as f64)),
        )?;

        let chans = || all.iter().flat_map(|t| &t.inputs);
        let g = ("channel", U::One, Gauge);
        family(
            e,
            ("channel_queued_batches", "Batches queued on a channel now"),
            g,
            chans().map(|c| (c.name.as_str(), c.queued_batches as f64)),
        )?;
        family(
            e,
            ("channel_capacity_batches", "Batches a channel queues before its producer waits"),
            g,
            chans().map(|c| (c.name.as_str(), c.capacity_batches as f64)),
        )?;
        family(
            e,
            ("channel_high_water_batches", "Most batches a channel ever queued"),
            g,
            chans().map(|c| (c.name.as_str(), c.high_water_batches as f64)),
        )?;
        family(
            e,
            ("channel_records", "Records the downstream task took from a channel"),
            ("channel", U::One, Counter),
            chans().map(|c| (c.name.as_str(), c.records as f64)),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{CheckpointSummary, TaskCheckpoint};
    use cutline_core::CheckpointId;

    /// The value of the series `name` (with its labels, as written) in `text`.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn histograms_are_cumulative_up_to_inf_and_units_are_seconds_and_bytes() {
        let mut m = JobMetrics::default();
        for ms in [3.0, 40.0, 40.0, 2_000.0, 400_000.0] {
            m.histograms.checkpoint_duration_ms.observe(ms);
        }
        m.checkpoints = vec![CheckpointSummary {
            checkpoint: CheckpointId(5),
            duration_ms: 1_500,
            bytes: 2048,
            ..Default::default()
        }];
        m.tasks = vec![TaskReport {
            name: "counts#0".into(),
            records_in: 42,
            last_checkpoint: Some(TaskCheckpoint {
                checkpoint: CheckpointId(5),
                alignment_ms: 250,
                ..Default::default()
            }),
            ..Default::default()
        }];
        let text = render(&m);
        let b = |le: &str| value(&text, &format!("cutline_checkpoint_duration_seconds_bucket{{le=\"{le}\"}}"));
        assert_eq!(b("0.005"), Some(1.0), "{text}");
        assert_eq!(b("0.05"), Some(3.0), "{text}");
        assert_eq!(b("2.5"), Some(4.0), "{text}");
        assert_eq!(b("300.0"), Some(4.0), "{text}");
        assert_eq!(b("+Inf"), Some(5.0), "{text}");
        assert_eq!(value(&text, "cutline_checkpoint_duration_seconds_count"), Some(5.0));
        assert_eq!(value(&text, "cutline_last_checkpoint_duration_seconds"), Some(1.5));
        assert_eq!(value(&text, "cutline_last_checkpoint_size_bytes"), Some(2048.0));
        assert_eq!(value(&text, "cutline_task_records_in_total{task=\"counts#0\"}"), Some(42.0));
        assert_eq!(value(&text, "cutline_task_last_checkpoint_alignment_seconds{task=\"counts#0\"}"), Some(0.25));
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
