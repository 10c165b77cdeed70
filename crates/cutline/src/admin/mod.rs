//! The local admin endpoint of a running job: a Unix domain socket that answers one-line text requests
//! (status, checkpoint settings, run-time tuning, savepoints, stop), and the client that sends them.
//!
//! It owns the socket file (binding, refusing when another live job answers there, replacing a stale
//! file, removing it when the server is dropped), the request/answer protocol and its parsing, and the
//! formatting of settings and status. It does not own any job behaviour: every request is carried out
//! through [`JobControl`](super::JobControl), which decides whether settings are valid (`CheckpointConfig::validate`),
//! takes and exports savepoints and stops the job.
//!
//! # Who may connect
//!
//! Only the job's own user (and root). The socket file is made owner-only (mode 0600) right after it
//! is bound, and every accepted connection's peer is checked (`SO_PEERCRED` on Linux, `getpeereid`
//! elsewhere): a process of another user is answered `error: ...` and dropped, also in the instant
//! between the bind and the `chmod`. Anyone who may connect may stop the job and write savepoints
//! wherever the job's user may write.
//!
//! # Bounds
//!
//! A connection waits in the accept loop, not in a handler, until its request line is complete: it
//! must send its first byte within [`FIRST_BYTE_TIMEOUT`] and the whole line within
//! [`REQUEST_READ_TIMEOUT`]; at most [`MAX_WAITING_CONNECTIONS`] wait at once, and a new one pushes
//! out the longest waiting. Idle connections therefore never hold the [`MAX_CONNECTIONS`] handlers,
//! which only complete requests get. Requests other than savepoints are answered within
//! [`CONTROL_ANSWER_TIMEOUT`](super::runtime::CONTROL_ANSWER_TIMEOUT) (`error: ...` if the job's
//! coordinator does not answer), and a client waits [`QUICK_ANSWER_TIMEOUT`] for them, so `cutline
//! status` against a hung or stopped (`SIGSTOP`) job fails in seconds; a savepoint request waits up to
//! [`DEFAULT_ANSWER_TIMEOUT`].
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
//! | `status-json` | `ok`, then the job's [`JobMetrics`](crate::runtime::JobMetrics) as one JSON object on one line |
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
//! | `max-concurrent` | integer, 1 to 16 | checkpoints in flight at once ([`MAX_CONCURRENT_CHECKPOINTS`](cutline_core::coordinator::MAX_CONCURRENT_CHECKPOINTS)) |
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

mod client;
pub mod http;
pub mod otlp;
mod peer;
pub mod prometheus;
mod protocol;
mod server;
mod status;
#[cfg(test)]
mod tests;
mod trace_text;
pub mod units;
pub mod web;

pub use client::{answer_timeout, request, request_ok, request_with_timeout};
pub use protocol::{
    apply_settings, format_config, mode_name, parse_bool, parse_request, parse_set, parse_setting, Request, Setting,
    SETTING_KEYS,
};
pub use server::{serve, AdminServer};
pub use status::format_status;
pub use trace_text::{format_trace, trace_json};
pub use units::{format_duration_ms, parse_bytes, parse_duration_ms, parse_optional_bytes, parse_optional_duration_ms};
pub use web::{read_record, serve_job_http, serve_worker_http, WebOptions};

use std::path::PathBuf;
use std::time::Duration;

/// The socket's file name in a job's state directory (the CLI serves `<state>/admin.sock`).
pub const SOCKET_FILE: &str = "admin.sock";
/// The longest request line, newline included.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// The longest answer a client reads.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// A request line must arrive within this time after the connection is accepted.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The first byte of a request must arrive within this time after the connection is accepted.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections whose request line is not complete yet, at most; a new one pushes out the oldest.
pub const MAX_WAITING_CONNECTIONS: usize = 64;
/// Writing an answer gives up after this long (a client that stopped reading).
const ANSWER_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`request`] waits for the answer to a savepoint request: savepoints of a large job take
/// a while.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(600);
/// How long [`request`] waits for the answer to any other request (the job answers within
/// [`CONTROL_ANSWER_TIMEOUT`](super::runtime::CONTROL_ANSWER_TIMEOUT), or says it could not).
pub const QUICK_ANSWER_TIMEOUT: Duration = Duration::from_secs(8);
/// How long [`serve`] waits for the answer of a process found on the socket.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Requests served at once; more are answered `error: busy`.
pub const MAX_CONNECTIONS: usize = 8;
/// How often the accept loop looks at its stop flag when no connection stirs.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// How long dropping the server waits for requests in progress to be answered.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest socket path (`sun_path`, including its terminating NUL).
#[cfg(target_os = "linux")]
const SUN_PATH_BYTES: usize = 108;
#[cfg(not(target_os = "linux"))]
const SUN_PATH_BYTES: usize = 104;

/// What went wrong serving or reaching the admin socket. Messages (Display) name the socket and say
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The client found no socket file, or nothing accepts connections on it: the job is not running
    /// (or runs with another state directory). [`serve`] treats such a file as stale and replaces it.
    #[error("no running job answers on {}", socket.display())]
    NotRunning {
        /// The socket path asked.
        socket: PathBuf,
    },
    /// [`serve`] found a live job answering on the socket (or lost a race to bind it): two jobs must
    /// not share a state directory. Stop the other job or use another directory.
    #[error("another running job already answers on {}: stop it first, or use another state directory", socket.display())]
    AlreadyServing {
        /// The socket path.
        socket: PathBuf,
    },
    /// [`serve`] found something other than a socket at the path and left it alone.
    #[error("{} exists and is not a socket: move it away, or use another state directory", path.display())]
    NotASocket {
        /// The path found occupied.
        path: PathBuf,
    },
    /// The socket path does not fit a Unix domain socket address (both [`serve`] and the client check
    /// it before touching the file). Use a shorter state directory path.
    #[error("the socket path {} is {len} bytes long, and Unix domain sockets allow at most {max}: use a shorter path", path.display())]
    PathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The longest path allowed in bytes: 107 on Linux, 103 elsewhere.
        max: usize,
    },
    /// A system call on the socket failed (binding, permissions, connecting, reading the answer).
    #[error("admin socket {}: cannot {what}: {source}", socket.display())]
    Io {
        /// The socket path.
        socket: PathBuf,
        /// What was attempted, for the message (`bind`, `connect`, `read the answer`, ...).
        what: &'static str,
        /// The error the operating system reported.
        #[source]
        source: std::io::Error,
    },
    /// The client sent its request but the answer did not come (or the request could not be written)
    /// in time: the job is hung or suspended. Nothing says whether the request was carried out;
    /// check with `status` before repeating a savepoint or a stop.
    #[error("no answer from {} within {} s: the job is hung or stopped (suspended with SIGSTOP or Ctrl-Z?); check its process, or try again", socket.display(), after.as_secs())]
    Timeout {
        /// The socket path.
        socket: PathBuf,
        /// How long the client waited.
        after: Duration,
    },
    /// The client refused to send the request: it holds a newline, or is longer than
    /// [`MAX_REQUEST_BYTES`] with its newline. Nothing was sent.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The answer was empty (the connection closed first, for example because the job ended) or, for
    /// [`request_ok`], started with neither `ok` nor `error:`.
    #[error("malformed answer from {}: {reason}", socket.display())]
    BadAnswer {
        /// The socket path.
        socket: PathBuf,
        /// What was wrong with the answer.
        reason: String,
    },
    /// The job answered `error: <reason>` (from [`request_ok`]; [`request`] returns such answers as
    /// they are). The reason says what to change.
    #[error("{0}")]
    Refused(String),
}
