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

/// What a task acks with: (generation, checkpoint, task), so a test can tell whose report a manifest
/// carries.
type Report = (u64, u64, u32);

fn report(generation: u64, checkpoint: u64, task: u32) -> Report {
    (generation, checkpoint, task)
}

const DECLINE_REASON: &str = "disk full";
const MANIFEST_ERROR: &str = "bucket unavailable";

fn timeout(missing: &[u32]) -> AbortReason {
    AbortReason::Timeout { missing: missing.iter().map(|&t| TaskId(t)).collect() }
}
fn declined(task: u32) -> AbortReason {
    AbortReason::Declined { task: TaskId(task), reason: DECLINE_REASON.into() }
}
fn subsumed(by: u64) -> AbortReason {
    AbortReason::Subsumed { by: CheckpointId(by) }
}
fn manifest_failed() -> AbortReason {
    AbortReason::ManifestFailed(MANIFEST_ERROR.into())
}
const FAILOVER: AbortReason = AbortReason::FailOver;

// ------------------------------------------------------------------------------------------------
// The scenario driver
// ------------------------------------------------------------------------------------------------

/// A job to coordinate. Tasks are `0..tasks`; the sources are the first `sources` of them.
struct Job {
    cfg: CheckpointConfig,
    tasks: u32,
    sources: u32,
    first_id: u64,
    lease_end: u64,
}

/// Three tasks, one source, a checkpoint every 100 ms, 1 s timeout, one in flight, 3 tolerable failures.
fn job() -> Job {
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
    fn tasks(mut self, n: u32) -> Job {
        self.tasks = n;
        self
    }
    fn sources(mut self, n: u32) -> Job {
        self.sources = n;
        self
    }
    fn no_periodic(mut self) -> Job {
        self.cfg.interval_ms = None;
        self
    }
    fn timeout(mut self, ms: u64) -> Job {
        self.cfg.timeout_ms = ms;
        self
    }
    fn min_pause(mut self, ms: u64) -> Job {
        self.cfg.min_pause_ms = ms;
        self
    }
    fn max_concurrent(mut self, n: usize) -> Job {
        self.cfg.max_concurrent = n;
        self
    }
    fn tolerable(mut self, n: u32) -> Job {
        self.cfg.tolerable_failures = n;
        self
    }
    fn at_least_once(mut self) -> Job {
        self.cfg.mode = CheckpointMode::AtLeastOnce;
        self
    }
    fn unaligned(mut self) -> Job {
        self.cfg.unaligned = true;
        self
    }
    fn alignment_timeout(mut self, ms: u64) -> Job {
        self.cfg.alignment_timeout_ms = Some(ms);
        self
    }
    /// Epochs start at `first_id`; the durable lease allows ids below `lease_end`.
    fn epochs(mut self, first_id: u64, lease_end: u64) -> Job {
        self.first_id = first_id;
        self.lease_end = lease_end;
        self
    }
    fn start(self) -> Scenario {
        self.start_at(0)
    }
    /// Deploy generation 1 at time `now`.
    fn start_at(self, now: u64) -> Scenario {
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
struct Scenario {
    c: Coordinator<Report>,
    now: u64,
    gen: u64,
    tasks: Vec<u32>,
    sources: Vec<u32>,
    sender_gen: Option<u64>,
    /// Decisions made and not yet claimed by an `expect_*` step.
    queue: VecDeque<Decision<Report>>,
    /// An event the coordinator refused, not yet claimed by `expect_refused`.
    refused: Option<Violation>,
}

impl Scenario {
    // --- time and events ---

    fn at(&mut self, now: u64) -> &mut Self {
        assert!(now >= self.now, "time runs forward: t={now} after t={}", self.now);
        self.now = now;
        self
    }
    fn feed(&mut self, event: Event<Report>) -> &mut Self {
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
    fn expect_refused(&mut self, task: u32, what: &str) -> &mut Self {
        let v = self.refused.take().unwrap_or_else(|| panic!("t={}: nothing was refused", self.now));
        assert_eq!(v.task, TaskId(task), "t={}: {v}", self.now);
        assert!(v.what.contains(what), "t={}: refusal {v:?} does not mention {what:?}", self.now);
        self
    }
    fn sender(&mut self) -> Generation {
        Generation(self.sender_gen.take().unwrap_or(self.gen))
    }
    /// The next event comes from generation `gen` (a late message of an older incarnation).
    #[allow(clippy::wrong_self_convention)] // reads as prose: "from gen 1"
    fn from_gen(&mut self, gen: u64) -> &mut Self {
        self.sender_gen = Some(gen);
        self
    }
    fn tick(&mut self) -> &mut Self {
        self.feed(Event::Tick)
    }
    /// Tick every millisecond up to and including `end`; nothing may happen.
    fn quiet_until(&mut self, end: u64) -> &mut Self {
        self.quiet();
        while self.now < end {
            self.now += 1;
            self.tick().quiet();
        }
        self
    }
    fn ack(&mut self, task: u32, id: u64) -> &mut Self {
        let g = self.sender();
        self.feed(Event::Acked {
            generation: g,
            checkpoint: CheckpointId(id),
            task: TaskId(task),
            report: report(g.0, id, task),
        })
    }
    fn ack_all(&mut self, id: u64) -> &mut Self {
        for task in self.tasks.clone() {
            self.ack(task, id);
        }
        self
    }
    fn decline(&mut self, task: u32, id: u64) -> &mut Self {
        let g = self.sender();
        self.feed(Event::Declined {
            generation: g,
            checkpoint: CheckpointId(id),
            task: TaskId(task),
            reason: DECLINE_REASON.into(),
        })
    }
    fn fail(&mut self, task: u32) -> &mut Self {
        let g = self.sender();
        self.feed(Event::TaskFailed { generation: g, task: TaskId(task), reason: "killed".into(), permanent: false })
    }
    fn source_finished(&mut self, task: u32) -> &mut Self {
        let g = self.sender();
        self.feed(Event::SourceFinished { generation: g, task: TaskId(task) })
    }
    fn task_finished(&mut self, task: u32) -> &mut Self {
        let g = self.sender();
        self.feed(Event::TaskFinished { generation: g, task: TaskId(task) })
    }
    fn all_tasks_finished(&mut self) -> &mut Self {
        for task in self.tasks.clone() {
            self.task_finished(task);
        }
        self
    }
    fn manifest_ok(&mut self, id: u64) -> &mut Self {
        self.feed(Event::ManifestCommitted { checkpoint: CheckpointId(id) })
    }
    fn manifest_failed(&mut self, id: u64) -> &mut Self {
        self.feed(Event::ManifestFailed { checkpoint: CheckpointId(id), reason: MANIFEST_ERROR.into() })
    }
    fn lease_extended(&mut self, lease_end: u64) -> &mut Self {
        self.feed(Event::LeaseExtended { lease_end: CheckpointId(lease_end) })
    }
    /// The user asks for a savepoint.
    fn savepoint(&mut self) -> &mut Self {
        self.feed(Event::SavepointRequested { stop: false })
    }
    /// The user asks to stop the job with a savepoint.
    fn stop_with_savepoint(&mut self) -> &mut Self {
        self.feed(Event::SavepointRequested { stop: true })
    }
    /// Start the next generation with the same tasks, restoring `restored`.
    fn restart(&mut self, restored: Option<u64>) -> &mut Self {
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
    fn complete(&mut self, id: u64) -> &mut Self {
        self.ack_all(id).expect_commit(id).manifest_ok(id).expect_notify(id)
    }
    fn complete_final(&mut self, id: u64) -> &mut Self {
        self.ack_all(id).expect_final_commit(id).manifest_ok(id).expect_notify(id)
    }
    fn complete_savepoint(&mut self, id: u64) -> &mut Self {
        self.ack_all(id).expect_commit_of(id, SnapshotKind::Savepoint).manifest_ok(id).expect_notify(id)
    }
    fn complete_stop_savepoint(&mut self, id: u64) -> &mut Self {
        self.ack_all(id).expect_commit_of(id, SnapshotKind::StopSavepoint).manifest_ok(id).expect_notify(id)
    }

    // --- expectations: each claims the next decision ---

    fn next(&mut self, what: &str) -> Decision<Report> {
        self.queue
            .pop_front()
            .unwrap_or_else(|| panic!("t={}: expected {what}, but no further decision was made", self.now))
    }
    /// Nothing (more) was decided.
    fn quiet(&mut self) -> &mut Self {
        assert!(self.queue.is_empty(), "t={}: unexpected decisions {:?}", self.now, self.queue);
        assert!(self.refused.is_none(), "t={}: unexpected refusal {:?}", self.now, self.refused);
        self
    }
    fn expect_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_trigger_of(id, SnapshotKind::Checkpoint)
    }
    fn expect_final_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_trigger_of(id, SnapshotKind::Final)
    }
    /// A savepoint barrier: exactly-once and aligned, whatever the configuration says.
    fn expect_savepoint_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_barrier(id, SnapshotKind::Savepoint, CheckpointMode::ExactlyOnce, Alignment::Aligned)
    }
    fn expect_stop_savepoint_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_barrier(id, SnapshotKind::StopSavepoint, CheckpointMode::ExactlyOnce, Alignment::Aligned)
    }
    /// A checkpoint barrier carries the configured mode and alignment.
    fn expect_trigger_of(&mut self, id: u64, kind: SnapshotKind) -> &mut Self {
        let cfg = self.c.config().clone();
        self.expect_barrier(id, kind, cfg.mode, cfg.alignment_for(kind))
    }
    fn expect_barrier(&mut self, id: u64, kind: SnapshotKind, mode: CheckpointMode, alignment: Alignment) -> &mut Self {
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
    fn expect_commit(&mut self, id: u64) -> &mut Self {
        self.expect_commit_of(id, SnapshotKind::Checkpoint)
    }
    fn expect_final_commit(&mut self, id: u64) -> &mut Self {
        self.expect_commit_of(id, SnapshotKind::Final)
    }
    /// CommitManifest for `id`, carrying every task's own report exactly once.
    fn expect_commit_of(&mut self, id: u64, kind: SnapshotKind) -> &mut Self {
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
    fn expect_notify(&mut self, id: u64) -> &mut Self {
        match self.next(&format!("NotifyComplete of chk-{id}")) {
            Decision::NotifyComplete { checkpoint } if checkpoint == CheckpointId(id) => {}
            other => panic!("t={}: expected NotifyComplete of chk-{id}, got {other:?}", self.now),
        }
        self
    }
    fn expect_abort(&mut self, id: u64, why: AbortReason) -> &mut Self {
        let what = format!("Abort of chk-{id} because {why:?}");
        match self.next(&what) {
            Decision::Abort { checkpoint, reason } if checkpoint == CheckpointId(id) && reason == why => {}
            other => panic!("t={}: expected {what}, got {other:?}", self.now),
        }
        self
    }
    fn expect_failover(&mut self) -> &mut Self {
        self.expect_failover_mentioning("")
    }
    fn expect_failover_mentioning(&mut self, words: &str) -> &mut Self {
        match self.next("FailOver") {
            Decision::FailOver { reason } if reason.contains(words) => {}
            other => panic!("t={}: expected FailOver mentioning {words:?}, got {other:?}", self.now),
        }
        assert!(self.c.is_failing_over());
        self
    }
    fn expect_extend_lease(&mut self, lease_end: u64) -> &mut Self {
        match self.next(&format!("ExtendLease to {lease_end}")) {
            Decision::ExtendLease { lease_end: e } if e == CheckpointId(lease_end) => {}
            other => panic!("t={}: expected ExtendLease to {lease_end}, got {other:?}", self.now),
        }
        self
    }
    fn expect_epochs_exhausted(&mut self, lease_end: u64) -> &mut Self {
        match self.next(&format!("EpochsExhausted at {lease_end}")) {
            Decision::EpochsExhausted { lease_end: e } if e == CheckpointId(lease_end) => {}
            other => panic!("t={}: expected EpochsExhausted at {lease_end}, got {other:?}", self.now),
        }
        self
    }
    /// The job is done: its final checkpoint `id` is complete and every task finished.
    fn expect_job_finished(&mut self, id: u64) -> &mut Self {
        self.expect_job_finished_by(id, SnapshotKind::Final)
    }
    /// The job stopped: its stop-savepoint `id` is complete and every task finished.
    fn expect_job_stopped(&mut self, id: u64) -> &mut Self {
        self.expect_job_finished_by(id, SnapshotKind::StopSavepoint)
    }
    fn expect_job_finished_by(&mut self, id: u64, kind: SnapshotKind) -> &mut Self {
        let what = format!("JobFinished at {kind:?} chk-{id}");
        match self.next(&what) {
            Decision::JobFinished { checkpoint, kind: k } if checkpoint == CheckpointId(id) && k == kind => {}
            other => panic!("t={}: expected {what}, got {other:?}", self.now),
        }
        assert!(self.c.is_finished());
        self
    }
    fn expect_savepoint_rejected(&mut self, words: &str) -> &mut Self {
        match self.next("SavepointRejected") {
            Decision::SavepointRejected { reason } if reason.contains(words) => {}
            other => panic!("t={}: expected SavepointRejected mentioning {words:?}, got {other:?}", self.now),
        }
        self
    }

    // --- state checks ---

    fn expect_pending(&mut self, ids: &[u64]) -> &mut Self {
        let want: Vec<CheckpointId> = ids.iter().map(|&i| CheckpointId(i)).collect();
        assert_eq!(self.c.pending(), want, "t={}: pending checkpoints", self.now);
        self
    }
    fn expect_last_completed(&mut self, id: Option<u64>) -> &mut Self {
        assert_eq!(self.c.last_completed(), id.map(CheckpointId), "t={}: last completed", self.now);
        self
    }
    /// The statistics of `id` record `outcome` with `acked` acknowledgements.
    fn expect_outcome(&mut self, id: u64, outcome: Outcome, acked: usize) -> &mut Self {
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

// ------------------------------------------------------------------------------------------------
// Periodic triggering
// ------------------------------------------------------------------------------------------------

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn first_checkpoint_of_a_generation_waits_one_interval() {
    let mut s = job().start_at(1000);
    s.quiet_until(1099)
        .at(1100).tick().expect_trigger(1)
        .at(1130).complete(1)
        .quiet_until(1199)
        .at(1200).tick().expect_trigger(2);
}

/// Trigger times of a job ticked every 10 ms up to `until`, where every checkpoint completes `takes`
/// ms after its trigger (never, for `None`).
fn trigger_times(cfg: CheckpointConfig, takes: Option<u64>, until: u64) -> Vec<u64> {
    let tasks = [TaskId(0), TaskId(1)];
    let mut c: Coordinator<Report> = Coordinator::new(
        cfg,
        Generation(1),
        tasks,
        [TaskId(0)],
        CheckpointId(1),
        CheckpointId(1_000_000),
        None,
        TimeMs(0),
    );
    let mut due: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut times = Vec::new();
    let mut out = Vec::new();
    for now in (0..=until).step_by(10) {
        for id in due.remove(&now).unwrap_or_default() {
            for t in tasks {
                let ack = Event::Acked {
                    generation: Generation(1),
                    checkpoint: CheckpointId(id),
                    task: t,
                    report: report(1, id, t.0),
                };
                c.handle(TimeMs(now), ack, &mut out).unwrap();
            }
            let done = Event::ManifestCommitted { checkpoint: CheckpointId(id) };
            c.handle(TimeMs(now), done, &mut out).unwrap();
        }
        c.handle(TimeMs(now), Event::Tick, &mut out).unwrap();
        for d in out.drain(..) {
            if let Decision::Trigger { barrier } = d {
                times.push(now);
                if let Some(ms) = takes {
                    due.entry(now + ms).or_default().push(barrier.checkpoint.0);
                }
            }
        }
    }
    times
}

#[test]
fn periodic_triggers_follow_interval_min_pause_and_max_concurrent() {
    struct Row {
        what: &'static str,
        interval: u64,
        min_pause: u64,
        max_concurrent: usize,
        timeout: u64,
        takes: Option<u64>,
        triggers: &'static [u64],
    }
    #[rustfmt::skip]
    let table = [
        Row { what: "fast checkpoints: one per interval, the first after one interval",
              interval: 100, min_pause: 0, max_concurrent: 1, timeout: 1000, takes: Some(30),
              triggers: &[100, 200, 300, 400, 500, 600, 700] },
        Row { what: "a slow checkpoint holds the only slot; the next goes when it ends",
              interval: 100, min_pause: 0, max_concurrent: 1, timeout: 1000, takes: Some(150),
              triggers: &[100, 250, 400, 550, 700] },
        Row { what: "min pause counts from the end of the previous checkpoint",
              interval: 100, min_pause: 80, max_concurrent: 1, timeout: 1000, takes: Some(50),
              triggers: &[100, 230, 360, 490, 620] },
        Row { what: "a min pause shorter than the gap changes nothing",
              interval: 100, min_pause: 40, max_concurrent: 1, timeout: 1000, takes: Some(50),
              triggers: &[100, 200, 300, 400, 500, 600, 700] },
        Row { what: "two in flight: a third waits for a free slot",
              interval: 100, min_pause: 0, max_concurrent: 2, timeout: 1000, takes: Some(250),
              triggers: &[100, 200, 350, 450, 600, 700] },
        Row { what: "three in flight are enough: the interval alone decides",
              interval: 100, min_pause: 0, max_concurrent: 3, timeout: 1000, takes: Some(250),
              triggers: &[100, 200, 300, 400, 500, 600, 700] },
        Row { what: "a checkpoint that never completes holds its slot until it times out",
              interval: 100, min_pause: 0, max_concurrent: 1, timeout: 250, takes: None,
              triggers: &[100, 350, 600] },
        Row { what: "a short interval with many in flight: concurrent triggers keep the 50 ms gap",
              interval: 10, min_pause: 0, max_concurrent: 16, timeout: 1000, takes: Some(250),
              triggers: &[10, 60, 110, 160, 210, 260, 310, 360, 410, 460, 510, 560, 610, 660] },
        Row { what: "a short interval with none in flight: the interval alone decides",
              interval: 10, min_pause: 0, max_concurrent: 16, timeout: 1000, takes: Some(10),
              triggers: &[10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170,
                          180, 190, 200, 210, 220, 230, 240, 250, 260, 270, 280, 290, 300, 310, 320,
                          330, 340, 350, 360, 370, 380, 390, 400, 410, 420, 430, 440, 450, 460, 470,
                          480, 490, 500, 510, 520, 530, 540, 550, 560, 570, 580, 590, 600, 610, 620,
                          630, 640, 650, 660, 670, 680, 690, 700] },
    ];
    for row in table {
        let cfg = CheckpointConfig {
            interval_ms: Some(row.interval),
            timeout_ms: row.timeout,
            min_pause_ms: row.min_pause,
            max_concurrent: row.max_concurrent,
            tolerable_failures: 3,
            mode: CheckpointMode::ExactlyOnce,
            ..Default::default()
        };
        assert_eq!(trigger_times(cfg, row.takes, 700), row.triggers, "{}", row.what);
    }
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn max_concurrent_caps_checkpoints_in_flight() {
    let mut s = job().max_concurrent(2).start();
    s.at(100).tick().expect_trigger(1)
        .at(200).tick().expect_trigger(2)
        .quiet_until(450) // two in flight: no third however long we wait
        .expect_pending(&[1, 2])
        .at(460).complete(1) // the older completes; the newer stays in flight
        .expect_pending(&[2])
        .tick().expect_trigger(3)
        .expect_pending(&[2, 3]);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn min_pause_runs_from_the_end_of_the_previous_checkpoint() {
    let mut s = job().min_pause(90).start();
    s.at(100).tick().expect_trigger(1)
        .at(150).complete(1)
        .quiet_until(239) // the interval passed at 200, the pause only at 240
        .at(240).tick().expect_trigger(2)
        .at(260).decline(0, 2).expect_abort(2, declined(0)) // an abort is an end too
        .quiet_until(349)
        .at(350).tick().expect_trigger(3);
}

// ------------------------------------------------------------------------------------------------
// Completion
// ------------------------------------------------------------------------------------------------

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn checkpoint_completes_only_after_every_ack_and_the_manifest() {
    let mut s = job().tasks(3).start();
    s.at(100).tick().expect_trigger(1)
        .at(110).ack(2, 1).quiet()
        .at(120).ack(0, 1).quiet()
        .at(130).ack(1, 1).expect_commit(1) // the last ack: every report, once, in task order
        .at(150).tick().quiet() // not complete before the manifest is durable
        .expect_pending(&[1])
        .expect_last_completed(None)
        .at(160).manifest_ok(1).expect_notify(1)
        .expect_pending(&[])
        .expect_last_completed(Some(1))
        .expect_outcome(1, Outcome::Completed, 3);
    let stats = s.c.history().last().unwrap();
    assert_eq!(stats.slowest_task, Some(TaskId(1)), "task 1 acked last");
    assert_eq!(stats.duration_ms(), 60);
    assert_eq!(s.c.completed_count(), 1);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn a_task_acking_twice_is_refused_and_counted_once_regression_assert_on_peer_events() {
    // A second ack of one task panicked the coordinator: one stale or buggy worker ended the job.
    let mut s = job().tasks(2).start();
    s.at(100).tick().expect_trigger(1).ack(0, 1).quiet()
        .ack(0, 1).expect_refused(0, "second acknowledgement").quiet()
        .ack(1, 1).expect_commit(1);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn events_the_protocol_does_not_allow_are_refused_and_change_nothing_regression_assert_on_peer_events() {
    // Each of these panicked the coordinator.
    let mut s = job().tasks(3).sources(1).start();
    s.at(100).tick().expect_trigger(1)
        .ack(7, 1).expect_refused(7, "a task gen-1 does not have")
        .ack(0, 9).expect_refused(0, "never triggered")
        .decline(9, 1).expect_refused(9, "a task gen-1 does not have")
        .fail(9).expect_refused(9, "a task gen-1 does not have")
        .source_finished(2).expect_refused(2, "not a source")
        .task_finished(1).expect_refused(1, "before the checkpoint that ends the job")
        .task_finished(8).expect_refused(8, "a task gen-1 does not have")
        .quiet()
        // Nothing of it counted: checkpoint 1 completes with the three real acks.
        .ack_all(1).expect_commit(1);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn a_committing_checkpoint_does_not_time_out() {
    let mut s = job().timeout(500).start();
    s.at(100).tick().expect_trigger(1)
        .at(200).ack_all(1).expect_commit(1)
        .at(5000).tick().quiet() // the manifest write is slow: storage decides, not the timer
        .at(5001).manifest_ok(1).expect_notify(1)
        .tick().expect_trigger(2);
}

// ------------------------------------------------------------------------------------------------
// Aborts and tolerable failures
// ------------------------------------------------------------------------------------------------

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn timeout_aborts_naming_the_missing_tasks_and_ignores_late_acks() {
    let mut s = job().tasks(3).timeout(500).start();
    s.at(100).tick().expect_trigger(1)
        .at(300).ack(1, 1).quiet()
        .at(599).tick().quiet()
        .at(600).tick()
        .expect_abort(1, timeout(&[0, 2]))
        .expect_trigger(2) // the slot is free at once
        .at(610).ack(0, 1).ack(2, 1).quiet() // late acks of the timed-out checkpoint: ignored
        .expect_pending(&[2])
        .expect_outcome(1, Outcome::Aborted(timeout(&[0, 2])), 1);
    assert_eq!(s.c.failed_count(), 1);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn decline_aborts_the_checkpoint() {
    let mut s = job().tasks(3).start();
    s.at(100).tick().expect_trigger(1)
        .at(110).ack(0, 1)
        .at(120).decline(1, 1).expect_abort(1, declined(1))
        .at(130).ack(2, 1).quiet() // too late
        .decline(2, 1).quiet() // already aborted: one abort only
        .expect_pending(&[])
        .at(200).tick().expect_trigger(2)
        .ack_all(2).expect_commit(2)
        .decline(0, 2).quiet() // every task acked: a stray decline cannot undo that
        .manifest_ok(2).expect_notify(2);
    assert_eq!(s.c.failed_count(), 1);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn third_consecutive_failure_fails_over_when_two_are_tolerable() {
    let mut s = job().tolerable(2).timeout(500).start();
    s.at(100).tick().expect_trigger(1)
        .at(600).tick()
        .expect_abort(1, timeout(&[0, 1, 2])) // failure 1: timeout
        .expect_trigger(2)
        .at(650).decline(0, 2).expect_abort(2, declined(0)) // failure 2: decline
        .at(750).tick().expect_trigger(3)
        .ack_all(3).expect_commit(3)
        .manifest_failed(3)
        .expect_abort(3, manifest_failed()) // failure 3: one too many
        .expect_failover_mentioning("3 consecutive")
        .at(900).tick().quiet(); // no checkpoints while failing over
    assert_eq!(s.c.failed_count(), 3);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn a_success_in_between_resets_the_failure_count() {
    let mut s = job().tolerable(2).start();
    s.at(100).tick().expect_trigger(1).decline(0, 1).expect_abort(1, declined(0))
        .at(200).tick().expect_trigger(2).decline(0, 2).expect_abort(2, declined(0))
        .at(300).tick().expect_trigger(3).complete(3) // the count starts over
        .at(400).tick().expect_trigger(4).decline(0, 4).expect_abort(4, declined(0))
        .at(500).tick().expect_trigger(5).decline(0, 5).expect_abort(5, declined(0))
        .at(600).tick().expect_trigger(6).decline(0, 6).expect_abort(6, declined(0))
        .expect_failover();
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn a_restart_resets_the_failure_count() {
    let mut s = job().tolerable(1).start();
    s.at(100).tick().expect_trigger(1).decline(0, 1).expect_abort(1, declined(0)) // failure 1
        .at(150).fail(2).expect_failover()
        .at(160).restart(None)
        .at(260).tick().expect_trigger(2).decline(0, 2).expect_abort(2, declined(0)) // 1 again, not 2
        .at(360).tick().expect_trigger(3).decline(0, 3).expect_abort(3, declined(0))
        .expect_failover_mentioning("2 consecutive");
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn subsumed_aborts_do_not_count_as_failures() {
    // Not a single failure is tolerated, yet subsuming is not one.
    let mut s = job().max_concurrent(2).tolerable(0).start();
    s.at(100).tick().expect_trigger(1)
        .at(200).tick().expect_trigger(2)
        .at(250).ack_all(2).expect_commit(2)
        .manifest_ok(2).expect_abort(1, subsumed(2)).expect_notify(2)
        .at(300).tick().expect_trigger(3);
    assert!(!s.c.is_failing_over());
    assert_eq!(s.c.failed_count(), 0);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn newer_checkpoint_completing_first_subsumes_the_older_one() {
    let mut s = job().tasks(2).max_concurrent(2).start();
    s.at(100).tick().expect_trigger(1)
        .at(150).ack(0, 1)
        .at(200).tick().expect_trigger(2)
        .at(250).ack_all(2).expect_commit(2)
        .at(260).manifest_ok(2)
        .expect_abort(1, subsumed(2))
        .expect_notify(2) // and only for 2
        .expect_pending(&[])
        .at(270).ack(1, 1).quiet() // 1 would now have all acks: nothing happens
        .expect_last_completed(Some(2))
        .expect_outcome(1, Outcome::Aborted(subsumed(2)), 1);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn late_manifest_of_an_older_checkpoint_never_notifies() {
    let mut s = job().max_concurrent(2).start();
    s.at(100).tick().expect_trigger(1)
        .at(150).ack_all(1).expect_commit(1) // 1's manifest write is slow
        .at(200).tick().expect_trigger(2)
        .at(250).ack_all(2).expect_commit(2)
        .manifest_ok(2).expect_notify(2) // 1 is writing its manifest: not subsumed
        .expect_pending(&[1])
        .at(300).manifest_ok(1).quiet() // durable, but 2 covers it: no notification backwards
        .expect_last_completed(Some(2))
        .expect_pending(&[])
        .expect_outcome(1, Outcome::Completed, 3);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn manifest_failure_aborts_counts_and_never_notifies() {
    let mut s = job().tolerable(1).start();
    s.at(100).tick().expect_trigger(1)
        .ack_all(1).expect_commit(1)
        .at(120).manifest_failed(1).expect_abort(1, manifest_failed()) // no NotifyComplete
        .expect_last_completed(None)
        .expect_outcome(1, Outcome::Aborted(manifest_failed()), 3)
        .at(200).tick().expect_trigger(2)
        .ack_all(2).expect_commit(2)
        .manifest_failed(2).expect_abort(2, manifest_failed()) // it counted: the second is one too many
        .expect_failover();
    assert_eq!(s.c.failed_count(), 2);
    assert_eq!(s.c.completed_count(), 0);
}

// ------------------------------------------------------------------------------------------------
// Failover, restart and generations
// ------------------------------------------------------------------------------------------------

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn task_failure_fails_over_once_and_stops_triggering() {
    let mut s = job().start();
    s.at(100).tick().expect_trigger(1)
        .at(150).ack(0, 1)
        .fail(2).expect_abort(1, FAILOVER).expect_failover_mentioning("task-2")
        .fail(1).quiet() // already failing over
        .ack(1, 1).quiet()
        .quiet_until(3000); // nothing is triggered until the restart
    assert_eq!(s.c.failed_count(), 0, "a failover abort is no checkpoint failure");
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn restart_aborts_pending_and_ignores_the_older_generation() {
    let mut s = job().tasks(2).max_concurrent(2).start();
    s.at(100).tick().expect_trigger(1)
        .at(150).ack_all(1).expect_commit(1) // 1 is writing its manifest
        .at(200).tick().expect_trigger(2)
        .at(210).ack(0, 2)
        .at(220).fail(1).expect_abort(2, FAILOVER).expect_failover()
        .expect_pending(&[1]) // storage decides whether 1's manifest made it
        .at(300).restart(None).expect_abort(1, FAILOVER)
        .at(310).manifest_ok(1).quiet() // too late for this generation: no NotifyComplete
        .expect_last_completed(None)
        .quiet_until(399) // the new generation's first checkpoint waits one interval
        .at(400).tick().expect_trigger(3) // epochs 1 and 2 are never reused
        // Late messages of generation 1, naming the epoch now in flight: all ignored.
        .from_gen(1).ack(0, 3)
        .from_gen(1).ack(1, 3)
        .from_gen(1).decline(0, 3)
        .from_gen(1).fail(0)
        .from_gen(1).source_finished(0)
        .from_gen(1).task_finished(0)
        .quiet()
        .expect_pending(&[3])
        .at(450).ack_all(3).expect_commit(3) // carries generation 2's reports only
        .manifest_ok(3).expect_notify(3);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn epochs_keep_increasing_across_restarts() {
    let mut s = job().start();
    s.at(100).tick().expect_trigger(1).complete(1)
        .at(200).tick().expect_trigger(2)
        .fail(0).expect_abort(2, FAILOVER).expect_failover()
        .at(250).restart(Some(1))
        .at(350).tick().expect_trigger(3)
        .fail(0).expect_abort(3, FAILOVER).expect_failover()
        .at(360).restart(Some(1))
        .at(460).tick().expect_trigger(4).complete(4)
        .expect_last_completed(Some(4));
    assert_eq!(s.c.next_id(), CheckpointId(5));
    assert_eq!(s.c.generation(), Generation(3));
}

// ------------------------------------------------------------------------------------------------
// The epoch lease
// ------------------------------------------------------------------------------------------------

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn exhausted_lease_is_extended_once_before_the_next_epoch() {
    let extended = 3 + EPOCH_LEASE_BLOCK;
    let mut s = job().epochs(1, 3).start();
    s.at(100).tick().expect_trigger(1).complete(1)
        .at(200).tick().expect_trigger(2).complete(2)
        .at(300).tick().expect_extend_lease(extended) // epoch 3 is outside the durable lease
        .at(400).tick().quiet() // asked once; no epoch until the lease is durable
        .at(500).tick().quiet()
        .at(550).lease_extended(extended).expect_trigger(3)
        .complete(3)
        .at(650).tick().expect_trigger(4);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn final_checkpoint_waits_for_the_lease_too() {
    let extended = 5 + EPOCH_LEASE_BLOCK;
    let mut s = job().epochs(5, 5).start();
    s.at(10).source_finished(0).expect_extend_lease(extended)
        .at(20).tick().quiet()
        .at(30).lease_extended(extended).expect_final_trigger(5);
}

#[test]
fn running_out_of_checkpoint_ids_is_a_decision_not_a_panic_regression_crafted_lease() {
    // A crafted job.meta with the lease end u64::MAX - 10_000 passes the start's checks (the first
    // lease ends exactly at u64::MAX); after 10,000 checkpoints the coordinator asked for a lease
    // that ends where the old one did and panicked on `lease_end > self.lease_end`.
    let first = u64::MAX - EPOCH_LEASE_BLOCK;
    let mut s = job().epochs(first, u64::MAX).start();
    for k in 0..EPOCH_LEASE_BLOCK {
        s.at(100 * (k + 1)).tick().expect_trigger(first + k).complete(first + k);
    }
    assert_eq!(s.c.next_id(), CheckpointId(u64::MAX), "every id below u64::MAX was issued");
    let t = 100 * (EPOCH_LEASE_BLOCK + 1);
    s.at(t).tick().expect_epochs_exhausted(u64::MAX);
    // Asked once: nothing more is triggered, the end of input neither, and nothing panics.
    s.at(t + 100).tick().quiet();
    s.at(t + 150).source_finished(0).quiet();
    s.at(t + 200).savepoint().expect_savepoint_rejected("every checkpoint id");
    assert_eq!(s.c.last_completed(), Some(CheckpointId(u64::MAX - 1)));
}

// ------------------------------------------------------------------------------------------------
// End of input
// ------------------------------------------------------------------------------------------------

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn end_of_input_triggers_the_final_checkpoint_at_once_then_finishes() {
    let mut s = job().tasks(3).sources(2).start();
    s.at(100).tick().expect_trigger(1).complete(1)
        .at(130).source_finished(0).quiet() // one source is still reading
        .at(140).source_finished(1).expect_final_trigger(2) // at once, not at t=200
        .at(300).tick().quiet() // no periodic checkpoints after the final one
        .at(310).ack_all(2).expect_final_commit(2)
        .at(320).manifest_ok(2).expect_notify(2)
        .task_finished(0).task_finished(2).quiet()
        .at(330).task_finished(1).expect_job_finished(2)
        .at(5000).tick().quiet();
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn end_of_input_with_periodic_checkpoints_off() {
    let mut s = job().no_periodic().start();
    s.quiet_until(2000)
        .at(5000).source_finished(0).expect_final_trigger(1)
        .complete_final(1)
        .all_tasks_finished().expect_job_finished(1);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn final_checkpoint_subsumes_a_periodic_one_in_flight() {
    let mut s = job().start();
    s.at(100).tick().expect_trigger(1)
        .at(120).source_finished(0).expect_final_trigger(2) // even with 1 in flight
        .ack_all(2).expect_final_commit(2)
        .manifest_ok(2).expect_abort(1, subsumed(2)).expect_notify(2)
        .all_tasks_finished().expect_job_finished(2);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn final_checkpoint_timeout_fails_over() {
    let mut s = job().timeout(500).start();
    s.at(50).source_finished(0).expect_final_trigger(1)
        .at(60).ack(0, 1)
        .at(550).tick()
        .expect_abort(1, timeout(&[1, 2]))
        .expect_failover_mentioning("final")
        .at(600).tick().quiet();
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn final_checkpoint_manifest_failure_fails_over() {
    let mut s = job().start();
    s.at(50).source_finished(0).expect_final_trigger(1)
        .ack_all(1).expect_final_commit(1)
        .manifest_failed(1)
        .expect_abort(1, manifest_failed())
        .expect_failover_mentioning("final");
}

// ------------------------------------------------------------------------------------------------
// Savepoints
// ------------------------------------------------------------------------------------------------

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn savepoint_between_periodic_checkpoints_goes_at_once_even_with_max_concurrent_reached() {
    let mut s = job().max_concurrent(1).start();
    s.at(100).tick().expect_trigger(1) // the only periodic slot is taken
        .at(150).savepoint().expect_savepoint_trigger(2) // at once: no interval, no free slot needed
        .expect_pending(&[1, 2])
        .at(200).tick().quiet() // the periodic slot is still taken by 1
        .at(210).complete(1) // 2 is newer: it stays in flight
        .expect_pending(&[2])
        .at(220).tick().quiet() // a savepoint in flight counts against max concurrent, like a checkpoint
        .at(230).complete_savepoint(2)
        .expect_last_completed(Some(2))
        .expect_outcome(2, Outcome::Completed, 3)
        .at(250).tick().expect_trigger(3); // periodic checkpoints go on
    let sp = s.c.history().find(|st| st.checkpoint == CheckpointId(2)).unwrap();
    assert_eq!(sp.kind, SnapshotKind::Savepoint, "the statistics tell a savepoint from a checkpoint");
    assert_eq!(s.c.completed_count(), 2);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn savepoint_barriers_are_exactly_once_and_aligned_whatever_the_config() {
    use Alignment::*;
    use CheckpointMode::*;
    use SnapshotKind::*;
    // Unaligned exactly-once checkpoints: the savepoints still align.
    let mut s = job().max_concurrent(3).unaligned().start();
    s.at(100).tick().expect_barrier(1, Checkpoint, ExactlyOnce, Unaligned)
        .at(150).savepoint().expect_barrier(2, Savepoint, ExactlyOnce, Aligned)
        .at(160).stop_with_savepoint().expect_barrier(3, StopSavepoint, ExactlyOnce, Aligned);

    // At-least-once checkpoints: the savepoints are exactly-once (and aligned) all the same.
    let mut s = job().max_concurrent(3).at_least_once().start();
    s.at(100).tick().expect_barrier(1, Checkpoint, AtLeastOnce, Aligned)
        .at(150).savepoint().expect_barrier(2, Savepoint, ExactlyOnce, Aligned)
        .at(160).stop_with_savepoint().expect_barrier(3, StopSavepoint, ExactlyOnce, Aligned);

    // Checkpoints that may switch to unaligned on a long alignment: savepoints never switch.
    let mut s = job().alignment_timeout(50).start();
    s.at(100).tick().expect_barrier(1, Checkpoint, ExactlyOnce, AlignedWithTimeout { timeout_ms: 50, max_blocked_bytes: u64::MAX })
        .at(150).savepoint().expect_barrier(2, Savepoint, ExactlyOnce, Aligned);

    // The final checkpoint aligns too: no later checkpoint would commit the output of records it overtook.
    let mut s = job().unaligned().start();
    s.at(50).source_finished(0).expect_barrier(1, Final, ExactlyOnce, Aligned);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn savepoint_on_an_exhausted_lease_waits_for_the_extension_then_goes() {
    let extended = 2 + EPOCH_LEASE_BLOCK;
    let mut s = job().epochs(1, 2).start();
    s.at(100).tick().expect_trigger(1).complete(1)
        .at(150).savepoint().expect_extend_lease(extended) // epoch 2 is outside the durable lease
        .at(160).savepoint().expect_savepoint_rejected("another savepoint") // one is waiting already
        .at(200).tick().quiet() // a periodic one is due too: the lease was asked for once, nothing goes
        .at(250).lease_extended(extended).expect_savepoint_trigger(2) // the savepoint first, at once
        .at(300).tick().quiet() // it holds the only slot
        .at(310).complete_savepoint(2)
        .at(350).tick().expect_trigger(3);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn stop_with_savepoint_on_an_exhausted_lease_waits_for_the_extension_too() {
    let extended = 1 + EPOCH_LEASE_BLOCK;
    let mut s = job().epochs(1, 1).start();
    s.at(50).stop_with_savepoint().expect_extend_lease(extended)
        .at(100).tick().quiet() // the first periodic checkpoint is due, but there is no epoch
        .at(120).lease_extended(extended).expect_stop_savepoint_trigger(1)
        .quiet_until(500) // stopping: no periodic checkpoint even with a fresh lease
        .complete_stop_savepoint(1)
        .all_tasks_finished().expect_job_stopped(1);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn savepoint_requested_while_failing_over_is_rejected_until_the_restart() {
    let mut s = job().start();
    s.at(100).tick().expect_trigger(1)
        .at(150).fail(2).expect_abort(1, FAILOVER).expect_failover()
        .at(160).savepoint().expect_savepoint_rejected("failing over")
        .stop_with_savepoint().expect_savepoint_rejected("failing over")
        .expect_pending(&[])
        .at(200).restart(None)
        .at(210).savepoint().expect_savepoint_trigger(2); // running again: it goes at once
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn savepoint_waiting_for_the_lease_is_rejected_once_when_the_job_fails_over() {
    let extended = 1 + EPOCH_LEASE_BLOCK;
    // The restart comes before the lease: the restart rejects the waiting savepoint.
    let mut s = job().epochs(1, 1).start();
    s.at(50).savepoint().expect_extend_lease(extended)
        .at(60).fail(0).expect_failover()
        .at(70).restart(None).expect_savepoint_rejected("failed over")
        .at(80).lease_extended(extended).quiet(); // nothing waits any more

    // The lease comes while failing over: rejected then, and not again at the restart.
    let mut s = job().epochs(1, 1).start();
    s.at(50).stop_with_savepoint().expect_extend_lease(extended)
        .at(60).fail(0).expect_failover()
        .at(70).lease_extended(extended).expect_savepoint_rejected("failing over")
        .at(80).restart(None).quiet()
        .at(180).tick().expect_trigger(1);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn savepoint_requested_while_finishing_is_rejected() {
    let mut s = job().start();
    s.at(50).source_finished(0).expect_final_trigger(1)
        .at(60).savepoint().expect_savepoint_rejected("finishing") // the final checkpoint is in flight
        .stop_with_savepoint().expect_savepoint_rejected("finishing")
        .complete_final(1)
        .at(70).savepoint().expect_savepoint_rejected("finishing") // draining
        .all_tasks_finished().expect_job_finished(1)
        .at(80).savepoint().expect_savepoint_rejected("finishing") // finished
        .stop_with_savepoint().expect_savepoint_rejected("finishing")
        .expect_pending(&[]);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn stop_with_savepoint_stops_the_job_once_every_task_finished() {
    let mut s = job().tasks(3).sources(2).start();
    s.at(100).tick().expect_trigger(1)
        .at(120).ack(0, 1)
        .at(150).stop_with_savepoint().expect_stop_savepoint_trigger(2) // even with 1 in flight
        .at(160).source_finished(0).source_finished(1).quiet() // input ends after its barrier: no final checkpoint
        .quiet_until(400) // and no periodic checkpoints any more
        .at(410).savepoint().expect_savepoint_rejected("stopping")
        .stop_with_savepoint().expect_savepoint_rejected("stopping")
        .at(420).ack_all(2).expect_commit_of(2, SnapshotKind::StopSavepoint)
        .at(430).manifest_ok(2).expect_abort(1, subsumed(2)).expect_notify(2)
        .expect_pending(&[])
        .expect_last_completed(Some(2))
        .at(440).task_finished(0).task_finished(2).quiet(); // one task is still committing
    assert!(!s.c.is_finished(), "stopped before every task finished");
    s.at(450).task_finished(1).expect_job_stopped(2)
        .at(5000).tick().quiet();
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn stop_with_savepoint_that_times_out_fails_over_and_periodic_checkpoints_resume() {
    let mut s = job().timeout(500).start();
    s.at(100).tick().expect_trigger(1).complete(1)
        .at(150).stop_with_savepoint().expect_stop_savepoint_trigger(2)
        .at(160).ack(0, 2)
        .quiet_until(649)
        .at(650).tick()
        .expect_abort(2, timeout(&[1, 2]))
        .expect_failover_mentioning("chk-2 timed out") // the job keeps running
        .at(700).restart(Some(1))
        .quiet_until(799)
        .at(800).tick().expect_trigger(3) // periodic checkpoints resume
        .complete(3)
        .at(900).tick().expect_trigger(4)
        .expect_last_completed(Some(3));
    assert!(!s.c.is_finished());
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn stop_with_savepoint_declined_or_failing_its_manifest_fails_over() {
    let mut s = job().start();
    s.at(50).stop_with_savepoint().expect_stop_savepoint_trigger(1)
        .at(60).decline(1, 1).expect_abort(1, declined(1)).expect_failover()
        .at(70).restart(None)
        .at(170).tick().expect_trigger(2);

    let mut s = job().start();
    s.at(50).stop_with_savepoint().expect_stop_savepoint_trigger(1)
        .ack_all(1).expect_commit_of(1, SnapshotKind::StopSavepoint)
        .at(60).manifest_failed(1).expect_abort(1, manifest_failed()).expect_failover()
        .at(70).restart(None)
        .at(170).tick().expect_trigger(2);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn stop_savepoint_manifest_landing_during_a_failover_completes_it_but_the_job_restarts() {
    let mut s = job().tasks(2).start();
    s.at(50).stop_with_savepoint().expect_stop_savepoint_trigger(1)
        .at(60).ack_all(1).expect_commit_of(1, SnapshotKind::StopSavepoint)
        .at(70).fail(1).expect_failover() // the manifest write is still in flight
        .at(80).manifest_ok(1).expect_notify(1) // it made it: complete, but the failover stands
        .at(90).task_finished(0).quiet(); // on its way before the failover: ignored
    assert!(s.c.is_failing_over() && !s.c.is_finished());
    s.at(100).restart(Some(1))
        .at(200).tick().expect_trigger(2);
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn savepoint_completing_subsumes_older_pending_checkpoints() {
    // Not a single failure is tolerated: subsuming is none.
    let mut s = job().max_concurrent(2).tolerable(0).start();
    s.at(100).tick().expect_trigger(1)
        .at(200).tick().expect_trigger(2)
        .at(210).ack(0, 1)
        .at(250).savepoint().expect_savepoint_trigger(3) // two in flight, the most allowed: it goes anyway
        .at(260).ack_all(3).expect_commit_of(3, SnapshotKind::Savepoint)
        .at(270).manifest_ok(3)
        .expect_abort(1, subsumed(3))
        .expect_abort(2, subsumed(3))
        .expect_notify(3)
        .expect_pending(&[])
        .expect_last_completed(Some(3))
        .at(280).ack(1, 1).ack(0, 2).quiet() // too late
        .at(350).tick().expect_trigger(4);
    assert!(!s.c.is_failing_over());
    assert_eq!(s.c.failed_count(), 0);
}

/// Suspected bug (ignored until the coordinator is fixed): a newer periodic checkpoint completing first
/// aborts a savepoint in flight as `Subsumed`, so the savepoint the user asked for is silently lost.
/// A savepoint is a self-contained copy the user wants to keep, not a step in the checkpoint chain;
/// `on_committed` subsumes every older pending entry whatever its kind. Reachable with
/// `max_concurrent >= 2`, since a savepoint in flight occupies one periodic slot.
#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn savepoint_is_not_subsumed_by_a_newer_periodic_checkpoint() {
    let mut s = job().max_concurrent(2).start();
    s.at(50).savepoint().expect_savepoint_trigger(1)
        .at(150).tick().expect_trigger(2)
        .at(160).ack_all(2).expect_commit(2)
        .at(170).manifest_ok(2)
        .expect_notify(2) // and no Abort of the savepoint the user asked for
        .expect_pending(&[1])
        .at(180).ack_all(1).expect_commit_of(1, SnapshotKind::Savepoint)
        .at(190).manifest_ok(1)
        .expect_outcome(1, Outcome::Completed, 3);
}

// ------------------------------------------------------------------------------------------------
// Alignment settings
// ------------------------------------------------------------------------------------------------

#[test]
fn config_validation_rejects_unaligned_and_alignment_limits_with_at_least_once() {
    let alo = CheckpointConfig { mode: CheckpointMode::AtLeastOnce, ..Default::default() };
    assert_eq!(alo.validate(), Ok(()));
    let bad = [
        ("unaligned", CheckpointConfig { unaligned: true, ..alo.clone() }),
        ("an alignment timeout", CheckpointConfig { alignment_timeout_ms: Some(50), ..alo.clone() }),
        ("a blocked-bytes limit", CheckpointConfig { max_aligned_bytes: Some(1 << 20), ..alo.clone() }),
    ];
    for (what, cfg) in bad {
        let err = cfg.validate().expect_err(what);
        assert!(err.contains("exactly-once"), "at-least-once with {what}: the message must say what to change: {err}");
    }
    // Exactly-once takes them all.
    let eo = CheckpointConfig {
        unaligned: true,
        alignment_timeout_ms: Some(50),
        max_aligned_bytes: Some(1 << 20),
        ..Default::default()
    };
    assert_eq!(eo.validate(), Ok(()));
}

#[test]
fn max_concurrent_is_bounded_regression_tune_accepted_4294967296() {
    for n in [0, MAX_CONCURRENT_CHECKPOINTS + 1, 1 << 32] {
        let cfg = CheckpointConfig { max_concurrent: n, ..Default::default() };
        let err = cfg.validate().expect_err("out of range");
        assert_eq!(
            err,
            format!("max concurrent checkpoints must be at least 1 and at most {MAX_CONCURRENT_CHECKPOINTS}, not {n}")
        );
    }
    for n in [1, MAX_CONCURRENT_CHECKPOINTS] {
        assert_eq!(CheckpointConfig { max_concurrent: n, ..Default::default() }.validate(), Ok(()));
    }
}

#[test]
#[should_panic(expected = "invalid checkpoint config")]
fn a_job_cannot_start_with_unaligned_at_least_once_checkpoints() {
    job().at_least_once().unaligned().start();
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn alignment_settings_changed_while_running_are_validated_and_apply_from_the_next_trigger() {
    let mut s = job().start();
    s.at(100).tick().expect_trigger(1); // aligned
    let running = s.c.config().clone();
    let unaligned_alo = CheckpointConfig { mode: CheckpointMode::AtLeastOnce, unaligned: true, ..running.clone() };
    assert!(s.c.set_config(unaligned_alo).is_err(), "set_config accepted unaligned at-least-once");
    assert_eq!(s.c.config(), &running, "a refused change leaves the settings as they were");
    s.c.set_config(CheckpointConfig { unaligned: true, ..running }).unwrap();
    s.at(110).complete(1)
        .at(200).tick().expect_barrier(2, SnapshotKind::Checkpoint, CheckpointMode::ExactlyOnce, Alignment::Unaligned)
        .at(210).savepoint().expect_savepoint_trigger(3); // savepoints still align
}

#[test]
fn alignment_for_maps_settings_to_the_barrier_alignment() {
    use Alignment::*;
    const MAX: u64 = u64::MAX;
    struct Row {
        what: &'static str,
        mode: CheckpointMode,
        unaligned: bool,
        timeout: Option<u64>,
        bytes: Option<u64>,
        /// For periodic checkpoints; the final checkpoint and savepoints are always `Aligned`.
        want: Alignment,
    }
    #[rustfmt::skip]
    let table = [
        Row { what: "the default aligns",
              mode: CheckpointMode::ExactlyOnce, unaligned: false, timeout: None, bytes: None, want: Aligned },
        Row { what: "unaligned",
              mode: CheckpointMode::ExactlyOnce, unaligned: true, timeout: None, bytes: None, want: Unaligned },
        Row { what: "an alignment timeout alone: no bytes limit",
              mode: CheckpointMode::ExactlyOnce, unaligned: false, timeout: Some(50), bytes: None,
              want: AlignedWithTimeout { timeout_ms: 50, max_blocked_bytes: MAX } },
        Row { what: "a bytes limit alone: no timeout",
              mode: CheckpointMode::ExactlyOnce, unaligned: false, timeout: None, bytes: Some(4096),
              want: AlignedWithTimeout { timeout_ms: MAX, max_blocked_bytes: 4096 } },
        Row { what: "both limits",
              mode: CheckpointMode::ExactlyOnce, unaligned: false, timeout: Some(50), bytes: Some(4096),
              want: AlignedWithTimeout { timeout_ms: 50, max_blocked_bytes: 4096 } },
        Row { what: "unaligned from the start wins over limits that would switch later",
              mode: CheckpointMode::ExactlyOnce, unaligned: true, timeout: Some(50), bytes: Some(4096), want: Unaligned },
        Row { what: "at-least-once never blocks: nothing to unalign",
              mode: CheckpointMode::AtLeastOnce, unaligned: false, timeout: None, bytes: None, want: Aligned },
    ];
    for row in table {
        let cfg = CheckpointConfig {
            mode: row.mode,
            unaligned: row.unaligned,
            alignment_timeout_ms: row.timeout,
            max_aligned_bytes: row.bytes,
            ..Default::default()
        };
        assert_eq!(cfg.validate(), Ok(()), "{}", row.what);
        assert_eq!(cfg.alignment_for(SnapshotKind::Checkpoint), row.want, "{}", row.what);
        for kind in [SnapshotKind::Final, SnapshotKind::Savepoint, SnapshotKind::StopSavepoint] {
            assert_eq!(cfg.alignment_for(kind), Aligned, "{}: {kind:?} must align", row.what);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Regressions
// ------------------------------------------------------------------------------------------------

/// Bug: a task's decline of the final checkpoint aborted it but left the coordinator waiting for it
/// (phase Finishing with nothing in flight): no failover, no new final checkpoint, the job hung.
#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn regression_declined_final_checkpoint_hung_the_job() {
    let mut s = job().start();
    s.at(50).source_finished(0).expect_final_trigger(1)
        .at(60).ack(0, 1)
        .decline(1, 1)
        .expect_abort(1, declined(1))
        .expect_failover_mentioning("final");
}

/// Bug: a failover while the final checkpoint's manifest was being written left that checkpoint to
/// storage; when its ManifestCommitted then arrived, the coordinator panicked asserting the phase
/// was still Finishing.
#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn regression_final_manifest_committed_during_failover_panicked() {
    let mut s = job().tasks(2).start();
    s.at(50).source_finished(0).expect_final_trigger(1)
        .at(60).ack_all(1).expect_final_commit(1)
        .at(70).fail(1).expect_failover() // the manifest write is still in flight
        .at(80).manifest_ok(1).expect_notify(1) // it made it: the final checkpoint is complete
        .expect_pending(&[])
        .at(90).tick().quiet();
    assert!(s.c.is_failing_over(), "still failing over: the restart comes next");
    s.at(100).restart(Some(1))
        .at(110).source_finished(0).expect_final_trigger(2)
        .complete_final(2)
        .all_tasks_finished().expect_job_finished(2);
}

/// Bug: a TaskFinished of the current generation already on its way when another task failed
/// (so arriving while failing over) made the coordinator panic.
#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn regression_task_finished_in_flight_during_failover_panicked() {
    let mut s = job().start();
    s.at(50).source_finished(0).expect_final_trigger(1)
        .complete_final(1)
        .task_finished(0).quiet()
        .at(70).fail(1).expect_failover()
        .at(80).task_finished(2).quiet() // it was already on its way
        .at(90).restart(Some(1))
        .at(100).source_finished(0).expect_final_trigger(2);
}

/// Bug: a late failed manifest of an older checkpoint, arriving after JobFinished, counted as a
/// failure and made the finished job fail over.
#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn regression_failover_after_job_finished() {
    let mut s = job().tasks(1).tolerable(0).start();
    s.at(100).tick().expect_trigger(1)
        .ack_all(1).expect_commit(1) // its manifest write will fail, late
        .at(120).source_finished(0).expect_final_trigger(2)
        .ack_all(2).expect_final_commit(2)
        .manifest_ok(2).expect_notify(2) // 1 is writing its manifest: not subsumed
        .task_finished(0).expect_job_finished(2)
        .at(130).manifest_failed(1).expect_abort(1, manifest_failed())
        .quiet(); // the job is done: no FailOver after JobFinished
    assert!(s.c.is_finished());
}

// ------------------------------------------------------------------------------------------------
// Randomized property test
// ------------------------------------------------------------------------------------------------

/// xorshift64: tiny and good enough to pick events.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        if items.is_empty() {
            None
        } else {
            Some(items[self.below(items.len() as u64) as usize])
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    Completed,
    Aborted,
}

/// Suspected coordinator bug (see `savepoint_is_not_subsumed_by_a_newer_periodic_checkpoint`): a newer
/// periodic checkpoint completing first aborts a savepoint in flight as `Subsumed`. The model tolerates it
/// (and counts it) while this is `true`; set it to `false` once the coordinator keeps savepoints.
const SAVEPOINTS_MAY_BE_SUBSUMED: bool = false;

/// The model's view of one checkpoint attempt.
#[derive(Clone, Debug)]
struct Attempt {
    gen: u64,
    kind: SnapshotKind,
    at: u64,
    acks: BTreeSet<u32>,
    committing: bool,
}

/// A coordinator, the world around it, and a model of what the coordinator may decide.
struct Model {
    rng: XorShift,
    c: Coordinator<Report>,
    cfg: CheckpointConfig,
    now: u64,
    gen: u64,
    gen_start: u64,
    tasks: Vec<u32>,
    sources: Vec<u32>,
    /// Every epoch issued so far is below this.
    next_id: u64,
    /// The durable lease: epochs below it may be issued.
    lease_end: u64,
    lease_req: Option<u64>,
    /// Checkpoints in flight (triggered, neither completed nor aborted).
    live: BTreeMap<u64, Attempt>,
    /// Checkpoints that ended.
    dead: BTreeMap<u64, Attempt>,
    triggered: BTreeSet<u64>,
    ended: BTreeMap<u64, End>,
    /// Manifest commits asked for whose outcome was not reported yet (possibly from older generations).
    manifests: BTreeSet<u64>,
    /// The newest checkpoint whose manifest is durable (what a restart restores).
    durable: Option<u64>,
    last_completed: Option<u64>,
    last_trigger: Option<u64>,
    last_trigger_at: Option<u64>,
    last_end_at: u64,
    last_notify: Option<u64>,
    consecutive: u32,
    failing_over: bool,
    finished: bool,
    sources_done: BTreeSet<u32>,
    tasks_done: BTreeSet<u32>,
    /// The checkpoint that ends this generation's input (Final or StopSavepoint), once triggered.
    final_id: Option<u64>,
    final_kind: SnapshotKind,
    final_done: Option<u64>,
    /// How often (percent of steps) the user asks for a savepoint.
    savepoint_rate: u64,
    /// A savepoint accepted while no epoch was available: it waits for the lease (`true`: stop).
    savepoint_waiting: Option<bool>,
    log: VecDeque<String>,
    seen: BTreeMap<&'static str, u64>,
}

fn event_generation(ev: &Event<Report>) -> Option<u64> {
    match ev {
        Event::Acked { generation, .. }
        | Event::Declined { generation, .. }
        | Event::TaskFailed { generation, .. }
        | Event::SourceFinished { generation, .. }
        | Event::TaskFinished { generation, .. } => Some(generation.0),
        _ => None,
    }
}

impl Model {
    fn new(seed: u64) -> Model {
        let mut rng = XorShift::new(seed);
        let n = 1 + rng.below(4) as u32;
        let k = 1 + rng.below(n as u64) as u32;
        let cfg = CheckpointConfig {
            interval_ms: if rng.chance(85) { Some(1 + rng.below(60)) } else { None },
            timeout_ms: 20 + rng.below(200),
            min_pause_ms: if rng.chance(50) { 0 } else { rng.below(50) },
            max_concurrent: 1 + rng.below(3) as usize,
            tolerable_failures: rng.below(4) as u32,
            mode: if rng.chance(50) { CheckpointMode::ExactlyOnce } else { CheckpointMode::AtLeastOnce },
            ..Default::default()
        };
        // Alignment settings are only valid with exactly-once; savepoints must ignore them.
        let eo = cfg.mode == CheckpointMode::ExactlyOnce;
        let cfg = CheckpointConfig {
            unaligned: eo && rng.chance(30),
            alignment_timeout_ms: if eo && rng.chance(25) { Some(1 + rng.below(100)) } else { None },
            max_aligned_bytes: if eo && rng.chance(25) { Some(1 + rng.below(1 << 20)) } else { None },
            ..cfg
        };
        let savepoint_rate = if rng.chance(20) { 0 } else { 1 + rng.below(6) };
        let first_id = 1 + rng.below(100);
        let lease_end = if rng.chance(70) { first_id + rng.below(4) } else { first_id + 1000 };
        let restored = if first_id > 1 && rng.chance(50) { Some(first_id - 1 - rng.below(first_id - 1)) } else { None };
        let now = rng.below(1000);
        let c = Coordinator::new(
            cfg.clone(),
            Generation(1),
            (0..n).map(TaskId),
            (0..k).map(TaskId),
            CheckpointId(first_id),
            CheckpointId(lease_end),
            restored.map(CheckpointId),
            TimeMs(now),
        );
        Model {
            rng,
            c,
            cfg,
            now,
            gen: 1,
            gen_start: now,
            tasks: (0..n).collect(),
            sources: (0..k).collect(),
            next_id: first_id,
            lease_end,
            lease_req: None,
            live: BTreeMap::new(),
            dead: BTreeMap::new(),
            triggered: BTreeSet::new(),
            ended: BTreeMap::new(),
            manifests: BTreeSet::new(),
            durable: restored,
            last_completed: restored,
            last_trigger: None,
            last_trigger_at: None,
            last_end_at: now,
            last_notify: None,
            consecutive: 0,
            failing_over: false,
            finished: false,
            sources_done: BTreeSet::new(),
            tasks_done: BTreeSet::new(),
            final_id: None,
            final_kind: SnapshotKind::Final,
            final_done: None,
            savepoint_rate,
            savepoint_waiting: None,
            log: VecDeque::new(),
            seen: BTreeMap::new(),
        }
    }

    fn note(&mut self, line: String) {
        if self.log.len() == 80 {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }
    fn count(&mut self, what: &'static str) {
        *self.seen.entry(what).or_insert(0) += 1;
    }

    fn run(&mut self, steps: usize) {
        self.check_mirror();
        for _ in 0..steps {
            if self.finished {
                break;
            }
            self.step();
            self.check_mirror();
        }
        self.settle();
    }

    /// One random event.
    fn step(&mut self) {
        if self.rng.chance(self.savepoint_rate) {
            self.request_savepoint();
            return;
        }
        match self.rng.below(100) {
            0..=29 => {
                let span = self.cfg.interval_ms.unwrap_or(30) * 2 + 2;
                self.now += self.rng.below(span);
                self.feed(Event::Tick);
            }
            30..=31 => {
                self.now += self.cfg.timeout_ms; // a long stall
                self.feed(Event::Tick);
            }
            32..=54 => self.ack_someone(),
            55..=58 => self.late_ack(),
            59..=62 => self.decline_someone(),
            63..=67 => self.stale_message(),
            68..=69 => {
                let task = self.rng.pick(&self.tasks).unwrap();
                self.feed(Event::TaskFailed {
                    generation: Generation(self.gen),
                    task: TaskId(task),
                    reason: "killed".into(),
                    permanent: false,
                });
            }
            70..=79 => self.manifest_outcome(),
            80..=84 => self.extend_lease(),
            85..=86 => self.finish_source(),
            87..=90 => self.finish_task(),
            91..=96 if self.failing_over => self.restart(),
            _ => {
                self.feed(Event::Tick);
            }
        }
    }

    /// The user asks for a savepoint (or to stop with one); `absorb` checks the answer.
    fn request_savepoint(&mut self) {
        let stop = self.rng.chance(40);
        self.feed(Event::SavepointRequested { stop });
    }

    fn missing_acks(&self) -> Vec<(u64, u32)> {
        self.live
            .iter()
            .filter(|(_, a)| !a.committing)
            .flat_map(|(&id, a)| self.tasks.iter().filter(|t| !a.acks.contains(t)).map(move |&t| (id, t)))
            .collect()
    }

    fn ack(&mut self, id: u64, task: u32) {
        self.live.get_mut(&id).unwrap().acks.insert(task);
        let g = self.gen;
        self.feed(Event::Acked {
            generation: Generation(g),
            checkpoint: CheckpointId(id),
            task: TaskId(task),
            report: report(g, id, task),
        });
    }

    fn ack_someone(&mut self) {
        let choices = self.missing_acks();
        match self.rng.pick(&choices) {
            Some((id, task)) => self.ack(id, task),
            None => {
                self.feed(Event::Tick);
            }
        }
    }

    /// An ack of a checkpoint of this generation that ended already: nothing may happen.
    fn late_ack(&mut self) {
        let choices: Vec<(u64, u32)> = self
            .dead
            .iter()
            .filter(|(_, a)| a.gen == self.gen)
            .flat_map(|(&id, a)| self.tasks.iter().filter(|t| !a.acks.contains(t)).map(move |&t| (id, t)))
            .collect();
        let Some((id, task)) = self.rng.pick(&choices) else {
            self.feed(Event::Tick);
            return;
        };
        self.dead.get_mut(&id).unwrap().acks.insert(task);
        let g = self.gen;
        let n = self.feed(Event::Acked {
            generation: Generation(g),
            checkpoint: CheckpointId(id),
            task: TaskId(task),
            report: report(g, id, task),
        });
        assert_eq!(n, 0, "a late ack of ended chk-{id} changed something");
        self.count("late acks ignored");
    }

    fn decline_someone(&mut self) {
        let choices = self.missing_acks();
        let Some((id, task)) = self.rng.pick(&choices) else {
            self.feed(Event::Tick);
            return;
        };
        self.feed(Event::Declined {
            generation: Generation(self.gen),
            checkpoint: CheckpointId(id),
            task: TaskId(task),
            reason: DECLINE_REASON.into(),
        });
        assert!(!self.live.contains_key(&id), "a decline left chk-{id} in flight");
    }

    /// A message of an older generation: must be ignored (checked in `absorb`).
    fn stale_message(&mut self) {
        if self.gen == 1 {
            self.feed(Event::Tick);
            return;
        }
        let g = Generation(1 + self.rng.below(self.gen - 1));
        let task = TaskId(self.rng.below(4) as u32);
        let id = CheckpointId(self.next_id.saturating_sub(self.rng.below(5)));
        let ev = match self.rng.below(5) {
            0 => Event::Acked { generation: g, checkpoint: id, task, report: report(g.0, id.0, task.0) },
            1 => Event::Declined { generation: g, checkpoint: id, task, reason: DECLINE_REASON.into() },
            2 => Event::TaskFailed { generation: g, task, reason: "zombie".into(), permanent: false },
            3 => Event::SourceFinished { generation: g, task },
            _ => Event::TaskFinished { generation: g, task },
        };
        self.feed(ev);
        self.count("stale messages ignored");
    }

    fn manifest_outcome(&mut self) {
        let choices: Vec<u64> = self.manifests.iter().copied().collect();
        let Some(id) = self.rng.pick(&choices) else {
            self.feed(Event::Tick);
            return;
        };
        if self.rng.chance(70) {
            self.feed(Event::ManifestCommitted { checkpoint: CheckpointId(id) });
        } else {
            self.feed(Event::ManifestFailed { checkpoint: CheckpointId(id), reason: MANIFEST_ERROR.into() });
        }
    }

    fn extend_lease(&mut self) {
        match self.lease_req.take() {
            Some(end) => {
                self.lease_end = end;
                self.feed(Event::LeaseExtended { lease_end: CheckpointId(end) });
            }
            None => {
                self.feed(Event::Tick);
            }
        }
    }

    fn finish_source(&mut self) {
        let choices: Vec<u32> = self.sources.iter().filter(|s| !self.sources_done.contains(s)).copied().collect();
        match self.rng.pick(&choices) {
            Some(s) => self.source_finished(s),
            None => {
                self.feed(Event::Tick);
            }
        }
    }

    fn source_finished(&mut self, task: u32) {
        self.sources_done.insert(task);
        self.feed(Event::SourceFinished { generation: Generation(self.gen), task: TaskId(task) });
    }

    /// Tasks finish once they heard that the final checkpoint is complete (possibly racing a failover).
    fn finish_task(&mut self) {
        let choices: Vec<u32> = if self.final_done.is_some() {
            self.tasks.iter().filter(|t| !self.tasks_done.contains(t)).copied().collect()
        } else {
            Vec::new()
        };
        match self.rng.pick(&choices) {
            Some(t) => self.task_finished(t),
            None => {
                self.feed(Event::Tick);
            }
        }
    }

    fn task_finished(&mut self, task: u32) {
        self.tasks_done.insert(task);
        self.feed(Event::TaskFinished { generation: Generation(self.gen), task: TaskId(task) });
        if self.final_done.is_some() && !self.failing_over && self.tasks_done.len() == self.tasks.len() {
            assert!(self.finished, "every task finished after the final checkpoint, but no JobFinished");
        }
    }

    /// Start the next generation (possibly with other tasks), restoring the newest durable checkpoint.
    fn restart(&mut self) {
        let n = 1 + self.rng.below(4) as u32;
        let k = 1 + self.rng.below(n as u64) as u32;
        let gen = self.gen + 1;
        let restored = self.durable;
        self.note(format!("t={} restart gen-{gen} with {n} tasks, {k} sources, restoring {restored:?}", self.now));
        let mut out = Vec::new();
        self.c.restart(
            Generation(gen),
            (0..n).map(TaskId),
            (0..k).map(TaskId),
            restored.map(CheckpointId),
            TimeMs(self.now),
            &mut out,
        );
        self.absorb(None, out);
        assert!(self.live.is_empty(), "restart left {:?} in flight", self.live.keys());
        assert!(self.savepoint_waiting.is_none(), "a savepoint still waits after the restart");
        self.gen = gen;
        self.gen_start = self.now;
        self.tasks = (0..n).collect();
        self.sources = (0..k).collect();
        self.last_completed = restored;
        self.last_trigger_at = None;
        self.last_end_at = self.now;
        self.consecutive = 0;
        self.failing_over = false;
        self.sources_done.clear();
        self.tasks_done.clear();
        self.final_id = None;
        self.final_done = None;
        self.count("restarts");
    }

    /// No more failures: deliver everything owed, end the input, and the job must finish.
    fn settle(&mut self) {
        self.note("--- settle ---".into());
        for _ in 0..100 {
            if self.finished && self.manifests.is_empty() {
                break;
            }
            for id in self.manifests.clone() {
                // Once the job finished, late manifests of older checkpoints may still fail.
                if self.finished && self.rng.chance(50) {
                    self.feed(Event::ManifestFailed { checkpoint: CheckpointId(id), reason: MANIFEST_ERROR.into() });
                } else {
                    self.feed(Event::ManifestCommitted { checkpoint: CheckpointId(id) });
                }
            }
            if self.failing_over {
                self.restart();
                self.check_mirror();
                continue;
            }
            if let Some(end) = self.lease_req.take() {
                self.lease_end = end;
                self.feed(Event::LeaseExtended { lease_end: CheckpointId(end) });
            }
            for s in self.sources.clone() {
                if !self.sources_done.contains(&s) {
                    self.source_finished(s);
                }
            }
            for (id, t) in self.missing_acks() {
                self.ack(id, t);
            }
            if self.final_done.is_some() && !self.failing_over {
                for t in self.tasks.clone() {
                    if !self.tasks_done.contains(&t) && !self.finished {
                        self.task_finished(t);
                    }
                }
            }
            self.now += 1;
            self.feed(Event::Tick);
            self.check_mirror();
        }
        assert!(self.finished, "liveness: input ended, nothing failed any more, yet the job never finished");
        assert!(self.live.is_empty(), "checkpoints still in flight after the job finished: {:?}", self.live.keys());
        for id in &self.triggered {
            assert!(self.ended.contains_key(id), "chk-{id} was triggered but neither completed nor aborted");
        }
        self.count("jobs finished");
        // A finished (or stopped) job has nothing to take a savepoint of.
        let stop = self.rng.chance(50);
        let n = self.feed(Event::SavepointRequested { stop });
        assert_eq!(n, 1, "a savepoint request after the job finished must be rejected, and only that");
    }

    /// Feed one event; returns how many decisions it caused.
    fn feed(&mut self, ev: Event<Report>) -> usize {
        self.note(format!("t={} {ev:?}", self.now));
        let mut out = Vec::new();
        if let Err(v) = self.c.handle(TimeMs(self.now), ev.clone(), &mut out) {
            panic!("a legal event was refused: {v}; last steps: {:#?}", self.log);
        }
        let n = out.len();
        self.absorb(Some(&ev), out);
        n
    }

    /// Check the decisions `out` caused by `ev` (`None`: a restart) and update the model.
    fn absorb(&mut self, ev: Option<&Event<Report>>, out: Vec<Decision<Report>>) {
        for d in &out {
            self.note(format!("    -> {d:?}"));
        }
        if ev.and_then(event_generation).is_some_and(|g| g != self.gen) {
            assert!(out.is_empty(), "a message of an older generation was not ignored: {out:?}");
            return;
        }
        let restart = ev.is_none();
        let tick_like = matches!(ev, Some(Event::Tick | Event::SourceFinished { .. } | Event::LeaseExtended { .. }));
        let failing_over_before = self.failing_over;
        let finished_before = self.finished;
        let final_before = self.final_id;
        let waiting_before = self.savepoint_waiting;
        let n = out.len();
        let (mut failover, mut final_aborted, mut failover_aborts) = (false, false, false);
        let mut triggered = false;
        let mut notified = None;
        let mut rejected = false;
        let mut savepoint_triggered: Option<SnapshotKind> = None;

        for d in out {
            match d {
                Decision::SavepointRejected { reason } => {
                    assert!(!rejected, "two SavepointRejected for one event: {reason}");
                    rejected = true;
                    // Rejected only when the phase justifies it: failing over, finishing/stopping/finished,
                    // or another savepoint already waiting; or the waiting one can no longer start.
                    let justified = match ev {
                        Some(Event::SavepointRequested { .. }) => {
                            failing_over_before || finished_before || final_before.is_some() || waiting_before.is_some()
                        }
                        None => waiting_before.is_some(),
                        Some(Event::LeaseExtended { .. }) => waiting_before.is_some() && failing_over_before,
                        _ => false,
                    };
                    assert!(
                        justified,
                        "savepoint rejected ({reason}) while running (failing over: {failing_over_before}, finished: \
                         {finished_before}, ending chk-{final_before:?}, waiting: {waiting_before:?})"
                    );
                    if !matches!(ev, Some(Event::SavepointRequested { .. })) {
                        self.savepoint_waiting = None; // the waiting one was dropped
                    }
                    self.count("savepoints rejected");
                }
                Decision::ExtendLease { lease_end } => {
                    assert!(self.lease_req.is_none(), "ExtendLease while an extension is outstanding");
                    assert!(self.next_id >= self.lease_end, "lease extended before it ran out");
                    assert_eq!(lease_end.0, self.lease_end + EPOCH_LEASE_BLOCK);
                    self.lease_req = Some(lease_end.0);
                    self.count("lease extensions");
                }
                Decision::Trigger { barrier } => {
                    triggered = true;
                    let id = barrier.checkpoint.0;
                    assert!(!self.failing_over && !self.finished, "chk-{id} triggered while failing over or finished");
                    assert_eq!(barrier.generation, Generation(self.gen), "chk-{id}: generation");
                    assert_eq!(barrier.triggered_at, TimeMs(self.now), "chk-{id}: trigger time");
                    if barrier.kind.is_savepoint() {
                        assert_eq!(barrier.mode, CheckpointMode::ExactlyOnce, "savepoint chk-{id}: mode");
                    } else {
                        assert_eq!(barrier.mode, self.cfg.mode, "chk-{id}: mode");
                    }
                    // Only periodic checkpoints follow the alignment settings; every other kind aligns.
                    if barrier.kind == SnapshotKind::Checkpoint {
                        assert_eq!(barrier.alignment, self.cfg.alignment_for(barrier.kind), "chk-{id}: alignment");
                    } else {
                        assert_eq!(barrier.alignment, Alignment::Aligned, "{:?} chk-{id}: alignment", barrier.kind);
                    }
                    assert!(
                        self.final_id.is_none(),
                        "{:?} chk-{id} triggered after chk-{:?} ended this generation's input",
                        barrier.kind,
                        self.final_id
                    );
                    assert!(
                        self.last_trigger.is_none_or(|l| id > l),
                        "triggered ids must strictly increase: chk-{id} after chk-{:?}",
                        self.last_trigger
                    );
                    assert!(id >= self.next_id, "chk-{id} reuses an epoch (next is {})", self.next_id);
                    assert!(id < self.lease_end, "chk-{id} outside the durable lease {}", self.lease_end);
                    assert!(self.last_completed.is_none_or(|l| id > l));
                    let all_sources_done = self.sources_done.len() == self.sources.len();
                    match barrier.kind {
                        SnapshotKind::Checkpoint => {
                            assert!(
                                !all_sources_done && self.final_id.is_none(),
                                "periodic chk-{id} after end of input"
                            );
                            let interval =
                                self.cfg.interval_ms.expect("periodic trigger with periodic checkpoints off");
                            let since = self.now - self.last_trigger_at.unwrap_or(self.gen_start);
                            assert!(
                                since >= interval,
                                "chk-{id} {since} ms after the last trigger (interval {interval})"
                            );
                            if self.live.is_empty() {
                                assert!(
                                    self.now - self.last_end_at >= self.cfg.min_pause_ms,
                                    "chk-{id} within the min pause"
                                );
                            }
                            assert!(
                                self.live.len() < self.cfg.max_concurrent,
                                "chk-{id} exceeds max concurrent {}",
                                self.cfg.max_concurrent
                            );
                        }
                        SnapshotKind::Savepoint | SnapshotKind::StopSavepoint => {
                            // At once on the request, or on the lease it waited for; whatever the interval,
                            // the min pause and max concurrent say.
                            let stop = barrier.kind == SnapshotKind::StopSavepoint;
                            let asked = match ev {
                                Some(Event::SavepointRequested { stop: s }) => *s == stop && waiting_before.is_none(),
                                Some(Event::LeaseExtended { .. }) => waiting_before == Some(stop),
                                _ => false,
                            };
                            assert!(
                                asked,
                                "{:?} chk-{id} nobody asked for (waiting: {waiting_before:?})",
                                barrier.kind
                            );
                            assert!(savepoint_triggered.is_none(), "two savepoints for one request");
                            savepoint_triggered = Some(barrier.kind);
                            self.savepoint_waiting = None;
                            if self.live.len() >= self.cfg.max_concurrent {
                                self.count("savepoints beyond max concurrent");
                            }
                            if stop {
                                self.final_id = Some(id);
                                self.final_kind = SnapshotKind::StopSavepoint;
                                self.count("stop-savepoint triggers");
                            } else {
                                self.count("savepoint triggers");
                            }
                        }
                        SnapshotKind::Final => {
                            assert!(all_sources_done, "final chk-{id} before every source finished");
                            assert!(self.final_id.is_none(), "a second final checkpoint in one generation");
                            self.final_id = Some(id);
                            self.final_kind = SnapshotKind::Final;
                            self.count("final triggers");
                        }
                    }
                    let attempt = Attempt {
                        gen: self.gen,
                        kind: barrier.kind,
                        at: self.now,
                        acks: BTreeSet::new(),
                        committing: false,
                    };
                    self.live.insert(id, attempt);
                    self.triggered.insert(id);
                    self.last_trigger = Some(id);
                    self.last_trigger_at = Some(self.now);
                    self.next_id = id + 1;
                    self.count("triggers");
                }
                Decision::CommitManifest { checkpoint, kind, generation, reports } => {
                    let id = checkpoint.0;
                    assert!(
                        matches!(ev, Some(Event::Acked { checkpoint: c, .. }) if *c == checkpoint),
                        "CommitManifest of chk-{id} not in answer to an ack of it"
                    );
                    assert_eq!(generation, Generation(self.gen), "CommitManifest of chk-{id}: generation");
                    let a =
                        self.live.get_mut(&id).unwrap_or_else(|| panic!("CommitManifest of chk-{id}, not in flight"));
                    assert!(!a.committing, "CommitManifest of chk-{id} twice");
                    assert_eq!(a.gen, self.gen, "CommitManifest of chk-{id} of an older generation");
                    assert_eq!(kind, a.kind);
                    let every: BTreeSet<u32> = self.tasks.iter().copied().collect();
                    assert_eq!(a.acks, every, "CommitManifest of chk-{id} before every task of this generation acked");
                    let mut got = reports.clone();
                    got.sort();
                    let want: Vec<(TaskId, Report)> =
                        self.tasks.iter().map(|&t| (TaskId(t), report(self.gen, id, t))).collect();
                    assert_eq!(got, want, "CommitManifest of chk-{id} must carry each task's own report exactly once");
                    a.committing = true;
                    self.manifests.insert(id);
                }
                Decision::NotifyComplete { checkpoint } => {
                    assert!(
                        matches!(ev, Some(Event::ManifestCommitted { checkpoint: c }) if *c == checkpoint),
                        "NotifyComplete of {checkpoint} not in answer to its ManifestCommitted"
                    );
                    assert!(notified.is_none(), "two NotifyComplete for one event");
                    assert!(
                        self.last_notify.is_none_or(|l| checkpoint.0 > l),
                        "NotifyComplete ids must strictly increase: {checkpoint} after chk-{:?}",
                        self.last_notify
                    );
                    self.last_notify = Some(checkpoint.0);
                    notified = Some(checkpoint.0);
                    self.count("notifications");
                }
                Decision::Abort { checkpoint, reason } => {
                    let id = checkpoint.0;
                    let a = self.live.remove(&id).unwrap_or_else(|| {
                        panic!("Abort of chk-{id}, not in flight (ended: {:?})", self.ended.get(&id))
                    });
                    match &reason {
                        AbortReason::Timeout { missing } => {
                            assert!(tick_like, "a timeout outside a tick");
                            assert!(!a.committing, "chk-{id} timed out while writing its manifest");
                            assert!(self.now - a.at >= self.cfg.timeout_ms, "chk-{id} timed out early");
                            let want: Vec<TaskId> =
                                self.tasks.iter().filter(|t| !a.acks.contains(t)).map(|&t| TaskId(t)).collect();
                            assert_eq!(
                                missing, &want,
                                "the timeout of chk-{id} must name exactly the tasks that did not ack"
                            );
                            self.count("timeouts");
                        }
                        AbortReason::Declined { task, .. } => {
                            assert!(
                                matches!(ev, Some(Event::Declined { checkpoint: c, task: t, .. }) if *c == checkpoint && t == task),
                                "Abort of chk-{id} for a decline nobody sent"
                            );
                            assert!(!a.committing);
                            self.count("declines");
                        }
                        AbortReason::ManifestFailed(_) => {
                            assert!(
                                matches!(ev, Some(Event::ManifestFailed { checkpoint: c, .. }) if *c == checkpoint),
                                "Abort of chk-{id} for a manifest failure nobody reported"
                            );
                            assert!(a.committing);
                            self.count("manifest failures");
                        }
                        AbortReason::Subsumed { by } => {
                            assert!(*by > checkpoint, "chk-{id} subsumed by an older {by}");
                            assert!(
                                matches!(ev, Some(Event::ManifestCommitted { checkpoint: c }) if c == by),
                                "chk-{id} subsumed by {by}, which did not just complete"
                            );
                            assert!(!a.committing, "chk-{id} subsumed while writing its manifest");
                            assert!(!a.kind.ends_input(), "{:?} chk-{id} subsumed: nothing newer may exist", a.kind);
                            if a.kind.is_savepoint() {
                                if !SAVEPOINTS_MAY_BE_SUBSUMED {
                                    panic!("savepoint chk-{id} subsumed by {by}");
                                }
                                self.count("savepoints subsumed (suspected bug)");
                            }
                            self.count("subsumed");
                        }
                        AbortReason::FailOver => {
                            failover_aborts = true;
                            assert!(restart || !a.committing, "a failover must leave chk-{id}'s manifest to storage");
                        }
                    }
                    // Savepoint failures are the requester's business: they never count.
                    if reason.counts_as_failure() && !a.kind.is_savepoint() {
                        self.consecutive += 1;
                    }
                    // A final checkpoint or stop-savepoint that fails takes the job down: it fails over.
                    if a.kind.ends_input() && reason != AbortReason::FailOver {
                        final_aborted = true;
                        if a.kind == SnapshotKind::StopSavepoint {
                            self.count("stop-savepoints failed");
                        }
                    }
                    self.end(id, End::Aborted, a);
                }
                Decision::FailOver { reason } => {
                    assert!(!failing_over_before && !failover, "a second FailOver in one generation: {reason}");
                    assert!(!finished_before, "FailOver after JobFinished: {reason}");
                    failover = true;
                    self.failing_over = true;
                    self.count("failovers");
                }
                Decision::JobFinished { checkpoint, kind } => {
                    assert_eq!(kind, self.final_kind, "JobFinished names the wrong kind of ending");
                    if kind == SnapshotKind::StopSavepoint {
                        self.count("jobs stopped with a savepoint");
                    }
                    assert!(
                        matches!(ev, Some(Event::TaskFinished { .. })),
                        "JobFinished not in answer to a TaskFinished"
                    );
                    assert_eq!(
                        Some(checkpoint.0),
                        self.final_done,
                        "JobFinished names another checkpoint than the final one"
                    );
                    assert!(!self.failing_over && !finished_before);
                    assert_eq!(self.tasks_done.len(), self.tasks.len(), "JobFinished before every task finished");
                    self.finished = true;
                }
                Decision::EpochsExhausted { lease_end } => {
                    panic!("epochs exhausted at {lease_end}: the random runs never get near u64::MAX")
                }
            }
        }

        // A committed manifest completes its checkpoint, unless it ended meanwhile (then: ignored).
        if let Some(Event::ManifestCommitted { checkpoint }) = ev {
            let id = checkpoint.0;
            self.manifests.remove(&id);
            self.durable = self.durable.max(Some(id));
            match self.live.remove(&id) {
                Some(a) => {
                    assert!(a.committing);
                    let newer = self.last_completed.is_none_or(|l| id > l);
                    assert_eq!(
                        notified == Some(id),
                        newer,
                        "NotifyComplete of chk-{id} iff it is newer than the last complete chk-{:?}",
                        self.last_completed
                    );
                    if newer {
                        self.last_completed = Some(id);
                        // (A savepoint the coordinator keeps, once it no longer subsumes them, may stay.)
                        assert!(
                            self.live
                                .range(..id)
                                .all(|(_, a)| a.committing || (a.kind.is_savepoint() && !SAVEPOINTS_MAY_BE_SUBSUMED)),
                            "older checkpoints still in flight after chk-{id} completed"
                        );
                    } else {
                        self.count("older completions not notified");
                    }
                    self.consecutive = 0;
                    if a.kind.ends_input() {
                        self.final_done = Some(id);
                    }
                    if a.kind.is_savepoint() {
                        self.count("savepoint completions");
                    }
                    self.end(id, End::Completed, a);
                    self.count("completions");
                }
                None => {
                    assert_eq!(n, 0, "a ManifestCommitted of ended chk-{id} changed something");
                    self.count("late manifests ignored");
                }
            }
        }
        if let Some(Event::ManifestFailed { checkpoint, .. }) = ev {
            self.manifests.remove(&checkpoint.0);
            assert!(!self.live.contains_key(&checkpoint.0), "ManifestFailed left {checkpoint} in flight");
        }

        // Failovers happen exactly when they must.
        let task_failed = matches!(ev, Some(Event::TaskFailed { .. }));
        // Once the checkpoint that ends the job completed (draining), late failures change nothing.
        let too_many = self.consecutive > self.cfg.tolerable_failures && self.final_done.is_none();
        if failover {
            assert!(task_failed || too_many || final_aborted, "a FailOver without a cause");
            assert!(self.live.values().all(|a| a.committing), "a failover left checkpoints in flight");
        }
        if !restart && !failing_over_before && !finished_before && (task_failed || too_many || final_aborted) {
            assert!(
                failover,
                "no FailOver (task failed: {task_failed}, {} consecutive failures of {} tolerable, final aborted: {final_aborted})",
                self.consecutive, self.cfg.tolerable_failures
            );
        }
        if failover_aborts {
            assert!(restart || failover, "a FailOver abort without a failover");
        }

        // A savepoint request while running goes at once or waits for the lease; otherwise it is rejected.
        if let Some(Event::SavepointRequested { stop }) = ev {
            let running =
                !failing_over_before && !finished_before && final_before.is_none() && waiting_before.is_none();
            if running {
                assert!(!rejected, "a savepoint requested while running was rejected");
                let want = if *stop { SnapshotKind::StopSavepoint } else { SnapshotKind::Savepoint };
                match savepoint_triggered {
                    Some(kind) => assert_eq!(kind, want),
                    None => {
                        assert!(
                            self.next_id >= self.lease_end,
                            "a savepoint neither triggered nor waiting for a lease"
                        );
                        assert!(self.lease_req.is_some(), "a savepoint waits for a lease never asked for");
                        self.savepoint_waiting = Some(*stop);
                        self.count("savepoints waiting for the lease");
                    }
                }
            } else {
                assert!(rejected, "a savepoint request was neither carried out nor rejected");
                assert!(savepoint_triggered.is_none());
                assert_eq!(self.savepoint_waiting, waiting_before, "a rejected request changed the waiting one");
            }
        }
        if waiting_before.is_some() && (restart || matches!(ev, Some(Event::LeaseExtended { .. }))) {
            assert!(
                rejected || savepoint_triggered.is_some(),
                "a savepoint waiting for the lease was neither started nor rejected"
            );
        }
        if waiting_before.is_some() && matches!(ev, Some(Event::TaskFailed { .. })) {
            assert!(!rejected, "the waiting savepoint is rejected at the restart or the lease, not before");
        }

        // Ticks time out what is overdue and trigger what is due.
        if tick_like {
            for (id, a) in &self.live {
                assert!(a.committing || self.now - a.at < self.cfg.timeout_ms, "chk-{id} outlived its timeout");
            }
            let running = !self.failing_over && !self.finished && self.final_id.is_none();
            if running && !triggered {
                let all_sources_done = self.sources_done.len() == self.sources.len();
                if all_sources_done || self.periodic_due() {
                    assert!(
                        self.next_id >= self.lease_end,
                        "a checkpoint was due at t={} but none was triggered",
                        self.now
                    );
                    assert!(self.lease_req.is_some(), "waiting for a lease that was never asked for");
                }
            }
        }
    }

    fn periodic_due(&self) -> bool {
        let Some(interval) = self.cfg.interval_ms else {
            return false;
        };
        // With a checkpoint in flight, the next waits at least the concurrent trigger gap.
        let gap = match self.last_trigger_at {
            Some(_) if !self.live.is_empty() => interval.max(MIN_CONCURRENT_TRIGGER_GAP_MS),
            _ => interval,
        };
        self.live.len() < self.cfg.max_concurrent
            && self.now - self.last_trigger_at.unwrap_or(self.gen_start) >= gap
            && (!self.live.is_empty() || self.now - self.last_end_at >= self.cfg.min_pause_ms)
    }

    fn end(&mut self, id: u64, how: End, attempt: Attempt) {
        assert!(self.ended.insert(id, how).is_none(), "chk-{id} ended twice (now {how:?})");
        self.last_end_at = self.now;
        self.dead.insert(id, attempt);
    }

    /// The coordinator agrees with the model.
    fn check_mirror(&self) {
        let pending: Vec<u64> = self.c.pending().iter().map(|c| c.0).collect();
        let live: Vec<u64> = self.live.keys().copied().collect();
        assert_eq!(pending, live, "pending checkpoints differ from the model's");
        let periodic = self.live.values().filter(|a| a.kind == SnapshotKind::Checkpoint).count();
        assert!(periodic <= self.cfg.max_concurrent, "{periodic} periodic checkpoints in flight");
        // Savepoints ignore max concurrent; the rest are the periodic ones and at most one final.
        let not_savepoints = self.live.values().filter(|a| !a.kind.is_savepoint()).count();
        assert!(not_savepoints <= self.cfg.max_concurrent + 1, "{not_savepoints} checkpoints in flight");
        let ending = self.live.values().filter(|a| a.kind.ends_input()).count();
        assert!(ending <= 1, "{ending} final checkpoints / stop-savepoints in flight");
        assert_eq!(self.c.generation(), Generation(self.gen));
        assert_eq!(self.c.is_failing_over(), self.failing_over, "failing over");
        assert_eq!(self.c.is_finished(), self.finished, "finished");
        assert_eq!(self.c.last_completed().map(|c| c.0), self.last_completed, "last completed");
        assert!(self.c.next_id().0 >= self.next_id);
    }
}

#[test]
fn random_event_sequences_keep_the_protocol_invariants() {
    let seeds: Vec<u64> = match std::env::var("CUTLINE_SEED") {
        Ok(s) => vec![s.parse().expect("CUTLINE_SEED must be a number")],
        Err(_) => (1..=2000).collect(),
    };
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in seeds {
        let mut m = Model::new(seed);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.run(300)));
        if let Err(e) = result {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let log: Vec<&str> = m.log.iter().map(|s| s.as_str()).collect();
            panic!(
                "seed {seed} failed: {msg}\nreplay: CUTLINE_SEED={seed} cargo test -p cutline-core --test coordinator_scenarios random\nconfig: {:?}\nlast events:\n{}",
                m.cfg,
                log.join("\n")
            );
        }
        for (k, v) in m.seen {
            *seen.entry(k).or_insert(0) += v;
        }
    }
    // The generator must reach every corner it is meant to, or the invariants prove little.
    if std::env::var("CUTLINE_SEED").is_err() {
        for what in [
            "triggers",
            "completions",
            "notifications",
            "older completions not notified",
            "timeouts",
            "declines",
            "manifest failures",
            "subsumed",
            "failovers",
            "restarts",
            "lease extensions",
            "final triggers",
            "jobs finished",
            "late acks ignored",
            "late manifests ignored",
            "stale messages ignored",
            "savepoint triggers",
            "stop-savepoint triggers",
            "savepoints beyond max concurrent",
            "savepoint completions",
            "savepoints rejected",
            "savepoints waiting for the lease",
            "stop-savepoints failed",
            "jobs stopped with a savepoint",
        ] {
            assert!(seen.get(what).copied().unwrap_or(0) > 0, "no run saw {what}: {seen:?}");
        }
        eprintln!("coverage over all seeds: {seen:?}");
    }
}

#[test]
#[rustfmt::skip]
fn regression_a_late_manifest_failure_after_a_completed_stop_savepoint_failed_the_job_over() {
    // Checkpoint 1's manifest is slow; the stop-with-savepoint 2 completes meanwhile; then 1's
    // manifest write fails. The job's last checkpoint is complete: it must stop, not restart.
    let mut s = job().max_concurrent(2).tolerable(0).start();
    s.at(100).tick().expect_trigger(1).ack_all(1).expect_commit(1)
     .at(150).stop_with_savepoint().expect_stop_savepoint_trigger(2)
     .complete_stop_savepoint(2)
     .at(160).manifest_failed(1).expect_abort(1, manifest_failed()).quiet();
}
