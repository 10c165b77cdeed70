//! The `cutline` command: run the word-count job, list checkpoints, run failure drills and benchmarks.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use cutline::{CheckpointMode, CheckpointStore, LocalDirStore, RunConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "cutline", version, about = "A stream-processing engine whose checkpoints are consistent cuts")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a job.
    Run {
        #[command(subcommand)]
        job: RunJob,
    },
    /// Word count over a bundled text with one injected crash: shows a checkpoint, a failure, a restore
    /// and checks the output.
    Demo {
        /// Where to put the demo's input, output and state (default: a fresh temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// List the complete checkpoints of a state directory and verify them.
    Checkpoints {
        #[arg(long)]
        state: PathBuf,
    },
    /// Failure drill: run word count while injecting failures, restore, compare with a failure-free run.
    Drill {
        /// Seed of the first run (each run uses seed, seed+1, ...).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Number of drill runs.
        #[arg(long, default_value_t = 5)]
        runs: u64,
        /// Number of simulated seeds run first (deterministic protocol simulation).
        #[arg(long, default_value_t = 200)]
        sim_seeds: u64,
    },
    /// The keyed COUNT+SUM benchmark.
    Bench {
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        #[arg(long, default_value_t = 1)]
        parallelism: u32,
        /// Checkpoint interval (e.g. 100ms, 1s) or `off`.
        #[arg(long, default_value = "1s")]
        checkpoint_interval: String,
        /// Checkpoints in flight at once.
        #[arg(long, default_value_t = 1)]
        max_concurrent: usize,
    },
}

#[derive(Subcommand)]
enum RunJob {
    /// Count words of a text file; every count update goes to DIR through the transactional file sink.
    Wordcount {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        output: PathBuf,
        #[arg(long)]
        state: PathBuf,
        #[arg(long, default_value_t = 1)]
        parallelism: u32,
        /// Checkpoint interval (e.g. 200ms, 1s) or `off`.
        #[arg(long, default_value = "200ms")]
        checkpoint_interval: String,
        #[arg(long, default_value = "exactly-once")]
        mode: String,
        /// Print a line per checkpoint and failure.
        #[arg(long, short)]
        verbose: bool,
    },
}

/// `200ms`, `1s`, `2m`, or `off` (None).
fn parse_interval(s: &str) -> Result<Option<u64>> {
    if s == "off" {
        return Ok(None);
    }
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else {
        bail!("bad duration {s:?}: use a number with ms, s or m (e.g. 200ms, 1s), or off");
    };
    let n: u64 = num.parse().with_context(|| format!("bad duration {s:?}: use e.g. 200ms, 1s, or off"))?;
    if n == 0 {
        bail!("bad duration {s:?}: must be positive (or off)");
    }
    match n.checked_mul(mult) {
        Some(ms) if ms <= 365 * 86_400_000 => Ok(Some(ms)),
        _ => bail!("bad duration {s:?}: at most a year"),
    }
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Run {
            job: RunJob::Wordcount { input, output, state, parallelism, checkpoint_interval, mode, verbose },
        } => run_wordcount(&input, &output, &state, parallelism, &checkpoint_interval, &mode, verbose),
        Cmd::Demo { dir } => demo(dir),
        Cmd::Checkpoints { state } => list_checkpoints(&state),
        Cmd::Drill { seed, runs, sim_seeds } => drill(seed, runs, sim_seeds),
        Cmd::Bench { events, keys, parallelism, checkpoint_interval, max_concurrent } => {
            bench(events, keys, parallelism, &checkpoint_interval, max_concurrent)
        }
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn check_writable_dir(dir: &Path, what: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {what} directory {}", dir.display()))?;
    let probe = dir.join(format!(".cutline-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("{what} directory {} is not writable", dir.display()))?;
    std::fs::remove_file(&probe).ok();
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn wordcount_config(
    input: &Path,
    output: &Path,
    state: &Path,
    parallelism: u32,
    interval: &str,
    mode: &str,
    line_delay_us: u64,
) -> Result<(cutline::JobGraph, RunConfig)> {
    let interval_ms = parse_interval(interval)?;
    let mode: CheckpointMode = mode.parse().map_err(anyhow::Error::msg)?;
    if parallelism == 0 {
        bail!("--parallelism must be at least 1");
    }
    let meta = std::fs::metadata(input).with_context(|| format!("cannot read input {}", input.display()))?;
    if !meta.is_file() {
        bail!(
            "input {} is not a regular file (a directory, pipe or device): the source rewinds it by byte offset after a failure, so it must be a file",
            input.display()
        );
    }
    std::fs::File::open(input).with_context(|| format!("cannot read input {}", input.display()))?;
    let input_abs = std::fs::canonicalize(input)?;
    // The output's absolute path names the job: refuse another job's state before creating anything.
    let output_abs = std::path::absolute(output)
        .with_context(|| format!("cannot make output path {} absolute", output.display()))?;
    let fingerprint = format!("wordcount input={} output={}", input_abs.display(), output_abs.display());
    if state.join("job.meta").exists() {
        let store = LocalDirStore::open_existing(state)
            .with_context(|| format!("cannot open state directory {}", state.display()))?;
        if let Some(m) = store.read_meta()? {
            if m.job_fingerprint != fingerprint {
                bail!(
                    "the state directory {} belongs to job {:?}, not {:?}: use another --state directory",
                    state.display(),
                    m.job_fingerprint,
                    fingerprint
                );
            }
        }
    }
    // Build (and so validate) the job before creating any directory.
    let graph = cutline::jobs::wordcount_paced(
        &input_abs,
        parallelism,
        cutline::jobs::wordcount_file_sink(&output_abs),
        line_delay_us,
    )
    .build()?;
    check_writable_dir(output, "output")?;
    check_writable_dir(state, "state")?;
    let store = Arc::new(
        LocalDirStore::open(state).with_context(|| format!("cannot open state directory {}", state.display()))?,
    );
    let mut cfg = RunConfig::new(store, fingerprint);
    cfg.checkpoint.interval_ms = interval_ms;
    cfg.checkpoint.mode = mode;
    Ok((graph, cfg))
}

fn run_wordcount(
    input: &Path,
    output: &Path,
    state: &Path,
    parallelism: u32,
    interval: &str,
    mode: &str,
    verbose: bool,
) -> Result<()> {
    let (graph, mut cfg) = wordcount_config(input, output, state, parallelism, interval, mode, 0)?;
    cfg.verbose = verbose;
    let report = cutline::run(&graph, cfg)?;
    if report.already_finished {
        println!(
            "job already finished (final checkpoint {}); nothing written",
            report.final_checkpoint.map(|c| c.0).unwrap_or(0)
        );
        return Ok(());
    }
    println!(
        "finished: final checkpoint {}, {} checkpoints, {} failed, {} restarts{}",
        report.final_checkpoint.map(|c| c.0).unwrap_or(0),
        report.checkpoints_completed,
        report.checkpoints_failed,
        report.restarts,
        report.restored_from.map(|c| format!(", resumed from checkpoint {}", c.0)).unwrap_or_default()
    );
    Ok(())
}

fn list_checkpoints(state: &Path) -> Result<()> {
    if !state.is_dir() {
        bail!("state directory {} does not exist", state.display());
    }
    if !state.join("job.meta").exists() && !state.join("checkpoints").is_dir() {
        bail!("{} holds no cutline state (no job.meta, no checkpoints/)", state.display());
    }
    let store = LocalDirStore::open_existing(state)?;
    let meta = store.read_meta()?;
    match &meta {
        Some(m) => println!("job: {}\ngeneration: {}", m.job_fingerprint, m.generation.0),
        None => println!("no job has run in {}", state.display()),
    }
    match store.finished() {
        Ok(Some(f)) => println!("finished with checkpoint {}", f.0),
        Ok(None) => {}
        Err(e) => println!("WARNING: the FINISHED marker is damaged ({e}); delete it to let the job resume"),
    }
    println!("{:>8}  {:<24}  {:>12}  {:>5}  {:<6}  verified", "id", "time (UTC)", "bytes", "tasks", "final");
    let mut bad = 0;
    for l in store.list_checkpoints()? {
        if !l.complete {
            continue;
        }
        match store.verify(l.id) {
            Ok(m) => println!(
                "{:>8}  {:<24}  {:>12}  {:>5}  {:<6}  ok",
                l.id.0,
                utc(m.created_at_unix_ms),
                m.total_size_bytes(),
                m.tasks.len(),
                if m.is_final { "yes" } else { "no" }
            ),
            Err(e) => {
                // Retention may remove a checkpoint between the listing and the verification (a job is
                // running): that is not damage.
                let still_there = store.list_checkpoints()?.iter().any(|x| x.id == l.id && x.complete);
                if !still_there {
                    println!("{:>8}  removed by retention while listing", l.id.0);
                    continue;
                }
                bad += 1;
                println!("{:>8}  {:<24}  {:>12}  {:>5}  {:<6}  FAILED: {e}", l.id.0, "?", "?", "?", "?");
            }
        }
    }
    if bad > 0 {
        bail!("{bad} checkpoint(s) failed verification");
    }
    Ok(())
}

/// `2026-11-29T19:45:33.123Z` from milliseconds since the Unix epoch (proleptic Gregorian, UTC).
fn utc(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(super::utc(1_795_980_486_035), "2026-11-29T19:28:06.035Z");
    }
}

/// The text the demo counts.
const DEMO_TEXT: &str = include_str!("../../../../data/demo.txt");

fn demo(dir: Option<PathBuf>) -> Result<()> {
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
    let (graph, mut cfg) = wordcount_config(&input, &output, &state, 2, "50ms", "exactly-once", 200)?;
    cfg.verbose = true;
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
    let problems = cutline::jobs::check_wordcount_output(&text, &output)?;
    if problems.is_empty() {
        println!("output verified: every word's counts 1..n appear exactly once, as in a run without failures");
        Ok(())
    } else {
        bail!("output differs from a failure-free run: {}", problems.join("; "))
    }
}

fn drill(seed: u64, runs: u64, sim_seeds: u64) -> Result<()> {
    println!("drill 1/2: deterministic simulation, seeds {seed}..{}", seed + sim_seeds);
    for s in seed..seed + sim_seeds {
        if let Err(e) = cutline::sim::run_seed(s, &cutline::sim::SimOptions::default()) {
            bail!("simulation seed {s} FAILED: {e}\nreplay with: cutline drill --seed {s} --sim-seeds 1 --runs 0");
        }
    }
    println!("  {sim_seeds} seeds passed");
    println!("drill 2/2: threaded runtime with injected failures on real files, {runs} runs");
    for s in seed..seed + runs {
        let v = cutline::jobs::drill_run(s)
            .map_err(|e| anyhow::anyhow!("{e}\nreplay with: cutline drill --seed {s} --runs 1 --sim-seeds 0"))?;
        println!("  seed {s}: {v}");
    }
    println!("verdict: PASS");
    Ok(())
}

fn bench(events: u64, keys: u64, parallelism: u32, interval: &str, max_concurrent: usize) -> Result<()> {
    let interval_ms = parse_interval(interval)?;
    if keys == 0 || parallelism == 0 {
        bail!("--keys and --parallelism must be positive");
    }
    let dir = std::env::temp_dir().join(format!(
        "cutline-bench-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    let store = Arc::new(LocalDirStore::open(&dir)?);
    let graph = cutline::jobs::keyed_bench(events, keys, parallelism).build()?;
    let mut cfg = RunConfig::new(store, "bench");
    cfg.checkpoint.interval_ms = interval_ms;
    cfg.checkpoint.max_concurrent = max_concurrent;
    cfg.checkpoint.validate().map_err(anyhow::Error::msg)?;
    cfg.restart = cutline::RestartStrategy::None;
    let start = Instant::now();
    let report = cutline::run(&graph, cfg);
    let secs = start.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&dir).ok();
    let report = report?;
    let pct = |v: &[u64], p: f64| -> u64 {
        if v.is_empty() {
            return 0;
        }
        let mut v = v.to_vec();
        v.sort_unstable();
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    // The final checkpoint at end of input is not a periodic one: leave it out of the statistics.
    let periodic: Vec<&cutline::CheckpointSummary> = report.checkpoints.iter().filter(|c| !c.is_final).collect();
    let col = |f: &dyn Fn(&cutline::CheckpointSummary) -> u64| periodic.iter().map(|c| f(c)).collect::<Vec<u64>>();
    let d = col(&|c| c.duration_ms);
    println!(
        "events={events} keys={keys} parallelism={parallelism} interval={interval} max_concurrent={max_concurrent} elapsed_s={secs:.3} events_per_s={:.0} checkpoints={} duration_p50_ms={} duration_p99_ms={} alignment_p99_ms={} start_delay_p99_ms={} persist_p50_ms={} encode_p50_us={} write_p50_us={} state_bytes={}",
        events as f64 / secs,
        d.len(),
        pct(&d, 0.5),
        pct(&d, 0.99),
        pct(&col(&|c| c.alignment_ms), 0.99),
        pct(&col(&|c| c.start_delay_ms), 0.99),
        pct(&col(&|c| c.persist_ms), 0.5),
        pct(&col(&|c| c.encode_us), 0.5),
        pct(&col(&|c| c.write_us), 0.5),
        report.checkpoints.last().map(|c| c.bytes).unwrap_or(0),
    );
    Ok(())
}
