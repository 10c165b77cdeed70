//! What travels on data channels and control channels, and the task error type.
//!
//! Data channels carry [`Message`]: record batches on the data plane, barriers and end-of-stream on the
//! control plane, in one FIFO per (upstream subtask, downstream subtask) pair. Control channels carry
//! [`Control`] from the coordinator to one task. This module only defines the shapes.

use cutline_core::barrier::Barrier;
use cutline_core::CheckpointId;

/// One message on a data channel.
#[derive(Debug)]
pub(crate) enum Message<T> {
    /// A batch of records; never empty.
    Data(Vec<T>),
    /// A checkpoint barrier: every record before it belongs to the checkpoint, none after it.
    Barrier(Barrier),
    /// The upstream task will send nothing more on this channel.
    End,
}

/// A message from the coordinator to one task.
#[derive(Clone, Debug)]
pub(crate) enum Control {
    /// Sources only: inject this barrier before the next record.
    Trigger(Barrier),
    /// Checkpoint complete: sinks commit everything prepared up to and including it.
    Complete(CheckpointId),
    /// The checkpoint will never complete. Informational: prepared sink data stays for the next
    /// completed checkpoint; the id is kept for debugging.
    #[allow(dead_code)]
    Abort(CheckpointId),
    /// Stop now (failover or shutdown).
    Cancel,
}

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
