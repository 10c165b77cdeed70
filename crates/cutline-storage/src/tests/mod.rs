//! Unit tests that need crate internals or pin the contract's panics. The store scenarios, written once
//! and run against every store, are the conformance suite in `tests/` (`tests/common`,
//! `tests/conformance.rs`, `tests/s3/`).

mod contract;
mod faulty;

use crate::{Manifest, TaskStateHandle};
use cutline_core::{CheckpointId, Generation};

pub(crate) fn manifest(id: u64, tasks: Vec<TaskStateHandle>) -> Manifest {
    Manifest::new("job-fingerprint", CheckpointId(id), Generation(1), 1_000 + id, false, tasks)
}
