//! Generation records and fencing (see the module documentation of [`super`]): claiming and releasing a
//! generation, reading the records, and deciding which committed manifests a newer generation fences.

use super::files::Files;
use super::layout::{generation_path, parse_generation_name, GENERATIONS_DIR};
use crate::error::StorageError;
use crate::format::{decode_record, encode_record, FileKind};
use crate::manifest::GenerationRecord;
use cutline_core::{CheckpointId, Generation};

/// The generations that have a record, ascending (from the names; nothing is read).
pub(super) fn generation_names<F: Files>(fs: &F) -> Result<Vec<Generation>, StorageError> {
    let mut out: Vec<Generation> = fs
        .list(GENERATIONS_DIR)?
        .into_iter()
        .filter(|e| !e.is_dir)
        .filter_map(|e| parse_generation_name(&e.name))
        .collect();
    out.sort();
    Ok(out)
}

/// The record of `generation`; `None` if there is none. A record filed under another generation's
/// name is damage ([`StorageError::Decode`]).
fn read_generation<F: Files>(fs: &F, generation: Generation) -> Result<Option<GenerationRecord>, StorageError> {
    let rel = generation_path(generation);
    let Some(bytes) = fs.read(&rel)? else {
        return Ok(None);
    };
    let path = fs.display_path(&rel);
    let record: GenerationRecord = decode_record(&path, &bytes, FileKind::GenerationRecord)?;
    if record.generation != generation {
        return Err(StorageError::Decode {
            path,
            reason: format!(
                "it holds the record of generation {}, not of generation {}: generation records were \
                 renamed by hand",
                record.generation.0, generation.0
            ),
        });
    }
    Ok(Some(record))
}

/// Who started `generation`, for messages: its record's owner, or why that is unknown.
fn owner_of<F: Files>(fs: &F, generation: Generation) -> String {
    match read_generation(fs, generation) {
        Ok(Some(record)) => record.owner,
        Ok(None) => "owner unknown: its record is gone".to_string(),
        Err(e) => format!("owner unknown: {e}"),
    }
}

/// [`StorageError::Superseded`] if a generation above `generation` has a record.
fn superseded<F: Files>(fs: &F, generation: Generation) -> Result<Option<StorageError>, StorageError> {
    Ok(match generation_names(fs)?.last() {
        Some(&newer) if newer > generation => {
            Some(StorageError::Superseded { generation, newer, owner: owner_of(fs, newer) })
        }
        _ => None,
    })
}

pub fn release_generation<F: Files>(fs: &F, generation: Generation) -> Result<(), StorageError> {
    fs.remove_file(&generation_path(generation))?;
    fs.sync_dir(GENERATIONS_DIR)
}

pub fn claim_generation<F: Files>(fs: &F, record: &GenerationRecord) -> Result<(), StorageError> {
    let generation = record.generation;
    if let Some(err) = superseded(fs, generation)? {
        return Err(err);
    }
    let rel = generation_path(generation);
    if !fs.put_new(&rel, &encode_record(FileKind::GenerationRecord, record))? {
        return Err(StorageError::GenerationTaken { generation, owner: owner_of(fs, generation) });
    }
    // A newer generation claimed between the check and the create: this coordinator lost. Its
    // record would fence, from its (older) restore point up, checkpoints that the newer generation
    // may have restored; nothing was committed under it, so it goes.
    if let Some(err) = superseded(fs, generation)? {
        fs.remove_file(&rel)?;
        fs.sync_dir(GENERATIONS_DIR)?;
        return Err(err);
    }
    Ok(())
}

pub fn generations<F: Files>(fs: &F) -> Result<Vec<GenerationRecord>, StorageError> {
    let mut out = Vec::new();
    for generation in generation_names(fs)? {
        out.extend(read_generation(fs, generation)?);
    }
    Ok(out)
}

pub fn latest_generation<F: Files>(fs: &F) -> Result<Option<GenerationRecord>, StorageError> {
    for generation in generation_names(fs)?.into_iter().rev() {
        if let Some(record) = read_generation(fs, generation)? {
            return Ok(Some(record));
        }
    }
    Ok(None)
}

pub fn check_not_fenced<F: Files>(fs: &F, generation: Generation) -> Result<(), StorageError> {
    match superseded(fs, generation)? {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// The generation records as far as fencing needs them, read once per listing or verification:
/// each generation with its restore point, or the error that its record is damaged (its
/// generation is known from its name). Ascending by generation.
pub(super) struct Fences {
    records: Vec<(Generation, Result<Option<CheckpointId>, StorageError>)>,
}

impl Fences {
    pub(super) fn read<F: Files>(fs: &F) -> Result<Fences, StorageError> {
        let mut records = Vec::new();
        for generation in generation_names(fs)? {
            match read_generation(fs, generation) {
                Ok(Some(record)) => records.push((generation, Ok(record.restored))),
                Ok(None) => {} // removed by gc since the listing
                Err(e) if e.is_corruption() => records.push((generation, Err(e))),
                Err(e) => return Err(e),
            }
        }
        Ok(Fences { records })
    }

    /// Whether some record could fence a committed checkpoint `checkpoint` of an older generation
    /// (a damaged record could fence anything): only then is the manifest's generation needed.
    pub(super) fn may_fence(&self, checkpoint: CheckpointId) -> bool {
        self.records.iter().any(|(_, restored)| match restored {
            Ok(restored) => restored.is_none_or(|r| r < checkpoint),
            Err(_) => true,
        })
    }

    /// The generation that fences the manifest of `checkpoint` written by `generation`: the
    /// lowest `g2 > generation` whose record restored nothing or a checkpoint below `checkpoint`.
    /// The damage of a record that might fence it, if no intact record does.
    pub(super) fn fenced_by(
        &mut self,
        checkpoint: CheckpointId,
        generation: Generation,
    ) -> Result<Option<Generation>, StorageError> {
        let mut damaged = None;
        for (i, (g2, restored)) in self.records.iter().enumerate() {
            if *g2 <= generation {
                continue;
            }
            match restored {
                Ok(restored) if restored.is_none_or(|r| r < checkpoint) => return Ok(Some(*g2)),
                Ok(_) => {}
                Err(_) => {
                    damaged.get_or_insert(i);
                }
            }
        }
        // Only indices of damaged records are kept in `damaged`, so the `Err` arm always matches.
        match damaged.map(|i| self.records.swap_remove(i).1) {
            Some(Err(damage)) => Err(damage),
            _ => Ok(None),
        }
    }
}
