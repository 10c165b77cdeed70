//! Two simple sinks: [`PrintSink`] (standard output, for demos) and [`DiscardSink`] (benchmarks).

use super::sink::{Sink, SinkContext};
use crate::error::ConnectorResult;
use cutline_core::CheckpointId;

/// Prints every record to standard output as it arrives (at-least-once: after a failure, records since
/// the last checkpoint are printed again). For demos.
pub struct PrintSink<T> {
    prefix: String,
    _t: std::marker::PhantomData<fn(T)>,
}

impl<T> Clone for PrintSink<T> {
    fn clone(&self) -> Self {
        PrintSink { prefix: self.prefix.clone(), _t: std::marker::PhantomData }
    }
}

impl<T> PrintSink<T> {
    /// A sink that prints `prefix` and the record, one line per record.
    pub fn new(prefix: impl Into<String>) -> Self {
        PrintSink { prefix: prefix.into(), _t: std::marker::PhantomData }
    }
}

impl<T: std::fmt::Display + Send + 'static> Sink<T> for PrintSink<T> {
    type Committable = ();
    fn open(&mut self, _ctx: &SinkContext) -> ConnectorResult<()> {
        Ok(())
    }
    fn recover(&mut self, _c: &[()]) -> ConnectorResult<()> {
        Ok(())
    }
    fn write(&mut self, item: T) -> ConnectorResult<()> {
        println!("{}{item}", self.prefix);
        Ok(())
    }
    fn committed_after(&mut self, _c: Option<CheckpointId>) -> ConnectorResult<Option<bool>> {
        Ok(Some(false)) // at-least-once by nature
    }
    fn prepare(&mut self, _c: CheckpointId) -> ConnectorResult<Option<()>> {
        Ok(None)
    }
    fn commit(&mut self, _c: &[()]) -> ConnectorResult<()> {
        Ok(())
    }
}

/// Drops every record (benchmarks).
#[derive(Clone, Default)]
pub struct DiscardSink;

impl<T: Send + 'static> Sink<T> for DiscardSink {
    type Committable = ();
    fn open(&mut self, _ctx: &SinkContext) -> ConnectorResult<()> {
        Ok(())
    }
    fn recover(&mut self, _c: &[()]) -> ConnectorResult<()> {
        Ok(())
    }
    #[inline]
    fn write(&mut self, item: T) -> ConnectorResult<()> {
        std::hint::black_box(item);
        Ok(())
    }
    fn committed_after(&mut self, _c: Option<CheckpointId>) -> ConnectorResult<Option<bool>> {
        Ok(Some(false)) // keeps nothing
    }
    fn prepare(&mut self, _c: CheckpointId) -> ConnectorResult<Option<()>> {
        Ok(None)
    }
    fn commit(&mut self, _c: &[()]) -> ConnectorResult<()> {
        Ok(())
    }
}
