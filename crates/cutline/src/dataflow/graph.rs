//! The job graph as the runtime sees it: stages (with the factories that build a task's body for one
//! subtask) and edges (with the factories that make their channels). Built by the API, deployed by the
//! runtime (`runtime::deploy`) any number of times; it runs nothing itself.

use super::body::{channel_state_uid, input_ended_uid, legacy_channel_state_uid, watermarks_uid, TaskBody};
use super::event_time::splits_uid;
use super::keyed::{processing_timers_uid, schema_uid, timers_uid, watermark_uid};
use crate::channel::pump::{in_pump, out_pump, InPump, OutPump};
use crate::channel::{channel, ChannelProbe, Data, Rx, Tx, Waker};
use crate::error::TaskError;
use crate::fault::Faults;
use crate::state::RestoreIndex;
use cutline_core::TaskId;
use std::any::Any;
use std::sync::Arc;

/// Everything a stage factory may use to build one task.
pub(crate) struct StageCtx<'a> {
    pub stage_uid: String,
    pub subtask: u32,
    pub parallelism: u32,
    pub max_parallelism: u32,
    pub restore: &'a RestoreIndex,
    pub faults: Faults,
    /// Unique for every incarnation of every task of this job, across restarts and processes.
    pub incarnation: u64,
    pub job_id: String,
    pub batch_size: usize,
    /// Where keyed operators keep their state.
    pub state_backend: &'a crate::state::StateBackend,
    /// Per input edge, in the stage's input order: a boxed `Vec<Rx<T>>`.
    pub inputs: Vec<Box<dyn Any + Send>>,
    /// Per output edge (by edge index, in the stage's output order): a boxed `Vec<Tx<T>>`.
    pub outputs: Vec<(usize, Option<Box<dyn Any + Send>>)>,
}

impl StageCtx<'_> {
    pub fn take_inputs<T: Send + 'static>(&mut self) -> Vec<Rx<T>> {
        let mut all = Vec::new();
        for b in self.inputs.drain(..) {
            let v = b.downcast::<Vec<Rx<T>>>().expect("input edge carries another record type");
            all.extend(*v);
        }
        all
    }
    /// The senders of output edge `edge`.
    pub fn take_output<T: Send + 'static>(&mut self, edge: usize) -> Vec<Tx<T>> {
        let (_, out) = self.outputs.iter_mut().find(|(e, _)| *e == edge).expect("not an output edge of this stage");
        *out.take().expect("output edge taken once").downcast().expect("output edge carries another record type")
    }
}

pub(crate) type StageFactory = Arc<dyn Fn(&mut StageCtx<'_>) -> Result<Box<dyn TaskBody>, TaskError> + Send + Sync>;

/// What the channel factory of one edge gets: the wakers of the tasks on both sides, the capacity,
/// and names for metrics.
pub(crate) struct EdgePlan<'a> {
    pub up: &'a [Arc<Waker>],
    pub down: &'a [Arc<Waker>],
    pub forward: bool,
    pub capacity: usize,
    pub from: &'a str,
    pub to: &'a str,
    /// In a multi-process job: which upstream and downstream subtasks run in this process. Channels
    /// between a local and a remote subtask get a pump instead of their remote end.
    pub local: Option<(&'a [bool], &'a [bool])>,
}

/// A pump of a channel crossing processes: (upstream subtask, downstream subtask, pump).
pub(crate) type Crossing<P> = (u32, u32, Box<P>);

/// The channels of one edge: per upstream subtask its boxed `Vec<Tx<T>>`, per downstream subtask its
/// boxed `Vec<Rx<T>>` and the probes of those channels.
pub(crate) struct EdgeChannels {
    pub senders: Vec<Box<dyn Any + Send>>,
    pub receivers: Vec<Box<dyn Any + Send>>,
    pub probes: Vec<Vec<ChannelProbe>>,
    /// Channels from a local upstream subtask to a remote downstream one.
    pub outs: Vec<Crossing<dyn OutPump>>,
    /// Channels from a remote upstream subtask to a local downstream one.
    pub ins: Vec<Crossing<dyn InPump>>,
}

/// Makes the channels of one edge.
pub(crate) type ChannelFactory = Arc<dyn Fn(&EdgePlan<'_>) -> EdgeChannels + Send + Sync>;

pub(crate) fn channel_factory<T: Data>() -> ChannelFactory {
    Arc::new(|plan: &EdgePlan<'_>| {
        let (up, down) = (plan.up.len(), plan.down.len());
        let mut senders: Vec<Vec<Tx<T>>> = (0..up).map(|_| Vec::new()).collect();
        let mut receivers: Vec<Vec<Rx<T>>> = (0..down).map(|_| Vec::new()).collect();
        let mut make = |u: usize, d: usize| {
            let name = format!("{}#{u}->{}#{d}", plan.from, plan.to);
            let (s, r) = channel::<T>(plan.capacity, plan.up[u].clone(), plan.down[d].clone(), name);
            senders[u].push(s);
            receivers[d].push(r);
        };
        if plan.forward {
            assert_eq!(up, down, "forward edge between different parallelisms");
            for i in 0..up {
                make(i, i);
            }
        } else {
            // Channel (u, d): senders of u ordered by d, receivers of d ordered by u.
            for u in 0..up {
                for d in 0..down {
                    make(u, d);
                }
            }
        }
        let mut outs: Vec<Crossing<dyn OutPump>> = Vec::new();
        let mut ins: Vec<Crossing<dyn InPump>> = Vec::new();
        if let Some((up_local, down_local)) = plan.local {
            let forward = plan.forward;
            for (d, rxs) in receivers.iter_mut().enumerate().filter(|(d, _)| !down_local[*d]) {
                for (i, rx) in rxs.drain(..).enumerate() {
                    let u = if forward { d } else { i };
                    if up_local[u] {
                        outs.push((u as u32, d as u32, out_pump(rx)));
                    }
                }
            }
            for (u, txs) in senders.iter_mut().enumerate().filter(|(u, _)| !up_local[*u]) {
                for (i, tx) in txs.drain(..).enumerate() {
                    let d = if forward { u } else { i };
                    if down_local[d] {
                        ins.push((u as u32, d as u32, in_pump(tx)));
                    }
                }
            }
        }
        let probes = receivers.iter().map(|v| v.iter().map(|r| r.probe()).collect()).collect();
        EdgeChannels {
            outs,
            ins,
            senders: senders.into_iter().map(|v| Box::new(v) as Box<dyn Any + Send>).collect(),
            receivers: receivers.into_iter().map(|v| Box::new(v) as Box<dyn Any + Send>).collect(),
            probes,
        }
    })
}

/// Kind of an edge (for validation and display).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdgeKind {
    /// Subtask `i` feeds subtask `i` of a stage of the same parallelism ([`Stream::forward`](super::Stream::forward)).
    Forward,
    /// Each record goes to the subtask that owns its key's key group
    /// ([`Stream::key_by`](super::Stream::key_by)).
    Hash,
    /// Records are spread round-robin over the downstream subtasks
    /// ([`Stream::rebalance`](super::Stream::rebalance)).
    Rebalance,
    /// Every record goes to every downstream subtask ([`Stream::broadcast`](super::Stream::broadcast)).
    Broadcast,
}

pub(crate) struct StageSpec {
    pub uid: String,
    pub parallelism: u32,
    /// Ids of the stateful elements in this stage (checked against checkpoints).
    pub state_uids: Vec<String>,
    pub inputs: Vec<usize>,
    /// Output edges: none for a stage ending in sinks, several after a fork.
    pub outputs: Vec<usize>,
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

impl JobGraph {
    /// The job's name, as given to [`Job::new`](super::Job::new).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Total number of tasks.
    pub fn task_count(&self) -> usize {
        self.stages.iter().map(|s| s.parallelism as usize).sum()
    }

    /// Every state element uid of the job: stateful operators, and the channel state of stages with
    /// inputs.
    pub(crate) fn state_uids(&self) -> Vec<String> {
        let mut v: Vec<String> = self.stages.iter().flat_map(|s| s.state_uids.iter().cloned()).collect();
        // A keyed operator keeps its timers and watermark beside its state.
        let operators = v.clone();
        v.extend(
            operators.iter().flat_map(|u| {
                [timers_uid(u), processing_timers_uid(u), watermark_uid(u), splits_uid(u), schema_uid(u)]
            }),
        );
        for s in self.stages.iter().filter(|s| !s.inputs.is_empty()) {
            v.extend([channel_state_uid(&s.uid), legacy_channel_state_uid(&s.uid), watermarks_uid(&s.uid)]);
        }
        v.extend(self.stages.iter().map(|s| input_ended_uid(&s.uid)));
        v
    }

    /// A stable description of the graph's shape (stage ids, parallelism, edges).
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for st in self.stages.iter() {
            s.push_str(&format!("{}[{}]", st.uid, st.parallelism));
            for &o in &st.outputs {
                let e = &self.edges[o];
                s.push_str(&format!(" -{:?}-> {}", e.kind, self.stages[e.to].uid));
            }
            s.push('\n');
        }
        s
    }

    /// The first task id of every stage (task ids are dense, stage by stage).
    pub(crate) fn stage_bases(&self) -> Vec<u32> {
        let mut base = 0;
        self.stages
            .iter()
            .map(|st| {
                let b = base;
                base += st.parallelism;
                b
            })
            .collect()
    }

    /// The ids of the source tasks, and the name ("stage#subtask") of every task by id.
    pub(crate) fn task_names_and_sources(&self) -> (Vec<String>, Vec<TaskId>) {
        let mut names = Vec::new();
        let mut sources = Vec::new();
        for st in self.stages.iter() {
            for sub in 0..st.parallelism {
                if st.inputs.is_empty() {
                    sources.push(TaskId(names.len() as u32));
                }
                names.push(format!("{}#{}", st.uid, sub));
            }
        }
        (names, sources)
    }
}
