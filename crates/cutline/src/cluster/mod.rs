//! A job across processes: a coordinator process that runs the checkpoint coordinator and no tasks,
//! and worker processes that run the tasks it places on them.
//!
//! - Coordinator side: [`spawn_cluster`] runs the same run loop as the embedded runtime through a
//!   `Backend` (`coordinator`: placement, deployment, losses, the failover reason), admitting
//!   authenticated workers and running each one's reader and writer threads (`admit`).
//! - Worker side: [`run_worker`] joins a coordinator, stops at once on what retrying cannot mend
//!   ([`WorkerError`]) and runs the session loop (`worker`); it deploys its part of each generation
//!   (`worker_deploy`) and refuses a job whose graph differs from the coordinator's (`shape`).
//! - Wire: frames, the handshake and frame protection every connection speaks (`wire`: `frame`,
//!   `handshake`, `seal`), the messages between coordinator and workers (`proto`), the data links
//!   between workers with their credit-based flow control (`data`), and the worker-side aggregation
//!   of acknowledgements (`acks`).
//!
//! Limits: every queue fed from the network is bounded (`INBOX_MESSAGES`, `WORKER_QUEUE_MESSAGES`,
//! `FROM_COORDINATOR_MESSAGES`, the run loop's `EVENT_QUEUE_MESSAGES`); a full queue blocks the
//! connection's reader (backpressure through TCP) or drops the worker, never grows. A handshake
//! takes at most `HANDSHAKE_TIMEOUT_MS` in all, at most `MAX_PENDING_HANDSHAKES` run at once, and a
//! frame is at most `max_frame_bytes`.
//!
//! - Launcher: [`launch`] starts and supervises a coordinator and workers on one machine.
//!
//! It decides nothing about checkpoints: what arrives feeds the same pure coordinator the embedded
//! runtime uses. It does not restart processes (a launcher or an operator's supervisor does).

pub(crate) mod acks;
mod admit;
mod config;
mod coordinator;
mod data;
pub mod launch;
pub(crate) mod proto;
mod shape;
pub(crate) mod wire;
mod worker;
mod worker_deploy;
mod worker_links;
mod worker_status;

pub use config::{
    ClusterConfig, DEFAULT_DEPLOY_TIMEOUT_MS, DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_HEARTBEAT_TIMEOUT_MS,
    DEFAULT_JOIN_TIMEOUT_MS, DEFAULT_REPLACEMENT_WAIT_MS,
};
pub use coordinator::spawn_cluster;
pub use wire::FrameProtection;
pub use worker::{run_worker, JobBuilder, StoreOpener, WorkerConfig, WorkerError, DEFAULT_REJOIN_TIMEOUT_MS};
pub use worker_status::{WorkerState, WorkerStatus};
