//! The world: every task, channel, and what is durable.

use super::*;

#[derive(Clone, Debug, Default, Hash)]
pub(crate) struct Source {
    /// Records emitted so far (the offset).
    pub(crate) next: u8,
    /// Barriers the coordinator asked for and this source has not injected yet, oldest first.
    pub(crate) triggers: VecDeque<B>,
    pub(crate) ended: bool,
    pub(crate) finished_reported: bool,
}

/// The operator's part of a checkpoint.
#[derive(Clone, Debug, Default, Hash)]
pub(crate) struct OpSnap {
    /// Taken for an exactly-once barrier: the cut must be exact.
    pub(crate) exact: bool,
    pub(crate) state: Vec<Rec>,
    /// Per input, in channel order: records that were in flight at the cut.
    pub(crate) channel: [Vec<Rec>; SOURCES],
    /// Channel state (if any) is complete; the snapshot can be written.
    pub(crate) complete: bool,
}

/// The sink's part of a checkpoint.
#[derive(Clone, Debug, Default, Hash)]
pub(crate) struct SinkSnap {
    /// Prepared, not yet committed transactions, including the one of this checkpoint.
    pub(crate) prepared: BTreeMap<CheckpointId, Vec<Rec>>,
    /// Every record the sink had put into a transaction (ghost state, for the cut check).
    pub(crate) ghost: Vec<Rec>,
}

#[derive(Clone)]
pub(crate) struct Operator {
    pub(crate) aligner: Rc<AlignerReplica>,
    /// The multiset of records processed.
    pub(crate) state: Vec<Rec>,
    /// Snapshots taken and not yet written, by checkpoint (the writer takes them oldest first).
    pub(crate) snapshots: BTreeMap<CheckpointId, OpSnap>,
}

impl Operator {
    pub(crate) fn new() -> Operator {
        Operator { aligner: Rc::new(AlignerReplica::new(SOURCES)), state: Vec::new(), snapshots: BTreeMap::new() }
    }
    pub(crate) fn hash<H: Hasher>(&self, h: &mut H) {
        (self.aligner.fp, &self.state, &self.snapshots).hash(h);
    }
}

#[derive(Clone)]
pub(crate) struct Sink {
    pub(crate) aligner: Rc<AlignerReplica>,
    /// Records since the last barrier: the open transaction. Transactions are kept as sorted multisets:
    /// every invariant compares multisets, so the order of records inside one transaction (which
    /// depends only on the order in which the operator read its two inputs) is not part of the state.
    pub(crate) open: Vec<Rec>,
    pub(crate) prepared: BTreeMap<CheckpointId, Vec<Rec>>,
    pub(crate) ghost: Vec<Rec>,
    pub(crate) snapshots: BTreeMap<CheckpointId, SinkSnap>,
    /// Completed checkpoints not yet delivered to the sink.
    pub(crate) notifications: VecDeque<CheckpointId>,
    pub(crate) final_committed: bool,
    pub(crate) ended: bool,
}

impl Sink {
    pub(crate) fn new() -> Sink {
        Sink {
            aligner: Rc::new(AlignerReplica::new(1)),
            open: Vec::new(),
            prepared: BTreeMap::new(),
            ghost: Vec::new(),
            snapshots: BTreeMap::new(),
            notifications: VecDeque::new(),
            final_committed: false,
            ended: false,
        }
    }
    pub(crate) fn hash<H: Hasher>(&self, h: &mut H) {
        let Sink { aligner, open, prepared, ghost, snapshots, notifications, final_committed, ended } = self;
        (aligner.fp, open, prepared, ghost, snapshots, notifications, final_committed, ended).hash(h);
    }
}

/// What survives a crash: written snapshots and manifests.
#[derive(Clone, Debug, Default, Hash)]
pub(crate) struct Storage {
    pub(crate) source_offsets: BTreeMap<(CheckpointId, usize), u8>,
    pub(crate) op: BTreeMap<CheckpointId, OpSnap>,
    pub(crate) sink: BTreeMap<CheckpointId, SinkSnap>,
    /// Checkpoints whose manifest is durable.
    pub(crate) complete: BTreeSet<CheckpointId>,
}

impl Storage {
    pub(crate) fn discard(&mut self, id: CheckpointId) {
        for s in 0..SOURCES {
            self.source_offsets.remove(&(id, s));
        }
        self.op.remove(&id);
        self.sink.remove(&id);
    }
}

/// What a generation was restored from (nothing, for the first).
#[derive(Clone, Debug, Default, Hash)]
pub(crate) struct Base {
    pub(crate) checkpoint: Option<CheckpointId>,
    pub(crate) offsets: [u8; SOURCES],
    pub(crate) state: Vec<Rec>,
    pub(crate) channel: [Vec<Rec>; SOURCES],
}

/// One nondeterministic step. `usize` arguments are source / operator-input indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// A source emits its next record.
    EmitRecord(usize),
    /// A source injects the barrier of its oldest trigger (and end-of-stream after a final barrier).
    EmitBarrier(usize),
    /// The operator reads the head of an input: a record, a barrier or end-of-stream.
    OpRead(usize),
    /// The operator takes the first barrier of an input ahead of the records queued before it.
    OpOvertake(usize),
    /// The operator switches the aligner's timeout candidate to unaligned (its alignment timed out, or
    /// its blocked inputs went over the byte limit).
    OpTimeout,
    /// The sink reads the head of its input.
    SinkRead,
    /// The operator's oldest complete snapshot is written; the operator acks.
    OpAck,
    SinkAck,
    /// Time passes; the coordinator triggers a periodic checkpoint.
    Tick,
    /// Time passes until every checkpoint triggered so far is past its alignment timeout.
    Wait,
    /// The user asks for a savepoint.
    Savepoint,
    /// A manifest the coordinator asked for is durable (the checkpoint is complete in storage).
    ManifestDurable(CheckpointId),
    /// The coordinator hears that the manifest is durable.
    ManifestReported(CheckpointId),
    /// The sink gets the oldest completion notice and commits.
    NotifySink,
    /// The operator crashes; the coordinator fails over.
    Crash,
    /// The job is redeployed from the latest complete checkpoint.
    Restart,
}

#[derive(Clone)]
pub(crate) struct World {
    pub(crate) time: u64,
    pub(crate) generation: Generation,
    /// Crashes still to come at most.
    pub(crate) crashes_left: u32,
    pub(crate) periodic_triggered: u32,
    pub(crate) savepoint_requested: bool,
    /// When this generation's latest checkpoint was triggered.
    pub(crate) last_trigger_at: Option<u64>,
    /// Between a crash and the restart: the tasks are gone.
    pub(crate) failing_over: bool,
    /// The coordinator decided the job finished.
    pub(crate) finished: bool,
    pub(crate) coordinator: Rc<CoordinatorReplica>,
    pub(crate) sources: [Source; SOURCES],
    /// Source `s` to operator input `s`.
    pub(crate) inputs: [VecDeque<Msg>; SOURCES],
    pub(crate) to_sink: VecDeque<Msg>,
    pub(crate) op: Operator,
    pub(crate) sink: Sink,
    pub(crate) storage: Rc<Storage>,
    /// The sink's committed output, by transaction (= checkpoint): outside the job, survives crashes.
    pub(crate) committed: BTreeMap<CheckpointId, Vec<Rec>>,
    pub(crate) manifests_to_write: BTreeSet<CheckpointId>,
    pub(crate) manifests_to_report: BTreeSet<CheckpointId>,
    /// What this generation was restored from.
    pub(crate) base: Base,
    /// This generation's final checkpoint, once triggered, and whether the coordinator announced it.
    pub(crate) final_checkpoint: Option<CheckpointId>,
    pub(crate) final_complete: bool,
    pub(crate) task_finished: [bool; ALL_TASKS.len()],
    /// The steps from the start (not part of the state).
    pub(crate) path: Vec<Step>,
}

pub(crate) type Outcome = Result<(), String>;

impl World {
    pub(crate) fn new(model: &Model) -> World {
        World {
            time: 0,
            generation: Generation(1),
            crashes_left: model.max_crashes,
            periodic_triggered: 0,
            savepoint_requested: false,
            last_trigger_at: None,
            failing_over: false,
            finished: false,
            coordinator: Rc::new(CoordinatorReplica::new(&model.config)),
            sources: Default::default(),
            inputs: Default::default(),
            to_sink: VecDeque::new(),
            op: Operator::new(),
            sink: Sink::new(),
            storage: Rc::new(Storage::default()),
            committed: BTreeMap::new(),
            manifests_to_write: BTreeSet::new(),
            manifests_to_report: BTreeSet::new(),
            base: Base::default(),
            final_checkpoint: None,
            final_complete: false,
            task_finished: [false; ALL_TASKS.len()],
            path: Vec::new(),
        }
    }

    pub(crate) fn now(&self) -> TimeMs {
        TimeMs(self.time)
    }

    pub(crate) fn fingerprint(&self) -> u64 {
        let mut h = Fingerprinter::default();
        (self.time, self.generation, self.crashes_left, self.periodic_triggered, self.last_trigger_at).hash(&mut h);
        self.savepoint_requested.hash(&mut h);
        (self.failing_over, self.finished).hash(&mut h);
        self.coordinator.fp.hash(&mut h);
        (&self.sources, &self.inputs, &self.to_sink).hash(&mut h);
        self.op.hash(&mut h);
        self.sink.hash(&mut h);
        (&*self.storage, &self.committed, &self.manifests_to_write, &self.manifests_to_report).hash(&mut h);
        (&self.base, self.final_checkpoint, self.final_complete, self.task_finished).hash(&mut h);
        h.finish()
    }

    // --- what may happen next ---

    pub(crate) fn enabled(&self, model: &Model) -> Vec<Step> {
        let mut steps = Vec::new();
        if self.finished {
            return steps;
        }
        if self.failing_over {
            steps.extend(self.manifests_to_write.iter().map(|&id| Step::ManifestDurable(id)));
            steps.extend(self.manifests_to_report.iter().map(|&id| Step::ManifestReported(id)));
            steps.push(Step::Restart);
            return steps;
        }
        // The sink reads its FIFO input at once. Sound: a sink read commutes with every other step
        // (it touches only the sink's memory, which a crash loses either way, and the records and
        // barriers it reads are in channel order whenever it reads them; its acks stay separate
        // steps), so every state the job can reach is still reached. End-of-stream is read in turn.
        if self.sink.aligner.aligner.is_readable(SINK_INPUT)
            && matches!(self.to_sink.front(), Some(Msg::Data(_) | Msg::Barrier(_)))
        {
            return vec![Step::SinkRead];
        }
        for (s, src) in self.sources.iter().enumerate() {
            if !src.ended && src.next < RECORDS_PER_SOURCE {
                steps.push(Step::EmitRecord(s));
            }
            if !src.ended && !src.triggers.is_empty() {
                steps.push(Step::EmitBarrier(s));
            }
        }
        let op = &self.op.aligner.aligner;
        for (i, queue) in self.inputs.iter().enumerate() {
            let Some(head) = queue.front() else { continue };
            let blocked_read =
                model.mutated(Mutation::BlockedInputRead) && op.is_blocked(i) && matches!(head, Msg::Data(_));
            if op.is_readable(i) || blocked_read {
                steps.push(Step::OpRead(i));
            }
            if let Some((k, b)) = first_barrier(queue) {
                if k > 0 && op.may_overtake(i, &b, self.now()) {
                    steps.push(Step::OpOvertake(i));
                }
            }
        }
        // The task switches an alignment when it is older than its timeout or its blocked inputs hold
        // more than the byte limit, which counts encoded bytes the model does not have: the switch is
        // offered at every moment the aligner has a candidate, which covers every limit.
        if op.timeout_candidate(self.now()).is_some() {
            steps.push(Step::OpTimeout);
        }
        // Time is observable only through the alignment timeouts of pending checkpoints.
        if model.config.alignment_timeout_ms.is_some()
            && self.last_trigger_at.is_some_and(|t| self.time < t + ALIGNMENT_TIMEOUT_MS)
            && !self.coordinator.coordinator.pending().is_empty()
        {
            steps.push(Step::Wait);
        }
        if self.sink.aligner.aligner.is_readable(SINK_INPUT) && !self.to_sink.is_empty() {
            steps.push(Step::SinkRead);
        }
        if self.op.snapshots.first_key_value().is_some_and(|(_, s)| s.complete) {
            steps.push(Step::OpAck);
        }
        if !self.sink.snapshots.is_empty() {
            steps.push(Step::SinkAck);
        }
        let all_sources_finished = self.sources.iter().all(|s| s.finished_reported);
        if model.savepoint && !self.savepoint_requested && !all_sources_finished {
            steps.push(Step::Savepoint);
        }
        if self.periodic_triggered < MAX_PERIODIC_CHECKPOINTS
            && !all_sources_finished
            && self.coordinator.coordinator.pending().len() < model.config.max_concurrent
        {
            steps.push(Step::Tick);
        }
        steps.extend(self.manifests_to_write.iter().map(|&id| Step::ManifestDurable(id)));
        steps.extend(self.manifests_to_report.iter().map(|&id| Step::ManifestReported(id)));
        if !self.sink.notifications.is_empty() {
            steps.push(Step::NotifySink);
        }
        if self.crashes_left > 0 {
            steps.push(Step::Crash);
        }
        steps
    }

    /// A copy of this world after `step`. A broken invariant or a panic (in a core or in the model)
    /// becomes a violation carrying the path.
    pub(crate) fn child(&self, model: &Model, step: Step) -> Result<World, Violation> {
        let mut next = self.clone();
        next.path.push(step);
        let outcome =
            catch_unwind(AssertUnwindSafe(|| next.apply(model, step).and_then(|()| next.finish_tasks(model))));
        let what = match outcome {
            Ok(Ok(())) => return Ok(next),
            Ok(Err(what)) => what,
            Err(panic) => format!("panic: {}", panic_message(&*panic)),
        };
        Err(Violation { model: model.name, mutation: model.mutation, path: next.path, what })
    }
}
