//! Each query computed directly over the whole list of events: loops and maps, none of cutline's
//! operators, windows or timers. What the engine commits must equal it (as a sorted list).

use crate::model::{event, Bid, Event, Person};
use crate::queries::{
    EURO_PER_MILLE, Q2_MODULUS, Q3_CATEGORY, Q3_STATES, Q6_LAST, SESSION_GAP_MS, SLIDE_MS, WINDOW_MS,
};
use crate::{Query, Row};
use std::collections::{BTreeMap, HashMap};

/// The rows `query` gives over the first `events` events, sorted.
pub fn reference(query: Query, events: u64) -> Vec<Row> {
    // The events are generated again for each pass instead of kept (a benchmark's hundreds of
    // millions would not fit in memory); `event` is cheap and deterministic.
    let all = || (0..events).map(event);
    let bids = || all().filter_map(|e| if let Event::Bid(b) = e { Some(b) } else { None });
    let people = || all().filter_map(|e| if let Event::Person(p) = e { Some(p) } else { None });
    let auctions = || all().filter_map(|e| if let Event::Auction(a) = e { Some(a) } else { None });
    let mut rows: Vec<Row> = match query {
        Query::Q0 => bids().map(Row::Bid).collect(),
        Query::Q1 => bids().map(|b| Row::Bid(Bid { price: b.price * EURO_PER_MILLE / 1000, ..b })).collect(),
        Query::Q2 => bids()
            .filter(|b| b.auction % Q2_MODULUS == 0)
            .map(|b| Row::AuctionPrice { auction: b.auction, price: b.price })
            .collect(),
        Query::Q3 => {
            let sellers: HashMap<u64, Person> =
                people().filter(|p| Q3_STATES.contains(&p.state.as_str())).map(|p| (p.id, p)).collect();
            auctions()
                .filter(|a| a.category == Q3_CATEGORY)
                .filter_map(|a| sellers.get(&a.seller).map(|p| (a, p)))
                .map(|(a, p)| Row::LocalItem {
                    name: p.name.clone(),
                    city: p.city.clone(),
                    state: p.state.clone(),
                    auction: a.id,
                })
                .collect()
        }
        Query::Q4 | Query::Q6 => {
            let mut winners = winners(
                auctions().map(|a| {
                    (a.id, Sale { seller: a.seller, category: a.category, reserve: a.reserve, expires: a.expires })
                }),
                bids(),
            );
            winners.sort_by_key(|(id, a, _)| (a.expires, *id));
            let mut per: BTreeMap<u64, (u64, u64, Vec<u64>)> = BTreeMap::new();
            let mut rows = Vec::new();
            for (_, a, price) in winners {
                let key = if query == Query::Q4 { a.category } else { a.seller };
                let (count, sum, last) = per.entry(key).or_default();
                *count += 1;
                *sum += price;
                last.push(price);
                let recent = &last[last.len().saturating_sub(Q6_LAST)..];
                rows.push(match query {
                    Query::Q4 => Row::CategoryAverage { category: key, auctions: *count, average: *sum / *count },
                    _ => Row::SellerAverage {
                        seller: key,
                        auctions: *count,
                        average: recent.iter().sum::<u64>() / recent.len() as u64,
                    },
                });
            }
            rows
        }
        Query::Q5 => {
            let mut counts: BTreeMap<(i64, u64), u64> = BTreeMap::new();
            for b in bids() {
                let mut start = b.date_time - b.date_time.rem_euclid(SLIDE_MS as i64);
                while start > b.date_time - WINDOW_MS as i64 {
                    *counts.entry((start, b.auction)).or_default() += 1;
                    start -= SLIDE_MS as i64;
                }
            }
            let mut best: BTreeMap<i64, (u64, Vec<u64>)> = BTreeMap::new();
            for ((start, auction), n) in counts {
                let e = best.entry(start).or_insert((0, Vec::new()));
                if n > e.0 {
                    *e = (n, vec![auction]);
                } else if n == e.0 {
                    e.1.push(auction);
                }
            }
            best.into_iter()
                .flat_map(|(start, (n, auctions))| {
                    auctions.into_iter().map(move |auction| Row::HotItem { window_start: start, auction, bids: n })
                })
                .collect()
        }
        Query::Q7 => {
            let mut best: BTreeMap<i64, (u64, u64, u64)> = BTreeMap::new();
            for b in bids() {
                let start = b.date_time - b.date_time.rem_euclid(WINDOW_MS as i64);
                let e = best.entry(start).or_insert((0, 0, 0));
                *e = (*e).max((b.price, b.auction, b.bidder));
            }
            best.into_iter()
                .map(|(window_start, (price, auction, bidder))| Row::HighestBid {
                    window_start,
                    auction,
                    bidder,
                    price,
                })
                .collect()
        }
        Query::Q8 => {
            let window = |t: i64| t - t.rem_euclid(WINDOW_MS as i64);
            let sold: std::collections::HashSet<(u64, i64)> =
                auctions().map(|a| (a.seller, window(a.date_time))).collect();
            people()
                .filter(|p| sold.contains(&(p.id, window(p.date_time))))
                .map(|p| Row::NewUser { id: p.id, name: p.name.clone(), window_start: window(p.date_time) })
                .collect()
        }
        Query::Q12 => {
            // Processing-time windows: which window a bid is in depends on when it was processed,
            // so the reference is what every run has in common, the bids per bidder.
            let mut per: BTreeMap<u64, u64> = BTreeMap::new();
            for b in bids() {
                *per.entry(b.bidder).or_default() += 1;
            }
            per.into_iter().map(|(bidder, bids)| Row::BidderWindow { bidder, window_start: 0, bids }).collect()
        }
        Query::Q11 => {
            let mut times: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
            for b in bids() {
                times.entry(b.bidder).or_default().push(b.date_time);
            }
            let gap = SESSION_GAP_MS as i64;
            let mut rows = Vec::new();
            for (bidder, mut ts) in times {
                ts.sort();
                let (mut start, mut last, mut n) = (ts[0], ts[0], 0);
                for t in ts {
                    // Two bids are in one session when the second comes at most the gap after the first.
                    if t > last + gap {
                        rows.push(Row::Session { bidder, start, end: last + gap, bids: n });
                        (start, n) = (t, 0);
                    }
                    last = t;
                    n += 1;
                }
                rows.push(Row::Session { bidder, start, end: last + gap, bids: n });
            }
            rows
        }
    };
    rows.sort();
    rows
}

/// What deciding an auction's winner needs of it.
struct Sale {
    seller: u64,
    category: u64,
    reserve: u64,
    expires: i64,
}

/// Every auction with a winning price: the highest bid at or before its end, if it meets the reserve.
fn winners(auctions: impl Iterator<Item = (u64, Sale)>, bids: impl Iterator<Item = Bid>) -> Vec<(u64, Sale, u64)> {
    let auctions: HashMap<u64, Sale> = auctions.collect();
    let mut best: HashMap<u64, u64> = HashMap::new();
    for b in bids {
        if let Some(a) = auctions.get(&b.auction) {
            if b.date_time <= a.expires {
                let e = best.entry(b.auction).or_default();
                *e = (*e).max(b.price);
            }
        }
    }
    let mut v: Vec<(u64, Sale, u64)> = auctions
        .into_iter()
        .filter_map(|(id, a)| best.get(&id).copied().filter(|p| *p >= a.reserve).map(|p| (id, a, p)))
        .collect();
    v.sort_by_key(|(id, _, _)| *id);
    v
}
