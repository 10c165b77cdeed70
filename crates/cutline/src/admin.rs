//! The local admin endpoint of a running job: a Unix domain socket that answers one-line text requests
//! (status, checkpoint settings, run-time tuning, savepoints, stop), and the client that sends them.
//!
//! It owns the socket file (binding, refusing when another live job answers there, replacing a stale
//! file, removing it when the server is dropped), the request/answer protocol and its parsing, and the
//! formatting of settings and status. It does not own any job behaviour: every request is carried out
//! through [`JobControl`], which decides whether settings are valid (`CheckpointConfig::validate`),
//! takes and exports savepoints and stops the job. It does not authenticate: whoever may connect to the
//! socket file (its directory's permissions decide) may control the job.
//!
//! # Protocol
//!
//! A client connects, sends one request line (UTF-8, at most [`MAX_REQUEST_BYTES`] including the
//! newline, within [`REQUEST_READ_TIMEOUT`]), and reads the answer until the server closes the
//! connection. The first line of an answer is `ok`, `ok <details>` or `error: <reason>`; some answers
//! continue on further lines.
//!
//! | request | answer |
//! |---|---|
//! | `ping` | `ok cutline pid=<pid>` while the job runs |
//! | `status` | `ok`, then a readable report: settings, per-task backpressure and idle time, channel occupancy, recent failed and completed checkpoints |
//! | `config` | `ok <settings>`: every checkpoint setting as `key=value`, the syntax `set` takes |
//! | `set key=value ...` | `ok <settings>` now in force; only the named keys change |
//! | `savepoint [to=PATH]` | `ok checkpoint=<id> bytes=<n> path=<PATH>` once the savepoint is exported |
//! | `stop-with-savepoint [to=PATH]` | the same; the job then drains and stops |
//! | `stop` | `ok stopping`: the job stops without a further checkpoint |
//! | `help` | `ok`, then this list |
//!
//! Keys of `set` (and of the `config` answer):
//!
//! | key | value | meaning |
//! |---|---|---|
//! | `interval` | duration or `off` | time between checkpoint triggers |
//! | `timeout` | duration | a checkpoint not complete this long after its trigger is aborted |
//! | `min-pause` | duration | minimum time from the end of one checkpoint to the next trigger |
//! | `max-concurrent` | integer | checkpoints in flight at once |
//! | `tolerable-failures` | integer | consecutive failed checkpoints tolerated before a failover |
//! | `mode` | `exactly-once` or `at-least-once` | checkpoint mode |
//! | `unaligned` | `true` or `false` | exactly-once checkpoints are unaligned |
//! | `alignment-timeout` | duration or `off` | aligned checkpoints switch to unaligned once this old (from their trigger) |
//! | `max-aligned-bytes` | bytes or `off` | aligned checkpoints switch to unaligned when blocked inputs hold more |
//!
//! Durations are `0`, or a whole number with `ms`, `s`, `m` or `h` (`200ms`, `30s`). Byte counts are a
//! whole number, optionally with `KiB`, `MiB` or `GiB`. Booleans are `true`/`false` (also `on`/`off`,
//! `yes`/`no`, `1`/`0`). A `set` applies its keys to the settings in force and sends the result as one
//! change: a bad value or an invalid combination is refused with the reason and changes nothing. The
//! settings apply from the next checkpoint trigger. `PATH` of a savepoint is the rest of the line after
//! `to=` (spaces allowed), must be absolute, and must name a new or empty directory; without it, the
//! savepoint goes to the job's savepoint directory.

use crate::runtime::{JobControl, JobMetrics};
use cutline_core::barrier::CheckpointMode;
use cutline_core::coordinator::CheckpointConfig;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The socket's file name in a job's state directory (the CLI serves `<state>/admin.sock`).
pub const SOCKET_FILE: &str = "admin.sock";
/// The longest request line, newline included.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// The longest answer a client reads.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// A request line must arrive within this time after the connection is accepted.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Writing an answer gives up after this long (a client that stopped reading).
const ANSWER_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`request`] waits for an answer: savepoints of a large job take a while.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(600);
/// How long [`serve`] waits for the answer of a process found on the socket.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Requests served at once; more are answered `error: busy`.
pub const MAX_CONNECTIONS: usize = 8;
/// How often the accept loop looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// How long dropping the server waits for requests in progress to be answered.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest socket path (`sun_path`, including its terminating NUL).
#[cfg(target_os = "linux")]
const SUN_PATH_BYTES: usize = 108;
#[cfg(not(target_os = "linux"))]
const SUN_PATH_BYTES: usize = 104;

/// What went wrong serving or reaching the admin socket.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no running job answers on {}", socket.display())]
    NotRunning { socket: PathBuf },
    #[error("another running job already answers on {}: stop it first, or use another state directory", socket.display())]
    AlreadyServing { socket: PathBuf },
    #[error("{} exists and is not a socket: move it away, or use another state directory", path.display())]
    NotASocket { path: PathBuf },
    #[error("the socket path {} is {len} bytes long, and Unix domain sockets allow at most {max}: use a shorter path", path.display())]
    PathTooLong { path: PathBuf, len: usize, max: usize },
    #[error("admin socket {}: cannot {what}: {source}", socket.display())]
    Io {
        socket: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("no answer from {} within {} s", socket.display(), after.as_secs())]
    Timeout { socket: PathBuf, after: Duration },
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("malformed answer from {}: {reason}", socket.display())]
    BadAnswer { socket: PathBuf, reason: String },
    /// The job answered `error: <reason>`.
    #[error("{0}")]
    Refused(String),
}

// ---------------------------------------------------------------------------------------------------
// Requests and their parsing.

/// One parsed request line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Ping,
    Status,
    Config,
    Set(Vec<Setting>),
    Savepoint { to: Option<PathBuf>, stop: bool },
    Stop,
    Help,
}

/// One checkpoint setting of a `set` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting {
    Interval(Option<u64>),
    Timeout(u64),
    MinPause(u64),
    MaxConcurrent(usize),
    TolerableFailures(u32),
    Mode(CheckpointMode),
    Unaligned(bool),
    AlignmentTimeout(Option<u64>),
    MaxAlignedBytes(Option<u64>),
}

/// Every key of `set`, in the order `config` prints them.
pub const SETTING_KEYS: [&str; 9] = [
    "interval",
    "timeout",
    "min-pause",
    "max-concurrent",
    "tolerable-failures",
    "mode",
    "unaligned",
    "alignment-timeout",
    "max-aligned-bytes",
];

impl Setting {
    /// The protocol key.
    pub fn key(&self) -> &'static str {
        match self {
            Setting::Interval(_) => "interval",
            Setting::Timeout(_) => "timeout",
            Setting::MinPause(_) => "min-pause",
            Setting::MaxConcurrent(_) => "max-concurrent",
            Setting::TolerableFailures(_) => "tolerable-failures",
            Setting::Mode(_) => "mode",
            Setting::Unaligned(_) => "unaligned",
            Setting::AlignmentTimeout(_) => "alignment-timeout",
            Setting::MaxAlignedBytes(_) => "max-aligned-bytes",
        }
    }

    /// `key=value` in the protocol's syntax.
    pub fn to_protocol(&self) -> String {
        let value = match self {
            Setting::Interval(v) | Setting::AlignmentTimeout(v) => optional_duration(*v),
            Setting::Timeout(v) | Setting::MinPause(v) => format_duration_ms(*v),
            Setting::MaxConcurrent(v) => v.to_string(),
            Setting::TolerableFailures(v) => v.to_string(),
            Setting::Mode(m) => mode_name(*m).to_string(),
            Setting::Unaligned(b) => b.to_string(),
            Setting::MaxAlignedBytes(v) => v.map(|b| b.to_string()).unwrap_or_else(|| "off".into()),
        };
        format!("{}={value}", self.key())
    }

    fn apply(&self, cfg: &mut CheckpointConfig) {
        match *self {
            Setting::Interval(v) => cfg.interval_ms = v,
            Setting::Timeout(v) => cfg.timeout_ms = v,
            Setting::MinPause(v) => cfg.min_pause_ms = v,
            Setting::MaxConcurrent(v) => cfg.max_concurrent = v,
            Setting::TolerableFailures(v) => cfg.tolerable_failures = v,
            Setting::Mode(m) => cfg.mode = m,
            Setting::Unaligned(b) => cfg.unaligned = b,
            Setting::AlignmentTimeout(v) => cfg.alignment_timeout_ms = v,
            Setting::MaxAlignedBytes(v) => cfg.max_aligned_bytes = v,
        }
    }
}

/// Parse the value of one `set` key.
pub fn parse_setting(key: &str, value: &str) -> Result<Setting, String> {
    let bad = |e: String| format!("bad value {value:?} for {key}: {e}");
    let s = match key {
        "interval" => Setting::Interval(parse_optional_duration_ms(value).map_err(bad)?),
        "timeout" => Setting::Timeout(parse_duration_ms(value).map_err(bad)?),
        "min-pause" => Setting::MinPause(parse_duration_ms(value).map_err(bad)?),
        "max-concurrent" => Setting::MaxConcurrent(parse_count(value).map_err(bad)?),
        "tolerable-failures" => Setting::TolerableFailures(parse_count(value).map_err(bad)?),
        "mode" => Setting::Mode(value.parse().map_err(bad)?),
        "unaligned" => Setting::Unaligned(parse_bool(value).map_err(bad)?),
        "alignment-timeout" => Setting::AlignmentTimeout(parse_optional_duration_ms(value).map_err(bad)?),
        "max-aligned-bytes" => Setting::MaxAlignedBytes(parse_optional_bytes(value).map_err(bad)?),
        other => return Err(format!("unknown setting {other:?}: the settings are {}", SETTING_KEYS.join(", "))),
    };
    Ok(s)
}

/// Parse one request line (without or with its trailing newline).
pub fn parse_request(line: &str) -> Result<Request, String> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.contains(['\n', '\r']) {
        return Err("a request is one line".into());
    }
    let line = line.trim();
    let (cmd, rest) = match line.split_once(char::is_whitespace) {
        Some((c, r)) => (c, r.trim()),
        None => (line, ""),
    };
    let no_args = |r: Request| if rest.is_empty() { Ok(r) } else { Err(format!("{cmd} takes no arguments")) };
    match cmd {
        "" => Err("empty request: try help".into()),
        "ping" => no_args(Request::Ping),
        "status" => no_args(Request::Status),
        "config" => no_args(Request::Config),
        "stop" => no_args(Request::Stop),
        "help" => no_args(Request::Help),
        "set" => parse_set(rest).map(Request::Set),
        "savepoint" | "stop-with-savepoint" => {
            let to = if rest.is_empty() {
                None
            } else {
                let path = rest
                    .strip_prefix("to=")
                    .ok_or_else(|| format!("{cmd} takes only to=PATH (the rest of the line), not {rest:?}"))?;
                if path.is_empty() {
                    return Err("to= needs a path".into());
                }
                let path = PathBuf::from(path);
                if !path.is_absolute() {
                    return Err(format!(
                        "savepoint path {} is relative: give an absolute path (the job may run in another directory)",
                        path.display()
                    ));
                }
                Some(path)
            };
            Ok(Request::Savepoint { to, stop: cmd == "stop-with-savepoint" })
        }
        other => Err(format!(
            "unknown request {other:?}: use ping, status, config, set, savepoint, stop-with-savepoint, stop or help"
        )),
    }
}

fn parse_set(args: &str) -> Result<Vec<Setting>, String> {
    if args.is_empty() {
        return Err(format!("set needs at least one key=value; the keys are {}", SETTING_KEYS.join(", ")));
    }
    let mut out: Vec<Setting> = Vec::new();
    for tok in args.split_whitespace() {
        let (k, v) = tok.split_once('=').ok_or_else(|| format!("expected key=value, got {tok:?}"))?;
        let s = parse_setting(k, v)?;
        if out.iter().any(|o| o.key() == s.key()) {
            return Err(format!("{k} is given twice"));
        }
        out.push(s);
    }
    Ok(out)
}

/// The settings in force with `settings` applied, if they are valid together.
pub fn apply_settings(current: &CheckpointConfig, settings: &[Setting]) -> Result<CheckpointConfig, String> {
    let mut cfg = current.clone();
    for s in settings {
        s.apply(&mut cfg);
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Every setting as `key=value`, separated by spaces, in the syntax `set` takes.
pub fn format_config(cfg: &CheckpointConfig) -> String {
    let all = [
        Setting::Interval(cfg.interval_ms),
        Setting::Timeout(cfg.timeout_ms),
        Setting::MinPause(cfg.min_pause_ms),
        Setting::MaxConcurrent(cfg.max_concurrent),
        Setting::TolerableFailures(cfg.tolerable_failures),
        Setting::Mode(cfg.mode),
        Setting::Unaligned(cfg.unaligned),
        Setting::AlignmentTimeout(cfg.alignment_timeout_ms),
        Setting::MaxAlignedBytes(cfg.max_aligned_bytes),
    ];
    all.iter().map(Setting::to_protocol).collect::<Vec<_>>().join(" ")
}

/// `exactly-once` or `at-least-once` (what `CheckpointMode::from_str` reads).
pub fn mode_name(m: CheckpointMode) -> &'static str {
    match m {
        CheckpointMode::ExactlyOnce => "exactly-once",
        CheckpointMode::AtLeastOnce => "at-least-once",
    }
}

/// `0`, or a whole number with `ms`, `s`, `m` or `h`, in milliseconds (at most a year).
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    if s == "0" {
        return Ok(0);
    }
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000)
    } else {
        return Err("use a whole number with ms, s, m or h (e.g. 200ms, 30s)".into());
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return Err("use a whole number with ms, s, m or h (e.g. 200ms, 30s)".into());
    }
    let n: u64 = num.parse().map_err(|_| "too large".to_string())?;
    match n.checked_mul(mult) {
        Some(ms) if ms <= 365 * 86_400_000 => Ok(ms),
        _ => Err("at most a year".into()),
    }
}

/// A duration, or `off` (None).
pub fn parse_optional_duration_ms(s: &str) -> Result<Option<u64>, String> {
    if s == "off" {
        Ok(None)
    } else {
        parse_duration_ms(s).map(Some).map_err(|e| format!("{e}, or off"))
    }
}

/// Milliseconds in the largest unit that divides them: `200ms`, `30s`, `2m`, `1h`.
#[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` is newer than the workspace's rust-version
pub fn format_duration_ms(ms: u64) -> String {
    if ms == 0 {
        "0ms".into()
    } else if ms % 3_600_000 == 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn optional_duration(v: Option<u64>) -> String {
    v.map(format_duration_ms).unwrap_or_else(|| "off".into())
}

fn parse_count<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("use a whole number".into());
    }
    s.parse().map_err(|_| "too large".to_string())
}

/// `true`/`false`, `on`/`off`, `yes`/`no`, `1`/`0`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err("use true or false".into()),
    }
}

/// A byte count (`1048576`, `64KiB`, `1MiB`, `2GiB`), or `off` (None).
pub fn parse_optional_bytes(s: &str) -> Result<Option<u64>, String> {
    if s == "off" {
        return Ok(None);
    }
    let (num, mult) = [("KiB", 1u64 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("B", 1)]
        .iter()
        .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n, *m)))
        .unwrap_or((s, 1));
    let n: u64 =
        parse_count(num).map_err(|_| "use a whole number of bytes, optionally with KiB, MiB or GiB, or off")?;
    n.checked_mul(mult).map(Some).ok_or_else(|| "too large".to_string())
}

// ---------------------------------------------------------------------------------------------------
// Answers.

const HELP: &str = "requests:
  ping
  status
  config
  set key=value ...   keys: interval timeout min-pause max-concurrent tolerable-failures mode unaligned alignment-timeout max-aligned-bytes
  savepoint [to=ABSOLUTE-PATH]
  stop-with-savepoint [to=ABSOLUTE-PATH]
  stop
  help";

/// Carry out one request line through `control` and return the whole answer.
fn answer(control: &JobControl, line: &str) -> String {
    let request = match parse_request(line) {
        Ok(r) => r,
        Err(e) => return format!("error: {e}"),
    };
    let result: Result<String, String> = match request {
        Request::Ping => control.checkpoint_config().map(|_| format!("ok cutline pid={}", std::process::id())),
        Request::Help => Ok(format!("ok\n{HELP}")),
        Request::Config => control.checkpoint_config().map(|c| format!("ok {}", format_config(&c))),
        Request::Status => control.metrics().map(|m| format!("ok\n{}", format_status(&m))),
        Request::Set(settings) => {
            // Applied on the job's coordinator thread to the settings in force: only the given keys
            // change, whoever else changes others meanwhile.
            control
                .update_checkpoint_config(move |cfg| {
                    *cfg = apply_settings(cfg, &settings)?;
                    Ok(())
                })
                .map(|c| format!("ok {}", format_config(&c)))
        }
        Request::Savepoint { to, stop } => {
            let r = if stop { control.stop_with_savepoint(to) } else { control.savepoint(to) };
            r.map(|sp| format!("ok checkpoint={} bytes={} path={}", sp.checkpoint.0, sp.bytes, sp.path.display()))
        }
        Request::Stop => {
            control.stop();
            Ok("ok stopping".into())
        }
    };
    result.unwrap_or_else(|e| format!("error: {e}"))
}

/// The readable report of `status` (without its `ok` line).
pub fn format_status(m: &JobMetrics) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let pending = if m.pending.is_empty() {
        "none".to_string()
    } else {
        m.pending.iter().map(|c| format!("chk-{}", c.0)).collect::<Vec<_>>().join(", ")
    };
    if m.tasks.is_empty() {
        // Between generations (restarting after a failure) the job reports only its settings.
        let _ = writeln!(s, "job: restarting after a failure; figures are back once it runs again");
    } else {
        let _ = writeln!(
            s,
            "job: {}, {} checkpoints completed, {} failed, in flight: {pending}",
            m.generation, m.checkpoints_completed, m.checkpoints_failed
        );
    }
    let _ = writeln!(s, "settings: {}", format_config(&m.config));
    if !m.tasks.is_empty() {
        let _ = writeln!(s, "tasks (since {} started):", m.generation);
        let w = m.tasks.iter().map(|t| t.name.len()).max().unwrap_or(0);
        for t in &m.tasks {
            let _ =
                writeln!(s, "  {:<w$}  backpressured {:>8} ms  idle {:>8} ms", t.name, t.backpressured_ms, t.idle_ms);
        }
        let channels: Vec<_> = m.tasks.iter().flat_map(|t| &t.inputs).collect();
        if !channels.is_empty() {
            let _ = writeln!(s, "channels (batches queued/capacity, most ever queued):");
            let w = channels.iter().map(|c| c.name.len()).max().unwrap_or(0);
            for c in channels {
                let _ = writeln!(
                    s,
                    "  {:<w$}  {:>4}/{:<4} high {}",
                    c.name, c.queued_batches, c.capacity_batches, c.high_water_batches
                );
            }
        }
    }
    if !m.failed.is_empty() {
        let _ = writeln!(s, "recent failed checkpoints (oldest first):");
        for f in &m.failed {
            let by = if f.held_up_by.is_empty() {
                String::new()
            } else {
                format!(" (held up by {})", f.held_up_by.join(", "))
            };
            let _ = writeln!(s, "  failed chk-{}: {}{by}", f.checkpoint.0, f.reason);
        }
    }
    if m.checkpoints.is_empty() {
        let _ = write!(s, "checkpoints: none completed yet");
    } else {
        let _ = write!(s, "recent checkpoints (oldest first):");
        let total = m.tasks.len();
        for c in &m.checkpoints {
            let kind = if c.is_savepoint {
                "  savepoint"
            } else if c.is_final {
                "  final"
            } else {
                ""
            };
            let _ = write!(
                s,
                "\n  chk-{:<6} {:>6} ms  {:>10} bytes  {:>10} in-flight bytes  alignment {:>5} ms  unaligned {}/{} tasks ({} switched){kind}",
                c.checkpoint.0, c.duration_ms, c.bytes, c.channel_state_bytes, c.alignment_ms, c.unaligned_tasks, total, c.switched_tasks
            );
        }
    }
    s
}

// ---------------------------------------------------------------------------------------------------
// Server.

/// A running admin endpoint. Dropping it stops accepting, waits (boundedly) for requests in progress
/// to be answered, and removes the socket file if it is still the one it bound.
pub struct AdminServer {
    socket: PathBuf,
    /// (device, inode) of the socket file this server bound.
    file_id: Option<(u64, u64)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AdminServer {
    /// Where the server listens.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Another job that started after this one ended may have replaced the file: leave that one.
        if self.file_id.is_some() && file_id(&self.socket) == self.file_id {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

fn check_path(socket: &Path) -> Result<(), AdminError> {
    let len = socket.as_os_str().len();
    if len >= SUN_PATH_BYTES {
        return Err(AdminError::PathTooLong { path: socket.to_path_buf(), len, max: SUN_PATH_BYTES - 1 });
    }
    Ok(())
}

/// Serve `control` on `socket` from a background thread. Refuses when another live job answers on
/// that socket; replaces a stale socket file (left by a process that died, or by a job that has ended);
/// never removes anything that is not a socket.
pub fn serve(control: JobControl, socket: &Path) -> Result<AdminServer, AdminError> {
    check_path(socket)?;
    let io = |what: &'static str| move |source| AdminError::Io { socket: socket.to_path_buf(), what, source };
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => {
            if probe_live(socket) {
                return Err(AdminError::AlreadyServing { socket: socket.to_path_buf() });
            }
            match std::fs::remove_file(socket) {
                Err(e) if e.kind() != ErrorKind::NotFound => return Err(io("remove the stale socket file")(e)),
                _ => {}
            }
        }
        Ok(_) => return Err(AdminError::NotASocket { path: socket.to_path_buf() }),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io("inspect the socket path")(e)),
    }
    let listener = match UnixListener::bind(socket) {
        Ok(l) => l,
        // Someone bound it between the check and here.
        Err(e) if e.kind() == ErrorKind::AddrInUse => {
            return Err(AdminError::AlreadyServing { socket: socket.to_path_buf() })
        }
        Err(e) => return Err(io("bind")(e)),
    };
    let bound = file_id(socket);
    listener.set_nonblocking(true).map_err(io("make the listener non-blocking"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("cutline-admin".into())
        .spawn(move || accept_loop(listener, control, stop2))
        .map_err(io("start the admin thread"))?;
    Ok(AdminServer { socket: socket.to_path_buf(), file_id: bound, stop, thread: Some(thread) })
}

/// Does a live job answer on `socket`? Only a refused connection, a missing file, or a server saying
/// its job has ended count as "no": anything else that accepts a connection is left alone.
fn probe_live(socket: &Path) -> bool {
    match request_with_timeout(socket, "ping", PROBE_TIMEOUT) {
        Ok(a) => a.starts_with("ok"),
        Err(AdminError::NotRunning { .. }) => false,
        Err(_) => true,
    }
}

fn accept_loop(listener: UnixListener, control: JobControl, stop: Arc<AtomicBool>) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                handlers.retain(|h| !h.is_finished());
                if handlers.len() >= MAX_CONNECTIONS {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
                    let _ = (&stream).write_all(b"error: busy: too many admin requests in progress; try again\n");
                    continue;
                }
                let control = control.clone();
                match std::thread::Builder::new()
                    .name("cutline-admin-req".into())
                    .spawn(move || handle_connection(stream, &control))
                {
                    Ok(h) => handlers.push(h),
                    Err(_) => std::thread::sleep(ACCEPT_POLL), // the stream is dropped: the client sees EOF
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            // Out of descriptors and the like: wait and carry on.
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
    drop(listener);
    // Requests in progress end once the job answers them (or has ended); give them a bounded time.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while handlers.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in handlers.into_iter().filter(|h| h.is_finished()) {
        let _ = h.join();
    }
}

fn handle_connection(mut stream: UnixStream, control: &JobControl) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(ANSWER_WRITE_TIMEOUT));
    let mut text = match read_request(&mut stream) {
        Ok(line) => answer(control, &line),
        Err(e) => format!("error: {e}"),
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let _ = stream.write_all(text.as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Read one request line: up to the first newline (or the end of the stream), at most
/// [`MAX_REQUEST_BYTES`], within [`REQUEST_READ_TIMEOUT`] in total.
fn read_request(stream: &mut UnixStream) -> Result<String, String> {
    let deadline = Instant::now() + REQUEST_READ_TIMEOUT;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no complete request line within {} s", REQUEST_READ_TIMEOUT.as_secs()));
        }
        let _ = stream.set_read_timeout(Some(left));
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(format!("no complete request line within {} s", REQUEST_READ_TIMEOUT.as_secs()))
            }
            Err(e) => return Err(format!("reading the request: {e}")),
        };
        let end = chunk[..n].iter().position(|b| *b == b'\n');
        buf.extend_from_slice(&chunk[..end.map(|p| p + 1).unwrap_or(n)]);
        if buf.len() > MAX_REQUEST_BYTES {
            return Err(format!("request longer than {MAX_REQUEST_BYTES} bytes"));
        }
        if end.is_some() || n == 0 {
            break;
        }
    }
    if buf.is_empty() {
        return Err("empty request: try help".into());
    }
    String::from_utf8(buf).map_err(|_| "the request is not UTF-8".to_string())
}

// ---------------------------------------------------------------------------------------------------
// Client.

/// Send one request line to the job serving `socket` and return its whole answer (starting with `ok`
/// or `error:`), waiting at most [`DEFAULT_ANSWER_TIMEOUT`].
pub fn request(socket: &Path, line: &str) -> Result<String, AdminError> {
    request_with_timeout(socket, line, DEFAULT_ANSWER_TIMEOUT)
}

/// [`request`], turning an `error: <reason>` answer into [`AdminError::Refused`] and returning what
/// follows `ok` otherwise (without the `ok` and the separator after it).
pub fn request_ok(socket: &Path, line: &str) -> Result<String, AdminError> {
    let a = request(socket, line)?;
    if let Some(reason) = a.strip_prefix("error:") {
        return Err(AdminError::Refused(reason.trim().to_string()));
    }
    match a.strip_prefix("ok") {
        Some(rest) if rest.is_empty() || rest.starts_with([' ', '\n']) => {
            Ok(rest.strip_prefix([' ', '\n']).unwrap_or(rest).trim_end().to_string())
        }
        _ => Err(AdminError::BadAnswer {
            socket: socket.to_path_buf(),
            reason: format!("it starts with neither ok nor error: {:?}", a.lines().next().unwrap_or("")),
        }),
    }
}

/// [`request`] with another answer timeout.
pub fn request_with_timeout(socket: &Path, line: &str, timeout: Duration) -> Result<String, AdminError> {
    check_path(socket)?;
    if line.contains(['\n', '\r']) {
        return Err(AdminError::BadRequest("a request is one line".into()));
    }
    if line.len() + 1 > MAX_REQUEST_BYTES {
        return Err(AdminError::BadRequest(format!("request longer than {MAX_REQUEST_BYTES} bytes")));
    }
    let io = |what: &'static str| move |source| AdminError::Io { socket: socket.to_path_buf(), what, source };
    let mut stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
            return Err(AdminError::NotRunning { socket: socket.to_path_buf() })
        }
        Err(e) => return Err(io("connect")(e)),
    };
    let timed_out = |e: &std::io::Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
    stream.set_write_timeout(Some(REQUEST_READ_TIMEOUT)).map_err(io("set a timeout"))?;
    stream.set_read_timeout(Some(timeout)).map_err(io("set a timeout"))?;
    let mut msg = line.as_bytes().to_vec();
    msg.push(b'\n');
    if let Err(e) = stream.write_all(&msg) {
        // A server that answered without reading (busy) closes early: read what it said.
        if timed_out(&e) {
            return Err(AdminError::Timeout { socket: socket.to_path_buf(), after: REQUEST_READ_TIMEOUT });
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    match (&mut stream).take(MAX_ANSWER_BYTES as u64).read_to_end(&mut answer) {
        Ok(_) => {}
        Err(e) if timed_out(&e) => return Err(AdminError::Timeout { socket: socket.to_path_buf(), after: timeout }),
        Err(e) if e.kind() == ErrorKind::ConnectionReset && !answer.is_empty() => {}
        Err(e) => return Err(io("read the answer")(e)),
    }
    if answer.is_empty() {
        return Err(AdminError::BadAnswer {
            socket: socket.to_path_buf(),
            reason: "the connection closed without an answer (the job may have ended)".into(),
        });
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(line: &str) -> Result<Vec<Setting>, String> {
        match parse_request(line)? {
            Request::Set(s) => Ok(s),
            other => panic!("{line:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn simple_requests_parse_with_or_without_newline() {
        assert_eq!(parse_request("status\n"), Ok(Request::Status));
        assert_eq!(parse_request("  config\r\n"), Ok(Request::Config));
        assert_eq!(parse_request("ping"), Ok(Request::Ping));
        assert_eq!(parse_request("stop"), Ok(Request::Stop));
        assert_eq!(parse_request("help"), Ok(Request::Help));
        assert!(parse_request("status now").unwrap_err().contains("takes no arguments"));
        assert!(parse_request("").unwrap_err().contains("empty"));
        assert!(parse_request("launch").unwrap_err().contains("unknown request"));
        assert!(parse_request("status\nstop").unwrap_err().contains("one line"));
    }

    #[test]
    fn set_parses_every_key() {
        let s = set("set interval=200ms timeout=30s alignment-timeout=off unaligned=true mode=exactly-once max-concurrent=2 min-pause=0 tolerable-failures=3 max-aligned-bytes=1048576").unwrap();
        assert_eq!(
            s,
            vec![
                Setting::Interval(Some(200)),
                Setting::Timeout(30_000),
                Setting::AlignmentTimeout(None),
                Setting::Unaligned(true),
                Setting::Mode(CheckpointMode::ExactlyOnce),
                Setting::MaxConcurrent(2),
                Setting::MinPause(0),
                Setting::TolerableFailures(3),
                Setting::MaxAlignedBytes(Some(1 << 20)),
            ]
        );
        assert_eq!(set("set interval=off max-aligned-bytes=64KiB").unwrap()[1], Setting::MaxAlignedBytes(Some(65536)));
        assert_eq!(set("set mode=at-least-once").unwrap(), vec![Setting::Mode(CheckpointMode::AtLeastOnce)]);
        assert_eq!(set("set interval=2m").unwrap(), vec![Setting::Interval(Some(120_000))]);
    }

    #[test]
    fn bad_set_requests_say_what_is_wrong() {
        let e = set("set").unwrap_err();
        assert!(e.contains("at least one") && e.contains("max-aligned-bytes"), "{e}");
        let e = set("set interval=5parsecs").unwrap_err();
        assert!(e.contains("5parsecs") && e.contains("interval"), "{e}");
        assert!(set("set speed=11").unwrap_err().contains("unknown setting \"speed\""));
        assert!(set("set interval").unwrap_err().contains("key=value"));
        assert!(set("set interval=1s interval=2s").unwrap_err().contains("twice"));
        assert!(set("set unaligned=maybe").unwrap_err().contains("true or false"));
        assert!(set("set mode=twice").unwrap_err().contains("exactly-once or at-least-once"));
        assert!(set("set max-concurrent=-1").unwrap_err().contains("whole number"));
        assert!(set("set max-concurrent=99999999999999999999999").unwrap_err().contains("too large"));
        assert!(set("set timeout=off").is_err(), "timeout cannot be off");
        assert!(set("set interval=1.5s").is_err());
        assert!(set("set interval=ms").is_err());
        assert!(set("set interval=400d").is_err());
        assert!(set("set max-aligned-bytes=1TiB").is_err());
    }

    #[test]
    fn savepoint_requests_take_an_absolute_path_with_spaces() {
        assert_eq!(parse_request("savepoint"), Ok(Request::Savepoint { to: None, stop: false }));
        assert_eq!(
            parse_request("stop-with-savepoint to=/tmp/my savepoints/sp 1\n"),
            Ok(Request::Savepoint { to: Some("/tmp/my savepoints/sp 1".into()), stop: true })
        );
        assert!(parse_request("savepoint to=relative/dir").unwrap_err().contains("absolute"));
        assert!(parse_request("savepoint to=").unwrap_err().contains("needs a path"));
        assert!(parse_request("savepoint /tmp/x").unwrap_err().contains("to=PATH"));
    }

    #[test]
    fn config_round_trips_through_set() {
        let cfg = CheckpointConfig {
            interval_ms: Some(1500),
            timeout_ms: 120_000,
            min_pause_ms: 0,
            max_concurrent: 2,
            tolerable_failures: 7,
            mode: CheckpointMode::ExactlyOnce,
            unaligned: true,
            alignment_timeout_ms: Some(3_600_000),
            max_aligned_bytes: Some(12345),
        };
        let line = format_config(&cfg);
        assert_eq!(
            line,
            "interval=1500ms timeout=2m min-pause=0ms max-concurrent=2 tolerable-failures=7 mode=exactly-once unaligned=true alignment-timeout=1h max-aligned-bytes=12345"
        );
        let back = apply_settings(&CheckpointConfig::default(), &set(&format!("set {line}")).unwrap()).unwrap();
        assert_eq!(format_config(&back), line);
        let keys: Vec<&str> = line.split(' ').map(|kv| kv.split_once('=').unwrap().0).collect();
        assert_eq!(keys, SETTING_KEYS);
    }

    #[test]
    fn set_changes_only_the_named_keys_and_refuses_invalid_combinations() {
        let current = CheckpointConfig { interval_ms: Some(200), ..Default::default() };
        let new = apply_settings(&current, &set("set unaligned=true").unwrap()).unwrap();
        assert!(new.unaligned);
        assert_eq!(new.interval_ms, Some(200));
        assert_eq!(new.timeout_ms, current.timeout_ms);
        let e = apply_settings(&new, &set("set mode=at-least-once").unwrap()).unwrap_err();
        assert!(e.contains("exactly-once"), "{e}");
        let e = apply_settings(&current, &set("set max-concurrent=0").unwrap()).unwrap_err();
        assert!(e.contains("at least 1"), "{e}");
        let e = apply_settings(&current, &set("set interval=0").unwrap()).unwrap_err();
        assert!(e.contains("positive"), "{e}");
    }

    #[test]
    fn durations_and_bytes_parse_and_format() {
        assert_eq!(parse_duration_ms("0"), Ok(0));
        assert_eq!(parse_duration_ms("0ms"), Ok(0));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("3s"), Ok(3000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert!(parse_duration_ms("+3s").is_err());
        assert!(parse_duration_ms("3 s").is_err());
        assert_eq!(parse_optional_duration_ms("off"), Ok(None));
        for ms in [0, 1, 999, 1000, 61_000, 120_000, 7_200_000] {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Ok(ms));
        }
        assert_eq!(parse_optional_bytes("off"), Ok(None));
        assert_eq!(parse_optional_bytes("0"), Ok(Some(0)));
        assert_eq!(parse_optional_bytes("2MiB"), Ok(Some(2 << 20)));
        assert_eq!(parse_optional_bytes("10B"), Ok(Some(10)));
        assert!(parse_optional_bytes("MiB").is_err());
        assert!(parse_optional_bytes("20000000000GiB").is_err());
    }

    #[test]
    fn status_reports_settings_tasks_channels_and_checkpoints() {
        use crate::runtime::{CheckpointSummary, TaskReport};
        use crate::ChannelStats;
        use cutline_core::{CheckpointId, Generation};
        let m = JobMetrics {
            generation: Generation(2),
            config: CheckpointConfig { unaligned: true, ..Default::default() },
            tasks: vec![
                TaskReport { name: "lines#0".into(), backpressured_ms: 5, idle_ms: 7, inputs: vec![] },
                TaskReport {
                    name: "counts#0".into(),
                    backpressured_ms: 0,
                    idle_ms: 3,
                    inputs: vec![ChannelStats {
                        name: "lines#0->counts#0".into(),
                        queued_batches: 3,
                        capacity_batches: 16,
                        high_water_batches: 16,
                    }],
                },
            ],
            checkpoints: vec![
                CheckpointSummary {
                    checkpoint: CheckpointId(7),
                    duration_ms: 12,
                    bytes: 900,
                    channel_state_bytes: 40,
                    unaligned_tasks: 2,
                    switched_tasks: 1,
                    ..Default::default()
                },
                CheckpointSummary { checkpoint: CheckpointId(8), is_savepoint: true, ..Default::default() },
            ],
            checkpoints_completed: 8,
            checkpoints_failed: 1,
            failed: vec![crate::FailedCheckpoint {
                checkpoint: CheckpointId(6),
                reason: "expired after 60000 ms".into(),
                held_up_by: vec!["counts#0".into()],
            }],
            pending: vec![CheckpointId(9)],
        };
        let s = format_status(&m);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "job: gen-2, 8 checkpoints completed, 1 failed, in flight: chk-9");
        assert_eq!(lines[1], format!("settings: {}", format_config(&m.config)));
        assert!(s.contains("lines#0   backpressured        5 ms  idle        7 ms"), "{s}");
        assert!(s.contains("lines#0->counts#0     3/16   high 16"), "{s}");
        let chk: Vec<&str> = lines.iter().copied().filter(|l| l.trim_start().starts_with("chk-")).collect();
        assert_eq!(chk.len(), 2, "{s}");
        assert!(s.contains("  failed chk-6: expired after 60000 ms (held up by counts#0)\n"), "{s}");
        assert!(chk[0].contains("12 ms") && chk[0].contains("900 bytes") && chk[0].contains("40 in-flight bytes"));
        assert!(chk[0].contains("unaligned 2/2 tasks (1 switched)") && !chk[0].ends_with("savepoint"), "{s}");
        assert!(chk[1].ends_with("savepoint"), "{s}");
        let restarting = format_status(&JobMetrics { config: m.config.clone(), ..Default::default() });
        assert!(restarting.starts_with("job: restarting") && restarting.contains("none completed"), "{restarting}");
    }

    #[test]
    fn ok_and_error_answers_are_told_apart() {
        // request_ok's answer handling, without a socket: an answer is parsed by prefix.
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("a.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            for answer in ["ok checkpoint=3 bytes=10 path=/x y\n", "error: no savepoint now: busy\n", "hello\n"] {
                let (mut s, _) = listener.accept().unwrap();
                let _ = read_request(&mut s).unwrap();
                s.write_all(answer.as_bytes()).unwrap();
            }
        });
        assert_eq!(request_ok(&sock, "savepoint").unwrap(), "checkpoint=3 bytes=10 path=/x y");
        match request_ok(&sock, "savepoint") {
            Err(AdminError::Refused(r)) => assert_eq!(r, "no savepoint now: busy"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(request_ok(&sock, "status"), Err(AdminError::BadAnswer { .. })));
        server.join().unwrap();
    }

    #[test]
    fn a_missing_socket_means_no_running_job_and_a_long_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("admin.sock");
        assert!(matches!(request(&sock, "status"), Err(AdminError::NotRunning { .. })));
        let long = dir.path().join("x".repeat(200)).join("admin.sock");
        let e = request(&long, "status").unwrap_err();
        assert!(matches!(e, AdminError::PathTooLong { .. }), "{e}");
        assert!(e.to_string().contains("shorter path"));
    }

    #[test]
    fn a_request_line_is_limited_and_must_arrive() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("r.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let s2 = sock.clone();
        let client = std::thread::spawn(move || {
            let mut c = UnixStream::connect(&s2).unwrap();
            c.write_all(&vec![b'x'; MAX_REQUEST_BYTES + 10]).unwrap();
            let silent = UnixStream::connect(&s2).unwrap();
            std::thread::sleep(REQUEST_READ_TIMEOUT + Duration::from_millis(500));
            drop(silent);
        });
        let (mut a, _) = listener.accept().unwrap();
        assert!(read_request(&mut a).unwrap_err().contains("longer than"));
        let (mut b, _) = listener.accept().unwrap();
        let t = Instant::now();
        assert!(read_request(&mut b).unwrap_err().contains("no complete request line"));
        assert!(t.elapsed() < REQUEST_READ_TIMEOUT + Duration::from_secs(1));
        client.join().unwrap();
    }
}
