//! Tasks as threads of this process ([`LocalBackend`]): one thread per task, a small pool of snapshot
//! writers, and the loop every task thread runs.

use super::chains::Chains;
use super::config::{RunConfig, SNAPSHOT_QUEUE_CAPACITY};
use super::deploy::{deploy, DeployOptions, DeployedTask};
use super::driver::{task_metas, write_snapshot, SnapshotJob, TaskMeta};
use super::error::RunError;
use super::report::{TaskMetrics, TaskReport};
use super::run::{Backend, DeployError, Deployed, RtEvent};
use super::start::job_id;
use super::task::{Control, SnapshotTimings, SourcePhase, Task, TaskEnv};
use crate::channel::{ChannelProbe, ChannelStats, Waker};
use crate::connectors::SourceStatus;
use crate::dataflow::JobGraph;
use crate::error::TaskError;
use crate::fault::Faults;
use crate::state::{RestoreIndex, SnapshotBuilder};
use crossbeam_channel::{Receiver, Sender};
use cutline_core::barrier::Barrier;
use cutline_core::coordinator::Event;
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use cutline_storage::CheckpointStore;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SOURCE_IDLE_WAIT_MS: u64 = 1;
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
    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }
    fn processing_time_ms(&self) -> u64 {
        unix_ms()
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
    torn_down: Arc<AtomicBool>,
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
    (chains, incremental): (Arc<Chains>, bool),
    torn_down: Arc<AtomicBool>,
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
            write_snapshot(&*store, &faults, (&chains, incremental), job, || captured.elapsed().as_micros() as u64)
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

/// Tasks as threads of this process.
#[derive(Default)]
pub(crate) struct LocalBackend {
    threads: GenerationThreads,
    sources: Vec<TaskId>,
    task_metrics: Vec<Arc<TaskMetrics>>,
    probes: Vec<Vec<ChannelProbe>>,
}

/// Per spawned task: its flow-control counters and the probes of the channels it reads.
pub(crate) type SpawnedTask = (Arc<TaskMetrics>, Vec<ChannelProbe>);

/// Spawn the snapshot writers and one thread per task of `deployed`, into `threads`. Tasks get
/// `start` as the origin of their clock.
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn_tasks(
    threads: &mut GenerationThreads,
    graph: &JobGraph,
    (cfg_writers, incremental): (usize, bool),
    store: &Arc<dyn CheckpointStore>,
    faults: &Faults,
    deployed: Vec<DeployedTask>,
    generation: Generation,
    start: Instant,
    events: Sender<RtEvent>,
) -> Result<Vec<SpawnedTask>, RunError> {
    let (wr_tx, wr_rx) = crossbeam_channel::bounded::<(SnapshotJob, Instant)>(SNAPSHOT_QUEUE_CAPACITY);
    let metas: Arc<Vec<TaskMeta>> = Arc::new(task_metas(graph));
    let chains = Arc::new(Chains::default());
    for w in 0..cfg_writers {
        let chains = chains.clone();
        let rx = wr_rx.clone();
        let ev = events.clone();
        let store = store.clone();
        let faults = faults.clone();
        let torn_down = threads.torn_down.clone();
        threads.writers.push(
            std::thread::Builder::new()
                .name(format!("cutline-writer-{w}"))
                .spawn(move || writer_loop(rx, ev, store, faults, (chains, incremental), torn_down))
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
        // What a task thread logs names the task, its generation and (through the parent) the job.
        let span = tracing::info_span!(parent: tracing::Span::current(), "task", task = %name, gen = %generation);
        threads.tasks.push(
            std::thread::Builder::new()
                .name(name)
                .spawn(move || span.in_scope(|| task_thread(task, c_rx, waker, metrics, env)))
                .map_err(RunError::Spawn)?,
        );
    }
    Ok(out)
}

/// The flow-control figures of one running task.
pub(crate) fn task_report(name: &str, m: &TaskMetrics, inputs: &[ChannelProbe]) -> TaskReport {
    let inputs: Vec<ChannelStats> = inputs.iter().map(|p| p.stats()).collect();
    TaskReport {
        name: name.to_string(),
        backpressured_ms: m.backpressured_us.load(Ordering::Relaxed) / 1000,
        idle_ms: m.idle_us.load(Ordering::Relaxed) / 1000,
        records_in: m.records_read.load(Ordering::Relaxed) + inputs.iter().map(|c| c.records).sum::<u64>(),
        inputs,
        ..Default::default()
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
            faults: cfg.faults(),
            incarnation_base: generation.0 << 32,
            job_id: job_id(&cfg.job_fingerprint),
            batch_size: cfg.batch_size,
            state_backend: &cfg.state_backend,
            channel_capacity: cfg.channel_capacity,
            max_channel_state_bytes: cfg.max_channel_state_bytes,
        };
        let deployed = match catch_unwind(AssertUnwindSafe(|| deploy(graph, &opts))).unwrap_or_else(|p| {
            Err(TaskError::State { uid: "(deploy)".into(), message: format!("panicked: {}", panic_message(&*p)) })
        }) {
            Ok(d) => d,
            // State that does not fit the job, an input that changed since the checkpoint: retrying
            // opens the same thing again.
            Err(e) if e.is_permanent() => return Err(DeployError::Permanent(e)),
            Err(e) => return Err(DeployError::Retry(e.to_string())),
        };
        let (names, sources) = graph.task_names_and_sources();
        let tasks = deployed.iter().map(|d| d.task.id).collect();
        self.sources = sources.clone();
        let spawned = spawn_tasks(
            &mut self.threads,
            graph,
            (cfg.snapshot_writers, cfg.incremental_checkpoints),
            &cfg.store,
            &cfg.faults(),
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

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

fn task_thread(mut task: Task, ctrl: Receiver<Control>, waker: Arc<Waker>, metrics: Arc<TaskMetrics>, mut env: RtEnv) {
    let result = catch_unwind(AssertUnwindSafe(|| drive(&mut task, &ctrl, &waker, &metrics, &mut env)));
    let (error, permanent) = match result {
        Ok(Ok(())) | Ok(Err(TaskError::Cancelled)) => return,
        Ok(Err(e)) => (e.to_string(), e.is_permanent()),
        Err(panic) => (format!("panicked: {}", panic_message(&*panic)), false),
    };
    task.cancel();
    let _ = env.events.send(RtEvent::Failed {
        generation: env.generation,
        task: task.id,
        error: format!("{}: {error}", task.name),
        permanent,
    });
}

/// The wall clock in milliseconds since the Unix epoch (0 if the clock is before it).
fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
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
        if credit {
            // Timers: what a watermark left due beyond one step's budget, processing time.
            let pending = task.tick(env)?;
            progressed |= pending.more;
            if let Some(at) = pending.next_timer_ms {
                wait_ms = wait_ms.min(at.saturating_sub(unix_ms()));
            }
        }
        if task.is_source() {
            if task.source_phase() == SourcePhase::Reading && credit {
                let status = task.step_source(env)?;
                metrics.records_read.store(task.records_read(), Ordering::Relaxed);
                match status {
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
