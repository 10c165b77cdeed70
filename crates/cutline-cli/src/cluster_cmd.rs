//! `cutline worker` and `cutline cluster` (a local cluster with restarts).

use crate::args::{build_job, ms_flag, open_store, read_secret};
use anyhow::{bail, Context, Result};
use cutline::cluster::WorkerConfig;
use std::path::{Path, PathBuf};

/// `cutline worker`'s addresses and options.
pub(crate) struct WorkerArgs {
    pub(crate) join: String,
    pub(crate) listen: String,
    pub(crate) advertise: Option<String>,
    pub(crate) frame_protection: cutline::cluster::FrameProtection,
    /// Where to serve probes and metrics, or `off`.
    pub(crate) http: String,
}

pub(crate) fn worker(
    a: WorkerArgs,
    secret_file: Option<&Path>,
    rejoin_timeout: &str,
    faults: cutline::Faults,
) -> Result<()> {
    let mut cfg = WorkerConfig::new(a.join, read_secret(secret_file)?);
    cfg.listen = a.listen;
    cfg.advertise = a.advertise;
    cfg.rejoin_timeout_ms = ms_flag("rejoin-timeout", rejoin_timeout)?;
    cfg.frame_protection = a.frame_protection;
    cfg.secret_origin = secret_file.map(|p| p.display().to_string());
    cfg.faults = faults;
    let _http = if a.http == "off" {
        None
    } else {
        let s = cutline::admin::serve_worker_http(&a.http, cfg.status.clone()).context("--http")?;
        tracing::info!(event = "http_endpoint", addr = %s.addr(), "worker probes http://{0}/healthz and /readyz, metrics http://{0}/metrics", s.addr());
        Some(s)
    };
    Ok(cutline::cluster::run_worker(cfg, &build_job, &open_store)?)
}

/// The exit code of `cutline worker` when it cannot run the job at all (a rejected secret, an
/// unproven coordinator, different frame protection, another job graph, a bad configuration):
/// restarting it cannot help, and `cutline cluster` does not.
pub(crate) const EXIT_WORKER_REFUSED: i32 = 3;

/// Is this worker error one that a restart cannot mend?
pub(crate) fn worker_refused(e: &anyhow::Error) -> bool {
    e.downcast_ref::<cutline::cluster::WorkerError>()
        .is_some_and(|w| !matches!(w, cutline::cluster::WorkerError::CoordinatorGone { .. }))
}

/// A local cluster: the coordinator and `workers` worker processes of this binary, supervised by
/// the library's launcher (`cutline::cluster::launch`): each restarted when it dies before the job is
/// over, SIGTERM and SIGINT passed to the coordinator.
pub(crate) fn launch_cluster(workers: usize, job: &[String], verbose: bool) -> Result<()> {
    use cutline::cluster::launch::{free_loopback_address, write_new_secret, Launch, LaunchEnd};
    use std::process::Command;
    if workers == 0 {
        bail!("--workers must be at least 1");
    }
    let flag = |name: &str| job.iter().position(|a| a == name).and_then(|i| job.get(i + 1));
    let state = flag("--state").context("the job needs --state DIR (the coordinator's state directory)")?;
    std::fs::create_dir_all(state).with_context(|| format!("cannot create state directory {state}"))?;
    let secret = match flag("--secret-file") {
        Some(s) => PathBuf::from(s),
        None => {
            // A secret of this cluster only, readable by this user only.
            let path = Path::new(state).join("cluster.secret");
            if !path.exists() {
                write_new_secret(&path).with_context(|| format!("cannot write {}", path.display()))?;
            }
            path
        }
    };
    let addr = match flag("--coordinator") {
        Some(a) => a.clone(),
        None => free_loopback_address()?,
    };
    let exe = std::env::current_exe()?;
    let mut coord_args: Vec<String> = vec!["run".into()];
    coord_args.extend(job.iter().cloned());
    if flag("--coordinator").is_none() {
        coord_args.extend(["--coordinator".into(), addr.clone()]);
    }
    if flag("--workers").is_none() {
        coord_args.extend(["--workers".into(), workers.to_string()]);
    }
    let secret_s = secret.display().to_string();
    if flag("--secret-file").is_none() {
        coord_args.extend(["--secret-file".into(), secret_s.clone()]);
    }
    // The processes it starts log as verbosely as it does, and the workers seal frames as the
    // coordinator does.
    let level: Vec<(&str, &str)> = verbose.then_some((crate::logging::LEVEL_VAR, "info")).into_iter().collect();
    let mut worker_args: Vec<String> =
        vec!["worker".into(), "--join".into(), addr.clone(), "--secret-file".into(), secret_s.clone()];
    if let Some(p) = flag("--frame-protection") {
        worker_args.extend(["--frame-protection".into(), p.clone()]);
    }
    let (exe2, level2) = (exe.clone(), level.clone());
    let mut launch = Launch::new(
        workers,
        move || {
            let mut c = Command::new(&exe);
            c.args(&coord_args).envs(level.iter().copied());
            c
        },
        move |_| {
            let mut c = Command::new(&exe2);
            c.args(&worker_args).envs(level2.iter().copied());
            c
        },
    );
    launch.no_restart_exit_codes = vec![EXIT_WORKER_REFUSED];
    eprintln!("cutline: local cluster: coordinator on {addr}, {workers} worker(s), secret in {secret_s}");
    // SIGTERM and SIGINT go to the coordinator, which stops the job cleanly; nothing is restarted
    // after one.
    let _signals = crate::signals::Forwarder::install(launch.stop.clone())?;
    match launch.run()? {
        LaunchEnd::Finished => Ok(()),
        LaunchEnd::Stopped { signal, coordinator } => Err(crate::signals::StopSignal(signal)
            .stopped(format!(
                "stopped by {}: the coordinator stopped ({coordinator}); run the same command again to resume from the latest checkpoint",
                crate::signals::StopSignal(signal).name()
            ))
            .into()),
    }
}
