//! The kill -9 drill of one `cutline run` process against a real external system: run the same
//! command line again and again, killing it from outside at a random moment (even rounds) or
//! letting it kill itself at a step of its sink's protocol (odd rounds, `--kill-self-at`), then run
//! it once more to the end. Every run logs into `runs.log` of the scratch directory.

use super::{cutline, restored_checkpoints, wait_bounded, Scratch, XorShift};
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
    pub time_limit: Duration,
    pub seed: u64,
}

/// What a drill did: how many runs were killed, and the checkpoints runs restored.
pub struct DrillReport {
    pub killed: u32,
    pub restored: Vec<u64>,
}

/// Run the drill with the command line `args`; panics (with the runs' log) if a run fails, if
/// fewer than 3 runs were killed, or if no run restored a checkpoint (the drill must have injected
/// its failures where they matter).
pub fn kill_and_resume(scratch: &Scratch, args: &[String], d: &Drill) -> DrillReport {
    let mut rng = XorShift::new(d.seed);
    let start = Instant::now();
    let mut killed = 0;
    for round in 0..d.rounds {
        assert!(start.elapsed() < d.time_limit, "time limit exceeded in round {round}");
        let mut a = args.to_vec();
        if round % 2 == 1 {
            let step = SINK_STEPS[(round as usize / 2) % SINK_STEPS.len()];
            let n = if step == "sink-recover" { 1 } else { rng.range(2, 12) };
            a.extend(["--kill-self-at".into(), format!("{step}:{n}")]);
        }
        let mut child = cutline().args(&a).stdout(scratch.log("runs")).stderr(scratch.log("runs")).spawn().unwrap();
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_millis(rng.range(d.kill_delay_ms.0, d.kill_delay_ms.1)));
            let _ = child.kill();
        }
        let status = wait_bounded(&mut child, scratch, &format!("round {round}"));
        match status.signal() {
            Some(9) => killed += 1,
            _ => {
                assert!(status.success(), "round {round}: the run failed: {}", scratch.log_text("runs"));
                break; // it finished before the kill
            }
        }
    }
    let mut last = cutline().args(args).stdout(scratch.log("runs")).stderr(scratch.log("runs")).spawn().unwrap();
    let status = wait_bounded(&mut last, scratch, "the last run");
    assert!(status.success(), "the last run failed: {}", scratch.log_text("runs"));
    assert!(killed >= 3, "only {killed} runs were killed: the drill injected too few failures");
    let restored = restored_checkpoints(&scratch.events("runs"));
    assert!(!restored.is_empty(), "no run restored a checkpoint: every kill landed before the first one");
    DrillReport { killed, restored }
}
