//! The admin socket's server: binding the socket file owner-only (refusing when another live job
//! answers there, replacing a stale file), checking who connects, reading request lines in the accept
//! loop (idle connections never hold a handler) and answering each complete one on a bounded pool
//! of handler threads.

use super::client::request_with_timeout;
use super::peer;
use super::protocol::answer;
use super::{AdminError, ACCEPT_POLL, ANSWER_WRITE_TIMEOUT, DRAIN_TIMEOUT, MAX_CONNECTIONS, MAX_REQUEST_BYTES};
use super::{FIRST_BYTE_TIMEOUT, MAX_WAITING_CONNECTIONS, PROBE_TIMEOUT, REQUEST_READ_TIMEOUT, SUN_PATH_BYTES};
use crate::runtime::JobControl;
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Mode of the socket file: the job's own user only.
const SOCKET_MODE: u32 = 0o600;

/// A running admin endpoint. Dropping it stops accepting, waits (boundedly) for requests in progress
/// to be answered, and removes the socket file if it is still the one it bound.
pub struct AdminServer {
    socket: PathBuf,
    /// (device, inode) of the socket file this server bound.
    file_id: Option<(u64, u64)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AdminServer {
    /// Where the server listens.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Another job that started after this one ended may have replaced the file: leave that one.
        if self.file_id.is_some() && file_id(&self.socket) == self.file_id {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

pub(super) fn check_path(socket: &Path) -> Result<(), AdminError> {
    let len = socket.as_os_str().len();
    if len >= SUN_PATH_BYTES {
        return Err(AdminError::PathTooLong { path: socket.to_path_buf(), len, max: SUN_PATH_BYTES - 1 });
    }
    Ok(())
}

/// Serve `control` on `socket` from a background thread. Refuses when another live job answers on
/// that socket; replaces a stale socket file (left by a process that died, or by a job that has ended);
/// never removes anything that is not a socket.
pub fn serve(control: JobControl, socket: &Path) -> Result<AdminServer, AdminError> {
    check_path(socket)?;
    let io = |what: &'static str| move |source| AdminError::Io { socket: socket.to_path_buf(), what, source };
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => {
            if probe_live(socket) {
                return Err(AdminError::AlreadyServing { socket: socket.to_path_buf() });
            }
            match std::fs::remove_file(socket) {
                Err(e) if e.kind() != ErrorKind::NotFound => return Err(io("remove the stale socket file")(e)),
                _ => {}
            }
        }
        Ok(_) => return Err(AdminError::NotASocket { path: socket.to_path_buf() }),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io("inspect the socket path")(e)),
    }
    let listener = match UnixListener::bind(socket) {
        Ok(l) => l,
        // Someone bound it between the check and here.
        Err(e) if e.kind() == ErrorKind::AddrInUse => {
            return Err(AdminError::AlreadyServing { socket: socket.to_path_buf() })
        }
        Err(e) => return Err(io("bind")(e)),
    };
    // Owner-only at once; a peer that connected in between is still checked at accept.
    let bound = file_id(socket);
    if let Err(e) = std::fs::set_permissions(socket, std::fs::Permissions::from_mode(SOCKET_MODE)) {
        let _ = std::fs::remove_file(socket);
        return Err(io("make the socket file owner-only")(e));
    }
    listener.set_nonblocking(true).map_err(io("make the listener non-blocking"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("cutline-admin".into())
        .spawn(move || accept_loop(listener, control, stop2))
        .map_err(io("start the admin thread"))?;
    Ok(AdminServer { socket: socket.to_path_buf(), file_id: bound, stop, thread: Some(thread) })
}

/// Does a live job answer on `socket`? Only a refused connection, a missing file, or a server saying
/// its job has ended count as "no": anything else that accepts a connection is left alone.
pub(super) fn probe_live(socket: &Path) -> bool {
    match request_with_timeout(socket, "ping", PROBE_TIMEOUT) {
        Ok(a) => a.starts_with("ok"),
        Err(AdminError::NotRunning { .. }) => false,
        Err(_) => true,
    }
}

/// A connection whose request line is not complete yet.
struct Waiting {
    stream: UnixStream,
    line: Vec<u8>,
    accepted: Instant,
}

/// What reading a waiting connection came to.
enum Read1 {
    More,
    Line(String),
    Refuse(String),
}

fn accept_loop(listener: UnixListener, control: JobControl, stop: Arc<AtomicBool>) {
    let own = peer::own_uid();
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        wait_readable(&listener, &waiting, ACCEPT_POLL);
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(why) = peer::check(&stream, own) {
                        tracing::warn!(event = "admin_refused", reason = %why, "admin socket: {why}");
                        refuse(&stream, &why);
                        continue;
                    }
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if waiting.len() >= MAX_WAITING_CONNECTIONS {
                        if let Some(old) = waiting.pop_front() {
                            refuse(
                                &old.stream,
                                "too many connections wait without a request; send the request at once",
                            );
                        }
                    }
                    waiting.push_back(Waiting { stream, line: Vec::new(), accepted: Instant::now() });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // Out of descriptors and the like: serve those waiting, accept again later.
                Err(_) => break,
            }
        }
        let mut i = 0;
        while i < waiting.len() {
            match read_some(&mut waiting[i]) {
                Read1::More => i += 1,
                Read1::Line(line) => {
                    let w = waiting.remove(i).expect("in range");
                    dispatch(w.stream, line, &control, &mut handlers);
                }
                Read1::Refuse(why) => {
                    let w = waiting.remove(i).expect("in range");
                    refuse(&w.stream, &why);
                }
            }
        }
    }
    drop(listener);
    // Requests in progress end once the job answers them (or has ended); give them a bounded time.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while handlers.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in handlers.into_iter().filter(|h| h.is_finished()) {
        let _ = h.join();
    }
}

/// Sleep until the listener or a waiting connection is readable, at most `limit`, waking in time for
/// the earliest read deadline of a waiting connection.
fn wait_readable(listener: &UnixListener, waiting: &VecDeque<Waiting>, limit: Duration) {
    peer::poll_readable(
        std::iter::once(listener.as_raw_fd()).chain(waiting.iter().map(|w| w.stream.as_raw_fd())),
        waiting.iter().map(|w| w.accepted + if w.line.is_empty() { FIRST_BYTE_TIMEOUT } else { REQUEST_READ_TIMEOUT }),
        limit,
    )
}

/// Read what `w` sent so far, without blocking.
fn read_some(w: &mut Waiting) -> Read1 {
    let mut chunk = [0u8; 512];
    loop {
        match w.stream.read(&mut chunk) {
            Ok(0) if w.line.is_empty() => return Read1::Refuse("empty request: try help".into()),
            Ok(0) => return finish(std::mem::take(&mut w.line)),
            Ok(n) => {
                let end = chunk[..n].iter().position(|b| *b == b'\n');
                w.line.extend_from_slice(&chunk[..end.map(|p| p + 1).unwrap_or(n)]);
                if w.line.len() > MAX_REQUEST_BYTES {
                    return Read1::Refuse(format!("request longer than {MAX_REQUEST_BYTES} bytes"));
                }
                if end.is_some() {
                    return finish(std::mem::take(&mut w.line));
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let waited = w.accepted.elapsed();
                if w.line.is_empty() && waited >= FIRST_BYTE_TIMEOUT {
                    return Read1::Refuse(format!(
                        "no request within {} ms of connecting",
                        FIRST_BYTE_TIMEOUT.as_millis()
                    ));
                }
                if waited >= REQUEST_READ_TIMEOUT {
                    return Read1::Refuse(format!(
                        "no complete request line within {} s",
                        REQUEST_READ_TIMEOUT.as_secs()
                    ));
                }
                return Read1::More;
            }
            Err(e) => return Read1::Refuse(format!("reading the request: {e}")),
        }
    }
}

fn finish(line: Vec<u8>) -> Read1 {
    match String::from_utf8(line) {
        Ok(l) => Read1::Line(l),
        Err(_) => Read1::Refuse("the request is not UTF-8".into()),
    }
}

/// Answer `error: <why>` (best effort, never blocking the accept loop for long) and close.
fn refuse(stream: &UnixStream, why: &str) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let mut s = stream;
    let _ = s.write_all(format!("error: {why}\n").as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Answer a complete request on a handler thread, or `error: busy` when every handler is taken.
fn dispatch(stream: UnixStream, line: String, control: &JobControl, handlers: &mut Vec<JoinHandle<()>>) {
    handlers.retain(|h| !h.is_finished());
    if handlers.len() >= MAX_CONNECTIONS {
        refuse(&stream, "busy: too many admin requests in progress; try again");
        return;
    }
    let control = control.clone();
    // A thread that cannot start drops the stream: the client sees the connection close.
    if let Ok(h) = std::thread::Builder::new()
        .name("cutline-admin-req".into())
        .spawn(move || handle_connection(stream, &line, &control))
    {
        handlers.push(h);
    }
}

fn handle_connection(mut stream: UnixStream, line: &str, control: &JobControl) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(ANSWER_WRITE_TIMEOUT));
    let mut text = answer(control, line);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let _ = stream.write_all(text.as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Both);
}
