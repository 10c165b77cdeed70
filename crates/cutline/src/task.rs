//! One task (a parallel instance of a stage): its typed body (inputs, source, chain) behind the
//! object-safe [`TaskBody`], and its control plane [`Task`], which aligns barriers, snapshots, forwards
//! control messages and reacts to the coordinator's notifications.
//!
//! The control plane is driven from outside, one message at a time, by the threaded runtime and by the
//! single-threaded simulation alike: it never blocks, sleeps, spawns or reads a clock (time comes from
//! [`TaskEnv`]). Operators never see barriers; the chain gets control hooks instead.

use crate::api::Data;
use crate::channel::{Rx, Taken};
use crate::emit::Emit;
use crate::fault::{FaultPoint, Faults};
use crate::graph::StageCtx;
use crate::message::{Control, Message, TaskError};
use crate::source::{Source, SourceStatus};
use crate::state::{encode_plain, SnapshotBuilder};
use crate::state::{ElementState, StateImage};
use cutline_core::aligner::{AlignAction, Aligner};
use cutline_core::barrier::{Barrier, SnapshotKind};
use cutline_core::{CheckpointId, TaskId, TimeMs};
use std::collections::{BTreeMap, VecDeque};

/// What polling one input produced.
#[derive(Debug)]
pub(crate) enum Polled {
    Empty,
    /// A batch was read and pushed through the chain; `recorded` is its encoding when the task asked
    /// for it (the input records channel state).
    Data {
        recorded: Option<Vec<u8>>,
    },
    /// A barrier; `overtaken` holds the encoded batches it overtook (still queued, read later).
    Barrier {
        barrier: Barrier,
        overtaken: Vec<Vec<u8>>,
    },
    End,
    /// The upstream went away without end-of-stream: it failed or is being torn down.
    Disconnected,
}

/// A task's typed parts, type-erased.
pub(crate) trait TaskBody: Send {
    /// Number of input channels (0 for a source).
    fn inputs(&self) -> usize;
    /// Is a message (or restored channel state) waiting on input `i`?
    fn has_message(&self, i: usize) -> bool;
    /// Take one message from input `i` without blocking; a batch goes straight through the chain.
    /// Restored channel state of the input comes first. A barrier queued behind data is taken ahead of
    /// it when `overtake` allows; `record` asks for the encoding of a batch read.
    /// With `data` false (no output credit) only a barrier or end-of-stream is taken.
    fn poll_input(
        &mut self,
        i: usize,
        overtake: &dyn Fn(&Barrier) -> bool,
        record: bool,
        data: bool,
    ) -> Result<Polled, TaskError>;
    /// Encoded bytes of the data queued on input `i` (the byte limit of aligned checkpoints).
    fn queued_bytes(&self, i: usize) -> u64;
    /// May the task start work that produces output?
    fn has_credit(&self) -> bool;
    /// Sources: read up to one batch and push it through the chain.
    fn poll_source(&mut self) -> Result<SourceStatus, TaskError>;
    /// Add this body's state (source offset, chain elements) and forward the barrier.
    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError>;
    fn on_end(&mut self) -> Result<(), TaskError>;
    fn on_complete(&mut self, c: CheckpointId) -> Result<(), TaskError>;
    fn flush(&mut self) -> Result<(), TaskError>;
    fn on_start(&mut self) -> Result<(), TaskError>;
    fn on_cancel(&mut self);
}

/// Body of a task with inputs.
pub(crate) struct InputBody<T> {
    inputs: Vec<Rx<T>>,
    head: Box<dyn Emit<T>>,
    /// Restored channel state per input (encoded batches), replayed before anything new on that input.
    replay: Vec<VecDeque<Vec<u8>>>,
}

impl<T: Data> InputBody<T> {
    /// The body of one task reading `inputs`, with the channel state the restored checkpoint holds
    /// for it (see [`channel_state_uid`]).
    pub fn new(ctx: &StageCtx<'_>, inputs: Vec<Rx<T>>, head: Box<dyn Emit<T>>) -> Result<InputBody<T>, TaskError> {
        let uid = channel_state_uid(&ctx.stage_uid);
        let mut replay: Vec<VecDeque<Vec<u8>>> = inputs.iter().map(|_| VecDeque::new()).collect();
        if let Some(parts) = ctx.restore.elements.get(&uid) {
            let state_err = |message: String| TaskError::State { uid: uid.clone(), message };
            if parts.iter().any(|p| p.parallelism != ctx.parallelism) {
                return Err(state_err(format!(
                    "the restored checkpoint is unaligned and holds records in flight into {} at parallelism {}; the job now asks for {}. Restore it at the old parallelism, then take a savepoint (always aligned) and rescale from that",
                    ctx.stage_uid, parts[0].parallelism, ctx.parallelism
                )));
            }
            if let Some(bytes) = ctx.restore.plain(&uid, ctx.subtask, ctx.parallelism)? {
                let state: ChannelState =
                    postcard::from_bytes(bytes).map_err(|e| state_err(format!("decoding channel state: {e}")))?;
                if state.inputs.len() != inputs.len() {
                    return Err(state_err(format!(
                        "channel state for {} inputs, the task has {}: the job's inputs changed",
                        state.inputs.len(),
                        inputs.len()
                    )));
                }
                for (r, batches) in replay.iter_mut().zip(state.inputs) {
                    r.extend(batches);
                }
            }
        }
        Ok(InputBody { inputs, head, replay })
    }
}

/// The state element under which a stage's tasks keep their channel state.
pub(crate) fn channel_state_uid(stage_uid: &str) -> String {
    // '/' is not allowed in operator ids, so this never collides with one.
    format!("{stage_uid}/in-flight")
}

/// Records in flight into a task at an unaligned checkpoint: per input, encoded batches in order.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct ChannelState {
    pub inputs: Vec<Vec<Vec<u8>>>,
}

impl StateImage for ChannelState {
    fn encode(self: Box<Self>) -> Result<ElementState, String> {
        postcard::to_allocvec(&*self).map(ElementState::Plain).map_err(|e| format!("encoding channel state: {e}"))
    }
}

fn encode_batch<T: Data>(batch: &Vec<T>) -> Vec<u8> {
    postcard::to_allocvec(batch).expect("a record type that serde can serialise (needed for channel state)")
}

impl<T: Data> TaskBody for InputBody<T> {
    fn inputs(&self) -> usize {
        self.inputs.len()
    }
    fn has_message(&self, i: usize) -> bool {
        !self.replay[i].is_empty() || self.inputs[i].has_message()
    }
    fn poll_input(
        &mut self,
        i: usize,
        overtake: &dyn Fn(&Barrier) -> bool,
        record: bool,
        data: bool,
    ) -> Result<Polled, TaskError> {
        if !self.replay[i].is_empty() {
            if !data {
                return Ok(Polled::Empty);
            }
            let bytes = self.replay[i].pop_front().expect("non-empty");
            let batch: Vec<T> = postcard::from_bytes(&bytes).map_err(|e| TaskError::State {
                uid: "(channel state)".into(),
                message: format!("decoding a restored batch: {e}"),
            })?;
            self.head.emit_batch(batch)?;
            return Ok(Polled::Data { recorded: record.then_some(bytes) });
        }
        match self.inputs[i].poll(overtake, &encode_batch::<T>, data) {
            Taken::Msg(Message::Data(batch)) => {
                debug_assert!(!batch.is_empty());
                let recorded = record.then(|| encode_batch(&batch));
                self.head.emit_batch(batch)?;
                Ok(Polled::Data { recorded })
            }
            Taken::Msg(Message::Barrier(b)) => Ok(Polled::Barrier { barrier: b, overtaken: Vec::new() }),
            Taken::Overtook { barrier, ahead } => Ok(Polled::Barrier { barrier, overtaken: ahead }),
            Taken::Msg(Message::End) => Ok(Polled::End),
            Taken::Empty => Ok(Polled::Empty),
            Taken::Disconnected => Ok(Polled::Disconnected),
        }
    }
    fn queued_bytes(&self, i: usize) -> u64 {
        self.inputs[i].queued_bytes(&|b| encode_batch(b).len() as u64)
    }
    fn has_credit(&self) -> bool {
        self.head.has_credit()
    }
    fn poll_source(&mut self) -> Result<SourceStatus, TaskError> {
        unreachable!("not a source")
    }
    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        self.head.on_barrier(b, snap)
    }
    fn on_end(&mut self) -> Result<(), TaskError> {
        self.head.on_end()
    }
    fn on_complete(&mut self, c: CheckpointId) -> Result<(), TaskError> {
        self.head.on_complete(c)
    }
    fn flush(&mut self) -> Result<(), TaskError> {
        self.head.flush()
    }
    fn on_start(&mut self) -> Result<(), TaskError> {
        self.head.on_start()
    }
    fn on_cancel(&mut self) {
        self.head.on_cancel()
    }
}

/// Body of a source task.
pub(crate) struct SourceBody<S: Source> {
    pub uid: String,
    pub source: S,
    pub chain: Box<dyn Emit<S::Item>>,
    pub buf: Vec<S::Item>,
    pub batch_size: usize,
}

impl<S: Source> TaskBody for SourceBody<S> {
    fn inputs(&self) -> usize {
        0
    }
    fn has_message(&self, _i: usize) -> bool {
        false
    }
    fn poll_input(&mut self, _: usize, _: &dyn Fn(&Barrier) -> bool, _: bool, _: bool) -> Result<Polled, TaskError> {
        unreachable!("a source has no inputs")
    }
    fn queued_bytes(&self, _i: usize) -> u64 {
        0
    }
    fn has_credit(&self) -> bool {
        self.chain.has_credit()
    }
    fn poll_source(&mut self) -> Result<SourceStatus, TaskError> {
        let status = self
            .source
            .poll(&mut self.buf, self.batch_size)
            .map_err(|m| TaskError::Source { uid: self.uid.clone(), message: m })?;
        if !self.buf.is_empty() {
            let batch = std::mem::replace(&mut self.buf, Vec::with_capacity(self.batch_size));
            self.chain.emit_batch(batch)?;
        }
        Ok(status)
    }
    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        assert!(self.buf.is_empty(), "records buffered across a barrier");
        snap.add(&self.uid, encode_plain(&self.uid, &self.source.offset())?);
        self.chain.on_barrier(b, snap)
    }
    fn on_end(&mut self) -> Result<(), TaskError> {
        self.chain.on_end()
    }
    fn on_complete(&mut self, c: CheckpointId) -> Result<(), TaskError> {
        self.chain.on_complete(c)
    }
    fn flush(&mut self) -> Result<(), TaskError> {
        self.chain.flush()
    }
    fn on_start(&mut self) -> Result<(), TaskError> {
        self.chain.on_start()
    }
    fn on_cancel(&mut self) {
        self.chain.on_cancel()
    }
}

/// Timings and shape of one snapshot at one task.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct SnapshotTimings {
    pub alignment_ms: u64,
    pub start_delay_ms: u64,
    /// The snapshot was unaligned here (from the start, or switched).
    pub unaligned: bool,
    /// The checkpoint started aligned and this task switched it to unaligned (alignment timeout or
    /// byte limit, here or upstream).
    pub switched: bool,
    /// Bytes of in-flight records persisted as channel state.
    pub channel_state_bytes: u64,
}

/// What a task needs from whoever drives it.
pub(crate) trait TaskEnv {
    fn now(&self) -> TimeMs;
    /// The state at `barrier` is captured: persist it asynchronously and acknowledge when durable.
    fn persist(&mut self, task: TaskId, barrier: Barrier, snap: SnapshotBuilder, timings: SnapshotTimings);
    /// This task cannot take its part of `checkpoint`.
    fn decline(&mut self, task: TaskId, checkpoint: CheckpointId, reason: String);
    fn source_finished(&mut self, task: TaskId);
    fn task_finished(&mut self, task: TaskId);
}

/// Lifecycle of a source task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SourcePhase {
    Reading,
    /// Input exhausted and reported; still answering barriers.
    Exhausted,
    /// The final barrier (or a stop-with-savepoint barrier) and end-of-stream went out.
    Ended,
}

/// An unaligned snapshot waiting for its channel state: the operator state is captured, and inputs
/// that have not delivered the barrier yet add the records they read until they do.
struct Capture {
    barrier: Barrier,
    snap: SnapshotBuilder,
    timings: SnapshotTimings,
    inputs: Vec<Vec<Vec<u8>>>,
    /// Over the byte limit, or aborted: declined, nothing more is recorded or persisted.
    dropped: bool,
}

/// The control plane of one task.
pub(crate) struct Task {
    pub id: TaskId,
    pub name: String,
    body: Box<dyn TaskBody>,
    aligner: Option<Aligner>,
    faults: Faults,
    source_phase: SourcePhase,
    /// The checkpoint after which this task's input ends (final or stop-with-savepoint), once snapshotted.
    final_checkpoint: Option<CheckpointId>,
    /// End-of-stream went out on every output.
    ended: bool,
    last_completed: Option<CheckpointId>,
    finished: bool,
    started: bool,
    captures: BTreeMap<CheckpointId, Capture>,
    /// Limit of the channel state of one checkpoint at this task.
    max_channel_state_bytes: u64,
    scratch_ids: Vec<CheckpointId>,
    scratch_actions: Vec<AlignAction>,
}

impl Task {
    pub fn new(
        id: TaskId,
        name: String,
        body: Box<dyn TaskBody>,
        faults: Faults,
        max_channel_state_bytes: u64,
    ) -> Task {
        let n = body.inputs();
        let aligner = if n == 0 { None } else { Some(Aligner::new(n)) };
        Task {
            id,
            name,
            body,
            aligner,
            faults,
            source_phase: SourcePhase::Reading,
            final_checkpoint: None,
            ended: false,
            last_completed: None,
            finished: false,
            started: false,
            captures: BTreeMap::new(),
            max_channel_state_bytes,
            scratch_ids: Vec::new(),
            scratch_actions: Vec::new(),
        }
    }

    pub fn is_source(&self) -> bool {
        self.aligner.is_none()
    }
    pub fn inputs(&self) -> usize {
        self.body.inputs()
    }
    pub fn source_phase(&self) -> SourcePhase {
        self.source_phase
    }
    /// Done: end of input everywhere, final checkpoint complete, sinks committed.
    pub fn is_finished(&self) -> bool {
        self.finished
    }
    /// May input `i` be read now (not blocked by alignment, not ended)?
    pub fn readable(&self, i: usize) -> bool {
        self.aligner.as_ref().expect("has inputs").is_readable(i)
    }
    pub fn has_message(&self, i: usize) -> bool {
        self.body.has_message(i)
    }
    /// Every output channel has credit: the task may read input (or its source).
    pub fn has_credit(&self) -> bool {
        self.body.has_credit()
    }
    /// Is a checkpoint aligning here with a timeout or byte limit (the driver then calls
    /// [`Task::check_alignment`] often)?
    pub fn aligning_with_limit(&self) -> bool {
        self.aligner.as_ref().is_some_and(|a| a.timeout_candidate(TimeMs(0)).is_some())
    }

    /// A message from the coordinator.
    pub fn on_control(&mut self, c: Control, env: &mut dyn TaskEnv) -> Result<(), TaskError> {
        match c {
            Control::Trigger(b) => {
                assert!(self.is_source(), "{}: barrier trigger sent to a non-source task", self.name);
                assert_ne!(
                    self.source_phase,
                    SourcePhase::Ended,
                    "{}: trigger {} after the final barrier",
                    self.name,
                    b.checkpoint
                );
                if b.kind == SnapshotKind::Final {
                    assert_eq!(
                        self.source_phase,
                        SourcePhase::Exhausted,
                        "{}: final barrier before input was exhausted",
                        self.name
                    );
                }
                let timings = SnapshotTimings {
                    start_delay_ms: env.now().saturating_sub(b.triggered_at),
                    unaligned: b.is_unaligned(),
                    ..Default::default()
                };
                self.snapshot(b, timings, false, env)?;
                if b.kind.ends_input() {
                    self.body.on_end()?;
                    self.ended = true;
                    self.source_phase = SourcePhase::Ended;
                }
                Ok(())
            }
            Control::Complete(c) => {
                if self.last_completed.is_some_and(|l| c <= l) {
                    return Ok(()); // out-of-order notification: a newer one already covered it
                }
                self.last_completed = Some(c);
                self.body.on_complete(c)?;
                self.maybe_finish(env);
                Ok(())
            }
            Control::Abort(c) => {
                // Prepared sink data is committed by the next completed checkpoint; channel state
                // still being recorded for `c` is no longer needed.
                if let Some(cap) = self.captures.get_mut(&c) {
                    cap.dropped = true;
                    cap.inputs = Vec::new();
                }
                Ok(())
            }
            Control::Cancel => {
                self.body.on_cancel();
                Err(TaskError::Cancelled)
            }
        }
    }

    /// Sources: read one batch.
    pub fn step_source(&mut self, env: &mut dyn TaskEnv) -> Result<SourceStatus, TaskError> {
        assert!(self.is_source());
        if self.source_phase != SourcePhase::Reading {
            return Ok(SourceStatus::Finished);
        }
        self.faults.check(FaultPoint::ProcessBatch)?;
        let status = self.body.poll_source()?;
        if status == SourceStatus::Finished {
            self.body.flush()?;
            self.source_phase = SourcePhase::Exhausted;
            env.source_finished(self.id);
        }
        Ok(status)
    }

    /// Tasks with inputs: take one message from input `i` (which must be readable). False if there
    /// was none. Without output credit only a barrier or end-of-stream is taken: data must wait, but
    /// checkpoints do not.
    pub fn step_input(&mut self, i: usize, env: &mut dyn TaskEnv) -> Result<bool, TaskError> {
        assert!(self.readable(i), "{}: read from input {i}, which is blocked or ended", self.name);
        self.faults.check(FaultPoint::ProcessBatch)?;
        let mut ids = std::mem::take(&mut self.scratch_ids);
        let aligner = self.aligner.as_ref().expect("inputs");
        aligner.recording_on(i, &mut ids);
        let credit = self.body.has_credit();
        let now = env.now();
        let polled = self.body.poll_input(i, &|b| aligner.may_overtake(i, b, now), !ids.is_empty(), credit);
        let result = match polled {
            Ok(p) => self.after_poll(i, p, &ids, env),
            Err(e) => Err(e),
        };
        self.scratch_ids = ids;
        result
    }

    fn after_poll(
        &mut self,
        i: usize,
        polled: Polled,
        recording: &[CheckpointId],
        env: &mut dyn TaskEnv,
    ) -> Result<bool, TaskError> {
        match polled {
            Polled::Empty => return Ok(false),
            Polled::Data { recorded } => {
                if let Some(bytes) = recorded {
                    if let Some((last, rest)) = recording.split_last() {
                        for id in rest {
                            self.record(*id, i, bytes.clone(), env);
                        }
                        self.record(*last, i, bytes, env);
                    }
                }
            }
            Polled::Disconnected => return Err(TaskError::Disconnected),
            Polled::Barrier { barrier, overtaken } => self.on_input_barrier(i, barrier, overtaken, env)?,
            Polled::End => {
                let now = env.now();
                let mut actions = Vec::new();
                self.aligner.as_mut().expect("inputs").on_end_of_input(i, now, &mut actions);
                for a in actions {
                    self.act(a, env)?;
                }
                if self.aligner.as_ref().expect("inputs").all_ended() {
                    assert!(
                        self.final_checkpoint.is_some(),
                        "{}: every input ended without a final barrier",
                        self.name
                    );
                    assert!(self.captures.is_empty(), "{}: channel state still recording after the end", self.name);
                    self.body.on_end()?;
                    self.ended = true;
                    self.maybe_finish(env);
                }
            }
        }
        Ok(true)
    }

    /// A barrier from input `i`; `overtaken` are the batches it was taken ahead of (channel state of
    /// this input for its checkpoint: they were sent before it and are read only after the snapshot).
    fn on_input_barrier(
        &mut self,
        i: usize,
        barrier: Barrier,
        overtaken: Vec<Vec<u8>>,
        env: &mut dyn TaskEnv,
    ) -> Result<(), TaskError> {
        let id = barrier.checkpoint;
        let mut overtaken = (!overtaken.is_empty()).then_some(overtaken);
        if self.captures.contains_key(&id) {
            // Snapshotted earlier (at another input's barrier, or switched): still recording.
            for bytes in overtaken.take().into_iter().flatten() {
                self.record(id, i, bytes, env);
            }
        }
        let mut actions = std::mem::take(&mut self.scratch_actions);
        self.aligner.as_mut().expect("inputs").on_barrier(i, barrier, env.now(), &mut actions);
        let mut result = Ok(());
        for mut a in actions.drain(..) {
            if result.is_err() {
                break;
            }
            let mut complete_now = false;
            match &mut a {
                AlignAction::Snapshot { barrier: b, channel_state, .. }
                    if b.checkpoint == id && overtaken.is_some() =>
                {
                    // Its last barrier, but taken ahead of records: they still need a capture.
                    complete_now = !*channel_state;
                    *channel_state = true;
                }
                AlignAction::ChannelStateComplete { checkpoint } if *checkpoint == id => {
                    for bytes in overtaken.take().into_iter().flatten() {
                        self.record(id, i, bytes, env);
                    }
                }
                _ => {}
            }
            let snapshot_of_this = matches!(&a, AlignAction::Snapshot { barrier: b, .. } if b.checkpoint == id);
            result = self.act(a, env);
            if snapshot_of_this && result.is_ok() {
                for bytes in overtaken.take().into_iter().flatten() {
                    self.record(id, i, bytes, env);
                }
                if complete_now {
                    result = self.act(AlignAction::ChannelStateComplete { checkpoint: id }, env);
                }
            }
        }
        self.scratch_actions = actions;
        result?;
        assert!(overtaken.is_none(), "{}: barrier {id} overtook records without an unaligned snapshot", self.name);
        Ok(())
    }

    /// Switch an aligned checkpoint to unaligned when its alignment here has lasted its timeout or its
    /// blocked inputs hold more than its byte limit.
    pub fn check_alignment(&mut self, env: &mut dyn TaskEnv) -> Result<(), TaskError> {
        let Some(a) = self.aligner.as_ref() else { return Ok(()) };
        let now = env.now();
        let Some((id, aligning_ms, timeout_ms, max_bytes)) = a.timeout_candidate(now) else {
            return Ok(());
        };
        let over = aligning_ms >= timeout_ms
            || (max_bytes != u64::MAX
                && (0..self.inputs()).filter(|&i| a.is_blocked(i)).map(|i| self.body.queued_bytes(i)).sum::<u64>()
                    > max_bytes);
        if !over {
            return Ok(());
        }
        let mut actions = Vec::new();
        self.aligner.as_mut().expect("inputs").switch_to_unaligned(id, now, &mut actions);
        for a in actions {
            self.act(a, env)?;
        }
        Ok(())
    }

    fn record(&mut self, id: CheckpointId, input: usize, bytes: Vec<u8>, env: &mut dyn TaskEnv) {
        let cap = self.captures.get_mut(&id).expect("recording for a captured checkpoint");
        if cap.dropped {
            return;
        }
        cap.timings.channel_state_bytes += bytes.len() as u64;
        if cap.timings.channel_state_bytes > self.max_channel_state_bytes {
            cap.dropped = true;
            cap.inputs = Vec::new();
            env.decline(
                self.id,
                id,
                format!(
                    "{}: in-flight records of checkpoint {id} exceed the channel state limit of {} bytes; raise it, lower the channel capacity, or use aligned checkpoints",
                    self.name, self.max_channel_state_bytes
                ),
            );
            return;
        }
        cap.inputs[input].push(bytes);
    }

    /// Send partial batches downstream (when the task has nothing to read).
    pub fn flush(&mut self) -> Result<(), TaskError> {
        self.body.flush()
    }

    pub fn cancel(&mut self) {
        self.body.on_cancel()
    }

    /// Run once, before anything else, after every task of the generation was built: restored sinks
    /// finish the commits of the restored checkpoint and discard anything newer.
    pub fn start(&mut self) -> Result<(), TaskError> {
        assert!(!self.started, "{} started twice", self.name);
        self.started = true;
        self.body.on_start()
    }

    fn act(&mut self, action: AlignAction, env: &mut dyn TaskEnv) -> Result<(), TaskError> {
        match action {
            AlignAction::Snapshot { barrier, channel_state, switched, alignment_ms, start_delay_ms } => {
                let timings = SnapshotTimings {
                    alignment_ms,
                    start_delay_ms,
                    unaligned: barrier.is_unaligned(),
                    switched,
                    channel_state_bytes: 0,
                };
                self.snapshot(barrier, timings, channel_state, env)
            }
            AlignAction::ChannelStateComplete { checkpoint } => {
                let cap = self.captures.remove(&checkpoint).expect("channel state of a captured checkpoint");
                if cap.dropped {
                    return Ok(());
                }
                let Capture { barrier, mut snap, timings, inputs, .. } = cap;
                if inputs.iter().any(|v| !v.is_empty()) {
                    snap.add(&channel_state_uid(self.stage_uid()), Box::new(ChannelState { inputs }));
                }
                env.persist(self.id, barrier, snap, timings);
                Ok(())
            }
        }
    }

    fn stage_uid(&self) -> &str {
        self.name.rsplit_once('#').map(|(s, _)| s).unwrap_or(&self.name)
    }

    fn snapshot(
        &mut self,
        b: Barrier,
        timings: SnapshotTimings,
        channel_state: bool,
        env: &mut dyn TaskEnv,
    ) -> Result<(), TaskError> {
        self.faults.check(FaultPoint::Snapshot)?;
        if let Some(f) = self.final_checkpoint {
            panic!("{}: barrier {} after the final checkpoint {f}", self.name, b.checkpoint);
        }
        let mut snap = SnapshotBuilder::default();
        // Copies state and forwards the barrier on every output before any later record.
        self.body.on_barrier(&b, &mut snap)?;
        if b.kind.ends_input() {
            self.final_checkpoint = Some(b.checkpoint);
        }
        if channel_state {
            let inputs = vec![Vec::new(); self.inputs()];
            let prev =
                self.captures.insert(b.checkpoint, Capture { barrier: b, snap, timings, inputs, dropped: false });
            assert!(prev.is_none(), "{}: captured {} twice", self.name, b.checkpoint);
        } else {
            env.persist(self.id, b, snap, timings);
        }
        Ok(())
    }

    fn maybe_finish(&mut self, env: &mut dyn TaskEnv) {
        if self.finished || !self.ended {
            return;
        }
        if let (Some(f), Some(l)) = (self.final_checkpoint, self.last_completed) {
            if l >= f {
                self.finished = true;
                env.task_finished(self.id);
            }
        }
    }
}
