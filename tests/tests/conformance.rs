//! ONNX node-suite conformance of the CPU engine (see `xpu_tests::conformance`).
//!
//! Fails when a case listed in `tests/conformance/onnx-node-expected-pass.txt` no longer
//! passes, when any case crashes, or when the bar (≥ 1,000 cases over ≥ 110 op types) is
//! missed. `XPU_BLESS=1` rewrites the expectations and `tests/conformance/onnx-node-report.md`.

use std::collections::BTreeSet;

use xpu_tests::conformance::{Route, Status, cache_dir, report, run_all};

#[test]
fn onnx_node_suite() {
    let engine = xpu_engine_cpu::CpuEngine::new();
    let route = Route::Import(&engine, xpu_engine::Assignment::new("cpu"));
    let (manifest, results) = run_all(&cache_dir(), None, &route).unwrap_or_else(|e| panic!("{e}"));
    assert!(results.len() >= 1800, "only {} cases exported", results.len());
    let root = xpu_tests::repo_root().join("tests/conformance");
    let md = report(&manifest, &results, "CPU engine conformance", "import → SGR-ML → CPU engine");
    if xpu_tests::bless() {
        std::fs::write(root.join("onnx-node-report.md"), &md).unwrap();
    }
    let crashes: Vec<String> = results
        .iter()
        .filter(|r| r.status == Status::Crash)
        .map(|r| format!("{}: {}", r.name, r.detail))
        .collect();
    assert!(crashes.is_empty(), "cases crashed the process:\n{}", crashes.join("\n"));
    let regressed = check_expected("onnx-node-expected-pass.txt", &results);
    assert!(
        regressed.is_empty(),
        "{} previously passing cases regressed:\n{}",
        regressed.len(),
        regressed.join("\n")
    );
    let passing: BTreeSet<&str> =
        results.iter().filter(|r| r.status == Status::Pass).map(|r| r.name.as_str()).collect();
    let expected = std::fs::read_to_string(root.join("onnx-node-expected-pass.txt")).unwrap();
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
    let engine = xpu_engine_cpu::CpuEngine::new();
    let route = Route::Import(&engine, xpu_engine::Assignment::new("cpu"));
    let (_, results) =
        run_all(&dir, None, &route).unwrap_or_else(|e| panic!("{e} (run `make setup`)"));
    assert!(results.len() >= 25, "only {} legacy cases", results.len());
    let failing: Vec<String> = results
        .iter()
        .filter(|r| r.status != Status::Pass)
        .map(|r| format!("{}: {} {}", r.name, r.status.name(), r.detail))
        .collect();
    assert!(failing.is_empty(), "{}", failing.join("\n"));
}

/// Pass list `file` under tests/conformance: rewritten under `XPU_BLESS=1`; otherwise every
/// case it lists must still pass. Returns the regressions.
fn check_expected(file: &str, results: &[xpu_tests::conformance::CaseResult]) -> Vec<String> {
    let path = xpu_tests::repo_root().join("tests/conformance").join(file);
    let passing: BTreeSet<&str> =
        results.iter().filter(|r| r.status == Status::Pass).map(|r| r.name.as_str()).collect();
    if xpu_tests::bless() {
        let list: String = passing.iter().map(|n| format!("{n}\n")).collect();
        std::fs::write(&path, list).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with XPU_BLESS=1)", path.display()));
    expected
        .lines()
        .filter(|n| !n.is_empty() && !passing.contains(n))
        .map(|n| {
            let r = results.iter().find(|r| r.name == n);
            format!(
                "{file}: {n}: {}",
                r.map(|r| format!("{} {}", r.status.name(), r.detail))
                    .unwrap_or_else(|| "missing".into())
            )
        })
        .collect()
}

/// ONNX Runtime through xpu: (a) each case's model straight to the ort engine, (b) import →
/// SGR-ML → export → ort engine. Bar: ≥ 1,300 passes on (a); every case (a) passes that
/// (b) does not is one the importer does not take (never a wrong export); cpu and ort
/// agree on every case both pass. Writes `tests/conformance/engines-report.md` on bless.
#[test]
fn ort_engine_node_suite() {
    use xpu_engine::{Assignment, Executable};
    use xpu_tests::conformance::{RouteResults, disagreements, engines_report};
    let dir = cache_dir();
    let ort = xpu_engine_ort::OrtEngine::load(None).without_profiling();
    assert_eq!(
        ort.availability(),
        xpu_engine::Availability::Available,
        "the ort engine must load here (`make setup` fetches ONNX Runtime into .deps/)"
    );
    let direct = |name: &str, bytes: &[u8]| {
        ort.prepare_model(name, bytes, &Assignment::new("ort"))
            .map(|e| Box::new(e) as Box<dyn Executable>)
    };
    let (manifest, ort_direct) = run_all(&dir, None, &Route::Direct(&direct)).unwrap();
    let (_, ort_round) = run_all(&dir, None, &Route::Import(&ort, Assignment::new("ort"))).unwrap();
    let cpu = xpu_engine_cpu::CpuEngine::new();
    let (_, cpu_results) =
        run_all(&dir, None, &Route::Import(&cpu, Assignment::new("cpu"))).unwrap();

    let pass = |r: &[xpu_tests::conformance::CaseResult]| {
        r.iter().filter(|c| c.status == Status::Pass).count()
    };
    let lost: Vec<&xpu_tests::conformance::CaseResult> = ort_direct
        .iter()
        .zip(&ort_round)
        .filter(|(d, r)| d.status == Status::Pass && r.status != Status::Pass)
        .map(|(_, r)| r)
        .collect();
    let notes = format!(
        "Routes: `ort` hands each model to ONNX Runtime as it is; `ort round trip` imports it into SGR-ML and exports it back to ONNX first; `cpu` imports it and runs xpu's cpu engine. The round trip loses {} of the {} cases `ort` passes ({:.1}%), each one an op or construct the importer does not take.",
        lost.len(),
        pass(&ort_direct),
        100.0 * lost.len() as f64 / pass(&ort_direct).max(1) as f64
    );
    let routes = [
        RouteResults { name: "ort", results: &ort_direct },
        RouteResults { name: "ort round trip", results: &ort_round },
        RouteResults { name: "cpu", results: &cpu_results },
    ];
    let md = engines_report(&manifest, &routes, &notes);
    if xpu_tests::bless() {
        std::fs::write(xpu_tests::repo_root().join("tests/conformance/engines-report.md"), &md)
            .unwrap();
    }
    println!("{notes}");
    println!(
        "ort: {} pass; ort round trip: {} pass; cpu: {} pass",
        pass(&ort_direct),
        pass(&ort_round),
        pass(&cpu_results)
    );
    let crashes: Vec<String> = ort_direct
        .iter()
        .chain(&ort_round)
        .filter(|r| r.status == Status::Crash)
        .map(|r| format!("{}: {}", r.name, r.detail))
        .collect();
    assert!(crashes.is_empty(), "cases crashed the process:\n{}", crashes.join("\n"));
    let mut regressed = check_expected("ort-expected-pass.txt", &ort_direct);
    regressed.extend(check_expected("ort-roundtrip-expected-pass.txt", &ort_round));
    assert!(regressed.is_empty(), "previously passing cases regressed:\n{}", regressed.join("\n"));
    assert!(pass(&ort_direct) >= 1300, "ort passes {}; the bar is 1,300", pass(&ort_direct));
    let wrong: Vec<String> = lost
        .iter()
        .filter(|r| r.status != Status::Unsupported)
        .map(|r| format!("{}: {} {}", r.name, r.status.name(), r.detail))
        .collect();
    assert!(wrong.is_empty(), "the round trip broke cases ort passes:\n{}", wrong.join("\n"));
    // Known disagreements are listed (with why) in differential-known.txt; a new one fails.
    let known_path = xpu_tests::repo_root().join("tests/conformance/differential-known.txt");
    let known = std::fs::read_to_string(&known_path).unwrap_or_default();
    let new: Vec<String> = disagreements(&manifest, &cpu_results, &ort_direct)
        .into_iter()
        .chain(disagreements(&manifest, &cpu_results, &ort_round))
        .chain(disagreements(&manifest, &ort_direct, &ort_round))
        .filter(|d| {
            let case = d.split(':').next().unwrap_or("");
            !known.lines().any(|l| l.split_whitespace().next() == Some(case))
        })
        .collect();
    assert!(new.is_empty(), "engines disagree on cases both pass:\n{}", new.join("\n"));
}
