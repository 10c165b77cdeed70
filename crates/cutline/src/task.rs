//! One task (a parallel instance of a stage): its typed body (inputs, source, chain) behind the
//! object-safe [`TaskBody`], and its control plane [`Task`], which aligns barriers, snapshots, forwards
//! control messages and reacts to the coordinator's notifications.
//!
//! The control plane is driven from outside, one message at a time, by the threaded runtime and by the
//! single-threaded simulation alike: it never blocks, sleeps, spawns or reads a clock (time comes from
//! [`TaskEnv`]). Operators never see barriers; the chain gets control hooks instead.

use crate::emit::Emit;
use crate::fault::{FaultPoint, Faults};
use crate::message::{Control, Message, TaskError};
use crate::source::{Source, SourceStatus};
use crate::state::{encode_plain, SnapshotBuilder};
use crossbeam_channel::{Receiver, Select, TryRecvError};
use cutline_core::aligner::{AlignAction, Aligner};
use cutline_core::barrier::{Barrier, SnapshotKind};
use cutline_core::{CheckpointId, TaskId, TimeMs};

/// What polling one input produced.
#[derive(Debug)]
pub(crate) enum Polled {
    Empty,
    /// A batch was read and pushed through the chain.
    Data,
    Barrier(Barrier),
    End,
    /// The upstream went away without end-of-stream: it failed or is being torn down.
    Disconnected,
}

/// A task's typed parts, type-erased.
pub(crate) trait TaskBody: Send {
    /// Number of input channels (0 for a source).
    fn inputs(&self) -> usize;
    /// Is a message waiting on input `i`? (The simulation's scheduler asks.)
    fn has_message(&self, i: usize) -> bool;
    /// Register input `i` on a select; returns the select's operation index.
    fn register<'a>(&'a self, i: usize, sel: &mut Select<'a>) -> usize;
    /// Take one message from input `i` without blocking; a batch goes straight through the chain.
    fn poll_input(&mut self, i: usize) -> Result<Polled, TaskError>;
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
    pub inputs: Vec<Receiver<Message<T>>>,
    pub head: Box<dyn Emit<T>>,
}

impl<T: Send + 'static> TaskBody for InputBody<T> {
    fn inputs(&self) -> usize {
        self.inputs.len()
    }
    fn has_message(&self, i: usize) -> bool {
        !self.inputs[i].is_empty()
    }
    fn register<'a>(&'a self, i: usize, sel: &mut Select<'a>) -> usize {
        sel.recv(&self.inputs[i])
    }
    fn poll_input(&mut self, i: usize) -> Result<Polled, TaskError> {
        match self.inputs[i].try_recv() {
            Ok(Message::Data(batch)) => {
                debug_assert!(!batch.is_empty());
                self.head.emit_batch(batch)?;
                Ok(Polled::Data)
            }
            Ok(Message::Barrier(b)) => Ok(Polled::Barrier(b)),
            Ok(Message::End) => Ok(Polled::End),
            Err(TryRecvError::Empty) => Ok(Polled::Empty),
            Err(TryRecvError::Disconnected) => Ok(Polled::Disconnected),
        }
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
    fn register<'a>(&'a self, _i: usize, _sel: &mut Select<'a>) -> usize {
        unreachable!("a source has no inputs")
    }
    fn poll_input(&mut self, _i: usize) -> Result<Polled, TaskError> {
        unreachable!("a source has no inputs")
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

/// Timings of one snapshot at one task.
#[derive(Clone, Copy, Debug, Default)]
pub struct SnapshotTimings {
    pub alignment_ms: u64,
    pub start_delay_ms: u64,
}

/// What a task needs from whoever drives it.
pub(crate) trait TaskEnv {
    fn now(&self) -> TimeMs;
    /// The state at `barrier` is captured: persist it asynchronously and acknowledge when durable.
    fn persist(&mut self, task: TaskId, barrier: Barrier, snap: SnapshotBuilder, timings: SnapshotTimings);
    fn source_finished(&mut self, task: TaskId);
    fn task_finished(&mut self, task: TaskId);
}

/// Lifecycle of a source task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SourcePhase {
    Reading,
    /// Input exhausted and reported; still answering barriers.
    Exhausted,
    /// The final barrier and end-of-stream went out.
    Ended,
}

/// The control plane of one task.
pub(crate) struct Task {
    pub id: TaskId,
    pub name: String,
    body: Box<dyn TaskBody>,
    aligner: Option<Aligner>,
    faults: Faults,
    source_phase: SourcePhase,
    /// The final checkpoint this task snapshotted, once it did.
    final_checkpoint: Option<CheckpointId>,
    /// End-of-stream went out on every output.
    ended: bool,
    last_completed: Option<CheckpointId>,
    finished: bool,
    started: bool,
}

impl Task {
    pub fn new(id: TaskId, name: String, body: Box<dyn TaskBody>, faults: Faults) -> Task {
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
    pub fn body(&self) -> &dyn TaskBody {
        &*self.body
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
                self.snapshot(
                    b,
                    SnapshotTimings { alignment_ms: 0, start_delay_ms: env.now().saturating_sub(b.triggered_at) },
                    env,
                )?;
                if b.kind == SnapshotKind::Final {
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
            Control::Abort(_) => Ok(()), // prepared sink data is committed by the next completed checkpoint
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

    /// Tasks with inputs: take one message from input `i` (which must be readable).
    pub fn step_input(&mut self, i: usize, env: &mut dyn TaskEnv) -> Result<Polled, TaskError> {
        assert!(self.readable(i), "{}: read from input {i}, which is blocked or ended", self.name);
        self.faults.check(FaultPoint::ProcessBatch)?;
        let polled = self.body.poll_input(i)?;
        match &polled {
            Polled::Empty | Polled::Data => {}
            Polled::Disconnected => return Err(TaskError::Disconnected),
            Polled::Barrier(b) => {
                let now = env.now();
                let action = self.aligner.as_mut().expect("inputs").on_barrier(i, *b, now);
                self.act(action, env)?;
            }
            Polled::End => {
                let now = env.now();
                let action = self.aligner.as_mut().expect("inputs").on_end_of_input(i, now);
                self.act(action, env)?;
                if self.aligner.as_ref().expect("inputs").all_ended() {
                    assert!(
                        self.final_checkpoint.is_some(),
                        "{}: every input ended without a final barrier",
                        self.name
                    );
                    self.body.on_end()?;
                    self.ended = true;
                    self.maybe_finish(env);
                }
            }
        }
        Ok(polled)
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
            AlignAction::Wait => Ok(()),
            AlignAction::Snapshot { barrier, alignment_ms, start_delay_ms } => {
                self.snapshot(barrier, SnapshotTimings { alignment_ms, start_delay_ms }, env)
            }
        }
    }

    fn snapshot(&mut self, b: Barrier, timings: SnapshotTimings, env: &mut dyn TaskEnv) -> Result<(), TaskError> {
        self.faults.check(FaultPoint::Snapshot)?;
        if let Some(f) = self.final_checkpoint {
            panic!("{}: barrier {} after the final checkpoint {f}", self.name, b.checkpoint);
        }
        let mut snap = SnapshotBuilder::default();
        // Copies state and forwards the barrier on every output before any later record.
        self.body.on_barrier(&b, &mut snap)?;
        if b.kind == SnapshotKind::Final {
            self.final_checkpoint = Some(b.checkpoint);
        }
        env.persist(self.id, b, snap, timings);
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
