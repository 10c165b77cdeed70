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
    pub operator: OperatorId,
    pub subtask: SubtaskIndex,
    /// The parallelism of the operator when the snapshot was taken.
    pub parallelism: u32,
    /// The key groups the subtask owned; `None` for non-keyed state.
    pub key_groups: Option<KeyGroupRange>,
    /// Path relative to the store root, '/'-separated. May point into an older checkpoint's directory.
    pub file: String,
    /// Size of the whole framed file.
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
    /// Identifies the job graph the state belongs to; restore refuses a manifest of another job.
    pub job_fingerprint: String,
    pub checkpoint: CheckpointId,
    pub generation: Generation,
    pub created_at_unix_ms: u64,
    /// Whether this is the end-of-input checkpoint, after which the job is finished.
    pub is_final: bool,
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
/// `CheckpointStore::write_meta`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMeta {
    pub job_fingerprint: String,
    /// The generation of the latest incarnation of the job that wrote this file. A zombie coordinator
    /// may have overwritten it with an older one: take new generations above
    /// `CheckpointStore::latest_generation` too.
    pub generation: Generation,
    /// Every checkpoint id ever issued for this job is below this: a new process resumes issuing ids
    /// at or above it, so ids never repeat even if checkpoint directories were lost.
    pub epoch_lease_end: CheckpointId,
}

/// The record a coordinator creates (create-if-absent, `CheckpointStore::claim_generation`) when it
/// starts a generation of the job, before it commits anything. Once it exists, every complete
/// checkpoint that an older generation commits above `restored` is fenced: treated as not complete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationRecord {
    pub job_fingerprint: String,
    pub generation: Generation,
    /// The complete checkpoint of this store that this generation restored from; `None` if it started
    /// fresh or from a savepoint (which it only does when the store has no complete checkpoint).
    pub restored: Option<CheckpointId>,
    pub created_unix_ms: u64,
    /// Free text naming the coordinator (host, pid), for the messages of those it stops.
    pub owner: String,
}
