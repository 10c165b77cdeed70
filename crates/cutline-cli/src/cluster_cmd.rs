//! `cutline worker` and `cutline cluster` (a local cluster with restarts).

use crate::args::{build_job, ms_flag, open_store, read_secret};
use anyhow::{bail, Context, Result};
use cutline::cluster::WorkerConfig;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub(crate) fn worker(
    join: String,
    secret_file: Option<&Path>,
    listen: String,
    advertise: Option<String>,
    rejoin_timeout: &str,
    frame_protection: cutline::cluster::FrameProtection,
) -> Result<()> {
    let mut cfg = WorkerConfig::new(join, read_secret(secret_file)?);
    cfg.listen = listen;
    cfg.advertise = advertise;
    cfg.rejoin_timeout_ms = ms_flag("rejoin-timeout", rejoin_timeout)?;
    cfg.frame_protection = frame_protection;
    cfg.secret_origin = secret_file.map(|p| p.display().to_string());
    Ok(cutline::cluster::run_worker(cfg, &build_job, &open_store)?)
}

/// A local cluster: the coordinator and `workers` worker processes of this binary, each restarted
/// when it dies before the job is over.
pub(crate) fn launch_cluster(workers: usize, job: &[String], verbose: bool) -> Result<()> {
    use std::process::{Child, Command};
    if workers == 0 {
        bail!("--workers must be at least 1");
    }
    let state = job
        .iter()
        .position(|a| a == "--state")
        .and_then(|i| job.get(i + 1))
        .context("the job needs --state DIR (the coordinator's state directory)")?;
    std::fs::create_dir_all(state).with_context(|| format!("cannot create state directory {state}"))?;
    let secret = match job.iter().position(|a| a == "--secret-file").and_then(|i| job.get(i + 1)) {
        Some(s) => PathBuf::from(s),
        None => {
            // A secret of this cluster only, readable by this user only.
            let path = Path::new(state).join("cluster.secret");
            if !path.exists() {
                use std::io::Read;
                use std::os::unix::fs::OpenOptionsExt;
                let mut bytes = [0u8; 32];
                std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
                std::io::Write::write_all(&mut f, hex.as_bytes())?;
            }
            path
        }
    };
    let addr = match job.iter().position(|a| a == "--coordinator").and_then(|i| job.get(i + 1)) {
        Some(a) => a.clone(),
        None => {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.to_string()
        }
    };
    let exe = std::env::current_exe()?;
    let mut coord_args: Vec<String> = vec!["run".into()];
    coord_args.extend(job.iter().cloned());
    if !job.iter().any(|a| a == "--coordinator") {
        coord_args.extend(["--coordinator".into(), addr.clone()]);
    }
    if !job.iter().any(|a| a == "--workers") {
        coord_args.extend(["--workers".into(), workers.to_string()]);
    }
    let secret_s = secret.display().to_string();
    if !job.iter().any(|a| a == "--secret-file") {
        coord_args.extend(["--secret-file".into(), secret_s.clone()]);
    }
    // The processes it starts log as verbosely as it does.
    let level = verbose.then_some((crate::logging::LEVEL_VAR, "info"));
    let start_coord =
        || Command::new(&exe).args(&coord_args).envs(level).spawn().context("cannot start the coordinator");
    // The workers seal frames as the coordinator does.
    let protection = job.iter().position(|a| a == "--frame-protection").and_then(|i| job.get(i + 1));
    let protection: Vec<&str> = protection.map(|p| vec!["--frame-protection", p.as_str()]).unwrap_or_default();
    let start_worker = || {
        Command::new(&exe)
            .args(["worker", "--join", &addr, "--secret-file", &secret_s])
            .args(&protection)
            .envs(level)
            .spawn()
            .context("cannot start a worker")
    };
    eprintln!("cutline: local cluster: coordinator on {addr}, {workers} worker(s), secret in {secret_s}");
    // SIGTERM and SIGINT go to the coordinator, which stops the job cleanly; nothing is restarted
    // after one.
    let signals = crate::signals::Forwarder::install()?;
    let mut forwarded = 0;
    let mut coord: Child = start_coord()?;
    let mut ws: Vec<Child> = (0..workers).map(|_| start_worker()).collect::<Result<_>>()?;
    let status = loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        if let Some((sig, n)) = signals.received() {
            // Every signal is passed on (a second one makes the coordinator exit at once).
            while forwarded < n {
                crate::signals::forward(coord.id(), sig);
                forwarded += 1;
            }
            match coord.try_wait()? {
                Some(st) => break st,
                None => continue,
            }
        }
        if let Some(st) = coord.try_wait()? {
            use std::os::unix::process::ExitStatusExt;
            if st.signal().is_some() {
                eprintln!("cutline: the coordinator died ({st}); restarting it");
                coord = start_coord()?;
                continue;
            }
            break st;
        }
        for w in ws.iter_mut() {
            match w.try_wait()? {
                // Told by the coordinator that the job is over.
                Some(st) if st.success() => {}
                Some(st) => {
                    eprintln!("cutline: a worker exited ({st}); starting a replacement");
                    *w = start_worker()?;
                }
                None => {}
            }
        }
    };
    // The coordinator told its workers the job is over; give them a moment, then make sure (after a
    // signal, the workers are told by it too).
    let stopped_by = signals.received().map(|(sig, _)| sig);
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    for w in ws.iter_mut() {
        while w.try_wait()?.is_none() && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if let (Some(sig), Ok(None)) = (stopped_by, w.try_wait()) {
            crate::signals::forward(w.id(), sig);
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let _ = w.kill();
        let _ = w.wait();
    }
    if let Some(sig) = stopped_by {
        return Err(sig
            .stopped(format!(
                "stopped by {}: the coordinator stopped ({status}); run the same command again to resume from the latest checkpoint",
                sig.name()
            ))
            .into());
    }
    if !status.success() {
        bail!("the coordinator failed ({status})");
    }
    Ok(())
}
