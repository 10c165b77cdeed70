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

/// The kind of snapshot a barrier asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SnapshotKind {
    /// A periodic checkpoint, owned by retention.
    Checkpoint,
    /// The checkpoint taken when every bounded source has finished; sources emit end-of-stream right
    /// after its barrier.
    Final,
}

/// A checkpoint barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Barrier {
    pub checkpoint: CheckpointId,
    pub generation: Generation,
    /// Coordinator time at which the checkpoint was triggered.
    pub triggered_at: TimeMs,
    pub kind: SnapshotKind,
    pub mode: CheckpointMode,
}
