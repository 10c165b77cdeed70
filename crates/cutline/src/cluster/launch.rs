//! A launcher for a cluster on one machine: starts a coordinator process and worker processes from
//! commands the caller builds (usually its own binary, see [`std::env::current_exe`]), restarts any of
//! them that dies before the job is over, and returns when the coordinator exits.
//!
//! It is the supervisor a multi-host deployment gets from systemd or Kubernetes, for one host: it
//! knows nothing of the job, the protocol or checkpoints, only processes and their exit statuses.
//!
//! - The coordinator exiting with success ends the launch (the job is over, or stopped); exiting with
//!   a failure status ends it with [`LaunchError::CoordinatorFailed`] (the job failed: a restart would
//!   fail the same way, the coordinator already restarts the job itself); dying by a signal restarts it.
//! - A worker exiting with success was told the job is over; a worker that fails or dies is restarted.
//! - Each process is restarted under its own [`RestartTracker`], so a process that keeps dying at once
//!   ends the launch with [`LaunchError::GaveUp`] instead of spinning.
//! - A worker exiting with one of [`Launch::no_restart_exit_codes`] refused to run (a wrong secret, a
//!   different job): restarting it cannot help, and the launch ends with [`LaunchError::Refused`].
//! - [`Launch::stop`] (fed from a signal handler, say) passes each requested signal to the
//!   coordinator, which stops the job cleanly; nothing is restarted after a stop request, workers still
//!   running once the coordinator exited get the signal too, and the launch ends with
//!   [`LaunchEnd::Stopped`].

use cutline_core::restart::{RestartDecision, RestartStrategy, RestartTracker};
use cutline_core::TimeMs;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the launcher looks at its processes.
pub const LAUNCH_POLL_MS: u64 = 100;
/// How long workers may take to exit on their own once the coordinator exited, before they are killed.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 5_000;

/// Why a launch ended without the job finishing.
#[derive(thiserror::Error)]
pub enum LaunchError {
    /// A process could not be started at all.
    #[error("cannot start the {what}: {source}; check the command and the executable's path")]
    Spawn {
        /// "coordinator" or "worker N".
        what: String,
        /// Why the operating system refused.
        #[source]
        source: std::io::Error,
    },
    /// A process kept dying and its restart strategy gave up.
    #[error("the {what} kept dying ({last}); gave up after {restarts} restart(s): read its log for the cause")]
    GaveUp {
        /// "coordinator" or "worker N".
        what: String,
        /// Restarts done before giving up.
        restarts: u32,
        /// Its last exit status.
        last: ExitStatus,
    },
    /// A worker exited with one of [`Launch::no_restart_exit_codes`]: it cannot run this job.
    #[error("the {what} refused to run ({status}): restarting it cannot help; its log says why")]
    Refused {
        /// "worker N".
        what: String,
        /// Its exit status.
        status: ExitStatus,
    },
    /// The coordinator exited with a failure: the job failed (its error is in the coordinator's log).
    #[error("the coordinator failed ({0}): the job did not finish; its error is in the coordinator's output")]
    CoordinatorFailed(ExitStatus),
    /// Waiting for a process failed.
    #[error("cannot watch the {what}: {source}")]
    Wait {
        /// "coordinator" or "worker N".
        what: String,
        /// Why waiting failed.
        #[source]
        source: std::io::Error,
    },
}

/// How a launch ended without an error.
#[derive(Debug, PartialEq, Eq)]
pub enum LaunchEnd {
    /// The coordinator exited with success: the job is over.
    Finished,
    /// A stop was requested ([`Launch::stop`]); the coordinator exited with `coordinator`.
    Stopped {
        /// The last signal requested.
        signal: i32,
        /// How the coordinator exited.
        coordinator: ExitStatus,
    },
}

/// Stop requests for a running launch, from any thread (a signal handler's, say): each is a signal
/// the launcher passes to the coordinator.
#[derive(Debug, Default)]
pub struct StopRequests {
    count: AtomicU32,
    signal: AtomicI32,
}

impl StopRequests {
    /// Ask the launch to stop by passing `signal` to the coordinator (`libc::SIGTERM` stops the job
    /// cleanly; a second one makes `cutline run` exit at once; `libc::SIGKILL` ends it now).
    pub fn request(&self, signal: i32) {
        self.signal.store(signal, Ordering::SeqCst);
        self.count.fetch_add(1, Ordering::SeqCst);
    }
    /// The last signal requested and how many requests came, if any.
    pub fn requested(&self) -> Option<(i32, u32)> {
        match self.count.load(Ordering::SeqCst) {
            0 => None,
            n => Some((self.signal.load(Ordering::SeqCst), n)),
        }
    }
}

/// What to launch and how to restart it. See the module documentation.
pub struct Launch {
    /// Builds the coordinator's command, for its first start and every restart.
    pub coordinator: Box<dyn Fn() -> Command>,
    /// Builds worker `i`'s command (`i` in `0..workers`), for its first start and every restart.
    pub worker: Box<dyn Fn(usize) -> Command>,
    /// How many workers run.
    pub workers: usize,
    /// How each process is restarted after it died (default: backoff from 100 ms to 10 s, at most 10
    /// restarts in a row).
    pub restart: RestartStrategy,
    /// See [`DEFAULT_SHUTDOWN_GRACE_MS`].
    pub shutdown_grace_ms: u64,
    /// Exit codes with which a worker says it cannot run this job (never restarted).
    pub no_restart_exit_codes: Vec<i32>,
    /// Stop requests (see [`StopRequests`]).
    pub stop: Arc<StopRequests>,
}

impl Launch {
    /// A launch of one coordinator and `workers` workers with the default restart strategy.
    pub fn new(
        workers: usize,
        coordinator: impl Fn() -> Command + 'static,
        worker: impl Fn(usize) -> Command + 'static,
    ) -> Launch {
        Launch {
            coordinator: Box::new(coordinator),
            worker: Box::new(worker),
            workers,
            restart: RestartStrategy::default(),
            shutdown_grace_ms: DEFAULT_SHUTDOWN_GRACE_MS,
            no_restart_exit_codes: Vec::new(),
            stop: Arc::new(StopRequests::default()),
        }
    }

    /// Run until the coordinator exits. `Ok` when it succeeded, or when a stop was requested.
    pub fn run(&self) -> Result<LaunchEnd, LaunchError> {
        let started = Instant::now();
        let now = || TimeMs(started.elapsed().as_millis() as u64);
        let no_restart = &self.no_restart_exit_codes;
        let mut coord = Supervised::start("coordinator".into(), &*self.coordinator, &self.restart)?;
        let mut workers: Vec<Supervised> = (0..self.workers)
            .map(|i| Supervised::start(format!("worker {i}"), &|| (self.worker)(i), &self.restart))
            .collect::<Result<_, _>>()?;
        let mut forwarded = 0;
        let outcome = loop {
            std::thread::sleep(Duration::from_millis(LAUNCH_POLL_MS));
            if let Some((signal, n)) = self.stop.requested() {
                // Every request is passed on; nothing is restarted any more.
                while forwarded < n {
                    coord.signal(signal);
                    forwarded += 1;
                }
                match coord.exited() {
                    Ok(Some(st)) => break Ok(LaunchEnd::Stopped { signal, coordinator: st }),
                    Ok(None) => continue,
                    Err(e) => break Err(e),
                }
            }
            match coord.poll(now(), &*self.coordinator, no_restart) {
                Ok(Some(st)) if st.success() => break Ok(LaunchEnd::Finished),
                Ok(Some(st)) => break Err(LaunchError::CoordinatorFailed(st)),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
            if let Some(e) =
                workers.iter_mut().enumerate().find_map(|(i, w)| w.poll(now(), &|| (self.worker)(i), no_restart).err())
            {
                break Err(e);
            }
        };
        // The coordinator told its workers the job is over (or the launch ends anyway): give them a
        // moment, then make sure no process outlives the launch. After a stop request, workers still
        // running get the signal first.
        let deadline = Instant::now() + Duration::from_millis(self.shutdown_grace_ms);
        let stop_signal = self.stop.requested().map(|(sig, _)| sig);
        for p in std::iter::once(&mut coord).chain(workers.iter_mut()) {
            if let Some(sig) = stop_signal {
                p.signal(sig);
            }
            p.finish(if outcome.is_err() { Instant::now() } else { deadline });
        }
        outcome
    }
}

/// One process under supervision.
struct Supervised {
    what: String,
    child: Option<Child>,
    tracker: RestartTracker,
    /// When a dead process is due to start again.
    restart_at: Option<(TimeMs, ExitStatus)>,
    /// Exited with success: not restarted.
    done: bool,
}

impl Supervised {
    fn start(what: String, make: &dyn Fn() -> Command, strategy: &RestartStrategy) -> Result<Supervised, LaunchError> {
        let child = spawn(&what, make)?;
        Ok(Supervised {
            what,
            child: Some(child),
            tracker: RestartTracker::new(strategy.clone()),
            restart_at: None,
            done: false,
        })
    }

    /// Look at the process: `Some(status)` once the coordinator's exit ends the launch (success, or a
    /// failure status); restarts a dead process when due.
    fn poll(
        &mut self,
        now: TimeMs,
        make: &dyn Fn() -> Command,
        no_restart: &[i32],
    ) -> Result<Option<ExitStatus>, LaunchError> {
        if self.done {
            return Ok(None);
        }
        if let Some((at, last)) = self.restart_at {
            if now >= at {
                self.restart_at = None;
                self.child = Some(spawn(&self.what, make)?);
                tracing::info!(event = "process_restarted", process = %self.what, "cutline: restarted the {} (it exited: {last})", self.what);
            }
            return Ok(None);
        }
        let Some(child) = self.child.as_mut() else { return Ok(None) };
        let status = child.try_wait().map_err(|source| LaunchError::Wait { what: self.what.clone(), source })?;
        let Some(st) = status else { return Ok(None) };
        self.child = None;
        let is_coordinator = self.what == "coordinator";
        if st.success() {
            self.done = true;
            return Ok(is_coordinator.then_some(st));
        }
        if is_coordinator && !died_by_signal(&st) {
            return Ok(Some(st));
        }
        if st.code().is_some_and(|c| no_restart.contains(&c)) {
            return Err(LaunchError::Refused { what: self.what.clone(), status: st });
        }
        match self.tracker.on_failure(now) {
            RestartDecision::RestartAfter { delay_ms, .. } => {
                tracing::warn!(event = "process_died", process = %self.what, status = %st, "cutline: the {} exited ({st}); restarting it in {delay_ms} ms", self.what);
                self.restart_at = Some((TimeMs(now.0.saturating_add(delay_ms)), st));
                Ok(None)
            }
            RestartDecision::GiveUp { attempts } => {
                Err(LaunchError::GaveUp { what: self.what.clone(), restarts: attempts, last: st })
            }
        }
    }

    /// Has the process exited (without restarting it)?
    fn exited(&mut self) -> Result<Option<ExitStatus>, LaunchError> {
        match self.child.as_mut() {
            None => Ok(None),
            Some(c) => c.try_wait().map_err(|source| LaunchError::Wait { what: self.what.clone(), source }),
        }
    }

    /// Send `signal` to the process if it runs (best effort: it may be exiting).
    fn signal(&self, signal: i32) {
        #[cfg(unix)]
        if let Some(pid) = self.child.as_ref().and_then(|c| libc::pid_t::try_from(c.id()).ok()) {
            // SAFETY: kill has no memory-safety preconditions; a stale pid only fails.
            unsafe { libc::kill(pid, signal) };
        }
        #[cfg(not(unix))]
        let _ = signal;
    }

    /// Wait for the process to exit until `deadline`, then kill it.
    fn finish(&mut self, deadline: Instant) {
        if let Some(mut c) = self.child.take() {
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(what: &str, make: &dyn Fn() -> Command) -> Result<Child, LaunchError> {
    make().spawn().map_err(|source| LaunchError::Spawn { what: what.to_string(), source })
}

#[cfg(unix)]
fn died_by_signal(st: &ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    st.signal().is_some()
}

#[cfg(not(unix))]
fn died_by_signal(_st: &ExitStatus) -> bool {
    false
}

/// Write a new random cluster secret (32 bytes from the operating system, hex) to `path`, readable by
/// this user only. Refuses to replace an existing file.
pub fn write_new_secret(path: &std::path::Path) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(hex.as_bytes())?;
    f.sync_all()
}

/// A loopback address with a port that was free a moment ago (for a coordinator on one machine).
pub fn free_loopback_address() -> std::io::Result<String> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_coordinator_that_finishes_ends_the_launch_and_workers_that_finish_stay_down() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("starts");
        let l = log.clone();
        let launch = Launch::new(2, || sh("sleep 0.5"), move |i| sh(&format!("echo {i} >> {}", l.display())));
        assert_eq!(launch.run().unwrap(), LaunchEnd::Finished);
        let starts = std::fs::read_to_string(&log).unwrap();
        assert_eq!(starts.lines().count(), 2, "each worker started once: {starts}");
    }

    #[test]
    fn a_dying_worker_is_restarted_until_its_strategy_gives_up() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("starts");
        let l = log.clone();
        let mut launch = Launch::new(1, || sh("sleep 5"), move |_| sh(&format!("echo x >> {}; exit 1", l.display())));
        launch.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 };
        match launch.run() {
            Err(LaunchError::GaveUp { what, restarts, .. }) => {
                assert_eq!((what.as_str(), restarts), ("worker 0", 3));
            }
            other => panic!("expected the launcher to give up, got {other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 4, "started, then restarted 3 times");
    }

    #[test]
    fn a_coordinator_killed_by_a_signal_is_restarted_one_that_fails_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("killed-once");
        let script = format!("if [ -e {m} ]; then exit 0; else touch {m}; kill -9 $$; fi", m = marker.display());
        let launch = Launch::new(1, move || sh(&script), |_| sh("sleep 0.2"));
        assert_eq!(launch.run().unwrap(), LaunchEnd::Finished);
        assert!(marker.exists());
        let failing = Launch::new(1, || sh("exit 3"), |_| sh("sleep 0.2"));
        match failing.run() {
            Err(LaunchError::CoordinatorFailed(st)) => assert_eq!(st.code(), Some(3)),
            other => panic!("expected a failed coordinator, got {other:?}"),
        }
    }

    #[test]
    fn a_stop_request_reaches_the_coordinator_and_nothing_is_restarted_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (got, starts) = (dir.path().join("got-term"), dir.path().join("worker-starts"));
        // The coordinator exits 143 when it gets SIGTERM, noting it; workers die at once (and would
        // be restarted, were it not for the stop).
        let coordinator = format!("trap 'touch {}; exit 143' TERM; while true; do sleep 0.05; done", got.display());
        let worker = format!("echo x >> {}; sleep 0.3; exit 1", starts.display());
        let mut launch = Launch::new(1, move || sh(&coordinator), move |_| sh(&worker));
        launch.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 1000 };
        let stop = launch.stop.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            stop.request(libc::SIGTERM);
        });
        let began = Instant::now();
        let end = launch.run().unwrap();
        t.join().unwrap();
        assert!(
            matches!(end, LaunchEnd::Stopped { signal: libc::SIGTERM, coordinator } if coordinator.code() == Some(143)),
            "{end:?}"
        );
        assert!(got.exists(), "the coordinator got the signal");
        let n = std::fs::read_to_string(&starts).unwrap().lines().count();
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(std::fs::read_to_string(&starts).unwrap().lines().count(), n, "no restart after the stop");
        assert!(began.elapsed() < Duration::from_secs(5), "{:?}", began.elapsed());
    }

    #[test]
    fn a_worker_that_refuses_to_run_is_not_restarted() {
        let dir = tempfile::tempdir().unwrap();
        let starts = dir.path().join("starts");
        let s2 = starts.clone();
        let mut launch = Launch::new(1, || sh("sleep 5"), move |_| sh(&format!("echo x >> {}; exit 3", s2.display())));
        launch.no_restart_exit_codes = vec![3];
        match launch.run() {
            Err(LaunchError::Refused { what, status }) => {
                assert_eq!((what.as_str(), status.code()), ("worker 0", Some(3)))
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&starts).unwrap().lines().count(), 1);
    }

    #[test]
    fn a_new_secret_is_private_and_never_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cluster.secret");
        write_new_secret(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&p).unwrap().len(), 64);
        assert!(write_new_secret(&p).is_err());
    }
}

/// The same message as `Display` (a `main` returning `Box<dyn Error>` prints it).
impl std::fmt::Debug for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
