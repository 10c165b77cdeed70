//! `S3Store` against a real S3-compatible server (moto, started by `scripts/s3-test-server`), whose
//! endpoint comes from the environment (`CUTLINE_S3_ENDPOINT`, `CUTLINE_S3_BUCKET`, `AWS_*`). Without
//! it these tests fail and say how to start one; they never pass silently. Each test works under a
//! prefix of its own, so they run in parallel on one bucket.
//!
//! Module `s3` is the storage conformance suite (`tests/common`, the same scenarios the local and
//! memory stores pass in `tests/conformance.rs`) on `S3Store`; the rest is what only a remote store
//! has: prefixes, no lock, a missing bucket, failures and retries. For failures the server cannot be
//! made to produce on demand, a small loopback TCP proxy in front of the real server drops connections
//! or answers, and a loopback responder answers every request with one status; no test replaces the
//! server's S3 behaviour with a fake.
#![cfg(feature = "s3")]

#[macro_use]
mod common;

use common::{listing, manifest, record, write, Budget, Harness};
use cutline_core::{CheckpointId, Generation};
use cutline_core::{OperatorId, SubtaskIndex};
use cutline_storage::{
    CheckpointStore, JobMeta, RetryLimits, S3Config, S3Store, StorageError, TaskStateFrame, UPLOAD_PARTS_IN_FLIGHT,
    UPLOAD_PART_BYTES,
};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---- the server, the store under test and raw access to its objects -----------------------------

const HOW_TO_START: &str = concat!(
    "the S3 tests need a real S3-compatible server, named by CUTLINE_S3_ENDPOINT, CUTLINE_S3_BUCKET, ",
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. Start one on loopback (moto, installed on first use) with\n",
    "    eval \"$(scripts/s3-test-server)\"\n",
    "then run the tests in that shell:\n",
    "    cargo test -p cutline-storage --release --features s3 --test s3\n",
    "and stop the server afterwards with\n",
    "    scripts/s3-test-server stop \"$CUTLINE_S3_SERVER_PID\"",
);

/// Retry limits small enough for tests: 4 attempts, 20 ms doubling to 200 ms.
fn test_limits() -> RetryLimits {
    RetryLimits {
        attempts: 4,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        request_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(2),
    }
}

/// The server's configuration from the environment, with test retry limits and no prefix. Fails
/// the test, saying how to start a server, if the environment does not name one.
fn server_config() -> S3Config {
    if std::env::var("CUTLINE_S3_ENDPOINT").map_or(true, |v| v.trim().is_empty()) {
        panic!("CUTLINE_S3_ENDPOINT is not set: {HOW_TO_START}");
    }
    let mut config = S3Config::from_env().unwrap_or_else(|e| panic!("{e}\n{HOW_TO_START}"));
    config.retry = test_limits();
    config
}

fn endpoint(config: &S3Config) -> String {
    config.endpoint.clone().unwrap()
}

fn server_addr(config: &S3Config) -> SocketAddr {
    let e = endpoint(config);
    let hostport = e.strip_prefix("http://").expect("the test server speaks plain http").trim_end_matches('/');
    std::net::ToSocketAddrs::to_socket_addrs(hostport).unwrap().next().unwrap()
}

/// A prefix no other test (of this or another run) uses.
fn unique_prefix(test: &str) -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("cutline-tests/{test}-{}-{nanos}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Direct access to the objects under a prefix, with a client of its own (as another program
/// would have), to look at what the store wrote and to damage it.
struct Raw {
    store: AmazonS3,
    runtime: tokio::runtime::Runtime,
    prefix: String,
}

impl Raw {
    fn new(config: &S3Config) -> Raw {
        let store = AmazonS3Builder::new()
            .with_endpoint(endpoint(config))
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(true)
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Raw { store, runtime, prefix: config.prefix.clone() }
    }

    fn key(&self, rel: &str) -> ObjectPath {
        ObjectPath::parse(format!("{}/{rel}", self.prefix)).unwrap()
    }

    fn put(&self, rel: &str, bytes: &[u8]) {
        self.runtime.block_on(self.store.put(&self.key(rel), PutPayload::from(bytes.to_vec()))).unwrap();
    }

    fn get(&self, rel: &str) -> Option<Vec<u8>> {
        let key = self.key(rel);
        self.runtime.block_on(async {
            match self.store.get(&key).await {
                Ok(r) => Some(r.bytes().await.unwrap().to_vec()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => panic!("raw get {rel}: {e}"),
            }
        })
    }

    /// The object's entity tag (a multipart upload's ends in `-` and its number of parts).
    fn e_tag(&self, rel: &str) -> String {
        let meta = self.runtime.block_on(self.store.head(&self.key(rel))).unwrap();
        meta.e_tag.unwrap_or_else(|| panic!("no entity tag on {rel}"))
    }

    fn remove(&self, rel: &str) {
        self.runtime.block_on(self.store.delete(&self.key(rel))).unwrap();
    }

    /// Every object under the prefix, relative to it, sorted (a walk of delimited listings).
    fn files(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![ObjectPath::parse(&self.prefix).unwrap()];
        while let Some(dir) = dirs.pop() {
            let listing = self.runtime.block_on(self.store.list_with_delimiter(Some(&dir))).unwrap();
            dirs.extend(listing.common_prefixes);
            let root = format!("{}/", self.prefix);
            out.extend(
                listing.objects.into_iter().map(|o| o.location.as_ref().strip_prefix(&root).unwrap().to_string()),
            );
        }
        out.sort();
        out
    }
}

/// A store under a fresh prefix, and raw access to it through a client of its own.
struct S3Harness {
    store: Arc<S3Store>,
    raw: Raw,
    config: S3Config,
    test: String,
}

impl S3Harness {
    fn new(test: &str) -> S3Harness {
        let config = server_config().with_prefix(unique_prefix(test));
        let store = Arc::new(S3Store::open(config.clone()).unwrap_or_else(|e| panic!("{e}\n{HOW_TO_START}")));
        S3Harness { store, raw: Raw::new(&config), config, test: test.to_string() }
    }
}

impl Harness for S3Harness {
    fn name(&self) -> &'static str {
        "s3"
    }
    fn store(&self) -> &dyn CheckpointStore {
        &*self.store
    }
    fn shared(&self) -> Arc<dyn CheckpointStore> {
        self.store.clone()
    }
    /// Another `S3Store` on the same prefix: its own HTTP client and runtime.
    fn another_client(&self) -> Arc<dyn CheckpointStore> {
        Arc::new(S3Store::open(self.config.clone()).unwrap())
    }
    fn fresh(&self) -> Box<dyn Harness> {
        Box::new(S3Harness::new(&self.test))
    }
    fn put_raw(&self, path: &str, bytes: &[u8]) {
        self.raw.put(path, bytes)
    }
    fn remove_raw(&self, path: &str) {
        self.raw.remove(path)
    }
    fn get_raw(&self, path: &str) -> Option<Vec<u8>> {
        self.raw.get(path)
    }
    fn files(&self) -> Vec<String> {
        self.raw.files()
    }
    fn shown(&self, path: &str) -> String {
        format!("s3://{}/{}/{path}", self.config.bucket, self.config.prefix)
    }
    fn budget(&self) -> Budget {
        Budget::REMOTE
    }
}

/// The storage conformance suite on `S3Store`.
mod s3 {
    conformance_suite!(super::S3Harness::new);
}

fn remote_parts(err: &StorageError) -> (Option<u16>, bool, u32) {
    match err {
        StorageError::Remote { status, transient, attempts, .. } => (*status, *transient, *attempts),
        other => panic!("expected StorageError::Remote, got {other}"),
    }
}

// ---- what only an object store has ---------------------------------------------------------------

#[test]
fn a_reopened_store_sees_its_checkpoints_and_prefixes_do_not_leak() {
    let h = S3Harness::new("reopen");
    let a = write(h.store(), 9, "op", 0, b"x");
    h.store().commit_manifest(&manifest(9, vec![a])).unwrap();
    assert_eq!(
        h.store().describe(),
        format!("s3://{}/{} at {}", h.config.bucket, h.config.prefix, endpoint(&h.config))
    );
    let reopened = S3Store::open(h.config.clone()).unwrap();
    reopened.verify(CheckpointId(9)).unwrap();
    assert_eq!(h.raw.files().len(), 2, "open leaves no probe object behind: {:?}", h.raw.files());
    // A prefix that merely starts with the same characters, and one below it, are other stores.
    for prefix in [format!("{}x", h.config.prefix), format!("{}/nested", h.config.prefix)] {
        let neighbour = S3Store::open(h.config.clone().with_prefix(prefix)).unwrap();
        assert_eq!(neighbour.list_checkpoints().unwrap(), vec![]);
        neighbour.gc(1, &[]).unwrap();
    }
    reopened.verify(CheckpointId(9)).unwrap();
}

/// Tasks write concurrently from many threads through one shared store (one client, one runtime).
/// by not refusing a second holder.
#[test]
fn lock_holds_nothing_on_an_object_store() {
    let h = S3Harness::new("lock");
    let first = h.store().lock().unwrap();
    let second = h.store().lock().unwrap();
    assert_eq!(format!("{first:?}"), "StoreLock(none)");
    drop((first, second));
}

#[test]
fn a_missing_bucket_is_a_clear_permanent_error_never_an_empty_store() {
    let mut config = server_config().with_prefix(unique_prefix("no-bucket"));
    config.bucket = format!("cutline-no-such-bucket-{}", std::process::id());
    let err = S3Store::open(config.clone()).unwrap_err();
    assert!(matches!(err, StorageError::InvalidRoot { .. }), "{err}");
    assert!(!err.is_transient());
    let text = err.to_string();
    assert!(text.contains(&format!("the bucket {} does not exist", config.bucket)), "{text}");

    // A bucket that disappears under an open store: reads and writes fail for good, they do not
    // report objects as absent.
    let bucket = format!("cutline-vanishing-{}-{}", std::process::id(), unique_prefix("b").len());
    assert_eq!(raw_http(&config, "PUT", &format!("/{bucket}")), 200, "create bucket {bucket}");
    config.bucket = bucket.clone();
    let store = S3Store::open(config.clone()).unwrap();
    let a = write(&store, 1, "op", 0, b"x");
    let raw = Raw::new(&config);
    raw.remove(&a.file);
    assert!(matches!(raw_http(&config, "DELETE", &format!("/{bucket}")), 200 | 204), "delete bucket");
    let err = store.read_task_state(&a).unwrap_err();
    let (status, transient, attempts) = remote_parts(&err);
    assert_eq!((status, transient, attempts), (Some(404), false, 1), "{err}");
    let err = store.write_meta(&JobMeta {
        job_fingerprint: "fp".into(),
        generation: Generation(1),
        epoch_lease_end: CheckpointId(1),
    });
    let err = err.unwrap_err();
    assert_eq!(remote_parts(&err), (Some(404), false, 1), "{err}");
    assert!(err.to_string().contains("NoSuchBucket"), "{err}");
}

/// One unsigned request to the test server (moto does not check signatures), for what the store
/// cannot do itself: create and delete buckets. The HTTP status.
fn raw_http(config: &S3Config, method: &str, path: &str) -> u16 {
    let mut conn = TcpStream::connect(server_addr(config)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let host = server_addr(config);
    write!(conn, "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {answer:?}"))
}

// ---- failures and retries -------------------------------------------------------------------------

/// A config for a server at `addr` that is not the real one (closed port, responder, proxy).
fn config_at(addr: SocketAddr, test: &str) -> S3Config {
    let mut config = server_config().with_prefix(unique_prefix(test));
    config.endpoint = Some(format!("http://{addr}"));
    config
}

#[test]
fn a_closed_port_fails_after_the_named_attempts_with_a_transient_error_in_bounded_time() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap(); // closed when dropped
    let config = config_at(port, "closed-port");
    let started = Instant::now();
    let err = S3Store::open(config.clone()).unwrap_err();
    let elapsed = started.elapsed();
    let (status, transient, attempts) = remote_parts(&err);
    assert_eq!((status, transient, attempts), (None, true, config.retry.attempts), "{err}");
    assert!(err.is_transient());
    assert!(err.to_string().contains("4 attempts"), "{err}");
    // Sleeps of at least 10 + 20 + 40 ms (half of 20, 40, 80 ms) and at most 20 + 40 + 80 ms.
    assert!(elapsed >= Duration::from_millis(70), "{elapsed:?}: no backoff?");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

/// A loopback HTTP server that answers every request with `answer(method, target, headers)`,
/// counting requests. For failures a real server will not produce on demand (503, 403), and for a
/// server that ignores conditional writes.
struct Responder {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl Responder {
    fn start(answer: impl Fn(&str, &str, &str) -> String + Send + Sync + 'static) -> Responder {
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

    fn status(code: u16, reason: &'static str) -> Responder {
        Responder::start(move |_, _, _| {
            let body = format!("<?xml version=\"1.0\"?><Error><Code>{reason}</Code><Message>test</Message></Error>");
            format!("HTTP/1.1 {code} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        })
    }

    fn requests(&self) -> usize {
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

#[test]
fn server_errors_are_retried_up_to_the_limit_then_reported_as_transient() {
    let server = Responder::status(503, "SlowDown");
    let err = S3Store::open(config_at(server.addr, "503")).unwrap_err();
    assert_eq!(remote_parts(&err), (Some(503), true, 4), "{err}");
    assert_eq!(server.requests(), 4, "one request per attempt");
}

#[test]
fn refusals_are_not_retried_and_are_permanent() {
    let server = Responder::status(403, "AccessDenied");
    let err = S3Store::open(config_at(server.addr, "403")).unwrap_err();
    assert_eq!(remote_parts(&err), (Some(403), false, 1), "{err}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("check the access key"), "{err}");
    assert_eq!(server.requests(), 1, "a refusal is not retried");
}

/// A server that answers every PUT with 200, conditional or not, would let a manifest be replaced:
/// `open` finds out and refuses it.
#[test]
fn a_server_that_ignores_conditional_writes_is_refused_at_open() {
    let server = Responder::start(|method, _, _| {
        let (status, body) = match method {
            "GET" => (
                "200 OK",
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult \
                 xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix></Prefix><KeyCount>0</KeyCount>\
                 <MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter><IsTruncated>false</IsTruncated></ListBucketResult>",
            ),
            "DELETE" => ("204 No Content", ""),
            _ => ("200 OK", ""),
        };
        format!("HTTP/1.1 {status}\r\nETag: \"e\"\r\nContent-Length: {}\r\n\r\n{body}", body.len())
    });
    let err = S3Store::open(config_at(server.addr, "no-conditional")).unwrap_err();
    assert!(
        matches!(&err, StorageError::InvalidRoot { reason, .. } if reason.contains("ignores conditional writes")),
        "{err}"
    );
}

/// A TCP proxy on loopback in front of the real server that can fail requests on purpose: refuse the
/// next requests, or the next PUTs only (close the connection on them), or swallow the answer to the next conditional PUT
/// (forward it, let the server apply it, and close the connection instead of answering).
struct Proxy {
    addr: SocketAddr,
    refuse_next: Arc<AtomicUsize>,
    /// Whether `refuse_next` counts only PUTs (a part of a multipart upload is one).
    refuse_puts_only: Arc<AtomicBool>,
    refused: Arc<AtomicUsize>,
    swallow_next_conditional_put: Arc<AtomicBool>,
    swallowed: Arc<AtomicUsize>,
    /// PUTs forwarded and not yet answered, and the most there were at once.
    puts_open: Arc<AtomicUsize>,
    most_puts_open: Arc<AtomicUsize>,
    /// Milliseconds the answer to each PUT is held back (a slow store).
    put_answer_delay_ms: Arc<AtomicUsize>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            refuse_next: Arc::default(),
            refuse_puts_only: Arc::default(),
            refused: Arc::default(),
            swallow_next_conditional_put: Arc::default(),
            swallowed: Arc::default(),
            puts_open: Arc::default(),
            most_puts_open: Arc::default(),
            put_answer_delay_ms: Arc::default(),
        };
        let delay_ms = proxy.put_answer_delay_ms.clone();
        let (puts_open, most_puts_open) = (proxy.puts_open.clone(), proxy.most_puts_open.clone());
        let (refuse_next, refused) = (proxy.refuse_next.clone(), proxy.refused.clone());
        let puts_only = proxy.refuse_puts_only.clone();
        let (swallow_next, swallowed) = (proxy.swallow_next_conditional_put.clone(), proxy.swallowed.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let swallow_this = Arc::new(AtomicBool::new(false));
                let put_unanswered = Arc::new(AtomicBool::new(false));
                // client -> server, deciding per request (a read that starts with a method).
                {
                    let (mut from, mut to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let (refuse_next, refused, puts_only) = (refuse_next.clone(), refused.clone(), puts_only.clone());
                    let (swallow_next, swallow_this) = (swallow_next.clone(), swallow_this.clone());
                    let (put_unanswered, puts_open, most) =
                        (put_unanswered.clone(), puts_open.clone(), most_puts_open.clone());
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let chunk = &buf[..n];
                            let starts_request = [&b"GET "[..], b"PUT ", b"HEAD ", b"DELETE ", b"POST "]
                                .iter()
                                .any(|m| chunk.starts_with(m));
                            let refusable = !puts_only.load(Ordering::SeqCst) || chunk.starts_with(b"PUT ");
                            if starts_request
                                && refusable
                                && refuse_next
                                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                                    .is_ok()
                            {
                                refused.fetch_add(1, Ordering::SeqCst);
                                break; // drop the connection with the request unanswered
                            }
                            let conditional_put = chunk.starts_with(b"PUT ")
                                && String::from_utf8_lossy(chunk).to_ascii_lowercase().contains("if-none-match");
                            if conditional_put && swallow_next.swap(false, Ordering::SeqCst) {
                                swallow_this.store(true, Ordering::SeqCst);
                            }
                            if chunk.starts_with(b"PUT ") && !put_unanswered.swap(true, Ordering::SeqCst) {
                                most.fetch_max(puts_open.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                            }
                            if to.write_all(chunk).is_err() {
                                break;
                            }
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
                // server -> client, unless this connection's answer is to be swallowed.
                {
                    let (mut from, mut to) = (server, client);
                    let swallowed = swallowed.clone();
                    let (puts_open, delay_ms) = (puts_open.clone(), delay_ms.clone());
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if buf[..n].starts_with(b"HTTP/") && put_unanswered.swap(false, Ordering::SeqCst) {
                                let delay = delay_ms.load(Ordering::SeqCst) as u64;
                                std::thread::sleep(std::time::Duration::from_millis(delay));
                                puts_open.fetch_sub(1, Ordering::SeqCst);
                            }
                            if swallow_this.load(Ordering::SeqCst) {
                                swallowed.fetch_add(1, Ordering::SeqCst);
                                break; // the server applied the request; the client never hears
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        if put_unanswered.swap(false, Ordering::SeqCst) {
                            puts_open.fetch_sub(1, Ordering::SeqCst); // closed unanswered
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        proxy
    }
}

/// The server goes away for a few requests: fewer failures than attempts are ridden out; as many
/// as the attempts fail the operation with a transient error; and the store works again after.
#[test]
fn a_briefly_unavailable_server_is_ridden_out_by_retries() {
    let real = server_config();
    let proxy = Proxy::start(server_addr(&real));
    let config = config_at(proxy.addr, "outage");
    let store = S3Store::open(config.clone()).unwrap();
    let raw = Raw::new(&server_config().with_prefix(config.prefix.clone()));

    proxy.refuse_next.store(3, Ordering::SeqCst); // attempts - 1
    let a = write(&store, 1, "op", 0, b"through an outage");
    assert_eq!(proxy.refused.load(Ordering::SeqCst), 3);
    assert_eq!(raw.get(&a.file).map(|b| b.len() as u64), Some(a.size_bytes));

    proxy.refuse_next.store(4, Ordering::SeqCst); // as many as the attempts
    let started = Instant::now();
    let err = store.commit_manifest(&manifest(1, vec![a.clone()])).unwrap_err();
    assert_eq!(remote_parts(&err), (None, true, 4), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(proxy.refused.load(Ordering::SeqCst), 7);
    assert_eq!(store.list_checkpoints().unwrap(), listing(&[(1, false)]), "the failed commit left no manifest");

    store.commit_manifest(&manifest(1, vec![a.clone()])).unwrap(); // the server is back
    store.verify(CheckpointId(1)).unwrap();
}

/// The server applies the conditional create of a manifest but its answer is lost: the retry meets
/// the manifest, finds it byte for byte the one it sent, and reports the commit as done (not as
/// `ManifestExists`, which would make the coordinator abort a committed checkpoint).
#[test]
fn a_commit_whose_answer_was_lost_is_recognised_on_retry() {
    let real = server_config();
    let proxy = Proxy::start(server_addr(&real));
    let store = S3Store::open(config_at(proxy.addr, "lost-answer")).unwrap();
    let a = write(&store, 1, "op", 0, b"x");
    let m = manifest(1, vec![a]);
    proxy.swallow_next_conditional_put.store(true, Ordering::SeqCst);
    store.commit_manifest(&m).unwrap();
    assert_eq!(proxy.swallowed.load(Ordering::SeqCst), 1, "the answer was swallowed");
    assert_eq!(store.read_manifest(CheckpointId(1)).unwrap(), m);
    let mut other = m.clone();
    other.created_at_unix_ms += 1;
    assert!(matches!(store.commit_manifest(&other), Err(StorageError::ManifestExists(CheckpointId(1)))));
    assert!(matches!(store.commit_manifest(&m), Err(StorageError::ManifestExists(CheckpointId(1)))));
}

/// The server creates a generation record but the answer is lost: the retry meets the record, finds
/// it byte for byte the one it sent, and reports the claim as done (not as `GenerationTaken`, which
/// would stop the coordinator that does own the generation).
#[test]
fn a_claim_whose_answer_was_lost_is_recognised_on_retry() {
    let real = server_config();
    let proxy = Proxy::start(server_addr(&real));
    let store = S3Store::open(config_at(proxy.addr, "lost-claim")).unwrap();
    let mine = record(4, Some(2), "host-a/pid-1");
    proxy.swallow_next_conditional_put.store(true, Ordering::SeqCst);
    store.claim_generation(&mine).unwrap();
    assert_eq!(proxy.swallowed.load(Ordering::SeqCst), 1, "the answer was swallowed");
    assert_eq!(store.latest_generation().unwrap(), Some(mine.clone()));
    assert!(matches!(store.claim_generation(&record(4, Some(2), "host-b")), Err(StorageError::GenerationTaken { .. })));
    assert!(matches!(store.claim_generation(&mine), Err(StorageError::GenerationTaken { .. })));
}

/// A store reaching the real server through a [`Proxy`], under a fresh prefix, and raw access to
/// that prefix past the proxy.
fn behind_a_proxy(test: &str) -> (Proxy, S3Store, Raw) {
    let proxy = Proxy::start(server_addr(&server_config()));
    let config = config_at(proxy.addr, test);
    let store = S3Store::open(config.clone()).unwrap();
    let raw = Raw::new(&server_config().with_prefix(config.prefix.clone()));
    (proxy, store, raw)
}

/// A task state file built in a scratch file (a whole snapshot of the disk backend) and larger than
/// a part goes up as a multipart upload, [`UPLOAD_PARTS_IN_FLIGHT`] parts at a time, and reads back
/// whole; through a server that drops requests, each part is retried alone. One no larger than a
/// part is one PUT.
#[test]
fn a_spooled_state_file_larger_than_a_part_is_uploaded_in_parts_and_reads_back_whole() {
    let (proxy, store, raw) = behind_a_proxy("multipart");
    let dir = tempfile::tempdir().unwrap();
    let part = UPLOAD_PART_BYTES as usize;
    for (at, len, parts, refused) in [(1, 2 * part + 12_345, Some(3), 3), (2, part - 64, None, 0)] {
        let mut x: u64 = at;
        let payload: Vec<u8> = (0..len)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        let frame = TaskStateFrame::spool(&dir.path().join(format!("{at}.spool")), |w| w.write_all(&payload)).unwrap();
        assert!(frame.is_spooled());
        proxy.refuse_puts_only.store(true, Ordering::SeqCst);
        proxy.refuse_next.store(refused, Ordering::SeqCst); // fewer than any part's attempts
        proxy.put_answer_delay_ms.store(100, Ordering::SeqCst); // a slow store: parts overlap
        let handle =
            store.write_task_frame(CheckpointId(at), &OperatorId::new("op"), SubtaskIndex(0), 1, None, &frame).unwrap();
        assert_eq!(proxy.refuse_next.load(Ordering::SeqCst), 0, "every refusal was met");
        assert_eq!(store.read_task_state(&handle).unwrap(), payload, "{len} bytes read back");
        let e_tag = raw.e_tag(&handle.file);
        match parts {
            Some(n) => assert!(e_tag.trim_matches('"').ends_with(&format!("-{n}")), "{n} parts: {e_tag}"),
            None => assert!(!e_tag.contains('-'), "one PUT: {e_tag}"),
        }
    }
    assert_eq!(proxy.refused.load(Ordering::SeqCst), 3);
    let at_once = proxy.most_puts_open.load(Ordering::SeqCst);
    assert!((2..=UPLOAD_PARTS_IN_FLIGHT).contains(&at_once), "{at_once} parts sent at once");
}

/// A part that fails as many times as the attempts fails the write with a transient error, and the
/// aborted upload leaves no object behind.
#[test]
fn a_multipart_upload_whose_part_fails_for_good_leaves_no_object() {
    let (proxy, store, raw) = behind_a_proxy("multipart-fails");
    let dir = tempfile::tempdir().unwrap();
    let payload = vec![7u8; UPLOAD_PART_BYTES as usize + 1];
    let frame = TaskStateFrame::spool(&dir.path().join("big.spool"), |w| w.write_all(&payload)).unwrap();
    proxy.refuse_puts_only.store(true, Ordering::SeqCst);
    // As many as the attempts of every part in flight: whichever way they fall, one part uses up
    // its attempts.
    proxy.refuse_next.store(4 * UPLOAD_PARTS_IN_FLIGHT, Ordering::SeqCst);
    let err =
        store.write_task_frame(CheckpointId(1), &OperatorId::new("op"), SubtaskIndex(0), 1, None, &frame).unwrap_err();
    assert_eq!(remote_parts(&err), (None, true, 4), "{err}");
    assert_eq!(raw.files(), Vec::<String>::new(), "no object, whole or in part");
}

#[test]
fn the_store_is_a_shareable_trait_object() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<S3Store>();
    let h = S3Harness::new("trait-object");
    let shared: Arc<dyn CheckpointStore> = h.store.clone();
    assert!(shared.describe().starts_with("s3://"));
}
