//! Type-erased, encoding ends of a channel whose two tasks run in different processes: the
//! [`OutPump`] drains the local channel of an upstream task, the [`InPump`] fills the local channel of
//! a downstream task. The cluster's data links move what they give over TCP; this module knows nothing
//! of sockets.

use super::{Data, Message, Rx, Taken, Tx};
use cutline_core::barrier::Barrier;
use cutline_core::watermark::WatermarkUpdate;

/// Identifies one channel of the job: edge index, upstream subtask, downstream subtask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ChannelKey {
    pub edge: u32,
    pub up: u32,
    pub down: u32,
}

/// What an outbound pump gave.
pub(crate) enum Out {
    Empty,
    /// A data batch, encoded into the caller's buffer.
    Data,
    Watermark(WatermarkUpdate),
    Barrier(Barrier),
    End,
    /// The upstream task is gone without end-of-stream (it failed or was cancelled).
    Gone,
}

/// The sending side's end of a crossing channel: the consumer of the local channel.
pub(crate) trait OutPump: Send {
    /// Take the next message: a data batch only if `credit`, encoded into `buf` after the 4-byte
    /// channel number `ch` (the frame's payload, built in one buffer).
    fn poll(&mut self, credit: bool, ch: u32, buf: &mut Vec<u8>) -> Out;
}

/// The receiving side's end of a crossing channel: the producer of the local channel.
pub(crate) trait InPump: Send {
    /// Decode a batch and queue it. Errors: the bytes do not decode (a malformed frame), or the
    /// downstream task is gone.
    fn push_data(&mut self, bytes: &[u8]) -> Result<(), String>;
    fn push(&mut self, marker: Marker) -> Result<(), String>;
    /// Data batches queued locally, not yet taken by the downstream task.
    fn queued_batches(&self) -> usize;
}

/// A control marker on a data channel.
pub(crate) enum Marker {
    Watermark(WatermarkUpdate),
    Barrier(Barrier),
    End,
}

struct OutEnd<T>(Rx<T>);
struct InEnd<T>(Tx<T>);

impl<T: Data> OutPump for OutEnd<T> {
    fn poll(&mut self, credit: bool, ch: u32, buf: &mut Vec<u8>) -> Out {
        let never = |_: &Barrier| false;
        let unused = |_: &Vec<T>| Vec::new();
        match self.0.poll(&never, &unused, credit) {
            Taken::Empty => Out::Empty,
            Taken::Msg(Message::Data(batch)) => {
                buf.clear();
                buf.extend_from_slice(&ch.to_be_bytes());
                let bytes = postcard::to_extend(&batch, std::mem::take(buf)).expect("a record that serialises");
                *buf = bytes;
                Out::Data
            }
            Taken::Msg(Message::Watermark(w)) => Out::Watermark(w),
            Taken::Msg(Message::Barrier(b)) => Out::Barrier(b),
            Taken::Msg(Message::End) => Out::End,
            Taken::Overtook { .. } => unreachable!("the pump never lets a barrier overtake"),
            Taken::Disconnected => Out::Gone,
        }
    }
}

impl<T: Data> InPump for InEnd<T> {
    fn push_data(&mut self, bytes: &[u8]) -> Result<(), String> {
        let batch: Vec<T> = postcard::from_bytes(bytes).map_err(|e| format!("a data batch does not decode: {e}"))?;
        if batch.is_empty() {
            return Err("an empty data batch".into());
        }
        self.0.push(Message::Data(batch)).map_err(|_| "the downstream task is gone".to_string())
    }
    fn push(&mut self, marker: Marker) -> Result<(), String> {
        let m = match marker {
            Marker::Watermark(w) => Message::Watermark(w),
            Marker::Barrier(b) => Message::Barrier(b),
            Marker::End => Message::End,
        };
        self.0.push(m).map_err(|_| "the downstream task is gone".to_string())
    }
    fn queued_batches(&self) -> usize {
        self.0.queued_batches()
    }
}

pub(crate) fn out_pump<T: Data>(rx: Rx<T>) -> Box<dyn OutPump> {
    Box::new(OutEnd(rx))
}

pub(crate) fn in_pump<T: Data>(tx: Tx<T>) -> Box<dyn InPump> {
    Box::new(InEnd(tx))
}
