//! Connections of the PostgreSQL sink: connecting with a bounded wait for a database that is down,
//! and telling a lost connection from an error of the statement.

use crate::error::ConnectorError;
use postgres::{Client, Config, NoTls};
use std::time::{Duration, Instant};

/// First pause between connection attempts; it doubles up to [`MAX_RECONNECT_PAUSE_MS`].
const FIRST_RECONNECT_PAUSE_MS: u64 = 50;
/// Longest pause between connection attempts.
const MAX_RECONNECT_PAUSE_MS: u64 = 1_000;
/// Time limit of one connection attempt.
const CONNECT_TIMEOUT_MS: u64 = 5_000;

/// Parse a connection string (`postgres://user@host:port/db` or `host=... user=...`).
pub(crate) fn config(url: &str) -> Result<Config, ConnectorError> {
    let mut c: Config = url
        .parse()
        .map_err(|e| ConnectorError::permanent(format!("PostgreSQL sink: bad connection string {url:?}: {e}")))?;
    c.connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS));
    if c.get_application_name().is_none() {
        c.application_name("cutline");
    }
    Ok(c)
}

/// Connect, retrying with backoff for up to `wait_ms` while the server cannot be reached: a database
/// that is down stalls the sink (and so the checkpoints) instead of failing the task at once.
/// Refusals that waiting cannot fix (authentication, a missing database) fail at once.
pub(crate) fn connect(config: &Config, wait_ms: u64) -> Result<Client, ConnectorError> {
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut pause = FIRST_RECONNECT_PAUSE_MS;
    loop {
        match config.connect(NoTls) {
            Ok(client) => return Ok(client),
            Err(e) if e.code().is_some() && !starting_or_full(&e) => {
                // The server answered and refused (bad password, no such database): say so, and
                // let the task fail.
                return Err(ConnectorError::transient(format!("PostgreSQL refused the connection: {}", show(&e))));
            }
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(ConnectorError::transient(format!(
                        "PostgreSQL unreachable for {wait_ms} ms (the sink waits this long: \
                         PostgresSinkConfig::unavailable_wait_ms): {}",
                        show(&e)
                    )));
                }
                tracing::warn!(error = %show(&e), "PostgreSQL unreachable, retrying");
                std::thread::sleep(Duration::from_millis(pause));
                pause = (pause * 2).min(MAX_RECONNECT_PAUSE_MS);
            }
        }
    }
}

/// Does the server's answer say the statement can never succeed as it is: a data exception (22), an
/// integrity constraint violation (23), a syntax error or access rule violation (42: no such column,
/// no unique index for `ON CONFLICT`, permission denied)? Connection errors and everything else (a
/// deadlock, a serialization failure, the server shutting down) are worth a retry after a restore.
pub(crate) fn is_permanent(e: &postgres::Error) -> bool {
    e.code().is_some_and(|c| matches!(&c.code()[..2], "22" | "23" | "42"))
}

/// The server answered but cannot take the connection now: it is starting up or shutting down
/// (SQLSTATE class 57) or out of connections or memory (class 53). Worth waiting for.
fn starting_or_full(e: &postgres::Error) -> bool {
    e.code().is_some_and(|c| matches!(&c.code()[..2], "57" | "53"))
}

/// An error with its cause chain and, from the server, its SQLSTATE.
pub(crate) fn show(e: &postgres::Error) -> String {
    let mut s = e.to_string();
    if let Some(db) = e.as_db_error() {
        s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if e.as_db_error().is_none() {
            s.push_str(&format!(": {c}"));
        }
        cause = c.source();
    }
    s
}
