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

/// Cases an engine passes or fails by chance, or disagrees on for a known reason, one per
/// line: `engine case  why`. They are left out of the pass lists and of the round-trip check.
fn known_issues() -> Vec<(String, String)> {
    let path = xpu_tests::repo_root().join("tests/conformance/engine-known-issues.txt");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .collect()
}

/// One engine through xpu both ways: (a) each case's model straight to the engine, (b)
/// import → SGR-ML → export → the engine. Returns (direct, round trip, cases the round trip
/// loses), after checking: no crash, no regression against the pass lists, ≥ 1,300 direct
/// passes, and every case (a) passes that (b) does not is one the importer does not take.
fn engine_suite(
    engine: &str,
    direct: &xpu_tests::conformance::DirectPrepare<'_>,
    imported: &dyn xpu_engine::Engine,
) -> (Vec<xpu_tests::conformance::CaseResult>, Vec<xpu_tests::conformance::CaseResult>, usize) {
    let dir = cache_dir();
    let (_, mut d) = run_all(&dir, None, &Route::Direct(direct)).unwrap();
    let (_, mut r) =
        run_all(&dir, None, &Route::Import(imported, xpu_engine::Assignment::new(engine))).unwrap();
    let known: Vec<String> =
        known_issues().into_iter().filter(|(e, _)| e == engine).map(|(_, c)| c).collect();
    for res in d.iter_mut().chain(r.iter_mut()) {
        if known.contains(&res.name) {
            res.status = Status::Error;
            res.detail = "known issue (tests/conformance/engine-known-issues.txt)".into();
            res.outputs.clear();
        }
    }
    let crashes: Vec<String> = d
        .iter()
        .chain(&r)
        .filter(|c| c.status == Status::Crash)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    assert!(crashes.is_empty(), "{engine}: cases crashed the process:\n{}", crashes.join("\n"));
    let mut regressed = check_expected(&format!("{engine}-expected-pass.txt"), &d);
    regressed.extend(check_expected(&format!("{engine}-roundtrip-expected-pass.txt"), &r));
    assert!(regressed.is_empty(), "previously passing cases regressed:\n{}", regressed.join("\n"));
    let pass = d.iter().filter(|c| c.status == Status::Pass).count();
    assert!(pass >= 1300, "{engine} passes {pass}; the bar is 1,300");
    let lost: Vec<&xpu_tests::conformance::CaseResult> = d
        .iter()
        .zip(&r)
        .filter(|(a, b)| a.status == Status::Pass && b.status != Status::Pass)
        .map(|(_, b)| b)
        .collect();
    let wrong: Vec<String> = lost
        .iter()
        .filter(|c| c.status != Status::Unsupported)
        .map(|c| format!("{}: {} {}", c.name, c.status.name(), c.detail))
        .collect();
    assert!(wrong.is_empty(), "the round trip broke cases {engine} passes:\n{}", wrong.join("\n"));
    let n = lost.len();
    (d, r, n)
}

/// ONNX Runtime and OpenVINO through xpu, each both ways (see [`engine_suite`]), and the
/// differential comparison of every route with every other and with the cpu engine: a
/// disagreement not listed in differential-known.txt fails. Writes
/// `tests/conformance/engines-report.md` on bless.
#[test]
fn ort_and_openvino_engines_node_suite() {
    use xpu_engine::{Assignment, Executable};
    use xpu_tests::conformance::{RouteResults, disagreements, engines_report};
    let dir = cache_dir();
    let ort = xpu_engine_ort::OrtEngine::load(None).without_profiling();
    let ov = xpu_engine_openvino::OpenVinoEngine::load(None).without_profiling();
    for (name, a) in [("ort", ort.availability()), ("openvino", ov.availability())] {
        assert_eq!(
            a,
            xpu_engine::Availability::Available,
            "the {name} engine must load here (`make setup` fetches its libraries into .deps/)"
        );
    }
    let ort_direct = |name: &str, bytes: &[u8]| {
        ort.prepare_model(name, bytes, &Assignment::new("ort"))
            .map(|e| Box::new(e) as Box<dyn Executable>)
    };
    let ov_direct = |name: &str, bytes: &[u8]| {
        ov.prepare_model(name, bytes, &Assignment::new("openvino"))
            .map(|e| Box::new(e) as Box<dyn Executable>)
    };
    let (ort_d, ort_r, ort_lost) = engine_suite("ort", &ort_direct, &ort);
    let (ov_d, ov_r, ov_lost) = engine_suite("openvino", &ov_direct, &ov);
    let cpu = xpu_engine_cpu::CpuEngine::new();
    let (manifest, cpu_results) =
        run_all(&dir, None, &Route::Import(&cpu, Assignment::new("cpu"))).unwrap();
    let pass = |r: &[xpu_tests::conformance::CaseResult]| {
        r.iter().filter(|c| c.status == Status::Pass).count()
    };
    let pct = |lost: usize, of: usize| 100.0 * lost as f64 / of.max(1) as f64;
    let notes = format!(
        "Routes: `ort` and `openvino` hand each model to the engine as it is; their `round trip` imports it into SGR-ML and exports it back to ONNX first; `cpu` imports it and runs xpu's cpu engine. The round trip loses {ort_lost} of the {} cases `ort` passes ({:.1}%) and {ov_lost} of the {} cases `openvino` passes ({:.1}%), each one an op or construct the importer does not take. Cases in engine-known-issues.txt count as errors.",
        pass(&ort_d),
        pct(ort_lost, pass(&ort_d)),
        pass(&ov_d),
        pct(ov_lost, pass(&ov_d)),
    );
    let routes = [
        RouteResults { name: "ort", results: &ort_d },
        RouteResults { name: "ort round trip", results: &ort_r },
        RouteResults { name: "openvino", results: &ov_d },
        RouteResults { name: "openvino round trip", results: &ov_r },
        RouteResults { name: "cpu", results: &cpu_results },
    ];
    let md = engines_report(&manifest, &routes, &notes);
    if xpu_tests::bless() {
        std::fs::write(xpu_tests::repo_root().join("tests/conformance/engines-report.md"), &md)
            .unwrap();
    }
    println!("{notes}");
    for r in &routes {
        println!("{}: {} pass", r.name, pass(r.results));
    }
    let known_path = xpu_tests::repo_root().join("tests/conformance/differential-known.txt");
    let known = std::fs::read_to_string(&known_path).unwrap_or_default();
    let mut new = Vec::new();
    for (i, a) in routes.iter().enumerate() {
        for b in &routes[i + 1..] {
            new.extend(
                disagreements(&manifest, a.results, b.results)
                    .into_iter()
                    .filter(|d| {
                        let case = d.split(':').next().unwrap_or("");
                        !known.lines().any(|l| l.split_whitespace().next() == Some(case))
                    })
                    .map(|d| format!("{} vs {}: {d}", a.name, b.name)),
            );
        }
    }
    assert!(new.is_empty(), "engines disagree on cases both pass:\n{}", new.join("\n"));
}
