//! The Nexmark queries, written with cutline's public API only. Each takes the event stream (with
//! watermarks) and returns its results as [`Row`]s.
//!
//! A stream has one consumer, so joins of two event kinds (q3, q4, q6, q8) key the one event stream
//! by the join key of either kind instead of splitting it. Results that depend on an order (running
//! averages of q4 and q6) are computed in event-time order with timers, so that they do not depend
//! on how parallel inputs interleave.

use crate::model::{Auction, Bid, Event, Person};
use crate::Row;
use cutline::{EventTime, KeyedProcess, Output, Stream, Windows};
use serde::{Deserialize, Serialize};

/// Window length of q5 (sliding), q7 and q8 (tumbling).
pub const WINDOW_MS: u64 = 10_000;
/// Slide of q5's windows.
pub const SLIDE_MS: u64 = 2_000;
/// Inactivity that closes a q11 session.
pub const SESSION_GAP_MS: u64 = 10_000;
/// q2 keeps bids on auctions whose id is a multiple of this.
pub const Q2_MODULUS: u64 = 123;
/// q3 sellers live in one of these states.
pub const Q3_STATES: [&str; 3] = ["OR", "ID", "CA"];
/// q3 auctions are of this category.
pub const Q3_CATEGORY: u64 = 10;
/// q6 averages a seller's last this many winning prices.
pub const Q6_LAST: usize = 10;
/// Dollars to euros in q1, per mille.
pub const EURO_PER_MILLE: u64 = 908;
/// Partitions q7 computes partial maxima in before the global one.
pub const Q7_PARTITIONS: u64 = 64;
/// Window length of q12 (processing time).
pub const Q12_WINDOW_MS: u64 = 10_000;
/// How long after an unknown auction's bid its state is dropped (longer than any auction runs).
const STALE_BIDS_MS: u64 = 20_000;

fn bids(events: Stream<Event>) -> Stream<Bid> {
    events.flat_map(|e, out: &mut Vec<Bid>| {
        if let Event::Bid(b) = e {
            out.push(b)
        }
    })
}

fn bid_time(b: &Bid) -> EventTime {
    EventTime(b.date_time)
}

/// q0, pass-through: every bid.
pub fn q0(events: Stream<Event>) -> Stream<Row> {
    bids(events).map(Row::Bid)
}

/// q1, currency conversion: bid prices in euros.
pub fn q1(events: Stream<Event>) -> Stream<Row> {
    bids(events).map(|b| Row::Bid(Bid { price: b.price * EURO_PER_MILLE / 1000, ..b }))
}

/// q2, selection: bids on every 123rd auction.
pub fn q2(events: Stream<Event>) -> Stream<Row> {
    bids(events)
        .filter(|b| b.auction % Q2_MODULUS == 0)
        .map(|b| Row::AuctionPrice { auction: b.auction, price: b.price })
}

/// q3, local item suggestion: auctions of category 10 by sellers in Oregon, Idaho or California,
/// with the seller's name, city and state (an incremental join on person id; either side may come
/// first).
pub fn q3(events: Stream<Event>) -> Stream<Row> {
    events
        .filter(|e| match e {
            Event::Person(p) => Q3_STATES.contains(&p.state.as_str()),
            Event::Auction(a) => a.category == Q3_CATEGORY,
            Event::Bid(_) => false,
        })
        .key_by(|e: &Event| match e {
            Event::Person(p) => p.id,
            Event::Auction(a) => a.seller,
            Event::Bid(_) => unreachable!("filtered out"),
        })
        .process("q3-join", |_seller: &u64, state: &mut Option<(Option<Person>, Vec<u64>)>, e: Event, out| {
            let (person, waiting) = state.get_or_insert_with(|| (None, Vec::new()));
            match e {
                Event::Person(p) => {
                    for auction in waiting.drain(..) {
                        out.emit(Row::LocalItem {
                            name: p.name.clone(),
                            city: p.city.clone(),
                            state: p.state.clone(),
                            auction,
                        });
                    }
                    *person = Some(p);
                }
                Event::Auction(a) => match person {
                    Some(p) => out.emit(Row::LocalItem {
                        name: p.name.clone(),
                        city: p.city.clone(),
                        state: p.state.clone(),
                        auction: a.id,
                    }),
                    None => waiting.push(a.id),
                },
                Event::Bid(_) => {}
            }
        })
}

/// An auction's winning bid: the highest at or before its end that meets the reserve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Winner {
    pub auction: u64,
    pub seller: u64,
    pub category: u64,
    pub price: u64,
    pub expires: i64,
}

/// Per auction: the auction (once seen) and the best bid so far, or the bids that came before it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Bidding {
    auction: Option<Auction>,
    best: Option<u64>,
    early: Vec<(u64, i64)>,
}

struct Winners;

impl KeyedProcess<u64, Event, Winner> for Winners {
    type State = Bidding;
    fn process(&self, _id: &u64, state: &mut Option<Bidding>, e: Event, out: &mut Output<Winner>) {
        let s = state.get_or_insert_with(Bidding::default);
        match e {
            Event::Auction(a) => {
                let valid = s.early.drain(..).filter(|(_, t)| *t <= a.expires).map(|(p, _)| p);
                s.best = valid.chain(s.best).max();
                out.set_timer(EventTime(a.expires));
                s.auction = Some(a);
            }
            Event::Bid(b) => match &s.auction {
                Some(a) if b.date_time <= a.expires => s.best = s.best.max(Some(b.price)),
                Some(_) => {}
                None => {
                    s.early.push((b.price, b.date_time));
                    out.set_timer(EventTime(b.date_time).plus_ms(STALE_BIDS_MS));
                }
            },
            Event::Person(_) => {}
        }
    }
    fn on_timer(&self, _id: &u64, state: &mut Option<Bidding>, time: EventTime, out: &mut Output<Winner>) {
        let Some(s) = state.as_ref() else { return };
        match &s.auction {
            Some(a) if a.expires == time.0 => {
                if let Some(price) = s.best.filter(|p| *p >= a.reserve) {
                    out.emit(Winner {
                        auction: a.id,
                        seller: a.seller,
                        category: a.category,
                        price,
                        expires: a.expires,
                    });
                }
                *state = None;
            }
            Some(_) => {}
            // Bids on an auction never seen here (or already closed): drop them once stale.
            None if s.early.iter().all(|(_, t)| EventTime(*t).plus_ms(STALE_BIDS_MS) <= time) => *state = None,
            None => {}
        }
    }
}

fn winners(events: Stream<Event>) -> Stream<Winner> {
    events
        .filter(|e| !matches!(e, Event::Person(_)))
        .key_by(|e: &Event| match e {
            Event::Auction(a) => a.id,
            Event::Bid(b) => b.auction,
            Event::Person(_) => unreachable!("filtered out"),
        })
        .process_with("winners", Winners)
}

/// Running statistics over winners in event-time order (their end, then auction id): winners wait
/// in state for the watermark to pass their end, so every run folds them in the same order.
struct InOrder<F> {
    fold: F,
}

/// Per key: winners not yet folded, and the fold's state.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Ordered {
    waiting: Vec<Winner>,
    count: u64,
    sum: u64,
    last: std::collections::VecDeque<u64>,
}

impl<F: Fn(u64, &Ordered) -> Row + Send + Sync + 'static> KeyedProcess<u64, Winner, Row> for InOrder<F> {
    type State = Ordered;
    fn process(&self, _k: &u64, state: &mut Option<Ordered>, w: Winner, out: &mut Output<Row>) {
        out.set_timer(EventTime(w.expires));
        state.get_or_insert_with(Ordered::default).waiting.push(w);
    }
    fn on_timer(&self, k: &u64, state: &mut Option<Ordered>, time: EventTime, out: &mut Output<Row>) {
        let Some(s) = state.as_mut() else { return };
        let (mut due, rest): (Vec<Winner>, Vec<Winner>) =
            std::mem::take(&mut s.waiting).into_iter().partition(|w| w.expires == time.0);
        s.waiting = rest;
        due.sort_by_key(|w| w.auction);
        for w in due {
            s.count += 1;
            s.sum += w.price;
            s.last.push_back(w.price);
            if s.last.len() > Q6_LAST {
                s.last.pop_front();
            }
            out.emit((self.fold)(*k, s));
        }
    }
}

/// q4, average price per category: the running average of the winning prices of each category's
/// closed auctions.
pub fn q4(events: Stream<Event>) -> Stream<Row> {
    winners(events).key_by(|w: &Winner| w.category).process_with(
        "q4-average",
        InOrder {
            fold: |category, s: &Ordered| Row::CategoryAverage {
                category,
                auctions: s.count,
                average: s.sum / s.count,
            },
        },
    )
}

/// q6, average selling price by seller: the average of each seller's last 10 winning prices.
pub fn q6(events: Stream<Event>) -> Stream<Row> {
    winners(events).key_by(|w: &Winner| w.seller).process_with(
        "q6-average",
        InOrder {
            fold: |seller, s: &Ordered| Row::SellerAverage {
                seller,
                auctions: s.count,
                average: s.last.iter().sum::<u64>() / s.last.len() as u64,
            },
        },
    )
}

/// Per key of a second stage: the best candidates of one window, emitted when the watermark passes
/// the window (every first-stage result of the window arrived before that watermark). With
/// `ties` every candidate of the best score, else only the greatest row among them.
struct Best {
    ties: bool,
}

/// (window start, window max timestamp, candidates as (score, row)).
type Candidate = (i64, i64, u64, Row);

impl KeyedProcess<i64, Candidate, Row> for Best {
    type State = (u64, Vec<Row>);
    fn process(&self, _start: &i64, state: &mut Option<(u64, Vec<Row>)>, c: Candidate, out: &mut Output<Row>) {
        let (_, max_ts, score, row) = c;
        let s = state.get_or_insert_with(|| (0, Vec::new()));
        if s.1.is_empty() || score > s.0 {
            *s = (score, vec![row]);
        } else if score == s.0 {
            s.1.push(row);
        }
        out.set_timer(EventTime(max_ts));
    }
    fn on_timer(&self, _start: &i64, state: &mut Option<(u64, Vec<Row>)>, _t: EventTime, out: &mut Output<Row>) {
        if let Some((_, mut rows)) = state.take() {
            rows.sort();
            if !self.ties {
                rows.drain(..rows.len().saturating_sub(1));
            }
            for r in rows {
                out.emit(r);
            }
        }
    }
}

/// q5, hot items: per sliding window (10 s every 2 s), the auctions with the most bids.
pub fn q5(events: Stream<Event>) -> Stream<Row> {
    bids(events)
        .key_by(|b: &Bid| b.auction)
        .window(Windows::sliding_ms(WINDOW_MS, SLIDE_MS), bid_time)
        .aggregate(
            "q5-counts",
            || 0u64,
            |n, _b| *n += 1,
            |n, m| *n += m,
            |auction, w, n| {
                (
                    w.start.0,
                    w.max_timestamp().0,
                    *n,
                    Row::HotItem { window_start: w.start.0, auction: *auction, bids: *n },
                )
            },
        )
        .key_by(|c: &Candidate| c.0)
        .process_with("q5-hottest", Best { ties: true })
}

/// q7, highest bid: per tumbling 10 s window, the highest bid (of equal prices, that of the highest
/// auction id, then bidder), from partial maxima per partition of auctions.
pub fn q7(events: Stream<Event>) -> Stream<Row> {
    bids(events)
        .key_by(|b: &Bid| b.auction % Q7_PARTITIONS)
        .window(Windows::tumbling_ms(WINDOW_MS), bid_time)
        .aggregate(
            "q7-partial-max",
            || None::<(u64, u64, u64)>,
            |m, b| *m = (*m).max(Some((b.price, b.auction, b.bidder))),
            |m, o| *m = (*m).max(o),
            |_part, w, m| {
                let (price, auction, bidder) = m.expect("a window holds a bid");
                (
                    w.start.0,
                    w.max_timestamp().0,
                    price,
                    Row::HighestBid { window_start: w.start.0, auction, bidder, price },
                )
            },
        )
        .key_by(|c: &Candidate| c.0)
        .process_with("q7-max", Best { ties: false })
}

/// q8, monitor new users: people who created an auction in the same tumbling 10 s window in which
/// they registered.
pub fn q8(events: Stream<Event>) -> Stream<Row> {
    events
        .filter(|e| !matches!(e, Event::Bid(_)))
        .key_by(|e: &Event| match e {
            Event::Person(p) => p.id,
            Event::Auction(a) => a.seller,
            Event::Bid(_) => unreachable!("filtered out"),
        })
        .window(Windows::tumbling_ms(WINDOW_MS), |e: &Event| e.time())
        .aggregate(
            "q8-join",
            || (None::<String>, false),
            |acc, e| match e {
                Event::Person(p) => acc.0 = Some(p.name.clone()),
                _ => acc.1 = true,
            },
            |acc, other| {
                acc.0 = acc.0.take().or(other.0);
                acc.1 |= other.1;
            },
            |id, w, acc| match acc {
                (Some(name), true) => Some(Row::NewUser { id: *id, name: name.clone(), window_start: w.start.0 }),
                _ => None,
            },
        )
        .flat_map(|r: Option<Row>, out: &mut Vec<Row>| out.extend(r))
}

/// q11, user sessions: bids per bidder in sessions closed by 10 s without a bid.
pub fn q11(events: Stream<Event>) -> Stream<Row> {
    bids(events).key_by(|b: &Bid| b.bidder).window(Windows::session_ms(SESSION_GAP_MS), bid_time).aggregate(
        "q11-sessions",
        || 0u64,
        |n, _b| *n += 1,
        |n, m| *n += m,
        |bidder, w, n| Row::Session { bidder: *bidder, start: w.start.0, end: w.end.0, bids: *n },
    )
}

/// Per bidder: the processing-time window in progress (its start) and its bids so far.
struct ProcessingWindowCount {
    size_ms: u64,
}

impl KeyedProcess<u64, Bid, Row> for ProcessingWindowCount {
    type State = (u64, u64);
    fn process(&self, bidder: &u64, state: &mut Option<(u64, u64)>, _b: Bid, out: &mut Output<Row>) {
        let now = out.processing_time_ms();
        let start = now - now % self.size_ms;
        match state {
            Some((s, n)) if *s == start => *n += 1,
            _ => {
                // A window whose timer has not fired yet (it fires at the task's next step) closes here.
                if let Some((s, n)) = state.take() {
                    out.cancel_processing_timer(s + self.size_ms);
                    out.emit(Row::BidderWindow { bidder: *bidder, window_start: s, bids: n });
                }
                *state = Some((start, 1));
                out.set_processing_timer(start + self.size_ms);
            }
        }
    }
    fn on_processing_timer(&self, bidder: &u64, state: &mut Option<(u64, u64)>, _t: u64, out: &mut Output<Row>) {
        if let Some((s, n)) = state.take() {
            out.emit(Row::BidderWindow { bidder: *bidder, window_start: s, bids: n });
        }
    }
    fn end_of_input(&self, bidder: &u64, state: &mut Option<(u64, u64)>, out: &mut Output<Row>) {
        // Processing-time timers do not fire at the end of a bounded input: the open window ends here.
        self.on_processing_timer(bidder, state, 0, out);
    }
}

/// q12, bids per bidder in tumbling processing-time windows of 10 s.
pub fn q12(events: Stream<Event>) -> Stream<Row> {
    q12_windows_of(events, Q12_WINDOW_MS)
}

/// q12 with processing-time windows of `size_ms` (at least 1).
pub fn q12_windows_of(events: Stream<Event>, size_ms: u64) -> Stream<Row> {
    bids(events)
        .key_by(|b: &Bid| b.bidder)
        .process_with("q12-counts", ProcessingWindowCount { size_ms: size_ms.max(1) })
}
