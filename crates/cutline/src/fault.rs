//! Failure injection for drills and the simulation: named points in the task and storage paths where a
//! policy may make the operation fail. Off (and free) unless a policy is installed.

use crate::error::TaskError;
use std::sync::Arc;

/// A place where a failure can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// Before a task processes a batch of records.
    ProcessBatch,
    /// At the barrier, before the task's state is copied.
    Snapshot,
    /// In the snapshot writer, before the state file is written.
    SnapshotWrite,
    /// At the barrier, before a sink prepares.
    SinkPrepare,
    /// Before a sink commits.
    SinkCommit,
    /// After a sink committed part of what it had to commit.
    SinkCommitMidway,
    /// Before a restored sink finishes the commits of the restored checkpoint.
    SinkRecover,
}

/// The installed policy; `Faults::none()` injects nothing.
#[derive(Clone, Default)]
pub struct Faults(Option<Arc<dyn Fn(FaultPoint) -> bool + Send + Sync>>);

impl Faults {
    /// A policy that injects nothing (the default); checking it costs one branch.
    pub fn none() -> Faults {
        Faults(None)
    }
    /// A policy that fails the operation at a [`FaultPoint`] whenever `policy` returns `true` for it.
    /// It is called from task and writer threads at once, at every point reached.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub fn new(policy: impl Fn(FaultPoint) -> bool + Send + Sync + 'static) -> Faults {
        Faults(Some(Arc::new(policy)))
    }
    /// Fails with [`TaskError::Injected`] if the policy says so.
    #[inline]
    pub(crate) fn check(&self, at: FaultPoint) -> Result<(), TaskError> {
        match &self.0 {
            Some(p) if p(at) => Err(TaskError::Injected(format!("{at:?}"))),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Faults(policy)" } else { "Faults(none)" })
    }
}
