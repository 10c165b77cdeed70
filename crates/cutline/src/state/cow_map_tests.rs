//! Tests of [`CowMap`]: a model-checked sequence of operations, and snapshots that must see the
//! state of their barrier whatever the task writes after it.

use super::*;
use crate::state::splitmix64;
use crate::state::testkit::{apply, decode, sorted};
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
    assert_eq!(m.take_copies(), 0, "freezing copies nothing");
    for k in 0..10_000u64 {
        *m.get_mut(&k).unwrap() += 1_000;
        m.remove(&(k + 10_000));
    }
    // More than doubles the entries: the table grows while the snapshot holds the old pages.
    for k in 100_000..150_000u64 {
        m.insert(k, 1);
    }
    assert_eq!(decode(frozen.encode("op", |v| Some(v), false).unwrap()), sorted(&model));
    assert!(m.take_copies() > 0, "writes to pages still held copy them");
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
    assert_eq!(m.take_copies(), 0, "no page is copied once the snapshot is encoded");
    let later = m.freeze_whole();
    m.insert(1, 1);
    assert_eq!(m.take_copies(), 1, "one write copies one page");
    assert!(decode(later.encode("op", |v| Some(v), false).unwrap()).iter().all(|&(_, v)| v == 0));
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

#[test]
fn an_incremental_snapshot_on_top_of_its_base_is_the_state_at_its_barrier() {
    // Each snapshot is encoded only after the writes of the next interval (copy-on-write and
    // stamps both matter), on top of a base that lags by a random number of checkpoints and only
    // moves forward; 400 checkpoints, so that stamps wrap around; one in five encoded whole. Few
    // keys and many removals overflow the removal log: then the next snapshot is whole.
    let range = KeyGroupRange::for_subtask(128, 1, 0);
    for keys in [50u64, 3_000, 40_000] {
        let mut m = CowMap::<u64, u64>::incremental(range, 128);
        let mut model = HashMap::new();
        let mut at: std::collections::BTreeMap<u64, HashMap<u64, u64>> = Default::default();
        let mut base: Option<u64> = None;
        let mut pending: Option<(u64, Option<u64>, Frozen<u64, u64>)> = None;
        let (mut deltas, mut wholes) = (0, 0);
        for i in 0..400_000u64 {
            let r = splitmix64(i ^ keys.rotate_left(17));
            let k = r % keys;
            match r >> 62 {
                0 => {
                    m.remove(&k);
                    model.remove(&k);
                }
                1 => {
                    m.insert(k, i);
                    model.insert(k, i);
                }
                _ => {
                    if let Some(v) = m.get_mut(&k) {
                        *v += 1;
                        *model.get_mut(&k).unwrap() += 1;
                    }
                }
            }
            if i % 1_000 != 999 {
                continue;
            }
            if let Some((c, b, frozen)) = pending.take() {
                // The writer may want it whole although it could be incremental (a long chain).
                let incremental = !splitmix64(c ^ 0x5eed).is_multiple_of(5);
                let got = match frozen.encode("op", |v| Some(v), incremental).unwrap() {
                    state @ ElementState::KeyedDelta { .. } => {
                        deltas += 1;
                        apply(&at[&b.expect("a delta has a base")], state)
                    }
                    state => {
                        wholes += 1;
                        decode(state).into_iter().collect()
                    }
                };
                assert_eq!(got, at[&c], "snapshot {c} on top of {b:?} with {keys} keys");
            }
            let c = i / 1_000 + 1;
            let pick = splitmix64(c ^ keys);
            if pick.is_multiple_of(3) {
                // A newer completed checkpoint, a few behind.
                let candidate = c.saturating_sub(1 + (pick >> 8) % 4);
                if candidate > base.unwrap_or(0) && at.contains_key(&candidate) {
                    base = Some(candidate);
                }
            }
            let frozen = m.freeze(CheckpointId(c), base.map(CheckpointId));
            at.insert(c, model.clone());
            pending = Some((c, base, frozen));
        }
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
