//! The injection corpus (tests/injection/corpus.toml) through `xpuctl run`: every hostile
//! program is refused with a located error or runs with its hostile text as plain data, and
//! afterwards the data root holds nothing new — no statement smuggled into a table op wrote
//! a file, and no path left the root.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::repo;

/// One corpus case (see the corpus file's header).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    pub kind: String,
    pub expect: String,
    #[serde(default)]
    pub error: String,
    pub body: String,
}

#[derive(serde::Deserialize)]
struct Corpus {
    case: Vec<Case>,
}

fn corpus() -> Vec<Case> {
    let text = std::fs::read_to_string(repo().join("tests/injection/corpus.toml")).unwrap();
    toml::from_str::<Corpus>(&text).unwrap().case
}

/// The program file of a case: `.sgr` cases are wrapped in a graph that reads people.csv.
fn program(case: &Case) -> (&'static str, String) {
    match case.kind.as_str() {
        "sgr" => (
            "sgr",
            format!(
                "graph \"f\" {{\n  %0: table[] = read_csv {{path = \"people.csv\"}}\n  {}\n  return \"out\" = %1\n}}\n",
                case.body
            ),
        ),
        "json" => ("json", case.body.clone()),
        "ml" => ("ml", case.body.clone()),
        other => panic!("{}: unknown kind {other}", case.name),
    }
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn hostile_programs_are_refused_or_harmless_through_xpuctl() {
    let cases = corpus();
    assert!(cases.len() >= 40, "the corpus has {} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        // The data root is a directory inside a scratch parent, so `../x` writes would land
        // in the parent, where they are looked for too.
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::copy(repo().join("tests/minilang/people.csv"), root.join("people.csv")).unwrap();
        let (ext, text) = program(case);
        let prog = root.join(format!("job.{ext}"));
        std::fs::write(&prog, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
            .current_dir(&root)
            .args(["run", prog.file_name().unwrap().to_str().unwrap(), "--out", "out"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        let verdict = match case.expect.as_str() {
            "refused" if code != Some(1) => Some(format!("exit {code:?}, want 1")),
            "refused" if !stderr.contains(&case.error) => {
                Some(format!("the error lacks {:?}", case.error))
            }
            // A refusal names the program (file:line:col for parse errors, the node else).
            "refused" if !stderr.contains("job.") => {
                Some("the error does not name the program".into())
            }
            "runs" if code != Some(0) => Some(format!("exit {code:?}, want 0")),
            "refused" | "runs" => None,
            other => Some(format!("unknown expectation {other}")),
        };
        let mut left: Vec<PathBuf> =
            files_in(parent.path()).into_iter().filter(|p| !p.starts_with("root/out")).collect();
        left.retain(|p| {
            *p != Path::new("root/people.csv")
                && *p != Path::new("root").join(prog.file_name().unwrap())
        });
        if let Some(v) = verdict {
            failures.push(format!("{}: {v}\n  stderr: {stderr}", case.name));
        }
        if !left.is_empty() {
            failures.push(format!("{}: files appeared: {left:?}", case.name));
        }
        if Path::new("/tmp/pwned.csv").exists() || Path::new("/tmp/pwned.png").exists() {
            failures.push(format!("{}: wrote into /tmp", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
