//! Where completed checkpoints' records go ([`RecordKeeper`]): to the store, pruned to the newest
//! [`CHECKPOINT_RECORDS_KEPT`], and to the run's listener. The threaded runtime writes them from a
//! thread of their own, so that the coordinator loop never waits for statistics I/O (a record of a
//! thousand tasks is hundreds of kilobytes); the simulation writes them at once, on its one thread.
//!
//! Statistics decide nothing: a record that cannot be written, or that finds the writer's queue
//! ([`RECORD_QUEUE`]) full, is lost with a warning, never the checkpoint.

use super::trace::CheckpointRecord;
use super::CheckpointListener;
use crossbeam_channel::Sender;
use cutline_core::CheckpointId;
use cutline_storage::CheckpointStore;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Checkpoint records (statistics and epoch traces) kept in the store, the newest; older ones are
/// pruned.
pub const CHECKPOINT_RECORDS_KEPT: usize = 1_000;
/// Records written between two prunings (a pruning lists `stats/`).
const RECORDS_PER_PRUNE: u64 = 100;
/// Records waiting for the writer thread, at most; more are dropped with a warning.
pub const RECORD_QUEUE: usize = 16;

/// Keeps the records of completed checkpoints (see the module).
#[derive(Default)]
pub(crate) struct RecordKeeper {
    /// Told of every record, on the coordinator's thread.
    pub listener: Option<CheckpointListener>,
    /// `None`: records are written at once.
    thread: Option<(Sender<CheckpointRecord>, JoinHandle<()>)>,
    /// Records written so far (at once).
    written: u64,
    /// Records dropped because the writer's queue was full.
    dropped: u64,
}

impl RecordKeeper {
    /// Records written to `store` by a thread of their own.
    pub(crate) fn threaded(store: Arc<dyn CheckpointStore>, listener: Option<CheckpointListener>) -> RecordKeeper {
        let (tx, rx) = crossbeam_channel::bounded::<CheckpointRecord>(RECORD_QUEUE);
        let thread = std::thread::Builder::new().name("cutline-records".into()).spawn(move || {
            let mut written = 0;
            for r in rx {
                write(&*store, &r, &mut written);
            }
        });
        match thread {
            Ok(t) => RecordKeeper { listener, thread: Some((tx, t)), written: 0, dropped: 0 },
            // No thread: write at once rather than not at all.
            Err(_) => RecordKeeper { listener, thread: None, written: 0, dropped: 0 },
        }
    }

    /// Keep `r`: to the writer (or the store, at once), then to the listener.
    pub(crate) fn keep(&mut self, store: &dyn CheckpointStore, r: CheckpointRecord) {
        if let Some(listener) = &self.listener {
            listener(&r);
        }
        match &self.thread {
            None => write(store, &r, &mut self.written),
            Some((tx, _)) => {
                if tx.try_send(r).is_err() {
                    self.dropped += 1;
                    if self.dropped.is_power_of_two() {
                        tracing::warn!(
                            event = "checkpoint_record_dropped",
                            dropped = self.dropped,
                            "checkpoint statistics are written slower than checkpoints complete: {} records dropped",
                            self.dropped
                        );
                    }
                }
            }
        }
    }
}

impl Drop for RecordKeeper {
    /// The records queued are written before the run returns.
    fn drop(&mut self) {
        if let Some((tx, thread)) = self.thread.take() {
            drop(tx);
            let _ = thread.join();
        }
    }
}

/// Write a completed checkpoint's record to the store, pruning now and then.
fn write(store: &dyn CheckpointStore, r: &CheckpointRecord, written: &mut u64) {
    let id = CheckpointId(r.checkpoint);
    if let Err(e) = store.write_stats(id, &r.to_json()) {
        tracing::warn!(event = "checkpoint_record_failed", chk = %id, "the statistics of {id} were not kept: {e}");
        return;
    }
    *written += 1;
    if *written % RECORDS_PER_PRUNE == 1 {
        if let Err(e) = store.prune_stats(CHECKPOINT_RECORDS_KEPT) {
            tracing::warn!(event = "checkpoint_record_prune_failed", "old checkpoint statistics were not removed: {e}");
        }
    }
}
