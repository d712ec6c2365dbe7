//! Running a partition of table nodes: each node's SQL, views where a result is read once in
//! order-insensitive ways, tables (with `rowid`, their insertion order) where it is read
//! twice or its order matters, and the results read back into [`Table`]s.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use duckdb::Connection;
use duckdb::types::Value as DuckValue;
use xpu_engine::{EngineError, Executable, Execution, Fact, NodeTiming, StopToken, check_inputs};
use xpu_ir::rowexpr::ColumnType;
use xpu_ir::{Attrs, Column, ColumnData, DType, Graph, NodeId, Op, Table, Tensor, ValueId};

use crate::native;
use crate::sql::{self, ident, lit};
use crate::{KERNEL, NATIVE_KERNEL, SharedConnection};

/// How a node's result is held in the connection.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Holding {
    View,
    Table,
    /// Not in DuckDB at all: a CSV file only `table.native` nodes read, which scan it
    /// themselves (binding a DuckDB view would sniff the file for nothing).
    File,
}

/// Ops that read their input's row order through `rowid`, so their inputs must be tables.
fn reads_order(op: Op, attrs: &Attrs) -> bool {
    match op {
        Op::Distinct | Op::SortRows | Op::Join | Op::ValueCounts | Op::ConcatTables => true,
        Op::GroupAgg | Op::Pivot => {
            attrs.strs("funcs").is_some_and(|f| f.iter().any(|f| f == "first"))
                || attrs.str("agg", "") == "first"
        }
        _ => false,
    }
}

#[derive(Clone, Debug)]
struct Rel {
    name: String,
    /// The first column holds row labels (`describe`, `pivot`).
    indexed: bool,
    /// The `read_csv` node whose file this is, when it is held as [`Holding::File`].
    file: Option<NodeId>,
}

pub struct TableExec {
    g: Graph,
    /// The job's DuckDB connection; `None` for a partition that runs without it
    /// ([`TableExec::needs_duckdb`]).
    conn: Option<SharedConnection>,
    id: usize,
    holding: Vec<Holding>,
    /// The kernel of every node (the assignment's, else the engine's first that runs it).
    kernels: Vec<&'static str>,
    roots: Vec<std::path::PathBuf>,
    threads: usize,
    /// The schema of each `read_csv` node's file found plainly numeric this run (the native
    /// group-by scans such files itself).
    numeric: Mutex<HashMap<NodeId, Vec<(String, DType)>>>,
}

/// Ops the `table.native` kernel computes.
fn native_op(op: Op) -> bool {
    matches!(op, Op::Describe | Op::GroupAgg)
}

/// A CSV source the native scan can read: a header row and a one-byte separator.
fn natively_readable(n: &xpu_ir::Node) -> bool {
    n.op == Op::ReadCsv && n.attrs.int("header", 1) != 0 && n.attrs.str("sep", ",").len() == 1
}

/// DuckDB's message without its advice: the "Possible fixes" it appends name reader options
/// (`strict_mode`, `ignore_errors`, …) that a MiniLang program cannot set, and its dumps of
/// the sniffer's search space. What stays says what is wrong and where (file, line).
pub(crate) fn brief(e: &duckdb::Error) -> String {
    let text = e.to_string();
    let mut kept: Vec<&str> = Vec::new();
    for line in text.lines().map(str::trim_end) {
        let advice = ["Possible", "The search space", "Delimiter Candidates", "* "];
        if advice.iter().any(|a| line.trim_start().starts_with(a)) {
            break;
        }
        if !line.trim().is_empty() {
            kept.push(line.trim());
        }
    }
    if kept.is_empty() { text } else { kept.join("; ") }
}

/// The files read by `nid` and the nodes it depends on, in graph order.
fn files_read_by(g: &Graph, nid: NodeId) -> Vec<String> {
    let mut seen = vec![false; g.nodes.len()];
    let mut stack = vec![nid];
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut seen[n.index()], true) {
            continue;
        }
        stack.extend(g.node(n).input_values().filter_map(|v| g.producer(v)));
    }
    g.node_ids()
        .filter(|n| seen[n.index()])
        .filter(|&n| matches!(g.node(n).op, Op::ReadCsv | Op::ReadParquet | Op::ReadXlsx))
        .map(|n| g.node(n).attrs.str("path", "").to_string())
        .collect()
}

fn kernel_err(g: &Graph, id: NodeId, message: impl std::fmt::Display) -> EngineError {
    EngineError::Kernel { node: g.node(id).label(id), message: message.to_string() }
}

impl TableExec {
    pub fn new(
        g: Graph,
        assignment: &xpu_engine::Assignment,
        id: usize,
        roots: Vec<std::path::PathBuf>,
        threads: usize,
    ) -> Result<TableExec, EngineError> {
        let mut consumers: HashMap<ValueId, Vec<NodeId>> = HashMap::new();
        for nid in g.node_ids() {
            let n = g.node(nid);
            if n.op.class() != xpu_ir::OpClass::Table {
                return Err(EngineError::Unsupported {
                    engine: "table".into(),
                    node: n.label(nid),
                    what: format!("op {} (only table ops run here)", n.op),
                });
            }
            for v in n.input_values() {
                consumers.entry(v).or_default().push(nid);
            }
        }
        let mut kernels = Vec::with_capacity(g.nodes.len());
        for nid in g.node_ids() {
            let op = g.node(nid).op;
            kernels.push(match assignment.kernels.get(&nid).map(String::as_str) {
                Some(NATIVE_KERNEL) if native_op(op) => NATIVE_KERNEL,
                Some(KERNEL) => KERNEL,
                None if native_op(op) => NATIVE_KERNEL,
                None => KERNEL,
                Some(k) => {
                    return Err(EngineError::Unsupported {
                        engine: "table".into(),
                        node: g.node(nid).label(nid),
                        what: format!("kernel {k} for {op}"),
                    });
                }
            });
        }
        let outputs: Vec<ValueId> = g.outputs.iter().map(|o| o.value).collect();
        let holding = g
            .node_ids()
            .map(|nid| {
                let n = g.node(nid);
                let out = n.outputs[0];
                let users = consumers.get(&out).map_or(&[][..], |v| &v[..]);
                if natively_readable(n)
                    && !users.is_empty()
                    && !outputs.contains(&out)
                    && users.iter().all(|u| {
                        kernels[u.index()] == NATIVE_KERNEL && g.node(*u).op == Op::Describe
                    })
                {
                    return Holding::File;
                }
                let built_from_values = matches!(n.op, Op::Describe | Op::ReadXlsx | Op::Pivot);
                let ordered = users.iter().any(|&u| reads_order(g.node(u).op, &g.node(u).attrs));
                if users.len() == 1 && !outputs.contains(&out) && !ordered && !built_from_values {
                    Holding::View
                } else {
                    Holding::Table
                }
            })
            .collect();
        Ok(TableExec {
            g,
            conn: None,
            id,
            holding,
            kernels,
            roots,
            threads,
            numeric: Mutex::new(HashMap::new()),
        })
    }

    /// Whether running needs the DuckDB connection: anything but native nodes over files
    /// left unbound does. A `describe` of a CSV file then starts no database at all.
    pub fn needs_duckdb(&self) -> bool {
        let native_over_file = |nid: NodeId| {
            let n = self.g.node(nid);
            self.kernels[nid.index()] == NATIVE_KERNEL
                && n.input_values().all(|v| {
                    self.g.producer(v).is_some_and(|p| self.holding[p.index()] == Holding::File)
                })
        };
        !self.g.inputs.is_empty()
            || self
                .g
                .node_ids()
                .any(|nid| self.holding[nid.index()] != Holding::File && !native_over_file(nid))
    }

    pub fn set_connection(&mut self, conn: SharedConnection) {
        self.conn = Some(conn);
    }

    /// The relation of a read node held as [`Holding::File`], and what the explanation says
    /// of it.
    fn file_rel(&self, nid: NodeId) -> (Rel, String) {
        let name = format!("x{}_n{}", self.id, nid.0);
        let how = "-- not bound in DuckDB: its only readers are table.native nodes, which scan \
                   the file themselves";
        (Rel { name, indexed: false, file: Some(nid) }, how.to_string())
    }

    /// A partition of native nodes over unbound files ([`TableExec::needs_duckdb`] false).
    fn run_native(&self) -> Result<Execution, EngineError> {
        let mut rels: HashMap<ValueId, Rel> = HashMap::new();
        let mut built: HashMap<ValueId, Table> = HashMap::new();
        let (mut facts, mut timings) = (Vec::new(), Vec::new());
        for nid in self.g.node_ids() {
            let start = Instant::now();
            let n = self.g.node(nid);
            let how = if self.holding[nid.index()] == Holding::File {
                let (rel, how) = self.file_rel(nid);
                rels.insert(n.outputs[0], rel);
                how
            } else {
                let input = n
                    .input_values()
                    .next()
                    .and_then(|v| rels.get(&v))
                    .ok_or_else(|| kernel_err(&self.g, nid, "input not computed"))?;
                let (table, how) = self.native_file_describe(nid, input)?;
                built.insert(n.outputs[0], table);
                how
            };
            facts.push(Fact { node: Some(nid), key: "sql".into(), value: how });
            timings.push(NodeTiming {
                node: nid,
                kernel: self.kernels[nid.index()].into(),
                nanos: start.elapsed().as_nanos() as u64,
            });
        }
        let outputs = self
            .g
            .outputs
            .iter()
            .map(|o| {
                let table = built.get(&o.value).cloned().ok_or_else(|| {
                    EngineError::Other(format!("output {} was not computed", o.name))
                })?;
                Ok(Tensor::from_vec(vec![], vec![table]).expect("scalar table"))
            })
            .collect::<Result<_, EngineError>>()?;
        Ok(Execution { outputs, timings, facts })
    }
}

/// The table function a read node scans (`read_csv(...)`, `read_parquet(...)`).
pub fn source_sql(op: Op, attrs: &Attrs) -> Result<String, EngineError> {
    let path = attrs.str("path", "");
    if path.is_empty() {
        return Err(EngineError::Other(format!("{op}: attribute `path` is required")));
    }
    // DuckDB reads an empty file as one column named `column0`; pandas refuses it, and a
    // job fed an empty export should hear about it.
    if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
        return Err(EngineError::Other(format!("{path} is empty: no columns to read")));
    }
    match op {
        Op::ReadCsv => Ok(sql::read_csv(
            path,
            // pandas' default; a fixed separator also makes a ragged row an error rather
            // than a reason to sniff the file as one column.
            attrs.str("sep", ","),
            attrs.int("header", 1) != 0,
            attrs.strs("na_values").unwrap_or(&[]),
        )),
        Op::ReadParquet => Ok(format!("read_parquet({})", lit(path))),
        _ => Err(EngineError::Other(format!("{op} is not a file source"))),
    }
}

/// Column names and DuckDB types of a query's result, without running it.
pub fn describe(conn: &Connection, query: &str) -> Result<Vec<(String, String)>, duckdb::Error> {
    let mut stmt = conn.prepare(&format!("DESCRIBE {query}"))?;
    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?.collect()
}

/// Reads a relation back as a [`Table`].
pub fn materialize(conn: &Connection, rel: &str, indexed: bool) -> Result<Table, duckdb::Error> {
    let cols = describe(conn, &format!("SELECT * FROM {rel}"))?;
    let dtypes: Vec<DType> = cols.iter().map(|(_, t)| sql::dtype_of_sql(t)).collect();
    let select: Vec<String> = cols
        .iter()
        .zip(&dtypes)
        .map(|((n, _), d)| format!("CAST({} AS {})", ident(n), sql::sql_of_dtype(*d)))
        .collect();
    let mut data: Vec<ColumnData> = dtypes
        .iter()
        .map(|d| match d {
            DType::Bool => ColumnData::Bool(Vec::new()),
            DType::I64 => ColumnData::I64(Vec::new()),
            DType::F64 => ColumnData::F64(Vec::new()),
            _ => ColumnData::String(Vec::new()),
        })
        .collect();
    if !cols.is_empty() {
        let mut stmt = conn.prepare(&format!("SELECT {} FROM {rel}", select.join(", ")))?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            for (i, col) in data.iter_mut().enumerate() {
                match col {
                    ColumnData::Bool(v) => v.push(row.get(i)?),
                    ColumnData::I64(v) => v.push(row.get(i)?),
                    ColumnData::F64(v) => v.push(row.get(i)?),
                    ColumnData::String(v) => v.push(row.get(i)?),
                }
            }
        }
    }
    Ok(Table {
        columns: cols
            .into_iter()
            .zip(data)
            .map(|((name, _), data)| Column { name, data })
            .collect(),
        index: indexed,
    })
}

/// Loads a [`Table`] into a new table `name` of the connection.
pub fn load_table(conn: &Connection, name: &str, t: &Table) -> Result<(), duckdb::Error> {
    let defs: Vec<String> = t
        .columns
        .iter()
        .map(|c| {
            let ty = match &c.data {
                ColumnData::Bool(_) => "BOOLEAN",
                ColumnData::I64(_) => "BIGINT",
                ColumnData::F64(_) => "DOUBLE",
                ColumnData::String(_) => "VARCHAR",
            };
            format!("{} {ty}", ident(&c.name))
        })
        .collect();
    conn.execute_batch(&format!("CREATE TABLE {} ({})", ident(name), defs.join(", ")))?;
    let mut app = conn.appender(name)?;
    for r in 0..t.rows() {
        let row: Vec<DuckValue> = t
            .columns
            .iter()
            .map(|c| match &c.data {
                ColumnData::Bool(v) => v[r].map_or(DuckValue::Null, DuckValue::Boolean),
                ColumnData::I64(v) => v[r].map_or(DuckValue::Null, DuckValue::BigInt),
                ColumnData::F64(v) => v[r].map_or(DuckValue::Null, DuckValue::Double),
                ColumnData::String(v) => {
                    v[r].as_ref().map_or(DuckValue::Null, |s| DuckValue::Text(s.clone()))
                }
            })
            .collect();
        app.append_row(duckdb::appender_params_from_iter(row))?;
    }
    app.flush()
}

/// What one node does once its SQL is known.
enum Step {
    /// A relation defined by a query.
    Query(String),
    /// A relation built from values (describe's statistics, a workbook's cells), with how
    /// they were computed, for the explanation.
    Built(Table, String),
    /// A statement whose result is a tensor (rows written, a tensor of columns).
    Value(Tensor),
    /// A file left for the native nodes that read it ([`Holding::File`]).
    File,
    /// The native kernel declined the node (the reason): DuckDB's statement ran instead.
    Declined(String, String),
}

impl Executable for TableExec {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        check_inputs(&self.g, inputs)?;
        let Some(conn) = &self.conn else {
            stop.check(|| "partition".into())?;
            return self.run_native();
        };
        let conn = conn.lock().map_err(|_| EngineError::Other("poisoned connection".into()))?;
        let mut created: Vec<(String, Holding)> = Vec::new();
        // A cancel interrupts the query DuckDB is running (its error then reads as stopped).
        let interrupt = conn.interrupt_handle();
        let hook = stop.on_stop(move || interrupt.interrupt());
        let result = match (self.run_in(&conn, inputs, &mut created, stop), stop.reason()) {
            (Err(EngineError::Kernel { node, .. }), Some(reason)) => {
                Err(EngineError::Stopped { node, reason })
            }
            (Err(EngineError::Kernel { node, message }), None)
                if message.contains("Out of Memory") =>
            {
                // The connection's memory_limit is the policy's memory.limit: say so.
                let message = format!("{message} (DuckDB is bounded by the policy's memory.limit)");
                Err(EngineError::Kernel { node, message })
            }
            (other, _) => other,
        };
        drop(hook);
        // Drop what this run made, newest first (views depend on what came before).
        for (name, h) in created.iter().rev() {
            let kind = if *h == Holding::View { "VIEW" } else { "TABLE" };
            debug_assert!(*h != Holding::File, "files are never created in DuckDB");
            let _ = conn.execute_batch(&format!("DROP {kind} IF EXISTS {}", ident(name)));
        }
        result
    }
}

impl TableExec {
    fn run_in(
        &self,
        conn: &Connection,
        inputs: &[Tensor],
        created: &mut Vec<(String, Holding)>,
        stop: &StopToken,
    ) -> Result<Execution, EngineError> {
        let g = &self.g;
        let mut rels: HashMap<ValueId, Rel> = HashMap::new();
        let mut values: HashMap<ValueId, Tensor> = HashMap::new();
        let mut facts = Vec::new();
        let mut timings = Vec::new();
        for (i, (&v, t)) in g.inputs.iter().zip(inputs).enumerate() {
            let Some(table) = t.data().as_table() else {
                return Err(EngineError::Input {
                    name: g.value(v).name.clone().unwrap_or_else(|| v.to_string()),
                    message: "the table engine takes tables only".into(),
                });
            };
            let name = format!("x{}_in{i}", self.id);
            load_table(conn, &name, table)
                .map_err(|e| EngineError::Other(format!("duckdb: {e}")))?;
            created.push((name.clone(), Holding::Table));
            rels.insert(v, Rel { name: ident(&name), indexed: table.index, file: None });
        }
        for nid in g.node_ids() {
            stop.check(|| g.node(nid).label(nid))?;
            let start = Instant::now();
            let n = g.node(nid);
            let ins: Vec<Rel> = n
                .input_values()
                .map(|v| {
                    rels.get(&v).cloned().ok_or_else(|| kernel_err(g, nid, "input not computed"))
                })
                .collect::<Result<_, _>>()?;
            let fail = |e: duckdb::Error| {
                // A view reads its file when a later node runs: name the files upstream, or
                // "CSV Error on Line: N" would not say which file.
                let mut message = brief(&e);
                let files = files_read_by(g, nid);
                if !files.is_empty() && !files.iter().any(|f| message.contains(f.as_str())) {
                    message.push_str(&format!(" (reading {})", files.join(", ")));
                }
                kernel_err(g, nid, message)
            };
            let (step, indexed) = self.step(conn, nid, &ins).map_err(|e| match e {
                StepError::Duck(e) => fail(e),
                StepError::Engine(e) => e,
            })?;
            let name = format!("x{}_n{}", self.id, nid.0);
            let holding = self.holding[nid.index()];
            let declined = match &step {
                Step::Declined(_, why) => Some(why.clone()),
                _ => None,
            };
            let statement = match step {
                Step::File => {
                    let (rel, how) = self.file_rel(nid);
                    rels.insert(n.outputs[0], rel);
                    how
                }
                Step::Query(q) | Step::Declined(q, _) => {
                    let kind = if holding == Holding::View { "VIEW" } else { "TABLE" };
                    let stmt = format!("CREATE {kind} {} AS {q}", ident(&name));
                    // One prepared statement: an attribute smuggling a `;` cannot run a second.
                    conn.execute(&stmt, []).map_err(fail)?;
                    created.push((name.clone(), holding));
                    rels.insert(n.outputs[0], Rel { name: ident(&name), indexed, file: None });
                    match &declined {
                        Some(why) => {
                            format!("-- {NATIVE_KERNEL} declined ({why}): DuckDB ran it\n{stmt}")
                        }
                        None => stmt,
                    }
                }
                Step::Built(table, how) => {
                    load_table(conn, &name, &table).map_err(fail)?;
                    created.push((name.clone(), Holding::Table));
                    rels.insert(n.outputs[0], Rel { name: ident(&name), indexed, file: None });
                    format!("{how}; -- {} rows loaded into {}", table.rows(), ident(&name))
                }
                Step::Value(t) => {
                    values.insert(n.outputs[0], t);
                    String::new()
                }
            };
            if !statement.is_empty() {
                facts.push(Fact { node: Some(nid), key: "sql".into(), value: statement });
            }
            // The kernel that ran: DuckDB's where the native one declined.
            let kernel = if declined.is_some() { KERNEL } else { self.kernels[nid.index()] };
            timings.push(NodeTiming {
                node: nid,
                kernel: kernel.into(),
                nanos: start.elapsed().as_nanos() as u64,
            });
        }
        let mut outputs = Vec::with_capacity(g.outputs.len());
        for o in &g.outputs {
            if let Some(t) = values.get(&o.value) {
                outputs.push(t.clone());
                continue;
            }
            let rel = rels
                .get(&o.value)
                .ok_or_else(|| EngineError::Other(format!("output {} was not computed", o.name)))?;
            let table = materialize(conn, &rel.name, rel.indexed)
                .map_err(|e| EngineError::Other(format!("reading back {}: {e}", o.name)))?;
            outputs.push(Tensor::from_vec(vec![], vec![table]).expect("scalar table"));
        }
        Ok(Execution { outputs, timings, facts })
    }

    fn step(&self, conn: &Connection, nid: NodeId, ins: &[Rel]) -> Result<(Step, bool), StepError> {
        let n = self.g.node(nid);
        let a = &n.attrs;
        let input = || ins[0].name.as_str();
        let inherits = ins.first().is_some_and(|r| r.indexed);
        let cols = |rel: &str| describe(conn, &format!("SELECT * FROM {rel}"));
        let names = |key: &str| a.strs(key).unwrap_or(&[]).to_vec();
        // Every column a node names must exist in its input(s) before a statement is built,
        // so a hostile or mistyped name is refused here by name, not by the database.
        let named: Vec<(&str, Vec<String>)> = match n.op {
            Op::SelectColumns | Op::SortRows | Op::TableToTensor => {
                vec![("columns", names("columns"))]
            }
            Op::GroupAgg => vec![
                ("keys", names("keys")),
                ("columns", names("columns").into_iter().filter(|c| !c.is_empty()).collect()),
            ],
            Op::Pivot => ["index", "columns", "values"]
                .iter()
                .map(|k| (*k, vec![a.str(k, "").to_string()]))
                .collect(),
            Op::ValueCounts => vec![("column", vec![a.str("column", "").to_string()])],
            Op::Join => vec![("on", names("on"))],
            _ => Vec::new(),
        };
        for (key, wanted) in &named {
            for (i, rel) in ins.iter().enumerate() {
                let have = cols(&rel.name)?;
                if let Some(missing) = wanted.iter().find(|w| !have.iter().any(|(c, _)| c == *w)) {
                    let side = if ins.len() > 1 { format!(" of input {i}") } else { String::new() };
                    let list: Vec<&str> = have.iter().map(|(c, _)| c.as_str()).collect();
                    return Err(self
                        .err(
                            nid,
                            format!(
                                "`{key}`: unknown column {missing:?}{side} (the columns are: {})",
                                list.join(", ")
                            ),
                        )
                        .into());
                }
            }
        }
        Ok(match n.op {
            Op::ReadCsv if self.holding[nid.index()] == Holding::File => (Step::File, false),
            Op::ReadCsv => {
                // Sniffed once here, so the statements that bind it later do not sniff again;
                // a plainly numeric file by the native sampler, which gives DuckDB's answer
                // without DuckDB reading the file for it.
                let auto = source_sql(n.op, a)?;
                let numeric = natively_readable(n)
                    .then(|| {
                        native::numeric_schema(
                            a.str("path", ""),
                            a.str("sep", ",").as_bytes()[0],
                            a.strs("na_values").unwrap_or(&[]),
                            &self.roots,
                        )
                    })
                    .flatten();
                // Null markers that cannot occur in the file are left out of DuckDB's list.
                let nulls = numeric.is_some().then(|| {
                    native::possible_null_markers(
                        a.str("path", ""),
                        a.strs("na_values").unwrap_or(&[]),
                        &self.roots,
                    )
                });
                // This run's answer: a prepared partition runs again, and the file may have
                // changed since.
                if let Ok(mut known) = self.numeric.lock() {
                    match &numeric {
                        Some(schema) => known.insert(nid, schema.clone()),
                        None => known.remove(&nid),
                    };
                }
                let source = crate::csv_dialect::pinned(conn, &auto, numeric, nulls.flatten())
                    .unwrap_or(auto);
                (Step::Query(format!("SELECT * FROM {source}")), false)
            }
            Op::ReadParquet => {
                (Step::Query(format!("SELECT * FROM {}", source_sql(n.op, a)?)), false)
            }
            Op::ReadXlsx => {
                let table = crate::xlsx::read(a, &self.roots).map_err(|m| self.err(nid, m))?;
                let how = format!(
                    "-- workbook {} sheet {:?} read with calamine",
                    a.str("path", ""),
                    a.str("sheet", "")
                );
                (Step::Built(table, how), false)
            }
            Op::WriteTable => {
                let format = match a.str("format", "csv") {
                    "csv" => "FORMAT csv, HEADER true",
                    "parquet" => "FORMAT parquet",
                    f => return Err(self.err(nid, format!("unknown table format `{f}`")).into()),
                };
                let stmt = format!(
                    "COPY (SELECT * FROM {}) TO {} ({format})",
                    input(),
                    lit(a.str("path", ""))
                );
                let rows = conn.execute(&stmt, [])?;
                (Step::Value(Tensor::scalar(rows as i64)), false)
            }
            Op::SelectColumns => {
                let list: Vec<String> = names("columns").iter().map(|c| ident(c)).collect();
                let keeps_index =
                    inherits && cols(input())?.first().map(|c| &c.0) == names("columns").first();
                (Step::Query(format!("SELECT {} FROM {}", list.join(", "), input())), keeps_index)
            }
            Op::FilterRows => {
                let pred = self.row_sql(nid, "predicate", &cols(input())?)?;
                (Step::Query(format!("SELECT * FROM {} WHERE ({pred})", input())), inherits)
            }
            Op::WithColumn => {
                let name = a.str("name", "");
                let columns = cols(input())?;
                let expr = self.row_sql(nid, "expr", &columns)?;
                let exists = columns.iter().any(|(c, _)| c == name);
                let q = if exists {
                    format!("SELECT * REPLACE (({expr}) AS {}) FROM {}", ident(name), input())
                } else {
                    format!("SELECT *, ({expr}) AS {} FROM {}", ident(name), input())
                };
                (Step::Query(q), inherits)
            }
            Op::GroupAgg => {
                let declined = if self.kernels[nid.index()] == NATIVE_KERNEL {
                    match self.native_group(nid)? {
                        Ok((table, how)) => return Ok((Step::Built(table, how), false)),
                        Err(why) => Some(why),
                    }
                } else {
                    None
                };
                let types: HashMap<String, DType> =
                    cols(input())?.into_iter().map(|(n, t)| (n, sql::dtype_of_sql(&t))).collect();
                let keys: Vec<String> = names("keys").iter().map(|k| ident(k)).collect();
                let (outs, funcs, columns) = (names("names"), names("funcs"), names("columns"));
                let mut select = keys.clone();
                for ((out, f), c) in outs.iter().zip(&funcs).zip(&columns) {
                    let col = (!c.is_empty()).then(|| ident(c));
                    let expr = sql::aggregate(f, col.as_deref(), types.get(c).copied(), "rowid")
                        .ok_or_else(|| self.err(nid, format!("unknown aggregate `{f}`")))?;
                    select.push(format!("{expr} AS {}", ident(out)));
                }
                let mut q = format!("SELECT {} FROM {}", select.join(", "), input());
                if !keys.is_empty() {
                    // pandas drops rows whose group key is missing, and sorts the groups.
                    let not_null: Vec<String> =
                        keys.iter().map(|k| format!("{k} IS NOT NULL")).collect();
                    q.push_str(&format!(
                        " WHERE {} GROUP BY {} ORDER BY {}",
                        not_null.join(" AND "),
                        keys.join(", "),
                        keys.join(", ")
                    ));
                }
                match declined {
                    Some(why) => (Step::Declined(q, why), false),
                    None => (Step::Query(q), false),
                }
            }
            Op::Describe if self.kernels[nid.index()] == NATIVE_KERNEL => {
                let (table, how) = self.native_describe(conn, nid, &ins[0])?;
                (Step::Built(table, how), true)
            }
            Op::Describe => {
                let (table, q) = self.describe(conn, nid, input())?;
                (Step::Built(table, q), true)
            }
            Op::Pivot => (Step::Query(self.pivot(conn, nid, input())?), true),
            Op::Join => {
                let on = names("on");
                let left = cols(&ins[0].name)?;
                let right = cols(&ins[1].name)?;
                let how = a.str("how", "inner");
                let join = match how {
                    "inner" => "INNER JOIN",
                    "left" => "LEFT JOIN",
                    "outer" => "FULL OUTER JOIN",
                    h => return Err(self.err(nid, format!("unknown join `{h}`")).into()),
                };
                // pandas' column order: the left's columns (keys in place), then the
                // right's other columns; clashing names get `_x` / `_y`.
                let is_key = |c: &String| on.contains(c);
                let clash = |c: &String, other: &[(String, String)]| {
                    !is_key(c) && other.iter().any(|(o, _)| o == c)
                };
                let mut select = Vec::new();
                for (c, _) in &left {
                    let k = ident(c);
                    if is_key(c) {
                        select.push(if how == "outer" {
                            format!("coalesce(l.{k}, r.{k}) AS {k}")
                        } else {
                            format!("l.{k} AS {k}")
                        });
                    } else {
                        let out = if clash(c, &right) { format!("{c}_x") } else { c.clone() };
                        select.push(format!("l.{k} AS {}", ident(&out)));
                    }
                }
                for (c, _) in right.iter().filter(|(c, _)| !is_key(c)) {
                    let out = if clash(c, &left) { format!("{c}_y") } else { c.clone() };
                    select.push(format!("r.{} AS {}", ident(c), ident(&out)));
                }
                let cond: Vec<String> =
                    on.iter().map(|k| format!("l.{0} = r.{0}", ident(k))).collect();
                // pandas: inner and left keep the left's order; outer sorts by the keys.
                let order = if how == "outer" {
                    let keys: Vec<String> = on
                        .iter()
                        .map(|k| format!("coalesce(l.{0}, r.{0}) NULLS LAST", ident(k)))
                        .collect();
                    format!("{}, l.rowid, r.rowid", keys.join(", "))
                } else {
                    "l.rowid, r.rowid".into()
                };
                let q = format!(
                    "SELECT {} FROM {} AS l {join} {} AS r ON {} ORDER BY {order}",
                    select.join(", "),
                    ins[0].name,
                    ins[1].name,
                    cond.join(" AND ")
                );
                (Step::Query(q), false)
            }
            Op::ConcatTables => {
                let parts: Vec<String> = ins
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        format!("SELECT *, {i} AS __part, rowid AS __row FROM {}", r.name)
                    })
                    .collect();
                let q = format!(
                    "SELECT * EXCLUDE (__part, __row) FROM ({}) ORDER BY __part, __row",
                    parts.join(" UNION ALL BY NAME ")
                );
                (Step::Query(q), false)
            }
            Op::SortRows => {
                let dir = if a.int("descending", 0) != 0 { "DESC" } else { "ASC" };
                let mut keys: Vec<String> = names("columns")
                    .iter()
                    .map(|c| format!("{} {dir} NULLS LAST", ident(c)))
                    .collect();
                keys.push("rowid".into());
                (
                    Step::Query(format!("SELECT * FROM {} ORDER BY {}", input(), keys.join(", "))),
                    inherits,
                )
            }
            Op::Head => {
                let n = a.int("n", 5).max(0);
                (Step::Query(format!("SELECT * FROM {} LIMIT {n}", input())), inherits)
            }
            Op::Distinct => {
                let list: Vec<String> = cols(input())?.iter().map(|(c, _)| ident(c)).collect();
                let l = list.join(", ");
                let q = format!(
                    "SELECT {l} FROM (SELECT {l}, min(rowid) AS __first FROM {} GROUP BY {l}) ORDER BY __first",
                    input()
                );
                (Step::Query(q), inherits)
            }
            Op::ValueCounts => {
                let c = ident(a.str("column", ""));
                let q = format!(
                    "SELECT {c}, count(*) AS \"count\" FROM {} WHERE {c} IS NOT NULL GROUP BY {c} ORDER BY \"count\" DESC, min(rowid)",
                    input()
                );
                (Step::Query(q), false)
            }
            Op::TableToTensor => {
                let columns = names("columns");
                let list: Vec<String> =
                    columns.iter().map(|c| format!("CAST({} AS DOUBLE)", ident(c))).collect();
                let mut data = Vec::new();
                let mut rows = 0usize;
                if !columns.is_empty() {
                    let mut stmt =
                        conn.prepare(&format!("SELECT {} FROM {}", list.join(", "), input()))?;
                    let mut it = stmt.query([])?;
                    while let Some(row) = it.next()? {
                        for i in 0..columns.len() {
                            data.push(row.get::<_, Option<f64>>(i)?.unwrap_or(f64::NAN));
                        }
                        rows += 1;
                    }
                }
                let t = Tensor::from_vec(vec![rows, columns.len()], data).expect("rows × columns");
                (Step::Value(t), false)
            }
            Op::Plot => {
                let table = materialize(conn, input(), false)?;
                let drawn = crate::plot::draw(&table, a).map_err(|m| self.err(nid, m))?;
                (Step::Value(Tensor::scalar(drawn as i64)), false)
            }
            op => return Err(self.err(nid, format!("op {op} is not a table op")).into()),
        })
    }

    /// A row-expression attribute as SQL, after checking it against the input's real
    /// columns (an `.sgr` program's expression was checked only for shape before: the IR
    /// does not know a file's columns).
    fn row_sql(
        &self,
        nid: NodeId,
        key: &str,
        columns: &[(String, String)],
    ) -> Result<String, EngineError> {
        let e = self.g.node(nid).attrs.row(key).ok_or_else(|| {
            self.err(
                nid,
                format!("`{key}` must be a row expression (xpu's verifier refuses others)"),
            )
        })?;
        let lookup = |name: &str| match columns.iter().find(|(c, _)| c == name) {
            Some((_, ty)) => ColumnType::Known(sql::dtype_of_sql(ty)),
            None => ColumnType::Missing,
        };
        e.check(&lookup).map_err(|err| self.err(nid, format!("`{key}`: {err}")))?;
        Ok(sql::row_expr(e))
    }

    fn err(&self, nid: NodeId, message: impl std::fmt::Display) -> EngineError {
        kernel_err(&self.g, nid, message)
    }

    /// The statistics a `describe` node computes: its `stats`, else pandas' eight.
    fn describe_stats(&self, nid: NodeId) -> Result<Vec<String>, EngineError> {
        let stats: Vec<String> = match self.g.node(nid).attrs.strs("stats") {
            Some(s) if !s.is_empty() => s.to_vec(),
            _ => sql::DESCRIBE_STATS.iter().map(|s| s.to_string()).collect(),
        };
        match stats.iter().find(|s| sql::describe_stat(s, "x").is_none()) {
            Some(s) => Err(self.err(nid, format!("unknown statistic `{s}`"))),
            None => Ok(stats),
        }
    }

    /// The columns a `describe` node covers: its `columns` (the numeric columns of the
    /// compile-time schema), else every numeric (not bool) column of the input.
    fn describe_columns(
        &self,
        conn: &Connection,
        nid: NodeId,
        rel: &str,
    ) -> Result<Vec<String>, duckdb::Error> {
        if let Some(columns) = self.g.node(nid).attrs.strs("columns") {
            return Ok(columns.to_vec());
        }
        Ok(describe(conn, &format!("SELECT * FROM {rel}"))?
            .into_iter()
            .filter(|(_, t)| matches!(sql::dtype_of_sql(t), DType::I64 | DType::F64))
            .map(|(c, _)| c)
            .collect())
    }

    /// pandas `describe()` as SQL: the statistics of every column in one query.
    fn describe(
        &self,
        conn: &Connection,
        nid: NodeId,
        rel: &str,
    ) -> Result<(Table, String), StepError> {
        let stats = self.describe_stats(nid)?;
        let numeric = self.describe_columns(conn, nid, rel)?;
        let exprs: Vec<String> = numeric
            .iter()
            .flat_map(|c| stats.iter().filter_map(|s| sql::describe_stat(s, &ident(c))))
            .collect();
        let mut cells: Vec<Option<f64>> = Vec::new();
        let q = format!("SELECT {} FROM {rel}", exprs.join(", "));
        if !exprs.is_empty() {
            conn.query_row(&q, [], |row| {
                for i in 0..exprs.len() {
                    cells.push(row.get::<_, Option<f64>>(i)?);
                }
                Ok(())
            })?;
        }
        let mut columns = vec![Column {
            name: "statistic".into(),
            data: ColumnData::String(stats.iter().map(|s| Some(s.clone())).collect()),
        }];
        for (ci, c) in numeric.iter().enumerate() {
            let values = (0..stats.len()).map(|si| cells[ci * stats.len() + si]).collect();
            columns.push(Column { name: c.clone(), data: ColumnData::F64(values) });
        }
        let how = if exprs.is_empty() { "-- no numeric columns".to_string() } else { q };
        Ok((Table { columns, index: true }, how))
    }

    /// The file a natively readable `read_csv` node names, as the native scan takes it.
    fn csv_file(&self, source: NodeId) -> native::CsvFile<'_> {
        let a = &self.g.node(source).attrs;
        native::CsvFile {
            path: a.str("path", ""),
            sep: a.str("sep", ",").as_bytes()[0],
            na_values: a.strs("na_values").unwrap_or(&[]),
        }
    }

    /// `group_by |> agg` in Rust (`table.native`, [`crate::group`]) when its input is a
    /// `read_csv` of a plainly numeric file: the file is scanned once for the columns the
    /// node reads and grouped without DuckDB reading it. `Ok(Err(why))`: the kernel declines
    /// and DuckDB's statement runs instead.
    fn native_group(&self, nid: NodeId) -> Result<Result<(Table, String), String>, EngineError> {
        use crate::group::{Agg, Func, Input, group_agg};
        let n = self.g.node(nid);
        let names = |key: &str| n.attrs.strs(key).unwrap_or(&[]);
        let keys = names("keys");
        if keys.is_empty() {
            return Ok(Err("a whole-table aggregate, without keys".into()));
        }
        let source = n.input_values().next().and_then(|v| self.g.producer(v));
        let Some(source) = source.filter(|&s| natively_readable(self.g.node(s))) else {
            return Ok(Err("its input is not a CSV file read by load_csv".into()));
        };
        let schema = self.numeric.lock().ok().and_then(|known| known.get(&source).cloned());
        let Some(schema) = schema else {
            return Ok(Err("the file is not plainly numeric: text, quotes or dates in it".into()));
        };
        // The columns to scan: the keys, then each aggregated column once.
        let mut read: Vec<String> = keys.to_vec();
        let mut aggs = Vec::new();
        for ((out, func), column) in names("names").iter().zip(names("funcs")).zip(names("columns"))
        {
            let Some(f) = Func::parse(func, !column.is_empty()) else {
                return Ok(Err(format!("aggregate `{func}` is DuckDB's only")));
            };
            let column = (!column.is_empty()).then(|| {
                read.iter().position(|c| c == column).unwrap_or_else(|| {
                    read.push(column.clone());
                    read.len() - 1
                })
            });
            aggs.push(Agg { out: out.clone(), func: f, column });
        }
        let file = self.csv_file(source);
        let (values, scan) =
            native::scan_csv(&file, &self.roots, native::Wanted::Aligned(&read), self.threads)
                .map_err(|m| self.err(nid, m))?;
        let integer = |name: &str| schema.iter().any(|(c, t)| c == name && *t == DType::I64);
        let inputs: Vec<Input<'_>> = values
            .iter()
            .map(|v| Input { name: &v.name, values: &v.values, integer: integer(&v.name) })
            .collect();
        let key_at: Vec<usize> = (0..keys.len()).collect();
        Ok(group_agg(&inputs, &key_at, &aggs).map(|table| {
            let how = format!(
                "-- table.native: {} scanned once on {} thread(s) for {} column(s), {} rows \
                 in {} groups",
                file.path,
                scan.threads,
                read.len(),
                scan.rows,
                table.rows()
            );
            (table, how)
        }))
    }

    /// pandas `describe()` in Rust (`table.native`) of a CSV file left unbound
    /// ([`Holding::File`]): the file is scanned directly.
    fn native_file_describe(
        &self,
        nid: NodeId,
        input: &Rel,
    ) -> Result<(Table, String), EngineError> {
        let stats = self.describe_stats(nid)?;
        let src = input.file.ok_or_else(|| self.err(nid, "input is not a file"))?;
        let file = self.csv_file(src);
        let wanted = match self.g.node(nid).attrs.strs("columns") {
            Some(c) => native::Wanted::Exactly(c),
            None => native::Wanted::Numeric,
        };
        let (values, scan) = native::scan_csv(&file, &self.roots, wanted, self.threads)
            .map_err(|m| self.err(nid, m))?;
        let how = format!(
            "-- table.native: {} scanned once on {} thread(s), {} rows, {} column(s)",
            file.path,
            scan.threads,
            scan.rows,
            values.len()
        );
        Ok((native::describe(values, &stats, self.threads), how))
    }

    /// pandas `describe()` in Rust (`table.native`): a file left unbound is scanned
    /// directly; any other input is read back from DuckDB, its numeric columns only.
    fn native_describe(
        &self,
        conn: &Connection,
        nid: NodeId,
        input: &Rel,
    ) -> Result<(Table, String), StepError> {
        if input.file.is_some() {
            return Ok(self.native_file_describe(nid, input)?);
        }
        let stats = self.describe_stats(nid)?;
        let numeric = self.describe_columns(conn, nid, &input.name)?;
        let select: Vec<String> = numeric.iter().map(|c| ident(c)).collect();
        let rel = format!("(SELECT {} FROM {})", select.join(", "), input.name);
        let table =
            if numeric.is_empty() { Table::default() } else { materialize(conn, &rel, false)? };
        let how = format!(
            "-- table.native: {} column(s) of {} read back from DuckDB",
            numeric.len(),
            input.name
        );
        Ok((native::describe(native::table_values(&table, None), &stats, self.threads), how))
    }

    /// pandas `pivot_table`: one row per index value (sorted), one column per distinct value
    /// of `columns` (sorted), cells the aggregate of `values`; empty cells missing.
    fn pivot(&self, conn: &Connection, nid: NodeId, rel: &str) -> Result<String, StepError> {
        let a = &self.g.node(nid).attrs;
        let (index, columns, values) =
            (a.str("index", ""), a.str("columns", ""), a.str("values", ""));
        let agg = a.str("agg", "mean");
        let types: HashMap<String, DType> = describe(conn, &format!("SELECT * FROM {rel}"))?
            .into_iter()
            .map(|(n, t)| (n, sql::dtype_of_sql(&t)))
            .collect();
        let c = ident(columns);
        let mut stmt = conn.prepare(&format!(
            "SELECT DISTINCT CAST({c} AS VARCHAR), {c} FROM {rel} WHERE {c} IS NOT NULL ORDER BY {c}"
        ))?;
        let labels: Vec<String> =
            stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<Result<_, _>>()?;
        let mut select = vec![ident(index)];
        for label in &labels {
            let cond = format!("CAST({c} AS VARCHAR) = {}", lit(label));
            let cell = format!("CASE WHEN {cond} THEN {} END", ident(values));
            let expr = sql::aggregate(agg, Some(&cell), types.get(values).copied(), "rowid")
                .ok_or_else(|| self.err(nid, format!("unknown aggregate `{agg}`")))?;
            // Column names as pandas shows the values (booleans `True` / `False`).
            let shown = match (types.get(columns), label.as_str()) {
                (Some(DType::Bool), "true") => "True",
                (Some(DType::Bool), "false") => "False",
                _ => label.as_str(),
            };
            select.push(format!(
                "CASE WHEN count(*) FILTER (WHERE {cond}) > 0 THEN ({expr})::DOUBLE END AS {}",
                ident(shown)
            ));
        }
        let i = ident(index);
        Ok(format!(
            "SELECT {} FROM {rel} WHERE {i} IS NOT NULL GROUP BY {i} ORDER BY {i}",
            select.join(", ")
        ))
    }
}

enum StepError {
    Duck(duckdb::Error),
    Engine(EngineError),
}

impl From<duckdb::Error> for StepError {
    fn from(e: duckdb::Error) -> Self {
        StepError::Duck(e)
    }
}

impl From<EngineError> for StepError {
    fn from(e: EngineError) -> Self {
        StepError::Engine(e)
    }
}
