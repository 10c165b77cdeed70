//! Event-time timers of a keyed operator ([`Timers`]): per key a set of times, fired in time order
//! when the operator's watermark passes them; checkpointed by key group (so they move with their keys
//! when a job is rescaled) and restored with the keyed state.

use crate::error::TaskError;
use crate::state::{
    key_group_of_hash, stable_hash, Copies, CowMap, Encoded, Frozen, Key, KeyedLayer, RestoreIndex, StateImage,
};
use cutline_core::watermark::EventTime;
use cutline_core::{CheckpointId, KeyGroup, KeyGroupRange};
use std::collections::{BTreeMap, BTreeSet};

/// What a process function asked of the timers of the key it ran for (applied after it returns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimerCmd {
    Set(EventTime),
    Cancel(EventTime),
}

/// Which clock a timer follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeDomain {
    /// The operator's watermark.
    Event,
    /// The task's clock, in milliseconds since the Unix epoch (stored as an [`EventTime`]).
    Processing,
}

/// A processing time as the timers store it.
pub(crate) fn processing_time(ms: u64) -> EventTime {
    EventTime(ms.min(i64::MAX as u64) as i64)
}

/// The times of one key's pending timers: most keys have one, kept inline (no allocation, so the
/// copy at a barrier is a flat copy). Serialised as a sequence, like a set of times.
#[derive(Clone, Debug, PartialEq, Eq)]
// Boxed on purpose: the set inline would make every key's entry (most hold `One`) three words wider.
#[allow(clippy::box_collection)]
enum Times {
    One(EventTime),
    Many(Box<BTreeSet<EventTime>>),
}

impl Times {
    /// Add `t`; false if it was there.
    fn insert(&mut self, t: EventTime) -> bool {
        match self {
            Times::One(o) if *o == t => false,
            Times::One(o) => {
                *self = Times::Many(Box::new(BTreeSet::from([*o, t])));
                true
            }
            Times::Many(set) => set.insert(t),
        }
    }
    /// Remove `t`: (it was there, none is left).
    fn remove(&mut self, t: EventTime) -> (bool, bool) {
        match self {
            Times::One(o) => (*o == t, *o == t),
            Times::Many(set) => {
                let removed = set.remove(&t);
                (removed, set.is_empty())
            }
        }
    }
}

impl serde::Serialize for Times {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Times::One(t) => s.collect_seq(std::iter::once(t)),
            Times::Many(set) => s.collect_seq(set.iter()),
        }
    }
}

/// The keys with a timer at one time: most often one, kept inline.
enum Keys<K> {
    One(K),
    Many(Vec<K>),
}

/// The pending timers of one keyed operator subtask (event or processing time).
pub(crate) struct Timers<K> {
    /// The truth: each key's pending timers, in a copy-on-write table shared with snapshots.
    by_key: CowMap<K, Times>,
    /// Firing order. May hold entries cancelled since (checked against `by_key` when due).
    queue: BTreeMap<EventTime, Keys<K>>,
    pending: usize,
}

impl<K: Key> Timers<K> {
    /// No timers, for the key groups `range` of `max_parallelism`.
    pub fn new(range: KeyGroupRange, max_parallelism: u32) -> Self {
        Timers { by_key: CowMap::incremental(range, max_parallelism), queue: BTreeMap::new(), pending: 0 }
    }

    /// Pages of `by_key` copied and entries saved since the last call (see [`CowMap::take_copies`]).
    pub fn take_copies(&mut self) -> Copies {
        self.by_key.take_copies()
    }

    /// Pending timers.
    pub fn len(&self) -> usize {
        self.pending
    }

    pub fn apply(&mut self, key: &K, cmd: TimerCmd) {
        match cmd {
            TimerCmd::Set(t) => {
                let new = match self.by_key.get_mut(key) {
                    Some(times) => times.insert(t),
                    None => {
                        self.by_key.insert(key.clone(), Times::One(t));
                        true
                    }
                };
                if new {
                    match self.queue.entry(t) {
                        std::collections::btree_map::Entry::Vacant(v) => {
                            v.insert(Keys::One(key.clone()));
                        }
                        std::collections::btree_map::Entry::Occupied(mut o) => {
                            let keys = o.get_mut();
                            if let Keys::One(k) = keys {
                                *keys = Keys::Many(vec![k.clone()]);
                            }
                            if let Keys::Many(v) = keys {
                                v.push(key.clone());
                            }
                        }
                    }
                    self.pending += 1;
                }
            }
            TimerCmd::Cancel(t) => {
                if let Some(times) = self.by_key.get_mut(key) {
                    let (removed, empty) = times.remove(t);
                    if removed {
                        self.pending -= 1;
                    }
                    if empty {
                        self.by_key.remove(key);
                    }
                }
            }
        }
    }

    /// The time of the earliest timer (perhaps one cancelled since: a caller may wake for nothing).
    pub fn next_time(&self) -> Option<EventTime> {
        self.queue.first_key_value().map(|(t, _)| *t)
    }

    /// The earliest pending timer at or before `watermark`, removed.
    pub fn pop_due(&mut self, watermark: EventTime) -> Option<(EventTime, K)> {
        loop {
            let mut first = self.queue.first_entry()?;
            let t = *first.key();
            if t > watermark {
                return None;
            }
            let k = match first.get_mut() {
                Keys::Many(v) if v.len() > 1 => v.pop().expect("more than one"),
                Keys::Many(_) | Keys::One(_) => match first.remove() {
                    Keys::One(k) => k,
                    Keys::Many(mut v) => v.pop().expect("one"),
                },
            };
            let Some(times) = self.by_key.get_mut(&k) else { continue };
            let (removed, empty) = times.remove(t);
            if empty {
                self.by_key.remove(&k);
            }
            if removed {
                self.pending -= 1;
                return Some((t, k));
            }
        }
    }

    /// The timers as they are at the barrier of `checkpoint`, shared with the snapshot (in time that
    /// does not grow with the timers pending); incremental on top of `base` if the writer allows.
    pub fn image(&mut self, uid: &str, checkpoint: CheckpointId, base: Option<CheckpointId>) -> Box<dyn StateImage> {
        Box::new(TimersImage { uid: uid.to_string(), frozen: self.by_key.freeze(checkpoint, base) })
    }

    /// Drop every timer of `key` (its queue entries go stale: `pop_due` skips them).
    fn clear(&mut self, key: &K) {
        if let Some(times) = self.by_key.remove(key) {
            self.pending -= match times {
                Times::One(_) => 1,
                Times::Many(set) => set.len(),
            };
        }
    }

    /// Load the timers of this subtask's key groups from a checkpoint.
    pub fn restore(&mut self, index: &RestoreIndex, uid: &str) -> Result<(), TaskError> {
        let (range, max_parallelism) = (self.by_key.range(), self.by_key.max_parallelism());
        let err = |m: String| TaskError::State { uid: uid.to_string(), message: m };
        let check = |k: &K, kg: u32| {
            let actual = key_group_of_hash(stable_hash(k), max_parallelism);
            if actual != kg || !range.contains(KeyGroup(kg)) {
                return Err(err(format!(
                    "a timer's key filed under key group {kg} hashes to group {actual}: the key type or its Hash changed since the checkpoint"
                )));
            }
            Ok(())
        };
        // Layers in order: a whole state, then what changed on top (the keys whose timers changed
        // have all their timers in it; removed keys have none left).
        for (kg, layer) in index.keyed(uid, range, max_parallelism)? {
            let (mut removes, mut blob) = match layer {
                KeyedLayer::Whole(blob) => (&[][..], blob),
                KeyedLayer::Delta { removes, upserts } => (removes, upserts),
            };
            while !removes.is_empty() {
                let (k, rest): (K, &[u8]) =
                    postcard::take_from_bytes(removes).map_err(|e| err(format!("decoding a timer's key: {e}")))?;
                check(&k, kg)?;
                self.clear(&k);
                removes = rest;
            }
            while !blob.is_empty() {
                let ((k, times), rest): ((K, BTreeSet<EventTime>), &[u8]) =
                    postcard::take_from_bytes(blob).map_err(|e| err(format!("decoding timers: {e}")))?;
                check(&k, kg)?;
                self.clear(&k);
                for t in times {
                    self.apply(&k, TimerCmd::Set(t));
                }
                blob = rest;
            }
        }
        Ok(())
    }
}

/// A per-subtask event time (an operator's watermark, a generator's highest timestamp) as the
/// restored checkpoint has it; at another parallelism the lowest of the old subtasks' (one that
/// recorded none had none). [`EventTime::MIN`] if absent.
pub(crate) fn restore_event_time(
    index: &RestoreIndex,
    uid: &str,
    subtask: u32,
    parallelism: u32,
) -> Result<EventTime, TaskError> {
    let decode = |b: &[u8]| {
        postcard::from_bytes::<EventTime>(b)
            .map_err(|e| TaskError::State { uid: uid.to_string(), message: format!("decoding a watermark: {e}") })
    };
    if let Some((old_parallelism, old)) = index.plain_rescaled(uid, parallelism)? {
        let mut lowest = if old.len() < old_parallelism as usize { EventTime::MIN } else { EventTime::MAX };
        for b in old {
            lowest = lowest.min(decode(b)?);
        }
        return Ok(lowest);
    }
    match index.plain(uid, subtask, parallelism)? {
        Some(b) => decode(b),
        None => Ok(EventTime::MIN),
    }
}

/// Timers as they were at a barrier, encoded per key group off the task thread.
struct TimersImage<K> {
    uid: String,
    frozen: Frozen<K, Times>,
}

impl<K: Key> StateImage for TimersImage<K> {
    fn encode(self: Box<Self>, incremental: bool) -> Result<Encoded, String> {
        self.frozen.encode(&self.uid, |v| Some(v), incremental).map(Encoded::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_fire_in_time_order_once_and_not_after_a_cancel() {
        let mut t = Timers::<String>::new(KeyGroupRange::for_subtask(128, 1, 0), 128);
        t.apply(&"a".to_string(), TimerCmd::Set(EventTime(30)));
        t.apply(&"b".to_string(), TimerCmd::Set(EventTime(10)));
        t.apply(&"a".to_string(), TimerCmd::Set(EventTime(10)));
        t.apply(&"a".to_string(), TimerCmd::Set(EventTime(10)));
        t.apply(&"c".to_string(), TimerCmd::Set(EventTime(20)));
        t.apply(&"c".to_string(), TimerCmd::Cancel(EventTime(20)));
        assert_eq!(t.len(), 3, "a second timer at the same time of a key is the same timer");
        let mut fired = Vec::new();
        while let Some(x) = t.pop_due(EventTime(25)) {
            fired.push(x);
        }
        fired.sort();
        assert_eq!(fired, [(EventTime(10), "a".to_string()), (EventTime(10), "b".to_string())]);
        t.apply(&"c".to_string(), TimerCmd::Set(EventTime(20)));
        assert_eq!(t.pop_due(EventTime(25)), Some((EventTime(20), "c".to_string())), "set again after a cancel");
        assert_eq!(t.pop_due(EventTime(29)), None);
        assert_eq!(t.pop_due(EventTime::MAX), Some((EventTime(30), "a".to_string())));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_keys_times_encode_as_the_set_of_times_earlier_checkpoints_hold() {
        // Checkpoints before the inline form stored a `BTreeSet<EventTime>` per key; both forms
        // must read each other.
        let one = BTreeSet::from([EventTime(7)]);
        let many = BTreeSet::from([EventTime(-3), EventTime(7), EventTime(1 << 40)]);
        let inline = Times::One(EventTime(7));
        let boxed = Times::Many(Box::new(many.clone()));
        assert_eq!(postcard::to_allocvec(&inline).unwrap(), postcard::to_allocvec(&one).unwrap());
        assert_eq!(postcard::to_allocvec(&boxed).unwrap(), postcard::to_allocvec(&many).unwrap());
        let mut t = Times::One(EventTime(7));
        assert!(t.insert(EventTime(-3)) && t.insert(EventTime(1 << 40)) && !t.insert(EventTime(7)));
        assert_eq!(t, boxed);
        assert_eq!(t.remove(EventTime(8)), (false, false));
        assert_eq!(t.remove(EventTime(7)), (true, false));
    }
}
