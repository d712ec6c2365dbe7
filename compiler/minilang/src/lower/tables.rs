//! Table functions: each call becomes an SGR-ML node of class `table` (placed on the `table`
//! engine by the planner) while the table's schema — column names and types, read from the
//! file at compile time by the caller's [`TableSchemaLoader`] — is tracked here, so unknown
//! columns, type mismatches and bad arguments are located errors before anything runs.
//! Row expressions (`filter`, `with_column`) become typed `RowExpr` attributes, never query
//! text: only the engine that runs them renders them.

use std::collections::HashMap;
use std::rc::Rc;

use xpu_ir::rowexpr::{Literal, RowExpr, RowFunc, call_type};
use xpu_ir::{Attr, Attrs, DType, Op, ValueId};

use super::{Builtin, Lowerer, R, Val, err, kind};
use crate::Span;
use crate::ast::*;
use crate::diag::did_you_mean;

/// Column names and types of a table value. `open` when columns depend on the data (the
/// value columns of a pivot): then names are not checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schema {
    pub columns: Vec<(String, DType)>,
    pub open: bool,
}

impl Schema {
    pub fn get(&self, name: &str) -> Option<DType> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, d)| *d)
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|(n, _)| n.as_str())
    }

    /// A one-line summary for `:type` and messages: `table[Name: string, Age: f64]`.
    pub fn describe(&self) -> String {
        let cols: Vec<String> = self.columns.iter().map(|(n, d)| format!("{n}: {d}")).collect();
        format!("table[{}{}]", cols.join(", "), if self.open { ", …" } else { "" })
    }
}

/// What a table-reading node will produce, answered by the engine that will run it (the
/// `table` engine reads the header and sniffs types). Supplied by the caller, so this crate
/// stays free of DuckDB.
pub type TableSchemaLoader =
    std::sync::Arc<dyn Fn(Op, &Attrs) -> Result<Vec<(String, DType)>, String> + Send + Sync>;

fn numeric(d: DType) -> bool {
    matches!(d, DType::I64 | DType::F64)
}

/// The aggregate functions of `agg` and `pivot`.
const AGGS: &[&str] = xpu_ir::table_attrs::AGGREGATES;

fn agg_type(func: &str, input: Option<DType>) -> Option<DType> {
    match func {
        "count" | "nunique" => Some(DType::I64),
        "mean" | "std" | "var" | "median" => Some(DType::F64),
        "sum" => input.map(|d| if d == DType::F64 { DType::F64 } else { DType::I64 }),
        _ => input,
    }
}

impl<'p> Lowerer<'p> {
    /// Adds a table node and names it after its source position, like tensor nodes.
    pub(super) fn table_op(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        attrs: Attrs,
        span: Span,
    ) -> R<ValueId> {
        let v = self.g.add_op(op, inputs, attrs).map_err(|e| err("E0205", span, e.to_string()))?;
        let (line, col) = self.program.line_col(span.start);
        let node = self.g.producer(v).expect("just added");
        self.g.nodes[node.index()].name = Some(format!("{}:{line}:{col}", self.g.name));
        Ok(v)
    }

    pub(super) fn table(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        attrs: Attrs,
        schema: Schema,
        span: Span,
    ) -> R<Val> {
        let v = self.table_op(op, inputs, attrs, span)?;
        Ok(Val::Table(v, Rc::new(schema)))
    }

    /// A column reference `t.name` or `t["name"]`, checked.
    pub(super) fn column(&mut self, target: Val, name: &str, span: Span) -> R<Val> {
        match target {
            Val::Table(v, schema) => {
                check_column(&schema, name, span)?;
                Ok(Val::Column(v, schema, name.to_string()))
            }
            Val::Poison => Ok(Val::Poison),
            other => Err(err("E0201", span, format!("`.{name}`: {} has no columns", kind(&other)))),
        }
    }

    /// A value where a table is needed: a column becomes a one-column table.
    pub(super) fn as_table(&mut self, v: Val, span: Span) -> R<(ValueId, Rc<Schema>)> {
        match v {
            Val::Table(t, s) => Ok((t, s)),
            Val::Column(t, s, name) => {
                let schema = Schema {
                    columns: vec![(name.clone(), s.get(&name).unwrap_or(DType::F64))],
                    open: false,
                };
                let attrs = Attrs::new().with("columns", Attr::Strs(vec![name]));
                let v = self.table_op(Op::SelectColumns, &[t], attrs, span)?;
                Ok((v, Rc::new(schema)))
            }
            Val::Grouped(..) => {
                Err(err("E0201", span, "a grouped table needs `agg(...)` before it can be used")
                    .help(Some("e.g. group_by(t, \"Sex\") |> agg(n = count())".into())))
            }
            other => Err(err("E0201", span, format!("expected a table, found {}", kind(&other)))),
        }
    }

    /// `filter`, `with_column` and `agg`: their arguments after the table name columns bare,
    /// so they are read as row expressions instead of being evaluated.
    pub(super) fn call_column_scoped(&mut self, name: &str, args: &'p [Arg], span: Span) -> R<Val> {
        let Some(first) = args.first().filter(|a| a.name.is_none()) else {
            return Err(err("E0206", span, format!("`{name}` needs a table first")));
        };
        let target = self.expr(&first.value)?;
        if matches!(target, Val::Poison) {
            return Ok(Val::Poison);
        }
        let rest = &args[1..];
        match name {
            "filter" => {
                let (t, schema) = self.as_table(target, first.value.span)?;
                let [pred] = rest else {
                    return Err(err("E0206", span, "`filter` takes a table and one condition"));
                };
                if let Some(n) = &pred.name {
                    return Err(err(
                        "E0206",
                        n.span,
                        format!("`filter` has no argument `{}`", n.name),
                    )
                    .help(Some("compare with `==`: filter(t, Sex == \"female\")".into())));
                }
                let (row, ty) = self.row_expr(&pred.value, &schema, t)?;
                if ty.is_some_and(|d| d != DType::Bool) {
                    return Err(err(
                        "E0201",
                        pred.value.span,
                        format!(
                            "a filter condition must be a bool, this is {}",
                            ty.map(|d| d.name()).unwrap_or("?")
                        ),
                    ));
                }
                let attrs = Attrs::new().with("predicate", Attr::Row(row));
                self.table(Op::FilterRows, &[t], attrs, (*schema).clone(), span)
            }
            "with_column" => {
                let (mut t, mut schema) = self.as_table(target, first.value.span)?;
                // `with_column(t, a = .., b = ..)` adds columns in order, like pandas'
                // `assign`: each expression sees the columns added before it.
                let columns: Vec<(String, &Expr)> = match rest {
                    [Arg { name: None, value: name_expr }, Arg { name: None, value }] => match self
                        .expr(name_expr)?
                    {
                        Val::Str(s) => vec![(s, value)],
                        other => {
                            return Err(err(
                                "E0201",
                                name_expr.span,
                                format!("the column name must be a string, not {}", kind(&other)),
                            ));
                        }
                    },
                    _ if !rest.is_empty() && rest.iter().all(|a| a.name.is_some()) => rest
                        .iter()
                        .map(|a| {
                            (a.name.as_ref().map(|n| n.name.clone()).unwrap_or_default(), &a.value)
                        })
                        .collect(),
                    _ => {
                        return Err(err(
                            "E0206",
                            span,
                            "`with_column` takes a table and `name = expression`",
                        )
                        .help(Some("e.g. with_column(t, adult = Age >= 18)".into())));
                    }
                };
                for (col, expr) in columns {
                    let (row, ty) = self.row_expr(expr, &schema, t)?;
                    let mut out = (*schema).clone();
                    let ty = ty.unwrap_or(DType::F64);
                    match out.columns.iter_mut().find(|(n, _)| *n == col) {
                        Some(slot) => slot.1 = ty,
                        None => out.columns.push((col.clone(), ty)),
                    }
                    let attrs =
                        Attrs::new().with("name", Attr::Str(col)).with("expr", Attr::Row(row));
                    t = self.table_op(Op::WithColumn, &[t], attrs, span)?;
                    schema = Rc::new(out);
                }
                Ok(Val::Table(t, schema))
            }
            _ => self.agg(target, first.value.span, rest, span),
        }
    }

    fn agg(&mut self, target: Val, tspan: Span, rest: &'p [Arg], span: Span) -> R<Val> {
        let (t, schema, keys) = match target {
            Val::Grouped(t, s, keys) => (t, s, keys),
            other => {
                let (t, s) = self.as_table(other, tspan)?;
                (t, s, Vec::new())
            }
        };
        if rest.is_empty() {
            return Err(err("E0206", span, "`agg` needs at least one `name = function(column)`")
                .help(Some("e.g. agg(n = count(), age = mean(Age))".into())));
        }
        let mut out = Schema::default();
        for k in &keys {
            out.columns.push((k.clone(), schema.get(k).unwrap_or(DType::String)));
        }
        let (mut names, mut funcs, mut cols) = (Vec::new(), Vec::new(), Vec::new());
        for a in rest {
            let Some(n) = &a.name else {
                return Err(err(
                    "E0206",
                    a.value.span,
                    "each aggregate is named: `name = function(column)`",
                )
                .label("no name"));
            };
            let ExprKind::Call { callee, args, .. } = &a.value.kind else {
                return Err(err(
                    "E0201",
                    a.value.span,
                    "an aggregate is a call such as mean(Age) or count()",
                ));
            };
            let ExprKind::Name(f) = &callee.kind else {
                return Err(err("E0201", callee.span, "an aggregate is a call such as mean(Age)"));
            };
            if !AGGS.contains(&f.as_str()) {
                let mut e =
                    err("E0201", callee.span, format!("`{f}` is not an aggregate function"))
                        .label("not an aggregate");
                e = e.help(Some(
                    did_you_mean(f, AGGS.iter().copied())
                        .unwrap_or_else(|| format!("aggregates: {}", AGGS.join(", "))),
                ));
                return Err(e);
            }
            let col = match args.as_slice() {
                [] if f == "count" => None,
                [] => return Err(err("E0206", a.value.span, format!("`{f}` needs a column"))),
                [arg] => Some(self.column_name(&arg.value, &schema, t)?),
                _ => return Err(err("E0206", a.value.span, format!("`{f}` takes one column"))),
            };
            let input_ty = col.as_ref().and_then(|c| schema.get(c));
            if let (Some(c), Some(d)) = (&col, input_ty)
                && matches!(f.as_str(), "sum" | "mean" | "std" | "var" | "median")
                && !numeric(d)
                && !(f == "sum" && d == DType::Bool)
            {
                return Err(err(
                    "E0201",
                    args[0].value.span,
                    format!("`{f}` needs a numeric column; `{c}` is {d}"),
                ));
            }
            out.columns.push((n.name.clone(), agg_type(f, input_ty).unwrap_or(DType::F64)));
            names.push(n.name.clone());
            funcs.push(f.clone());
            cols.push(col.unwrap_or_default());
        }
        let attrs = Attrs::new()
            .with("keys", Attr::Strs(keys))
            .with("names", Attr::Strs(names))
            .with("funcs", Attr::Strs(funcs))
            .with("columns", Attr::Strs(cols));
        self.table(Op::GroupAgg, &[t], attrs, out, span)
    }

    /// A column named in an aggregate or a function argument: bare `Age`, `"Age"` or `t.Age`.
    fn column_name(&mut self, e: &'p Expr, schema: &Schema, table: ValueId) -> R<String> {
        let name = match &e.kind {
            ExprKind::Name(n) if schema.get(n).is_some() || schema.open => n.clone(),
            ExprKind::Str(s) => s.clone(),
            ExprKind::Field { target, name } => {
                self.same_table(target, table)?;
                name.name.clone()
            }
            ExprKind::Name(n) => match self.lookup(n).cloned() {
                Some(Val::Str(s)) => s,
                Some(Val::Column(_, _, c)) => c,
                _ => return Err(unknown_column(schema, n, e.span)),
            },
            _ => return Err(err("E0201", e.span, "expected a column name")),
        };
        check_column(schema, &name, e.span)?;
        Ok(name)
    }

    /// `df.Age` inside a row expression must name a column of the table being filtered.
    fn same_table(&mut self, target: &'p Expr, table: ValueId) -> R<()> {
        match self.expr(target)? {
            Val::Table(v, _) if v == table => Ok(()),
            Val::Table(..) => Err(err(
                "E0201",
                target.span,
                "this is another table: a row expression can use only the columns of the table it runs on",
            )),
            other => Err(err(
                "E0201",
                target.span,
                format!("expected the table, found {}", kind(&other)),
            )),
        }
    }

    /// A row expression over the table's columns, typed (`None`: unknown until run).
    fn row_expr(
        &mut self,
        e: &'p Expr,
        schema: &Schema,
        table: ValueId,
    ) -> R<(RowExpr, Option<DType>)> {
        let lit = |v: &Val, span: Span| -> R<(RowExpr, Option<DType>)> {
            let value = match v {
                Val::Int(i) => Literal::Int(*i),
                Val::Float(f) => Literal::Float(*f),
                Val::Str(s) => Literal::Str(s.clone()),
                Val::Bool(b) => Literal::Bool(*b),
                Val::Null => Literal::Null,
                other => {
                    return Err(err(
                        "E0201",
                        span,
                        format!("{} cannot be used in a row expression", kind(other)),
                    ));
                }
            };
            let ty = value.dtype();
            Ok((RowExpr::lit(value), ty))
        };
        let col = |name: &str, ty: Option<DType>| Ok((RowExpr::col(name), ty));
        match &e.kind {
            ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::Null => {
                let v = self.expr(e)?;
                lit(&v, e.span)
            }
            ExprKind::Name(n) => {
                if let Some(d) = schema.get(n) {
                    return col(n, Some(d));
                }
                match self.lookup(n).cloned() {
                    Some(Val::Column(t, s, c)) if t == table => col(&c, s.get(&c)),
                    Some(
                        v @ (Val::Int(_) | Val::Float(_) | Val::Str(_) | Val::Bool(_) | Val::Null),
                    ) => lit(&v, e.span),
                    _ if schema.open => col(n, None),
                    _ => Err(unknown_column(schema, n, e.span)),
                }
            }
            ExprKind::Field { target, name } => {
                self.same_table(target, table)?;
                check_column(schema, &name.name, name.span)?;
                col(&name.name, schema.get(&name.name))
            }
            ExprKind::Index { target, items } => match items.as_slice() {
                [IndexItem::At(Expr { kind: ExprKind::Str(c), span })] => {
                    self.same_table(target, table)?;
                    check_column(schema, c, *span)?;
                    col(c, schema.get(c))
                }
                _ => Err(err(
                    "E0201",
                    e.span,
                    "in a row expression, index a table by a column name: t[\"Age\"]",
                )),
            },
            ExprKind::Unary { op, expr } => {
                let (x, ty) = self.row_expr(expr, schema, table)?;
                match op {
                    UnOp::Neg if ty.is_none_or(numeric) => {
                        Ok((RowExpr::call(RowFunc::Neg, vec![x]), ty))
                    }
                    UnOp::Not if ty.is_none_or(|d| d == DType::Bool) => {
                        Ok((RowExpr::call(RowFunc::Not, vec![x]), Some(DType::Bool)))
                    }
                    _ => Err(err(
                        "E0201",
                        e.span,
                        format!(
                            "`{}` does not apply to {}",
                            if *op == UnOp::Neg { "-" } else { "not" },
                            ty.map(|d| d.name()).unwrap_or("?")
                        ),
                    )),
                }
            }
            ExprKind::Binary { op, lhs, rhs } => self.row_binary(e, *op, lhs, rhs, schema, table),
            ExprKind::Call { callee, args, .. } => self.row_call(e, callee, args, schema, table),
            _ => Err(err("E0201", e.span, "this cannot be used in a row expression")),
        }
    }

    fn row_binary(
        &mut self,
        e: &'p Expr,
        op: BinOp,
        lhs: &'p Expr,
        rhs: &'p Expr,
        schema: &Schema,
        table: ValueId,
    ) -> R<(RowExpr, Option<DType>)> {
        let (a, ta) = self.row_expr(lhs, schema, table)?;
        let (b, tb) = self.row_expr(rhs, schema, table)?;
        let is_null = |x: &RowExpr| matches!(x, RowExpr::Lit { value: Literal::Null });
        let mismatch = |what: &str| {
            err(
                "E0201",
                e.span,
                format!(
                    "`{}` {what}: the left side is {}, the right side {}",
                    op.symbol(),
                    ta.map(|d| d.name()).unwrap_or("unknown"),
                    tb.map(|d| d.name()).unwrap_or("unknown")
                ),
            )
        };
        let both = |f: &dyn Fn(DType) -> bool| ta.is_none_or(f) && tb.is_none_or(f);
        let call = |f: RowFunc, a: RowExpr, b: RowExpr| RowExpr::call(f, vec![a, b]);
        Ok(match op {
            BinOp::Add if ta == Some(DType::String) && tb == Some(DType::String) => {
                (call(RowFunc::Concat, a, b), Some(DType::String))
            }
            BinOp::Add | BinOp::Sub | BinOp::Mul => {
                if !both(&numeric) {
                    return Err(mismatch("needs numbers"));
                }
                let ty = if ta == Some(DType::I64) && tb == Some(DType::I64) {
                    Some(DType::I64)
                } else if ta.is_none() || tb.is_none() {
                    None
                } else {
                    Some(DType::F64)
                };
                let f = match op {
                    BinOp::Add => RowFunc::Add,
                    BinOp::Sub => RowFunc::Sub,
                    _ => RowFunc::Mul,
                };
                (call(f, a, b), ty)
            }
            // Python's (and pandas') modulo takes the divisor's sign: `mod` says so.
            BinOp::Div | BinOp::Rem | BinOp::Pow => {
                if !both(&numeric) {
                    return Err(mismatch("needs numbers"));
                }
                let f = match op {
                    BinOp::Div => RowFunc::Div,
                    BinOp::Rem => RowFunc::Mod,
                    _ => RowFunc::Pow,
                };
                (call(f, a, b), Some(DType::F64))
            }
            BinOp::MatMul => {
                return Err(err(
                    "E0201",
                    e.span,
                    "`@` is a tensor operation, not a row expression",
                ));
            }
            BinOp::Eq | BinOp::Ne if is_null(&a) || is_null(&b) => {
                let x = if is_null(&a) { b } else { a };
                let f = if op == BinOp::Ne { RowFunc::NotNull } else { RowFunc::IsNull };
                (RowExpr::call(f, vec![x]), Some(DType::Bool))
            }
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                let comparable = match (ta, tb) {
                    (Some(x), Some(y)) => x == y || (numeric(x) && numeric(y)),
                    _ => true,
                };
                if !comparable {
                    return Err(mismatch("compares values of different kinds"));
                }
                let f = match op {
                    BinOp::Eq => RowFunc::Eq,
                    BinOp::Ne => RowFunc::Ne,
                    BinOp::Lt => RowFunc::Lt,
                    BinOp::Le => RowFunc::Le,
                    BinOp::Gt => RowFunc::Gt,
                    _ => RowFunc::Ge,
                };
                (call(f, a, b), Some(DType::Bool))
            }
            BinOp::And | BinOp::Or => {
                if !both(&|d| d == DType::Bool) {
                    return Err(mismatch("needs bools"));
                }
                let f = if op == BinOp::And { RowFunc::And } else { RowFunc::Or };
                (call(f, a, b), Some(DType::Bool))
            }
        })
    }

    fn row_call(
        &mut self,
        e: &'p Expr,
        callee: &'p Expr,
        args: &'p [Arg],
        schema: &Schema,
        table: ValueId,
    ) -> R<(RowExpr, Option<DType>)> {
        let ExprKind::Name(f) = &callee.kind else {
            return Err(err("E0204", callee.span, "only named functions can be called"));
        };
        // `cast`'s second argument is a type name, not a row value.
        if f == "cast" {
            if args.len() != 2 {
                return Err(err("E0206", e.span, "`cast` takes 2 argument(s) in a row expression"));
            }
            let (x, _) = self.row_expr(&args[0].value, schema, table)?;
            let ExprKind::Str(to) = &args[1].value.kind else {
                return Err(err(
                    "E0201",
                    args[1].value.span,
                    "cast to a type name: \"f64\", \"i64\", \"string\" or \"bool\"",
                ));
            };
            let d = match to.as_str() {
                "f64" | "f32" => DType::F64,
                "i64" | "i32" => DType::I64,
                "string" => DType::String,
                "bool" => DType::Bool,
                other => {
                    return Err(err(
                        "E0201",
                        args[1].value.span,
                        format!("cannot cast a column to `{other}`"),
                    ));
                }
            };
            return Ok((RowExpr::cast(x, d), Some(d)));
        }
        let func = match f.as_str() {
            "abs" => RowFunc::Abs,
            "sqrt" => RowFunc::Sqrt,
            "exp" => RowFunc::Exp,
            "log" => RowFunc::Log,
            "floor" => RowFunc::Floor,
            "ceil" => RowFunc::Ceil,
            "round" => RowFunc::Round,
            "lower" => RowFunc::Lower,
            "upper" => RowFunc::Upper,
            "len" => RowFunc::Len,
            "contains" => RowFunc::Contains,
            "starts_with" => RowFunc::StartsWith,
            "ends_with" => RowFunc::EndsWith,
            "is_null" => RowFunc::IsNull,
            "not_null" => RowFunc::NotNull,
            "fill_null" => RowFunc::FillNull,
            "where" | "if_else" => RowFunc::If,
            other => {
                return Err(err("E0201", callee.span, format!("`{other}` cannot be used in a row expression"))
                    .help(Some("row expressions take abs, sqrt, exp, log, floor, ceil, round, lower, upper, len, contains, starts_with, ends_with, is_null, not_null, fill_null, where, cast".into())));
            }
        };
        let (min, max) = func.arity();
        if args.len() < min || args.len() > max {
            let n = if min == max { min.to_string() } else { format!("{min} or {max}") };
            return Err(err(
                "E0206",
                e.span,
                format!("`{f}` takes {n} argument(s) in a row expression"),
            ));
        }
        let mut parts = Vec::with_capacity(args.len());
        let mut types = Vec::with_capacity(args.len());
        for a in args {
            let (x, t) = self.row_expr(&a.value, schema, table)?;
            parts.push(x);
            types.push(t);
        }
        // The IR knows every function's argument and result types (the same rules the
        // verifier applies); a column of unknown type stays unknown.
        let ty = call_type(func, &types).map_err(|m| err("E0201", e.span, m))?;
        let call = RowExpr::call(func, parts);
        Ok((call, ty))
    }
}

fn check_column(schema: &Schema, name: &str, span: Span) -> R<()> {
    if schema.open || schema.get(name).is_some() {
        Ok(())
    } else {
        Err(unknown_column(schema, name, span))
    }
}

fn unknown_column(schema: &Schema, name: &str, span: Span) -> crate::Diagnostic {
    let help = did_you_mean(name, schema.names()).unwrap_or_else(|| {
        let names: Vec<&str> = schema.names().collect();
        format!("the columns are: {}", names.join(", "))
    });
    err("E0208", span, format!("unknown column `{name}`"))
        .label("not a column of this table")
        .help(Some(help))
}

impl Builtin<'_, '_> {
    fn string(&mut self, i: usize, name: &str) -> R<Option<(String, Span)>> {
        match self.arg(i, name) {
            None | Some((Val::Null, _)) => Ok(None),
            Some((Val::Str(s), span)) => Ok(Some((s, span))),
            Some((other, span)) => Err(err(
                "E0201",
                span,
                format!("`{name}` must be a string, found {}", kind(&other)),
            )),
        }
    }

    fn need_string(&mut self, i: usize, name: &str) -> R<(String, Span)> {
        let (f, span) = (self.name.to_string(), self.span);
        self.string(i, name)?.ok_or_else(|| {
            err("E0206", span, format!("`{f}` needs argument `{name}`")).label("missing argument")
        })
    }

    /// A string or a list of strings.
    fn strings(&mut self, i: usize, name: &str) -> R<Option<(Vec<String>, Span)>> {
        match self.arg(i, name) {
            None | Some((Val::Null, _)) => Ok(None),
            Some((Val::Str(s), span)) => Ok(Some((vec![s], span))),
            Some((Val::Column(_, _, c), span)) => Ok(Some((vec![c], span))),
            Some((Val::List(items), span)) => items
                .into_iter()
                .map(|v| match v {
                    Val::Str(s) => Ok(s),
                    Val::Column(_, _, c) => Ok(c),
                    other => Err(err(
                        "E0201",
                        span,
                        format!("`{name}` must be column names, found {}", kind(&other)),
                    )),
                })
                .collect::<R<Vec<_>>>()
                .map(|v| Some((v, span))),
            Some((other, span)) => Err(err(
                "E0201",
                span,
                format!("`{name}` must be a name or a list of names, found {}", kind(&other)),
            )),
        }
    }

    fn table_arg(&mut self, i: usize, name: &str) -> R<(ValueId, Rc<Schema>, Span)> {
        let (v, span) = self.need(i, name)?;
        let (t, s) = self.l.as_table(v, span)?;
        Ok((t, s, span))
    }

    fn columns_in(&self, schema: &Schema, cols: &[String], span: Span) -> R<()> {
        for c in cols {
            check_column(schema, c, span)?;
        }
        Ok(())
    }

    /// The path argument, resolved inside the data roots.
    fn path(&mut self, write: bool) -> R<String> {
        let (path, pspan) = self.need_string(if write { 1 } else { 0 }, "path")?;
        Ok(self.resolve(&path, pspan, write)?.display().to_string())
    }

    fn source(&mut self, op: Op, attrs: Attrs) -> R<Val> {
        let span = self.span;
        let Some(loader) = self.l.inputs.tables.clone() else {
            return Err(err("E0300", span, "tables cannot be loaded here (no table engine)"));
        };
        let pspan = self.positional.first().map(|p| p.1).unwrap_or(span);
        let columns = loader(op, &attrs).map_err(|m| {
            err("E0303", pspan, format!("cannot read the table: {m}")).label("unreadable")
        })?;
        self.l.table(op, &[], attrs, Schema { columns, open: false }, span)
    }

    /// Table functions; `None` when `self.name` is not one.
    pub(super) fn run_table(&mut self) -> Option<R<Val>> {
        crate::builtins::is_table_call(self.name).then(|| self.table_call())
    }

    fn table_call(&mut self) -> R<Val> {
        match self.name {
            "load_csv" => {
                let path = self.path(false)?;
                let mut attrs = Attrs::new().with("path", Attr::Str(path));
                if let Some((sep, s)) = self.string(1, "sep")? {
                    if sep.chars().count() != 1 && sep != "\\t" {
                        return Err(err("E0201", s, "`sep` is one character"));
                    }
                    attrs.set("sep", Attr::Str(if sep == "\\t" { "\t".into() } else { sep }));
                }
                let header = self.flag_or("header", true)?;
                attrs.set("header", Attr::Int(header as i64));
                if let Some((na, _)) = self.strings(99, "na_values")? {
                    attrs.set("na_values", Attr::Strs(na));
                }
                self.no_extra()?;
                self.source(Op::ReadCsv, attrs)
            }
            "load_parquet" => {
                let path = self.path(false)?;
                self.no_extra()?;
                self.source(Op::ReadParquet, Attrs::new().with("path", Attr::Str(path)))
            }
            "load_xlsx" => {
                let path = self.path(false)?;
                let mut attrs = Attrs::new().with("path", Attr::Str(path));
                if let Some((sheet, _)) = self.string(1, "sheet")? {
                    attrs.set("sheet", Attr::Str(sheet));
                }
                self.no_extra()?;
                self.source(Op::ReadXlsx, attrs)
            }
            "write_csv" | "write_parquet" => {
                let (t, _, _) = self.table_arg(0, "table")?;
                let path = self.path(true)?;
                self.no_extra()?;
                let format = if self.name == "write_csv" { "csv" } else { "parquet" };
                let attrs = Attrs::new()
                    .with("path", Attr::Str(path))
                    .with("format", Attr::Str(format.into()));
                let v = self.l.table_op(Op::WriteTable, &[t], attrs, self.span)?;
                let name = format!("write_{}", self.l.g.outputs.len());
                self.l.g.add_output(name, v);
                Ok(Val::Null)
            }
            "select" => {
                let (t, schema, _) = self.table_arg(0, "table")?;
                let (cols, cspan) = self
                    .strings(1, "columns")?
                    .ok_or_else(|| err("E0206", self.span, "`select` needs a list of columns"))?;
                self.no_extra()?;
                self.columns_in(&schema, &cols, cspan)?;
                let out = Schema {
                    columns: cols
                        .iter()
                        .map(|c| (c.clone(), schema.get(c).unwrap_or(DType::F64)))
                        .collect(),
                    open: false,
                };
                self.l.table(
                    Op::SelectColumns,
                    &[t],
                    Attrs::new().with("columns", Attr::Strs(cols)),
                    out,
                    self.span,
                )
            }
            "group_by" => {
                let (t, schema, _) = self.table_arg(0, "table")?;
                let mut keys = Vec::new();
                let rest: Vec<(Val, Span)> = self.positional.drain(1..).collect();
                for (v, s) in rest {
                    match v {
                        Val::Str(k) => keys.push((k, s)),
                        Val::Column(_, _, c) => keys.push((c, s)),
                        Val::List(items) => {
                            for i in items {
                                match i {
                                    Val::Str(k) | Val::Column(_, _, k) => keys.push((k, s)),
                                    other => {
                                        return Err(err(
                                            "E0201",
                                            s,
                                            format!(
                                                "group keys are column names, found {}",
                                                kind(&other)
                                            ),
                                        ));
                                    }
                                }
                            }
                        }
                        other => {
                            return Err(err(
                                "E0201",
                                s,
                                format!("group keys are column names, found {}", kind(&other)),
                            ));
                        }
                    }
                }
                self.no_extra()?;
                if keys.is_empty() {
                    return Err(err("E0206", self.span, "`group_by` needs at least one column"));
                }
                for (k, s) in &keys {
                    check_column(&schema, k, *s)?;
                }
                Ok(Val::Grouped(t, schema, keys.into_iter().map(|(k, _)| k).collect()))
            }
            "stats" => {
                let (t, schema, _) = self.table_arg(0, "table")?;
                let stats = match self.strings(1, "stats")? {
                    Some((s, sspan)) => {
                        for name in &s {
                            let known = ["count", "mean", "std", "min", "max"]
                                .contains(&name.as_str())
                                || name
                                    .strip_suffix('%')
                                    .and_then(|n| n.trim().parse::<f64>().ok())
                                    .is_some_and(|n| (0.0..=100.0).contains(&n));
                            if !known {
                                return Err(err("E0201", sspan, format!("unknown statistic `{name}`"))
                                    .help(Some("statistics: count, mean, std, min, 25%, 50%, 75%, max (any N% is a percentile)".into())));
                            }
                        }
                        s
                    }
                    None => ["count", "mean", "std", "min", "25%", "50%", "75%", "max"]
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                };
                self.no_extra()?;
                let mut out = Schema {
                    columns: vec![("statistic".into(), DType::String)],
                    open: schema.open,
                };
                out.columns.extend(
                    schema
                        .columns
                        .iter()
                        .filter(|(_, d)| numeric(*d))
                        .map(|(n, _)| (n.clone(), DType::F64)),
                );
                // The columns described, fixed now: the run then describes what the program
                // was checked against (a later non-number is an error, not a lost column),
                // and no engine has to ask the data which columns are numeric.
                let mut attrs = Attrs::new().with("stats", Attr::Strs(stats));
                if !schema.open {
                    let described = out.columns[1..].iter().map(|(n, _)| n.clone()).collect();
                    attrs = attrs.with("columns", Attr::Strs(described));
                }
                self.l.table(Op::Describe, &[t], attrs, out, self.span)
            }
            "pivot" => {
                let (t, schema, tspan) = self.table_arg(0, "table")?;
                let (index, ispan) = self.need_string(1, "index")?;
                let (columns, cspan) = self.need_string(2, "columns")?;
                let (values, vspan) = self.need_string(3, "values")?;
                let agg = self.string(4, "agg")?.map(|a| a.0).unwrap_or_else(|| "mean".into());
                self.no_extra()?;
                check_column(&schema, &index, ispan)?;
                check_column(&schema, &columns, cspan)?;
                check_column(&schema, &values, vspan)?;
                if !AGGS.contains(&agg.as_str()) {
                    return Err(err(
                        "E0201",
                        tspan,
                        format!("`{agg}` is not an aggregate function"),
                    )
                    .help(Some(format!("aggregates: {}", AGGS.join(", ")))));
                }
                let out = Schema {
                    columns: vec![(index.clone(), schema.get(&index).unwrap_or(DType::String))],
                    open: true,
                };
                let attrs = Attrs::new()
                    .with("index", Attr::Str(index))
                    .with("columns", Attr::Str(columns))
                    .with("values", Attr::Str(values))
                    .with("agg", Attr::Str(agg));
                self.l.table(Op::Pivot, &[t], attrs, out, self.span)
            }
            "join" => {
                let (a, sa, _) = self.table_arg(0, "left")?;
                let (b, sb, _) = self.table_arg(1, "right")?;
                let (on, ospan) = self.strings(2, "on")?.ok_or_else(|| {
                    err("E0206", self.span, "`join` needs `on` (a column or list of columns)")
                })?;
                let how = self.string(3, "how")?;
                self.no_extra()?;
                let how = match how {
                    None => "inner".to_string(),
                    Some((h, _)) if ["inner", "left", "outer"].contains(&h.as_str()) => h,
                    Some((h, hs)) => {
                        return Err(err(
                            "E0201",
                            hs,
                            format!("`how` is inner, left or outer, not `{h}`"),
                        ));
                    }
                };
                self.columns_in(&sa, &on, ospan)?;
                self.columns_in(&sb, &on, ospan)?;
                // pandas' column order: the left's columns (keys in place), then the right's.
                let mut out = Schema { columns: Vec::new(), open: sa.open || sb.open };
                for (c, d) in &sa.columns {
                    let name = if !on.contains(c) && sb.get(c).is_some() {
                        format!("{c}_x")
                    } else {
                        c.clone()
                    };
                    out.columns.push((name, *d));
                }
                for (c, d) in sb.columns.iter().filter(|(c, _)| !on.contains(c)) {
                    let name = if sa.get(c).is_some() { format!("{c}_y") } else { c.clone() };
                    out.columns.push((name, *d));
                }
                let attrs = Attrs::new().with("on", Attr::Strs(on)).with("how", Attr::Str(how));
                self.l.table(Op::Join, &[a, b], attrs, out, self.span)
            }
            "sort" => {
                let (t, schema, _) = self.table_arg(0, "table")?;
                let (cols, cspan) = self.strings(1, "columns")?.ok_or_else(|| {
                    err("E0206", self.span, "`sort` needs the columns to sort by")
                })?;
                let desc = self.flag("desc")?;
                self.no_extra()?;
                self.columns_in(&schema, &cols, cspan)?;
                let attrs = Attrs::new()
                    .with("columns", Attr::Strs(cols))
                    .with("descending", Attr::Int(desc as i64));
                self.l.table(Op::SortRows, &[t], attrs, (*schema).clone(), self.span)
            }
            "head" => {
                let (t, schema, _) = self.table_arg(0, "table")?;
                let n = match self.arg(1, "n") {
                    None => 5,
                    Some((Val::Int(n), _)) if n >= 0 => n,
                    Some((other, s)) => {
                        return Err(err(
                            "E0201",
                            s,
                            format!("`n` is a count ≥ 0, found {}", super::display(&other)),
                        ));
                    }
                };
                self.no_extra()?;
                self.l.table(
                    Op::Head,
                    &[t],
                    Attrs::new().with("n", Attr::Int(n)),
                    (*schema).clone(),
                    self.span,
                )
            }
            "distinct" => {
                let (t, schema, _) = self.table_arg(0, "table")?;
                self.no_extra()?;
                self.l.table(Op::Distinct, &[t], Attrs::new(), (*schema).clone(), self.span)
            }
            "value_counts" => {
                let (t, schema, _) = self.table_arg(0, "table")?;
                let (col, cspan) = match self.strings(1, "column")? {
                    Some((c, s)) if c.len() == 1 => (c[0].clone(), s),
                    Some((_, s)) => {
                        return Err(err("E0201", s, "`value_counts` counts one column"));
                    }
                    None => match (schema.columns.len(), self.span) {
                        (1, s) => (schema.columns[0].0.clone(), s),
                        _ => {
                            return Err(err(
                                "E0206",
                                self.span,
                                "`value_counts` needs the column to count",
                            ));
                        }
                    },
                };
                self.no_extra()?;
                check_column(&schema, &col, cspan)?;
                let out = Schema {
                    columns: vec![
                        (col.clone(), schema.get(&col).unwrap_or(DType::String)),
                        ("count".into(), DType::I64),
                    ],
                    open: false,
                };
                self.l.table(
                    Op::ValueCounts,
                    &[t],
                    Attrs::new().with("column", Attr::Str(col)),
                    out,
                    self.span,
                )
            }
            "columns" => {
                let (_, schema, s) = self.table_arg(0, "table")?;
                if schema.open {
                    return Err(err(
                        "E0201",
                        s,
                        "the columns of this table depend on its data (a pivot): they are not known at compile time",
                    ));
                }
                Ok(Val::List(schema.columns.iter().map(|(n, _)| Val::Str(n.clone())).collect()))
            }
            "tensor" => {
                let (t, schema, _) = self.table_arg(0, "table")?;
                let cols = match self.strings(1, "columns")? {
                    Some((cols, cspan)) => {
                        self.columns_in(&schema, &cols, cspan)?;
                        for c in &cols {
                            if let Some(d) =
                                schema.get(c).filter(|d| !numeric(*d) && *d != DType::Bool)
                            {
                                return Err(err(
                                    "E0201",
                                    cspan,
                                    format!("column `{c}` is {d}; a tensor takes numbers"),
                                ));
                            }
                        }
                        cols
                    }
                    None => schema
                        .columns
                        .iter()
                        .filter(|(_, d)| numeric(*d))
                        .map(|(n, _)| n.clone())
                        .collect(),
                };
                self.no_extra()?;
                self.l.row_symbols += 1;
                let attrs = Attrs::new()
                    .with("columns", Attr::Strs(cols))
                    .with("rows", Attr::Str(format!("rows{}", self.l.row_symbols)));
                let v = self.l.table_op(Op::TableToTensor, &[t], attrs, self.span)?;
                Ok(Val::Tensor(v))
            }
            "plot" => {
                let (t, schema, _) = self.table_arg(0, "table")?;
                let kind_ = self.string(99, "kind")?.map(|k| k.0).unwrap_or_else(|| "line".into());
                if !["bar", "line", "scatter", "hist"].contains(&kind_.as_str()) {
                    return Err(err(
                        "E0201",
                        self.span,
                        format!("plot kind is bar, line, scatter or hist, not `{kind_}`"),
                    ));
                }
                let x = self.string(99, "x")?;
                let y = self.strings(99, "y")?;
                if let Some((x, s)) = &x {
                    check_column(&schema, x, *s)?;
                }
                if let Some((y, s)) = &y {
                    self.columns_in(&schema, y, *s)?;
                }
                let title = self.string(99, "title")?.map(|t| t.0).unwrap_or_default();
                let (out, ospan) = self.string(99, "out")?.ok_or_else(|| {
                    err("E0206", self.span, "`plot` needs `out = \"chart.png\"` (or .svg)")
                })?;
                let lower = out.to_ascii_lowercase();
                if !lower.ends_with(".png") && !lower.ends_with(".svg") {
                    return Err(err("E0201", ospan, "a plot is written as .png or .svg"));
                }
                let path = self.resolve(&out, ospan, true)?;
                self.no_extra()?;
                let attrs = Attrs::new()
                    .with("kind", Attr::Str(kind_))
                    .with("x", Attr::Str(x.map(|x| x.0).unwrap_or_default()))
                    .with("y", Attr::Strs(y.map(|y| y.0).unwrap_or_default()))
                    .with("title", Attr::Str(title))
                    .with("path", Attr::Str(path.display().to_string()));
                let v = self.l.table_op(Op::Plot, &[t], attrs, self.span)?;
                let name = format!("plot_{}", self.l.g.outputs.len());
                self.l.g.add_output(name, v);
                Ok(Val::Null)
            }
            "count" | "median" | "first" | "nunique" | "var" | "std" => Err(err(
                "E0201",
                self.span,
                format!("`{}` is an aggregate: use it inside agg(...)", self.name),
            )
            .help(Some(format!("e.g. group_by(t, \"key\") |> agg(x = {}(column))", self.name)))),
            other => Err(err("E0100", self.span, format!("unknown function `{other}`"))),
        }
    }

    fn flag_or(&mut self, name: &str, default: bool) -> R<bool> {
        match self.named.remove(name) {
            None => Ok(default),
            Some((Val::Bool(b), _)) => Ok(b),
            Some((other, span)) => Err(err(
                "E0201",
                span,
                format!("`{name}` must be true or false, found {}", kind(&other)),
            )),
        }
    }

    /// Named arguments left over are unknown ones.
    fn no_extra(&mut self) -> R<()> {
        if let Some((n, (_, span))) = self.named.iter().next() {
            return Err(err("E0206", *span, format!("`{}` has no argument `{n}`", self.name))
                .label("unknown argument"));
        }
        Ok(())
    }
}

/// The concat of a list of tables: rows stacked, columns matched by name.
pub(super) fn concat_schema(parts: &[Rc<Schema>]) -> Schema {
    let mut out = Schema::default();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for s in parts {
        out.open |= s.open;
        for (n, d) in &s.columns {
            match seen.get(n) {
                Some(&i) => {
                    let prev = out.columns[i].1;
                    if prev != *d {
                        out.columns[i].1 =
                            if numeric(prev) && numeric(*d) { DType::F64 } else { DType::String };
                    }
                }
                None => {
                    seen.insert(n.clone(), out.columns.len());
                    out.columns.push((n.clone(), *d));
                }
            }
        }
    }
    out
}
