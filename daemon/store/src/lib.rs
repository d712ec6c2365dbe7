//! The explanation store: one directory holding a DuckDB file (`xpu.duckdb`, the source of
//! truth: every run with its decisions, rejected candidates, transfers, timings, engine
//! facts and environment, written in one transaction per batch through DuckDB's Appender)
//! and a tantivy index (`index/`) derived from it for full-text search. A run is committed
//! whole or not at all; the index follows the runs' commit sequence and records the last
//! sequence it holds in its commit payload, so after a crash it catches up without
//! duplicates. One process owns a store at a time (`store.lock`); `xpud` and `xpuctl admin`
//! both open it through this crate.

mod index;
pub mod schema;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use duckdb::types::{TimeUnit, Value as DuckValue, ValueRef};
use duckdb::{Config, Connection, params};
use serde::{Deserialize, Serialize};
use xpu_plan::Explanation;

pub use index::SearchHit;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {dir}: another process (an xpud?) holds it; stop it first ({lock} is locked)")]
    Locked { dir: PathBuf, lock: PathBuf },
    #[error("store {dir}: {message}")]
    Io { dir: PathBuf, message: String },
    #[error("store database: {0}")]
    Db(#[from] duckdb::Error),
    #[error("store index: {0}")]
    Index(String),
    #[error(
        "the store was written by a newer xpu (schema version {found}; this build knows up to {supported})"
    )]
    NewerSchema { found: u32, supported: u32 },
    #[error("query: {0}")]
    Query(String),
    #[error("run {0}: stored explanation is unreadable: {1}")]
    Corrupt(String, String),
}

impl From<tantivy::TantivyError> for StoreError {
    fn from(e: tantivy::TantivyError) -> Self {
        StoreError::Index(e.to_string())
    }
}

/// How a run ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
}

impl RunStatus {
    pub const ALL: [RunStatus; 4] =
        [RunStatus::Succeeded, RunStatus::Failed, RunStatus::Cancelled, RunStatus::TimedOut];

    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::TimedOut => "timed_out",
        }
    }

    pub fn from_name(s: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|r| r.name() == s)
    }
}

/// One output of a run, described (the bytes live with the daemon).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub sha256: String,
    pub bytes: u64,
}

/// A finished run, as the daemon hands it to the store.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRecord {
    pub run_id: String,
    pub tenant: Option<String>,
    pub status: RunStatus,
    pub program_name: String,
    pub program_kind: String,
    pub program_sha256: String,
    pub program_source: Option<String>,
    pub policy_name: String,
    pub policy_version: u32,
    pub policy_sha256: String,
    pub labels: BTreeMap<String, String>,
    /// Microseconds since the Unix epoch.
    pub submitted_us: i64,
    pub started_us: Option<i64>,
    pub finished_us: i64,
    pub queue_us: u64,
    pub run_us: u64,
    pub error: Option<String>,
    pub outputs: Vec<OutputInfo>,
    pub explanation: Option<Explanation>,
    pub environment: Vec<(String, String)>,
}

/// A stored run without its explanation: what lists and status calls show.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    pub seq: u64,
    pub run_id: String,
    pub tenant: Option<String>,
    pub status: RunStatus,
    pub program_name: String,
    pub program_kind: String,
    pub program_sha256: String,
    pub policy_name: String,
    pub policy_version: u32,
    pub policy_sha256: String,
    pub labels: BTreeMap<String, String>,
    pub submitted_us: i64,
    pub finished_us: i64,
    pub queue_us: u64,
    pub run_us: u64,
    pub nodes: u64,
    pub fallbacks: u64,
    pub error: Option<String>,
    pub outputs: Vec<OutputInfo>,
}

impl RunRecord {
    /// Graph nodes and fallbacks, from the explanation (0 when the run was never planned).
    fn counts(&self) -> (u64, u64) {
        self.explanation
            .as_ref()
            .map_or((0, 0), |e| (e.decisions.len() as u64, e.fallbacks() as u64))
    }

    /// The summary the store returns for this record once committed as `seq`.
    pub fn summary(&self, seq: u64) -> RunSummary {
        let (nodes, fallbacks) = self.counts();
        RunSummary {
            seq,
            run_id: self.run_id.clone(),
            tenant: self.tenant.clone(),
            status: self.status,
            program_name: self.program_name.clone(),
            program_kind: self.program_kind.clone(),
            program_sha256: self.program_sha256.clone(),
            policy_name: self.policy_name.clone(),
            policy_version: self.policy_version,
            policy_sha256: self.policy_sha256.clone(),
            labels: self.labels.clone(),
            submitted_us: self.submitted_us,
            finished_us: self.finished_us,
            queue_us: self.queue_us,
            run_us: self.run_us,
            nodes,
            fallbacks,
            error: self.error.clone(),
            outputs: self.outputs.clone(),
        }
    }
}

/// Which runs a list returns: newest first, `before` (a sequence number from the previous
/// page's last run) pages back.
#[derive(Clone, Debug, Default)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub policy: Option<String>,
    /// `key=value` labels the run must all carry.
    pub labels: Vec<(String, String)>,
    pub before: Option<u64>,
    pub limit: usize,
}

/// Whose runs a caller may see: one tenant's, or every run (admin, or no tenants at all).
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    Tenant(&'a str),
    All,
}

/// The result of a read-only SQL query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SqlResult {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<serde_json::Value>>,
    /// More rows matched than `limit`.
    pub truncated: bool,
}

const DB_FILE: &str = "xpu.duckdb";
const INDEX_DIR: &str = "index";
const LOCK_FILE: &str = "store.lock";

pub struct Store {
    dir: PathBuf,
    /// The one writer; reads borrow a clone from `readers`.
    writer: Mutex<Writer>,
    readers: Mutex<Vec<Connection>>,
    index: index::SearchIndex,
    _lock: File,
}

struct Writer {
    conn: Connection,
    next_seq: u64,
}

fn io(dir: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io { dir: dir.to_path_buf(), message: e.to_string() }
}

fn micros(us: i64) -> DuckValue {
    DuckValue::Timestamp(TimeUnit::Microsecond, us)
}

fn opt_text(s: Option<&str>) -> DuckValue {
    s.map_or(DuckValue::Null, |s| DuckValue::Text(s.to_string()))
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, migrates it, and brings the search
    /// index up to the last committed run.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io(dir, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked { dir: dir.to_path_buf(), lock: lock_path });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(dir, e)),
        }
        // The store never reads files or loads extensions: a SQL query cannot either.
        let config =
            Config::default().enable_autoload_extension(false)?.enable_external_access(false)?;
        let mut conn = Connection::open_with_flags(dir.join(DB_FILE), config)?;
        schema::migrate(&mut conn)?;
        let last: i64 =
            conn.query_row("SELECT coalesce(max(seq), 0) FROM runs", [], |r| r.get(0))?;
        let index = index::SearchIndex::open(&dir.join(INDEX_DIR))?;
        let store = Store {
            dir: dir.to_path_buf(),
            writer: Mutex::new(Writer { conn, next_seq: last as u64 + 1 }),
            readers: Mutex::new(Vec::new()),
            index,
            _lock: lock,
        };
        store.index_pending()?;
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Commits finished runs in one transaction; returns their sequence numbers. When this
    /// returns Ok the runs are durable (DuckDB's WAL), so only then may they be reported
    /// complete. On error nothing of the batch is stored.
    pub fn commit(&self, runs: &[RunRecord]) -> Result<Vec<u64>, StoreError> {
        let mut w = self.writer.lock().map_err(|_| StoreError::Query("writer poisoned".into()))?;
        let first = w.next_seq;
        let tx = w.conn.transaction()?;
        {
            let mut app_runs = tx.appender("runs")?;
            let mut app_dec = tx.appender("decisions")?;
            let mut app_cand = tx.appender("candidates")?;
            let mut app_tr = tx.appender("transfers")?;
            let mut app_time = tx.appender("timings")?;
            let mut app_fact = tx.appender("facts")?;
            let mut app_env = tx.appender("environment")?;
            let mut app_labels = tx.appender("labels")?;
            for (i, r) in runs.iter().enumerate() {
                let seq = first + i as u64;
                let ex = r.explanation.as_ref();
                let (nodes, fallbacks) = r.counts();
                let labels = serde_json::to_string(&r.labels).unwrap_or_else(|_| "{}".into());
                let outputs = serde_json::to_string(&r.outputs).unwrap_or_else(|_| "[]".into());
                let explanation = ex.map(|e| serde_json::to_string(e).unwrap_or_default());
                let row: Vec<DuckValue> = vec![
                    DuckValue::BigInt(seq as i64),
                    DuckValue::Text(r.run_id.clone()),
                    opt_text(r.tenant.as_deref()),
                    DuckValue::Text(r.status.name().into()),
                    DuckValue::Text(r.program_name.clone()),
                    DuckValue::Text(r.program_kind.clone()),
                    DuckValue::Text(r.program_sha256.clone()),
                    opt_text(r.program_source.as_deref()),
                    DuckValue::Text(r.policy_name.clone()),
                    DuckValue::BigInt(r.policy_version as i64),
                    DuckValue::Text(r.policy_sha256.clone()),
                    DuckValue::Text(labels),
                    opt_text(ex.map(|e| e.graph_hash.as_str())),
                    opt_text(ex.map(|e| e.inventory.fingerprint.as_str())),
                    micros(r.submitted_us),
                    r.started_us.map_or(DuckValue::Null, micros),
                    micros(r.finished_us),
                    DuckValue::BigInt(r.queue_us as i64),
                    DuckValue::BigInt(r.run_us as i64),
                    DuckValue::BigInt(nodes as i64),
                    DuckValue::BigInt(fallbacks as i64),
                    opt_text(r.error.as_deref()),
                    DuckValue::Text(outputs),
                    opt_text(explanation.as_deref()),
                ];
                app_runs.append_row(duckdb::appender_params_from_iter(row))?;
                for (k, v) in &r.environment {
                    app_env.append_row(params![r.run_id, k, v])?;
                }
                for (k, v) in &r.labels {
                    app_labels.append_row(params![r.run_id, k, v])?;
                }
                let Some(ex) = ex else { continue };
                for d in &ex.decisions {
                    let node = d.node.0 as i64;
                    let c = d.chosen.as_ref();
                    let rule = d.rule.as_ref();
                    let f = d.fallback.as_ref();
                    app_dec.append_row(params![
                        r.run_id,
                        node,
                        d.name,
                        d.op.as_ref(),
                        d.class.as_ref(),
                        c.map(|c| c.engine.to_string()),
                        c.map(|c| c.kernel.to_string()),
                        c.and_then(|c| c.precision.as_deref().map(str::to_string)),
                        c.map(|c| c.device.to_string()),
                        rule.map(|r| r.key.to_string()),
                        rule.and_then(|r| r.at.as_deref().map(str::to_string)),
                        d.precision_from.as_ref().map(|p| p.key.to_string()),
                        f.map(|f| f.from.clone()),
                        f.map(|f| f.code.name()),
                        f.map(|f| f.detail.clone()),
                        xpu_plan::render::decision_sentence(d),
                    ])?;
                    for c in d.rejected.iter() {
                        app_cand.append_row(params![
                            r.run_id,
                            node,
                            c.engine,
                            c.kernel,
                            c.precision,
                            c.code.name(),
                            c.detail,
                            c.key.as_deref(),
                            c.at.as_deref(),
                        ])?;
                    }
                }
                for t in &ex.transfers {
                    app_tr.append_row(params![
                        r.run_id,
                        t.value.0 as i64,
                        t.direction,
                        t.bytes.map(|b| b as i64),
                        true
                    ])?;
                }
                for t in &ex.transfers_done {
                    app_tr.append_row(params![
                        r.run_id,
                        t.value.0 as i64,
                        t.direction,
                        t.bytes as i64,
                        false
                    ])?;
                }
                for t in &ex.timings {
                    app_time.append_row(params![
                        r.run_id,
                        t.node.0 as i64,
                        t.engine,
                        t.kernel,
                        t.nanos as i64
                    ])?;
                }
                for f in &ex.facts {
                    app_fact.append_row(params![
                        r.run_id,
                        f.engine,
                        f.node.map(|n| n.0 as i64),
                        f.key,
                        f.value
                    ])?;
                }
            }
            for app in [
                &mut app_runs,
                &mut app_dec,
                &mut app_cand,
                &mut app_tr,
                &mut app_time,
                &mut app_fact,
                &mut app_env,
                &mut app_labels,
            ] {
                app.flush()?;
            }
        }
        tx.commit()?;
        w.next_seq = first + runs.len() as u64;
        Ok((first..w.next_seq).collect())
    }

    /// A connection for reads (clones share the database; each is used by one caller).
    fn with_reader<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = {
            let mut pool =
                self.readers.lock().map_err(|_| StoreError::Query("pool poisoned".into()))?;
            match pool.pop() {
                Some(c) => c,
                None => {
                    let w = self
                        .writer
                        .lock()
                        .map_err(|_| StoreError::Query("writer poisoned".into()))?;
                    w.conn.try_clone()?
                }
            }
        };
        let out = f(&conn);
        if let Ok(mut pool) = self.readers.lock() {
            pool.push(conn);
        }
        out
    }

    const SUMMARY_COLUMNS: &'static str = "seq, run_id, tenant, status, program_name, program_kind, \
        program_sha256, policy_name, policy_version, labels, epoch_us(submitted_at), \
        epoch_us(finished_at), queue_us, run_us, nodes, fallbacks, error, outputs, policy_sha256";

    fn summary(r: &duckdb::Row<'_>) -> duckdb::Result<RunSummary> {
        let labels: String = r.get(9)?;
        let outputs: String = r.get(17)?;
        let status: String = r.get(3)?;
        Ok(RunSummary {
            seq: r.get::<_, i64>(0)? as u64,
            run_id: r.get(1)?,
            tenant: r.get(2)?,
            status: RunStatus::from_name(&status).unwrap_or(RunStatus::Failed),
            program_name: r.get(4)?,
            program_kind: r.get(5)?,
            program_sha256: r.get(6)?,
            policy_name: r.get(7)?,
            policy_version: r.get::<_, i64>(8)? as u32,
            labels: serde_json::from_str(&labels).unwrap_or_default(),
            submitted_us: r.get(10)?,
            finished_us: r.get(11)?,
            queue_us: r.get::<_, i64>(12)? as u64,
            run_us: r.get::<_, i64>(13)? as u64,
            nodes: r.get::<_, i64>(14)? as u64,
            fallbacks: r.get::<_, i64>(15)? as u64,
            error: r.get(16)?,
            outputs: serde_json::from_str(&outputs).unwrap_or_default(),
            policy_sha256: r.get(18)?,
        })
    }

    /// The run, if it exists and `scope` may see it.
    pub fn run(&self, run_id: &str, scope: Scope<'_>) -> Result<Option<RunSummary>, StoreError> {
        self.with_reader(|c| {
            let sql = format!(
                "SELECT {} FROM runs WHERE run_id = ? AND (? IS NULL OR tenant = ?)",
                Self::SUMMARY_COLUMNS
            );
            let tenant = scope_tenant(scope);
            let mut stmt = c.prepare(&sql)?;
            let mut rows = stmt.query(params![run_id, tenant, tenant])?;
            Ok(match rows.next()? {
                Some(r) => Some(Self::summary(r)?),
                None => None,
            })
        })
    }

    /// The run's stored explanation and program source.
    pub fn explanation(
        &self,
        run_id: &str,
        scope: Scope<'_>,
    ) -> Result<Option<(Option<Explanation>, Option<String>)>, StoreError> {
        let found: Option<(Option<String>, Option<String>)> = self.with_reader(|c| {
            let tenant = scope_tenant(scope);
            let mut stmt = c.prepare(
                "SELECT explanation, program_source FROM runs \
                 WHERE run_id = ? AND (? IS NULL OR tenant = ?)",
            )?;
            let mut rows = stmt.query(params![run_id, tenant, tenant])?;
            Ok(match rows.next()? {
                Some(r) => Some((r.get(0)?, r.get(1)?)),
                None => None,
            })
        })?;
        let Some((ex, source)) = found else { return Ok(None) };
        let ex = match ex {
            Some(text) => Some(
                serde_json::from_str(&text)
                    .map_err(|e| StoreError::Corrupt(run_id.to_string(), e.to_string()))?,
            ),
            None => None,
        };
        Ok(Some((ex, source)))
    }

    /// Runs newest first under `filter`, visible to `scope`.
    pub fn list(
        &self,
        filter: &RunFilter,
        scope: Scope<'_>,
    ) -> Result<Vec<RunSummary>, StoreError> {
        let mut sql = format!("SELECT {} FROM runs WHERE true", Self::SUMMARY_COLUMNS);
        let mut args: Vec<DuckValue> = Vec::new();
        if let Some(t) = scope_tenant(scope) {
            sql.push_str(" AND tenant = ?");
            args.push(DuckValue::Text(t.to_string()));
        }
        if let Some(s) = filter.status {
            sql.push_str(" AND status = ?");
            args.push(DuckValue::Text(s.name().into()));
        }
        if let Some(p) = &filter.policy {
            sql.push_str(" AND policy_name = ?");
            args.push(DuckValue::Text(p.clone()));
        }
        for (k, v) in &filter.labels {
            sql.push_str(
                " AND EXISTS (SELECT 1 FROM labels l WHERE l.run_id = runs.run_id \
                 AND l.key = ? AND l.value = ?)",
            );
            args.push(DuckValue::Text(k.clone()));
            args.push(DuckValue::Text(v.clone()));
        }
        if let Some(b) = filter.before {
            sql.push_str(" AND seq < ?");
            args.push(DuckValue::BigInt(b as i64));
        }
        sql.push_str(" ORDER BY seq DESC LIMIT ?");
        args.push(DuckValue::BigInt(filter.limit.clamp(1, 1000) as i64));
        self.with_reader(|c| {
            let mut stmt = c.prepare(&sql)?;
            let rows = stmt.query_map(duckdb::params_from_iter(args), Self::summary)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    /// Number of stored runs.
    pub fn count(&self) -> Result<u64, StoreError> {
        self.with_reader(|c| {
            Ok(c.query_row("SELECT count(*) FROM runs", [], |r| r.get::<_, i64>(0))? as u64)
        })
    }

    /// Full-text search over runs visible to `scope` (tantivy query syntax: words, "phrases",
    /// `field:value` for policy, status, label, engine, op, code, program).
    pub fn search(
        &self,
        query: &str,
        scope: Scope<'_>,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        self.index.search(query, scope_tenant(scope), limit.clamp(1, 1000))
    }

    /// Indexes every committed run the search index does not hold yet; returns how many.
    /// The daemon calls this at most a second apart; it is also run at open.
    pub fn index_pending(&self) -> Result<usize, StoreError> {
        let mut total = 0;
        loop {
            let after = self.index.last_seq();
            let batch = self.with_reader(|c| index::load_docs(c, after, 2000))?;
            if batch.is_empty() {
                return Ok(total);
            }
            total += batch.len();
            self.index.add(&batch)?;
        }
    }

    /// Drops the search index and rebuilds it from the database.
    pub fn reindex(&self) -> Result<usize, StoreError> {
        self.index.clear()?;
        self.index_pending()
    }

    /// The last sequence number committed to the database and the last one indexed.
    pub fn sequences(&self) -> Result<(u64, u64), StoreError> {
        let w = self.writer.lock().map_err(|_| StoreError::Query("writer poisoned".into()))?;
        Ok((w.next_seq - 1, self.index.last_seq()))
    }

    /// A read-only SQL query (admins): one statement that reads (SELECT, WITH, FROM,
    /// DESCRIBE, SHOW, SUMMARIZE, EXPLAIN), run in a transaction that is rolled back, on a
    /// database that cannot reach files. At most `limit` rows come back.
    pub fn sql(&self, query: &str, limit: usize) -> Result<SqlResult, StoreError> {
        let first = query
            .trim_start()
            .split(|c: char| c.is_whitespace() || c == '(')
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        const READS: &[&str] =
            &["SELECT", "WITH", "FROM", "DESCRIBE", "SHOW", "SUMMARIZE", "EXPLAIN", "VALUES"];
        if !READS.contains(&first.as_str()) {
            return Err(StoreError::Query(format!(
                "only reading statements are allowed ({}), not `{first}`",
                READS.join(", ")
            )));
        }
        self.with_reader(|c| {
            c.execute_batch("BEGIN TRANSACTION")?;
            let out = read_rows(c, query, limit);
            let _ = c.execute_batch("ROLLBACK");
            out
        })
    }
}

fn scope_tenant(scope: Scope<'_>) -> Option<&str> {
    match scope {
        Scope::Tenant(t) => Some(t),
        Scope::All => None,
    }
}

fn read_rows(c: &Connection, query: &str, limit: usize) -> Result<SqlResult, StoreError> {
    let mut stmt = c.prepare(query).map_err(|e| StoreError::Query(e.to_string()))?;
    let mut rows = stmt.query([]).map_err(|e| StoreError::Query(e.to_string()))?;
    let columns: Vec<String> = rows.as_ref().map(|s| s.column_names()).unwrap_or_default();
    let mut out = Vec::new();
    let mut truncated = false;
    while let Some(r) = rows.next()? {
        if out.len() == limit {
            truncated = true;
            break;
        }
        let mut row = Vec::with_capacity(columns.len());
        for i in 0..columns.len() {
            row.push(json_value(r.get_ref(i)?));
        }
        out.push(row);
    }
    Ok(SqlResult { columns, rows: out, truncated })
}

/// A DuckDB value as JSON: numbers and booleans as such, everything else as its text.
fn json_value(v: ValueRef<'_>) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        ValueRef::Null => J::Null,
        ValueRef::Boolean(b) => J::Bool(b),
        ValueRef::TinyInt(i) => J::from(i),
        ValueRef::SmallInt(i) => J::from(i),
        ValueRef::Int(i) => J::from(i),
        ValueRef::BigInt(i) => J::from(i),
        ValueRef::UTinyInt(i) => J::from(i),
        ValueRef::USmallInt(i) => J::from(i),
        ValueRef::UInt(i) => J::from(i),
        ValueRef::UBigInt(i) => J::from(i),
        ValueRef::Float(f) => J::from(f as f64),
        ValueRef::Double(f) => J::from(f),
        ValueRef::Text(t) => J::String(String::from_utf8_lossy(t).into_owned()),
        other => J::String(format!("{:?}", other.to_owned())),
    }
}
