//! The write path of [`PostgresSink`]: multi-row statements into the open transaction, and flushes
//! that wait while the sink's own prepared transactions (which lock their rows) are uncommitted.

use super::conn;
use super::{sql, PostgresSink, Prepared, MAX_DEFERRED_ROWS};
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
    /// Until its checkpoint's completion reaches the sink, a prepared transaction of this sink keeps
    /// its rows locked, and the thread that would wait for those locks is the one that commits it: a
    /// deadlock. So between barriers (`final_for_barrier` false) an upserting sink does not write
    /// while any of its prepared transactions is uncommitted; it keeps the rows buffered, one per key
    /// (up to [`MAX_DEFERRED_ROWS`] keys, then it writes anyway). Plain inserts do not wait for row
    /// locks, except on a unique key written twice, which is an error anyway. Every statement waits at most
    /// `lock_wait_ms` for a lock (the session's `lock_timeout`), then fails the task, and the job
    /// restores instead of hanging.
    pub(super) fn flush(&mut self, final_for_barrier: bool) -> ConnectorResult<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        if !final_for_barrier
            && self.key.is_some()
            && !self.uncommitted.is_empty()
            && self.buffer.len() < MAX_DEFERRED_ROWS
        {
            return Ok(());
        }
        if self.data.as_ref().is_none_or(|c| c.is_closed()) {
            if self.in_txn {
                self.in_txn = false;
                return Err(ConnectorError::transient(
                    "PostgreSQL sink: the data connection closed with a transaction open; the job restores",
                ));
            }
            self.connect_data()?;
        }
        if !self.in_txn {
            if let Err(e) = self.data.as_mut().expect("connected").batch_execute("BEGIN") {
                return Err(self.data_failed("BEGIN", e));
            }
            self.in_txn = true;
        }
        let rows = std::mem::take(&mut self.buffer);
        self.buffered_keys.clear();
        for chunk in rows.chunks(self.config.batch_rows) {
            let st = self.statement(chunk.len())?;
            let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                chunk.iter().flatten().map(|v| v as &(dyn postgres::types::ToSql + Sync)).collect();
            let Err(e) = self.data.as_mut().expect("connected").execute(&st, &params) else { continue };
            if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
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
        Ok(())
    }

    /// (Re)connect the data connection, its statements to be prepared again, its lock waits bounded.
    pub(super) fn connect_data(&mut self) -> ConnectorResult<()> {
        let pg = self.pg.as_ref().expect("opened");
        let mut c = conn::connect(pg, self.config.unavailable_wait_ms)?;
        if let Err(e) = c.batch_execute(&format!("SET lock_timeout = {}", self.config.lock_wait_ms)) {
            return Err(self.data_failed("SET lock_timeout", e));
        }
        self.data = Some(c);
        self.statements = None;
        Ok(())
    }
}
