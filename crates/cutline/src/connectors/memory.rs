//! [`MemoryTxnSink`] into a [`MemoryTxnStore`]: an in-memory transactional store standing in for an
//! external system with prepared transactions (it outlives task crashes). Used by the simulation and
//! by tests.

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
        MemoryTxnSink { store, ctx: None, open: Vec::new(), seq: 0 }
    }
    fn prefix(&self) -> String {
        let c = self.ctx.as_ref().expect("opened");
        // '@' cannot occur in a uid or the job id, so no sink's prefix is a prefix of another sink's
        // names, nor of the names of the same sink in another job.
        format!("{}@{}@{}@", c.uid, c.subtask, c.job)
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
        let prefix = self.prefix();
        let own = self.ctx.as_ref().expect("opened").incarnation;
        let mut s = self.store.lock().expect("store lock");
        s.prepared.retain(|k, _| !k.starts_with(&prefix) || of_a_newer_generation(&k[prefix.len()..], own));
        Ok(())
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
        let prefix = self.prefix();
        let s = self.store.lock().expect("store lock");
        Ok(Some(
            s.committed.iter().any(|(k, c, _)| k.starts_with(&prefix) && checkpoint.is_none_or(|after| *c > after)),
        ))
    }
}
