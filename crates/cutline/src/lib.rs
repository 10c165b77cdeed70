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
//!
//! Layers, lowest first (a module never imports one above it):
//! - [`channel`]: the in-process data plane (bounded channels, wakers, encoding channel ends).
//! - [`state`]: stable key hashing, snapshot images, the restore index.
//! - [`connectors`]: the [`Source`] and [`Sink`] contracts and the built-in sources and sinks.
//! - [`dataflow`]: the API ([`Job`], [`Stream`]), operators, task bodies and the [`JobGraph`].
//! - [`runtime`]: the run loop, task control planes, threads, savepoints, [`JobControl`].
//! - [`cluster`]: coordinator and worker processes over TCP.
//! - [`admin`]: the local admin socket of a running job.
//! - `testing` (feature `testing`): the deterministic simulation, the coordinator benchmark, fault
//!   injection.

#![warn(missing_docs)]

pub mod admin;
pub mod channel;
pub mod cluster;
pub mod connectors;
pub mod dataflow;
mod error;
mod fault;
pub mod runtime;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;

pub use channel::{ChannelStats, Data};
pub use connectors::{
    DiscardSink, GeneratorOffset, GeneratorSource, LineFileSource, LineOffset, MemoryTxnSink, MemoryTxnStore,
    PendingFile, PrintSink, ReadBefore, Sink, SinkContext, Source, SourceContext, SourceStatus, SplitId,
    TransactionalFileSink,
};
pub use cutline_core::barrier::{Alignment, CheckpointMode, SnapshotKind};
pub use cutline_core::coordinator::CheckpointConfig;
pub use cutline_core::restart::RestartStrategy;
pub use cutline_core::watermark::{EventTime, WatermarkUpdate};
pub use cutline_core::{CheckpointId, Generation};
pub use cutline_storage::{
    CheckpointStore, GenerationRecord, LocalDirStore, Manifest, MemStore, StateFileRef, TaskStateHandle,
};
pub use dataflow::{
    ConnectedStreams, EdgeKind, Either, GraphError, Job, JobGraph, JoinedStreams, KeyedProcess, KeyedStream, Output,
    Stream, WatermarkStrategy, Window, WindowedStream, Windows, DEFAULT_BATCH_SIZE, MAX_SPLITS_PER_SUBTASK,
    WATERMARK_EVERY_RECORDS,
};
pub use error::{ConnectorError, ConnectorResult, TaskError};
#[cfg(feature = "testing")]
pub use fault::{FaultPoint, Faults};
pub use runtime::{
    run, spawn, CheckpointSummary, FailedCheckpoint, JobControl, JobHandle, JobMetrics, JobReport, RunConfig, RunError,
    SavepointInfo, TaskReport,
};
pub use state::{splitmix64, stable_hash, StateBackend, DEFAULT_DISK_CACHE_ENTRIES};

/// The README's Rust blocks, compiled by `cargo test --doc` (and run where they do not touch fixed
/// paths), so that what it shows cannot stop compiling unnoticed.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
