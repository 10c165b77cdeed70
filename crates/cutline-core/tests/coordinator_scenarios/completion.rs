//! Completion, aborts and tolerable failures.

use super::*;

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
