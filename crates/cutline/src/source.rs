//! Sources: the [`Source`] contract (replayable from a recorded offset) and the built-in sources.
//!
//! A source reads; its task injects barriers between batches and records the source's offset with each
//! snapshot. Sources never see barriers and never talk to the coordinator.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::PathBuf;

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

/// The longest line a [`LineFileSource`] reads (lines are read whole, and a barrier goes between lines).
pub const MAX_LINE_BYTES: u64 = 64 << 20;

/// Lines of a text file, split across subtasks by line number (`line % parallelism == subtask`);
/// replayable by byte offset. Lines are read as UTF-8 (invalid bytes replaced).
pub struct LineFileSource {
    path: PathBuf,
    reader: Option<BufReader<File>>,
    subtask: u32,
    parallelism: u32,
    state: LineOffset,
    buf: Vec<u8>,
}

/// Position in a [`LineFileSource`]: byte offset and number of the next line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineOffset {
    pub byte: u64,
    pub line: u64,
}

impl LineFileSource {
    pub fn new(path: impl Into<PathBuf>) -> LineFileSource {
        LineFileSource {
            path: path.into(),
            reader: None,
            subtask: 0,
            parallelism: 1,
            state: LineOffset::default(),
            buf: Vec::new(),
        }
    }
}

impl Clone for LineFileSource {
    /// A fresh, unopened reader of the same file.
    fn clone(&self) -> Self {
        LineFileSource::new(self.path.clone())
    }
}

impl Source for LineFileSource {
    type Item = String;
    type Offset = LineOffset;

    fn open(&mut self, subtask: u32, parallelism: u32, restored: Option<LineOffset>) -> Result<(), String> {
        let mut f = File::open(&self.path).map_err(|e| format!("cannot open {}: {e}", self.path.display()))?;
        let state = restored.unwrap_or_default();
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        if state.byte > len {
            return Err(format!(
                "{} is {len} bytes but the checkpoint resumes at byte {}: the input changed since the checkpoint",
                self.path.display(),
                state.byte
            ));
        }
        f.seek(SeekFrom::Start(state.byte)).map_err(|e| e.to_string())?;
        self.reader = Some(BufReader::with_capacity(1 << 16, f));
        self.subtask = subtask;
        self.parallelism = parallelism;
        self.state = state;
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<String>, max: usize) -> Result<SourceStatus, String> {
        let reader = self.reader.as_mut().expect("poll before open");
        let mut produced = 0;
        while produced < max {
            self.buf.clear();
            let n = std::io::Read::take(&mut *reader, MAX_LINE_BYTES + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| format!("reading {}: {e}", self.path.display()))?;
            if n as u64 > MAX_LINE_BYTES {
                return Err(format!(
                    "line {} of {} is longer than {MAX_LINE_BYTES} bytes: lines are read whole; split the input",
                    self.state.line + 1,
                    self.path.display()
                ));
            }
            if n == 0 {
                return Ok(if produced > 0 { SourceStatus::More } else { SourceStatus::Finished });
            }
            let line_no = self.state.line;
            self.state.byte += n as u64;
            self.state.line += 1;
            if line_no % self.parallelism as u64 != self.subtask as u64 {
                continue;
            }
            let mut line = &self.buf[..];
            if line.ends_with(b"\n") {
                line = &line[..line.len() - 1];
            }
            if line.ends_with(b"\r") {
                line = &line[..line.len() - 1];
            }
            out.push(String::from_utf8_lossy(line).into_owned());
            produced += 1;
        }
        Ok(SourceStatus::More)
    }

    fn offset(&self) -> LineOffset {
        self.state
    }
}

/// A deterministic generator: record `i` (for `i` in `0..count`, split across subtasks by `i % parallelism`)
/// is `f(i)`. Replayable by index. Used by benchmarks, tests and the simulation.
pub struct GeneratorSource<T> {
    count: u64,
    f: std::sync::Arc<dyn Fn(u64) -> T + Send + Sync>,
    next: u64,
    step: u64,
}

impl<T> GeneratorSource<T> {
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

    fn open(&mut self, subtask: u32, parallelism: u32, restored: Option<u64>) -> Result<(), String> {
        self.step = parallelism as u64;
        self.next = match restored {
            Some(n) => {
                if n % self.step != subtask as u64 % self.step && n < self.count {
                    return Err(format!("offset {n} does not belong to subtask {subtask} of {parallelism}"));
                }
                n
            }
            None => subtask as u64,
        };
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, String> {
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
