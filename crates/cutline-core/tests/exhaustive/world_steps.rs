//! The world's steps: what each nondeterministic choice does to the tasks, channels and storage.

use super::*;

impl World {
    pub(crate) fn apply(&mut self, model: &Model, step: Step) -> Outcome {
        match step {
            Step::EmitRecord(s) => {
                let src = &mut self.sources[s];
                src.next += 1;
                self.inputs[s].push_back(Msg::Data(Rec { source: s as u8, seq: src.next }));
                if src.next == RECORDS_PER_SOURCE {
                    self.source_finished(model, s)?;
                }
            }
            Step::EmitBarrier(s) => {
                let src = &mut self.sources[s];
                let B(barrier) = src.triggers.pop_front().ok_or("model bug: no trigger to serve")?;
                let (id, offset) = (barrier.checkpoint, src.next);
                self.inputs[s].push_back(Msg::Barrier(B(barrier)));
                if barrier.kind.ends_input() {
                    if offset != RECORDS_PER_SOURCE {
                        return Err(format!("final barrier {id} at source {s} before its last record"));
                    }
                    src.ended = true;
                    self.inputs[s].push_back(Msg::End);
                }
                // A source's snapshot is its offset: written and acked with the barrier.
                self.write(id, |storage| {
                    storage.source_offsets.insert((id, s), offset);
                });
                self.ack(model, SOURCE_TASKS[s], id)?;
            }
            Step::OpRead(i) => match self.inputs[i].pop_front() {
                Some(Msg::Data(r)) => {
                    let mut recording = Vec::new();
                    self.op.aligner.aligner.recording_on(i, &mut recording);
                    if !model.mutated(Mutation::RecordedRecordsNotCaptured) {
                        for id in recording {
                            let snap = self.op.snapshots.get_mut(&id).ok_or_else(|| {
                                format!("input {i} records channel state for {id}, which the operator did not snapshot")
                            })?;
                            snap.channel[i].push(r);
                        }
                    }
                    insert_sorted(&mut self.op.state, r);
                    self.to_sink.push_back(Msg::Data(r));
                }
                Some(Msg::Barrier(B(b))) => {
                    let now = self.now();
                    let actions =
                        AlignerReplica::step(&mut self.op.aligner, AlignerCall::Barrier(i, b, now), &model.memo);
                    self.op_actions(actions, None)?;
                }
                Some(Msg::End) => {
                    let now = self.now();
                    let actions = AlignerReplica::step(&mut self.op.aligner, AlignerCall::End(i, now), &model.memo);
                    self.op_actions(actions, None)?;
                    if self.op.aligner.aligner.all_ended() {
                        self.to_sink.push_back(Msg::End);
                    }
                }
                None => return Err("model bug: read of an empty input".into()),
            },
            Step::OpOvertake(i) => {
                let (k, b) = first_barrier(&self.inputs[i]).ok_or("model bug: no barrier to overtake")?;
                let overtaken = data(&self.inputs[i], k);
                self.inputs[i].remove(k);
                let now = self.now();
                let actions = AlignerReplica::step(&mut self.op.aligner, AlignerCall::Barrier(i, b, now), &model.memo);
                let overtaken =
                    if model.mutated(Mutation::OvertakenRecordsNotCaptured) { Vec::new() } else { overtaken };
                self.op_actions(actions, Some((b.checkpoint, i, overtaken)))?;
            }
            Step::OpTimeout => {
                let now = self.now();
                let (id, ..) = self.op.aligner.aligner.timeout_candidate(now).ok_or("model bug: no candidate")?;
                let actions = AlignerReplica::step(&mut self.op.aligner, AlignerCall::Switch(id, now), &model.memo);
                self.op_actions(actions, None)?;
            }
            Step::SinkRead => match self.to_sink.pop_front() {
                Some(Msg::Data(r)) => {
                    let mut recording = Vec::new();
                    self.sink.aligner.aligner.recording_on(SINK_INPUT, &mut recording);
                    if !recording.is_empty() {
                        return Err(format!("the one-input sink records channel state for {recording:?}"));
                    }
                    insert_sorted(&mut self.sink.open, r);
                }
                Some(Msg::Barrier(B(b))) => {
                    let now = self.now();
                    let call = AlignerCall::Barrier(SINK_INPUT, b, now);
                    let actions = AlignerReplica::step(&mut self.sink.aligner, call, &model.memo);
                    self.sink_actions(actions)?;
                }
                Some(Msg::End) => {
                    let now = self.now();
                    let actions =
                        AlignerReplica::step(&mut self.sink.aligner, AlignerCall::End(SINK_INPUT, now), &model.memo);
                    self.sink_actions(actions)?;
                    self.sink.ended = true;
                }
                None => return Err("model bug: read of an empty sink input".into()),
            },
            Step::OpAck => {
                let (id, snap) = self.op.snapshots.pop_first().ok_or("model bug: no snapshot to write")?;
                self.write(id, |storage| {
                    storage.op.insert(id, snap);
                });
                self.ack(model, OPERATOR, id)?;
            }
            Step::SinkAck => {
                let (id, snap) = self.sink.snapshots.pop_first().ok_or("model bug: no snapshot to write")?;
                self.write(id, |storage| {
                    storage.sink.insert(id, snap);
                });
                self.ack(model, SINK, id)?;
            }
            Step::Tick => {
                self.time += INTERVAL_MS;
                let before = self.periodic_triggered;
                self.coordinate(model, Event::Tick)?;
                if self.periodic_triggered != before + 1 {
                    return Err(format!(
                        "the coordinator did not trigger at t={} with {} pending (max {}), \
                         interval {INTERVAL_MS} ms",
                        self.time,
                        self.coordinator.coordinator.pending().len(),
                        model.config.max_concurrent,
                    ));
                }
            }
            Step::Savepoint => {
                self.savepoint_requested = true;
                self.coordinate(model, Event::SavepointRequested { stop: false })?;
            }
            Step::Wait => {
                let t = self.last_trigger_at.ok_or("model bug: wait without a trigger")?;
                self.time = t + ALIGNMENT_TIMEOUT_MS;
            }
            Step::ManifestDurable(id) => {
                self.manifests_to_write.remove(&id);
                Rc::make_mut(&mut self.storage).complete.insert(id);
                self.check_cut(id)?;
                // Retention keeps the newest complete checkpoint: the only one a restore would choose.
                let storage = Rc::make_mut(&mut self.storage);
                while storage.complete.len() > 1 {
                    if let Some(old) = storage.complete.pop_first() {
                        storage.discard(old);
                    }
                }
                if self.crash_possible() {
                    self.manifests_to_report.insert(id);
                } else {
                    // With no crash to come, when the coordinator hears of it makes no difference.
                    self.coordinate(model, Event::ManifestCommitted { checkpoint: id })?;
                }
            }
            Step::ManifestReported(id) => {
                self.manifests_to_report.remove(&id);
                self.coordinate(model, Event::ManifestCommitted { checkpoint: id })?;
            }
            Step::NotifySink => {
                let n = self.sink.notifications.pop_front().ok_or("model bug: no notification")?;
                self.sink_commit(n)?;
            }
            Step::Crash => {
                self.crashes_left -= 1;
                self.failing_over = true;
                let failed = Event::TaskFailed {
                    generation: self.generation,
                    task: OPERATOR,
                    reason: "crash".into(),
                    permanent: false,
                };
                let now = self.now();
                let out =
                    CoordinatorReplica::step(&mut self.coordinator, CoordinatorCall::Handle(now, failed), &model.memo);
                if !out.iter().any(|d| matches!(d, Decision::FailOver { .. })) {
                    return Err(format!("a task failed and the coordinator did not fail over: {out:?}"));
                }
                self.decide(out)?;
                // Everything in flight is lost.
                for src in &mut self.sources {
                    *src = Source { next: 0, ..Source::default() };
                }
                self.inputs = Default::default();
                self.to_sink.clear();
                self.op = Operator::new();
                self.sink = Sink::new();
            }
            Step::Restart => self.restart(model)?,
        }
        Ok(())
    }

    /// Carry out what the operator's aligner decided. `overtaken`: the records a barrier of
    /// checkpoint `.0` on input `.1` just overtook, which belong to that checkpoint's channel state.
    pub(crate) fn op_actions(
        &mut self,
        actions: Vec<AlignAction>,
        mut overtaken: Option<(CheckpointId, usize, Vec<Rec>)>,
    ) -> Outcome {
        fn attach(snap: &mut OpSnap, id: CheckpointId, overtaken: &mut Option<(CheckpointId, usize, Vec<Rec>)>) {
            if overtaken.as_ref().is_some_and(|o| o.0 == id) {
                if let Some((_, input, recs)) = overtaken.take() {
                    snap.channel[input].extend(recs);
                }
            }
        }
        for action in actions {
            match action {
                AlignAction::Snapshot { barrier, channel_state, .. } => {
                    let id = barrier.checkpoint;
                    let exact = barrier.mode == CheckpointMode::ExactlyOnce;
                    let state = self.op.state.clone();
                    let mut snap = OpSnap { exact, state, channel: Default::default(), complete: false };
                    attach(&mut snap, id, &mut overtaken);
                    snap.complete = !channel_state;
                    if self.op.snapshots.insert(id, snap).is_some() {
                        return Err(format!("the operator snapshotted {id} twice"));
                    }
                    self.to_sink.push_back(Msg::Barrier(B(barrier)));
                }
                AlignAction::ChannelStateComplete { checkpoint } => {
                    let snap = self.op.snapshots.get_mut(&checkpoint).ok_or_else(|| {
                        format!("channel state of {checkpoint} complete, but the operator never snapshotted it")
                    })?;
                    attach(snap, checkpoint, &mut overtaken);
                    if snap.complete {
                        return Err(format!("channel state of {checkpoint} completed twice"));
                    }
                    snap.complete = true;
                }
            }
        }
        if let Some((id, input, recs)) = overtaken {
            match self.op.snapshots.get_mut(&id) {
                Some(snap) if !snap.complete => snap.channel[input].extend(recs),
                _ => {
                    return Err(format!("barrier {id} overtook {recs:?} on input {input} but records no channel state"))
                }
            }
        }
        Ok(())
    }

    /// Carry out what the sink's aligner decided: with one input, every barrier snapshots at once.
    pub(crate) fn sink_actions(&mut self, actions: Vec<AlignAction>) -> Outcome {
        for action in actions {
            match action {
                AlignAction::Snapshot { barrier, channel_state: true, .. } => {
                    return Err(format!(
                        "the one-input sink's snapshot of {} waits for channel state",
                        barrier.checkpoint
                    ));
                }
                AlignAction::Snapshot { barrier, channel_state: false, .. } => {
                    let id = barrier.checkpoint;
                    // Two-phase commit: the records since the last barrier become transaction `id`.
                    let txn = std::mem::take(&mut self.sink.open);
                    for r in &txn {
                        insert_sorted(&mut self.sink.ghost, *r);
                    }
                    if self.sink.prepared.insert(id, txn).is_some() {
                        return Err(format!("the sink prepared {id} twice"));
                    }
                    let snap = SinkSnap { prepared: self.sink.prepared.clone(), ghost: self.sink.ghost.clone() };
                    if self.sink.snapshots.insert(id, snap).is_some() {
                        return Err(format!("the sink snapshotted {id} twice"));
                    }
                }
                AlignAction::ChannelStateComplete { checkpoint } => {
                    return Err(format!("the one-input sink reported channel state of {checkpoint} complete"));
                }
            }
        }
        Ok(())
    }

    /// The sink learns that checkpoint `n` is complete: it commits every transaction up to `n`.
    pub(crate) fn sink_commit(&mut self, n: CheckpointId) -> Outcome {
        let due: Vec<CheckpointId> = self.sink.prepared.range(..=n).map(|(id, _)| *id).collect();
        for id in due {
            let txn = self.sink.prepared.remove(&id).ok_or("model bug: prepared transaction vanished")?;
            commit(&mut self.committed, id, txn)?;
        }
        if self.final_checkpoint.is_some_and(|f| n >= f) {
            self.sink.final_committed = true;
        }
        Ok(())
    }

    /// Can a crash still come? If not, steps whose only effect is on what a crash would find (a
    /// manifest's durability before the coordinator hears of it, a notification's delay) are taken
    /// together with the step that causes them: this prunes interleavings that cannot differ.
    pub(crate) fn crash_possible(&self) -> bool {
        self.crashes_left > 0 || self.failing_over
    }

    /// A task's snapshot of `id` is written; the writes of a checkpoint the coordinator no longer
    /// waits for (aborted or subsumed) are discarded.
    pub(crate) fn write(&mut self, id: CheckpointId, write: impl FnOnce(&mut Storage)) {
        if self.coordinator.coordinator.pending().contains(&id) {
            write(Rc::make_mut(&mut self.storage));
        }
    }

    pub(crate) fn ack(&mut self, model: &Model, task: TaskId, checkpoint: CheckpointId) -> Outcome {
        self.coordinate(model, Event::Acked { generation: self.generation, checkpoint, task, report: () })
    }

    pub(crate) fn source_finished(&mut self, model: &Model, s: usize) -> Outcome {
        self.sources[s].finished_reported = true;
        self.coordinate(model, Event::SourceFinished { generation: self.generation, task: SOURCE_TASKS[s] })
    }

    pub(crate) fn coordinate(&mut self, model: &Model, event: Event<()>) -> Outcome {
        let now = self.now();
        let out = CoordinatorReplica::step(&mut self.coordinator, CoordinatorCall::Handle(now, event), &model.memo);
        self.decide(out)
    }

    /// Carry out the coordinator's decisions, as the runtime would.
    pub(crate) fn decide(&mut self, decisions: Vec<Decision<()>>) -> Outcome {
        for d in decisions {
            match d {
                Decision::Trigger { barrier } => {
                    match barrier.kind {
                        SnapshotKind::Checkpoint => self.periodic_triggered += 1,
                        SnapshotKind::Final => self.final_checkpoint = Some(barrier.checkpoint),
                        SnapshotKind::Savepoint => {}
                        other => return Err(format!("unexpected {other:?} trigger")),
                    }
                    self.last_trigger_at = Some(barrier.triggered_at.0);
                    if self.periodic_triggered > MAX_PERIODIC_CHECKPOINTS {
                        return Err(format!("the coordinator triggered {} outside a tick", barrier.checkpoint));
                    }
                    for (s, src) in self.sources.iter_mut().enumerate() {
                        if src.ended {
                            return Err(format!("{} triggered after source {s} ended", barrier.checkpoint));
                        }
                        src.triggers.push_back(B(barrier));
                    }
                }
                Decision::CommitManifest { checkpoint, .. } => {
                    self.manifests_to_write.insert(checkpoint);
                }
                Decision::NotifyComplete { checkpoint } => {
                    if self.failing_over {
                        continue; // the tasks are gone; the restored sink recovers instead
                    }
                    if self.final_checkpoint.is_some_and(|f| checkpoint >= f) {
                        self.final_complete = true;
                    }
                    if self.crash_possible() {
                        self.sink.notifications.push_back(checkpoint);
                    } else {
                        self.sink_commit(checkpoint)?;
                    }
                }
                Decision::Abort { checkpoint, .. } => {
                    // Sinks never discard on abort; the checkpoint's partial snapshots are discarded.
                    if !self.storage.complete.contains(&checkpoint) {
                        Rc::make_mut(&mut self.storage).discard(checkpoint);
                    }
                }
                Decision::FailOver { reason } => {
                    if !self.failing_over {
                        return Err(format!("unexpected failover: {reason}"));
                    }
                }
                Decision::JobFinished { checkpoint, kind } => {
                    if kind != SnapshotKind::Final || Some(checkpoint) != self.final_checkpoint {
                        return Err(format!("job finished with {kind:?} {checkpoint}, expected the final checkpoint"));
                    }
                    self.finished = true;
                }
                other => return Err(format!("unexpected decision {other:?}")),
            }
        }
        Ok(())
    }

    /// Tasks that ended and saw the final checkpoint complete report that they finished.
    pub(crate) fn finish_tasks(&mut self, model: &Model) -> Outcome {
        if !self.final_complete || self.failing_over || self.finished {
            return Ok(());
        }
        for (t, task) in ALL_TASKS.iter().enumerate() {
            let done = match *task {
                OPERATOR => self.op.aligner.aligner.all_ended(),
                SINK => self.sink.ended && self.sink.final_committed,
                _ => self.sources[t].ended,
            };
            if done && !self.task_finished[t] {
                self.task_finished[t] = true;
                self.coordinate(model, Event::TaskFinished { generation: self.generation, task: *task })?;
            }
        }
        Ok(())
    }
}
