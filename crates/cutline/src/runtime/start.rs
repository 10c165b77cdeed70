//! What a process start and every restart do against checkpoint storage: check the store belongs to
//! the job, start a generation and an epoch lease above everything issued before, choose and load the
//! checkpoint to restore, claim the generation. The order and the retries are the run loop's.

use super::config::RunConfig;
use super::error::RunError;
use crate::dataflow::JobGraph;
use crate::state::RestoreIndex;
use cutline_core::barrier::CheckpointMode;
use cutline_core::coordinator::EPOCH_LEASE_BLOCK;
use cutline_core::restart::{choose_restore, Candidate};
use cutline_core::{CheckpointId, Generation};
use cutline_storage::{CheckpointStore, GenerationRecord, JobMeta, Manifest, StorageError};
use std::time::{SystemTime, UNIX_EPOCH};

/// The short job id sinks put in their transaction names.
pub(crate) fn job_id(fingerprint: &str) -> String {
    format!("{:016x}", crate::state::stable_hash(fingerprint))
}

pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into())
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Read the state of checkpoint `id` into a restore index, checking it belongs to this job.
pub(crate) fn load_checkpoint(
    store: &dyn CheckpointStore,
    graph: &JobGraph,
    fingerprint: &str,
    id: CheckpointId,
) -> Result<(RestoreIndex, Manifest), RunError> {
    let manifest = store.verify(id)?;
    assert_eq!(manifest.checkpoint, id);
    if manifest.job_fingerprint != fingerprint {
        return Err(RunError::WrongJob {
            store: store.describe(),
            found: manifest.job_fingerprint,
            expected: fingerprint.to_string(),
        });
    }
    let mut index = RestoreIndex { checkpoint: Some(id), ..Default::default() };
    for h in &manifest.tasks {
        let payload = store.read_task_state(h)?;
        index
            .add_task_payload(h.subtask.0, h.parallelism, &payload)
            .map_err(|reason| RunError::Restore { checkpoint: id, reason })?;
    }
    let known: std::collections::BTreeSet<String> = graph.state_uids().into_iter().collect();
    for uid in index.elements.keys() {
        if !known.contains(uid) {
            return Err(RunError::Restore {
                checkpoint: id,
                reason: format!("it holds state of operator {uid:?}, which this job no longer has; keep the operator's id or start from a fresh state directory"),
            });
        }
    }
    Ok((index, manifest))
}

/// Choose the latest complete checkpoint that verifies (warning about newer broken ones) and load it.
/// `mode` is the job's current checkpoint mode (settings may have changed while it ran): it decides
/// whether a restore may commit output twice.
pub(crate) fn restore_latest(
    cfg: &RunConfig,
    graph: &JobGraph,
    mode: CheckpointMode,
) -> Result<(RestoreIndex, Option<CheckpointId>), RunError> {
    // Verify from the newest down and stop at the first that verifies; only damaged data falls back.
    let listing = cfg.store.list_checkpoints()?;
    let mut candidates = Vec::new();
    let mut loaded = None;
    for l in listing.iter().rev().filter(|l| l.complete) {
        match load_checkpoint(&*cfg.store, graph, &cfg.job_fingerprint, l.id) {
            Ok((index, _)) => {
                candidates.push(Candidate { checkpoint: l.id, verified: Ok(()) });
                loaded = Some(index);
                break;
            }
            Err(RunError::Storage(e)) if e.is_corruption() => {
                candidates.push(Candidate { checkpoint: l.id, verified: Err(e.to_string()) })
            }
            Err(e) => return Err(e),
        }
    }
    let choice = choose_restore(candidates);
    for (id, reason) in &choice.skipped {
        eprintln!("cutline: WARNING: checkpoint {id} does not verify ({reason}); falling back to an older one");
    }
    if choice.checkpoint.is_none() && choice.skipped.is_empty() {
        if let Some(path) = &cfg.from_savepoint {
            let sp = super::savepoint::open(path).map_err(RunError::Savepoint)?;
            eprintln!("cutline: starting from savepoint {} (checkpoint {})", path.display(), sp.checkpoint);
            let (mut index, _) = load_checkpoint(&sp.store, graph, &cfg.job_fingerprint, sp.checkpoint)?;
            index.duplicates_allowed = mode == CheckpointMode::AtLeastOnce;
            index.savepoint = Some(path.clone());
            return Ok((index, Some(sp.checkpoint)));
        }
    }
    let mut index = loaded.unwrap_or_default();
    assert_eq!(index.checkpoint, choice.checkpoint);
    index.skipped = choice.skipped.iter().map(|(id, _)| *id).collect();
    index.duplicates_allowed = mode == CheckpointMode::AtLeastOnce;
    Ok((index, choice.checkpoint))
}

pub(crate) struct StartInfo {
    pub first: CheckpointId,
    pub generation: Generation,
    pub lease_end: CheckpointId,
}

pub(crate) enum Start {
    AlreadyFinished(CheckpointId),
    Run(StartInfo),
}

/// What every process start does before deploying: check the store belongs to this job, stop if the job
/// already finished, start a new generation and a new epoch lease above everything issued before, and
/// clear partial attempts of the previous process.
pub(crate) fn prepare_start(
    store: &dyn CheckpointStore,
    fingerprint: &str,
    from_savepoint: Option<&std::path::Path>,
) -> Result<Start, RunError> {
    let damaged = |what: &'static str, advice: &'static str| {
        move |e: StorageError| {
            if e.is_corruption() {
                RunError::Damaged { what, store: store.describe(), reason: e.to_string(), advice }
            } else {
                RunError::Storage(e)
            }
        }
    };
    let meta = store.read_meta().map_err(damaged(
        "job.meta",
        "it names the job and its epoch lease; restore it from a backup, or start the job on a fresh state directory",
    ))?;
    if let Some(m) = &meta {
        if m.job_fingerprint != fingerprint {
            return Err(RunError::WrongJob {
                store: store.describe(),
                found: m.job_fingerprint.clone(),
                expected: fingerprint.to_string(),
            });
        }
    }
    if let Some(c) = store
        .finished()
        .map_err(damaged("FINISHED", "delete it: the job then resumes from its latest checkpoint and finishes again"))?
    {
        return Ok(Start::AlreadyFinished(c));
    }
    // Epochs: above the durable lease and above anything in storage, for the whole life of the job.
    let seen = store.max_checkpoint_id_seen()?.map(|c| c.0 + 1).unwrap_or(1);
    let mut first = CheckpointId(seen.max(meta.as_ref().map(|m| m.epoch_lease_end.0).unwrap_or(1)));
    // The generation records decide (job.meta is a plain overwrite a stale coordinator may lower).
    let latest_record = store.latest_generation().map_err(damaged(
        "generation record",
        "it fences older coordinators; restore it from a backup, or start the job on a fresh state directory",
    ))?;
    let mut generation = meta
        .as_ref()
        .map(|m| m.generation)
        .unwrap_or_default()
        .max(latest_record.map(|r| r.generation).unwrap_or_default())
        .next();
    // A run that may start from a savepoint continues its epochs and generations: the restored
    // checkpoint must be older than every new epoch, and sink transactions of the job the savepoint
    // came from must never share a name with new ones.
    // Only while the store has no complete checkpoint: afterwards the run resumes from its own.
    if let Some(path) = from_savepoint.filter(|_| matches!(store.latest_complete(), Ok(None))) {
        let sp = super::savepoint::open(path).map_err(RunError::Savepoint)?;
        first = first.max(sp.checkpoint.next());
        generation = generation.max(sp.generation.next());
    }
    let lease_end = CheckpointId(first.0 + EPOCH_LEASE_BLOCK);
    store.write_meta(&JobMeta { job_fingerprint: fingerprint.to_string(), generation, epoch_lease_end: lease_end })?;
    // Partial attempts of a previous process are garbage now. Complete checkpoints all stay until this
    // run completes one: the newest may not verify, and then an older one is the way back.
    store.gc(usize::MAX, &[])?;
    Ok(Start::Run(StartInfo { first, generation, lease_end }))
}

/// Record that `generation` starts, having restored `restored` (from `index`): create-if-absent, so
/// that a second coordinator of the job gets `GenerationTaken` or `Superseded`.
pub(crate) fn claim_generation(
    store: &dyn CheckpointStore,
    fingerprint: &str,
    generation: Generation,
    index: &RestoreIndex,
    restored: Option<CheckpointId>,
) -> Result<(), StorageError> {
    store.claim_generation(&GenerationRecord {
        job_fingerprint: fingerprint.to_string(),
        generation,
        // The newest complete checkpoint this start saw, also if it was skipped as damaged: it was
        // committed before this generation began, so it must not be fenced (a repaired checkpoint
        // restores later); only what older generations complete from now on is.
        restored: restored.filter(|_| index.savepoint.is_none()).into_iter().chain(index.skipped.iter().copied()).max(),
        created_unix_ms: unix_ms(),
        owner: format!("{} pid {}", host_name(), std::process::id()),
    })
}

/// Times a start begins again because another coordinator completed a checkpoint between the start's
/// listing and its claim, before it gives up (two coordinators are running).
pub(crate) const MAX_GAP_RETRIES: u32 = 3;

/// The newest checkpoint with a manifest (complete or fenced); `None` if none or unreadable.
pub(crate) fn newest_manifest(store: &dyn CheckpointStore) -> Option<CheckpointId> {
    store.list_checkpoints().ok()?.iter().filter(|l| l.complete || l.fenced).map(|l| l.id).max()
}

/// After a claim: a checkpoint with a manifest above everything the start saw (`before`, what it
/// restored or skipped), which an older coordinator committed in between.
pub(crate) fn committed_meanwhile(
    store: &dyn CheckpointStore,
    before: Option<CheckpointId>,
    index: &RestoreIndex,
    restored: Option<CheckpointId>,
) -> Result<Option<CheckpointId>, StorageError> {
    let seen = before
        .into_iter()
        .chain(restored.filter(|_| index.savepoint.is_none()))
        .chain(index.skipped.iter().copied())
        .max();
    Ok(store.list_checkpoints()?.iter().filter(|l| (l.complete || l.fenced) && Some(l.id) > seen).map(|l| l.id).max())
}
