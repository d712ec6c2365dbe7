//! ONNX's node suite with the llvm engine first (see `xpu_tests::conformance`): each case is
//! planned under a policy and run by GraphExec on the cpu and llvm engines.
//!
//! - llvm first, cpu for the rest: every case the same planned route passes with the cpu
//!   engine alone still passes — no loss — and the report counts the nodes that ran on llvm.
//! - llvm pinned, fallback denied: every case whose graph llvm takes whole runs on llvm
//!   alone, and its outputs agree with the cpu engine's (differential) and ONNX's.
//!
//! - riscv64: the classes `llvm.riscv` claims pinned to it, fallback denied: every case
//!   that plans runs as riscv64 code under qemu-riscv64 and passes wherever the cpu
//!   engine's planned route passes.
//!
//! `XPU_BLESS=1` rewrites `tests/conformance/onnx-node-report-llvm.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use xpu_engine::{Assignment, Capabilities, Engine, EngineError, Executable, Execution, Registry};
use xpu_ir::{Graph, Tensor};
use xpu_plan::GraphExec;
use xpu_policy::Policy;
use xpu_tests::conformance::{Route, Status, cache_dir, compare, run_all};

fn policy(order: &str, fallback: &str) -> Policy {
    policy_with(order, fallback, "")
}

fn policy_with(order: &str, fallback: &str, extra: &str) -> Policy {
    let text = format!(
        "[policy]\nname = \"conformance\"\nversion = 1\n[engines]\norder = {order}\nfallback = \"{fallback}\"\n{extra}"
    );
    xpu_policy::Loader::new().load_text("conformance policy", None, &text).unwrap()
}

/// An "engine" that plans each case's graph under a policy and runs it with GraphExec, so
/// the conformance harness can drive a whole multi-engine run.
struct Planned {
    registry: Registry,
    policy: Policy,
    /// Nodes placed on llvm, over every case that planned.
    on_llvm: Arc<AtomicUsize>,
    /// Cases with at least one node on llvm.
    cases_on_llvm: Arc<Mutex<BTreeSet<String>>>,
}

impl Engine for Planned {
    fn name(&self) -> &str {
        "planned"
    }
    fn version(&self) -> String {
        String::new()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::absent("planned", xpu_engine::Availability::Available)
    }
    fn prepare(&self, g: &Graph, _: &Assignment) -> Result<Box<dyn Executable>, EngineError> {
        let inventory = self.registry.inventory_for(g);
        let bindings = Default::default();
        let (plan, _) =
            xpu_runtime::plan_graph(g, &self.policy, &inventory, &bindings).map_err(|f| {
                EngineError::Unsupported {
                    engine: "planned".into(),
                    node: g.name.clone(),
                    what: f.to_string(),
                }
            })?;
        let llvm: usize =
            plan.partitions.iter().filter(|p| p.engine == "llvm").map(|p| p.nodes.len()).sum();
        self.on_llvm.fetch_add(llvm, Ordering::Relaxed);
        if llvm > 0 {
            self.cases_on_llvm.lock().unwrap().insert(g.name.clone());
        }
        let exec = GraphExec::new(Arc::new(plan), &self.registry)
            .map_err(|e| EngineError::Other(e.to_string()))?;
        Ok(Box::new(PlannedRun { exec }))
    }
}

struct PlannedRun {
    exec: GraphExec,
}

impl Executable for PlannedRun {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        let record = self.exec.run(inputs).map_err(|e| EngineError::Other(e.to_string()))?;
        Ok(Execution { outputs: record.outputs, timings: Vec::new(), facts: Vec::new() })
    }
}

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    r.register(Arc::new(xpu_engine_llvm::LlvmEngine::new(None)));
    r
}

fn planned(order: &str, fallback: &str) -> Planned {
    planned_with(policy(order, fallback))
}

fn planned_with(policy: Policy) -> Planned {
    Planned {
        registry: registry(),
        policy,
        on_llvm: Arc::new(AtomicUsize::new(0)),
        cases_on_llvm: Arc::new(Mutex::new(BTreeSet::new())),
    }
}

/// The baseline both tests hold llvm to: the same planned route with the cpu engine alone,
/// run once per process — each passing case's outputs by name.
fn cpu_baseline() -> &'static BTreeMap<String, Vec<Vec<Tensor>>> {
    static BASELINE: OnceLock<BTreeMap<String, Vec<Vec<Tensor>>>> = OnceLock::new();
    BASELINE.get_or_init(|| {
        let cpu_only = planned("[\"cpu\"]", "deny");
        let route = Route::Import(&cpu_only, Assignment::new("planned"));
        let (_, results) = run_all(&cache_dir(), None, &route).unwrap_or_else(|e| panic!("{e}"));
        results
            .into_iter()
            .filter(|r| r.status == Status::Pass)
            .map(|r| (r.name, r.outputs))
            .collect()
    })
}

#[test]
fn onnx_node_suite_with_llvm_first_loses_nothing() {
    let dir = cache_dir();
    let root = xpu_tests::repo_root().join("tests/conformance");
    let baseline = cpu_baseline();
    let expected: BTreeSet<&str> = baseline.keys().map(String::as_str).collect();
    assert!(expected.len() >= 1000, "only {} cases pass on the planned cpu route", expected.len());

    let first = planned("[\"llvm\", \"cpu\"]", "allow");
    let route = Route::Import(&first, Assignment::new("planned"));
    let (manifest, results) = run_all(&dir, None, &route).unwrap_or_else(|e| panic!("{e}"));
    let crashes: Vec<String> = results
        .iter()
        .filter(|r| r.status == Status::Crash)
        .map(|r| format!("{}: {}", r.name, r.detail))
        .collect();
    assert!(crashes.is_empty(), "cases crashed:\n{}", crashes.join("\n"));
    let lost: Vec<String> = results
        .iter()
        .filter(|r| expected.contains(r.name.as_str()) && r.status != Status::Pass)
        .map(|r| format!("{}: {} {}", r.name, r.status.name(), r.detail))
        .collect();
    let on_llvm = first.cases_on_llvm.lock().unwrap().clone();
    let passing_on_llvm =
        results.iter().filter(|r| r.status == Status::Pass && on_llvm.contains(&r.name)).count();

    // llvm pinned, no fallback: the cases llvm takes whole, against the cpu engine.
    let pinned = planned("[\"llvm\"]", "deny");
    let route = Route::Import(&pinned, Assignment::new("planned"));
    let (_, alone) = run_all(&dir, None, &route).unwrap_or_else(|e| panic!("{e}"));
    let mut differential = Vec::new();
    let mut alone_pass = 0;
    for r in alone.iter().filter(|r| r.status != Status::Unsupported) {
        if r.status == Status::Pass {
            alone_pass += 1;
        }
        if expected.contains(r.name.as_str()) && r.status != Status::Pass {
            differential.push(format!("{}: {} {}", r.name, r.status.name(), r.detail));
            continue;
        }
        if r.status != Status::Pass {
            continue;
        }
        let Some(reference) = baseline.get(&r.name) else { continue };
        for (ds, (a, b)) in r.outputs.iter().zip(reference).enumerate() {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                if let Err(m) = compare(x, y, 1e-5, 1e-6) {
                    differential
                        .push(format!("{} data set {ds} output {i}: llvm vs cpu: {m}", r.name));
                }
            }
        }
    }
    let md = format!(
        "# llvm engine conformance\n\nONNX's node suite ({} cases) planned with llvm first and cpu for the rest, run by GraphExec.\n\n\
         | | cases |\n|---|---|\n| pass, cpu alone (baseline) | {} |\n| pass (llvm first, cpu for the rest) | {} |\n| of which ran nodes on llvm | {} |\n| nodes placed on llvm | {} |\n\
         | cases llvm runs whole (llvm pinned, fallback denied) | {} |\n| of which pass | {} |\n| cpu-passing cases lost with llvm first | {} |\n",
        manifest.cases.len(),
        expected.len(),
        results.iter().filter(|r| r.status == Status::Pass).count(),
        passing_on_llvm,
        first.on_llvm.load(Ordering::Relaxed),
        alone.iter().filter(|r| r.status != Status::Unsupported).count(),
        alone_pass,
        lost.len(),
    );
    println!("{md}");
    if xpu_tests::bless() {
        std::fs::write(root.join("onnx-node-report-llvm.md"), &md).unwrap();
    }
    assert!(
        lost.is_empty(),
        "{} cases the cpu engine passes fail with llvm first:\n{}",
        lost.len(),
        lost.join("\n")
    );
    assert!(differential.is_empty(), "llvm alone disagrees:\n{}", differential.join("\n"));
    assert!(passing_on_llvm >= 100, "only {passing_on_llvm} passing cases ran anything on llvm");
}

/// The classes `llvm.riscv` claims, pinned to it: every case that plans (all its nodes on
/// the riscv64 device) runs under qemu-riscv64 and passes where the cpu route passes.
#[test]
fn riscv64_subset_under_qemu() {
    let dir = cache_dir();
    let baseline = cpu_baseline();
    let pins = [
        "unary",
        "activation",
        "binary",
        "compare",
        "logical",
        "bitwise",
        "select",
        "reduction",
        "softmax",
        "matmul",
    ]
    .iter()
    .map(|c| format!("{c} = \"llvm.riscv\"\n"))
    .collect::<String>();
    let riscv = planned_with(policy_with("[\"llvm\"]", "deny", &format!("[kernels]\n{pins}")));
    let route = Route::Import(&riscv, Assignment::new("planned"));
    let (_, results) = run_all(&dir, None, &route).unwrap_or_else(|e| panic!("{e}"));
    let ran: Vec<_> = results.iter().filter(|r| r.status != Status::Unsupported).collect();
    let failed: Vec<String> = ran
        .iter()
        .filter(|r| baseline.contains_key(&r.name) && r.status != Status::Pass)
        .map(|r| format!("{}: {} {}", r.name, r.status.name(), r.detail))
        .collect();
    let passed = ran.iter().filter(|r| r.status == Status::Pass).count();
    let md = format!(
        "# llvm.riscv conformance under qemu-riscv64\n\nONNX's node suite with the classes `llvm.riscv` claims ({}) pinned to it and fallback denied: each case that plans runs as a riscv64 build under qemu-riscv64.\n\n| | cases |\n|---|---|\n| planned on riscv64:0 | {} |\n| pass | {passed} |\n| fail where the cpu route passes | {} |\n",
        pins.lines().map(|l| l.split(' ').next().unwrap_or("")).collect::<Vec<_>>().join(", "),
        ran.len(),
        failed.len()
    );
    println!("{md}");
    if xpu_tests::bless() {
        let root = xpu_tests::repo_root().join("tests/conformance");
        std::fs::write(root.join("onnx-node-report-llvm-riscv64.md"), &md).unwrap();
    }
    assert!(failed.is_empty(), "{} cases fail on riscv64:\n{}", failed.len(), failed.join("\n"));
    assert!(passed >= 150, "only {passed} cases ran on riscv64");
}
