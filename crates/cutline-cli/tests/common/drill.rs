//! The kill -9 drill of one `cutline run` process against a real external system: run the same
//! command line again and again, killing it from outside at a random moment (even rounds) or
//! letting it kill itself at a step of its sink's protocol (odd rounds, `--kill-self-at`), then run
//! it once more to the end, optionally at another parallelism each time. Every run logs into
//! `runs.log` of the scratch directory.

use super::{cutline, events, restored_checkpoints, wait_bounded, LogEvent, Scratch, XorShift};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

/// The protocol steps the odd rounds aim at, in this order (so that every drill of 8 rounds hits the
/// commit window, whatever its seed): the commit window (a checkpoint complete, its output not
/// committed), while recovering, halfway through committing, the commit window again, before
/// preparing.
pub const SINK_STEPS: [&str; 5] = ["sink-commit", "sink-recover", "sink-commit-midway", "sink-commit", "sink-prepare"];

pub struct Drill {
    pub rounds: u32,
    /// Bounds of the moment of an outside kill after the start of a run.
    pub kill_delay_ms: (u64, u64),
    /// The parallelism of each run: run `r` (from 0; the last run, after the rounds, too) takes
    /// `parallelism[r % len]` in place of the command line's `--parallelism`, so that with several
    /// values every restart rescales the job. Empty: the command line's own.
    pub parallelism: &'static [u32],
    pub time_limit: Duration,
    pub seed: u64,
}

/// What a drill did: how many runs were killed, and the checkpoints runs restored.
pub struct DrillReport {
    pub killed: u32,
    pub restored: Vec<u64>,
    /// Every restore of a checkpoint, in order.
    pub restores: Vec<Restore>,
    /// Each run's parallelism and events, in order.
    pub runs: Vec<(u32, Vec<LogEvent>)>,
}

/// A run's restore of a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restore {
    pub checkpoint: u64,
    /// The parallelism of the run that completed the checkpoint, if its log says so (a run killed
    /// between completing a checkpoint and logging it does not).
    pub written_at: Option<u32>,
    /// The parallelism of the run that restored it.
    pub restored_at: u32,
}

impl DrillReport {
    /// The restores at another parallelism than the one that wrote the checkpoint.
    pub fn rescaled(&self) -> Vec<Restore> {
        self.restores.iter().copied().filter(|r| r.written_at.is_some_and(|w| w != r.restored_at)).collect()
    }
}

/// Run the drill with the command line `args`; panics (with the runs' log) if a run fails, if
/// fewer than 3 runs were killed, if no run restored a checkpoint (the drill must have injected its
/// failures where they matter), or, with several parallelisms, if no run restored a checkpoint at
/// another parallelism than the one that wrote it.
pub fn kill_and_resume(scratch: &Scratch, args: &[String], d: &Drill) -> DrillReport {
    let mut rng = XorShift::new(d.seed);
    let start = Instant::now();
    let mut killed = 0;
    // Per run: its parallelism and where its lines begin and end in runs.log.
    let mut runs: Vec<(u32, u64, u64)> = Vec::new();
    let mut run = |a: &[String], what: &str, kill_after: Option<Duration>| {
        let (a, p) = at_parallelism(a, d.parallelism, runs.len());
        let from = log_len(scratch);
        let mut child = cutline().args(&a).stdout(scratch.log("runs")).stderr(scratch.log("runs")).spawn().unwrap();
        if let Some(delay) = kill_after {
            std::thread::sleep(delay);
            let _ = child.kill();
        }
        let status = wait_bounded(&mut child, scratch, what);
        runs.push((p, from, log_len(scratch)));
        status
    };
    for round in 0..d.rounds {
        assert!(start.elapsed() < d.time_limit, "time limit exceeded in round {round}");
        let mut a = args.to_vec();
        let mut kill_after = None;
        if round % 2 == 1 {
            let step = SINK_STEPS[(round as usize / 2) % SINK_STEPS.len()];
            let n = if step == "sink-recover" { 1 } else { rng.range(2, 12) };
            a.extend(["--kill-self-at".into(), format!("{step}:{n}")]);
        } else {
            kill_after = Some(Duration::from_millis(rng.range(d.kill_delay_ms.0, d.kill_delay_ms.1)));
        }
        let status = run(&a, &format!("round {round}"), kill_after);
        match status.signal() {
            Some(9) => killed += 1,
            _ => {
                assert!(status.success(), "round {round}: the run failed: {}", scratch.log_text("runs"));
                break; // it finished before the kill
            }
        }
    }
    let status = run(args, "the last run", None);
    assert!(status.success(), "the last run failed: {}", scratch.log_text("runs"));
    assert!(killed >= 3, "only {killed} runs were killed: the drill injected too few failures");
    let restored = restored_checkpoints(&scratch.events("runs"));
    assert!(!restored.is_empty(), "no run restored a checkpoint: every kill landed before the first one");
    let log = std::fs::read(scratch.path("runs.log")).unwrap_or_default();
    let runs: Vec<(u32, Vec<LogEvent>)> = runs
        .iter()
        .map(|&(p, from, to)| (p, events(&String::from_utf8_lossy(&log[from as usize..to as usize]))))
        .collect();
    let report = DrillReport { killed, restored, restores: restores(&runs), runs };
    let distinct: std::collections::BTreeSet<u32> = d.parallelism.iter().copied().collect();
    if distinct.len() > 1 {
        assert!(
            !report.rescaled().is_empty(),
            "no run restored a checkpoint at another parallelism than the one that wrote it: the drill \
             rescaled nothing; restores {:?}",
            report.restores
        );
    }
    report
}

/// `args` with `--parallelism` set to that of run `run` (appended if `args` has none; clap refuses
/// the flag twice), and that parallelism (`args`' own, or 1, the default, if `parallelism` is empty).
fn at_parallelism(args: &[String], parallelism: &[u32], run: usize) -> (Vec<String>, u32) {
    let mut a = args.to_vec();
    let at = a.iter().position(|x| x == "--parallelism");
    if parallelism.is_empty() {
        let p = at.and_then(|i| a.get(i + 1)).map_or(1, |v| v.parse().expect("a number after --parallelism"));
        return (a, p);
    }
    let p = parallelism[run % parallelism.len()];
    match at {
        Some(i) => a[i + 1] = p.to_string(),
        None => a.extend(["--parallelism".into(), p.to_string()]),
    }
    (a, p)
}

fn log_len(scratch: &Scratch) -> u64 {
    std::fs::metadata(scratch.path("runs.log")).map_or(0, |m| m.len())
}

/// The restores of `runs` (each run's parallelism and events), each with the parallelism of the
/// run that logged the checkpoint complete.
fn restores(runs: &[(u32, Vec<LogEvent>)]) -> Vec<Restore> {
    let mut written_at: BTreeMap<u64, u32> = BTreeMap::new();
    let mut out = Vec::new();
    for (p, events) in runs {
        for e in events {
            if e.is("restore") {
                if let Some(c) = e.chk() {
                    out.push(Restore { checkpoint: c, written_at: written_at.get(&c).copied(), restored_at: *p });
                }
            } else if e.is("checkpoint_complete") {
                if let Some(c) = e.chk() {
                    written_at.insert(c, *p);
                }
            }
        }
    }
    out
}
