//! The keyed stateful operator ([`KeyedProcessOp`]): in-memory value state per key, restored by key
//! group, copied at the barrier and encoded off the task thread; and [`Output`], where its user
//! function emits records.

use super::emit::{delegate_lifecycle, Emit};
use super::timers::{restore_event_time, TimerCmd, Timers};
use crate::error::TaskError;
use crate::state::{encode_key_groups, encode_plain, ElementState, StateImage};
use crate::state::{key_group_of_hash, stable_hash, Key, RestoreIndex, SnapshotBuilder, StableBuild, StateValue};
use cutline_core::barrier::Barrier;
use cutline_core::watermark::{EventTime, WatermarkUpdate};
use cutline_core::{CheckpointId, KeyGroupRange};
use std::collections::HashMap;
use std::sync::Arc;

/// Where a keyed process function sends its output, and how it reads event time and sets timers
/// for the key it runs for.
pub struct Output<'a, O> {
    next: &'a mut dyn Emit<O>,
    err: Option<TaskError>,
    watermark: EventTime,
    timers: &'a mut Vec<TimerCmd>,
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

    /// The operator's current watermark: every record at or below it that arrives now is late
    /// ([`EventTime::MIN`] before the first watermark).
    pub fn watermark(&self) -> EventTime {
        self.watermark
    }

    /// Set an event-time timer for this key: [`KeyedProcess::on_timer`] runs for it once the
    /// watermark reaches `time` (at the next advance if it is already there). A key has at most one
    /// timer per time; timers are checkpointed with the key's state.
    pub fn set_timer(&mut self, time: EventTime) {
        self.timers.push(TimerCmd::Set(time));
    }

    /// Cancel this key's timer at `time`, if set.
    pub fn cancel_timer(&mut self, time: EventTime) {
        self.timers.push(TimerCmd::Cancel(time));
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

    /// An event-time timer this key set ([`Output::set_timer`]) is due: the watermark reached `time`.
    /// Timers fire in time order, before the watermark goes further downstream. By default it does
    /// nothing.
    fn on_timer(&self, key: &K, state: &mut Option<Self::State>, time: EventTime, out: &mut Output<O>) {
        let _ = (key, state, time, out);
    }

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
    pub timers: Timers<K>,
    /// The operator's watermark (checkpointed with it, so lateness is judged after a restore as it
    /// was before).
    pub watermark: EventTime,
    /// Timer requests of the function call in progress.
    pub cmds: Vec<TimerCmd>,
}

/// The state element of a keyed operator's timers.
pub(crate) fn timers_uid(uid: &str) -> String {
    format!("{uid}/timers")
}

/// The state element of a keyed operator's watermark.
pub(crate) fn watermark_uid(uid: &str) -> String {
    format!("{uid}/watermark")
}

impl<K: Key, T: Send + 'static, S: StateValue, O: Send + 'static> KeyedProcessOp<K, T, S, O> {
    /// Load this subtask's key groups from a checkpoint, asserting that each key belongs here.
    pub fn restore(&mut self, index: &RestoreIndex, subtask: u32, parallelism: u32) -> Result<(), TaskError> {
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
        self.timers.restore(index, &timers_uid(&self.uid), self.range, self.max_parallelism)?;
        self.watermark = restore_event_time(index, &watermark_uid(&self.uid), subtask, parallelism)?;
        Ok(())
    }

    /// Run the function for key `k`: on `record`, or (`None`) for its due timer at `timer`; then
    /// apply its timer requests. (Inlined into the batch loop: it runs once per record.)
    #[inline(always)]
    fn call(&mut self, k: K, record: Option<T>, timer: EventTime) -> Result<(), TaskError> {
        let mut out = Output { next: &mut *self.next, err: None, watermark: self.watermark, timers: &mut self.cmds };
        let f = &*self.f;
        let inserted = match self.state.get_mut(&k) {
            Some(slot) => {
                match record {
                    Some(r) => f.process(&k, slot, r, &mut out),
                    None => f.on_timer(&k, slot, timer, &mut out),
                }
                None
            }
            None => {
                let mut slot = None;
                match record {
                    Some(r) => f.process(&k, &mut slot, r, &mut out),
                    None => f.on_timer(&k, &mut slot, timer, &mut out),
                }
                slot.is_some().then_some(slot)
            }
        };
        let err = out.err;
        if !self.cmds.is_empty() {
            self.apply_timer_cmds(&k);
        }
        if let Some(slot) = inserted {
            self.state.insert(k, slot);
        }
        match err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    #[cold]
    fn apply_timer_cmds(&mut self, k: &K) {
        for c in self.cmds.drain(..) {
            self.timers.apply(k, c);
        }
    }
}

impl<K: Key, T: Send + 'static, S: StateValue, O: Send + 'static> Emit<T> for KeyedProcessOp<K, T, S, O> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        let k = (self.key_fn)(&item);
        self.call(k, Some(item), EventTime::MIN)
    }

    fn on_watermark(&mut self, w: WatermarkUpdate) -> Result<(), TaskError> {
        // Only an advance reaches here, but a restored operator may already be at it.
        match w {
            WatermarkUpdate::At(t) if t > self.watermark => {
                self.watermark = t;
                // Timers set while firing fire in this loop too if already due.
                while let Some((time, k)) = self.timers.pop_due(t) {
                    self.call(k, None, time)?;
                }
            }
            _ => {}
        }
        self.next.on_watermark(w)
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
        if self.timers.len() > 0 {
            snap.add(&timers_uid(&self.uid), self.timers.image(&self.uid, self.range, self.max_parallelism));
        }
        if self.watermark != EventTime::MIN {
            let uid = watermark_uid(&self.uid);
            snap.add(&uid, encode_plain(&uid, &self.watermark)?);
        }
        self.next.on_barrier(b, snap)
    }

    fn on_input_end(&mut self) -> Result<(), TaskError> {
        let mut out = Output { next: &mut *self.next, err: None, watermark: self.watermark, timers: &mut self.cmds };
        for (k, slot) in self.state.iter_mut().filter(|(_, v)| v.is_some()) {
            self.f.end_of_input(k, slot, &mut out);
            if out.err.is_some() {
                break;
            }
        }
        let err = out.err;
        // Timers set here never fire: event time already ended.
        self.cmds.clear();
        if let Some(e) = err {
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
        let present = self.map.iter().filter_map(|(k, v)| v.as_ref().map(|v| (k, v)));
        encode_key_groups(&self.uid, present, self.range, self.max_parallelism)
    }
}
