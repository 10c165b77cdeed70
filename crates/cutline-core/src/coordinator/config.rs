//! [`CheckpointConfig`]: the checkpoint settings, their defaults and validation, and how they decide
//! the alignment of a checkpoint's barriers.

use crate::barrier::{Alignment, CheckpointMode, SnapshotKind};

/// The most checkpoints [`CheckpointConfig::max_concurrent`] allows in flight at once. Every
/// checkpoint in flight costs every task a barrier, a snapshot and (at a sink) a prepared transaction;
/// more than this only adds cost.
pub const MAX_CONCURRENT_CHECKPOINTS: usize = 16;

/// While a checkpoint is in flight, the next one is triggered no sooner than this after the previous
/// trigger, whatever the interval: concurrent checkpoints are triggered at most 20 times a second.
/// With a 1 ms interval and many checkpoints allowed in flight, barriers otherwise follow each other
/// so closely that tasks do little but take snapshots and data nearly stops. With no checkpoint in
/// flight the interval (and min pause) alone decide, so a short interval with one checkpoint in flight
/// is paced by the checkpoints' own duration, as before.
pub const MIN_CONCURRENT_TRIGGER_GAP_MS: u64 = 50;

/// Is `n` a valid [`CheckpointConfig::max_concurrent`]? The message says what is allowed; the CLI's
/// flags and the admin protocol's `max-concurrent` give the same one.
pub fn check_max_concurrent(n: usize) -> Result<(), String> {
    if (1..=MAX_CONCURRENT_CHECKPOINTS).contains(&n) {
        Ok(())
    } else {
        Err(format!("max concurrent checkpoints must be at least 1 and at most {MAX_CONCURRENT_CHECKPOINTS}, not {n}"))
    }
}

/// Checkpointing settings. Defaults are documented on each field.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CheckpointConfig {
    /// Time between checkpoint triggers; `None` turns periodic checkpoints off (the final checkpoint
    /// at end of input is still taken). Default 1000 ms.
    pub interval_ms: Option<u64>,
    /// A checkpoint not complete this long after its trigger is aborted. Default 60 000 ms.
    pub timeout_ms: u64,
    /// Minimum time between the end of one checkpoint and the trigger of the next. Default 0.
    pub min_pause_ms: u64,
    /// Checkpoints in flight at once, 1 to [`MAX_CONCURRENT_CHECKPOINTS`]. Default 1. While one is in
    /// flight, the next is triggered no sooner than [`MIN_CONCURRENT_TRIGGER_GAP_MS`] after the
    /// previous trigger, whatever the interval.
    pub max_concurrent: usize,
    /// Consecutive failed checkpoints (timeout, a task's decline, a failed manifest write) tolerated
    /// before the job fails over. Aborts caused by a failover, subsumed checkpoints and failed
    /// savepoints do not count; a completed checkpoint resets the count. Default 3.
    pub tolerable_failures: u32,
    /// Alignment mode carried by barriers. Default exactly-once.
    pub mode: CheckpointMode,
    /// Exactly-once checkpoints are unaligned: barriers overtake queued records, which are persisted as
    /// channel state, so a checkpoint does not wait for a backlog. Default false. Savepoints and the
    /// final checkpoint are always aligned (see [`CheckpointConfig::alignment_for`]); at-least-once
    /// mode refuses it.
    pub unaligned: bool,
    /// An aligned checkpoint that a task is still aligning this many milliseconds after its trigger
    /// (measured from the trigger, not from the task's first barrier) switches to unaligned at that
    /// task (and downstream). Default off.
    pub alignment_timeout_ms: Option<u64>,
    /// An aligned checkpoint whose blocked inputs at a task hold more than this many bytes switches to
    /// unaligned there. Default off.
    pub max_aligned_bytes: Option<u64>,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            interval_ms: Some(1000),
            timeout_ms: 60_000,
            min_pause_ms: 0,
            max_concurrent: 1,
            tolerable_failures: 3,
            mode: CheckpointMode::ExactlyOnce,
            unaligned: false,
            alignment_timeout_ms: None,
            max_aligned_bytes: None,
        }
    }
}

impl CheckpointConfig {
    /// Reject settings that cannot work, with a message that says what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.interval_ms == Some(0) {
            return Err("checkpoint interval must be positive (or off)".into());
        }
        if self.timeout_ms == 0 {
            return Err("checkpoint timeout must be positive".into());
        }
        check_max_concurrent(self.max_concurrent)?;
        if self.mode == CheckpointMode::AtLeastOnce
            && (self.unaligned || self.alignment_timeout_ms.is_some() || self.max_aligned_bytes.is_some())
        {
            return Err("unaligned checkpoints and alignment limits apply to exactly-once mode; at-least-once never blocks an input".into());
        }
        Ok(())
    }

    /// How the barriers of a checkpoint of `kind` align under these settings. Only periodic
    /// checkpoints may be unaligned: savepoints must be self-contained and portable, and after the
    /// checkpoint that ends the input (final, stop-with-savepoint) no later checkpoint would commit
    /// the sink output of records it overtook.
    pub fn alignment_for(&self, kind: SnapshotKind) -> Alignment {
        if kind != SnapshotKind::Checkpoint || self.mode == CheckpointMode::AtLeastOnce {
            Alignment::Aligned
        } else if self.unaligned {
            Alignment::Unaligned
        } else if self.alignment_timeout_ms.is_some() || self.max_aligned_bytes.is_some() {
            Alignment::AlignedWithTimeout {
                timeout_ms: self.alignment_timeout_ms.unwrap_or(u64::MAX),
                max_blocked_bytes: self.max_aligned_bytes.unwrap_or(u64::MAX),
            }
        } else {
            Alignment::Aligned
        }
    }
}
