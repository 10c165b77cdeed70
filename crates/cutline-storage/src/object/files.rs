//! The `Files` primitives of [`S3Store`] (see the mapping in the documentation of [`super`]), which
//! make it a [`crate::CheckpointStore`] through `impl_checkpoint_store!`.

use super::request::{is_missing_bucket, jitter};
use super::S3Store;
use crate::error::StorageError;
use crate::store::{impl_checkpoint_store, read_source, Entry, Files};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::path::PathBuf;

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

    /// Up to [`UPLOAD_PART_BYTES`](super::upload::UPLOAD_PART_BYTES): read whole, then one PUT.
    /// Larger: a multipart upload, holding the parts in flight (`UPLOAD_PARTS_IN_FLIGHT`).
    fn put_from(&self, rel: &str, src: &mut dyn std::io::Read, len: u64) -> Result<(), StorageError> {
        if len <= super::upload::UPLOAD_PART_BYTES {
            return self.put(rel, &read_source(&self.display_path(rel), src, len)?);
        }
        self.put_in_parts(rel, src, len)
    }

    fn put_new(&self, rel: &str, bytes: &[u8]) -> Result<bool, StorageError> {
        let key = self.key(rel)?;
        let payload = PutPayload::from(bytes.to_vec());
        let create = || self.store.put_opts(&key, payload.clone(), PutOptions::from(PutMode::Create));
        let mut conflicts = 0;
        loop {
            let mut failure = match self.retrying(create) {
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
                None => {}
            }
            conflicts += 1;
            if conflicts >= self.retry.attempts {
                failure.class.transient = true;
                return Err(self.failed("create", rel, failure));
            }
            std::thread::sleep(jitter(self.retry.initial_backoff));
        }
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
