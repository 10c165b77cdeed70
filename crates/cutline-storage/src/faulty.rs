//! [`FaultyStore`]: wraps a store and fails chosen write-like operations on purpose, for failure drills
//! and simulations. It owns only the decision to fail; reads (and `release_generation` and `lock`)
//! always pass through, and it never corrupts data (use [`crate::MemStore::corrupt`] for that).

use crate::error::StorageError;
use crate::frame::TaskStateFrame;
use crate::manifest::{GenerationRecord, JobMeta, Manifest, TaskStateHandle};
use crate::store::{CheckpointListing, CheckpointStore, GcReport};
use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};

/// A write-like operation the fault policy is asked about: which call, and of which checkpoint or
/// generation. Its `Debug` text is the text of the resulting [`StorageError::Injected`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOp {
    /// Asked before a task state file is written
    /// ([`CheckpointStore::write_task_state`]): `true` fails the write and nothing is written.
    WriteTaskState {
        /// The checkpoint the state belongs to.
        checkpoint: CheckpointId,
    },
    /// Asked before the manifest is written: `true` fails the commit and nothing is written.
    CommitManifest {
        /// The checkpoint being committed.
        checkpoint: CheckpointId,
    },
    /// Asked only after the manifest was durably committed: `true` reports a failure although the
    /// checkpoint IS committed, like a reply lost on the way back. The caller cannot tell which case
    /// it is in; only the store knows (list, read the manifest, or retry and get
    /// [`StorageError::ManifestExists`]).
    CommitManifestAfterWrite {
        /// The checkpoint just committed.
        checkpoint: CheckpointId,
    },
    /// Asked before [`CheckpointStore::discard`]: `true` fails it and nothing is removed.
    Discard {
        /// The attempt to be discarded.
        checkpoint: CheckpointId,
    },
    /// Asked before [`CheckpointStore::write_meta`]: `true` fails it and `job.meta` is unchanged.
    WriteMeta,
    /// Asked before [`CheckpointStore::mark_finished`]: `true` fails it and no marker is written.
    MarkFinished,
    /// Asked before [`CheckpointStore::gc`]: `true` fails the whole pass and nothing is removed.
    Gc,
    /// Asked before the generation record is created: `true` fails the claim and nothing is written.
    ClaimGeneration {
        /// The generation being claimed.
        generation: Generation,
    },
    /// Asked only after the generation record was created: `true` reports a failure although the
    /// generation IS claimed (a lost reply); claiming it again then meets
    /// [`StorageError::GenerationTaken`].
    ClaimGenerationAfterWrite {
        /// The generation just claimed.
        generation: Generation,
    },
    /// Asked before the statistics of a checkpoint are written ([`CheckpointStore::write_stats`]) or
    /// pruned ([`CheckpointStore::prune_stats`], with the checkpoint 0): `true` fails it and nothing
    /// changes.
    WriteStats {
        /// The checkpoint whose statistics are written.
        checkpoint: CheckpointId,
    },
}

/// Decides, per operation, whether it fails (`true`: fail). Called once per write-like call (twice for
/// a commit or a claim: before and after the write); never for reads, `release_generation` or `lock`.
/// It may keep state (counters, a schedule) behind interior mutability: it is called from whichever
/// thread calls the store.
pub type FaultPolicy = Box<dyn Fn(StoreOp) -> bool + Send + Sync>;

/// A store that forwards to `S` unless its policy says an operation fails, in which case the operation
/// returns [`StorageError::Injected`] and does nothing (except for
/// [`StoreOp::CommitManifestAfterWrite`] and [`StoreOp::ClaimGenerationAfterWrite`], which fail after
/// doing everything). Reads, `check_not_fenced` included, always pass through, and so do
/// `release_generation` and `lock`. `describe` appends ` (with injected faults)`.
pub struct FaultyStore<S: CheckpointStore> {
    inner: S,
    policy: FaultPolicy,
}

impl<S: CheckpointStore> FaultyStore<S> {
    /// Wraps `inner`; `policy` is asked about every write-like operation (see [`FaultPolicy`]).
    pub fn new(inner: S, policy: impl Fn(StoreOp) -> bool + Send + Sync + 'static) -> Self {
        FaultyStore { inner, policy: Box::new(policy) }
    }

    /// The wrapped store, to look at what really happened.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store, dropping the policy: to go on with the same data and no injected faults.
    pub fn into_inner(self) -> S {
        self.inner
    }

    fn check(&self, op: StoreOp) -> Result<(), StorageError> {
        if (self.policy)(op) {
            Err(StorageError::Injected(format!("{op:?}")))
        } else {
            Ok(())
        }
    }
}

impl<S: CheckpointStore> CheckpointStore for FaultyStore<S> {
    fn write_task_frame(
        &self,
        checkpoint: CheckpointId,
        operator: &OperatorId,
        subtask: SubtaskIndex,
        parallelism: u32,
        key_groups: Option<KeyGroupRange>,
        frame: &TaskStateFrame,
    ) -> Result<TaskStateHandle, StorageError> {
        self.check(StoreOp::WriteTaskState { checkpoint })?;
        self.inner.write_task_frame(checkpoint, operator, subtask, parallelism, key_groups, frame)
    }

    fn read_task_state(&self, handle: &TaskStateHandle) -> Result<Vec<u8>, StorageError> {
        self.inner.read_task_state(handle)
    }

    fn read_task_chain(&self, handle: &TaskStateHandle) -> Result<Vec<Vec<u8>>, StorageError> {
        self.inner.read_task_chain(handle)
    }

    fn commit_manifest(&self, manifest: &Manifest) -> Result<(), StorageError> {
        let checkpoint = manifest.checkpoint;
        self.check(StoreOp::CommitManifest { checkpoint })?;
        self.inner.commit_manifest(manifest)?;
        self.check(StoreOp::CommitManifestAfterWrite { checkpoint })
    }

    fn list_checkpoints(&self) -> Result<Vec<CheckpointListing>, StorageError> {
        self.inner.list_checkpoints()
    }

    fn max_checkpoint_id_seen(&self) -> Result<Option<CheckpointId>, StorageError> {
        self.inner.max_checkpoint_id_seen()
    }

    fn latest_complete(&self) -> Result<Option<CheckpointId>, StorageError> {
        self.inner.latest_complete()
    }

    fn read_manifest(&self, id: CheckpointId) -> Result<Manifest, StorageError> {
        self.inner.read_manifest(id)
    }

    fn verify_reading(
        &self,
        id: CheckpointId,
        chain: &mut dyn FnMut(&TaskStateHandle, Vec<Vec<u8>>),
    ) -> Result<Manifest, StorageError> {
        self.inner.verify_reading(id, chain)
    }

    fn discard(&self, id: CheckpointId) -> Result<(), StorageError> {
        self.check(StoreOp::Discard { checkpoint: id })?;
        self.inner.discard(id)
    }

    fn gc(&self, retain: usize, in_flight: &[CheckpointId]) -> Result<GcReport, StorageError> {
        self.check(StoreOp::Gc)?;
        self.inner.gc(retain, in_flight)
    }

    fn read_meta(&self) -> Result<Option<JobMeta>, StorageError> {
        self.inner.read_meta()
    }

    fn write_meta(&self, meta: &JobMeta) -> Result<(), StorageError> {
        self.check(StoreOp::WriteMeta)?;
        self.inner.write_meta(meta)
    }

    fn mark_finished(&self, checkpoint: CheckpointId) -> Result<(), StorageError> {
        self.check(StoreOp::MarkFinished)?;
        self.inner.mark_finished(checkpoint)
    }

    fn finished(&self) -> Result<Option<CheckpointId>, StorageError> {
        self.inner.finished()
    }

    fn claim_generation(&self, record: &GenerationRecord) -> Result<(), StorageError> {
        let generation = record.generation;
        self.check(StoreOp::ClaimGeneration { generation })?;
        self.inner.claim_generation(record)?;
        self.check(StoreOp::ClaimGenerationAfterWrite { generation })
    }

    fn release_generation(&self, generation: Generation) -> Result<(), StorageError> {
        self.inner.release_generation(generation)
    }

    fn generations(&self) -> Result<Vec<GenerationRecord>, StorageError> {
        self.inner.generations()
    }

    fn latest_generation(&self) -> Result<Option<GenerationRecord>, StorageError> {
        self.inner.latest_generation()
    }

    fn check_not_fenced(&self, generation: Generation) -> Result<(), StorageError> {
        self.inner.check_not_fenced(generation)
    }

    fn write_stats(&self, checkpoint: CheckpointId, payload: &[u8]) -> Result<(), StorageError> {
        self.check(StoreOp::WriteStats { checkpoint })?;
        self.inner.write_stats(checkpoint, payload)
    }

    fn read_stats(&self, checkpoint: CheckpointId) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.read_stats(checkpoint)
    }

    fn list_stats(&self) -> Result<Vec<CheckpointId>, StorageError> {
        self.inner.list_stats()
    }

    fn prune_stats(&self, keep: usize) -> Result<usize, StorageError> {
        self.check(StoreOp::WriteStats { checkpoint: CheckpointId(0) })?;
        self.inner.prune_stats(keep)
    }

    fn describe(&self) -> String {
        format!("{} (with injected faults)", self.inner.describe())
    }

    fn lock(&self) -> Result<crate::StoreLock, StorageError> {
        self.inner.lock()
    }
}
