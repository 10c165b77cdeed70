//! The one way durations and byte sizes are written, everywhere a person types them (the admin
//! socket's `set`, every command-line flag): durations as [`humantime`] spans (`200ms`, `30s`, `2m`,
//! `1h 30m`) in whole milliseconds, sizes as [`bytesize`] values (`1048576`, `64KiB`, `1MiB`, `2GB`),
//! and `off` where a setting can be turned off.

/// The longest duration any setting takes: a year, in milliseconds.
pub const MAX_DURATION_MS: u64 = 365 * 86_400_000;

/// A duration in whole milliseconds: `0`, `250ms`, `3s`, `2m`, `1h`, `1h 30m` (humantime's syntax),
/// at most [`MAX_DURATION_MS`].
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    const SYNTAX: &str = "use a number with a unit, e.g. 200ms, 30s, 2m or 1h";
    if s == "0" {
        return Ok(0);
    }
    // humantime also reads "+3s"; a sign is refused like any other stray character.
    if !s.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(SYNTAX.into());
    }
    let d = humantime::parse_duration(s).map_err(|e| format!("{e}: {SYNTAX}"))?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err("use whole milliseconds (the finest unit of every setting is 1ms)".into());
    }
    match u64::try_from(d.as_millis()) {
        Ok(ms) if ms <= MAX_DURATION_MS => Ok(ms),
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

/// A duration as [`parse_duration_ms`] reads it back: the largest unit that divides it.
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

/// A byte count: `1048576`, `64KiB`, `1MiB`, `2GB` (bytesize's syntax; `KiB` is 1024 bytes, `kB`
/// 1000).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    const SYNTAX: &str = "use a whole number of bytes, optionally with a unit (64KiB, 1MiB, 2GB)";
    if !s.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(SYNTAX.into());
    }
    match s.parse::<bytesize::ByteSize>().map(|b| b.as_u64()) {
        // bytesize computes in floating point and saturates: u64::MAX means "did not fit".
        Ok(u64::MAX) => Err("too large".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}: {SYNTAX}")),
    }
}

/// A byte count, or `off` (None).
pub fn parse_optional_bytes(s: &str) -> Result<Option<u64>, String> {
    if s == "off" {
        Ok(None)
    } else {
        parse_bytes(s).map(Some).map_err(|e| format!("{e}, or off"))
    }
}
