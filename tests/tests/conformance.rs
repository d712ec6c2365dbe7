//! ONNX node-suite conformance of the CPU engine (see `xpu_tests::conformance`).
//!
//! Fails when a case listed in `tests/conformance/onnx-node-expected-pass.txt` no longer
//! passes, when any case crashes, or when the bar (≥ 1,000 cases over ≥ 110 op types) is
//! missed. `XPU_BLESS=1` rewrites the expectations and `tests/conformance/onnx-node-report.md`.

use std::collections::BTreeSet;

use xpu_tests::conformance::{Status, cache_dir, report, run_all};

#[test]
fn onnx_node_suite() {
    let (manifest, results) = run_all(&cache_dir(), None).unwrap_or_else(|e| panic!("{e}"));
    assert!(results.len() >= 1800, "only {} cases exported", results.len());
    let root = xpu_tests::repo_root().join("tests/conformance");
    let expected_path = root.join("onnx-node-expected-pass.txt");
    let passing: BTreeSet<&str> =
        results.iter().filter(|r| r.status == Status::Pass).map(|r| r.name.as_str()).collect();
    let md = report(&manifest, &results);
    if xpu_tests::bless() {
        let list: String = passing.iter().map(|n| format!("{n}\n")).collect();
        std::fs::write(&expected_path, list).unwrap();
        std::fs::write(root.join("onnx-node-report.md"), &md).unwrap();
    }
    let crashes: Vec<String> = results
        .iter()
        .filter(|r| r.status == Status::Crash)
        .map(|r| format!("{}: {}", r.name, r.detail))
        .collect();
    assert!(crashes.is_empty(), "cases crashed the process:\n{}", crashes.join("\n"));
    let expected = std::fs::read_to_string(&expected_path).expect("expectations file exists");
    let regressed: Vec<String> = expected
        .lines()
        .filter(|n| !n.is_empty() && !passing.contains(n))
        .map(|n| {
            let r = results.iter().find(|r| r.name == n);
            format!(
                "{n}: {}",
                r.map(|r| format!("{} {}", r.status.name(), r.detail))
                    .unwrap_or_else(|| "missing".into())
            )
        })
        .collect();
    assert!(
        regressed.is_empty(),
        "{} previously passing cases regressed:\n{}",
        regressed.len(),
        regressed.join("\n")
    );
    let ops: BTreeSet<&str> = results
        .iter()
        .filter(|r| r.status == Status::Pass && !r.op.starts_with('('))
        .map(|r| r.op.as_str())
        .collect();
    println!("{} / {} cases pass over {} op types", passing.len(), results.len(), ops.len());
    assert!(passing.len() >= 1000, "{} cases pass; the bar is 1,000", passing.len());
    assert!(ops.len() >= 110, "{} op types pass; the bar is 110", ops.len());
    let new = passing.len() - expected.lines().filter(|n| passing.contains(n)).count();
    if new > 0 {
        println!("{new} cases pass that the expectations do not list: re-bless with XPU_BLESS=1");
    }
}

/// Old-opset forms the importer rewrites (Upsample-7/9, Resize-10, Softmax-11, Slice-1,
/// Pad-2, TopK-1, Clip-6, Split-2, …), checked against onnxruntime's outputs
/// (`tests/conformance/legacy_opsets.py`, run by `make setup`). Every case must pass.
#[test]
fn legacy_opsets_match_onnxruntime() {
    let dir = xpu_tests::repo_root().join(".cache/legacy-opsets");
    let (_, results) = run_all(&dir, None).unwrap_or_else(|e| panic!("{e} (run `make setup`)"));
    assert!(results.len() >= 25, "only {} legacy cases", results.len());
    let failing: Vec<String> = results
        .iter()
        .filter(|r| r.status != Status::Pass)
        .map(|r| format!("{}: {} {}", r.name, r.status.name(), r.detail))
        .collect();
    assert!(failing.is_empty(), "{}", failing.join("\n"));
}
