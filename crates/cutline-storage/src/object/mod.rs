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
//! threads. Objects are written with a single PUT (at most 5 GiB), except task state files built
//! in a scratch file, which go up in parts (`upload.rs`; a process killed mid-upload leaves parts
//! that only the bucket's `AbortIncompleteMultipartUpload` lifecycle rule removes).

//!
//! Submodules: `config` ([`S3Config`], [`RetryLimits`]), `request` (the runtime that drives
//! `object_store`, retries and the classification of failures), `files` (the `Files` primitives)
//! and `upload` (multipart uploads from a reader).

mod config;
mod files;
mod request;
mod upload;

pub use config::{RetryLimits, S3Config};
pub use upload::{MAX_UPLOAD_PARTS, UPLOAD_PARTS_IN_FLIGHT, UPLOAD_PART_BYTES};

use crate::error::StorageError;
use crate::store::Files;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::client::{HttpClient, HttpConnector, ReqwestConnector};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig};
use std::path::PathBuf;

/// A checkpoint store in a bucket of an S3-compatible object store (AWS S3, MinIO, moto, ...), under
/// a prefix; only with the cargo feature `s3`. Same layout and semantics as every
/// [`CheckpointStore`](crate::CheckpointStore); what differs:
///
/// - Writes: manifests and generation records are created with a conditional PUT
///   (`If-None-Match: *`), so of two writers exactly one wins ([`S3Store::open`] refuses a server
///   that ignores the condition); every other file is one plain PUT, visible whole or not at all,
///   except a task state file built in a scratch file and larger than [`UPLOAD_PART_BYTES`]: a
///   multipart upload, [`UPLOAD_PARTS_IN_FLIGHT`] parts in flight and in memory at a time, each
///   part retried alone, visible when the
///   upload completes (aborted if it fails). A task state file held in memory is at most 5 GiB
///   (S3's limit of one PUT); one uploaded in parts, [`MAX_UPLOAD_PARTS`] parts.
/// - Failures: connection errors, timeouts and 5xx/429/408 answers are retried with exponential
///   backoff and jitter within [`RetryLimits`] ([`S3Config::retry`]), then reported as
///   [`StorageError::Remote`] with `transient: true`; refusals (401/403, a missing bucket, other 4xx)
///   are reported at once and are not transient. Every call blocks its thread until it succeeds or
///   fails for good.
/// - No locking: [`CheckpointStore::lock`](crate::CheckpointStore::lock) hands out a guard that holds
///   nothing (an object store has no `flock`, and a lock object would outlive a crashed holder).
///   Only create-if-absent manifests and the fencing of generation records keep two runs on one
///   prefix from corrupting each other: give each job its own prefix ([`S3Config::with_prefix`]).
/// - Threads: it drives the async `object_store` client on a private current-thread tokio runtime.
///   Calling it from inside a tokio runtime panics (tokio refuses nested `block_on`): call it from
///   threads that run no async code.
pub struct S3Store {
    store: AmazonS3,
    runtime: tokio::runtime::Runtime,
    bucket: String,
    /// Without leading or trailing '/'; may be empty.
    prefix: String,
    location: String,
    retry: RetryLimits,
    /// A client of its own for the one request `object_store` lacks (listing the open uploads of a
    /// key, see `upload.rs`), with the same timeouts.
    http: HttpClient,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Store").field("location", &self.location).field("retry", &self.retry).finish()
    }
}

impl S3Store {
    /// Opens the store described by `config`. Checks the configuration (a
    /// [`StorageError::InvalidRoot`] saying what is wrong), then with requests that the bucket
    /// exists and that the credentials may list, create and delete objects under the prefix, and
    /// that the server honours conditional creates (without them a manifest could be replaced).
    /// It writes, conditionally re-creates (which must be refused) and removes one probe object,
    /// `<prefix>/.open-probe.<pid>-<n>.tmp` (a temporary name: listings ignore it, gc removes it if a
    /// crash left it).
    ///
    /// [`StorageError::InvalidRoot`] for an invalid configuration, a missing bucket or a server that
    /// ignores conditional writes; [`StorageError::Remote`] if the server cannot be reached (after the
    /// retries of `config.retry`) or refuses the credentials. Panics if called from inside a tokio
    /// runtime (see [`S3Store`]).
    pub fn open(config: S3Config) -> Result<S3Store, StorageError> {
        let location = config.location();
        let invalid = |reason: String| StorageError::InvalidRoot { path: PathBuf::from(&location), reason };
        config.validate().map_err(&invalid)?;
        let retry = config.retry;
        let options = ClientOptions::new()
            .with_allow_http(config.allow_http)
            .with_timeout(retry.request_timeout)
            .with_connect_timeout(retry.connect_timeout);
        let http = ReqwestConnector::default()
            .connect(&options)
            .map_err(|e| invalid(format!("the object store client refused it: {e}")))?;
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
            http,
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
        let rel = crate::store::layout::temp_name("open-probe");
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

    /// The retry limits in force ([`S3Config::retry`] of the configuration it was opened with).
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
}
