//! SIGTERM and SIGINT: a running job stops cleanly (every task torn down, no further checkpoint; a
//! second signal exits at once), and the command exits with [`StoppedBySignal::exit_code`],
//! 128 + the signal's number, as a shell reports a process the signal killed.

use anyhow::{Context, Result};
use cutline::JobControl;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

/// A signal that stops a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StopSignal(pub(crate) i32);

impl StopSignal {
    pub(crate) fn name(self) -> &'static str {
        match self.0 {
            SIGTERM => "SIGTERM",
            SIGINT => "SIGINT",
            _ => "a signal",
        }
    }
    /// The error that ends the command, with its message.
    pub(crate) fn stopped(self, message: String) -> StoppedBySignal {
        StoppedBySignal { signal: self, message }
    }
}

/// The command was stopped by a signal; main exits with [`StoppedBySignal::exit_code`].
#[derive(Debug)]
pub(crate) struct StoppedBySignal {
    pub(crate) signal: StopSignal,
    pub(crate) message: String,
}

impl std::fmt::Display for StoppedBySignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoppedBySignal {}

impl StoppedBySignal {
    /// 130 for SIGINT, 143 for SIGTERM.
    pub(crate) fn exit_code(&self) -> i32 {
        128 + self.signal.0
    }
}

/// Stops the job on the first SIGTERM or SIGINT; exits the process on the second. Dropping it stops
/// the watching thread (later signals are then ignored: the job has ended).
pub(crate) struct StopOnSignal {
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
    received: Arc<AtomicI32>,
}

impl StopOnSignal {
    /// `socket` is removed before a second signal exits the process (the job cannot remove it then).
    pub(crate) fn install(control: JobControl, socket: &Path) -> Result<StopOnSignal> {
        let mut signals = Signals::new([SIGTERM, SIGINT]).context("cannot handle SIGTERM and SIGINT")?;
        let handle = signals.handle();
        let received = Arc::new(AtomicI32::new(0));
        let got = received.clone();
        let socket: PathBuf = socket.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("cutline-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    let name = StopSignal(sig).name();
                    if got.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                        tracing::warn!(
                            event = "signal",
                            signal = name,
                            "{name}: stopping the job without a further checkpoint (send it again to exit at once)"
                        );
                        control.stop();
                    } else {
                        eprintln!("cutline: {name} again: exiting at once; run the same command again to resume from the latest checkpoint");
                        let _ = std::fs::remove_file(&socket);
                        std::process::exit(128 + sig);
                    }
                }
            })
            .context("cannot start the signal thread")?;
        Ok(StopOnSignal { handle, thread: Some(thread), received })
    }

    /// The signal that stopped the job, if one did.
    pub(crate) fn received(&self) -> Option<StopSignal> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            s => Some(StopSignal(s)),
        }
    }
}

impl Drop for StopOnSignal {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Passes every SIGTERM and SIGINT to a launch's stop requests (the launcher forwards them to the
/// coordinator). Dropping it stops the watching thread.
pub(crate) struct Forwarder {
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forwarder {
    pub(crate) fn install(stop: Arc<cutline::cluster::launch::StopRequests>) -> Result<Forwarder> {
        let mut signals = Signals::new([SIGTERM, SIGINT]).context("cannot handle SIGTERM and SIGINT")?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("cutline-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    stop.request(sig);
                }
            })
            .context("cannot start the signal thread")?;
        Ok(Forwarder { handle, thread: Some(thread) })
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
