//! Scenario tests of the checkpoint coordinator (`cutline_core::coordinator`).
//!
//! Each test is a short story told with a small driver, [`Scenario`]: time moves with `at(t)`, events
//! go in with `tick()`, `ack(task, checkpoint)`, `decline(..)`, `fail(task)`, `manifest_ok(id)`, ...,
//! and every decision the coordinator makes must be claimed, in order, by an `expect_*` step. A
//! decision nobody claimed fails the test at the next event (or when the scenario is dropped), so
//! "and nothing else happened" is checked after every step, not only where a test says `quiet()`.
//!
//! The last test drives the coordinator with random event sequences over many seeds and checks the
//! protocol invariants after every step against a small model of what the coordinator may do.

use cutline_core::barrier::{CheckpointMode, SnapshotKind};
use cutline_core::coordinator::{
    AbortReason, CheckpointConfig, Coordinator, Decision, Event, Outcome, EPOCH_LEASE_BLOCK,
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
        Scenario { c, now, gen: 1, tasks, sources, sender_gen: None, queue: VecDeque::new() }
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
        let mut out = Vec::new();
        self.c.handle(TimeMs(self.now), event, &mut out);
        self.queue.extend(out);
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
        self.feed(Event::TaskFailed { generation: g, task: TaskId(task), reason: "killed".into() })
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

    // --- expectations: each claims the next decision ---

    fn next(&mut self, what: &str) -> Decision<Report> {
        self.queue
            .pop_front()
            .unwrap_or_else(|| panic!("t={}: expected {what}, but no further decision was made", self.now))
    }
    /// Nothing (more) was decided.
    fn quiet(&mut self) -> &mut Self {
        assert!(self.queue.is_empty(), "t={}: unexpected decisions {:?}", self.now, self.queue);
        self
    }
    fn expect_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_trigger_of(id, SnapshotKind::Checkpoint)
    }
    fn expect_final_trigger(&mut self, id: u64) -> &mut Self {
        self.expect_trigger_of(id, SnapshotKind::Final)
    }
    fn expect_trigger_of(&mut self, id: u64, kind: SnapshotKind) -> &mut Self {
        let what = format!("a {kind:?} trigger of chk-{id} in gen-{} at t={}", self.gen, self.now);
        match self.next(&what) {
            Decision::Trigger { barrier }
                if barrier.checkpoint == CheckpointId(id)
                    && barrier.kind == kind
                    && barrier.generation == Generation(self.gen)
                    && barrier.triggered_at == TimeMs(self.now)
                    && barrier.mode == self.c.config().mode => {}
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
    fn expect_job_finished(&mut self, id: u64) -> &mut Self {
        match self.next(&format!("JobFinished at chk-{id}")) {
            Decision::JobFinished { checkpoint } if checkpoint == CheckpointId(id) => {}
            other => panic!("t={}: expected JobFinished at chk-{id}, got {other:?}", self.now),
        }
        assert!(self.c.is_finished());
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
                c.handle(TimeMs(now), ack, &mut out);
            }
            let done = Event::ManifestCommitted { checkpoint: CheckpointId(id) };
            c.handle(TimeMs(now), done, &mut out);
        }
        c.handle(TimeMs(now), Event::Tick, &mut out);
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
    ];
    for row in table {
        let cfg = CheckpointConfig {
            interval_ms: Some(row.interval),
            timeout_ms: row.timeout,
            min_pause_ms: row.min_pause,
            max_concurrent: row.max_concurrent,
            tolerable_failures: 3,
            mode: CheckpointMode::ExactlyOnce,
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
#[should_panic(expected = "acked chk-1 twice")]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn a_task_acking_twice_is_a_protocol_violation() {
    let mut s = job().tasks(2).start();
    s.at(100).tick().expect_trigger(1).ack(0, 1).ack(0, 1);
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
    final_id: Option<u64>,
    final_done: Option<u64>,
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
        };
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
            final_done: None,
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
            2 => Event::TaskFailed { generation: g, task, reason: "zombie".into() },
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
    }

    /// Feed one event; returns how many decisions it caused.
    fn feed(&mut self, ev: Event<Report>) -> usize {
        self.note(format!("t={} {ev:?}", self.now));
        let mut out = Vec::new();
        self.c.handle(TimeMs(self.now), ev.clone(), &mut out);
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
        let n = out.len();
        let (mut failover, mut final_aborted, mut failover_aborts) = (false, false, false);
        let mut triggered = false;
        let mut notified = None;

        for d in out {
            match d {
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
                    assert_eq!(barrier.mode, self.cfg.mode, "chk-{id}: mode");
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
                        SnapshotKind::Final => {
                            assert!(all_sources_done, "final chk-{id} before every source finished");
                            assert!(self.final_id.is_none(), "a second final checkpoint in one generation");
                            self.final_id = Some(id);
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
                            self.count("subsumed");
                        }
                        AbortReason::FailOver => {
                            failover_aborts = true;
                            assert!(restart || !a.committing, "a failover must leave chk-{id}'s manifest to storage");
                        }
                    }
                    if reason.counts_as_failure() {
                        self.consecutive += 1;
                    }
                    if a.kind == SnapshotKind::Final && reason != AbortReason::FailOver {
                        final_aborted = true;
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
                Decision::JobFinished { checkpoint } => {
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
                        assert!(
                            self.live.range(..id).all(|(_, a)| a.committing),
                            "older checkpoints still in flight after chk-{id} completed"
                        );
                    } else {
                        self.count("older completions not notified");
                    }
                    self.consecutive = 0;
                    if a.kind == SnapshotKind::Final {
                        self.final_done = Some(id);
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
        let too_many = self.consecutive > self.cfg.tolerable_failures;
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
        self.live.len() < self.cfg.max_concurrent
            && self.now - self.last_trigger_at.unwrap_or(self.gen_start) >= interval
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
        assert!(self.live.len() <= self.cfg.max_concurrent + 1, "{} checkpoints in flight", self.live.len());
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
        ] {
            assert!(seen.get(what).copied().unwrap_or(0) > 0, "no run saw {what}: {seen:?}");
        }
        eprintln!("coverage over all seeds: {seen:?}");
    }
}
