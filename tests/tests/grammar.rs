//! MiniLang's grammar for constrained decoding, run through the parsers that will use it:
//! llama.cpp's own GBNF parser and matcher (`test-gbnf-validator`, built by `make setup`)
//! and Python's lark (Earley). For every program of the corpus — the examples, the golden
//! MiniLang tests, the ask evaluation set — both must agree with xpu's parser (accepted
//! exactly when it parses without a diagnostic); strings that are not MiniLang are refused
//! by all three; and programs drawn from the grammar are accepted by llama.cpp's matcher
//! (the GBNF writer and the sampler agree).

use std::path::{Path, PathBuf};
use std::process::Command;

use xpu_minilang::grammar::{Dialect, sample, write};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn validator() -> PathBuf {
    let dir = std::env::var_os("XPU_LLAMA_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/xpu-llama")
    });
    let bin = dir.join("bin/test-gbnf-validator");
    assert!(
        bin.exists(),
        "{} is missing: `make setup` builds it (tools/fetch_llama.py)",
        bin.display()
    );
    bin
}

/// (name, program) for every program of the corpus.
fn corpus() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dir in ["examples", "tests/minilang", "tests/ask"] {
        let Ok(entries) = std::fs::read_dir(root().join(dir)) else { continue };
        let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
        paths.sort();
        for p in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "ml")) {
            let text = std::fs::read_to_string(&p).unwrap();
            // Golden tests end with their expected diagnostics.
            let program = text.split("# ==== expected ====").next().unwrap().to_string();
            out.push((p.strip_prefix(root()).unwrap().display().to_string(), program));
        }
    }
    assert!(out.len() >= 13, "the corpus shrank: {}", out.len());
    out
}

/// Strings no MiniLang parser may accept.
const NOT_MINILANG: &[&str] = &[
    "SELECT * FROM people WHERE age > 30;",
    "import pandas as pd\ndf = pd.read_csv('people.csv')\n",
    "let = 3",
    "let let = 3",
    "print(",
    "let x = (1 + 2\n",
    "fn f(x) { x\n",
    "x |> 3",
    "a < b < c",
    "f(a=1, 2)",
    "let s = \"unterminated",
    "let s = \"bad \\q escape\"",
    "t[1,]",
    "letx = 1 1",
    "print x\nelse { 1 }",
    "{ let a = 1 }",
    "1 +* 2",
    "```minilang\nprint 1\n```",
];

fn gbnf_accepts(validator: &Path, grammar: &Path, text: &str, scratch: &Path) -> bool {
    let input = scratch.join("input.ml");
    std::fs::write(&input, text).unwrap();
    let out = Command::new(validator).arg(grammar).arg(&input).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("according to the grammar"),
        "validator: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.contains("Input string is valid")
}

/// Lark's verdict on each text, in one Python process.
fn lark_accepts(texts: &[&str]) -> Vec<bool> {
    let python = root().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: `make setup` creates it", python.display());
    let script = r#"
import json, sys
from lark import Lark
grammar, texts = json.load(sys.stdin)
parser = Lark(grammar, start="program", parser="earley", lexer="dynamic")
out = []
for t in texts:
    try:
        parser.parse(t)
        out.append(True)
    except Exception:
        out.append(False)
print(json.dumps(out))
"#;
    let input = serde_json::to_vec(&(write(Dialect::Lark), texts)).unwrap();
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "lark: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn parses(text: &str) -> bool {
    xpu_minilang::parser::parse(text).1.is_empty()
}

#[test]
fn llama_cpp_and_lark_agree_with_the_parser_on_the_corpus() {
    let scratch = tempfile::tempdir().unwrap();
    let grammar = scratch.path().join("minilang.gbnf");
    std::fs::write(&grammar, write(Dialect::Gbnf)).unwrap();
    let validator = validator();
    let corpus = corpus();
    let mut texts: Vec<(String, &str)> =
        corpus.iter().map(|(n, p)| (n.clone(), p.as_str())).collect();
    texts.extend(NOT_MINILANG.iter().map(|s| (format!("{s:?}"), *s)));
    let lark = lark_accepts(&texts.iter().map(|(_, t)| *t).collect::<Vec<_>>());
    let mut disagreements = Vec::new();
    let mut accepted = 0;
    for ((name, text), lark_ok) in texts.iter().zip(lark) {
        let parser_ok = parses(text);
        let gbnf_ok = gbnf_accepts(&validator, &grammar, text, scratch.path());
        accepted += usize::from(gbnf_ok);
        if parser_ok != gbnf_ok || parser_ok != lark_ok {
            disagreements
                .push(format!("{name}: parser {parser_ok}, llama.cpp {gbnf_ok}, lark {lark_ok}"));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    for s in NOT_MINILANG {
        assert!(!parses(s), "the parser accepts {s:?}");
    }
    // Most of the corpus is valid MiniLang: the agreement is not all refusals.
    assert!(accepted >= corpus.len() - 3, "{accepted} of {} accepted", corpus.len());
}

#[test]
fn llama_cpp_accepts_programs_drawn_from_the_grammar() {
    let scratch = tempfile::tempdir().unwrap();
    let grammar = scratch.path().join("minilang.gbnf");
    std::fs::write(&grammar, write(Dialect::Gbnf)).unwrap();
    let validator = validator();
    let draws: Vec<String> =
        (0..60u64).map(|s| sample(s * 104_729 + 7, 20 + (s % 12) as u32)).collect();
    let lark = lark_accepts(&draws.iter().map(String::as_str).collect::<Vec<_>>());
    for (i, (d, lark_ok)) in draws.iter().zip(lark).enumerate() {
        assert!(parses(d), "draw {i} does not parse:\n{d}");
        assert!(
            gbnf_accepts(&validator, &grammar, d, scratch.path()),
            "llama.cpp refuses draw {i}:\n{d:?}"
        );
        assert!(lark_ok, "lark refuses draw {i}:\n{d:?}");
    }
}
