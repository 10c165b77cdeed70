//! Frame protection: the setting ([`FrameProtection`]) and what it decides per connection, the keys of
//! a connection (HKDF-SHA256 from the cluster secret and both handshake nonces, one key per
//! direction), and the writer and reader of one direction ([`FrameWriter`], [`FrameReader`]).
//!
//! A sealed frame is a plain frame (see `frame`) whose payload is the AES-256-GCM ciphertext of the
//! message followed by its 16-byte tag; the 12-byte header is the associated data, so its kind and
//! length are authenticated too. The nonce is the frame's number in its direction (0, 1, 2, ...),
//! never sent: both ends count. A frame that was changed, replayed, reordered, dropped before it or
//! injected therefore does not open, and the reader fails with [`WireError::Tampered`]; after that it
//! fails every read (callers close the connection). A plain reader and writer (protection off) are
//! the framing alone.
//!
//! It does not negotiate anything (the handshake decides whether a connection is sealed and derives
//! the keys through [`sealed_pair`]) and does not buffer or flush.

use super::frame::{header, read_frame, write_frame};
use super::{WireError, HEADER_BYTES};
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce, Tag};
use hkdf::Hkdf;
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::IpAddr;

/// Bytes a sealed frame's payload carries beyond the message: the AEAD tag.
pub(crate) const TAG_BYTES: usize = 16;
/// A writer's scratch buffer is given back when a frame made it larger than this (a rare large
/// message must not pin its size for the connection's life).
const SCRATCH_KEEP_BYTES: usize = 1 << 20;
const KEY_BYTES: usize = 32;
const CLIENT_TO_SERVER: &[u8] = b"cutline/v2/frames client->server";
const SERVER_TO_CLIENT: &[u8] = b"cutline/v2/frames server->client";

/// Whether the frames of cluster connections (control and data) are sealed: encrypted and
/// authenticated with a key of the connection, so that a changed, replayed, reordered, dropped or
/// injected frame is detected and closes the connection. Both ends of a connection must come to the
/// same decision, or the handshake refuses the connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrameProtection {
    /// Seal unless both ends of the connection are loopback addresses (one host trusts itself).
    #[default]
    Auto,
    /// Always seal.
    On,
    /// Never seal: frames are authenticated only at the handshake.
    Off,
}

impl FrameProtection {
    /// Whether a connection between `local` and `peer` is sealed under this setting.
    pub(crate) fn resolve(self, local: IpAddr, peer: IpAddr) -> bool {
        match self {
            FrameProtection::On => true,
            FrameProtection::Off => false,
            FrameProtection::Auto => !(local.to_canonical().is_loopback() && peer.to_canonical().is_loopback()),
        }
    }

    pub(super) fn to_byte(self) -> u8 {
        match self {
            FrameProtection::Off => 0,
            FrameProtection::On => 1,
            FrameProtection::Auto => 2,
        }
    }

    pub(super) fn from_byte(b: u8) -> Option<FrameProtection> {
        match b {
            0 => Some(FrameProtection::Off),
            1 => Some(FrameProtection::On),
            2 => Some(FrameProtection::Auto),
            _ => None,
        }
    }
}

impl std::fmt::Display for FrameProtection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FrameProtection::Auto => "auto",
            FrameProtection::On => "on",
            FrameProtection::Off => "off",
        })
    }
}

impl std::str::FromStr for FrameProtection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(FrameProtection::Auto),
            "on" => Ok(FrameProtection::On),
            "off" => Ok(FrameProtection::Off),
            other => Err(format!(
                "frame protection {other:?}: use auto (seal unless both ends are loopback addresses), on or off"
            )),
        }
    }
}

/// One end's decision, for messages: `seals frames (frame protection auto)`.
pub(super) fn describe((setting, sealed): (FrameProtection, bool)) -> String {
    format!("{} frames (frame protection {setting})", if sealed { "seals" } else { "does not seal" })
}

/// The nonce of frame `n` of a direction.
fn nonce(n: u64) -> Nonce<aes_gcm::aead::consts::U12> {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_be_bytes());
    b.into()
}

/// The writer and reader of one end of a sealed connection: `client` is the end that connected.
/// `salt` is the handshake's transcript of nonces (both ends give the same bytes).
pub(super) fn sealed_pair(
    secret: &[u8],
    salt: &[u8],
    client: bool,
    max_frame_bytes: u32,
) -> (FrameWriter, FrameReader) {
    let hk = Hkdf::<Sha256>::new(Some(salt), secret);
    let key = |label: &[u8]| {
        let mut k = [0u8; KEY_BYTES];
        hk.expand(label, &mut k).expect("32 bytes is a valid HKDF-SHA256 output length");
        Box::new(Aes256Gcm::new(&k.into()))
    };
    let (send, recv) = if client { (CLIENT_TO_SERVER, SERVER_TO_CLIENT) } else { (SERVER_TO_CLIENT, CLIENT_TO_SERVER) };
    (
        FrameWriter { seal: Some(Sealer { cipher: key(send), next: 0, buf: Vec::new() }) },
        FrameReader { open: Some(Opener { cipher: key(recv), next: 0, failed: false }), max_frame_bytes },
    )
}

struct Sealer {
    cipher: Box<Aes256Gcm>,
    /// The number of the next frame.
    next: u64,
    buf: Vec<u8>,
}

/// Writes the frames of one direction of a connection: sealed, or plain.
pub(crate) struct FrameWriter {
    seal: Option<Sealer>,
}

impl FrameWriter {
    /// A writer of plain frames (frame protection off).
    pub(crate) fn plain() -> FrameWriter {
        FrameWriter { seal: None }
    }

    pub(crate) fn is_sealed(&self) -> bool {
        self.seal.is_some()
    }

    /// Writes one frame of `kind` (sealed if this writer seals) without flushing. A sealed frame goes
    /// out in one `write_all`.
    pub(crate) fn write(&mut self, w: &mut impl Write, kind: u8, payload: &[u8]) -> Result<(), WireError> {
        let Some(s) = &mut self.seal else { return write_frame(w, kind, payload) };
        let len = payload
            .len()
            .checked_add(TAG_BYTES)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or(WireError::TooLarge { len: u32::MAX, max: u32::MAX })?;
        let n = s.next;
        s.next = n.checked_add(1).ok_or(WireError::Exhausted)?;
        let h = header(kind, len);
        s.buf.clear();
        s.buf.reserve(HEADER_BYTES + payload.len() + TAG_BYTES);
        s.buf.extend_from_slice(&h);
        s.buf.extend_from_slice(payload);
        let tag = s
            .cipher
            .encrypt_in_place_detached(&nonce(n), &h, &mut s.buf[HEADER_BYTES..])
            // AES-GCM refuses only messages of 64 GiB and more, which a u32 length cannot announce.
            .map_err(|_| WireError::TooLarge { len: u32::MAX, max: u32::MAX })?;
        s.buf.extend_from_slice(&tag);
        let r = w.write_all(&s.buf);
        if s.buf.capacity() > SCRATCH_KEEP_BYTES {
            s.buf = Vec::new();
        }
        Ok(r?)
    }
}

struct Opener {
    cipher: Box<Aes256Gcm>,
    /// The number of the next frame expected.
    next: u64,
    /// A frame failed to open: every later read fails too.
    failed: bool,
}

/// Reads the frames of one direction of a connection: sealed, or plain; at most `max_frame_bytes`
/// of message per frame.
pub(crate) struct FrameReader {
    open: Option<Opener>,
    max_frame_bytes: u32,
}

impl FrameReader {
    /// A reader of plain frames (frame protection off).
    pub(crate) fn plain(max_frame_bytes: u32) -> FrameReader {
        FrameReader { open: None, max_frame_bytes }
    }

    pub(crate) fn set_max_frame_bytes(&mut self, max_frame_bytes: u32) {
        self.max_frame_bytes = max_frame_bytes;
    }

    /// Reads one frame into `payload` (the message, opened) and returns its kind. A sealed frame that
    /// does not open is [`WireError::Tampered`], and so is every read after it.
    pub(crate) fn read(&mut self, r: &mut impl Read, payload: &mut Vec<u8>) -> Result<u8, WireError> {
        let Some(o) = &mut self.open else { return read_frame(r, self.max_frame_bytes, payload) };
        if o.failed {
            payload.clear();
            return Err(WireError::Tampered { frame: o.next });
        }
        let kind = read_frame(r, self.max_frame_bytes.saturating_add(TAG_BYTES as u32), payload)?;
        let n = o.next;
        let opened = if payload.len() >= TAG_BYTES {
            // Lossless: read_frame read at most u32::MAX bytes.
            let h = header(kind, payload.len() as u32);
            let split = payload.len() - TAG_BYTES;
            let tag = Tag::clone_from_slice(&payload[split..]);
            payload.truncate(split);
            o.cipher.decrypt_in_place_detached(&nonce(n), &h, payload, &tag).is_ok()
        } else {
            false
        };
        if !opened {
            o.failed = true;
            payload.clear();
            return Err(WireError::Tampered { frame: n });
        }
        o.next = n.checked_add(1).ok_or(WireError::Exhausted)?;
        Ok(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const MAX: u32 = 1 << 20;

    fn pair(secret: &[u8], salt: &[u8]) -> (FrameWriter, FrameReader, FrameWriter, FrameReader) {
        let (cw, cr) = sealed_pair(secret, salt, true, MAX);
        let (sw, sr) = sealed_pair(secret, salt, false, MAX);
        (cw, cr, sw, sr)
    }

    /// Frames as the client writes them, one `Vec` per frame.
    fn sealed_frames(w: &mut FrameWriter, messages: &[(u8, &[u8])]) -> Vec<Vec<u8>> {
        messages
            .iter()
            .map(|(k, m)| {
                let mut out = Vec::new();
                w.write(&mut out, *k, m).unwrap();
                out
            })
            .collect()
    }

    fn read_all(r: &mut FrameReader, bytes: &[u8]) -> Vec<Result<(u8, Vec<u8>), String>> {
        let mut c = Cursor::new(bytes);
        let mut out = Vec::new();
        let mut payload = Vec::new();
        loop {
            match r.read(&mut c, &mut payload) {
                Ok(k) => out.push(Ok((k, payload.clone()))),
                Err(WireError::Closed) => return out,
                Err(e) => {
                    out.push(Err(format!("{e:?}")));
                    return out;
                }
            }
        }
    }

    #[test]
    fn sealed_frames_round_trip_and_hide_the_message() {
        let (mut cw, mut cr, mut sw, mut sr) = pair(b"0123456789abcdef-secret", b"nonces");
        let secret_text: &[u8] = b"the quick brown fox jumps over the lazy dog";
        let frames = sealed_frames(&mut cw, &[(10, secret_text), (1, b""), (200, &[7; 5000])]);
        assert_eq!(frames[0].len(), HEADER_BYTES + secret_text.len() + TAG_BYTES);
        assert!(!frames[0].windows(9).any(|w| w == b"quick bro"), "the message is encrypted");
        let got = read_all(&mut sr, &frames.concat());
        assert_eq!(
            got,
            vec![Ok((10, secret_text.to_vec())), Ok((1, vec![])), Ok((200, vec![7; 5000]))],
            "every frame opens, in order"
        );
        // The other direction has its own key: a frame reflected back to its sender does not open.
        let back = sealed_frames(&mut sw, &[(10, b"reply")]);
        assert_eq!(read_all(&mut cr, &back[0]), vec![Ok((10, b"reply".to_vec()))]);
        let (mut cw2, mut cr2, _, _) = pair(b"0123456789abcdef-secret", b"nonces");
        let reflected = sealed_frames(&mut cw2, &[(10, b"reply")]);
        assert!(matches!(read_all(&mut cr2, &reflected[0])[0], Err(ref e) if e.contains("Tampered")));
    }

    #[test]
    fn a_changed_byte_anywhere_in_a_sealed_frame_is_detected() {
        let (mut cw, _, _, _) = pair(b"0123456789abcdef-secret", b"nonces");
        let frame = sealed_frames(&mut cw, &[(10, b"hello, sealed world")]).remove(0);
        for pos in 0..frame.len() {
            let mut bytes = frame.clone();
            bytes[pos] ^= 0x01;
            let (_, _, _, mut sr) = pair(b"0123456789abcdef-secret", b"nonces");
            let got = read_all(&mut sr, &bytes);
            // The header's checks (magic, version, reserved, length) catch some bytes before the
            // cipher does; the kind and everything after the header only the tag catches.
            assert_eq!(got.len(), 1, "byte {pos}: {got:?}");
            let err = got[0].as_ref().expect_err(&format!("byte {pos} changed and the frame still opened"));
            if (6..=6).contains(&pos) || pos >= HEADER_BYTES {
                assert!(err.contains("Tampered"), "byte {pos}: {err}");
            }
        }
    }

    #[test]
    fn replayed_dropped_reordered_and_injected_frames_are_detected() {
        let secret = b"0123456789abcdef-secret";
        let messages: Vec<(u8, &[u8])> = vec![(10, b"zero"), (10, b"one"), (10, b"two")];
        let (mut cw, _, _, _) = pair(secret, b"nonces");
        let f = sealed_frames(&mut cw, &messages);
        let open = |bytes: Vec<u8>| {
            let (_, _, _, mut sr) = pair(secret, b"nonces");
            read_all(&mut sr, &bytes)
        };
        let tampered = |r: &Result<(u8, Vec<u8>), String>| matches!(r, Err(e) if e.contains("Tampered"));
        // Replayed: frame 0 twice.
        let got = open([f[0].clone(), f[0].clone()].concat());
        assert!(got[0].is_ok() && tampered(&got[1]), "replay: {got:?}");
        // Dropped: frame 1 never arrives.
        let got = open([f[0].clone(), f[2].clone()].concat());
        assert!(got[0].is_ok() && tampered(&got[1]), "drop: {got:?}");
        // Reordered.
        let got = open([f[1].clone(), f[0].clone()].concat());
        assert!(tampered(&got[0]) && got.len() == 1, "reorder: {got:?}");
        // Injected: a plain frame, and a frame sealed under another connection's keys.
        let mut plain = Vec::new();
        write_frame(&mut plain, 10, b"injected").unwrap();
        let got = open([f[0].clone(), plain].concat());
        assert!(got[0].is_ok() && tampered(&got[1]), "plain injection: {got:?}");
        let (mut other, _, _, _) = pair(secret, b"other nonces");
        let foreign = sealed_frames(&mut other, &[(10, b"zero")]);
        let got = open(foreign[0].clone());
        assert!(tampered(&got[0]), "another connection's frame: {got:?}");
        // After a failure, the reader stays failed even for the frame it expected.
        let (_, _, _, mut sr) = pair(secret, b"nonces");
        let mut payload = Vec::new();
        assert!(sr.read(&mut Cursor::new(&f[1]), &mut payload).is_err());
        let again = sr.read(&mut Cursor::new(&f[0]), &mut payload).unwrap_err();
        assert!(matches!(again, WireError::Tampered { frame: 0 }), "{again:?}");
        assert!(again.is_integrity() && !again.is_closed());
        // All frames, in order, open.
        assert!(open(f.concat()).iter().all(|r| r.is_ok()));
    }

    #[test]
    fn a_truncated_sealed_frame_is_an_error_not_a_message() {
        let (mut cw, _, _, _) = pair(b"0123456789abcdef-secret", b"nonces");
        let frame = sealed_frames(&mut cw, &[(10, b"hello")]).remove(0);
        for cut in 1..frame.len() {
            let (_, _, _, mut sr) = pair(b"0123456789abcdef-secret", b"nonces");
            let got = read_all(&mut sr, &frame[..cut]);
            assert!(matches!(&got[..], [Err(e)] if e.contains("Truncated")), "cut at {cut}: {got:?}");
        }
        // A frame shorter than a tag cannot be sealed: it is refused, not read past.
        let mut short = Vec::new();
        write_frame(&mut short, 10, &[0; TAG_BYTES - 1]).unwrap();
        let (_, _, _, mut sr) = pair(b"0123456789abcdef-secret", b"nonces");
        assert!(matches!(&read_all(&mut sr, &short)[..], [Err(e)] if e.contains("Tampered")));
    }

    #[test]
    fn the_frame_limit_counts_the_message_not_the_tag() {
        let (mut cw, _, _, _) = pair(b"0123456789abcdef-secret", b"s");
        let f = sealed_frames(&mut cw, &[(1, &[0; 100]), (1, &[0; 101])]);
        let (_, _, _, mut sr) = pair(b"0123456789abcdef-secret", b"s");
        sr.set_max_frame_bytes(100);
        let got = read_all(&mut sr, &f.concat());
        assert!(got[0].is_ok(), "{got:?}");
        assert!(matches!(&got[1], Err(e) if e.contains("TooLarge")), "{got:?}");
    }

    #[test]
    fn random_bytes_never_panic_a_sealed_reader() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut cw, _, _, _) = pair(b"0123456789abcdef-secret", b"fuzz");
        let good = sealed_frames(&mut cw, &[(10, b"a real frame to mutate"), (10, b"and another")]).concat();
        for i in 0..20_000 {
            let bytes: Vec<u8> = if i % 2 == 0 {
                let len = (next() % 120) as usize;
                let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                if b.len() >= 12 && i % 4 == 0 {
                    b[..12].copy_from_slice(&header(10, (next() % 64) as u32));
                }
                b
            } else {
                let mut b = good.clone();
                for _ in 0..=(next() % 3) {
                    let p = (next() as usize) % b.len();
                    b[p] = next() as u8;
                }
                b.truncate((next() as usize) % (good.len() + 1));
                b
            };
            let (_, _, _, mut sr) = pair(b"0123456789abcdef-secret", b"fuzz");
            let got = read_all(&mut sr, &bytes);
            // Only the unchanged prefix of real frames may open.
            for r in got.iter().flatten() {
                assert!(r.1 == b"a real frame to mutate" || r.1 == b"and another", "forged message opened: {r:?}");
            }
        }
    }

    #[test]
    fn writing_a_sealed_frame_is_one_write_and_no_flush() {
        struct CountWrites(Vec<usize>, usize);
        impl Write for CountWrites {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.push(buf.len());
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                self.1 += 1;
                Ok(())
            }
        }
        let (mut cw, _, _, _) = pair(b"0123456789abcdef-secret", b"s");
        let mut w = CountWrites(vec![], 0);
        cw.write(&mut w, 1, &[0; 100]).unwrap();
        cw.write(&mut w, 1, &[0; 3 << 20]).unwrap();
        assert_eq!(w.0, vec![HEADER_BYTES + 100 + TAG_BYTES, HEADER_BYTES + (3 << 20) + TAG_BYTES]);
        assert_eq!(w.1, 0);
        let scratch = cw.seal.as_ref().unwrap().buf.capacity();
        assert!(scratch <= SCRATCH_KEEP_BYTES, "a large frame's scratch buffer is not kept: {scratch}");
    }

    #[test]
    fn plain_writers_and_readers_are_the_framing_alone() {
        let mut w = FrameWriter::plain();
        assert!(!w.is_sealed());
        let mut out = Vec::new();
        w.write(&mut out, 3, b"plain").unwrap();
        let mut expected = Vec::new();
        write_frame(&mut expected, 3, b"plain").unwrap();
        assert_eq!(out, expected);
        assert_eq!(read_all(&mut FrameReader::plain(MAX), &out), vec![Ok((3, b"plain".to_vec()))]);
    }

    #[test]
    fn auto_seals_unless_both_ends_are_loopback() {
        let lo4: IpAddr = Ipv4Addr::LOCALHOST.into();
        let lo4b: IpAddr = Ipv4Addr::new(127, 0, 0, 2).into();
        let lo6: IpAddr = Ipv6Addr::LOCALHOST.into();
        let mapped: IpAddr = Ipv4Addr::LOCALHOST.to_ipv6_mapped().into();
        let lan: IpAddr = Ipv4Addr::new(10, 1, 2, 3).into();
        for (a, b) in [(lo4, lo4), (lo4, lo4b), (lo6, lo6), (mapped, lo4)] {
            assert!(!FrameProtection::Auto.resolve(a, b), "{a} {b}");
            assert!(FrameProtection::On.resolve(a, b));
        }
        for (a, b) in [(lan, lo4), (lo4, lan), (lan, lan)] {
            assert!(FrameProtection::Auto.resolve(a, b), "{a} {b}");
            assert!(!FrameProtection::Off.resolve(a, b));
        }
        for p in [FrameProtection::Auto, FrameProtection::On, FrameProtection::Off] {
            assert_eq!(p.to_string().parse::<FrameProtection>().unwrap(), p);
            assert_eq!(FrameProtection::from_byte(p.to_byte()), Some(p));
        }
        assert!("yes".parse::<FrameProtection>().unwrap_err().contains("auto"));
        assert_eq!(FrameProtection::from_byte(9), None);
    }
}
