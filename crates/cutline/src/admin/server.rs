//! The admin socket's server: binding the socket file (refusing when another live job answers there,
//! replacing a stale file), accepting a bounded number of connections, and answering one request each.

use super::client::request_with_timeout;
use super::protocol::answer;
use super::{AdminError, ACCEPT_POLL, ANSWER_WRITE_TIMEOUT, DRAIN_TIMEOUT, MAX_CONNECTIONS, MAX_REQUEST_BYTES};
use super::{PROBE_TIMEOUT, REQUEST_READ_TIMEOUT, SUN_PATH_BYTES};
use crate::runtime::JobControl;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    let bound = file_id(socket);
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

fn accept_loop(listener: UnixListener, control: JobControl, stop: Arc<AtomicBool>) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                handlers.retain(|h| !h.is_finished());
                if handlers.len() >= MAX_CONNECTIONS {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
                    let _ = (&stream).write_all(b"error: busy: too many admin requests in progress; try again\n");
                    continue;
                }
                let control = control.clone();
                match std::thread::Builder::new()
                    .name("cutline-admin-req".into())
                    .spawn(move || handle_connection(stream, &control))
                {
                    Ok(h) => handlers.push(h),
                    Err(_) => std::thread::sleep(ACCEPT_POLL), // the stream is dropped: the client sees EOF
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            // Out of descriptors and the like: wait and carry on.
            Err(_) => std::thread::sleep(ACCEPT_POLL),
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

fn handle_connection(mut stream: UnixStream, control: &JobControl) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(ANSWER_WRITE_TIMEOUT));
    let mut text = match read_request(&mut stream) {
        Ok(line) => answer(control, &line),
        Err(e) => format!("error: {e}"),
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let _ = stream.write_all(text.as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Read one request line: up to the first newline (or the end of the stream), at most
/// [`MAX_REQUEST_BYTES`], within [`REQUEST_READ_TIMEOUT`] in total.
pub(super) fn read_request(stream: &mut UnixStream) -> Result<String, String> {
    let deadline = Instant::now() + REQUEST_READ_TIMEOUT;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no complete request line within {} s", REQUEST_READ_TIMEOUT.as_secs()));
        }
        let _ = stream.set_read_timeout(Some(left));
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(format!("no complete request line within {} s", REQUEST_READ_TIMEOUT.as_secs()))
            }
            Err(e) => return Err(format!("reading the request: {e}")),
        };
        let end = chunk[..n].iter().position(|b| *b == b'\n');
        buf.extend_from_slice(&chunk[..end.map(|p| p + 1).unwrap_or(n)]);
        if buf.len() > MAX_REQUEST_BYTES {
            return Err(format!("request longer than {MAX_REQUEST_BYTES} bytes"));
        }
        if end.is_some() || n == 0 {
            break;
        }
    }
    if buf.is_empty() {
        return Err("empty request: try help".into());
    }
    String::from_utf8(buf).map_err(|_| "the request is not UTF-8".to_string())
}

// ---------------------------------------------------------------------------------------------------
// Client.
