//! The keyed half of the dataflow API: [`KeyedStream`]'s stateful operators (`process`,
//! `process_with`, `reduce`, `aggregate`) and [`ConnectedStreams`], two inputs keyed alike.

use super::api::{ChainFn, ConnectedStreams, Either, KeyedStream, Part, Stream};
use super::body::{InputBody, TaskBody};
use super::graph::EdgeKind;
use super::keyed::{KeyedFn, KeyedProcess, KeyedProcessOp, Output, ProcessFn};
use super::keyed_state::KeyedState;
use super::router::Partitioner;
use super::timers::Timers;
use crate::channel::Data;
use crate::state::{stable_hash, Key, Migration, StateSchema, StateValue};
use cutline_core::KeyGroupRange;
use std::sync::Arc;

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Parallelism of the keyed operator (default: the job's).
    pub fn parallelism(mut self, p: u32) -> Self {
        self.parallelism = Some(p);
        self
    }

    /// Upgrade state written in an older type: when a restored checkpoint or savepoint recorded the
    /// next keyed operator's state as `Old` (same structure), every old value is read as `Old` and
    /// the operator starts with `f(old)`. For changes serde reads by itself (a new field with
    /// `#[serde(default)]`, a renamed one with `#[serde(alias = "old")]`) no migration is needed.
    /// `New` must be the state type of the operator that follows (a different one panics when the
    /// job is built).
    pub fn migrate_state<Old: StateValue, New: StateValue>(
        mut self,
        f: impl Fn(Old) -> New + Send + Sync + 'static,
    ) -> Self {
        self.migration = Some(Arc::new(Migration::<K, New>::new::<Old>(f)));
        self
    }

    /// The general keyed operator: for every record, `f(key, state, record, out)` where `state` is the
    /// key's value state (`None` when absent; set it to `None` to delete it). The state may be any
    /// serialisable value, a map included. `uid` names the state in checkpoints: keep it stable.
    pub fn process<S: StateValue, O: Send + 'static>(
        self,
        uid: &str,
        f: impl Fn(&K, &mut Option<S>, T, &mut Output<O>) + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process_with(uid, ProcessFn(f, std::marker::PhantomData))
    }

    /// The general keyed operator with its logic as a [`KeyedProcess`]: per record, and once per key
    /// at the end of a bounded input. `uid` names the state in checkpoints: keep it stable.
    pub fn process_with<P: KeyedProcess<K, T, O>, O: Send + 'static>(self, uid: &str, logic: P) -> Stream<O> {
        let job = self.stream.job.clone();
        let p = self.parallelism.unwrap_or_else(|| job.default_parallelism());
        let stage = job.add_stage(uid.to_string(), p, vec![uid.to_string()]);
        let key = self.key.clone();
        let max_parallelism = job.max_parallelism();
        let part_key = key.clone();
        let job = self.stream.close_into(
            stage,
            EdgeKind::Hash,
            Arc::new(move || {
                let k = part_key.clone();
                Partitioner::Hash { key_hash: Arc::new(move |t: &T| stable_hash(&k(t))), max_parallelism }
            }),
        );
        let f: KeyedFn<K, T, P::State, O> = Arc::new(logic);
        let migration = self.migration.map(|m| {
            m.downcast::<Migration<K, P::State>>().unwrap_or_else(|_| {
                panic!(
                    "migrate_state before the keyed operator `{uid}` makes a state type other than its `{}`",
                    std::any::type_name::<P::State>()
                )
            })
        });
        // Traced once per operator, recorded with every snapshot of its state.
        let schema = StateSchema::of::<(K, P::State)>();
        let schema = Arc::new({
            let bytes = schema.encode();
            (schema, bytes)
        });
        let uid = uid.to_string();
        let chain: ChainFn<O> = Arc::new(move |ctx, tail| {
            let inputs = ctx.take_inputs::<T>();
            let (schema, migration) = (schema.clone(), migration.clone());
            let range = KeyGroupRange::for_subtask(ctx.max_parallelism, ctx.parallelism, ctx.subtask);
            let mut op = KeyedProcessOp {
                uid: uid.clone(),
                key_fn: key.clone(),
                f: f.clone(),
                state: KeyedState::new(
                    ctx.state_backend,
                    &uid,
                    &format!("{}-{uid}-{}-{}", ctx.job_id, ctx.subtask, ctx.incarnation),
                    range,
                    ctx.max_parallelism,
                )?,
                range,
                max_parallelism: ctx.max_parallelism,
                next: tail,
                timers: Timers::new(range, ctx.max_parallelism),
                processing_timers: Timers::new(range, ctx.max_parallelism),
                watermark: cutline_core::watermark::EventTime::MIN,
                held: None,
                now_ms: 0,
                timers_per_step: ctx.batch_size.max(1),
                cmds: Vec::new(),
                schema,
                migration,
            };
            op.restore(ctx.restore, ctx.subtask, ctx.parallelism)?;
            Ok(Box::new(InputBody::new(ctx, inputs, Box::new(op))?) as Box<dyn TaskBody>)
        });
        Stream { job, parts: vec![Part::head(stage, chain)] }
    }

    /// Running reduction per key; emits the new value after every record.
    pub fn reduce(self, uid: &str, f: impl Fn(&T, &T) -> T + Send + Sync + 'static) -> Stream<T>
    where
        T: StateValue,
    {
        self.process(uid, move |_k, state: &mut Option<T>, item: T, out| {
            let next = match state.as_ref() {
                Some(acc) => f(acc, &item),
                None => item,
            };
            *state = Some(next.clone());
            out.emit(next);
        })
    }

    /// Running aggregate per key: `add` folds each record into the accumulator (created by `init`),
    /// `result` turns the key and accumulator into the record emitted after every update.
    pub fn aggregate<A: StateValue, O: Send + 'static>(
        self,
        uid: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        add: impl Fn(&mut A, T) + Send + Sync + 'static,
        result: impl Fn(&K, &A) -> O + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process(uid, move |k, state: &mut Option<A>, item: T, out| {
            let acc = state.get_or_insert_with(&init);
            add(acc, item);
            out.emit(result(k, acc));
        })
    }
}

impl<A: Data, B: Data> ConnectedStreams<A, B> {
    /// Key both inputs; the keyed operator then sees `Either::Left` / `Either::Right` records, each
    /// key's records of both inputs at the same subtask with the same state.
    pub fn key_by<K: Key>(
        self,
        left_key: impl Fn(&A) -> K + Send + Sync + 'static,
        right_key: impl Fn(&B) -> K + Send + Sync + 'static,
    ) -> KeyedStream<K, Either<A, B>> {
        let l = self.left.map(Either::Left);
        let r = self.right.map(Either::Right);
        l.union(r).key_by(move |e: &Either<A, B>| match e {
            Either::Left(a) => left_key(a),
            Either::Right(b) => right_key(b),
        })
    }
}
