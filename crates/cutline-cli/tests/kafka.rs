//! `cutline run wordcount --input kafka://... --output kafka://...` against a real broker (feature
//! `kafka`; `scripts/test` starts Tansu and exports `CUTLINE_KAFKA_BROKERS`): killed with SIGKILL at
//! random moments and, with `--kill-self-at`, in the commit window and at the other steps of the
//! sink's protocol, then resumed; in one process (also at another parallelism each time) and on two
//! workers, and (with feature `postgres`) into a PostgreSQL table. Word count emits every update of
//! a word's count, so a `read_committed` consumer of the output must see each (word, n) for
//! n = 1..count exactly once: a duplicate shows as a pair seen twice, a loss as a pair missing.
#![cfg(all(unix, feature = "kafka"))]

mod common;

use common::cluster::{sink_chaos, Cluster};
use common::drill::{kill_and_resume, Drill, DrillReport};
use common::{cutline, expected_counts, word_lines, wordcount_job, Scratch};
use cutline::testing::kafka_committed::read_committed;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::BTreeMap;
use std::time::Duration;

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

/// A word-count pipeline from a topic of 4 partitions into one of [`OUTPUT_PARTITIONS`], the input
/// written: `name` names its scratch directory and topics, `seed` its text.
struct Pipeline {
    scratch: Scratch,
    text: String,
    output: String,
    input_url: String,
    output_url: String,
}

fn kafka_to_kafka(name: &str, seed: u64) -> Pipeline {
    let scratch = Scratch::new(name);
    let text = word_lines(seed, 30_000, (1, 8), 300);
    let input = topic(&format!("{name}-lines"), 4);
    let output = topic(&format!("{name}-counts"), OUTPUT_PARTITIONS);
    produce_lines(&input, &text);
    let input_url = format!("kafka://{}/{input}?bounded=true", brokers());
    // Tansu 0.6.0 can lose the offsets of a transaction sharing a partition with another producer's.
    let output_url = format!("kafka://{}/{output}?partitioning=fixed", brokers());
    Pipeline { scratch, text, output, input_url, output_url }
}

#[test]
fn wordcount_from_kafka_into_kafka_killed_at_random_moments_then_resumed_commits_every_update_exactly_once() {
    let Pipeline { scratch, text, output, input_url, output_url } = kafka_to_kafka("kafka-kill9", 13);
    let args = wordcount_job(&input_url, &output_url, &scratch.arg("state"), "20ms", 40, &["-v"]);
    let drill = Drill {
        rounds: 8,
        kill_delay_ms: (300, 1200),
        parallelism: &[],
        time_limit: Duration::from_secs(240),
        seed: 5,
    };
    let DrillReport { killed, restored, .. } = kill_and_resume(&scratch, &args, &drill);
    assert_each_update_once(&text, &output);
    eprintln!("{killed} kills, restored checkpoints {restored:?}");
}

/// The same drill with every restart at another parallelism (2, 3, 1, 3, 2, 3, 1, ...; the runs that
/// kill themselves at a step of the sink's protocol all at 3, the next at 1 or 2): the source's
/// partitions go to their owners at the new parallelism, and each sink subtask takes over the old
/// subtasks `j` with `j % parallelism == subtask`, committing their checkpoints under their own
/// transactional ids and markers (at most 3 subtasks for 3 output partitions, so that with `fixed`
/// partitioning no two producers share one).
#[test]
fn wordcount_from_kafka_into_kafka_resumed_at_another_parallelism_after_each_kill_commits_every_update_once() {
    let Pipeline { scratch, text, output, input_url, output_url } = kafka_to_kafka("kafka-rescale", 37);
    let args = wordcount_job(&input_url, &output_url, &scratch.arg("state"), "20ms", 40, &["-v"]);
    let drill = Drill {
        rounds: 10,
        kill_delay_ms: (300, 1200),
        parallelism: &[2, 3, 1, 3],
        time_limit: Duration::from_secs(240),
        seed: 41,
    };
    let report = kill_and_resume(&scratch, &args, &drill);
    assert_each_update_once(&text, &output);
    eprintln!("{} kills; restores (checkpoint, written at, restored at): {:?}", report.killed, report.restores);
}

/// The same pipeline on a cluster of two worker processes (one source and one sink subtask each,
/// so their transactional producers live in different processes): workers and the coordinator are
/// SIGKILLed at seeded moments, and every other killed worker comes back with `--kill-self-at` a
/// step of the sink's protocol, so that kills land in the commit window of one worker while the
/// other commits.
#[test]
fn wordcount_from_kafka_into_kafka_on_two_workers_killed_many_times_commits_every_update_exactly_once() {
    let Pipeline { scratch, text, output, input_url, output_url } = kafka_to_kafka("kafka-cluster", 17);
    let job = wordcount_job(&input_url, &output_url, &scratch.arg("state"), "30ms", 500, &["--replacement-wait", "3s"]);
    let (killed, restored) = sink_chaos(&scratch, &job, 11);
    assert_each_update_once(&text, &output);
    eprintln!("kills {killed:?}; restored checkpoints {restored:?}");
}

/// Kafka -> word count -> PostgreSQL, the same drill: killed at random moments and at every step of
/// the PostgreSQL sink's protocol while it reads a topic; the table must hold exactly the counts.
#[cfg(feature = "postgres")]
#[test]
fn wordcount_from_kafka_into_postgres_killed_at_random_moments_then_resumed_holds_exactly_the_counts() {
    use common::pg::{assert_exact_counts, psql, url};
    let scratch = Scratch::new("kafka-pg-kill9");
    // A large vocabulary, so that upserts cannot heal a lost transaction (see common/pg.rs).
    let text = word_lines(23, 30_000, (1, 8), 20_000);
    let input = topic("cli-pg-lines", 4);
    produce_lines(&input, &text);
    let input_url = format!("kafka://{}/{input}?bounded=true", brokers());
    let table = "cli_kafka_counts";
    psql(&format!("DROP TABLE IF EXISTS {table}"));
    let output = format!("{}?table={table}", url());
    let args = wordcount_job(&input_url, &output, &scratch.arg("state"), "20ms", 100, &["-v"]);
    let drill = Drill {
        rounds: 8,
        kill_delay_ms: (300, 1200),
        parallelism: &[],
        time_limit: Duration::from_secs(240),
        seed: 9,
    };
    let DrillReport { killed, restored, .. } = kill_and_resume(&scratch, &args, &drill);
    assert_exact_counts(&text, &input_url, table, &restored, &scratch.events("runs"));
    eprintln!("{killed} kills, restored checkpoints {restored:?}");
}

/// A configuration error of a connector that a worker finds (here: an output topic that does not
/// exist) stops the job at once, as in one process, instead of restarting it until the restart
/// strategy gives up.
#[test]
fn a_missing_output_topic_on_a_cluster_fails_the_job_at_once_without_restarts() {
    let scratch = Scratch::new("kafka-cluster-missing");
    let file = scratch.write("in.txt", "a b\n").display().to_string();
    let output_url = format!("kafka://{}/no-such-topic-{}", brokers(), std::process::id());
    let job: Vec<String> =
        ["run", "wordcount", "--input", &file, "--output", &output_url, "--state", &scratch.arg("state")]
            .map(String::from)
            .to_vec();
    let mut c = Cluster::start(&scratch, 1, &job);
    let status = c.wait(Duration::from_secs(60));
    assert!(!status.success(), "the job succeeded without its output topic");
    let log = scratch.log_text("coordinator");
    assert!(log.contains("does not exist: create it first"), "{log}");
    let restarts = common::count(&scratch.events("coordinator"), "restart");
    assert_eq!(restarts, 0, "the job restarted {restarts} time(s) for a topic that is missing: {log}");
}

/// A `read_committed` consumer of `output` sees each (word, n) for n = 1..count(word) in `text`
/// exactly once.
fn assert_each_update_once(text: &str, output: &str) {
    let mut seen: BTreeMap<(String, u64), u32> = BTreeMap::new();
    for r in read_committed(&brokers(), output, OUTPUT_PARTITIONS).unwrap() {
        let word = String::from_utf8(r.key.unwrap()).unwrap();
        let n: u64 = String::from_utf8(r.value.unwrap()).unwrap().parse().unwrap();
        *seen.entry((word, n)).or_insert(0) += 1;
    }
    let want: BTreeMap<(String, u64), u32> =
        expected_counts(text).into_iter().flat_map(|(w, c)| (1..=c).map(move |n| ((w.clone(), n), 1))).collect();
    let doubled: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(doubled.is_empty(), "updates committed twice: {doubled:?}");
    let lost: Vec<_> = want.keys().filter(|k| !seen.contains_key(*k)).take(5).collect();
    assert!(lost.is_empty(), "updates lost: {lost:?} ({} of {} seen)", seen.len(), want.len());
    assert_eq!(seen.len(), want.len(), "updates that no failure-free run writes");
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
