//! The checkpoint coordinator as a pure state machine.
//!
//! It owns: when to trigger a checkpoint, which epoch it gets, which tasks still owe an acknowledgement,
//! when a checkpoint is complete, when to abort one, when to fail the job over, and when the job is
//! finished. It does not: read clocks (time is an argument), write files (it asks for a manifest commit
//! and waits for the outcome), talk to tasks (it returns decisions the runtime delivers), or choose the
//! checkpoint to restore (see [`crate::restart`]).
//!
//! The acknowledgement payload `R` (the task's state handle) is opaque here; the coordinator only
//! collects it and hands it back in [`Decision::CommitManifest`].

use crate::barrier::{Alignment, Barrier, CheckpointMode, SnapshotKind};
use crate::ids::{CheckpointId, Generation, TaskId, TimeMs};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How many epochs one lease reserves. The runtime persists the lease end before the coordinator may
/// issue an epoch below it, so a restarted process never reuses an epoch.
pub const EPOCH_LEASE_BLOCK: u64 = 10_000;
/// How many finished checkpoints' statistics the coordinator keeps.
pub const STATS_HISTORY: usize = 256;

/// Checkpointing settings. Defaults are documented on each field.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointConfig {
    /// Time between checkpoint triggers; `None` turns periodic checkpoints off (the final checkpoint
    /// at end of input is still taken). Default 1000 ms.
    pub interval_ms: Option<u64>,
    /// A checkpoint not complete this long after its trigger is aborted. Default 60 000 ms.
    pub timeout_ms: u64,
    /// Minimum time between the end of one checkpoint and the trigger of the next. Default 0.
    pub min_pause_ms: u64,
    /// Checkpoints in flight at once. Default 1.
    pub max_concurrent: usize,
    /// Consecutive failed checkpoints (timeout, a task's decline, a failed manifest write) tolerated
    /// before the job fails over. Aborts caused by a failover, and subsumed checkpoints, do not count.
    /// Default 3.
    pub tolerable_failures: u32,
    /// Alignment mode carried by barriers. Default exactly-once.
    pub mode: CheckpointMode,
    /// Exactly-once checkpoints are unaligned: barriers overtake queued records, which are persisted as
    /// channel state, so a checkpoint does not wait for a backlog. Default false. Savepoints are always
    /// aligned.
    pub unaligned: bool,
    /// An aligned checkpoint that a task has been aligning for this long switches to unaligned at that
    /// task (and downstream). Default off.
    pub alignment_timeout_ms: Option<u64>,
    /// An aligned checkpoint whose blocked inputs at a task hold more than this many bytes switches to
    /// unaligned there. Default off.
    pub max_aligned_bytes: Option<u64>,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            interval_ms: Some(1000),
            timeout_ms: 60_000,
            min_pause_ms: 0,
            max_concurrent: 1,
            tolerable_failures: 3,
            mode: CheckpointMode::ExactlyOnce,
            unaligned: false,
            alignment_timeout_ms: None,
            max_aligned_bytes: None,
        }
    }
}

impl CheckpointConfig {
    /// Reject settings that cannot work, with a message that says what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.interval_ms == Some(0) {
            return Err("checkpoint interval must be positive (or off)".into());
        }
        if self.timeout_ms == 0 {
            return Err("checkpoint timeout must be positive".into());
        }
        if self.max_concurrent == 0 {
            return Err("max concurrent checkpoints must be at least 1".into());
        }
        if self.mode == CheckpointMode::AtLeastOnce
            && (self.unaligned || self.alignment_timeout_ms.is_some() || self.max_aligned_bytes.is_some())
        {
            return Err("unaligned checkpoints and alignment limits apply to exactly-once mode; at-least-once never blocks an input".into());
        }
        Ok(())
    }

    /// How the barriers of a checkpoint of `kind` align under these settings. Only periodic
    /// checkpoints may be unaligned: savepoints must be self-contained and portable, and after the
    /// checkpoint that ends the input (final, stop-with-savepoint) no later checkpoint would commit
    /// the sink output of records it overtook.
    pub fn alignment_for(&self, kind: SnapshotKind) -> Alignment {
        if kind != SnapshotKind::Checkpoint || self.mode == CheckpointMode::AtLeastOnce {
            Alignment::Aligned
        } else if self.unaligned {
            Alignment::Unaligned
        } else if self.alignment_timeout_ms.is_some() || self.max_aligned_bytes.is_some() {
            Alignment::AlignedWithTimeout {
                timeout_ms: self.alignment_timeout_ms.unwrap_or(u64::MAX),
                max_blocked_bytes: self.max_aligned_bytes.unwrap_or(u64::MAX),
            }
        } else {
            Alignment::Aligned
        }
    }
}

/// Inputs to the coordinator.
#[derive(Clone, Debug)]
pub enum Event<R> {
    /// Time passed; periodic triggers and timeouts are evaluated.
    Tick,
    /// A task's part of `checkpoint` is durable.
    Acked { generation: Generation, checkpoint: CheckpointId, task: TaskId, report: R },
    /// A task could not take its part of `checkpoint` (for example a storage write failed).
    Declined { generation: Generation, checkpoint: CheckpointId, task: TaskId, reason: String },
    /// A task died.
    TaskFailed { generation: Generation, task: TaskId, reason: String },
    /// A bounded source read its last record.
    SourceFinished { generation: Generation, task: TaskId },
    /// A task saw end of input everywhere, its final checkpoint is complete and its sinks committed.
    TaskFinished { generation: Generation, task: TaskId },
    /// The manifest asked for by [`Decision::CommitManifest`] is durable: the checkpoint is complete.
    ManifestCommitted { checkpoint: CheckpointId },
    /// The manifest write failed (it may or may not be durable; storage is the judge at restore).
    ManifestFailed { checkpoint: CheckpointId, reason: String },
    /// The lease asked for by [`Decision::ExtendLease`] is durable.
    LeaseExtended { lease_end: CheckpointId },
    /// The user asks for a savepoint now; with `stop`, the job stops once it is complete.
    SavepointRequested { stop: bool },
}

/// Why a checkpoint was aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortReason {
    Timeout {
        missing: Vec<TaskId>,
    },
    Declined {
        task: TaskId,
        reason: String,
    },
    ManifestFailed(String),
    /// A newer checkpoint completed first.
    Subsumed {
        by: CheckpointId,
    },
    /// The job is failing over.
    FailOver,
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbortReason::Timeout { missing } => write!(f, "timed out waiting for {missing:?}"),
            AbortReason::Declined { task, reason } => write!(f, "declined by {task}: {reason}"),
            AbortReason::ManifestFailed(r) => write!(f, "manifest write failed: {r}"),
            AbortReason::Subsumed { by } => write!(f, "subsumed by {by}"),
            AbortReason::FailOver => f.write_str("aborted by a failover"),
        }
    }
}

impl AbortReason {
    /// Does this abort count against [`CheckpointConfig::tolerable_failures`]?
    pub fn counts_as_failure(&self) -> bool {
        matches!(self, AbortReason::Timeout { .. } | AbortReason::Declined { .. } | AbortReason::ManifestFailed(_))
    }
}

/// Outputs of the coordinator, to be carried out by the runtime in order.
#[derive(Clone, Debug)]
pub enum Decision<R> {
    /// Durably record that epochs below `lease_end` may be issued, then report [`Event::LeaseExtended`].
    ExtendLease { lease_end: CheckpointId },
    /// Inject this barrier at every source task.
    Trigger { barrier: Barrier },
    /// Every task acked: write the manifest (the commit point), then report the outcome.
    CommitManifest { checkpoint: CheckpointId, kind: SnapshotKind, generation: Generation, reports: Vec<(TaskId, R)> },
    /// The checkpoint is complete: tell every task (sinks commit everything up to it) and collect garbage.
    NotifyComplete { checkpoint: CheckpointId },
    /// Tell tasks the checkpoint will never complete and discard its partial artifacts.
    Abort { checkpoint: CheckpointId, reason: AbortReason },
    /// Tear the job down and restore it from the latest complete checkpoint.
    FailOver { reason: String },
    /// The final checkpoint (or the savepoint of a stop-with-savepoint) is complete and every task
    /// finished: the job is done (`kind` Final) or stopped (`kind` StopSavepoint).
    JobFinished { checkpoint: CheckpointId, kind: SnapshotKind },
    /// A savepoint request cannot be carried out now.
    SavepointRejected { reason: String },
}

/// How a checkpoint ended, for statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    Aborted(AbortReason),
}

/// Statistics of one finished checkpoint attempt.
#[derive(Clone, Debug)]
pub struct CheckpointStats {
    pub checkpoint: CheckpointId,
    pub kind: SnapshotKind,
    pub triggered_at: TimeMs,
    pub ended_at: TimeMs,
    pub outcome: Outcome,
    /// The task whose acknowledgement came last (or is still missing): the one that held it up.
    pub slowest_task: Option<TaskId>,
    /// Acknowledgements received.
    pub acked: usize,
}

impl CheckpointStats {
    pub fn duration_ms(&self) -> u64 {
        self.ended_at.saturating_sub(self.triggered_at)
    }
}

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
    /// this job; `lease_end` is the durable lease (ids `< lease_end` may be issued).
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

    pub fn generation(&self) -> Generation {
        self.generation
    }
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }
    /// Change settings while the job runs; they apply from the next trigger.
    pub fn set_config(&mut self, config: CheckpointConfig) -> Result<(), String> {
        config.validate()?;
        self.config = config;
        Ok(())
    }
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
    pub fn pending(&self) -> Vec<CheckpointId> {
        self.pending.keys().copied().collect()
    }
    pub fn history(&self) -> impl Iterator<Item = &CheckpointStats> {
        self.history.iter()
    }
    pub fn completed_count(&self) -> u64 {
        self.completed_count
    }
    pub fn failed_count(&self) -> u64 {
        self.failed_count
    }
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }
    pub fn is_failing_over(&self) -> bool {
        self.phase == Phase::FailingOver
    }

    /// Start a new generation after a failover: every pending checkpoint is aborted (its artifacts are
    /// discarded), epochs continue above every epoch issued before.
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

    /// Feed one event at time `now`; decisions are appended to `out`.
    pub fn handle(&mut self, now: TimeMs, event: Event<R>, out: &mut Vec<Decision<R>>) {
        match event {
            Event::Tick => self.on_tick(now, out),
            Event::Acked { generation, checkpoint, task, report } => {
                if generation != self.generation {
                    return; // a late message from an older generation
                }
                assert!(self.tasks.contains(&task), "ack from unknown {task}");
                assert!(checkpoint < self.next_id, "ack for {checkpoint}, never triggered");
                let Some(p) = self.pending.get_mut(&checkpoint) else {
                    return; // aborted or subsumed meanwhile
                };
                let prev = p.acks.insert(task, (report, now));
                assert!(prev.is_none(), "{task} acked {checkpoint} twice");
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
                if generation != self.generation || !self.pending.contains_key(&checkpoint) {
                    return;
                }
                if self.pending[&checkpoint].committing {
                    return; // every task already acked; a stray decline cannot undo that
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
            Event::TaskFailed { generation, task, reason } => {
                if generation != self.generation || self.phase == Phase::FailingOver || self.phase == Phase::Finished {
                    return;
                }
                self.fail_over(now, format!("{task} failed: {reason}"), out);
            }
            Event::SourceFinished { generation, task } => {
                if generation != self.generation {
                    return;
                }
                assert!(self.sources.contains(&task), "{task} is not a source");
                self.finished_sources.insert(task);
                self.on_tick(now, out);
            }
            Event::TaskFinished { generation, task } => {
                if generation != self.generation || self.phase == Phase::FailingOver {
                    return; // sent before the failover was decided
                }
                let Phase::Draining(final_id) = self.phase else {
                    panic!("{task} finished before the final checkpoint completed (phase {:?})", self.phase);
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
                    return;
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
                assert!(lease_end > self.lease_end);
                self.lease_end = lease_end;
                self.lease_requested = false;
                if let Some(stop) = self.savepoint_wanted.take() {
                    self.savepoint(now, stop, out);
                }
                self.on_tick(now, out);
            }
            Event::SavepointRequested { stop } => self.savepoint(now, stop, out),
        }
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
            if now.saturating_sub(t) < interval {
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
            out.push(Decision::ExtendLease { lease_end: CheckpointId(self.lease_end.0 + EPOCH_LEASE_BLOCK) });
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
