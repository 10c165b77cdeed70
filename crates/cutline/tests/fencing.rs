//! Fencing of an older coordinator: once a newer generation is recorded in checkpoint storage (a new
//! coordinator took over, for example after a partition), the old coordinator commits no further
//! manifest, tells no sink to commit, and stops with an error that says why.

use cutline::{CheckpointId, GenerationRecord, Sink, SinkContext};
use cutline::{CheckpointStore, Generation, GeneratorSource, Job, LocalDirStore, MemoryTxnSink, MemoryTxnStore};
use cutline::{RunConfig, RunError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a [`Ledger`] sink did: the transactions it prepared and those it committed, each with the
/// checkpoint that prepared it and its number of records.
#[derive(Default)]
struct Book {
    prepared: Vec<(CheckpointId, usize)>,
    committed: Vec<(CheckpointId, usize)>,
}

/// A transactional sink (a [`MemoryTxnSink`]) that keeps a [`Book`] of its transactions, so that a
/// test can tell which checkpoints' output was committed.
struct Ledger {
    inner: MemoryTxnSink,
    book: Arc<Mutex<Book>>,
    open: usize,
}

impl Clone for Ledger {
    fn clone(&self) -> Self {
        Ledger { inner: self.inner.clone(), book: self.book.clone(), open: 0 }
    }
}

impl Sink<String> for Ledger {
    type Committable = (CheckpointId, usize, String);
    fn open(&mut self, ctx: &SinkContext) -> cutline::ConnectorResult<()> {
        Sink::<String>::open(&mut self.inner, ctx)
    }
    fn recover(&mut self, to_commit: &[Self::Committable]) -> cutline::ConnectorResult<()> {
        let keys: Vec<String> = to_commit.iter().map(|(_, _, k)| k.clone()).collect();
        Sink::<String>::recover(&mut self.inner, &keys)?;
        self.book.lock().unwrap().committed.extend(to_commit.iter().map(|(c, n, _)| (*c, *n)));
        Ok(())
    }
    fn write(&mut self, item: String) -> cutline::ConnectorResult<()> {
        self.open += 1;
        self.inner.write(item)
    }
    fn prepare(&mut self, checkpoint: CheckpointId) -> cutline::ConnectorResult<Option<Self::Committable>> {
        let n = std::mem::take(&mut self.open);
        let key = Sink::<String>::prepare(&mut self.inner, checkpoint)?;
        if key.is_some() {
            self.book.lock().unwrap().prepared.push((checkpoint, n));
        }
        Ok(key.map(|k| (checkpoint, n, k)))
    }
    fn commit(&mut self, committables: &[Self::Committable]) -> cutline::ConnectorResult<()> {
        let keys: Vec<String> = committables.iter().map(|(_, _, k)| k.clone()).collect();
        Sink::<String>::commit(&mut self.inner, &keys)?;
        let mut book = self.book.lock().unwrap();
        for (c, n, _) in committables {
            if !book.committed.iter().any(|(d, _)| d == c) {
                book.committed.push((*c, *n));
            }
        }
        Ok(())
    }
    fn abort(&mut self) {
        self.open = 0;
        Sink::<String>::abort(&mut self.inner)
    }
    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> cutline::ConnectorResult<Option<bool>> {
        Sink::<String>::committed_after(&mut self.inner, checkpoint)
    }
}

#[test]
fn a_coordinator_superseded_by_a_newer_generation_stops_without_committing_more() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalDirStore::open(dir.path()).unwrap());
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let book = Arc::new(Mutex::new(Book::default()));
    let job = Job::new("fenced");
    job.source("numbers", GeneratorSource::new(2_000_000, |i| i % 7))
        .map(|k: u64| {
            std::thread::sleep(Duration::from_micros(5));
            k
        })
        .key_by(|k: &u64| *k)
        .aggregate("count", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
        .sink("out", Ledger { inner: MemoryTxnSink::new(out.clone()), book: book.clone(), open: 0 });
    let mut cfg = RunConfig::new(store.clone(), "fenced-v1");
    cfg.checkpoint.interval_ms = Some(10);
    cfg.batch_size = 64;
    let handle = cutline::spawn(job.build().unwrap(), cfg);
    // Let it complete a few checkpoints.
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.latest_complete().unwrap().is_none_or(|c| c.0 < 3) {
        assert!(Instant::now() < deadline, "no checkpoints");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A newer coordinator takes over: it restored the latest complete checkpoint it saw.
    let restored = store.latest_complete().unwrap();
    let current = store.latest_generation().unwrap().expect("the running job recorded its generation");
    store
        .claim_generation(&GenerationRecord {
            job_fingerprint: "fenced-v1".into(),
            generation: Generation(current.generation.0 + 10),
            restored,
            created_unix_ms: 0,
            owner: "the test".into(),
        })
        .unwrap();
    let committed_then = out.lock().unwrap().committed_records().len();
    let err = handle.join().expect_err("the old coordinator must stop");
    assert!(matches!(err, RunError::Superseded(_)), "{err}");
    assert!(err.to_string().contains("newer coordinator"), "{err}");
    // Nothing the old generation completed after the takeover counts.
    assert_eq!(store.latest_complete().unwrap(), restored, "a fenced manifest must never be the latest complete");
    // Its sinks committed at most what was in flight at the takeover: the output of checkpoints up
    // to the latest complete one then (whose manifest was committed before the newer record
    // appeared, and whose commit may have reached the sinks only after it), never a later one's.
    let committed_after = out.lock().unwrap().committed_records().len();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(out.lock().unwrap().committed_records().len(), committed_after, "commits after the job stopped");
    let restored = restored.expect("checkpoints completed before the takeover");
    let book = book.lock().unwrap();
    let late: Vec<CheckpointId> = book.committed.iter().map(|(c, _)| *c).filter(|c| *c > restored).collect();
    assert!(late.is_empty(), "the superseded coordinator committed output of {late:?}, after {restored}");
    let in_flight: usize = book.prepared.iter().filter(|(c, _)| *c <= restored).map(|(_, n)| n).sum();
    assert!(
        committed_after <= in_flight,
        "{committed_after} records committed, more than the {in_flight} prepared up to {restored} (the takeover)"
    );
    assert!(committed_after >= committed_then, "committed output disappeared");
    let prepared_later: usize = book.prepared.iter().filter(|(c, _)| *c > restored).map(|(_, n)| n).sum();
    eprintln!(
        "takeover at {restored}: {committed_then} records committed then, {committed_after} after the stop, at most \
         {in_flight} in flight; {prepared_later} prepared by later checkpoints and never committed"
    );
}

/// Guards against: an older coordinator completed checkpoint c after a new one listed the
/// checkpoints but before it claimed its generation; the claim then fenced c although the old
/// coordinator's sinks could already have committed it, and the new one restored an older checkpoint.
/// Now the start sees c appear, takes its claim back, and starts over from c.
#[test]
fn a_checkpoint_completed_between_a_starts_listing_and_its_claim_is_restored_not_fenced_regression_gap() {
    use cutline::{FaultPoint, Faults, Manifest, RestartStrategy};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const RECORDS: u64 = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let graph = {
        let job = Job::new("gap");
        job.source("numbers", GeneratorSource::new(RECORDS, |i| i % 7))
            .map(|k: u64| {
                std::thread::sleep(Duration::from_micros(20));
                k
            })
            .key_by(|k: &u64| *k)
            .aggregate("count", || 0u64, |c, _k| *c += 1, |k, c| format!("{k}:{c}"))
            .sink("out", MemoryTxnSink::new(out.clone()));
        job.build().unwrap()
    };
    // A first run stops (crashes) after a few committed checkpoints.
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir.path()).unwrap()), "gap-v1");
    cfg.checkpoint.interval_ms = Some(5);
    cfg.batch_size = 16;
    let commits = Arc::new(AtomicU64::new(0));
    let c2 = commits.clone();
    cfg.faults = Faults::new(move |p| p == FaultPoint::SinkCommit && c2.fetch_add(1, Ordering::SeqCst) + 1 == 4);
    cfg.restart = RestartStrategy::None;
    cutline::run(&graph, cfg).expect_err("the injected crash");
    // The "old coordinator": completes one more checkpoint (the same state as its latest) exactly when
    // the new start claims its generation, i.e. after the start listed the checkpoints.
    let old = LocalDirStore::open(dir.path()).unwrap();
    let latest = old.latest_complete().unwrap().expect("a complete checkpoint");
    let gap = cutline::CheckpointId(old.max_checkpoint_id_seen().unwrap().unwrap().0 + 1);
    let m = old.read_manifest(latest).unwrap();
    let late = Manifest::new("gap-v1", gap, m.generation, 0, false, m.tasks.clone());
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let store = cutline_storage::FaultyStore::new(LocalDirStore::open(dir.path()).unwrap(), move |op| {
        if matches!(op, cutline_storage::StoreOp::ClaimGeneration { .. }) && !d2.swap(true, Ordering::SeqCst) {
            old.commit_manifest(&late).unwrap();
        }
        false
    });
    let mut cfg = RunConfig::new(Arc::new(store), "gap-v1");
    cfg.checkpoint.interval_ms = Some(5);
    cfg.batch_size = 16;
    let report = cutline::run(&graph, cfg).expect("the second run finishes");
    assert!(done.load(Ordering::SeqCst), "the late commit happened");
    assert_eq!(report.restored_from, Some(gap), "the start must restore the checkpoint completed meanwhile");
    let mut got = out.lock().unwrap().committed_records();
    got.sort();
    let mut want = Vec::new();
    for k in 0..7u64 {
        let n = (0..RECORDS).filter(|i| i % 7 == k).count();
        want.extend((1..=n).map(|c| format!("{k}:{c}")));
    }
    want.sort();
    assert_eq!(got, want, "exactly the failure-free output");
}
