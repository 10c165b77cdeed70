//! The threaded runtime: one thread per task, a small pool of snapshot writers, and the coordinator
//! loop on the calling thread. It carries out the coordinator's decisions (inject barriers, commit
//! manifests, notify, abort, fail over) and the recovery decisions (which checkpoint, when to restart).
//!
//! It owns no protocol logic of its own: the coordinator, aligner and restart policy decide; this module
//! moves messages, bytes and threads.

use crate::driver::{
    carry_out, coordinator_for, next_generation, task_metas, write_snapshot, Carried, CheckpointLog, ControlPlane,
    DriverCtx, SnapshotJob, TaskMeta,
};
use crate::fault::Faults;
use crate::graph::{DeployOptions, DeployedTask, JobGraph};
use crate::message::{Control, TaskError};
use crate::source::SourceStatus;
use crate::state::{RestoreIndex, SnapshotBuilder};
use crate::task::{SnapshotTimings, SourcePhase, Task, TaskEnv};
use crossbeam_channel::{Receiver, Select, Sender};
use cutline_core::barrier::Barrier;
use cutline_core::barrier::CheckpointMode;
use cutline_core::coordinator::{CheckpointConfig, Coordinator, Event, EPOCH_LEASE_BLOCK};
use cutline_core::restart::{choose_restore, Candidate, RestartDecision, RestartStrategy, RestartTracker};
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use cutline_storage::{CheckpointStore, JobMeta, Manifest, StorageError, TaskStateHandle};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Batches a data channel holds before its sender blocks (backpressure).
pub const DEFAULT_CHANNEL_CAPACITY: usize = 16;
/// Snapshots queued for the writers before a task blocks at its next barrier.
pub const SNAPSHOT_QUEUE_CAPACITY: usize = 64;
/// Complete checkpoints kept by retention.
pub const DEFAULT_RETAINED_CHECKPOINTS: usize = 3;
/// How often the coordinator looks at the clock when nothing happens.
pub const DEFAULT_TICK_MS: u64 = 1;
/// How long an idle source waits before polling again.
const SOURCE_IDLE_WAIT_MS: u64 = 1;

/// How a job runs. Build with [`RunConfig::new`] and adjust fields.
#[derive(Clone)]
pub struct RunConfig {
    pub store: Arc<dyn CheckpointStore>,
    /// Identifies the job in its state directory: a directory written by another job is refused.
    pub job_fingerprint: String,
    pub checkpoint: CheckpointConfig,
    pub restart: RestartStrategy,
    /// Complete checkpoints kept (default 3).
    pub retain: usize,
    /// Batches per data channel (default 16).
    pub channel_capacity: usize,
    /// Records per batch (default 1024).
    pub batch_size: usize,
    /// Snapshot writer threads (default 1).
    pub snapshot_writers: usize,
    /// Failure injection (drills, tests); none by default.
    pub faults: Faults,
    /// How often the coordinator evaluates triggers and timeouts (default 1 ms).
    pub tick_ms: u64,
    /// Print a line per checkpoint, failure and restart to stderr.
    pub verbose: bool,
}

impl RunConfig {
    pub fn new(store: Arc<dyn CheckpointStore>, job_fingerprint: impl Into<String>) -> RunConfig {
        RunConfig {
            store,
            job_fingerprint: job_fingerprint.into(),
            checkpoint: CheckpointConfig::default(),
            restart: RestartStrategy::default(),
            retain: DEFAULT_RETAINED_CHECKPOINTS,
            channel_capacity: DEFAULT_CHANNEL_CAPACITY,
            batch_size: crate::emit::DEFAULT_BATCH_SIZE,
            snapshot_writers: 1,
            faults: Faults::none(),
            tick_ms: DEFAULT_TICK_MS,
            verbose: false,
        }
    }

    fn validate(&self) -> Result<(), RunError> {
        self.checkpoint.validate().map_err(RunError::Config)?;
        let bad = |m: &str| Err(RunError::Config(m.to_string()));
        if self.retain == 0 {
            return bad("retain must keep at least 1 checkpoint");
        }
        if self.channel_capacity == 0 || self.batch_size == 0 || self.snapshot_writers == 0 || self.tick_ms == 0 {
            return bad("channel capacity, batch size, snapshot writers and tick must all be positive");
        }
        Ok(())
    }
}

/// Why a job did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(
        "the checkpoints in {store} belong to job {found:?}, not {expected:?}: use another state directory (--state)"
    )]
    WrongJob { store: String, found: String, expected: String },
    // Not marked as the error's source: the message already carries it, and error reporters that
    // print the source chain would say it twice.
    #[error("checkpoint storage: {0}")]
    Storage(StorageError),
    #[error("cannot restore checkpoint {checkpoint}: {reason}")]
    Restore { checkpoint: CheckpointId, reason: String },
    #[error("the job failed and the restart strategy gave up after {attempts} restart(s); last failure: {last}")]
    GaveUp { attempts: u32, last: String },
    #[error("a task failed while the job was being deployed: {0}")]
    Deploy(TaskError),
    #[error("cannot start a thread ({0}): raise the process or thread limit, or lower the parallelism")]
    Spawn(std::io::Error),
    #[error("{0} (a bug in cutline: please report it with the job that triggers it)")]
    Internal(String),
    #[error("the {what} file in {store} is damaged ({reason}): {advice}")]
    Damaged { what: &'static str, store: String, reason: String, advice: &'static str },
}

impl From<StorageError> for RunError {
    fn from(e: StorageError) -> Self {
        RunError::Storage(e)
    }
}

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
    /// Time from each failure to the restored job running again.
    pub recovery_ms: Vec<u64>,
    /// The run was stopped through [`JobHandle::stop`] before the job finished.
    pub stopped: bool,
    pub elapsed_ms: u64,
}

/// Statistics of one completed checkpoint. Per-task figures are the maximum over the job's tasks.
#[derive(Clone, Debug, Default)]
pub struct CheckpointSummary {
    pub checkpoint: CheckpointId,
    pub is_final: bool,
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
}

/// A task's acknowledgement: where its state went and how long it took.
#[derive(Clone, Debug)]
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

enum RtEvent {
    Coord(Event<AckReport>),
    Failed { generation: Generation, task: TaskId, error: String },
}

struct RtEnv {
    start: Instant,
    generation: Generation,
    writer: Sender<(SnapshotJob, Instant)>,
    events: Sender<RtEvent>,
    metas: Arc<Vec<TaskMeta>>,
}

impl TaskEnv for RtEnv {
    fn now(&self) -> TimeMs {
        TimeMs(self.start.elapsed().as_millis() as u64)
    }
    fn persist(&mut self, task: TaskId, barrier: Barrier, snap: SnapshotBuilder, timings: SnapshotTimings) {
        let meta = self.metas[task.0 as usize].clone();
        let job = SnapshotJob { generation: self.generation, task, meta, barrier, snap, timings };
        // Writers gone means the job is being torn down; the snapshot no longer matters.
        let _ = self.writer.send((job, Instant::now()));
    }
    fn source_finished(&mut self, task: TaskId) {
        let _ = self.events.send(RtEvent::Coord(Event::SourceFinished { generation: self.generation, task }));
    }
    fn task_finished(&mut self, task: TaskId) {
        let _ = self.events.send(RtEvent::Coord(Event::TaskFinished { generation: self.generation, task }));
    }
}

/// The short job id sinks put in their transaction names.
pub(crate) fn job_id(fingerprint: &str) -> String {
    format!("{:016x}", crate::state::stable_hash(fingerprint))
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn log(cfg: &RunConfig, msg: impl Fn() -> String) {
    if cfg.verbose {
        eprintln!("cutline: {}", msg());
    }
}

/// Read the state of checkpoint `id` into a restore index, checking it belongs to this job.
pub(crate) fn load_checkpoint(
    store: &dyn CheckpointStore,
    graph: &JobGraph,
    fingerprint: &str,
    id: CheckpointId,
) -> Result<(RestoreIndex, Manifest), RunError> {
    let manifest = store.verify(id)?;
    assert_eq!(manifest.checkpoint, id);
    if manifest.job_fingerprint != fingerprint {
        return Err(RunError::WrongJob {
            store: store.describe(),
            found: manifest.job_fingerprint,
            expected: fingerprint.to_string(),
        });
    }
    let mut index = RestoreIndex { checkpoint: Some(id), ..Default::default() };
    for h in &manifest.tasks {
        let payload = store.read_task_state(h)?;
        index
            .add_task_payload(h.subtask.0, h.parallelism, &payload)
            .map_err(|reason| RunError::Restore { checkpoint: id, reason })?;
    }
    let known: std::collections::BTreeSet<&str> = graph.state_uids().collect();
    for uid in index.elements.keys() {
        if !known.contains(uid.as_str()) {
            return Err(RunError::Restore {
                checkpoint: id,
                reason: format!("it holds state of operator {uid:?}, which this job no longer has; keep the operator's id or start from a fresh state directory"),
            });
        }
    }
    Ok((index, manifest))
}

/// Choose the latest complete checkpoint that verifies (warning about newer broken ones) and load it.
/// `mode` is the job's current checkpoint mode (settings may have changed while it ran): it decides
/// whether a restore may commit output twice.
pub(crate) fn restore_latest(
    cfg: &RunConfig,
    graph: &JobGraph,
    mode: CheckpointMode,
) -> Result<(RestoreIndex, Option<CheckpointId>), RunError> {
    // Verify from the newest down and stop at the first that verifies; only damaged data falls back.
    let listing = cfg.store.list_checkpoints()?;
    let mut candidates = Vec::new();
    let mut loaded = None;
    for l in listing.iter().rev().filter(|l| l.complete) {
        match load_checkpoint(&*cfg.store, graph, &cfg.job_fingerprint, l.id) {
            Ok((index, _)) => {
                candidates.push(Candidate { checkpoint: l.id, verified: Ok(()) });
                loaded = Some(index);
                break;
            }
            Err(RunError::Storage(e)) if e.is_corruption() => {
                candidates.push(Candidate { checkpoint: l.id, verified: Err(e.to_string()) })
            }
            Err(e) => return Err(e),
        }
    }
    let choice = choose_restore(candidates);
    for (id, reason) in &choice.skipped {
        eprintln!("cutline: WARNING: checkpoint {id} does not verify ({reason}); falling back to an older one");
    }
    let mut index = loaded.unwrap_or_default();
    assert_eq!(index.checkpoint, choice.checkpoint);
    index.skipped = choice.skipped.iter().map(|(id, _)| *id).collect();
    index.duplicates_allowed = mode == CheckpointMode::AtLeastOnce;
    Ok((index, choice.checkpoint))
}

pub(crate) struct StartInfo {
    pub first: CheckpointId,
    pub generation: Generation,
    pub lease_end: CheckpointId,
}

pub(crate) enum Start {
    AlreadyFinished(CheckpointId),
    Run(StartInfo),
}

/// What every process start does before deploying: check the store belongs to this job, stop if the job
/// already finished, start a new generation and a new epoch lease above everything issued before, and
/// clear partial attempts of the previous process.
pub(crate) fn prepare_start(store: &dyn CheckpointStore, fingerprint: &str) -> Result<Start, RunError> {
    let damaged = |what: &'static str, advice: &'static str| {
        move |e: StorageError| {
            if e.is_corruption() {
                RunError::Damaged { what, store: store.describe(), reason: e.to_string(), advice }
            } else {
                RunError::Storage(e)
            }
        }
    };
    let meta = store.read_meta().map_err(damaged(
        "job.meta",
        "it names the job and its epoch lease; restore it from a backup, or start the job on a fresh state directory",
    ))?;
    if let Some(m) = &meta {
        if m.job_fingerprint != fingerprint {
            return Err(RunError::WrongJob {
                store: store.describe(),
                found: m.job_fingerprint.clone(),
                expected: fingerprint.to_string(),
            });
        }
    }
    if let Some(c) = store
        .finished()
        .map_err(damaged("FINISHED", "delete it: the job then resumes from its latest checkpoint and finishes again"))?
    {
        return Ok(Start::AlreadyFinished(c));
    }
    // Epochs: above the durable lease and above anything in storage, for the whole life of the job.
    let seen = store.max_checkpoint_id_seen()?.map(|c| c.0 + 1).unwrap_or(1);
    let first = CheckpointId(seen.max(meta.as_ref().map(|m| m.epoch_lease_end.0).unwrap_or(1)));
    let generation = meta.as_ref().map(|m| m.generation).unwrap_or_default().next();
    let lease_end = CheckpointId(first.0 + EPOCH_LEASE_BLOCK);
    store.write_meta(&JobMeta { job_fingerprint: fingerprint.to_string(), generation, epoch_lease_end: lease_end })?;
    // Partial attempts of a previous process are garbage now. Complete checkpoints all stay until this
    // run completes one: the newest may not verify, and then an older one is the way back.
    store.gc(usize::MAX, &[])?;
    Ok(Start::Run(StartInfo { first, generation, lease_end }))
}

/// A request to a running job (see [`JobHandle`]).
enum Command {
    Stop,
    SetCheckpointConfig(CheckpointConfig, Sender<Result<(), String>>),
}

/// A job running on a background thread: change its checkpoint settings, stop it, wait for it.
pub struct JobHandle {
    commands: Sender<Command>,
    thread: JoinHandle<Result<JobReport, RunError>>,
}

impl JobHandle {
    /// Change the checkpoint settings (interval, timeout, min pause, concurrency, tolerable failures,
    /// mode) while the job runs; they apply from the next checkpoint trigger. Invalid settings are
    /// refused with the reason, and the old ones stay.
    pub fn set_checkpoint_config(&self, config: CheckpointConfig) -> Result<(), String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::SetCheckpointConfig(config, tx)).map_err(|_| "the job has ended".to_string())?;
        rx.recv().map_err(|_| "the job has ended".to_string())?
    }

    /// Stop the job: every task is torn down without a further checkpoint. Output committed so far
    /// stays; running the job again on the same store resumes from its latest complete checkpoint.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
    }

    /// Has the job ended (finished, stopped or failed)?
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Wait for the job to end.
    pub fn join(self) -> Result<JobReport, RunError> {
        match self.thread.join() {
            Ok(r) => r,
            Err(p) => Err(RunError::Internal(format!("the job's coordinator panicked: {}", panic_message(&*p)))),
        }
    }
}

/// Start `graph` on a background thread; see [`run`] for what it does.
pub fn spawn(graph: JobGraph, cfg: RunConfig) -> JobHandle {
    let (tx, rx) = crossbeam_channel::unbounded();
    let thread = std::thread::Builder::new()
        .name(format!("cutline-{}", graph.name()))
        .spawn(move || run_with(&graph, cfg, &rx))
        .expect("spawn the job thread");
    JobHandle { commands: tx, thread }
}

/// Run `graph` to completion with checkpoints and recovery. Starting again on the same store after the
/// process died resumes from the latest complete checkpoint. Use [`spawn`] to control a running job.
pub fn run(graph: &JobGraph, cfg: RunConfig) -> Result<JobReport, RunError> {
    let (_tx, rx) = crossbeam_channel::unbounded();
    run_with(graph, cfg, &rx)
}

fn run_with(graph: &JobGraph, cfg: RunConfig, commands: &Receiver<Command>) -> Result<JobReport, RunError> {
    cfg.validate()?;
    // One running job per store: a second process on the same state directory is refused.
    let _lock = cfg.store.lock()?;
    let started = Instant::now();
    let store = cfg.store.clone();
    let start = match prepare_start(&*store, &cfg.job_fingerprint)? {
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
    loop {
        let mode = coordinator.as_ref().map(|c| c.config().mode).unwrap_or(cfg.checkpoint.mode);
        let (index, restored) = match restore_latest(&cfg, graph, mode) {
            Ok(r) => r,
            // Storage that fails to answer (not damaged data) may answer later: a failure like any other.
            Err(RunError::Storage(e)) if !e.is_corruption() => {
                failed_at.get_or_insert_with(Instant::now);
                if !after_failure(
                    &cfg,
                    &mut tracker,
                    started,
                    format!("reading checkpoints: {e}"),
                    &mut report,
                    commands,
                )? {
                    return Ok(stopped(report, coordinator.as_ref(), &mut stats, started));
                }
                generation = next_generation(&*store, &cfg.job_fingerprint, generation, lease_end)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        if coordinator.is_none() {
            report.restored_from = restored;
        }
        match restored {
            Some(r) => log(&cfg, || format!("{generation}: restoring checkpoint {r}")),
            None => log(&cfg, || format!("{generation}: starting from scratch (no complete checkpoint)")),
        }
        let opts = DeployOptions {
            restore: &index,
            faults: cfg.faults.clone(),
            incarnation_base: generation.0 << 32,
            job_id: job_id(&cfg.job_fingerprint),
            batch_size: cfg.batch_size,
            channel_capacity: Some(cfg.channel_capacity),
        };
        let deployed = match catch_unwind(AssertUnwindSafe(|| graph.deploy(&opts))).unwrap_or_else(|p| {
            Err(TaskError::State { uid: "(deploy)".into(), message: format!("panicked: {}", panic_message(&*p)) })
        }) {
            Ok(d) => d,
            // State that cannot be restored into this job will not get better by retrying.
            Err(e @ TaskError::State { .. }) => return Err(RunError::Deploy(e)),
            Err(e) => {
                // A source or sink failed to open or recover: a failure like any other.
                let reason = format!("deploying {generation}: {e}");
                failed_at.get_or_insert_with(Instant::now);
                if !after_failure(&cfg, &mut tracker, started, reason, &mut report, commands)? {
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
            &deployed,
            (first, lease_end),
            restored,
            now_ms,
            &*store,
            &LogOnly(&cfg),
        );
        if let Some(at) = failed_at.take() {
            report.recovery_ms.push(at.elapsed().as_millis() as u64);
        }
        let outcome =
            run_generation(graph, &cfg, coord, deployed, generation, started, &mut stats, &mut lease_end, commands)?;
        match outcome {
            GenerationOutcome::Finished(c) => {
                report.final_checkpoint = Some(c);
                report.checkpoints = std::mem::take(&mut stats.done);
                report.checkpoints_completed = coord.completed_count();
                report.checkpoints_failed = coord.failed_count();
                report.elapsed_ms = started.elapsed().as_millis() as u64;
                return Ok(report);
            }
            GenerationOutcome::FailedOver(reason) => {
                failed_at = Some(Instant::now());
                if !after_failure(&cfg, &mut tracker, started, reason, &mut report, commands)? {
                    return Ok(stopped(report, Some(coord), &mut stats, started));
                }
                generation = next_generation(&*store, &cfg.job_fingerprint, generation, lease_end)?;
            }
            GenerationOutcome::Stopped => return Ok(stopped(report, Some(coord), &mut stats, started)),
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
}

#[allow(clippy::too_many_arguments)]
fn run_generation(
    graph: &JobGraph,
    cfg: &RunConfig,
    coord: &mut Coordinator<AckReport>,
    deployed: Vec<DeployedTask>,
    generation: Generation,
    started: Instant,
    stats: &mut CheckpointLog,
    lease_end: &mut CheckpointId,
    commands: &Receiver<Command>,
) -> Result<GenerationOutcome, RunError> {
    // Whatever way this function is left (outcome, error, panic), the guard stops and joins every
    // thread. Declared first, it is dropped last: after the channel ends below, so writers see them close.
    let mut threads = GenerationThreads::default();
    let store = cfg.store.clone();
    let (ev_tx, ev_rx) = crossbeam_channel::unbounded::<RtEvent>();
    let (wr_tx, wr_rx) = crossbeam_channel::bounded::<(SnapshotJob, Instant)>(SNAPSHOT_QUEUE_CAPACITY);
    let metas: Arc<Vec<TaskMeta>> = Arc::new(task_metas(graph, &deployed));
    // Snapshot writers.
    for w in 0..cfg.snapshot_writers {
        let rx = wr_rx.clone();
        let ev = ev_tx.clone();
        let store = store.clone();
        let faults = cfg.faults.clone();
        threads.writers.push(
            std::thread::Builder::new()
                .name(format!("cutline-writer-{w}"))
                .spawn(move || writer_loop(rx, ev, store, faults))
                .map_err(RunError::Spawn)?,
        );
    }
    drop(wr_rx);
    stats.task_names = deployed.iter().map(|d| d.task.name.clone()).collect();
    // Tasks.
    let mut source_ids = Vec::new();
    for d in deployed {
        let (c_tx, c_rx) = crossbeam_channel::unbounded::<Control>();
        threads.controls.push(c_tx);
        if d.task.is_source() {
            source_ids.push(d.task.id);
        }
        let env =
            RtEnv { start: started, generation, writer: wr_tx.clone(), events: ev_tx.clone(), metas: metas.clone() };
        let name = d.task.name.clone();
        let task = d.task;
        threads.tasks.push(
            std::thread::Builder::new()
                .name(name)
                .spawn(move || task_thread(task, c_rx, env))
                .map_err(RunError::Spawn)?,
        );
    }
    drop(wr_tx);
    drop(ev_tx);

    let mut plane = ThreadPlane { controls: &threads.controls, sources: &source_ids, started, cfg };
    let mut ctx = DriverCtx {
        store: &*store,
        fingerprint: &cfg.job_fingerprint,
        generation,
        retain: cfg.retain,
        lease_end,
        stats,
        unix_ms: unix_ms(),
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
                // The handle is gone: the job runs on, and nobody can send commands any more.
                Err(_) => cmd_rx = crossbeam_channel::never(),
            },
            default(next_tick.saturating_duration_since(Instant::now())) => {}
        }
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + tick;
            coord.handle(plane.now(), Event::Tick, &mut out);
        }
        if out.is_empty() {
            continue;
        }
        ctx.unix_ms = unix_ms();
        match carry_out(coord, std::mem::take(&mut out), &mut ctx, &mut plane)? {
            Carried::Continue => {}
            Carried::FailOver(reason) => break GenerationOutcome::FailedOver(reason),
            Carried::Finished(c) => break GenerationOutcome::Finished(c),
        }
    };
    drop(plane);
    drop(threads); // tear down before the next generation starts
    drop(ev_rx);
    Ok(outcome)
}

/// The threads of one generation. Dropping it tears the generation down: every task is told to stop
/// (a task blocked sending wakes when its downstream task exits), then tasks and writers are joined;
/// writers stop once every task (and so every sender of snapshots) is gone.
#[derive(Default)]
struct GenerationThreads {
    controls: Vec<Sender<Control>>,
    tasks: Vec<JoinHandle<()>>,
    writers: Vec<JoinHandle<()>>,
}

impl Drop for GenerationThreads {
    fn drop(&mut self) {
        for c in &self.controls {
            let _ = c.send(Control::Cancel);
        }
        self.controls.clear();
        for h in self.tasks.drain(..) {
            let _ = h.join();
        }
        for w in self.writers.drain(..) {
            let _ = w.join();
        }
    }
}

fn writer_loop(
    rx: Receiver<(SnapshotJob, Instant)>,
    events: Sender<RtEvent>,
    store: Arc<dyn CheckpointStore>,
    faults: Faults,
) {
    for (job, captured) in rx {
        let (generation, checkpoint, task) = (job.generation, job.barrier.checkpoint, job.task);
        // A panic while encoding (a user type's Serialize) declines this checkpoint; the writer lives on.
        let ev = catch_unwind(AssertUnwindSafe(|| {
            write_snapshot(&*store, &faults, job, || captured.elapsed().as_millis() as u64)
        }))
        .unwrap_or_else(|p| Event::Declined {
            generation,
            checkpoint,
            task,
            reason: format!("snapshot writer panicked: {}", panic_message(&*p)),
        });
        if events.send(RtEvent::Coord(ev)).is_err() {
            return;
        }
    }
}

/// The threaded runtime's control plane: one unbounded control channel per task.
struct ThreadPlane<'a> {
    controls: &'a [Sender<Control>],
    sources: &'a [TaskId],
    started: Instant,
    cfg: &'a RunConfig,
}

impl ControlPlane for ThreadPlane<'_> {
    fn send_all(&mut self, c: Control, sources_only: bool) {
        // A closed channel is a task that already stopped; the coordinator learns that separately.
        if sources_only {
            for s in self.sources {
                let _ = self.controls[s.0 as usize].send(c.clone());
            }
        } else {
            for t in self.controls {
                let _ = t.send(c.clone());
            }
        }
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

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

fn task_thread(mut task: Task, ctrl: Receiver<Control>, mut env: RtEnv) {
    let result = catch_unwind(AssertUnwindSafe(|| drive(&mut task, &ctrl, &mut env)));
    let error = match result {
        Ok(Ok(())) | Ok(Err(TaskError::Cancelled)) => return,
        Ok(Err(e)) => e.to_string(),
        Err(panic) => format!("panicked: {}", panic_message(&*panic)),
    };
    task.cancel();
    let _ = env.events.send(RtEvent::Failed {
        generation: env.generation,
        task: task.id,
        error: format!("{}: {error}", task.name),
    });
}

fn drive(task: &mut Task, ctrl: &Receiver<Control>, env: &mut RtEnv) -> Result<(), TaskError> {
    task.start()?;
    if task.is_source() {
        loop {
            loop {
                match ctrl.try_recv() {
                    Ok(c) => task.on_control(c, env)?,
                    Err(crossbeam_channel::TryRecvError::Empty) => break,
                    Err(crossbeam_channel::TryRecvError::Disconnected) => return Err(TaskError::Cancelled),
                }
            }
            if task.is_finished() {
                return Ok(());
            }
            let wait = match task.source_phase() {
                SourcePhase::Reading => match task.step_source(env)? {
                    SourceStatus::More => None,
                    SourceStatus::Idle => Some(Duration::from_millis(SOURCE_IDLE_WAIT_MS)),
                    SourceStatus::Finished => Some(Duration::MAX),
                },
                _ => Some(Duration::MAX),
            };
            if let Some(w) = wait {
                task.flush()?;
                let c = if w == Duration::MAX {
                    ctrl.recv().map_err(|_| TaskError::Cancelled)?
                } else {
                    match ctrl.recv_timeout(w) {
                        Ok(c) => c,
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                        Err(_) => return Err(TaskError::Cancelled),
                    }
                };
                task.on_control(c, env)?;
            }
        }
    }
    let n = task.inputs();
    loop {
        if task.is_finished() {
            return Ok(());
        }
        let pick = |task: &Task, block: bool| -> Option<Option<usize>> {
            let mut sel = Select::new();
            let ci = sel.recv(ctrl);
            let mut map = Vec::with_capacity(n + 1);
            map.push((ci, None));
            for i in 0..n {
                if task.readable(i) {
                    map.push((task.body().register(i, &mut sel), Some(i)));
                }
            }
            let r = if block { Some(sel.ready()) } else { sel.try_ready().ok() }?;
            map.iter().find(|(op, _)| *op == r).map(|(_, i)| *i)
        };
        let picked = match pick(task, false) {
            Some(p) => p,
            None => {
                task.flush()?;
                pick(task, true).expect("blocking select returns an operation")
            }
        };
        match picked {
            None => match ctrl.try_recv() {
                Ok(c) => task.on_control(c, env)?,
                Err(crossbeam_channel::TryRecvError::Empty) => {}
                Err(crossbeam_channel::TryRecvError::Disconnected) => return Err(TaskError::Cancelled),
            },
            Some(i) => {
                task.step_input(i, env)?;
            }
        }
    }
}
