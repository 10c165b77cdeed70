//! What a checkpoint's epoch trace says about a real run, for each of the three questions an
//! operator asks of a slow checkpoint: a barrier stuck on its way (a source busy with long batches,
//! a barrier queued behind a backlog), data piling up while a task aligns, and (by contrast)
//! unaligned barriers that overtake the backlog. Also: a checkpoint's statistics that cannot be
//! written cost nothing but the statistics, and the HTTP endpoint keeps its limits against idle and
//! junk connections.

use cutline::admin::{serve_job_http, WebOptions};
use cutline::runtime::{CheckpointRecord, StepKind};
use cutline::{
    CheckpointStore, GeneratorSource, Job, JobGraph, LocalDirStore, MemoryTxnSink, MemoryTxnStore, RunConfig,
};
use cutline_storage::{FaultyStore, StoreOp};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KEYS: u64 = 16;

fn sleep_us(us: u64) {
    std::thread::sleep(Duration::from_micros(us));
}

/// fast ∪ slow → key_by → count → sink: `slow`'s batches take `slow_batch_ms` (its barrier waits for
/// the batch in progress), `fast`'s a millisecond.
fn skewed(slow_batch_ms: u64, out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let job = Job::new("skewed");
    let per_record = |ms: u64| ms * 1000 / 64;
    let fast =
        job.source_with_parallelism("fast", 1, GeneratorSource::new(150_000, |i| i % KEYS)).map(move |k: u64| {
            if k == 0 {
                sleep_us(per_record(1) * KEYS);
            }
            k
        });
    let slow = job.source_with_parallelism("slow", 1, GeneratorSource::new(3_000, |i| i % KEYS)).map(move |k: u64| {
        sleep_us(per_record(slow_batch_ms));
        k
    });
    fast.union(slow)
        .key_by(|k: &u64| *k)
        .parallelism(1)
        .reduce("agg", |a: &u64, b: &u64| a + b)
        .map(|n: u64| n.to_string())
        .sink_with_parallelism("out", 1, MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

/// A fast source into a slow keyed operator: its input channel stays full.
fn backlogged(out: Arc<Mutex<MemoryTxnStore>>) -> JobGraph {
    let job = Job::new("backlogged");
    job.source_with_parallelism("src", 1, GeneratorSource::new(12_000, |i| i % KEYS))
        .key_by(|k: &u64| *k)
        .parallelism(1)
        .reduce("slow", |a: &u64, b: &u64| {
            sleep_us(150);
            a + b
        })
        .map(|n: u64| n.to_string())
        .sink_with_parallelism("out", 1, MemoryTxnSink::new(out));
    job.build().expect("valid job")
}

fn config(store: Arc<dyn CheckpointStore>, name: &str, interval_ms: u64) -> RunConfig {
    let mut cfg = RunConfig::new(store, name);
    cfg.checkpoint.interval_ms = Some(interval_ms);
    cfg.batch_size = 64;
    cfg.channel_capacity = 8;
    cfg
}

/// Every periodic checkpoint's record in `store`.
fn records(store: &dyn CheckpointStore) -> Vec<CheckpointRecord> {
    store
        .list_stats()
        .unwrap()
        .into_iter()
        .map(|id| CheckpointRecord::from_json(&store.read_stats(id).unwrap().unwrap()).unwrap())
        .filter(|r| r.kind == "checkpoint")
        .collect()
}

fn slowest(r: &CheckpointRecord) -> (StepKind, String) {
    let s = r.slowest_step().expect("a path");
    (s.what, s.at)
}

#[test]
fn a_slow_source_is_named_as_the_injection_and_its_peer_aligns_with_data_piling_up() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn CheckpointStore> = Arc::new(LocalDirStore::open(dir.path()).unwrap());
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let report = cutline::run(&skewed(60, out), config(store.clone(), "skewed", 150)).unwrap();
    let rs = records(&*store);
    assert!(rs.len() >= 5, "{} checkpoints: too few to judge ({report:?})", rs.len());
    // Most checkpoints wait for the slow source's batch in progress: the critical path starts at
    // its injection, which is its slowest step; the aggregation aligns meanwhile with the fast
    // source's records piling up.
    let named = rs.iter().filter(|r| slowest(r) == (StepKind::Injection, "slow#0".into())).count();
    assert!(
        named * 2 > rs.len(),
        "injection at slow#0 is the slowest step of {named} of {} checkpoints: {:?}",
        rs.len(),
        rs.iter().map(slowest).collect::<Vec<_>>()
    );
    let aligning = rs
        .iter()
        .filter(|r| {
            r.longest_alignment().is_some_and(|(t, us)| t.task == "agg#0" && us > 5_000 && t.blocked_records > 0)
        })
        .count();
    assert!(aligning * 2 > rs.len(), "agg#0 aligned over 5 ms with records piling up in {aligning} of {}", rs.len());
    // The trace is complete and ordered: every task, barriers before snapshots, acks last.
    for r in &rs {
        let names: Vec<&str> = r.tasks.iter().map(|t| t.task.as_str()).collect();
        assert_eq!(names, ["fast#0", "slow#0", "agg#0", "out.in#0"], "{r:?}");
        let agg = &r.tasks[2];
        let from: Vec<&str> = agg.inputs.iter().map(|i| i.from.as_str()).collect();
        assert_eq!(from, ["fast#0", "slow#0"]);
        for t in &r.tasks {
            assert!(t.last_barrier_us() <= t.snapshot_us + 1_000, "{t:?}");
            assert!(
                t.snapshot_us <= t.handoff_us && t.handoff_us <= t.durable_us && t.durable_us <= t.acked_us,
                "{t:?}"
            );
            assert!(
                t.acked_us <= r.last_ack_us && r.last_ack_us <= r.committed_us && r.committed_us <= r.notified_us,
                "{r:?}"
            );
        }
    }
}

#[test]
fn a_barrier_behind_a_backlog_is_named_as_a_transit_unless_it_is_unaligned() {
    let mut transit = Vec::new();
    for unaligned in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn CheckpointStore> = Arc::new(LocalDirStore::open(dir.path()).unwrap());
        let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let mut cfg = config(store.clone(), "backlogged", 100);
        cfg.checkpoint.unaligned = unaligned;
        cutline::run(&backlogged(out), cfg).unwrap();
        let rs = records(&*store);
        assert!(rs.len() >= 5, "{} checkpoints", rs.len());
        let us: Vec<u64> = rs
            .iter()
            .map(|r| {
                r.critical_path()
                    .iter()
                    .filter(|s| s.what == StepKind::Transit && s.at == "src#0 -> slow#0")
                    .map(|s| s.us)
                    .sum()
            })
            .collect();
        let named = rs.iter().filter(|r| slowest(r) == (StepKind::Transit, "src#0 -> slow#0".into())).count();
        if !unaligned {
            // 8 batches of 64 records at 150 µs each queue in front of the barrier: about 77 ms.
            assert!(
                named * 2 > rs.len(),
                "aligned: transit is the slowest step of {named} of {}: {:?}",
                rs.len(),
                rs.iter().map(slowest).collect::<Vec<_>>()
            );
        } else {
            // The barrier overtakes the queued batches; it waits only for the batch in progress.
            assert!(rs.iter().any(|r| r.channel_state_bytes > 0), "no records in flight were persisted");
        }
        let mut us = us;
        us.sort();
        transit.push(us[us.len() / 2]);
    }
    assert!(
        transit[0] > 20_000 && transit[1] < transit[0] / 4,
        "median transit aligned {} µs, unaligned {} µs",
        transit[0],
        transit[1]
    );
}

#[test]
fn statistics_that_cannot_be_written_cost_only_the_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let inner = LocalDirStore::open(dir.path()).unwrap();
    let store: Arc<dyn CheckpointStore> =
        Arc::new(FaultyStore::new(inner, |op| matches!(op, StoreOp::WriteStats { .. })));
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let report = cutline::run(&backlogged(out.clone()), config(store.clone(), "no-stats", 50)).unwrap();
    assert!(report.checkpoints_completed >= 3 && report.restarts == 0 && report.checkpoints_failed == 0, "{report:?}");
    assert_eq!(out.lock().unwrap().committed_records().len(), 12_000);
    assert!(store.list_stats().unwrap().is_empty());
}

/// `GET path` with `Connection: close`: (status, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

#[test]
fn the_endpoint_answers_through_idle_and_junk_connections_and_refuses_tuning_when_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn CheckpointStore> = Arc::new(LocalDirStore::open(dir.path()).unwrap());
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new("endless");
    job.source_with_parallelism("src", 1, GeneratorSource::new(u64::MAX, |i| i))
        .map(|i: u64| {
            if i.is_multiple_of(64) {
                sleep_us(500);
            }
            i.to_string()
        })
        .sink_with_parallelism("out", 1, MemoryTxnSink::new(out));
    let handle = cutline::spawn(job.build().unwrap(), config(store.clone(), "endless", 100));
    let server = serve_job_http("127.0.0.1:0", handle.control(), store, WebOptions { read_only: true }).unwrap();
    let addr = server.addr().to_string();
    // More idle connections than may wait, and some junk: they are dropped, the endpoint answers.
    let idle: Vec<TcpStream> =
        (0..cutline::admin::http::MAX_HTTP_WAITING + 10).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let mut junk = TcpStream::connect(&addr).unwrap();
    junk.write_all(b"\x00\x01\x02 not http\r\n\r\n").unwrap();
    let mut answer = String::new();
    junk.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = junk.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert_eq!(get(&addr, "/healthz").0, 200);
    let (status, body) = get(&addr, "/api/status");
    assert_eq!(status, 200, "{body}");
    // Read-only: no tuning, even with the header.
    let mut post = TcpStream::connect(&addr).unwrap();
    write!(post, "POST /api/settings HTTP/1.1\r\nX-Cutline-Tune: 1\r\nContent-Length: 14\r\n\r\ninterval=300ms")
        .unwrap();
    let mut answer = String::new();
    post.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 403") && answer.contains("read-only"), "{answer}");
    assert_eq!(handle.checkpoint_config().unwrap().interval_ms, Some(100));
    drop(idle);
    drop(server);
    handle.stop();
    handle.join().unwrap();
}
