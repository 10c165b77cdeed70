//! The Nexmark benchmark on cutline: the deterministic event generator ([`model`]), the queries
//! q0-q8, q11 and q12 written with cutline's public API ([`queries`]), and a straightforward batch
//! computation of each ([`reference`](mod@reference)) that the tests and `cutline bench nexmark` compare the
//! engine's output with.
//!
//! q12 counts in processing-time windows, so which window a bid lands in depends on when it was
//! processed: its output is compared with the reference as bids per bidder ([`Query::normalize`]).

pub mod model;
pub mod queries;
pub mod reference;

use cutline::{GeneratorSource, Job, Stream, WatermarkStrategy};
use model::{Bid, Event};
use serde::{Deserialize, Serialize};

/// One result row of any query.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Row {
    /// q0, q1: a bid (q1: its price in euros).
    Bid(Bid),
    /// q2.
    AuctionPrice { auction: u64, price: u64 },
    /// q3.
    LocalItem { name: String, city: String, state: String, auction: u64 },
    /// q4: after `auctions` closed auctions of the category, their average winning price.
    CategoryAverage { category: u64, auctions: u64, average: u64 },
    /// q5.
    HotItem { window_start: i64, auction: u64, bids: u64 },
    /// q6: after `auctions` won auctions of the seller, the average of the last 10 prices.
    SellerAverage { seller: u64, auctions: u64, average: u64 },
    /// q7.
    HighestBid { window_start: i64, auction: u64, bidder: u64, price: u64 },
    /// q8.
    NewUser { id: u64, name: String, window_start: i64 },
    /// q11.
    Session { bidder: u64, start: i64, end: i64, bids: u64 },
    /// q12: bids of a bidder in the processing-time window from `window_start` (milliseconds since
    /// the Unix epoch; 0 in the normalized form: all windows).
    BidderWindow { bidder: u64, window_start: u64, bids: u64 },
}

impl Row {
    /// What the row counts for in a check of a query's output by totals: its bids for q12 (whose
    /// rows depend on timing, their sum does not), else 1.
    pub fn weight(&self) -> u64 {
        match self {
            Row::BidderWindow { bids, .. } => *bids,
            _ => 1,
        }
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// A Nexmark query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Query {
    Q0,
    Q1,
    Q2,
    Q3,
    Q4,
    Q5,
    Q6,
    Q7,
    Q8,
    Q11,
    Q12,
}

impl Query {
    /// Every query implemented.
    pub const ALL: [Query; 11] = [
        Query::Q0,
        Query::Q1,
        Query::Q2,
        Query::Q3,
        Query::Q4,
        Query::Q5,
        Query::Q6,
        Query::Q7,
        Query::Q8,
        Query::Q11,
        Query::Q12,
    ];

    /// The query's rows in the form its reference gives them, sorted: as they are, except q12's,
    /// which become one row per bidder with its bids over all windows. A q12 window reported twice
    /// for one bidder is an error (its bids would be counted twice if the sums happened to match).
    pub fn normalize(self, mut rows: Vec<Row>) -> Result<Vec<Row>, String> {
        if self == Query::Q12 {
            let mut seen = std::collections::HashSet::new();
            let mut per: std::collections::BTreeMap<u64, u64> = Default::default();
            for r in &rows {
                let Row::BidderWindow { bidder, window_start, bids } = r else {
                    return Err(format!("q12 gave a row of another query: {r}"));
                };
                if !seen.insert((*bidder, *window_start)) {
                    return Err(format!("q12 reported the window from {window_start} of bidder {bidder} twice"));
                }
                *per.entry(*bidder).or_default() += bids;
            }
            rows = per.into_iter().map(|(bidder, bids)| Row::BidderWindow { bidder, window_start: 0, bids }).collect();
        }
        rows.sort();
        Ok(rows)
    }

    /// The query over `events`.
    pub fn build(self, events: Stream<Event>) -> Stream<Row> {
        match self {
            Query::Q0 => queries::q0(events),
            Query::Q1 => queries::q1(events),
            Query::Q2 => queries::q2(events),
            Query::Q3 => queries::q3(events),
            Query::Q4 => queries::q4(events),
            Query::Q5 => queries::q5(events),
            Query::Q6 => queries::q6(events),
            Query::Q7 => queries::q7(events),
            Query::Q8 => queries::q8(events),
            Query::Q11 => queries::q11(events),
            Query::Q12 => queries::q12(events),
        }
    }
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", format!("{self:?}").to_lowercase())
    }
}

impl std::str::FromStr for Query {
    type Err = String;
    fn from_str(s: &str) -> Result<Query, String> {
        Query::ALL.into_iter().find(|q| q.to_string() == s.to_lowercase()).ok_or_else(|| {
            let all: Vec<String> = Query::ALL.iter().map(|q| q.to_string()).collect();
            format!("unknown query {s:?}: one of {} (q9 and q10 are not implemented)", all.join(", "))
        })
    }
}

/// Watermarks of the generated events: they are in event-time order in every source subtask, so a
/// bound of 0 makes none late.
pub const OUT_OF_ORDERNESS_MS: u64 = 0;

/// The first `events` Nexmark events as a source of `parallelism` subtasks (event `n` in subtask
/// `n % parallelism`), with watermarks.
pub fn events(job: &Job, events: u64, parallelism: u32) -> Stream<Event> {
    job.source_with_parallelism("nexmark", parallelism, GeneratorSource::new(events, model::event))
        .with_watermarks("nexmark-wm", WatermarkStrategy::bounded_out_of_orderness(OUT_OF_ORDERNESS_MS, Event::time))
}

/// A sink that counts the rows it commits, by [`Row::weight`] (exactly once: a checkpoint's count is added when the
/// checkpoint completes), for benchmarks.
#[derive(Clone, Default)]
pub struct CountSink {
    committed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pending: u64,
}

impl CountSink {
    /// A sink adding what it commits to `committed`.
    pub fn new(committed: std::sync::Arc<std::sync::atomic::AtomicU64>) -> CountSink {
        CountSink { committed, pending: 0 }
    }
}

impl cutline::Sink<Row> for CountSink {
    type Committable = u64;
    fn open(&mut self, _ctx: &cutline::SinkContext) -> cutline::ConnectorResult<()> {
        Ok(())
    }
    fn recover(&mut self, to_commit: &[u64]) -> cutline::ConnectorResult<()> {
        self.commit(to_commit)
    }
    #[inline]
    fn write(&mut self, row: Row) -> cutline::ConnectorResult<()> {
        self.pending += std::hint::black_box(row).weight();
        Ok(())
    }
    fn prepare(&mut self, _checkpoint: cutline::CheckpointId) -> cutline::ConnectorResult<Option<u64>> {
        Ok(Some(std::mem::take(&mut self.pending)))
    }
    fn commit(&mut self, counts: &[u64]) -> cutline::ConnectorResult<()> {
        self.committed.fetch_add(counts.iter().sum(), std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}
