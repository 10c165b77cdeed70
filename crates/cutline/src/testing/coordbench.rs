//! How long the checkpoint coordinator works per checkpoint for many simulated tasks, with and without
//! per-worker aggregation of acknowledgements ([`coordinator_bench`]; `cutline bench-coordinator`).
//!
//! It owns the set-up of a real [`Coordinator`] over a [`MemStore`], the simulated acks and the timing.
//! It does not run tasks, threads or a network: the task state files are written to the store and the
//! ack messages are built and postcard-encoded (through the workers' `AckAggregator`) outside the
//! timed section, as they would be by workers. The timed section is what the coordinator process does
//! per checkpoint once the messages arrived: decode every message, turn it into coordinator events and
//! pass them to the coordinator loop (one channel send per message, as the cluster runtime does),
//! handle each, and carry out the decisions (manifest commit, completion notice, retention).

use crate::cluster::acks::{AckAggregator, TaskEvent, DEFAULT_MAX_ACK_HOLD_MS};
use crate::runtime::driver::{carry_out, Carried, CheckpointLog, ControlPlane, DriverCtx};
use crate::runtime::task::Control;
use crate::runtime::{AckReport, SnapshotTimings, DEFAULT_RETAINED_CHECKPOINTS};
use cutline_core::coordinator::{CheckpointConfig, Coordinator, Event};
use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex, TaskId, TimeMs};
use cutline_storage::{CheckpointStore, MemStore};
use std::fmt;
use std::time::Instant;

/// Checkpoints run before measuring (allocator, caches, the first lease).
pub const WARMUP_CHECKPOINTS: u32 = 20;
/// Stages the simulated job has; the tasks of the first are its sources, the others are keyed.
const STAGES: u32 = 3;
const INTERVAL_MS: u64 = 1_000;

/// What to measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordBench {
    /// Tasks of the simulated job (at least 1).
    pub tasks: u32,
    /// Workers the tasks are spread over (round robin), each sending one ack message per checkpoint;
    /// 0: no aggregation, one message per task.
    pub workers: u32,
    /// Measured checkpoints (after [`WARMUP_CHECKPOINTS`] unmeasured ones).
    pub checkpoints: u32,
}

impl Default for CoordBench {
    fn default() -> Self {
        CoordBench { tasks: 10_000, workers: 0, checkpoints: 200 }
    }
}

/// Median, 99th percentile and maximum of some samples, in microseconds (nearest-rank percentiles;
/// all 0 without samples).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    /// The median, in microseconds.
    pub median_us: f64,
    /// The 99th percentile, in microseconds.
    pub p99_us: f64,
    /// The largest sample, in microseconds.
    pub max_us: f64,
}

impl Percentiles {
    fn of(samples_ns: &[u64]) -> Percentiles {
        if samples_ns.is_empty() {
            return Percentiles::default();
        }
        let mut s = samples_ns.to_vec();
        s.sort_unstable();
        let at = |q: f64| s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1] as f64 / 1_000.0;
        Percentiles { median_us: at(0.5), p99_us: at(0.99), max_us: s[s.len() - 1] as f64 / 1_000.0 }
    }
}

/// What [`coordinator_bench`] measured.
#[derive(Clone, Debug)]
pub struct CoordBenchResult {
    /// What was measured.
    pub config: CoordBench,
    /// Ack messages the coordinator decoded per checkpoint.
    pub messages_per_checkpoint: u32,
    /// Their encoded size, summed.
    pub wire_bytes_per_checkpoint: u64,
    /// Control messages sent to tasks per checkpoint (trigger, completion).
    pub control_sends_per_checkpoint: u32,
    /// Coordinator time per checkpoint (the timed section, whole).
    pub total: Percentiles,
    /// The first of its three parts: postcard decoding, `into_events` and the channel send per
    /// message.
    pub decode: Percentiles,
    /// Taking the messages off the channel and [`Coordinator::handle`] of every ack.
    pub handle: Percentiles,
    /// Carrying out the decisions: manifest commit into the store, completion, retention.
    pub carry_out: Percentiles,
    /// Per measured checkpoint, the whole timed section in nanoseconds.
    pub samples_ns: Vec<u64>,
    /// The last checkpoint (complete).
    pub last_checkpoint: CheckpointId,
    /// Checkpoints completed, warm-up included.
    pub completed: u64,
}

impl CoordBenchResult {
    /// The header of the table [`CoordBenchResult`]'s `Display` writes rows of.
    pub fn header() -> String {
        format!(
            "{:>7} {:>7} {:>9} {:>12} | {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10}",
            "tasks",
            "workers",
            "msgs/chk",
            "wire KiB/chk",
            "median us",
            "p99 us",
            "max us",
            "decode",
            "handle",
            "carry_out"
        )
    }
}

/// One table row: configuration, messages, whole time per checkpoint, then the median of each part.
impl fmt::Display for CoordBenchResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let workers = if self.config.workers == 0 { "0 (none)".to_string() } else { self.config.workers.to_string() };
        write!(
            f,
            "{:>7} {:>7} {:>9} {:>12.1} | {:>10.1} {:>10.1} {:>10.1} | {:>10.1} {:>10.1} {:>10.1}",
            self.config.tasks,
            workers,
            self.messages_per_checkpoint,
            self.wire_bytes_per_checkpoint as f64 / 1024.0,
            self.total.median_us,
            self.total.p99_us,
            self.total.max_us,
            self.decode.median_us,
            self.handle.median_us,
            self.carry_out.median_us,
        )
    }
}

/// Measure the coordinator's work per checkpoint for `cfg.tasks` simulated tasks; see the module docs.
/// Panics if a checkpoint does not complete (the measurement would be of nothing).
pub fn coordinator_bench(cfg: &CoordBench) -> CoordBenchResult {
    run(cfg, &MemStore::new())
}

/// Where a simulated task's state is filed.
struct SimTask {
    id: TaskId,
    name: String,
    operator: OperatorId,
    subtask: SubtaskIndex,
    parallelism: u32,
    key_groups: Option<KeyGroupRange>,
}

/// `tasks` tasks in [`STAGES`] stages of (nearly) equal parallelism, ids dense in stage order.
fn sim_tasks(tasks: u32) -> Vec<SimTask> {
    let stage_of = |i: u32| (i as u64 * STAGES as u64 / tasks as u64) as u32;
    let mut out = Vec::with_capacity(tasks as usize);
    let mut start = 0;
    for s in 0..STAGES {
        let members: Vec<u32> = (start..tasks).take_while(|i| stage_of(*i) == s).collect();
        start += members.len() as u32;
        let parallelism = members.len() as u32;
        let max_parallelism = parallelism.max(128).next_power_of_two();
        for (subtask, i) in members.into_iter().enumerate() {
            let subtask = subtask as u32;
            out.push(SimTask {
                id: TaskId(i),
                name: format!("stage-{s} ({}/{parallelism})", subtask + 1),
                operator: OperatorId::new(format!("stage-{s}")),
                subtask: SubtaskIndex(subtask),
                parallelism,
                key_groups: (s > 0).then(|| KeyGroupRange::for_subtask(max_parallelism, parallelism, subtask)),
            });
        }
    }
    assert_eq!(out.len(), tasks as usize);
    out
}

/// Counts control messages; remembers the last trigger and completion.
struct CountingPlane {
    now: TimeMs,
    sends: u64,
    triggered: Option<CheckpointId>,
    completed: Option<CheckpointId>,
}

impl ControlPlane for CountingPlane {
    fn send_all(&mut self, c: Control, _sources_only: bool) {
        self.sends += 1;
        match c {
            Control::Trigger(b) => self.triggered = Some(b.checkpoint),
            Control::Complete(id) => self.completed = Some(id),
            Control::Abort(id) => panic!("coordinator bench: checkpoint {id} aborted"),
            Control::Cancel => {}
        }
    }
    fn now(&self) -> TimeMs {
        self.now
    }
}

fn run(cfg: &CoordBench, store: &MemStore) -> CoordBenchResult {
    assert!(cfg.tasks >= 1, "the coordinator bench needs at least one task");
    assert!(cfg.workers <= cfg.tasks, "{} workers for {} tasks: some would run nothing", cfg.workers, cfg.tasks);
    let generation = Generation(1);
    let fingerprint = "coordbench";
    let tasks = sim_tasks(cfg.tasks);
    let sources: Vec<TaskId> = tasks.iter().filter(|t| t.operator.as_str() == "stage-0").map(|t| t.id).collect();
    let config = CheckpointConfig { interval_ms: Some(INTERVAL_MS), ..CheckpointConfig::default() };
    // The lease is empty: the first trigger extends it, as in a fresh run.
    let (first, mut lease_end) = (CheckpointId(1), CheckpointId(1));
    let mut coord: Coordinator<AckReport> =
        Coordinator::new(config, generation, tasks.iter().map(|t| t.id), sources, first, lease_end, None, TimeMs(0));
    let mut stats = CheckpointLog::default();
    stats.task_names = tasks.iter().map(|t| t.name.clone()).collect();
    let mut ctx = DriverCtx {
        store,
        fingerprint,
        generation,
        retain: DEFAULT_RETAINED_CHECKPOINTS,
        lease_end: &mut lease_end,
        stats: &mut stats,
        unix_ms: 1_700_000_000_000,
        savepoints: Vec::new(),
    };
    let mut plane = CountingPlane { now: TimeMs(0), sends: 0, triggered: None, completed: None };

    let total = WARMUP_CHECKPOINTS + cfg.checkpoints;
    let (mut decode, mut handle, mut carry, mut whole) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut messages, mut wire_bytes, mut sends) = (0usize, 0u64, 0u64);
    let mut out = Vec::new();
    let (loop_tx, loop_rx) = crossbeam_channel::unbounded::<Vec<Event<AckReport>>>();
    for round in 0..total {
        // Time passes; a checkpoint triggers.
        plane.now = plane.now.plus_ms(INTERVAL_MS);
        let sends_before = plane.sends;
        coord.handle(plane.now, Event::Tick, &mut out).expect("a tick");
        let carried = carry_out(&mut coord, std::mem::take(&mut out), &mut ctx, &mut plane).expect("trigger");
        assert!(matches!(carried, Carried::Continue));
        let id = plane.triggered.take().expect("a tick one interval after the last checkpoint triggers");
        assert_eq!(coord.pending(), [id], "exactly the new checkpoint is in flight");

        // The workers' side: every task's state is written, acked, aggregated and encoded.
        let wire = worker_messages(&tasks, cfg.workers, store, generation, id, round);
        let bytes: u64 = wire.iter().map(|m| m.len() as u64).sum();

        // The coordinator's side, timed.
        // As in the cluster runtime: a connection reader decodes each message and passes its events
        // to the coordinator loop in one channel send; the loop takes each and handles its events.
        let t0 = Instant::now();
        for m in &wire {
            let m: TaskEvent = postcard::from_bytes(m).expect("decode an ack message");
            let mut events = Vec::new();
            m.into_events(&mut events);
            loop_tx.send(events).expect("the loop's channel is open");
        }
        let t1 = Instant::now();
        while let Ok(events) = loop_rx.try_recv() {
            for e in events {
                coord.handle(plane.now, e, &mut out).expect("the protocol allows every ack");
            }
        }
        let t2 = Instant::now();
        let carried = carry_out(&mut coord, std::mem::take(&mut out), &mut ctx, &mut plane).expect("carry out");
        let t3 = Instant::now();

        assert!(matches!(carried, Carried::Continue));
        assert_eq!(plane.completed, Some(id), "checkpoint {id} did not complete");
        assert_eq!(coord.last_completed(), Some(id));
        assert!(coord.pending().is_empty());
        if round >= WARMUP_CHECKPOINTS {
            let ns = |a: Instant, b: Instant| b.duration_since(a).as_nanos() as u64;
            decode.push(ns(t0, t1));
            handle.push(ns(t1, t2));
            carry.push(ns(t2, t3));
            whole.push(ns(t0, t3));
            messages += wire.len();
            wire_bytes += bytes;
            sends += plane.sends - sends_before;
        }
    }
    let measured = cfg.checkpoints.max(1) as u64;
    CoordBenchResult {
        config: cfg.clone(),
        messages_per_checkpoint: (messages as u64 / measured) as u32,
        wire_bytes_per_checkpoint: wire_bytes / measured,
        control_sends_per_checkpoint: (sends / measured) as u32,
        total: Percentiles::of(&whole),
        decode: Percentiles::of(&decode),
        handle: Percentiles::of(&handle),
        carry_out: Percentiles::of(&carry),
        samples_ns: whole,
        last_checkpoint: coord.last_completed().expect("checkpoints completed"),
        completed: coord.completed_count(),
    }
}

/// The encoded ack messages of checkpoint `id`, as the workers would send them: one per task without
/// aggregation (`workers` 0), else one per worker from its [`AckAggregator`], tasks assigned round
/// robin. Writes every task's state to `store` first (the manifest commit checks that the files exist).
///
/// The aggregators live only for this call: a real worker keeps one per generation, but in its own
/// process. Kept here, their memory (up to `acks::MAX_TRACKED_CHECKPOINTS` groups of
/// every task) shares the coordinator's heap and caches and made the aggregated runs look ~40% slower
/// in the timed section, which measures the coordinator alone.
fn worker_messages(
    tasks: &[SimTask],
    workers: u32,
    store: &MemStore,
    generation: Generation,
    id: CheckpointId,
    round: u32,
) -> Vec<Vec<u8>> {
    let mut acks = Vec::with_capacity(tasks.len());
    for t in tasks {
        // A small keyed state of a size that varies by task and checkpoint.
        let len = 200 + ((t.id.0 as usize * 31 + round as usize * 7) % 300);
        let payload: Vec<u8> = (0..len).map(|i| (i as u32 ^ t.id.0 ^ round) as u8).collect();
        let handle = store
            .write_task_state(id, &t.operator, t.subtask, t.parallelism, t.key_groups, &payload)
            .expect("write task state");
        let n = t.id.0 as u64;
        let report = AckReport {
            handle,
            timings: SnapshotTimings {
                alignment_ms: n % 5,
                start_delay_ms: n % 3,
                unaligned: false,
                switched: false,
                channel_state_bytes: 0,
                sync_us: 5 + n % 20,
                page_copies: 0,
                saved_entries: 0,
                snapshot_at_us: 1000 * (n % 5),
                input_barriers_us: vec![Some(1000 * (n % 3)), Some(1000 * (n % 5))],
                blocked_records: n % 100,
                handoff_at_us: 1000 * (n % 5) + 10,
            },
            persist_ms: 2 + n % 7,
            persist_us: 1000 * (2 + n % 7),
            encode_us: 30 + n % 50,
            write_us: 150 + n % 400,
            received_at_us: 0,
        };
        acks.push(Event::Acked { generation, checkpoint: id, task: t.id, report });
    }
    let encode = |m: &TaskEvent| postcard::to_allocvec(m).expect("encode an ack message");
    if workers == 0 {
        return acks
            .into_iter()
            .map(|e| match e {
                Event::Acked { generation, checkpoint, task, report } => {
                    encode(&TaskEvent::Acked { generation, checkpoint, acks: vec![(task, report)] })
                }
                _ => unreachable!("only acks were built"),
            })
            .collect();
    }
    let n = workers;
    let mut workers: Vec<AckAggregator> = (0..n)
        .map(|w| {
            let mine = tasks.iter().map(|t| t.id).filter(|t| t.0 % n == w).collect();
            AckAggregator::new(generation, mine, DEFAULT_MAX_ACK_HOLD_MS)
        })
        .collect();
    let mut per_worker: Vec<Vec<TaskEvent>> = workers.iter().map(|_| Vec::new()).collect();
    for e in acks {
        let Event::Acked { task, .. } = &e else { unreachable!("only acks were built") };
        let w = (task.0 % n) as usize;
        workers[w].on_event(0, e, &mut per_worker[w]);
    }
    let mut wire = Vec::with_capacity(workers.len());
    for (w, msgs) in per_worker.iter().enumerate() {
        let expected = tasks.iter().filter(|t| t.id.0 % n == w as u32).count();
        match msgs.as_slice() {
            [m @ TaskEvent::Acked { checkpoint, acks, .. }] if *checkpoint == id && acks.len() == expected => {
                wire.push(encode(m))
            }
            other => panic!("worker {w} sent {} message(s) for {id} instead of one with {expected} acks", other.len()),
        }
    }
    wire
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(workers: u32) -> (CoordBenchResult, MemStore) {
        let store = MemStore::new();
        let r = run(&CoordBench { tasks: 100, workers, checkpoints: 5 }, &store);
        (r, store)
    }

    #[test]
    fn every_checkpoint_completes_with_one_message_per_worker() {
        let (r, store) = small(4);
        let last = CheckpointId((WARMUP_CHECKPOINTS + 5) as u64);
        assert_eq!(r.last_checkpoint, last);
        assert_eq!(r.completed, (WARMUP_CHECKPOINTS + 5) as u64);
        assert_eq!(store.latest_complete().unwrap(), Some(last));
        let manifest = store.read_manifest(last).unwrap();
        assert_eq!(manifest.tasks.len(), 100);
        assert_eq!(r.messages_per_checkpoint, 4);
        assert_eq!(r.control_sends_per_checkpoint, 2, "one trigger, one completion");
        assert_eq!(r.samples_ns.len(), 5);
        assert!(r.samples_ns.iter().all(|s| *s > 0));
        assert!(r.total.median_us > 0.0 && r.total.median_us <= r.total.p99_us && r.total.p99_us <= r.total.max_us);
        // Retention kept the last few.
        let complete = store.list_checkpoints().unwrap().into_iter().filter(|l| l.complete).count();
        assert_eq!(complete, DEFAULT_RETAINED_CHECKPOINTS);
    }

    #[test]
    fn without_aggregation_every_task_sends_its_own_message() {
        let (r, store) = small(0);
        assert_eq!(r.messages_per_checkpoint, 100);
        assert_eq!(store.latest_complete().unwrap(), Some(r.last_checkpoint));
        let (aggregated, _) = small(4);
        assert!(
            aggregated.wire_bytes_per_checkpoint < r.wire_bytes_per_checkpoint,
            "aggregated messages repeat the generation and checkpoint once per worker, not per task"
        );
        let row = r.to_string();
        assert!(row.contains("0 (none)") && row.contains("100"), "{row}");
    }

    #[test]
    fn stages_split_the_tasks_and_sources_are_the_first() {
        for n in [1, 2, 3, 10, 100] {
            let t = sim_tasks(n);
            assert!(t.iter().enumerate().all(|(i, t)| t.id.0 as usize == i));
            assert!(t.first().is_some_and(|t| t.operator.as_str() == "stage-0" && t.key_groups.is_none()));
        }
        let t = sim_tasks(10);
        let per_stage: Vec<usize> =
            (0..3).map(|s| t.iter().filter(|t| t.operator.as_str() == format!("stage-{s}")).count()).collect();
        assert_eq!(per_stage, [4, 3, 3]);
    }

    /// The figures: `cargo test --release -p cutline --lib coordbench::tests::report -- --ignored --nocapture`
    /// (`COORDBENCH_TASKS`, `COORDBENCH_CHECKPOINTS`, `COORDBENCH_WORKERS=0,10,100` to change them).
    #[test]
    #[ignore]
    fn report() {
        let var = |k: &str, d: u32| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
        let tasks = var("COORDBENCH_TASKS", 10_000);
        let checkpoints = var("COORDBENCH_CHECKPOINTS", 200);
        let workers: Vec<u32> = std::env::var("COORDBENCH_WORKERS")
            .map(|v| v.split(',').map(|w| w.trim().parse().expect("COORDBENCH_WORKERS: numbers")).collect())
            .unwrap_or_else(|_| vec![0, 10, 100]);
        println!("{}", CoordBenchResult::header());
        for workers in workers {
            println!("{}", coordinator_bench(&CoordBench { tasks, workers, checkpoints }));
        }
    }
}
