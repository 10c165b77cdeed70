//! [`S3Store`]: a checkpoint store in a bucket of any S3-compatible object store (AWS S3, MinIO,
//! moto, ...), through the `object_store` crate; only with the cargo feature `s3`.
//!
//! It owns the object-store primitives of the private `Files` layer (get, head, put, conditional
//! create, list, delete), the retries of transient failures, the classification of failures into
//! [`StorageError`]s, and its configuration ([`S3Config`], [`RetryLimits`]). It does not own the
//! layout, the framing, the checksums, the manifest as commit point or retention: those are
//! [`crate::store`]'s, shared word for word with [`crate::LocalDirStore`] and [`crate::MemStore`].
//!
//! How the primitives map, and why that keeps the store's guarantees:
//! - `put` is one PUT. S3 makes an object visible whole or not at all and only acknowledges a PUT
//!   once it is durable, so there are no temporary objects and `sync_dir` has nothing to do.
//! - `put_new` (the manifest: the commit point, never replaced; and a generation record, the claim
//!   of a generation) is a conditional PUT (`If-None-Match: *`, `PutMode::Create`): of two writers
//!   exactly one wins, the other gets `Ok(false)`, which the store reports as
//!   [`StorageError::ManifestExists`] or [`StorageError::GenerationTaken`]. When an attempt may have
//!   been applied but its answer was lost, a refused retry reads the object back: byte for byte ours
//!   means it was ours (two coordinators never write the same record: owner and time differ).
//!   [`S3Store::open`] checks that the server honours the condition and refuses a server that
//!   ignores it.
//! - `list` is a LIST with delimiter `/`: common prefixes are the directories.
//! - Directories do not exist on an object store (a prefix exists while an object has it), so
//!   `remove_dir_if_empty` removes nothing and says so (`Ok(false)`).
//! - `read`, `size` and `remove_file` treat a missing object as absent (`None`, `Ok`). A missing
//!   bucket is an error, never an empty store.
//!
//! Failures: connection errors, timeouts and 5xx/429/408 answers are retried with exponential
//! backoff within [`RetryLimits`] (attempts, initial and maximal delay), then reported as
//! [`StorageError::Remote`] with `is_transient() == true`. Refusals (401/403, a missing bucket, 412
//! where no condition was expected, other 4xx) are not retried and are not transient. What the
//! engine does with either (fail the checkpoint, not the job) is not decided here.
//!
//! Locking: an object store has no `flock`, and a lock object would outlive a crashed holder, so
//! [`S3Store`] does not lock ([`crate::CheckpointStore::lock`] hands out a guard that holds
//! nothing). It does not stop two jobs from using the same prefix; what keeps them from corrupting
//! each other is that manifests are created only if absent and that stale coordinators are fenced by
//! generation records, also created only if absent ([`crate::CheckpointStore::claim_generation`]):
//! a checkpoint an older generation commits after a newer one took over is never restored. `job.meta`
//! stays a plain PUT (see [`crate::CheckpointStore::write_meta`]).
//!
//! `object_store` is async; [`S3Store`] drives it on a private current-thread tokio runtime with
//! `block_on`, because [`crate::CheckpointStore`] is synchronous. Calling it from inside another
//! tokio runtime panics (tokio refuses nested `block_on`): the engine calls stores from its own
//! threads. Objects are written with a single PUT, so one task state is limited to S3's 5 GiB.

use crate::error::StorageError;
use crate::store::{impl_checkpoint_store, Entry, Files};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

/// How [`S3Store`] retries transient failures, and how long one request may take.
///
/// The worst case of one operation is `attempts` requests of at most `request_timeout` each plus the
/// sleeps between them, each at most `max_backoff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryLimits {
    /// Requests sent for one operation, the first included (at least 1; 1 = no retry).
    pub attempts: u32,
    /// The sleep after the first failure; it doubles after each further failure...
    pub initial_backoff: Duration,
    /// ...up to this. Each sleep is drawn between half of it and all of it (jitter).
    pub max_backoff: Duration,
    /// The limit of one request, from sending it to the end of the answer.
    pub request_timeout: Duration,
    /// The limit of connecting to the endpoint.
    pub connect_timeout: Duration,
}

impl Default for RetryLimits {
    /// 6 attempts, 100 ms doubling to at most 5 s (at most about 11 s of sleeps), 60 s per
    /// request, 5 s to connect.
    fn default() -> Self {
        RetryLimits {
            attempts: 6,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Where an [`S3Store`] lives and how to reach it. Build it by hand or with [`S3Config::from_env`].
#[derive(Clone)]
pub struct S3Config {
    /// The server, e.g. `http://127.0.0.1:9000`; `None` for AWS S3 itself (in `region`). Requests
    /// are path-style (`endpoint/bucket/key`).
    pub endpoint: Option<String>,
    pub bucket: String,
    /// The store's root inside the bucket, '/'-separated, without leading or trailing '/'; `""` for
    /// the whole bucket. Two stores with different prefixes never see each other's objects.
    pub prefix: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Whether a plain `http://` endpoint is allowed (test servers); otherwise only `https://`.
    pub allow_http: bool,
    pub retry: RetryLimits,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field("session_token", &self.session_token.as_ref().map(|_| "<redacted>"))
            .field("allow_http", &self.allow_http)
            .field("retry", &self.retry)
            .finish()
    }
}

impl S3Config {
    /// The configuration in the environment:
    /// - endpoint: `CUTLINE_S3_ENDPOINT`, else `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`, else
    ///   AWS S3 itself;
    /// - bucket: `CUTLINE_S3_BUCKET` (required); prefix: `CUTLINE_S3_PREFIX` (default: none);
    /// - region: `AWS_REGION`, else `AWS_DEFAULT_REGION`, else `us-east-1`;
    /// - credentials: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (required; nothing is looked
    ///   up elsewhere, e.g. no instance metadata), `AWS_SESSION_TOKEN` (optional);
    /// - `CUTLINE_S3_ALLOW_HTTP` (`true`/`false`, `1`/`0`); unset, plain http is allowed only for a
    ///   loopback endpoint (`localhost`, `127.x.x.x`, `[::1]`).
    ///
    /// Retry limits are [`RetryLimits::default`]. A missing or malformed variable is an
    /// [`StorageError::InvalidRoot`] naming it.
    pub fn from_env() -> Result<S3Config, StorageError> {
        S3Config::from_vars(|name| std::env::var(name).ok())
    }

    /// [`S3Config::from_env`] over any source of variables (`get(name)`), e.g. a map in a test.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<S3Config, StorageError> {
        let var = |name: &str| get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let endpoint =
            var("CUTLINE_S3_ENDPOINT").or_else(|| var("AWS_ENDPOINT_URL_S3")).or_else(|| var("AWS_ENDPOINT_URL"));
        let bucket = var("CUTLINE_S3_BUCKET");
        let prefix = var("CUTLINE_S3_PREFIX").unwrap_or_default();
        let location = describe_location(bucket.as_deref().unwrap_or("<no bucket>"), &prefix, endpoint.as_deref());
        let invalid = |reason: String| StorageError::InvalidRoot { path: PathBuf::from(&location), reason };
        let missing = |name: &str, what: &str| {
            invalid(format!("{name} is not set: set it to {what} (see scripts/s3-test-server for a local test server)"))
        };
        let bucket = bucket.ok_or_else(|| missing("CUTLINE_S3_BUCKET", "the bucket to keep checkpoints in"))?;
        let access_key_id = var("AWS_ACCESS_KEY_ID").ok_or_else(|| missing("AWS_ACCESS_KEY_ID", "the access key"))?;
        let secret_access_key = var("AWS_SECRET_ACCESS_KEY")
            .ok_or_else(|| missing("AWS_SECRET_ACCESS_KEY", "the secret of AWS_ACCESS_KEY_ID"))?;
        let allow_http = match var("CUTLINE_S3_ALLOW_HTTP").as_deref() {
            None => endpoint.as_deref().is_some_and(is_loopback_http),
            Some("1" | "true" | "TRUE" | "yes") => true,
            Some("0" | "false" | "FALSE" | "no") => false,
            Some(other) => return Err(invalid(format!("CUTLINE_S3_ALLOW_HTTP is {other:?}: use true or false"))),
        };
        Ok(S3Config {
            endpoint,
            bucket,
            prefix,
            region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")).unwrap_or_else(|| "us-east-1".into()),
            access_key_id,
            secret_access_key,
            session_token: var("AWS_SESSION_TOKEN"),
            allow_http,
            retry: RetryLimits::default(),
        })
    }

    /// The same configuration with another prefix (e.g. one per job).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> S3Config {
        self.prefix = prefix.into();
        self
    }

    fn location(&self) -> String {
        describe_location(&self.bucket, self.prefix.trim_matches('/'), self.endpoint.as_deref())
    }

    /// Checks everything that can be checked without a request; the reason of the first problem.
    fn validate(&self) -> Result<(), String> {
        let b = &self.bucket;
        let bucket_ok = (3..=63).contains(&b.len())
            && b.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
            && b.starts_with(|c: char| c.is_ascii_alphanumeric())
            && b.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !bucket_ok {
            return Err(format!(
                "the bucket name {b:?} is not a valid S3 bucket name (3 to 63 lowercase letters, digits, \
                 '.' and '-', starting and ending with a letter or digit)"
            ));
        }
        let prefix = self.prefix.trim_matches('/');
        if !prefix.is_empty()
            && !prefix.split('/').all(|p| !p.is_empty() && p != "." && p != ".." && !p.chars().any(|c| c.is_control()))
        {
            return Err(format!(
                "the prefix {:?} is not a '/'-separated path of non-empty names (no '.', '..' or '//')",
                self.prefix
            ));
        }
        if let Some(endpoint) = &self.endpoint {
            let rest = if let Some(rest) = endpoint.strip_prefix("https://") {
                rest
            } else if let Some(rest) = endpoint.strip_prefix("http://") {
                if !self.allow_http {
                    return Err(format!(
                        "the endpoint {endpoint} is plain http, which is refused unless allow_http is set \
                         (CUTLINE_S3_ALLOW_HTTP=true); use https, or allow http for a test server"
                    ));
                }
                rest
            } else {
                return Err(format!("the endpoint {endpoint:?} is not an http:// or https:// URL"));
            };
            if rest.is_empty() || rest.starts_with('/') {
                return Err(format!("the endpoint {endpoint:?} names no host"));
            }
        }
        if self.region.trim().is_empty() {
            return Err("the region is empty: set one (any value, e.g. us-east-1, for most test servers)".into());
        }
        if self.access_key_id.is_empty() || self.secret_access_key.is_empty() {
            return Err("the access key id or the secret access key is empty".into());
        }
        let r = &self.retry;
        if r.attempts == 0 {
            return Err("retry.attempts is 0: it counts the first request too, so it must be at least 1".into());
        }
        if r.initial_backoff > r.max_backoff {
            return Err(format!(
                "retry.initial_backoff ({:?}) is above retry.max_backoff ({:?})",
                r.initial_backoff, r.max_backoff
            ));
        }
        if r.request_timeout.is_zero() || r.connect_timeout.is_zero() {
            return Err("retry.request_timeout and retry.connect_timeout must be above zero".into());
        }
        Ok(())
    }
}

fn describe_location(bucket: &str, prefix: &str, endpoint: Option<&str>) -> String {
    let at = endpoint.unwrap_or("AWS S3");
    if prefix.is_empty() {
        format!("s3://{bucket}/ at {at}")
    } else {
        format!("s3://{bucket}/{prefix} at {at}")
    }
}

fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split('/').next().unwrap_or("");
    let host = if host.starts_with('[') {
        host.split(']').next().map(|h| &h[1..]).unwrap_or("")
    } else {
        host.split(':').next().unwrap_or("")
    };
    host == "localhost" || host == "::1" || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// A checkpoint store in a bucket of an S3-compatible object store. See the module documentation.
pub struct S3Store {
    store: AmazonS3,
    runtime: tokio::runtime::Runtime,
    bucket: String,
    /// Without leading or trailing '/'; may be empty.
    prefix: String,
    location: String,
    retry: RetryLimits,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Store").field("location", &self.location).field("retry", &self.retry).finish()
    }
}

/// How a failed request is to be treated.
#[derive(Clone, Copy, Debug)]
struct Class {
    transient: bool,
    /// Whether the request may have taken effect although it failed (sent, but no clean answer).
    maybe_applied: bool,
    status: Option<u16>,
}

/// A request that failed for good: the last error and how it was classified.
struct Failure {
    error: object_store::Error,
    class: Class,
    attempts: u32,
    /// Whether an earlier attempt may have taken effect (see [`Class::maybe_applied`]).
    earlier_maybe_applied: bool,
}

impl S3Store {
    /// Opens the store described by `config`. Checks the configuration (an
    /// [`StorageError::InvalidRoot`] saying what is wrong), then with requests that the bucket
    /// exists and that the credentials may list, create and delete objects under the prefix, and
    /// that the server honours conditional creates (without them a manifest could be replaced).
    /// It writes, conditionally re-creates (which must be refused) and removes one probe object,
    /// `<prefix>/.open-probe.<pid>-<n>.tmp` (a temporary name: listings ignore it, gc removes it if a
    /// crash left it).
    pub fn open(config: S3Config) -> Result<S3Store, StorageError> {
        let location = config.location();
        let invalid = |reason: String| StorageError::InvalidRoot { path: PathBuf::from(&location), reason };
        config.validate().map_err(&invalid)?;
        let retry = config.retry;
        let options = ClientOptions::new()
            .with_allow_http(config.allow_http)
            .with_timeout(retry.request_timeout)
            .with_connect_timeout(retry.connect_timeout);
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(config.allow_http)
            .with_virtual_hosted_style_request(false)
            .with_client_options(options)
            // Retries are ours (see `retrying`): one loop, one classification, named limits.
            .with_retry(RetryConfig { max_retries: 0, ..RetryConfig::default() });
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint.trim_end_matches('/'));
        }
        if let Some(token) = &config.session_token {
            builder = builder.with_token(token);
        }
        let store = builder.build().map_err(|e| invalid(format!("the object store client refused it: {e}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| invalid(format!("cannot start the runtime of its client: {e}")))?;
        let s3 = S3Store {
            store,
            runtime,
            bucket: config.bucket.clone(),
            prefix: config.prefix.trim_matches('/').to_string(),
            location: location.clone(),
            retry,
        };
        s3.probe().map_err(|e| match e {
            StorageError::Remote { status: Some(404), .. } => invalid(format!(
                "the bucket {} does not exist there; create it, or fix the bucket name or the endpoint ({e})",
                config.bucket
            )),
            other => other,
        })?;
        Ok(s3)
    }

    /// The checks of [`S3Store::open`] that need requests.
    fn probe(&self) -> Result<(), StorageError> {
        self.list("")?; // the bucket exists and may be listed
        let rel = crate::store::temp_name("open-probe");
        let key = self.key(&rel)?;
        // A plain PUT first (a leftover of a crashed process with the same name does not matter),
        // then a conditional create of the same object, which must be refused.
        let payload = PutPayload::from_static(b"probe");
        self.retrying(|| self.store.put(&key, payload.clone())).map_err(|f| self.failed("write", &rel, f))?;
        let second = self.retrying(|| self.store.put_opts(&key, payload.clone(), PutOptions::from(PutMode::Create)));
        let removed = self.remove_file(&rel);
        match second {
            Err(f) if matches!(f.error, object_store::Error::AlreadyExists { .. }) => removed,
            Err(f) => Err(self.failed("create", &rel, f)),
            Ok(_) => Err(StorageError::InvalidRoot {
                path: PathBuf::from(&self.location),
                reason: "the server ignores conditional writes (a PUT with If-None-Match: * replaced an \
                         existing object), so a committed manifest could be replaced; use a server that \
                         supports them (AWS S3, MinIO, moto, ...)"
                    .into(),
            }),
        }
    }

    /// The retry limits in force.
    pub fn retry_limits(&self) -> RetryLimits {
        self.retry
    }

    /// The object key of `rel` (relative to the store root).
    fn key(&self, rel: &str) -> Result<ObjectPath, StorageError> {
        let full = match (self.prefix.is_empty(), rel.is_empty()) {
            (true, _) => rel.to_string(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{rel}", self.prefix),
        };
        ObjectPath::parse(&full).map_err(|_| StorageError::InvalidPath(rel.to_string()))
    }

    fn url(&self, rel: &str) -> String {
        match (self.prefix.is_empty(), rel.is_empty()) {
            (true, _) => format!("s3://{}/{rel}", self.bucket),
            (false, true) => format!("s3://{}/{}", self.bucket, self.prefix),
            (false, false) => format!("s3://{}/{}/{rel}", self.bucket, self.prefix),
        }
    }

    /// Runs the request that `make` builds until it succeeds, fails for good, or the attempts are
    /// used up, sleeping (exponential backoff with jitter) between attempts.
    fn retrying<T, Fut>(&self, mut make: impl FnMut() -> Fut) -> Result<(T, bool), Failure>
    where
        Fut: Future<Output = object_store::Result<T>>,
    {
        let mut backoff = self.retry.initial_backoff;
        let mut earlier_maybe_applied = false;
        let mut attempt = 1;
        loop {
            match self.runtime.block_on(make()) {
                Ok(value) => return Ok((value, earlier_maybe_applied)),
                Err(error) => {
                    let class = classify(&error);
                    if !class.transient || attempt >= self.retry.attempts {
                        return Err(Failure { error, class, attempts: attempt, earlier_maybe_applied });
                    }
                    earlier_maybe_applied |= class.maybe_applied;
                    std::thread::sleep(jitter(backoff));
                    backoff = (backoff * 2).min(self.retry.max_backoff);
                    attempt += 1;
                }
            }
        }
    }

    /// The [`StorageError`] of a request that failed for good.
    fn failed(&self, op: &'static str, rel: &str, f: Failure) -> StorageError {
        let hint = if f.class.transient {
            "the store did not answer in time, refused the connection or reported a server error: check \
             that the endpoint is up and reachable; the operation may succeed later"
        } else {
            match (&f.error, f.class.status) {
                (object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }, _)
                | (_, Some(401 | 403)) => {
                    "the store refused the credentials or their permissions: check the access key, the secret, \
                     the region and the bucket's policy"
                }
                (_, Some(404)) => "the bucket or object does not exist: check the bucket name and the endpoint",
                (_, Some(412)) => "a condition of the request did not hold",
                _ => "the store rejected the request: check the endpoint, the region and the bucket settings",
            }
        };
        StorageError::Remote {
            location: self.url(rel),
            op,
            status: f.class.status,
            transient: f.class.transient,
            attempts: f.attempts,
            hint,
            source: Box::new(f.error),
        }
    }
}

/// A sleep between half of `d` and `d`, so that clients failing together do not retry together.
fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(d.as_nanos() as u64);
    let fraction = (h.finish() % 1024) as u32; // 0..1024
    d / 2 + (d / 2) * fraction / 1024
}

/// Sorts a failure into transient (retry) or not. `object_store` keeps the HTTP status of a failed
/// answer in its error text only, so the status is read from there (`... status code: 503 ...`); a
/// failure without an answer is classified by the kind of its [`HttpError`].
fn classify(error: &object_store::Error) -> Class {
    use object_store::Error as E;
    let mut text = error.to_string();
    let mut http_kind = None;
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if let Some(h) = e.downcast_ref::<HttpError>() {
            http_kind.get_or_insert(h.kind());
        }
        text.push_str(" | ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    let status = status_in(&text).or(match error {
        E::NotFound { .. } => Some(404),
        E::PermissionDenied { .. } => Some(403),
        E::Unauthenticated { .. } => Some(401),
        E::Precondition { .. } => Some(412),
        E::NotModified { .. } => Some(304),
        _ => None,
    });
    let refused = Class { transient: false, maybe_applied: false, status };
    match error {
        E::Generic { .. } => {}
        // Answers that say what is wrong, and client-side errors: retrying cannot help.
        _ => return refused,
    }
    if let Some(status) = status {
        let transient = status >= 500 || status == 429 || status == 408;
        return Class { transient, maybe_applied: status >= 500, status: Some(status) };
    }
    if text.contains("Server returned error response") {
        // A 200 whose body reports InternalError or SlowDown (S3 does that for some requests).
        return Class { transient: true, maybe_applied: true, status: None };
    }
    match http_kind {
        // Not connected: the request cannot have reached the server.
        Some(HttpErrorKind::Connect) => Class { transient: true, maybe_applied: false, status: None },
        // Sent, at least in part, but no (whole) answer.
        Some(HttpErrorKind::Request | HttpErrorKind::Timeout | HttpErrorKind::Interrupted) => {
            Class { transient: true, maybe_applied: true, status: None }
        }
        // Undecodable answers, TLS and other errors a retry will meet again.
        _ => refused,
    }
}

/// The HTTP status in `object_store`'s text of a failed answer (`status code: 503 Service ...`).
fn status_in(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    let digits = text.get(at..at + 3)?;
    digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse().ok()).flatten()
}

/// Whether a 404 is about the bucket (which must exist) rather than the object.
fn is_missing_bucket(error: &object_store::Error) -> bool {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        text.push_str(&e.to_string());
        source = e.source();
    }
    text.contains("NoSuchBucket")
}

impl Files for S3Store {
    /// No lock: see the module documentation. The guard holds nothing and refuses nobody.
    fn lock(&self) -> Result<crate::StoreLock, StorageError> {
        Ok(crate::StoreLock::none())
    }

    fn display_path(&self, rel: &str) -> PathBuf {
        PathBuf::from(self.url(rel))
    }

    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let key = self.key(rel)?;
        let (store, key_ref) = (&self.store, &key);
        match self.retrying(|| async move { store.get(key_ref).await?.bytes().await }) {
            Ok((bytes, _)) => Ok(Some(bytes.to_vec())),
            Err(f) if matches!(f.error, object_store::Error::NotFound { .. }) && !is_missing_bucket(&f.error) => {
                Ok(None)
            }
            Err(f) => Err(self.failed("read", rel, f)),
        }
    }

    fn size(&self, rel: &str) -> Result<Option<u64>, StorageError> {
        let key = self.key(rel)?;
        // A HEAD answer has no body, so a missing bucket also looks like a missing object here; the
        // bucket was there at open, and every read and write reports it missing.
        match self.retrying(|| self.store.head(&key)) {
            Ok((meta, _)) => Ok(Some(meta.size)),
            Err(f) if matches!(f.error, object_store::Error::NotFound { .. }) => Ok(None),
            Err(f) => Err(self.failed("inspect", rel, f)),
        }
    }

    fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StorageError> {
        let key = self.key(rel)?;
        let payload = PutPayload::from(bytes.to_vec());
        self.retrying(|| self.store.put(&key, payload.clone())).map(|_| ()).map_err(|f| self.failed("write", rel, f))
    }

    fn put_new(&self, rel: &str, bytes: &[u8]) -> Result<bool, StorageError> {
        let key = self.key(rel)?;
        let payload = PutPayload::from(bytes.to_vec());
        let create = || self.store.put_opts(&key, payload.clone(), PutOptions::from(PutMode::Create));
        let mut last_conflict = None;
        for _ in 0..self.retry.attempts {
            let failure = match self.retrying(create) {
                Ok(_) => return Ok(true),
                Err(f) if matches!(f.error, object_store::Error::AlreadyExists { .. }) => f,
                Err(f) => return Err(self.failed("create", rel, f)),
            };
            match self.read(rel)? {
                // An earlier attempt of ours may have created it, its answer lost: if the object is
                // byte for byte ours, it is ours (had another writer put the same bytes, the
                // outcome would be the same anyway).
                Some(existing) if failure.earlier_maybe_applied && existing == bytes => return Ok(true),
                Some(_) => return Ok(false),
                // 409: a conditional write met a concurrent delete, and the object is not there.
                None => last_conflict = Some(failure),
            }
            std::thread::sleep(jitter(self.retry.initial_backoff));
        }
        let mut f = last_conflict.expect("at least one attempt");
        f.class.transient = true;
        Err(self.failed("create", rel, f))
    }

    fn list(&self, dir: &str) -> Result<Vec<Entry>, StorageError> {
        let key = self.key(dir)?;
        let prefix = (!key.as_ref().is_empty()).then_some(&key);
        let listing =
            self.retrying(|| self.store.list_with_delimiter(prefix)).map_err(|f| self.failed("list", dir, f))?.0;
        let name = |path: &ObjectPath| path.filename().filter(|n| !n.is_empty()).map(str::to_string);
        let dirs = listing.common_prefixes.iter().filter_map(name).map(|name| Entry { name, is_dir: true });
        let files = listing.objects.iter().filter_map(|o| name(&o.location)).map(|name| Entry { name, is_dir: false });
        Ok(dirs.chain(files).collect())
    }

    fn remove_file(&self, rel: &str) -> Result<(), StorageError> {
        let key = self.key(rel)?;
        match self.retrying(|| self.store.delete(&key)) {
            Ok(_) => Ok(()),
            Err(f) if matches!(f.error, object_store::Error::NotFound { .. }) && !is_missing_bucket(&f.error) => Ok(()),
            Err(f) => Err(self.failed("remove", rel, f)),
        }
    }

    /// Nothing to do: an object store has no directories. A prefix exists exactly while some object
    /// has it, so a checkpoint "directory" disappears with its last object; this never removes
    /// anything itself, hence `Ok(false)`.
    fn remove_dir_if_empty(&self, _dir: &str) -> Result<bool, StorageError> {
        Ok(false)
    }

    /// Nothing to do: an acknowledged PUT or DELETE is already durable on an object store.
    fn sync_dir(&self, _dir: &str) -> Result<(), StorageError> {
        Ok(())
    }

    fn describe(&self) -> String {
        self.location.clone()
    }
}

impl_checkpoint_store!(S3Store);

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    const GOOD: &[(&str, &str)] = &[
        ("CUTLINE_S3_ENDPOINT", "http://127.0.0.1:9000"),
        ("CUTLINE_S3_BUCKET", "ckpt"),
        ("AWS_ACCESS_KEY_ID", "k"),
        ("AWS_SECRET_ACCESS_KEY", "s"),
    ];

    #[test]
    fn config_from_vars_reads_the_standard_names_and_defaults() {
        let c = S3Config::from_vars(vars(GOOD)).unwrap();
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!((c.bucket.as_str(), c.prefix.as_str(), c.region.as_str()), ("ckpt", "", "us-east-1"));
        assert!(c.allow_http, "plain http is allowed for a loopback endpoint");
        assert_eq!(c.retry, RetryLimits::default());
        assert!(c.validate().is_ok());
        assert!(!format!("{c:?}").contains("\"s\""), "the secret is redacted: {c:?}");

        let mut more = GOOD.to_vec();
        more.extend([
            ("CUTLINE_S3_PREFIX", "jobs/a"),
            ("AWS_DEFAULT_REGION", "eu-west-1"),
            ("AWS_REGION", "eu-north-1"),
        ]);
        let c = S3Config::from_vars(vars(&more)).unwrap();
        assert_eq!((c.prefix.as_str(), c.region.as_str()), ("jobs/a", "eu-north-1"));
    }

    #[test]
    fn invalid_configs_are_refused_with_the_reason() {
        let err = |pairs: &[(&str, &str)]| match S3Config::from_vars(vars(pairs)).and_then(S3Store::open) {
            Err(StorageError::InvalidRoot { reason, .. }) => reason,
            other => panic!("expected InvalidRoot, got {other:?}"),
        };
        let without = |name: &str| GOOD.iter().copied().filter(|(k, _)| *k != name).collect::<Vec<_>>();
        let with = |name: &'static str, value: &'static str| {
            let mut v = without(name);
            v.push((name, value));
            v
        };
        assert!(err(&without("CUTLINE_S3_BUCKET")).contains("CUTLINE_S3_BUCKET is not set"));
        assert!(err(&without("AWS_SECRET_ACCESS_KEY")).contains("AWS_SECRET_ACCESS_KEY is not set"));
        assert!(err(&with("CUTLINE_S3_BUCKET", "Bad_Bucket")).contains("not a valid S3 bucket name"));
        assert!(err(&with("CUTLINE_S3_PREFIX", "a//b")).contains("prefix"));
        assert!(err(&with("CUTLINE_S3_PREFIX", "a/../b")).contains("prefix"));
        assert!(err(&with("CUTLINE_S3_ENDPOINT", "ftp://x")).contains("not an http:// or https:// URL"));
        assert!(err(&with("CUTLINE_S3_ENDPOINT", "http://example.com:9000")).contains("plain http"));
        assert!(err(&with("CUTLINE_S3_ALLOW_HTTP", "maybe")).contains("CUTLINE_S3_ALLOW_HTTP"));
        let mut c = S3Config::from_vars(vars(GOOD)).unwrap();
        c.retry.attempts = 0;
        assert!(
            matches!(S3Store::open(c.clone()), Err(StorageError::InvalidRoot { reason, .. }) if reason.contains("attempts"))
        );
        c.retry.attempts = 1;
        c.retry.initial_backoff = Duration::from_secs(10);
        assert!(
            matches!(S3Store::open(c), Err(StorageError::InvalidRoot { reason, .. }) if reason.contains("backoff"))
        );
    }

    #[test]
    fn loopback_endpoints_are_recognised() {
        for yes in ["http://127.0.0.1:9000", "http://localhost:1/", "http://[::1]:9000", "http://127.9.9.9"] {
            assert!(is_loopback_http(yes), "{yes}");
        }
        for no in ["https://127.0.0.1:9000", "http://10.0.0.1:9000", "http://example.com", "http://127.0.0.1.evil.com"]
        {
            assert!(!is_loopback_http(no), "{no}");
        }
    }

    #[test]
    fn statuses_are_read_from_object_store_error_text() {
        let t = "Generic S3 error: Error performing GET http://x/y in 2ms - Server returned non-2xx status code: \
                 503 Service Unavailable: <Error/>";
        assert_eq!(status_in(t), Some(503));
        assert_eq!(status_in("status code: 40"), None);
        assert_eq!(status_in("no status"), None);
    }

    #[test]
    fn jittered_sleeps_stay_between_half_and_all_of_the_delay() {
        for ms in [0u64, 1, 10, 100, 5000] {
            let d = Duration::from_millis(ms);
            for _ in 0..50 {
                let j = jitter(d);
                assert!(j >= d / 2 && j <= d, "{j:?} for {d:?}");
            }
        }
    }
}
