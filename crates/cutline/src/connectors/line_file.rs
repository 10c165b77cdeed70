//! [`LineFileSource`]: the lines of a text file, split across subtasks by line number and replayable
//! by byte offset.
//!
//! The input must not change while the job has checkpoints. The source notices when it does: at the
//! end of the file it checks that the file it read is still the one at its path, no shorter than it
//! was when opened nor than what was read, and still holds the last line it read; a restore checks the length and that line (its
//! start and checksum are part of the offset). Either is a permanent failure: restarting would read
//! another input.
//!
//! Memory per subtask is bounded by the line limit: a line is read whole into one buffer, which
//! becomes the record (no second copy) when the line is long, and a poll stops once its lines hold
//! [`MAX_BATCH_BYTES`], so a batch of long lines is one line, not a batch's worth of them.

use super::interleave::{prune, read_before, rescaled, ReadBefore};
use super::source::{Source, SourceStatus};
use crate::error::{ConnectorError, ConnectorResult};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

/// The default longest line a [`LineFileSource`] reads, newline included (lines are read whole, and a
/// barrier goes between lines); see [`LineFileSource::with_max_line_bytes`]. A longer line is a
/// permanent failure that names the line.
pub const MAX_LINE_BYTES: u64 = 16 << 20;

/// A poll returns once the lines it produced hold this many bytes (or it produced the batch size).
pub const MAX_BATCH_BYTES: usize = 1 << 20;

/// Lines up to this long are copied out of the reused read buffer; a longer line takes the buffer
/// itself as its record, and the next line starts a new one.
const COPIED_LINE_BYTES: usize = 64 << 10;

/// The file reader's buffer.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// Lines of a text file, split across subtasks by line number (`line % parallelism == subtask`);
/// replayable by byte offset. Lines are read as UTF-8 (invalid bytes replaced).
pub struct LineFileSource {
    path: PathBuf,
    reader: Option<BufReader<File>>,
    /// (device, inode) and length of the file opened.
    opened: (u64, u64),
    opened_len: u64,
    subtask: u32,
    parallelism: u32,
    state: LineOffset,
    buf: Vec<u8>,
    max_line_bytes: u64,
}

/// Position in a [`LineFileSource`]: byte offset and number of the next line, and what identifies
/// the line before it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LineOffset {
    /// Byte offset in the file where the next line starts.
    pub byte: u64,
    /// Number of the next line, from 0 (over the whole file, not only this subtask's lines).
    pub line: u64,
    /// The last line read (`None` at the start, and in offsets of checkpoints taken before cutline
    /// recorded it): a restore checks the input still holds it.
    pub last_line: Option<LineCheck>,
    /// Lines at or after [`LineOffset::line`] that subtasks of an earlier parallelism already read
    /// (after a rescale, until this subtask reads past them; empty otherwise).
    pub read_before: Vec<ReadBefore>,
}

/// Where the last line read starts and the CRC-32 of its bytes up to [`LineOffset::byte`] (newline
/// included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineCheck {
    pub start: u64,
    pub crc32: u32,
}

impl LineFileSource {
    /// The lines of the file at `path`, at most [`MAX_LINE_BYTES`] each. Nothing is opened yet: each
    /// task opens the file in `open`, and a file that cannot be opened fails the task (a transient
    /// failure: the job restarts under its strategy).
    pub fn new(path: impl Into<PathBuf>) -> LineFileSource {
        LineFileSource {
            path: path.into(),
            reader: None,
            opened: (0, 0),
            opened_len: 0,
            subtask: 0,
            parallelism: 1,
            state: LineOffset::default(),
            buf: Vec::new(),
            max_line_bytes: MAX_LINE_BYTES,
        }
    }

    /// Refuse lines longer than `bytes` (newline included; at least 1) instead of [`MAX_LINE_BYTES`].
    /// A subtask holds up to about this much memory per line it reads, and operators downstream
    /// hold what they make of it.
    pub fn with_max_line_bytes(mut self, bytes: u64) -> LineFileSource {
        self.max_line_bytes = bytes.max(1);
        self
    }

    fn changed(&self, what: String) -> ConnectorError {
        ConnectorError::permanent(format!(
            "{}: the input changed while the job has checkpoints ({what}); the job reads the file by byte offset, so restore the original input, or start the job on a fresh state directory (and output)",
            self.path.display()
        ))
    }

    /// At the end of the file: is the file at the path still the one read, no shorter than what was
    /// read, and does it still hold the last line read?
    fn check_unchanged_at_end(&self) -> ConnectorResult<()> {
        let file = self.reader.as_ref().expect("opened").get_ref();
        let len = file.metadata().map_err(|e| format!("reading {}: {e}", self.path.display()))?.len();
        if len < self.state.byte.max(self.opened_len) {
            return Err(self.changed(format!(
                "it was truncated to {len} bytes while the job read it (it had {} bytes, {} were read)",
                self.opened_len, self.state.byte
            )));
        }
        match std::fs::metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) != self.opened => {
                return Err(self.changed("it was replaced by another file while the job read it".into()))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.changed("it was removed while the job read it".into()))
            }
            Err(e) => return Err(format!("checking {}: {e}", self.path.display()).into()),
        }
        self.check_last_line(file, &self.state)
    }

    /// Does `file` still hold the last line `at` records?
    fn check_last_line(&self, file: &File, at: &LineOffset) -> ConnectorResult<()> {
        let Some(check) = at.last_line else { return Ok(()) };
        if check.start > at.byte {
            return Err(ConnectorError::permanent(format!(
                "the offset of {} is damaged: its last line starts at byte {}, after the offset {}",
                self.path.display(),
                check.start,
                at.byte
            )));
        }
        let mut crc = crc32fast::Hasher::new();
        let mut chunk = vec![0u8; READ_BUFFER_BYTES];
        let mut pos = check.start;
        while pos < at.byte {
            let n = (at.byte - pos).min(chunk.len() as u64) as usize;
            file.read_exact_at(&mut chunk[..n], pos).map_err(|e| format!("reading {}: {e}", self.path.display()))?;
            crc.update(&chunk[..n]);
            pos += n as u64;
        }
        if crc.finalize() != check.crc32 {
            return Err(self.changed(format!(
                "line {} (bytes {} to {}) is not the line the job read there",
                at.line, check.start, at.byte
            )));
        }
        Ok(())
    }
}

impl Clone for LineFileSource {
    /// A fresh, unopened reader of the same file, with the same line limit.
    fn clone(&self) -> Self {
        LineFileSource::new(self.path.clone()).with_max_line_bytes(self.max_line_bytes)
    }
}

impl Source for LineFileSource {
    type Item = String;
    type Offset = LineOffset;

    fn open(&mut self, subtask: u32, parallelism: u32, restored: Option<LineOffset>) -> ConnectorResult<()> {
        let mut f = File::open(&self.path).map_err(|e| format!("cannot open {}: {e}", self.path.display()))?;
        let state = restored.unwrap_or_default();
        let meta = f.metadata().map_err(|e| format!("reading {}: {e}", self.path.display()))?;
        if state.byte > meta.len() {
            return Err(self.changed(format!(
                "it is {} bytes, and the checkpoint resumes at byte {}",
                meta.len(),
                state.byte
            )));
        }
        self.check_last_line(&f, &state)?;
        f.seek(SeekFrom::Start(state.byte)).map_err(|e| format!("reading {}: {e}", self.path.display()))?;
        self.reader = Some(BufReader::with_capacity(READ_BUFFER_BYTES, f));
        self.opened = (meta.dev(), meta.ino());
        self.opened_len = meta.len();
        self.subtask = subtask;
        self.parallelism = parallelism;
        self.state = state;
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<String>, max: usize) -> ConnectorResult<SourceStatus> {
        let limit = self.max_line_bytes;
        let mut produced = 0;
        let mut bytes = 0;
        while produced < max && bytes < MAX_BATCH_BYTES {
            self.buf.clear();
            let reader = self.reader.as_mut().expect("poll before open");
            let n = Read::take(&mut *reader, limit + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| format!("reading {}: {e}", self.path.display()))?;
            if n as u64 > limit {
                return Err(ConnectorError::permanent(format!(
                    "line {} of {} is longer than {limit} bytes, the source's line limit (lines are read whole): split the line, or raise the limit (LineFileSource::with_max_line_bytes)",
                    self.state.line + 1,
                    self.path.display()
                )));
            }
            if n == 0 {
                self.check_unchanged_at_end()?;
                return Ok(if produced > 0 { SourceStatus::More } else { SourceStatus::Finished });
            }
            let line_no = self.state.line;
            self.state.last_line = Some(LineCheck { start: self.state.byte, crc32: crc32fast::hash(&self.buf) });
            self.state.byte += n as u64;
            self.state.line += 1;
            if line_no % self.parallelism as u64 != self.subtask as u64
                || (!self.state.read_before.is_empty() && read_before(&self.state.read_before, line_no))
            {
                if self.buf.capacity() > COPIED_LINE_BYTES {
                    self.buf = Vec::new(); // do not keep a long line's buffer for the short ones
                }
                continue;
            }
            let mut len = self.buf.len();
            if self.buf[..len].ends_with(b"\n") {
                len -= 1;
            }
            if self.buf[..len].ends_with(b"\r") {
                len -= 1;
            }
            let line = if len > COPIED_LINE_BYTES {
                // The buffer becomes the record; the next line gets a new one.
                let mut owned = std::mem::take(&mut self.buf);
                owned.truncate(len);
                String::from_utf8(owned).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
            } else {
                String::from_utf8_lossy(&self.buf[..len]).into_owned()
            };
            bytes += len;
            out.push(line);
            produced += 1;
        }
        if !self.state.read_before.is_empty() {
            prune(&mut self.state.read_before, self.state.line);
        }
        Ok(SourceStatus::More)
    }

    fn offset(&self) -> LineOffset {
        self.state.clone()
    }

    /// Every new subtask resumes where the old subtask that read least stands, skipping the lines
    /// the others read beyond it (see [`ReadBefore`]).
    fn rescale(old: Vec<LineOffset>, subtask: u32, parallelism: u32) -> ConnectorResult<Option<LineOffset>> {
        let _ = (subtask, parallelism); // every subtask reads the whole file and keeps its own lines
        let mut by_line: Vec<&LineOffset> = old.iter().collect();
        by_line.sort_by_key(|o| o.line);
        if by_line.windows(2).any(|w| w[0].byte > w[1].byte) {
            return Err(ConnectorError::permanent(
                "the checkpoint is damaged: its subtasks' offsets are not positions in one file (a later line at an earlier byte)",
            ));
        }
        let positions: Vec<u64> = old.iter().map(|o| o.line).collect();
        let layers: Vec<&[ReadBefore]> = old.iter().map(|o| &o.read_before[..]).collect();
        let (_, read_before) = rescaled(&positions, &layers).map_err(ConnectorError::permanent)?;
        let lowest = by_line.first().expect("rescaled refuses no offsets");
        Ok(Some(LineOffset { byte: lowest.byte, line: lowest.line, last_line: lowest.last_line, read_before }))
    }
}

/// Offsets decode from checkpoints of every cutline version: those before [`LineOffset::last_line`]
/// existed end after `line` (postcard has no field names, so the field is read only if present).
impl<'de> Deserialize<'de> for LineOffset {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<LineOffset, D::Error> {
        struct OffsetVisitor;
        impl<'de> Visitor<'de> for OffsetVisitor {
            type Value = LineOffset;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a line offset")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LineOffset, A::Error> {
                let byte = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let line = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(1, &self))?;
                // An offset of an older version ends here: postcard reports the end of its input.
                let last_line = seq.next_element::<Option<LineCheck>>().ok().flatten().flatten();
                // Those before rescaling existed end here.
                let read_before = seq.next_element::<Vec<ReadBefore>>().ok().flatten().unwrap_or_default();
                Ok(LineOffset { byte, line, last_line, read_before })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LineOffset, A::Error> {
                let (mut byte, mut line, mut last_line, mut read_before) = (None, None, None, Vec::new());
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "byte" => byte = Some(map.next_value()?),
                        "line" => line = Some(map.next_value()?),
                        "last_line" => last_line = map.next_value()?,
                        "read_before" => read_before = map.next_value()?,
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                let byte = byte.ok_or_else(|| de::Error::missing_field("byte"))?;
                let line = line.ok_or_else(|| de::Error::missing_field("line"))?;
                Ok(LineOffset { byte, line, last_line, read_before })
            }
        }
        d.deserialize_struct("LineOffset", &["byte", "line", "last_line", "read_before"], OffsetVisitor)
    }
}

#[cfg(test)]
mod tests;
