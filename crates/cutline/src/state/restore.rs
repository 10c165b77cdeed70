//! The index a restoring job reads its state from: every task state file of one checkpoint, decoded
//! and filed by state element uid, from which each new task takes its part (plain state at the same
//! parallelism, keyed state by key group at any parallelism).

use super::snapshot::{ElementState, TaskStatePayload};
use crate::error::TaskError;
use cutline_core::{CheckpointId, KeyGroupRange};
use std::collections::HashMap;
use std::sync::Arc;

/// Part of a restored task state file's payload, which it shares: restored state is the files'
/// bytes, held once, not decoded into copies of them.
#[derive(Clone)]
pub(crate) struct Blob {
    file: Arc<Vec<u8>>,
    start: usize,
    end: usize,
}

impl Blob {
    /// `part` of `file`'s bytes (a slice decoding borrowed from them).
    fn within(file: &Arc<Vec<u8>>, part: &[u8]) -> Blob {
        let start = (part.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize);
        assert!(
            start <= file.len() && part.len() <= file.len() - start,
            "a restored blob lies outside the file it was decoded from"
        );
        Blob { file: file.clone(), start, end: start + part.len() }
    }
}

impl From<Vec<u8>> for Blob {
    fn from(bytes: Vec<u8>) -> Self {
        let end = bytes.len();
        Blob { file: Arc::new(bytes), start: 0, end }
    }
}

impl std::ops::Deref for Blob {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.file[self.start..self.end]
    }
}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blob({} bytes at {} of {})", self.end - self.start, self.start, self.file.len())
    }
}

/// One state element of one old subtask, as found in a checkpoint.
#[derive(Debug)]
pub(crate) struct RestoredPart {
    pub subtask: u32,
    pub parallelism: u32,
    /// Never [`ElementState::KeyedDelta`]: the incremental snapshots on top of it are in `deltas`.
    pub state: ElementState<Blob>,
    /// Incremental snapshots of keyed state to apply on top of `state`, oldest first.
    pub deltas: Vec<ElementState<Blob>>,
}

/// One layer of a key group's restored state: apply them in the order [`RestoreIndex::keyed`]
/// returns them.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyedLayer<'a> {
    /// Concatenated `(key, value)` records, each key once.
    Whole(&'a [u8]),
    /// What changed on top of the layers before: the keys removed (concatenated), then the
    /// `(key, value)` records written (concatenated), replacing entries of the same key.
    Delta { removes: &'a [u8], upserts: &'a [u8] },
}

/// The parallelism a checkpoint took a plain element at, and every old subtask's state of it.
pub(crate) type OldParts<'a> = (u32, Vec<&'a [u8]>);

/// The state of a whole checkpoint, indexed by element uid, shared by every task of a restoring job.
#[derive(Debug, Default)]
pub(crate) struct RestoreIndex {
    pub checkpoint: Option<CheckpointId>,
    /// Newer complete checkpoints that did not verify and were skipped (a fallback).
    pub skipped: Vec<CheckpointId>,
    /// At-least-once mode: a fallback may commit output twice, and that is accepted.
    pub duplicates_allowed: bool,
    /// The restored checkpoint is the final one: the job's input had ended and the end-of-input hooks
    /// ran before it, so they must not run again (their output is in it).
    pub input_ended: bool,
    /// Restored from this exported savepoint, not from the job's store.
    pub savepoint: Option<std::path::PathBuf>,
    pub elements: HashMap<String, Vec<RestoredPart>>,
}

impl RestoreIndex {
    /// One task's state: the payloads of its chain, oldest first (an incremental snapshot and the
    /// files it builds on; a single payload for a self-contained one). The state restored is parts
    /// of these payloads, kept as long as any of it is.
    pub fn add_task_chain(&mut self, subtask: u32, parallelism: u32, chain: Vec<Vec<u8>>) -> Result<(), String> {
        let mut current: HashMap<String, (ElementState<Blob>, Vec<ElementState<Blob>>)> = HashMap::new();
        for (i, payload) in chain.into_iter().enumerate() {
            let file = Arc::new(payload);
            let p: TaskStatePayload<&[u8]> = postcard::from_bytes(&file)
                .map_err(|e| format!("decoding task state (file {} of its chain): {e}", i + 1))?;
            // A file lists every element that had state at its checkpoint: those it lacks had none.
            let mut next = HashMap::with_capacity(p.elements.len());
            for (uid, state) in p.elements {
                let resolved = match state.map_blobs(|b| Blob::within(&file, b)) {
                    delta @ ElementState::KeyedDelta { .. } => {
                        let ElementState::KeyedDelta { max_parallelism, .. } = &delta else { unreachable!() };
                        let (base, mut deltas) = current.remove(&uid).unwrap_or_else(|| {
                            (ElementState::Keyed { max_parallelism: *max_parallelism, groups: Vec::new() }, Vec::new())
                        });
                        if !matches!(&base, ElementState::Keyed { max_parallelism: m, .. } if m == max_parallelism) {
                            return Err(format!(
                                "the checkpoint is damaged: an incremental snapshot of {uid} builds on state of another shape"
                            ));
                        }
                        deltas.push(delta);
                        (base, deltas)
                    }
                    whole => (whole, Vec::new()),
                };
                next.insert(uid, resolved);
            }
            current = next;
        }
        for (uid, (state, deltas)) in current {
            self.elements.entry(uid).or_default().push(RestoredPart { subtask, parallelism, state, deltas });
        }
        Ok(())
    }

    /// Plain state of `uid` for `subtask`; the parallelism must not have changed.
    pub fn plain(&self, uid: &str, subtask: u32, parallelism: u32) -> Result<Option<&[u8]>, TaskError> {
        let Some(parts) = self.elements.get(uid) else {
            return Ok(None);
        };
        let err = |m: String| TaskError::State { uid: uid.into(), message: m };
        for p in parts {
            if p.parallelism != parallelism {
                return Err(err(format!(
                    "checkpoint has it at parallelism {}, the job now asks for {parallelism}; only keyed operators can change parallelism",
                    p.parallelism
                )));
            }
            if p.subtask == subtask {
                return match &p.state {
                    ElementState::Plain(b) => Ok(Some(b)),
                    ElementState::Keyed { .. } | ElementState::KeyedDelta { .. } => {
                        Err(err("checkpoint holds keyed state where plain state is expected".into()))
                    }
                };
            }
        }
        Ok(None)
    }

    /// Plain state of `uid` taken at a parallelism other than `parallelism`: that parallelism and
    /// every old subtask's state. `None` if the checkpoint has none, or has it at `parallelism`.
    pub fn plain_rescaled(&self, uid: &str, parallelism: u32) -> Result<Option<OldParts<'_>>, TaskError> {
        let Some(parts) = self.elements.get(uid) else {
            return Ok(None);
        };
        let Some(old) = parts.first().map(|p| p.parallelism).filter(|p| *p != parallelism) else {
            return Ok(None);
        };
        let mut states = Vec::new();
        for p in parts {
            match &p.state {
                ElementState::Plain(b) if p.parallelism == old => states.push(&b[..]),
                _ => return Err(TaskError::State {
                    uid: uid.into(),
                    message:
                        "checkpoint holds keyed state, or parts at several parallelisms, where plain state is expected"
                            .into(),
                }),
            }
        }
        Ok(Some((old, states)))
    }

    /// Like [`plain_rescaled`](Self::plain_rescaled), with the old subtasks' states in subtask order,
    /// one for each of them: for state that says where each old subtask stood (a source's offsets,
    /// a sink's transactions). A subtask missing or found twice is a damaged checkpoint.
    pub fn plain_rescaled_complete(&self, uid: &str, parallelism: u32) -> Result<Option<OldParts<'_>>, TaskError> {
        if self.plain_rescaled(uid, parallelism)?.is_none() {
            return Ok(None);
        }
        let parts = &self.elements[uid];
        let old = parts[0].parallelism;
        let mut by_subtask: Vec<Option<&[u8]>> = vec![None; old as usize];
        for p in parts {
            let slot = by_subtask.get_mut(p.subtask as usize);
            match (slot, &p.state) {
                (Some(slot @ None), ElementState::Plain(b)) => *slot = Some(&b[..]),
                _ => {
                    return Err(TaskError::State {
                        uid: uid.into(),
                        message: format!(
                        "the checkpoint is damaged: it holds the state of subtask {} of {old} twice, or out of range",
                        p.subtask
                    ),
                    })
                }
            }
        }
        match by_subtask.iter().position(Option::is_none) {
            Some(missing) => Err(TaskError::State {
                uid: uid.into(),
                message: format!("the checkpoint is damaged: it has no state of subtask {missing} of {old}"),
            }),
            None => Ok(Some((old, by_subtask.into_iter().map(|b| b.expect("checked")).collect()))),
        }
    }

    /// Plain state of `uid` from every old subtask, whatever the parallelism (state that is merged
    /// rather than taken per subtask).
    pub fn plain_all(&self, uid: &str) -> Result<Vec<&[u8]>, TaskError> {
        let Some(parts) = self.elements.get(uid) else {
            return Ok(vec![]);
        };
        let mut states = Vec::with_capacity(parts.len());
        for p in parts {
            match &p.state {
                ElementState::Plain(b) => states.push(&b[..]),
                ElementState::Keyed { .. } | ElementState::KeyedDelta { .. } => {
                    return Err(TaskError::State {
                        uid: uid.into(),
                        message: "checkpoint holds keyed state where plain state is expected".into(),
                    })
                }
            }
        }
        Ok(states)
    }

    /// Every layer of every key group of keyed element `uid` that falls in `range`, from whichever
    /// old subtask held it; a group's layers in the order to apply them.
    pub fn keyed(
        &self,
        uid: &str,
        range: KeyGroupRange,
        max_parallelism: u32,
    ) -> Result<Vec<(u32, KeyedLayer<'_>)>, TaskError> {
        let Some(parts) = self.elements.get(uid) else {
            return Ok(vec![]);
        };
        let mut out = Vec::new();
        for p in parts {
            match &p.state {
                ElementState::Keyed { max_parallelism: m, groups } => {
                    if *m != max_parallelism {
                        return Err(TaskError::State {
                            uid: uid.into(),
                            message: format!("checkpoint was taken with max parallelism {m}, the job now has {max_parallelism}; it cannot change"),
                        });
                    }
                    for (kg, blob) in groups {
                        if range.contains(cutline_core::KeyGroup(*kg)) {
                            out.push((*kg, KeyedLayer::Whole(blob)));
                        }
                    }
                    for delta in &p.deltas {
                        // `add_task_chain` checked the shape and the max parallelism.
                        let ElementState::KeyedDelta { groups, .. } = delta else { continue };
                        for (kg, upserts, removes) in groups {
                            if range.contains(cutline_core::KeyGroup(*kg)) {
                                out.push((*kg, KeyedLayer::Delta { removes, upserts }));
                            }
                        }
                    }
                }
                ElementState::Plain(_) | ElementState::KeyedDelta { .. } => {
                    return Err(TaskError::State {
                        uid: uid.into(),
                        message: "checkpoint holds plain state where keyed state is expected".into(),
                    })
                }
            }
        }
        Ok(out)
    }
}

/// An encoded record: its key, then its value, each as a checkpoint and the disk store keep them.
pub(crate) type EncodedRecord<'a> = (&'a [u8], &'a [u8]);

/// One change of a key while merging a group's layers: the key, when (see [`merge_group`]), and
/// the value written (`None`: removed).
type Change<'a> = (&'a [u8], u32, Option<&'a [u8]>);

/// The records of one key group after applying its `layers` in order (as [`RestoreIndex::keyed`]
/// gives them), sorted by their encoded key, without decoding them into values: for a store that
/// keeps encoded records in key order, where inserting in that order appends instead of writing a
/// page per key. `split(bytes, with_value)` checks the record (or, for a removed key, the key) at
/// the start of `bytes` and returns the length of its key and of all of it. A key twice in a whole
/// layer is `duplicate`'s error.
pub(crate) fn merge_group<'a, E>(
    layers: &[KeyedLayer<'a>],
    mut split: impl FnMut(&'a [u8], bool) -> Result<(usize, usize), E>,
    duplicate: impl Fn() -> E,
) -> Result<Vec<EncodedRecord<'a>>, E> {
    // (key, when, value or removed): `when` orders a key's changes, a delta's removes before its
    // upserts; a stable sort keeps equal ones in input order.
    let mut changes: Vec<Change<'a>> = Vec::new();
    let mut records = |mut bytes: &'a [u8], when: u32, with_value: bool, changes: &mut Vec<_>| {
        while !bytes.is_empty() {
            let (key_len, len) = split(bytes, with_value)?;
            let value = with_value.then(|| &bytes[key_len..len]);
            changes.push((&bytes[..key_len], when, value));
            bytes = &bytes[len..];
        }
        Ok(())
    };
    for (i, layer) in layers.iter().enumerate() {
        let when = 2 * i as u32;
        match *layer {
            KeyedLayer::Whole(b) => records(b, when + 1, true, &mut changes)?,
            KeyedLayer::Delta { removes, upserts } => {
                records(removes, when, false, &mut changes)?;
                records(upserts, when + 1, true, &mut changes)?;
            }
        }
    }
    changes.sort_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
    let mut out = Vec::with_capacity(changes.len());
    for (i, &(key, when, value)) in changes.iter().enumerate() {
        if let Some(&(next, next_when, _)) = changes.get(i + 1) {
            if next == key {
                if next_when == when && matches!(layers[(when / 2) as usize], KeyedLayer::Whole(_)) {
                    return Err(duplicate());
                }
                continue; // a later change of the same key decides
            }
        }
        if let Some(v) = value {
            out.push((key, v));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{merge_group, ElementState, KeyedLayer, RestoreIndex, TaskStatePayload};

    /// Test records: a one-byte key, then a one-byte value.
    fn split(_: &[u8], with_value: bool) -> Result<(usize, usize), String> {
        Ok((1, if with_value { 2 } else { 1 }))
    }

    fn merge<'a>(layers: &[KeyedLayer<'a>]) -> Result<Vec<super::EncodedRecord<'a>>, String> {
        merge_group(layers, split, || "twice".to_string())
    }

    #[test]
    fn a_group_merged_from_its_layers_is_sorted_by_key_and_the_latest_change_of_a_key_wins() {
        let layers = [
            KeyedLayer::Whole(b"c1a1b1d1"),
            // Removes go before the upserts of the same delta: `b` is removed and written again.
            KeyedLayer::Delta { removes: b"ab", upserts: b"b2e2" },
            KeyedLayer::Delta { removes: b"d", upserts: b"c3a3" },
            KeyedLayer::Delta { removes: b"c", upserts: b"" },
        ];
        let merged = merge(&layers).unwrap();
        let expected: Vec<(&[u8], &[u8])> = vec![(b"a", b"3"), (b"b", b"2"), (b"e", b"2")];
        assert_eq!(merged, expected);
        assert_eq!(merge(&layers[..1]).unwrap().len(), 4, "the whole layer alone");
    }

    #[test]
    fn a_key_twice_in_a_whole_layer_is_an_error_and_twice_across_layers_is_not() {
        assert_eq!(merge(&[KeyedLayer::Whole(b"a1b1a2")]), Err("twice".to_string()));
        let layers = [KeyedLayer::Whole(b"a1"), KeyedLayer::Delta { removes: b"", upserts: b"a2" }];
        assert_eq!(merge(&layers).unwrap(), vec![(&b"a"[..], &b"2"[..])]);
        let failing = |_: &[u8], _: bool| -> Result<(usize, usize), String> { Err("bad record".into()) };
        assert_eq!(merge_group(&[KeyedLayer::Whole(b"a1")], failing, || "twice".to_string()), Err("bad record".into()));
    }

    #[test]
    fn restored_state_is_parts_of_the_files_it_was_read_from_not_copies_of_them() {
        let whole: TaskStatePayload = TaskStatePayload {
            elements: vec![
                ("source".into(), ElementState::Plain(vec![7; 9])),
                ("count".into(), ElementState::Keyed { max_parallelism: 128, groups: vec![(3, b"a1b1".to_vec())] }),
            ],
        };
        let delta: TaskStatePayload = TaskStatePayload {
            elements: vec![
                ("source".into(), ElementState::Plain(vec![8; 9])),
                (
                    "count".into(),
                    ElementState::KeyedDelta { max_parallelism: 128, groups: vec![(3, b"c2".to_vec(), b"a".to_vec())] },
                ),
            ],
        };
        let chain = vec![postcard::to_allocvec(&whole).unwrap(), postcard::to_allocvec(&delta).unwrap()];
        let files: Vec<std::ops::Range<usize>> =
            chain.iter().map(|f| f.as_ptr() as usize..f.as_ptr() as usize + f.len()).collect();
        let mut index = RestoreIndex::default();
        index.add_task_chain(0, 1, chain).unwrap();
        let in_file = |file: usize, blob: &[u8]| {
            let at = blob.as_ptr() as usize;
            assert!(files[file].contains(&at) && at + blob.len() <= files[file].end, "a copy, not file {file}'s bytes");
        };
        assert_eq!(index.plain("source", 0, 1).unwrap(), Some(&[8u8; 9][..]));
        in_file(1, index.plain("source", 0, 1).unwrap().unwrap());
        let layers = index.keyed("count", cutline_core::KeyGroupRange { start: 0, end: 128 }, 128).unwrap();
        let [(3, KeyedLayer::Whole(w)), (3, KeyedLayer::Delta { removes, upserts })] = &layers[..] else {
            panic!("{layers:?}")
        };
        assert_eq!((*w, *removes, *upserts), (&b"a1b1"[..], &b"a"[..], &b"c2"[..]));
        in_file(0, w);
        in_file(1, removes);
        in_file(1, upserts);
    }
}
