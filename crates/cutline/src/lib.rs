//! cutline: a stream-processing engine whose checkpoints are consistent cuts.
//!
//! This facade re-exports the public API. Build a [`Job`] from sources, operators and sinks, then run
//! it with [`run`]; state is checkpointed with epoch-tagged barriers and restored after any failure, so
//! that committed output is exactly that of a run without failures.
//!
//! ```no_run
//! use cutline::{Job, GeneratorSource, TransactionalFileSink, RunConfig, LocalDirStore};
//! use std::sync::Arc;
//!
//! let job = Job::new("counts");
//! job.source("numbers", GeneratorSource::new(1_000, |i| i % 10))
//!     .key_by(|n: &u64| *n)
//!     .aggregate("count", || 0u64, |c, _n| *c += 1, |k, c| (*k, *c))
//!     .sink("out", TransactionalFileSink::new("/tmp/counts-out", |(k, c): &(u64, u64), buf: &mut Vec<u8>| {
//!         buf.extend_from_slice(format!("{k}\t{c}").as_bytes())
//!     }));
//! let graph = job.build().unwrap();
//! let store = Arc::new(LocalDirStore::open("/tmp/counts-state").unwrap());
//! let report = cutline::run(&graph, RunConfig::new(store, "counts-v1")).unwrap();
//! println!("{} checkpoints", report.checkpoints_completed);
//! ```

pub mod admin;
mod api;
mod channel;
pub mod cluster;
pub mod coordbench;
mod driver;
mod emit;
mod fault;
mod graph;
mod message;
mod net;
pub mod runtime;
mod savepoint;
pub mod sim;
mod sink;
mod source;
mod state;
mod task;

pub mod jobs;

pub use api::{ConnectedStreams, Data, Either, GraphError, Job, KeyedStream, Stream};
pub use channel::ChannelStats;
pub use cutline_core::barrier::{Alignment, CheckpointMode, SnapshotKind};
pub use cutline_core::coordinator::CheckpointConfig;
pub use cutline_core::restart::RestartStrategy;
pub use cutline_core::{CheckpointId, Generation};
pub use cutline_storage::{CheckpointStore, GenerationRecord, LocalDirStore, Manifest, MemStore};
pub use driver::FailedCheckpoint;
pub use emit::DEFAULT_BATCH_SIZE;
pub use fault::{FaultPoint, Faults};
pub use graph::{EdgeKind, JobGraph};
pub use message::TaskError;
pub use runtime::{
    run, spawn, CheckpointSummary, JobControl, JobHandle, JobMetrics, JobReport, RunConfig, RunError, TaskReport,
};
pub use savepoint::SavepointInfo;
pub use sink::{
    DiscardSink, MemoryTxnSink, MemoryTxnStore, PendingFile, PrintSink, Sink, SinkContext, TransactionalFileSink,
};
pub use source::{GeneratorSource, LineFileSource, LineOffset, Source, SourceStatus};
pub use state::{splitmix64, stable_hash, Output};
