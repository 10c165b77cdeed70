//! The dataflow API: [`Job`], [`Stream`], [`KeyedStream`] and their operators.
//!
//! Building a job only records stages and edges with their factories; nothing runs until the job is
//! handed to a runtime. Stateless operators (`map`, `filter`, `flat_map`) are fused into the stage that
//! produces their input; `key_by` + a keyed operator, `rebalance`, `broadcast` and a sink with its own
//! parallelism start a new stage behind an edge.

use super::body::{InputBody, SourceBody, TaskBody};
use super::emit::{Emit, FilterEmit, FlatMapEmit, Identity, MapEmit};
use super::graph::{channel_factory, EdgeKind, EdgeSpec, JobGraph, StageCtx, StageFactory, StageSpec};
use super::router::{Partitioner, Router};
use super::sink_op::SinkEmit;
use crate::channel::Data;
use crate::connectors::{Sink, SinkContext, Source, SourceContext};
use crate::error::TaskError;
use crate::state::Key;
use cutline_core::DEFAULT_MAX_PARALLELISM;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// Either of two record types: the input of a two-input operator (see [`Stream::connect`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Either<A, B> {
    /// A record of the first stream (the one `connect` was called on).
    Left(A),
    /// A record of the second stream (the one passed to `connect`).
    Right(B),
}

/// A job under construction. Cheap to clone (all clones build the same job).
#[derive(Clone)]
pub struct Job {
    inner: Rc<RefCell<Builder>>,
}

struct Builder {
    name: String,
    parallelism: u32,
    max_parallelism: u32,
    stages: Vec<StageSpec>,
    edges: Vec<EdgeSpec>,
    errors: Vec<String>,
}

/// Errors found when a job is built ([`Job::build`]): every problem found, each saying what to
/// change. Nothing runs until the job builds.
#[derive(Debug, thiserror::Error)]
#[error("invalid job {job}: {}", problems.join("; "))]
pub struct GraphError {
    /// The job's name (`?` when a stream of the job was still alive and the job could not be read).
    pub job: String,
    /// The problems, in the order found: invalid or shared ids, parallelism out of range, a stream
    /// never consumed, a forward edge between different parallelisms.
    pub problems: Vec<String>,
}

pub(super) type ChainFn<T> =
    Arc<dyn Fn(&mut StageCtx<'_>, Box<dyn Emit<T>>) -> Result<Box<dyn TaskBody>, TaskError> + Send + Sync>;

/// Builds, at deploy, the tail a part's chain ends in: a router to its output edge, a sink, or
/// (at a fork) the element feeding both branches' tails.
pub(super) type TailFn<T> = Arc<dyn Fn(&mut StageCtx<'_>) -> Result<Box<dyn Emit<T>>, TaskError> + Send + Sync>;

/// Registers a fork branch's tail with its fork (build time).
pub(super) type RegisterFn<T> = Rc<dyn Fn(&Job, TailFn<T>)>;

/// What a part of a stream is, seen from its open end.
pub(super) enum Link<T> {
    /// The stage's chain up to here: given its tail, the task body.
    Head(ChainFn<T>),
    /// A branch of a fork ([`Stream::tee`], [`Stream::split`]): given the branch's tail, register
    /// it with the fork, which closes the stage once every branch is closed.
    Branch(RegisterFn<T>),
}

impl<T> Clone for Link<T> {
    fn clone(&self) -> Self {
        match self {
            Link::Head(c) => Link::Head(c.clone()),
            Link::Branch(r) => Link::Branch(r.clone()),
        }
    }
}

pub(super) struct Part<T> {
    pub(super) stage: usize,
    pub(super) link: Link<T>,
}

impl<T> Clone for Part<T> {
    fn clone(&self) -> Self {
        Part { stage: self.stage, link: self.link.clone() }
    }
}

impl<T: Send + 'static> Part<T> {
    /// The open end of a new stage's chain.
    pub(super) fn head(stage: usize, chain: ChainFn<T>) -> Part<T> {
        Part { stage, link: Link::Head(chain) }
    }

    /// End this part in `tail`: the stage's factory builds the tail, then the chain in front of it.
    pub(super) fn close(self, job: &Job, tail: TailFn<T>) {
        match self.link {
            Link::Head(chain) => {
                let factory: StageFactory = Arc::new(move |ctx| {
                    let t = tail(ctx)?;
                    chain(ctx, t)
                });
                let mut b = job.inner.borrow_mut();
                assert!(b.stages[self.stage].factory.is_none(), "stage {} closed twice", b.stages[self.stage].uid);
                b.stages[self.stage].factory = Some(factory);
            }
            Link::Branch(register) => register(job, tail),
        }
    }
}

/// A stream of records of type `T`: the open end of one or more stages.
pub struct Stream<T> {
    pub(super) job: Job,
    pub(super) parts: Vec<Part<T>>,
}

/// A stream partitioned by key: the input of keyed stateful operators.
pub struct KeyedStream<K, T> {
    pub(super) stream: Stream<T>,
    pub(super) key: Arc<dyn Fn(&T) -> K + Send + Sync>,
    pub(super) parallelism: Option<u32>,
    /// `KeyedStream::migrate_state`'s upgrade: a `Migration<K, S>` of the operator's state type.
    pub(super) migration: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

/// Two streams to be processed together by one two-input operator.
pub struct ConnectedStreams<A, B> {
    pub(super) left: Stream<A>,
    pub(super) right: Stream<B>,
}

fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 128
        && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

impl Job {
    /// A new job. Default parallelism 1, maximum parallelism (number of key groups) 128.
    pub fn new(name: impl Into<String>) -> Job {
        Job {
            inner: Rc::new(RefCell::new(Builder {
                name: name.into(),
                parallelism: 1,
                max_parallelism: DEFAULT_MAX_PARALLELISM,
                stages: Vec::new(),
                edges: Vec::new(),
                errors: Vec::new(),
            })),
        }
    }

    /// Parallelism of stages that do not set their own.
    pub fn set_parallelism(&self, p: u32) -> &Job {
        let mut b = self.inner.borrow_mut();
        if p == 0 {
            b.errors.push("parallelism must be at least 1".into());
        }
        b.parallelism = p.max(1);
        self
    }

    /// Number of key groups; the upper bound of any keyed stage's parallelism. Fixed for the life of
    /// the job's checkpoints.
    pub fn set_max_parallelism(&self, m: u32) -> &Job {
        let mut b = self.inner.borrow_mut();
        if m == 0 || m > 32_768 {
            b.errors.push(format!("max parallelism {m} outside 1..=32768"));
        }
        b.max_parallelism = m.clamp(1, 32_768);
        self
    }

    /// A problem found while building, reported by [`Job::build`].
    pub(super) fn push_error(&self, problem: String) {
        self.inner.borrow_mut().errors.push(problem);
    }

    pub(super) fn add_stage(&self, uid: String, parallelism: u32, state_uids: Vec<String>) -> usize {
        let mut b = self.inner.borrow_mut();
        if !valid_uid(&uid) {
            b.errors.push(format!("id {uid:?} must be 1-128 characters of [A-Za-z0-9_.-]"));
        }
        if parallelism == 0 {
            b.errors.push(format!("{uid}: parallelism must be at least 1"));
        }
        for u in &state_uids {
            if !valid_uid(u) {
                b.errors.push(format!("id {u:?} must be 1-128 characters of [A-Za-z0-9_.-]"));
            }
            if b.stages.iter().any(|s| s.state_uids.contains(u)) {
                b.errors.push(format!(
                    "two operators share the id {u:?}: ids must be unique, they name state in checkpoints"
                ));
            }
        }
        if b.stages.iter().any(|s| s.uid == uid) {
            b.errors.push(format!("two stages share the id {uid:?}"));
        }
        b.stages.push(StageSpec {
            uid,
            parallelism: parallelism.max(1),
            state_uids,
            inputs: vec![],
            outputs: vec![],
            factory: None,
        });
        b.stages.len() - 1
    }

    pub(super) fn default_parallelism(&self) -> u32 {
        self.inner.borrow().parallelism
    }

    pub(super) fn max_parallelism(&self) -> u32 {
        self.inner.borrow().max_parallelism
    }

    /// A source with the job's default parallelism. `uid` names its offsets in checkpoints. Each
    /// source task gets a clone of `source` (see [`Job::source_from`] to build each one instead).
    pub fn source<S: Source + Clone>(&self, uid: &str, source: S) -> Stream<S::Item> {
        let p = self.default_parallelism();
        self.source_with_parallelism(uid, p, source)
    }

    /// A source with its own parallelism; each task gets a clone of `source`.
    pub fn source_with_parallelism<S: Source + Clone>(
        &self,
        uid: &str,
        parallelism: u32,
        source: S,
    ) -> Stream<S::Item> {
        // A prototype each task clones (behind a mutex so that sources need not be `Sync`).
        let proto = std::sync::Mutex::new(source);
        self.source_from_with_parallelism(uid, parallelism, move |_| {
            proto.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
        })
    }

    /// A source with the job's default parallelism, each task's instance built by `make` (called once
    /// per task incarnation, before `open`): for sources that hold a connection or a file and cannot
    /// be cloned.
    pub fn source_from<S: Source>(
        &self,
        uid: &str,
        make: impl Fn(&SourceContext) -> S + Send + Sync + 'static,
    ) -> Stream<S::Item> {
        let p = self.default_parallelism();
        self.source_from_with_parallelism(uid, p, make)
    }

    /// A source with its own parallelism, each task's instance built by `make`.
    pub fn source_from_with_parallelism<S: Source>(
        &self,
        uid: &str,
        parallelism: u32,
        make: impl Fn(&SourceContext) -> S + Send + Sync + 'static,
    ) -> Stream<S::Item> {
        let stage = self.add_stage(uid.to_string(), parallelism, vec![uid.to_string()]);
        let uid = uid.to_string();
        let chain: ChainFn<S::Item> = Arc::new(move |ctx, tail| {
            let mut s = make(&SourceContext { uid: uid.clone(), subtask: ctx.subtask, parallelism: ctx.parallelism });
            let decode = |bytes: &[u8]| {
                postcard::from_bytes::<S::Offset>(bytes)
                    .map_err(|e| TaskError::State { uid: uid.clone(), message: format!("decoding source offset: {e}") })
            };
            // At another parallelism the source itself says where each new subtask resumes.
            let restored = match ctx.restore.plain_rescaled_complete(&uid, ctx.parallelism)? {
                Some((old, parts)) => {
                    let old_offsets = parts.into_iter().map(decode).collect::<Result<Vec<_>, _>>()?;
                    let rescaled = S::rescale(old_offsets, ctx.subtask, ctx.parallelism)
                        .map_err(|error| TaskError::Source { uid: uid.clone(), error })?;
                    match rescaled {
                        Some(o) => Some(o),
                        None => {
                            return Err(TaskError::State {
                                uid: uid.clone(),
                                message: format!(
                                    "checkpoint has it at parallelism {old}, the job now asks for {}; this source cannot change parallelism (only keyed operators and sources that implement Source::rescale can)",
                                    ctx.parallelism
                                ),
                            })
                        }
                    }
                }
                None => match ctx.restore.plain(&uid, ctx.subtask, ctx.parallelism)? {
                    Some(bytes) => Some(decode(bytes)?),
                    None => None,
                },
            };
            s.open(ctx.subtask, ctx.parallelism, restored)
                .map_err(|error| TaskError::Source { uid: uid.clone(), error })?;
            Ok(Box::new(SourceBody::new(ctx, uid.clone(), s, tail)) as Box<dyn TaskBody>)
        });
        Stream { job: self.clone(), parts: vec![Part::head(stage, chain)] }
    }

    /// Validate and freeze the graph.
    pub fn build(self) -> Result<JobGraph, GraphError> {
        let b = Rc::try_unwrap(self.inner).map_err(|_| GraphError {
            job: "?".into(),
            problems: vec![
                "a Stream of this job is still alive: consume every stream (with a sink) before build()".into()
            ],
        })?;
        let b = b.into_inner();
        let mut problems = b.errors;
        if b.stages.is_empty() {
            problems.push("the job has no stages".into());
        }
        for s in &b.stages {
            if s.factory.is_none() {
                problems.push(format!("the stream of {} is never consumed: end it with a sink", s.uid));
            }
        }
        let mut seen = HashMap::new();
        for s in &b.stages {
            if s.parallelism > b.max_parallelism
                && (!s.inputs.is_empty() && b.edges[s.inputs[0]].kind == EdgeKind::Hash)
            {
                problems.push(format!(
                    "{}: parallelism {} above max parallelism {}",
                    s.uid, s.parallelism, b.max_parallelism
                ));
            }
            *seen.entry(&s.uid).or_insert(0) += 1;
        }
        if !problems.is_empty() {
            return Err(GraphError { job: b.name, problems });
        }
        Ok(JobGraph {
            name: b.name,
            max_parallelism: b.max_parallelism,
            stages: Arc::new(b.stages),
            edges: Arc::new(b.edges),
        })
    }
}

impl<T: Send + 'static> Stream<T> {
    fn map_parts<U: Send + 'static>(
        self,
        wrap: impl Fn(Box<dyn Emit<U>>) -> Box<dyn Emit<T>> + Send + Sync + 'static,
    ) -> Stream<U> {
        self.map_parts_ctx(move |_, next| Ok(wrap(next)))
    }

    /// Like `map_parts`, with the stage's context (for elements that restore state).
    pub(super) fn map_parts_ctx<U: Send + 'static>(
        self,
        wrap: impl Fn(&StageCtx<'_>, Box<dyn Emit<U>>) -> Result<Box<dyn Emit<T>>, TaskError> + Send + Sync + 'static,
    ) -> Stream<U> {
        let wrap = Arc::new(wrap);
        let parts = self
            .parts
            .into_iter()
            .map(|p| {
                let wrap = wrap.clone();
                let link = match p.link {
                    Link::Head(prev) => Link::Head(Arc::new(move |ctx, tail| {
                        let head = wrap(ctx, tail)?;
                        prev(ctx, head)
                    })),
                    Link::Branch(register) => Link::Branch(Rc::new(move |job: &Job, tail: TailFn<U>| {
                        let wrap = wrap.clone();
                        register(
                            job,
                            Arc::new(move |ctx| {
                                let t = tail(ctx)?;
                                wrap(ctx, t)
                            }),
                        )
                    })),
                };
                Part { stage: p.stage, link }
            })
            .collect();
        Stream { job: self.job, parts }
    }

    /// Name a state element of a chain element fused into this stream's stage (one stage only:
    /// the same id in two stages would share state).
    pub(super) fn register_state_uid(&self, uid: &str) {
        let mut b = self.job.inner.borrow_mut();
        if !valid_uid(uid) {
            b.errors.push(format!("id {uid:?} must be 1-128 characters of [A-Za-z0-9_.-]"));
        }
        if self.parts.len() != 1 {
            b.errors.push(format!("{uid:?} is applied to a union of {} streams; apply it to each", self.parts.len()));
        }
        if b.stages.iter().any(|s| s.state_uids.iter().any(|u| u == uid)) {
            b.errors.push(format!("two operators share the id {uid:?}"));
        }
        if let Some(p) = self.parts.first() {
            b.stages[p.stage].state_uids.push(uid.to_string());
        }
    }

    /// Transform every record (fused into the producing stage).
    pub fn map<U: Send + 'static>(self, f: impl Fn(T) -> U + Send + Sync + 'static) -> Stream<U> {
        let f: Arc<dyn Fn(T) -> U + Send + Sync> = Arc::new(f);
        self.map_parts(move |next| Box::new(MapEmit { f: f.clone(), next }))
    }

    /// Keep the records for which `f` is true.
    pub fn filter(self, f: impl Fn(&T) -> bool + Send + Sync + 'static) -> Stream<T> {
        let f: Arc<dyn Fn(&T) -> bool + Send + Sync> = Arc::new(f);
        self.map_parts(move |next| Box::new(FilterEmit { f: f.clone(), next }))
    }

    /// Zero or more records per record: `f` pushes them into the vector it is given.
    pub fn flat_map<U: Send + 'static>(self, f: impl Fn(T, &mut Vec<U>) + Send + Sync + 'static) -> Stream<U> {
        let f: super::emit::FlatMapFn<T, U> = Arc::new(f);
        self.map_parts(move |next| Box::new(FlatMapEmit { f: f.clone(), buf: Vec::new(), next }))
    }

    /// Both streams' records as one stream (no extra stage: the next edge reads from both).
    pub fn union(mut self, other: Stream<T>) -> Stream<T> {
        assert!(Rc::ptr_eq(&self.job.inner, &other.job.inner), "union of streams of different jobs");
        self.parts.extend(other.parts);
        self
    }

    /// Process this stream and `other` together in one two-input operator.
    pub fn connect<B: Send + 'static>(self, other: Stream<B>) -> ConnectedStreams<T, B> {
        ConnectedStreams { left: self, right: other }
    }

    /// Partition by key: every record with the same key goes to the same subtask.
    pub fn key_by<K: Key>(self, key: impl Fn(&T) -> K + Send + Sync + 'static) -> KeyedStream<K, T> {
        KeyedStream { stream: self, key: Arc::new(key), parallelism: None, migration: None }
    }
}

impl<T: Data> Stream<T> {
    /// Close every part into an edge to `to`; each part's router is made by `part_fn`.
    pub(super) fn close_into(
        self,
        to: usize,
        kind: EdgeKind,
        part_fn: Arc<dyn Fn() -> Partitioner<T> + Send + Sync>,
    ) -> Job {
        let job = self.job.clone();
        for p in self.parts {
            let edge = {
                let mut b = job.inner.borrow_mut();
                let edge = b.edges.len();
                b.edges.push(EdgeSpec { from: p.stage, to, kind, channels: channel_factory::<T>() });
                b.stages[to].inputs.push(edge);
                b.stages[p.stage].outputs.push(edge);
                edge
            };
            let part_fn = part_fn.clone();
            p.close(
                &job,
                Arc::new(move |ctx| {
                    let outs = ctx.take_output::<T>(edge);
                    Ok(Box::new(Router::new(outs, part_fn(), ctx.batch_size)) as Box<dyn Emit<T>>)
                }),
            );
        }
        job
    }

    fn parallelism_of_parts(&self) -> Vec<u32> {
        let b = self.job.inner.borrow();
        self.parts.iter().map(|p| b.stages[p.stage].parallelism).collect()
    }

    /// A new pass-through stage of `parallelism` fed by `kind` edges.
    fn redistribute(
        self,
        uid: &str,
        parallelism: u32,
        kind: EdgeKind,
        part: Arc<dyn Fn() -> Partitioner<T> + Send + Sync>,
    ) -> Stream<T> {
        let job = self.job.clone();
        let stage = job.add_stage(uid.to_string(), parallelism, vec![]);
        let job = self.close_into(stage, kind, part);
        let chain: ChainFn<T> = Arc::new(|ctx, tail| {
            let inputs = ctx.take_inputs::<T>();
            Ok(Box::new(InputBody::new(ctx, inputs, Box::new(Identity { next: tail }))?) as Box<dyn TaskBody>)
        });
        Stream { job, parts: vec![Part::head(stage, chain)] }
    }

    /// Spread records round-robin over a new stage of `parallelism` tasks.
    pub fn rebalance(self, uid: &str, parallelism: u32) -> Stream<T> {
        self.redistribute(uid, parallelism, EdgeKind::Rebalance, Arc::new(|| Partitioner::Rebalance { next: 0 }))
    }

    /// Send every record to every task of a new stage of `parallelism` tasks.
    pub fn broadcast(self, uid: &str, parallelism: u32) -> Stream<T>
    where
        T: Clone,
    {
        self.redistribute(
            uid,
            parallelism,
            EdgeKind::Broadcast,
            Arc::new(|| Partitioner::Broadcast { clone: T::clone }),
        )
    }

    /// A new stage of the same parallelism, subtask i reading subtask i (every part must have it).
    pub fn forward(self, uid: &str) -> Stream<T> {
        let ps = self.parallelism_of_parts();
        let p = ps[0];
        if ps.iter().any(|q| *q != p) {
            self.job
                .inner
                .borrow_mut()
                .errors
                .push(format!("{uid}: forward edge from stages of different parallelism"));
        }
        self.redistribute(uid, p, EdgeKind::Forward, Arc::new(|| Partitioner::Forward))
    }

    /// End the stream in a sink with the upstream's parallelism, fused into the upstream task when the
    /// stream comes from one stage. `uid` names the sink's transactions in checkpoints. Each sink task
    /// gets a clone of `sink` (see [`Stream::sink_from`] to build each one instead).
    pub fn sink<S: Sink<T> + Clone>(self, uid: &str, sink: S) {
        let proto = std::sync::Mutex::new(sink);
        self.sink_from(uid, move |_| proto.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
    }

    /// End the stream in a sink of its own parallelism behind a rebalance edge.
    pub fn sink_with_parallelism<S: Sink<T> + Clone>(self, uid: &str, parallelism: u32, sink: S) {
        self.rebalance(&format!("{uid}.in"), parallelism).sink(uid, sink)
    }

    /// Like [`Stream::sink`], each task's sink built by `make` from its [`SinkContext`] (called once
    /// per task incarnation, before `open`): for sinks that hold a connection or a file and cannot be
    /// cloned.
    pub fn sink_from<S: Sink<T>>(self, uid: &str, make: impl Fn(&SinkContext) -> S + Send + Sync + 'static) {
        let stream = if self.parts.len() == 1 { self } else { self.forward(&format!("{uid}.in")) };
        let uid_s = uid.to_string();
        let job = stream.job.clone();
        let make = Arc::new(make);
        for p in stream.parts {
            {
                let mut b = job.inner.borrow_mut();
                if b.stages.iter().any(|s| s.state_uids.contains(&uid_s)) {
                    b.errors.push(format!("two operators share the id {uid_s:?}"));
                }
                if !valid_uid(&uid_s) {
                    b.errors.push(format!("id {uid_s:?} must be 1-128 characters of [A-Za-z0-9_.-]"));
                }
                b.stages[p.stage].state_uids.push(uid_s.clone());
            }
            let make = make.clone();
            let uid = uid_s.clone();
            p.close(
                &job,
                Arc::new(move |ctx| {
                    let sctx = SinkContext {
                        uid: uid.clone(),
                        subtask: ctx.subtask,
                        parallelism: ctx.parallelism,
                        incarnation: ctx.incarnation,
                        job: ctx.job_id.clone(),
                    };
                    let sink = make(&sctx);
                    Ok(Box::new(SinkEmit::open(sink, sctx, ctx.restore, ctx.faults.clone())?) as Box<dyn Emit<T>>)
                }),
            );
        }
    }

    /// Like [`Stream::sink_with_parallelism`], each task's sink built by `make`.
    pub fn sink_from_with_parallelism<S: Sink<T>>(
        self,
        uid: &str,
        parallelism: u32,
        make: impl Fn(&SinkContext) -> S + Send + Sync + 'static,
    ) {
        self.rebalance(&format!("{uid}.in"), parallelism).sink_from(uid, make)
    }
}
