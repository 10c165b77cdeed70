//! Scenario tests of the checkpoint coordinator (`cutline_core::coordinator`).
//!
//! Each test is a short story told with a small driver, [`Scenario`]: time moves with `at(t)`, events
//! go in with `tick()`, `ack(task, checkpoint)`, `decline(..)`, `fail(task)`, `manifest_ok(id)`, ...,
//! and every decision the coordinator makes must be claimed, in order, by an `expect_*` step. A
//! decision nobody claimed fails the test at the next event (or when the scenario is dropped), so
//! "and nothing else happened" is checked after every step, not only where a test says `quiet()`.
//!
//! Savepoints are requested with `savepoint()` / `stop_with_savepoint()`; their barriers are claimed with
//! `expect_savepoint_trigger(id)` / `expect_stop_savepoint_trigger(id)`, which also check that they are
//! exactly-once and aligned whatever the configuration says.
//!
//! The last test drives the coordinator with random event sequences over many seeds and checks the
//! protocol invariants after every step against a small model of what the coordinator may do.

use cutline_core::barrier::{Alignment, CheckpointMode, SnapshotKind};
use cutline_core::coordinator::{
    AbortReason, CheckpointConfig, Coordinator, Decision, Event, Outcome, Violation, EPOCH_LEASE_BLOCK,
    MAX_CONCURRENT_CHECKPOINTS, MIN_CONCURRENT_TRIGGER_GAP_MS,
};
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

mod alignment_settings;
mod completion;
mod end_of_input;
mod failover_and_lease;
mod random_checks;
mod random_model;
mod regressions;
mod savepoints;
mod triggers;
use random_model::*;

/// What a task acks with: (generation, checkpoint, task), so a test can tell whose report a manifest
/// carries.
pub(crate) type Report = (u64, u64, u32);

pub(crate) fn report(generation: u64, checkpoint: u64, task: u32) -> Report {
    (generation, checkpoint, task)
}

pub(crate) const DECLINE_REASON: &str = "disk full";
pub(crate) const MANIFEST_ERROR: &str = "bucket unavailable";

pub(crate) fn timeout(missing: &[u32]) -> AbortReason {
    AbortReason::Timeout { missing: missing.iter().map(|&t| TaskId(t)).collect() }
}
pub(crate) fn declined(task: u32) -> AbortReason {
    AbortReason::Declined { task: TaskId(task), reason: DECLINE_REASON.into() }
}
pub(crate) fn subsumed(by: u64) -> AbortReason {
    AbortReason::Subsumed { by: CheckpointId(by) }
}
pub(crate) fn manifest_failed() -> AbortReason {
    AbortReason::ManifestFailed(MANIFEST_ERROR.into())
}
pub(crate) const FAILOVER: AbortReason = AbortReason::FailOver;

// ------------------------------------------------------------------------------------------------
// The scenario driver
// ------------------------------------------------------------------------------------------------

/// A job to coordinate. Tasks are `0..tasks`; the sources are the first `sources` of them.
pub(crate) struct Job {
    pub(crate) cfg: CheckpointConfig,
    pub(crate) tasks: u32,
    pub(crate) sources: u32,
    pub(crate) first_id: u64,
    pub(crate) lease_end: u64,
}

/// Three tasks, one source, a checkpoint every 100 ms, 1 s timeout, one in flight, 3 tolerable failures.
pub(crate) fn job() -> Job {
    Job {
        cfg: CheckpointConfig {
            interval_ms: Some(100),
            timeout_ms: 1000,
            min_pause_ms: 0,
            max_concurrent: 1,
            tolerable_failures: 3,
            mode: CheckpointMode::ExactlyOnce,
            ..Default::default()
        },
        tasks: 3,
        sources: 1,
        first_id: 1,
        lease_end: 1_000_000,
    }
}

impl Job {
    pub(crate) fn tasks(mut self, n: u32) -> Job {
        self.tasks = n;
        self
    }
    pub(crate) fn sources(mut self, n: u32) -> Job {
        self.sources = n;
        self
    }
    pub(crate) fn no_periodic(mut self) -> Job {
        self.cfg.interval_ms = None;
        self
    }
    pub(crate) fn timeout(mut self, ms: u64) -> Job {
        self.cfg.timeout_ms = ms;
        self
    }
    pub(crate) fn min_pause(mut self, ms: u64) -> Job {
        self.cfg.min_pause_ms = ms;
        self
    }
    pub(crate) fn max_concurrent(mut self, n: usize) -> Job {
        self.cfg.max_concurrent = n;
        self
    }
    pub(crate) fn tolerable(mut self, n: u32) -> Job {
        self.cfg.tolerable_failures = n;
        self
    }
    pub(crate) fn at_least_once(mut self) -> Job {
        self.cfg.mode = CheckpointMode::AtLeastOnce;
        self
    }
    pub(crate) fn unaligned(mut self) -> Job {
        self.cfg.unaligned = true;
        self
    }
    pub(crate) fn alignment_timeout(mut self, ms: u64) -> Job {
        self.cfg.alignment_timeout_ms = Some(ms);
        self
    }
    /// Epochs start at `first_id`; the durable lease allows ids below `lease_end`.
    pub(crate) fn epochs(mut self, first_id: u64, lease_end: u64) -> Job {
        self.first_id = first_id;
        self.lease_end = lease_end;
        self
    }
    pub(crate) fn start(self) -> Scenario {
        self.start_at(0)
    }
    /// Deploy generation 1 at time `now`.
    pub(crate) fn start_at(self, now: u64) -> Scenario {
        let tasks: Vec<u32> = (0..self.tasks).collect();
        let sources: Vec<u32> = (0..self.sources).collect();
        let c = Coordinator::new(
            self.cfg,
            Generation(1),
            tasks.iter().map(|&t| TaskId(t)),
            sources.iter().map(|&t| TaskId(t)),
            CheckpointId(self.first_id),
            CheckpointId(self.lease_end),
            None,
            TimeMs(now),
        );
        Scenario { c, now, gen: 1, tasks, sources, sender_gen: None, queue: VecDeque::new(), refused: None }
    }
}

/// Drives one coordinator. Events are sent by the current generation unless `from_gen(g)` says
/// otherwise for the next event.
pub(crate) struct Scenario {
    pub(crate) c: Coordinator<Report>,
    pub(crate) now: u64,
    pub(crate) gen: u64,
    pub(crate) tasks: Vec<u32>,
    pub(crate) sources: Vec<u32>,
    pub(crate) sender_gen: Option<u64>,
    /// Decisions made and not yet claimed by an `expect_*` step.
    pub(crate) queue: VecDeque<Decision<Report>>,
    /// An event the coordinator refused, not yet claimed by `expect_refused`.
    pub(crate) refused: Option<Violation>,
}

impl Scenario {
    // --- time and events ---

    pub(crate) fn at(&mut self, now: u64) -> &mut Self {
        assert!(now >= self.now, "time runs forward: t={now} after t={}", self.now);
        self.now = now;
        self
    }
    pub(crate) fn feed(&mut self, event: Event<Report>) -> &mut Self {
        assert!(
            self.queue.is_empty(),
            "t={}: unexpected decisions {:?} (before feeding {event:?})",
            self.now,
            self.queue
        );
        assert!(self.refused.is_none(), "t={}: unexpected refusal {:?}", self.now, self.refused);
        let mut out = Vec::new();
        if let Err(v) = self.c.handle(TimeMs(self.now), event, &mut out) {
            assert!(out.is_empty(), "t={}: a refused event made decisions {out:?}", self.now);
            self.refused = Some(v);
        }
        self.queue.extend(out);
        self
    }
    /// The last event was refused as a protocol violation of `task` mentioning `what`.
    pub(crate) fn expect_refused(&mut self, task: u32, what: &str) -> &mut Self {
        let v = self.refused.take().unwrap_or_else(|| panic!("t={}: nothing was refused", self.now));
        assert_eq!(v.task, TaskId(task), "t={}: {v}", self.now);
        assert!(v.what.contains(what), "t={}: refusal {v:?} does not mention {what:?}", self.now);
        self
    }
    pub(crate) fn sender(&mut self) -> Generation {
        Generation(self.sender_gen.take().unwrap_or(self.gen))
    }
    /// The next event comes from generation `gen` (a late message of an older incarnation).
    #[allow(clippy::wrong_self_convention)] // reads as prose: "from gen 1"
    pub(crate) fn from_gen(&mut self, gen: u64) -> &mut Self {
        self.sender_gen = Some(gen);
        self
    }
    pub(crate) fn tick(&mut self) -> &mut Self {
        self.feed(Event::Tick)
    }
    /// Tick every millisecond up to and including `end`; nothing may happen.
    pub(crate) fn quiet_until(&mut self, end: u64) -> &mut Self {
        self.quiet();
        while self.now < end {
            self.now += 1;
            self.tick().quiet();
        }
        self
    }
    pub(crate) fn ack(&mut self, task: u32, id: u64) -> &mut Self {
        let g = self.sender();
        self.feed(Event::Acked {
            generation: g,
            checkpoint: CheckpointId(id),
            task: TaskId(task),
            report: report(g.0, id, task),
        })
    }
    pub(crate) fn ack_all(&mut self, id: u64) -> &mut Self {
        for task in self.tasks.clone() {
            self.ack(task, id);
        }
        self
    }
    pub(crate) fn decline(&mut self, task: u32, id: u64) -> &mut Self {
        let g = self.sender();
        self.feed(Event::Declined {
            generation: g,
            checkpoint: CheckpointId(id),
            task: TaskId(task),
            reason: DECLINE_REASON.into(),
        })
    }
    pub(crate) fn fail(&mut self, task: u32) -> &mut Self {
        let g = self.sender();
        self.feed(Event::TaskFailed { generation: g, task: TaskId(task), reason: "killed".into(), permanent: false })
    }
    pub(crate) fn source_finished(&mut self, task: u32) -> &mut Self {
        let g = self.sender();
        self.feed(Event::SourceFinished { generation: g, task: TaskId(task) })
    }
    pub(crate) fn task_finished(&mut self, task: u32) -> &mut Self {
        let g = self.sender();
        self.feed(Event::TaskFinished { generation: g, task: TaskId(task) })
    }
    pub(crate) fn all_tasks_finished(&mut self) -> &mut Self {
        for task in self.tasks.clone() {
            self.task_finished(task);
        }
        self
    }
    pub(crate) fn manifest_ok(&mut self, id: u64) -> &mut Self {
        self.feed(Event::ManifestCommitted { checkpoint: CheckpointId(id) })
    }
    pub(crate) fn manifest_failed(&mut self, id: u64) -> &mut Self {
        self.feed(Event::ManifestFailed { checkpoint: CheckpointId(id), reason: MANIFEST_ERROR.into() })
    }
    pub(crate) fn lease_extended(&mut self, lease_end: u64) -> &mut Self {
        self.feed(Event::LeaseExtended { lease_end: CheckpointId(lease_end) })
    }
    /// The user asks for a savepoint.
    pub(crate) fn savepoint(&mut self) -> &mut Self {
        self.feed(Event::SavepointRequested { stop: false })
    }
    /// The user asks to stop the job with a savepoint.
    pub(crate) fn stop_with_savepoint(&mut self) -> &mut Self {
        self.feed(Event::SavepointRequested { stop: true })
    }
    /// Start the next generation with the same tasks, restoring `restored`.
    pub(crate) fn restart(&mut self, restored: Option<u64>) -> &mut Self {
        self.quiet();
        self.gen += 1;
        let mut out = Vec::new();
        self.c.restart(
            Generation(self.gen),
            self.tasks.iter().map(|&t| TaskId(t)),
            self.sources.iter().map(|&t| TaskId(t)),
            restored.map(CheckpointId),
            TimeMs(self.now),
            &mut out,
        );
        self.queue.extend(out);
        self
    }
    /// Every task acks `id`, its manifest commits, and it is announced complete.
    pub(crate) fn complete(&mut self, id: u64) -> &mut Self {
        self.ack_all(id).expect_commit(id).manifest_ok(id).expect_notify(id)
    }
    pub(crate) fn complete_final(&mut self, id: u64) -> &mut Self {
        self.ack_all(id).expect_final_commit(id).manifest_ok(id).expect_notify(id)
    }
    pub(crate) fn complete_savepoint(&mut self, id: u64) -> &mut Self {
        self.ack_all(id).expect_commit_of(id, SnapshotKind::Savepoint).manifest_ok(id).expect_notify(id)
    }
    pub(crate) fn complete_stop_savepoint(&mut self, id: u64) -> &mut Self {
        self.ack_all(id).expect_commit_of(id, SnapshotKind::StopSavepoint).manifest_ok(id).expect_notify(id)
    }

    // --- expectations: each claims the next decision ---

    pub(crate) fn next(&mut self, what: &str) -> Decision<Report> {
        self.queue
            .pop_front()
            .unwrap_or_else(|| panic!("t={}: expected {what}, but no further decision was made", self.now))
    }
    /// Nothing (more) was decided.
    pub(crate) fn quiet(&mut self) -> &mut Self {
        assert!(self.queue.is_empty(), "t={}: unexpected decisions {:?}", self.now, self.queue);
        assert!(self.refused.is_none(), "t={}: unexpected refusal {:?}", self.now, self.refused);
        self
    }
    pub(crate) fn expect_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_trigger_of(id, SnapshotKind::Checkpoint)
    }
    pub(crate) fn expect_final_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_trigger_of(id, SnapshotKind::Final)
    }
    /// A savepoint barrier: exactly-once and aligned, whatever the configuration says.
    pub(crate) fn expect_savepoint_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_barrier(id, SnapshotKind::Savepoint, CheckpointMode::ExactlyOnce, Alignment::Aligned)
    }
    pub(crate) fn expect_stop_savepoint_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_barrier(id, SnapshotKind::StopSavepoint, CheckpointMode::ExactlyOnce, Alignment::Aligned)
    }
    /// A checkpoint barrier carries the configured mode and alignment.
    pub(crate) fn expect_trigger_of(&mut self, id: u64, kind: SnapshotKind) -> &mut Self {
        let cfg = self.c.config().clone();
        self.expect_barrier(id, kind, cfg.mode, cfg.alignment_for(kind))
    }
    pub(crate) fn expect_barrier(
        &mut self,
        id: u64,
        kind: SnapshotKind,
        mode: CheckpointMode,
        alignment: Alignment,
    ) -> &mut Self {
        let what =
            format!("a {kind:?} trigger of chk-{id} ({mode:?}, {alignment:?}) in gen-{} at t={}", self.gen, self.now);
        match self.next(&what) {
            Decision::Trigger { barrier }
                if barrier.checkpoint == CheckpointId(id)
                    && barrier.kind == kind
                    && barrier.generation == Generation(self.gen)
                    && barrier.triggered_at == TimeMs(self.now)
                    && barrier.mode == mode
                    && barrier.alignment == alignment => {}
            other => panic!("t={}: expected {what}, got {other:?}", self.now),
        }
        self
    }
    pub(crate) fn expect_commit(&mut self, id: u64) -> &mut Self {
        self.expect_commit_of(id, SnapshotKind::Checkpoint)
    }
    pub(crate) fn expect_final_commit(&mut self, id: u64) -> &mut Self {
        self.expect_commit_of(id, SnapshotKind::Final)
    }
    /// CommitManifest for `id`, carrying every task's own report exactly once.
    pub(crate) fn expect_commit_of(&mut self, id: u64, kind: SnapshotKind) -> &mut Self {
        let want: Vec<(TaskId, Report)> = self.tasks.iter().map(|&t| (TaskId(t), report(self.gen, id, t))).collect();
        let what = format!("CommitManifest of {kind:?} chk-{id} in gen-{}", self.gen);
        match self.next(&what) {
            Decision::CommitManifest { checkpoint, kind: k, generation, reports }
                if checkpoint == CheckpointId(id) && k == kind && generation == Generation(self.gen) =>
            {
                assert_eq!(reports, want, "t={}: chk-{id} must carry every task's report exactly once", self.now)
            }
            other => panic!("t={}: expected {what}, got {other:?}", self.now),
        }
        self
    }
    pub(crate) fn expect_notify(&mut self, id: u64) -> &mut Self {
        match self.next(&format!("NotifyComplete of chk-{id}")) {
            Decision::NotifyComplete { checkpoint } if checkpoint == CheckpointId(id) => {}
            other => panic!("t={}: expected NotifyComplete of chk-{id}, got {other:?}", self.now),
        }
        self
    }
    pub(crate) fn expect_abort(&mut self, id: u64, why: AbortReason) -> &mut Self {
        let what = format!("Abort of chk-{id} because {why:?}");
        match self.next(&what) {
            Decision::Abort { checkpoint, reason } if checkpoint == CheckpointId(id) && reason == why => {}
            other => panic!("t={}: expected {what}, got {other:?}", self.now),
        }
        self
    }
    pub(crate) fn expect_failover(&mut self) -> &mut Self {
        self.expect_failover_mentioning("")
    }
    pub(crate) fn expect_failover_mentioning(&mut self, words: &str) -> &mut Self {
        match self.next("FailOver") {
            Decision::FailOver { reason } if reason.contains(words) => {}
            other => panic!("t={}: expected FailOver mentioning {words:?}, got {other:?}", self.now),
        }
        assert!(self.c.is_failing_over());
        self
    }
    pub(crate) fn expect_extend_lease(&mut self, lease_end: u64) -> &mut Self {
        match self.next(&format!("ExtendLease to {lease_end}")) {
            Decision::ExtendLease { lease_end: e } if e == CheckpointId(lease_end) => {}
            other => panic!("t={}: expected ExtendLease to {lease_end}, got {other:?}", self.now),
        }
        self
    }
    pub(crate) fn expect_epochs_exhausted(&mut self, lease_end: u64) -> &mut Self {
        match self.next(&format!("EpochsExhausted at {lease_end}")) {
            Decision::EpochsExhausted { lease_end: e } if e == CheckpointId(lease_end) => {}
            other => panic!("t={}: expected EpochsExhausted at {lease_end}, got {other:?}", self.now),
        }
        self
    }
    /// The job is done: its final checkpoint `id` is complete and every task finished.
    pub(crate) fn expect_job_finished(&mut self, id: u64) -> &mut Self {
        self.expect_job_finished_by(id, SnapshotKind::Final)
    }
    /// The job stopped: its stop-savepoint `id` is complete and every task finished.
    pub(crate) fn expect_job_stopped(&mut self, id: u64) -> &mut Self {
        self.expect_job_finished_by(id, SnapshotKind::StopSavepoint)
    }
    pub(crate) fn expect_job_finished_by(&mut self, id: u64, kind: SnapshotKind) -> &mut Self {
        let what = format!("JobFinished at {kind:?} chk-{id}");
        match self.next(&what) {
            Decision::JobFinished { checkpoint, kind: k } if checkpoint == CheckpointId(id) && k == kind => {}
            other => panic!("t={}: expected {what}, got {other:?}", self.now),
        }
        assert!(self.c.is_finished());
        self
    }
    pub(crate) fn expect_savepoint_rejected(&mut self, words: &str) -> &mut Self {
        match self.next("SavepointRejected") {
            Decision::SavepointRejected { reason } if reason.contains(words) => {}
            other => panic!("t={}: expected SavepointRejected mentioning {words:?}, got {other:?}", self.now),
        }
        self
    }

    // --- state checks ---

    pub(crate) fn expect_pending(&mut self, ids: &[u64]) -> &mut Self {
        let want: Vec<CheckpointId> = ids.iter().map(|&i| CheckpointId(i)).collect();
        assert_eq!(self.c.pending(), want, "t={}: pending checkpoints", self.now);
        self
    }
    pub(crate) fn expect_last_completed(&mut self, id: Option<u64>) -> &mut Self {
        assert_eq!(self.c.last_completed(), id.map(CheckpointId), "t={}: last completed", self.now);
        self
    }
    /// The statistics of `id` record `outcome` with `acked` acknowledgements.
    pub(crate) fn expect_outcome(&mut self, id: u64, outcome: Outcome, acked: usize) -> &mut Self {
        let s = self
            .c
            .history()
            .filter(|s| s.checkpoint == CheckpointId(id))
            .last()
            .unwrap_or_else(|| panic!("no statistics for chk-{id}"));
        assert_eq!((&s.outcome, s.acked), (&outcome, acked), "statistics of chk-{id}");
        self
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if !std::thread::panicking() && !self.queue.is_empty() {
            panic!("the scenario ended with unclaimed decisions: {:?}", self.queue);
        }
    }
}
