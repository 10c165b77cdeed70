//! The pure protocol cores of cutline.
//!
//! Everything in this crate is a deterministic state machine or a plain value type: events and the
//! current time go in, decisions come out. There are no threads, channels, files, sockets or clocks here;
//! the runtime (crate `cutline`) carries decisions out, and the simulation drives the very same machines.
//!
//! - [`ids`]: newtypes for protocol quantities.
//! - [`barrier`]: what a barrier carries.
//! - [`aligner`]: the per-task barrier alignment machine.
//! - [`coordinator`]: the checkpoint coordinator machine.
//! - [`restart`]: restart strategies and the choice of the checkpoint to restore.
//! - [`lifecycle`]: the life of one run: start, restore, claim, deploy, run, fail over and restart.
//! - [`watermark`]: event time, watermark messages, and the per-task combination of input watermarks.

#![warn(missing_docs)]

pub mod aligner;
pub mod barrier;
pub mod coordinator;
pub mod ids;
pub mod lifecycle;
pub mod restart;
pub mod watermark;

pub use ids::*;
