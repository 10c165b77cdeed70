//! What the keyed benchmark really did: [`TallySink`], the benchmark's sink, counts the updates it
//! receives and keeps the latest `(count, sum)` of every key, that is the keyed state as the sink saw
//! it; [`read_tallies`] and [`BenchTally::check`] compare that with the events the run was asked for,
//! so that `cutline bench` never prints a rate for work that was not done.
//!
//! The tally is committed like output: each checkpoint's transaction carries the subtask's running
//! totals, and its commit writes them to `tally-<subtask>-<checkpoint>` in the tally directory (a
//! small file per subtask and checkpoint, the previous one removed). So a worker process of a cluster
//! reports through the file system, and after a restore the counts go on from the restored
//! checkpoint, exactly once. The per-key table is not in the checkpoint: after a restore the state
//! totals are no longer known, and the tally says so (`state_complete: false`).
//!
//! Per record the sink adds one, stores the update into its table and moves the table's totals by
//! the difference, no atomics, no locks; a checkpoint reads the totals (no pass over the table: that
//! would put work growing with the keys into the synchronous phase the benchmark measures).

use cutline::{CheckpointId, Sink, SinkContext};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Keys the tally keeps the latest value of: `(count, sum)`, 16 bytes per key in every sink subtask.
pub const BENCH_MAX_KEYS: u64 = 1 << 27;

/// A sink subtask's totals as of a checkpoint (its committable).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub subtask: u32,
    pub checkpoint: u64,
    /// Updates received, from the start of the job.
    pub records: u64,
    /// Sum over keys of the latest count, and of the latest sum.
    pub state_count: u64,
    pub state_sum: u64,
    /// False once the subtask was restored: its per-key table started over, so the state totals
    /// above are not known.
    pub state_complete: bool,
}

/// The benchmark's sink for `(key, count, sum)` updates with keys in `0..keys`. See the module docs.
pub struct TallySink {
    dir: PathBuf,
    keys: u64,
    subtask: u32,
    incarnation: u64,
    records: u64,
    /// Restored from a checkpoint: the table below started over, the state totals are unknown.
    restored: bool,
    /// The latest `(count, sum)` per key; allocated (zeroed lazily by the allocator) at open.
    latest: Vec<(u64, u64)>,
    /// The sums over `latest` of counts and of sums, kept as updates arrive (a pass over the table
    /// at each checkpoint would make the benchmark's synchronous phase grow with its keys).
    totals: (u64, u64),
    /// The checkpoint of the tally file last written.
    written: Option<u64>,
}

impl TallySink {
    /// A sink reporting into `dir` (created if missing) for keys in `0..keys`.
    pub fn new(dir: &Path, keys: u64) -> TallySink {
        TallySink {
            dir: dir.to_path_buf(),
            keys,
            subtask: 0,
            incarnation: 0,
            records: 0,
            restored: false,
            latest: Vec::new(),
            totals: (0, 0),
            written: None,
        }
    }

    fn file(&self, checkpoint: u64) -> PathBuf {
        self.dir.join(format!("tally-{:05}-{checkpoint:020}", self.subtask))
    }
}

impl Clone for TallySink {
    /// A fresh, unopened sink into the same directory.
    fn clone(&self) -> Self {
        TallySink::new(&self.dir, self.keys)
    }
}

impl Sink<(u64, u64, u64)> for TallySink {
    type Committable = Tally;

    fn open(&mut self, ctx: &SinkContext) -> cutline::ConnectorResult<()> {
        if self.keys > BENCH_MAX_KEYS {
            return Err(format!("the tally keeps at most {BENCH_MAX_KEYS} keys, not {}", self.keys).into());
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("tally directory {}: {e}", self.dir.display()))?;
        (self.subtask, self.incarnation) = (ctx.subtask, ctx.incarnation);
        self.latest = vec![(0, 0); self.keys as usize];
        Ok(())
    }

    fn recover(&mut self, to_commit: &[Tally]) -> cutline::ConnectorResult<()> {
        self.commit(to_commit)?;
        if let Some(t) = to_commit.iter().max_by_key(|t| t.checkpoint) {
            (self.records, self.restored) = (t.records, true);
        }
        Ok(())
    }

    #[inline]
    fn write(&mut self, (key, count, sum): (u64, u64, u64)) -> cutline::ConnectorResult<()> {
        self.records += 1;
        // A key's updates come from one aggregate subtask, in order: the last one is the latest.
        match self.latest.get_mut(key as usize) {
            Some(slot) => {
                let (c, s) = std::mem::replace(slot, (count, sum));
                self.totals.0 = self.totals.0.wrapping_add(count.wrapping_sub(c));
                self.totals.1 = self.totals.1.wrapping_add(sum.wrapping_sub(s));
                Ok(())
            }
            None => Err(out_of_range(key, self.keys).into()),
        }
    }

    fn prepare(&mut self, checkpoint: CheckpointId) -> cutline::ConnectorResult<Option<Tally>> {
        let (count, sum) = self.totals;
        Ok(Some(Tally {
            subtask: self.subtask,
            checkpoint: checkpoint.0,
            records: self.records,
            state_count: if self.restored { 0 } else { count },
            state_sum: if self.restored { 0 } else { sum },
            state_complete: !self.restored,
        }))
    }

    fn commit(&mut self, committables: &[Tally]) -> cutline::ConnectorResult<()> {
        // Totals are cumulative: the latest committable says everything.
        let Some(t) = committables.iter().max_by_key(|t| t.checkpoint) else { return Ok(()) };
        if self.written.is_some_and(|w| w >= t.checkpoint) {
            return Ok(()); // idempotent
        }
        let text = format!("{} {} {} {}\n", t.records, t.state_count, t.state_sum, t.state_complete);
        let (file, tmp) = (self.file(t.checkpoint), self.dir.join(format!(".tally-{}.tmp", self.incarnation)));
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(|e| format!("writing the tally {}: {e}", file.display()))?;
        if let Some(w) = self.written.replace(t.checkpoint) {
            let _ = std::fs::remove_file(self.file(w));
        }
        Ok(())
    }
}

#[cold]
fn out_of_range(key: u64, keys: u64) -> String {
    format!("key {key} is outside 0..{keys}")
}

/// What every sink subtask committed last, added up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BenchTally {
    pub subtasks: u32,
    pub records: u64,
    pub state_count: u64,
    pub state_sum: u64,
    pub state_complete: bool,
}

/// Sum over events `0..events` of their value `i % 1000` (modulo 2^64, as the tally adds).
pub fn expected_value_sum(events: u64) -> u64 {
    let (full, rest) = (events / 1000, events % 1000);
    full.wrapping_mul(499_500).wrapping_add(rest * rest.saturating_sub(1) / 2)
}

impl BenchTally {
    /// Did the run do the work of `events` events on `parallelism` sink subtasks: every update
    /// received once, and (unless a restore made it unknown) the keyed state adding up to the events?
    pub fn check(&self, events: u64, parallelism: u32) -> Result<(), String> {
        if self.subtasks != parallelism {
            return Err(format!(
                "{} of the {parallelism} sink subtasks committed a tally: the job did not finish",
                self.subtasks
            ));
        }
        if self.records != events {
            return Err(format!("the sink received {} updates for {events} events", self.records));
        }
        if self.state_complete {
            if self.state_count != events {
                return Err(format!("the keyed state counts {} events, not {events}", self.state_count));
            }
            let want = expected_value_sum(events);
            if self.state_sum != want {
                return Err(format!("the keyed state sums to {}, not {want}", self.state_sum));
            }
        }
        Ok(())
    }
}

/// Read the tally directory: for every subtask its latest tally file.
pub fn read_tallies(dir: &Path) -> Result<BenchTally, String> {
    let err = |e: std::io::Error| format!("reading the tally directory {}: {e}", dir.display());
    let mut latest: std::collections::BTreeMap<u32, (u64, String)> = Default::default();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let name = entry.map_err(err)?.file_name().to_string_lossy().into_owned();
        let Some((sub, chk)) = name.strip_prefix("tally-").and_then(|r| r.split_once('-')) else { continue };
        let (Ok(sub), Ok(chk)) = (sub.parse::<u32>(), chk.parse::<u64>()) else {
            return Err(format!("unexpected file {name} in the tally directory {}", dir.display()));
        };
        if latest.get(&sub).is_none_or(|(c, _)| chk > *c) {
            latest.insert(sub, (chk, name));
        }
    }
    let mut t = BenchTally { state_complete: true, ..Default::default() };
    for (chk, name) in latest.values() {
        let text = std::fs::read_to_string(dir.join(name)).map_err(err)?;
        let f: Vec<&str> = text.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        let (Some(records), Some(count), Some(sum), Some(complete)) =
            (num(0), num(1), num(2), f.get(3).and_then(|v| v.parse::<bool>().ok()))
        else {
            return Err(format!("the tally {name} (checkpoint {chk}) is malformed: {text:?}"));
        };
        t.subtasks += 1;
        t.records += records;
        t.state_count += count;
        t.state_sum = t.state_sum.wrapping_add(sum);
        t.state_complete &= complete;
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expected_sum_is_the_sum_of_the_values() {
        for events in [0, 1, 2, 999, 1000, 1001, 12_345] {
            assert_eq!(expected_value_sum(events), (0..events).map(|i| i % 1000).sum::<u64>(), "{events}");
        }
    }
}
