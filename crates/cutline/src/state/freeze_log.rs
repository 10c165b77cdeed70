//! [`FreezeLog`]: what a keyed map remembers of its last freezes, so that a snapshot can be
//! encoded as what changed since an earlier one (its base). Shared by the in-memory table (an
//! epoch per freeze) and the disk store (the keys written in the interval each freeze ended).

use cutline_core::CheckpointId;
use std::collections::VecDeque;

/// The last `max` freezes of a map, oldest first, each with what the map keeps of it.
pub(crate) struct FreezeLog<T> {
    kept: VecDeque<(CheckpointId, T)>,
    max: usize,
}

impl<T> FreezeLog<T> {
    pub fn new(max: usize) -> Self {
        FreezeLog { kept: VecDeque::new(), max }
    }

    /// What was kept of the freeze for `checkpoint`, if it still is.
    pub fn get(&self, checkpoint: CheckpointId) -> Option<&T> {
        self.kept.iter().find(|(c, _)| *c == checkpoint).map(|(_, t)| t)
    }

    /// Record the freeze for `checkpoint`. `base` (the task's latest complete checkpoint, which only
    /// moves forward) is the oldest a later snapshot may build on: what is kept of older freezes is
    /// dropped, and beyond `max` the oldest.
    pub fn record(&mut self, checkpoint: CheckpointId, base: Option<CheckpointId>, kept: T) {
        if let Some(b) = base {
            while self.kept.front().is_some_and(|(c, _)| *c < b) {
                self.kept.pop_front();
            }
        }
        if self.kept.len() == self.max {
            self.kept.pop_front();
        }
        self.kept.push_back((checkpoint, kept));
    }

    /// What was kept of the freezes after `base`, oldest first.
    #[cfg_attr(not(feature = "spill"), allow(dead_code))]
    pub fn after(&self, base: CheckpointId) -> impl Iterator<Item = &T> {
        self.kept.iter().filter(move |(c, _)| *c > base).map(|(_, t)| t)
    }

    /// What is kept of every freeze, oldest first.
    #[cfg_attr(not(feature = "spill"), allow(dead_code))]
    pub fn kept(&self) -> impl Iterator<Item = &T> {
        self.kept.iter().map(|(_, t)| t)
    }

    /// Forget every freeze: the next snapshot is whole.
    #[cfg_attr(not(feature = "spill"), allow(dead_code))]
    pub fn clear(&mut self) {
        self.kept.clear();
    }
}
