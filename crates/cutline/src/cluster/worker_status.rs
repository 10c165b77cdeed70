//! What a worker process says about itself to its health and readiness probes and its metrics
//! endpoint ([`WorkerStatus`]): whether it is connected to a coordinator, which generation it runs,
//! and its tasks' flow-control figures (as of its last heartbeat).

use crate::runtime::TaskReport;
use std::sync::Mutex;

/// A worker's state as its probes see it; shared between the worker loop and whoever serves it.
#[derive(Debug, Default)]
pub struct WorkerStatus {
    state: Mutex<WorkerState>,
}

/// One look at a worker's state.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WorkerState {
    /// Joined to a coordinator now.
    pub connected: bool,
    /// The coordinator's address.
    pub coordinator: String,
    /// The generation whose tasks run here now (`None`: none deployed).
    pub generation: Option<u64>,
    /// The tasks running here, as of the last heartbeat.
    pub tasks: Vec<TaskReport>,
    /// Times this worker joined a coordinator.
    pub joins: u64,
}

impl WorkerStatus {
    /// The state now.
    pub fn snapshot(&self) -> WorkerState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Ready for work: joined, with a generation's tasks deployed.
    pub fn is_ready(&self) -> bool {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.connected && s.generation.is_some()
    }

    fn update(&self, f: impl FnOnce(&mut WorkerState)) {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn joined(&self, coordinator: &str) {
        self.update(|s| {
            s.connected = true;
            s.coordinator = coordinator.to_string();
            s.joins += 1;
        })
    }

    pub(crate) fn running(&self, generation: Option<u64>, tasks: &[(u32, TaskReport)]) {
        self.update(|s| {
            s.generation = generation;
            s.tasks = tasks.iter().map(|(_, r)| r.clone()).collect();
        })
    }

    pub(crate) fn lost(&self) {
        self.update(|s| {
            s.connected = false;
            s.generation = None;
            s.tasks.clear();
        })
    }
}
