//! `cutline bench` prints a rate only for work it checked was done: its sink counted one update per
//! requested event, and the keyed state it saw adds up to the events (see `src/tally.rs`). Its
//! checkpoint statistics are the median and the maximum (with a handful of checkpoints a high
//! percentile is the maximum, so it is called that).

mod common;

use cutline_cli::tally::{expected_value_sum, read_tallies, BenchTally};
use std::collections::BTreeMap;

/// Run `cutline bench ARGS`; its `key=value` line, or the failure.
fn bench(args: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let out = common::cutline().arg("bench").args(args).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(format!("cutline bench {args:?} failed ({}): {stdout}{stderr}", out.status));
    }
    let line = stdout.lines().find(|l| l.starts_with("events=")).ok_or_else(|| format!("no result line: {stdout}"))?;
    Ok(line.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect())
}

fn num(r: &BTreeMap<String, String>, k: &str) -> u64 {
    r.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no number {k} in {r:?}"))
}

/// What every run must show: the work checked, and statistics named for what they are.
fn assert_checked(r: &BTreeMap<String, String>, events: u64, verified: &str) {
    assert_eq!(num(r, "sink_records"), events, "{r:?}");
    assert_eq!(r.get("verified").map(String::as_str), Some(verified), "{r:?}");
    if verified == "sink+state" {
        assert_eq!(num(r, "state_count"), events, "{r:?}");
    }
    for k in ["duration", "alignment", "start_delay"] {
        assert!(num(r, &format!("{k}_max_ms")) >= num(r, &format!("{k}_p50_ms")), "{k}: {r:?}");
    }
    assert!(!r.keys().any(|k| k.contains("p99")), "a p99 of a handful of checkpoints is the max: {r:?}");
    assert!(num(r, "events_per_s") > 0, "{r:?}");
}

#[test]
fn the_keyed_benchmark_in_one_process_checks_its_sink_and_state_before_it_prints_a_rate() {
    let r = bench(&["--events", "300000", "--keys", "1000", "--parallelism", "2", "--checkpoint-interval", "20ms"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_checked(&r, 300_000, "sink+state");
    let r =
        bench(&["--events", "20000", "--keys", "50", "--checkpoint-interval", "off"]).unwrap_or_else(|e| panic!("{e}"));
    assert_checked(&r, 20_000, "sink+state");
    assert_eq!(num(&r, "checkpoints"), 0, "{r:?}");
}

#[test]
fn the_keyed_benchmark_on_two_worker_processes_checks_what_their_sinks_committed() {
    let r = bench(&[
        "--events",
        "300000",
        "--keys",
        "1000",
        "--parallelism",
        "2",
        "--checkpoint-interval",
        "20ms",
        "--workers",
        "2",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert_checked(&r, 300_000, "sink+state");
}

/// The disk state backend on a cluster: the coordinator hands it to the workers, whose keyed tasks
/// keep their counts in stores under the directory (and remove them when done).
#[cfg(feature = "spill")]
#[test]
fn the_keyed_benchmark_with_state_on_disk_on_two_worker_processes_checks_its_sinks() {
    let local = tempfile::tempdir().unwrap();
    let dir = local.path().join("local-state");
    let r = bench(&[
        "--events",
        "300000",
        "--keys",
        "5000",
        "--parallelism",
        "2",
        "--checkpoint-interval",
        "20ms",
        "--workers",
        "2",
        "--state-backend",
        "disk",
        "--state-cache-entries",
        "64",
        "--local-state-dir",
        dir.to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert_checked(&r, 300_000, "sink+state");
    assert_eq!(r.get("backend").map(String::as_str), Some("disk"), "{r:?}");
    let left: Vec<_> = std::fs::read_dir(&dir).expect("the workers made their stores here").collect();
    assert!(left.is_empty(), "stores left behind: {left:?}");
}

#[test]
fn state_backend_flags_that_cannot_work_are_refused_before_the_job_starts() {
    let local = tempfile::tempdir().unwrap();
    let dir = local.path().join("local-state");
    let dir = dir.to_str().unwrap();
    for (flags, says) in [
        (vec!["--state-backend", "rocksdb"], "--state-backend \"rocksdb\": use memory or disk"),
        (vec!["--local-state-dir", dir], "--local-state-dir is for --state-backend disk"),
        (vec!["--state-cache-entries", "100"], "--state-cache-entries is for --state-backend disk"),
        (
            vec!["--state-backend", "disk", "--local-state-dir", dir, "--state-cache-entries", "0"],
            "needs a cache of at least 1 entry",
        ),
    ] {
        let out = common::cutline().args(["bench", "--events", "1000", "--keys", "10"]).args(&flags).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{flags:?}: {stderr}");
    }
    assert!(!local.path().join("local-state").exists(), "a refused run made its store directory");
}

#[test]
fn the_checkpoint_timeout_reaches_the_job_and_a_bad_one_is_refused() {
    // The job's own check sees the value, so the flag was passed through. (A first version waited
    // for 1 ms timeouts to fail the job; on CI's machine a checkpoint completed within 1 ms.)
    let e = bench(&["--events", "1000", "--keys", "10", "--checkpoint-timeout", "0s"]).expect_err("a zero timeout");
    assert!(e.contains("checkpoint timeout must be positive"), "{e}");
    let e = bench(&["--events", "1000", "--keys", "10", "--checkpoint-timeout", "soon"]).expect_err("not a duration");
    assert!(e.contains("--checkpoint-timeout: bad duration \"soon\""), "{e}");
}

#[test]
fn after_a_killed_worker_the_benchmark_still_counts_every_update_exactly_once() {
    let events = 6_000_000;
    let r = bench(&[
        "--events",
        &events.to_string(),
        "--keys",
        "100000",
        "--parallelism",
        "2",
        "--checkpoint-interval",
        "100ms",
        "--workers",
        "2",
        "--kill-worker-after",
        "300ms",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(num(&r, "restarts") >= 1, "{r:?}");
    // Sinks restored from a checkpoint start their per-key tables over: only the updates are checked,
    // and the line says so. (A restart before the first checkpoint starts from scratch, and the
    // state is checked as in a run without failures.)
    match r.get("verified").map(String::as_str) {
        Some("sink") => {
            assert_checked(&r, events, "sink");
            assert_eq!(r.get("state_count").map(String::as_str), Some("unknown"), "{r:?}");
        }
        _ => assert_checked(&r, events, "sink+state"),
    }
}

#[test]
fn a_tally_that_disagrees_with_the_events_is_refused() {
    let events = 10_000;
    let good = BenchTally {
        subtasks: 2,
        records: events,
        state_count: events,
        state_sum: expected_value_sum(events),
        state_complete: true,
    };
    assert_eq!(good.check(events, 2), Ok(()));
    let bad = [
        ("a subtask missing", BenchTally { subtasks: 1, ..good.clone() }, "sink subtasks"),
        ("a lost batch", BenchTally { records: events - 64, ..good.clone() }, "updates"),
        ("a duplicate", BenchTally { records: events + 1, ..good.clone() }, "updates"),
        ("a count off", BenchTally { state_count: events - 1, ..good.clone() }, "counts"),
        ("a sum off", BenchTally { state_sum: good.state_sum + 7, ..good.clone() }, "sums"),
    ];
    for (what, t, says) in bad {
        let e = t.check(events, 2).expect_err(what);
        assert!(e.contains(says), "{what}: {e}");
    }
    // After a restore only the updates are checked.
    let restored = BenchTally { state_count: 1, state_sum: 2, state_complete: false, ..good.clone() };
    assert_eq!(restored.check(events, 2), Ok(()));

    // The tally files: the latest of each subtask counts; garbage is an error, not a zero.
    let s = common::Scratch::new("tally");
    s.write("tally-00000-00000000000000000003", "100 40 900 true\n");
    s.write("tally-00000-00000000000000000007", "250 250 9000 true\n");
    s.write("tally-00001-00000000000000000007", "150 150 1000 false\n");
    let t = read_tallies(&s.dir).unwrap();
    assert_eq!(t, BenchTally { subtasks: 2, records: 400, state_count: 400, state_sum: 10_000, state_complete: false });
    s.write("tally-00002-00000000000000000001", "12 twelve 0 true\n");
    assert!(read_tallies(&s.dir).expect_err("malformed").contains("malformed"));
}

#[test]
fn bench_nexmark_prints_rates_only_after_the_rows_match_the_reference_and_refuses_bad_input() {
    let out = common::cutline()
        .args([
            "bench",
            "nexmark",
            "--query",
            "q5",
            "--events",
            "200000",
            "--parallelism",
            "2",
            "--checkpoint-interval",
            "50ms",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("q5 events=200000 parallelism=2 rows=") && last.contains("on/off"), "{stdout}");
    let rows: u64 = last.split("rows=").nth(1).and_then(|r| r.split(':').next()).and_then(|r| r.parse().ok()).unwrap();
    assert!(rows > 0, "a run with no rows measures nothing: {stdout}");
    for (args, says) in [
        (vec!["--query", "q9"], "not implemented"),
        (vec!["--query", "q1", "--checkpoint-interval", "off"], "duration"),
        (vec!["--query", "q1", "--reps", "0"], "at least 1"),
    ] {
        let out = common::cutline().args(["bench", "nexmark"]).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn bench_timers_reports_checkpoints_that_held_every_timer_and_the_firing() {
    let out = common::cutline()
        .args(["bench", "timers", "--timers", "50000", "--checkpoint-interval", "200ms"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("timers=50000: ") && stdout.contains("checkpoints with every timer pending"), "{stdout}");
    assert!(stdout.contains("firing all 50000 took"), "{stdout}");
    let out = common::cutline().args(["bench", "timers", "--timers", "0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("at least 1"), "{stderr}");
}

#[test]
fn a_scraped_benchmark_counts_its_scrapes_and_the_metrics_benchmark_checks_every_task_is_shown() {
    let r =
        bench(&["--events", "20000000", "--keys", "1000", "--checkpoint-interval", "100ms", "--scrape-every", "50ms"])
            .unwrap();
    assert_checked(&r, 20_000_000, "sink+state");
    assert!(num(&r, "scrapes") >= 1, "{r:?}");
    let refused = bench(&["--events", "1000", "--workers", "2", "--scrape-every", "1s"]).unwrap_err();
    assert!(refused.contains("leave out --workers"), "{refused}");
    let out = common::cutline().args(["bench", "metrics", "--tasks", "40", "--requests", "5"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("tasks=40 busy=false path=")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains("path=/metrics") && lines[0].contains("p50_ms="), "{text}");
}
