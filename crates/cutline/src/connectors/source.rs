//! The [`Source`] contract: a reader replayable from a recorded offset.
//!
//! A source reads; its task injects barriers between batches and records the source's offset with each
//! snapshot. Sources never see barriers and never talk to the coordinator.

use crate::error::ConnectorResult;
use cutline_core::CheckpointId;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// What a poll produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceStatus {
    /// Records were produced (or may be soon): poll again.
    More,
    /// Nothing available right now; the task waits a little before polling again.
    Idle,
    /// Bounded input is exhausted; nothing will ever come again.
    Finished,
}

/// One split of a source subtask's input (a Kafka partition, a file), as far as event time goes:
/// with [`WatermarkStrategy::per_split`](crate::WatermarkStrategy::per_split), watermarks are
/// generated per split and the subtask's watermark is the minimum over its active splits, so a split
/// read ahead of the others does not make their records late. Any stable number works (a hash of the
/// topic and partition, a file's index); it is stored in checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
pub struct SplitId(pub u64);

/// Where a source instance runs: what a source factory ([`Job::source_from`](crate::Job::source_from))
/// is given.
#[derive(Clone, Debug)]
pub struct SourceContext {
    /// The source's stable id (it names the offsets in checkpoints).
    pub uid: String,
    /// This instance's subtask, `0..parallelism`.
    pub subtask: u32,
    /// How many instances of the source run.
    pub parallelism: u32,
}

/// A replayable source. One instance runs per parallel subtask, on its task's thread.
///
/// The contract:
/// - `open` is called once, first, at a fresh start (`restored` is `None`) and after every restore
///   (the offset the restored checkpoint recorded for this subtask). Reading must then resume exactly
///   there: the records after the offset are those a run without the failure would have produced.
/// - `poll` must not block for long: the task handles barriers and control messages only between
///   polls, so a poll that waits delays every checkpoint. When nothing is available, return
///   [`SourceStatus::Idle`]; the task polls again a few milliseconds later.
/// - `offset` is asked at every barrier, between polls: the position after the last record `poll`
///   handed out. It is stored in the checkpoint.
/// - `checkpoint_complete` tells the source that a checkpoint holding `offset` is complete, for
///   example to acknowledge a log's offsets for monitoring. It is best effort: a notification may be
///   lost (a crash) or skipped (a newer completion covers older ones), so never rely on it for
///   correctness; the offset in the checkpoint is the truth.
/// - `close` is called when the task ends normally (every record read, the checkpoint that ends the
///   job complete); not after a failure.
///
/// Any error fails the task, and the job restores from its latest complete checkpoint.
pub trait Source: Send + 'static {
    /// The records it produces.
    type Item: Send + 'static;
    /// A position from which reading resumes exactly; stored in every checkpoint.
    type Offset: Serialize + DeserializeOwned + Clone + Send + std::fmt::Debug + 'static;

    /// Open for `subtask` of `parallelism`, at `restored` if the job restores from a checkpoint.
    fn open(&mut self, subtask: u32, parallelism: u32, restored: Option<Self::Offset>) -> ConnectorResult<()>;
    /// The offset that `subtask` of `parallelism` restores from when the checkpoint was taken at
    /// another parallelism: `old` holds the offset of every old subtask, in subtask order (so
    /// `old.len()` is the old parallelism; a checkpoint that lacks one is refused as damaged). `None` (the
    /// default): this source cannot change parallelism, and such a restore is refused at start. An
    /// error: the old offsets do not fit together (a damaged checkpoint).
    fn rescale(old: Vec<Self::Offset>, subtask: u32, parallelism: u32) -> ConnectorResult<Option<Self::Offset>>
    where
        Self: Sized,
    {
        let _ = (old, subtask, parallelism);
        Ok(None)
    }
    /// Append up to `max` records to `out`, without blocking for long.
    fn poll(&mut self, out: &mut Vec<Self::Item>, max: usize) -> ConnectorResult<SourceStatus>;
    /// The position after the last record handed out by `poll`.
    fn offset(&self) -> Self::Offset;
    /// `checkpoint`, which recorded `offset` for this subtask, is complete (best effort; see the
    /// trait docs).
    fn checkpoint_complete(&mut self, checkpoint: CheckpointId, offset: &Self::Offset) -> ConnectorResult<()> {
        let _ = (checkpoint, offset);
        Ok(())
    }
    /// The splits this subtask reads now, for per-split watermarks
    /// ([`WatermarkStrategy::per_split`](crate::WatermarkStrategy::per_split)): each holds the
    /// subtask's watermark back until it has records, so a split that has not delivered yet cannot
    /// be overtaken. Leave out a split whose bounded input is finished. Asked after every poll; empty
    /// (the default): the source does not know its splits, and a split counts once it has a record.
    fn splits(&self) -> &[SplitId] {
        &[]
    }
    /// The task ends normally: release connections and files.
    fn close(&mut self) -> ConnectorResult<()> {
        Ok(())
    }
}
