//! Keyed state in a copy-on-write hash table ([`CowMap`]): open addressing with linear probing over
//! fixed-size pages of slots. A snapshot ([`CowMap::freeze`]) shares every page with the snapshot
//! writer: one reference count per page, a few thousand for ten million keys, whatever the entries
//! hold. The task copies a page only when it writes to one that the writer has not encoded yet, and
//! the writer lets go of each page as soon as it has encoded it.
//!
//! One table, not one per key group: many small tables cost a third of the keyed benchmark's
//! throughput (more cache and TLB misses per lookup) when measured against one large table.

use super::hash::{key_group_of_hash, stable_hash};
use super::snapshot::ElementState;
use super::Key;
use cutline_core::{KeyGroup, KeyGroupRange};
use serde::Serialize;
use std::sync::Arc;

/// Bytes of a full page (the unit of copy-on-write): one transparent huge page, so that a lookup
/// in a large table does not also miss the TLB.
pub(crate) const PAGE_BYTES: usize = 2 << 20;

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

type Slot<K, V> = Option<(K, V)>;
type Page<K, V> = Arc<PageBuf<K, V>>;

/// The slot index a hash starts probing at. Keys of a subtask share their key groups (the low
/// bits of the stable hash with a power-of-two number of key groups): the high half is folded in.
#[inline(always)]
fn home(hash: u64, mask: usize) -> usize {
    (hash ^ (hash >> 32)) as usize & mask
}

fn new_page<K, V>(slots: usize) -> Page<K, V> {
    Arc::new(PageBuf::new(slots))
}

/// Bytes of a cache line: pages start at one, so that a slot whose size divides it never spans two
/// (a `Vec`'s or an `Arc`'s slice starts 16 bytes into a line: every other 32-byte slot would cost
/// two cache misses).
const LINE: usize = 64;

/// Where a page's slots start, and whether its map may write to it in place.
struct PageRef<K, V> {
    base: std::ptr::NonNull<Slot<K, V>>,
    owned: bool,
}

// SAFETY: only the `CowMap` owning the page reads or writes through `base`, under the same rules as
// through the page itself.
unsafe impl<K: Send + Sync, V: Send + Sync> Send for PageRef<K, V> {}
// SAFETY: as above (`&CowMap` reads only).
unsafe impl<K: Sync, V: Sync> Sync for PageRef<K, V> {}

/// The slots of one page, in an allocation aligned to a cache line.
struct PageBuf<K, V> {
    ptr: std::ptr::NonNull<Slot<K, V>>,
    len: usize,
}

// SAFETY: a `PageBuf` owns its slots as a `Box<[Slot<K, V>]>` would.
unsafe impl<K: Send, V: Send> Send for PageBuf<K, V> {}
// SAFETY: as above; `&PageBuf` gives only `&Slot`.
unsafe impl<K: Sync, V: Sync> Sync for PageBuf<K, V> {}

impl<K, V> PageBuf<K, V> {
    fn layout(len: usize) -> std::alloc::Layout {
        let array = std::alloc::Layout::array::<Slot<K, V>>(len).expect("a page's layout");
        let align = if array.size() >= PAGE_BYTES / 2 { PAGE_BYTES } else { LINE };
        array.align_to(align).expect("a page's layout")
    }

    fn new(len: usize) -> Self {
        assert!(len > 0);
        let layout = Self::layout(len);
        // SAFETY: `layout` has a non-zero size (`len > 0`, and a slot holds at least its tag).
        let raw = unsafe { std::alloc::alloc(layout) } as *mut Slot<K, V>;
        let Some(ptr) = std::ptr::NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        if layout.align() == PAGE_BYTES {
            // Ask for huge pages before the first touch (a hint: refused where transparent huge
            // pages are off, and then the page is as fast as any other allocation).
            #[cfg(target_os = "linux")]
            // SAFETY: the range is this allocation, aligned to a huge page.
            unsafe {
                libc::madvise(raw as *mut libc::c_void, layout.size(), libc::MADV_HUGEPAGE)
            };
        }
        for i in 0..len {
            // SAFETY: `i < len` slots were allocated; each is written once before any read.
            unsafe { ptr.as_ptr().add(i).write(None) };
        }
        PageBuf { ptr, len }
    }
}

impl<K, V> std::ops::Deref for PageBuf<K, V> {
    type Target = [Slot<K, V>];
    fn deref(&self) -> &[Slot<K, V>] {
        // SAFETY: `len` initialised slots at `ptr`, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<K, V> std::ops::DerefMut for PageBuf<K, V> {
    fn deref_mut(&mut self) -> &mut [Slot<K, V>] {
        // SAFETY: as in `deref`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<K: Clone, V: Clone> Clone for PageBuf<K, V> {
    fn clone(&self) -> Self {
        let mut copy = PageBuf::new(self.len);
        copy.clone_from_slice(self);
        copy
    }
}

impl<K, V> Drop for PageBuf<K, V> {
    fn drop(&mut self) {
        // SAFETY: the slots are initialised and dropped once, then the allocation made with the
        // same layout is freed.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len));
            std::alloc::dealloc(self.ptr.as_ptr() as *mut u8, Self::layout(self.len));
        }
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
    copies: u64,
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
            copies: 0,
        };
        m.allocate(MIN_SLOTS);
        m
    }

    fn allocate(&mut self, slots: usize) {
        debug_assert!(slots.is_power_of_two());
        let per_page = slots.min(page_slots::<K, V>());
        self.pages = (0..slots / per_page).map(|_| new_page(per_page)).collect();
        self.meta = self.pages.iter().map(|p| PageRef { base: p.ptr, owned: true }).collect();
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

    /// Pages copied since the last call because the task wrote to them while a snapshot still
    /// read them.
    pub fn take_copies(&mut self) -> u64 {
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

    /// Slot `i` (`i <= mask`) for writing: its page copied first if a snapshot still reads it.
    #[inline(always)]
    fn slot_mut(&mut self, i: usize) -> &mut Slot<K, V> {
        if !self.meta(i).owned {
            self.take_back(i >> self.page_bits);
        }
        let p = i >> self.page_bits;
        debug_assert!(Arc::strong_count(&self.pages[p]) == 1 && Arc::weak_count(&self.pages[p]) == 0);
        // SAFETY: `owned` holds, so `pages[p]` is the only reference to its allocation (see the
        // field's doc: references are handed out only by `freeze`, which clears every flag, and no
        // `Weak` is ever made), and `&mut self` makes this the only access: a unique `Arc`'s data
        // may be written through (`Arc::get_mut` would check the same at the cost of an atomic
        // read-modify-write per record). The offset is below the slots per page.
        unsafe { &mut *self.meta(i).base.as_ptr().add(i & self.page_mask) }
    }

    #[cold]
    #[inline(never)]
    fn take_back(&mut self, p: usize) {
        let page = &mut self.pages[p];
        if Arc::get_mut(page).is_none() {
            *page = Arc::new(PageBuf::clone(page));
            self.copies += 1;
        }
        self.meta[p] = PageRef { base: page.ptr, owned: true };
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
        match self.find(k, stable_hash(k)) {
            (i, true) => self.slot_mut(i).as_mut().map(|(_, v)| v),
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
        match self.find(&k, hash) {
            (i, true) => self.slot_mut(i).as_mut().map(|(_, old)| std::mem::replace(old, v)),
            (i, false) => {
                if (self.len + 1) * MAX_LOAD_DEN > (self.mask + 1) * MAX_LOAD_NUM {
                    self.grow();
                    let (i, _) = self.find(&k, hash);
                    *self.slot_mut(i) = Some((k, v));
                } else {
                    *self.slot_mut(i) = Some((k, v));
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
                Some(slots) => slots.iter_mut().filter_map(Option::take).for_each(|(k, v)| self.put_new(k, v)),
                None => {
                    self.copies += 1;
                    page.iter().flatten().for_each(|(k, v)| self.put_new(k.clone(), v.clone()));
                }
            }
        }
    }

    /// Put an entry whose key is not in the map (no growth).
    fn put_new(&mut self, k: K, v: V) {
        let (i, _) = self.find(&k, stable_hash(&k));
        *self.slot_mut(i) = Some((k, v));
    }

    /// Remove `k`'s entry (backward-shift deletion: the entries after it in its run move up, so
    /// that no probe stops early at the hole).
    pub fn remove(&mut self, k: &K) -> Option<V> {
        let (mut hole, found) = self.find(k, stable_hash(k));
        if !found {
            return None;
        }
        let (_, v) = self.slot_mut(hole).take().expect("found");
        self.len -= 1;
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let Some((kj, _)) = self.slot(j) else { break };
            let h = home(stable_hash(kj), self.mask);
            // The entry at j may move to the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j { hole < h && h <= j } else { hole < h || h <= j };
            if !stays {
                let moved = self.slot_mut(j).take();
                *self.slot_mut(hole) = moved;
                hole = j;
            }
        }
        Some(v)
    }

    /// Every entry, for writing (takes every page back).
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&K, &mut V) -> bool) {
        for i in 0..=self.mask {
            if self.slot(i).is_none() {
                continue;
            }
            if let Some((k, v)) = self.slot_mut(i) {
                if !f(k, v) {
                    return;
                }
            }
        }
    }

    /// Share every page with a snapshot: one reference count per page, whatever the entries
    /// hold. Writes after it copy a page only while the snapshot still holds it.
    pub fn freeze(&mut self) -> Frozen<K, V> {
        self.meta.iter_mut().for_each(|m| m.owned = false);
        Frozen { pages: self.pages.clone(), range: self.range, max_parallelism: self.max_parallelism }
    }
}

/// The pages of a [`CowMap`] as they were at a barrier, encoded off the task thread.
pub(crate) struct Frozen<K, V> {
    pages: Vec<Page<K, V>>,
    range: KeyGroupRange,
    max_parallelism: u32,
}

impl<K: Key, V: Send + Sync + 'static> Frozen<K, V> {
    /// Keyed state, one blob of concatenated `(key, value)` pairs per non-empty key group, the
    /// value being what `project` makes of an entry (`None` leaves the entry out). Each page is
    /// let go of as soon as it is encoded, so that the task need not copy it.
    pub fn encode<W: Serialize + ?Sized>(
        self,
        uid: &str,
        project: impl Fn(&V) -> Option<&W>,
    ) -> Result<ElementState, String> {
        let (range, max_parallelism) = (self.range, self.max_parallelism);
        let mut groups: Vec<Vec<u8>> = vec![Vec::new(); range.len() as usize];
        for page in self.pages {
            for (k, v) in page.iter().flatten() {
                let Some(w) = project(v) else { continue };
                let kg = key_group_of_hash(stable_hash(k), max_parallelism);
                // Invariant: the router only ever sent this subtask keys of its own key groups.
                assert!(range.contains(KeyGroup(kg)), "{uid}: key of key group {kg} outside {range:?}");
                let buf = &mut groups[(kg - range.start) as usize];
                let taken = std::mem::take(buf);
                *buf = postcard::to_extend(&(k, w), taken).map_err(|e| format!("{uid}: encoding a key: {e}"))?;
            }
        }
        let groups = groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .map(|(i, g)| (range.start + i as u32, g))
            .collect();
        Ok(ElementState::Keyed { max_parallelism, groups })
    }
}

#[cfg(test)]
#[path = "cow_map_tests.rs"]
mod tests;
