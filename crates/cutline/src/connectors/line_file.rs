//! [`LineFileSource`]: the lines of a text file, split across subtasks by line number and replayable
//! by byte offset.

use super::source::{Source, SourceStatus};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::PathBuf;

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
