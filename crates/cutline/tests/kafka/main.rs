//! The Kafka source and sinks against a real broker (feature `kafka`; `scripts/test` starts Tansu with
//! `scripts/kafka-test-server` and exports `CUTLINE_KAFKA_BROKERS`).
//!
//! What a consumer sees is decided by `cutline::testing::kafka_committed::read_committed`, which
//! applies `read_committed` from the log's control records: the broker here returns no list of
//! aborted transactions, so a librdkafka consumer would show aborted records too (see that module).
#![cfg(feature = "kafka")]

use cutline::connectors::kafka::{
    self, owner_of, KafkaOffsets, KafkaPartitioning, KafkaRecord, KafkaSink, KafkaSinkConfig, KafkaSource,
    KafkaSourceConfig, KafkaTxn, StartPosition,
};
use cutline::testing::kafka_committed::{read_committed, CommittedRecord};
use cutline::{
    CheckpointId, FaultPoint, Faults, Job, LocalDirStore, RestartStrategy, RunConfig, Sink, SinkContext, Source,
    SourceStatus,
};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod sink_rescale;
mod source;

fn brokers() -> String {
    std::env::var("CUTLINE_KAFKA_BROKERS").expect(
        "CUTLINE_KAFKA_BROKERS is not set: run the tests with scripts/test, or eval \"$(scripts/kafka-test-server)\" first",
    )
}

fn run_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        format!("{}-{}", std::process::id(), t.as_nanos() % 1_000_000_000)
    })
}

/// A fresh topic of `partitions` partitions, named after `name` and this run.
fn topic(name: &str, partitions: i32) -> String {
    topic_on(&brokers(), name, partitions)
}

fn topic_on(brokers: &str, name: &str, partitions: i32) -> String {
    let t = format!("{name}-{}", run_id());
    kafka::create_topic(brokers, &t, partitions).unwrap();
    t
}

/// Produce `records` (partition, key, value) without a transaction, and wait until all are written.
fn produce(topic: &str, records: impl IntoIterator<Item = (i32, String, String)>) {
    produce_on(&brokers(), topic, records)
}

fn produce_on(brokers: &str, topic: &str, records: impl IntoIterator<Item = (i32, String, String)>) {
    let p: BaseProducer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    for (partition, k, v) in records {
        let mut r = BaseRecord::to(topic).partition(partition).key(&k).payload(&v);
        loop {
            match p.send(r) {
                Ok(()) => break,
                Err((_, back)) => {
                    r = back;
                    p.poll(Duration::from_millis(10));
                }
            }
        }
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

fn text(r: &CommittedRecord) -> (String, String) {
    let s = |b: &Option<Vec<u8>>| String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into_owned();
    (s(&r.key), s(&r.value))
}

fn sink_ctx(name: &str, subtask: u32, generation: u64) -> SinkContext {
    SinkContext {
        uid: "out".into(),
        subtask,
        parallelism: 1,
        incarnation: generation << 32 | subtask as u64,
        job: format!("{name}-{}", run_id()),
    }
}

fn string_sink(config: KafkaSinkConfig) -> KafkaSink<(String, String)> {
    KafkaSink::new(config, |(k, v): &(String, String), key, value| {
        key.extend_from_slice(k.as_bytes());
        value.extend_from_slice(v.as_bytes());
    })
}

/// Poll `source` until it finishes (bounded) or `idle_for` passes without a record.
fn drain(source: &mut KafkaSource, idle_for: Duration) -> (Vec<KafkaRecord>, SourceStatus) {
    let mut out = Vec::new();
    let mut last = Instant::now();
    loop {
        let before = out.len();
        let st = source.poll(&mut out, 256).unwrap();
        if st == SourceStatus::Finished {
            return (out, st);
        }
        if out.len() > before {
            last = Instant::now();
        } else if last.elapsed() > idle_for {
            return (out, st);
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn values(rs: &[KafkaRecord]) -> Vec<String> {
    let mut v: Vec<String> =
        rs.iter().map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned()).collect();
    v.sort();
    v
}

// ------------------------------------------------------------------------------------------------
// The exactly-once sink, step by step
// ------------------------------------------------------------------------------------------------

#[test]
fn records_stay_invisible_until_their_checkpoint_commits_and_a_second_commit_changes_nothing() {
    let t = topic("sink-steps", 2);
    let ctx = sink_ctx("steps", 0, 1);
    let mut s = string_sink(KafkaSinkConfig::exactly_once(&brokers(), &t));
    s.open(&ctx).unwrap();
    assert_eq!(s.committed_after(None).unwrap(), Some(false));
    s.recover(&[]).unwrap();
    for i in 0..100 {
        s.write((format!("k{i}"), format!("v{i}"))).unwrap();
    }
    let txn = s.prepare(CheckpointId(1)).unwrap().expect("records were written");
    assert_eq!(txn.records, 100);
    assert!(s.prepare(CheckpointId(2)).unwrap().is_none(), "an empty epoch prepares nothing");
    assert!(read_committed(&brokers(), &t, 2).unwrap().is_empty(), "prepared records are visible");
    s.commit(std::slice::from_ref(&txn)).unwrap();
    let seen = read_committed(&brokers(), &t, 2).unwrap();
    assert_eq!(seen.len(), 100);
    s.commit(std::slice::from_ref(&txn)).unwrap();
    assert!(read_committed(&brokers(), &t, 2).unwrap() == seen, "a second commit changed the topic");
    // Another incarnation recovering the same checkpoint commits nothing again.
    let mut again = string_sink(KafkaSinkConfig::exactly_once(&brokers(), &t));
    again.open(&sink_ctx("steps", 0, 2)).unwrap();
    assert_eq!(again.committed_after(Some(CheckpointId(1))).unwrap(), Some(false));
    assert_eq!(again.committed_after(Some(CheckpointId(0))).unwrap(), Some(true), "the marker says 1 committed");
    again.recover(&[txn]).unwrap();
    assert!(read_committed(&brokers(), &t, 2).unwrap() == seen, "recovering a committed checkpoint wrote it again");
    let mut got: Vec<(String, String)> = seen.iter().map(text).collect();
    got.sort();
    let mut want: Vec<(String, String)> = (0..100).map(|i| (format!("k{i}"), format!("v{i}"))).collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn a_transaction_a_dead_process_left_half_written_is_aborted_and_its_checkpoint_committed_once() {
    let t = topic("sink-window", 1);
    let ctx = sink_ctx("window", 0, 1);
    let mut s = string_sink(KafkaSinkConfig::exactly_once(&brokers(), &t));
    s.open(&ctx).unwrap();
    s.recover(&[]).unwrap();
    for i in 0..50 {
        s.write(("k".into(), format!("v{i}"))).unwrap();
    }
    let txn: KafkaTxn = s.prepare(CheckpointId(7)).unwrap().unwrap();
    drop(s);
    // The process died in the middle of checkpoint 7's commit: its producer (same transactional id)
    // wrote part of the records into the broker and never committed.
    let zombie: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("transactional.id", KafkaSink::<(String, String)>::transactional_id(&ctx))
        .create()
        .unwrap();
    zombie.init_transactions(Duration::from_secs(30)).unwrap();
    zombie.begin_transaction().unwrap();
    for i in 0..20 {
        zombie.send(BaseRecord::to(&t).key("k").payload(&format!("v{i}"))).unwrap();
    }
    zombie.flush(Duration::from_secs(30)).unwrap();
    std::mem::forget(zombie);
    let mut next = string_sink(KafkaSinkConfig::exactly_once(&brokers(), &t));
    next.open(&sink_ctx("window", 0, 2)).unwrap();
    assert_eq!(next.committed_after(Some(CheckpointId(7))).unwrap(), Some(false));
    next.recover(&[txn]).unwrap();
    let got: Vec<String> = read_committed(&brokers(), &t, 1).unwrap().iter().map(|r| text(r).1).collect();
    assert_eq!(got, (0..50).map(|i| format!("v{i}")).collect::<Vec<_>>(), "the window lost or doubled records");
}

#[test]
fn an_epoch_larger_than_its_limit_and_a_too_short_transaction_timeout_are_refused_with_what_to_do() {
    let t = topic("sink-limits", 1);
    let mut small = KafkaSinkConfig::exactly_once(&brokers(), &t);
    small.max_epoch_bytes = 1_000;
    let mut s = string_sink(small);
    s.open(&sink_ctx("limits", 0, 1)).unwrap();
    let e = (0..100).map(|i| s.write(("k".into(), format!("value {i}")))).find_map(Result::err).expect("refused");
    assert!(e.is_permanent() && e.message().contains("checkpoint more often"), "{e}");
    let mut short = KafkaSinkConfig::exactly_once(&brokers(), &t);
    short.transaction_timeout_ms = 10;
    let e = string_sink(short).open(&sink_ctx("limits", 0, 1)).unwrap_err();
    assert!(e.is_permanent() && e.message().contains("transaction_timeout_ms"), "{e}");
}

// ------------------------------------------------------------------------------------------------
// Whole jobs: Kafka -> keyed count -> Kafka
// ------------------------------------------------------------------------------------------------

const RECORDS: u64 = 3_000;
const KEYS: u64 = 37;

fn config(dir: &std::path::Path, job: &str, faults: Faults) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), job);
    cfg.checkpoint.interval_ms = Some(20);
    cfg.batch_size = 64;
    cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 200 };
    cfg.max_repeated_failures = None;
    cfg.faults = faults;
    cfg
}

/// An input topic of 4 partitions holding `RECORDS` records, value `i`, key `k{i % KEYS}`.
fn input(name: &str) -> String {
    input_on(&brokers(), name)
}

fn input_on(brokers: &str, name: &str) -> String {
    let t = topic_on(brokers, name, 4);
    produce_on(brokers, &t, (0..RECORDS).map(|i| ((i % 4) as i32, format!("k{}", i % KEYS), i.to_string())));
    t
}

/// Reads `input` (bounded) at parallelism 2, counts per key, and writes `key -> count` for every
/// record into `output` (3 partitions) with a sink of `mode`.
fn run_count_job(name: &str, input: &str, output: &str, exactly_once: bool, faults: Faults) -> u32 {
    run_count_job_on(&brokers(), name, input, output, exactly_once, faults)
}

fn run_count_job_on(brokers: &str, name: &str, input: &str, output: &str, exactly_once: bool, faults: Faults) -> u32 {
    let dir = tempfile::tempdir().unwrap();
    let graph = count_job(brokers, name, input, output, exactly_once, 2);
    let report = cutline::run(&graph, config(dir.path(), &format!("{name}-{}", run_id()), faults)).unwrap();
    report.restarts
}

/// The job of [`run_count_job`], its source at `source_parallelism` (the rest at 2).
fn count_job(
    brokers: &str,
    name: &str,
    input: &str,
    output: &str,
    exactly_once: bool,
    source_parallelism: u32,
) -> cutline::JobGraph {
    count_job_held(brokers, name, input, output, (exactly_once, source_parallelism, 2), None)
}

/// [`count_job`] with every stage but the source at `parallelism`, whose records each take 1 ms
/// more while `hold` is set (so that a test can keep the input from running out before something
/// happened, however fast the machine).
fn count_job_held(
    brokers: &str,
    name: &str,
    input: &str,
    output: &str,
    (exactly_once, source_parallelism, parallelism): (bool, u32, u32),
    hold: Option<Arc<std::sync::atomic::AtomicBool>>,
) -> cutline::JobGraph {
    // The job's warnings (each failure that made it restart) go to the test's captured output.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .try_init();
    let job = Job::new(name);
    job.set_parallelism(parallelism);
    let source_cfg = KafkaSourceConfig::new(brokers, &[input]).bounded();
    let records = job
        .source_from_with_parallelism("in", source_parallelism, move |_| KafkaSource::new(source_cfg.clone()))
        .map(move |r: KafkaRecord| {
            // Slow enough for some 20 checkpoints in a run.
            if r.offset % 50 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            if hold.as_ref().is_some_and(|h| h.load(Ordering::SeqCst)) {
                std::thread::sleep(Duration::from_millis(1));
            }
            String::from_utf8(r.key.unwrap()).unwrap()
        });
    let counts =
        records.key_by(|k: &String| k.clone()).process("count", |k: &String, n: &mut Option<u64>, _: String, out| {
            let c = n.get_or_insert(0);
            *c += 1;
            out.emit((k.clone(), c.to_string()));
        });
    let mut sink_cfg = if exactly_once {
        KafkaSinkConfig::exactly_once(brokers, output)
    } else {
        KafkaSinkConfig::at_least_once(brokers, output)
    };
    // Tansu 0.6.0 can lose the offsets of a transaction that shares a partition with another
    // producer's (see ARCHITECTURE.md); the subtasks write disjoint partitions here.
    sink_cfg.partitioning = KafkaPartitioning::Fixed;
    counts.sink_from("out", move |_| string_sink(sink_cfg.clone()));
    job.build().unwrap()
}

/// Per key, how often each count was seen by a `read_committed` consumer of `output`.
fn seen_counts(output: &str) -> BTreeMap<(String, u64), u32> {
    seen_counts_on(&brokers(), output)
}

fn seen_counts_on(brokers: &str, output: &str) -> BTreeMap<(String, u64), u32> {
    let mut seen = BTreeMap::new();
    for r in read_committed(brokers, output, 3).unwrap() {
        let (k, v) = text(&r);
        *seen.entry((k, v.parse::<u64>().unwrap())).or_insert(0) += 1;
    }
    seen
}

fn failure_free() -> BTreeMap<(String, u64), u32> {
    let mut per_key = BTreeMap::new();
    for i in 0..RECORDS {
        *per_key.entry(format!("k{}", i % KEYS)).or_insert(0u64) += 1;
    }
    per_key.into_iter().flat_map(|(k, n)| (1..=n).map(move |c| ((k.clone(), c), 1))).collect()
}

fn assert_exactly_once(output: &str) {
    assert_exactly_once_on(&brokers(), output)
}

fn assert_exactly_once_on(brokers: &str, output: &str) {
    let seen = seen_counts_on(brokers, output);
    let want = failure_free();
    let doubled: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    if !doubled.is_empty() {
        for r in read_committed(brokers, output, 3).unwrap() {
            let (k, v) = text(&r);
            if doubled.iter().any(|((dk, dv), _)| *dk == k && dv.to_string() == v) {
                eprintln!(
                    "{k}={v} at {}/{} by producer {} epoch {}",
                    r.partition, r.offset, r.producer_id, r.producer_epoch
                );
            }
        }
    }
    assert!(doubled.is_empty(), "updates seen twice: {doubled:?}");
    let lost: Vec<_> = want.keys().filter(|k| !seen.contains_key(*k)).take(5).collect();
    assert!(lost.is_empty(), "updates lost: {lost:?}");
    assert_eq!(seen, want);
}

#[test]
fn a_job_without_failures_writes_exactly_the_failure_free_result() {
    let (i, o) = (input("job-clean-in"), topic("job-clean-out", 3));
    assert_eq!(run_count_job("kafka-clean", &i, &o, true, Faults::none()), 0);
    assert_exactly_once(&o);
    // Fixed partitioning: subtask i wrote partition i alone (2 subtasks, 3 partitions).
    let mut producers: BTreeMap<i32, std::collections::BTreeSet<i64>> = BTreeMap::new();
    for r in read_committed(&brokers(), &o, 3).unwrap() {
        producers.entry(r.partition).or_default().insert(r.producer_id);
    }
    assert_eq!(producers.keys().copied().collect::<Vec<_>>(), vec![0, 1], "{producers:?}");
    assert!(producers.values().all(|p| p.len() == 1), "a partition written by two producers: {producers:?}");
}

#[test]
fn failures_at_every_step_of_the_sinks_protocol_leave_exactly_the_failure_free_result() {
    for (n, point) in [
        FaultPoint::SinkPrepare,
        FaultPoint::SinkCommit,
        FaultPoint::SinkCommitMidway,
        FaultPoint::SinkRecover,
        FaultPoint::ProcessBatch,
    ]
    .into_iter()
    .enumerate()
    {
        let (i, o) = (input(&format!("job-fault{n}-in")), topic(&format!("job-fault{n}-out"), 3));
        // The 2nd, 5th, ... time at `point`; at a restore's recovery, every 40th batch fails too.
        let (faults, injected) = cutline::testing::sink_step_faults(point, 40, 150);
        eprintln!("fault point {point:?}");
        let restarts = run_count_job(&format!("kafka-fault-{n}"), &i, &o, true, faults);
        assert!(injected.load(Ordering::SeqCst) > 0, "{point:?}: no failure was injected");
        assert!(restarts >= 1, "{point:?}: failures injected and no restart");
        assert_exactly_once(&o);
    }
}

#[test]
fn at_least_once_mode_delivers_every_update_and_doubles_only_after_a_restore() {
    let (i, o) = (input("job-alo-in"), topic("job-alo-out", 3));
    let batches = Arc::new(AtomicU64::new(0));
    let b2 = batches.clone();
    let faults = Faults::new(move |p| p == FaultPoint::ProcessBatch && b2.fetch_add(1, Ordering::SeqCst) == 30);
    let restarts = run_count_job("kafka-alo", &i, &o, false, faults);
    assert_eq!(restarts, 1);
    let seen = seen_counts(&o);
    for k in failure_free().keys() {
        assert!(seen.contains_key(k), "update {k:?} lost in at-least-once mode");
    }
}

#[test]
fn a_broker_that_stops_answering_for_three_seconds_stalls_the_job_and_loses_nothing() {
    let (i, o) = (input("job-stall-in"), topic("job-stall-out", 3));
    let pid: i32 = std::fs::read_to_string(format!("{}/pid", std::env::var("CUTLINE_KAFKA_DIR").unwrap()))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let commits = Arc::new(AtomicU64::new(0));
    let c2 = commits.clone();
    let faults = Faults::new(move |p| {
        if p == FaultPoint::SinkCommit && c2.fetch_add(1, Ordering::SeqCst) == 1 {
            // SIGSTOP: the broker keeps its connections and its (in-memory) log, and answers nothing.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(3));
                unsafe { libc::kill(pid, libc::SIGCONT) };
            });
        }
        false
    });
    let started = Instant::now();
    run_count_job("kafka-stall", &i, &o, true, faults);
    assert!(commits.load(Ordering::SeqCst) > 1, "the job ended before the broker stopped");
    assert!(started.elapsed() >= Duration::from_secs(3), "the job did not wait for the broker");
    assert_exactly_once(&o);
}

/// A broker of this test's own, on durable storage: Tansu keeping its log in a fresh bucket of the
/// S3 server that `scripts/test` starts (`scripts/kafka-test-server` with an `s3://` storage), so
/// that it can be killed and started again without losing what it stored. Stopped when dropped.
struct DurableBroker {
    dir: String,
    brokers: String,
}

impl DurableBroker {
    const SCRIPT: &'static str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/kafka-test-server");

    fn start(name: &str) -> DurableBroker {
        assert!(
            std::env::var("CUTLINE_S3_ENDPOINT").is_ok(),
            "CUTLINE_S3_ENDPOINT is not set: run the tests with scripts/test, which starts an S3 server"
        );
        let bucket = format!("tansu-{name}-{}", run_id());
        let out = std::process::Command::new(Self::SCRIPT)
            .env("CUTLINE_KAFKA_STORAGE", format!("s3://{bucket}/"))
            .output()
            .unwrap();
        assert!(out.status.success(), "kafka-test-server: {}", String::from_utf8_lossy(&out.stderr));
        let exports = String::from_utf8(out.stdout).unwrap();
        let var = |name: &str| -> String {
            let line = exports.lines().find_map(|l| l.strip_prefix(&format!("export {name}=")));
            line.unwrap_or_else(|| panic!("no {name} in {exports}")).trim_matches('\'').to_string()
        };
        DurableBroker { dir: var("CUTLINE_KAFKA_DIR"), brokers: var("CUTLINE_KAFKA_BROKERS") }
    }

    /// `down` (kill -9) or `up` (start again on the same port and storage).
    fn script(&self, cmd: &str) {
        let out =
            std::process::Command::new(Self::SCRIPT).arg(cmd).env("CUTLINE_KAFKA_DIR", &self.dir).output().unwrap();
        assert!(out.status.success(), "kafka-test-server {cmd}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for DurableBroker {
    fn drop(&mut self) {
        let _ = std::process::Command::new(Self::SCRIPT).arg("stop").env("CUTLINE_KAFKA_DIR", &self.dir).output();
    }
}

/// The broker is killed with SIGKILL in the middle of the job, between the sinks' commits (once two
/// commits are done and none is running), stays down for two seconds and comes back on its durable
/// log: the next commits and the sources' reads stall, the job goes on, and a `read_committed`
/// consumer sees every update exactly once.
///
/// The kill waits for no sink to be committing because Tansu 0.6.0 itself loses a produce killed
/// halfway: the records of a transaction whose produce request was in flight when the broker died
/// were missing from its log after the restart, while the transaction's commit and its offsets went
/// through (seen 4 times in 5 with this kill at an unchosen moment on a loaded machine: the
/// partition's next transaction sat at offset 0). No client can tell; the broker's storage must be
/// crash-safe for exactly-once to hold.
#[test]
fn the_broker_killed_and_restarted_on_durable_storage_while_the_job_runs_loses_and_doubles_nothing() {
    let b = DurableBroker::start("restart");
    let (i, o) = (input_on(&b.brokers, "job-restart-in"), topic_on(&b.brokers, "job-restart-out", 3));
    let restarted = Arc::new(std::sync::Mutex::new(None));
    // The sink threads between `SinkCommit` and their next fault point, and the commits begun. The
    // lock is held while the broker is killed, so no commit starts before it is down.
    let committing = std::sync::Mutex::new((std::collections::HashSet::new(), 0u32));
    let (r2, dir) = (restarted.clone(), b.dir.clone());
    let faults = Faults::new(move |p| {
        let mut c = committing.lock().unwrap();
        let me = std::thread::current().id();
        match p {
            FaultPoint::SinkCommit => {
                c.0.insert(me);
                c.1 += 1;
                return false;
            }
            FaultPoint::SinkCommitMidway => return false, // the rest of its commit may follow
            _ => c.0.remove(&me),
        };
        let mut r = r2.lock().unwrap();
        if c.1 >= 2 && c.0.is_empty() && r.is_none() {
            let b = DurableBroker { dir: dir.clone(), brokers: String::new() };
            b.script("down");
            *r = Some(std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(2));
                b.script("up");
                std::mem::forget(b); // the test's own guard stops it
            }));
        }
        false
    });
    // Dropped before `b` (declared after it): a failing job still waits for the restart to finish
    // before the broker is stopped, so no broker outlives the test.
    struct JoinOnDrop(Arc<std::sync::Mutex<Option<std::thread::JoinHandle<()>>>>);
    impl Drop for JoinOnDrop {
        fn drop(&mut self) {
            if let Some(t) = self.0.lock().unwrap().take() {
                let _ = t.join();
            }
        }
    }
    let bouncer = JoinOnDrop(restarted.clone());
    let started = Instant::now();
    let restarts = run_count_job_on(&b.brokers, "kafka-restart", &i, &o, true, faults);
    assert!(restarted.lock().unwrap().is_some(), "the job ended before the broker was killed");
    drop(bouncer);
    assert!(started.elapsed() >= Duration::from_secs(2), "the job did not wait for the broker");
    eprintln!("{restarts} restarts while the broker was down");
    assert_exactly_once_on(&b.brokers, &o);
}

#[test]
fn committables_round_trip_through_a_checkpoint() {
    let txn = KafkaTxn { checkpoint: 3, records: 1, data: Arc::new(vec![255, 255, 255, 255, 1, 0, 0, 0, 42]) };
    let bytes = postcard::to_allocvec(&txn).unwrap();
    assert_eq!(postcard::from_bytes::<KafkaTxn>(&bytes).unwrap(), txn);
}
