//! Barrier alignment for one task: which inputs may be read, and when the task snapshots.
//!
//! The aligner owns only per-input bookkeeping. It never touches records: in exactly-once mode it blocks
//! an input simply by telling the task not to read that channel, so data behind a barrier stays in the
//! bounded channel and the alignment buffer is the channel itself. It does not snapshot, forward barriers
//! or talk to the coordinator; it decides when the task must.

use crate::barrier::{Barrier, CheckpointMode};
use crate::ids::{CheckpointId, TimeMs};
use std::collections::BTreeMap;

/// What the task must do after telling the aligner about a barrier or an ended input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AlignAction {
    /// Keep going. In exactly-once mode the input that delivered the barrier is now blocked.
    Wait,
    /// Every live input delivered `barrier`: snapshot now, forward the barrier on every output, then
    /// carry on. All inputs blocked for it are unblocked.
    Snapshot {
        barrier: Barrier,
        /// Time from the first to the last barrier of this checkpoint at this task.
        alignment_ms: u64,
        /// Time from the trigger at the coordinator to the first barrier here.
        start_delay_ms: u64,
    },
}

#[derive(Debug)]
struct Pending {
    barrier: Barrier,
    seen: Vec<bool>,
    count: usize,
    first_at: TimeMs,
}

/// Per-task alignment state machine.
#[derive(Debug)]
pub struct Aligner {
    blocked: Vec<bool>,
    ended: Vec<bool>,
    /// Highest checkpoint whose barrier each input delivered (barriers on one channel are strictly increasing).
    last_on_input: Vec<Option<CheckpointId>>,
    pending: BTreeMap<CheckpointId, Pending>,
    last_snapshot: Option<CheckpointId>,
}

impl Aligner {
    pub fn new(inputs: usize) -> Aligner {
        assert!(inputs >= 1, "a task without inputs (a source) has no aligner");
        Aligner {
            blocked: vec![false; inputs],
            ended: vec![false; inputs],
            last_on_input: vec![None; inputs],
            pending: BTreeMap::new(),
            last_snapshot: None,
        }
    }

    pub fn inputs(&self) -> usize {
        self.blocked.len()
    }

    /// May the task read this input now?
    pub fn is_readable(&self, input: usize) -> bool {
        !self.blocked[input] && !self.ended[input]
    }

    pub fn is_blocked(&self, input: usize) -> bool {
        self.blocked[input]
    }

    /// Every input has delivered end-of-stream.
    pub fn all_ended(&self) -> bool {
        self.ended.iter().all(|e| *e)
    }

    /// Is a checkpoint being aligned right now?
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.pending.keys().next().copied()
    }

    fn live_inputs(&self) -> usize {
        self.ended.iter().filter(|e| !**e).count()
    }

    /// Input `input` delivered `barrier` at time `now`.
    pub fn on_barrier(&mut self, input: usize, barrier: Barrier, now: TimeMs) -> AlignAction {
        let id = barrier.checkpoint;
        assert!(!self.ended[input], "barrier {id} on input {input} after its end-of-stream");
        assert!(!self.blocked[input], "barrier {id} read from blocked input {input}");
        if let Some(last) = self.last_on_input[input] {
            assert!(id > last, "barrier {id} after {last} on input {input}: barriers reordered on a channel");
        }
        if let Some(last) = self.last_snapshot {
            assert!(id > last, "barrier {id} after this task already snapshotted {last}");
        }
        self.last_on_input[input] = Some(id);
        if barrier.mode == CheckpointMode::ExactlyOnce {
            if let Some(current) = self.aligning() {
                assert_eq!(current, id, "exactly-once: barrier {id} while still aligning {current}");
            }
        }
        let inputs = self.inputs();
        let p = self.pending.entry(id).or_insert_with(|| Pending {
            barrier,
            seen: vec![false; inputs],
            count: 0,
            first_at: now,
        });
        assert_eq!(p.barrier, barrier, "two barriers for {id} differ");
        assert!(!p.seen[input]);
        p.seen[input] = true;
        p.count += 1;
        if barrier.mode == CheckpointMode::ExactlyOnce {
            self.blocked[input] = true;
        }
        self.try_complete(now)
    }

    /// Input `input` delivered end-of-stream: it counts as aligned for every barrier from now on.
    pub fn on_end_of_input(&mut self, input: usize, now: TimeMs) -> AlignAction {
        assert!(!self.ended[input], "end-of-stream twice on input {input}");
        assert!(!self.blocked[input], "end-of-stream read from blocked input {input}");
        self.ended[input] = true;
        // A pending barrier this input already delivered must not count it twice.
        for p in self.pending.values_mut() {
            if p.seen[input] {
                p.seen[input] = false;
                p.count -= 1;
            }
        }
        self.try_complete(now)
    }

    fn try_complete(&mut self, now: TimeMs) -> AlignAction {
        let live = self.live_inputs();
        let Some((&id, p)) = self.pending.iter().next() else {
            return AlignAction::Wait;
        };
        if p.count < live {
            return AlignAction::Wait;
        }
        // Barriers complete in order: a later barrier on an input always comes after the earlier one.
        let p = self.pending.remove(&id).expect("present");
        for b in self.blocked.iter_mut() {
            *b = false;
        }
        // In at-least-once mode a later checkpoint may have been delivered on some inputs already; it
        // stays pending. In exactly-once mode nothing else can be pending.
        if p.barrier.mode == CheckpointMode::ExactlyOnce {
            assert!(self.pending.is_empty(), "exactly-once: other barriers pending beside {id}");
        }
        self.last_snapshot = Some(id);
        AlignAction::Snapshot {
            barrier: p.barrier,
            alignment_ms: now.saturating_sub(p.first_at),
            start_delay_ms: p.first_at.saturating_sub(p.barrier.triggered_at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::barrier::SnapshotKind;
    use crate::ids::Generation;

    fn b(id: u64, mode: CheckpointMode) -> Barrier {
        Barrier {
            checkpoint: CheckpointId(id),
            generation: Generation(1),
            triggered_at: TimeMs(0),
            kind: SnapshotKind::Checkpoint,
            mode,
        }
    }

    #[test]
    fn exactly_once_blocks_until_all_inputs_align() {
        let mut a = Aligner::new(3);
        let eo = CheckpointMode::ExactlyOnce;
        assert_eq!(a.on_barrier(1, b(5, eo), TimeMs(10)), AlignAction::Wait);
        assert!(!a.is_readable(1) && a.is_readable(0) && a.is_readable(2));
        assert_eq!(a.on_barrier(0, b(5, eo), TimeMs(12)), AlignAction::Wait);
        match a.on_barrier(2, b(5, eo), TimeMs(17)) {
            AlignAction::Snapshot { alignment_ms, start_delay_ms, .. } => {
                assert_eq!(alignment_ms, 7);
                assert_eq!(start_delay_ms, 10);
            }
            other => panic!("{other:?}"),
        }
        assert!((0..3).all(|i| a.is_readable(i)));
    }

    #[test]
    fn at_least_once_never_blocks_and_keeps_later_barriers_pending() {
        let mut a = Aligner::new(2);
        let al = CheckpointMode::AtLeastOnce;
        assert_eq!(a.on_barrier(0, b(1, al), TimeMs(0)), AlignAction::Wait);
        assert_eq!(a.on_barrier(0, b(2, al), TimeMs(1)), AlignAction::Wait);
        assert!(a.is_readable(0));
        assert!(
            matches!(a.on_barrier(1, b(1, al), TimeMs(2)), AlignAction::Snapshot { barrier, .. } if barrier.checkpoint == CheckpointId(1))
        );
        assert!(
            matches!(a.on_barrier(1, b(2, al), TimeMs(3)), AlignAction::Snapshot { barrier, .. } if barrier.checkpoint == CheckpointId(2))
        );
    }

    #[test]
    fn ended_input_counts_as_aligned() {
        let mut a = Aligner::new(2);
        let eo = CheckpointMode::ExactlyOnce;
        assert_eq!(a.on_barrier(0, b(3, eo), TimeMs(0)), AlignAction::Wait);
        assert!(matches!(a.on_end_of_input(1, TimeMs(1)), AlignAction::Snapshot { .. }));
        assert!(matches!(a.on_barrier(0, b(4, eo), TimeMs(2)), AlignAction::Snapshot { .. }));
        assert!(!a.all_ended());
        assert_eq!(a.on_end_of_input(0, TimeMs(3)), AlignAction::Wait);
        assert!(a.all_ended());
    }

    #[test]
    #[should_panic(expected = "barriers reordered")]
    fn reordered_barriers_on_one_channel_are_a_broken_invariant() {
        let mut a = Aligner::new(2);
        let al = CheckpointMode::AtLeastOnce;
        a.on_barrier(0, b(2, al), TimeMs(0));
        a.on_barrier(0, b(1, al), TimeMs(0));
    }
}
