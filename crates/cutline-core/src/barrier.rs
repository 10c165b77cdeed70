//! What a checkpoint barrier carries. Barriers travel on the same channels as records, never overtake a
//! record in the same channel, and are handled by the task's control plane: operators never see them.

use crate::ids::{CheckpointId, Generation, TimeMs};
use serde::{Deserialize, Serialize};

/// How a task treats its inputs while a barrier is partially aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CheckpointMode {
    /// Aligned: an input that delivered barrier n is not read again until every input delivered it.
    /// Snapshots are exact cuts; recovery replays nothing twice.
    ExactlyOnce,
    /// Unaligned in the weak sense: nothing is blocked, the snapshot is taken when the last input's
    /// barrier arrives. Records after an early barrier may be in the snapshot and replayed again.
    AtLeastOnce,
}

impl std::str::FromStr for CheckpointMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exactly-once" => Ok(CheckpointMode::ExactlyOnce),
            "at-least-once" => Ok(CheckpointMode::AtLeastOnce),
            other => Err(format!("unknown checkpoint mode {other:?}: use exactly-once or at-least-once")),
        }
    }
}

/// How an exactly-once barrier treats the records queued in front of it (ignored in at-least-once mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Alignment {
    /// An input that delivered the barrier is blocked until every input delivered it; nothing in flight
    /// is persisted, but the barrier waits behind every queued record.
    Aligned,
    /// The barrier overtakes the records queued in front of it: the task snapshots at the first barrier,
    /// forwards it at once, and persists the overtaken records as channel state.
    Unaligned,
    /// Starts aligned; a task still aligning this checkpoint `timeout_ms` after its trigger (measured
    /// from [`Barrier::triggered_at`], not from the first barrier at the task), or whose blocked inputs
    /// hold more than `max_blocked_bytes`, switches it to unaligned there and forwards the barrier
    /// unaligned, so every task downstream switches too.
    AlignedWithTimeout {
        /// Milliseconds after the trigger; `u64::MAX` when only the byte limit is set.
        timeout_ms: u64,
        /// Bytes queued on the task's blocked inputs; `u64::MAX` when only the timeout is set.
        max_blocked_bytes: u64,
    },
}

/// The kind of snapshot a barrier asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SnapshotKind {
    /// A periodic checkpoint, owned by retention.
    Checkpoint,
    /// The checkpoint taken when every bounded source has finished; sources emit end-of-stream right
    /// after its barrier.
    Final,
    /// A savepoint requested by the user: always aligned, exported as a self-contained copy.
    Savepoint,
    /// A savepoint after whose barrier the sources stop (they emit end-of-stream): the job drains,
    /// commits and stops. If it fails, the job fails over and keeps running.
    StopSavepoint,
}

impl SnapshotKind {
    /// Sources emit end-of-stream right after this barrier.
    pub fn ends_input(self) -> bool {
        matches!(self, SnapshotKind::Final | SnapshotKind::StopSavepoint)
    }
    /// A savepoint or a stop-with-savepoint: always aligned and exactly-once, reported to whoever asked
    /// for it, never subsumed, and its failure does not count towards a failover.
    pub fn is_savepoint(self) -> bool {
        matches!(self, SnapshotKind::Savepoint | SnapshotKind::StopSavepoint)
    }
}

/// A checkpoint barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Barrier {
    /// The checkpoint (epoch) the snapshot is taken under.
    pub checkpoint: CheckpointId,
    /// The generation whose coordinator triggered it.
    pub generation: Generation,
    /// Coordinator time at which the checkpoint was triggered.
    pub triggered_at: TimeMs,
    /// What the snapshot is for.
    pub kind: SnapshotKind,
    /// Exactly-once (inputs are blocked while aligning) or at-least-once; savepoints are always
    /// exactly-once.
    pub mode: CheckpointMode,
    /// How the barrier treats queued records. A task that switched the checkpoint to unaligned
    /// forwards it with [`Alignment::Unaligned`]; [`Barrier::same_checkpoint`] ignores the field.
    pub alignment: Alignment,
}

impl Barrier {
    /// May this barrier overtake records queued in front of it (exactly-once and unaligned)?
    pub fn is_unaligned(&self) -> bool {
        self.mode == CheckpointMode::ExactlyOnce && self.alignment == Alignment::Unaligned
    }
    /// The same checkpoint, ignoring how it is aligned (a task that switched forwards it unaligned).
    pub fn same_checkpoint(&self, other: &Barrier) -> bool {
        Barrier { alignment: other.alignment, ..*self } == *other
    }
}
