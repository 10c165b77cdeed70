//! Regressions.

use super::*;

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
