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

use crate::api::{Either, Job};
use crate::driver::{
    carry_out, coordinator_for, next_generation, task_metas, write_snapshot, Carried, CheckpointLog, ControlPlane,
    DriverCtx, SnapshotJob, TaskMeta,
};
use crate::fault::{FaultPoint, Faults};
use crate::graph::{DeployOptions, JobGraph};
use crate::message::Control;
use crate::runtime::{claim_generation, load_checkpoint, prepare_start, restore_latest, RunConfig, Start};
use crate::runtime::{AckReport, RunError};
use crate::sink::{MemoryTxnSink, MemoryTxnStore};
use crate::source::{GeneratorSource, SourceStatus};
use crate::state::{stable_hash, ElementState, SnapshotBuilder};
use crate::task::{SnapshotTimings, SourcePhase, Task, TaskEnv};
use cutline_core::barrier::{Barrier, CheckpointMode};
use cutline_core::coordinator::{CheckpointConfig, Coordinator, Event};
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use cutline_storage::{FaultyStore, MemStore, StorageError, StoreOp};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

/// A small seeded PRNG (xorshift64*), so that a seed replays exactly everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(crate::state::splitmix64(seed) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
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
    Aligned,
    Unaligned,
    /// Aligned with a small random alignment timeout and byte limit, so tasks switch.
    WithTimeout,
    /// Each process life picks one of the three, and settings change at random while the job runs.
    Mixed,
}

/// What a simulation run does. Probabilities are per million scheduler steps (or per operation).
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub mode: CheckpointMode,
    /// Alignment of exactly-once checkpoints (ignored in at-least-once mode).
    pub alignment: SimAlignment,
    /// A task stops being scheduled for a random while (up to twice the checkpoint timeout): a
    /// straggler or a stuck task.
    pub stall_ppm: u64,
    /// Records of source "left" (parallelism 2) and "right" (parallelism 1, behind a forward edge).
    pub left_records: u64,
    pub right_records: u64,
    /// Records of source "rules" (parallelism 1), broadcast to 2 subtasks and unioned into "left".
    pub rules_records: u64,
    pub keys: u64,
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
            max_steps: 400_000,
        }
    }
}

/// What a passing run saw (for tests that want to know the failures were really exercised).
#[derive(Clone, Debug, Default)]
pub struct SimReport {
    pub steps: u64,
    pub checkpoints_completed: u64,
    /// Generation claims that storage failed (the next generation claimed again).
    pub failed_claims: u64,
    pub failovers: u64,
    pub process_crashes: u64,
    pub cuts_checked: u64,
    /// Snapshot writes of an older generation that completed after a failover.
    pub late_writes: u64,
    /// In-flight batches found in the channel state of checked checkpoints.
    pub in_flight_batches: u64,
    /// Task snapshots that switched from aligned to unaligned.
    pub switched_snapshots: u64,
    /// Settings changed while the job ran.
    pub retunes: u64,
    pub stalls: u64,
    pub savepoints_requested: u64,
    pub stopped_with_savepoint: u64,
}

const FINGERPRINT: &str = "sim-job";
/// How often settings change at run time in the mixed-alignment scenario.
const RETUNE_PPM: u64 = 2_000;

fn left_key(i: u64, keys: u64) -> u64 {
    i % keys
}
fn right_key(i: u64, keys: u64) -> u64 {
    (i * 3 + 1) % keys
}
fn rules_key(i: u64, keys: u64) -> u64 {
    (i * 5 + 2) % keys
}

/// The simulated job: two sources of different parallelism, connected into one keyed two-input
/// operator whose state both inputs share, then a map and a transactional sink.
fn sim_job(o: &SimOptions, out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let keys = o.keys;
    let job = Job::new("sim");
    job.set_parallelism(2).set_max_parallelism(16);
    let left =
        job.source_with_parallelism("left", 2, GeneratorSource::new(o.left_records, move |i| (left_key(i, keys), i)));
    // A broadcast edge: every "rules" record reaches the join once through each of the 2 subtasks of
    // "rules-b", unioned into the left input.
    let rules = job
        .source_with_parallelism("rules", 1, GeneratorSource::new(o.rules_records, move |i| (rules_key(i, keys), i)))
        .broadcast("rules-b", 2);
    // A forward edge on the right input.
    let right = job
        .source_with_parallelism("right", 1, GeneratorSource::new(o.right_records, move |i| (right_key(i, keys), i)))
        .forward("right-fwd");
    left.union(rules)
        .connect(right)
        .key_by(|l: &(u64, u64)| l.0, |r: &(u64, u64)| r.0)
        .process("join", |k: &u64, state: &mut Option<(u64, u64)>, rec: Either<(u64, u64), (u64, u64)>, out| {
            let s = state.get_or_insert((0, 0));
            match rec {
                Either::Left(_) => {
                    s.0 += 1;
                    out.emit(format!("L:{k}:{}", s.0));
                }
                Either::Right(_) => {
                    s.1 += 1;
                    out.emit(format!("R:{k}:{}", s.1));
                }
            }
        })
        // A rebalance edge from 2 to 3 subtasks, then the sink fused into them.
        .rebalance("spread", 3)
        .map(|s: String| s)
        .sink("out", MemoryTxnSink::new(out));
    job.build().expect("sim job is valid")
}

/// Per key, how many left-input and right-input records the join sees in a run without failures
/// (rules records count twice: they arrive through both broadcast subtasks).
fn expected_counts(o: &SimOptions) -> BTreeMap<u64, (u64, u64)> {
    let mut want: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for i in 0..o.left_records {
        want.entry(left_key(i, o.keys)).or_default().0 += 1;
    }
    for i in 0..o.rules_records {
        want.entry(rules_key(i, o.keys)).or_default().0 += 2;
    }
    for i in 0..o.right_records {
        want.entry(right_key(i, o.keys)).or_default().1 += 1;
    }
    want
}

/// The committed output of a run without failures, sorted.
fn expected_output(o: &SimOptions) -> Vec<String> {
    let mut out = Vec::new();
    for (k, (l, r)) in expected_counts(o) {
        out.extend((1..=l).map(|n| format!("L:{k}:{n}")));
        out.extend((1..=r).map(|n| format!("R:{k}:{n}")));
    }
    out.sort();
    out
}

enum SimEvent {
    Coord(Event<AckReport>),
}

/// The environment the simulated tasks see.
struct SimEnv<'a> {
    now: TimeMs,
    generation: Generation,
    writes: &'a mut Vec<SnapshotJob>,
    events: &'a mut VecDeque<SimEvent>,
    metas: &'a [TaskMeta],
    switched: &'a mut u64,
}

impl TaskEnv for SimEnv<'_> {
    fn now(&self) -> TimeMs {
        self.now
    }
    fn decline(&mut self, task: TaskId, checkpoint: CheckpointId, reason: String) {
        self.events.push_back(SimEvent::Coord(Event::Declined {
            generation: self.generation,
            checkpoint,
            task,
            reason,
        }));
    }
    fn persist(&mut self, task: TaskId, barrier: Barrier, snap: SnapshotBuilder, timings: SnapshotTimings) {
        if timings.switched {
            *self.switched += 1;
        }
        let meta = self.metas[task.0 as usize].clone();
        self.writes.push(SnapshotJob { generation: self.generation, task, meta, barrier, snap, timings });
    }
    fn source_finished(&mut self, task: TaskId) {
        self.events.push_back(SimEvent::Coord(Event::SourceFinished { generation: self.generation, task }));
    }
    fn task_finished(&mut self, task: TaskId) {
        self.events.push_back(SimEvent::Coord(Event::TaskFinished { generation: self.generation, task }));
    }
}

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

struct Sim {
    seed: u64,
    o: SimOptions,
    rng: Arc<Mutex<Rng>>,
    store: Arc<FaultyStore<MemStore>>,
    out: Arc<Mutex<MemoryTxnStore>>,
    graph: JobGraph,
    now: TimeMs,
    report: SimReport,
    /// Every epoch ever triggered, across failovers and process crashes.
    last_triggered: Option<CheckpointId>,
    /// Snapshot writes not yet done. They survive a failover (so late acks of an older generation
    /// reach the coordinator and late files land in storage after an abort), not a process crash.
    writes: Vec<SnapshotJob>,
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
        let graph = sim_job(&o, out.clone());
        Sim {
            seed,
            o,
            rng,
            store,
            out,
            graph,
            now: TimeMs(0),
            report: SimReport::default(),
            last_triggered: None,
            writes: Vec::new(),
        }
    }

    fn rand(&self, n: u64) -> u64 {
        self.rng.lock().expect("rng").below(n)
    }
    fn chance(&self, ppm: u64) -> bool {
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
        cfg
    }

    /// Random checkpoint settings for the scenario's mode and alignment.
    fn checkpoint_config(&self) -> CheckpointConfig {
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
            }
            CheckpointMode::AtLeastOnce => {
                // Every record of the failure-free run must be there; replays may add duplicates, and
                // state that counted a replayed record twice emits higher counts.
                let have: std::collections::BTreeSet<&String> = got.iter().collect();
                let missing: Vec<&String> = expected.iter().filter(|e| !have.contains(e)).take(5).collect();
                if !missing.is_empty() {
                    return Err(format!("seed {}: at-least-once output lost records, e.g. {missing:?}", self.seed));
                }
            }
        }
        Ok(self.report)
    }

    fn process_life(&mut self) -> Result<Life, String> {
        let cfg = self.config();
        let start = match prepare_start(&*self.store, FINGERPRINT, None).map_err(|e| e.to_string())? {
            Start::AlreadyFinished(_) => return Ok(Life::Finished),
            Start::Run(s) => s,
        };
        if let Some(l) = self.last_triggered {
            assert!(start.first > l, "a new process would reuse epoch {} (last triggered {l})", start.first);
        }
        let mut generation = start.generation;
        let mut lease_end = start.lease_end;
        let mut coordinator: Option<Coordinator<AckReport>> = None;
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
        let cfg = RunConfig { faults: faults.clone(), ..cfg };
        loop {
            // Deploy a generation.
            let mode = coordinator.as_ref().map(|c| c.config().mode).unwrap_or(cfg.checkpoint.mode);
            let (index, restored) = restore_latest(&cfg, &self.graph, mode).map_err(|e| format!("restore: {e}"))?;
            // As the runtime: establish the generation in storage. Storage faults hit the claim too
            // (also one that lands but reports failure); then the next generation tries again.
            match claim_generation(&*self.store, FINGERPRINT, generation, &index, restored) {
                Ok(()) => {}
                Err(e @ (StorageError::GenerationTaken { .. } | StorageError::Superseded { .. })) => {
                    return Err(format!("one coordinator was fenced by its own generations: {e}"))
                }
                Err(_) => {
                    self.report.failed_claims += 1;
                    generation =
                        next_generation(&*self.store, FINGERPRINT, generation, lease_end).map_err(|e| e.to_string())?;
                    continue;
                }
            }
            let opts = DeployOptions {
                restore: &index,
                faults: faults.clone(),
                incarnation_base: generation.0 << 32,
                job_id: crate::runtime::job_id(FINGERPRINT),
                batch_size: cfg.batch_size,
                channel_capacity: cfg.channel_capacity,
                max_channel_state_bytes: cfg.max_channel_state_bytes,
            };
            let deployed = match self.graph.deploy(&opts) {
                Ok(d) => d,
                Err(crate::message::TaskError::Injected(_)) => {
                    // A sink failed during recovery: a failover before the generation ran.
                    generation =
                        next_generation(&*self.store, FINGERPRINT, generation, lease_end).map_err(|e| e.to_string())?;
                    continue;
                }
                Err(e) => return Err(format!("deploy: {e}")),
            };
            drop(index);
            let metas = task_metas(&self.graph);
            let ids = deployed.iter().map(|d| d.task.id).collect();
            let sources = deployed.iter().filter(|d| d.task.is_source()).map(|d| d.task.id).collect();
            let coord = coordinator_for(
                &mut coordinator,
                &cfg.checkpoint,
                generation,
                (ids, sources),
                (start.first, lease_end),
                restored,
                self.now,
                &*self.store,
                &NoPlane,
            );
            let mut tasks: Vec<Option<Task>> = deployed.into_iter().map(|d| Some(d.task)).collect();
            match run_generation_sim(self, coord, &mut tasks, &metas, generation, &mut lease_end, &cfg)? {
                GenEnd::Finished => return Ok(Life::Finished),
                GenEnd::ProcessCrash | GenEnd::Stopped => return Ok(Life::Crashed),
                GenEnd::FailOver => {
                    self.report.failovers += 1;
                    for t in tasks.iter_mut().flatten() {
                        t.cancel();
                    }
                    generation =
                        next_generation(&*self.store, FINGERPRINT, generation, lease_end).map_err(|e| e.to_string())?;
                }
            }
        }
    }

    /// The checkpoint just committed must be a consistent cut: the join's per-key counts equal the
    /// records before the sources' recorded offsets (exactly-once), or cover them (at-least-once).
    fn check_cut(&mut self, id: CheckpointId) -> Result<(), String> {
        let (index, manifest) = load_checkpoint(&*self.store, &self.graph, FINGERPRINT, id)
            .map_err(|e| format!("reading back {id}: {e}"))?;
        if manifest.tasks.len() != self.graph.task_count() {
            return Err(format!(
                "checkpoint {id} has {} task states for {} tasks",
                manifest.tasks.len(),
                self.graph.task_count()
            ));
        }
        let offsets = |uid: &str| -> Vec<(u32, u32, u64)> {
            index
                .elements
                .get(uid)
                .map(|parts| {
                    parts
                        .iter()
                        .map(|p| match &p.state {
                            ElementState::Plain(b) => {
                                (p.subtask, p.parallelism, postcard::from_bytes::<u64>(b).expect("offset"))
                            }
                            _ => panic!("source offset is keyed"),
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut want: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for (sub, par, off) in offsets("left") {
            let mut i = sub as u64;
            while i < off.min(self.o.left_records) {
                want.entry(left_key(i, self.o.keys)).or_default().0 += 1;
                i += par as u64;
            }
        }
        for (_, _, off) in offsets("rules") {
            for i in 0..off.min(self.o.rules_records) {
                want.entry(rules_key(i, self.o.keys)).or_default().0 += 2;
            }
        }
        for (_, _, off) in offsets("right") {
            for i in 0..off.min(self.o.right_records) {
                want.entry(right_key(i, self.o.keys)).or_default().1 += 1;
            }
        }
        let mut have: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for p in index.elements.get("join").map(|v| v.as_slice()).unwrap_or(&[]) {
            let ElementState::Keyed { groups, .. } = &p.state else {
                return Err("join state is not keyed".into());
            };
            for (kg, blob) in groups {
                let mut b = blob.as_slice();
                while !b.is_empty() {
                    let ((k, v), rest): ((u64, (u64, u64)), &[u8]) =
                        postcard::take_from_bytes(b).map_err(|e| e.to_string())?;
                    assert_eq!(crate::state::key_group_of_hash(stable_hash(&k), self.graph.max_parallelism), *kg);
                    have.insert(k, v);
                    b = rest;
                }
            }
        }
        // Records in flight at an unaligned checkpoint are part of the cut: they were sent before the
        // senders' snapshots and are replayed into their receivers on restore.
        let in_flight = |stage: &str| -> Vec<Vec<u8>> {
            let uid = crate::task::channel_state_uid(stage);
            let mut batches = Vec::new();
            for p in index.elements.get(&uid).map(|v| v.as_slice()).unwrap_or(&[]) {
                let ElementState::Plain(b) = &p.state else { panic!("channel state is plain") };
                let cs: crate::task::ChannelState = postcard::from_bytes(b).expect("channel state decodes");
                batches.extend(cs.inputs.into_iter().flatten());
            }
            batches
        };
        for b in in_flight("join") {
            self.report.in_flight_batches += 1;
            let batch: Vec<Either<(u64, u64), (u64, u64)>> = postcard::from_bytes(&b).expect("join batch");
            for r in batch {
                match r {
                    Either::Left((k, _)) => have.entry(k).or_default().0 += 1,
                    Either::Right((k, _)) => have.entry(k).or_default().1 += 1,
                }
            }
        }
        for (stage, left) in [("rules-b", true), ("right-fwd", false)] {
            for b in in_flight(stage) {
                self.report.in_flight_batches += 1;
                let batch: Vec<(u64, u64)> = postcard::from_bytes(&b).expect("batch");
                for (k, _) in batch {
                    let e = have.entry(k).or_default();
                    if left {
                        e.0 += 1
                    } else {
                        e.1 += 1
                    }
                }
            }
        }
        self.report.in_flight_batches += in_flight("spread").len() as u64;
        let ok = match self.o.mode {
            CheckpointMode::ExactlyOnce => have == want,
            CheckpointMode::AtLeastOnce => {
                want.iter().all(|(k, (l, r))| have.get(k).is_some_and(|(hl, hr)| hl >= l && hr >= r))
            }
        };
        if !ok {
            return Err(format!("checkpoint {id} is not a consistent cut: state {have:?}, the offsets imply {want:?}"));
        }
        self.report.cuts_checked += 1;
        Ok(())
    }
}

enum Life {
    Finished,
    Crashed,
}

enum GenEnd {
    Finished,
    /// Stopped with a savepoint: the process ends and a new one resumes from it.
    Stopped,
    FailOver,
    ProcessCrash,
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

#[allow(clippy::too_many_arguments)]
fn run_generation_sim(
    sim: &mut Sim,
    coord: &mut Coordinator<AckReport>,
    tasks: &mut [Option<Task>],
    metas: &[TaskMeta],
    generation: Generation,
    lease_end: &mut CheckpointId,
    cfg: &RunConfig,
) -> Result<GenEnd, String> {
    let store = sim.store.clone();
    let mut controls: Vec<VecDeque<Control>> = tasks.iter().map(|_| VecDeque::new()).collect();
    let mut writes = std::mem::take(&mut sim.writes);
    let mut events: VecDeque<SimEvent> = VecDeque::new();
    let mut out = Vec::new();
    let mut stats = CheckpointLog::default();
    // Every task starts (sinks recover) before the first step; a failure there is a task failure.
    for slot in tasks.iter_mut() {
        let t = slot.as_mut().expect("freshly deployed");
        if let Err(e) = t.start() {
            events.push_back(SimEvent::Coord(Event::TaskFailed { generation, task: t.id, reason: e.to_string() }));
            *slot = None;
        }
    }
    // A stalled task is not scheduled until this time (a straggler or a stuck task).
    let mut stalled_until: Vec<TimeMs> = tasks.iter().map(|_| TimeMs(0)).collect();
    let mut switched = 0u64;
    loop {
        sim.report.switched_snapshots += std::mem::take(&mut switched);
        sim.report.steps += 1;
        if sim.report.steps > sim.o.max_steps {
            return Err(format!(
                "seed {}: no completion after {} steps (livelock or deadlock)",
                sim.seed, sim.o.max_steps
            ));
        }
        if sim.chance(sim.o.process_crash_ppm) {
            return Ok(GenEnd::ProcessCrash);
        }
        if sim.chance(sim.o.stall_ppm) {
            let ti = sim.rand(tasks.len() as u64) as usize;
            stalled_until[ti] = sim.now.plus_ms(sim.rand(800));
            sim.report.stalls += 1;
        }
        if sim.o.alignment == SimAlignment::Mixed && sim.chance(RETUNE_PPM) {
            // Settings change while the job runs; they apply from the next trigger.
            let c = sim.checkpoint_config();
            coord.set_config(c).map_err(|e| format!("seed {}: valid settings refused: {e}", sim.seed))?;
            sim.report.retunes += 1;
        }
        if sim.chance(sim.o.savepoint_ppm) {
            let stop = sim.rand(3) == 0;
            events.push_back(SimEvent::Coord(Event::SavepointRequested { stop }));
            sim.report.savepoints_requested += 1;
        }
        let now = sim.now;
        let live = |ti: usize| stalled_until[ti] <= now;
        // Pick one enabled action at random.
        let mut failed: Option<(TaskId, String)> = None;
        let choice = sim.rand(100);
        {
            let mut env = SimEnv {
                now: sim.now,
                generation,
                writes: &mut writes,
                events: &mut events,
                metas,
                switched: &mut switched,
            };
            if choice < 45 {
                // Deliver one data message on a random (task, readable input) that has one.
                let mut cands = Vec::new();
                for (ti, t) in tasks.iter().enumerate() {
                    let Some(t) = t else { continue };
                    if !live(ti) {
                        continue;
                    }
                    if t.is_source() {
                        if t.source_phase() == SourcePhase::Reading && t.has_credit() {
                            cands.push((ti, None));
                        }
                    } else {
                        for i in 0..t.inputs() {
                            if t.readable(i) && t.has_message(i) {
                                cands.push((ti, Some(i)));
                            }
                        }
                    }
                }
                if !cands.is_empty() {
                    let (ti, input) = cands[sim.rand(cands.len() as u64) as usize];
                    let t = tasks[ti].as_mut().expect("alive");
                    let r = match input {
                        None => t.step_source(&mut env).map(|s| debug_assert!(s != SourceStatus::Idle)),
                        Some(i) => t.step_input(i, &mut env).map(|_| ()),
                    };
                    if let Err(e) = r {
                        failed = Some((t.id, e.to_string()));
                    }
                }
            } else if choice < 60 {
                // Deliver one control message (per task in order).
                let cands: Vec<usize> =
                    (0..tasks.len()).filter(|i| tasks[*i].is_some() && !controls[*i].is_empty() && live(*i)).collect();
                if !cands.is_empty() {
                    let ti = cands[sim.rand(cands.len() as u64) as usize];
                    let c = controls[ti].pop_front().expect("non-empty");
                    let t = tasks[ti].as_mut().expect("alive");
                    if let Err(e) = t.on_control(c, &mut env) {
                        failed = Some((t.id, e.to_string()));
                    }
                }
            } else if choice < 72 {
                // Complete one pending snapshot write, in any order.
                if !env.writes.is_empty() {
                    let w = env.writes.swap_remove(sim.rand(env.writes.len() as u64) as usize);
                    if w.generation != generation {
                        sim.report.late_writes += 1;
                    }
                    let ev = write_snapshot(&*store, &cfg.faults, w, || 0);
                    env.events.push_back(SimEvent::Coord(ev));
                }
            } else if choice < 80 {
                // Flush a random task's partial batches.
                let ti = sim.rand(tasks.len() as u64) as usize;
                if let Some(t) = tasks[ti].as_mut().filter(|_| live(ti)) {
                    if let Err(e) = t.flush() {
                        failed = Some((t.id, e.to_string()));
                    }
                }
            } else if choice < 81 && sim.chance(sim.o.task_crash_ppm * 100) {
                let ti = sim.rand(tasks.len() as u64) as usize;
                if let Some(t) = tasks[ti].as_ref() {
                    failed = Some((t.id, "crashed by the simulation".into()));
                }
            } else {
                // Time passes: coordinator timers, and alignment timeouts at the tasks.
                sim.now = sim.now.plus_ms(sim.rand(3));
                env.now = sim.now;
                env.events.push_back(SimEvent::Coord(Event::Tick));
                for (ti, slot) in tasks.iter_mut().enumerate() {
                    if let Some(t) = slot.as_mut().filter(|_| stalled_until[ti] <= sim.now) {
                        if let Err(e) = t.check_alignment(&mut env) {
                            failed = Some((t.id, e.to_string()));
                            break;
                        }
                    }
                }
            }
        }
        if let Some((task, reason)) = failed {
            tasks[task.0 as usize] = None; // the task is gone
            events.push_back(SimEvent::Coord(Event::TaskFailed { generation, task, reason }));
        }
        // Quiescent? Flush everything so that partial batches cannot stall the job.
        // Feed events to the coordinator and carry out its decisions.
        while let Some(SimEvent::Coord(e)) = events.pop_front() {
            coord.handle(sim.now, e, &mut out);
            if out.is_empty() {
                continue;
            }
            let mut plane = SimPlane { sim: &mut *sim, tasks: &*tasks, controls: &mut controls };
            let mut ctx = DriverCtx {
                store: &*store,
                fingerprint: FINGERPRINT,
                generation,
                retain: cfg.retain,
                lease_end: &mut *lease_end,
                stats: &mut stats,
                unix_ms: plane.now().0,
                savepoints: Vec::new(),
            };
            match carry_out(coord, std::mem::take(&mut out), &mut ctx, &mut plane).map_err(|e| e.to_string())? {
                Carried::Continue => {}
                Carried::FailOver(_) => {
                    sim.writes = writes;
                    return Ok(GenEnd::FailOver);
                }
                Carried::Finished(_) => return Ok(GenEnd::Finished),
                Carried::Stopped(_) => {
                    sim.report.stopped_with_savepoint += 1;
                    return Ok(GenEnd::Stopped);
                }
            }
        }
    }
}

/// No tasks to reach (aborts carried out between generations).
struct NoPlane;

impl ControlPlane for NoPlane {
    fn send_all(&mut self, _c: Control, _sources_only: bool) {}
    fn now(&self) -> TimeMs {
        TimeMs(0)
    }
}

/// The simulation's control plane: a FIFO queue of control messages per task, delivered by the
/// scheduler; every epoch triggered is checked to be new, every committed checkpoint to be a cut.
struct SimPlane<'a> {
    sim: &'a mut Sim,
    tasks: &'a [Option<Task>],
    controls: &'a mut [VecDeque<Control>],
}

impl ControlPlane for SimPlane<'_> {
    fn send_all(&mut self, c: Control, sources_only: bool) {
        if let Control::Trigger(b) = &c {
            if let Some(l) = self.sim.last_triggered {
                assert!(b.checkpoint > l, "epoch {} triggered after {l}: reused or reordered", b.checkpoint);
            }
            self.sim.last_triggered = Some(b.checkpoint);
        }
        if let Control::Complete(_) = &c {
            self.sim.report.checkpoints_completed += 1;
        }
        for (i, t) in self.tasks.iter().enumerate() {
            if t.as_ref().is_some_and(|t| !sources_only || t.is_source()) {
                self.controls[i].push_back(c.clone());
            }
        }
    }
    fn now(&self) -> TimeMs {
        self.sim.now
    }
    fn committed(&mut self, checkpoint: CheckpointId) -> Result<(), RunError> {
        self.sim.check_cut(checkpoint).map_err(|reason| RunError::Restore { checkpoint, reason })
    }
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
