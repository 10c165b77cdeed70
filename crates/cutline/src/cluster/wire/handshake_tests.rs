//! Tests of the handshake: both secrets and protections agreeing or not, impostors, garbage, the
//! whole-handshake deadline, and the frames of an established connection.

use super::*;
use std::io::Cursor;
use std::net::TcpListener;
use std::thread;

const OFF: Protection = (FrameProtection::Off, false);
const ON: Protection = (FrameProtection::On, true);

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

fn client(c: &mut TcpStream, s: &Secret, p: FrameProtection, hello: &[u8]) -> Result<Established, WireError> {
    handshake_client(c, s, p, hello, 1024)
}

fn server(c: &mut TcpStream, s: &Secret, p: FrameProtection, hello: &[u8]) -> Result<Established, WireError> {
    handshake_server(c, s, p, hello, 1024)
}

#[test]
fn handshake_with_the_same_secret_succeeds_both_ways_sealed_or_not() {
    for (setting, sealed) in
        [(FrameProtection::Off, false), (FrameProtection::On, true), (FrameProtection::Auto, false)]
    {
        let (c, sv) = run_pair(
            move |c| {
                let mut est = client(c, &secret(7), setting, b"client says hi")?;
                assert_eq!(c.read_timeout().unwrap(), None, "timeouts are restored");
                assert_eq!(c.write_timeout().unwrap(), None, "timeouts are restored");
                assert_eq!(est.writer.is_sealed(), sealed, "{setting}");
                // The connection is usable afterwards, in both directions.
                est.writer.write(c, 1, b"first data frame")?;
                let mut payload = Vec::new();
                let kind = est.reader.read(c, &mut payload)?;
                Ok::<_, WireError>((est.hello, kind, payload))
            },
            move |s| {
                let mut est = server(s, &secret(7), setting, b"server says hello")?;
                assert_eq!(s.read_timeout().unwrap(), None, "timeouts are restored");
                let mut payload = Vec::new();
                let kind = est.reader.read(s, &mut payload)?;
                est.writer.write(s, 2, b"reply")?;
                Ok::<_, WireError>((est.hello, kind, payload))
            },
        );
        let (server_hello, kind, payload) = c.unwrap();
        assert_eq!(server_hello, b"server says hello");
        assert_eq!((kind, payload.as_slice()), (2, &b"reply"[..]));
        let (client_hello, kind, payload) = sv.unwrap();
        assert_eq!(client_hello, b"client says hi");
        assert_eq!((kind, payload.as_slice()), (1, &b"first data frame"[..]));
    }
    // Empty hellos work too.
    let (c, s) = run_pair(
        |c| client(c, &secret(7), FrameProtection::On, b""),
        |s| server(s, &secret(7), FrameProtection::On, b""),
    );
    assert_eq!(c.unwrap().hello, b"");
    assert_eq!(s.unwrap().hello, b"");
}

#[test]
fn a_sealed_connection_detects_a_byte_changed_on_the_way() {
    // client <-> proxy <-> server; the proxy flips one byte of the first frame after the handshake.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server_thread = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut est = server(&mut s, &secret(7), FrameProtection::On, b"")?;
        let mut payload = Vec::new();
        est.reader.read(&mut s, &mut payload)
    });
    let (mut c, mut to_proxy) = tcp_pair();
    let mut up = TcpStream::connect(addr).unwrap();
    let mut down = up.try_clone().unwrap();
    let mut back = to_proxy.try_clone().unwrap();
    thread::spawn(move || io::copy(&mut down, &mut back));
    thread::spawn(move || {
        // Handshake response (12-byte header + 66 + hello 0), then one data frame: flip its last byte.
        let mut buf = vec![0u8; 12 + 66];
        to_proxy.read_exact(&mut buf).unwrap();
        up.write_all(&buf).unwrap();
        let mut frame = vec![0u8; 12 + 5 + 16];
        to_proxy.read_exact(&mut frame).unwrap();
        *frame.last_mut().unwrap() ^= 0x80;
        up.write_all(&frame).unwrap();
    });
    let mut est = client(&mut c, &secret(7), FrameProtection::On, b"").unwrap();
    est.writer.write(&mut c, 1, b"hello").unwrap();
    let err = server_thread.join().unwrap().unwrap_err();
    assert!(matches!(err, WireError::Tampered { frame: 0 }), "{err:?}");
    assert!(err.to_string().contains("integrity"), "{err}");
}

#[test]
fn a_client_with_the_wrong_secret_is_rejected_with_a_typed_error() {
    let (c, s) = run_pair(
        |c| client(c, &secret(1), FrameProtection::Off, b"hello"),
        |s| server(s, &secret(2), FrameProtection::Off, b"hello"),
    );
    let s = s.err().unwrap();
    assert!(matches!(&s, WireError::Auth(m) if m.contains("wrong cluster secret")), "{s:?}");
    let c = c.err().unwrap();
    assert!(matches!(c, WireError::WrongSecret), "{c:?}");
    assert!(c.is_permanent() && c.to_string().contains("rejected"), "{c}");
    // A wrong secret is reported as such even when the protection differs too.
    let (c, _) = run_pair(
        |c| client(c, &secret(1), FrameProtection::On, b"hello"),
        |s| server(s, &secret(2), FrameProtection::Off, b"hello"),
    );
    assert!(matches!(c, Err(WireError::WrongSecret)), "{:?}", c.err());
}

#[test]
fn different_frame_protection_is_refused_on_both_sides_with_both_settings_named() {
    let (c, s) = run_pair(
        |c| client(c, &secret(1), FrameProtection::On, b""),
        |s| server(s, &secret(1), FrameProtection::Auto, b""),
    );
    let (c, s) = (c.err().unwrap(), s.err().unwrap());
    for (e, ours, theirs) in [(&c, ON, (FrameProtection::Auto, false)), (&s, (FrameProtection::Auto, false), ON)] {
        assert!(
            matches!(e, WireError::ProtectionMismatch { ours: o, theirs: t } if *o == ours && *t == theirs),
            "{e:?}"
        );
        assert!(e.is_permanent());
    }
    let text = c.to_string();
    assert!(
        text.contains("this process seals frames (frame protection on)")
            && text.contains("the peer does not seal frames (frame protection auto)")
            && text.contains("--frame-protection"),
        "{text}"
    );
    // `on` and `auto` agree where auto seals, `off` and `auto` where it does not (loopback here).
    let (c, s) = run_pair(
        |c| client(c, &secret(1), FrameProtection::Off, b""),
        |s| server(s, &secret(1), FrameProtection::Auto, b""),
    );
    assert!(c.is_ok() && s.is_ok());
}

/// An impostor's ACCEPT from (challenge, client nonce, rest of the client's response).
type Forge = fn(&[u8], &[u8], &[u8]) -> Vec<u8>;

#[test]
fn a_server_without_the_secret_is_detected_by_the_client() {
    // A real server with another secret rejects the client first.
    let (c, _) = run_pair(
        |c| client(c, &secret(1), FrameProtection::Off, b"hello"),
        |s| server(s, &secret(3), FrameProtection::Off, b"hello"),
    );
    assert!(matches!(c, Err(WireError::WrongSecret)), "{:?}", c.err());

    // An impostor that accepts anyone cannot prove it holds the secret.
    let impostor = |forge: Forge| {
        move |s: &mut TcpStream| -> Result<(), WireError> {
            let mut challenge = vec![9u8; NONCE_BYTES];
            challenge.extend_from_slice(&protection_bytes(OFF));
            write_frame(s, KIND_CHALLENGE, &challenge)?;
            let mut payload = Vec::new();
            assert_eq!(read_frame(s, 1024, &mut payload)?, KIND_RESPONSE);
            let accept = forge(&challenge, &payload[..NONCE_BYTES], &payload[NONCE_BYTES + MAC_BYTES..]);
            write_frame(s, KIND_ACCEPT, &accept)?;
            Ok(())
        }
    };
    // A proof made with another secret.
    let (c, s) = run_pair(
        |c| client(c, &secret(1), FrameProtection::Off, b"hello"),
        impostor(|ch, cn, rest| {
            secret(4).mac_over(SERVER_LABEL, &[ch, cn, &rest[..2], &rest[2..], b""]).finalize().into_bytes().to_vec()
        }),
    );
    s.unwrap();
    let c = c.err().unwrap();
    assert!(matches!(c, WireError::PeerWithoutSecret) && c.is_permanent(), "{c:?}");
    assert!(c.to_string().contains("does not hold the cluster secret"), "{c}");
    // A proof from the right secret over another server hello does not verify either.
    let (c, _) = run_pair(
        |c| client(c, &secret(1), FrameProtection::Off, b"hello"),
        impostor(|ch, cn, rest| {
            let mut a = secret(1)
                .mac_over(SERVER_LABEL, &[ch, cn, &rest[..2], &rest[2..], b"real"])
                .finalize()
                .into_bytes()
                .to_vec();
            a.extend_from_slice(b"fake");
            a
        }),
    );
    assert!(matches!(c, Err(WireError::PeerWithoutSecret)), "{:?}", c.err());
}

#[test]
fn a_client_sending_garbage_gets_an_error_not_a_panic() {
    // Not a frame at all.
    let (_, s) = run_pair(
        |c| {
            let mut payload = Vec::new();
            let kind = read_frame(c, 1024, &mut payload).unwrap();
            assert_eq!((kind, payload.len()), (KIND_CHALLENGE, CHALLENGE_BYTES));
            c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        },
        |s| server(s, &secret(1), FrameProtection::Off, b"hello"),
    );
    let s = s.err().unwrap();
    assert!(matches!(s, WireError::BadMagic(m) if &m == b"GET "), "{s:?}");

    // A frame of the wrong kind, then a response too short to hold a proof.
    for (kind, body) in [(1u8, vec![0u8; 80]), (KIND_RESPONSE, vec![0u8; 10])] {
        let (c, s) = run_pair(
            move |c| {
                let mut payload = Vec::new();
                read_frame(c, 1024, &mut payload).unwrap();
                write_frame(c, kind, &body).unwrap();
                let k = read_frame(c, 1024, &mut payload);
                (k.ok(), payload)
            },
            |s| server(s, &secret(1), FrameProtection::Off, b"hello"),
        );
        assert!(matches!(s, Err(WireError::Auth(_))), "{:?}", s.err());
        assert_eq!(c.0, Some(KIND_REJECT), "the client is told why");
    }

    // A client that sends nothing times out.
    let (_, s) = run_pair(
        |_c| thread::sleep(Duration::from_millis(300)),
        |s| within(s, Duration::from_millis(50), |s| server_over(s, &secret(1), OFF, b"", 1024)),
    );
    let s = s.err().unwrap();
    assert!(matches!(&s, WireError::Io(e) if e.kind() == ErrorKind::TimedOut), "{s:?}");
}

#[test]
fn a_peer_trickling_bytes_is_cut_off_at_the_handshake_deadline() {
    // The client sends its response one byte every 40 ms: every single read is quick, but the whole
    // response (78 bytes) would take more than 3 s. The server gives the whole handshake 400 ms.
    let deadline = Duration::from_millis(400);
    let (_, s) = run_pair(
        |c| {
            let mut payload = Vec::new();
            read_frame(c, 1024, &mut payload).unwrap();
            let started = Instant::now();
            let mut response = Vec::new();
            write_frame(&mut response, KIND_RESPONSE, &[0u8; NONCE_BYTES + MAC_BYTES + 2]).unwrap();
            for b in response {
                if c.write_all(&[b]).is_err() || started.elapsed() > Duration::from_secs(5) {
                    break;
                }
                thread::sleep(Duration::from_millis(40));
            }
        },
        move |s| {
            let started = Instant::now();
            let r = within(s, deadline, |s| server_over(s, &secret(1), OFF, b"", 1024));
            (r, started.elapsed())
        },
    );
    let (r, took) = s;
    let e = r.err().unwrap();
    assert!(matches!(&e, WireError::Io(io) if io.kind() == ErrorKind::TimedOut), "{e:?}");
    assert!(e.to_string().contains("within 400 ms"), "{e}");
    assert!(took < deadline + Duration::from_millis(300), "the handshake held its slot for {took:?}");
}

#[test]
fn a_reject_reason_is_bounded_and_sanitized() {
    let mut payload = vec![REJECT_OTHER];
    payload.extend_from_slice(&[b'x'; 1000]);
    let mut wire = Vec::new();
    write_frame(&mut wire, KIND_REJECT, &payload).unwrap();
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
    let err = client_over(&mut Duplex(Cursor::new(wire), vec![]), &secret(1), OFF, b"", 1024).err().unwrap();
    let WireError::Auth(text) = err else { panic!("{err:?}") };
    assert!(text.starts_with("rejected by the server: xxx") && text.len() < 300, "{text}");

    assert_eq!(sanitize_reason(b"bad\x1b[31m\n"), "bad?[31m?");
    assert_eq!(sanitize_reason(b""), "no reason given");
    assert!(matches!(rejected(&[], None), WireError::Auth(_)));
    assert!(matches!(rejected(&[REJECT_SECRET], None), WireError::WrongSecret));
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
    let (c, sv) = run_pair(
        |c| client(c, &Secret::new(b"another-secret-cluster-key".to_vec()).unwrap(), FrameProtection::On, b""),
        move |sv| server(sv, &s, FrameProtection::On, b""),
    );
    for text in [c.err().unwrap().to_string(), sv.err().unwrap().to_string()] {
        assert!(!text.contains("secret-cluster-key"), "{text}");
    }
}
