//! [`KafkaSource`]: the records of Kafka topics, with their offsets in cutline's checkpoints.
//!
//! Partitions are assigned to subtasks by a fixed rule ([`owner_of`]), never by a consumer group, so
//! every subtask knows its partitions without talking to anyone and a restore resumes each partition
//! exactly at the offset the checkpoint holds. Reads are `read_committed` by default, so a job reading
//! the output of an exactly-once job sees only committed transactions. Offsets are committed back to a
//! consumer group only when one is configured, for monitoring, after a checkpoint completes; they are
//! never read back.
//!
//! Every start position is resolved to concrete offsets at the first open, so the first checkpoint
//! already names them (a restore after "latest" does not skip what arrived meanwhile). Partitions that
//! appear while the job runs are found every `discovery_interval_ms` and read from their beginning
//! (everything in them is new to the job). In bounded mode each partition is read up to its end offset
//! at the first open, and the source finishes when every partition reached it.

use super::assignment::{owner_of, split_of, unread_partitions};
use super::client::{cached_high_watermark, client_config, partitions_of, with_retry, METADATA_TIMEOUT_MS};
use super::DEFAULT_UNAVAILABLE_WAIT_MS;
use crate::connectors::source::{Source, SourceStatus, SplitId};
use crate::error::{ConnectorError, ConnectorResult};
use cutline_core::CheckpointId;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default of [`KafkaSourceConfig::discovery_interval_ms`].
pub const DEFAULT_DISCOVERY_INTERVAL_MS: u64 = 10_000;

/// Where a source starts reading partitions at a fresh start (a restore always resumes at the
/// checkpoint's offsets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartPosition {
    /// The first offset each partition still holds.
    Earliest,
    /// The end of each partition at the first open: only records produced after the job started.
    Latest,
    /// These offsets (topic, partition, offset); partitions not named start at the earliest.
    Offsets(Vec<(String, i32, i64)>),
    /// The first record with a timestamp at or after this one (milliseconds since the Unix epoch);
    /// partitions with no such record start at their end.
    Timestamp(i64),
}

/// What a [`KafkaSource`] reads and how.
#[derive(Clone, Debug)]
pub struct KafkaSourceConfig {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topics read; they must exist.
    pub topics: Vec<String>,
    /// Where a fresh start begins.
    pub start: StartPosition,
    /// Stop at the end offsets seen at the first open (tests, backfills) instead of reading forever.
    pub bounded: bool,
    /// A consumer group to commit offsets to after each completed checkpoint, for monitoring only;
    /// `None` (the default) commits nothing.
    pub group_id: Option<String>,
    /// How often the source looks for partitions added to its topics; 0 turns it off.
    pub discovery_interval_ms: u64,
    /// How long the source waits for brokers it cannot reach at open before the task fails.
    pub unavailable_wait_ms: u64,
    /// Extra librdkafka consumer properties (e.g. `security.protocol`); `isolation.level` defaults to
    /// `read_committed`. `enable.auto.commit` is always false.
    pub properties: Vec<(String, String)>,
}

impl KafkaSourceConfig {
    /// Read `topics` at `brokers` from the earliest offsets, forever, `read_committed`.
    pub fn new(brokers: &str, topics: &[&str]) -> KafkaSourceConfig {
        KafkaSourceConfig {
            brokers: brokers.to_owned(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            start: StartPosition::Earliest,
            bounded: false,
            group_id: None,
            discovery_interval_ms: DEFAULT_DISCOVERY_INTERVAL_MS,
            unavailable_wait_ms: DEFAULT_UNAVAILABLE_WAIT_MS,
            properties: Vec::new(),
        }
    }
    /// The same, stopping at the end offsets seen at the first open.
    pub fn bounded(mut self) -> KafkaSourceConfig {
        self.bounded = true;
        self
    }
}

/// One record read from Kafka.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaRecord {
    /// Its topic.
    pub topic: Arc<str>,
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its timestamp (milliseconds since the Unix epoch), if it has one.
    pub timestamp_ms: Option<i64>,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value (`None` for a tombstone).
    pub value: Option<Vec<u8>>,
}

impl KafkaRecord {
    /// Its partition's split ([`split_of`]), for per-split watermarks:
    /// `WatermarkStrategy::bounded_out_of_orderness(..).per_split(KafkaRecord::split)`.
    pub fn split(&self) -> SplitId {
        split_of(&self.topic, self.partition)
    }
}

/// The position of one partition: the offset of the next record to read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionOffset {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset to read.
    pub next: i64,
    /// Where a bounded source stops reading this partition (`None`: unbounded).
    pub end: Option<i64>,
}

/// A [`KafkaSource`]'s offsets as stored in a checkpoint: every partition the subtask reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaOffsets {
    /// The subtask's partitions, sorted by topic and partition.
    pub partitions: Vec<PartitionOffset>,
}

#[derive(Clone, Debug)]
struct Part {
    topic: Arc<str>,
    partition: i32,
    next: i64,
    end: Option<i64>,
}

/// Records of Kafka topics with offsets in checkpoints; see the module docs.
pub struct KafkaSource {
    config: KafkaSourceConfig,
    consumer: Option<BaseConsumer>,
    subtask: u32,
    parallelism: u32,
    /// The partitions read, sorted by topic and partition (a few per subtask: found by a scan,
    /// which costs less per record than a map keyed by owned names).
    parts: Vec<Part>,
    /// The splits of the partitions still read ([`Source::splits`]).
    splits: Vec<SplitId>,
    last_discovery: Instant,
    finished: bool,
}

impl KafkaSource {
    /// A source reading as `config` says; nothing is contacted before `open`.
    pub fn new(config: KafkaSourceConfig) -> KafkaSource {
        KafkaSource {
            config,
            consumer: None,
            subtask: 0,
            parallelism: 1,
            parts: Vec::new(),
            splits: Vec::new(),
            last_discovery: Instant::now(),
            finished: false,
        }
    }

    fn find(&self, topic: &str, partition: i32) -> Option<usize> {
        self.parts.iter().position(|p| p.partition == partition && &*p.topic == topic)
    }

    fn consumer(&self) -> &BaseConsumer {
        self.consumer.as_ref().expect("opened")
    }

    fn wait_ms(&self) -> u64 {
        self.config.unavailable_wait_ms
    }

    /// The offsets where this subtask's partitions `ps` of `topic` start at a fresh start.
    fn start_offsets(&self, topic: &str, ps: &[i32], fresh: bool) -> ConnectorResult<Vec<(i32, i64)>> {
        let c = self.consumer();
        let timeout = Duration::from_millis(METADATA_TIMEOUT_MS);
        let watermarks = |p: i32| {
            with_retry(&format!("reading the offsets of {topic}/{p}"), self.wait_ms(), || {
                c.fetch_watermarks(topic, p, timeout)
            })
        };
        let mut out = Vec::with_capacity(ps.len());
        let ends = || self.fetched_ends(topic, ps);
        match (&self.config.start, fresh) {
            // Partitions found later are new to the job: read them whole.
            (_, false) | (StartPosition::Earliest, true) => {
                for &p in ps {
                    out.push((p, watermarks(p)?.0));
                }
            }
            (StartPosition::Latest, true) => out = ends()?,
            (StartPosition::Offsets(given), true) => {
                for &p in ps {
                    let low = watermarks(p)?.0;
                    let high = ends()?.into_iter().find(|e| e.0 == p).map_or(low, |e| e.1);
                    let at = given.iter().find(|(t, gp, _)| t == topic && *gp == p).map(|g| g.2);
                    match at {
                        Some(o) if o < low || o > high => {
                            return Err(ConnectorError::permanent(format!(
                                "Kafka source: start offset {o} of {topic}/{p} is outside what the partition holds ({low}..{high})"
                            )))
                        }
                        Some(o) => out.push((p, o)),
                        None => out.push((p, low)),
                    }
                }
            }
            (StartPosition::Timestamp(ts), true) => {
                let mut tpl = TopicPartitionList::new();
                for &p in ps {
                    tpl.add_partition_offset(topic, p, Offset::Offset(*ts)).map_err(|e| e.to_string())?;
                }
                let found = with_retry(&format!("looking up offsets of {topic} by timestamp"), self.wait_ms(), || {
                    c.offsets_for_times(tpl.clone(), timeout)
                })?;
                for &p in ps {
                    let o = match found.find_partition(topic, p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => o,
                        // No record that late: start at the end.
                        _ => ends()?.into_iter().find(|e| e.0 == p).map_or(0, |e| e.1),
                    };
                    out.push((p, o));
                }
            }
        }
        Ok(out)
    }

    /// The end offsets (high watermarks) of partitions `ps` of `topic`, as the brokers report them
    /// in fetch responses: a throwaway consumer fetches a little of each partition. (The offset
    /// lookup API would be one request, but some Kafka-protocol brokers answer it with the start of
    /// the last batch plus one; Tansu 0.6.0 does, and every consumer relies on fetch responses.)
    fn fetched_ends(&self, topic: &str, ps: &[i32]) -> ConnectorResult<Vec<(i32, i64)>> {
        let mut props = self.config.properties.clone();
        props.retain(|(k, _)| {
            !matches!(k.as_str(), "fetch.max.bytes" | "max.partition.fetch.bytes" | "message.max.bytes")
        });
        let probe: BaseConsumer = client_config(
            "Kafka source",
            &self.config.brokers,
            &[("isolation.level", "read_committed"), ("group.id", "cutline-source")],
            &[
                ("enable.auto.commit", "false"),
                ("enable.partition.eof", "true"),
                ("max.partition.fetch.bytes", "1"),
                ("fetch.max.bytes", "1000000"),
                ("message.max.bytes", "1000000"),
            ],
            &props,
        )?
        .create()
        .map_err(|e| ConnectorError::permanent(format!("Kafka source: bad configuration: {e}")))?;
        let mut tpl = TopicPartitionList::new();
        for &p in ps {
            tpl.add_partition_offset(topic, p, Offset::Beginning).map_err(|e| e.to_string())?;
        }
        probe.assign(&tpl).map_err(|e| ConnectorError::transient(format!("Kafka source: assign: {e}")))?;
        let deadline = Instant::now() + Duration::from_millis(self.wait_ms());
        let mut ends: Vec<(i32, i64)> = Vec::with_capacity(ps.len());
        loop {
            ends.clear();
            for &p in ps {
                if let Some(high) = cached_high_watermark(&probe, topic, p) {
                    ends.push((p, high));
                }
            }
            if ends.len() == ps.len() {
                return Ok(ends);
            }
            if Instant::now() >= deadline {
                return Err(ConnectorError::transient(format!(
                    "Kafka source: no fetch response for {topic} within {} ms (unavailable_wait_ms)",
                    self.wait_ms()
                )));
            }
            match probe.poll(Duration::from_millis(50)) {
                Some(Err(e)) if !matches!(e, KafkaError::PartitionEOF(_)) && !super::client::retriable(&e) => {
                    return Err(ConnectorError::transient(format!("Kafka source: reading the end of {topic}: {e}")))
                }
                _ => {}
            }
        }
    }

    /// Add this subtask's partitions of the topics that it does not read yet; true if any.
    fn discover(&mut self, fresh: bool) -> ConnectorResult<bool> {
        let mut added = false;
        for topic in self.config.topics.clone() {
            let all = partitions_of(self.consumer(), &topic, self.wait_ms())?;
            let mine =
                unread_partitions(&topic, &all, self.subtask, self.parallelism, |p| self.find(&topic, p).is_some());
            if mine.is_empty() {
                continue;
            }
            let name: Arc<str> = Arc::from(topic.as_str());
            let ends = if self.config.bounded { Some(self.fetched_ends(&topic, &mine)?) } else { None };
            for (p, next) in self.start_offsets(&topic, &mine, fresh)? {
                let end = ends.as_ref().map(|ends| ends.iter().find(|e| e.0 == p).map_or(next, |e| e.1).max(next));
                if !fresh {
                    tracing::info!(topic = %topic, partition = p, "Kafka source: reading a new partition");
                }
                self.parts.push(Part { topic: name.clone(), partition: p, next, end });
                added = true;
            }
        }
        self.parts.sort_by(|a, b| (&*a.topic, a.partition).cmp(&(&*b.topic, b.partition)));
        Ok(added)
    }

    fn assign(&mut self) -> ConnectorResult<()> {
        let mut tpl = TopicPartitionList::new();
        for part in &self.parts {
            if part.end.is_some_and(|e| part.next >= e) {
                continue;
            }
            tpl.add_partition_offset(&part.topic, part.partition, Offset::Offset(part.next))
                .map_err(|e| e.to_string())?;
        }
        self.consumer().assign(&tpl).map_err(|e| ConnectorError::transient(format!("Kafka source: assign: {e}")))?;
        Ok(())
    }

    /// The partitions read changed (added, or at their end in bounded mode).
    fn refresh_splits(&mut self) {
        self.splits.clear();
        let reading = self.parts.iter().filter(|p| p.end.is_none_or(|e| p.next < e));
        self.splits.extend(reading.map(|p| split_of(&p.topic, p.partition)));
    }

    fn all_done(&self) -> bool {
        self.config.bounded && self.parts.iter().all(|p| p.end.is_some_and(|e| p.next >= e))
    }

    /// A partition reached its end (librdkafka's partition EOF): take its position, which counts
    /// the control records of transactions that follow the last record.
    fn at_eof(&mut self, partition: i32) {
        let Ok(positions) = self.consumer().position() else { return };
        for e in positions.elements() {
            if e.partition() != partition {
                continue;
            }
            if let (Offset::Offset(o), Some(i)) = (e.offset(), self.find(e.topic(), partition)) {
                let part = &mut self.parts[i];
                if o > part.next {
                    part.next = o;
                }
            }
        }
    }
}

impl Source for KafkaSource {
    type Item = KafkaRecord;
    type Offset = KafkaOffsets;

    fn open(&mut self, subtask: u32, parallelism: u32, restored: Option<KafkaOffsets>) -> ConnectorResult<()> {
        if self.config.topics.is_empty() {
            return Err(ConnectorError::permanent("Kafka source: no topics given"));
        }
        self.subtask = subtask;
        self.parallelism = parallelism;
        let mut defaults = vec![("isolation.level", "read_committed"), ("enable.partition.eof", "true")];
        // librdkafka wants a group id even for assigned partitions; without a configured one the
        // source names one and commits nothing to it.
        let group = self.config.group_id.clone().unwrap_or_else(|| "cutline-source".to_owned());
        defaults.push(("group.id", group.as_str()));
        let config = client_config(
            "Kafka source",
            &self.config.brokers,
            &defaults,
            &[("enable.auto.commit", "false"), ("enable.auto.offset.store", "false")],
            &self.config.properties,
        )?;
        let consumer: BaseConsumer =
            config.create().map_err(|e| ConnectorError::permanent(format!("Kafka source: bad configuration: {e}")))?;
        self.consumer = Some(consumer);
        self.parts.clear();
        let fresh = match restored {
            Some(offsets) => {
                for o in offsets.partitions {
                    if owner_of(&o.topic, o.partition, parallelism) != subtask {
                        return Err(ConnectorError::permanent(format!(
                            "Kafka source: the checkpoint gives {}/{} to subtask {subtask} of {parallelism}, which does not read it: the offsets are another subtask's",
                            o.topic, o.partition
                        )));
                    }
                    let topic: Arc<str> = Arc::from(o.topic.as_str());
                    self.parts.push(Part { topic, partition: o.partition, next: o.next, end: o.end });
                }
                false
            }
            None => true,
        };
        // A restore adds the partitions created since the checkpoint, read from their beginning.
        self.discover(fresh)?;
        self.assign()?;
        self.refresh_splits();
        self.last_discovery = Instant::now();
        self.finished = false;
        Ok(())
    }

    /// Every partition the old subtasks read goes to its owner at the new parallelism, at its
    /// position; partitions none of them read are discovered at open and read from their beginning.
    /// A partition that two old subtasks claim is a damaged checkpoint (which position is right?):
    /// refused.
    fn rescale(old: Vec<KafkaOffsets>, subtask: u32, parallelism: u32) -> ConnectorResult<Option<KafkaOffsets>> {
        let mut partitions: Vec<PartitionOffset> = old
            .into_iter()
            .flat_map(|o| o.partitions)
            .filter(|p| owner_of(&p.topic, p.partition, parallelism) == subtask)
            .collect();
        partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        if let Some(w) = partitions.windows(2).find(|w| w[0].topic == w[1].topic && w[0].partition == w[1].partition) {
            return Err(ConnectorError::permanent(format!(
                "Kafka source: the checkpoint gives {}/{} to two subtasks (at offsets {} and {}): it is damaged; restore an older checkpoint or start afresh",
                w[0].topic, w[0].partition, w[0].next, w[1].next
            )));
        }
        Ok(Some(KafkaOffsets { partitions }))
    }

    fn poll(&mut self, out: &mut Vec<KafkaRecord>, max: usize) -> ConnectorResult<SourceStatus> {
        if self.finished || self.all_done() {
            self.finished = true;
            return Ok(SourceStatus::Finished);
        }
        if self.config.discovery_interval_ms > 0
            && self.last_discovery.elapsed() >= Duration::from_millis(self.config.discovery_interval_ms)
        {
            self.last_discovery = Instant::now();
            match self.discover(false) {
                Ok(true) => {
                    self.assign()?;
                    self.refresh_splits();
                }
                Ok(false) => {}
                // A broker away now is no reason to fail: reading goes on, discovery retries later.
                Err(e) if !e.is_permanent() => tracing::warn!(error = %e, "Kafka source: partition discovery failed"),
                Err(e) => return Err(e),
            }
        }
        let mut n = 0;
        let mut reassign = false;
        while n < max {
            let Some(res) = self.consumer.as_ref().expect("opened").poll(Duration::ZERO) else { break };
            match res {
                Ok(m) => {
                    let Some(i) = self.find(m.topic(), m.partition()) else { continue };
                    let part = &mut self.parts[i];
                    let offset = m.offset();
                    if offset < part.next {
                        continue;
                    }
                    if part.end.is_some_and(|e| offset >= e) {
                        part.next = part.end.unwrap();
                        reassign = true;
                        continue;
                    }
                    part.next = offset + 1;
                    out.push(KafkaRecord {
                        topic: part.topic.clone(),
                        partition: m.partition(),
                        offset,
                        timestamp_ms: m.timestamp().to_millis(),
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                    });
                    n += 1;
                    if part.end.is_some_and(|e| part.next >= e) {
                        reassign = true;
                    }
                }
                Err(KafkaError::PartitionEOF(p)) => {
                    self.at_eof(p);
                    reassign |= self.config.bounded;
                }
                Err(e) if super::client::retriable(&e) => {
                    tracing::warn!(error = %e, "Kafka source: brokers unavailable, retrying");
                    break;
                }
                Err(KafkaError::MessageConsumption(rdkafka::error::RDKafkaErrorCode::OffsetOutOfRange)) => {
                    return Err(ConnectorError::transient(
                        "Kafka source: an offset the job needs is no longer in the topic (retention deleted it): records were lost before the job read them",
                    ));
                }
                Err(e) => return Err(ConnectorError::transient(format!("Kafka source: {e}"))),
            }
        }
        if reassign && self.config.bounded {
            // Stop fetching partitions that reached their end.
            self.assign()?;
            self.refresh_splits();
        }
        if self.all_done() {
            self.finished = true;
            return Ok(if n == 0 { SourceStatus::Finished } else { SourceStatus::More });
        }
        Ok(if n == 0 { SourceStatus::Idle } else { SourceStatus::More })
    }

    fn offset(&self) -> KafkaOffsets {
        KafkaOffsets {
            partitions: self
                .parts
                .iter()
                .map(|p| PartitionOffset {
                    topic: p.topic.to_string(),
                    partition: p.partition,
                    next: p.next,
                    end: p.end,
                })
                .collect(),
        }
    }

    fn checkpoint_complete(&mut self, _checkpoint: CheckpointId, offset: &KafkaOffsets) -> ConnectorResult<()> {
        if self.config.group_id.is_none() || offset.partitions.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for p in &offset.partitions {
            tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(p.next)).map_err(|e| e.to_string())?;
        }
        // For monitoring only (best effort): the checkpoint holds the truth.
        if let Err(e) = self.consumer().commit(&tpl, CommitMode::Async) {
            tracing::warn!(error = %e, "Kafka source: committing offsets to the consumer group failed");
        }
        Ok(())
    }

    fn splits(&self) -> &[SplitId] {
        &self.splits
    }

    fn close(&mut self) -> ConnectorResult<()> {
        self.consumer = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescaled_offsets_go_to_the_new_owners_and_a_partition_claimed_twice_is_refused() {
        let at = |partition: i32, next: i64| PartitionOffset { topic: "t".into(), partition, next, end: None };
        let old =
            vec![KafkaOffsets { partitions: vec![at(0, 5), at(2, 7)] }, KafkaOffsets { partitions: vec![at(1, 9)] }];
        let mut got = Vec::new();
        for subtask in 0..3 {
            let o = KafkaSource::rescale(old.clone(), subtask, 3).unwrap().unwrap();
            assert!(o.partitions.iter().all(|p| owner_of("t", p.partition, 3) == subtask));
            got.extend(o.partitions.into_iter().map(|p| (p.partition, p.next)));
        }
        got.sort();
        assert_eq!(got, vec![(0, 5), (1, 9), (2, 7)], "every partition once, at its position");
        let twice = vec![KafkaOffsets { partitions: vec![at(1, 3)] }, KafkaOffsets { partitions: vec![at(1, 9)] }];
        let owner = owner_of("t", 1, 2);
        let e = KafkaSource::rescale(twice, owner, 2).unwrap_err();
        assert!(e.is_permanent() && e.message().contains("to two subtasks"), "{e}");
    }
}
