//! Helpers of the state tests: snapshots of `u64 -> u64` maps (max parallelism 128) decoded, and
//! incremental ones applied on top of their base; the incremental-snapshot scenario every keyed
//! map runs.

use super::{key_group_of_hash, splitmix64, stable_hash, ElementState};
use std::collections::{BTreeMap, HashMap};

/// The pairs of a whole snapshot, sorted, each checked to be filed under its key group.
pub(crate) fn decode(state: ElementState) -> Vec<(u64, u64)> {
    let ElementState::Keyed { groups, .. } = state else { panic!("keyed") };
    let mut out = Vec::new();
    for (kg, blob) in groups {
        let mut rest: &[u8] = &blob;
        while !rest.is_empty() {
            let (pair, r): ((u64, u64), &[u8]) = postcard::take_from_bytes(rest).unwrap();
            assert_eq!(key_group_of_hash(stable_hash(&pair.0), 128), kg, "filed under its key group");
            out.push(pair);
            rest = r;
        }
    }
    out.sort();
    out
}

pub(crate) fn sorted(model: &HashMap<u64, u64>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
    v.sort();
    v
}

/// `base` with an incremental snapshot applied on top: removals first, then the records.
pub(crate) fn apply(base: &HashMap<u64, u64>, state: ElementState) -> HashMap<u64, u64> {
    let ElementState::KeyedDelta { groups, .. } = state else { panic!("incremental") };
    let mut out = base.clone();
    for (kg, upserts, removes) in groups {
        let mut rest: &[u8] = &removes;
        while !rest.is_empty() {
            let (k, r): (u64, &[u8]) = postcard::take_from_bytes(rest).unwrap();
            assert_eq!(key_group_of_hash(stable_hash(&k), 128), kg, "filed under its key group");
            out.remove(&k);
            rest = r;
        }
        let mut rest: &[u8] = &upserts;
        while !rest.is_empty() {
            let ((k, v), r): ((u64, u64), &[u8]) = postcard::take_from_bytes(rest).unwrap();
            assert_eq!(key_group_of_hash(stable_hash(&k), 128), kg, "filed under its key group");
            out.insert(k, v);
            rest = r;
        }
    }
    out
}

/// Snapshots apart that a write must be for [`incremental_snapshots_are_the_state_at_their_barrier`]
/// to require its key's absence from a delta that does not need it: the in-memory map stamps slots
/// with an epoch's low byte, and one written 256 epochs before a snapshot looks new to it.
const STAMPS_TELL_APART: u64 = 200;

/// The pairs an incremental snapshot writes, in no particular order.
fn upserts(state: &ElementState) -> Vec<(u64, u64)> {
    let ElementState::KeyedDelta { groups, .. } = state else { panic!("incremental") };
    let mut out = Vec::new();
    for (_, upserts, _) in groups {
        let mut rest: &[u8] = upserts;
        while !rest.is_empty() {
            let (pair, r): ((u64, u64), &[u8]) = postcard::take_from_bytes(rest).unwrap();
            out.push(pair);
            rest = r;
        }
    }
    out
}

/// A keyed map of `u64 -> u64` whose snapshots
/// [`incremental_snapshots_are_the_state_at_their_barrier`] checks: one scenario for every backend.
pub(crate) trait Snapshotted {
    type Frozen;
    fn put(&mut self, k: u64, v: u64);
    fn delete(&mut self, k: u64);
    /// Add one to `k`'s value, if it has one; whether it had.
    fn bump(&mut self, k: u64) -> bool;
    fn freeze_at(&mut self, checkpoint: u64, base: Option<u64>) -> Self::Frozen;
    fn encode_frozen(frozen: Self::Frozen, incremental: bool) -> ElementState;
}

/// Random writes over `keys` keys, a snapshot after every 1,000, `checkpoints` of them. Each
/// snapshot is encoded only after the writes of the next interval went on (copy-on-write, stamps
/// and flushes all matter), on top of a base that lags by a random number of checkpoints and only
/// moves forward, and one in five is encoded whole although it could be incremental (as a writer
/// does at the end of a long chain). Every one must decode to the model at its barrier, and an
/// incremental one must carry no pair its base holds already. Returns how
/// many were incremental and how many whole.
pub(crate) fn incremental_snapshots_are_the_state_at_their_barrier<M: Snapshotted>(
    m: &mut M,
    keys: u64,
    checkpoints: u64,
    label: &str,
) -> (u32, u32) {
    let mut model = HashMap::new();
    let mut at: BTreeMap<u64, HashMap<u64, u64>> = BTreeMap::new();
    let mut base: Option<u64> = None;
    let mut pending: Option<(u64, Option<u64>, M::Frozen)> = None;
    let (mut deltas, mut wholes) = (0, 0);
    // The snapshot each key was last written before.
    let mut written: HashMap<u64, u64> = HashMap::new();
    for i in 0..checkpoints * 1_000 {
        let r = splitmix64(i ^ keys.rotate_left(17));
        let k = r % keys;
        written.insert(k, i / 1_000 + 1);
        match r >> 62 {
            0 => {
                m.delete(k);
                model.remove(&k);
            }
            1 => {
                m.put(k, i);
                model.insert(k, i);
            }
            _ => {
                if m.bump(k) {
                    *model.get_mut(&k).expect("the model has it too") += 1;
                } else {
                    assert!(!model.contains_key(&k), "{label}: key {k} lost its state");
                }
            }
        }
        if i % 1_000 != 999 {
            continue;
        }
        if let Some((c, b, frozen)) = pending.take() {
            let incremental = !splitmix64(c ^ 0x5eed).is_multiple_of(5);
            let got = match M::encode_frozen(frozen, incremental) {
                state @ ElementState::KeyedDelta { .. } => {
                    deltas += 1;
                    let base = &at[&b.expect("a delta has a base")];
                    // Every write gives a key a value it never had: a pair the base holds already
                    // was not written since it, and is not the delta's to carry (unless its last
                    // write is older than a one-byte stamp tells apart: harmless, and rare).
                    for (k, v) in upserts(&state) {
                        // (A key written again since snapshot `c` is not checked.)
                        if c.checked_sub(written[&k]).is_some_and(|age| age < STAMPS_TELL_APART) {
                            assert_ne!(
                                base.get(&k),
                                Some(&v),
                                "{label}: snapshot {c} on top of {b:?} carries key {k}, unchanged"
                            );
                        }
                    }
                    apply(base, state)
                }
                state => {
                    wholes += 1;
                    decode(state).into_iter().collect()
                }
            };
            assert_eq!(got, at[&c], "{label}: snapshot {c} on top of {b:?}");
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
        let frozen = m.freeze_at(c, base);
        at.insert(c, model.clone());
        pending = Some((c, base, frozen));
    }
    (deltas, wholes)
}
