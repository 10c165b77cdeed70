//! The local runtime: everything that runs a job's tasks in this process and coordinates their
//! checkpoints. The run loop (start, restore, claim a generation, deploy, run, fail over and restart),
//! the carrying out of the coordinator's decisions (`driver`), each task's control plane (`task`),
//! deployment of a generation (`deploy`), tasks as threads (`local`), savepoint export, and the
//! public handles ([`JobControl`], [`JobHandle`]), settings ([`RunConfig`]) and reports.
//!
//! It owns no protocol logic of its own: the coordinator, aligner, restart policy and run lifecycle of
//! `cutline-core` decide; this layer moves messages, bytes and threads, and the cluster runtime and the
//! simulation drive the same code through the `Backend` and `ControlPlane` seams.

pub(crate) mod chains;
mod config;
pub(crate) mod control;
pub(crate) mod deploy;
pub(crate) mod driver;
mod error;
pub(crate) mod keeper;
pub(crate) mod life;
pub(crate) mod local;
pub(crate) mod report;
pub(crate) mod run;
mod savepoint;
pub(crate) mod start;
pub(crate) mod stats;
pub(crate) mod task;
pub(crate) mod trace;

pub use config::{
    CheckpointListener, RunConfig, DEFAULT_CHANNEL_CAPACITY, DEFAULT_MAX_CHANNEL_STATE_BYTES,
    DEFAULT_RETAINED_CHECKPOINTS, DEFAULT_TICK_MS, SNAPSHOT_QUEUE_CAPACITY,
};
pub use control::{run, spawn, JobControl, JobHandle, CONTROL_ANSWER_TIMEOUT};
pub use driver::FailedCheckpoint;
pub use error::RunError;
pub use keeper::{CHECKPOINT_RECORDS_KEPT, RECORD_QUEUE};
pub use report::{
    AckReport, CheckpointSummary, EdgeShape, JobMetrics, JobReport, StageShape, TaskReport, METRICS_CHECKPOINTS,
};
pub use savepoint::SavepointInfo;
pub use stats::{
    CheckpointHistograms, Histogram, RunCounters, TaskCheckpoint, CHECKPOINTS_KEPT, FAILED_CHECKPOINTS_KEPT,
    HISTORY_LOADED,
};
pub use task::SnapshotTimings;
pub use trace::{CheckpointRecord, InputTrace, Step, StepKind, TaskTrace, CHECKPOINT_RECORD_VERSION};

pub(crate) use control::Command;
pub(crate) use savepoint::open as open_savepoint;
