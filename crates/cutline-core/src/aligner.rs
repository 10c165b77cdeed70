//! Barrier alignment for one task: which inputs may be read, when the task snapshots, which inputs
//! record channel state for which checkpoint, and when a barrier may overtake queued records.
//!
//! The aligner owns only per-input bookkeeping. It never touches records: an aligned checkpoint blocks
//! an input simply by telling the task not to read it, so the data behind a barrier stays in the bounded
//! channel; an unaligned checkpoint tells the task which inputs' records to persist as channel state. It
//! does not snapshot, forward barriers or talk to the coordinator; it decides when the task must.
//!
//! Rules, for checkpoints pending at this task (barrier seen on some input, not yet on every live one):
//! - snapshots are taken in checkpoint order;
//! - an exactly-once checkpoint not yet snapshotted blocks every input that delivered its barrier;
//! - an aligned (or at-least-once) checkpoint snapshots when its barrier arrived on every live input;
//! - an unaligned checkpoint (or one switched after its alignment timeout) snapshots at its first
//!   barrier, once every older pending checkpoint has snapshotted; from then on every live input that
//!   has not delivered its barrier records channel state for it, until its barrier arrives there;
//! - an aligned-with-timeout checkpoint switches to unaligned once it is older than its timeout
//!   (measured from its trigger, so a barrier stuck behind a backlog switches too: it may then overtake
//!   the records queued in front of it), or once its blocked inputs hold more than its byte limit;
//! - an ended input counts as having delivered every barrier from then on.

use crate::barrier::{Alignment, Barrier, CheckpointMode};
use crate::ids::{CheckpointId, TimeMs};
use std::collections::BTreeMap;

/// What the task must do, in order, after an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AlignAction {
    /// Take the snapshot of `barrier.checkpoint` now and forward `barrier` on every output. If
    /// `channel_state` is set, the snapshot is not complete yet: inputs still record channel state and
    /// [`AlignAction::ChannelStateComplete`] follows.
    Snapshot {
        /// The barrier to forward: the one received, with [`Alignment::Unaligned`] if the checkpoint
        /// snapshots unaligned here (so tasks downstream switch too).
        barrier: Barrier,
        /// Some live input has not delivered the barrier yet: records read from it are channel
        /// state of this checkpoint (see [`Aligner::recording_on`]) until it does.
        channel_state: bool,
        /// The checkpoint started aligned and this task switched it to unaligned.
        switched: bool,
        /// Milliseconds from the first barrier of this checkpoint at this task to the snapshot.
        alignment_ms: u64,
        /// Milliseconds from the trigger at the coordinator ([`Barrier::triggered_at`]) to the first
        /// barrier here.
        start_delay_ms: u64,
    },
    /// Every live input delivered the barrier of this unaligned checkpoint: its channel state is
    /// complete and the snapshot can be persisted.
    ChannelStateComplete {
        /// The checkpoint whose channel state is complete.
        checkpoint: CheckpointId,
    },
}

#[derive(Debug)]
struct Pending {
    barrier: Barrier,
    seen: Vec<bool>,
    count: usize,
    first_at: TimeMs,
    snapshotted: bool,
    /// Switched from aligned to unaligned (timeout, byte limit, or an upstream that switched).
    switched: bool,
}

impl Pending {
    /// Snapshots at its first barrier rather than its last.
    fn unaligned(&self) -> bool {
        self.barrier.mode == CheckpointMode::ExactlyOnce
            && (self.switched || self.barrier.alignment == Alignment::Unaligned)
    }
}

/// Has `barrier`'s checkpoint been running longer than its alignment timeout at `now`?
fn timed_out(barrier: &Barrier, now: TimeMs) -> bool {
    match barrier.alignment {
        Alignment::AlignedWithTimeout { timeout_ms, .. } => now.saturating_sub(barrier.triggered_at) >= timeout_ms,
        _ => false,
    }
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
    /// Pending checkpoints that snapshotted and still record channel state.
    recording: usize,
}

impl Aligner {
    /// An aligner for a task with `inputs` input channels, all readable, nothing pending.
    ///
    /// # Panics
    /// If `inputs` is 0: a source has no inputs to align.
    pub fn new(inputs: usize) -> Aligner {
        assert!(inputs >= 1, "a task without inputs (a source) has no aligner");
        Aligner {
            blocked: vec![false; inputs],
            ended: vec![false; inputs],
            last_on_input: vec![None; inputs],
            pending: BTreeMap::new(),
            last_snapshot: None,
            recording: 0,
        }
    }

    /// The number of input channels (ended ones included).
    pub fn inputs(&self) -> usize {
        self.blocked.len()
    }

    /// May the task read this input now?
    pub fn is_readable(&self, input: usize) -> bool {
        !self.blocked[input] && !self.ended[input]
    }

    /// Is this input blocked because it delivered the barrier of an exactly-once checkpoint that has
    /// not snapshotted yet? (An ended input is not blocked, but not readable either.)
    pub fn is_blocked(&self, input: usize) -> bool {
        self.blocked[input]
    }

    /// Every input has delivered end-of-stream.
    pub fn all_ended(&self) -> bool {
        self.ended.iter().all(|e| *e)
    }

    /// The oldest checkpoint pending at this task, if any.
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.pending.keys().next().copied()
    }

    /// Does any checkpoint record channel state right now? (Cheap; checked per batch.)
    pub fn any_recording(&self) -> bool {
        self.recording > 0
    }

    /// The checkpoints for which records read from `input` now are channel state.
    pub fn recording_on(&self, input: usize, out: &mut Vec<CheckpointId>) {
        out.clear();
        if self.recording == 0 || self.ended[input] {
            return;
        }
        out.extend(self.pending.iter().filter(|(_, p)| p.snapshotted && !p.seen[input]).map(|(id, _)| *id));
    }

    /// May `barrier`, found queued on readable `input` behind records at `now`, be taken ahead of
    /// them? Only an exactly-once barrier that is unaligned (from the start, switched here, or past its
    /// alignment timeout) and whose older pending checkpoints have all snapshotted, so snapshots stay
    /// in order and it can snapshot at once.
    pub fn may_overtake(&self, input: usize, barrier: &Barrier, now: TimeMs) -> bool {
        if !self.is_readable(input) || barrier.mode != CheckpointMode::ExactlyOnce {
            return false;
        }
        let id = barrier.checkpoint;
        let switched = self.pending.get(&id).is_some_and(|p| p.switched);
        (barrier.alignment == Alignment::Unaligned || switched || timed_out(barrier, now))
            && self.pending.range(..id).all(|(_, p)| p.snapshotted)
    }

    /// The oldest pending checkpoint that is aligning with a timeout and has not switched: its id, its
    /// age at `now` (since its trigger), and its limits. The task measures its blocked bytes only then.
    pub fn timeout_candidate(&self, now: TimeMs) -> Option<(CheckpointId, u64, u64, u64)> {
        let (id, p) = self.pending.iter().find(|(_, p)| !p.snapshotted)?;
        if p.barrier.mode != CheckpointMode::ExactlyOnce || p.switched {
            return None;
        }
        match p.barrier.alignment {
            Alignment::AlignedWithTimeout { timeout_ms, max_blocked_bytes } => {
                Some((*id, now.saturating_sub(p.barrier.triggered_at), timeout_ms, max_blocked_bytes))
            }
            _ => None,
        }
    }

    /// Switch `checkpoint` (see [`Aligner::timeout_candidate`]) to unaligned: its blocked inputs are
    /// released and it snapshots now.
    pub fn switch_to_unaligned(&mut self, checkpoint: CheckpointId, now: TimeMs, out: &mut Vec<AlignAction>) {
        let p = self.pending.get_mut(&checkpoint).expect("switch of a pending checkpoint");
        assert!(!p.snapshotted && !p.switched, "{checkpoint} switched twice");
        p.switched = true;
        self.progress(now, out);
    }

    /// Input `input` delivered `barrier` at time `now`. The actions it leads to are appended to `out`.
    ///
    /// # Panics
    /// If the caller broke the channel contract: a barrier read from a blocked or ended input, a
    /// barrier not above the last one on the same input, a new barrier not above the last snapshot,
    /// or two barriers of one checkpoint that differ in more than their alignment.
    pub fn on_barrier(&mut self, input: usize, barrier: Barrier, now: TimeMs, out: &mut Vec<AlignAction>) {
        let id = barrier.checkpoint;
        assert!(!self.ended[input], "barrier {id} on input {input} after its end-of-stream");
        assert!(!self.blocked[input], "barrier {id} read from blocked input {input}");
        if let Some(last) = self.last_on_input[input] {
            assert!(id > last, "barrier {id} after {last} on input {input}: barriers reordered on a channel");
        }
        if let Some(last) = self.last_snapshot {
            if !self.pending.contains_key(&id) {
                assert!(id > last, "barrier {id} after this task already snapshotted {last}");
            }
        }
        self.last_on_input[input] = Some(id);
        let inputs = self.inputs();
        let p = self.pending.entry(id).or_insert_with(|| Pending {
            barrier,
            seen: vec![false; inputs],
            count: 0,
            first_at: now,
            snapshotted: false,
            switched: false,
        });
        assert!(p.barrier.same_checkpoint(&barrier), "two barriers for {id} differ: {:?} and {barrier:?}", p.barrier);
        assert!(!p.seen[input]);
        // An upstream task that switched forwards the barrier unaligned: switch here too. So does a
        // barrier that arrives after its alignment timeout.
        if (barrier.is_unaligned() || timed_out(&barrier, now)) && !p.unaligned() {
            assert!(!p.snapshotted);
            p.switched = true;
        }
        p.seen[input] = true;
        p.count += 1;
        self.progress(now, out);
    }

    /// Input `input` delivered end-of-stream: it counts as aligned for every barrier from now on. The
    /// actions it leads to are appended to `out`.
    ///
    /// # Panics
    /// On a second end-of-stream on the same input, or one read from a blocked input.
    pub fn on_end_of_input(&mut self, input: usize, now: TimeMs, out: &mut Vec<AlignAction>) {
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
        self.progress(now, out);
    }

    fn live_inputs(&self) -> usize {
        self.ended.iter().filter(|e| !**e).count()
    }

    /// Snapshot and complete whatever the rules allow, oldest first; then recompute the blocked inputs.
    fn progress(&mut self, now: TimeMs, out: &mut Vec<AlignAction>) {
        let live = self.live_inputs();
        let ids: Vec<CheckpointId> = self.pending.keys().copied().collect();
        let mut older_all_snapshotted = true;
        for id in ids {
            let p = self.pending.get_mut(&id).expect("pending");
            if !p.snapshotted {
                if !older_all_snapshotted {
                    break;
                }
                let all_in = p.count >= live;
                if all_in || (p.unaligned() && p.count >= 1) {
                    p.snapshotted = true;
                    let channel_state = !all_in;
                    let mut forward = p.barrier;
                    if p.unaligned() {
                        forward.alignment = Alignment::Unaligned;
                    }
                    if let Some(last) = self.last_snapshot {
                        assert!(id > last, "snapshot {id} after {last}: out of order");
                    }
                    self.last_snapshot = Some(id);
                    out.push(AlignAction::Snapshot {
                        barrier: forward,
                        channel_state,
                        switched: p.switched,
                        alignment_ms: now.saturating_sub(p.first_at),
                        start_delay_ms: p.first_at.saturating_sub(p.barrier.triggered_at),
                    });
                    if all_in {
                        self.pending.remove(&id);
                        continue;
                    }
                    self.recording += 1;
                } else {
                    older_all_snapshotted = false;
                    continue;
                }
            }
            // Snapshotted, recording channel state.
            let p = &self.pending[&id];
            if p.count >= live {
                self.pending.remove(&id);
                self.recording -= 1;
                out.push(AlignAction::ChannelStateComplete { checkpoint: id });
            }
        }
        for b in self.blocked.iter_mut() {
            *b = false;
        }
        for p in self.pending.values() {
            if !p.snapshotted && p.barrier.mode == CheckpointMode::ExactlyOnce {
                for (i, s) in p.seen.iter().enumerate() {
                    if *s {
                        self.blocked[i] = true;
                    }
                }
            }
        }
        debug_assert_eq!(self.recording, self.pending.values().filter(|p| p.snapshotted).count());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::barrier::SnapshotKind;
    use crate::ids::Generation;

    fn b(id: u64, mode: CheckpointMode, alignment: Alignment) -> Barrier {
        Barrier {
            checkpoint: CheckpointId(id),
            generation: Generation(1),
            triggered_at: TimeMs(0),
            kind: SnapshotKind::Checkpoint,
            mode,
            alignment,
        }
    }
    const EO: CheckpointMode = CheckpointMode::ExactlyOnce;
    const ALO: CheckpointMode = CheckpointMode::AtLeastOnce;
    const AL: Alignment = Alignment::Aligned;
    const UN: Alignment = Alignment::Unaligned;

    fn on(a: &mut Aligner, input: usize, b: Barrier, t: u64) -> Vec<AlignAction> {
        let mut out = Vec::new();
        a.on_barrier(input, b, TimeMs(t), &mut out);
        out
    }
    fn ids(actions: &[AlignAction]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                AlignAction::Snapshot { barrier, channel_state, .. } => {
                    format!("snap {}{}", barrier.checkpoint.0, if *channel_state { " +channels" } else { "" })
                }
                AlignAction::ChannelStateComplete { checkpoint } => format!("channels {} done", checkpoint.0),
            })
            .collect()
    }

    #[test]
    fn exactly_once_blocks_until_all_inputs_align() {
        let mut a = Aligner::new(3);
        assert!(on(&mut a, 1, b(5, EO, AL), 10).is_empty());
        assert!(!a.is_readable(1) && a.is_readable(0) && a.is_readable(2));
        assert!(on(&mut a, 0, b(5, EO, AL), 12).is_empty());
        match &on(&mut a, 2, b(5, EO, AL), 17)[..] {
            [AlignAction::Snapshot { alignment_ms, start_delay_ms, channel_state: false, .. }] => {
                assert_eq!(*alignment_ms, 7);
                assert_eq!(*start_delay_ms, 10);
            }
            other => panic!("{other:?}"),
        }
        assert!((0..3).all(|i| a.is_readable(i)));
    }

    #[test]
    fn at_least_once_never_blocks_and_keeps_later_barriers_pending() {
        let mut a = Aligner::new(2);
        assert!(on(&mut a, 0, b(1, ALO, AL), 0).is_empty());
        assert!(on(&mut a, 0, b(2, ALO, AL), 1).is_empty());
        assert!(a.is_readable(0));
        assert_eq!(ids(&on(&mut a, 1, b(1, ALO, AL), 2)), ["snap 1"]);
        assert_eq!(ids(&on(&mut a, 1, b(2, ALO, AL), 3)), ["snap 2"]);
    }

    #[test]
    fn ended_input_counts_as_aligned() {
        let mut a = Aligner::new(2);
        let mut out = Vec::new();
        assert!(on(&mut a, 0, b(3, EO, AL), 0).is_empty());
        a.on_end_of_input(1, TimeMs(1), &mut out);
        assert_eq!(ids(&out), ["snap 3"]);
        assert_eq!(ids(&on(&mut a, 0, b(4, EO, AL), 2)), ["snap 4"]);
        assert!(!a.all_ended());
        out.clear();
        a.on_end_of_input(0, TimeMs(3), &mut out);
        assert!(out.is_empty() && a.all_ended());
    }

    #[test]
    fn unaligned_snapshots_at_the_first_barrier_and_records_the_other_inputs() {
        let mut a = Aligner::new(3);
        let mut rec = Vec::new();
        assert!(a.may_overtake(1, &b(7, EO, UN), TimeMs(5)));
        assert!(!a.may_overtake(1, &b(7, EO, AL), TimeMs(5)));
        assert_eq!(ids(&on(&mut a, 1, b(7, EO, UN), 5)), ["snap 7 +channels"]);
        assert!((0..3).all(|i| a.is_readable(i)), "unaligned never blocks");
        a.recording_on(0, &mut rec);
        assert_eq!(rec, [CheckpointId(7)]);
        a.recording_on(1, &mut rec);
        assert!(rec.is_empty(), "the input that delivered the barrier records nothing");
        assert!(on(&mut a, 2, b(7, EO, UN), 6).is_empty());
        assert_eq!(ids(&on(&mut a, 0, b(7, EO, UN), 9)), ["channels 7 done"]);
        assert!(!a.any_recording());
    }

    #[test]
    fn a_single_input_unaligned_checkpoint_snapshots_and_completes_at_once() {
        let mut a = Aligner::new(1);
        assert_eq!(ids(&on(&mut a, 0, b(2, EO, UN), 0)), ["snap 2"]);
        assert!(!a.any_recording());
    }

    #[test]
    fn pipelined_unaligned_checkpoints_record_separately() {
        let mut a = Aligner::new(2);
        let mut rec = Vec::new();
        assert_eq!(ids(&on(&mut a, 0, b(1, EO, UN), 0)), ["snap 1 +channels"]);
        assert_eq!(ids(&on(&mut a, 0, b(2, EO, UN), 1)), ["snap 2 +channels"]);
        a.recording_on(1, &mut rec);
        assert_eq!(rec, [CheckpointId(1), CheckpointId(2)]);
        assert_eq!(ids(&on(&mut a, 1, b(1, EO, UN), 2)), ["channels 1 done"]);
        assert_eq!(ids(&on(&mut a, 1, b(2, EO, UN), 3)), ["channels 2 done"]);
    }

    #[test]
    fn alignment_timeout_switches_and_releases_blocked_inputs() {
        let mut a = Aligner::new(2);
        let t = Alignment::AlignedWithTimeout { timeout_ms: 150, max_blocked_bytes: u64::MAX };
        assert!(on(&mut a, 0, b(4, EO, t), 100).is_empty());
        assert!(!a.is_readable(0));
        assert!(!a.may_overtake(1, &b(4, EO, t), TimeMs(120)), "not before the timeout");
        let (id, age_ms, timeout_ms, _) = a.timeout_candidate(TimeMs(160)).expect("candidate");
        assert_eq!((id, age_ms, timeout_ms), (CheckpointId(4), 160, 150), "the age counts from the trigger");
        let mut out = Vec::new();
        a.switch_to_unaligned(id, TimeMs(160), &mut out);
        match &out[..] {
            [AlignAction::Snapshot { barrier, channel_state: true, switched: true, alignment_ms: 60, .. }] => {
                assert_eq!(barrier.alignment, Alignment::Unaligned, "forwarded unaligned");
            }
            other => panic!("{other:?}"),
        }
        assert!(a.is_readable(0) && a.may_overtake(1, &b(4, EO, t), TimeMs(160)));
        assert_eq!(ids(&on(&mut a, 1, b(4, EO, t), 170)), ["channels 4 done"]);
    }

    #[test]
    fn a_barrier_stuck_behind_a_backlog_past_its_timeout_overtakes_it_and_snapshots_unaligned() {
        let mut a = Aligner::new(1);
        let t = Alignment::AlignedWithTimeout { timeout_ms: 200, max_blocked_bytes: u64::MAX };
        assert!(!a.may_overtake(0, &b(3, EO, t), TimeMs(199)));
        assert!(a.may_overtake(0, &b(3, EO, t), TimeMs(200)));
        match &on(&mut a, 0, b(3, EO, t), 200)[..] {
            [AlignAction::Snapshot { barrier, switched: true, .. }] => assert_eq!(barrier.alignment, UN),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_upstream_switch_switches_this_task() {
        let mut a = Aligner::new(2);
        let t = Alignment::AlignedWithTimeout { timeout_ms: 50, max_blocked_bytes: 10 };
        assert!(on(&mut a, 0, b(4, EO, t), 0).is_empty());
        assert_eq!(ids(&on(&mut a, 1, b(4, EO, UN), 1)), ["snap 4"]);
    }

    #[test]
    fn an_unaligned_barrier_waits_behind_an_older_at_least_once_checkpoint_and_blocks() {
        let mut a = Aligner::new(2);
        assert!(on(&mut a, 0, b(1, ALO, AL), 0).is_empty());
        assert!(!a.may_overtake(0, &b(2, EO, UN), TimeMs(1)), "older checkpoint 1 has not snapshotted");
        assert!(on(&mut a, 0, b(2, EO, UN), 1).is_empty());
        assert!(!a.is_readable(0), "records after barrier 2 must wait for its snapshot");
        assert_eq!(ids(&on(&mut a, 1, b(1, ALO, AL), 2)), ["snap 1", "snap 2 +channels"]);
        assert!(a.is_readable(0));
    }

    #[test]
    #[should_panic(expected = "barriers reordered")]
    fn reordered_barriers_on_one_channel_are_a_broken_invariant() {
        let mut a = Aligner::new(2);
        on(&mut a, 0, b(2, ALO, AL), 0);
        on(&mut a, 0, b(1, ALO, AL), 0);
    }
}
