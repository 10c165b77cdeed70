//! [`TaskStateFrame`]: a task state file, framed, built in memory around its payload as the payload
//! is written, or in a local scratch file instead ([`TaskStateFrame::spool`]), so that a whole
//! snapshot of state larger than memory is written to the checkpoint store without ever being held
//! whole. The layout is [`format`](crate::format)'s; a spooled frame's length and checksum are
//! computed as the payload streams past, and the header's length is patched in at the end.
//!
//! **Invariant:** a spooled frame's file is complete (header with its length, payload, checksum)
//! before the frame exists, it is only read after, and it is removed when the frame is dropped.

use crate::error::StorageError;
use crate::format::{encode_frame, task_state_header, FileKind, CRC_LEN, MAGIC, V1_HEADER_LEN};
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// A task state file, framed: what [`CheckpointStore::write_task_frame`](crate::CheckpointStore::write_task_frame)
/// writes as it is. Built around its payload in one buffer, so that a large state is not held once
/// as a payload and again as a file, or built in a local file ([`TaskStateFrame::spool`]) so that it
/// is not held in memory at all.
pub struct TaskStateFrame(pub(crate) FrameBody);

/// Where a [`TaskStateFrame`]'s bytes are.
pub(crate) enum FrameBody {
    Memory(Vec<u8>),
    /// A complete frame in a local scratch file (see [`TaskStateFrame::spool`]).
    Spooled(Spool),
}

impl TaskStateFrame {
    /// The frame of `payload` (a copy of it).
    pub fn new(payload: &[u8]) -> Self {
        TaskStateFrame(FrameBody::Memory(encode_frame(FileKind::TaskState, payload)))
    }

    /// The frame of what `fill` appends to the buffer it is given (room reserved for
    /// `payload_capacity` bytes), which it must return.
    pub fn build<E>(payload_capacity: usize, fill: impl FnOnce(Vec<u8>) -> Result<Vec<u8>, E>) -> Result<Self, E> {
        let mut out = Vec::with_capacity(V1_HEADER_LEN + payload_capacity + CRC_LEN);
        out.extend_from_slice(&task_state_header(0));
        let mut out = fill(out)?;
        // Invariant: `fill` appends; the header it was given is still there.
        assert!(out.len() >= V1_HEADER_LEN && out.starts_with(&MAGIC), "a task state frame's header was cut");
        let payload_len = (out.len() - V1_HEADER_LEN) as u64;
        out[..V1_HEADER_LEN].copy_from_slice(&task_state_header(payload_len));
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(TaskStateFrame(FrameBody::Memory(out)))
    }

    /// The file's bytes, if the frame is in memory (`None` if it is spooled).
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            FrameBody::Memory(b) => Some(b),
            FrameBody::Spooled(_) => None,
        }
    }

    /// The file's length in bytes.
    pub fn len_bytes(&self) -> u64 {
        match &self.0 {
            FrameBody::Memory(b) => b.len() as u64,
            FrameBody::Spooled(s) => s.len,
        }
    }

    /// Whether the frame is built in a local file rather than in memory.
    pub fn is_spooled(&self) -> bool {
        matches!(self.0, FrameBody::Spooled(_))
    }

    /// The CRC32 of everything but the trailing checksum: the checksum itself.
    pub(crate) fn content_crc(&self) -> u32 {
        match &self.0 {
            FrameBody::Memory(b) => crc32fast::hash(&b[..b.len().saturating_sub(CRC_LEN)]),
            FrameBody::Spooled(s) => s.crc,
        }
    }
}

/// Bytes buffered between the payload's encoder and the spool file.
pub const SPOOL_BUFFER_BYTES: usize = 1 << 20;

/// A complete task state frame in a scratch file, removed on drop.
pub(crate) struct Spool {
    pub file: File,
    pub path: PathBuf,
    /// The whole file's length, header and checksum included.
    pub len: u64,
    /// The checksum at the file's end (of everything before it).
    pub crc: u32,
}

impl Spool {
    /// A reader of the whole frame from its first byte.
    pub fn reader(&self) -> Result<impl Read + '_, StorageError> {
        let mut f = &self.file;
        f.seek(SeekFrom::Start(0)).map_err(|e| StorageError::io(&self.path, "seek", e))?;
        Ok(io::BufReader::with_capacity(SPOOL_BUFFER_BYTES, f))
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Counts and checksums what passes to the file.
struct Summing {
    file: File,
    crc: crc32fast::Hasher,
    len: u64,
}

impl Write for Summing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.crc.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl TaskStateFrame {
    /// The frame of what `fill` writes, built in a new file at `path` (which must not exist; it is
    /// removed again when the frame is dropped, or at once if building it fails). Memory held: a
    /// buffer of [`SPOOL_BUFFER_BYTES`], whatever `fill` holds.
    pub fn spool(path: &Path, fill: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<Self, StorageError> {
        let io_err = |op| move |e| StorageError::io(path, op, e);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path).map_err(io_err("create"))?;
        // From here on the file is removed whatever happens.
        let mut spool = Spool { file, path: path.to_path_buf(), len: 0, crc: 0 };
        let mut file = &spool.file;
        file.write_all(&[0u8; V1_HEADER_LEN]).map_err(io_err("write"))?;
        let summing =
            Summing { file: spool.file.try_clone().map_err(io_err("open"))?, crc: crc32fast::Hasher::new(), len: 0 };
        let mut out = BufWriter::with_capacity(SPOOL_BUFFER_BYTES, summing);
        fill(&mut out).map_err(io_err("write"))?;
        let payload = out.into_inner().map_err(|e| StorageError::io(path, "write", e.into_error()))?;
        let header = task_state_header(payload.len);
        // The checksum of the header followed by the payload, from the payload's.
        let mut crc = crc32fast::Hasher::new();
        crc.update(&header);
        crc.combine(&payload.crc);
        let crc = crc.finalize();
        file.write_all(&crc.to_le_bytes()).map_err(io_err("write"))?;
        file.seek(SeekFrom::Start(0)).map_err(io_err("seek"))?;
        file.write_all(&header).map_err(io_err("write"))?;
        spool.len = (V1_HEADER_LEN + CRC_LEN) as u64 + payload.len;
        spool.crc = crc;
        Ok(TaskStateFrame(FrameBody::Spooled(spool)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::decode_frame;

    fn spooled_bytes(frame: &TaskStateFrame) -> Vec<u8> {
        let FrameBody::Spooled(s) = &frame.0 else { panic!("spooled") };
        let mut out = Vec::new();
        s.reader().unwrap().read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn a_task_state_frame_built_around_its_payload_is_the_frame_of_that_payload() {
        for (len, capacity) in [(0usize, 0usize), (1, 0), (100, 100), (70_000, 10), (70_000, 1 << 20)] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let built = TaskStateFrame::build(capacity, |mut buf| {
                buf.extend_from_slice(&payload);
                Ok::<_, ()>(buf)
            })
            .unwrap();
            assert_eq!(
                built.bytes().unwrap(),
                encode_frame(FileKind::TaskState, &payload),
                "{len} bytes, {capacity} reserved"
            );
            assert_eq!(TaskStateFrame::new(&payload).bytes(), built.bytes());
        }
    }

    #[test]
    fn a_spooled_frame_is_the_frame_of_its_payload_and_its_file_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 17, SPOOL_BUFFER_BYTES - 1, SPOOL_BUFFER_BYTES * 3 + 5] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let path = dir.path().join(format!("f{len}.spool"));
            // Written in pieces of several sizes, as an encoder does.
            let frame = TaskStateFrame::spool(&path, |w| {
                for chunk in payload.chunks(1 + len / 3) {
                    w.write_all(chunk)?;
                }
                Ok(())
            })
            .unwrap();
            let expected = TaskStateFrame::new(&payload);
            let bytes = spooled_bytes(&frame);
            assert_eq!(&bytes[..], expected.bytes().unwrap(), "{len} bytes");
            assert_eq!(
                (frame.len_bytes(), frame.content_crc()),
                (expected.len_bytes(), expected.content_crc()),
                "{len} bytes"
            );
            assert_eq!(decode_frame(&bytes, FileKind::TaskState).unwrap(), &payload[..]);
            assert!(path.exists());
            drop(frame);
            assert!(!path.exists(), "the spool file is removed with its frame");
        }
    }

    #[test]
    fn a_spool_that_fails_to_fill_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("failed.spool");
        let err = TaskStateFrame::spool(&path, |w| {
            w.write_all(b"some")?;
            Err(io::Error::other("the encoder failed"))
        })
        .err()
        .expect("an error");
        assert!(err.to_string().contains("the encoder failed"), "{err}");
        assert!(!path.exists());
        assert!(TaskStateFrame::spool(&dir.path().join("no-such-dir/x"), |_| Ok(())).is_err());
    }
}
