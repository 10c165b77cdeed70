//! The control plane of one task (a parallel instance of a stage): [`Task`] aligns barriers,
//! snapshots, forwards control messages and reacts to the coordinator's notifications ([`Control`]),
//! around the task's typed body ([`TaskBody`]: inputs, source, chain).
//!
//! The control plane is driven from outside, one message at a time, by the threaded runtime and by the
//! single-threaded simulation alike: it never blocks, sleeps, spawns or reads a clock (time comes from
//! [`TaskEnv`]). Operators never see barriers; the chain gets control hooks instead.

use crate::channel::InFlight;
use crate::connectors::SourceStatus;
use crate::dataflow::{channel_state_uid, ChannelState, Pending, Polled, TaskBody};
use crate::error::TaskError;
use crate::fault::{FaultPoint, Faults};
use crate::state::SnapshotBuilder;
use cutline_core::aligner::{AlignAction, Aligner};
use cutline_core::barrier::{Barrier, SnapshotKind};
use cutline_core::{CheckpointId, TaskId, TimeMs};
use std::collections::BTreeMap;

/// A message from the coordinator to one task.
#[derive(Clone, Debug)]
pub(crate) enum Control {
    /// Sources only: inject this barrier before the next record.
    Trigger(Barrier),
    /// Checkpoint complete: sinks commit everything prepared up to and including it.
    Complete(CheckpointId),
    /// The checkpoint will never complete. Informational: prepared sink data stays for the next
    /// completed checkpoint; the id is kept for debugging.
    #[allow(dead_code)]
    Abort(CheckpointId),
    /// Stop now (failover or shutdown).
    Cancel,
}

pub use super::report::SnapshotTimings;

/// Checkpoints whose barrier arrivals a task keeps at most (those in flight; older ones are
/// dropped first).
const ARRIVALS_KEPT: usize = 64;

/// What a task needs from whoever drives it.
pub(crate) trait TaskEnv {
    fn now(&self) -> TimeMs;
    /// A finer clock for measuring the synchronous part of a snapshot (microseconds; the same
    /// origin as [`TaskEnv::now`]).
    fn now_us(&self) -> u64 {
        self.now().0 * 1000
    }
    /// Processing time for processing-time timers: milliseconds since the Unix epoch (virtual in
    /// the simulation).
    fn processing_time_ms(&self) -> u64;
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
    inputs: Vec<Vec<InFlight>>,
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
    /// Per checkpoint in flight, when its barrier arrived on each input (µs since its trigger).
    arrivals: BTreeMap<CheckpointId, Vec<Option<u64>>>,
    /// Sources: since when the source has reported nothing to read.
    idle_since: Option<TimeMs>,
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
            arrivals: BTreeMap::new(),
            idle_since: None,
        }
    }

    /// Sources: records read from the source since the task started.
    pub fn records_read(&self) -> u64 {
        self.body.records_read()
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
                self.maybe_finish(env)
            }
            Control::Abort(c) => {
                // Prepared sink data is committed by the next completed checkpoint; channel state
                // still being recorded for `c` is no longer needed.
                if let Some(cap) = self.captures.get_mut(&c) {
                    cap.dropped = true;
                    cap.inputs = Vec::new();
                }
                self.arrivals.remove(&c);
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
        if status == SourceStatus::Idle {
            let now = env.now();
            let since = *self.idle_since.get_or_insert(now);
            self.body.on_source_idle(now.saturating_sub(since))?;
        } else {
            self.idle_since = None;
        }
        if status == SourceStatus::Finished {
            self.body.on_source_exhausted()?;
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
                    self.maybe_finish(env)?;
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
        overtaken: Vec<InFlight>,
        env: &mut dyn TaskEnv,
    ) -> Result<(), TaskError> {
        let id = barrier.checkpoint;
        self.note_arrival(i, &barrier, env);
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

    fn record(&mut self, id: CheckpointId, input: usize, entry: InFlight, env: &mut dyn TaskEnv) {
        let cap = self.captures.get_mut(&id).expect("recording for a captured checkpoint");
        if cap.dropped {
            return;
        }
        cap.timings.channel_state_bytes += entry.size_bytes();
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
        cap.inputs[input].push(entry);
    }

    /// Work that needs no new input: due timers a watermark left over (at most one batch of them
    /// per call, so that firing many timers never keeps the task from its next barrier), and
    /// processing-time timers. Call it when the task has credit, between messages. Nothing after the
    /// task's input ended (the final or stop barrier passed): no output may follow that snapshot.
    pub fn tick(&mut self, env: &mut dyn TaskEnv) -> Result<Pending, TaskError> {
        if !self.started || self.ended || self.final_checkpoint.is_some() {
            return Ok(Pending::default());
        }
        self.body.on_tick(env.processing_time_ms())
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
                // What piled up during an aligned checkpoint's alignment: the records queued on the
                // inputs whose barrier came before this last one (one pass per input, per checkpoint).
                let blocked_records = if barrier.is_unaligned() {
                    0
                } else {
                    let last = self.arrivals.get(&barrier.checkpoint).and_then(|a| last_arrival(a));
                    (0..self.inputs()).filter(|i| Some(*i) != last).map(|i| self.body.queued_records(i)).sum()
                };
                let timings = SnapshotTimings {
                    alignment_ms,
                    start_delay_ms,
                    unaligned: barrier.is_unaligned(),
                    switched,
                    blocked_records,
                    ..Default::default()
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
                self.persist(barrier, snap, timings, env);
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
        if b.kind == SnapshotKind::Final {
            // The input is exhausted for good: what operators and sinks emit at its end belongs to
            // this, the last, checkpoint.
            self.body.on_input_end()?;
        }
        let mut snap = SnapshotBuilder { base: self.last_completed, ..Default::default() };
        let started_us = env.now_us();
        let mut timings = timings;
        timings.snapshot_at_us = started_us.saturating_sub(b.triggered_at.0.saturating_mul(1000));
        // Shares state with the snapshot and forwards the barrier on every output before any later
        // record.
        self.body.on_barrier(&b, &mut snap)?;
        timings.sync_us = env.now_us().saturating_sub(started_us);
        timings.page_copies = snap.page_copies;
        timings.saved_entries = snap.saved_entries;
        if b.kind.ends_input() {
            self.final_checkpoint = Some(b.checkpoint);
        }
        if channel_state {
            let inputs = vec![Vec::new(); self.inputs()];
            let prev =
                self.captures.insert(b.checkpoint, Capture { barrier: b, snap, timings, inputs, dropped: false });
            assert!(prev.is_none(), "{}: captured {} twice", self.name, b.checkpoint);
        } else {
            self.persist(b, snap, timings, env);
        }
        Ok(())
    }

    /// Hand a snapshot to the writers, with its barrier's arrival on every input.
    fn persist(&mut self, b: Barrier, snap: SnapshotBuilder, mut timings: SnapshotTimings, env: &mut dyn TaskEnv) {
        if let Some(arrivals) = self.arrivals.remove(&b.checkpoint) {
            timings.input_barriers_us = arrivals;
        }
        timings.handoff_at_us = env.now_us().saturating_sub(b.triggered_at.0.saturating_mul(1000));
        env.persist(self.id, b, snap, timings);
    }

    /// A barrier arrived on input `i`: when, for the checkpoint's trace.
    fn note_arrival(&mut self, i: usize, b: &Barrier, env: &mut dyn TaskEnv) {
        let at = env.now_us().saturating_sub(b.triggered_at.0.saturating_mul(1000));
        let inputs = self.inputs();
        if !self.arrivals.contains_key(&b.checkpoint) && self.arrivals.len() >= ARRIVALS_KEPT {
            self.arrivals.pop_first();
        }
        let slots = self.arrivals.entry(b.checkpoint).or_insert_with(|| vec![None; inputs]);
        if let Some(slot) = slots.get_mut(i) {
            *slot = Some(at);
        }
    }

    fn maybe_finish(&mut self, env: &mut dyn TaskEnv) -> Result<(), TaskError> {
        if self.finished || !self.ended {
            return Ok(());
        }
        if let (Some(f), Some(l)) = (self.final_checkpoint, self.last_completed) {
            if l >= f {
                self.body.on_close()?;
                self.finished = true;
                env.task_finished(self.id);
            }
        }
        Ok(())
    }
}

/// The input whose barrier arrived last (ties: the highest input).
fn last_arrival(arrivals: &[Option<u64>]) -> Option<usize> {
    arrivals.iter().enumerate().filter_map(|(i, t)| t.map(|t| (t, i))).max().map(|(_, i)| i)
}
