//! `cutline run wordcount --output postgres://...?table=NAME` against a real PostgreSQL server
//! (feature `postgres`; `scripts/test` starts one and exports `CUTLINE_PG_URL`): killed with SIGKILL
//! at random moments and, with `--kill-self-at`, exactly in the commit window and at the other steps
//! of the sink's protocol, then resumed; the table must hold exactly the failure-free counts, nothing prepared may be left over,
//! and at least one run must have restored a checkpoint.
#![cfg(all(unix, feature = "postgres"))]

mod common;

use common::cluster::Cluster;
use common::drill::{kill_and_resume, Drill, DrillReport, SINK_STEPS};
use common::pg::{assert_exact_counts, file_input, psql, url};
use common::{cutline, restored_checkpoints, word_lines, Scratch, XorShift};
use std::time::Duration;

#[test]
fn wordcount_into_postgres_killed_at_random_moments_then_resumed_holds_exactly_the_failure_free_counts() {
    let scratch = Scratch::new("pg-kill9");
    let text = word_lines(11, 40_000, (1, 8), 20_000);
    let input = scratch.write("input.txt", &text);
    let table = "cli_kill9_counts";
    psql(&format!("DROP TABLE IF EXISTS {table}"));
    let output = format!("{}?table={table}", url());
    let args: Vec<String> = [
        "run",
        "wordcount",
        "--input",
        &input.display().to_string(),
        "--output",
        &output,
        "--state",
        &scratch.arg("state"),
        "--parallelism",
        "2",
        "--checkpoint-interval",
        "20ms",
        "--line-delay-us",
        "30",
        "-v",
    ]
    .map(String::from)
    .to_vec();
    let drill = Drill { rounds: 8, kill_delay_ms: (150, 900), time_limit: Duration::from_secs(180), seed: 7 };
    let DrillReport { killed, restored } = kill_and_resume(&scratch, &args, &drill);
    assert_exact_counts(&text, &file_input(&input), table, &restored, &scratch.events("runs"));
    eprintln!("{killed} kills, restored checkpoints {restored:?}");
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
    let job: Vec<String> = [
        "run",
        "wordcount",
        "--input",
        &input.display().to_string(),
        "--output",
        &output,
        "--state",
        &scratch.arg("state"),
        "--parallelism",
        "2",
        "--checkpoint-interval",
        "30ms",
        "--line-delay-us",
        "600",
        "--replacement-wait",
        "3s",
    ]
    .map(String::from)
    .to_vec();
    let mut rng = XorShift::new(13);
    let mut c = Cluster::start(&scratch, 2, &job);
    // A generation takes about a second to deploy (the sinks fence and recover): kills are spaced
    // so that most land once it runs, after the first checkpoint.
    c.wait_for_checkpoints(1, Duration::from_secs(60));
    let killed = c.chaos(&mut rng, 8, (900, 2200), &SINK_STEPS);
    let status = c.wait(Duration::from_secs(180));
    assert!(
        status.success(),
        "the coordinator failed ({status}) after kills {killed:?}; logs in {}",
        scratch.dir.display()
    );
    let restored = restored_checkpoints(&scratch.events("coordinator"));
    assert!(killed.len() >= 5, "the job finished before most kills ({killed:?}): make it longer");
    assert!(!restored.is_empty(), "no generation restored a checkpoint after kills {killed:?}");
    assert!(
        killed.iter().any(|k| k.ends_with("killed itself")),
        "no worker killed itself at a step of the sink's protocol: {killed:?}"
    );
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
