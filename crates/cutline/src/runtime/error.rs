//! [`RunError`]: why a run did not finish.

use crate::error::TaskError;
use cutline_core::CheckpointId;
use cutline_storage::StorageError;

/// Why a job did not finish. Every variant's message says what happened and what to do.
///
/// `Debug` shows the same message as `Display`, so that a `main` returning
/// `Result<(), Box<dyn std::error::Error>>` prints it rather than the variant's fields.
#[derive(thiserror::Error)]
pub enum RunError {
    /// A setting of `RunConfig` or `CheckpointConfig` is out of range (the message names it).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The savepoint named by `RunConfig::from_savepoint` cannot be used.
    #[error("cannot start from the savepoint: {0}")]
    Savepoint(String),
    /// The state directory belongs to another job (its fingerprint differs).
    #[error(
        "the checkpoints in {store} belong to job {found:?}, not {expected:?}: use another state directory (--state)"
    )]
    WrongJob {
        /// The store, as it describes itself.
        store: String,
        /// The fingerprint found in it.
        found: String,
        /// This run's fingerprint.
        expected: String,
    },
    // Not marked as the error's source: the message already carries it, and error reporters that
    // print the source chain would say it twice.
    /// Checkpoint storage failed on job metadata, a generation record or the finished marker (a
    /// failed task-state or manifest write only fails that checkpoint).
    #[error("checkpoint storage: {0}")]
    Storage(StorageError),
    /// The checkpoint cannot be restored into this job (state of an operator the job no longer has,
    /// a manifest of another checkpoint). Not retried.
    #[error("cannot restore checkpoint {checkpoint}: {reason}")]
    Restore {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Why, and what to do.
        reason: String,
    },
    #[error(
        "the job failed and is not restarted again after {attempts} restart(s); last failure: {last}{}",
        repeats(*repeated, *restored)
    )]
    /// The restart strategy (or the repeat rule, `RunConfig::max_repeated_failures`) gave up.
    GaveUp {
        /// Restarts done.
        attempts: u32,
        /// The last failure.
        last: String,
        /// How many of the last failures in a row were this same failure after restoring the same
        /// checkpoint.
        repeated: u32,
        /// The checkpoint each of those restarts restored (`None`: the start of the input).
        restored: Option<CheckpointId>,
    },
    /// A failure that restarting cannot mend (the same input makes it fail again).
    #[error("the job failed and cannot recover by restarting: {0}")]
    Permanent(String),
    /// Checkpoint ids, generations or the epoch lease reached the end of `u64` (a damaged or crafted
    /// store).
    #[error(
        "the {what} in {store} is {value}, the largest there is: the store is damaged or was crafted (a job never gets near it); start the job on a fresh state directory"
    )]
    Exhausted {
        /// "checkpoint id", "generation" or "epoch lease".
        what: &'static str,
        /// The value found.
        value: u64,
        /// The store.
        store: String,
    },
    /// A task failed permanently while the job was being deployed (its state does not fit the job).
    #[error("a task failed while the job was being deployed: {0}")]
    Deploy(TaskError),
    /// The operating system refused a thread.
    #[error("cannot start a thread ({0}): raise the process or thread limit, or lower the parallelism")]
    Spawn(std::io::Error),
    /// A task could not start (a source or sink failed to open or recover, a worker was lost): a
    /// failure like any other, retried under the restart strategy.
    #[error("a task could not start: {0}")]
    Start(String),
    /// A broken invariant of cutline itself.
    #[error("{0} (a bug in cutline: please report it with the job that triggers it)")]
    Internal(String),
    /// A newer coordinator took over this job (a generation record above this run's): this run
    /// stopped without committing more.
    #[error("{0}")]
    Superseded(String),
    /// A file of the store (the finished marker, a generation record) is damaged or was copied from
    /// another job.
    #[error("the {what} file in {store} is damaged ({reason}): {advice}")]
    Damaged {
        /// Which file.
        what: &'static str,
        /// The store.
        store: String,
        /// What is wrong with it.
        reason: String,
        /// What to do.
        advice: &'static str,
    },
}

impl std::fmt::Debug for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_the_message_as_a_main_returning_box_dyn_error_prints_it_regression_variant_fields() {
        let e = RunError::Storage(StorageError::Locked { path: "/tmp/state/LOCK".into() });
        assert_eq!(format!("{e:?}"), e.to_string());
        let boxed: Box<dyn std::error::Error> = Box::new(e);
        assert!(format!("{boxed:?}").starts_with("checkpoint storage: "), "{boxed:?}");
        assert!(!format!("{boxed:?}").contains("Locked {"), "{boxed:?}");
    }
}
