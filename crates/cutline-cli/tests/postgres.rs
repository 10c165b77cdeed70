//! `cutline run wordcount --output postgres://...?table=NAME` against a real PostgreSQL server
//! (feature `postgres`; `scripts/test` starts one and exports `CUTLINE_PG_URL`): killed with SIGKILL
//! at random moments and, with `--kill-self-at`, exactly in the commit window and at the other steps
//! of the sink's protocol, then resumed; the table must hold exactly the failure-free counts, nothing prepared may be left over,
//! and at least one run must have restored a checkpoint.
#![cfg(all(unix, feature = "postgres"))]

mod common;

use common::{cutline, expected_counts, restored_checkpoints, wait_bounded, word_lines, Scratch, XorShift};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

const KILL_ROUNDS: u32 = 8;
const KILL_DELAY_MS: (u64, u64) = (150, 900);
const TIME_LIMIT: Duration = Duration::from_secs(180);

fn url() -> String {
    std::env::var("CUTLINE_PG_URL").expect(
        "CUTLINE_PG_URL is not set: run the tests with scripts/test, or eval \"$(scripts/pg-test-server)\" first",
    )
}

/// One SQL query through `psql`, rows as `a|b` lines.
fn psql(sql: &str) -> String {
    let out = Command::new("psql").args([&url(), "-X", "-q", "-At", "-c", sql]).output().expect("run psql");
    assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn wordcount_into_postgres_killed_at_random_moments_then_resumed_holds_exactly_the_failure_free_counts() {
    let scratch = Scratch::new("pg-kill9");
    let text = word_lines(11, 40_000, (1, 8), 400);
    let input = scratch.write("input.txt", &text);
    let table = "cli_kill9_counts";
    psql(&format!("DROP TABLE IF EXISTS {table}"));
    let output = format!("{}?table={table}", url());
    let args = |state: &std::path::Path| -> Vec<String> {
        [
            "run",
            "wordcount",
            "--input",
            &input.display().to_string(),
            "--output",
            &output,
            "--state",
            &state.display().to_string(),
            "--parallelism",
            "2",
            "--checkpoint-interval",
            "20ms",
            "--line-delay-us",
            "30",
            "-v",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let state = scratch.path("state");
    let mut rng = XorShift::new(7);
    let start = Instant::now();
    let mut killed = 0;
    // Even rounds are killed from outside at a random moment; odd ones kill themselves at a step of
    // the sink's protocol: in the commit window (a checkpoint complete, its output not committed),
    // halfway through committing, before preparing, while recovering.
    let aimed = ["sink-commit", "sink-commit-midway", "sink-commit", "sink-prepare", "sink-recover"];
    for round in 0..KILL_ROUNDS {
        assert!(start.elapsed() < TIME_LIMIT, "time limit exceeded in round {round}");
        let mut a = args(&state);
        if round % 2 == 1 {
            a.extend(["--kill-self-at".into(), format!("{}:{}", rng.pick(&aimed), rng.range(2, 12))]);
        }
        let mut child = cutline().args(&a).stdout(scratch.log("runs")).stderr(scratch.log("runs")).spawn().unwrap();
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_millis(rng.range(KILL_DELAY_MS.0, KILL_DELAY_MS.1)));
            let _ = child.kill();
        }
        let status = wait_bounded(&mut child, &scratch, &format!("round {round}"));
        match status.signal() {
            Some(9) => killed += 1,
            _ => {
                assert!(status.success(), "round {round}: the run failed: {}", scratch.log_text("runs"));
                break; // it finished before the kill
            }
        }
    }
    let mut last =
        cutline().args(args(&state)).stdout(scratch.log("runs")).stderr(scratch.log("runs")).spawn().unwrap();
    let status = wait_bounded(&mut last, &scratch, "the last run");
    assert!(status.success(), "the last run failed: {}", scratch.log_text("runs"));
    assert!(killed >= 3, "only {killed} runs were killed: the drill injected too few failures");
    let restored = restored_checkpoints(&scratch.events("runs"));
    assert!(!restored.is_empty(), "no run restored a checkpoint: every kill landed before the first one");

    let got: BTreeMap<String, u64> = psql(&format!("SELECT word, count FROM {table}"))
        .lines()
        .map(|l| {
            let (w, c) = l.split_once('|').unwrap();
            (w.to_string(), c.parse().unwrap())
        })
        .collect();
    let want = expected_counts(&text);
    let wrong: Vec<_> = want.iter().filter(|(w, c)| got.get(*w) != Some(c)).take(5).collect();
    assert!(
        got.len() == want.len() && wrong.is_empty(),
        "{} words in the table, {} expected; first differences {wrong:?} (table has {:?})",
        got.len(),
        want.len(),
        wrong.iter().map(|(w, _)| got.get(*w)).collect::<Vec<_>>()
    );
    // Upserts heal a lost intermediate transaction (a later one writes the newer count), so the table
    // alone cannot show a commit window that lost output. The marker rows can: every restored
    // checkpoint's transactions must have been committed, before the kill or by the recovery.
    let name = cutline_cli::jobs::WordcountOutput::parse(&output).unwrap().name();
    let fingerprint = format!("wordcount input={} output={name}", std::fs::canonicalize(&input).unwrap().display());
    let job = format!("{:016x}", cutline::stable_hash(fingerprint.as_str()));
    for c in restored.iter().filter(|&&c| c > 0) {
        let n = psql(&format!(
            "SELECT count(*) FROM cutline_sink_commits WHERE job = '{job}' AND sink = 'output' AND checkpoint = {c}"
        ));
        assert_ne!(
            n.trim(),
            "0",
            "restored checkpoint {c} was never committed: its output was lost in the commit window"
        );
    }
    let left = psql("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'cutline@%@output@%'");
    assert_eq!(left.trim(), "0", "prepared transactions left over after the job finished");
    eprintln!("{killed} kills, restored checkpoints {restored:?}");
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
