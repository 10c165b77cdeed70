//! The storage conformance suite: every scenario is written once, against a [`Harness`] (a store plus
//! raw access to the files underneath, to simulate crashes, corruption and files moved by hand), and
//! [`conformance_suite!`] turns each into one `#[test]` per store. `tests/conformance.rs` instantiates
//! it for `LocalDirStore` and `MemStore`, `tests/s3/` for `S3Store` (feature `s3`, real server).
//!
//! - [`basics`]: the store contract (write, commit, list, verify, discard, damage, leftovers, meta).
//! - [`fencing`]: the fencing of a zombie's commits, as tables of steps checked against a model.
//! - [`generations`]: generation records (create-if-absent claims), races, damage, their retention.
//! - [`gc`]: retention against a model of random histories.
//! - [`moved`]: checkpoint directories a user renamed or copied by hand, a manifest of another job,
//!   and ids and sizes at the end of their range: errors, never panics.
//!
//! Paths given to a harness are relative to the store root and '/'-separated, as the store's layout
//! names them (`checkpoints/chk-<20 digits>/_MANIFEST`, ...).

pub mod basics;
pub mod fencing;
pub mod gc;
pub mod generations;
pub mod moved;
pub mod stats;

use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};
use cutline_storage::{
    encode_frame, CheckpointListing, CheckpointStore, FileKind, GenerationRecord, Manifest, TaskStateHandle,
};
use serde::Serialize;
use std::sync::Arc;

/// A store under test plus raw access to its files, by path relative to the root.
pub trait Harness {
    /// The kind of store ("local", "mem", "s3"), for messages.
    fn name(&self) -> &'static str;

    /// The store under test.
    fn store(&self) -> &dyn CheckpointStore;

    /// The store under test, shared (for threads).
    fn shared(&self) -> Arc<dyn CheckpointStore>;

    /// A second client of the same storage, as a second process would have: another `LocalDirStore`
    /// on the same directory, another `S3Store` (its own HTTP client) on the same prefix. A memory
    /// store cannot be reached from elsewhere, so it is the same store.
    fn another_client(&self) -> Arc<dyn CheckpointStore>;

    /// An empty store of the same kind.
    fn fresh(&self) -> Box<dyn Harness>;

    /// Writes a file bypassing the store (creating its directory if needed).
    fn put_raw(&self, path: &str, bytes: &[u8]);

    /// Removes a file bypassing the store (it must exist).
    fn remove_raw(&self, path: &str);

    /// The bytes of a file, bypassing the store; `None` if there is none.
    fn get_raw(&self, path: &str) -> Option<Vec<u8>>;

    /// All files under the root, sorted.
    fn files(&self) -> Vec<String>;

    /// How the store's errors name the file at `path` (a full path, a `mem:` path, an `s3://` URL).
    fn shown(&self, path: &str) -> String;

    /// How much of the costly scenarios to run on this store.
    fn budget(&self) -> Budget;

    /// Every file with its bytes.
    fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        self.files()
            .into_iter()
            .map(|p| {
                let bytes = self.get_raw(&p).unwrap_or_else(|| panic!("{}: {p} vanished", self.name()));
                (p, bytes)
            })
            .collect()
    }

    /// Copies every file of checkpoint directory `from` into the directory of `to`, as `cp -r` would,
    /// and with `remove_original` removes the originals, as `mv` would.
    fn copy_checkpoint_dir(&self, from: u64, to: u64, remove_original: bool) {
        let prefix = format!("{}/", dir_of(from));
        let files: Vec<String> = self.files().into_iter().filter(|f| f.starts_with(&prefix)).collect();
        assert!(!files.is_empty(), "{}: nothing in {prefix}", self.name());
        for file in files {
            let bytes = self.get_raw(&file).unwrap();
            self.put_raw(&format!("{}/{}", dir_of(to), &file[prefix.len()..]), &bytes);
            if remove_original {
                self.remove_raw(&file);
            }
        }
    }

    /// Flips every bit of the byte at `at` of the file at `path`.
    fn flip_byte(&self, path: &str, at: usize) {
        let mut bytes = self.get_raw(path).unwrap_or_else(|| panic!("{}: no file {path}", self.name()));
        bytes[at] ^= 0xFF;
        self.put_raw(path, &bytes);
    }
}

/// How much of the costly scenarios a store runs: every request to a remote store is a round trip.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Random retention histories (one seed each), and rounds of gc per history.
    pub gc_histories: u64,
    pub gc_rounds: usize,
    /// The operators whose subtasks a checkpoint of a random history writes.
    pub gc_operators: &'static [&'static str],
    /// At most how many new checkpoint ids per round, and at most how many retained by each gc.
    pub gc_max_steps: u64,
    pub gc_max_retain: u64,
    /// Rounds of the scenarios in which two clients race.
    pub race_rounds: u64,
}

// Each test binary uses the budgets of its own stores.
#[allow(dead_code)]
impl Budget {
    /// Stores in memory or on a local disk: the full runs.
    pub const LOCAL: Budget = Budget {
        gc_histories: 3,
        gc_rounds: 8,
        gc_operators: &["src", "map.a", "sink-1"],
        gc_max_steps: 6,
        gc_max_retain: 4,
        race_rounds: 50,
    };
    /// The memory store: many more random histories, as they cost nothing.
    pub const MEM: Budget = Budget { gc_histories: 40, gc_rounds: 12, ..Budget::LOCAL };
    /// A remote store: fewer and shorter histories and races.
    pub const REMOTE: Budget = Budget {
        gc_histories: 2,
        gc_rounds: 6,
        gc_operators: &["src", "sink-1"],
        gc_max_steps: 4,
        gc_max_retain: 3,
        race_rounds: 12,
    };
}

/// Generates one `#[test]` per scenario, each on a store of its own from `$new(test_name)` (a
/// function returning some [`Harness`]). Every scenario of the suite is listed here once; a scenario
/// function left out of the list is dead code, which the build rejects (clippy `-D warnings`).
macro_rules! conformance_suite {
    ($new:path) => {
        conformance_suite!(@tests $new;
            basics::write_commit_list_verify,
            basics::committed_checkpoints_are_immutable,
            basics::discard_removes_attempts_and_refuses_complete,
            basics::discard_keeps_files_a_later_manifest_references,
            basics::damaged_task_file_fails_verify,
            basics::damaged_manifest_fails_read,
            basics::temp_manifest_left_by_a_crash_is_not_a_commit,
            basics::meta_and_finished_roundtrip,
            basics::unrelated_entries_are_ignored_and_kept,
            basics::invalid_ids_and_references_are_rejected,
            basics::gc_keeps_a_retained_checkpoint_whose_manifest_is_damaged_whole,
            basics::of_two_racing_committers_exactly_one_wins,
            basics::tasks_write_concurrently_through_one_store,
            fencing::fencing_scenarios,
            generations::claiming_a_generation_twice_is_refused,
            generations::claiming_below_the_latest_generation_is_superseded,
            generations::check_not_fenced_with_no_records_passes,
            generations::temporary_record_left_by_a_crash_is_not_a_claim,
            generations::of_two_racing_claims_of_one_generation_exactly_one_wins,
            generations::a_claim_racing_a_newer_generation_loses_without_a_trace,
            generations::damaged_generation_record_is_corruption,
            generations::gc_removes_only_records_that_can_fence_nothing_stored,
            generations::a_zombie_gc_keeps_the_newer_generation_restore_point,
            generations::a_zombie_with_its_own_client_is_fenced,
            generations::a_released_claim_fences_nothing_and_can_be_claimed_again,
            gc::gc_keeps_exactly_what_retained_manifests_and_in_flight_attempts_need,
            moved::a_renamed_checkpoint_directory_is_corruption_not_a_panic,
            moved::a_copied_checkpoint_directory_is_skipped_and_the_original_restores,
            moved::a_manifest_of_another_job_is_read_and_reported_not_a_panic,
            moved::ids_and_generations_at_u64_max_work,
            moved::names_beyond_u64_max_are_ignored,
            moved::sizes_near_u64_max_in_a_manifest_do_not_overflow,
            stats::stats_roundtrip_survive_gc_and_prune_to_the_newest,
        );
    };
    (@tests $new:path; $($module:ident :: $scenario:ident),* $(,)?) => {
        $(
            #[test]
            fn $scenario() {
                let harness = $new(stringify!($scenario));
                $crate::common::$module::$scenario(&harness);
            }
        )*
    };
}

// ---- shared helpers -----------------------------------------------------------------------------------

/// The directory of checkpoint `id`, relative to the root.
pub fn dir_of(id: u64) -> String {
    format!("checkpoints/chk-{id:020}")
}

/// The manifest of checkpoint `id`, relative to the root.
pub fn manifest_path(id: u64) -> String {
    format!("{}/_MANIFEST", dir_of(id))
}

/// The generation record of `generation`, relative to the root.
pub fn generation_path(generation: u64) -> String {
    format!("generations/gen-{generation:020}")
}

/// Writes the state of subtask `sub` of operator `op` in checkpoint `id` (parallelism 2, key groups).
pub fn write(s: &dyn CheckpointStore, id: u64, op: &str, sub: u32, payload: &[u8]) -> TaskStateHandle {
    let kg = KeyGroupRange::for_subtask(128, 2, sub % 2);
    s.write_task_state(CheckpointId(id), &OperatorId::new(op), SubtaskIndex(sub), 2, Some(kg), payload).unwrap()
}

/// A manifest of generation 1.
pub fn manifest(id: u64, tasks: Vec<TaskStateHandle>) -> Manifest {
    manifest_of_generation(id, 1, tasks)
}

pub fn manifest_of_generation(id: u64, generation: u64, tasks: Vec<TaskStateHandle>) -> Manifest {
    Manifest::new("job-fingerprint", CheckpointId(id), Generation(generation), 1_000u64.wrapping_add(id), false, tasks)
}

/// Writes one task file for checkpoint `id` and commits it as generation `generation`.
pub fn commit(s: &dyn CheckpointStore, id: u64, generation: u64) -> Manifest {
    let payload = format!("state of {id} by generation {generation}");
    let task =
        s.write_task_state(CheckpointId(id), &OperatorId::new("op"), SubtaskIndex(0), 1, None, payload.as_bytes());
    let m = manifest_of_generation(id, generation, vec![task.unwrap()]);
    s.commit_manifest(&m).unwrap();
    m
}

pub fn record(generation: u64, restored: Option<u64>, owner: &str) -> GenerationRecord {
    GenerationRecord {
        job_fingerprint: "job-fingerprint".into(),
        generation: Generation(generation),
        restored: restored.map(CheckpointId),
        created_unix_ms: 1_700_000_000_000u64.wrapping_add(generation),
        owner: owner.into(),
    }
}

/// A listing of checkpoints none of which is fenced.
pub fn listing(pairs: &[(u64, bool)]) -> Vec<CheckpointListing> {
    pairs.iter().map(|&(id, complete)| CheckpointListing { id: CheckpointId(id), complete, fenced: false }).collect()
}

/// A record framed as the store frames it, to plant where a crash or a user would have left it.
pub fn framed<T: Serialize>(kind: FileKind, record: &T) -> Vec<u8> {
    encode_frame(kind, &postcard::to_allocvec(record).unwrap())
}

/// Runs `job` on each store at once (after a barrier), one thread each; the results in order.
pub fn race<T: Send + 'static, R: Send + 'static>(
    work: Vec<(Arc<dyn CheckpointStore>, T)>,
    job: fn(&dyn CheckpointStore, &T) -> R,
) -> Vec<(T, R)> {
    let barrier = Arc::new(std::sync::Barrier::new(work.len()));
    let threads: Vec<_> = work
        .into_iter()
        .map(|(store, input)| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let result = job(&*store, &input);
                (input, result)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}
