//! Name checks before lowering: every name is bound (or a builtin), assignments go only to
//! `let mut` bindings, function parameters are unique, and functions do not recurse
//! (they are inlined). Bare names inside `filter`, `with_column` and `agg` arguments are
//! column references, checked against the table's columns when the program is lowered.

use std::collections::BTreeMap;

use crate::Span;
use crate::ast::*;
use crate::diag::{Diagnostic, did_you_mean};

pub use crate::builtins::{is_builtin, is_column_scoped};

#[derive(Clone, Debug)]
struct Binding {
    mutable: bool,
    span: Span,
    is_fn: bool,
}

struct Checker {
    scopes: Vec<BTreeMap<String, Binding>>,
    diags: Vec<Diagnostic>,
    /// User functions: name → (span of the name, functions its body calls).
    calls: BTreeMap<String, (Span, Vec<(String, Span)>)>,
    current_fn: Option<String>,
    column_scope: usize,
}

pub fn check(program: &Program) -> Vec<Diagnostic> {
    let mut c = Checker {
        scopes: vec![BTreeMap::new()],
        diags: Vec::new(),
        calls: BTreeMap::new(),
        current_fn: None,
        column_scope: 0,
    };
    // Top-level functions are visible everywhere (so two may call each other).
    for s in &program.stmts {
        if let StmtKind::Fn { name, .. } = &s.kind {
            if let Some(prev) = c.scopes[0].get(&name.name) {
                let prev = prev.span;
                c.diags.push(
                    Diagnostic::error(
                        "E0103",
                        name.span,
                        format!("function `{}` is defined twice", name.name),
                    )
                    .label("defined again")
                    .secondary(prev, "first defined here"),
                );
                continue;
            }
            c.bind(name, false, true);
            c.calls.entry(name.name.clone()).or_insert((name.span, Vec::new()));
        }
    }
    for s in &program.stmts {
        c.stmt(s);
    }
    c.recursion();
    c.diags
}

impl Checker {
    fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    fn bind(&mut self, name: &Ident, mutable: bool, is_fn: bool) {
        let scope = self.scopes.last_mut().expect("a scope is open");
        scope.insert(name.name.clone(), Binding { mutable, span: name.span, is_fn });
    }

    fn visible_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.scopes.iter().flat_map(|s| s.keys().cloned()).collect();
        v.extend(crate::builtins::names().map(str::to_string));
        v
    }

    fn unknown(&mut self, name: &str, span: Span, what: &str) {
        let names = self.visible_names();
        let help = did_you_mean(name, names.iter().map(String::as_str));
        self.diags.push(
            Diagnostic::error("E0100", span, format!("unknown {what} `{name}`"))
                .label("not defined before this point")
                .help(help),
        );
    }

    fn block(&mut self, b: &Block) {
        self.scopes.push(BTreeMap::new());
        for s in &b.stmts {
            self.stmt(s);
        }
        self.scopes.pop();
    }

    fn stmt(&mut self, s: &Stmt) {
        match &s.kind {
            StmtKind::Let { mutable, name, value } => {
                self.expr(value);
                self.bind(name, *mutable, false);
            }
            StmtKind::Assign { name, value } => {
                self.expr(value);
                match self.lookup(&name.name).cloned() {
                    None => self.unknown(&name.name, name.span, "name"),
                    Some(b) if b.is_fn => self.diags.push(
                        Diagnostic::error(
                            "E0101",
                            name.span,
                            format!("cannot assign to function `{}`", name.name),
                        )
                        .label("assignment")
                        .secondary(b.span, "defined as a function here"),
                    ),
                    Some(b) if !b.mutable => self.diags.push(
                        Diagnostic::error(
                            "E0101",
                            name.span,
                            format!("cannot assign twice to immutable binding `{}`", name.name),
                        )
                        .label("assigned again here")
                        .secondary(b.span, "first bound here")
                        .help(Some(format!("make it mutable: `let mut {} = …`", name.name))),
                    ),
                    Some(_) => {}
                }
            }
            StmtKind::Fn { name, params, body } => {
                // Top-level functions were bound before the walk; nested ones bind here.
                if !self.scopes.last().is_some_and(|s| s.contains_key(&name.name)) {
                    self.bind(name, false, true);
                }
                self.calls.entry(name.name.clone()).or_insert((name.span, Vec::new()));
                let outer = self.current_fn.replace(name.name.clone());
                self.scopes.push(BTreeMap::new());
                let mut seen: BTreeMap<&str, Span> = BTreeMap::new();
                for p in params {
                    if let Some(d) = &p.default {
                        self.expr(d);
                    }
                    if let Some(first) = seen.insert(&p.name.name, p.name.span) {
                        self.diags.push(
                            Diagnostic::error(
                                "E0103",
                                p.name.span,
                                format!("parameter `{}` is listed twice", p.name.name),
                            )
                            .label("again")
                            .secondary(first, "first here"),
                        );
                    }
                    self.bind(&p.name, false, false);
                }
                for st in &body.stmts {
                    self.stmt(st);
                }
                self.scopes.pop();
                self.current_fn = outer;
            }
            StmtKind::For { var, iter, body } => {
                self.expr(iter);
                self.scopes.push(BTreeMap::new());
                self.bind(var, false, false);
                self.block(body);
                self.scopes.pop();
            }
            StmtKind::Print(e) | StmtKind::Expr(e) => self.expr(e),
        }
    }

    fn expr(&mut self, e: &Expr) {
        match &e.kind {
            ExprKind::Name(n) => {
                if self.lookup(n).is_none() && !is_builtin(n) && self.column_scope == 0 {
                    self.unknown(n, e.span, "name");
                }
            }
            ExprKind::List(items) => items.iter().for_each(|i| self.expr(i)),
            ExprKind::Unary { expr, .. } => self.expr(expr),
            ExprKind::Binary { lhs, rhs, .. } => {
                self.expr(lhs);
                self.expr(rhs);
            }
            ExprKind::Range { start, end } => {
                self.expr(start);
                self.expr(end);
            }
            ExprKind::Call { callee, args, .. } => {
                let callee_name = match &callee.kind {
                    ExprKind::Name(n) => Some(n.clone()),
                    _ => None,
                };
                match &callee_name {
                    Some(n) => {
                        let user_fn = self.lookup(n).is_some_and(|b| b.is_fn);
                        if user_fn {
                            if let Some(f) = self.current_fn.clone() {
                                self.calls
                                    .entry(f)
                                    .or_insert((e.span, Vec::new()))
                                    .1
                                    .push((n.clone(), callee.span));
                            }
                        } else if self.lookup(n).is_none()
                            && !is_builtin(n)
                            && self.column_scope == 0
                        {
                            self.unknown(n, callee.span, "function");
                        }
                    }
                    None => self.expr(callee),
                }
                // An unknown callee is already reported; its arguments are not checked (a
                // misspelt `filtr(Age > 1)` would otherwise also flag the column).
                let unknown_callee = callee_name
                    .as_deref()
                    .is_some_and(|n| self.lookup(n).is_none() && !is_builtin(n));
                let scoped = unknown_callee || callee_name.as_deref().is_some_and(is_column_scoped);
                for (i, a) in args.iter().enumerate() {
                    // The table (first positional argument) is an ordinary expression.
                    let columns = scoped && (unknown_callee || i > 0 || a.name.is_some());
                    if columns {
                        self.column_scope += 1;
                    }
                    self.expr(&a.value);
                    if columns {
                        self.column_scope -= 1;
                    }
                }
            }
            ExprKind::Index { target, items } => {
                self.expr(target);
                for it in items {
                    match it {
                        IndexItem::At(x) => self.expr(x),
                        IndexItem::Slice { start, end } => {
                            if let Some(x) = start {
                                self.expr(x);
                            }
                            if let Some(x) = end {
                                self.expr(x);
                            }
                        }
                    }
                }
            }
            ExprKind::Field { target, .. } => self.expr(target),
            ExprKind::If { cond, then, otherwise } => {
                self.expr(cond);
                self.block(then);
                if let Some(b) = otherwise {
                    self.block(b);
                }
            }
            ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::Null
            | ExprKind::Error => {}
        }
    }

    /// Functions are inlined, so a cycle in the call graph can never finish expanding.
    fn recursion(&mut self) {
        let names: Vec<String> = self.calls.keys().cloned().collect();
        let mut reported = std::collections::BTreeSet::new();
        for start in names {
            // Depth-first search for a path back to `start`.
            let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
            let mut seen = std::collections::BTreeSet::new();
            while let Some((f, path)) = stack.pop() {
                let Some((_, callees)) = self.calls.get(&f) else { continue };
                for (g, call_span) in callees.clone() {
                    if g == start {
                        let mut cycle = path.clone();
                        cycle.push(g.clone());
                        let mut key = cycle[..cycle.len() - 1].to_vec();
                        key.sort();
                        if reported.insert(key) {
                            let def = self.calls[&start].0;
                            self.diags.push(
                                Diagnostic::error("E0102", call_span, format!("function `{start}` calls itself ({})", cycle.join(" → ")))
                                    .label("recursive call")
                                    .secondary(def, "defined here")
                                    .help(Some("MiniLang inlines functions, so recursion cannot end; use `for` over a list or range".into())),
                            );
                        }
                    } else if seen.insert(g.clone()) {
                        let mut p = path.clone();
                        p.push(g.clone());
                        stack.push((g, p));
                    }
                }
            }
        }
    }
}
