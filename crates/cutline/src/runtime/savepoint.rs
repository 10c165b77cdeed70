//! Savepoints on disk: exporting a completed savepoint checkpoint as a self-contained store (its own
//! directory, no file shared with the job's checkpoints, untouched by retention), and opening one to
//! start a new run of the job from it.
//!
//! It does not trigger savepoints (the coordinator does, on request) and does not decide when a run
//! restores from one (the runtime: only when the job's own store has no complete checkpoint).

use cutline_core::{CheckpointId, Generation};
use cutline_storage::{CheckpointStore, JobMeta, LocalDirStore, Manifest};
use std::path::{Path, PathBuf};

/// A completed, exported savepoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavepointInfo {
    /// The checkpoint the savepoint was taken as.
    pub checkpoint: CheckpointId,
    /// The self-contained directory: pass it to a new run with `--from-savepoint` /
    /// [`RunConfig::from_savepoint`](super::RunConfig::from_savepoint).
    pub path: PathBuf,
    /// Bytes of state copied.
    pub bytes: u64,
}

/// Copy complete checkpoint `id` of `from` into a new store at `to` (which must not exist or be an
/// empty directory), then read the copy back and verify it.
pub(crate) fn export(
    from: &dyn CheckpointStore,
    id: CheckpointId,
    to: &Path,
    fingerprint: &str,
) -> Result<SavepointInfo, String> {
    if let Ok(mut entries) = std::fs::read_dir(to) {
        if entries.next().is_some() {
            return Err(format!("savepoint target {} exists and is not empty: choose a new directory", to.display()));
        }
    }
    std::fs::create_dir_all(to).map_err(|e| format!("creating savepoint directory {}: {e}", to.display()))?;
    let target = LocalDirStore::open(to).map_err(|e| e.to_string())?;
    // Each task's files are copied as the verification hands them over: every file is read once.
    let mut tasks = Vec::new();
    let mut failed = None;
    let manifest = from
        .verify_reading(id, &mut |h, payloads| {
            if failed.is_none() {
                match copy_chain(&target, id, h, &payloads) {
                    Ok(copy) => tasks.push(copy),
                    Err(e) => failed = Some(e),
                }
            }
        })
        .map_err(|e| format!("reading checkpoint {id} back: {e}"))?;
    if let Some(e) = failed {
        return Err(e);
    }
    assert_eq!(manifest.checkpoint, id);
    let copy = Manifest::new(fingerprint, id, manifest.generation, manifest.created_at_unix_ms, false, tasks);
    let bytes = copy.total_size_bytes();
    target
        .write_meta(&JobMeta {
            job_fingerprint: fingerprint.to_string(),
            generation: manifest.generation,
            epoch_lease_end: id.next(),
        })
        .map_err(|e| e.to_string())?;
    target.commit_manifest(&copy).map_err(|e| e.to_string())?;
    // Read back: a savepoint that does not verify is no savepoint.
    let back = target.verify(id).map_err(|e| format!("the exported savepoint does not verify: {e}"))?;
    assert_eq!(back, copy, "exported savepoint manifest changed on the way to disk");
    Ok(SavepointInfo { checkpoint: id, path: to.to_path_buf(), bytes })
}

/// Writes the chain of task state `payloads` of `h` (checkpoint `id`) into `target`, each file into
/// the directory of its own checkpoint, and returns the handle of the copy: an incremental snapshot
/// is copied with the files it builds on, so the savepoint shares no file with the job's store.
fn copy_chain(
    target: &LocalDirStore,
    id: CheckpointId,
    h: &cutline_storage::TaskStateHandle,
    payloads: &[Vec<u8>],
) -> Result<cutline_storage::TaskStateHandle, String> {
    let ids = h.base.iter().map(|b| b.checkpoint).chain(std::iter::once(id));
    let mut base = Vec::with_capacity(h.base.len());
    let mut copy = None;
    for (at, payload) in ids.zip(payloads) {
        let mut written = target
            .write_task_state(at, &h.operator, h.subtask, h.parallelism, h.key_groups, payload)
            .map_err(|e| e.to_string())?;
        if at == id {
            written.base = std::mem::take(&mut base);
            copy = Some(written);
        } else {
            base.push(written.file_ref(at));
        }
    }
    Ok(copy.expect("a chain ends with the handle's own file"))
}

/// An exported savepoint, opened for restoring.
pub(crate) struct OpenSavepoint {
    pub store: LocalDirStore,
    pub checkpoint: CheckpointId,
    pub generation: Generation,
}

/// Open the savepoint at `path`: its newest complete checkpoint (an export holds exactly one).
pub(crate) fn open(path: &Path) -> Result<OpenSavepoint, String> {
    let store = LocalDirStore::open_existing(path)
        .map_err(|e| format!("savepoint {}: {e} (pass the directory `cutline savepoint` printed)", path.display()))?;
    let id = store
        .latest_complete()
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} holds no complete savepoint", path.display()))?;
    let manifest = store.read_manifest(id).map_err(|e| e.to_string())?;
    Ok(OpenSavepoint { store, checkpoint: id, generation: manifest.generation })
}
