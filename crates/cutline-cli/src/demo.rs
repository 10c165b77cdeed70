//! `cutline demo` and `cutline drill`.

use crate::run::wordcount_config;
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The text the demo counts.
pub(crate) const DEMO_TEXT: &str = include_str!("../../../data/demo.txt");

pub(crate) fn demo(dir: Option<PathBuf>) -> Result<()> {
    let dir = match dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("cutline-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("input.txt");
    // Repeat the bundled text so the job runs long enough for several checkpoints.
    let text: String = (0..600).map(|_| DEMO_TEXT).collect();
    std::fs::write(&input, &text)?;
    let output = dir.join("output");
    let state = dir.join("state");
    for d in [&output, &state] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
    }
    println!("cutline demo: counting words of {} ({} bytes) into {}", input.display(), text.len(), output.display());
    let (graph, mut cfg) = wordcount_config(&input, &output, &state, 2, "50ms", "exactly-once", 200, None, None)?;
    cfg.batch_size = 64;
    // One injected crash: the first sink commit after the second completed checkpoint fails.
    let commits = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c2 = commits.clone();
    cfg.faults = cutline::Faults::new(move |p| {
        p == cutline::FaultPoint::SinkCommitMidway && c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 3
    });
    let start = Instant::now();
    let report = cutline::run(&graph, cfg)?;
    println!(
        "done in {} ms: {} checkpoints, {} restart(s) after the injected crash, recovery took {:?} ms",
        start.elapsed().as_millis(),
        report.checkpoints_completed,
        report.restarts,
        report.recovery_ms
    );
    let problems = cutline_cli::jobs::check_wordcount_output(&text, &output)?;
    if problems.is_empty() {
        println!("output verified: every word's counts 1..n appear exactly once, as in a run without failures");
        Ok(())
    } else {
        bail!("output differs from a failure-free run: {}", problems.join("; "))
    }
}

pub(crate) fn drill(seed: u64, runs: u64, sim_seeds: u64) -> Result<()> {
    if runs == 0 && sim_seeds == 0 {
        bail!(
            "--runs 0 and --sim-seeds 0: a drill that injects no failure tests nothing; give at least one run or seed"
        );
    }
    println!("drill 1/2: deterministic simulation, seeds {seed}..{}", seed + sim_seeds);
    let sim = cutline_cli::jobs::drill_simulation(seed, sim_seeds, &cutline::testing::sim::SimOptions::default())
        .map_err(anyhow::Error::msg)?;
    println!(
        "  {sim_seeds} seeds passed: {} failovers and {} process crashes injected, {} checkpoints completed",
        sim.failovers, sim.process_crashes, sim.checkpoints_completed
    );
    println!("drill 2/2: threaded runtime with injected failures on real files, {runs} runs");
    for s in seed..seed + runs {
        let v = cutline_cli::jobs::drill_run(s)
            .map_err(|e| anyhow::anyhow!("{e}\nreplay with: cutline drill --seed {s} --runs 1 --sim-seeds 0"))?;
        println!("  seed {s}: {v}");
    }
    println!("verdict: PASS");
    Ok(())
}
