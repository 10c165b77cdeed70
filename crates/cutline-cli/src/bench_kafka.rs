//! `cutline bench-kafka`: records per second of a Kafka -> keyed COUNT+SUM -> Kafka job (the Kafka
//! source, exactly-once Kafka sink, checkpoints), against a bare loop of the same client doing the
//! same work (consume, aggregate per key, produce every update in transactions committed at the
//! same interval, with the consumed offsets in each): the ceiling. Interleaved; both outputs are read
//! back and checked before a rate is printed.
//!
//! `cutline bench-kafka-latency`: end-to-end latency of such a job (keyed count) at given checkpoint
//! intervals, from each record's producer timestamp to a `read_committed` reader seeing its update.

use anyhow::{bail, Context, Result};
use cutline::connectors::kafka::{self, KafkaRecord, KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use cutline::{Job, LocalDirStore, RunConfig};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait of one broker call of the benchmark (transactions, flushes).
const CALL_TIMEOUT_MS: u64 = 60_000;
/// Reading an output back ends when nothing new arrived for this long.
const QUIET_MS: u64 = 3_000;

/// What one benchmark round works on.
struct Setup<'a> {
    brokers: &'a str,
    input: String,
    records: u64,
    keys: u64,
    partitions: i32,
    interval_ms: u64,
    stamp: u128,
}

fn key_of(i: u64, keys: u64) -> String {
    format!("k{}", i % keys)
}

fn produce(p: &BaseProducer, topic: &str, partition: Option<i32>, key: &[u8], value: &[u8]) -> Result<()> {
    let mut r = BaseRecord::to(topic).key(key).payload(value);
    if let Some(part) = partition {
        r = r.partition(part);
    }
    let started = Instant::now();
    loop {
        match p.send(r) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                if started.elapsed() < Duration::from_millis(CALL_TIMEOUT_MS) =>
            {
                r = back;
                p.poll(Duration::from_millis(1));
            }
            Err((e, _)) => bail!("producing into {topic}: {e}"),
        }
    }
}

/// The input: record `i` has key `k{i % keys}` and value `i` (8 bytes, big-endian), partitions
/// round robin. Not timed.
fn fill_input(s: &Setup) -> Result<()> {
    kafka::create_topic(s.brokers, &s.input, s.partitions).map_err(|e| anyhow::anyhow!("{e}"))?;
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", s.brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .create()?;
    for i in 0..s.records {
        produce(&p, &s.input, Some((i % s.partitions as u64) as i32), key_of(i, s.keys).as_bytes(), &i.to_be_bytes())?;
    }
    p.flush(Duration::from_millis(CALL_TIMEOUT_MS))?;
    Ok(())
}

fn encode_update(count: u64, sum: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&count.to_be_bytes());
    v[8..].copy_from_slice(&sum.to_be_bytes());
    v
}

fn read_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

/// Read `topic` back (read_committed) and check it holds one update per input record, every key's
/// updates numbered 1, 2, ... without a gap or a repeat, and the last one's sum right.
fn check_output(s: &Setup, topic: &str, partitions: i32) -> Result<()> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", s.brokers)
        .set("group.id", format!("cutline-bench-check-{}", s.stamp))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut last: HashMap<Vec<u8>, (u64, u64)> = HashMap::new();
    let (mut n, mut quiet_since) = (0u64, Instant::now());
    while quiet_since.elapsed() < Duration::from_millis(QUIET_MS) {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                quiet_since = Instant::now();
                n += 1;
                let key = m.key().unwrap_or_default().to_vec();
                let v = m.payload().unwrap_or_default();
                let (count, sum) = (read_u64(v).unwrap_or(0), v.get(8..).and_then(read_u64).unwrap_or(0));
                let prev = last.insert(key.clone(), (count, sum)).map_or(0, |p| p.0);
                if count != prev + 1 {
                    bail!(
                        "{topic}: key {} has update {count} after {prev}: no rate printed",
                        String::from_utf8_lossy(&key)
                    );
                }
            }
            Some(Err(e)) => bail!("reading {topic} back: {e}"),
            None => {}
        }
    }
    if n != s.records {
        bail!("{topic} holds {n} updates, expected {}: no rate printed", s.records);
    }
    for k in 0..s.keys.min(s.records) {
        let mine = (k..s.records).step_by(s.keys as usize);
        let want = (mine.clone().count() as u64, mine.sum::<u64>());
        if last.get(key_of(k, s.keys).as_bytes()) != Some(&want) {
            bail!(
                "{topic}: key k{k} ends at {:?}, expected {want:?}: no rate printed",
                last.get(key_of(k, s.keys).as_bytes())
            );
        }
    }
    Ok(())
}

fn bare(s: &Setup, rep: u32) -> Result<f64> {
    let output = format!("bench-kafka-bare-{}-{rep}", s.stamp);
    kafka::create_topic(s.brokers, &output, s.partitions).map_err(|e| anyhow::anyhow!("{e}"))?;
    let group = format!("cutline-bench-bare-{}-{rep}", s.stamp);
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", s.brokers)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..s.partitions {
        tpl.add_partition_offset(&s.input, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", s.brokers)
        .set("transactional.id", &group)
        .set("linger.ms", "5")
        .create()?;
    let timeout = Duration::from_millis(CALL_TIMEOUT_MS);
    p.init_transactions(timeout)?;
    let start = Instant::now();
    p.begin_transaction()?;
    let mut state: HashMap<Vec<u8>, (u64, u64)> = HashMap::new();
    let mut next: HashMap<i32, i64> = HashMap::new();
    let (mut seen, mut committed_at) = (0u64, Instant::now());
    let commit = |next: &HashMap<i32, i64>| -> Result<()> {
        let mut offsets = TopicPartitionList::new();
        for (part, o) in next {
            offsets.add_partition_offset(&s.input, *part, Offset::Offset(*o))?;
        }
        let meta = c.group_metadata().context("the bare consumer has no group")?;
        p.send_offsets_to_transaction(&offsets, &meta, timeout)?;
        p.commit_transaction(timeout)?;
        Ok(())
    };
    while seen < s.records {
        if let Some(m) = c.poll(Duration::from_millis(10)) {
            let m = m?;
            let key = m.key().unwrap_or_default();
            let v = read_u64(m.payload().unwrap_or_default()).unwrap_or(0);
            let st = match state.get_mut(key) {
                Some(st) => st,
                None => state.entry(key.to_vec()).or_default(),
            };
            st.0 += 1;
            st.1 += v;
            produce(&p, &output, None, key, &encode_update(st.0, st.1))?;
            next.insert(m.partition(), m.offset() + 1);
            seen += 1;
        }
        p.poll(Duration::ZERO);
        if committed_at.elapsed() >= Duration::from_millis(s.interval_ms) {
            commit(&next)?;
            p.begin_transaction()?;
            committed_at = Instant::now();
        }
    }
    commit(&next)?;
    let secs = start.elapsed().as_secs_f64();
    check_output(s, &output, s.partitions)?;
    Ok(s.records as f64 / secs)
}

fn engine(s: &Setup, rep: u32, parallelism: u32) -> Result<f64> {
    let output = format!("bench-kafka-engine-{}-{rep}", s.stamp);
    kafka::create_topic(s.brokers, &output, s.partitions).map_err(|e| anyhow::anyhow!("{e}"))?;
    let job = Job::new("bench-kafka");
    job.set_parallelism(parallelism);
    let source_cfg = KafkaSourceConfig::new(s.brokers, &[&s.input]).bounded();
    let sink_cfg = KafkaSinkConfig::exactly_once(s.brokers, &output);
    job.source_from("in", move |_| KafkaSource::new(source_cfg.clone()))
        .map(|r: KafkaRecord| (r.key.unwrap_or_default(), read_u64(&r.value.unwrap_or_default()).unwrap_or(0)))
        .key_by(|(k, _): &(Vec<u8>, u64)| k.clone())
        .process("agg", |k: &Vec<u8>, st: &mut Option<(u64, u64)>, (_, v): (Vec<u8>, u64), out| {
            let st = st.get_or_insert((0, 0));
            st.0 += 1;
            st.1 += v;
            out.emit((k.clone(), st.0, st.1));
        })
        .sink_from("out", move |_| {
            KafkaSink::new(
                sink_cfg.clone(),
                |(k, n, sum): &(Vec<u8>, u64, u64), key: &mut Vec<u8>, value: &mut Vec<u8>| {
                    key.extend_from_slice(k);
                    value.extend_from_slice(&encode_update(*n, *sum));
                },
            )
        });
    let graph = job.build()?;
    let secs = crate::bench::timed_engine_run(&graph, &format!("bench-kafka {} {rep}", s.stamp), Some(s.interval_ms))?;
    check_output(s, &output, s.partitions)?;
    Ok(s.records as f64 / secs)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// End-to-end latency at one checkpoint interval: records produced at `rate` per second for
/// `seconds` (after the job is up) into an unbounded Kafka -> keyed count -> exactly-once Kafka job;
/// each output record carries its input's timestamp, and a `read_committed` reader takes the time
/// from that timestamp to the moment it reads the record. The first second is warm-up. Returns the
/// latencies in milliseconds, sorted; every record must arrive exactly once.
fn latencies(s: &Setup, interval_ms: u64, rate: u64, seconds: u64) -> Result<Vec<i64>> {
    let name = format!("{}-{interval_ms}ms", s.stamp);
    let (input, output) = (format!("bench-kafka-lat-in-{name}"), format!("bench-kafka-lat-out-{name}"));
    for t in [&input, &output] {
        kafka::create_topic(s.brokers, t, s.partitions).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let job = Job::new("bench-kafka-latency");
    let source_cfg = KafkaSourceConfig::new(s.brokers, &[&input]);
    let sink_cfg = KafkaSinkConfig::exactly_once(s.brokers, &output);
    job.source_from("in", move |_| KafkaSource::new(source_cfg.clone()))
        .map(|r: KafkaRecord| (r.key.unwrap_or_default(), r.timestamp_ms.unwrap_or(0)))
        .key_by(|(k, _): &(Vec<u8>, i64)| k.clone())
        .process("count", |k: &Vec<u8>, n: &mut Option<u64>, (_, ts): (Vec<u8>, i64), out| {
            *n.get_or_insert(0) += 1;
            out.emit((k.clone(), ts));
        })
        .sink_from("out", move |_| {
            KafkaSink::new(sink_cfg.clone(), |(k, ts): &(Vec<u8>, i64), key: &mut Vec<u8>, value: &mut Vec<u8>| {
                key.extend_from_slice(k);
                value.extend_from_slice(&ts.to_be_bytes());
            })
        });
    let dir = std::env::temp_dir().join(format!("cutline-bench-kafka-lat-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(&dir)?), format!("bench-kafka-latency {name}"));
    cfg.checkpoint.interval_ms = Some(interval_ms);
    let handle = cutline::spawn(job.build()?, cfg);
    let total = rate * seconds;
    let (brokers, out_topic, partitions, group) =
        (s.brokers.to_string(), output.clone(), s.partitions, format!("cutline-bench-lat-{name}"));
    let reader = std::thread::spawn(move || -> Result<Vec<(i64, i64)>> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            // Measure the job, not the reader's fetch wait (500 ms by default).
            .set("fetch.wait.max.ms", "5")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(&out_topic, p, Offset::Beginning)?;
        }
        c.assign(&tpl)?;
        let mut got = Vec::with_capacity(total as usize);
        let deadline = Instant::now() + Duration::from_secs(seconds + 60);
        while (got.len() as u64) < total && Instant::now() < deadline {
            if let Some(m) = c.poll(Duration::from_millis(5)) {
                let m = m?;
                let ts = read_u64(m.payload().unwrap_or_default()).unwrap_or(0) as i64;
                got.push((ts, now_ms() - ts));
            }
        }
        // A few more polls: a record seen twice shows up here.
        let quiet = Instant::now();
        while quiet.elapsed() < Duration::from_millis(QUIET_MS) {
            if let Some(m) = c.poll(Duration::from_millis(50)) {
                let m = m?;
                got.push((read_u64(m.payload().unwrap_or_default()).unwrap_or(0) as i64, 0));
            }
        }
        Ok(got)
    });
    // Let the job start (open the source and sink, first checkpoints) before the clock counts.
    std::thread::sleep(Duration::from_secs(3));
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", s.brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "1")
        .create()?;
    let start = Instant::now();
    let warmup_ends = now_ms() + 1_000;
    for i in 0..total {
        let due = Duration::from_micros(i * 1_000_000 / rate);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let key = key_of(i, s.keys);
        let r = BaseRecord::to(&input).key(key.as_bytes()).payload(&[][..]).timestamp(now_ms());
        if let Err((e, _)) = p.send(r) {
            bail!("producing the latency input: {e}");
        }
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_millis(CALL_TIMEOUT_MS))?;
    let got = reader.join().map_err(|_| anyhow::anyhow!("the latency reader panicked"))??;
    handle.control().stop();
    let report = handle.join().map_err(|e| anyhow::anyhow!("{e}"));
    let _ = std::fs::remove_dir_all(&dir);
    let report = report?;
    if report.restarts > 0 {
        bail!("the latency job restarted {} times: no latency printed", report.restarts);
    }
    if got.len() as u64 != total {
        bail!("{} of {total} records reached the output (exactly once expected): no latency printed", got.len());
    }
    let mut lat: Vec<i64> = got.into_iter().filter(|(ts, _)| *ts >= warmup_ends).map(|(_, l)| l).collect();
    lat.sort_unstable();
    if lat.is_empty() {
        bail!("no record after the warm-up: run longer");
    }
    Ok(lat)
}

/// Print p50, p99 and the maximum of the end-to-end latency at each of `intervals`.
pub(crate) fn bench_kafka_latency(
    brokers: &str,
    intervals: &str,
    rate: u64,
    seconds: u64,
    keys: u64,
    partitions: i32,
) -> Result<()> {
    if rate == 0 || seconds < 2 || keys == 0 || partitions <= 0 {
        bail!("--rate, --keys and --partitions must be above 0 and --seconds at least 2 (the first is warm-up)");
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let s = Setup { brokers, input: String::new(), records: 0, keys, partitions, interval_ms: 0, stamp };
    for interval in intervals.split(',') {
        let interval_ms = crate::args::parse_interval(interval)?.context("an interval must not be off")?;
        let lat = latencies(&s, interval_ms, rate, seconds)?;
        let q = |f: f64| lat[((lat.len() - 1) as f64 * f) as usize];
        println!(
            "interval={interval} rate={rate}/s seconds={seconds} measured={} p50_ms={} p99_ms={} max_ms={} verified=exactly-once",
            lat.len(),
            q(0.5),
            q(0.99),
            lat[lat.len() - 1]
        );
    }
    Ok(())
}

/// Run `reps` interleaved pairs (engine, bare loop) and print every run and the medians.
pub(crate) fn bench_kafka(
    brokers: &str,
    records: u64,
    keys: u64,
    partitions: i32,
    interval: &str,
    parallelism: u32,
    reps: u32,
) -> Result<()> {
    if keys == 0 || records == 0 || partitions <= 0 || reps == 0 || parallelism == 0 {
        bail!("--records, --keys, --partitions, --parallelism and --reps must be above 0");
    }
    let interval_ms = crate::args::parse_interval(interval)?.context("--checkpoint-interval must not be off")?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let s = Setup { brokers, input: format!("bench-kafka-in-{stamp}"), records, keys, partitions, interval_ms, stamp };
    fill_input(&s)?;
    let label =
        format!("records={records} keys={keys} partitions={partitions} interval={interval} parallelism={parallelism}");
    crate::bench::interleaved_pairs(reps, "records", &label, |rep| engine(&s, rep, parallelism), |rep| bare(&s, rep))
}
