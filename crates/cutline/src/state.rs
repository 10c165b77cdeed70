//! Operator state: the stable key hash that maps keys to key groups, keyed state held in memory, the
//! cheap synchronous snapshot image and its off-thread encoding, and the index a restored job reads
//! its state from.
//!
//! It does not write or read files (the storage crate does) and does not decide when to snapshot (the
//! task's control plane does).

use crate::emit::{delegate_control, delegate_lifecycle, Emit};
use crate::message::TaskError;
use cutline_core::barrier::Barrier;
use cutline_core::{CheckpointId, KeyGroupRange};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

/// A stable, fast 64-bit hasher: the same key hashes to the same key group in every process and every
/// version of cutline (the checkpoint format depends on it; do not change it without a format version).
#[derive(Clone, Copy, Default)]
pub struct StableHasher {
    h: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for StableHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(w) ^ (rest.len() as u64) << 59);
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64)
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64)
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.h = (self.h.rotate_left(5) ^ i).wrapping_mul(SEED);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64)
    }
    #[inline]
    fn finish(&self) -> u64 {
        splitmix64(self.h)
    }
}

/// The splitmix64 finaliser; also the benchmark's key generator.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub(crate) type StableBuild = BuildHasherDefault<StableHasher>;

/// Stable hash of a key.
#[inline]
pub fn stable_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = StableHasher::default();
    key.hash(&mut h);
    h.finish()
}

#[inline]
pub(crate) fn key_group_of_hash(hash: u64, max_parallelism: u32) -> u32 {
    (hash % max_parallelism as u64) as u32
}

/// Hashes the key of a record (the key extractor composed with [`stable_hash`]).
pub(crate) type KeyHasher<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

/// A state element's encoded form in a task's state file.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ElementState {
    /// Operator state (source offsets, sink transactions): restorable only at the same parallelism.
    Plain(Vec<u8>),
    /// Keyed state, one blob of concatenated `(key, value)` records per key group: redistributable.
    Keyed { max_parallelism: u32, groups: Vec<(u32, Vec<u8>)> },
}

/// The payload of one task state file.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskStatePayload {
    pub elements: Vec<(String, ElementState)>,
}

/// A cheap copy of one element's state, taken synchronously at the barrier and encoded off the task
/// thread while processing continues.
pub(crate) trait StateImage: Send {
    fn encode(self: Box<Self>) -> Result<ElementState, String>;
}

/// Collects the state images of a task's chain elements at a barrier.
#[derive(Default)]
pub(crate) struct SnapshotBuilder {
    pub images: Vec<(String, Box<dyn StateImage>)>,
}

impl SnapshotBuilder {
    pub fn add(&mut self, uid: &str, image: Box<dyn StateImage>) {
        assert!(!self.images.iter().any(|(u, _)| u == uid), "two state elements named {uid} in one task");
        self.images.push((uid.to_string(), image));
    }

    /// Encode every image (runs on a snapshot writer thread).
    pub fn encode(self) -> Result<Vec<u8>, String> {
        let mut elements = Vec::with_capacity(self.images.len());
        for (uid, img) in self.images {
            elements.push((uid, img.encode()?));
        }
        postcard::to_allocvec(&TaskStatePayload { elements }).map_err(|e| format!("encoding task state: {e}"))
    }
}

/// Plain state from a serialisable value.
pub(crate) struct PlainImage(pub Vec<u8>);

impl StateImage for PlainImage {
    fn encode(self: Box<Self>) -> Result<ElementState, String> {
        Ok(ElementState::Plain(self.0))
    }
}

pub(crate) fn encode_plain<T: Serialize>(uid: &str, v: &T) -> Result<Box<dyn StateImage>, TaskError> {
    let bytes = postcard::to_allocvec(v).map_err(|e| TaskError::State { uid: uid.into(), message: e.to_string() })?;
    Ok(Box::new(PlainImage(bytes)))
}

/// One state element of one old subtask, as found in a checkpoint.
#[derive(Debug)]
pub(crate) struct RestoredPart {
    pub subtask: u32,
    pub parallelism: u32,
    pub state: ElementState,
}

/// The state of a whole checkpoint, indexed by element uid, shared by every task of a restoring job.
#[derive(Debug, Default)]
pub(crate) struct RestoreIndex {
    pub checkpoint: Option<CheckpointId>,
    /// Newer complete checkpoints that did not verify and were skipped (a fallback).
    pub skipped: Vec<CheckpointId>,
    /// At-least-once mode: a fallback may commit output twice, and that is accepted.
    pub duplicates_allowed: bool,
    /// Restored from this exported savepoint, not from the job's store.
    pub savepoint: Option<std::path::PathBuf>,
    pub elements: HashMap<String, Vec<RestoredPart>>,
}

impl RestoreIndex {
    pub fn add_task_payload(&mut self, subtask: u32, parallelism: u32, payload: &[u8]) -> Result<(), String> {
        let p: TaskStatePayload = postcard::from_bytes(payload).map_err(|e| format!("decoding task state: {e}"))?;
        for (uid, state) in p.elements {
            self.elements.entry(uid).or_default().push(RestoredPart { subtask, parallelism, state });
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
                    ElementState::Keyed { .. } => {
                        Err(err("checkpoint holds keyed state where plain state is expected".into()))
                    }
                };
            }
        }
        Ok(None)
    }

    /// Every key group blob of keyed element `uid` that falls in `range`, from whichever old subtask
    /// held it.
    pub fn keyed(&self, uid: &str, range: KeyGroupRange, max_parallelism: u32) -> Result<Vec<(u32, &[u8])>, TaskError> {
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
                            out.push((*kg, blob.as_slice()));
                        }
                    }
                }
                ElementState::Plain(_) => {
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

/// Trait bounds of keys.
pub trait Key: Hash + Eq + Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}
impl<T: Hash + Eq + Clone + Send + Sync + Serialize + DeserializeOwned + 'static> Key for T {}

/// Trait bounds of state values.
pub trait StateValue: Clone + Send + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Serialize + DeserializeOwned + 'static> StateValue for T {}

/// Where a keyed process function sends its output.
pub struct Output<'a, O> {
    next: &'a mut dyn Emit<O>,
    err: Option<TaskError>,
}

impl<O> Output<'_, O> {
    /// Send one record downstream.
    #[inline]
    pub fn emit(&mut self, item: O) {
        if self.err.is_none() {
            if let Err(e) = self.next.emit(item) {
                self.err = Some(e);
            }
        }
    }
}

/// The user function of a keyed operator: key, the key's value state (None when absent; set it to None
/// to delete), the record, and the output.
pub(crate) type KeyedFn<K, T, S, O> = Arc<dyn Fn(&K, &mut Option<S>, T, &mut Output<O>) + Send + Sync>;

/// A keyed stateful operator: in-memory value state per key.
pub(crate) struct KeyedProcessOp<K, T, S, O> {
    pub uid: String,
    pub key_fn: Arc<dyn Fn(&T) -> K + Send + Sync>,
    pub f: KeyedFn<K, T, S, O>,
    pub state: HashMap<K, Option<S>, StableBuild>,
    pub range: KeyGroupRange,
    pub max_parallelism: u32,
    pub next: Box<dyn Emit<O>>,
}

impl<K: Key, T: Send, S: StateValue, O: Send> KeyedProcessOp<K, T, S, O> {
    /// Load this subtask's key groups from a checkpoint, asserting that each key belongs here.
    pub fn restore(&mut self, index: &RestoreIndex) -> Result<(), TaskError> {
        let err = |m: String| TaskError::State { uid: self.uid.clone(), message: m };
        for (kg, mut blob) in index.keyed(&self.uid, self.range, self.max_parallelism)? {
            while !blob.is_empty() {
                let ((k, v), rest): ((K, S), &[u8]) =
                    postcard::take_from_bytes(blob).map_err(|e| err(format!("decoding keyed state: {e}")))?;
                let actual = key_group_of_hash(stable_hash(&k), self.max_parallelism);
                // Checked after reading back: a key filed under another group means the key type or its
                // hashing changed since the checkpoint; restoring it would put state where no record finds it.
                if actual != kg || !self.range.contains(cutline_core::KeyGroup(kg)) {
                    return Err(err(format!(
                        "a restored key filed under key group {kg} hashes to group {actual}: the key type or its Hash changed since the checkpoint; keep the key type, or give the operator a new id to start it empty"
                    )));
                }
                if self.state.insert(k, Some(v)).is_some() {
                    return Err(err(format!(
                        "a key is stored twice in key group {kg}: the checkpoint is inconsistent"
                    )));
                }
                blob = rest;
            }
        }
        Ok(())
    }
}

impl<K: Key, T: Send, S: StateValue, O: Send> Emit<T> for KeyedProcessOp<K, T, S, O> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        let k = (self.key_fn)(&item);
        let mut out = Output { next: &mut *self.next, err: None };
        if let Some(slot) = self.state.get_mut(&k) {
            (self.f)(&k, slot, item, &mut out);
        } else {
            let mut slot = None;
            (self.f)(&k, &mut slot, item, &mut out);
            if slot.is_some() {
                self.state.insert(k, slot);
            }
        }
        match out.err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    fn on_barrier(&mut self, b: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
        self.state.retain(|_, v| v.is_some());
        let image = KeyedImage {
            uid: self.uid.clone(),
            map: self.state.clone(),
            range: self.range,
            max_parallelism: self.max_parallelism,
        };
        snap.add(&self.uid, Box::new(image));
        self.next.on_barrier(b, snap)
    }

    delegate_lifecycle!();
}

/// The synchronous copy of keyed state taken at a barrier.
struct KeyedImage<K, S> {
    uid: String,
    map: HashMap<K, Option<S>, StableBuild>,
    range: KeyGroupRange,
    max_parallelism: u32,
}

impl<K: Key, S: StateValue> StateImage for KeyedImage<K, S> {
    fn encode(self: Box<Self>) -> Result<ElementState, String> {
        let mut groups: Vec<Vec<u8>> = vec![Vec::new(); self.range.len() as usize];
        for (k, v) in &self.map {
            let Some(v) = v else { continue };
            let kg = key_group_of_hash(stable_hash(k), self.max_parallelism);
            // Invariant: the router only ever sent this subtask keys of its own key groups.
            assert!(
                self.range.contains(cutline_core::KeyGroup(kg)),
                "{}: key of key group {kg} outside {:?}",
                self.uid,
                self.range
            );
            let buf = &mut groups[(kg - self.range.start) as usize];
            let taken = std::mem::take(buf);
            *buf = postcard::to_extend(&(k, v), taken).map_err(|e| format!("{}: encoding a key: {e}", self.uid))?;
        }
        let groups = groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .map(|(i, g)| (self.range.start + i as u32, g))
            .collect();
        Ok(ElementState::Keyed { max_parallelism: self.max_parallelism, groups })
    }
}

/// An identity element: passes records through (the head of a union or rebalance stage).
pub(crate) struct Identity<T> {
    pub next: Box<dyn Emit<T>>,
}

impl<T: Send> Emit<T> for Identity<T> {
    #[inline]
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        self.next.emit(item)
    }
    fn emit_batch(&mut self, batch: Vec<T>) -> Result<(), TaskError> {
        self.next.emit_batch(batch)
    }
    delegate_control!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_hash_is_pinned() {
        // A change here moves every key's state to another key group in old checkpoints: it needs a
        // new snapshot format version.
        assert_eq!(stable_hash(&42u64), 0x1fbb_8ac5_2a8b_7f5e);
        assert_eq!(stable_hash("word"), 0x7a35_0187_28c5_fc18);
    }
}
