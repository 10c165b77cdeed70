//! Newtypes for every protocol quantity. One type per quantity, used everywhere: the coordinator, the
//! tasks, the storage layer and the simulation all speak in these. Nothing here does I/O.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The number of a checkpoint, which is also its epoch: barriers carry it, tasks snapshot under it,
/// storage files are named after it. Strictly increasing for the whole life of a job, across restarts
/// and process deaths (see `EpochLease` in the coordinator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct CheckpointId(pub u64);

impl CheckpointId {
    pub fn next(self) -> CheckpointId {
        CheckpointId(self.0.checked_add(1).expect("checkpoint id overflow"))
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chk-{}", self.0)
    }
}

/// One incarnation of the running job. Every restart (in-process or after a process death) starts a new
/// generation; every message between tasks and coordinator carries it and the coordinator ignores
/// messages from older generations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct Generation(pub u64);

impl Generation {
    pub fn next(self) -> Generation {
        Generation(self.0 + 1)
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gen-{}", self.0)
    }
}

/// Dense index of a task (one parallel instance of one stage) inside one deployed job graph.
/// Not stable across code changes: storage maps state by [`OperatorId`] and [`SubtaskIndex`] instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId(pub u32);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task-{}", self.0)
    }
}

/// Index of a parallel instance within its stage, `0..parallelism`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SubtaskIndex(pub u32);

/// The stable, user-visible id of a stage (operator). State in a checkpoint is filed under it, so that a
/// job whose code changed still finds the state of the operators it kept.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OperatorId(pub String);

impl OperatorId {
    pub fn new(s: impl Into<String>) -> OperatorId {
        OperatorId(s.into())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OperatorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The unit in which keyed state is partitioned and redistributed. A key belongs to key group
/// `hash(key) % max_parallelism`; a subtask owns a contiguous [`KeyGroupRange`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KeyGroup(pub u32);

/// Default number of key groups (the upper bound on a keyed stage's parallelism).
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;

/// A half-open range of key groups `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    pub start: u32,
    pub end: u32,
}

impl KeyGroupRange {
    /// The key groups owned by `subtask` of a stage with `parallelism` instances and `max_parallelism`
    /// key groups. Ranges of all subtasks are disjoint and cover `0..max_parallelism`.
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, subtask: u32) -> KeyGroupRange {
        assert!(
            parallelism >= 1 && parallelism <= max_parallelism,
            "parallelism {parallelism} outside 1..={max_parallelism}"
        );
        assert!(subtask < parallelism);
        let (m, p, s) = (max_parallelism as u64, parallelism as u64, subtask as u64);
        // ceil(s * m / p): the exact inverse of `subtask_for_key_group`.
        let start = ((s * m).div_ceil(p)) as u32;
        let end = (((s + 1) * m).div_ceil(p)) as u32;
        KeyGroupRange { start, end }
    }
    pub fn contains(&self, kg: KeyGroup) -> bool {
        kg.0 >= self.start && kg.0 < self.end
    }
    pub fn overlaps(&self, other: &KeyGroupRange) -> bool {
        self.start < other.end && other.start < self.end
    }
    pub fn len(&self) -> u32 {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// The subtask (of `parallelism`) that owns key group `kg`; the inverse of [`KeyGroupRange::for_subtask`].
pub fn subtask_for_key_group(max_parallelism: u32, parallelism: u32, kg: KeyGroup) -> u32 {
    debug_assert!(kg.0 < max_parallelism);
    (kg.0 as u64 * parallelism as u64 / max_parallelism as u64) as u32
}

/// Milliseconds on the caller's clock. The pure cores never read a clock: time is an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct TimeMs(pub u64);

impl TimeMs {
    pub fn saturating_sub(self, other: TimeMs) -> u64 {
        self.0.saturating_sub(other.0)
    }
    pub fn plus_ms(self, ms: u64) -> TimeMs {
        TimeMs(self.0.saturating_add(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_group_ranges_cover_and_invert() {
        for max in [1u32, 7, 128] {
            for p in 1..=max.min(13) {
                let mut next = 0;
                for s in 0..p {
                    let r = KeyGroupRange::for_subtask(max, p, s);
                    assert_eq!(r.start, next);
                    next = r.end;
                    for kg in r.start..r.end {
                        assert_eq!(subtask_for_key_group(max, p, KeyGroup(kg)), s);
                    }
                }
                assert_eq!(next, max);
            }
        }
    }
}
