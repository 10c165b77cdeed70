//! Test machinery (cargo feature `testing`, off by default): the deterministic simulation of a whole
//! job ([`sim`]), the coordinator benchmark ([`coordbench`]), and fault injection for drills
//! ([`Faults`], [`FaultPoint`]). Not part of the default public API.

pub mod coordbench;
#[cfg(feature = "kafka")]
pub mod kafka_committed;
pub mod sim;

pub use crate::fault::{FaultPoint, Faults};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Failures at one step of a sink's protocol, for whole-job tests against real servers: the 2nd,
/// 5th, 8th, ... time the run reaches `point`, at most 4 times. A sink recovers only at a restore, so
/// for `SinkRecover` every `recover_every`-th batch fails too, over the first `recover_batches`
/// batches. The counter is how many times the run reached `point` while failures were left to
/// inject (at least the number injected, and 0 if none was).
pub fn sink_step_faults(point: FaultPoint, recover_every: u64, recover_batches: u64) -> (Faults, Arc<AtomicU64>) {
    let (seen, injected, batches) = (AtomicU64::new(0), Arc::new(AtomicU64::new(0)), AtomicU64::new(0));
    let counter = injected.clone();
    let faults = Faults::new(move |p| {
        if p == point {
            return seen.fetch_add(1, Ordering::SeqCst) % 3 == 1 && injected.fetch_add(1, Ordering::SeqCst) < 4;
        }
        point == FaultPoint::SinkRecover
            && p == FaultPoint::ProcessBatch
            && batches.fetch_add(1, Ordering::SeqCst) % recover_every == recover_every - 1
            && batches.load(Ordering::SeqCst) < recover_batches
    });
    (faults, counter)
}
