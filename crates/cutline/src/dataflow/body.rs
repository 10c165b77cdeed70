//! A task's typed parts behind the object-safe [`TaskBody`]: the inputs and chain of a task with
//! inputs ([`InputBody`], which replays restored channel state before anything new on an input), or
//! the source and chain of a source task ([`SourceBody`]). The runtime's task control plane drives a
//! body without knowing its record types.

use super::emit::{Emit, Pending};
use super::graph::StageCtx;
use crate::channel::{Data, InFlight, Message, Rx, Taken};
use crate::connectors::{Source, SourceStatus, SplitId};
use crate::error::{ConnectorError, TaskError};
use crate::state::{encode_plain, ElementState, Encoded, SnapshotBuilder, StateImage};
use cutline_core::barrier::Barrier;
use cutline_core::watermark::{EventTime, WatermarkImage, WatermarkTracker, WatermarkUpdate};
use cutline_core::CheckpointId;
use std::collections::VecDeque;

/// What polling one input produced.
#[derive(Debug)]
pub(crate) enum Polled {
    Empty,
    /// A batch or a watermark was read and pushed through the chain; `recorded` is it as channel
    /// state when the task asked for it (the input records channel state).
    Data {
        recorded: Option<InFlight>,
    },
    /// A barrier; `overtaken` holds the batches and watermarks it overtook (still queued, read later).
    Barrier {
        barrier: Barrier,
        overtaken: Vec<InFlight>,
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
    /// Records of the data queued on input `i` (what piled up during an alignment).
    fn queued_records(&self, _i: usize) -> u64 {
        0
    }
    /// May the task start work that produces output?
    fn has_credit(&self) -> bool;
    /// Sources: read up to one batch and push it through the chain.
    fn poll_source(&mut self) -> Result<SourceStatus, TaskError>;
    /// Sources: records read from the source since the task started (0 for other tasks).
    fn records_read(&self) -> u64 {
        0
    }
    /// Sources: the input is exhausted; event time ends ([`EventTime::MAX`] goes down the chain,
    /// so every timer downstream fires before the final checkpoint).
    fn on_source_exhausted(&mut self) -> Result<(), TaskError>;
    /// Sources: the source has produced nothing for `idle_ms` milliseconds.
    fn on_source_idle(&mut self, idle_ms: u64) -> Result<(), TaskError>;
    /// Work without new input (timers), at processing time `now_ms` (see [`Emit::on_tick`]).
    fn on_tick(&mut self, now_ms: u64) -> Result<Pending, TaskError>;
    /// Add this body's state (source offset, chain elements) and forward the barrier.
    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError>;
    /// The final barrier aligned: the chain emits what waits for the end of input (before the
    /// barrier's snapshot).
    fn on_input_end(&mut self) -> Result<(), TaskError>;
    fn on_end(&mut self) -> Result<(), TaskError>;
    fn on_complete(&mut self, c: CheckpointId) -> Result<(), TaskError>;
    /// The task ends normally (input ended, the checkpoint that ends it complete).
    fn on_close(&mut self) -> Result<(), TaskError>;
    fn flush(&mut self) -> Result<(), TaskError>;
    fn on_start(&mut self) -> Result<(), TaskError>;
    fn on_cancel(&mut self);
}

/// Body of a task with inputs.
pub(crate) struct InputBody<T> {
    inputs: Vec<Rx<T>>,
    head: Box<dyn Emit<T>>,
    /// Restored channel state per input, replayed before anything new on that input.
    replay: Vec<VecDeque<InFlight>>,
    /// The inputs' watermarks combined into this task's (checkpointed).
    watermarks: WatermarkTracker,
    /// The end-of-input hooks ran (in this incarnation, or before the restored checkpoint).
    input_ended: bool,
    stage_uid: String,
}

impl<T: Data> InputBody<T> {
    /// The body of one task reading `inputs`, with the channel state the restored checkpoint holds
    /// for it (see [`channel_state_uid`]).
    pub fn new(ctx: &StageCtx<'_>, inputs: Vec<Rx<T>>, head: Box<dyn Emit<T>>) -> Result<InputBody<T>, TaskError> {
        let mut replay: Vec<VecDeque<InFlight>> = inputs.iter().map(|_| VecDeque::new()).collect();
        for (uid, batches_only) in
            [(channel_state_uid(&ctx.stage_uid), false), (legacy_channel_state_uid(&ctx.stage_uid), true)]
        {
            restore_channel_state(ctx, &uid, batches_only, &mut replay)?;
        }
        let watermarks = restore_watermarks(ctx, inputs.len())?;
        Ok(InputBody {
            inputs,
            head,
            replay,
            watermarks,
            input_ended: ended_before(ctx),
            stage_uid: ctx.stage_uid.clone(),
        })
    }
}

/// The task's watermarks as the restored checkpoint has them; at another parallelism the lowest of
/// the old subtasks' (no input is assumed ahead of any old subtask).
fn restore_watermarks(ctx: &StageCtx<'_>, inputs: usize) -> Result<WatermarkTracker, TaskError> {
    let uid = watermarks_uid(&ctx.stage_uid);
    let decode = |bytes: &[u8]| {
        postcard::from_bytes::<WatermarkImage>(bytes)
            .map_err(|e| TaskError::State { uid: uid.clone(), message: format!("decoding watermarks: {e}") })
    };
    if let Some((old_parallelism, old)) = ctx.restore.plain_rescaled(&uid, ctx.parallelism)? {
        // An old subtask that recorded nothing had heard no watermark: the lowest is then MIN.
        let mut current = if old.len() < old_parallelism as usize { EventTime::MIN } else { EventTime::MAX };
        for bytes in old {
            current = current.min(decode(bytes)?.current);
        }
        return Ok(WatermarkTracker::restored(WatermarkImage { inputs: Vec::new(), current, idle: false }, inputs));
    }
    Ok(match ctx.restore.plain(&uid, ctx.subtask, ctx.parallelism)? {
        Some(bytes) => WatermarkTracker::restored(decode(bytes)?, inputs),
        None => WatermarkTracker::new(inputs),
    })
}

/// Add the channel state element `uid` of the restored checkpoint to `replay` (`batches_only`: the
/// format before watermarks, encoded batches only).
fn restore_channel_state(
    ctx: &StageCtx<'_>,
    uid: &str,
    batches_only: bool,
    replay: &mut [VecDeque<InFlight>],
) -> Result<(), TaskError> {
    let Some(parts) = ctx.restore.elements.get(uid) else { return Ok(()) };
    let state_err = |message: String| TaskError::State { uid: uid.to_string(), message };
    if parts.iter().any(|p| p.parallelism != ctx.parallelism) {
        return Err(state_err(format!(
            "the restored checkpoint is unaligned and holds records in flight into {} at parallelism {}; the job now asks for {}. Restore it at the old parallelism, then take a savepoint (always aligned) and rescale from that",
            ctx.stage_uid, parts[0].parallelism, ctx.parallelism
        )));
    }
    let Some(bytes) = ctx.restore.plain(uid, ctx.subtask, ctx.parallelism)? else { return Ok(()) };
    let decode_err = |e: postcard::Error| state_err(format!("decoding channel state: {e}"));
    let inputs: Vec<Vec<InFlight>> = if batches_only {
        let legacy: LegacyChannelState = postcard::from_bytes(bytes).map_err(decode_err)?;
        legacy.inputs.into_iter().map(|v| v.into_iter().map(InFlight::Batch).collect()).collect()
    } else {
        postcard::from_bytes::<ChannelState>(bytes).map_err(decode_err)?.inputs
    };
    if inputs.len() != replay.len() {
        return Err(state_err(format!(
            "channel state for {} inputs, the task has {}: the job's inputs changed",
            inputs.len(),
            replay.len()
        )));
    }
    for (r, entries) in replay.iter_mut().zip(inputs) {
        r.extend(entries);
    }
    Ok(())
}

/// The state element by which a stage's tasks record, in every checkpoint after the end of the input,
/// that the end-of-input hooks already ran (their output is committed with the final checkpoint; a
/// restore of it, or of a later checkpoint, must not run them again).
pub(crate) fn input_ended_uid(stage_uid: &str) -> String {
    format!("{stage_uid}/input-ended")
}

/// Did the end-of-input hooks of `stage_uid` run before the checkpoint being restored?
fn ended_before(ctx: &StageCtx<'_>) -> bool {
    ctx.restore.input_ended || ctx.restore.elements.contains_key(&input_ended_uid(&ctx.stage_uid))
}

/// The state element under which a stage's tasks keep their channel state.
pub(crate) fn channel_state_uid(stage_uid: &str) -> String {
    // '/' is not allowed in operator ids, so this never collides with one.
    format!("{stage_uid}/channel-state")
}

/// Where builds before watermarks kept channel state (encoded batches only); still restored.
pub(crate) fn legacy_channel_state_uid(stage_uid: &str) -> String {
    format!("{stage_uid}/in-flight")
}

/// The state element under which a stage's tasks keep their watermarks.
pub(crate) fn watermarks_uid(stage_uid: &str) -> String {
    format!("{stage_uid}/watermarks")
}

/// Messages in flight into a task at an unaligned checkpoint: per input, batches and watermarks in
/// order.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct ChannelState {
    pub inputs: Vec<Vec<InFlight>>,
}

/// Channel state as builds before watermarks wrote it.
#[derive(serde::Deserialize)]
struct LegacyChannelState {
    inputs: Vec<Vec<Vec<u8>>>,
}

impl StateImage for ChannelState {
    fn encode(self: Box<Self>, _incremental: bool) -> Result<Encoded, String> {
        postcard::to_allocvec(&*self)
            .map(|b| ElementState::Plain(b).into())
            .map_err(|e| format!("encoding channel state: {e}"))
    }
}

fn encode_batch<T: Data>(batch: &Vec<T>) -> Vec<u8> {
    postcard::to_allocvec(batch).expect("a record type that serde can serialise (needed for channel state)")
}

impl<T: Data> InputBody<T> {
    fn on_input_watermark(&mut self, i: usize, w: WatermarkUpdate) -> Result<(), TaskError> {
        match self.watermarks.on_update(i, w) {
            Some(forward) => self.head.on_watermark(forward),
            None => Ok(()),
        }
    }
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
            let entry = self.replay[i].pop_front().expect("non-empty");
            match &entry {
                InFlight::Batch(bytes) => {
                    let batch: Vec<T> = postcard::from_bytes(bytes).map_err(|e| TaskError::State {
                        uid: "(channel state)".into(),
                        message: format!("decoding a restored batch: {e}"),
                    })?;
                    self.head.emit_batch(batch)?;
                }
                InFlight::Watermark(w) => self.on_input_watermark(i, *w)?,
            }
            return Ok(Polled::Data { recorded: record.then_some(entry) });
        }
        match self.inputs[i].poll(overtake, &encode_batch::<T>, data) {
            Taken::Msg(Message::Data(batch)) => {
                debug_assert!(!batch.is_empty());
                let recorded = record.then(|| InFlight::Batch(encode_batch(&batch)));
                self.head.emit_batch(batch)?;
                Ok(Polled::Data { recorded })
            }
            Taken::Msg(Message::Watermark(w)) => {
                self.on_input_watermark(i, w)?;
                Ok(Polled::Data { recorded: record.then_some(InFlight::Watermark(w)) })
            }
            Taken::Msg(Message::Barrier(b)) => Ok(Polled::Barrier { barrier: b, overtaken: Vec::new() }),
            Taken::Overtook { barrier, ahead } => Ok(Polled::Barrier { barrier, overtaken: ahead }),
            // Not the end of event time: that came as a watermark if the input was exhausted; after
            // a stop with a savepoint it resumes, and its timers fire then, not here.
            Taken::Msg(Message::End) => Ok(Polled::End),
            Taken::Empty => Ok(Polled::Empty),
            Taken::Disconnected => Ok(Polled::Disconnected),
        }
    }
    fn queued_bytes(&self, i: usize) -> u64 {
        self.inputs[i].queued_bytes(&|b| encode_batch(b).len() as u64)
    }
    fn queued_records(&self, i: usize) -> u64 {
        self.inputs[i].queued_records()
    }
    fn has_credit(&self) -> bool {
        self.head.has_credit()
    }
    fn poll_source(&mut self) -> Result<SourceStatus, TaskError> {
        unreachable!("not a source")
    }
    fn on_source_exhausted(&mut self) -> Result<(), TaskError> {
        unreachable!("not a source")
    }
    fn on_source_idle(&mut self, _idle_ms: u64) -> Result<(), TaskError> {
        unreachable!("not a source")
    }
    fn on_tick(&mut self, now_ms: u64) -> Result<Pending, TaskError> {
        self.head.on_tick(now_ms)
    }
    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        if self.input_ended {
            let uid = input_ended_uid(&self.stage_uid);
            snap.add(&uid, encode_plain(&uid, &true)?);
        }
        if !self.watermarks.is_fresh() {
            let uid = watermarks_uid(&self.stage_uid);
            snap.add(&uid, encode_plain(&uid, &self.watermarks.image())?);
        }
        self.head.on_barrier(b, snap)
    }
    fn on_input_end(&mut self) -> Result<(), TaskError> {
        if std::mem::replace(&mut self.input_ended, true) {
            return Ok(());
        }
        self.head.on_input_end()
    }
    fn on_end(&mut self) -> Result<(), TaskError> {
        self.head.on_end()
    }
    fn on_complete(&mut self, c: CheckpointId) -> Result<(), TaskError> {
        self.head.on_complete(c)
    }
    fn on_close(&mut self) -> Result<(), TaskError> {
        self.head.on_close()
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

/// Offsets of checkpoints in flight a source task keeps to tell its source which offset a completed
/// checkpoint holds ([`Source::checkpoint_complete`]). Older entries are dropped first (their
/// checkpoints were aborted, or a newer completion covers them).
pub(crate) const SOURCE_OFFSETS_IN_FLIGHT: usize = 64;

/// Body of a source task.
pub(crate) struct SourceBody<S: Source> {
    uid: String,
    source: S,
    chain: Box<dyn Emit<S::Item>>,
    buf: Vec<S::Item>,
    batch_size: usize,
    /// The offset each checkpoint in flight recorded, oldest first, at most
    /// [`SOURCE_OFFSETS_IN_FLIGHT`].
    in_flight: VecDeque<(CheckpointId, S::Offset)>,
    /// The end-of-input hooks ran (in this incarnation, or before the restored checkpoint).
    input_ended: bool,
    stage_uid: String,
    /// The splits last announced to the chain ([`Source::splits`]).
    splits: Vec<SplitId>,
    /// Records read from the source in this incarnation (metrics).
    records_read: u64,
}

impl<S: Source> SourceBody<S> {
    pub fn new(ctx: &StageCtx<'_>, uid: String, source: S, chain: Box<dyn Emit<S::Item>>) -> SourceBody<S> {
        SourceBody {
            uid,
            source,
            chain,
            buf: Vec::with_capacity(ctx.batch_size),
            batch_size: ctx.batch_size,
            in_flight: VecDeque::new(),
            input_ended: ended_before(ctx),
            stage_uid: ctx.stage_uid.clone(),
            splits: Vec::new(),
            records_read: 0,
        }
    }
    fn source_err(&self) -> impl Fn(ConnectorError) -> TaskError + '_ {
        |error| TaskError::Source { uid: self.uid.clone(), error }
    }
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
        let status = match self.source.poll(&mut self.buf, self.batch_size) {
            Ok(status) => status,
            Err(m) => return Err(self.source_err()(m)),
        };
        // The splits first: a new split holds the watermark back before the batch can advance it.
        if self.source.splits() != self.splits.as_slice() {
            self.splits = self.source.splits().to_vec();
            self.chain.on_source_splits(&self.splits)?;
        }
        if !self.buf.is_empty() {
            self.records_read += self.buf.len() as u64;
            let batch = std::mem::replace(&mut self.buf, Vec::with_capacity(self.batch_size));
            self.chain.emit_batch(batch)?;
        }
        Ok(status)
    }
    fn records_read(&self) -> u64 {
        self.records_read
    }
    fn on_source_exhausted(&mut self) -> Result<(), TaskError> {
        self.chain.on_watermark(WatermarkUpdate::At(EventTime::MAX))
    }
    fn on_source_idle(&mut self, idle_ms: u64) -> Result<(), TaskError> {
        self.chain.on_source_idle(idle_ms)
    }
    fn on_tick(&mut self, now_ms: u64) -> Result<Pending, TaskError> {
        self.chain.on_tick(now_ms)
    }
    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        assert!(self.buf.is_empty(), "records buffered across a barrier");
        let offset = self.source.offset();
        snap.add(&self.uid, encode_plain(&self.uid, &offset)?);
        if self.input_ended {
            let uid = input_ended_uid(&self.stage_uid);
            snap.add(&uid, encode_plain(&uid, &true)?);
        }
        if self.in_flight.len() == SOURCE_OFFSETS_IN_FLIGHT {
            self.in_flight.pop_front();
        }
        self.in_flight.push_back((b.checkpoint, offset));
        self.chain.on_barrier(b, snap)
    }
    fn on_input_end(&mut self) -> Result<(), TaskError> {
        if std::mem::replace(&mut self.input_ended, true) {
            return Ok(());
        }
        self.chain.on_input_end()
    }
    fn on_end(&mut self) -> Result<(), TaskError> {
        self.chain.on_end()
    }
    fn on_complete(&mut self, c: CheckpointId) -> Result<(), TaskError> {
        // The newest offset the completed checkpoint covers; older ones are covered by it.
        let mut covered = None;
        while self.in_flight.front().is_some_and(|(id, _)| *id <= c) {
            covered = self.in_flight.pop_front();
        }
        if let Some((id, offset)) = covered {
            if let Err(m) = self.source.checkpoint_complete(id, &offset) {
                return Err(self.source_err()(m));
            }
        }
        self.chain.on_complete(c)
    }
    fn on_close(&mut self) -> Result<(), TaskError> {
        if let Err(m) = self.source.close() {
            return Err(self.source_err()(m));
        }
        self.chain.on_close()
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
