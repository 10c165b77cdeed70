//! Kafka connectors (feature `kafka`): [`KafkaSource`], which keeps its offsets in the checkpoint,
//! and [`KafkaSink`], exactly-once through Kafka transactions (or at-least-once through the
//! idempotent producer). Both use librdkafka (the `rdkafka` crate), the client whose transactional
//! producer is the reference after Java's.
//!
//! The source's offsets live in cutline's checkpoints, never in consumer groups: partitions are
//! assigned to subtasks by a fixed rule, not by a group coordinator, so a restore reads exactly
//! from the checkpoint's positions. The sink's design for the commit window is in [`KafkaSink`]'s docs.

mod arc_bytes;
mod assignment;
mod client;
mod sink;
mod source;
mod take_over;

pub use assignment::{owner_of, split_of};
pub use sink::{
    KafkaPartitioning, KafkaSink, KafkaSinkConfig, KafkaSinkMode, KafkaTxn, RecordFn, DEFAULT_MAX_EPOCH_BYTES,
    DEFAULT_TRANSACTION_TIMEOUT_MS, MIN_TRANSACTION_TIMEOUT_MS,
};
pub use source::{
    KafkaOffsets, KafkaRecord, KafkaSource, KafkaSourceConfig, PartitionOffset, StartPosition,
    DEFAULT_DISCOVERY_INTERVAL_MS,
};

/// Default wait for brokers that cannot be reached (at open, at commit) before the task fails.
pub const DEFAULT_UNAVAILABLE_WAIT_MS: u64 = 60_000;

use crate::error::{ConnectorError, ConnectorResult};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

fn admin(brokers: &str) -> ConnectorResult<AdminClient<DefaultClientContext>> {
    client::client_config("Kafka admin", brokers, &[], &[], &[])?
        .create()
        .map_err(|e| ConnectorError::permanent(format!("Kafka admin: bad configuration: {e}")))
}

/// Create `topic` with `partitions` partitions (replication factor 1) at `brokers`; an existing
/// topic is left as it is. For tests and first setups: the connectors never create topics.
pub fn create_topic(brokers: &str, topic: &str, partitions: i32) -> ConnectorResult<()> {
    let admin = admin(brokers)?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let results = client::block_on(admin.create_topics(&[new], &AdminOptions::new()))
        .map_err(|e| ConnectorError::transient(format!("creating Kafka topic {topic}: {e}")))?;
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => return Err(ConnectorError::transient(format!("creating Kafka topic {t}: {code}"))),
        }
    }
    Ok(())
}
