//! Scenarios of the run lifecycle: each feeds the events a runtime would report and checks every step
//! the machine asks for.

use super::*;

type Ev = LifeEvent<&'static str>;

fn c(n: u64) -> CheckpointId {
    CheckpointId(n)
}
fn g(n: u64) -> Generation {
    Generation(n)
}

/// A machine past its start, with the store facts given, and the step they lead to.
fn opened(strategy: RestartStrategy, facts: StoreFacts) -> (RunLifecycle, Step<&'static str>) {
    let mut l = RunLifecycle::new(strategy);
    assert_eq!(l.start::<&str>(), Step::Open);
    let step = l.next(TimeMs(0), Ev::Opened(facts));
    (l, step)
}

fn meta(generation: u64, lease_end: u64) -> Option<MetaFacts> {
    Some(MetaFacts { same_job: true, generation: g(generation), lease_end: c(lease_end) })
}

fn restored(checkpoint: Option<u64>, newest_before: Option<u64>) -> Ev {
    Ev::Restored(Restored {
        checkpoint: checkpoint.map(c),
        skipped: vec![],
        from_savepoint: false,
        newest_manifest_before: newest_before.map(c),
    })
}

/// Drive a fresh store to its first running generation.
fn running(strategy: RestartStrategy) -> RunLifecycle {
    let (mut l, step) = opened(strategy, StoreFacts::default());
    assert_eq!(step, Step::Begin { generation: g(1), lease_end: c(1 + EPOCH_LEASE_BLOCK) });
    assert_eq!(l.next(TimeMs(0), Ev::Begun), Step::Restore { generation: g(1) });
    assert_eq!(l.next(TimeMs(0), restored(None, None)), Step::Claim { generation: g(1), restore_point: None });
    assert!(matches!(l.next(TimeMs(0), Ev::Claimed { newest_manifest_now: None }), Step::Deploy { .. }));
    assert_eq!(l.next(TimeMs(1), Ev::Deployed), Step::Run { generation: g(1), recovered_after_ms: None });
    l
}

fn failed_over(l: &mut RunLifecycle, now: u64, reason: &str) -> Step<&'static str> {
    let end = GenerationEnd::FailedOver { reason: reason.into(), permanent: false };
    l.next(TimeMs(now), Ev::GenerationEnded { end, lease_end: l.lease_end() })
}

#[test]
fn a_fresh_store_starts_generation_1_with_epochs_from_1() {
    let (mut l, step) = opened(RestartStrategy::None, StoreFacts::default());
    assert_eq!(step, Step::Begin { generation: g(1), lease_end: c(1 + EPOCH_LEASE_BLOCK) });
    l.next::<&str>(TimeMs(0), Ev::Begun);
    l.next(TimeMs(0), restored(None, None));
    assert_eq!(
        l.next(TimeMs(0), Ev::Claimed { newest_manifest_now: None }),
        Step::Deploy { generation: g(1), restored: None, first_epoch: c(1), lease_end: c(1 + EPOCH_LEASE_BLOCK) }
    );
}

#[test]
fn a_restart_takes_epochs_above_the_lease_and_above_every_directory_and_a_generation_above_every_record() {
    let facts = StoreFacts {
        meta: meta(4, 20_000),
        max_checkpoint_seen: Some(c(25_000)),
        latest_generation_record: Some(g(9)),
        ..Default::default()
    };
    let (mut l, step) = opened(RestartStrategy::None, facts);
    assert_eq!(step, Step::Begin { generation: g(10), lease_end: c(25_001 + EPOCH_LEASE_BLOCK) });
    l.next::<&str>(TimeMs(0), Ev::Begun);
    l.next(TimeMs(0), restored(Some(24_990), Some(24_990)));
    match l.next(TimeMs(0), Ev::Claimed { newest_manifest_now: Some(c(24_990)) }) {
        Step::Deploy { first_epoch, restored, .. } => {
            assert_eq!(first_epoch, c(25_001));
            assert_eq!(restored, Some(c(24_990)));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn another_jobs_store_and_a_finished_job_end_the_run_at_once() {
    let other = StoreFacts {
        meta: Some(MetaFacts { same_job: false, generation: g(1), lease_end: c(5) }),
        ..Default::default()
    };
    assert_eq!(opened(RestartStrategy::default(), other).1, Step::Done(RunEnd::Failed(RunFailure::WrongJob)));
    let finished = StoreFacts { meta: meta(3, 100), finished: Some(c(42)), ..Default::default() };
    assert_eq!(opened(RestartStrategy::default(), finished).1, Step::Done(RunEnd::AlreadyFinished(c(42))));
}

#[test]
fn values_at_the_end_of_u64_are_refused_never_wrapped_regression_crafted_meta() {
    // A crafted job.meta with the lease at u64::MAX panicked in the coordinator; a generation at
    // u64::MAX wrapped to 0.
    let cases = [
        (StoreFacts { meta: meta(1, u64::MAX), ..Default::default() }, "epoch lease"),
        (StoreFacts { meta: meta(u64::MAX, 10), ..Default::default() }, "generation"),
        (StoreFacts { latest_generation_record: Some(g(u64::MAX)), ..Default::default() }, "generation"),
        (StoreFacts { max_checkpoint_seen: Some(c(u64::MAX)), ..Default::default() }, "checkpoint id"),
        (StoreFacts { savepoint: Some((c(u64::MAX), g(1))), ..Default::default() }, "savepoint checkpoint id"),
    ];
    for (facts, what) in cases {
        match opened(RestartStrategy::default(), facts.clone()).1 {
            Step::Done(RunEnd::Failed(RunFailure::Exhausted { what: w, .. })) => assert_eq!(w, what, "{facts:?}"),
            other => panic!("{facts:?}: {other:?}"),
        }
    }
}

#[test]
fn a_savepoint_start_continues_the_savepoints_epochs_and_generations() {
    let facts = StoreFacts { savepoint: Some((c(700), g(12))), ..Default::default() };
    let (mut l, step) = opened(RestartStrategy::None, facts);
    assert_eq!(step, Step::Begin { generation: g(13), lease_end: c(701 + EPOCH_LEASE_BLOCK) });
    l.next::<&str>(TimeMs(0), Ev::Begun);
    let from_sp =
        Restored { checkpoint: Some(c(700)), skipped: vec![], from_savepoint: true, newest_manifest_before: None };
    // A savepoint's checkpoint is not the store's: the generation record names no restore point.
    assert_eq!(l.next(TimeMs(0), Ev::Restored(from_sp)), Step::Claim { generation: g(13), restore_point: None });
}

#[test]
fn the_restore_point_of_a_claim_includes_newer_checkpoints_skipped_as_damaged() {
    let (mut l, _) = opened(RestartStrategy::None, StoreFacts::default());
    l.next::<&str>(TimeMs(0), Ev::Begun);
    let r = Restored {
        checkpoint: Some(c(5)),
        skipped: vec![c(7), c(6)],
        from_savepoint: false,
        newest_manifest_before: Some(c(7)),
    };
    assert_eq!(l.next(TimeMs(0), Ev::Restored(r)), Step::Claim { generation: g(1), restore_point: Some(c(7)) });
}

#[test]
fn a_checkpoint_committed_between_listing_and_claim_releases_the_claim_and_restores_it_regression_gap() {
    let (mut l, _) = opened(RestartStrategy::None, StoreFacts::default());
    l.next::<&str>(TimeMs(0), Ev::Begun);
    l.next(TimeMs(0), restored(Some(3), Some(3)));
    // An older coordinator committed 4 meanwhile.
    assert_eq!(
        l.next(TimeMs(0), Ev::Claimed { newest_manifest_now: Some(c(4)) }),
        Step::Release { generation: g(1), committed: c(4) }
    );
    assert_eq!(l.next(TimeMs(0), Ev::Released), Step::Restore { generation: g(1) });
    l.next(TimeMs(0), restored(Some(4), Some(4)));
    assert!(matches!(
        l.next(TimeMs(0), Ev::Claimed { newest_manifest_now: Some(c(4)) }),
        Step::Deploy { restored: Some(CheckpointId(4)), .. }
    ));
}

#[test]
fn checkpoints_committed_at_every_start_end_the_run_after_the_named_start_overs() {
    let (mut l, _) = opened(RestartStrategy::None, StoreFacts::default());
    l.next::<&str>(TimeMs(0), Ev::Begun);
    for n in 0..=MAX_START_OVERS as u64 {
        l.next(TimeMs(0), restored(Some(10 + n), Some(10 + n)));
        let step = l.next(TimeMs(0), Ev::Claimed { newest_manifest_now: Some(c(11 + n)) });
        if n < MAX_START_OVERS as u64 {
            assert!(matches!(step, Step::Release { .. }), "{step:?}");
            l.next(TimeMs(0), Ev::Released);
        } else {
            assert_eq!(step, Step::Done(RunEnd::Failed(RunFailure::KeepsCompleting { checkpoint: c(11 + n) })));
        }
    }
}

#[test]
fn a_failover_waits_records_the_next_generation_and_restores_again_with_the_recovery_time() {
    let mut l = running(RestartStrategy::FixedDelay { delay_ms: 50, max_attempts: 3 });
    assert_eq!(
        failed_over(&mut l, 100, "task-3 failed"),
        Step::Wait { delay_ms: 50, attempt: 1, reason: "task-3 failed".into(), cause: Cause::Generation }
    );
    assert_eq!(
        l.next::<&str>(TimeMs(150), Ev::Waited),
        Step::NextGeneration { generation: g(2), lease_end: c(1 + EPOCH_LEASE_BLOCK) }
    );
    assert_eq!(l.next::<&str>(TimeMs(151), Ev::MetaWritten), Step::Restore { generation: g(2) });
    l.next(TimeMs(152), restored(Some(7), Some(7)));
    assert!(matches!(
        l.next::<&str>(TimeMs(152), Ev::Claimed { newest_manifest_now: Some(c(7)) }),
        Step::Deploy { .. }
    ));
    assert_eq!(l.next::<&str>(TimeMs(160), Ev::Deployed), Step::Run { generation: g(2), recovered_after_ms: Some(60) });
    assert_eq!(l.restarts(), 1);
    assert_eq!(l.restored_at_start(), Some(None), "the run's first generation started from scratch");
}

#[test]
fn the_lease_the_coordinator_extended_is_the_one_the_next_generation_records() {
    let mut l = running(RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 });
    let end = GenerationEnd::FailedOver { reason: "x".into(), permanent: false };
    l.next::<&str>(TimeMs(5), Ev::GenerationEnded { end, lease_end: c(30_001) });
    assert_eq!(l.next::<&str>(TimeMs(6), Ev::Waited), Step::NextGeneration { generation: g(2), lease_end: c(30_001) });
}

#[test]
fn failures_of_the_start_count_like_failovers_and_the_strategy_gives_up() {
    let mut l = running(RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 1 });
    assert!(matches!(failed_over(&mut l, 10, "boom"), Step::Wait { .. }));
    l.next::<&str>(TimeMs(11), Ev::Waited);
    l.next::<&str>(TimeMs(11), Ev::MetaWritten);
    let step = l.next(TimeMs(12), Ev::RestoreFailed { error: "store unreachable", transient: true });
    assert_eq!(
        step,
        Step::Done(RunEnd::Failed(RunFailure::GaveUp {
            attempts: 1,
            last: "reading checkpoints: store unreachable".into(),
            repeated: 1,
            restored: None,
        }))
    );
}

#[test]
fn the_same_failure_after_restoring_the_same_checkpoint_is_counted_as_repeating() {
    let mut l = running(RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 2 });
    for round in 0..3u64 {
        let step = failed_over(&mut l, 10 * round, "map#0 panicked: bad record");
        if round == 2 {
            match step {
                Step::Done(RunEnd::Failed(RunFailure::GaveUp { repeated, .. })) => assert_eq!(repeated, 3),
                other => panic!("{other:?}"),
            }
            break;
        }
        l.next::<&str>(TimeMs(10 * round + 1), Ev::Waited);
        l.next::<&str>(TimeMs(10 * round + 1), Ev::MetaWritten);
        l.next(TimeMs(10 * round + 2), restored(None, None));
        l.next::<&str>(TimeMs(10 * round + 2), Ev::Claimed { newest_manifest_now: None });
        l.next::<&str>(TimeMs(10 * round + 3), Ev::Deployed);
    }
}

#[test]
fn the_same_failure_at_the_same_input_ends_the_run_before_the_strategy_gives_up() {
    // The default strategy allows 10 attempts (about 43 s of backoff); a failure that repeats after
    // restoring the same checkpoint stops after MAX_REPEATED_FAILURES.
    let mut l = running(RestartStrategy::default());
    let mut round = 0u64;
    let step = loop {
        let step = failed_over(&mut l, 10 * round, "map#0 panicked: bad record");
        if !matches!(step, Step::Wait { .. }) {
            break step;
        }
        l.next::<&str>(TimeMs(10 * round + 1), Ev::Waited);
        l.next::<&str>(TimeMs(10 * round + 1), Ev::MetaWritten);
        l.next(TimeMs(10 * round + 2), restored(Some(7), Some(7)));
        l.next::<&str>(TimeMs(10 * round + 2), Ev::Claimed { newest_manifest_now: Some(c(7)) });
        l.next::<&str>(TimeMs(10 * round + 3), Ev::Deployed);
        round += 1;
    };
    // The first failure came after the fresh start, the next ones after restoring checkpoint 7.
    assert_eq!(
        step,
        Step::Done(RunEnd::Failed(RunFailure::GaveUp {
            attempts: MAX_REPEATED_FAILURES,
            last: "map#0 panicked: bad record".into(),
            repeated: MAX_REPEATED_FAILURES,
            restored: Some(c(7)),
        }))
    );
    assert_eq!(l.restarts(), MAX_REPEATED_FAILURES);
}

#[test]
fn without_a_repeat_limit_the_strategy_alone_decides() {
    let mut l = running(RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 100 }).with_repeat_limit(None);
    for round in 0..3 * MAX_REPEATED_FAILURES as u64 {
        let step = failed_over(&mut l, 10 * round, "crashed by the simulation");
        assert!(matches!(step, Step::Wait { .. }), "round {round}: {step:?}");
        l.next::<&str>(TimeMs(10 * round + 1), Ev::Waited);
        l.next::<&str>(TimeMs(10 * round + 1), Ev::MetaWritten);
        l.next(TimeMs(10 * round + 2), restored(None, None));
        l.next::<&str>(TimeMs(10 * round + 2), Ev::Claimed { newest_manifest_now: None });
        l.next::<&str>(TimeMs(10 * round + 3), Ev::Deployed);
    }
}

#[test]
fn failures_that_differ_or_make_progress_are_left_to_the_strategy() {
    let mut l = running(RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 100 });
    for round in 0..2 * MAX_REPEATED_FAILURES as u64 {
        // Every other failure differs, and the restored checkpoint moves on: the run keeps restarting.
        let reason = if round % 2 == 0 { "worker 1 lost" } else { "worker 2 lost" };
        assert!(matches!(failed_over(&mut l, 10 * round, reason), Step::Wait { .. }), "round {round}");
        l.next::<&str>(TimeMs(10 * round + 1), Ev::Waited);
        l.next::<&str>(TimeMs(10 * round + 1), Ev::MetaWritten);
        l.next(TimeMs(10 * round + 2), restored(Some(round / 2 + 1), Some(round / 2 + 1)));
        l.next::<&str>(TimeMs(10 * round + 2), Ev::Claimed { newest_manifest_now: Some(c(round / 2 + 1)) });
        l.next::<&str>(TimeMs(10 * round + 3), Ev::Deployed);
    }
}

#[test]
fn a_permanent_failure_ends_the_run_without_a_restart() {
    let mut l = running(RestartStrategy::default());
    let end = GenerationEnd::FailedOver { reason: "line 3 is too long".into(), permanent: true };
    assert_eq!(
        l.next::<&str>(TimeMs(5), Ev::GenerationEnded { end, lease_end: l.lease_end() }),
        Step::Done(RunEnd::Failed(RunFailure::Permanent { reason: "line 3 is too long".into() }))
    );
}

#[test]
fn a_stop_during_the_wait_ends_the_run_stopped_and_ends_are_passed_through() {
    let mut l = running(RestartStrategy::default());
    assert!(matches!(failed_over(&mut l, 1, "x"), Step::Wait { .. }));
    assert_eq!(l.next::<&str>(TimeMs(2), Ev::StopRequested), Step::Done(RunEnd::Stopped));
    for (end, want) in [
        (GenerationEnd::Finished(c(9)), RunEnd::Finished(c(9))),
        (GenerationEnd::Stopped, RunEnd::Stopped),
        (GenerationEnd::StoppedWithSavepoint, RunEnd::StoppedWithSavepoint),
        (GenerationEnd::Error("fenced"), RunEnd::Failed(RunFailure::Step("fenced"))),
    ] {
        let mut l = running(RestartStrategy::default());
        assert_eq!(l.next(TimeMs(3), Ev::GenerationEnded { end, lease_end: l.lease_end() }), Step::Done(want));
    }
}

#[test]
fn deploy_failures_retry_unless_permanent_and_claims_taken_end_the_run() {
    let (mut l, _) = opened(RestartStrategy::FixedDelay { delay_ms: 3, max_attempts: 5 }, StoreFacts::default());
    l.next::<&str>(TimeMs(0), Ev::Begun);
    l.next(TimeMs(0), restored(None, None));
    l.next::<&str>(TimeMs(0), Ev::Claimed { newest_manifest_now: None });
    assert!(matches!(
        l.next(TimeMs(1), Ev::DeployFailed { error: "a sink did not open", permanent: false }),
        Step::Wait { .. }
    ));
    l.next::<&str>(TimeMs(4), Ev::Waited);
    l.next::<&str>(TimeMs(4), Ev::MetaWritten);
    l.next(TimeMs(4), restored(None, None));
    assert_eq!(
        l.next(TimeMs(4), Ev::ClaimTaken("generation 2 is taken")),
        Step::Done(RunEnd::Failed(RunFailure::Step("generation 2 is taken")))
    );
    let (mut l, _) = opened(RestartStrategy::default(), StoreFacts::default());
    l.next::<&str>(TimeMs(0), Ev::Begun);
    l.next(TimeMs(0), restored(None, None));
    l.next::<&str>(TimeMs(0), Ev::Claimed { newest_manifest_now: None });
    assert_eq!(
        l.next(TimeMs(1), Ev::DeployFailed { error: "state of another job", permanent: true }),
        Step::Done(RunEnd::Failed(RunFailure::Step("state of another job")))
    );
}

#[test]
#[should_panic(expected = "broke the step protocol")]
fn an_event_out_of_order_is_a_bug_of_the_runtime() {
    let (mut l, _) = opened(RestartStrategy::default(), StoreFacts::default());
    l.next::<&str>(TimeMs(0), Ev::Deployed);
}
