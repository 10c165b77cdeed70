//! Checkpoint statistics files (`stats/chk-<id>`): what the engine keeps about each completed
//! checkpoint for people (durations, sizes, the epoch's trace), written after the checkpoint
//! completed. They decide nothing: a missing or damaged one never affects a restore, and retention of
//! checkpoints does not touch them; [`prune_stats`] keeps the newest ones.

use super::files::Files;
use super::layout::{is_temp_name, join, parse_checkpoint_dir, stats_path, STATS_DIR};
use crate::error::StorageError;
use crate::format::{decode_frame_at, encode_frame, FileKind};
use cutline_core::CheckpointId;

pub fn write_stats<F: Files>(fs: &F, checkpoint: CheckpointId, payload: &[u8]) -> Result<(), StorageError> {
    fs.put(&stats_path(checkpoint), &encode_frame(FileKind::CheckpointStats, payload))
}

pub fn read_stats<F: Files>(fs: &F, checkpoint: CheckpointId) -> Result<Option<Vec<u8>>, StorageError> {
    let rel = stats_path(checkpoint);
    let Some(bytes) = fs.read(&rel)? else { return Ok(None) };
    Ok(Some(decode_frame_at(&fs.display_path(&rel), &bytes, FileKind::CheckpointStats)?.payload.to_vec()))
}

pub fn list_stats<F: Files>(fs: &F) -> Result<Vec<CheckpointId>, StorageError> {
    let mut ids: Vec<CheckpointId> =
        fs.list(STATS_DIR)?.into_iter().filter(|e| !e.is_dir).filter_map(|e| parse_checkpoint_dir(&e.name)).collect();
    ids.sort();
    Ok(ids)
}

pub fn prune_stats<F: Files>(fs: &F, keep: usize) -> Result<usize, StorageError> {
    let entries = fs.list(STATS_DIR)?;
    let mut removed = 0;
    // Leftovers of interrupted writes.
    for e in entries.iter().filter(|e| !e.is_dir && is_temp_name(&e.name)) {
        fs.remove_file(&join(STATS_DIR, &e.name))?;
        removed += 1;
    }
    let ids = list_stats(fs)?;
    for id in &ids[..ids.len().saturating_sub(keep)] {
        fs.remove_file(&stats_path(*id))?;
        removed += 1;
    }
    if removed > 0 {
        fs.sync_dir(STATS_DIR)?;
    }
    Ok(removed)
}
