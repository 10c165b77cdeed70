//! The storage side of the run lifecycle's steps (`cutline_core::lifecycle`): open the store (what
//! belongs to the job, what it finished with, the highest ids), begin a generation and an epoch lease,
//! choose and load the checkpoint to restore, claim the generation, release a claim, record the next
//! generation. The order, the retries and every decision are the lifecycle's; these functions only
//! read and write, and report what they found.

use super::config::RunConfig;
use super::error::RunError;
use crate::dataflow::JobGraph;
use crate::state::RestoreIndex;
use cutline_core::barrier::CheckpointMode;
use cutline_core::lifecycle::{MetaFacts, Restored, StoreFacts};
use cutline_core::restart::{choose_restore, Candidate};
use cutline_core::{CheckpointId, Generation};
use cutline_storage::{CheckpointStore, GenerationRecord, JobMeta, Manifest, StorageError};
use std::path::Path;
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
    // Every file is read once: checked by the verification, then kept for the index.
    let mut chains = Vec::new();
    let manifest = store.verify_reading(id, &mut |h, chain| chains.push((h.subtask.0, h.parallelism, chain)))?;
    if manifest.checkpoint != id {
        return Err(RunError::Restore {
            checkpoint: id,
            reason: format!(
                "its manifest is that of checkpoint {}: checkpoint directories were renamed or copied by hand; move it back or delete it",
                manifest.checkpoint
            ),
        });
    }
    if manifest.job_fingerprint != fingerprint {
        return Err(RunError::WrongJob {
            store: store.describe(),
            found: manifest.job_fingerprint,
            expected: fingerprint.to_string(),
        });
    }
    let mut index = RestoreIndex { checkpoint: Some(id), input_ended: manifest.is_final, ..Default::default() };
    for (subtask, parallelism, chain) in chains {
        index
            .add_task_chain(subtask, parallelism, chain)
            .map_err(|reason| RunError::Restore { checkpoint: id, reason })?;
    }
    let known: std::collections::BTreeSet<String> = graph.state_uids().into_iter().collect();
    // An operator's own element (`counts`) is named rather than one beside it (`counts/schema`).
    let unknown = index.elements.keys().filter(|uid| !known.contains(*uid)).min_by_key(|uid| (uid.len(), uid.as_str()));
    if let Some(uid) = unknown {
        return Err(RunError::Restore {
            checkpoint: id,
            reason: format!("it holds state of operator {uid:?}, which this job no longer has; keep the operator's id or start from a fresh state directory"),
        });
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
) -> Result<(RestoreIndex, Restored), RunError> {
    // Verify from the newest down and stop at the first that verifies; only damaged data falls back.
    let listing = cfg.store.list_checkpoints()?;
    let newest_manifest_before = listing.iter().filter(|l| l.complete || l.fenced).map(|l| l.id).max();
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
        tracing::warn!(
            event = "checkpoint_skipped",
            chk = %id,
            "checkpoint {id} does not verify ({reason}); falling back to an older one"
        );
    }
    if choice.checkpoint.is_none() && choice.skipped.is_empty() {
        if let Some(path) = &cfg.from_savepoint {
            let sp = super::savepoint::open(path).map_err(RunError::Savepoint)?;
            tracing::info!(
                event = "from_savepoint",
                chk = %sp.checkpoint,
                "starting from savepoint {} (checkpoint {})",
                path.display(),
                sp.checkpoint
            );
            let (mut index, _) = load_checkpoint(&sp.store, graph, &cfg.job_fingerprint, sp.checkpoint)?;
            index.duplicates_allowed = mode == CheckpointMode::AtLeastOnce;
            index.savepoint = Some(path.clone());
            let r = Restored {
                checkpoint: Some(sp.checkpoint),
                skipped: Vec::new(),
                from_savepoint: true,
                newest_manifest_before,
            };
            return Ok((index, r));
        }
    }
    let mut index = loaded.unwrap_or_default();
    assert_eq!(index.checkpoint, choice.checkpoint);
    index.skipped = choice.skipped.iter().map(|(id, _)| *id).collect();
    index.duplicates_allowed = mode == CheckpointMode::AtLeastOnce;
    let r = Restored {
        checkpoint: choice.checkpoint,
        skipped: index.skipped.clone(),
        from_savepoint: false,
        newest_manifest_before,
    };
    Ok((index, r))
}

/// A storage error of the start, as a run error: damage of a named file gets advice.
fn damaged<'a>(
    store: &'a dyn CheckpointStore,
    what: &'static str,
    advice: &'static str,
) -> impl Fn(StorageError) -> RunError + 'a {
    move |e: StorageError| {
        if e.is_corruption() {
            RunError::Damaged { what, store: store.describe(), reason: e.to_string(), advice }
        } else {
            RunError::Storage(e)
        }
    }
}

/// [`Step::Open`](cutline_core::lifecycle::Step::Open): what the store says about the job. The
/// fingerprint found in `job.meta` comes back too, for the error of another job's store.
pub(crate) fn open(
    store: &dyn CheckpointStore,
    fingerprint: &str,
    from_savepoint: Option<&Path>,
) -> Result<(StoreFacts, Option<String>), RunError> {
    let meta = store.read_meta().map_err(damaged(
        store,
        "job.meta",
        "it names the job and its epoch lease; restore it from a backup, or start the job on a fresh state directory",
    ))?;
    let found = meta.as_ref().map(|m| m.job_fingerprint.clone());
    let finished_advice = "delete it: the job then resumes from its latest checkpoint and finishes again";
    let finished = store.finished().map_err(damaged(store, "FINISHED", finished_advice))?;
    // The marker counts only if it names this job's final checkpoint in this store: one copied from
    // another job's store (or left after the checkpoints were replaced) must not end a half-done job.
    if let Some(c) = finished.filter(|_| found.as_deref().is_none_or(|f| f == fingerprint)) {
        let why = match store.read_manifest(c) {
            Ok(m) if m.job_fingerprint == fingerprint && m.is_final && m.checkpoint == c => None,
            Ok(m) if m.job_fingerprint != fingerprint => {
                Some(format!("checkpoint {c} belongs to job {:?}", m.job_fingerprint))
            }
            Ok(_) => Some(format!("checkpoint {c} is not a final checkpoint")),
            Err(e) if matches!(e, StorageError::NotFound { .. }) || e.is_corruption() => {
                Some(format!("checkpoint {c} is not in the store ({e})"))
            }
            Err(e) => return Err(RunError::Storage(e)),
        };
        if let Some(why) = why {
            return Err(RunError::Damaged {
                what: "FINISHED",
                store: store.describe(),
                reason: format!("it says the job finished with checkpoint {c}, but {why}: the marker was copied from another job or its checkpoints were replaced"),
                advice: finished_advice,
            });
        }
    }
    let latest_record = store.latest_generation().map_err(damaged(
        store,
        "generation record",
        "it fences older coordinators; restore it from a backup, or start the job on a fresh state directory",
    ))?;
    // Only while the store has no complete checkpoint: afterwards the run resumes from its own.
    let savepoint = match from_savepoint {
        Some(path) if store.latest_complete()?.is_none() => {
            let sp = super::savepoint::open(path).map_err(RunError::Savepoint)?;
            Some((sp.checkpoint, sp.generation))
        }
        _ => None,
    };
    let facts = StoreFacts {
        meta: meta.as_ref().map(|m| MetaFacts {
            same_job: m.job_fingerprint == fingerprint,
            generation: m.generation,
            lease_end: m.epoch_lease_end,
        }),
        max_checkpoint_seen: store.max_checkpoint_id_seen()?,
        latest_generation_record: latest_record.map(|r| r.generation),
        finished,
        savepoint,
    };
    Ok((facts, found))
}

/// [`Step::Begin`](cutline_core::lifecycle::Step::Begin) and
/// [`Step::NextGeneration`](cutline_core::lifecycle::Step::NextGeneration): record the generation and
/// the epoch lease in `job.meta`. At the start of a process (`collect`), partial attempts of a previous
/// process are garbage too. Complete checkpoints all stay until this run completes one: the newest may
/// not verify, and then an older one is the way back.
pub(crate) fn record_generation(
    store: &dyn CheckpointStore,
    fingerprint: &str,
    generation: Generation,
    lease_end: CheckpointId,
    collect: bool,
) -> Result<(), RunError> {
    store.write_meta(&JobMeta { job_fingerprint: fingerprint.to_string(), generation, epoch_lease_end: lease_end })?;
    if collect {
        store.gc(usize::MAX, &[])?;
    }
    Ok(())
}

/// How a claim went.
pub(crate) enum Claim {
    /// Claimed; the newest checkpoint with a manifest listed right after.
    Claimed(Option<CheckpointId>),
    /// Another coordinator holds this generation or a newer one.
    Taken(RunError),
    /// The store failed to answer.
    Failed(RunError),
}

/// [`Step::Claim`](cutline_core::lifecycle::Step::Claim): create the record of `generation` (only if
/// absent) naming `restore_point`, then list the manifests again.
pub(crate) fn claim(
    store: &dyn CheckpointStore,
    fingerprint: &str,
    generation: Generation,
    restore_point: Option<CheckpointId>,
) -> Claim {
    let record = GenerationRecord {
        job_fingerprint: fingerprint.to_string(),
        generation,
        restored: restore_point,
        created_unix_ms: unix_ms(),
        owner: format!("{} pid {}", host_name(), std::process::id()),
    };
    match store.claim_generation(&record) {
        Ok(()) => {}
        Err(e @ (StorageError::GenerationTaken { .. } | StorageError::Superseded { .. })) => {
            return Claim::Taken(RunError::Superseded(e.to_string()))
        }
        Err(e) => return Claim::Failed(RunError::Storage(e)),
    }
    match store.list_checkpoints() {
        Ok(l) => Claim::Claimed(l.iter().filter(|l| l.complete || l.fenced).map(|l| l.id).max()),
        Err(e) => Claim::Failed(RunError::Storage(e)),
    }
}
