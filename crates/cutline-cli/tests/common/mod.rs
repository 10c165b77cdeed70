//! What the integration tests of the `cutline` binary share: seeded randomness and input text, a
//! scratch directory that is kept when a test fails, starting the binary with JSON-structured logs,
//! and reading those logs back as events, so that tests assert on an event's fields (`event`, `chk`,
//! `gen`, `worker`, `reason`, ...) rather than on the wording of a log line.
//!
//! Every process a test starts through [`cutline`] logs JSON objects (`CUTLINE_LOG_FORMAT=json`, one
//! per line, see `src/logging.rs`); its report lines on stdout stay as they are. A log file may hold
//! both (a test sends stdout and stderr to one file): [`events`] reads the JSON lines and skips the
//! others.

// Each test file uses a part of this module.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[cfg(unix)]
pub mod cluster;
#[cfg(unix)]
pub mod drill;
pub mod http;
#[cfg(all(unix, feature = "postgres"))]
pub mod pg;

pub const BIN: &str = env!("CARGO_BIN_EXE_cutline");

/// A `cutline` command whose events are logged as JSON objects.
pub fn cutline() -> Command {
    let mut c = Command::new(BIN);
    c.env("CUTLINE_LOG_FORMAT", "json").env_remove("CUTLINE_LOG");
    // Jobs of tests running at once each serve their HTTP endpoint on a port of their own.
    c.env("CUTLINE_HTTP", "127.0.0.1:0");
    c
}

// ---------------------------------------------------------------------------------------------------
// Deterministic randomness and input text.

/// xorshift64* with a splitmix64-spread seed: small, seedable, good enough for words and delays.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        // Spread the seed (splitmix64 finaliser) so that nearby seeds give unrelated streams; never 0.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        XorShift(if z == 0 { 0x2545_F491_4F6C_DD1D } else { z })
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64 - 1) as usize]
    }
}

/// `lines` lines of `words.0..=words.1` words `w0`..`w<vocabulary-1>`, separated by one space, the
/// same for the same seed.
pub fn word_lines(seed: u64, lines: usize, words: (u64, u64), vocabulary: u64) -> String {
    let mut rng = XorShift::new(seed);
    let mut text = String::with_capacity(lines * 8 * words.1 as usize);
    for _ in 0..lines {
        for k in 0..rng.range(words.0, words.1) {
            if k > 0 {
                text.push(' ');
            }
            text.push_str(&format!("w{}", rng.range(0, vocabulary - 1)));
        }
        text.push('\n');
    }
    text
}

/// The committed word-count output in `dir` must be exactly that of a run without failures.
pub fn check_output(text: &str, dir: &Path, what: &str, logs: &Path) {
    let problems = cutline_cli::jobs::check_wordcount_output(text, dir)
        .unwrap_or_else(|e| panic!("{what}: cannot read the output {}: {e}", dir.display()));
    assert!(
        problems.is_empty(),
        "{what}: output differs from a failure-free run: {problems:#?}; logs in {}",
        logs.display()
    );
}

// ---------------------------------------------------------------------------------------------------
// Scratch directories and processes.

/// A fresh directory under the temporary directory, removed when the test passes and kept (and
/// named on stderr) when it fails, with every log a scenario wrote into it.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "cutline-test-{name}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Scratch { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `PATH` as a string argument.
    pub fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// Write `text` to `name`.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
        p
    }

    /// `<name>.log`, appended to, for a process's stdout or stderr.
    pub fn log(&self, name: &str) -> Stdio {
        let p = self.path(&format!("{name}.log"));
        Stdio::from(
            File::options().create(true).append(true).open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        )
    }

    /// What `<name>.log` holds so far.
    pub fn log_text(&self, name: &str) -> String {
        read_lossy(&self.path(&format!("{name}.log")))
    }

    /// The structured events in `<name>.log` so far.
    pub fn events(&self, name: &str) -> Vec<LogEvent> {
        events(&self.log_text(name))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("scratch directory kept for inspection: {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A file's contents, invalid UTF-8 replaced; empty if it does not exist.
pub fn read_lossy(p: &Path) -> String {
    std::fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// An address on loopback that was free a moment ago.
pub fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Send `sig` (`-KILL`, `-STOP`, ...) to a child.
pub fn signal(child: &Child, sig: &str) {
    let st = Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(st.success(), "kill {sig} {} failed", child.id());
}

/// Poll `f` every 20 ms until it returns `Some`; panic with `what` after `limit`.
pub fn wait_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "waited {limit:?} in vain for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------------
// Structured log events.

/// One event of a `cutline` process's JSON log: its level and its fields (`event`, `message`, `chk`,
/// `gen`, `worker`, `reason`, and whatever else the event carries).
#[derive(Clone, Debug)]
pub struct LogEvent {
    pub level: String,
    pub fields: serde_json::Map<String, serde_json::Value>,
    /// The spans the event happened in, outermost first (`job`, `generation`, `task`), with their
    /// fields.
    pub spans: Vec<serde_json::Map<String, serde_json::Value>>,
}

impl LogEvent {
    /// The `event` field: what happened (`checkpoint_complete`, `restore`, `connection_refused`, ...).
    pub fn name(&self) -> &str {
        self.str("event").unwrap_or("")
    }

    pub fn is(&self, name: &str) -> bool {
        self.name() == name
    }

    /// The readable message.
    pub fn message(&self) -> &str {
        self.str("message").unwrap_or("")
    }

    pub fn str(&self, field: &str) -> Option<&str> {
        self.fields.get(field)?.as_str()
    }

    pub fn u64(&self, field: &str) -> Option<u64> {
        self.fields.get(field)?.as_u64()
    }

    pub fn bool(&self, field: &str) -> Option<bool> {
        self.fields.get(field)?.as_bool()
    }

    /// The checkpoint number of the `chk` field (`chk-12` is 12).
    pub fn chk(&self) -> Option<u64> {
        self.str("chk")?.strip_prefix("chk-")?.parse().ok()
    }

    /// Field `field` of the innermost span called `span` the event happened in.
    pub fn span(&self, span: &str, field: &str) -> Option<&str> {
        self.spans.iter().rev().find(|s| s.get("name").and_then(|n| n.as_str()) == Some(span))?.get(field)?.as_str()
    }

    /// A number field that must be there: the test is wrong (or the event changed) if it is not.
    pub fn need_u64(&self, field: &str) -> u64 {
        self.u64(field).unwrap_or_else(|| panic!("event {} has no number field {field:?}: {self:?}", self.name()))
    }
}

/// The JSON events of a log (lines that are not JSON objects, such as a report line on stdout, are
/// skipped). A malformed JSON line is an error, except a last line without its newline: a process
/// killed while writing it.
pub fn events(log: &str) -> Vec<LogEvent> {
    let complete = log.ends_with('\n');
    let lines: Vec<&str> = log.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with('{') {
            continue;
        }
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(serde_json::Value::Object(mut o)) => {
                let level = o.get("level").and_then(|l| l.as_str()).unwrap_or("").to_string();
                let fields = match o.remove("fields") {
                    Some(serde_json::Value::Object(f)) => f,
                    _ => panic!("a log event without fields: {line}"),
                };
                let spans = match o.remove("spans") {
                    Some(serde_json::Value::Array(v)) => v
                        .into_iter()
                        .filter_map(|s| match s {
                            serde_json::Value::Object(m) => Some(m),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                out.push(LogEvent { level, fields, spans });
            }
            _ if i + 1 == lines.len() && !complete => {} // cut short by SIGKILL
            _ => panic!("malformed JSON log line {line:?}"),
        }
    }
    out
}

/// The events called `name`.
pub fn named<'a>(events: &'a [LogEvent], name: &'a str) -> impl Iterator<Item = &'a LogEvent> + 'a {
    events.iter().filter(move |e| e.is(name))
}

/// How many events are called `name`.
pub fn count(events: &[LogEvent], name: &str) -> usize {
    named(events, name).count()
}

/// The checkpoints restored at a start (`restore` events with a checkpoint; a start from scratch has
/// none).
pub fn restored_checkpoints(events: &[LogEvent]) -> Vec<u64> {
    named(events, "restore").filter_map(LogEvent::chk).collect()
}

/// Completed periodic checkpoints (not the final one at end of input, not savepoints).
pub fn periodic_checkpoints(events: &[LogEvent]) -> Vec<&LogEvent> {
    named(events, "checkpoint_complete")
        .filter(|e| e.bool("is_final") == Some(false) && e.bool("savepoint") == Some(false))
        .collect()
}

/// Events of every process of a scenario, one summary line per event name, for failure messages.
pub fn summary(events: &[LogEvent]) -> String {
    let mut names: std::collections::BTreeMap<&str, usize> = Default::default();
    for e in events {
        *names.entry(e.name()).or_default() += 1;
    }
    names.iter().map(|(n, c)| format!("{n}: {c}")).collect::<Vec<_>>().join(", ")
}

/// Longest one run of a drill may take (a complete run takes a few seconds here).
pub const DRILL_RUN_LIMIT: Duration = Duration::from_secs(60);

/// Wait for a run, at most `DRILL_RUN_LIMIT`: a run that hangs is killed and fails the test.
pub fn wait_bounded(child: &mut std::process::Child, scratch: &Scratch, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + DRILL_RUN_LIMIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log = scratch.log_text("runs");
            let tail: Vec<&str> = log.lines().rev().take(6).collect();
            panic!("{what} did not end within {DRILL_RUN_LIMIT:?}; last log lines (newest first): {tail:#?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `cutline run wordcount` from `input` into `output` with its state in `state`, at parallelism 2,
/// checkpoints every `interval`, each line delayed `line_delay_us`, then `extra`.
pub fn wordcount_job(
    input: &str,
    output: &str,
    state: &str,
    interval: &str,
    line_delay_us: u32,
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = ["run", "wordcount", "--input", input, "--output", output, "--state", state]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.extend(["--parallelism".into(), "2".into(), "--checkpoint-interval".into(), interval.into()]);
    args.extend(["--line-delay-us".into(), line_delay_us.to_string()]);
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

pub fn expected_counts(text: &str) -> std::collections::BTreeMap<String, u64> {
    let mut m = std::collections::BTreeMap::new();
    for w in text.split_whitespace() {
        *m.entry(w.to_string()).or_insert(0) += 1;
    }
    m
}
