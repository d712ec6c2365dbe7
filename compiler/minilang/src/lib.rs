//! MiniLang, the xpu job language: [`builtins`] (the one table of its functions), [`lexer`] (logos), [`parser`] (never fails: the tree plus
//! every diagnostic, recovering at statement boundaries), [`check`] (names, mutability,
//! recursion) and [`diag`] (codes, spans, codespan-reporting rendering). Lowering to SGR-ML,
//! tables and the REPL build on this tree (docs/minilang.md).

pub mod ast;
pub mod builtins;
pub mod check;
pub mod diag;
pub mod grammar;
pub mod lexer;
pub mod lower;
pub mod parser;
pub mod paths;

pub use diag::{Diagnostic, Severity, render};

/// A byte range in the source.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end: end.max(start) }
    }

    /// From the start of `self` to the end of `other`.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }
}

/// Parses and checks a program: the tree and every diagnostic, parse errors first.
pub fn analyze(src: &str) -> (ast::Program, Vec<Diagnostic>) {
    let (program, mut diags) = parser::parse(src);
    let syntax_errors = !diags.is_empty();
    // A statement the parser had to skip binds nothing, so "unknown name" after a syntax
    // error is usually an echo of it; the other checks still hold.
    diags.extend(
        check::check(&program).into_iter().filter(|d| !(syntax_errors && d.code == "E0100")),
    );
    diags.sort_by_key(|d| d.span.start);
    (program, diags)
}
