//! The threaded runtime: one thread per task, a small pool of snapshot writers, and the coordinator
//! loop on the calling thread. It carries out the coordinator's decisions (inject barriers, commit
//! manifests, notify, abort, fail over) and the recovery decisions (which checkpoint, when to restart).
//!
//! It owns no protocol logic of its own: the coordinator, aligner and restart policy decide; this module
//! moves messages, bytes and threads.

use crate::channel::Waker;
use crate::driver::{
    carry_out, coordinator_for, next_generation, task_metas, write_snapshot, Carried, CheckpointLog, ControlPlane,
    DriverCtx, FailedCheckpoint, SavepointEvent, SnapshotJob, TaskMeta,
};
use crate::fault::Faults;
use crate::graph::{DeployOptions, DeployedTask, JobGraph};
use crate::message::{Control, TaskError};
use crate::savepoint::SavepointInfo;
use crate::source::SourceStatus;
use crate::state::{RestoreIndex, SnapshotBuilder};
use crate::task::{SnapshotTimings, SourcePhase, Task, TaskEnv};
use crossbeam_channel::{Receiver, Sender};
use cutline_core::barrier::Barrier;
use cutline_core::barrier::CheckpointMode;
use cutline_core::coordinator::{CheckpointConfig, Coordinator, Event, EPOCH_LEASE_BLOCK};
use cutline_core::restart::{choose_restore, Candidate, RestartDecision, RestartStrategy, RestartTracker};
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use cutline_storage::{CheckpointStore, GenerationRecord, JobMeta, Manifest, StorageError, TaskStateHandle};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Limit of the in-flight records one task persists for one unaligned checkpoint; above it the
    /// task declines the checkpoint (default 256 MiB).
    pub max_channel_state_bytes: u64,
    /// Start from this exported savepoint when the store holds no complete checkpoint yet (a later
    /// restart of the same run resumes from the run's own checkpoints).
    pub from_savepoint: Option<PathBuf>,
    /// Where savepoints go when a request names no directory: `<dir>/sp-<checkpoint>`.
    pub savepoint_dir: Option<PathBuf>,
}

/// Default of [`RunConfig::max_channel_state_bytes`].
pub const DEFAULT_MAX_CHANNEL_STATE_BYTES: u64 = 256 << 20;

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
            max_channel_state_bytes: DEFAULT_MAX_CHANNEL_STATE_BYTES,
            from_savepoint: None,
            savepoint_dir: None,
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
    #[error("cannot start from the savepoint: {0}")]
    Savepoint(String),
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
    #[error("{0}")]
    Superseded(String),
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

/// Where a task's time goes (since the job started), for metrics.
#[derive(Debug, Default)]
pub(crate) struct TaskMetrics {
    /// Sleeping because an output channel had no credit.
    pub backpressured_us: AtomicU64,
    /// Sleeping with nothing to read.
    pub idle_us: AtomicU64,
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
    fn decline(&mut self, task: TaskId, checkpoint: CheckpointId, reason: String) {
        let _ =
            self.events.send(RtEvent::Coord(Event::Declined { generation: self.generation, checkpoint, task, reason }));
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

pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into())
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
    let known: std::collections::BTreeSet<String> = graph.state_uids().into_iter().collect();
    for uid in index.elements.keys() {
        if !known.contains(uid) {
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
    if choice.checkpoint.is_none() && choice.skipped.is_empty() {
        if let Some(path) = &cfg.from_savepoint {
            let sp = crate::savepoint::open(path).map_err(RunError::Savepoint)?;
            eprintln!("cutline: starting from savepoint {} (checkpoint {})", path.display(), sp.checkpoint);
            let (mut index, _) = load_checkpoint(&sp.store, graph, &cfg.job_fingerprint, sp.checkpoint)?;
            index.duplicates_allowed = mode == CheckpointMode::AtLeastOnce;
            index.savepoint = Some(path.clone());
            return Ok((index, Some(sp.checkpoint)));
        }
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
pub(crate) fn prepare_start(
    store: &dyn CheckpointStore,
    fingerprint: &str,
    from_savepoint: Option<&std::path::Path>,
) -> Result<Start, RunError> {
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
    let mut first = CheckpointId(seen.max(meta.as_ref().map(|m| m.epoch_lease_end.0).unwrap_or(1)));
    // The generation records decide (job.meta is a plain overwrite a stale coordinator may lower).
    let latest_record = store.latest_generation().map_err(damaged(
        "generation record",
        "it fences older coordinators; restore it from a backup, or start the job on a fresh state directory",
    ))?;
    let mut generation = meta
        .as_ref()
        .map(|m| m.generation)
        .unwrap_or_default()
        .max(latest_record.map(|r| r.generation).unwrap_or_default())
        .next();
    // A run that may start from a savepoint continues its epochs and generations: the restored
    // checkpoint must be older than every new epoch, and sink transactions of the job the savepoint
    // came from must never share a name with new ones.
    // Only while the store has no complete checkpoint: afterwards the run resumes from its own.
    if let Some(path) = from_savepoint.filter(|_| matches!(store.latest_complete(), Ok(None))) {
        let sp = crate::savepoint::open(path).map_err(RunError::Savepoint)?;
        first = first.max(sp.checkpoint.next());
        generation = generation.max(sp.generation.next());
    }
    let lease_end = CheckpointId(first.0 + EPOCH_LEASE_BLOCK);
    store.write_meta(&JobMeta { job_fingerprint: fingerprint.to_string(), generation, epoch_lease_end: lease_end })?;
    // Partial attempts of a previous process are garbage now. Complete checkpoints all stay until this
    // run completes one: the newest may not verify, and then an older one is the way back.
    store.gc(usize::MAX, &[])?;
    Ok(Start::Run(StartInfo { first, generation, lease_end }))
}

/// Record that `generation` starts, having restored `restored` (from `index`): create-if-absent, so
/// that a second coordinator of the job gets `GenerationTaken` or `Superseded`.
pub(crate) fn claim_generation(
    store: &dyn CheckpointStore,
    fingerprint: &str,
    generation: Generation,
    index: &RestoreIndex,
    restored: Option<CheckpointId>,
) -> Result<(), StorageError> {
    store.claim_generation(&GenerationRecord {
        job_fingerprint: fingerprint.to_string(),
        generation,
        // The newest complete checkpoint this start saw, also if it was skipped as damaged: it was
        // committed before this generation began, so it must not be fenced (a repaired checkpoint
        // restores later); only what older generations complete from now on is.
        restored: restored.filter(|_| index.savepoint.is_none()).into_iter().chain(index.skipped.iter().copied()).max(),
        created_unix_ms: unix_ms(),
        owner: format!("{} pid {}", host_name(), std::process::id()),
    })
}

/// Times a start begins again because another coordinator completed a checkpoint between the start's
/// listing and its claim, before it gives up (two coordinators are running).
const MAX_GAP_RETRIES: u32 = 3;

/// The newest checkpoint with a manifest (complete or fenced); `None` if none or unreadable.
fn newest_manifest(store: &dyn CheckpointStore) -> Option<CheckpointId> {
    store.list_checkpoints().ok()?.iter().filter(|l| l.complete || l.fenced).map(|l| l.id).max()
}

/// After a claim: a checkpoint with a manifest above everything the start saw (`before`, what it
/// restored or skipped), which an older coordinator committed in between.
fn committed_meanwhile(
    store: &dyn CheckpointStore,
    before: Option<CheckpointId>,
    index: &RestoreIndex,
    restored: Option<CheckpointId>,
) -> Result<Option<CheckpointId>, StorageError> {
    let seen = before
        .into_iter()
        .chain(restored.filter(|_| index.savepoint.is_none()))
        .chain(index.skipped.iter().copied())
        .max();
    Ok(store.list_checkpoints()?.iter().filter(|l| (l.complete || l.fenced) && Some(l.id) > seen).map(|l| l.id).max())
}

/// A request to a running job (see [`JobHandle`]).
pub(crate) enum Command {
    Stop,
    SetCheckpointConfig(CheckpointConfig, Sender<Result<(), String>>),
    UpdateCheckpointConfig(ConfigEdit, Sender<Result<CheckpointConfig, String>>),
    CheckpointConfig(Sender<CheckpointConfig>),
    Savepoint { stop: bool, target: Option<PathBuf>, reply: Sender<Result<SavepointInfo, String>> },
    Metrics(Sender<JobMetrics>),
}

/// A change to the settings in force, applied on the coordinator's thread (see
/// [`JobControl::update_checkpoint_config`]).
type ConfigEdit = Box<dyn FnOnce(&mut CheckpointConfig) -> Result<(), String> + Send>;

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
    pub inputs: Vec<crate::channel::ChannelStats>,
}

/// A cloneable remote control of a running job: change settings, take savepoints, read metrics, stop.
#[derive(Clone)]
pub struct JobControl {
    commands: Sender<Command>,
}

fn ended<T>(_: T) -> String {
    "the job has ended".to_string()
}

impl JobControl {
    pub(crate) fn new(commands: Sender<Command>) -> JobControl {
        JobControl { commands }
    }

    /// Change the checkpoint settings (interval, timeout, min pause, concurrency, tolerable failures,
    /// mode, unaligned, alignment timeout and byte limit) while the job runs; they apply from the next
    /// checkpoint trigger. Invalid settings are refused with the reason, and the old ones stay.
    pub fn set_checkpoint_config(&self, config: CheckpointConfig) -> Result<(), String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::SetCheckpointConfig(config, tx)).map_err(ended)?;
        rx.recv().map_err(ended)?
    }

    /// Change some checkpoint settings atomically: `edit` gets the settings in force and changes what
    /// it wants, on the job's coordinator thread, so concurrent callers never undo each other's
    /// changes. Returns the settings now in force; an `edit` error or invalid result changes nothing.
    pub fn update_checkpoint_config(
        &self,
        edit: impl FnOnce(&mut CheckpointConfig) -> Result<(), String> + Send + 'static,
    ) -> Result<CheckpointConfig, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::UpdateCheckpointConfig(Box::new(edit), tx)).map_err(ended)?;
        rx.recv().map_err(ended)?
    }

    /// The checkpoint settings in force.
    pub fn checkpoint_config(&self) -> Result<CheckpointConfig, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::CheckpointConfig(tx)).map_err(ended)?;
        rx.recv().map_err(ended)
    }

    /// Take a savepoint now (always aligned and exactly-once) and export it to `target` (a new or
    /// empty directory; default `RunConfig::savepoint_dir/sp-<checkpoint>`). Returns once it is
    /// exported and verified.
    pub fn savepoint(&self, target: Option<PathBuf>) -> Result<SavepointInfo, String> {
        self.savepoint_request(false, target)
    }

    /// Take a savepoint after which the sources stop: the job drains, commits its output up to the
    /// savepoint and stops. If the savepoint fails, the job fails over and keeps running, and the
    /// error says why. Wait for the job with [`JobHandle::join`].
    pub fn stop_with_savepoint(&self, target: Option<PathBuf>) -> Result<SavepointInfo, String> {
        self.savepoint_request(true, target)
    }

    fn savepoint_request(&self, stop: bool, target: Option<PathBuf>) -> Result<SavepointInfo, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::Savepoint { stop, target, reply: tx }).map_err(ended)?;
        rx.recv().map_err(|_| "the job ended before the savepoint completed".to_string())?
    }

    /// Flow-control and checkpoint figures of the running job.
    pub fn metrics(&self) -> Result<JobMetrics, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::Metrics(tx)).map_err(ended)?;
        rx.recv().map_err(ended)
    }

    /// Stop the job: every task is torn down without a further checkpoint. Output committed so far
    /// stays; running the job again on the same store resumes from its latest complete checkpoint.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
    }
}

/// A job running on a background thread: control it (see [`JobControl`], which it dereferences to)
/// and wait for it.
pub struct JobHandle {
    control: JobControl,
    thread: JoinHandle<Result<JobReport, RunError>>,
}

impl std::ops::Deref for JobHandle {
    type Target = JobControl;
    fn deref(&self) -> &JobControl {
        &self.control
    }
}

impl JobHandle {
    pub(crate) fn new(control: JobControl, thread: JoinHandle<Result<JobReport, RunError>>) -> JobHandle {
        JobHandle { control, thread }
    }

    /// A cloneable control for other threads (an admin socket, for example).
    pub fn control(&self) -> JobControl {
        self.control.clone()
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
    JobHandle { control: JobControl { commands: tx }, thread }
}

/// Run `graph` to completion with checkpoints and recovery. Starting again on the same store after the
/// process died resumes from the latest complete checkpoint. Use [`spawn`] to control a running job.
pub fn run(graph: &JobGraph, cfg: RunConfig) -> Result<JobReport, RunError> {
    let (_tx, rx) = crossbeam_channel::unbounded();
    run_with(graph, cfg, &rx)
}

fn run_with(graph: &JobGraph, cfg: RunConfig, commands: &Receiver<Command>) -> Result<JobReport, RunError> {
    run_on(graph, cfg, commands, &mut LocalBackend::default())
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
            let result = crate::savepoint::export(store, checkpoint, &target, &cfg.job_fingerprint).map_err(|e| {
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

/// The threads of one generation. Dropping it tears the generation down: every task is told to stop
/// (a task blocked sending wakes when its downstream task exits), then tasks and writers are joined;
/// writers stop once every task (and so every sender of snapshots) is gone.
#[derive(Default)]
pub(crate) struct GenerationThreads {
    /// Per task: its id, whether it is a source, its control channel.
    controls: Vec<(TaskId, bool, Sender<Control>)>,
    wakers: Vec<Arc<Waker>>,
    tasks: Vec<JoinHandle<()>>,
    writers: Vec<JoinHandle<()>>,
    /// Set when the generation is torn down: writers skip what is still queued.
    torn_down: Arc<std::sync::atomic::AtomicBool>,
}

impl GenerationThreads {
    /// Deliver `c` to every task, or every source task. A closed channel is a task that already
    /// stopped; the coordinator learns that separately.
    pub(crate) fn send_all(&self, c: Control, sources_only: bool) {
        for ((_, source, tx), w) in self.controls.iter().zip(&self.wakers) {
            if *source || !sources_only {
                let _ = tx.send(c.clone());
                w.ring();
            }
        }
    }
}

impl Drop for GenerationThreads {
    fn drop(&mut self) {
        self.torn_down.store(true, Ordering::SeqCst);
        for ((_, _, c), w) in self.controls.iter().zip(&self.wakers) {
            let _ = c.send(Control::Cancel);
            w.ring();
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
    torn_down: Arc<std::sync::atomic::AtomicBool>,
) {
    for (job, captured) in rx {
        if torn_down.load(Ordering::SeqCst) {
            // The generation is being torn down: its snapshots no longer matter, and writing them
            // (to a slow object store) would only hold up the teardown.
            continue;
        }
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

/// Tasks as threads of this process.
#[derive(Default)]
pub(crate) struct LocalBackend {
    threads: GenerationThreads,
    sources: Vec<TaskId>,
    task_metrics: Vec<Arc<TaskMetrics>>,
    probes: Vec<Vec<crate::channel::ChannelProbe>>,
}

/// Per spawned task: its flow-control counters and the probes of the channels it reads.
pub(crate) type SpawnedTask = (Arc<TaskMetrics>, Vec<crate::channel::ChannelProbe>);

/// Spawn the snapshot writers and one thread per task of `deployed`, into `threads`. Tasks get
/// `start` as the origin of their clock.
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn_tasks(
    threads: &mut GenerationThreads,
    graph: &JobGraph,
    cfg_writers: usize,
    store: &Arc<dyn CheckpointStore>,
    faults: &Faults,
    deployed: Vec<DeployedTask>,
    generation: Generation,
    start: Instant,
    events: Sender<RtEvent>,
) -> Result<Vec<SpawnedTask>, RunError> {
    let (wr_tx, wr_rx) = crossbeam_channel::bounded::<(SnapshotJob, Instant)>(SNAPSHOT_QUEUE_CAPACITY);
    let metas: Arc<Vec<TaskMeta>> = Arc::new(task_metas(graph));
    for w in 0..cfg_writers {
        let rx = wr_rx.clone();
        let ev = events.clone();
        let store = store.clone();
        let faults = faults.clone();
        let torn_down = threads.torn_down.clone();
        threads.writers.push(
            std::thread::Builder::new()
                .name(format!("cutline-writer-{w}"))
                .spawn(move || writer_loop(rx, ev, store, faults, torn_down))
                .map_err(RunError::Spawn)?,
        );
    }
    let mut out = Vec::new();
    for d in deployed {
        let (c_tx, c_rx) = crossbeam_channel::unbounded::<Control>();
        threads.controls.push((d.task.id, d.task.is_source(), c_tx));
        threads.wakers.push(d.waker.clone());
        let env = RtEnv { start, generation, writer: wr_tx.clone(), events: events.clone(), metas: metas.clone() };
        let name = d.task.name.clone();
        let task = d.task;
        let metrics = Arc::new(TaskMetrics::default());
        out.push((metrics.clone(), d.inputs));
        let waker = d.waker;
        threads.tasks.push(
            std::thread::Builder::new()
                .name(name)
                .spawn(move || task_thread(task, c_rx, waker, metrics, env))
                .map_err(RunError::Spawn)?,
        );
    }
    Ok(out)
}

/// The flow-control figures of one running task.
pub(crate) fn task_report(name: &str, m: &TaskMetrics, inputs: &[crate::channel::ChannelProbe]) -> TaskReport {
    TaskReport {
        name: name.to_string(),
        backpressured_ms: m.backpressured_us.load(Ordering::Relaxed) / 1000,
        idle_ms: m.idle_us.load(Ordering::Relaxed) / 1000,
        inputs: inputs.iter().map(|p| p.stats()).collect(),
    }
}

impl Backend for LocalBackend {
    fn deploy(
        &mut self,
        graph: &JobGraph,
        cfg: &RunConfig,
        generation: Generation,
        index: &RestoreIndex,
        _restored: Option<CheckpointId>,
        started: Instant,
        events: Sender<RtEvent>,
    ) -> Result<Deployed, DeployError> {
        let opts = DeployOptions {
            restore: index,
            faults: cfg.faults.clone(),
            incarnation_base: generation.0 << 32,
            job_id: job_id(&cfg.job_fingerprint),
            batch_size: cfg.batch_size,
            channel_capacity: cfg.channel_capacity,
            max_channel_state_bytes: cfg.max_channel_state_bytes,
        };
        let deployed = match catch_unwind(AssertUnwindSafe(|| graph.deploy(&opts))).unwrap_or_else(|p| {
            Err(TaskError::State { uid: "(deploy)".into(), message: format!("panicked: {}", panic_message(&*p)) })
        }) {
            Ok(d) => d,
            Err(e @ TaskError::State { .. }) => return Err(DeployError::Permanent(e)),
            Err(e) => return Err(DeployError::Retry(e.to_string())),
        };
        let (names, sources) = graph.task_names_and_sources();
        let tasks = deployed.iter().map(|d| d.task.id).collect();
        self.sources = sources.clone();
        let spawned = spawn_tasks(
            &mut self.threads,
            graph,
            cfg.snapshot_writers,
            &cfg.store,
            &cfg.faults,
            deployed,
            generation,
            started,
            events,
        )
        .map_err(|e| DeployError::Retry(e.to_string()))?;
        (self.task_metrics, self.probes) = spawned.into_iter().unzip();
        Ok(Deployed { tasks, sources, names })
    }

    fn send_all(&mut self, c: Control, sources_only: bool) {
        self.threads.send_all(c, sources_only)
    }

    fn task_reports(&self, names: &[String]) -> Vec<TaskReport> {
        names.iter().zip(&self.task_metrics).zip(&self.probes).map(|((name, m), p)| task_report(name, m, p)).collect()
    }

    fn teardown(&mut self) {
        self.threads = GenerationThreads::default();
        self.task_metrics.clear();
        self.probes.clear();
    }
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

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

fn task_thread(mut task: Task, ctrl: Receiver<Control>, waker: Arc<Waker>, metrics: Arc<TaskMetrics>, mut env: RtEnv) {
    let result = catch_unwind(AssertUnwindSafe(|| drive(&mut task, &ctrl, &waker, &metrics, &mut env)));
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

/// Longest sleep of a task with nothing to do (every event that gives it work rings its waker; this
/// only bounds the cost of a lost ring).
const TASK_IDLE_WAIT_MS: u64 = 50;

/// The loop of one task thread: control messages first, then one batch of work if the outputs have
/// credit (or only barriers if they do not), else sleep on the waker until something changes.
fn drive(
    task: &mut Task,
    ctrl: &Receiver<Control>,
    waker: &Waker,
    metrics: &TaskMetrics,
    env: &mut RtEnv,
) -> Result<(), TaskError> {
    task.start()?;
    let n = task.inputs();
    let mut next_input = 0usize;
    loop {
        let seen = waker.rings();
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
        let credit = task.has_credit();
        let mut progressed = false;
        let mut wait_ms = TASK_IDLE_WAIT_MS;
        if task.is_source() {
            if task.source_phase() == SourcePhase::Reading && credit {
                match task.step_source(env)? {
                    SourceStatus::More => progressed = true,
                    SourceStatus::Idle => wait_ms = SOURCE_IDLE_WAIT_MS,
                    SourceStatus::Finished => {}
                }
            }
        } else {
            if task.aligning_with_limit() {
                task.check_alignment(env)?;
                wait_ms = 1;
            }
            // One message from the next input that has one, round robin so no input starves.
            for k in 0..n {
                let i = (next_input + k) % n;
                if task.readable(i) && task.has_message(i) && task.step_input(i, env)? {
                    progressed = true;
                    next_input = (i + 1) % n;
                    break;
                }
            }
        }
        if progressed {
            continue;
        }
        task.flush()?;
        let t = Instant::now();
        waker.sleep(seen, Duration::from_millis(wait_ms));
        let slept = t.elapsed().as_micros() as u64;
        if !credit && !task.is_finished() {
            metrics.backpressured_us.fetch_add(slept, Ordering::Relaxed);
        } else {
            metrics.idle_us.fetch_add(slept, Ordering::Relaxed);
        }
    }
}
