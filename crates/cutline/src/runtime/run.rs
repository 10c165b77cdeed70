//! The run of a job on a `Backend` (threads of this process, or worker processes): the host of the
//! one run loop (`life::drive`) that deploys generations through the backend, runs each generation's
//! coordinator loop (events in, decisions carried out, commands of a [`JobControl`](super::JobControl)
//! answered), and waits between restarts while still answering commands.
//!
//! It owns no protocol logic of its own: the coordinator, aligner, restart policy and run lifecycle
//! decide; this module moves messages, bytes and threads.

use super::config::RunConfig;
use super::control::{wait_answering, Command};
use super::driver::{carry_out, coordinator_for, Carried, CheckpointLog, ControlPlane, DriverCtx, SavepointEvent};
use super::error::RunError;
use super::keeper::RecordKeeper;
use super::life::{drive, DeployFailure, Ended, LifeHost};
use super::report::{fill_records_out, AckReport, JobReport, TaskReport};
use super::savepoint::SavepointInfo;
use super::start::unix_ms;
use super::task::Control;
use crate::dataflow::JobGraph;
use crate::error::TaskError;
use crate::state::RestoreIndex;
use crossbeam_channel::{Receiver, Sender};
use cutline_core::barrier::CheckpointMode;
use cutline_core::coordinator::{Coordinator, Event, Violation};
use cutline_core::lifecycle::{Cause, GenerationEnd};
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use cutline_storage::CheckpointStore;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Events (or one worker's batch of events) queued for the coordinator loop of a generation. Task
/// threads and the cluster's connection readers block while it is full: a flood of events is
/// backpressured to its source and never grows memory beyond this.
pub(crate) const EVENT_QUEUE_MESSAGES: usize = 4096;

// An ack (with its trace timings) is the large variant: at most EVENT_QUEUE_MESSAGES of them are
// queued (about 1 MiB), and each moves once per task and checkpoint; a box would cost an allocation
// per ack for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum RtEvent {
    Coord(Event<AckReport>),
    /// Several events in order from one worker (one message): one wake-up of the coordinator loop
    /// for all.
    Batch {
        worker: u32,
        events: Vec<Event<AckReport>>,
    },
    Failed {
        generation: Generation,
        task: TaskId,
        error: String,
        /// Restarting cannot mend it (`TaskError::is_permanent`).
        permanent: bool,
    },
}

/// Run `graph` with its tasks wherever `backend` puts them (threads here, or worker processes).
pub(crate) fn run_on(
    graph: &JobGraph,
    cfg: RunConfig,
    commands: &Receiver<Command>,
    backend: &mut dyn Backend,
) -> Result<JobReport, RunError> {
    // Every event of this run carries the job's name (JSON logs list the spans of an event).
    let _job = tracing::info_span!("job", job = %graph.name()).entered();
    cfg.validate()?;
    // One running job per store: a second process on the same state directory is refused.
    let _lock = cfg.store.lock()?;
    let started = Instant::now();
    let mut host = RunHost {
        graph,
        cfg: &cfg,
        backend,
        commands,
        started,
        coordinator: None,
        stats: {
            let mut log = CheckpointLog::for_graph(graph);
            log.load_history(&*cfg.store);
            log.keeper = RecordKeeper::threaded(cfg.store.clone(), cfg.on_checkpoint.clone());
            log
        },
        report: JobReport::default(),
        savepoint: None,
        deployed: None,
    };
    let driven = drive(graph, &cfg, &mut host).expect("only the simulation's processes die on purpose");
    let mut report = std::mem::take(&mut host.report);
    report.restarts = driven.restarts;
    report.restored_from = driven.restored_at_start.flatten();
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    if let Some(c) = &host.coordinator {
        report.checkpoints_completed = c.completed_count();
        report.checkpoints_failed = c.failed_count();
    }
    report.checkpoints = std::mem::take(&mut host.stats.done);
    report.failed_checkpoints = std::mem::take(&mut host.stats.failed);
    match driven.end? {
        Ended::AlreadyFinished(c) => {
            tracing::info!(event = "already_finished", chk = %c, "job already finished with checkpoint {c}; nothing to do");
            Ok(JobReport { already_finished: true, final_checkpoint: Some(c), ..Default::default() })
        }
        Ended::Finished(c) => {
            report.final_checkpoint = Some(c);
            Ok(report)
        }
        Ended::Stopped | Ended::StoppedWithSavepoint => {
            report.stopped = true;
            Ok(report)
        }
    }
}

/// The threaded runtime's (and the cluster coordinator's) side of the run loop.
struct RunHost<'a> {
    graph: &'a JobGraph,
    cfg: &'a RunConfig,
    backend: &'a mut dyn Backend,
    commands: &'a Receiver<Command>,
    started: Instant,
    /// Created at the first deployment, restarted at every later one.
    coordinator: Option<Coordinator<AckReport>>,
    stats: CheckpointLog,
    report: JobReport,
    savepoint: Option<SavepointRequest>,
    /// The deployed generation, until it runs.
    deployed: Option<(Deployed, Receiver<RtEvent>)>,
}

impl LifeHost for RunHost<'_> {
    fn now(&self) -> TimeMs {
        TimeMs(self.started.elapsed().as_millis() as u64)
    }

    fn mode(&self) -> CheckpointMode {
        self.coordinator.as_ref().map(|c| c.config().mode).unwrap_or(self.cfg.checkpoint.mode)
    }

    fn deploy(
        &mut self,
        generation: Generation,
        index: RestoreIndex,
        restored: Option<CheckpointId>,
        (first_epoch, lease_end): (CheckpointId, CheckpointId),
    ) -> Result<(), DeployFailure> {
        let (ev_tx, ev_rx) = crossbeam_channel::bounded::<RtEvent>(EVENT_QUEUE_MESSAGES);
        let deployed =
            match self.backend.deploy(self.graph, self.cfg, generation, &index, restored, self.started, ev_tx) {
                Ok(d) => d,
                Err(e) => {
                    // No one drains the events any more: senders blocked on a full queue get an error
                    // instead, and the teardown can join them.
                    drop(ev_rx);
                    self.backend.teardown();
                    return Err(match e {
                        // State that cannot be restored into this job will not get better by retrying.
                        DeployError::Permanent(e) => DeployFailure { error: RunError::Deploy(e), permanent: true },
                        // A process of the cluster cannot run this job at all.
                        DeployError::Refused(e) => DeployFailure { error: RunError::Permanent(e), permanent: true },
                        // A source or sink failed to open or recover, a worker was lost: a failure like any other.
                        DeployError::Retry(e) => DeployFailure { error: RunError::Start(e), permanent: false },
                    });
                }
            };
        if restored.is_some() {
            self.stats.counters.restores += 1;
        }
        if !index.skipped.is_empty() {
            self.stats.counters.fallbacks += 1;
        }
        drop(index);
        let now = self.now();
        coordinator_for(
            &mut self.coordinator,
            &self.cfg.checkpoint,
            generation,
            (deployed.tasks.clone(), deployed.sources.clone()),
            (first_epoch, lease_end),
            restored,
            now,
            &*self.cfg.store,
        );
        self.deployed = Some((deployed, ev_rx));
        Ok(())
    }

    fn run(
        &mut self,
        generation: Generation,
        recovered_after_ms: Option<u64>,
    ) -> (GenerationEnd<RunError>, CheckpointId) {
        if let Some(ms) = recovered_after_ms {
            self.report.recovery_ms.push(ms);
            self.stats.counters.restarts += 1;
        }
        let (deployed, ev_rx) = self.deployed.take().expect("a deployment precedes every run");
        let coord = self.coordinator.as_mut().expect("created at the deployment");
        let mut lease_end = coord_lease(coord);
        let outcome = run_generation(
            self.cfg,
            coord,
            &mut *self.backend,
            deployed,
            ev_rx,
            generation,
            self.started,
            &mut self.stats,
            &mut lease_end,
            self.commands,
            &mut self.savepoint,
        );
        self.backend.teardown();
        let end = match outcome {
            Err(e) => GenerationEnd::Error(e),
            Ok(GenerationOutcome::Finished(c)) => GenerationEnd::Finished(c),
            Ok(GenerationOutcome::FailedOver(reason)) => GenerationEnd::FailedOver { reason, permanent: false },
            Ok(GenerationOutcome::FailedPermanently(reason)) => GenerationEnd::FailedOver { reason, permanent: true },
            Ok(GenerationOutcome::Stopped) => GenerationEnd::Stopped,
            Ok(GenerationOutcome::StoppedWithSavepoint(info)) => {
                self.report.stopped_with_savepoint = Some(info);
                GenerationEnd::StoppedWithSavepoint
            }
        };
        (end, lease_end)
    }

    fn wait(&mut self, delay_ms: u64, _cause: Cause) -> bool {
        let current = self.coordinator.as_ref().map(|c| c.config().clone()).unwrap_or(self.cfg.checkpoint.clone());
        // Between generations: no tasks, but the run's history and counters.
        let mut idle = self.stats.metrics(usize::MAX, Vec::new(), self.started.elapsed().as_millis() as u64);
        idle.config = current;
        idle.checkpoints_completed = self.coordinator.as_ref().map_or(0, |c| c.completed_count());
        idle.checkpoints_failed = self.coordinator.as_ref().map_or(0, |c| c.failed_count());
        wait_answering(self.commands, Duration::from_millis(delay_ms), &idle)
    }
}

/// The durable epoch lease the coordinator works under.
fn coord_lease(coord: &Coordinator<AckReport>) -> CheckpointId {
    coord.lease_end()
}

enum GenerationOutcome {
    Finished(CheckpointId),
    FailedOver(String),
    /// A task failed in a way restarting cannot mend (see [`crate::ConnectorError::permanent`]).
    FailedPermanently(String),
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
    let _gen = tracing::info_span!("generation", gen = %generation).entered();
    let store = cfg.store.clone();
    stats.on_deployed(&deployed.names);
    let mut plane = BackendPlane { backend, started };
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
    // The first task failure of this generation marked permanent: the failover it causes ends the run.
    let mut permanent: Option<String> = None;
    let outcome = loop {
        // Ticks come every `tick` whether or not events keep arriving.
        crossbeam_channel::select! {
            recv(ev_rx) -> ev => {
                let now = plane.now();
                let now_us = plane.now_us();
                // An event the protocol does not allow is its sender's fault: the backend holds the
                // sender responsible (a worker is dropped) and the generation fails over.
                let refused = match ev {
                    Ok(RtEvent::Coord(e)) => coord.handle(now, stamped(e, now_us), &mut out).err().map(|v| plane.backend.refuse(None, v)),
                    Ok(RtEvent::Batch { worker, events }) => events.into_iter().map(|e| stamped(e, now_us)).find_map(|e| {
                        let checked = plane.backend.check_origin(worker, &e);
                        if let (Ok(()), Event::TaskFailed { generation: g, task, reason, permanent: true }) = (&checked, &e) {
                            if *g == generation && permanent.is_none() {
                                permanent = Some(format!("{task} failed: {reason}"));
                            }
                        }
                        checked.and_then(|()| coord.handle(now, e, &mut out)).err()
                    }).map(|v| plane.backend.refuse(Some(worker), v)),
                    Ok(RtEvent::Failed { generation: g, task, error, permanent: fatal }) => {
                        if g == generation && permanent.is_none() && fatal {
                            permanent = Some(format!("{task} failed: {error}"));
                        }
                        coord
                            .handle(now, Event::TaskFailed { generation: g, task, reason: error, permanent: fatal }, &mut out)
                            .err()
                            .map(|v| plane.backend.refuse(None, v))
                    }
                    Err(_) => None,
                };
                if let Some(reason) = refused {
                    break GenerationOutcome::FailedOver(reason);
                }
            },
            recv(cmd_rx) -> c => match c {
                Ok(Command::Stop) => break GenerationOutcome::Stopped,
                Ok(Command::SetCheckpointConfig(config, reply)) => {
                    tracing::info!(event = "settings", "new checkpoint settings: {config:?}");
                    let _ = reply.send(coord.set_config(config));
                }
                Ok(Command::CheckpointConfig(reply)) => {
                    let _ = reply.send(coord.config().clone());
                }
                Ok(Command::UpdateCheckpointConfig(edit, reply)) => {
                    let mut config = coord.config().clone();
                    let result = edit(&mut config).and_then(|()| coord.set_config(config)).map(|()| coord.config().clone());
                    if let Ok(c) = &result {
                        tracing::info!(event = "settings", "new checkpoint settings: {c:?}");
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
                        own(coord.handle(plane.now(), Event::SavepointRequested { stop }, &mut out));
                    }
                }
                Ok(Command::Metrics { checkpoints, reply }) => {
                    let mut tasks = plane.backend.task_reports(&ctx.stats.task_names);
                    fill_records_out(&mut tasks);
                    let mut m = ctx.stats.metrics(checkpoints, tasks, started.elapsed().as_millis() as u64);
                    m.generation = generation;
                    m.config = coord.config().clone();
                    (m.checkpoints_completed, m.checkpoints_failed) = (coord.completed_count(), coord.failed_count());
                    m.pending = coord.pending();
                    let _ = reply.send(m);
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
            own(coord.handle(plane.now(), Event::Tick, &mut out));
        }
        if out.is_empty() {
            continue;
        }
        ctx.unix_ms = unix_ms();
        let carried = carry_out(coord, std::mem::take(&mut out), &mut ctx, &mut plane)?;
        for ev in ctx.savepoints.drain(..) {
            answer_savepoint(savepoint, ev, cfg, &*store);
        }
        match carried {
            Carried::Continue => {}
            Carried::FailOver(reason) => break GenerationOutcome::FailedOver(plane.backend.failover_reason(reason)),
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
    let outcome = match (outcome, permanent) {
        (GenerationOutcome::FailedOver(_), Some(reason)) => GenerationOutcome::FailedPermanently(reason),
        (outcome, _) => outcome,
    };
    if let Some(sp) = savepoint.take_if(|sp| !matches!(outcome, GenerationOutcome::FailedOver(_)) || sp.done.is_none())
    {
        if sp.done.is_none() {
            let _ = sp.reply.send(Err(match &outcome {
                GenerationOutcome::FailedOver(r) => format!("the job failed over before the savepoint completed ({r}); it keeps running from its latest checkpoint"),
                GenerationOutcome::FailedPermanently(r) => format!("the job failed before the savepoint completed, and cannot recover by restarting: {r}"),
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
) {
    let Some(sp) = slot.as_mut() else { return };
    match ev {
        SavepointEvent::Triggered { checkpoint, stop } => {
            assert_eq!(stop, sp.stop);
            assert!(sp.checkpoint.is_none(), "one savepoint request triggered twice");
            sp.checkpoint = Some(checkpoint);
            tracing::info!(
                event = "savepoint_triggered",
                chk = %checkpoint,
                stop,
                "savepoint {checkpoint} triggered{}",
                if stop { " (stop)" } else { "" }
            );
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
                tracing::info!(
                    event = "savepoint_exported",
                    chk = %checkpoint,
                    "savepoint {checkpoint} exported to {} ({} bytes)",
                    info.path.display(),
                    info.bytes
                );
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
    /// A process of the cluster cannot run this job (it builds another job graph): the job fails.
    Refused(String),
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
    /// The generation fails over for `reason` (a task failed): the reason to report, which may name
    /// a cause the task could not see (the worker whose loss broke its data link).
    fn failover_reason(&mut self, reason: String) -> String {
        reason
    }
    /// Is `event`, which `worker` sent, about a task placed on that worker? (Only clusters have workers.)
    fn check_origin(&self, worker: u32, event: &Event<AckReport>) -> Result<(), Violation> {
        let _ = (worker, event);
        Ok(())
    }
    /// `violation` came from `worker`, or from a task of this process (`None`): hold the sender
    /// responsible. Returns the reason of the failover that follows.
    fn refuse(&mut self, worker: Option<u32>, violation: Violation) -> String {
        let _ = worker;
        format!("{violation} (a bug in cutline: please report it with the job that triggers it)")
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
}

impl ControlPlane for BackendPlane<'_> {
    fn send_all(&mut self, c: Control, sources_only: bool) {
        self.backend.send_all(c, sources_only)
    }
    fn now(&self) -> TimeMs {
        TimeMs(self.started.elapsed().as_millis() as u64)
    }
    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }
}

/// An event the runtime itself produced: the protocol always allows it (a refusal is a bug here).
pub(crate) fn own(r: Result<(), Violation>) {
    if let Err(v) = r {
        panic!("the runtime's own event was refused: {v}");
    }
}

/// `e` with the time it reached the coordinator written into an ack (for its latency).
fn stamped(mut e: Event<AckReport>, now_us: u64) -> Event<AckReport> {
    if let Event::Acked { report, .. } = &mut e {
        report.received_at_us = now_us;
    }
    e
}
