//! A real PostgreSQL server for the tests of the `postgres` feature (`scripts/test` starts one and
//! exports `CUTLINE_PG_URL`): queries through `psql`, and the check of a word count's table.

use super::{expected_counts, named, LogEvent};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

pub fn url() -> String {
    std::env::var("CUTLINE_PG_URL").expect(
        "CUTLINE_PG_URL is not set: run the tests with scripts/test, or eval \"$(scripts/pg-test-server)\" first",
    )
}

/// One SQL query through `psql`, rows as `a|b` lines.
pub fn psql(sql: &str) -> String {
    let out = Command::new("psql").args([&url(), "-X", "-q", "-At", "-c", sql]).output().expect("run psql");
    assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A file input as the job's fingerprint names it (its canonical path).
pub fn file_input(p: &Path) -> String {
    std::fs::canonicalize(p).unwrap().display().to_string()
}

/// `table` holds exactly the counts of the words of `text`, every restored checkpoint's
/// transactions were committed, and nothing prepared is left over. `input` is the job's input as its
/// fingerprint names it ([`file_input`] for a file).
pub fn assert_exact_counts(text: &str, input: &str, table: &str, restored: &[u64], events: &[LogEvent]) {
    assert_no_completed_checkpoint_rolled_back(events);
    let output = format!("{}?table={table}", url());
    let got: BTreeMap<String, u64> = psql(&format!("SELECT word, count FROM {table}"))
        .lines()
        .map(|l| {
            let (w, c) = l.split_once('|').unwrap();
            (w.to_string(), c.parse().unwrap())
        })
        .collect();
    let want = expected_counts(text);
    let wrong: Vec<_> = want.iter().filter(|(w, c)| got.get(*w) != Some(c)).take(5).collect();
    assert!(
        got.len() == want.len() && wrong.is_empty(),
        "{} words in the table, {} expected; first differences {wrong:?} (table has {:?})",
        got.len(),
        want.len(),
        wrong.iter().map(|(w, _)| got.get(*w)).collect::<Vec<_>>()
    );
    // Upserts heal a lost transaction when a later one writes a newer count of the same word, so the
    // inputs have a large vocabulary (each word about 9 times): a lost commit window then leaves
    // words whose last update it held at an old count (seen: recovery that committed nothing failed
    // here in both drills). The marker rows say it directly: some transaction of every restored
    // checkpoint was committed, before the kill or by the recovery.
    let name = cutline_cli::jobs::WordcountOutput::parse(&output).unwrap().name();
    let fingerprint = format!("wordcount input={input} output={name}");
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
    // This job's only: other tests' jobs run at the same time.
    let left = psql(&format!("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'cutline@{job}@output@%'"));
    assert_eq!(left.trim(), "0", "prepared transactions left over after the job finished");
}

/// Some sink recovery committed a transaction its restored checkpoint prepared, and none rolled
/// back a transaction of a checkpoint that completed: that would be output
/// lost in the commit window (the table may not show it: a later upsert of the same word heals it).
/// `events` are every log of the job (the processes that ran its sinks and the one that completed
/// its checkpoints); the drills run with `-v`, so recoveries log each rollback.
pub fn assert_no_completed_checkpoint_rolled_back(events: &[LogEvent]) {
    let completed: std::collections::BTreeSet<u64> =
        named(events, "checkpoint_complete").filter_map(LogEvent::chk).collect();
    assert!(!completed.is_empty(), "no completed checkpoint in the logs: are they the job's, with -v?");
    for e in named(events, "sink_rolled_back") {
        let gid = e.str("gid").expect("a rollback names its transaction");
        let checkpoint: u64 =
            gid.rsplit('-').next().and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("gid {gid}"));
        assert!(
            !completed.contains(&checkpoint),
            "a recovery rolled back {gid}, a transaction of completed checkpoint {checkpoint}: its output was lost"
        );
    }
    // The drill must have hit the commit window: some recovery found a restored checkpoint's
    // transaction still prepared and committed it.
    let recovered = super::count(events, "sink_recovered_commit");
    assert!(
        recovered > 0,
        "no recovery committed a prepared transaction: the drill never killed a run in the commit window"
    );
}
