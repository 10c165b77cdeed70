//! The dataflow API and its operators: how a user describes a job ([`Job`], [`Stream`],
//! [`KeyedStream`]), the operators fused into a task's chain (stateless maps and filters, the keyed
//! stateful operator, the sink driver, the router at the end of a chain), the typed task bodies, and
//! the [`JobGraph`] the API builds.
//!
//! Building a job only records stages, edges and factories; nothing runs until a runtime deploys the
//! graph. Operators never see barriers: the runtime's task control plane calls their hooks
//! (`on_barrier`, `on_end`, `on_complete`, `on_start`) in chain order.

mod api;
mod body;
pub(crate) mod emit;
mod event_time;
mod fork;
mod graph;
mod join;
mod keyed;
mod keyed_state;
mod keyed_stream;
mod router;
mod sink_op;
mod splits;
mod timers;
mod window;

pub use api::{ConnectedStreams, Either, GraphError, Job, KeyedStream, Stream};
pub use emit::DEFAULT_BATCH_SIZE;
pub use event_time::{WatermarkStrategy, WATERMARK_EVERY_RECORDS};
pub use graph::{EdgeKind, JobGraph};
pub use join::JoinedStreams;
pub use keyed::{KeyedProcess, Output};
pub use splits::MAX_SPLITS_PER_SUBTASK;
pub use window::{Window, WindowedStream, Windows};

pub(crate) use body::{channel_state_uid, ChannelState, Polled, TaskBody};
pub(crate) use emit::Pending;
pub(crate) use graph::{EdgePlan, StageCtx};
