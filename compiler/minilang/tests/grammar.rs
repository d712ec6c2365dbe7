//! The grammar for constrained decoding is held to the parser: every program drawn from it
//! parses without a syntax error, and the written grammars are golden files.
//! `tests/tests/grammar.rs` runs the corpus and draws through llama.cpp's and lark's own
//! parsers.

use xpu_minilang::grammar::{Dialect, KEYWORDS, sample, write};

/// Syntax diagnostics: E0001–E0010 come from the lexer and parser.
fn syntax_errors(src: &str) -> Vec<String> {
    let (_, diags) = xpu_minilang::parser::parse(src);
    diags
        .iter()
        .filter(|d| d.code <= "E0010")
        .map(|d| {
            let (l, c) = d.line_col(src);
            format!("{l}:{c} {} {}", d.code, d.message)
        })
        .collect()
}

#[test]
fn every_drawn_program_parses() {
    let mut failures = Vec::new();
    for seed in 0..1500u64 {
        let src = sample(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed, 20 + (seed % 16) as u32);
        let errors = syntax_errors(&src);
        if !errors.is_empty() && failures.is_empty() {
            failures.push(format!("seed {seed}:\n{src}\n---\n{}", errors.join("\n")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn draws_cover_the_language() {
    let all: String =
        (0..600u64).map(|s| sample(s * 7919 + 1, 30)).collect::<String>().replace('\t', " ");
    for needle in [
        "let mut ", "fn ", "for ", " in ", "print ", "|>", "if ", "else", "[", "{", "#", ":", "**",
        "..", " and ", " or ", "not ", "\"",
    ] {
        assert!(all.contains(needle), "no draw contains {needle:?}");
    }
}

#[test]
fn written_grammars_are_golden() {
    for (dialect, file) in [(Dialect::Gbnf, "minilang.gbnf"), (Dialect::Lark, "minilang.lark")] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(file);
        let text = write(dialect);
        if std::env::var_os("XPU_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (XPU_BLESS=1 writes it)", path.display()));
        assert!(
            golden == text,
            "{} is stale: XPU_BLESS=1 cargo test -p xpu-minilang --test grammar",
            path.display()
        );
    }
}

#[test]
fn keywords_are_the_lexers() {
    // Every keyword lexes as its own token, not as a name.
    for k in KEYWORDS {
        let toks = xpu_minilang::lexer::lex(k);
        assert!(!matches!(toks[0].0, xpu_minilang::lexer::Tok::Ident(_)), "{k} lexes as a name");
    }
    // And a name that merely starts with one is a name.
    for k in KEYWORDS {
        let toks = xpu_minilang::lexer::lex(&format!("{k}x"));
        assert!(matches!(toks[0].0, xpu_minilang::lexer::Tok::Ident(_)));
    }
}
