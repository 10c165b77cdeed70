//! The jobs the `cutline` binary runs: word count over a text file, a Nexmark query into files, and
//! the keyed COUNT+SUM benchmark.
//! Each is an ordinary cutline job built with the public API; nothing here is special-cased by the engine.

use cutline::{splitmix64, DiscardSink, GeneratorSource, Job, LineFileSource, Sink, TransactionalFileSink};
use cutline_nexmark::model::Event;
use cutline_nexmark::{Query, Row};
use std::path::Path;

pub use crate::endpoints::{WordcountInput, WordcountOutput};

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
    wordcount_from(&WordcountInput::File(input.to_path_buf()), parallelism, sink, line_delay_us)
        .expect("a file input needs no feature")
}

/// Word count over `input` into `sink`; see [`wordcount_paced`].
pub fn wordcount_from<S: Sink<(String, u64)> + Clone>(
    input: &WordcountInput,
    parallelism: u32,
    sink: S,
    line_delay_us: u64,
) -> Result<Job, String> {
    let job = Job::new("wordcount");
    job.set_parallelism(parallelism);
    let lines = match input {
        WordcountInput::File(path) => job.source("lines", LineFileSource::new(path)),
        WordcountInput::Kafka { brokers, topic, bounded } => kafka_lines(&job, brokers, topic, *bounded)?,
    };
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
    Ok(job)
}

#[cfg(feature = "kafka")]
fn kafka_lines(job: &Job, brokers: &str, topic: &str, bounded: bool) -> Result<cutline::Stream<String>, String> {
    use cutline::connectors::kafka::{KafkaRecord, KafkaSource, KafkaSourceConfig};
    let mut config = KafkaSourceConfig::new(brokers, &[topic]);
    config.bounded = bounded;
    Ok(job
        .source_from("lines", move |_| KafkaSource::new(config.clone()))
        .map(|r: KafkaRecord| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()))
}

#[cfg(not(feature = "kafka"))]
fn kafka_lines(_: &Job, _: &str, _: &str, _: bool) -> Result<cutline::Stream<String>, String> {
    Err(NO_KAFKA.into())
}

#[cfg(not(feature = "kafka"))]
const NO_KAFKA: &str = "this cutline was built without Kafka support: build it with `--features kafka`";

/// The transactional file sink of word count: `WORD<TAB>COUNT` lines.
pub fn wordcount_file_sink(dir: &Path) -> TransactionalFileSink<(String, u64)> {
    TransactionalFileSink::new(dir, |(w, c): &(String, u64), buf: &mut Vec<u8>| {
        buf.extend_from_slice(w.as_bytes());
        buf.push(b'\t');
        buf.extend_from_slice(c.to_string().as_bytes());
    })
}

/// Word count into `output` (see [`WordcountOutput`]).
pub fn wordcount_into(
    input: &WordcountInput,
    parallelism: u32,
    output: &WordcountOutput,
    line_delay_us: u64,
) -> Result<Job, String> {
    match output {
        WordcountOutput::Dir(dir) => wordcount_from(input, parallelism, wordcount_file_sink(dir), line_delay_us),
        WordcountOutput::Postgres { url, table } => postgres_wordcount(input, parallelism, url, table, line_delay_us),
        WordcountOutput::Kafka { brokers, topic, exactly_once, fixed_partitions } => {
            kafka_wordcount(input, parallelism, brokers, topic, (*exactly_once, *fixed_partitions), line_delay_us)
        }
    }
}

#[cfg(feature = "kafka")]
fn kafka_wordcount(
    input: &WordcountInput,
    parallelism: u32,
    brokers: &str,
    topic: &str,
    (exactly_once, fixed_partitions): (bool, bool),
    line_delay_us: u64,
) -> Result<Job, String> {
    use cutline::connectors::kafka::{KafkaPartitioning, KafkaSink, KafkaSinkConfig};
    let mut config = if exactly_once {
        KafkaSinkConfig::exactly_once(brokers, topic)
    } else {
        KafkaSinkConfig::at_least_once(brokers, topic)
    };
    if fixed_partitions {
        config.partitioning = KafkaPartitioning::Fixed;
    }
    let sink = KafkaSink::new(config, |(w, c): &(String, u64), key: &mut Vec<u8>, value: &mut Vec<u8>| {
        key.extend_from_slice(w.as_bytes());
        value.extend_from_slice(c.to_string().as_bytes());
    });
    wordcount_from(input, parallelism, sink, line_delay_us)
}

#[cfg(feature = "postgres")]
fn postgres_wordcount(
    input: &WordcountInput,
    parallelism: u32,
    url: &str,
    table: &str,
    line_delay_us: u64,
) -> Result<Job, String> {
    use cutline::connectors::postgres::{PostgresSink, PostgresSinkConfig, RowFn, SqlValue};
    let mut config = PostgresSinkConfig::upsert(url, table, &["word", "count"], &["word"]);
    config.create_table = Some("word text PRIMARY KEY, count bigint NOT NULL".into());
    let row: RowFn<(String, u64)> =
        std::sync::Arc::new(|(w, c): &(String, u64)| vec![SqlValue::from(w.as_str()), SqlValue::Int(*c as i64)]);
    wordcount_from(input, parallelism, PostgresSink::new(config, row), line_delay_us)
}

#[cfg(not(feature = "kafka"))]
fn kafka_wordcount(_: &WordcountInput, _: u32, _: &str, _: &str, _: (bool, bool), _: u64) -> Result<Job, String> {
    Err(NO_KAFKA.into())
}

#[cfg(not(feature = "postgres"))]
fn postgres_wordcount(_: &WordcountInput, _: u32, _: &str, _: &str, _: u64) -> Result<Job, String> {
    Err("this cutline was built without PostgreSQL support: build it with `--features postgres`".into())
}

/// The keyed benchmark: event `i` has key `splitmix64(i) % keys` and value `i % 1000`; COUNT and SUM
/// per key; every update goes to a [`TallySink`](crate::tally::TallySink) reporting into `tally`,
/// which counts the updates and the keyed state they show, so that the run can be checked. With
/// `hot_keys > 0`, event `i < keys` has key `i` (every key gets state) and later ones key
/// `splitmix64(i) % hot_keys`: only those keys change from then on.
pub fn keyed_bench(events: u64, (keys, hot_keys): (u64, u64), parallelism: u32, tally: &Path) -> Job {
    assert!(keys > 0);
    let job = Job::new("bench");
    job.set_parallelism(parallelism);
    let key = move |i: u64| match hot_keys {
        0 => splitmix64(i) % keys,
        _ if i < keys => i,
        hot => splitmix64(i) % hot,
    };
    job.source("events", GeneratorSource::new(events, move |i| (key(i), i % 1000)))
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
        .sink("tally", crate::tally::TallySink::new(tally, keys));
    job
}

/// A Nexmark query over the first `events` generated events (see [`cutline_nexmark`]), every row a
/// JSON line in `output` through the transactional file sink. With `pace_us > 0` the job sleeps that
/// long at one bid in 64 (by price, so in every source subtask), so that a small run lasts long
/// enough for drills.
pub fn nexmark(query: Query, events: u64, parallelism: u32, output: &Path, pace_us: u64) -> Job {
    let job = Job::new(format!("nexmark-{query}"));
    job.set_parallelism(parallelism);
    let mut events = cutline_nexmark::events(&job, events, parallelism);
    if pace_us > 0 {
        events = events.map(move |e: Event| {
            if matches!(&e, Event::Bid(b) if b.price % 64 == 0) {
                std::thread::sleep(std::time::Duration::from_micros(pace_us));
            }
            e
        });
    }
    let sink = TransactionalFileSink::new(output, |r: &Row, buf: &mut Vec<u8>| {
        serde_json::to_writer(&mut *buf, r).expect("a row serializes to JSON")
    });
    query.build(events).sink("rows", sink);
    job
}

/// Check a Nexmark output directory (see [`nexmark`]) against the query's batch reference over the
/// same events: the committed rows, normalized ([`Query::normalize`]), must be exactly the
/// reference's, each once. Returns the problems found (empty if the output is that of a run
/// without failures).
pub fn check_nexmark_output(query: Query, events: u64, dir: &Path) -> std::io::Result<Vec<String>> {
    use std::collections::BTreeMap;
    let mut problems = Vec::new();
    let mut rows = Vec::new();
    for name in committed_files(dir)? {
        for line in std::fs::read_to_string(dir.join(&name))?.lines() {
            match serde_json::from_str::<Row>(line) {
                Ok(r) => rows.push(r),
                Err(e) => problems.push(format!("malformed line {line:?} in {name}: {e}")),
            }
        }
    }
    let rows = match query.normalize(rows) {
        Ok(rows) => rows,
        Err(e) => {
            problems.push(e);
            return Ok(problems);
        }
    };
    // Rows with how often they were committed (positive) or expected (negative).
    let mut balance: BTreeMap<Row, i64> = BTreeMap::new();
    let want = cutline_nexmark::reference::reference(query, events);
    let (got_n, want_n) = (rows.len(), want.len());
    for r in rows {
        *balance.entry(r).or_default() += 1;
    }
    for r in want {
        *balance.entry(r).or_default() -= 1;
    }
    let (extra, missing): (Vec<_>, Vec<_>) = balance.into_iter().filter(|(_, n)| *n != 0).partition(|(_, n)| *n > 0);
    if !extra.is_empty() || !missing.is_empty() {
        problems.push(format!(
            "{query}: {got_n} rows committed, the reference has {want_n}: {} not in the reference or committed more often, {} missing",
            extra.len(),
            missing.len()
        ));
        for (r, n) in extra.iter().take(5) {
            problems.push(format!("committed {n} time(s) too many: {r}"));
        }
        for (r, n) in missing.iter().take(5) {
            problems.push(format!("missing {} time(s): {r}", -n));
        }
    }
    problems.truncate(20);
    Ok(problems)
}

/// The committed `part-*` files of a transactional file sink's directory, by name.
fn committed_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with("part-") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
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
    for name in committed_files(dir)? {
        for line in std::fs::read_to_string(dir.join(&name))?.lines() {
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

/// Failures one drill run of the threaded runtime injects at most (task failures at fault points
/// and failed storage writes together).
pub const DRILL_FAILURE_BUDGET: u32 = 6;

/// One failure drill of the threaded runtime on real files: word count over a generated text while
/// task failures are injected at every fault point (snapshot, snapshot write, sink prepare, commit,
/// half-way through a commit, recovery, record processing) and checkpoint storage writes fail; the
/// committed output is then checked against the failure-free result. Returns a one-line verdict.
/// A run that injected no failure, or whose failures the job never noticed, tested nothing: an error.
pub fn drill_run(seed: u64) -> Result<String, String> {
    drill_run_with_budget(seed, DRILL_FAILURE_BUDGET)
}

/// [`drill_run`] with at most `budget` injected failures.
pub fn drill_run_with_budget(seed: u64, budget: u32) -> Result<String, String> {
    use cutline::testing::sim::Rng;
    use cutline::testing::{FaultPoint, Faults};
    use cutline::{run, RunConfig};
    use cutline_core::restart::RestartStrategy;
    use cutline_storage::{FaultyStore, LocalDirStore, StoreOp};
    use std::sync::{Arc, Mutex};

    // Unique per call: drills may run concurrently in one process (tests).
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("cutline-drill-{}-{n}-{seed}", std::process::id()));
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
    let budget_left = Arc::new(Mutex::new((Rng::new(seed ^ 0xd1ce), budget)));
    let b2 = budget_left.clone();
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
    // The failures are injected at random, and may well be the same one after the same checkpoint.
    cfg.max_repeated_failures = None;
    cfg.batch_size = 16;
    let i3 = inject.clone();
    cfg.faults = Faults::new(move |p| match p {
        FaultPoint::ProcessBatch => i3(300),
        _ => i3(60_000),
    });
    let report = run(&graph, cfg).map_err(|e| format!("seed {seed}: the job failed: {e}"))?;
    let problems = check_wordcount_output(&text, &output).map_err(|e| e.to_string())?;
    let injected = budget - budget_left.lock().expect("drill rng").1;
    let _ = std::fs::remove_dir_all(&dir);
    if !problems.is_empty() {
        return Err(format!("seed {seed}: output differs from the failure-free run: {}", problems.join("; ")));
    }
    if injected == 0 {
        return Err(format!(
            "seed {seed}: FAIL: the drill injected no failure (budget {budget}), so it tested nothing; \
             try other seeds"
        ));
    }
    if report.restarts == 0 && report.checkpoints_failed == 0 {
        return Err(format!(
            "seed {seed}: FAIL: {injected} failures were injected, yet the job neither restarted nor failed a \
             checkpoint: the injected failures did not reach it"
        ));
    }
    Ok(format!(
        "PASS: {injected} failures injected, {} restarts, {} checkpoints completed, {} failed, output exact",
        report.restarts, report.checkpoints_completed, report.checkpoints_failed
    ))
}

/// What the simulated half of a drill went through, over all its seeds.
#[derive(Clone, Debug, Default)]
pub struct SimDrill {
    pub seeds: u64,
    pub checkpoints_completed: u64,
    /// Failovers (task crashes, failures at fault points and of storage) and whole-process crashes.
    pub failovers: u64,
    pub process_crashes: u64,
}

impl SimDrill {
    /// Failures the simulation injected and the job recovered from.
    pub fn failures(&self) -> u64 {
        self.failovers + self.process_crashes
    }
}

/// The deterministic simulation of the protocol for `seeds` seeds from `first`, each checked for
/// exactly-once output and consistent cuts. An error names the first seed that failed and how to
/// replay it, or says that no seed injected a failure (the drill then tested nothing).
pub fn drill_simulation(first: u64, seeds: u64, o: &cutline::testing::sim::SimOptions) -> Result<SimDrill, String> {
    let mut d = SimDrill { seeds, ..Default::default() };
    for s in first..first.saturating_add(seeds) {
        let r = cutline::testing::sim::run_seed(s, o).map_err(|e| {
            format!("simulation seed {s} FAILED: {e}\nreplay with: cutline drill --seed {s} --sim-seeds 1 --runs 0")
        })?;
        d.checkpoints_completed += r.checkpoints_completed;
        d.failovers += r.failovers;
        d.process_crashes += r.process_crashes;
    }
    if seeds > 0 && d.failures() == 0 {
        return Err(format!(
            "FAIL: {seeds} simulated seeds from {first} injected no failure (no failover, no process crash), so they \
             tested nothing"
        ));
    }
    Ok(d)
}

/// Settings of the backlog benchmark (see [`backlog_bench`]).
#[derive(Clone, Debug)]
pub struct BacklogBench {
    /// How long the job runs before it is stopped.
    pub seconds: u64,
    /// Records per second the slow task processes.
    pub slow_records_per_s: u64,
    /// Batches per channel (the backlog in front of the slow task is about this many batches).
    pub channel_capacity: usize,
    pub batch_size: usize,
    pub checkpoint: cutline::CheckpointConfig,
}

/// What one backlog benchmark run measured.
#[derive(Clone, Debug)]
pub struct BacklogResult {
    /// Completed periodic checkpoints, in order.
    pub checkpoints: Vec<cutline::CheckpointSummary>,
    /// Checkpoints that failed (timed out).
    pub failed: u64,
    /// Seconds of data queued in front of the slow task when the job stopped (queued records / rate).
    pub backlog_s: f64,
    /// Most batches ever queued on one channel, and the configured capacity.
    pub high_water_batches: usize,
    pub capacity_batches: usize,
    /// Time the source spent backpressured.
    pub source_backpressured_ms: u64,
    /// Peak resident memory of the process (VmHWM), if the platform reports it.
    pub peak_rss_bytes: Option<u64>,
    pub records_processed: u64,
}

/// The backlog benchmark: a fast source feeds one task that processes only `slow_records_per_s`
/// records per second, so the channel in front of it stays full (about `channel_capacity` batches, some
/// seconds of data); then a keyed count and a discarding sink. It shows how long checkpoints take when
/// their barriers meet a backlog, aligned (they wait behind it), unaligned (they overtake it and persist
/// it), or aligned with a timeout (they switch).
#[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` is newer than the minimum Rust version
pub fn backlog_bench(
    b: &BacklogBench,
    store: std::sync::Arc<dyn cutline::CheckpointStore>,
) -> Result<BacklogResult, String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    assert!(b.slow_records_per_s > 0 && b.seconds > 0);
    // The slow task sleeps 10 ms every `per_tick` records.
    let per_tick = (b.slow_records_per_s / 100).max(1);
    let processed = Arc::new(AtomicU64::new(0));
    let counter = processed.clone();
    let job = Job::new("backlog");
    job.source("events", GeneratorSource::new(u64::MAX / 2, |i| (splitmix64(i) % 10_000, i)))
        .rebalance("slow", 1)
        .map(move |e: (u64, u64)| {
            let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
            if n % per_tick == 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
            e
        })
        .key_by(|e: &(u64, u64)| e.0)
        .aggregate("count", || 0u64, |c, _e| *c += 1, |k, c| (*k, *c))
        .sink("out", DiscardSink);
    let graph = job.build().map_err(|e| e.to_string())?;
    let mut cfg = cutline::RunConfig::new(store, "backlog-bench");
    cfg.checkpoint = b.checkpoint.clone();
    cfg.channel_capacity = b.channel_capacity;
    cfg.batch_size = b.batch_size;
    cfg.restart = cutline::RestartStrategy::None;
    let handle = cutline::spawn(graph, cfg);
    let until = Instant::now() + Duration::from_secs(b.seconds);
    let mut metrics = None;
    while Instant::now() < until && !handle.is_finished() {
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(m) = handle.metrics() {
            metrics = Some(m);
        }
    }
    handle.stop();
    let report = handle.join().map_err(|e| e.to_string())?;
    let m = metrics.ok_or("the job reported no metrics")?;
    let slow_inputs: Vec<&cutline::ChannelStats> =
        m.tasks.iter().filter(|t| t.name.starts_with("slow#")).flat_map(|t| t.inputs.iter()).collect();
    let queued: usize = slow_inputs.iter().map(|c| c.queued_batches).sum();
    let all_inputs = m.tasks.iter().flat_map(|t| t.inputs.iter());
    let high_water_batches = all_inputs.map(|c| c.high_water_batches).max().unwrap_or(0);
    let source_backpressured_ms =
        m.tasks.iter().filter(|t| t.name.starts_with("events#")).map(|t| t.backpressured_ms).sum();
    Ok(BacklogResult {
        checkpoints: report.checkpoints.into_iter().filter(|c| !c.is_final).collect(),
        failed: report.checkpoints_failed,
        backlog_s: (queued * b.batch_size) as f64 / b.slow_records_per_s as f64,
        high_water_batches,
        capacity_batches: b.channel_capacity,
        source_backpressured_ms,
        peak_rss_bytes: peak_rss_bytes(),
        records_processed: processed.load(Ordering::Relaxed),
    })
}

/// Peak resident set size of this process (Linux: VmHWM in /proc/self/status).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
