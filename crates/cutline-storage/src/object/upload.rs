//! Large objects written from a reader in parts (S3's multipart upload), so that a task state file
//! built in a scratch file ([`crate::TaskStateFrame::spool`]) is never held whole in memory on its
//! way to the bucket.

use super::request::{retrying, Failure};
use super::S3Store;
use crate::error::StorageError;
use crate::store::Files;
use object_store::multipart::{MultipartStore, PartId};
use object_store::PutPayload;
use std::collections::VecDeque;
use std::io::Read;
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
    /// the [`super::RetryLimits`]) and dropped; memory held is that many parts. The object appears whole when the upload
    /// completes, or not at all: a failed upload is aborted. An upload whose process dies before
    /// it completes or aborts stays invisible but stored until the bucket's lifecycle rule
    /// (`AbortIncompleteMultipartUpload`) removes it.
    pub(super) fn put_in_parts(&self, rel: &str, src: &mut dyn Read, len: u64) -> Result<(), StorageError> {
        let key = self.key(rel)?;
        let (id, _) = self.retrying(|| self.store.create_multipart(&key)).map_err(|f| self.failed("write", rel, f))?;
        let sent = self.send_parts(rel, &key, &id, src, len);
        let completed = sent.and_then(|parts| {
            match self.retrying(|| self.store.complete_multipart(&key, &id, parts.clone())) {
                Ok(_) => Ok(()),
                // An earlier attempt completed it and its answer was lost: the upload is gone, and
                // the object is there (a task state file's name is never reused).
                Err(f) if f.earlier_maybe_applied && self.size(rel).ok().flatten() == Some(len) => Ok(()),
                Err(f) => Err(self.failed("write", rel, f)),
            }
        });
        if completed.is_err() {
            // Best effort: parts left behind cost storage until a lifecycle rule removes them.
            let _ = self.retrying(|| self.store.abort_multipart(&key, &id));
        }
        completed
    }

    fn send_parts(
        &self,
        rel: &str,
        key: &object_store::path::Path,
        id: &object_store::MultipartId,
        src: &mut dyn Read,
        len: u64,
    ) -> Result<Vec<PartId>, StorageError> {
        let part = part_bytes(len);
        let mut parts = Vec::with_capacity(len.div_ceil(part) as usize);
        let mut in_flight: VecDeque<JoinHandle<Result<(PartId, bool), Failure>>> = VecDeque::new();
        let mut left = len;
        // The parts are tasks on the store's runtime, which runs them while this thread (or another
        // using the store) waits in `block_on`; the next part is read outside it, so the runtime is
        // free for other threads meanwhile.
        let sent =
            loop {
                if left > 0 && in_flight.len() < UPLOAD_PARTS_IN_FLIGHT {
                    let mut buf = vec![0u8; part.min(left) as usize];
                    if let Err(e) = src.read_exact(&mut buf) {
                        break Err(StorageError::io(self.display_path(rel), "read the source of", e));
                    }
                    left -= buf.len() as u64;
                    let payload = PutPayload::from(buf);
                    let idx = parts.len() + in_flight.len();
                    let (store, key, id, retry) = (self.store.clone(), key.clone(), id.clone(), self.retry);
                    in_flight.push_back(self.runtime.spawn(async move {
                        retrying(retry, || store.put_part(&key, &id, idx, payload.clone())).await
                    }));
                    continue;
                }
                let Some(oldest) = in_flight.pop_front() else { break Ok(parts) };
                match self.runtime.block_on(oldest) {
                    Ok(Ok((part_id, _))) => parts.push(part_id),
                    Ok(Err(f)) => break Err(self.failed("write", rel, f)),
                    Err(e) => {
                        // A part's task panicked (never aborted before it is awaited): stop the others
                        // before passing the panic on.
                        in_flight.iter().for_each(JoinHandle::abort);
                        std::panic::resume_unwind(e.into_panic())
                    }
                }
            };
        // After a failure: the upload is aborted, so the other parts need not finish (their tasks
        // end when the runtime next runs, at the abort).
        in_flight.iter().for_each(JoinHandle::abort);
        sent
    }
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
}
