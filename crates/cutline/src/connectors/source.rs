//! The [`Source`] contract: a reader replayable from a recorded offset.
//!
//! A source reads; its task injects barriers between batches and records the source's offset with each
//! snapshot. Sources never see barriers and never talk to the coordinator.

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

/// A replayable source. One instance runs per parallel subtask.
pub trait Source: Send + 'static {
    type Item: Send + 'static;
    /// A position from which reading resumes exactly; stored in every checkpoint.
    type Offset: Serialize + DeserializeOwned + Clone + Send + std::fmt::Debug + 'static;

    /// Open for `subtask` of `parallelism`, at `restored` if the job restores from a checkpoint.
    fn open(&mut self, subtask: u32, parallelism: u32, restored: Option<Self::Offset>) -> Result<(), String>;
    /// Append up to `max` records to `out`.
    fn poll(&mut self, out: &mut Vec<Self::Item>, max: usize) -> Result<SourceStatus, String>;
    /// The position after the last record handed out by `poll`.
    fn offset(&self) -> Self::Offset;
}
