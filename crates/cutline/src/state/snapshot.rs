//! Snapshot images: the cheap copy of a state element taken synchronously at a barrier
//! ([`StateImage`]), collected per task ([`SnapshotBuilder`]) and encoded off the task thread into the
//! payload of the task's state file ([`TaskStatePayload`]).

use crate::error::TaskError;
use cutline_storage::TaskStateFrame;
use serde::ser::{Error as _, SerializeSeq, SerializeStruct, SerializeStructVariant};
use serde::{Deserialize, Serialize, Serializer};
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

/// A state element's encoded form in a task's state file, its blobs as `B`: owned while written,
/// parts of the file's bytes when restored ([`Blob`](super::restore::Blob)).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ElementState<B = Vec<u8>> {
    /// Operator state (source offsets, sink transactions): restorable only at the same parallelism.
    Plain(B),
    /// Keyed state, one blob of concatenated `(key, value)` records per key group: redistributable.
    Keyed { max_parallelism: u32, groups: Vec<(u32, B)> },
    /// Keyed state as what changed since the same element in the file this one builds on (the
    /// previous file of the task's chain): per key group with changes, the `(key, value)` records
    /// written since (concatenated, as in `Keyed`) and the keys removed since (concatenated). Applied
    /// on top of the earlier state: removals first, then the records.
    KeyedDelta { max_parallelism: u32, groups: Vec<(u32, B, B)> },
}

impl<B> ElementState<B> {
    pub fn is_delta(&self) -> bool {
        matches!(self, ElementState::KeyedDelta { .. })
    }

    /// The same state with each blob turned into `f`'s.
    pub fn map_blobs<C>(self, mut f: impl FnMut(B) -> C) -> ElementState<C> {
        match self {
            ElementState::Plain(b) => ElementState::Plain(f(b)),
            ElementState::Keyed { max_parallelism, groups } => {
                ElementState::Keyed { max_parallelism, groups: groups.into_iter().map(|(kg, b)| (kg, f(b))).collect() }
            }
            ElementState::KeyedDelta { max_parallelism, groups } => ElementState::KeyedDelta {
                max_parallelism,
                groups: groups.into_iter().map(|(kg, u, r)| (kg, f(u), f(r))).collect(),
            },
        }
    }
}

impl ElementState {
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

/// What a [`StateImage`] encodes to: an element's state in memory, or whole keyed state that is
/// written to the task's file a key group at a time ([`KeyedStream`]).
pub(crate) enum Encoded {
    Element(ElementState),
    /// Only the disk backend (feature `spill`) streams.
    #[cfg_attr(not(feature = "spill"), allow(dead_code))]
    Stream(KeyedStream),
}

impl From<ElementState> for Encoded {
    fn from(e: ElementState) -> Self {
        Encoded::Element(e)
    }
}

#[cfg(all(test, feature = "spill"))]
impl Encoded {
    /// The element, a stream's groups collected in memory (its empty groups left out, as
    /// [`ElementState::keyed`] does).
    pub fn into_element(self) -> ElementState {
        match self {
            Encoded::Element(e) => e,
            Encoded::Stream(stream) => {
                let mut groups = Vec::new();
                (stream.produce)(&mut |kg, blob| {
                    groups.push((kg, blob.to_vec()));
                    Ok(())
                })
                .expect("produced");
                ElementState::Keyed { max_parallelism: stream.max_parallelism, groups }
            }
        }
    }
}

/// Calls its argument with each non-empty key group's blob (concatenated `(key, value)` records),
/// in ascending key group order; stops at the first error.
pub(crate) type ProduceGroups = Box<dyn FnOnce(EmitGroup<'_>) -> Result<(), String> + Send>;

/// Takes one key group's blob; an error stops the producer, which returns it.
pub(crate) type EmitGroup<'a> = &'a mut dyn FnMut(u32, &[u8]) -> Result<(), String>;

/// Whole keyed state of the key groups `range` that is never held whole: it is written as it is
/// produced, into a task state file built in the scratch file `spool` (see
/// [`TaskStateFrame::spool`]). Its bytes are those of [`ElementState::Keyed`] with every group of
/// the range listed, empty ones too.
pub(crate) struct KeyedStream {
    pub max_parallelism: u32,
    pub range: cutline_core::KeyGroupRange,
    pub spool: std::path::PathBuf,
    pub produce: ProduceGroups,
}

/// The payload of one task state file (restored with its blobs borrowed from the file's bytes).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TaskStatePayload<B = Vec<u8>> {
    pub elements: Vec<(String, ElementState<B>)>,
}

/// A cheap copy of one element's state, taken synchronously at the barrier and encoded off the task
/// thread while processing continues.
pub(crate) trait StateImage: Send {
    /// Its encoded form: whole, or only what changed since the base checkpoint if `incremental`
    /// allows it and the image can (see [`SnapshotBuilder::base`]).
    fn encode(self: Box<Self>, incremental: bool) -> Result<Encoded, String>;
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
        let delta = elements.iter().any(|(_, e)| matches!(e, Encoded::Element(e) if e.is_delta()));
        Ok((frame_encoded(elements)?, delta))
    }
}

/// The task state file of `elements`: built in a scratch file if one of them is streamed (at the
/// first streamed element's `spool` path), else in memory ([`frame_payload`]).
fn frame_encoded(elements: Vec<(String, Encoded)>) -> Result<TaskStateFrame, String> {
    let spool = elements.iter().find_map(|(_, e)| match e {
        Encoded::Stream(s) => Some(s.spool.clone()),
        Encoded::Element(_) => None,
    });
    let Some(spool) = spool else {
        let elements = elements
            .into_iter()
            .map(|(uid, e)| match e {
                Encoded::Element(e) => (uid, e),
                Encoded::Stream(_) => unreachable!("no element is streamed"),
            })
            .collect();
        return frame_payload(elements);
    };
    // A failure that is not the file's is reported as it is, not as a failed write of the file.
    let mut not_io = None;
    let framed = TaskStateFrame::spool(&spool, |w| {
        write_streamed(elements, w).map_err(|failure| match failure {
            StreamFailure::Io(e) => e,
            failure => {
                let message = failure.to_string();
                not_io = Some(message.clone());
                std::io::Error::other(message)
            }
        })
    });
    framed.map_err(|e| match not_io {
        Some(failure) => format!("encoding task state: {failure}"),
        None => format!("encoding task state: {e}"),
    })
}

/// Why writing a payload with streamed elements failed.
#[derive(Debug, thiserror::Error)]
enum StreamFailure {
    /// Writing failed (the disk is full, say): what a producer then reports is only that.
    #[error("{0}")]
    Io(std::io::Error),
    /// A producer failed, or gave its groups out of order.
    #[error("{0}")]
    Producer(String),
    #[error("{0}")]
    Encoding(postcard::Error),
}

/// Writes the payload of `elements` to `w`, streamed elements as they are produced. A failed write
/// is the failure, whatever a producer or postcard made of it.
fn write_streamed(elements: Vec<(String, Encoded)>, w: &mut dyn std::io::Write) -> Result<(), StreamFailure> {
    // Postcard keeps no message of a serializer's error: a producer's is kept here.
    let failure = Arc::new(Mutex::new(None::<String>));
    let elements: Vec<(String, Encoded)> = elements
        .into_iter()
        .map(|(uid, e)| match e {
            Encoded::Stream(mut stream) => {
                let (produce, failure) = (stream.produce, failure.clone());
                stream.produce = Box::new(move |emit| {
                    produce(emit).inspect_err(|e| *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone()))
                });
                (uid, Encoded::Stream(stream))
            }
            element => (uid, element),
        })
        .collect();
    let payload = Draining(RefCell::new(elements));
    let mut w = KeepError { inner: w, error: None };
    let Err(e) = postcard::to_io(&payload, &mut w) else { return Ok(()) };
    if let Some(io) = w.error.take() {
        return Err(StreamFailure::Io(io));
    }
    let failure = failure.lock().unwrap_or_else(|p| p.into_inner()).take();
    Err(failure.map_or(StreamFailure::Encoding(e), StreamFailure::Producer))
}

/// A writer that keeps the I/O error it returned (postcard reports only that there was one).
struct KeepError<'a> {
    inner: &'a mut dyn std::io::Write,
    error: Option<std::io::Error>,
}

impl std::io::Write for KeepError<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf).inspect_err(|e| self.error = Some(std::io::Error::new(e.kind(), e.to_string())))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().inspect_err(|e| self.error = Some(std::io::Error::new(e.kind(), e.to_string())))
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
    let payload =
        Draining(RefCell::new(elements.into_iter().map(|(uid, e)| (uid, Encoded::Element(e))).collect::<Vec<_>>()));
    TaskStateFrame::build(capacity, |buf| postcard::to_extend(&payload, buf))
        .map_err(|e| format!("encoding task state: {e}"))
}

/// Serializes as [`TaskStatePayload`] does (the same bytes: postcard writes a byte string and a
/// sequence of bytes alike), taking the elements out as it goes. Serialize it once.
struct Draining<T>(RefCell<T>);

impl Serialize for Draining<Vec<(String, Encoded)>> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let elements = std::mem::take(&mut *self.0.borrow_mut());
        let mut payload = s.serialize_struct("TaskStatePayload", 1)?;
        payload.serialize_field("elements", &DrainingSeq(RefCell::new(elements)))?;
        payload.end()
    }
}

/// The elements of a [`TaskStatePayload`], each taken out as it is written.
struct DrainingSeq(RefCell<Vec<(String, Encoded)>>);

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

impl Serialize for Draining<Option<Encoded>> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(state) = self.0.borrow_mut().take() else { return Err(S::Error::custom("serialized twice")) };
        let state = match state {
            Encoded::Element(state) => state,
            Encoded::Stream(stream) => {
                let mut v = s.serialize_struct_variant("ElementState", 1, "Keyed", 2)?;
                v.serialize_field("max_parallelism", &stream.max_parallelism)?;
                v.serialize_field("groups", &StreamedGroups(RefCell::new(Some(stream))))?;
                return v.end();
            }
        };
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

/// The groups of a [`KeyedStream`], written as they are produced, the empty ones between them too.
struct StreamedGroups(RefCell<Option<KeyedStream>>);

impl Serialize for StreamedGroups {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(stream) = self.0.borrow_mut().take() else { return Err(S::Error::custom("serialized twice")) };
        let (start, end) = (stream.range.start, stream.range.end);
        let mut seq = s.serialize_seq(Some(stream.range.len() as usize))?;
        let mut next = start;
        let mut failed: Option<S::Error> = None;
        let mut write = |kg: u32, blob: &[u8]| -> Result<(), String> {
            // Invariant: each group once, in order, inside the range (the sequence's length is
            // written first, and a reader trusts it).
            if kg < next || kg >= end {
                return Err(format!("key group {kg} produced out of order or outside {start}..{end}"));
            }
            let mut put = |kg: u32, blob: &[u8]| {
                seq.serialize_element(&(kg, Bytes(blob))).map_err(|e| {
                    let message = e.to_string();
                    failed = Some(e);
                    message
                })
            };
            while next < kg {
                put(next, &[])?;
                next += 1;
            }
            put(kg, blob)?;
            next += 1;
            Ok(())
        };
        let produced = (stream.produce)(&mut write);
        if let Some(e) = failed {
            return Err(e);
        }
        produced.map_err(S::Error::custom)?;
        while next < end {
            seq.serialize_element(&(next, Bytes(&[])))?;
            next += 1;
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
    fn encode(self: Box<Self>, _incremental: bool) -> Result<Encoded, String> {
        Ok(ElementState::Plain(self.0).into())
    }
}

pub(crate) fn encode_plain<T: Serialize>(uid: &str, v: &T) -> Result<Box<dyn StateImage>, TaskError> {
    let bytes = postcard::to_allocvec(v).map_err(|e| TaskError::State { uid: uid.into(), message: e.to_string() })?;
    Ok(Box::new(PlainImage(bytes)))
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
