//! Scratch directories, process handling, failure messages.

use super::*;

/// The seed of a test: `CUTLINE_KILL9_SEED` if set, else the test's own default.
pub(crate) fn seed_for(default: u64) -> u64 {
    match std::env::var("CUTLINE_KILL9_SEED") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("CUTLINE_KILL9_SEED={s:?} is not a number")),
        Err(_) => default,
    }
}

/// What every failure message starts with: the test, the seed and how to replay it.
pub(crate) struct Ctx {
    pub(crate) test: &'static str,
    pub(crate) seed: u64,
}

impl Ctx {
    pub(crate) fn fail(&self, msg: impl std::fmt::Display) -> ! {
        panic!(
            "\n[{test}] seed {seed}: {msg}\nreplay: CUTLINE_KILL9_SEED={seed} cargo test --release -p cutline-cli --test kill9 -- --exact {test}\n",
            test = self.test,
            seed = self.seed
        )
    }
}

pub(crate) fn wordcount_args(
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
    a.extend(checkpoint_args(interval, mode));
    a
}

/// `cutline run nexmark` of `query` over `events` generated events, paced by `pace_us` (see
/// `--pace-us`), into `output`.
pub(crate) fn nexmark_args(
    (query, events, pace_us): (&str, u64, u64),
    output: &Path,
    state: &Path,
    parallelism: u32,
    interval: &str,
    mode: &str,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = ["run", "nexmark", "--query", query].iter().map(OsString::from).collect();
    a.extend(["--events".into(), events.to_string().into(), "--pace-us".into(), pace_us.to_string().into()]);
    a.extend(["--output".into(), output.into(), "--state".into(), state.into()]);
    a.extend(["--parallelism".into(), parallelism.to_string().into()]);
    a.extend(checkpoint_args(interval, mode));
    a
}

/// The checkpoint flags of `mode`: "unaligned" and "aligned-timeout" are exactly-once with unaligned
/// checkpoints, or aligned ones that switch after 2 ms; any other mode is passed as `--mode`.
fn checkpoint_args(interval: &str, mode: &str) -> Vec<OsString> {
    let (mode, extra): (&str, &[&str]) = match mode {
        "unaligned" => ("exactly-once", &["--unaligned"]),
        "aligned-timeout" => ("exactly-once", &["--alignment-timeout", "2ms"]),
        m => (m, &[]),
    };
    let mut a: Vec<OsString> = vec!["--checkpoint-interval".into(), interval.into(), "--mode".into(), mode.into()];
    a.push("-v".into());
    a.extend(extra.iter().map(OsString::from));
    a
}

pub(crate) fn command_line(args: &[OsString]) -> String {
    std::iter::once(BIN.to_string())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Start the binary with stdout and stderr going to `<log>.stdout` / `<log>.stderr` (files, so that a
/// killed or chatty process can never block on a full pipe).
pub(crate) fn spawn(args: &[OsString], log: &Path) -> std::io::Result<Child> {
    let out = File::create(log.with_extension("stdout"))?;
    let err = File::create(log.with_extension("stderr"))?;
    cutline().args(args).stdin(Stdio::null()).stdout(out).stderr(err).spawn()
}

/// The (stdout, stderr) a run left in its log files.
pub(crate) fn logs(log: &Path) -> (String, String) {
    (common::read_lossy(&log.with_extension("stdout")), common::read_lossy(&log.with_extension("stderr")))
}

/// The last `n` lines of `s`, for failure messages.
pub(crate) fn tail(s: &str, n: usize) -> String {
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

pub(crate) fn describe_run(args: &[OsString], status: Option<ExitStatus>, log: &Path) -> String {
    let (out, err) = logs(log);
    format!(
        "command: {}\nstatus: {}\nstdout:\n{}stderr:\n{}",
        command_line(args),
        status.map(|s| s.to_string()).unwrap_or_else(|| "still running (killed by the test)".into()),
        tail(&out, 20),
        tail(&err, 40)
    )
}

pub(crate) struct Finished {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Run the binary to its end, killing it and failing if it is still running at `deadline`.
pub(crate) fn run_until(ctx: &Ctx, args: &[OsString], log: &Path, deadline: Instant) -> Finished {
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
pub(crate) fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    pub(crate) fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
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
pub(crate) fn snapshot_diff(before: &BTreeMap<PathBuf, Vec<u8>>, after: &BTreeMap<PathBuf, Vec<u8>>) -> String {
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

pub(crate) fn committed_parts(dir: &Path) -> Vec<String> {
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

pub(crate) struct KillScenario {
    pub(crate) test: &'static str,
    pub(crate) default_seed: u64,
    /// The parallelism of the job; with several, run `r` (from 0, the final run last) takes
    /// `parallelism[r % len]`: every restart rescales the job.
    pub(crate) parallelism: &'static [u32],
    pub(crate) mode: &'static str,
    pub(crate) job: KillJob,
}

/// The job a kill scenario runs.
pub(crate) enum KillJob {
    /// Word count over a generated text of `KILL_INPUT_LINES` lines.
    Wordcount,
    /// The same with its counts in the disk state backend (`local-state` in the scratch directory)
    /// behind a cache of 16 words per task (needs feature `spill`).
    WordcountOnDisk,
    /// A Nexmark query over generated events: (query, events, --pace-us).
    Nexmark(&'static str, u64, u64),
}

/// What the kill loop leaves for the checks.
pub(crate) struct KillOutcome {
    pub(crate) ctx: Ctx,
    pub(crate) scratch: Scratch,
    /// Word count's input (empty for a Nexmark job).
    pub(crate) text: String,
    /// A Nexmark job's query and events.
    pub(crate) nexmark: Option<(cutline_nexmark::Query, u64)>,
    pub(crate) output: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) deadline: Instant,
}

/// Generate the input, then `KILL_ROUNDS` times: start the job, sleep a random 10–300 ms, SIGKILL it;
/// then let it run to completion. Fails if a run exits with an error by itself, or if the whole thing
/// takes longer than `SCENARIO_TIME_LIMIT`.
pub(crate) fn kill_and_resume(sc: &KillScenario) -> KillOutcome {
    let started = Instant::now();
    let deadline = started + SCENARIO_TIME_LIMIT;
    let ctx = Ctx { test: sc.test, seed: seed_for(sc.default_seed) };
    let scratch = Scratch::new(&format!("kill9-{}", sc.test));
    let output = scratch.path("output");
    let state = scratch.path("state");
    let text = match sc.job {
        KillJob::Wordcount | KillJob::WordcountOnDisk => {
            let text = generate_text(ctx.seed, KILL_INPUT_LINES);
            let input = scratch.path("input.txt");
            std::fs::write(&input, &text).unwrap_or_else(|e| ctx.fail(format!("writing {}: {e}", input.display())));
            text
        }
        KillJob::Nexmark(..) => String::new(),
    };
    let args_of_run = |run: u32| {
        let p = sc.parallelism[run as usize % sc.parallelism.len()];
        match sc.job {
            KillJob::Wordcount => {
                wordcount_args(&scratch.path("input.txt"), &output, &state, p, CHECKPOINT_INTERVAL, sc.mode)
            }
            KillJob::WordcountOnDisk => {
                let mut a =
                    wordcount_args(&scratch.path("input.txt"), &output, &state, p, CHECKPOINT_INTERVAL, sc.mode);
                a.extend(["--state-backend".into(), "disk".into(), "--state-cache-entries".into(), "16".into()]);
                a.extend(["--local-state-dir".into(), scratch.path("local-state").into()]);
                a
            }
            KillJob::Nexmark(query, events, pace_us) => {
                nexmark_args((query, events, pace_us), &output, &state, p, CHECKPOINT_INTERVAL, sc.mode)
            }
        }
    };

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
        let args = args_of_run(round - 1);
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

    let args = args_of_run(KILL_ROUNDS);
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
    let nexmark = match sc.job {
        KillJob::Wordcount | KillJob::WordcountOnDisk => None,
        KillJob::Nexmark(query, events, _) => Some((query.parse().unwrap_or_else(|e: String| ctx.fail(e)), events)),
    };
    KillOutcome { ctx, scratch, text, nexmark, output, args, deadline }
}

/// What the runs' events must show: a restore from a checkpoint (else every kill landed before the
/// first checkpoint and nothing was recovered), and checkpoints of the kind the mode asks for:
/// unaligned ones with `--unaligned`, switched ones with a 2 ms alignment timeout, none unaligned
/// in plain exactly-once mode.
pub(crate) fn check_checkpoints(ctx: &Ctx, mode: &str, events: &[LogEvent], delays: &[u64]) {
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

/// Exactly-once check: `check_wordcount_output` (of a Nexmark job: `check_nexmark_output`) must
/// find nothing.
pub(crate) fn assert_exact_output(o: &KillOutcome) {
    let problems = match o.nexmark {
        None => cutline_cli::jobs::check_wordcount_output(&o.text, &o.output),
        Some((query, events)) => cutline_cli::jobs::check_nexmark_output(query, events, &o.output),
    }
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
