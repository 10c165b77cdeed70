//! The request/answer protocol of the admin socket: parsing request lines and settings, applying them
//! to the settings in force, formatting settings, and carrying out one request through [`JobControl`].

use super::status::format_status;
use super::units::{format_duration_ms, parse_duration_ms, parse_optional_bytes, parse_optional_duration_ms};
use crate::runtime::JobControl;
use cutline_core::barrier::CheckpointMode;
use cutline_core::coordinator::CheckpointConfig;
use std::path::PathBuf;

/// One request to a job's admin socket, parsed from one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `ping`: is a job answering here?
    Ping,
    /// `status`: settings, flow control and recent checkpoints.
    Status,
    /// `status-json`: the job's metrics ([`JobMetrics`](crate::runtime::JobMetrics)) as one JSON
    /// object, for scripts.
    StatusJson,
    /// `config`: the checkpoint settings in force.
    Config,
    /// `set key=value ...`: change these settings from the next checkpoint.
    Set(Vec<Setting>),
    /// `savepoint [to=PATH]` or `stop-with-savepoint [to=PATH]`.
    Savepoint {
        /// Where to export it (default: the job's savepoint directory).
        to: Option<PathBuf>,
        /// Stop the job with it.
        stop: bool,
    },
    /// `stop`: stop without a further checkpoint.
    Stop,
    /// `help`: the list of requests.
    Help,
}

/// One checkpoint setting of a `set` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting {
    /// `interval`: milliseconds between checkpoints, or `off` (`None`).
    Interval(Option<u64>),
    /// `timeout`: milliseconds after its trigger that a checkpoint is aborted.
    Timeout(u64),
    /// `min-pause`: milliseconds from the end of one checkpoint to the next trigger.
    MinPause(u64),
    /// `max-concurrent`: checkpoints in flight at once.
    MaxConcurrent(usize),
    /// `tolerable-failures`: consecutive failed checkpoints before a failover.
    TolerableFailures(u32),
    /// `mode`: exactly-once or at-least-once.
    Mode(CheckpointMode),
    /// `unaligned`: unaligned exactly-once checkpoints.
    Unaligned(bool),
    /// `alignment-timeout`: milliseconds after the trigger that an aligned checkpoint switches, or off.
    AlignmentTimeout(Option<u64>),
    /// `max-aligned-bytes`: blocked bytes at which an aligned checkpoint switches, or off.
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
        // The range is the job's to check (CheckpointConfig::validate), with the message the CLI's
        // --max-concurrent gives.
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
        "status-json" => no_args(Request::StatusJson),
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
            "unknown request {other:?}: use ping, status, status-json, config, set, savepoint, stop-with-savepoint, stop or help"
        )),
    }
}

/// The settings of a `set` request: `key=value` tokens separated by white space, each key once.
pub fn parse_set(args: &str) -> Result<Vec<Setting>, String> {
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

// ---------------------------------------------------------------------------------------------------
// Answers.

const HELP: &str = "requests:
  ping
  status
  status-json
  config
  set key=value ...   keys: interval timeout min-pause max-concurrent tolerable-failures mode unaligned alignment-timeout max-aligned-bytes
  savepoint [to=ABSOLUTE-PATH]
  stop-with-savepoint [to=ABSOLUTE-PATH]
  stop
  help";

/// Carry out one request line through `control` and return the whole answer.
pub(crate) fn answer(control: &JobControl, line: &str) -> String {
    let request = match parse_request(line) {
        Ok(r) => r,
        Err(e) => return format!("error: {e}"),
    };
    let result: Result<String, String> = match request {
        Request::Ping => control.checkpoint_config().map(|_| format!("ok cutline pid={}", std::process::id())),
        Request::Help => Ok(format!("ok\n{HELP}")),
        Request::Config => control.checkpoint_config().map(|c| format!("ok {}", format_config(&c))),
        Request::Status => control.metrics().map(|m| format!("ok\n{}", format_status(&m))),
        Request::StatusJson => {
            control.metrics().map(|m| format!("ok\n{}", serde_json::to_string(&m).expect("metrics always serialize")))
        }
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
