//! Snapshot images: the cheap copy of a state element taken synchronously at a barrier
//! ([`StateImage`]), collected per task ([`SnapshotBuilder`]) and encoded off the task thread into the
//! payload of the task's state file ([`TaskStatePayload`]).

use super::{key_group_of_hash, stable_hash, Key};
use crate::error::TaskError;
use cutline_core::{KeyGroup, KeyGroupRange};
use serde::{Deserialize, Serialize};

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

/// Keyed state from `(key, value)` pairs of the key groups in `range`: one blob of concatenated
/// pairs per non-empty key group (runs on a snapshot writer thread).
pub(crate) fn encode_key_groups<'a, K: Key + 'a, V: Serialize + 'a>(
    uid: &str,
    pairs: impl Iterator<Item = (&'a K, &'a V)>,
    range: KeyGroupRange,
    max_parallelism: u32,
) -> Result<ElementState, String> {
    let mut groups: Vec<Vec<u8>> = vec![Vec::new(); range.len() as usize];
    for (k, v) in pairs {
        let kg = key_group_of_hash(stable_hash(k), max_parallelism);
        // Invariant: the router only ever sent this subtask keys of its own key groups.
        assert!(range.contains(KeyGroup(kg)), "{uid}: key of key group {kg} outside {range:?}");
        let buf = &mut groups[(kg - range.start) as usize];
        let taken = std::mem::take(buf);
        *buf = postcard::to_extend(&(k, v), taken).map_err(|e| format!("{uid}: encoding a key: {e}"))?;
    }
    let groups = groups
        .into_iter()
        .enumerate()
        .filter(|(_, g)| !g.is_empty())
        .map(|(i, g)| (range.start + i as u32, g))
        .collect();
    Ok(ElementState::Keyed { max_parallelism, groups })
}
