//! Failover, restart, generations and the epoch lease.

use super::*;

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
