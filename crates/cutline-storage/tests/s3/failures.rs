//! Failures and retries: a closed port, answers a real server will not give on demand (503, 403, a
//! server that ignores conditional writes), an outage, and conditional creates whose answers were
//! lost.

use super::proxy::{Proxy, Responder};
use super::{config_at, remote_parts, server_addr, server_config, Raw};
use crate::common::{listing, manifest, record, write};
use cutline_core::CheckpointId;
use cutline_storage::{CheckpointStore, S3Store, StorageError};
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[test]
fn a_closed_port_fails_after_the_named_attempts_with_a_transient_error_in_bounded_time() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap(); // closed when dropped
    let config = config_at(port, "closed-port");
    let started = Instant::now();
    let err = S3Store::open(config.clone()).unwrap_err();
    let elapsed = started.elapsed();
    let (status, transient, attempts) = remote_parts(&err);
    assert_eq!((status, transient, attempts), (None, true, config.retry.attempts), "{err}");
    assert!(err.is_transient());
    assert!(err.to_string().contains("4 attempts"), "{err}");
    // Sleeps of at least 10 + 20 + 40 ms (half of 20, 40, 80 ms) and at most 20 + 40 + 80 ms.
    assert!(elapsed >= Duration::from_millis(70), "{elapsed:?}: no backoff?");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[test]
fn server_errors_are_retried_up_to_the_limit_then_reported_as_transient() {
    let server = Responder::status(503, "SlowDown");
    let err = S3Store::open(config_at(server.addr, "503")).unwrap_err();
    assert_eq!(remote_parts(&err), (Some(503), true, 4), "{err}");
    assert_eq!(server.requests(), 4, "one request per attempt");
}

#[test]
fn refusals_are_not_retried_and_are_permanent() {
    let server = Responder::status(403, "AccessDenied");
    let err = S3Store::open(config_at(server.addr, "403")).unwrap_err();
    assert_eq!(remote_parts(&err), (Some(403), false, 1), "{err}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("check the access key"), "{err}");
    assert_eq!(server.requests(), 1, "a refusal is not retried");
}

/// A server that answers every PUT with 200, conditional or not, would let a manifest be replaced:
/// `open` finds out and refuses it.
#[test]
fn a_server_that_ignores_conditional_writes_is_refused_at_open() {
    let server = Responder::start(|method, _, _| {
        let (status, body) = match method {
            "GET" => (
                "200 OK",
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult \
                 xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix></Prefix><KeyCount>0</KeyCount>\
                 <MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter><IsTruncated>false</IsTruncated></ListBucketResult>",
            ),
            "DELETE" => ("204 No Content", ""),
            _ => ("200 OK", ""),
        };
        format!("HTTP/1.1 {status}\r\nETag: \"e\"\r\nContent-Length: {}\r\n\r\n{body}", body.len())
    });
    let err = S3Store::open(config_at(server.addr, "no-conditional")).unwrap_err();
    assert!(
        matches!(&err, StorageError::InvalidRoot { reason, .. } if reason.contains("ignores conditional writes")),
        "{err}"
    );
}

/// The server goes away for a few requests: fewer failures than attempts are ridden out; as many
/// as the attempts fail the operation with a transient error; and the store works again after.
#[test]
fn a_briefly_unavailable_server_is_ridden_out_by_retries() {
    let real = server_config();
    let proxy = Proxy::start(server_addr(&real));
    let config = config_at(proxy.addr, "outage");
    let store = S3Store::open(config.clone()).unwrap();
    let raw = Raw::new(&server_config().with_prefix(config.prefix.clone()));

    proxy.refuse_next.store(3, Ordering::SeqCst); // attempts - 1
    let a = write(&store, 1, "op", 0, b"through an outage");
    assert_eq!(proxy.refused.load(Ordering::SeqCst), 3);
    assert_eq!(raw.get(&a.file).map(|b| b.len() as u64), Some(a.size_bytes));

    proxy.refuse_next.store(4, Ordering::SeqCst); // as many as the attempts
    let started = Instant::now();
    let err = store.commit_manifest(&manifest(1, vec![a.clone()])).unwrap_err();
    assert_eq!(remote_parts(&err), (None, true, 4), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(proxy.refused.load(Ordering::SeqCst), 7);
    assert_eq!(store.list_checkpoints().unwrap(), listing(&[(1, false)]), "the failed commit left no manifest");

    store.commit_manifest(&manifest(1, vec![a.clone()])).unwrap(); // the server is back
    store.verify(CheckpointId(1)).unwrap();
}

/// The server applies the conditional create of a manifest but its answer is lost: the retry meets
/// the manifest, finds it byte for byte the one it sent, and reports the commit as done (not as
/// `ManifestExists`, which would make the coordinator abort a committed checkpoint).
#[test]
fn a_commit_whose_answer_was_lost_is_recognised_on_retry() {
    let real = server_config();
    let proxy = Proxy::start(server_addr(&real));
    let store = S3Store::open(config_at(proxy.addr, "lost-answer")).unwrap();
    let a = write(&store, 1, "op", 0, b"x");
    let m = manifest(1, vec![a]);
    proxy.swallow_next_conditional_put.store(true, Ordering::SeqCst);
    store.commit_manifest(&m).unwrap();
    assert_eq!(proxy.swallowed.load(Ordering::SeqCst), 1, "the answer was swallowed");
    assert_eq!(store.read_manifest(CheckpointId(1)).unwrap(), m);
    let mut other = m.clone();
    other.created_at_unix_ms += 1;
    assert!(matches!(store.commit_manifest(&other), Err(StorageError::ManifestExists(CheckpointId(1)))));
    assert!(matches!(store.commit_manifest(&m), Err(StorageError::ManifestExists(CheckpointId(1)))));
}

/// The server creates a generation record but the answer is lost: the retry meets the record, finds
/// it byte for byte the one it sent, and reports the claim as done (not as `GenerationTaken`, which
/// would stop the coordinator that does own the generation).
#[test]
fn a_claim_whose_answer_was_lost_is_recognised_on_retry() {
    let real = server_config();
    let proxy = Proxy::start(server_addr(&real));
    let store = S3Store::open(config_at(proxy.addr, "lost-claim")).unwrap();
    let mine = record(4, Some(2), "host-a/pid-1");
    proxy.swallow_next_conditional_put.store(true, Ordering::SeqCst);
    store.claim_generation(&mine).unwrap();
    assert_eq!(proxy.swallowed.load(Ordering::SeqCst), 1, "the answer was swallowed");
    assert_eq!(store.latest_generation().unwrap(), Some(mine.clone()));
    assert!(matches!(store.claim_generation(&record(4, Some(2), "host-b")), Err(StorageError::GenerationTaken { .. })));
    assert!(matches!(store.claim_generation(&mine), Err(StorageError::GenerationTaken { .. })));
}
