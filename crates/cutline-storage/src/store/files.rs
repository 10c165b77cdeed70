//! The small file-system interface, [`Files`], that the checkpoint semantics are written against, and
//! [`impl_checkpoint_store!`], which makes a [`Files`] a [`CheckpointStore`](super::CheckpointStore)
//! by forwarding to [`super::ops`] and [`super::fencing`]: every backend gets the same semantics.

use super::StoreLock;
use crate::error::StorageError;
use std::path::PathBuf;

pub(crate) struct Entry {
    pub name: String,
    pub is_dir: bool,
}

/// The primitives a store backend provides. Paths are relative to the root and '/'-separated; `""` is
/// the root. Absent files and directories are not errors.
pub(crate) trait Files: Send + Sync {
    /// See [`CheckpointStore::lock`](super::CheckpointStore::lock).
    fn lock(&self) -> Result<StoreLock, StorageError> {
        Ok(StoreLock::none())
    }
    /// The path to show in errors.
    fn display_path(&self, rel: &str) -> PathBuf;
    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, StorageError>;
    /// The size of a regular file; `None` if there is none.
    fn size(&self, rel: &str) -> Result<Option<u64>, StorageError>;
    /// Durably and atomically creates or replaces a file, creating its directory if needed.
    fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StorageError>;
    /// `put` of the `len` bytes `src` reads. This default reads them into memory first; a store
    /// that can write as it reads overrides it.
    fn put_from(&self, rel: &str, src: &mut dyn std::io::Read, len: u64) -> Result<(), StorageError> {
        self.put(rel, &read_source(&self.display_path(rel), src, len)?)
    }
    /// Like `put`, but never replaces: `Ok(false)` if the file already exists.
    fn put_new(&self, rel: &str, bytes: &[u8]) -> Result<bool, StorageError>;
    fn list(&self, dir: &str) -> Result<Vec<Entry>, StorageError>;
    fn remove_file(&self, rel: &str) -> Result<(), StorageError>;
    /// Removes `dir` if it has no entries; whether it did.
    fn remove_dir_if_empty(&self, dir: &str) -> Result<bool, StorageError>;
    /// Makes earlier removals and renames in `dir` durable.
    fn sync_dir(&self, dir: &str) -> Result<(), StorageError>;
    fn describe(&self) -> String;
}

/// Implements [`CheckpointStore`](super::CheckpointStore) for a type that implements [`Files`], by
/// forwarding to [`super::ops`] and [`super::fencing`].
macro_rules! impl_checkpoint_store {
    ($ty:ty) => {
        impl $crate::store::CheckpointStore for $ty {
            fn write_task_frame(
                &self,
                checkpoint: ::cutline_core::CheckpointId,
                operator: &::cutline_core::OperatorId,
                subtask: ::cutline_core::SubtaskIndex,
                parallelism: u32,
                key_groups: Option<::cutline_core::KeyGroupRange>,
                frame: &$crate::TaskStateFrame,
            ) -> Result<$crate::TaskStateHandle, $crate::StorageError> {
                let at = (checkpoint, operator, subtask);
                $crate::store::ops::write_task_frame(self, at, parallelism, key_groups, frame)
            }
            fn read_task_chain(&self, handle: &$crate::TaskStateHandle) -> Result<Vec<Vec<u8>>, $crate::StorageError> {
                $crate::store::ops::read_task_chain(self, handle)
            }
            fn read_task_state(&self, handle: &$crate::TaskStateHandle) -> Result<Vec<u8>, $crate::StorageError> {
                $crate::store::ops::read_task_state(self, handle)
            }
            fn commit_manifest(&self, manifest: &$crate::Manifest) -> Result<(), $crate::StorageError> {
                $crate::store::ops::commit_manifest(self, manifest)
            }
            fn list_checkpoints(&self) -> Result<Vec<$crate::CheckpointListing>, $crate::StorageError> {
                $crate::store::ops::list_checkpoints(self)
            }
            fn read_manifest(
                &self,
                id: ::cutline_core::CheckpointId,
            ) -> Result<$crate::Manifest, $crate::StorageError> {
                $crate::store::ops::read_manifest(self, id)
            }
            fn verify_reading(
                &self,
                id: ::cutline_core::CheckpointId,
                chain: &mut dyn FnMut(&$crate::TaskStateHandle, Vec<Vec<u8>>),
            ) -> Result<$crate::Manifest, $crate::StorageError> {
                $crate::store::ops::verify(self, id, chain)
            }
            fn discard(&self, id: ::cutline_core::CheckpointId) -> Result<(), $crate::StorageError> {
                $crate::store::ops::discard(self, id)
            }
            fn gc(
                &self,
                retain: usize,
                in_flight: &[::cutline_core::CheckpointId],
            ) -> Result<$crate::GcReport, $crate::StorageError> {
                $crate::store::ops::gc(self, retain, in_flight)
            }
            fn read_meta(&self) -> Result<Option<$crate::JobMeta>, $crate::StorageError> {
                $crate::store::ops::read_meta(self)
            }
            fn write_meta(&self, meta: &$crate::JobMeta) -> Result<(), $crate::StorageError> {
                $crate::store::ops::write_meta(self, meta)
            }
            fn mark_finished(&self, checkpoint: ::cutline_core::CheckpointId) -> Result<(), $crate::StorageError> {
                $crate::store::ops::mark_finished(self, checkpoint)
            }
            fn finished(&self) -> Result<Option<::cutline_core::CheckpointId>, $crate::StorageError> {
                $crate::store::ops::finished(self)
            }
            fn max_checkpoint_id_seen(&self) -> Result<Option<::cutline_core::CheckpointId>, $crate::StorageError> {
                $crate::store::ops::max_checkpoint_id_seen(self)
            }
            fn claim_generation(&self, record: &$crate::GenerationRecord) -> Result<(), $crate::StorageError> {
                $crate::store::fencing::claim_generation(self, record)
            }
            fn release_generation(&self, generation: ::cutline_core::Generation) -> Result<(), $crate::StorageError> {
                $crate::store::fencing::release_generation(self, generation)
            }
            fn generations(&self) -> Result<Vec<$crate::GenerationRecord>, $crate::StorageError> {
                $crate::store::fencing::generations(self)
            }
            fn latest_generation(&self) -> Result<Option<$crate::GenerationRecord>, $crate::StorageError> {
                $crate::store::fencing::latest_generation(self)
            }
            fn check_not_fenced(&self, generation: ::cutline_core::Generation) -> Result<(), $crate::StorageError> {
                $crate::store::fencing::check_not_fenced(self, generation)
            }
            fn write_stats(
                &self,
                checkpoint: ::cutline_core::CheckpointId,
                payload: &[u8],
            ) -> Result<(), $crate::StorageError> {
                $crate::store::stats::write_stats(self, checkpoint, payload)
            }
            fn read_stats(
                &self,
                checkpoint: ::cutline_core::CheckpointId,
            ) -> Result<Option<Vec<u8>>, $crate::StorageError> {
                $crate::store::stats::read_stats(self, checkpoint)
            }
            fn list_stats(&self) -> Result<Vec<::cutline_core::CheckpointId>, $crate::StorageError> {
                $crate::store::stats::list_stats(self)
            }
            fn prune_stats(&self, keep: usize) -> Result<usize, $crate::StorageError> {
                $crate::store::stats::prune_stats(self, keep)
            }
            fn describe(&self) -> String {
                $crate::store::Files::describe(self)
            }
            fn lock(&self) -> Result<$crate::StoreLock, $crate::StorageError> {
                $crate::store::Files::lock(self)
            }
        }
    };
}
pub(crate) use impl_checkpoint_store;

/// The `len` bytes `src` reads, for a `put_from` to the file at `path` (named in the error).
pub(crate) fn read_source(
    path: &std::path::Path,
    src: &mut dyn std::io::Read,
    len: u64,
) -> Result<Vec<u8>, StorageError> {
    let mut bytes = Vec::with_capacity(len as usize);
    src.read_to_end(&mut bytes).map_err(|e| StorageError::io(path, "read the source of", e))?;
    if bytes.len() as u64 != len {
        let e = std::io::Error::other(format!("read {} of {len} bytes", bytes.len()));
        return Err(StorageError::io(path, "read the source of", e));
    }
    Ok(bytes)
}
