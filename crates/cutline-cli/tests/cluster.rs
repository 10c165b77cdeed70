//! Multi-process scenarios of the `cutline` binary: a coordinator and worker processes on loopback.
//!
//! - A local cluster (`cutline cluster`) counts words exactly.
//! - Chaos: a three-worker job whose workers and coordinator are SIGKILLed many times, at seeded
//!   random moments, and restarted; the committed output must equal that of a run without failures,
//!   the coordinator must have restored a checkpoint, and its checkpoints must be unaligned exactly
//!   when the run asks for it.
//! - A hung worker (SIGSTOP) is detected by its missing heartbeats and the job restarts on the live
//!   workers; when it resumes, it finds its coordinator gone and joins again.
//! - Peers that do not hold the cluster secret, and bytes that are not cutline frames, are refused
//!   with a `connection_refused` event naming the reason, and do not disturb the job.
//! - A cluster killed whole resumes at another parallelism on another number of workers.
//!
//! Every process logs JSON events (`CUTLINE_LOG_FORMAT=json`); the assertions read their fields
//! (tests/common).
//!
//! Every loop is bounded in time. The seed is in every failure message; to try another one:
//! `CUTLINE_CHAOS_SEED=7 cargo test --release -p cutline-cli --test cluster`. A failing scenario keeps its
//! scratch directory (with every process's log) and prints where it is.

#![cfg(unix)]

mod common;

use common::cluster::{Cluster, SECRET};
use common::{check_output, cutline, named, periodic_checkpoints, restored_checkpoints, signal};
use common::{summary, word_lines, LogEvent, Scratch, XorShift};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Hard bound on one scenario.
const SCENARIO_TIME_LIMIT: Duration = Duration::from_secs(150);

fn seed() -> u64 {
    std::env::var("CUTLINE_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(42)
}

/// A scratch directory with an input text of `lines` lines of 8 words and the cluster secret.
struct Scenario {
    s: Scratch,
    text: String,
}

impl Scenario {
    fn new(name: &str, seed: u64, lines: usize, vocabulary: u64) -> Scenario {
        let s = Scratch::new(&format!("cluster-{name}-{seed}"));
        let text = word_lines(seed, lines, (8, 8), vocabulary);
        s.write("input.txt", &text);
        s.write("secret", SECRET);
        Scenario { s, text }
    }
    fn check_output(&self, what: &str) {
        check_output(&self.text, &self.s.path("out"), what, &self.s.dir);
    }
    /// The coordinator's events so far.
    fn coordinator_events(&self) -> Vec<LogEvent> {
        self.s.events("coordinator")
    }
    /// Wait (bounded) until the coordinator completed `n` checkpoints.
    fn wait_for_checkpoints(&self, n: usize, limit: Duration) {
        common::wait_until(&format!("{n} checkpoints; logs in {}", self.s.dir.display()), limit, || {
            (common::count(&self.coordinator_events(), "checkpoint_complete") >= n).then_some(())
        });
    }
}

/// The word count of the scenario's `input.txt` into `out` on `workers` workers; `extra` goes to the
/// coordinator's command line.
fn wordcount_cluster<'a>(s: &'a Scratch, workers: usize, extra: &[&str]) -> Cluster<'a> {
    let mut job: Vec<String> =
        ["run", "wordcount", "--input", &s.arg("input.txt"), "--output", &s.arg("out"), "--state", &s.arg("state")]
            .map(String::from)
            .to_vec();
    job.extend(extra.iter().map(|a| a.to_string()));
    Cluster::start(s, workers, &job)
}

#[test]
fn a_local_cluster_of_two_workers_counts_words_exactly() {
    let sc = Scenario::new("local", seed(), 20_000, 300);
    let s = &sc.s;
    let out = cutline()
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
    sc.check_output("local cluster");
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

/// Twelve rounds: sleep a seeded 150-700 ms, SIGKILL a seeded victim (one of three workers or the
/// coordinator) and start it again. `extra` goes to the coordinator's command line; the checkpoints
/// the coordinator logged must be what it asks for (unaligned with `--unaligned`, aligned without).
fn chaos(name: &str, extra: &[&str]) {
    let seed = seed();
    let unaligned = extra.contains(&"--unaligned");
    let started = Instant::now();
    let sc = Scenario::new(name, seed, 60_000, 500);
    let s = &sc.s;
    let mut rng = XorShift::new(seed ^ 0xC4A05);
    {
        // Paced (250 us per line: about 5 s of work per subtask) so that the kills land mid-run.
        let mut args = vec![
            "--parallelism",
            "3",
            "--checkpoint-interval",
            "30ms",
            "--line-delay-us",
            "250",
            "--replacement-wait",
            "3s",
        ];
        args.extend_from_slice(extra);
        let mut c = wordcount_cluster(s, 3, &args);
        let killed = c.chaos(&mut rng, 12, (150, 700), &[]);
        let st = c.wait(SCENARIO_TIME_LIMIT.saturating_sub(started.elapsed()));
        assert!(
            st.success(),
            "seed {seed}: the coordinator failed ({st}) after kills {killed:?}; logs in {}",
            s.dir.display()
        );
        let ev = sc.coordinator_events();
        let restored = restored_checkpoints(&ev);
        let periodic = periodic_checkpoints(&ev);
        let with_unaligned = periodic.iter().filter(|e| e.need_u64("unaligned_tasks") > 0).count();
        eprintln!(
            "seed {seed}: kills {killed:?}; restored {restored:?}; {} periodic checkpoints, {with_unaligned} with unaligned tasks",
            periodic.len()
        );
        assert!(!restored.is_empty(), "seed {seed}: no restore from a checkpoint happened: {}", summary(&ev));
        assert!(killed.len() >= 8, "seed {seed}: the job finished before most kills ({killed:?}): make it longer");
        // With --unaligned the coordinator marks every barrier unaligned, so every task with inputs
        // snapshots unaligned at every checkpoint; without it, none does.
        let want = if unaligned { periodic.len() } else { 0 };
        assert_eq!(
            with_unaligned,
            want,
            "seed {seed}: unaligned={unaligned}, yet {with_unaligned} of {} checkpoints had unaligned tasks; logs in {}",
            periodic.len(),
            s.dir.display()
        );
        assert!(periodic.len() >= 10, "seed {seed}: only {} checkpoints completed", periodic.len());
    }
    sc.check_output(&format!("seed {seed}"));
}

#[test]
fn a_hung_worker_is_detected_and_the_job_restarts_on_the_live_workers() {
    let sc = Scenario::new("hung", seed(), 30_000, 300);
    let s = &sc.s;
    {
        let mut c = wordcount_cluster(
            s,
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
        let limit = Duration::from_secs(20);
        let lost = common::wait_until("the coordinator to lose the hung worker", limit, || {
            let ev = sc.coordinator_events();
            let lost = named(&ev, "worker_lost").find(|e| e.str("reason").is_some_and(|r| r.contains("no heartbeat")));
            lost.cloned()
        });
        common::wait_until("a restart on the live worker", limit, || {
            let ev = sc.coordinator_events();
            let fewer = named(&ev, "fewer_workers").any(|e| e.message().contains("running on 1 of 2 workers"));
            fewer.then_some(())
        });
        std::thread::sleep(Duration::from_millis(500));
        signal(&c.workers[1], "-CONT");
        let st = c.wait(Duration::from_secs(90));
        assert!(st.success(), "the job failed: {st}; logs in {}", s.dir.display());
        // The resumed worker found its coordinator connection dead and stopped its old tasks.
        let w1 = s.events("worker-1");
        assert!(
            named(&w1, "coordinator_lost").next().is_some() || named(&w1, "worker_exit").next().is_some(),
            "worker 1 (lost: {lost:?}) neither lost its coordinator nor exited: {}",
            summary(&w1)
        );
    }
    sc.check_output("hung worker");
}

#[test]
fn peers_without_the_secret_and_garbage_bytes_are_refused_without_disturbing_the_job() {
    let sc = Scenario::new("auth", seed(), 20_000, 200);
    let s = &sc.s;
    {
        let mut c = wordcount_cluster(s, 1, &["--parallelism", "2", "--line-delay-us", "200"]);
        // A worker with the wrong secret.
        s.write("wrong", "not-the-cluster-secret-at-all-000");
        let mut intruder = cutline()
            .args(["worker", "--join", &c.addr, "--secret-file", &s.arg("wrong")])
            .args(["--rejoin-timeout", "1s"])
            .stdout(s.log("intruder"))
            .stderr(s.log("intruder"))
            .spawn()
            .unwrap();
        // Garbage on the coordinator's port: an HTTP request, and a frame header announcing 4 GiB.
        for bytes in
            [&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &[b'C', b'U', b'T', b'L', 0, 1, 251, 0, 255, 255, 255, 255][..]]
        {
            let mut t = common::wait_until("the coordinator to listen", Duration::from_secs(10), || {
                std::net::TcpStream::connect(&c.addr).ok()
            });
            t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = t.write_all(bytes);
            let mut sink = Vec::new();
            let _ = t.read_to_end(&mut sink); // the coordinator closes the connection
        }
        // `cutline status` on the coordinator shows the workers' tasks and channels (from heartbeats).
        common::wait_until("status to show the workers' tasks", Duration::from_secs(20), || {
            let st = cutline().args(["status", "--state"]).arg(s.path("state")).output().unwrap();
            let text = String::from_utf8_lossy(&st.stdout).to_string();
            (text.contains("lines#1->counts#0") && text.contains("counts#1  backpressured")).then_some(())
        });
        common::wait_until("the intruder to give up", Duration::from_secs(30), || intruder.try_wait().unwrap());
        let st = c.wait(Duration::from_secs(90));
        assert!(st.success(), "the job failed: {st}");
        let ev = sc.coordinator_events();
        let refused: Vec<&str> = named(&ev, "connection_refused").map(|e| e.str("reason").unwrap_or("")).collect();
        assert!(
            refused.iter().any(|r| r.contains("wrong cluster secret")),
            "no connection was refused for its wrong secret: refusals {refused:?}; logs in {}",
            s.dir.display()
        );
        assert!(
            refused.iter().filter(|r| !r.contains("wrong cluster secret")).count() >= 2,
            "the two connections that sent garbage were not refused: refusals {refused:?}"
        );
        assert!(!s.log_text("coordinator").contains(SECRET), "the secret must never be logged");
        // The intruder was told why, and stopped at once: its exit names the rejected secret.
        let intruder_log = s.log_text("intruder");
        let told = named(&common::events(&intruder_log), "worker_exit")
            .any(|e| e.str("reason").is_some_and(|r| r.contains("rejected this worker's cluster secret")));
        assert!(told, "the intruder was not told its secret is wrong: {intruder_log}");
    }
    sc.check_output("auth");
}

#[test]
fn a_worker_without_a_secret_or_with_a_bad_address_is_refused_with_advice() {
    let out = cutline().args(["worker", "--join", "127.0.0.1:1"]).env_remove("CUTLINE_SECRET_FILE").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--secret-file") && err.contains("urandom"), "{err}");
    // A coordinator address without a port is refused at once, not retried.
    let t = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let out = cutline()
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
    let sc = Scenario::new("s3", seed(), 30_000, 300);
    let s = &sc.s;
    let url = format!("s3://{bucket}/cluster-{}-{}", std::process::id(), seed());
    {
        let mut c = wordcount_cluster(
            s,
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
        sc.wait_for_checkpoints(3, Duration::from_secs(30));
        signal(&c.workers[0], "-KILL");
        c.workers[0].wait().unwrap();
        c.workers[0] = c.start_worker(0, &[]);
        std::thread::sleep(Duration::from_millis(700));
        signal(&c.coordinator, "-KILL");
        c.coordinator.wait().unwrap();
        c.restart_coordinator();
        let st = c.wait(Duration::from_secs(90));
        assert!(st.success(), "the job failed: {st}; logs in {}", s.dir.display());
        let ev = sc.coordinator_events();
        assert!(
            !restored_checkpoints(&ev).is_empty(),
            "the restarted coordinator restored nothing from {endpoint}: {}",
            summary(&ev)
        );
    }
    sc.check_output("checkpoints on S3");
}

/// A savepoint taken from a cluster restores anywhere: stop a two-worker job with a savepoint, then
/// finish it embedded in one process from that savepoint; the output is exact.
#[test]
fn a_cluster_stopped_with_a_savepoint_resumes_in_one_process() {
    let sc = Scenario::new("savepoint", seed(), 30_000, 300);
    let s = &sc.s;
    {
        let mut c =
            wordcount_cluster(s, 2, &["--parallelism", "2", "--checkpoint-interval", "50ms", "--line-delay-us", "200"]);
        sc.wait_for_checkpoints(3, Duration::from_secs(30));
        let out = cutline().args(["savepoint", "--stop", "--state"]).arg(s.path("state")).output().unwrap();
        assert!(out.status.success(), "savepoint --stop failed: {}", String::from_utf8_lossy(&out.stderr));
        let sp = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(Path::new(&sp).is_dir(), "savepoint directory {sp:?}");
        let st = c.wait(Duration::from_secs(30));
        assert!(st.success(), "the coordinator failed: {st}");
        // The run's report line (stdout) says how it ended.
        let log = s.log_text("coordinator");
        assert!(log.lines().any(|l| l.starts_with("stopped with savepoint")), "{log}");
        assert!(
            named(&sc.coordinator_events(), "savepoint_triggered").any(|e| e.bool("stop") == Some(true)),
            "no stop-savepoint event: {log}"
        );
        // The workers were told the job is over.
        for (i, w) in c.workers.iter_mut().enumerate() {
            common::wait_until(&format!("worker {i} to exit"), Duration::from_secs(10), || w.try_wait().unwrap());
        }
        let problems = cutline_cli::jobs::check_wordcount_output(&sc.text, &s.path("out")).unwrap();
        assert!(!problems.is_empty(), "stopped early, yet the output is complete");
        // Resume embedded, on a fresh state directory, from the savepoint.
        let out = cutline()
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
    sc.check_output("savepoint from a cluster");
}

#[test]
fn a_killed_cluster_restarts_at_another_parallelism_on_other_workers_and_the_output_is_exact() {
    // The whole cluster (coordinator and workers) is SIGKILLed mid-run, twice, and each time started
    // again on the same state directory with another parallelism and number of workers: the line
    // file source, the keyed counts and the file sink all rescale.
    let sc = Scenario::new("rescale", seed(), 30_000, 300);
    let s = &sc.s;
    let paced = ["--checkpoint-interval", "50ms", "--line-delay-us", "200"];
    for (workers, parallelism) in [(2, "2"), (3, "3")] {
        let before = common::count(&sc.coordinator_events(), "checkpoint_complete");
        let c = wordcount_cluster(s, workers, &[&["--parallelism", parallelism][..], &paced].concat());
        sc.wait_for_checkpoints(before + 3, Duration::from_secs(60));
        drop(c); // SIGKILL, every process
    }
    let mut c = wordcount_cluster(s, 1, &[&["--parallelism", "1"][..], &paced].concat());
    let st = c.wait(SCENARIO_TIME_LIMIT);
    assert!(st.success(), "the coordinator failed ({st}); logs in {}", s.dir.display());
    let restored = restored_checkpoints(&sc.coordinator_events());
    assert_eq!(restored.len(), 2, "two restores, at parallelism 3 and 1: {restored:?}");
    sc.check_output("rescaled from 2 to 3 to 1");
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
    let sc = Scenario::new("idle", seed(), 20_000, 100);
    let s = &sc.s;
    {
        let mut c = wordcount_cluster(s, 2, &["--parallelism", "1", "--line-delay-us", "150"]);
        sc.wait_for_checkpoints(2, Duration::from_secs(30));
        let before: Vec<u64> = c.workers.iter().map(|w| cpu_ticks(w.id())).collect();
        std::thread::sleep(Duration::from_millis(1000));
        let used: Vec<u64> = c.workers.iter().zip(&before).map(|(w, b)| cpu_ticks(w.id()).saturating_sub(*b)).collect();
        // One worker runs the paced job (mostly asleep); the other has nothing to do. Neither may
        // use half a core (1 s is 100 ticks); a spinning loop uses all of one.
        assert!(used.iter().all(|t| *t < 50), "a worker used {used:?} CPU ticks in 1 s");
        let st = c.wait(Duration::from_secs(60));
        assert!(st.success(), "the job failed: {st}");
    }
    sc.check_output("idle worker");
}
