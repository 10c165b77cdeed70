//! The threaded runtime: one thread per task, a small pool of snapshot writers, and the coordinator
//! loop on the calling thread. It carries out the coordinator's decisions (inject barriers, commit
//! manifests, notify, abort, fail over) and the recovery decisions (which checkpoint, when to restart).
//!
//! It owns no protocol logic of its own: the coordinator, aligner and restart policy decide; this module
//! moves messages, bytes and threads.

use super::config::RunConfig;
use super::control::Command;
use super::driver::{
    carry_out, coordinator_for, next_generation, Carried, CheckpointLog, ControlPlane, DriverCtx, SavepointEvent,
};
use super::error::RunError;
use super::report::{AckReport, JobMetrics, JobReport, TaskReport, METRICS_CHECKPOINTS};
use super::savepoint::SavepointInfo;
use super::start::{
    claim_generation, committed_meanwhile, newest_manifest, prepare_start, restore_latest, unix_ms, Start,
    MAX_GAP_RETRIES,
};
use super::task::Control;
use crate::dataflow::JobGraph;
use crate::error::TaskError;
use crate::state::RestoreIndex;
use crossbeam_channel::{Receiver, Sender};
use cutline_core::coordinator::{CheckpointConfig, Coordinator, Event};
use cutline_core::restart::{RestartDecision, RestartTracker};
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use cutline_storage::{CheckpointStore, StorageError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub(crate) enum RtEvent {
    Coord(Event<AckReport>),
    /// Several events in order (a worker's message): one wake-up of the coordinator loop for all.
    Batch(Vec<Event<AckReport>>),
    Failed {
        generation: Generation,
        task: TaskId,
        error: String,
    },
}

pub(crate) fn log(cfg: &RunConfig, msg: impl Fn() -> String) {
    if cfg.verbose {
        eprintln!("cutline: {}", msg());
    }
}

/// Run `graph` with its tasks wherever `backend` puts them (threads here, or worker processes).
pub(crate) fn run_on(
    graph: &JobGraph,
    cfg: RunConfig,
    commands: &Receiver<Command>,
    backend: &mut dyn Backend,
) -> Result<JobReport, RunError> {
    cfg.validate()?;
    // One running job per store: a second process on the same state directory is refused.
    let _lock = cfg.store.lock()?;
    let started = Instant::now();
    let store = cfg.store.clone();
    let start = match prepare_start(&*store, &cfg.job_fingerprint, cfg.from_savepoint.as_deref())? {
        Start::AlreadyFinished(c) => {
            log(&cfg, || format!("job already finished with checkpoint {c}; nothing to do"));
            return Ok(JobReport { already_finished: true, final_checkpoint: Some(c), ..Default::default() });
        }
        Start::Run(s) => s,
    };
    let (first, mut generation, mut lease_end) = (start.first, start.generation, start.lease_end);

    let mut report = JobReport::default();
    let mut stats = CheckpointLog::default();
    let mut tracker = RestartTracker::new(cfg.restart.clone());
    let mut coordinator: Option<Coordinator<AckReport>> = None;
    let mut failed_at: Option<Instant> = None;
    let mut savepoint: Option<SavepointRequest> = None;
    let mut gap_retries = 0u32;
    loop {
        let mode = coordinator.as_ref().map(|c| c.config().mode).unwrap_or(cfg.checkpoint.mode);
        // The newest manifest in storage before this start looks: one that appears above it (and above
        // what the start restores) by the time the generation is claimed was committed in between.
        let manifests_before = newest_manifest(&*store);
        let (index, restored) = match restore_latest(&cfg, graph, mode) {
            Ok(r) => r,
            // Storage that fails to answer (not damaged data) may answer later: a failure like any other.
            Err(RunError::Storage(e)) if !e.is_corruption() => {
                failed_at.get_or_insert_with(Instant::now);
                let current = coordinator.as_ref().map(|c| c.config().clone()).unwrap_or(cfg.checkpoint.clone());
                if !after_failure(
                    &cfg,
                    &mut tracker,
                    started,
                    format!("reading checkpoints: {e}"),
                    &mut report,
                    commands,
                    &current,
                )? {
                    return Ok(stopped(report, coordinator.as_ref(), &mut stats, started));
                }
                generation = next_generation(&*store, &cfg.job_fingerprint, generation, lease_end)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        // Establish this generation (create-if-absent): a second coordinator of the job stops here,
        // and manifests older generations complete from now on above what this start saw are fenced.
        match claim_generation(&*store, &cfg.job_fingerprint, generation, &index, restored)
            .and_then(|()| committed_meanwhile(&*store, manifests_before, &index, restored))
        {
            Ok(None) => {}
            Ok(Some(c)) => {
                // An older coordinator completed `c` after this start listed the checkpoints and
                // before it claimed the generation: its sinks may have committed `c`, so it must not
                // stay fenced. Take the claim back and start over, which restores `c`.
                gap_retries += 1;
                if gap_retries > MAX_GAP_RETRIES {
                    return Err(RunError::Superseded(format!(
                        "another coordinator keeps completing checkpoints of this job ({c} the latest) while this one starts: stop it first"
                    )));
                }
                log(&cfg, || format!("{generation}: checkpoint {c} completed while starting; starting over"));
                if let Err(e) = store.release_generation(generation) {
                    return Err(RunError::Storage(e));
                }
                continue;
            }
            Err(e @ (StorageError::GenerationTaken { .. } | StorageError::Superseded { .. })) => {
                return Err(RunError::Superseded(e.to_string()))
            }
            Err(e) => {
                failed_at.get_or_insert_with(Instant::now);
                let current = coordinator.as_ref().map(|c| c.config().clone()).unwrap_or(cfg.checkpoint.clone());
                let reason = format!("recording {generation}: {e}");
                if !after_failure(&cfg, &mut tracker, started, reason, &mut report, commands, &current)? {
                    return Ok(stopped(report, coordinator.as_ref(), &mut stats, started));
                }
                generation = next_generation(&*store, &cfg.job_fingerprint, generation, lease_end)?;
                continue;
            }
        }
        if coordinator.is_none() {
            report.restored_from = restored;
        }
        match restored {
            Some(r) => log(&cfg, || format!("{generation}: restoring checkpoint {r}")),
            None => log(&cfg, || format!("{generation}: starting from scratch (no complete checkpoint)")),
        }
        let (ev_tx, ev_rx) = crossbeam_channel::unbounded::<RtEvent>();
        let deployed = match backend.deploy(graph, &cfg, generation, &index, restored, started, ev_tx) {
            Ok(d) => d,
            // State that cannot be restored into this job will not get better by retrying.
            Err(DeployError::Permanent(e)) => return Err(RunError::Deploy(e)),
            Err(DeployError::Retry(e)) => {
                // A source or sink failed to open or recover, a worker was lost: a failure like any other.
                backend.teardown();
                let reason = format!("deploying {generation}: {e}");
                failed_at.get_or_insert_with(Instant::now);
                let current = coordinator.as_ref().map(|c| c.config().clone()).unwrap_or(cfg.checkpoint.clone());
                if !after_failure(&cfg, &mut tracker, started, reason, &mut report, commands, &current)? {
                    return Ok(stopped(report, coordinator.as_ref(), &mut stats, started));
                }
                generation = next_generation(&*store, &cfg.job_fingerprint, generation, lease_end)?;
                continue;
            }
        };
        drop(index);
        let now_ms = TimeMs(started.elapsed().as_millis() as u64);
        let coord = coordinator_for(
            &mut coordinator,
            &cfg.checkpoint,
            generation,
            (deployed.tasks.clone(), deployed.sources.clone()),
            (first, lease_end),
            restored,
            now_ms,
            &*store,
            &LogOnly(&cfg),
        );
        if let Some(at) = failed_at.take() {
            report.recovery_ms.push(at.elapsed().as_millis() as u64);
        }
        let outcome = run_generation(
            &cfg,
            coord,
            backend,
            deployed,
            ev_rx,
            generation,
            started,
            &mut stats,
            &mut lease_end,
            commands,
            &mut savepoint,
        );
        backend.teardown();
        let outcome = outcome?;
        match outcome {
            GenerationOutcome::Finished(c) => {
                report.final_checkpoint = Some(c);
                report.checkpoints = std::mem::take(&mut stats.done);
                report.failed_checkpoints = std::mem::take(&mut stats.failed);
                report.checkpoints_completed = coord.completed_count();
                report.checkpoints_failed = coord.failed_count();
                report.elapsed_ms = started.elapsed().as_millis() as u64;
                return Ok(report);
            }
            GenerationOutcome::FailedOver(reason) => {
                failed_at = Some(Instant::now());
                let current = coord.config().clone();
                if !after_failure(&cfg, &mut tracker, started, reason, &mut report, commands, &current)? {
                    return Ok(stopped(report, Some(coord), &mut stats, started));
                }
                generation = next_generation(&*store, &cfg.job_fingerprint, generation, lease_end)?;
            }
            GenerationOutcome::Stopped => return Ok(stopped(report, Some(coord), &mut stats, started)),
            GenerationOutcome::StoppedWithSavepoint(info) => {
                report.final_checkpoint = None;
                report.stopped_with_savepoint = Some(info);
                return Ok(stopped(report, Some(coord), &mut stats, started));
            }
        }
    }
}

/// The report of a run stopped through [`JobHandle::stop`].
fn stopped(
    mut report: JobReport,
    coord: Option<&Coordinator<AckReport>>,
    stats: &mut CheckpointLog,
    started: Instant,
) -> JobReport {
    report.stopped = true;
    if let Some(c) = coord {
        report.checkpoints_completed = c.completed_count();
        report.checkpoints_failed = c.failed_count();
    }
    report.checkpoints = std::mem::take(&mut stats.done);
    report.failed_checkpoints = std::mem::take(&mut stats.failed);
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    report
}

/// Ask the restart strategy; wait its delay or give up. `Ok(false)`: stopped while waiting.
fn after_failure(
    cfg: &RunConfig,
    tracker: &mut RestartTracker,
    started: Instant,
    reason: String,
    report: &mut JobReport,
    commands: &Receiver<Command>,
    current: &CheckpointConfig,
) -> Result<bool, RunError> {
    log(cfg, || format!("failing over: {reason}"));
    match tracker.on_failure(TimeMs(started.elapsed().as_millis() as u64)) {
        RestartDecision::GiveUp { attempts } => Err(RunError::GaveUp { attempts, last: reason }),
        RestartDecision::RestartAfter { delay_ms, attempt } => {
            log(cfg, || format!("restart attempt {attempt} in {delay_ms} ms"));
            let until = Instant::now() + Duration::from_millis(delay_ms);
            loop {
                match commands.recv_deadline(until) {
                    Ok(Command::Stop) => return Ok(false),
                    Ok(Command::SetCheckpointConfig(_, reply)) => {
                        let _ = reply.send(Err("the job is restarting; try again".into()));
                    }
                    Ok(Command::UpdateCheckpointConfig(_, reply)) => {
                        let _ = reply.send(Err("the job is restarting; try again".into()));
                    }
                    Ok(Command::CheckpointConfig(reply)) => {
                        let _ = reply.send(current.clone());
                    }
                    Ok(Command::Savepoint { reply, .. }) => {
                        let _ = reply.send(Err("the job is restarting; try again".into()));
                    }
                    Ok(Command::Metrics(reply)) => {
                        let _ = reply.send(JobMetrics { config: current.clone(), ..Default::default() });
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        std::thread::sleep(until.saturating_duration_since(Instant::now()));
                        break;
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => break,
                }
            }
            report.restarts += 1;
            Ok(true)
        }
    }
}

enum GenerationOutcome {
    Finished(CheckpointId),
    FailedOver(String),
    Stopped,
    StoppedWithSavepoint(SavepointInfo),
}

/// A savepoint asked for through [`JobControl`], until it is exported or fails.
struct SavepointRequest {
    stop: bool,
    target: Option<PathBuf>,
    reply: Sender<Result<SavepointInfo, String>>,
    checkpoint: Option<CheckpointId>,
    /// Exported (a stop-with-savepoint still drains before the job stops).
    done: Option<SavepointInfo>,
}

#[allow(clippy::too_many_arguments)]
fn run_generation(
    cfg: &RunConfig,
    coord: &mut Coordinator<AckReport>,
    backend: &mut dyn Backend,
    deployed: Deployed,
    ev_rx: Receiver<RtEvent>,
    generation: Generation,
    started: Instant,
    stats: &mut CheckpointLog,
    lease_end: &mut CheckpointId,
    commands: &Receiver<Command>,
    savepoint: &mut Option<SavepointRequest>,
) -> Result<GenerationOutcome, RunError> {
    let store = cfg.store.clone();
    stats.task_names = deployed.names.clone();
    let mut plane = BackendPlane { backend, started, cfg };
    let mut ctx = DriverCtx {
        store: &*store,
        fingerprint: &cfg.job_fingerprint,
        generation,
        retain: cfg.retain,
        lease_end,
        stats,
        unix_ms: unix_ms(),
        savepoints: Vec::new(),
    };
    let tick = Duration::from_millis(cfg.tick_ms);
    let mut next_tick = Instant::now() + tick;
    let mut out = Vec::new();
    let mut cmd_rx = commands.clone();
    let outcome = loop {
        // Ticks come every `tick` whether or not events keep arriving.
        crossbeam_channel::select! {
            recv(ev_rx) -> ev => match ev {
                Ok(RtEvent::Coord(e)) => coord.handle(plane.now(), e, &mut out),
                Ok(RtEvent::Batch(events)) => {
                    let now = plane.now();
                    for e in events {
                        coord.handle(now, e, &mut out);
                    }
                }
                Ok(RtEvent::Failed { generation: g, task, error }) => {
                    coord.handle(plane.now(), Event::TaskFailed { generation: g, task, reason: error }, &mut out)
                }
                Err(_) => {}
            },
            recv(cmd_rx) -> c => match c {
                Ok(Command::Stop) => break GenerationOutcome::Stopped,
                Ok(Command::SetCheckpointConfig(config, reply)) => {
                    plane.log(&|| format!("new checkpoint settings: {config:?}"));
                    let _ = reply.send(coord.set_config(config));
                }
                Ok(Command::CheckpointConfig(reply)) => {
                    let _ = reply.send(coord.config().clone());
                }
                Ok(Command::UpdateCheckpointConfig(edit, reply)) => {
                    let mut config = coord.config().clone();
                    let result = edit(&mut config).and_then(|()| coord.set_config(config)).map(|()| coord.config().clone());
                    if let Ok(c) = &result {
                        plane.log(&|| format!("new checkpoint settings: {c:?}"));
                    }
                    let _ = reply.send(result);
                }
                Ok(Command::Savepoint { stop, target, reply }) => {
                    if savepoint.is_some() {
                        let _ = reply.send(Err("a savepoint is already in progress; wait for it".into()));
                    } else if target.is_none() && cfg.savepoint_dir.is_none() {
                        let _ = reply.send(Err("no savepoint directory: name one, or set RunConfig::savepoint_dir".into()));
                    } else {
                        *savepoint = Some(SavepointRequest { stop, target, reply, checkpoint: None, done: None });
                        coord.handle(plane.now(), Event::SavepointRequested { stop }, &mut out);
                    }
                }
                Ok(Command::Metrics(reply)) => {
                    let done = &ctx.stats.done;
                    let tasks = plane.backend.task_reports(&ctx.stats.task_names);
                    let _ = reply.send(JobMetrics {
                        generation,
                        config: coord.config().clone(),
                        tasks,
                        checkpoints: done[done.len().saturating_sub(METRICS_CHECKPOINTS)..].to_vec(),
                        checkpoints_completed: coord.completed_count(),
                        checkpoints_failed: coord.failed_count(),
                        failed: ctx.stats.failed[ctx.stats.failed.len().saturating_sub(METRICS_CHECKPOINTS)..].to_vec(),
                        pending: coord.pending(),
                    });
                }
                // The handle is gone: the job runs on, and nobody can send commands any more.
                Err(_) => cmd_rx = crossbeam_channel::never(),
            },
            default(next_tick.saturating_duration_since(Instant::now())) => {}
        }
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + tick;
            if let Some(reason) = plane.backend.check() {
                break GenerationOutcome::FailedOver(reason);
            }
            coord.handle(plane.now(), Event::Tick, &mut out);
        }
        if out.is_empty() {
            continue;
        }
        ctx.unix_ms = unix_ms();
        let carried = carry_out(coord, std::mem::take(&mut out), &mut ctx, &mut plane)?;
        for ev in ctx.savepoints.drain(..) {
            answer_savepoint(savepoint, ev, cfg, &*store, &plane);
        }
        match carried {
            Carried::Continue => {}
            Carried::FailOver(reason) => break GenerationOutcome::FailedOver(reason),
            Carried::Finished(c) => break GenerationOutcome::Finished(c),
            Carried::Stopped(c) => {
                let sp = savepoint.take().expect("stopped with a savepoint nobody asked for");
                assert_eq!(sp.checkpoint, Some(c));
                match sp.done {
                    Some(info) => break GenerationOutcome::StoppedWithSavepoint(info),
                    // The savepoint is complete (and the job's latest checkpoint), only its copy failed;
                    // the requester was told.
                    None => break GenerationOutcome::Stopped,
                }
            }
        }
    };
    if let Some(sp) = savepoint.take_if(|sp| !matches!(outcome, GenerationOutcome::FailedOver(_)) || sp.done.is_none())
    {
        if sp.done.is_none() {
            let _ = sp.reply.send(Err(match &outcome {
                GenerationOutcome::FailedOver(r) => format!("the job failed over before the savepoint completed ({r}); it keeps running from its latest checkpoint"),
                _ => "the job ended before the savepoint completed".into(),
            }));
        }
    }
    drop(ev_rx);
    Ok(outcome)
}

/// Follow a savepoint request through the events of carrying out decisions: learn its checkpoint,
/// export it once complete, or report why it failed.
fn answer_savepoint(
    slot: &mut Option<SavepointRequest>,
    ev: SavepointEvent,
    cfg: &RunConfig,
    store: &dyn CheckpointStore,
    plane: &dyn ControlPlane,
) {
    let Some(sp) = slot.as_mut() else { return };
    match ev {
        SavepointEvent::Triggered { checkpoint, stop } => {
            assert_eq!(stop, sp.stop);
            assert!(sp.checkpoint.is_none(), "one savepoint request triggered twice");
            sp.checkpoint = Some(checkpoint);
            plane.log(&|| format!("savepoint {checkpoint} triggered{}", if stop { " (stop)" } else { "" }));
        }
        SavepointEvent::Completed { checkpoint } if sp.checkpoint == Some(checkpoint) => {
            let target = sp.target.clone().unwrap_or_else(|| {
                cfg.savepoint_dir.as_ref().expect("checked at request").join(format!("sp-{:020}", checkpoint.0))
            });
            let stop = sp.stop;
            let result = super::savepoint::export(store, checkpoint, &target, &cfg.job_fingerprint).map_err(|e| {
                format!(
                    "savepoint {checkpoint} is complete in the job's store, but exporting it failed: {e}{}",
                    if stop {
                        "; the job stops anyway (run it again on its state directory to resume from that checkpoint)"
                    } else {
                        ""
                    }
                )
            });
            if let Ok(info) = &result {
                plane.log(&|| {
                    format!("savepoint {checkpoint} exported to {} ({} bytes)", info.path.display(), info.bytes)
                });
                sp.done = Some(info.clone());
            }
            let _ = sp.reply.send(result);
            if !sp.stop {
                *slot = None;
            }
        }
        SavepointEvent::Aborted { checkpoint, reason } if sp.checkpoint == Some(checkpoint) => {
            let _ = sp.reply.send(Err(format!(
                "savepoint {checkpoint} failed: {reason}{}",
                if sp.stop { "; the job keeps running" } else { "" }
            )));
            *slot = None;
        }
        SavepointEvent::Rejected { reason } if sp.checkpoint.is_none() => {
            let _ = sp.reply.send(Err(format!("no savepoint now: {reason}")));
            *slot = None;
        }
        _ => {}
    }
}

/// What the coordinator loop knows of a deployed generation.
pub(crate) struct Deployed {
    pub tasks: Vec<TaskId>,
    pub sources: Vec<TaskId>,
    /// Task names by task id.
    pub names: Vec<String>,
}

/// Why a generation could not be deployed.
pub(crate) enum DeployError {
    /// State that does not fit the job: retrying cannot help.
    Permanent(TaskError),
    /// A source or sink failed to open, a worker was lost: restart like after any failure.
    Retry(String),
}

/// Where the tasks of a generation run: threads of this process ([`LocalBackend`]) or worker
/// processes (the cluster runtime). The coordinator loop is the same for both.
pub(crate) trait Backend {
    /// Start `generation` from `index`; its tasks' events go to `events`.
    #[allow(clippy::too_many_arguments)]
    fn deploy(
        &mut self,
        graph: &JobGraph,
        cfg: &RunConfig,
        generation: Generation,
        index: &RestoreIndex,
        restored: Option<CheckpointId>,
        started: Instant,
        events: Sender<RtEvent>,
    ) -> Result<Deployed, DeployError>;
    /// Deliver `c` to every task of the generation, or to its sources.
    fn send_all(&mut self, c: Control, sources_only: bool);
    /// Evaluated every tick: a reason to fail over that no task reports (a lost worker).
    fn check(&mut self) -> Option<String> {
        None
    }
    /// Flow-control figures per task, for metrics.
    fn task_reports(&self, names: &[String]) -> Vec<TaskReport>;
    /// Stop every task of the current generation and wait until they are gone.
    fn teardown(&mut self);
}

/// The coordinator loop's control plane: decisions go to the backend.
struct BackendPlane<'a> {
    backend: &'a mut dyn Backend,
    started: Instant,
    cfg: &'a RunConfig,
}

impl ControlPlane for BackendPlane<'_> {
    fn send_all(&mut self, c: Control, sources_only: bool) {
        self.backend.send_all(c, sources_only)
    }
    fn now(&self) -> TimeMs {
        TimeMs(self.started.elapsed().as_millis() as u64)
    }
    fn log(&self, msg: &dyn Fn() -> String) {
        log(self.cfg, msg)
    }
}

/// A control plane with no tasks, for logging outside a generation.
struct LogOnly<'a>(&'a RunConfig);

impl ControlPlane for LogOnly<'_> {
    fn send_all(&mut self, _c: Control, _sources_only: bool) {}
    fn now(&self) -> TimeMs {
        TimeMs(0)
    }
    fn log(&self, msg: &dyn Fn() -> String) {
        log(self.0, msg)
    }
}
