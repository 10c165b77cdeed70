//! Which files each task's incremental snapshots build on ([`Chains`]): the writers of a
//! generation record the chain of every snapshot they write, and look up the chain of the base
//! checkpoint a task names, to decide whether the next snapshot holds only what changed.
//!
//! It does no I/O and decides nothing about retention: a chain found here may still have lost a
//! file to retention by the time its checkpoint commits, and the commit refuses it then
//! ([`cutline_storage::StorageError::BaseMissing`]).

use cutline_core::{CheckpointId, TaskId};
use cutline_storage::{StateFileRef, TaskStateHandle};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Most files a restore reads for one task (a whole snapshot and the incremental ones on top) when
/// its whole file is small: the next snapshot of a longer chain is written whole.
pub(crate) const MAX_CHAIN_FILES: usize = 16;

/// Most files in a chain whose whole file weighs at least [`LONG_CHAIN_MIN_WHOLE_BYTES`]. A whole
/// snapshot passes over all of a task's state on the writer thread while the task runs (about 1 s at
/// 10 M keys), so large state writes one less often; the weight rule still bounds what a restore reads.
pub(crate) const MAX_LONG_CHAIN_FILES: usize = 64;

/// The whole file's size from which a chain may grow to [`MAX_LONG_CHAIN_FILES`]: about half a
/// second of a whole snapshot. Below it a whole snapshot is cheap and a shorter chain restores faster.
pub(crate) const LONG_CHAIN_MIN_WHOLE_BYTES: u64 = 32 << 20;

/// Snapshots remembered per task: bases only move forward, so only those at or after the newest
/// base named are kept, and at most this many.
const CHAINS_KEPT_PER_TASK: usize = 64;

/// A snapshot's checkpoint and its chain: the files a restore reads, oldest first, its own last.
type Written = (CheckpointId, Vec<StateFileRef>);

/// The chains of one generation's snapshots, shared by its writers.
#[derive(Default)]
pub(crate) struct Chains {
    by_task: Mutex<HashMap<TaskId, VecDeque<Written>>>,
}

/// How the writer encodes a snapshot.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    Whole,
    /// On top of these files (the base checkpoint's whole chain), oldest first.
    OnTopOf(Vec<StateFileRef>),
}

impl Chains {
    /// How `task`'s snapshot should be written, given the base checkpoint its task named (its latest
    /// known complete one). Whole if that snapshot is not known here (another generation wrote it),
    /// if the chain is at its most files ([`max_files`]), or if the changes on top of its whole file
    /// already weigh as much as the whole file (a restore would read more than twice the state).
    pub fn plan(&self, task: TaskId, base: Option<CheckpointId>) -> Plan {
        let Some(base) = base else { return Plan::Whole };
        let by_task = self.by_task.lock().unwrap_or_else(|e| e.into_inner());
        let Some(chain) = by_task.get(&task).and_then(|c| c.iter().find(|(id, _)| *id == base)).map(|(_, c)| c) else {
            return Plan::Whole;
        };
        let whole = chain.first().map_or(0, |f| f.size_bytes);
        let deltas: u64 = chain.iter().skip(1).map(|f| f.size_bytes).sum();
        if chain.len() >= max_files(whole) || deltas >= whole {
            return Plan::Whole;
        }
        Plan::OnTopOf(chain.clone())
    }

    /// `task` wrote `handle` for `checkpoint`, having named `base`.
    pub fn record(&self, task: TaskId, checkpoint: CheckpointId, base: Option<CheckpointId>, handle: &TaskStateHandle) {
        let mut chain = handle.base.clone();
        chain.push(handle.file_ref(checkpoint));
        let mut by_task = self.by_task.lock().unwrap_or_else(|e| e.into_inner());
        let kept = by_task.entry(task).or_default();
        kept.retain(|(id, _)| base.is_none_or(|b| *id >= b));
        if kept.len() >= CHAINS_KEPT_PER_TASK {
            kept.pop_front();
        }
        kept.push_back((checkpoint, chain));
    }
}

/// The most files of a chain whose whole file weighs `whole_bytes`.
pub(crate) fn max_files(whole_bytes: u64) -> usize {
    if whole_bytes >= LONG_CHAIN_MIN_WHOLE_BYTES {
        MAX_LONG_CHAIN_FILES
    } else {
        MAX_CHAIN_FILES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(file: &str, size_bytes: u64, base: Vec<StateFileRef>) -> TaskStateHandle {
        TaskStateHandle {
            operator: cutline_core::OperatorId::new("op"),
            subtask: cutline_core::SubtaskIndex(0),
            parallelism: 1,
            key_groups: None,
            file: file.into(),
            size_bytes,
            crc32: 0,
            base,
        }
    }

    #[test]
    fn a_chain_grows_until_its_changes_weigh_as_much_as_its_whole_file() {
        let chains = Chains::default();
        let t = TaskId(0);
        assert_eq!(chains.plan(t, Some(CheckpointId(1))), Plan::Whole, "nothing written yet");
        chains.record(t, CheckpointId(1), None, &handle("c1", 100, vec![]));
        let mut base = CheckpointId(1);
        for c in 2..=4u64 {
            let Plan::OnTopOf(chain) = chains.plan(t, Some(base)) else { panic!("{c}: incremental") };
            assert_eq!(chain.len() as u64, c - 1);
            chains.record(t, CheckpointId(c), Some(base), &handle(&format!("c{c}"), 40, chain));
            base = CheckpointId(c);
        }
        // 40 + 40 + 40 >= 100: the next one is whole.
        assert_eq!(chains.plan(t, Some(base)), Plan::Whole);
        assert_eq!(chains.plan(t, Some(CheckpointId(1))), Plan::Whole, "dropped: bases only move forward");
        assert_eq!(chains.plan(TaskId(1), Some(base)), Plan::Whole, "another task's");
    }

    /// Files in the longest chain built on a whole file of `whole_bytes`, with tiny changes.
    fn longest_chain(whole_bytes: u64) -> usize {
        let chains = Chains::default();
        let t = TaskId(0);
        chains.record(t, CheckpointId(1), None, &handle("c1", whole_bytes, vec![]));
        let mut c = 1;
        while let Plan::OnTopOf(chain) = chains.plan(t, Some(CheckpointId(c))) {
            chains.record(t, CheckpointId(c + 1), Some(CheckpointId(c)), &handle("d", 1, chain));
            c += 1;
        }
        c as usize
    }

    #[test]
    fn a_chain_ends_at_the_most_files_a_restore_reads() {
        assert_eq!(longest_chain(1_000_000), MAX_CHAIN_FILES);
        assert_eq!(longest_chain(LONG_CHAIN_MIN_WHOLE_BYTES - 1), MAX_CHAIN_FILES);
    }

    #[test]
    fn a_chain_on_a_large_whole_file_grows_longer() {
        assert_eq!(longest_chain(LONG_CHAIN_MIN_WHOLE_BYTES), MAX_LONG_CHAIN_FILES);
    }
}
