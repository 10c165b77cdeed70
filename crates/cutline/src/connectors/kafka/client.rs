//! What the Kafka source and sink share: client configuration, waiting for brokers that cannot be
//! reached, topic metadata, and telling errors waiting may fix from those it cannot.

use crate::error::ConnectorError;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::time::{Duration, Instant};

/// First pause between attempts at something the brokers refused for now; it doubles up to
/// [`MAX_RETRY_PAUSE_MS`].
const FIRST_RETRY_PAUSE_MS: u64 = 50;
/// Longest pause between attempts.
const MAX_RETRY_PAUSE_MS: u64 = 1_000;
/// Time limit of one metadata request.
pub(crate) const METADATA_TIMEOUT_MS: u64 = 5_000;

/// A client configuration for `brokers` with the user's extra librdkafka `properties` on top of the
/// given defaults (the user's win, except for what `fixed` names: those keep their value and a
/// user's attempt to set them is refused).
pub(crate) fn client_config(
    what: &str,
    brokers: &str,
    defaults: &[(&str, &str)],
    fixed: &[(&str, &str)],
    properties: &[(String, String)],
) -> Result<ClientConfig, ConnectorError> {
    if brokers.trim().is_empty() {
        return Err(ConnectorError::permanent(format!("{what}: no brokers given (host:port[,host:port...])")));
    }
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    for (k, v) in defaults {
        c.set(*k, *v);
    }
    for (k, v) in properties {
        if let Some((_, fixed_value)) = fixed.iter().find(|(f, _)| f == k) {
            if fixed_value != v {
                return Err(ConnectorError::permanent(format!(
                    "{what}: the property {k} is set by cutline ({k}={fixed_value}) and cannot be changed: \
                     exactly-once depends on it"
                )));
            }
        }
        c.set(k, v);
    }
    for (k, v) in fixed {
        c.set(*k, *v);
    }
    Ok(c)
}

/// Could waiting fix this error (a broker down, a leader election, a coordinator loading)?
pub(crate) fn retriable(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(
            C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::OperationTimedOut
            | C::RequestTimedOut
            | C::NetworkException
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::CoordinatorLoadInProgress
            | C::CoordinatorNotAvailable
            | C::NotCoordinator
            | C::Resolve
            | C::QueueFull
            | C::ConcurrentTransactions
            | C::NotEnoughReplicas
            | C::NotEnoughReplicasAfterAppend,
        ) => true,
        _ => matches!(e, KafkaError::MetadataFetch(_)),
    }
}

/// Run `f` until it succeeds, fails with an error waiting cannot fix, or `wait_ms` passed
/// (pausing with backoff between attempts); `what` names the step in the error.
pub(crate) fn with_retry<T>(
    what: &str,
    wait_ms: u64,
    mut f: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, ConnectorError> {
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut pause = FIRST_RETRY_PAUSE_MS;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if retriable(&e) && Instant::now() < deadline => {
                tracing::warn!(error = %e, step = what, "Kafka unavailable, retrying");
                std::thread::sleep(Duration::from_millis(pause));
                pause = (pause * 2).min(MAX_RETRY_PAUSE_MS);
            }
            Err(e) if retriable(&e) => {
                return Err(ConnectorError::transient(format!(
                    "{what}: Kafka unavailable for {wait_ms} ms (unavailable_wait_ms): {e}"
                )))
            }
            Err(e) => return Err(ConnectorError::transient(format!("{what}: {e}"))),
        }
    }
}

/// The partitions of `topic`, waiting up to `wait_ms` for brokers that cannot be reached. A topic
/// the brokers do not know is a permanent error (create it first).
pub(crate) fn partitions_of(consumer: &BaseConsumer, topic: &str, wait_ms: u64) -> Result<Vec<i32>, ConnectorError> {
    let md = with_retry(&format!("reading the metadata of topic {topic}"), wait_ms, || {
        consumer.fetch_metadata(Some(topic), Duration::from_millis(METADATA_TIMEOUT_MS))
    })?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Err(missing_topic(topic));
    };
    if let Some(e) = t.error() {
        let code = RDKafkaErrorCode::from(e);
        if code == RDKafkaErrorCode::UnknownTopicOrPartition || code == RDKafkaErrorCode::UnknownTopic {
            return Err(missing_topic(topic));
        }
        return Err(ConnectorError::transient(format!("reading the metadata of topic {topic}: {code}")));
    }
    if t.partitions().is_empty() {
        return Err(missing_topic(topic));
    }
    let mut ps: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    ps.sort_unstable();
    Ok(ps)
}

fn missing_topic(topic: &str) -> ConnectorError {
    ConnectorError::permanent(format!(
        "the Kafka topic {topic} does not exist: create it first (cutline does not create topics, so a typo cannot start a job on an empty topic)"
    ))
}

/// Drive a future to completion on this thread (rdkafka's admin API returns futures; the connectors
/// are synchronous).
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark()
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// The high watermark of `topic`/`partition` from the last fetch response `consumer` received (no
/// request; `None` before the first response). librdkafka's `rd_kafka_get_watermark_offsets`, which
/// the `rdkafka` crate does not wrap.
pub(super) fn cached_high_watermark(consumer: &BaseConsumer, topic: &str, partition: i32) -> Option<i64> {
    let name = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid while `consumer` lives; the name is a NUL-terminated
    // string that outlives the call; librdkafka writes the two offsets and keeps no pointer.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            name.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}
