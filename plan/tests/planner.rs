//! PlannerTester: each case forces one candidate path — a policy fragment and an inventory
//! in, and the decision for one node out, rendered as one line:
//! `engine kernel precision | by RULE | fallback FROM CODE | rejected engine/kernel:CODE …`.

use std::collections::BTreeMap;

use xpu_engine::Inventory;
use xpu_ir::Graph;
use xpu_plan::{Decision, ReasonCode};
use xpu_policy::{Loader, Policy};

const GRAPH: &str = r#"graph "t" {
  %0: f32[4,8] = input "x"
  %1: f32[8,8] = input "w"
  %2: f32[4,8] = matmul(%0, %1) @name("fc")
  %3: f32[4,8] = add(%2, %0) @name("fc.bias")
  %4: f32[4,8] = softmax(%3) {axis = -1} @name("probs")
  return "y" = %4
}"#;

/// Two engines: `cuda` (a GPU with matmul kernels and fused elementwise) and `cpu`.
const INVENTORY: &str = r#"
name = "test-box"
[[engines]]
engine = "cuda"
version = "1"
availability = { status = "available" }
devices = [{ id = "cuda:0", memory_bytes = 1000000 }]
kernels = [
  { name = "cuda.cublaslt", ops = ["matmul"], dtypes = ["f16", "bf16"] },
  { name = "cuda.cublas", ops = ["matmul"], dtypes = ["f32", "f16", "bf16"] },
  { name = "cuda.fused", classes = ["binary", "softmax"], dtypes = ["f32", "f16", "bf16"] },
]
[[engines]]
engine = "cpu"
version = "1"
availability = { status = "available" }
devices = [{ id = "host" }]
kernels = [
  { name = "cpu.blas", ops = ["matmul"], dtypes = ["f32", "f64"] },
  { name = "cpu.naive", classes = ["matmul", "binary", "softmax", "constant", "select"], dtypes = ["f32", "f64", "f16", "bf16"] },
]
"#;

fn policy(fragment: &str) -> Policy {
    Loader::new()
        .load_text("t.toml", None, &format!("[policy]\nname = \"t\"\n{fragment}"))
        .unwrap_or_else(|e| panic!("test policy does not load: {e}"))
}

fn render(d: &Decision) -> String {
    let mut s = match &d.chosen {
        Some(c) => format!("{} {} {}", c.engine, c.kernel, c.precision.map_or("-", |p| p.name())),
        None => "UNPLACED".into(),
    };
    if let Some(r) = &d.rule {
        s.push_str(&format!(" | by {}", r.key));
    }
    if let Some(f) = &d.fallback {
        s.push_str(&format!(" | fallback {} {}", f.from, f.code.name()));
    }
    if !d.rejected.is_empty() {
        s.push_str(" | rejected");
        for r in d.rejected.iter() {
            s.push_str(&format!(" {}:{}", r.kernel.as_deref().unwrap_or(&r.engine), r.code.name()));
        }
    }
    s
}

/// Each partition as `engine@device:node count`.
fn partition_summary(plan: &xpu_plan::CapturePlan) -> Vec<String> {
    plan.partitions.iter().map(|p| format!("{}@{}:{}", p.engine, p.device, p.nodes.len())).collect()
}

/// Plans GRAPH under `fragment` with `inventory` and compares node `name`'s decision.
fn check_with(graph: &str, inventory: &str, fragment: &str, name: &str, expect: &str) {
    let g = xpu_ir::text::parse(graph).unwrap();
    let inv = Inventory::from_toml(inventory).unwrap();
    let p = policy(fragment);
    let ex = match xpu_plan::plan(&g, &p, &inv) {
        Ok((_, ex)) => ex,
        Err(f) => *f.explanation,
    };
    let d = ex.decisions.iter().find(|d| d.name.as_deref() == Some(name)).expect("node exists");
    assert_eq!(render(d), expect, "policy:\n{fragment}");
}

fn check(fragment: &str, name: &str, expect: &str) {
    check_with(GRAPH, INVENTORY, fragment, name, expect)
}

#[test]
fn engine_order_decides_then_kernel_order() {
    check(
        "",
        "fc",
        "cuda cuda.cublas fp32 | by inventory order | rejected cuda.cublaslt:DtypeUnsupported cpu.blas:Outranked cpu.naive:Outranked",
    );
    check(
        "[engines]\norder = [\"cpu\", \"cuda\"]\n",
        "fc",
        "cpu cpu.blas fp32 | by engines.order[0] | rejected cpu.naive:Outranked cuda.cublaslt:DtypeUnsupported cuda.cublas:Outranked",
    );
}

#[test]
fn denied_and_unlisted_engines() {
    check(
        "[engines]\ndeny = [\"cuda\"]\n",
        "fc.bias",
        "cpu cpu.naive fp32 | by inventory order | rejected cuda:PolicyDenied",
    );
    check(
        "[engines]\norder = [\"cpu\"]\n",
        "fc.bias",
        "cpu cpu.naive fp32 | by engines.order[0] | rejected cuda:NotInOrder",
    );
}

#[test]
fn unavailable_engines_fall_back_with_a_reason() {
    let inv = INVENTORY.replacen(
        "availability = { status = \"available\" }",
        "availability = { status = \"unavailable\", reason = \"driver missing\" }",
        1,
    );
    check_with(
        GRAPH,
        &inv,
        "[engines]\norder = [\"cuda\", \"cpu\"]\n",
        "fc",
        "cpu cpu.blas fp32 | by engines.fallback | fallback cuda EngineUnavailable | rejected cuda:EngineUnavailable cpu.naive:Outranked",
    );
    check(
        "[engines]\norder = [\"ort\", \"cpu\"]\n",
        "fc.bias",
        "cpu cpu.naive fp32 | by engines.fallback | fallback ort EngineUnavailable | rejected ort:EngineUnavailable cuda:NotInOrder",
    );
}

#[test]
fn fallback_deny_fails_the_node() {
    check(
        "[engines]\norder = [\"ort\", \"cpu\"]\nfallback = \"deny\"\n",
        "fc.bias",
        "UNPLACED | rejected ort:EngineUnavailable cpu.naive:FallbackDenied cuda:NotInOrder",
    );
}

#[test]
fn ops_an_engine_cannot_run() {
    let g = GRAPH.replace("softmax(%3) {axis = -1}", "where(%5, %3, %0)").replace(
        "  %4: f32[4,8] = where",
        "  %5: bool[4,8] = greater(%3, %0)\n  %4: f32[4,8] = where",
    );
    let g = g
        .replace(
            "%5: bool[4,8] = greater(%3, %0)\n  %4: f32[4,8] = where(%5, %3, %0)",
            "%4: bool[4,8] = greater(%3, %0)\n  %5: f32[4,8] = where(%4, %3, %0) @name(\"probs\")",
        )
        .replace("return \"y\" = %4", "return \"y\" = %5")
        .replace(" {axis = -1} @name(\"probs\")", "");
    check_with(
        &g,
        INVENTORY,
        "",
        "probs",
        "cpu cpu.naive fp32 | by engines.fallback | fallback cuda OpUnsupported | rejected cuda:OpUnsupported",
    );
}

#[test]
fn pinned_kernels() {
    check(
        "[kernels]\nmatmul = \"cpu.blas\"\n",
        "fc",
        "cpu cpu.blas fp32 | by kernels.matmul | rejected cpu.naive:KernelNotPinned cuda:KernelNotPinned",
    );
    check(
        "[kernels]\nmatmul = \"cuda.cublaslt\"\n",
        "fc",
        "UNPLACED | rejected cuda.cublaslt:DtypeUnsupported cuda.cublas:KernelNotPinned cpu:KernelNotPinned",
    );
    check(
        "[kernels]\nmatmul = \"cpu.gemm\"\n",
        "fc",
        "UNPLACED | rejected cpu.gemm:KernelUnavailable cuda:KernelNotPinned",
    );
    check(
        "[kernels]\nmatmul = [\"cpu.naive\", \"cpu.blas\"]\n[engines]\norder = [\"cpu\"]\n",
        "fc",
        "cpu cpu.naive fp32 | by engines.order[0] + kernels.matmul[0] | rejected cpu.blas:Outranked cuda:NotInOrder",
    );
}

#[test]
fn a_degraded_kernel_goes_last_unless_the_policy_names_it() {
    // cpu.blas over a BLAS that does not know the CPU: listed first by the engine, but
    // degraded, so the planner takes cpu.naive and says why; a pin or a preference still
    // gets cpu.blas, and an earlier engine's pick is not blamed on the degradation.
    let inv = INVENTORY.replace(
        r#"{ name = "cpu.blas", ops = ["matmul"], dtypes = ["f32", "f64"] },"#,
        r#"{ name = "cpu.blas", ops = ["matmul"], dtypes = ["f32", "f64"], degraded = "OpenBLAS 0.3.21 runs its Prescott kernel" },"#,
    );
    assert_ne!(inv, INVENTORY);
    let cpu_first = "[engines]\norder = [\"cpu\", \"cuda\"]\n";
    check_with(
        GRAPH,
        &inv,
        cpu_first,
        "fc",
        "cpu cpu.naive fp32 | by engines.order[0] | rejected cpu.blas:KernelDegraded cuda.cublaslt:DtypeUnsupported cuda.cublas:Outranked",
    );
    check_with(
        GRAPH,
        &inv,
        &format!("{cpu_first}[kernels]\nmatmul = \"cpu.blas\"\n"),
        "fc",
        "cpu cpu.blas fp32 | by kernels.matmul | rejected cpu.naive:KernelNotPinned cuda:KernelNotPinned",
    );
    check_with(
        GRAPH,
        &inv,
        &format!("{cpu_first}[kernels]\nmatmul = [\"cpu.blas\", \"cpu.naive\"]\n"),
        "fc",
        "cpu cpu.blas fp32 | by engines.order[0] + kernels.matmul[0] | rejected cpu.naive:Outranked cuda.cublaslt:DtypeUnsupported cuda.cublas:Outranked",
    );
    check_with(
        GRAPH,
        &inv,
        "",
        "fc",
        "cuda cuda.cublas fp32 | by inventory order | rejected cuda.cublaslt:DtypeUnsupported cpu.naive:Outranked cpu.blas:Outranked",
    );
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let (_, ex) = xpu_plan::plan(&g, &policy(cpu_first), &Inventory::from_toml(&inv).unwrap())
        .unwrap_or_else(|f| panic!("{f}"));
    let fc = ex.decisions.iter().find(|d| d.name.as_deref() == Some("fc")).unwrap();
    let why = fc.rejected.iter().find(|r| r.code == ReasonCode::KernelDegraded).unwrap();
    assert!(why.detail.contains("Prescott") && why.detail.contains("cpu.naive runs instead"));
}

#[test]
fn class_pins_cover_only_the_ops_their_kernel_runs() {
    // `binary` pinned to cuda.fused, whose entry runs add (a binary op) but not pow.
    let inv =
        INVENTORY.replace("classes = [\"binary\", \"softmax\"]", "ops = [\"add\", \"softmax\"]");
    let g = GRAPH
        .replace("add(%2, %0)", "pow(%2, %0)")
        .replace("@name(\"fc.bias\")", "@name(\"fc.pow\")");
    check_with(
        &g,
        &inv,
        "[kernels]\nbinary = \"cuda.fused\"\n",
        "fc.pow",
        "cpu cpu.naive fp32 | by engines.fallback | fallback cuda OpUnsupported | rejected cuda:OpUnsupported",
    );
    check_with(
        GRAPH,
        &inv,
        "[kernels]\nbinary = \"cpu.naive\"\n",
        "fc.bias",
        "cpu cpu.naive fp32 | by kernels.binary | rejected cuda:KernelNotPinned",
    );
    // By op name the pin is strict.
    check_with(
        &g,
        &inv,
        "[kernels]\npow = \"cuda.fused\"\n",
        "fc.pow",
        "UNPLACED | rejected cuda:OpUnsupported cpu:KernelNotPinned",
    );
}

#[test]
fn precision_choices() {
    check(
        "[precision]\ndefault = \"bf16\"\n",
        "fc",
        "cuda cuda.cublaslt bf16 | by inventory order | rejected cuda.cublas:Outranked cpu.blas:DtypeUnsupported cpu.naive:Outranked",
    );
    check(
        "[precision]\ndefault = \"bf16\"\nkeep_fp32 = [\"softmax\"]\n",
        "probs",
        "cuda cuda.fused fp32 | by inventory order | rejected cpu.naive:Outranked",
    );
    let f64_graph = GRAPH.replace("f32", "f64");
    check_with(
        &f64_graph,
        INVENTORY,
        "[precision]\nallow = [\"fp32\"]\n",
        "fc.bias",
        "UNPLACED | rejected cuda.fused:PrecisionNotAllowed cpu.naive:PrecisionNotAllowed",
    );
}

#[test]
fn a_kernel_without_the_default_precision_runs_the_next_allowed_one() {
    // Under default bf16 cpu.naive takes matmul at bf16: an engine that runs the target
    // precision wins over changing the precision.
    check(
        "[engines]\norder = [\"cpu\"]\n[precision]\ndefault = \"bf16\"\n",
        "fc",
        "cpu cpu.naive bf16 | by engines.order[0] | rejected cpu.blas:DtypeUnsupported cuda:NotInOrder",
    );
    // Pinned to cpu.blas (f32/f64 only), nothing runs bf16: the narrowest allowed precision at
    // least as wide (fp32) is the candidate, recorded.
    let pinned = "[engines]\norder = [\"cpu\"]\n[kernels]\nmatmul = \"cpu.blas\"\n[precision]\ndefault = \"bf16\"\n";
    check(
        pinned,
        "fc",
        "cpu cpu.blas fp32 | by kernels.matmul | rejected cpu.blas:DtypeUnsupported cpu.naive:KernelNotPinned cuda:NotInOrder",
    );
    // Never narrower, and rule precisions are strict.
    check(
        "[engines]\norder = [\"cpu\"]\n[kernels]\nmatmul = \"cpu.blas\"\n[precision]\ndefault = \"bf16\"\nallow = [\"bf16\", \"fp16\"]\n",
        "fc",
        "UNPLACED | rejected cpu.blas:DtypeUnsupported cpu.naive:KernelNotPinned cuda:NotInOrder",
    );
    check(
        "[engines]\norder = [\"cpu\"]\n[kernels]\nmatmul = \"cpu.blas\"\n[[rule]]\nwhen = { op = \"matmul\" }\nprecision = \"bf16\"\n",
        "fc",
        "UNPLACED | rejected cpu.blas:DtypeUnsupported cpu.naive:KernelNotPinned cuda:NotInOrder",
    );
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let inv = Inventory::from_toml(INVENTORY).unwrap();
    let (plan, ex) = xpu_plan::plan(&g, &policy(pinned), &inv).unwrap();
    let d = &ex.decisions[0];
    assert_eq!(
        d.precision_from.as_ref().map(|r| &*r.key),
        Some("precision.allow (cpu.blas lacks bf16, runs fp32)")
    );
    let mm = plan.placements.iter().find(|p| p.op == "matmul").unwrap();
    assert_eq!(
        plan.graph.ty(plan.graph.node(mm.node).outputs[0]).dtype,
        xpu_ir::DType::F32,
        "the graph follows the chosen precision"
    );
    xpu_ir::verify(&plan.graph).unwrap();
}

#[test]
fn rules_override_engine_kernel_and_precision() {
    check(
        "[engines]\norder = [\"cpu\", \"cuda\"]\n[[rule]]\nname = \"gpu matmul\"\nwhen = { op = \"matmul\", min_flops = 100 }\nengine = \"cuda\"\nprecision = \"fp16\"\n",
        "fc",
        "cuda cuda.cublaslt fp16 | by rule[0] \"gpu matmul\" | rejected cuda.cublas:Outranked cpu:RuleOverride",
    );
    // Too few FLOPs: the rule does not match (4·8·8·2 = 512).
    check(
        "[engines]\norder = [\"cpu\", \"cuda\"]\n[[rule]]\nwhen = { op = \"matmul\", min_flops = 1e6 }\nengine = \"cuda\"\n",
        "fc",
        "cpu cpu.blas fp32 | by engines.order[0] | rejected cpu.naive:Outranked cuda.cublaslt:DtypeUnsupported cuda.cublas:Outranked",
    );
    check(
        "[[rule]]\nwhen = { node = \"fc.*\" }\nengine = \"cpu\"\n",
        "fc.bias",
        "cpu cpu.naive fp32 | by rule[0] | rejected cuda:RuleOverride",
    );
}

#[test]
fn bitwise_determinism_rejects_nondeterministic_kernels() {
    let inv = INVENTORY.replace(
        "{ name = \"cuda.cublas\", ops = [\"matmul\"], dtypes = [\"f32\", \"f16\", \"bf16\"] }",
        "{ name = \"cuda.cublas\", ops = [\"matmul\"], dtypes = [\"f32\", \"f16\", \"bf16\"], deterministic = false }",
    );
    check_with(
        GRAPH,
        &inv,
        "",
        "fc",
        "cuda cuda.cublas fp32 | by inventory order | rejected cuda.cublaslt:DtypeUnsupported cpu.blas:Outranked cpu.naive:Outranked",
    );
    check_with(
        GRAPH,
        &inv,
        "[execution]\ndeterminism = \"bitwise\"\n",
        "fc",
        "cpu cpu.blas fp32 | by engines.fallback | fallback cuda DtypeUnsupported | rejected cuda.cublaslt:DtypeUnsupported cuda.cublas:NotDeterministic cpu.naive:Outranked",
    );
}

#[test]
fn device_memory() {
    let big = GRAPH.replace("[4,8]", "[16384,8]");
    check_with(
        &big,
        INVENTORY,
        "",
        "fc.bias",
        "cpu cpu.naive fp32 | by engines.fallback | fallback cuda MemoryLimitExceeded | rejected cuda.fused:MemoryLimitExceeded",
    );
}

#[test]
fn plan_level_failures() {
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let inv = Inventory::from_toml(INVENTORY).unwrap();
    let err = xpu_plan::plan(&g, &policy("[memory]\nlimit = 100\n"), &inv).unwrap_err();
    assert_eq!(err.errors[0].code, ReasonCode::MemoryLimitExceeded);
    assert!(err.errors[0].message.contains("memory.limit is 100B"), "{}", err.errors[0].message);
    assert_eq!(err.errors[0].at.as_deref(), Some("t.toml:4"));
    let p =
        policy("[engines]\norder = [\"ort\", \"cpu\"]\nfallback_budget = { max_nodes_pct = 50 }\n");
    let err = xpu_plan::plan(&g, &p, &inv).unwrap_err();
    assert_eq!(err.errors[0].code, ReasonCode::FallbackBudgetExceeded);
    assert!(err.errors[0].message.contains("3 of 3 nodes"), "{}", err.errors[0].message);
    let p = policy(
        "[engines]\norder = [\"ort\", \"cpu\"]\nfallback_budget = { max_flops_pct = 10, on_exceeded = \"warn\" }\n",
    );
    let (_, ex) = xpu_plan::plan(&g, &p, &inv).unwrap();
    assert_eq!(ex.warnings[0].code, ReasonCode::FallbackBudgetExceeded);
    let err =
        xpu_plan::plan(&g, &policy("[kernels]\nmatmul = \"cuda.cublaslt\"\n"), &inv).unwrap_err();
    assert_eq!(err.errors[0].code, ReasonCode::Unplaceable);
    assert!(err.errors[0].message.contains("n0 (matmul \"fc\")"), "{}", err.errors[0].message);
}

#[test]
fn partitions_transfers_and_casts() {
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let inv = Inventory::from_toml(INVENTORY).unwrap();
    // matmul on cuda (bf16), the rest on cpu: two partitions, a cast and transfers.
    let p = policy(
        "[engines]\norder = [\"cpu\", \"cuda\"]\n[precision]\ndefault = \"bf16\"\nkeep_fp32 = [\"binary\", \"softmax\"]\n[[rule]]\nwhen = { op = \"matmul\" }\nengine = \"cuda\"\n",
    );
    let (plan, ex) = xpu_plan::plan(&g, &p, &inv).unwrap();
    xpu_ir::verify(&plan.graph).expect("the planned graph verifies");
    let parts = partition_summary(&plan);
    assert_eq!(
        parts,
        vec!["cuda@cuda:0:3", "cpu@host:3"],
        "casts x,w→bf16 + matmul on cuda; cast back + add + softmax on cpu"
    );
    let casts: Vec<String> = ex.casts.iter().map(|c| format!("{}->{}", c.from, c.to)).collect();
    assert_eq!(casts, vec!["f32->bf16", "f32->bf16", "bf16->f32"]);
    let transfers: Vec<String> =
        ex.transfers.iter().map(|t| format!("{} {} {:?}", t.value, t.direction, t.bytes)).collect();
    assert_eq!(transfers, vec!["%0 h2d Some(128)", "%1 h2d Some(256)", "%4 d2h Some(64)"]);
    assert_eq!(plan.graph.outputs[0].name, "y");
    assert_eq!(plan.graph.ty(plan.graph.outputs[0].value).dtype, xpu_ir::DType::F32);
}

/// The inventory a live ONNX Runtime with the CUDA provider reports (`xpuctl engines
/// --format toml` on a GPU machine): ort lists the host and `cuda:0`, its kernels `ort.cuda`
/// and `ort.cpu`.
const LIVE_ORT_WITH_CUDA: &str = r#"
name = "live"
[[engines]]
engine = "ort"
version = "1.31.1"
availability = { status = "available" }
devices = [{ id = "host" }, { id = "cuda:0" }]
kernels = [
  { name = "ort.cpu", classes = ["matmul", "binary", "softmax", "constant"], dtypes = ["f32"] },
  { name = "ort.cuda", classes = ["matmul", "binary", "softmax", "constant"], dtypes = ["f32"], deterministic = false },
]
"#;

#[test]
fn live_ort_cuda_nodes_land_on_the_gpu_with_their_transfers() {
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let inv = Inventory::from_toml(LIVE_ORT_WITH_CUDA).unwrap();
    assert!(inv.notes.is_empty(), "{:?}", inv.notes);
    let p = policy("[kernels]\nmatmul = \"ort.cuda\"\n");
    let (plan, ex) = xpu_plan::plan(&g, &p, &inv).unwrap();
    let parts = partition_summary(&plan);
    assert_eq!(parts, vec!["ort@cuda:0:1", "ort@host:2"]);
    let fc = &plan.placements[0];
    assert_eq!((&*fc.kernel, fc.device.to_string().as_str()), ("ort.cuda", "cuda:0"));
    assert_eq!(plan.partitions[0].assignment.device, fc.device);
    let transfers: Vec<String> = ex
        .transfers
        .iter()
        .map(|t| format!("{} {}->{} {}", t.value, t.from_device, t.to_device, t.direction))
        .collect();
    assert_eq!(
        transfers,
        vec!["%0 host->cuda:0 h2d", "%1 host->cuda:0 h2d", "%2 cuda:0->host d2h"]
    );
}

/// Inventories written before device ids (`name` + free `kind`) load, plan the same, and
/// say what to write instead; an unknown kind or a mix of both forms is refused by name.
#[test]
fn old_device_forms_load_with_an_upgrade_note() {
    let old = INVENTORY
        .replace(
            r#"{ id = "cuda:0", memory_bytes"#,
            r#"{ name = "cuda:0", kind = "gpu", memory_bytes"#,
        )
        .replace(r#"{ id = "host" }"#, r#"{ name = "host", kind = "cpu" }"#);
    assert_ne!(old, INVENTORY);
    let (old_inv, new_inv) =
        (Inventory::from_toml(&old).unwrap(), Inventory::from_toml(INVENTORY).unwrap());
    assert_eq!(old_inv.engines, new_inv.engines);
    assert_eq!(old_inv.notes.len(), 2, "{:?}", old_inv.notes);
    assert!(old_inv.notes[0].contains(r#"write `id = "cuda:0"`"#), "{}", old_inv.notes[0]);
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let p = policy("");
    assert_eq!(
        xpu_plan::plan(&g, &p, &old_inv).unwrap().0.to_json(),
        xpu_plan::plan(&g, &p, &new_inv).unwrap().0.to_json()
    );
    for (bad, says) in [
        (r#"{ name = "t", kind = "tpu" }"#, "unknown kind \"tpu\""),
        (r#"{ id = "cuda:0", kind = "gpu" }"#, "not both"),
        (r#"{ id = "cuda" }"#, "say which cuda"),
        (r#"{ memory_bytes = 1 }"#, "needs `id`"),
    ] {
        let text = INVENTORY.replace(r#"{ id = "host" }"#, bad);
        let err = Inventory::from_toml(&text).unwrap_err();
        assert!(err.to_string().contains(says), "{bad}: {err}");
        assert!(err.location.is_some(), "{bad}: {err}");
    }
}

/// A kernel the catalogue places on a device kind its engine does not list is not a
/// candidate: it is rejected with the reason, never run on another device.
#[test]
fn a_kernel_whose_device_is_missing_is_rejected() {
    let no_gpu = LIVE_ORT_WITH_CUDA.replace(r#", { id = "cuda:0" }"#, "");
    check_with(
        GRAPH,
        &no_gpu,
        "[kernels]\nmatmul = [\"ort.cuda\", \"ort.cpu\"]\n",
        "fc",
        "ort ort.cpu fp32 | by inventory order + kernels.matmul[1] | rejected ort.cuda:KernelUnavailable",
    );
}

/// `execution.capture` and `memory.reuse` are never silent: an engine that cannot do what
/// they ask gets a recorded decision naming the key, where it is set and what happens
/// instead; an engine that does them (cpu) and settings that ask for nothing record nothing.
#[test]
fn capture_and_reuse_are_recorded_decisions() {
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let ort = Inventory::from_toml(LIVE_ORT_WITH_CUDA).unwrap();
    let p = policy("[engines]\norder = [\"ort\"]\n[execution]\ncapture = \"graph\"\n");
    let (_, ex) = xpu_plan::plan(&g, &p, &ort).unwrap();
    let notes: Vec<(&str, &str)> =
        ex.settings.iter().map(|n| (n.code.name(), n.message.as_str())).collect();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert_eq!(notes[0].0, "CaptureUnsupported");
    assert!(
        notes[0].1.starts_with("execution.capture = graph: on ort, xpu does not enable"),
        "{notes:?}"
    );
    assert_eq!(ex.settings[0].at.as_deref(), Some("t.toml:6"));
    assert_eq!(notes[1].0, "ReuseUnsupported");
    assert!(notes[1].1.starts_with("memory.reuse = in-place: on ort,"), "{notes:?}");
    let text = xpu_plan::render::explanation_text(&ex, false);
    assert!(text.contains("setting CaptureUnsupported: execution.capture = graph"), "{text}");
    // The cpu engine executes the memory plan, pools buffers and replays a capture.
    let inv = Inventory::from_toml(INVENTORY).unwrap();
    let cpu = policy("[engines]\norder = [\"cpu\"]\n[execution]\ncapture = \"graph\"\n");
    let (_, ex) = xpu_plan::plan(&g, &cpu, &inv).unwrap();
    assert!(ex.settings.is_empty(), "{:?}", ex.settings);
    let pinned = policy("[engines]\norder = [\"cpu\"]\n[memory]\npinned_host = true\n");
    let (_, ex) = xpu_plan::plan(&g, &pinned, &inv).unwrap();
    let notes: Vec<(&str, &str)> =
        ex.settings.iter().map(|n| (n.code.name(), n.message.as_str())).collect();
    assert_eq!(
        notes,
        [(
            "SettingUnsupported",
            "memory.pinned_host = true: on cpu, it works in host memory: nothing to pin"
        )]
    );
    let quiet =
        policy("[execution]\ncapture = \"eager\"\n[memory]\nreuse = \"none\"\npool = \"none\"\n");
    let (_, ex) = xpu_plan::plan(&g, &quiet, &ort).unwrap();
    assert!(ex.settings.is_empty(), "{:?}", ex.settings);
}

#[test]
fn every_reason_code_is_exercised_or_documented() {
    // The cases above cover these codes; the test keeps the list honest when codes are added.
    let covered = [
        "PolicyDenied",
        "NotInOrder",
        "RuleOverride",
        "EngineUnavailable",
        "OpUnsupported",
        "KernelNotPinned",
        "KernelUnavailable",
        "PrecisionNotAllowed",
        "DtypeUnsupported",
        "MemoryLimitExceeded",
        "NotDeterministic",
        "Outranked",
        "FallbackDenied",
        "FallbackBudgetExceeded",
        "Unplaceable",
        "CaptureUnsupported",
        "ReuseUnsupported",
        "SettingUnsupported",
        "FusionSplit",
        "KernelDegraded",
        // tests/measured.rs
        "MeasuredSlower",
        "EvidenceMissing",
        "EvidenceThin",
        "EvidenceNotApplicable",
        "Exploring",
    ];
    for c in ReasonCode::ALL {
        assert!(covered.contains(&c.name()), "reason code {} has no planner test", c.name());
    }
    let _: Graph = xpu_ir::text::parse(GRAPH).unwrap();
}

#[test]
fn constant_operands_are_converted_at_plan_time() {
    use std::sync::Arc;
    let src = r#"graph "c" {
  %0: f32[2,2] = input "x"
  %1: f32[2,2] = constant {value = tensor<f32[2,2]> [1.0, 2.0, 3.0, 4.0]}
  %2: f32[2,2] = matmul(%0, %1) @name("mm")
  return "y" = %2
}"#;
    let g = xpu_ir::text::parse(src).unwrap();
    let mut reg = xpu_engine::Registry::new();
    reg.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    let p = policy("[engines]\norder = [\"cpu\"]\n[precision]\ndefault = \"bf16\"\n");
    let (plan, ex) = xpu_plan::plan(&g, &p, &reg.inventory()).unwrap();
    let kinds: Vec<(bool, Option<u32>)> =
        ex.casts.iter().map(|c| (c.folded, c.for_node.map(|n| n.0))).collect();
    assert_eq!(
        kinds,
        vec![(false, Some(1)), (true, Some(1)), (false, None)],
        "x cast at run time, the weight converted now, y cast back"
    );
    let folded = &plan.graph.node(ex.casts[1].node);
    assert_eq!(folded.op, xpu_ir::Op::Constant);
    let x = xpu_ir::Tensor::from_vec(vec![2, 2], vec![1.0f32, 0.0, 0.0, 1.0]).unwrap();
    let run = xpu_plan::GraphExec::new(Arc::new(plan), &reg).unwrap().run(&[x]).unwrap();
    assert_eq!(
        run.outputs[0].to_f64_vec(),
        vec![1.0, 2.0, 3.0, 4.0],
        "identity · W, exact in bf16"
    );
}

/// Folding, duplicates, dead code and one chain of five elementwise nodes.
const PASSES_GRAPH: &str = r#"graph "p" {
  %0: f32[4,8] = input "x"
  %1: f32[8,1] = constant {value = tensor<f32[8,1]> [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]}
  %2: f32[1,8] = transpose(%1) {perm = [1, 0]} @name("foldme")
  %11: f32[1,8] = sub(%2, %2) @name("float_kept")
  %3: f32[4,8] = add(%0, %11) @name("a1")
  %4: f32[4,8] = mul(%3, %0) @name("m1")
  %5: f32[4,8] = sub(%4, %0) @name("s1")
  %6: f32[4,8] = mul(%0, %0) @name("dead")
  %7: f32[4,8] = add(%0, %0) @name("d1")
  %8: f32[4,8] = add(%0, %0) @name("d2")
  %9: f32[4,8] = mul(%5, %7) @name("join")
  %10: f32[4,8] = add(%9, %8) @name("out")
  return "y" = %10
}"#;

fn plan_passes(fragment: &str) -> (xpu_plan::CapturePlan, xpu_plan::Explanation) {
    try_plan_passes(fragment).unwrap()
}

fn try_plan_passes(
    fragment: &str,
) -> Result<(xpu_plan::CapturePlan, xpu_plan::Explanation), xpu_plan::PlanFailure> {
    let g = std::sync::Arc::new(xpu_ir::text::parse(PASSES_GRAPH).unwrap());
    let inv = Inventory::from_toml(INVENTORY).unwrap();
    let eval = xpu_engine_cpu::CpuEvaluator;
    let hash = g.content_hash();
    xpu_plan::plan_shared(&g, &hash, &policy(fragment), &inv, &BTreeMap::new(), Some(&eval))
}

fn planned_names(ex: &xpu_plan::Explanation) -> Vec<&str> {
    ex.decisions.iter().filter_map(|d| d.name.as_deref()).collect()
}

#[test]
fn programs_are_planned_after_the_pass_pipeline() {
    let (plan, ex) = plan_passes("[engines]\norder = [\"cpu\"]\n");
    let passes: Vec<String> = ex
        .passes
        .iter()
        .map(|p| format!("{}: {} ({} -> {})", p.pass, p.summary, p.nodes_before, p.nodes_after))
        .collect();
    assert_eq!(
        passes,
        [
            "canon: no change (11 -> 11)",
            "fold: folded 1 nodes into constants (11 -> 11)",
            "cse: merged 1 duplicate nodes (11 -> 10)",
            "dce: removed 2 unused nodes (10 -> 8)",
            "fuse: 6 nodes in 1 fusion groups (8 -> 8)",
        ]
    );
    assert_eq!(plan.passes, ["canon", "fold", "cse", "dce", "fuse"]);
    // The transpose of a constant is folded (exact anywhere); the float `sub` of constants
    // is not: it runs where the policy places it.
    assert_eq!(planned_names(&ex), ["float_kept", "a1", "m1", "s1", "d1", "join", "out"]);
    // The group runs whole: one engine, one partition.
    assert_eq!(ex.groups.len(), 1);
    let g = &ex.groups[0];
    assert_eq!(g.nodes.len(), 6);
    assert_eq!(g.whole.as_ref().map(|w| (w.0.as_str(), w.2)), Some(("cpu", 0)));
    assert!(g.split.is_none());
    let text = xpu_plan::render::explanation_text(&ex, false);
    assert!(
        text.contains("passes: canon (no change), fold (folded 1 nodes into constants), "),
        "{text}"
    );
    assert!(
        text.contains("fusion group 0 (6 nodes): whole on cpu (cpu.naive), partition 0"),
        "{text}"
    );
}

#[test]
fn a_fusion_group_split_across_engines_is_a_recorded_decision() {
    let (_, ex) = plan_passes(
        "[engines]\norder = [\"cpu\", \"cuda\"]\n[[rule]]\nwhen = { node = \"m1\" }\nengine = \"cuda\"\n",
    );
    let g = &ex.groups[0];
    assert!(g.whole.is_none());
    let (code, detail) = g.split.as_ref().expect("split");
    assert_eq!(*code, ReasonCode::FusionSplit);
    assert!(detail.contains("on cuda.fused (partition 1)"), "{detail}");
    assert!(detail.contains("on cpu.naive (partition 0)"), "{detail}");
    let text = xpu_plan::render::explanation_text(&ex, false);
    assert!(text.contains("fusion group 0 (6 nodes): split (FusionSplit): "), "{text}");
}

#[test]
fn graph_optimization_chooses_the_pipeline() {
    // Unrewritten, the transpose stays and no kernel of this inventory runs it.
    let failed = try_plan_passes("[execution]\ngraph_optimization = \"none\"\n").unwrap_err();
    let ex = &failed.explanation;
    assert!(ex.passes.is_empty() && ex.groups.is_empty());
    assert!(planned_names(ex).contains(&"dead"), "nothing rewritten");
    assert!(failed.errors[0].message.contains("transpose \"foldme\""), "{:?}", failed.errors);
    let (plan, ex) = plan_passes("[execution]\ngraph_optimization = \"basic\"\n");
    assert_eq!(plan.passes, ["canon", "fold", "cse", "dce"]);
    assert!(ex.groups.is_empty(), "basic does not fuse");
    assert!(!planned_names(&ex).contains(&"dead"));
    // Without an evaluator folding is skipped, and says so.
    let g = xpu_ir::text::parse(PASSES_GRAPH).unwrap();
    let failed =
        xpu_plan::plan(&g, &policy(""), &Inventory::from_toml(INVENTORY).unwrap()).unwrap_err();
    let ex = &failed.explanation;
    assert_eq!(ex.passes[1].summary, "skipped: no evaluator in this process");
    assert!(planned_names(ex).contains(&"foldme"));
}
