//! `cutline bench`, `cutline bench-backlog` and `cutline bench-coordinator`.

use crate::args::{build_job, ms_flag, open_store, parse_interval};
use anyhow::{bail, Context, Result};
use cutline::admin;
use cutline::cluster::ClusterConfig;
use cutline::{CheckpointConfig, LocalDirStore, RunConfig};
use cutline_cli::tally::{read_tallies, BENCH_MAX_KEYS};
use std::sync::Arc;
use std::time::Instant;

pub(crate) fn bench_coordinator(tasks: u32, workers: &str, checkpoints: u32) -> Result<()> {
    use cutline::testing::coordbench::{coordinator_bench, CoordBench, CoordBenchResult};
    if tasks == 0 || checkpoints == 0 {
        bail!("--tasks and --checkpoints must be positive");
    }
    let counts = workers
        .split(',')
        .map(|w| w.trim().parse::<u32>().with_context(|| format!("--workers: {w:?} is not a number")))
        .collect::<Result<Vec<_>>>()?;
    println!("{}", CoordBenchResult::header());
    for w in counts {
        println!("{}", coordinator_bench(&CoordBench { tasks, workers: w, checkpoints }));
    }
    Ok(())
}

pub(crate) struct BenchArgs {
    pub(crate) events: u64,
    pub(crate) keys: u64,
    pub(crate) hot_keys: u64,
    pub(crate) full_checkpoints: bool,
    pub(crate) parallelism: u32,
    pub(crate) interval: String,
    pub(crate) max_concurrent: usize,
    pub(crate) checkpoint_timeout: String,
    pub(crate) workers: usize,
    pub(crate) state: Option<String>,
    pub(crate) kill_worker_after: Option<String>,
    pub(crate) channel_capacity: usize,
    pub(crate) frame_protection: cutline::cluster::FrameProtection,
    pub(crate) scrape_every: Option<String>,
    pub(crate) state_backend: crate::args::StateBackendArgs,
}

pub(crate) fn bench(a: &BenchArgs) -> Result<()> {
    let (events, keys, parallelism, interval, max_concurrent) =
        (a.events, a.keys, a.parallelism, a.interval.as_str(), a.max_concurrent);
    let interval_ms = parse_interval(interval)?;
    if keys == 0 || parallelism == 0 {
        bail!("--keys and --parallelism must be positive");
    }
    if keys > BENCH_MAX_KEYS {
        bail!("--keys {keys}: the benchmark checks the final value of every key and keeps at most {BENCH_MAX_KEYS}");
    }
    let dir = std::env::temp_dir().join(format!(
        "cutline-bench-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos()
    ));
    let state = a.state.clone().unwrap_or_else(|| dir.display().to_string());
    let store = open_store(&state).map_err(anyhow::Error::msg)?;
    // The sink reports what it received here (also from worker processes: they run on this machine).
    let tally_dir = dir.join("tally");
    std::fs::create_dir_all(&tally_dir)?;
    if a.hot_keys > keys {
        bail!("--hot-keys {} is more than --keys {keys}: the hot keys are some of the keys", a.hot_keys);
    }
    let hot = a.hot_keys.to_string();
    let job_args: Vec<String> =
        ["bench", "--events", &events.to_string(), "--keys", &keys.to_string(), "--hot-keys", &hot]
            .iter()
            .map(|s| s.to_string())
            .chain(["--parallelism".to_string(), parallelism.to_string()])
            .chain(["--tally-dir".to_string(), tally_dir.display().to_string()])
            .collect();
    let (graph, fingerprint) = build_job(&job_args).map_err(anyhow::Error::msg)?;
    let scrape_every = a.scrape_every.as_deref().map(|d| ms_flag("scrape-every", d)).transpose()?;
    let mut cfg = RunConfig::new(store.clone(), fingerprint);
    cfg.checkpoint.interval_ms = interval_ms;
    cfg.checkpoint.max_concurrent = max_concurrent;
    cfg.checkpoint.timeout_ms = cutline::admin::parse_duration_ms(&a.checkpoint_timeout)
        .map_err(|e| anyhow::anyhow!("--checkpoint-timeout: bad duration {:?}: {e}", a.checkpoint_timeout))?;
    cfg.checkpoint.validate().map_err(anyhow::Error::msg)?;
    cfg.restart = cutline::RestartStrategy::None;
    cfg.incremental_checkpoints = !a.full_checkpoints;
    cfg.state_backend = a.state_backend.backend()?;
    if a.channel_capacity == 0 {
        bail!("--channel-capacity must be at least 1");
    }
    cfg.channel_capacity = a.channel_capacity;
    let start = Instant::now();
    let mut recovery = String::new();
    let mut scraped = String::new();
    let report = if a.workers == 0 {
        if a.kill_worker_after.is_some() {
            bail!("--kill-worker-after needs --workers");
        }
        match scrape_every {
            None => cutline::run(&graph, cfg),
            Some(ms) => {
                let handle = cutline::spawn(graph, cfg);
                let scraper = crate::bench_metrics::Scraper::start(
                    handle.control(),
                    store,
                    std::time::Duration::from_millis(ms),
                )?;
                let r = handle.join();
                scraped = scraper.finish()?;
                r
            }
        }
    } else {
        if scrape_every.is_some() {
            bail!("--scrape-every measures a job in one process: leave out --workers");
        }
        use std::process::Command;
        cfg.restart = cutline::RestartStrategy::default();
        std::fs::create_dir_all(&dir)?;
        let secret_file = dir.join("cluster.secret");
        std::fs::write(&secret_file, format!("bench-{}-{}", std::process::id(), start.elapsed().as_nanos()).repeat(2))?;
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
        let mut cluster =
            ClusterConfig::new(&addr, a.workers, std::fs::read(&secret_file)?, job_args.clone(), state.clone());
        cluster.heartbeat_timeout_ms = 2_000;
        cluster.frame_protection = a.frame_protection;
        let handle = cutline::cluster::spawn_cluster(graph, cfg, cluster)?;
        let exe = std::env::current_exe()?;
        let worker = || {
            Command::new(&exe)
                .args(["worker", "--join", &addr, "--secret-file"])
                .arg(&secret_file)
                .args(["--frame-protection", &a.frame_protection.to_string()])
                .stderr(std::process::Stdio::null())
                .spawn()
        };
        let mut children = (0..a.workers).map(|_| worker()).collect::<std::io::Result<Vec<_>>>()?;
        if let Some(after) = &a.kill_worker_after {
            std::thread::sleep(std::time::Duration::from_millis(ms_flag("kill-worker-after", after)?));
            let before = handle.metrics().map(|m| m.generation).unwrap_or_default();
            let killed = Instant::now();
            children[0].kill()?;
            children[0].wait()?;
            children[0] = worker()?;
            // Running again: the coordinator reports a newer generation once every worker deployed it.
            loop {
                match handle.metrics() {
                    Ok(m) if m.generation > before && !m.tasks.is_empty() => break,
                    Err(_) => bail!("the job ended before it recovered"),
                    _ => std::thread::sleep(std::time::Duration::from_millis(1)),
                }
            }
            recovery = format!(" recovery_ms={}", killed.elapsed().as_millis());
        }
        let r = handle.join();
        for c in &mut children {
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            while c.try_wait()?.is_none() && Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        r
    };
    let secs = start.elapsed().as_secs_f64();
    let tally = read_tallies(&tally_dir);
    std::fs::remove_dir_all(&dir).ok();
    let report = report?;
    // No rate for work that was not done: the sink must have received one update per event, and the
    // keyed state it saw must add up to the events.
    let tally = tally.map_err(anyhow::Error::msg)?;
    if let Err(e) = tally.check(events, parallelism) {
        bail!("the benchmark did not do the work it was asked for: {e} (tally {tally:?}); no rate is printed");
    }
    // The final checkpoint at end of input is not a periodic one: leave it out of the statistics.
    let periodic: Vec<&cutline::CheckpointSummary> = report.checkpoints.iter().filter(|c| !c.is_final).collect();
    let col = |f: &dyn Fn(&cutline::CheckpointSummary) -> u64| periodic.iter().map(|c| f(c)).collect::<Vec<u64>>();
    let (d, al, sd) = (col(&|c| c.duration_ms), col(&|c| c.alignment_ms), col(&|c| c.start_delay_ms));
    println!(
        "events={events} keys={keys} backend={} parallelism={parallelism} workers={} interval={interval} max_concurrent={max_concurrent} elapsed_s={secs:.3} events_per_s={:.0} checkpoints={} duration_p50_ms={} duration_max_ms={} alignment_p50_ms={} alignment_max_ms={} start_delay_p50_ms={} start_delay_max_ms={} persist_p50_ms={} encode_p50_us={} write_p50_us={} sync_p50_us={} sync_max_us={} page_copies_p50={} saved_entries_p50={} peak_rss_mb={} state_bytes={} written_p50_bytes={} written_max_bytes={} restarts={} sink_records={} state_count={} verified={}{recovery}{scraped}",
        a.state_backend.state_backend,
        a.workers,
        events as f64 / secs,
        d.len(),
        median(&d),
        max(&d),
        median(&al),
        max(&al),
        median(&sd),
        max(&sd),
        median(&col(&|c| c.persist_ms)),
        median(&col(&|c| c.encode_us)),
        median(&col(&|c| c.write_us)),
        median(&col(&|c| c.sync_us)),
        max(&col(&|c| c.sync_us)),
        median(&col(&|c| c.page_copies)),
        median(&col(&|c| c.saved_entries)),
        // Of this process: in one process (no --workers) the job's own peak.
        cutline_cli::jobs::peak_rss_bytes().map(|b| b >> 20).unwrap_or(0),
        report.checkpoints.last().map(|c| c.bytes).unwrap_or(0),
        median(&col(&|c| c.bytes)),
        max(&col(&|c| c.bytes)),
        report.restarts,
        tally.records,
        if tally.state_complete { tally.state_count.to_string() } else { "unknown".into() },
        // After a restore the per-key table of the sink started over: only the updates are checked.
        if tally.state_complete { "sink+state" } else { "sink" },
    );
    Ok(())
}

/// Run `graph` once to its end with checkpoints every `interval_ms` (`None`: only the final one),
/// its checkpoints in a fresh directory that is removed afterwards; the seconds it took. A run that
/// restarted is no measurement: an error, and no rate is printed.
pub(crate) fn timed_engine_run(graph: &cutline::JobGraph, name: &str, interval_ms: Option<u64>) -> Result<f64> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
    let dir = std::env::temp_dir().join(format!("cutline-bench-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(&dir)?), format!("{name} {stamp}"));
    cfg.checkpoint.interval_ms = interval_ms;
    let start = Instant::now();
    let report = cutline::run(graph, cfg);
    let secs = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    let report = report.map_err(|e| anyhow::anyhow!("{e}"))?;
    if report.restarts > 0 {
        bail!("the benchmark job restarted {} times: no rate printed", report.restarts);
    }
    Ok(secs)
}

/// Run `reps` pairs of measurements of the engine and of a bare loop, alternating which goes first,
/// print each pair (after `label`, rates in `unit`s per second) and the medians. Each closure gets the
/// repetition and returns a rate only after checking the work was done.
#[cfg(any(feature = "kafka", feature = "postgres"))]
pub(crate) fn interleaved_pairs(
    reps: u32,
    unit: &str,
    label: &str,
    mut engine: impl FnMut(u32) -> Result<f64>,
    mut bare: impl FnMut(u32) -> Result<f64>,
) -> Result<()> {
    if reps == 0 {
        bail!("--reps must be at least 1");
    }
    let (mut e, mut b) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let (x, y) = if rep % 2 == 0 {
            let x = engine(rep)?;
            (x, bare(rep)?)
        } else {
            let y = bare(rep)?;
            (engine(rep)?, y)
        };
        println!(
            "rep={rep} {label} engine_{unit}_per_s={x:.0} bare_{unit}_per_s={y:.0} ratio={:.3} verified=both",
            x / y
        );
        e.push(x);
        b.push(y);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (me, mb) = (median(&mut e), median(&mut b));
    println!(
        "median engine_{unit}_per_s={me:.0} bare_{unit}_per_s={mb:.0} ratio={:.3} (over {reps} interleaved pairs)",
        me / mb
    );
    Ok(())
}

/// The median (the upper one of an even count; 0 for none).
fn median(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The maximum (0 for none). With a handful of checkpoints a high percentile is the maximum: it is
/// reported as what it is.
fn max(v: &[u64]) -> u64 {
    v.iter().copied().max().unwrap_or(0)
}

pub(crate) fn bench_backlog(
    mode: &str,
    alignment_timeout: &str,
    seconds: u64,
    slow_rate: u64,
    channel_capacity: usize,
    batch_size: usize,
    interval: &str,
) -> Result<()> {
    if seconds == 0 || slow_rate == 0 || channel_capacity == 0 || batch_size == 0 {
        bail!("--seconds, --slow-rate, --channel-capacity and --batch-size must be positive");
    }
    let mut checkpoint = CheckpointConfig { interval_ms: parse_interval(interval)?, ..Default::default() };
    match mode {
        "aligned" => {}
        "unaligned" => checkpoint.unaligned = true,
        "timeout" => {
            checkpoint.alignment_timeout_ms = Some(
                admin::parse_duration_ms(alignment_timeout)
                    .map_err(|e| anyhow::anyhow!("--alignment-timeout {alignment_timeout:?}: {e}"))?,
            )
        }
        other => bail!("unknown --mode {other:?}: use aligned, unaligned or timeout"),
    }
    let dir = std::env::temp_dir().join(format!("cutline-bench-backlog-{}", std::process::id()));
    let store = Arc::new(LocalDirStore::open(&dir)?);
    let b = cutline_cli::jobs::BacklogBench {
        seconds,
        slow_records_per_s: slow_rate,
        channel_capacity,
        batch_size,
        checkpoint,
    };
    let r = cutline_cli::jobs::backlog_bench(&b, store);
    std::fs::remove_dir_all(&dir).ok();
    let r = r.map_err(anyhow::Error::msg)?;
    let pct = |mut v: Vec<u64>, p: f64| -> u64 {
        if v.is_empty() {
            return 0;
        }
        v.sort_unstable();
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    let col = |f: &dyn Fn(&cutline::CheckpointSummary) -> u64| r.checkpoints.iter().map(f).collect::<Vec<u64>>();
    println!(
        "mode={mode} seconds={seconds} backlog_s={:.1} checkpoints={} failed={} duration_p50_ms={} duration_max_ms={} start_delay_p50_ms={} in_flight_bytes_p50={} switched_tasks_max={} channel_high_water={}/{} source_backpressured_ms={} records={} records_per_s={:.0} peak_rss_mib={:.1}",
        r.backlog_s,
        r.checkpoints.len(),
        r.failed,
        pct(col(&|c| c.duration_ms), 0.5),
        pct(col(&|c| c.duration_ms), 1.0),
        pct(col(&|c| c.start_delay_ms), 0.5),
        pct(col(&|c| c.channel_state_bytes), 0.5),
        pct(col(&|c| c.switched_tasks as u64), 1.0),
        r.high_water_batches,
        r.capacity_batches,
        r.source_backpressured_ms,
        r.records_processed,
        r.records_processed as f64 / seconds as f64,
        r.peak_rss_bytes.unwrap_or(0) as f64 / (1024.0 * 1024.0),
    );
    Ok(())
}
