//! A worker's connections to its peers: reaching an address within a timeout, and accepting the
//! data links other workers open to this one (each handshake on its own thread, at most
//! `MAX_PENDING_HANDSHAKES` at once), held until the deployment they belong to takes them.

use super::admit::MAX_PENDING_HANDSHAKES;
use super::proto::{self, DataHello};
use super::wire::{self, FrameProtection, FrameReader, FrameWriter, Secret};
use cutline_core::Generation;
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A data link that arrived from another worker: its connection and frames.
pub(crate) type InboundLink = (TcpStream, FrameWriter, FrameReader);
/// Data links arriving from other workers, until the deployment they belong to takes them.
pub(crate) type Inbound = Arc<(Mutex<HashMap<(Generation, u32, u32), InboundLink>>, Condvar)>;

/// How long one attempt to reach the coordinator may take (a cut-off network drops packets silently).
const CONNECT_TIMEOUT_MS: u64 = 2_000;

pub(crate) fn connect(addr: &str) -> std::io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr} resolves to no address"));
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, Duration::from_millis(CONNECT_TIMEOUT_MS)) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

pub(crate) fn accept_links(listener: TcpListener, secret: Secret, protection: FrameProtection, inbound: Inbound) {
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        if pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES {
            pending.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(
                event = "connection_refused",
                peer = %peer,
                "refused a data connection from {peer}: too many handshakes in progress"
            );
            continue;
        }
        let (inbound, secret, pending) = (inbound.clone(), secret.clone(), pending.clone());
        // Handshakes run on their own thread: a slow or hostile peer cannot hold up the others.
        let _ = std::thread::Builder::new().name("cutline-data-handshake".into()).spawn(move || {
            // The frame limit is the job's, set when a deployment takes the link.
            let hello = wire::handshake_server(&mut stream, &secret, protection, b"", wire::DEFAULT_MAX_FRAME_BYTES)
                .and_then(|est| proto::decode::<DataHello>(&est.hello).map(|h| (h, est)));
            pending.fetch_sub(1, Ordering::SeqCst);
            let (hello, est) = match hello {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(
                        event = "connection_refused",
                        peer = %peer,
                        reason = %e,
                        "refused a data connection from {peer}: {e}"
                    );
                    return;
                }
            };
            // Keyed by its addressee too: the deployment takes only links addressed to this worker's
            // id under its current coordinator (a link for a stale address is never used).
            let (map, cv) = &*inbound;
            let mut m = map.lock().expect("inbound links");
            // Links of generations older than this one will never be taken.
            m.retain(|(g, _, _), _| *g >= hello.generation);
            m.insert((hello.generation, hello.from, hello.to), (stream, est.writer, est.reader));
            cv.notify_all();
        });
    }
}
