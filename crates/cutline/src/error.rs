//! [`TaskError`]: why a task stopped with an error. Every layer that runs inside a task (channels,
//! state, operators, sources and sinks) reports failures with it; the task fails and the job
//! restores from its last complete checkpoint, unless the failure is permanent.
//!
//! # Permanent failures
//!
//! Some failures repeat identically however often the job restarts: a line longer than the source's
//! limit, an input that was truncated or replaced, an output file that another run wrote. Restarting
//! only replays the same input into the same failure. A connector says so with [`Permanent`]: its
//! message (a `String`, as the `Source` and `Sink` contracts return) then carries
//! [`PERMANENT_MARK`], which the runtime looks for in every task failure, also when it crossed the
//! network from a worker. A permanent failure ends the run at once with `RunError::Permanent`,
//! without restarts. The mark is the bridge until the connector traits return a typed error.

/// Why a task stopped with an error. The task fails and the job restores from its last checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("a downstream task is gone (the job is being torn down)")]
    Disconnected,
    #[error("source {uid}: {message}")]
    Source { uid: String, message: String },
    #[error("sink {uid}: {message}")]
    Sink { uid: String, message: String },
    #[error("state of {uid}: {message}")]
    State { uid: String, message: String },
    #[error("cancelled")]
    Cancelled,
    #[error("injected failure at {0}")]
    Injected(String),
}

impl TaskError {
    /// Does restarting not help? A source's or sink's failure marked [`Permanent`], or state that does
    /// not fit the job.
    pub fn is_permanent(&self) -> bool {
        match self {
            TaskError::Source { message, .. } | TaskError::Sink { message, .. } => is_permanent(message),
            TaskError::State { .. } => true,
            _ => false,
        }
    }
}

/// What marks a failure message as permanent (see the module docs). It starts the connector's message.
pub const PERMANENT_MARK: &str = "[permanent] ";

/// A connector's failure that restarting cannot mend. `String::from(Permanent(msg))` is the message
/// to return from a `Source` or `Sink` method: `Err(Permanent(format!(...)).into())`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permanent(pub String);

impl From<Permanent> for String {
    fn from(p: Permanent) -> String {
        if p.0.starts_with(PERMANENT_MARK) {
            p.0
        } else {
            format!("{PERMANENT_MARK}{}", p.0)
        }
    }
}

/// Is the failure described by `message` (a connector's message, or a task failure that contains
/// one) permanent?
pub fn is_permanent(message: &str) -> bool {
    message.contains(PERMANENT_MARK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permanent_message_stays_permanent_when_wrapped_and_is_marked_once() {
        let m: String = Permanent("line 3 is too long".into()).into();
        assert_eq!(m, "[permanent] line 3 is too long");
        assert_eq!(String::from(Permanent(m.clone())), m);
        let e = TaskError::Source { uid: "lines".into(), message: m };
        assert!(e.is_permanent());
        assert!(is_permanent(&format!("lines#0: {e}")), "a task failure's reason keeps the mark");
        assert!(!TaskError::Source { uid: "lines".into(), message: "cannot open x".into() }.is_permanent());
        assert!(!TaskError::Injected("x".into()).is_permanent());
    }
}
