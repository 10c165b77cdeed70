//! Watching a running job the way an operator does: its HTTP endpoint (Prometheus metrics, health
//! and readiness probes, status JSON, run-time tuning), `cutline status --json`, `cutline trace`
//! after the job stopped and after it was killed, and checkpoint statistics that outlive a killed
//! process. The dashboard in a real browser and a real Prometheus server are in `observe_real.rs`;
//! a cluster's probes in `cluster.rs`.

#![cfg(unix)]

mod common;

use common::http::{endpoint, get, metric, request};
use common::{cutline, signal, wait_until, word_lines, wordcount_job, Scratch};
use std::process::Child;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A word-count job that runs for a while (lines delayed), serving its endpoint on a free port.
fn start(s: &Scratch, lines: usize, interval: &str, extra: &[&str]) -> Child {
    let input = s.write("input.txt", &word_lines(7, lines, (4, 10), 300));
    let mut args = wordcount_job(&input.display().to_string(), &s.arg("out"), &s.arg("state"), interval, 2_000, extra);
    args.push("-v".into());
    cutline().args(&args).stdout(s.log("job")).stderr(s.log("job")).spawn().unwrap()
}

fn stop(mut job: Child) {
    signal(&job, "-TERM");
    let status = job.wait().unwrap();
    assert_eq!(status.code(), Some(143), "a job stopped by SIGTERM exits 128 + 15");
}

/// The number of completed checkpoints `/metrics` reports.
fn completed(addr: &str) -> u64 {
    metric(&get(addr, "/metrics").body, "cutline_checkpoints_completed_total").unwrap_or(0.0) as u64
}

#[test]
fn a_running_job_serves_metrics_probes_status_and_tuning() {
    let s = Scratch::new("observe-endpoint");
    let job = start(&s, 20_000, "200ms", &[]);
    let addr = endpoint(&s, "job", LIMIT);
    assert_eq!(get(&addr, "/healthz").status, 200);
    wait_until("readiness", LIMIT, || (get(&addr, "/readyz").status == 200).then_some(()));
    wait_until("three checkpoints", LIMIT, || (completed(&addr) >= 3).then_some(()));

    let m = get(&addr, "/metrics");
    assert_eq!(m.status, 200);
    assert!(m.content_type.starts_with("application/openmetrics-text"), "{}", m.content_type);
    let text = &m.body;
    // Every task has its flow figures and its part in the latest checkpoint, with units in the names.
    for task in ["lines#0", "lines#1", "counts#0", "counts#1"] {
        for family in ["cutline_task_records_in_total", "cutline_task_backpressured_seconds_total"] {
            assert!(metric(text, &format!("{family}{{task=\"{task}\"}}")).is_some(), "{family} of {task}:\n{text}");
        }
        for family in [
            "cutline_task_last_checkpoint_alignment_seconds",
            "cutline_task_last_checkpoint_start_delay_seconds",
            "cutline_task_last_checkpoint_sync_seconds",
            "cutline_task_last_checkpoint_async_seconds",
            "cutline_task_last_checkpoint_ack_latency_seconds",
            "cutline_task_last_checkpoint_state_bytes",
            "cutline_task_last_checkpoint_blocked_records",
        ] {
            assert!(metric(text, &format!("{family}{{task=\"{task}\"}}")).is_some(), "{family} of {task}:\n{text}");
        }
    }
    let read = metric(text, "cutline_task_records_in_total{task=\"lines#0\"}").unwrap();
    assert!(read > 0.0, "the source read nothing:\n{text}");
    // A histogram ends at +Inf with every observation: 4 tasks per completed checkpoint at least.
    let done = metric(text, "cutline_checkpoints_completed_total").unwrap();
    let per_task = metric(text, "cutline_task_checkpoint_alignment_seconds_bucket{le=\"+Inf\"}").unwrap();
    assert_eq!(Some(per_task), metric(text, "cutline_task_checkpoint_alignment_seconds_count"));
    assert!(per_task >= 4.0 * 3.0, "{per_task} per-task observations for {done} checkpoints");
    assert!(metric(text, "cutline_channel_queued_batches{channel=\"lines#0->counts#1\"}").is_some(), "{text}");
    assert!(text.ends_with("# EOF\n"));

    // The status as JSON, from the endpoint and from `cutline status --json`.
    let status: serde_json::Value = serde_json::from_str(&get(&addr, "/api/status").body).unwrap();
    assert_eq!(status["tasks"].as_array().unwrap().len(), 4);
    assert_eq!(status["stages"][1]["inputs"][0]["kind"], "hash");
    let out = cutline().args(["status", "--json", "--state", &s.arg("state")]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli["tasks"].as_array().unwrap().len(), 4);
    assert!(cli["checkpoints"].as_array().unwrap().len() >= 3);

    // Tuning: a page of another site cannot (no header), a bad value is refused with the reason,
    // a good one is in force for `cutline tune` too.
    let plain = request(&addr, "POST", "/api/settings", &[], "interval=300ms").unwrap();
    assert_eq!(plain.status, 403, "{}", plain.body);
    let tune = [("X-Cutline-Tune", "1")];
    let bad = request(&addr, "POST", "/api/settings", &tune, "max-concurrent=99").unwrap();
    assert!(bad.status == 409 && bad.body.contains("max"), "{} {}", bad.status, bad.body);
    let ok = request(&addr, "POST", "/api/settings", &tune, "interval=300ms").unwrap();
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert!(ok.body.contains("interval=300ms"), "{}", ok.body);
    let tuned = cutline().args(["tune", "--state", &s.arg("state")]).output().unwrap();
    assert!(String::from_utf8_lossy(&tuned.stdout).contains("interval=300ms"));
    assert_eq!(get(&addr, "/api/settings").body.split_whitespace().next(), Some("interval=300ms"));
    // Junk is refused, never a crash.
    assert_eq!(request(&addr, "DELETE", "/metrics", &[], "").unwrap().status, 405);
    assert_eq!(get(&addr, "/nothing").status, 404);
    assert_eq!(get(&addr, "/api/trace/abc").status, 400);
    assert_eq!(get(&addr, "/api/trace/999999").status, 404);

    let newest = completed(&addr);
    stop(job);
    // The trace of the newest checkpoint, read from the state directory of the stopped job.
    let out = cutline().args(["trace", "--state", &s.arg("state")]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("critical path") && text.contains("<== slowest") && text.contains("slowest step: "),
        "{text}"
    );
    for task in ["lines#0", "lines#1", "counts#0", "counts#1"] {
        assert!(text.contains(task), "{text}");
    }
    let out = cutline().args(["trace", "--state", &s.arg("state"), "--checkpoint", "2", "--json"]).output().unwrap();
    let trace: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(trace["checkpoint"], 2);
    let tasks = trace["tasks"].as_array().unwrap();
    let counts: Vec<_> = tasks.iter().filter(|t| t["task"].as_str().unwrap().starts_with("counts")).collect();
    assert_eq!(counts.len(), 2);
    for t in counts {
        // A keyed task has a barrier from each source subtask, after the trigger, before its ack.
        let inputs = t["inputs"].as_array().unwrap();
        let from: Vec<&str> = inputs.iter().map(|i| i["from"].as_str().unwrap()).collect();
        assert_eq!(from, ["lines#0", "lines#1"], "{t}");
        for i in inputs {
            let at = i["barrier_us"].as_u64().unwrap();
            assert!(at <= t["acked_us"].as_u64().unwrap(), "{t}");
        }
    }
    assert!(trace["critical_path"].as_array().unwrap().len() >= 6, "{trace}");
    assert!(newest >= 3);
    let missing = cutline().args(["trace", "--state", &s.arg("state"), "--checkpoint", "99999"]).output().unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no record of chk-99999"));
}

#[test]
fn checkpoint_statistics_outlive_a_killed_process() {
    let s = Scratch::new("observe-history");
    let job = start(&s, 20_000, "150ms", &[]);
    let addr = endpoint(&s, "job", LIMIT);
    wait_until("four checkpoints", LIMIT, || (completed(&addr) >= 4).then_some(()));
    let before: serde_json::Value = serde_json::from_str(&get(&addr, "/api/checkpoints").body).unwrap();
    let ids_before: Vec<u64> =
        before["checkpoints"].as_array().unwrap().iter().map(|c| c["checkpoint"].as_u64().unwrap()).collect();
    signal(&job, "-KILL");
    let mut job = job;
    job.wait().unwrap();

    // The same command again: a new process, which restores and must still show the old history.
    let endpoints = |s: &Scratch| -> Vec<String> {
        s.events("job")
            .iter()
            .filter(|e| e.is("http_endpoint"))
            .filter_map(|e| e.str("addr").map(String::from))
            .collect()
    };
    let seen = endpoints(&s).len();
    let job = start(&s, 20_000, "150ms", &[]);
    let addr = wait_until("the second endpoint", LIMIT, || {
        let eps = endpoints(&s);
        (eps.len() > seen).then(|| eps[eps.len() - 1].clone())
    });
    let after: serde_json::Value = serde_json::from_str(&get(&addr, "/api/checkpoints").body).unwrap();
    let ids_after: Vec<u64> =
        after["checkpoints"].as_array().unwrap().iter().map(|c| c["checkpoint"].as_u64().unwrap()).collect();
    for id in &ids_before {
        assert!(ids_after.contains(id), "checkpoint {id} of the killed process is not in the history {ids_after:?}");
    }
    wait_until("a restore counted", LIMIT, || {
        (metric(&get(&addr, "/metrics").body, "cutline_restores_total") == Some(1.0)).then_some(())
    });
    // Its trace is there too.
    let first = ids_before[0].to_string();
    let trace = get(&addr, &format!("/api/trace/{first}"));
    assert_eq!(trace.status, 200, "{}", trace.body);
    stop(job);
}

#[test]
fn a_cluster_coordinator_aggregates_its_workers_and_every_process_answers_its_probes() {
    let s = Scratch::new("observe-cluster");
    let input = s.write("input.txt", &word_lines(9, 20_000, (4, 10), 300));
    let mut job = wordcount_job(&input.display().to_string(), &s.arg("out"), &s.arg("state"), "200ms", 2_000, &[]);
    job.push("--http".into());
    job.push("127.0.0.1:0".into());
    let mut c = common::cluster::Cluster::start_with(&s, 2, &job, &["--http", "127.0.0.1:0"]);
    let coordinator = endpoint(&s, "coordinator", LIMIT);
    let workers: Vec<String> = (0..2).map(|i| endpoint(&s, &format!("worker-{i}"), LIMIT)).collect();
    for w in &workers {
        assert_eq!(get(w, "/healthz").status, 200);
        wait_until("a worker ready", LIMIT, || (get(w, "/readyz").status == 200).then_some(()));
    }
    wait_until("coordinator ready", LIMIT, || (get(&coordinator, "/readyz").status == 200).then_some(()));
    wait_until("two checkpoints", LIMIT, || (completed(&coordinator) >= 2).then_some(()));
    // The coordinator runs no task, yet its metrics have every task's figures, from both workers.
    let text = wait_until("every source's records at the coordinator", LIMIT, || {
        let text = get(&coordinator, "/metrics").body;
        let read = |t: &str| metric(&text, &format!("cutline_task_records_in_total{{task=\"{t}\"}}")).unwrap_or(0.0);
        (read("lines#0") > 0.0 && read("lines#1") > 0.0).then_some(text)
    });
    for task in ["counts#0", "counts#1"] {
        let series = format!("cutline_task_last_checkpoint_ack_latency_seconds{{task=\"{task}\"}}");
        assert!(metric(&text, &series).is_some(), "{series}:\n{text}");
    }
    // Each worker's own metrics: joined, running its share of the tasks.
    let mut tasks_here = 0.0;
    for w in &workers {
        let text = get(w, "/metrics").body;
        assert_eq!(metric(&text, "cutline_worker_connected"), Some(1.0), "{text}");
        tasks_here += text.lines().filter(|l| l.starts_with("cutline_task_records_in_total{")).count() as f64;
    }
    assert_eq!(tasks_here, 4.0, "the workers run the four tasks between them");
    // A lost worker: the job restarts, and the coordinator is not ready until it runs again.
    signal(&c.workers[0], "-KILL");
    let _ = c.workers[0].wait();
    wait_until("the coordinator not ready while it restarts", LIMIT, || {
        (get(&coordinator, "/readyz").status == 503).then_some(())
    });
    assert_eq!(get(&coordinator, "/healthz").status, 200, "the coordinator itself is alive");
    c.workers[0] = c.start_worker(0, &[]);
    wait_until("the coordinator ready again", LIMIT, || (get(&coordinator, "/readyz").status == 200).then_some(()));
    wait_until("a restart counted", LIMIT, || {
        (metric(&get(&coordinator, "/metrics").body, "cutline_restarts_total").unwrap_or(0.0) >= 1.0).then_some(())
    });
}
