//! [`Frozen`]: a [`CowMap`](super::CowMap)'s pages as they were at a barrier, shared with a snapshot
//! writer and encoded on its thread, whole or as what changed since the snapshot's base.

use super::cow_map::{Epoch, Page, Stamp};
use super::hash::{key_group_of_hash, stable_hash};
use super::snapshot::ElementState;
use super::Key;
use cutline_core::{KeyGroup, KeyGroupRange};
use serde::Serialize;
use std::sync::Arc;

/// Stamps an incremental encoding compares at once before it reads any of their slots.
const STAMPS_PER_RUN: usize = 32;

/// The pages of a [`CowMap`] as they were at a barrier, encoded off the task thread.
pub(crate) struct Frozen<K, V> {
    pub(super) pages: Vec<Page<K, V>>,
    pub(super) range: KeyGroupRange,
    pub(super) max_parallelism: u32,
    /// The epoch of the base checkpoint's freeze, if the snapshot can be encoded as what changed
    /// since it: entries stamped later, and `removed`.
    pub(super) since: Option<Epoch>,
    /// The epoch that this freeze ended.
    pub(super) at: Epoch,
    /// Keys removed since the base's freeze, oldest first.
    pub(super) removed: Vec<Arc<Vec<K>>>,
}

impl<K: Key, V: Send + Sync + 'static> Frozen<K, V> {
    /// Whether [`Frozen::encode`] can hold only what changed since the base checkpoint.
    #[cfg(test)]
    pub fn can_be_incremental(&self) -> bool {
        self.since.is_some()
    }

    /// Keyed state, the value of each entry being what `project` makes of it (`None`: no state).
    /// Whole ([`ElementState::Keyed`]: one blob of concatenated `(key, value)` pairs per non-empty
    /// key group), or, if `incremental` and [`Frozen::can_be_incremental`], only what changed since
    /// the base ([`ElementState::KeyedDelta`]: per key group, the pairs written since and the keys
    /// removed since, an entry projected to `None` counting as removed). Each page is let go of as
    /// soon as it is encoded. The task may write to a page meanwhile: it saves what it overwrites for
    /// this snapshot first ([`PageBuf::read_as_of`](super::cow_page::PageBuf::read_as_of)).
    pub fn encode<W: Serialize + ?Sized>(
        self,
        uid: &str,
        project: impl Fn(&V) -> Option<&W>,
        incremental: bool,
    ) -> Result<ElementState, String> {
        let (range, max_parallelism) = (self.range, self.max_parallelism);
        let since = self.since.filter(|_| incremental);
        // Written after the base's freeze: in one of the `lag` epochs up to this freeze's.
        let (at, lag) = (self.at as Stamp, since.map(|b| self.at - b));
        let groups_len = range.len() as usize;
        let mut upserts: Vec<Vec<u8>> = vec![Vec::new(); groups_len];
        let mut removes: Vec<Vec<u8>> = vec![Vec::new(); if since.is_some() { groups_len } else { 0 }];
        let group = |k: &K| -> usize {
            let kg = key_group_of_hash(stable_hash(k), max_parallelism);
            // Invariant: the router only ever sent this subtask keys of its own key groups.
            assert!(range.contains(KeyGroup(kg)), "{uid}: key of key group {kg} outside {range:?}");
            (kg - range.start) as usize
        };
        fn append<T: Serialize + ?Sized>(uid: &str, buf: &mut Vec<u8>, v: &T) -> Result<(), String> {
            let taken = std::mem::take(buf);
            *buf = postcard::to_extend(v, taken).map_err(|e| format!("{uid}: encoding a key: {e}"))?;
            Ok(())
        }
        // Removals matter only to an incremental snapshot (a whole one lists what is there).
        for keys in self.removed.iter().filter(|_| since.is_some()) {
            for k in keys.iter() {
                append(uid, &mut removes[group(k)], k)?;
            }
        }
        let mut put = |slot: &Option<(K, V)>| -> Result<(), String> {
            let Some((k, v)) = slot else { return Ok(()) };
            match project(v) {
                Some(w) => append(uid, &mut upserts[group(k)], &(k, w)),
                None if since.is_some() => append(uid, &mut removes[group(k)], k),
                None => Ok(()),
            }
        };
        // A base older than a stamp can tell (never: it is at most FREEZES_KEPT freezes old):
        // every entry, as if each had changed.
        let lag = lag.and_then(|lag| Stamp::try_from(lag).ok());
        let changed = |e: &Stamp| lag.is_some_and(|lag| at.wrapping_sub(*e) < lag);
        for page in self.pages {
            page.read_as_of(self.at, |_, stamps, slot| {
                if lag.is_none() {
                    return (0..stamps.len()).try_for_each(|i| put(slot(i)));
                }
                // The stamps first, a run of them at a time (one byte per slot, compared without a
                // branch): a slot is read only if it changed. Reading every slot to find the 1 %
                // that changed cost 14 ns per entry.
                for (run, stamps) in stamps.chunks(STAMPS_PER_RUN).enumerate() {
                    if !stamps.iter().fold(false, |any, e| any | changed(e)) {
                        continue;
                    }
                    for (i, e) in stamps.iter().enumerate() {
                        if changed(e) {
                            put(slot(run * STAMPS_PER_RUN + i))?;
                        }
                    }
                }
                Ok(())
            })?;
        }
        Ok(ElementState::keyed(range.start, max_parallelism, upserts, since.map(|_| removes)))
    }
}
