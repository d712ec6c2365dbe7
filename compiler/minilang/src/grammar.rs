//! MiniLang's concrete grammar as data: the rules the recursive-descent [`parser`] follows,
//! written once, with the lexical rules (names without keywords, numbers, strings,
//! comments, where newlines end statements) as small regular expressions. From it come the
//! grammar for constrained decoding in two dialects — GBNF (llama.cpp) and Lark (Outlines,
//! llguidance, Python's lark; start rule `program`) — and random programs for tests.
//!
//! The grammar is of *canonical* MiniLang: it accepts every program the parser accepts
//! when keywords are separated from what follows by a space (`print x`, not `print(x)`),
//! and every string it accepts parses without a syntax error (tests sample it against the
//! parser and run the corpus through llama.cpp's and lark's parsers). Newlines are
//! whitespace inside `(…)` and `[…]` and end statements elsewhere, so each rule reached
//! inside brackets exists twice: as itself and as its bracketed (`-n`) twin. Two limits of
//! the parser are not grammar: nesting deeper than 100 and more than 1,000 operators in
//! a statement.
//!
//! [`parser`]: crate::parser

use std::collections::BTreeSet;

mod emit;
mod sample;

pub use emit::{Dialect, write};
pub use sample::sample;

/// The keywords: never names.
pub const KEYWORDS: &[&str] = &[
    "let", "mut", "fn", "if", "else", "for", "in", "print", "and", "or", "not", "true", "false",
    "null",
];

/// A regular expression over characters, written once and emitted as GBNF or as a Python
/// regex (Lark's terminals).
#[derive(Clone, Debug)]
pub enum Rx {
    Lit(String),
    /// A class of character ranges, or its complement (`[^…]`).
    Class(Vec<(char, char)>, bool),
    Seq(Vec<Rx>),
    Alt(Vec<Rx>),
    Rep(Box<Rx>, u32, Option<u32>),
}

fn lit(s: &str) -> Rx {
    Rx::Lit(s.to_string())
}

fn class(ranges: &[(char, char)]) -> Rx {
    Rx::Class(ranges.to_vec(), false)
}

fn not_class(ranges: &[(char, char)]) -> Rx {
    Rx::Class(ranges.to_vec(), true)
}

fn star(r: Rx) -> Rx {
    Rx::Rep(Box::new(r), 0, None)
}

fn plus(r: Rx) -> Rx {
    Rx::Rep(Box::new(r), 1, None)
}

fn optional(r: Rx) -> Rx {
    Rx::Rep(Box::new(r), 0, Some(1))
}

const WORD_START: &[(char, char)] = &[('A', 'Z'), ('_', '_'), ('a', 'z')];
const WORD: &[(char, char)] = &[('0', '9'), ('A', 'Z'), ('_', '_'), ('a', 'z')];

/// The lexical rules: every terminal that is not a fixed string.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lex {
    /// An identifier that is not a keyword.
    Name,
    /// An integer that fits in 64 bits (at most 18 digits and underscores after the first).
    Int,
    Float,
    Str,
    /// Optional spaces on a line.
    Sp,
    /// Required spaces on a line.
    Sp1,
    /// Optional whitespace inside brackets: spaces, newlines, comments.
    Nl,
    /// Required whitespace inside brackets.
    Nl1,
    /// Spaces, or a line break (with comments and blank lines) before a continuation line
    /// (`|>`, `else`).
    Cont,
    /// Anything between statements: spaces, newlines, `;`, comments (may be empty).
    Gap,
    /// What ends a statement: optional spaces and comment, a newline or `;`, then a gap.
    Sep,
    /// A last comment with no newline after it, at the end of the file.
    Tail,
}

impl Lex {
    pub fn gbnf_name(self) -> &'static str {
        match self {
            Lex::Name => "name",
            Lex::Int => "int",
            Lex::Float => "float",
            Lex::Str => "string",
            Lex::Sp => "sp",
            Lex::Sp1 => "sp1",
            Lex::Nl => "nl",
            Lex::Nl1 => "nl1",
            Lex::Cont => "cont",
            Lex::Gap => "gap",
            Lex::Sep => "sep",
            Lex::Tail => "tail",
        }
    }

    /// Whether the rule matches the empty string (Lark terminals may not: those are
    /// written `TERM?`).
    fn nullable(self) -> bool {
        matches!(self, Lex::Sp | Lex::Nl | Lex::Cont | Lex::Gap | Lex::Tail)
    }

    pub fn rx(self) -> Rx {
        // A comment runs to the end of the line: inside whitespace it ends with its newline.
        let comment = Rx::Seq(vec![lit("#"), star(not_class(&[('\n', '\n')]))]);
        let comment_line = Rx::Seq(vec![comment.clone(), lit("\n")]);
        let blank = class(&[('\t', '\t'), ('\r', '\r'), (' ', ' ')]);
        let nest_ws =
            Rx::Alt(vec![class(&[('\t', '\n'), ('\r', '\r'), (' ', ' ')]), comment_line.clone()]);
        let digits = Rx::Seq(vec![class(&[('0', '9')]), star(class(&[('0', '9'), ('_', '_')]))]);
        match self {
            Lex::Name => name_without_keywords(),
            Lex::Int => Rx::Seq(vec![
                class(&[('0', '9')]),
                Rx::Rep(Box::new(class(&[('0', '9'), ('_', '_')])), 0, Some(17)),
            ]),
            Lex::Float => {
                let exponent = Rx::Seq(vec![
                    class(&[('E', 'E'), ('e', 'e')]),
                    optional(class(&[('+', '+'), ('-', '-')])),
                    plus(class(&[('0', '9')])),
                ]);
                Rx::Alt(vec![
                    Rx::Seq(vec![
                        digits.clone(),
                        lit("."),
                        digits.clone(),
                        optional(exponent.clone()),
                    ]),
                    Rx::Seq(vec![digits, exponent]),
                ])
            }
            Lex::Str => Rx::Seq(vec![
                lit("\""),
                star(Rx::Alt(vec![
                    not_class(&[('\n', '\n'), ('"', '"'), ('\\', '\\')]),
                    Rx::Seq(vec![
                        lit("\\"),
                        class(&[('"', '"'), ('\'', '\''), ('\\', '\\'), ('n', 'n'), ('t', 't')]),
                    ]),
                ])),
                lit("\""),
            ]),
            Lex::Sp => star(blank),
            Lex::Sp1 => plus(blank),
            Lex::Nl => star(nest_ws),
            Lex::Nl1 => plus(nest_ws),
            Lex::Cont => Rx::Seq(vec![
                star(Rx::Seq(vec![star(blank.clone()), optional(comment), lit("\n")])),
                star(blank),
            ]),
            Lex::Gap => star(Rx::Alt(vec![
                class(&[('\t', '\n'), ('\r', '\r'), (' ', ' '), (';', ';')]),
                comment_line,
            ])),
            Lex::Sep => Rx::Seq(vec![
                star(blank),
                Rx::Alt(vec![comment_line, lit("\n"), lit(";")]),
                Lex::Gap.rx(),
            ]),
            Lex::Tail => optional(comment),
        }
    }
}

/// A nullable lexeme's non-empty form (Lark terminals may not match the empty string; the
/// grammar writes them `TERM?`).
fn nonempty(l: Lex) -> Rx {
    let blank = class(&[('\t', '\t'), ('\r', '\r'), (' ', ' ')]);
    match l {
        Lex::Sp => Lex::Sp1.rx(),
        Lex::Nl => Lex::Nl1.rx(),
        Lex::Gap => match Lex::Gap.rx() {
            Rx::Rep(item, _, max) => Rx::Rep(item, 1, max),
            other => other,
        },
        // Line breaks first: Python's alternation takes the first alternative that matches.
        Lex::Cont => Rx::Alt(vec![
            Rx::Seq(vec![
                plus(Rx::Seq(vec![
                    star(blank.clone()),
                    optional(Rx::Seq(vec![lit("#"), star(not_class(&[('\n', '\n')]))])),
                    lit("\n"),
                ])),
                star(blank.clone()),
            ]),
            plus(blank),
        ]),
        Lex::Tail => Rx::Seq(vec![lit("#"), star(not_class(&[('\n', '\n')]))]),
        other => other.rx(),
    }
}

/// Identifiers minus the keywords, as a regex: the complement of the keywords' trie.
fn name_without_keywords() -> Rx {
    fn node(prefix: &str, first: bool) -> Rx {
        let children: BTreeSet<char> = KEYWORDS
            .iter()
            .filter(|k| k.len() > prefix.len() && k.starts_with(prefix))
            .map(|k| k[prefix.len()..].chars().next().expect("longer than prefix"))
            .collect();
        let alphabet = if first { WORD_START } else { WORD };
        let mut alts = Vec::new();
        let free = subtract(alphabet, &children);
        if !free.is_empty() {
            alts.push(Rx::Seq(vec![Rx::Class(free, false), star(class(WORD))]));
        }
        for c in children {
            alts.push(Rx::Seq(vec![lit(&c.to_string()), node(&format!("{prefix}{c}"), false)]));
        }
        // The name may end here; last, because Python's regex alternation takes the first
        // alternative that matches, not the longest.
        if !first && !KEYWORDS.contains(&prefix) {
            alts.push(lit(""));
        }
        Rx::Alt(alts)
    }
    node("", true)
}

/// `ranges` without the characters in `minus`.
fn subtract(ranges: &[(char, char)], minus: &BTreeSet<char>) -> Vec<(char, char)> {
    let mut out = Vec::new();
    for &(lo, hi) in ranges {
        let mut start = lo;
        for c in lo..=hi {
            if minus.contains(&c) {
                if start < c {
                    out.push((start, char::from_u32(c as u32 - 1).expect("ascii")));
                }
                start = char::from_u32(c as u32 + 1).unwrap_or(c);
            }
        }
        if start <= hi && !(minus.contains(&hi) && start == hi) {
            out.push((start, hi));
        }
    }
    out
}

/// Whitespace between two elements of a sequence.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Space {
    /// Optional (the default between elements).
    Opt,
    /// Required: between a keyword and a word.
    Req,
    /// Optional, and on a line may break before a continuation line (`|>`, `else`).
    Cont,
}

/// A grammar expression over tokens.
#[derive(Clone, Debug)]
pub enum G {
    /// A fixed token: keyword or punctuation.
    Tok(&'static str),
    Lex(Lex),
    Ref(&'static str),
    /// Elements with whitespace between them: a `Space` marker chooses the whitespace
    /// before the element after it (optional otherwise); before an optional or repeated
    /// group it is the whitespace each repetition starts with.
    Seq(Vec<G>),
    Alt(Vec<G>),
    Opt(Box<G>),
    Star(Box<G>),
    Space(Space),
    /// Inside brackets: newlines are whitespace, also at both inner edges.
    Nest(Box<G>),
    /// Statements: newlines end them again (blocks, even inside brackets).
    Lines(Box<G>),
}

fn t(s: &'static str) -> G {
    G::Tok(s)
}

fn r(s: &'static str) -> G {
    G::Ref(s)
}

fn seq(v: Vec<G>) -> G {
    G::Seq(v)
}

fn alt(v: Vec<G>) -> G {
    G::Alt(v)
}

fn opt(g: G) -> G {
    G::Opt(Box::new(g))
}

fn many(g: G) -> G {
    G::Star(Box::new(g))
}

fn nest(g: G) -> G {
    G::Nest(Box::new(g))
}

const REQ: G = G::Space(Space::Req);
const CONT: G = G::Space(Space::Cont);

/// One rule: name, what it is, body.
pub struct Rule {
    pub name: &'static str,
    pub body: G,
}

/// The grammar, start rule first.
pub fn rules() -> Vec<Rule> {
    let mut rules = statement_rules();
    rules.extend(expression_rules());
    rules
}

fn rule(name: &'static str, body: G) -> Rule {
    Rule { name, body }
}

/// Programs, statements, functions and blocks.
fn statement_rules() -> Vec<Rule> {
    vec![
        rule(
            "program",
            G::Lines(Box::new(seq(vec![
                G::Lex(Lex::Gap),
                opt(seq(vec![r("stmts"), G::Lex(Lex::Gap)])),
                G::Lex(Lex::Tail),
            ]))),
        ),
        rule("stmts", seq(vec![r("stmt"), many(seq(vec![G::Lex(Lex::Sep), r("stmt")]))])),
        rule(
            "stmt",
            alt(vec![
                seq(vec![
                    t("let"),
                    REQ,
                    alt(vec![seq(vec![t("mut"), REQ, G::Lex(Lex::Name)]), G::Lex(Lex::Name)]),
                    t("="),
                    r("expr"),
                ]),
                seq(vec![
                    t("fn"),
                    REQ,
                    G::Lex(Lex::Name),
                    t("("),
                    nest(opt(r("params"))),
                    t(")"),
                    r("block"),
                ]),
                seq(vec![
                    t("for"),
                    REQ,
                    G::Lex(Lex::Name),
                    REQ,
                    t("in"),
                    REQ,
                    r("expr"),
                    r("block"),
                ]),
                seq(vec![t("print"), REQ, r("expr")]),
                seq(vec![G::Lex(Lex::Name), t("="), r("expr")]),
                r("expr"),
            ]),
        ),
        rule("params", seq(vec![r("param"), many(seq(vec![t(","), r("param")])), opt(t(","))])),
        rule("param", seq(vec![G::Lex(Lex::Name), opt(seq(vec![t("="), r("expr")]))])),
        rule(
            "block",
            G::Lines(Box::new(seq(vec![
                t("{"),
                G::Lex(Lex::Gap),
                opt(seq(vec![r("stmts"), G::Lex(Lex::Gap)])),
                t("}"),
            ]))),
        ),
    ]
}

/// Expressions, lowest precedence first, down to primaries.
fn expression_rules() -> Vec<Rule> {
    let binary = |ops: Vec<G>, operand: &'static str| {
        seq(vec![r(operand), many(seq(vec![alt(ops), r(operand)]))])
    };
    vec![
        rule("expr", seq(vec![r("or"), CONT, many(seq(vec![t("|>"), r("callee")]))])),
        rule(
            "callee",
            seq(vec![
                G::Lex(Lex::Name),
                many(seq(vec![t("."), G::Lex(Lex::Name)])),
                opt(seq(vec![t("("), nest(opt(r("args"))), t(")")])),
            ]),
        ),
        rule("or", seq(vec![r("and"), REQ, many(seq(vec![t("or"), REQ, r("and")]))])),
        rule("and", seq(vec![r("not"), REQ, many(seq(vec![t("and"), REQ, r("not")]))])),
        rule("not", alt(vec![seq(vec![t("not"), REQ, r("not")]), r("cmp")])),
        rule(
            "cmp",
            seq(vec![
                r("range"),
                opt(seq(vec![
                    alt(vec![t("=="), t("!="), t("<="), t(">="), t("<"), t(">")]),
                    r("range"),
                ])),
            ]),
        ),
        rule("range", seq(vec![r("add"), opt(seq(vec![t(".."), r("add")]))])),
        rule("add", binary(vec![t("+"), t("-")], "mul")),
        rule("mul", binary(vec![t("*"), t("/"), t("%"), t("@")], "unary")),
        rule("unary", alt(vec![seq(vec![t("-"), r("unary")]), r("power")])),
        rule("power", seq(vec![r("postfix"), opt(seq(vec![t("**"), r("unary")]))])),
        rule(
            "postfix",
            seq(vec![
                r("primary"),
                many(alt(vec![
                    seq(vec![t("("), nest(opt(r("args"))), t(")")]),
                    seq(vec![t("["), nest(r("items")), t("]")]),
                    seq(vec![t("."), G::Lex(Lex::Name)]),
                ])),
            ]),
        ),
        // Positional arguments first, then named ones (the parser's E0104).
        rule(
            "args",
            seq(vec![
                alt(vec![
                    seq(vec![
                        r("expr"),
                        many(seq(vec![t(","), r("expr")])),
                        many(seq(vec![t(","), r("named")])),
                    ]),
                    seq(vec![r("named"), many(seq(vec![t(","), r("named")]))]),
                ]),
                opt(t(",")),
            ]),
        ),
        rule("named", seq(vec![G::Lex(Lex::Name), t("="), r("expr")])),
        rule("items", seq(vec![r("item"), many(seq(vec![t(","), r("item")]))])),
        rule(
            "item",
            alt(vec![seq(vec![opt(seq(vec![r("expr")])), t(":"), opt(r("expr"))]), r("expr")]),
        ),
        rule(
            "primary",
            alt(vec![
                G::Lex(Lex::Float),
                G::Lex(Lex::Int),
                G::Lex(Lex::Str),
                t("true"),
                t("false"),
                t("null"),
                G::Lex(Lex::Name),
                seq(vec![t("("), nest(r("expr")), t(")")]),
                seq(vec![
                    t("["),
                    nest(opt(seq(vec![
                        r("expr"),
                        many(seq(vec![t(","), r("expr")])),
                        opt(t(",")),
                    ]))),
                    t("]"),
                ]),
                r("if"),
            ]),
        ),
        rule(
            "if",
            seq(vec![
                t("if"),
                REQ,
                r("expr"),
                r("block"),
                CONT,
                opt(alt(vec![
                    seq(vec![t("else"), REQ, r("if")]),
                    seq(vec![t("else"), r("block")]),
                ])),
            ]),
        ),
    ]
}
