//! Snapshot images: the cheap copy of a state element taken synchronously at a barrier
//! ([`StateImage`]), collected per task ([`SnapshotBuilder`]) and encoded off the task thread into the
//! payload of the task's state file ([`TaskStatePayload`]).

use crate::error::TaskError;
use serde::{Deserialize, Serialize};

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
    pub fn encode(self, incremental: bool) -> Result<(Vec<u8>, bool), String> {
        let mut elements = Vec::with_capacity(self.images.len());
        for (uid, img) in self.images {
            elements.push((uid, img.encode(incremental)?));
        }
        let delta = elements.iter().any(|(_, e)| e.is_delta());
        let payload =
            postcard::to_allocvec(&TaskStatePayload { elements }).map_err(|e| format!("encoding task state: {e}"))?;
        Ok((payload, delta))
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
