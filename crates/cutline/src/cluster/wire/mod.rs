//! The bytes on a cutline TCP connection (coordinator <-> worker control connections and worker <->
//! worker data connections): the versioned frame header and the per-connection frame size limit
//! (`frame`), the mutual challenge-response handshake that proves both ends hold the cluster secret
//! and agrees on frame protection (`handshake`), and the sealing of every frame after it (`seal`).
//!
//! After the handshake, each direction of a connection has its own [`FrameWriter`] and
//! [`FrameReader`]. With frame protection on, every frame is sealed with AES-256-GCM under a key of
//! that connection and direction (HKDF-SHA256 from the cluster secret and both handshake nonces),
//! its header authenticated too, with the frame's number in the direction as the nonce: a changed,
//! replayed, reordered, dropped or injected frame fails to open, and the connection is closed.
//!
//! It does not own message types (callers give meaning to kinds 1..=200 and to the payloads), threads,
//! reconnection or retries, and it does not buffer or flush writes: callers decide when to flush.

mod frame;
mod handshake;
mod seal;

#[cfg(test)]
pub(crate) use frame::write_frame;
pub(crate) use handshake::{handshake_client, handshake_server, Established, Secret};
pub use seal::FrameProtection;
pub(crate) use seal::{FrameReader, FrameWriter};

use std::io::{self, ErrorKind};

/// The version of the frame format and handshake. Peers with another version are refused.
/// Version 2: the handshake agrees on frame protection, and frames may be sealed.
pub(crate) const PROTOCOL_VERSION: u16 = 2;
/// The default per-connection limit on a frame's payload (64 MiB).
pub(crate) const DEFAULT_MAX_FRAME_BYTES: u32 = 64 << 20;
/// Size of the frame header.
pub(crate) const HEADER_BYTES: usize = 12;
/// How long a whole handshake may take, from its first byte to its last, on either side: a peer
/// that trickles bytes holds a handshake slot no longer than this.
pub(crate) const HANDSHAKE_TIMEOUT_MS: u64 = 5_000;
/// Frame limit during the handshake (before a peer is authenticated): hellos are small.
pub(crate) const HANDSHAKE_MAX_FRAME_BYTES: u32 = 64 << 10;

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
    /// The server refused this process's proof of the cluster secret (client side).
    #[error("the peer rejected this process's cluster secret: give every process of the cluster the same secret file")]
    WrongSecret,
    /// The server's proof of the cluster secret does not verify (client side).
    #[error(
        "the peer does not hold the cluster secret (its proof does not verify): check that the address names a \
         process of this cluster, and give every process of the cluster the same secret file"
    )]
    PeerWithoutSecret,
    /// The two ends disagree on frame protection.
    #[error(
        "frame protection differs: this process {}, the peer {}; give every process of the cluster the same \
         frame protection setting (--frame-protection auto, on or off)",
        seal::describe(*ours), seal::describe(*theirs)
    )]
    ProtectionMismatch { ours: (FrameProtection, bool), theirs: (FrameProtection, bool) },
    /// A sealed frame did not open: changed, replayed, reordered, dropped or injected on the way.
    #[error(
        "frame {frame} from the peer failed its integrity check (it was changed, replayed, reordered or \
         injected, or a frame before it was lost): the connection is closed; if this repeats, something \
         between the hosts alters traffic"
    )]
    Tampered { frame: u64 },
    /// A direction of a sealed connection ran out of frame numbers (after 2^64 - 1 frames).
    #[error("this connection sent every frame number it has (2^64 - 1 frames): reconnect")]
    Exhausted,
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

    /// True when retrying the same connection cannot succeed: the secret or the frame protection
    /// setting differs between the two ends. Callers stop instead of retrying.
    pub(crate) fn is_permanent(&self) -> bool {
        matches!(self, WireError::WrongSecret | WireError::PeerWithoutSecret | WireError::ProtectionMismatch { .. })
    }

    /// True when a sealed frame failed to open (the connection was tampered with).
    pub(crate) fn is_integrity(&self) -> bool {
        matches!(self, WireError::Tampered { .. })
    }
}

/// The frames of both ends of a sealed connection, `(client, server)`, for tests of the layers above.
#[cfg(test)]
pub(crate) fn sealed_test_ends(max_frame_bytes: u32) -> ((FrameWriter, FrameReader), (FrameWriter, FrameReader)) {
    let secret = b"test-secret-for-sealed-test-ends";
    (
        seal::sealed_pair(secret, b"test nonces", true, max_frame_bytes),
        seal::sealed_pair(secret, b"test nonces", false, max_frame_bytes),
    )
}
