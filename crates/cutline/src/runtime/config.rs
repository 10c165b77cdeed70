//! [`RunConfig`]: how a job runs (storage, checkpoint settings, restart strategy, channel and batch
//! sizes, writers), with its defaults and validation.

use super::error::RunError;
use crate::fault::Faults;
use crate::state::StateBackend;
use cutline_core::coordinator::CheckpointConfig;
use cutline_core::restart::RestartStrategy;
use cutline_storage::CheckpointStore;
use std::path::PathBuf;
use std::sync::Arc;

/// Batches a data channel holds before its upstream task stops starting new work (backpressure: a
/// task reads input or polls its source only while every output channel has room; the output of
/// work already started may overdraw a channel, pushing never blocks).
pub const DEFAULT_CHANNEL_CAPACITY: usize = 16;
/// Snapshots queued for the writers before a task blocks at its next barrier.
pub const SNAPSHOT_QUEUE_CAPACITY: usize = 64;
/// Complete checkpoints kept by retention.
pub const DEFAULT_RETAINED_CHECKPOINTS: usize = 3;
/// How often, in milliseconds, the coordinator looks at the clock when nothing happens.
pub const DEFAULT_TICK_MS: u64 = 1;

/// How a job runs. Build with [`RunConfig::new`] and adjust fields; the run checks them when it
/// starts and fails with [`RunError::Config`](super::RunError::Config) saying what to change.
#[derive(Clone)]
pub struct RunConfig {
    /// Where checkpoints, `job.meta` and the generation records live. The run holds the store's lock
    /// ([`CheckpointStore::lock`]) while it runs; two runs must not share a store.
    pub store: Arc<dyn CheckpointStore>,
    /// Identifies the job in its state directory: a directory written by another job is refused.
    pub job_fingerprint: String,
    /// Checkpoint settings (default [`CheckpointConfig::default`]); they may be changed while the job
    /// runs through [`JobControl::set_checkpoint_config`](super::JobControl::set_checkpoint_config).
    pub checkpoint: CheckpointConfig,
    /// How the job restarts after a failover (default [`RestartStrategy::default`]).
    pub restart: RestartStrategy,
    /// Complete checkpoints kept (default 3).
    pub retain: usize,
    /// Batches per data channel (default 16).
    pub channel_capacity: usize,
    /// Records per batch (default 1024).
    pub batch_size: usize,
    /// Snapshot writer threads (default 1).
    pub snapshot_writers: usize,
    /// Incremental checkpoints (default on): a task's snapshot holds only the keyed state that
    /// changed since its latest complete checkpoint, on top of that checkpoint's files, which later
    /// manifests then share. Off: every snapshot holds all state. Savepoints are always whole.
    pub incremental_checkpoints: bool,
    /// Where keyed operators keep their state between checkpoints (default
    /// [`StateBackend::Memory`]; [`StateBackend::Disk`] for state larger than memory, feature `spill`).
    pub state_backend: StateBackend,
    /// Failure injection (drills, tests; feature `testing`); none by default.
    #[cfg(feature = "testing")]
    pub faults: Faults,
    /// How often the coordinator evaluates triggers and timeouts (default 1 ms).
    pub tick_ms: u64,
    /// Limit of the in-flight records one task persists for one unaligned checkpoint; above it the
    /// task declines the checkpoint (default 256 MiB).
    pub max_channel_state_bytes: u64,
    /// Start from this exported savepoint when the store holds no complete checkpoint yet (a later
    /// restart of the same run resumes from the run's own checkpoints).
    pub from_savepoint: Option<PathBuf>,
    /// Where savepoints go when a request names no directory: `<dir>/sp-<checkpoint id, 20 digits
    /// zero-padded>`. Without it, a savepoint request must name its directory.
    pub savepoint_dir: Option<PathBuf>,
    /// The same failure this many times in a row, each time after restoring the same checkpoint,
    /// ends the run whatever `restart` allows (default 3,
    /// [`MAX_REPEATED_FAILURES`](cutline_core::lifecycle::MAX_REPEATED_FAILURES)); `None` leaves it
    /// to `restart` alone (for harnesses that inject the same failure at random).
    pub max_repeated_failures: Option<u32>,
    /// Called with every completed checkpoint's record (statistics and epoch trace), on the
    /// coordinator's thread right after the record is stored: it must return at once (hand the
    /// record to a thread of its own, as the OTLP exporter's (`cutline::admin::otlp`)
    /// listener does). None by default.
    pub on_checkpoint: Option<CheckpointListener>,
}

/// See [`RunConfig::on_checkpoint`].
pub type CheckpointListener = Arc<dyn Fn(&super::CheckpointRecord) + Send + Sync>;

/// Default of [`RunConfig::max_channel_state_bytes`].
pub const DEFAULT_MAX_CHANNEL_STATE_BYTES: u64 = 256 << 20;

impl RunConfig {
    /// The default settings for a job whose state lives in `store`, identified there by
    /// `job_fingerprint` (change it when the job's meaning changes: a store written under another
    /// fingerprint is refused).
    pub fn new(store: Arc<dyn CheckpointStore>, job_fingerprint: impl Into<String>) -> RunConfig {
        RunConfig {
            store,
            job_fingerprint: job_fingerprint.into(),
            checkpoint: CheckpointConfig::default(),
            restart: RestartStrategy::default(),
            retain: DEFAULT_RETAINED_CHECKPOINTS,
            channel_capacity: DEFAULT_CHANNEL_CAPACITY,
            batch_size: crate::dataflow::DEFAULT_BATCH_SIZE,
            snapshot_writers: 1,
            incremental_checkpoints: true,
            state_backend: StateBackend::Memory,
            #[cfg(feature = "testing")]
            faults: Faults::none(),
            tick_ms: DEFAULT_TICK_MS,
            max_channel_state_bytes: DEFAULT_MAX_CHANNEL_STATE_BYTES,
            from_savepoint: None,
            savepoint_dir: None,
            max_repeated_failures: Some(cutline_core::lifecycle::MAX_REPEATED_FAILURES),
            on_checkpoint: None,
        }
    }

    /// The failure-injection policy: the installed one with feature `testing`, none without.
    pub(crate) fn faults(&self) -> Faults {
        #[cfg(feature = "testing")]
        return self.faults.clone();
        #[cfg(not(feature = "testing"))]
        return Faults::none();
    }

    pub(crate) fn validate(&self) -> Result<(), RunError> {
        self.checkpoint.validate().map_err(RunError::Config)?;
        self.restart.validate().map_err(RunError::Config)?;
        let bad = |m: &str| Err(RunError::Config(m.to_string()));
        self.state_backend.check().map_err(RunError::Config)?;
        if self.retain == 0 {
            return bad("retain must keep at least 1 checkpoint");
        }
        if self.channel_capacity == 0 || self.batch_size == 0 || self.snapshot_writers == 0 || self.tick_ms == 0 {
            return bad("channel capacity, batch size, snapshot writers and tick must all be positive");
        }
        Ok(())
    }
}
