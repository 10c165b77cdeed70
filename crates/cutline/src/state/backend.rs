//! [`StateBackend`]: where a job's keyed operators keep their state between checkpoints.

use std::path::PathBuf;

/// Default of [`StateBackend::Disk`]'s `cache_entries`.
pub const DEFAULT_DISK_CACHE_ENTRIES: usize = 65_536;

/// Where a job's keyed operators keep their value state ([`RunConfig::state_backend`](crate::RunConfig)).
/// Both backends checkpoint and restore the same way: the same files, incremental or whole, so a job
/// may restore a checkpoint written under the other backend. Timers and watermarks stay in memory in
/// both.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StateBackend {
    /// In memory, in a copy-on-write table (the default, and the fastest): the state must fit in
    /// memory.
    #[default]
    Memory,
    /// On local disk, for state larger than memory (cargo feature `spill`): each keyed operator task
    /// keeps an embedded store (fjall, an LSM tree) under `dir`, and in memory a write-back cache
    /// of at most `cache_entries` keys it read or wrote. A full cache is handed whole to the store's
    /// writer thread, which writes it in one batch, and the task goes on with an empty one. At
    /// a barrier the task hands its cache over the same way (a swap: the barrier's cost does not
    /// grow with the state or the cache); a whole snapshot reads the store's view right after that
    /// cache is written, an incremental one the writer's log of what it wrote, while processing
    /// goes on. At most four caches are in memory (the task's and
    /// three being written). The store is scratch space: a restarted task refills a new one from
    /// the checkpoint, and files left by a killed process are removed when a later one starts under
    /// the same `dir`. On a cluster, `dir` is a path on each worker's machine.
    Disk {
        /// The directory of the stores (created if missing). A local disk: the task reads it on a
        /// cache miss.
        dir: PathBuf,
        /// Keys cached in memory per task (at least 1; default [`DEFAULT_DISK_CACHE_ENTRIES`]).
        cache_entries: usize,
    },
}

impl StateBackend {
    /// The disk backend under `dir` with the default cache.
    pub fn disk(dir: impl Into<PathBuf>) -> StateBackend {
        StateBackend::Disk { dir: dir.into(), cache_entries: DEFAULT_DISK_CACHE_ENTRIES }
    }

    /// Why this build cannot run with it, if it cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self {
            StateBackend::Memory => Ok(()),
            StateBackend::Disk { .. } if !cfg!(feature = "spill") => Err(
                "the disk state backend is not in this build: build cutline with cargo feature `spill` (cutline-cli: \
                 `--features spill`), or use the memory backend"
                    .into(),
            ),
            StateBackend::Disk { cache_entries: 0, .. } => {
                Err("the disk state backend needs a cache of at least 1 entry".into())
            }
            StateBackend::Disk { dir, .. } if dir.as_os_str().is_empty() => {
                Err("the disk state backend needs a directory".into())
            }
            StateBackend::Disk { .. } => Ok(()),
        }
    }
}
