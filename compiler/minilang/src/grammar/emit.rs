//! Writes the grammar as GBNF or Lark. Both walk the same rules in the same way: a rule
//! reached inside brackets is written a second time with bracket whitespace, whitespace
//! goes between the elements of a sequence (inside an optional or repeated group when the
//! group follows something), and the lexical rules are emitted from their regexes.

use std::collections::{BTreeSet, VecDeque};
use std::fmt::Write as _;

use super::{G, Lex, Rule, Rx, Space, rules};

/// The two output dialects.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// llama.cpp's GBNF; the start rule is `root`.
    Gbnf,
    /// Lark (Earley, dynamic lexer): start rule `program`.
    Lark,
}

/// Inside brackets (`Nest`) newlines are whitespace; on a line (`Line`) they end statements.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Mode {
    Line,
    Nest,
}

/// The whitespace lexeme a space stands for in a mode.
pub(super) fn space_lex(space: Space, mode: Mode) -> Lex {
    match (space, mode) {
        (Space::Opt, Mode::Line) => Lex::Sp,
        (Space::Req, Mode::Line) => Lex::Sp1,
        (Space::Cont, Mode::Line) => Lex::Cont,
        (Space::Opt | Space::Cont, Mode::Nest) => Lex::Nl,
        (Space::Req, Mode::Nest) => Lex::Nl1,
    }
}

fn is_ws(l: Lex) -> bool {
    !matches!(l, Lex::Name | Lex::Int | Lex::Float | Lex::Str)
}

/// Whether `g` always begins (`first`) or ends with a whitespace lexeme, so no default
/// whitespace goes next to it.
pub(super) fn edge_ws(g: &G, first: bool) -> bool {
    match g {
        G::Lex(l) => is_ws(*l),
        G::Nest(_) => true,
        G::Lines(inner) => edge_ws(inner, first),
        G::Seq(v) => {
            let mut it = v.iter().filter(|e| !matches!(e, G::Space(_)));
            let e = if first { it.next() } else { it.next_back() };
            e.is_some_and(|e| edge_ws(e, first))
        }
        G::Alt(v) => v.iter().all(|e| edge_ws(e, first)),
        G::Opt(inner) | G::Star(inner) => edge_ws(inner, first),
        G::Tok(_) | G::Ref(_) | G::Space(_) => false,
    }
}

/// The elements of a sequence, each with the whitespace lexeme that goes before it: none
/// first, none next to a whitespace lexeme, else what the `Space` marker before it says
/// (optional by default). The writer and the sampler both lay sequences out by this.
pub(super) fn spaced(v: &[G], mode: Mode) -> Vec<(&G, Option<Lex>)> {
    let mut out = Vec::new();
    let mut prev: Option<&G> = None;
    let mut pending = Space::Opt;
    for e in v {
        if let G::Space(s) = e {
            debug_assert!(prev.is_some(), "a space marker stands between two elements");
            pending = *s;
            continue;
        }
        let ws = prev
            .is_some_and(|p| !edge_ws(p, false) && !edge_ws(e, true))
            .then(|| space_lex(pending, mode));
        out.push((e, ws));
        pending = Space::Opt;
        prev = Some(e);
    }
    out
}

struct Writer {
    dialect: Dialect,
    /// (rule, mode) pairs referenced and not yet written.
    queue: VecDeque<(&'static str, Mode)>,
    seen: BTreeSet<(&'static str, Mode)>,
    lexemes: BTreeSet<Lex>,
}

impl Writer {
    fn rule_name(&self, name: &str, mode: Mode) -> String {
        let sep = if self.dialect == Dialect::Gbnf { "-" } else { "_" };
        match mode {
            Mode::Line => name.to_string(),
            Mode::Nest => format!("{name}{sep}n"),
        }
    }

    fn reference(&mut self, name: &'static str, mode: Mode) -> String {
        if self.seen.insert((name, mode)) {
            self.queue.push_back((name, mode));
        }
        self.rule_name(name, mode)
    }

    fn lexeme(&mut self, l: Lex) -> String {
        self.lexemes.insert(l);
        match self.dialect {
            Dialect::Gbnf => l.gbnf_name().to_string(),
            Dialect::Lark if l.nullable() => format!("{}?", lark_terminal(l)),
            Dialect::Lark => lark_terminal(l),
        }
    }

    fn expr(&mut self, g: &G, mode: Mode) -> String {
        match g {
            G::Tok(s) => quote(s),
            G::Lex(l) => self.lexeme(*l),
            G::Ref(name) => self.reference(name, mode),
            G::Seq(v) => self.seq(v, mode),
            G::Alt(v) => {
                let parts: Vec<String> = v.iter().map(|e| self.expr(e, mode)).collect();
                format!("({})", parts.join(" | "))
            }
            G::Opt(inner) => format!("({})?", self.expr(inner, mode)),
            G::Star(inner) => format!("({})*", self.expr(inner, mode)),
            G::Space(s) => self.lexeme(space_lex(*s, mode)),
            G::Nest(inner) => self.nest(inner),
            G::Lines(inner) => self.expr(inner, Mode::Line),
        }
    }

    /// Bracket contents: bracket whitespace at both inner edges (once when empty).
    fn nest(&mut self, inner: &G) -> String {
        let ws = self.lexeme(Lex::Nl);
        match inner {
            G::Opt(body) => format!("{ws} ({} {ws})?", self.expr(body, Mode::Nest)),
            other => format!("{ws} {} {ws}", self.expr(other, Mode::Nest)),
        }
    }

    fn seq(&mut self, v: &[G], mode: Mode) -> String {
        let mut out: Vec<String> = Vec::new();
        for (e, ws) in spaced(v, mode) {
            let ws = ws.map(|l| self.lexeme(l));
            // A repeated or optional group takes its leading whitespace inside, so every
            // repetition has it and an absent group leaves none behind.
            let item = match (e, ws) {
                (G::Opt(inner), Some(ws)) => format!("({ws} {})?", self.expr(inner, mode)),
                (G::Star(inner), Some(ws)) => format!("({ws} {})*", self.expr(inner, mode)),
                (_, Some(ws)) => format!("{ws} {}", self.expr(e, mode)),
                (_, None) => self.expr(e, mode),
            };
            out.push(item);
        }
        out.join(" ")
    }
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn lark_terminal(l: Lex) -> String {
    format!("_{}", l.gbnf_name().to_uppercase())
}

/// The grammar in `dialect`, every rule reachable from `program`.
pub fn write(dialect: Dialect) -> String {
    let rules = rules();
    let mut w =
        Writer { dialect, queue: VecDeque::new(), seen: BTreeSet::new(), lexemes: BTreeSet::new() };
    let mut out = String::new();
    let header = "MiniLang's grammar, generated by `xpuctl minilang grammar` from the parser's \
                  grammar definition (compiler/minilang/src/grammar.rs); do not edit.";
    match dialect {
        Dialect::Gbnf => {
            let _ = writeln!(out, "# {header}\nroot ::= program");
        }
        Dialect::Lark => {
            let _ = writeln!(out, "// {header}\n// Start rule: program (Earley, lexer='dynamic').");
        }
    }
    w.reference("program", Mode::Line);
    while let Some((name, mode)) = w.queue.pop_front() {
        let rule: &Rule = rules.iter().find(|r| r.name == name).expect("rules name existing rules");
        let body = w.expr(&rule.body, mode);
        let _ = match dialect {
            Dialect::Gbnf => writeln!(out, "{} ::= {body}", w.rule_name(name, mode)),
            Dialect::Lark => writeln!(out, "{}: {body}", w.rule_name(name, mode)),
        };
    }
    for l in w.lexemes.clone() {
        let _ = match dialect {
            Dialect::Gbnf => writeln!(out, "{} ::= {}", l.gbnf_name(), gbnf_rx(&l.rx())),
            Dialect::Lark => {
                let rx = if l.nullable() { super::nonempty(l) } else { l.rx() };
                writeln!(out, "{}: /{}/", lark_terminal(l), python_rx(&rx))
            }
        };
    }
    out
}

/// GBNF for a regex; an alternative that is the empty string makes the group optional.
fn gbnf_rx(rx: &Rx) -> String {
    match rx {
        Rx::Lit(s) => quote(s),
        Rx::Class(ranges, negated) => class_text(ranges, *negated),
        Rx::Seq(v) => v.iter().map(gbnf_rx).collect::<Vec<_>>().join(" "),
        Rx::Alt(v) => {
            let empty = v.iter().any(|e| matches!(e, Rx::Lit(s) if s.is_empty()));
            let parts: Vec<String> = v
                .iter()
                .filter(|e| !matches!(e, Rx::Lit(s) if s.is_empty()))
                .map(gbnf_rx)
                .collect();
            format!("({}){}", parts.join(" | "), if empty { "?" } else { "" })
        }
        Rx::Rep(inner, min, max) => format!("({}){}", gbnf_rx(inner), repeat(*min, *max)),
    }
}

fn python_rx(rx: &Rx) -> String {
    match rx {
        Rx::Lit(s) => s.chars().map(escape_char).collect(),
        Rx::Class(ranges, negated) => class_text(ranges, *negated),
        Rx::Seq(v) => v.iter().map(python_rx).collect(),
        Rx::Alt(v) => format!("(?:{})", v.iter().map(python_rx).collect::<Vec<_>>().join("|")),
        Rx::Rep(inner, min, max) => format!("(?:{}){}", python_rx(inner), repeat(*min, *max)),
    }
}

fn repeat(min: u32, max: Option<u32>) -> String {
    match (min, max) {
        (0, None) => "*".into(),
        (1, None) => "+".into(),
        (0, Some(1)) => "?".into(),
        (m, None) => format!("{{{m},}}"),
        (m, Some(n)) => format!("{{{m},{n}}}"),
    }
}

/// A character in a Python regex outside a class.
fn escape_char(c: char) -> String {
    match c {
        '\n' => "\\n".into(),
        '\t' => "\\t".into(),
        '\r' => "\\r".into(),
        c if "\\^$.|?*+()[]{}/".contains(c) => format!("\\{c}"),
        c => c.to_string(),
    }
}

/// A character inside a class: the escapes both llama.cpp's GBNF parser (`\\ \" \[ \] \-`)
/// and Python's `re` take.
fn class_char(c: char) -> String {
    match c {
        '\n' => "\\n".into(),
        '\t' => "\\t".into(),
        '\r' => "\\r".into(),
        c if "\\\"[]-".contains(c) => format!("\\{c}"),
        c => c.to_string(),
    }
}

fn class_text(ranges: &[(char, char)], negated: bool) -> String {
    let mut out = String::from(if negated { "[^" } else { "[" });
    for &(lo, hi) in ranges {
        debug_assert!(lo != '^', "a class starting with ^ would read as a complement");
        out.push_str(&class_char(lo));
        if hi != lo {
            out.push('-');
            out.push_str(&class_char(hi));
        }
    }
    out.push(']');
    out
}
