//! Exhaustive model check of checkpointing on the smallest job with alignment in it: two sources, a
//! two-input operator and a two-phase sink, two epochs per generation (one periodic checkpoint, which
//! may overlap the final one taken at end of input) and at most one crash, every interleaving explored
//! and the same invariants checked in each mode: aligned, unaligned and aligned-with-timeout
//! exactly-once, and at-least-once (also with a user savepoint, which is exactly-once, in flight).
//!
//! What is real and what is modelled:
//! - the operator and the sink align with the real [`Aligner`]; the real [`Coordinator`] triggers,
//!   collects acks, asks for manifests, notifies, fails over and restarts; the restore point is chosen
//!   by the real [`choose_restore`];
//! - the rest is modelled here, a few lines each: a source emits `RECORDS_PER_SOURCE` distinct records
//!   and, when asked, a barrier with its offset as its snapshot; a channel is a FIFO of records,
//!   barriers and end-of-stream; the operator's state is the multiset of records it processed, and it
//!   forwards every record to the sink; the sink prepares the records since its last barrier as that
//!   barrier's transaction and commits prepared transactions when told a checkpoint completed; each
//!   task writes its snapshots in order (a FIFO writer); storage keeps the newest complete checkpoint.
//!
//! The nondeterministic choices are the [`Step`]s: which source emits what, which operator input is
//! read, whether a barrier overtakes the records queued before it (wherever `Aligner::may_overtake`
//! allows; the records stay queued and are that input's channel state), when the operator switches an
//! alignment to unaligned (at any moment `Aligner::timeout_candidate` offers one: that covers every
//! timeout and byte limit), when a snapshot is written and acked, when the coordinator triggers,
//! when time passes the alignment timeouts, when a manifest is durable and when the coordinator hears
//! of it, when the sink is notified, and when the crash comes. A crash loses everything in flight; the
//! restart restores the latest complete checkpoint: sources rewind to their offsets, the operator gets
//! its state back and its channel state queued ahead of any new record of that input, and the sink
//! commits the restored checkpoint's prepared transactions again (idempotently) and loses newer ones.
//!
//! The search is a depth-first walk of the state graph with a visited set of state fingerprints. The
//! aligners and the coordinator are not `Clone`: a copy replays the calls made on it, and calls are
//! memoized by (machine state, call); their `Debug` output, less what only feeds statistics, is part
//! of the fingerprint. The number of complete executions is counted over the graph: that is the number
//! of interleavings covered. Three reductions keep the graph small, each pruning only orders that
//! cannot differ in any reachable state: the sink reads records and barriers as soon as they arrive (a
//! sink read touches only the sink's memory, in channel order); a transaction is a multiset (every
//! invariant compares multisets); and once no crash can come, a durable manifest is reported and a
//! notification delivered in the same step (only a crash could observe the gap).
//!
//! Invariants, checked after every step:
//! - every completed checkpoint is a consistent cut. Exactly-once: for each source, the operator's
//!   state holds a prefix of that input (since the restore the generation started from: the restored
//!   channel state, then the records from the restored offset on) up to the snapshotted offset, and its
//!   channel state exactly the rest, in order. At-least-once: the state holds at least every record
//!   before the offset, and there is no channel state. Both: the sink's prepared and committed
//!   transactions hold exactly what the operator had processed at its snapshot;
//! - a transaction is never committed with two different contents, and a restore never falls back
//!   behind a transaction already committed;
//! - barriers never reorder on a channel and snapshots stay in order (the aligner asserts these), and
//!   the aligner's and coordinator's other assertions hold: a panic anywhere is a violation;
//! - a run that has not finished can always go on without a crash (no deadlock);
//! - at the end of every path, the committed output and the operator's state equal the failure-free
//!   run's exactly (exactly-once) or contain the same records (at-least-once), nothing prepared is
//!   left uncommitted and nothing is left in flight.
//!
//! The mutation tests at the bottom break the task side on purpose and require the checker to catch
//! each, so these tests provably can fail. A violation prints its path as numbered steps and as a
//! `Step` list for [`replay`].

use cutline_core::aligner::{AlignAction, Aligner};
use cutline_core::barrier::{Barrier, CheckpointMode, SnapshotKind};
use cutline_core::coordinator::{CheckpointConfig, Coordinator, Decision, Event, MIN_CONCURRENT_TRIGGER_GAP_MS};
use cutline_core::restart::{choose_restore, Candidate};
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------------
// Limits of the model
// ------------------------------------------------------------------------------------------------

/// Records each source emits; values are distinct across sources (`a1`, `a2`, `b1`, `b2`).
const RECORDS_PER_SOURCE: u8 = 2;
/// Periodic checkpoints the coordinator may trigger per generation. With the final checkpoint each
/// generation takes at end of input, that is two epochs per generation.
const MAX_PERIODIC_CHECKPOINTS: u32 = 1;
/// Checkpoints in flight at once: two, so that epochs overlap in the channels and at the aligner.
const MAX_CONCURRENT: usize = 2;
/// Crashes per run.
const MAX_CRASHES: u32 = 1;
/// An exploration that reaches more distinct states than this fails rather than run on (the largest,
/// aligned-with-timeout, has about 4.3 million: some 20 s on one core of a release build).
const MAX_STATES: usize = 20_000_000;

/// Checkpoint interval. A tick advances time by this much and only comes when the model lets the
/// coordinator trigger, so every tick triggers and no other event does. It is the concurrent trigger
/// gap, so that a tick with a checkpoint (or savepoint) in flight triggers too.
const INTERVAL_MS: u64 = MIN_CONCURRENT_TRIGGER_GAP_MS;
/// Alignment timeout of the aligned-with-timeout mode, counted from the trigger. Shorter than the
/// interval: time also moves (only in that mode) to the moment every triggered checkpoint is past its
/// timeout, which never reaches the next trigger.
const ALIGNMENT_TIMEOUT_MS: u64 = 5;
/// Long enough never to fire: the model has no checkpoint timeouts, declines or failed manifests.
const CHECKPOINT_TIMEOUT_MS: u64 = 1 << 40;
/// The durable epoch lease: never reached.
const LEASE_END: CheckpointId = CheckpointId(1 << 40);

const SOURCES: usize = 2;
/// Task ids: the sources are 0 and 1 (source `s` feeds operator input `s`), then the operator and the sink.
const SOURCE_TASKS: [TaskId; SOURCES] = [TaskId(0), TaskId(1)];
const OPERATOR: TaskId = TaskId(2);
const SINK: TaskId = TaskId(3);
const ALL_TASKS: [TaskId; 4] = [SOURCE_TASKS[0], SOURCE_TASKS[1], OPERATOR, SINK];
/// The sink's only input.
const SINK_INPUT: usize = 0;

// ------------------------------------------------------------------------------------------------
// Modes and mutations
// ------------------------------------------------------------------------------------------------

/// A deliberate bug on the task side, to show that the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutation {
    /// Records a barrier overtakes are not added to that input's channel state.
    OvertakenRecordsNotCaptured,
    /// Records read while `recording_on` lists checkpoints are not added to their channel state.
    RecordedRecordsNotCaptured,
    /// The operator reads records from an input the aligner blocked.
    BlockedInputRead,
    /// A restore does not replay the operator's channel state.
    ChannelStateNotReplayed,
    /// A restore does not commit the restored checkpoint's prepared transactions.
    SinkRecoveryCommitSkipped,
}

/// One configuration to explore.
struct Model {
    name: &'static str,
    config: CheckpointConfig,
    /// The user asks for one savepoint (always aligned and exactly-once) at any moment of a run.
    savepoint: bool,
    max_crashes: u32,
    mutation: Option<Mutation>,
    memo: RefCell<Memo>,
}

impl Model {
    fn new(name: &'static str, config: CheckpointConfig) -> Model {
        let config = CheckpointConfig {
            interval_ms: Some(INTERVAL_MS),
            timeout_ms: CHECKPOINT_TIMEOUT_MS,
            min_pause_ms: 0,
            max_concurrent: MAX_CONCURRENT,
            tolerable_failures: 0,
            ..config
        };
        Model { name, config, savepoint: false, max_crashes: MAX_CRASHES, mutation: None, memo: RefCell::default() }
    }
    fn aligned() -> Model {
        Model::new("aligned", CheckpointConfig::default())
    }
    fn unaligned() -> Model {
        Model::new("unaligned", CheckpointConfig { unaligned: true, ..Default::default() })
    }
    fn aligned_with_timeout() -> Model {
        let config = CheckpointConfig { alignment_timeout_ms: Some(ALIGNMENT_TIMEOUT_MS), ..Default::default() };
        Model::new("aligned-with-timeout", config)
    }
    fn at_least_once() -> Model {
        Model::new("at-least-once", CheckpointConfig { mode: CheckpointMode::AtLeastOnce, ..Default::default() })
    }
    /// At-least-once checkpoints and one savepoint, which is exactly-once: the aligner has both kinds
    /// pending at once. Without a crash, which would make the exploration some twenty times larger.
    fn at_least_once_with_a_savepoint() -> Model {
        let name = "at-least-once with a savepoint";
        Model { name, savepoint: true, max_crashes: 0, ..Model::at_least_once() }
    }
    fn with(mut self, mutation: Mutation) -> Model {
        self.mutation = Some(mutation);
        self
    }
    fn exactly_once(&self) -> bool {
        self.config.mode == CheckpointMode::ExactlyOnce
    }
    fn mutated(&self, m: Mutation) -> bool {
        self.mutation == Some(m)
    }
}

// ------------------------------------------------------------------------------------------------
// Records, messages, multisets
// ------------------------------------------------------------------------------------------------

/// A record: the `seq`-th (from 1) of source `source`. Printed `a1`, `b2`, ...
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Rec {
    source: u8,
    seq: u8,
}

impl fmt::Debug for Rec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", source_name(self.source as usize), self.seq)
    }
}

fn source_name(s: usize) -> &'static str {
    ["a", "b"][s]
}

/// The first `n` records of source `s`, in order.
fn records_of(s: usize, n: u8) -> Vec<Rec> {
    (1..=n).map(|seq| Rec { source: s as u8, seq }).collect()
}

/// Every record of the failure-free run, sorted.
fn all_records() -> Vec<Rec> {
    (0..SOURCES).flat_map(|s| records_of(s, RECORDS_PER_SOURCE)).collect()
}

/// Add to a multiset kept as a sorted `Vec`.
fn insert_sorted(set: &mut Vec<Rec>, r: Rec) {
    let at = set.partition_point(|x| *x <= r);
    set.insert(at, r);
}

fn sorted(mut v: Vec<Rec>) -> Vec<Rec> {
    v.sort();
    v
}

/// A barrier with the `Hash` the fingerprint needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct B(Barrier);

impl Hash for B {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let b = &self.0;
        (b.checkpoint, b.generation, b.triggered_at, b.kind, b.mode, b.alignment).hash(h);
    }
}

/// What travels on a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Msg {
    Data(Rec),
    Barrier(B),
    End,
}

/// The first barrier queued on a channel, and how many records are queued before it.
fn first_barrier(queue: &VecDeque<Msg>) -> Option<(usize, Barrier)> {
    for (k, m) in queue.iter().enumerate() {
        match m {
            Msg::Data(_) => {}
            Msg::Barrier(b) => return Some((k, b.0)),
            Msg::End => return None,
        }
    }
    None
}

fn data(queue: &VecDeque<Msg>, upto: usize) -> Vec<Rec> {
    queue
        .iter()
        .take(upto)
        .map(|m| match m {
            Msg::Data(r) => *r,
            other => panic!("model bug: {other:?} queued before the first barrier"),
        })
        .collect()
}

/// Collects what is hashed and hashes it in one go at the end (SipHash, as `DefaultHasher`): many small
/// writes cost less as one long one.
struct Fingerprinter(Vec<u8>);

impl Default for Fingerprinter {
    fn default() -> Self {
        Fingerprinter(Vec::with_capacity(FINGERPRINT_BUFFER))
    }
}

impl Hasher for Fingerprinter {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn finish(&self) -> u64 {
        let mut h = DefaultHasher::new();
        h.write(&self.0);
        h.finish()
    }
}

/// Bytes reserved for a state's fingerprint (most states are smaller).
const FINGERPRINT_BUFFER: usize = 2048;

/// For maps keyed by fingerprints, which are hashes already.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(5) ^ n;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FingerprintMap<K, V> = HashMap<K, V, BuildHasherDefault<Prehashed>>;
type FingerprintSet = HashSet<u64, BuildHasherDefault<Prehashed>>;

fn fingerprint_debug(x: &impl fmt::Debug) -> u64 {
    let mut h = DefaultHasher::new();
    format!("{x:?}").hash(&mut h);
    h.finish()
}

/// `debug` with the number of every `{field}TimeMs(n)` blanked out: for times kept only for statistics.
fn blank_times(debug: &str, field: &str) -> String {
    let pattern = format!("{field}TimeMs(");
    let mut out = String::with_capacity(debug.len());
    let mut rest = debug;
    while let Some(at) = rest.find(&pattern) {
        out.push_str(&rest[..at + pattern.len()]);
        rest = rest[at + pattern.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

// ------------------------------------------------------------------------------------------------
// Replicas: the real machines, made copyable by replaying the calls made on them
// ------------------------------------------------------------------------------------------------

/// Calls on the real machines, memoized by (fingerprint of the machine's state, call): a machine state
/// reached again on another path reuses the result instead of copying (replaying) the machine.
#[derive(Default)]
#[allow(clippy::type_complexity)] // (state, call) -> (machine after, its decisions): read once, here
struct Memo {
    aligners: FingerprintMap<(u64, u64), (Rc<AlignerReplica>, Vec<AlignAction>)>,
    coordinators: FingerprintMap<(u64, u64), (Rc<CoordinatorReplica>, Vec<Decision<()>>)>,
}

#[derive(Clone, Debug)]
enum AlignerCall {
    Barrier(usize, Barrier, TimeMs),
    End(usize, TimeMs),
    Switch(CheckpointId, TimeMs),
}

/// A real [`Aligner`] and the calls that built its state.
struct AlignerReplica {
    inputs: usize,
    aligner: Aligner,
    log: Vec<AlignerCall>,
    fp: u64,
}

impl AlignerReplica {
    fn new(inputs: usize) -> AlignerReplica {
        let aligner = Aligner::new(inputs);
        let fp = Self::fingerprint(&aligner);
        AlignerReplica { inputs, aligner, log: Vec::new(), fp }
    }
    fn run(aligner: &mut Aligner, call: &AlignerCall, out: &mut Vec<AlignAction>) {
        match *call {
            AlignerCall::Barrier(input, barrier, now) => aligner.on_barrier(input, barrier, now, out),
            AlignerCall::End(input, now) => aligner.on_end_of_input(input, now, out),
            AlignerCall::Switch(id, now) => aligner.switch_to_unaligned(id, now, out),
        }
    }
    fn call(&mut self, call: AlignerCall) -> Vec<AlignAction> {
        let mut out = Vec::new();
        Self::run(&mut self.aligner, &call, &mut out);
        self.log.push(call);
        self.fp = Self::fingerprint(&self.aligner);
        out
    }
    /// The aligner's state without the time each checkpoint's first barrier arrived, which only feeds
    /// the alignment statistics of a snapshot (the model ignores them).
    fn fingerprint(a: &Aligner) -> u64 {
        fingerprint_debug(&blank_times(&format!("{a:?}"), "first_at: "))
    }
}

impl AlignerReplica {
    /// Make `call` on the aligner in `rc` (shared, never changed in place): `rc` now points at the
    /// state after the call.
    fn step(rc: &mut Rc<AlignerReplica>, call: AlignerCall, memo: &RefCell<Memo>) -> Vec<AlignAction> {
        let key = (rc.fp, fingerprint_debug(&call));
        if let Some((next, out)) = memo.borrow().aligners.get(&key) {
            *rc = Rc::clone(next);
            return out.clone();
        }
        let mut next = AlignerReplica::clone(rc);
        let out = next.call(call);
        let next = Rc::new(next);
        memo.borrow_mut().aligners.insert(key, (Rc::clone(&next), out.clone()));
        *rc = next;
        out
    }
}

impl Clone for AlignerReplica {
    fn clone(&self) -> Self {
        let mut aligner = Aligner::new(self.inputs);
        let mut scratch = Vec::new();
        for call in &self.log {
            scratch.clear();
            Self::run(&mut aligner, call, &mut scratch);
        }
        AlignerReplica { inputs: self.inputs, aligner, log: self.log.clone(), fp: self.fp }
    }
}

#[derive(Clone, Debug)]
enum CoordinatorCall {
    Handle(TimeMs, Event<()>),
    Restart { generation: Generation, restored: Option<CheckpointId>, now: TimeMs },
}

/// A real [`Coordinator`] and the calls that built its state.
struct CoordinatorReplica {
    config: CheckpointConfig,
    coordinator: Coordinator<()>,
    log: Vec<CoordinatorCall>,
    fp: u64,
}

impl CoordinatorReplica {
    fn fresh(config: &CheckpointConfig) -> Coordinator<()> {
        Coordinator::new(
            config.clone(),
            Generation(1),
            ALL_TASKS,
            SOURCE_TASKS,
            CheckpointId(1),
            LEASE_END,
            None,
            TimeMs(0),
        )
    }
    fn new(config: &CheckpointConfig) -> CoordinatorReplica {
        let coordinator = Self::fresh(config);
        let fp = Self::fingerprint(&coordinator);
        CoordinatorReplica { config: config.clone(), coordinator, log: Vec::new(), fp }
    }
    fn run(c: &mut Coordinator<()>, call: &CoordinatorCall, out: &mut Vec<Decision<()>>) {
        match call {
            CoordinatorCall::Handle(now, event) => {
                c.handle(*now, event.clone(), out).expect("the exhaustive model sends only legal events")
            }
            CoordinatorCall::Restart { generation, restored, now } => {
                c.restart(*generation, ALL_TASKS, SOURCE_TASKS, *restored, *now, out)
            }
        }
    }
    fn call(&mut self, call: CoordinatorCall) -> Vec<Decision<()>> {
        let mut out = Vec::new();
        Self::run(&mut self.coordinator, &call, &mut out);
        self.log.push(call);
        self.fp = Self::fingerprint(&self.coordinator);
        out
    }
    /// The coordinator's state without its statistics (the history of finished checkpoints, the
    /// counts, and when each ack came), which never change a decision: states that differ only there
    /// behave the same.
    fn fingerprint(c: &Coordinator<()>) -> u64 {
        let history: Vec<_> = c.history().collect();
        let behaviour = blank_times(&format!("{c:?}"), "((), ")
            .replacen(&format!("history: {history:?}"), "", 1)
            .replacen(&format!("completed_count: {}", c.completed_count()), "", 1)
            .replacen(&format!("failed_count: {}", c.failed_count()), "", 1);
        assert!(
            !behaviour.contains("CheckpointStats"),
            "the coordinator's Debug output changed shape; update CoordinatorReplica::fingerprint: {behaviour}"
        );
        fingerprint_debug(&behaviour)
    }
    /// Make `call` on the coordinator in `rc`, as [`AlignerReplica::step`] does.
    fn step(rc: &mut Rc<CoordinatorReplica>, call: CoordinatorCall, memo: &RefCell<Memo>) -> Vec<Decision<()>> {
        let key = (rc.fp, fingerprint_debug(&call));
        if let Some((next, out)) = memo.borrow().coordinators.get(&key) {
            *rc = Rc::clone(next);
            return out.clone();
        }
        let mut next = CoordinatorReplica::clone(rc);
        let out = next.call(call);
        let next = Rc::new(next);
        memo.borrow_mut().coordinators.insert(key, (Rc::clone(&next), out.clone()));
        *rc = next;
        out
    }
}

impl Clone for CoordinatorReplica {
    fn clone(&self) -> Self {
        let mut coordinator = Self::fresh(&self.config);
        let mut scratch = Vec::new();
        for call in &self.log {
            scratch.clear();
            Self::run(&mut coordinator, call, &mut scratch);
        }
        CoordinatorReplica { config: self.config.clone(), coordinator, log: self.log.clone(), fp: self.fp }
    }
}

// ------------------------------------------------------------------------------------------------
// The world: every task, channel, and what is durable
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default, Hash)]
struct Source {
    /// Records emitted so far (the offset).
    next: u8,
    /// Barriers the coordinator asked for and this source has not injected yet, oldest first.
    triggers: VecDeque<B>,
    ended: bool,
    finished_reported: bool,
}

/// The operator's part of a checkpoint.
#[derive(Clone, Debug, Default, Hash)]
struct OpSnap {
    /// Taken for an exactly-once barrier: the cut must be exact.
    exact: bool,
    state: Vec<Rec>,
    /// Per input, in channel order: records that were in flight at the cut.
    channel: [Vec<Rec>; SOURCES],
    /// Channel state (if any) is complete; the snapshot can be written.
    complete: bool,
}

/// The sink's part of a checkpoint.
#[derive(Clone, Debug, Default, Hash)]
struct SinkSnap {
    /// Prepared, not yet committed transactions, including the one of this checkpoint.
    prepared: BTreeMap<CheckpointId, Vec<Rec>>,
    /// Every record the sink had put into a transaction (ghost state, for the cut check).
    ghost: Vec<Rec>,
}

#[derive(Clone)]
struct Operator {
    aligner: Rc<AlignerReplica>,
    /// The multiset of records processed.
    state: Vec<Rec>,
    /// Snapshots taken and not yet written, by checkpoint (the writer takes them oldest first).
    snapshots: BTreeMap<CheckpointId, OpSnap>,
}

impl Operator {
    fn new() -> Operator {
        Operator { aligner: Rc::new(AlignerReplica::new(SOURCES)), state: Vec::new(), snapshots: BTreeMap::new() }
    }
    fn hash<H: Hasher>(&self, h: &mut H) {
        (self.aligner.fp, &self.state, &self.snapshots).hash(h);
    }
}

#[derive(Clone)]
struct Sink {
    aligner: Rc<AlignerReplica>,
    /// Records since the last barrier: the open transaction. Transactions are kept as sorted multisets:
    /// every invariant compares multisets, so the order of records inside one transaction (which
    /// depends only on the order in which the operator read its two inputs) is not part of the state.
    open: Vec<Rec>,
    prepared: BTreeMap<CheckpointId, Vec<Rec>>,
    ghost: Vec<Rec>,
    snapshots: BTreeMap<CheckpointId, SinkSnap>,
    /// Completed checkpoints not yet delivered to the sink.
    notifications: VecDeque<CheckpointId>,
    final_committed: bool,
    ended: bool,
}

impl Sink {
    fn new() -> Sink {
        Sink {
            aligner: Rc::new(AlignerReplica::new(1)),
            open: Vec::new(),
            prepared: BTreeMap::new(),
            ghost: Vec::new(),
            snapshots: BTreeMap::new(),
            notifications: VecDeque::new(),
            final_committed: false,
            ended: false,
        }
    }
    fn hash<H: Hasher>(&self, h: &mut H) {
        let Sink { aligner, open, prepared, ghost, snapshots, notifications, final_committed, ended } = self;
        (aligner.fp, open, prepared, ghost, snapshots, notifications, final_committed, ended).hash(h);
    }
}

/// What survives a crash: written snapshots and manifests.
#[derive(Clone, Debug, Default, Hash)]
struct Storage {
    source_offsets: BTreeMap<(CheckpointId, usize), u8>,
    op: BTreeMap<CheckpointId, OpSnap>,
    sink: BTreeMap<CheckpointId, SinkSnap>,
    /// Checkpoints whose manifest is durable.
    complete: BTreeSet<CheckpointId>,
}

impl Storage {
    fn discard(&mut self, id: CheckpointId) {
        for s in 0..SOURCES {
            self.source_offsets.remove(&(id, s));
        }
        self.op.remove(&id);
        self.sink.remove(&id);
    }
}

/// What a generation was restored from (nothing, for the first).
#[derive(Clone, Debug, Default, Hash)]
struct Base {
    checkpoint: Option<CheckpointId>,
    offsets: [u8; SOURCES],
    state: Vec<Rec>,
    channel: [Vec<Rec>; SOURCES],
}

/// One nondeterministic step. `usize` arguments are source / operator-input indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// A source emits its next record.
    EmitRecord(usize),
    /// A source injects the barrier of its oldest trigger (and end-of-stream after a final barrier).
    EmitBarrier(usize),
    /// The operator reads the head of an input: a record, a barrier or end-of-stream.
    OpRead(usize),
    /// The operator takes the first barrier of an input ahead of the records queued before it.
    OpOvertake(usize),
    /// The operator switches the aligner's timeout candidate to unaligned (its alignment timed out, or
    /// its blocked inputs went over the byte limit).
    OpTimeout,
    /// The sink reads the head of its input.
    SinkRead,
    /// The operator's oldest complete snapshot is written; the operator acks.
    OpAck,
    SinkAck,
    /// Time passes; the coordinator triggers a periodic checkpoint.
    Tick,
    /// Time passes until every checkpoint triggered so far is past its alignment timeout.
    Wait,
    /// The user asks for a savepoint.
    Savepoint,
    /// A manifest the coordinator asked for is durable (the checkpoint is complete in storage).
    ManifestDurable(CheckpointId),
    /// The coordinator hears that the manifest is durable.
    ManifestReported(CheckpointId),
    /// The sink gets the oldest completion notice and commits.
    NotifySink,
    /// The operator crashes; the coordinator fails over.
    Crash,
    /// The job is redeployed from the latest complete checkpoint.
    Restart,
}

#[derive(Clone)]
struct World {
    time: u64,
    generation: Generation,
    /// Crashes still to come at most.
    crashes_left: u32,
    periodic_triggered: u32,
    savepoint_requested: bool,
    /// When this generation's latest checkpoint was triggered.
    last_trigger_at: Option<u64>,
    /// Between a crash and the restart: the tasks are gone.
    failing_over: bool,
    /// The coordinator decided the job finished.
    finished: bool,
    coordinator: Rc<CoordinatorReplica>,
    sources: [Source; SOURCES],
    /// Source `s` to operator input `s`.
    inputs: [VecDeque<Msg>; SOURCES],
    to_sink: VecDeque<Msg>,
    op: Operator,
    sink: Sink,
    storage: Rc<Storage>,
    /// The sink's committed output, by transaction (= checkpoint): outside the job, survives crashes.
    committed: BTreeMap<CheckpointId, Vec<Rec>>,
    manifests_to_write: BTreeSet<CheckpointId>,
    manifests_to_report: BTreeSet<CheckpointId>,
    /// What this generation was restored from.
    base: Base,
    /// This generation's final checkpoint, once triggered, and whether the coordinator announced it.
    final_checkpoint: Option<CheckpointId>,
    final_complete: bool,
    task_finished: [bool; ALL_TASKS.len()],
    /// The steps from the start (not part of the state).
    path: Vec<Step>,
}

type Outcome = Result<(), String>;

impl World {
    fn new(model: &Model) -> World {
        World {
            time: 0,
            generation: Generation(1),
            crashes_left: model.max_crashes,
            periodic_triggered: 0,
            savepoint_requested: false,
            last_trigger_at: None,
            failing_over: false,
            finished: false,
            coordinator: Rc::new(CoordinatorReplica::new(&model.config)),
            sources: Default::default(),
            inputs: Default::default(),
            to_sink: VecDeque::new(),
            op: Operator::new(),
            sink: Sink::new(),
            storage: Rc::new(Storage::default()),
            committed: BTreeMap::new(),
            manifests_to_write: BTreeSet::new(),
            manifests_to_report: BTreeSet::new(),
            base: Base::default(),
            final_checkpoint: None,
            final_complete: false,
            task_finished: [false; ALL_TASKS.len()],
            path: Vec::new(),
        }
    }

    fn now(&self) -> TimeMs {
        TimeMs(self.time)
    }

    fn fingerprint(&self) -> u64 {
        let mut h = Fingerprinter::default();
        (self.time, self.generation, self.crashes_left, self.periodic_triggered, self.last_trigger_at).hash(&mut h);
        self.savepoint_requested.hash(&mut h);
        (self.failing_over, self.finished).hash(&mut h);
        self.coordinator.fp.hash(&mut h);
        (&self.sources, &self.inputs, &self.to_sink).hash(&mut h);
        self.op.hash(&mut h);
        self.sink.hash(&mut h);
        (&*self.storage, &self.committed, &self.manifests_to_write, &self.manifests_to_report).hash(&mut h);
        (&self.base, self.final_checkpoint, self.final_complete, self.task_finished).hash(&mut h);
        h.finish()
    }

    // --- what may happen next ---

    fn enabled(&self, model: &Model) -> Vec<Step> {
        let mut steps = Vec::new();
        if self.finished {
            return steps;
        }
        if self.failing_over {
            steps.extend(self.manifests_to_write.iter().map(|&id| Step::ManifestDurable(id)));
            steps.extend(self.manifests_to_report.iter().map(|&id| Step::ManifestReported(id)));
            steps.push(Step::Restart);
            return steps;
        }
        // The sink reads its FIFO input at once. Sound: a sink read commutes with every other step
        // (it touches only the sink's memory, which a crash loses either way, and the records and
        // barriers it reads are in channel order whenever it reads them; its acks stay separate
        // steps), so every state the job can reach is still reached. End-of-stream is read in turn.
        if self.sink.aligner.aligner.is_readable(SINK_INPUT)
            && matches!(self.to_sink.front(), Some(Msg::Data(_) | Msg::Barrier(_)))
        {
            return vec![Step::SinkRead];
        }
        for (s, src) in self.sources.iter().enumerate() {
            if !src.ended && src.next < RECORDS_PER_SOURCE {
                steps.push(Step::EmitRecord(s));
            }
            if !src.ended && !src.triggers.is_empty() {
                steps.push(Step::EmitBarrier(s));
            }
        }
        let op = &self.op.aligner.aligner;
        for (i, queue) in self.inputs.iter().enumerate() {
            let Some(head) = queue.front() else { continue };
            let blocked_read =
                model.mutated(Mutation::BlockedInputRead) && op.is_blocked(i) && matches!(head, Msg::Data(_));
            if op.is_readable(i) || blocked_read {
                steps.push(Step::OpRead(i));
            }
            if let Some((k, b)) = first_barrier(queue) {
                if k > 0 && op.may_overtake(i, &b, self.now()) {
                    steps.push(Step::OpOvertake(i));
                }
            }
        }
        // The task switches an alignment when it is older than its timeout or its blocked inputs hold
        // more than the byte limit, which counts encoded bytes the model does not have: the switch is
        // offered at every moment the aligner has a candidate, which covers every limit.
        if op.timeout_candidate(self.now()).is_some() {
            steps.push(Step::OpTimeout);
        }
        // Time is observable only through the alignment timeouts of pending checkpoints.
        if model.config.alignment_timeout_ms.is_some()
            && self.last_trigger_at.is_some_and(|t| self.time < t + ALIGNMENT_TIMEOUT_MS)
            && !self.coordinator.coordinator.pending().is_empty()
        {
            steps.push(Step::Wait);
        }
        if self.sink.aligner.aligner.is_readable(SINK_INPUT) && !self.to_sink.is_empty() {
            steps.push(Step::SinkRead);
        }
        if self.op.snapshots.first_key_value().is_some_and(|(_, s)| s.complete) {
            steps.push(Step::OpAck);
        }
        if !self.sink.snapshots.is_empty() {
            steps.push(Step::SinkAck);
        }
        let all_sources_finished = self.sources.iter().all(|s| s.finished_reported);
        if model.savepoint && !self.savepoint_requested && !all_sources_finished {
            steps.push(Step::Savepoint);
        }
        if self.periodic_triggered < MAX_PERIODIC_CHECKPOINTS
            && !all_sources_finished
            && self.coordinator.coordinator.pending().len() < model.config.max_concurrent
        {
            steps.push(Step::Tick);
        }
        steps.extend(self.manifests_to_write.iter().map(|&id| Step::ManifestDurable(id)));
        steps.extend(self.manifests_to_report.iter().map(|&id| Step::ManifestReported(id)));
        if !self.sink.notifications.is_empty() {
            steps.push(Step::NotifySink);
        }
        if self.crashes_left > 0 {
            steps.push(Step::Crash);
        }
        steps
    }

    /// A copy of this world after `step`. A broken invariant or a panic (in a core or in the model)
    /// becomes a violation carrying the path.
    fn child(&self, model: &Model, step: Step) -> Result<World, Violation> {
        let mut next = self.clone();
        next.path.push(step);
        let outcome =
            catch_unwind(AssertUnwindSafe(|| next.apply(model, step).and_then(|()| next.finish_tasks(model))));
        let what = match outcome {
            Ok(Ok(())) => return Ok(next),
            Ok(Err(what)) => what,
            Err(panic) => format!("panic: {}", panic_message(&*panic)),
        };
        Err(Violation { model: model.name, mutation: model.mutation, path: next.path, what })
    }

    // --- the steps ---

    fn apply(&mut self, model: &Model, step: Step) -> Outcome {
        match step {
            Step::EmitRecord(s) => {
                let src = &mut self.sources[s];
                src.next += 1;
                self.inputs[s].push_back(Msg::Data(Rec { source: s as u8, seq: src.next }));
                if src.next == RECORDS_PER_SOURCE {
                    self.source_finished(model, s)?;
                }
            }
            Step::EmitBarrier(s) => {
                let src = &mut self.sources[s];
                let B(barrier) = src.triggers.pop_front().ok_or("model bug: no trigger to serve")?;
                let (id, offset) = (barrier.checkpoint, src.next);
                self.inputs[s].push_back(Msg::Barrier(B(barrier)));
                if barrier.kind.ends_input() {
                    if offset != RECORDS_PER_SOURCE {
                        return Err(format!("final barrier {id} at source {s} before its last record"));
                    }
                    src.ended = true;
                    self.inputs[s].push_back(Msg::End);
                }
                // A source's snapshot is its offset: written and acked with the barrier.
                self.write(id, |storage| {
                    storage.source_offsets.insert((id, s), offset);
                });
                self.ack(model, SOURCE_TASKS[s], id)?;
            }
            Step::OpRead(i) => match self.inputs[i].pop_front() {
                Some(Msg::Data(r)) => {
                    let mut recording = Vec::new();
                    self.op.aligner.aligner.recording_on(i, &mut recording);
                    if !model.mutated(Mutation::RecordedRecordsNotCaptured) {
                        for id in recording {
                            let snap = self.op.snapshots.get_mut(&id).ok_or_else(|| {
                                format!("input {i} records channel state for {id}, which the operator did not snapshot")
                            })?;
                            snap.channel[i].push(r);
                        }
                    }
                    insert_sorted(&mut self.op.state, r);
                    self.to_sink.push_back(Msg::Data(r));
                }
                Some(Msg::Barrier(B(b))) => {
                    let now = self.now();
                    let actions =
                        AlignerReplica::step(&mut self.op.aligner, AlignerCall::Barrier(i, b, now), &model.memo);
                    self.op_actions(actions, None)?;
                }
                Some(Msg::End) => {
                    let now = self.now();
                    let actions = AlignerReplica::step(&mut self.op.aligner, AlignerCall::End(i, now), &model.memo);
                    self.op_actions(actions, None)?;
                    if self.op.aligner.aligner.all_ended() {
                        self.to_sink.push_back(Msg::End);
                    }
                }
                None => return Err("model bug: read of an empty input".into()),
            },
            Step::OpOvertake(i) => {
                let (k, b) = first_barrier(&self.inputs[i]).ok_or("model bug: no barrier to overtake")?;
                let overtaken = data(&self.inputs[i], k);
                self.inputs[i].remove(k);
                let now = self.now();
                let actions = AlignerReplica::step(&mut self.op.aligner, AlignerCall::Barrier(i, b, now), &model.memo);
                let overtaken =
                    if model.mutated(Mutation::OvertakenRecordsNotCaptured) { Vec::new() } else { overtaken };
                self.op_actions(actions, Some((b.checkpoint, i, overtaken)))?;
            }
            Step::OpTimeout => {
                let now = self.now();
                let (id, ..) = self.op.aligner.aligner.timeout_candidate(now).ok_or("model bug: no candidate")?;
                let actions = AlignerReplica::step(&mut self.op.aligner, AlignerCall::Switch(id, now), &model.memo);
                self.op_actions(actions, None)?;
            }
            Step::SinkRead => match self.to_sink.pop_front() {
                Some(Msg::Data(r)) => {
                    let mut recording = Vec::new();
                    self.sink.aligner.aligner.recording_on(SINK_INPUT, &mut recording);
                    if !recording.is_empty() {
                        return Err(format!("the one-input sink records channel state for {recording:?}"));
                    }
                    insert_sorted(&mut self.sink.open, r);
                }
                Some(Msg::Barrier(B(b))) => {
                    let now = self.now();
                    let call = AlignerCall::Barrier(SINK_INPUT, b, now);
                    let actions = AlignerReplica::step(&mut self.sink.aligner, call, &model.memo);
                    self.sink_actions(actions)?;
                }
                Some(Msg::End) => {
                    let now = self.now();
                    let actions =
                        AlignerReplica::step(&mut self.sink.aligner, AlignerCall::End(SINK_INPUT, now), &model.memo);
                    self.sink_actions(actions)?;
                    self.sink.ended = true;
                }
                None => return Err("model bug: read of an empty sink input".into()),
            },
            Step::OpAck => {
                let (id, snap) = self.op.snapshots.pop_first().ok_or("model bug: no snapshot to write")?;
                self.write(id, |storage| {
                    storage.op.insert(id, snap);
                });
                self.ack(model, OPERATOR, id)?;
            }
            Step::SinkAck => {
                let (id, snap) = self.sink.snapshots.pop_first().ok_or("model bug: no snapshot to write")?;
                self.write(id, |storage| {
                    storage.sink.insert(id, snap);
                });
                self.ack(model, SINK, id)?;
            }
            Step::Tick => {
                self.time += INTERVAL_MS;
                let before = self.periodic_triggered;
                self.coordinate(model, Event::Tick)?;
                if self.periodic_triggered != before + 1 {
                    return Err(format!(
                        "the coordinator did not trigger at t={} with {} pending (max {}), \
                         interval {INTERVAL_MS} ms",
                        self.time,
                        self.coordinator.coordinator.pending().len(),
                        model.config.max_concurrent,
                    ));
                }
            }
            Step::Savepoint => {
                self.savepoint_requested = true;
                self.coordinate(model, Event::SavepointRequested { stop: false })?;
            }
            Step::Wait => {
                let t = self.last_trigger_at.ok_or("model bug: wait without a trigger")?;
                self.time = t + ALIGNMENT_TIMEOUT_MS;
            }
            Step::ManifestDurable(id) => {
                self.manifests_to_write.remove(&id);
                Rc::make_mut(&mut self.storage).complete.insert(id);
                self.check_cut(id)?;
                // Retention keeps the newest complete checkpoint: the only one a restore would choose.
                let storage = Rc::make_mut(&mut self.storage);
                while storage.complete.len() > 1 {
                    if let Some(old) = storage.complete.pop_first() {
                        storage.discard(old);
                    }
                }
                if self.crash_possible() {
                    self.manifests_to_report.insert(id);
                } else {
                    // With no crash to come, when the coordinator hears of it makes no difference.
                    self.coordinate(model, Event::ManifestCommitted { checkpoint: id })?;
                }
            }
            Step::ManifestReported(id) => {
                self.manifests_to_report.remove(&id);
                self.coordinate(model, Event::ManifestCommitted { checkpoint: id })?;
            }
            Step::NotifySink => {
                let n = self.sink.notifications.pop_front().ok_or("model bug: no notification")?;
                self.sink_commit(n)?;
            }
            Step::Crash => {
                self.crashes_left -= 1;
                self.failing_over = true;
                let failed = Event::TaskFailed {
                    generation: self.generation,
                    task: OPERATOR,
                    reason: "crash".into(),
                    permanent: false,
                };
                let now = self.now();
                let out =
                    CoordinatorReplica::step(&mut self.coordinator, CoordinatorCall::Handle(now, failed), &model.memo);
                if !out.iter().any(|d| matches!(d, Decision::FailOver { .. })) {
                    return Err(format!("a task failed and the coordinator did not fail over: {out:?}"));
                }
                self.decide(out)?;
                // Everything in flight is lost.
                for src in &mut self.sources {
                    *src = Source { next: 0, ..Source::default() };
                }
                self.inputs = Default::default();
                self.to_sink.clear();
                self.op = Operator::new();
                self.sink = Sink::new();
            }
            Step::Restart => self.restart(model)?,
        }
        Ok(())
    }

    /// Carry out what the operator's aligner decided. `overtaken`: the records a barrier of
    /// checkpoint `.0` on input `.1` just overtook, which belong to that checkpoint's channel state.
    fn op_actions(
        &mut self,
        actions: Vec<AlignAction>,
        mut overtaken: Option<(CheckpointId, usize, Vec<Rec>)>,
    ) -> Outcome {
        fn attach(snap: &mut OpSnap, id: CheckpointId, overtaken: &mut Option<(CheckpointId, usize, Vec<Rec>)>) {
            if overtaken.as_ref().is_some_and(|o| o.0 == id) {
                if let Some((_, input, recs)) = overtaken.take() {
                    snap.channel[input].extend(recs);
                }
            }
        }
        for action in actions {
            match action {
                AlignAction::Snapshot { barrier, channel_state, .. } => {
                    let id = barrier.checkpoint;
                    let exact = barrier.mode == CheckpointMode::ExactlyOnce;
                    let state = self.op.state.clone();
                    let mut snap = OpSnap { exact, state, channel: Default::default(), complete: false };
                    attach(&mut snap, id, &mut overtaken);
                    snap.complete = !channel_state;
                    if self.op.snapshots.insert(id, snap).is_some() {
                        return Err(format!("the operator snapshotted {id} twice"));
                    }
                    self.to_sink.push_back(Msg::Barrier(B(barrier)));
                }
                AlignAction::ChannelStateComplete { checkpoint } => {
                    let snap = self.op.snapshots.get_mut(&checkpoint).ok_or_else(|| {
                        format!("channel state of {checkpoint} complete, but the operator never snapshotted it")
                    })?;
                    attach(snap, checkpoint, &mut overtaken);
                    if snap.complete {
                        return Err(format!("channel state of {checkpoint} completed twice"));
                    }
                    snap.complete = true;
                }
            }
        }
        if let Some((id, input, recs)) = overtaken {
            match self.op.snapshots.get_mut(&id) {
                Some(snap) if !snap.complete => snap.channel[input].extend(recs),
                _ => {
                    return Err(format!("barrier {id} overtook {recs:?} on input {input} but records no channel state"))
                }
            }
        }
        Ok(())
    }

    /// Carry out what the sink's aligner decided: with one input, every barrier snapshots at once.
    fn sink_actions(&mut self, actions: Vec<AlignAction>) -> Outcome {
        for action in actions {
            match action {
                AlignAction::Snapshot { barrier, channel_state: true, .. } => {
                    return Err(format!(
                        "the one-input sink's snapshot of {} waits for channel state",
                        barrier.checkpoint
                    ));
                }
                AlignAction::Snapshot { barrier, channel_state: false, .. } => {
                    let id = barrier.checkpoint;
                    // Two-phase commit: the records since the last barrier become transaction `id`.
                    let txn = std::mem::take(&mut self.sink.open);
                    for r in &txn {
                        insert_sorted(&mut self.sink.ghost, *r);
                    }
                    if self.sink.prepared.insert(id, txn).is_some() {
                        return Err(format!("the sink prepared {id} twice"));
                    }
                    let snap = SinkSnap { prepared: self.sink.prepared.clone(), ghost: self.sink.ghost.clone() };
                    if self.sink.snapshots.insert(id, snap).is_some() {
                        return Err(format!("the sink snapshotted {id} twice"));
                    }
                }
                AlignAction::ChannelStateComplete { checkpoint } => {
                    return Err(format!("the one-input sink reported channel state of {checkpoint} complete"));
                }
            }
        }
        Ok(())
    }

    /// The sink learns that checkpoint `n` is complete: it commits every transaction up to `n`.
    fn sink_commit(&mut self, n: CheckpointId) -> Outcome {
        let due: Vec<CheckpointId> = self.sink.prepared.range(..=n).map(|(id, _)| *id).collect();
        for id in due {
            let txn = self.sink.prepared.remove(&id).ok_or("model bug: prepared transaction vanished")?;
            commit(&mut self.committed, id, txn)?;
        }
        if self.final_checkpoint.is_some_and(|f| n >= f) {
            self.sink.final_committed = true;
        }
        Ok(())
    }

    /// Can a crash still come? If not, steps whose only effect is on what a crash would find (a
    /// manifest's durability before the coordinator hears of it, a notification's delay) are taken
    /// together with the step that causes them: this prunes interleavings that cannot differ.
    fn crash_possible(&self) -> bool {
        self.crashes_left > 0 || self.failing_over
    }

    /// A task's snapshot of `id` is written; the writes of a checkpoint the coordinator no longer
    /// waits for (aborted or subsumed) are discarded.
    fn write(&mut self, id: CheckpointId, write: impl FnOnce(&mut Storage)) {
        if self.coordinator.coordinator.pending().contains(&id) {
            write(Rc::make_mut(&mut self.storage));
        }
    }

    fn ack(&mut self, model: &Model, task: TaskId, checkpoint: CheckpointId) -> Outcome {
        self.coordinate(model, Event::Acked { generation: self.generation, checkpoint, task, report: () })
    }

    fn source_finished(&mut self, model: &Model, s: usize) -> Outcome {
        self.sources[s].finished_reported = true;
        self.coordinate(model, Event::SourceFinished { generation: self.generation, task: SOURCE_TASKS[s] })
    }

    fn coordinate(&mut self, model: &Model, event: Event<()>) -> Outcome {
        let now = self.now();
        let out = CoordinatorReplica::step(&mut self.coordinator, CoordinatorCall::Handle(now, event), &model.memo);
        self.decide(out)
    }

    /// Carry out the coordinator's decisions, as the runtime would.
    fn decide(&mut self, decisions: Vec<Decision<()>>) -> Outcome {
        for d in decisions {
            match d {
                Decision::Trigger { barrier } => {
                    match barrier.kind {
                        SnapshotKind::Checkpoint => self.periodic_triggered += 1,
                        SnapshotKind::Final => self.final_checkpoint = Some(barrier.checkpoint),
                        SnapshotKind::Savepoint => {}
                        other => return Err(format!("unexpected {other:?} trigger")),
                    }
                    self.last_trigger_at = Some(barrier.triggered_at.0);
                    if self.periodic_triggered > MAX_PERIODIC_CHECKPOINTS {
                        return Err(format!("the coordinator triggered {} outside a tick", barrier.checkpoint));
                    }
                    for (s, src) in self.sources.iter_mut().enumerate() {
                        if src.ended {
                            return Err(format!("{} triggered after source {s} ended", barrier.checkpoint));
                        }
                        src.triggers.push_back(B(barrier));
                    }
                }
                Decision::CommitManifest { checkpoint, .. } => {
                    self.manifests_to_write.insert(checkpoint);
                }
                Decision::NotifyComplete { checkpoint } => {
                    if self.failing_over {
                        continue; // the tasks are gone; the restored sink recovers instead
                    }
                    if self.final_checkpoint.is_some_and(|f| checkpoint >= f) {
                        self.final_complete = true;
                    }
                    if self.crash_possible() {
                        self.sink.notifications.push_back(checkpoint);
                    } else {
                        self.sink_commit(checkpoint)?;
                    }
                }
                Decision::Abort { checkpoint, .. } => {
                    // Sinks never discard on abort; the checkpoint's partial snapshots are discarded.
                    if !self.storage.complete.contains(&checkpoint) {
                        Rc::make_mut(&mut self.storage).discard(checkpoint);
                    }
                }
                Decision::FailOver { reason } => {
                    if !self.failing_over {
                        return Err(format!("unexpected failover: {reason}"));
                    }
                }
                Decision::JobFinished { checkpoint, kind } => {
                    if kind != SnapshotKind::Final || Some(checkpoint) != self.final_checkpoint {
                        return Err(format!("job finished with {kind:?} {checkpoint}, expected the final checkpoint"));
                    }
                    self.finished = true;
                }
                other => return Err(format!("unexpected decision {other:?}")),
            }
        }
        Ok(())
    }

    /// Tasks that ended and saw the final checkpoint complete report that they finished.
    fn finish_tasks(&mut self, model: &Model) -> Outcome {
        if !self.final_complete || self.failing_over || self.finished {
            return Ok(());
        }
        for (t, task) in ALL_TASKS.iter().enumerate() {
            let done = match *task {
                OPERATOR => self.op.aligner.aligner.all_ended(),
                SINK => self.sink.ended && self.sink.final_committed,
                _ => self.sources[t].ended,
            };
            if done && !self.task_finished[t] {
                self.task_finished[t] = true;
                self.coordinate(model, Event::TaskFinished { generation: self.generation, task: *task })?;
            }
        }
        Ok(())
    }

    fn restart(&mut self, model: &Model) -> Outcome {
        let candidates =
            self.storage.complete.iter().map(|&checkpoint| Candidate { checkpoint, verified: Ok(()) }).collect();
        let restored = choose_restore(candidates).checkpoint;
        if let Some(&newest) = self.committed.keys().next_back() {
            if restored.is_none_or(|r| newest > r) {
                return Err(format!(
                    "the sink committed {newest}, but the restore falls back to {restored:?}: \
                     that output would be committed twice"
                ));
            }
        }
        // Nothing in flight survives the restart: a manifest not yet durable never will be.
        self.manifests_to_write.clear();
        self.manifests_to_report.clear();
        self.generation = self.generation.next();
        let now = self.now();
        let restart = CoordinatorCall::Restart { generation: self.generation, restored, now };
        let out = CoordinatorReplica::step(&mut self.coordinator, restart, &model.memo);
        self.decide(out)?;
        self.failing_over = false;
        self.periodic_triggered = 0;
        self.last_trigger_at = None;
        self.final_checkpoint = None;
        self.final_complete = false;
        self.task_finished = Default::default();

        let storage = Rc::clone(&self.storage);
        let missing = |what: &str| format!("complete checkpoint {restored:?} has no {what} snapshot");
        for s in 0..SOURCES {
            let next = match restored {
                Some(r) => *storage.source_offsets.get(&(r, s)).ok_or_else(|| missing(source_name(s)))?,
                None => 0,
            };
            self.sources[s] = Source { next, ..Source::default() };
        }
        let (op_snap, sink_snap) = match restored {
            Some(r) => (
                storage.op.get(&r).cloned().ok_or_else(|| missing("operator"))?,
                storage.sink.get(&r).cloned().ok_or_else(|| missing("sink"))?,
            ),
            None => (OpSnap::default(), SinkSnap::default()),
        };
        self.base = Base {
            checkpoint: restored,
            offsets: [self.sources[0].next, self.sources[1].next],
            state: op_snap.state.clone(),
            channel: op_snap.channel.clone(),
        };
        self.op = Operator::new();
        self.op.state = op_snap.state;
        if !model.mutated(Mutation::ChannelStateNotReplayed) {
            for (queue, recs) in self.inputs.iter_mut().zip(op_snap.channel) {
                queue.extend(recs.into_iter().map(Msg::Data));
            }
        }
        self.sink = Sink::new();
        self.sink.ghost = sink_snap.ghost;
        if !model.mutated(Mutation::SinkRecoveryCommitSkipped) {
            for (id, txn) in sink_snap.prepared {
                commit(&mut self.committed, id, txn)?;
            }
        }
        for s in 0..SOURCES {
            if self.sources[s].next == RECORDS_PER_SOURCE {
                self.source_finished(model, s)?;
            }
        }
        Ok(())
    }

    // --- invariants ---

    /// A checkpoint whose manifest just became durable must be a consistent cut.
    fn check_cut(&self, id: CheckpointId) -> Outcome {
        let missing = |what: &str| format!("consistent cut: complete checkpoint {id} has no {what} snapshot");
        let op = self.storage.op.get(&id).ok_or_else(|| missing("operator"))?;
        let sink = self.storage.sink.get(&id).ok_or_else(|| missing("sink"))?;
        for s in 0..SOURCES {
            let offset = *self.storage.source_offsets.get(&(id, s)).ok_or_else(|| missing(source_name(s)))?;
            let before_cut = records_of(s, offset);
            let in_state: Vec<Rec> = op.state.iter().copied().filter(|r| r.source as usize == s).collect();
            let channel = &op.channel[s];
            if op.exact {
                // Exact relative to what this generation started from: its input from source `s` was the
                // restored channel state, then the records from the restored offset on. (After a restore
                // of an exact cut this is the same as exact from the start; after an at-least-once one,
                // the restored state may already hold records past the restored offset.)
                let base = &self.base;
                let input: Vec<Rec> = base.channel[s]
                    .iter()
                    .copied()
                    .chain(before_cut.iter().copied().skip(usize::from(base.offsets[s])))
                    .collect();
                let mut since = in_state.clone();
                let base_held = base.state.iter().filter(|r| r.source as usize == s).all(|r| {
                    let at = since.iter().position(|x| x == r);
                    at.map(|at| since.remove(at)).is_some()
                });
                let k = since.len();
                if !base_held || k > input.len() || since != input[..k] || channel[..] != input[k..] {
                    return Err(format!(
                        "consistent cut: {id} is not an exact cut of source {}: since the restore of {} (state \
                         {:?}), the input up to its offset {offset} was {input:?}, but the operator's state holds \
                         {in_state:?} and its channel state {channel:?}",
                        source_name(s),
                        base.checkpoint.map_or_else(|| "nothing".to_string(), |id| id.to_string()),
                        base.state,
                    ));
                }
            } else if !channel.is_empty() || before_cut.iter().any(|r| !in_state.contains(r)) {
                return Err(format!(
                    "consistent cut: at-least-once {id} does not cover source {}: the records before its \
                     offset {offset} are {before_cut:?}, the operator's state holds {in_state:?}, channel \
                     state {channel:?}",
                    source_name(s)
                ));
            }
        }
        if sink.ghost != op.state {
            return Err(format!(
                "consistent cut: at {id} the sink's transactions hold {:?}, but the operator's state is {:?}",
                sink.ghost, op.state
            ));
        }
        Ok(())
    }

    /// A run that has not finished can always go on without a crash; a finished one is checked
    /// against the failure-free run. `steps`: what is enabled here.
    fn check_progress(&self, model: &Model, steps: &[Step]) -> Outcome {
        if steps.is_empty() {
            if !self.finished {
                return Err("deadlock: nothing can happen and the job has not finished".into());
            }
            return self.check_end(model);
        }
        if steps.iter().all(|s| *s == Step::Crash) {
            return Err("deadlock: only a crash can happen and the job has not finished".into());
        }
        Ok(())
    }

    /// The job finished: compare with the failure-free run.
    fn check_end(&self, model: &Model) -> Outcome {
        let expected = all_records();
        let output = sorted(self.committed.values().flatten().copied().collect());
        let state = &self.op.state;
        if model.exactly_once() {
            if output != expected {
                return Err(format!(
                    "exactly-once output: committed {output:?}, the failure-free run commits {expected:?}"
                ));
            }
            if *state != expected {
                return Err(format!("exactly-once state: the operator ends with {state:?}, failure-free {expected:?}"));
            }
        } else {
            let covers =
                |got: &[Rec]| expected.iter().all(|r| got.contains(r)) && got.iter().all(|r| expected.contains(r));
            if !covers(&output) {
                return Err(format!(
                    "at-least-once output: committed {output:?} does not contain exactly the records {expected:?}"
                ));
            }
            if !covers(state) {
                return Err(format!(
                    "at-least-once state: the operator ends with {state:?}, failure-free {expected:?}"
                ));
            }
        }
        if !self.sink.prepared.is_empty() || !self.sink.open.is_empty() {
            return Err(format!(
                "end of job with uncommitted output: prepared {:?}, open {:?}",
                self.sink.prepared, self.sink.open
            ));
        }
        if self.inputs.iter().any(|q| !q.is_empty()) || !self.to_sink.is_empty() {
            return Err(format!("end of job with messages in flight: {:?} {:?}", self.inputs, self.to_sink));
        }
        Ok(())
    }

    /// One step in words, for a failing path (call before applying it).
    fn describe(&self, step: Step) -> String {
        let head = |q: &VecDeque<Msg>| match q.front() {
            Some(Msg::Data(r)) => format!("{r:?}"),
            Some(Msg::Barrier(b)) => format!("barrier {} ({:?}, {:?})", b.0.checkpoint, b.0.kind, b.0.alignment),
            Some(Msg::End) => "end-of-stream".into(),
            None => "nothing".into(),
        };
        let overtake = |q: &VecDeque<Msg>| match first_barrier(q) {
            Some((k, b)) => format!("barrier {} ahead of {:?}", b.checkpoint, data(q, k)),
            None => "no barrier".into(),
        };
        let t = self.generation;
        let name = |id: Option<CheckpointId>| id.map_or_else(|| "nothing".to_string(), |id| id.to_string());
        match step {
            Step::EmitRecord(s) => {
                format!("source {} emits {:?}", source_name(s), Rec { source: s as u8, seq: self.sources[s].next + 1 })
            }
            Step::EmitBarrier(s) => match self.sources[s].triggers.front() {
                Some(B(b)) => format!(
                    "source {} injects barrier {} ({:?}) at offset {}",
                    source_name(s),
                    b.checkpoint,
                    b.kind,
                    self.sources[s].next
                ),
                None => format!("source {} injects a barrier it was never asked for", source_name(s)),
            },
            Step::OpRead(i) => format!("operator reads {} from input {}", head(&self.inputs[i]), source_name(i)),
            Step::OpOvertake(i) => format!("operator takes {} on input {}", overtake(&self.inputs[i]), source_name(i)),
            Step::OpTimeout => format!(
                "operator switches its alignment of {} to unaligned",
                name(self.op.aligner.aligner.timeout_candidate(self.now()).map(|c| c.0))
            ),
            Step::SinkRead => format!("sink reads {}", head(&self.to_sink)),
            Step::OpAck => format!(
                "operator's snapshot of {} is written and acked",
                name(self.op.snapshots.keys().next().copied())
            ),
            Step::SinkAck => {
                format!("sink's snapshot of {} is written and acked", name(self.sink.snapshots.keys().next().copied()))
            }
            Step::Tick => format!("t={}: the coordinator triggers a checkpoint", self.time + INTERVAL_MS),
            Step::Savepoint => "the user asks for a savepoint".into(),
            Step::Wait => format!(
                "t={}: every checkpoint triggered so far is past its alignment timeout",
                self.last_trigger_at.map_or(self.time, |t| t + ALIGNMENT_TIMEOUT_MS)
            ),
            Step::ManifestDurable(id) => format!("manifest of {id} is durable"),
            Step::ManifestReported(id) => format!("the coordinator hears that {id} is complete"),
            Step::NotifySink => {
                format!(
                    "sink is notified that {} is complete and commits",
                    name(self.sink.notifications.front().copied())
                )
            }
            Step::Crash => format!("the operator of {t} crashes; the coordinator fails over"),
            Step::Restart => {
                let candidates =
                    self.storage.complete.iter().map(|&c| Candidate { checkpoint: c, verified: Ok(()) }).collect();
                format!("the job restarts from {}", name(choose_restore(candidates).checkpoint))
            }
        }
    }
}

/// Commit a transaction, idempotently: committing it again with the same records is a no-op.
fn commit(committed: &mut BTreeMap<CheckpointId, Vec<Rec>>, id: CheckpointId, txn: Vec<Rec>) -> Outcome {
    match committed.get(&id) {
        Some(done) if *done == txn => Ok(()),
        Some(done) => Err(format!("transaction {id} committed as {done:?} and again as {txn:?}")),
        None => {
            committed.insert(id, txn);
            Ok(())
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}

// ------------------------------------------------------------------------------------------------
// Exploration
// ------------------------------------------------------------------------------------------------

/// A broken invariant and the path to it.
#[derive(Debug)]
struct Violation {
    model: &'static str,
    mutation: Option<Mutation>,
    path: Vec<Step>,
    what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mutation {
            Some(m) => writeln!(f, "[{} with mutation {m:?}] {}", self.model, self.what)?,
            None => writeln!(f, "[{}] {}", self.model, self.what)?,
        }
        writeln!(f, "path ({} steps):", self.path.len())?;
        for (n, line) in self.narrate().iter().enumerate() {
            writeln!(f, "  {:>3}. {line}", n + 1)?;
        }
        write!(f, "replay: {:?}", self.path)
    }
}

impl Violation {
    /// The path in words, re-run from the start (the words need the state before each step).
    fn narrate(&self) -> Vec<String> {
        let mut model = model_named(self.model);
        model.mutation = self.mutation;
        let mut world = World::new(&model);
        let mut lines = Vec::new();
        for &step in &self.path {
            lines.push(world.describe(step));
            match catch_unwind(AssertUnwindSafe(|| world.child(&model, step))) {
                Ok(Ok(next)) => world = next,
                _ => break,
            }
        }
        lines
    }
}

/// The unmutated model of that name.
fn model_named(name: &str) -> Model {
    [
        Model::aligned(),
        Model::unaligned(),
        Model::aligned_with_timeout(),
        Model::at_least_once(),
        Model::at_least_once_with_a_savepoint(),
    ]
    .into_iter()
    .find(|m| m.name == name)
    .unwrap_or_else(Model::aligned)
}

/// Counts of one exploration, and how often the interesting transitions occur (so that a passing run
/// is known not to be vacuous).
#[derive(Debug, Default)]
struct Stats {
    states: usize,
    transitions: usize,
    finished_states: usize,
    /// Complete executions from the start to a finished job.
    paths: u128,
    max_depth: usize,
    overtakes: usize,
    timeouts: usize,
    savepoints: usize,
    crashes: usize,
    /// Restarts that queued restored channel state.
    channel_state_replays: usize,
    /// Restarts whose sink committed transactions that had not been committed before the crash.
    recovery_commits: usize,
    elapsed: Duration,
}

/// Explore every interleaving of `model`; the first violation stops the search.
fn explore(model: &Model) -> Result<Stats, Violation> {
    #[allow(clippy::large_enum_variant)] // one frame per level of a shallow stack
    enum Frame {
        Enter(World, u64),
        Exit { fp: u64, children: Vec<u64> },
    }
    let start = Instant::now();
    let mut stats = Stats::default();
    // Complete executions from each finished-expanding state; doubles as the visited set.
    let mut paths: FingerprintMap<u64, u128> = FingerprintMap::default();
    let mut expanding = FingerprintSet::default();
    let root = World::new(model);
    let root_fp = root.fingerprint();
    let mut stack = vec![Frame::Enter(root, root_fp)];
    while let Some(frame) = stack.pop() {
        let (world, fp) = match frame {
            Frame::Enter(world, fp) => (world, fp),
            Frame::Exit { fp, children } => {
                let n = children.iter().map(|c| paths.get(c).copied().unwrap_or(0)).fold(0u128, u128::saturating_add);
                paths.insert(fp, n);
                expanding.remove(&fp);
                continue;
            }
        };
        if paths.contains_key(&fp) {
            continue;
        }
        let fail =
            |what: String| Violation { model: model.name, mutation: model.mutation, path: world.path.clone(), what };
        if !expanding.insert(fp) {
            return Err(fail("a cycle in the state graph: the run can go on forever".into()));
        }
        stats.states += 1;
        stats.max_depth = stats.max_depth.max(world.path.len());
        if stats.states > MAX_STATES {
            return Err(fail(format!("exploration too large: {} states in {:?}", stats.states, start.elapsed())));
        }
        let steps = world.enabled(model);
        world.check_progress(model, &steps).map_err(fail)?;
        if steps.is_empty() {
            stats.finished_states += 1;
            paths.insert(fp, 1);
            expanding.remove(&fp);
            continue;
        }
        let mut children = Vec::with_capacity(steps.len());
        let mut todo = Vec::with_capacity(steps.len());
        for step in steps {
            let child = world.child(model, step)?;
            stats.transitions += 1;
            match step {
                Step::OpOvertake(_) => stats.overtakes += 1,
                Step::OpTimeout => stats.timeouts += 1,
                Step::Savepoint => stats.savepoints += 1,
                Step::Crash => stats.crashes += 1,
                Step::Restart => {
                    if child.inputs.iter().chain([&child.to_sink]).any(|q| !q.is_empty()) {
                        stats.channel_state_replays += 1;
                    }
                    if child.committed.len() > world.committed.len() {
                        stats.recovery_commits += 1;
                    }
                }
                _ => {}
            }
            let cfp = child.fingerprint();
            children.push(cfp);
            if !paths.contains_key(&cfp) {
                todo.push(Frame::Enter(child, cfp));
            }
        }
        stack.push(Frame::Exit { fp, children });
        stack.extend(todo);
    }
    stats.paths = paths.get(&root_fp).copied().unwrap_or(0);
    stats.elapsed = start.elapsed();
    Ok(stats)
}

/// Re-run a path printed by a violation; the violation it ends in, if any.
fn replay(model: &Model, path: &[Step]) -> Result<World, Violation> {
    let mut world = World::new(model);
    for &step in path {
        if !world.enabled(model).contains(&step) {
            return Err(Violation {
                model: model.name,
                mutation: model.mutation,
                path: world.path.clone(),
                what: format!("replay: {step:?} is not enabled here"),
            });
        }
        world = world.child(model, step)?;
    }
    let fail = |what| Violation { model: model.name, mutation: model.mutation, path: path.to_vec(), what };
    world.check_progress(model, &world.enabled(model)).map_err(fail)?;
    Ok(world)
}

/// Explore `model`, print its counts, and fail with the path if an invariant breaks.
fn check(model: Model) -> Stats {
    match explore(&model) {
        Ok(stats) => {
            println!(
                "{}: {} states, {} transitions, {} complete interleavings ({} distinct end states), depth {}, \
                 {} overtakes, {} timeouts, {} savepoints, {} crashes, {} restores replaying channel state, \
                 {} recovery commits, {:?}",
                model.name,
                stats.states,
                stats.transitions,
                if stats.paths == u128::MAX { "more than 10^38".to_string() } else { stats.paths.to_string() },
                stats.finished_states,
                stats.max_depth,
                stats.overtakes,
                stats.timeouts,
                stats.savepoints,
                stats.crashes,
                stats.channel_state_replays,
                stats.recovery_commits,
                stats.elapsed
            );
            let crashed = stats.crashes > 0 && stats.recovery_commits > 0;
            assert!(stats.paths > 0 && (crashed || model.max_crashes == 0), "{}: vacuous run: {stats:?}", model.name);
            stats
        }
        Err(v) => panic!("{v}"),
    }
}

/// The checker must find a violation of `model` (which carries a mutation) whose message contains
/// `expected`, and its path must replay to the same violation.
fn check_catches(model: Model, expected: &str) {
    let v = match explore(&model) {
        Ok(stats) => panic!("[{}] mutation {:?} went unnoticed: {stats:?}", model.name, model.mutation),
        Err(v) => v,
    };
    println!("{:?} caught:\n{v}", model.mutation);
    assert!(
        v.what.contains(expected),
        "mutation {:?}: expected a violation of {expected:?}, got:\n{v}",
        model.mutation
    );
    match replay(&model, &v.path) {
        Err(again) => assert_eq!(again.what, v.what, "the replayed path fails differently"),
        Ok(_) => panic!("the path of\n{v}\nreplays without a violation"),
    }
}

// ------------------------------------------------------------------------------------------------
// The scenarios
// ------------------------------------------------------------------------------------------------

#[test]
fn aligned_checkpoints_are_exact_cuts_and_output_is_exactly_once_in_every_interleaving() {
    let stats = check(Model::aligned());
    assert_eq!(stats.overtakes + stats.timeouts, 0, "aligned barriers never overtake or switch");
}

#[test]
fn unaligned_checkpoints_with_overtaken_records_as_channel_state_are_exact_in_every_interleaving() {
    let stats = check(Model::unaligned());
    assert!(stats.overtakes > 0 && stats.channel_state_replays > 0, "{stats:?}");
}

#[test]
fn aligned_checkpoints_that_time_out_and_switch_to_unaligned_are_exact_in_every_interleaving() {
    let stats = check(Model::aligned_with_timeout());
    assert!(stats.timeouts > 0 && stats.overtakes > 0 && stats.channel_state_replays > 0, "{stats:?}");
}

#[test]
fn at_least_once_checkpoints_cover_their_cut_and_output_contains_every_record_in_every_interleaving() {
    let stats = check(Model::at_least_once());
    assert_eq!(stats.overtakes + stats.timeouts, 0, "at-least-once never overtakes or switches");
}

#[test]
fn a_savepoint_amid_at_least_once_checkpoints_is_an_exact_cut_in_every_interleaving() {
    let stats = check(Model::at_least_once_with_a_savepoint());
    assert!(stats.savepoints > 0, "{stats:?}");
}

#[test]
fn the_checker_catches_overtaken_records_left_out_of_channel_state() {
    check_catches(Model::unaligned().with(Mutation::OvertakenRecordsNotCaptured), "consistent cut");
}

#[test]
fn the_checker_catches_recorded_records_left_out_of_channel_state() {
    check_catches(Model::aligned_with_timeout().with(Mutation::RecordedRecordsNotCaptured), "consistent cut");
}

#[test]
fn the_checker_catches_an_operator_that_reads_a_blocked_input() {
    check_catches(Model::aligned().with(Mutation::BlockedInputRead), "consistent cut");
}

#[test]
fn the_checker_catches_a_restore_that_drops_channel_state() {
    check_catches(Model::unaligned().with(Mutation::ChannelStateNotReplayed), "consistent cut");
}

#[test]
fn the_checker_catches_a_sink_that_does_not_commit_the_restored_transactions() {
    check_catches(Model::aligned().with(Mutation::SinkRecoveryCommitSkipped), "exactly-once output");
}
