//! The life of one run as a pure state machine: open the store, begin a generation and an epoch
//! lease above everything issued before, choose the checkpoint to restore, claim the generation,
//! deploy, run; after a failure ask the restart strategy, wait, record the next generation and go
//! round again; or end.
//!
//! The runtime carries out each [`Step`] (storage reads and writes, deploying tasks, running a
//! generation, sleeping) and reports what happened as a [`LifeEvent`]; [`RunLifecycle::next`] answers
//! with the next step. Exactly one step is outstanding at a time. The threaded runtime, the cluster
//! coordinator and the deterministic simulation drive this machine through one driver, so the
//! simulation checks the loop that runs.
//!
//! It owns: the order of the start, which generation and which epochs a start takes (checked against
//! overflow: a crafted `job.meta` is refused, never wrapped), the start-over when a checkpoint was
//! committed while the run started, the restart decisions and the run's end. It does not read
//! storage, deploy, sleep or read a clock (time is an argument); the errors of those steps are opaque
//! values `E` that it hands back in [`RunEnd::Failed`].

use crate::coordinator::EPOCH_LEASE_BLOCK;
use crate::ids::{CheckpointId, Generation, TimeMs};
use crate::restart::{RestartDecision, RestartStrategy, RestartTracker};

/// Times a start begins again because a checkpoint was committed between its listing and its claim,
/// before the run gives up (another coordinator of the job keeps running).
pub const MAX_START_OVERS: u32 = 3;

/// By default, a generation that fails this many times in a row with the same reason, each time
/// after restoring the same checkpoint, ends the run whatever the restart strategy allows: the
/// failure repeats at the same input (a record a user function panics on, a line the source
/// refuses), so restarting cannot help, and the default strategy would otherwise retry for some
/// 43 s. Failures of the start (reading storage, claiming, deploying) are left to the strategy:
/// storage that does not answer may answer later. See [`RunLifecycle::with_repeat_limit`]; a
/// harness that injects the same failure at random turns it off.
pub const MAX_REPEATED_FAILURES: u32 = 3;

/// What `job.meta` says, as far as the lifecycle needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaFacts {
    /// Whether it names this job (its fingerprint); if not, the store belongs to another job.
    pub same_job: bool,
    /// The generation it records. A stale coordinator's overwrite may lower it: the generation
    /// records decide too ([`StoreFacts::latest_generation_record`]).
    pub generation: Generation,
    /// The durable epoch lease it records: no epoch at or above it was issued (a stale overwrite may
    /// lower it too: [`StoreFacts::max_checkpoint_seen`] decides as well).
    pub lease_end: CheckpointId,
}

/// What the store said when the run opened it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreFacts {
    /// `None` for a store no run has used yet.
    pub meta: Option<MetaFacts>,
    /// The highest id of any checkpoint directory (complete, fenced or not).
    pub max_checkpoint_seen: Option<CheckpointId>,
    /// The generation of the newest generation record.
    pub latest_generation_record: Option<Generation>,
    /// The job finished with this checkpoint (the runtime checked the marker is this job's).
    pub finished: Option<CheckpointId>,
    /// The savepoint this run starts from (its checkpoint and generation), only while the store holds
    /// no complete checkpoint.
    pub savepoint: Option<(CheckpointId, Generation)>,
}

/// What a restore found and loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// The checkpoint loaded (of the store, or of the savepoint); `None`: a fresh start.
    pub checkpoint: Option<CheckpointId>,
    /// Newer complete checkpoints that did not verify and were skipped.
    pub skipped: Vec<CheckpointId>,
    /// The checkpoint came from an exported savepoint, not from the store.
    pub from_savepoint: bool,
    /// The newest checkpoint with a manifest (complete or fenced) the store listed before the restore
    /// looked.
    pub newest_manifest_before: Option<CheckpointId>,
}

/// How a generation's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenerationEnd<E> {
    /// The job finished with this final checkpoint.
    Finished(CheckpointId),
    /// A failover: restart if the strategy allows.
    FailedOver {
        /// Why, as the coordinator decided it (a task's failure, a checkpoint that ends the job
        /// failed, too many failed checkpoints).
        reason: String,
        /// Restarting cannot help (a task said so, for example the failure repeats at the same
        /// input): the run ends with [`RunFailure::Permanent`].
        permanent: bool,
    },
    /// Stopped on request.
    Stopped,
    /// Stopped with a savepoint on request.
    StoppedWithSavepoint,
    /// An error that ends the run (the coordinator was fenced, a storage write failed).
    Error(E),
}

/// What the runtime reports after carrying out a [`Step`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LifeEvent<E> {
    /// [`Step::Open`] done.
    Opened(StoreFacts),
    /// [`Step::Begin`] done: `job.meta` holds the generation and lease, partial attempts are gone.
    Begun,
    /// [`Step::Restore`] done.
    Restored(Restored),
    /// [`Step::Restore`] failed.
    RestoreFailed {
        /// The error; the run's if it ends.
        error: E,
        /// Storage that did not answer, which may later: a failure subject to the restart strategy.
        /// Otherwise (damaged data, a checkpoint that does not fit the job) the run ends.
        transient: bool,
    },
    /// [`Step::Claim`] done.
    Claimed {
        /// The newest checkpoint with a manifest (complete or fenced) listed right after the claim.
        newest_manifest_now: Option<CheckpointId>,
    },
    /// [`Step::Claim`]: another coordinator holds this generation or a newer one.
    ClaimTaken(E),
    /// [`Step::Release`] done.
    Released,
    /// [`Step::Deploy`] done: the generation runs.
    Deployed,
    /// [`Step::Deploy`] failed.
    DeployFailed {
        /// The error; the run's if it ends.
        error: E,
        /// State that does not fit the job, which retrying cannot mend: the run ends. Otherwise a
        /// failure subject to the restart strategy.
        permanent: bool,
    },
    /// [`Step::Run`] ended.
    GenerationEnded {
        /// How the generation ended.
        end: GenerationEnd<E>,
        /// The durable epoch lease now (the coordinator extends it while it runs); it must not be
        /// below the lease the lifecycle knew (that panics).
        lease_end: CheckpointId,
    },
    /// [`Step::Wait`] is over.
    Waited,
    /// A stop was requested during [`Step::Wait`].
    StopRequested,
    /// [`Step::NextGeneration`] done.
    MetaWritten,
    /// [`Step::Claim`] failed in a way that may pass (the store did not answer the record's write or
    /// the listing after it): a failure like any other, subject to the restart strategy. Only valid
    /// after `Claim`: the other steps report a failure in their own event or as [`LifeEvent::Fatal`]
    /// (a store that cannot be opened is fatal).
    Transient(E),
    /// A step failed in a way that ends the run; valid after any step.
    Fatal(E),
}

/// What the runtime must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step<E> {
    /// Read `job.meta`, the finished marker, the highest checkpoint id, the newest generation
    /// record, and the savepoint to start from: report [`LifeEvent::Opened`].
    Open,
    /// Write `job.meta` with this generation and lease, and remove partial attempts of earlier
    /// processes (complete checkpoints all stay): report [`LifeEvent::Begun`].
    Begin {
        /// The generation this start takes: above the one in `job.meta`, every generation record and
        /// the savepoint's.
        generation: Generation,
        /// The epoch lease: [`EPOCH_LEASE_BLOCK`] above the first epoch of this start.
        lease_end: CheckpointId,
    },
    /// List the manifests, then choose the checkpoint to restore (the newest that verifies, or the
    /// savepoint) and load it: report [`LifeEvent::Restored`].
    Restore {
        /// The generation that will run what is restored.
        generation: Generation,
    },
    /// Create the record of `generation` (only if absent) naming `restore_point`, then list the
    /// manifests again: report [`LifeEvent::Claimed`].
    Claim {
        /// The generation to record.
        generation: Generation,
        /// The newest checkpoint of the store the restore looked at (the one loaded or a newer one
        /// it skipped); `None` on a fresh start or a start from a savepoint.
        restore_point: Option<CheckpointId>,
    },
    /// Remove the record of `generation`: a checkpoint committed while the run started must not be
    /// fenced by it. Report [`LifeEvent::Released`]; the restore runs again.
    Release {
        /// The generation whose record to remove.
        generation: Generation,
        /// The checkpoint committed meanwhile, for the log.
        committed: CheckpointId,
    },
    /// Deploy `generation` from what the restore loaded. `first_epoch` is above every epoch ever
    /// issued for the job; `lease_end` is the durable lease. Report [`LifeEvent::Deployed`].
    Deploy {
        /// The generation to deploy.
        generation: Generation,
        /// The checkpoint the restore loaded; `None` for a fresh start.
        restored: Option<CheckpointId>,
        /// The first epoch its coordinator may issue.
        first_epoch: CheckpointId,
        /// The durable epoch lease (epochs below it may be issued).
        lease_end: CheckpointId,
    },
    /// Run the deployed generation until it ends: report [`LifeEvent::GenerationEnded`].
    Run {
        /// The generation deployed.
        generation: Generation,
        /// Milliseconds since the failure this generation recovers from (the first failure since
        /// the previous deployment); `None` if no failure preceded it.
        recovered_after_ms: Option<u64>,
    },
    /// A failure: wait before restarting (report [`LifeEvent::Waited`], or
    /// [`LifeEvent::StopRequested`]).
    Wait {
        /// Milliseconds to wait, as the restart strategy decided.
        delay_ms: u64,
        /// The number of this restart, from 1.
        attempt: u32,
        /// The failure, for the log.
        reason: String,
        /// Where it happened.
        cause: Cause,
    },
    /// Record in `job.meta` that `generation` starts: report [`LifeEvent::MetaWritten`].
    NextGeneration {
        /// The generation the restart takes, one above the last.
        generation: Generation,
        /// The durable epoch lease to record with it (unchanged).
        lease_end: CheckpointId,
    },
    /// The run is over.
    Done(RunEnd<E>),
}

/// Where the failure a restart recovers from happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Reading the checkpoints to restore.
    Restore,
    /// Claiming the generation.
    Claim,
    /// Deploying the generation.
    Deploy,
    /// The running generation failed over.
    Generation,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd<E> {
    /// The job had finished before this run: nothing was done.
    AlreadyFinished(CheckpointId),
    /// The job finished: its input ended and this final checkpoint committed everything.
    Finished(CheckpointId),
    /// Stopped on request, while a generation ran or while waiting to restart.
    Stopped,
    /// Stopped with a savepoint on request; running the job again resumes from it.
    StoppedWithSavepoint,
    /// The run failed.
    Failed(RunFailure<E>),
}

/// Why a run failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunFailure<E> {
    /// A step's error (storage, deployment, restore, a newer coordinator).
    Step(E),
    /// The store belongs to another job.
    WrongJob,
    /// The restart strategy gave up, or the same failure repeated [`MAX_REPEATED_FAILURES`] times
    /// after restoring the same checkpoint. `repeated`: how many of the last failures in a row were
    /// the same failure after restoring the same checkpoint (1 if the last one differed).
    GaveUp {
        /// The restarts granted before.
        attempts: u32,
        /// The last failure.
        last: String,
        /// How many failures in a row were this one after restoring the same checkpoint.
        repeated: u32,
        /// The checkpoint the failing generation had restored.
        restored: Option<CheckpointId>,
    },
    /// A failure that restarting cannot mend.
    Permanent {
        /// The failure.
        reason: String,
    },
    /// Checkpoints keep being committed while this run starts (more than [`MAX_START_OVERS`] start
    /// overs): another coordinator runs the job. Stop it first.
    KeepsCompleting {
        /// The latest checkpoint committed meanwhile.
        checkpoint: CheckpointId,
    },
    /// `job.meta`, a generation record, a checkpoint directory or the savepoint names a generation or
    /// an epoch so high that the next one does not exist (u64 overflow): a crafted or damaged store.
    Exhausted {
        /// Which quantity: `checkpoint id`, `generation`, `epoch lease`, `savepoint checkpoint id`
        /// or `savepoint generation`.
        what: &'static str,
        /// Its value.
        value: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Start,
    Opening,
    Beginning,
    Restoring,
    Claiming,
    Releasing,
    Deploying,
    Running,
    Waiting,
    RecordingGeneration,
    Done,
}

/// The state machine. See the module docs.
#[derive(Clone, Debug)]
pub struct RunLifecycle {
    phase: Phase,
    generation: Generation,
    first_epoch: CheckpointId,
    lease_end: CheckpointId,
    tracker: RestartTracker,
    restored: Restored,
    start_overs: u32,
    /// The checkpoint the run's first deployed generation restored.
    first_restored: Option<Option<CheckpointId>>,
    restarts: u32,
    failed_at: Option<TimeMs>,
    /// The last failure, the checkpoint its generation had restored, and how many failures in a row
    /// were the same.
    last_failure: Option<(String, Option<CheckpointId>, u32)>,
    /// The same failure this many times in a row after restoring the same checkpoint ends the run.
    repeat_limit: Option<u32>,
}

impl RunLifecycle {
    /// A run that has not started, restarted under `restart` and ending after
    /// [`MAX_REPEATED_FAILURES`] repeated failures. Call [`RunLifecycle::start`] first.
    pub fn new(restart: RestartStrategy) -> RunLifecycle {
        RunLifecycle {
            phase: Phase::Start,
            generation: Generation::default(),
            first_epoch: CheckpointId(1),
            lease_end: CheckpointId(1),
            tracker: RestartTracker::new(restart),
            restored: Restored::default(),
            start_overs: 0,
            first_restored: None,
            restarts: 0,
            failed_at: None,
            last_failure: None,
            repeat_limit: Some(MAX_REPEATED_FAILURES),
        }
    }

    /// End the run once the same failure repeats `limit` times in a row after restoring the same
    /// checkpoint (default [`MAX_REPEATED_FAILURES`]); `None`: only the restart strategy decides.
    pub fn with_repeat_limit(mut self, limit: Option<u32>) -> RunLifecycle {
        self.repeat_limit = limit;
        self
    }

    /// The generation of the current (or last) start.
    pub fn generation(&self) -> Generation {
        self.generation
    }
    /// The durable epoch lease as far as the lifecycle knows it.
    pub fn lease_end(&self) -> CheckpointId {
        self.lease_end
    }
    /// Restarts after failures so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }
    /// The checkpoint the run's first deployed generation restored (`Some(None)`: a fresh start;
    /// `None`: nothing deployed yet).
    pub fn restored_at_start(&self) -> Option<Option<CheckpointId>> {
        self.first_restored
    }
    /// What the current start restored.
    pub fn restored(&self) -> &Restored {
        &self.restored
    }

    /// The first step of the run.
    pub fn start<E>(&mut self) -> Step<E> {
        assert_eq!(self.phase, Phase::Start, "a run starts once");
        self.phase = Phase::Opening;
        Step::Open
    }

    /// What happened at `now`; the next step.
    ///
    /// # Panics
    /// If `event` does not answer the outstanding step (the runtime broke the step protocol), or a
    /// generation ended with an epoch lease below the one the lifecycle knew.
    pub fn next<E: std::fmt::Display + std::fmt::Debug>(&mut self, now: TimeMs, event: LifeEvent<E>) -> Step<E> {
        use LifeEvent as Ev;
        let step = match (self.phase, event) {
            (_, Ev::Fatal(e)) => self.done(RunEnd::Failed(RunFailure::Step(e))),
            (Phase::Opening, Ev::Opened(facts)) => self.opened(facts),
            (Phase::Beginning, Ev::Begun) => self.restore(),
            (Phase::Restoring, Ev::Restored(r)) => {
                let restore_point =
                    r.checkpoint.filter(|_| !r.from_savepoint).into_iter().chain(r.skipped.iter().copied()).max();
                self.restored = r;
                self.phase = Phase::Claiming;
                Step::Claim { generation: self.generation, restore_point }
            }
            (Phase::Restoring, Ev::RestoreFailed { error, transient: true }) => {
                self.failure(now, format!("reading checkpoints: {error}"), false, Cause::Restore)
            }
            (Phase::Restoring, Ev::RestoreFailed { error, transient: false }) => {
                self.done(RunEnd::Failed(RunFailure::Step(error)))
            }
            (Phase::Claiming, Ev::Claimed { newest_manifest_now }) => self.claimed(newest_manifest_now),
            (Phase::Claiming, Ev::ClaimTaken(e)) => self.done(RunEnd::Failed(RunFailure::Step(e))),
            (Phase::Claiming, Ev::Transient(e)) => {
                self.failure(now, format!("recording {}: {e}", self.generation), false, Cause::Claim)
            }
            (Phase::Releasing, Ev::Released) => self.restore(),
            (Phase::Deploying, Ev::Deployed) => {
                self.first_restored.get_or_insert(self.restored.checkpoint);
                self.phase = Phase::Running;
                let recovered_after_ms = self.failed_at.take().map(|at| now.saturating_sub(at));
                Step::Run { generation: self.generation, recovered_after_ms }
            }
            (Phase::Deploying, Ev::DeployFailed { error, permanent: true }) => {
                self.done(RunEnd::Failed(RunFailure::Step(error)))
            }
            (Phase::Deploying, Ev::DeployFailed { error, permanent: false }) => {
                self.failure(now, format!("deploying {}: {error}", self.generation), false, Cause::Deploy)
            }
            (Phase::Running, Ev::GenerationEnded { end, lease_end }) => {
                assert!(
                    lease_end >= self.lease_end,
                    "the epoch lease went back from {} to {lease_end}",
                    self.lease_end
                );
                self.lease_end = lease_end;
                match end {
                    GenerationEnd::Finished(c) => self.done(RunEnd::Finished(c)),
                    GenerationEnd::Stopped => self.done(RunEnd::Stopped),
                    GenerationEnd::StoppedWithSavepoint => self.done(RunEnd::StoppedWithSavepoint),
                    GenerationEnd::Error(e) => self.done(RunEnd::Failed(RunFailure::Step(e))),
                    GenerationEnd::FailedOver { reason, permanent } => {
                        self.failure(now, reason, permanent, Cause::Generation)
                    }
                }
            }
            (Phase::Waiting, Ev::Waited) => {
                self.restarts += 1;
                let Some(next) = self.generation.0.checked_add(1) else {
                    return self
                        .done(RunEnd::Failed(RunFailure::Exhausted { what: "generation", value: self.generation.0 }));
                };
                self.generation = Generation(next);
                self.phase = Phase::RecordingGeneration;
                Step::NextGeneration { generation: self.generation, lease_end: self.lease_end }
            }
            (Phase::Waiting, Ev::StopRequested) => self.done(RunEnd::Stopped),
            (Phase::RecordingGeneration, Ev::MetaWritten) => self.restore(),
            (phase, event) => {
                panic!("lifecycle event {event:?} in phase {phase:?}: the runtime broke the step protocol")
            }
        };
        step
    }

    fn done<E>(&mut self, end: RunEnd<E>) -> Step<E> {
        self.phase = Phase::Done;
        Step::Done(end)
    }

    fn restore<E>(&mut self) -> Step<E> {
        self.phase = Phase::Restoring;
        Step::Restore { generation: self.generation }
    }

    fn opened<E>(&mut self, f: StoreFacts) -> Step<E> {
        if f.meta.is_some_and(|m| !m.same_job) {
            return self.done(RunEnd::Failed(RunFailure::WrongJob));
        }
        if let Some(c) = f.finished {
            return self.done(RunEnd::AlreadyFinished(c));
        }
        let exhausted = |what, value| RunEnd::Failed(RunFailure::Exhausted { what, value });
        // Epochs: above the durable lease and above anything in storage, for the whole life of the job.
        let above_seen = match f.max_checkpoint_seen {
            None => 1,
            Some(c) => match c.0.checked_add(1) {
                Some(n) => n,
                None => return self.done(exhausted("checkpoint id", c.0)),
            },
        };
        let mut first = above_seen.max(f.meta.map(|m| m.lease_end.0).unwrap_or(1)).max(1);
        // The generation records decide (job.meta is a plain overwrite a stale coordinator may lower).
        let latest =
            f.meta.map(|m| m.generation).unwrap_or_default().max(f.latest_generation_record.unwrap_or_default());
        let Some(mut generation) = latest.0.checked_add(1) else {
            return self.done(exhausted("generation", latest.0));
        };
        // A run that starts from a savepoint continues its epochs and generations: the restored
        // checkpoint must be older than every new epoch, and sink transactions of the job the
        // savepoint came from must never share a name with new ones.
        if let Some((c, g)) = f.savepoint {
            match (c.0.checked_add(1), g.0.checked_add(1)) {
                (Some(c1), Some(g1)) => {
                    first = first.max(c1);
                    generation = generation.max(g1);
                }
                (None, _) => return self.done(exhausted("savepoint checkpoint id", c.0)),
                (_, None) => return self.done(exhausted("savepoint generation", g.0)),
            }
        }
        let Some(lease_end) = first.checked_add(EPOCH_LEASE_BLOCK) else {
            return self.done(exhausted("epoch lease", first));
        };
        self.first_epoch = CheckpointId(first);
        self.lease_end = CheckpointId(lease_end);
        self.generation = Generation(generation);
        self.phase = Phase::Beginning;
        Step::Begin { generation: self.generation, lease_end: self.lease_end }
    }

    fn claimed<E>(&mut self, newest_now: Option<CheckpointId>) -> Step<E> {
        let r = &self.restored;
        let seen = r
            .newest_manifest_before
            .into_iter()
            .chain(r.checkpoint.filter(|_| !r.from_savepoint))
            .chain(r.skipped.iter().copied())
            .max();
        if let Some(committed) = newest_now.filter(|c| Some(*c) > seen) {
            // A checkpoint was committed after this start listed the checkpoints and before it claimed
            // the generation, by an older coordinator that may have told its sinks to commit it: the
            // claim would fence it. Take the claim back and start over, which restores it.
            self.start_overs += 1;
            if self.start_overs > MAX_START_OVERS {
                return self.done(RunEnd::Failed(RunFailure::KeepsCompleting { checkpoint: committed }));
            }
            self.phase = Phase::Releasing;
            return Step::Release { generation: self.generation, committed };
        }
        self.phase = Phase::Deploying;
        Step::Deploy {
            generation: self.generation,
            restored: self.restored.checkpoint,
            first_epoch: self.first_epoch,
            lease_end: self.lease_end,
        }
    }

    /// A failure of the current generation (or of its start) at `now`.
    fn failure<E>(&mut self, now: TimeMs, reason: String, permanent: bool, cause: Cause) -> Step<E> {
        self.failed_at.get_or_insert(now);
        let restored = self.restored.checkpoint;
        let repeated = match &self.last_failure {
            Some((last, at, n)) if *last == reason && *at == restored => n + 1,
            _ => 1,
        };
        self.last_failure = Some((reason.clone(), restored, repeated));
        if permanent {
            return self.done(RunEnd::Failed(RunFailure::Permanent { reason }));
        }
        if cause == Cause::Generation && self.repeat_limit.is_some_and(|limit| repeated >= limit) {
            let attempts = self.tracker.attempts();
            return self.done(RunEnd::Failed(RunFailure::GaveUp { attempts, last: reason, repeated, restored }));
        }
        match self.tracker.on_failure(now) {
            RestartDecision::GiveUp { attempts } => {
                self.done(RunEnd::Failed(RunFailure::GaveUp { attempts, last: reason, repeated, restored }))
            }
            RestartDecision::RestartAfter { delay_ms, attempt } => {
                self.phase = Phase::Waiting;
                Step::Wait { delay_ms, attempt, reason, cause }
            }
        }
    }
}

#[cfg(test)]
mod tests;
