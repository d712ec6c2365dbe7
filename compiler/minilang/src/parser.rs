//! A recursive-descent parser that never fails: it returns the tree and every diagnostic,
//! skipping to the next statement after an error so one run reports several. Newlines end
//! statements except inside `(…)` and `[…]`; a line may start with `|>` or `else` to
//! continue the previous one.

use std::mem::discriminant;

use crate::Span;
use crate::ast::*;
use crate::diag::Diagnostic;
use crate::lexer::{Tok, lex};

/// Beyond this many diagnostics the parser stops reporting (the rest are usually echoes).
const MAX_DIAGNOSTICS: usize = 50;

/// Deepest expression nesting accepted: bounds the parser's recursion (and stack) whatever
/// the input.
const MAX_NESTING: usize = 100;

/// Most binary operators and pipes in one statement. A chain `a + b + … + z` folds into a
/// tree as deep as it is long, and the checker, the lowering and dropping the tree all walk
/// that depth recursively: a 100,000-term line overflowed the stack. Nested statements (in
/// blocks) count for themselves.
const MAX_OPERATORS: usize = 1000;

pub fn parse(src: &str) -> (Program, Vec<Diagnostic>) {
    let mut p =
        Parser { toks: lex(src), pos: 0, depth: 0, nesting: 0, operators: 0, diags: Vec::new() };
    let stmts = p.stmts_until(|t| matches!(t, Tok::Eof));
    let line_starts =
        std::iter::once(0).chain(src.match_indices('\n').map(|(i, _)| i + 1)).collect();
    (Program { stmts, line_starts }, p.diags)
}

struct Parser {
    toks: Vec<(Tok, Span)>,
    pos: usize,
    /// Nesting of `(` and `[`: newlines are insignificant inside.
    depth: usize,
    /// Recursion depth of expressions and blocks (bounded by MAX_NESTING).
    nesting: usize,
    /// Binary operators and pipes folded in the current statement (bounded by
    /// MAX_OPERATORS).
    operators: usize,
    diags: Vec<Diagnostic>,
}

fn same(a: &Tok, b: &Tok) -> bool {
    discriminant(a) == discriminant(b)
}

impl Parser {
    fn skip_insignificant(&mut self) {
        if self.depth > 0 {
            while matches!(self.toks[self.pos].0, Tok::Newline) {
                self.pos += 1;
            }
        }
    }

    fn peek(&mut self) -> &Tok {
        self.skip_insignificant();
        &self.toks[self.pos].0
    }

    fn span(&mut self) -> Span {
        self.skip_insignificant();
        self.toks[self.pos].1
    }

    /// The token after the next one (no newline skipping beyond the current depth rule).
    fn peek2(&mut self) -> &Tok {
        self.skip_insignificant();
        let mut i = self.pos + 1;
        if self.depth > 0 {
            while matches!(self.toks.get(i).map(|t| &t.0), Some(Tok::Newline)) {
                i += 1;
            }
        }
        self.toks.get(i).map(|t| &t.0).unwrap_or(&Tok::Eof)
    }

    fn bump(&mut self) -> (Tok, Span) {
        self.skip_insignificant();
        let t = self.toks[self.pos].clone();
        if !matches!(t.0, Tok::Eof) {
            self.pos += 1;
        }
        t
    }

    fn at(&mut self, t: &Tok) -> bool {
        same(self.peek(), t)
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.at(t) {
            self.bump();
            true
        } else {
            false
        }
    }

    /// Whether `t` comes next once newlines are skipped (for `|>` and `else` lines).
    fn next_line_starts_with(&self, t: &Tok) -> Option<usize> {
        let mut i = self.pos;
        while matches!(self.toks[i].0, Tok::Newline) {
            i += 1;
        }
        same(&self.toks[i].0, t).then_some(i)
    }

    fn error(&mut self, d: Diagnostic) {
        // A second error at the same place is an echo of the first.
        let echo = self.diags.last().is_some_and(|last| last.span.start == d.span.start);
        if self.diags.len() < MAX_DIAGNOSTICS && !echo {
            self.diags.push(d);
        }
    }

    fn unexpected(&mut self, expected: &str) {
        let span = self.span();
        let found = self.peek().describe();
        let (code, msg) = match self.peek() {
            Tok::Error => ("E0001", "unexpected character".to_string()),
            Tok::UnterminatedStr(_) => ("E0002", "unterminated string".to_string()),
            _ => ("E0004", format!("expected {expected}, found {found}")),
        };
        let label = if code == "E0004" { format!("expected {expected}") } else { String::new() };
        self.error(Diagnostic::error(code, span, msg).label(label));
    }

    fn expect(&mut self, t: &Tok, what: &str) -> bool {
        if self.eat(t) {
            return true;
        }
        self.unexpected(what);
        false
    }

    /// Skips to the end of the statement (a newline or `;` outside brackets, or `}`).
    fn recover(&mut self) {
        self.depth = 0;
        // A statement keyword opening a line starts the next statement, even when the broken
        // one left a bracket open (`let a = (1 +` then `let b = …`).
        let line_start = |p: &Parser, i: usize| {
            i > 0
                && matches!(p.toks[i - 1].0, Tok::Newline)
                && matches!(p.toks[i].0, Tok::Let | Tok::Fn | Tok::For | Tok::Print)
        };
        if line_start(self, self.pos) {
            return;
        }
        loop {
            match &self.toks[self.pos].0 {
                Tok::Newline | Tok::Semi | Tok::RBrace | Tok::Eof => return,
                _ => self.pos += 1,
            }
        }
    }

    fn stmts_until(&mut self, end: impl Fn(&Tok) -> bool) -> Vec<Stmt> {
        let mut out = Vec::new();
        loop {
            while matches!(self.toks[self.pos].0, Tok::Newline | Tok::Semi) {
                self.pos += 1;
            }
            let t = &self.toks[self.pos].0;
            if end(t) || matches!(t, Tok::Eof) {
                break;
            }
            if matches!(t, Tok::RBrace) {
                let span = self.toks[self.pos].1;
                self.error(
                    Diagnostic::error("E0006", span, "unmatched `}`")
                        .label("no block is open here"),
                );
                self.pos += 1;
                continue;
            }
            let errors_before = self.diags.len();
            let s = self.stmt();
            if let Some(s) = s {
                out.push(s);
            }
            // A statement ends at a newline, `;`, `}` or the end of the file.
            if self.diags.len() > errors_before {
                self.recover();
            } else if !matches!(
                self.toks[self.pos].0,
                Tok::Newline | Tok::Semi | Tok::RBrace | Tok::Eof
            ) {
                self.unexpected("end of statement (a new line or `;`)");
                self.recover();
            }
        }
        out
    }

    fn ident(&mut self, what: &str) -> Option<Ident> {
        match self.peek().clone() {
            Tok::Ident(name) => {
                let (_, span) = self.bump();
                Some(Ident { name, span })
            }
            _ => {
                self.unexpected(what);
                None
            }
        }
    }

    fn stmt(&mut self) -> Option<Stmt> {
        // A statement inside a block counts its own operators; the enclosing one's resume.
        let outer = std::mem::replace(&mut self.operators, 0);
        let stmt = self.stmt_inner();
        self.operators = outer;
        stmt
    }

    fn stmt_inner(&mut self) -> Option<Stmt> {
        let start = self.span();
        let kind = match self.peek().clone() {
            Tok::Let => {
                self.bump();
                let mutable = self.eat(&Tok::Mut);
                let name = self.ident("a name after `let`")?;
                if !self.expect(&Tok::Assign, "`=`") {
                    return None;
                }
                let value = self.expr();
                StmtKind::Let { mutable, name, value }
            }
            Tok::Fn => {
                self.bump();
                let name = self.ident("a function name")?;
                if !self.expect(&Tok::LParen, "`(`") {
                    return None;
                }
                self.depth += 1;
                let mut params = Vec::new();
                while !self.at(&Tok::RParen) && !self.at(&Tok::Eof) {
                    let pname = self.ident("a parameter name")?;
                    let default = if self.eat(&Tok::Assign) { Some(self.expr()) } else { None };
                    params.push(Param { name: pname, default });
                    if !self.eat(&Tok::Comma) {
                        break;
                    }
                }
                let closed = self.expect(&Tok::RParen, "`)` or `,`");
                self.depth -= 1;
                if !closed {
                    return None;
                }
                let body = self.block()?;
                StmtKind::Fn { name, params, body }
            }
            Tok::For => {
                self.bump();
                let var = self.ident("a loop variable")?;
                if !self.expect(&Tok::In, "`in`") {
                    return None;
                }
                let iter = self.expr();
                let body = self.block()?;
                StmtKind::For { var, iter, body }
            }
            Tok::Print => {
                self.bump();
                StmtKind::Print(self.expr())
            }
            Tok::Ident(name) if matches!(self.peek2(), Tok::Assign) => {
                let (_, span) = self.bump();
                self.bump();
                let value = self.expr();
                StmtKind::Assign { name: Ident { name, span }, value }
            }
            _ => StmtKind::Expr(self.expr()),
        };
        let end = self.toks[self.pos.saturating_sub(1)].1.end.max(start.start);
        Some(Stmt { kind, span: Span::new(start.start, end) })
    }

    fn block(&mut self) -> Option<Block> {
        let start = self.span();
        if self.too_deep().is_some() {
            return None;
        }
        if !self.expect(&Tok::LBrace, "`{`") {
            return None;
        }
        // Newlines separate statements inside a block even within brackets.
        let saved = std::mem::replace(&mut self.depth, 0);
        self.nesting += 1;
        let stmts = self.stmts_until(|t| matches!(t, Tok::RBrace));
        self.nesting -= 1;
        let end = self.toks[self.pos].1;
        let closed = matches!(self.toks[self.pos].0, Tok::RBrace);
        if closed {
            self.pos += 1;
        } else {
            self.error(
                Diagnostic::error("E0006", end, "unclosed block")
                    .label("expected `}` before here")
                    .secondary(start, "the block opens here"),
            );
        }
        self.depth = saved;
        Some(Block { stmts, span: Span::new(start.start, end.end) })
    }

    fn too_deep(&mut self) -> Option<Expr> {
        if self.nesting < MAX_NESTING {
            return None;
        }
        let span = self.span();
        self.error(
            Diagnostic::error("E0009", span, format!("nested more than {MAX_NESTING} levels deep"))
                .label("too deep")
                .help(Some("split the expression with `let`".into())),
        );
        // Skip the rest of the statement: what follows cannot be parsed sensibly.
        while !matches!(self.toks[self.pos].0, Tok::Eof) {
            self.pos += 1;
        }
        Some(Expr { kind: ExprKind::Error, span })
    }

    pub fn expr(&mut self) -> Expr {
        if let Some(e) = self.too_deep() {
            return e;
        }
        self.nesting += 1;
        let e = self.pipeline();
        self.nesting -= 1;
        e
    }

    fn pipeline(&mut self) -> Expr {
        let mut lhs = self.or_expr();
        // Pipelines may continue on the next line: `data\n  |> filter(...)`.
        loop {
            if self.depth == 0 {
                match self.next_line_starts_with(&Tok::Pipe) {
                    Some(i) => self.pos = i,
                    None => break,
                }
            } else if !self.at(&Tok::Pipe) {
                break;
            }
            let (_, pipe_span) = self.bump();
            let rhs = self.postfix();
            let span = lhs.span.to(rhs.span);
            if self.too_many_operators(span) {
                lhs = Expr { kind: ExprKind::Error, span };
                continue;
            }
            lhs = match rhs.kind {
                ExprKind::Call { callee, mut args, .. } => {
                    args.insert(0, Arg { name: None, value: lhs });
                    Expr { kind: ExprKind::Call { callee, args, piped: true }, span }
                }
                ExprKind::Name(_) | ExprKind::Field { .. } => Expr {
                    kind: ExprKind::Call {
                        callee: Box::new(rhs),
                        args: vec![Arg { name: None, value: lhs }],
                        piped: true,
                    },
                    span,
                },
                ExprKind::Error => Expr { kind: ExprKind::Error, span },
                _ => {
                    self.error(
                        Diagnostic::error(
                            "E0105",
                            rhs.span,
                            "the right side of `|>` must be a function call",
                        )
                        .label("not a function")
                        .secondary(pipe_span, "piped here")
                        .help(Some("write `value |> f(args)`, meaning `f(value, args)`".into())),
                    );
                    Expr { kind: ExprKind::Error, span }
                }
            };
        }
        lhs
    }

    fn binary(&mut self, lhs: Expr, op: BinOp, rhs: Expr) -> Expr {
        let span = lhs.span.to(rhs.span);
        if self.too_many_operators(span) {
            return Expr { kind: ExprKind::Error, span };
        }
        Expr { kind: ExprKind::Binary { op, lhs: Box::new(lhs), rhs: Box::new(rhs) }, span }
    }

    /// Counts one more operator in the statement; past the bound, reports it once and says
    /// so (the caller then folds to an error node, so the tree stops growing).
    fn too_many_operators(&mut self, span: Span) -> bool {
        self.operators += 1;
        if self.operators == MAX_OPERATORS + 1 {
            self.error(
                Diagnostic::error(
                    "E0010",
                    span,
                    format!("more than {MAX_OPERATORS} operators in one statement"),
                )
                .label("too long")
                .help(Some("split the expression with `let`".into())),
            );
        }
        self.operators > MAX_OPERATORS
    }

    fn or_expr(&mut self) -> Expr {
        let mut lhs = self.and_expr();
        while self.eat(&Tok::Or) {
            let rhs = self.and_expr();
            lhs = self.binary(lhs, BinOp::Or, rhs);
        }
        lhs
    }

    fn and_expr(&mut self) -> Expr {
        let mut lhs = self.not_expr();
        while self.eat(&Tok::And) {
            let rhs = self.not_expr();
            lhs = self.binary(lhs, BinOp::And, rhs);
        }
        lhs
    }

    fn not_expr(&mut self) -> Expr {
        if self.at(&Tok::Not) {
            if let Some(e) = self.too_deep() {
                return e;
            }
            let (_, span) = self.bump();
            self.nesting += 1;
            let e = self.not_expr();
            self.nesting -= 1;
            let span = span.to(e.span);
            return Expr { kind: ExprKind::Unary { op: UnOp::Not, expr: Box::new(e) }, span };
        }
        self.comparison()
    }

    fn comparison_op(&mut self) -> Option<BinOp> {
        Some(match self.peek() {
            Tok::Eq => BinOp::Eq,
            Tok::Ne => BinOp::Ne,
            Tok::Lt => BinOp::Lt,
            Tok::Le => BinOp::Le,
            Tok::Gt => BinOp::Gt,
            Tok::Ge => BinOp::Ge,
            _ => return None,
        })
    }

    fn comparison(&mut self) -> Expr {
        let lhs = self.range();
        let Some(op) = self.comparison_op() else { return lhs };
        self.bump();
        let rhs = self.range();
        let e = self.binary(lhs, op, rhs);
        if self.comparison_op().is_some() {
            let span = self.span();
            self.error(
                Diagnostic::error("E0008", span, "comparisons cannot be chained")
                    .label("a second comparison")
                    .help(Some("combine them with `and`: `a < b and b < c`".into())),
            );
            self.bump();
            let _ = self.range();
        }
        e
    }

    fn range(&mut self) -> Expr {
        let lhs = self.additive();
        if self.eat(&Tok::DotDot) {
            let rhs = self.additive();
            let span = lhs.span.to(rhs.span);
            return Expr {
                kind: ExprKind::Range { start: Box::new(lhs), end: Box::new(rhs) },
                span,
            };
        }
        lhs
    }

    fn additive(&mut self) -> Expr {
        let mut lhs = self.multiplicative();
        loop {
            let op = match self.peek() {
                Tok::Plus => BinOp::Add,
                Tok::Minus => BinOp::Sub,
                _ => return lhs,
            };
            self.bump();
            let rhs = self.multiplicative();
            lhs = self.binary(lhs, op, rhs);
        }
    }

    fn multiplicative(&mut self) -> Expr {
        let mut lhs = self.unary();
        loop {
            let op = match self.peek() {
                Tok::Star => BinOp::Mul,
                Tok::Slash => BinOp::Div,
                Tok::Percent => BinOp::Rem,
                Tok::At => BinOp::MatMul,
                _ => return lhs,
            };
            self.bump();
            let rhs = self.unary();
            lhs = self.binary(lhs, op, rhs);
        }
    }

    fn unary(&mut self) -> Expr {
        if self.at(&Tok::Minus) {
            if let Some(e) = self.too_deep() {
                return e;
            }
            let (_, span) = self.bump();
            self.nesting += 1;
            let e = self.unary();
            self.nesting -= 1;
            let span = span.to(e.span);
            return Expr { kind: ExprKind::Unary { op: UnOp::Neg, expr: Box::new(e) }, span };
        }
        self.power()
    }

    fn power(&mut self) -> Expr {
        let base = self.postfix();
        if self.eat(&Tok::StarStar) {
            // Right-associative, and binds tighter than unary minus on its left: -2**2 == -4.
            let exp = self.unary();
            return self.binary(base, BinOp::Pow, exp);
        }
        base
    }

    fn postfix(&mut self) -> Expr {
        let mut e = self.primary();
        loop {
            match self.peek() {
                Tok::LParen => {
                    self.bump();
                    self.depth += 1;
                    let args = self.args();
                    let end = self.span();
                    let closed = self.expect(&Tok::RParen, "`)` or `,`");
                    self.depth -= 1;
                    let span = e.span.to(end);
                    e = Expr {
                        kind: ExprKind::Call { callee: Box::new(e), args, piped: false },
                        span,
                    };
                    if !closed {
                        return e;
                    }
                }
                Tok::LBracket => {
                    self.bump();
                    self.depth += 1;
                    let mut items = Vec::new();
                    loop {
                        items.push(self.index_item());
                        if !self.eat(&Tok::Comma) {
                            break;
                        }
                    }
                    let end = self.span();
                    let closed = self.expect(&Tok::RBracket, "`]` or `,`");
                    self.depth -= 1;
                    let span = e.span.to(end);
                    e = Expr { kind: ExprKind::Index { target: Box::new(e), items }, span };
                    if !closed {
                        return e;
                    }
                }
                Tok::Dot => {
                    self.bump();
                    let Some(name) = self.ident("a column or field name after `.`") else {
                        return e;
                    };
                    let span = e.span.to(name.span);
                    e = Expr { kind: ExprKind::Field { target: Box::new(e), name }, span };
                }
                _ => return e,
            }
        }
    }

    fn index_item(&mut self) -> IndexItem {
        let start = if self.at(&Tok::Colon) { None } else { Some(self.expr()) };
        if self.eat(&Tok::Colon) {
            let end = if self.at(&Tok::Comma) || self.at(&Tok::RBracket) {
                None
            } else {
                Some(self.expr())
            };
            return IndexItem::Slice { start, end };
        }
        match start {
            Some(e) => IndexItem::At(e),
            None => IndexItem::Slice { start: None, end: None },
        }
    }

    fn args(&mut self) -> Vec<Arg> {
        let mut args: Vec<Arg> = Vec::new();
        let mut named_seen: Option<Span> = None;
        while !self.at(&Tok::RParen) && !self.at(&Tok::Eof) {
            let arg = match (self.peek().clone(), self.peek2().clone()) {
                (Tok::Ident(name), Tok::Assign) => {
                    let (_, span) = self.bump();
                    self.bump();
                    let value = self.expr();
                    named_seen.get_or_insert(span);
                    Arg { name: Some(Ident { name, span }), value }
                }
                _ => {
                    let value = self.expr();
                    if let Some(first_named) = named_seen {
                        self.error(
                            Diagnostic::error(
                                "E0104",
                                value.span,
                                "a positional argument after a named one",
                            )
                            .label("positional")
                            .secondary(first_named, "named arguments start here"),
                        );
                    }
                    Arg { name: None, value }
                }
            };
            let failed = matches!(arg.value.kind, ExprKind::Error);
            args.push(arg);
            if failed || !self.eat(&Tok::Comma) {
                break;
            }
        }
        args
    }

    fn primary(&mut self) -> Expr {
        let span = self.span();
        let kind = match self.peek().clone() {
            Tok::Int(text) => {
                self.bump();
                match text.replace('_', "").parse::<i64>() {
                    Ok(v) => ExprKind::Int(v),
                    Err(_) => {
                        self.error(
                            Diagnostic::error(
                                "E0005",
                                span,
                                format!("integer `{text}` is out of range"),
                            )
                            .label("does not fit in 64 bits"),
                        );
                        ExprKind::Error
                    }
                }
            }
            Tok::Float(text) => {
                self.bump();
                match text.replace('_', "").parse::<f64>() {
                    Ok(v) => ExprKind::Float(v),
                    Err(_) => {
                        self.error(Diagnostic::error(
                            "E0005",
                            span,
                            format!("invalid number `{text}`"),
                        ));
                        ExprKind::Error
                    }
                }
            }
            Tok::Str(raw) => {
                self.bump();
                match unescape(&raw[1..raw.len() - 1]) {
                    Ok(s) => ExprKind::Str(s),
                    Err((offset, what)) => {
                        let at = Span::new(span.start + 1 + offset, span.start + 3 + offset);
                        self.error(
                            Diagnostic::error(
                                "E0007",
                                at,
                                format!("unknown escape `{what}` in a string"),
                            )
                            .label("here")
                            .help(Some("escapes are \\n \\t \\\\ \\\" and \\'".into())),
                        );
                        ExprKind::Error
                    }
                }
            }
            Tok::True => {
                self.bump();
                ExprKind::Bool(true)
            }
            Tok::False => {
                self.bump();
                ExprKind::Bool(false)
            }
            Tok::Null => {
                self.bump();
                ExprKind::Null
            }
            Tok::Ident(name) => {
                self.bump();
                ExprKind::Name(name)
            }
            Tok::LParen => {
                self.bump();
                self.depth += 1;
                let e = self.expr();
                let closed = self.expect(&Tok::RParen, "`)`");
                self.depth -= 1;
                if !closed {
                    return Expr { kind: ExprKind::Error, span };
                }
                return Expr { kind: e.kind, span: span.to(self.toks[self.pos - 1].1) };
            }
            Tok::LBracket => {
                self.bump();
                self.depth += 1;
                let mut items = Vec::new();
                while !self.at(&Tok::RBracket) && !self.at(&Tok::Eof) {
                    let e = self.expr();
                    let failed = matches!(e.kind, ExprKind::Error);
                    items.push(e);
                    if failed || !self.eat(&Tok::Comma) {
                        break;
                    }
                }
                let end = self.span();
                let closed = self.expect(&Tok::RBracket, "`]` or `,`");
                self.depth -= 1;
                if !closed {
                    return Expr { kind: ExprKind::Error, span };
                }
                return Expr { kind: ExprKind::List(items), span: span.to(end) };
            }
            Tok::If => return self.if_expr(),
            _ => {
                self.unexpected("an expression");
                return Expr { kind: ExprKind::Error, span };
            }
        };
        Expr { kind, span }
    }

    fn if_expr(&mut self) -> Expr {
        let (_, start) = self.bump();
        let cond = self.expr();
        let Some(then) = self.block() else {
            return Expr { kind: ExprKind::Error, span: start };
        };
        let mut end = then.span;
        // `else` may open the next line, on a line or inside brackets alike.
        let otherwise = match self.next_line_starts_with(&Tok::Else) {
            Some(i) => {
                self.pos = i + 1;
                if self.at(&Tok::If) {
                    let nested = self.if_expr();
                    end = nested.span;
                    let span = nested.span;
                    Some(Block { stmts: vec![Stmt { kind: StmtKind::Expr(nested), span }], span })
                } else {
                    let b = self.block();
                    if let Some(b) = &b {
                        end = b.span;
                    }
                    b
                }
            }
            _ => None,
        };
        Expr { kind: ExprKind::If { cond: Box::new(cond), then, otherwise }, span: start.to(end) }
    }
}

/// Decodes `\n \t \\ \" \'`; an unknown escape gives its byte offset and text.
fn unescape(s: &str) -> Result<String, (usize, String)> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some((_, 'n')) => out.push('\n'),
            Some((_, 't')) => out.push('\t'),
            Some((_, '\\')) => out.push('\\'),
            Some((_, '"')) => out.push('"'),
            Some((_, '\'')) => out.push('\''),
            Some((_, other)) => return Err((i, format!("\\{other}"))),
            None => return Err((i, "\\".into())),
        }
    }
    Ok(out)
}
