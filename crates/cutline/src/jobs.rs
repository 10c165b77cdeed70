//! The jobs the `cutline` binary runs: word count over a text file and the keyed COUNT+SUM benchmark.
//! Each is an ordinary cutline job built with the public API; nothing here is special-cased by the engine.

use crate::api::Job;
use crate::sink::{DiscardSink, Sink, TransactionalFileSink};
use crate::source::{GeneratorSource, LineFileSource};
use crate::state::splitmix64;
use std::path::Path;

/// Word count: lines of `input`, split on Unicode whitespace, a running count per word, every update
/// written as `WORD<TAB>COUNT` through `sink`.
pub fn wordcount<S: Sink<(String, u64)> + Clone>(input: &Path, parallelism: u32, sink: S) -> Job {
    wordcount_paced(input, parallelism, sink, 0)
}

/// Word count that spends `line_delay_us` per line before splitting it, so that a small input runs long
/// enough to show checkpoints and failures (demo and drills).
pub fn wordcount_paced<S: Sink<(String, u64)> + Clone>(
    input: &Path,
    parallelism: u32,
    sink: S,
    line_delay_us: u64,
) -> Job {
    let job = Job::new("wordcount");
    job.set_parallelism(parallelism);
    let lines = job.source("lines", LineFileSource::new(input));
    let lines = if line_delay_us > 0 {
        lines.map(move |l: String| {
            std::thread::sleep(std::time::Duration::from_micros(line_delay_us));
            l
        })
    } else {
        lines
    };
    lines
        .flat_map(|line: String, out: &mut Vec<String>| out.extend(line.split_whitespace().map(str::to_string)))
        .key_by(|w: &String| w.clone())
        .aggregate("counts", || 0u64, |c, _w| *c += 1, |w, c| (w.clone(), *c))
        .sink("output", sink);
    job
}

/// The transactional file sink of word count: `WORD<TAB>COUNT` lines.
pub fn wordcount_file_sink(dir: &Path) -> TransactionalFileSink<(String, u64)> {
    TransactionalFileSink::new(dir, |(w, c): &(String, u64), buf: &mut Vec<u8>| {
        buf.extend_from_slice(w.as_bytes());
        buf.push(b'\t');
        buf.extend_from_slice(c.to_string().as_bytes());
    })
}

/// The keyed benchmark: event `i` has key `splitmix64(i) % keys` and value `i % 1000`; COUNT and SUM
/// per key; every update goes to a sink that discards it.
pub fn keyed_bench(events: u64, keys: u64, parallelism: u32) -> Job {
    assert!(keys > 0);
    let job = Job::new("bench");
    job.set_parallelism(parallelism);
    job.source("events", GeneratorSource::new(events, move |i| (splitmix64(i) % keys, i % 1000)))
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate(
            "count-sum",
            || (0u64, 0u64),
            |acc, e: (u64, u64)| {
                acc.0 += 1;
                acc.1 += e.1;
            },
            |k, acc| (*k, acc.0, acc.1),
        )
        .sink("discard", DiscardSink);
    job
}

/// Check a word-count output directory against the counts of `text`: for every word, the committed
/// lines must be exactly `WORD<TAB>1` .. `WORD<TAB>n`, each once. Returns the problems found (empty if
/// the output is exactly that of a run without failures).
pub fn check_wordcount_output(text: &str, dir: &Path) -> std::io::Result<Vec<String>> {
    use std::collections::BTreeMap;
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    for w in text.split_whitespace() {
        *expected.entry(w).or_default() += 1;
    }
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("part-") {
            continue;
        }
        for line in std::fs::read_to_string(entry.path())?.lines() {
            match line.split_once('\t').and_then(|(w, c)| c.parse::<u64>().ok().map(|c| (w, c))) {
                Some((w, c)) => seen.entry(w.to_string()).or_default().push(c),
                None => problems.push(format!("malformed line {line:?} in {name}")),
            }
        }
    }
    for (w, n) in &expected {
        let mut got = seen.remove(*w).unwrap_or_default();
        got.sort_unstable();
        let want: Vec<u64> = (1..=*n).collect();
        if got != want {
            let dups = got.windows(2).filter(|p| p[0] == p[1]).count();
            problems.push(format!("word {w:?}: {} updates committed, expected {n} ({dups} duplicated)", got.len()));
        }
    }
    for w in seen.keys() {
        problems.push(format!("word {w:?} is not in the input"));
    }
    problems.truncate(20);
    Ok(problems)
}

/// One failure drill of the threaded runtime on real files: word count over a generated text while
/// task failures are injected at every fault point (snapshot, snapshot write, sink prepare, commit,
/// half-way through a commit, recovery, record processing) and checkpoint storage writes fail; the
/// committed output is then checked against the failure-free result. Returns a one-line verdict.
pub fn drill_run(seed: u64) -> Result<String, String> {
    use crate::fault::{FaultPoint, Faults};
    use crate::runtime::{run, RunConfig};
    use crate::sim::Rng;
    use cutline_core::restart::RestartStrategy;
    use cutline_storage::{FaultyStore, LocalDirStore, StoreOp};
    use std::sync::{Arc, Mutex};

    let dir = std::env::temp_dir().join(format!("cutline-drill-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut rng = Rng::new(seed);
    let words = ["cut", "epoch", "barrier", "state", "sink", "source", "commit", "abort", "restore", "align"];
    let mut text = String::new();
    for _ in 0..3000 {
        let n = 1 + rng.below(8);
        let line: Vec<&str> = (0..n).map(|_| words[rng.below(words.len() as u64) as usize]).collect();
        text.push_str(&line.join(" "));
        text.push('\n');
    }
    let input = dir.join("input.txt");
    std::fs::write(&input, &text).map_err(|e| e.to_string())?;
    let output = dir.join("output");
    std::fs::create_dir_all(&output).map_err(|e| e.to_string())?;
    let budget = Arc::new(Mutex::new((Rng::new(seed ^ 0xd1ce), 6u32)));
    let b2 = budget.clone();
    let inject = move |ppm: u64| {
        let mut g = b2.lock().expect("drill rng");
        if g.1 > 0 && g.0.chance(ppm) {
            g.1 -= 1;
            true
        } else {
            false
        }
    };
    let inject = Arc::new(inject);
    let i2 = inject.clone();
    let store =
        FaultyStore::new(LocalDirStore::open(dir.join("state")).map_err(|e| e.to_string())?, move |op| match op {
            StoreOp::WriteTaskState { .. }
            | StoreOp::CommitManifest { .. }
            | StoreOp::CommitManifestAfterWrite { .. } => i2(30_000),
            _ => false,
        });
    let graph = wordcount_paced(&input, 2, wordcount_file_sink(&output), 100).build().map_err(|e| e.to_string())?;
    let mut cfg = RunConfig::new(Arc::new(store), format!("drill-{seed}"));
    cfg.checkpoint.interval_ms = Some(20);
    cfg.checkpoint.tolerable_failures = 1;
    cfg.restart = RestartStrategy::FixedDelay { delay_ms: 10, max_attempts: 100 };
    cfg.batch_size = 16;
    let i3 = inject.clone();
    cfg.faults = Faults::new(move |p| match p {
        FaultPoint::ProcessBatch => i3(300),
        _ => i3(60_000),
    });
    let report = run(&graph, cfg).map_err(|e| format!("seed {seed}: the job failed: {e}"))?;
    let problems = check_wordcount_output(&text, &output).map_err(|e| e.to_string())?;
    let injected = 6 - budget.lock().expect("drill rng").1;
    let _ = std::fs::remove_dir_all(&dir);
    if !problems.is_empty() {
        return Err(format!("seed {seed}: output differs from the failure-free run: {}", problems.join("; ")));
    }
    Ok(format!(
        "PASS: {injected} failures injected, {} restarts, {} checkpoints completed, {} failed, output exact",
        report.restarts, report.checkpoints_completed, report.checkpoints_failed
    ))
}
