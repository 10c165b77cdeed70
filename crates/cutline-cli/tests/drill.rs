//! Failure drills of the threaded runtime on real files (what `cutline drill` runs): task failures at
//! every fault point and failing storage writes, output compared with the failure-free result.

#[test]
fn drill_with_injected_failures_at_every_fault_point_keeps_output_exact() {
    for seed in 1..=4 {
        match cutline_cli::jobs::drill_run(seed) {
            Ok(verdict) => eprintln!("seed {seed}: {verdict}"),
            Err(e) => panic!("{e}\nreplay: cutline drill --seed {seed} --runs 1 --sim-seeds 0"),
        }
    }
}
