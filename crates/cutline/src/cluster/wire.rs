//! The bytes on a cutline TCP connection (coordinator <-> worker control connections and worker <-> worker
//! data connections): the versioned frame header, the per-connection frame size limit, and the mutual
//! challenge-response handshake that proves both ends hold the cluster secret.
//!
//! A frame is a 12-byte header (`b"CUTL"`, protocol version u16 BE, kind u8, reserved u8 = 0, payload
//! length u32 BE) and the payload. The reader validates the whole header before it allocates anything,
//! grows the payload buffer only as bytes actually arrive, and never panics on any input.
//!
//! It does not own message types (callers give meaning to kinds 1..=200 and to the payloads), threads,
//! reconnection or retries, and it does not buffer or flush writes: callers decide when to flush.

// The cluster runtime uses this API; until it lands most items have no caller outside the tests.
#![allow(dead_code)]

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// The version of the frame format and handshake. Peers with another version are refused.
pub(crate) const PROTOCOL_VERSION: u16 = 1;
/// The default per-connection limit on a frame's payload (64 MiB).
pub(crate) const DEFAULT_MAX_FRAME_BYTES: u32 = 64 << 20;
/// Size of the frame header.
pub(crate) const HEADER_BYTES: usize = 12;
/// How long each side waits for the other during the handshake.
pub(crate) const HANDSHAKE_TIMEOUT_MS: u64 = 5_000;

/// Handshake frame: the server's 32-byte nonce.
pub(crate) const KIND_CHALLENGE: u8 = 250;
/// Handshake frame: client nonce (32) || client MAC (32) || client hello.
pub(crate) const KIND_RESPONSE: u8 = 251;
/// Handshake frame: server MAC (32) || server hello.
pub(crate) const KIND_ACCEPT: u8 = 252;
/// Handshake frame: the server refuses the client; the payload is a short UTF-8 reason.
pub(crate) const KIND_REJECT: u8 = 253;

const MAGIC: [u8; 4] = *b"CUTL";
const NONCE_BYTES: usize = 32;
const MAC_BYTES: usize = 32;
const CLIENT_LABEL: &[u8] = b"cutline/v1/client";
const SERVER_LABEL: &[u8] = b"cutline/v1/server";
/// The payload buffer grows by at most this much before the bytes to fill it have arrived, so a peer that
/// announces a large frame and sends nothing does not make us allocate the whole frame.
const READ_CHUNK_BYTES: usize = 1 << 20;
/// The longest reject reason we show from a peer (it is not authenticated).
const MAX_REASON_CHARS: usize = 200;

type HmacSha256 = Hmac<Sha256>;

/// Everything that can go wrong reading or writing frames, or during the handshake.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    /// The transport failed (includes timeouts).
    #[error("network I/O failed: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection cleanly, at a frame boundary.
    #[error("the peer closed the connection")]
    Closed,
    /// The stream does not start with the cutline magic bytes.
    #[error(
        "not a cutline peer (a frame starts with \"{}\" instead of \"CUTL\"): check the address and port, \
         and that the process listening there is a cutline process",
        .0.escape_ascii()
    )]
    BadMagic([u8; 4]),
    /// The peer speaks another protocol version.
    #[error(
        "the peer speaks cutline protocol version {got} and this process speaks version {supported}: upgrade \
         or downgrade so that all processes of the cluster run the same cutline version"
    )]
    Version { got: u16, supported: u16 },
    /// The reserved header byte is not zero.
    #[error(
        "the reserved byte of a frame header is {0:#04x} instead of 0: the peer runs an incompatible cutline \
         build or the stream is corrupt; run the same cutline version everywhere"
    )]
    Reserved(u8),
    /// A frame exceeds the limit (on read: the connection's `max_frame_bytes`; on write: u32 lengths).
    #[error("{}", too_large_message(*len, *max))]
    TooLarge { len: u32, max: u32 },
    /// The connection ended in the middle of a frame.
    #[error(
        "the connection ended in the middle of a frame ({got} of {expected} bytes arrived): the peer crashed \
         or was killed, or the network dropped the connection"
    )]
    Truncated { expected: usize, got: usize },
    /// A payload failed to decode (for callers).
    #[error("malformed message from the peer: {0}")]
    Malformed(String),
    /// The handshake failed. The text never contains the secret or MACs.
    #[error("handshake failed: {0}")]
    Auth(String),
}

fn too_large_message(len: u32, max: u32) -> String {
    if max == u32::MAX {
        // Only the writer uses u32::MAX as the limit: a reader's limit can never be exceeded by a u32.
        "a frame payload of 4 GiB or more cannot be sent (frame lengths are 32-bit): split the message".into()
    } else {
        format!(
            "a frame of {len} bytes exceeds this connection's limit of {max} bytes (max_frame_bytes): if \
             messages this large are legitimate, raise max_frame_bytes on every process of the cluster; \
             otherwise the peer is misbehaving or is not a cutline process"
        )
    }
}

impl WireError {
    /// True when the connection is gone (clean close, or the transport reports it ended): callers treat
    /// this as the peer leaving rather than as a protocol violation.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            WireError::Closed => true,
            WireError::Io(e) => matches!(
                e.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::BrokenPipe
                    | ErrorKind::ConnectionAborted
            ),
            _ => false,
        }
    }
}

/// The 12-byte header of a frame of `kind` with a payload of `len` bytes.
fn header(kind: u8, len: u32) -> [u8; HEADER_BYTES] {
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

/// Like [`write_frame`], but builds header and payload in `buf` (cleared first, reused across calls) and
/// issues a single `write_all`: the hot path for data frames.
pub(crate) fn write_frame_buf(
    w: &mut impl Write,
    kind: u8,
    payload: &[u8],
    buf: &mut Vec<u8>,
) -> Result<(), WireError> {
    let len = payload_len(payload)?;
    buf.clear();
    buf.reserve(HEADER_BYTES + payload.len());
    buf.extend_from_slice(&header(kind, len));
    buf.extend_from_slice(payload);
    w.write_all(buf)?;
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

/// A cluster secret: at least [`Secret::MIN_BYTES`] bytes, shared by every process of a cluster. It is
/// never sent over the network, and `Debug` prints `Secret(..)`, never the bytes.
#[derive(Clone)]
pub(crate) struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The shortest secret accepted.
    pub(crate) const MIN_BYTES: usize = 16;

    /// Wraps `bytes`, refusing secrets shorter than [`Secret::MIN_BYTES`].
    pub(crate) fn new(bytes: Vec<u8>) -> Result<Secret, String> {
        if bytes.len() < Self::MIN_BYTES {
            return Err(format!(
                "the cluster secret is {} bytes long and must be at least {}: make one with \
                 `head -c 32 /dev/urandom | base64 > cluster.secret` and give that file to every process",
                bytes.len(),
                Self::MIN_BYTES
            ));
        }
        Ok(Secret(bytes))
    }

    /// Reads a secret from a file, trimming trailing whitespace and newlines (the file's bytes are the
    /// secret as they are; a base64 text is not decoded).
    pub(crate) fn from_file(path: &Path) -> Result<Secret, String> {
        let mut bytes = std::fs::read(path).map_err(|e| {
            format!(
                "cannot read the cluster secret from {}: {e}; check the path and its permissions, or make \
                 one with `head -c 32 /dev/urandom | base64 > cluster.secret`",
                path.display()
            )
        })?;
        while bytes.last().is_some_and(|b| b.is_ascii_whitespace()) {
            bytes.pop();
        }
        Secret::new(bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC accepts keys of any length")
    }
}

/// 32 random bytes from `/dev/urandom`.
fn nonce() -> Result<[u8; NONCE_BYTES], WireError> {
    let mut n = [0u8; NONCE_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut n))
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read random bytes from /dev/urandom: {e}")))?;
    Ok(n)
}

/// HMAC-SHA256(secret, label || a || b || hello), not finalized.
fn mac_over(secret: &Secret, label: &[u8], a: &[u8], b: &[u8], hello: &[u8]) -> HmacSha256 {
    let mut m = secret.mac();
    m.update(label);
    m.update(a);
    m.update(b);
    m.update(hello);
    m
}

/// A reject reason from an unauthenticated peer, made safe to show: bounded, no control characters.
fn sanitize_reason(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out: String = text.chars().take(MAX_REASON_CHARS).map(|c| if c.is_control() { '?' } else { c }).collect();
    if text.chars().count() > MAX_REASON_CHARS {
        out.push_str("...");
    }
    if out.is_empty() {
        out.push_str("no reason given");
    }
    out
}

fn unexpected_kind(who: &str, got: u8, wanted: &str, wanted_kind: u8) -> WireError {
    WireError::Auth(format!(
        "the {who} sent a frame of kind {got} where the handshake {wanted} (kind {wanted_kind}) was expected: \
         it is not a cutline process of this version, or it is not speaking the cluster protocol on this port"
    ))
}

/// Client side of the handshake over any byte stream; returns the server hello.
fn client_over<S: Read + Write>(
    s: &mut S,
    secret: &Secret,
    hello: &[u8],
    max_frame_bytes: u32,
) -> Result<Vec<u8>, WireError> {
    let mut payload = Vec::new();
    let kind = read_frame(s, max_frame_bytes, &mut payload)?;
    match kind {
        KIND_CHALLENGE => {}
        KIND_REJECT => {
            return Err(WireError::Auth(format!("rejected by the server: {}", sanitize_reason(&payload))));
        }
        other => return Err(unexpected_kind("server", other, "challenge", KIND_CHALLENGE)),
    }
    if payload.len() != NONCE_BYTES {
        return Err(WireError::Auth(format!(
            "the server's challenge has {} bytes instead of {NONCE_BYTES}: it is not a cutline process of this \
             version",
            payload.len()
        )));
    }
    let sn: [u8; NONCE_BYTES] = payload.as_slice().try_into().expect("length checked above");
    let cn = nonce()?;
    let mac_c = mac_over(secret, CLIENT_LABEL, &sn, &cn, hello).finalize().into_bytes();

    let mut response = Vec::with_capacity(NONCE_BYTES + MAC_BYTES + hello.len());
    response.extend_from_slice(&cn);
    response.extend_from_slice(&mac_c);
    response.extend_from_slice(hello);
    write_frame(s, KIND_RESPONSE, &response)?;
    s.flush()?;

    let kind = read_frame(s, max_frame_bytes, &mut payload)?;
    match kind {
        KIND_ACCEPT => {}
        KIND_REJECT => {
            return Err(WireError::Auth(format!("rejected by the server: {}", sanitize_reason(&payload))));
        }
        other => return Err(unexpected_kind("server", other, "accept", KIND_ACCEPT)),
    }
    if payload.len() < MAC_BYTES {
        return Err(WireError::Auth(format!(
            "the server's accept has {} bytes, fewer than the {MAC_BYTES} of its proof: it is not a cutline \
             process of this version",
            payload.len()
        )));
    }
    let server_hello = payload.split_off(MAC_BYTES);
    mac_over(secret, SERVER_LABEL, &cn, &sn, &server_hello)
        .verify_slice(&payload)
        .map_err(|_| WireError::Auth("the server does not hold the cluster secret".into()))?;
    Ok(server_hello)
}

/// Server side of the handshake over any byte stream; sends `hello` in ACCEPT and returns the client hello.
fn server_over<S: Read + Write>(
    s: &mut S,
    secret: &Secret,
    hello: &[u8],
    max_frame_bytes: u32,
) -> Result<Vec<u8>, WireError> {
    let sn = nonce()?;
    write_frame(s, KIND_CHALLENGE, &sn)?;
    s.flush()?;

    let mut payload = Vec::new();
    let kind = read_frame(s, max_frame_bytes, &mut payload)?;
    if kind != KIND_RESPONSE {
        reject(s, "expected a handshake response");
        return Err(unexpected_kind("client", kind, "response", KIND_RESPONSE));
    }
    if payload.len() < NONCE_BYTES + MAC_BYTES {
        reject(s, "malformed handshake response");
        return Err(WireError::Auth(format!(
            "the client's response has {} bytes, fewer than the {} of its nonce and proof: it is not a cutline \
             process of this version",
            payload.len(),
            NONCE_BYTES + MAC_BYTES
        )));
    }
    let client_hello = payload.split_off(NONCE_BYTES + MAC_BYTES);
    let (cn, mac_c) = payload.split_at(NONCE_BYTES);
    if mac_over(secret, CLIENT_LABEL, &sn, cn, &client_hello).verify_slice(mac_c).is_err() {
        reject(s, "wrong cluster secret");
        return Err(WireError::Auth(
            "a client presented a wrong cluster secret: give every process of the cluster the same secret file".into(),
        ));
    }
    let mac_s = mac_over(secret, SERVER_LABEL, cn, &sn, hello).finalize().into_bytes();
    let mut accept = Vec::with_capacity(MAC_BYTES + hello.len());
    accept.extend_from_slice(&mac_s);
    accept.extend_from_slice(hello);
    write_frame(s, KIND_ACCEPT, &accept)?;
    s.flush()?;
    Ok(client_hello)
}

/// Best effort: tells the client why it is refused. The handshake error that follows matters more than
/// a failure to deliver the reason, so write errors are ignored.
fn reject(s: &mut impl Write, reason: &str) {
    let _ = write_frame(s, KIND_REJECT, reason.as_bytes()).and_then(|()| s.flush().map_err(WireError::Io));
}

/// Runs `f` with read and write timeouts of `timeout` on `stream`, then restores no timeouts. A timeout
/// becomes an `Io` error of kind `TimedOut` that says the peer did not complete the handshake.
fn with_timeouts<T>(
    stream: &mut TcpStream,
    timeout: Duration,
    f: impl FnOnce(&mut TcpStream) -> Result<T, WireError>,
) -> Result<T, WireError> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let result = f(stream).map_err(|e| match e {
        WireError::Io(io) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            WireError::Io(io::Error::new(
                ErrorKind::TimedOut,
                format!(
                    "the peer did not complete the handshake within {} ms: check that it is a cutline process \
                     of the same version and that it is not overloaded",
                    timeout.as_millis()
                ),
            ))
        }
        other => other,
    });
    let restored = stream.set_read_timeout(None).and_then(|()| stream.set_write_timeout(None));
    let value = result?;
    restored?;
    Ok(value)
}

/// Client side of the handshake on a freshly connected stream: proves this process holds `secret`,
/// checks that the server does too, and returns the server hello. Waits at most
/// [`HANDSHAKE_TIMEOUT_MS`] for each read and write, and leaves the stream without timeouts.
pub(crate) fn handshake_client(
    stream: &mut TcpStream,
    secret: &Secret,
    hello: &[u8],
    max_frame_bytes: u32,
) -> Result<Vec<u8>, WireError> {
    with_timeouts(stream, Duration::from_millis(HANDSHAKE_TIMEOUT_MS), |s| {
        client_over(s, secret, hello, max_frame_bytes)
    })
}

/// Server side of the handshake on a freshly accepted stream: checks that the client holds `secret`
/// (rejecting it otherwise), proves this process does too, sends `hello` and returns the client hello.
/// Waits at most [`HANDSHAKE_TIMEOUT_MS`] for each read and write, and leaves the stream without
/// timeouts.
pub(crate) fn handshake_server(
    stream: &mut TcpStream,
    secret: &Secret,
    hello: &[u8],
    max_frame_bytes: u32,
) -> Result<Vec<u8>, WireError> {
    with_timeouts(stream, Duration::from_millis(HANDSHAKE_TIMEOUT_MS), |s| {
        server_over(s, secret, hello, max_frame_bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::net::TcpListener;
    use std::thread;

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
        let mut buf = Vec::new();
        for (i, (kind, payload)) in cases.iter().enumerate() {
            if i % 2 == 0 {
                write_frame(&mut wire, *kind, payload).unwrap();
            } else {
                write_frame_buf(&mut wire, *kind, payload, &mut buf).unwrap();
            }
            // Both writers produce the same bytes.
            let mut other = Vec::new();
            write_frame_buf(&mut other, *kind, payload, &mut buf).unwrap();
            assert_eq!(other, frame_bytes(*kind, payload));
        }
        assert_eq!(&wire[..HEADER_BYTES], &[b'C', b'U', b'T', b'L', 0, 1, 0, 0, 0, 0, 0, 0]);
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
        bad[4..6].copy_from_slice(&2u16.to_be_bytes());
        let err = read_one(&bad, 1024).unwrap_err();
        assert!(matches!(err, WireError::Version { got: 2, supported: PROTOCOL_VERSION }), "{err:?}");
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

    #[test]
    fn writing_a_frame_does_not_flush_or_split_the_buffered_write() {
        struct CountWrites(Vec<usize>, usize);
        impl Write for CountWrites {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.push(buf.len());
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                self.1 += 1;
                Ok(())
            }
        }
        let mut w = CountWrites(vec![], 0);
        let mut buf = Vec::new();
        write_frame_buf(&mut w, 1, &[0; 100], &mut buf).unwrap();
        write_frame(&mut w, 1, &[0; 100]).unwrap();
        assert_eq!(w.0, vec![HEADER_BYTES + 100, HEADER_BYTES, 100]);
        assert_eq!(w.1, 0);
    }

    fn secret(byte: u8) -> Secret {
        Secret::new(vec![byte; 32]).unwrap()
    }

    /// A connected (client, server) pair on loopback.
    fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    /// Runs `server` on its own thread and `client` on this one.
    fn run_pair<C, S>(
        client: impl FnOnce(&mut TcpStream) -> C,
        server: impl FnOnce(&mut TcpStream) -> S + Send + 'static,
    ) -> (C, S)
    where
        S: Send + 'static,
    {
        let (mut c, mut s) = tcp_pair();
        let handle = thread::spawn(move || server(&mut s));
        let client_result = client(&mut c);
        drop(c);
        (client_result, handle.join().expect("the server side must not panic"))
    }

    #[test]
    fn handshake_with_the_same_secret_succeeds_both_ways() {
        let (client, server) = run_pair(
            |c| {
                let server_hello = handshake_client(c, &secret(7), b"client says hi", 1024)?;
                assert_eq!(c.read_timeout().unwrap(), None, "timeouts are restored");
                assert_eq!(c.write_timeout().unwrap(), None, "timeouts are restored");
                // The connection is usable afterwards.
                write_frame(c, 1, b"first data frame")?;
                Ok::<_, WireError>(server_hello)
            },
            |s| {
                let client_hello = handshake_server(s, &secret(7), b"server says hello", 1024)?;
                assert_eq!(s.read_timeout().unwrap(), None, "timeouts are restored");
                let mut payload = Vec::new();
                let kind = read_frame(s, 1024, &mut payload)?;
                Ok::<_, WireError>((client_hello, kind, payload))
            },
        );
        assert_eq!(client.unwrap(), b"server says hello");
        let (client_hello, kind, payload) = server.unwrap();
        assert_eq!(client_hello, b"client says hi");
        assert_eq!((kind, payload.as_slice()), (1, &b"first data frame"[..]));

        // Empty hellos work too.
        let (client, server) =
            run_pair(|c| handshake_client(c, &secret(7), b"", 1024), |s| handshake_server(s, &secret(7), b"", 1024));
        assert_eq!(client.unwrap(), b"");
        assert_eq!(server.unwrap(), b"");
    }

    #[test]
    fn a_client_with_the_wrong_secret_is_rejected() {
        let (client, server) = run_pair(
            |c| handshake_client(c, &secret(1), b"hello", 1024),
            |s| handshake_server(s, &secret(2), b"hello", 1024),
        );
        let server = server.unwrap_err();
        assert!(matches!(&server, WireError::Auth(m) if m.contains("wrong cluster secret")), "{server:?}");
        let client = client.unwrap_err();
        assert!(
            matches!(&client, WireError::Auth(m) if m.contains("rejected by the server") && m.contains("wrong cluster secret")),
            "{client:?}"
        );
    }

    #[test]
    fn a_server_without_the_secret_is_detected_by_the_client() {
        // A real server with another secret rejects the client first.
        let (client, _server) = run_pair(
            |c| handshake_client(c, &secret(1), b"hello", 1024),
            |s| handshake_server(s, &secret(3), b"hello", 1024),
        );
        assert!(matches!(client, Err(WireError::Auth(_))), "{client:?}");

        // An impostor that accepts anyone cannot prove it holds the secret.
        let (client, server) = run_pair(
            |c| handshake_client(c, &secret(1), b"hello", 1024),
            |s| -> Result<(), WireError> {
                let sn = [9u8; NONCE_BYTES];
                write_frame(s, KIND_CHALLENGE, &sn)?;
                let mut payload = Vec::new();
                assert_eq!(read_frame(s, 1024, &mut payload)?, KIND_RESPONSE);
                let cn = &payload[..NONCE_BYTES];
                let forged = mac_over(&secret(4), SERVER_LABEL, cn, &sn, b"").finalize().into_bytes();
                write_frame(s, KIND_ACCEPT, &forged)?;
                Ok(())
            },
        );
        server.unwrap();
        let client = client.unwrap_err();
        assert!(matches!(&client, WireError::Auth(m) if m.contains("does not hold the cluster secret")), "{client:?}");

        // A proof from the right secret over another server hello does not verify either.
        let (client, _server) = run_pair(
            |c| handshake_client(c, &secret(1), b"hello", 1024),
            |s| -> Result<(), WireError> {
                let sn = [9u8; NONCE_BYTES];
                write_frame(s, KIND_CHALLENGE, &sn)?;
                let mut payload = Vec::new();
                read_frame(s, 1024, &mut payload)?;
                let cn = &payload[..NONCE_BYTES];
                let mut accept = mac_over(&secret(1), SERVER_LABEL, cn, &sn, b"real").finalize().into_bytes().to_vec();
                accept.extend_from_slice(b"fake");
                write_frame(s, KIND_ACCEPT, &accept)?;
                Ok(())
            },
        );
        assert!(matches!(client, Err(WireError::Auth(_))), "{client:?}");
    }

    #[test]
    fn a_client_sending_garbage_gets_an_error_not_a_panic() {
        // Not a frame at all.
        let (_, server) = run_pair(
            |c| {
                let mut payload = Vec::new();
                let kind = read_frame(c, 1024, &mut payload).unwrap();
                assert_eq!((kind, payload.len()), (KIND_CHALLENGE, NONCE_BYTES));
                c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            },
            |s| handshake_server(s, &secret(1), b"hello", 1024),
        );
        let server = server.unwrap_err();
        assert!(matches!(server, WireError::BadMagic(m) if &m == b"GET "), "{server:?}");

        // A frame of the wrong kind, then a response too short to hold a proof.
        for (kind, body) in [(1u8, vec![0u8; 64]), (KIND_RESPONSE, vec![0u8; 10])] {
            let (client, server) = run_pair(
                move |c| {
                    let mut payload = Vec::new();
                    read_frame(c, 1024, &mut payload).unwrap();
                    write_frame(c, kind, &body).unwrap();
                    let k = read_frame(c, 1024, &mut payload);
                    (k.ok(), payload)
                },
                |s| handshake_server(s, &secret(1), b"hello", 1024),
            );
            assert!(matches!(server, Err(WireError::Auth(_))), "{server:?}");
            assert_eq!(client.0, Some(KIND_REJECT), "the client is told why");
        }

        // A client that sends nothing times out.
        let (_, server) = run_pair(
            |_c| thread::sleep(Duration::from_millis(300)),
            |s| with_timeouts(s, Duration::from_millis(50), |s| server_over(s, &secret(1), b"", 1024)),
        );
        let server = server.unwrap_err();
        assert!(matches!(&server, WireError::Io(e) if e.kind() == ErrorKind::TimedOut), "{server:?}");
    }

    #[test]
    fn a_reject_reason_is_bounded_and_sanitized() {
        let wire = frame_bytes(KIND_REJECT, &[b'x'; 1000]);
        struct Duplex(Cursor<Vec<u8>>, Vec<u8>);
        impl Read for Duplex {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                self.0.read(b)
            }
        }
        impl Write for Duplex {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.1.write(b)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let err = client_over(&mut Duplex(Cursor::new(wire), vec![]), &secret(1), b"", 1024).unwrap_err();
        let WireError::Auth(text) = err else { panic!("{err:?}") };
        assert!(text.starts_with("rejected by the server: xxx") && text.len() < 300, "{text}");

        assert_eq!(sanitize_reason(b"bad\x1b[31m\n"), "bad?[31m?");
        assert_eq!(sanitize_reason(b""), "no reason given");
    }

    #[test]
    fn secrets_are_checked_trimmed_and_never_printed() {
        let err = Secret::new(b"short".to_vec()).unwrap_err();
        assert!(err.contains("at least 16") && err.contains("head -c 32 /dev/urandom"), "{err}");
        assert!(Secret::new(vec![b'a'; Secret::MIN_BYTES]).is_ok());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.secret");
        std::fs::write(&path, b"0123456789abcdefSECRETBYTES\n").unwrap();
        let s = Secret::from_file(&path).unwrap();
        assert_eq!(s.0, b"0123456789abcdefSECRETBYTES");
        let shown = format!("{s:?}");
        assert_eq!(shown, "Secret(..)");
        assert!(!shown.contains("SECRET") && !shown.contains("0123"));

        std::fs::write(&path, b"too short \r\n\n").unwrap();
        let err = Secret::from_file(&path).unwrap_err();
        assert!(err.contains(&path.display().to_string()) && err.contains("at least 16"), "{err}");
        let missing = dir.path().join("missing.secret");
        let err = Secret::from_file(&missing).unwrap_err();
        assert!(err.contains(&missing.display().to_string()), "{err}");
    }

    #[test]
    fn handshake_errors_never_contain_the_secret() {
        let s = Secret::new(b"super-secret-cluster-key".to_vec()).unwrap();
        let (client, server) = run_pair(
            |c| handshake_client(c, &Secret::new(b"another-secret-cluster-key".to_vec()).unwrap(), b"", 1024),
            move |sv| handshake_server(sv, &s, b"", 1024),
        );
        for text in [client.unwrap_err().to_string(), server.unwrap_err().to_string()] {
            assert!(!text.contains("secret-cluster-key"), "{text}");
        }
    }
}
