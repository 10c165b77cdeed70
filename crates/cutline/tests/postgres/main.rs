//! The exactly-once PostgreSQL sink against a real server (feature `postgres`; `scripts/test`
//! starts one with `scripts/pg-test-server` and exports `CUTLINE_PG_URL` and `CUTLINE_PG_DATA`).
//!
//! Two kinds of scenario: the sink's protocol driven step by step (prepare, commit, recover, the
//! commit window, another job's transactions), and whole jobs on the threaded runtime with failures
//! injected at every step of the sink's protocol, and with the server restarted or down while they
//! run, whose table must hold exactly the failure-free result.
#![cfg(feature = "postgres")]

use cutline::connectors::postgres::{PostgresSink, PostgresSinkConfig, PreparedTxn, RowFn, SqlValue, MARKER_TABLE};
use cutline::{
    CheckpointId, FaultPoint, Faults, GeneratorSource, Job, LocalDirStore, RestartStrategy, RunConfig, Sink,
    SinkContext,
};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod subtasks;

/// Scenarios share one server; the one that restarts it runs alone.
static SERVER: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The job's warnings (each failure that made it restart) go to the test's captured output.
fn show_warnings() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .try_init();
}

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    show_warnings();
    SERVER.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    show_warnings();
    SERVER.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn url() -> String {
    std::env::var("CUTLINE_PG_URL").expect(
        "CUTLINE_PG_URL is not set: run the tests with scripts/test, or eval \"$(scripts/pg-test-server)\" first",
    )
}

fn sql() -> postgres::Client {
    let mut c = postgres::Client::connect(&url(), postgres::NoTls).expect("connect to the test server");
    // Once per test binary: roll back what an earlier, failed run of these tests left prepared (it
    // would hold its tables' locks, and a fresh table could not be made).
    static LEFT_OVER: std::sync::Once = std::sync::Once::new();
    LEFT_OVER.call_once(|| {
        for r in c.query("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()", &[]).unwrap() {
            let gid: String = r.get(0);
            let _ = c.batch_execute(&format!("ROLLBACK PREPARED '{gid}'"));
        }
    });
    c
}

fn server(cmd: &str, extra: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pg-test-server");
    let st = Command::new(script).arg(cmd).args(extra).status().expect("run scripts/pg-test-server");
    assert!(st.success(), "scripts/pg-test-server {cmd} failed");
}

/// A fresh table `name (id bigint, k text, n bigint)`, with a unique index on `k` for upserts (rows
/// of the insert scenarios leave `k` NULL, and NULLs never conflict).
fn table(name: &str) -> String {
    let mut c = sql();
    c.batch_execute(&format!(
        "DROP TABLE IF EXISTS {name}; CREATE TABLE {name} (id bigint, k text, n bigint); \
         CREATE UNIQUE INDEX {name}_k ON {name} (k)"
    ))
    .unwrap();
    name.to_string()
}

fn rows(table: &str) -> Vec<(Option<i64>, Option<String>, Option<i64>)> {
    sql()
        .query(&format!("SELECT id, k, n FROM {table} ORDER BY id, k"), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn prepared_with(prefix: &str) -> Vec<String> {
    sql()
        .query("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE $1 ORDER BY gid", &[&format!("%{prefix}%")])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A suffix unique to this run of the tests: the marker rows of earlier runs stay in the database,
/// and a job must not take them for its own.
fn run_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        format!("-{}-{}", std::process::id(), t.as_nanos() % 1_000_000_000)
    })
}

fn ctx(job: &str, generation: u64) -> SinkContext {
    ctx_of(job, generation, 0, 1)
}

fn ctx_of(job: &str, generation: u64, subtask: u32, parallelism: u32) -> SinkContext {
    SinkContext {
        uid: "out".into(),
        subtask,
        parallelism,
        incarnation: generation << 32,
        job: format!("{job}{}", run_id()),
    }
}

fn id_rows(table: &str) -> PostgresSink<u64> {
    let row: RowFn<u64> = Arc::new(|i: &u64| vec![SqlValue::from(*i as i64)]);
    PostgresSink::new(PostgresSinkConfig::insert(&url(), table, &["id"]), row)
}

fn write_all(s: &mut PostgresSink<u64>, ids: std::ops::Range<u64>) {
    for i in ids {
        Sink::write(s, i).unwrap();
    }
}

// ------------------------------------------------------------------------------------------------
// The protocol, step by step
// ------------------------------------------------------------------------------------------------

#[test]
fn prepared_rows_stay_invisible_until_commit_and_a_second_commit_changes_nothing() {
    let _server = shared();
    let t = table("t_visibility");
    let mut s = id_rows(&t);
    s.open(&ctx("visibility", 1)).unwrap();
    s.recover(&[]).unwrap();
    write_all(&mut s, 0..2500); // more than one batch of 1000
    let p = s.prepare(CheckpointId(1)).unwrap().expect("rows were written");
    assert!(rows(&t).is_empty(), "prepared rows are visible before the commit");
    assert_eq!(prepared_with("@visibility-"), vec![p.gid.clone()]);
    s.commit(std::slice::from_ref(&p)).unwrap();
    assert_eq!(rows(&t).len(), 2500);
    s.commit(std::slice::from_ref(&p)).unwrap(); // idempotent: the marker row says it was committed
    assert_eq!(rows(&t).len(), 2500);
    assert_eq!(s.prepare(CheckpointId(2)).unwrap(), None, "an empty transaction prepares nothing");
    assert_eq!(s.committed_after(Some(CheckpointId(0))).unwrap(), Some(true));
    assert_eq!(s.committed_after(Some(CheckpointId(1))).unwrap(), Some(false));
}

#[test]
fn recovery_commits_what_the_restored_checkpoint_prepared_and_rolls_back_the_rest_of_its_own_only() {
    let _server = shared();
    let t = table("t_recovery");
    // Generation 1 of job "rec" prepares checkpoints 1 and 2, then dies before either commit (the
    // commit window). Another job, and a newer generation of this one, have prepared too.
    let mut a = id_rows(&t);
    a.open(&ctx("rec", 1)).unwrap();
    write_all(&mut a, 0..10);
    let p1 = a.prepare(CheckpointId(1)).unwrap().unwrap();
    write_all(&mut a, 10..20);
    let p2 = a.prepare(CheckpointId(2)).unwrap().unwrap();
    Sink::<u64>::abort(&mut a);
    let mut other = id_rows(&t);
    other.open(&ctx("rec-other", 1)).unwrap();
    write_all(&mut other, 100..110);
    let po = other.prepare(CheckpointId(1)).unwrap().unwrap();
    let mut newer = id_rows(&t);
    newer.open(&ctx("rec", 3)).unwrap();
    write_all(&mut newer, 200..210);
    let pn = newer.prepare(CheckpointId(9)).unwrap().unwrap();

    // Generation 2 restores checkpoint 1: its transaction is committed, checkpoint 2's rolled back.
    let mut b = id_rows(&t);
    b.open(&ctx("rec", 2)).unwrap();
    assert_eq!(b.committed_after(Some(CheckpointId(1))).unwrap(), Some(false));
    b.recover(std::slice::from_ref(&p1)).unwrap();
    let ids: Vec<i64> = rows(&t).iter().map(|r| r.0.unwrap()).collect();
    assert_eq!(ids, (0..10).collect::<Vec<i64>>(), "only checkpoint 1's rows are visible");
    let left = prepared_with("@rec-");
    assert!(!left.contains(&p2.gid), "checkpoint 2's transaction was not rolled back: {left:?}");
    assert!(left.contains(&po.gid), "another job's prepared transaction was rolled back");
    assert!(left.contains(&pn.gid), "a newer generation's prepared transaction was rolled back");
    // Recovering again (a crash during recovery) changes nothing.
    b.recover(std::slice::from_ref(&p1)).unwrap();
    assert_eq!(rows(&t).len(), 10);
    other.commit(&[po]).unwrap();
    newer.commit(&[pn]).unwrap();
}

#[test]
fn a_prepared_transaction_rolled_back_behind_the_jobs_back_is_reported_lost_not_skipped() {
    let _server = shared();
    let t = table("t_lost");
    let mut s = id_rows(&t);
    s.open(&ctx("lost", 1)).unwrap();
    write_all(&mut s, 0..5);
    let p = s.prepare(CheckpointId(1)).unwrap().unwrap();
    sql().batch_execute(&format!("ROLLBACK PREPARED '{}'", p.gid)).unwrap();
    let err = s.commit(&[p]).unwrap_err();
    assert!(err.to_string().contains("neither prepared nor committed"), "{err}");
    assert!(err.is_permanent());
}

#[test]
fn upsert_keeps_the_last_value_of_each_key_even_when_a_batch_holds_the_key_twice() {
    let _server = shared();
    let t = table("t_upsert");
    let row: RowFn<(String, i64)> = Arc::new(|(k, n): &(String, i64)| vec![k.as_str().into(), (*n).into()]);
    let mut cfg = PostgresSinkConfig::upsert(&url(), &t, &["k", "n"], &["k"]);
    cfg.batch_rows = 3;
    let mut s = PostgresSink::new(cfg, row);
    s.open(&ctx("upsert", 1)).unwrap();
    for (k, n) in [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("a", 3), ("b", 2), ("d", 1)] {
        s.write((k.to_string(), n)).unwrap();
    }
    let p = s.prepare(CheckpointId(1)).unwrap().unwrap();
    s.commit(&[p]).unwrap();
    s.write(("d".to_string(), 7)).unwrap();
    let p = s.prepare(CheckpointId(2)).unwrap().unwrap();
    s.commit(&[p]).unwrap();
    let got: Vec<(String, i64)> = rows(&t).into_iter().map(|(_, k, n)| (k.unwrap(), n.unwrap())).collect();
    let want: Vec<(String, i64)> =
        [("a", 3), ("b", 2), ("c", 1), ("d", 7)].iter().map(|(k, n)| (k.to_string(), *n)).collect();
    let mut got = got;
    got.sort();
    assert_eq!(got, want);
}

/// Every kind of value into columns of every common type, sent in the column type's binary form,
/// and into types the server casts from text; each row read back as the server stores it. A value
/// that does not fit its column is refused with the column named, permanently.
#[test]
fn values_of_each_kind_land_in_columns_of_their_type_bound_natively_or_cast() {
    let _server = shared();
    let t = "t_types";
    sql()
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (i8 bigint, i4 integer, i2 smallint, f8 double precision, \
             f4 real, b boolean, tx text, vc varchar(8), num numeric(10,2), ts timestamptz, js jsonb)"
        ))
        .unwrap();
    let cols = ["i8", "i4", "i2", "f8", "f4", "b", "tx", "vc", "num", "ts", "js"];
    let row: RowFn<Vec<SqlValue>> = Arc::new(|r: &Vec<SqlValue>| r.clone());
    let mut s = PostgresSink::new(PostgresSinkConfig::insert(&url(), t, &cols), row);
    s.open(&ctx("types", 1)).unwrap();
    let v = |x: &str| SqlValue::from(x);
    // Native kinds, then text the server would parse, then NULLs.
    s.write(vec![
        (-5i64).into(),
        7i32.into(),
        3i16.into(),
        1.5.into(),
        2.25.into(),
        true.into(),
        "a'b".into(),
        "short".into(),
        12i64.into(),
        v("2026-12-02T10:00:00Z"),
        v(r#"{"a": 1}"#),
    ])
    .unwrap();
    s.write(vec![
        v("42"),
        v("-8"),
        v("9"),
        4i64.into(),
        v("0.5"),
        v("off"),
        3i64.into(),
        v("x"),
        v("1.25"),
        v("2026-01-01 00:00:00+00"),
        v("[1,2]"),
    ])
    .unwrap();
    s.write(vec![SqlValue::Null; cols.len()]).unwrap();
    let p = s.prepare(CheckpointId(1)).unwrap().unwrap();
    s.commit(&[p]).unwrap();
    let got: Vec<String> = sql()
        .query(&format!("SELECT concat_ws('|', i8, i4, i2, f8, f4, b, tx, vc, num, ts AT TIME ZONE 'UTC', js) FROM {t} ORDER BY i8 NULLS LAST"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        got,
        [
            "-5|7|3|1.5|2.25|t|a'b|short|12.00|2026-12-02 10:00:00|{\"a\": 1}",
            "42|-8|9|4|0.5|f|3|x|1.25|2026-01-01 00:00:00|[1, 2]",
            "",
        ]
    );
    let mut bad = vec![SqlValue::Null; cols.len()];
    bad[2] = 70_000i64.into();
    let e = s.write(bad).expect_err("70000 into a smallint");
    assert!(e.is_permanent() && e.to_string().contains("column i2 of type smallint"), "{e}");
}

/// Bug: a flush between barriers upserting a key that the sink's own prepared transaction of the
/// previous checkpoint still locked blocked the task thread, the only thread that could commit that
/// transaction: the job hung (found by the CLI drill).
#[test]
fn regression_a_key_written_again_before_its_previous_checkpoint_committed_deadlocked_the_sink() {
    let _server = shared();
    let t = table("t_relock");
    let row: RowFn<(String, i64)> = Arc::new(|(k, n): &(String, i64)| vec![k.as_str().into(), (*n).into()]);
    let mut cfg = PostgresSinkConfig::upsert(&url(), &t, &["k", "n"], &["k"]);
    cfg.batch_rows = 2;
    cfg.lock_wait_ms = 300;
    let mut s = PostgresSink::new(cfg, row);
    s.open(&ctx("relock", 1)).unwrap();
    let w = |s: &mut PostgresSink<(String, i64)>, k: &str, n: i64| s.write((k.to_string(), n)).unwrap();
    w(&mut s, "a", 1);
    w(&mut s, "b", 1);
    let p1 = s.prepare(CheckpointId(1)).unwrap().unwrap();
    // Checkpoint 1 is not committed yet; a full batch of its keys comes: it must not block.
    let started = std::time::Instant::now();
    w(&mut s, "a", 2);
    w(&mut s, "b", 2);
    assert!(started.elapsed() < Duration::from_secs(2), "the write blocked on the sink's own prepared transaction");
    s.commit(std::slice::from_ref(&p1)).unwrap();
    w(&mut s, "c", 1);
    let p2 = s.prepare(CheckpointId(2)).unwrap().unwrap();
    s.commit(&[p2]).unwrap();
    let mut got: Vec<(String, i64)> = rows(&t).into_iter().map(|(_, k, n)| (k.unwrap(), n.unwrap())).collect();
    got.sort();
    assert_eq!(got, vec![("a".into(), 2), ("b".into(), 2), ("c".into(), 1)]);
}

/// Bug: a barrier that reached an upserting sink before the completion of its previous checkpoint
/// (the final barrier racing that completion; seen in `cutline bench-postgres`) made it write keys
/// its own prepared transaction still locked: the task waited `lock_wait_ms`, failed, and the job
/// restored. Now such a checkpoint carries the rows it could not write, and they are written when it
/// commits, or by a recovery, exactly once.
#[test]
fn regression_a_barrier_before_the_previous_checkpoints_completion_blocked_the_upsert_sink() {
    let _server = shared();
    let t = table("t_barrier_race");
    let row: RowFn<(String, i64)> = Arc::new(|(k, n): &(String, i64)| vec![k.as_str().into(), (*n).into()]);
    let mut cfg = PostgresSinkConfig::upsert(&url(), &t, &["k", "n"], &["k"]);
    cfg.batch_rows = 2;
    cfg.lock_wait_ms = 300;
    let new_sink = || PostgresSink::new(cfg.clone(), row.clone());
    let mut s = new_sink();
    s.open(&ctx("race", 1)).unwrap();
    let w = |s: &mut PostgresSink<(String, i64)>, k: &str, n: i64| s.write((k.to_string(), n)).unwrap();
    let table_now = || -> Vec<(String, i64)> {
        let mut got: Vec<(String, i64)> = rows(&t).into_iter().map(|(_, k, n)| (k.unwrap(), n.unwrap())).collect();
        got.sort();
        got
    };
    w(&mut s, "a", 1);
    let p1 = s.prepare(CheckpointId(1)).unwrap().unwrap();
    // Checkpoint 2's barrier, and the end of input, before checkpoint 1 committed.
    w(&mut s, "a", 2);
    w(&mut s, "b", 2);
    let started = std::time::Instant::now();
    Sink::<(String, i64)>::end_of_input(&mut s).unwrap();
    let p2 = s.prepare(CheckpointId(2)).unwrap().expect("checkpoint 2 holds rows");
    assert!(started.elapsed() < Duration::from_millis(300), "the barrier waited for the sink's own locks");
    assert!(p2.gid.is_empty() && p2.deferred.len() == 2, "{p2:?}");
    let bytes = postcard::to_allocvec(&p2).unwrap();
    assert_eq!(postcard::from_bytes::<PreparedTxn>(&bytes).unwrap(), p2, "deferred rows round-trip");
    s.commit(std::slice::from_ref(&p1)).unwrap();
    assert_eq!(table_now(), vec![("a".into(), 1)]);
    s.commit(std::slice::from_ref(&p2)).unwrap();
    assert_eq!(table_now(), vec![("a".into(), 2), ("b".into(), 2)]);
    s.commit(std::slice::from_ref(&p2)).unwrap(); // a second commit writes nothing again
                                                  // Checkpoint 3 defers a row and the process dies before committing it (the commit window):
                                                  // the next generation's recovery writes it, once, also when it recovers twice.
    w(&mut s, "c", 1);
    let p3 = s.prepare(CheckpointId(3)).unwrap().unwrap();
    w(&mut s, "c", 3);
    let p4 = s.prepare(CheckpointId(4)).unwrap().unwrap();
    assert!(p4.gid.is_empty() && p4.deferred.len() == 1, "{p4:?}");
    Sink::<(String, i64)>::abort(&mut s);
    let mut r = new_sink();
    r.open(&ctx("race", 2)).unwrap();
    r.recover(&[p4.clone(), p3.clone()]).unwrap(); // in checkpoint order, whatever order they come in
    assert_eq!(table_now(), vec![("a".into(), 2), ("b".into(), 2), ("c".into(), 3)]);
    sql().batch_execute(&format!("UPDATE {t} SET n = 99 WHERE k = 'c'")).unwrap();
    r.recover(&[p3, p4]).unwrap();
    assert_eq!(table_now(), vec![("a".into(), 2), ("b".into(), 2), ("c".into(), 99)], "deferred rows written twice");
}

#[test]
fn bad_configurations_are_refused_at_open_with_what_is_wrong() {
    let _server = shared();
    let t = table("t_config");
    let row: RowFn<u64> = Arc::new(|i: &u64| vec![SqlValue::from(*i as i64)]);
    let cases: Vec<(PostgresSinkConfig, &str)> = vec![
        (PostgresSinkConfig::insert(&url(), "t_no_such_table", &["id"]), "does not exist"),
        (PostgresSinkConfig::insert(&url(), &t, &["idd"]), "has no column \"idd\""),
        (PostgresSinkConfig::insert(&url(), &t, &["id; drop table x"]), "not a plain SQL name"),
        (PostgresSinkConfig::upsert(&url(), &t, &["id"], &["k"]), "key column \"k\" is not one of the columns"),
        (PostgresSinkConfig { batch_rows: 0, ..PostgresSinkConfig::insert(&url(), &t, &["id"]) }, "batch_rows = 0"),
        (PostgresSinkConfig { lock_wait_ms: 0, ..PostgresSinkConfig::insert(&url(), &t, &["id"]) }, "lock_wait_ms = 0"),
        (PostgresSinkConfig::insert("postgres://nobody@[::1", &t, &["id"]), "bad connection string"),
    ];
    for (cfg, want) in cases {
        let mut s = PostgresSink::new(cfg.clone(), row.clone());
        let err = s.open(&ctx("config", 1)).unwrap_err();
        assert!(err.to_string().contains(want), "{cfg:?}: {err}");
        assert!(err.is_permanent(), "{cfg:?}: {err} should be permanent");
    }
}

#[test]
fn a_server_without_prepared_transactions_is_refused_with_how_to_fix_it() {
    let _server = shared();
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pg-test-server"))
        .env("CUTLINE_PG_MAX_PREPARED", "0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let exports = String::from_utf8(out.stdout).unwrap();
    let var = |name: &str| -> String {
        let line = exports.lines().find(|l| l.starts_with(&format!("export {name}="))).unwrap();
        line.split_once('=').unwrap().1.trim_matches('\'').to_string()
    };
    let (url0, data0) = (var("CUTLINE_PG_URL"), var("CUTLINE_PG_DATA"));
    postgres::Client::connect(&url0, postgres::NoTls).unwrap().batch_execute("CREATE TABLE t (id bigint)").unwrap();
    let row: RowFn<u64> = Arc::new(|i: &u64| vec![SqlValue::from(*i as i64)]);
    let mut s = PostgresSink::new(PostgresSinkConfig::insert(&url0, "t", &["id"]), row);
    let err = s.open(&ctx("noprep", 1)).unwrap_err();
    let _ = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pg-test-server"))
        .arg("stop")
        .env("CUTLINE_PG_DATA", &data0)
        .status();
    assert!(err.to_string().contains("max_prepared_transactions = 0"), "{err}");
    assert!(err.to_string().contains("max_prepared_transactions=64"), "the fix is not named: {err}");
    assert!(err.is_permanent());
}

// ------------------------------------------------------------------------------------------------
// Whole jobs
// ------------------------------------------------------------------------------------------------

const RECORDS: u64 = 20_000;
const KEYS: u64 = 37;

fn config(dir: &std::path::Path, job: &str, faults: Faults) -> RunConfig {
    // The fingerprint names the job, also in the sink's transaction names: one per scenario.
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), job);
    cfg.checkpoint.interval_ms = Some(20);
    cfg.batch_size = 64;
    cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 200 };
    cfg.max_repeated_failures = None;
    cfg.faults = faults;
    cfg
}

/// 2 ms every 50 records: a run lasts about half a second, some 20 checkpoints at 20 ms.
fn paced(i: u64) -> u64 {
    if i.is_multiple_of(50) {
        std::thread::sleep(Duration::from_millis(2));
    }
    i
}

/// Every record into `table` as its own row (insert mode), and per key the running count into
/// `table_counts` (upsert mode), through a keyed operator; every stage at `parallelism`.
fn graph(name: &str, table: &str, counts: &str, parallelism: u32) -> cutline::JobGraph {
    let job = Job::new(name);
    job.set_parallelism(parallelism);
    let numbers = job.source("numbers", GeneratorSource::new(RECORDS, |i| i)).map(paced);
    let ids: RowFn<u64> = Arc::new(|i: &u64| vec![SqlValue::from(*i as i64)]);
    let url = url();
    let t = table.to_string();
    let keyed = numbers.key_by(|i: &u64| i % KEYS).process("count", |k: &u64, n: &mut Option<i64>, i: u64, out| {
        let c = n.get_or_insert(0);
        *c += 1;
        out.emit((*k, *c, i));
    });
    let per_key: RowFn<(u64, i64, u64)> =
        Arc::new(|(k, c, _): &(u64, i64, u64)| vec![SqlValue::from(format!("k{k}")), SqlValue::from(*c)]);
    let counts_cfg = PostgresSinkConfig::upsert(&url, counts, &["k", "n"], &["k"]);
    let url2 = url.clone();
    let t2 = t.clone();
    keyed.sink_from("counts", move |_| PostgresSink::new(counts_cfg.clone(), per_key.clone()));
    job.source("more", GeneratorSource::new(RECORDS, |i| i))
        .map(paced)
        .sink_from("ids", move |_| PostgresSink::new(PostgresSinkConfig::insert(&url2, &t2, &["id"]), ids.clone()));
    job.build().unwrap()
}

/// The prepared transactions of the job `fingerprint` names.
fn prepared_of_job(fingerprint: &str) -> Vec<String> {
    prepared_with(&format!("cutline@{:016x}@", cutline::stable_hash(fingerprint)))
}

/// [`graph`] at parallelism 2, run to its end; the restarts it took.
fn run_job(name: &str, table: &str, counts: &str, faults: Faults) -> u32 {
    let dir = tempfile::tempdir().unwrap();
    let fingerprint = format!("{name}{}", run_id());
    let report = cutline::run(&graph(name, table, counts, 2), config(dir.path(), &fingerprint, faults)).unwrap();
    // The job finished: everything it prepared was committed or rolled back.
    let left = prepared_of_job(&fingerprint);
    assert!(left.is_empty(), "{name}: prepared transactions left after the job finished: {left:?}");
    report.restarts
}

fn assert_exact(table: &str, counts: &str) {
    let ids: Vec<i64> = rows(table).iter().map(|r| r.0.unwrap()).collect();
    let n = ids.len();
    let mut dedup = ids.clone();
    dedup.dedup();
    assert_eq!(dedup.len(), n, "{} rows were written twice", n - dedup.len());
    assert_eq!(ids, (0..RECORDS as i64).collect::<Vec<_>>(), "rows lost or invented");
    let got: BTreeMap<String, i64> = rows(counts).into_iter().map(|(_, k, n)| (k.unwrap(), n.unwrap())).collect();
    let mut want = BTreeMap::new();
    for i in 0..RECORDS {
        *want.entry(format!("k{}", i % KEYS)).or_insert(0i64) += 1;
    }
    assert_eq!(got, want, "the per-key counts differ from the failure-free result");
}

#[test]
fn a_job_without_failures_writes_exactly_its_records() {
    let _server = shared();
    let (t, c) = (table("t_job_clean"), table("t_job_clean_counts"));
    assert_eq!(run_job("pg-clean", &t, &c, Faults::none()), 0);
    assert_exact(&t, &c);
}

#[test]
fn failures_at_every_step_of_the_sinks_protocol_leave_exactly_the_failure_free_result() {
    let _server = shared();
    for (i, point) in [
        FaultPoint::SinkPrepare,
        FaultPoint::SinkCommit,
        FaultPoint::SinkCommitMidway,
        FaultPoint::SinkRecover,
        FaultPoint::ProcessBatch,
    ]
    .into_iter()
    .enumerate()
    {
        let (t, c) = (table(&format!("t_fault_{i}")), table(&format!("t_fault_{i}_counts")));
        // Fail the 2nd, 5th, 8th, ... time the run reaches `point`, at most 4 times. A sink recovers
        // only at a restore, so for that point every 60th batch fails too, 3 times at most.
        let (faults, injected) = cutline::testing::sink_step_faults(point, 60, 200);
        let restarts = run_job(&format!("pg-fault-{i}"), &t, &c, faults);
        let injected = injected.load(Ordering::SeqCst).min(4);
        assert!(injected > 0, "{point:?}: no failure was injected");
        // Failures of several tasks in one generation end in one restart.
        assert!(restarts >= 1, "{point:?}: {injected} failures injected and no restart");
        assert_exact(&t, &c);
    }
}

#[test]
fn the_server_restarted_and_down_for_two_seconds_while_the_job_runs_loses_and_doubles_nothing() {
    let _server = exclusive();
    let (t, c) = (table("t_outage"), table("t_outage_counts"));
    // At the 5th commit the server restarts (every connection breaks); at the 15th it goes down
    // and comes back two seconds later.
    let commits = Arc::new(AtomicU64::new(0));
    let c2 = commits.clone();
    let faults = Faults::new(move |p| {
        if p == FaultPoint::SinkCommit {
            match c2.fetch_add(1, Ordering::SeqCst) {
                4 => server("restart", &["immediate"]),
                14 => {
                    server("down", &["immediate"]);
                    std::thread::spawn(|| {
                        std::thread::sleep(Duration::from_secs(2));
                        server("up", &[]);
                    });
                }
                _ => {}
            }
        }
        false
    });
    let restarts = run_job("pg-outage", &t, &c, faults);
    assert!(commits.load(Ordering::SeqCst) > 15, "the job ended before the second outage");
    assert!(restarts >= 1, "the broken connections caused no restore");
    assert_exact(&t, &c);
    let n: i64 =
        sql().query_one(&format!("SELECT count(*) FROM {MARKER_TABLE} WHERE job LIKE '%'"), &[]).unwrap().get(0);
    assert!(n > 0);
}

#[test]
fn committables_round_trip_through_a_checkpoint() {
    let _server = shared();
    let p = PreparedTxn { gid: "cutline@j@out@0@4294967296-3".into(), checkpoint: 3, deferred: Default::default() };
    let bytes = postcard::to_allocvec(&p).unwrap();
    assert_eq!(postcard::from_bytes::<PreparedTxn>(&bytes).unwrap(), p);
}
