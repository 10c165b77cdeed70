//! The consistent-cut check of every committed checkpoint: the join's per-key counts must equal what
//! the sources' recorded offsets imply (exactly-once) or cover it (at-least-once), counting the
//! records in flight persisted as channel state.

use super::job::{left_key, removed_at, right_key, rules_key};
use super::{Sim, FINGERPRINT};
use crate::channel::InFlight;
use crate::dataflow::{channel_state_uid, ChannelState, Either};
use crate::runtime::start::load_checkpoint;
use crate::state::{key_group_of_hash, stable_hash, ElementState, KeyedLayer};
use cutline_core::barrier::CheckpointMode;
use cutline_core::{CheckpointId, KeyGroupRange};
use std::collections::BTreeMap;

impl Sim {
    /// The checkpoint just committed must be a consistent cut: the join's per-key counts equal the
    /// records before the sources' recorded offsets (exactly-once), or cover them (at-least-once).
    pub(super) fn check_cut(&mut self, id: CheckpointId) -> Result<(), String> {
        let (index, manifest) = load_checkpoint(&*self.store, &self.graph, FINGERPRINT, id)
            .map_err(|e| format!("reading back {id}: {e}"))?;
        if manifest.tasks.iter().any(|t| !t.base.is_empty()) {
            self.report.incremental_cuts += 1;
        }
        if manifest.tasks.len() != self.graph.task_count() {
            return Err(format!(
                "checkpoint {id} has {} task states for {} tasks",
                manifest.tasks.len(),
                self.graph.task_count()
            ));
        }
        let offsets = |uid: &str| -> Vec<(u32, u32, u64)> {
            index
                .elements
                .get(uid)
                .map(|parts| {
                    parts
                        .iter()
                        .map(|p| match &p.state {
                            ElementState::Plain(b) => {
                                (p.subtask, p.parallelism, postcard::from_bytes::<u64>(b).expect("offset"))
                            }
                            _ => panic!("source offset is keyed"),
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut want: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for (sub, par, off) in offsets("left") {
            let mut i = sub as u64;
            while i < off.min(self.o.left_records) {
                want.entry(left_key(i, self.o.keys)).or_default().0 += 1;
                i += par as u64;
            }
        }
        for (_, _, off) in offsets("rules") {
            for i in 0..off.min(self.o.rules_records) {
                want.entry(rules_key(i, self.o.keys)).or_default().0 += 2;
            }
        }
        for (_, _, off) in offsets("right") {
            for i in 0..off.min(self.o.right_records) {
                want.entry(right_key(i, self.o.keys)).or_default().1 += 1;
            }
        }
        // The join's state with every incremental snapshot applied on top, as a restore reads it.
        let mut have: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        let mp = self.graph.max_parallelism;
        let layers = index.keyed("join", KeyGroupRange::for_subtask(mp, 1, 0), mp).map_err(|e| e.to_string())?;
        for (kg, layer) in layers {
            let (mut removes, mut upserts) = match layer {
                KeyedLayer::Whole(b) => (&[][..], b),
                KeyedLayer::Delta { removes, upserts } => (removes, upserts),
            };
            while !removes.is_empty() {
                let (k, rest): (u64, &[u8]) = postcard::take_from_bytes(removes).map_err(|e| e.to_string())?;
                assert_eq!(key_group_of_hash(stable_hash(&k), mp), kg);
                have.remove(&k);
                removes = rest;
            }
            while !upserts.is_empty() {
                let ((k, v), rest): ((u64, (u64, u64)), &[u8]) =
                    postcard::take_from_bytes(upserts).map_err(|e| e.to_string())?;
                assert_eq!(key_group_of_hash(stable_hash(&k), mp), kg);
                have.insert(k, v);
                upserts = rest;
            }
        }
        // A key the join removed must be gone from its state, not brought back by a restore.
        let keys = self.o.keys;
        let removed: Vec<u64> = want.iter().filter(|(k, c)| removed_at(**k, **c, keys)).map(|(k, _)| *k).collect();
        self.report.removed_keys_checked += removed.iter().filter(|k| !have.contains_key(k)).count() as u64;
        // Records in flight at an unaligned checkpoint are part of the cut: they were sent before the
        // senders' snapshots and are replayed into their receivers on restore.
        let in_flight = |stage: &str| -> Vec<Vec<u8>> {
            let uid = channel_state_uid(stage);
            let mut batches = Vec::new();
            for p in index.elements.get(&uid).map(|v| v.as_slice()).unwrap_or(&[]) {
                let ElementState::Plain(b) = &p.state else { panic!("channel state is plain") };
                let cs: ChannelState = postcard::from_bytes(b).expect("channel state decodes");
                batches.extend(cs.inputs.into_iter().flatten().filter_map(|e| match e {
                    InFlight::Batch(b) => Some(b),
                    InFlight::Watermark(_) => None,
                }));
            }
            batches
        };
        for b in in_flight("join") {
            self.report.in_flight_batches += 1;
            let batch: Vec<Either<(u64, u64), (u64, u64)>> = postcard::from_bytes(&b).expect("join batch");
            for r in batch {
                match r {
                    Either::Left((k, _)) => have.entry(k).or_default().0 += 1,
                    Either::Right((k, _)) => have.entry(k).or_default().1 += 1,
                }
            }
        }
        for (stage, left) in [("rules-b", true), ("right-fwd", false)] {
            for b in in_flight(stage) {
                self.report.in_flight_batches += 1;
                let batch: Vec<(u64, u64)> = postcard::from_bytes(&b).expect("batch");
                for (k, _) in batch {
                    let e = have.entry(k).or_default();
                    if left {
                        e.0 += 1
                    } else {
                        e.1 += 1
                    }
                }
            }
        }
        self.report.in_flight_batches += in_flight("spread").len() as u64;
        // State the join removed (counting what was still in flight to it) is no state.
        want.retain(|k, c| !removed_at(*k, *c, keys));
        have.retain(|k, c| !removed_at(*k, *c, keys));
        let ok = match self.o.mode {
            CheckpointMode::ExactlyOnce => have == want,
            CheckpointMode::AtLeastOnce => {
                want.iter().all(|(k, (l, r))| have.get(k).is_some_and(|(hl, hr)| hl >= l && hr >= r))
            }
        };
        if !ok {
            return Err(format!("checkpoint {id} is not a consistent cut: state {have:?}, the offsets imply {want:?}"));
        }
        self.report.cuts_checked += 1;
        Ok(())
    }
}
