//! Plain frames: the 12-byte header (`b"CUTL"`, protocol version u16 BE, kind u8, reserved u8 = 0,
//! payload length u32 BE) and the payload. The reader validates the whole header before it allocates
//! anything, grows the payload buffer only as bytes actually arrive, and never panics on any input.
//!
//! It does not protect anything: sealing a frame's payload (and authenticating its header) is
//! [`super::seal`]'s, which uses these functions for the bytes on the wire.

use super::{WireError, HEADER_BYTES, PROTOCOL_VERSION};
use std::io::{self, ErrorKind, Read, Write};

pub(super) const MAGIC: [u8; 4] = *b"CUTL";
/// The payload buffer grows by at most this much before the bytes to fill it have arrived, so a peer that
/// announces a large frame and sends nothing does not make us allocate the whole frame.
pub(super) const READ_CHUNK_BYTES: usize = 1 << 20;

/// The 12-byte header of a frame of `kind` with a payload of `len` bytes.
pub(super) fn header(kind: u8, len: u32) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    h[6] = kind;
    h[7] = 0;
    h[8..12].copy_from_slice(&len.to_be_bytes());
    h
}

fn payload_len(payload: &[u8]) -> Result<u32, WireError> {
    u32::try_from(payload.len()).map_err(|_| WireError::TooLarge { len: u32::MAX, max: u32::MAX })
}

/// Writes one frame (header, then payload) without flushing. Fails with `TooLarge` if the payload is
/// longer than `u32::MAX` bytes.
pub(crate) fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> Result<(), WireError> {
    let len = payload_len(payload)?;
    w.write_all(&header(kind, len))?;
    if !payload.is_empty() {
        w.write_all(payload)?;
    }
    Ok(())
}

/// Reads until `buf` is full or the stream ends; returns how many bytes were read. Retries `Interrupted`.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Reads one frame into `payload` (cleared, then filled; reuse it across calls) and returns its kind.
///
/// The header is validated (magic, version, reserved byte, length against `max_frame_bytes`) before
/// anything is allocated. A clean end of stream before the first header byte is `Closed`; an end of
/// stream anywhere else in the frame is `Truncated`.
pub(crate) fn read_frame(r: &mut impl Read, max_frame_bytes: u32, payload: &mut Vec<u8>) -> Result<u8, WireError> {
    payload.clear();
    let mut h = [0u8; HEADER_BYTES];
    let got = read_full(r, &mut h)?;
    if got == 0 {
        return Err(WireError::Closed);
    }
    if got < HEADER_BYTES {
        return Err(WireError::Truncated { expected: HEADER_BYTES, got });
    }
    let magic = [h[0], h[1], h[2], h[3]];
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = u16::from_be_bytes([h[4], h[5]]);
    if version != PROTOCOL_VERSION {
        return Err(WireError::Version { got: version, supported: PROTOCOL_VERSION });
    }
    let kind = h[6];
    if h[7] != 0 {
        return Err(WireError::Reserved(h[7]));
    }
    let len32 = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
    if len32 > max_frame_bytes {
        return Err(WireError::TooLarge { len: len32, max: max_frame_bytes });
    }
    // Lossless: usize is at least 32 bits on every platform cutline builds for.
    let len = len32 as usize;
    let mut filled = 0;
    while filled < len {
        let target = filled + (len - filled).min(READ_CHUNK_BYTES);
        if payload.capacity() < target {
            // Double (amortized growth) but never beyond the announced length.
            let new_cap = payload.capacity().saturating_mul(2).max(target).min(len);
            payload.reserve_exact(new_cap - payload.len());
        }
        payload.resize(target, 0);
        let n = read_full(r, &mut payload[filled..target])?;
        filled += n;
        if filled < target {
            payload.truncate(filled);
            return Err(WireError::Truncated { expected: HEADER_BYTES + len, got: HEADER_BYTES + filled });
        }
    }
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::wire::DEFAULT_MAX_FRAME_BYTES;
    use std::io::Cursor;

    fn frame_bytes(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, kind, payload).unwrap();
        out
    }

    fn read_one(bytes: &[u8], max: u32) -> Result<(u8, Vec<u8>), WireError> {
        let mut payload = Vec::new();
        let kind = read_frame(&mut Cursor::new(bytes), max, &mut payload)?;
        Ok((kind, payload))
    }

    /// xorshift64: deterministic, no dependency.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn frames_round_trip_through_a_buffer() {
        let big: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 31 % 251) as u8).collect();
        let cases: Vec<(u8, Vec<u8>)> = vec![(0, vec![]), (1, vec![0xab]), (200, big.clone()), (7, vec![1, 2, 3])];
        let mut wire = Vec::new();
        for (kind, payload) in cases.iter() {
            write_frame(&mut wire, *kind, payload).unwrap();
        }
        let v = PROTOCOL_VERSION.to_be_bytes();
        assert_eq!(&wire[..HEADER_BYTES], &[b'C', b'U', b'T', b'L', v[0], v[1], 0, 0, 0, 0, 0, 0]);
        let expected_len: usize = cases.iter().map(|(_, p)| HEADER_BYTES + p.len()).sum();
        assert_eq!(wire.len(), expected_len);

        let mut r = Cursor::new(wire);
        let mut payload = Vec::new();
        for (kind, expected) in &cases {
            let got = read_frame(&mut r, DEFAULT_MAX_FRAME_BYTES, &mut payload).unwrap();
            assert_eq!(got, *kind);
            assert_eq!(&payload, expected);
        }
        let end = read_frame(&mut r, DEFAULT_MAX_FRAME_BYTES, &mut payload).unwrap_err();
        assert!(matches!(end, WireError::Closed), "{end:?}");
        assert!(end.is_closed());
        assert!(payload.is_empty());
    }

    /// A reader that hands out one byte per call and is interrupted between bytes.
    struct Trickle {
        data: Vec<u8>,
        pos: usize,
        interrupt: bool,
    }
    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.interrupt = !self.interrupt;
            if self.interrupt {
                return Err(io::Error::new(ErrorKind::Interrupted, "signal"));
            }
            if self.pos == self.data.len() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.data[self.pos];
            self.pos += 1;
            Ok(1)
        }
    }

    #[test]
    fn short_reads_and_interruptions_are_retried() {
        let mut data = frame_bytes(9, b"hello, world");
        data.extend(frame_bytes(10, b""));
        let mut r = Trickle { data, pos: 0, interrupt: false };
        let mut payload = Vec::new();
        assert_eq!(read_frame(&mut r, 1024, &mut payload).unwrap(), 9);
        assert_eq!(payload, b"hello, world");
        assert_eq!(read_frame(&mut r, 1024, &mut payload).unwrap(), 10);
        assert!(payload.is_empty());
        assert!(matches!(read_frame(&mut r, 1024, &mut payload), Err(WireError::Closed)));
    }

    #[test]
    fn oversized_length_is_refused_before_allocating() {
        let mut h = header(3, u32::MAX).to_vec();
        h.extend_from_slice(&[0; 16]);
        let mut payload = Vec::new();
        let err = read_frame(&mut Cursor::new(&h), 1 << 20, &mut payload).unwrap_err();
        assert!(matches!(err, WireError::TooLarge { len: u32::MAX, max } if max == 1 << 20), "{err:?}");
        assert!(payload.capacity() < 1024, "allocated {} bytes", payload.capacity());
        let text = err.to_string();
        assert!(text.contains("max_frame_bytes") && text.contains("raise"), "{text}");

        // The limit is inclusive.
        let exact = frame_bytes(1, &[5; 100]);
        assert_eq!(read_one(&exact, 100).unwrap().1.len(), 100);
        assert!(matches!(read_one(&exact, 99), Err(WireError::TooLarge { len: 100, max: 99 })));
    }

    #[test]
    fn a_large_announced_frame_grows_the_buffer_only_as_bytes_arrive() {
        // Within the limit, but only 10 bytes follow: the buffer must not jump to 64 MiB.
        let mut bytes = header(1, 64 << 20).to_vec();
        bytes.extend_from_slice(&[7; 10]);
        let mut payload = Vec::new();
        let err = read_frame(&mut Cursor::new(&bytes), DEFAULT_MAX_FRAME_BYTES, &mut payload).unwrap_err();
        assert!(
            matches!(err, WireError::Truncated { expected, got } if expected == HEADER_BYTES + (64 << 20) && got == HEADER_BYTES + 10),
            "{err:?}"
        );
        assert!(payload.capacity() <= READ_CHUNK_BYTES, "allocated {} bytes", payload.capacity());
    }

    #[test]
    fn header_violations_map_to_their_variants() {
        let good = frame_bytes(42, b"abcdef");

        let mut bad = good.clone();
        bad[0..4].copy_from_slice(b"GET ");
        let err = read_one(&bad, 1024).unwrap_err();
        assert!(matches!(err, WireError::BadMagic(m) if &m == b"GET "), "{err:?}");
        assert!(err.to_string().contains("not a cutline peer"), "{err}");

        let mut bad = good.clone();
        bad[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_be_bytes());
        let err = read_one(&bad, 1024).unwrap_err();
        assert!(
            matches!(err, WireError::Version { got, supported: PROTOCOL_VERSION } if got == PROTOCOL_VERSION + 1),
            "{err:?}"
        );
        assert!(err.to_string().contains("same cutline version"), "{err}");

        let mut bad = good.clone();
        bad[7] = 1;
        assert!(matches!(read_one(&bad, 1024), Err(WireError::Reserved(1))));

        let err = read_one(&good[..5], 1024).unwrap_err();
        assert!(matches!(err, WireError::Truncated { expected: HEADER_BYTES, got: 5 }), "{err:?}");
        assert!(!err.is_closed());

        let err = read_one(&good[..HEADER_BYTES + 2], 1024).unwrap_err();
        assert!(
            matches!(err, WireError::Truncated { expected, got } if expected == HEADER_BYTES + 6 && got == HEADER_BYTES + 2),
            "{err:?}"
        );

        let err = read_one(&[], 1024).unwrap_err();
        assert!(matches!(err, WireError::Closed), "{err:?}");
        assert!(err.is_closed());

        assert_eq!(read_one(&good, 1024).unwrap(), (42, b"abcdef".to_vec()));
    }

    #[test]
    fn is_closed_recognizes_ended_connections_only() {
        for kind in [ErrorKind::UnexpectedEof, ErrorKind::ConnectionReset, ErrorKind::BrokenPipe] {
            assert!(WireError::Io(io::Error::from(kind)).is_closed(), "{kind:?}");
        }
        assert!(WireError::Io(io::Error::from(ErrorKind::ConnectionAborted)).is_closed());
        assert!(!WireError::Io(io::Error::from(ErrorKind::TimedOut)).is_closed());
        assert!(!WireError::Truncated { expected: 12, got: 3 }.is_closed());
        assert!(!WireError::Auth("x".into()).is_closed());
    }

    #[test]
    fn random_input_never_panics() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut payload = Vec::new();
        let mut outcomes = [0usize; 3]; // ok, closed/truncated, header errors
        for i in 0..10_000 {
            let len = (rng.next() % 96) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            // Half of the inputs start like a real header, so the checks behind the magic get exercised.
            if i % 2 == 0 && bytes.len() >= 6 {
                bytes[..4].copy_from_slice(&MAGIC);
                bytes[4..6].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
                if i % 4 == 0 && bytes.len() >= 12 {
                    bytes[7] = 0;
                    bytes[8..12].copy_from_slice(&((rng.next() % 128) as u32).to_be_bytes());
                }
            }
            let max = [0u32, 16, 64, DEFAULT_MAX_FRAME_BYTES, u32::MAX][i % 5];
            let mut r = Cursor::new(&bytes);
            // Read frames until the input fails or ends.
            loop {
                match read_frame(&mut r, max, &mut payload) {
                    Ok(_) => outcomes[0] += 1,
                    Err(WireError::Closed | WireError::Truncated { .. }) => {
                        outcomes[1] += 1;
                        break;
                    }
                    Err(_) => {
                        outcomes[2] += 1;
                        break;
                    }
                }
            }
        }
        assert!(outcomes.iter().all(|&n| n > 0), "every path is exercised: {outcomes:?}");
    }

    #[test]
    fn every_single_byte_header_mutation_is_handled() {
        let good = frame_bytes(5, &[1, 2, 3, 4, 5, 6, 7, 8]);
        for pos in 0..HEADER_BYTES {
            for value in 0..=255u8 {
                let mut bytes = good.clone();
                bytes[pos] = value;
                let result = read_one(&bytes, 64);
                if value == good[pos] {
                    assert_eq!(result.unwrap(), (5, vec![1, 2, 3, 4, 5, 6, 7, 8]));
                    continue;
                }
                match (pos, result) {
                    (0..=3, Err(WireError::BadMagic(_))) => {}
                    (4..=5, Err(WireError::Version { .. })) => {}
                    (6, Ok((kind, p))) => assert!(kind == value && p.len() == 8),
                    (7, Err(WireError::Reserved(v))) => assert_eq!(v, value),
                    (8..=11, Err(WireError::TooLarge { .. })) => {}
                    (8..=11, Err(WireError::Truncated { .. })) => {}
                    (11, Ok((_, p))) => assert!(p.len() < 8, "a shorter length reads a prefix"),
                    (pos, other) => panic!("byte {pos} = {value:#04x}: unexpected {other:?}"),
                }
            }
        }
    }
}
