//! The Kafka source step by step against the broker: partitions split among subtasks, resumed at
//! their offsets, start positions, refusals, restores at another parallelism, and watermarks per
//! partition.

use super::*;
use cutline::connectors::kafka::split_of;
use cutline::{Either, EventTime, MemoryTxnSink, MemoryTxnStore, WatermarkStrategy, Windows};
use std::sync::Mutex;

#[test]
fn subtasks_read_disjoint_partitions_that_together_are_the_whole_topic_and_resume_at_their_offsets() {
    let t = topic("src-split", 5);
    produce(&t, (0..500i32).map(|i| (i % 5, format!("k{i}"), format!("{i:04}"))));
    let mut all = Vec::new();
    for subtask in 0..2 {
        let mut s = KafkaSource::new(KafkaSourceConfig::new(&brokers(), &[&t]).bounded());
        s.open(subtask, 2, None).unwrap();
        // Read part, take the offset, and resume a new instance from it: nothing lost or read twice.
        let mut first = Vec::new();
        while first.len() < 30 {
            s.poll(&mut first, 7).unwrap();
        }
        let at: KafkaOffsets = s.offset();
        for p in &at.partitions {
            assert_eq!(owner_of(&p.topic, p.partition, 2), subtask, "subtask {subtask} holds {}", p.partition);
        }
        let mut resumed = KafkaSource::new(KafkaSourceConfig::new(&brokers(), &[&t]).bounded());
        resumed.open(subtask, 2, Some(at)).unwrap();
        let (rest, st) = drain(&mut resumed, Duration::from_secs(20));
        assert_eq!(st, SourceStatus::Finished, "a bounded source finishes at the end offsets of its start");
        for r in first.iter().chain(&rest) {
            assert_eq!(owner_of(&r.topic, r.partition, 2), subtask);
        }
        all.extend(first);
        all.extend(rest);
    }
    assert_eq!(values(&all), (0..500).map(|i| format!("{i:04}")).collect::<Vec<_>>());
}

#[test]
fn start_positions_latest_given_offsets_and_timestamp_are_resolved_at_the_first_open() {
    let t = topic("src-start", 1);
    produce(&t, (0..10).map(|i| (0, "k".into(), format!("old{i}"))));
    std::thread::sleep(Duration::from_millis(50));
    let cut = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    std::thread::sleep(Duration::from_millis(50));

    let mut latest = KafkaSourceConfig::new(&brokers(), &[&t]);
    latest.start = StartPosition::Latest;
    let mut l = KafkaSource::new(latest.clone());
    l.open(0, 1, None).unwrap();
    assert_eq!(l.offset().partitions[0].next, 10, "latest is resolved to the end offset at open");
    produce(&t, (0..3).map(|i| (0, "k".into(), format!("new{i}"))));
    let (got, _) = drain(&mut l, Duration::from_secs(3));
    assert_eq!(values(&got), vec!["new0", "new1", "new2"]);

    let mut given = KafkaSourceConfig::new(&brokers(), &[&t]).bounded();
    given.start = StartPosition::Offsets(vec![(t.clone(), 0, 8)]);
    let mut g = KafkaSource::new(given);
    g.open(0, 1, None).unwrap();
    assert_eq!(values(&drain(&mut g, Duration::from_secs(10)).0), vec!["new0", "new1", "new2", "old8", "old9"]);

    let mut by_time = KafkaSourceConfig::new(&brokers(), &[&t]).bounded();
    by_time.start = StartPosition::Timestamp(cut);
    let mut ts = KafkaSource::new(by_time);
    ts.open(0, 1, None).unwrap();
    assert_eq!(values(&drain(&mut ts, Duration::from_secs(10)).0), vec!["new0", "new1", "new2"]);

    let mut outside = KafkaSourceConfig::new(&brokers(), &[&t]);
    outside.start = StartPosition::Offsets(vec![(t.clone(), 0, 99)]);
    let e = KafkaSource::new(outside).open(0, 1, None).unwrap_err();
    assert!(e.is_permanent() && e.message().contains("outside"), "{e}");
}

#[test]
fn a_missing_topic_and_a_checkpoint_of_another_subtask_are_refused_with_what_to_do() {
    let missing = format!("no-such-topic-{}", run_id());
    let e = KafkaSource::new(KafkaSourceConfig::new(&brokers(), &[&missing])).open(0, 1, None).unwrap_err();
    assert!(e.is_permanent() && e.message().contains("does not exist") && e.message().contains("create it"), "{e}");
    let e =
        string_sink(KafkaSinkConfig::exactly_once(&brokers(), &missing)).open(&sink_ctx("missing", 0, 1)).unwrap_err();
    assert!(e.is_permanent() && e.message().contains("does not exist"), "{e}");

    let t = topic("src-other", 2);
    let mut s = KafkaSource::new(KafkaSourceConfig::new(&brokers(), &[&t]));
    s.open(0, 2, None).unwrap();
    let theirs = s.offset();
    let mut other = KafkaSource::new(KafkaSourceConfig::new(&brokers(), &[&t]));
    let e = other.open(1, 2, Some(theirs)).unwrap_err();
    assert!(e.is_permanent() && e.message().contains("the offsets are another subtask's"), "{e}");

    let mut fixed = KafkaSourceConfig::new(&brokers(), &[&t]);
    fixed.properties.push(("enable.auto.commit".into(), "true".into()));
    let e = KafkaSource::new(fixed).open(0, 1, None).unwrap_err();
    assert!(e.is_permanent() && e.message().contains("enable.auto.commit"), "{e}");
}

/// Offsets taken by 2 subtasks resume at 3: each partition goes to its new owner at its position,
/// so the 3 read exactly the records the 2 had not read, each once.
#[test]
fn offsets_of_two_subtasks_resume_at_three_each_partition_once_at_its_position() {
    let t = topic("src-rescale", 5);
    produce(&t, (0..500i32).map(|i| (i % 5, format!("k{i}"), format!("{i:04}"))));
    let mut old = Vec::new();
    let mut read_before = Vec::new();
    for subtask in 0..2 {
        let mut s = KafkaSource::new(KafkaSourceConfig::new(&brokers(), &[&t]));
        s.open(subtask, 2, None).unwrap();
        let (rs, _) = drain(&mut s, Duration::from_millis(700));
        read_before.extend(values(&rs));
        old.push(s.offset());
    }
    assert_eq!(read_before.len(), 500);
    produce(&t, (500..800i32).map(|i| (i % 5, format!("k{i}"), format!("{i:04}"))));
    let mut read_after = Vec::new();
    for subtask in 0..3 {
        let restored = KafkaSource::rescale(old.clone(), subtask, 3).unwrap().expect("the Kafka source rescales");
        assert!(restored.partitions.iter().all(|p| owner_of(&t, p.partition, 3) == subtask), "{restored:?}");
        let mut s = KafkaSource::new(KafkaSourceConfig::new(&brokers(), &[&t]));
        s.open(subtask, 3, Some(restored)).unwrap();
        let (rs, _) = drain(&mut s, Duration::from_millis(700));
        assert!(rs.iter().all(|r| owner_of(&t, r.partition, 3) == subtask), "subtask {subtask} read another's");
        read_after.extend(values(&rs));
    }
    read_after.sort();
    let want: Vec<String> = (500..800).map(|i| format!("{i:04}")).collect();
    assert_eq!(read_after, want, "after the rescale: each new record once, no old one again");
}

/// A whole job restored with its Kafka source at another parallelism (2 -> 3; the keyed count and
/// the sink stay at 2): it stops for good mid-way (a failure and no restarts), runs again on the
/// same state directory with 3 source subtasks, and a `read_committed` reader sees every update
/// exactly once.
#[test]
fn a_job_restored_with_its_kafka_source_at_another_parallelism_writes_exactly_the_failure_free_result() {
    let (i, o) = (input("job-rescale-in"), topic("job-rescale-out", 3));
    let dir = tempfile::tempdir().unwrap();
    let name = format!("kafka-rescale-{}", run_id());
    // The input is held back (1 ms a record) until a sink subtask began its second commit, so its
    // first is done, then the next batch fails: the run stops mid-way with something committed,
    // however long the broker's commits take (a fixed batch count failed before any commit once).
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (h2, commits) = (hold.clone(), Arc::new(AtomicU64::new(0)));
    let faults = Faults::new(move |p| {
        if p == FaultPoint::SinkCommit && commits.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
            h2.store(false, Ordering::SeqCst);
        }
        p == FaultPoint::ProcessBatch && !h2.load(Ordering::SeqCst)
    });
    let mut first = config(dir.path(), &name, faults);
    first.restart = RestartStrategy::None;
    let job = count_job_held(&brokers(), "kafka-rescale", &i, &o, (true, 2, 2), Some(hold));
    let err = cutline::run(&job, first).unwrap_err();
    assert!(err.to_string().contains("injected failure"), "the first run should fail at the injected fault: {err}");
    let partial = seen_counts(&o).len();
    assert!(partial > 0 && partial < failure_free().len(), "the first run committed {partial} updates");
    let report = cutline::run(
        &count_job(&brokers(), "kafka-rescale", &i, &o, true, 3),
        config(dir.path(), &name, Faults::none()),
    )
    .unwrap();
    assert!(report.restored_from.is_some(), "the second run did not restore a checkpoint");
    assert_exactly_once(&o);
}

/// Watermarks per partition against the broker: partition 0 holds records 1,000 s of event time
/// ahead of partition 1's (a backlog of a fast producer). The source names both partitions as its
/// splits, so neither can be overtaken before it delivered, and no record is late whichever the
/// broker serves first; the windows equal a direct count. (With one watermark for the subtask,
/// records of partition 1 go late when the broker serves partition 0 first, as it does here; the
/// deterministic test of that is in `tests/event_time.rs`.)
#[test]
fn per_partition_watermarks_make_no_record_of_a_lagging_partition_late() {
    let t = topic("src-splits", 2);
    let time = |p: i32, i: i64| if p == 0 { 1_000_000 + i * 10 } else { i * 10 };
    for p in [0, 1] {
        produce(&t, (0..2000i64).map(|i| (p, format!("k{}", i % 3), time(p, i).to_string())));
    }
    let mut s = KafkaSource::new(KafkaSourceConfig::new(&brokers(), &[&t]).bounded());
    s.open(0, 1, None).unwrap();
    assert_eq!(s.splits(), &[split_of(&t, 0), split_of(&t, 1)]);
    let (records, st) = drain(&mut s, Duration::from_secs(20));
    assert_eq!((records.len(), st), (4000, SourceStatus::Finished));
    assert!(records.iter().all(|r| r.split() == split_of(&t, r.partition)));
    assert!(s.splits().is_empty(), "a bounded source at its end still names splits: {:?}", s.splits());

    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new("kafka-splits");
    let parse = |r: &KafkaRecord| -> (String, i64) {
        let text = |b: &Option<Vec<u8>>| String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into_owned();
        (text(&r.key), text(&r.value).parse().expect("a time"))
    };
    let strategy = WatermarkStrategy::bounded_out_of_orderness(0, move |r: &KafkaRecord| EventTime(parse(r).1))
        .per_split(KafkaRecord::split);
    let cfg = KafkaSourceConfig::new(&brokers(), &[&t]).bounded();
    job.source_from("kafka", move |_| KafkaSource::new(cfg.clone()))
        .with_watermarks("kafka-wm", strategy)
        .map(move |r: KafkaRecord| parse(&r))
        .key_by(|r: &(String, i64)| r.0.clone())
        .window(Windows::tumbling_ms(1000), |r: &(String, i64)| EventTime(r.1))
        .aggregate_with_late(
            "counts",
            || 0u64,
            |n, _r| *n += 1,
            |n, m| *n += m,
            |k, w, n| format!("{k}@{}:{n}", w.start.0),
        )
        .map(|r| match r {
            Either::Left(result) => result,
            Either::Right((k, t)) => format!("late:{k}@{t}"),
        })
        .sink("out", MemoryTxnSink::new(out.clone()));
    let dir = tempfile::tempdir().unwrap();
    cutline::run(&job.build().unwrap(), config(dir.path(), &format!("kafka-splits-{}", run_id()), Faults::none()))
        .unwrap();
    let mut got = out.lock().unwrap().committed_records();
    got.sort();
    let mut want: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for p in [0, 1] {
        for i in 0..2000i64 {
            let t = time(p, i);
            *want.entry((format!("k{}", i % 3), t - t % 1000)).or_default() += 1;
        }
    }
    let mut want: Vec<String> = want.iter().map(|((k, s), n)| format!("{k}@{s}:{n}")).collect();
    want.sort();
    assert_eq!(got, want, "windows of both partitions, none late");
}
