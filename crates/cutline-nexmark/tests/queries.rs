//! Every Nexmark query run by the engine equals its batch reference: at parallelism 1 and 2, with
//! aligned and unaligned checkpoints, and after a failure.

use cutline::{FaultPoint, Faults, Job, LocalDirStore, MemoryTxnSink, MemoryTxnStore, RestartStrategy, RunConfig};
use cutline_nexmark::{events, reference::reference, Query};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Enough events for every query to have results: 60 s of event time.
const EVENTS: u64 = 600_000;

struct Case {
    parallelism: u32,
    unaligned: bool,
    /// Fail the n-th processed batch once.
    fail_at_batch: Option<u64>,
}

fn run(q: Query, case: &Case) -> Vec<String> {
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new(format!("nexmark-{q}"));
    job.set_parallelism(case.parallelism);
    q.build(events(&job, EVENTS, case.parallelism)).sink_with_parallelism("out", 1, MemoryTxnSink::new(out.clone()));
    let graph = job.build().expect("valid job");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir.path()).unwrap()), "nexmark-v1");
    cfg.checkpoint.interval_ms = Some(20);
    cfg.checkpoint.unaligned = case.unaligned;
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
    let mut rows = out.lock().unwrap().committed_records();
    rows.sort();
    rows
}

fn check(q: Query, cases: &[Case]) {
    let mut want: Vec<String> = reference(q, EVENTS).iter().map(|r| r.to_string()).collect();
    want.sort();
    assert!(!want.is_empty(), "{q}: the reference has no rows: the test proves nothing");
    for case in cases {
        let got = run(q, case);
        let what = format!(
            "{q} at parallelism {}, unaligned {}, failure {:?}",
            case.parallelism, case.unaligned, case.fail_at_batch
        );
        if got != want {
            let missing: Vec<&String> = want.iter().filter(|r| got.binary_search(r).is_err()).take(5).collect();
            let extra: Vec<&String> = got.iter().filter(|r| want.binary_search(r).is_err()).take(5).collect();
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
        Case { parallelism: 1, unaligned: false, fail_at_batch: None },
        Case { parallelism: 2, unaligned: true, fail_at_batch: Some(40) },
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
}

#[test]
fn query_names_parse_and_unknown_ones_are_refused_with_the_list() {
    for q in Query::ALL {
        assert_eq!(q.to_string().parse::<Query>(), Ok(q));
    }
    let e = "q12".parse::<Query>().unwrap_err();
    assert!(e.contains("q11") && e.contains("not implemented"), "{e}");
}
