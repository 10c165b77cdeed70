//! The write path of [`PostgresSink`]: multi-row statements into the open transaction, and flushes
//! that wait while the sink's own prepared transactions (which lock their rows) are uncommitted.

use super::conn;
use super::param::Param;
use super::{sql, PostgresSink, Prepared, MARKER_TABLE, MAX_DEFERRED_ROWS};
use crate::error::{ConnectorError, ConnectorResult};
use postgres::error::SqlState;

impl<T> PostgresSink<T> {
    pub(super) fn statement(&mut self, rows: usize) -> ConnectorResult<postgres::Statement> {
        let sql =
            sql::insert_statement(&self.table, &self.columns, &self.types, &self.binds, self.key.as_deref(), rows);
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
        if !final_for_barrier && self.must_defer() && self.buffer.len() < MAX_DEFERRED_ROWS {
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

    /// Whether rows must wait: an upserting sink with a checkpoint of its own not yet committed (its
    /// prepared transaction may lock the keys).
    pub(super) fn must_defer(&self) -> bool {
        self.key.is_some() && !self.uncommitted.is_empty()
    }

    /// Write the rows checkpoint `checkpoint` of subtask `subtask` deferred, once: in one
    /// transaction on the control connection with the marker row
    /// `<prefix of subtask><incarnation>-<checkpoint>-deferred`; a marker already there (a commit
    /// before a crash, a second recovery) means they were written. `subtask` is this instance's own,
    /// or an old subtask it took over after a rescale.
    pub(super) fn write_deferred(&mut self, subtask: u32, checkpoint: u64, rows: &[Vec<Param>]) -> ConnectorResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let c = self.ctx().clone();
        let gid = format!("{}{}-{checkpoint}-deferred", self.prefix_of(subtask), c.incarnation);
        let cp = i64::try_from(checkpoint).map_err(|_| ConnectorError::permanent("checkpoint id beyond i64"))?;
        let subtask = subtask as i32;
        let (per_statement, lock_wait_ms) = (self.config.batch_rows, self.config.lock_wait_ms);
        let (table, columns, types, binds, key) =
            (self.table.clone(), self.columns.clone(), self.types.clone(), self.binds.clone(), self.key.clone());
        let control = self.control()?;
        let result = (|| -> Result<bool, postgres::Error> {
            let mut t = control.transaction()?;
            t.batch_execute(&format!("SET LOCAL lock_timeout = {lock_wait_ms}"))?;
            let marker = format!(
                "INSERT INTO {MARKER_TABLE} (job, sink, subtask, checkpoint, gid) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (gid) DO NOTHING"
            );
            if t.execute(&marker, &[&c.job, &c.uid, &subtask, &cp, &gid])? == 0 {
                return Ok(false); // written before
            }
            for chunk in rows.chunks(per_statement) {
                let sql = sql::insert_statement(&table, &columns, &types, &binds, key.as_deref(), chunk.len());
                let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    chunk.iter().flatten().map(|v| v as &(dyn postgres::types::ToSql + Sync)).collect();
                t.execute(sql.as_str(), &params)?;
            }
            t.commit()?;
            Ok(true)
        })();
        match result {
            Ok(true) => {
                tracing::info!(checkpoint, rows = rows.len(), "PostgreSQL sink: wrote the rows a checkpoint deferred");
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => {
                Err(self
                    .control_failed(&format!("writing the {} rows checkpoint {checkpoint} deferred", rows.len()), e))
            }
        }
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
