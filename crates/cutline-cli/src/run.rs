//! `cutline run wordcount` (the word-count job, embedded or as the coordinator of a cluster) and
//! `cutline run nexmark` (a Nexmark query into files), with their admin socket, stopped cleanly by
//! SIGTERM or SIGINT.

use crate::args::{ms_flag, open_store, parse_interval, read_secret, NexmarkArgs, ObserveArgs, WordcountArgs};
use anyhow::{bail, Context, Result};
use cutline::admin::{self, AdminError};
use cutline::cluster::ClusterConfig;
use cutline::{CheckpointConfig, CheckpointMode, CheckpointStore, LocalDirStore, RunConfig};
use cutline_cli::jobs::{WordcountInput, WordcountOutput};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `--kill-self-at POINT:N`: a policy that sends this process SIGKILL the `N`th time a task reaches
/// fault point `POINT` (a drill aimed at one step of a protocol, e.g. `sink-commit`: after the
/// checkpoint completed, before the sink committed).
pub(crate) fn kill_self_at(spec: &str) -> Result<cutline::Faults> {
    use cutline::FaultPoint as P;
    let (point, n) = spec.split_once(':').unwrap_or((spec, "1"));
    let point = match point {
        "process-batch" => P::ProcessBatch,
        "snapshot" => P::Snapshot,
        "snapshot-write" => P::SnapshotWrite,
        "sink-prepare" => P::SinkPrepare,
        "sink-commit" => P::SinkCommit,
        "sink-commit-midway" => P::SinkCommitMidway,
        "sink-recover" => P::SinkRecover,
        other => bail!(
            "--kill-self-at {spec}: unknown point {other:?}: process-batch, snapshot, snapshot-write, sink-prepare, sink-commit, sink-commit-midway or sink-recover"
        ),
    };
    let n: u64 = n.parse().with_context(|| format!("--kill-self-at {spec}: N must be a positive integer"))?;
    if n == 0 {
        bail!("--kill-self-at {spec}: N must be a positive integer (the first time is 1)");
    }
    let seen = std::sync::atomic::AtomicU64::new(0);
    Ok(cutline::Faults::new(move |p| {
        if p == point && seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == n {
            // SAFETY: kill(2) on our own pid; nothing in this process is touched.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        false
    }))
}

/// `--output` as the job names it: a directory made absolute, or a PostgreSQL table.
pub(crate) fn absolute_output(output: &Path) -> Result<WordcountOutput> {
    let text = output.to_str().unwrap_or_default();
    match WordcountOutput::parse(text).map_err(anyhow::Error::msg)? {
        WordcountOutput::Dir(_) => Ok(WordcountOutput::Dir(
            std::path::absolute(output)
                .with_context(|| format!("cannot make output path {} absolute", output.display()))?,
        )),
        pg => Ok(pg),
    }
}

/// `--input` as the job names it: a readable regular file by its canonical path, or a Kafka topic.
pub(crate) fn absolute_input(input: &Path) -> Result<WordcountInput> {
    let text = input.to_str().unwrap_or_default();
    if let kafka @ WordcountInput::Kafka { .. } = WordcountInput::parse(text).map_err(anyhow::Error::msg)? {
        return Ok(kafka);
    }
    let meta = std::fs::metadata(input).with_context(|| format!("cannot read input {}", input.display()))?;
    if !meta.is_file() {
        bail!(
            "input {} is not a regular file (a directory, pipe or device): the source rewinds it by byte offset after a failure, so it must be a file",
            input.display()
        );
    }
    std::fs::File::open(input).with_context(|| format!("cannot read input {}", input.display()))?;
    Ok(WordcountInput::File(std::fs::canonicalize(input)?))
}

pub(crate) fn check_writable_dir(dir: &Path, what: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {what} directory {}", dir.display()))?;
    let probe = dir.join(format!(".cutline-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("{what} directory {} is not writable", dir.display()))?;
    std::fs::remove_file(&probe).ok();
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn wordcount_config(
    input: &Path,
    output: &Path,
    state: &Path,
    parallelism: u32,
    interval: &str,
    mode: &str,
    line_delay_us: u64,
    from_savepoint: Option<&Path>,
    checkpoint_store: Option<&str>,
) -> Result<(cutline::JobGraph, RunConfig)> {
    let interval_ms = parse_interval(interval)?;
    let mode: CheckpointMode = mode.parse().map_err(anyhow::Error::msg)?;
    if parallelism == 0 {
        bail!("--parallelism must be at least 1");
    }
    let input = absolute_input(input)?;
    // The output (a directory's absolute path, or a table) names the job: refuse another job's state
    // before creating anything.
    let output = absolute_output(output)?;
    let fingerprint = format!("wordcount input={} output={}", input.name(), output.name());
    check_state_belongs_to(state, &fingerprint)?;
    let from_savepoint = match from_savepoint {
        Some(sp) => Some(check_savepoint(sp, &fingerprint)?),
        None => None,
    };
    // Build (and so validate) the job before creating any directory.
    let graph = cutline_cli::jobs::wordcount_into(&input, parallelism, &output, line_delay_us)
        .map_err(anyhow::Error::msg)?
        .build()?;
    if let WordcountOutput::Dir(dir) = &output {
        check_writable_dir(dir, "output")?;
    }
    check_writable_dir(state, "state")?;
    let store: Arc<dyn CheckpointStore> = match checkpoint_store {
        Some(url) => open_store(url).map_err(|e| anyhow::anyhow!("--checkpoint-store {url}: {e}"))?,
        None => Arc::new(
            LocalDirStore::open(state).with_context(|| format!("cannot open state directory {}", state.display()))?,
        ),
    };
    let mut cfg = RunConfig::new(store, fingerprint);
    cfg.checkpoint.interval_ms = interval_ms;
    cfg.checkpoint.mode = mode;
    cfg.from_savepoint = from_savepoint;
    Ok((graph, cfg))
}

/// Refuse a state directory that holds another job's checkpoints, before anything is created.
fn check_state_belongs_to(state: &Path, fingerprint: &str) -> Result<()> {
    if state.join("job.meta").exists() {
        let store = LocalDirStore::open_existing(state)
            .with_context(|| format!("cannot open state directory {}", state.display()))?;
        if let Some(m) = store.read_meta()? {
            if m.job_fingerprint != fingerprint {
                bail!(
                    "the state directory {} belongs to job {:?}, not {:?}: use another --state directory",
                    state.display(),
                    m.job_fingerprint,
                    fingerprint
                );
            }
        }
    }
    Ok(())
}

/// Check that `path` is a savepoint of the job `fingerprint` names before anything is created; the
/// runtime opens it again when the run starts. Returns its absolute path.
pub(crate) fn check_savepoint(path: &Path, fingerprint: &str) -> Result<PathBuf> {
    let hint = "pass a directory that `cutline savepoint` printed";
    let abs = std::path::absolute(path).with_context(|| format!("--from-savepoint {}", path.display()))?;
    match std::fs::metadata(&abs) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("--from-savepoint {} is not a directory: {hint}", path.display()),
        Err(e) => bail!("--from-savepoint {}: cannot open it ({e}): {hint}", path.display()),
    }
    let store = LocalDirStore::open_existing(&abs)?;
    let meta = store
        .read_meta()
        .with_context(|| format!("--from-savepoint {}: its job.meta cannot be read", path.display()))?;
    let Some(meta) = meta else {
        bail!("--from-savepoint {} is not a savepoint (it has no job.meta): {hint}", path.display());
    };
    if meta.job_fingerprint != fingerprint {
        bail!(
            "--from-savepoint {}: the savepoint was taken from job {:?}, and this run is job {:?}: a savepoint restores into a run of the same job (the same --input and --output)",
            path.display(),
            meta.job_fingerprint,
            fingerprint
        );
    }
    if store.latest_complete()?.is_none() {
        bail!("--from-savepoint {} holds no complete checkpoint, so it is not a savepoint: {hint}", path.display());
    }
    Ok(abs)
}

pub(crate) fn run_wordcount(a: &WordcountArgs) -> Result<()> {
    // Settings are checked before anything is created.
    crate::observe::wants_status_line(&a.observe)?;
    if a.observe.http != "off" {
        cutline::admin::http::parse_addr(&a.observe.http).context("--http")?;
    }
    let mut checkpoint = CheckpointConfig {
        interval_ms: parse_interval(&a.checkpoint_interval)?,
        mode: a.mode.parse().map_err(anyhow::Error::msg)?,
        ..CheckpointConfig::default()
    };
    a.tuning.apply(&mut checkpoint)?;
    let (graph, mut cfg) = wordcount_config(
        &a.input,
        &a.output,
        &a.state,
        a.parallelism,
        &a.checkpoint_interval,
        &a.mode,
        a.line_delay_us,
        a.from_savepoint.as_deref(),
        a.checkpoint_store.as_deref(),
    )?;
    cfg.checkpoint = checkpoint;
    cfg.state_backend = a.state_backend.backend()?;
    if let Some(spec) = &a.kill_self_at {
        cfg.faults = kill_self_at(spec)?;
    }
    if a.line_delay_us > 0 {
        cfg.batch_size = 64;
    }
    let savepoint_dir = a.savepoint_dir.clone().unwrap_or_else(|| a.state.join("savepoints"));
    cfg.savepoint_dir = Some(
        std::path::absolute(&savepoint_dir).with_context(|| format!("--savepoint-dir {}", savepoint_dir.display()))?,
    );
    if cfg.from_savepoint.is_some() && cfg.store.latest_complete().ok().flatten().is_some() {
        tracing::warn!(
            event = "savepoint_ignored",
            "{} already holds checkpoints of this job: the run resumes from its latest checkpoint, not from the savepoint",
            a.state.display()
        );
    }
    let store = cfg.store.clone();
    let _otlp = crate::observe::otlp(&a.observe, &mut cfg, "cutline wordcount")?;
    let handle = match &a.cluster.coordinator {
        None => cutline::spawn(graph, cfg),
        Some(listen) => {
            let c = &a.cluster;
            let input = absolute_input(&a.input)?.name();
            let output = match absolute_output(&a.output)? {
                WordcountOutput::Dir(d) => d,
                WordcountOutput::Postgres { .. } | WordcountOutput::Kafka { .. } => a.output.clone(),
            };
            let job_args = ["wordcount", "--input", &input, "--output"]
                .iter()
                .map(|s| s.to_string())
                .chain([
                    output.display().to_string(),
                    "--parallelism".into(),
                    a.parallelism.to_string(),
                    "--line-delay-us".into(),
                    a.line_delay_us.to_string(),
                ])
                .collect();
            let state = match &a.checkpoint_store {
                Some(url) if url.starts_with("s3://") => url.clone(),
                Some(dir) => std::path::absolute(dir)?.display().to_string(),
                None => std::path::absolute(&a.state)?.display().to_string(),
            };
            let mut cluster =
                ClusterConfig::new(listen, c.workers, read_secret(c.secret_file.as_deref())?, job_args, state);
            cluster.min_workers = c.min_workers;
            cluster.replacement_wait_ms = ms_flag("replacement-wait", &c.replacement_wait)?;
            cluster.heartbeat_interval_ms = ms_flag("heartbeat-interval", &c.heartbeat_interval)?;
            cluster.heartbeat_timeout_ms = ms_flag("heartbeat-timeout", &c.heartbeat_timeout)?;
            cluster.frame_protection = c.frame_protection;
            cutline::cluster::spawn_cluster(graph, cfg, cluster)?
        }
    };
    supervise(handle, &a.state, store, &a.observe)
}

/// `cutline run nexmark`: a Nexmark query into a directory, embedded.
pub(crate) fn run_nexmark(a: &NexmarkArgs) -> Result<()> {
    crate::observe::wants_status_line(&a.observe)?;
    if a.observe.http != "off" {
        cutline::admin::http::parse_addr(&a.observe.http).context("--http")?;
    }
    let mut checkpoint = CheckpointConfig {
        interval_ms: parse_interval(&a.checkpoint_interval)?,
        mode: a.mode.parse().map_err(anyhow::Error::msg)?,
        ..CheckpointConfig::default()
    };
    a.tuning.apply(&mut checkpoint)?;
    if a.parallelism == 0 {
        bail!("--parallelism must be at least 1");
    }
    let output = std::path::absolute(&a.output)
        .with_context(|| format!("cannot make output path {} absolute", a.output.display()))?;
    // The query, the events and the output name the job. The parallelism does not: a change of it is
    // refused when the restore reads the generator's offsets (they restore only at theirs).
    let fingerprint = format!("nexmark query={} events={} output={}", a.query, a.events, output.display());
    check_state_belongs_to(&a.state, &fingerprint)?;
    let graph = cutline_cli::jobs::nexmark(a.query, a.events, a.parallelism, &output, a.pace_us).build()?;
    check_writable_dir(&output, "output")?;
    check_writable_dir(&a.state, "state")?;
    let store: Arc<dyn CheckpointStore> = Arc::new(
        LocalDirStore::open(&a.state).with_context(|| format!("cannot open state directory {}", a.state.display()))?,
    );
    let mut cfg = RunConfig::new(store.clone(), fingerprint);
    cfg.checkpoint = checkpoint;
    if let Some(spec) = &a.kill_self_at {
        cfg.faults = kill_self_at(spec)?;
    }
    cfg.savepoint_dir = Some(std::path::absolute(a.state.join("savepoints"))?);
    let _otlp = crate::observe::otlp(&a.observe, &mut cfg, &format!("cutline nexmark {}", a.query))?;
    supervise(cutline::spawn(graph, cfg), &a.state, store, &a.observe)
}

/// Serve the admin socket of a running job, stop it cleanly on SIGTERM or SIGINT, wait for its end
/// and say how it ended.
fn supervise(
    handle: cutline::JobHandle,
    state: &Path,
    store: Arc<dyn CheckpointStore>,
    observe: &ObserveArgs,
) -> Result<()> {
    let socket = state.join(admin::SOCKET_FILE);
    // From here on SIGTERM and SIGINT stop the job cleanly (a second one exits at once).
    let signals = crate::signals::StopOnSignal::install(handle.control(), &socket)?;
    // Serve the admin socket only once the job answers: it then holds the state directory's lock, so
    // a second run on the same directory is refused by the lock and never touches this run's socket.
    // If the job ended already (refused, failed or finished), `join` says how.
    let server = match handle.checkpoint_config() {
        Ok(_) => match admin::serve(handle.control(), &socket) {
            Ok(server) => {
                let shown = std::path::absolute(&socket).unwrap_or(socket.clone());
                tracing::info!(
                    event = "admin_socket",
                    "admin socket {} (cutline status|tune|savepoint --state {})",
                    shown.display(),
                    state.display()
                );
                Some(server)
            }
            Err(e @ AdminError::PathTooLong { .. }) => {
                tracing::warn!(event = "no_admin_socket", "running without an admin socket: {e}");
                None
            }
            Err(e) => {
                handle.stop();
                let _ = handle.join();
                return Err(e).context("cannot serve the admin socket; the job was stopped");
            }
        },
        Err(_) => None,
    };
    // Like the admin socket, once the job answers (it may have ended already).
    let http = if !handle.is_finished() {
        match crate::observe::serve_http(observe, handle.control(), store.clone()) {
            Ok(h) => h,
            Err(e) => {
                handle.stop();
                let _ = handle.join();
                return Err(e.context("cannot serve the HTTP endpoint; the job was stopped"));
            }
        }
    } else {
        None
    };
    let status_line =
        crate::observe::wants_status_line(observe)?.then(|| crate::observe::StatusLine::start(handle.control()));
    let report = handle.join();
    drop(status_line);
    drop(http);
    drop(server); // after the job ended: requests in progress are answered first
    let signal = signals.received();
    let report = report?;
    if report.already_finished {
        println!(
            "job already finished (final checkpoint {}); nothing written",
            report.final_checkpoint.map(|c| c.0).unwrap_or(0)
        );
        return Ok(());
    }
    let counts = format!(
        "{} checkpoints, {} failed, {} restarts{}",
        report.checkpoints_completed,
        report.checkpoints_failed,
        report.restarts,
        report.restored_from.map(|c| format!(", resumed from checkpoint {}", c.0)).unwrap_or_default()
    );
    if let Some(sp) = &report.stopped_with_savepoint {
        println!(
            "stopped with savepoint {} in {} ({} bytes): {counts}; start a new run from it with --from-savepoint {}",
            sp.checkpoint.0,
            sp.path.display(),
            sp.bytes,
            sp.path.display()
        );
    } else if let (true, Some(signal)) = (report.stopped, signal) {
        let from = match store.latest_complete() {
            Ok(Some(c)) => format!("from checkpoint {}", c.0),
            Ok(None) => "from the start (no checkpoint completed)".into(),
            Err(_) => "from the latest checkpoint".into(),
        };
        let message = format!("stopped by {}: {counts}; run the same command again to resume {from}", signal.name());
        return Err(signal.stopped(message).into());
    } else if report.stopped {
        println!("stopped: {counts}; run the same command again to resume from the latest checkpoint");
    } else {
        println!("finished: final checkpoint {}, {counts}", report.final_checkpoint.map(|c| c.0).unwrap_or(0));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn kill_self_at_refuses_unknown_points_and_a_count_of_zero() {
        for bad in ["sink-comit:3", "sink-commit:0", "sink-commit:x", "sink-commit:-1"] {
            let err = super::kill_self_at(bad).err().unwrap_or_else(|| panic!("{bad} accepted")).to_string();
            assert!(err.contains("--kill-self-at"), "{bad}: {err}");
        }
        assert!(super::kill_self_at("sink-commit:3").is_ok() && super::kill_self_at("sink-recover").is_ok());
    }
}
