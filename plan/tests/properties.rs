//! Property tests: random graphs × random policies × a fixed mixed inventory. Whatever the
//! policy, the planner either returns a plan whose graph verifies, places every node exactly
//! once in engine-contiguous partitions and explains every node — or fails with errors
//! and an explanation in which every unplaced node lists why each candidate was rejected.

use proptest::prelude::*;
use xpu_engine::Inventory;
use xpu_ir::{Attrs, DType, Graph, Op, TensorType};
use xpu_policy::Loader;

const INVENTORY: &str = r#"
name = "mixed"
[[engines]]
engine = "cuda"
version = "1"
availability = { status = "available" }
devices = [{ name = "cuda:0", kind = "gpu", memory_bytes = 100000000 }]
kernels = [
  { name = "cuda.cublaslt", ops = ["matmul"], dtypes = ["f16", "bf16"] },
  { name = "cuda.fused", classes = ["unary", "activation", "binary", "softmax", "constant", "select"], dtypes = ["f32", "f16", "bf16"] },
]
[[engines]]
engine = "ort"
version = "1"
availability = { status = "unavailable", reason = "library missing" }
[[engines]]
engine = "cpu"
version = "1"
availability = { status = "available" }
devices = [{ name = "host", kind = "cpu" }]
kernels = [
  { name = "cpu.gemm", ops = ["matmul"], dtypes = ["f32", "f64", "f16", "bf16"] },
  { name = "cpu.naive", classes = ["unary", "activation", "binary", "softmax", "matmul", "constant", "select", "reduction"], dtypes = ["f32", "f64", "f16", "bf16"] },
]
"#;

const OPS: &[Op] =
    &[Op::Relu, Op::Tanh, Op::Exp, Op::Add, Op::Mul, Op::MatMul, Op::Softmax, Op::Sigmoid];

/// A random chain-with-skips graph over f32[8,8] values.
fn graph(ops: &[(usize, usize, usize)]) -> Graph {
    let mut g = Graph::new("random");
    let ty = TensorType::of_shape(DType::F32, &[8, 8]);
    let mut vals = vec![g.add_input("x", ty.clone()), g.add_input("y", ty)];
    for (i, &(op, a, b)) in ops.iter().enumerate() {
        let op = OPS[op % OPS.len()];
        let a = vals[a % vals.len()];
        let b = vals[b % vals.len()];
        let ins: Vec<_> = if op.info().inputs.0 == 2 { vec![a, b] } else { vec![a] };
        let v = g.add_op(op, &ins, Attrs::new()).expect("shapes agree");
        let n = g.producer(v).unwrap();
        g.nodes[n.index()].name = Some(format!("layer{i}.{}", op.name()));
        vals.push(v);
    }
    g.add_output("out", *vals.last().unwrap());
    g
}

fn policy_text(
    order: &[usize],
    deny: usize,
    fallback: bool,
    precision: usize,
    keep: bool,
    rule: Option<usize>,
    pin: usize,
) -> String {
    let engines = ["cuda", "ort", "cpu"];
    let order: Vec<String> = order
        .iter()
        .map(|&i| format!("\"{}\"", engines[i % 3]))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut s = format!("[policy]\nname = \"random\"\n[engines]\norder = [{}]\n", order.join(", "));
    if deny % 4 == 3 && !order.contains(&"\"ort\"".to_string()) {
        s.push_str("deny = [\"ort\"]\n");
    }
    s.push_str(if fallback { "fallback = \"allow\"\n" } else { "fallback = \"deny\"\n" });
    s.push_str("[precision]\n");
    match precision % 4 {
        0 => {}
        1 => s.push_str("default = \"bf16\"\n"),
        2 => s.push_str("default = \"fp16\"\n"),
        _ => s.push_str("default = \"fp32\"\n"),
    }
    if keep {
        s.push_str("keep_fp32 = [\"softmax\", \"activation\"]\n");
    }
    if pin % 3 == 1 && order.contains(&"\"cpu\"".to_string()) {
        s.push_str("[kernels]\nmatmul = \"cpu.gemm\"\n");
    }
    if let Some(r) = rule {
        let (op, engine) = [("matmul", "cuda"), ("add", "cpu"), ("relu", "cuda")][r % 3];
        s.push_str(&format!("[[rule]]\nwhen = {{ op = \"{op}\" }}\nengine = \"{engine}\"\n"));
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn plans_are_complete_valid_and_explained(
        ops in prop::collection::vec((0usize..8, 0usize..64, 0usize..64), 1..24),
        order in prop::collection::vec(0usize..3, 1..4),
        deny in 0usize..4,
        fallback in any::<bool>(),
        precision in 0usize..4,
        keep in any::<bool>(),
        rule in prop::option::of(0usize..3),
        pin in 0usize..3,
    ) {
        let g = graph(&ops);
        let text = policy_text(&order, deny, fallback, precision, keep, rule, pin);
        let Ok(policy) = Loader::new().load_text("random.toml", None, &text) else {
            // Structurally contradictory combinations are rejected before planning.
            return Ok(());
        };
        let inv = Inventory::from_toml(INVENTORY).unwrap();
        match xpu_plan::plan(&g, &policy, &inv) {
            Ok((plan, ex)) => {
                prop_assert!(xpu_ir::verify(&plan.graph).is_ok(), "planned graph verifies:\n{}", xpu_ir::text::print(&plan.graph));
                let passes: Vec<&str> = plan.passes.iter().map(String::as_str).collect();
                let rewritten = xpu_plan::passes::optimize(&g, &passes, None).0;
                let source = rewritten.as_ref().unwrap_or(&g);
                prop_assert_eq!(ex.decisions.len(), source.nodes.len(), "one decision per node after the passes");
                prop_assert!(ex.decisions.iter().all(|d| d.chosen.is_some() && d.rule.is_some()), "every node placed, by a named rule");
                prop_assert_eq!(plan.placements.len(), plan.graph.nodes.len());
                let mut covered: Vec<u32> = plan.partitions.iter().flat_map(|p| p.nodes.iter().map(|n| n.0)).collect();
                let in_order = covered.windows(2).all(|w| w[0] < w[1]);
                prop_assert!(in_order, "partitions run in node order");
                covered.dedup();
                prop_assert_eq!(covered.len(), plan.graph.nodes.len(), "each node in exactly one partition");
                for w in plan.partitions.windows(2) {
                    prop_assert!(w[0].engine != w[1].engine || w[0].device != w[1].device, "adjacent partitions differ");
                }
                for p in &plan.placements {
                    prop_assert!(*p.engine == *plan.partitions[p.partition].engine);
                }
                prop_assert_eq!(plan.graph.ty(plan.graph.outputs[0].value).dtype, DType::F32, "outputs keep their declared dtype");
                if !fallback {
                    prop_assert_eq!(ex.fallbacks(), 0);
                }
                let again = xpu_plan::plan(&g, &policy, &inv).unwrap();
                prop_assert_eq!(again.0.to_json(), plan.to_json(), "deterministic");
            }
            Err(f) => {
                prop_assert!(!f.errors.is_empty());
                let passes = xpu_plan::passes::pipeline(policy.spec.execution.graph_optimization);
                let rewritten = xpu_plan::passes::optimize(&g, passes, None).0;
                prop_assert_eq!(f.explanation.decisions.len(), rewritten.as_ref().unwrap_or(&g).nodes.len());
                for d in f.explanation.decisions.iter().filter(|d| d.chosen.is_none() && d.op != "constant") {
                    prop_assert!(!d.rejected.is_empty(), "an unplaced node says why: {:?}", d);
                }
            }
        }
    }
}
