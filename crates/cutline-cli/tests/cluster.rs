//! Multi-process scenarios of the `cutline` binary: a coordinator and worker processes on loopback.
//!
//! - A local cluster (`cutline cluster`) counts words exactly.
//! - Chaos: a three-worker job whose workers and coordinator are SIGKILLed many times, at seeded
//!   random moments, and restarted; the committed output must equal that of a run without failures.
//! - A hung worker (SIGSTOP) is detected by its missing heartbeats and the job restarts on the live
//!   workers; when it resumes, it finds its coordinator gone and joins again.
//! - Peers that do not hold the cluster secret, and bytes that are not cutline frames, are refused
//!   with a log line and do not disturb the job.
//!
//! Every loop is bounded in time. The seed is in every failure message; to try another one:
//! `CUTLINE_CHAOS_SEED=7 cargo test --release -p cutline --test cluster`. A failing scenario keeps its
//! scratch directory (with every process's log) and prints where it is.

#![cfg(unix)]

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cutline");
const SECRET: &str = "cluster-test-secret-0123456789abcdef";
/// Hard bound on one scenario.
const SCENARIO_TIME_LIMIT: Duration = Duration::from_secs(150);

struct XorShift(u64);
impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

fn seed() -> u64 {
    std::env::var("CUTLINE_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(42)
}

/// A scratch directory with an input text, kept (and printed) if the scenario fails.
struct Scratch {
    dir: PathBuf,
    text: String,
    keep: bool,
}

impl Scratch {
    fn new(name: &str, seed: u64, lines: usize, vocabulary: u64) -> Scratch {
        let dir = std::env::temp_dir().join(format!("cutline-cluster-{name}-{}-{seed}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut rng = XorShift::new(seed);
        let mut text = String::new();
        for _ in 0..lines {
            for k in 0..8 {
                if k > 0 {
                    text.push(' ');
                }
                text.push_str(&format!("w{}", rng.range(0, vocabulary - 1)));
            }
            text.push('\n');
        }
        std::fs::write(dir.join("input.txt"), &text).unwrap();
        std::fs::write(dir.join("secret"), SECRET).unwrap();
        Scratch { dir, text, keep: true }
    }
    fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p)
    }
    fn log(&self, name: &str) -> Stdio {
        Stdio::from(File::options().create(true).append(true).open(self.dir.join(format!("{name}.log"))).unwrap())
    }
    fn check_output(&mut self, what: &str) {
        let problems = cutline_cli::jobs::check_wordcount_output(&self.text, &self.path("out")).unwrap();
        assert!(
            problems.is_empty(),
            "{what}: output differs from a failure-free run: {problems:#?}; logs in {}",
            self.dir.display()
        );
        self.keep = false;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("scenario scratch kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

struct Cluster<'a> {
    s: &'a Scratch,
    addr: String,
    coordinator_args: Vec<String>,
    coordinator: Child,
    workers: Vec<Child>,
}

impl<'a> Cluster<'a> {
    fn start(s: &'a Scratch, workers: usize, extra: &[&str]) -> Cluster<'a> {
        let addr = free_port();
        let mut coordinator_args: Vec<String> = [
            "run",
            "wordcount",
            "--input",
            s.path("input.txt").to_str().unwrap(),
            "--output",
            s.path("out").to_str().unwrap(),
            "--state",
            s.path("state").to_str().unwrap(),
            "--coordinator",
            &addr,
            "--workers",
            &workers.to_string(),
            "--secret-file",
            s.path("secret").to_str().unwrap(),
            "--heartbeat-interval",
            "50ms",
            "--heartbeat-timeout",
            "1s",
            "-v",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        coordinator_args.extend(extra.iter().map(|a| a.to_string()));
        let coordinator = Command::new(BIN)
            .args(&coordinator_args)
            .stdout(s.log("coordinator"))
            .stderr(s.log("coordinator"))
            .spawn()
            .unwrap();
        let mut c = Cluster { s, addr, coordinator_args, coordinator, workers: Vec::new() };
        for i in 0..workers {
            let w = c.start_worker(i);
            c.workers.push(w);
        }
        c
    }
    fn start_worker(&self, i: usize) -> Child {
        Command::new(BIN)
            .args(["worker", "--join", &self.addr, "--secret-file", self.s.path("secret").to_str().unwrap()])
            .args(["--rejoin-timeout", "30s"])
            .stdout(self.s.log(&format!("worker-{i}")))
            .stderr(self.s.log(&format!("worker-{i}")))
            .spawn()
            .unwrap()
    }
    fn restart_coordinator(&mut self) {
        self.coordinator = Command::new(BIN)
            .args(&self.coordinator_args)
            .stdout(self.s.log("coordinator"))
            .stderr(self.s.log("coordinator"))
            .spawn()
            .unwrap();
    }
    /// Wait for the coordinator to exit by itself; the job's verdict.
    fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.coordinator.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "the job did not finish within {limit:?}; logs in {}",
                self.s.dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

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

fn signal(child: &Child, sig: &str) {
    let st = Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(st.success(), "kill {sig} failed");
}

fn log_text(s: &Scratch, name: &str) -> String {
    std::fs::read_to_string(s.path(&format!("{name}.log"))).unwrap_or_default()
}

#[test]
fn a_local_cluster_of_two_workers_counts_words_exactly() {
    let mut s = Scratch::new("local", seed(), 20_000, 300);
    let out = Command::new(BIN)
        .args(["cluster", "--workers", "2", "wordcount", "--input"])
        .arg(s.path("input.txt"))
        .arg("--output")
        .arg(s.path("out"))
        .arg("--state")
        .arg(s.path("state"))
        .args(["--parallelism", "3", "--checkpoint-interval", "50ms"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "cutline cluster failed: {stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("finished: final checkpoint"), "{stdout}");
    // The launcher made a secret readable by its user only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(s.path("state/cluster.secret")).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "the generated secret is private");
    s.check_output("local cluster");
}

#[test]
fn chaos_sigkill_workers_and_the_coordinator_many_times_and_the_output_is_exact() {
    chaos("chaos", &[]);
}

/// The same with unaligned checkpoints: barriers overtake what is queued at each receiving task
/// (records in flight on the network are not overtaken, see ARCHITECTURE.md), and that channel state
/// is restored after each kill.
#[test]
fn chaos_with_unaligned_checkpoints_and_the_output_is_exact() {
    chaos("chaos-unaligned", &["--unaligned"]);
}

fn chaos(name: &str, _extra: &[&str]) {
    let seed = seed();
    let started = Instant::now();
    let mut s = Scratch::new(name, seed, 60_000, 500);
    let mut rng = XorShift::new(seed ^ 0xC4A05);
    {
        // Paced (250 us per line: about 5 s of work per subtask) so that the kills land mid-run.
        let mut c = Cluster::start(
            &s,
            3,
            &[
                "--parallelism",
                "3",
                "--checkpoint-interval",
                "30ms",
                "--line-delay-us",
                "250",
                "--replacement-wait",
                "3s",
            ],
        );
        let rounds = 12;
        let mut killed = Vec::new();
        for round in 0..rounds {
            std::thread::sleep(Duration::from_millis(rng.range(150, 700)));
            if c.coordinator.try_wait().unwrap().is_some() {
                break; // finished early
            }
            let victim = rng.range(0, 3);
            if victim == 3 {
                signal(&c.coordinator, "-KILL");
                c.coordinator.wait().unwrap();
                killed.push(format!("round {round}: coordinator"));
                c.restart_coordinator();
            } else {
                let i = victim as usize;
                signal(&c.workers[i], "-KILL");
                c.workers[i].wait().unwrap();
                killed.push(format!("round {round}: worker {i}"));
                c.workers[i] = c.start_worker(i);
            }
        }
        let st = c.wait(SCENARIO_TIME_LIMIT.saturating_sub(started.elapsed()));
        assert!(
            st.success(),
            "seed {seed}: the coordinator failed ({st}) after kills {killed:?}; logs in {}",
            s.dir.display()
        );
        eprintln!("seed {seed}: kills {killed:?}");
        let log = log_text(&s, "coordinator");
        assert!(log.contains(": restoring checkpoint"), "seed {seed}: no restore from a checkpoint happened: {log}");
        assert!(killed.len() >= 8, "seed {seed}: the job finished before most kills ({killed:?}): make it longer");
    }
    s.check_output(&format!("seed {seed}"));
}

#[test]
fn a_hung_worker_is_detected_and_the_job_restarts_on_the_live_workers() {
    let mut s = Scratch::new("hung", seed(), 30_000, 300);
    {
        let mut c = Cluster::start(
            &s,
            2,
            &[
                "--parallelism",
                "2",
                "--checkpoint-interval",
                "50ms",
                "--line-delay-us",
                "50",
                "--replacement-wait",
                "500ms",
            ],
        );
        // Let it run, then freeze worker 1 for longer than the heartbeat timeout.
        std::thread::sleep(Duration::from_millis(800));
        signal(&c.workers[1], "-STOP");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !log_text(&s, "coordinator").contains("no heartbeat for more than") {
            assert!(Instant::now() < deadline, "the hung worker was not detected; logs in {}", s.dir.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        while !log_text(&s, "coordinator").contains("running on 1 of 2 workers") {
            assert!(Instant::now() < deadline, "no restart on the live worker; logs in {}", s.dir.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        signal(&c.workers[1], "-CONT");
        let st = c.wait(Duration::from_secs(90));
        assert!(st.success(), "the job failed: {st}; logs in {}", s.dir.display());
        // The resumed worker found its coordinator connection dead and stopped its old tasks.
        let w1 = log_text(&s, "worker-1");
        assert!(w1.contains("lost its coordinator") || w1.contains("worker exits"), "worker 1 log: {w1}");
    }
    s.check_output("hung worker");
}

#[test]
fn peers_without_the_secret_and_garbage_bytes_are_refused_without_disturbing_the_job() {
    let mut s = Scratch::new("auth", seed(), 20_000, 200);
    {
        let mut c = Cluster::start(&s, 1, &["--parallelism", "2", "--line-delay-us", "200"]);
        // A worker with the wrong secret.
        std::fs::write(s.path("wrong"), "not-the-cluster-secret-at-all-000").unwrap();
        let mut intruder = Command::new(BIN)
            .args(["worker", "--join", &c.addr, "--secret-file", s.path("wrong").to_str().unwrap()])
            .args(["--rejoin-timeout", "1s"])
            .stdout(s.log("intruder"))
            .stderr(s.log("intruder"))
            .spawn()
            .unwrap();
        // Garbage on the coordinator's port: an HTTP request, and a frame header announcing 4 GiB.
        for bytes in
            [&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &[b'C', b'U', b'T', b'L', 0, 1, 251, 0, 255, 255, 255, 255][..]]
        {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut t = loop {
                match std::net::TcpStream::connect(&c.addr) {
                    Ok(t) => break t,
                    Err(e) => assert!(Instant::now() < deadline, "the coordinator does not listen: {e}"),
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = t.write_all(bytes);
            let mut sink = Vec::new();
            let _ = t.read_to_end(&mut sink); // the coordinator closes the connection
        }
        // `cutline status` on the coordinator shows the workers' tasks and channels (from heartbeats).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = Command::new(BIN).args(["status", "--state"]).arg(s.path("state")).output().unwrap();
            let text = String::from_utf8_lossy(&st.stdout).to_string();
            if text.contains("lines#1->counts#0") && text.contains("counts#1  backpressured") {
                break;
            }
            assert!(Instant::now() < deadline, "status never showed the workers' tasks: {text}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while intruder.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the intruder kept running");
            std::thread::sleep(Duration::from_millis(50));
        }
        let st = c.wait(Duration::from_secs(90));
        assert!(st.success(), "the job failed: {st}");
        let log = log_text(&s, "coordinator");
        assert!(log.contains("refused a connection"), "no refusal logged: {log}");
        assert!(log.contains("wrong cluster secret") || log.contains("secret"), "{log}");
        assert!(!log.contains(SECRET), "the secret must never be logged");
        let intruder_log = log_text(&s, "intruder");
        assert!(intruder_log.contains("rejected"), "intruder log: {intruder_log}");
    }
    s.check_output("auth");
}

#[test]
fn a_worker_without_a_secret_or_with_a_bad_address_is_refused_with_advice() {
    let out =
        Command::new(BIN).args(["worker", "--join", "127.0.0.1:1"]).env_remove("CUTLINE_SECRET_FILE").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--secret-file") && err.contains("urandom"), "{err}");
    // A coordinator address without a port is refused at once, not retried.
    let t = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let out = Command::new(BIN)
        .args(["worker", "--join", "coordinator-host", "--secret-file"])
        .arg(dir.path().join("secret"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("HOST:PORT"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "refused at once, not after the rejoin timeout");
}

/// Checkpoints on a real S3-compatible server (started by `scripts/test`): a worker and the
/// coordinator are SIGKILLed mid-run, the restarted coordinator finds the latest complete checkpoint
/// in the bucket, and the output is exact.
#[cfg(feature = "s3")]
#[test]
fn checkpoints_on_s3_survive_a_killed_worker_and_a_killed_coordinator() {
    let endpoint = std::env::var("CUTLINE_S3_ENDPOINT")
        .expect("CUTLINE_S3_ENDPOINT is not set: run the tests through scripts/test, which starts an S3 server");
    let bucket = std::env::var("CUTLINE_S3_BUCKET").unwrap_or_else(|_| "cutline-test".into());
    let mut s = Scratch::new("s3", seed(), 30_000, 300);
    let url = format!("s3://{bucket}/cluster-{}-{}", std::process::id(), seed());
    {
        let mut c = Cluster::start(
            &s,
            2,
            &[
                "--parallelism",
                "2",
                "--checkpoint-interval",
                "50ms",
                "--line-delay-us",
                "200",
                "--checkpoint-store",
                &url,
            ],
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while log_text(&s, "coordinator").matches(" complete in ").count() < 3 {
            assert!(Instant::now() < deadline, "no checkpoints on {endpoint}; logs in {}", s.dir.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        signal(&c.workers[0], "-KILL");
        c.workers[0].wait().unwrap();
        c.workers[0] = c.start_worker(0);
        std::thread::sleep(Duration::from_millis(700));
        signal(&c.coordinator, "-KILL");
        c.coordinator.wait().unwrap();
        c.restart_coordinator();
        let st = c.wait(Duration::from_secs(90));
        assert!(st.success(), "the job failed: {st}; logs in {}", s.dir.display());
        let log = log_text(&s, "coordinator");
        assert!(log.contains(": restoring checkpoint"), "the restarted coordinator restored nothing: {log}");
    }
    s.check_output("checkpoints on S3");
}

/// A savepoint taken from a cluster restores anywhere: stop a two-worker job with a savepoint, then
/// finish it embedded in one process from that savepoint; the output is exact.
#[test]
fn a_cluster_stopped_with_a_savepoint_resumes_in_one_process() {
    let mut s = Scratch::new("savepoint", seed(), 30_000, 300);
    {
        let mut c =
            Cluster::start(&s, 2, &["--parallelism", "2", "--checkpoint-interval", "50ms", "--line-delay-us", "200"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while log_text(&s, "coordinator").matches(" complete in ").count() < 3 {
            assert!(Instant::now() < deadline, "no checkpoints; logs in {}", s.dir.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = Command::new(BIN).args(["savepoint", "--stop", "--state"]).arg(s.path("state")).output().unwrap();
        assert!(out.status.success(), "savepoint --stop failed: {}", String::from_utf8_lossy(&out.stderr));
        let sp = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(Path::new(&sp).is_dir(), "savepoint directory {sp:?}");
        let st = c.wait(Duration::from_secs(30));
        assert!(st.success(), "the coordinator failed: {st}");
        assert!(log_text(&s, "coordinator").contains("stopped with savepoint"), "{}", log_text(&s, "coordinator"));
        // The workers were told the job is over.
        for (i, w) in c.workers.iter_mut().enumerate() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while w.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "worker {i} did not exit");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let problems = cutline_cli::jobs::check_wordcount_output(&s.text, &s.path("out")).unwrap();
        assert!(!problems.is_empty(), "stopped early, yet the output is complete");
        // Resume embedded, on a fresh state directory, from the savepoint.
        let out = Command::new(BIN)
            .args(["run", "wordcount", "--input"])
            .arg(s.path("input.txt"))
            .arg("--output")
            .arg(s.path("out"))
            .arg("--state")
            .arg(s.path("state2"))
            .args(["--parallelism", "2", "--from-savepoint", &sp])
            .output()
            .unwrap();
        assert!(out.status.success(), "resume failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    s.check_output("savepoint from a cluster");
}

/// CPU ticks (user + system) a process has used so far, from /proc.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) are space-separated; utime and stime
    // are fields 14 and 15 of the whole line.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split(' ').collect();
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

#[test]
fn a_worker_without_tasks_sleeps_instead_of_spinning_regression_idle_spin() {
    // With more workers than subtasks, a worker got no tasks and its loop spun on a closed channel.
    let mut s = Scratch::new("idle", seed(), 20_000, 100);
    {
        let mut c = Cluster::start(&s, 2, &["--parallelism", "1", "--line-delay-us", "150"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while log_text(&s, "coordinator").matches(" complete in ").count() < 2 {
            assert!(Instant::now() < deadline, "no checkpoints; logs in {}", s.dir.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        let before: Vec<u64> = c.workers.iter().map(|w| cpu_ticks(w.id())).collect();
        std::thread::sleep(Duration::from_millis(1000));
        let used: Vec<u64> = c.workers.iter().zip(&before).map(|(w, b)| cpu_ticks(w.id()).saturating_sub(*b)).collect();
        // One worker runs the paced job (mostly asleep); the other has nothing to do. Neither may
        // use half a core (1 s is 100 ticks); a spinning loop uses all of one.
        assert!(used.iter().all(|t| *t < 50), "a worker used {used:?} CPU ticks in 1 s");
        let st = c.wait(Duration::from_secs(60));
        assert!(st.success(), "the job failed: {st}");
    }
    s.check_output("idle worker");
}
