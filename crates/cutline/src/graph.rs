//! The job graph as the runtime sees it: stages (with their task factories) and edges (with their
//! channel factories), validation, and deployment of one generation: channels created, state restored,
//! one [`Task`] per parallel instance.
//!
//! It does not run anything: the threaded runtime and the simulation take the deployed tasks and drive
//! them.

use crate::fault::Faults;
use crate::message::{Message, TaskError};
use crate::state::RestoreIndex;
use crate::task::{Task, TaskBody};
use cutline_core::TaskId;
use std::any::Any;
use std::sync::Arc;

/// Everything a stage factory may use to build one task.
pub(crate) struct StageCtx<'a> {
    pub subtask: u32,
    pub parallelism: u32,
    pub max_parallelism: u32,
    pub restore: &'a RestoreIndex,
    pub faults: Faults,
    /// Unique for every incarnation of every task of this job, across restarts and processes.
    pub incarnation: u64,
    pub job_id: String,
    pub batch_size: usize,
    /// Per input edge, in the stage's input order: a boxed `Vec<Receiver<Message<T>>>`.
    pub inputs: Vec<Box<dyn Any + Send>>,
    /// The boxed `Vec<Sender<Message<T>>>` of the stage's output edge, if it has one.
    pub output: Option<Box<dyn Any + Send>>,
}

impl StageCtx<'_> {
    pub fn take_inputs<T: Send + 'static>(&mut self) -> Vec<crossbeam_channel::Receiver<Message<T>>> {
        let mut all = Vec::new();
        for b in self.inputs.drain(..) {
            let v = b
                .downcast::<Vec<crossbeam_channel::Receiver<Message<T>>>>()
                .expect("input edge carries another record type");
            all.extend(*v);
        }
        all
    }
    pub fn take_output<T: Send + 'static>(&mut self) -> Vec<crossbeam_channel::Sender<Message<T>>> {
        *self
            .output
            .take()
            .expect("stage has no output edge")
            .downcast()
            .expect("output edge carries another record type")
    }
}

pub(crate) type StageFactory = Arc<dyn Fn(&mut StageCtx<'_>) -> Result<Box<dyn TaskBody>, TaskError> + Send + Sync>;

/// Makes the channels of one edge: per upstream subtask its boxed senders, per downstream subtask its
/// boxed receivers. `capacity` None means unbounded (simulation only).
pub(crate) type ChannelFactory =
    Arc<dyn Fn(u32, u32, bool, Option<usize>) -> (Vec<Box<dyn Any + Send>>, Vec<Box<dyn Any + Send>>) + Send + Sync>;

pub(crate) fn channel_factory<T: Send + 'static>() -> ChannelFactory {
    Arc::new(|up: u32, down: u32, forward: bool, capacity: Option<usize>| {
        let make = || match capacity {
            Some(c) => crossbeam_channel::bounded::<Message<T>>(c),
            None => crossbeam_channel::unbounded::<Message<T>>(),
        };
        let mut senders: Vec<Vec<crossbeam_channel::Sender<Message<T>>>> = (0..up).map(|_| Vec::new()).collect();
        let mut receivers: Vec<Vec<crossbeam_channel::Receiver<Message<T>>>> = (0..down).map(|_| Vec::new()).collect();
        if forward {
            assert_eq!(up, down, "forward edge between different parallelisms");
            for i in 0..up as usize {
                let (s, r) = make();
                senders[i].push(s);
                receivers[i].push(r);
            }
        } else {
            // Channel (u, d): senders of u ordered by d, receivers of d ordered by u.
            for tx in senders.iter_mut() {
                for rx in receivers.iter_mut() {
                    let (s, r) = make();
                    tx.push(s);
                    rx.push(r);
                }
            }
        }
        let s = senders.into_iter().map(|v| Box::new(v) as Box<dyn Any + Send>).collect();
        let r = receivers.into_iter().map(|v| Box::new(v) as Box<dyn Any + Send>).collect();
        (s, r)
    })
}

/// Kind of an edge (for validation and display).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdgeKind {
    Forward,
    Hash,
    Rebalance,
    Broadcast,
}

pub(crate) struct StageSpec {
    pub uid: String,
    pub parallelism: u32,
    /// Ids of the stateful elements in this stage (checked against checkpoints).
    pub state_uids: Vec<String>,
    pub inputs: Vec<usize>,
    pub output: Option<usize>,
    pub factory: Option<StageFactory>,
}

pub(crate) struct EdgeSpec {
    pub from: usize,
    pub to: usize,
    pub kind: EdgeKind,
    pub channels: ChannelFactory,
}

/// A validated job graph, ready to deploy any number of times.
#[derive(Clone)]
pub struct JobGraph {
    pub(crate) name: String,
    pub(crate) max_parallelism: u32,
    pub(crate) stages: Arc<Vec<StageSpec>>,
    pub(crate) edges: Arc<Vec<EdgeSpec>>,
}

/// One deployed task and what the driver needs to know about it.
pub(crate) struct DeployedTask {
    pub task: Task,
    pub stage: usize,
    pub subtask: u32,
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
    pub channel_capacity: Option<usize>,
}

impl JobGraph {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Total number of tasks.
    pub fn task_count(&self) -> usize {
        self.stages.iter().map(|s| s.parallelism as usize).sum()
    }

    /// Every stateful element uid of the job.
    pub(crate) fn state_uids(&self) -> impl Iterator<Item = &str> {
        self.stages.iter().flat_map(|s| s.state_uids.iter().map(|u| u.as_str()))
    }

    /// A stable description of the graph's shape (stage ids, parallelism, edges).
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for st in self.stages.iter() {
            s.push_str(&format!("{}[{}]", st.uid, st.parallelism));
            if let Some(o) = st.output {
                let e = &self.edges[o];
                s.push_str(&format!(" -{:?}-> {}", e.kind, self.stages[e.to].uid));
            }
            s.push('\n');
        }
        s
    }

    /// Create channels and tasks for one generation. Task ids are dense, stage by stage.
    pub(crate) fn deploy(&self, opts: &DeployOptions<'_>) -> Result<Vec<DeployedTask>, TaskError> {
        // Channels per edge.
        let mut up_ends: Vec<Vec<Option<Box<dyn Any + Send>>>> = Vec::new();
        let mut down_ends: Vec<Vec<Option<Box<dyn Any + Send>>>> = Vec::new();
        for e in self.edges.iter() {
            let up = self.stages[e.from].parallelism;
            let down = self.stages[e.to].parallelism;
            let (s, r) = (e.channels)(up, down, e.kind == EdgeKind::Forward, opts.channel_capacity);
            up_ends.push(s.into_iter().map(Some).collect());
            down_ends.push(r.into_iter().map(Some).collect());
        }
        let mut tasks = Vec::with_capacity(self.task_count());
        let mut next_id = 0u32;
        for (si, st) in self.stages.iter().enumerate() {
            let factory = st.factory.as_ref().expect("validated: every stage is closed");
            for sub in 0..st.parallelism {
                let inputs = st
                    .inputs
                    .iter()
                    .map(|&e| down_ends[e][sub as usize].take().expect("input end taken once"))
                    .collect();
                let output = st.output.map(|e| up_ends[e][sub as usize].take().expect("output end taken once"));
                let mut ctx = StageCtx {
                    subtask: sub,
                    parallelism: st.parallelism,
                    max_parallelism: self.max_parallelism,
                    restore: opts.restore,
                    faults: opts.faults.clone(),
                    incarnation: opts.incarnation_base + next_id as u64,
                    job_id: opts.job_id.clone(),
                    batch_size: opts.batch_size,
                    inputs,
                    output,
                };
                let body = factory(&mut ctx)?;
                let id = TaskId(next_id);
                next_id += 1;
                let name = format!("{}#{}", st.uid, sub);
                tasks.push(DeployedTask {
                    task: Task::new(id, name, body, opts.faults.clone()),
                    stage: si,
                    subtask: sub,
                });
            }
        }
        Ok(tasks)
    }
}
