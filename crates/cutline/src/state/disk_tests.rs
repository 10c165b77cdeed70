//! Tests of [`DiskMap`]: a model check against `HashMap` through flushes of a small cache, and
//! snapshots (whole and incremental) that must see the state of their barrier whatever the task
//! writes and flushes after it.

use super::*;
use crate::state::splitmix64;
use crate::state::testkit::{apply, decode, sorted};
use std::collections::{BTreeMap, HashMap};

fn disk(dir: &Path, cache: usize) -> DiskMap<u64, u64> {
    DiskMap::create(dir, &format!("test-{cache}"), KeyGroupRange::for_subtask(128, 1, 0), 128, cache).unwrap()
}

#[test]
fn reads_writes_and_removes_agree_with_a_hash_map_through_flushes() {
    let dir = tempfile::tempdir().unwrap();
    for cache in [1, 7, 1_000] {
        let (mut m, mut model) = (disk(dir.path(), cache), HashMap::new());
        for i in 0..20_000u64 {
            let r = splitmix64(i ^ cache as u64);
            let k = r % 500;
            match r >> 62 {
                0 => {
                    m.insert(k, None).unwrap();
                    model.remove(&k);
                }
                1 => {
                    assert_eq!(m.insert(k, Some(i)).unwrap(), model.insert(k, i).is_some(), "key {k} had state");
                }
                _ => match m.get_mut(&k).unwrap() {
                    Some(v) => {
                        let v = v.as_mut().expect("a key with state");
                        *v += 1;
                        *model.get_mut(&k).expect("the model has it too") += 1;
                    }
                    None => assert!(!model.contains_key(&k), "key {k} lost its state (cache {cache})"),
                },
            }
        }
        let frozen = m.freeze(CheckpointId(1), None).unwrap();
        assert_eq!(decode(frozen.encode("op", true).unwrap()), sorted(&model), "cache of {cache}");
    }
}

#[test]
fn an_incremental_snapshot_on_top_of_its_base_is_the_state_at_its_barrier() {
    // As the in-memory table's test: each snapshot is encoded only after the next interval's
    // writes (and flushes) went on, on top of a base that lags by a few checkpoints and only moves
    // forward; one in five encoded whole.
    let dir = tempfile::tempdir().unwrap();
    for (keys, cache) in [(50u64, 4), (3_000, 256), (20_000, 100_000)] {
        let mut m = disk(dir.path(), cache);
        let mut model = HashMap::new();
        let mut at: BTreeMap<u64, HashMap<u64, u64>> = Default::default();
        let mut base: Option<u64> = None;
        let mut pending: Option<(u64, Option<u64>, DiskFrozen)> = None;
        let (mut deltas, mut wholes) = (0, 0);
        for i in 0..60_000u64 {
            let r = splitmix64(i ^ keys.rotate_left(17));
            let k = r % keys;
            match r >> 62 {
                0 => {
                    m.insert(k, None).unwrap();
                    model.remove(&k);
                }
                1 => {
                    m.insert(k, Some(i)).unwrap();
                    model.insert(k, i);
                }
                _ => {
                    if let Some(v) = m.get_mut(&k).unwrap() {
                        *v.as_mut().unwrap() += 1;
                        *model.get_mut(&k).unwrap() += 1;
                    }
                }
            }
            if i % 1_000 != 999 {
                continue;
            }
            if let Some((c, b, frozen)) = pending.take() {
                let incremental = !splitmix64(c ^ 0x5eed).is_multiple_of(5);
                let got = match frozen.encode("op", incremental).unwrap() {
                    state @ ElementState::KeyedDelta { .. } => {
                        deltas += 1;
                        apply(&at[&b.expect("a delta has a base")], state)
                    }
                    state => {
                        wholes += 1;
                        decode(state).into_iter().collect()
                    }
                };
                assert_eq!(got, at[&c], "snapshot {c} on top of {b:?} with {keys} keys, cache {cache}");
            }
            let c = i / 1_000 + 1;
            let pick = splitmix64(c ^ keys);
            if pick.is_multiple_of(3) {
                let candidate = c.saturating_sub(1 + (pick >> 8) % 4);
                if candidate > base.unwrap_or(0) && at.contains_key(&candidate) {
                    base = Some(candidate);
                }
            }
            let frozen = m.freeze(CheckpointId(c), base.map(CheckpointId)).unwrap();
            assert_eq!(frozen.can_be_incremental(), base.is_some(), "every base was frozen here");
            at.insert(c, model.clone());
            pending = Some((c, base, frozen));
        }
        assert!(deltas > 10 && wholes > 0, "{keys} keys: {deltas} incremental and {wholes} whole snapshots");
    }
}

#[test]
fn writes_during_a_restore_are_not_logged_and_the_next_snapshot_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = disk(dir.path(), 16);
    m.track_changes(false).unwrap();
    for k in 0..1_000u64 {
        m.insert(k, Some(k)).unwrap();
    }
    m.track_changes(true).unwrap();
    assert!(m.interval.is_empty(), "the restored keys are not logged");
    let frozen = m.freeze(CheckpointId(7), Some(CheckpointId(6))).unwrap();
    assert!(!frozen.can_be_incremental(), "nothing was frozen for the base");
    assert_eq!(decode(frozen.encode("op", true).unwrap()).len(), 1_000);
}

#[test]
fn end_of_input_sees_every_key_and_its_changes_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = disk(dir.path(), 3);
    for k in 0..100u64 {
        m.insert(k, Some(k)).unwrap();
    }
    let mut seen = 0;
    m.for_each_mut(|k, v| {
        seen += 1;
        *v = if k % 2 == 0 { None } else { Some(k * 10) };
        true
    })
    .unwrap();
    assert_eq!(seen, 100);
    let got = decode(m.freeze(CheckpointId(1), None).unwrap().encode("op", false).unwrap());
    assert_eq!(got, (0..100u64).filter(|k| k % 2 == 1).map(|k| (k, k * 10)).collect::<Vec<_>>());
}

#[test]
fn the_store_file_goes_with_the_map_and_its_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = disk(dir.path(), 16);
    m.insert(1, Some(1)).unwrap();
    let frozen = m.freeze(CheckpointId(1), None).unwrap();
    let files = || std::fs::read_dir(dir.path()).unwrap().count();
    drop(m);
    assert_eq!(files(), 1, "a snapshot still reads it");
    assert_eq!(decode(frozen.encode("op", false).unwrap()), [(1, 1)]);
    assert_eq!(files(), 0);
}

#[test]
fn stores_of_processes_that_are_gone_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    // No process has pid 2^22 + 1 (above Linux's pid_max limit).
    std::fs::write(dir.path().join("4194305-job-op-0-1.redb"), b"left by a killed process").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"not ours").unwrap();
    let m = disk(dir.path(), 16);
    let ours = m.path().file_name().unwrap().to_str().unwrap().to_string();
    assert!(ours.starts_with(&format!("{}-test-16-", std::process::id())), "{ours}");
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, [ours, "notes.txt".to_string()]);
    drop(m);
}
