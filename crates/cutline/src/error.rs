//! [`TaskError`]: why a task stopped with an error. Every layer that runs inside a task (channels,
//! state, operators, sources and sinks) reports failures with it; the task fails and the job
//! restores from its last complete checkpoint, unless the failure is permanent.
//!
//! # Permanent failures
//!
//! Some failures repeat identically however often the job restarts: a line longer than the source's
//! limit, an input that was truncated or replaced, an output file that another run wrote. Restarting
//! only replays the same input into the same failure. A connector says so with
//! [`ConnectorError::permanent`]; the flag travels with the task failure (also across the network
//! from a worker), and a permanent failure ends the run at once with `RunError::Permanent`, without
//! restarts.

/// A source's or sink's failure, and whether restarting the job can mend it.
///
/// Most failures are transient (a connection lost, a broker or database that is down): the job
/// restores from its latest checkpoint and tries again under its restart strategy. Build those from
/// a message (`"...".into()`, `format!(..).into()`, or `?` on a `String` or an `io::Error`). A
/// failure that the same input will cause again after every restart is
/// [`ConnectorError::permanent`]: the run ends at once with the message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConnectorError {
    message: String,
    permanent: bool,
}

impl ConnectorError {
    /// A failure that a restart may mend.
    pub fn transient(message: impl Into<String>) -> ConnectorError {
        ConnectorError { message: message.into(), permanent: false }
    }
    /// A failure that repeats at the same input however often the job restarts.
    pub fn permanent(message: impl Into<String>) -> ConnectorError {
        ConnectorError { message: message.into(), permanent: true }
    }
    /// Does restarting not help?
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }
    /// What went wrong, for people.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<String> for ConnectorError {
    fn from(message: String) -> ConnectorError {
        ConnectorError::transient(message)
    }
}

impl From<&str> for ConnectorError {
    fn from(message: &str) -> ConnectorError {
        ConnectorError::transient(message)
    }
}

impl From<std::io::Error> for ConnectorError {
    fn from(e: std::io::Error) -> ConnectorError {
        ConnectorError::transient(e.to_string())
    }
}

/// What a source's or sink's methods return.
pub type ConnectorResult<T> = Result<T, ConnectorError>;

/// Why a task stopped with an error. The task fails and the job restores from its last checkpoint,
/// unless the failure [is permanent](TaskError::is_permanent): then the run ends.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A downstream task's end of a channel is gone: the job is being torn down (after another
    /// failure, or a stop), and this task stops with it.
    #[error("a downstream task is gone (the job is being torn down)")]
    Disconnected,
    /// A source failed.
    #[error("source {uid}: {error}")]
    Source {
        /// The source's uid.
        uid: String,
        /// What it reported.
        error: ConnectorError,
    },
    /// A sink failed.
    #[error("sink {uid}: {error}")]
    Sink {
        /// The sink's uid.
        uid: String,
        /// What it reported.
        error: ConnectorError,
    },
    /// State could not be encoded or restored: a checkpoint's state that does not decode or does not
    /// fit the job (an operator's state type or parallelism changed), or a deployment that does not
    /// fit the job graph. Permanent: restarting restores the same state again. Keep the operator's
    /// types and ids, or start from a fresh state directory.
    #[error("state of {uid}: {message}")]
    State {
        /// The operator, source or sink whose state it is (`(deploy)`, `(restore)` or `(placement)`
        /// when it concerns the deployment as a whole).
        uid: String,
        /// What is wrong.
        message: String,
    },
    /// The task was told to stop (failover or shutdown); not a failure of its own.
    #[error("cancelled")]
    Cancelled,
    /// A failure injected by a `Faults` policy (feature `testing`) at the named
    /// fault point.
    #[error("injected failure at {0}")]
    Injected(String),
}

impl TaskError {
    /// Does restarting not help? A source's or sink's permanent failure, or state that does not fit
    /// the job.
    pub fn is_permanent(&self) -> bool {
        match self {
            TaskError::Source { error, .. } | TaskError::Sink { error, .. } => error.is_permanent(),
            TaskError::State { .. } => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connector_error_says_whether_it_is_permanent_and_shows_its_message() {
        let e = TaskError::Source { uid: "lines".into(), error: ConnectorError::permanent("line 3 is too long") };
        assert!(e.is_permanent());
        assert_eq!(e.to_string(), "source lines: line 3 is too long");
        let t: ConnectorError = format!("cannot open {}", "x").into();
        assert!(!TaskError::Sink { uid: "out".into(), error: t }.is_permanent());
        assert!(!TaskError::Injected("x".into()).is_permanent());
        let io: ConnectorError = std::io::Error::other("disk gone").into();
        assert_eq!((io.message(), io.is_permanent()), ("disk gone", false));
    }
}
