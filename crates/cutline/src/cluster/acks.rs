//! Per-worker aggregation of what a worker's tasks tell the coordinator: [`AckAggregator`] turns the
//! events of the local tasks and snapshot writers into [`TaskEvent`]s, so that the coordinator handles
//! one acknowledgement message per worker and checkpoint instead of one per task.
//!
//! It owns only the holding and ordering of those messages. It does not send anything (messages are
//! appended to a `Vec` the caller ships), read clocks (local time is an argument), decide anything
//! about checkpoints (the coordinator does, from the events [`TaskEvent::into_events`] gives back), or
//! know about aborts: a group that cannot complete is flushed by the hold limit.
//!
//! Rules:
//!
//! - Acks of checkpoint `c` are held until every local task that has not finished (`TaskFinished`) has
//!   answered `c`, then sent as one [`TaskEvent::Acked`] with the acks sorted by task id. A decline
//!   counts as an answer (a task that declined will not ack), so the rest of the group is not held
//!   for nothing.
//! - Every other event (`Declined`, `TaskFailed`, `SourceFinished`, `TaskFinished`) first flushes every
//!   held ack, oldest checkpoint first, and is then sent. The coordinator thus sees events in the
//!   order the tasks produced them: acks are only delayed, never reordered past another event.
//! - Held acks always leave in checkpoint order: whenever the acks of `c` are sent (complete group,
//!   hold limit), the held acks of every older checkpoint are sent first, as partial groups.
//! - Acks held for `max_hold_ms` or more (counted from the first held ack of their checkpoint) are
//!   sent by [`AckAggregator::on_tick`], even if the group is partial: a slow or blocked task must not
//!   hide from the coordinator's timeout which tasks did ack. Later acks of that checkpoint are
//!   grouped again.
//! - After a task finished it is no longer waited for. An ack of a finished task is still passed on
//!   (grouped like any other).
//! - Several checkpoints may be in flight: one group per checkpoint. At most
//!   [`MAX_TRACKED_CHECKPOINTS`] groups are remembered (answered groups stay, to catch a second ack);
//!   beyond that the oldest is forgotten, its held acks sent first.
//! - Events of another generation than the aggregator's are stale and dropped.
//!
//! Broken invariants panic: an ack from a task that does not run here, a second ack from one task for
//! one checkpoint, an event that only the coordinator's own side produces (ticks, manifest and lease
//! outcomes, savepoint requests).

use crate::runtime::AckReport;
use cutline_core::coordinator::Event;
use cutline_core::{CheckpointId, Generation, TaskId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// How long a worker holds acks of a partial group at most, by default.
pub(crate) const DEFAULT_MAX_ACK_HOLD_MS: u64 = 20;

/// Checkpoint groups an aggregator remembers at once (far above any sensible number of checkpoints in
/// flight); the oldest is forgotten beyond that.
pub(crate) const MAX_TRACKED_CHECKPOINTS: usize = 64;

/// What a worker tells the coordinator about its tasks (serde; the cluster protocol carries it with
/// postcard).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum TaskEvent {
    /// Acks of several local tasks for one checkpoint, sorted by task id.
    Acked {
        generation: Generation,
        checkpoint: CheckpointId,
        acks: Vec<(TaskId, AckReport)>,
    },
    Declined {
        generation: Generation,
        checkpoint: CheckpointId,
        task: TaskId,
        reason: String,
    },
    Failed {
        generation: Generation,
        task: TaskId,
        reason: String,
        permanent: bool,
    },
    SourceFinished {
        generation: Generation,
        task: TaskId,
    },
    TaskFinished {
        generation: Generation,
        task: TaskId,
    },
}

impl TaskEvent {
    /// Into the coordinator's events (one `Event::Acked` per ack, in order), appended to `out`.
    pub(crate) fn into_events(self, out: &mut Vec<Event<AckReport>>) {
        match self {
            TaskEvent::Acked { generation, checkpoint, acks } => {
                out.extend(acks.into_iter().map(|(task, report)| Event::Acked { generation, checkpoint, task, report }))
            }
            TaskEvent::Declined { generation, checkpoint, task, reason } => {
                out.push(Event::Declined { generation, checkpoint, task, reason })
            }
            TaskEvent::Failed { generation, task, reason, permanent } => {
                out.push(Event::TaskFailed { generation, task, reason, permanent })
            }
            TaskEvent::SourceFinished { generation, task } => out.push(Event::SourceFinished { generation, task }),
            TaskEvent::TaskFinished { generation, task } => out.push(Event::TaskFinished { generation, task }),
        }
    }
}

/// What the aggregator knows about one checkpoint.
#[derive(Debug, Default)]
struct Group {
    /// Local tasks that acked it (sent or held).
    acked: BTreeSet<TaskId>,
    /// Local tasks that acked or declined it.
    answered: BTreeSet<TaskId>,
    /// How many of `answered` are still waited for (have not finished).
    answered_waiting: usize,
    /// Acks not sent yet.
    held: BTreeMap<TaskId, AckReport>,
    /// Local time of the first ack in `held` (meaningless while it is empty).
    held_since: u64,
}

/// Holds the acks of a worker's tasks until a checkpoint's group is whole; see the module docs.
#[derive(Debug)]
pub(crate) struct AckAggregator {
    generation: Generation,
    local: BTreeSet<TaskId>,
    /// Local tasks that have not finished: a group is whole once each of them answered.
    waiting: BTreeSet<TaskId>,
    max_hold_ms: u64,
    groups: BTreeMap<CheckpointId, Group>,
}

impl AckAggregator {
    /// `local_tasks`: the tasks this worker runs in `generation`.
    pub(crate) fn new(generation: Generation, local_tasks: Vec<TaskId>, max_hold_ms: u64) -> Self {
        let local: BTreeSet<TaskId> = local_tasks.iter().copied().collect();
        assert_eq!(local.len(), local_tasks.len(), "a task listed twice among a worker's tasks: {local_tasks:?}");
        AckAggregator { generation, waiting: local.clone(), local, max_hold_ms, groups: BTreeMap::new() }
    }

    /// One event from a local task or snapshot writer, at local time `now_ms`; messages ready to send
    /// are appended to `out`, in order.
    pub(crate) fn on_event(&mut self, now_ms: u64, ev: Event<AckReport>, out: &mut Vec<TaskEvent>) {
        let _changed: Option<CheckpointId> = match ev {
            Event::Acked { generation, checkpoint, task, report } => {
                if generation != self.generation {
                    return;
                }
                assert!(
                    self.local.contains(&task),
                    "ack of {checkpoint} from {task}, which does not run on this worker ({generation})"
                );
                let waited = self.waiting.contains(&task);
                let g = self.groups.entry(checkpoint).or_default();
                assert!(g.acked.insert(task), "{task} acked {checkpoint} twice");
                if g.answered.insert(task) && waited {
                    g.answered_waiting += 1;
                }
                if g.held.is_empty() {
                    g.held_since = now_ms;
                }
                g.held.insert(task, report);
                if g.answered_waiting == self.waiting.len() {
                    self.flush_through(checkpoint, out);
                }
                self.forget_oldest(out);
                // Only this group changed (and older ones lost their held acks): check it alone, so
                // that a worker with many tasks does not pay for every group on every ack.
                Some(checkpoint)
            }
            Event::Declined { generation, checkpoint, task, reason } => {
                if generation != self.generation {
                    return;
                }
                self.flush_all(out);
                if self.local.contains(&task) {
                    let waited = self.waiting.contains(&task);
                    let g = self.groups.entry(checkpoint).or_default();
                    if g.answered.insert(task) && waited {
                        g.answered_waiting += 1;
                    }
                    self.forget_oldest(out);
                }
                out.push(TaskEvent::Declined { generation, checkpoint, task, reason });
                None
            }
            Event::TaskFailed { generation, task, reason, permanent } => {
                if generation != self.generation {
                    return;
                }
                self.flush_all(out);
                out.push(TaskEvent::Failed { generation, task, reason, permanent });
                None
            }
            Event::SourceFinished { generation, task } => {
                if generation != self.generation {
                    return;
                }
                self.flush_all(out);
                out.push(TaskEvent::SourceFinished { generation, task });
                None
            }
            Event::TaskFinished { generation, task } => {
                if generation != self.generation {
                    return;
                }
                assert!(
                    self.local.contains(&task),
                    "{task} finished, but it does not run on this worker ({generation})"
                );
                self.flush_all(out);
                out.push(TaskEvent::TaskFinished { generation, task });
                if self.waiting.remove(&task) {
                    for g in self.groups.values_mut() {
                        if g.answered.contains(&task) {
                            g.answered_waiting -= 1;
                        }
                    }
                }
                None
            }
            other => panic!("a worker's tasks do not produce {other:?}; only the coordinator's side does"),
        };
        #[cfg(any(test, debug_assertions))]
        self.check(_changed);
    }

    /// Time passed: acks held for `max_hold_ms` or more are sent (with every older held ack before
    /// them, to keep checkpoint order).
    pub(crate) fn on_tick(&mut self, now_ms: u64, out: &mut Vec<TaskEvent>) {
        let due = self
            .groups
            .iter()
            .rev()
            .find(|(_, g)| !g.held.is_empty() && now_ms.saturating_sub(g.held_since) >= self.max_hold_ms)
            .map(|(c, _)| *c);
        if let Some(c) = due {
            self.flush_through(c, out);
            #[cfg(any(test, debug_assertions))]
            self.check(None);
        }
    }

    /// When [`AckAggregator::on_tick`] would next send something, if nothing else happens first.
    #[allow(dead_code)] // for the worker loop's sleep; ticking periodically is enough too
    pub(crate) fn next_flush_at(&self) -> Option<u64> {
        self.groups.values().filter(|g| !g.held.is_empty()).map(|g| g.held_since.saturating_add(self.max_hold_ms)).min()
    }

    /// Send the held acks of every checkpoint up to and including `c`, oldest first.
    fn flush_through(&mut self, c: CheckpointId, out: &mut Vec<TaskEvent>) {
        for (checkpoint, g) in self.groups.range_mut(..=c) {
            if !g.held.is_empty() {
                let acks: Vec<(TaskId, AckReport)> = std::mem::take(&mut g.held).into_iter().collect();
                out.push(TaskEvent::Acked { generation: self.generation, checkpoint: *checkpoint, acks });
            }
        }
    }

    fn flush_all(&mut self, out: &mut Vec<TaskEvent>) {
        if let Some((&last, _)) = self.groups.last_key_value() {
            self.flush_through(last, out);
        }
    }

    /// Keep at most [`MAX_TRACKED_CHECKPOINTS`] groups: forget the oldest, sending what it holds (it
    /// is the oldest, so checkpoint order holds).
    fn forget_oldest(&mut self, out: &mut Vec<TaskEvent>) {
        while self.groups.len() > MAX_TRACKED_CHECKPOINTS {
            let (checkpoint, g) = self.groups.pop_first().expect("more groups than the limit");
            if !g.held.is_empty() {
                out.push(TaskEvent::Acked {
                    generation: self.generation,
                    checkpoint,
                    acks: g.held.into_iter().collect(),
                });
            }
        }
    }

    /// The aggregator's invariants (tests and debug builds), for the group of `only` or for all.
    #[cfg(any(test, debug_assertions))]
    fn check(&self, only: Option<CheckpointId>) {
        assert!(self.groups.len() <= MAX_TRACKED_CHECKPOINTS);
        if only.is_none() {
            assert!(self.waiting.is_subset(&self.local));
        }
        for (c, g) in self.groups.iter().filter(|(c, _)| only.is_none_or(|o| **c == o)) {
            assert!(g.acked.is_subset(&g.answered), "{c}: an ack that is not an answer");
            assert!(g.answered.is_subset(&self.local), "{c}: an answer from a task not on this worker");
            assert!(g.held.keys().all(|t| g.acked.contains(t)), "{c}: holding an ack never received");
            assert_eq!(g.answered_waiting, g.answered.intersection(&self.waiting).count(), "{c}: answer count");
            assert!(
                g.held.is_empty() || g.answered_waiting < self.waiting.len(),
                "{c}: every waited-for task answered, yet acks are held"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::SnapshotTimings;
    use cutline_core::{OperatorId, SubtaskIndex};
    use cutline_storage::TaskStateHandle;

    const G: Generation = Generation(3);

    fn report(task: u32, c: u64) -> AckReport {
        AckReport {
            handle: TaskStateHandle {
                operator: OperatorId::new("op"),
                subtask: SubtaskIndex(task),
                parallelism: 8,
                key_groups: None,
                file: format!("checkpoints/chk-{c:020}/op-{task}.state"),
                size_bytes: 100 + task as u64,
                crc32: task * 7 + c as u32,
                base: Vec::new(),
            },
            timings: SnapshotTimings::default(),
            persist_ms: 1,
            persist_us: 1000,
            encode_us: 2,
            write_us: 3,
            received_at_us: 0,
        }
    }

    fn ack(task: u32, c: u64) -> Event<AckReport> {
        Event::Acked { generation: G, checkpoint: CheckpointId(c), task: TaskId(task), report: report(task, c) }
    }

    fn decline(task: u32, c: u64) -> Event<AckReport> {
        Event::Declined { generation: G, checkpoint: CheckpointId(c), task: TaskId(task), reason: "disk full".into() }
    }

    fn finished(task: u32) -> Event<AckReport> {
        Event::TaskFinished { generation: G, task: TaskId(task) }
    }

    fn agg(tasks: &[u32], max_hold_ms: u64) -> AckAggregator {
        AckAggregator::new(G, tasks.iter().map(|t| TaskId(*t)).collect(), max_hold_ms)
    }

    /// A message, readably: `"ack c1 [0, 1]"`, `"decline c1 by 2"`, ...; also checks that each ack's
    /// report is the one its task produced for that checkpoint.
    fn show(m: &TaskEvent) -> String {
        match m {
            TaskEvent::Acked { generation, checkpoint, acks } => {
                assert_eq!(*generation, G);
                for (t, r) in acks {
                    assert_eq!(r.handle, report(t.0, checkpoint.0).handle, "the report of {t} for {checkpoint}");
                }
                let ts: Vec<u32> = acks.iter().map(|(t, _)| t.0).collect();
                format!("ack c{} {ts:?}", checkpoint.0)
            }
            TaskEvent::Declined { checkpoint, task, .. } => format!("decline c{} by {}", checkpoint.0, task.0),
            TaskEvent::Failed { task, .. } => format!("failed {}", task.0),
            TaskEvent::SourceFinished { task, .. } => format!("source finished {}", task.0),
            TaskEvent::TaskFinished { task, .. } => format!("finished {}", task.0),
        }
    }

    /// Feed `ev` at `now`; what went out, readably.
    fn feed(a: &mut AckAggregator, now: u64, ev: Event<AckReport>) -> Vec<String> {
        let mut out = Vec::new();
        a.on_event(now, ev, &mut out);
        out.iter().map(show).collect()
    }

    fn tick(a: &mut AckAggregator, now: u64) -> Vec<String> {
        let mut out = Vec::new();
        a.on_tick(now, &mut out);
        out.iter().map(show).collect()
    }

    const NONE: [&str; 0] = [];

    #[test]
    fn three_local_acks_become_one_message_after_the_third() {
        let mut a = agg(&[4, 7, 9], 20);
        assert_eq!(feed(&mut a, 0, ack(9, 1)), NONE);
        assert_eq!(feed(&mut a, 1, ack(4, 1)), NONE);
        assert_eq!(tick(&mut a, 2), NONE);
        // Sorted by task id, not arrival.
        assert_eq!(feed(&mut a, 3, ack(7, 1)), ["ack c1 [4, 7, 9]"]);
        assert_eq!(tick(&mut a, 1_000), NONE, "nothing left to send");
        assert_eq!(a.next_flush_at(), None);
    }

    #[test]
    fn a_decline_flushes_the_held_acks_first_then_goes_out() {
        let mut a = agg(&[0, 1, 2], 20);
        assert_eq!(feed(&mut a, 0, ack(0, 1)), NONE);
        assert_eq!(feed(&mut a, 0, ack(1, 1)), NONE);
        assert_eq!(feed(&mut a, 1, decline(2, 1)), ["ack c1 [0, 1]", "decline c1 by 2"]);
        assert_eq!(tick(&mut a, 1_000), NONE);
    }

    #[test]
    fn a_decline_counts_as_an_answer_so_later_acks_are_not_held_for_it() {
        let mut a = agg(&[0, 1, 2], 20);
        assert_eq!(feed(&mut a, 0, decline(2, 1)), ["decline c1 by 2"]);
        assert_eq!(feed(&mut a, 1, ack(0, 1)), NONE);
        assert_eq!(feed(&mut a, 2, ack(1, 1)), ["ack c1 [0, 1]"]);
    }

    #[test]
    fn other_events_flush_every_held_ack_oldest_checkpoint_first() {
        let mut a = agg(&[0, 1, 2], 20);
        assert_eq!(feed(&mut a, 0, ack(0, 2)), NONE);
        assert_eq!(feed(&mut a, 0, ack(1, 1)), NONE);
        assert_eq!(
            feed(&mut a, 1, Event::SourceFinished { generation: G, task: TaskId(0) }),
            ["ack c1 [1]", "ack c2 [0]", "source finished 0"]
        );
        assert_eq!(feed(&mut a, 2, ack(2, 1)), NONE);
        assert_eq!(
            feed(
                &mut a,
                3,
                Event::TaskFailed { generation: G, task: TaskId(1), reason: "boom".into(), permanent: false }
            ),
            ["ack c1 [2]", "failed 1"]
        );
    }

    #[test]
    fn a_finished_task_is_no_longer_waited_for() {
        let mut a = agg(&[0, 1, 2], 20);
        assert_eq!(feed(&mut a, 0, ack(0, 5)), NONE);
        assert_eq!(feed(&mut a, 0, ack(1, 5)), NONE);
        assert_eq!(feed(&mut a, 0, ack(2, 5)), ["ack c5 [0, 1, 2]"]);
        assert_eq!(feed(&mut a, 1, finished(2)), ["finished 2"]);
        assert_eq!(feed(&mut a, 2, ack(0, 6)), NONE);
        assert_eq!(feed(&mut a, 3, ack(1, 6)), ["ack c6 [0, 1]"], "2 finished: not waited for");
        // A group that waited only for the finished task is whole once it finished.
        assert_eq!(feed(&mut a, 4, ack(0, 7)), NONE);
        assert_eq!(feed(&mut a, 5, finished(1)), ["ack c7 [0]", "finished 1"]);
        assert_eq!(feed(&mut a, 6, ack(0, 8)), ["ack c8 [0]"], "only 0 is left: nothing to wait for");
    }

    #[test]
    fn two_checkpoints_in_flight_flush_in_checkpoint_order() {
        let mut a = agg(&[0, 1], 20);
        assert_eq!(feed(&mut a, 0, ack(0, 1)), NONE);
        assert_eq!(feed(&mut a, 0, ack(0, 2)), NONE);
        assert_eq!(feed(&mut a, 1, ack(1, 1)), ["ack c1 [0, 1]"]);
        assert_eq!(feed(&mut a, 2, ack(1, 2)), ["ack c2 [0, 1]"]);
        // The newer group completes first (several snapshot writers): the older partial one goes first.
        assert_eq!(feed(&mut a, 3, ack(1, 3)), NONE);
        assert_eq!(feed(&mut a, 3, ack(0, 4)), NONE);
        assert_eq!(feed(&mut a, 4, ack(1, 4)), ["ack c3 [1]", "ack c4 [0, 1]"]);
        assert_eq!(feed(&mut a, 5, ack(0, 3)), ["ack c3 [0]"], "the rest of c3 is whole at once");
    }

    #[test]
    fn max_hold_flushes_partial_groups_on_tick() {
        let mut a = agg(&[0, 1, 2], 20);
        assert_eq!(feed(&mut a, 100, ack(0, 1)), NONE);
        assert_eq!(feed(&mut a, 110, ack(1, 1)), NONE);
        assert_eq!(feed(&mut a, 115, ack(0, 2)), NONE);
        assert_eq!(a.next_flush_at(), Some(120), "20 ms after the first held ack of c1");
        assert_eq!(tick(&mut a, 119), NONE);
        // c1 is due (held since 100); c2 (since 115) is not.
        assert_eq!(tick(&mut a, 120), ["ack c1 [0, 1]"]);
        assert_eq!(tick(&mut a, 134), NONE);
        // Task 2 is slow: its ack goes alone; c1 is whole now.
        assert_eq!(feed(&mut a, 134, ack(2, 1)), ["ack c1 [2]"]);
        assert_eq!(tick(&mut a, 135), ["ack c2 [0]"]);
        // A later ack of c2 is held again, from its own arrival.
        assert_eq!(feed(&mut a, 140, ack(1, 2)), NONE);
        assert_eq!(tick(&mut a, 159), NONE);
        assert_eq!(tick(&mut a, 160), ["ack c2 [1]"]);
    }

    #[test]
    fn a_due_group_takes_older_held_acks_with_it() {
        let mut a = agg(&[0, 1], 20);
        assert_eq!(feed(&mut a, 50, ack(0, 2)), NONE);
        assert_eq!(feed(&mut a, 60, ack(0, 1)), NONE);
        assert_eq!(tick(&mut a, 70), ["ack c1 [0]", "ack c2 [0]"], "c2 is due; c1 is older, so it goes first");
    }

    #[test]
    fn events_of_another_generation_are_dropped() {
        let mut a = agg(&[0, 1], 20);
        assert_eq!(feed(&mut a, 0, ack(0, 1)), NONE);
        let old = Generation(2);
        let stale = [
            Event::Acked { generation: old, checkpoint: CheckpointId(1), task: TaskId(1), report: report(1, 1) },
            Event::Declined { generation: old, checkpoint: CheckpointId(1), task: TaskId(1), reason: "x".into() },
            Event::TaskFailed { generation: old, task: TaskId(1), reason: "x".into(), permanent: false },
            Event::SourceFinished { generation: old, task: TaskId(1) },
            Event::TaskFinished { generation: old, task: TaskId(1) },
            // Even from a task that is not local: it is stale before it is wrong.
            Event::Acked { generation: old, checkpoint: CheckpointId(1), task: TaskId(77), report: report(77, 1) },
        ];
        for ev in stale {
            assert_eq!(feed(&mut a, 1, ev), NONE);
        }
        // The stale ack did not count: task 1's real ack completes the group.
        assert_eq!(feed(&mut a, 2, ack(1, 1)), ["ack c1 [0, 1]"]);
    }

    #[test]
    #[should_panic(expected = "acked chk-2 twice")]
    fn a_second_ack_of_one_task_for_one_checkpoint_panics() {
        let mut a = agg(&[0, 1], 20);
        feed(&mut a, 0, ack(0, 2));
        feed(&mut a, 1, ack(0, 2));
    }

    #[test]
    #[should_panic(expected = "acked chk-2 twice")]
    fn a_second_ack_after_its_group_was_sent_panics() {
        let mut a = agg(&[0, 1], 20);
        assert_eq!(feed(&mut a, 0, ack(0, 2)), NONE);
        assert_eq!(feed(&mut a, 1, ack(1, 2)), ["ack c2 [0, 1]"]);
        feed(&mut a, 2, ack(0, 2));
    }

    #[test]
    #[should_panic(expected = "does not run on this worker")]
    fn an_ack_from_a_task_of_another_worker_panics() {
        let mut a = agg(&[0, 1], 20);
        feed(&mut a, 0, ack(5, 1));
    }

    #[test]
    #[should_panic(expected = "only the coordinator's side does")]
    fn coordinator_side_events_panic() {
        let mut a = agg(&[0], 20);
        feed(&mut a, 0, Event::Tick);
    }

    #[test]
    fn only_a_bounded_number_of_checkpoints_is_remembered() {
        let mut a = agg(&[0, 1], 1_000);
        let n = MAX_TRACKED_CHECKPOINTS as u64;
        for c in 1..=n {
            assert_eq!(feed(&mut a, c, ack(0, c)), NONE);
        }
        // One group too many: the oldest goes, with its held ack.
        assert_eq!(feed(&mut a, n + 1, ack(0, n + 1)), ["ack c1 [0]"]);
        assert_eq!(a.groups.len(), MAX_TRACKED_CHECKPOINTS);
    }

    #[test]
    fn messages_survive_postcard_and_expand_to_one_event_per_ack() {
        let mut a = agg(&[0, 1, 2], 20);
        let mut out = Vec::new();
        for t in [2, 0, 1] {
            a.on_event(0, ack(t, 4), &mut out);
        }
        a.on_event(1, decline(1, 5), &mut out);
        assert_eq!(out.len(), 2);
        let mut events = Vec::new();
        for m in out {
            let bytes = postcard::to_allocvec(&m).unwrap();
            let back: TaskEvent = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(show(&back), show(&m));
            back.into_events(&mut events);
        }
        let seen: Vec<String> = events
            .iter()
            .map(|e| match e {
                Event::Acked { generation, checkpoint, task, report: r } => {
                    assert_eq!(*generation, G);
                    assert_eq!(r.handle, report(task.0, checkpoint.0).handle);
                    format!("ack {checkpoint} {task}")
                }
                Event::Declined { checkpoint, task, .. } => format!("decline {checkpoint} {task}"),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        let c4 = CheckpointId(4);
        let c5 = CheckpointId(5);
        let want = [
            format!("ack {c4} {}", TaskId(0)),
            format!("ack {c4} {}", TaskId(1)),
            format!("ack {c4} {}", TaskId(2)),
            format!("decline {c5} {}", TaskId(1)),
        ];
        assert_eq!(seen, want);
    }
}
