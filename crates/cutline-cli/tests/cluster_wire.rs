//! Cluster connections as real processes see them (a coordinator and workers of the `cutline` binary
//! on loopback, logging JSON events):
//!
//! - A worker given the wrong secret exits at once with an error that names its secret file.
//! - Different frame protection on the two ends is refused at once, on both sides.
//! - A local cluster with sealed frames (`--frame-protection on`) counts words exactly.
//! - When a worker is SIGKILLed, the failover names that worker, not only a task that lost its link.
//! - A worker that builds another job graph refuses the job and exits; the job fails with the
//!   difference named (the library's coordinator and worker, in this process).
//!
//! Every wait is bounded in time.

#![cfg(unix)]

mod common;

use common::{count, events, free_port, named, wait_until, Scratch, BIN};
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

const SECRET: &str = "cluster-wire-test-secret-0123456789";

/// A scratch directory with an input of `lines` lines and the cluster's secret.
fn scratch(name: &str, lines: usize) -> Scratch {
    let s = Scratch::new(name);
    let text: String = (0..lines).map(|i| format!("w{} w{} w{}\n", i % 97, i % 13, i % 7)).collect();
    s.write("input.txt", &text);
    s.write("secret", SECRET);
    s
}

/// Kills its processes when dropped.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn json_logs(cmd: &mut Command) -> &mut Command {
    cmd.env("CUTLINE_LOG_FORMAT", "json").env("CUTLINE_LOG", "info")
}

fn coordinator(s: &Scratch, addr: &str, workers: usize, extra: &[&str]) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.env("CUTLINE_HTTP", "127.0.0.1:0");
    cmd.args(["run", "wordcount", "--input"])
        .arg(s.path("input.txt"))
        .arg("--output")
        .arg(s.path("out"))
        .arg("--state")
        .arg(s.path("state"))
        .args(["--coordinator", addr, "--workers", &workers.to_string(), "--secret-file"])
        .arg(s.path("secret"))
        .args(["--heartbeat-interval", "50ms", "--heartbeat-timeout", "2s"])
        .args(extra)
        .stdout(s.log("coordinator"))
        .stderr(s.log("coordinator"));
    json_logs(&mut cmd).spawn().unwrap()
}

fn worker(s: &Scratch, addr: &str, name: &str, secret: &Path, extra: &[&str]) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.env("CUTLINE_HTTP", "127.0.0.1:0");
    cmd.args(["worker", "--join", addr, "--secret-file"])
        .arg(secret)
        .args(["--rejoin-timeout", "60s"])
        .args(extra)
        .stdout(s.log(name))
        .stderr(s.log(name));
    json_logs(&mut cmd).spawn().unwrap()
}

fn wait_exit(c: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(st) = c.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Poll `f` until it holds; panic with `what` after `limit`.
fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    wait_until(what, limit, || f().then_some(()))
}

/// Whether a process's log has an event `name` whose `field` contains `part`.
fn has(s: &Scratch, log: &str, name: &str, field: &str, part: &str) -> bool {
    named(&s.events(log), name).any(|e| e.str(field).is_some_and(|v| v.contains(part)))
}

#[test]
fn a_worker_with_the_wrong_secret_exits_at_once_naming_its_secret_file() {
    let s = scratch("wire", 100);
    let addr = free_port();
    let mut procs = Procs(vec![coordinator(&s, &addr, 1, &[])]);
    std::fs::write(s.path("wrong.secret"), "not-the-cluster-secret-at-all-000").unwrap();
    let started = Instant::now();
    procs.0.push(worker(&s, &addr, "intruder", &s.path("wrong.secret"), &[]));
    // Its rejoin timeout is 60 s: only a permanent error ends it this soon.
    let st = wait_exit(&mut procs.0[1], Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the worker kept retrying a wrong secret: {}", s.log_text("intruder")));
    assert_eq!(st.code(), Some(3), "a refused worker exits 3, which `cutline cluster` does not restart");
    assert!(started.elapsed() < Duration::from_secs(20));
    let log = s.log_text("intruder");
    let file = s.path("wrong.secret").display().to_string();
    assert!(
        log.contains("rejected this worker's cluster secret") && log.contains(&file) && log.contains("--secret-file"),
        "the error names the refusal, the secret file and what to do: {log}"
    );
    assert!(!log.contains(SECRET) && !log.contains("not-the-cluster-secret"), "no secret is printed: {log}");
    let coord = s.log_text("coordinator");
    wait_for("the coordinator's refusal", Duration::from_secs(5), || {
        has(&s, "coordinator", "connection_refused", "reason", "wrong cluster secret")
    });
    drop(coord);
}

#[test]
fn different_frame_protection_is_refused_at_once_on_both_sides() {
    let s = scratch("wire", 100);
    let addr = free_port();
    // On loopback, `auto` does not seal; the worker insists.
    let mut procs = Procs(vec![coordinator(&s, &addr, 1, &[])]);
    procs.0.push(worker(&s, &addr, "worker", &s.path("secret"), &["--frame-protection", "on"]));
    let st = wait_exit(&mut procs.0[1], Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the worker kept retrying: {}", s.log_text("worker")));
    assert!(!st.success(), "{st}");
    let log = s.log_text("worker");
    assert!(
        log.contains("frame protection differs")
            && log.contains("this process seals frames (frame protection on)")
            && log.contains("the peer does not seal frames (frame protection auto)")
            && log.contains("--frame-protection"),
        "{log}"
    );
    wait_for("the coordinator's refusal", Duration::from_secs(5), || {
        has(&s, "coordinator", "connection_refused", "reason", "frame protection differs")
    });
}

#[test]
fn a_local_cluster_with_sealed_frames_counts_words_exactly() {
    let s = scratch("wire-sealed", 20_000);
    let text = std::fs::read_to_string(s.path("input.txt")).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.env("CUTLINE_HTTP", "127.0.0.1:0");
    cmd.args(["cluster", "--workers", "2", "wordcount", "--input"])
        .arg(s.path("input.txt"))
        .arg("--output")
        .arg(s.path("out"))
        .arg("--state")
        .arg(s.path("state"))
        .args(["--parallelism", "2", "--frame-protection", "on", "-v"])
        .stdout(s.log("cluster"))
        .stderr(s.log("cluster"));
    let mut procs = Procs(vec![json_logs(&mut cmd).spawn().unwrap()]);
    let st = wait_exit(&mut procs.0[0], Duration::from_secs(120))
        .unwrap_or_else(|| panic!("the sealed cluster did not finish: {}", s.log_text("cluster")));
    let log = s.log_text("cluster");
    assert!(st.success(), "{st}: {log}");
    let all = events(&log);
    let joined: Vec<_> = named(&all, "joined").collect();
    assert!(joined.len() >= 2 && joined.iter().all(|e| e.bool("sealed") == Some(true)), "{joined:#?}");
    let problems = cutline_cli::jobs::check_wordcount_output(&text, &s.path("out")).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn sigterm_to_a_local_cluster_stops_the_job_and_every_process_and_a_rerun_resumes_exactly() {
    let s = scratch("wire-cluster-term", 40_000);
    let text = std::fs::read_to_string(s.path("input.txt")).unwrap();
    let cluster = |s: &Scratch, log: &str| {
        let mut cmd = Command::new(BIN);
        cmd.env("CUTLINE_HTTP", "127.0.0.1:0");
        cmd.args(["cluster", "--workers", "2", "wordcount", "--input"])
            .arg(s.path("input.txt"))
            .arg("--output")
            .arg(s.path("out"))
            .arg("--state")
            .arg(s.path("state"))
            .args(["--parallelism", "2", "--checkpoint-interval", "50ms", "--line-delay-us", "100", "-v"])
            .stdout(s.log(log))
            .stderr(s.log(log));
        json_logs(&mut cmd).spawn().unwrap()
    };
    let mut procs = Procs(vec![cluster(&s, "first")]);
    wait_for("a checkpoint", Duration::from_secs(30), || count(&s.events("first"), "checkpoint_complete") > 0);
    common::signal(&procs.0[0], "-TERM");
    let st = wait_exit(&mut procs.0[0], Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the launcher did not stop: {}", s.log_text("first")));
    let log = s.log_text("first");
    assert_eq!(st.code(), Some(143), "{log}");
    assert!(log.contains("stopped by SIGTERM") && log.contains("resume"), "{log}");
    assert_eq!(count(&s.events("first"), "process_restarted"), 0, "nothing restarted after the stop: {log}");
    // No coordinator or worker of it is left: the state directory is free for the next run.
    let mut again = Procs(vec![cluster(&s, "second")]);
    let st = wait_exit(&mut again.0[0], Duration::from_secs(120))
        .unwrap_or_else(|| panic!("the rerun did not finish: {}", s.log_text("second")));
    assert!(st.success(), "{st}: {}", s.log_text("second"));
    assert!(!common::restored_checkpoints(&s.events("second")).is_empty(), "the rerun resumed from a checkpoint");
    let problems = cutline_cli::jobs::check_wordcount_output(&text, &s.path("out")).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A TCP proxy to `to`: bytes both ways for every connection it accepts; once a client's side ends,
/// the coordinator's side is closed `hold` later. A client that connects before the coordinator
/// listens is closed at once and retries (as a worker does), which a new connection serves.
fn proxy(to: &str, hold: Duration) -> String {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let to = to.to_string();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(&to) else { continue };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_in, &mut c_out);
            });
            std::thread::spawn(move || {
                let mut buf = [0u8; 64 << 10];
                loop {
                    match c_in.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s_out.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                std::thread::sleep(hold);
                let _ = s_out.shutdown(Shutdown::Both);
            });
        }
    });
    addr
}

/// The worker id a worker's log says it joined as.
fn joined_as(log: &str) -> Option<u64> {
    named(&events(log), "joined").last()?.u64("worker")
}

#[test]
fn the_failover_after_a_killed_worker_names_that_worker() {
    let s = scratch("wire-failover", 200_000);
    let addr = free_port();
    let mut procs = Procs(vec![coordinator(&s, &addr, 2, &["--parallelism", "2", "--line-delay-us", "50"])]);
    procs.0.push(worker(&s, &addr, "worker-a", &s.path("secret"), &[]));
    // Worker b reaches the coordinator through a proxy that keeps the coordinator's side open for
    // a moment after b is gone: the other worker's report of its failed task (its data link to b
    // broke) then reaches the coordinator before b's own connection breaks, as it does when the
    // coordinator's host is slower to notice. The failover must still name b.
    let via = proxy(&addr, Duration::from_millis(100));
    procs.0.push(worker(&s, &via, "worker-b", &s.path("secret"), &[]));
    wait_for("both workers running their tasks", Duration::from_secs(30), || {
        ["worker-a", "worker-b"].iter().all(|w| count(&s.events(w), "deployed") > 0)
    });
    wait_for("a checkpoint", Duration::from_secs(30), || count(&s.events("coordinator"), "checkpoint_complete") > 0);
    let victim = joined_as(&s.log_text("worker-b")).expect("worker b logged its id");
    procs.0[2].kill().unwrap();
    wait_for("the failover", Duration::from_secs(30), || count(&s.events("coordinator"), "failover") > 0);
    let all = s.events("coordinator");
    let failover = named(&all, "failover").next().unwrap().str("reason").unwrap_or_default().to_string();
    assert!(
        failover.starts_with(&format!("worker {victim} (")) && failover.contains("lost"),
        "the failover names the lost worker {victim}: {failover}"
    );
}

#[test]
fn a_worker_that_builds_another_graph_refuses_the_job_and_the_job_fails_naming_the_difference() {
    use cutline::cluster::{run_worker, spawn_cluster, ClusterConfig, WorkerConfig, WorkerError};
    use cutline::{CheckpointStore, LocalDirStore, RunConfig, RunError};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let tally = dir.path().join("tally");
    let graph =
        move |parallelism: u32| cutline_cli::jobs::keyed_bench(1_000, (10, 0), parallelism, &tally).build().unwrap();
    let store: Arc<dyn CheckpointStore> = Arc::new(LocalDirStore::open(&state).unwrap());
    let addr = free_port();
    let cluster =
        ClusterConfig::new(&addr, 1, SECRET.as_bytes().to_vec(), vec!["bench".into()], state.display().to_string());
    let started = Instant::now();
    let handle = spawn_cluster(graph(2), RunConfig::new(store, "bench"), cluster).unwrap();
    // This worker's builder makes another parallelism from the same arguments.
    let worker = std::thread::spawn(move || {
        let build = move |_: &[String]| Ok((graph(3), "bench".to_string()));
        let open = |p: &str| {
            LocalDirStore::open(Path::new(p))
                .map(|s| Arc::new(s) as Arc<dyn CheckpointStore>)
                .map_err(|e| e.to_string())
        };
        run_worker(WorkerConfig::new(addr, SECRET.as_bytes().to_vec()), &build, &open)
    });
    let err = worker.join().unwrap().unwrap_err();
    assert!(
        matches!(&err, WorkerError::GraphMismatch { difference } if difference.contains("parallelism 3 here and 2 at the coordinator")),
        "{err:?}"
    );
    assert!(err.to_string().contains("same binary"), "{err}");
    let job = handle.join().unwrap_err();
    let text = job.to_string();
    assert!(matches!(job, RunError::Permanent(_)), "{job:?}");
    assert!(text.contains("cannot run this job") && text.contains("parallelism 3 here and 2"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(30), "refused at once, not after retries: {:?}", started.elapsed());
}
