//! The one error type of the storage layer, [`StorageError`], and its classification into transient
//! failures (worth a retry) and everything else. It does not retry, log, or decide what the engine does
//! about a failure: callers do.

use crate::kind::FileKind;
use cutline_core::{CheckpointId, Generation};
use std::io::ErrorKind;
use std::path::PathBuf;

/// Everything that can go wrong in a checkpoint store. Messages (Display) name the file and say what
/// to do.
///
/// Three classes matter to a caller: [`StorageError::is_transient`] (trying the same operation again
/// later may succeed), [`StorageError::is_corruption`] (the stored data is damaged: reading it again
/// will not help, an older checkpoint might), and the rest: a configuration to fix
/// ([`StorageError::InvalidRoot`], [`StorageError::Locked`], most of [`StorageError::Io`] and
/// [`StorageError::Remote`]), a newer format ([`StorageError::UnsupportedVersion`]), a contract the
/// caller broke ([`StorageError::ManifestExists`], [`StorageError::DiscardComplete`],
/// [`StorageError::InvalidOperatorId`]), or another coordinator owning the job
/// ([`StorageError::GenerationTaken`], [`StorageError::Superseded`], [`StorageError::Fenced`]).
/// The store itself retries nothing but the requests of `S3Store` (feature `s3`).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An operation on a local file or directory failed (only [`LocalDirStore`](crate::LocalDirStore)
    /// does local I/O). Transient only if the OS reported `Interrupted`, `TimedOut` or `WouldBlock`;
    /// otherwise (permissions, a full disk, a missing path) retrying meets the same error until the
    /// operator fixes its cause.
    #[error(
        "cannot {op} {}: {source}; check that the path exists, is writable and that the disk is not full",
        path.display()
    )]
    Io {
        /// The file or directory operated on.
        path: PathBuf,
        /// What was attempted (`read`, `write`, `create`, `fsync`, `rename`, `remove`, `list`,
        /// `lock`, ...), for the message.
        op: &'static str,
        /// The error the operating system reported.
        #[source]
        source: std::io::Error,
    },
    /// A store cannot be opened where it was asked to be: for
    /// [`LocalDirStore`](crate::LocalDirStore), a root that is not a directory, cannot be created or
    /// is not writable; for `S3Store`, a configuration that is incomplete or invalid (also from the
    /// environment), a bucket that does not exist, or a server that ignores conditional writes.
    /// Not transient and not corruption: nothing was written; fix the path or configuration that
    /// `reason` names.
    #[error("cannot use {} as a checkpoint store: {reason}", path.display())]
    InvalidRoot {
        /// The root: a local directory, or for `S3Store` `s3://<bucket>/<prefix> at <endpoint>`.
        path: PathBuf,
        /// What is wrong and what to do about it.
        reason: String,
    },
    /// A file does not start with the magic bytes `CUTL` (`format::MAGIC`):
    /// it is not a cutline file, or its first bytes are damaged. Corruption.
    #[error(
        "{} is not a cutline file (bad magic bytes): it is corrupt or was put there by another program; \
         remove it or restore it from a backup",
        path.display()
    )]
    BadMagic {
        /// The file (`<in-memory frame>` from [`decode_frame`](crate::decode_frame)).
        path: PathBuf,
    },
    /// A file, or the manifest record inside it, is in a format version newer than this build reads.
    /// Neither corruption nor transient: the data may be intact; read it with a newer cutline.
    #[error(
        "{} was written by a newer cutline (format version {found}; this build reads versions up to \
         {supported}): upgrade cutline to read it",
        path.display()
    )]
    UnsupportedVersion {
        /// The file (`<in-memory frame>` from [`decode_frame`](crate::decode_frame)).
        path: PathBuf,
        /// The version the file was written in.
        found: u16,
        /// The newest version this build reads, [`FORMAT_VERSION`](crate::FORMAT_VERSION).
        supported: u16,
    },
    /// An intact frame (its length and checksum hold) holds another kind of file than the reader
    /// expected: files were renamed or copied over each other. Corruption.
    #[error(
        "{} holds a file of kind {found} where a {expected} file was expected: it was renamed or \
         overwritten; restore it from a backup or restore from another checkpoint",
        path.display()
    )]
    WrongKind {
        /// The file (`<in-memory frame>` from [`decode_frame`](crate::decode_frame)).
        path: PathBuf,
        /// The kind the reader asked for.
        expected: FileKind,
        /// The kind number found in the frame: a [`FileKind`] number, or one no kind has.
        found: u16,
    },
    /// A file is shorter than its frame needs: cut short by a crash, a full disk or a partial copy.
    /// Corruption.
    #[error(
        "{} is truncated (its frame needs {expected} bytes, the file has {actual}): it was cut short by a \
         crash or a full disk; restore from another checkpoint",
        path.display()
    )]
    Truncated {
        /// The file (`<in-memory frame>` from [`decode_frame`](crate::decode_frame)).
        path: PathBuf,
        /// The bytes the frame needs: its header and trailer, or, once its length field was read,
        /// header, recorded payload length and trailer.
        expected: u64,
        /// The bytes the file has.
        actual: u64,
    },
    /// The CRC32 of a file's header and payload is not the one recorded, in the file's own trailer
    /// or in the [`TaskStateHandle::crc32`](crate::TaskStateHandle::crc32) of the manifest that
    /// references it. Corruption.
    #[error(
        "{} is corrupt (checksum {actual:#010x}, expected {expected:#010x}); restore from another \
         checkpoint",
        path.display()
    )]
    ChecksumMismatch {
        /// The file (`<in-memory frame>` from [`decode_frame`](crate::decode_frame)).
        path: PathBuf,
        /// The recorded CRC32 (of the trailer, or of the handle).
        expected: u32,
        /// The CRC32 of the bytes read.
        actual: u32,
    },
    /// A task state file has another size than the
    /// [`TaskStateHandle::size_bytes`](crate::TaskStateHandle::size_bytes) its manifest recorded:
    /// it was changed or replaced after the checkpoint was taken. Corruption.
    #[error(
        "{} has {actual} bytes but its manifest recorded {expected}: it was changed after the checkpoint \
         was taken; restore from another checkpoint",
        path.display()
    )]
    SizeMismatch {
        /// The task state file.
        path: PathBuf,
        /// The size in bytes the manifest recorded.
        expected: u64,
        /// The size in bytes of the file in the store.
        actual: u64,
    },
    /// A file's frame is readable but its content is not: the record does not decode, bytes follow
    /// the frame or the record, the frame names a format version that never existed, or a generation
    /// record is filed under another generation's name. Corruption.
    #[error(
        "cannot decode {} ({reason}): it is corrupt or comes from an incompatible build; restore from \
         another checkpoint",
        path.display()
    )]
    Decode {
        /// The file (`<in-memory frame>` from [`decode_frame`](crate::decode_frame)).
        path: PathBuf,
        /// What does not decode.
        reason: String,
    },
    /// The directory of checkpoint `expected` holds the manifest of checkpoint `found`: a checkpoint
    /// directory was renamed or copied by hand. Corruption: a restore skips it.
    #[error(
        "{} holds the manifest of checkpoint {}, not of checkpoint {}: checkpoint directories were renamed or \
         copied by hand. If chk-{:020} is gone, rename this directory back to it; if it is still there, this \
         is a copy: delete it. Until then restores skip it",
        path.display(),
        found.0,
        expected.0,
        found.0
    )]
    MisplacedManifest {
        /// The manifest file read.
        path: PathBuf,
        /// The checkpoint whose directory it is in (the one asked for).
        expected: CheckpointId,
        /// The checkpoint the manifest itself names.
        found: CheckpointId,
    },
    /// [`CheckpointStore::write_task_state`](crate::CheckpointStore::write_task_state) was given an
    /// operator id that cannot be part of a file name: empty, or with characters other than ASCII
    /// letters, digits, `_`, `.` and `-`. Nothing was written; the job definition must change.
    #[error("invalid operator id {0:?}: use a non-empty id made of ASCII letters, digits, '_', '.' and '-'")]
    InvalidOperatorId(String),
    /// A path refused before anything is read: a manifest's
    /// [`TaskStateHandle::file`](crate::TaskStateHandle::file) that is not a relative '/'-separated
    /// path inside the store (absolute, empty parts, `.`, `..`, `\`), or, on `S3Store`, a path that
    /// is no valid object key. Corruption.
    #[error(
        "invalid file reference {0:?}: a manifest may only name relative '/'-separated paths inside the \
         store; the manifest is corrupt or was edited by hand"
    )]
    InvalidPath(String),
    /// The checkpoint already has a manifest, and a committed checkpoint is never changed: from
    /// [`CheckpointStore::commit_manifest`](crate::CheckpointStore::commit_manifest) (also when an
    /// earlier attempt of the same commit did commit although it reported a failure: read the
    /// manifest to tell) and from
    /// [`CheckpointStore::write_task_state`](crate::CheckpointStore::write_task_state). Not
    /// transient: a retry gets the same answer.
    #[error(
        "{0} is already committed and a committed checkpoint is never changed; take a new checkpoint with \
         a higher id"
    )]
    ManifestExists(CheckpointId),
    /// A manifest to commit lists an incremental snapshot whose base file is no longer in the store
    /// (retention removed it after the snapshot was taken, when no retained checkpoint needed it any
    /// more). Nothing was committed; the checkpoint fails, and the task's next snapshot builds on a
    /// retained checkpoint. Not transient, not corruption: the committed data is intact.
    #[error(
        "checkpoint {checkpoint} builds on {file}, which retention already removed; nothing was committed,          and the next checkpoint builds on a retained one"
    )]
    BaseMissing {
        /// The checkpoint whose commit was refused.
        checkpoint: CheckpointId,
        /// The base file, relative to the store root.
        file: String,
    },
    /// Something that must exist is not in the store: a file that a manifest references, the
    /// manifest of a checkpoint asked for by id, or the manifest of the checkpoint given to
    /// [`CheckpointStore::mark_finished`](crate::CheckpointStore::mark_finished). Counted as
    /// corruption; for a manifest asked for by id it may also mean that the checkpoint was never
    /// committed or that gc removed it since it was listed.
    #[error("{what} not found: check the store path, or restore from another checkpoint")]
    NotFound {
        /// What was looked for, with its path.
        what: String,
    },
    /// [`CheckpointStore::discard`](crate::CheckpointStore::discard) was asked to remove a
    /// checkpoint that has a manifest (complete or fenced): committed checkpoints are removed only
    /// by [`CheckpointStore::gc`](crate::CheckpointStore::gc). Nothing was removed.
    #[error(
        "{0} is complete and cannot be discarded; complete checkpoints are only removed by gc, according \
         to retention"
    )]
    DiscardComplete(CheckpointId),
    /// A failure that a [`FaultyStore`](crate::FaultyStore) injected (failure drill); the text is the
    /// [`StoreOp`](crate::StoreOp) that failed. Transient. Nothing was done, except after
    /// [`StoreOp::CommitManifestAfterWrite`](crate::StoreOp::CommitManifestAfterWrite) and
    /// [`StoreOp::ClaimGenerationAfterWrite`](crate::StoreOp::ClaimGenerationAfterWrite), where the
    /// operation did take effect.
    #[error("injected failure at {0} (failure drill); retry the operation")]
    Injected(String),
    /// `claim_generation` found a record of that generation: another coordinator started it. Neither
    /// transient nor corruption: this coordinator must stop.
    #[error(
        "generation {} of this job was already started by another coordinator ({owner}), so this one stops: \
         do not run two coordinators for one job",
        generation.0
    )]
    GenerationTaken {
        /// The generation that was to be claimed.
        generation: Generation,
        /// The [`GenerationRecord::owner`](crate::GenerationRecord::owner) of the record found, or why
        /// it is unknown.
        owner: String,
    },
    /// A generation record above `generation` exists: a newer coordinator took over the job. Neither
    /// transient nor corruption: the coordinator of `generation` must stop.
    #[error(
        "a newer coordinator (generation {}, owner {owner}) took over this job: this one (generation {}) stops",
        newer.0,
        generation.0
    )]
    Superseded {
        /// The caller's generation.
        generation: Generation,
        /// The highest generation that has a record.
        newer: Generation,
        /// The [`GenerationRecord::owner`](crate::GenerationRecord::owner) of `newer`'s record, or why
        /// it is unknown.
        owner: String,
    },
    /// The manifest of `checkpoint` was committed by `generation` after generation `by` had started from
    /// an older checkpoint: a zombie's commit, never restored. Neither transient nor corruption: the
    /// files are intact, but the checkpoint does not count; restore another one.
    #[error(
        "checkpoint {} was completed by generation {} after generation {} took over; it is ignored",
        checkpoint.0,
        generation.0,
        by.0
    )]
    Fenced {
        /// The fenced checkpoint.
        checkpoint: CheckpointId,
        /// The generation that committed it, as its manifest says.
        generation: Generation,
        /// The lowest newer generation whose record fences it.
        by: Generation,
    },
    /// [`CheckpointStore::lock`](crate::CheckpointStore::lock) found the store held by another run:
    /// for a [`LocalDirStore`](crate::LocalDirStore), another process, or another live guard in this
    /// process, holds the `flock` of `<root>/LOCK`; for a [`MemStore`](crate::MemStore), a guard of
    /// the same value is alive. Stays so until that run ends; do not retry in a loop.
    #[error("another run is using {path} (in this process or another; it holds the lock there): stop it first, or use another state directory")]
    Locked {
        /// The store root (`(memory store)` for a [`MemStore`](crate::MemStore)).
        path: PathBuf,
    },
    /// A request to a remote store (`S3Store`) failed for good: transient failures were already
    /// retried within its `RetryLimits`, so a caller that retries at once will likely fail again.
    /// [`StorageError::is_transient`] returns `transient`.
    #[error("cannot {op} {location} ({}): {source}; {hint}", attempts_text(.attempts))]
    Remote {
        /// What was addressed, e.g. `s3://bucket/prefix/checkpoints/chk-…/_MANIFEST`.
        location: String,
        /// What was attempted (`read`, `inspect`, `write`, `create`, `list`, `remove`), for the
        /// message.
        op: &'static str,
        /// The HTTP status the store answered with, if it answered.
        status: Option<u16>,
        /// Whether trying again later may succeed: no answer, a timeout, a 5xx, 429 or 408 answer, or
        /// a conditional create that kept meeting concurrent deletes. Refusals (401, 403, 404,
        /// other 4xx) are not.
        transient: bool,
        /// How many times the failing request was sent before giving up (at least 1; a refusal may
        /// follow transient failures, so `attempts > 1` does not imply `transient`).
        attempts: u32,
        /// What to check, for the message.
        hint: &'static str,
        /// The object store client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn attempts_text(attempts: &u32) -> String {
    match attempts {
        1 => "1 attempt".to_string(),
        n => format!("{n} attempts"),
    }
}

impl StorageError {
    /// Whether retrying the same operation may succeed: interrupted or timed-out I/O, injected
    /// failures, and remote requests that got no answer, timed out or met a server error (after the
    /// store's own retries). Corruption, missing files, refused requests (bad credentials, missing
    /// bucket) and contract violations are not transient. Nothing in this crate retries on the
    /// strength of it (beyond `S3Store`'s own request retries): the caller decides.
    pub fn is_transient(&self) -> bool {
        match self {
            StorageError::Io { source, .. } => {
                matches!(source.kind(), ErrorKind::Interrupted | ErrorKind::TimedOut | ErrorKind::WouldBlock)
            }
            StorageError::Injected(_) => true,
            StorageError::Remote { transient, .. } => *transient,
            _ => false,
        }
    }

    /// Whether the stored data itself is damaged: a bad frame (magic, kind, truncation, checksum),
    /// a size other than recorded, a record that does not decode, a manifest in another checkpoint's
    /// directory, a manifest naming a path outside the store ([`StorageError::InvalidPath`]), or
    /// anything [`StorageError::NotFound`] (a file a manifest references, or a manifest asked for by
    /// id, is missing). Reading it again will not help; an older checkpoint might.
    ///
    /// Not corruption: [`StorageError::UnsupportedVersion`] (intact, but newer than this build), and
    /// [`StorageError::Fenced`], [`StorageError::Superseded`] and [`StorageError::GenerationTaken`],
    /// which are neither corruption nor transient: the data is intact, but another coordinator owns
    /// the job.
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            StorageError::BadMagic { .. }
                | StorageError::WrongKind { .. }
                | StorageError::Truncated { .. }
                | StorageError::ChecksumMismatch { .. }
                | StorageError::SizeMismatch { .. }
                | StorageError::Decode { .. }
                | StorageError::MisplacedManifest { .. }
                | StorageError::InvalidPath(_)
                | StorageError::NotFound { .. }
        )
    }

    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        StorageError::Io { path: path.into(), op, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cutline_core::CheckpointId;
    use std::io::Error;

    #[test]
    fn only_interrupted_io_and_injected_failures_are_transient() {
        let io = |kind| StorageError::io("p", "read", Error::from(kind));
        let cases = [
            (io(ErrorKind::Interrupted), true),
            (io(ErrorKind::TimedOut), true),
            (io(ErrorKind::WouldBlock), true),
            (StorageError::Injected("drill".into()), true),
            (io(ErrorKind::NotFound), false),
            (io(ErrorKind::PermissionDenied), false),
            (StorageError::BadMagic { path: "p".into() }, false),
            (StorageError::ChecksumMismatch { path: "p".into(), expected: 1, actual: 2 }, false),
            (StorageError::ManifestExists(CheckpointId(1)), false),
        ];
        for (err, transient) in cases {
            assert_eq!(err.is_transient(), transient, "{err}");
        }
    }
}
