//! A job across processes: a coordinator process that runs the checkpoint coordinator and no tasks,
//! and worker processes that run the tasks it places on them.
//!
//! - Coordinator side: [`spawn_cluster`] runs the same run loop as the embedded runtime through a
//!   `Backend` (`coordinator`), admitting authenticated workers (`admit`).
//! - Worker side: [`run_worker`] joins a coordinator (`worker`) and deploys its part of each
//!   generation (`worker_deploy`).
//! - Wire: the framing and the handshake every connection speaks (`wire`), the messages between
//!   coordinator and workers (`proto`), the data links between workers (`data`), and the worker-side
//!   aggregation of acknowledgements (`acks`).
//!
//! It decides nothing about checkpoints: what arrives feeds the same pure coordinator the embedded
//! runtime uses. It does not restart processes (a launcher or an operator's supervisor does).

pub(crate) mod acks;
mod admit;
mod coordinator;
mod data;
pub(crate) mod proto;
mod shape;
pub(crate) mod wire;
mod worker;
mod worker_deploy;

pub use coordinator::{
    spawn_cluster, ClusterConfig, DEFAULT_DEPLOY_TIMEOUT_MS, DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_HEARTBEAT_TIMEOUT_MS, DEFAULT_JOIN_TIMEOUT_MS, DEFAULT_REPLACEMENT_WAIT_MS,
};
pub use wire::FrameProtection;
pub use worker::{run_worker, JobBuilder, StoreOpener, WorkerConfig, WorkerError, DEFAULT_REJOIN_TIMEOUT_MS};
