//! Test machinery (cargo feature `testing`, off by default): the deterministic simulation of a whole
//! job ([`sim`]), the coordinator benchmark ([`coordbench`]), and fault injection for drills
//! ([`Faults`], [`FaultPoint`]). Not part of the default public API.

pub mod coordbench;
#[cfg(feature = "kafka")]
pub mod kafka_committed;
pub mod sim;

pub use crate::fault::{FaultPoint, Faults};
