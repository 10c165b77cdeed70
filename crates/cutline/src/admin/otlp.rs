//! Export of checkpoint traces to an OpenTelemetry collector: OTLP over HTTP with JSON bodies
//! (`POST <endpoint>/v1/traces`), one trace per completed checkpoint.
//!
//! A checkpoint is a root span from its trigger to the notification of its tasks; each task is a
//! child span from its first barrier to its ack, with an event per barrier arrival, the snapshot,
//! the handoff to the writers and the durable state; the commit and the notification are children
//! of the root. Attributes carry the figures (`cutline.*`), the root the slowest step of the critical
//! path. Span and trace ids are derived from the checkpoint, so a record sent twice is the same
//! trace.
//!
//! The exporter is best effort and bounded: the coordinator hands each record to a queue of
//! [`OTLP_QUEUE_RECORDS`] and never waits (a full queue drops the record and counts it); one thread
//! sends them, each request within [`OTLP_REQUEST_TIMEOUT`], without retries. Only `http://`
//! endpoints are spoken to (a collector agent on the host or as a sidecar, the usual deployment).

use crate::runtime::{CheckpointListener, CheckpointRecord, TaskTrace};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Records waiting to be sent, at most; more are dropped (and counted).
pub const OTLP_QUEUE_RECORDS: usize = 64;
/// One export request (connect, send, answer) gives up after this long.
pub const OTLP_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest answer read from a collector.
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// What is wrong with an OTLP endpoint.
#[derive(Debug, thiserror::Error)]
#[error("bad OTLP endpoint {endpoint:?}: {reason}; give http://HOST:PORT (a collector's OTLP/HTTP port, usually 4318)")]
pub struct OtlpError {
    /// The endpoint given.
    pub endpoint: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Where to send: `host:port` and the request path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpEndpoint {
    /// `host:port` to connect to.
    pub authority: String,
    /// The request path (`/v1/traces` after the endpoint's own path).
    pub path: String,
}

/// Parse `http://host:port[/base]` as the OTLP/HTTP spec reads `OTEL_EXPORTER_OTLP_ENDPOINT`:
/// traces go to `<base>/v1/traces`.
pub fn parse_endpoint(endpoint: &str) -> Result<OtlpEndpoint, OtlpError> {
    let bad = |reason: &str| OtlpError { endpoint: endpoint.to_string(), reason: reason.to_string() };
    if endpoint.starts_with("https://") {
        return Err(bad("https is not spoken here: send to a collector agent over http on the host or in the pod"));
    }
    let rest = endpoint.strip_prefix("http://").ok_or_else(|| bad("it does not start with http://"))?;
    let (authority, base) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad("the host or the port is missing or wrong"));
    }
    Ok(OtlpEndpoint { authority: authority.to_string(), path: format!("{base}/v1/traces") })
}

/// A running exporter: its counters. Dropping it stops its thread once the queue is sent.
pub struct OtlpExporter {
    stats: Arc<OtlpStats>,
    thread: Option<std::thread::JoinHandle<()>>,
    tx: Option<crossbeam_channel::Sender<CheckpointRecord>>,
}

/// What an exporter did.
#[derive(Debug, Default)]
pub struct OtlpStats {
    /// Traces the collector accepted.
    pub sent: AtomicU64,
    /// Traces that could not be sent (the collector unreachable or refusing).
    pub failed: AtomicU64,
    /// Traces dropped because the queue was full.
    pub dropped: AtomicU64,
}

impl OtlpExporter {
    /// The exporter's counters.
    pub fn stats(&self) -> &OtlpStats {
        &self.stats
    }
}

impl Drop for OtlpExporter {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Start an exporter to `endpoint` for a job named `service` (the `service.name` of its traces), and
/// the listener to put in [`RunConfig::on_checkpoint`](crate::RunConfig::on_checkpoint).
pub fn otlp_exporter(endpoint: &str, service: &str) -> Result<(OtlpExporter, CheckpointListener), OtlpError> {
    let target = parse_endpoint(endpoint)?;
    let (tx, rx) = crossbeam_channel::bounded::<CheckpointRecord>(OTLP_QUEUE_RECORDS);
    let stats = Arc::new(OtlpStats::default());
    let (stats2, service) = (stats.clone(), service.to_string());
    let thread = std::thread::Builder::new()
        .name("cutline-otlp".into())
        .spawn(move || {
            for r in rx {
                let body = serde_json::to_vec(&traces_json(&r, &service)).expect("JSON");
                match post(&target, &body) {
                    Ok(()) => stats2.sent.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        let n = stats2.failed.fetch_add(1, Ordering::Relaxed);
                        if n.is_power_of_two() || n == 0 {
                            tracing::warn!(
                                event = "otlp_export_failed",
                                chk = r.checkpoint,
                                "the trace of checkpoint {} was not exported to http://{}{}: {e} ({} failed so far)",
                                r.checkpoint,
                                target.authority,
                                target.path,
                                n + 1
                            );
                        }
                        n
                    }
                };
            }
        })
        .map_err(|e| OtlpError { endpoint: endpoint.to_string(), reason: format!("cannot start a thread: {e}") })?;
    let (tx2, stats3) = (tx.clone(), stats.clone());
    let listener: CheckpointListener = Arc::new(move |r: &CheckpointRecord| {
        if tx2.try_send(r.clone()).is_err() {
            stats3.dropped.fetch_add(1, Ordering::Relaxed);
        }
    });
    Ok((OtlpExporter { stats, thread: Some(thread), tx: Some(tx) }, listener))
}

fn post(target: &OtlpEndpoint, body: &[u8]) -> Result<(), String> {
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&target.authority)
        .map_err(|e| format!("cannot resolve {}: {e}", target.authority))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", target.authority))?;
    let mut s = TcpStream::connect_timeout(&addr, OTLP_REQUEST_TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(OTLP_REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(OTLP_REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        target.path,
        target.authority,
        body.len()
    );
    s.write_all(head.as_bytes()).and_then(|()| s.write_all(body)).map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    s.take(MAX_ANSWER_BYTES).read_to_end(&mut answer).map_err(|e| e.to_string())?;
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&answer) {
        Ok(_) => match resp.code {
            Some(c) if (200..300).contains(&c) => Ok(()),
            Some(c) => Err(format!("the collector answered {c}")),
            None => Err("the collector's answer has no status".into()),
        },
        Err(e) => Err(format!("the collector's answer is not HTTP: {e}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A 64-bit id from some numbers (never 0, which OTLP reserves for "none").
fn id64(parts: &[u64]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for p in parts {
        h = crate::splitmix64(h ^ p);
    }
    h.max(1)
}

fn attr(key: &str, v: Value) -> Value {
    let value = match v {
        Value::Bool(b) => json!({ "boolValue": b }),
        Value::Number(n) if n.is_u64() || n.is_i64() => json!({ "intValue": n.to_string() }),
        Value::Number(n) => json!({ "doubleValue": n }),
        other => json!({ "stringValue": other.as_str().map(String::from).unwrap_or_else(|| other.to_string()) }),
    };
    json!({ "key": key, "value": value })
}

/// The OTLP/JSON `ExportTraceServiceRequest` of one checkpoint.
pub fn traces_json(r: &CheckpointRecord, service: &str) -> Value {
    let trace = hex(&[
        id64(&[r.checkpoint, r.generation, r.triggered_at_unix_ms]).to_be_bytes(),
        id64(&[r.checkpoint, 7]).to_be_bytes(),
    ]
    .concat());
    let root = id64(&[r.checkpoint, r.generation, 1]);
    let t0 = (r.triggered_at_unix_ms as u128) * 1_000_000;
    let at = |us: u64| (t0 + us as u128 * 1_000).to_string();
    let span =
        |id: u64, parent: Option<u64>, name: String, from: u64, to: u64, attrs: Vec<Value>, events: Vec<Value>| {
            let mut s = json!({
                "traceId": trace,
                "spanId": hex(&id.to_be_bytes()),
                "name": name,
                "kind": 1,
                "startTimeUnixNano": at(from),
                "endTimeUnixNano": at(to.max(from)),
                "attributes": attrs,
                "events": events,
            });
            if let Some(p) = parent {
                s["parentSpanId"] = json!(hex(&p.to_be_bytes()));
            }
            s
        };
    let slowest = r.slowest_step();
    let mut spans = vec![span(
        root,
        None,
        format!("checkpoint {}", r.checkpoint),
        0,
        r.notified_us,
        vec![
            attr("cutline.checkpoint", json!(r.checkpoint)),
            attr("cutline.generation", json!(r.generation)),
            attr("cutline.kind", json!(r.kind)),
            attr("cutline.duration_ms", json!(r.duration_ms)),
            attr("cutline.bytes", json!(r.bytes)),
            attr("cutline.channel_state_bytes", json!(r.channel_state_bytes)),
            attr("cutline.unaligned_tasks", json!(r.unaligned_tasks)),
            attr("cutline.slowest_step", json!(slowest.as_ref().map(|s| s.what.name()).unwrap_or(""))),
            attr("cutline.slowest_at", json!(slowest.as_ref().map(|s| s.at.as_str()).unwrap_or(""))),
        ],
        Vec::new(),
    )];
    for (i, t) in r.tasks.iter().enumerate() {
        spans.push(task_span(t, id64(&[r.checkpoint, r.generation, 100 + i as u64]), root, &span, &at));
    }
    spans.push(span(
        id64(&[r.checkpoint, r.generation, 2]),
        Some(root),
        "commit".into(),
        r.last_ack_us,
        r.committed_us,
        Vec::new(),
        Vec::new(),
    ));
    spans.push(span(
        id64(&[r.checkpoint, r.generation, 3]),
        Some(root),
        "notify".into(),
        r.committed_us,
        r.notified_us,
        Vec::new(),
        Vec::new(),
    ));
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [attr("service.name", json!(service))] },
            "scopeSpans": [{ "scope": { "name": "cutline", "version": env!("CARGO_PKG_VERSION") }, "spans": spans }],
        }]
    })
}

type SpanFn<'a> = dyn Fn(u64, Option<u64>, String, u64, u64, Vec<Value>, Vec<Value>) -> Value + 'a;

fn task_span(t: &TaskTrace, id: u64, root: u64, span: &SpanFn<'_>, at: &dyn Fn(u64) -> String) -> Value {
    let event = |name: String, us: u64| json!({ "name": name, "timeUnixNano": at(us) });
    let mut events: Vec<Value> =
        t.inputs.iter().filter_map(|i| i.barrier_us.map(|us| event(format!("barrier from {}", i.from), us))).collect();
    events.push(event("snapshot".into(), t.snapshot_us));
    events.push(event("handed to the writers".into(), t.handoff_us));
    events.push(event("durable".into(), t.durable_us));
    let attrs = vec![
        attr("cutline.task", json!(t.task)),
        attr("cutline.alignment_us", json!(t.alignment_us())),
        attr("cutline.sync_us", json!(t.sync_us)),
        attr("cutline.upload_us", json!(t.durable_us.saturating_sub(t.handoff_us))),
        attr("cutline.ack_us", json!(t.acked_us.saturating_sub(t.durable_us))),
        attr("cutline.bytes", json!(t.bytes)),
        attr("cutline.channel_state_bytes", json!(t.channel_state_bytes)),
        attr("cutline.blocked_records", json!(t.blocked_records)),
        attr("cutline.unaligned", json!(t.unaligned)),
    ];
    span(id, Some(root), format!("task {}", t.task), t.first_barrier_us(), t.acked_us, attrs, events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_as_the_otlp_spec_reads_them_and_bad_ones_refused_with_the_way_out() {
        let e = parse_endpoint("http://collector:4318").unwrap();
        assert_eq!((e.authority.as_str(), e.path.as_str()), ("collector:4318", "/v1/traces"));
        assert_eq!(parse_endpoint("http://127.0.0.1:4318/otlp/").unwrap().path, "/otlp/v1/traces");
        for bad in ["https://c:4318", "collector:4318", "http://collector", "http://:4318", "http://c:0"] {
            let e = parse_endpoint(bad).unwrap_err().to_string();
            assert!(e.contains("http://HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_checkpoint_is_one_trace_a_root_span_and_a_child_per_task() {
        let r = CheckpointRecord {
            checkpoint: 3,
            generation: 1,
            kind: "checkpoint".into(),
            triggered_at_unix_ms: 1_000,
            notified_us: 5_000,
            tasks: vec![TaskTrace { task: "a#0".into(), acked_us: 4_000, ..Default::default() }],
            ..Default::default()
        };
        let v = traces_json(&r, "job");
        let spans = v["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap();
        assert_eq!(spans.len(), 4);
        let root = &spans[0];
        assert_eq!(root["name"], "checkpoint 3");
        assert_eq!(root["startTimeUnixNano"], "1000000000");
        assert_eq!(root["endTimeUnixNano"], "1005000000");
        assert!(root.get("parentSpanId").is_none());
        for s in &spans[1..] {
            assert_eq!(s["traceId"], root["traceId"]);
            assert_eq!(s["parentSpanId"], root["spanId"]);
        }
        assert_eq!(root["traceId"].as_str().unwrap().len(), 32);
        assert_eq!(root["spanId"].as_str().unwrap().len(), 16);
        assert_eq!(traces_json(&r, "job"), v, "the same record is the same trace");
    }
}
