//! [`TaskError`]: why a task stopped with an error. Every layer that runs inside a task (channels,
//! state, operators, sources and sinks) reports failures with it; the task fails and the job
//! restores from its last complete checkpoint.

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
