//! Connectors: how records enter and leave a job. The [`Source`] contract (replayable from a recorded
//! offset) and the two-phase [`Sink`] contract, and the built-in implementations: files, a
//! deterministic generator, an in-memory transactional store, standard output.
//!
//! Connectors know nothing of barriers, channels or the coordinator: their task calls them (a source
//! polls, a sink writes, prepares, commits and recovers) and stores what they hand out in checkpoints.
//! External systems (Kafka, PostgreSQL) come here, behind cargo features.

mod file_sink;
mod generator;
mod interleave;
#[cfg(feature = "kafka")]
pub mod kafka;
mod line_file;
mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
mod simple;
mod sink;
mod source;

pub use file_sink::{FileIdentity, PendingFile, TransactionalFileSink};
pub use generator::{GeneratorOffset, GeneratorSource};
pub use interleave::{ReadBefore, MAX_READ_BEFORE_LAYERS};
pub use line_file::{LineFileSource, LineOffset, MAX_LINE_BYTES};
pub use memory::{MarkedEpoch, MemoryMarkerSink, MemoryTxnSink, MemoryTxnStore};
pub use simple::{DiscardSink, PrintSink};
pub use sink::{Sink, SinkContext};
pub use source::{Source, SourceContext, SourceStatus, SplitId};
