//! `S3Store` against a real S3-compatible server (moto, started by `scripts/s3-test-server`), whose
//! endpoint comes from the environment (`CUTLINE_S3_ENDPOINT`, `CUTLINE_S3_BUCKET`, `AWS_*`). Without
//! it these tests fail and say how to start one; they never pass silently. Each test works under a
//! prefix of its own, so they run in parallel on one bucket.
//!
//! The store scenarios are those of the local and memory stores (`src/tests/scenarios.rs`,
//! `src/tests/gc.rs`); the rest is what only a remote store has: racing committers, failures and
//! retries. For failures the server cannot be made to produce on demand, a small loopback TCP proxy
//! in front of the real server drops connections or answers, and a loopback responder answers every
//! request with one status; no test replaces the server's S3 behaviour with a fake.
#![cfg(feature = "s3")]

use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};
use cutline_storage::{
    CheckpointListing, CheckpointStore, GenerationRecord, JobMeta, Manifest, RetryLimits, S3Config, S3Store,
    StorageError, TaskStateHandle,
};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

// ---- the server, the store under test and raw access to its objects -----------------------------

const HOW_TO_START: &str = concat!(
    "the S3 tests need a real S3-compatible server, named by CUTLINE_S3_ENDPOINT, CUTLINE_S3_BUCKET, ",
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. Start one on loopback (moto, installed on first use) with\n",
    "    eval \"$(scripts/s3-test-server)\"\n",
    "then run the tests in that shell:\n",
    "    cargo test -p cutline-storage --release --features s3 --test s3\n",
    "and stop the server afterwards with\n",
    "    scripts/s3-test-server stop \"$CUTLINE_S3_SERVER_PID\"",
);

/// Retry limits small enough for tests: 4 attempts, 20 ms doubling to 200 ms.
fn test_limits() -> RetryLimits {
    RetryLimits {
        attempts: 4,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        request_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(2),
    }
}

/// The server's configuration from the environment, with test retry limits and no prefix. Fails
/// the test, saying how to start a server, if the environment does not name one.
fn server_config() -> S3Config {
    if std::env::var("CUTLINE_S3_ENDPOINT").map_or(true, |v| v.trim().is_empty()) {
        panic!("CUTLINE_S3_ENDPOINT is not set: {HOW_TO_START}");
    }
    let mut config = S3Config::from_env().unwrap_or_else(|e| panic!("{e}\n{HOW_TO_START}"));
    config.retry = test_limits();
    config
}

fn endpoint(config: &S3Config) -> String {
    config.endpoint.clone().unwrap()
}

fn server_addr(config: &S3Config) -> SocketAddr {
    let e = endpoint(config);
    let hostport = e.strip_prefix("http://").expect("the test server speaks plain http").trim_end_matches('/');
    std::net::ToSocketAddrs::to_socket_addrs(hostport).unwrap().next().unwrap()
}

/// A prefix no other test (of this or another run) uses.
fn unique_prefix(test: &str) -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("cutline-tests/{test}-{}-{nanos}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Direct access to the objects under a prefix, with a client of its own (as another program
/// would have), to look at what the store wrote and to damage it.
struct Raw {
    store: AmazonS3,
    runtime: tokio::runtime::Runtime,
    prefix: String,
}

impl Raw {
    fn new(config: &S3Config) -> Raw {
        let store = AmazonS3Builder::new()
            .with_endpoint(endpoint(config))
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(true)
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Raw { store, runtime, prefix: config.prefix.clone() }
    }

    fn key(&self, rel: &str) -> ObjectPath {
        ObjectPath::parse(format!("{}/{rel}", self.prefix)).unwrap()
    }

    fn put(&self, rel: &str, bytes: &[u8]) {
        self.runtime.block_on(self.store.put(&self.key(rel), PutPayload::from(bytes.to_vec()))).unwrap();
    }

    fn get(&self, rel: &str) -> Option<Vec<u8>> {
        let key = self.key(rel);
        self.runtime.block_on(async {
            match self.store.get(&key).await {
                Ok(r) => Some(r.bytes().await.unwrap().to_vec()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => panic!("raw get {rel}: {e}"),
            }
        })
    }

    /// Every object under the prefix, relative to it, sorted (a walk of delimited listings).
    fn files(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![ObjectPath::parse(&self.prefix).unwrap()];
        while let Some(dir) = dirs.pop() {
            let listing = self.runtime.block_on(self.store.list_with_delimiter(Some(&dir))).unwrap();
            dirs.extend(listing.common_prefixes);
            let root = format!("{}/", self.prefix);
            out.extend(
                listing.objects.into_iter().map(|o| o.location.as_ref().strip_prefix(&root).unwrap().to_string()),
            );
        }
        out.sort();
        out
    }

    fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        self.files().into_iter().map(|p| (p.clone(), self.get(&p).unwrap())).collect()
    }

    fn flip_byte(&self, rel: &str, at: usize) {
        let mut bytes = self.get(rel).unwrap();
        bytes[at] ^= 0xFF;
        self.put(rel, &bytes);
    }
}

/// A store under a fresh prefix, and raw access to it.
struct Harness {
    store: Arc<S3Store>,
    raw: Raw,
    config: S3Config,
}

impl Harness {
    fn new(test: &str) -> Harness {
        let config = server_config().with_prefix(unique_prefix(test));
        let store = Arc::new(S3Store::open(config.clone()).unwrap_or_else(|e| panic!("{e}\n{HOW_TO_START}")));
        Harness { store, raw: Raw::new(&config), config }
    }

    fn s(&self) -> &dyn CheckpointStore {
        &*self.store
    }
}

fn write(s: &dyn CheckpointStore, id: u64, op: &str, sub: u32, payload: &[u8]) -> TaskStateHandle {
    let kg = KeyGroupRange::for_subtask(128, 2, sub % 2);
    s.write_task_state(CheckpointId(id), &OperatorId::new(op), SubtaskIndex(sub), 2, Some(kg), payload).unwrap()
}

fn listing(pairs: &[(u64, bool)]) -> Vec<CheckpointListing> {
    pairs.iter().map(|&(id, complete)| CheckpointListing { id: CheckpointId(id), complete, fenced: false }).collect()
}

fn manifest(id: u64, tasks: Vec<TaskStateHandle>) -> Manifest {
    Manifest::new("job-fingerprint", CheckpointId(id), Generation(1), 1_000 + id, false, tasks)
}

fn dir_of(id: u64) -> String {
    format!("checkpoints/chk-{id:020}")
}

fn remote_parts(err: &StorageError) -> (Option<u16>, bool, u32) {
    match err {
        StorageError::Remote { status, transient, attempts, .. } => (*status, *transient, *attempts),
        other => panic!("expected StorageError::Remote, got {other}"),
    }
}

// ---- the store contract, as the local and memory stores pass it ---------------------------------

#[test]
fn write_commit_list_verify() {
    let h = Harness::new("write-commit");
    let s = h.s();
    assert_eq!(s.list_checkpoints().unwrap(), vec![]);
    let a = write(s, 1, "map.1", 0, b"alpha");
    let b = write(s, 1, "map.1", 1, b"beta");
    assert_eq!(a.file, format!("{}/map.1-0.state", dir_of(1)));
    assert_eq!(a.size_bytes, 5 + 20);
    let raw = h.raw.get(&a.file).unwrap();
    assert_eq!(a.crc32.to_le_bytes(), raw[raw.len() - 4..]);
    // A retried write replaces the object.
    let b = {
        let retried = write(s, 1, "map.1", 1, b"beta, retried");
        assert_eq!(retried.file, b.file);
        retried
    };
    assert_eq!(s.read_task_state(&b).unwrap(), b"beta, retried");
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(1, false)]));
    assert_eq!(s.latest_complete().unwrap(), None);

    let m = manifest(1, vec![a.clone(), b.clone()]);
    s.commit_manifest(&m).unwrap();
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(1, true)]));
    assert_eq!(s.read_manifest(CheckpointId(1)).unwrap(), m);
    assert_eq!(s.verify(CheckpointId(1)).unwrap(), m);
    assert_eq!(s.read_task_state(&a).unwrap(), b"alpha");

    write(s, 3, "src", 0, b"later attempt");
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(1, true), (3, false)]));
    assert_eq!(s.max_checkpoint_id_seen().unwrap(), Some(CheckpointId(3)));
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(1)));
    assert!(matches!(s.read_manifest(CheckpointId(3)), Err(StorageError::NotFound { .. })));
    // Exactly the layout of the local store, and no temporary objects.
    assert_eq!(
        h.raw.files(),
        vec![
            format!("{}/_MANIFEST", dir_of(1)),
            format!("{}/map.1-0.state", dir_of(1)),
            format!("{}/map.1-1.state", dir_of(1)),
            format!("{}/src-0.state", dir_of(3)),
        ]
    );
}

#[test]
fn a_committed_manifest_is_never_replaced() {
    let h = Harness::new("immutable");
    let s = h.s();
    let a = write(s, 7, "op", 0, b"x");
    let m = manifest(7, vec![a]);
    s.commit_manifest(&m).unwrap();
    let before = h.raw.snapshot();
    let mut other = m.clone();
    other.created_at_unix_ms += 1;
    assert!(matches!(s.commit_manifest(&other), Err(StorageError::ManifestExists(CheckpointId(7)))));
    assert!(matches!(
        s.write_task_state(CheckpointId(7), &OperatorId::new("op"), SubtaskIndex(0), 1, None, b"y"),
        Err(StorageError::ManifestExists(CheckpointId(7)))
    ));
    assert_eq!(h.raw.snapshot(), before);
    assert_eq!(s.read_manifest(CheckpointId(7)).unwrap(), m);
}

/// Two stores (two clients, as two coordinators in two processes would have) commit different
/// manifests of the same checkpoint at the same moment: the conditional create lets exactly one win,
/// and the stored manifest is the winner's.
#[test]
fn of_two_racing_committers_exactly_one_wins() {
    let h = Harness::new("race");
    let other = Arc::new(S3Store::open(h.config.clone()).unwrap());
    let stores: [Arc<S3Store>; 2] = [h.store.clone(), other];
    for id in 1..=12u64 {
        let task = write(h.s(), id, "op", 0, format!("state {id}").as_bytes());
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let (store, barrier) = (store.clone(), barrier.clone());
                let mut m = manifest(id, vec![task.clone()]);
                m.created_at_unix_ms = 10 * id + i as u64; // different bytes per committer
                std::thread::spawn(move || {
                    barrier.wait();
                    (m.clone(), store.commit_manifest(&m))
                })
            })
            .collect();
        let results: Vec<(Manifest, Result<(), StorageError>)> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        let winners: Vec<&Manifest> = results.iter().filter(|(_, r)| r.is_ok()).map(|(m, _)| m).collect();
        assert_eq!(winners.len(), 1, "checkpoint {id}: {results:?}");
        for (_, r) in &results {
            if let Err(e) = r {
                assert!(matches!(e, StorageError::ManifestExists(c) if *c == CheckpointId(id)), "{e}");
            }
        }
        for store in &stores {
            assert_eq!(&store.read_manifest(CheckpointId(id)).unwrap(), winners[0]);
        }
    }
}

// ---- generation records and fencing ------------------------------------------------------------

fn record(generation: u64, restored: Option<u64>, owner: &str) -> GenerationRecord {
    GenerationRecord {
        job_fingerprint: "job-fingerprint".into(),
        generation: Generation(generation),
        restored: restored.map(CheckpointId),
        created_unix_ms: 1_700_000_000_000 + generation,
        owner: owner.into(),
    }
}

fn commit_as(s: &dyn CheckpointStore, id: u64, generation: u64) {
    let task = write(s, id, "op", 0, format!("{id} by generation {generation}").as_bytes());
    let mut m = manifest(id, vec![task]);
    m.generation = Generation(generation);
    s.commit_manifest(&m).unwrap();
}

#[test]
fn a_generation_is_claimed_once() {
    let h = Harness::new("claim-once");
    let s = h.s();
    assert_eq!(s.latest_generation().unwrap(), None);
    let first = record(1, None, "host-a/pid-1");
    s.claim_generation(&first).unwrap();
    assert_eq!(h.raw.files(), vec!["generations/gen-00000000000000000001".to_string()]);
    for second in [first.clone(), record(1, Some(3), "host-b/pid-2")] {
        match s.claim_generation(&second) {
            Err(StorageError::GenerationTaken { generation, owner }) => {
                assert_eq!((generation, owner.as_str()), (Generation(1), "host-a/pid-1"))
            }
            other => panic!("expected GenerationTaken, got {other:?}"),
        }
    }
    assert_eq!(s.generations().unwrap(), vec![first]);
    s.claim_generation(&record(3, None, "host-c")).unwrap();
    assert!(matches!(
        s.claim_generation(&record(2, None, "host-old")),
        Err(StorageError::Superseded { generation: Generation(2), newer: Generation(3), .. })
    ));
    assert!(h.raw.get("generations/gen-00000000000000000002").is_none(), "a superseded claim writes nothing");
    assert_eq!(s.latest_generation().unwrap().unwrap().owner, "host-c");
    // A damaged record is corruption, as a damaged job.meta is.
    h.raw.flip_byte("generations/gen-00000000000000000003", 3);
    assert!(matches!(s.latest_generation(), Err(StorageError::BadMagic { .. })));
}

/// Two coordinators (two clients) claim the same generation at the same moment: the conditional
/// create lets exactly one win, and the stored record is the winner's.
#[test]
fn of_two_racing_claims_exactly_one_wins() {
    let h = Harness::new("claim-race");
    let other = Arc::new(S3Store::open(h.config.clone()).unwrap());
    let stores: [Arc<S3Store>; 2] = [h.store.clone(), other];
    for generation in 1..=12u64 {
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let (store, barrier) = (store.clone(), barrier.clone());
                let claim = record(generation, Some(generation), &format!("host-{i}/gen-{generation}"));
                std::thread::spawn(move || {
                    barrier.wait();
                    let result = store.claim_generation(&claim);
                    (claim, result)
                })
            })
            .collect();
        let results: Vec<(GenerationRecord, Result<(), StorageError>)> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        let winners: Vec<&GenerationRecord> = results.iter().filter(|(_, r)| r.is_ok()).map(|(c, _)| c).collect();
        assert_eq!(winners.len(), 1, "generation {generation}: {results:?}");
        for (_, r) in &results {
            if let Err(e) = r {
                assert!(
                    matches!(e, StorageError::GenerationTaken { generation: g, owner }
                        if *g == Generation(generation) && *owner == winners[0].owner),
                    "{e}"
                );
            }
        }
        for store in &stores {
            assert_eq!(store.latest_generation().unwrap().as_ref(), Some(winners[0]));
        }
    }
}

/// Generation 1 completes 5; generation 2 takes over from 5; the zombie generation 1 then commits 6:
/// 6 is fenced (never restored, removed by gc), 5 stays the latest until generation 2 commits 7.
#[test]
fn a_zombie_commit_after_a_newer_generation_took_over_is_fenced() {
    let h = Harness::new("zombie");
    let zombie = S3Store::open(h.config.clone()).unwrap(); // the old coordinator's own client
    zombie.claim_generation(&record(1, None, "old-host/pid-1")).unwrap();
    commit_as(&zombie, 5, 1);
    let s = h.s();
    s.claim_generation(&record(2, Some(5), "new-host/pid-2")).unwrap();
    zombie.check_not_fenced(Generation(1)).expect_err("superseded");
    commit_as(&zombie, 6, 1); // it did not look
    for store in [s, &zombie as &dyn CheckpointStore] {
        assert_eq!(store.latest_complete().unwrap(), Some(CheckpointId(5)));
        let listed = store.list_checkpoints().unwrap();
        assert_eq!(
            listed,
            vec![
                CheckpointListing { id: CheckpointId(5), complete: true, fenced: false },
                CheckpointListing { id: CheckpointId(6), complete: false, fenced: true },
            ]
        );
        match store.verify(CheckpointId(6)) {
            Err(StorageError::Fenced { checkpoint, generation, by }) => {
                assert_eq!((checkpoint, generation, by), (CheckpointId(6), Generation(1), Generation(2)))
            }
            other => panic!("expected Fenced, got {other:?}"),
        }
    }
    match zombie.check_not_fenced(Generation(1)) {
        Err(StorageError::Superseded { newer, owner, .. }) => {
            assert_eq!((newer, owner.as_str()), (Generation(2), "new-host/pid-2"))
        }
        other => panic!("expected Superseded, got {other:?}"),
    }
    s.check_not_fenced(Generation(2)).unwrap();
    // Even the zombie's own gc keeps generation 2's restore point and drops its fenced commit.
    let report = zombie.gc(1, &[]).unwrap();
    assert_eq!(report.removed_checkpoints, vec![CheckpointId(6)]);
    s.verify(CheckpointId(5)).unwrap();
    commit_as(s, 7, 2);
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(7)));
    s.verify(CheckpointId(7)).unwrap();
    let report = s.gc(1, &[]).unwrap();
    assert_eq!(report.removed_checkpoints, vec![CheckpointId(5)]);
    assert_eq!(report.removed_generations, vec![], "the newest two records always stay");
    assert_eq!(s.generations().unwrap().len(), 2);
}

#[test]
fn discard_removes_attempts_and_refuses_complete_ones() {
    let h = Harness::new("discard");
    let s = h.s();
    let done = write(s, 1, "op", 0, b"done");
    s.commit_manifest(&manifest(1, vec![done])).unwrap();
    write(s, 2, "op", 0, b"aborted");
    write(s, 2, "op", 1, b"aborted too");
    h.raw.put(&format!("{}/._MANIFEST.1-1.tmp", dir_of(2)), b"half a manifest");
    s.discard(CheckpointId(2)).unwrap();
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(1, true)]));
    assert!(h.raw.files().iter().all(|f| !f.starts_with(&dir_of(2))));
    s.discard(CheckpointId(2)).unwrap(); // idempotent
    s.discard(CheckpointId(99)).unwrap();
    let before = h.raw.snapshot();
    assert!(matches!(s.discard(CheckpointId(1)), Err(StorageError::DiscardComplete(CheckpointId(1)))));
    assert_eq!(h.raw.snapshot(), before);
    s.verify(CheckpointId(1)).unwrap();
}

#[test]
fn discard_keeps_objects_a_later_manifest_references() {
    let h = Harness::new("discard-keeps");
    let s = h.s();
    let shared = write(s, 1, "op", 0, b"shared");
    write(s, 1, "op", 1, b"private");
    let own = write(s, 2, "op", 1, b"own");
    s.commit_manifest(&manifest(2, vec![shared.clone(), own])).unwrap();
    s.discard(CheckpointId(1)).unwrap();
    s.verify(CheckpointId(2)).unwrap();
    let left: Vec<String> = h.raw.files().into_iter().filter(|f| f.starts_with(&dir_of(1))).collect();
    assert_eq!(left, vec![shared.file]);
}

/// Each kind of damage to a committed object, and the error verify must report.
#[test]
fn damaged_objects_are_caught_by_the_checksum_and_size() {
    let h = Harness::new("damage");
    type Damage = fn(&Raw, &str);
    type Expect = fn(&StorageError) -> bool;
    let cases: Vec<(&str, Damage, Expect)> = vec![
        ("flip in header", |r, p| r.flip_byte(p, 0), |e| matches!(e, StorageError::ChecksumMismatch { .. })),
        ("flip in payload", |r, p| r.flip_byte(p, 17), |e| matches!(e, StorageError::ChecksumMismatch { .. })),
        (
            "flip in checksum",
            |r, p| {
                let len = r.get(p).unwrap().len();
                r.flip_byte(p, len - 1)
            },
            |e| matches!(e, StorageError::ChecksumMismatch { .. }),
        ),
        (
            "truncated",
            |r, p| {
                let bytes = r.get(p).unwrap();
                r.put(p, &bytes[..bytes.len() - 3])
            },
            |e| matches!(e, StorageError::SizeMismatch { .. }),
        ),
        (
            "replaced by another valid frame of the same size",
            |r, p| r.put(p, &cutline_storage::encode_frame(cutline_storage::FileKind::TaskState, b"payloaD")),
            |e| matches!(e, StorageError::ChecksumMismatch { .. }),
        ),
    ];
    for (i, (what, damage, expect)) in cases.into_iter().enumerate() {
        let id = 10 + i as u64;
        let good = write(h.s(), id, "ok", 0, b"fine");
        let bad = write(h.s(), id, "victim", 0, b"payload");
        h.s().commit_manifest(&manifest(id, vec![good, bad.clone()])).unwrap();
        h.s().verify(CheckpointId(id)).unwrap();
        damage(&h.raw, &bad.file);
        let err = h.s().verify(CheckpointId(id)).unwrap_err();
        assert!(expect(&err), "{what}: got {err}");
        assert!(err.is_corruption() && !err.is_transient(), "{what}: {err}");
        assert!(err.to_string().contains(&format!("s3://{}/", h.config.bucket)), "names the object: {err}");
    }
    // A missing object.
    let gone = write(h.s(), 30, "victim", 0, b"payload");
    h.s().commit_manifest(&manifest(30, vec![gone.clone()])).unwrap();
    let mut handle = gone;
    handle.file = format!("{}/nope-0.state", dir_of(30));
    assert!(matches!(h.s().read_task_state(&handle), Err(StorageError::NotFound { .. })));
}

#[test]
fn a_damaged_manifest_fails_to_read() {
    let h = Harness::new("damaged-manifest");
    let s = h.s();
    let a = write(s, 4, "op", 0, b"x");
    s.commit_manifest(&manifest(4, vec![a])).unwrap();
    let path = format!("{}/_MANIFEST", dir_of(4));
    let len = h.raw.get(&path).unwrap().len();
    for at in [0, 9, len / 2, len - 1] {
        h.raw.flip_byte(&path, at);
        assert!(s.read_manifest(CheckpointId(4)).is_err(), "flip at {at}");
        assert!(s.verify(CheckpointId(4)).is_err(), "flip at {at}");
        h.raw.flip_byte(&path, at);
    }
    s.verify(CheckpointId(4)).unwrap();
    let state = h.raw.get(&format!("{}/op-0.state", dir_of(4))).unwrap();
    h.raw.put(&path, &state);
    assert!(matches!(s.read_manifest(CheckpointId(4)), Err(StorageError::WrongKind { .. })));
}

/// Temporary names (which this store never writes, but another writer or an older local copy may
/// have left) are not commits, and gc cleans them up outside in-flight attempts.
#[test]
fn temporary_leftovers_are_not_commits_and_gc_removes_them() {
    let h = Harness::new("leftovers");
    let s = h.s();
    let a = write(s, 5, "op", 0, b"x");
    let m = manifest(5, vec![a]);
    let temp = format!("{}/._MANIFEST.4242-0.tmp", dir_of(5));
    h.raw.put(&temp, &cutline_storage::encode_frame(cutline_storage::FileKind::Manifest, b"not really"));
    h.raw.put(".job.meta.4242-1.tmp", b"half");
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(5, false)]));
    assert_eq!(s.read_meta().unwrap(), None);
    s.gc(1, &[CheckpointId(5)]).unwrap();
    assert!(h.raw.get(&temp).is_some(), "gc left the in-flight attempt alone");
    assert!(h.raw.get(".job.meta.4242-1.tmp").is_none());
    s.commit_manifest(&m).unwrap();
    let report = s.gc(1, &[]).unwrap();
    assert_eq!((report.removed_files, report.removed_checkpoints.len()), (1, 0));
    assert!(h.raw.get(&temp).is_none());
    s.verify(CheckpointId(5)).unwrap();
}

#[test]
fn meta_and_finished_marker_roundtrip() {
    let h = Harness::new("meta");
    let s = h.s();
    assert_eq!(s.read_meta().unwrap(), None);
    assert_eq!(s.finished().unwrap(), None);
    for gen in 1..4 {
        let meta = JobMeta {
            job_fingerprint: "fp".into(),
            generation: Generation(gen),
            epoch_lease_end: CheckpointId(gen * 100),
        };
        s.write_meta(&meta).unwrap();
        assert_eq!(s.read_meta().unwrap(), Some(meta));
    }
    assert!(matches!(s.mark_finished(CheckpointId(3)), Err(StorageError::NotFound { .. })));
    let a = write(s, 3, "op", 0, b"last");
    let mut m = manifest(3, vec![a]);
    m.is_final = true;
    s.commit_manifest(&m).unwrap();
    s.mark_finished(CheckpointId(3)).unwrap();
    assert_eq!(s.finished().unwrap(), Some(CheckpointId(3)));
    assert!(s.read_manifest(CheckpointId(3)).unwrap().is_final);
    h.raw.flip_byte("job.meta", 3);
    assert!(matches!(s.read_meta(), Err(StorageError::BadMagic { .. })));
}

#[test]
fn unrelated_objects_are_ignored_and_kept() {
    let h = Harness::new("unrelated");
    let s = h.s();
    let junk = [
        "checkpoints/chk-12/state",
        "checkpoints/chk-0000000000000000000x/y",
        "checkpoints/notes.txt",
        "checkpoints/chk-00000000000000000009.bak/z",
        // An object where a checkpoint "directory" belongs.
        "checkpoints/chk-00000000000000000003",
        "README",
    ];
    for path in junk {
        h.raw.put(path, b"not cutline's");
    }
    let a = write(s, 2, "op", 0, b"x");
    s.commit_manifest(&manifest(2, vec![a])).unwrap();
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(2, true)]));
    s.gc(1, &[]).unwrap();
    for path in junk {
        assert!(h.raw.get(path).is_some(), "gc removed {path}");
    }
}

#[test]
fn invalid_ids_and_references_are_rejected() {
    let h = Harness::new("invalid-ids");
    let s = h.s();
    for bad in ["", "a/b", "../up", "a b", "é"] {
        let err =
            s.write_task_state(CheckpointId(1), &OperatorId::new(bad), SubtaskIndex(0), 1, None, b"").unwrap_err();
        assert!(matches!(err, StorageError::InvalidOperatorId(ref s) if s == bad));
    }
    let mut handle = write(s, 1, "op", 0, b"x");
    for bad in ["../outside", "/etc/passwd", "checkpoints/../../x"] {
        handle.file = bad.to_string();
        assert!(matches!(s.read_task_state(&handle), Err(StorageError::InvalidPath(_))));
    }
    assert!(h.raw.files().iter().all(|f| f.starts_with("checkpoints/")));
}

/// Retention by reachability over random histories (as `src/tests/gc.rs`, fewer and shorter: every
/// step is a few requests).
#[test]
fn gc_keeps_exactly_what_retained_manifests_and_in_flight_attempts_need() {
    for seed in 1..=2u64 {
        let h = Harness::new("gc");
        random_history(&h, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 6);
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

struct Model {
    rng: Rng,
    next_id: u64,
    live: BTreeMap<u64, Manifest>,
    in_flight: BTreeMap<u64, Vec<TaskStateHandle>>,
    payloads: BTreeMap<String, Vec<u8>>,
}

const OPERATORS: [&str; 2] = ["src", "sink-1"];
const SUBTASKS: u32 = 2;

impl Model {
    fn write(&mut self, s: &dyn CheckpointStore, id: u64, op: &str, sub: u32) -> TaskStateHandle {
        let payload = format!("{id}/{op}/{sub}/{}", self.rng.next()).into_bytes();
        let handle = s
            .write_task_state(CheckpointId(id), &OperatorId::new(op), SubtaskIndex(sub), SUBTASKS, None, &payload)
            .unwrap();
        self.payloads.insert(handle.file.clone(), payload);
        handle
    }

    fn step(&mut self, h: &Harness) {
        let id = self.next_id;
        self.next_id += 1;
        let fate = self.rng.below(10);
        let mut tasks = Vec::new();
        for op in OPERATORS {
            for sub in 0..SUBTASKS {
                if fate >= 6 && self.rng.percent(30) {
                    continue;
                }
                let base = if fate < 6 && !self.live.is_empty() && self.rng.percent(50) {
                    let pick = self.rng.below(self.live.len() as u64) as usize;
                    self.live.values().nth(pick)
                } else {
                    None
                };
                let reused = base
                    .and_then(|m| m.tasks.iter().find(|t| t.operator.as_str() == op && t.subtask.0 == sub).cloned());
                tasks.push(match reused {
                    Some(handle) => handle,
                    None => self.write(h.s(), id, op, sub),
                });
            }
        }
        if self.rng.percent(25) {
            h.raw.put(&format!("{}/._MANIFEST.77-{id}.tmp", dir_of(id)), b"crash leftover");
        }
        match fate {
            0..=5 => {
                let m = manifest(id, tasks);
                h.s().commit_manifest(&m).unwrap();
                self.live.insert(id, m);
            }
            6..=7 => {}
            _ => {
                self.in_flight.insert(id, tasks);
            }
        }
    }

    fn settle_some_in_flight(&mut self, h: &Harness) {
        let ids: Vec<u64> = self.in_flight.keys().copied().collect();
        for id in ids {
            match self.rng.below(3) {
                0 => {
                    let m = manifest(id, self.in_flight.remove(&id).unwrap());
                    h.s().commit_manifest(&m).unwrap();
                    self.live.insert(id, m);
                }
                1 => {
                    self.in_flight.remove(&id);
                }
                _ => {}
            }
        }
    }
}

fn check_gc(h: &Harness, model: &mut Model, retain: usize) {
    let s = h.s();
    let in_flight: Vec<CheckpointId> = model.in_flight.keys().map(|&id| CheckpointId(id)).collect();
    let in_flight_dirs: Vec<String> = model.in_flight.keys().map(|&id| format!("{}/", dir_of(id))).collect();
    let under_in_flight = |path: &str| in_flight_dirs.iter().any(|d| path.starts_with(d));
    let before = h.raw.snapshot();
    let dropped: Vec<u64> = model.live.keys().rev().skip(retain).copied().collect();

    let report = s.gc(retain, &in_flight).unwrap();

    for id in &dropped {
        model.live.remove(id);
    }
    let after = h.raw.snapshot();
    let listed: Vec<u64> = s.list_checkpoints().unwrap().iter().filter(|l| l.complete).map(|l| l.id.0).collect();
    assert_eq!(listed, model.live.keys().copied().collect::<Vec<_>>());
    let mut expected: BTreeSet<String> = BTreeSet::new();
    for (id, m) in &model.live {
        assert_eq!(&s.verify(CheckpointId(*id)).unwrap(), m);
        expected.insert(format!("{}/_MANIFEST", dir_of(*id)));
        for t in &m.tasks {
            assert_eq!(s.read_task_state(t).unwrap(), model.payloads[&t.file]);
            expected.insert(t.file.clone());
        }
    }
    let flight = |snap: &[(String, Vec<u8>)]| -> Vec<(String, Vec<u8>)> {
        snap.iter().filter(|(p, _)| under_in_flight(p)).cloned().collect()
    };
    assert_eq!(flight(&before), flight(&after), "gc touched an in-flight attempt");
    let remaining: Vec<&String> =
        after.iter().map(|(p, _)| p).filter(|p| !under_in_flight(p) && !expected.contains(*p)).collect();
    assert!(remaining.is_empty(), "gc left {remaining:?}");
    let size = |snap: &[(String, Vec<u8>)]| snap.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
    assert_eq!(report.removed_files, before.len() - after.len());
    assert_eq!(report.removed_bytes, size(&before) - size(&after));
    for id in &dropped {
        assert!(report.removed_checkpoints.contains(&CheckpointId(*id)), "{id} not reported");
    }
    let again = s.gc(retain, &in_flight).unwrap();
    assert_eq!((again.removed_files, again.removed_bytes), (0, 0));
}

fn random_history(h: &Harness, seed: u64, rounds: usize) {
    let mut model = Model {
        rng: Rng(seed),
        next_id: 1,
        live: BTreeMap::new(),
        in_flight: BTreeMap::new(),
        payloads: BTreeMap::new(),
    };
    for _ in 0..rounds {
        for _ in 0..1 + model.rng.below(4) {
            model.step(h);
        }
        if model.rng.percent(30) {
            h.raw.put(&format!(".job.meta.77-{}.tmp", model.next_id), b"crash leftover");
        }
        let retain = 1 + model.rng.below(3) as usize;
        check_gc(h, &mut model, retain);
        model.settle_some_in_flight(h);
    }
}

// ---- what only an object store has ---------------------------------------------------------------

#[test]
fn a_reopened_store_sees_its_checkpoints_and_prefixes_do_not_leak() {
    let h = Harness::new("reopen");
    let a = write(h.s(), 9, "op", 0, b"x");
    h.s().commit_manifest(&manifest(9, vec![a])).unwrap();
    assert_eq!(h.s().describe(), format!("s3://{}/{} at {}", h.config.bucket, h.config.prefix, endpoint(&h.config)));
    let reopened = S3Store::open(h.config.clone()).unwrap();
    reopened.verify(CheckpointId(9)).unwrap();
    assert_eq!(h.raw.files().len(), 2, "open leaves no probe object behind: {:?}", h.raw.files());
    // A prefix that merely starts with the same characters, and one below it, are other stores.
    for prefix in [format!("{}x", h.config.prefix), format!("{}/nested", h.config.prefix)] {
        let neighbour = S3Store::open(h.config.clone().with_prefix(prefix)).unwrap();
        assert_eq!(neighbour.list_checkpoints().unwrap(), vec![]);
        neighbour.gc(1, &[]).unwrap();
    }
    reopened.verify(CheckpointId(9)).unwrap();
}

/// Tasks write concurrently from many threads through one shared store (one client, one runtime).
#[test]
fn tasks_write_concurrently_through_one_store() {
    let h = Harness::new("concurrent");
    let store: Arc<dyn CheckpointStore> = h.store.clone();
    let threads: Vec<_> = (0..8u32)
        .map(|sub| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..5u64)
                    .map(|id| write(&*store, id + 1, "op", sub, format!("{id}/{sub}").as_bytes()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let handles: Vec<Vec<TaskStateHandle>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for id in 1..=5u64 {
        let tasks: Vec<TaskStateHandle> = handles.iter().map(|hs| hs[(id - 1) as usize].clone()).collect();
        store.commit_manifest(&manifest(id, tasks)).unwrap();
        let m = store.verify(CheckpointId(id)).unwrap();
        for t in &m.tasks {
            assert_eq!(store.read_task_state(t).unwrap(), format!("{}/{}", id - 1, t.subtask.0).into_bytes());
        }
    }
    assert_eq!(store.latest_complete().unwrap(), Some(CheckpointId(5)));
}

/// An object store has no lock: `lock` hands out guards that hold nothing (documented), and says so
/// by not refusing a second holder.
#[test]
fn lock_holds_nothing_on_an_object_store() {
    let h = Harness::new("lock");
    let first = h.s().lock().unwrap();
    let second = h.s().lock().unwrap();
    assert_eq!(format!("{first:?}"), "StoreLock(none)");
    drop((first, second));
}

#[test]
fn a_missing_bucket_is_a_clear_permanent_error_never_an_empty_store() {
    let mut config = server_config().with_prefix(unique_prefix("no-bucket"));
    config.bucket = format!("cutline-no-such-bucket-{}", std::process::id());
    let err = S3Store::open(config.clone()).unwrap_err();
    assert!(matches!(err, StorageError::InvalidRoot { .. }), "{err}");
    assert!(!err.is_transient());
    let text = err.to_string();
    assert!(text.contains(&format!("the bucket {} does not exist", config.bucket)), "{text}");

    // A bucket that disappears under an open store: reads and writes fail for good, they do not
    // report objects as absent.
    let bucket = format!("cutline-vanishing-{}-{}", std::process::id(), unique_prefix("b").len());
    assert_eq!(raw_http(&config, "PUT", &format!("/{bucket}")), 200, "create bucket {bucket}");
    config.bucket = bucket.clone();
    let store = S3Store::open(config.clone()).unwrap();
    let a = write(&store, 1, "op", 0, b"x");
    let raw = Raw::new(&config);
    raw.runtime.block_on(raw.store.delete(&raw.key(&a.file))).unwrap();
    assert!(matches!(raw_http(&config, "DELETE", &format!("/{bucket}")), 200 | 204), "delete bucket");
    let err = store.read_task_state(&a).unwrap_err();
    let (status, transient, attempts) = remote_parts(&err);
    assert_eq!((status, transient, attempts), (Some(404), false, 1), "{err}");
    let err = store.write_meta(&JobMeta {
        job_fingerprint: "fp".into(),
        generation: Generation(1),
        epoch_lease_end: CheckpointId(1),
    });
    let err = err.unwrap_err();
    assert_eq!(remote_parts(&err), (Some(404), false, 1), "{err}");
    assert!(err.to_string().contains("NoSuchBucket"), "{err}");
}

/// One unsigned request to the test server (moto does not check signatures), for what the store
/// cannot do itself: create and delete buckets. The HTTP status.
fn raw_http(config: &S3Config, method: &str, path: &str) -> u16 {
    let mut conn = TcpStream::connect(server_addr(config)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let host = server_addr(config);
    write!(conn, "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {answer:?}"))
}

// ---- failures and retries -------------------------------------------------------------------------

/// A config for a server at `addr` that is not the real one (closed port, responder, proxy).
fn config_at(addr: SocketAddr, test: &str) -> S3Config {
    let mut config = server_config().with_prefix(unique_prefix(test));
    config.endpoint = Some(format!("http://{addr}"));
    config
}

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

/// A loopback HTTP server that answers every request with `answer(method, target, headers)`,
/// counting requests. For failures a real server will not produce on demand (503, 403), and for a
/// server that ignores conditional writes.
struct Responder {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl Responder {
    fn start(answer: impl Fn(&str, &str, &str) -> String + Send + Sync + 'static) -> Responder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let (count, answer) = (requests.clone(), Arc::new(answer));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let (count, answer) = (count.clone(), answer.clone());
                std::thread::spawn(move || {
                    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    while let Some((method, target, headers)) = read_request(&mut conn) {
                        count.fetch_add(1, Ordering::SeqCst);
                        if conn.write_all(answer(&method, &target, &headers).as_bytes()).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Responder { addr, requests }
    }

    fn status(code: u16, reason: &'static str) -> Responder {
        Responder::start(move |_, _, _| {
            let body = format!("<?xml version=\"1.0\"?><Error><Code>{reason}</Code><Message>test</Message></Error>");
            format!("HTTP/1.1 {code} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        })
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Reads one request (headers and a Content-Length body): method, target, lowercased headers.
fn read_request(conn: &mut TcpStream) -> Option<(String, String, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let mut first = head.lines().next()?.split(' ');
    let (method, target) = (first.next()?.to_string(), first.next()?.to_string());
    let headers = head.to_ascii_lowercase();
    let length = headers
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).ok()?;
    Some((method, target, headers))
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

/// A TCP proxy on loopback in front of the real server that can fail requests on purpose: refuse the
/// next requests (close the connection on them), or swallow the answer to the next conditional PUT
/// (forward it, let the server apply it, and close the connection instead of answering).
struct Proxy {
    addr: SocketAddr,
    refuse_next: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    swallow_next_conditional_put: Arc<AtomicBool>,
    swallowed: Arc<AtomicUsize>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = Proxy {
            addr: listener.local_addr().unwrap(),
            refuse_next: Arc::default(),
            refused: Arc::default(),
            swallow_next_conditional_put: Arc::default(),
            swallowed: Arc::default(),
        };
        let (refuse_next, refused) = (proxy.refuse_next.clone(), proxy.refused.clone());
        let (swallow_next, swallowed) = (proxy.swallow_next_conditional_put.clone(), proxy.swallowed.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let swallow_this = Arc::new(AtomicBool::new(false));
                // client -> server, deciding per request (a read that starts with a method).
                {
                    let (mut from, mut to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let (refuse_next, refused) = (refuse_next.clone(), refused.clone());
                    let (swallow_next, swallow_this) = (swallow_next.clone(), swallow_this.clone());
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let chunk = &buf[..n];
                            let starts_request = [&b"GET "[..], b"PUT ", b"HEAD ", b"DELETE ", b"POST "]
                                .iter()
                                .any(|m| chunk.starts_with(m));
                            if starts_request
                                && refuse_next
                                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                                    .is_ok()
                            {
                                refused.fetch_add(1, Ordering::SeqCst);
                                break; // drop the connection with the request unanswered
                            }
                            let conditional_put = chunk.starts_with(b"PUT ")
                                && String::from_utf8_lossy(chunk).to_ascii_lowercase().contains("if-none-match");
                            if conditional_put && swallow_next.swap(false, Ordering::SeqCst) {
                                swallow_this.store(true, Ordering::SeqCst);
                            }
                            if to.write_all(chunk).is_err() {
                                break;
                            }
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
                // server -> client, unless this connection's answer is to be swallowed.
                {
                    let (mut from, mut to) = (server, client);
                    let swallowed = swallowed.clone();
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if swallow_this.load(Ordering::SeqCst) {
                                swallowed.fetch_add(1, Ordering::SeqCst);
                                break; // the server applied the request; the client never hears
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        proxy
    }
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

#[test]
fn the_store_is_a_shareable_trait_object() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<S3Store>();
    let h = Harness::new("trait-object");
    let shared: Arc<dyn CheckpointStore> = h.store.clone();
    assert!(shared.describe().starts_with("s3://"));
}
