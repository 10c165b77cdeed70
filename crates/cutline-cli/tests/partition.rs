//! A worker cut off by the network and healed, with the machine's own network namespaces.
//!
//! The coordinator and two workers run on the host; a third worker runs in a network namespace of its
//! own, joined to the host by a veth pair (a /30 in 10.213.0.0/16 that the host does not use). All
//! traffic stays on loopback or on that pair. On the pair, `tc` first makes the network slow, then
//! cuts it, in one run of a paced word count:
//!
//! 1. Slow network. With `netem delay 400ms` on both ends if the kernel has `sch_netem`; otherwise an
//!    `htb` class of 256 kbit/s with a short queue carries the data plane, while the control
//!    connections (matched by the coordinator's port) stay fast so that heartbeats keep arriving.
//!    Either way barriers and acknowledgements cannot make it within `--checkpoint-timeout 300ms`:
//!    checkpoints time out, no worker is lost, and nothing of a partial cut is committed. Meanwhile
//!    the job tolerates failed checkpoints (`cutline tune --tolerable-failures`), so that it does not
//!    fail over during the phase: a redeployment over the slow network works (workers keep sending
//!    heartbeats while they deploy) but would make the phase long.
//! 2. Partition. Every packet on the pair is dropped (`netem loss 100%`, or a `pfifo` of length 0).
//!    The coordinator loses the worker (no heartbeat) and, after `--replacement-wait`, runs on the two
//!    host workers; the cut-off worker finds it lost its coordinator. Once healed, it joins again.
//!
//! The job finishes, and its committed output equals that of a run without failures.
//!
//! It needs root and iproute2 (`ip`, `tc`), and fails without them unless built with `CUTLINE_SKIP_NETNS=1`
//! (build.rs then marks it ignored: the test report shows it as ignored, never as passed).
//! Every wait is bounded. A failing run keeps its scratch directory (every process's log) and prints
//! where it is; the namespace and the veth pair are removed whatever happens.

#![cfg(target_os = "linux")]

mod common;

use common::{check_output, count, cutline, named, word_lines, LogEvent, Scratch, BIN};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

const SECRET: &str = "partition-test-secret-0123456789abcdef";
/// Hard bound on the whole scenario.
const TIME_LIMIT: Duration = Duration::from_secs(110);
/// Input lines and pacing: about 12 s of work per source subtask when nothing disturbs the job, long
/// enough for both phases and the rejoin (a healed SYN retry can take a few seconds).
const LINES: usize = 72_000;
const LINE_DELAY_US: &str = "500";
/// How long the network stays slow (at least; until a checkpoint timed out).
const SLOW_FOR: Duration = Duration::from_millis(1500);

/// Run a command; its stdout, or an error naming the command and its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("cannot run `{program}`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// The scenario needs root and iproute2; without them it fails (build with `CUTLINE_SKIP_NETNS=1` to
/// have it reported as ignored instead).
fn preflight() {
    let euid = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2)).map(str::to_string)
    });
    assert_eq!(
        euid.as_deref(),
        Some("0"),
        "the network partition test needs root (it creates a network namespace and a veth pair and runs tc); \
         run it as root, or set CUTLINE_SKIP_NETNS=1 to skip it explicitly"
    );
    for tool in ["ip", "tc"] {
        if let Err(e) = run(tool, &["-V"]) {
            panic!(
                "the network partition test needs `{tool}` (iproute2): {e}; install iproute2, or set CUTLINE_SKIP_NETNS=1 \
                 to skip it explicitly"
            );
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Side {
    Host,
    Namespace,
}

/// A network namespace joined to the host by a veth pair; deleted (with the pair) when dropped, also
/// when the test panics.
struct Netns {
    name: String,
    host_if: String,
    ns_if: String,
    host_ip: String,
    ns_ip: String,
    /// Whether the kernel has `sch_netem`.
    netem: bool,
}

impl Netns {
    fn create() -> Netns {
        let pid = std::process::id();
        let (name, host_if, ns_if) = (format!("cutl-{pid}"), format!("cvh{pid}"), format!("cvn{pid}"));
        // Leftovers of an earlier test process that had this pid.
        let _ = run("ip", &["link", "del", &host_if]);
        let _ = run("ip", &["netns", "del", &name]);
        let (host_ip, ns_ip) = free_subnet(pid);
        // The guard exists before anything is created: a failure below cleans up what was made.
        let mut n = Netns { name, host_if, ns_if, host_ip, ns_ip, netem: false };
        must("ip", &["netns", "add", &n.name]);
        must("ip", &["link", "add", &n.host_if, "type", "veth", "peer", "name", &n.ns_if]);
        must("ip", &["link", "set", &n.ns_if, "netns", &n.name]);
        // One segment per packet, so that a queue of N packets holds N real packets (best effort: older
        // kernels cannot change it on a live link, and only the htb shaping's delay depends on it).
        let _ = run("ip", &["link", "set", "dev", &n.host_if, "gso_max_segs", "1"]);
        let _ = run("ip", &["-n", &n.name, "link", "set", "dev", &n.ns_if, "gso_max_segs", "1"]);
        must("ip", &["addr", "add", &format!("{}/30", n.host_ip), "dev", &n.host_if]);
        must("ip", &["link", "set", &n.host_if, "up"]);
        must("ip", &["-n", &n.name, "addr", "add", &format!("{}/30", n.ns_ip), "dev", &n.ns_if]);
        must("ip", &["-n", &n.name, "link", "set", &n.ns_if, "up"]);
        must("ip", &["-n", &n.name, "link", "set", "lo", "up"]);
        match n.tc(Side::Namespace, "qdisc", "add", &["root", "netem", "delay", "1ms"]) {
            Ok(_) => {
                n.netem = true;
                n.tc_must(Side::Namespace, "qdisc", "del", &["root"]);
            }
            Err(e) => {
                eprintln!("partition: netem is not available ({e}); shaping with htb and cutting with a pfifo of 0")
            }
        }
        n
    }

    fn dev(&self, side: Side) -> &str {
        match side {
            Side::Host => &self.host_if,
            Side::Namespace => &self.ns_if,
        }
    }

    /// `tc OBJECT VERB dev DEV REST...` on one end of the pair.
    fn tc(&self, side: Side, object: &str, verb: &str, rest: &[&str]) -> Result<String, String> {
        let mut args = vec![object, verb, "dev", self.dev(side)];
        args.extend_from_slice(rest);
        match side {
            Side::Host => run("tc", &args),
            Side::Namespace => {
                let mut all = vec!["netns", "exec", &self.name, "tc"];
                all.extend(args);
                run("ip", &all)
            }
        }
    }

    fn tc_must(&self, side: Side, object: &str, verb: &str, rest: &[&str]) {
        self.tc(side, object, verb, rest).unwrap_or_else(|e| panic!("{e}"));
    }

    /// A slow network between the host and the namespace; returns how.
    fn slow(&self, coordinator_port: u16) -> &'static str {
        let port = coordinator_port.to_string();
        for side in [Side::Host, Side::Namespace] {
            if self.netem {
                self.tc_must(side, "qdisc", "add", &["root", "netem", "limit", "100000", "delay", "400ms"]);
                continue;
            }
            self.tc_must(side, "qdisc", "add", &["root", "handle", "1:", "htb", "default", "20"]);
            self.tc_must(side, "class", "add", &["parent", "1:", "classid", "1:10", "htb", "rate", "1gbit"]);
            let slow = ["parent", "1:", "classid", "1:20", "htb", "rate", "256kbit", "ceil", "256kbit", "burst", "2k"];
            self.tc_must(side, "class", "add", &slow);
            self.tc_must(side, "qdisc", "add", &["parent", "1:20", "handle", "20:", "pfifo", "limit", "10"]);
            for (prio, dir) in [("1", "sport"), ("2", "dport")] {
                let fast = ["parent", "1:", "protocol", "ip", "prio", prio, "u32", "match", "ip", dir, &port, "0xffff"];
                self.tc_must(side, "filter", "add", &[&fast[..], &["flowid", "1:10"]].concat());
            }
        }
        if self.netem {
            "netem delay 400ms on both ends"
        } else {
            "htb 256 kbit/s for the data plane on both ends (no netem), control connections unshaped"
        }
    }

    /// Drop every packet between the host and the namespace; returns how.
    fn cut(&self) -> &'static str {
        for side in [Side::Host, Side::Namespace] {
            if self.netem {
                self.tc_must(side, "qdisc", "replace", &["root", "netem", "loss", "100%"]);
            } else {
                self.tc_must(side, "qdisc", "replace", &["root", "pfifo", "limit", "0"]);
            }
        }
        if self.netem {
            "netem loss 100% on both ends"
        } else {
            "pfifo limit 0 on both ends (no netem)"
        }
    }

    /// Back to a plain veth pair.
    fn heal(&self) {
        for side in [Side::Host, Side::Namespace] {
            self.tc_must(side, "qdisc", "del", &["root"]);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end deletes the pair; the namespace goes once its processes are gone.
        let _ = run("ip", &["link", "del", &self.host_if]);
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

/// A /30 in 10.213.0.0/16 that nothing on the host uses: (host side, namespace side).
fn free_subnet(pid: u32) -> (String, String) {
    let used = must("ip", &["-o", "-4", "addr", "show"]) + &must("ip", &["-4", "route", "show", "table", "all"]);
    for attempt in 0..64u32 {
        let block = pid.wrapping_add(attempt.wrapping_mul(2531)) % (250 * 64);
        let (c, d) = (block / 64, (block % 64) * 4);
        let (net, host, ns) =
            (format!("10.213.{c}.{d}/30"), format!("10.213.{c}.{}", d + 1), format!("10.213.{c}.{}", d + 2));
        if ![&net, &format!("{host}/"), &format!("{ns}/"), &format!("{host} "), &format!("{ns} ")]
            .iter()
            .any(|s| used.contains(s.as_str()))
        {
            return (host, ns);
        }
    }
    panic!("no free /30 in 10.213.0.0/16 for the test namespace: {used}");
}

/// The processes of the scenario; all killed when dropped.
struct Procs<'a> {
    s: &'a Scratch,
    started: Instant,
    coordinator: Child,
    workers: Vec<(&'static str, Child)>,
}

impl Procs<'_> {
    fn deadline(&self) -> Instant {
        self.started + TIME_LIMIT
    }

    /// Wait (at most `limit`, and within the scenario's bound) until `cond` holds of the coordinator's
    /// events, while the job runs.
    fn wait_for(&mut self, what: &str, limit: Duration, mut cond: impl FnMut(&[LogEvent]) -> bool) {
        let deadline = (Instant::now() + limit).min(self.deadline());
        loop {
            if cond(&self.s.events("coordinator")) {
                return;
            }
            if let Some(st) = self.coordinator.try_wait().unwrap() {
                panic!(
                    "the job ended ({st}) while waiting for {what} (too short a job, or a failure); logs in {}",
                    self.s.dir.display()
                );
            }
            assert!(Instant::now() < deadline, "waited {limit:?} for {what} in vain; logs in {}", self.s.dir.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_exit(&mut self) -> ExitStatus {
        loop {
            if let Some(st) = self.coordinator.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < self.deadline(),
                "the job did not finish within {TIME_LIMIT:?}; logs in {}",
                self.s.dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Procs<'_> {
    fn drop(&mut self) {
        let _ = self.coordinator.kill();
        let _ = self.coordinator.wait();
        for (_, w) in &mut self.workers {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// The ids the coordinator gave to workers whose data plane is at `ip`, in the order they joined
/// (`worker_joined` events; the address is in the message only).
fn joins_from(events: &[LogEvent], ip: &str) -> Vec<u64> {
    let at = format!("data plane at {ip}:");
    named(events, "worker_joined").filter(|e| e.message().contains(&at)).map(|e| e.need_u64("worker")).collect()
}

/// Checkpoints that failed because they timed out (`checkpoint_failed` events).
fn timed_out(events: &[LogEvent]) -> usize {
    named(events, "checkpoint_failed").filter(|e| e.str("reason").is_some_and(|r| r.starts_with("timed out"))).count()
}

/// `cutline tune` the running job.
fn tune(s: &Scratch, settings: &[&str]) {
    let out = cutline().args(["tune", "--state", &s.arg("state")]).args(settings).output().unwrap();
    assert!(
        out.status.success(),
        "cutline tune {settings:?} failed: {}; logs in {}",
        String::from_utf8_lossy(&out.stderr),
        s.dir.display()
    );
}

#[test]
#[cfg_attr(
    cutline_skip_netns,
    ignore = "built with CUTLINE_SKIP_NETNS=1: the partition scenario needs root and iproute2"
)]
fn a_worker_on_a_slow_then_partitioned_network_is_lost_and_joins_again_and_the_output_is_exact() {
    preflight();
    let started = Instant::now();
    // Dropped last: the processes go first, then the namespace.
    let net = Netns::create();
    let s = Scratch::new("partition");
    let text = word_lines(42, LINES, (8, 8), 500);
    s.write("input.txt", &text);
    s.write("secret", SECRET);
    let port = std::net::TcpListener::bind((net.host_ip.as_str(), 0)).unwrap().local_addr().unwrap().port();
    let addr = format!("{}:{port}", net.host_ip);
    eprintln!(
        "partition: namespace {} ({}), host {} ({}), coordinator {addr}, scratch {}",
        net.name,
        net.ns_ip,
        net.host_if,
        net.host_ip,
        s.dir.display()
    );
    let ns_ip = net.ns_ip.clone();
    let timeline = {
        let coordinator = cutline()
            .args(["run", "wordcount", "--input", &s.arg("input.txt"), "--output", &s.arg("out")])
            .args(["--state", &s.arg("state"), "--parallelism", "3", "--line-delay-us", LINE_DELAY_US])
            .args(["--checkpoint-interval", "50ms", "--checkpoint-timeout", "300ms"])
            .args(["--coordinator", &addr, "--workers", "3", "--min-workers", "2", "--replacement-wait", "1s"])
            .args(["--secret-file", &s.arg("secret"), "--heartbeat-interval", "50ms", "--heartbeat-timeout", "1s"])
            .arg("-v")
            .stdout(s.log("coordinator"))
            .stderr(s.log("coordinator"))
            .spawn()
            .unwrap();
        let mut p = Procs { s: &s, started, coordinator, workers: Vec::new() };
        let secret = s.arg("secret");
        let worker_args = ["worker", "--join", &addr, "--secret-file", &secret, "--rejoin-timeout", "60s", "-v"];
        for name in ["worker-0", "worker-1"] {
            let w = cutline()
                .args(worker_args)
                .args(["--listen", &format!("{}:0", net.host_ip)])
                .stdout(s.log(name))
                .stderr(s.log(name))
                .spawn()
                .unwrap();
            p.workers.push((name, w));
        }
        // `ip netns exec` execs the worker: the child is the worker process itself.
        let w = Command::new("ip")
            .args(["netns", "exec", &net.name, BIN])
            .args(worker_args)
            .args(["--listen", &format!("{ns_ip}:0")])
            .env("CUTLINE_LOG_FORMAT", "json")
            .stdout(s.log("worker-ns"))
            .stderr(s.log("worker-ns"))
            .spawn()
            .unwrap();
        p.workers.push(("worker-ns", w));

        // Running on all three, checkpoints completing.
        p.wait_for("the first checkpoints on 3 workers", Duration::from_secs(30), |ev| {
            joins_from(ev, &ns_ip).len() == 1 && count(ev, "checkpoint_complete") >= 3
        });
        let ns_id = joins_from(&s.events("coordinator"), &ns_ip)[0];
        let running_at = started.elapsed();
        // While the network is slow, failed checkpoints do not fail the job over: a redeployment is not
        // what this phase is about.
        tune(&s, &["--tolerable-failures", "1000"]);
        std::thread::sleep(Duration::from_millis(500));

        // Phase 1: a slow network. Checkpoints time out; no worker is lost, the job does not restart.
        let mark = s.events("coordinator").len();
        let how = net.slow(port);
        let slowed = Instant::now();
        eprintln!("partition: phase 1 (slow network: {how}) at {:?}", started.elapsed());
        p.wait_for("a checkpoint that timed out on the slow network", Duration::from_secs(20), |ev| {
            timed_out(&ev[mark..]) > 0
        });
        std::thread::sleep(SLOW_FOR.saturating_sub(slowed.elapsed()));
        net.heal();
        let slow_for = slowed.elapsed();
        let healed_mark = s.events("coordinator").len();
        p.wait_for("a complete checkpoint once the network is fast again", Duration::from_secs(30), |ev| {
            count(&ev[healed_mark..], "checkpoint_complete") > 0
        });
        let phase1 = s.events("coordinator").split_off(mark);
        let timeouts = timed_out(&phase1);
        eprintln!("partition: phase 1 healed after {slow_for:?}: {timeouts} checkpoint(s) timed out");
        for (what, event) in [("a worker was lost", "worker_lost"), ("the job failed over", "failover")] {
            assert_eq!(
                count(&phase1, event),
                0,
                "{what} although the network was only slow ({how}); logs in {}",
                s.dir.display()
            );
        }
        tune(&s, &["--tolerable-failures", "3"]);
        let phase1_done = started.elapsed();

        // Phase 2: a partition. The coordinator loses the worker and runs on the two others; the cut-off
        // worker loses its coordinator.
        let mark = s.events("coordinator").len();
        let how = net.cut();
        let cut = Instant::now();
        eprintln!("partition: phase 2 (partition: {how}) at {:?}", started.elapsed());
        p.wait_for("the coordinator to lose the cut-off worker", Duration::from_secs(20), |ev| {
            named(&ev[mark..], "worker_lost").any(|e| e.u64("worker") == Some(ns_id) && e.level == "WARN")
        });
        let detected = cut.elapsed();
        p.wait_for("the job to run on the two reachable workers", Duration::from_secs(20), |ev| {
            named(&ev[mark..], "fewer_workers").any(|e| e.message().contains("running on 2 of 3 workers"))
        });
        let degraded = cut.elapsed();
        p.wait_for("the cut-off worker to find it lost its coordinator", Duration::from_secs(20), |_| {
            count(&s.events("worker-ns"), "coordinator_lost") > 0
        });
        net.heal();
        let healed = cut.elapsed();
        eprintln!("partition: phase 2 healed at {:?}", started.elapsed());
        p.wait_for("the healed worker to join again", Duration::from_secs(60), |ev| joins_from(ev, &ns_ip).len() >= 2);
        let rejoined = cut.elapsed();
        let ids = joins_from(&s.events("coordinator"), &ns_ip);
        assert_ne!(ids[0], ids[1], "a worker that joins again gets a new id; logs in {}", s.dir.display());

        let st = p.wait_exit();
        assert!(st.success(), "the job failed: {st}; logs in {}", s.dir.display());
        let finished = started.elapsed();
        // Told the job is over, every worker exits, the healed one too.
        let deadline = (Instant::now() + Duration::from_secs(15)).min(p.deadline());
        for (name, w) in &mut p.workers {
            let st = loop {
                if let Some(st) = w.try_wait().unwrap() {
                    break st;
                }
                assert!(
                    Instant::now() < deadline,
                    "{name} did not exit after the job ended; logs in {}",
                    s.dir.display()
                );
                std::thread::sleep(Duration::from_millis(20));
            };
            assert!(st.success(), "{name} exited with {st}; logs in {}", s.dir.display());
        }
        format!(
            "running at {running_at:?}, phase 1 done at {phase1_done:?} ({timeouts} timeouts); \
             after the cut: lost at {detected:?}, on 2 workers at {degraded:?}, healed at {healed:?}, joined again at \
             {rejoined:?}; finished at {finished:?}"
        )
    };
    // The run's report line (stdout).
    let log = s.log_text("coordinator");
    assert!(
        log.lines().any(|l| l.starts_with("finished: final checkpoint")),
        "the job did not report its end; logs in {}",
        s.dir.display()
    );
    check_output(&text, &s.path("out"), "partition", &s.dir);
    eprintln!("partition: {timeline}");
}
