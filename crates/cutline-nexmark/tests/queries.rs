//! Every Nexmark query run by the engine equals its batch reference: at parallelism 1 and 2, with
//! aligned and unaligned checkpoints, after a failure, and with batches so small that a watermark
//! makes more timers due than one step fires (so the rest fire at later steps, and the watermark
//! waits for them).

use cutline::{FaultPoint, Faults, Job, LocalDirStore, MemoryTxnSink, MemoryTxnStore, RestartStrategy, RunConfig};
use cutline_nexmark::model::Event;
use cutline_nexmark::{events, reference::reference, Query, Row};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Enough events for every query to have results: 60 s of event time.
const EVENTS: u64 = 600_000;

struct Case {
    parallelism: u32,
    unaligned: bool,
    /// Fail the n-th processed batch once.
    fail_at_batch: Option<u64>,
    /// Records per batch, and so timers fired per step.
    batch_size: usize,
}

fn run(q: Query, case: &Case) -> Vec<Row> {
    run_built(q, case, |events| q.build(events))
}

fn run_built(q: Query, case: &Case, build: impl FnOnce(cutline::Stream<Event>) -> cutline::Stream<Row>) -> Vec<Row> {
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new(format!("nexmark-{q}"));
    job.set_parallelism(case.parallelism);
    build(events(&job, EVENTS, case.parallelism))
        .map(|r| serde_json::to_string(&r).expect("a row encodes"))
        .sink_with_parallelism("out", 1, MemoryTxnSink::new(out.clone()));
    let graph = job.build().expect("valid job");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir.path()).unwrap()), "nexmark-v1");
    cfg.checkpoint.interval_ms = Some(20);
    cfg.checkpoint.unaligned = case.unaligned;
    cfg.batch_size = case.batch_size;
    if let Some(n) = case.fail_at_batch {
        let count = Arc::new(AtomicU64::new(0));
        cfg.faults =
            Faults::new(move |p| p == FaultPoint::ProcessBatch && count.fetch_add(1, Ordering::SeqCst) + 1 == n);
        cfg.restart = RestartStrategy::FixedDelay { delay_ms: 1, max_attempts: 3 };
    }
    let report = cutline::run(&graph, cfg).unwrap_or_else(|e| panic!("{q}: {e}"));
    if case.fail_at_batch.is_some() {
        assert!(report.restarts >= 1, "{q}: the failure was never injected");
    }
    let rows = out.lock().unwrap().committed_records();
    rows.iter().map(|r| serde_json::from_str(r).expect("a row decodes")).collect()
}

fn check(q: Query, cases: &[Case]) {
    let want = reference(q, EVENTS);
    assert!(!want.is_empty(), "{q}: the reference has no rows: the test proves nothing");
    for case in cases {
        let what = format!(
            "{q} at parallelism {}, unaligned {}, failure {:?}, batches of {}",
            case.parallelism, case.unaligned, case.fail_at_batch, case.batch_size
        );
        let got = q.normalize(run(q, case)).unwrap_or_else(|e| panic!("{what}: {e}"));
        if got != want {
            let missing: Vec<&Row> = want.iter().filter(|r| got.binary_search(r).is_err()).take(5).collect();
            let extra: Vec<&Row> = got.iter().filter(|r| want.binary_search(r).is_err()).take(5).collect();
            panic!(
                "{what}: {} rows, expected {}; missing e.g. {missing:?}; unexpected e.g. {extra:?}",
                got.len(),
                want.len()
            );
        }
    }
}

fn all_cases() -> Vec<Case> {
    vec![
        Case { parallelism: 1, unaligned: false, fail_at_batch: None, batch_size: 1024 },
        Case { parallelism: 2, unaligned: true, fail_at_batch: Some(40), batch_size: 1024 },
        Case { parallelism: 2, unaligned: false, fail_at_batch: Some(300), batch_size: 7 },
    ]
}

macro_rules! query_tests {
    ($($name:ident: $q:expr,)*) => {$(
        #[test]
        fn $name() {
            check($q, &all_cases());
        }
    )*};
}

query_tests! {
    q0_pass_through: Query::Q0,
    q1_currency_conversion: Query::Q1,
    q2_selection: Query::Q2,
    q3_local_item_suggestion: Query::Q3,
    q4_average_price_per_category: Query::Q4,
    q5_hot_items: Query::Q5,
    q6_average_selling_price_by_seller: Query::Q6,
    q7_highest_bid: Query::Q7,
    q8_monitor_new_users: Query::Q8,
    q11_user_sessions: Query::Q11,
    q12_processing_time_windows: Query::Q12,
}

/// q12 with windows of 20 ms, so that a run has many and a failure falls between their timers:
/// no window is reported twice, and the bids per bidder are the reference's.
#[test]
fn q12_with_short_windows_fires_its_processing_time_timers_once_across_a_failure() {
    let want = reference(Query::Q12, EVENTS);
    for case in [
        Case { parallelism: 1, unaligned: false, fail_at_batch: None, batch_size: 1024 },
        Case { parallelism: 2, unaligned: true, fail_at_batch: Some(200), batch_size: 64 },
    ] {
        // Paced to take about 300 ms however fast the machine, so that it spans many windows.
        let paced = |e: cutline::Stream<Event>| {
            e.map(|ev: Event| {
                if let Event::Bid(b) = &ev {
                    if b.date_time % 200 == 0 {
                        std::thread::sleep(std::time::Duration::from_micros(100));
                    }
                }
                ev
            })
        };
        let rows = run_built(Query::Q12, &case, |e| cutline_nexmark::queries::q12_windows_of(paced(e), 20));
        let starts: std::collections::BTreeSet<u64> = rows
            .iter()
            .map(|r| match r {
                Row::BidderWindow { window_start, .. } => *window_start,
                _ => 0,
            })
            .collect();
        let got = Query::Q12.normalize(rows).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, want, "bids per bidder, failure {:?}", case.fail_at_batch);
        assert!(starts.len() >= 3, "windows from {starts:?} only: the run was too short to prove much");
    }
}

#[test]
fn query_names_parse_and_unknown_ones_are_refused_with_the_list() {
    for q in Query::ALL {
        assert_eq!(q.to_string().parse::<Query>(), Ok(q));
    }
    let e = "q9".parse::<Query>().unwrap_err();
    assert!(e.contains("q12") && e.contains("not implemented"), "{e}");
}
