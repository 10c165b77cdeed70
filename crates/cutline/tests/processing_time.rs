//! Processing-time timers in the threaded runtime: set per key, checkpointed with the key's state,
//! fired by the task's clock once each, also across a failure and restore.

use cutline::{
    ConnectorResult, FaultPoint, Faults, Job, KeyedProcess, LocalDirStore, MemoryTxnSink, MemoryTxnStore, Output,
    RestartStrategy, RunConfig, Source, SourceStatus,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const N: u64 = 4_000;
const KEYS: u64 = 40;
/// The records are released over this long from the job's start...
const SPREAD_MS: u64 = 300;
/// ...then the source says nothing for this long before it ends: every timer is due well before.
const QUIET_MS: u64 = 700;
/// A key's count closes this long after its first record.
const TIMER_DELAY_MS: u64 = 20;

/// Records `(key, index)` released on a schedule from a fixed instant (so a restored source catches
/// up at once), then quiet, then the end.
#[derive(Clone)]
struct Paced {
    start: Instant,
    next: u64,
}

impl Source for Paced {
    type Item = (u64, u64);
    type Offset = u64;
    fn open(&mut self, _s: u32, _p: u32, offset: Option<u64>) -> ConnectorResult<()> {
        self.next = offset.unwrap_or(0);
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<(u64, u64)>, max: usize) -> ConnectorResult<SourceStatus> {
        let ms = self.start.elapsed().as_millis() as u64;
        let due = (N * ms / SPREAD_MS).min(N);
        while self.next < due && out.len() < max {
            out.push((self.next % KEYS, self.next));
            self.next += 1;
        }
        Ok(if !out.is_empty() {
            SourceStatus::More
        } else if ms >= SPREAD_MS + QUIET_MS {
            SourceStatus::Finished
        } else {
            SourceStatus::Idle
        })
    }
    fn offset(&self) -> u64 {
        self.next
    }
}

/// Per key, the records since its open count; a processing-time timer closes it `TIMER_DELAY_MS`
/// after the count's first record. A count still open at the end of input is reported as such.
struct CountUntilTimer;

impl KeyedProcess<u64, (u64, u64), String> for CountUntilTimer {
    type State = u64;
    fn process(&self, _k: &u64, state: &mut Option<u64>, _r: (u64, u64), out: &mut Output<String>) {
        match state {
            Some(n) => *n += 1,
            None => {
                *state = Some(1);
                out.set_processing_timer(out.processing_time_ms() + TIMER_DELAY_MS);
            }
        }
    }
    fn on_processing_timer(&self, k: &u64, state: &mut Option<u64>, _t: u64, out: &mut Output<String>) {
        if let Some(n) = state.take() {
            out.emit(format!("fired {k} {n}"));
        }
    }
    fn end_of_input(&self, k: &u64, state: &mut Option<u64>, out: &mut Output<String>) {
        if let Some(n) = state.take() {
            out.emit(format!("open {k} {n}"));
        }
    }
}

fn run(fail_at_batch: Option<u64>, unaligned: bool) -> Vec<String> {
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new("processing-time");
    job.source("paced", Paced { start: Instant::now(), next: 0 })
        .key_by(|r: &(u64, u64)| r.0)
        .process_with("counts", CountUntilTimer)
        .sink("out", MemoryTxnSink::new(out.clone()));
    let graph = job.build().expect("valid job");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir.path()).unwrap()), "processing-time-v1");
    cfg.checkpoint.interval_ms = Some(5);
    cfg.checkpoint.unaligned = unaligned;
    cfg.batch_size = 8;
    if let Some(n) = fail_at_batch {
        let count = Arc::new(AtomicU64::new(0));
        cfg.faults =
            Faults::new(move |p| p == FaultPoint::ProcessBatch && count.fetch_add(1, Ordering::SeqCst) + 1 == n);
        cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 };
    }
    let started = Instant::now();
    let report = cutline::run(&graph, cfg).expect("runs");
    assert!(started.elapsed() >= Duration::from_millis(SPREAD_MS + QUIET_MS), "the source ended early");
    if fail_at_batch.is_some() {
        assert!(report.restarts >= 1, "the failure was never injected");
    }
    let rows = out.lock().unwrap().committed_records();
    rows
}

#[test]
fn processing_time_timers_fire_once_each_and_survive_a_restore() {
    for (fail, unaligned) in [(None, false), (Some(150), false), (Some(400), true)] {
        let what = format!("failure at batch {fail:?}, unaligned {unaligned}");
        let rows = run(fail, unaligned);
        let mut total = 0;
        for r in &rows {
            let mut f = r.split(' ');
            let (kind, n) = (f.next().unwrap(), f.nth(1).unwrap().parse::<u64>().unwrap());
            assert_eq!(kind, "fired", "{what}: a count was still open at the end, its timer never fired: {r}");
            total += n;
        }
        assert_eq!(total, N, "{what}: every record counted exactly once");
        assert!(rows.len() as u64 > 2 * KEYS, "{what}: {} counts closed: the timers hardly ran", rows.len());
    }
}
