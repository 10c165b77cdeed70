//! How a coordinator runs a job on worker processes ([`ClusterConfig`]) and its defaults.

use super::wire::{self, FrameProtection, Secret};
use crate::runtime::RunError;

/// Default interval of heartbeats in milliseconds, both ways.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 200;
/// Default silence in milliseconds after which a peer is lost.
pub const DEFAULT_HEARTBEAT_TIMEOUT_MS: u64 = 3_000;
/// Default of [`ClusterConfig::join_timeout_ms`]: how long, in milliseconds, a generation waits for
/// enough workers to join before its deployment fails.
pub const DEFAULT_JOIN_TIMEOUT_MS: u64 = 120_000;
/// How long, in milliseconds, a restart waits for lost workers to be replaced before it runs on fewer.
pub const DEFAULT_REPLACEMENT_WAIT_MS: u64 = 5_000;
/// How long, in milliseconds, the workers may take to deploy a generation (restore state, open links).
pub const DEFAULT_DEPLOY_TIMEOUT_MS: u64 = 60_000;
/// How a coordinator runs a job on worker processes.
#[derive(Clone)]
pub struct ClusterConfig {
    /// Where workers connect ("0.0.0.0:7070").
    pub listen: String,
    /// Workers a generation is placed on when all are there.
    pub workers: usize,
    /// Fewest workers a restart runs on after waiting `replacement_wait_ms` for the others.
    pub min_workers: usize,
    /// The cluster's shared secret (at least 16 bytes); peers prove they hold it, it is never sent.
    pub secret: Vec<u8>,
    /// The arguments workers build the job from (the job part of the command line).
    pub job_args: Vec<String>,
    /// The checkpoint storage every worker opens (a path every host sees, or `s3://bucket/prefix`).
    pub state: String,
    /// Milliseconds between heartbeats, both ways; workers take it from the coordinator.
    pub heartbeat_interval_ms: u64,
    /// Milliseconds of silence after which the coordinator drops a worker (and a worker its
    /// coordinator); above `heartbeat_interval_ms`. Also how long tearing a generation down waits
    /// for each worker to confirm its tasks stopped before it is dropped.
    pub heartbeat_timeout_ms: u64,
    /// Milliseconds a generation waits for its workers: all `workers` for the first generation; after
    /// a loss, `min_workers` once `replacement_wait_ms` passed. Then the deployment fails, and the
    /// restart strategy decides whether to try again.
    pub join_timeout_ms: u64,
    /// Milliseconds a restart waits for lost workers to be replaced before it runs on at least
    /// `min_workers`.
    pub replacement_wait_ms: u64,
    /// Milliseconds the workers may take to deploy a generation; then the deployment fails (a failure
    /// subject to the restart strategy).
    pub deploy_timeout_ms: u64,
    /// The largest frame, in bytes, every connection of the cluster accepts after its handshake
    /// (workers take it from the coordinator); a larger one drops the connection with a message
    /// naming this setting.
    /// Default 64 MiB.
    pub max_frame_bytes: u32,
    /// Whether the frames of the coordinator's connections are sealed (workers must agree).
    pub frame_protection: FrameProtection,
}

impl ClusterConfig {
    /// A cluster of `workers` workers connecting to `listen`, with the given `secret`, job arguments
    /// and checkpoint storage, and the defaults for everything else (`min_workers` 1). The secret and
    /// the worker counts are checked when the cluster is spawned
    /// ([`RunError::Config`](super::super::RunError::Config)).
    pub fn new(
        listen: impl Into<String>,
        workers: usize,
        secret: Vec<u8>,
        job_args: Vec<String>,
        state: String,
    ) -> Self {
        ClusterConfig {
            listen: listen.into(),
            workers,
            min_workers: 1,
            secret,
            job_args,
            state,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            heartbeat_timeout_ms: DEFAULT_HEARTBEAT_TIMEOUT_MS,
            join_timeout_ms: DEFAULT_JOIN_TIMEOUT_MS,
            replacement_wait_ms: DEFAULT_REPLACEMENT_WAIT_MS,
            deploy_timeout_ms: DEFAULT_DEPLOY_TIMEOUT_MS,
            max_frame_bytes: wire::DEFAULT_MAX_FRAME_BYTES,
            frame_protection: FrameProtection::default(),
        }
    }

    pub(crate) fn validate(&self) -> Result<Secret, RunError> {
        let bad = |m: String| Err(RunError::Config(m));
        if self.workers == 0 || self.min_workers == 0 || self.min_workers > self.workers {
            return bad(format!(
                "a cluster needs at least 1 worker and 1 <= min workers <= workers (got {} and {})",
                self.workers, self.min_workers
            ));
        }
        if self.heartbeat_interval_ms == 0 || self.heartbeat_timeout_ms <= self.heartbeat_interval_ms {
            return bad("the heartbeat timeout must be longer than the (positive) heartbeat interval".into());
        }
        Secret::new(self.secret.clone()).map_err(RunError::Config)
    }
}
