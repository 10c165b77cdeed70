//! Savepoints and run-time tuning through the `cutline` binary, on real files: a word-count job runs
//! with paced input (`--line-delay-us`) so that it is still running when a test acts on it through
//! `cutline status`, `tune` and `savepoint` (its admin socket, `<state>/admin.sock`); outputs are
//! compared with the output of a run without failures (`cutline_cli::jobs::check_wordcount_output`).
//!
//! Every wait polls a condition with a deadline; no test sleeps a fixed time to let something happen.
//! A failing test keeps its scratch directory (input, output, state, savepoints, the logs of every
//! run) and prints where it is.

#![cfg(unix)]

#[path = "../common/mod.rs"]
mod common;

use common::{cutline, Scratch};
use cutline::{CheckpointStore, LocalDirStore};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod status;
use status::*;

/// Bound on every wait for a condition (a job answering, a checkpoint completing, a run ending).
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(20);
/// Pacing of the first run of a scenario: a sleep per input line, in each of two source tasks.
pub(crate) const LINE_DELAY_US: &str = "1000";

// ---------------------------------------------------------------------------------------------------
// Input text, processes.

/// `lines` lines of 1 to 8 words from a 400-word vocabulary, the same for the same seed.
pub(crate) fn generate_text(seed: u64, lines: usize) -> String {
    common::word_lines(seed, lines, (1, 8), 400)
}

/// The input, output and state paths of one word-count job in a scratch directory.
pub(crate) struct WordCount {
    pub(crate) text: String,
    pub(crate) input: PathBuf,
    pub(crate) output: PathBuf,
    pub(crate) state: PathBuf,
}

impl WordCount {
    pub(crate) fn new(scratch: &Scratch, seed: u64, lines: usize) -> WordCount {
        let text = generate_text(seed, lines);
        let input = scratch.path("input.txt");
        std::fs::write(&input, &text).expect("write input");
        WordCount { text, input, output: scratch.path("output"), state: scratch.path("state") }
    }

    /// `cutline run wordcount` on `state` with parallelism 2 and `extra` arguments.
    pub(crate) fn args(&self, state: &Path, extra: &[&str]) -> Vec<OsString> {
        let mut a: Vec<OsString> = ["run", "wordcount", "--parallelism", "2", "-v", "--input"].map(Into::into).into();
        a.push(self.input.clone().into());
        a.push("--output".into());
        a.push(self.output.clone().into());
        a.push("--state".into());
        a.push(state.into());
        a.extend(extra.iter().map(OsString::from));
        a
    }

    /// The problems of the committed output against a failure-free run (empty: exact).
    pub(crate) fn problems(&self) -> Vec<String> {
        cutline_cli::jobs::check_wordcount_output(&self.text, &self.output).expect("read output")
    }
}

/// A `cutline run` in the background, its stdout and stderr in files. Killed if the test ends early.
pub(crate) struct Running {
    pub(crate) child: Child,
    pub(crate) what: String,
    pub(crate) stdout: PathBuf,
    pub(crate) stderr: PathBuf,
}

pub(crate) struct Exited {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Running {
    pub(crate) fn start(scratch: &Scratch, name: &str, args: &[OsString]) -> Running {
        let (stdout, stderr) = (scratch.path(&format!("{name}.stdout")), scratch.path(&format!("{name}.stderr")));
        let child = cutline()
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("log file"))
            .stderr(File::create(&stderr).expect("log file"))
            .spawn()
            .expect("start cutline");
        Running { child, what: format!("{name}: cutline {}", show(args)), stdout, stderr }
    }

    pub(crate) fn logs(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!("{}\n--- stdout ---\n{}--- stderr ---\n{}", self.what, read(&self.stdout), read(&self.stderr))
    }

    /// Wait for the run to exit by itself.
    pub(crate) fn wait(&mut self) -> Exited {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
                return Exited { status, stdout: read(&self.stdout), stderr: read(&self.stderr) };
            }
            if Instant::now() > deadline {
                panic!("the run did not exit within {WAIT_LIMIT:?}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait for a successful exit; its stdout.
    pub(crate) fn wait_success(&mut self) -> String {
        let e = self.wait();
        assert!(e.status.success(), "the run failed ({})\n{}", e.status, self.logs());
        e.stdout
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(crate) fn show(args: &[OsString]) -> String {
    args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
}

/// Run `cutline ARGS` to completion (bounded).
pub(crate) fn cli<S: AsRef<OsStr>>(args: &[S]) -> Exited {
    let mut child = cutline()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cutline");
    // Drain the pipes on threads so that a chatty command cannot block on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).map(|_| s).unwrap_or_default()
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).map(|_| s).unwrap_or_default()
    });
    let deadline = Instant::now() + WAIT_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let a: Vec<OsString> = args.iter().map(|a| a.as_ref().to_owned()).collect();
            panic!("cutline {} did not exit within {WAIT_LIMIT:?}", show(&a));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Exited { status, stdout: out.join().expect("stdout"), stderr: err.join().expect("stderr") }
}

pub(crate) fn state_arg(cmd: &str, state: &Path) -> Vec<OsString> {
    vec![cmd.into(), "--state".into(), state.into()]
}

/// `cutline CMD --state STATE EXTRA...`, which must succeed; its stdout.
pub(crate) fn cli_ok(cmd: &str, state: &Path, extra: &[&str]) -> String {
    let mut a = state_arg(cmd, state);
    a.extend(extra.iter().map(OsString::from));
    let e = cli(&a);
    assert!(e.status.success(), "cutline {} failed: {}\n{}", show(&a), e.status, e.stderr);
    e.stdout
}

/// `cutline CMD --state STATE EXTRA...`, which must fail with a message (not a panic) that contains
/// every one of `must_mention`; its stderr.
pub(crate) fn cli_refused(cmd: &str, state: &Path, extra: &[&str], must_mention: &[&str]) -> String {
    let mut a = state_arg(cmd, state);
    a.extend(extra.iter().map(OsString::from));
    let e = cli(&a);
    assert_refused(&a, &e, must_mention);
    e.stderr
}

pub(crate) fn assert_refused(args: &[OsString], e: &Exited, must_mention: &[&str]) {
    let what = format!("cutline {}\n--- stdout ---\n{}--- stderr ---\n{}", show(args), e.stdout, e.stderr);
    assert!(!e.status.success(), "expected a refusal: {what}");
    assert_eq!(e.status.code(), Some(1), "expected an ordinary error exit: {what}");
    assert!(!e.stderr.contains("panicked"), "expected an error message, not a panic: {what}");
    for m in must_mention {
        assert!(e.stderr.contains(m), "the error should mention {m:?}: {what}");
    }
}

/// Poll `f` until it returns `Some`, at most [`WAIT_LIMIT`].
pub(crate) fn wait_until<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::wait_until(what, WAIT_LIMIT, f)
}

// ---------------------------------------------------------------------------------------------------
// Scenarios.

#[test]
fn a_job_stopped_with_a_savepoint_and_resumed_from_it_on_a_new_state_directory_writes_exactly_the_failure_free_output()
{
    let scratch = Scratch::new("sp-stop");
    let wc = WordCount::new(&scratch, 1, 12_000);
    let first_state = scratch.path("state-1");
    let mut first = Running::start(
        &scratch,
        "first",
        &wc.args(&first_state, &["--checkpoint-interval", "100ms", "--line-delay-us", LINE_DELAY_US]),
    );
    wait_for_checkpoints(&mut first, &first_state, 3);

    let sp = cli_ok("savepoint", &first_state, &["--stop"]);
    let sp = PathBuf::from(sp.trim());
    assert!(sp.starts_with(first_state.join("savepoints")), "default savepoint directory: {}", sp.display());
    // `cutline savepoint --stop` returns once the job has stopped.
    assert!(!socket_of(&first_state).exists(), "the stopped job's admin socket is still there");
    let out = first.wait_success();
    assert!(
        out.contains("stopped with savepoint") && out.contains(&sp.display().to_string()),
        "the run should print its savepoint:\n{}",
        first.logs()
    );
    assert!(!first_state.join("FINISHED").exists(), "the job ran to the end before it was stopped");
    assert!(!wc.problems().is_empty(), "the job was stopped, yet its output is complete:\n{}", first.logs());
    let sp_id = LocalDirStore::open_existing(&sp).unwrap().latest_complete().unwrap().expect("savepoint checkpoint");

    // A new run on a new state directory, same input and output, from the savepoint (not paced).
    let second_state = scratch.path("state-2");
    let mut a = wc.args(&second_state, &["--checkpoint-interval", "100ms"]);
    a.push("--from-savepoint".into());
    a.push(sp.clone().into());
    let mut second = Running::start(&scratch, "second", &a);
    let out = second.wait_success();
    assert!(
        out.contains("finished") && out.contains(&format!("resumed from checkpoint {}", sp_id.0)),
        "the new run should resume from the savepoint:\n{}",
        second.logs()
    );
    let problems = wc.problems();
    assert!(problems.is_empty(), "output differs from a failure-free run: {problems:?}\n{}", second.logs());
}

#[test]
fn a_savepoint_taken_while_the_job_runs_is_self_contained_outlives_retention_and_restores_into_a_new_run() {
    let scratch = Scratch::new("sp-running");
    let wc = WordCount::new(&scratch, 2, 7_000);
    let mut job = Running::start(
        &scratch,
        "job",
        &wc.args(&wc.state, &["--checkpoint-interval", "50ms", "--line-delay-us", LINE_DELAY_US]),
    );
    wait_for_checkpoints(&mut job, &wc.state, 2);
    let target = scratch.path("my savepoint");
    let printed = cli_ok("savepoint", &wc.state, &["--to", target.to_str().unwrap()]);
    assert_eq!(PathBuf::from(printed.trim()), target, "the printed savepoint path");
    let sp_id = LocalDirStore::open_existing(&target).unwrap().latest_complete().unwrap().expect("a savepoint");
    let s = try_status(&wc.state).expect("the job answers after its savepoint");
    assert!(
        s.checkpoints.iter().any(|c| c.id == sp_id.0 && c.savepoint),
        "status should list savepoint {sp_id}:\n{}",
        s.text
    );

    // Several checkpoints later, retention (3 kept) has removed the savepoint's checkpoint from the
    // job's own store; the exported savepoint is untouched.
    wait_until("4 checkpoints after the savepoint", || {
        let s = try_status(&wc.state)?;
        s.checkpoints.iter().any(|c| c.id >= sp_id.0 + 4).then_some(())
    });
    let store = LocalDirStore::open_existing(&wc.state).unwrap();
    wait_until("retention to remove the savepoint's checkpoint from the job's store", || {
        (!store.list_checkpoints().unwrap().iter().any(|l| l.id == sp_id)).then_some(())
    });
    let sp_files = files_under(&target);
    assert!(sp_files.iter().any(|(p, _)| p.ends_with("_MANIFEST")), "no manifest in {sp_files:?}");
    let job_files = files_under(&wc.state);
    for (p, id) in &sp_files {
        if let Some((q, _)) = job_files.iter().find(|(_, j)| j == id) {
            panic!("savepoint file {} is the job's file {}", p.display(), q.display());
        }
    }

    let out = job.wait_success();
    assert!(out.contains("finished"), "{}", job.logs());
    assert!(wc.problems().is_empty(), "the uninterrupted job's own output is wrong: {:?}", wc.problems());
    let sp_store = LocalDirStore::open_existing(&target).unwrap();
    sp_store.verify(sp_id).unwrap_or_else(|e| panic!("the savepoint no longer verifies after the job ended: {e}"));
    assert_eq!(files_under(&target).len(), sp_files.len(), "the savepoint directory changed");

    // The job's output and checkpoints are named by its input and output paths, so a savepoint is
    // restored into a run with the same --output: the directory at that path is a new one, holding
    // the output as of the savepoint (the committed files up to its checkpoint, hard-linked: a commit
    // recognises its own files by identity), and the first run's full output is moved aside.
    let moved = scratch.path("output-of-the-first-run");
    std::fs::rename(&wc.output, &moved).unwrap();
    std::fs::create_dir(&wc.output).unwrap();
    let mut kept = 0;
    for e in std::fs::read_dir(&moved).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if part_checkpoint(&name).is_some_and(|c| c <= sp_id.0) {
            std::fs::hard_link(moved.join(&name), wc.output.join(&name)).unwrap();
            kept += 1;
        }
    }
    assert!(kept > 0, "no output was committed by the savepoint's checkpoint {sp_id}");
    assert!(!wc.problems().is_empty(), "the output as of the savepoint is already complete");

    let new_state = scratch.path("state-restored");
    let mut a = wc.args(&new_state, &[]);
    a.push("--from-savepoint".into());
    a.push(target.clone().into());
    let mut restored = Running::start(&scratch, "restored", &a);
    let out = restored.wait_success();
    assert!(out.contains(&format!("resumed from checkpoint {}", sp_id.0)), "{}", restored.logs());
    let problems = wc.problems();
    assert!(problems.is_empty(), "output differs from a failure-free run: {problems:?}\n{}", restored.logs());

    // A run with another output is another job: refused before anything is created.
    let other_output = scratch.path("other-output");
    let other_state = scratch.path("other-state");
    let mut a: Vec<OsString> = ["run", "wordcount", "--input"].map(Into::into).into();
    a.extend([wc.input.clone().into(), "--output".into(), other_output.clone().into(), "--state".into()]);
    a.extend([other_state.clone().into(), "--from-savepoint".into(), target.clone().into()]);
    let e = cli(&a);
    assert_refused(&a, &e, &["--from-savepoint", "the same --input and --output"]);
    assert!(!other_output.exists() && !other_state.exists(), "a refused run created directories");
}

#[test]
fn tune_changes_the_interval_and_switches_to_unaligned_while_the_job_runs_and_status_shows_it() {
    let scratch = Scratch::new("sp-tune");
    let wc = WordCount::new(&scratch, 3, 12_000);
    let mut job = Running::start(
        &scratch,
        "job",
        &wc.args(&wc.state, &["--checkpoint-interval", "1s", "--line-delay-us", LINE_DELAY_US]),
    );
    let before = wait_for_checkpoints(&mut job, &wc.state, 1);
    assert!(before.settings.contains("interval=1s") && before.settings.contains("unaligned=false"), "{before:?}");
    assert!(before.checkpoints.iter().all(|c| c.unaligned_tasks == 0), "aligned job:\n{}", before.text);
    let last_aligned = before.checkpoints.iter().map(|c| c.id).max().unwrap();

    let tuned_at = Instant::now();
    let printed = tuned(&cli_ok("tune", &wc.state, &["--checkpoint-interval", "40ms", "--unaligned", "true"]));
    assert!(printed.contains("interval=40ms") && printed.contains("unaligned=true"), "tune printed {printed:?}");
    assert!(printed.contains("mode=exactly-once") && printed.contains("max-concurrent=1"), "{printed:?}");

    // At the old interval, six more checkpoints would take at least six seconds.
    let after = wait_until("six unaligned checkpoints after the tune", || {
        let s = try_status(&wc.state)?;
        let unaligned = s.checkpoints.iter().filter(|c| c.id > last_aligned && c.unaligned_tasks > 0).count();
        (unaligned >= 6).then_some(s)
    });
    assert!(
        tuned_at.elapsed() < Duration::from_secs(5),
        "six checkpoints took {:?} after the interval became 40 ms",
        tuned_at.elapsed()
    );
    assert!(after.settings.contains("interval=40ms") && after.settings.contains("unaligned=true"), "{after:?}");
    assert!(after.text.contains("in-flight bytes") && after.text.contains("backpressured"), "{}", after.text);

    // Stop it, then run the same job again without pacing: it resumes from its latest (unaligned)
    // checkpoint and ends with exactly the failure-free output.
    let answer = cutline::admin::request_ok(&socket_of(&wc.state), "stop").unwrap();
    assert_eq!(answer, "stopping");
    let out = job.wait_success();
    assert!(out.contains("stopped:"), "{}", job.logs());
    let mut again = Running::start(&scratch, "again", &wc.args(&wc.state, &[]));
    let out = again.wait_success();
    assert!(out.contains("finished") && out.contains("resumed from checkpoint"), "{}", again.logs());
    let problems = wc.problems();
    assert!(problems.is_empty(), "output differs from a failure-free run: {problems:?}\n{}", again.logs());
}

#[test]
fn bad_tune_values_are_refused_with_the_reason_and_change_nothing() {
    let scratch = Scratch::new("sp-badtune");
    let wc = WordCount::new(&scratch, 4, 12_000);
    let mut job = Running::start(
        &scratch,
        "job",
        &wc.args(&wc.state, &["--checkpoint-interval", "300ms", "--line-delay-us", LINE_DELAY_US]),
    );
    wait_for_checkpoints(&mut job, &wc.state, 0);
    let before = tuned(&cli_ok("tune", &wc.state, &[]));
    assert!(before.contains("interval=300ms") && before.contains("unaligned=false"), "{before:?}");

    let cases: &[(&[&str], &[&str])] = &[
        (&["--checkpoint-interval", "5parsecs"], &["--checkpoint-interval", "5parsecs"]),
        (&["--checkpoint-interval", "0ms"], &["interval must be positive"]),
        (&["--checkpoint-timeout", "0"], &["timeout must be positive"]),
        (&["--unaligned", "maybe"], &["--unaligned", "true or false"]),
        (&["--mode", "most-once"], &["most-once", "exactly-once or at-least-once"]),
        (&["--max-aligned-bytes", "lots"], &["--max-aligned-bytes", "lots"]),
        // Valid values together with an invalid one: nothing changes.
        (&["--checkpoint-interval", "70ms", "--max-concurrent", "0"], &["the job refused", "at least 1"]),
        (&["--unaligned", "true", "--mode", "at-least-once"], &["the job refused", "exactly-once mode"]),
    ];
    for (args, reasons) in cases {
        cli_refused("tune", &wc.state, args, reasons);
        let now = tuned(&cli_ok("tune", &wc.state, &[]));
        assert_eq!(now, before, "the refused tune {args:?} changed the settings");
    }
    let s = try_status(&wc.state).expect("the job still answers");
    assert_eq!(s.settings, before, "status and tune disagree");

    cli_ok("savepoint", &wc.state, &["--stop"]);
    job.wait_success();
}

#[test]
fn from_savepoint_pointing_at_something_that_is_not_a_savepoint_fails_with_a_clear_error() {
    let scratch = Scratch::new("sp-notsp");
    let wc = WordCount::new(&scratch, 5, 100);
    let empty = scratch.path("empty");
    std::fs::create_dir(&empty).unwrap();
    let not_a_store = scratch.path("notes");
    std::fs::create_dir(&not_a_store).unwrap();
    std::fs::write(not_a_store.join("readme.txt"), "hello").unwrap();
    let cases: Vec<(PathBuf, &str)> = vec![
        (scratch.path("no-such-savepoint"), "cannot open it"),
        (wc.input.clone(), "is not a directory"),
        (empty.clone(), "is not a savepoint"),
        (not_a_store.clone(), "is not a savepoint"),
    ];
    for (path, reason) in cases {
        let mut a = wc.args(&wc.state, &[]);
        a.push("--from-savepoint".into());
        a.push(path.clone().into());
        let e = cli(&a);
        assert_refused(&a, &e, &["--from-savepoint", &path.display().to_string(), reason, "cutline savepoint"]);
        assert!(!wc.state.exists() && !wc.output.exists(), "a refused run created directories");
    }
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "the empty directory was written to");
    assert_eq!(std::fs::read_dir(&not_a_store).unwrap().count(), 1, "the directory was written to");
}

#[test]
fn a_second_run_on_the_same_state_directory_is_refused_and_the_first_keeps_its_admin_socket() {
    let scratch = Scratch::new("sp-second");
    let wc = WordCount::new(&scratch, 6, 12_000);
    let paced = ["--checkpoint-interval", "100ms", "--line-delay-us", LINE_DELAY_US];
    let mut first = Running::start(&scratch, "first", &wc.args(&wc.state, &paced));
    let before = wait_for_checkpoints(&mut first, &wc.state, 1);
    let socket = socket_of(&wc.state);
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());

    let mut second = Running::start(&scratch, "second", &wc.args(&wc.state, &paced));
    let e = second.wait();
    assert_refused(&[second.what.clone().into()], &e, &["another run is using", "stop it first"]);

    let same = std::fs::symlink_metadata(&socket).expect("the first run's socket is gone");
    assert_eq!((same.dev(), same.ino()), (meta.dev(), meta.ino()), "the admin socket was replaced");
    wait_until("the first run to go on checkpointing", || {
        try_status(&wc.state).filter(|s| s.completed > before.completed + 2).map(|_| ())
    });
    cli_ok("savepoint", &wc.state, &["--stop"]);
    let out = first.wait_success();
    assert!(out.contains("stopped with savepoint"), "{}", first.logs());
    assert!(!socket.exists(), "the admin socket outlived its job");
}

#[test]
fn a_savepoint_into_a_directory_that_is_not_empty_is_refused_and_the_job_runs_on() {
    let scratch = Scratch::new("sp-full");
    let wc = WordCount::new(&scratch, 8, 12_000);
    let mut job = Running::start(
        &scratch,
        "job",
        &wc.args(&wc.state, &["--checkpoint-interval", "100ms", "--line-delay-us", LINE_DELAY_US]),
    );
    let before = wait_for_checkpoints(&mut job, &wc.state, 1);
    let full = scratch.path("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("keep.txt"), "mine").unwrap();
    for extra in [&["--to", full.to_str().unwrap()][..], &["--stop", "--to", full.to_str().unwrap()][..]] {
        cli_refused("savepoint", &wc.state, extra, &["--to", "not empty"]);
    }
    assert_eq!(std::fs::read_to_string(full.join("keep.txt")).unwrap(), "mine");
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 1, "the savepoint target was written to");
    wait_until("the job to go on checkpointing", || {
        try_status(&wc.state).filter(|s| s.completed > before.completed + 1).map(|_| ())
    });
    let sp = PathBuf::from(cli_ok("savepoint", &wc.state, &["--stop"]).trim());
    let out = job.wait_success();
    assert!(out.contains(&format!("stopped with savepoint {}", sp_name_id(&sp))), "{}", job.logs());
}

/// The checkpoint id in a default savepoint directory name `sp-<20 digits>`.
pub(crate) fn sp_name_id(sp: &Path) -> u64 {
    let name = sp.file_name().unwrap().to_str().unwrap();
    name.strip_prefix("sp-").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("savepoint name {name}"))
}

#[test]
fn status_tune_and_savepoint_without_a_running_job_say_how_to_start_one() {
    let scratch = Scratch::new("sp-nojob");
    let state = scratch.path("state");
    for (cmd, extra) in [("status", &[][..]), ("tune", &["--unaligned", "true"][..]), ("savepoint", &["--stop"][..])] {
        let err = cli_refused(cmd, &state, extra, &["no running job answers on", "admin.sock", "cutline run"]);
        assert!(err.contains(&state.display().to_string()), "{err}");
    }
    assert!(!state.exists(), "asking created the state directory");
}

#[test]
fn an_admin_socket_left_by_a_killed_run_is_replaced_by_the_next_run() {
    let scratch = Scratch::new("sp-stale");
    let wc = WordCount::new(&scratch, 7, 12_000);
    let paced = ["--checkpoint-interval", "100ms", "--line-delay-us", LINE_DELAY_US];
    let mut first = Running::start(&scratch, "first", &wc.args(&wc.state, &paced));
    wait_for_checkpoints(&mut first, &wc.state, 1);
    first.child.kill().unwrap(); // SIGKILL: nothing is cleaned up
    first.child.wait().unwrap();
    let socket = socket_of(&wc.state);
    assert!(std::fs::symlink_metadata(&socket).unwrap().file_type().is_socket(), "no socket file left behind");
    cli_refused("status", &wc.state, &[], &["no running job answers on"]);

    let mut second = Running::start(&scratch, "second", &wc.args(&wc.state, &paced));
    wait_for_checkpoints(&mut second, &wc.state, 1);
    cli_ok("savepoint", &wc.state, &["--stop"]);
    let out = second.wait_success();
    assert!(out.contains("stopped with savepoint") && out.contains("resumed from checkpoint"), "{}", second.logs());
}
