//! Operator state: the stable key hash that maps keys to key groups ([`stable_hash`]), keyed entries
//! in a copy-on-write table, snapshot images taken at a barrier and encoded off the task
//! thread, and the index a restored job reads its state from.
//!
//! It does not write or read files (the storage crate does), does not decide when to snapshot (the
//! task's control plane does), and knows no operator: operators put images in and take bytes out.

mod backend;
mod cow_map;
mod cow_page;
#[cfg(feature = "spill")]
mod disk;
#[cfg(feature = "spill")]
mod disk_pending;
#[cfg(feature = "spill")]
mod disk_store;
#[cfg(feature = "spill")]
mod disk_writer;
mod freeze_log;
mod frozen;
mod hash;
mod restore;
mod schema;
mod snapshot;
#[cfg(test)]
mod testkit;

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::hash::Hash;

pub use backend::{StateBackend, DEFAULT_DISK_CACHE_ENTRIES};
pub(crate) use cow_map::{Copies, CowMap, Frozen};
#[cfg(feature = "spill")]
pub(crate) use disk::{DiskImage, DiskMap};
pub(crate) use hash::{key_group_of_hash, KeyHasher};
pub use hash::{splitmix64, stable_hash, StableHasher};
#[cfg(test)]
pub(crate) use restore::RestoredPart;
pub(crate) use restore::{merge_group, KeyedLayer, RestoreIndex};
pub(crate) use schema::{Evolve, Migration, StateSchema};
pub(crate) use snapshot::{encode_plain, ElementState, Encoded, PlainImage, SnapshotBuilder, StateImage};

/// Trait bounds of keys.
pub trait Key: Hash + Eq + Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}
impl<T: Hash + Eq + Clone + Send + Sync + Serialize + DeserializeOwned + 'static> Key for T {}

/// Trait bounds of state values. (`Sync` because a snapshot reads the state on a writer thread while
/// the task goes on.)
pub trait StateValue: Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Sync + Serialize + DeserializeOwned + 'static> StateValue for T {}
