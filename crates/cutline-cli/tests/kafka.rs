//! `cutline run wordcount --input kafka://... --output kafka://...` against a real broker (feature
//! `kafka`; `scripts/test` starts Tansu and exports `CUTLINE_KAFKA_BROKERS`): killed with SIGKILL at
//! random moments and, with `--kill-self-at`, in the commit window and at the other steps of the
//! sink's protocol, then resumed. Word count emits every update of a word's count, so a
//! `read_committed` consumer of the output must see each (word, n) for n = 1..count exactly once: a
//! duplicate shows as a pair seen twice, a loss as a pair missing.
#![cfg(all(unix, feature = "kafka"))]

mod common;

use common::{cutline, expected_counts, restored_checkpoints, wait_bounded, word_lines, Scratch, XorShift};
use cutline::testing::kafka_committed::read_committed;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

const KILL_ROUNDS: u32 = 8;
const KILL_DELAY_MS: (u64, u64) = (300, 1200);
const TIME_LIMIT: Duration = Duration::from_secs(240);
const OUTPUT_PARTITIONS: i32 = 3;

fn brokers() -> String {
    std::env::var("CUTLINE_KAFKA_BROKERS").expect(
        "CUTLINE_KAFKA_BROKERS is not set: run the tests with scripts/test, or eval \"$(scripts/kafka-test-server)\" first",
    )
}

fn topic(name: &str, partitions: i32) -> String {
    let t = format!("{name}-{}", std::process::id());
    cutline::connectors::kafka::create_topic(&brokers(), &t, partitions).unwrap();
    t
}

/// The lines of `text` as records of `topic`, round-robin over its 4 partitions.
fn produce_lines(topic: &str, text: &str) {
    let p: BaseProducer = ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    for (i, line) in text.lines().enumerate() {
        let mut r = BaseRecord::<(), str>::to(topic).partition((i % 4) as i32).payload(line);
        while let Err((_, back)) = p.send(r) {
            r = back;
            p.poll(Duration::from_millis(10));
        }
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

#[test]
fn wordcount_from_kafka_into_kafka_killed_at_random_moments_then_resumed_commits_every_update_exactly_once() {
    let scratch = Scratch::new("kafka-kill9");
    let text = word_lines(13, 30_000, (1, 8), 300);
    let input = topic("cli-lines", 4);
    let output = topic("cli-counts", OUTPUT_PARTITIONS);
    produce_lines(&input, &text);
    let input_url = format!("kafka://{}/{input}?bounded=true", brokers());
    // Tansu 0.6.0 can lose the offsets of a transaction sharing a partition with another producer's.
    let output_url = format!("kafka://{}/{output}?partitioning=fixed", brokers());
    let state = scratch.path("state");
    let args = || -> Vec<String> {
        [
            "run",
            "wordcount",
            "--input",
            &input_url,
            "--output",
            &output_url,
            "--state",
            &state.display().to_string(),
            "--parallelism",
            "2",
            "--checkpoint-interval",
            "20ms",
            "--line-delay-us",
            "40",
            "-v",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut rng = XorShift::new(5);
    let start = Instant::now();
    let mut killed = 0;
    // Even rounds are killed from outside at a random moment; odd ones kill themselves at a step of
    // the sink's protocol: in the commit window (a checkpoint complete, its transaction not yet
    // committed), between two commits, before preparing, while recovering.
    let aimed = ["sink-commit", "sink-commit-midway", "sink-commit", "sink-prepare", "sink-recover"];
    for round in 0..KILL_ROUNDS {
        assert!(start.elapsed() < TIME_LIMIT, "time limit exceeded in round {round}");
        let mut a = args();
        if round % 2 == 1 {
            a.extend(["--kill-self-at".into(), format!("{}:{}", rng.pick(&aimed), rng.range(2, 12))]);
        }
        let mut child = cutline().args(&a).stdout(scratch.log("runs")).stderr(scratch.log("runs")).spawn().unwrap();
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_millis(rng.range(KILL_DELAY_MS.0, KILL_DELAY_MS.1)));
            let _ = child.kill();
        }
        let status = wait_bounded(&mut child, &scratch, &format!("round {round}"));
        match status.signal() {
            Some(9) => killed += 1,
            _ => {
                assert!(status.success(), "round {round}: the run failed: {}", scratch.log_text("runs"));
                break; // it finished before the kill
            }
        }
    }
    let mut last = cutline().args(args()).stdout(scratch.log("runs")).stderr(scratch.log("runs")).spawn().unwrap();
    let status = wait_bounded(&mut last, &scratch, "the last run");
    assert!(status.success(), "the last run failed: {}", scratch.log_text("runs"));
    assert!(killed >= 3, "only {killed} runs were killed: the drill injected too few failures");
    let restored = restored_checkpoints(&scratch.events("runs"));
    assert!(!restored.is_empty(), "no run restored a checkpoint: every kill landed before the first one");

    let mut seen: BTreeMap<(String, u64), u32> = BTreeMap::new();
    for r in read_committed(&brokers(), &output, OUTPUT_PARTITIONS).unwrap() {
        let word = String::from_utf8(r.key.unwrap()).unwrap();
        let n: u64 = String::from_utf8(r.value.unwrap()).unwrap().parse().unwrap();
        *seen.entry((word, n)).or_insert(0) += 1;
    }
    let want: BTreeMap<(String, u64), u32> =
        expected_counts(&text).into_iter().flat_map(|(w, c)| (1..=c).map(move |n| ((w.clone(), n), 1))).collect();
    let doubled: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(doubled.is_empty(), "updates committed twice: {doubled:?}");
    let lost: Vec<_> = want.keys().filter(|k| !seen.contains_key(*k)).take(5).collect();
    assert!(lost.is_empty(), "updates lost: {lost:?} ({} of {} seen)", seen.len(), want.len());
    assert_eq!(seen.len(), want.len(), "updates that no failure-free run writes");
    eprintln!("{killed} kills, restored checkpoints {restored:?}");
}

#[test]
fn a_kafka_url_without_a_topic_or_with_an_unknown_parameter_is_refused_before_anything_starts() {
    let scratch = Scratch::new("kafka-bad-url");
    let file = scratch.write("in.txt", "a b\n").display().to_string();
    for (input, output, expect) in [
        ("kafka://127.0.0.1:1", "out", "kafka://HOST:PORT"),
        ("kafka://127.0.0.1:1/t?bounded=maybe", "out", "bounded=true|false"),
        (file.as_str(), "kafka://127.0.0.1:1/t?mode=twice", "mode=exactly-once|at-least-once"),
        (file.as_str(), "kafka://127.0.0.1:1/t?partitioning=random", "partitioning=by-key|fixed"),
    ] {
        let out = cutline()
            .args(["run", "wordcount", "--input", input, "--output", output, "--state", &scratch.arg("state")])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{input} {output} was accepted");
        assert!(stderr.contains(expect), "{input} {output}: {stderr}");
    }
}

#[test]
fn bench_kafka_prints_rates_only_for_outputs_it_read_back_and_checked() {
    let out = cutline()
        .args(["bench-kafka", "--brokers", &brokers(), "--records", "3000", "--keys", "7", "--reps", "1"])
        .args(["--checkpoint-interval", "100ms"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("records=3000") && stdout.contains("verified=both"), "{stdout}");
    assert!(stdout.contains("median engine_records_per_s="), "{stdout}");
}

#[test]
fn bench_kafka_latency_prints_quantiles_only_when_every_record_arrived_once() {
    let out = cutline()
        .args(["bench-kafka-latency", "--brokers", &brokers(), "--intervals", "100ms", "--rate", "500"])
        .args(["--seconds", "2", "--keys", "7"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("interval=100ms") && stdout.contains("verified=exactly-once"), "{stdout}");
    assert!(stdout.contains("p99_ms="), "{stdout}");
}
