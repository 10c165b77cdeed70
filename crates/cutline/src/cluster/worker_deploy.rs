//! Deploying this worker's part of a generation on a thread of its own: restore state from storage,
//! open the data links to and from the other workers, start the tasks; and tearing it down.

use super::acks::{AckAggregator, DEFAULT_MAX_ACK_HOLD_MS};
use super::config::DEFAULT_DEPLOY_TIMEOUT_MS;
use super::data::{start_receiver, start_sender, Link};
use super::proto::{self, DataHello, DeployMsg, WorkerSettings};
use super::wire::{self, FrameProtection, Secret};
use super::worker_links::{connect, Inbound};
use crate::channel::{ChannelProbe, Waker};
use crate::dataflow::JobGraph;
use crate::error::TaskError;
use crate::fault::Faults;
use crate::runtime::deploy::{deploy_placed, DeployOptions, Placement};
use crate::runtime::local::{spawn_tasks, task_report, GenerationThreads};
use crate::runtime::run::{DeployError, RtEvent};
use crate::runtime::start::{job_id, load_checkpoint};
use crate::runtime::{RunError, TaskReport};
use crate::state::RestoreIndex;
use crossbeam_channel::Receiver;
use cutline_core::{Generation, TaskId};
use cutline_storage::CheckpointStore;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A generation running on this worker.
pub(crate) struct LocalGeneration {
    pub generation: Generation,
    pub threads: GenerationThreads,
    /// Links, with the worker at the other end: dropped after the tasks (see `teardown`).
    links: Vec<(u32, Link)>,
    /// Links whose failure the coordinator was told about.
    reported: Vec<bool>,
    /// The tasks' and writers' events; `None` once all of them are gone.
    pub events: Option<Receiver<RtEvent>>,
    pub acks: AckAggregator,
    /// Per local task: id, name, flow-control counters and input probes (for heartbeats).
    metrics: Vec<(TaskId, String, Arc<crate::runtime::report::TaskMetrics>, Vec<ChannelProbe>)>,
}

impl LocalGeneration {
    pub fn reports(&self) -> Vec<(u32, TaskReport)> {
        self.metrics.iter().map(|(t, name, m, p)| (t.0, task_report(name, m, p))).collect()
    }

    /// Links that failed since the last call: (the worker at the other end, why).
    pub fn new_link_failures(&mut self) -> Vec<(u32, String)> {
        let mut out = Vec::new();
        for ((peer, link), reported) in self.links.iter().zip(self.reported.iter_mut()) {
            if !*reported {
                if let Some(why) = link.failure() {
                    *reported = true;
                    out.push((*peer, why));
                }
            }
        }
        out
    }
}

impl LocalGeneration {
    /// Tasks first (they may be pushing into the links), then the links.
    pub fn teardown(mut self) {
        drop(std::mem::take(&mut self.threads));
        self.links.clear();
    }
}

/// What a deployment thread needs.
pub(crate) struct DeployCtx {
    pub(crate) graph: JobGraph,
    pub(crate) fingerprint: String,
    pub(crate) store: Arc<dyn CheckpointStore>,
    pub(crate) settings: WorkerSettings,
    pub(crate) me: u32,
    pub(crate) inbound: Inbound,
    pub(crate) secret: Secret,
    pub(crate) protection: FrameProtection,
    pub(crate) faults: Faults,
}

/// A deployment in progress: its generation, its abort flag, and where its result arrives.
pub(crate) type Deploying = (Generation, Arc<AtomicBool>, Receiver<Result<LocalGeneration, DeployError>>);

/// Start deploying `d`, which arrived at `received` (the task clocks are aligned to that moment).
pub(crate) fn start_deploy(ctx: &DeployCtx, d: DeployMsg, received: Instant) -> Deploying {
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
        protection: ctx.protection,
        faults: ctx.faults.clone(),
    };
    let a = abort.clone();
    let spawned = std::thread::Builder::new().name("cutline-deploy".into()).spawn(move || {
        let _ = tx.send(deploy_here(&c, d, &a, received));
    });
    if let Err(e) = spawned {
        let (tx, rx2) = crossbeam_channel::bounded(1);
        let _ = tx.send(Err(DeployError::Retry(format!("cannot start a thread: {e}"))));
        return (generation, abort, rx2);
    }
    (generation, abort, rx)
}

/// A placement that does not fit this worker's graph: the coordinator runs another job graph (or is
/// broken). Checked before anything is indexed by it.
fn check_placement(graph: &JobGraph, me: u32, d: &DeployMsg) -> Result<(), DeployError> {
    let refuse = |what: String| {
        Err(DeployError::Refused(format!(
            "the coordinator's placement of {} does not fit this worker's job graph: {what}; run the same \
             binary with the same job everywhere",
            d.generation
        )))
    };
    if d.worker_of.len() != graph.task_count() {
        return refuse(format!("it places {} tasks, the graph here has {}", d.worker_of.len(), graph.task_count()));
    }
    if me as usize >= d.peers.len() {
        return refuse(format!("it names {} workers, not this one (worker {me})", d.peers.len()));
    }
    if let Some(w) = d.worker_of.iter().find(|w| d.peers.get(**w as usize).is_none_or(|a| a.is_empty())) {
        return refuse(format!("it places a task on worker {w}, which has no data address in it"));
    }
    Ok(())
}

/// Deploy this worker's part of a generation: restore state, open the data links, start the tasks.
fn deploy_here(
    ctx: &DeployCtx,
    d: DeployMsg,
    abort: &AtomicBool,
    received: Instant,
) -> Result<LocalGeneration, DeployError> {
    let DeployCtx { graph, fingerprint, store, settings, me, inbound, secret, protection, faults } = ctx;
    let me = *me;
    check_placement(graph, me, &d)?;
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
            let sp = crate::runtime::open_savepoint(std::path::Path::new(path)).map_err(DeployError::Retry)?;
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
        faults: faults.clone(),
        incarnation_base: generation.0 << 32,
        job_id: job_id(fingerprint),
        batch_size: settings.batch_size as usize,
        state_backend: &settings.state_backend,
        channel_capacity: settings.channel_capacity as usize,
        max_channel_state_bytes: settings.max_channel_state_bytes,
    };
    let peer_wakers: Vec<Arc<Waker>> = (0..d.peers.len()).map(|_| Waker::new()).collect();
    let placement = Placement { worker_of: d.worker_of.clone(), me, peer_wakers: peer_wakers.clone() };
    let placed = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        deploy_placed(graph, &opts, Some(&placement))
    })) {
        Ok(Ok(p)) => p,
        // As in one process: state that does not fit the job, a missing topic or table, a bad
        // setting of a connector; deploying again opens the same thing again.
        Ok(Err(e)) if e.is_permanent() => return Err(DeployError::Permanent(e)),
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
        let est = wire::handshake_client(&mut s, secret, *protection, &hello, max_frame).map_err(|e| {
            let why = format!("data link to worker {peer} at {addr}: {e}");
            if e.is_permanent() {
                DeployError::Refused(why)
            } else {
                DeployError::Retry(why)
            }
        })?;
        let name = format!("data link {generation} worker {me} -> {peer}");
        let link = start_sender(s, name, pumps, capacity, peer_wakers[peer as usize].clone(), (est.writer, est.reader))
            .map_err(|e| DeployError::Retry(e.to_string()))?;
        links.push((peer, link));
    }
    // Inbound links: wait for every peer that runs upstream tasks of ours.
    let deadline = Instant::now() + Duration::from_millis(DEFAULT_DEPLOY_TIMEOUT_MS / 2);
    for (peer, pumps) in ins_by_peer {
        called_off()?;
        let (map, cv) = &**inbound;
        let mut m = map.lock().expect("inbound links");
        let (s, writer, mut reader) = loop {
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
        reader.set_max_frame_bytes(max_frame);
        let link = start_receiver(s, name, pumps, capacity, peer_wakers[peer as usize].clone(), (writer, reader))
            .map_err(|e| DeployError::Retry(e.to_string()))?;
        links.push((peer, link));
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
        (settings.snapshot_writers as usize, settings.incremental_checkpoints),
        store,
        faults,
        placed.tasks,
        generation,
        start,
        ev_tx,
    )
    .map_err(|e| DeployError::Retry(e.to_string()))?;
    let metrics = local_tasks.iter().zip(names).zip(spawned).map(|((t, n), (m, p))| (*t, n, m, p)).collect();
    tracing::info!(
        event = "deployed",
        worker = me,
        gen = %generation,
        "worker {me}: {generation} runs {} task(s), {} data link(s)",
        local_tasks.len(),
        links.len()
    );
    Ok(LocalGeneration {
        generation,
        threads,
        reported: vec![false; links.len()],
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
