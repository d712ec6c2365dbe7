//! Frozen plans (`xpuctl policy resolve --plan-out`, `run --plan`): read or refused, and a
//! plan that reads is validated against a program it may not match.
#![no_main]
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;

static GRAPH: LazyLock<(xpu_ir::Graph, String)> = LazyLock::new(|| {
    let g = xpu_ir::text::parse(include_str!("../../examples/mlp.sgr")).expect("mlp.sgr");
    let hash = g.content_hash();
    (g, hash)
});

fuzz_target!(|text: &str| {
    let Ok(plan) = xpu_plan::FrozenPlan::from_json(text) else { return };
    let (graph, hash) = &*GRAPH;
    let _ = plan.validate(graph, hash, None);
});
