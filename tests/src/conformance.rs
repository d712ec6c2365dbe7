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
    /// Why the case's stored expectation was replaced by the exact answer (the exporter's
    /// `ERRATA`, each proven wrong against its own tolerance at export).
    #[serde(default)]
    pub erratum: Option<String>,
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
    /// For a passing case: each data set's outputs (the differential tests compare them).
    pub outputs: Vec<Vec<Tensor>>,
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

/// The relative tolerance ONNX's backend runner gives bfloat16 outputs: two bf16 ulps.
const BF16_RTOL: f64 = 1.0 / 64.0;

/// One unit in the last place of `y` rounded to bfloat16: bf16 keeps f32's exponent and 7
/// of its mantissa bits.
fn bf16_ulp(y: f64) -> f64 {
    let exponent_bits = (y as f32).abs().to_bits() & 0x7f80_0000;
    if exponent_bits == 0 {
        // Subnormal: the spacing of the smallest exponent.
        return f64::from(f32::from_bits(0x0080_0000)) / 128.0;
    }
    f64::from(f32::from_bits(exponent_bits)) / 128.0
}

/// numpy's `assert_allclose` rule: |a − e| ≤ atol + rtol·|e|, NaNs equal, infinities equal
/// only to the same infinity. bfloat16 results are compared as ONNX's own backend runner
/// compares them (`onnx/backend/test/runner`, 1.20+): with `rtol` raised to 2⁻⁶, two bf16
/// ulps, because a bf16 result computed in any order of operations other than the
/// reference's lands an ulp or two away. They may also differ by one bf16 ulp near zero:
/// how an engine rounds f32 to bf16 depends on the CPU (OpenVINO rounds to nearest with
/// AVX512_BF16 and differently on AVX2-only CPUs: `test_cast_FLOAT_to_BFLOAT16` gives
/// 0.46875 on one and 0.470703125 on the other), and a case must not pass on one machine
/// and fail on the next (docs/conformance.md).
pub fn compare(actual: &Tensor, expected: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
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
        // Low precision: the codes bit for bit (a NaN's sign included).
        (TensorData::Lowp(l, a), TensorData::Lowp(_, e)) => {
            if let Some(i) = (0..a.len()).find(|&i| a[i] != e[i]) {
                return Err(format!(
                    "element {i}: {:#04x} ({}) != expected {:#04x} ({})",
                    a[i],
                    l.to_f64(a[i]),
                    e[i],
                    l.to_f64(e[i])
                ));
            }
        }
        (a, e) => {
            let float = actual.dtype().is_float();
            let bf16 = actual.dtype() == xpu_ir::DType::BF16;
            let rtol = if bf16 { rtol.max(BF16_RTOL) } else { rtol };
            for i in 0..a.len() {
                let (x, y) = (a.get_f64(i), e.get_f64(i));
                // numpy's rule: infinities only match the same infinity (without this an
                // infinite expectation would accept any value).
                let ok = if float {
                    (x.is_nan() && y.is_nan())
                        || x == y
                        || (x.is_finite()
                            && y.is_finite()
                            && ((x - y).abs() <= atol + rtol * y.abs()
                                || (bf16 && (x - y).abs() <= bf16_ulp(y))))
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

/// How a case's model reaches the engine under test.
pub enum Route<'a> {
    /// import → SGR-ML → `engine.prepare`: the cpu engine runs the graph; ort and openvino
    /// export it back to ONNX first (the round trip).
    Import(&'a dyn xpu_engine::Engine, xpu_engine::Assignment),
    /// The model file as it is, straight to an engine that takes ONNX.
    Direct(&'a DirectPrepare<'a>),
}

/// Prepares a whole ONNX model (case name, model bytes).
pub type DirectPrepare<'a> = dyn Fn(&str, &[u8]) -> Result<Box<dyn xpu_engine::Executable>, xpu_engine::EngineError>
    + Sync
    + 'a;

fn import_and_prepare(
    bytes: &[u8],
    engine: &dyn xpu_engine::Engine,
    assignment: &xpu_engine::Assignment,
) -> Result<Box<dyn xpu_engine::Executable>, (Status, String)> {
    let graph = match xpu_onnx::import_model(bytes) {
        Ok(g) => g,
        Err(
            e @ (xpu_onnx::OnnxError::UnsupportedOp { .. }
            | xpu_onnx::OnnxError::UnsupportedDType { .. }),
        ) => return Err((Status::Unsupported, e.to_string())),
        Err(e) => {
            let msg = e.to_string();
            let status =
                if msg.contains("not supported") { Status::Unsupported } else { Status::Error };
            return Err((status, msg));
        }
    };
    if let Err(errs) = xpu_ir::verify(&graph) {
        return Err((Status::Error, format!("verifier: {}", errs[0])));
    }
    engine.prepare(&graph, assignment).map_err(|e| match e {
        e @ xpu_engine::EngineError::Unsupported { .. } => (Status::Unsupported, e.to_string()),
        e => (Status::Error, e.to_string()),
    })
}

/// Runs one case; `outputs` gets each data set's outputs as the engine computed them.
fn run_case(
    dir: &Path,
    case: &CaseInfo,
    route: &Route<'_>,
    outputs: &mut Vec<Vec<Tensor>>,
) -> (Status, String) {
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
    let mut exe = match route {
        Route::Import(engine, assignment) => {
            match import_and_prepare(&bytes, *engine, assignment) {
                Ok(e) => e,
                Err(r) => return r,
            }
        }
        Route::Direct(prepare) => match prepare(&case.name, &bytes) {
            Ok(e) => e,
            Err(e @ xpu_engine::EngineError::Unsupported { .. }) => {
                return (Status::Unsupported, e.to_string());
            }
            Err(e) => return (Status::Error, e.to_string()),
        },
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
        outputs.push(out.clone());
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
pub fn run_all(
    dir: &Path,
    filter: Option<&str>,
    route: &Route<'_>,
) -> Result<(Manifest, Vec<CaseResult>), String> {
    let manifest = load_manifest(dir)?;
    let by_name: BTreeMap<&str, &CaseInfo> =
        manifest.cases.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut results = Vec::new();
    for case in &manifest.cases {
        if filter.is_some_and(|f| !case.name.contains(f)) {
            continue;
        }
        let mut outputs = Vec::new();
        let run = std::panic::AssertUnwindSafe(|| run_case(dir, case, route, &mut outputs));
        let (status, detail) = match std::panic::catch_unwind(run) {
            Ok(r) => r,
            Err(p) => (Status::Crash, xpu_engine::panic_message(&*p)),
        };
        results.push(CaseResult {
            name: case.name.clone(),
            op: primary_op(case, &by_name),
            status,
            detail,
            outputs: if status == Status::Pass { outputs } else { Vec::new() },
        });
    }
    Ok((manifest, results))
}

/// The Markdown report: totals, a per-op table and every case that does not pass.
pub fn report(manifest: &Manifest, results: &[CaseResult], title: &str, route: &str) -> String {
    let count = |s: Status| results.iter().filter(|r| r.status == s).count();
    let mut per_op: BTreeMap<&str, [usize; 5]> = BTreeMap::new();
    for r in results {
        per_op.entry(&r.op).or_default()[r.status as usize] += 1;
    }
    let ops_with_pass = per_op.iter().filter(|(op, c)| c[0] > 0 && !op.starts_with('(')).count();
    let mut s = String::new();
    s.push_str(&format!("# ONNX node test suite — {title}\n\n"));
    s.push_str(&format!(
        "Generated by `cargo test -p xpu-tests --test conformance` (re-bless with `XPU_BLESS=1`) from onnx {} node cases: {route}, compared with each case's rtol/atol.\n\n",
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
    let errata: Vec<&CaseInfo> = manifest.cases.iter().filter(|c| c.erratum.is_some()).collect();
    if !errata.is_empty() {
        s.push_str("\n## Expectations replaced\n\nThese cases' stored expectations are further from the exact answer than their own tolerance allows; `tests/conformance/export_cases.py` proves that at every export and compares with the exact answer (ONNX's reference evaluator on a float64 copy of the model, rounded to the output type) instead.\n\n| case | why |\n|---|---|\n");
        for c in errata {
            s.push_str(&format!("| {} | {} |\n", c.name, c.erratum.as_deref().unwrap_or("")));
        }
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

/// One engine route's results, named for the engines report (`ort`, `ort round trip`).
pub struct RouteResults<'a> {
    pub name: &'a str,
    pub results: &'a [CaseResult],
}

/// Cases two routes both pass whose outputs disagree beyond the case's tolerance:
/// `case: output i: …`.
pub fn disagreements(manifest: &Manifest, a: &[CaseResult], b: &[CaseResult]) -> Vec<String> {
    let tol: BTreeMap<&str, (f64, f64)> =
        manifest.cases.iter().map(|c| (c.name.as_str(), (c.rtol, c.atol))).collect();
    let b_by_name: BTreeMap<&str, &CaseResult> = b.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut out = Vec::new();
    for ra in a.iter().filter(|r| r.status == Status::Pass) {
        let Some(rb) = b_by_name.get(ra.name.as_str()).filter(|r| r.status == Status::Pass) else {
            continue;
        };
        let (rtol, atol) = tol.get(ra.name.as_str()).copied().unwrap_or((1e-3, 1e-7));
        'sets: for (k, (xa, xb)) in ra.outputs.iter().zip(&rb.outputs).enumerate() {
            for (i, (ta, tb)) in xa.iter().zip(xb).enumerate() {
                // Both ways: an infinite expectation accepts any value one way only.
                if let Err(m) = compare(ta, tb, rtol, atol).and(compare(tb, ta, rtol, atol)) {
                    out.push(format!("{}: data set {k}, output {i}: {m}", ra.name));
                    break 'sets;
                }
            }
        }
    }
    out
}

/// The per-engine report: totals per route, passes per op for every route, what the round
/// trip loses, and the differential comparison of every pair of routes.
pub fn engines_report(manifest: &Manifest, routes: &[RouteResults<'_>], notes: &str) -> String {
    let mut s = String::from("# ONNX node test suite — engines\n\n");
    s.push_str(&format!(
        "Generated by `cargo test -p xpu-tests --test conformance` (re-bless with `XPU_BLESS=1`) from onnx {} node cases, each compared with its rtol/atol. {notes}\n\n",
        manifest.onnx_version
    ));
    s.push_str("| route | cases | pass | mismatch | unsupported | error | crash |\n|---|---|---|---|---|---|---|\n");
    for r in routes {
        let count = |st: Status| r.results.iter().filter(|c| c.status == st).count();
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            r.results.len(),
            count(Status::Pass),
            count(Status::Mismatch),
            count(Status::Unsupported),
            count(Status::Error),
            count(Status::Crash)
        ));
    }
    s.push_str("\n## Differential: outputs of cases both routes pass, compared with each other\n\n| routes | both pass | disagree |\n|---|---|---|\n");
    let mut listed = Vec::new();
    for (i, a) in routes.iter().enumerate() {
        for b in &routes[i + 1..] {
            let both = a
                .results
                .iter()
                .zip(b.results)
                .filter(|(x, y)| x.status == Status::Pass && y.status == Status::Pass)
                .count();
            let d = disagreements(manifest, a.results, b.results);
            s.push_str(&format!("| {} vs {} | {both} | {} |\n", a.name, b.name, d.len()));
            listed.extend(d.into_iter().map(|d| format!("{} vs {}: {d}", a.name, b.name)));
        }
    }
    if !listed.is_empty() {
        s.push_str("\nDisagreements:\n\n");
        for d in &listed {
            s.push_str(&format!("- {}\n", d.replace('|', "\\|")));
        }
    }
    s.push_str("\n## Passes per op\n\n| op | cases |");
    for r in routes {
        s.push_str(&format!(" {} |", r.name));
    }
    s.push_str("\n|---|---|");
    s.push_str(&"---|".repeat(routes.len()));
    s.push('\n');
    let mut per_op: BTreeMap<&str, (usize, Vec<usize>)> = BTreeMap::new();
    for (k, r) in routes.iter().enumerate() {
        for c in r.results {
            let e = per_op.entry(&c.op).or_insert_with(|| (0, vec![0; routes.len()]));
            if k == 0 {
                e.0 += 1;
            }
            if c.status == Status::Pass {
                e.1[k] += 1;
            }
        }
    }
    for (op, (n, passes)) in &per_op {
        s.push_str(&format!("| {op} | {n} |"));
        for p in passes {
            s.push_str(&format!(" {p} |"));
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod bf16_tests {
    use super::*;

    fn bf16(v: f64) -> Tensor {
        // bf16 is the upper half of an f32 (these values are exact in bf16).
        let bytes = (((v as f32).to_bits() >> 16) as u16).to_le_bytes();
        let data = TensorData::from_le_bytes(xpu_ir::DType::BF16, &bytes).unwrap();
        Tensor::new(vec![1], data).unwrap()
    }

    #[test]
    fn bf16_results_get_onnx_runners_two_ulps_and_no_more() {
        // The two roundings of f32 0.4702… seen on AVX2 and AVX-512 machines.
        assert_eq!(compare(&bf16(0.46875), &bf16(0.470703125), 1e-3, 1e-7), Ok(()));
        assert_eq!(compare(&bf16(-1.546875), &bf16(-1.5546875), 1e-3, 1e-7), Ok(()));
        // rtol 2⁻⁶ is two ulps at the bottom of a binade (ulp 2⁻⁸ at 0.5); three is a real
        // difference.
        assert_eq!(compare(&bf16(0.5078125), &bf16(0.5), 1e-3, 1e-7), Ok(()));
        assert!(compare(&bf16(0.51171875), &bf16(0.5), 1e-3, 1e-7).is_err());
        // Near zero only the one-ulp allowance and atol remain.
        assert!(compare(&bf16(0.0), &bf16(1e-3), 1e-3, 1e-7).is_err());
        assert_eq!(bf16_ulp(1.5), 0.0078125);
        assert_eq!(bf16_ulp(0.47), 0.001953125);
    }
}
