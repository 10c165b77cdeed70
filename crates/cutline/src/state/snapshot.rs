//! Snapshot images: the cheap copy of a state element taken synchronously at a barrier
//! ([`StateImage`]), collected per task ([`SnapshotBuilder`]) and encoded off the task thread into the
//! payload of the task's state file ([`TaskStatePayload`]).

use crate::error::TaskError;
use cutline_storage::TaskStateFrame;
use serde::ser::{Error as _, SerializeSeq, SerializeStruct, SerializeStructVariant};
use serde::{Deserialize, Serialize, Serializer};
use std::cell::RefCell;

/// A state element's encoded form in a task's state file.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ElementState {
    /// Operator state (source offsets, sink transactions): restorable only at the same parallelism.
    Plain(Vec<u8>),
    /// Keyed state, one blob of concatenated `(key, value)` records per key group: redistributable.
    Keyed { max_parallelism: u32, groups: Vec<(u32, Vec<u8>)> },
    /// Keyed state as what changed since the same element in the file this one builds on (the
    /// previous file of the task's chain): per key group with changes, the `(key, value)` records
    /// written since (concatenated, as in `Keyed`) and the keys removed since (concatenated). Applied
    /// on top of the earlier state: removals first, then the records.
    KeyedDelta { max_parallelism: u32, groups: Vec<(u32, Vec<u8>, Vec<u8>)> },
}

impl ElementState {
    pub fn is_delta(&self) -> bool {
        matches!(self, ElementState::KeyedDelta { .. })
    }

    /// Keyed state from per key group blobs, the first being group `start`'s: whole
    /// ([`ElementState::Keyed`]) from `upserts` alone, or with `removes` what changed
    /// ([`ElementState::KeyedDelta`]). Groups with nothing are left out.
    pub fn keyed(start: u32, max_parallelism: u32, upserts: Vec<Vec<u8>>, removes: Option<Vec<Vec<u8>>>) -> Self {
        let at = |i: usize| start + i as u32;
        match removes {
            None => ElementState::Keyed {
                max_parallelism,
                groups: upserts
                    .into_iter()
                    .enumerate()
                    .filter(|(_, g)| !g.is_empty())
                    .map(|(i, g)| (at(i), g))
                    .collect(),
            },
            Some(removes) => ElementState::KeyedDelta {
                max_parallelism,
                groups: upserts
                    .into_iter()
                    .zip(removes)
                    .enumerate()
                    .filter(|(_, (u, r))| !u.is_empty() || !r.is_empty())
                    .map(|(i, (u, r))| (at(i), u, r))
                    .collect(),
            },
        }
    }
}

/// The payload of one task state file.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskStatePayload {
    pub elements: Vec<(String, ElementState)>,
}

/// A cheap copy of one element's state, taken synchronously at the barrier and encoded off the task
/// thread while processing continues.
pub(crate) trait StateImage: Send {
    /// Its encoded form: whole, or only what changed since the base checkpoint if `incremental`
    /// allows it and the image can (see [`SnapshotBuilder::base`]).
    fn encode(self: Box<Self>, incremental: bool) -> Result<ElementState, String>;
}

/// Collects the state images of a task's chain elements at a barrier.
#[derive(Default)]
pub(crate) struct SnapshotBuilder {
    pub images: Vec<(String, Box<dyn StateImage>)>,
    /// State pages the task's operators copied since their previous snapshot (see
    /// [`CowMap`](super::CowMap)).
    pub page_copies: u64,
    /// State entries the task's operators saved for a snapshot before overwriting them, since
    /// their previous snapshot (see [`CowMap`](super::CowMap)).
    pub saved_entries: u64,
    /// The task's latest checkpoint known to be complete, set before operators add their images:
    /// what incremental images may hold the changes since. The writer decides whether they do
    /// (whether it still has that checkpoint's files to build on).
    pub base: Option<cutline_core::CheckpointId>,
}

impl SnapshotBuilder {
    pub fn add(&mut self, uid: &str, image: Box<dyn StateImage>) {
        assert!(!self.images.iter().any(|(u, _)| u == uid), "two state elements named {uid} in one task");
        self.images.push((uid.to_string(), image));
    }

    /// Encode every image (runs on a snapshot writer thread), incrementally where `incremental`
    /// allows it and an image can. Also whether the payload holds any incremental element (then it
    /// is only readable on top of the base's files).
    pub fn encode(self, incremental: bool) -> Result<(TaskStateFrame, bool), String> {
        let mut elements = Vec::with_capacity(self.images.len());
        for (uid, img) in self.images {
            elements.push((uid, img.encode(incremental)?));
        }
        let delta = elements.iter().any(|(_, e)| e.is_delta());
        Ok((frame_payload(elements)?, delta))
    }
}

/// The task state file of `elements` ([`TaskStatePayload`]), each key group's blob let go of as
/// soon as it is in the file: a whole snapshot of large state is held about once while it is
/// framed, not as its blobs, a payload and a file.
pub(crate) fn frame_payload(elements: Vec<(String, ElementState)>) -> Result<TaskStateFrame, String> {
    // A reservation, at least the payload's size (a varint takes at most 10 bytes).
    let capacity: usize = elements
        .iter()
        .map(|(uid, e)| {
            uid.len()
                + 32
                + match e {
                    ElementState::Plain(b) => b.len(),
                    ElementState::Keyed { groups, .. } => groups.iter().map(|(_, b)| b.len() + 20).sum(),
                    ElementState::KeyedDelta { groups, .. } => {
                        groups.iter().map(|(_, u, r)| u.len() + r.len() + 30).sum()
                    }
                }
        })
        .sum::<usize>()
        + 10;
    let payload = Draining(RefCell::new(elements));
    TaskStateFrame::build(capacity, |buf| postcard::to_extend(&payload, buf))
        .map_err(|e| format!("encoding task state: {e}"))
}

/// Serializes as [`TaskStatePayload`] does (the same bytes: postcard writes a byte string and a
/// sequence of bytes alike), taking the elements out as it goes. Serialize it once.
struct Draining<T>(RefCell<T>);

impl Serialize for Draining<Vec<(String, ElementState)>> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let elements = std::mem::take(&mut *self.0.borrow_mut());
        let mut payload = s.serialize_struct("TaskStatePayload", 1)?;
        payload.serialize_field("elements", &DrainingSeq(RefCell::new(elements)))?;
        payload.end()
    }
}

/// The elements of a [`TaskStatePayload`], each taken out as it is written.
struct DrainingSeq(RefCell<Vec<(String, ElementState)>>);

impl Serialize for DrainingSeq {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let elements = std::mem::take(&mut *self.0.borrow_mut());
        let mut seq = s.serialize_seq(Some(elements.len()))?;
        for (uid, state) in elements {
            seq.serialize_element(&(uid, Draining(RefCell::new(Some(state)))))?;
        }
        seq.end()
    }
}

impl Serialize for Draining<Option<ElementState>> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(state) = self.0.borrow_mut().take() else { return Err(S::Error::custom("serialized twice")) };
        match state {
            ElementState::Keyed { max_parallelism, groups } => {
                let mut v = s.serialize_struct_variant("ElementState", 1, "Keyed", 2)?;
                v.serialize_field("max_parallelism", &max_parallelism)?;
                v.serialize_field("groups", &DrainingGroups(RefCell::new(groups)))?;
                v.end()
            }
            ElementState::KeyedDelta { max_parallelism, groups } => {
                let mut v = s.serialize_struct_variant("ElementState", 2, "KeyedDelta", 2)?;
                v.serialize_field("max_parallelism", &max_parallelism)?;
                v.serialize_field("groups", &DrainingGroups(RefCell::new(groups)))?;
                v.end()
            }
            plain @ ElementState::Plain(_) => plain.serialize(s),
        }
    }
}

/// Key groups, each dropped once written.
struct DrainingGroups<G>(RefCell<Vec<G>>);

/// The blobs of one key group as postcard writes them.
trait GroupBlobs {
    fn write<T: SerializeSeq>(self, seq: &mut T) -> Result<(), T::Error>;
}

impl GroupBlobs for (u32, Vec<u8>) {
    fn write<T: SerializeSeq>(self, seq: &mut T) -> Result<(), T::Error> {
        seq.serialize_element(&(self.0, Bytes(&self.1)))
    }
}

impl GroupBlobs for (u32, Vec<u8>, Vec<u8>) {
    fn write<T: SerializeSeq>(self, seq: &mut T) -> Result<(), T::Error> {
        seq.serialize_element(&(self.0, Bytes(&self.1), Bytes(&self.2)))
    }
}

impl<G: GroupBlobs> Serialize for DrainingGroups<G> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let groups = std::mem::take(&mut *self.0.borrow_mut());
        let mut seq = s.serialize_seq(Some(groups.len()))?;
        for group in groups {
            group.write(&mut seq)?;
        }
        seq.end()
    }
}

struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// Plain state from a serialisable value.
pub(crate) struct PlainImage(pub Vec<u8>);

impl StateImage for PlainImage {
    fn encode(self: Box<Self>, _incremental: bool) -> Result<ElementState, String> {
        Ok(ElementState::Plain(self.0))
    }
}

pub(crate) fn encode_plain<T: Serialize>(uid: &str, v: &T) -> Result<Box<dyn StateImage>, TaskError> {
    let bytes = postcard::to_allocvec(v).map_err(|e| TaskError::State { uid: uid.into(), message: e.to_string() })?;
    Ok(Box::new(PlainImage(bytes)))
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
