//! The table engine: SGR-ML ops of class `table` (load, filter, group, pivot, join, …) run
//! as SQL on one in-memory DuckDB connection per engine instance — one per job. Each node
//! becomes a view or a table named after it, so a chain of nodes is one query DuckDB
//! optimises as a whole; the SQL of every node is reported as a fact and lands in the
//! explanation. The connection may read and write only inside the job's data roots
//! (`allowed_directories`, external access otherwise off, configuration locked). It also
//! answers schema questions at compile time ([`TableEngine::source_schema`]), with the same
//! reader, so the columns a program is checked against are the ones it will get. A second
//! kernel, `table.native`, computes `describe` ([`native`]) and the group-by of a plainly
//! numeric CSV file ([`group`]) in Rust, scanning the file directly.

mod csv_dialect;
mod exec;
pub mod group;
pub mod native;
mod plot;
pub mod sql;
mod xlsx;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use duckdb::Connection;
use xpu_engine::{
    Assignment, Availability, Capabilities, Device, Engine, EngineError, Executable, KernelCaps,
};
use xpu_ir::{Attrs, DType, Graph, Op, OpClass};

pub use exec::{load_table, materialize};

/// DuckDB's vectorised SQL engine: every table op.
pub const KERNEL: &str = "table.duckdb";
/// `describe` ([`native`]) and `group_by |> agg` over a plainly numeric CSV file
/// ([`group`]) in Rust: the file scanned once in parallel. The engine's first choice for
/// both; a policy may pin `table.duckdb`. A group-by it cannot compute natively (its input is
/// not such a file, an aggregate it lacks) runs DuckDB's statement, and the run's facts and
/// timings say so.
pub const NATIVE_KERNEL: &str = "table.native";

/// The shared job connection. DuckDB's `Connection` is `Send` but not `Sync`.
type SharedConnection = Arc<Mutex<Connection>>;

pub struct TableEngine {
    roots: Vec<PathBuf>,
    connection: Mutex<Option<SharedConnection>>,
    /// Numbers executables, so relation names of two partitions never collide.
    executables: AtomicUsize,
    /// Compile-time schema answers ([`TableEngine::source_schema`]).
    schemas: Mutex<std::collections::HashMap<String, SchemaAnswer>>,
}

type SchemaAnswer = Result<Vec<(String, DType)>, String>;

impl std::fmt::Debug for TableEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableEngine").field("roots", &self.roots).finish()
    }
}

/// Refuses a file outside the engine's data roots, for the readers that do not go through
/// DuckDB (workbooks, the native CSV scan): the compiler resolved the path already; this
/// keeps the engine safe on its own.
pub(crate) fn confined(path: &str, what: &str, roots: &[PathBuf]) -> Result<PathBuf, String> {
    let p = std::path::Path::new(path)
        .canonicalize()
        .map_err(|e| format!("cannot open {what} {path}: {e}"))?;
    if roots.iter().any(|r| p.starts_with(r)) {
        Ok(p)
    } else {
        Err(format!("{path} is outside the data roots"))
    }
}

fn duck(e: duckdb::Error) -> EngineError {
    EngineError::Other(format!("duckdb: {e}"))
}

impl TableEngine {
    /// An engine whose DuckDB connection may touch files only under `roots` (canonicalised
    /// where they exist).
    pub fn new(roots: Vec<PathBuf>) -> TableEngine {
        let roots = roots.into_iter().map(|r| r.canonicalize().unwrap_or(r)).collect();
        TableEngine::with_canonical_roots(roots)
    }

    /// [`TableEngine::new`] for roots already canonical (as `DataRoots` holds them): a
    /// daemon makes one engine per job and need not resolve the same paths each time.
    pub fn with_canonical_roots(roots: Vec<PathBuf>) -> TableEngine {
        TableEngine {
            roots,
            connection: Mutex::new(None),
            executables: AtomicUsize::new(0),
            schemas: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Opens the confined connection: external access only inside the roots, no extension
    /// downloads or loads, `threads` worker threads, DuckDB's memory bounded by the policy's
    /// memory.limit (`memory_limit` bytes), then the configuration locked so no statement
    /// can loosen it.
    fn open(
        &self,
        threads: Option<usize>,
        memory_limit: Option<u64>,
    ) -> Result<Connection, EngineError> {
        let conn = Connection::open_in_memory().map_err(duck)?;
        let dirs: Vec<String> = self
            .roots
            .iter()
            .map(|r| {
                let mut s = r.display().to_string();
                if !s.ends_with('/') {
                    s.push('/');
                }
                sql::lit(&s)
            })
            .collect();
        let mut setup = format!(
            "SET allowed_directories = [{}];
             SET enable_external_access = false;
             SET autoinstall_known_extensions = false;
             SET autoload_known_extensions = false;",
            dirs.join(", ")
        );
        if let Some(t) = threads.filter(|t| *t > 0) {
            setup.push_str(&format!("SET threads = {t};"));
        }
        if let Some(bytes) = memory_limit {
            setup.push_str(&format!("SET memory_limit = '{bytes}B';"));
        }
        setup.push_str("SET lock_configuration = true;");
        conn.execute_batch(&setup).map_err(duck)?;
        Ok(conn)
    }

    fn connection(
        &self,
        threads: Option<usize>,
        memory_limit: Option<u64>,
    ) -> Result<SharedConnection, EngineError> {
        let mut slot = self.connection.lock().map_err(|_| EngineError::Other("poisoned".into()))?;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let c = Arc::new(Mutex::new(self.open(threads, memory_limit)?));
        *slot = Some(c.clone());
        Ok(c)
    }

    /// The sheets of an Excel workbook inside the roots, in order.
    pub fn workbook_sheets(&self, path: &str) -> Result<Vec<String>, String> {
        xlsx::sheet_names(path, &self.roots)
    }

    /// The columns (name, dtype) a read node (`read_csv`, `read_xlsx`, `read_parquet`) will
    /// produce, found by the same reader that runs it. Used by MiniLang at compile time.
    /// Answers are remembered for the engine's life (one compile, one REPL session), keyed
    /// by the read's attributes and the file's size and modification time: a program that
    /// names a file twice, or checks and then lowers it, sniffs it once.
    pub fn source_schema(&self, op: Op, attrs: &Attrs) -> Result<Vec<(String, DType)>, String> {
        let stamp =
            std::fs::metadata(attrs.str("path", "")).ok().map(|m| (m.len(), m.modified().ok()));
        let key = format!("{op}|{attrs:?}|{stamp:?}");
        if let Some(hit) = self.schemas.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return hit;
        }
        let answer = self.sniff_schema(op, attrs);
        if let Ok(mut cache) = self.schemas.lock() {
            cache.insert(key, answer.clone());
        }
        answer
    }

    fn sniff_schema(&self, op: Op, attrs: &Attrs) -> Result<Vec<(String, DType)>, String> {
        if op == Op::ReadXlsx {
            return xlsx::schema(attrs, &self.roots);
        }
        let source = exec::source_sql(op, attrs).map_err(|e| e.to_string())?;
        if op == Op::ReadCsv
            && attrs.int("header", 1) != 0
            && let [sep] = attrs.str("sep", ",").as_bytes()
            && let Some(schema) = native::numeric_schema(
                attrs.str("path", ""),
                *sep,
                attrs.strs("na_values").unwrap_or(&[]),
                &self.roots,
            )
        {
            return Ok(schema);
        }
        let conn = self.connection(None, None).map_err(|e| e.to_string())?;
        let conn = conn.lock().map_err(|_| "poisoned connection".to_string())?;
        exec::describe(&conn, &format!("SELECT * FROM {source}"))
            .map(|cols| cols.into_iter().map(|(n, t)| (n, sql::dtype_of_sql(&t))).collect())
            .map_err(|e| exec::brief(&e))
    }
}

impl Engine for TableEngine {
    fn name(&self) -> &str {
        "table"
    }

    fn version(&self) -> String {
        format!("duckdb {}", duckdb_version())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            engine: "table".into(),
            version: self.version(),
            availability: Availability::Available,
            devices: vec![Device::host()],
            kernels: vec![
                KernelCaps {
                    device: None,
                    operand_dtypes: Vec::new(),
                    op_dtypes: Vec::new(),
                    name: NATIVE_KERNEL.into(),
                    ops: vec![Op::Describe, Op::GroupAgg],
                    classes: vec![],
                    dtypes: vec![DType::Table],
                    deterministic: true,
                    description: "describe, and group_by/agg over a plainly numeric CSV \
                                  file, in Rust: one parallel scan of the file"
                        .into(),
                    degraded: None,
                },
                KernelCaps {
                    device: None,
                    operand_dtypes: Vec::new(),
                    op_dtypes: Vec::new(),
                    name: KERNEL.into(),
                    ops: vec![],
                    classes: vec![OpClass::Table],
                    dtypes: vec![DType::Table],
                    deterministic: true,
                    description: "DuckDB SQL, one in-memory connection per job".into(),
                    degraded: None,
                },
            ],
            unavailable_kernels: Default::default(),
        }
    }

    fn prepare(
        &self,
        partition: &Graph,
        assignment: &Assignment,
    ) -> Result<Box<dyn Executable>, EngineError> {
        let threads = assignment.options.threads.map(|t| t as usize);
        let id = self.executables.fetch_add(1, Ordering::Relaxed);
        let workers = threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        let mut exec =
            exec::TableExec::new(partition.clone(), assignment, id, self.roots.clone(), workers)?;
        if exec.needs_duckdb() {
            exec.set_connection(self.connection(threads, assignment.options.memory_limit)?);
        }
        Ok(Box::new(exec))
    }
}

fn duckdb_version() -> String {
    // The linked library's own version string, e.g. `v1.2.0`, without opening a database.
    // SAFETY: `duckdb_library_version` returns a pointer to a static NUL-terminated string.
    let raw = unsafe { duckdb::ffi::duckdb_library_version() };
    if raw.is_null() {
        return "unknown".into();
    }
    // SAFETY: non-null, static and NUL-terminated (above).
    unsafe { std::ffi::CStr::from_ptr(raw) }.to_string_lossy().into_owned()
}
