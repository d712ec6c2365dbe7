//! Tokens (logos). Newlines are tokens: they end statements, except inside `(…)` and
//! `[…]`, where the parser skips them. Anything logos cannot match becomes an `Error` token
//! the parser reports (E0001), so lexing never fails.

use logos::Logos;

use crate::Span;

#[derive(Logos, Debug, Clone, PartialEq)]
#[logos(skip r"[ \t\r\f]+")]
#[logos(skip r"#[^\n]*")]
pub enum Tok {
    #[token("\n")]
    Newline,
    #[token("let")]
    Let,
    #[token("mut")]
    Mut,
    #[token("fn")]
    Fn,
    #[token("if")]
    If,
    #[token("else")]
    Else,
    #[token("for")]
    For,
    #[token("in")]
    In,
    #[token("print")]
    Print,
    #[token("and")]
    And,
    #[token("or")]
    Or,
    #[token("not")]
    Not,
    #[token("true")]
    True,
    #[token("false")]
    False,
    #[token("null")]
    Null,
    #[regex(r"[A-Za-z_][A-Za-z0-9_]*", |lex| lex.slice().to_string())]
    Ident(String),
    #[regex(r"[0-9][0-9_]*", |lex| lex.slice().to_string(), priority = 3)]
    Int(String),
    #[regex(r"[0-9][0-9_]*\.[0-9][0-9_]*([eE][+-]?[0-9]+)?|[0-9][0-9_]*[eE][+-]?[0-9]+", |lex| lex.slice().to_string())]
    Float(String),
    /// A string literal, quotes included (escapes are decoded by the parser).
    #[regex(r#""([^"\\\n]|\\.)*""#, |lex| lex.slice().to_string())]
    Str(String),
    /// A string that reaches the end of the line without its closing quote.
    #[regex(r#""([^"\\\n]|\\.)*"#, |lex| lex.slice().to_string(), priority = 1)]
    UnterminatedStr(String),
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token(",")]
    Comma,
    #[token(";")]
    Semi,
    #[token(":")]
    Colon,
    #[token(".")]
    Dot,
    #[token("..")]
    DotDot,
    #[token("|>")]
    Pipe,
    #[token("=")]
    Assign,
    #[token("==")]
    Eq,
    #[token("!=")]
    Ne,
    #[token("<")]
    Lt,
    #[token("<=")]
    Le,
    #[token(">")]
    Gt,
    #[token(">=")]
    Ge,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("*")]
    Star,
    #[token("**")]
    StarStar,
    #[token("/")]
    Slash,
    #[token("%")]
    Percent,
    #[token("@")]
    At,
    /// A character no token starts with.
    Error,
    Eof,
}

impl Tok {
    /// How diagnostics name the token.
    pub fn describe(&self) -> String {
        match self {
            Tok::Newline => "end of line".into(),
            Tok::Ident(s) => format!("name `{s}`"),
            Tok::Int(s) | Tok::Float(s) => format!("number `{s}`"),
            Tok::Str(_) | Tok::UnterminatedStr(_) => "string".into(),
            Tok::Error => "an unexpected character".into(),
            Tok::Eof => "end of file".into(),
            other => format!("`{}`", symbol(other)),
        }
    }
}

fn symbol(t: &Tok) -> &'static str {
    match t {
        Tok::Let => "let",
        Tok::Mut => "mut",
        Tok::Fn => "fn",
        Tok::If => "if",
        Tok::Else => "else",
        Tok::For => "for",
        Tok::In => "in",
        Tok::Print => "print",
        Tok::And => "and",
        Tok::Or => "or",
        Tok::Not => "not",
        Tok::True => "true",
        Tok::False => "false",
        Tok::Null => "null",
        Tok::LParen => "(",
        Tok::RParen => ")",
        Tok::LBracket => "[",
        Tok::RBracket => "]",
        Tok::LBrace => "{",
        Tok::RBrace => "}",
        Tok::Comma => ",",
        Tok::Semi => ";",
        Tok::Colon => ":",
        Tok::Dot => ".",
        Tok::DotDot => "..",
        Tok::Pipe => "|>",
        Tok::Assign => "=",
        Tok::Eq => "==",
        Tok::Ne => "!=",
        Tok::Lt => "<",
        Tok::Le => "<=",
        Tok::Gt => ">",
        Tok::Ge => ">=",
        Tok::Plus => "+",
        Tok::Minus => "-",
        Tok::Star => "*",
        Tok::StarStar => "**",
        Tok::Slash => "/",
        Tok::Percent => "%",
        Tok::At => "@",
        _ => "?",
    }
}

/// Every token with its byte span, ending with `Eof`.
pub fn lex(src: &str) -> Vec<(Tok, Span)> {
    let mut out: Vec<(Tok, Span)> = Tok::lexer(src)
        .spanned()
        .map(|(t, r)| (t.unwrap_or(Tok::Error), Span::new(r.start, r.end)))
        .collect();
    out.push((Tok::Eof, Span::new(src.len(), src.len())));
    out
}
