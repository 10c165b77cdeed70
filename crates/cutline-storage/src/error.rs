//! The one error type of the storage layer, [`StorageError`], and its classification into transient
//! failures (worth a retry) and everything else. It does not retry, log, or decide what the engine does
//! about a failure: callers do.

use crate::kind::FileKind;
use cutline_core::{CheckpointId, Generation};
use std::io::ErrorKind;
use std::path::PathBuf;

/// Everything that can go wrong in a checkpoint store. Messages name the file and say what to do.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(
        "cannot {op} {}: {source}; check that the path exists, is writable and that the disk is not full",
        path.display()
    )]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use {} as a checkpoint store: {reason}", path.display())]
    InvalidRoot { path: PathBuf, reason: String },
    #[error(
        "{} is not a cutline file (bad magic bytes): it is corrupt or was put there by another program; \
         remove it or restore it from a backup",
        path.display()
    )]
    BadMagic { path: PathBuf },
    #[error(
        "{} was written by a newer cutline (format version {found}; this build reads versions up to \
         {supported}): upgrade cutline to read it",
        path.display()
    )]
    UnsupportedVersion { path: PathBuf, found: u16, supported: u16 },
    #[error(
        "{} holds a file of kind {found} where a {expected} file was expected: it was renamed or \
         overwritten; restore it from a backup or restore from another checkpoint",
        path.display()
    )]
    WrongKind { path: PathBuf, expected: FileKind, found: u16 },
    #[error(
        "{} is truncated (its frame needs {expected} bytes, the file has {actual}): it was cut short by a \
         crash or a full disk; restore from another checkpoint",
        path.display()
    )]
    Truncated { path: PathBuf, expected: u64, actual: u64 },
    #[error(
        "{} is corrupt (checksum {actual:#010x}, expected {expected:#010x}); restore from another \
         checkpoint",
        path.display()
    )]
    ChecksumMismatch { path: PathBuf, expected: u32, actual: u32 },
    #[error(
        "{} has {actual} bytes but its manifest recorded {expected}: it was changed after the checkpoint \
         was taken; restore from another checkpoint",
        path.display()
    )]
    SizeMismatch { path: PathBuf, expected: u64, actual: u64 },
    #[error(
        "cannot decode {} ({reason}): it is corrupt or comes from an incompatible build; restore from \
         another checkpoint",
        path.display()
    )]
    Decode { path: PathBuf, reason: String },
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
    MisplacedManifest { path: PathBuf, expected: CheckpointId, found: CheckpointId },
    #[error("invalid operator id {0:?}: use a non-empty id made of ASCII letters, digits, '_', '.' and '-'")]
    InvalidOperatorId(String),
    #[error(
        "invalid file reference {0:?}: a manifest may only name relative '/'-separated paths inside the \
         store; the manifest is corrupt or was edited by hand"
    )]
    InvalidPath(String),
    #[error(
        "{0} is already committed and a committed checkpoint is never changed; take a new checkpoint with \
         a higher id"
    )]
    ManifestExists(CheckpointId),
    #[error("{what} not found: check the store path, or restore from another checkpoint")]
    NotFound { what: String },
    #[error(
        "{0} is complete and cannot be discarded; complete checkpoints are only removed by gc, according \
         to retention"
    )]
    DiscardComplete(CheckpointId),
    #[error("injected failure at {0} (failure drill); retry the operation")]
    Injected(String),
    /// `claim_generation` found a record of that generation: another coordinator started it.
    #[error(
        "generation {} of this job was already started by another coordinator ({owner}), so this one stops: \
         do not run two coordinators for one job",
        generation.0
    )]
    GenerationTaken { generation: Generation, owner: String },
    /// A generation record above `generation` exists: a newer coordinator took over the job.
    #[error(
        "a newer coordinator (generation {}, owner {owner}) took over this job: this one (generation {}) stops",
        newer.0,
        generation.0
    )]
    Superseded { generation: Generation, newer: Generation, owner: String },
    /// The manifest of `checkpoint` was committed by `generation` after generation `by` had started from
    /// an older checkpoint: a zombie's commit, never restored.
    #[error(
        "checkpoint {} was completed by generation {} after generation {} took over; it is ignored",
        checkpoint.0,
        generation.0,
        by.0
    )]
    Fenced { checkpoint: CheckpointId, generation: Generation, by: Generation },
    #[error("another run is using {path} (in this process or another; it holds the lock there): stop it first, or use another state directory")]
    Locked { path: PathBuf },
    /// A request to a remote store (an object store) failed, after `attempts` tries when `transient`.
    #[error("cannot {op} {location} ({}): {source}; {hint}", attempts_text(.attempts))]
    Remote {
        /// What was addressed, e.g. `s3://bucket/prefix/checkpoints/chk-…/_MANIFEST`.
        location: String,
        op: &'static str,
        /// The HTTP status the store answered with, if it answered.
        status: Option<u16>,
        /// Whether trying again later may succeed (no answer, a timeout, a 5xx or 429 answer).
        transient: bool,
        /// How many times the request was sent before giving up.
        attempts: u32,
        /// What to check, for the message.
        hint: &'static str,
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
    /// bucket) and contract violations are not transient.
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

    /// Whether the stored data itself is damaged (bad frame, checksum, size, decoding, a manifest in
    /// another checkpoint's directory, or a file a manifest references is missing): reading it again
    /// will not help, an older checkpoint might.
    /// [`StorageError::Fenced`], [`StorageError::Superseded`] and [`StorageError::GenerationTaken`] are
    /// neither corruption nor transient: the data is intact, but another coordinator owns the job.
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
