//! The messages of the cluster protocol: what the coordinator tells a worker, what a worker tells the
//! coordinator, and the hellos exchanged inside the authenticated handshake. All are postcard-encoded
//! in frames of kind [`KIND_MESSAGE`]; the protocol version is the framing's.
//!
//! It does not send anything: the cluster runtime owns the connections.

use super::acks::TaskEvent;
use super::shape::GraphShape;
use super::wire::{self, WireError};
use crate::runtime::task::Control;
use cutline_core::barrier::Barrier;
use cutline_core::{CheckpointId, Generation};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Frame kind of every control-connection message.
pub(crate) const KIND_MESSAGE: u8 = 10;

/// A worker's hello in the handshake with the coordinator.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) struct JoinHello {
    /// The worker's cutline version: every process of a cluster runs the same one.
    pub version: String,
    /// Host and process id, for logs.
    pub name: String,
    /// Where other workers reach this worker's data plane.
    pub data_addr: String,
}

/// The coordinator's hello.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) struct WelcomeHello {
    pub version: String,
}

/// A data link's hello: which generation's channels it carries, from which worker to which.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) struct DataHello {
    pub generation: Generation,
    pub from: u32,
    pub to: u32,
}

/// Settings a worker takes from its coordinator, so that every worker runs the job alike.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct WorkerSettings {
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    pub channel_capacity: u32,
    pub batch_size: u32,
    pub max_channel_state_bytes: u64,
    pub snapshot_writers: u32,
    pub incremental_checkpoints: bool,
    /// Where keyed operators keep their state (a disk backend's directory is a path on the worker).
    pub state_backend: crate::state::StateBackend,
    pub max_frame_bytes: u32,
}

/// The job a coordinator runs: the arguments workers build the dataflow from, its fingerprint (the
/// worker checks it built the same job), where checkpoints go, and the settings every worker uses.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct JobInfo {
    pub args: Vec<String>,
    pub fingerprint: String,
    /// The shape of the coordinator's graph: a worker that builds another refuses the job.
    pub shape: GraphShape,
    pub state: String,
    pub settings: WorkerSettings,
}

/// Deploy one generation: the tasks placed on the receiving worker, restored from a checkpoint.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct DeployMsg {
    pub generation: Generation,
    /// The coordinator's clock (ms since its job started): workers align their task clocks to it, so
    /// that barrier ages (alignment timeouts count from the trigger) mean the same everywhere.
    pub now_ms: u64,
    /// The complete checkpoint to restore from the job's store.
    pub checkpoint: Option<CheckpointId>,
    /// Restore from this exported savepoint instead of the store.
    pub savepoint: Option<String>,
    pub skipped: Vec<CheckpointId>,
    pub duplicates_allowed: bool,
    /// The worker of every task, by task id.
    pub worker_of: Vec<u32>,
    /// Data-plane address of every worker by id ("" for workers not in this generation).
    pub peers: Vec<String>,
}

/// A control message for tasks, as it crosses the network.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) enum WireControl {
    Trigger(Barrier),
    Complete(CheckpointId),
    Abort(CheckpointId),
}

impl WireControl {
    pub fn from_control(c: &Control) -> Option<WireControl> {
        match c {
            Control::Trigger(b) => Some(WireControl::Trigger(*b)),
            Control::Complete(c) => Some(WireControl::Complete(*c)),
            Control::Abort(c) => Some(WireControl::Abort(*c)),
            Control::Cancel => None,
        }
    }
    pub fn into_control(self) -> Control {
        match self {
            WireControl::Trigger(b) => Control::Trigger(b),
            WireControl::Complete(c) => Control::Complete(c),
            WireControl::Abort(c) => Control::Abort(c),
        }
    }
}

/// Coordinator to worker.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) enum ToWorker {
    /// The job every generation runs: the arguments the worker builds its dataflow from, the job's
    /// fingerprint (the worker checks it built the same job), and where checkpoints go.
    /// The id the coordinator gives the worker (unique per coordinator process, given only after
    /// the handshake), and the job every generation runs: see [`JobInfo`].
    Job {
        worker: u32,
        job: JobInfo,
    },
    Deploy(DeployMsg),
    Control {
        generation: Generation,
        control: WireControl,
        sources_only: bool,
    },
    /// Stop the tasks of this generation (and older); answer `Cancelled`.
    Cancel {
        generation: Generation,
    },
    Heartbeat,
    /// The job is over: exit.
    Shutdown {
        reason: String,
    },
}

/// Worker to coordinator.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) enum ToCoordinator {
    Deployed {
        generation: Generation,
    },
    DeployFailed {
        generation: Generation,
        reason: String,
        permanent: bool,
    },
    /// Task events, acknowledgements aggregated per checkpoint.
    Events(Vec<TaskEvent>),
    Cancelled {
        generation: Generation,
    },
    /// Alive, with the flow-control figures of its tasks (by task id) for the coordinator's metrics.
    Heartbeat {
        tasks: Vec<(u32, crate::runtime::TaskReport)>,
    },
    /// This worker cannot run the job (it builds another graph from the job's arguments); it exits
    /// after sending this.
    Refused {
        reason: String,
    },
    /// A data link of `generation` between this worker and worker `peer` failed (sent before the
    /// failures of the tasks that it brings down).
    LinkFailed {
        generation: Generation,
        peer: u32,
        reason: String,
    },
}

pub(crate) fn encode<M: Serialize>(m: &M) -> Vec<u8> {
    postcard::to_allocvec(m).expect("protocol messages serialise")
}

pub(crate) fn decode<M: DeserializeOwned>(bytes: &[u8]) -> Result<M, WireError> {
    postcard::from_bytes(bytes).map_err(|e| WireError::Malformed(format!("a message does not decode: {e}")))
}

/// Read one message from a control connection.
pub(crate) fn read_message<M: DeserializeOwned>(
    frames: &mut wire::FrameReader,
    r: &mut impl std::io::Read,
    buf: &mut Vec<u8>,
) -> Result<M, WireError> {
    match frames.read(r, buf)? {
        KIND_MESSAGE => decode(buf),
        k => Err(WireError::Malformed(format!("unexpected frame kind {k} on a control connection"))),
    }
}

/// This build's cutline version: every process of a cluster must run the same one.
pub(crate) fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// One message, encoded, ready to be sent (sealed or not) on any number of connections.
pub(crate) fn message<M: Serialize>(m: &M) -> std::sync::Arc<[u8]> {
    encode(m).into()
}
