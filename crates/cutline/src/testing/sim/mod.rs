//! Deterministic simulation of a whole job in one thread: coordinator, tasks, channels, checkpoint
//! storage and a transactional sink, driven by a seeded scheduler that reorders messages across channels
//! (never within one), delays snapshot writes and control messages, crashes tasks at every protocol step,
//! fails storage writes (including a manifest commit that succeeds but reports failure), kills the whole
//! "process" and restarts it from storage.
//!
//! After every completed checkpoint it checks that the checkpoint is a consistent cut (the keyed state
//! equals exactly what the sources' recorded offsets imply, or at least that much in at-least-once mode);
//! at the end it checks that the committed output equals that of a run without failures (or contains
//! it). A failing seed replays exactly: no clock influences a decision (time is simulated; only the
//! encode/write statistics read one) and nothing spawns a thread.
//!
//! It drives the same `Task`, `Coordinator`, decision carrier (`driver.rs`), `MemStore`/`FaultyStore`
//! and sink code as the threaded runtime; only the scheduling (this file) differs.

mod check;
mod generation;
mod job;

use crate::connectors::MemoryTxnStore;
use crate::dataflow::JobGraph;
use crate::error::TaskError;
use crate::fault::{FaultPoint, Faults};
use crate::runtime::deploy::{deploy, DeployOptions};
use crate::runtime::driver::{coordinator_for, task_metas, SnapshotJob};
use crate::runtime::life::{drive, DeployFailure, Ended, LifeHost};
use crate::runtime::start::job_id;
use crate::runtime::task::Task;
use crate::runtime::{AckReport, RunConfig, RunError};
use crate::state::RestoreIndex;
use cutline_core::barrier::CheckpointMode;
use cutline_core::coordinator::{CheckpointConfig, Coordinator};
use cutline_core::lifecycle::{Cause, GenerationEnd};
use cutline_core::restart::RestartStrategy;
use cutline_core::{CheckpointId, Generation, TimeMs};
use cutline_storage::{FaultyStore, MemStore, StoreOp};
use generation::{run_generation_sim, GenEnd};
use job::{expected_output, parse_totals, sim_job};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A small seeded PRNG (xorshift64*), so that a seed replays exactly everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(crate::state::splitmix64(seed) | 1)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A number in `0..n` (slightly biased for huge `n`). Panics if `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }
    /// True with probability `p_per_million` / 1e6.
    pub fn chance(&mut self, p_per_million: u64) -> bool {
        self.below(1_000_000) < p_per_million
    }
}

/// How exactly-once checkpoints align in a simulation run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimAlignment {
    /// Always aligned.
    Aligned,
    /// Always unaligned: barriers overtake queued records, which become channel state.
    Unaligned,
    /// Aligned with a small random alignment timeout and byte limit, so tasks switch.
    WithTimeout,
    /// Each process life picks one of the three, and settings change at random while the job runs.
    Mixed,
}

/// What a simulation run does. Probabilities are per million scheduler steps (or per operation).
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// The checkpoint mode (default exactly-once).
    pub mode: CheckpointMode,
    /// Alignment of exactly-once checkpoints (ignored in at-least-once mode).
    pub alignment: SimAlignment,
    /// A task stops being scheduled for a random while (up to twice the checkpoint timeout): a
    /// straggler or a stuck task.
    pub stall_ppm: u64,
    /// Records of source "left" (parallelism 2) and "right" (parallelism 1, behind a forward edge).
    pub left_records: u64,
    /// Records of source "right" (see `left_records`).
    pub right_records: u64,
    /// Records of source "rules" (parallelism 1), broadcast to 2 subtasks and unioned into "left".
    pub rules_records: u64,
    /// Distinct keys the records of all sources are spread over.
    pub keys: u64,
    /// Checkpoints in flight at once (`CheckpointConfig::max_concurrent`).
    pub max_concurrent: usize,
    /// A task fails at a random step.
    pub task_crash_ppm: u64,
    /// The whole process dies (coordinator included) and restarts from storage.
    pub process_crash_ppm: u64,
    /// A savepoint is requested (a third of them stop the job, which a new process then resumes).
    pub savepoint_ppm: u64,
    /// A failure is injected at a fault point (snapshot, sink prepare/commit/recover, batch).
    pub fault_point_ppm: u64,
    /// A storage write fails.
    pub storage_fail_ppm: u64,
    /// The sink follows the Kafka sink's design (records in the checkpoint, a marker written with
    /// them, older incarnations fenced: `MemoryMarkerSink`) instead of prepared transactions
    /// (`MemoryTxnSink`, the PostgreSQL sink's design).
    pub marker_sink: bool,
    /// Scheduler steps after which the run fails as a livelock or deadlock.
    pub max_steps: u64,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            mode: CheckpointMode::ExactlyOnce,
            alignment: SimAlignment::Aligned,
            stall_ppm: 0,
            savepoint_ppm: 0,
            left_records: 240,
            right_records: 120,
            rules_records: 30,
            keys: 7,
            max_concurrent: 1,
            task_crash_ppm: 1_500,
            process_crash_ppm: 500,
            fault_point_ppm: 1_500,
            storage_fail_ppm: 20_000,
            marker_sink: false,
            max_steps: 400_000,
        }
    }
}

/// What a passing run saw (for tests that want to know the failures were really exercised).
#[derive(Clone, Debug, Default)]
pub struct SimReport {
    /// Scheduler steps taken, over every process life.
    pub steps: u64,
    /// Checkpoint completions notified to the tasks (savepoints included).
    pub checkpoints_completed: u64,
    /// Generation claims that storage failed (the next generation claimed again).
    pub failed_claims: u64,
    /// Generations that failed over (and were restarted).
    pub failovers: u64,
    /// Deaths of the whole simulated process (restarted from storage).
    pub process_crashes: u64,
    /// Completed checkpoints whose cut was read back from storage and checked.
    pub cuts_checked: u64,
    /// Snapshot writes of an older generation that completed after a failover.
    pub late_writes: u64,
    /// Checked checkpoints with a task state on top of older checkpoints' files (incremental).
    pub incremental_cuts: u64,
    /// In-flight batches found in the channel state of checked checkpoints.
    pub in_flight_batches: u64,
    /// Task snapshots that switched from aligned to unaligned.
    pub switched_snapshots: u64,
    /// Settings changed while the job ran.
    pub retunes: u64,
    /// Tasks stalled for a while (`SimOptions::stall_ppm`).
    pub stalls: u64,
    /// Savepoints requested (stop or not), whether or not they completed.
    pub savepoints_requested: u64,
    /// Times the job stopped with a savepoint (and a new process resumed it).
    pub stopped_with_savepoint: u64,
    /// Seeds whose keyed operators kept their state on disk (feature `spill`).
    pub disk_state_seeds: u64,
    /// Keys the join had removed, found absent from the state of a checked checkpoint.
    pub removed_keys_checked: u64,
}

pub(super) const FINGERPRINT: &str = "sim-job";
/// How often settings change at run time in the mixed-alignment scenario.
pub(super) const RETUNE_PPM: u64 = 2_000;

/// Run one seed; `Err` describes the first violated property.
pub fn run_seed(seed: u64, o: &SimOptions) -> Result<SimReport, String> {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Sim::new(seed, o.clone()).run()));
    match result {
        Ok(r) => r,
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(format!("assertion failed: {}", msg.unwrap_or_default()))
        }
    }
}

pub(super) struct Sim {
    pub(super) seed: u64,
    pub(super) o: SimOptions,
    pub(super) rng: Arc<Mutex<Rng>>,
    pub(super) store: Arc<FaultyStore<MemStore>>,
    pub(super) out: Arc<Mutex<MemoryTxnStore>>,
    /// What the second sink of the fork after the join committed.
    pub(super) copy: Arc<Mutex<MemoryTxnStore>>,
    pub(super) graph: JobGraph,
    pub(super) now: TimeMs,
    pub(super) report: SimReport,
    /// Every epoch ever triggered, across failovers and process crashes.
    pub(super) last_triggered: Option<CheckpointId>,
    /// Snapshot writes not yet done. They survive a failover (so late acks of an older generation
    /// reach the coordinator and late files land in storage after an abort), not a process crash.
    pub(super) writes: Vec<SnapshotJob>,
}

impl Sim {
    fn new(seed: u64, o: SimOptions) -> Sim {
        let rng = Arc::new(Mutex::new(Rng::new(seed)));
        let r2 = rng.clone();
        let fail_ppm = o.storage_fail_ppm;
        let store = Arc::new(FaultyStore::new(MemStore::new(), move |op| {
            let mut r = r2.lock().expect("rng");
            match op {
                // Failing the meta write at start would only stop the simulated process; keep it simple.
                StoreOp::WriteMeta | StoreOp::Gc | StoreOp::Discard { .. } | StoreOp::MarkFinished => false,
                _ => r.chance(fail_ppm),
            }
        }));
        let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let copy = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let graph = sim_job(&o, out.clone(), copy.clone());
        Sim {
            seed,
            o,
            rng,
            store,
            out,
            copy,
            graph,
            now: TimeMs(0),
            report: SimReport::default(),
            last_triggered: None,
            writes: Vec::new(),
        }
    }

    pub(super) fn rand(&self, n: u64) -> u64 {
        self.rng.lock().expect("rng").below(n)
    }
    pub(super) fn chance(&self, ppm: u64) -> bool {
        self.rng.lock().expect("rng").chance(ppm)
    }

    fn config(&self) -> RunConfig {
        let mut cfg = RunConfig::new(self.store.clone(), FINGERPRINT);
        cfg.checkpoint = self.checkpoint_config();
        cfg.retain = 2;
        cfg.batch_size = 1 + self.rand(4) as usize;
        cfg.channel_capacity = 1 + self.rand(4) as usize;
        // Small enough that some unaligned checkpoints are declined for their channel state.
        cfg.max_channel_state_bytes = 200 + self.rand(4000);
        if let Some(backend) = self.disk_backend() {
            cfg.state_backend = backend;
        }
        cfg
    }

    /// One seed in four keeps keyed state on disk (with feature `spill`) behind a cache of a few
    /// keys, so that it flushes all the time. Chosen from the seed, not drawn from the generator:
    /// seeds replay as they did before the choice existed. The stores go to /dev/shm where there is
    /// one: every task incarnation creates one, and creating a store syncs it.
    fn disk_backend(&self) -> Option<crate::state::StateBackend> {
        let pick = crate::state::splitmix64(self.seed ^ 0xd15c_5eed);
        let shm = std::path::Path::new("/dev/shm");
        let root = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        (cfg!(feature = "spill") && pick.is_multiple_of(4)).then(|| crate::state::StateBackend::Disk {
            dir: root.join(format!("cutline-sim-state-{}", std::process::id())),
            cache_entries: 1 + (pick >> 8) as usize % 8,
        })
    }

    /// Random checkpoint settings for the scenario's mode and alignment.
    pub(super) fn checkpoint_config(&self) -> CheckpointConfig {
        let mut c = CheckpointConfig {
            interval_ms: Some(5 + self.rand(20)),
            timeout_ms: 400,
            min_pause_ms: self.rand(3),
            max_concurrent: self.o.max_concurrent,
            tolerable_failures: 2,
            mode: self.o.mode,
            ..Default::default()
        };
        if self.o.mode == CheckpointMode::ExactlyOnce {
            let alignment = match self.o.alignment {
                SimAlignment::Mixed => {
                    [SimAlignment::Aligned, SimAlignment::Unaligned, SimAlignment::WithTimeout][self.rand(3) as usize]
                }
                a => a,
            };
            match alignment {
                SimAlignment::Aligned | SimAlignment::Mixed => {}
                SimAlignment::Unaligned => c.unaligned = true,
                SimAlignment::WithTimeout => {
                    c.alignment_timeout_ms = Some(self.rand(8));
                    if self.rand(2) == 0 {
                        c.max_aligned_bytes = Some(self.rand(60));
                    }
                }
            }
        }
        c
    }

    fn run(mut self) -> Result<SimReport, String> {
        let expected = expected_output(&self.o);
        // Each iteration of this loop is one process life.
        loop {
            match self.process_life()? {
                Life::Finished => break,
                Life::Crashed => {
                    self.report.process_crashes += 1;
                    self.writes.clear(); // they died with the process
                }
            }
        }
        let mut got = self.out.lock().expect("out").committed_records();
        got.sort();
        match self.o.mode {
            CheckpointMode::ExactlyOnce => {
                if got != expected {
                    return Err(format!(
                        "seed {}: committed output differs from the failure-free run: {}",
                        self.seed,
                        diff(&expected, &got)
                    ));
                }
                let mut copy = self.copy.lock().expect("copy").committed_records();
                copy.sort();
                if copy != expected {
                    return Err(format!(
                        "seed {}: the second sink of the fork committed other output than the failure-free run: {}",
                        self.seed,
                        diff(&expected, &copy)
                    ));
                }
            }
            CheckpointMode::AtLeastOnce => {
                // Every record of the failure-free run must be there; replays may add duplicates, and
                // state that counted a replayed record twice emits higher counts.
                let have: std::collections::BTreeSet<&String> = got.iter().collect();
                let missing: Vec<&String> =
                    expected.iter().filter(|e| parse_totals(e).is_none() && !have.contains(e)).take(5).collect();
                if !missing.is_empty() {
                    return Err(format!("seed {}: at-least-once output lost records, e.g. {missing:?}", self.seed));
                }
                // Each key's totals at the end of the input: at least once, and at least the true ones.
                for (k, l, r) in expected.iter().filter_map(|e| parse_totals(e)) {
                    if !got.iter().filter_map(|g| parse_totals(g)).any(|(gk, gl, gr)| gk == k && gl >= l && gr >= r) {
                        return Err(format!("seed {}: at-least-once output lost the totals of key {k}", self.seed));
                    }
                }
            }
        }
        self.report.disk_state_seeds = u64::from(self.disk_backend().is_some());
        Ok(self.report)
    }

    /// One life of the simulated process: the run loop the runtime runs (`life::drive`), hosted by
    /// the simulation, until the job ends or the process dies.
    fn process_life(&mut self) -> Result<Life, String> {
        let faults = {
            let rng = self.rng.clone();
            let ppm = self.o.fault_point_ppm;
            Faults::new(move |p| {
                let mut r = rng.lock().expect("rng");
                match p {
                    FaultPoint::ProcessBatch => r.chance(ppm / 10),
                    _ => r.chance(ppm * 10),
                }
            })
        };
        let mut cfg = self.config();
        cfg.faults = faults;
        // The simulation never gives up: every failure is followed by a restart.
        cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1 + self.rand(5), max_attempts: u32::MAX };
        // Its crashes are random, and often the same crash after the same checkpoint: not a failure
        // that repeats at the same input.
        cfg.max_repeated_failures = None;
        let graph = self.graph.clone();
        let mut host = SimHost { sim: self, cfg: &cfg, coordinator: None, tasks: None, died: None };
        let driven = drive(&graph, &cfg, &mut host);
        if let Some(Death::Violation(e)) = host.died.take() {
            return Err(e);
        }
        let Some(driven) = driven else { return Ok(Life::Crashed) };
        match driven.end {
            Ok(Ended::Finished(_) | Ended::AlreadyFinished(_)) => Ok(Life::Finished),
            // Stopped with a savepoint: the process ends, and a new one resumes from it.
            Ok(Ended::Stopped | Ended::StoppedWithSavepoint) => Ok(Life::Crashed),
            Err(e) => Err(format!("seed {}: the run failed: {e}", self.seed)),
        }
    }
}

/// Why a simulated process ended before its run loop did.
enum Death {
    /// The simulation killed it.
    Crash,
    /// A checked property was violated.
    Violation(String),
}

/// The simulation's side of the run loop: deployments are plain task values, a generation runs in
/// the seeded scheduler, restarts wait in simulated time, and the process may die between any two
/// steps of the loop.
struct SimHost<'a> {
    sim: &'a mut Sim,
    cfg: &'a RunConfig,
    coordinator: Option<Coordinator<AckReport>>,
    tasks: Option<Vec<Option<Task>>>,
    died: Option<Death>,
}

impl LifeHost for SimHost<'_> {
    fn now(&self) -> TimeMs {
        self.sim.now
    }

    fn mode(&self) -> CheckpointMode {
        self.coordinator.as_ref().map(|c| c.config().mode).unwrap_or(self.cfg.checkpoint.mode)
    }

    fn deploy(
        &mut self,
        generation: Generation,
        index: RestoreIndex,
        restored: Option<CheckpointId>,
        (first_epoch, lease_end): (CheckpointId, CheckpointId),
    ) -> Result<(), DeployFailure> {
        // The first epoch of a process (later generations continue its coordinator's epochs).
        if let Some(l) = self.sim.last_triggered.filter(|_| self.coordinator.is_none()) {
            assert!(first_epoch > l, "a new process would reuse epoch {first_epoch} (last triggered {l})");
        }
        let opts = DeployOptions {
            restore: &index,
            faults: self.cfg.faults.clone(),
            incarnation_base: generation.0 << 32,
            job_id: job_id(FINGERPRINT),
            batch_size: self.cfg.batch_size,
            state_backend: &self.cfg.state_backend,
            channel_capacity: self.cfg.channel_capacity,
            max_channel_state_bytes: self.cfg.max_channel_state_bytes,
        };
        let deployed = match deploy(&self.sim.graph, &opts) {
            Ok(d) => d,
            // A sink failed while opening: a failover before the generation ran.
            Err(e @ TaskError::Injected(_)) => {
                return Err(DeployFailure { error: RunError::Deploy(e), permanent: false })
            }
            Err(e) => return Err(DeployFailure { error: RunError::Deploy(e), permanent: true }),
        };
        let ids = deployed.iter().map(|d| d.task.id).collect();
        let sources = deployed.iter().filter(|d| d.task.is_source()).map(|d| d.task.id).collect();
        coordinator_for(
            &mut self.coordinator,
            &self.cfg.checkpoint,
            generation,
            (ids, sources),
            (first_epoch, lease_end),
            restored,
            self.sim.now,
            &*self.sim.store,
        );
        self.tasks = Some(deployed.into_iter().map(|d| Some(d.task)).collect());
        Ok(())
    }

    fn run(
        &mut self,
        generation: Generation,
        _recovered_after_ms: Option<u64>,
    ) -> (GenerationEnd<RunError>, CheckpointId) {
        let coord = self.coordinator.as_mut().expect("deployed");
        let mut lease_end = coord.lease_end();
        let mut tasks = self.tasks.take().expect("deployed");
        let metas = task_metas(&self.sim.graph);
        let end = match run_generation_sim(self.sim, coord, &mut tasks, &metas, generation, &mut lease_end, self.cfg) {
            Ok(GenEnd::Finished(c)) => GenerationEnd::Finished(c),
            Ok(GenEnd::Stopped) => GenerationEnd::StoppedWithSavepoint,
            Ok(GenEnd::FailOver(reason)) => {
                self.sim.report.failovers += 1;
                for t in tasks.iter_mut().flatten() {
                    t.cancel();
                }
                GenerationEnd::FailedOver { reason, permanent: false }
            }
            Ok(GenEnd::ProcessCrash) => {
                self.died = Some(Death::Crash);
                GenerationEnd::Stopped
            }
            Err(e) => {
                self.died = Some(Death::Violation(e));
                GenerationEnd::Stopped
            }
        };
        (end, lease_end)
    }

    fn wait(&mut self, delay_ms: u64, cause: Cause) -> bool {
        if cause == Cause::Claim {
            self.sim.report.failed_claims += 1;
        }
        self.sim.now = self.sim.now.plus_ms(delay_ms);
        false
    }

    fn crash_point(&mut self) -> bool {
        self.died.is_some() || self.sim.chance(self.sim.o.process_crash_ppm / 4)
    }
}

enum Life {
    Finished,
    Crashed,
}

fn diff(want: &[String], got: &[String]) -> String {
    let mut w: BTreeMap<&str, i64> = BTreeMap::new();
    for s in want {
        *w.entry(s).or_default() += 1;
    }
    for s in got {
        *w.entry(s).or_default() -= 1;
    }
    let missing: Vec<&str> = w.iter().filter(|(_, c)| **c > 0).map(|(s, _)| *s).take(5).collect();
    let extra: Vec<&str> = w.iter().filter(|(_, c)| **c < 0).map(|(s, _)| *s).take(5).collect();
    format!(
        "{} records expected, {} committed; missing e.g. {missing:?}; duplicated/unexpected e.g. {extra:?}",
        want.len(),
        got.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_free_run_produces_the_expected_output() {
        let o = SimOptions {
            task_crash_ppm: 0,
            process_crash_ppm: 0,
            fault_point_ppm: 0,
            storage_fail_ppm: 0,
            ..Default::default()
        };
        for seed in 0..20 {
            let r = run_seed(seed, &o).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(r.failovers, 0);
            assert!(r.checkpoints_completed >= 1);
        }
    }
}
