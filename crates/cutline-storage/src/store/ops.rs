//! The checkpoint semantics, once, over [`Files`]: task state, the manifest as commit point,
//! listing, verification, discard, retention (gc), job metadata and the finished marker. Generation
//! records and fencing are [`super::fencing`]'s; this module asks it what is fenced.

use super::fencing::{generation_names, Fences};
use super::files::Files;
use super::layout::{
    checkpoint_dir, generation_path, is_temp_name, join, manifest_path, parse_checkpoint_dir, task_state_path,
    validate_file_ref, validate_operator_id, CHECKPOINTS_DIR, FINISHED_PATH, GENERATIONS_DIR, MANIFEST_NAME, META_PATH,
};
use super::{CheckpointListing, GcReport};
use crate::error::StorageError;
use crate::format::{decode_frame_at, decode_record, decode_versioned, encode_record, FileKind};
use crate::frame::{FrameBody, TaskStateFrame};
use crate::manifest::{JobMeta, Manifest, TaskStateHandle};
use crate::FORMAT_VERSION;
use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};
use std::collections::BTreeSet;

/// How many of the newest generation records gc always keeps.
const KEEP_NEWEST_GENERATIONS: usize = 2;

/// The CRC32 of a framed file without its trailer: the value its trailer holds when intact. (The CRC of
/// a whole frame would be useless: a CRC over data followed by its own CRC is the same constant for all
/// data.)
fn content_crc(framed: &[u8]) -> u32 {
    crc32fast::hash(&framed[..framed.len().saturating_sub(4)])
}

pub fn write_task_frame<F: Files>(
    fs: &F,
    (checkpoint, operator, subtask): (CheckpointId, &OperatorId, SubtaskIndex),
    parallelism: u32,
    key_groups: Option<KeyGroupRange>,
    frame: &TaskStateFrame,
) -> Result<TaskStateHandle, StorageError> {
    validate_operator_id(operator)?;
    if fs.size(&manifest_path(checkpoint))?.is_some() {
        return Err(StorageError::ManifestExists(checkpoint));
    }
    let file = task_state_path(checkpoint, operator, subtask);
    match &frame.0 {
        FrameBody::Memory(framed) => fs.put(&file, framed)?,
        FrameBody::Spooled(spool) => fs.put_from(&file, &mut spool.reader()?, spool.len)?,
    }
    Ok(TaskStateHandle {
        operator: operator.clone(),
        subtask,
        parallelism,
        key_groups,
        file,
        size_bytes: frame.len_bytes(),
        crc32: frame.content_crc(),
        base: Vec::new(),
    })
}

pub fn read_task_state<F: Files>(fs: &F, handle: &TaskStateHandle) -> Result<Vec<u8>, StorageError> {
    read_state_file(fs, handle, (&handle.file, handle.size_bytes, handle.crc32))
}

pub fn read_task_chain<F: Files>(fs: &F, handle: &TaskStateHandle) -> Result<Vec<Vec<u8>>, StorageError> {
    handle.chain().map(|file| read_state_file(fs, handle, file)).collect()
}

/// One file of `handle`'s chain, checked against the size and checksum recorded for it.
fn read_state_file<F: Files>(
    fs: &F,
    handle: &TaskStateHandle,
    (file, size_bytes, crc32): (&str, u64, u32),
) -> Result<Vec<u8>, StorageError> {
    validate_file_ref(file)?;
    let path = fs.display_path(file);
    let bytes = fs.read(file)?.ok_or_else(|| StorageError::NotFound {
        what: format!("state of operator {} subtask {} ({})", handle.operator, handle.subtask.0, path.display()),
    })?;
    if bytes.len() as u64 != size_bytes {
        return Err(StorageError::SizeMismatch { path, expected: size_bytes, actual: bytes.len() as u64 });
    }
    let actual = content_crc(&bytes);
    if actual != crc32 {
        return Err(StorageError::ChecksumMismatch { path, expected: crc32, actual });
    }
    let payload = decode_frame_at(&path, &bytes, FileKind::TaskState)?.payload;
    let start = payload.as_ptr() as usize - bytes.as_ptr() as usize;
    let end = start + payload.len();
    // The payload moved to the front of the file's own buffer: a large file is not held twice.
    let mut bytes = bytes;
    bytes.truncate(end);
    bytes.drain(..start);
    Ok(bytes)
}

pub fn commit_manifest<F: Files>(fs: &F, manifest: &Manifest) -> Result<(), StorageError> {
    let id = manifest.checkpoint;
    // The asserts here check the caller's own manifest (built with `Manifest::new` from the handles
    // that its own task state writes returned, whose files the sizes are compared with), not a file
    // someone else left: a failure is a bug of the caller, documented on `CheckpointStore::commit_manifest`.
    assert_eq!(
        manifest.format_version, FORMAT_VERSION,
        "manifests are written in the current format version; build them with Manifest::new"
    );
    if fs.size(&manifest_path(id))?.is_some() {
        return Err(StorageError::ManifestExists(id));
    }
    for task in &manifest.tasks {
        validate_file_ref(&task.file)?;
        let size = fs.size(&task.file)?;
        assert_eq!(
            size,
            Some(task.size_bytes),
            "manifest of {id} references {} with {} bytes, but the store has {size:?}: a manifest may \
             only reference acknowledged task state writes",
            task.file,
            task.size_bytes,
        );
        // Base files were written and acknowledged for older checkpoints, and retention may have
        // removed them since: refused, not a panic. (Retention and commits run on one thread, so a
        // base found here stays: once committed, this manifest is retained and keeps it.)
        for base in &task.base {
            validate_file_ref(&base.file)?;
            if base.checkpoint >= id || fs.size(&base.file)? != Some(base.size_bytes) {
                return Err(StorageError::BaseMissing { checkpoint: id, file: base.file.clone() });
            }
        }
    }
    let framed = encode_record(FileKind::Manifest, manifest);
    if fs.put_new(&manifest_path(id), &framed)? {
        Ok(())
    } else {
        Err(StorageError::ManifestExists(id))
    }
}

/// Every checkpoint directory, `complete` meaning only that its manifest is there (fenced or not).
fn list_committed<F: Files>(fs: &F) -> Result<Vec<CheckpointListing>, StorageError> {
    let mut out = Vec::new();
    for entry in fs.list(CHECKPOINTS_DIR)? {
        let Some(id) = parse_checkpoint_dir(&entry.name).filter(|_| entry.is_dir) else {
            continue;
        };
        let complete = fs.size(&manifest_path(id))?.is_some();
        out.push(CheckpointListing { id, complete, fenced: false });
    }
    out.sort_by_key(|l| l.id);
    Ok(out)
}

/// Without reading generation records or manifests: fenced ids count too.
pub fn max_checkpoint_id_seen<F: Files>(fs: &F) -> Result<Option<CheckpointId>, StorageError> {
    Ok(list_committed(fs)?.last().map(|l| l.id))
}

pub fn list_checkpoints<F: Files>(fs: &F) -> Result<Vec<CheckpointListing>, StorageError> {
    let mut out = list_committed(fs)?;
    if !out.iter().any(|l| l.complete) {
        return Ok(out);
    }
    let mut fences = Fences::read(fs)?;
    for listing in out.iter_mut().filter(|l| l.complete) {
        if !fences.may_fence(listing.id) {
            continue; // no record could fence it: its manifest need not be read
        }
        let generation = match decode_manifest(fs, listing.id) {
            Ok(m) if m.checkpoint == listing.id => m.generation,
            // Unreadable or misplaced: left for `verify` to report; a restore skips it anyway.
            Ok(_) => continue,
            Err(e) if e.is_corruption() => continue,
            Err(e) => return Err(e),
        };
        if fences.fenced_by(listing.id, generation)?.is_some() {
            listing.complete = false;
            listing.fenced = true;
        }
    }
    Ok(out)
}

/// Reads and decodes a manifest without checking that it names `id`.
fn decode_manifest<F: Files>(fs: &F, id: CheckpointId) -> Result<Manifest, StorageError> {
    let rel = manifest_path(id);
    let path = fs.display_path(&rel);
    let bytes = fs
        .read(&rel)?
        .ok_or_else(|| StorageError::NotFound { what: format!("manifest of {id} ({})", path.display()) })?;
    let manifest: Manifest =
        decode_versioned::<Manifest, crate::manifest::v1::Manifest>(&path, &bytes, FileKind::Manifest)?;
    if manifest.format_version > FORMAT_VERSION {
        return Err(StorageError::UnsupportedVersion {
            path,
            found: manifest.format_version,
            supported: FORMAT_VERSION,
        });
    }
    Ok(manifest)
}

pub fn read_manifest<F: Files>(fs: &F, id: CheckpointId) -> Result<Manifest, StorageError> {
    let manifest = decode_manifest(fs, id)?;
    // A directory renamed or copied by hand: its bytes are intact, but they are not checkpoint `id`.
    if manifest.checkpoint != id {
        return Err(StorageError::MisplacedManifest {
            path: fs.display_path(&manifest_path(id)),
            expected: id,
            found: manifest.checkpoint,
        });
    }
    Ok(manifest)
}

pub fn verify<F: Files>(
    fs: &F,
    id: CheckpointId,
    chain: &mut dyn FnMut(&TaskStateHandle, Vec<Vec<u8>>),
) -> Result<Manifest, StorageError> {
    let manifest = read_manifest(fs, id)?;
    if let Some(by) = Fences::read(fs)?.fenced_by(id, manifest.generation)? {
        return Err(StorageError::Fenced { checkpoint: id, generation: manifest.generation, by });
    }
    for task in &manifest.tasks {
        chain(task, read_task_chain(fs, task)?);
    }
    Ok(manifest)
}

pub fn discard<F: Files>(fs: &F, id: CheckpointId) -> Result<(), StorageError> {
    if fs.size(&manifest_path(id))?.is_some() {
        return Err(StorageError::DiscardComplete(id));
    }
    // Only a later manifest can reference files of this attempt's directory. Fenced ones count
    // here: keeping their files is harmless (gc removes them), and it spares reading generations.
    let later: Vec<CheckpointId> =
        list_committed(fs)?.into_iter().filter(|l| l.complete && l.id > id).map(|l| l.id).collect();
    let keep = referenced_files(fs, &later)?.files;
    sweep(fs, &checkpoint_dir(id), &keep, |_| true, &mut GcReport::default())?;
    fs.remove_dir_if_empty(&checkpoint_dir(id))?;
    fs.sync_dir(CHECKPOINTS_DIR)
}

pub fn gc<F: Files>(fs: &F, retain: usize, in_flight: &[CheckpointId]) -> Result<GcReport, StorageError> {
    // The caller's own argument (documented on `CheckpointStore::gc`), not anything read from storage.
    assert!(retain >= 1, "gc must retain at least one complete checkpoint");
    // Fenced checkpoints are not complete: they neither count towards `retain` nor stay.
    let listings = list_checkpoints(fs)?;
    let complete: Vec<CheckpointId> = listings.iter().filter(|l| l.complete).map(|l| l.id).collect();
    let retained = &complete[complete.len().saturating_sub(retain)..];
    let referenced = referenced_files(fs, retained)?;
    let keep = &referenced.files;
    let mut report = GcReport::default();
    for listing in &listings {
        let dir = checkpoint_dir(listing.id);
        // Of the retained checkpoints only the newest is swept for temporary files (of retried
        // writes): the older ones were swept when they were the newest, and whatever else they hold
        // goes with the whole directory once they leave retention. (Listing every retained
        // directory on every completion made retention the coordinator's largest cost per
        // checkpoint at thousands of tasks.)
        if retained.contains(&listing.id) {
            if retained.last() == Some(&listing.id) {
                sweep(fs, &dir, keep, is_temp_name, &mut report)?;
            }
        } else if listing.complete || listing.fenced || !in_flight.contains(&listing.id) {
            let removed_files = sweep(fs, &dir, keep, |_| true, &mut report)?;
            if fs.remove_dir_if_empty(&dir)? || removed_files > 0 {
                report.removed_checkpoints.push(listing.id);
            }
        }
    }
    sweep(fs, "", keep, is_temp_name, &mut report)?;
    fs.sync_dir(CHECKPOINTS_DIR)?;
    // Generation records last, once the checkpoints they fenced are gone. A record of generation
    // g2 fences only manifests of generations below g2, so records below the lowest generation of
    // the retained manifests fence nothing that is stored. The newest ones always stay: they fence
    // what zombies may still commit. An unreadable retained manifest has an unknown generation:
    // then nothing is removed. (Temporary files under generations/ are left alone: a concurrent
    // claim of another coordinator may own them.)
    if !referenced.any_damaged {
        let names = generation_names(fs)?;
        let removable = names.len().saturating_sub(KEEP_NEWEST_GENERATIONS);
        for generation in &names[..removable] {
            if referenced.min_generation.is_none_or(|min| *generation < min) {
                fs.remove_file(&generation_path(*generation))?;
                report.removed_generations.push(*generation);
            }
        }
        if !report.removed_generations.is_empty() {
            fs.sync_dir(GENERATIONS_DIR)?;
        }
    }
    Ok(report)
}

/// What a set of manifests references.
struct Referenced {
    files: BTreeSet<String>,
    /// The lowest generation among the intact manifests.
    min_generation: Option<Generation>,
    /// Whether some manifest could not be read (see [`referenced_files`]).
    any_damaged: bool,
}

/// Every file that the manifests of `ids` reference. A retained manifest that is damaged keeps its
/// whole directory instead (its references are unknown; a restore will skip it and may fall back to
/// an older checkpoint, so nothing of it is touched here). Other read errors fail the pass.
fn referenced_files<F: Files>(fs: &F, ids: &[CheckpointId]) -> Result<Referenced, StorageError> {
    let mut out = Referenced { files: BTreeSet::new(), min_generation: None, any_damaged: false };
    for id in ids {
        match read_manifest(fs, *id) {
            Ok(m) => {
                out.min_generation = Some(out.min_generation.map_or(m.generation, |g| g.min(m.generation)));
                for t in &m.tasks {
                    out.files.extend(t.chain().map(|(file, _, _)| file.to_string()));
                }
            }
            Err(e) if e.is_corruption() => {
                out.any_damaged = true;
                let dir = checkpoint_dir(*id);
                for entry in fs.list(&dir)? {
                    if !entry.is_dir {
                        out.files.insert(format!("{dir}/{}", entry.name));
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Removes the files of `dir` that pass `select` and are not in `keep`, the manifest first (so that
/// a crash half-way leaves an incomplete attempt, never a complete checkpoint with missing files).
/// Returns how many files it removed.
fn sweep<F: Files>(
    fs: &F,
    dir: &str,
    keep: &BTreeSet<String>,
    select: impl Fn(&str) -> bool,
    report: &mut GcReport,
) -> Result<usize, StorageError> {
    let mut names: Vec<String> =
        fs.list(dir)?.into_iter().filter(|e| !e.is_dir && select(&e.name)).map(|e| e.name).collect();
    names.sort_by_key(|name| name != MANIFEST_NAME);
    let mut removed = 0;
    for name in names {
        let rel = join(dir, &name);
        if keep.contains(&rel) {
            continue;
        }
        let size = fs.size(&rel)?.unwrap_or(0);
        fs.remove_file(&rel)?;
        if name == MANIFEST_NAME {
            fs.sync_dir(dir)?;
        }
        removed += 1;
        report.removed_files += 1;
        report.removed_bytes = report.removed_bytes.saturating_add(size); // sizes come from storage
    }
    Ok(removed)
}

pub fn read_meta<F: Files>(fs: &F) -> Result<Option<JobMeta>, StorageError> {
    match fs.read(META_PATH)? {
        None => Ok(None),
        Some(bytes) => decode_record(&fs.display_path(META_PATH), &bytes, FileKind::JobMeta).map(Some),
    }
}

/// A plain `put`, on every backend: see
/// [`CheckpointStore::write_meta`](super::CheckpointStore::write_meta) for why that is safe.
pub fn write_meta<F: Files>(fs: &F, meta: &JobMeta) -> Result<(), StorageError> {
    fs.put(META_PATH, &encode_record(FileKind::JobMeta, meta))
}

pub fn mark_finished<F: Files>(fs: &F, checkpoint: CheckpointId) -> Result<(), StorageError> {
    if fs.size(&manifest_path(checkpoint))?.is_none() {
        return Err(StorageError::NotFound {
            what: format!("manifest of {checkpoint}, the checkpoint the job finished with"),
        });
    }
    fs.put(FINISHED_PATH, &encode_record(FileKind::Finished, &checkpoint))
}

pub fn finished<F: Files>(fs: &F) -> Result<Option<CheckpointId>, StorageError> {
    match fs.read(FINISHED_PATH)? {
        None => Ok(None),
        Some(bytes) => decode_record(&fs.display_path(FINISHED_PATH), &bytes, FileKind::Finished).map(Some),
    }
}
