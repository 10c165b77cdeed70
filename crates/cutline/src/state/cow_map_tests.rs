//! Tests of [`CowMap`]: a model-checked sequence of operations, and snapshots that must see the
//! state of their barrier whatever the task writes after it.

use super::*;
use crate::state::splitmix64;
use crate::state::testkit::{decode, incremental_snapshots_are_the_state_at_their_barrier, sorted, Snapshotted};
use crate::state::ElementState;
use std::collections::HashMap;

fn map() -> CowMap<u64, u64> {
    CowMap::new(KeyGroupRange::for_subtask(128, 1, 0), 128)
}

#[test]
fn inserts_updates_and_removes_agree_with_a_hash_map() {
    // Few distinct keys and many removals: long probe runs, backward shifts across page ends and
    // around the table's end, growth in the middle.
    for keys in [50u64, 3_000, 40_000] {
        let (mut m, mut model) = (map(), HashMap::new());
        for i in 0..200_000u64 {
            let r = splitmix64(i ^ keys);
            let k = r % keys;
            match r >> 62 {
                0 => assert_eq!(m.remove(&k), model.remove(&k), "remove {k}"),
                1 => assert_eq!(m.insert(k, i), model.insert(k, i), "insert {k}"),
                _ => {
                    assert_eq!(m.get_mut(&k).map(|v| *v), model.get(&k).copied(), "get {k}");
                    if let Some(v) = m.get_mut(&k) {
                        *v += 1;
                        *model.get_mut(&k).unwrap() += 1;
                    }
                }
            }
        }
        assert_eq!(m.len(), model.len());
        for k in 0..keys {
            assert_eq!(m.get(&k), model.get(&k), "key {k} of {keys}");
        }
        assert_eq!(decode(m.freeze_whole().encode("op", |v| Some(v), false).unwrap()), sorted(&model));
    }
}

#[test]
fn a_snapshot_sees_the_state_at_its_barrier_whatever_is_written_after() {
    let mut m = map();
    let mut model = HashMap::new();
    for k in 0..20_000u64 {
        m.insert(k, k);
        model.insert(k, k);
    }
    let frozen = m.freeze_whole();
    assert_eq!(m.take_copies(), Copies::default(), "freezing copies nothing");
    for k in 0..10_000u64 {
        *m.get_mut(&k).unwrap() += 1_000;
        m.remove(&(k + 10_000));
    }
    // More than doubles the entries: the table grows while the snapshot holds the old pages.
    for k in 100_000..150_000u64 {
        m.insert(k, 1);
    }
    assert_eq!(decode(frozen.encode("op", |v| Some(v), false).unwrap()), sorted(&model));
    assert!(m.take_copies().pages > 0, "writes to many entries of pages still held copy the pages");
    assert_eq!(m.len(), 60_000);
    assert_eq!(m.get(&3), Some(&1_003));
    assert_eq!(m.get(&10_003), None);
}

#[test]
fn a_page_the_snapshot_let_go_of_is_taken_back_without_a_copy() {
    let mut m = map();
    for k in 0..20_000u64 {
        m.insert(k, k);
    }
    assert_eq!(decode(m.freeze_whole().encode("op", |v| Some(v), false).unwrap()).len(), 20_000);
    for k in 0..20_000u64 {
        m.insert(k, 0);
    }
    assert_eq!(m.take_copies(), Copies::default(), "nothing is copied once the snapshot is encoded");
    let later = m.freeze_whole();
    m.insert(1, 1);
    assert_eq!(m.take_copies(), Copies { pages: 0, entries: 1 }, "one write saves one entry, copies no page");
    assert!(decode(later.encode("op", |v| Some(v), false).unwrap()).iter().all(|&(_, v)| v == 0));
}

/// Entries over several pages, frozen; some written before the snapshot is read, more while
/// another thread reads it, 24 times over. Each snapshot must be the state at its barrier, and no
/// page copied.
#[test]
fn a_snapshot_read_on_another_thread_while_the_task_writes_in_place_is_its_barrier() {
    let mut m = map();
    let keys = 300_000u64;
    let mut model = HashMap::new();
    for k in 0..keys {
        m.insert(k, k);
        model.insert(k, k);
    }
    assert!(m.pages.len() >= 4, "{} pages", m.pages.len());
    // Returns the keys written that the model held before.
    let write = |m: &mut CowMap<u64, u64>, model: &mut HashMap<u64, u64>, round: u64| {
        let mut held = std::collections::HashSet::new();
        for i in 0..2_000u64 {
            let k = splitmix64(i ^ round) % keys;
            let k = if i % 4 == 1 { keys + splitmix64(i + round) % 1_000 } else { k };
            if model.contains_key(&k) {
                held.insert(k);
            }
            match i % 4 {
                0 => assert_eq!(m.remove(&k), model.remove(&k)),
                1 => assert_eq!(m.insert(k, i), model.insert(k, i)),
                _ => {
                    if let Some(v) = m.get_mut(&k) {
                        *v += 1;
                        *model.get_mut(&k).expect("the model has it too") += 1;
                    }
                }
            }
        }
        held
    };
    for checkpoint in 1..=24u64 {
        let at_barrier = sorted(&model);
        let frozen = m.freeze(CheckpointId(checkpoint), None);
        // Before the reader starts: each entry these overwrite is saved.
        let saved_at_least = write(&mut m, &mut model, checkpoint * 100).len() as u64;
        let reader = std::thread::spawn(move || decode(frozen.encode("op", |v| Some(v), false).unwrap()));
        for round in 1..20 {
            write(&mut m, &mut model, checkpoint * 100 + round);
        }
        assert_eq!(reader.join().unwrap(), at_barrier, "snapshot {checkpoint}");
        let copies = m.take_copies();
        assert!(
            copies.pages == 0 && copies.entries >= saved_at_least,
            "{saved_at_least} entries saved, no page copied: {copies:?}"
        );
    }
}

#[test]
fn a_page_with_many_entries_written_under_a_snapshot_is_copied_once() {
    let mut m = map();
    let mut model = HashMap::new();
    for k in 0..20_000u64 {
        m.insert(k, k);
        model.insert(k, k);
    }
    assert_eq!(m.pages.len(), 1);
    let frozen = m.freeze_whole();
    let limit = (m.mask + 1) / super::super::cow_page::MAX_SAVED_SHARE;
    for k in 0..limit as u64 {
        *m.get_mut(&k).unwrap() += 1;
    }
    assert_eq!(m.take_copies(), Copies { pages: 0, entries: limit as u64 }, "{limit} entries saved");
    for k in 0..20_000u64 {
        *m.get_mut(&k).unwrap() += 1;
    }
    assert_eq!(m.take_copies(), Copies { pages: 1, entries: 0 }, "the page copied once, at the limit");
    assert_eq!(decode(frozen.encode("op", |v| Some(v), false).unwrap()), sorted(&model));
    assert_eq!(m.get(&0), Some(&2));
}

#[test]
fn freezing_costs_one_reference_per_page() {
    let mut m = map();
    for k in 0..100_000u64 {
        m.insert(k, k);
    }
    let pages = m.pages.len();
    assert!(pages <= 100_000 * MAX_LOAD_DEN / MAX_LOAD_NUM / page_slots::<u64, u64>() * 2 + 1, "{pages} pages");
    let frozen = m.freeze_whole();
    assert_eq!(frozen.pages.len(), pages);
    assert!(m.pages.iter().all(|p| Arc::strong_count(p) == 2), "shared, not copied");
}

#[test]
fn the_projection_leaves_entries_out() {
    let mut m: CowMap<u64, Option<u64>> = CowMap::new(KeyGroupRange::for_subtask(128, 1, 0), 128);
    m.insert(1, Some(10));
    m.insert(2, None);
    assert_eq!(decode(m.freeze_whole().encode("op", Option::as_ref, false).unwrap()), [(1, 10)]);
}

impl Snapshotted for CowMap<u64, u64> {
    type Frozen = Frozen<u64, u64>;
    fn put(&mut self, k: u64, v: u64) {
        self.insert(k, v);
    }
    fn delete(&mut self, k: u64) {
        self.remove(&k);
    }
    fn bump(&mut self, k: u64) -> bool {
        self.get_mut(&k).map(|v| *v += 1).is_some()
    }
    fn freeze_at(&mut self, checkpoint: u64, base: Option<u64>) -> Self::Frozen {
        self.freeze(CheckpointId(checkpoint), base.map(CheckpointId))
    }
    fn encode_frozen(frozen: Self::Frozen, incremental: bool) -> ElementState {
        frozen.encode("op", |v| Some(v), incremental).unwrap()
    }
}

#[test]
fn an_incremental_snapshot_on_top_of_its_base_is_the_state_at_its_barrier() {
    // 400 checkpoints, so that stamps wrap around. Few keys and many removals overflow the removal
    // log: then the next snapshot is whole.
    for keys in [50u64, 3_000, 40_000] {
        let mut m = CowMap::<u64, u64>::incremental(KeyGroupRange::for_subtask(128, 1, 0), 128);
        let (deltas, wholes) = incremental_snapshots_are_the_state_at_their_barrier(&mut m, keys, 400, "in memory");
        assert!(deltas > 20 && wholes > 0, "{keys} keys: {deltas} incremental and {wholes} whole snapshots");
    }
}

#[test]
fn a_whole_snapshot_after_the_removal_log_overflowed() {
    let range = KeyGroupRange::for_subtask(128, 1, 0);
    let mut m = CowMap::<u64, u64>::incremental(range, 128);
    m.insert(1, 1);
    drop(m.freeze(CheckpointId(1), None));
    for k in 0..(MIN_REMOVALS_LOGGED as u64 + 1) {
        m.insert(k + 10, k);
        m.remove(&(k + 10));
    }
    assert!(!m.freeze(CheckpointId(2), Some(CheckpointId(1))).can_be_incremental());
    m.remove(&1);
    assert!(m.freeze(CheckpointId(3), Some(CheckpointId(2))).can_be_incremental());
}

#[test]
fn a_whole_snapshot_of_a_map_that_removed_keys_since_its_base_regression_removals_indexed_whole() {
    // The writer may encode whole what could be incremental; the keys removed since the base are
    // then nothing to it (it panicked indexing per-group removals it had not allocated).
    let mut m = CowMap::<u64, u64>::incremental(KeyGroupRange::for_subtask(128, 1, 0), 128);
    m.insert(1, 1);
    m.insert(2, 2);
    drop(m.freeze(CheckpointId(1), None));
    m.remove(&1);
    let frozen = m.freeze(CheckpointId(2), Some(CheckpointId(1)));
    assert!(frozen.can_be_incremental());
    assert_eq!(decode(frozen.encode("op", |v| Some(v), false).unwrap()), [(2, 2)]);
}
