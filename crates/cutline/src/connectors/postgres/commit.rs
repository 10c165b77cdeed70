//! The commit side of [`PostgresSink`]: committing what a checkpoint prepared (once, its marker row
//! telling a commit that happened before from one that was lost), and rolling back at a restore what
//! no complete checkpoint prepared.

use super::{sql, PostgresSink, PreparedTxn, MARKER_TABLE};
use crate::connectors::sink::of_a_newer_generation;
use crate::error::{ConnectorError, ConnectorResult};
use postgres::error::SqlState;

impl<T> PostgresSink<T> {
    /// Commit what checkpoint `txn` of subtask `subtask` left: its prepared transaction, then its
    /// deferred rows; true if the transaction was still prepared (false: committed before, or none).
    pub(super) fn commit_one(&mut self, subtask: u32, txn: &PreparedTxn) -> ConnectorResult<bool> {
        let now = self.commit_prepared(txn)?;
        self.write_deferred(subtask, txn.checkpoint, &txn.deferred.0)?;
        Ok(now)
    }

    /// Recovery: commit what the restored checkpoint prepared (each with the subtask that prepared
    /// it), in checkpoint order, as they were (or would have been) committed; then roll back every
    /// other prepared transaction this instance recovers.
    pub(super) fn recover_from(&mut self, mut to_commit: Vec<(u32, &PreparedTxn)>) -> ConnectorResult<()> {
        to_commit.sort_by_key(|(j, t)| (t.checkpoint, *j));
        for (j, txn) in to_commit {
            if self.commit_one(j, txn)? {
                tracing::info!(
                    event = "sink_recovered_commit",
                    gid = %txn.gid,
                    "committed a transaction the restored checkpoint prepared (its completion had not reached the sink)"
                );
            }
        }
        self.roll_back_prepared()
    }

    /// Commit one prepared transaction (true), or learn from its marker row that it was committed
    /// before (false).
    pub(super) fn commit_prepared(&mut self, txn: &PreparedTxn) -> ConnectorResult<bool> {
        if txn.gid.is_empty() {
            return Ok(false);
        }
        let c = self.control()?;
        match c.batch_execute(&format!("COMMIT PREPARED {}", sql::literal(&txn.gid))) {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {
                let c = self.control()?;
                match c.query_opt(&format!("SELECT 1 FROM {MARKER_TABLE} WHERE gid = $1"), &[&txn.gid]) {
                    Ok(Some(_)) => Ok(false), // committed before: commit is idempotent
                    Ok(None) => Err(ConnectorError::permanent(format!(
                        "PostgreSQL sink: prepared transaction {} (checkpoint {}) is neither prepared nor \
                         committed: it was rolled back outside this job, and its output is lost",
                        txn.gid, txn.checkpoint
                    ))),
                    Err(e) => Err(self.control_failed("reading the commit markers", e)),
                }
            }
            Err(e) => Err(self.control_failed(&format!("COMMIT PREPARED {}", txn.gid), e)),
        }
    }
    /// Roll back every prepared transaction of this job's sink that a subtask this instance
    /// recovers prepared (`recovers`), except those of a generation newer than its own.
    fn roll_back_prepared(&mut self) -> ConnectorResult<()> {
        let (prefix, own) = (self.sink_prefix(), self.ctx().incarnation);
        let rows = {
            let c = self.control()?;
            c.query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, $1)",
                &[&prefix],
            )
        };
        let rows = rows.map_err(|e| self.control_failed("listing pg_prepared_xacts", e))?;
        for r in rows {
            let gid: String = r.get(0);
            // `<subtask>@<incarnation>-<checkpoint>` after the sink's prefix.
            let Some((j, rest)) = gid[prefix.len()..].split_once('@') else { continue };
            if !j.parse::<u32>().is_ok_and(|j| self.recovers(j)) {
                continue; // another subtask's
            }
            if of_a_newer_generation(rest, own) {
                continue; // a newer run's, not ours to roll back
            }
            let c = self.control()?;
            match c.batch_execute(&format!("ROLLBACK PREPARED {}", sql::literal(&gid))) {
                Ok(()) => tracing::info!(
                    event = "sink_rolled_back",
                    %gid,
                    "rolled back a transaction prepared after the restored checkpoint"
                ),
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {} // gone meanwhile
                Err(e) => return Err(self.control_failed(&format!("ROLLBACK PREPARED {gid}"), e)),
            }
        }
        Ok(())
    }
}
