//! The explanation store: one directory holding a DuckDB file (`xpu.duckdb`, the source of
//! truth: every run with its decisions, rejected candidates, transfers, timings, engine
//! facts and environment, written in one transaction per batch through DuckDB's Appender)
//! and a tantivy index (`index/`) derived from it for full-text search. A run is committed
//! whole or not at all; the index follows the runs' commit sequence and records the last
//! sequence it holds in its commit payload, so after a crash it catches up without
//! duplicates. One process owns a store at a time (`store.lock`); `xpud` and `xpuctl admin`
//! both open it through this crate.

mod asks;
mod files;
mod index;
pub mod schema;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use duckdb::types::{TimeUnit, Value as DuckValue, ValueRef};
use duckdb::{Config, Connection, params};
use serde::{Deserialize, Serialize};
use xpu_plan::Explanation;

pub use asks::{Accepted, AskAttemptRecord, AskExample, AskRecord, AskStatsRow, StoredAsk};
pub use files::KeptFile;
pub use index::{ASK_ID_PREFIX, HitKind, SearchHit};
pub use xpu_journal::Durability;
use xpu_journal::{EntryRef, Journal};

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
    #[error(
        "the database is {behind} runs behind the journal after {waited_s} s (last error: {error})"
    )]
    Behind { behind: u64, waited_s: u64, error: String },
    #[error("run {0}: stored explanation is unreadable: {1}")]
    Corrupt(String, String),
}

impl From<xpu_journal::JournalError> for StoreError {
    fn from(e: xpu_journal::JournalError) -> Self {
        StoreError::Io { dir: e.dir, message: e.message }
    }
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// The machine's fingerprint (`Machine::fingerprint`: CPU, features, engine
    /// versions): the store's evidence is kept per machine.
    #[serde(default)]
    pub machine: Option<String>,
}

/// One candidate's figures on one node signature, over a machine's stored runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvidenceRow {
    pub signature: String,
    pub engine: String,
    pub kernel: String,
    pub samples: u64,
    pub median_us: f64,
    pub p90_us: f64,
    /// Microseconds since the Unix epoch.
    pub last_seen_us: i64,
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
const JOURNAL_DIR: &str = "journal";
const LOCK_FILE: &str = "store.lock";
/// Most runs one database transaction takes from the journal.
const DB_BATCH: usize = 4096;
/// How long a read that needs the database waits for it to catch up with the journal.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);
/// Most runs held in memory between the journal and the database: past it, appends wait
/// for the feeder (memory stays bounded when runs finish faster than DuckDB takes them).
const MAX_PENDING: u64 = 20_000;

/// The most bytes of kept files held in memory for runs not yet committed: past it appends
/// wait for the feeder, as past `MAX_PENDING` runs.
const MAX_PENDING_FILE_BYTES: usize = 256 << 20;

/// Kept-file bytes in memory at which the feeder stops gathering and commits.
const GATHER_FILE_BYTES: usize = 16 << 20;

/// Least time between two of the feeder's transactions while runs keep coming (unless a
/// reader waits for the database, or a full batch is waiting): a DuckDB commit costs about
/// the same for one run as for hundreds, and the feeder's CPU is taken from the requests on
/// a small machine. Reads by run id are served from memory meanwhile; lists and SQL settle.
const COMMIT_INTERVAL: Duration = Duration::from_millis(50);

/// Largest kept file carried in a journal frame; a larger one is written out before its run
/// is journaled (its write is small beside the work that made it, and memory stays bounded).
const JOURNALED_FILE_BYTES: usize = 1 << 20;

/// How the store is opened.
#[derive(Default)]
pub struct StoreOptions {
    pub durability: Durability,
    /// DuckDB's memory limit in MiB (its buffer pool and query memory): the pages of the
    /// runs table it keeps are bounded by it instead of growing with the table. `None`:
    /// DuckDB's default (80% of the machine's memory).
    pub memory_limit_mb: Option<u64>,
    /// Called after every database transaction the store makes from the journal: how long
    /// it took, how many runs it held, and its error if it failed (it is retried).
    pub on_commit: Option<Box<dyn Fn(Duration, usize, Option<&StoreError>) + Send + Sync>>,
}

/// Where the runs are: the last sequence number journaled (acknowledged), committed to the
/// database, and indexed for search.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub journaled: u64,
    pub committed: u64,
    pub indexed: u64,
}

/// The database writer held by [`Store::stall_writer`].
#[doc(hidden)]
pub struct WriterStall<'a>(#[allow(dead_code)] std::sync::MutexGuard<'a, Connection>);

pub struct Store {
    shared: Arc<Shared>,
    /// Feeds the database from the journal; stopped (after catching up) when the store drops.
    feeder: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Runs the journal held beyond the database at open (acknowledged before a crash).
    replayed: u64,
}

struct Shared {
    dir: PathBuf,
    /// The one database writer; reads borrow a clone from `readers`.
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    index: index::SearchIndex,
    /// Appends take this first, then `state`.
    journal: Mutex<Journal>,
    state: Mutex<Pipeline>,
    /// `fdatasync` kept files before their runs are committed (durability = machine).
    sync_files: bool,
    /// Signalled when runs are journaled (the feeder wakes) and when they are committed
    /// (readers waiting for the database wake).
    changed: Condvar,
    stop: AtomicBool,
    on_commit: Option<Box<dyn Fn(Duration, usize, Option<&StoreError>) + Send + Sync>>,
    _lock: File,
}

/// Runs between the journal and the database.
#[derive(Default)]
struct Pipeline {
    /// Journaled but not yet committed, by sequence number.
    pending: BTreeMap<u64, Arc<RunRecord>>,
    by_id: HashMap<String, u64>,
    /// The files pending runs carry, by sequence number and by path (see [`files`]).
    files: BTreeMap<u64, Vec<Arc<KeptFile>>>,
    by_path: HashMap<String, Arc<KeptFile>>,
    /// The bytes of `files`.
    file_bytes: usize,
    journaled: u64,
    committed: u64,
    /// Readers waiting for the database to take in what is journaled ([`Shared::settle`]):
    /// the feeder commits at once for them.
    settling: usize,
    /// The last database error while the feeder retries.
    failing: Option<String>,
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

fn poisoned(what: &str) -> StoreError {
    StoreError::Query(format!("{what} poisoned"))
}

impl Store {
    /// Opens (creating if needed) the store in `dir` with the default options.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(dir, StoreOptions::default())
    }

    /// Opens (creating if needed) the store in `dir`, migrates it, commits whatever the
    /// journal holds beyond the database (a crash's acknowledged runs), and brings the
    /// search index up to the last committed run.
    pub fn open_with(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
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
        // One DuckDB thread: the store's work is appends and small reads, and the cores
        // belong to the jobs.
        let mut config = Config::default()
            .enable_autoload_extension(false)?
            .enable_external_access(false)?
            .threads(1)?;
        if let Some(mib) = options.memory_limit_mb {
            config = config.max_memory(&format!("{mib}MiB"))?;
        }
        let mut conn = Connection::open_with_flags(dir.join(DB_FILE), config)?;
        schema::migrate(&mut conn)?;
        let last: i64 =
            conn.query_row("SELECT coalesce(max(seq), 0) FROM runs", [], |r| r.get(0))?;
        let mut committed = last as u64;
        let (mut journal, entries) =
            Journal::open::<RunRecord>(&dir.join(JOURNAL_DIR), options.durability)?;
        // Runs acknowledged before a crash and not yet in the database; those at or below
        // `committed` made it in before the journal was released (their files before them).
        let sync_files = options.durability == Durability::Machine;
        let replay: Vec<_> = entries.into_iter().filter(|e| e.seq > committed).collect();
        let replayed = replay.len() as u64;
        for chunk in replay.chunks(DB_BATCH) {
            let files: Vec<Arc<KeptFile>> =
                chunk.iter().flat_map(|e| e.files.iter().cloned().map(Arc::new)).collect();
            files::write_all(dir, &files, sync_files).map_err(|e| io(dir, e))?;
            let rows: Vec<(u64, &RunRecord)> = chunk.iter().map(|e| (e.seq, &e.record)).collect();
            write_runs(&mut conn, &rows)?;
            committed = chunk.last().map_or(committed, |c| c.seq);
        }
        journal.release(committed, committed + 1, true)?;
        let index = index::SearchIndex::open(&dir.join(INDEX_DIR))?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            writer: Mutex::new(conn),
            readers: Mutex::new(Vec::new()),
            index,
            journal: Mutex::new(journal),
            state: Mutex::new(Pipeline { journaled: committed, committed, ..Pipeline::default() }),
            sync_files,
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            on_commit: options.on_commit,
            _lock: lock,
        });
        let s = shared.clone();
        let feeder = std::thread::Builder::new()
            .name("xpu-store".into())
            .spawn(move || s.feed())
            .map_err(|e| io(dir, e))?;
        let store = Store { shared, feeder: Mutex::new(Some(feeder)), replayed };
        store.index_pending()?;
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// How many runs the journal held beyond the database at open (acknowledged before a
    /// crash, committed then).
    pub fn replayed(&self) -> u64 {
        self.replayed
    }

    /// Journals finished runs (one write) and returns their sequence numbers. When this
    /// returns Ok the runs are acknowledged: they survive a crash of this process (and with
    /// [`Durability::Machine`], of the machine), reads by run id find them at once, and the
    /// database receives them in the background. On error nothing of the batch is stored.
    pub fn append(&self, runs: Vec<RunRecord>) -> Result<Vec<u64>, StoreError> {
        self.append_with_files(runs.into_iter().map(|r| (r, Vec::new())).collect())
    }

    /// [`append`](Store::append), each run with the files it keeps beside its record, under
    /// paths relative to the store's directory: acknowledged with the run (in its journal
    /// frame), readable at once through [`read_kept`](Store::read_kept), and written out
    /// under the store's directory in the background, before the run is committed.
    pub fn append_with_files(
        &self,
        runs: Vec<(RunRecord, Vec<KeptFile>)>,
    ) -> Result<Vec<u64>, StoreError> {
        let sh = &self.shared;
        if let Some(bad) = runs.iter().flat_map(|(_, f)| f).find(|f| !files::valid_path(&f.path)) {
            return Err(io(
                &sh.dir,
                format!("kept file `{}` is not a relative path inside the store", bad.path),
            ));
        }
        // Small files ride in the frame; a large one is written out first.
        let mut large: Vec<Arc<KeptFile>> = Vec::new();
        let (runs, files): (Vec<RunRecord>, Vec<Vec<Arc<KeptFile>>>) = runs
            .into_iter()
            .map(|(record, run_files)| {
                let (big, small): (Vec<_>, Vec<_>) =
                    run_files.into_iter().partition(|f| f.bytes.len() > JOURNALED_FILE_BYTES);
                large.extend(big.into_iter().map(Arc::new));
                (record, small.into_iter().map(Arc::new).collect())
            })
            .unzip();
        files::write_all(&sh.dir, &large, sh.sync_files).map_err(|e| io(&sh.dir, e))?;
        {
            let state = sh.state.lock().map_err(|_| poisoned("store state"))?;
            let _caught_up = sh
                .changed
                .wait_timeout_while(state, SETTLE_LIMIT, |s| {
                    (s.journaled - s.committed >= MAX_PENDING
                        || s.file_bytes >= MAX_PENDING_FILE_BYTES)
                        && s.failing.is_none()
                })
                .map_err(|_| poisoned("store state"))?;
        }
        let mut journal = sh.journal.lock().map_err(|_| poisoned("journal"))?;
        let first = sh.state.lock().map_err(|_| poisoned("store state"))?.journaled + 1;
        let entries: Vec<EntryRef<'_, RunRecord>> = runs
            .iter()
            .enumerate()
            .zip(&files)
            .map(|((i, record), files)| EntryRef { seq: first + i as u64, record, files })
            .collect();
        // A cached plan's decisions are the same for each of its runs: written once.
        xpu_plan::model::writing_compact_json(|| journal.append(&entries))?;
        drop(entries);
        let mut state = sh.state.lock().map_err(|_| poisoned("store state"))?;
        let seqs: Vec<u64> = (first..first + runs.len() as u64).collect();
        for ((seq, record), files) in seqs.iter().zip(runs).zip(files) {
            state.by_id.insert(record.run_id.clone(), *seq);
            state.pending.insert(*seq, Arc::new(record));
            if !files.is_empty() {
                for f in &files {
                    state.file_bytes += f.bytes.len();
                    state.by_path.insert(f.path.clone(), f.clone());
                }
                state.files.insert(*seq, files);
            }
        }
        // The feeder sleeps until something is pending, then gathers until a batch is full
        // (or its interval ends, or a reader settles, which wakes it itself): only those
        // moments need a wake-up, not every run (a futex call and a context switch each).
        let was_idle = state.journaled == state.committed;
        state.journaled = first + seqs.len() as u64 - 1;
        let full = state.journaled - state.committed >= DB_BATCH as u64
            || state.file_bytes >= GATHER_FILE_BYTES;
        drop(state);
        drop(journal);
        if was_idle || full {
            sh.changed.notify_all();
        }
        Ok(seqs)
    }

    /// Whether an [`append`](Store::append) now might wait for the database: it is half way
    /// to the in-memory bound of runs it has not taken yet, or it is failing. Callers that
    /// must not block (an async thread) go elsewhere then.
    pub fn backlogged(&self) -> bool {
        self.shared.state.lock().map_or(true, |s| {
            s.journaled - s.committed >= MAX_PENDING / 2
                || s.file_bytes >= MAX_PENDING_FILE_BYTES / 2
                || s.failing.is_some()
        })
    }

    /// The bytes of a file a run kept (`path` relative to the store's directory): from
    /// memory while its run is pending, else from disk.
    pub fn read_kept(&self, path: &str) -> std::io::Result<Vec<u8>> {
        if !files::valid_path(path) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{path}` is not a relative path inside the store"),
            ));
        }
        let pending = self.shared.state.lock().ok().and_then(|s| s.by_path.get(path).cloned());
        match pending {
            Some(file) => Ok(file.bytes.clone()),
            // The feeder drops a file from memory only once it is on disk.
            None => std::fs::read(self.shared.dir.join(path)),
        }
    }

    /// Whether a file a run kept is pending (in memory, not yet written out).
    pub fn kept_pending(&self, path: &str) -> bool {
        self.shared.state.lock().is_ok_and(|s| s.by_path.contains_key(path))
    }

    /// Stores finished runs and returns once the database holds them (for callers that read
    /// the database straight after, and tests).
    pub fn commit(&self, runs: &[RunRecord]) -> Result<Vec<u64>, StoreError> {
        let seqs = self.append(runs.to_vec())?;
        if let Some(&last) = seqs.last() {
            self.shared.settle(last)?;
        }
        Ok(seqs)
    }

    /// Waits until the database holds every run journaled so far.
    pub fn settle(&self) -> Result<(), StoreError> {
        let target = self.shared.state.lock().map_err(|_| poisoned("store state"))?.journaled;
        self.shared.settle(target)
    }

    /// Stops taking runs into the database once it holds every run journaled so far, and
    /// removes the journal if so (a later `append` is still journaled, and replayed at the
    /// next open). Called on drop; a daemon calls it when it stops.
    pub fn close(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.changed.notify_all();
        if let Some(feeder) = self.feeder.lock().ok().and_then(|mut f| f.take()) {
            let _ = feeder.join();
        }
        // Everything committed: the journal is no longer needed.
        if let (Ok(state), Ok(mut journal)) = (self.shared.state.lock(), self.shared.journal.lock())
            && state.committed == state.journaled
        {
            let _ = journal.release(state.committed, state.journaled + 1, true);
        }
    }

    /// A journaled run not yet in the database, with its sequence number, if `scope` may
    /// see it.
    fn pending(&self, run_id: &str, scope: Scope<'_>) -> Option<(u64, Arc<RunRecord>)> {
        let state = self.shared.state.lock().ok()?;
        let seq = *state.by_id.get(run_id)?;
        let record = state.pending.get(&seq)?;
        match scope_tenant(scope) {
            Some(t) if record.tenant.as_deref() != Some(t) => None,
            _ => Some((seq, record.clone())),
        }
    }

    /// The text of the run's program (MiniLang or SGR; none for ONNX), if `scope` may see
    /// the run.
    pub fn program_source(
        &self,
        run_id: &str,
        scope: Scope<'_>,
    ) -> Result<Option<String>, StoreError> {
        if let Some((_, record)) = self.pending(run_id, scope) {
            return Ok(record.program_source.clone());
        }
        self.with_reader(|c| {
            let tenant = scope_tenant(scope);
            let mut stmt = c.prepare(
                "SELECT program_source FROM runs WHERE run_id = ? AND (? IS NULL OR tenant = ?)",
            )?;
            let mut rows = stmt.query(params![run_id, tenant, tenant])?;
            Ok(match rows.next()? {
                Some(r) => r.get(0)?,
                None => None,
            })
        })
    }

    /// A connection for reads (clones share the database; each is used by one caller).
    fn with_reader<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = {
            let mut pool = self.shared.readers.lock().map_err(|_| poisoned("pool"))?;
            match pool.pop() {
                Some(c) => c,
                None => self.shared.writer.lock().map_err(|_| poisoned("writer"))?.try_clone()?,
            }
        };
        let out = f(&conn);
        if let Ok(mut pool) = self.shared.readers.lock() {
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
        if let Some((seq, record)) = self.pending(run_id, scope) {
            return Ok(Some(record.summary(seq)));
        }
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
        if let Some((_, record)) = self.pending(run_id, scope) {
            return Ok(Some((record.explanation.clone(), record.program_source.clone())));
        }
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
        // Lists read the database: it first takes in every run acknowledged so far.
        self.settle()?;
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
        self.settle()?;
        self.with_reader(|c| {
            Ok(c.query_row("SELECT count(*) FROM runs", [], |r| r.get::<_, i64>(0))? as u64)
        })
    }

    /// Full-text search over runs and asks visible to `scope` (tantivy query syntax: words,
    /// "phrases", `field:value` for policy, status, label, engine, op, code, program, and
    /// `kind:run` / `kind:ask`).
    pub fn search(
        &self,
        query: &str,
        scope: Scope<'_>,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        self.shared.index.search(query, scope_tenant(scope), limit.clamp(1, 1000))
    }

    /// Indexes every committed run (and stored ask) the search index does not hold yet;
    /// returns how many. The daemon calls this at most a second apart; it is also run at
    /// open.
    pub fn index_pending(&self) -> Result<usize, StoreError> {
        let mut total = self.index_pending_asks()?;
        loop {
            let after = self.shared.index.last_seq();
            let batch = self.with_reader(|c| index::load_docs(c, after, 2000))?;
            if batch.is_empty() {
                return Ok(total);
            }
            total += batch.len();
            self.shared.index.add(&batch)?;
        }
    }

    /// Drops the search index and rebuilds it from the database.
    pub fn reindex(&self) -> Result<usize, StoreError> {
        self.shared.index.clear()?;
        self.index_pending()
    }

    /// Holds the database writer until the guard drops, as a stuck disk or a long
    /// transaction would: runs stay journaled and reads that need the database wait. For
    /// tests of what must not wait on the store.
    #[doc(hidden)]
    pub fn stall_writer(&self) -> WriterStall<'_> {
        WriterStall(self.shared.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// How far the runs have gone: journaled, committed to the database, indexed.
    pub fn progress(&self) -> Result<Progress, StoreError> {
        let state = self.shared.state.lock().map_err(|_| poisoned("store state"))?;
        Ok(Progress {
            journaled: state.journaled,
            committed: state.committed,
            indexed: self.shared.index.last_seq(),
        })
    }

    /// The evidence of the runs stored for `machine` (a fingerprint): per node signature
    /// and candidate its timed runs, median, p90 and last run; only `signatures` when
    /// given. Every run committed so far is counted.
    pub fn evidence(
        &self,
        machine: &str,
        signatures: Option<&[String]>,
    ) -> Result<Vec<EvidenceRow>, StoreError> {
        self.settle()?;
        self.with_reader(|c| {
            let mut sql = String::from(
                "SELECT signature, engine, kernel, samples, median_us, p90_us, \
                 epoch_us(last_seen) FROM evidence WHERE machine = ?",
            );
            let mut args: Vec<DuckValue> = vec![DuckValue::Text(machine.to_string())];
            if let Some(sigs) = signatures {
                // One text parameter split in SQL (the driver binds no lists); a name with
                // a comma in it matches nothing, as it names no signature.
                sql.push_str(" AND list_contains(string_split(?, ','), signature)");
                args.push(DuckValue::Text(sigs.join(",")));
            }
            sql.push_str(" ORDER BY signature, median_us, kernel");
            let mut stmt = c.prepare(&sql)?;
            let rows = stmt.query_map(duckdb::params_from_iter(args), |r| {
                Ok(EvidenceRow {
                    signature: r.get(0)?,
                    engine: r.get(1)?,
                    kernel: r.get(2)?,
                    samples: r.get::<_, i64>(3)? as u64,
                    median_us: r.get(4)?,
                    p90_us: r.get(5)?,
                    last_seen_us: r.get(6)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
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
        self.settle()?;
        self.with_reader(|c| {
            c.execute_batch("BEGIN TRANSACTION")?;
            let out = read_rows(c, query, limit);
            let _ = c.execute_batch("ROLLBACK");
            out
        })
    }
}

impl Shared {
    /// Waits until the database holds every run up to `target`.
    fn settle(&self, target: u64) -> Result<(), StoreError> {
        let mut state = self.state.lock().map_err(|_| poisoned("store state"))?;
        if state.committed >= target {
            return Ok(());
        }
        state.settling += 1;
        self.changed.notify_all();
        let (mut state, waited) = self
            .changed
            .wait_timeout_while(state, SETTLE_LIMIT, |s| s.committed < target)
            .map_err(|_| poisoned("store state"))?;
        state.settling -= 1;
        if waited.timed_out() && state.committed < target {
            return Err(StoreError::Behind {
                behind: target - state.committed,
                waited_s: SETTLE_LIMIT.as_secs(),
                error: state.failing.clone().unwrap_or_else(|| "none; it is busy".into()),
            });
        }
        Ok(())
    }

    /// The feeder: writes out the files of journaled runs and commits the runs to the
    /// database in batches (whatever has piled up while it gathered, see
    /// `COMMIT_INTERVAL`), then releases the journal segments it no longer needs. A failed
    /// transaction is retried, backing off up to a second: the runs stay in the journal
    /// and in memory, so nothing acknowledged is lost. When the store drops it
    /// catches up before it ends (unless the database keeps failing; the journal is then
    /// replayed at the next open).
    fn feed(&self) {
        lower_priority();
        let mut backoff = Duration::from_millis(10);
        let mut last_commit = Instant::now() - COMMIT_INTERVAL;
        loop {
            let (batch, files): (Vec<(u64, Arc<RunRecord>)>, Vec<Arc<KeptFile>>) = {
                let Ok(state) = self.state.lock() else { return };
                let Ok(state) = self.changed.wait_while(state, |s| {
                    s.committed == s.journaled && !self.stop.load(Ordering::Acquire)
                }) else {
                    return;
                };
                // Let runs gather into one transaction, unless someone waits for them.
                let gather = COMMIT_INTERVAL.saturating_sub(last_commit.elapsed());
                let Ok((state, _)) = self.changed.wait_timeout_while(state, gather, |s| {
                    s.journaled - s.committed < DB_BATCH as u64
                        && s.file_bytes < GATHER_FILE_BYTES
                        && s.settling == 0
                        && !self.stop.load(Ordering::Acquire)
                }) else {
                    return;
                };
                if state.committed == state.journaled {
                    return; // stopping, and everything is in
                }
                let batch: Vec<_> =
                    state.pending.iter().take(DB_BATCH).map(|(k, v)| (*k, v.clone())).collect();
                let last = batch.last().map_or(0, |b| b.0);
                let files = state.files.range(..=last).flat_map(|(_, f)| f.iter().cloned());
                (batch, files.collect())
            };
            let rows: Vec<(u64, &RunRecord)> = batch.iter().map(|(k, v)| (*k, &**v)).collect();
            let start = Instant::now();
            last_commit = start;
            // Files first: a run in the database has its files on disk.
            let result = files::write_all(&self.dir, &files, self.sync_files)
                .map_err(|e| io(&self.dir, format!("writing a run's kept files: {e}")))
                .and_then(|()| match self.writer.lock() {
                    Ok(mut conn) => write_runs(&mut conn, &rows),
                    Err(_) => Err(poisoned("writer")),
                });
            if let Some(observe) = &self.on_commit {
                observe(start.elapsed(), rows.len(), result.as_ref().err());
            }
            let last = rows.last().map_or(0, |r| r.0);
            let Ok(mut state) = self.state.lock() else { return };
            match result {
                Ok(()) => {
                    for (seq, record) in &batch {
                        state.pending.remove(seq);
                        state.by_id.remove(&record.run_id);
                        if let Some(filed) = state.files.remove(seq) {
                            let bytes: usize = filed.iter().map(|f| f.bytes.len()).sum();
                            state.file_bytes = state.file_bytes.saturating_sub(bytes);
                        }
                    }
                    for f in &files {
                        // Unless a later run keeps the same path (a shared blob), still pending.
                        if state.by_path.get(&f.path).is_some_and(|p| Arc::ptr_eq(p, f)) {
                            state.by_path.remove(&f.path);
                        }
                    }
                    state.committed = last;
                    state.failing = None;
                    let next = state.journaled + 1;
                    drop(state);
                    self.changed.notify_all();
                    backoff = Duration::from_millis(10);
                    if let Ok(mut journal) = self.journal.lock()
                        && let Err(e) = journal.release(last, next, false)
                    {
                        tracing::warn!("journal release: {e}");
                    }
                }
                Err(e) => {
                    state.failing = Some(e.to_string());
                    drop(state);
                    self.changed.notify_all();
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

/// Lowers the calling thread to nice 10: the store's background work (taking journaled runs
/// into DuckDB, indexing) yields to requests and jobs, which keeps request latency flat,
/// but still gets about a tenth of a busy core's time under sustained load, so a finished
/// run becomes searchable within the promised second. (The idle class, SCHED_IDLE, starved
/// it for seconds while both cores ran jobs.) Threads it spawns inherit the nice value;
/// Linux sets it per thread.
pub fn lower_priority() {
    // SAFETY: setpriority only reads its arguments; who 0 is the calling thread.
    unsafe {
        let _ = libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

/// Writes runs with their sequence numbers in one transaction, through the Appender.
fn write_runs(conn: &mut Connection, runs: &[(u64, &RunRecord)]) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    {
        let mut app_runs = tx.appender("runs")?;
        let mut app_dec = tx.appender("decisions")?;
        let mut app_cand = tx.appender("candidates")?;
        let mut app_tr = tx.appender("transfers")?;
        let mut app_time = tx.appender("timings")?;
        let mut app_fact = tx.appender("facts")?;
        let mut app_env = tx.appender("environment")?;
        let mut app_labels = tx.appender("labels")?;
        for &(seq, r) in runs {
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
                opt_text(r.machine.as_deref()),
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
                    c.and_then(|c| c.precision.map(|p| p.name().to_string())),
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
                        c.precision.map(|p| p.name()),
                        c.code.name(),
                        c.detail,
                        c.key.as_deref(),
                        c.at.as_deref(),
                    ])?;
                }
            }
            // Planned transfers (bytes known when shapes are) and the ones that ran.
            let planned = ex.transfers.iter().map(|t| (t.value, t.direction.name(), t.bytes, true));
            let done = ex
                .transfers_done
                .iter()
                .map(|t| (t.value, t.direction.name(), Some(t.bytes), false));
            for (value, direction, bytes, planned) in planned.chain(done) {
                app_tr.append_row(params![
                    r.run_id,
                    value.0 as i64,
                    direction,
                    bytes.map(|b| b as i64),
                    planned
                ])?;
            }
            for t in &ex.timings {
                app_time.append_row(params![
                    r.run_id,
                    t.node.0 as i64,
                    t.engine,
                    t.kernel,
                    t.nanos as i64,
                    t.signature.map(|s| s.to_string()),
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
    Ok(())
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
        // 128-bit integers (`sum` over BIGINT gives one) as numbers where JSON's integers
        // hold them, else as their decimal digits; decimals exactly, as their digits.
        ValueRef::HugeInt(i) => i64::try_from(i).map_or_else(|_| J::String(i.to_string()), J::from),
        ValueRef::UHugeInt(u) => {
            u64::try_from(u).map_or_else(|_| J::String(u.to_string()), J::from)
        }
        ValueRef::Decimal(d) => J::String(d.to_string()),
        other => J::String(format!("{:?}", other.to_owned())),
    }
}
