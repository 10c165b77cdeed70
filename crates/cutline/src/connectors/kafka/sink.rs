//! [`KafkaSink`]: records into a Kafka topic, exactly once through transactions, or at least once
//! through the idempotent producer.
//!
//! **The commit window.** A Kafka transaction cannot outlive its producer: when a process dies with a
//! transaction prepared (flushed, not committed), the next producer with the same `transactional.id`
//! aborts it when it starts (`init_transactions`), and librdkafka has no way to resume it. So the
//! exactly-once sink keeps the records of an epoch *in the checkpoint* instead of in an open
//! transaction: between two barriers it encodes records into a buffer; at the barrier the buffer
//! becomes the committable ([`KafkaTxn`]), stored with the checkpoint; when the checkpoint completes,
//! one transaction produces the epoch's records and, in the same transaction, commits the checkpoint's
//! id as the offset of a consumer group of the sink's own (`cutline-sink.<job>.<sink>.<subtask>`, on
//! partition 0 of the output topic): the *marker*. After a crash, recovery first fences every older
//! producer of the subtask (`init_transactions`, which aborts a transaction a dead process left open),
//! then reads the marker: a checkpoint at or below it was committed, one above it is produced again
//! from the checkpoint. Nothing in the window is lost, and nothing is committed twice.
//!
//! The price: an epoch's records are written to checkpoint storage, and become visible one commit
//! after the checkpoint completes (latency: the checkpoint interval plus the commit), and the
//! subtask's memory holds up to [`KafkaSinkConfig::max_epoch_bytes`] of them. The transaction is open
//! only while a commit runs, so the transaction timeout bounds one commit, not the checkpoint interval.
//!
//! **Fencing.** Each subtask's `transactional.id` is `cutline.<job>.<sink>.<subtask>`: a newer
//! incarnation's `init_transactions` fences every older one, whose next commit then fails.

use super::client::{client_config, with_retry, METADATA_TIMEOUT_MS};
use super::DEFAULT_UNAVAILABLE_WAIT_MS;
use crate::connectors::sink::{Sink, SinkContext};
use crate::error::{ConnectorError, ConnectorResult};
use cutline_core::CheckpointId;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest pause between two reads of the marker while waiting for a commit to show.
const MAX_MARKER_POLL_MS: u64 = 50;

/// Default of [`KafkaSinkConfig::max_epoch_bytes`]: 256 MiB.
pub const DEFAULT_MAX_EPOCH_BYTES: usize = 256 << 20;
/// Default of [`KafkaSinkConfig::transaction_timeout_ms`].
pub const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;
/// The shortest transaction timeout accepted.
pub const MIN_TRANSACTION_TIMEOUT_MS: u64 = 1_000;

/// How a [`KafkaSink`] delivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KafkaSinkMode {
    /// Transactions committed after checkpoints complete: `read_committed` consumers see every record
    /// once, one commit after its checkpoint.
    ExactlyOnce,
    /// The idempotent producer, flushed at every barrier: every record at least once (a restore
    /// writes again what followed the restored checkpoint), visible at once.
    AtLeastOnce,
}

/// Which partition a [`KafkaSink`] subtask writes a record to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KafkaPartitioning {
    /// librdkafka's partitioner: by a hash of the key (records without a key are spread).
    #[default]
    ByKey,
    /// Subtask `i` writes every record to the topic's `i % partitions`-th partition (Flink's
    /// `FlinkFixedPartitioner`): the subtasks' transactions never share a partition.
    Fixed,
}

/// Where and how a [`KafkaSink`] writes.
#[derive(Clone, Debug)]
pub struct KafkaSinkConfig {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topic written; it must exist.
    pub topic: String,
    /// Exactly-once or at-least-once.
    pub mode: KafkaSinkMode,
    /// Which partition a record goes to.
    pub partitioning: KafkaPartitioning,
    /// The producer's `transaction.timeout.ms` (exactly-once): how long one commit may take before
    /// the broker aborts it; at least [`MIN_TRANSACTION_TIMEOUT_MS`] and at most the broker's
    /// `transaction.max.timeout.ms`.
    pub transaction_timeout_ms: u64,
    /// Encoded bytes of records one subtask buffers between two barriers (exactly-once) before the
    /// task fails: checkpoint more often, or raise this.
    pub max_epoch_bytes: usize,
    /// How long the sink waits for brokers it cannot reach (fencing at start, a commit, a flush)
    /// before the task fails.
    pub unavailable_wait_ms: u64,
    /// Extra librdkafka producer properties (e.g. `compression.type`, `linger.ms`).
    /// `transactional.id` and `enable.idempotence` are set by cutline.
    pub properties: Vec<(String, String)>,
}

impl KafkaSinkConfig {
    /// Exactly-once into `topic` at `brokers`, with the default limits.
    pub fn exactly_once(brokers: &str, topic: &str) -> KafkaSinkConfig {
        KafkaSinkConfig {
            brokers: brokers.to_owned(),
            topic: topic.to_owned(),
            mode: KafkaSinkMode::ExactlyOnce,
            partitioning: KafkaPartitioning::ByKey,
            transaction_timeout_ms: DEFAULT_TRANSACTION_TIMEOUT_MS,
            max_epoch_bytes: DEFAULT_MAX_EPOCH_BYTES,
            unavailable_wait_ms: DEFAULT_UNAVAILABLE_WAIT_MS,
            properties: Vec::new(),
        }
    }
    /// At-least-once into `topic` at `brokers`.
    pub fn at_least_once(brokers: &str, topic: &str) -> KafkaSinkConfig {
        KafkaSinkConfig { mode: KafkaSinkMode::AtLeastOnce, ..KafkaSinkConfig::exactly_once(brokers, topic) }
    }
}

/// The records of one epoch of a [`KafkaSink`] subtask, as stored in a checkpoint until a
/// transaction commits them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaTxn {
    /// The checkpoint whose barrier ended the epoch.
    pub checkpoint: u64,
    /// Records in `data`.
    pub records: u64,
    /// The records: per record a little-endian u32 key length (`u32::MAX`: no key), the key, a u32
    /// value length and the value.
    #[serde(with = "super::arc_bytes")]
    pub data: Arc<Vec<u8>>,
}

/// Turns a record into its Kafka key and value: append the key to the first buffer (leave it empty
/// for no key) and the value to the second. Both arrive empty.
pub type RecordFn<T> = Arc<dyn Fn(&T, &mut Vec<u8>, &mut Vec<u8>) + Send + Sync>;

/// Collects the first delivery failure of the producer (reported on its poll).
#[derive(Clone, Default)]
struct Deliveries {
    failed: Arc<Mutex<Option<String>>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut f = self.failed.lock().expect("delivery lock");
            if f.is_none() {
                *f = Some(e.to_string());
            }
        }
    }
}

/// Records into a Kafka topic, exactly once or at least once.
///
/// **The commit window.** A Kafka transaction cannot outlive its producer: when a process dies with a
/// transaction prepared (flushed, not committed), the next producer with the same `transactional.id`
/// aborts it when it starts (`init_transactions`), and librdkafka has no way to resume it. So the
/// exactly-once sink keeps the records of an epoch *in the checkpoint* instead of in an open
/// transaction: between two barriers it encodes records into a buffer; at the barrier the buffer
/// becomes the committable ([`KafkaTxn`]), stored with the checkpoint; when the checkpoint completes,
/// one transaction produces the epoch's records and, in the same transaction, commits the checkpoint's
/// id as the offset of a consumer group of the sink's own (`cutline-sink.<job>.<sink>.<subtask>`, on
/// partition 0 of the output topic): the *marker*. After a crash, recovery first fences every older
/// producer of the subtask (`init_transactions`, which aborts a transaction a dead process left open),
/// then reads the marker: a checkpoint at or below it was committed, one above it is produced again
/// from the checkpoint. Nothing in the window is lost, and nothing is committed twice.
///
/// The price: an epoch's records are written to checkpoint storage, and become visible one commit
/// after the checkpoint completes (latency: the checkpoint interval plus the commit), and the
/// subtask's memory holds up to [`KafkaSinkConfig::max_epoch_bytes`] of them. The transaction is open
/// only while a commit runs, so the transaction timeout bounds one commit, not the checkpoint interval.
///
/// **Fencing.** Each subtask's `transactional.id` is `cutline.<job>.<sink>.<subtask>`: a newer
/// incarnation's `init_transactions` fences every older one, whose next commit then fails.
pub struct KafkaSink<T> {
    pub(super) config: KafkaSinkConfig,
    pub(super) encode: RecordFn<T>,
    pub(super) ctx: Option<SinkContext>,
    producer: Option<BaseProducer<Deliveries>>,
    deliveries: Deliveries,
    /// The marker's group (exactly-once): reads the marker, and names it in transactions.
    marker: Option<BaseConsumer>,
    /// The epoch's records (exactly-once).
    data: Vec<u8>,
    records: u64,
    key: Vec<u8>,
    value: Vec<u8>,
    /// The newest checkpoint this subtask's marker says is committed.
    committed: Option<u64>,
    /// The partition every record goes to ([`KafkaPartitioning::Fixed`]), set at open.
    partition: Option<i32>,
    /// After a rescale (exactly-once), a sink opened as each old subtask this instance took over,
    /// other than its own: it fenced that subtask's producers and reads its marker.
    pub(super) taken: Vec<(u32, KafkaSink<T>)>,
}

impl<T> Clone for KafkaSink<T> {
    /// A fresh, unopened sink with the same configuration and encoding.
    fn clone(&self) -> Self {
        KafkaSink::with_encoder(self.config.clone(), self.encode.clone())
    }
}

impl<T> KafkaSink<T> {
    pub(super) fn with_encoder(config: KafkaSinkConfig, encode: RecordFn<T>) -> Self {
        KafkaSink {
            config,
            encode,
            ctx: None,
            producer: None,
            deliveries: Deliveries::default(),
            partition: None,
            marker: None,
            data: Vec::new(),
            records: 0,
            key: Vec::new(),
            value: Vec::new(),
            committed: None,
            taken: Vec::new(),
        }
    }

    /// A sink writing as `config` says, each record turned into key and value by `encode`.
    pub fn new(
        config: KafkaSinkConfig,
        encode: impl Fn(&T, &mut Vec<u8>, &mut Vec<u8>) + Send + Sync + 'static,
    ) -> Self {
        KafkaSink::with_encoder(config, Arc::new(encode))
    }

    /// The consumer group whose offset on partition 0 of the topic is this subtask's marker.
    pub fn marker_group(ctx: &SinkContext) -> String {
        format!("cutline-sink.{}.{}.{}", ctx.job, ctx.uid, ctx.subtask)
    }

    /// This subtask's `transactional.id`.
    pub fn transactional_id(ctx: &SinkContext) -> String {
        format!("cutline.{}.{}.{}", ctx.job, ctx.uid, ctx.subtask)
    }

    fn producer(&self) -> &BaseProducer<Deliveries> {
        self.producer.as_ref().expect("opened")
    }

    fn wait(&self) -> Duration {
        Duration::from_millis(self.config.unavailable_wait_ms)
    }

    fn failed_delivery(&self) -> Option<String> {
        self.deliveries.failed.lock().expect("delivery lock").take()
    }

    /// Send one record, waiting while the producer's queue is full.
    fn send(&self, key: Option<&[u8]>, value: &[u8]) -> ConnectorResult<()> {
        let producer = self.producer();
        let mut record = BaseRecord::to(&self.config.topic).payload(value);
        if let Some(p) = self.partition {
            record = record.partition(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        let mut waited = Duration::ZERO;
        loop {
            match producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) if waited < self.wait() => {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                    waited += Duration::from_millis(10);
                }
                Err((e, _)) => return Err(ConnectorError::transient(format!("Kafka sink: producing: {e}"))),
            }
        }
    }

    /// The newest checkpoint the marker says this subtask committed.
    fn read_marker(&self) -> ConnectorResult<Option<u64>> {
        let consumer = self.marker.as_ref().expect("exactly-once sink opened");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.config.topic, 0);
        let got = with_retry("Kafka sink: reading its commit marker", self.config.unavailable_wait_ms, || {
            consumer.committed_offsets(tpl.clone(), Duration::from_millis(METADATA_TIMEOUT_MS))
        })?;
        Ok(match got.find_partition(&self.config.topic, 0).map(|e| e.offset()) {
            Some(Offset::Offset(o)) if o >= 0 => Some(o as u64),
            _ => None,
        })
    }

    /// Wait until the marker shows `checkpoint`. On Apache Kafka it does once `commit_transaction`
    /// returned; a broker may apply a committed transaction's offsets later (Tansu holds them back
    /// while a transaction of another producer overlaps on a partition). Not starting the next
    /// transaction before that keeps such chains short, and a later recovery reads a final marker.
    fn await_marker(&self, checkpoint: u64) -> ConnectorResult<()> {
        let started = std::time::Instant::now();
        let mut pause_ms = 1;
        loop {
            if self.read_marker()?.is_some_and(|m| m >= checkpoint) {
                return Ok(());
            }
            if started.elapsed() >= self.wait() {
                // Restoring now would read the old marker and commit these records a second time.
                return Err(ConnectorError::permanent(format!(
                    "Kafka sink: the broker committed checkpoint {checkpoint}'s transaction but did not apply its marker (a consumer-group offset committed in the transaction) within {} ms (unavailable_wait_ms), so a restore could write its records twice: the job stops. Check the broker's transaction support (Tansu 0.6.0 loses such offsets when transactions of two producers share a partition: use KafkaPartitioning::Fixed there)",
                    self.config.unavailable_wait_ms
                )));
            }
            std::thread::sleep(Duration::from_millis(pause_ms));
            pause_ms = (pause_ms * 2).min(MAX_MARKER_POLL_MS);
        }
    }

    /// One transaction: the epoch's records and the marker.
    fn commit_one(&mut self, txn: &KafkaTxn) -> ConnectorResult<()> {
        let wait = self.wait();
        let fail = |step: &str, e: KafkaError| {
            ConnectorError::transient(format!(
                "Kafka sink: {step} of checkpoint {}'s transaction failed (the job restores and commits it again): {e}",
                txn.checkpoint
            ))
        };
        self.producer().begin_transaction().map_err(|e| fail("beginning", e))?;
        let mut at = 0usize;
        let d = &txn.data[..];
        let read_u32 = |at: &mut usize| -> ConnectorResult<u32> {
            let b = d
                .get(*at..*at + 4)
                .ok_or_else(|| ConnectorError::permanent("Kafka sink: a checkpoint's records are truncated"))?;
            *at += 4;
            Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
        };
        for _ in 0..txn.records {
            let klen = read_u32(&mut at)?;
            let key = if klen == u32::MAX {
                None
            } else {
                let k = d.get(at..at + klen as usize).ok_or("Kafka sink: a checkpoint's records are truncated")?;
                at += klen as usize;
                Some(k)
            };
            let vlen = read_u32(&mut at)? as usize;
            let value = d.get(at..at + vlen).ok_or("Kafka sink: a checkpoint's records are truncated")?;
            at += vlen;
            self.send(key, value)?;
        }
        if at != d.len() {
            return Err(ConnectorError::permanent("Kafka sink: a checkpoint's records do not match their count"));
        }
        let marker = self.marker.as_ref().expect("exactly-once sink opened");
        let group = marker.group_metadata().ok_or("Kafka sink: the marker consumer has no group")?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.config.topic, 0, Offset::Offset(txn.checkpoint as i64))
            .map_err(|e| e.to_string())?;
        self.producer().send_offsets_to_transaction(&tpl, &group, wait).map_err(|e| fail("adding the marker", e))?;
        self.producer().commit_transaction(wait).map_err(|e| fail("committing", e))?;
        if let Some(e) = self.failed_delivery() {
            return Err(ConnectorError::transient(format!("Kafka sink: a record was not delivered: {e}")));
        }
        self.await_marker(txn.checkpoint)?;
        self.committed = Some(txn.checkpoint);
        Ok(())
    }
}

impl<T: Send + 'static> Sink<T> for KafkaSink<T> {
    type Committable = KafkaTxn;

    fn open(&mut self, ctx: &SinkContext) -> ConnectorResult<()> {
        let c = &self.config;
        if c.topic.is_empty() {
            return Err(ConnectorError::permanent("Kafka sink: no topic given"));
        }
        let exactly_once = c.mode == KafkaSinkMode::ExactlyOnce;
        if exactly_once && c.transaction_timeout_ms < MIN_TRANSACTION_TIMEOUT_MS {
            return Err(ConnectorError::permanent(format!(
                "Kafka sink: transaction_timeout_ms = {} is below {MIN_TRANSACTION_TIMEOUT_MS}: a transaction must outlast one commit of a checkpoint's records",
                c.transaction_timeout_ms
            )));
        }
        let txn_id = Self::transactional_id(ctx);
        let timeout = c.transaction_timeout_ms.to_string();
        let fixed: Vec<(&str, &str)> = if exactly_once {
            vec![("transactional.id", &txn_id), ("enable.idempotence", "true"), ("transaction.timeout.ms", &timeout)]
        } else {
            vec![("enable.idempotence", "true")]
        };
        let config = client_config("Kafka sink", &c.brokers, &[("linger.ms", "5")], &fixed, &c.properties)?;
        let producer: BaseProducer<Deliveries> = config
            .create_with_context(self.deliveries.clone())
            .map_err(|e| ConnectorError::permanent(format!("Kafka sink: bad configuration: {e}")))?;
        // The topic must exist (a typo must not start a job).
        let probe: BaseConsumer = client_config("Kafka sink", &c.brokers, &[], &[], &[])?
            .create()
            .map_err(|e| ConnectorError::permanent(format!("Kafka sink: bad configuration: {e}")))?;
        let partitions = super::client::partitions_of(&probe, &c.topic, c.unavailable_wait_ms)?;
        self.partition = match c.partitioning {
            KafkaPartitioning::ByKey => None,
            KafkaPartitioning::Fixed => partitions.get(ctx.subtask as usize % partitions.len().max(1)).copied(),
        };
        if exactly_once {
            let group = Self::marker_group(ctx);
            let marker: BaseConsumer = client_config(
                "Kafka sink",
                &c.brokers,
                &[("isolation.level", "read_committed")],
                &[("group.id", &group), ("enable.auto.commit", "false")],
                &[],
            )?
            .create()
            .map_err(|e| ConnectorError::permanent(format!("Kafka sink: bad configuration: {e}")))?;
            self.marker = Some(marker);
            // Fence every older producer of this subtask; a transaction a dead one left open is aborted.
            let wait = c.unavailable_wait_ms;
            with_retry("Kafka sink: fencing older producers (init_transactions)", wait, || {
                producer.init_transactions(Duration::from_millis(wait))
            })
            .map_err(|e| {
                if e.message().contains("InvalidTransactionTimeout") || e.message().contains("transaction timeout") {
                        ConnectorError::permanent(format!(
                            "{e}: transaction_timeout_ms ({}) is above what the broker allows (its transaction.max.timeout.ms): lower it",
                            c.transaction_timeout_ms
                        ))
                } else {
                        e
                }
            })?;
        }
        self.producer = Some(producer);
        self.ctx = Some(ctx.clone());
        self.data.clear();
        self.records = 0;
        Ok(())
    }

    fn recover(&mut self, to_commit: &[KafkaTxn]) -> ConnectorResult<()> {
        if self.config.mode == KafkaSinkMode::AtLeastOnce {
            return Ok(());
        }
        // Every subtask fenced its older producers in `open`, which the runtime runs for every task of
        // a generation before it starts any: no transaction of a dead generation is still open, so
        // the marker is final (see ARCHITECTURE.md on brokers that hold back a committed
        // transaction until the overlapping ones end).
        self.committed = self.read_marker()?;
        let mut pending: Vec<&KafkaTxn> = to_commit.iter().collect();
        pending.sort_by_key(|t| t.checkpoint);
        for txn in pending {
            if self.committed.is_some_and(|c| c >= txn.checkpoint) {
                continue;
            }
            tracing::info!(
                checkpoint = txn.checkpoint,
                records = txn.records,
                "Kafka sink: committing a restored checkpoint's records"
            );
            self.commit_one(txn)?;
        }
        Ok(())
    }

    fn write(&mut self, item: T) -> ConnectorResult<()> {
        self.key.clear();
        self.value.clear();
        (self.encode)(&item, &mut self.key, &mut self.value);
        if self.config.mode == KafkaSinkMode::AtLeastOnce {
            let (key, value) = (std::mem::take(&mut self.key), std::mem::take(&mut self.value));
            let r = self.send((!key.is_empty()).then_some(&key[..]), &value);
            (self.key, self.value) = (key, value);
            self.producer().poll(Duration::ZERO);
            return r;
        }
        if self.key.len() >= u32::MAX as usize || self.value.len() >= u32::MAX as usize {
            return Err(ConnectorError::permanent("Kafka sink: a record's key or value is 4 GiB or more"));
        }
        if self.data.len() + self.key.len() + self.value.len() + 8 > self.config.max_epoch_bytes {
            return Err(ConnectorError::permanent(format!(
                "Kafka sink: more than {} bytes of records between two checkpoints (max_epoch_bytes): checkpoint more often, raise the limit, or use at-least-once mode",
                self.config.max_epoch_bytes
            )));
        }
        if self.key.is_empty() {
            self.data.extend_from_slice(&u32::MAX.to_le_bytes());
        } else {
            self.data.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
            self.data.extend_from_slice(&self.key);
        }
        self.data.extend_from_slice(&(self.value.len() as u32).to_le_bytes());
        self.data.extend_from_slice(&self.value);
        self.records += 1;
        Ok(())
    }

    fn prepare(&mut self, checkpoint: CheckpointId) -> ConnectorResult<Option<KafkaTxn>> {
        if self.config.mode == KafkaSinkMode::AtLeastOnce {
            self.producer().flush(self.wait()).map_err(|e| {
                ConnectorError::transient(format!("Kafka sink: flushing at checkpoint {checkpoint}: {e}"))
            })?;
            if let Some(e) = self.failed_delivery() {
                return Err(ConnectorError::transient(format!("Kafka sink: a record was not delivered: {e}")));
            }
            return Ok(None);
        }
        if self.records == 0 {
            return Ok(None);
        }
        let data = std::mem::take(&mut self.data);
        let txn = KafkaTxn { checkpoint: checkpoint.0, records: self.records, data: Arc::new(data) };
        self.records = 0;
        Ok(Some(txn))
    }

    fn commit(&mut self, committables: &[KafkaTxn]) -> ConnectorResult<()> {
        for txn in committables {
            if self.committed.is_some_and(|c| c >= txn.checkpoint) {
                continue;
            }
            self.commit_one(txn)?;
        }
        Ok(())
    }

    fn close(&mut self) -> ConnectorResult<()> {
        if let Some(p) = self.producer.take() {
            p.flush(self.wait())
                .map_err(|e| ConnectorError::transient(format!("Kafka sink: flushing at close: {e}")))?;
        }
        self.marker = None;
        Ok(())
    }

    fn abort(&mut self) {
        self.producer = None;
        self.marker = None;
        self.taken.clear();
    }

    /// Opens a sink as each old subtask taken over (its transactional id, its marker), fencing its
    /// producers now, while every task of the generation is opened, as `open` does for its own.
    fn take_over(&mut self, old_subtasks: &[u32], _old_parallelism: u32) -> ConnectorResult<bool> {
        self.open_taken_over(old_subtasks)?;
        Ok(true)
    }

    /// Each old subtask's checkpoints are committed under its own transactional id and marker, the
    /// marker telling which were committed before.
    fn recover_taken_over(&mut self, prepared: &[(u32, Vec<KafkaTxn>)]) -> ConnectorResult<()> {
        self.recover_all_taken_over(prepared)
    }

    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> ConnectorResult<Option<bool>> {
        if self.config.mode == KafkaSinkMode::AtLeastOnce {
            return Ok(None);
        }
        let marker = self.read_marker()?;
        let own = match (marker, checkpoint) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(m), Some(c)) => m > c.0,
        };
        Ok(Some(own || self.taken_over_committed_after(checkpoint)?))
    }
}
