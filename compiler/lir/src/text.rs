//! The text form: a printer (`Display` for [`Module`] and [`Kernel`]) and a parser that
//! reads back exactly what the printer writes. Errors carry a 1-based line and column.
//!
//! ```text
//! kernel @bias_gelu[?n](%x: f32[?n, 64] in, %b: f32[64] in, %y: f32[?n, 64] out) {
//!   for %i in 0..?n parallel {
//!     for %j in 0..64 {
//!       %a = load %x[%i, %j]
//!       ...
//!       store %y[%i, %j], %r
//!     }
//!   }
//! }
//! ```

use std::fmt::{self, Write as _};

use crate::{
    Access, Affine, BinaryOp, Buffer, CmpOp, Expr, Kernel, Literal, MAX_DEPTH, Module, ReduceOp,
    ScalarType, Stmt, UnaryOp, Var,
};

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, k) in self.kernels.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{k}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel @{}", self.name)?;
        if !self.syms.is_empty() {
            let syms: Vec<String> = self.syms.iter().map(|s| format!("?{s}")).collect();
            write!(f, "[{}]", syms.join(", "))?;
        }
        let buffers: Vec<String> = self.buffers.iter().map(buffer_text).collect();
        writeln!(f, "({}) {{", buffers.join(", "))?;
        let mut out = String::new();
        block(&mut out, &self.body, 1)?;
        f.write_str(&out)?;
        writeln!(f, "}}")
    }
}

fn buffer_text(b: &Buffer) -> String {
    format!("%{}: {}{} {}", b.name, b.elem.name(), index_text(&b.shape), b.access.name())
}

fn index_text(index: &[Affine]) -> String {
    let parts: Vec<String> = index.iter().map(Affine::to_string).collect();
    format!("[{}]", parts.join(", "))
}

fn literal_text(l: Literal) -> String {
    match l {
        Literal::Bool(b) => b.to_string(),
        Literal::Int(i) => i.to_string(),
        // Debug keeps a `.0` on integral values and prints the shortest round-tripping form.
        Literal::Float(x) if x.is_nan() => "nan".into(),
        Literal::Float(x) => format!("{x:?}"),
    }
}

fn block(out: &mut String, body: &[Stmt], depth: usize) -> fmt::Result {
    let pad = "  ".repeat(depth);
    for s in body {
        match s {
            Stmt::For { var, lo, hi, parallel, body } => {
                let par = if *parallel { " parallel" } else { "" };
                writeln!(out, "{pad}for %{var} in {lo}..{hi}{par} {{")?;
                block(out, body, depth + 1)?;
                writeln!(out, "{pad}}}")?;
            }
            Stmt::Let { name, value } => {
                write!(out, "{pad}%{name} = ")?;
                expr(out, value, depth)?;
                out.push('\n');
            }
            Stmt::Store { buffer, index, value } => {
                writeln!(out, "{pad}store %{buffer}{}, %{value}", index_text(index))?
            }
            Stmt::Yield(v) => writeln!(out, "{pad}yield %{v}")?,
        }
    }
    Ok(())
}

fn expr(out: &mut String, e: &Expr, depth: usize) -> fmt::Result {
    match e {
        Expr::Const { ty, value } => write!(out, "const {} : {}", literal_text(*value), ty.name()),
        Expr::Index(a) => write!(out, "index {a}"),
        Expr::Load { buffer, index } => write!(out, "load %{buffer}{}", index_text(index)),
        Expr::Unary { op, arg } => write!(out, "{} %{arg}", op.name()),
        Expr::Binary { op, lhs, rhs } => write!(out, "{} %{lhs}, %{rhs}", op.name()),
        Expr::Compare { op, lhs, rhs } => write!(out, "cmp {} %{lhs}, %{rhs}", op.name()),
        Expr::Select { cond, then, otherwise } => {
            write!(out, "select %{cond}, %{then}, %{otherwise}")
        }
        Expr::Cast { arg, to } => write!(out, "cast %{arg} to {}", to.name()),
        Expr::Reduce { op, ty, lanes, init, var, lo, hi, body } => {
            writeln!(
                out,
                "reduce {} : {} lanes {lanes} init {} for %{var} in {lo}..{hi} {{",
                op.name(),
                ty.name(),
                literal_text(*init)
            )?;
            block(out, body, depth + 1)?;
            write!(out, "{}}}", "  ".repeat(depth))
        }
    }
}

/// A syntax error at a 1-based line and column: the same type SGR-ML's text form reports.
pub use xpu_ir::text::ParseError;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `%name`, `?name`, `@name`.
    Name(char, String),
    Int(u64),
    Float(f64),
    Punct(&'static str),
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Name(c, s) => write!(f, "`{c}{s}`"),
            Tok::Int(v) => write!(f, "`{v}`"),
            Tok::Float(v) => write!(f, "`{v:?}`"),
            Tok::Punct(p) => write!(f, "`{p}`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

const PUNCTS: [&str; 13] = ["..", "[", "]", "(", ")", "{", "}", ",", ":", "=", "+", "-", "*"];

/// Parses a module (any number of kernels) from its text form. The result is not verified:
/// run [`crate::verify`] before using it.
pub fn parse(src: &str) -> Result<Module, ParseError> {
    let tokens = lex(src)?;
    let mut p = Parser { tokens, pos: 0, depth: 0 };
    let mut module = Module::default();
    while p.peek() != &Tok::Eof {
        module.kernels.push(p.kernel()?);
    }
    Ok(module)
}

fn lex(src: &str) -> Result<Vec<(Tok, usize, usize)>, ParseError> {
    let bytes = src.as_bytes();
    let (mut pos, mut line, mut col) = (0usize, 1usize, 1usize);
    let mut out = Vec::new();
    let is_name = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while pos < bytes.len() {
        let c = bytes[pos];
        let (start_line, start_col) = (line, col);
        let err = |message: String| ParseError { line: start_line, col: start_col, message };
        let len;
        let tok = if c == b'\n' {
            (pos, line, col) = (pos + 1, line + 1, 1);
            continue;
        } else if c.is_ascii_whitespace() {
            len = 1;
            None
        } else if c == b';' {
            len = bytes[pos..].iter().position(|&b| b == b'\n').unwrap_or(bytes.len() - pos);
            None
        } else if matches!(c, b'%' | b'?' | b'@') {
            let n = bytes[pos + 1..].iter().take_while(|&&b| is_name(b)).count();
            if n == 0 {
                return Err(err(format!("expected a name after `{}`", c as char)));
            }
            len = 1 + n;
            Some(Tok::Name(c as char, src[pos + 1..pos + len].to_string()))
        } else if c.is_ascii_digit() {
            let (tok, n) = number(&bytes[pos..]).map_err(err)?;
            len = n;
            Some(tok)
        } else if c.is_ascii_alphabetic() || c == b'_' {
            len = bytes[pos..].iter().take_while(|&&b| is_name(b)).count();
            Some(Tok::Ident(src[pos..pos + len].to_string()))
        } else if let Some(p) = PUNCTS.iter().find(|p| bytes[pos..].starts_with(p.as_bytes())) {
            len = p.len();
            Some(Tok::Punct(p))
        } else {
            let ch = src[pos..].chars().next().unwrap_or('?');
            return Err(err(format!("unexpected character {ch:?}")));
        };
        if let Some(tok) = tok {
            out.push((tok, start_line, start_col));
        }
        // Columns count characters, not bytes.
        col += src[pos..pos + len].chars().count();
        pos += len;
    }
    out.push((Tok::Eof, line, col));
    Ok(out)
}

/// An unsigned integer or float at the start of `s` (which starts with a digit), and its
/// length. `1..4` is an integer followed by `..`.
fn number(s: &[u8]) -> Result<(Tok, usize), String> {
    let digits = |from: usize| s[from..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut n = digits(0);
    let mut float = false;
    if s.get(n) == Some(&b'.') && s.get(n + 1) != Some(&b'.') {
        float = true;
        n += 1 + digits(n + 1);
    }
    if matches!(s.get(n), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(s.get(n + 1), Some(b'+' | b'-')));
        let exp = digits(n + 1 + sign);
        if exp > 0 {
            float = true;
            n += 1 + sign + exp;
        }
    }
    let text = std::str::from_utf8(&s[..n]).map_err(|e| e.to_string())?;
    let tok = if float {
        Tok::Float(text.parse().map_err(|_| format!("malformed number `{text}`"))?)
    } else {
        Tok::Int(text.parse().map_err(|_| format!("integer `{text}` does not fit in 64 bits"))?)
    };
    Ok((tok, n))
}

struct Parser {
    tokens: Vec<(Tok, usize, usize)>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.tokens[self.pos].0
    }

    fn err(&self, message: impl Into<String>) -> ParseError {
        let (_, line, col) = &self.tokens[self.pos];
        ParseError { line: *line, col: *col, message: message.into() }
    }

    /// What `take` makes of the next token, consuming it only when that is something (so
    /// an error points at the token, and end of input is never stepped past).
    fn take<T>(&mut self, take: impl FnOnce(&Tok) -> Option<T>) -> Option<T> {
        let got = take(self.peek());
        if got.is_some() {
            self.pos += 1;
        }
        got
    }

    fn int(&mut self, what: &str) -> Result<u64, ParseError> {
        self.take(|t| if let Tok::Int(n) = t { Some(*n) } else { None })
            .ok_or_else(|| self.expected(what))
    }

    fn expected(&self, what: &str) -> ParseError {
        self.err(format!("expected {what}, found {}", self.peek()))
    }

    fn punct(&mut self, p: &str) -> Result<(), ParseError> {
        if matches!(self.peek(), Tok::Punct(q) if *q == p) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.expected(&format!("`{p}`")))
        }
    }

    fn eat_punct(&mut self, p: &str) -> bool {
        let hit = matches!(self.peek(), Tok::Punct(q) if *q == p);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn keyword(&mut self, k: &str) -> Result<(), ParseError> {
        if matches!(self.peek(), Tok::Ident(s) if s == k) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.expected(&format!("`{k}`")))
        }
    }

    fn ident(&mut self, what: &str) -> Result<String, ParseError> {
        match self.peek() {
            Tok::Ident(s) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn name(&mut self, sigil: char, what: &str) -> Result<String, ParseError> {
        match self.peek() {
            Tok::Name(c, s) if *c == sigil => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn value(&mut self) -> Result<String, ParseError> {
        self.name('%', "a value (`%name`)")
    }

    fn ty(&mut self) -> Result<ScalarType, ParseError> {
        let at = self.err("");
        let name = self.ident("a type")?;
        ScalarType::from_name(&name)
            .ok_or(ParseError { message: format!("unknown type `{name}`"), ..at })
    }

    fn kernel(&mut self) -> Result<Kernel, ParseError> {
        self.keyword("kernel")?;
        let name = self.name('@', "a kernel name (`@name`)")?;
        let mut syms = Vec::new();
        if self.eat_punct("[") {
            loop {
                syms.push(self.name('?', "a symbol (`?name`)")?);
                if !self.eat_punct(",") {
                    break;
                }
            }
            self.punct("]")?;
        }
        self.punct("(")?;
        let mut buffers = Vec::new();
        if !self.eat_punct(")") {
            loop {
                buffers.push(self.buffer()?);
                if !self.eat_punct(",") {
                    break;
                }
            }
            self.punct(")")?;
        }
        let body = self.block()?;
        Ok(Kernel { name, syms, buffers, body })
    }

    fn buffer(&mut self) -> Result<Buffer, ParseError> {
        let name = self.value()?;
        self.punct(":")?;
        let elem = self.ty()?;
        let shape = self.index()?;
        let access = match self.ident("`in`, `out` or `inout`")?.as_str() {
            "in" => Access::In,
            "out" => Access::Out,
            "inout" => Access::InOut,
            other => {
                return Err(self.err(format!("expected `in`, `out` or `inout`, found `{other}`")));
            }
        };
        Ok(Buffer { name, elem, shape, access })
    }

    fn index(&mut self) -> Result<Vec<Affine>, ParseError> {
        self.punct("[")?;
        let mut index = Vec::new();
        if self.eat_punct("]") {
            return Ok(index);
        }
        loop {
            index.push(self.affine()?);
            if !self.eat_punct(",") {
                break;
            }
        }
        self.punct("]")?;
        Ok(index)
    }

    fn block(&mut self) -> Result<Vec<Stmt>, ParseError> {
        self.punct("{")?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("blocks nested deeper than {MAX_DEPTH}")));
        }
        let mut body = Vec::new();
        while !self.eat_punct("}") {
            body.push(self.stmt()?);
        }
        self.depth -= 1;
        Ok(body)
    }

    fn stmt(&mut self) -> Result<Stmt, ParseError> {
        match self.peek().clone() {
            Tok::Ident(k) if k == "for" => {
                self.pos += 1;
                let (var, lo, hi) = self.range()?;
                let parallel = matches!(self.peek(), Tok::Ident(s) if s == "parallel");
                if parallel {
                    self.pos += 1;
                }
                Ok(Stmt::For { var, lo, hi, parallel, body: self.block()? })
            }
            Tok::Ident(k) if k == "store" => {
                self.pos += 1;
                let buffer = self.value()?;
                let index = self.index()?;
                self.punct(",")?;
                Ok(Stmt::Store { buffer, index, value: self.value()? })
            }
            Tok::Ident(k) if k == "yield" => {
                self.pos += 1;
                Ok(Stmt::Yield(self.value()?))
            }
            Tok::Name('%', name) => {
                self.pos += 1;
                self.punct("=")?;
                Ok(Stmt::Let { name, value: self.expr()? })
            }
            _ => Err(self.expected("a statement (`for`, `store`, `yield` or `%name = …`)")),
        }
    }

    /// `%var in lo..hi`.
    fn range(&mut self) -> Result<(String, Affine, Affine), ParseError> {
        let var = self.value()?;
        self.keyword("in")?;
        let lo = self.affine()?;
        self.punct("..")?;
        Ok((var, lo, self.affine()?))
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        let at = self.err("");
        let op = self.ident("an op")?;
        Ok(match op.as_str() {
            "const" => {
                let value = self.literal()?;
                self.punct(":")?;
                Expr::Const { value, ty: self.ty()? }
            }
            "index" => Expr::Index(self.affine()?),
            "load" => Expr::Load { buffer: self.value()?, index: self.index()? },
            "cmp" => {
                let at = self.err("");
                let name = self.ident("a comparison")?;
                let op = CmpOp::from_name(&name)
                    .ok_or(ParseError { message: format!("unknown comparison `{name}`"), ..at })?;
                let lhs = self.value()?;
                self.punct(",")?;
                Expr::Compare { op, lhs, rhs: self.value()? }
            }
            "select" => {
                let cond = self.value()?;
                self.punct(",")?;
                let then = self.value()?;
                self.punct(",")?;
                Expr::Select { cond, then, otherwise: self.value()? }
            }
            "cast" => {
                let arg = self.value()?;
                self.keyword("to")?;
                Expr::Cast { arg, to: self.ty()? }
            }
            "reduce" => self.reduce()?,
            name => {
                if let Some(op) = UnaryOp::from_name(name) {
                    Expr::Unary { op, arg: self.value()? }
                } else if let Some(op) = BinaryOp::from_name(name) {
                    let lhs = self.value()?;
                    self.punct(",")?;
                    Expr::Binary { op, lhs, rhs: self.value()? }
                } else {
                    return Err(ParseError { message: format!("unknown op `{name}`"), ..at });
                }
            }
        })
    }

    fn reduce(&mut self) -> Result<Expr, ParseError> {
        let at = self.err("");
        let name = self.ident("a reduction (`add`, `mul`, `max`, `min`)")?;
        let op = ReduceOp::from_name(&name)
            .ok_or(ParseError { message: format!("unknown reduction `{name}`"), ..at })?;
        self.punct(":")?;
        let ty = self.ty()?;
        self.keyword("lanes")?;
        let lanes = self
            .take(|t| match t {
                Tok::Int(n) if (1..=u32::MAX as u64).contains(n) => Some(*n as u32),
                _ => None,
            })
            .ok_or_else(|| self.expected("a lane count"))?;
        self.keyword("init")?;
        let init = self.literal()?;
        self.keyword("for")?;
        let (var, lo, hi) = self.range()?;
        Ok(Expr::Reduce { op, ty, lanes, init, var, lo, hi, body: self.block()? })
    }

    fn literal(&mut self) -> Result<Literal, ParseError> {
        let negative = self.eat_punct("-");
        let at = self.err("integer literal out of the i64 range");
        if let Some(n) = self.take(|t| if let Tok::Int(n) = t { Some(*n) } else { None }) {
            let v = if negative { -(n as i128) } else { n as i128 };
            return i64::try_from(v).map(Literal::Int).map_err(|_| at);
        }
        let lit = self
            .take(|t| match t {
                Tok::Ident(s) if s == "true" && !negative => Some(Literal::Bool(true)),
                Tok::Ident(s) if s == "false" && !negative => Some(Literal::Bool(false)),
                Tok::Ident(s) if s == "inf" => Some(Literal::Float(f64::INFINITY)),
                Tok::Ident(s) if s == "nan" && !negative => Some(Literal::Float(f64::NAN)),
                Tok::Float(x) => Some(Literal::Float(*x)),
                _ => None,
            })
            .ok_or_else(|| self.expected("a literal"))?;
        Ok(match (negative, lit) {
            (true, Literal::Float(x)) => Literal::Float(-x),
            (_, l) => l,
        })
    }

    /// `term (± term)*`, a term being `N`, `var`, `var*N` or `N*var`.
    fn affine(&mut self) -> Result<Affine, ParseError> {
        let at = self.err("");
        let overflow =
            || ParseError { message: "affine expression overflows i64".into(), ..at.clone() };
        let mut constant: i128 = 0;
        let mut terms: Vec<(Var, i64)> = Vec::new();
        let mut sign: i128 = if self.eat_punct("-") { -1 } else { 1 };
        loop {
            let (var, coef) = if let Some(var) = self.var() {
                let coef =
                    if self.eat_punct("*") { self.int("an integer coefficient")? } else { 1 };
                (Some(var), coef as i128)
            } else {
                let n = self.int("an index expression")? as i128;
                if self.eat_punct("*") {
                    (Some(self.var().ok_or_else(|| self.expected("a loop index or symbol"))?), n)
                } else {
                    (None, n)
                }
            };
            let value = i64::try_from(sign * coef).map_err(|_| overflow())?;
            match var {
                Some(v) => terms.push((v, value)),
                None => constant += value as i128,
            }
            sign = if self.eat_punct("+") {
                1
            } else if self.eat_punct("-") {
                -1
            } else {
                break;
            };
        }
        let constant = i64::try_from(constant).map_err(|_| overflow())?;
        Affine::from_terms(constant, terms).ok_or_else(overflow)
    }

    /// A loop index (`%i`) or symbol (`?n`), if one is next.
    fn var(&mut self) -> Option<Var> {
        self.take(|t| match t {
            Tok::Name('%', s) => Some(Var::Loop(s.clone())),
            Tok::Name('?', s) => Some(Var::Sym(s.clone())),
            _ => None,
        })
    }
}
