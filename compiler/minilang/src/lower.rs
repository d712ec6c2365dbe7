//! Lowering: MiniLang evaluates everything known at compile time (numbers, strings, lists,
//! ranges, `if` on constants, `for` unrolled, functions inlined) and builds SGR-ML nodes for
//! tensor values, so every program becomes one static graph. `print` of a tensor becomes a
//! graph output (`print_0`, …); `print` of a compile-time value is kept as text, in order.
//! Table functions become table nodes with their schema tracked at compile time
//! ([`tables`]); `write_csv`, `write_parquet` and `plot` become graph outputs (`write_N`,
//! `plot_N`) so dead-code elimination keeps them.

// Lowering errors are rare and end the statement; returning the diagnostic by value keeps
// the hundred error sites readable, at the cost of a large Err variant.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;

use xpu_ir::{Attr, Attrs, DType, Dim, Graph, Op, Tensor, TensorData, TensorType, ValueId};

use crate::Span;
use crate::ast::*;
use crate::check::is_builtin;

mod tables;
use crate::diag::Diagnostic;
use crate::paths::DataRoots;
pub use tables::{Schema, TableSchemaLoader};

/// What `print` statements produce, in program order.
#[derive(Debug, Clone, PartialEq)]
pub enum PrintItem {
    Text(String),
    /// A tensor: the graph output of this name.
    Output(String),
}

#[derive(Debug, Clone)]
pub struct Lowered {
    pub graph: Graph,
    pub prints: Vec<PrintItem>,
    /// `write_npy` calls: the graph output to write, and where (resolved in the data roots).
    pub writes: Vec<(String, std::path::PathBuf)>,
    /// The compile-time type of each printed table (`table[Name: string, Age: f64]`), by
    /// graph output name.
    pub types: std::collections::BTreeMap<String, String>,
    /// Every file the program names (read or written), resolved, in program order. A
    /// program naming none is a pure function of its text and input types (the daemon
    /// caches those compiled).
    pub files: Vec<std::path::PathBuf>,
}

impl Lowered {
    /// Every file the program writes (tables, plots, `.npy` files), resolved, sorted, each
    /// once: what a caller asks about before running a program someone else wrote.
    pub fn written_files(&self) -> Vec<std::path::PathBuf> {
        let tables = self.graph.nodes.iter().filter(|n| matches!(n.op, Op::WriteTable | Op::Plot));
        let mut out: Vec<std::path::PathBuf> = tables
            .map(|n| std::path::PathBuf::from(n.attrs.str("path", "")))
            .chain(self.writes.iter().map(|(_, p)| p.clone()))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

#[derive(Debug, Clone)]
enum Val {
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    Null,
    List(Vec<Val>),
    Range(i64, i64),
    Tensor(ValueId),
    /// A table value and its schema, known at compile time.
    Table(ValueId, std::rc::Rc<Schema>),
    /// `t.name`: a column of a table (a one-column table where a table is needed).
    Column(ValueId, std::rc::Rc<Schema>, String),
    /// `group_by(t, keys…)`, waiting for `agg`.
    Grouped(ValueId, std::rc::Rc<Schema>, Vec<String>),
    Func(usize),
    /// A loaded model: calling it inlines its graph.
    Model(usize),
    /// The value of a statement that failed (already reported): no echo errors.
    Poison,
}

struct Lowerer<'p> {
    inputs: &'p Inputs,
    models: Vec<(Graph, String)>,
    input_values: HashMap<String, ValueId>,
    g: Graph,
    program: &'p Program,
    roots: Option<&'p DataRoots>,
    writes: Vec<(String, std::path::PathBuf)>,
    /// Files resolved so far (`resolve` borrows the lowerer shared, hence the cell).
    files: std::cell::RefCell<Vec<std::path::PathBuf>>,
    scopes: Vec<HashMap<String, Val>>,
    fns: Vec<(&'p [Param], &'p Block)>,
    prints: Vec<PrintItem>,
    types: std::collections::BTreeMap<String, String>,
    diags: Vec<Diagnostic>,
    call_depth: usize,
    /// Counter for the row-count symbols of `tensor(t)` results.
    row_symbols: usize,
}

type R<T> = Result<T, Diagnostic>;

fn err(code: &'static str, span: Span, msg: impl Into<String>) -> Diagnostic {
    Diagnostic::error(code, span, msg)
}

/// Reads a model file (`model("net.onnx")`) into an SGR-ML graph. Supplied by the caller,
/// so this crate stays free of ONNX.
pub type ModelLoader =
    std::sync::Arc<dyn Fn(&std::path::Path) -> Result<Graph, String> + Send + Sync>;

/// What lowering takes from outside the program: input types and a model loader.
#[derive(Clone, Default)]
pub struct Inputs {
    /// The types of the program's `input("name")` tensors, from the files given to run it.
    pub types: std::collections::BTreeMap<String, TensorType>,
    /// The columns of the table inputs among them (`--input t=FILE.csv`): their names and
    /// types are the table's compile-time schema, as a file's header is for `read_csv`.
    pub table_columns: std::collections::BTreeMap<String, Vec<(String, DType)>>,
    /// `check` lowers without files: an input with no declared type is then an f64 tensor
    /// of unknown shape instead of an error.
    pub allow_undeclared: bool,
    pub models: Option<ModelLoader>,
    /// Reads the schema of a table file at compile time (the `table` engine's reader).
    pub tables: Option<TableSchemaLoader>,
}

impl std::fmt::Debug for Inputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inputs")
            .field("types", &self.types)
            .field("table_columns", &self.table_columns)
            .field("allow_undeclared", &self.allow_undeclared)
            .field("models", &self.models.is_some())
            .field("tables", &self.tables.is_some())
            .finish()
    }
}

impl Inputs {
    /// Types the program's inputs by the values given for them: dtype and shape, and for a
    /// table its columns.
    pub fn given<'t>(values: impl IntoIterator<Item = (&'t str, &'t xpu_ir::Tensor)>) -> Inputs {
        let mut inputs = Inputs::default();
        for (name, t) in values {
            inputs.types.insert(name.to_string(), t.ty());
            if let Some(table) = t.data().as_table() {
                let columns = table.columns.iter().map(|c| (c.name.clone(), c.data.dtype()));
                inputs.table_columns.insert(name.to_string(), columns.collect());
            }
        }
        inputs
    }
}

/// Lowers a checked program. Paths it names (`write_npy`) resolve inside `roots`; without
/// roots, file access is an error.
pub fn lower<'p>(
    program: &'p Program,
    name: &str,
    roots: Option<&'p DataRoots>,
) -> Result<Lowered, Vec<Diagnostic>> {
    lower_with(program, name, roots, &Inputs::default())
}

/// [`lower`] with the types of the program's inputs.
pub fn lower_with<'p>(
    program: &'p Program,
    name: &str,
    roots: Option<&'p DataRoots>,
    inputs: &'p Inputs,
) -> Result<Lowered, Vec<Diagnostic>> {
    let mut l = Lowerer {
        inputs,
        models: Vec::new(),
        input_values: HashMap::new(),
        g: Graph::new(name),
        program,
        roots,
        writes: Vec::new(),
        files: Default::default(),
        scopes: vec![HashMap::new()],
        fns: Vec::new(),
        prints: Vec::new(),
        types: Default::default(),
        diags: Vec::new(),
        call_depth: 0,
        row_symbols: 0,
    };
    for s in &program.stmts {
        if let Err(d) = l.stmt(s) {
            l.diags.push(d);
        }
    }
    if !l.diags.is_empty() {
        return Err(l.diags);
    }
    Ok(Lowered {
        graph: xpu_ir::passes::eliminate_dead_code(&l.g),
        prints: l.prints,
        writes: l.writes,
        types: l.types,
        files: l.files.into_inner(),
    })
}

impl<'p> Lowerer<'p> {
    /// The value of `input(name)`: a tensor, or a table with the columns of the file given
    /// for it (open, so names go unchecked, when no file types it: `xpuctl check`).
    fn input_val(&self, name: &str, v: ValueId) -> Val {
        if self.g.value(v).ty.dtype != DType::Table {
            return Val::Tensor(v);
        }
        let schema = match self.inputs.table_columns.get(name) {
            Some(columns) => Schema { columns: columns.clone(), open: false },
            None => Schema { columns: Vec::new(), open: true },
        };
        Val::Table(v, std::rc::Rc::new(schema))
    }

    fn lookup(&self, name: &str) -> Option<&Val> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    fn stmt(&mut self, s: &'p Stmt) -> R<Val> {
        match &s.kind {
            StmtKind::Let { name, value, .. } => {
                let v = self.expr(value).unwrap_or_else(|d| {
                    self.diags.push(d);
                    Val::Poison
                });
                self.scopes.last_mut().expect("scope").insert(name.name.clone(), v);
                Ok(Val::Null)
            }
            StmtKind::Assign { name, value } => {
                let v = self.expr(value)?;
                for scope in self.scopes.iter_mut().rev() {
                    if let Some(slot) = scope.get_mut(&name.name) {
                        *slot = v;
                        return Ok(Val::Null);
                    }
                }
                Err(err("E0100", name.span, format!("unknown name `{}`", name.name)))
            }
            StmtKind::Fn { name, params, body } => {
                self.fns.push((params, body));
                let id = self.fns.len() - 1;
                self.scopes.last_mut().expect("scope").insert(name.name.clone(), Val::Func(id));
                Ok(Val::Null)
            }
            StmtKind::For { var, iter, body } => {
                let items = match self.expr(iter)? {
                    Val::List(items) => items,
                    // Checked before materialising: `0..10**12` must not allocate.
                    Val::Range(a, b) if b.saturating_sub(a) > 100_000 => {
                        return Err(err(
                            "E0202",
                            iter.span,
                            format!(
                                "`for` unrolls {} iterations; the limit is 100,000",
                                b.saturating_sub(a)
                            ),
                        ));
                    }
                    Val::Range(a, b) => (a..b).map(Val::Int).collect(),
                    Val::Poison => return Ok(Val::Poison),
                    other => {
                        return Err(err(
                            "E0202",
                            iter.span,
                            format!(
                                "`for` needs a list or a range known at compile time, not {}",
                                kind(&other)
                            ),
                        )
                        .label("not a list or range"));
                    }
                };
                if items.len() > 100_000 {
                    return Err(err(
                        "E0202",
                        iter.span,
                        format!("`for` unrolls {} iterations; the limit is 100,000", items.len()),
                    ));
                }
                for item in items {
                    self.scopes.push(HashMap::from([(var.name.clone(), item)]));
                    let r = self.block(body);
                    self.scopes.pop();
                    r?;
                }
                Ok(Val::Null)
            }
            StmtKind::Print(e) => {
                let v = self.expr(e)?;
                self.print(v);
                Ok(Val::Null)
            }
            StmtKind::Expr(e) => self.expr(e),
        }
    }

    /// A tensor becomes a graph output printed after the run; a list holding tensors (a
    /// model's outputs) prints each item; anything else prints now, as text.
    fn print(&mut self, v: Val) {
        match v {
            Val::Tensor(t) => {
                let name = format!("print_{}", self.prints.len());
                self.g.add_output(name.clone(), t);
                self.prints.push(PrintItem::Output(name));
            }
            Val::List(items) if items.iter().any(|i| matches!(i, Val::Tensor(_))) => {
                for item in items {
                    self.print(item);
                }
            }
            Val::Table(t, schema) => {
                let name = format!("print_{}", self.prints.len());
                self.g.add_output(name.clone(), t);
                self.types.insert(name.clone(), schema.describe());
                self.prints.push(PrintItem::Output(name));
            }
            v @ Val::Column(..) => match self.as_table(v, Span::default()) {
                Ok((t, schema)) => self.print(Val::Table(t, schema)),
                Err(d) => self.diags.push(d),
            },
            Val::Poison => {}
            other => self.prints.push(PrintItem::Text(display(&other))),
        }
    }

    fn block(&mut self, b: &'p Block) -> R<Val> {
        self.scopes.push(HashMap::new());
        let mut last = Val::Null;
        let mut result = Ok(());
        for s in &b.stmts {
            match self.stmt(s) {
                Ok(v) => last = if matches!(s.kind, StmtKind::Expr(_)) { v } else { Val::Null },
                Err(d) => {
                    result = Err(d);
                    break;
                }
            }
        }
        self.scopes.pop();
        result.map(|_| last)
    }

    fn expr(&mut self, e: &'p Expr) -> R<Val> {
        match &e.kind {
            ExprKind::Int(v) => Ok(Val::Int(*v)),
            ExprKind::Float(v) => Ok(Val::Float(*v)),
            ExprKind::Str(s) => Ok(Val::Str(s.clone())),
            ExprKind::Bool(b) => Ok(Val::Bool(*b)),
            ExprKind::Null => Ok(Val::Null),
            ExprKind::Error => Ok(Val::Poison),
            ExprKind::Name(n) => match self.lookup(n) {
                Some(v) => Ok(v.clone()),
                None if is_builtin(n) => {
                    Err(err("E0204", e.span, format!("`{n}` is a function; call it with (…)")))
                }
                None => Err(err("E0100", e.span, format!("unknown name `{n}`"))),
            },
            ExprKind::List(items) => {
                let vals = items.iter().map(|i| self.expr(i)).collect::<R<Vec<_>>>()?;
                Ok(Val::List(vals))
            }
            ExprKind::Range { start, end } => {
                let a = self.int(start)?;
                let b = self.int(end)?;
                Ok(Val::Range(a, b))
            }
            ExprKind::Unary { op, expr } => {
                let v = self.expr(expr)?;
                match (op, v) {
                    (_, Val::Poison) => Ok(Val::Poison),
                    (UnOp::Neg, Val::Int(i)) => i
                        .checked_neg()
                        .map(Val::Int)
                        .ok_or_else(|| err("E0201", e.span, format!("-({i}) overflows 64 bits"))),
                    (UnOp::Neg, Val::Float(f)) => Ok(Val::Float(-f)),
                    (UnOp::Not, Val::Bool(b)) => Ok(Val::Bool(!b)),
                    (UnOp::Neg, v @ (Val::Tensor(_) | Val::List(_))) => {
                        let t = self.as_tensor(v, e.span, None)?;
                        self.op(Op::Neg, &[t], Attrs::new(), e.span)
                    }
                    (UnOp::Not, v @ (Val::Tensor(_) | Val::List(_))) => {
                        let t = self.as_tensor(v, e.span, None)?;
                        self.op(Op::Not, &[t], Attrs::new(), e.span)
                    }
                    (op, v) => Err(err(
                        "E0201",
                        e.span,
                        format!(
                            "`{}` does not apply to {}",
                            if *op == UnOp::Neg { "-" } else { "not" },
                            kind(&v)
                        ),
                    )),
                }
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let a = self.expr(lhs)?;
                let b = self.expr(rhs)?;
                self.binary(*op, a, b, e.span)
            }
            ExprKind::If { cond, then, otherwise } => match self.expr(cond)? {
                Val::Bool(true) => self.block(then),
                Val::Bool(false) => match otherwise {
                    Some(b) => self.block(b),
                    None => Ok(Val::Null),
                },
                Val::Poison => Ok(Val::Poison),
                other => Err(err(
                    "E0203",
                    cond.span,
                    format!("`if` needs a condition known at compile time, not {}", kind(&other)),
                )
                .label("not a compile-time bool")
                .help(Some(
                    "for an elementwise choice between tensors use where(cond, a, b)".into(),
                ))),
            },
            ExprKind::Call { callee, args, .. } => self.call(callee, args, e.span),
            ExprKind::Index { target, items } => {
                let t = self.expr(target)?;
                self.index(t, items, e.span)
            }
            ExprKind::Field { target, name } => {
                let t = self.expr(target)?;
                self.column(t, &name.name, name.span)
            }
        }
    }

    fn int(&mut self, e: &'p Expr) -> R<i64> {
        match self.expr(e)? {
            Val::Int(i) => Ok(i),
            other => Err(err(
                "E0201",
                e.span,
                format!("expected an integer known at compile time, found {}", kind(&other)),
            )),
        }
    }

    fn op(&mut self, op: Op, inputs: &[ValueId], attrs: Attrs, span: Span) -> R<Val> {
        let v = self.g.add_op(op, inputs, attrs).map_err(|e| {
            err("E0205", span, e.to_string()).label(format!("{op}: shapes or types do not fit"))
        })?;
        // Nodes are named after the source position that made them (`job:3:9`): plans,
        // explanations and policy rules (`when = { node = "job:3:*" }`) can point at lines.
        let (line, col) = self.program.line_col(span.start);
        let node = self.g.producer(v).expect("just added");
        self.g.nodes[node.index()].name = Some(format!("{}:{line}:{col}", self.g.name));
        Ok(Val::Tensor(v))
    }

    fn constant(&mut self, t: Tensor) -> ValueId {
        self.g.add_const(t)
    }

    /// A value as a tensor; scalars take `like`'s dtype when given.
    fn as_tensor(&mut self, v: Val, span: Span, like: Option<DType>) -> R<ValueId> {
        match v {
            Val::Tensor(t) => Ok(t),
            Val::Int(i) => Ok(self.constant(scalar(i as f64, like.unwrap_or(DType::I64)))),
            Val::Float(f) => {
                Ok(self.constant(scalar(f, like.filter(|d| d.is_float()).unwrap_or(DType::F64))))
            }
            Val::Bool(b) => Ok(self.constant(Tensor::scalar(b))),
            // A model with several outputs returns a list of tensors; a stacked tensor
            // literal of them is not what anyone means.
            Val::List(items) if items.iter().any(|i| matches!(i, Val::Tensor(_))) => Err(err(
                "E0201",
                span,
                format!("expected a tensor, found a list of {} tensors", items.len()),
            )
            .help(Some(
                "a model with several outputs returns them as a list: pick one, e.g. m(x)[0]; \
                 stack tensors with concat([a, b], axis = 0)"
                    .into(),
            ))),
            Val::List(_) => {
                let t = list_tensor(&v).map_err(|m| err("E0201", span, m))?;
                Ok(self.constant(t))
            }
            other => Err(err(
                "E0201",
                span,
                format!("expected a tensor or number, found {}", kind(&other)),
            )),
        }
    }

    fn binary(&mut self, op: BinOp, a: Val, b: Val, span: Span) -> R<Val> {
        use Val::*;
        if matches!(a, Poison) || matches!(b, Poison) {
            return Ok(Poison);
        }
        // Compile-time arithmetic and logic.
        let num = |v: &Val| match v {
            Int(i) => Some(*i as f64),
            Float(f) => Some(*f),
            _ => None,
        };
        match (&a, &b) {
            (Int(x), Int(y)) => {
                let (x, y) = (*x, *y);
                let r = match op {
                    BinOp::Add => x.checked_add(y).map(Int),
                    BinOp::Sub => x.checked_sub(y).map(Int),
                    BinOp::Mul => x.checked_mul(y).map(Int),
                    BinOp::Div => (y != 0).then(|| Float(x as f64 / y as f64)),
                    BinOp::Rem => x.checked_rem_euclid(y).map(Int),
                    BinOp::Pow => u32::try_from(y)
                        .ok()
                        .and_then(|y| x.checked_pow(y))
                        .map(Int)
                        .or(Some(Float((x as f64).powf(y as f64)))),
                    BinOp::Eq => Some(Bool(x == y)),
                    BinOp::Ne => Some(Bool(x != y)),
                    BinOp::Lt => Some(Bool(x < y)),
                    BinOp::Le => Some(Bool(x <= y)),
                    BinOp::Gt => Some(Bool(x > y)),
                    BinOp::Ge => Some(Bool(x >= y)),
                    _ => None,
                };
                return r.ok_or_else(|| err("E0201", span, format!("`{}` on {x} and {y}: overflow, division by zero or not defined for integers", op.symbol())));
            }
            (Int(_) | Float(_), Int(_) | Float(_)) => {
                let (x, y) = (num(&a).expect("number"), num(&b).expect("number"));
                return Ok(match op {
                    BinOp::Add => Float(x + y),
                    BinOp::Sub => Float(x - y),
                    BinOp::Mul => Float(x * y),
                    BinOp::Div => Float(x / y),
                    BinOp::Rem => Float(x.rem_euclid(y)),
                    BinOp::Pow => Float(x.powf(y)),
                    BinOp::Eq => Bool(x == y),
                    BinOp::Ne => Bool(x != y),
                    BinOp::Lt => Bool(x < y),
                    BinOp::Le => Bool(x <= y),
                    BinOp::Gt => Bool(x > y),
                    BinOp::Ge => Bool(x >= y),
                    _ => {
                        return Err(err(
                            "E0201",
                            span,
                            format!("`{}` does not apply to numbers", op.symbol()),
                        ));
                    }
                });
            }
            (Bool(x), Bool(y)) => {
                return match op {
                    BinOp::And => Ok(Bool(*x && *y)),
                    BinOp::Or => Ok(Bool(*x || *y)),
                    BinOp::Eq => Ok(Bool(x == y)),
                    BinOp::Ne => Ok(Bool(x != y)),
                    _ => Err(err(
                        "E0201",
                        span,
                        format!("`{}` does not apply to booleans", op.symbol()),
                    )),
                };
            }
            // Lists that hold text (column names) join with `+`; numeric lists are tensors.
            (List(x), List(y)) if op == BinOp::Add && (holds_text(x) || holds_text(y)) => {
                return Ok(List(x.iter().chain(y).cloned().collect()));
            }
            (Str(x), Str(y)) => {
                return match op {
                    BinOp::Add => Ok(Str(format!("{x}{y}"))),
                    BinOp::Eq => Ok(Bool(x == y)),
                    BinOp::Ne => Ok(Bool(x != y)),
                    _ => Err(err(
                        "E0201",
                        span,
                        format!("`{}` does not apply to strings", op.symbol()),
                    )),
                };
            }
            _ => {}
        }
        // Tensors: scalars take the tensor's dtype.
        let like = match (&a, &b) {
            (Tensor(t), _) | (_, Tensor(t)) => Some(self.g.ty(*t).dtype),
            _ => None,
        };
        let (is_tensor_a, is_tensor_b) =
            (matches!(a, Tensor(_) | List(_)), matches!(b, Tensor(_) | List(_)));
        if !is_tensor_a && !is_tensor_b {
            return Err(err(
                "E0201",
                span,
                format!("`{}` does not apply to {} and {}", op.symbol(), kind(&a), kind(&b)),
            ));
        }
        let x = self.as_tensor(a, span, like)?;
        let like = like.or(Some(self.g.ty(x).dtype));
        let y = self.as_tensor(b, span, like)?;
        let graph_op = match op {
            BinOp::Add => Op::Add,
            BinOp::Sub => Op::Sub,
            BinOp::Mul => Op::Mul,
            BinOp::Div => Op::Div,
            BinOp::Rem => Op::Mod,
            BinOp::Pow => Op::Pow,
            BinOp::MatMul => Op::MatMul,
            BinOp::Eq => Op::Equal,
            BinOp::Lt => Op::Less,
            BinOp::Le => Op::LessOrEqual,
            BinOp::Gt => Op::Greater,
            BinOp::Ge => Op::GreaterOrEqual,
            BinOp::And => Op::And,
            BinOp::Or => Op::Or,
            BinOp::Ne => {
                let eq = self.op(Op::Equal, &[x, y], Attrs::new(), span)?;
                let Val::Tensor(eq) = eq else { unreachable!("op returns a tensor") };
                return self.op(Op::Not, &[eq], Attrs::new(), span);
            }
        };
        let attrs = if graph_op == Op::Mod && self.g.ty(x).dtype.is_float() {
            Attrs::new().with("fmod", Attr::Int(1))
        } else {
            Attrs::new()
        };
        self.op(graph_op, &[x, y], attrs, span)
    }

    fn call(&mut self, callee: &'p Expr, args: &'p [Arg], span: Span) -> R<Val> {
        let ExprKind::Name(name) = &callee.kind else {
            return Err(err("E0204", callee.span, "only named functions can be called"));
        };
        match self.lookup(name).cloned() {
            Some(Val::Func(id)) => return self.call_user(id, name, args, span),
            Some(Val::Model(id)) => return self.call_model(id, args, span),
            Some(_) => {}
            None if crate::builtins::is_column_scoped(name) => {
                return self.call_column_scoped(name, args, span);
            }
            None => {}
        }
        let mut positional = Vec::new();
        let mut named: HashMap<&str, (Val, Span)> = HashMap::new();
        for a in args {
            let v = self.expr(&a.value)?;
            if matches!(v, Val::Poison) {
                return Ok(Val::Poison);
            }
            match &a.name {
                Some(n) => {
                    named.insert(n.name.as_str(), (v, n.span));
                }
                None => positional.push((v, a.value.span)),
            }
        }
        let mut b = Builtin { l: self, name, span, positional, named };
        b.run()
    }

    /// Inlines a model's graph on `args` (one per model input, in order); its nodes are
    /// re-typed for the arguments' shapes and keep their names under the model's.
    fn call_model(&mut self, id: usize, args: &'p [Arg], span: Span) -> R<Val> {
        let (m, stem) = self.models[id].clone();
        if args.len() != m.inputs.len() {
            let names: Vec<String> =
                m.inputs.iter().map(|&v| m.value(v).name.clone().unwrap_or_default()).collect();
            return Err(err(
                "E0206",
                span,
                format!(
                    "model `{stem}` takes {} input(s) ({}), got {}",
                    m.inputs.len(),
                    names.join(", "),
                    args.len()
                ),
            ));
        }
        let mut map: Vec<Option<ValueId>> = vec![None; m.values.len()];
        for (a, &mv) in args.iter().zip(&m.inputs) {
            let v = self.expr(&a.value)?;
            let want = m.ty(mv).dtype;
            let t = self.as_tensor(v, a.value.span, Some(want))?;
            let got = self.g.ty(t).dtype;
            if got != want {
                let name = m.value(mv).name.clone().unwrap_or_default();
                return Err(err(
                    "E0205",
                    a.value.span,
                    format!("model input `{name}` is {want}, this is {got}"),
                )
                .help(Some(format!("convert it: cast(x, \"{want}\")"))));
            }
            map[mv.index()] = Some(t);
        }
        for n in &m.nodes {
            let inputs: Vec<Option<ValueId>> = n
                .inputs
                .iter()
                .map(|v| v.map(|v| map[v.index()].expect("defined earlier")))
                .collect();
            let types =
                self.g.infer_node_types(n.op, &inputs, &n.attrs, n.outputs.len()).map_err(|e| {
                    err("E0205", span, format!("model `{stem}`, {}: {e}", n.op))
                        .label("the arguments do not fit the model")
                })?;
            let id = self.g.add_node(n.op, inputs, n.attrs.clone(), types);
            self.g.nodes[id.index()].name =
                Some(format!("{stem}/{}", n.name.clone().unwrap_or_else(|| n.op.to_string())));
            for (k, &old) in n.outputs.iter().enumerate() {
                map[old.index()] = Some(self.g.nodes[id.index()].outputs[k]);
            }
        }
        let outs: Vec<Val> = m
            .outputs
            .iter()
            .map(|o| Val::Tensor(map[o.value.index()].expect("outputs are defined")))
            .collect();
        Ok(if outs.len() == 1 { outs.into_iter().next().expect("one") } else { Val::List(outs) })
    }

    fn call_user(&mut self, id: usize, name: &str, args: &'p [Arg], span: Span) -> R<Val> {
        let (params, body) = self.fns[id];
        if self.call_depth > 64 {
            return Err(err(
                "E0102",
                span,
                format!("`{name}` is inlined more than 64 levels deep"),
            ));
        }
        let mut scope = HashMap::new();
        let mut next = 0;
        for a in args {
            let v = self.expr(&a.value)?;
            let slot = match &a.name {
                Some(n) => params.iter().position(|p| p.name.name == n.name).ok_or_else(|| {
                    err("E0206", n.span, format!("`{name}` has no parameter `{}`", n.name))
                        .label("unknown parameter")
                })?,
                None => {
                    next += 1;
                    next - 1
                }
            };
            let Some(p) = params.get(slot) else {
                return Err(err(
                    "E0206",
                    a.value.span,
                    format!("`{name}` takes {} argument(s)", params.len()),
                )
                .label("one too many"));
            };
            scope.insert(p.name.name.clone(), v);
        }
        for p in params {
            if !scope.contains_key(&p.name.name) {
                let v = match &p.default {
                    Some(d) => self.expr(d)?,
                    None => {
                        return Err(err(
                            "E0206",
                            span,
                            format!("`{name}` needs argument `{}`", p.name.name),
                        )
                        .label("missing argument"));
                    }
                };
                scope.insert(p.name.name.clone(), v);
            }
        }
        self.scopes.push(scope);
        self.call_depth += 1;
        let r = self.block(body);
        self.call_depth -= 1;
        self.scopes.pop();
        r
    }

    fn index(&mut self, target: Val, items: &'p [IndexItem], span: Span) -> R<Val> {
        // `t["Age"]` is a column, `t[["Age", "Fare"]]` a selection.
        if let Val::Table(t, schema) = &target {
            let [IndexItem::At(e)] = items else {
                return Err(err(
                    "E0207",
                    span,
                    "index a table by a column name or a list of names",
                ));
            };
            return match self.expr(e)? {
                Val::Str(c) => self.column(target.clone(), &c, e.span),
                Val::List(names) => {
                    let mut cols = Vec::new();
                    for n in names {
                        let Val::Str(c) = n else {
                            return Err(err("E0201", e.span, "column names are strings"));
                        };
                        let Val::Column(_, _, c) = self.column(target.clone(), &c, e.span)? else {
                            unreachable!("column() returns a column")
                        };
                        cols.push(c);
                    }
                    let out = Schema {
                        columns: cols
                            .iter()
                            .map(|c| (c.clone(), schema.get(c).unwrap_or(DType::F64)))
                            .collect(),
                        open: false,
                    };
                    let attrs = Attrs::new().with("columns", Attr::Strs(cols));
                    self.table(Op::SelectColumns, &[*t], attrs, out, span)
                }
                other => Err(err(
                    "E0201",
                    e.span,
                    format!("index a table by a column name, not {}", kind(&other)),
                )),
            };
        }
        // A slice of a list that holds text (`columns(t)[0:3]`) is a list; a numeric list is
        // a tensor, sliced below.
        if let Val::List(list) = &target
            && holds_text(list)
            && let [IndexItem::Slice { start, end }] = items
        {
            let n = list.len() as i64;
            let clamp = |i: i64| (if i < 0 { i + n } else { i }).clamp(0, n) as usize;
            let from = match start {
                Some(e) => clamp(self.int(e)?),
                None => 0,
            };
            let to = match end {
                Some(e) => clamp(self.int(e)?),
                None => n as usize,
            };
            return Ok(Val::List(list[from.min(to)..to].to_vec()));
        }
        if let Val::List(list) = &target
            && let [IndexItem::At(e)] = items
        {
            {
                let i = self.int(e)?;
                let n = list.len() as i64;
                let k = if i < 0 { i + n } else { i };
                return list.get(k as usize).cloned().filter(|_| (0..n).contains(&k)).ok_or_else(
                    || err("E0207", e.span, format!("index {i} is out of range for a list of {n}")),
                );
            }
        }
        let t = self.as_tensor(target, span, None)?;
        let rank = self.g.ty(t).dims.as_ref().map(|d| d.len()).unwrap_or(0);
        if items.len() > rank {
            return Err(err(
                "E0207",
                span,
                format!("{} indices for a tensor of rank {rank}", items.len()),
            ));
        }
        let (mut starts, mut ends, mut axes, mut squeeze) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (axis, it) in items.iter().enumerate() {
            match it {
                IndexItem::At(e) => {
                    let i = self.int(e)?;
                    starts.push(i);
                    ends.push(if i == -1 { i64::MAX } else { i.saturating_add(1) });
                    squeeze.push(axis as i64);
                }
                IndexItem::Slice { start, end } => {
                    let s = match start {
                        Some(e) => self.int(e)?,
                        None => 0,
                    };
                    let e = match end {
                        Some(e) => self.int(e)?,
                        None => i64::MAX,
                    };
                    starts.push(s);
                    ends.push(e);
                }
            }
            axes.push(axis as i64);
        }
        let n = starts.len();
        let c = |v: Vec<i64>| Tensor::from_vec(vec![n], v).expect("1-D");
        let (s, e, a) = (self.constant(c(starts)), self.constant(c(ends)), self.constant(c(axes)));
        let Val::Tensor(sliced) = self.op(Op::Slice, &[t, s, e, a], Attrs::new(), span)? else {
            unreachable!()
        };
        if squeeze.is_empty() {
            return Ok(Val::Tensor(sliced));
        }
        let k = squeeze.len();
        let sq = self.constant(Tensor::from_vec(vec![k], squeeze).expect("1-D"));
        self.op(Op::Squeeze, &[sliced, sq], Attrs::new(), span)
    }
}

struct Builtin<'a, 'p> {
    l: &'a mut Lowerer<'p>,
    name: &'a str,
    span: Span,
    positional: Vec<(Val, Span)>,
    named: HashMap<&'a str, (Val, Span)>,
}

impl Builtin<'_, '_> {
    fn arg(&mut self, i: usize, name: &str) -> Option<(Val, Span)> {
        self.named.remove(name).or_else(|| self.positional.get(i).cloned())
    }

    fn need(&mut self, i: usize, name: &str) -> R<(Val, Span)> {
        let (f, span) = (self.name.to_string(), self.span);
        self.arg(i, name).ok_or_else(|| {
            err("E0206", span, format!("`{f}` needs argument `{name}`")).label("missing argument")
        })
    }

    /// A path the program names, resolved inside the data roots (CWE-22); the error sits at
    /// the path's span.
    fn resolve(&self, path: &str, span: Span, write: bool) -> R<std::path::PathBuf> {
        let Some(roots) = self.l.roots else {
            return Err(err(
                "E0301",
                span,
                "no data roots are configured: this program may not touch files",
            ));
        };
        let resolved = if write { roots.resolve_write(path) } else { roots.resolve_read(path) };
        let resolved = resolved.map_err(|m| {
            err("E0301", span, m).label(if write { "not allowed" } else { "cannot read" })
        })?;
        self.l.files.borrow_mut().push(resolved.clone());
        Ok(resolved)
    }

    fn tensor(&mut self, i: usize, name: &str) -> R<ValueId> {
        let (v, span) = self.need(i, name)?;
        self.l.as_tensor(v, span, None)
    }

    fn ints(&mut self, i: usize, name: &str) -> R<Option<Vec<i64>>> {
        match self.arg(i, name) {
            None | Some((Val::Null, _)) => Ok(None),
            Some((Val::Int(v), _)) => Ok(Some(vec![v])),
            Some((Val::List(items), span)) => items
                .iter()
                .map(|v| match v {
                    Val::Int(i) => Ok(*i),
                    other => Err(err(
                        "E0201",
                        span,
                        format!("`{name}` must be integers, found {}", kind(other)),
                    )),
                })
                .collect::<R<Vec<_>>>()
                .map(Some),
            Some((other, span)) => Err(err(
                "E0201",
                span,
                format!(
                    "`{name}` must be an integer or a list of integers, found {}",
                    kind(&other)
                ),
            )),
        }
    }

    fn flag(&mut self, name: &str) -> R<bool> {
        match self.named.remove(name) {
            None => Ok(false),
            Some((Val::Bool(b), _)) => Ok(b),
            Some((other, span)) => Err(err(
                "E0201",
                span,
                format!("`{name}` must be true or false, found {}", kind(&other)),
            )),
        }
    }

    fn shape(&mut self) -> R<Vec<usize>> {
        let (f, span) = (self.name.to_string(), self.span);
        let dims = self
            .ints(0, "shape")?
            .ok_or_else(|| err("E0206", span, format!("`{f}` needs a shape")))?;
        dims.iter()
            .map(|&d| {
                usize::try_from(d)
                    .map_err(|_| err("E0201", span, format!("shape dims must be ≥ 0, found {d}")))
            })
            .collect::<R<Vec<_>>>()
            .and_then(|s| {
                if s.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none_or(|n| n > 1 << 24) {
                    Err(err("E0201", span, "a constant of more than 2^24 elements (16M); build large tensors from inputs"))
                } else {
                    Ok(s)
                }
            })
    }

    fn run(&mut self) -> R<Val> {
        let span = self.span;
        if let Some(r) = self.run_table() {
            return r;
        }
        let elementwise = match self.name {
            "relu" => Some(Op::Relu),
            "tanh" => Some(Op::Tanh),
            "sigmoid" => Some(Op::Sigmoid),
            "exp" => Some(Op::Exp),
            "log" => Some(Op::Log),
            "sqrt" => Some(Op::Sqrt),
            "abs" => Some(Op::Abs),
            "gelu" => Some(Op::Gelu),
            _ => None,
        };
        if let Some(op) = elementwise {
            let x = self.tensor(0, "x")?;
            return self.l.op(op, &[x], Attrs::new(), span);
        }
        match self.name {
            "softmax" => {
                let x = self.tensor(0, "x")?;
                let axis = self.ints(1, "axis")?.and_then(|v| v.first().copied()).unwrap_or(-1);
                self.l.op(Op::Softmax, &[x], Attrs::new().with("axis", Attr::Int(axis)), span)
            }
            "sum" | "mean" | "max" | "min" => {
                let x = self.tensor(0, "x")?;
                let op = match self.name {
                    "sum" => Op::ReduceSum,
                    "mean" => Op::ReduceMean,
                    "max" => Op::ReduceMax,
                    _ => Op::ReduceMin,
                };
                let keep = self.flag("keepdims")?;
                let mut inputs = vec![x];
                if let Some(axes) = self.ints(1, "axis")? {
                    let n = axes.len();
                    inputs.push(self.l.constant(Tensor::from_vec(vec![n], axes).expect("1-D")));
                }
                self.l.op(op, &inputs, Attrs::new().with("keepdims", Attr::Int(keep as i64)), span)
            }
            "reshape" => {
                let x = self.tensor(0, "x")?;
                let dims = self
                    .ints(1, "shape")?
                    .ok_or_else(|| err("E0206", span, "`reshape` needs a shape"))?;
                let n = dims.len();
                let s = self.l.constant(Tensor::from_vec(vec![n], dims).expect("1-D"));
                self.l.op(Op::Reshape, &[x, s], Attrs::new(), span)
            }
            "transpose" => {
                let x = self.tensor(0, "x")?;
                let attrs = match self.ints(1, "perm")? {
                    Some(p) => Attrs::new().with("perm", Attr::Ints(p)),
                    None => Attrs::new(),
                };
                self.l.op(Op::Transpose, &[x], attrs, span)
            }
            "concat" => {
                let (list, lspan) = self.need(0, "tensors")?;
                let Val::List(items) = list else {
                    return Err(err("E0201", lspan, "`concat` takes a list of tensors or tables"));
                };
                if items.iter().any(|i| matches!(i, Val::Table(..) | Val::Column(..))) {
                    let mut parts = Vec::new();
                    let mut schemas = Vec::new();
                    for item in items {
                        let (t, s) = self.l.as_table(item, lspan)?;
                        parts.push(t);
                        schemas.push(s);
                    }
                    let schema = tables::concat_schema(&schemas);
                    return self.l.table(Op::ConcatTables, &parts, Attrs::new(), schema, span);
                }
                let axis = self.ints(1, "axis")?.and_then(|v| v.first().copied()).unwrap_or(0);
                let ts = items
                    .into_iter()
                    .map(|v| self.l.as_tensor(v, lspan, None))
                    .collect::<R<Vec<_>>>()?;
                self.l.op(Op::Concat, &ts, Attrs::new().with("axis", Attr::Int(axis)), span)
            }
            "where" => {
                let c = self.tensor(0, "cond")?;
                let a = self.tensor(1, "a")?;
                let like = Some(self.l.g.ty(a).dtype);
                let (bv, bspan) = self.need(2, "b")?;
                let b = self.l.as_tensor(bv, bspan, like)?;
                self.l.op(Op::Where, &[c, a, b], Attrs::new(), span)
            }
            "cast" => {
                let x = self.tensor(0, "x")?;
                let (v, dspan) = self.need(1, "dtype")?;
                let Val::Str(d) = v else {
                    return Err(err("E0201", dspan, "`cast` takes a dtype name such as \"f32\""));
                };
                let dt: DType =
                    d.parse().map_err(|_| err("E0201", dspan, format!("unknown dtype `{d}`")))?;
                self.l.op(Op::Cast, &[x], Attrs::new().with("to", Attr::DType(dt)), span)
            }
            "zeros" | "ones" => {
                let shape = self.shape()?;
                let n: usize = shape.iter().product();
                let v = if self.name == "ones" { 1.0 } else { 0.0 };
                Ok(Val::Tensor(
                    self.l.constant(Tensor::from_vec(shape, vec![v; n]).expect("shape")),
                ))
            }
            "full" => {
                let shape = self.shape()?;
                let n: usize = shape.iter().product();
                let (v, vspan) = self.need(1, "value")?;
                let t = match v {
                    Val::Int(i) => Tensor::from_vec(shape, vec![i; n]),
                    Val::Float(f) => Tensor::from_vec(shape, vec![f; n]),
                    Val::Bool(b) => Tensor::from_vec(shape, vec![b; n]),
                    other => {
                        return Err(err(
                            "E0201",
                            vspan,
                            format!("`full` fills with a number or bool, not {}", kind(&other)),
                        ));
                    }
                }
                .expect("shape");
                Ok(Val::Tensor(self.l.constant(t)))
            }
            "arange" => {
                let a = self.ints(0, "start")?.and_then(|v| v.first().copied());
                let b = self.ints(1, "stop")?.and_then(|v| v.first().copied());
                let step = self.ints(2, "step")?.and_then(|v| v.first().copied()).unwrap_or(1);
                let (start, stop) = match (a, b) {
                    (Some(n), None) => (0, n),
                    (Some(s), Some(e)) => (s, e),
                    _ => return Err(err("E0206", span, "`arange` needs a stop")),
                };
                if step == 0 {
                    return Err(err("E0201", span, "`arange` step must not be 0"));
                }
                let count = (stop as i128 - start as i128) / step as i128;
                if count > 1 << 24 {
                    return Err(err("E0201", span, "`arange` would make more than 2^24 elements"));
                }
                let v: Vec<i64> = if step > 0 {
                    (start..stop).step_by(step as usize).collect()
                } else {
                    (stop + 1..=start).rev().step_by(step.unsigned_abs() as usize).collect()
                };
                if v.len() > 1 << 24 {
                    return Err(err("E0201", span, "`arange` would make more than 2^24 elements"));
                }
                let n = v.len();
                Ok(Val::Tensor(self.l.constant(Tensor::from_vec(vec![n], v).expect("1-D"))))
            }
            "randn" => {
                let shape = self.shape()?;
                let seed = self.ints(1, "seed")?.and_then(|v| v.first().copied()).unwrap_or(0);
                let n: usize = shape.iter().product();
                Ok(Val::Tensor(
                    self.l
                        .constant(Tensor::from_vec(shape, normal(n, seed as u64)).expect("shape")),
                ))
            }
            "shape" => {
                let x = self.tensor(0, "x")?;
                let dims = self.l.g.ty(x).dims.clone().unwrap_or_default();
                Ok(Val::List(
                    dims.iter()
                        .map(|d| match d {
                            Dim::Known(k) => Val::Int(*k as i64),
                            _ => Val::Null,
                        })
                        .collect(),
                ))
            }
            "model" => {
                let (p, pspan) = self.need(0, "path")?;
                let Val::Str(path) = p else {
                    return Err(err("E0201", pspan, "`model` takes the model's path as a string"));
                };
                let file = self.resolve(&path, pspan, false)?;
                let Some(loader) = self.l.inputs.models.clone() else {
                    return Err(err("E0300", span, "models cannot be loaded here"));
                };
                let g = loader(&file)
                    .map_err(|m| err("E0303", pspan, format!("cannot load model `{path}`: {m}")))?;
                let stem =
                    file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
                self.l.models.push((g, stem));
                Ok(Val::Model(self.l.models.len() - 1))
            }
            "input" => {
                let (n, nspan) = self.need(0, "name")?;
                let Val::Str(name) = n else {
                    return Err(err("E0201", nspan, "`input` takes the input's name as a string"));
                };
                if let Some(&v) = self.l.input_values.get(&name) {
                    return Ok(self.l.input_val(&name, v));
                }
                let declared_dtype = match self.arg(1, "dtype") {
                    None => None,
                    Some((Val::Str(d), dspan)) => Some(
                        d.parse::<DType>()
                            .map_err(|_| err("E0201", dspan, format!("unknown dtype `{d}`")))?,
                    ),
                    Some((_, dspan)) => {
                        return Err(err("E0201", dspan, "`dtype` is a name such as \"f64\""));
                    }
                };
                let declared_dims = match self.arg(2, "shape") {
                    None => None,
                    Some((Val::List(items), sspan)) => Some(
                        items
                            .iter()
                            .map(|d| match d {
                                Val::Int(k) if *k >= 0 => Ok(Dim::Known(*k as u64)),
                                Val::Str(s) => Ok(Dim::Sym(s.clone())),
                                other => Err(err(
                                    "E0201",
                                    sspan,
                                    format!(
                                        "a dim is a size or a symbol name, not {}",
                                        kind(other)
                                    ),
                                )),
                            })
                            .collect::<R<Vec<_>>>()?,
                    ),
                    Some((_, sspan)) => {
                        return Err(err(
                            "E0201",
                            sspan,
                            "`shape` is a list of sizes or symbol names",
                        ));
                    }
                };
                let ty = match self.l.inputs.types.get(&name) {
                    Some(given) => {
                        if declared_dtype.is_some_and(|d| d != given.dtype) {
                            return Err(err(
                                "E0302",
                                nspan,
                                format!(
                                    "input `{name}` is declared {} but the file holds {}",
                                    declared_dtype.map(|d| d.name()).unwrap_or(""),
                                    given.dtype
                                ),
                            ));
                        }
                        if let (Some(dims), Some(got)) = (&declared_dims, &given.dims) {
                            let fits = dims.len() == got.len()
                                && dims.iter().zip(got).all(|(d, g)| !matches!((d, g), (Dim::Known(a), Dim::Known(b)) if a != b));
                            if !fits {
                                return Err(err(
                                    "E0302",
                                    nspan,
                                    format!(
                                        "input `{name}` is declared with shape {:?} but the file holds {given}",
                                        dims.iter().map(|d| d.to_string()).collect::<Vec<_>>()
                                    ),
                                ));
                            }
                        }
                        given.clone()
                    }
                    None => match (declared_dtype, declared_dims) {
                        (Some(d), Some(dims)) => TensorType::new(d, dims),
                        (d, _) if self.l.inputs.allow_undeclared => {
                            TensorType::unranked(d.unwrap_or(DType::F64))
                        }
                        (Some(DType::Table), None) => TensorType::new(DType::Table, vec![]),
                        _ => {
                            return Err(err("E0302", nspan, format!("input `{name}` is not given"))
                                .label("no file for this input")
                                .help(Some(format!("run with --input {name}=FILE.npy (a table: FILE.csv), or declare it: input(\"{name}\", dtype=\"f64\", shape=[3, 4])"))));
                        }
                    },
                };
                if ty.dtype == DType::Table && ty.dims.as_ref().is_some_and(|d| !d.is_empty()) {
                    return Err(err(
                        "E0201",
                        nspan,
                        "a table input has no shape (it is one table)",
                    ));
                }
                let v = self.l.g.add_input(name.clone(), ty);
                self.l.input_values.insert(name.clone(), v);
                Ok(self.l.input_val(&name, v))
            }
            "write_npy" => {
                let x = self.tensor(0, "tensor")?;
                let (p, pspan) = self.need(1, "path")?;
                let Val::Str(path) = p else {
                    return Err(err("E0201", pspan, "`write_npy` takes the path as a string"));
                };
                let target = self.resolve(&path, pspan, true)?;
                // Numbered like the table writes and plots (by outputs so far): unique.
                let name = format!("write_{}", self.l.g.outputs.len());
                self.l.g.add_output(name.clone(), x);
                self.l.writes.push((name, target));
                Ok(Val::Null)
            }
            "len" => match self.need(0, "x")? {
                (Val::List(v), _) => Ok(Val::Int(v.len() as i64)),
                (Val::Str(s), _) => Ok(Val::Int(s.chars().count() as i64)),
                (Val::Range(a, b), _) => Ok(Val::Int(b.saturating_sub(a).max(0))),
                (other, s) => Err(err(
                    "E0201",
                    s,
                    format!("`len` takes a list or string, not {}", kind(&other)),
                )),
            },
            n => Err(err("E0100", span, format!("unknown function `{n}`"))),
        }
    }
}

/// Whether a compile-time list holds text (column names), so it cannot be a tensor.
fn holds_text(items: &[Val]) -> bool {
    items.iter().any(|v| matches!(v, Val::Str(_)))
}

fn kind(v: &Val) -> &'static str {
    match v {
        Val::Int(_) => "an integer",
        Val::Float(_) => "a float",
        Val::Str(_) => "a string",
        Val::Bool(_) => "a bool",
        Val::Null => "null",
        Val::List(_) => "a list",
        Val::Range(..) => "a range",
        Val::Tensor(_) => "a tensor",
        Val::Table(..) => "a table",
        Val::Column(..) => "a column",
        Val::Grouped(..) => "a grouped table",
        Val::Func(_) => "a function",
        Val::Model(_) => "a model",
        Val::Poison => "an invalid value",
    }
}

fn display(v: &Val) -> String {
    match v {
        Val::Int(i) => i.to_string(),
        Val::Float(f) => format!("{f:?}"),
        Val::Str(s) => s.clone(),
        Val::Bool(b) => b.to_string(),
        Val::Null => "null".into(),
        Val::List(items) => format!(
            "[{}]",
            items
                .iter()
                .map(|i| match i {
                    Val::Str(s) => format!("{s:?}"),
                    other => display(other),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Val::Range(a, b) => format!("{a}..{b}"),
        Val::Tensor(t) => format!("{t}"),
        Val::Table(_, s) => s.describe(),
        Val::Column(_, s, c) => {
            format!("column {c}: {}", s.get(c).map(|d| d.name()).unwrap_or("?"))
        }
        Val::Grouped(_, s, keys) => format!("grouped by {} of {}", keys.join(", "), s.describe()),
        Val::Func(_) => "<function>".into(),
        Val::Model(_) => "<model>".into(),
        Val::Poison => "<error>".into(),
    }
}

fn scalar(v: f64, dtype: DType) -> Tensor {
    let t = Tensor::from_vec(vec![], vec![v]).expect("scalar");
    t.to_float_dtype(dtype).unwrap_or_else(|| match dtype {
        DType::I64 => Tensor::from_vec(vec![], vec![v as i64]).expect("scalar"),
        DType::I32 => Tensor::from_vec(vec![], vec![v as i32]).expect("scalar"),
        DType::Bool => Tensor::from_vec(vec![], vec![v != 0.0]).expect("scalar"),
        _ => t,
    })
}

/// A nested list literal as a tensor: ints → i64, any float → f64, bools → bool.
fn list_tensor(v: &Val) -> Result<Tensor, String> {
    fn shape_of(v: &Val, out: &mut Vec<usize>) {
        if let Val::List(items) = v {
            out.push(items.len());
            if let Some(first) = items.first() {
                shape_of(first, out);
            }
        }
    }
    fn flatten(v: &Val, depth: usize, shape: &[usize], out: &mut Vec<Val>) -> Result<(), String> {
        match v {
            Val::List(items) => {
                if depth >= shape.len() || items.len() != shape[depth] {
                    return Err(format!(
                        "ragged list: a row has {} items where {} are expected",
                        items.len(),
                        shape.get(depth).copied().unwrap_or(0)
                    ));
                }
                items.iter().try_for_each(|i| flatten(i, depth + 1, shape, out))
            }
            other if depth == shape.len() => {
                out.push(other.clone());
                Ok(())
            }
            _ => Err("ragged list: rows nest to different depths".into()),
        }
    }
    let mut shape = Vec::new();
    shape_of(v, &mut shape);
    let mut flat = Vec::new();
    flatten(v, 0, &shape, &mut flat)?;
    let data = if flat.iter().all(|x| matches!(x, Val::Bool(_))) && !flat.is_empty() {
        TensorData::Bool(flat.iter().map(|x| matches!(x, Val::Bool(true))).collect())
    } else if flat.iter().all(|x| matches!(x, Val::Int(_))) {
        TensorData::I64(flat.iter().map(|x| if let Val::Int(i) = x { *i } else { 0 }).collect())
    } else {
        let mut out = Vec::with_capacity(flat.len());
        for x in &flat {
            out.push(match x {
                Val::Int(i) => *i as f64,
                Val::Float(f) => *f,
                other => {
                    return Err(format!(
                        "a tensor literal holds numbers or bools, not {}",
                        kind(other)
                    ));
                }
            });
        }
        TensorData::F64(out)
    };
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

/// Standard normal samples from a seeded SplitMix64 + Box-Muller: the same seed gives the
/// same tensor on every machine.
fn normal(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1 = next().max(f64::MIN_POSITIVE);
        let u2 = next();
        let r = (-2.0 * u1.ln()).sqrt();
        out.push(r * (std::f64::consts::TAU * u2).cos());
        out.push(r * (std::f64::consts::TAU * u2).sin());
    }
    out.truncate(n);
    out
}
