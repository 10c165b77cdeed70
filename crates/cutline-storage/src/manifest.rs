//! The records cutline keeps about checkpoints and jobs: [`Manifest`] (the commit record of one
//! checkpoint), [`TaskStateHandle`] (where one task's snapshot lives), [`JobMeta`] (what survives
//! across process lives) and [`GenerationRecord`] (which coordinator started a generation, the point
//! from which older generations are fenced). Plain serde values: they do no I/O and do not check that
//! files exist.

use crate::format::FORMAT_VERSION;
use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};
use serde::{Deserialize, Serialize};

/// Where the snapshot of one subtask of one operator lives, and how to check it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStateHandle {
    /// The operator whose state this is; restore matches state to operators by this id.
    pub operator: OperatorId,
    /// Which parallel instance of the operator (`0..parallelism`) wrote it.
    pub subtask: SubtaskIndex,
    /// The parallelism of the operator when the snapshot was taken.
    pub parallelism: u32,
    /// The key groups the subtask owned; `None` for non-keyed state.
    pub key_groups: Option<KeyGroupRange>,
    /// Path relative to the store root, '/'-separated. May point into an older checkpoint's directory.
    pub file: String,
    /// Size in bytes of the whole framed file (header, payload and trailer: the payload plus 20),
    /// not of the payload alone. Reads compare it with the stored file
    /// ([`crate::StorageError::SizeMismatch`]).
    pub size_bytes: u64,
    /// CRC32 of the framed file's header and payload, i.e. the checksum its trailer holds. (Not of the
    /// whole file: a CRC over data followed by its own CRC is one constant for all data.)
    pub crc32: u32,
}

/// The commit record of one checkpoint: once it is in the store, the checkpoint is complete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The format version the manifest was written in; [`Manifest::new`] fills it in.
    pub format_version: u16,
    /// Identifies the job graph the state belongs to. This crate does not compare it; the engine
    /// refuses to restore a manifest of another job.
    pub job_fingerprint: String,
    /// The checkpoint this manifest commits; it must match the directory it is stored in
    /// ([`crate::StorageError::MisplacedManifest`] otherwise).
    pub checkpoint: CheckpointId,
    /// The generation of the coordinator that committed it: what fencing compares with the
    /// [`GenerationRecord`]s.
    pub generation: Generation,
    /// When the coordinator built the manifest to commit it (for a savepoint copy: the original's
    /// time), in milliseconds since the Unix epoch. Informational: nothing orders, expires or fences
    /// by it.
    pub created_at_unix_ms: u64,
    /// Whether this is the end-of-input checkpoint, after which the job is finished.
    pub is_final: bool,
    /// The state of every task in the checkpoint, one handle per (operator, subtask). Each must come
    /// from an acknowledged [`crate::CheckpointStore::write_task_state`] (possibly of an older
    /// checkpoint whose files this one reuses).
    pub tasks: Vec<TaskStateHandle>,
}

impl Manifest {
    /// A manifest in the current format version.
    pub fn new(
        job_fingerprint: impl Into<String>,
        checkpoint: CheckpointId,
        generation: Generation,
        created_at_unix_ms: u64,
        is_final: bool,
        tasks: Vec<TaskStateHandle>,
    ) -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            job_fingerprint: job_fingerprint.into(),
            checkpoint,
            generation,
            created_at_unix_ms,
            is_final,
            tasks,
        }
    }

    /// The summed size of the task state files the manifest references (not of the manifest itself),
    /// saturating at `u64::MAX`: the sizes come from a file, which may be damaged or edited.
    pub fn total_size_bytes(&self) -> u64 {
        self.tasks.iter().fold(0u64, |sum, t| sum.saturating_add(t.size_bytes))
    }
}

/// What the job keeps across process lives, next to its checkpoints.
///
/// Written with a plain overwrite, by whichever coordinator writes last: it is a hint, not the
/// authority on which generation owns the job (the [`GenerationRecord`]s are; see
/// [`CheckpointStore::write_meta`](crate::CheckpointStore::write_meta)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMeta {
    /// Identifies the job graph. This crate does not compare it; the engine refuses to start another
    /// job on this store.
    pub job_fingerprint: String,
    /// The generation of the latest incarnation of the job that wrote this file. A zombie coordinator
    /// may have overwritten it with an older one: take new generations above
    /// [`CheckpointStore::latest_generation`](crate::CheckpointStore::latest_generation) too.
    pub generation: Generation,
    /// The end (exclusive) of the durable epoch lease of the generation that wrote this file: it
    /// issues checkpoint ids below it only, and writes a higher lease before issuing more. A new
    /// process resumes issuing ids at or above it, so ids do not repeat even if checkpoint
    /// directories were lost. A zombie's stale overwrite can lower it: take new ids above
    /// [`CheckpointStore::max_checkpoint_id_seen`](crate::CheckpointStore::max_checkpoint_id_seen)
    /// too.
    pub epoch_lease_end: CheckpointId,
}

/// The record a coordinator creates (create-if-absent,
/// [`CheckpointStore::claim_generation`](crate::CheckpointStore::claim_generation)) when it starts a
/// generation of the job, before it commits anything. Once it exists, every committed checkpoint of
/// an older generation with an id above `restored` (every one, if `restored` is `None`) is fenced:
/// treated as not complete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationRecord {
    /// Identifies the job graph, as in its manifests.
    pub job_fingerprint: String,
    /// The generation started; the record is stored under it (`generations/gen-<generation>`).
    pub generation: Generation,
    /// The complete checkpoint of this store that this generation restored from; `None` if it started
    /// fresh or from a savepoint (which it only does when the store has no complete checkpoint).
    pub restored: Option<CheckpointId>,
    /// When the coordinator claimed the generation, in milliseconds since the Unix epoch.
    /// Informational (messages, and it makes the records of two coordinators differ).
    pub created_unix_ms: u64,
    /// Free text naming the coordinator (host, pid), for the messages of those it stops.
    pub owner: String,
}
