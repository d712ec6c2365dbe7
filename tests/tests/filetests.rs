//! Golden "filetests" for the IR passes (Cranelift style). Each `tests/filetests/*.sgr`
//! starts with a header naming the passes (`; test: fold, dce`, optionally `; memory: N=4`
//! to append the memory plan), then the input graph, then `; ==== expected ====` and the
//! expected output. The verifier runs after every pass. `XPU_BLESS=1` rewrites expectations.

use std::collections::BTreeMap;
use std::path::Path;

use xpu_engine_cpu::CpuEvaluator;
use xpu_ir::passes::{plan_memory, run_pass};

const SEPARATOR: &str = "; ==== expected ====";

fn run_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (input, expected) = match text.split_once(SEPARATOR) {
        Some((i, e)) => (i.to_string(), e.trim_start_matches('\n').to_string()),
        None => (text.clone(), String::new()),
    };
    let mut passes = Vec::new();
    let mut memory: Option<BTreeMap<String, u64>> = None;
    for line in input.lines() {
        if let Some(rest) = line.strip_prefix("; test:") {
            passes =
                rest.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        }
        if let Some(rest) = line.strip_prefix("; memory:") {
            let mut b = BTreeMap::new();
            for kv in rest.split_whitespace() {
                let (k, v) = kv.split_once('=').ok_or(format!("bad binding {kv}"))?;
                b.insert(k.to_string(), v.parse().map_err(|_| format!("bad size in {kv}"))?);
            }
            memory = Some(b);
        }
    }
    if passes.is_empty() && memory.is_none() {
        return Err("no `; test:` header".into());
    }
    let body: String = input.lines().filter(|l| !l.starts_with(';')).collect::<Vec<_>>().join("\n");
    let mut g = xpu_ir::text::parse(&body).map_err(|e| format!("input: {e}"))?;
    xpu_ir::verify(&g).map_err(|e| format!("input does not verify: {}", e[0]))?;
    for p in &passes {
        g = run_pass(p, &g, Some(&CpuEvaluator)).map_err(|e| e.to_string())?;
        xpu_ir::verify(&g).map_err(|e| format!("after `{p}`: {}", e[0]))?;
    }
    let mut actual = xpu_ir::text::print(&g);
    if let Some(b) = memory {
        actual.push_str(&plan_memory(&g, &b).to_string());
    }
    xpu_tests::check_golden(path, &input, SEPARATOR, &expected, &actual)
}

#[test]
fn filetests() {
    let dir = xpu_tests::repo_root().join("tests/filetests");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/filetests exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sgr"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "expected the pass filetests in {}", dir.display());
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| run_file(f).err().map(|e| format!("{}: {e}", f.display())))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
