//! The [`CheckpointStore`] contract, the layout of a store (which file lives where), and the single
//! implementation of the checkpoint semantics (commit point, listing, verification, discard, gc) over
//! a small private file-system interface, [`Files`]. Both [`crate::LocalDirStore`] and
//! [`crate::MemStore`] are that interface plus [`impl_checkpoint_store!`], so they cannot drift apart.
//! It does not decide when to checkpoint, what to retain, or which checkpoint to restore.
//!
//! Layout, relative to the store root:
//!
//! ```text
//! job.meta                                          JobMeta
//! FINISHED                                          the id of the end-of-input checkpoint
//! checkpoints/chk-<id, 20 digits>/<operator>-<subtask>.state
//! checkpoints/chk-<id, 20 digits>/_MANIFEST        present = the checkpoint is complete
//! ```
//!
//! Writes go to a temporary name (`.<name>.<pid>-<seq>.tmp`) first; listings ignore such names.
//!
//! Concurrency: tasks may write task state concurrently with anything. `commit_manifest`, `discard`,
//! `gc`, `write_meta` and `mark_finished` are the coordinator's and must not run concurrently with each
//! other on one store (gc removes leftover temporary files, which a concurrent write could still own).

use crate::error::StorageError;
use crate::format::{decode_frame_at, decode_record, encode_frame, encode_record, FileKind};
use crate::manifest::{JobMeta, Manifest, TaskStateHandle};
use crate::FORMAT_VERSION;
use cutline_core::{CheckpointId, KeyGroupRange, OperatorId, SubtaskIndex};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Durable storage of checkpoints and job metadata. Object safe: the engine holds an
/// `Arc<dyn CheckpointStore>`.
pub trait CheckpointStore: Send + Sync {
    /// Frames `payload` and writes it durably as the state of (`operator`, `subtask`) in `checkpoint`.
    /// Writing the same triple again replaces the file (a retried write). Fails with
    /// [`StorageError::ManifestExists`] if `checkpoint` is already committed.
    fn write_task_state(
        &self,
        checkpoint: CheckpointId,
        operator: &OperatorId,
        subtask: SubtaskIndex,
        parallelism: u32,
        key_groups: Option<KeyGroupRange>,
        payload: &[u8],
    ) -> Result<TaskStateHandle, StorageError>;

    /// Reads a task state file, checks size and checksum against the handle, returns the payload.
    fn read_task_state(&self, handle: &TaskStateHandle) -> Result<Vec<u8>, StorageError>;

    /// The commit point of a checkpoint: durably and atomically writes its manifest, never replacing
    /// one ([`StorageError::ManifestExists`]). Panics if a referenced task file is missing or has another
    /// size than recorded: manifests are only built from acknowledged writes.
    fn commit_manifest(&self, manifest: &Manifest) -> Result<(), StorageError>;

    /// Every checkpoint directory, complete or not, sorted by id. Unrelated entries are ignored.
    fn list_checkpoints(&self) -> Result<Vec<CheckpointListing>, StorageError>;

    /// Reads and decodes the manifest of `id`.
    fn read_manifest(&self, id: CheckpointId) -> Result<Manifest, StorageError>;

    /// Reads the manifest of `id` and every file it references, checking sizes and checksums.
    fn verify(&self, id: CheckpointId) -> Result<Manifest, StorageError>;

    /// Removes an attempt without a manifest (aborted or partial); files that a complete manifest
    /// references are kept. Refuses a complete checkpoint; discarding an absent one succeeds.
    fn discard(&self, id: CheckpointId) -> Result<(), StorageError>;

    /// Retention: keeps the `retain` (at least 1) latest complete checkpoints and the attempts in
    /// `in_flight`, removes every other checkpoint directory and leftover temporary files, and never
    /// removes a file that a retained manifest references.
    fn gc(&self, retain: usize, in_flight: &[CheckpointId]) -> Result<GcReport, StorageError>;

    fn read_meta(&self) -> Result<Option<JobMeta>, StorageError>;

    /// Durably and atomically replaces the job metadata.
    fn write_meta(&self, meta: &JobMeta) -> Result<(), StorageError>;

    /// Records that the job finished with the complete checkpoint `checkpoint`.
    fn mark_finished(&self, checkpoint: CheckpointId) -> Result<(), StorageError>;

    fn finished(&self) -> Result<Option<CheckpointId>, StorageError>;

    /// Where the store lives, for messages.
    fn describe(&self) -> String;

    /// Take the store for one running job, for as long as the returned guard lives:
    /// [`StorageError::Locked`] if another process holds it. Stores that other processes cannot reach
    /// (memory) hand out a guard that locks nothing.
    fn lock(&self) -> Result<StoreLock, StorageError> {
        Ok(StoreLock::none())
    }

    /// The highest checkpoint id of any directory, complete or not: new ids must be above it.
    fn max_checkpoint_id_seen(&self) -> Result<Option<CheckpointId>, StorageError> {
        Ok(self.list_checkpoints()?.last().map(|l| l.id))
    }

    /// The highest id of a complete checkpoint.
    fn latest_complete(&self) -> Result<Option<CheckpointId>, StorageError> {
        Ok(self.list_checkpoints()?.iter().rev().find(|l| l.complete).map(|l| l.id))
    }
}

/// Holds a store for one running job until dropped (see [`CheckpointStore::lock`]).
pub struct StoreLock {
    _held: Option<Box<dyn std::any::Any + Send>>,
}

impl std::fmt::Debug for StoreLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self._held.is_some() { "StoreLock(held)" } else { "StoreLock(none)" })
    }
}

impl StoreLock {
    pub(crate) fn none() -> StoreLock {
        StoreLock { _held: None }
    }
    /// Holds the store until `guard` is dropped (a locked file, an in-memory flag).
    pub(crate) fn holding(guard: Box<dyn std::any::Any + Send>) -> StoreLock {
        StoreLock { _held: Some(guard) }
    }
}

/// One checkpoint directory found in a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointListing {
    pub id: CheckpointId,
    /// Whether its manifest is committed.
    pub complete: bool,
}

/// What one [`CheckpointStore::gc`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Checkpoints and attempts that lost their manifest, any file or their directory, by id.
    pub removed_checkpoints: Vec<CheckpointId>,
    pub removed_files: usize,
    pub removed_bytes: u64,
}

// ---- layout -------------------------------------------------------------------------------------

pub(crate) const CHECKPOINTS_DIR: &str = "checkpoints";
pub(crate) const MANIFEST_NAME: &str = "_MANIFEST";
const META_PATH: &str = "job.meta";
const FINISHED_PATH: &str = "FINISHED";

pub(crate) fn checkpoint_dir(id: CheckpointId) -> String {
    format!("{CHECKPOINTS_DIR}/chk-{:020}", id.0)
}

fn manifest_path(id: CheckpointId) -> String {
    format!("{}/{MANIFEST_NAME}", checkpoint_dir(id))
}

fn task_state_path(id: CheckpointId, operator: &OperatorId, subtask: SubtaskIndex) -> String {
    format!("{}/{}-{}.state", checkpoint_dir(id), operator, subtask.0)
}

fn parse_checkpoint_dir(name: &str) -> Option<CheckpointId> {
    let digits = name.strip_prefix("chk-")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(CheckpointId)
}

/// A fresh temporary name for a file that will be renamed to `name`.
pub(crate) fn temp_name(name: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!(".{name}.{}-{seq}.tmp", std::process::id())
}

pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// The CRC32 of a framed file without its trailer: the value its trailer holds when intact. (The CRC of
/// a whole frame would be useless: a CRC over data followed by its own CRC is the same constant for all
/// data.)
fn content_crc(framed: &[u8]) -> u32 {
    crc32fast::hash(&framed[..framed.len().saturating_sub(4)])
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn validate_operator_id(operator: &OperatorId) -> Result<(), StorageError> {
    let s = operator.as_str();
    let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(StorageError::InvalidOperatorId(s.to_string()))
    }
}

/// A file reference from a manifest must stay inside the store.
fn validate_file_ref(file: &str) -> Result<(), StorageError> {
    let ok = !file.contains('\\') && file.split('/').all(|part| !part.is_empty() && part != "." && part != "..");
    if ok {
        Ok(())
    } else {
        Err(StorageError::InvalidPath(file.to_string()))
    }
}

// ---- the file-system interface the semantics are written against ------------------------------

pub(crate) struct Entry {
    pub name: String,
    pub is_dir: bool,
}

/// The primitives a store backend provides. Paths are relative to the root and '/'-separated; `""` is
/// the root. Absent files and directories are not errors.
pub(crate) trait Files: Send + Sync {
    /// See [`CheckpointStore::lock`].
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

/// Implements [`CheckpointStore`] for a type that implements [`Files`], by forwarding to [`ops`].
macro_rules! impl_checkpoint_store {
    ($ty:ty) => {
        impl $crate::store::CheckpointStore for $ty {
            fn write_task_state(
                &self,
                checkpoint: ::cutline_core::CheckpointId,
                operator: &::cutline_core::OperatorId,
                subtask: ::cutline_core::SubtaskIndex,
                parallelism: u32,
                key_groups: Option<::cutline_core::KeyGroupRange>,
                payload: &[u8],
            ) -> Result<$crate::TaskStateHandle, $crate::StorageError> {
                let at = (checkpoint, operator, subtask);
                $crate::store::ops::write_task_state(self, at, parallelism, key_groups, payload)
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
            fn verify(&self, id: ::cutline_core::CheckpointId) -> Result<$crate::Manifest, $crate::StorageError> {
                $crate::store::ops::verify(self, id)
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

/// The checkpoint semantics, once, over [`Files`].
pub(crate) mod ops {
    use super::*;

    pub fn write_task_state<F: Files>(
        fs: &F,
        (checkpoint, operator, subtask): (CheckpointId, &OperatorId, SubtaskIndex),
        parallelism: u32,
        key_groups: Option<KeyGroupRange>,
        payload: &[u8],
    ) -> Result<TaskStateHandle, StorageError> {
        validate_operator_id(operator)?;
        if fs.size(&manifest_path(checkpoint))?.is_some() {
            return Err(StorageError::ManifestExists(checkpoint));
        }
        let file = task_state_path(checkpoint, operator, subtask);
        let framed = encode_frame(FileKind::TaskState, payload);
        fs.put(&file, &framed)?;
        Ok(TaskStateHandle {
            operator: operator.clone(),
            subtask,
            parallelism,
            key_groups,
            file,
            size_bytes: framed.len() as u64,
            crc32: content_crc(&framed),
        })
    }

    pub fn read_task_state<F: Files>(fs: &F, handle: &TaskStateHandle) -> Result<Vec<u8>, StorageError> {
        validate_file_ref(&handle.file)?;
        let path = fs.display_path(&handle.file);
        let bytes = fs.read(&handle.file)?.ok_or_else(|| StorageError::NotFound {
            what: format!("state of operator {} subtask {} ({})", handle.operator, handle.subtask.0, path.display()),
        })?;
        if bytes.len() as u64 != handle.size_bytes {
            return Err(StorageError::SizeMismatch { path, expected: handle.size_bytes, actual: bytes.len() as u64 });
        }
        let actual = content_crc(&bytes);
        if actual != handle.crc32 {
            return Err(StorageError::ChecksumMismatch { path, expected: handle.crc32, actual });
        }
        Ok(decode_frame_at(&path, &bytes, FileKind::TaskState)?.payload.to_vec())
    }

    pub fn commit_manifest<F: Files>(fs: &F, manifest: &Manifest) -> Result<(), StorageError> {
        let id = manifest.checkpoint;
        assert_eq!(
            manifest.format_version, FORMAT_VERSION,
            "manifests are written in the current format version; build them with Manifest::new"
        );
        if fs.size(&manifest_path(id))?.is_some() {
            return Err(StorageError::ManifestExists(id));
        }
        for task in &manifest.tasks {
            validate_file_ref(&task.file)?;
            let size = fs.size(&task.file)?;
            assert_eq!(
                size,
                Some(task.size_bytes),
                "manifest of {id} references {} with {} bytes, but the store has {size:?}: a manifest may \
                 only reference acknowledged task state writes",
                task.file,
                task.size_bytes,
            );
        }
        let framed = encode_record(FileKind::Manifest, manifest);
        if fs.put_new(&manifest_path(id), &framed)? {
            Ok(())
        } else {
            Err(StorageError::ManifestExists(id))
        }
    }

    pub fn list_checkpoints<F: Files>(fs: &F) -> Result<Vec<CheckpointListing>, StorageError> {
        let mut out = Vec::new();
        for entry in fs.list(CHECKPOINTS_DIR)? {
            let Some(id) = parse_checkpoint_dir(&entry.name).filter(|_| entry.is_dir) else {
                continue;
            };
            let complete = fs.size(&manifest_path(id))?.is_some();
            out.push(CheckpointListing { id, complete });
        }
        out.sort_by_key(|l| l.id);
        Ok(out)
    }

    pub fn read_manifest<F: Files>(fs: &F, id: CheckpointId) -> Result<Manifest, StorageError> {
        let rel = manifest_path(id);
        let path = fs.display_path(&rel);
        let bytes = fs
            .read(&rel)?
            .ok_or_else(|| StorageError::NotFound { what: format!("manifest of {id} ({})", path.display()) })?;
        let manifest: Manifest = decode_record(&path, &bytes, FileKind::Manifest)?;
        if manifest.format_version > FORMAT_VERSION {
            return Err(StorageError::UnsupportedVersion {
                path,
                found: manifest.format_version,
                supported: FORMAT_VERSION,
            });
        }
        assert_eq!(
            manifest.checkpoint,
            id,
            "{} holds the manifest of another checkpoint: checkpoint directories were renamed by hand",
            path.display()
        );
        Ok(manifest)
    }

    pub fn verify<F: Files>(fs: &F, id: CheckpointId) -> Result<Manifest, StorageError> {
        let manifest = read_manifest(fs, id)?;
        for task in &manifest.tasks {
            read_task_state(fs, task)?;
        }
        Ok(manifest)
    }

    pub fn discard<F: Files>(fs: &F, id: CheckpointId) -> Result<(), StorageError> {
        if fs.size(&manifest_path(id))?.is_some() {
            return Err(StorageError::DiscardComplete(id));
        }
        // Only a later manifest can reference files of this attempt's directory.
        let later: Vec<CheckpointId> =
            list_checkpoints(fs)?.into_iter().filter(|l| l.complete && l.id > id).map(|l| l.id).collect();
        let keep = referenced_files(fs, &later)?;
        sweep(fs, &checkpoint_dir(id), &keep, |_| true, &mut GcReport::default())?;
        fs.remove_dir_if_empty(&checkpoint_dir(id))?;
        fs.sync_dir(CHECKPOINTS_DIR)
    }

    pub fn gc<F: Files>(fs: &F, retain: usize, in_flight: &[CheckpointId]) -> Result<GcReport, StorageError> {
        assert!(retain >= 1, "gc must retain at least one complete checkpoint");
        let listings = list_checkpoints(fs)?;
        let complete: Vec<CheckpointId> = listings.iter().filter(|l| l.complete).map(|l| l.id).collect();
        let retained = &complete[complete.len().saturating_sub(retain)..];
        let keep = referenced_files(fs, retained)?;
        let mut report = GcReport::default();
        for listing in &listings {
            let dir = checkpoint_dir(listing.id);
            if retained.contains(&listing.id) {
                sweep(fs, &dir, &keep, is_temp_name, &mut report)?;
            } else if listing.complete || !in_flight.contains(&listing.id) {
                let removed_files = sweep(fs, &dir, &keep, |_| true, &mut report)?;
                if fs.remove_dir_if_empty(&dir)? || removed_files > 0 {
                    report.removed_checkpoints.push(listing.id);
                }
            }
        }
        sweep(fs, "", &keep, is_temp_name, &mut report)?;
        fs.sync_dir(CHECKPOINTS_DIR)?;
        Ok(report)
    }

    /// Every file that the manifests of `ids` reference. A retained manifest that is damaged keeps its
    /// whole directory instead (its references are unknown; a restore will skip it and may fall back to
    /// an older checkpoint, so nothing of it is touched here). Other read errors fail the pass.
    fn referenced_files<F: Files>(fs: &F, ids: &[CheckpointId]) -> Result<BTreeSet<String>, StorageError> {
        let mut keep = BTreeSet::new();
        for id in ids {
            match read_manifest(fs, *id) {
                Ok(m) => keep.extend(m.tasks.into_iter().map(|t| t.file)),
                Err(e) if e.is_corruption() => {
                    let dir = checkpoint_dir(*id);
                    for entry in fs.list(&dir)? {
                        if !entry.is_dir {
                            keep.insert(format!("{dir}/{}", entry.name));
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(keep)
    }

    /// Removes the files of `dir` that pass `select` and are not in `keep`, the manifest first (so that
    /// a crash half-way leaves an incomplete attempt, never a complete checkpoint with missing files).
    /// Returns how many files it removed.
    fn sweep<F: Files>(
        fs: &F,
        dir: &str,
        keep: &BTreeSet<String>,
        select: impl Fn(&str) -> bool,
        report: &mut GcReport,
    ) -> Result<usize, StorageError> {
        let mut names: Vec<String> =
            fs.list(dir)?.into_iter().filter(|e| !e.is_dir && select(&e.name)).map(|e| e.name).collect();
        names.sort_by_key(|name| name != MANIFEST_NAME);
        let mut removed = 0;
        for name in names {
            let rel = join(dir, &name);
            if keep.contains(&rel) {
                continue;
            }
            let size = fs.size(&rel)?.unwrap_or(0);
            fs.remove_file(&rel)?;
            if name == MANIFEST_NAME {
                fs.sync_dir(dir)?;
            }
            removed += 1;
            report.removed_files += 1;
            report.removed_bytes += size;
        }
        Ok(removed)
    }

    pub fn read_meta<F: Files>(fs: &F) -> Result<Option<JobMeta>, StorageError> {
        match fs.read(META_PATH)? {
            None => Ok(None),
            Some(bytes) => decode_record(&fs.display_path(META_PATH), &bytes, FileKind::JobMeta).map(Some),
        }
    }

    pub fn write_meta<F: Files>(fs: &F, meta: &JobMeta) -> Result<(), StorageError> {
        fs.put(META_PATH, &encode_record(FileKind::JobMeta, meta))
    }

    pub fn mark_finished<F: Files>(fs: &F, checkpoint: CheckpointId) -> Result<(), StorageError> {
        if fs.size(&manifest_path(checkpoint))?.is_none() {
            return Err(StorageError::NotFound {
                what: format!("manifest of {checkpoint}, the checkpoint the job finished with"),
            });
        }
        fs.put(FINISHED_PATH, &encode_record(FileKind::Finished, &checkpoint))
    }

    pub fn finished<F: Files>(fs: &F) -> Result<Option<CheckpointId>, StorageError> {
        match fs.read(FINISHED_PATH)? {
            None => Ok(None),
            Some(bytes) => decode_record(&fs.display_path(FINISHED_PATH), &bytes, FileKind::Finished).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_dir_names_roundtrip_and_junk_is_rejected() {
        for id in [0u64, 1, 42, u64::MAX] {
            let dir = checkpoint_dir(CheckpointId(id));
            let name = dir.rsplit('/').next().unwrap();
            assert_eq!(name.len(), 24);
            assert_eq!(parse_checkpoint_dir(name), Some(CheckpointId(id)));
        }
        for junk in
            ["chk-12", "chk-0000000000000000000x", "chk-99999999999999999999", "chk--0000000000000000001", "notes", ""]
        {
            assert_eq!(parse_checkpoint_dir(junk), None, "{junk}");
        }
    }

    #[test]
    fn operator_ids_are_restricted_to_safe_characters() {
        for ok in ["a", "map.1", "A-b_c.9", "..", "-"] {
            assert!(validate_operator_id(&OperatorId::new(ok)).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "a\\b", "a b", "ü", "a:b", "x\n"] {
            assert!(matches!(
                validate_operator_id(&OperatorId::new(bad)),
                Err(StorageError::InvalidOperatorId(s)) if s == bad
            ));
        }
    }

    #[test]
    fn file_references_must_stay_inside_the_store() {
        for ok in ["checkpoints/chk-1/a.state", "x"] {
            assert!(validate_file_ref(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "a/./b", "a\\b", "a/"] {
            assert!(validate_file_ref(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn temp_names_are_recognised_and_never_collide_with_real_names() {
        let a = temp_name(MANIFEST_NAME);
        assert!(is_temp_name(&a));
        assert_ne!(a, temp_name(MANIFEST_NAME));
        for real in [MANIFEST_NAME, "job.meta", "FINISHED", ".x-0.state", "op-3.state"] {
            assert!(!is_temp_name(real), "{real}");
        }
    }
}
