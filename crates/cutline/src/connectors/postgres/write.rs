//! The write path of [`PostgresSink`]: multi-row statements into the open transaction, and flushes
//! that step aside from rows locked by the sink's own prepared transactions.

use super::conn;
use super::{sql, PostgresSink, Prepared, DEFERRED_FLUSH_LOCK_WAIT_MS, MAX_DEFERRED_BATCHES};
use crate::error::{ConnectorError, ConnectorResult};
use postgres::error::SqlState;

impl<T> PostgresSink<T> {
    pub(super) fn statement(&mut self, rows: usize) -> ConnectorResult<postgres::Statement> {
        let sql = sql::insert_statement(&self.table, &self.columns, &self.types, self.key.as_deref(), rows);
        if rows == self.config.batch_rows {
            if let Some(p) = &self.statements {
                return Ok(p.full.clone());
            }
        }
        let data = self.data.as_mut().expect("connected");
        let st = match data.prepare(&sql) {
            Ok(st) => st,
            Err(e) => return Err(self.data_failed("preparing the insert statement", e)),
        };
        if rows == self.config.batch_rows {
            self.statements = Some(Prepared { full: st.clone() });
        }
        Ok(st)
    }

    /// Send the buffered rows into the open transaction (beginning it if needed).
    ///
    /// Rows of a key that a prepared transaction of this sink still locks (its checkpoint's completion
    /// has not reached the sink yet) would block the task thread, which is the thread that commits
    /// that transaction: a deadlock. So a flush between barriers (`final_for_barrier` false) waits at
    /// most [`DEFERRED_FLUSH_LOCK_WAIT_MS`] for a lock, then undoes its statements to a savepoint and
    /// keeps the rows buffered for later (up to [`MAX_DEFERRED_BATCHES`] batches); the flush at a
    /// barrier waits up to `lock_wait_ms` and then fails the task, and the job restores.
    pub(super) fn flush(&mut self, final_for_barrier: bool) -> ConnectorResult<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        if !final_for_barrier && self.retry_at_len.is_some_and(|at| self.buffer.len() < at) {
            // An earlier flush found rows locked: try again after another batch of rows (by then the
            // commit has likely come), or at the barrier.
            return Ok(());
        }
        if self.data.as_ref().is_none_or(|c| c.is_closed()) {
            if self.in_txn {
                self.in_txn = false;
                return Err(ConnectorError::transient(
                    "PostgreSQL sink: the data connection closed with a transaction open; the job restores",
                ));
            }
            let pg = self.pg.as_ref().expect("opened");
            self.data = Some(conn::connect(pg, self.config.unavailable_wait_ms)?);
            self.statements = None;
        }
        if !self.in_txn {
            if let Err(e) = self.data.as_mut().expect("connected").batch_execute("BEGIN") {
                return Err(self.data_failed("BEGIN", e));
            }
            self.in_txn = true;
        }
        let may_defer = !final_for_barrier && self.buffer.len() < self.config.batch_rows * MAX_DEFERRED_BATCHES;
        let wait_ms = if may_defer { DEFERRED_FLUSH_LOCK_WAIT_MS } else { self.config.lock_wait_ms };
        let setup = format!("SET LOCAL lock_timeout = {wait_ms}; SAVEPOINT cutline_flush");
        if let Err(e) = self.data.as_mut().expect("connected").batch_execute(&setup) {
            return Err(self.data_failed("SAVEPOINT", e));
        }
        let rows = std::mem::take(&mut self.buffer);
        for chunk in rows.chunks(self.config.batch_rows) {
            let st = self.statement(chunk.len())?;
            let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                chunk.iter().flatten().map(|v| v as &(dyn postgres::types::ToSql + Sync)).collect();
            let Err(e) = self.data.as_mut().expect("connected").execute(&st, &params) else { continue };
            if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
                if may_defer {
                    if let Err(e) =
                        self.data.as_mut().expect("connected").batch_execute("ROLLBACK TO SAVEPOINT cutline_flush")
                    {
                        return Err(self.data_failed("ROLLBACK TO SAVEPOINT", e));
                    }
                    self.buffer = rows; // the keys stay in `buffered_keys`, pointing at the same rows
                    self.retry_at_len = Some(self.buffer.len() + self.config.batch_rows);
                    return Ok(());
                }
                return Err(self.data_failed(
                    &format!(
                        "rows of {} stayed locked for lock_wait_ms = {} ms (by a prepared transaction of an \
                         earlier checkpoint whose completion has not reached this sink, or by another writer)",
                        self.config.table, self.config.lock_wait_ms
                    ),
                    e,
                ));
            }
            return Err(self.data_failed(&format!("writing {} rows into {}", chunk.len(), self.config.table), e));
        }
        self.buffered_keys.clear();
        self.retry_at_len = None;
        Ok(())
    }
}
