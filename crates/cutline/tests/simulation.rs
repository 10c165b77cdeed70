//! The main correctness test: many seeds of the deterministic simulation, with task crashes, process
//! crashes, injected failures at every fault point and failing storage writes. A failing seed is printed
//! and replays exactly with `cutline drill --seed N --sim-seeds 1 --runs 0`.

use cutline::testing::sim::{run_seed, SimAlignment, SimOptions};
use cutline::CheckpointMode;

/// Seeds per scenario: CI runs 10 000; `SIM_SEEDS=n` runs more (or fewer), `SIM_SEED=s` runs only seed s.
fn seeds() -> std::ops::Range<u64> {
    let var = |k: &str| std::env::var(k).ok().and_then(|s| s.parse::<u64>().ok());
    match var("SIM_SEED") {
        Some(s) => s..s + 1,
        None => 0..var("SIM_SEEDS").unwrap_or(10_000),
    }
}

fn run_all(name: &str, o: SimOptions) {
    run_seeds(name, o, seeds())
}

fn run_seeds(name: &str, o: SimOptions, range: std::ops::Range<u64>) {
    let n = range.end - range.start;
    let mut failovers = 0;
    let mut crashes = 0;
    let mut cuts = 0;
    let mut late = 0;
    let mut total = cutline::testing::sim::SimReport::default();
    for seed in range {
        match run_seed(seed, &o) {
            Ok(r) => {
                failovers += r.failovers;
                crashes += r.process_crashes;
                cuts += r.cuts_checked;
                late += r.late_writes;
                total.in_flight_batches += r.in_flight_batches;
                total.switched_snapshots += r.switched_snapshots;
                total.retunes += r.retunes;
                total.stalls += r.stalls;
                total.savepoints_requested += r.savepoints_requested;
                total.stopped_with_savepoint += r.stopped_with_savepoint;
                total.failed_claims += r.failed_claims;
                total.incremental_cuts += r.incremental_cuts;
                total.disk_state_seeds += r.disk_state_seeds;
                total.removed_keys_checked += r.removed_keys_checked;
            }
            Err(e) => {
                panic!("{name}: seed {seed} failed: {e}\nreplay: cutline drill --seed {seed} --sim-seeds 1 --runs 0")
            }
        }
    }
    eprintln!(
        "{name}: {n} seeds passed; {failovers} failovers, {crashes} process crashes, {cuts} consistent cuts checked, {late} late writes of older generations; {} in-flight batches in checkpoints, {} switched snapshots, {} retunes, {} stalls, {} savepoints requested, {} stops with a savepoint, {} generation claims failed by storage, {} incremental checkpoints checked, {} seeds with state on disk, {} removed keys checked absent",
        total.in_flight_batches, total.switched_snapshots, total.retunes, total.stalls, total.savepoints_requested, total.stopped_with_savepoint, total.failed_claims, total.incremental_cuts, total.disk_state_seeds, total.removed_keys_checked
    );
    // The scenario must really exercise recovery, or it proves nothing.
    if n >= 100 {
        assert!(failovers > n / 4 && crashes > n / 10 && cuts > n && late > 0, "{name}: too few failures exercised");
        assert!(total.failed_claims > 0, "{name}: no generation claim ever failed");
        assert!(total.incremental_cuts > n / 5, "{name}: too few incremental checkpoints checked");
        assert!(total.removed_keys_checked > n, "{name}: too few removed keys checked");
        if cfg!(feature = "spill") {
            assert!(total.disk_state_seeds > n / 6, "{name}: too few seeds kept keyed state on disk");
        }
        if o.mode == CheckpointMode::ExactlyOnce && o.alignment != SimAlignment::Aligned {
            assert!(total.in_flight_batches > n, "{name}: too few in-flight records persisted");
        }
        if matches!(o.alignment, SimAlignment::WithTimeout | SimAlignment::Mixed) {
            assert!(total.switched_snapshots > n, "{name}: too few alignment switches");
        }
        if o.alignment == SimAlignment::Mixed {
            assert!(total.retunes > n && total.stopped_with_savepoint > n / 10, "{name}: too few retunes or stops");
        }
    }
}

#[test]
fn exactly_once_output_survives_crashes_at_every_step() {
    run_all("exactly-once", SimOptions::default());
}

/// The same with the sink in the Kafka sink's design: the epoch's records kept in the checkpoint
/// and written at commit with a marker that recovery reads, older incarnations fenced.
#[test]
fn exactly_once_with_a_marker_sink_like_the_kafka_sinks_survives_crashes_at_every_step() {
    run_all("exactly-once, marker sink", SimOptions { marker_sink: true, ..Default::default() });
}

#[test]
fn at_least_once_output_contains_the_failure_free_run() {
    run_all("at-least-once", SimOptions { mode: CheckpointMode::AtLeastOnce, ..Default::default() });
}

#[test]
fn exactly_once_with_two_concurrent_checkpoints() {
    run_all("exactly-once, 2 concurrent", SimOptions { max_concurrent: 2, ..Default::default() });
}

#[test]
fn exactly_once_under_a_failure_storm() {
    // Slow per seed (dozens of failovers each): a fifth of the seeds.
    let r = seeds();
    let r = r.start..r.start + (r.end - r.start).div_ceil(5);
    run_seeds(
        "exactly-once, failure storm",
        SimOptions { fault_point_ppm: 4_000, storage_fail_ppm: 40_000, task_crash_ppm: 3_000, ..Default::default() },
        r,
    );
}

#[test]
fn unaligned_checkpoints_persist_in_flight_records_and_stay_exact() {
    run_all("unaligned", SimOptions { alignment: SimAlignment::Unaligned, ..Default::default() });
}

#[test]
fn unaligned_with_two_concurrent_checkpoints() {
    run_all(
        "unaligned, 2 concurrent",
        SimOptions { alignment: SimAlignment::Unaligned, max_concurrent: 2, ..Default::default() },
    );
}

#[test]
fn aligned_checkpoints_switch_to_unaligned_after_their_timeout() {
    run_all("aligned with timeout", SimOptions { alignment: SimAlignment::WithTimeout, ..Default::default() });
}

#[test]
fn settings_change_at_run_time_with_stragglers_and_savepoints() {
    // Alignment changes per process life and at run time, tasks stall past the checkpoint timeout,
    // savepoints are taken and some stop the job, which a new process resumes.
    run_all(
        "mixed alignment, retuned, stragglers, savepoints",
        SimOptions {
            alignment: SimAlignment::Mixed,
            max_concurrent: 2,
            stall_ppm: 300,
            savepoint_ppm: 600,
            ..Default::default()
        },
    );
}
