//! A running job watched by real tools, as its operators would: the dashboard loaded in a headless
//! Chromium (what the page shows after its scripts ran, and a screenshot kept in the test output),
//! and driven there by a user (playwright-core: a checkpoint clicked, the interval changed), a
//! Prometheus server scraping `/metrics` (OpenMetrics, parsed strictly) and answering queries over
//! it, and the live status line on a pseudo-terminal (`script`). `.ci/run` installs
//! Chromium and Prometheus (Debian's packages); these tests fail, saying so, when they are missing.

#![cfg(unix)]

mod common;

use common::http::{endpoint, get, metric};
use common::{cutline, signal, wait_until, word_lines, wordcount_job, Scratch};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A program the test needs, from `$var` or the given path; panics saying how to install it.
fn program(var: &str, default: &str, package: &str) -> PathBuf {
    let p = std::env::var(var).map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(default));
    assert!(
        p.exists(),
        "{} is missing: install Debian's {package} (apt-get install {package}), or set {var}",
        p.display()
    );
    p
}

fn start(s: &Scratch, extra: &[&str]) -> Child {
    let input = s.write("input.txt", &word_lines(11, 20_000, (4, 10), 300));
    let mut args = wordcount_job(&input.display().to_string(), &s.arg("out"), &s.arg("state"), "200ms", 2_000, extra);
    args.push("-v".into());
    cutline().args(&args).stdout(s.log("job")).stderr(s.log("job")).spawn().unwrap()
}

fn completed(addr: &str) -> u64 {
    metric(&get(addr, "/metrics").body, "cutline_checkpoints_completed_total").unwrap_or(0.0) as u64
}

/// Chromium headless, with what a closed network and root need (see the environment notes).
fn chromium(profile: &Path) -> Command {
    let mut c = Command::new(program("CUTLINE_CHROMIUM", "/usr/bin/chromium", "chromium"));
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=4000",
        "--window-size=1400,1600",
    ]);
    c.arg(format!("--user-data-dir={}", profile.display()));
    c.stderr(Stdio::null());
    c
}

#[test]
fn the_dashboard_shows_the_graph_the_checkpoints_and_an_epoch_trace_in_a_real_browser() {
    let s = Scratch::new("dashboard");
    let job = start(&s, &[]);
    let addr = endpoint(&s, "job", LIMIT);
    wait_until("three checkpoints", LIMIT, || (completed(&addr) >= 3).then_some(()));
    let url = format!("http://{addr}/");
    let out = chromium(&s.path("profile")).arg("--dump-dom").arg(&url).output().unwrap();
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    s.write("dom.html", &dom);
    // The job graph: both stages, and the edge between them with its occupancy.
    assert!(dom.contains(r#"data-stage="lines""#) && dom.contains(r#"data-stage="counts""#), "no stages: {dom}");
    assert!(dom.contains(r#"id="edge-lines-counts""#), "no edge: {dom}");
    assert!(dom.contains("hash ") && dom.contains("% full"), "no edge label: {dom}");
    // The checkpoint history, newest first, with a row per completed checkpoint.
    let rows = dom.matches("<tr data-checkpoint=").count();
    assert!(rows >= 3, "{rows} checkpoint rows: {dom}");
    // The newest checkpoint's trace: a row per task, the slowest step named, the critical path.
    assert!(dom.contains(r#"id="slowest-step">Slowest step: "#), "no slowest step: {dom}");
    for task in ["lines#0", "lines#1", "counts#0", "counts#1"] {
        assert!(dom.contains(&format!(r#"class="task-trace" data-task="{task}""#)), "no timeline row of {task}");
    }
    assert!(dom.contains(r#"id="critical-path""#), "{dom}");
    // The counters and the settings it can change.
    assert!(dom.contains(r#"data-counter="completed""#) && dom.contains(r#"data-counter="restarts""#), "{dom}");
    assert!(dom.contains(r#"id="set-interval""#) && dom.contains(r#"value="200ms""#), "{dom}");
    assert!(dom.contains(r#"class="state running""#), "not shown running: {dom}");

    // A screenshot, kept with the test's output (and in the scratch directory on failure).
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let status =
        chromium(&s.path("profile")).arg(format!("--screenshot={}", shot.display())).arg(&url).status().unwrap();
    assert!(status.success());
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 20_000, "screenshot of {} bytes", png.len());
    std::fs::copy(&shot, s.path("dashboard.png")).unwrap();
    eprintln!("dashboard screenshot: {}", shot.display());
    signal(&job, "-TERM");
    let mut job = job;
    job.wait().unwrap();
}

#[test]
fn a_real_prometheus_scrapes_the_job_and_answers_queries_over_its_metrics() {
    let prometheus = program("CUTLINE_PROMETHEUS", "/usr/bin/prometheus", "prometheus");
    let s = Scratch::new("prometheus");
    let job = start(&s, &[]);
    let addr = endpoint(&s, "job", LIMIT);
    wait_until("two checkpoints", LIMIT, || (completed(&addr) >= 2).then_some(()));

    // The exposition is OpenMetrics (`promtool check metrics` reads only the older text format):
    // Prometheus parses it strictly, and a scrape it cannot parse makes the target unhealthy.
    let web = common::free_port();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: cutline\n    static_configs:\n      - targets: ['{addr}']\n"
    );
    s.write("prometheus.yml", &config);
    let mut server = Command::new(prometheus)
        .arg(format!("--config.file={}", s.arg("prometheus.yml")))
        .arg(format!("--storage.tsdb.path={}", s.arg("tsdb")))
        .arg(format!("--web.listen-address={web}"))
        .stdout(s.log("prometheus"))
        .stderr(s.log("prometheus"))
        .spawn()
        .unwrap();
    let query = |q: &str| -> Option<f64> {
        let path = format!("/api/v1/query?query={}", q.replace(' ', "%20").replace('"', "%22"));
        let a = common::http::request(&web, "GET", &path, &[], "")?;
        let v: serde_json::Value = serde_json::from_str(&a.body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    let done = wait_until("Prometheus to have scraped completed checkpoints", LIMIT, || {
        query("cutline_checkpoints_completed_total").filter(|v| *v >= 2.0)
    });
    // The scrape is healthy, and the per-task and histogram series are queryable as such.
    let targets = common::http::request(&web, "GET", "/api/v1/targets", &[], "").unwrap().body;
    assert!(targets.contains(r#""health":"up""#) && targets.contains(r#""lastError":"""#), "{targets}");
    assert_eq!(query("count(cutline_task_records_in_total)"), Some(4.0));
    let q90 = wait_until("a quantile of checkpoint durations", LIMIT, || {
        query("histogram_quantile(0.9, sum by (le) (cutline_checkpoint_duration_seconds_bucket))")
    });
    assert!(q90 > 0.0 && q90 < 60.0, "p90 checkpoint duration {q90} s");
    assert!(done >= 2.0);
    let _ = server.kill();
    let _ = server.wait();
    signal(&job, "-TERM");
    let mut job = job;
    job.wait().unwrap();
}

#[test]
fn a_terminal_gets_a_live_status_line_and_a_pipe_does_not() {
    let s = Scratch::new("status-line");
    let input = s.write("input.txt", &word_lines(5, 1_500, (4, 10), 300));
    let args = wordcount_job(&input.display().to_string(), &s.arg("out"), &s.arg("state"), "200ms", 2_000, &[]);
    // `script` gives the job a pseudo-terminal as its standard output.
    let command = std::iter::once(common::BIN.to_string())
        .chain(args.iter().cloned())
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("script")
        .args(["-qefc", &command, "/dev/null"])
        .env("CUTLINE_HTTP", "off")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("\r\x1b[2Kcutline: gen-1 | "), "no status line: {text:?}");
    assert!(text.contains("records/s") && text.contains("checkpoint "), "{text:?}");
    assert!(text.contains("finished: final checkpoint"), "{text:?}");
    // Through a pipe: the report only.
    let s2 = Scratch::new("status-line-pipe");
    let input = s2.write("input.txt", &word_lines(5, 300, (4, 10), 300));
    let args = wordcount_job(&input.display().to_string(), &s2.arg("out"), &s2.arg("state"), "200ms", 0, &[]);
    let out = cutline().args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !text.contains('\r') && text.starts_with("finished:"), "{text:?}");
}

/// An OTLP/HTTP receiver that checks every request against the official protobuf schema
/// (`scripts/otlp-test-receiver`); what it accepted, one request per line.
struct Receiver {
    endpoint: String,
    pid: String,
    file: PathBuf,
}

impl Receiver {
    fn start(s: &Scratch) -> Receiver {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/otlp-test-receiver");
        let file = s.path("otlp.jsonl");
        let out = Command::new(script).arg(&file).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        let var = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .unwrap_or_else(|| panic!("{text}"))
                .to_string()
        };
        Receiver { endpoint: var("CUTLINE_OTLP_ENDPOINT"), pid: var("CUTLINE_OTLP_RECEIVER_PID"), file }
    }
    fn requests(&self) -> Vec<serde_json::Value> {
        common::read_lossy(&self.file).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(&self.pid).status();
    }
}

#[test]
fn checkpoint_traces_reach_an_opentelemetry_receiver_and_an_unreachable_one_costs_nothing() {
    let s = Scratch::new("otlp");
    let receiver = Receiver::start(&s);
    let job = start(&s, &["--otlp-endpoint", &receiver.endpoint]);
    let requests = wait_until("three exported checkpoints", LIMIT, || {
        let r = receiver.requests();
        (r.len() >= 3).then_some(r)
    });
    signal(&job, "-TERM");
    let mut job = job;
    job.wait().unwrap();
    assert!(!s.path("otlp.jsonl.refused").exists(), "refused: {}", common::read_lossy(&s.path("otlp.jsonl.refused")));
    for req in &requests {
        let rs = &req["resourceSpans"][0];
        assert_eq!(rs["resource"]["attributes"][0]["value"]["stringValue"], "cutline wordcount");
        let spans = rs["scopeSpans"][0]["spans"].as_array().unwrap();
        let root = &spans[0];
        assert!(root["name"].as_str().unwrap().starts_with("checkpoint "), "{root}");
        let nanos = |s: &serde_json::Value, k: &str| s[k].as_str().unwrap().parse::<u128>().unwrap();
        let tasks: Vec<&serde_json::Value> =
            spans.iter().filter(|s| s["name"].as_str().unwrap().starts_with("task ")).collect();
        let names: Vec<&str> = tasks.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["task lines#0", "task lines#1", "task counts#0", "task counts#1"]);
        for t in &tasks {
            assert_eq!(t["traceId"], root["traceId"]);
            assert_eq!(t["parentSpanId"], root["spanId"]);
            assert!(nanos(t, "startTimeUnixNano") >= nanos(root, "startTimeUnixNano"), "{t}");
            assert!(nanos(t, "endTimeUnixNano") <= nanos(root, "endTimeUnixNano"), "{t} {root}");
        }
        // A keyed task's barrier arrived from each source subtask.
        let events: Vec<&str> =
            tasks[2]["events"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert!(events.contains(&"barrier from lines#0") && events.contains(&"barrier from lines#1"), "{events:?}");
    }
    // Nobody listening: the job runs and finishes as without an exporter, with a warning.
    let s2 = Scratch::new("otlp-unreachable");
    let input = s2.write("input.txt", &word_lines(3, 400, (4, 10), 300));
    let mut args = wordcount_job(&input.display().to_string(), &s2.arg("out"), &s2.arg("state"), "50ms", 500, &[]);
    args.extend(["--otlp-endpoint".into(), format!("http://{}", common::free_port()), "-v".into()]);
    let out = cutline().args(&args).output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("finished:"));
    assert!(common::events(&log).iter().any(|e| e.is("otlp_export_failed")), "{log}");
    common::check_output(&common::read_lossy(&input), &s2.path("out"), "unreachable collector", &s2.dir);
}

#[test]
fn a_user_clicks_a_checkpoint_and_tunes_the_job_from_the_dashboard() {
    let node_path = std::env::var("CUTLINE_NODE_PATH").unwrap_or_else(|_| {
        panic!("CUTLINE_NODE_PATH is not set: `eval \"$(scripts/browser-test-deps)\"` installs playwright-core (scripts/test does)")
    });
    let s = Scratch::new("dashboard-clicks");
    let job = start(&s, &[]);
    let addr = endpoint(&s, "job", LIMIT);
    wait_until("four checkpoints", LIMIT, || (completed(&addr) >= 4).then_some(()));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/dashboard.js");
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-tuned.png");
    let out = Command::new("node")
        .arg(&script)
        .arg(format!("http://{addr}/"))
        .arg(&shot)
        .env("NODE_PATH", &node_path)
        .output()
        .expect("node (Node.js) runs the browser script");
    let text = String::from_utf8_lossy(&out.stdout);
    let seen: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)));
    assert!(seen.get("error").is_none(), "{seen}");
    // The clicked checkpoint's trace is shown, every task in its timeline.
    let clicked = seen["clicked"].as_u64().unwrap();
    assert!(seen["traceTitle"].as_str().unwrap().starts_with(&format!("checkpoint {clicked} ")), "{seen}");
    assert_eq!(seen["timelineTasks"], serde_json::json!(["lines#0", "lines#1", "counts#0", "counts#1"]));
    assert!(seen["slowest"].as_str().unwrap().starts_with("Slowest step: "), "{seen}");
    // The new interval is in force in the job; the bad value was refused with the job's reason.
    assert_eq!(seen["applied"], "applied", "{seen}");
    assert!(seen["refused"].as_str().unwrap().contains("max"), "{seen}");
    let tuned = cutline().args(["tune", "--state", &s.arg("state")]).output().unwrap();
    let settings = String::from_utf8_lossy(&tuned.stdout);
    assert!(settings.contains("interval=750ms") && settings.contains("max-concurrent=1"), "{settings}");
    assert!(std::fs::metadata(&shot).map(|m| m.len() > 20_000).unwrap_or(false), "no screenshot at {}", shot.display());
    signal(&job, "-TERM");
    let mut job = job;
    job.wait().unwrap();
}
