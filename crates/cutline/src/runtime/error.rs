//! [`RunError`]: why a run did not finish.

use crate::error::TaskError;
use cutline_core::CheckpointId;
use cutline_storage::StorageError;

/// Why a job did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot start from the savepoint: {0}")]
    Savepoint(String),
    #[error(
        "the checkpoints in {store} belong to job {found:?}, not {expected:?}: use another state directory (--state)"
    )]
    WrongJob { store: String, found: String, expected: String },
    // Not marked as the error's source: the message already carries it, and error reporters that
    // print the source chain would say it twice.
    #[error("checkpoint storage: {0}")]
    Storage(StorageError),
    #[error("cannot restore checkpoint {checkpoint}: {reason}")]
    Restore { checkpoint: CheckpointId, reason: String },
    #[error(
        "the job failed and is not restarted again after {attempts} restart(s); last failure: {last}{}",
        repeats(*repeated, *restored)
    )]
    GaveUp {
        attempts: u32,
        last: String,
        /// How many of the last failures in a row were this same failure after restoring the same
        /// checkpoint.
        repeated: u32,
        restored: Option<CheckpointId>,
    },
    /// A failure that restarting cannot mend (the same input makes it fail again).
    #[error("the job failed and cannot recover by restarting: {0}")]
    Permanent(String),
    #[error(
        "the {what} in {store} is {value}, the largest there is: the store is damaged or was crafted (a job never gets near it); start the job on a fresh state directory"
    )]
    Exhausted { what: &'static str, value: u64, store: String },
    #[error("a task failed while the job was being deployed: {0}")]
    Deploy(TaskError),
    #[error("cannot start a thread ({0}): raise the process or thread limit, or lower the parallelism")]
    Spawn(std::io::Error),
    #[error("{0} (a bug in cutline: please report it with the job that triggers it)")]
    Internal(String),
    #[error("{0}")]
    Superseded(String),
    #[error("the {what} file in {store} is damaged ({reason}): {advice}")]
    Damaged { what: &'static str, store: String, reason: String, advice: &'static str },
}

impl From<StorageError> for RunError {
    fn from(e: StorageError) -> Self {
        RunError::Storage(e)
    }
}

/// What the error of a restart strategy that gave up says about a failure that repeats.
fn repeats(repeated: u32, restored: Option<CheckpointId>) -> String {
    if repeated < 2 {
        return String::new();
    }
    let from = restored.map(|c| format!("checkpoint {c}")).unwrap_or_else(|| "the start of the input".into());
    format!(
        " (the same failure {repeated} times in a row, each time after restoring {from}: it repeats at the same input, so restarting does not help; fix the job or its input, or use a restart strategy that gives up sooner, e.g. RestartStrategy::FailureRate)"
    )
}
