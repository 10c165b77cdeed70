//! The admin socket's client: send one request line, read the whole answer within a bound.

use super::server::check_path;
use super::REQUEST_READ_TIMEOUT;
use super::{AdminError, DEFAULT_ANSWER_TIMEOUT, MAX_ANSWER_BYTES, MAX_REQUEST_BYTES, QUICK_ANSWER_TIMEOUT};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Send one request line to the job serving `socket` and return its whole answer (starting with `ok`
/// or `error:`), waiting at most [`answer_timeout`] for it.
pub fn request(socket: &Path, line: &str) -> Result<String, AdminError> {
    request_with_timeout(socket, line, answer_timeout(line))
}

/// How long [`request`] waits for the answer to `line`: [`DEFAULT_ANSWER_TIMEOUT`] for a savepoint
/// (it is taken and exported before the answer), [`QUICK_ANSWER_TIMEOUT`] for anything else.
pub fn answer_timeout(line: &str) -> Duration {
    match line.split_whitespace().next() {
        Some("savepoint" | "stop-with-savepoint") => DEFAULT_ANSWER_TIMEOUT,
        _ => QUICK_ANSWER_TIMEOUT,
    }
}

/// [`request`], turning an `error: <reason>` answer into [`AdminError::Refused`] and returning what
/// follows `ok` otherwise (without the `ok` and the separator after it).
pub fn request_ok(socket: &Path, line: &str) -> Result<String, AdminError> {
    let a = request(socket, line)?;
    if let Some(reason) = a.strip_prefix("error:") {
        return Err(AdminError::Refused(reason.trim().to_string()));
    }
    match a.strip_prefix("ok") {
        Some(rest) if rest.is_empty() || rest.starts_with([' ', '\n']) => {
            Ok(rest.strip_prefix([' ', '\n']).unwrap_or(rest).trim_end().to_string())
        }
        _ => Err(AdminError::BadAnswer {
            socket: socket.to_path_buf(),
            reason: format!("it starts with neither ok nor error: {:?}", a.lines().next().unwrap_or("")),
        }),
    }
}

/// [`request`] with another answer timeout.
pub fn request_with_timeout(socket: &Path, line: &str, timeout: Duration) -> Result<String, AdminError> {
    check_path(socket)?;
    if line.contains(['\n', '\r']) {
        return Err(AdminError::BadRequest("a request is one line".into()));
    }
    if line.len() + 1 > MAX_REQUEST_BYTES {
        return Err(AdminError::BadRequest(format!("request longer than {MAX_REQUEST_BYTES} bytes")));
    }
    let io = |what: &'static str| move |source| AdminError::Io { socket: socket.to_path_buf(), what, source };
    let mut stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
            return Err(AdminError::NotRunning { socket: socket.to_path_buf() })
        }
        Err(e) => return Err(io("connect")(e)),
    };
    let timed_out = |e: &std::io::Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
    stream.set_write_timeout(Some(REQUEST_READ_TIMEOUT)).map_err(io("set a timeout"))?;
    stream.set_read_timeout(Some(timeout)).map_err(io("set a timeout"))?;
    let mut msg = line.as_bytes().to_vec();
    msg.push(b'\n');
    if let Err(e) = stream.write_all(&msg) {
        // A server that answered without reading (busy) closes early: read what it said.
        if timed_out(&e) {
            return Err(AdminError::Timeout { socket: socket.to_path_buf(), after: REQUEST_READ_TIMEOUT });
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    match (&mut stream).take(MAX_ANSWER_BYTES as u64).read_to_end(&mut answer) {
        Ok(_) => {}
        Err(e) if timed_out(&e) => return Err(AdminError::Timeout { socket: socket.to_path_buf(), after: timeout }),
        Err(e) if e.kind() == ErrorKind::ConnectionReset && !answer.is_empty() => {}
        Err(e) => return Err(io("read the answer")(e)),
    }
    if answer.is_empty() {
        return Err(AdminError::BadAnswer {
            socket: socket.to_path_buf(),
            reason: "the connection closed without an answer (the job may have ended)".into(),
        });
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}
