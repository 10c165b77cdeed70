//! Newtypes for every protocol quantity. One type per quantity, used everywhere: the coordinator, the
//! tasks, the storage layer and the simulation all speak in these. Nothing here does I/O.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The number of a checkpoint, which is also its epoch: barriers carry it, tasks snapshot under it,
/// storage files are named after it. Strictly increasing for the whole life of a job, across restarts
/// and process deaths: a coordinator issues ids only below the durable epoch lease recorded in
/// `job.meta` (see [`EPOCH_LEASE_BLOCK`](super::coordinator::EPOCH_LEASE_BLOCK)), and a run starts at
/// or above that lease's end and above the highest checkpoint directory in storage. Displayed as
/// `chk-<n>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct CheckpointId(pub u64);

impl CheckpointId {
    /// The id after this one.
    ///
    /// # Panics
    /// At `u64::MAX`. The coordinator never asks for it: it reports
    /// [`Decision::EpochsExhausted`](super::coordinator::Decision::EpochsExhausted) first.
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
/// messages from older generations. Displayed as `gen-<n>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct Generation(pub u64);

impl Generation {
    /// The generation after this one.
    ///
    /// # Panics
    /// At `u64::MAX` in debug builds (it wraps in release builds). The run lifecycle does not use it:
    /// it checks that a next generation exists before it takes one (see
    /// [`RunFailure::Exhausted`](super::lifecycle::RunFailure::Exhausted)).
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
/// Displayed as `task-<n>`.
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
    /// Wraps `s` as is; nothing is checked here. The job builder of crate `cutline` refuses stage
    /// ids that are empty, longer than 128 characters, not made of `[A-Za-z0-9_.-]` or shared by two
    /// stages, and storage refuses ids it cannot name files after.
    pub fn new(s: impl Into<String>) -> OperatorId {
        OperatorId(s.into())
    }
    /// The id as a string.
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
    /// The first key group in the range.
    pub start: u32,
    /// One past the last key group in the range; equal to `start` for an empty range.
    pub end: u32,
}

impl KeyGroupRange {
    /// The key groups owned by `subtask` of a stage with `parallelism` instances and `max_parallelism`
    /// key groups. Ranges of all subtasks are disjoint and cover `0..max_parallelism`.
    ///
    /// # Panics
    /// If `parallelism` is not in `1..=max_parallelism` or `subtask` is not below `parallelism`; the
    /// job graph checks both when it is built.
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
    /// Whether `kg` is in `[start, end)`.
    pub fn contains(&self, kg: KeyGroup) -> bool {
        kg.0 >= self.start && kg.0 < self.end
    }
    /// Whether the two ranges share at least one key group (an empty range overlaps nothing).
    pub fn overlaps(&self, other: &KeyGroupRange) -> bool {
        self.start < other.end && other.start < self.end
    }
    /// The number of key groups in the range.
    pub fn len(&self) -> u32 {
        self.end - self.start
    }
    /// Whether the range holds no key group.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// The subtask (of `parallelism`) that owns key group `kg`; the inverse of [`KeyGroupRange::for_subtask`].
/// `kg` must be below `max_parallelism` (checked in debug builds only; a larger one yields a subtask
/// index that does not exist).
pub fn subtask_for_key_group(max_parallelism: u32, parallelism: u32, kg: KeyGroup) -> u32 {
    debug_assert!(kg.0 < max_parallelism);
    (kg.0 as u64 * parallelism as u64 / max_parallelism as u64) as u32
}

/// Milliseconds on the caller's clock. The pure cores never read a clock: time is an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct TimeMs(pub u64);

impl TimeMs {
    /// Milliseconds from `other` to `self`; 0 if `other` is later.
    pub fn saturating_sub(self, other: TimeMs) -> u64 {
        self.0.saturating_sub(other.0)
    }
    /// The time `ms` milliseconds later, `u64::MAX` at most.
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
