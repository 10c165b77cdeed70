//! Helpers of the state tests: snapshots of `u64 -> u64` maps (max parallelism 128) decoded, and
//! incremental ones applied on top of their base.

use super::{key_group_of_hash, stable_hash, ElementState};
use std::collections::HashMap;

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
