//! Deployment of one generation: channels created for every edge (local ones, or pumps where a channel
//! crosses to another worker), state restored, and one [`Task`] per parallel instance placed in this
//! process. It runs nothing: the threaded runtime, the cluster workers and the simulation take the
//! deployed tasks and drive them.

use super::task::Task;
use crate::channel::pump::{ChannelKey, InPump, OutPump};
use crate::channel::{ChannelProbe, Waker};
use crate::dataflow::{EdgeKind, EdgePlan, JobGraph, StageCtx};
use crate::error::TaskError;
use crate::fault::Faults;
use crate::state::RestoreIndex;
use cutline_core::TaskId;
use std::any::Any;
use std::sync::Arc;

/// One deployed task and what the driver needs to know about it.
pub(crate) struct DeployedTask {
    pub task: Task,
    /// Rung when the task may have something to do.
    pub waker: Arc<Waker>,
    /// The channels this task reads.
    pub inputs: Vec<ChannelProbe>,
}

/// Where the tasks of a multi-process job run, from one process's point of view.
pub(crate) struct Placement {
    /// The worker of every task, by task id.
    pub worker_of: Vec<u32>,
    /// This process's worker.
    pub me: u32,
    /// Per worker: the waker that stands for all its tasks here (the link threads sleep on it).
    pub peer_wakers: Vec<Arc<Waker>>,
}

/// The local part of a deployment in a multi-process job: local tasks and the pumps of the channels
/// that cross to other workers, with the worker at the other end.
pub(crate) struct PlacedDeployment {
    pub tasks: Vec<DeployedTask>,
    pub outs: Vec<(ChannelKey, u32, Box<dyn OutPump>)>,
    pub ins: Vec<(ChannelKey, u32, Box<dyn InPump>)>,
}

/// Settings of one deployment.
pub(crate) struct DeployOptions<'a> {
    pub restore: &'a RestoreIndex,
    pub faults: Faults,
    /// Base of the task incarnation numbers of this deployment (unique per generation and process).
    pub incarnation_base: u64,
    /// Short id of the job (see `SinkContext::job`).
    pub job_id: String,
    pub batch_size: usize,
    /// Where keyed operators keep their state.
    pub state_backend: &'a crate::state::StateBackend,
    /// Batches per channel (credit).
    pub channel_capacity: usize,
    /// Limit of one checkpoint's channel state at one task.
    pub max_channel_state_bytes: u64,
}

/// Create channels and tasks for one generation. Task ids are dense, stage by stage.
pub(crate) fn deploy(graph: &JobGraph, opts: &DeployOptions<'_>) -> Result<Vec<DeployedTask>, TaskError> {
    Ok(deploy_placed(graph, opts, None)?.tasks)
}

/// Create the tasks of one generation that `placement` puts in this process (all of them without a
/// placement), their channels, and pumps for the channels that cross processes.
pub(crate) fn deploy_placed(
    graph: &JobGraph,
    opts: &DeployOptions<'_>,
    placement: Option<&Placement>,
) -> Result<PlacedDeployment, TaskError> {
    let this = graph;
    let bases = this.stage_bases();
    let worker_of = |stage: usize, sub: u32| placement.map(|p| p.worker_of[(bases[stage] + sub) as usize]);
    let is_local = |stage: usize, sub: u32| placement.is_none_or(|p| worker_of(stage, sub) == Some(p.me));
    if let Some(p) = placement {
        // The cluster worker checks a placement against its graph before it deploys; this is the last
        // line of defence against a placement of another graph (which would index out of bounds).
        let peers = p.peer_wakers.len();
        if p.worker_of.len() != this.task_count() || p.worker_of.iter().any(|w| *w as usize >= peers) {
            return Err(TaskError::State {
                uid: "(placement)".into(),
                message: format!(
                    "the placement names {} tasks on {peers} workers, the job graph has {} tasks: every process \
                     of a cluster must run the same job graph",
                    p.worker_of.len(),
                    this.task_count()
                ),
            });
        }
    }
    let local: Vec<Vec<bool>> =
        this.stages.iter().enumerate().map(|(si, st)| (0..st.parallelism).map(|s| is_local(si, s)).collect()).collect();
    let wakers: Vec<Vec<Arc<Waker>>> = this
        .stages
        .iter()
        .enumerate()
        .map(|(si, st)| {
            (0..st.parallelism)
                .map(|sub| match (placement, worker_of(si, sub)) {
                    (Some(p), Some(w)) if w != p.me => p.peer_wakers[w as usize].clone(),
                    _ => Waker::new(),
                })
                .collect()
        })
        .collect();
    let (mut outs, mut ins) = (Vec::new(), Vec::new());
    // Channels per edge.
    let mut up_ends: Vec<Vec<Option<Box<dyn Any + Send>>>> = Vec::new();
    let mut down_ends: Vec<Vec<Option<Box<dyn Any + Send>>>> = Vec::new();
    let mut probes: Vec<Vec<Vec<ChannelProbe>>> = Vec::new();
    for e in this.edges.iter() {
        let plan = EdgePlan {
            up: &wakers[e.from],
            down: &wakers[e.to],
            forward: e.kind == EdgeKind::Forward,
            capacity: opts.channel_capacity,
            from: &this.stages[e.from].uid,
            to: &this.stages[e.to].uid,
            local: placement.map(|_| (&local[e.from][..], &local[e.to][..])),
        };
        let mut ch = (e.channels)(&plan);
        let ei = up_ends.len() as u32;
        for (up, down, pump) in ch.outs.drain(..) {
            let peer = worker_of(e.to, down).expect("pumps only with a placement");
            outs.push((ChannelKey { edge: ei, up, down }, peer, pump));
        }
        for (up, down, pump) in ch.ins.drain(..) {
            let peer = worker_of(e.from, up).expect("pumps only with a placement");
            ins.push((ChannelKey { edge: ei, up, down }, peer, pump));
        }
        up_ends.push(ch.senders.into_iter().map(Some).collect());
        down_ends.push(ch.receivers.into_iter().map(Some).collect());
        probes.push(ch.probes);
    }
    let mut tasks = Vec::with_capacity(this.task_count());
    let mut next_id = 0u32;
    for (si, st) in this.stages.iter().enumerate() {
        let factory = st.factory.as_ref().expect("validated: every stage is closed");
        for sub in 0..st.parallelism {
            if !local[si][sub as usize] {
                // Another process runs it; its channel ends here are pumps or unused.
                next_id += 1;
                continue;
            }
            let inputs =
                st.inputs.iter().map(|&e| down_ends[e][sub as usize].take().expect("input end taken once")).collect();
            let input_probes = st.inputs.iter().flat_map(|&e| probes[e][sub as usize].iter().cloned()).collect();
            let outputs = st
                .outputs
                .iter()
                .map(|&e| (e, Some(up_ends[e][sub as usize].take().expect("output end taken once"))))
                .collect();
            let mut ctx = StageCtx {
                stage_uid: st.uid.clone(),
                subtask: sub,
                parallelism: st.parallelism,
                max_parallelism: this.max_parallelism,
                restore: opts.restore,
                faults: opts.faults.clone(),
                incarnation: opts.incarnation_base + next_id as u64,
                job_id: opts.job_id.clone(),
                batch_size: opts.batch_size,
                state_backend: opts.state_backend,
                inputs,
                outputs,
            };
            let body = factory(&mut ctx)?;
            let id = TaskId(next_id);
            next_id += 1;
            let name = format!("{}#{}", st.uid, sub);
            tasks.push(DeployedTask {
                task: Task::new(id, name, body, opts.faults.clone(), opts.max_channel_state_bytes),
                waker: wakers[si][sub as usize].clone(),
                inputs: input_probes,
            });
        }
    }
    outs.sort_by_key(|(k, _, _)| *k);
    ins.sort_by_key(|(k, _, _)| *k);
    Ok(PlacedDeployment { tasks, outs, ins })
}
