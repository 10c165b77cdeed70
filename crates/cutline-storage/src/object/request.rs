//! The runtime glue of [`S3Store`]: it drives `object_store`'s async requests on the store's private
//! current-thread runtime, retries transient failures with backoff, and classifies failures into
//! [`StorageError`]s.

use super::{RetryLimits, S3Store};
use crate::error::StorageError;
use object_store::client::{HttpError, HttpErrorKind};
use std::future::Future;
use std::time::Duration;

/// How a failed request is to be treated.
#[derive(Clone, Copy, Debug)]
pub(super) struct Class {
    pub(super) transient: bool,
    /// Whether the request may have taken effect although it failed (sent, but no clean answer).
    pub(super) maybe_applied: bool,
    pub(super) status: Option<u16>,
}

/// A request that failed for good: the last error and how it was classified.
pub(super) struct Failure {
    pub(super) error: object_store::Error,
    pub(super) class: Class,
    pub(super) attempts: u32,
    /// Whether an earlier attempt may have taken effect (see [`Class::maybe_applied`]).
    pub(super) earlier_maybe_applied: bool,
}

impl S3Store {
    /// Runs the request that `make` builds until it succeeds, fails for good, or the attempts are
    /// used up, sleeping (exponential backoff with jitter) between attempts.
    pub(super) fn retrying<T, Fut>(&self, make: impl FnMut() -> Fut) -> Result<(T, bool), Failure>
    where
        Fut: Future<Output = object_store::Result<T>>,
    {
        self.runtime.block_on(retrying(self.retry, make))
    }

    /// The [`StorageError`] of a request that failed for good.
    pub(super) fn failed(&self, op: &'static str, rel: &str, f: Failure) -> StorageError {
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

/// [`S3Store::retrying`] as a future, for requests that run side by side on the store's runtime.
/// The value comes with whether an earlier attempt may have taken effect.
pub(super) async fn retrying<T, Fut>(retry: RetryLimits, mut make: impl FnMut() -> Fut) -> Result<(T, bool), Failure>
where
    Fut: Future<Output = object_store::Result<T>>,
{
    let mut backoff = retry.initial_backoff;
    let mut earlier_maybe_applied = false;
    let mut attempt = 1;
    loop {
        match make().await {
            Ok(value) => return Ok((value, earlier_maybe_applied)),
            Err(error) => {
                let class = classify(&error);
                if !class.transient || attempt >= retry.attempts {
                    return Err(Failure { error, class, attempts: attempt, earlier_maybe_applied });
                }
                earlier_maybe_applied |= class.maybe_applied;
                tokio::time::sleep(jitter(backoff)).await;
                backoff = (backoff * 2).min(retry.max_backoff);
                attempt += 1;
            }
        }
    }
}

/// A sleep between half of `d` and `d`, so that clients failing together do not retry together.
pub(super) fn jitter(d: Duration) -> Duration {
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
pub(super) fn is_missing_bucket(error: &object_store::Error) -> bool {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        text.push_str(&e.to_string());
        source = e.source();
    }
    text.contains("NoSuchBucket")
}

#[cfg(test)]
mod tests {
    use super::*;

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
