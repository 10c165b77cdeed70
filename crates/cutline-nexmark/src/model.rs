//! The Nexmark data model (people, auctions and bids of an online auction site) and its
//! deterministic generator: event `n` is a pure function of `n`, so a source can be split by event
//! number across subtasks and replayed exactly after a restore.
//!
//! Proportions as in the Nexmark specification: of every 50 events, 1 person, 3 auctions and 46
//! bids. Event time advances by [`EVENT_SPACING_US`] per event. Bids go to recent auctions (half of
//! them to a few hot ones) from recent people.

use cutline::{splitmix64, EventTime};
use serde::{Deserialize, Serialize};

/// Ids of the first person and the first auction.
pub const FIRST_PERSON_ID: u64 = 1000;
/// Id of the first auction.
pub const FIRST_AUCTION_ID: u64 = 1000;
/// Id of the first category (there are [`CATEGORIES`]).
pub const FIRST_CATEGORY_ID: u64 = 10;
/// Number of categories.
pub const CATEGORIES: u64 = 5;
/// Event time between two consecutive events: 100 µs (10,000 events per second of event time).
pub const EVENT_SPACING_US: u64 = 100;
/// Bids and auctions refer to one of this many most recent people or auctions.
pub const RECENT: u64 = 1000;
/// US states people live in; queries 3 select some of them.
pub const STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const CITIES: [&str; 6] = ["Phoenix", "Los Angeles", "Boise", "Portland", "Seattle", "Cheyenne"];

/// A new user of the site.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Person {
    pub id: u64,
    pub name: String,
    pub city: String,
    pub state: String,
    pub date_time: i64,
}

/// A new auction.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Auction {
    pub id: u64,
    pub item_name: String,
    pub initial_bid: u64,
    pub reserve: u64,
    pub date_time: i64,
    /// When the auction closes (event time, ms).
    pub expires: i64,
    /// The person selling.
    pub seller: u64,
    pub category: u64,
}

/// A bid on an auction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Bid {
    pub auction: u64,
    pub bidder: u64,
    /// In cents.
    pub price: u64,
    /// Which of 4 channels the bid came through.
    pub channel: u8,
    pub date_time: i64,
}

/// One Nexmark event.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Event {
    Person(Person),
    Auction(Auction),
    Bid(Bid),
}

impl Event {
    /// Its event time (ms).
    pub fn time(&self) -> EventTime {
        EventTime(match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        })
    }
}

/// Event time of event `n` (ms).
pub fn time_of(n: u64) -> i64 {
    (n * EVENT_SPACING_US / 1000) as i64
}

/// People created before event `n` (at least 1: the first event is a person).
fn people_before(n: u64) -> u64 {
    n / 50 + 1
}

/// Auctions created up to event `n`.
fn auctions_before(n: u64) -> u64 {
    let epoch = n / 50;
    let offset = (n % 50).min(4);
    (epoch * 3 + offset.saturating_sub(1)).max(1)
}

/// Event number `n`.
pub fn event(n: u64) -> Event {
    let h = splitmix64(n);
    let date_time = time_of(n);
    let epoch = n / 50;
    match n % 50 {
        0 => {
            let id = FIRST_PERSON_ID + epoch;
            let at = (h % STATES.len() as u64) as usize;
            Event::Person(Person {
                id,
                name: format!("person-{id}"),
                city: CITIES[at].to_string(),
                state: STATES[at].to_string(),
                date_time,
            })
        }
        o @ 1..=3 => {
            let id = FIRST_AUCTION_ID + epoch * 3 + (o - 1);
            let initial_bid = 100 + h % 1000;
            let recent = people_before(n).min(RECENT);
            Event::Auction(Auction {
                id,
                item_name: format!("item-{id}"),
                initial_bid,
                reserve: initial_bid + (h >> 16) % 2000,
                date_time,
                expires: date_time + 2_000 + ((h >> 32) % 8_000) as i64,
                seller: FIRST_PERSON_ID + people_before(n) - 1 - (h >> 8) % recent,
                category: FIRST_CATEGORY_ID + (h >> 24) % CATEGORIES,
            })
        }
        _ => {
            let auctions = auctions_before(n);
            // Half the bids go to one of the hot auctions (every 100th), the others to a recent one.
            let back = if h.is_multiple_of(2) { ((h >> 1) % 4) * 100 + auctions % 100 } else { (h >> 1) % RECENT };
            let auction = FIRST_AUCTION_ID + auctions - 1 - back.min(auctions - 1);
            let people = people_before(n);
            let bidder = FIRST_PERSON_ID + people - 1 - (h >> 20) % people.min(RECENT);
            let price = 100 + (h >> 30) % 100_000;
            Event::Bid(Bid { auction, bidder, price, channel: (h >> 60) as u8 % 4, date_time })
        }
    }
}
