//! Golden "filetests" for the IR passes (Cranelift style). Each `tests/filetests/*.sgr`
//! starts with a header naming the passes (`; test: fold, dce`, optionally `; memory: N=4`
//! to append the memory plan), then the input graph, then `; ==== expected ====` and the
//! expected output. The verifier runs after every pass. `XPU_BLESS=1` rewrites expectations.
//!
//! `tests/filetests/llvm/*.sgr` are lowerings: `; lower: N=4` binds the graph's symbols,
//! the whole graph is lowered as one llvm partition, and the expectation is the LIR-ML
//! (verified) followed by the LLVM IR the code generator prints for it (before LLVM's
//! optimiser, so it does not change with LLVM's version). The IR is also compiled, so an
//! expectation LLVM would refuse cannot be blessed.

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
            memory = Some(bindings(rest)?);
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

/// `NAME=SIZE` bindings of a header line.
fn bindings(line: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut b = BTreeMap::new();
    for kv in line.split_whitespace() {
        let (k, v) = kv.split_once('=').ok_or(format!("bad binding {kv}"))?;
        b.insert(k.to_string(), v.parse().map_err(|_| format!("bad size in {kv}"))?);
    }
    Ok(b)
}

/// Runs `check` on every `.sgr` file of `dir` (at least `min` of them); every failure is
/// reported with its file.
fn check_all(dir: &str, min: usize, check: fn(&Path) -> Result<(), String>) {
    let dir = xpu_tests::repo_root().join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sgr"))
        .collect();
    files.sort();
    assert!(files.len() >= min, "expected at least {min} filetests in {}", dir.display());
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| check(f).err().map(|e| format!("{}: {e}", f.display())))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn filetests() {
    check_all("tests/filetests", 6, run_file);
}

fn run_lowering(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (input, expected) = match text.split_once(SEPARATOR) {
        Some((i, e)) => (i.to_string(), e.trim_start_matches('\n').to_string()),
        None => (text.clone(), String::new()),
    };
    let mut bound: BTreeMap<String, u64> = BTreeMap::new();
    for line in input.lines() {
        if let Some(rest) = line.strip_prefix("; lower:") {
            bound.extend(bindings(rest)?);
        }
    }
    let body: String = input.lines().filter(|l| !l.starts_with(';')).collect::<Vec<_>>().join("\n");
    let g = xpu_ir::text::parse(&body).map_err(|e| format!("input: {e}"))?;
    let shapes = g
        .inputs
        .iter()
        .map(|&v| {
            g.ty(v)
                .dims
                .as_ref()
                .ok_or("an input of unknown rank")?
                .iter()
                .map(|d| match d {
                    xpu_ir::Dim::Known(n) => Ok(*n as usize),
                    xpu_ir::Dim::Sym(s) => bound
                        .get(s)
                        .map(|&n| n as usize)
                        .ok_or(format!("bind {s} with `; lower: {s}=…`")),
                    xpu_ir::Dim::Unknown => Err("an unknown dim".to_string()),
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let program = xpu_engine_llvm::lower::lower(&g, &shapes, &vec![None; shapes.len()])
        .map_err(|e| e.to_string())?;
    let module = program.module();
    xpu_lir::verify(&module).map_err(|e| format!("the lowering does not verify: {e}"))?;
    // 256-bit vectors whatever this machine has: the golden IR is the same on every host.
    let (ir, _) =
        xpu_engine_llvm::codegen::emit_module(&module.kernels, 256).map_err(|e| e.to_string())?;
    xpu_engine_llvm::compile::compile(
        &ir,
        &xpu_engine_llvm::Target::host(),
        xpu_engine_llvm::Emit::Object,
    )
    .map_err(|e| format!("LLVM refuses the emitted IR: {e}"))?;
    let actual = format!("{module}\n; ---- LLVM IR ----\n{ir}");
    xpu_tests::check_golden(path, &input, SEPARATOR, &expected, &actual)
}

#[test]
fn llvm_lowering_filetests() {
    check_all("tests/filetests/llvm", 2, run_lowering);
}
