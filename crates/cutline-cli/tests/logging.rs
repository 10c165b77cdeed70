//! What a run logs: JSON events (`CUTLINE_LOG_FORMAT=json`) carry their fields and the spans they
//! happened in (the job, the generation), and the human format shows one `cutline: ...` line per
//! event without the machine fields.

#![cfg(unix)]

mod common;

use common::{cutline, named, word_lines, Scratch};

fn run(s: &Scratch, json: bool, log: &str) -> std::process::ExitStatus {
    let mut cmd = cutline();
    if !json {
        cmd.env_remove("CUTLINE_LOG_FORMAT");
    }
    cmd.args(["run", "wordcount", "--input"])
        .arg(s.path("input.txt"))
        .arg("--output")
        .arg(s.path(&format!("out-{log}")))
        .arg("--state")
        .arg(s.path(&format!("state-{log}")))
        .args(["--parallelism", "2", "--checkpoint-interval", "20ms", "--line-delay-us", "20", "-v"])
        .stdout(s.log(log))
        .stderr(s.log(log))
        .status()
        .unwrap()
}

#[test]
fn json_events_name_their_job_and_generation_and_human_lines_only_the_message() {
    let s = Scratch::new("logging");
    s.write("input.txt", &word_lines(7, 3_000, (1, 6), 50));
    assert!(run(&s, true, "json").success(), "{}", s.log_text("json"));
    let events = s.events("json");
    let done: Vec<_> = named(&events, "checkpoint_complete").collect();
    assert!(!done.is_empty(), "no checkpoint completed: {}", s.log_text("json"));
    for e in &done {
        assert_eq!(e.span("job", "job"), Some("wordcount"), "{e:?}");
        assert_eq!(e.span("generation", "gen"), e.str("gen"), "{e:?}");
        assert!(e.chk().is_some() && e.u64("duration_ms").is_some() && e.u64("bytes").is_some(), "{e:?}");
    }
    let restore = named(&events, "restore").next().expect("a restore event");
    assert_eq!(restore.span("job", "job"), Some("wordcount"), "{restore:?}");

    assert!(run(&s, false, "human").success(), "{}", s.log_text("human"));
    let human = s.log_text("human");
    let lines: Vec<&str> = human.lines().filter(|l| l.starts_with("cutline: ")).collect();
    assert!(lines.iter().any(|l| l.contains("checkpoint chk-") && l.contains(" complete in ")), "{human}");
    assert!(!human.contains("\"event\"") && !human.contains("duration_ms"), "machine fields in human output: {human}");
}
