//! Commands that talk to a running job through its admin socket (`tune`, `savepoint`, `status`) or read
//! its state directory (`checkpoints`).

use crate::args::TuneArgs;
use anyhow::{bail, Context, Result};
use cutline::admin::{self, AdminError};
use cutline::{CheckpointStore, LocalDirStore};
use std::path::Path;
use std::time::Instant;

/// Send `line` to the job running on `state`; its answer after `ok`.
pub(crate) fn ask(state: &Path, line: &str) -> Result<String> {
    let socket = state.join(admin::SOCKET_FILE);
    match admin::request_ok(&socket, line) {
        Ok(a) => Ok(a),
        Err(AdminError::NotRunning { .. }) => bail!(
            "no running job answers on {}: start it with cutline run wordcount ... --state {}",
            socket.display(),
            state.display()
        ),
        Err(AdminError::Refused(reason)) => bail!("the job refused: {reason}"),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn tune(state: &Path, args: &TuneArgs) -> Result<()> {
    let given = args.given();
    let line = if given.is_empty() {
        "config".to_string()
    } else {
        let mut parts = vec!["set".to_string()];
        for (flag, key, value) in given {
            // Checked here too, so a typo is named by its flag; the job checks the combination.
            let setting = admin::parse_setting(key, value).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
            parts.push(setting.to_protocol());
        }
        parts.join(" ")
    };
    let settings = ask(state, &line)?;
    println!("checkpoint settings in force:");
    for kv in settings.split_whitespace() {
        println!("  {kv}");
    }
    Ok(())
}

pub(crate) fn savepoint(state: &Path, to: Option<&Path>, stop: bool) -> Result<()> {
    let mut line = if stop { "stop-with-savepoint".to_string() } else { "savepoint".to_string() };
    if let Some(to) = to {
        let abs = std::path::absolute(to).with_context(|| format!("--to {}", to.display()))?;
        // The job exports the savepoint only after taking it (and, with --stop, after stopping its
        // sources): refuse a target it would refuse before asking.
        match std::fs::read_dir(&abs).map(|mut entries| entries.next().is_none()) {
            Ok(true) => {}
            Ok(false) => {
                bail!("--to {}: the directory exists and is not empty: choose a new directory", to.display())
            }
            Err(e) if abs.exists() => bail!("--to {}: cannot use it as the savepoint directory ({e})", to.display()),
            Err(_) => {}
        }
        match abs.to_str() {
            Some(p) if !p.contains(['\n', '\r']) => line.push_str(&format!(" to={p}")),
            _ => bail!("--to {}: the path must be valid UTF-8 without line breaks", to.display()),
        }
    }
    let answer = match ask(state, &line) {
        Ok(a) => a,
        // A stop-with-savepoint whose savepoint completed but could not be exported still stops the
        // job: say which happened.
        Err(e) if stop && wait_until_gone(state, std::time::Duration::from_secs(3)) => {
            bail!("{e:#}\nthe job has stopped: run the same `cutline run` command to resume it from its latest checkpoint")
        }
        Err(e) => return Err(e),
    };
    let (fields, path) =
        answer.split_once(" path=").with_context(|| format!("unexpected answer from the job: {answer:?}"))?;
    println!("{path}");
    let field = |k: &str| fields.split(' ').find_map(|kv| kv.strip_prefix(k)).unwrap_or("?");
    eprintln!(
        "cutline: savepoint of checkpoint {}, {} bytes; {}",
        field("checkpoint="),
        field("bytes="),
        if stop { "the job stops" } else { "the job runs on" }
    );
    // The job has its savepoint and is stopping: return once it has (its socket is gone), so that a
    // new run may start right away.
    if stop && !wait_until_gone(state, std::time::Duration::from_secs(60)) {
        eprintln!(
            "cutline: WARNING: the job still answers on {} 60 s after its savepoint",
            state.join(admin::SOCKET_FILE).display()
        );
    }
    Ok(())
}

/// Wait until no job answers on `state` (its run has ended and removed its socket), at most `limit`.
pub(crate) fn wait_until_gone(state: &Path, limit: std::time::Duration) -> bool {
    let socket = state.join(admin::SOCKET_FILE);
    let deadline = Instant::now() + limit;
    loop {
        if let Err(AdminError::NotRunning { .. }) =
            admin::request_with_timeout(&socket, "ping", std::time::Duration::from_secs(5))
        {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub(crate) fn status(state: &Path, json: bool) -> Result<()> {
    if json {
        println!("{}", ask(state, "status-json")?.trim());
    } else {
        println!("{}", ask(state, "status")?);
    }
    Ok(())
}

/// `cutline trace`: the stored epoch trace of one completed checkpoint, read from the state
/// directory (or the checkpoint store it names), as text with the slowest step marked, or as JSON.
pub(crate) fn trace(state: &Path, checkpoint_store: Option<&str>, checkpoint: &str, json: bool) -> Result<()> {
    let store: std::sync::Arc<dyn CheckpointStore> = match checkpoint_store {
        Some(url) => crate::args::open_store(url).map_err(|e| anyhow::anyhow!("--checkpoint-store {url}: {e}"))?,
        None => {
            if !state.join("job.meta").exists() && !state.join("stats").is_dir() {
                bail!("{} holds no cutline state (no job.meta, no stats/)", state.display());
            }
            std::sync::Arc::new(LocalDirStore::open_existing(state)?)
        }
    };
    let record = admin::read_record(&*store, checkpoint).map_err(|(_, why)| {
        anyhow::anyhow!("{why}; `cutline checkpoints --state {}` lists the checkpoints", state.display())
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&admin::trace_json(&record))?);
    } else {
        println!("{}", admin::format_trace(&record));
    }
    Ok(())
}

pub(crate) fn list_checkpoints(state: &Path) -> Result<()> {
    if !state.is_dir() {
        bail!("state directory {} does not exist", state.display());
    }
    if !state.join("job.meta").exists() && !state.join("checkpoints").is_dir() {
        bail!("{} holds no cutline state (no job.meta, no checkpoints/)", state.display());
    }
    let store = LocalDirStore::open_existing(state)?;
    let meta = store.read_meta()?;
    match &meta {
        Some(m) => println!("job: {}\ngeneration: {}", m.job_fingerprint, m.generation.0),
        None => println!("no job has run in {}", state.display()),
    }
    match store.finished() {
        Ok(Some(f)) => println!("finished with checkpoint {}", f.0),
        Ok(None) => {}
        Err(e) => println!("WARNING: the FINISHED marker is damaged ({e}); delete it to let the job resume"),
    }
    // bytes: what the checkpoint wrote; restore bytes: what a restore reads, with the older files
    // its incremental snapshots build on.
    println!(
        "{:>8}  {:<24}  {:>12}  {:>13}  {:>5}  {:<6}  verified",
        "id", "time (UTC)", "bytes", "restore bytes", "tasks", "final"
    );
    let mut bad = 0;
    for l in store.list_checkpoints()? {
        if !l.complete {
            continue;
        }
        match store.verify(l.id) {
            Ok(m) => println!(
                "{:>8}  {:<24}  {:>12}  {:>13}  {:>5}  {:<6}  ok",
                l.id.0,
                utc(m.created_at_unix_ms),
                m.total_size_bytes(),
                m.full_size_bytes(),
                m.tasks.len(),
                if m.is_final { "yes" } else { "no" }
            ),
            Err(e) => {
                // Retention may remove a checkpoint between the listing and the verification (a job is
                // running): that is not damage.
                let still_there = store.list_checkpoints()?.iter().any(|x| x.id == l.id && x.complete);
                if !still_there {
                    println!("{:>8}  removed by retention while listing", l.id.0);
                    continue;
                }
                bad += 1;
                println!("{:>8}  {:<24}  {:>12}  {:>13}  {:>5}  {:<6}  FAILED: {e}", l.id.0, "?", "?", "?", "?", "?");
            }
        }
    }
    if bad > 0 {
        bail!("{bad} checkpoint(s) failed verification");
    }
    Ok(())
}

/// `2026-11-29T19:45:33.123Z` from milliseconds since the Unix epoch (proleptic Gregorian, UTC).
pub(crate) fn utc(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(super::utc(1_795_980_486_035), "2026-11-29T19:28:06.035Z");
    }
}
