//! End of input.

use super::*;

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
