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

mod explore;
mod records;
mod replicas;
mod world;
mod world_checks;
mod world_steps;
use explore::*;
use records::*;
use replicas::*;
use world::*;
use world_checks::*;

// ------------------------------------------------------------------------------------------------
// Limits of the model
// ------------------------------------------------------------------------------------------------

/// Records each source emits; values are distinct across sources (`a1`, `a2`, `b1`, `b2`).
pub(crate) const RECORDS_PER_SOURCE: u8 = 2;
/// Periodic checkpoints the coordinator may trigger per generation. With the final checkpoint each
/// generation takes at end of input, that is two epochs per generation.
pub(crate) const MAX_PERIODIC_CHECKPOINTS: u32 = 1;
/// Checkpoints in flight at once: two, so that epochs overlap in the channels and at the aligner.
pub(crate) const MAX_CONCURRENT: usize = 2;
/// Crashes per run.
pub(crate) const MAX_CRASHES: u32 = 1;
/// An exploration that reaches more distinct states than this fails rather than run on (the largest,
/// aligned-with-timeout, has about 4.3 million: some 20 s on one core of a release build).
pub(crate) const MAX_STATES: usize = 20_000_000;

/// Checkpoint interval. A tick advances time by this much and only comes when the model lets the
/// coordinator trigger, so every tick triggers and no other event does. It is the concurrent trigger
/// gap, so that a tick with a checkpoint (or savepoint) in flight triggers too.
pub(crate) const INTERVAL_MS: u64 = MIN_CONCURRENT_TRIGGER_GAP_MS;
/// Alignment timeout of the aligned-with-timeout mode, counted from the trigger. Shorter than the
/// interval: time also moves (only in that mode) to the moment every triggered checkpoint is past its
/// timeout, which never reaches the next trigger.
pub(crate) const ALIGNMENT_TIMEOUT_MS: u64 = 5;
/// Long enough never to fire: the model has no checkpoint timeouts, declines or failed manifests.
pub(crate) const CHECKPOINT_TIMEOUT_MS: u64 = 1 << 40;
/// The durable epoch lease: never reached.
pub(crate) const LEASE_END: CheckpointId = CheckpointId(1 << 40);

pub(crate) const SOURCES: usize = 2;
/// Task ids: the sources are 0 and 1 (source `s` feeds operator input `s`), then the operator and the sink.
pub(crate) const SOURCE_TASKS: [TaskId; SOURCES] = [TaskId(0), TaskId(1)];
pub(crate) const OPERATOR: TaskId = TaskId(2);
pub(crate) const SINK: TaskId = TaskId(3);
pub(crate) const ALL_TASKS: [TaskId; 4] = [SOURCE_TASKS[0], SOURCE_TASKS[1], OPERATOR, SINK];
/// The sink's only input.
pub(crate) const SINK_INPUT: usize = 0;

// ------------------------------------------------------------------------------------------------
// Modes and mutations
// ------------------------------------------------------------------------------------------------

/// A deliberate bug on the task side, to show that the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutation {
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
pub(crate) struct Model {
    pub(crate) name: &'static str,
    pub(crate) config: CheckpointConfig,
    /// The user asks for one savepoint (always aligned and exactly-once) at any moment of a run.
    pub(crate) savepoint: bool,
    pub(crate) max_crashes: u32,
    pub(crate) mutation: Option<Mutation>,
    pub(crate) memo: RefCell<Memo>,
}

impl Model {
    pub(crate) fn new(name: &'static str, config: CheckpointConfig) -> Model {
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
    pub(crate) fn aligned() -> Model {
        Model::new("aligned", CheckpointConfig::default())
    }
    pub(crate) fn unaligned() -> Model {
        Model::new("unaligned", CheckpointConfig { unaligned: true, ..Default::default() })
    }
    pub(crate) fn aligned_with_timeout() -> Model {
        let config = CheckpointConfig { alignment_timeout_ms: Some(ALIGNMENT_TIMEOUT_MS), ..Default::default() };
        Model::new("aligned-with-timeout", config)
    }
    pub(crate) fn at_least_once() -> Model {
        Model::new("at-least-once", CheckpointConfig { mode: CheckpointMode::AtLeastOnce, ..Default::default() })
    }
    /// At-least-once checkpoints and one savepoint, which is exactly-once: the aligner has both kinds
    /// pending at once. Without a crash, which would make the exploration some twenty times larger.
    pub(crate) fn at_least_once_with_a_savepoint() -> Model {
        let name = "at-least-once with a savepoint";
        Model { name, savepoint: true, max_crashes: 0, ..Model::at_least_once() }
    }
    pub(crate) fn with(mut self, mutation: Mutation) -> Model {
        self.mutation = Some(mutation);
        self
    }
    pub(crate) fn exactly_once(&self) -> bool {
        self.config.mode == CheckpointMode::ExactlyOnce
    }
    pub(crate) fn mutated(&self, m: Mutation) -> bool {
        self.mutation == Some(m)
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
