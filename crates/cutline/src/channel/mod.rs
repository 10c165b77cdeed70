//! The data plane inside a process: what travels on a data channel (`Message`), the bounded FIFO
//! channels between tasks with credit-based flow control (`queue`), the `Waker` tasks sleep on,
//! and the type-erased, encoding channel ends that cross processes (`pump`).
//!
//! Lowest layer of the runtime: it knows records only as [`Data`] and barriers only as values to keep
//! in order. It decides nothing about checkpoints.

pub(crate) mod pump;
mod queue;
mod waker;

use cutline_core::barrier::Barrier;
use cutline_core::watermark::WatermarkUpdate;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use queue::ChannelStats;
pub(crate) use queue::{channel, ChannelProbe, Rx, Taken, Tx};
pub(crate) use waker::Waker;

/// A record type that can cross an edge between tasks. Records in flight may be persisted as channel
/// state (unaligned checkpoints) or sent to another process, so they must be serialisable.
/// Implemented for every such type.
pub trait Data: Send + Serialize + DeserializeOwned + 'static {}
impl<T: Send + Serialize + DeserializeOwned + 'static> Data for T {}

/// One message on a data channel: records on the data plane, watermarks, barriers and end-of-stream
/// on the control plane, in one FIFO per (upstream subtask, downstream subtask) pair.
#[derive(Debug)]
pub(crate) enum Message<T> {
    /// A batch of records; never empty.
    Data(Vec<T>),
    /// A watermark: event time on this channel reached it (or the channel is idle). Never overtakes
    /// records; an unaligned barrier that overtakes it carries it in the channel state.
    Watermark(WatermarkUpdate),
    /// A checkpoint barrier: every record before it belongs to the checkpoint, none after it.
    Barrier(Barrier),
    /// The upstream task will send nothing more on this channel.
    End,
}

/// One entry of an input's channel state (the messages an unaligned barrier overtook, or that were
/// read after the snapshot and before the barrier), replayed in order on restore.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) enum InFlight {
    /// An encoded data batch.
    Batch(Vec<u8>),
    Watermark(WatermarkUpdate),
}

impl InFlight {
    /// Bytes it takes in a checkpoint (for the channel state limit).
    pub fn size_bytes(&self) -> u64 {
        match self {
            InFlight::Batch(b) => b.len() as u64,
            InFlight::Watermark(_) => 16,
        }
    }
}
