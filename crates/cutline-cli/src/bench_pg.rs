//! `cutline bench-postgres`: rows per second of the exactly-once PostgreSQL sink in upsert mode,
//! through the engine with checkpoints, against a bare loop of the same client writing the same
//! rows as multi-row upserts (the ceiling), interleaved; both tables checked afterwards.

use anyhow::{bail, Context, Result};
use cutline::connectors::postgres::{PostgresSink, PostgresSinkConfig, RowFn, SqlValue};
use cutline::{GeneratorSource, Job};
use std::sync::Arc;
use std::time::Instant;

/// Rows of the bare loop committed per transaction (a checkpoint's worth at a few hundred
/// thousand rows per second and 1 s checkpoints).
const BARE_ROWS_PER_TRANSACTION: u64 = 200_000;

fn client(url: &str) -> Result<postgres::Client> {
    postgres::Client::connect(url, postgres::NoTls).with_context(|| format!("cannot connect to {url}"))
}

/// Row `i` is key `i % keys`, value `i`.
fn check(c: &mut postgres::Client, table: &str, rows: u64, keys: u64) -> Result<()> {
    let r = c.query_one(&format!("SELECT count(*), coalesce(sum(v), 0)::bigint FROM {table}"), &[])?;
    let (n, sum): (i64, i64) = (r.get(0), r.get(1));
    let want_n = keys.min(rows);
    // The last value of key k is the largest i < rows with i % keys == k.
    let want_sum: u64 = (0..want_n).map(|k| k + (rows - 1 - k) / keys * keys).sum();
    if n as u64 != want_n || sum as u64 != want_sum {
        bail!("{table} holds {n} rows summing to {sum}, expected {want_n} rows summing to {want_sum}: no rate printed");
    }
    Ok(())
}

fn bare(url: &str, rows: u64, keys: u64, batch_rows: u64) -> Result<f64> {
    let mut c = client(url)?;
    c.batch_execute(
        "DROP TABLE IF EXISTS bench_pg_bare; CREATE TABLE bench_pg_bare (k bigint PRIMARY KEY, v bigint NOT NULL)",
    )?;
    let values: Vec<String> = (0..batch_rows).map(|r| format!("(${}, ${})", 2 * r + 1, 2 * r + 2)).collect();
    let sql = |n: usize| {
        format!(
            "INSERT INTO bench_pg_bare (k, v) VALUES {} ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            values[..n].join(", ")
        )
    };
    let full = c.prepare(&sql(batch_rows as usize))?;
    let start = Instant::now();
    let mut txn = c.transaction()?;
    let mut in_txn = 0;
    let mut i = 0;
    while i < rows {
        let n = batch_rows.min(rows - i);
        let params: Vec<i64> = (i..i + n).flat_map(|j| [(j % keys) as i64, j as i64]).collect();
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
            params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect();
        if n == batch_rows {
            txn.execute(&full, &refs)?;
        } else {
            txn.execute(sql(n as usize).as_str(), &refs)?;
        }
        i += n;
        in_txn += n;
        if in_txn >= BARE_ROWS_PER_TRANSACTION {
            txn.commit()?;
            txn = c.transaction()?;
            in_txn = 0;
        }
    }
    txn.commit()?;
    let secs = start.elapsed().as_secs_f64();
    check(&mut c, "bench_pg_bare", rows, keys)?;
    Ok(rows as f64 / secs)
}

fn engine(url: &str, rows: u64, keys: u64, batch_rows: u64, interval: &str, rep: u32) -> Result<f64> {
    let mut c = client(url)?;
    c.batch_execute(
        "DROP TABLE IF EXISTS bench_pg_engine; CREATE TABLE bench_pg_engine (k bigint PRIMARY KEY, v bigint NOT NULL)",
    )?;
    let mut config = PostgresSinkConfig::upsert(url, "bench_pg_engine", &["k", "v"], &["k"]);
    config.batch_rows = batch_rows as usize;
    let row: RowFn<(u64, u64)> =
        Arc::new(|(k, v): &(u64, u64)| vec![SqlValue::Int(*k as i64), SqlValue::Int(*v as i64)]);
    let job = Job::new("bench-postgres");
    job.source("rows", GeneratorSource::new(rows, move |i| (i % keys, i))).sink("pg", PostgresSink::new(config, row));
    let graph = job.build()?;
    let interval_ms = crate::args::parse_interval(interval)?;
    let secs = crate::bench::timed_engine_run(&graph, &format!("bench-postgres {rep}"), interval_ms)?;
    check(&mut c, "bench_pg_engine", rows, keys)?;
    Ok(rows as f64 / secs)
}

/// Run `reps` interleaved pairs (engine, bare loop) and print every run and the medians.
pub(crate) fn bench_postgres(
    url: &str,
    rows: u64,
    keys: u64,
    batch_rows: u64,
    interval: &str,
    reps: u32,
) -> Result<()> {
    if keys == 0 || batch_rows == 0 || batch_rows > keys {
        bail!("--keys must be at least --batch-rows (a batch of the bare loop must not hold a key twice), both > 0");
    }
    let label = format!("rows={rows} keys={keys} batch_rows={batch_rows} interval={interval}");
    crate::bench::interleaved_pairs(
        reps,
        "rows",
        &label,
        |rep| engine(url, rows, keys, batch_rows, interval, rep),
        |_| bare(url, rows, keys, batch_rows),
    )
}
