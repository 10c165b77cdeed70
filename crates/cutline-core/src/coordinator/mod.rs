//! The checkpoint coordinator as a pure state machine.
//!
//! It owns: when to trigger a checkpoint, which epoch it gets, which tasks still owe an acknowledgement,
//! when a checkpoint is complete, when to abort one, when to fail the job over, and when the job is
//! finished. It does not: read clocks (time is an argument), write files (it asks for a manifest commit
//! and waits for the outcome), talk to tasks (it returns decisions the runtime delivers), or choose the
//! checkpoint to restore (see [`restart`](super::restart)).
//!
//! The acknowledgement payload `R` (the task's state handle) is opaque here; the coordinator only
//! collects it and hands it back in [`Decision::CommitManifest`].

mod config;
mod types;

pub use config::{check_max_concurrent, CheckpointConfig, MAX_CONCURRENT_CHECKPOINTS, MIN_CONCURRENT_TRIGGER_GAP_MS};
pub use types::{AbortReason, CheckpointStats, Decision, Event, Outcome, Violation};

use crate::barrier::{Barrier, CheckpointMode, SnapshotKind};
use crate::ids::{CheckpointId, Generation, TaskId, TimeMs};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How many epochs one lease reserves. The runtime persists the lease end before the coordinator may
/// issue an epoch below it, so a restarted process never reuses an epoch.
pub const EPOCH_LEASE_BLOCK: u64 = 10_000;
/// How many finished checkpoints' statistics the coordinator keeps.
pub const STATS_HISTORY: usize = 256;

#[derive(Debug)]
struct Pending<R> {
    barrier: Barrier,
    acks: BTreeMap<TaskId, (R, TimeMs)>,
    committing: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    /// The final checkpoint (or a stop-with-savepoint) is triggered; no more periodic ones.
    Finishing(CheckpointId),
    /// The final checkpoint (or stop-with-savepoint) is complete; waiting for tasks to finish.
    Draining(CheckpointId),
    Finished,
    /// A failover was decided; waiting for [`Coordinator::restart`].
    FailingOver,
}

/// The coordinator state machine. See the module docs.
#[derive(Debug)]
pub struct Coordinator<R> {
    config: CheckpointConfig,
    generation: Generation,
    tasks: BTreeSet<TaskId>,
    sources: BTreeSet<TaskId>,
    finished_sources: BTreeSet<TaskId>,
    finished_tasks: BTreeSet<TaskId>,
    next_id: CheckpointId,
    lease_end: CheckpointId,
    lease_requested: bool,
    /// A savepoint asked for while no epoch was available (waiting for the lease); `true` to stop.
    savepoint_wanted: Option<bool>,
    /// Kind of the checkpoint that ends the job (Final, or StopSavepoint), once triggered.
    ending_kind: SnapshotKind,
    pending: BTreeMap<CheckpointId, Pending<R>>,
    last_completed: Option<CheckpointId>,
    last_trigger_at: Option<TimeMs>,
    last_end_at: Option<TimeMs>,
    consecutive_failures: u32,
    phase: Phase,
    history: VecDeque<CheckpointStats>,
    completed_count: u64,
    failed_count: u64,
}

impl<R: Clone> Coordinator<R> {
    /// A coordinator for a freshly deployed generation. `first_id` is above every epoch ever issued for
    /// this job; `lease_end` is the durable lease (ids `< lease_end` may be issued); `last_completed`
    /// is the checkpoint the generation restored; `now` starts the first interval.
    ///
    /// # Panics
    /// If `config` does not [validate](CheckpointConfig::validate), `sources` is empty or not a subset
    /// of `tasks`, `first_id` is above `lease_end`, or `last_completed` is not below `first_id`.
    #[allow(clippy::too_many_arguments)] // each is a distinct protocol quantity; a struct would only rename them
    pub fn new(
        config: CheckpointConfig,
        generation: Generation,
        tasks: impl IntoIterator<Item = TaskId>,
        sources: impl IntoIterator<Item = TaskId>,
        first_id: CheckpointId,
        lease_end: CheckpointId,
        last_completed: Option<CheckpointId>,
        now: TimeMs,
    ) -> Coordinator<R> {
        config.validate().expect("invalid checkpoint config");
        let tasks: BTreeSet<TaskId> = tasks.into_iter().collect();
        let sources: BTreeSet<TaskId> = sources.into_iter().collect();
        assert!(!sources.is_empty(), "a job needs at least one source");
        assert!(sources.is_subset(&tasks));
        assert!(first_id <= lease_end);
        if let Some(l) = last_completed {
            assert!(l < first_id, "first epoch {first_id} not above the restored {l}");
        }
        Coordinator {
            config,
            generation,
            tasks,
            sources,
            finished_sources: BTreeSet::new(),
            finished_tasks: BTreeSet::new(),
            next_id: first_id,
            lease_end,
            lease_requested: false,
            savepoint_wanted: None,
            ending_kind: SnapshotKind::Final,
            pending: BTreeMap::new(),
            last_completed,
            last_trigger_at: None,
            last_end_at: Some(now),
            consecutive_failures: 0,
            phase: Phase::Running,
            history: VecDeque::new(),
            completed_count: 0,
            failed_count: 0,
        }
    }

    /// The generation the coordinator runs now.
    pub fn generation(&self) -> Generation {
        self.generation
    }
    /// The settings in force.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }
    /// Change settings while the job runs; they apply from the next trigger (checkpoints in flight
    /// keep their barriers, but time out by the new `timeout_ms`). Invalid settings are refused with
    /// [`CheckpointConfig::validate`]'s message and the old ones stay.
    pub fn set_config(&mut self, config: CheckpointConfig) -> Result<(), String> {
        config.validate()?;
        self.config = config;
        Ok(())
    }
    /// The newest complete checkpoint: the one restored, or a newer one completed since.
    pub fn last_completed(&self) -> Option<CheckpointId> {
        self.last_completed
    }
    /// The durable epoch lease: every epoch this coordinator issues is below it.
    pub fn lease_end(&self) -> CheckpointId {
        self.lease_end
    }
    /// The next epoch this coordinator would issue: every epoch issued so far is below it.
    pub fn next_id(&self) -> CheckpointId {
        self.next_id
    }
    /// The checkpoints in flight (triggered, neither complete nor aborted), oldest first; their
    /// manifests may be being written.
    pub fn pending(&self) -> Vec<CheckpointId> {
        self.pending.keys().copied().collect()
    }
    /// Statistics of the last [`STATS_HISTORY`] finished attempts, oldest first.
    pub fn history(&self) -> impl Iterator<Item = &CheckpointStats> {
        self.history.iter()
    }
    /// Checkpoints completed since the coordinator was created (across restarts).
    pub fn completed_count(&self) -> u64 {
        self.completed_count
    }
    /// Checkpoints that failed since the coordinator was created: the aborts that
    /// [count as failures](AbortReason::counts_as_failure), savepoints excepted.
    pub fn failed_count(&self) -> u64 {
        self.failed_count
    }
    /// [`Decision::JobFinished`] was decided: the job is done or stopped with a savepoint.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }
    /// [`Decision::FailOver`] was decided and [`Coordinator::restart`] has not been called since.
    pub fn is_failing_over(&self) -> bool {
        self.phase == Phase::FailingOver
    }

    /// Start a new generation after a failover: every checkpoint still pending, one whose manifest is
    /// being written too, is aborted with [`AbortReason::FailOver`] (the runtime discards its artifacts;
    /// storage refuses to discard one whose manifest landed), a savepoint waiting for an epoch is
    /// rejected, and epochs continue above every epoch issued before. `restored` is the checkpoint the
    /// new generation restored. Panics if `generation` is not above the current one, `sources` is
    /// empty or not a subset of `tasks`, or `restored` is not below [`Coordinator::next_id`].
    pub fn restart(
        &mut self,
        generation: Generation,
        tasks: impl IntoIterator<Item = TaskId>,
        sources: impl IntoIterator<Item = TaskId>,
        restored: Option<CheckpointId>,
        now: TimeMs,
        out: &mut Vec<Decision<R>>,
    ) {
        assert!(generation > self.generation, "generation {generation} not above {}", self.generation);
        self.abort_all(now, AbortReason::FailOver, out);
        self.generation = generation;
        self.tasks = tasks.into_iter().collect();
        self.sources = sources.into_iter().collect();
        assert!(!self.sources.is_empty() && self.sources.is_subset(&self.tasks));
        self.finished_sources.clear();
        self.finished_tasks.clear();
        self.last_completed = restored;
        if let Some(r) = restored {
            assert!(r < self.next_id, "restored checkpoint {r} not below next epoch {}", self.next_id);
        }
        self.consecutive_failures = 0;
        self.last_trigger_at = None;
        self.last_end_at = Some(now);
        self.phase = Phase::Running;
        if self.savepoint_wanted.take().is_some() {
            out.push(Decision::SavepointRejected { reason: "the job failed over before the savepoint started".into() });
        }
    }

    /// Feed one event at time `now`; decisions are appended to `out`. An event from a task that the
    /// protocol does not allow is refused with a [`Violation`] and changes nothing: the runtime holds
    /// its sender responsible. Events the runtime itself produces (ticks, manifest and lease outcomes)
    /// that break the protocol are bugs of the runtime, and panic.
    pub fn handle(&mut self, now: TimeMs, event: Event<R>, out: &mut Vec<Decision<R>>) -> Result<(), Violation> {
        match event {
            Event::Tick => self.on_tick(now, out),
            Event::Acked { generation, checkpoint, task, report } => {
                if generation != self.generation {
                    return Ok(()); // a late message from an older generation
                }
                let violation = |what: String| Err(Violation { task, what });
                if !self.tasks.contains(&task) {
                    return violation(format!(
                        "an acknowledgement of {checkpoint} from a task {} does not have",
                        self.generation
                    ));
                }
                if checkpoint >= self.next_id {
                    return violation(format!("an acknowledgement of {checkpoint}, which was never triggered"));
                }
                let Some(p) = self.pending.get_mut(&checkpoint) else {
                    return Ok(()); // aborted or subsumed meanwhile
                };
                if p.acks.contains_key(&task) {
                    return violation(format!("a second acknowledgement of {checkpoint}"));
                }
                p.acks.insert(task, (report, now));
                if p.acks.len() == self.tasks.len() && !p.committing {
                    p.committing = true;
                    let reports = p.acks.iter().map(|(t, (r, _))| (*t, r.clone())).collect();
                    out.push(Decision::CommitManifest {
                        checkpoint,
                        kind: p.barrier.kind,
                        generation: self.generation,
                        reports,
                    });
                }
            }
            Event::Declined { generation, checkpoint, task, reason } => {
                if generation == self.generation && !self.tasks.contains(&task) {
                    return Err(Violation {
                        task,
                        what: format!("a decline of {checkpoint} from a task {} does not have", self.generation),
                    });
                }
                if generation != self.generation || !self.pending.contains_key(&checkpoint) {
                    return Ok(());
                }
                if self.pending[&checkpoint].committing {
                    return Ok(()); // every task already acked; a stray decline cannot undo that
                }
                let is_final = self.pending[&checkpoint].barrier.kind.ends_input();
                let why = format!(
                    "{} {checkpoint} declined by {task}: {reason}",
                    ending_name(self.pending[&checkpoint].barrier.kind)
                );
                self.abort(checkpoint, now, AbortReason::Declined { task, reason }, out);
                if is_final && self.phase != Phase::FailingOver {
                    self.fail_over(now, why, out);
                }
            }
            Event::TaskFailed { generation, task, reason, .. } => {
                if generation == self.generation && !self.tasks.contains(&task) {
                    return Err(Violation {
                        task,
                        what: format!("the failure of a task {} does not have", self.generation),
                    });
                }
                if generation != self.generation || self.phase == Phase::FailingOver || self.phase == Phase::Finished {
                    return Ok(());
                }
                self.fail_over(now, format!("{task} failed: {reason}"), out);
            }
            Event::SourceFinished { generation, task } => {
                if generation != self.generation {
                    return Ok(());
                }
                if !self.sources.contains(&task) {
                    return Err(Violation { task, what: "end of input of a task that is not a source".into() });
                }
                self.finished_sources.insert(task);
                self.on_tick(now, out);
            }
            Event::TaskFinished { generation, task } => {
                if generation != self.generation || self.phase == Phase::FailingOver {
                    return Ok(()); // sent before the failover was decided
                }
                if !self.tasks.contains(&task) {
                    return Err(Violation {
                        task,
                        what: format!("the end of a task {} does not have", self.generation),
                    });
                }
                let Phase::Draining(final_id) = self.phase else {
                    return Err(Violation {
                        task,
                        what: "it finished before the checkpoint that ends the job completed".into(),
                    });
                };
                self.finished_tasks.insert(task);
                if self.finished_tasks.len() == self.tasks.len() {
                    self.phase = Phase::Finished;
                    out.push(Decision::JobFinished { checkpoint: final_id, kind: self.ending_kind });
                }
            }
            Event::ManifestCommitted { checkpoint } => self.on_committed(checkpoint, now, out),
            Event::ManifestFailed { checkpoint, reason } => {
                let Some(p) = self.pending.get(&checkpoint) else {
                    return Ok(());
                };
                assert!(p.committing, "manifest outcome for {checkpoint}, which was not committing");
                let is_final = p.barrier.kind.ends_input();
                let p_kind = p.barrier.kind;
                self.abort(checkpoint, now, AbortReason::ManifestFailed(reason.clone()), out);
                if is_final && self.phase != Phase::FailingOver {
                    self.fail_over(now, format!("{} {checkpoint} failed: {reason}", ending_name(p_kind)), out);
                }
            }
            Event::LeaseExtended { lease_end } => {
                assert!(lease_end > self.lease_end, "lease extended from {} to {lease_end}", self.lease_end);
                self.lease_end = lease_end;
                self.lease_requested = false;
                if let Some(stop) = self.savepoint_wanted.take() {
                    self.savepoint(now, stop, out);
                }
                self.on_tick(now, out);
            }
            Event::SavepointRequested { stop } => self.savepoint(now, stop, out),
        }
        Ok(())
    }

    fn on_tick(&mut self, now: TimeMs, out: &mut Vec<Decision<R>>) {
        // Timeouts first: they free a slot for the next trigger.
        let expired: Vec<CheckpointId> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.committing && now.saturating_sub(p.barrier.triggered_at) >= self.config.timeout_ms)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if self.phase == Phase::FailingOver {
                break;
            }
            let missing: Vec<TaskId> =
                self.tasks.iter().filter(|t| !self.pending[&id].acks.contains_key(t)).copied().collect();
            let kind = self.pending[&id].barrier.kind;
            self.abort(id, now, AbortReason::Timeout { missing }, out);
            if kind.ends_input() && self.phase != Phase::FailingOver {
                self.fail_over(now, format!("{} {id} timed out", ending_name(kind)), out);
            }
        }
        match self.phase {
            Phase::Running => {}
            _ => return,
        }
        let all_sources_finished = self.finished_sources.len() == self.sources.len();
        if all_sources_finished {
            // End of input: the final checkpoint goes now, whatever the interval, so sinks commit.
            if self.ensure_lease(out) {
                let id = self.issue(now, SnapshotKind::Final, out);
                self.phase = Phase::Finishing(id);
                self.ending_kind = SnapshotKind::Final;
            }
            return;
        }
        let Some(interval) = self.config.interval_ms else {
            return;
        };
        if self.pending.len() >= self.config.max_concurrent {
            return;
        }
        if let Some(t) = self.last_trigger_at {
            // With a checkpoint in flight, the next waits at least the concurrent trigger gap.
            let gap = if self.pending.is_empty() { interval } else { interval.max(MIN_CONCURRENT_TRIGGER_GAP_MS) };
            if now.saturating_sub(t) < gap {
                return;
            }
        }
        if let Some(t) = self.last_end_at {
            if self.pending.is_empty() && now.saturating_sub(t) < self.config.min_pause_ms {
                return;
            }
            if self.last_trigger_at.is_none() && now.saturating_sub(t) < interval {
                return; // the first checkpoint of a generation waits one interval
            }
        }
        if self.ensure_lease(out) {
            self.issue(now, SnapshotKind::Checkpoint, out);
        }
    }

    fn savepoint(&mut self, now: TimeMs, stop: bool, out: &mut Vec<Decision<R>>) {
        let busy = match self.phase {
            Phase::Running => None,
            Phase::Finishing(_) | Phase::Draining(_) | Phase::Finished => Some("the job is finishing or stopping"),
            Phase::FailingOver => Some("the job is failing over; try again once it runs"),
        };
        if let Some(why) = busy {
            out.push(Decision::SavepointRejected { reason: why.into() });
            return;
        }
        if self.savepoint_wanted.is_some() {
            out.push(Decision::SavepointRejected { reason: "another savepoint is about to start".into() });
            return;
        }
        if self.next_id.0 == u64::MAX {
            out.push(Decision::SavepointRejected { reason: "every checkpoint id has been used".into() });
            return;
        }
        if !self.ensure_lease(out) {
            self.savepoint_wanted = Some(stop);
            return;
        }
        let kind = if stop { SnapshotKind::StopSavepoint } else { SnapshotKind::Savepoint };
        let id = self.issue(now, kind, out);
        if stop {
            self.phase = Phase::Finishing(id);
            self.ending_kind = kind;
        }
    }

    fn ensure_lease(&mut self, out: &mut Vec<Decision<R>>) -> bool {
        if self.next_id < self.lease_end {
            return true;
        }
        if !self.lease_requested {
            self.lease_requested = true;
            // Near the end of the id space (only a crafted or damaged `job.meta` starts a job there)
            // the last lease is shorter than a block; once the largest id is issued there is no next.
            let extended = self.lease_end.0.saturating_add(EPOCH_LEASE_BLOCK);
            if extended == self.lease_end.0 {
                out.push(Decision::EpochsExhausted { lease_end: self.lease_end });
            } else {
                out.push(Decision::ExtendLease { lease_end: CheckpointId(extended) });
            }
        }
        false
    }

    fn issue(&mut self, now: TimeMs, kind: SnapshotKind, out: &mut Vec<Decision<R>>) -> CheckpointId {
        let id = self.next_id;
        assert!(id < self.lease_end, "epoch {id} outside the durable lease");
        if let Some(l) = self.last_completed {
            assert!(id > l);
        }
        self.next_id = id.next();
        let mode = if kind.is_savepoint() { CheckpointMode::ExactlyOnce } else { self.config.mode };
        let alignment = self.config.alignment_for(kind);
        let barrier = Barrier { checkpoint: id, generation: self.generation, triggered_at: now, kind, mode, alignment };
        self.pending.insert(id, Pending { barrier, acks: BTreeMap::new(), committing: false });
        self.last_trigger_at = Some(now);
        out.push(Decision::Trigger { barrier });
        id
    }

    fn on_committed(&mut self, checkpoint: CheckpointId, now: TimeMs, out: &mut Vec<Decision<R>>) {
        let Some(p) = self.pending.remove(&checkpoint) else {
            return; // aborted by a failover while its manifest was being written; storage knows the truth
        };
        assert!(p.committing, "{checkpoint} committed without every ack");
        assert_eq!(p.acks.len(), self.tasks.len());
        let slowest = p.acks.iter().max_by_key(|(_, (_, at))| *at).map(|(t, _)| *t);
        self.record(p.barrier, now, Outcome::Completed, slowest, p.acks.len());
        self.completed_count += 1;
        self.consecutive_failures = 0;
        self.last_end_at = Some(now);
        let newer = self.last_completed.is_none_or(|l| checkpoint > l);
        if newer {
            self.last_completed = Some(checkpoint);
            // Older pending checkpoints are subsumed: the newer one covers everything they would have.
            // A savepoint is never subsumed: the user asked for that one.
            let older: Vec<CheckpointId> = self
                .pending
                .range(..checkpoint)
                .filter(|(_, p)| !p.committing && !p.barrier.kind.is_savepoint())
                .map(|(id, _)| *id)
                .collect();
            for id in older {
                self.abort(id, now, AbortReason::Subsumed { by: checkpoint }, out);
            }
            out.push(Decision::NotifyComplete { checkpoint });
        }
        // A final checkpoint whose manifest landed after a failover was decided: complete, but the
        // job still fails over.
        if p.barrier.kind.ends_input() && self.phase != Phase::FailingOver {
            assert_eq!(self.phase, Phase::Finishing(checkpoint));
            self.phase = Phase::Draining(checkpoint);
        }
    }

    fn abort(&mut self, id: CheckpointId, now: TimeMs, reason: AbortReason, out: &mut Vec<Decision<R>>) {
        let p = self.pending.remove(&id).expect("abort of a checkpoint not pending");
        let slowest = self.tasks.iter().find(|t| !p.acks.contains_key(t)).copied();
        self.record(p.barrier, now, Outcome::Aborted(reason.clone()), slowest, p.acks.len());
        self.last_end_at = Some(now);
        // A failed savepoint is reported to whoever asked for it; it does not bring the job closer to
        // a failover (a failed stop-with-savepoint fails over anyway: its sources ended their input).
        let counts = reason.counts_as_failure() && !p.barrier.kind.is_savepoint();
        let last = if counts { reason.to_string() } else { String::new() };
        out.push(Decision::Abort { checkpoint: id, reason });
        if counts {
            self.failed_count += 1;
            self.consecutive_failures += 1;
            // Once the checkpoint that ends the job is complete (draining), an older one failing late
            // changes nothing.
            if self.consecutive_failures > self.config.tolerable_failures
                && !matches!(self.phase, Phase::Draining(_))
                && self.phase != Phase::FailingOver
                && self.phase != Phase::Finished
            {
                let n = self.consecutive_failures;
                self.fail_over(
                    now,
                    format!(
                        "{n} consecutive checkpoint failures (tolerable: {}); the last: checkpoint {id} {last}",
                        self.config.tolerable_failures
                    ),
                    out,
                );
            }
        }
    }

    fn abort_all(&mut self, now: TimeMs, reason: AbortReason, out: &mut Vec<Decision<R>>) {
        let ids: Vec<CheckpointId> = self.pending.keys().copied().collect();
        for id in ids {
            self.abort(id, now, reason.clone(), out);
        }
    }

    fn fail_over(&mut self, now: TimeMs, reason: String, out: &mut Vec<Decision<R>>) {
        self.phase = Phase::FailingOver;
        // Checkpoints whose manifest is being written stay with storage as the judge; the rest are aborted.
        let ids: Vec<CheckpointId> = self.pending.iter().filter(|(_, p)| !p.committing).map(|(id, _)| *id).collect();
        for id in ids {
            self.abort(id, now, AbortReason::FailOver, out);
        }
        out.push(Decision::FailOver { reason });
    }

    fn record(&mut self, barrier: Barrier, now: TimeMs, outcome: Outcome, slowest_task: Option<TaskId>, acked: usize) {
        if self.history.len() == STATS_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(CheckpointStats {
            checkpoint: barrier.checkpoint,
            kind: barrier.kind,
            triggered_at: barrier.triggered_at,
            ended_at: now,
            outcome,
            slowest_task,
            acked,
        });
    }
}

/// How failover reasons name the checkpoint that ends the input.
fn ending_name(kind: SnapshotKind) -> &'static str {
    match kind {
        SnapshotKind::StopSavepoint => "stop-with-savepoint",
        _ => "final checkpoint",
    }
}
