//! Operating the `cutline` binary as an adversary would: signals, a suspended job, inputs that change
//! or hold a huge line, an output directory restored from a copy, settings at their bounds. Each test
//! runs the real binary on files in a scratch directory.

#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test; `CUTLINE_TEST_BIN` names another (to show a test fails on an older one).
fn bin() -> String {
    std::env::var("CUTLINE_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_cutline").to_string())
}
/// Hard bound on waiting for a run to end by itself.
const RUN_LIMIT: Duration = Duration::from_secs(60);

struct Scratch {
    _dir: tempfile::TempDir,
    input: PathBuf,
    output: PathBuf,
    state: PathBuf,
}

/// A scratch directory with an input of `lines` lines of eight words from a small vocabulary.
fn scratch(lines: usize) -> Scratch {
    let dir = tempfile::tempdir().unwrap();
    let words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"];
    let mut text = String::new();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..lines {
        for w in 0..8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            text.push_str(words[(x % words.len() as u64) as usize]);
            text.push(if w == 7 { '\n' } else { ' ' });
        }
    }
    let input = dir.path().join("input.txt");
    std::fs::write(&input, text).unwrap();
    let (output, state) = (dir.path().join("out"), dir.path().join("state"));
    Scratch { input, output, state, _dir: dir }
}

impl Scratch {
    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = vec!["run".into(), "wordcount".into()];
        for (flag, p) in [("--input", &self.input), ("--output", &self.output), ("--state", &self.state)] {
            a.extend([flag.to_string(), p.display().to_string()]);
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }
    fn spawn(&self, extra: &[&str]) -> Child {
        Command::new(bin())
            .env("CUTLINE_HTTP", "127.0.0.1:0")
            .args(self.args(extra))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cutline")
    }
    fn run(&self, extra: &[&str]) -> Output {
        finish(self.spawn(extra))
    }
    fn socket(&self) -> PathBuf {
        self.state.join("admin.sock")
    }
    /// The committed output matches a run without failures.
    fn assert_exact(&self) {
        let text = std::fs::read_to_string(&self.input).unwrap();
        let problems = cutline_cli::jobs::check_wordcount_output(&text, &self.output).unwrap();
        assert!(problems.is_empty(), "output differs from a failure-free run: {problems:?}");
    }
}

/// Wait for `child` to exit (at most [`RUN_LIMIT`]) and collect its output.
fn finish(mut child: Child) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("cutline ran over {RUN_LIMIT:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < RUN_LIMIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

fn committed_parts(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| d.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("part-")).count())
        .unwrap_or(0)
}

#[test]
fn sigterm_stops_cleanly_says_how_to_resume_and_the_rerun_is_exact_regression_no_handler() {
    // SIGTERM and SIGINT killed the process with no message, left admin.sock behind, and gave no
    // hint of how to go on.
    for (sig, name, code) in [(libc::SIGTERM, "SIGTERM", 143), (libc::SIGINT, "SIGINT", 130)] {
        let s = scratch(20_000);
        let job = s.spawn(&["--line-delay-us", "200", "--checkpoint-interval", "50ms"]);
        wait_for("a committed checkpoint", || committed_parts(&s.output) > 0 && s.socket().exists());
        signal(&job, sig);
        let out = finish(job);
        let log = text(&out);
        assert_eq!(out.status.code(), Some(code), "{name}: {log}");
        assert!(log.contains(&format!("stopped by {name}")), "{name}: {log}");
        let from = log
            .split("resume from checkpoint ")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .unwrap_or_else(|| panic!("{name}: no checkpoint to resume from named: {log}"))
            .to_string();
        assert!(!s.socket().exists(), "{name}: admin.sock was left behind");
        let again = s.run(&[]);
        let log = text(&again);
        assert!(again.status.success(), "{name}: {log}");
        assert!(log.contains(&format!("resumed from checkpoint {from}")), "{name}: {log}");
        s.assert_exact();
    }
}

#[test]
fn a_line_over_the_limit_ends_the_run_at_once_without_restarts_regression_43_s_of_retries() {
    // A too-long line was retried 10 times (about 43 s) before the run gave up; and the limit was
    // 64 MiB, so a 17 MiB line took hundreds of MB of memory instead of being refused.
    let s = scratch(10);
    let mut input = std::fs::read_to_string(&s.input).unwrap();
    input.push_str(&"word ".repeat(17 << 20 >> 2));
    input.push_str("\nlast line\n");
    std::fs::write(&s.input, input).unwrap();
    let start = Instant::now();
    let out = s.run(&[]);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}: {log}", start.elapsed());
    assert!(log.contains("cannot recover by restarting") && log.contains("line 11 of"), "{log}");
    assert!(log.contains("longer than 16777216 bytes"), "{log}");
    assert!(!log.contains("restart attempt"), "restarted: {log}");
}

#[test]
fn input_truncated_while_the_job_runs_fails_naming_the_input_regression_finished_anyway() {
    // The source read to the new end of the truncated file and the job marked itself finished, with
    // output that matched neither file.
    let s = scratch(20_000);
    let job = s.spawn(&["--line-delay-us", "200", "--checkpoint-interval", "50ms"]);
    wait_for("a committed checkpoint", || committed_parts(&s.output) > 0);
    let len = std::fs::metadata(&s.input).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&s.input).unwrap().set_len(len / 10).unwrap();
    let start = Instant::now();
    let out = finish(job);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("truncated") && log.contains("input.txt"), "{log}");
    assert!(!log.contains("finished:") && !log.contains("restart attempt"), "{log}");
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    assert!(!s.state.join("FINISHED").exists());
}

#[test]
fn an_output_directory_restored_from_a_copy_resumes_exactly_regression_dev_ino() {
    // Committed files were known by (device, inode): after `cp -a` (a backup restored, a move to a
    // bigger disk) the resumed run took its own files for "another run's" and could not go on.
    let s = scratch(20_000);
    let mut job = s.spawn(&["--line-delay-us", "200", "--checkpoint-interval", "50ms"]);
    wait_for("committed checkpoints", || committed_parts(&s.output) >= 2);
    job.kill().unwrap();
    job.wait().unwrap();
    let copy = s.output.with_extension("copy");
    let cp = Command::new("cp").arg("-a").arg(&s.output).arg(&copy).status().unwrap();
    assert!(cp.success());
    std::fs::remove_dir_all(&s.output).unwrap();
    std::fs::rename(&copy, &s.output).unwrap();
    let out = s.run(&[]);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("resumed from checkpoint"), "{log}");
    s.assert_exact();
}

#[test]
fn max_concurrent_is_bounded_alike_for_run_and_tune_and_a_1ms_interval_keeps_data_flowing() {
    // `tune` accepted 4294967296 and `run` 32, with which a 1 ms interval nearly stopped the data
    // (a 1M-line input took 176 s instead of 3).
    let s = scratch(100_000);
    let want = "max concurrent checkpoints must be at least 1 and at most 16, not";
    let out = s.run(&["--max-concurrent", "32"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains(&format!("--max-concurrent: {want} 32")), "{}", text(&out));
    assert!(!s.state.exists(), "refused before anything was created");
    // tune: the job refuses with the same message, and keeps its settings.
    let job = s.spawn(&["--line-delay-us", "200"]);
    wait_for("the admin socket", || s.socket().exists());
    let tune = |n: &str| {
        Command::new(bin()).args(["tune", "--state"]).arg(&s.state).args(["--max-concurrent", n]).output().unwrap()
    };
    for n in ["32", "4294967296"] {
        let out = tune(n);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains(&format!("the job refused: {want} {n}")), "{}", text(&out));
    }
    assert!(text(&tune("16")).contains("max-concurrent=16"));
    signal(&job, libc::SIGTERM);
    assert_eq!(finish(job).status.code(), Some(143));
    // At the bound, with a 1 ms interval: about as fast as one checkpoint at a time, few aborted.
    let timed = |extra: &[&str]| {
        let _ = std::fs::remove_dir_all(&s.output);
        let _ = std::fs::remove_dir_all(&s.state);
        let start = Instant::now();
        let mut args = vec!["--parallelism", "2", "--checkpoint-interval", "1ms"];
        args.extend(extra);
        let out =
            Command::new(bin()).env("CUTLINE_HTTP", "127.0.0.1:0").arg("-v").args(s.args(&args)).output().unwrap();
        let log = text(&out);
        assert!(out.status.success(), "{log}");
        s.assert_exact();
        let aborted = log.lines().filter(|l| l.contains("aborted")).count();
        let completed = log.lines().filter(|l| l.contains(" complete in ")).count();
        (start.elapsed(), aborted, completed)
    };
    let (one, _, _) = timed(&["--max-concurrent", "1"]);
    let (many, aborted, completed) = timed(&["--max-concurrent", "16"]);
    assert!(many < one * 3 + Duration::from_secs(2), "16 in flight took {many:?}, one {one:?}");
    assert!(completed > 0 && aborted * 10 <= completed, "{aborted} aborted, {completed} completed");
}

#[test]
fn status_of_a_suspended_job_fails_in_seconds_regression_600_s() {
    let s = scratch(20_000);
    let job = s.spawn(&["--line-delay-us", "500"]);
    wait_for("the admin socket", || s.socket().exists());
    let status = || Command::new(bin()).args(["status", "--state"]).arg(&s.state).output().unwrap();
    assert!(status().status.success());
    signal(&job, libc::SIGSTOP);
    let start = Instant::now();
    let out = status();
    let took = start.elapsed();
    signal(&job, libc::SIGCONT);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("hung or stopped"), "{}", text(&out));
    assert!(took < Duration::from_secs(15), "took {took:?}");
    signal(&job, libc::SIGTERM);
    assert_eq!(finish(job).status.code(), Some(143));
}
