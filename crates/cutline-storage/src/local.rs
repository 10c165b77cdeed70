//! [`LocalDirStore`]: a checkpoint store in a local directory, with durable writes (temporary file,
//! fsync, atomic rename, fsync of the directory). It owns only the file-system primitives; the
//! checkpoint semantics come from [`crate::store`]. It locks the directory against a second run only
//! when asked ([`crate::CheckpointStore::lock`], an advisory `flock` of `<root>/LOCK`): the other
//! operations do not check the lock.

use crate::error::StorageError;
use crate::store::layout::{temp_name, CHECKPOINTS_DIR};
use crate::store::{impl_checkpoint_store, Entry, Files};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// A checkpoint store rooted at a local directory (see [`CheckpointStore`](crate::CheckpointStore)
/// for its layout). Every write is durable when it returns: written to a temporary file, fsynced,
/// renamed (a manifest or generation record: hard-linked, so that it is never replaced) and its
/// directory fsynced. [`CheckpointStore::lock`](crate::CheckpointStore::lock) takes an advisory
/// `flock` of `<root>/LOCK`; the other operations do not check it, so a run takes the lock first.
/// I/O failures are [`StorageError::Io`], transient only when interrupted or timed out.
#[derive(Debug)]
pub struct LocalDirStore {
    root: PathBuf,
}

impl LocalDirStore {
    /// Opens the store at `root`, creating the directory (and `checkpoints/`) if absent, and checks
    /// that it is writable by creating and removing a probe file. [`StorageError::InvalidRoot`] if
    /// `root` is not a directory, cannot be created or is not writable. It does not lock the store.
    /// To look at a store without changing anything, use [`LocalDirStore::open_existing`].
    pub fn open(root: impl AsRef<Path>) -> Result<LocalDirStore, StorageError> {
        let root = root.as_ref().to_path_buf();
        let invalid = |reason: String| StorageError::InvalidRoot { path: root.clone(), reason };
        match fs::metadata(&root) {
            Ok(meta) if !meta.is_dir() => {
                return Err(invalid("it exists and is not a directory; pass a directory path".to_string()))
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(invalid(format!("cannot inspect it ({e})"))),
        }
        fs::create_dir_all(root.join(CHECKPOINTS_DIR))
            .map_err(|e| invalid(format!("cannot create it ({e}); check the path and its permissions")))?;
        let probe = root.join(temp_name("open-probe"));
        File::create_new(&probe).map_err(|e| {
            invalid(format!("it is not writable ({e}); fix its permissions or choose another directory"))
        })?;
        match fs::remove_file(&probe) {
            // A job already running on this directory swept it as a leftover temporary file (its gc
            // removes those): the directory was writable all the same.
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            r => r.map_err(|e| StorageError::io(&probe, "remove", e))?,
        }
        Ok(LocalDirStore { root })
    }

    /// Opens an existing store for reading (listing, verifying) without creating or writing anything.
    /// [`StorageError::InvalidRoot`] if `root` is missing or not a directory. Nothing checks that it
    /// is writable: writes through it can fail later with [`StorageError::Io`].
    pub fn open_existing(root: impl AsRef<Path>) -> Result<LocalDirStore, StorageError> {
        let root = root.as_ref().to_path_buf();
        match fs::metadata(&root) {
            Ok(meta) if meta.is_dir() => Ok(LocalDirStore { root }),
            Ok(_) => Err(StorageError::InvalidRoot { path: root, reason: "it is not a directory".into() }),
            Err(e) => Err(StorageError::InvalidRoot { path: root, reason: format!("cannot open it ({e})") }),
        }
    }

    fn full(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    /// Splits `rel` into its (existing or created) directory and its file name.
    fn prepare_dir(&self, rel: &str) -> Result<(PathBuf, String), StorageError> {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let dir = self.full(dir);
        if !dir.is_dir() {
            fs::create_dir_all(&dir).map_err(|e| StorageError::io(&dir, "create directory", e))?;
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        Ok((dir, name.to_string()))
    }
}

/// Durably writes `bytes` to `dir/name`, replacing it atomically: a reader sees the old file or the
/// new one, and after a crash either is there whole. Leaves no temporary file behind on error.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StorageError> {
    write_atomic_from(dir, name, Source::Bytes(bytes))
}

/// [`write_atomic`] of what `src` holds.
fn write_atomic_from(dir: &Path, name: &str, src: Source<'_>) -> Result<(), StorageError> {
    let tmp = dir.join(temp_name(name));
    let result = write_synced(&tmp, src).and_then(|()| {
        fs::rename(&tmp, dir.join(name)).map_err(|e| StorageError::io(&tmp, "rename", e))?;
        sync_dir(dir)
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Like [`write_atomic`] but never replaces an existing `dir/name`: `Ok(false)` if it exists. Publishes
/// with a hard link, which fails atomically if the target exists; where links are not supported it
/// falls back to check-then-rename.
fn write_atomic_new(dir: &Path, name: &str, bytes: &[u8]) -> Result<bool, StorageError> {
    let tmp = dir.join(temp_name(name));
    let target = dir.join(name);
    let result = write_synced(&tmp, Source::Bytes(bytes)).and_then(|()| match fs::hard_link(&tmp, &target) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        Err(_) if target.exists() => Ok(false),
        Err(_) => fs::rename(&tmp, &target).map(|()| true).map_err(|e| StorageError::io(&tmp, "rename", e)),
    });
    let _ = fs::remove_file(&tmp);
    if result? {
        sync_dir(dir)?;
        Ok(true)
    } else {
        Ok(false)
    }
}

/// The buffer [`LocalDirStore::put_from`](Files::put_from) copies through.
const COPY_BUFFER_BYTES: usize = 1 << 20;

/// What a file is written from.
enum Source<'a> {
    Bytes(&'a [u8]),
    /// The first `len` bytes a reader gives, copied through a buffer.
    Reader(&'a mut dyn std::io::Read, u64),
}

fn write_synced(path: &Path, src: Source<'_>) -> Result<(), StorageError> {
    let mut file =
        OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| StorageError::io(path, "create", e))?;
    match src {
        Source::Bytes(bytes) => file.write_all(bytes).map_err(|e| StorageError::io(path, "write", e))?,
        Source::Reader(src, len) => {
            let mut written = 0u64;
            let mut buf = vec![0u8; (len as usize).clamp(1, COPY_BUFFER_BYTES)];
            while written < len {
                let want = buf.len().min((len - written) as usize);
                let n = src.read(&mut buf[..want]).map_err(|e| StorageError::io(path, "read the source of", e))?;
                if n == 0 {
                    let e = std::io::Error::new(ErrorKind::UnexpectedEof, format!("wrote {written} of {len} bytes"));
                    return Err(StorageError::io(path, "write", e));
                }
                file.write_all(&buf[..n]).map_err(|e| StorageError::io(path, "write", e))?;
                written += n as u64;
            }
        }
    }
    file.sync_all().map_err(|e| StorageError::io(path, "fsync", e))
}

/// Makes the entries of `dir` (created, renamed, removed files) durable.
fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    #[cfg(unix)]
    {
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| StorageError::io(dir, "fsync directory", e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

impl Files for LocalDirStore {
    fn lock(&self) -> Result<crate::StoreLock, StorageError> {
        let path = self.root.join("LOCK");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| StorageError::io(&path, "open lock file", e))?;
        match file.try_lock() {
            Ok(()) => Ok(crate::StoreLock::holding(Box::new(file))),
            Err(fs::TryLockError::WouldBlock) => Err(StorageError::Locked { path: self.root.clone() }),
            Err(fs::TryLockError::Error(e)) => Err(StorageError::io(&path, "lock", e)),
        }
    }

    fn display_path(&self, rel: &str) -> PathBuf {
        self.full(rel)
    }

    fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let path = self.full(rel);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io(path, "read", e)),
        }
    }

    fn size(&self, rel: &str) -> Result<Option<u64>, StorageError> {
        let path = self.full(rel);
        match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(Some(meta.len())),
            Ok(_) => Ok(None),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
            Err(e) => Err(StorageError::io(path, "inspect", e)),
        }
    }

    fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StorageError> {
        let (dir, name) = self.prepare_dir(rel)?;
        write_atomic(&dir, &name, bytes)
    }

    fn put_from(&self, rel: &str, src: &mut dyn std::io::Read, len: u64) -> Result<(), StorageError> {
        let (dir, name) = self.prepare_dir(rel)?;
        write_atomic_from(&dir, &name, Source::Reader(src, len))
    }

    fn put_new(&self, rel: &str, bytes: &[u8]) -> Result<bool, StorageError> {
        let (dir, name) = self.prepare_dir(rel)?;
        write_atomic_new(&dir, &name, bytes)
    }

    fn list(&self, dir: &str) -> Result<Vec<Entry>, StorageError> {
        let path = self.full(dir);
        let reader = match fs::read_dir(&path) {
            Ok(reader) => reader,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => return Ok(Vec::new()),
            Err(e) => return Err(StorageError::io(path, "list", e)),
        };
        let mut out = Vec::new();
        for entry in reader {
            let entry = entry.map_err(|e| StorageError::io(&path, "list", e))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue; // not a name cutline writes
            };
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            out.push(Entry { name, is_dir });
        }
        Ok(out)
    }

    fn remove_file(&self, rel: &str) -> Result<(), StorageError> {
        let path = self.full(rel);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(StorageError::io(path, "remove", e)),
            _ => Ok(()),
        }
    }

    fn remove_dir_if_empty(&self, dir: &str) -> Result<bool, StorageError> {
        let path = self.full(dir);
        match fs::read_dir(&path).map(|mut entries| entries.next().is_none()) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(StorageError::io(path, "list", e)),
        }
        match fs::remove_dir(&path) {
            Ok(()) => Ok(true),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DirectoryNotEmpty) => Ok(false),
            Err(e) => Err(StorageError::io(path, "remove directory", e)),
        }
    }

    fn sync_dir(&self, dir: &str) -> Result<(), StorageError> {
        sync_dir(&self.full(dir))
    }

    fn describe(&self) -> String {
        format!("local directory {}", self.root.display())
    }
}

impl_checkpoint_store!(LocalDirStore);
