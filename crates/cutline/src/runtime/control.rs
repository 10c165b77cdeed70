//! Controlling a running job: [`JobControl`] (settings, savepoints, metrics, stop) and [`JobHandle`]
//! (wait for it), with [`spawn`] and [`run`], the entry points.

use super::config::RunConfig;
use super::error::RunError;
use super::local::{panic_message, LocalBackend};
use super::report::{JobMetrics, JobReport};
use super::run::run_on;
use super::savepoint::SavepointInfo;
use crate::dataflow::JobGraph;
use crossbeam_channel::{Receiver, Sender};
use cutline_core::coordinator::CheckpointConfig;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A request to a running job (see [`JobHandle`]).
pub(crate) enum Command {
    Stop,
    SetCheckpointConfig(CheckpointConfig, Sender<Result<(), String>>),
    UpdateCheckpointConfig(ConfigEdit, Sender<Result<CheckpointConfig, String>>),
    CheckpointConfig(Sender<CheckpointConfig>),
    Savepoint {
        stop: bool,
        target: Option<PathBuf>,
        reply: Sender<Result<SavepointInfo, String>>,
    },
    /// Metrics with up to `checkpoints` recent completed and failed checkpoints.
    Metrics {
        checkpoints: usize,
        reply: Sender<JobMetrics>,
    },
}

/// A change to the settings in force, applied on the coordinator's thread (see
/// [`JobControl::update_checkpoint_config`]).
pub(crate) type ConfigEdit = Box<dyn FnOnce(&mut CheckpointConfig) -> Result<(), String> + Send>;

/// A cloneable remote control of a running job: change settings, take savepoints, read metrics, stop.
/// Every request but a savepoint is answered within [`CONTROL_ANSWER_TIMEOUT`], or fails saying the
/// job did not answer; a savepoint request waits until the savepoint is exported or failed.
#[derive(Clone)]
pub struct JobControl {
    commands: Sender<Command>,
}

fn ended<T>(_: T) -> String {
    "the job has ended".to_string()
}

/// How long a request other than a savepoint waits for the job's coordinator to answer. It answers
/// between two events, within milliseconds, unless it is stuck (in a storage call that hangs, say):
/// then the caller hears so instead of waiting with it.
pub const CONTROL_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The answer to a request, within [`CONTROL_ANSWER_TIMEOUT`].
fn answer<T>(rx: &Receiver<T>, what: &str) -> Result<T, String> {
    rx.recv_timeout(CONTROL_ANSWER_TIMEOUT).map_err(|e| match e {
        crossbeam_channel::RecvTimeoutError::Disconnected => "the job has ended".to_string(),
        crossbeam_channel::RecvTimeoutError::Timeout => format!(
            "the job did not answer within {} s: its coordinator is busy or stuck{what}; try again",
            CONTROL_ANSWER_TIMEOUT.as_secs()
        ),
    })
}

impl JobControl {
    pub(crate) fn new(commands: Sender<Command>) -> JobControl {
        JobControl { commands }
    }

    /// Change the checkpoint settings (interval, timeout, min pause, concurrency, tolerable failures,
    /// mode, unaligned, alignment timeout and byte limit) while the job runs; they apply from the next
    /// checkpoint trigger. Invalid settings are refused with the reason, and the old ones stay.
    pub fn set_checkpoint_config(&self, config: CheckpointConfig) -> Result<(), String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::SetCheckpointConfig(config, tx)).map_err(ended)?;
        answer(&rx, " (the new settings may still apply: read them back)")?
    }

    /// Change some checkpoint settings atomically: `edit` gets the settings in force and changes what
    /// it wants, on the job's coordinator thread, so concurrent callers never undo each other's
    /// changes. Returns the settings now in force; an `edit` error or invalid result changes nothing.
    pub fn update_checkpoint_config(
        &self,
        edit: impl FnOnce(&mut CheckpointConfig) -> Result<(), String> + Send + 'static,
    ) -> Result<CheckpointConfig, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::UpdateCheckpointConfig(Box::new(edit), tx)).map_err(ended)?;
        answer(&rx, " (the change may still apply: read the settings back)")?
    }

    /// The checkpoint settings in force.
    pub fn checkpoint_config(&self) -> Result<CheckpointConfig, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::CheckpointConfig(tx)).map_err(ended)?;
        answer(&rx, "")
    }

    /// Take a savepoint now (always aligned and exactly-once) and export it to `target` (a new or
    /// empty directory; default `<RunConfig::savepoint_dir>/sp-<checkpoint id, 20 digits>`, refused
    /// when neither is set). Returns once it is exported and verified. Refused while another savepoint
    /// is in progress, while the job restarts, finishes or stops; the error says so.
    pub fn savepoint(&self, target: Option<PathBuf>) -> Result<SavepointInfo, String> {
        self.savepoint_request(false, target)
    }

    /// Take a savepoint after which the sources stop: the job drains, commits its output up to the
    /// savepoint and stops. If the savepoint fails, the job fails over and keeps running, and the
    /// error says why; if only its export fails, the job stops anyway (the savepoint is complete in
    /// the job's own store, from which running the job again resumes). Wait for the job with
    /// [`JobHandle::join`].
    pub fn stop_with_savepoint(&self, target: Option<PathBuf>) -> Result<SavepointInfo, String> {
        self.savepoint_request(true, target)
    }

    fn savepoint_request(&self, stop: bool, target: Option<PathBuf>) -> Result<SavepointInfo, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::Savepoint { stop, target, reply: tx }).map_err(ended)?;
        rx.recv().map_err(|_| "the job ended before the savepoint completed".to_string())?
    }

    /// Flow-control and checkpoint figures of the running job.
    pub fn metrics(&self) -> Result<JobMetrics, String> {
        self.metrics_with_history(super::METRICS_CHECKPOINTS)
    }

    /// [`JobControl::metrics`] listing up to `checkpoints` recent completed and failed checkpoints
    /// (at most those the run keeps: [`CHECKPOINTS_KEPT`](super::CHECKPOINTS_KEPT) completed, with
    /// those of earlier runs read back at its start, and
    /// [`FAILED_CHECKPOINTS_KEPT`](super::FAILED_CHECKPOINTS_KEPT) failed).
    pub fn metrics_with_history(&self, checkpoints: usize) -> Result<JobMetrics, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands.send(Command::Metrics { checkpoints, reply: tx }).map_err(ended)?;
        answer(&rx, "")
    }

    /// Stop the job: every task is torn down without a further checkpoint. Output committed so far
    /// stays; running the job again on the same store resumes from its latest complete checkpoint.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
    }
}

/// A job running on a background thread: control it (see [`JobControl`], which it dereferences to)
/// and wait for it.
pub struct JobHandle {
    control: JobControl,
    thread: JoinHandle<Result<JobReport, RunError>>,
}

impl std::ops::Deref for JobHandle {
    type Target = JobControl;
    fn deref(&self) -> &JobControl {
        &self.control
    }
}

impl JobHandle {
    pub(crate) fn new(control: JobControl, thread: JoinHandle<Result<JobReport, RunError>>) -> JobHandle {
        JobHandle { control, thread }
    }

    /// A cloneable control for other threads (an admin socket, for example).
    pub fn control(&self) -> JobControl {
        self.control.clone()
    }

    /// Has the job ended (finished, stopped or failed)?
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Wait for the job to end.
    pub fn join(self) -> Result<JobReport, RunError> {
        match self.thread.join() {
            Ok(r) => r,
            Err(p) => Err(RunError::Internal(format!("the job's coordinator panicked: {}", panic_message(&*p)))),
        }
    }
}

/// Start `graph` on a background thread; see [`run`] for what it does.
///
/// # Panics
/// If the operating system cannot start the thread.
pub fn spawn(graph: JobGraph, cfg: RunConfig) -> JobHandle {
    let (tx, rx) = crossbeam_channel::unbounded();
    let thread = std::thread::Builder::new()
        .name(format!("cutline-{}", graph.name()))
        .spawn(move || run_with(&graph, cfg, &rx))
        .expect("spawn the job thread");
    JobHandle { control: JobControl { commands: tx }, thread }
}

/// Run `graph` to completion with checkpoints and recovery. Starting again on the same store after the
/// process died resumes from the latest complete checkpoint. Use [`spawn`] to control a running job.
pub fn run(graph: &JobGraph, cfg: RunConfig) -> Result<JobReport, RunError> {
    let (_tx, rx) = crossbeam_channel::unbounded();
    run_with(graph, cfg, &rx)
}

fn run_with(graph: &JobGraph, cfg: RunConfig, commands: &Receiver<Command>) -> Result<JobReport, RunError> {
    run_on(graph, cfg, commands, &mut LocalBackend::default())
}

/// Wait `delay` before a restart, answering commands meanwhile (settings and savepoints are refused
/// while the job restarts). `true` if a stop was requested.
pub(crate) fn wait_answering(commands: &Receiver<Command>, delay: Duration, idle: &JobMetrics) -> bool {
    let until = Instant::now() + delay;
    loop {
        match commands.recv_deadline(until) {
            Ok(Command::Stop) => return true,
            Ok(Command::SetCheckpointConfig(_, reply)) => {
                let _ = reply.send(Err("the job is restarting; try again".into()));
            }
            Ok(Command::UpdateCheckpointConfig(_, reply)) => {
                let _ = reply.send(Err("the job is restarting; try again".into()));
            }
            Ok(Command::CheckpointConfig(reply)) => {
                let _ = reply.send(idle.config.clone());
            }
            Ok(Command::Savepoint { reply, .. }) => {
                let _ = reply.send(Err("the job is restarting; try again".into()));
            }
            Ok(Command::Metrics { checkpoints, reply }) => {
                let mut m = idle.clone();
                m.checkpoints.drain(..m.checkpoints.len().saturating_sub(checkpoints));
                m.failed.drain(..m.failed.len().saturating_sub(checkpoints));
                let _ = reply.send(m);
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(until.saturating_duration_since(Instant::now()));
                return false;
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => return false,
        }
    }
}
