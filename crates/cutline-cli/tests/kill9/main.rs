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

#[path = "../common/mod.rs"]
mod common;

use common::{cutline, periodic_checkpoints, restored_checkpoints, LogEvent, Scratch, XorShift, BIN};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod harness;
mod refusals;
mod scenarios;
use harness::*;

/// Lines of the generated input of the kill scenarios: about 4 M words, 31 MB. One uninterrupted run
/// takes about 1.1 s in release on an idle 2-core machine, so most of the kills land mid-run.
pub(crate) const KILL_INPUT_LINES: usize = 500_000;
/// Distinct words in the generated vocabulary.
pub(crate) const VOCABULARY: usize = 3_000;
/// SIGKILLs before the job is allowed to finish.
pub(crate) const KILL_ROUNDS: u32 = 8;
/// Random delay between starting the job and killing it.
pub(crate) const KILL_DELAY_MS: (u64, u64) = (10, 300);
/// Checkpoint interval of the kill scenarios: short, so that kills often hit a checkpoint in flight.
pub(crate) const CHECKPOINT_INTERVAL: &str = "20ms";
/// Hard bound on one whole scenario (input generation, every run, the final check).
pub(crate) const SCENARIO_TIME_LIMIT: Duration = Duration::from_secs(120);
/// Hard bound on a single run that is expected to exit by itself (errors, already-finished runs).
pub(crate) const SHORT_RUN_TIME_LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------------
// Deterministic randomness and input text.

/// A vocabulary of `n` distinct words: mostly ASCII, some with multi-byte letters.
pub(crate) fn vocabulary(rng: &mut XorShift, n: usize) -> Vec<String> {
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
pub(crate) fn generate_text(seed: u64, lines: usize) -> String {
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
