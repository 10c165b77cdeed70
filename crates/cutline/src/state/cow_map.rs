//! Keyed state in a copy-on-write hash table ([`CowMap`]): open addressing with linear probing over
//! fixed-size pages of slots. A snapshot ([`CowMap::freeze`]) shares every page with the snapshot
//! writer: one reference count per page, a few thousand for ten million keys, whatever the entries
//! hold. Before the task writes to a slot the writer has not encoded yet, it saves the slot's entry
//! for the writer (or copies the page, see [`super::cow_page`]), and the writer lets go of each page
//! as soon as it has encoded it.
//!
//! One table, not one per key group: many small tables cost a third of the keyed benchmark's
//! throughput (more cache and TLB misses per lookup) when measured against one large table.
//!
//! Incremental snapshots: every slot has a stamp, the epoch it was last written in (an epoch ends at
//! each freeze), and an incremental map logs the keys it removes, so that a snapshot can hold only
//! what changed since an earlier one ([`Frozen::since`]): entries stamped after that freeze, and the
//! keys removed since. A key read for writing counts as changed. Stamps are kept beside the slots,
//! not in them: a stamp in the slot made a 32-byte slot 40 and the keyed benchmark 25 % slower; a
//! separate array costs one store per write.

use super::cow_page::{BeforeWrite, PageBuf};
pub(super) use super::cow_page::{Epoch, Slot, Stamp, PAGE_BYTES};
pub(crate) use super::frozen::Frozen;
use super::hash::stable_hash;
use super::Key;
use cutline_core::{CheckpointId, KeyGroupRange};
use std::sync::Arc;

/// Slots per full page: a power of two whose slots fit in [`PAGE_BYTES`].
fn page_slots<K, V>() -> usize {
    let per = (PAGE_BYTES / std::mem::size_of::<Slot<K, V>>().max(1)).max(1);
    1 << per.ilog2()
}

/// The table grows once more than `MAX_LOAD_NUM / MAX_LOAD_DEN` of its slots are full (linear
/// probing stays short below it).
const MAX_LOAD_NUM: usize = 5;
const MAX_LOAD_DEN: usize = 8;

/// Slots of a new table.
const MIN_SLOTS: usize = 16;

/// How many freezes a map remembers the epoch of: a snapshot can build on one of the last this many
/// (older bases: a whole snapshot instead).
pub(crate) const FREEZES_KEPT: usize = 64;
const _: () = assert!(FREEZES_KEPT < 256, "a base must be younger than a stamp's wrap-around");

/// Fewest removed keys an incremental map logs before it gives up the log (and the next snapshot is
/// a whole one); above it, as many as the map holds entries (a whole snapshot costs as much then).
pub(crate) const MIN_REMOVALS_LOGGED: usize = 1 << 16;
pub(super) type Page<K, V> = Arc<PageBuf<K, V>>;

/// The slot index a hash starts probing at. Keys of a subtask share their key groups (the low
/// bits of the stable hash with a power-of-two number of key groups): the high half is folded in.
#[inline(always)]
fn home(hash: u64, mask: usize) -> usize {
    (hash ^ (hash >> 32)) as usize & mask
}

fn new_page<K, V>(slots: usize) -> Page<K, V> {
    Arc::new(PageBuf::new(slots))
}

/// Where a page's slots and stamps start, and whether its map may write to it in place.
struct PageRef<K, V> {
    base: std::ptr::NonNull<Slot<K, V>>,
    stamps: std::ptr::NonNull<Stamp>,
    owned: bool,
}

// SAFETY: only the `CowMap` owning the page reads or writes through `base`, under the same rules as
// through the page itself.
unsafe impl<K: Send + Sync, V: Send + Sync> Send for PageRef<K, V> {}
// SAFETY: as above (`&CowMap` reads only).
unsafe impl<K: Sync, V: Sync> Sync for PageRef<K, V> {}

/// What snapshots cost a map beyond its state: pages copied whole, and entries saved one by one
/// (see [`super::cow_page`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Copies {
    pub pages: u64,
    pub entries: u64,
}

impl std::ops::Add for Copies {
    type Output = Copies;
    fn add(self, o: Copies) -> Copies {
        Copies { pages: self.pages + o.pages, entries: self.entries + o.entries }
    }
}

/// A subtask's keyed entries, shared page by page with the snapshots that read them.
pub(crate) struct CowMap<K, V> {
    range: KeyGroupRange,
    max_parallelism: u32,
    pages: Vec<Page<K, V>>,
    /// `meta[p]`: where page `p`'s slots start (saves a dependent load per lookup), and whether
    /// this map holds the only reference to it, so that it may write to it in place (`owned`: set
    /// when a page is created, copied, or found unshared; cleared for every page by
    /// [`CowMap::freeze`], the only place that hands out references).
    meta: Vec<PageRef<K, V>>,
    /// Slots in all: a power of two.
    mask: usize,
    /// Slots per page, less one.
    page_mask: usize,
    /// log2 of the slots per page.
    page_bits: u32,
    len: usize,
    copies: Copies,
    /// What writes are stamped with now.
    epoch: Epoch,
    /// The epoch at each of the last [`FREEZES_KEPT`] freezes, by checkpoint.
    freezes: super::freeze_log::FreezeLog<Epoch>,
    /// Keys removed, when the map snapshots incrementally (`None`: whole snapshots only).
    removals: Option<Removals<K>>,
}

/// The keys an incremental map removed since the oldest freeze a snapshot may still build on.
struct Removals<K> {
    /// Removed in the current epoch.
    open: Vec<K>,
    /// Removed in earlier epochs, shared with the snapshots that need them.
    sealed: std::collections::VecDeque<(Epoch, Arc<Vec<K>>)>,
    /// Keys in `open` and `sealed`.
    len: usize,
    /// The first epoch from which every removal is logged (later after the log overflowed).
    complete_from: Epoch,
}

impl<K: Key, V: Clone + Send + Sync + 'static> CowMap<K, V> {
    /// An empty map for the key groups `range` of `max_parallelism`.
    pub fn new(range: KeyGroupRange, max_parallelism: u32) -> Self {
        let mut m = CowMap {
            range,
            max_parallelism,
            pages: Vec::new(),
            meta: Vec::new(),
            mask: 0,
            page_mask: 0,
            page_bits: 0,
            len: 0,
            copies: Copies::default(),
            epoch: 0,
            freezes: super::freeze_log::FreezeLog::new(FREEZES_KEPT),
            removals: None,
        };
        m.allocate(MIN_SLOTS);
        m
    }

    /// An empty map that can snapshot incrementally: it logs removed keys (see [`CowMap::freeze`]).
    pub fn incremental(range: KeyGroupRange, max_parallelism: u32) -> Self {
        let mut m = Self::new(range, max_parallelism);
        m.removals = Some(Removals { open: Vec::new(), sealed: Default::default(), len: 0, complete_from: 0 });
        m
    }

    fn allocate(&mut self, slots: usize) {
        debug_assert!(slots.is_power_of_two());
        let per_page = slots.min(page_slots::<K, V>());
        self.pages = (0..slots / per_page).map(|_| new_page(per_page)).collect();
        self.meta = self.pages.iter().map(|p| PageRef { base: p.ptr, stamps: p.stamps, owned: true }).collect();
        self.mask = slots - 1;
        self.page_bits = per_page.trailing_zeros();
        self.page_mask = per_page - 1;
    }

    /// The key groups it holds.
    pub fn range(&self) -> KeyGroupRange {
        self.range
    }

    /// The key groups of the operator.
    pub fn max_parallelism(&self) -> u32 {
        self.max_parallelism
    }

    /// Entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Pages copied and entries saved since the last call because the task wrote to them while a
    /// snapshot still read them.
    pub fn take_copies(&mut self) -> Copies {
        std::mem::take(&mut self.copies)
    }

    /// The page of slot `i` (`i <= mask`).
    #[inline(always)]
    fn meta(&self, i: usize) -> &PageRef<K, V> {
        debug_assert!(i <= self.mask && self.meta.len() == (self.mask + 1) >> self.page_bits);
        // SAFETY: `i <= mask`, so `i >> page_bits` is below `(mask + 1) >> page_bits`, the number of
        // pages (`allocate` sets all three together).
        unsafe { self.meta.get_unchecked(i >> self.page_bits) }
    }

    #[inline(always)]
    fn slot(&self, i: usize) -> &Slot<K, V> {
        // SAFETY: `base` is the start of page `i >> page_bits`, kept alive by `pages`, and the
        // offset is below the slots per page.
        unsafe { &*self.meta(i).base.as_ptr().add(i & self.page_mask) }
    }

    /// Slot `i` (`i <= mask`) for writing: if a snapshot still reads its page, the slot's entry
    /// saved for it first, or the page copied (see [`PageBuf::before_write`]).
    #[inline(always)]
    fn slot_mut(&mut self, i: usize) -> &mut Slot<K, V> {
        if !self.meta(i).owned {
            self.before_write(i);
        }
        // SAFETY: either `owned` holds, so `pages[p]` is the only reference to its allocation (see
        // the field's doc: references are handed out only by `freeze`, which clears every flag,
        // and no `Weak` is ever made), or the snapshot holding the page reads slot `i` from it no
        // more (`before_write` answered `InPlace`: the module invariant of `cow_page`); and
        // `&mut self` makes this the only access from the task. (`Arc::get_mut` would check
        // ownership at the cost of an atomic read-modify-write per record.) The offset is below
        // the slots per page.
        unsafe { &mut *self.meta(i).base.as_ptr().add(i & self.page_mask) }
    }

    /// Slot `i` for writing, stamped (its page copied first if a snapshot still reads
    /// it).
    #[inline(always)]
    fn slot_stamped(&mut self, i: usize, stamp: Stamp) -> &mut Slot<K, V> {
        let slot: *mut Slot<K, V> = self.slot_mut(i);
        // SAFETY: `slot_mut` made the page owned or saved the slot's stamp for the snapshot reading
        // it (see its safety comment), and the offset is below the stamps per page.
        unsafe { *self.meta(i).stamps.as_ptr().add(i & self.page_mask) = stamp };
        // SAFETY: `slot` points into the page `slot_mut` returned it from, still borrowed by `self`.
        unsafe { &mut *slot }
    }

    /// The stamp of slot `i`.
    #[inline(always)]
    fn stamp(&self, i: usize) -> Stamp {
        // SAFETY: as in `slot`.
        unsafe { *self.meta(i).stamps.as_ptr().add(i & self.page_mask) }
    }

    /// Before the first write to slot `i` of a page the map does not know to be its own: take the
    /// page back if no snapshot holds it any more; else save the slot's entry for the snapshot (the
    /// page stays shared), or copy the page.
    #[cold]
    #[inline(never)]
    fn before_write(&mut self, i: usize) {
        let p = i >> self.page_bits;
        let page = &mut self.pages[p];
        if Arc::get_mut(page).is_none() {
            match page.before_write(i & self.page_mask) {
                BeforeWrite::InPlace => return,
                BeforeWrite::Saved => {
                    self.copies.entries += 1;
                    return;
                }
                BeforeWrite::Copy => {
                    *page = Arc::new(PageBuf::clone(page));
                    self.copies.pages += 1;
                }
            }
        }
        self.meta[p] = PageRef { base: page.ptr, stamps: page.stamps, owned: true };
    }

    /// The slot holding `k`, or the empty slot ending its probe.
    #[inline(always)]
    fn find(&self, k: &K, hash: u64) -> (usize, bool) {
        let mut i = home(hash, self.mask);
        loop {
            match self.slot(i) {
                None => return (i, false),
                Some((k2, _)) if k2 == k => return (i, true),
                Some(_) => i = (i + 1) & self.mask,
            }
        }
    }

    /// The entry of `k`, for writing.
    #[inline(always)]
    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        let epoch = self.epoch as Stamp;
        match self.find(k, stable_hash(k)) {
            (i, true) => self.slot_stamped(i, epoch).as_mut().map(|(_, v)| v),
            (_, false) => None,
        }
    }

    /// The entry of `k`, for reading (never copies).
    #[cfg(test)]
    pub fn get(&self, k: &K) -> Option<&V> {
        match self.find(k, stable_hash(k)) {
            (i, true) => self.slot(i).as_ref().map(|(_, v)| v),
            (_, false) => None,
        }
    }

    /// Set `k`'s entry; the one it replaces.
    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        let hash = stable_hash(&k);
        let epoch = self.epoch as Stamp;
        match self.find(&k, hash) {
            (i, true) => self.slot_stamped(i, epoch).as_mut().map(|(_, old)| std::mem::replace(old, v)),
            (i, false) => {
                if (self.len + 1) * MAX_LOAD_DEN > (self.mask + 1) * MAX_LOAD_NUM {
                    self.grow();
                    let (i, _) = self.find(&k, hash);
                    *self.slot_stamped(i, epoch) = Some((k, v));
                } else {
                    *self.slot_stamped(i, epoch) = Some((k, v));
                }
                self.len += 1;
                None
            }
        }
    }

    /// Twice the slots; entries of pages a snapshot still reads are cloned, the others moved.
    #[cold]
    fn grow(&mut self) {
        let old_pages = std::mem::take(&mut self.pages);
        self.allocate((self.mask + 1) * 2);
        for mut page in old_pages {
            match Arc::get_mut(&mut page) {
                Some(slots) => {
                    let stamps = slots.stamps().to_vec();
                    for (slot, e) in slots.iter_mut().zip(stamps) {
                        if let Some((k, v)) = slot.take() {
                            self.put_new((k, v), e);
                        }
                    }
                }
                None => {
                    self.copies.pages += 1;
                    for (slot, e) in page.iter().zip(page.stamps()) {
                        if let Some((k, v)) = slot {
                            self.put_new((k.clone(), v.clone()), *e);
                        }
                    }
                }
            }
        }
    }

    /// Put an entry whose key is not in the map (no growth), keeping its stamp.
    fn put_new(&mut self, entry: (K, V), stamp: Stamp) {
        let (i, _) = self.find(&entry.0, stable_hash(&entry.0));
        *self.slot_stamped(i, stamp) = Some(entry);
    }

    /// Remove `k`'s entry (backward-shift deletion: the entries after it in its run move up, so
    /// that no probe stops early at the hole).
    pub fn remove(&mut self, k: &K) -> Option<V> {
        let (mut hole, found) = self.find(k, stable_hash(k));
        if !found {
            return None;
        }
        let (k, v) = self.slot_mut(hole).take().expect("found");
        self.len -= 1;
        if let Some(log) = &mut self.removals {
            log.open.push(k);
            log.len += 1;
            if log.len > MIN_REMOVALS_LOGGED.max(self.len) {
                // The next snapshot is a whole one: it costs no more than replaying this log.
                log.open = Vec::new();
                log.sealed.clear();
                log.len = 0;
                log.complete_from = self.epoch.saturating_add(1);
            }
        }
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let Some((kj, _)) = self.slot(j) else { break };
            let h = home(stable_hash(kj), self.mask);
            // The entry at j may move to the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j { hole < h && h <= j } else { hole < h || h <= j };
            if !stays {
                let (moved, stamp) = (self.slot_mut(j).take(), self.stamp(j));
                *self.slot_stamped(hole, stamp) = moved;
                hole = j;
            }
        }
        Some(v)
    }

    /// Every entry, for writing (takes every page back; each entry counts as changed).
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&K, &mut V) -> bool) {
        let epoch = self.epoch as Stamp;
        for i in 0..=self.mask {
            if self.slot(i).is_none() {
                continue;
            }
            if let Some((k, v)) = self.slot_stamped(i, epoch) {
                if !f(k, v) {
                    return;
                }
            }
        }
    }

    /// Share every page with a snapshot that is always encoded whole (see [`CowMap::freeze`]).
    #[cfg(test)]
    pub fn freeze_whole(&mut self) -> Frozen<K, V> {
        let at = self.share_pages();
        self.epoch += 1;
        Frozen {
            pages: self.pages.clone(),
            range: self.range,
            max_parallelism: self.max_parallelism,
            since: None,
            at,
            removed: Vec::new(),
        }
    }

    /// Hand every page to a snapshot of the current epoch: the map writes to none in place without
    /// asking it first (see [`PageBuf::frozen`]). The epoch.
    fn share_pages(&mut self) -> Epoch {
        for (page, meta) in self.pages.iter().zip(&mut self.meta) {
            meta.owned = false;
            page.frozen(self.epoch, Arc::strong_count(page) == 1);
        }
        self.epoch
    }

    /// Share every page with the snapshot of `checkpoint`: one reference count per page, whatever
    /// the entries hold. Writes after it copy a page only while the snapshot still holds it.
    ///
    /// `base`: a complete checkpoint whose snapshot of this map a later one may build on (the task's
    /// latest known to be complete; it only moves forward). If this map was frozen for it, the
    /// snapshot can also be encoded as what changed since then ([`Frozen::since`]). What only
    /// older bases would need is dropped here. Costs O([`FREEZES_KEPT`]), not O(entries).
    pub fn freeze(&mut self, checkpoint: CheckpointId, base: Option<CheckpointId>) -> Frozen<K, V> {
        let epoch = self.share_pages();
        let base_epoch = base.and_then(|b| self.freezes.get(b).copied());
        self.freezes.record(checkpoint, base, epoch);
        let mut since = None;
        let mut removed = Vec::new();
        if let Some(log) = &mut self.removals {
            if !log.open.is_empty() {
                log.sealed.push_back((epoch, Arc::new(std::mem::take(&mut log.open))));
            }
            if let Some(b) = base_epoch {
                // Removals at or before the base's freeze are in the base already.
                while log.sealed.front().is_some_and(|(e, _)| *e <= b) {
                    let (_, keys) = log.sealed.pop_front().expect("front");
                    log.len -= keys.len();
                }
                if log.complete_from <= b.saturating_add(1) {
                    since = Some(b);
                    removed = log.sealed.iter().map(|(_, keys)| keys.clone()).collect();
                }
            }
        }
        // An epoch counter that ran out (four billion checkpoints) ends incremental snapshots of
        // this map; whole ones go on.
        match self.epoch.checked_add(1) {
            Some(next) => self.epoch = next,
            None => {
                since = None;
                self.removals = None;
            }
        }
        Frozen {
            pages: self.pages.clone(),
            range: self.range,
            max_parallelism: self.max_parallelism,
            since,
            at: epoch,
            removed,
        }
    }
}

#[cfg(test)]
#[path = "cow_map_tests.rs"]
mod tests;
