//! The worker side of a cluster: joining (and rejoining) a coordinator, the session loop that carries out its
//! messages and sends acknowledgements and heartbeats, and the acceptor of data links from other workers. A worker
//! retries what may get better (an unreachable coordinator, a lost connection) until its rejoin timeout, and stops at
//! once on what cannot ([`WorkerError`]): a rejected secret, a coordinator that cannot prove it holds the secret,
//! different frame protection, a job graph that differs from the coordinator's.

use super::acks::TaskEvent;
use super::proto::{self, version, DeployMsg, JobInfo, JoinHello, ToCoordinator, ToWorker, WelcomeHello, KIND_MESSAGE};
use super::shape::GraphShape;
use super::wire::{self, FrameProtection, Secret, WireError};
use super::worker_deploy::{start_deploy, DeployCtx, Deploying, LocalGeneration};
use super::worker_links::{accept_links, connect, Inbound};
use crate::dataflow::JobGraph;
use crate::fault::Faults;
use crate::runtime::run::{DeployError, RtEvent};
use crate::runtime::start::host_name;
use cutline_core::coordinator::Event;
use cutline_core::Generation;
use cutline_storage::CheckpointStore;
use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a worker tries to reach its coordinator before it gives up.
pub const DEFAULT_REJOIN_TIMEOUT_MS: u64 = 60_000;
/// Pause between a worker's connection attempts.
const REJOIN_BACKOFF_MS: u64 = 100;
/// Messages from the coordinator queued for the session loop; the connection's reader blocks while
/// it is full (the coordinator is backpressured, and drops a worker whose queue there fills up).
const FROM_COORDINATOR_MESSAGES: usize = 1024;

/// How a worker process joins a cluster.
#[derive(Clone)]
pub struct WorkerConfig {
    /// The coordinator's address.
    pub join: String,
    /// The cluster's shared secret, the coordinator's (at least 16 bytes).
    pub secret: Vec<u8>,
    /// Where this worker listens for other workers' data links ("0.0.0.0:0": any port; default "127.0.0.1:0").
    pub listen: String,
    /// The address other workers use to reach this one (default: the listening address; give the
    /// host's address when listening on 0.0.0.0).
    pub advertise: Option<String>,
    /// Milliseconds the worker keeps trying to reach a coordinator that is gone before it gives up.
    pub rejoin_timeout_ms: u64,
    /// Whether the frames of this worker's connections are sealed (the coordinator and the other
    /// workers must come to the same decision).
    pub frame_protection: FrameProtection,
    /// Where the secret came from (e.g. its file), for the error when the coordinator rejects it.
    pub secret_origin: Option<String>,
    /// Drills: the fault policy of the tasks this worker runs (default: none).
    pub faults: Faults,
    /// Where the worker tells its probes how it is (joined, running a generation, its tasks).
    pub status: std::sync::Arc<super::WorkerStatus>,
}

impl WorkerConfig {
    /// A worker that joins the coordinator at `join` with `secret`, with the defaults for everything else.
    pub fn new(join: impl Into<String>, secret: Vec<u8>) -> WorkerConfig {
        WorkerConfig {
            join: join.into(),
            secret,
            listen: "127.0.0.1:0".into(),
            advertise: None,
            rejoin_timeout_ms: DEFAULT_REJOIN_TIMEOUT_MS,
            frame_protection: FrameProtection::default(),
            secret_origin: None,
            faults: Faults::none(),
            status: Default::default(),
        }
    }
}

/// Why [`run_worker`] ended without the coordinator saying the job is over.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The configuration cannot work (a short secret, a malformed address, a port in use).
    #[error("{0}")]
    Config(String),
    /// The coordinator rejected this worker's secret. Retrying cannot help.
    #[error(
        "the coordinator at {join} rejected this worker's cluster secret{}: give this worker the same secret \
         file as the coordinator (--secret-file or CUTLINE_SECRET_FILE) and start it again",
        origin(.secret_origin)
    )]
    WrongSecret {
        /// The coordinator's address.
        join: String,
        /// Where the secret came from ([`WorkerConfig::secret_origin`]).
        secret_origin: Option<String>,
    },
    /// The process at the coordinator's address does not prove that it holds the secret.
    #[error(
        "the process at {join} does not prove that it holds the cluster secret{}: check that --join names \
         this cluster's coordinator, and give the coordinator and this worker the same secret file",
        origin(.secret_origin)
    )]
    CoordinatorWithoutSecret {
        /// The address the worker reached.
        join: String,
        /// Where the worker's secret came from ([`WorkerConfig::secret_origin`]).
        secret_origin: Option<String>,
    },
    /// This worker and the coordinator (or another worker) disagree on frame protection.
    #[error("{0}")]
    FrameProtection(String),
    /// This worker builds another job graph than the coordinator runs.
    #[error(
        "this worker cannot run the coordinator's job: {difference}; run every process of the cluster with the \
         same binary and the same job"
    )]
    GraphMismatch {
        /// The first difference found between the two graphs.
        difference: String,
    },
    /// No coordinator could be reached (or joined) for the rejoin timeout.
    #[error("no coordinator at {join} for {timeout_ms} ms (last error: {last}); giving up")]
    CoordinatorGone {
        /// The coordinator's address.
        join: String,
        /// How long the worker tried, in milliseconds ([`WorkerConfig::rejoin_timeout_ms`]).
        timeout_ms: u64,
        /// The last connection error.
        last: String,
    },
}

fn origin(o: &Option<String>) -> String {
    o.as_ref().map(|o| format!(" (from {o})")).unwrap_or_default()
}

/// Why one session with a coordinator ended without a `Shutdown`, when it was not a lost connection.
enum SessionError {
    /// Worth another attempt (until the rejoin timeout).
    Retry(String),
    /// Another attempt cannot succeed.
    Permanent(WorkerError),
}

impl From<String> for SessionError {
    fn from(s: String) -> Self {
        SessionError::Retry(s)
    }
}

/// Builds the job a coordinator names: from its arguments, the graph and the job's fingerprint.
pub type JobBuilder = dyn Fn(&[String]) -> Result<(JobGraph, String), String>;
/// Opens the checkpoint storage a coordinator names.
pub type StoreOpener = dyn Fn(&str) -> Result<Arc<dyn CheckpointStore>, String>;

/// Run a worker until its coordinator says the job is over (Ok), no coordinator can be reached for
/// `rejoin_timeout_ms`, or something that retrying cannot mend happens (Err, at once).
pub fn run_worker(cfg: WorkerConfig, build: &JobBuilder, open_store: &StoreOpener) -> Result<(), WorkerError> {
    let secret = Secret::new(cfg.secret.clone()).map_err(WorkerError::Config)?;
    // A malformed address never gets better: refuse it now, not after the rejoin timeout.
    match cfg.join.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {}
        _ => {
            return Err(WorkerError::Config(format!(
                "the coordinator address {:?} is not HOST:PORT (e.g. 10.0.0.1:7070)",
                cfg.join
            )))
        }
    }
    let listener = TcpListener::bind(&cfg.listen).map_err(|e| {
        WorkerError::Config(format!(
            "cannot listen for data links on {}: {e}; choose another --listen address",
            cfg.listen
        ))
    })?;
    let local = listener.local_addr().map_err(|e| WorkerError::Config(e.to_string()))?;
    let data_addr = match &cfg.advertise {
        Some(a) if a.contains(':') => a.clone(),
        Some(host) => format!("{host}:{}", local.port()),
        None => local.to_string(),
    };
    let inbound: Inbound = Default::default();
    {
        let (inbound, secret, protection) = (inbound.clone(), secret.clone(), cfg.frame_protection);
        std::thread::Builder::new()
            .name("cutline-data-accept".into())
            .spawn(move || accept_links(listener, secret, protection, inbound))
            .map_err(|e| WorkerError::Config(format!("cannot start a thread: {e}")))?;
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
                    return Err(WorkerError::CoordinatorGone {
                        join: cfg.join.clone(),
                        timeout_ms: cfg.rejoin_timeout_ms,
                        last: e.to_string(),
                    });
                }
                std::thread::sleep(Duration::from_millis(REJOIN_BACKOFF_MS));
                continue;
            }
        };
        let me = Me { cfg: &cfg, secret: &secret, name: &name, data_addr: &data_addr, inbound: &inbound };
        match session(stream, &me, build, open_store, &mut job_cache) {
            Ok(SessionEnd::Shutdown(reason)) => {
                tracing::info!(event = "worker_exit", "worker exits: {reason}");
                return Ok(());
            }
            Ok(SessionEnd::Lost(why)) => {
                tracing::warn!(
                    event = "coordinator_lost",
                    reason = %why,
                    "worker lost its coordinator ({why}); its tasks stopped, joining again"
                );
                gone_since = Some(Instant::now());
            }
            Err(SessionError::Permanent(e)) => {
                tracing::error!(event = "worker_exit", reason = %e, "worker exits: {e}");
                return Err(e);
            }
            Err(SessionError::Retry(e)) => {
                tracing::warn!(event = "join_failed", reason = %e, "worker: {e}");
                let since = *gone_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(cfg.rejoin_timeout_ms) {
                    return Err(WorkerError::CoordinatorGone {
                        join: cfg.join.clone(),
                        timeout_ms: cfg.rejoin_timeout_ms,
                        last: e,
                    });
                }
                std::thread::sleep(Duration::from_millis(REJOIN_BACKOFF_MS * 5));
            }
        }
    }
}

enum SessionEnd {
    Shutdown(String),
    Lost(String),
}

enum FromCoordinator {
    Msg(ToWorker),
    Gone(String),
}

/// What a session needs to know about this worker.
struct Me<'a> {
    cfg: &'a WorkerConfig,
    secret: &'a Secret,
    name: &'a str,
    data_addr: &'a str,
    inbound: &'a Inbound,
}

/// The handshake's failure, as a session error: permanent when retrying cannot help.
fn join_error(cfg: &WorkerConfig, e: WireError) -> SessionError {
    let (join, secret_origin) = (cfg.join.clone(), cfg.secret_origin.clone());
    match e {
        WireError::WrongSecret => SessionError::Permanent(WorkerError::WrongSecret { join, secret_origin }),
        WireError::PeerWithoutSecret => {
            SessionError::Permanent(WorkerError::CoordinatorWithoutSecret { join, secret_origin })
        }
        e @ WireError::ProtectionMismatch { .. } => {
            SessionError::Permanent(WorkerError::FrameProtection(format!("joining the coordinator at {join}: {e}")))
        }
        e => SessionError::Retry(format!("joining the coordinator failed: {e}")),
    }
}

fn session(
    mut stream: TcpStream,
    me_: &Me<'_>,
    build: &JobBuilder,
    open_store: &StoreOpener,
    job_cache: &mut Option<(Vec<String>, JobGraph, String)>,
) -> Result<SessionEnd, SessionError> {
    let Me { cfg, secret, name, data_addr, inbound } = *me_;
    let hello =
        proto::encode(&JoinHello { version: version(), name: name.to_string(), data_addr: data_addr.to_string() });
    let wire::Established { hello: welcome, writer: mut frames_out, reader: mut frames_in } =
        wire::handshake_client(&mut stream, secret, cfg.frame_protection, &hello, wire::DEFAULT_MAX_FRAME_BYTES)
            .map_err(|e| join_error(cfg, e))?;
    let welcome = proto::decode::<WelcomeHello>(&welcome)
        .map_err(|e| SessionError::Retry(format!("joining the coordinator failed: {e}")))?;
    if welcome.version != version() {
        return Err(SessionError::Retry(format!(
            "the coordinator runs cutline {}, this worker {}; run the same version everywhere",
            welcome.version,
            version()
        )));
    }
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut buf = Vec::new();
    let (me, JobInfo { args, fingerprint, shape, state, settings }) =
        match proto::read_message::<ToWorker>(&mut frames_in, &mut reader, &mut buf) {
            Ok(ToWorker::Job { worker, job }) => (worker, job),
            Ok(other) => return Err(format!("expected the job from the coordinator, got {other:?}").into()),
            Err(e) => return Err(format!("reading the job from the coordinator: {e}").into()),
        };
    frames_in.set_max_frame_bytes(settings.max_frame_bytes);
    let sealed = frames_out.is_sealed();
    let mut out = BufWriter::new(stream.try_clone().map_err(|e| e.to_string())?);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(settings.heartbeat_timeout_ms)));
    let mut send = |out: &mut BufWriter<TcpStream>, m: &ToCoordinator| -> Result<(), String> {
        let payload = proto::encode(m);
        frames_out
            .write(out, KIND_MESSAGE, &payload)
            .and_then(|()| out.flush().map_err(WireError::Io))
            .map_err(|e| e.to_string())
    };
    // Alive from now on, also while the job is built and the store opened below.
    let _ = send(&mut out, &ToCoordinator::Heartbeat { tasks: Vec::new() });
    if job_cache.as_ref().is_none_or(|(a, _, _)| *a != args) {
        let (graph, fp) = build(&args).map_err(|e| format!("cannot build the job {args:?}: {e}"))?;
        *job_cache = Some((args.clone(), graph, fp));
    }
    let (_, graph, fp) = job_cache.as_ref().expect("built");
    // Another job, or the same job with another shape, will not change by joining again: say why to
    // the coordinator (which logs it and fails the job) and stop.
    let difference = if *fp != fingerprint {
        Some(format!("this worker builds job {fp:?} from {args:?}, the coordinator runs {fingerprint:?}"))
    } else {
        GraphShape::of(graph).difference(&shape)
    };
    if let Some(difference) = difference {
        tracing::error!(event = "job_refused", reason = %difference, "worker refuses the job: {difference}");
        let _ = send(&mut out, &ToCoordinator::Refused { reason: difference.clone() });
        return Err(SessionError::Permanent(WorkerError::GraphMismatch { difference }));
    }
    let store = open_store(&state).map_err(|e| format!("cannot open the checkpoint storage {state}: {e}"))?;
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    cfg.status.joined(&cfg.join);
    tracing::info!(
        event = "joined",
        worker = me,
        sealed,
        "worker {me} joined the coordinator at {peer} ({})",
        if sealed { "frames sealed" } else { "frames not sealed" }
    );

    let (ctl_tx, ctl_rx) = crossbeam_channel::bounded::<FromCoordinator>(FROM_COORDINATOR_MESSAGES);
    std::thread::Builder::new()
        .name("cutline-from-coordinator".into())
        .spawn(move || {
            let mut buf = Vec::new();
            loop {
                match proto::read_message::<ToWorker>(&mut frames_in, &mut reader, &mut buf) {
                    Ok(m) => {
                        if ctl_tx.send(FromCoordinator::Msg(m)).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        if e.is_integrity() {
                            tracing::warn!(event = "frame_rejected", peer = %peer, reason = %e, "the coordinator at {peer}: {e}");
                        }
                        let why = if e.is_closed() { "the connection closed".to_string() } else { e.to_string() };
                        let _ = ctl_tx.send(FromCoordinator::Gone(why));
                        return;
                    }
                }
            }
        })
        .map_err(|e| e.to_string())?;
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
        protection: cfg.frame_protection,
        faults: cfg.faults.clone(),
    };
    let mut deploying: Option<Deploying> = None;
    let mut queued: Option<DeployMsg> = None;
    let mut cancel_after_deploy: Option<Generation> = None;
    let end = 'session: loop {
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
                        Err(DeployError::Refused(reason)) => {
                            tracing::error!(event = "deploy_refused", gen = %generation, reason = %reason, "worker {me}: {reason}");
                            ToCoordinator::DeployFailed { generation, reason, permanent: true }
                        }
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
                    RtEvent::Failed { generation, task, error, permanent } => {
                        Event::TaskFailed { generation, task, reason: error, permanent }
                    }
                    RtEvent::Batch { .. } => unreachable!("only the coordinator's readers batch events"),
                };
                g.acks.on_event(now, ev, &mut to_send);
            },
            default(tick) => {}
        }
        if let Some(g) = current.as_mut() {
            g.acks.on_tick(clock.elapsed().as_millis() as u64, &mut to_send);
            // A broken link is told before the task failures it causes (they follow in `to_send` or
            // later): the coordinator can then name the lost peer as the cause.
            let generation = g.generation;
            for (peer, reason) in g.new_link_failures() {
                if let Err(e) = send(&mut out, &ToCoordinator::LinkFailed { generation, peer, reason }) {
                    break 'session SessionEnd::Lost(e);
                }
            }
        }
        if !to_send.is_empty() {
            if let Err(e) = send(&mut out, &ToCoordinator::Events(to_send)) {
                break SessionEnd::Lost(e);
            }
        }
        if last_beat.elapsed() >= Duration::from_millis(settings.heartbeat_interval_ms) {
            last_beat = Instant::now();
            let tasks = current.as_ref().map(|g| g.reports()).unwrap_or_default();
            cfg.status.running(current.as_ref().map(|g| g.generation.0), &tasks);
            if let Err(e) = send(&mut out, &ToCoordinator::Heartbeat { tasks }) {
                break SessionEnd::Lost(e);
            }
        }
        if last_heard.elapsed() > Duration::from_millis(settings.heartbeat_timeout_ms) {
            break SessionEnd::Lost(format!("no heartbeat for more than {} ms", settings.heartbeat_timeout_ms));
        }
    };
    // Whatever ended the session, no task of it runs on: a new coordinator restores from storage.
    cfg.status.lost();
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

/// The same message as `Display` (a `main` returning `Box<dyn Error>` prints it).
impl std::fmt::Debug for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
