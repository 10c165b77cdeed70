//! The framed file format of every file cutline writes, and the versioned encoding of the records in
//! them. It owns the byte layout and its checks; it does no I/O and knows nothing of where files live.
//!
//! Layout (all integers little-endian):
//!
//! ```text
//! magic "CUTL" | version: u16 | kind: u16 | payload length: u64 | payload | crc32(all before): u32
//! ```
//!
//! The magic and the version are the frozen prefix of every version; what follows depends on the
//! version. Readers dispatch on it and keep a path for every version ever written.

use crate::error::StorageError;
pub use crate::kind::FileKind;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::Path;

/// The first four bytes of every cutline file.
pub const MAGIC: [u8; 4] = *b"CUTL";
/// The newest frame version this build writes and reads. It also reads every older one.
///
/// - 1: the first.
/// - 2: the frame layout of version 1; in the manifest, task handles list the files an incremental
///   snapshot builds on ([`TaskStateHandle::base`](crate::TaskStateHandle::base)). Every other
///   record, and every task state payload, kept its shape.
pub const FORMAT_VERSION: u16 = 2;

pub(crate) const V1_HEADER_LEN: usize = 16;
pub(crate) const CRC_LEN: usize = 4;
/// What errors about a buffer that did not come from a file name instead of a path.
const IN_MEMORY: &str = "<in-memory frame>";

/// Frames `payload` as a file of `kind` in the current [`FORMAT_VERSION`].
pub fn encode_frame(kind: FileKind, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(V1_HEADER_LEN + payload.len() + CRC_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(kind as u16).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The header of a task state frame of the current version with a payload of `payload_len` bytes.
pub(crate) fn task_state_header(payload_len: u64) -> [u8; V1_HEADER_LEN] {
    let mut h = [0u8; V1_HEADER_LEN];
    h[..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&(FileKind::TaskState as u16).to_le_bytes());
    h[8..].copy_from_slice(&payload_len.to_le_bytes());
    h
}

/// Checks a whole framed file and returns its payload. Errors name a placeholder path; the stores
/// report the real one.
pub fn decode_frame(bytes: &[u8], expected: FileKind) -> Result<&[u8], StorageError> {
    decode_frame_at(Path::new(IN_MEMORY), bytes, expected).map(|frame| frame.payload)
}

/// A checked frame: the version it was written in (payload decoders dispatch on it) and its payload.
pub(crate) struct Frame<'a> {
    pub version: u16,
    pub payload: &'a [u8],
}

pub(crate) fn decode_frame_at<'a>(path: &Path, bytes: &'a [u8], expected: FileKind) -> Result<Frame<'a>, StorageError> {
    let truncated = |needed: usize| StorageError::Truncated {
        path: path.to_path_buf(),
        expected: needed as u64,
        actual: bytes.len() as u64,
    };
    let Some(magic) = field::<4>(bytes, 0) else {
        return Err(if MAGIC.starts_with(bytes) {
            truncated(MAGIC.len() + 2)
        } else {
            StorageError::BadMagic { path: path.to_path_buf() }
        });
    };
    if magic != MAGIC {
        return Err(StorageError::BadMagic { path: path.to_path_buf() });
    }
    let Some(version) = field::<2>(bytes, 4) else {
        return Err(truncated(6));
    };
    match u16::from_le_bytes(version) {
        version @ (1 | 2) => decode_v1(path, bytes, expected, version),
        found if found > FORMAT_VERSION => {
            Err(StorageError::UnsupportedVersion { path: path.to_path_buf(), found, supported: FORMAT_VERSION })
        }
        found => Err(StorageError::Decode {
            path: path.to_path_buf(),
            reason: format!("format version {found} never existed"),
        }),
    }
}

/// Version 1 (and 2, which kept its layout): 16-byte header, payload, crc32 of header and payload.
/// Length and checksum are checked before the kind, so that a damaged kind field reads as corruption
/// rather than as a wrong file.
fn decode_v1<'a>(path: &Path, bytes: &'a [u8], expected: FileKind, version: u16) -> Result<Frame<'a>, StorageError> {
    let minimum = V1_HEADER_LEN + CRC_LEN;
    let truncated =
        || StorageError::Truncated { path: path.to_path_buf(), expected: minimum as u64, actual: bytes.len() as u64 };
    if bytes.len() < minimum {
        return Err(truncated());
    }
    let payload_len = u64::from_le_bytes(field(bytes, 8).ok_or_else(truncated)?);
    let total = payload_len.saturating_add(minimum as u64);
    if total > bytes.len() as u64 {
        return Err(StorageError::Truncated { path: path.to_path_buf(), expected: total, actual: bytes.len() as u64 });
    }
    if total < bytes.len() as u64 {
        return Err(StorageError::Decode {
            path: path.to_path_buf(),
            reason: format!("{} bytes follow the end of the frame", bytes.len() as u64 - total),
        });
    }
    let (body, recorded) = bytes.split_last_chunk::<CRC_LEN>().ok_or_else(truncated)?;
    let recorded = u32::from_le_bytes(*recorded);
    let actual = crc32fast::hash(body);
    if recorded != actual {
        return Err(StorageError::ChecksumMismatch { path: path.to_path_buf(), expected: recorded, actual });
    }
    let found = u16::from_le_bytes(field(bytes, 6).ok_or_else(truncated)?);
    if found != expected as u16 {
        return Err(StorageError::WrongKind { path: path.to_path_buf(), expected, found });
    }
    Ok(Frame { version, payload: body.get(V1_HEADER_LEN..).ok_or_else(truncated)? })
}

/// The `N` bytes at `at`, or `None` past the end. Every field of a frame is read through here (and
/// never by indexing), so that a length check gotten wrong reports a file as truncated instead of
/// panicking on its bytes.
fn field<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// Encodes a serde record with postcard and frames it.
pub(crate) fn encode_record<T: Serialize>(kind: FileKind, value: &T) -> Vec<u8> {
    // Our own records, into memory: postcard fails only on types it cannot represent, which these are not.
    let payload = postcard::to_allocvec(value).expect("storage records always serialize");
    encode_frame(kind, &payload)
}

/// Checks the frame and decodes its record, of a kind whose shape no version changed.
pub(crate) fn decode_record<T: DeserializeOwned>(path: &Path, bytes: &[u8], kind: FileKind) -> Result<T, StorageError> {
    decode_versioned::<T, T>(path, bytes, kind)
}

/// Checks the frame and decodes its record: as `T` in the current version, as `V1` (converted) in
/// version 1. Each frame version has its own arm: when a version changes a record, the older arms
/// keep decoding the old shape and convert it.
pub(crate) fn decode_versioned<T: DeserializeOwned, V1: DeserializeOwned + Into<T>>(
    path: &Path,
    bytes: &[u8],
    kind: FileKind,
) -> Result<T, StorageError> {
    let frame = decode_frame_at(path, bytes, kind)?;
    match frame.version {
        1 => decode_payload::<V1>(path, frame.payload).map(Into::into),
        2 => decode_payload::<T>(path, frame.payload),
        // `decode_frame_at` returns only versions with an arm here; a version added there without one
        // is reported, not a panic.
        found => Err(StorageError::UnsupportedVersion { path: path.to_path_buf(), found, supported: FORMAT_VERSION }),
    }
}

fn decode_payload<T: DeserializeOwned>(path: &Path, payload: &[u8]) -> Result<T, StorageError> {
    let (value, rest) = postcard::take_from_bytes(payload)
        .map_err(|e| StorageError::Decode { path: path.to_path_buf(), reason: e.to_string() })?;
    if !rest.is_empty() {
        return Err(StorageError::Decode {
            path: path.to_path_buf(),
            reason: format!("{} bytes follow the record", rest.len()),
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [FileKind; 6] = [
        FileKind::TaskState,
        FileKind::Manifest,
        FileKind::JobMeta,
        FileKind::Finished,
        FileKind::GenerationRecord,
        FileKind::CheckpointStats,
    ];

    /// Re-stamps a frame's version field and fixes its checksum, as a newer writer would.
    fn with_version(mut frame: Vec<u8>, version: u16) -> Vec<u8> {
        frame[4..6].copy_from_slice(&version.to_le_bytes());
        let end = frame.len() - 4;
        let crc = crc32fast::hash(&frame[..end]);
        frame[end..].copy_from_slice(&crc.to_le_bytes());
        frame
    }

    #[test]
    fn frame_roundtrips_every_kind_and_size() {
        for kind in KINDS {
            for len in [0usize, 1, 7, 100, 70_000] {
                let payload: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
                let frame = encode_frame(kind, &payload);
                assert_eq!(frame.len(), payload.len() + 20);
                assert_eq!(decode_frame(&frame, kind).unwrap(), &payload[..]);
            }
        }
    }

    #[test]
    fn frame_layout_is_pinned() {
        let frame = encode_frame(FileKind::Manifest, b"hi");
        let mut expected = b"CUTL".to_vec();
        expected.extend_from_slice(&[2, 0, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0, b'h', b'i']);
        expected.extend_from_slice(&crc32fast::hash(&expected).to_le_bytes());
        assert_eq!(frame, expected);
        // The kind numbers are on disk: never renumber them.
        let numbers: Vec<u16> = KINDS.iter().map(|k| *k as u16).collect();
        assert_eq!(numbers, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn every_single_byte_flip_is_detected() {
        let frame = encode_frame(FileKind::TaskState, b"12345678");
        for pos in 0..frame.len() {
            for mask in [0x01u8, 0x80, 0xFF] {
                let mut bad = frame.clone();
                bad[pos] ^= mask;
                assert!(
                    decode_frame(&bad, FileKind::TaskState).is_err(),
                    "flip {mask:#x} at byte {pos} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn payload_flip_is_a_checksum_mismatch() {
        let mut frame = encode_frame(FileKind::JobMeta, b"payload");
        frame[18] ^= 0x10;
        assert!(matches!(decode_frame(&frame, FileKind::JobMeta), Err(StorageError::ChecksumMismatch { .. })));
    }

    #[test]
    fn every_truncation_is_detected_as_truncated() {
        let frame = encode_frame(FileKind::Finished, b"abcdef");
        for len in 0..frame.len() {
            let err = decode_frame(&frame[..len], FileKind::Finished).unwrap_err();
            assert!(matches!(err, StorageError::Truncated { .. }), "len {len}: {err}");
        }
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut frame = encode_frame(FileKind::Finished, b"abc");
        frame.push(0);
        assert!(matches!(decode_frame(&frame, FileKind::Finished), Err(StorageError::Decode { .. })));
    }

    #[test]
    fn future_version_is_rejected_as_unsupported() {
        for version in [3u16, 7, u16::MAX] {
            let frame = with_version(encode_frame(FileKind::Manifest, b"x"), version);
            let err = decode_frame(&frame, FileKind::Manifest).unwrap_err();
            assert!(matches!(err, StorageError::UnsupportedVersion { found, supported: 2, .. } if found == version));
            assert!(err.to_string().contains("upgrade cutline"), "{err}");
        }
        let zero = with_version(encode_frame(FileKind::Manifest, b"x"), 0);
        assert!(matches!(decode_frame(&zero, FileKind::Manifest), Err(StorageError::Decode { .. })));
    }

    #[test]
    fn version_1_frames_still_read() {
        let frame = with_version(encode_frame(FileKind::TaskState, b"old"), 1);
        assert_eq!(decode_frame(&frame, FileKind::TaskState).unwrap(), b"old");
    }

    #[test]
    fn wrong_kind_and_bad_magic_have_their_own_errors() {
        let frame = encode_frame(FileKind::TaskState, b"x");
        for kind in KINDS.into_iter().filter(|k| *k != FileKind::TaskState) {
            assert!(matches!(
                decode_frame(&frame, kind),
                Err(StorageError::WrongKind { found: 1, expected, .. }) if expected == kind
            ));
        }
        for bad in [&b"CUTX"[..], b"xyz", b"PK\x03\x04 not ours at all"] {
            assert!(matches!(decode_frame(bad, FileKind::TaskState), Err(StorageError::BadMagic { .. })));
        }
    }

    #[test]
    fn records_roundtrip_and_reject_trailing_payload() {
        let path = Path::new("x");
        let frame = encode_record(FileKind::Finished, &(42u64, String::from("s")));
        let back: (u64, String) = decode_record(path, &frame, FileKind::Finished).unwrap();
        assert_eq!(back, (42, "s".to_string()));
        let frame = encode_record(FileKind::Finished, &(1u8, 2u8));
        assert!(matches!(decode_record::<u8>(path, &frame, FileKind::Finished), Err(StorageError::Decode { .. })));
    }
}
