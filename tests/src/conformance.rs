//! Runs ONNX's node test cases (exported by `tests/conformance/export_cases.py`) through
//! import → CPU engine and classifies each: pass, mismatch, unsupported or error. A panic in
//! any case is caught and reported as a crash, which the test treats as a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use xpu_ir::{Tensor, TensorData};

#[derive(Debug, Deserialize)]
pub struct Manifest {
    pub onnx_version: String,
    pub cases: Vec<CaseInfo>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct CaseInfo {
    pub name: String,
    pub rtol: f64,
    pub atol: f64,
    pub data_sets: Vec<DataSetKinds>,
    pub ops: Vec<String>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct DataSetKinds {
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    Pass,
    Mismatch,
    Unsupported,
    Error,
    Crash,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Mismatch => "mismatch",
            Status::Unsupported => "unsupported",
            Status::Error => "error",
            Status::Crash => "crash",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: String,
    /// The op the case tests (its single node, or the op of the case it expands).
    pub op: String,
    pub status: Status,
    pub detail: String,
}

/// Where the exported cases live: `$XPU_ONNX_NODE_CACHE` or `.cache/onnx-node` in the repo.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XPU_ONNX_NODE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join(".cache/onnx-node"))
}

pub fn load_manifest(dir: &Path) -> Result<Manifest, String> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!("cannot read {}: {e}; export the cases first (`make setup`, or .venv/bin/python tests/conformance/export_cases.py {})", path.display(), dir.display())
    })?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn primary_op(case: &CaseInfo, by_name: &BTreeMap<&str, &CaseInfo>) -> String {
    if case.ops.len() == 1 {
        return case.ops[0].clone();
    }
    if let Some(pos) = case.name.find("_expanded")
        && let Some(base) = by_name.get(&case.name[..pos])
        && base.ops.len() == 1
    {
        return base.ops[0].clone();
    }
    "(multi-node)".into()
}

/// numpy's `assert_allclose` rule: |a − e| ≤ atol + rtol·|e|, NaNs equal.
fn compare(actual: &Tensor, expected: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if actual.dtype() != expected.dtype() {
        return Err(format!("dtype {} != expected {}", actual.dtype(), expected.dtype()));
    }
    if actual.shape() != expected.shape() {
        return Err(format!("shape {:?} != expected {:?}", actual.shape(), expected.shape()));
    }
    match (actual.data(), expected.data()) {
        (TensorData::String(a), TensorData::String(e)) => {
            if let Some(i) = (0..a.len()).find(|&i| a[i] != e[i]) {
                return Err(format!("element {i}: {:?} != expected {:?}", a[i], e[i]));
            }
        }
        (a, e) => {
            let float = actual.dtype().is_float();
            for i in 0..a.len() {
                let (x, y) = (a.get_f64(i), e.get_f64(i));
                let ok = if float {
                    (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= atol + rtol * y.abs()
                } else {
                    x == y
                };
                if !ok {
                    return Err(format!(
                        "element {i}: {x} != expected {y} (rtol {rtol}, atol {atol})"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn run_case(dir: &Path, case: &CaseInfo) -> (Status, String) {
    let case_dir = dir.join(&case.name);
    if let Some(kind) = case
        .data_sets
        .iter()
        .flat_map(|d| d.inputs.iter().chain(&d.outputs))
        .find(|k| k.as_str() != "tensor")
    {
        return (Status::Unsupported, format!("non-tensor value ({kind})"));
    }
    let bytes = match std::fs::read(case_dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return (Status::Error, format!("cannot read model: {e}")),
    };
    let graph = match xpu_onnx::import_model(&bytes) {
        Ok(g) => g,
        Err(
            e @ (xpu_onnx::OnnxError::UnsupportedOp { .. }
            | xpu_onnx::OnnxError::UnsupportedDType { .. }),
        ) => return (Status::Unsupported, e.to_string()),
        Err(e) => {
            let msg = e.to_string();
            let status =
                if msg.contains("not supported") { Status::Unsupported } else { Status::Error };
            return (status, msg);
        }
    };
    if let Err(errs) = xpu_ir::verify(&graph) {
        return (Status::Error, format!("verifier: {}", errs[0]));
    }
    let engine = xpu_engine_cpu::CpuEngine::new();
    let mut exe =
        match xpu_engine::Engine::prepare(&engine, &graph, &xpu_engine::Assignment::new("cpu")) {
            Ok(e) => e,
            Err(e @ xpu_engine::EngineError::Unsupported { .. }) => {
                return (Status::Unsupported, e.to_string());
            }
            Err(e) => return (Status::Error, e.to_string()),
        };
    for (k, ds) in case.data_sets.iter().enumerate() {
        let ds_dir = case_dir.join(k.to_string());
        let read = |role: &str, n: usize| -> Result<Vec<Tensor>, String> {
            (0..n)
                .map(|i| {
                    let b = std::fs::read(ds_dir.join(format!("{role}_{i}.pb")))
                        .map_err(|e| e.to_string())?;
                    xpu_onnx::read_tensor_proto(&b).map(|(_, t)| t).map_err(|e| e.to_string())
                })
                .collect()
        };
        let inputs = match read("input", ds.inputs.len()) {
            Ok(v) => v,
            Err(e) => return (Status::Unsupported, format!("input data: {e}")),
        };
        let expected = match read("output", ds.outputs.len()) {
            Ok(v) => v,
            Err(e) => return (Status::Unsupported, format!("expected data: {e}")),
        };
        let out = match exe.run(&inputs) {
            Ok(o) => o.outputs,
            Err(e) => return (Status::Error, e.to_string()),
        };
        if out.len() != expected.len() {
            return (
                Status::Mismatch,
                format!("{} outputs, expected {}", out.len(), expected.len()),
            );
        }
        for (i, (a, e)) in out.iter().zip(&expected).enumerate() {
            if let Err(m) = compare(a, e, case.rtol, case.atol) {
                return (Status::Mismatch, format!("output {i}: {m}"));
            }
        }
    }
    (Status::Pass, String::new())
}

/// Runs every case in the cache.
pub fn run_all(dir: &Path, filter: Option<&str>) -> Result<(Manifest, Vec<CaseResult>), String> {
    let manifest = load_manifest(dir)?;
    let by_name: BTreeMap<&str, &CaseInfo> =
        manifest.cases.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut results = Vec::new();
    for case in &manifest.cases {
        if filter.is_some_and(|f| !case.name.contains(f)) {
            continue;
        }
        let (status, detail) = match std::panic::catch_unwind(|| run_case(dir, case)) {
            Ok(r) => r,
            Err(p) => (
                Status::Crash,
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            ),
        };
        results.push(CaseResult {
            name: case.name.clone(),
            op: primary_op(case, &by_name),
            status,
            detail,
        });
    }
    Ok((manifest, results))
}

/// The Markdown report: totals, a per-op table and every case that does not pass.
pub fn report(manifest: &Manifest, results: &[CaseResult]) -> String {
    let count = |s: Status| results.iter().filter(|r| r.status == s).count();
    let mut per_op: BTreeMap<&str, [usize; 5]> = BTreeMap::new();
    for r in results {
        per_op.entry(&r.op).or_default()[r.status as usize] += 1;
    }
    let ops_with_pass = per_op.iter().filter(|(op, c)| c[0] > 0 && !op.starts_with('(')).count();
    let mut s = String::new();
    s.push_str("# ONNX node test suite — CPU engine conformance\n\n");
    s.push_str(&format!(
        "Generated by `cargo test -p xpu-tests --test conformance` (re-bless with `XPU_BLESS=1`) from onnx {} node cases: import → SGR-ML → CPU engine, compared with each case's rtol/atol.\n\n",
        manifest.onnx_version
    ));
    s.push_str(&format!(
        "| cases | pass | mismatch | unsupported | error | crash | op types with a pass |\n|---|---|---|---|---|---|---|\n| {} | {} | {} | {} | {} | {} | {} |\n\n",
        results.len(),
        count(Status::Pass),
        count(Status::Mismatch),
        count(Status::Unsupported),
        count(Status::Error),
        count(Status::Crash),
        ops_with_pass
    ));
    s.push_str("## Per op\n\n| op | cases | pass | mismatch | unsupported | error | crash |\n|---|---|---|---|---|---|---|\n");
    for (op, c) in &per_op {
        s.push_str(&format!(
            "| {op} | {} | {} | {} | {} | {} | {} |\n",
            c.iter().sum::<usize>(),
            c[0],
            c[1],
            c[2],
            c[3],
            c[4]
        ));
    }
    s.push_str("\n## Cases that do not pass\n\n| case | status | detail |\n|---|---|---|\n");
    for r in results.iter().filter(|r| r.status != Status::Pass) {
        let mut d: String = r.detail.replace('|', "\\|").replace('\n', " ");
        if d.len() > 160 {
            let cut = (0..=160).rev().find(|&i| d.is_char_boundary(i)).unwrap_or(0);
            d.truncate(cut);
            d.push('…');
        }
        s.push_str(&format!("| {} | {} | {d} |\n", r.name, r.status.name()));
    }
    s
}
