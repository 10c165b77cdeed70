//! A plain HTTP/1.1 client for the tests of the processes' HTTP endpoints (one request per
//! connection, as the endpoint answers), and finding an endpoint's address in a process's log.

use super::{wait_until, Scratch};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// An answer: status code, `Content-Type`, body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// `method path` on `addr` with `headers` and `body`; `None` if the connection fails.
pub fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Option<Answer> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let content_type = head.lines().find_map(|l| l.strip_prefix("Content-Type: ")).unwrap_or_default().to_string();
    Some(Answer { status, content_type, body: body.to_string() })
}

/// `GET path`, which must be answered.
pub fn get(addr: &str, path: &str) -> Answer {
    request(addr, "GET", path, &[], "").unwrap_or_else(|| panic!("no answer to GET {path} from {addr}"))
}

/// The address of the HTTP endpoint that the process logging to `<log>.log` serves (its
/// `http_endpoint` event), waiting up to `limit` for it.
pub fn endpoint(s: &Scratch, log: &str, limit: Duration) -> String {
    wait_until(&format!("the HTTP endpoint in {log}.log"), limit, || {
        s.events(log).iter().rev().find(|e| e.is("http_endpoint")).and_then(|e| e.str("addr").map(String::from))
    })
}

/// The value of the Prometheus series `series` (name and labels as written) in `text`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
