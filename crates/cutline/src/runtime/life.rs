//! The one run loop: [`drive`] carries out the steps of the pure run lifecycle
//! (`cutline_core::lifecycle`): the storage steps with the functions of `start`, deploying, running and
//! waiting through a [`LifeHost`]. The threaded runtime and the cluster coordinator (`run::run_on`)
//! and the deterministic simulation are hosts of this same loop, so the simulation checks the code
//! that runs.

use super::error::RunError;
use super::start::{claim, open, record_generation, restore_latest, Claim};
use super::RunConfig;
use crate::dataflow::JobGraph;
use crate::state::RestoreIndex;
use cutline_core::barrier::CheckpointMode;
use cutline_core::lifecycle::{Cause, GenerationEnd, LifeEvent, RunEnd, RunFailure, RunLifecycle, Step};
use cutline_core::{CheckpointId, Generation, TimeMs};

/// What a run loop needs besides storage: deploying a generation, running it, waiting between
/// restarts, the time.
pub(crate) trait LifeHost {
    /// Milliseconds since the run started.
    fn now(&self) -> TimeMs;
    /// The checkpoint mode in force now (settings may change while the job runs): it decides whether a
    /// restore may commit output twice.
    fn mode(&self) -> CheckpointMode;
    /// Deploy `generation` from `index`. Epochs of its checkpoints start at `first_epoch`, below the
    /// durable `lease_end`.
    fn deploy(
        &mut self,
        generation: Generation,
        index: RestoreIndex,
        restored: Option<CheckpointId>,
        epochs: (CheckpointId, CheckpointId),
    ) -> Result<(), DeployFailure>;
    /// Run the deployed generation until it ends and tear it down; the durable epoch lease after it.
    fn run(
        &mut self,
        generation: Generation,
        recovered_after_ms: Option<u64>,
    ) -> (GenerationEnd<RunError>, CheckpointId);
    /// Wait `delay_ms` before a restart; `true` if a stop was requested meanwhile.
    fn wait(&mut self, delay_ms: u64, cause: Cause) -> bool;
    /// The simulation's process may die here, before a step; a real process never does on purpose.
    fn crash_point(&mut self) -> bool {
        false
    }
}

/// How a run that did not fail ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The job had finished before this run: nothing was done.
    AlreadyFinished(CheckpointId),
    Finished(CheckpointId),
    Stopped,
    StoppedWithSavepoint,
}

/// Why a deployment failed.
pub(crate) struct DeployFailure {
    pub error: RunError,
    /// State that does not fit the job: retrying cannot help.
    pub permanent: bool,
}

/// How a run loop ended.
pub(crate) struct Driven {
    /// The end of the run, or why it failed.
    pub end: Result<Ended, RunError>,
    pub restarts: u32,
    /// The checkpoint the run's first generation restored (`Some(None)`: a fresh start).
    pub restored_at_start: Option<Option<CheckpointId>>,
}

/// Run the lifecycle of one run of `graph` to its end (or, in the simulation, until its process
/// dies: `None`).
pub(crate) fn drive(graph: &JobGraph, cfg: &RunConfig, host: &mut dyn LifeHost) -> Option<Driven> {
    let store = &*cfg.store;
    let fp = cfg.job_fingerprint.as_str();
    let mut life = RunLifecycle::new(cfg.restart.clone()).with_repeat_limit(cfg.max_repeated_failures);
    let mut step: Step<RunError> = life.start();
    let mut index: Option<RestoreIndex> = None;
    let mut found_job: Option<String> = None;
    // The generation that ran last: the one a failover or restart is about.
    let mut last_gen: Option<cutline_core::Generation> = None;
    loop {
        if host.crash_point() {
            return None;
        }
        let event = match step {
            Step::Open => match open(store, fp, cfg.from_savepoint.as_deref()) {
                Ok((facts, found)) => {
                    found_job = found;
                    LifeEvent::Opened(facts)
                }
                Err(e) => LifeEvent::Fatal(e),
            },
            Step::Begin { generation, lease_end } => match record_generation(store, fp, generation, lease_end, true) {
                Ok(()) => LifeEvent::Begun,
                Err(e) => LifeEvent::Fatal(e),
            },
            Step::Restore { generation } => match restore_latest(cfg, graph, host.mode()) {
                Ok((ix, restored)) => {
                    match restored.checkpoint {
                        Some(r) => {
                            tracing::info!(event = "restore", gen = %generation, chk = %r, "{generation}: restoring checkpoint {r}")
                        }
                        None => {
                            tracing::info!(event = "restore", gen = %generation, "{generation}: starting from scratch (no complete checkpoint)")
                        }
                    }
                    index = Some(ix);
                    LifeEvent::Restored(restored)
                }
                // Storage that fails to answer (not damaged data) may answer later.
                Err(RunError::Storage(e)) if !e.is_corruption() => {
                    LifeEvent::RestoreFailed { error: RunError::Storage(e), transient: true }
                }
                Err(e) => LifeEvent::RestoreFailed { error: e, transient: false },
            },
            Step::Claim { generation, restore_point } => match claim(store, fp, generation, restore_point) {
                Claim::Claimed(newest_manifest_now) => LifeEvent::Claimed { newest_manifest_now },
                Claim::Taken(e) => LifeEvent::ClaimTaken(e),
                Claim::Failed(e) => LifeEvent::Transient(e),
            },
            Step::Release { generation, committed } => {
                tracing::warn!(
                    event = "start_over",
                    gen = %generation,
                    chk = %committed,
                    "{generation}: checkpoint {committed} completed while starting; starting over"
                );
                index = None;
                match store.release_generation(generation) {
                    Ok(()) => LifeEvent::Released,
                    Err(e) => LifeEvent::Fatal(RunError::Storage(e)),
                }
            }
            Step::Deploy { generation, restored, first_epoch, lease_end } => {
                let ix = index.take().expect("a restore precedes every deployment");
                match host.deploy(generation, ix, restored, (first_epoch, lease_end)) {
                    Ok(()) => LifeEvent::Deployed,
                    Err(DeployFailure { error, permanent }) => LifeEvent::DeployFailed { error, permanent },
                }
            }
            Step::Run { generation, recovered_after_ms } => {
                last_gen = Some(generation);
                let (end, lease_end) = host.run(generation, recovered_after_ms);
                LifeEvent::GenerationEnded { end, lease_end }
            }
            Step::Wait { delay_ms, attempt, reason, cause } => {
                let gen = last_gen.map(|g| g.to_string());
                tracing::warn!(event = "failover", gen = gen.as_deref(), reason = %reason, "failing over: {reason}");
                tracing::info!(
                    event = "restart",
                    gen = gen.as_deref(),
                    attempt,
                    delay_ms,
                    "restart attempt {attempt} in {delay_ms} ms"
                );
                if host.wait(delay_ms, cause) {
                    LifeEvent::StopRequested
                } else {
                    LifeEvent::Waited
                }
            }
            Step::NextGeneration { generation, lease_end } => {
                match record_generation(store, fp, generation, lease_end, false) {
                    Ok(()) => LifeEvent::MetaWritten,
                    Err(e) => LifeEvent::Fatal(e),
                }
            }
            Step::Done(end) => {
                let end = match end {
                    RunEnd::AlreadyFinished(c) => Ok(Ended::AlreadyFinished(c)),
                    RunEnd::Finished(c) => Ok(Ended::Finished(c)),
                    RunEnd::Stopped => Ok(Ended::Stopped),
                    RunEnd::StoppedWithSavepoint => Ok(Ended::StoppedWithSavepoint),
                    RunEnd::Failed(f) => {
                        if let RunFailure::GaveUp { last, .. } | RunFailure::Permanent { reason: last } = &f {
                            tracing::error!(event = "gave_up", reason = %last, "failing over: {last}; no restart");
                        }
                        Err(run_error(f, store.describe(), found_job.take(), fp))
                    }
                };
                return Some(Driven { end, restarts: life.restarts(), restored_at_start: life.restored_at_start() });
            }
        };
        step = life.next(host.now(), event);
    }
}

/// A lifecycle failure as the run's error.
fn run_error(f: RunFailure<RunError>, store: String, found: Option<String>, expected: &str) -> RunError {
    match f {
        RunFailure::Step(e) => e,
        RunFailure::WrongJob => {
            RunError::WrongJob { store, found: found.unwrap_or_default(), expected: expected.to_string() }
        }
        RunFailure::GaveUp { attempts, last, repeated, restored } => {
            RunError::GaveUp { attempts, last, repeated, restored }
        }
        RunFailure::Permanent { reason } => RunError::Permanent(reason),
        RunFailure::KeepsCompleting { checkpoint } => RunError::Superseded(format!(
            "another coordinator keeps completing checkpoints of this job ({checkpoint} the latest) while this one starts: stop it first"
        )),
        RunFailure::Exhausted { what, value } => RunError::Exhausted { what, value, store },
    }
}
