//! The configuration of an [`S3Store`](super::S3Store): where it lives ([`S3Config`], also from the
//! environment) and how it retries ([`RetryLimits`]), and the checks of both that need no request.

use crate::error::StorageError;
use std::path::PathBuf;
use std::time::Duration;

/// How [`S3Store`](super::S3Store) retries transient failures, and how long one request may take.
/// Checked by [`S3Store::open`](super::S3Store::open) (`attempts >= 1`,
/// `initial_backoff <= max_backoff`, both timeouts above zero).
///
/// The worst case of one request (one GET, HEAD, PUT, LIST or DELETE) is `attempts` tries of at most
/// `request_timeout` each, plus the sleeps between them, each at most `max_backoff`. A conditional
/// create (a manifest commit, a generation claim) that keeps meeting concurrent deletes is repeated,
/// with a read each time, up to `attempts` times. A store operation such as
/// [`CheckpointStore::verify`](crate::CheckpointStore::verify) makes many requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryLimits {
    /// Requests sent for one operation, the first included (at least 1; 1 = no retry).
    pub attempts: u32,
    /// The backoff after the first failure; it doubles after each further failure...
    pub initial_backoff: Duration,
    /// ...up to this. Each sleep is drawn between half of the current backoff and all of it
    /// (jitter), so that clients failing together do not retry together.
    pub max_backoff: Duration,
    /// The limit of one try of a request, from sending it to the end of the answer; a try that
    /// exceeds it fails as a (transient) timeout.
    pub request_timeout: Duration,
    /// The limit of connecting to the endpoint, within `request_timeout`.
    pub connect_timeout: Duration,
}

impl Default for RetryLimits {
    /// 6 attempts, 100 ms doubling to at most 5 s (5 sleeps of at most 0.1, 0.2, 0.4, 0.8 and
    /// 1.6 s: at most 3.1 s of sleeps per request), 60 s per try, 5 s to connect. Worst case of one
    /// request: 6 × 60 s + 3.1 s, about 6 minutes; an endpoint that cannot be connected to fails within
    /// 6 × 5 s + 3.1 s.
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

/// Where an [`S3Store`](super::S3Store) lives and how to reach it. Build it by hand or with
/// [`S3Config::from_env`]; [`S3Store::open`](super::S3Store::open) checks it.
#[derive(Clone)]
pub struct S3Config {
    /// The server, e.g. `http://127.0.0.1:9000`; `None` for AWS S3 itself (in `region`). Requests
    /// are path-style (`endpoint/bucket/key`).
    pub endpoint: Option<String>,
    /// The bucket; it must exist ([`S3Store::open`](super::S3Store::open) does not create it) and be
    /// a valid S3 bucket name (3 to 63 lowercase letters, digits, `.` and `-`, starting and ending
    /// with a letter or digit).
    pub bucket: String,
    /// The store's root inside the bucket, '/'-separated (leading and trailing '/' are ignored; no
    /// empty, `.` or `..` parts); `""` for the whole bucket. Two stores with different prefixes never
    /// see each other's objects.
    pub prefix: String,
    /// The region requests are signed for, e.g. `us-east-1`; must not be empty (most test servers
    /// accept any value).
    pub region: String,
    /// The access key id of the credentials; must not be empty.
    pub access_key_id: String,
    /// The secret of `access_key_id`; must not be empty. Redacted in `Debug`.
    pub secret_access_key: String,
    /// The session token of temporary credentials, if they are such. Redacted in `Debug`.
    pub session_token: Option<String>,
    /// Whether a plain `http://` endpoint is allowed (test servers); otherwise only `https://`.
    pub allow_http: bool,
    /// How requests are retried and timed out ([`RetryLimits::default`] from
    /// [`S3Config::from_env`]).
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

    pub(super) fn location(&self) -> String {
        describe_location(&self.bucket, self.prefix.trim_matches('/'), self.endpoint.as_deref())
    }

    /// Checks everything that can be checked without a request; the reason of the first problem.
    pub(super) fn validate(&self) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::S3Store;

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
}
