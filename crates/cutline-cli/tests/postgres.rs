//! `cutline run wordcount --output postgres://...?table=NAME` against a real PostgreSQL server
//! (feature `postgres`; `scripts/test` starts one and exports `CUTLINE_PG_URL`): killed with SIGKILL
//! at random moments and, with `--kill-self-at`, exactly in the commit window and at the other steps
//! of the sink's protocol, then resumed, also at another parallelism each time; the table must hold
//! exactly the failure-free counts, nothing prepared may be left over, and at least one run must
//! have restored a checkpoint.
#![cfg(all(unix, feature = "postgres"))]

mod common;

use common::cluster::sink_chaos;
use common::drill::{kill_and_resume, Drill, DrillReport};
use common::pg::{assert_exact_counts, file_input, psql, url};
use common::{cutline, named, word_lines, wordcount_job, Scratch};
use std::time::Duration;

/// Word count from a file (its text from `seed`) into `table`, dropped first: the scratch directory
/// (`name`), the text, the input file and the job's arguments.
fn file_to_table(name: &str, table: &str, seed: u64) -> (Scratch, String, std::path::PathBuf, Vec<String>) {
    let scratch = Scratch::new(name);
    let text = word_lines(seed, 40_000, (1, 8), 20_000);
    let input = scratch.write("input.txt", &text);
    psql(&format!("DROP TABLE IF EXISTS {table}"));
    let output = format!("{}?table={table}", url());
    let args = wordcount_job(&input.display().to_string(), &output, &scratch.arg("state"), "20ms", 30, &["-v"]);
    (scratch, text, input, args)
}

#[test]
fn wordcount_into_postgres_killed_at_random_moments_then_resumed_holds_exactly_the_failure_free_counts() {
    let table = "cli_kill9_counts";
    let (scratch, text, input, args) = file_to_table("pg-kill9", table, 11);
    let drill =
        Drill { rounds: 8, kill_delay_ms: (150, 900), parallelism: &[], time_limit: Duration::from_secs(180), seed: 7 };
    let DrillReport { killed, restored, .. } = kill_and_resume(&scratch, &args, &drill);
    assert_exact_counts(&text, &file_input(&input), table, &restored, &scratch.events("runs"));
    eprintln!("{killed} kills, restored checkpoints {restored:?}");
}

/// The same drill with every restart at another parallelism (2, 3, 1, 3, 2, 3, 1, ...): each run
/// restores the checkpoint a run at another parallelism wrote, and its sink subtasks take over the
/// prepared transactions of the old subtasks (`j % parallelism == subtask`), committing those of the
/// restored checkpoint and rolling back the rest. The runs that kill themselves at a step of the
/// sink's protocol (odd rounds) all run at 3 and the next at 1 or 2, so that the commit window they
/// leave is recovered by fewer subtasks than prepared it.
#[test]
fn wordcount_into_postgres_resumed_at_another_parallelism_after_each_kill_holds_exactly_the_failure_free_counts() {
    let table = "cli_rescale_counts";
    let (scratch, text, input, args) = file_to_table("pg-rescale", table, 29);
    let drill = Drill {
        rounds: 10,
        kill_delay_ms: (150, 900),
        parallelism: &[2, 3, 1, 3],
        time_limit: Duration::from_secs(180),
        seed: 31,
    };
    let report = kill_and_resume(&scratch, &args, &drill);
    assert_exact_counts(&text, &file_input(&input), table, &report.restored, &scratch.events("runs"));
    // The drill must have hit the commit window of a subtask that the next run no longer has: a
    // transaction it prepared (`...@<subtask>@<incarnation>-<checkpoint>`) committed by the subtask
    // that took it over.
    let taken_over: Vec<(u32, &str)> = report
        .runs
        .iter()
        .flat_map(|(p, events)| named(events, "sink_recovered_commit").map(move |e| (*p, e.str("gid").unwrap_or(""))))
        .filter(|(p, gid)| gid.rsplit('@').nth(1).and_then(|j| j.parse::<u32>().ok()).is_some_and(|j| j >= *p))
        .collect();
    assert!(
        !taken_over.is_empty(),
        "no run committed a prepared transaction of an old subtask it took over; restores {:?}",
        report.restores
    );
    eprintln!(
        "{} kills; restores (checkpoint, written at, restored at): {:?}; taken over and committed (parallelism, gid): {taken_over:?}",
        report.killed, report.restores
    );
}

/// The same job on a cluster of two worker processes (one sink subtask each, so each prepares and
/// commits its own transactions): workers and the coordinator are SIGKILLed at seeded moments, and
/// every other killed worker comes back with `--kill-self-at` a step of the sink's protocol.
#[test]
fn wordcount_into_postgres_on_two_workers_killed_many_times_holds_exactly_the_failure_free_counts() {
    let scratch = Scratch::new("pg-cluster");
    let text = word_lines(19, 40_000, (1, 8), 20_000);
    let input = scratch.write("input.txt", &text);
    let table = "cli_cluster_counts";
    psql(&format!("DROP TABLE IF EXISTS {table}"));
    let output = format!("{}?table={table}", url());
    let job = wordcount_job(
        &input.display().to_string(),
        &output,
        &scratch.arg("state"),
        "30ms",
        600,
        &["--replacement-wait", "3s"],
    );
    let (killed, restored) = sink_chaos(&scratch, &job, 13);
    let events: Vec<_> = ["coordinator", "worker-0", "worker-1"].iter().flat_map(|l| scratch.events(l)).collect();
    assert_exact_counts(&text, &file_input(&input), table, &restored, &events);
    eprintln!("kills {killed:?}; restored checkpoints {restored:?}");
}

#[test]
fn a_postgres_output_without_a_table_is_refused_before_anything_starts() {
    let scratch = Scratch::new("pg-no-table");
    let input = scratch.write("input.txt", "a b\n");
    let out = cutline()
        .args(["run", "wordcount", "--input", &input.display().to_string(), "--output"])
        .arg("postgres://someone:hunter2@127.0.0.1:1/db")
        .args(["--state", &scratch.arg("state")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("?table=NAME"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "the password was printed: {stderr}");
}

#[test]
fn bench_postgres_prints_rates_only_for_tables_it_checked() {
    let out = cutline()
        .args(["bench-postgres", "--url", &url(), "--rows", "5000", "--keys", "1000", "--reps", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("rows=5000") && stdout.contains("verified=both"), "{stdout}");
    assert!(stdout.contains("median engine_rows_per_s="), "{stdout}");
}
