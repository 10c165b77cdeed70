//! One page of a [`CowMap`](super::CowMap) ([`PageBuf`]): its slots and their stamps, and how the
//! page is shared with the snapshot that reads it ([`Sharing`]).
//!
//! A page frozen for one snapshot alone is not copied when the task writes to it: before the task
//! first writes to a slot the snapshot has not read yet, it saves that slot's entry and stamp in the
//! page's [`Sharing`], and the snapshot reads the saved entry instead of the slot. Memory during a
//! snapshot then grows with the entries written meanwhile, not with the pages they lie in (a key
//! written anywhere in a 2 MiB page used to copy all of it). The snapshot reads the page a run of
//! [`RUN_SLOTS`] slots at a time under the page's lock, and the task saves entries under the same
//! lock, so the snapshot never reads a slot the task writes.
//!
//! A page frozen by a second snapshot before the first let go of it (or one whose saved entries
//! reach 1/[`MAX_SAVED_SHARE`] of its slots) is copied whole before the task writes to it, as before.
//!
//! **Invariant:** the task writes a slot of a page a snapshot still holds only if the page's
//! [`Sharing`] says no snapshot reads that slot from the page any more (its entry is saved, or the
//! reader read past it, or the reader is done).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Bytes of a full page (the unit a page is copied in): one transparent huge page, so that a lookup
/// in a large table does not also miss the TLB.
pub(crate) const PAGE_BYTES: usize = 2 << 20;

/// A slot of a page: empty, or a key and its entry.
pub(crate) type Slot<K, V> = Option<(K, V)>;

/// Counts freezes of one map: writes between two freezes carry the same epoch.
pub(crate) type Epoch = u32;

/// What a slot keeps of the epoch it was last written in: its low byte. The age of a write,
/// `(epoch now - stamp) mod 256`, is exact for writes of the last 255 epochs; an older one may look
/// younger (and be written again by an incremental snapshot: harmless), never older, and a base is
/// at most `cow_map::FREEZES_KEPT` epochs old. One byte per slot: the stamps of a million-key table
/// fit in the cache that the slots do not.
pub(crate) type Stamp = u8;

/// Slots a snapshot reads under one hold of a shared page's lock: how long the task may wait for the
/// lock (the writer encodes the run while it holds it; not measured) against how often the writer
/// takes it.
pub(super) const RUN_SLOTS: usize = 1024;

/// Most entries saved for a page, as a share of its slots (1 / this): beyond it the page is copied
/// whole, which costs less memory than saving every entry one by one.
pub(super) const MAX_SAVED_SHARE: usize = 16;

/// How a page is shared with the snapshot writer that reads it.
pub(super) struct Sharing<K, V> {
    /// The freeze whose snapshot reads the page while the task writes to it in place; `None`: no
    /// snapshot does (never frozen, or the reader is done with it).
    reader: Option<Epoch>,
    /// Frozen again while a snapshot held it (or too many entries saved): the task copies the page
    /// before it writes to it again.
    pinned: bool,
    /// Slots below it were read by the reader already: the task writes them freely.
    upto: usize,
    /// One bit per slot: its entry as of the freeze is in `saved`.
    saved_bits: Vec<u64>,
    saved: HashMap<u32, (Slot<K, V>, Stamp)>,
}

impl<K, V> Sharing<K, V> {
    fn new() -> Self {
        Sharing { reader: None, pinned: false, upto: 0, saved_bits: Vec::new(), saved: HashMap::new() }
    }

    fn is_saved(&self, i: usize) -> bool {
        self.saved_bits.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }
}

/// What the task must do before it writes to a slot of a page a snapshot still holds.
pub(super) enum BeforeWrite {
    /// Write in place: no snapshot reads that slot from the page.
    InPlace,
    /// Write in place: the slot's entry was saved for the snapshot just now.
    Saved,
    /// Copy the page and write to the copy.
    Copy,
}

/// The slots of one page, in an allocation aligned to a cache line, and their stamps (the epoch each
/// slot was last written in) in another.
pub(super) struct PageBuf<K, V> {
    pub(super) ptr: std::ptr::NonNull<Slot<K, V>>,
    pub(super) stamps: std::ptr::NonNull<Stamp>,
    len: usize,
    sharing: Mutex<Sharing<K, V>>,
}

// SAFETY: a `PageBuf` owns its slots as a `Box<[Slot<K, V>]>` would.
unsafe impl<K: Send, V: Send> Send for PageBuf<K, V> {}
// SAFETY: as above; `&PageBuf` gives only `&Slot`, and slots the task writes while a snapshot holds
// the page are never read through it (see the module's invariant).
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for PageBuf<K, V> {}

/// Bytes of a cache line: pages start at one, so that a slot whose size divides it never spans two
/// (a `Vec`'s or an `Arc`'s slice starts 16 bytes into a line: every other 32-byte slot would cost
/// two cache misses).
const LINE: usize = 64;

impl<K, V> PageBuf<K, V> {
    fn layout(len: usize) -> std::alloc::Layout {
        let array = std::alloc::Layout::array::<Slot<K, V>>(len).expect("a page's layout");
        let align = if array.size() >= PAGE_BYTES / 2 { PAGE_BYTES } else { LINE };
        array.align_to(align).expect("a page's layout")
    }

    pub(super) fn new(len: usize) -> Self {
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
        let stamps_layout = Self::stamps_layout(len);
        // SAFETY: a non-zero size (`len > 0`); zeroed memory is a valid `[Stamp]`.
        let raw = unsafe { std::alloc::alloc_zeroed(stamps_layout) } as *mut Stamp;
        let Some(stamps) = std::ptr::NonNull::new(raw) else { std::alloc::handle_alloc_error(stamps_layout) };
        PageBuf { ptr, stamps, len, sharing: Mutex::new(Sharing::new()) }
    }

    fn stamps_layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::array::<Stamp>(len).and_then(|l| l.align_to(LINE)).expect("a page's layout")
    }

    fn sharing(&self) -> MutexGuard<'_, Sharing<K, V>> {
        // A panic while holding it left plain data behind (bits and saved entries are set together).
        self.sharing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The page is frozen for the snapshot of freeze `at`. `alone`: no other snapshot holds it (the
    /// caller holds the only reference), so the task may write to it in place while that snapshot
    /// reads it; otherwise the task copies it first.
    pub(super) fn frozen(&self, at: Epoch, alone: bool) {
        let mut s = self.sharing();
        if alone {
            *s = Sharing { reader: Some(at), ..Sharing::new() };
        } else {
            s.pinned = true;
        }
    }

    /// Before the task writes to slot `i` of this page, which a snapshot still holds: save the
    /// slot's entry for the snapshot if it has not read it yet, or ask for a copy of the page.
    /// Called on the task thread only (the only thread that writes slots).
    pub(super) fn before_write(&self, i: usize) -> BeforeWrite
    where
        K: Clone,
        V: Clone,
    {
        let mut s = self.sharing();
        if s.pinned {
            return BeforeWrite::Copy;
        }
        if s.reader.is_none() || i < s.upto || s.is_saved(i) {
            return BeforeWrite::InPlace;
        }
        if s.saved.len() >= self.len / MAX_SAVED_SHARE {
            // The saved entries stay the reader's; the task writes to a copy from now on.
            s.pinned = true;
            return BeforeWrite::Copy;
        }
        // SAFETY: `i < len`; only the task thread writes slots, and this is it, so reading the slot
        // races with nothing (the reader reads it too, but only reads).
        let entry = unsafe { (*self.ptr.as_ptr().add(i)).clone() };
        // SAFETY: as above, for the stamp.
        let stamp = unsafe { *self.stamps.as_ptr().add(i) };
        if s.saved_bits.is_empty() {
            s.saved_bits = vec![0; self.len.div_ceil(64)];
        }
        s.saved_bits[i / 64] |= 1 << (i % 64);
        s.saved.insert(i as u32, (entry, stamp));
        BeforeWrite::Saved
    }

    /// The page as it was at freeze `at`, a run of slots at a time: `f(first, stamps, slot)` with the
    /// run's first slot index, the run's stamps, and its slots by index within the run. Called on
    /// the snapshot writer's thread; the task may write to the page meanwhile if `at` is its reader.
    pub(super) fn read_as_of<E>(
        &self,
        at: Epoch,
        mut f: impl for<'a> FnMut(usize, &'a [Stamp], &'a dyn Fn(usize) -> &'a Slot<K, V>) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.sharing().reader != Some(at) {
            // Nobody writes to it in place (the task copies it first): it is as it was.
            // SAFETY: `len` initialised slots and stamps owned by `self`, written by no one while
            // this page is shared with a snapshot that is not its reader.
            let (slots, stamps) = unsafe {
                (
                    std::slice::from_raw_parts(self.ptr.as_ptr(), self.len),
                    std::slice::from_raw_parts(self.stamps.as_ptr(), self.len),
                )
            };
            return f(0, stamps, &|i| &slots[i]);
        }
        let mut stamps = [0 as Stamp; RUN_SLOTS];
        for first in (0..self.len).step_by(RUN_SLOTS) {
            let n = RUN_SLOTS.min(self.len - first);
            let mut s = self.sharing();
            for w in (0..n).step_by(64) {
                let (at_slot, m) = (first + w, 64.min(n - w));
                if s.saved_bits.get(at_slot / 64).is_none_or(|b| *b == 0) {
                    // SAFETY: no slot of these is saved, so the task has not written any of them
                    // since the freeze, and cannot start to while this thread holds the lock.
                    unsafe {
                        std::ptr::copy_nonoverlapping(self.stamps.as_ptr().add(at_slot), stamps.as_mut_ptr().add(w), m)
                    };
                    continue;
                }
                let bits = s.saved_bits[at_slot / 64];
                for j in (0..m).filter(|j| bits >> j & 1 == 0) {
                    // SAFETY: as above, for one slot that is not saved.
                    stamps[w + j] = unsafe { *self.stamps.as_ptr().add(at_slot + j) };
                }
                // Only the saved slots are looked up (a few per run when 1 % of the keys are hot).
                let mut rest = bits;
                while rest != 0 {
                    let j = rest.trailing_zeros() as usize;
                    rest &= rest - 1;
                    stamps[w + j] = s.saved[&((at_slot + j) as u32)].1;
                }
            }
            let saved = &s;
            let slot = |j: usize| -> &Slot<K, V> {
                assert!(j < n, "slot {j} of a run of {n}");
                match saved.is_saved(first + j) {
                    true => &saved.saved[&((first + j) as u32)].0,
                    // SAFETY: not saved, so not written since the freeze, and not while the lock
                    // is held (the reference does not outlive it: `f` returns first).
                    false => unsafe { &*self.ptr.as_ptr().add(first + j) },
                }
            };
            f(first, &stamps[..n], &slot)?;
            s.upto = first + n;
        }
        let mut s = self.sharing();
        s.reader = None;
        s.saved = HashMap::new();
        s.saved_bits = Vec::new();
        Ok(())
    }

    pub(super) fn stamps(&self) -> &[Stamp] {
        // SAFETY: `len` initialised stamps at `stamps`, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.stamps.as_ptr(), self.len) }
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
        // SAFETY: both hold `len` stamps; `copy` is new, so the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.stamps.as_ptr(), copy.stamps.as_ptr(), self.len) };
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
            std::alloc::dealloc(self.stamps.as_ptr(), Self::stamps_layout(self.len));
        }
    }
}
