//! A cluster of `cutline` processes on loopback for a scenario: a coordinator (`cutline run ...
//! --coordinator`) and worker processes, each logging into the scenario's scratch directory
//! (`coordinator.log`, `worker-<i>.log`), killed when the scenario ends; and a chaos loop that
//! SIGKILLs them at seeded moments and starts them again.

use super::{cutline, restored_checkpoints, signal, wait_until, Scratch, XorShift};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

pub const SECRET: &str = "cluster-test-secret-0123456789abcdef";

pub struct Cluster<'a> {
    pub s: &'a Scratch,
    pub addr: String,
    coordinator_args: Vec<String>,
    /// Extra arguments of every worker.
    worker_args: Vec<String>,
    pub coordinator: Child,
    pub workers: Vec<Child>,
}

impl<'a> Cluster<'a> {
    /// `job` is a `cutline run` command line without the cluster flags (`run wordcount --input ...
    /// --output ... --state ...` and the job's settings): it gets `--coordinator`, `--workers`, the
    /// secret (written to `secret` in the scratch directory), 50 ms heartbeats and a 1 s timeout.
    pub fn start(s: &'a Scratch, workers: usize, job: &[String]) -> Cluster<'a> {
        Cluster::start_with(s, workers, job, &[])
    }

    /// [`Cluster::start`], with `worker_args` on every worker's command line.
    pub fn start_with(s: &'a Scratch, workers: usize, job: &[String], worker_args: &[&str]) -> Cluster<'a> {
        s.write("secret", SECRET);
        let addr = super::free_port();
        let mut coordinator_args = job.to_vec();
        coordinator_args.extend(
            [
                "--coordinator",
                &addr,
                "--workers",
                &workers.to_string(),
                "--secret-file",
                &s.arg("secret"),
                "--heartbeat-interval",
                "50ms",
                "--heartbeat-timeout",
                "1s",
                "-v",
            ]
            .map(String::from),
        );
        let coordinator = cutline()
            .args(&coordinator_args)
            .stdout(s.log("coordinator"))
            .stderr(s.log("coordinator"))
            .spawn()
            .unwrap();
        let worker_args = worker_args.iter().map(|a| a.to_string()).collect();
        let mut c = Cluster { s, addr, coordinator_args, worker_args, coordinator, workers: Vec::new() };
        for i in 0..workers {
            let w = c.start_worker(i, &[]);
            c.workers.push(w);
        }
        c
    }

    /// Worker `i` (its log is `worker-<i>.log`); `extra` goes to its command line.
    pub fn start_worker(&self, i: usize, extra: &[String]) -> Child {
        cutline()
            .args(["worker", "--join", &self.addr, "--secret-file", &self.s.arg("secret"), "-v"])
            .args(["--rejoin-timeout", "30s"])
            .args(&self.worker_args)
            .args(extra)
            .stdout(self.s.log(&format!("worker-{i}")))
            .stderr(self.s.log(&format!("worker-{i}")))
            .spawn()
            .unwrap()
    }

    pub fn restart_coordinator(&mut self) {
        self.coordinator = cutline()
            .args(&self.coordinator_args)
            .stdout(self.s.log("coordinator"))
            .stderr(self.s.log("coordinator"))
            .spawn()
            .unwrap();
    }

    /// Start again, without extra flags, every worker that killed itself at a fault point (it died
    /// of SIGKILL; one that exited by itself stays down); their indexes.
    pub fn restart_killed_workers(&mut self) -> Vec<usize> {
        let mut restarted = Vec::new();
        for i in 0..self.workers.len() {
            if let Some(st) = self.workers[i].try_wait().unwrap() {
                if st.signal() == Some(9) {
                    self.workers[i] = self.start_worker(i, &[]);
                    restarted.push(i);
                }
            }
        }
        restarted
    }

    /// Wait for the coordinator to exit by itself (the job's verdict), restarting workers that die
    /// meanwhile.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let what = format!("the job to finish; logs in {}", self.s.dir.display());
        wait_until(&what, limit, || {
            self.restart_killed_workers();
            self.coordinator.try_wait().unwrap()
        })
    }

    /// Wait (bounded) until the coordinator logged `n` completed checkpoints.
    pub fn wait_for_checkpoints(&self, n: usize, limit: Duration) {
        let what = format!("{n} checkpoints; logs in {}", self.s.dir.display());
        wait_until(&what, limit, || {
            (super::count(&self.s.events("coordinator"), "checkpoint_complete") >= n).then_some(())
        });
    }

    /// Chaos: `rounds` times, sleep a seeded `delay_ms` and SIGKILL a seeded victim (a worker or the
    /// coordinator) and start it again. With `aimed` fault points, odd rounds kill a worker and
    /// start it with `--kill-self-at POINT:N` (a point of `aimed`; N in 1..=3, 1 for
    /// `sink-recover`), so that it kills itself exactly there, e.g. in a sink's commit window; the
    /// next round first waits (at most `SELF_KILL_WAIT`) until it did, and starts it again without
    /// the flag. Stops early when the job finished; what was killed, in order.
    pub fn chaos(&mut self, rng: &mut XorShift, rounds: u32, delay_ms: (u64, u64), aimed: &[&str]) -> Vec<String> {
        let mut killed = Vec::new();
        let mut aimed_at: Option<usize> = None;
        for round in 0..rounds {
            std::thread::sleep(Duration::from_millis(rng.range(delay_ms.0, delay_ms.1)));
            if let Some(i) = aimed_at.take() {
                let deadline = Instant::now() + SELF_KILL_WAIT;
                while Instant::now() < deadline
                    && self.workers[i].try_wait().unwrap().is_none()
                    && self.coordinator.try_wait().unwrap().is_none()
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            if self.coordinator.try_wait().unwrap().is_some() {
                break; // finished early
            }
            for i in self.restart_killed_workers() {
                killed.push(format!("round {round}: worker {i} killed itself"));
            }
            let aim = !aimed.is_empty() && round % 2 == 1;
            let last = if aim { self.workers.len() - 1 } else { self.workers.len() };
            let victim = rng.range(0, last as u64) as usize;
            if victim == self.workers.len() {
                signal(&self.coordinator, "-KILL");
                self.coordinator.wait().unwrap();
                killed.push(format!("round {round}: coordinator"));
                self.restart_coordinator();
            } else {
                signal(&self.workers[victim], "-KILL");
                self.workers[victim].wait().unwrap();
                let mut extra = vec![];
                if aim {
                    let point = *rng.pick(aimed);
                    let n = if point == "sink-recover" { 1 } else { rng.range(1, 3) };
                    extra = vec!["--kill-self-at".into(), format!("{point}:{n}")];
                    aimed_at = Some(victim);
                }
                killed.push(format!("round {round}: worker {victim} {}", extra.join(" ")).trim_end().to_string());
                self.workers[victim] = self.start_worker(victim, &extra);
            }
        }
        killed
    }
}

/// The drill of an exactly-once sink on two workers: `job` (a `cutline run` command line without
/// the cluster flags) runs on a cluster of 2; once its first checkpoint completed, 8 chaos rounds
/// 0.9-2.2 s apart kill workers and the coordinator, every other killed worker aimed at a step of
/// the sink's protocol (`SINK_STEPS`). Panics unless the job then finished, most kills landed, a
/// checkpoint was restored and a worker killed itself at its step; the kills and the restored
/// checkpoints.
pub fn sink_chaos(scratch: &Scratch, job: &[String], seed: u64) -> (Vec<String>, Vec<u64>) {
    let mut rng = XorShift::new(seed);
    let mut c = Cluster::start(scratch, 2, job);
    // A generation takes about a second to deploy (the sinks fence and recover): kills are spaced
    // so that most land once it runs, after the first checkpoint.
    c.wait_for_checkpoints(1, Duration::from_secs(60));
    let killed = c.chaos(&mut rng, 8, (900, 2200), &super::drill::SINK_STEPS);
    let status = c.wait(Duration::from_secs(180));
    assert!(
        status.success(),
        "the coordinator failed ({status}) after kills {killed:?}; logs in {}",
        scratch.dir.display()
    );
    let restored = restored_checkpoints(&scratch.events("coordinator"));
    assert!(killed.len() >= 5, "the job finished before most kills ({killed:?}): make it longer");
    assert!(!restored.is_empty(), "no generation restored a checkpoint after kills {killed:?}");
    assert!(
        killed.iter().any(|k| k.ends_with("killed itself")),
        "no worker killed itself at a step of the sink's protocol: {killed:?}"
    );
    (killed, restored)
}

/// Longest a chaos round waits for a worker started with `--kill-self-at` to reach its point.
pub const SELF_KILL_WAIT: Duration = Duration::from_secs(15);

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        let _ = self.coordinator.kill();
        let _ = self.coordinator.wait();
        for w in &mut self.workers {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}
