//! The coordinator side of a cluster: a `Backend` of the same run loop the embedded runtime uses.
//! Deploying a generation means sending each worker its placement and waiting for its answer;
//! decisions go to workers as messages; workers' aggregated acknowledgements come back as the same
//! coordinator events. Heartbeats go both ways on the control connection; a worker that is silent for
//! longer than the heartbeat timeout, or whose connection breaks, is lost: the generation fails over
//! and the next one is placed on the live workers (and on any worker that joined meanwhile).
//!
//! A worker keeps no job state of its own: everything it restores comes from checkpoint storage,
//! and when it loses its coordinator it stops its tasks and joins again (a restarted coordinator
//! finds the latest complete checkpoint in storage and resumes from it).

use super::admit::{accept_workers, AdmitCtx};
use super::config::ClusterConfig;
use super::proto::{message, DeployMsg, JobInfo, ToCoordinator, ToWorker, WireControl, WorkerSettings};
use super::shape::GraphShape;
use super::wire::Secret;
use crate::dataflow::JobGraph;
use crate::error::TaskError;
use crate::runtime::run::{run_on, Backend, DeployError, Deployed, RtEvent};
use crate::runtime::task::Control;
use crate::runtime::{AckReport, Command, JobControl, JobHandle, RunConfig, RunError, TaskReport};
use crate::state::RestoreIndex;
use crossbeam_channel::{Receiver, Sender};
use cutline_core::coordinator::{Event, Violation};
use cutline_core::{CheckpointId, Generation, TaskId};
use std::collections::{BTreeMap, HashMap};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Messages queued for one worker before it counts as lost (it is not reading).
pub(crate) const WORKER_QUEUE_MESSAGES: usize = 4096;
/// Messages from the workers' connections (joins, answers, losses) queued for the coordinator loop.
/// A connection's reader blocks while the queue is full, so a worker that floods the coordinator is
/// backpressured through its own connection and costs no memory beyond this.
pub(crate) const INBOX_MESSAGES: usize = 4096;
/// After a generation fails over because a data link broke, how long the coordinator waits to learn
/// whether the link's peer worker was lost, so that the failover names that worker.
pub(crate) const LOST_WORKER_GRACE_MS: u64 = 250;
/// Start `graph` as the coordinator of a cluster on a background thread: workers join at
/// `cluster.listen`, the coordinator places tasks on them, and controls the job like [`crate::spawn`].
/// Fails at once with [`RunError::Config`] if `cluster` is invalid or `cluster.listen` cannot be
/// bound (or [`RunError::Spawn`] without a thread); every later error comes from [`JobHandle::join`].
pub fn spawn_cluster(graph: JobGraph, cfg: RunConfig, cluster: ClusterConfig) -> Result<JobHandle, RunError> {
    let secret = cluster.validate()?;
    let listener = TcpListener::bind(&cluster.listen).map_err(|e| {
        RunError::Config(format!(
            "cannot listen for workers on {}: {e}; choose another --coordinator address",
            cluster.listen
        ))
    })?;
    let (tx, rx) = crossbeam_channel::unbounded::<Command>();
    let thread = std::thread::Builder::new()
        .name(format!("cutline-{}", graph.name()))
        .spawn(move || {
            let mut backend = ClusterBackend::start(listener, secret, cluster, &cfg, &graph)?;
            let r = run_on(&graph, cfg, &rx, &mut backend);
            let reason = match &r {
                Ok(rep) if rep.stopped => "the job was stopped".to_string(),
                Ok(_) => "the job finished".to_string(),
                Err(e) => format!("the job failed: {e}"),
            };
            backend.shutdown(&reason);
            r
        })
        .map_err(RunError::Spawn)?;
    Ok(JobHandle::new(JobControl::new(tx), thread))
}

/// What the coordinator knows of one connected worker.
pub(crate) struct WorkerConn {
    pub(crate) name: String,
    pub(crate) data_addr: String,
    pub(crate) out: Sender<Arc<[u8]>>,
    pub(crate) stream: TcpStream,
    /// Coordinator-clock ms of the last message from it.
    pub(crate) last_heard: Arc<AtomicU64>,
}

pub(crate) enum Inbox {
    Joined(u32, WorkerConn),
    Msg(u32, ToCoordinator),
    Lost(u32, String),
}

/// Where the connection readers put what workers say about the current generation's tasks.
pub(crate) struct GenerationSink {
    pub(crate) events: Sender<RtEvent>,
    /// The worker of every task, by task id: a worker's figures count only for its own tasks.
    pub(crate) worker_of: Arc<Vec<u32>>,
}

/// The current generation's event sink, shared with the connection readers (acks go straight in).
pub(crate) type EventSink = Arc<Mutex<Option<GenerationSink>>>;
/// The latest flow-control figures per task, from workers' heartbeats.
pub(crate) type Reports = Arc<Mutex<HashMap<u32, TaskReport>>>;

struct ClusterBackend {
    cluster: ClusterConfig,
    inbox: Receiver<Inbox>,
    workers: BTreeMap<u32, WorkerConn>,
    events: EventSink,
    reports: Reports,
    /// Workers of the current generation, and which of them run sources.
    members: Vec<u32>,
    /// The worker of every task of the current generation, by task id.
    worker_of: Vec<u32>,
    source_workers: Vec<u32>,
    generation: Option<Generation>,
    deployed_once: bool,
    clock: Instant,
    closing: Arc<AtomicBool>,
    /// The address the listener is bound to (to wake its thread at shutdown).
    listen_addr: Option<SocketAddr>,
    /// A member of the current generation dropped outside `pump_inbox` (its queue was full).
    lost: Option<String>,
    /// A worker refused the job (it builds another graph): the next deployment fails for good.
    refused: Option<String>,
    /// Data links of the current generation that workers reported broken: (reporter, peer, why).
    link_failures: Vec<(u32, u32, String)>,
}

impl ClusterBackend {
    fn start(
        listener: TcpListener,
        secret: Secret,
        cluster: ClusterConfig,
        cfg: &RunConfig,
        graph: &JobGraph,
    ) -> Result<Self, RunError> {
        let (tx, inbox) = crossbeam_channel::bounded(INBOX_MESSAGES);
        let events: EventSink = Default::default();
        let reports: Reports = Default::default();
        let clock = Instant::now();
        let closing = Arc::new(AtomicBool::new(false));
        let settings = WorkerSettings {
            heartbeat_interval_ms: cluster.heartbeat_interval_ms,
            heartbeat_timeout_ms: cluster.heartbeat_timeout_ms,
            channel_capacity: cfg.channel_capacity as u32,
            batch_size: cfg.batch_size as u32,
            max_channel_state_bytes: cfg.max_channel_state_bytes,
            snapshot_writers: cfg.snapshot_writers as u32,
            incremental_checkpoints: cfg.incremental_checkpoints,
            state_backend: cfg.state_backend.clone(),
            max_frame_bytes: cluster.max_frame_bytes,
        };
        let job = JobInfo {
            args: cluster.job_args.clone(),
            fingerprint: cfg.job_fingerprint.clone(),
            shape: GraphShape::of(graph),
            state: cluster.state.clone(),
            settings,
        };
        let listen_addr = listener.local_addr().ok();
        let (ev, rep, closing2) = (events.clone(), reports.clone(), closing.clone());
        let ctx = AdmitCtx {
            secret,
            protection: cluster.frame_protection,
            job,
            inbox: tx,
            events: ev,
            reports: rep,
            clock,
            max_frame_bytes: cluster.max_frame_bytes,
            heartbeat_interval_ms: cluster.heartbeat_interval_ms,
            next_id: Default::default(),
            handshakes: Default::default(),
        };
        std::thread::Builder::new()
            .name("cutline-accept".into())
            .spawn(move || accept_workers(listener, Arc::new(ctx), closing2))
            .map_err(RunError::Spawn)?;
        tracing::info!(
            event = "waiting_for_workers",
            "coordinator waiting for {} worker(s) on {}",
            cluster.workers,
            cluster.listen
        );
        Ok(ClusterBackend {
            cluster,
            inbox,
            workers: BTreeMap::new(),
            events,
            reports,
            members: Vec::new(),
            worker_of: Vec::new(),
            source_workers: Vec::new(),
            generation: None,
            deployed_once: false,
            clock,
            closing,
            listen_addr,
            lost: None,
            refused: None,
            link_failures: Vec::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    fn send(&mut self, w: u32, m: Arc<[u8]>) {
        let full = match self.workers.get(&w) {
            Some(c) => c.out.try_send(m).is_err(),
            None => return,
        };
        if full {
            self.drop_worker(w, "it stopped reading its messages".into());
        }
    }

    /// Forget worker `w` and close its connection. Returns why, if it was a member of the current
    /// generation (which then fails over); that reason is also kept in `lost` until taken.
    fn drop_worker(&mut self, w: u32, why: String) -> Option<String> {
        let c = self.workers.remove(&w)?;
        tracing::warn!(event = "worker_lost", worker = w, reason = %why, "worker {w} ({}) lost: {why}", c.name);
        let _ = c.stream.shutdown(Shutdown::Both);
        if !self.members.contains(&w) {
            return None;
        }
        let reason = format!("worker {w} ({}) lost: {why}", c.name);
        self.lost.get_or_insert(reason.clone());
        Some(reason)
    }

    /// Take in what arrived: joins, losses, answers. Returns the answers (for a waiting caller) and
    /// the reason to fail over, if a member of the current generation was lost.
    fn pump_inbox(&mut self, answers: &mut Vec<(u32, ToCoordinator)>) -> Option<String> {
        let mut lost_member = self.lost.take();
        while let Ok(m) = self.inbox.try_recv() {
            match m {
                Inbox::Joined(w, conn) => {
                    tracing::info!(
                        event = "worker_joined",
                        worker = w,
                        "worker {w} ({}) joined, data plane at {}",
                        conn.name,
                        conn.data_addr
                    );
                    self.workers.insert(w, conn);
                }
                Inbox::Lost(w, why) => {
                    if let Some(reason) = self.drop_worker(w, why) {
                        lost_member.get_or_insert(reason);
                    }
                }
                Inbox::Msg(w, ToCoordinator::Refused { reason }) => {
                    let name = self.workers.get(&w).map(|c| c.name.clone()).unwrap_or_default();
                    tracing::warn!(
                        event = "worker_refused",
                        worker = w,
                        reason = %reason,
                        "worker {w} ({name}) cannot run this job: {reason}"
                    );
                    self.refused.get_or_insert(format!("worker {w} ({name}) cannot run this job: {reason}"));
                    if let Some(r) = self.drop_worker(w, "it cannot run this job".into()) {
                        lost_member.get_or_insert(r);
                    }
                }
                Inbox::Msg(w, ToCoordinator::LinkFailed { generation, peer, reason }) => {
                    if Some(generation) == self.generation {
                        self.link_failures.push((w, peer, reason));
                    }
                }
                Inbox::Msg(w, m) => answers.push((w, m)),
            }
        }
        // Silence: a hung or cut-off worker.
        let now = self.now_ms();
        let silent: Vec<u32> = self
            .workers
            .iter()
            .filter(|(_, c)| {
                now.saturating_sub(c.last_heard.load(Ordering::SeqCst)) > self.cluster.heartbeat_timeout_ms
            })
            .map(|(w, _)| *w)
            .collect();
        for w in silent {
            let why = format!("no heartbeat for more than {} ms", self.cluster.heartbeat_timeout_ms);
            if let Some(reason) = self.drop_worker(w, why) {
                lost_member.get_or_insert(reason);
            }
        }
        // (Heartbeats to workers go from each worker's writer thread: a coordinator loop busy with
        // storage never makes its workers think it is gone.)
        // Every reason of this round was also kept in `lost`: take it, so it is not reported twice.
        let kept = self.lost.take();
        lost_member.or(kept)
    }

    /// Wait for enough workers for the next generation.
    fn gather(&mut self) -> Result<Vec<u32>, DeployError> {
        let started = Instant::now();
        let (all, min) = (self.cluster.workers, self.cluster.min_workers);
        let mut last_log = Instant::now();
        loop {
            let mut answers = Vec::new();
            self.pump_inbox(&mut answers);
            if let Some(refused) = self.refused.take() {
                return Err(DeployError::Refused(format!(
                    "{refused}; every process of a cluster must build the same job graph from the job's arguments: \
                     run the same binary with the same job everywhere"
                )));
            }
            let live = self.workers.len();
            let waited = started.elapsed().as_millis() as u64;
            if live >= all {
                break;
            }
            if self.deployed_once && live >= min && waited >= self.cluster.replacement_wait_ms {
                tracing::warn!(
                    event = "fewer_workers",
                    "running on {live} of {all} workers (no replacement within {waited} ms)"
                );
                break;
            }
            if waited >= self.cluster.join_timeout_ms {
                return Err(DeployError::Retry(format!(
                    "only {live} of {all} workers joined within {} ms; start more workers (cutline worker --join ...)",
                    self.cluster.join_timeout_ms
                )));
            }
            if last_log.elapsed() > Duration::from_secs(5) {
                last_log = Instant::now();
                tracing::info!(event = "waiting_for_workers", "waiting for workers: {live} of {all} joined");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // The lowest ids first, so that a full cluster places tasks the same way every time.
        Ok(self.workers.keys().copied().take(all).collect())
    }
}

impl Backend for ClusterBackend {
    fn deploy(
        &mut self,
        graph: &JobGraph,
        cfg: &RunConfig,
        generation: Generation,
        index: &RestoreIndex,
        _restored: Option<CheckpointId>,
        _started: Instant,
        events: Sender<RtEvent>,
    ) -> Result<Deployed, DeployError> {
        let members = self.gather()?;
        let (names, sources) = graph.task_names_and_sources();
        // Placement: subtask i of every stage on member i mod n, so forward edges stay local.
        let mut worker_of = Vec::with_capacity(names.len());
        for st in graph.stages.iter() {
            for sub in 0..st.parallelism {
                worker_of.push(members[sub as usize % members.len()]);
            }
        }
        let max_id = *self.workers.keys().max().unwrap_or(&0) as usize;
        let mut peers = vec![String::new(); max_id + 1];
        for w in &members {
            peers[*w as usize] = self.workers[w].data_addr.clone();
        }
        self.members = members.clone();
        self.worker_of = worker_of.clone();
        self.source_workers = sources.iter().map(|t| worker_of[t.0 as usize]).collect();
        self.source_workers.sort_unstable();
        self.source_workers.dedup();
        self.generation = Some(generation);
        self.link_failures.clear();
        *self.events.lock().expect("event sink") =
            Some(GenerationSink { events, worker_of: Arc::new(self.worker_of.clone()) });
        let msg = DeployMsg {
            generation,
            now_ms: _started.elapsed().as_millis() as u64,
            checkpoint: index.checkpoint.filter(|_| index.savepoint.is_none()),
            savepoint: index.savepoint.as_ref().map(|p| p.display().to_string()),
            skipped: index.skipped.clone(),
            duplicates_allowed: index.duplicates_allowed,
            worker_of,
            peers,
        };
        let f = message(&ToWorker::Deploy(msg));
        for w in &members {
            self.send(*w, f.clone());
        }
        tracing::info!(event = "deploying", gen = %generation, "{generation}: deploying on workers {members:?}");
        self.deployed_once = true;
        let deadline = Instant::now() + Duration::from_millis(self.cluster.deploy_timeout_ms);
        let mut pending: Vec<u32> = members.clone();
        let mut answers = Vec::new();
        while !pending.is_empty() {
            if let Some(lost) = self.pump_inbox(&mut answers) {
                return Err(DeployError::Retry(lost));
            }
            for (w, a) in answers.drain(..) {
                match a {
                    ToCoordinator::Deployed { generation: g } if g == generation => pending.retain(|p| *p != w),
                    ToCoordinator::DeployFailed { generation: g, reason, permanent } if g == generation => {
                        let reason = format!("worker {w}: {reason}");
                        return Err(if permanent {
                            DeployError::Permanent(TaskError::State { uid: "(deploy)".into(), message: reason })
                        } else {
                            DeployError::Retry(reason)
                        });
                    }
                    _ => {}
                }
            }
            if Instant::now() > deadline {
                return Err(DeployError::Retry(format!(
                    "workers {pending:?} did not deploy within {} ms",
                    self.cluster.deploy_timeout_ms
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = cfg;
        Ok(Deployed { tasks: (0..names.len() as u32).map(TaskId).collect(), sources, names })
    }

    fn send_all(&mut self, c: Control, sources_only: bool) {
        let (Some(generation), Some(control)) = (self.generation, WireControl::from_control(&c)) else { return };
        let f = message(&ToWorker::Control { generation, control, sources_only });
        let to = if sources_only { self.source_workers.clone() } else { self.members.clone() };
        for w in to {
            self.send(w, f.clone());
        }
    }

    fn check_origin(&self, worker: u32, event: &Event<AckReport>) -> Result<(), Violation> {
        let (generation, task) = match event {
            Event::Acked { generation, task, .. }
            | Event::Declined { generation, task, .. }
            | Event::TaskFailed { generation, task, .. }
            | Event::SourceFinished { generation, task }
            | Event::TaskFinished { generation, task } => (*generation, *task),
            other => {
                return Err(Violation {
                    task: TaskId(u32::MAX),
                    what: format!("a coordinator's own event from a worker ({other:?})"),
                })
            }
        };
        // Events of other generations are the coordinator's to ignore.
        if Some(generation) != self.generation {
            return Ok(());
        }
        match self.worker_of.get(task.0 as usize) {
            Some(w) if *w == worker => Ok(()),
            Some(w) => Err(Violation { task, what: format!("an event of a task placed on worker {w}") }),
            None => Err(Violation { task, what: "an event of a task the job does not have".into() }),
        }
    }

    fn refuse(&mut self, worker: Option<u32>, violation: Violation) -> String {
        match worker {
            Some(w) => {
                let who = self.workers.get(&w).map(|c| c.name.clone()).unwrap_or_default();
                let why = format!("it broke the protocol: {violation}");
                self.drop_worker(w, why.clone());
                self.lost.take();
                format!("worker {w} ({who}) was dropped: {why}")
            }
            None => format!("{violation} (a bug in cutline: please report it with the job that triggers it)"),
        }
    }

    fn check(&mut self) -> Option<String> {
        let mut answers = Vec::new();
        self.pump_inbox(&mut answers)
    }

    /// A task failure ends the generation. If it is the echo of a lost worker (a task saw its data
    /// link to that worker break), the failover names the worker: a loss already queued is taken, and
    /// when a worker reported a broken link, its peer gets [`LOST_WORKER_GRACE_MS`] to turn out lost.
    fn failover_reason(&mut self, reason: String) -> String {
        let mut answers = Vec::new();
        let deadline = Instant::now() + Duration::from_millis(LOST_WORKER_GRACE_MS);
        loop {
            if let Some(lost) = self.pump_inbox(&mut answers) {
                return format!("{lost} (first reported as: {reason})");
            }
            let suspect = self.link_failures.iter().any(|(_, peer, _)| self.workers.contains_key(peer));
            if !suspect || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        match self.link_failures.first() {
            Some((w, peer, why)) => format!("{reason} (worker {w} lost its data link with worker {peer}: {why})"),
            None => reason,
        }
    }

    fn task_reports(&self, names: &[String]) -> Vec<TaskReport> {
        let reports = self.reports.lock().expect("reports");
        names
            .iter()
            .enumerate()
            .map(|(t, n)| match reports.get(&(t as u32)) {
                Some(r) => TaskReport { name: n.clone(), ..r.clone() },
                None => TaskReport { name: n.clone(), ..Default::default() },
            })
            .collect()
    }

    fn teardown(&mut self) {
        let Some(generation) = self.generation.take() else { return };
        self.link_failures.clear();
        *self.events.lock().expect("event sink") = None;
        self.reports.lock().expect("reports").clear();
        let f = message(&ToWorker::Cancel { generation });
        let members = std::mem::take(&mut self.members);
        for w in &members {
            self.send(*w, f.clone());
        }
        // Wait until every member stopped its tasks, so that no task of this generation runs (or
        // commits) alongside the next one. A member that does not answer is dropped.
        let deadline = Instant::now() + Duration::from_millis(self.cluster.heartbeat_timeout_ms);
        let mut pending: Vec<u32> = members.into_iter().filter(|w| self.workers.contains_key(w)).collect();
        let mut answers = Vec::new();
        while !pending.is_empty() && Instant::now() < deadline {
            self.pump_inbox(&mut answers);
            for (w, a) in answers.drain(..) {
                if matches!(a, ToCoordinator::Cancelled { generation: g } if g == generation) {
                    pending.retain(|p| *p != w);
                }
            }
            pending.retain(|w| self.workers.contains_key(w));
            std::thread::sleep(Duration::from_millis(1));
        }
        for w in pending {
            self.drop_worker(w, format!("it did not stop the tasks of {generation}"));
        }
    }
}

impl ClusterBackend {
    fn shutdown(&mut self, reason: &str) {
        self.closing.store(true, Ordering::SeqCst);
        let f = message(&ToWorker::Shutdown { reason: reason.to_string() });
        for w in self.workers.keys().copied().collect::<Vec<_>>() {
            self.send(w, f.clone());
        }
        // Let the writers deliver it; workers exit when they read it.
        std::thread::sleep(Duration::from_millis(100));
        if let Some(addr) = self.listen_addr {
            // Wake the acceptor so that it sees `closing` (0.0.0.0 is reached through loopback).
            let addr = if addr.ip().is_unspecified() {
                SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
            } else {
                addr
            };
            let _ = TcpStream::connect_timeout(&addr, Duration::from_millis(100));
        }
    }
}
