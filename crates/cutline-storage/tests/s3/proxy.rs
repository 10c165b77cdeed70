//! The loopback servers that fail requests on purpose: [`Responder`], which answers every request
//! itself, and [`Proxy`], which stands in front of the real server and drops chosen requests or
//! answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A loopback HTTP server that answers every request with `answer(method, target, headers)`,
/// counting requests. For failures a real server will not produce on demand (503, 403), and for a
/// server that ignores conditional writes.
pub(crate) struct Responder {
    pub(crate) addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl Responder {
    pub(crate) fn start(answer: impl Fn(&str, &str, &str) -> String + Send + Sync + 'static) -> Responder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let (count, answer) = (requests.clone(), Arc::new(answer));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let (count, answer) = (count.clone(), answer.clone());
                std::thread::spawn(move || {
                    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    while let Some((method, target, headers)) = read_request(&mut conn) {
                        count.fetch_add(1, Ordering::SeqCst);
                        if conn.write_all(answer(&method, &target, &headers).as_bytes()).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Responder { addr, requests }
    }

    pub(crate) fn status(code: u16, reason: &'static str) -> Responder {
        Responder::start(move |_, _, _| {
            let body = format!("<?xml version=\"1.0\"?><Error><Code>{reason}</Code><Message>test</Message></Error>");
            format!("HTTP/1.1 {code} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        })
    }

    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Reads one request (headers and a Content-Length body): method, target, lowercased headers.
fn read_request(conn: &mut TcpStream) -> Option<(String, String, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let mut first = head.lines().next()?.split(' ');
    let (method, target) = (first.next()?.to_string(), first.next()?.to_string());
    let headers = head.to_ascii_lowercase();
    let length = headers
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).ok()?;
    Some((method, target, headers))
}

/// A TCP proxy on loopback in front of the real server that can fail requests on purpose: refuse the
/// next requests, or the next PUTs or POSTs only (close the connection on them), possibly after
/// letting some through; or swallow the answer to the next conditional PUT or to the next create of
/// a multipart upload (forward it, let the server apply it, and close the connection instead of
/// answering).
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    pub(crate) refuse_next: Arc<AtomicUsize>,
    /// Whether `refuse_next` counts only PUTs (a part of a multipart upload is one).
    pub(crate) refuse_puts_only: Arc<AtomicBool>,
    /// Whether `refuse_next` counts only POSTs (the create and the completion of a multipart upload).
    pub(crate) refuse_posts_only: Arc<AtomicBool>,
    /// Requests that `refuse_next` would count let through before it starts refusing them.
    pub(crate) pass_before_refusing: Arc<AtomicUsize>,
    pub(crate) refused: Arc<AtomicUsize>,
    pub(crate) swallow_next_conditional_put: Arc<AtomicBool>,
    /// Swallow the answer to the next create of a multipart upload (`POST ...?uploads`).
    pub(crate) swallow_next_create_upload: Arc<AtomicBool>,
    pub(crate) swallowed: Arc<AtomicUsize>,
    /// PUTs forwarded and not yet answered, and the most there were at once.
    pub(crate) puts_open: Arc<AtomicUsize>,
    pub(crate) most_puts_open: Arc<AtomicUsize>,
    /// Milliseconds the answer to each PUT is held back (a slow store).
    pub(crate) put_answer_delay_ms: Arc<AtomicUsize>,
}

impl Proxy {
    pub(crate) fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            refuse_next: Arc::default(),
            refuse_puts_only: Arc::default(),
            refuse_posts_only: Arc::default(),
            pass_before_refusing: Arc::default(),
            refused: Arc::default(),
            swallow_next_conditional_put: Arc::default(),
            swallow_next_create_upload: Arc::default(),
            swallowed: Arc::default(),
            puts_open: Arc::default(),
            most_puts_open: Arc::default(),
            put_answer_delay_ms: Arc::default(),
        };
        let delay_ms = proxy.put_answer_delay_ms.clone();
        let (puts_open, most_puts_open) = (proxy.puts_open.clone(), proxy.most_puts_open.clone());
        let (refuse_next, refused) = (proxy.refuse_next.clone(), proxy.refused.clone());
        let (puts_only, posts_only) = (proxy.refuse_puts_only.clone(), proxy.refuse_posts_only.clone());
        let pass_first = proxy.pass_before_refusing.clone();
        let (swallow_next, swallowed) = (proxy.swallow_next_conditional_put.clone(), proxy.swallowed.clone());
        let swallow_next_create = proxy.swallow_next_create_upload.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let swallow_this = Arc::new(AtomicBool::new(false));
                let put_unanswered = Arc::new(AtomicBool::new(false));
                // client -> server, deciding per request (a read that starts with a method).
                {
                    let (from, to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let (refuse_next, refused, puts_only) = (refuse_next.clone(), refused.clone(), puts_only.clone());
                    let (posts_only, pass_first) = (posts_only.clone(), pass_first.clone());
                    let (swallow_next, swallow_this) = (swallow_next.clone(), swallow_this.clone());
                    let swallow_next_create = swallow_next_create.clone();
                    let (put_unanswered, puts_open, most) =
                        (put_unanswered.clone(), puts_open.clone(), most_puts_open.clone());
                    pump(
                        from,
                        to,
                        move |chunk| {
                            let starts_request = [&b"GET "[..], b"PUT ", b"HEAD ", b"DELETE ", b"POST "]
                                .iter()
                                .any(|m| chunk.starts_with(m));
                            let refusable = match (puts_only.load(Ordering::SeqCst), posts_only.load(Ordering::SeqCst))
                            {
                                (false, false) => true,
                                (puts, posts) => {
                                    (puts && chunk.starts_with(b"PUT ")) || (posts && chunk.starts_with(b"POST "))
                                }
                            };
                            let take = |n: &AtomicUsize| {
                                n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
                            };
                            if starts_request
                                && refusable
                                && refuse_next.load(Ordering::SeqCst) > 0
                                && !take(&pass_first)
                                && take(&refuse_next)
                            {
                                refused.fetch_add(1, Ordering::SeqCst);
                                return false; // drop the connection with the request unanswered
                            }
                            let conditional_put = chunk.starts_with(b"PUT ")
                                && String::from_utf8_lossy(chunk).to_ascii_lowercase().contains("if-none-match");
                            if conditional_put && swallow_next.swap(false, Ordering::SeqCst) {
                                swallow_this.store(true, Ordering::SeqCst);
                            }
                            let request_line = chunk.split(|&b| b == b'\n').next().unwrap_or_default();
                            let create_upload = chunk.starts_with(b"POST ")
                                && String::from_utf8_lossy(request_line).contains("?uploads");
                            if create_upload && swallow_next_create.swap(false, Ordering::SeqCst) {
                                swallow_this.store(true, Ordering::SeqCst);
                            }
                            if chunk.starts_with(b"PUT ") && !put_unanswered.swap(true, Ordering::SeqCst) {
                                most.fetch_max(puts_open.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                            }
                            true
                        },
                        || {},
                    );
                }
                // server -> client, unless this connection's answer is to be swallowed.
                {
                    let (from, to) = (server, client);
                    let swallowed = swallowed.clone();
                    let (puts_open, delay_ms) = (puts_open.clone(), delay_ms.clone());
                    let on_close = {
                        let (put_unanswered, puts_open) = (put_unanswered.clone(), puts_open.clone());
                        move || {
                            if put_unanswered.swap(false, Ordering::SeqCst) {
                                puts_open.fetch_sub(1, Ordering::SeqCst); // closed unanswered
                            }
                        }
                    };
                    pump(
                        from,
                        to,
                        move |chunk| {
                            if chunk.starts_with(b"HTTP/") && put_unanswered.swap(false, Ordering::SeqCst) {
                                let delay = delay_ms.load(Ordering::SeqCst) as u64;
                                std::thread::sleep(std::time::Duration::from_millis(delay));
                                puts_open.fetch_sub(1, Ordering::SeqCst);
                            }
                            if swallow_this.load(Ordering::SeqCst) {
                                swallowed.fetch_add(1, Ordering::SeqCst);
                                return false; // the server applied the request; the client never hears
                            }
                            true
                        },
                        on_close,
                    );
                }
            }
        });
        proxy
    }
}

/// Copies `from` to `to` on a thread of its own, one read at a time, while `pass` lets each read
/// through; then shuts both down and calls `on_close`.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    mut pass: impl FnMut(&[u8]) -> bool + Send + 'static,
    on_close: impl FnOnce() + Send + 'static,
) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !pass(&buf[..n]) || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        on_close();
        let _ = from.shutdown(std::net::Shutdown::Both);
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}
