//! The SGR-ML text form: a printer and a parser that round-trip.
//!
//! ```text
//! graph "mlp" {
//!   %0: f32[N,784] = input "x"
//!   %1: f32[784,10] = constant {value = tensor<f32[784,10]> b64"…"}
//!   %2: f32[N,10] = matmul(%0, %1) @name("fc1")
//!   %3: f32[N,10] = relu(%2) @group(0)
//!   return "y" = %3
//! }
//! ```
//! Values are numbered in definition order; `_` is an omitted optional input; tensors with
//! more than 16 elements are written as base64 of their little-endian bytes.

use std::fmt;

use base64::Engine as _;
use half::{bf16, f16};

use crate::attr::write_float;
use crate::rowexpr::{self, Literal, RowExpr, RowFunc};
use crate::{Attr, Attrs, DType, Dim, Graph, Op, Tensor, TensorData, TensorType, ValueId};

const INLINE_LIMIT: usize = 16;

/// Prints a graph in the text form.
pub fn print(g: &Graph) -> String {
    let mut s = String::new();
    write_graph(&mut s, g).expect("writing to a String cannot fail");
    s
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_graph(f, self)
    }
}

fn write_graph(f: &mut impl fmt::Write, g: &Graph) -> fmt::Result {
    write_graph_at(f, g, 0)?;
    f.write_str("\n")
}

/// A graph whose statements are indented `depth + 1` levels (a subgraph attribute's body is
/// nested in its node's line); the closing brace ends without a newline.
fn write_graph_at(f: &mut impl fmt::Write, g: &Graph, depth: usize) -> fmt::Result {
    let indent = "  ".repeat(depth + 1);
    writeln!(f, "graph {:?} {{", g.name)?;
    for &v in &g.inputs {
        let val = g.value(v);
        writeln!(f, "{indent}{v}: {} = input {:?}", val.ty, val.name.as_deref().unwrap_or(""))?;
    }
    for n in &g.nodes {
        f.write_str(&indent)?;
        for (i, &o) in n.outputs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{o}: {}", g.ty(o))?;
        }
        write!(f, " = {}", n.op)?;
        if !n.inputs.is_empty() || n.op != Op::Constant {
            f.write_str("(")?;
            for (i, v) in n.inputs.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                match v {
                    Some(v) => write!(f, "{v}")?,
                    None => f.write_str("_")?,
                }
            }
            f.write_str(")")?;
        }
        write_attrs(f, &n.attrs, depth)?;
        if let Some(name) = &n.name {
            write!(f, " @name({name:?})")?;
        }
        if let Some(group) = n.group {
            write!(f, " @group({group})")?;
        }
        f.write_str("\n")?;
    }
    if !g.outputs.is_empty() {
        write!(f, "{indent}return ")?;
        for (i, o) in g.outputs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{:?} = {}", o.name, o.value)?;
        }
        f.write_str("\n")?;
    }
    write!(f, "{}}}", "  ".repeat(depth))
}

fn write_attrs(f: &mut impl fmt::Write, attrs: &Attrs, depth: usize) -> fmt::Result {
    if attrs.is_empty() {
        return Ok(());
    }
    f.write_str(" {")?;
    for (i, (k, v)) in attrs.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{k} = ")?;
        match v {
            Attr::Graph(g) => write_graph_at(f, g, depth + 1)?,
            v => write_attr(f, v)?,
        }
    }
    f.write_str("}")
}

fn write_list<T>(
    f: &mut impl fmt::Write,
    items: &[T],
    mut each: impl FnMut(&mut dyn fmt::Write, &T) -> fmt::Result,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        each(f, x)?;
    }
    f.write_str("]")
}

fn write_attr(f: &mut impl fmt::Write, a: &Attr) -> fmt::Result {
    match a {
        Attr::Int(v) => write!(f, "{v}"),
        Attr::Float(v) => write_float(f, *v),
        Attr::Str(s) => write!(f, "{s:?}"),
        Attr::Ints(v) => write_list(f, v, |f, x| write!(f, "{x}")),
        Attr::Floats(v) => write_list(f, v, |f, x| write_float(f, *x)),
        Attr::Strs(v) => write_list(f, v, |f, x| write!(f, "{x:?}")),
        Attr::DType(d) => write!(f, "dtype<{d}>"),
        Attr::Tensor(t) => write_tensor(f, t),
        Attr::Row(e) => write!(f, "row({e})"),
        Attr::Graph(g) => write_graph_at(f, g, 0),
    }
}

fn write_tensor(f: &mut impl fmt::Write, t: &Tensor) -> fmt::Result {
    write!(f, "tensor<{}> ", t.ty())?;
    // Low-precision codes are written as they are (base64): a NaN's sign survives.
    if (t.numel() > INLINE_LIMIT && t.dtype() != DType::String) || t.dtype().is_low_precision() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(t.data().to_le_bytes());
        return write!(f, "b64\"{b64}\"");
    }
    match t.data() {
        TensorData::F32(v) => write_list(f, v, |f, x| write_f32(f, *x)),
        TensorData::F64(v) => write_list(f, v, |f, x| write_float(f, *x)),
        TensorData::F16(v) => write_list(f, v, |f, x| write_f32(f, x.to_f32())),
        TensorData::BF16(v) => write_list(f, v, |f, x| write_f32(f, x.to_f32())),
        TensorData::Bool(v) => write_list(f, v, |f, x| write!(f, "{x}")),
        TensorData::String(v) => write_list(f, v, |f, x| write!(f, "{x:?}")),
        d => write_list(f, &(0..d.len()).collect::<Vec<_>>(), |f, &i| write_int(f, d, i)),
    }
}

fn write_f32(f: &mut dyn fmt::Write, x: f32) -> fmt::Result {
    if x.is_finite() { write!(f, "{x:?}") } else { write_float(f, x as f64) }
}

fn write_int(f: &mut dyn fmt::Write, d: &TensorData, i: usize) -> fmt::Result {
    match d {
        TensorData::I8(v) => write!(f, "{}", v[i]),
        TensorData::I16(v) => write!(f, "{}", v[i]),
        TensorData::I32(v) => write!(f, "{}", v[i]),
        TensorData::I64(v) => write!(f, "{}", v[i]),
        TensorData::U8(v) => write!(f, "{}", v[i]),
        TensorData::U16(v) => write!(f, "{}", v[i]),
        TensorData::U32(v) => write!(f, "{}", v[i]),
        TensorData::U64(v) => write!(f, "{}", v[i]),
        _ => Err(fmt::Error),
    }
}

/// A text-form syntax or semantic error at a 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Value(u32),
    Int(i128),
    Float(f64),
    Str(String),
    B64(String),
    Punct(char),
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Value(v) => write!(f, "`%{v}`"),
            Tok::Int(v) => write!(f, "`{v}`"),
            Tok::Float(v) => write!(f, "`{v}`"),
            Tok::Str(s) => write!(f, "string {s:?}"),
            Tok::B64(_) => f.write_str("base64 data"),
            Tok::Punct(c) => write!(f, "`{c}`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    line: usize,
    col: usize,
}

impl<'a> Lexer<'a> {
    fn err(&self, message: impl Into<String>) -> ParseError {
        ParseError { line: self.line, col: self.col, message: message.into() }
    }

    fn bump(&mut self) -> Option<u8> {
        let c = *self.src.get(self.pos)?;
        self.pos += 1;
        if c == b'\n' {
            self.line += 1;
            self.col = 1;
        } else if c & 0xC0 != 0x80 {
            self.col += 1;
        }
        Some(c)
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if c == b';' {
                while self.peek().is_some_and(|c| c != b'\n') {
                    self.bump();
                }
            } else if c.is_ascii_whitespace() {
                self.bump();
            } else {
                break;
            }
        }
    }

    /// Returns the next token with the position it starts at.
    fn next(&mut self) -> Result<(Tok, usize, usize), ParseError> {
        self.skip_ws();
        let (line, col) = (self.line, self.col);
        let Some(c) = self.peek() else { return Ok((Tok::Eof, line, col)) };
        let tok = match c {
            b'%' => {
                self.bump();
                let s = self.take_while(|c| c.is_ascii_digit());
                Tok::Value(s.parse().map_err(|_| self.err("expected a value number after `%`"))?)
            }
            b'"' => Tok::Str(self.string()?),
            b'b' if self.src[self.pos..].starts_with(b"b64\"") => {
                self.bump();
                self.bump();
                self.bump();
                Tok::B64(self.string()?)
            }
            c if c.is_ascii_digit() || c == b'-' || c == b'+' => self.number()?,
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let s = self.take_while(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.');
                match s.as_str() {
                    "inf" => Tok::Float(f64::INFINITY),
                    "nan" => Tok::Float(f64::NAN),
                    _ => Tok::Ident(s),
                }
            }
            b'{' | b'}' | b'(' | b')' | b'[' | b']' | b'<' | b'>' | b',' | b':' | b'=' | b'@'
            | b'?' | b'*' => {
                self.bump();
                Tok::Punct(c as char)
            }
            _ => {
                let ch = std::str::from_utf8(&self.src[self.pos..])
                    .ok()
                    .and_then(|s| s.chars().next())
                    .unwrap_or('?');
                return Err(self.err(format!("unexpected character {ch:?}")));
            }
        };
        Ok((tok, line, col))
    }

    fn take_while(&mut self, f: impl Fn(u8) -> bool) -> String {
        let start = self.pos;
        while self.peek().is_some_and(&f) {
            self.bump();
        }
        String::from_utf8_lossy(&self.src[start..self.pos]).into_owned()
    }

    fn number(&mut self) -> Result<Tok, ParseError> {
        let start = self.pos;
        if matches!(self.peek(), Some(b'-' | b'+')) {
            self.bump();
        }
        if self.src[self.pos..].starts_with(b"inf") {
            self.pos += 3;
            self.col += 3;
            let neg = self.src[start] == b'-';
            return Ok(Tok::Float(if neg { f64::NEG_INFINITY } else { f64::INFINITY }));
        }
        let mut is_float = false;
        while let Some(c) = self.peek() {
            if c.is_ascii_digit() {
                self.bump();
            } else if c == b'.' || c == b'e' || c == b'E' {
                is_float = true;
                self.bump();
                if (c == b'e' || c == b'E') && matches!(self.peek(), Some(b'-' | b'+')) {
                    self.bump();
                }
            } else {
                break;
            }
        }
        let text = std::str::from_utf8(&self.src[start..self.pos]).unwrap_or("");
        if is_float {
            text.parse().map(Tok::Float).map_err(|_| self.err(format!("malformed number `{text}`")))
        } else {
            text.parse().map(Tok::Int).map_err(|_| self.err(format!("malformed integer `{text}`")))
        }
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.bump(); // opening quote
        let mut bytes = Vec::new();
        loop {
            match self.bump() {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => break,
                Some(b'\\') => match self.bump() {
                    Some(b'n') => bytes.push(b'\n'),
                    Some(b't') => bytes.push(b'\t'),
                    Some(b'r') => bytes.push(b'\r'),
                    Some(b'0') => bytes.push(0),
                    Some(b'\\') => bytes.push(b'\\'),
                    Some(b'"') => bytes.push(b'"'),
                    Some(b'\'') => bytes.push(b'\''),
                    Some(b'u') => {
                        if self.bump() != Some(b'{') {
                            return Err(self.err("expected `{` after `\\u`"));
                        }
                        let hex = self.take_while(|c| c.is_ascii_hexdigit());
                        if self.bump() != Some(b'}') {
                            return Err(self.err("expected `}` closing `\\u{…}`"));
                        }
                        let ch = u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .ok_or_else(|| {
                                self.err(format!("invalid unicode escape `\\u{{{hex}}}`"))
                            })?;
                        let mut buf = [0u8; 4];
                        bytes.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                    }
                    _ => return Err(self.err("unknown escape in string")),
                },
                Some(c) => bytes.push(c),
            }
        }
        String::from_utf8(bytes).map_err(|_| self.err("string is not valid UTF-8"))
    }
}

struct Parser<'a> {
    lex: Lexer<'a>,
    tok: Tok,
    line: usize,
    col: usize,
    /// How many graphs enclose the one being parsed (subgraph attributes nest).
    depth: usize,
}

/// Parses the text form into a graph. Types are taken as written; run the verifier to check them.
pub fn parse(src: &str) -> Result<Graph, ParseError> {
    let mut p = Parser {
        lex: Lexer { src: src.as_bytes(), pos: 0, line: 1, col: 1 },
        tok: Tok::Eof,
        line: 1,
        col: 1,
        depth: 0,
    };
    p.advance()?;
    let g = p.graph()?;
    if p.tok != Tok::Eof {
        return Err(p.err(format!("expected end of input after the graph, found {}", p.tok)));
    }
    Ok(g)
}

impl<'a> Parser<'a> {
    fn advance(&mut self) -> Result<Tok, ParseError> {
        let (tok, line, col) = self.lex.next()?;
        let prev = std::mem::replace(&mut self.tok, tok);
        self.line = line;
        self.col = col;
        Ok(prev)
    }

    fn err(&self, message: impl Into<String>) -> ParseError {
        ParseError { line: self.line, col: self.col, message: message.into() }
    }

    fn punct(&mut self, c: char) -> Result<(), ParseError> {
        if self.tok == Tok::Punct(c) {
            self.advance()?;
            Ok(())
        } else {
            Err(self.err(format!("expected `{c}`, found {}", self.tok)))
        }
    }

    fn eat(&mut self, c: char) -> Result<bool, ParseError> {
        if self.tok == Tok::Punct(c) {
            self.advance()?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn keyword(&mut self, kw: &str) -> Result<(), ParseError> {
        match &self.tok {
            Tok::Ident(s) if s == kw => {
                self.advance()?;
                Ok(())
            }
            t => Err(self.err(format!("expected `{kw}`, found {t}"))),
        }
    }

    fn string(&mut self) -> Result<String, ParseError> {
        match self.advance()? {
            Tok::Str(s) => Ok(s),
            t => Err(self.err(format!("expected a string, found {t}"))),
        }
    }

    fn ident(&mut self) -> Result<String, ParseError> {
        match &self.tok {
            Tok::Ident(s) => {
                let s = s.clone();
                self.advance()?;
                Ok(s)
            }
            t => Err(self.err(format!("expected a name, found {t}"))),
        }
    }

    fn int(&mut self) -> Result<i64, ParseError> {
        match &self.tok {
            Tok::Int(v) => {
                let v =
                    i64::try_from(*v).map_err(|_| self.err(format!("integer {v} out of range")))?;
                self.advance()?;
                Ok(v)
            }
            t => Err(self.err(format!("expected an integer, found {t}"))),
        }
    }

    fn graph(&mut self) -> Result<Graph, ParseError> {
        if self.depth > crate::control::MAX_SUBGRAPH_DEPTH {
            return Err(self.err(format!(
                "subgraphs nested more than {} deep",
                crate::control::MAX_SUBGRAPH_DEPTH
            )));
        }
        self.keyword("graph")?;
        let name = self.string()?;
        self.punct('{')?;
        let mut g = Graph::new(name);
        // Text ids -> arena ids; text may number values freely, the arena renumbers densely.
        let mut ids: std::collections::HashMap<u32, ValueId> = std::collections::HashMap::new();
        loop {
            match &self.tok {
                Tok::Punct('}') => {
                    self.advance()?;
                    return Ok(g);
                }
                Tok::Ident(s) if s == "return" => {
                    self.advance()?;
                    loop {
                        let name = self.string()?;
                        self.punct('=')?;
                        let v = self.use_value(&ids)?;
                        g.add_output(name, v);
                        if !self.eat(',')? {
                            break;
                        }
                    }
                }
                Tok::Value(_) => self.statement(&mut g, &mut ids)?,
                t => {
                    return Err(self.err(format!(
                        "expected a statement (`%N: type = …`), `return` or `}}`, found {t}"
                    )));
                }
            }
        }
    }

    fn use_value(
        &mut self,
        ids: &std::collections::HashMap<u32, ValueId>,
    ) -> Result<ValueId, ParseError> {
        match self.tok {
            Tok::Value(n) => {
                let v = *ids
                    .get(&n)
                    .ok_or_else(|| self.err(format!("%{n} is used before it is defined")))?;
                self.advance()?;
                Ok(v)
            }
            ref t => Err(self.err(format!("expected a value `%N`, found {t}"))),
        }
    }

    fn statement(
        &mut self,
        g: &mut Graph,
        ids: &mut std::collections::HashMap<u32, ValueId>,
    ) -> Result<(), ParseError> {
        let mut defs = Vec::new();
        loop {
            let (line, col) = (self.line, self.col);
            let Tok::Value(n) = self.advance()? else { unreachable!("checked by caller or below") };
            if ids.contains_key(&n) {
                return Err(ParseError {
                    line,
                    col,
                    message: format!("%{n} is defined twice (values are single-assignment)"),
                });
            }
            self.punct(':')?;
            let ty = self.ty()?;
            defs.push((n, ty));
            if !self.eat(',')? {
                break;
            }
            if !matches!(self.tok, Tok::Value(_)) {
                return Err(self.err(format!("expected another result `%N`, found {}", self.tok)));
            }
        }
        self.punct('=')?;
        let (line, col) = (self.line, self.col);
        let op_name = self.ident()?;
        if op_name == "input" {
            let name = self.string()?;
            if defs.len() != 1 {
                return Err(ParseError {
                    line,
                    col,
                    message: "an input defines exactly one value".into(),
                });
            }
            if !g.nodes.is_empty() {
                return Err(ParseError {
                    line,
                    col,
                    message: "inputs must come before every node".into(),
                });
            }
            let (n, ty) = defs.pop().unwrap();
            ids.insert(n, g.add_input(name, ty));
            return Ok(());
        }
        let op: Op = op_name.parse().map_err(|e: crate::op::UnknownOp| ParseError {
            line,
            col,
            message: e.to_string(),
        })?;
        let mut inputs = Vec::new();
        if self.eat('(')? && !self.eat(')')? {
            loop {
                if matches!(&self.tok, Tok::Ident(s) if s == "_") {
                    self.advance()?;
                    inputs.push(None);
                } else {
                    inputs.push(Some(self.use_value(ids)?));
                }
                if self.eat(')')? {
                    break;
                }
                self.punct(',')?;
            }
        }
        let attrs = if self.tok == Tok::Punct('{') { self.attrs()? } else { Attrs::new() };
        let (mut name, mut group) = (None, None);
        while self.eat('@')? {
            let key = self.ident()?;
            self.punct('(')?;
            match key.as_str() {
                "name" => name = Some(self.string()?),
                "group" => {
                    group = Some(
                        u32::try_from(self.int()?)
                            .map_err(|_| self.err("group must be a non-negative 32-bit integer"))?,
                    )
                }
                other => {
                    return Err(self.err(format!(
                        "unknown node annotation `@{other}` (expected @name or @group)"
                    )));
                }
            }
            self.punct(')')?;
        }
        let types = defs.iter().map(|(_, t)| t.clone()).collect();
        let node = g.add_node(op, inputs, attrs, types);
        let n = &mut g.nodes[node.index()];
        n.name = name;
        n.group = group;
        for ((text_id, _), &v) in defs.iter().zip(&n.outputs) {
            ids.insert(*text_id, v);
        }
        Ok(())
    }

    fn ty(&mut self) -> Result<TensorType, ParseError> {
        let dtype: DType = {
            let (line, col) = (self.line, self.col);
            let name = self.ident()?;
            name.parse().map_err(|e: crate::dtype::UnknownDType| ParseError {
                line,
                col,
                message: e.to_string(),
            })?
        };
        self.punct('[')?;
        if self.eat('*')? {
            self.punct(']')?;
            return Ok(TensorType::unranked(dtype));
        }
        let mut dims = Vec::new();
        if !self.eat(']')? {
            loop {
                dims.push(match self.advance()? {
                    Tok::Int(n) if n >= 0 => {
                        Dim::Known(u64::try_from(n).map_err(|_| self.err("dim too large"))?)
                    }
                    Tok::Ident(s) => Dim::Sym(s),
                    Tok::Punct('?') => Dim::Unknown,
                    t => {
                        return Err(
                            self.err(format!("expected a dim (size, symbol or `?`), found {t}"))
                        );
                    }
                });
                if self.eat(']')? {
                    break;
                }
                self.punct(',')?;
            }
        }
        Ok(TensorType::new(dtype, dims))
    }

    fn attrs(&mut self) -> Result<Attrs, ParseError> {
        self.punct('{')?;
        let mut attrs = Attrs::new();
        if self.eat('}')? {
            return Ok(attrs);
        }
        loop {
            let name = self.ident()?;
            if attrs.get(&name).is_some() {
                return Err(self.err(format!("attribute `{name}` given twice")));
            }
            self.punct('=')?;
            let v = self.attr_value()?;
            attrs.set(&name, v);
            if self.eat('}')? {
                return Ok(attrs);
            }
            self.punct(',')?;
        }
    }

    fn attr_value(&mut self) -> Result<Attr, ParseError> {
        match self.tok.clone() {
            Tok::Int(_) => Ok(Attr::Int(self.int()?)),
            Tok::Float(f) => {
                self.advance()?;
                Ok(Attr::Float(f))
            }
            Tok::Str(s) => {
                self.advance()?;
                Ok(Attr::Str(s))
            }
            Tok::Punct('[') => {
                let (line, col) = (self.line, self.col);
                self.advance()?;
                let mut items = Vec::new();
                if !self.eat(']')? {
                    loop {
                        items.push(self.advance()?);
                        if self.eat(']')? {
                            break;
                        }
                        self.punct(',')?;
                    }
                }
                let at = |message: &str| ParseError { line, col, message: message.to_string() };
                if items.iter().all(|t| matches!(t, Tok::Int(_))) {
                    items
                        .iter()
                        .map(|t| match t {
                            Tok::Int(v) => {
                                i64::try_from(*v).map_err(|_| self.err("integer out of range"))
                            }
                            _ => unreachable!(),
                        })
                        .collect::<Result<_, _>>()
                        .map(Attr::Ints)
                } else if items.iter().all(|t| matches!(t, Tok::Int(_) | Tok::Float(_))) {
                    Ok(Attr::Floats(
                        items
                            .iter()
                            .map(|t| match t {
                                Tok::Int(v) => *v as f64,
                                Tok::Float(f) => *f,
                                _ => unreachable!(),
                            })
                            .collect(),
                    ))
                } else if items.iter().all(|t| matches!(t, Tok::Str(_))) {
                    Ok(Attr::Strs(
                        items
                            .into_iter()
                            .map(|t| match t {
                                Tok::Str(s) => s,
                                _ => unreachable!(),
                            })
                            .collect(),
                    ))
                } else {
                    Err(at("a list attribute holds only integers, only numbers or only strings"))
                }
            }
            Tok::Ident(s) if s == "dtype" => {
                self.advance()?;
                self.punct('<')?;
                let name = self.ident()?;
                let d = name
                    .parse()
                    .map_err(|e: crate::dtype::UnknownDType| self.err(e.to_string()))?;
                self.punct('>')?;
                Ok(Attr::DType(d))
            }
            Tok::Ident(s) if s == "tensor" => {
                self.advance()?;
                Ok(Attr::Tensor(self.tensor()?))
            }
            Tok::Ident(s) if s == "graph" => {
                self.depth += 1;
                let g = self.graph();
                self.depth -= 1;
                Ok(Attr::Graph(Box::new(g?)))
            }
            Tok::Ident(s) if s == "row" => {
                self.advance()?;
                self.punct('(')?;
                let e = self.row_expr(1)?;
                self.punct(')')?;
                Ok(Attr::Row(e))
            }
            t => Err(self.err(format!("expected an attribute value, found {t}"))),
        }
    }

    /// One row expression (`gt(col("Age"), 30)`), nested at most `rowexpr::MAX_DEPTH` deep.
    fn row_expr(&mut self, depth: usize) -> Result<RowExpr, ParseError> {
        if depth > rowexpr::MAX_DEPTH {
            return Err(self.err(format!(
                "a row expression may nest at most {} levels deep",
                rowexpr::MAX_DEPTH
            )));
        }
        let lit = |value| Ok(RowExpr::Lit { value });
        match self.tok.clone() {
            Tok::Int(_) => lit(Literal::Int(self.int()?)),
            Tok::Float(x) => {
                self.advance()?;
                lit(Literal::Float(x))
            }
            Tok::Str(s) => {
                self.advance()?;
                lit(Literal::Str(s))
            }
            Tok::Ident(name) => {
                self.advance()?;
                match name.as_str() {
                    "true" => return lit(Literal::Bool(true)),
                    "false" => return lit(Literal::Bool(false)),
                    "null" => return lit(Literal::Null),
                    _ => {}
                }
                self.punct('(')?;
                let e = match name.as_str() {
                    "col" => RowExpr::Col { name: self.string()? },
                    "cast" => {
                        let arg = self.row_expr(depth + 1)?;
                        self.punct(',')?;
                        let to = self.ident()?;
                        let to = to
                            .parse()
                            .map_err(|e: crate::dtype::UnknownDType| self.err(e.to_string()))?;
                        RowExpr::Cast { arg: Box::new(arg), to }
                    }
                    f => {
                        let func =
                            RowFunc::from_name(f).ok_or_else(|| {
                                self.err(format!(
                                "`{f}` is not a row-expression function (they are: col, cast, {})",
                                RowFunc::ALL.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
                            ))
                            })?;
                        let mut args = Vec::new();
                        if self.tok != Tok::Punct(')') {
                            loop {
                                args.push(self.row_expr(depth + 1)?);
                                if !self.eat(',')? {
                                    break;
                                }
                            }
                        }
                        RowExpr::Call { func, args }
                    }
                };
                self.punct(')')?;
                Ok(e)
            }
            t => Err(self.err(format!("expected a row expression, found {t}"))),
        }
    }

    fn tensor(&mut self) -> Result<Tensor, ParseError> {
        self.punct('<')?;
        let (line, col) = (self.line, self.col);
        let ty = self.ty()?;
        self.punct('>')?;
        let shape = ty.static_shape().ok_or(ParseError {
            line,
            col,
            message: "a tensor literal needs a static shape".into(),
        })?;
        let data = match self.tok.clone() {
            Tok::B64(b) => {
                self.advance()?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b.as_bytes())
                    .map_err(|e| self.err(format!("bad base64 tensor data: {e}")))?;
                TensorData::from_le_bytes(ty.dtype, &bytes).map_err(|e| self.err(e))?
            }
            Tok::Punct('[') => {
                self.advance()?;
                let mut items = Vec::new();
                if !self.eat(']')? {
                    loop {
                        items.push(self.advance()?);
                        if self.eat(']')? {
                            break;
                        }
                        self.punct(',')?;
                    }
                }
                literal_data(ty.dtype, &items).map_err(|m| self.err(m))?
            }
            t => {
                return Err(
                    self.err(format!("expected tensor data `[…]` or `b64\"…\"`, found {t}"))
                );
            }
        };
        Tensor::new(shape, data).map_err(|e| ParseError { line, col, message: e.to_string() })
    }
}

fn literal_data(dtype: DType, items: &[Tok]) -> Result<TensorData, String> {
    let num = |t: &Tok| -> Result<f64, String> {
        match t {
            Tok::Int(v) => Ok(*v as f64),
            Tok::Float(f) => Ok(*f),
            t => Err(format!("expected a number, found {t}")),
        }
    };
    let int = |t: &Tok| -> Result<i128, String> {
        match t {
            Tok::Int(v) => Ok(*v),
            t => Err(format!("expected an integer, found {t}")),
        }
    };
    macro_rules! ints {
        ($t:ty, $variant:ident) => {
            TensorData::$variant(
                items
                    .iter()
                    .map(|t| {
                        int(t).and_then(|v| {
                            <$t>::try_from(v).map_err(|_| format!("{v} does not fit {}", dtype))
                        })
                    })
                    .collect::<Result<_, _>>()?,
            )
        };
    }
    Ok(match dtype {
        DType::Table => return Err("tables cannot be written as constants".into()),
        DType::F32 => TensorData::F32(
            items.iter().map(|t| num(t).map(|x| x as f32)).collect::<Result<_, _>>()?,
        ),
        DType::F64 => TensorData::F64(items.iter().map(num).collect::<Result<_, _>>()?),
        DType::F16 => TensorData::F16(
            items
                .iter()
                .map(|t| num(t).map(|x| f16::from_f32(x as f32)))
                .collect::<Result<_, _>>()?,
        ),
        DType::BF16 => TensorData::BF16(
            items
                .iter()
                .map(|t| num(t).map(|x| bf16::from_f32(x as f32)))
                .collect::<Result<_, _>>()?,
        ),
        DType::I8 => ints!(i8, I8),
        DType::I16 => ints!(i16, I16),
        DType::I32 => ints!(i32, I32),
        DType::I64 => ints!(i64, I64),
        DType::U8 => ints!(u8, U8),
        DType::U16 => ints!(u16, U16),
        DType::U32 => ints!(u32, U32),
        DType::U64 => ints!(u64, U64),
        DType::Bool => TensorData::Bool(
            items
                .iter()
                .map(|t| match t {
                    Tok::Ident(s) if s == "true" => Ok(true),
                    Tok::Ident(s) if s == "false" => Ok(false),
                    t => Err(format!("expected true or false, found {t}")),
                })
                .collect::<Result<_, _>>()?,
        ),
        DType::String => TensorData::String(
            items
                .iter()
                .map(|t| match t {
                    Tok::Str(s) => Ok(s.clone()),
                    t => Err(format!("expected a string, found {t}")),
                })
                .collect::<Result<_, _>>()?,
        ),
        d => {
            // Low precision written by hand: integers in range, floats rounded to nearest.
            let l = d.lowp().ok_or_else(|| format!("{d} has no literal form"))?;
            let codes = items.iter().map(|t| match l.sub_byte() {
                Some(i) => int(t).and_then(|v| {
                    let (lo, hi) = i.range();
                    if (lo as i128..=hi as i128).contains(&v) {
                        Ok(i.wrap(v as i64))
                    } else {
                        Err(format!("{v} does not fit {d}"))
                    }
                }),
                None => num(t).and_then(|x| {
                    let code = l.from_f32(x as f32, false, crate::lowp::RoundMode::Nearest);
                    if x.is_finite() && !l.to_f64(code).is_finite() {
                        Err(format!("{x} does not fit {d}"))
                    } else {
                        Ok(code)
                    }
                }),
            });
            TensorData::Lowp(l, codes.collect::<Result<_, _>>()?)
        }
    })
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_attr(f, self)
    }
}
