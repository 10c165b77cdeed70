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
//!
//! Submodules: [`layout`] (names and paths), [`files`] (the [`Files`] interface and
//! [`impl_checkpoint_store!`]), [`ops`] (the checkpoint semantics) and [`fencing`] (generation
//! records and fencing).

pub(crate) mod fencing;
mod files;
pub(crate) mod layout;
pub(crate) mod ops;

pub(crate) use files::{impl_checkpoint_store, Entry, Files};

use crate::error::StorageError;
use crate::manifest::{GenerationRecord, JobMeta, Manifest, TaskStateHandle};
use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};

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

    /// Reads and decodes the manifest of `id`, fenced or not. [`StorageError::MisplacedManifest`]
    /// (corruption) if the manifest in `id`'s directory names another checkpoint: a checkpoint
    /// directory was renamed or copied by hand.
    fn read_manifest(&self, id: CheckpointId) -> Result<Manifest, StorageError>;

    /// Reads the manifest of `id` and every file it references, checking sizes and checksums.
    /// [`StorageError::Fenced`] if the checkpoint is fenced (its files are not read then); the errors of
    /// [`CheckpointStore::read_manifest`] if its manifest cannot be read or is misplaced.
    fn verify(&self, id: CheckpointId) -> Result<Manifest, StorageError>;

    /// Removes an attempt without a manifest (aborted or partial); files that a complete manifest
    /// references are kept. Refuses a complete checkpoint; discarding an absent one succeeds.
    fn discard(&self, id: CheckpointId) -> Result<(), StorageError>;

    /// Retention: keeps the `retain` (at least 1; 0 panics) latest complete checkpoints (fenced ones do
    /// not count and are removed) and the attempts in `in_flight`, removes every other checkpoint directory
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
