//! [`PostgresSink`]: exactly-once into a PostgreSQL table with two-phase commit (feature
//! `postgres`).
//!
//! Each sink subtask writes the records between two barriers into one transaction on its *data*
//! connection, in multi-row `INSERT` statements of up to `batch_rows` rows (upserts:
//! `ON CONFLICT (key) DO UPDATE`, the last record of a key in a batch winning). At a barrier it adds a
//! marker row to `cutline_sink_commits` in the same transaction and runs `PREPARE TRANSACTION` under a
//! name of its own (`cutline@<job>@<sink>@<subtask>@<incarnation>-<checkpoint>`); the name is the
//! committable stored in the checkpoint. When the checkpoint completes, its *control* connection runs
//! `COMMIT PREPARED` (a second connection, because the data connection is by then inside the next
//! transaction). The marker row makes commit idempotent and the commit window safe: a name no longer
//! in `pg_prepared_xacts` whose marker row is visible was committed; one with neither was lost, and
//! that is an error, never silently skipped. At a restore the sink commits what the restored
//! checkpoint prepared and rolls back every other prepared transaction of this job's subtask (never
//! another job's or sink's, nor a newer generation's). It answers for every subtask `j` with
//! `j % parallelism == subtask`: after a restore at another parallelism, the old subtasks it takes
//! over (`Sink::take_over`), and the leftovers of a failed run at a higher parallelism. Transaction
//! names and marker rows carry their subtask, so it lists, commits and answers for those too.
//!
//! An upserting subtask never writes a key that its own prepared transaction of an earlier
//! checkpoint still locks (it is the thread that would commit it): while one of its checkpoints is
//! uncommitted it keeps rows buffered, and a barrier that arrives meanwhile (the final one racing
//! the previous checkpoint's completion, a checkpoint aborted after it prepared, several in flight)
//! puts the buffered rows into the checkpoint itself. They are written when that checkpoint commits,
//! in one transaction with a marker row of their own (`...-<checkpoint>-deferred`), and again by a
//! recovery that finds no such marker.
//!
//! A server that cannot be reached stalls the sink for up to `unavailable_wait_ms` (reconnecting
//! with backoff) before the task fails; the open transaction of a connection that broke is lost, so
//! that fails the task at once and the job restores and replays it.

mod commit;
mod conn;
mod param;
mod sql;
mod write;

pub use sql::{SqlValue, MAX_BATCH_ROWS};

use super::sink::{Sink, SinkContext};
use crate::error::{ConnectorError, ConnectorResult};
use cutline_core::CheckpointId;
pub use param::DeferredRows;
use param::{Bind, Param};
use postgres::error::SqlState;
use postgres::{Client, Config};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// Default of [`PostgresSinkConfig::batch_rows`].
pub const DEFAULT_BATCH_ROWS: usize = 1_000;
/// Default of [`PostgresSinkConfig::unavailable_wait_ms`].
pub const DEFAULT_UNAVAILABLE_WAIT_MS: u64 = 30_000;
/// Default of [`PostgresSinkConfig::lock_wait_ms`].
pub const DEFAULT_LOCK_WAIT_MS: u64 = 10_000;
/// Keys an upserting sink keeps buffered between barriers while one of its prepared transactions is
/// uncommitted (its rows locked), before it writes anyway and may wait up to `lock_wait_ms`.
pub const MAX_DEFERRED_ROWS: usize = 1_000_000;
/// The table of marker rows, one per prepared transaction, created in the connection's default
/// schema when missing.
pub const MARKER_TABLE: &str = "cutline_sink_commits";

/// How rows are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Plain `INSERT`: every record becomes a row.
    Insert,
    /// `INSERT ... ON CONFLICT (key) DO UPDATE`: one row per key holds the latest record. The key
    /// columns must carry a unique constraint or index.
    Upsert {
        /// The key columns (a subset of `columns`).
        key: Vec<String>,
    },
}

/// Where and how a [`PostgresSink`] writes.
#[derive(Clone, Debug)]
pub struct PostgresSinkConfig {
    /// Connection string: `postgres://user:password@host:port/database` or `host=... user=...`.
    pub url: String,
    /// The target table, `table` or `schema.table`; it must exist.
    pub table: String,
    /// The columns each record fills, in the order of the values the row function returns.
    pub columns: Vec<String>,
    /// Insert or upsert.
    pub mode: WriteMode,
    /// Rows per `INSERT` statement (1 to [`MAX_BATCH_ROWS`], and at most 65,535 values).
    pub batch_rows: usize,
    /// How long the sink waits for a server it cannot reach before the task fails.
    pub unavailable_wait_ms: u64,
    /// Column definitions for `CREATE TABLE IF NOT EXISTS <table> (<these>)` at open, e.g.
    /// `"word text PRIMARY KEY, n bigint NOT NULL"`; `None` (the default): the table must exist.
    /// SQL from your code, never from untrusted input.
    pub create_table: Option<String>,
    /// How long any statement of the sink waits for rows another transaction locks before the task
    /// fails (the data connection's `lock_timeout`); at least 1.
    pub lock_wait_ms: u64,
}

impl PostgresSinkConfig {
    /// Insert into `table`'s `columns` at `url`, with the default batch size and wait.
    pub fn insert(url: &str, table: &str, columns: &[&str]) -> PostgresSinkConfig {
        PostgresSinkConfig {
            url: url.to_owned(),
            table: table.to_owned(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            mode: WriteMode::Insert,
            batch_rows: DEFAULT_BATCH_ROWS,
            unavailable_wait_ms: DEFAULT_UNAVAILABLE_WAIT_MS,
            create_table: None,
            lock_wait_ms: DEFAULT_LOCK_WAIT_MS,
        }
    }
    /// Upsert into `table`'s `columns` at `url`, keyed by `key`.
    pub fn upsert(url: &str, table: &str, columns: &[&str], key: &[&str]) -> PostgresSinkConfig {
        PostgresSinkConfig {
            mode: WriteMode::Upsert { key: key.iter().map(|c| c.to_string()).collect() },
            ..PostgresSinkConfig::insert(url, table, columns)
        }
    }
}

/// What a checkpoint of a [`PostgresSink`] subtask leaves to commit, as stored in the checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreparedTxn {
    /// Its prepared transaction's name in `pg_prepared_xacts`; empty if it prepared none.
    pub gid: String,
    /// The checkpoint that prepared it.
    pub checkpoint: u64,
    /// Rows it could not write yet (see the module documentation), written when it commits.
    pub deferred: DeferredRows,
}

/// The function that turns a record into the values of its row, in the order of
/// [`PostgresSinkConfig::columns`].
pub type RowFn<T> = Arc<dyn Fn(&T) -> Vec<SqlValue> + Send + Sync>;

/// The statement shapes a sink uses, prepared on its data connection.
struct Prepared {
    full: postgres::Statement,
}

/// Exactly-once sink into a PostgreSQL table; see the module docs.
pub struct PostgresSink<T> {
    config: PostgresSinkConfig,
    row: RowFn<T>,
    ctx: Option<SinkContext>,
    pg: Option<Config>,
    data: Option<Client>,
    control: Option<Client>,
    /// Quoted table and columns, the columns' types and how their values are bound, the quoted
    /// key: known after `open`.
    table: String,
    columns: Vec<String>,
    types: Vec<String>,
    binds: Vec<Bind>,
    key: Option<Vec<String>>,
    /// Positions of the key columns in a row (upsert).
    key_at: Vec<usize>,
    statements: Option<Prepared>,
    /// Rows not yet sent; for upserts, the row of each key (last wins) in first-seen order.
    buffer: Vec<Vec<Param>>,
    buffered_keys: HashMap<Vec<Option<String>>, usize>,
    /// A transaction is open on the data connection.
    in_txn: bool,
    /// Checkpoints this instance prepared (or deferred rows for) and has not committed yet.
    uncommitted: std::collections::BTreeSet<u64>,
}

impl<T> Clone for PostgresSink<T> {
    /// A fresh, unopened sink with the same configuration.
    fn clone(&self) -> Self {
        PostgresSink::new(self.config.clone(), self.row.clone())
    }
}

impl<T> PostgresSink<T> {
    /// A sink writing each record as the row `row` returns. Nothing connects before `open`.
    pub fn new(config: PostgresSinkConfig, row: RowFn<T>) -> PostgresSink<T> {
        PostgresSink {
            config,
            row,
            ctx: None,
            pg: None,
            data: None,
            control: None,
            table: String::new(),
            columns: Vec::new(),
            types: Vec::new(),
            binds: Vec::new(),
            key: None,
            key_at: Vec::new(),
            statements: None,
            buffer: Vec::new(),
            buffered_keys: HashMap::new(),
            in_txn: false,
            uncommitted: Default::default(),
        }
    }

    fn ctx(&self) -> &SinkContext {
        self.ctx.as_ref().expect("PostgresSink used before open")
    }

    /// Transaction names of this job's subtask start with this; `@` occurs in none of the parts.
    fn prefix(&self) -> String {
        self.prefix_of(self.ctx().subtask)
    }

    fn prefix_of(&self, subtask: u32) -> String {
        format!("{}{subtask}@", self.sink_prefix())
    }

    /// Transaction names of this job's sink, any subtask, start with this.
    fn sink_prefix(&self) -> String {
        let c = self.ctx();
        format!("cutline@{}@{}@", c.job, c.uid)
    }

    /// Whether this instance recovers the transactions of subtask `j` of any run: its own, those of
    /// the old subtasks it takes over after a rescale, and those a failed run at a higher
    /// parallelism left prepared (`j % parallelism == subtask` covers all, each `j` once).
    fn recovers(&self, j: u32) -> bool {
        let c = self.ctx();
        j % c.parallelism.max(1) == c.subtask
    }

    fn control(&mut self) -> ConnectorResult<&mut Client> {
        if self.control.as_ref().is_none_or(|c| c.is_closed()) {
            let pg = self.pg.as_ref().expect("opened");
            self.control = Some(conn::connect(pg, self.config.unavailable_wait_ms)?);
        }
        Ok(self.control.as_mut().expect("connected"))
    }

    /// A statement on the control connection failed: drop the connection if it broke, and say so.
    fn control_failed(&mut self, what: &str, e: postgres::Error) -> ConnectorError {
        if e.is_closed() || e.as_db_error().is_none() {
            self.control = None;
        }
        ConnectorError::transient(format!("PostgreSQL sink: {what}: {}", conn::show(&e)))
    }

    /// A statement on the data connection failed: the open transaction is gone; the task must fail
    /// and the job restore.
    fn data_failed(&mut self, what: &str, e: postgres::Error) -> ConnectorError {
        self.data = None;
        self.statements = None;
        self.in_txn = false;
        if conn::is_permanent(&e) {
            // The same records would fail the same way after a restore.
            return ConnectorError::permanent(format!(
                "PostgreSQL sink: {what}: {}; the table or the records do not fit, so replaying them cannot help",
                conn::show(&e)
            ));
        }
        ConnectorError::transient(format!(
            "PostgreSQL sink: {what}: {}; the open transaction is lost and the job restores",
            conn::show(&e)
        ))
    }

    fn check_server(&mut self) -> ConnectorResult<()> {
        let table = self.config.table.clone();
        let quoted = self.table.clone();
        let c = self.control()?;
        let max: String = c
            .query_one("SHOW max_prepared_transactions", &[])
            .map(|r| r.get(0))
            .map_err(|e| ConnectorError::transient(format!("PostgreSQL sink: {}", conn::show(&e))))?;
        if max.trim() == "0" {
            return Err(ConnectorError::permanent(
                "PostgreSQL has max_prepared_transactions = 0, so it cannot prepare transactions, and the \
                 exactly-once sink prepares one per sink subtask and checkpoint. Set it in postgresql.conf \
                 (at least the sink's parallelism times the checkpoints in flight, e.g. \
                 max_prepared_transactions = 64) or start the server with -c max_prepared_transactions=64, \
                 then restart the server",
            ));
        }
        // Create what is missing. Only when it is missing: DDL on an existing table waits for the
        // locks of its prepared transactions, which only this job's recovery releases. Subtasks
        // serialize the creation on an advisory lock and look again once they hold it.
        let mut missing = vec![(
            MARKER_TABLE.to_string(),
            format!(
                "CREATE TABLE {MARKER_TABLE} (gid text PRIMARY KEY, job text NOT NULL, sink text NOT NULL, \
             subtask integer NOT NULL, checkpoint bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now()); \
             CREATE INDEX {MARKER_TABLE}_progress ON {MARKER_TABLE} (job, sink, subtask, checkpoint)"
            ),
        )];
        if let Some(defs) = &self.config.create_table {
            missing.push((quoted.clone(), format!("CREATE TABLE {quoted} ({defs})")));
        }
        for (name, ddl) in missing {
            let c = self.control()?;
            let result = (|| -> Result<(), postgres::Error> {
                let exists = |c: &mut postgres::Client| -> Result<bool, postgres::Error> {
                    c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).map(|r| r.get(0))
                };
                if exists(c)? {
                    return Ok(());
                }
                c.batch_execute("BEGIN; SELECT pg_advisory_xact_lock(7236512913)")?;
                if exists(c)? {
                    return c.batch_execute("COMMIT");
                }
                match c.batch_execute(&format!("{ddl}; COMMIT")) {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        let _ = c.batch_execute("ROLLBACK");
                        // Another subtask created it first: the look after taking the lock can miss
                        // that (an advisory lock does not refresh this session's view of the
                        // catalog), and the creation then meets the name taken.
                        let raced = [SqlState::DUPLICATE_TABLE, SqlState::UNIQUE_VIOLATION];
                        if e.code().is_some_and(|code| raced.contains(code)) {
                            Ok(())
                        } else {
                            Err(e)
                        }
                    }
                }
            })();
            if let Err(e) = result {
                return Err(self.control_failed(&format!("creating {name}"), e));
            }
        }
        let c = self.control()?;
        let rows = c
            .query(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.atttypid::int8 FROM pg_attribute a \
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                &[&quoted],
            )
            .map_err(|e| {
                ConnectorError::transient(format!("PostgreSQL sink: reading {table}'s columns: {}", conn::show(&e)))
            })?;
        if rows.is_empty() {
            return Err(ConnectorError::permanent(format!(
                "PostgreSQL sink: table {table} does not exist (or has no columns); create it first"
            )));
        }
        let known: HashMap<String, (String, i64)> =
            rows.iter().map(|r| (r.get::<_, String>(0), (r.get::<_, String>(1), r.get::<_, i64>(2)))).collect();
        self.types = Vec::new();
        self.binds = Vec::new();
        for col in &self.config.columns {
            match known.get(col) {
                Some((ty, oid)) => {
                    self.types.push(ty.clone());
                    self.binds.push(Bind::of_type_oid(u32::try_from(*oid).unwrap_or(0)));
                }
                None => {
                    let mut have: Vec<&String> = known.keys().collect();
                    have.sort();
                    return Err(ConnectorError::permanent(format!(
                        "PostgreSQL sink: table {table} has no column {col:?} (it has {have:?})"
                    )));
                }
            }
        }
        Ok(())
    }

    fn validate(&mut self) -> ConnectorResult<()> {
        let cfg = &self.config;
        if cfg.columns.is_empty() {
            return Err(ConnectorError::permanent("PostgreSQL sink: no columns configured"));
        }
        if cfg.lock_wait_ms == 0 {
            // PostgreSQL reads lock_timeout = 0 as "wait forever": the deadlock the bound prevents.
            return Err(ConnectorError::permanent(
                "PostgreSQL sink: lock_wait_ms = 0 would let a statement wait forever for a lock; give it at least 1",
            ));
        }
        self.table = sql::table_name(&cfg.table)?;
        self.columns = cfg.columns.iter().map(|c| sql::ident(c, "column")).collect::<Result<_, _>>()?;
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = cfg.columns.iter().find(|c| !seen.insert(*c)) {
            return Err(ConnectorError::permanent(format!("PostgreSQL sink: column {dup:?} named twice")));
        }
        let per_statement = sql::MAX_PARAMETERS / cfg.columns.len();
        if cfg.batch_rows == 0 || cfg.batch_rows > MAX_BATCH_ROWS || cfg.batch_rows > per_statement {
            return Err(ConnectorError::permanent(format!(
                "PostgreSQL sink: batch_rows = {} is out of range: 1 to {} for {} columns",
                cfg.batch_rows,
                MAX_BATCH_ROWS.min(per_statement),
                cfg.columns.len()
            )));
        }
        if let WriteMode::Upsert { key } = &cfg.mode {
            if key.is_empty() {
                return Err(ConnectorError::permanent("PostgreSQL sink: upsert mode needs key columns"));
            }
            self.key_at = Vec::new();
            for k in key {
                let Some(at) = cfg.columns.iter().position(|c| c == k) else {
                    return Err(ConnectorError::permanent(format!(
                        "PostgreSQL sink: key column {k:?} is not one of the columns {:?}",
                        cfg.columns
                    )));
                };
                self.key_at.push(at);
            }
            self.key = Some(key.iter().map(|c| sql::ident(c, "key column")).collect::<Result<_, _>>()?);
        }
        let longest = format!("{}{}-{}", self.prefix(), u64::MAX, u64::MAX);
        if longest.len() > sql::MAX_GID_BYTES {
            return Err(ConnectorError::permanent(format!(
                "PostgreSQL sink: the sink uid {:?} is too long for PostgreSQL's transaction names \
                 (at most {} bytes in all); choose a shorter uid",
                self.ctx().uid,
                sql::MAX_GID_BYTES
            )));
        }
        Ok(())
    }
}

impl<T: Send + 'static> Sink<T> for PostgresSink<T> {
    type Committable = PreparedTxn;

    fn open(&mut self, ctx: &SinkContext) -> ConnectorResult<()> {
        self.ctx = Some(ctx.clone());
        self.validate()?;
        self.pg = Some(conn::config(&self.config.url)?);
        self.check_server()?;
        self.connect_data()?;
        Ok(())
    }

    fn recover(&mut self, to_commit: &[PreparedTxn]) -> ConnectorResult<()> {
        let own = self.ctx().subtask;
        self.recover_from(to_commit.iter().map(|t| (own, t)).collect())
    }

    /// The restored checkpoint has this sink at another parallelism. The old subtasks' transaction
    /// names and marker rows carry their subtask, and `recover` and `committed_after` cover every
    /// subtask `j` with `j % parallelism == subtask`: nothing more to do here.
    fn take_over(&mut self, _old_subtasks: &[u32], _old_parallelism: u32) -> ConnectorResult<bool> {
        Ok(true)
    }

    /// As `recover`, with the rows each old subtask deferred written under that subtask's marker
    /// (two old subtasks' deferred rows of one checkpoint are two writes, not one).
    fn recover_taken_over(&mut self, prepared: &[(u32, Vec<PreparedTxn>)]) -> ConnectorResult<()> {
        self.recover_from(prepared.iter().flat_map(|(j, txns)| txns.iter().map(move |t| (*j, t))).collect())
    }

    fn write(&mut self, item: T) -> ConnectorResult<()> {
        let values = (self.row)(&item);
        if values.len() != self.columns.len() {
            return Err(ConnectorError::permanent(format!(
                "PostgreSQL sink: the row function returned {} values for {} columns",
                values.len(),
                self.columns.len()
            )));
        }
        let mut row = Vec::with_capacity(values.len());
        for (i, v) in values.iter().enumerate() {
            row.push(v.to_param(self.binds[i], &self.config.columns[i], &self.types[i])?);
        }
        if self.key.is_some() {
            let key: Vec<Option<String>> = self.key_at.iter().map(|&i| values[i].to_text()).collect();
            match self.buffered_keys.get(&key) {
                Some(&at) => self.buffer[at] = row,
                None => {
                    self.buffered_keys.insert(key, self.buffer.len());
                    self.buffer.push(row);
                }
            }
        } else {
            self.buffer.push(row);
        }
        if self.buffer.len() >= self.config.batch_rows {
            self.flush(false)?;
        }
        Ok(())
    }

    fn prepare(&mut self, checkpoint: CheckpointId) -> ConnectorResult<Option<PreparedTxn>> {
        let deferred = if self.must_defer() {
            self.buffered_keys.clear();
            DeferredRows(std::mem::take(&mut self.buffer))
        } else {
            self.flush(true)?;
            DeferredRows::default()
        };
        if !self.in_txn {
            if deferred.is_empty() {
                return Ok(None);
            }
            self.uncommitted.insert(checkpoint.0);
            return Ok(Some(PreparedTxn { gid: String::new(), checkpoint: checkpoint.0, deferred }));
        }
        let c = self.ctx().clone();
        let gid = format!("{}{}-{}", self.prefix(), c.incarnation, checkpoint.0);
        let marker =
            format!("INSERT INTO {MARKER_TABLE} (job, sink, subtask, checkpoint, gid) VALUES ($1, $2, $3, $4, $5)");
        let data = self.data.as_mut().expect("in a transaction");
        let subtask = c.subtask as i32;
        let cp = i64::try_from(checkpoint.0).map_err(|_| ConnectorError::permanent("checkpoint id beyond i64"))?;
        if let Err(e) = data.execute(&marker, &[&c.job, &c.uid, &subtask, &cp, &gid]) {
            return Err(self.data_failed("writing the commit marker", e));
        }
        let data = self.data.as_mut().expect("in a transaction");
        if let Err(e) = data.batch_execute(&format!("PREPARE TRANSACTION {}", sql::literal(&gid))) {
            return Err(self.data_failed(&format!("PREPARE TRANSACTION {gid}"), e));
        }
        self.in_txn = false;
        self.uncommitted.insert(checkpoint.0);
        Ok(Some(PreparedTxn { gid, checkpoint: checkpoint.0, deferred }))
    }

    fn commit(&mut self, committables: &[PreparedTxn]) -> ConnectorResult<()> {
        let own = self.ctx().subtask;
        for txn in committables {
            self.commit_one(own, txn)?;
            self.uncommitted.remove(&txn.checkpoint);
        }
        Ok(())
    }

    fn end_of_input(&mut self) -> ConnectorResult<()> {
        // Rows that must wait go into the final checkpoint (see `prepare`).
        if self.must_defer() {
            return Ok(());
        }
        self.flush(true)
    }

    fn close(&mut self) -> ConnectorResult<()> {
        self.data = None;
        self.control = None;
        Ok(())
    }

    fn abort(&mut self) {
        // Dropping the connection rolls the open transaction back on the server; prepared ones stay
        // for the recovery to decide.
        self.data = None;
        self.control = None;
        self.buffer.clear();
        self.buffered_keys.clear();
        self.uncommitted.clear();
        self.in_txn = false;
    }

    fn committed_after(&mut self, checkpoint: Option<CheckpointId>) -> ConnectorResult<Option<bool>> {
        let c = self.ctx().clone();
        let after = match checkpoint {
            None => -1i64,
            Some(cp) => i64::try_from(cp.0).unwrap_or(i64::MAX),
        };
        // Every subtask this instance recovers (see `recovers`).
        let (parallelism, subtask) = (c.parallelism.max(1) as i32, c.subtask as i32);
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {MARKER_TABLE} WHERE job = $1 AND sink = $2 AND subtask % $3 = $4 AND checkpoint > $5)"
        );
        let res = self.control()?.query_one(&sql, &[&c.job, &c.uid, &parallelism, &subtask, &after]);
        match res {
            Ok(row) => Ok(Some(row.get(0))),
            Err(e) => Err(self.control_failed("reading the commit markers", e)),
        }
    }
}
