//! Benchmarks of watching a job: `cutline bench metrics` (how fast the HTTP endpoint answers for a
//! job of many tasks) and the scraper `cutline bench --scrape-every` runs beside the keyed benchmark
//! (what metrics cost a job that is scraped).

use anyhow::{bail, Context, Result};
use cutline::admin::http::HttpServer;
use cutline::admin::{serve_job_http, WebOptions};
use cutline::{CheckpointStore, DiscardSink, GeneratorSource, Job, JobControl, LocalDirStore, RunConfig};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One `GET path` to `addr`: status, body and how long the answer took.
fn get(addr: &str, path: &str) -> Result<(u16, String, Duration)> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").context("an HTTP answer without a head")?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no status")?;
    Ok((status, body.to_string(), took))
}

/// Task series in a `/metrics` body (one `records_in` line per task).
fn task_series(body: &str) -> usize {
    body.lines().filter(|l| l.starts_with("cutline_task_records_in_total{")).count()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Scrapes a job's `/metrics` at an interval, as Prometheus would, checking every answer.
pub(crate) struct Scraper {
    _server: HttpServer,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Vec<Duration>>>>,
}

impl Scraper {
    pub(crate) fn start(control: JobControl, store: Arc<dyn CheckpointStore>, every: Duration) -> Result<Scraper> {
        let server = serve_job_http("127.0.0.1:0", control, store, WebOptions::default())?;
        let addr = server.addr().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || -> Result<Vec<Duration>> {
            let mut took = Vec::new();
            while !stop2.load(Ordering::SeqCst) {
                let (status, body, t) = get(&addr, "/metrics")?;
                if status == 503 && body.contains("the job has ended") {
                    break; // it ended between the last scrape and `finish`
                }
                // A job between generations has no tasks; a running one has every task's series.
                if status != 200 || !body.ends_with("# EOF\n") {
                    bail!("a scrape answered {status}: {}", body.lines().next().unwrap_or_default());
                }
                took.push(t);
                let until = Instant::now() + every;
                while Instant::now() < until && !stop2.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Ok(took)
        });
        Ok(Scraper { _server: server, stop, thread: Some(thread) })
    }

    /// Stop; ` scrapes=N scrape_p50_ms=..` for the benchmark's line.
    pub(crate) fn finish(mut self) -> Result<String> {
        self.stop.store(true, Ordering::SeqCst);
        let mut took =
            self.thread.take().expect("started").join().map_err(|_| anyhow::anyhow!("the scraper panicked"))??;
        took.sort();
        if took.is_empty() {
            return Ok(" scrapes=0".into());
        }
        Ok(format!(
            " scrapes={} scrape_p50_ms={:.2} scrape_max_ms={:.2}",
            took.len(),
            percentile(&took, 0.5),
            percentile(&took, 1.0)
        ))
    }
}

/// `cutline bench metrics`: a job of `tasks` tasks (half sources, half sinks behind a forward
/// edge) with checkpoints every second; once every task took part in a checkpoint, `requests`
/// sequential `GET /metrics` and `GET /api/status`, each checked (every task's series present).
/// The sources trickle, or with `busy` run flat out (every core saturated by the job).
pub(crate) fn bench_metrics(tasks: u32, requests: u32, busy: bool) -> Result<()> {
    if tasks < 2 || !tasks.is_multiple_of(2) || requests == 0 {
        bail!("--tasks must be even and at least 2, --requests positive");
    }
    let half = tasks / 2;
    let dir = std::env::temp_dir().join(format!("cutline-bench-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store: Arc<dyn CheckpointStore> = Arc::new(LocalDirStore::open(&dir)?);
    let job = Job::new("many-tasks");
    job.source_with_parallelism("src", half, GeneratorSource::new(u64::MAX, |i| i))
        .map(move |i: u64| {
            // A trickle: every task is alive and idle most of the time, as in a large job (subtask
            // s reads records s, s + half, s + 2 half, ...: it sleeps at every 16th of its own).
            if !busy && (i / u64::from(half)).is_multiple_of(16) {
                std::thread::sleep(Duration::from_millis(250));
            }
            i
        })
        .forward("sink")
        .sink("out", DiscardSink);
    let mut cfg = RunConfig::new(store.clone(), "bench-metrics");
    cfg.checkpoint.interval_ms = Some(1_000);
    cfg.batch_size = 64;
    let handle = cutline::spawn(job.build()?, cfg);
    let server = serve_job_http("127.0.0.1:0", handle.control(), store, WebOptions::default())?;
    let addr = server.addr().to_string();
    let started = Instant::now();
    // Wait until every task took part in a completed checkpoint.
    loop {
        let m = handle.metrics().map_err(anyhow::Error::msg)?;
        if m.tasks.len() == tasks as usize && m.tasks.iter().all(|t| t.last_checkpoint.is_some()) {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("the job of {tasks} tasks did not complete a checkpoint in 300 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let setup_s = started.elapsed().as_secs_f64();
    let mut measured: Vec<(String, Vec<Duration>, usize)> = Vec::new();
    for path in ["/metrics", "/api/status"] {
        let mut took = Vec::new();
        let mut bytes = 0;
        for _ in 0..requests {
            let (status, body, t) = get(&addr, path)?;
            if status != 200 {
                bail!("GET {path} answered {status}");
            }
            let seen = if path == "/metrics" { task_series(&body) } else { body.matches("\"records_in\":").count() };
            if seen != tasks as usize {
                bail!("GET {path} showed {seen} tasks, the job has {tasks}: no figures printed");
            }
            bytes = body.len();
            took.push(t);
        }
        took.sort();
        measured.push((path.to_string(), took, bytes));
    }
    // Where the time of a scrape goes: the coordinator's answer, and rendering the text.
    let (mut asked, mut rendered) = (Vec::new(), Vec::new());
    for _ in 0..requests {
        let t = Instant::now();
        let m = handle.metrics().map_err(anyhow::Error::msg)?;
        asked.push(t.elapsed());
        let t = Instant::now();
        let text = cutline::admin::prometheus::render(&m);
        rendered.push(t.elapsed());
        if task_series(&text) != tasks as usize {
            bail!("a rendering showed {} tasks, the job has {tasks}", task_series(&text));
        }
    }
    asked.sort();
    rendered.sort();
    drop(server);
    handle.stop();
    let _ = handle.join();
    std::fs::remove_dir_all(&dir).ok();
    println!(
        "tasks={tasks} busy={busy} part=coordinator_answer p50_ms={:.2} p99_ms={:.2} part=render p50_ms={:.2} p99_ms={:.2}",
        percentile(&asked, 0.5),
        percentile(&asked, 0.99),
        percentile(&rendered, 0.5),
        percentile(&rendered, 0.99)
    );
    for (path, took, bytes) in measured {
        println!(
            "tasks={tasks} busy={busy} path={path} requests={requests} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} bytes={bytes} setup_s={setup_s:.1}",
            percentile(&took, 0.5),
            percentile(&took, 0.99),
            percentile(&took, 1.0)
        );
    }
    Ok(())
}
