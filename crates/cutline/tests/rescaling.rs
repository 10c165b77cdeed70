//! Rescaling a whole job (seed 9.3): a job stopped by a crash is restored at another parallelism,
//! again and again, with every stage changing (its sources, keyed state, sinks). The crashes fall
//! between a checkpoint's completion and its commit, so every restore finds prepared transactions of
//! old subtasks for the new ones to take over. The committed output must equal the failure-free run's,
//! record for record: nothing lost, nothing twice. Sources and sinks that cannot change parallelism
//! are refused at start, naming what can.

use cutline::{
    ConnectorResult, FaultPoint, Faults, GeneratorSource, Job, JobGraph, LineFileSource, LocalDirStore, MemoryTxnSink,
    MemoryTxnStore, PrintSink, RestartStrategy, RunConfig, Source, SourceStatus, TransactionalFileSink,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const RECORDS: u64 = 4000;
const KEYS: u64 = 17;

#[derive(Clone, Copy, Debug)]
enum Input {
    Generator,
    LineFile,
}

#[derive(Clone, Debug)]
enum Output {
    /// The in-memory store of prepared transactions (the PostgreSQL sink's design).
    Memory(Arc<Mutex<MemoryTxnStore>>),
    /// The transactional file sink into a real directory.
    Files(PathBuf),
}

struct Scenario {
    name: &'static str,
    input: Input,
    /// The parallelism of each run; every run but the last is stopped by a crash before a commit.
    parallelisms: &'static [u32],
}

const SCENARIOS: &[Scenario] = &[
    Scenario { name: "generator, up and down", input: Input::Generator, parallelisms: &[2, 3, 1, 4, 2] },
    Scenario { name: "line file, up and down", input: Input::LineFile, parallelisms: &[3, 1, 2, 4] },
    Scenario { name: "twice without moving far", input: Input::Generator, parallelisms: &[1, 4, 3, 2] },
];

/// source -> slow map -> keyed running count -> sink, every stage at `parallelism`.
fn job(input: Input, dir: &Path, parallelism: u32, output: &Output) -> JobGraph {
    let job = Job::new("rescaling");
    job.set_parallelism(parallelism);
    let numbers = match input {
        Input::Generator => job.source("numbers", GeneratorSource::new(RECORDS, |i| i % KEYS)),
        Input::LineFile => job.source("numbers", LineFileSource::new(input_file(dir))).map(|l: String| {
            let i: u64 = l.parse().expect("a number per line");
            i % KEYS
        }),
    };
    let counts = numbers
        .map(|k: u64| {
            std::thread::sleep(Duration::from_micros(20));
            k
        })
        .key_by(|k: &u64| *k)
        .aggregate("counts", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"));
    match output {
        Output::Memory(store) => counts.sink("out", MemoryTxnSink::new(store.clone())),
        Output::Files(d) => counts.sink(
            "out",
            TransactionalFileSink::new(d, |s: &String, buf: &mut Vec<u8>| buf.extend_from_slice(s.as_bytes())),
        ),
    }
    job.build().expect("valid job")
}

fn input_file(dir: &Path) -> PathBuf {
    let path = dir.join("input.txt");
    if !path.exists() {
        std::fs::write(&path, (0..RECORDS).map(|i| format!("{i}\n")).collect::<String>()).unwrap();
    }
    path
}

fn expected() -> Vec<String> {
    let mut per_key: BTreeMap<u64, u64> = BTreeMap::new();
    for i in 0..RECORDS {
        *per_key.entry(i % KEYS).or_default() += 1;
    }
    let mut v: Vec<String> = per_key.iter().flat_map(|(k, n)| (1..=*n).map(move |c| format!("{k}:{c}"))).collect();
    v.sort();
    v
}

fn committed(output: &Output) -> Vec<String> {
    let mut v = match output {
        Output::Memory(store) => store.lock().unwrap().committed_records(),
        Output::Files(d) => std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("part-"))
            .flat_map(|p| std::fs::read_to_string(p).unwrap().lines().map(String::from).collect::<Vec<_>>())
            .collect(),
    };
    v.sort();
    v
}

/// Transactions prepared and not yet committed or discarded.
fn prepared(output: &Output) -> usize {
    match output {
        Output::Memory(store) => store.lock().unwrap().prepared_count(),
        Output::Files(d) => std::fs::read_dir(d.join(".pending")).map(|r| r.count()).unwrap_or(0),
    }
}

fn config(dir: &Path) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir.join("state")).unwrap()), "rescaling-v1");
    cfg.checkpoint.interval_ms = Some(5);
    cfg.batch_size = 16;
    cfg
}

/// Fails the `n`-th sink commit (over all subtasks): the checkpoint is complete, its transactions
/// prepared and not committed. With no restarts allowed, the run stops there.
fn crash_at_commit(cfg: &mut RunConfig, n: u64) {
    let count = Arc::new(AtomicU64::new(0));
    cfg.faults = Faults::new(move |p| p == FaultPoint::SinkCommit && count.fetch_add(1, Ordering::SeqCst) + 1 == n);
    cfg.restart = RestartStrategy::None;
}

fn run_scenario(s: &Scenario, output: Output, dir: &Path) {
    let (last, crashed) = s.parallelisms.split_last().unwrap();
    for (step, p) in crashed.iter().enumerate() {
        let mut cfg = config(dir);
        crash_at_commit(&mut cfg, 3 + step as u64);
        let r = cutline::run(&job(s.input, dir, *p, &output), cfg);
        assert!(r.is_err(), "{}: run {step} at parallelism {p} was to be stopped by the injected failure", s.name);
        assert!(prepared(&output) > 0, "{}: the crash left no prepared transaction to take over", s.name);
        assert!(committed(&output).len() < expected().len(), "{}: the run ended before its crash", s.name);
    }
    let report = cutline::run(&job(s.input, dir, *last, &output), config(dir))
        .unwrap_or_else(|e| panic!("{}: the last run at parallelism {last}: {e}", s.name));
    assert!(report.restored_from.is_some(), "{}: the last run did not restore", s.name);
    let (got, want) = (committed(&output), expected());
    assert!(
        got == want,
        "{}: {} records committed, {} expected; the first difference: {:?}",
        s.name,
        got.len(),
        want.len(),
        got.iter().zip(&want).find(|(a, b)| a != b)
    );
    assert_eq!(prepared(&output), 0, "{}: a prepared transaction was left behind", s.name);
}

#[test]
fn a_job_rescaled_after_each_crash_commits_every_record_once_into_prepared_transactions() {
    for s in SCENARIOS {
        let dir = tempfile::tempdir().unwrap();
        run_scenario(s, Output::Memory(Arc::new(Mutex::new(MemoryTxnStore::default()))), dir.path());
    }
}

#[test]
fn a_job_rescaled_after_each_crash_commits_every_record_once_into_files() {
    for s in SCENARIOS {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        run_scenario(s, Output::Files(out), dir.path());
    }
}

/// A source whose offsets say nothing of the other subtasks (it does not implement `rescale`).
#[derive(Clone)]
struct Countdown(u64);

impl Source for Countdown {
    type Item = u64;
    type Offset = u64;
    fn open(&mut self, _subtask: u32, _parallelism: u32, restored: Option<u64>) -> ConnectorResult<()> {
        if let Some(r) = restored {
            self.0 = r;
        }
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<u64>, _max: usize) -> ConnectorResult<SourceStatus> {
        if self.0 == 0 {
            return Ok(SourceStatus::Finished);
        }
        std::thread::sleep(Duration::from_micros(50));
        out.push(self.0);
        self.0 -= 1;
        Ok(SourceStatus::More)
    }
    fn offset(&self) -> u64 {
        self.0
    }
}

#[test]
fn a_source_that_cannot_rescale_is_refused_at_another_parallelism_with_what_can() {
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = |p: u32| {
        let job = Job::new("rescaling");
        job.source_with_parallelism("countdown", p, Countdown(RECORDS))
            .key_by(|k: &u64| *k % KEYS)
            .aggregate("counts", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
            .sink_with_parallelism("out", 1, MemoryTxnSink::new(out.clone()));
        job.build().expect("valid job")
    };
    let mut cfg = config(dir.path());
    crash_at_commit(&mut cfg, 3);
    cutline::run(&job(1), cfg).expect_err("stopped by the injected failure");
    let msg = cutline::run(&job(2), config(dir.path())).expect_err("must refuse").to_string();
    assert!(msg.contains("countdown") && msg.contains("cannot change parallelism"), "{msg}");
    assert!(msg.contains("Source::rescale"), "the message says what can: {msg}");
}

#[test]
fn a_sink_that_cannot_take_over_transactions_is_refused_at_another_parallelism_with_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let job = |sink_parallelism: u32| {
        let job = Job::new("rescaling");
        job.source_with_parallelism("numbers", 1, GeneratorSource::new(RECORDS, |i| i % KEYS))
            .map(|k: u64| {
                std::thread::sleep(Duration::from_micros(20));
                k
            })
            .sink_with_parallelism("printed", sink_parallelism, PrintSink::new("> "));
        job.build().expect("valid job")
    };
    let mut cfg = config(dir.path());
    cfg.faults = Faults::new({
        let n = Arc::new(AtomicU64::new(0));
        move |p| p == FaultPoint::ProcessBatch && n.fetch_add(1, Ordering::SeqCst) == 150
    });
    cfg.restart = RestartStrategy::None;
    cutline::run(&job(2), cfg).expect_err("stopped by the injected failure");
    let msg = cutline::run(&job(3), config(dir.path())).expect_err("must refuse").to_string();
    assert!(msg.contains("printed") && msg.contains("parallelism 2"), "names the sink and the old parallelism: {msg}");
    assert!(msg.contains("sink_with_parallelism"), "the message says the way out: {msg}");
}
