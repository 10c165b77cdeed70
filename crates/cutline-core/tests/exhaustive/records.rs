//! Records, messages, multisets.

use super::*;

/// A record: the `seq`-th (from 1) of source `source`. Printed `a1`, `b2`, ...
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Rec {
    pub(crate) source: u8,
    pub(crate) seq: u8,
}

impl fmt::Debug for Rec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", source_name(self.source as usize), self.seq)
    }
}

pub(crate) fn source_name(s: usize) -> &'static str {
    ["a", "b"][s]
}

/// The first `n` records of source `s`, in order.
pub(crate) fn records_of(s: usize, n: u8) -> Vec<Rec> {
    (1..=n).map(|seq| Rec { source: s as u8, seq }).collect()
}

/// Every record of the failure-free run, sorted.
pub(crate) fn all_records() -> Vec<Rec> {
    (0..SOURCES).flat_map(|s| records_of(s, RECORDS_PER_SOURCE)).collect()
}

/// Add to a multiset kept as a sorted `Vec`.
pub(crate) fn insert_sorted(set: &mut Vec<Rec>, r: Rec) {
    let at = set.partition_point(|x| *x <= r);
    set.insert(at, r);
}

pub(crate) fn sorted(mut v: Vec<Rec>) -> Vec<Rec> {
    v.sort();
    v
}

/// A barrier with the `Hash` the fingerprint needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct B(pub(crate) Barrier);

impl Hash for B {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let b = &self.0;
        (b.checkpoint, b.generation, b.triggered_at, b.kind, b.mode, b.alignment).hash(h);
    }
}

/// What travels on a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Msg {
    Data(Rec),
    Barrier(B),
    End,
}

/// The first barrier queued on a channel, and how many records are queued before it.
pub(crate) fn first_barrier(queue: &VecDeque<Msg>) -> Option<(usize, Barrier)> {
    for (k, m) in queue.iter().enumerate() {
        match m {
            Msg::Data(_) => {}
            Msg::Barrier(b) => return Some((k, b.0)),
            Msg::End => return None,
        }
    }
    None
}

pub(crate) fn data(queue: &VecDeque<Msg>, upto: usize) -> Vec<Rec> {
    queue
        .iter()
        .take(upto)
        .map(|m| match m {
            Msg::Data(r) => *r,
            other => panic!("model bug: {other:?} queued before the first barrier"),
        })
        .collect()
}

/// Collects what is hashed and hashes it in one go at the end (SipHash, as `DefaultHasher`): many small
/// writes cost less as one long one.
pub(crate) struct Fingerprinter(pub(crate) Vec<u8>);

impl Default for Fingerprinter {
    fn default() -> Self {
        Fingerprinter(Vec::with_capacity(FINGERPRINT_BUFFER))
    }
}

impl Hasher for Fingerprinter {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn finish(&self) -> u64 {
        let mut h = DefaultHasher::new();
        h.write(&self.0);
        h.finish()
    }
}

/// Bytes reserved for a state's fingerprint (most states are smaller).
pub(crate) const FINGERPRINT_BUFFER: usize = 2048;

/// For maps keyed by fingerprints, which are hashes already.
#[derive(Default)]
pub(crate) struct Prehashed(pub(crate) u64);

impl Hasher for Prehashed {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(5) ^ n;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type FingerprintMap<K, V> = HashMap<K, V, BuildHasherDefault<Prehashed>>;
pub(crate) type FingerprintSet = HashSet<u64, BuildHasherDefault<Prehashed>>;

pub(crate) fn fingerprint_debug(x: &impl fmt::Debug) -> u64 {
    let mut h = DefaultHasher::new();
    format!("{x:?}").hash(&mut h);
    h.finish()
}

/// `debug` with the number of every `{field}TimeMs(n)` blanked out: for times kept only for statistics.
pub(crate) fn blank_times(debug: &str, field: &str) -> String {
    let pattern = format!("{field}TimeMs(");
    let mut out = String::with_capacity(debug.len());
    let mut rest = debug;
    while let Some(at) = rest.find(&pattern) {
        out.push_str(&rest[..at + pattern.len()]);
        rest = rest[at + pattern.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}
