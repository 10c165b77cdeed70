//! Event time per split inside one source subtask ([`WatermarkStrategy::per_split`]): the highest
//! time seen in each split, which splits are idle, and the lowest of them, from which the generator
//! derives the subtask's watermark. Pure bookkeeping: the generator feeds it records, the source's
//! split announcements and processing time.
//!
//! [`WatermarkStrategy::per_split`]: super::WatermarkStrategy::per_split

use super::event_time::splits_uid;
use crate::connectors::SplitId;
use crate::error::TaskError;
use crate::state::RestoreIndex;
use cutline_core::watermark::EventTime;
use std::collections::HashMap;

/// Most splits one watermark generator tracks (those read now and those a restored checkpoint
/// named). More fails the task: a split function that returns a new id for every record would
/// otherwise grow the table without bound.
pub const MAX_SPLITS_PER_SUBTASK: usize = 65_536;

/// One split's clock.
#[derive(Clone, Debug)]
struct Clock {
    id: SplitId,
    /// Highest event time of the split's records; [`EventTime::MIN`] before its first.
    max_seen: EventTime,
    /// Processing time of its last record (or of when it appeared).
    active_ms: u64,
    /// No record for the idle timeout: it does not hold the watermark back.
    idle: bool,
}

/// The splits of one source subtask and the highest event time of each.
#[derive(Debug, Default)]
pub(crate) struct SplitClocks {
    clocks: Vec<Clock>,
    index: HashMap<SplitId, usize>,
    /// Highest times of splits not read here now: restored from a checkpoint, or left behind by a
    /// split that stopped (kept so that they come back with their time).
    parked: HashMap<SplitId, EventTime>,
    /// Index of the split of the last record (records come in runs of one split).
    last: usize,
    /// Processing time of the latest tick; 0 before the first.
    now_ms: u64,
}

/// [`MAX_SPLITS_PER_SUBTASK`] was exceeded.
#[derive(Debug)]
pub(crate) struct TooManySplits;

impl SplitClocks {
    /// Clocks that start from `restored` (a split's highest time in the restored checkpoint).
    pub fn restored(restored: HashMap<SplitId, EventTime>) -> SplitClocks {
        SplitClocks { parked: restored, ..SplitClocks::default() }
    }

    fn add(&mut self, id: SplitId) -> Result<usize, TooManySplits> {
        if self.clocks.len() + self.parked.len() >= MAX_SPLITS_PER_SUBTASK {
            return Err(TooManySplits);
        }
        let max_seen = self.parked.remove(&id).unwrap_or(EventTime::MIN);
        self.clocks.push(Clock { id, max_seen, active_ms: self.now_ms, idle: false });
        self.index.insert(id, self.clocks.len() - 1);
        Ok(self.clocks.len() - 1)
    }

    /// A record of split `id` at time `t`. A split not announced joins the set.
    #[inline]
    pub fn observe(&mut self, id: SplitId, t: EventTime) -> Result<(), TooManySplits> {
        let i = match self.clocks.get(self.last) {
            Some(c) if c.id == id => self.last,
            _ => match self.index.get(&id) {
                Some(&i) => i,
                None => self.add(id)?,
            },
        };
        self.last = i;
        let c = &mut self.clocks[i];
        c.max_seen = c.max_seen.max(t);
        c.active_ms = self.now_ms;
        c.idle = false;
        Ok(())
    }

    /// The source reads exactly `ids` now: new ones hold the watermark back until they have records
    /// (or go idle); the others no longer do.
    pub fn announce(&mut self, ids: &[SplitId]) -> Result<(), TooManySplits> {
        let old = std::mem::take(&mut self.clocks);
        self.index.clear();
        self.last = 0;
        let mut keep: HashMap<SplitId, Clock> = HashMap::with_capacity(old.len());
        for c in old {
            if ids.contains(&c.id) {
                keep.insert(c.id, c);
            } else if c.max_seen != EventTime::MIN {
                self.parked.insert(c.id, c.max_seen);
            }
        }
        for &id in ids {
            if self.index.contains_key(&id) {
                continue;
            }
            match keep.remove(&id) {
                Some(c) => {
                    self.clocks.push(c);
                    self.index.insert(id, self.clocks.len() - 1);
                }
                None => {
                    self.add(id)?;
                }
            }
        }
        Ok(())
    }

    /// Processing time is `now_ms`: splits without a record for `idle_timeout_ms` go idle. True if
    /// one did.
    pub fn tick(&mut self, now_ms: u64, idle_timeout_ms: Option<u64>) -> bool {
        if self.now_ms == 0 {
            // The first tick: what appeared before it appeared now.
            self.clocks.iter_mut().for_each(|c| c.active_ms = now_ms);
        }
        self.now_ms = now_ms;
        let Some(timeout) = idle_timeout_ms else { return false };
        let mut changed = false;
        for c in self.clocks.iter_mut().filter(|c| !c.idle) {
            if now_ms.saturating_sub(c.active_ms) >= timeout {
                c.idle = true;
                changed = true;
            }
        }
        changed
    }

    /// The lowest highest-time over the active splits ([`EventTime::MIN`] if one has no record
    /// yet); `None` if no split is active.
    pub fn low(&self) -> Option<EventTime> {
        self.clocks.iter().filter(|c| !c.idle).map(|c| c.max_seen).min()
    }

    /// Every split's highest time, for a checkpoint (also those parked).
    pub fn snapshot(&self) -> Vec<(SplitId, EventTime)> {
        let mut v: Vec<(SplitId, EventTime)> = self.parked.iter().map(|(id, t)| (*id, *t)).collect();
        v.extend(self.clocks.iter().filter(|c| c.max_seen != EventTime::MIN).map(|c| (c.id, c.max_seen)));
        v.sort_unstable();
        v
    }
}

/// Every old subtask's split times merged (the highest per split): after a rescale a split may be
/// read by any new subtask.
pub(crate) fn restore_splits(index: &RestoreIndex, uid: &str) -> Result<HashMap<SplitId, EventTime>, TaskError> {
    let suid = splits_uid(uid);
    let mut merged: HashMap<SplitId, EventTime> = HashMap::new();
    for b in index.plain_all(&suid)? {
        let splits: Vec<(SplitId, EventTime)> = postcard::from_bytes(b)
            .map_err(|e| TaskError::State { uid: suid.clone(), message: format!("decoding split times: {e}") })?;
        for (id, t) in splits {
            let e = merged.entry(id).or_insert(t);
            *e = (*e).max(t);
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ElementState, RestoredPart};

    fn t(ms: i64) -> EventTime {
        EventTime(ms)
    }

    #[test]
    fn an_announced_split_without_records_holds_time_back_until_it_idles() {
        let mut c = SplitClocks::default();
        c.tick(1_000, Some(100));
        c.announce(&[SplitId(1), SplitId(2)]).unwrap();
        c.observe(SplitId(1), t(500)).unwrap();
        assert_eq!(c.low(), Some(EventTime::MIN));
        assert!(!c.tick(1_050, Some(100)));
        c.observe(SplitId(1), t(600)).unwrap();
        assert!(c.tick(1_100, Some(100)), "split 2 has been silent for 100 ms");
        assert_eq!(c.low(), Some(t(600)));
        c.observe(SplitId(2), t(10)).unwrap();
        assert_eq!(c.low(), Some(t(10)), "a record wakes its split");
    }

    #[test]
    fn a_split_that_stops_and_returns_keeps_its_time_and_restored_times_come_back() {
        let mut c = SplitClocks::restored(HashMap::from([(SplitId(3), t(70))]));
        c.announce(&[SplitId(1), SplitId(3)]).unwrap();
        c.observe(SplitId(1), t(100)).unwrap();
        assert_eq!(c.low(), Some(t(70)));
        c.announce(&[SplitId(1)]).unwrap();
        assert_eq!(c.low(), Some(t(100)));
        assert_eq!(c.snapshot(), vec![(SplitId(1), t(100)), (SplitId(3), t(70))]);
    }

    #[test]
    fn restored_split_times_are_the_highest_over_every_old_subtask_whatever_the_parallelism() {
        let mut index = RestoreIndex::default();
        let part = |subtask: u32, times: &[(u64, i64)]| {
            let times: Vec<(SplitId, EventTime)> = times.iter().map(|&(s, ms)| (SplitId(s), t(ms))).collect();
            RestoredPart {
                subtask,
                parallelism: 2,
                state: ElementState::Plain(postcard::to_allocvec(&times).unwrap().into()),
                deltas: vec![],
            }
        };
        index.elements.insert(splits_uid("wm"), vec![part(0, &[(1, 10), (2, 50)]), part(1, &[(2, 40), (3, 7)])]);
        let got = restore_splits(&index, "wm").unwrap();
        assert_eq!(got, HashMap::from([(SplitId(1), t(10)), (SplitId(2), t(50)), (SplitId(3), t(7))]));
        assert!(restore_splits(&index, "other").unwrap().is_empty());
        index.elements.insert(
            splits_uid("bad"),
            vec![RestoredPart {
                subtask: 0,
                parallelism: 1,
                state: ElementState::Plain(vec![0xff].into()),
                deltas: vec![],
            }],
        );
        let e = restore_splits(&index, "bad").unwrap_err();
        assert!(e.to_string().contains("decoding split times"), "{e}");
    }
}
