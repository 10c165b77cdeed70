//! The keyed stateful operator ([`KeyedProcessOp`]): in-memory value state per key in a copy-on-write
//! table, restored by key group, shared with the snapshot at the barrier (in time that
//! does not grow with the state) and encoded off the task thread; and [`Output`], where its user
//! function emits records.

use super::emit::{delegate_lifecycle, Emit, Pending};
use super::keyed_state::KeyedState;
use super::timers::{processing_time, restore_event_time, TimeDomain, TimerCmd, Timers};
use crate::error::TaskError;
use crate::state::{encode_plain, merge_group, Evolve, KeyedLayer, Migration, PlainImage, StateSchema};
use crate::state::{key_group_of_hash, stable_hash, Key, RestoreIndex, SnapshotBuilder, StateValue};
use cutline_core::barrier::Barrier;
use cutline_core::watermark::{EventTime, WatermarkUpdate};
use cutline_core::{CheckpointId, KeyGroupRange};
use std::sync::Arc;

/// Where a keyed process function sends its output, and how it reads event and processing time
/// and sets timers for the key it runs for.
pub struct Output<'a, O> {
    next: &'a mut dyn Emit<O>,
    err: Option<TaskError>,
    watermark: EventTime,
    now_ms: u64,
    timers: &'a mut Vec<(TimeDomain, TimerCmd)>,
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

    /// Processing time: milliseconds since the Unix epoch, as the task's clock read it at the
    /// start of its current step (at most one batch ago; 0 before its first step).
    pub fn processing_time_ms(&self) -> u64 {
        self.now_ms
    }

    /// Set an event-time timer for this key: [`KeyedProcess::on_timer`] runs for it once the
    /// watermark reaches `time` (at the task's next step if it is already there). A key has at
    /// most one timer per time; timers are checkpointed with the key's state.
    pub fn set_timer(&mut self, time: EventTime) {
        self.timers.push((TimeDomain::Event, TimerCmd::Set(time)));
    }

    /// Cancel this key's event-time timer at `time`, if set.
    pub fn cancel_timer(&mut self, time: EventTime) {
        self.timers.push((TimeDomain::Event, TimerCmd::Cancel(time)));
    }

    /// Set a processing-time timer for this key: [`KeyedProcess::on_processing_timer`] runs for it
    /// once the task's clock reaches `time_ms` (milliseconds since the Unix epoch). Checkpointed
    /// with the key's state; one restored in the past fires right after the restore.
    pub fn set_processing_timer(&mut self, time_ms: u64) {
        self.timers.push((TimeDomain::Processing, TimerCmd::Set(processing_time(time_ms))));
    }

    /// Cancel this key's processing-time timer at `time_ms`, if set.
    pub fn cancel_processing_timer(&mut self, time_ms: u64) {
        self.timers.push((TimeDomain::Processing, TimerCmd::Cancel(processing_time(time_ms))));
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

    /// A processing-time timer this key set ([`Output::set_processing_timer`]) is due: the task's
    /// clock reached `time_ms`. Processing-time timers still pending when a bounded input ends do
    /// not fire (use [`KeyedProcess::end_of_input`]). By default it does nothing.
    fn on_processing_timer(&self, key: &K, state: &mut Option<Self::State>, time_ms: u64, out: &mut Output<O>) {
        let _ = (key, state, time_ms, out);
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
    /// The value state, in the job's backend. A key whose state a call set to `None` is removed
    /// after the call (only `end_of_input` may leave one behind, and snapshots skip it).
    pub state: KeyedState<K, S>,
    pub range: KeyGroupRange,
    pub max_parallelism: u32,
    pub next: Box<dyn Emit<O>>,
    /// Event-time timers.
    pub timers: Timers<K>,
    /// Processing-time timers (times in milliseconds since the Unix epoch).
    pub processing_timers: Timers<K>,
    /// The operator's watermark (checkpointed with it, so lateness is judged after a restore as it
    /// was before).
    pub watermark: EventTime,
    /// The watermark (or idleness) to pass downstream once every timer due at `watermark` fired.
    pub held: Option<WatermarkUpdate>,
    /// Processing time at the task's last step.
    pub now_ms: u64,
    /// Timers fired per step at most (the task's batch size).
    pub timers_per_step: usize,
    /// Timer requests of the function call in progress.
    pub cmds: Vec<(TimeDomain, TimerCmd)>,
    /// The structure of `(K, S)`, recorded with the state, and its encoding.
    pub schema: Arc<(StateSchema, Vec<u8>)>,
    /// The user's upgrade of state in an older type, if any.
    pub migration: Option<Arc<Migration<K, S>>>,
}

/// What a keyed function is called for.
enum Call<T> {
    Record(T),
    Timer(EventTime),
    ProcessingTimer(u64),
}

/// The state element of a keyed operator's timers.
pub(crate) fn timers_uid(uid: &str) -> String {
    format!("{uid}/timers")
}

/// The state element of a keyed operator's processing-time timers.
pub(crate) fn processing_timers_uid(uid: &str) -> String {
    format!("{uid}/processing-timers")
}

/// The state element of the structure of a keyed operator's state type.
pub(crate) fn schema_uid(uid: &str) -> String {
    format!("{uid}/schema")
}

/// The state element of a keyed operator's watermark.
pub(crate) fn watermark_uid(uid: &str) -> String {
    format!("{uid}/watermark")
}

impl<K: Key, T: Send + 'static, S: StateValue, O: Send + 'static> KeyedProcessOp<K, T, S, O> {
    /// Load this subtask's key groups from a checkpoint, asserting that each key belongs here.
    pub fn restore(&mut self, index: &RestoreIndex, subtask: u32, parallelism: u32) -> Result<(), TaskError> {
        let err = |m: String| TaskError::State { uid: self.uid.clone(), message: m };
        let recorded = match index.plain_all(&schema_uid(&self.uid))?.first() {
            Some(b) => Some(StateSchema::decode(b).map_err(err)?),
            None => None, // written before schemas were recorded: read as it is
        };
        let now = &self.schema.0;
        let migration = self.migration.as_deref().filter(|m| recorded.as_ref().is_none_or(|old| m.from.same_as(old)));
        let evolve = match &recorded {
            Some(old) if !old.same_as(now) && migration.is_none() => Some(Evolve::new(old).map_err(err)?.ok_or_else(|| {
                err(format!(
                    "the state was written as `{}` and the operator now keeps `{}`; the old type's structure is not recorded (it could not be traced), so the change cannot be checked: keep the old type, upgrade it with KeyedStream::migrate_state, or give the operator a new uid to start it empty",
                    old.type_name, now.type_name
                ))
            })?),
            _ => None,
        };
        let changed = |old: &StateSchema, e: String| {
            err(format!(
                "the state was written as `{}` and does not read as `{}`: {e}. Keep the old type, make the change compatible (a new field with #[serde(default)], a renamed field with #[serde(alias = \"old name\")]), upgrade it with KeyedStream::migrate_state, or give the operator a new uid to start it empty",
                old.type_name, now.type_name
            ))
        };
        let take_pair = |blob: &[u8]| -> Result<((K, S), usize), TaskError> {
            let (pair, rest): ((K, S), &[u8]) = match (&evolve, &recorded, migration) {
                (_, _, Some(m)) => m
                    .take(blob)
                    .map_err(|e| err(format!("reading state as `{}` to migrate it: {e}", m.from.type_name)))?,
                (Some(ev), Some(old), None) => ev.take(blob).map_err(|e| changed(old, e))?,
                _ => postcard::take_from_bytes(blob).map_err(|e| err(format!("decoding keyed state: {e}")))?,
            };
            Ok((pair, blob.len() - rest.len()))
        };
        // Checked after reading back: a key filed under another group means the key type or its
        // hashing changed since the checkpoint; restoring it would put state where no record finds it.
        let check_group = |k: &K, kg: u32| {
            let actual = key_group_of_hash(stable_hash(k), self.max_parallelism);
            if actual != kg || !self.range.contains(cutline_core::KeyGroup(kg)) {
                return Err(err(format!(
                    "a restored key filed under key group {kg} hashes to group {actual}: the key type or its Hash changed since the checkpoint; keep the key type, or give the operator a new id to start it empty"
                )));
            }
            Ok(())
        };
        self.state.restoring(&self.uid, true)?;
        let mut layers = index.keyed(&self.uid, self.range, self.max_parallelism)?;
        if self.state.restores_sorted() && evolve.is_none() && migration.is_none() {
            // Group by group, each in key order, its records' bytes copied as the checkpoint holds
            // them (the stored form; decoded only to check them): the store takes them without
            // re-encoding, and a group the task may touch only later can wait in memory.
            let mut by_group: std::collections::BTreeMap<u32, Vec<KeyedLayer<'_>>> = Default::default();
            for (kg, layer) in std::mem::take(&mut layers) {
                by_group.entry(kg).or_default().push(layer);
            }
            for (kg, layers) in by_group {
                let split = |bytes: &[u8], with_value: bool| -> Result<(usize, usize), TaskError> {
                    let (k, rest): (K, &[u8]) =
                        postcard::take_from_bytes(bytes).map_err(|e| err(format!("decoding keyed state: {e}")))?;
                    check_group(&k, kg)?;
                    let key_len = bytes.len() - rest.len();
                    if !with_value {
                        return Ok((key_len, key_len));
                    }
                    let (_, rest): (S, &[u8]) =
                        postcard::take_from_bytes(rest).map_err(|e| err(format!("decoding keyed state: {e}")))?;
                    Ok((key_len, bytes.len() - rest.len()))
                };
                let duplicate =
                    || err(format!("a key is stored twice in key group {kg}: the checkpoint is inconsistent"));
                let records = merge_group(&layers, split, duplicate)?;
                self.state.restore_sorted(&self.uid, kg, &records)?;
            }
        }
        // Key by key otherwise (and for state read in an older type or migrated).
        for (kg, layer) in layers {
            let (mut removes, mut upserts, whole) = match layer {
                KeyedLayer::Whole(b) => (&[][..], b, true),
                KeyedLayer::Delta { removes, upserts } => (removes, upserts, false),
            };
            while !removes.is_empty() {
                let (k, rest): (K, &[u8]) =
                    postcard::take_from_bytes(removes).map_err(|e| err(format!("decoding a removed key: {e}")))?;
                check_group(&k, kg)?;
                self.state.remove(&self.uid, &k)?;
                removes = rest;
            }
            while !upserts.is_empty() {
                let ((k, v), used) = take_pair(upserts)?;
                check_group(&k, kg)?;
                if self.state.insert(&self.uid, k, Some(v))? && whole {
                    return Err(err(format!(
                        "a key is stored twice in key group {kg}: the checkpoint is inconsistent"
                    )));
                }
                upserts = &upserts[used..];
            }
        }
        self.state.restoring(&self.uid, false)?;
        self.timers.restore(index, &timers_uid(&self.uid))?;
        self.processing_timers.restore(index, &processing_timers_uid(&self.uid))?;
        self.watermark = restore_event_time(index, &watermark_uid(&self.uid), subtask, parallelism)?;
        if self.watermark != EventTime::MIN {
            // Downstream may not have seen it yet (it goes on after the timers due at it fired,
            // which may have been after the checkpoint): send it again once they have fired.
            self.held = Some(WatermarkUpdate::At(self.watermark));
        }
        Ok(())
    }

    /// Run the function for key `k` on `call`, then apply its timer requests. (Inlined into the
    /// batch loop: it runs once per record.)
    #[inline(always)]
    fn call(&mut self, k: K, call: Call<T>) -> Result<(), TaskError> {
        let mut out = Output {
            next: &mut *self.next,
            err: None,
            watermark: self.watermark,
            now_ms: self.now_ms,
            timers: &mut self.cmds,
        };
        let f = &*self.f;
        let run = |slot: &mut Option<S>, out: &mut Output<O>| match call {
            Call::Record(r) => f.process(&k, slot, r, out),
            Call::Timer(t) => f.on_timer(&k, slot, t, out),
            Call::ProcessingTimer(t) => f.on_processing_timer(&k, slot, t, out),
        };
        let inserted = match self.state.get_mut(&self.uid, &k)? {
            Some(slot) => {
                run(slot, &mut out);
                if slot.is_none() {
                    self.state.remove(&self.uid, &k)?;
                }
                None
            }
            None => {
                let mut slot = None;
                run(&mut slot, &mut out);
                slot.is_some().then_some(slot)
            }
        };
        let err = out.err;
        if !self.cmds.is_empty() {
            self.apply_timer_cmds(&k);
        }
        if let Some(slot) = inserted {
            self.state.insert(&self.uid, k, slot)?;
        }
        match err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    #[cold]
    fn apply_timer_cmds(&mut self, k: &K) {
        for c in self.cmds.drain(..) {
            match c {
                (TimeDomain::Event, c) => self.timers.apply(k, c),
                (TimeDomain::Processing, c) => self.processing_timers.apply(k, c),
            }
        }
    }

    /// Fire up to `budget` event-time timers due at the operator's watermark; once none is due,
    /// pass the held watermark on. How many fired.
    fn fire_due(&mut self, budget: usize) -> Result<usize, TaskError> {
        let mut fired = 0;
        while fired < budget {
            let Some((time, k)) = self.timers.pop_due(self.watermark) else {
                if let Some(w) = self.held.take() {
                    self.next.on_watermark(w)?;
                }
                return Ok(fired);
            };
            self.call(k, Call::Timer(time))?;
            fired += 1;
        }
        Ok(fired)
    }
}

impl<K: Key, T: Send + 'static, S: StateValue, O: Send + 'static> Emit<T> for KeyedProcessOp<K, T, S, O> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        let k = (self.key_fn)(&item);
        self.call(k, Call::Record(item))
    }

    fn on_watermark(&mut self, w: WatermarkUpdate) -> Result<(), TaskError> {
        // The timers due at it fire first (one step's worth now, the rest at the next ticks), then
        // it goes on; a newer update replaces one still held.
        self.held = Some(match w {
            WatermarkUpdate::At(t) => {
                self.watermark = self.watermark.max(t);
                WatermarkUpdate::At(self.watermark)
            }
            WatermarkUpdate::Idle => WatermarkUpdate::Idle,
        });
        self.fire_due(self.timers_per_step)?;
        Ok(())
    }

    fn on_tick(&mut self, now_ms: u64) -> Result<Pending, TaskError> {
        self.now_ms = now_ms;
        let mut budget = self.timers_per_step - self.fire_due(self.timers_per_step)?;
        let now = processing_time(now_ms);
        while budget > 0 {
            let Some((time, k)) = self.processing_timers.pop_due(now) else { break };
            self.call(k, Call::ProcessingTimer(time.0 as u64))?;
            budget -= 1;
        }
        let mine = Pending {
            more: budget == 0 && (self.held.is_some() || self.processing_timers.next_time().is_some_and(|t| t <= now)),
            next_timer_ms: self.processing_timers.next_time().map(|t| t.0 as u64),
        };
        Ok(mine.and(self.next.on_tick(now_ms)?))
    }

    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        let copies = self.state.take_copies() + self.timers.take_copies() + self.processing_timers.take_copies();
        snap.page_copies += copies.pages;
        snap.saved_entries += copies.entries;
        let image = self.state.image(&self.uid, b.checkpoint, snap.base)?;
        snap.add(&self.uid, image);
        snap.add(&schema_uid(&self.uid), Box::new(PlainImage(self.schema.1.clone())));
        if self.timers.len() > 0 {
            snap.add(&timers_uid(&self.uid), self.timers.image(&self.uid, b.checkpoint, snap.base));
        }
        if self.processing_timers.len() > 0 {
            let uid = processing_timers_uid(&self.uid);
            let image = self.processing_timers.image(&uid, b.checkpoint, snap.base);
            snap.add(&uid, image);
        }
        if self.watermark != EventTime::MIN {
            let uid = watermark_uid(&self.uid);
            snap.add(&uid, encode_plain(&uid, &self.watermark)?);
        }
        self.next.on_barrier(b, snap)
    }

    fn on_input_end(&mut self) -> Result<(), TaskError> {
        // Every timer due at the final watermark fires now, whatever the step budget: nothing may
        // be left for after the final snapshot.
        self.fire_due(usize::MAX)?;
        let mut out = Output {
            next: &mut *self.next,
            err: None,
            watermark: self.watermark,
            now_ms: self.now_ms,
            timers: &mut self.cmds,
        };
        let f = &*self.f;
        self.state.for_each_mut(&self.uid, |k, slot| {
            f.end_of_input(k, slot, &mut out);
            out.err.is_none()
        })?;
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
