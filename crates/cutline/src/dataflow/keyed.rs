//! The keyed stateful operator ([`KeyedProcessOp`]): in-memory value state per key, restored by key
//! group, copied at the barrier and encoded off the task thread; and [`Output`], where its user
//! function emits records.

use super::emit::{delegate_lifecycle, Emit};
use crate::error::TaskError;
use crate::state::{key_group_of_hash, stable_hash, Key, RestoreIndex, SnapshotBuilder, StableBuild, StateValue};
use crate::state::{ElementState, StateImage};
use cutline_core::barrier::Barrier;
use cutline_core::{CheckpointId, KeyGroupRange};
use std::collections::HashMap;
use std::sync::Arc;

/// Where a keyed process function sends its output.
pub struct Output<'a, O> {
    next: &'a mut dyn Emit<O>,
    err: Option<TaskError>,
}

impl<O> Output<'_, O> {
    /// Send one record downstream.
    #[inline]
    pub fn emit(&mut self, item: O) {
        if self.err.is_none() {
            if let Err(e) = self.next.emit(item) {
                self.err = Some(e);
            }
        }
    }
}

/// The logic of a keyed operator ([`KeyedStream::process_with`](crate::KeyedStream::process_with)):
/// what it does with each record, and at the end of the input.
///
/// `state` is the key's value state: `None` when the key has none; set it to `None` to delete it.
/// State is checkpointed with the operator's uid and restored after a failure, so after a restore
/// the operator sees exactly the state that the records before the checkpoint left.
pub trait KeyedProcess<K, T, O>: Send + Sync + 'static {
    /// The value state kept per key.
    type State: StateValue;

    /// One record of key `key`.
    fn process(&self, key: &K, state: &mut Option<Self::State>, record: T, out: &mut Output<O>);

    /// The job's bounded input is exhausted: called once for every key that has state, right before
    /// the final checkpoint, so what it emits is part of the job's committed output (final results
    /// of a batch aggregation, say). Not called when the job stops with a savepoint (its input
    /// resumes later). By default it does nothing.
    fn end_of_input(&self, key: &K, state: &mut Option<Self::State>, out: &mut Output<O>) {
        let _ = (key, state, out);
    }
}

/// A closure as a [`KeyedProcess`] with no end-of-input step.
pub(crate) struct ProcessFn<F, S>(pub F, pub std::marker::PhantomData<fn() -> S>);

impl<K, T, O, S, F> KeyedProcess<K, T, O> for ProcessFn<F, S>
where
    S: StateValue,
    F: Fn(&K, &mut Option<S>, T, &mut Output<O>) + Send + Sync + 'static,
{
    type State = S;
    #[inline]
    fn process(&self, key: &K, state: &mut Option<S>, record: T, out: &mut Output<O>) {
        (self.0)(key, state, record, out)
    }
}

/// The shared logic of one keyed operator, as every task of it holds it.
pub(crate) type KeyedFn<K, T, S, O> = Arc<dyn KeyedProcess<K, T, O, State = S>>;

/// A keyed stateful operator: in-memory value state per key.
pub(crate) struct KeyedProcessOp<K, T, S, O> {
    pub uid: String,
    pub key_fn: Arc<dyn Fn(&T) -> K + Send + Sync>,
    pub f: KeyedFn<K, T, S, O>,
    pub state: HashMap<K, Option<S>, StableBuild>,
    pub range: KeyGroupRange,
    pub max_parallelism: u32,
    pub next: Box<dyn Emit<O>>,
}

impl<K: Key, T: Send + 'static, S: StateValue, O: Send + 'static> KeyedProcessOp<K, T, S, O> {
    /// Load this subtask's key groups from a checkpoint, asserting that each key belongs here.
    pub fn restore(&mut self, index: &RestoreIndex) -> Result<(), TaskError> {
        let err = |m: String| TaskError::State { uid: self.uid.clone(), message: m };
        for (kg, mut blob) in index.keyed(&self.uid, self.range, self.max_parallelism)? {
            while !blob.is_empty() {
                let ((k, v), rest): ((K, S), &[u8]) =
                    postcard::take_from_bytes(blob).map_err(|e| err(format!("decoding keyed state: {e}")))?;
                let actual = key_group_of_hash(stable_hash(&k), self.max_parallelism);
                // Checked after reading back: a key filed under another group means the key type or its
                // hashing changed since the checkpoint; restoring it would put state where no record finds it.
                if actual != kg || !self.range.contains(cutline_core::KeyGroup(kg)) {
                    return Err(err(format!(
                        "a restored key filed under key group {kg} hashes to group {actual}: the key type or its Hash changed since the checkpoint; keep the key type, or give the operator a new id to start it empty"
                    )));
                }
                if self.state.insert(k, Some(v)).is_some() {
                    return Err(err(format!(
                        "a key is stored twice in key group {kg}: the checkpoint is inconsistent"
                    )));
                }
                blob = rest;
            }
        }
        Ok(())
    }
}

impl<K: Key, T: Send + 'static, S: StateValue, O: Send + 'static> Emit<T> for KeyedProcessOp<K, T, S, O> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        let k = (self.key_fn)(&item);
        let mut out = Output { next: &mut *self.next, err: None };
        if let Some(slot) = self.state.get_mut(&k) {
            self.f.process(&k, slot, item, &mut out);
        } else {
            let mut slot = None;
            self.f.process(&k, &mut slot, item, &mut out);
            if slot.is_some() {
                self.state.insert(k, slot);
            }
        }
        match out.err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        self.state.retain(|_, v| v.is_some());
        let image = KeyedImage {
            uid: self.uid.clone(),
            map: self.state.clone(),
            range: self.range,
            max_parallelism: self.max_parallelism,
        };
        snap.add(&self.uid, Box::new(image));
        self.next.on_barrier(b, snap)
    }

    fn on_input_end(&mut self) -> Result<(), TaskError> {
        let mut out = Output { next: &mut *self.next, err: None };
        for (k, slot) in self.state.iter_mut().filter(|(_, v)| v.is_some()) {
            self.f.end_of_input(k, slot, &mut out);
            if out.err.is_some() {
                break;
            }
        }
        if let Some(e) = out.err {
            return Err(e);
        }
        self.next.on_input_end()
    }

    delegate_lifecycle!();
}

/// The synchronous copy of keyed state taken at a barrier.
struct KeyedImage<K, S> {
    uid: String,
    map: HashMap<K, Option<S>, StableBuild>,
    range: KeyGroupRange,
    max_parallelism: u32,
}

impl<K: Key, S: StateValue> StateImage for KeyedImage<K, S> {
    fn encode(self: Box<Self>) -> Result<ElementState, String> {
        let mut groups: Vec<Vec<u8>> = vec![Vec::new(); self.range.len() as usize];
        for (k, v) in &self.map {
            let Some(v) = v else { continue };
            let kg = key_group_of_hash(stable_hash(k), self.max_parallelism);
            // Invariant: the router only ever sent this subtask keys of its own key groups.
            assert!(
                self.range.contains(cutline_core::KeyGroup(kg)),
                "{}: key of key group {kg} outside {:?}",
                self.uid,
                self.range
            );
            let buf = &mut groups[(kg - self.range.start) as usize];
            let taken = std::mem::take(buf);
            *buf = postcard::to_extend(&(k, v), taken).map_err(|e| format!("{}: encoding a key: {e}", self.uid))?;
        }
        let groups = groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .map(|(i, g)| (self.range.start + i as u32, g))
            .collect();
        Ok(ElementState::Keyed { max_parallelism: self.max_parallelism, groups })
    }
}
