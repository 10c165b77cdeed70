//! Large objects written from a reader in parts (S3's multipart upload), so that a task state file
//! built in a scratch file ([`crate::TaskStateFrame::spool`]) is never held whole in memory on its
//! way to the bucket.

use super::request::{retrying, Failure};
use super::S3Store;
use crate::error::StorageError;
use crate::store::Files;
use object_store::aws::AmazonS3;
use object_store::client::{HttpClient, HttpRequest, HttpRequestBody};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjectPath;
use object_store::signer::{Method, SignedUrlOptions, Signer};
use object_store::{MultipartId, PutPayload};
use std::collections::VecDeque;
use std::io::Read;
use std::panic::AssertUnwindSafe;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The size of each part of an upload but the last, unless the object is too large for
/// [`MAX_UPLOAD_PARTS`] of it (then the parts are larger). Objects up to this size are one PUT.
/// S3 wants at least 5 MiB per part but the last; some stores (Cloudflare R2) want them all equal.
pub const UPLOAD_PART_BYTES: u64 = 8 << 20;

/// Parts of one upload sent at once: each is read while the others wait for their answers, and an
/// upload holds this many parts in memory.
pub const UPLOAD_PARTS_IN_FLIGHT: usize = 2;

/// S3's limit on the parts of one upload.
pub const MAX_UPLOAD_PARTS: u64 = 10_000;

/// The part size for an object of `len` bytes.
fn part_bytes(len: u64) -> u64 {
    UPLOAD_PART_BYTES.max(len.div_ceil(MAX_UPLOAD_PARTS))
}

impl S3Store {
    /// Writes the `len` bytes `src` reads to `rel` as a multipart upload: parts of
    /// [`part_bytes`], [`UPLOAD_PARTS_IN_FLIGHT`] at a time, each read, sent (retried alone within
    /// the [`super::RetryLimits`]) and dropped; memory held is that many parts. The object appears
    /// whole when the upload completes, or not at all. Whichever way this ends but completion (an
    /// error of a part, of the completion or of the source, or a panic unwinding through it), the
    /// upload is aborted, best effort, and the original error or panic goes on (see [`Opened`]).
    /// An upload whose process dies before it completes or aborts stays invisible but stored until
    /// the bucket's lifecycle rule (`AbortIncompleteMultipartUpload`) removes it.
    pub(super) fn put_in_parts(&self, rel: &str, src: &mut dyn Read, len: u64) -> Result<(), StorageError> {
        let key = self.key(rel)?;
        let created = self.retrying(|| self.store.create_multipart(&key));
        // An attempt whose answer was lost may have created an upload that this one never heard of.
        let strays = match &created {
            Ok((_, earlier_maybe_applied)) => *earlier_maybe_applied,
            Err(f) => f.earlier_maybe_applied || f.class.maybe_applied,
        };
        let mut opened = Opened { s3: self, key: &key, open: None, ours: None, strays };
        let (id, _) = created.map_err(|f| self.failed("write", rel, f))?;
        (opened.open, opened.ours) = (Some(id.clone()), Some(id.clone()));
        let parts = self.send_parts(rel, &key, &id, src, len)?;
        match self.retrying(|| self.store.complete_multipart(&key, &id, parts.clone())) {
            Ok(_) => {}
            // An earlier attempt completed it and its answer was lost: the upload is gone, and
            // the object is there (a task state file's name is never reused).
            Err(f) if f.earlier_maybe_applied && self.size(rel).ok().flatten() == Some(len) => {}
            Err(f) => return Err(self.failed("write", rel, f)),
        }
        opened.open = None; // completed: nothing to abort
        Ok(())
    }

    fn send_parts(
        &self,
        rel: &str,
        key: &object_store::path::Path,
        id: &MultipartId,
        src: &mut dyn Read,
        len: u64,
    ) -> Result<Vec<PartId>, StorageError> {
        let part = part_bytes(len);
        let mut parts = Vec::with_capacity(len.div_ceil(part) as usize);
        // Aborted when dropped: after a failure or a panic the upload is aborted, so the other parts
        // need not finish (their tasks end when the runtime next runs, at the abort).
        let mut in_flight = InFlight::default();
        let mut left = len;
        // The parts are tasks on the store's runtime, which runs them while this thread (or another
        // using the store) waits in `block_on`; the next part is read outside it, so the runtime is
        // free for other threads meanwhile.
        loop {
            if left > 0 && in_flight.0.len() < UPLOAD_PARTS_IN_FLIGHT {
                let mut buf = vec![0u8; part.min(left) as usize];
                if let Err(e) = src.read_exact(&mut buf) {
                    return Err(StorageError::io(self.display_path(rel), "read the source of", e));
                }
                left -= buf.len() as u64;
                let payload = PutPayload::from(buf);
                let idx = parts.len() + in_flight.0.len();
                let (store, key, id, retry) = (self.store.clone(), key.clone(), id.clone(), self.retry);
                let task = self
                    .runtime
                    .spawn(async move { retrying(retry, || store.put_part(&key, &id, idx, payload.clone())).await });
                in_flight.0.push_back(task);
                continue;
            }
            let Some(oldest) = in_flight.0.pop_front() else { return Ok(parts) };
            match self.runtime.block_on(oldest) {
                Ok(Ok((part_id, _))) => parts.push(part_id),
                Ok(Err(f)) => return Err(self.failed("write", rel, f)),
                // A part's task panicked (never aborted before it is awaited): the others are
                // stopped (`in_flight` dropped) and the upload aborted (`Opened`) as it unwinds.
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
    }

    /// Aborts the uploads open for exactly `key` but `ours`: those that create attempts whose
    /// answers were lost made. Best effort. A task state file has one writer (its name is never
    /// reused), so no other writer's upload of the same key is open meanwhile.
    fn abort_strays(&self, key: &ObjectPath, ours: Option<&MultipartId>) {
        let Ok((uploads, _)) = self.retrying(|| open_uploads(&self.store, &self.http, key.as_ref())) else { return };
        for (_, id) in uploads.iter().filter(|(k, id)| k == key.as_ref() && Some(id) != ours) {
            let _ = self.retrying(|| self.store.abort_multipart(key, id));
        }
    }
}

/// The part tasks of an upload not yet awaited, stopped when dropped.
#[derive(Default)]
struct InFlight(VecDeque<JoinHandle<Result<(PartId, bool), Failure>>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

/// What [`S3Store::put_in_parts`] opened and has not closed, closed when it is dropped: when it
/// returns (an error or success) or a panic unwinds through it. Best effort: a failure to close
/// is dropped (the error or panic that ended the upload is the one reported), and so is a panic
/// while closing (never a second panic while one unwinds). What it cannot close stays invisible
/// and is left to the bucket's lifecycle rule.
struct Opened<'a> {
    s3: &'a S3Store,
    key: &'a ObjectPath,
    /// Our upload while it is neither completed nor aborted: aborted.
    open: Option<MultipartId>,
    /// Our upload, completed or not.
    ours: Option<MultipartId>,
    /// Whether a create attempt whose answer was lost may have opened uploads we never heard of:
    /// the key's open uploads but ours are listed and aborted.
    strays: bool,
}

impl Drop for Opened<'_> {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            if let Some(id) = &self.open {
                let _ = self.s3.retrying(|| self.s3.store.abort_multipart(self.key, id));
            }
            if self.strays {
                self.s3.abort_strays(self.key, self.ours.as_ref());
            }
        }));
    }
}

/// The multipart uploads open under `prefix` (S3's ListMultipartUploads, which `object_store` does
/// not offer): key and upload id, the first 1,000 only. A URL signed by the store's client, sent by
/// `http`. Errors as `object_store`'s, so that [`retrying`] classifies them: a non-2xx answer's
/// text names its status.
async fn open_uploads(
    store: &AmazonS3,
    http: &HttpClient,
    prefix: &str,
) -> object_store::Result<Vec<(String, MultipartId)>> {
    type Source = Box<dyn std::error::Error + Send + Sync>;
    let generic = |source: Source| object_store::Error::Generic { store: "S3", source };
    let query = SignedUrlOptions::new().with_query([("uploads", ""), ("prefix", prefix)]);
    let url = store.signed_url_opts(Method::GET, &ObjectPath::default(), Duration::from_secs(300), &query).await?;
    let mut request = HttpRequest::new(HttpRequestBody::empty());
    *request.uri_mut() = url.as_str().parse().map_err(|e| generic(Box::new(e)))?;
    let response = http.execute(request).await.map_err(|e| generic(Box::new(e)))?;
    let status = response.status();
    let body = response.into_body().bytes().await.map_err(|e| generic(Box::new(e)))?;
    let body = String::from_utf8_lossy(&body);
    if !status.is_success() {
        let error = format!("listing the open uploads: Server returned non-2xx status code: {status}: {body}");
        return Err(generic(error.into()));
    }
    Ok(parse_uploads(&body))
}

/// Key and upload id of each `<Upload>` of a ListMultipartUploads answer.
fn parse_uploads(xml: &str) -> Vec<(String, MultipartId)> {
    let field = |upload: &str, name: &str| {
        let (open, close) = (format!("<{name}>"), format!("</{name}>"));
        let from = upload.find(&open)? + open.len();
        let to = from + upload[from..].find(&close)?;
        Some(unescape(&upload[from..to]))
    };
    xml.split("<Upload>")
        .skip(1)
        .filter_map(|upload| Some((field(upload, "Key")?, field(upload, "UploadId")?)))
        .collect()
}

/// The text of an XML element (the five predefined entities; keys of a store's layout need no more).
fn unescape(text: &str) -> String {
    let (mut out, mut rest) = (String::with_capacity(text.len()), text);
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let entity = [("&amp;", '&'), ("&lt;", '<'), ("&gt;", '>'), ("&quot;", '"'), ("&apos;", '\'')]
            .into_iter()
            .find(|(e, _)| rest.starts_with(e));
        match entity {
            Some((e, c)) => (out.push(c), rest = &rest[e.len()..]),
            None => (out.push('&'), rest = &rest[1..]),
        };
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_eight_mib_until_an_object_needs_more_than_the_limit_of_parts() {
        assert_eq!(part_bytes(20 << 20), UPLOAD_PART_BYTES);
        assert_eq!(part_bytes(UPLOAD_PART_BYTES * MAX_UPLOAD_PARTS), UPLOAD_PART_BYTES);
        let huge = UPLOAD_PART_BYTES * MAX_UPLOAD_PARTS + 1;
        assert!(huge.div_ceil(part_bytes(huge)) <= MAX_UPLOAD_PARTS);
    }

    #[test]
    fn open_uploads_are_read_from_a_list_multipart_uploads_answer() {
        let xml = "<?xml version=\"1.0\"?><ListMultipartUploadsResult><Bucket>b</Bucket><KeyMarker/>\
                   <Upload><Key>p/chk-1/a&amp;b-0.state</Key><UploadId>id-1</UploadId><Initiated>x</Initiated></Upload>\
                   <Upload><UploadId>id-2</UploadId><Key>p/&lt;2&gt;</Key></Upload>\
                   <IsTruncated>false</IsTruncated></ListMultipartUploadsResult>";
        let uploads = parse_uploads(xml);
        assert_eq!(uploads, vec![("p/chk-1/a&b-0.state".into(), "id-1".into()), ("p/<2>".into(), "id-2".into())]);
        assert_eq!(parse_uploads("<ListMultipartUploadsResult><KeyMarker/></ListMultipartUploadsResult>"), vec![]);
        assert_eq!(unescape("&quot;&apos;&amp;amp;&"), "\"'&amp;&");
    }

    /// The one failure that only a unit test can bring about: a panic while the upload is open (here
    /// in the source; a part's task that panics takes the same way out). Against the real server
    /// of `tests/s3` (`scripts/s3-test-server`), like it failing without one. The upload is open
    /// when the source panics (listed then) and aborted after (listed no more), and the panic goes
    /// on, as it was.
    #[test]
    fn a_panic_mid_upload_aborts_the_upload_and_goes_on() {
        let Ok(config) = crate::S3Config::from_env() else {
            panic!("needs an S3 server named by CUTLINE_S3_ENDPOINT etc.: eval \"$(scripts/s3-test-server)\"")
        };
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let config = config.with_prefix(format!("cutline-tests/unit-panic-{}-{nanos}", std::process::id()));
        let store = S3Store::open(config).unwrap();
        let key = store.key("big.state").unwrap();
        let list = || {
            let listed = store.retrying(|| open_uploads(&store.store, &store.http, key.as_ref()));
            listed.unwrap_or_else(|f| panic!("listing the open uploads: {}", f.error)).0
        };

        /// Zeros, then a panic once two parts were handed over, after listing the open uploads.
        struct PanicsMidUpload<'a> {
            given: u64,
            list: &'a dyn Fn() -> Vec<(String, MultipartId)>,
            open_then: Option<Vec<(String, MultipartId)>>,
        }
        impl Read for PanicsMidUpload<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.given >= 2 * UPLOAD_PART_BYTES {
                    self.open_then = Some((self.list)());
                    panic!("the source panicked");
                }
                buf.fill(0);
                self.given += buf.len() as u64;
                Ok(buf.len())
            }
        }
        let mut src = PanicsMidUpload { given: 0, list: &list, open_then: None };
        let len = 3 * UPLOAD_PART_BYTES;
        let panic = std::panic::catch_unwind(AssertUnwindSafe(|| store.put_in_parts("big.state", &mut src, len)));
        let message = panic.expect_err("the panic goes on").downcast::<&str>().map(|m| *m);
        assert_eq!(message.ok(), Some("the source panicked"));
        let open_then = src.open_then.expect("the source was read up to its panic");
        assert_eq!(open_then.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), [key.as_ref()], "open then");
        assert_eq!(list(), vec![], "the upload is not left open");
        assert_eq!(store.size("big.state").unwrap(), None, "no object");
    }
}
