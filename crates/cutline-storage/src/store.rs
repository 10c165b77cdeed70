//! The [`CheckpointStore`] contract, the layout of a store (which file lives where), and the single
//! implementation of the checkpoint semantics (commit point, generation records and fencing, listing,
//! verification, discard, gc) over a small private file-system interface, [`Files`]. Both
//! [`crate::LocalDirStore`] and [`crate::MemStore`] are that interface plus [`impl_checkpoint_store!`],
//! so they cannot drift apart.
//! It does not decide when to checkpoint, what to retain, or which checkpoint to restore.
//!
//! Layout, relative to the store root:
//!
//! ```text
//! job.meta                                          JobMeta
//! FINISHED                                          the id of the end-of-input checkpoint
//! generations/gen-<generation, 20 digits>          GenerationRecord, created only if absent
//! checkpoints/chk-<id, 20 digits>/<operator>-<subtask>.state
//! checkpoints/chk-<id, 20 digits>/_MANIFEST        present = the checkpoint is committed
//! ```
//!
//! Writes go to a temporary name (`.<name>.<pid>-<seq>.tmp`) first; listings ignore such names.
//!
//! Fencing: a committed manifest of checkpoint `c` written by generation `g` is *fenced* iff there is
//! a generation record `g2 > g` whose `restored` is `None` or below `c`. Generation `g2` recorded,
//! when it started, the complete checkpoint it restored; checkpoint ids only grow, so anything an
//! older generation committed above that point was committed by a zombie after `g2` took over. A
//! fenced checkpoint counts as not complete: listings report it as `fenced`, `latest_complete` skips
//! it, `verify` refuses it ([`StorageError::Fenced`]) and `gc` removes it. A store without generation
//! records fences nothing.
//!
//! Concurrency: tasks may write task state concurrently with anything. `commit_manifest`, `discard`,
//! `gc`, `write_meta` and `mark_finished` are the coordinator's and must not run concurrently with each
//! other on one store (gc removes leftover temporary files, which a concurrent write could still own).
//! `claim_generation` and `check_not_fenced` may run concurrently with anything, from any number of
//! coordinators (they are how coordinators of different generations find out about each other); gc
//! therefore leaves temporary files under `generations/` alone.

use crate::error::StorageError;
use crate::format::{decode_frame_at, decode_record, encode_frame, encode_record, FileKind};
use crate::manifest::{GenerationRecord, JobMeta, Manifest, TaskStateHandle};
use crate::FORMAT_VERSION;
use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};
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

    /// Every checkpoint directory, complete or not, sorted by id. Unrelated entries are ignored. A
    /// committed checkpoint that is fenced (see the module documentation) is listed with
    /// `complete: false, fenced: true`. Reads the generation records once, and the manifests of only
    /// those committed checkpoints that some record could fence (above the lowest restore point a
    /// record names); a store without generation records costs what it did before them.
    fn list_checkpoints(&self) -> Result<Vec<CheckpointListing>, StorageError>;

    /// Reads and decodes the manifest of `id`, fenced or not.
    fn read_manifest(&self, id: CheckpointId) -> Result<Manifest, StorageError>;

    /// Reads the manifest of `id` and every file it references, checking sizes and checksums.
    /// [`StorageError::Fenced`] if the checkpoint is fenced (its files are not read then).
    fn verify(&self, id: CheckpointId) -> Result<Manifest, StorageError>;

    /// Removes an attempt without a manifest (aborted or partial); files that a complete manifest
    /// references are kept. Refuses a complete checkpoint; discarding an absent one succeeds.
    fn discard(&self, id: CheckpointId) -> Result<(), StorageError>;

    /// Retention: keeps the `retain` (at least 1) latest complete checkpoints (fenced ones do not
    /// count and are removed) and the attempts in `in_flight`, removes every other checkpoint directory
    /// and leftover temporary files, and never removes a file that a retained manifest references.
    /// Then removes the generation records that can no longer fence a stored checkpoint: those below
    /// the lowest generation of the retained manifests, always keeping the newest two records (and
    /// none removed at all while a retained manifest is unreadable).
    fn gc(&self, retain: usize, in_flight: &[CheckpointId]) -> Result<GcReport, StorageError>;

    fn read_meta(&self) -> Result<Option<JobMeta>, StorageError>;

    /// Durably and atomically replaces the job metadata.
    ///
    /// A plain overwrite, also on object stores, and by design: `job.meta` decides nothing about who
    /// owns the job. Ownership is decided by the generation records, created only if absent
    /// ([`CheckpointStore::claim_generation`]), and a zombie's late commits are fenced by them, so a
    /// zombie overwriting `job.meta` cannot make its checkpoints count. What a stale overwrite can do is
    /// lower the recorded generation and epoch lease; hence new generations are taken above
    /// [`CheckpointStore::latest_generation`] too, and new checkpoint ids above
    /// [`CheckpointStore::max_checkpoint_id_seen`] too (every committed or attempted id has a directory).
    fn write_meta(&self, meta: &JobMeta) -> Result<(), StorageError>;

    /// Starts generation `record.generation` of the job in this store: creates its record, only if
    /// absent, durably and with its whole content at once (on every backend: a hard link of a synced
    /// temporary file locally, a conditional PUT on an object store, whose lost answer is resolved by
    /// reading the record back). A coordinator claims its generation after choosing the checkpoint it
    /// restores (`record.restored`) and before it commits anything.
    ///
    /// [`StorageError::GenerationTaken`] if that generation already has a record (another coordinator
    /// started it; claiming the same record twice is refused too).
    /// [`StorageError::Superseded`] if a higher generation already has a record, checked before and
    /// after the create; found after, the record just created is removed again, so that a coordinator
    /// that lost the race leaves no record with an older restore point behind.
    fn claim_generation(&self, record: &GenerationRecord) -> Result<(), StorageError>;

    /// Remove the record of `generation`, claimed by this caller, before the generation ran anything:
    /// its start found that an older generation completed a checkpoint between the start's listing and
    /// its claim, which the record would fence although that checkpoint's sinks may have committed.
    /// The caller then starts over (and sees that checkpoint).
    fn release_generation(&self, generation: Generation) -> Result<(), StorageError>;

    /// Every generation record, ascending. A damaged record is an error (as a damaged `job.meta` is).
    fn generations(&self) -> Result<Vec<GenerationRecord>, StorageError>;

    /// The record of the highest generation, if any (reads only that one).
    fn latest_generation(&self) -> Result<Option<GenerationRecord>, StorageError>;

    /// `Ok` unless a generation above `generation` has a record, then [`StorageError::Superseded`]
    /// naming the newest one and its owner. The coordinator of `generation` calls it right before and
    /// right after committing a manifest (and should before discard and gc), and stops on `Superseded`.
    /// One listing of `generations/` and, only when superseded, one read.
    fn check_not_fenced(&self, generation: Generation) -> Result<(), StorageError>;

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

    /// The highest checkpoint id of any directory, complete, fenced or not: new ids must be above it.
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
    /// Whether its manifest is committed and it is not fenced: whether it may be restored.
    pub complete: bool,
    /// Whether its manifest is committed but fenced: written by an older generation after a newer one
    /// took over (see the module documentation). Never restored; `gc` removes it.
    pub fenced: bool,
}

/// What one [`CheckpointStore::gc`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Checkpoints and attempts that lost their manifest, any file or their directory, by id.
    pub removed_checkpoints: Vec<CheckpointId>,
    pub removed_files: usize,
    pub removed_bytes: u64,
    /// Generation records removed (no longer able to fence a stored checkpoint), ascending.
    pub removed_generations: Vec<Generation>,
}

// ---- layout -------------------------------------------------------------------------------------

pub(crate) const CHECKPOINTS_DIR: &str = "checkpoints";
pub(crate) const MANIFEST_NAME: &str = "_MANIFEST";
pub(crate) const GENERATIONS_DIR: &str = "generations";
const META_PATH: &str = "job.meta";
const FINISHED_PATH: &str = "FINISHED";
/// How many of the newest generation records gc always keeps.
const KEEP_NEWEST_GENERATIONS: usize = 2;

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
    parse_padded(name, "chk-").map(CheckpointId)
}

pub(crate) fn generation_path(generation: Generation) -> String {
    format!("{GENERATIONS_DIR}/gen-{:020}", generation.0)
}

fn parse_generation_name(name: &str) -> Option<Generation> {
    parse_padded(name, "gen-").map(Generation)
}

/// `<prefix><20 digits>` -> the number.
fn parse_padded(name: &str, prefix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
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
            fn max_checkpoint_id_seen(&self) -> Result<Option<::cutline_core::CheckpointId>, $crate::StorageError> {
                $crate::store::ops::max_checkpoint_id_seen(self)
            }
            fn claim_generation(&self, record: &$crate::GenerationRecord) -> Result<(), $crate::StorageError> {
                $crate::store::ops::claim_generation(self, record)
            }
            fn release_generation(&self, generation: ::cutline_core::Generation) -> Result<(), $crate::StorageError> {
                $crate::store::ops::release_generation(self, generation)
            }
            fn generations(&self) -> Result<Vec<$crate::GenerationRecord>, $crate::StorageError> {
                $crate::store::ops::generations(self)
            }
            fn latest_generation(&self) -> Result<Option<$crate::GenerationRecord>, $crate::StorageError> {
                $crate::store::ops::latest_generation(self)
            }
            fn check_not_fenced(&self, generation: ::cutline_core::Generation) -> Result<(), $crate::StorageError> {
                $crate::store::ops::check_not_fenced(self, generation)
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

    /// Every checkpoint directory, `complete` meaning only that its manifest is there (fenced or not).
    fn list_committed<F: Files>(fs: &F) -> Result<Vec<CheckpointListing>, StorageError> {
        let mut out = Vec::new();
        for entry in fs.list(CHECKPOINTS_DIR)? {
            let Some(id) = parse_checkpoint_dir(&entry.name).filter(|_| entry.is_dir) else {
                continue;
            };
            let complete = fs.size(&manifest_path(id))?.is_some();
            out.push(CheckpointListing { id, complete, fenced: false });
        }
        out.sort_by_key(|l| l.id);
        Ok(out)
    }

    /// Without reading generation records or manifests: fenced ids count too.
    pub fn max_checkpoint_id_seen<F: Files>(fs: &F) -> Result<Option<CheckpointId>, StorageError> {
        Ok(list_committed(fs)?.last().map(|l| l.id))
    }

    pub fn list_checkpoints<F: Files>(fs: &F) -> Result<Vec<CheckpointListing>, StorageError> {
        let mut out = list_committed(fs)?;
        if !out.iter().any(|l| l.complete) {
            return Ok(out);
        }
        let mut fences = Fences::read(fs)?;
        for listing in out.iter_mut().filter(|l| l.complete) {
            if !fences.may_fence(listing.id) {
                continue; // no record could fence it: its manifest need not be read
            }
            let generation = match decode_manifest(fs, listing.id) {
                Ok(m) if m.checkpoint == listing.id => m.generation,
                // Unreadable or misplaced: left for `verify` to report; a restore skips it anyway.
                Ok(_) => continue,
                Err(e) if e.is_corruption() => continue,
                Err(e) => return Err(e),
            };
            if fences.fenced_by(listing.id, generation)?.is_some() {
                listing.complete = false;
                listing.fenced = true;
            }
        }
        Ok(out)
    }

    /// Reads and decodes a manifest without checking that it names `id`.
    fn decode_manifest<F: Files>(fs: &F, id: CheckpointId) -> Result<Manifest, StorageError> {
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
        Ok(manifest)
    }

    pub fn read_manifest<F: Files>(fs: &F, id: CheckpointId) -> Result<Manifest, StorageError> {
        let manifest = decode_manifest(fs, id)?;
        assert_eq!(
            manifest.checkpoint,
            id,
            "{} holds the manifest of another checkpoint: checkpoint directories were renamed by hand",
            fs.display_path(&manifest_path(id)).display()
        );
        Ok(manifest)
    }

    pub fn verify<F: Files>(fs: &F, id: CheckpointId) -> Result<Manifest, StorageError> {
        let manifest = read_manifest(fs, id)?;
        if let Some(by) = Fences::read(fs)?.fenced_by(id, manifest.generation)? {
            return Err(StorageError::Fenced { checkpoint: id, generation: manifest.generation, by });
        }
        for task in &manifest.tasks {
            read_task_state(fs, task)?;
        }
        Ok(manifest)
    }

    pub fn discard<F: Files>(fs: &F, id: CheckpointId) -> Result<(), StorageError> {
        if fs.size(&manifest_path(id))?.is_some() {
            return Err(StorageError::DiscardComplete(id));
        }
        // Only a later manifest can reference files of this attempt's directory. Fenced ones count
        // here: keeping their files is harmless (gc removes them), and it spares reading generations.
        let later: Vec<CheckpointId> =
            list_committed(fs)?.into_iter().filter(|l| l.complete && l.id > id).map(|l| l.id).collect();
        let keep = referenced_files(fs, &later)?.files;
        sweep(fs, &checkpoint_dir(id), &keep, |_| true, &mut GcReport::default())?;
        fs.remove_dir_if_empty(&checkpoint_dir(id))?;
        fs.sync_dir(CHECKPOINTS_DIR)
    }

    pub fn gc<F: Files>(fs: &F, retain: usize, in_flight: &[CheckpointId]) -> Result<GcReport, StorageError> {
        assert!(retain >= 1, "gc must retain at least one complete checkpoint");
        // Fenced checkpoints are not complete: they neither count towards `retain` nor stay.
        let listings = list_checkpoints(fs)?;
        let complete: Vec<CheckpointId> = listings.iter().filter(|l| l.complete).map(|l| l.id).collect();
        let retained = &complete[complete.len().saturating_sub(retain)..];
        let referenced = referenced_files(fs, retained)?;
        let keep = &referenced.files;
        let mut report = GcReport::default();
        for listing in &listings {
            let dir = checkpoint_dir(listing.id);
            // Of the retained checkpoints only the newest is swept for temporary files (of retried
            // writes): the older ones were swept when they were the newest, and whatever else they hold
            // goes with the whole directory once they leave retention. (Listing every retained
            // directory on every completion made retention the coordinator's largest cost per
            // checkpoint at thousands of tasks.)
            if retained.contains(&listing.id) {
                if retained.last() == Some(&listing.id) {
                    sweep(fs, &dir, keep, is_temp_name, &mut report)?;
                }
            } else if listing.complete || listing.fenced || !in_flight.contains(&listing.id) {
                let removed_files = sweep(fs, &dir, keep, |_| true, &mut report)?;
                if fs.remove_dir_if_empty(&dir)? || removed_files > 0 {
                    report.removed_checkpoints.push(listing.id);
                }
            }
        }
        sweep(fs, "", keep, is_temp_name, &mut report)?;
        fs.sync_dir(CHECKPOINTS_DIR)?;
        // Generation records last, once the checkpoints they fenced are gone. A record of generation
        // g2 fences only manifests of generations below g2, so records below the lowest generation of
        // the retained manifests fence nothing that is stored. The newest ones always stay: they fence
        // what zombies may still commit. An unreadable retained manifest has an unknown generation:
        // then nothing is removed. (Temporary files under generations/ are left alone: a concurrent
        // claim of another coordinator may own them.)
        if !referenced.any_damaged {
            let names = generation_names(fs)?;
            let removable = names.len().saturating_sub(KEEP_NEWEST_GENERATIONS);
            for generation in &names[..removable] {
                if referenced.min_generation.is_none_or(|min| *generation < min) {
                    fs.remove_file(&generation_path(*generation))?;
                    report.removed_generations.push(*generation);
                }
            }
            if !report.removed_generations.is_empty() {
                fs.sync_dir(GENERATIONS_DIR)?;
            }
        }
        Ok(report)
    }

    /// What a set of manifests references.
    struct Referenced {
        files: BTreeSet<String>,
        /// The lowest generation among the intact manifests.
        min_generation: Option<Generation>,
        /// Whether some manifest could not be read (see [`referenced_files`]).
        any_damaged: bool,
    }

    /// Every file that the manifests of `ids` reference. A retained manifest that is damaged keeps its
    /// whole directory instead (its references are unknown; a restore will skip it and may fall back to
    /// an older checkpoint, so nothing of it is touched here). Other read errors fail the pass.
    fn referenced_files<F: Files>(fs: &F, ids: &[CheckpointId]) -> Result<Referenced, StorageError> {
        let mut out = Referenced { files: BTreeSet::new(), min_generation: None, any_damaged: false };
        for id in ids {
            match read_manifest(fs, *id) {
                Ok(m) => {
                    out.min_generation = Some(out.min_generation.map_or(m.generation, |g| g.min(m.generation)));
                    out.files.extend(m.tasks.into_iter().map(|t| t.file));
                }
                Err(e) if e.is_corruption() => {
                    out.any_damaged = true;
                    let dir = checkpoint_dir(*id);
                    for entry in fs.list(&dir)? {
                        if !entry.is_dir {
                            out.files.insert(format!("{dir}/{}", entry.name));
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
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

    /// A plain `put`, on every backend: see [`CheckpointStore::write_meta`] for why that is safe.
    pub fn write_meta<F: Files>(fs: &F, meta: &JobMeta) -> Result<(), StorageError> {
        fs.put(META_PATH, &encode_record(FileKind::JobMeta, meta))
    }

    // ---- generation records and fencing ----

    /// The generations that have a record, ascending (from the names; nothing is read).
    fn generation_names<F: Files>(fs: &F) -> Result<Vec<Generation>, StorageError> {
        let mut out: Vec<Generation> = fs
            .list(GENERATIONS_DIR)?
            .into_iter()
            .filter(|e| !e.is_dir)
            .filter_map(|e| parse_generation_name(&e.name))
            .collect();
        out.sort();
        Ok(out)
    }

    /// The record of `generation`; `None` if there is none. A record filed under another generation's
    /// name is damage ([`StorageError::Decode`]).
    fn read_generation<F: Files>(fs: &F, generation: Generation) -> Result<Option<GenerationRecord>, StorageError> {
        let rel = generation_path(generation);
        let Some(bytes) = fs.read(&rel)? else {
            return Ok(None);
        };
        let path = fs.display_path(&rel);
        let record: GenerationRecord = decode_record(&path, &bytes, FileKind::GenerationRecord)?;
        if record.generation != generation {
            return Err(StorageError::Decode {
                path,
                reason: format!(
                    "it holds the record of generation {}, not of generation {}: generation records were \
                     renamed by hand",
                    record.generation.0, generation.0
                ),
            });
        }
        Ok(Some(record))
    }

    /// Who started `generation`, for messages: its record's owner, or why that is unknown.
    fn owner_of<F: Files>(fs: &F, generation: Generation) -> String {
        match read_generation(fs, generation) {
            Ok(Some(record)) => record.owner,
            Ok(None) => "owner unknown: its record is gone".to_string(),
            Err(e) => format!("owner unknown: {e}"),
        }
    }

    /// [`StorageError::Superseded`] if a generation above `generation` has a record.
    fn superseded<F: Files>(fs: &F, generation: Generation) -> Result<Option<StorageError>, StorageError> {
        Ok(match generation_names(fs)?.last() {
            Some(&newer) if newer > generation => {
                Some(StorageError::Superseded { generation, newer, owner: owner_of(fs, newer) })
            }
            _ => None,
        })
    }

    pub fn release_generation<F: Files>(fs: &F, generation: Generation) -> Result<(), StorageError> {
        fs.remove_file(&generation_path(generation))?;
        fs.sync_dir(GENERATIONS_DIR)
    }

    pub fn claim_generation<F: Files>(fs: &F, record: &GenerationRecord) -> Result<(), StorageError> {
        let generation = record.generation;
        if let Some(err) = superseded(fs, generation)? {
            return Err(err);
        }
        let rel = generation_path(generation);
        if !fs.put_new(&rel, &encode_record(FileKind::GenerationRecord, record))? {
            return Err(StorageError::GenerationTaken { generation, owner: owner_of(fs, generation) });
        }
        // A newer generation claimed between the check and the create: this coordinator lost. Its
        // record would fence, from its (older) restore point up, checkpoints that the newer generation
        // may have restored; nothing was committed under it, so it goes.
        if let Some(err) = superseded(fs, generation)? {
            fs.remove_file(&rel)?;
            fs.sync_dir(GENERATIONS_DIR)?;
            return Err(err);
        }
        Ok(())
    }

    pub fn generations<F: Files>(fs: &F) -> Result<Vec<GenerationRecord>, StorageError> {
        let mut out = Vec::new();
        for generation in generation_names(fs)? {
            out.extend(read_generation(fs, generation)?);
        }
        Ok(out)
    }

    pub fn latest_generation<F: Files>(fs: &F) -> Result<Option<GenerationRecord>, StorageError> {
        for generation in generation_names(fs)?.into_iter().rev() {
            if let Some(record) = read_generation(fs, generation)? {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    pub fn check_not_fenced<F: Files>(fs: &F, generation: Generation) -> Result<(), StorageError> {
        match superseded(fs, generation)? {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// The generation records as far as fencing needs them, read once per listing or verification:
    /// each generation with its restore point, or the error that its record is damaged (its
    /// generation is known from its name). Ascending by generation.
    struct Fences {
        records: Vec<(Generation, Result<Option<CheckpointId>, StorageError>)>,
    }

    impl Fences {
        fn read<F: Files>(fs: &F) -> Result<Fences, StorageError> {
            let mut records = Vec::new();
            for generation in generation_names(fs)? {
                match read_generation(fs, generation) {
                    Ok(Some(record)) => records.push((generation, Ok(record.restored))),
                    Ok(None) => {} // removed by gc since the listing
                    Err(e) if e.is_corruption() => records.push((generation, Err(e))),
                    Err(e) => return Err(e),
                }
            }
            Ok(Fences { records })
        }

        /// Whether some record could fence a committed checkpoint `checkpoint` of an older generation
        /// (a damaged record could fence anything): only then is the manifest's generation needed.
        fn may_fence(&self, checkpoint: CheckpointId) -> bool {
            self.records.iter().any(|(_, restored)| match restored {
                Ok(restored) => restored.is_none_or(|r| r < checkpoint),
                Err(_) => true,
            })
        }

        /// The generation that fences the manifest of `checkpoint` written by `generation`: the
        /// lowest `g2 > generation` whose record restored nothing or a checkpoint below `checkpoint`.
        /// The damage of a record that might fence it, if no intact record does.
        fn fenced_by(
            &mut self,
            checkpoint: CheckpointId,
            generation: Generation,
        ) -> Result<Option<Generation>, StorageError> {
            let mut damaged = None;
            for (i, (g2, restored)) in self.records.iter().enumerate() {
                if *g2 <= generation {
                    continue;
                }
                match restored {
                    Ok(restored) if restored.is_none_or(|r| r < checkpoint) => return Ok(Some(*g2)),
                    Ok(_) => {}
                    Err(_) => {
                        damaged.get_or_insert(i);
                    }
                }
            }
            match damaged {
                Some(i) => Err(self.records.swap_remove(i).1.expect_err("a damaged record")),
                None => Ok(None),
            }
        }
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
    fn generation_record_names_roundtrip_and_junk_is_rejected() {
        assert_eq!(generation_path(Generation(7)), "generations/gen-00000000000000000007");
        for g in [0u64, 1, 42, u64::MAX] {
            let path = generation_path(Generation(g));
            let name = path.rsplit('/').next().unwrap();
            assert_eq!(parse_generation_name(name), Some(Generation(g)));
        }
        let temp = temp_name("gen-00000000000000000007");
        for junk in ["gen-7", "chk-00000000000000000007", "gen-0000000000000000000x", temp.as_str(), ""] {
            assert_eq!(parse_generation_name(junk), None, "{junk}");
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
