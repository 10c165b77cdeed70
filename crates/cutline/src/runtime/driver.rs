//! What the threaded runtime and the simulation share beyond the protocol cores: carrying out the
//! coordinator's decisions ([`carry_out`]), writing a snapshot and turning the result into an ack or a
//! decline ([`write_snapshot`]), per-task storage metadata, and per-checkpoint statistics.
//!
//! It does not schedule anything: the runtime calls it from its coordinator thread and writer threads,
//! the simulation from its single seeded loop. Only the [`ControlPlane`] (how a control message reaches
//! a task) differs between them.

use super::chains::{Chains, Plan};
use super::error::RunError;
use super::report::{AckReport, CheckpointSummary};
use super::run::own;
use super::start::unix_ms;
pub(crate) use super::stats::CheckpointLog;
use super::task::{Control, SnapshotTimings};
use crate::dataflow::{EdgeKind, JobGraph};
use crate::fault::{FaultPoint, Faults};
use crate::state::SnapshotBuilder;
use cutline_core::barrier::{Barrier, SnapshotKind};
use cutline_core::coordinator::{AbortReason, Coordinator, Decision, Event, Outcome};
use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex, TaskId, TimeMs};
use cutline_storage::{CheckpointStore, JobMeta, Manifest, StorageError, TaskStateHandle};
use std::collections::VecDeque;
use std::time::Instant;

/// Where a task's state is filed in storage.
#[derive(Clone, Debug)]
pub(crate) struct TaskMeta {
    pub operator: OperatorId,
    pub subtask: u32,
    pub parallelism: u32,
    pub key_groups: Option<KeyGroupRange>,
}

/// Storage metadata of every task of the job, indexed by task id (dense, stage by stage).
pub(crate) fn task_metas(graph: &JobGraph) -> Vec<TaskMeta> {
    let mut metas = Vec::with_capacity(graph.task_count());
    for st in graph.stages.iter() {
        let keyed = st.inputs.first().is_some_and(|e| graph.edges[*e].kind == EdgeKind::Hash);
        for subtask in 0..st.parallelism {
            metas.push(TaskMeta {
                operator: OperatorId::new(st.uid.clone()),
                subtask,
                parallelism: st.parallelism,
                key_groups: keyed.then(|| KeyGroupRange::for_subtask(graph.max_parallelism, st.parallelism, subtask)),
            });
        }
    }
    metas
}

/// A task's captured state on its way to storage.
pub(crate) struct SnapshotJob {
    pub generation: Generation,
    pub task: TaskId,
    pub meta: TaskMeta,
    pub barrier: Barrier,
    pub snap: SnapshotBuilder,
    pub timings: SnapshotTimings,
}

/// Encode and durably write one task's snapshot; the ack (or decline) for the coordinator.
/// `since_capture` is the time in microseconds since the task captured the state, as the caller
/// measures it. Incremental (only what changed since the task's base checkpoint, on top of its
/// files) when `incremental`, the snapshot is not a savepoint's (those stay self-contained) nor the
/// final one, and `chains` allows it.
pub(crate) fn write_snapshot(
    store: &dyn CheckpointStore,
    faults: &Faults,
    (chains, incremental): (&Chains, bool),
    job: SnapshotJob,
    since_capture: impl FnOnce() -> u64,
) -> Event<AckReport> {
    let (mut encode_us, mut write_us) = (0, 0);
    let m = &job.meta;
    let (task, checkpoint, base) = (job.task, job.barrier.checkpoint, job.snap.base);
    // Savepoints stay self-contained; a final checkpoint is whole so that the job's last commit
    // never waits on files retention may be removing.
    let plan = match incremental && !job.barrier.kind.is_savepoint() && !job.barrier.kind.ends_input() {
        true => chains.plan(task, base),
        false => Plan::Whole,
    };
    let result = (|| -> Result<TaskStateHandle, String> {
        faults.check(FaultPoint::SnapshotWrite).map_err(|e| e.to_string())?;
        let t = Instant::now();
        let (frame, delta) = job.snap.encode(plan != Plan::Whole)?;
        encode_us = t.elapsed().as_micros() as u64;
        let t = Instant::now();
        let r = store
            .write_task_frame(
                job.barrier.checkpoint,
                &m.operator,
                SubtaskIndex(m.subtask),
                m.parallelism,
                m.key_groups,
                &frame,
            )
            .map_err(|e| e.to_string());
        write_us = t.elapsed().as_micros() as u64;
        let mut handle = r?;
        if let (true, Plan::OnTopOf(files)) = (delta, plan) {
            handle.base = files;
        }
        chains.record(task, checkpoint, base, &handle);
        Ok(handle)
    })();
    match result {
        Ok(handle) => Event::Acked {
            generation: job.generation,
            checkpoint: job.barrier.checkpoint,
            task: job.task,
            report: {
                let persist_us = since_capture();
                AckReport {
                    handle,
                    timings: job.timings,
                    persist_ms: persist_us / 1000,
                    persist_us,
                    encode_us,
                    write_us,
                    received_at_us: 0,
                }
            },
        },
        Err(reason) => {
            Event::Declined { generation: job.generation, checkpoint: job.barrier.checkpoint, task: job.task, reason }
        }
    }
}

/// How decisions reach the tasks of the current generation.
pub(crate) trait ControlPlane {
    /// Deliver `c` to every live task, or to every live source task.
    fn send_all(&mut self, c: Control, sources_only: bool);
    fn now(&self) -> TimeMs;
    /// The same clock in microseconds.
    fn now_us(&self) -> u64 {
        self.now().0.saturating_mul(1000)
    }
    /// The manifest of `checkpoint` is durable (the simulation reads it back and checks the cut).
    fn committed(&mut self, _checkpoint: CheckpointId) -> Result<(), RunError> {
        Ok(())
    }
}

/// What a generation's decisions came to.
pub(crate) enum Carried {
    Continue,
    FailOver(String),
    Finished(CheckpointId),
    /// Stopped with the savepoint of a stop-with-savepoint, every task committed and finished.
    Stopped(CheckpointId),
}

/// What happened to savepoints while decisions were carried out (the runtime answers requests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SavepointEvent {
    Triggered {
        checkpoint: CheckpointId,
        stop: bool,
    },
    /// Its manifest is durable: it is a complete checkpoint, ready to export.
    Completed {
        checkpoint: CheckpointId,
    },
    /// Some checkpoint was aborted (the runtime knows which one is its savepoint).
    Aborted {
        checkpoint: CheckpointId,
        reason: String,
    },
    Rejected {
        reason: String,
    },
}

/// Everything `carry_out` needs besides the coordinator and the control plane.
pub(crate) struct DriverCtx<'a> {
    pub store: &'a dyn CheckpointStore,
    pub fingerprint: &'a str,
    pub generation: Generation,
    pub retain: usize,
    pub lease_end: &'a mut CheckpointId,
    pub stats: &'a mut CheckpointLog,
    pub unix_ms: u64,
    pub savepoints: Vec<SavepointEvent>,
}

/// Why a checkpoint failed, with the tasks that held it up named.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FailedCheckpoint {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// Why it failed, with the tasks named (`timed out waiting for map#0, map#1`, `declined by
    /// sink#0: ...`, `manifest write failed: ...`).
    pub reason: String,
    /// The tasks that had not acknowledged (timeout) or declined.
    pub held_up_by: Vec<String>,
}

/// Feed `first` decisions (and every decision they lead to) through the runtime side effects, in order.
pub(crate) fn carry_out(
    coord: &mut Coordinator<AckReport>,
    first: Vec<Decision<AckReport>>,
    ctx: &mut DriverCtx<'_>,
    plane: &mut dyn ControlPlane,
) -> Result<Carried, RunError> {
    let mut work: VecDeque<Decision<AckReport>> = first.into();
    let mut out = Vec::new();
    while let Some(d) = work.pop_front() {
        match d {
            Decision::ExtendLease { lease_end } => {
                ctx.store.write_meta(&JobMeta {
                    job_fingerprint: ctx.fingerprint.to_string(),
                    generation: ctx.generation,
                    epoch_lease_end: lease_end,
                })?;
                *ctx.lease_end = lease_end;
                own(coord.handle(plane.now(), Event::LeaseExtended { lease_end }, &mut out));
            }
            Decision::EpochsExhausted { lease_end } => {
                return Err(RunError::Exhausted {
                    what: "epoch lease",
                    value: lease_end.0,
                    store: ctx.store.describe(),
                })
            }
            Decision::Trigger { barrier } => {
                if barrier.kind.is_savepoint() {
                    let stop = barrier.kind == SnapshotKind::StopSavepoint;
                    ctx.savepoints.push(SavepointEvent::Triggered { checkpoint: barrier.checkpoint, stop });
                }
                ctx.stats.on_triggered(barrier.checkpoint, barrier.triggered_at, unix_ms());
                plane.send_all(Control::Trigger(barrier), true)
            }
            Decision::SavepointRejected { reason } => ctx.savepoints.push(SavepointEvent::Rejected { reason }),
            Decision::CommitManifest { checkpoint, kind, generation, reports } => {
                assert_eq!(generation, ctx.generation, "manifest of another generation");
                let max = |f: &dyn Fn(&AckReport) -> u64| reports.iter().map(|(_, r)| f(r)).max().unwrap_or(0);
                let summary = CheckpointSummary {
                    checkpoint,
                    generation,
                    triggered_at_unix_ms: ctx.stats.triggered.get(&checkpoint).map_or(0, |t| t.1),
                    is_final: kind == SnapshotKind::Final,
                    is_savepoint: kind.is_savepoint(),
                    alignment_ms: max(&|r| r.timings.alignment_ms),
                    start_delay_ms: max(&|r| r.timings.start_delay_ms),
                    persist_ms: max(&|r| r.persist_ms),
                    encode_us: max(&|r| r.encode_us),
                    write_us: max(&|r| r.write_us),
                    sync_us: max(&|r| r.timings.sync_us),
                    page_copies: reports.iter().map(|(_, r)| r.timings.page_copies).sum(),
                    saved_entries: reports.iter().map(|(_, r)| r.timings.saved_entries).sum(),
                    unaligned_tasks: reports.iter().filter(|(_, r)| r.timings.unaligned).count() as u32,
                    switched_tasks: reports.iter().filter(|(_, r)| r.timings.switched).count() as u32,
                    channel_state_bytes: reports.iter().map(|(_, r)| r.timings.channel_state_bytes).sum(),
                    kind: Some(kind),
                    ..Default::default()
                };
                ctx.stats.on_acked(checkpoint, generation, kind, &reports);
                let mut tasks: Vec<TaskStateHandle> = reports.into_iter().map(|(_, r)| r.handle).collect();
                tasks.sort_by(|a, b| (&a.operator, a.subtask).cmp(&(&b.operator, b.subtask)));
                let manifest = Manifest::new(
                    ctx.fingerprint,
                    checkpoint,
                    generation,
                    ctx.unix_ms,
                    kind == SnapshotKind::Final,
                    tasks,
                );
                let bytes = manifest.total_size_bytes();
                // Fencing: a coordinator of an older generation never commits once a newer one took
                // over (and never tells its sinks to commit a manifest a newer generation fenced).
                let fenced = |r: Result<(), StorageError>| match r {
                    Err(e @ (StorageError::Superseded { .. } | StorageError::GenerationTaken { .. })) => {
                        Err(RunError::Superseded(e.to_string()))
                    }
                    other => Ok(other),
                };
                let committed = match fenced(ctx.store.check_not_fenced(generation))? {
                    Ok(()) => ctx.store.commit_manifest(&manifest),
                    Err(e) => Err(e),
                };
                if committed.is_ok() {
                    if let Err(e) = fenced(ctx.store.check_not_fenced(generation))? {
                        // Not known to be still in charge: tell no sink to commit. The next generation
                        // restores from storage and commits this checkpoint's output if it is not fenced.
                        return Ok(Carried::FailOver(format!(
                            "cannot confirm after committing {checkpoint} that no newer coordinator took over: {e}"
                        )));
                    }
                }
                match committed {
                    Ok(()) => {
                        ctx.stats.pending.insert(checkpoint, CheckpointSummary { bytes, ..summary });
                        ctx.stats.on_manifest_durable(checkpoint, plane.now_us());
                        plane.committed(checkpoint)?;
                        if kind.is_savepoint() {
                            ctx.savepoints.push(SavepointEvent::Completed { checkpoint });
                        }
                        own(coord.handle(plane.now(), Event::ManifestCommitted { checkpoint }, &mut out));
                    }
                    Err(e) => own(coord.handle(
                        plane.now(),
                        Event::ManifestFailed { checkpoint, reason: e.to_string() },
                        &mut out,
                    )),
                }
            }
            Decision::NotifyComplete { checkpoint } => {
                let stats = &mut *ctx.stats;
                let mut record = None;
                if let Some(s) =
                    coord.history().filter(|s| s.checkpoint == checkpoint && s.outcome == Outcome::Completed).last()
                {
                    let mut sum = stats.pending.remove(&checkpoint).unwrap_or_default();
                    sum.duration_ms = s.duration_ms();
                    sum.slowest_task =
                        s.slowest_task.and_then(|t| stats.task_names.get(t.0 as usize).cloned()).unwrap_or_default();
                    tracing::info!(
                        event = "checkpoint_complete",
                        gen = %ctx.generation,
                        chk = %sum.checkpoint,
                        savepoint = sum.is_savepoint,
                        is_final = sum.is_final,
                        duration_ms = sum.duration_ms,
                        bytes = sum.bytes,
                        in_flight_bytes = sum.channel_state_bytes,
                        unaligned_tasks = sum.unaligned_tasks,
                        switched_tasks = sum.switched_tasks,
                        "{} {} complete in {} ms: {} bytes ({} in flight), alignment {} ms, start delay {} ms, persist {} ms (encode {} us, write {} us), {} unaligned task(s) ({} switched), last ack from {}",
                        if sum.is_savepoint { "savepoint" } else { "checkpoint" },
                        sum.checkpoint, sum.duration_ms, sum.bytes, sum.channel_state_bytes, sum.alignment_ms, sum.start_delay_ms, sum.persist_ms, sum.encode_us, sum.write_us, sum.unaligned_tasks, sum.switched_tasks, sum.slowest_task
                    );
                    let now_us = plane.now_us();
                    record = stats.on_completed(sum, now_us);
                }
                plane.send_all(Control::Complete(checkpoint), false);
                if let Some(r) = record {
                    ctx.stats.keeper.keep(ctx.store, r);
                }
                // Retention that fails (an object store that is down) costs disk space, not
                // correctness: the next completion runs it again.
                if let Err(e) = ctx.store.gc(ctx.retain, &coord.pending()) {
                    tracing::warn!(
                        event = "retention_failed",
                        chk = %checkpoint,
                        "retention after {checkpoint} failed ({e}); it runs again after the next checkpoint"
                    );
                }
            }
            Decision::Abort { checkpoint, reason } => {
                let name =
                    |t: &TaskId| ctx.stats.task_names.get(t.0 as usize).cloned().unwrap_or_else(|| t.to_string());
                let held_up_by: Vec<String> = match &reason {
                    AbortReason::Timeout { missing } => missing.iter().map(name).collect(),
                    AbortReason::Declined { task, .. } => vec![name(task)],
                    _ => Vec::new(),
                };
                let failed = if reason.counts_as_failure() {
                    let readable = match &reason {
                        AbortReason::Timeout { .. } => format!("timed out waiting for {}", held_up_by.join(", ")),
                        AbortReason::Declined { reason, .. } => {
                            format!("declined by {}: {reason}", held_up_by.join(", "))
                        }
                        other => other.to_string(),
                    };
                    tracing::warn!(
                        event = "checkpoint_failed",
                        chk = %checkpoint,
                        reason = %readable,
                        "checkpoint {checkpoint} failed: {readable}"
                    );
                    Some(FailedCheckpoint { checkpoint, reason: readable, held_up_by })
                } else {
                    tracing::info!(event = "checkpoint_aborted", chk = %checkpoint, "checkpoint {checkpoint} aborted: {reason}");
                    None
                };
                ctx.savepoints.push(SavepointEvent::Aborted { checkpoint, reason: reason.to_string() });
                ctx.stats.on_aborted(checkpoint, failed);
                plane.send_all(Control::Abort(checkpoint), false);
                discard(ctx.store, checkpoint);
            }
            Decision::FailOver { reason } => return Ok(Carried::FailOver(reason)),
            Decision::JobFinished { checkpoint, kind } => {
                if kind == SnapshotKind::StopSavepoint {
                    // Stopped, not finished: running the job again resumes from the savepoint.
                    return Ok(Carried::Stopped(checkpoint));
                }
                ctx.store.mark_finished(checkpoint)?;
                return Ok(Carried::Finished(checkpoint));
            }
        }
        work.extend(out.drain(..));
    }
    Ok(Carried::Continue)
}

/// Remove the artifacts of an aborted checkpoint; storage refuses if its manifest did land, and
/// retention removes what a failed discard leaves.
pub(crate) fn discard(store: &dyn CheckpointStore, checkpoint: CheckpointId) {
    match store.discard(checkpoint) {
        Ok(()) | Err(StorageError::DiscardComplete(_)) => {}
        Err(e) => tracing::warn!(chk = %checkpoint, "could not discard {checkpoint}: {e} (retention will)"),
    }
}

/// The coordinator for a freshly deployed generation: created on the first deploy of a run, restarted
/// (its pending checkpoints aborted and their artifacts discarded) on every later one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn coordinator_for<'a>(
    slot: &'a mut Option<Coordinator<AckReport>>,
    config: &cutline_core::coordinator::CheckpointConfig,
    generation: Generation,
    tasks: (Vec<TaskId>, Vec<TaskId>),
    epochs: (CheckpointId, CheckpointId),
    restored: Option<CheckpointId>,
    now: TimeMs,
    store: &dyn CheckpointStore,
) -> &'a mut Coordinator<AckReport> {
    let (ids, sources) = tasks;
    let (first, lease_end) = epochs;
    match slot {
        None => {
            slot.insert(Coordinator::new(config.clone(), generation, ids, sources, first, lease_end, restored, now))
        }
        Some(c) => {
            let mut out = Vec::new();
            c.restart(generation, ids, sources, restored, now, &mut out);
            for d in out {
                if let Decision::Abort { checkpoint, .. } = d {
                    discard(store, checkpoint);
                }
            }
            c
        }
    }
}
