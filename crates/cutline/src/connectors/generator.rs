//! [`GeneratorSource`]: a deterministic generator, replayable by record index (benchmarks, tests,
//! the simulation).

use super::source::{Source, SourceStatus};
use crate::error::ConnectorResult;

/// A deterministic generator: record `i` (for `i` in `0..count`, split across subtasks by `i % parallelism`)
/// is `f(i)`. Replayable by index. Used by benchmarks, tests and the simulation.
pub struct GeneratorSource<T> {
    count: u64,
    f: std::sync::Arc<dyn Fn(u64) -> T + Send + Sync>,
    next: u64,
    step: u64,
}

impl<T> GeneratorSource<T> {
    /// `count` records in all (over every subtask), record `i` being `f(i)`. `f` must be
    /// deterministic: a restore replays records from their index.
    pub fn new(count: u64, f: impl Fn(u64) -> T + Send + Sync + 'static) -> GeneratorSource<T> {
        GeneratorSource { count, f: std::sync::Arc::new(f), next: 0, step: 1 }
    }
}

impl<T> Clone for GeneratorSource<T> {
    fn clone(&self) -> Self {
        GeneratorSource { count: self.count, f: self.f.clone(), next: self.next, step: self.step }
    }
}

impl<T: Send + 'static> Source for GeneratorSource<T> {
    type Item = T;
    type Offset = u64;

    fn open(&mut self, subtask: u32, parallelism: u32, restored: Option<u64>) -> ConnectorResult<()> {
        self.step = parallelism as u64;
        self.next = match restored {
            Some(n) => {
                if n % self.step != subtask as u64 % self.step && n < self.count {
                    return Err(format!("offset {n} does not belong to subtask {subtask} of {parallelism}").into());
                }
                n
            }
            None => subtask as u64,
        };
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<T>, max: usize) -> ConnectorResult<SourceStatus> {
        let mut n = 0;
        while n < max && self.next < self.count {
            out.push((self.f)(self.next));
            self.next += self.step;
            n += 1;
        }
        Ok(if n == 0 && self.next >= self.count { SourceStatus::Finished } else { SourceStatus::More })
    }

    fn offset(&self) -> u64 {
        self.next
    }
}
