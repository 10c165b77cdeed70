//! [`MemoryTxnSink`] and [`MemoryMarkerSink`] into a [`MemoryTxnStore`]: an in-memory transactional
//! store standing in for an external system (it outlives task crashes). Used by the simulation and by
//! tests. The two sinks follow the two designs of the real exactly-once sinks: prepared transactions
//! committed by name, rolled back by prefix at a recovery (the PostgreSQL sink), and the epoch's
//! records kept in the checkpoint, written at commit together with a marker that a recovery reads,
//! older incarnations fenced (the Kafka sink).

use super::sink::{of_a_newer_generation, Sink, SinkContext};
use crate::error::ConnectorResult;
use cutline_core::CheckpointId;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// An in-memory transactional store standing in for an external system with prepared transactions
/// (it outlives task crashes): used by the simulation and by tests.
#[derive(Default, Debug)]
pub struct MemoryTxnStore {
    /// Prepared transactions: key -> (the checkpoint that prepared it, records).
    prepared: BTreeMap<String, (CheckpointId, Vec<String>)>,
    /// Committed transactions in commit order: (transaction key, its checkpoint, records).
    committed: Vec<(String, CheckpointId, Vec<String>)>,
    committed_keys: BTreeSet<String>,
    /// [`MemoryMarkerSink`]: per sink subtask, the last checkpoint committed (its marker) and the
    /// newest incarnation that opened (older ones are fenced).
    markers: BTreeMap<String, CheckpointId>,
    fenced_below: BTreeMap<String, u64>,
}

impl MemoryTxnStore {
    /// Every committed record, in commit order.
    pub fn committed_records(&self) -> Vec<String> {
        self.committed.iter().flat_map(|(_, _, r)| r.iter().cloned()).collect()
    }
    /// Transactions prepared and neither committed nor discarded by a recovery yet.
    pub fn prepared_count(&self) -> usize {
        self.prepared.len()
    }
}

/// A sink into a shared [`MemoryTxnStore`]; records are formatted with `Display`.
pub struct MemoryTxnSink {
    store: Arc<Mutex<MemoryTxnStore>>,
    ctx: Option<SinkContext>,
    open: Vec<String>,
    seq: u64,
    /// Old subtasks whose transactions this instance took over at a rescaled restore.
    taken_over: Vec<u32>,
}

impl Clone for MemoryTxnSink {
    /// A fresh, unopened sink into the same store.
    fn clone(&self) -> Self {
        MemoryTxnSink::new(self.store.clone())
    }
}

impl MemoryTxnSink {
    /// A sink into `store`, unopened. Every task of the sink (and every job) may share one store:
    /// transactions are named after the sink's uid, subtask and job.
    pub fn new(store: Arc<Mutex<MemoryTxnStore>>) -> Self {
        MemoryTxnSink { store, ctx: None, open: Vec::new(), seq: 0, taken_over: Vec::new() }
    }
    fn prefix(&self) -> String {
        self.prefix_of(self.ctx.as_ref().expect("opened").subtask)
    }
    fn prefix_of(&self, subtask: u32) -> String {
        let c = self.ctx.as_ref().expect("opened");
        // '@' cannot occur in a uid or the job id, so no sink's prefix is a prefix of another sink's
        // names, nor of the names of the same sink in another job.
        format!("{}@{}@{}@", c.uid, subtask, c.job)
    }
    /// The prefixes of this instance's subtask and of those it took over.
    fn recovered_prefixes(&self) -> Vec<String> {
        let own = self.ctx.as_ref().expect("opened").subtask;
        std::iter::once(own)
            .chain(self.taken_over.iter().copied().filter(|j| *j != own))
            .map(|j| self.prefix_of(j))
            .collect()
    }
}

impl<T: std::fmt::Display + Send + 'static> Sink<T> for MemoryTxnSink {
    type Committable = String;
    fn open(&mut self, ctx: &SinkContext) -> ConnectorResult<()> {
        self.ctx = Some(ctx.clone());
        Ok(())
    }
    fn recover(&mut self, to_commit: &[String]) -> ConnectorResult<()> {
        <Self as Sink<T>>::commit(self, to_commit)?;
        let prefixes = self.recovered_prefixes();
        let own = self.ctx.as_ref().expect("opened").incarnation;
        let mut s = self.store.lock().expect("store lock");
        s.prepared.retain(|k, _| {
            prefixes
                .iter()
                .find(|p| k.starts_with(p.as_str()))
                .is_none_or(|p| of_a_newer_generation(&k[p.len()..], own))
        });
        Ok(())
    }
    fn take_over(&mut self, old_subtasks: &[u32], _old_parallelism: u32) -> ConnectorResult<bool> {
        self.taken_over = old_subtasks.to_vec();
        Ok(true)
    }
    fn write(&mut self, item: T) -> ConnectorResult<()> {
        self.open.push(item.to_string());
        Ok(())
    }
    fn prepare(&mut self, checkpoint: CheckpointId) -> ConnectorResult<Option<String>> {
        if self.open.is_empty() {
            return Ok(None);
        }
        let c = self.ctx.as_ref().expect("opened");
        let key = format!("{}{}-{}", self.prefix(), c.incarnation, self.seq);
        self.seq += 1;
        let records = std::mem::take(&mut self.open);
        let mut s = self.store.lock().expect("store lock");
        assert!(!s.committed_keys.contains(&key) && !s.prepared.contains_key(&key), "transaction key {key} reused");
        s.prepared.insert(key.clone(), (checkpoint, records));
        Ok(Some(key))
    }
    fn commit(&mut self, committables: &[String]) -> ConnectorResult<()> {
        let mut s = self.store.lock().expect("store lock");
        for key in committables {
            if s.committed_keys.contains(key) {
                continue; // idempotent
            }
            let Some((checkpoint, records)) = s.prepared.remove(key) else {
                return Err(format!("prepared transaction {key} is gone: committed output would be lost").into());
            };
            s.committed_keys.insert(key.clone());
            s.committed.push((key.clone(), checkpoint, records));
        }
        Ok(())
    }
    fn abort(&mut self) {
        self.open.clear();
    }
    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> ConnectorResult<Option<bool>> {
        let prefixes = self.recovered_prefixes();
        let s = self.store.lock().expect("store lock");
        Ok(Some(s.committed.iter().any(|(k, c, _)| {
            prefixes.iter().any(|p| k.starts_with(p.as_str())) && checkpoint.is_none_or(|after| *c > after)
        })))
    }
}

/// What a [`MemoryMarkerSink`] keeps in a checkpoint: the epoch's records.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MarkedEpoch {
    /// The checkpoint whose barrier ended the epoch.
    pub checkpoint: u64,
    /// Its records.
    pub records: Vec<String>,
}

/// A sink into a shared [`MemoryTxnStore`] in the Kafka sink's design: the records between two
/// barriers are the committable (kept in the checkpoint); a commit writes them and the marker (the
/// checkpoint's id) in one step; a recovery writes the restored epochs above the marker; opening
/// fences older incarnations of the same subtask, whose commits then fail.
pub struct MemoryMarkerSink {
    store: Arc<Mutex<MemoryTxnStore>>,
    ctx: Option<SinkContext>,
    open: Vec<String>,
}

impl Clone for MemoryMarkerSink {
    /// A fresh, unopened sink into the same store.
    fn clone(&self) -> Self {
        MemoryMarkerSink::new(self.store.clone())
    }
}

impl MemoryMarkerSink {
    /// A sink into `store`, unopened; its markers are named after the sink's uid, subtask and job.
    pub fn new(store: Arc<Mutex<MemoryTxnStore>>) -> Self {
        MemoryMarkerSink { store, ctx: None, open: Vec::new() }
    }
    fn name(&self) -> String {
        let c = self.ctx.as_ref().expect("opened");
        format!("{}@{}@{}@marker", c.uid, c.subtask, c.job)
    }
    /// Write `epochs` above the marker, in checkpoint order, each with its marker in one step.
    fn write_epochs(&mut self, epochs: &[MarkedEpoch]) -> ConnectorResult<()> {
        let (name, own) = (self.name(), self.ctx.as_ref().expect("opened").incarnation);
        let mut s = self.store.lock().expect("store lock");
        if s.fenced_below.get(&name).is_some_and(|newest| own < *newest) {
            return Err(format!("{name}: fenced by a newer incarnation than {own}").into());
        }
        let mut epochs: Vec<&MarkedEpoch> = epochs.iter().collect();
        epochs.sort_by_key(|e| e.checkpoint);
        for e in epochs {
            let checkpoint = CheckpointId(e.checkpoint);
            if s.markers.get(&name).is_some_and(|m| *m >= checkpoint) {
                continue; // committed before: the marker says so
            }
            s.committed.push((format!("{name}-{}", e.checkpoint), checkpoint, e.records.clone()));
            s.markers.insert(name.clone(), checkpoint);
        }
        Ok(())
    }
}

impl<T: std::fmt::Display + Send + 'static> Sink<T> for MemoryMarkerSink {
    type Committable = MarkedEpoch;
    fn open(&mut self, ctx: &SinkContext) -> ConnectorResult<()> {
        self.ctx = Some(ctx.clone());
        let name = self.name();
        let mut s = self.store.lock().expect("store lock");
        let newest = s.fenced_below.entry(name).or_insert(0);
        *newest = (*newest).max(ctx.incarnation);
        Ok(())
    }
    fn recover(&mut self, to_commit: &[MarkedEpoch]) -> ConnectorResult<()> {
        self.write_epochs(to_commit)
    }
    fn write(&mut self, item: T) -> ConnectorResult<()> {
        self.open.push(item.to_string());
        Ok(())
    }
    fn prepare(&mut self, checkpoint: CheckpointId) -> ConnectorResult<Option<MarkedEpoch>> {
        if self.open.is_empty() {
            return Ok(None);
        }
        Ok(Some(MarkedEpoch { checkpoint: checkpoint.0, records: std::mem::take(&mut self.open) }))
    }
    fn commit(&mut self, committables: &[MarkedEpoch]) -> ConnectorResult<()> {
        self.write_epochs(committables)
    }
    fn abort(&mut self) {
        self.open.clear();
    }
    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> ConnectorResult<Option<bool>> {
        let name = self.name();
        let s = self.store.lock().expect("store lock");
        Ok(Some(s.markers.get(&name).is_some_and(|m| checkpoint.is_none_or(|after| *m > after))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(generation: u64) -> SinkContext {
        SinkContext { uid: "out".into(), subtask: 0, parallelism: 1, incarnation: generation << 32, job: "j".into() }
    }

    #[test]
    fn the_marker_sink_commits_each_epoch_once_and_fences_older_incarnations() {
        let store = Arc::new(Mutex::new(MemoryTxnStore::default()));
        let mut old = MemoryMarkerSink::new(store.clone());
        Sink::<u32>::open(&mut old, &ctx(1)).unwrap();
        Sink::<u32>::write(&mut old, 7).unwrap();
        let e1 = Sink::<u32>::prepare(&mut old, CheckpointId(1)).unwrap().unwrap();
        Sink::<u32>::commit(&mut old, std::slice::from_ref(&e1)).unwrap();
        Sink::<u32>::commit(&mut old, std::slice::from_ref(&e1)).unwrap(); // the marker says: done
        assert_eq!(store.lock().unwrap().committed_records(), vec!["7"]);
        Sink::<u32>::write(&mut old, 8).unwrap();
        let e2 = Sink::<u32>::prepare(&mut old, CheckpointId(2)).unwrap().unwrap();
        // A newer incarnation opens: the old one can no longer commit; the new one's recovery
        // writes the restored epochs above the marker only.
        let mut new = MemoryMarkerSink::new(store.clone());
        Sink::<u32>::open(&mut new, &ctx(2)).unwrap();
        assert!(Sink::<u32>::commit(&mut old, std::slice::from_ref(&e2)).is_err(), "a fenced incarnation committed");
        assert_eq!(Sink::<u32>::committed_after(&mut new, Some(CheckpointId(1))).unwrap(), Some(false));
        Sink::<u32>::recover(&mut new, &[e2, e1]).unwrap();
        assert_eq!(store.lock().unwrap().committed_records(), vec!["7", "8"]);
    }
}
