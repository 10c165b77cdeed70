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
    /// The files this one builds on, oldest first, when it holds only what changed since an earlier
    /// checkpoint (an incremental snapshot): its state is theirs with it applied on top, in order.
    /// Empty for a self-contained file. Each was written by the same operator and subtask for an
    /// earlier checkpoint; retention keeps them while a retained manifest lists them here, and a
    /// commit is refused when one of them is gone ([`crate::StorageError::BaseMissing`]).
    pub base: Vec<StateFileRef>,
}

impl TaskStateHandle {
    /// The handle's own file, as a reference another snapshot can build on.
    pub fn file_ref(&self, checkpoint: CheckpointId) -> StateFileRef {
        StateFileRef { checkpoint, file: self.file.clone(), size_bytes: self.size_bytes, crc32: self.crc32 }
    }

    /// Every file the state is read from: the base files, oldest first, then its own.
    pub fn chain(&self) -> impl Iterator<Item = (&str, u64, u32)> {
        self.base.iter().map(|b| (b.file.as_str(), b.size_bytes, b.crc32)).chain(std::iter::once((
            self.file.as_str(),
            self.size_bytes,
            self.crc32,
        )))
    }
}

/// A task state file written for an earlier checkpoint, that an incremental snapshot builds on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFileRef {
    /// The checkpoint it was written for.
    pub checkpoint: CheckpointId,
    /// Path relative to the store root, as in [`TaskStateHandle::file`].
    pub file: String,
    /// Size in bytes of the framed file, as in [`TaskStateHandle::size_bytes`].
    pub size_bytes: u64,
    /// Checksum, as in [`TaskStateHandle::crc32`].
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

    /// The summed size of the task state files this checkpoint wrote (not of the manifest itself,
    /// nor of the older files incremental snapshots build on: see [`Manifest::full_size_bytes`]),
    /// saturating at `u64::MAX`: the sizes come from a file, which may be damaged or edited.
    pub fn total_size_bytes(&self) -> u64 {
        self.tasks.iter().fold(0u64, |sum, t| sum.saturating_add(t.size_bytes))
    }

    /// The summed size of every file a restore from this checkpoint reads, base files included.
    pub fn full_size_bytes(&self) -> u64 {
        self.tasks.iter().flat_map(|t| t.chain()).fold(0u64, |sum, (_, size, _)| sum.saturating_add(size))
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

/// The records whose shape frame version 1 had otherwise, as it wrote them, and their conversion.
pub(crate) mod v1 {
    use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};
    use serde::{Deserialize, Serialize};

    /// A task handle before incremental snapshots: every file self-contained.
    #[derive(Serialize, Deserialize)]
    pub(crate) struct TaskStateHandle {
        pub operator: OperatorId,
        pub subtask: SubtaskIndex,
        pub parallelism: u32,
        pub key_groups: Option<KeyGroupRange>,
        pub file: String,
        pub size_bytes: u64,
        pub crc32: u32,
    }

    #[derive(Serialize, Deserialize)]
    pub(crate) struct Manifest {
        pub format_version: u16,
        pub job_fingerprint: String,
        pub checkpoint: CheckpointId,
        pub generation: Generation,
        pub created_at_unix_ms: u64,
        pub is_final: bool,
        pub tasks: Vec<TaskStateHandle>,
    }

    impl From<Manifest> for super::Manifest {
        fn from(m: Manifest) -> super::Manifest {
            super::Manifest {
                format_version: m.format_version,
                job_fingerprint: m.job_fingerprint,
                checkpoint: m.checkpoint,
                generation: m.generation,
                created_at_unix_ms: m.created_at_unix_ms,
                is_final: m.is_final,
                tasks: m
                    .tasks
                    .into_iter()
                    .map(|t| super::TaskStateHandle {
                        operator: t.operator,
                        subtask: t.subtask,
                        parallelism: t.parallelism,
                        key_groups: t.key_groups,
                        file: t.file,
                        size_bytes: t.size_bytes,
                        crc32: t.crc32,
                        base: Vec::new(),
                    })
                    .collect(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{decode_versioned, encode_record, FileKind};
    use std::path::Path;

    fn stamped(mut frame: Vec<u8>, version: u16) -> Vec<u8> {
        frame[4..6].copy_from_slice(&version.to_le_bytes());
        let end = frame.len() - 4;
        let crc = crc32fast::hash(&frame[..end]);
        frame[end..].copy_from_slice(&crc.to_le_bytes());
        frame
    }

    #[test]
    fn a_manifest_of_format_version_1_reads_as_self_contained_snapshots() {
        let old = v1::Manifest {
            format_version: 1,
            job_fingerprint: "job".into(),
            checkpoint: CheckpointId(7),
            generation: Generation(2),
            created_at_unix_ms: 5,
            is_final: false,
            tasks: vec![v1::TaskStateHandle {
                operator: OperatorId::new("op"),
                subtask: SubtaskIndex(1),
                parallelism: 2,
                key_groups: None,
                file: "checkpoints/chk-7/op-1.state".into(),
                size_bytes: 30,
                crc32: 9,
            }],
        };
        let frame = stamped(encode_record(FileKind::Manifest, &old), 1);
        let read = |frame: &[u8]| decode_versioned::<Manifest, v1::Manifest>(Path::new("m"), frame, FileKind::Manifest);
        let m = read(&frame).unwrap();
        assert_eq!((m.format_version, m.checkpoint, m.tasks.len()), (1, CheckpointId(7), 1));
        assert_eq!(
            (m.tasks[0].file.as_str(), m.tasks[0].size_bytes, m.tasks[0].base.len()),
            ("checkpoints/chk-7/op-1.state", 30, 0)
        );
        // The same bytes under version 2 are another shape: refused, not misread.
        assert!(read(&stamped(frame, 2)).is_err());
    }
}
