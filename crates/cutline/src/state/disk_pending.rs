//! [`PendingRestore`]: the restored key groups a [`DiskMap`](super::DiskMap)'s writer thread has yet
//! to write into the store. The task starts processing as soon as its groups are merged; the
//! writer fills the store behind it, a group at a time in key order, and until it has, the task
//! reads a key of a group not yet written here (a binary search in the group's sorted records).
//!
//! **Invariant:** the writer writes the groups in order and counts one as filled only after its
//! transaction committed; a view of the store opened after the task read that count holds every
//! group counted. Caches the task hands over after the restore are written after every group.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Bytes of restored records (and their index) a store keeps in memory for its writer to fill the
/// store with after the task started; a group that does not fit any more is written during the
/// restore, before the task starts, as all restores did before. (The checkpoint's files are in
/// memory while a job restores anyway: this at most doubles that, until the writer wrote them all.)
pub const LAZY_RESTORE_MAX_BYTES: usize = 256 << 20;

/// What `records` cost held here: their bytes and their index.
pub(super) fn held_bytes(records: &[(&[u8], &[u8])]) -> usize {
    records.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
        + records.len() * std::mem::size_of::<(usize, usize)>()
}

/// Refuse restored records of key group `kg` that are not sorted by key, each key once (the
/// store does not check: a key written twice would keep the later value silently).
pub(super) fn check_sorted(kg: u32, records: &[(&[u8], &[u8])]) -> Result<(), String> {
    if records.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(format!(
            "restoring key group {kg}: its records are not sorted, or a key is stored twice; the checkpoint is inconsistent"
        ));
    }
    Ok(())
}

/// One restored key group: its records, sorted by stored key.
struct PendingGroup {
    kg: u32,
    /// The records, each its stored key (without the group) then its stored value, concatenated.
    bytes: Vec<u8>,
    /// Per record, where its key ends and where it ends in `bytes`; it starts where the one before
    /// ends.
    ends: Vec<(usize, usize)>,
}

impl PendingGroup {
    fn record(&self, i: usize) -> (&[u8], &[u8]) {
        let start = if i == 0 { 0 } else { self.ends[i - 1].1 };
        let (key_end, end) = self.ends[i];
        (&self.bytes[start..key_end], &self.bytes[key_end..end])
    }

    fn get(&self, key: &[u8]) -> Option<&[u8]> {
        let (mut lo, mut hi) = (0, self.ends.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (k, v) = self.record(mid);
            match k.cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(v),
            }
        }
        None
    }
}

/// Where a key's restored value is.
pub(super) enum Lookup<'a> {
    /// In the store (its group was written, or had no restored records).
    Store,
    /// Here: the group is not yet written (`None`: the key had no state at the checkpoint).
    Pending(Option<&'a [u8]>),
}

/// Restored key groups, ascending, waiting for the writer.
#[derive(Default)]
pub(super) struct PendingRestore {
    groups: Vec<PendingGroup>,
    bytes: usize,
    /// How many of `groups`, from the first, the store holds (committed).
    filled: AtomicUsize,
    /// The task is gone and no snapshot needs the store: the writer stops between groups.
    abandoned: AtomicBool,
    /// Why the writer could not write them (the task fails on its next read).
    failure: OnceLock<String>,
    /// Tests: the writer waits for this before it writes anything.
    #[cfg(test)]
    pub hold: Option<std::sync::Arc<super::disk_writer::Slot<()>>>,
}

impl PendingRestore {
    /// Bytes of records held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Add key group `kg`'s records (stored keys without their group, and stored values), which
    /// must be sorted by key, each key once. The caller checks the groups ascend.
    pub fn push(&mut self, kg: u32, records: &[(&[u8], &[u8])]) -> Result<(), String> {
        check_sorted(kg, records)?;
        if records.is_empty() {
            return Ok(());
        }
        let len = records.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.bytes += held_bytes(records);
        let mut group = PendingGroup { kg, bytes: Vec::with_capacity(len), ends: Vec::with_capacity(records.len()) };
        for (k, v) in records {
            group.bytes.extend_from_slice(k);
            let key_end = group.bytes.len();
            group.bytes.extend_from_slice(v);
            group.ends.push((key_end, group.bytes.len()));
        }
        self.groups.push(group);
        Ok(())
    }

    /// Groups the store holds so far.
    pub fn filled(&self) -> usize {
        self.filled.load(Ordering::Acquire)
    }

    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Why the writer could not fill the store, if it could not.
    pub fn failure(&self) -> Option<&String> {
        self.failure.get()
    }

    /// Stop writing: the store will not be read again.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
    }

    #[cfg(test)]
    pub fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }

    /// Where stored key `key` (its group first) is, for a view that holds the first `in_view` groups.
    pub fn lookup(&self, key: &[u8], in_view: usize) -> Lookup<'_> {
        let Some(kg) = key.get(..4).map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes"))) else {
            return Lookup::Store;
        };
        match self.groups.binary_search_by_key(&kg, |g| g.kg) {
            Ok(i) if i >= in_view => Lookup::Pending(self.groups[i].get(&key[4..])),
            _ => Lookup::Store,
        }
    }

    /// The writer: each group's key group and records, in order; `filled` counts one after
    /// `write` committed it. An error (or the task gone) stops it; the task sees the error.
    pub fn fill<'a>(
        &'a self,
        write: impl FnMut(u32, &mut dyn Iterator<Item = (&'a [u8], &'a [u8])>) -> Result<(), String>,
    ) -> Result<(), String> {
        let filled = self.fill_groups(write);
        if let Err(e) = &filled {
            let _ = self.failure.set(e.clone());
        }
        filled
    }

    fn fill_groups<'a>(
        &'a self,
        mut write: impl FnMut(u32, &mut dyn Iterator<Item = (&'a [u8], &'a [u8])>) -> Result<(), String>,
    ) -> Result<(), String> {
        #[cfg(test)]
        if let Some(hold) = &self.hold {
            hold.get()?;
        }
        for (i, g) in self.groups.iter().enumerate() {
            if self.abandoned.load(Ordering::Relaxed) {
                return Err("the task ended before its restored state was written to its local store".into());
            }
            write(g.kg, &mut (0..g.ends.len()).map(|r| g.record(r)))?;
            self.filled.store(i + 1, Ordering::Release);
        }
        Ok(())
    }
}
