//! The handshake every cluster connection starts with: a mutual challenge-response that proves both
//! ends hold the cluster secret (HMAC-SHA256 over fresh nonces from both sides; the secret is never
//! sent), exchanges the callers' hellos, agrees on frame protection, and hands back the connection's
//! [`FrameWriter`] and [`FrameReader`] (sealed with keys of this connection, or plain).
//!
//! ```text
//! server -> CHALLENGE  server nonce (32) || server protection (setting u8, sealed u8)
//! client -> RESPONSE   client nonce (32) || client MAC (32) || client protection (2) || client hello
//! server -> ACCEPT     server MAC (32) || server hello        (or REJECT: code u8 || reason)
//! ```
//!
//! Each MAC covers its label and every byte the two sides exchanged before it (length-prefixed), so
//! neither the hellos nor the protection settings can be changed on the way. A whole handshake has
//! one deadline ([`HANDSHAKE_TIMEOUT_MS`]), however the peer spreads its bytes.

use super::frame::{read_frame, write_frame};
use super::seal::{describe, sealed_pair, FrameProtection, FrameReader, FrameWriter};
use super::{WireError, HANDSHAKE_MAX_FRAME_BYTES, HANDSHAKE_TIMEOUT_MS};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Handshake frame: the server's nonce and frame protection.
pub(crate) const KIND_CHALLENGE: u8 = 250;
/// Handshake frame: client nonce, MAC, frame protection and hello.
pub(crate) const KIND_RESPONSE: u8 = 251;
/// Handshake frame: server MAC (32) || server hello.
pub(crate) const KIND_ACCEPT: u8 = 252;
/// Handshake frame: the server refuses the client; the payload is a reject code and a short UTF-8
/// reason.
pub(crate) const KIND_REJECT: u8 = 253;

/// Reject codes: why the server refused (the client turns them into typed errors).
const REJECT_OTHER: u8 = 0;
const REJECT_SECRET: u8 = 1;
const REJECT_PROTECTION: u8 = 2;

const NONCE_BYTES: usize = 32;
const MAC_BYTES: usize = 32;
const PROTECTION_BYTES: usize = 2;
const CHALLENGE_BYTES: usize = NONCE_BYTES + PROTECTION_BYTES;
const CLIENT_LABEL: &[u8] = b"cutline/v2/client";
const SERVER_LABEL: &[u8] = b"cutline/v2/server";
/// The longest reject reason we show from a peer (it is not authenticated).
const MAX_REASON_CHARS: usize = 200;

type HmacSha256 = Hmac<Sha256>;

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
    #[allow(dead_code)] // the CLI reads the file itself; kept for library launchers and the tests
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

    /// HMAC-SHA256(secret, label || for each part: length u32 BE || part).
    fn mac_over(&self, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        m.update(label);
        for p in parts {
            // Lossless: every part is a frame payload (at most u32::MAX bytes) or a part of one.
            m.update(&(p.len() as u32).to_be_bytes());
            m.update(p);
        }
        m
    }
}

/// What a completed handshake gives: the peer's hello, and the frames of the connection from now on.
pub(crate) struct Established {
    pub(crate) hello: Vec<u8>,
    pub(crate) writer: FrameWriter,
    pub(crate) reader: FrameReader,
}

/// This end's frame protection: the setting, and what it decided for this connection.
type Protection = (FrameProtection, bool);

fn protection_bytes((setting, sealed): Protection) -> [u8; PROTECTION_BYTES] {
    [setting.to_byte(), sealed as u8]
}

fn parse_protection(who: &str, b: &[u8]) -> Result<Protection, WireError> {
    match (FrameProtection::from_byte(b[0]), b[1]) {
        (Some(setting), sealed @ (0 | 1)) => Ok((setting, sealed == 1)),
        _ => Err(WireError::Auth(format!(
            "the {who} announced an unknown frame protection ({:#04x}, {:#04x}): it is not a cutline process \
             of this version",
            b[0], b[1]
        ))),
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

/// The server's REJECT, as the client's error. `ours`/`theirs`: the protection of both ends, once known.
fn rejected(payload: &[u8], protection: Option<(Protection, Protection)>) -> WireError {
    match (payload.first(), protection) {
        (Some(&REJECT_SECRET), _) => WireError::WrongSecret,
        (Some(&REJECT_PROTECTION), Some((ours, theirs))) => WireError::ProtectionMismatch { ours, theirs },
        (Some(_), _) => WireError::Auth(format!("rejected by the server: {}", sanitize_reason(&payload[1..]))),
        (None, _) => WireError::Auth("rejected by the server: no reason given".into()),
    }
}

/// Client side of the handshake over any byte stream.
fn client_over<S: Read + Write>(
    s: &mut S,
    secret: &Secret,
    ours: Protection,
    hello: &[u8],
    max_frame_bytes: u32,
) -> Result<Established, WireError> {
    let mut challenge = Vec::new();
    match read_frame(s, HANDSHAKE_MAX_FRAME_BYTES, &mut challenge)? {
        KIND_CHALLENGE => {}
        KIND_REJECT => return Err(rejected(&challenge, None)),
        other => return Err(unexpected_kind("server", other, "challenge", KIND_CHALLENGE)),
    }
    if challenge.len() != CHALLENGE_BYTES {
        return Err(WireError::Auth(format!(
            "the server's challenge has {} bytes instead of {CHALLENGE_BYTES}: it is not a cutline process of \
             this version",
            challenge.len()
        )));
    }
    let theirs = parse_protection("server", &challenge[NONCE_BYTES..])?;
    let cn = nonce()?;
    let cp = protection_bytes(ours);
    let mac_c = secret.mac_over(CLIENT_LABEL, &[&challenge, &cn, &cp, hello]).finalize().into_bytes();
    let mut response = Vec::with_capacity(NONCE_BYTES + MAC_BYTES + PROTECTION_BYTES + hello.len());
    response.extend_from_slice(&cn);
    response.extend_from_slice(&mac_c);
    response.extend_from_slice(&cp);
    response.extend_from_slice(hello);
    write_frame(s, KIND_RESPONSE, &response)?;
    s.flush()?;

    // The server's verdict comes first: a wrong secret is reported as such even when the protection
    // differs too.
    let mut payload = Vec::new();
    match read_frame(s, HANDSHAKE_MAX_FRAME_BYTES, &mut payload)? {
        KIND_ACCEPT => {}
        KIND_REJECT => return Err(rejected(&payload, Some((ours, theirs)))),
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
    secret
        .mac_over(SERVER_LABEL, &[&challenge, &cn, &cp, hello, &server_hello])
        .verify_slice(&payload)
        .map_err(|_| WireError::PeerWithoutSecret)?;
    if ours.1 != theirs.1 {
        return Err(WireError::ProtectionMismatch { ours, theirs });
    }
    Ok(established(secret, &challenge, &cn, ours.1, true, server_hello, max_frame_bytes))
}

fn established(
    secret: &Secret,
    challenge: &[u8],
    cn: &[u8],
    sealed: bool,
    client: bool,
    hello: Vec<u8>,
    max_frame_bytes: u32,
) -> Established {
    if !sealed {
        return Established { hello, writer: FrameWriter::plain(), reader: FrameReader::plain(max_frame_bytes) };
    }
    let salt = [challenge, cn].concat();
    let (writer, reader) = sealed_pair(&secret.0, &salt, client, max_frame_bytes);
    Established { hello, writer, reader }
}

/// Server side of the handshake over any byte stream; sends `hello` in ACCEPT.
fn server_over<S: Read + Write>(
    s: &mut S,
    secret: &Secret,
    ours: Protection,
    hello: &[u8],
    max_frame_bytes: u32,
) -> Result<Established, WireError> {
    let mut challenge = nonce()?.to_vec();
    challenge.extend_from_slice(&protection_bytes(ours));
    write_frame(s, KIND_CHALLENGE, &challenge)?;
    s.flush()?;

    let mut payload = Vec::new();
    let kind = read_frame(s, HANDSHAKE_MAX_FRAME_BYTES, &mut payload)?;
    if kind != KIND_RESPONSE {
        reject(s, REJECT_OTHER, "expected a handshake response");
        return Err(unexpected_kind("client", kind, "response", KIND_RESPONSE));
    }
    const FIXED: usize = NONCE_BYTES + MAC_BYTES + PROTECTION_BYTES;
    if payload.len() < FIXED {
        reject(s, REJECT_OTHER, "malformed handshake response");
        return Err(WireError::Auth(format!(
            "the client's response has {} bytes, fewer than the {FIXED} of its nonce, proof and frame \
             protection: it is not a cutline process of this version",
            payload.len()
        )));
    }
    let client_hello = payload.split_off(FIXED);
    let (cn, rest) = payload.split_at(NONCE_BYTES);
    let (mac_c, cp) = rest.split_at(MAC_BYTES);
    if secret.mac_over(CLIENT_LABEL, &[&challenge, cn, cp, &client_hello]).verify_slice(mac_c).is_err() {
        reject(s, REJECT_SECRET, "wrong cluster secret");
        return Err(WireError::Auth(
            "a client presented a wrong cluster secret: give every process of the cluster the same secret file".into(),
        ));
    }
    let theirs = parse_protection("client", cp)?;
    if theirs.1 != ours.1 {
        let e = WireError::ProtectionMismatch { ours, theirs };
        reject(
            s,
            REJECT_PROTECTION,
            &format!("frame protection differs: the server {}, the client {}", describe(ours), describe(theirs)),
        );
        return Err(e);
    }
    let mac_s = secret.mac_over(SERVER_LABEL, &[&challenge, cn, cp, &client_hello, hello]).finalize().into_bytes();
    let mut accept = Vec::with_capacity(MAC_BYTES + hello.len());
    accept.extend_from_slice(&mac_s);
    accept.extend_from_slice(hello);
    write_frame(s, KIND_ACCEPT, &accept)?;
    s.flush()?;
    Ok(established(secret, &challenge, cn, ours.1, false, client_hello, max_frame_bytes))
}

/// Best effort: tells the client why it is refused. The handshake error that follows matters more than
/// a failure to deliver the reason, so write errors are ignored.
fn reject(s: &mut impl Write, code: u8, reason: &str) {
    let mut payload = vec![code];
    payload.extend_from_slice(reason.as_bytes());
    let _ = write_frame(s, KIND_REJECT, &payload).and_then(|()| s.flush().map_err(WireError::Io));
}

/// A stream whose reads and writes all end by one instant: each waits at most for what is left.
struct Deadline<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl Deadline<'_> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::from(ErrorKind::TimedOut));
        }
        Ok(left)
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        (&mut &*self.stream).read(buf)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        (&mut &*self.stream).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        (&mut &*self.stream).flush()
    }
}

/// Runs `f` on `stream` with one deadline `timeout` from now for all of it, then leaves the stream
/// without timeouts. Running out of time is an `Io` error of kind `TimedOut` that says the peer did
/// not complete the handshake.
fn within<T>(
    stream: &mut TcpStream,
    timeout: Duration,
    f: impl FnOnce(&mut Deadline<'_>) -> Result<T, WireError>,
) -> Result<T, WireError> {
    let result = f(&mut Deadline { stream, until: Instant::now() + timeout }).map_err(|e| match e {
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

/// This end's protection on `stream` under `setting`.
fn decide(stream: &TcpStream, setting: FrameProtection) -> Result<Protection, WireError> {
    Ok((setting, setting.resolve(stream.local_addr()?.ip(), stream.peer_addr()?.ip())))
}

/// Client side of the handshake on a freshly connected stream: proves this process holds `secret`,
/// checks that the server does too and that both come to the same frame protection, and returns the
/// server hello and the connection's frames (read with at most `max_frame_bytes` per frame). The
/// whole handshake takes at most [`HANDSHAKE_TIMEOUT_MS`]; the stream is left without timeouts.
pub(crate) fn handshake_client(
    stream: &mut TcpStream,
    secret: &Secret,
    protection: FrameProtection,
    hello: &[u8],
    max_frame_bytes: u32,
) -> Result<Established, WireError> {
    let ours = decide(stream, protection)?;
    within(stream, Duration::from_millis(HANDSHAKE_TIMEOUT_MS), |s| {
        client_over(s, secret, ours, hello, max_frame_bytes)
    })
}

/// Server side of the handshake on a freshly accepted stream: checks that the client holds `secret`
/// (rejecting it otherwise) and comes to the same frame protection, proves this process holds the
/// secret, sends `hello` and returns the client hello and the connection's frames. The whole
/// handshake takes at most [`HANDSHAKE_TIMEOUT_MS`]; the stream is left without timeouts.
pub(crate) fn handshake_server(
    stream: &mut TcpStream,
    secret: &Secret,
    protection: FrameProtection,
    hello: &[u8],
    max_frame_bytes: u32,
) -> Result<Established, WireError> {
    let ours = decide(stream, protection)?;
    within(stream, Duration::from_millis(HANDSHAKE_TIMEOUT_MS), |s| {
        server_over(s, secret, ours, hello, max_frame_bytes)
    })
}

#[cfg(test)]
#[path = "handshake_tests.rs"]
mod tests;
