//! The hooks around a job's life that connectors and operators see: end of input (keyed operators and
//! sinks), close, checkpoint-complete notifications to sources, sources and sinks built by factories,
//! and the failure-rate restart strategy. Each scenario runs the threaded runtime on a real state
//! directory and checks what the hook saw and what was committed.

use cutline::{
    CheckpointId, FaultPoint, Faults, GeneratorSource, Job, KeyedProcess, LocalDirStore, MemoryTxnSink, MemoryTxnStore,
    Output, RestartStrategy, RunConfig, RunError, Sink, SinkContext, Source, SourceStatus,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const RECORDS: u64 = 5_000;
const KEYS: u64 = 7;

fn config(dir: &std::path::Path, interval_ms: Option<u64>) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), "hooks-v1");
    cfg.checkpoint.interval_ms = interval_ms;
    cfg.batch_size = 64;
    cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 5 };
    cfg
}

/// Fails the `n`-th time the run reaches `point`.
fn fail_nth(point: FaultPoint, n: u64) -> Faults {
    let count = Arc::new(AtomicU64::new(0));
    Faults::new(move |p| p == point && count.fetch_add(1, Ordering::SeqCst) + 1 == n)
}

/// Sums per key and emits `key=total` only at the end of the input.
struct Totals;

impl KeyedProcess<u64, u64, String> for Totals {
    type State = u64;
    fn process(&self, _key: &u64, state: &mut Option<u64>, record: u64, _out: &mut Output<String>) {
        *state.get_or_insert(0) += record;
    }
    fn end_of_input(&self, key: &u64, state: &mut Option<u64>, out: &mut Output<String>) {
        out.emit(format!("{key}={}", state.unwrap_or(0)));
    }
}

fn expected_totals() -> Vec<String> {
    let mut per_key: BTreeMap<u64, u64> = BTreeMap::new();
    for i in 0..RECORDS {
        *per_key.entry(i % KEYS).or_default() += i;
    }
    per_key.iter().map(|(k, t)| format!("{k}={t}")).collect()
}

fn run_totals(dir: &std::path::Path, interval_ms: Option<u64>, faults: Faults) -> (Vec<String>, u32) {
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new("totals");
    job.set_parallelism(2);
    job.source("numbers", GeneratorSource::new(RECORDS, |i| i))
        .key_by(|i: &u64| i % KEYS)
        .process_with("totals", Totals)
        .sink_with_parallelism("out", 1, MemoryTxnSink::new(out.clone()));
    let graph = job.build().unwrap();
    let mut cfg = config(dir, interval_ms);
    cfg.faults = faults;
    let report = cutline::run(&graph, cfg).unwrap();
    let mut committed = out.lock().unwrap().committed_records();
    committed.sort();
    (committed, report.restarts)
}

#[test]
fn end_of_input_results_are_committed_once() {
    let dir = tempfile::tempdir().unwrap();
    let (committed, restarts) = run_totals(dir.path(), Some(5), Faults::none());
    assert_eq!(restarts, 0);
    assert_eq!(committed, expected_totals());
}

#[test]
fn end_of_input_results_are_committed_once_when_the_job_fails_before_its_final_checkpoint() {
    // No periodic checkpoints: the only one is the final one; its first prepare fails, the job starts
    // over from nothing and the end of input comes again.
    let dir = tempfile::tempdir().unwrap();
    let (committed, restarts) = run_totals(dir.path(), None, fail_nth(FaultPoint::SinkPrepare, 1));
    assert_eq!(restarts, 1, "the injected failure must have happened");
    assert_eq!(committed, expected_totals());
}

#[test]
fn end_of_input_runs_once_when_the_final_checkpoint_is_restored_regression_doubled_totals() {
    // The final checkpoint completes, then its commit fails: the job restores that checkpoint, whose
    // state already went through the end of input. Running the hook again would emit every total twice.
    let dir = tempfile::tempdir().unwrap();
    let (committed, restarts) = run_totals(dir.path(), None, fail_nth(FaultPoint::SinkCommit, 1));
    assert_eq!(restarts, 1, "the injected failure must have happened");
    assert_eq!(committed, expected_totals());
}

/// Records every call a sink gets, per incarnation. Not `Clone`: built by a factory.
struct Journal {
    log: Arc<Mutex<Vec<String>>>,
    _file: std::fs::File,
    buffered: Vec<u64>,
    inner: MemoryTxnSink,
}

impl Journal {
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }
}

impl Sink<u64> for Journal {
    type Committable = String;
    fn open(&mut self, ctx: &SinkContext) -> cutline::ConnectorResult<()> {
        self.note(format!("open gen={}", ctx.incarnation >> 32));
        Sink::<u64>::open(&mut self.inner, ctx)
    }
    fn recover(&mut self, to_commit: &[String]) -> cutline::ConnectorResult<()> {
        Sink::<u64>::recover(&mut self.inner, to_commit)
    }
    fn write(&mut self, item: u64) -> cutline::ConnectorResult<()> {
        // Holds records back until the end of input, which must flush them into the final transaction.
        self.buffered.push(item);
        Ok(())
    }
    fn end_of_input(&mut self) -> cutline::ConnectorResult<()> {
        self.note("end_of_input".into());
        for i in self.buffered.drain(..) {
            Sink::<u64>::write(&mut self.inner, i)?;
        }
        Ok(())
    }
    fn prepare(&mut self, checkpoint: CheckpointId) -> cutline::ConnectorResult<Option<String>> {
        self.note(format!("prepare {checkpoint}"));
        Sink::<u64>::prepare(&mut self.inner, checkpoint)
    }
    fn commit(&mut self, committables: &[String]) -> cutline::ConnectorResult<()> {
        Sink::<u64>::commit(&mut self.inner, committables)
    }
    fn close(&mut self) -> cutline::ConnectorResult<()> {
        self.note("close".into());
        Ok(())
    }
    fn abort(&mut self) {
        self.note("abort".into());
    }
}

#[test]
fn a_sink_built_by_a_factory_flushes_at_end_of_input_and_closes_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let job = Job::new("journal");
    let (log2, out2) = (log.clone(), out.clone());
    job.source("numbers", GeneratorSource::new(RECORDS, |i| i)).sink_from("journal", move |ctx| Journal {
        log: log2.clone(),
        _file: std::fs::File::create(scratch.join(format!("sink-{}", ctx.subtask))).unwrap(),
        buffered: Vec::new(),
        inner: MemoryTxnSink::new(out2.clone()),
    });
    let graph = job.build().unwrap();
    let mut cfg = config(&dir.path().join("state"), None);
    // The first incarnation fails at its first prepare (the final checkpoint's): it must be aborted,
    // never closed, and the second must flush everything.
    cfg.faults = fail_nth(FaultPoint::SinkPrepare, 1);
    let report = cutline::run(&graph, cfg).unwrap();
    assert_eq!(report.restarts, 1);
    let log = log.lock().unwrap().clone();
    let calls: Vec<&str> = log.iter().map(|s| s.split(' ').next().unwrap()).collect();
    assert_eq!(calls, ["open", "end_of_input", "abort", "open", "end_of_input", "prepare", "close"], "{log:?}");
    let mut committed: Vec<u64> = out.lock().unwrap().committed_records().iter().map(|s| s.parse().unwrap()).collect();
    committed.sort();
    assert_eq!(committed, (0..RECORDS).collect::<Vec<_>>());
}

/// Counts up to `end`, recording the checkpoint notifications it gets. Not `Clone`.
struct Counter {
    next: u64,
    end: u64,
    notified: Arc<Mutex<Vec<(CheckpointId, u64)>>>,
    closed: Arc<AtomicU64>,
}

impl Source for Counter {
    type Item = u64;
    type Offset = u64;
    fn open(&mut self, _subtask: u32, _parallelism: u32, restored: Option<u64>) -> cutline::ConnectorResult<()> {
        self.next = restored.unwrap_or(0);
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<u64>, max: usize) -> cutline::ConnectorResult<SourceStatus> {
        if self.next == self.end {
            return Ok(SourceStatus::Finished);
        }
        let n = (max as u64).min(self.end - self.next).min(50);
        out.extend(self.next..self.next + n);
        self.next += n;
        std::thread::sleep(std::time::Duration::from_micros(200));
        Ok(SourceStatus::More)
    }
    fn offset(&self) -> u64 {
        self.next
    }
    fn checkpoint_complete(&mut self, checkpoint: CheckpointId, offset: &u64) -> cutline::ConnectorResult<()> {
        self.notified.lock().unwrap().push((checkpoint, *offset));
        Ok(())
    }
    fn close(&mut self) -> cutline::ConnectorResult<()> {
        self.closed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn a_source_is_told_the_offsets_that_completed_checkpoints_hold() {
    let dir = tempfile::tempdir().unwrap();
    let notified = Arc::new(Mutex::new(Vec::new()));
    let closed = Arc::new(AtomicU64::new(0));
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new("counter");
    let (n2, c2) = (notified.clone(), closed.clone());
    job.source_from("counter", move |_ctx| Counter { next: 0, end: RECORDS, notified: n2.clone(), closed: c2.clone() })
        .sink("out", MemoryTxnSink::new(out.clone()));
    let graph = job.build().unwrap();
    let report = cutline::run(&graph, config(dir.path(), Some(2))).unwrap();
    let notified = notified.lock().unwrap().clone();
    assert!(notified.len() >= 2, "periodic checkpoints and the final one: {notified:?}");
    assert!(notified.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "in order: {notified:?}");
    assert_eq!(notified.last().copied(), Some((report.final_checkpoint.unwrap(), RECORDS)));
    // Every notified offset is the one its checkpoint recorded.
    let store = LocalDirStore::open(dir.path()).unwrap();
    let (id, offset) = notified[notified.len() - 1];
    assert!(cutline::CheckpointStore::verify(&store, id).is_ok());
    assert_eq!(offset, RECORDS);
    assert_eq!(closed.load(Ordering::SeqCst), 1, "closed once, at the end");
    assert_eq!(out.lock().unwrap().committed_records().len() as u64, RECORDS);
}

/// A source that fails at every poll.
#[derive(Clone)]
struct Broken;

impl Source for Broken {
    type Item = u64;
    type Offset = ();
    fn open(&mut self, _: u32, _: u32, _: Option<()>) -> cutline::ConnectorResult<()> {
        Ok(())
    }
    fn poll(&mut self, _out: &mut Vec<u64>, _max: usize) -> cutline::ConnectorResult<SourceStatus> {
        Err("the input is broken".into())
    }
    fn offset(&self) {}
}

#[test]
fn the_failure_rate_strategy_gives_up_when_failures_crowd_together() {
    let dir = tempfile::tempdir().unwrap();
    let job = Job::new("broken");
    job.source("broken", Broken).sink("out", MemoryTxnSink::new(Default::default()));
    let graph = job.build().unwrap();
    let mut cfg = config(dir.path(), Some(10));
    cfg.restart = RestartStrategy::FailureRate { max_failures: 3, interval_ms: 60_000, delay_ms: 1 };
    // The strategy alone decides here (the same failure repeating would end the run after 3).
    cfg.max_repeated_failures = None;
    match cutline::run(&graph, cfg) {
        Err(RunError::GaveUp { attempts, last, .. }) => {
            assert_eq!(attempts, 3, "three restarts, the fourth failure within the minute gives up");
            assert!(last.contains("the input is broken"), "{last}");
        }
        other => panic!("expected the strategy to give up, got {other:?}"),
    }
    let mut bad = config(dir.path(), Some(10));
    bad.restart = RestartStrategy::FailureRate { max_failures: 3, interval_ms: 0, delay_ms: 1 };
    let job = Job::new("broken");
    job.source("broken", Broken).sink("out", MemoryTxnSink::new(Default::default()));
    assert!(matches!(cutline::run(&job.build().unwrap(), bad), Err(RunError::Config(_))));
}
