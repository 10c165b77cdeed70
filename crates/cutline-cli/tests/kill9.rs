//! `kill -9` scenarios for the `cutline` binary: the word-count job is started, SIGKILLed at random
//! moments (with a 20 ms checkpoint interval, so many kills land while a checkpoint is being taken,
//! written or committed), started again with the same arguments until it finishes, and its committed
//! output is compared with that of an uninterrupted run. The runs' JSON events must show that a
//! checkpoint was restored (a kill loop whose kills all land before the first checkpoint recovers
//! nothing), and that the checkpoints were of the mode's kind (unaligned, switched after the
//! alignment timeout, or aligned). Also: a finished job is not run twice, and bad arguments are
//! refused with a clear message before anything is touched.
//!
//! Every scenario is deterministic given its seed (the input text and the kill delays come from a
//! seeded xorshift generator); the seed is in every failure message. To try another seed:
//!
//! ```text
//! CUTLINE_KILL9_SEED=1234 cargo test --release -p cutline-cli --test kill9
//! ```
//!
//! A failing scenario keeps its scratch directory (input, output, state, the logs of every run) and
//! prints where it is.

#![cfg(unix)]

mod common;

use common::{cutline, periodic_checkpoints, restored_checkpoints, LogEvent, Scratch, XorShift, BIN};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Lines of the generated input of the kill scenarios: about 4 M words, 31 MB. One uninterrupted run
/// takes about 1.1 s in release on an idle 2-core machine, so most of the kills land mid-run.
const KILL_INPUT_LINES: usize = 500_000;
/// Distinct words in the generated vocabulary.
const VOCABULARY: usize = 3_000;
/// SIGKILLs before the job is allowed to finish.
const KILL_ROUNDS: u32 = 8;
/// Random delay between starting the job and killing it.
const KILL_DELAY_MS: (u64, u64) = (10, 300);
/// Checkpoint interval of the kill scenarios: short, so that kills often hit a checkpoint in flight.
const CHECKPOINT_INTERVAL: &str = "20ms";
/// Hard bound on one whole scenario (input generation, every run, the final check).
const SCENARIO_TIME_LIMIT: Duration = Duration::from_secs(120);
/// Hard bound on a single run that is expected to exit by itself (errors, already-finished runs).
const SHORT_RUN_TIME_LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------------
// Deterministic randomness and input text.

/// A vocabulary of `n` distinct words: mostly ASCII, some with multi-byte letters.
fn vocabulary(rng: &mut XorShift, n: usize) -> Vec<String> {
    const ASCII: &[char] = &[
        'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o', 'p', 'q', 'r', 's', 't', 'u', 'v',
        'w', 'x', 'y', 'z', 'A', 'Q', 'Z', '0', '7', '\'', '-', '.',
    ];
    const WIDE: &[char] = &['é', 'ü', 'ß', 'ж', 'λ', '日', '本', 'ñ', '😀'];
    let mut seen = BTreeSet::new();
    let mut words = Vec::with_capacity(n);
    while words.len() < n {
        let len = rng.range(1, 10);
        let wide = rng.range(0, 9) == 0;
        let w: String =
            (0..len).map(|_| if wide && rng.range(0, 2) == 0 { *rng.pick(WIDE) } else { *rng.pick(ASCII) }).collect();
        if seen.insert(w.clone()) {
            words.push(w);
        }
    }
    words
}

/// Deterministic input text of `lines` lines. Word frequencies are skewed (a few words are very
/// common, most are rare), words are separated by assorted Unicode whitespace, some lines are empty,
/// some end in `\r\n`, and the last line has no newline.
fn generate_text(seed: u64, lines: usize) -> String {
    let mut rng = XorShift::new(seed);
    let vocab = vocabulary(&mut rng, VOCABULARY);
    const SEPARATORS: &[&str] = &[" ", " ", " ", " ", " ", " ", "  ", "\t", "\u{3000}", "\u{a0}", " \t "];
    let mut text = String::with_capacity(lines * 60);
    for i in 0..lines {
        let words = rng.range(0, 16);
        if rng.range(0, 20) == 0 {
            text.push(' ');
        }
        for j in 0..words {
            if j > 0 {
                let sep: &&str = rng.pick(SEPARATORS);
                text.push_str(sep);
            }
            // Skew: half of the picks come from the first 50 words.
            let w = if rng.range(0, 1) == 0 { &vocab[rng.range(0, 49) as usize] } else { rng.pick(&vocab) };
            text.push_str(w);
        }
        if i + 1 < lines {
            text.push_str(if rng.range(0, 30) == 0 { "\r\n" } else { "\n" });
        }
    }
    text
}

// ---------------------------------------------------------------------------------------------------
// Scratch directories, process handling, failure messages.

/// The seed of a test: `CUTLINE_KILL9_SEED` if set, else the test's own default.
fn seed_for(default: u64) -> u64 {
    match std::env::var("CUTLINE_KILL9_SEED") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("CUTLINE_KILL9_SEED={s:?} is not a number")),
        Err(_) => default,
    }
}

/// What every failure message starts with: the test, the seed and how to replay it.
struct Ctx {
    test: &'static str,
    seed: u64,
}

impl Ctx {
    fn fail(&self, msg: impl std::fmt::Display) -> ! {
        panic!(
            "\n[{test}] seed {seed}: {msg}\nreplay: CUTLINE_KILL9_SEED={seed} cargo test --release -p cutline-cli --test kill9 -- --exact {test}\n",
            test = self.test,
            seed = self.seed
        )
    }
}

fn wordcount_args(
    input: &Path,
    output: &Path,
    state: &Path,
    parallelism: u32,
    interval: &str,
    mode: &str,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = ["run", "wordcount", "--input"].iter().map(OsString::from).collect();
    a.push(input.into());
    a.push("--output".into());
    a.push(output.into());
    a.push("--state".into());
    a.push(state.into());
    a.extend(["--parallelism".into(), parallelism.to_string().into()]);
    // "unaligned" and "aligned-timeout" are exactly-once with unaligned checkpoints, or aligned ones
    // that switch after 2 ms.
    let (mode, extra): (&str, &[&str]) = match mode {
        "unaligned" => ("exactly-once", &["--unaligned"]),
        "aligned-timeout" => ("exactly-once", &["--alignment-timeout", "2ms"]),
        m => (m, &[]),
    };
    a.extend(["--checkpoint-interval".into(), interval.into(), "--mode".into(), mode.into(), "-v".into()]);
    a.extend(extra.iter().map(OsString::from));
    a
}

fn command_line(args: &[OsString]) -> String {
    std::iter::once(BIN.to_string())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Start the binary with stdout and stderr going to `<log>.stdout` / `<log>.stderr` (files, so that a
/// killed or chatty process can never block on a full pipe).
fn spawn(args: &[OsString], log: &Path) -> std::io::Result<Child> {
    let out = File::create(log.with_extension("stdout"))?;
    let err = File::create(log.with_extension("stderr"))?;
    cutline().args(args).stdin(Stdio::null()).stdout(out).stderr(err).spawn()
}

/// The (stdout, stderr) a run left in its log files.
fn logs(log: &Path) -> (String, String) {
    (common::read_lossy(&log.with_extension("stdout")), common::read_lossy(&log.with_extension("stderr")))
}

/// The last `n` lines of `s`, for failure messages.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let skip = lines.len().saturating_sub(n);
    let mut t = String::new();
    if skip > 0 {
        t.push_str(&format!("    ... ({skip} earlier lines)\n"));
    }
    for l in &lines[skip..] {
        t.push_str("    ");
        t.push_str(l);
        t.push('\n');
    }
    t
}

fn describe_run(args: &[OsString], status: Option<ExitStatus>, log: &Path) -> String {
    let (out, err) = logs(log);
    format!(
        "command: {}\nstatus: {}\nstdout:\n{}stderr:\n{}",
        command_line(args),
        status.map(|s| s.to_string()).unwrap_or_else(|| "still running (killed by the test)".into()),
        tail(&out, 20),
        tail(&err, 40)
    )
}

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Run the binary to its end, killing it and failing if it is still running at `deadline`.
fn run_until(ctx: &Ctx, args: &[OsString], log: &Path, deadline: Instant) -> Finished {
    let mut child = spawn(args, log).unwrap_or_else(|e| ctx.fail(format!("cannot start {}: {e}", command_line(args))));
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let (stdout, stderr) = logs(log);
                return Finished { status, stdout, stderr };
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                ctx.fail(format!(
                    "the run did not finish within its time bound; killed it\n{}",
                    describe_run(args, None, log)
                ))
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => ctx.fail(format!("waiting for {}: {e}", command_line(args))),
        }
    }
}

/// Every file under `dir` (relative path → contents), to show that a run changed nothing.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .map(|e| e.unwrap())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if e.file_type().unwrap().is_dir() {
                out.insert(rel.join(""), Vec::new());
                walk(root, &p, out);
            } else {
                out.insert(rel, std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display())));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// How two snapshots differ, for failure messages.
fn snapshot_diff(before: &BTreeMap<PathBuf, Vec<u8>>, after: &BTreeMap<PathBuf, Vec<u8>>) -> String {
    let mut d = Vec::new();
    for (p, b) in before {
        match after.get(p) {
            None => d.push(format!("removed: {}", p.display())),
            Some(a) if a != b => d.push(format!("changed: {} ({} -> {} bytes)", p.display(), b.len(), a.len())),
            Some(_) => {}
        }
    }
    for p in after.keys().filter(|p| !before.contains_key(*p)) {
        d.push(format!("added: {}", p.display()));
    }
    d.truncate(20);
    d.join("\n")
}

fn committed_parts(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("part-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

// ---------------------------------------------------------------------------------------------------
// The kill loop.

struct KillScenario {
    test: &'static str,
    default_seed: u64,
    parallelism: u32,
    mode: &'static str,
}

/// What the kill loop leaves for the checks.
struct KillOutcome {
    ctx: Ctx,
    scratch: Scratch,
    text: String,
    output: PathBuf,
    args: Vec<OsString>,
    deadline: Instant,
}

/// Generate the input, then `KILL_ROUNDS` times: start the job, sleep a random 10–300 ms, SIGKILL it;
/// then let it run to completion. Fails if a run exits with an error by itself, or if the whole thing
/// takes longer than `SCENARIO_TIME_LIMIT`.
fn kill_and_resume(sc: &KillScenario) -> KillOutcome {
    let started = Instant::now();
    let deadline = started + SCENARIO_TIME_LIMIT;
    let ctx = Ctx { test: sc.test, seed: seed_for(sc.default_seed) };
    let scratch = Scratch::new(&format!("kill9-{}", sc.test));
    let text = generate_text(ctx.seed, KILL_INPUT_LINES);
    let input = scratch.path("input.txt");
    std::fs::write(&input, &text).unwrap_or_else(|e| ctx.fail(format!("writing {}: {e}", input.display())));
    let output = scratch.path("output");
    let state = scratch.path("state");
    let args = wordcount_args(&input, &output, &state, sc.parallelism, CHECKPOINT_INTERVAL, sc.mode);

    // A different stream than the text's, so that changing KILL_INPUT_LINES does not change the delays.
    let mut rng = XorShift::new(ctx.seed ^ 0x6b69_6c6c_2d39);
    let (mut killed, mut finished_early) = (0u32, 0u32);
    let mut delays = Vec::new();
    for round in 1..=KILL_ROUNDS {
        let log = scratch.path(&format!("run-{round:02}"));
        let delay = rng.range(KILL_DELAY_MS.0, KILL_DELAY_MS.1);
        delays.push(delay);
        if Instant::now() + Duration::from_millis(delay) >= deadline {
            ctx.fail(format!("time bound of {SCENARIO_TIME_LIMIT:?} exceeded during kill round {round}"));
        }
        let mut child =
            spawn(&args, &log).unwrap_or_else(|e| ctx.fail(format!("cannot start {}: {e}", command_line(&args))));
        std::thread::sleep(Duration::from_millis(delay));
        // SIGKILL. If the process already exited, this is a no-op and wait() reports how it ended.
        let _ = child.kill();
        let status = child.wait().unwrap_or_else(|e| ctx.fail(format!("waiting for the killed run: {e}")));
        match status.signal() {
            Some(9) => killed += 1,
            _ if status.success() => finished_early += 1,
            _ => ctx.fail(format!(
                "kill round {round}/{KILL_ROUNDS} (delay {delay} ms): the run exited with an error before it was killed\n{}",
                describe_run(&args, Some(status), &log)
            )),
        }
    }
    if killed == 0 {
        ctx.fail(format!(
            "none of the {KILL_ROUNDS} kills interrupted a running job (delays {delays:?} ms): the input is too small for this machine, raise KILL_INPUT_LINES"
        ));
    }

    let log = scratch.path("run-final");
    let final_started = Instant::now();
    let fin = run_until(&ctx, &args, &log, deadline);
    if !fin.status.success() {
        ctx.fail(format!(
            "the final run (after {killed} kills) did not exit 0\n{}",
            describe_run(&args, Some(fin.status), &log)
        ));
    }
    println!(
        "[{}] seed {}: {killed} runs killed, {finished_early} finished before their kill, delays {delays:?} ms; final run {} ms ({}); scenario {} ms",
        sc.test,
        ctx.seed,
        final_started.elapsed().as_millis(),
        fin.stdout.trim(),
        started.elapsed().as_millis()
    );
    let runs: Vec<PathBuf> =
        (1..=KILL_ROUNDS).map(|r| scratch.path(&format!("run-{r:02}"))).chain(std::iter::once(log)).collect();
    let events: Vec<LogEvent> =
        runs.iter().flat_map(|r| common::events(&common::read_lossy(&r.with_extension("stderr")))).collect();
    check_checkpoints(&ctx, sc.mode, &events, &delays);
    KillOutcome { ctx, scratch, text, output, args, deadline }
}

/// What the runs' events must show: a restore from a checkpoint (else every kill landed before the
/// first checkpoint and nothing was recovered), and checkpoints of the kind the mode asks for:
/// unaligned ones with `--unaligned`, switched ones with a 2 ms alignment timeout, none unaligned
/// in plain exactly-once mode.
fn check_checkpoints(ctx: &Ctx, mode: &str, events: &[LogEvent], delays: &[u64]) {
    let restored = restored_checkpoints(events);
    let periodic = periodic_checkpoints(events);
    let unaligned = periodic.iter().filter(|e| e.need_u64("unaligned_tasks") > 0).count();
    let switched = periodic.iter().filter(|e| e.need_u64("switched_tasks") > 0).count();
    println!(
        "[{}] seed {}: {} restores from a checkpoint ({restored:?}); {} periodic checkpoints, {unaligned} with unaligned tasks, {switched} with switched tasks",
        ctx.test,
        ctx.seed,
        restored.len(),
        periodic.len()
    );
    if restored.is_empty() {
        ctx.fail(format!(
            "no run restored a checkpoint (kill delays {delays:?} ms): nothing was recovered; events: {}",
            common::summary(events)
        ));
    }
    // An unaligned checkpoint never switches; an aligned one is unaligned only where it switched
    // (or downstream of a task that did).
    let unaligned_without_switch =
        periodic.iter().filter(|e| e.need_u64("unaligned_tasks") > 0 && e.need_u64("switched_tasks") == 0).count();
    let kind_ok = match mode {
        "unaligned" => !periodic.is_empty() && unaligned == periodic.len() && switched == 0,
        "aligned-timeout" => switched > 0 && unaligned_without_switch == 0,
        "exactly-once" => unaligned == 0,
        _ => true,
    };
    if !kind_ok {
        ctx.fail(format!(
            "mode {mode}: {unaligned} of {} checkpoints had unaligned tasks and {switched} had switched ones",
            periodic.len()
        ));
    }
}

/// Exactly-once check: `check_wordcount_output` must find nothing.
fn assert_exact_output(o: &KillOutcome) {
    let problems = cutline_cli::jobs::check_wordcount_output(&o.text, &o.output)
        .unwrap_or_else(|e| o.ctx.fail(format!("cannot read the output {}: {e}", o.output.display())));
    if !problems.is_empty() {
        let final_log = o.scratch.path("run-final");
        o.ctx.fail(format!(
            "committed output differs from an uninterrupted run ({} problem(s) shown):\n  {}\ncommitted files: {:?}\nlast run:\n{}",
            problems.len(),
            problems.join("\n  "),
            committed_parts(&o.output),
            describe_run(&o.args, None, &final_log)
        ));
    }
}

// ---------------------------------------------------------------------------------------------------
// Scenarios.

#[test]
fn uninterrupted_run_gives_exact_output() {
    // The baseline the kill scenarios are compared with; also sizes the input (prints the duration).
    let ctx = Ctx { test: "uninterrupted_run_gives_exact_output", seed: seed_for(11) };
    let deadline = Instant::now() + SCENARIO_TIME_LIMIT;
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let text = generate_text(ctx.seed, KILL_INPUT_LINES);
    let input = scratch.path("input.txt");
    std::fs::write(&input, &text).unwrap();
    let output = scratch.path("output");
    let args = wordcount_args(&input, &output, &scratch.path("state"), 2, CHECKPOINT_INTERVAL, "exactly-once");
    let log = scratch.path("run");
    let t = Instant::now();
    let fin = run_until(&ctx, &args, &log, deadline);
    let ms = t.elapsed().as_millis();
    if !fin.status.success() {
        ctx.fail(format!("the run did not exit 0\n{}", describe_run(&args, Some(fin.status), &log)));
    }
    println!(
        "[{}] seed {}: {} bytes, {} words, one uninterrupted run took {ms} ms: {}",
        ctx.test,
        ctx.seed,
        text.len(),
        text.split_whitespace().count(),
        fin.stdout.trim()
    );
    let problems = cutline_cli::jobs::check_wordcount_output(&text, &output).unwrap();
    if !problems.is_empty() {
        ctx.fail(format!(
            "output of an uninterrupted run is wrong:\n  {}\n{}",
            problems.join("\n  "),
            describe_run(&args, Some(fin.status), &log)
        ));
    }
}

#[test]
fn kill_9_at_random_moments_then_resume_gives_exact_output() {
    let o = kill_and_resume(&KillScenario {
        test: "kill_9_at_random_moments_then_resume_gives_exact_output",
        default_seed: 1,
        parallelism: 2,
        mode: "exactly-once",
    });
    assert_exact_output(&o);

    // Started again, the finished job says so and leaves the output alone.
    let before = snapshot(&o.output);
    let log = o.scratch.path("run-again");
    let fin = run_until(&o.ctx, &o.args, &log, o.deadline);
    if !fin.status.success() || !fin.stdout.contains("already finished") {
        o.ctx.fail(format!(
            "running the finished job again should exit 0 and say it already finished\n{}",
            describe_run(&o.args, Some(fin.status), &log)
        ));
    }
    let after = snapshot(&o.output);
    if before != after {
        o.ctx.fail(format!(
            "running the finished job again changed its output directory:\n{}",
            snapshot_diff(&before, &after)
        ));
    }
}

#[test]
fn kill_9_at_random_moments_with_one_worker_then_resume_gives_exact_output() {
    let o = kill_and_resume(&KillScenario {
        test: "kill_9_at_random_moments_with_one_worker_then_resume_gives_exact_output",
        default_seed: 2,
        parallelism: 1,
        mode: "exactly-once",
    });
    assert_exact_output(&o);
}

#[test]
fn kill_9_at_random_moments_with_unaligned_checkpoints_then_resume_gives_exact_output() {
    let o = kill_and_resume(&KillScenario {
        test: "kill_9_at_random_moments_with_unaligned_checkpoints_then_resume_gives_exact_output",
        default_seed: 3,
        parallelism: 2,
        mode: "unaligned",
    });
    assert_exact_output(&o);
}

#[test]
fn kill_9_at_random_moments_with_checkpoints_switching_after_their_alignment_timeout_gives_exact_output() {
    let o = kill_and_resume(&KillScenario {
        test: "kill_9_at_random_moments_with_checkpoints_switching_after_their_alignment_timeout_gives_exact_output",
        default_seed: 4,
        parallelism: 2,
        mode: "aligned-timeout",
    });
    assert_exact_output(&o);
}

#[test]
fn kill_9_at_random_moments_in_at_least_once_mode_loses_no_count_and_invents_nothing() {
    let o = kill_and_resume(&KillScenario {
        test: "kill_9_at_random_moments_in_at_least_once_mode_loses_no_count_and_invents_nothing",
        default_seed: 3,
        parallelism: 2,
        mode: "at-least-once",
    });
    // Weaker than exactly-once. Without alignment, a snapshot of the counts may include records read
    // after the barrier on one input; after a restore those records are read again and counted twice
    // (documented in src/sim.rs: "state that counted a replayed record twice emits higher counts"). So
    // a word that occurs n times may end at a count m > n. What must hold:
    // - every count 1..n of every word is committed at least once (nothing lost; duplicates allowed);
    // - nothing else: no word that is not in the input, no count 0, no malformed line, and no gap: a
    //   count above n is only the continuation n+1..m of the same word's counting, every update of
    //   which must have been committed too (a gap would be a lost update).
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    for w in o.text.split_whitespace() {
        *expected.entry(w).or_default() += 1;
    }
    let mut seen: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut lines = 0u64;
    for name in committed_parts(&o.output) {
        let p = o.output.join(&name);
        let body = std::fs::read_to_string(&p).unwrap_or_else(|e| o.ctx.fail(format!("reading {}: {e}", p.display())));
        for line in body.lines() {
            lines += 1;
            match line.split_once('\t').and_then(|(w, c)| c.parse::<u64>().ok().map(|c| (w, c))) {
                Some((w, c)) => {
                    seen.entry(w.to_string()).or_default().insert(c);
                }
                None => problems.push(format!("malformed line {line:?} in {name}")),
            }
        }
    }
    let (mut overcounted, mut extra_counts) = (0u64, 0u64);
    for (w, n) in &expected {
        let got = seen.remove(*w).unwrap_or_default();
        let top = got.last().copied().unwrap_or(0).max(*n);
        let missing: Vec<u64> = (1..=top).filter(|c| !got.contains(c)).collect();
        if got.contains(&0) {
            problems.push(format!("word {w:?}: count 0 was committed"));
        }
        if !missing.is_empty() {
            let (lost, gaps): (Vec<u64>, Vec<u64>) = missing.iter().partition(|c| **c <= *n);
            problems.push(format!(
                "word {w:?} occurs {n} times, committed counts go up to {top}: {} of 1..{n} never committed (e.g. {:?}), {} gap(s) above {n} (e.g. {:?})",
                lost.len(),
                &lost[..lost.len().min(5)],
                gaps.len(),
                &gaps[..gaps.len().min(5)]
            ));
        }
        if top > *n {
            overcounted += 1;
            extra_counts += top - n;
        }
    }
    for w in seen.keys() {
        problems.push(format!("word {w:?} is not in the input"));
    }
    let words = o.text.split_whitespace().count() as u64;
    println!(
        "[{}] seed {}: {lines} committed lines for {words} words; {overcounted} of {} words counted past their occurrences (by {extra_counts} in all) after replays",
        o.ctx.test,
        o.ctx.seed,
        expected.len()
    );
    if !problems.is_empty() {
        let n = problems.len();
        problems.truncate(20);
        o.ctx.fail(format!(
            "at-least-once output is wrong ({n} problem(s), first {}):\n  {}\nlast run:\n{}",
            problems.len(),
            problems.join("\n  "),
            describe_run(&o.args, None, &o.scratch.path("run-final"))
        ));
    }
}

#[test]
fn running_a_finished_job_again_says_so_and_changes_nothing() {
    let ctx = Ctx { test: "running_a_finished_job_again_says_so_and_changes_nothing", seed: seed_for(4) };
    let deadline = Instant::now() + SCENARIO_TIME_LIMIT;
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let text = generate_text(ctx.seed, 20_000);
    let input = scratch.path("input.txt");
    std::fs::write(&input, &text).unwrap();
    let (output, state) = (scratch.path("output"), scratch.path("state"));
    let args = wordcount_args(&input, &output, &state, 2, CHECKPOINT_INTERVAL, "exactly-once");
    let first = run_until(&ctx, &args, &scratch.path("run-1"), deadline);
    if !first.status.success() {
        ctx.fail(format!(
            "the first run did not exit 0\n{}",
            describe_run(&args, Some(first.status), &scratch.path("run-1"))
        ));
    }
    let problems = cutline_cli::jobs::check_wordcount_output(&text, &output).unwrap();
    if !problems.is_empty() {
        ctx.fail(format!("output of the first run is wrong:\n  {}", problems.join("\n  ")));
    }
    let (out_before, state_before) = (snapshot(&output), snapshot(&state));
    for i in 2..=3 {
        let log = scratch.path(&format!("run-{i}"));
        let again = run_until(&ctx, &args, &log, deadline);
        if !again.status.success() {
            ctx.fail(format!(
                "run {i} of the finished job did not exit 0\n{}",
                describe_run(&args, Some(again.status), &log)
            ));
        }
        if !again.stdout.contains("already finished") {
            ctx.fail(format!(
                "run {i} of the finished job does not say it already finished\n{}",
                describe_run(&args, Some(again.status), &log)
            ));
        }
        let out_after = snapshot(&output);
        if out_after != out_before {
            ctx.fail(format!(
                "run {i} of the finished job changed the output directory:\n{}",
                snapshot_diff(&out_before, &out_after)
            ));
        }
        let state_after = snapshot(&state);
        if state_after != state_before {
            ctx.fail(format!(
                "run {i} of the finished job changed the state directory:\n{}",
                snapshot_diff(&state_before, &state_after)
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Bad arguments: a non-zero exit and a message that says what is wrong, no panic.

fn assert_refused(ctx: &Ctx, args: &[OsString], log: &Path, fin: &Finished, must_mention: &[&str]) {
    let why = |what: &str| -> ! { ctx.fail(format!("{what}\n{}", describe_run(args, Some(fin.status), log))) };
    if fin.status.success() {
        why("expected a non-zero exit");
    }
    if fin.status.code().is_none() {
        why("expected an ordinary non-zero exit, not death by a signal");
    }
    if fin.stderr.contains("panicked") {
        why("expected an error message, not a panic");
    }
    for m in must_mention {
        if !fin.stderr.contains(m) {
            why(&format!("the error message should mention {m:?}"));
        }
    }
}

fn small_job(ctx: &Ctx, scratch: &Scratch) -> (PathBuf, PathBuf, PathBuf) {
    let input = scratch.path("input.txt");
    std::fs::write(&input, generate_text(ctx.seed, 2_000)).unwrap();
    (input, scratch.path("output"), scratch.path("state"))
}

#[test]
fn missing_input_file_is_refused_with_a_clear_message() {
    let ctx = Ctx { test: "missing_input_file_is_refused_with_a_clear_message", seed: seed_for(5) };
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let input = scratch.path("no-such-input.txt");
    let args = wordcount_args(&input, &scratch.path("output"), &scratch.path("state"), 1, "200ms", "exactly-once");
    let log = scratch.path("run");
    let fin = run_until(&ctx, &args, &log, Instant::now() + SHORT_RUN_TIME_LIMIT);
    assert_refused(&ctx, &args, &log, &fin, &["input", &input.display().to_string()]);
}

#[test]
fn checkpoint_interval_in_parsecs_is_refused_with_a_clear_message() {
    let ctx = Ctx { test: "checkpoint_interval_in_parsecs_is_refused_with_a_clear_message", seed: seed_for(6) };
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let (input, output, state) = small_job(&ctx, &scratch);
    let args = wordcount_args(&input, &output, &state, 1, "5parsecs", "exactly-once");
    let log = scratch.path("run");
    let fin = run_until(&ctx, &args, &log, Instant::now() + SHORT_RUN_TIME_LIMIT);
    assert_refused(&ctx, &args, &log, &fin, &["5parsecs"]);
    if !committed_parts(&output).is_empty() {
        ctx.fail("a refused run committed output");
    }
}

#[test]
fn output_path_that_is_a_regular_file_is_refused_and_the_file_is_left_alone() {
    let ctx =
        Ctx { test: "output_path_that_is_a_regular_file_is_refused_and_the_file_is_left_alone", seed: seed_for(7) };
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let (input, _, state) = small_job(&ctx, &scratch);
    let output = scratch.path("precious.txt");
    std::fs::write(&output, "do not touch\n").unwrap();
    let args = wordcount_args(&input, &output, &state, 1, "200ms", "exactly-once");
    let log = scratch.path("run");
    let fin = run_until(&ctx, &args, &log, Instant::now() + SHORT_RUN_TIME_LIMIT);
    assert_refused(&ctx, &args, &log, &fin, &["output", &output.display().to_string()]);
    match std::fs::read(&output) {
        Ok(b) if b == b"do not touch\n" => {}
        other => ctx.fail(format!("the regular file given as --output was changed: {other:?}")),
    }
}

#[test]
fn state_dir_of_another_job_is_refused_and_left_unchanged() {
    let ctx = Ctx { test: "state_dir_of_another_job_is_refused_and_left_unchanged", seed: seed_for(8) };
    let deadline = Instant::now() + SCENARIO_TIME_LIMIT;
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let state = scratch.path("state");
    // Job A: input X into output A, state S, run to completion.
    let (input_x, output_a) = (scratch.path("x.txt"), scratch.path("output-a"));
    std::fs::write(&input_x, generate_text(ctx.seed, 5_000)).unwrap();
    let args_a = wordcount_args(&input_x, &output_a, &state, 2, CHECKPOINT_INTERVAL, "exactly-once");
    let fin_a = run_until(&ctx, &args_a, &scratch.path("run-a"), deadline);
    if !fin_a.status.success() {
        ctx.fail(format!(
            "job A did not exit 0\n{}",
            describe_run(&args_a, Some(fin_a.status), &scratch.path("run-a"))
        ));
    }
    let state_before = snapshot(&state);
    let output_a_before = snapshot(&output_a);

    // Job B: another input and output, same state directory.
    let (input_y, output_b) = (scratch.path("y.txt"), scratch.path("output-b"));
    std::fs::write(&input_y, generate_text(ctx.seed + 1, 5_000)).unwrap();
    for (i, args_b) in [
        wordcount_args(&input_y, &output_b, &state, 2, CHECKPOINT_INTERVAL, "exactly-once"),
        // Same input, different output: still another job.
        wordcount_args(&input_x, &output_b, &state, 2, CHECKPOINT_INTERVAL, "exactly-once"),
    ]
    .iter()
    .enumerate()
    {
        let log = scratch.path(&format!("run-b{i}"));
        let fin_b = run_until(&ctx, args_b, &log, deadline);
        assert_refused(&ctx, args_b, &log, &fin_b, &["state directory", &state.display().to_string()]);
        let state_after = snapshot(&state);
        if state_after != state_before {
            ctx.fail(format!(
                "the refused job changed the state directory of job A:\n{}",
                snapshot_diff(&state_before, &state_after)
            ));
        }
        if !committed_parts(&output_b).is_empty() {
            ctx.fail(format!("the refused job committed output into {}", output_b.display()));
        }
        let output_a_after = snapshot(&output_a);
        if output_a_after != output_a_before {
            ctx.fail(format!(
                "the refused job changed job A's output:\n{}",
                snapshot_diff(&output_a_before, &output_a_after)
            ));
        }
    }
}
