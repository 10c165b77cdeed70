//! Checkpoint storage of cutline: the framed, checksummed file format of everything cutline writes,
//! checkpoint manifests (the commit point of a checkpoint), retention, and the stores that hold them.
//! It knows nothing of operators, barriers or the coordinator's protocol: it stores what it is given
//! and reports precisely what is wrong with what it reads back.
//!
//! - [`format`](mod@format): the file frame (magic, version, kind, length, payload, CRC32).
//! - [`CheckpointStore`]: the storage contract, implemented by [`LocalDirStore`] (a directory) and
//!   [`MemStore`] (memory, for simulations), wrapped by [`FaultyStore`] for failure drills; with the
//!   cargo feature `s3`, also by `S3Store` (a bucket of any S3-compatible object store).
//! - [`Manifest`], [`TaskStateHandle`], [`JobMeta`], [`GenerationRecord`]: the records kept.

#![warn(missing_docs)]

mod error;
mod faulty;
pub mod format;
mod frame;
mod kind;
mod local;
mod manifest;
mod mem;
#[cfg(feature = "s3")]
mod object;
mod store;

pub use error::StorageError;
pub use faulty::{FaultPolicy, FaultyStore, StoreOp};
pub use format::{decode_frame, encode_frame, FileKind, FORMAT_VERSION};
pub use frame::{TaskStateFrame, SPOOL_BUFFER_BYTES};
pub use local::LocalDirStore;
pub use manifest::{GenerationRecord, JobMeta, Manifest, StateFileRef, TaskStateHandle};
pub use mem::MemStore;
#[cfg(feature = "s3")]
pub use object::{RetryLimits, S3Config, S3Store, MAX_UPLOAD_PARTS, UPLOAD_PARTS_IN_FLIGHT, UPLOAD_PART_BYTES};
pub use store::{CheckpointListing, CheckpointStore, GcReport, StoreLock};

#[cfg(test)]
mod tests;
