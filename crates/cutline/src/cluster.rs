//! A job across processes: a coordinator process that runs the checkpoint coordinator and no tasks,
//! and worker processes that run the tasks it places on them.
//!
//! The coordinator side is a [`Backend`] of the same coordinator loop the embedded runtime uses:
//! deploying a generation means sending each worker its placement and waiting for its answer;
//! decisions go to workers as messages; workers' aggregated acknowledgements come back as the same
//! coordinator events. Heartbeats go both ways on the control connection; a worker that is silent for
//! longer than the heartbeat timeout, or whose connection breaks, is lost: the generation fails over
//! and the next one is placed on the live workers (and on any worker that joined meanwhile).
//!
//! A worker keeps no job state of its own: everything it restores comes from checkpoint storage,
//! and when it loses its coordinator it stops its tasks and joins again (a restarted coordinator
//! finds the latest complete checkpoint in storage and resumes from it).
//!
//! It does not decide anything about checkpoints; it does not restart processes (the launcher or an
//! operator's supervisor does).

use crate::channel::Waker;
use crate::graph::{DeployOptions, JobGraph, Placement};
use crate::message::{Control, TaskError};
use crate::net::acks::{AckAggregator, TaskEvent, DEFAULT_MAX_ACK_HOLD_MS};
use crate::net::data::{start_receiver, start_sender, Link};
use crate::net::proto::{
    self, DataHello, DeployMsg, JobInfo, JoinHello, ToCoordinator, ToWorker, WelcomeHello, WireControl, WorkerSettings,
    KIND_MESSAGE,
};
use crate::net::wire::{self, Secret, WireError};
use crate::runtime::{
    host_name, job_id, load_checkpoint, run_on, spawn_tasks, Backend, Command, DeployError, Deployed,
    GenerationThreads, JobControl, JobHandle, RtEvent, RunConfig, RunError, TaskReport,
};
use crate::state::RestoreIndex;
use crossbeam_channel::{Receiver, Sender};
use cutline_core::coordinator::Event;
use cutline_core::{CheckpointId, Generation, TaskId};
use cutline_storage::CheckpointStore;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Default interval of heartbeats, both ways.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 200;
/// Default silence after which a peer is lost.
pub const DEFAULT_HEARTBEAT_TIMEOUT_MS: u64 = 3_000;
/// How long the first generation waits for all workers to join.
pub const DEFAULT_JOIN_TIMEOUT_MS: u64 = 120_000;
/// How long a restart waits for lost workers to be replaced before it runs on fewer.
pub const DEFAULT_REPLACEMENT_WAIT_MS: u64 = 5_000;
/// How long the workers may take to deploy a generation (restore state, open links).
pub const DEFAULT_DEPLOY_TIMEOUT_MS: u64 = 60_000;
/// Messages queued for one worker before it counts as lost (it is not reading).
const WORKER_QUEUE_MESSAGES: usize = 4096;
/// How long a worker tries to reach its coordinator before it gives up.
pub const DEFAULT_REJOIN_TIMEOUT_MS: u64 = 60_000;
/// Pause between a worker's connection attempts.
const REJOIN_BACKOFF_MS: u64 = 100;

/// How a coordinator runs a job on worker processes.
#[derive(Clone)]
pub struct ClusterConfig {
    /// Where workers connect ("0.0.0.0:7070").
    pub listen: String,
    /// Workers a generation is placed on when all are there.
    pub workers: usize,
    /// Fewest workers a restart runs on after waiting `replacement_wait_ms` for the others.
    pub min_workers: usize,
    /// The cluster's shared secret (at least 16 bytes); peers prove they hold it, it is never sent.
    pub secret: Vec<u8>,
    /// The arguments workers build the job from (the job part of the command line).
    pub job_args: Vec<String>,
    /// The checkpoint storage every worker opens (a path every host sees, or `s3://bucket/prefix`).
    pub state: String,
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    pub join_timeout_ms: u64,
    pub replacement_wait_ms: u64,
    pub deploy_timeout_ms: u64,
    pub max_frame_bytes: u32,
}

impl ClusterConfig {
    pub fn new(
        listen: impl Into<String>,
        workers: usize,
        secret: Vec<u8>,
        job_args: Vec<String>,
        state: String,
    ) -> Self {
        ClusterConfig {
            listen: listen.into(),
            workers,
            min_workers: 1,
            secret,
            job_args,
            state,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            heartbeat_timeout_ms: DEFAULT_HEARTBEAT_TIMEOUT_MS,
            join_timeout_ms: DEFAULT_JOIN_TIMEOUT_MS,
            replacement_wait_ms: DEFAULT_REPLACEMENT_WAIT_MS,
            deploy_timeout_ms: DEFAULT_DEPLOY_TIMEOUT_MS,
            max_frame_bytes: wire::DEFAULT_MAX_FRAME_BYTES,
        }
    }

    fn validate(&self) -> Result<Secret, RunError> {
        let bad = |m: String| Err(RunError::Config(m));
        if self.workers == 0 || self.min_workers == 0 || self.min_workers > self.workers {
            return bad(format!(
                "a cluster needs at least 1 worker and 1 <= min workers <= workers (got {} and {})",
                self.workers, self.min_workers
            ));
        }
        if self.heartbeat_interval_ms == 0 || self.heartbeat_timeout_ms <= self.heartbeat_interval_ms {
            return bad("the heartbeat timeout must be longer than the (positive) heartbeat interval".into());
        }
        Secret::new(self.secret.clone()).map_err(RunError::Config)
    }
}

fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// Start `graph` as the coordinator of a cluster on a background thread: workers join at
/// `cluster.listen`, the coordinator places tasks on them, and controls the job like [`crate::spawn`].
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
            let mut backend = ClusterBackend::start(listener, secret, cluster, &cfg)?;
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
struct WorkerConn {
    name: String,
    data_addr: String,
    out: Sender<Vec<u8>>,
    stream: TcpStream,
    /// Coordinator-clock ms of the last message from it.
    last_heard: Arc<AtomicU64>,
}

enum Inbox {
    Joined(u32, WorkerConn),
    Msg(u32, ToCoordinator),
    Lost(u32, String),
}

/// The current generation's event sink, shared with the connection readers (acks go straight in).
type EventSink = Arc<Mutex<Option<(Generation, Sender<RtEvent>)>>>;
/// The latest flow-control figures per task, from workers' heartbeats.
type Reports = Arc<Mutex<HashMap<u32, TaskReport>>>;

struct ClusterBackend {
    cluster: ClusterConfig,
    inbox: Receiver<Inbox>,
    workers: BTreeMap<u32, WorkerConn>,
    events: EventSink,
    reports: Reports,
    /// Workers of the current generation, and which of them run sources.
    members: Vec<u32>,
    source_workers: Vec<u32>,
    generation: Option<Generation>,
    deployed_once: bool,
    clock: Instant,
    verbose: bool,
    closing: Arc<AtomicBool>,
    /// The address the listener is bound to (to wake its thread at shutdown).
    listen_addr: Option<SocketAddr>,
    /// A member of the current generation dropped outside `pump_inbox` (its queue was full).
    lost: Option<String>,
}

impl ClusterBackend {
    fn start(listener: TcpListener, secret: Secret, cluster: ClusterConfig, cfg: &RunConfig) -> Result<Self, RunError> {
        let (tx, inbox) = crossbeam_channel::unbounded();
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
            max_frame_bytes: cluster.max_frame_bytes,
            verbose: cfg.verbose,
        };
        let job = JobInfo {
            args: cluster.job_args.clone(),
            fingerprint: cfg.job_fingerprint.clone(),
            state: cluster.state.clone(),
            settings,
        };
        let listen_addr = listener.local_addr().ok();
        let (ev, rep, closing2) = (events.clone(), reports.clone(), closing.clone());
        let ctx = AdmitCtx {
            secret,
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
        if cfg.verbose {
            eprintln!("cutline: coordinator waiting for {} worker(s) on {}", cluster.workers, cluster.listen);
        }
        Ok(ClusterBackend {
            cluster,
            inbox,
            workers: BTreeMap::new(),
            events,
            reports,
            members: Vec::new(),
            source_workers: Vec::new(),
            generation: None,
            deployed_once: false,
            clock,
            verbose: cfg.verbose,
            closing,
            listen_addr,
            lost: None,
        })
    }

    fn log(&self, msg: impl FnOnce() -> String) {
        if self.verbose {
            eprintln!("cutline: {}", msg());
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    fn send(&mut self, w: u32, frame: Vec<u8>) {
        let full = match self.workers.get(&w) {
            Some(c) => c.out.try_send(frame).is_err(),
            None => return,
        };
        if full {
            self.drop_worker(w, "it stopped reading its messages".into());
        }
    }

    fn drop_worker(&mut self, w: u32, why: String) {
        if let Some(c) = self.workers.remove(&w) {
            eprintln!("cutline: worker {w} ({}) lost: {why}", c.name);
            let _ = c.stream.shutdown(Shutdown::Both);
            if self.members.contains(&w) {
                self.lost.get_or_insert(format!("worker {w} lost: {why}"));
            }
        }
    }

    /// Take in what arrived: joins, losses, answers. Returns the answers (for a waiting caller) and
    /// the reason to fail over, if a member of the current generation was lost.
    fn pump_inbox(&mut self, answers: &mut Vec<(u32, ToCoordinator)>) -> Option<String> {
        let mut lost_member = self.lost.take();
        while let Ok(m) = self.inbox.try_recv() {
            match m {
                Inbox::Joined(w, conn) => {
                    self.log(|| format!("worker {w} ({}) joined, data plane at {}", conn.name, conn.data_addr));
                    self.workers.insert(w, conn);
                }
                Inbox::Lost(w, why) => {
                    if self.workers.contains_key(&w) {
                        self.drop_worker(w, why.clone());
                        if self.members.contains(&w) {
                            lost_member.get_or_insert(format!("worker {w} lost: {why}"));
                        }
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
            self.drop_worker(w, why.clone());
            if self.members.contains(&w) {
                lost_member.get_or_insert(format!("worker {w} lost: {why}"));
            }
        }
        // (Heartbeats to workers go from each worker's writer thread: a coordinator loop busy with
        // storage never makes its workers think it is gone.)
        lost_member.or_else(|| self.lost.take())
    }

    /// Wait for enough workers for the next generation.
    fn gather(&mut self) -> Result<Vec<u32>, DeployError> {
        let started = Instant::now();
        let (all, min) = (self.cluster.workers, self.cluster.min_workers);
        let mut last_log = Instant::now();
        loop {
            let mut answers = Vec::new();
            self.pump_inbox(&mut answers);
            let live = self.workers.len();
            let waited = started.elapsed().as_millis() as u64;
            if live >= all {
                break;
            }
            if self.deployed_once && live >= min && waited >= self.cluster.replacement_wait_ms {
                self.log(|| format!("running on {live} of {all} workers (no replacement within {waited} ms)"));
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
                eprintln!("cutline: waiting for workers: {live} of {all} joined");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // The lowest ids first, so that a full cluster places tasks the same way every time.
        Ok(self.workers.keys().copied().take(all).collect())
    }
}

fn frame<M: serde::Serialize>(m: &M) -> Vec<u8> {
    let payload = proto::encode(m);
    let mut f = Vec::with_capacity(payload.len() + wire::HEADER_BYTES);
    wire::write_frame(&mut f, KIND_MESSAGE, &payload).expect("writing to memory");
    f
}

/// What the acceptor and every admission share.
struct AdmitCtx {
    secret: Secret,
    job: JobInfo,
    inbox: Sender<Inbox>,
    events: EventSink,
    reports: Reports,
    clock: Instant,
    max_frame_bytes: u32,
    heartbeat_interval_ms: u64,
    /// Ids go to authenticated workers only.
    next_id: std::sync::atomic::AtomicU32,
    /// Handshakes in progress.
    handshakes: std::sync::atomic::AtomicUsize,
}

/// Handshakes in progress at once; more connections are closed at once (a flood of unauthenticated
/// peers costs a bounded number of threads).
const MAX_PENDING_HANDSHAKES: usize = 64;
/// Frame limit before a peer is authenticated: hellos are small.
const HANDSHAKE_MAX_FRAME_BYTES: u32 = 64 << 10;

/// Accept workers: authenticate, hand them the job, and start a reader and a writer per connection.
fn accept_workers(listener: TcpListener, ctx: Arc<AdmitCtx>, closing: Arc<AtomicBool>) {
    for stream in listener.incoming() {
        if closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        if ctx.handshakes.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES {
            ctx.handshakes.fetch_sub(1, Ordering::SeqCst);
            eprintln!(
                "cutline: refused a connection from {}: {MAX_PENDING_HANDSHAKES} handshakes already in progress",
                stream.peer_addr().map(|a| a.to_string()).unwrap_or_default()
            );
            continue;
        }
        let ctx = ctx.clone();
        // Each handshake on its own thread: a slow or hostile peer holds up no one else.
        let spawned = std::thread::Builder::new().name("cutline-admit".into()).spawn(move || {
            admit(stream, &ctx);
        });
        if spawned.is_err() {
            // The closure (and its count) is gone with the failed spawn; the count stays one high,
            // which only lowers the limit.
            continue;
        }
    }
}

/// Authenticate one connection; if it is a worker of our version, hand it the job and start its
/// reader and writer.
fn admit(mut stream: TcpStream, ctx: &AdmitCtx) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let welcome = proto::encode(&WelcomeHello { version: version() });
    let hello = wire::handshake_server(&mut stream, &ctx.secret, &welcome, HANDSHAKE_MAX_FRAME_BYTES)
        .and_then(|h| proto::decode::<JoinHello>(&h));
    ctx.handshakes.fetch_sub(1, Ordering::SeqCst);
    let hello = match hello {
        Ok(h) => h,
        Err(e) => {
            eprintln!("cutline: refused a connection from {peer}: {e}");
            return;
        }
    };
    if hello.version != version() {
        eprintln!(
            "cutline: refused worker {} at {peer}: it runs cutline {}, this coordinator {}; run the same version everywhere",
            hello.name,
            hello.version,
            version()
        );
        return;
    }
    let id = ctx.next_id.fetch_add(1, Ordering::SeqCst);
    let (clock, max_frame_bytes) = (ctx.clock, ctx.max_frame_bytes);
    let job = frame(&ToWorker::Job { worker: id, job: ctx.job.clone() });
    let last_heard = Arc::new(AtomicU64::new(clock.elapsed().as_millis() as u64));
    let (out_tx, out_rx) = crossbeam_channel::bounded::<Vec<u8>>(WORKER_QUEUE_MESSAGES);
    let _ = out_tx.try_send(job);
    let (Ok(r), Ok(w)) = (stream.try_clone(), stream.try_clone()) else { return };
    let Ok(conn_stream) = stream.try_clone() else { return };
    // Known to the coordinator before its reader can report it lost.
    let conn = WorkerConn {
        name: hello.name,
        data_addr: hello.data_addr,
        out: out_tx,
        stream: conn_stream,
        last_heard: last_heard.clone(),
    };
    if ctx.inbox.send(Inbox::Joined(id, conn)).is_err() {
        return;
    }
    let (inbox, events, reports) = (&ctx.inbox, &ctx.events, &ctx.reports);
    // Writer: the coordinator's messages, and a heartbeat whenever nothing was sent for an interval.
    let inbox_w = inbox.clone();
    let beat = Duration::from_millis(ctx.heartbeat_interval_ms);
    let spawned_writer = std::thread::Builder::new().name(format!("cutline-to-worker-{id}")).spawn(move || {
        let mut w = BufWriter::new(w);
        let _ = w.get_ref().set_write_timeout(Some(Duration::from_secs(10)));
        let heartbeat = frame(&ToWorker::Heartbeat);
        loop {
            let f = match out_rx.recv_timeout(beat) {
                Ok(f) => f,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => heartbeat.clone(),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            };
            let r = w.write_all(&f).and_then(|()| if out_rx.is_empty() { w.flush() } else { Ok(()) });
            if let Err(e) = r {
                let _ = inbox_w.send(Inbox::Lost(id, format!("sending to it failed: {e}")));
                return;
            }
        }
    });
    // Reader.
    let (inbox_r, events_r, heard, reports_r) = (inbox.clone(), events.clone(), last_heard.clone(), reports.clone());
    let spawned_reader = std::thread::Builder::new().name(format!("cutline-from-worker-{id}")).spawn(move || {
        let mut r = BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            let m = match proto::read_message::<ToCoordinator>(&mut r, max_frame_bytes, &mut buf) {
                Ok(m) => m,
                Err(e) => {
                    let why = if e.is_closed() { "its connection closed".to_string() } else { e.to_string() };
                    let _ = inbox_r.send(Inbox::Lost(id, why));
                    return;
                }
            };
            heard.store(clock.elapsed().as_millis() as u64, Ordering::SeqCst);
            match m {
                ToCoordinator::Heartbeat { tasks } => reports_r.lock().expect("reports").extend(tasks),
                ToCoordinator::Events(evs) => {
                    let sink = events_r.lock().expect("event sink");
                    // Events of older generations are the coordinator's to ignore (it checks every
                    // event's generation).
                    if let Some((_, tx)) = sink.as_ref() {
                        let mut out = Vec::new();
                        for e in evs {
                            e.into_events(&mut out);
                        }
                        let _ = tx.send(RtEvent::Batch(out));
                    }
                }
                other => {
                    if inbox_r.send(Inbox::Msg(id, other)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    if spawned_writer.is_err() || spawned_reader.is_err() {
        let _ = stream.shutdown(Shutdown::Both);
        let _ = inbox.send(Inbox::Lost(id, "cannot start its threads".into()));
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
        self.source_workers = sources.iter().map(|t| worker_of[t.0 as usize]).collect();
        self.source_workers.sort_unstable();
        self.source_workers.dedup();
        self.generation = Some(generation);
        *self.events.lock().expect("event sink") = Some((generation, events));
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
        let f = frame(&ToWorker::Deploy(msg));
        for w in &members {
            self.send(*w, f.clone());
        }
        self.log(|| format!("{generation}: deploying on workers {members:?}"));
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
        let f = frame(&ToWorker::Control { generation, control, sources_only });
        let to = if sources_only { self.source_workers.clone() } else { self.members.clone() };
        for w in to {
            self.send(w, f.clone());
        }
    }

    fn check(&mut self) -> Option<String> {
        let mut answers = Vec::new();
        self.pump_inbox(&mut answers)
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
        *self.events.lock().expect("event sink") = None;
        self.reports.lock().expect("reports").clear();
        let f = frame(&ToWorker::Cancel { generation });
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
        let f = frame(&ToWorker::Shutdown { reason: reason.to_string() });
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

// ---------------------------------------------------------------------------------------------------
// Worker

/// How a worker process joins a cluster.
#[derive(Clone)]
pub struct WorkerConfig {
    /// The coordinator's address.
    pub join: String,
    pub secret: Vec<u8>,
    /// Where this worker listens for other workers' data links ("0.0.0.0:0": any port).
    pub listen: String,
    /// The address other workers use to reach this one (default: the listening address; give the
    /// host's address when listening on 0.0.0.0).
    pub advertise: Option<String>,
    /// How long the worker keeps trying to reach a coordinator that is gone before it exits.
    pub rejoin_timeout_ms: u64,
}

impl WorkerConfig {
    pub fn new(join: impl Into<String>, secret: Vec<u8>) -> WorkerConfig {
        WorkerConfig {
            join: join.into(),
            secret,
            listen: "127.0.0.1:0".into(),
            advertise: None,
            rejoin_timeout_ms: DEFAULT_REJOIN_TIMEOUT_MS,
        }
    }
}

/// Builds the job a coordinator names: from its arguments, the graph and the job's fingerprint.
pub type JobBuilder = dyn Fn(&[String]) -> Result<(JobGraph, String), String>;
/// Opens the checkpoint storage a coordinator names.
pub type StoreOpener = dyn Fn(&str) -> Result<Arc<dyn CheckpointStore>, String>;

/// Data links arriving from other workers, until the deployment they belong to takes them.
type Inbound = Arc<(Mutex<HashMap<(Generation, u32, u32), TcpStream>>, Condvar)>;

/// Run a worker until its coordinator says the job is over (Ok), or no coordinator can be reached
/// for `rejoin_timeout_ms` (Err).
pub fn run_worker(cfg: WorkerConfig, build: &JobBuilder, open_store: &StoreOpener) -> Result<(), String> {
    let secret = Secret::new(cfg.secret.clone())?;
    // A malformed address never gets better: refuse it now, not after the rejoin timeout.
    match cfg.join.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {}
        _ => return Err(format!("the coordinator address {:?} is not HOST:PORT (e.g. 10.0.0.1:7070)", cfg.join)),
    }
    let listener = TcpListener::bind(&cfg.listen)
        .map_err(|e| format!("cannot listen for data links on {}: {e}; choose another --listen address", cfg.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let data_addr = match &cfg.advertise {
        Some(a) if a.contains(':') => a.clone(),
        Some(host) => format!("{host}:{}", local.port()),
        None => local.to_string(),
    };
    let inbound: Inbound = Default::default();
    {
        let (inbound, secret) = (inbound.clone(), secret.clone());
        std::thread::Builder::new()
            .name("cutline-data-accept".into())
            .spawn(move || accept_links(listener, secret, inbound))
            .map_err(|e| e.to_string())?;
    }
    let name = format!("{}/{}", host_name(), std::process::id());
    let mut gone_since: Option<Instant> = None;
    let mut job_cache: Option<(Vec<String>, JobGraph, String)> = None;
    loop {
        let stream = match connect(&cfg.join) {
            Ok(s) => s,
            Err(e) => {
                let since = *gone_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(cfg.rejoin_timeout_ms) {
                    return Err(format!(
                        "no coordinator at {} for {} ms (last error: {e}); giving up",
                        cfg.join, cfg.rejoin_timeout_ms
                    ));
                }
                std::thread::sleep(Duration::from_millis(REJOIN_BACKOFF_MS));
                continue;
            }
        };
        match session(stream, &secret, &name, &data_addr, &inbound, build, open_store, &mut job_cache) {
            Ok(SessionEnd::Shutdown(reason)) => {
                eprintln!("cutline: worker exits: {reason}");
                return Ok(());
            }
            Ok(SessionEnd::Lost(why)) => {
                eprintln!("cutline: worker lost its coordinator ({why}); its tasks stopped, joining again");
                gone_since = Some(Instant::now());
            }
            Err(e) => {
                eprintln!("cutline: worker: {e}");
                let since = *gone_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(cfg.rejoin_timeout_ms) {
                    return Err(e);
                }
                std::thread::sleep(Duration::from_millis(REJOIN_BACKOFF_MS * 5));
            }
        }
    }
}

/// How long one attempt to reach the coordinator may take (a cut-off network drops packets silently).
const CONNECT_TIMEOUT_MS: u64 = 2_000;

fn connect(addr: &str) -> std::io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr} resolves to no address"));
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, Duration::from_millis(CONNECT_TIMEOUT_MS)) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn accept_links(listener: TcpListener, secret: Secret, inbound: Inbound) {
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        if pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES {
            pending.fetch_sub(1, Ordering::SeqCst);
            eprintln!("cutline: refused a data connection from {peer}: too many handshakes in progress");
            continue;
        }
        let (inbound, secret, pending) = (inbound.clone(), secret.clone(), pending.clone());
        // Handshakes run on their own thread: a slow or hostile peer cannot hold up the others.
        let _ = std::thread::Builder::new().name("cutline-data-handshake".into()).spawn(move || {
            let hello = wire::handshake_server(&mut stream, &secret, b"", HANDSHAKE_MAX_FRAME_BYTES)
                .and_then(|h| proto::decode::<DataHello>(&h));
            pending.fetch_sub(1, Ordering::SeqCst);
            let hello = match hello {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("cutline: refused a data connection from {peer}: {e}");
                    return;
                }
            };
            // Keyed by its addressee too: the deployment takes only links addressed to this worker's
            // id under its current coordinator (a link for a stale address is never used).
            let (map, cv) = &*inbound;
            let mut m = map.lock().expect("inbound links");
            // Links of generations older than this one will never be taken.
            m.retain(|(g, _, _), _| *g >= hello.generation);
            m.insert((hello.generation, hello.from, hello.to), stream);
            cv.notify_all();
        });
    }
}

enum SessionEnd {
    Shutdown(String),
    Lost(String),
}

/// A generation running on this worker.
struct LocalGeneration {
    generation: Generation,
    threads: GenerationThreads,
    /// Links: dropped after the tasks (see `teardown`).
    links: Vec<Link>,
    /// The tasks' and writers' events; `None` once all of them are gone.
    events: Option<Receiver<RtEvent>>,
    acks: AckAggregator,
    /// Per local task: id, name, flow-control counters and input probes (for heartbeats).
    metrics: Vec<(TaskId, String, Arc<crate::runtime::TaskMetrics>, Vec<crate::channel::ChannelProbe>)>,
}

impl LocalGeneration {
    fn reports(&self) -> Vec<(u32, TaskReport)> {
        self.metrics.iter().map(|(t, name, m, p)| (t.0, crate::runtime::task_report(name, m, p))).collect()
    }
}

impl LocalGeneration {
    /// Tasks first (they may be pushing into the links), then the links.
    fn teardown(mut self) {
        drop(std::mem::take(&mut self.threads));
        self.links.clear();
    }
}

enum FromCoordinator {
    Msg(ToWorker),
    Gone(String),
}

#[allow(clippy::too_many_arguments)]
fn session(
    mut stream: TcpStream,
    secret: &Secret,
    name: &str,
    data_addr: &str,
    inbound: &Inbound,
    build: &JobBuilder,
    open_store: &StoreOpener,
    job_cache: &mut Option<(Vec<String>, JobGraph, String)>,
) -> Result<SessionEnd, String> {
    let hello =
        proto::encode(&JoinHello { version: version(), name: name.to_string(), data_addr: data_addr.to_string() });
    let welcome = wire::handshake_client(&mut stream, secret, &hello, wire::DEFAULT_MAX_FRAME_BYTES)
        .and_then(|h| proto::decode::<WelcomeHello>(&h))
        .map_err(|e| format!("joining the coordinator failed: {e}"))?;
    if welcome.version != version() {
        return Err(format!(
            "the coordinator runs cutline {}, this worker {}; run the same version everywhere",
            welcome.version,
            version()
        ));
    }
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut buf = Vec::new();
    let (me, JobInfo { args, fingerprint, state, settings }) =
        match proto::read_message::<ToWorker>(&mut reader, wire::DEFAULT_MAX_FRAME_BYTES, &mut buf) {
            Ok(ToWorker::Job { worker, job }) => (worker, job),
            Ok(other) => return Err(format!("expected the job from the coordinator, got {other:?}")),
            Err(e) => return Err(format!("reading the job from the coordinator: {e}")),
        };
    // Alive from now on, also while the job is built and the store opened below.
    {
        let mut w = &stream;
        let _ =
            wire::write_frame(&mut w, KIND_MESSAGE, &proto::encode(&ToCoordinator::Heartbeat { tasks: Vec::new() }));
    }
    if job_cache.as_ref().is_none_or(|(a, _, _)| *a != args) {
        let (graph, fp) = build(&args).map_err(|e| format!("cannot build the job {args:?}: {e}"))?;
        *job_cache = Some((args.clone(), graph, fp));
    }
    let (_, graph, fp) = job_cache.as_ref().expect("built");
    if *fp != fingerprint {
        return Err(format!(
            "this worker builds job {fp:?} from {args:?}, the coordinator runs {fingerprint:?}: run the same binary everywhere"
        ));
    }
    let store = open_store(&state).map_err(|e| format!("cannot open the checkpoint storage {state}: {e}"))?;
    eprintln!(
        "cutline: worker {me} joined the coordinator at {}",
        stream.peer_addr().map(|a| a.to_string()).unwrap_or_default()
    );

    let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded::<FromCoordinator>();
    let max_frame = settings.max_frame_bytes;
    std::thread::Builder::new()
        .name("cutline-from-coordinator".into())
        .spawn(move || {
            let mut buf = Vec::new();
            loop {
                match proto::read_message::<ToWorker>(&mut reader, max_frame, &mut buf) {
                    Ok(m) => {
                        if ctl_tx.send(FromCoordinator::Msg(m)).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let why = if e.is_closed() { "the connection closed".to_string() } else { e.to_string() };
                        let _ = ctl_tx.send(FromCoordinator::Gone(why));
                        return;
                    }
                }
            }
        })
        .map_err(|e| e.to_string())?;
    let mut out = BufWriter::new(stream.try_clone().map_err(|e| e.to_string())?);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(settings.heartbeat_timeout_ms)));
    let send = |out: &mut BufWriter<TcpStream>, m: &ToCoordinator| -> Result<(), String> {
        let payload = proto::encode(m);
        wire::write_frame(out, KIND_MESSAGE, &payload)
            .and_then(|()| out.flush().map_err(WireError::Io))
            .map_err(|e| e.to_string())
    };
    let clock = Instant::now();
    let mut last_heard = Instant::now();
    let mut last_beat = Instant::now();
    let mut current: Option<LocalGeneration> = None;
    let ctx = DeployCtx {
        graph: graph.clone(),
        fingerprint: fp.clone(),
        store: store.clone(),
        settings: settings.clone(),
        me,
        inbound: inbound.clone(),
        secret: secret.clone(),
    };
    let mut deploying: Option<Deploying> = None;
    let mut queued: Option<DeployMsg> = None;
    let mut cancel_after_deploy: Option<Generation> = None;
    let end = loop {
        let tick = Duration::from_millis(5);
        let never = crossbeam_channel::never();
        let ev_rx = current.as_ref().and_then(|g| g.events.as_ref()).unwrap_or(&never);
        let never_deploy = crossbeam_channel::never();
        let deploy_rx = deploying.as_ref().map(|(_, _, rx)| rx).unwrap_or(&never_deploy);
        let mut to_send: Vec<TaskEvent> = Vec::new();
        crossbeam_channel::select! {
            recv(ctl_rx) -> m => match m {
                Ok(FromCoordinator::Msg(m)) => {
                    last_heard = Instant::now();
                    match m {
                        ToWorker::Heartbeat => {}
                        ToWorker::Job { .. } => break SessionEnd::Lost("the coordinator sent the job twice".into()),
                        ToWorker::Deploy(d) => {
                            if let Some(g) = current.take() {
                                g.teardown();
                            }
                            // Deploying (restoring state, waiting for peers' links) may take longer
                            // than the heartbeat timeout: it runs on its own thread while this loop
                            // keeps heartbeats and messages moving. A newer deploy waits its turn.
                            if deploying.is_some() {
                                if let Some((_, abort, _)) = &deploying {
                                    abort.store(true, Ordering::SeqCst);
                                }
                                queued = Some(d);
                            } else {
                                deploying = Some(start_deploy(&ctx, d, Instant::now()));
                            }
                        }
                        ToWorker::Control { generation, control, sources_only } => {
                            if let Some(g) = current.as_ref().filter(|g| g.generation == generation) {
                                g.threads.send_all(control.into_control(), sources_only);
                            }
                        }
                        ToWorker::Cancel { generation } => {
                            if let Some(g) = current.take_if(|g| g.generation <= generation) {
                                g.teardown();
                            }
                            if queued.as_ref().is_some_and(|d| d.generation <= generation) {
                                queued = None;
                            }
                            match &deploying {
                                // Answered once the deployment in progress is undone.
                                Some((g, abort, _)) if *g <= generation => {
                                    abort.store(true, Ordering::SeqCst);
                                    cancel_after_deploy = Some(generation);
                                }
                                _ => {
                                    if let Err(e) = send(&mut out, &ToCoordinator::Cancelled { generation }) {
                                        break SessionEnd::Lost(e);
                                    }
                                }
                            }
                        }
                        ToWorker::Shutdown { reason } => break SessionEnd::Shutdown(reason),
                    }
                }
                Ok(FromCoordinator::Gone(why)) => break SessionEnd::Lost(why),
                Err(_) => break SessionEnd::Lost("the reader stopped".into()),
            },
            recv(deploy_rx) -> r => {
                let (generation, _, _) = deploying.take().expect("a deployment in progress");
                let r = r.unwrap_or_else(|_| Err(DeployError::Retry("the deployment thread died".into())));
                let mut answer = None;
                if let Some(cancelled) = cancel_after_deploy.take() {
                    if let Ok(g) = r {
                        g.teardown();
                    }
                    answer = Some(ToCoordinator::Cancelled { generation: cancelled });
                } else if queued.is_some() {
                    if let Ok(g) = r {
                        g.teardown();
                    }
                } else {
                    answer = Some(match r {
                        Ok(g) => {
                            current = Some(g);
                            ToCoordinator::Deployed { generation }
                        }
                        Err(DeployError::Permanent(e)) => ToCoordinator::DeployFailed { generation, reason: e.to_string(), permanent: true },
                        Err(DeployError::Retry(reason)) => ToCoordinator::DeployFailed { generation, reason, permanent: false },
                    });
                }
                if let Some(d) = queued.take() {
                    deploying = Some(start_deploy(&ctx, d, Instant::now()));
                }
                if let Some(a) = answer {
                    if let Err(e) = send(&mut out, &a) {
                        break SessionEnd::Lost(e);
                    }
                }
            },
            recv(ev_rx) -> ev => if let (Err(_), Some(g)) = (&ev, current.as_mut()) {
                // Every task and writer of the generation is gone: nothing more will come (and a
                // disconnected channel is always ready, so stop selecting on it).
                g.events = None;
            } else if let (Ok(ev), Some(g)) = (ev, current.as_mut()) {
                let now = clock.elapsed().as_millis() as u64;
                let ev = match ev {
                    RtEvent::Coord(e) => e,
                    RtEvent::Failed { generation, task, error } => Event::TaskFailed { generation, task, reason: error },
                    RtEvent::Batch(_) => unreachable!("only the coordinator's readers batch events"),
                };
                g.acks.on_event(now, ev, &mut to_send);
            },
            default(tick) => {}
        }
        if let Some(g) = current.as_mut() {
            g.acks.on_tick(clock.elapsed().as_millis() as u64, &mut to_send);
        }
        if !to_send.is_empty() {
            if let Err(e) = send(&mut out, &ToCoordinator::Events(to_send)) {
                break SessionEnd::Lost(e);
            }
        }
        if last_beat.elapsed() >= Duration::from_millis(settings.heartbeat_interval_ms) {
            last_beat = Instant::now();
            let tasks = current.as_ref().map(|g| g.reports()).unwrap_or_default();
            if let Err(e) = send(&mut out, &ToCoordinator::Heartbeat { tasks }) {
                break SessionEnd::Lost(e);
            }
        }
        if last_heard.elapsed() > Duration::from_millis(settings.heartbeat_timeout_ms) {
            break SessionEnd::Lost(format!("no heartbeat for more than {} ms", settings.heartbeat_timeout_ms));
        }
    };
    // Whatever ended the session, no task of it runs on: a new coordinator restores from storage.
    if let Some(g) = current.take() {
        g.teardown();
    }
    if let Some((_, abort, rx)) = deploying.take() {
        abort.store(true, Ordering::SeqCst);
        if let Ok(Ok(g)) = rx.recv() {
            g.teardown();
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
    Ok(end)
}

/// What a deployment thread needs.
struct DeployCtx {
    graph: JobGraph,
    fingerprint: String,
    store: Arc<dyn CheckpointStore>,
    settings: WorkerSettings,
    me: u32,
    inbound: Inbound,
    secret: Secret,
}

/// A deployment in progress: its generation, its abort flag, and where its result arrives.
type Deploying = (Generation, Arc<AtomicBool>, Receiver<Result<LocalGeneration, DeployError>>);

/// Start deploying `d`, which arrived at `received` (the task clocks are aligned to that moment).
fn start_deploy(ctx: &DeployCtx, d: DeployMsg, received: Instant) -> Deploying {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let abort = Arc::new(AtomicBool::new(false));
    let generation = d.generation;
    let c = DeployCtx {
        graph: ctx.graph.clone(),
        fingerprint: ctx.fingerprint.clone(),
        store: ctx.store.clone(),
        settings: ctx.settings.clone(),
        me: ctx.me,
        inbound: ctx.inbound.clone(),
        secret: ctx.secret.clone(),
    };
    let a = abort.clone();
    let spawned = std::thread::Builder::new().name("cutline-deploy".into()).spawn(move || {
        let r =
            deploy_here(&c.graph, &c.fingerprint, &c.store, &c.settings, c.me, d, &c.inbound, &c.secret, &a, received);
        let _ = tx.send(r);
    });
    if let Err(e) = spawned {
        let (tx, rx2) = crossbeam_channel::bounded(1);
        let _ = tx.send(Err(DeployError::Retry(format!("cannot start a thread: {e}"))));
        return (generation, abort, rx2);
    }
    (generation, abort, rx)
}

/// Deploy this worker's part of a generation: restore state, open the data links, start the tasks.
#[allow(clippy::too_many_arguments)]
fn deploy_here(
    graph: &JobGraph,
    fingerprint: &str,
    store: &Arc<dyn CheckpointStore>,
    settings: &WorkerSettings,
    me: u32,
    d: DeployMsg,
    inbound: &Inbound,
    secret_for_links: &Secret,
    abort: &AtomicBool,
    received: Instant,
) -> Result<LocalGeneration, DeployError> {
    let called_off = || {
        if abort.load(Ordering::SeqCst) {
            Err(DeployError::Retry("the deployment was called off".into()))
        } else {
            Ok(())
        }
    };
    let generation = d.generation;
    let mut index = match (&d.savepoint, d.checkpoint) {
        (Some(path), _) => {
            let sp = crate::savepoint::open(std::path::Path::new(path)).map_err(DeployError::Retry)?;
            let (mut index, _) = load_checkpoint(&sp.store, graph, fingerprint, sp.checkpoint).map_err(restore_err)?;
            index.savepoint = Some(path.into());
            index
        }
        (None, Some(c)) => load_checkpoint(&**store, graph, fingerprint, c).map_err(restore_err)?.0,
        (None, None) => RestoreIndex::default(),
    };
    index.skipped = d.skipped.clone();
    index.duplicates_allowed = d.duplicates_allowed;
    let opts = DeployOptions {
        restore: &index,
        faults: crate::fault::Faults::none(),
        incarnation_base: generation.0 << 32,
        job_id: job_id(fingerprint),
        batch_size: settings.batch_size as usize,
        channel_capacity: settings.channel_capacity as usize,
        max_channel_state_bytes: settings.max_channel_state_bytes,
    };
    let peer_wakers: Vec<Arc<Waker>> = (0..d.peers.len()).map(|_| Waker::new()).collect();
    let placement = Placement { worker_of: d.worker_of.clone(), me, peer_wakers: peer_wakers.clone() };
    let placed =
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| graph.deploy_placed(&opts, Some(&placement)))) {
            Ok(Ok(p)) => p,
            Ok(Err(e @ TaskError::State { .. })) => return Err(DeployError::Permanent(e)),
            Ok(Err(e)) => return Err(DeployError::Retry(e.to_string())),
            Err(_) => return Err(DeployError::Retry("deploying panicked".into())),
        };
    drop(index);
    // Outbound links: one per peer that runs downstream tasks of ours.
    called_off()?;
    let mut outs_by_peer: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for (_, peer, pump) in placed.outs {
        outs_by_peer.entry(peer).or_default().push(pump);
    }
    let mut ins_by_peer: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for (_, peer, pump) in placed.ins {
        ins_by_peer.entry(peer).or_default().push(pump);
    }
    let capacity = settings.channel_capacity as usize;
    let max_frame = settings.max_frame_bytes;
    let mut links = Vec::new();
    for (peer, pumps) in outs_by_peer {
        let addr = &d.peers[peer as usize];
        let mut s =
            connect(addr).map_err(|e| DeployError::Retry(format!("cannot reach worker {peer} at {addr}: {e}")))?;
        let hello = proto::encode(&DataHello { generation, from: me, to: peer });
        wire::handshake_client(&mut s, secret_for_links, &hello, max_frame)
            .map_err(|e| DeployError::Retry(format!("data link to worker {peer} at {addr}: {e}")))?;
        let name = format!("data link {generation} worker {me} -> {peer}");
        links.push(
            start_sender(s, name, pumps, capacity, peer_wakers[peer as usize].clone(), max_frame)
                .map_err(|e| DeployError::Retry(e.to_string()))?,
        );
    }
    // Inbound links: wait for every peer that runs upstream tasks of ours.
    let deadline = Instant::now() + Duration::from_millis(DEFAULT_DEPLOY_TIMEOUT_MS / 2);
    for (peer, pumps) in ins_by_peer {
        called_off()?;
        let (map, cv) = &**inbound;
        let mut m = map.lock().expect("inbound links");
        let s = loop {
            if let Some(s) = m.remove(&(generation, peer, me)) {
                break s;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(DeployError::Retry(format!("worker {peer} did not open its data link to worker {me}")));
            }
            called_off()?;
            m = cv.wait_timeout(m, left.min(Duration::from_millis(50))).expect("inbound links").0;
        };
        drop(m);
        let name = format!("data link {generation} worker {peer} -> {me}");
        links.push(
            start_receiver(s, name, pumps, capacity, peer_wakers[peer as usize].clone(), max_frame)
                .map_err(|e| DeployError::Retry(e.to_string()))?,
        );
    }
    let local_tasks: Vec<TaskId> = placed.tasks.iter().map(|t| t.task.id).collect();
    let names: Vec<String> = placed.tasks.iter().map(|t| t.task.name.clone()).collect();
    let (ev_tx, ev_rx) = crossbeam_channel::unbounded();
    let mut threads = GenerationThreads::default();
    // Task clocks follow the coordinator's (see `DeployMsg::now_ms`).
    let start = received.checked_sub(Duration::from_millis(d.now_ms)).unwrap_or(received);
    // Called off while restoring or connecting: start nothing (a stale worker's sinks must not run
    // their recovery next to a newer generation's).
    called_off()?;
    let spawned = spawn_tasks(
        &mut threads,
        graph,
        settings.snapshot_writers as usize,
        store,
        &crate::fault::Faults::none(),
        placed.tasks,
        generation,
        start,
        ev_tx,
    )
    .map_err(|e| DeployError::Retry(e.to_string()))?;
    let metrics = local_tasks.iter().zip(names).zip(spawned).map(|((t, n), (m, p))| (*t, n, m, p)).collect();
    if settings.verbose {
        eprintln!(
            "cutline: worker {me}: {generation} runs {} task(s), {} data link(s)",
            local_tasks.len(),
            links.len()
        );
    }
    Ok(LocalGeneration {
        generation,
        threads,
        links,
        events: Some(ev_rx),
        acks: AckAggregator::new(generation, local_tasks, DEFAULT_MAX_ACK_HOLD_MS),
        metrics,
    })
}

fn restore_err(e: RunError) -> DeployError {
    match e {
        e @ (RunError::Restore { .. } | RunError::WrongJob { .. }) => {
            DeployError::Permanent(TaskError::State { uid: "(restore)".into(), message: e.to_string() })
        }
        e => DeployError::Retry(e.to_string()),
    }
}
