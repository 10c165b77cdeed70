//! `cutline bench timers`: how long checkpoints take while a keyed operator holds many pending
//! event-time timers, and while one watermark makes all of them due at once (they fire one batch
//! per task step, so barriers keep passing).
//!
//! The job: a source sends one record per key, each setting a timer at [`FIRE_AT`]; it then waits
//! [`HOLD_MS`] (checkpoints with every timer pending), sends one record whose watermark passes
//! [`FIRE_AT`], and waits until every timer fired before it ends. The sink notes when each
//! checkpoint's barrier reached it, which tells the checkpoints taken while the timers fired.

use anyhow::{bail, Result};
use cutline::{
    CheckpointId, ConnectorResult, EventTime, Job, KeyedProcess, LocalDirStore, Output, RunConfig, Sink, SinkContext,
    Source, SourceStatus, WatermarkStrategy,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Event time of every timer.
const FIRE_AT: i64 = 1_000;
/// How long the source waits with every timer set.
const HOLD_MS: u64 = 3_000;
/// How long it waits after the last timer fired.
const TAIL_MS: u64 = 1_000;

/// Progress shared by the job's parts: timers fired, and when (ms since the job's start) the first
/// and the last fired.
#[derive(Default)]
struct Progress {
    fired: AtomicU64,
    first_ms: AtomicU64,
    last_ms: AtomicU64,
}

#[derive(Clone)]
struct Load {
    timers: u64,
    next: u64,
    start: Instant,
    held_since: Option<Instant>,
    progress: Arc<Progress>,
}

impl Source for Load {
    type Item = (u64, i64);
    type Offset = u64;
    fn open(&mut self, _s: u32, _p: u32, offset: Option<u64>) -> ConnectorResult<()> {
        self.next = offset.unwrap_or(0);
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<(u64, i64)>, max: usize) -> ConnectorResult<SourceStatus> {
        if self.next < self.timers {
            let end = self.timers.min(self.next + max as u64);
            out.extend((self.next..end).map(|k| (k, 0)));
            self.next = end;
            return Ok(SourceStatus::More);
        }
        let since = *self.held_since.get_or_insert_with(Instant::now);
        if self.next == self.timers {
            if since.elapsed() < Duration::from_millis(HOLD_MS) {
                return Ok(SourceStatus::Idle);
            }
            // The record whose watermark passes every timer.
            out.push((u64::MAX, FIRE_AT + 1_000));
            self.next += 1;
            return Ok(SourceStatus::More);
        }
        let p = &self.progress;
        let done = p.fired.load(Ordering::SeqCst) == self.timers
            && self.start.elapsed().as_millis() as u64 >= p.last_ms.load(Ordering::SeqCst) + TAIL_MS;
        Ok(if done { SourceStatus::Finished } else { SourceStatus::Idle })
    }
    fn offset(&self) -> u64 {
        self.next
    }
}

struct SetTimer {
    start: Instant,
    progress: Arc<Progress>,
}

impl KeyedProcess<u64, (u64, i64), u64> for SetTimer {
    type State = ();
    fn process(&self, _k: &u64, _s: &mut Option<()>, r: (u64, i64), out: &mut Output<u64>) {
        if r.1 == 0 {
            out.set_timer(EventTime(FIRE_AT));
        }
    }
    fn on_timer(&self, k: &u64, _s: &mut Option<()>, _t: EventTime, out: &mut Output<u64>) {
        let p = &self.progress;
        let now = self.start.elapsed().as_millis() as u64;
        if p.fired.fetch_add(1, Ordering::SeqCst) == 0 {
            p.first_ms.store(now, Ordering::SeqCst);
        }
        p.last_ms.store(now, Ordering::SeqCst);
        out.emit(*k);
    }
}

/// Drops the records; notes when each checkpoint's barrier arrived (ms since the job's start).
#[derive(Clone)]
struct BarrierTimes {
    start: Instant,
    seen: Arc<Mutex<Vec<(CheckpointId, u64)>>>,
}

impl Sink<u64> for BarrierTimes {
    type Committable = ();
    fn open(&mut self, _ctx: &SinkContext) -> ConnectorResult<()> {
        Ok(())
    }
    fn recover(&mut self, _c: &[()]) -> ConnectorResult<()> {
        Ok(())
    }
    fn write(&mut self, item: u64) -> ConnectorResult<()> {
        std::hint::black_box(item);
        Ok(())
    }
    fn committed_after(&mut self, _c: Option<CheckpointId>) -> ConnectorResult<Option<bool>> {
        Ok(Some(false))
    }
    fn prepare(&mut self, c: CheckpointId) -> ConnectorResult<Option<()>> {
        self.seen.lock().expect("barrier times").push((c, self.start.elapsed().as_millis() as u64));
        Ok(None)
    }
    fn commit(&mut self, _c: &[()]) -> ConnectorResult<()> {
        Ok(())
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

pub(crate) fn bench_timers(timers: u64, interval: &str) -> Result<()> {
    if timers == 0 {
        bail!("--timers must be at least 1");
    }
    let Some(interval_ms) = crate::args::parse_interval(interval)? else {
        bail!("--checkpoint-interval must be a duration: the benchmark measures checkpoints")
    };
    let start = Instant::now();
    let progress = Arc::new(Progress::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("bench-timers");
    let load = Load { timers, next: 0, start, held_since: None, progress: progress.clone() };
    job.source("load", load)
        .with_watermarks("load-wm", WatermarkStrategy::bounded_out_of_orderness(0, |r: &(u64, i64)| EventTime(r.1)))
        .key_by(|r: &(u64, i64)| r.0)
        .process_with("timers", SetTimer { start, progress: progress.clone() })
        .sink("out", BarrierTimes { start, seen: seen.clone() });
    let graph = job.build()?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
    let dir = std::env::temp_dir().join(format!("cutline-bench-timers-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(&dir)?), format!("bench-timers {stamp}"));
    cfg.checkpoint.interval_ms = Some(interval_ms);
    let report = cutline::run(&graph, cfg);
    let _ = std::fs::remove_dir_all(&dir);
    let report = report.map_err(|e| anyhow::anyhow!("{e}"))?;
    if report.restarts > 0 {
        bail!("the benchmark job restarted: no figures printed");
    }
    let fired = progress.fired.load(Ordering::SeqCst);
    if fired != timers {
        bail!("{fired} of {timers} timers fired: no figures printed");
    }
    let (first, last) = (progress.first_ms.load(Ordering::SeqCst), progress.last_ms.load(Ordering::SeqCst));
    let arrived: std::collections::HashMap<CheckpointId, u64> =
        seen.lock().expect("barrier times").iter().copied().collect();
    // Checkpoints whose state holds every timer (the largest), and those taken while they fired.
    let periodic: Vec<_> = report.checkpoints.iter().filter(|c| !c.is_final).collect();
    let biggest = periodic.iter().map(|c| c.bytes).max().unwrap_or(0);
    let full: Vec<_> = periodic.iter().filter(|c| c.bytes * 10 >= biggest * 9).collect();
    let pending: Vec<u64> = full.iter().map(|c| c.duration_ms).collect();
    let part = |f: &dyn Fn(&cutline::CheckpointSummary) -> u64| median(full.iter().map(|c| f(c)).collect());
    let during: Vec<u64> = periodic
        .iter()
        .filter(|c| arrived.get(&c.checkpoint).is_some_and(|&t| t >= first && t <= last))
        .map(|c| c.duration_ms)
        .collect();
    if pending.is_empty() || biggest < timers {
        bail!("no checkpoint held the {timers} timers ({biggest} bytes at most): no figures printed");
    }
    println!(
        "timers={timers}: {} checkpoints with every timer pending ({} MB), duration median {} ms, max {} ms (medians: trigger to state handed to the writers {} ms, encode {} ms, write {} ms)",
        pending.len(),
        biggest / 1_000_000,
        median(pending.clone()),
        pending.iter().max().unwrap_or(&0),
        part(&|c| c.duration_ms.saturating_sub(c.persist_ms)),
        part(&|c| c.encode_us / 1000),
        part(&|c| c.write_us / 1000),
    );
    println!(
        "firing all {timers} took {} ms; {} checkpoints completed meanwhile, duration max {} ms",
        last - first,
        during.len(),
        during.iter().max().map(|d| d.to_string()).unwrap_or_else(|| "-".into())
    );
    Ok(())
}
