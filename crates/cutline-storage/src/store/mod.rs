//! The [`CheckpointStore`] contract, the layout of a store (which file lives where), and the single
//! implementation of the checkpoint semantics (commit point, generation records and fencing, listing,
//! verification, discard, gc) over a small private file-system interface, [`Files`]. Both
//! [`crate::LocalDirStore`] and [`crate::MemStore`] are that interface plus [`impl_checkpoint_store!`],
//! so they cannot drift apart.
//! It does not decide when to checkpoint, what to retain, or which checkpoint to restore.
//!
//! The layout of a store, fencing and the concurrency rules are part of the contract and documented
//! on [`CheckpointStore`].
//!
//! Submodules: [`layout`] (names and paths), [`files`] (the [`Files`] interface and
//! [`impl_checkpoint_store!`]), [`ops`] (the checkpoint semantics) and [`fencing`] (generation
//! records and fencing).

pub(crate) mod fencing;
mod files;
pub(crate) mod layout;
pub(crate) mod ops;
pub(crate) mod stats;

#[cfg(feature = "s3")]
pub(crate) use files::read_source;
pub(crate) use files::{impl_checkpoint_store, Entry, Files};

use crate::error::StorageError;
use crate::frame::TaskStateFrame;
use crate::manifest::{GenerationRecord, JobMeta, Manifest, TaskStateHandle};
use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};

/// Durable storage of checkpoints and job metadata: the contract that
/// [`LocalDirStore`](crate::LocalDirStore), [`MemStore`](crate::MemStore), `S3Store` (feature `s3`)
/// and [`FaultyStore`](crate::FaultyStore) implement with the same semantics. Object safe: the
/// engine holds an `Arc<dyn CheckpointStore>`.
///
/// A checkpoint is committed by exactly one thing: its manifest ([`CheckpointStore::commit_manifest`]).
/// Task state written without one is an attempt, which [`CheckpointStore::discard`] or
/// [`CheckpointStore::gc`] removes. Every read checks what it reads (frame, size, checksum) and
/// reports damage as a [`StorageError`] for which [`StorageError::is_corruption`] holds. The store
/// retries nothing itself (except `S3Store`'s own request retries): it reports, the caller decides.
///
/// # Layout
///
/// Relative to the store root (for `S3Store`, the prefix in the bucket):
///
/// ```text
/// job.meta                                          JobMeta
/// FINISHED                                          the id of the end-of-input checkpoint
/// LOCK                                              the lock file (LocalDirStore only)
/// generations/gen-<generation, 20 digits>          GenerationRecord, created only if absent
/// checkpoints/chk-<id, 20 digits>/<operator>-<subtask>.state
/// checkpoints/chk-<id, 20 digits>/_MANIFEST        present = the checkpoint is committed
/// stats/chk-<id, 20 digits>                          statistics of a completed checkpoint (opaque)
/// ```
///
/// [`LocalDirStore`](crate::LocalDirStore) writes to a temporary name (`.<name>.<pid>-<seq>.tmp`)
/// first and renames it into place; listings ignore such names, and `gc` removes leftovers. (A
/// [`MemStore`](crate::MemStore) and an object store write each file whole at once and leave no
/// temporary files.)
///
/// # Fencing
///
/// A committed manifest of checkpoint `c` written by generation `g` is *fenced* iff there is a
/// generation record `g2 > g` whose `restored` is `None` or below `c`. Generation `g2` recorded, when
/// it started, the complete checkpoint it restored; checkpoint ids only grow, so anything an older
/// generation committed above that point was committed by a zombie after `g2` took over. A fenced
/// checkpoint counts as not complete: listings report it as `fenced`,
/// [`CheckpointStore::latest_complete`] skips it, [`CheckpointStore::verify`] refuses it
/// ([`StorageError::Fenced`]) and [`CheckpointStore::gc`] removes it. A store without generation
/// records fences nothing.
///
/// # Concurrency
///
/// Tasks may write task state concurrently with anything. `commit_manifest`, `discard`, `gc`,
/// `write_meta`, `mark_finished` and `release_generation` are the coordinator's and must not run
/// concurrently with each other on one store (gc removes leftover temporary files, which a concurrent
/// write could still own). `claim_generation` and `check_not_fenced` may run concurrently with
/// anything, from any number of coordinators (they are how coordinators of different generations find
/// out about each other); gc therefore leaves temporary files under `generations/` alone.
pub trait CheckpointStore: Send + Sync {
    /// Frames `payload` (opaque to the store) and writes it durably as the state of (`operator`,
    /// `subtask`) in `checkpoint`; on `Ok` the file is durable, and the returned handle (which also
    /// records `parallelism` and `key_groups`, the subtask's share of the keys) is what a manifest
    /// references. Writing the same triple again replaces the file (a retried write).
    ///
    /// [`StorageError::ManifestExists`] if `checkpoint` is already committed;
    /// [`StorageError::InvalidOperatorId`] if `operator` cannot be part of a file name (nothing is
    /// written then). An object store writes the file with one PUT, so a payload is limited to S3's
    /// 5 GiB there.
    fn write_task_state(
        &self,
        checkpoint: CheckpointId,
        operator: &OperatorId,
        subtask: SubtaskIndex,
        parallelism: u32,
        key_groups: Option<KeyGroupRange>,
        payload: &[u8],
    ) -> Result<TaskStateHandle, StorageError> {
        let frame = TaskStateFrame::new(payload);
        self.write_task_frame(checkpoint, operator, subtask, parallelism, key_groups, &frame)
    }

    /// [`CheckpointStore::write_task_state`] of a payload framed already, written as it is (a large
    /// state is then not copied into a frame).
    fn write_task_frame(
        &self,
        checkpoint: CheckpointId,
        operator: &OperatorId,
        subtask: SubtaskIndex,
        parallelism: u32,
        key_groups: Option<KeyGroupRange>,
        frame: &TaskStateFrame,
    ) -> Result<TaskStateHandle, StorageError>;

    /// Reads the task state file of `handle`, checks its size and checksum against the handle and its
    /// frame, and returns the payload that was written. [`StorageError::InvalidPath`] if the handle
    /// names a path outside the store (nothing is read), [`StorageError::NotFound`] if the file is
    /// gone, [`StorageError::SizeMismatch`], [`StorageError::ChecksumMismatch`] or a frame error if it
    /// is damaged: all corruption.
    fn read_task_state(&self, handle: &TaskStateHandle) -> Result<Vec<u8>, StorageError>;

    /// Reads every file of `handle`'s chain, the files it builds on
    /// ([`TaskStateHandle::base`]) oldest first and its own last, checking each as
    /// [`CheckpointStore::read_task_state`] does. For a self-contained snapshot: one payload.
    fn read_task_chain(&self, handle: &TaskStateHandle) -> Result<Vec<Vec<u8>>, StorageError>;

    /// The commit point of a checkpoint: durably and atomically writes its manifest, never replacing
    /// one ([`StorageError::ManifestExists`], also when a concurrent commit of the same id won).
    /// It does not check fencing: the coordinator calls [`CheckpointStore::check_not_fenced`] around
    /// it.
    ///
    /// Panics (a bug of the caller) if the manifest was not built with [`Manifest::new`] (another
    /// `format_version`), or if a referenced task file is missing or has another size than recorded:
    /// manifests are only built from acknowledged writes. [`StorageError::InvalidPath`] if a handle
    /// names a path outside the store. [`StorageError::BaseMissing`] if a file an incremental
    /// snapshot builds on is gone (retention removed it after the snapshot was taken) or is not of
    /// an older checkpoint.
    fn commit_manifest(&self, manifest: &Manifest) -> Result<(), StorageError>;

    /// Every checkpoint directory, complete or not, sorted by id. Unrelated entries are ignored. A
    /// committed checkpoint that is fenced (see [Fencing](CheckpointStore#fencing)) is listed with
    /// `complete: false, fenced: true`.
    ///
    /// Cost: one listing of `checkpoints/` and one existence check per directory; if any checkpoint
    /// is committed, one listing and one read of each generation record, and the manifests of only
    /// those committed checkpoints that some record could fence (above the lowest restore point a
    /// record names). Other manifests are not read, so `complete` does not mean intact: see
    /// [`CheckpointListing::complete`]. A damaged manifest is left for `verify` to report; a
    /// damaged generation record that could decide whether a checkpoint is fenced fails the listing
    /// (a corruption error).
    fn list_checkpoints(&self) -> Result<Vec<CheckpointListing>, StorageError>;

    /// Reads and decodes the manifest of `id`, fenced or not, without reading the files it references.
    /// [`StorageError::NotFound`] if `id` has no manifest; [`StorageError::MisplacedManifest`]
    /// (corruption) if the manifest in `id`'s directory names another checkpoint: a checkpoint
    /// directory was renamed or copied by hand; [`StorageError::UnsupportedVersion`] if it was written
    /// by a newer cutline.
    fn read_manifest(&self, id: CheckpointId) -> Result<Manifest, StorageError>;

    /// Reads the manifest of `id` and every file it references, checking sizes and checksums.
    /// [`StorageError::Fenced`] if the checkpoint is fenced (its files are not read then); the errors of
    /// [`CheckpointStore::read_manifest`] if its manifest cannot be read or is misplaced.
    fn verify(&self, id: CheckpointId) -> Result<Manifest, StorageError> {
        self.verify_reading(id, &mut |_, _| {})
    }

    /// [`CheckpointStore::verify`], handing each task's chain of payloads, as
    /// [`CheckpointStore::read_task_chain`] returns it, to `chain` once it is checked: a restore
    /// reads every file once. The checkpoint verifies only if this returns `Ok`; what `chain` was
    /// given before an error is of a checkpoint that does not verify.
    fn verify_reading(
        &self,
        id: CheckpointId,
        chain: &mut dyn FnMut(&TaskStateHandle, Vec<Vec<u8>>),
    ) -> Result<Manifest, StorageError>;

    /// Removes an attempt without a manifest (aborted or partial); files of it that a later committed
    /// manifest references are kept. Refuses every checkpoint that has a manifest, fenced ones
    /// included ([`StorageError::DiscardComplete`]: those only [`CheckpointStore::gc`] removes);
    /// discarding an absent one succeeds.
    fn discard(&self, id: CheckpointId) -> Result<(), StorageError>;

    /// Retention: keeps the `retain` (at least 1; 0 panics; `usize::MAX` keeps every complete one)
    /// latest complete checkpoints (fenced ones do not count and are removed) and the attempts
    /// without a manifest listed in `in_flight`, removes every other checkpoint directory, and never
    /// removes a file that a retained manifest references (a retained manifest that is damaged keeps
    /// its whole directory). Leftover temporary files are removed at the store root and in the
    /// newest retained checkpoint (the older ones were swept when they were the newest), never in
    /// in-flight attempts or under `generations/`.
    ///
    /// Then removes the generation records that can no longer fence a stored checkpoint: those below
    /// the lowest generation of the retained manifests, always keeping the newest two records (and
    /// none removed at all while a retained manifest is unreadable). Manifests go before the other
    /// files of a directory, so a crash half-way leaves attempts, never a complete checkpoint with
    /// missing files.
    fn gc(&self, retain: usize, in_flight: &[CheckpointId]) -> Result<GcReport, StorageError>;

    /// The job metadata (`job.meta`); `None` if none was ever written. A damaged file is an error
    /// ([`StorageError::is_corruption`]), never `None`.
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

    /// Removes the record of `generation`, claimed by this caller, before the generation ran anything:
    /// its start found that an older generation completed a checkpoint between the start's listing and
    /// its claim, which the record would fence although that checkpoint's sinks may have committed.
    /// The caller then starts over (and sees that checkpoint). A record that is already gone is not
    /// an error. Never call it for a generation that has run: the checkpoints of older generations
    /// that its record fences would count as complete again.
    fn release_generation(&self, generation: Generation) -> Result<(), StorageError>;

    /// Every generation record, ascending. A damaged record is an error (as a damaged `job.meta` is).
    fn generations(&self) -> Result<Vec<GenerationRecord>, StorageError>;

    /// The record of the highest generation, if any (one listing of `generations/`, and normally one
    /// read: only that record's). A damaged record is an error, as in
    /// [`CheckpointStore::generations`].
    fn latest_generation(&self) -> Result<Option<GenerationRecord>, StorageError>;

    /// `Ok` unless a generation above `generation` has a record, then [`StorageError::Superseded`]
    /// naming the newest one and its owner. The coordinator of `generation` calls it right before and
    /// right after committing a manifest (and should before discard and gc), and stops on `Superseded`.
    /// One listing of `generations/` and, only when superseded, one read.
    fn check_not_fenced(&self, generation: Generation) -> Result<(), StorageError>;

    /// Records, durably, that the job finished with the complete checkpoint `checkpoint` (the
    /// `FINISHED` marker, replacing an earlier one). [`StorageError::NotFound`] if `checkpoint` has no
    /// manifest; it checks only that the manifest exists, not that it is intact or unfenced.
    fn mark_finished(&self, checkpoint: CheckpointId) -> Result<(), StorageError>;

    /// The checkpoint the job finished with, as [`CheckpointStore::mark_finished`] recorded it;
    /// `None` if it never finished. A damaged marker is an error ([`StorageError::is_corruption`]).
    /// The checkpoint it names may since have been removed or replaced: check it before trusting it.
    fn finished(&self) -> Result<Option<CheckpointId>, StorageError>;

    /// Writes (replacing) the statistics of the completed checkpoint `checkpoint`: an opaque payload,
    /// framed and checksummed, that the engine keeps for people (durations, sizes, the epoch's trace).
    /// Statistics decide nothing: retention ([`CheckpointStore::gc`]) leaves them alone, and
    /// [`CheckpointStore::prune_stats`] keeps the newest.
    fn write_stats(&self, checkpoint: CheckpointId, payload: &[u8]) -> Result<(), StorageError>;

    /// The statistics of `checkpoint` as written; `None` if there are none. A damaged file is an
    /// error ([`StorageError::is_corruption`]).
    fn read_stats(&self, checkpoint: CheckpointId) -> Result<Option<Vec<u8>>, StorageError>;

    /// The checkpoints that have statistics, ascending (one listing of `stats/`).
    fn list_stats(&self) -> Result<Vec<CheckpointId>, StorageError>;

    /// Removes the statistics of all but the `keep` newest checkpoints, and leftovers of interrupted
    /// writes; returns how many files it removed.
    fn prune_stats(&self, keep: usize) -> Result<usize, StorageError>;

    /// Where the store lives, for messages (e.g. `local directory /var/lib/job`,
    /// `s3://bucket/prefix at http://127.0.0.1:9000`).
    fn describe(&self) -> String;

    /// Takes the store for one running job, for as long as the returned guard lives:
    /// [`StorageError::Locked`] if another run holds it. [`LocalDirStore`](crate::LocalDirStore)
    /// takes an advisory `flock` of `<root>/LOCK`, which refuses other processes and other guards in
    /// this process, and which the OS releases if the holder dies. [`MemStore`](crate::MemStore)
    /// refuses a second guard on the same value. `S3Store` and the default implementation hand out
    /// a guard that locks nothing: there, generation records and fencing are what keep two runs from
    /// corrupting each other.
    fn lock(&self) -> Result<StoreLock, StorageError> {
        Ok(StoreLock::none())
    }

    /// The highest checkpoint id of any directory, complete, fenced or not: new ids must be above it.
    /// The built-in stores read no manifest and no generation record for it; the default
    /// implementation goes through [`CheckpointStore::list_checkpoints`].
    fn max_checkpoint_id_seen(&self) -> Result<Option<CheckpointId>, StorageError> {
        Ok(self.list_checkpoints()?.last().map(|l| l.id))
    }

    /// The highest id of a complete (committed, not fenced) checkpoint: the newest restore candidate.
    /// Its manifest and files may still be damaged; [`CheckpointStore::verify`] tells.
    fn latest_complete(&self) -> Result<Option<CheckpointId>, StorageError> {
        Ok(self.list_checkpoints()?.iter().rev().find(|l| l.complete).map(|l| l.id))
    }
}

/// Holds a store for one running job until dropped (see [`CheckpointStore::lock`]); for some stores
/// it holds nothing.
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
    /// The checkpoint id, from the directory name `chk-<id>`.
    pub id: CheckpointId,
    /// Whether its manifest is committed and it is not fenced: whether it is a restore candidate.
    /// The manifest is usually not read by the listing, so it may still be damaged or misplaced:
    /// [`CheckpointStore::verify`] it before restoring.
    pub complete: bool,
    /// Whether its manifest is committed but fenced: written by an older generation after a newer one
    /// took over (see [Fencing](CheckpointStore#fencing)). Never restored; `gc` removes it.
    pub fenced: bool,
}

/// What one [`CheckpointStore::gc`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The checkpoints and attempts outside retention of which gc removed files or the directory,
    /// ascending. Files that a retained manifest references stay, and with them their directory.
    pub removed_checkpoints: Vec<CheckpointId>,
    /// How many files gc removed, temporary leftovers included (generation records not included).
    pub removed_files: usize,
    /// The summed size in bytes of those files, as the store reported it just before removing each
    /// (saturating at `u64::MAX`).
    pub removed_bytes: u64,
    /// Generation records removed (no longer able to fence a stored checkpoint), ascending.
    pub removed_generations: Vec<Generation>,
}
