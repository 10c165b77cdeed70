//! The world's restart and checks: the cut, progress and end-of-run invariants, and how a violation is told.

use super::*;

impl World {
    pub(crate) fn restart(&mut self, model: &Model) -> Outcome {
        let candidates =
            self.storage.complete.iter().map(|&checkpoint| Candidate { checkpoint, verified: Ok(()) }).collect();
        let restored = choose_restore(candidates).checkpoint;
        if let Some(&newest) = self.committed.keys().next_back() {
            if restored.is_none_or(|r| newest > r) {
                return Err(format!(
                    "the sink committed {newest}, but the restore falls back to {restored:?}: \
                     that output would be committed twice"
                ));
            }
        }
        // Nothing in flight survives the restart: a manifest not yet durable never will be.
        self.manifests_to_write.clear();
        self.manifests_to_report.clear();
        self.generation = self.generation.next();
        let now = self.now();
        let restart = CoordinatorCall::Restart { generation: self.generation, restored, now };
        let out = CoordinatorReplica::step(&mut self.coordinator, restart, &model.memo);
        self.decide(out)?;
        self.failing_over = false;
        self.periodic_triggered = 0;
        self.last_trigger_at = None;
        self.final_checkpoint = None;
        self.final_complete = false;
        self.task_finished = Default::default();

        let storage = Rc::clone(&self.storage);
        let missing = |what: &str| format!("complete checkpoint {restored:?} has no {what} snapshot");
        for s in 0..SOURCES {
            let next = match restored {
                Some(r) => *storage.source_offsets.get(&(r, s)).ok_or_else(|| missing(source_name(s)))?,
                None => 0,
            };
            self.sources[s] = Source { next, ..Source::default() };
        }
        let (op_snap, sink_snap) = match restored {
            Some(r) => (
                storage.op.get(&r).cloned().ok_or_else(|| missing("operator"))?,
                storage.sink.get(&r).cloned().ok_or_else(|| missing("sink"))?,
            ),
            None => (OpSnap::default(), SinkSnap::default()),
        };
        self.base = Base {
            checkpoint: restored,
            offsets: [self.sources[0].next, self.sources[1].next],
            state: op_snap.state.clone(),
            channel: op_snap.channel.clone(),
        };
        self.op = Operator::new();
        self.op.state = op_snap.state;
        if !model.mutated(Mutation::ChannelStateNotReplayed) {
            for (queue, recs) in self.inputs.iter_mut().zip(op_snap.channel) {
                queue.extend(recs.into_iter().map(Msg::Data));
            }
        }
        self.sink = Sink::new();
        self.sink.ghost = sink_snap.ghost;
        if !model.mutated(Mutation::SinkRecoveryCommitSkipped) {
            for (id, txn) in sink_snap.prepared {
                commit(&mut self.committed, id, txn)?;
            }
        }
        for s in 0..SOURCES {
            if self.sources[s].next == RECORDS_PER_SOURCE {
                self.source_finished(model, s)?;
            }
        }
        Ok(())
    }

    // --- invariants ---

    /// A checkpoint whose manifest just became durable must be a consistent cut.
    pub(crate) fn check_cut(&self, id: CheckpointId) -> Outcome {
        let missing = |what: &str| format!("consistent cut: complete checkpoint {id} has no {what} snapshot");
        let op = self.storage.op.get(&id).ok_or_else(|| missing("operator"))?;
        let sink = self.storage.sink.get(&id).ok_or_else(|| missing("sink"))?;
        for s in 0..SOURCES {
            let offset = *self.storage.source_offsets.get(&(id, s)).ok_or_else(|| missing(source_name(s)))?;
            let before_cut = records_of(s, offset);
            let in_state: Vec<Rec> = op.state.iter().copied().filter(|r| r.source as usize == s).collect();
            let channel = &op.channel[s];
            if op.exact {
                // Exact relative to what this generation started from: its input from source `s` was the
                // restored channel state, then the records from the restored offset on. (After a restore
                // of an exact cut this is the same as exact from the start; after an at-least-once one,
                // the restored state may already hold records past the restored offset.)
                let base = &self.base;
                let input: Vec<Rec> = base.channel[s]
                    .iter()
                    .copied()
                    .chain(before_cut.iter().copied().skip(usize::from(base.offsets[s])))
                    .collect();
                let mut since = in_state.clone();
                let base_held = base.state.iter().filter(|r| r.source as usize == s).all(|r| {
                    let at = since.iter().position(|x| x == r);
                    at.map(|at| since.remove(at)).is_some()
                });
                let k = since.len();
                if !base_held || k > input.len() || since != input[..k] || channel[..] != input[k..] {
                    return Err(format!(
                        "consistent cut: {id} is not an exact cut of source {}: since the restore of {} (state \
                         {:?}), the input up to its offset {offset} was {input:?}, but the operator's state holds \
                         {in_state:?} and its channel state {channel:?}",
                        source_name(s),
                        base.checkpoint.map_or_else(|| "nothing".to_string(), |id| id.to_string()),
                        base.state,
                    ));
                }
            } else if !channel.is_empty() || before_cut.iter().any(|r| !in_state.contains(r)) {
                return Err(format!(
                    "consistent cut: at-least-once {id} does not cover source {}: the records before its \
                     offset {offset} are {before_cut:?}, the operator's state holds {in_state:?}, channel \
                     state {channel:?}",
                    source_name(s)
                ));
            }
        }
        if sink.ghost != op.state {
            return Err(format!(
                "consistent cut: at {id} the sink's transactions hold {:?}, but the operator's state is {:?}",
                sink.ghost, op.state
            ));
        }
        Ok(())
    }

    /// A run that has not finished can always go on without a crash; a finished one is checked
    /// against the failure-free run. `steps`: what is enabled here.
    pub(crate) fn check_progress(&self, model: &Model, steps: &[Step]) -> Outcome {
        if steps.is_empty() {
            if !self.finished {
                return Err("deadlock: nothing can happen and the job has not finished".into());
            }
            return self.check_end(model);
        }
        if steps.iter().all(|s| *s == Step::Crash) {
            return Err("deadlock: only a crash can happen and the job has not finished".into());
        }
        Ok(())
    }

    /// The job finished: compare with the failure-free run.
    pub(crate) fn check_end(&self, model: &Model) -> Outcome {
        let expected = all_records();
        let output = sorted(self.committed.values().flatten().copied().collect());
        let state = &self.op.state;
        if model.exactly_once() {
            if output != expected {
                return Err(format!(
                    "exactly-once output: committed {output:?}, the failure-free run commits {expected:?}"
                ));
            }
            if *state != expected {
                return Err(format!("exactly-once state: the operator ends with {state:?}, failure-free {expected:?}"));
            }
        } else {
            let covers =
                |got: &[Rec]| expected.iter().all(|r| got.contains(r)) && got.iter().all(|r| expected.contains(r));
            if !covers(&output) {
                return Err(format!(
                    "at-least-once output: committed {output:?} does not contain exactly the records {expected:?}"
                ));
            }
            if !covers(state) {
                return Err(format!(
                    "at-least-once state: the operator ends with {state:?}, failure-free {expected:?}"
                ));
            }
        }
        if !self.sink.prepared.is_empty() || !self.sink.open.is_empty() {
            return Err(format!(
                "end of job with uncommitted output: prepared {:?}, open {:?}",
                self.sink.prepared, self.sink.open
            ));
        }
        if self.inputs.iter().any(|q| !q.is_empty()) || !self.to_sink.is_empty() {
            return Err(format!("end of job with messages in flight: {:?} {:?}", self.inputs, self.to_sink));
        }
        Ok(())
    }

    /// One step in words, for a failing path (call before applying it).
    pub(crate) fn describe(&self, step: Step) -> String {
        let head = |q: &VecDeque<Msg>| match q.front() {
            Some(Msg::Data(r)) => format!("{r:?}"),
            Some(Msg::Barrier(b)) => format!("barrier {} ({:?}, {:?})", b.0.checkpoint, b.0.kind, b.0.alignment),
            Some(Msg::End) => "end-of-stream".into(),
            None => "nothing".into(),
        };
        let overtake = |q: &VecDeque<Msg>| match first_barrier(q) {
            Some((k, b)) => format!("barrier {} ahead of {:?}", b.checkpoint, data(q, k)),
            None => "no barrier".into(),
        };
        let t = self.generation;
        let name = |id: Option<CheckpointId>| id.map_or_else(|| "nothing".to_string(), |id| id.to_string());
        match step {
            Step::EmitRecord(s) => {
                format!("source {} emits {:?}", source_name(s), Rec { source: s as u8, seq: self.sources[s].next + 1 })
            }
            Step::EmitBarrier(s) => match self.sources[s].triggers.front() {
                Some(B(b)) => format!(
                    "source {} injects barrier {} ({:?}) at offset {}",
                    source_name(s),
                    b.checkpoint,
                    b.kind,
                    self.sources[s].next
                ),
                None => format!("source {} injects a barrier it was never asked for", source_name(s)),
            },
            Step::OpRead(i) => format!("operator reads {} from input {}", head(&self.inputs[i]), source_name(i)),
            Step::OpOvertake(i) => format!("operator takes {} on input {}", overtake(&self.inputs[i]), source_name(i)),
            Step::OpTimeout => format!(
                "operator switches its alignment of {} to unaligned",
                name(self.op.aligner.aligner.timeout_candidate(self.now()).map(|c| c.0))
            ),
            Step::SinkRead => format!("sink reads {}", head(&self.to_sink)),
            Step::OpAck => format!(
                "operator's snapshot of {} is written and acked",
                name(self.op.snapshots.keys().next().copied())
            ),
            Step::SinkAck => {
                format!("sink's snapshot of {} is written and acked", name(self.sink.snapshots.keys().next().copied()))
            }
            Step::Tick => format!("t={}: the coordinator triggers a checkpoint", self.time + INTERVAL_MS),
            Step::Savepoint => "the user asks for a savepoint".into(),
            Step::Wait => format!(
                "t={}: every checkpoint triggered so far is past its alignment timeout",
                self.last_trigger_at.map_or(self.time, |t| t + ALIGNMENT_TIMEOUT_MS)
            ),
            Step::ManifestDurable(id) => format!("manifest of {id} is durable"),
            Step::ManifestReported(id) => format!("the coordinator hears that {id} is complete"),
            Step::NotifySink => {
                format!(
                    "sink is notified that {} is complete and commits",
                    name(self.sink.notifications.front().copied())
                )
            }
            Step::Crash => format!("the operator of {t} crashes; the coordinator fails over"),
            Step::Restart => {
                let candidates =
                    self.storage.complete.iter().map(|&c| Candidate { checkpoint: c, verified: Ok(()) }).collect();
                format!("the job restarts from {}", name(choose_restore(candidates).checkpoint))
            }
        }
    }
}

/// Commit a transaction, idempotently: committing it again with the same records is a no-op.
pub(crate) fn commit(committed: &mut BTreeMap<CheckpointId, Vec<Rec>>, id: CheckpointId, txn: Vec<Rec>) -> Outcome {
    match committed.get(&id) {
        Some(done) if *done == txn => Ok(()),
        Some(done) => Err(format!("transaction {id} committed as {done:?} and again as {txn:?}")),
        None => {
            committed.insert(id, txn);
            Ok(())
        }
    }
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}
