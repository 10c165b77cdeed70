//! `S3Store` against a real S3-compatible server (moto, started by `scripts/s3-test-server`), whose
//! endpoint comes from the environment (`CUTLINE_S3_ENDPOINT`, `CUTLINE_S3_BUCKET`, `AWS_*`). Without
//! it these tests fail and say how to start one; they never pass silently. Each test works under a
//! prefix of its own, so they run in parallel on one bucket.
//!
//! Module `s3` is the storage conformance suite (`tests/common`, the same scenarios the local and
//! memory stores pass in `tests/conformance.rs`) on `S3Store`; the rest is what only a remote store
//! has: prefixes, no lock, a missing bucket (here), failures and retries (`failures`), multipart
//! uploads, and that a failed one is aborted (`uploads`). For failures the server cannot be made to
//! produce on demand, a small loopback TCP proxy in front of the real server drops connections or
//! answers, and a loopback responder answers every request with one status (both in `proxy`); no
//! test replaces the server's S3 behaviour with a fake.
#![cfg(feature = "s3")]

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
mod failures;
mod proxy;
mod uploads;

use common::{manifest, write, Budget, Harness};
use cutline_core::{CheckpointId, Generation};
use cutline_storage::{CheckpointStore, JobMeta, RetryLimits, S3Config, S3Store, StorageError};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjectPath;
use object_store::{MultipartId, ObjectStore, ObjectStoreExt, PutPayload};
use proxy::Proxy;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    config: S3Config,
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
        Raw { store, runtime, prefix: config.prefix.clone(), config: config.clone() }
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

    /// Opens a multipart upload of `rel` (and sends nothing to it): its upload id.
    fn open_upload(&self, rel: &str) -> MultipartId {
        self.runtime.block_on(self.store.create_multipart(&self.key(rel))).unwrap()
    }

    fn abort_upload(&self, rel: &str, id: &MultipartId) {
        self.runtime.block_on(self.store.abort_multipart(&self.key(rel), id)).unwrap()
    }

    /// The keys, relative to the prefix and sorted, of the multipart uploads open under the prefix
    /// (neither completed nor aborted; invisible to object listings): S3's ListMultipartUploads,
    /// unsigned through [`raw_http_answer`].
    fn open_uploads(&self) -> Vec<String> {
        assert!(self.prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_/".contains(&b)), "{}", self.prefix);
        let path = format!("/{}?uploads&prefix={}/", self.config.bucket, self.prefix);
        let (status, answer) = raw_http_answer(&self.config, "GET", &path);
        assert_eq!(status, 200, "ListMultipartUploads: {answer}");
        assert!(answer.contains("<ListMultipartUploadsResult") && !answer.contains("<IsTruncated>true"), "{answer}");
        let root = format!("{}/", self.prefix);
        let mut keys: Vec<String> = answer
            .split("<Upload>")
            .skip(1)
            .map(|upload| {
                let key = upload.split("<Key>").nth(1).and_then(|k| k.split("</Key>").next());
                let key = key.unwrap_or_else(|| panic!("no key in {upload}"));
                key.strip_prefix(&root).unwrap_or_else(|| panic!("{key} is not under {root}")).to_string()
            })
            .collect();
        keys.sort();
        keys
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
    raw_http_answer(config, method, path).0
}

/// [`raw_http`], with the whole answer (status line, headers and body).
fn raw_http_answer(config: &S3Config, method: &str, path: &str) -> (u16, String) {
    let mut conn = TcpStream::connect(server_addr(config)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let host = server_addr(config);
    write!(conn, "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    let status =
        answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {answer:?}"));
    (status, answer)
}

/// A config for a server at `addr` that is not the real one (closed port, responder, proxy).
fn config_at(addr: SocketAddr, test: &str) -> S3Config {
    let mut config = server_config().with_prefix(unique_prefix(test));
    config.endpoint = Some(format!("http://{addr}"));
    config
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

#[test]
fn the_store_is_a_shareable_trait_object() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<S3Store>();
    let h = S3Harness::new("trait-object");
    let shared: Arc<dyn CheckpointStore> = h.store.clone();
    assert!(shared.describe().starts_with("s3://"));
}
