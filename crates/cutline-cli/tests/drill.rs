//! Failure drills (what `cutline drill` runs): the threaded runtime on real files with task failures
//! at every fault point and failing storage writes, and the deterministic simulation; output compared
//! with the failure-free result. A drill that injects no failure tested nothing and must fail.

mod common;

use cutline::testing::sim::SimOptions;
use cutline_cli::jobs::{drill_run, drill_run_with_budget, drill_simulation};

/// The number in `"... <n> <what>..."` of a verdict line.
fn number_before(verdict: &str, what: &str) -> u64 {
    let at = verdict.find(what).unwrap_or_else(|| panic!("{what:?} is not in {verdict:?}"));
    verdict[..at].split_whitespace().last().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{verdict:?}"))
}

#[test]
fn drill_with_injected_failures_at_every_fault_point_keeps_output_exact() {
    for seed in 1..=4 {
        match drill_run(seed) {
            Ok(verdict) => {
                eprintln!("seed {seed}: {verdict}");
                assert!(number_before(&verdict, " failures injected") > 0, "seed {seed}: {verdict}");
                let seen = number_before(&verdict, " restarts") + number_before(&verdict, " failed");
                assert!(seen > 0, "seed {seed}: the job saw none of the failures: {verdict}");
            }
            Err(e) => panic!("{e}\nreplay: cutline drill --seed {seed} --runs 1 --sim-seeds 0"),
        }
    }
}

#[test]
fn a_drill_that_injects_no_failure_fails() {
    let e = drill_run_with_budget(1, 0).expect_err("a drill without failures must not pass");
    assert!(e.contains("injected no failure"), "{e}");
    let quiet = SimOptions {
        task_crash_ppm: 0,
        process_crash_ppm: 0,
        fault_point_ppm: 0,
        storage_fail_ppm: 0,
        stall_ppm: 0,
        ..SimOptions::default()
    };
    let e = drill_simulation(1, 3, &quiet).expect_err("a simulation without failures must not pass");
    assert!(e.contains("injected no failure"), "{e}");
}

#[test]
fn the_simulated_drill_injects_failures_and_recovers() {
    let d = drill_simulation(1, 20, &SimOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{d:?}");
    assert!(d.failures() > 0 && d.checkpoints_completed > 0, "{d:?}");
}

#[test]
fn cutline_drill_reports_the_failures_it_injected_and_refuses_to_drill_nothing() {
    let out = common::cutline().args(["drill", "--seed", "1", "--runs", "1", "--sim-seeds", "5"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.lines().any(|l| l == "verdict: PASS"), "{stdout}");
    let sim = stdout.lines().find(|l| l.contains("seeds passed")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(number_before(sim, " failovers") + number_before(sim, " process crashes") > 0, "{stdout}");
    let run = stdout.lines().find(|l| l.contains("seed 1: PASS")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(number_before(run, " failures injected") > 0, "{stdout}");

    let out = common::cutline().args(["drill", "--runs", "0", "--sim-seeds", "0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("tests nothing"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("PASS"));
}
