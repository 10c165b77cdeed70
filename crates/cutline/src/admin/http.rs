//! A small, bounded HTTP/1.1 server for a process's metrics, dashboard and health probes: one request
//! per connection (`Connection: close`), requests parsed with `httparse`, answered by a [`Handler`].
//!
//! # Bounds
//!
//! Like the admin socket, a connection waits in the accept loop, not in a handler, until its request
//! is complete: the first byte within [`HTTP_FIRST_BYTE_TIMEOUT`], the whole request (head and body)
//! within [`HTTP_REQUEST_TIMEOUT`] and [`MAX_HTTP_REQUEST_BYTES`]; at most [`MAX_HTTP_WAITING`]
//! connections wait at once (a new one pushes out the oldest). At most [`MAX_HTTP_HANDLERS`] requests
//! are answered at once; more are answered `503`. An answer that the client does not read within
//! [`HTTP_WRITE_TIMEOUT`] is dropped.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest request, head and body.
pub const MAX_HTTP_REQUEST_BYTES: usize = 64 * 1024;
/// Headers a request may have, at most.
pub const MAX_HTTP_HEADERS: usize = 32;
/// Connections whose request is not complete yet, at most; a new one pushes out the oldest.
pub const MAX_HTTP_WAITING: usize = 64;
/// Requests answered at once; more are answered `503 Service Unavailable`.
pub const MAX_HTTP_HANDLERS: usize = 8;
/// The first byte of a request must arrive within this time after the connection is accepted.
pub const HTTP_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(2);
/// The whole request must arrive within this time after the connection is accepted.
pub const HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Writing an answer gives up after this long.
pub const HTTP_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the accept loop looks at its stop flag when nothing stirs.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// One HTTP request, complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string after `?` (empty if none).
    pub query: String,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (lower case), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
    /// The value of query parameter `name`, if present.
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
    }
}

/// An answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: String,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// `status` with a plain-text body.
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response { status, content_type: "text/plain; charset=utf-8".into(), body: body.into().into_bytes() }
    }
    /// `200` with a JSON body.
    pub fn json(body: Vec<u8>) -> Response {
        Response { status: 200, content_type: "application/json".into(), body }
    }
    /// `200` with a body of this type.
    pub fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Response {
        Response { status: 200, content_type: content_type.into(), body: body.into() }
    }
}

/// Answers requests (from up to [`MAX_HTTP_HANDLERS`] threads at once).
pub trait Handler: Send + Sync + 'static {
    /// The answer to `req`.
    fn handle(&self, req: &Request) -> Response;
}

/// What went wrong starting an HTTP endpoint.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The address is not `host:port` (an IP address or `localhost`, and a port).
    #[error("bad HTTP address {addr:?}: {reason}; give host:port, such as 127.0.0.1:9470 or 0.0.0.0:9470 (port 0 picks a free one)")]
    BadAddress {
        /// The address given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Binding failed (the port is taken, or not allowed).
    #[error(
        "cannot listen on {addr}: {source}; pick another address with --http, or turn the endpoint off with --http off"
    )]
    Bind {
        /// The address.
        addr: String,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
}

impl HttpError {
    /// Was the address already taken?
    pub fn is_in_use(&self) -> bool {
        matches!(self, HttpError::Bind { source, .. } if source.kind() == ErrorKind::AddrInUse)
    }
}

/// A running HTTP endpoint. Dropping it stops accepting and waits (boundedly) for requests in
/// progress.
pub struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// The address it listens on (with the port chosen when port 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Parse `host:port` (`localhost` is 127.0.0.1).
pub fn parse_addr(addr: &str) -> Result<SocketAddr, HttpError> {
    let bad = |reason: &str| HttpError::BadAddress { addr: addr.to_string(), reason: reason.to_string() };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port: u16 = port.parse().map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip: std::net::IpAddr = match host {
        "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
        h => h.parse().map_err(|_| bad("the host is not an IP address (or localhost)"))?,
    };
    Ok(SocketAddr::new(ip, port))
}

/// Serve `handler` on `addr` from a background thread.
pub fn serve_http(addr: &str, handler: Arc<dyn Handler>) -> Result<HttpServer, HttpError> {
    let sock = parse_addr(addr)?;
    let bind = |source| HttpError::Bind { addr: addr.to_string(), source };
    let listener = TcpListener::bind(sock).map_err(bind)?;
    let local = listener.local_addr().map_err(bind)?;
    listener.set_nonblocking(true).map_err(bind)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("cutline-http".into())
        .spawn(move || accept_loop(listener, handler, stop2))
        .map_err(bind)?;
    Ok(HttpServer { addr: local, stop, thread: Some(thread) })
}

struct Waiting {
    stream: TcpStream,
    buf: Vec<u8>,
    accepted: Instant,
}

enum Read1 {
    More,
    Done(Request),
    Refuse(u16, String),
}

fn accept_loop(listener: TcpListener, handler: Arc<dyn Handler>, stop: Arc<AtomicBool>) {
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        wait_readable(&listener, &waiting);
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if waiting.len() >= MAX_HTTP_WAITING {
                        if let Some(old) = waiting.pop_front() {
                            refuse(old.stream, 408, "too many connections wait without a complete request");
                        }
                    }
                    waiting.push_back(Waiting { stream, buf: Vec::new(), accepted: Instant::now() });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let mut i = 0;
        while i < waiting.len() {
            match read_some(&mut waiting[i]) {
                Read1::More => i += 1,
                Read1::Done(req) => {
                    let w = waiting.remove(i).expect("in range");
                    dispatch(w.stream, req, &handler, &mut handlers);
                }
                Read1::Refuse(status, why) => {
                    let w = waiting.remove(i).expect("in range");
                    refuse(w.stream, status, &why);
                }
            }
        }
    }
    drop(listener);
    let deadline = Instant::now() + HTTP_WRITE_TIMEOUT;
    while handlers.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_readable(listener: &TcpListener, waiting: &VecDeque<Waiting>) {
    super::peer::poll_readable(
        std::iter::once(listener.as_raw_fd()).chain(waiting.iter().map(|w| w.stream.as_raw_fd())),
        waiting
            .iter()
            .map(|w| w.accepted + if w.buf.is_empty() { HTTP_FIRST_BYTE_TIMEOUT } else { HTTP_REQUEST_TIMEOUT }),
        ACCEPT_POLL,
    )
}

fn read_some(w: &mut Waiting) -> Read1 {
    let mut chunk = [0u8; 4096];
    loop {
        match w.stream.read(&mut chunk) {
            Ok(0) if w.buf.is_empty() => return Read1::Refuse(400, "empty request".into()),
            Ok(0) => return parse(&w.buf, true),
            Ok(n) => {
                w.buf.extend_from_slice(&chunk[..n]);
                if w.buf.len() > MAX_HTTP_REQUEST_BYTES {
                    return Read1::Refuse(413, format!("request longer than {MAX_HTTP_REQUEST_BYTES} bytes"));
                }
                match parse(&w.buf, false) {
                    Read1::More => continue,
                    done => return done,
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let waited = w.accepted.elapsed();
                if (w.buf.is_empty() && waited >= HTTP_FIRST_BYTE_TIMEOUT) || waited >= HTTP_REQUEST_TIMEOUT {
                    return Read1::Refuse(408, "the request did not arrive in time".into());
                }
                return Read1::More;
            }
            Err(e) => return Read1::Refuse(400, format!("reading the request: {e}")),
        }
    }
}

/// A complete request from `buf`, `More` if it is not complete yet (`closed`: the client will send
/// nothing more).
fn parse(buf: &[u8], closed: bool) -> Read1 {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HTTP_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if closed => return Read1::Refuse(400, "incomplete request".into()),
        Ok(httparse::Status::Partial) => return Read1::More,
        Err(e) => return Read1::Refuse(400, format!("malformed request: {e}")),
    };
    let mut length = 0usize;
    let mut out_headers = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(h.value).trim().to_string();
        if name == "transfer-encoding" {
            return Read1::Refuse(411, "chunked bodies are not accepted: send Content-Length".into());
        }
        if name == "content-length" {
            match value.parse::<usize>() {
                Ok(n) if n <= MAX_HTTP_REQUEST_BYTES => length = n,
                _ => return Read1::Refuse(413, "bad or too large Content-Length".into()),
            }
        }
        out_headers.push((name, value));
    }
    let Some(body) = buf.get(head_len..) else { return Read1::Refuse(400, "malformed request".into()) };
    if body.len() < length {
        return if closed {
            Read1::Refuse(400, "the body is shorter than its Content-Length".into())
        } else {
            Read1::More
        };
    }
    let target = req.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Read1::Done(Request {
        method: req.method.unwrap_or("GET").to_string(),
        path: path.to_string(),
        query: query.to_string(),
        headers: out_headers,
        body: body[..length].to_vec(),
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

fn write_response(mut stream: TcpStream, r: &Response) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(HTTP_WRITE_TIMEOUT));
    // One write of head and body, sent at once: a head written alone waits for the client's delayed
    // ACK (Nagle), 40 ms on Linux.
    let _ = stream.set_nodelay(true);
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len()
    );
    let mut all = Vec::with_capacity(head.len() + r.body.len());
    all.extend_from_slice(head.as_bytes());
    all.extend_from_slice(&r.body);
    let _ = stream.write_all(&all);
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

fn refuse(stream: TcpStream, status: u16, why: &str) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    write_response(stream, &Response::text(status, format!("{why}\n")));
}

fn dispatch(stream: TcpStream, req: Request, handler: &Arc<dyn Handler>, handlers: &mut Vec<JoinHandle<()>>) {
    handlers.retain(|h| !h.is_finished());
    if handlers.len() >= MAX_HTTP_HANDLERS {
        refuse(stream, 503, "busy: too many requests in progress; try again");
        return;
    }
    let handler = handler.clone();
    if let Ok(h) = std::thread::Builder::new().name("cutline-http-req".into()).spawn(move || {
        let r = handler.handle(&req);
        write_response(stream, &r);
    }) {
        handlers.push(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_bad_ones_are_refused_with_the_way_out() {
        assert_eq!(parse_addr("127.0.0.1:9470").unwrap().to_string(), "127.0.0.1:9470");
        assert_eq!(parse_addr("localhost:0").unwrap().to_string(), "127.0.0.1:0");
        assert_eq!(parse_addr("[::1]:80").unwrap().to_string(), "[::1]:80");
        for bad in ["9470", "host:9470", "127.0.0.1:99999", "127.0.0.1:x"] {
            let e = parse_addr(bad).unwrap_err().to_string();
            assert!(e.contains("host:port"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_request_is_complete_only_with_its_whole_body() {
        let head = b"POST /api/settings?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";
        assert!(matches!(parse(head, false), Read1::More));
        let mut full = head.to_vec();
        full.extend_from_slice(b"abcde");
        match parse(&full, false) {
            Read1::Done(r) => {
                assert_eq!((r.method.as_str(), r.path.as_str(), r.query.as_str()), ("POST", "/api/settings", "x=1"));
                assert_eq!(r.body, b"abcde");
                assert_eq!(r.header("host"), Some("a"));
                assert_eq!(r.query_param("x"), Some("1"));
            }
            _ => panic!("complete"),
        }
        assert!(matches!(parse(b"GARBAGE\x01\r\n\r\n", false), Read1::Refuse(400, _)));
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(parse(chunked, false), Read1::Refuse(411, _)));
        let huge = b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n";
        assert!(matches!(parse(huge, false), Read1::Refuse(413, _)));
    }
}
