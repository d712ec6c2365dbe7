//! The standard pass pipeline every program goes through before it is planned, chosen by
//! `execution.graph_optimization` (`none`: no rewrite; `basic`: canon, fold, cse, dce;
//! `extended`, `all` or unset: also fuse), with a record of what each pass changed for the
//! explanation. Constant folding computes through the caller's [`Evaluator`] (the cpu
//! engine's reference kernels), and only what is exact on any engine (data movement,
//! integer and boolean arithmetic: shape computations); float arithmetic on constants stays
//! a node the policy places. Without an evaluator folding is skipped, and the record says so.

use serde::{Deserialize, Serialize};
use xpu_engine::options::GraphOptimization;
use xpu_ir::passes::{Evaluator, run_pass_if_changed};
use xpu_ir::{Graph, Op};

/// What one pass did to the graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassRecord {
    pub pass: String,
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// `folded 3 nodes into constants`, `removed 2 unused nodes`, `no change`, …
    pub summary: String,
}

/// The passes `level` asks for, in order.
pub fn pipeline(level: Option<GraphOptimization>) -> &'static [&'static str] {
    match level {
        Some(GraphOptimization::None) => &[],
        Some(GraphOptimization::Basic) => &["canon", "fold", "cse", "dce"],
        Some(GraphOptimization::Extended | GraphOptimization::All) | None => {
            xpu_ir::passes::DEFAULT_PIPELINE
        }
    }
}

/// Folding as a plan may: exact computations only. Moving data (reshape, transpose, slice,
/// concat, gather, …) and computing integers or booleans (shape arithmetic) give the same
/// bits on every engine, so they fold; float arithmetic stays in the graph, to be placed
/// and run at the precision and on the engine the policy chooses.
struct ExactFold<'a>(&'a dyn Evaluator);

impl Evaluator for ExactFold<'_> {
    fn evaluate(
        &self,
        node: &xpu_ir::Node,
        inputs: &[Option<&xpu_ir::Tensor>],
        output_dtypes: &[xpu_ir::DType],
    ) -> Result<Vec<xpu_ir::Tensor>, String> {
        use xpu_ir::OpClass;
        let exact = matches!(node.op.class(), OpClass::Movement | OpClass::Gather)
            || output_dtypes.iter().all(|d| !d.is_float());
        if !exact {
            return Err("float arithmetic runs where the policy places it".into());
        }
        self.0.evaluate(node, inputs, output_dtypes)
    }
}

/// Runs `passes` over `graph`; `None` when no pass changed anything (the caller keeps its
/// graph, shared), else the rewritten graph. Either way, one record per pass.
pub fn optimize(
    graph: &Graph,
    passes: &[&str],
    eval: Option<&dyn Evaluator>,
) -> (Option<Graph>, Vec<PassRecord>) {
    let exact = eval.map(ExactFold);
    let eval = exact.as_ref().map(|e| e as &dyn Evaluator);
    let mut current: Option<Graph> = None;
    let mut records = Vec::with_capacity(passes.len());
    for &pass in passes {
        let before = current.as_ref().unwrap_or(graph);
        let record = |summary: String, after: usize| PassRecord {
            pass: pass.to_string(),
            nodes_before: before.nodes.len(),
            nodes_after: after,
            summary,
        };
        if pass == "fold" && eval.is_none() {
            records
                .push(record("skipped: no evaluator in this process".into(), before.nodes.len()));
            continue;
        }
        // A pass that finds nothing to do hands back no graph: nothing is copied or compared.
        let Some(after) =
            run_pass_if_changed(pass, before, eval).expect("pipeline names known passes")
        else {
            records.push(record("no change".into(), before.nodes.len()));
            continue;
        };
        records.push(record(summarize(pass, before, &after), after.nodes.len()));
        current = Some(after);
    }
    (current, records)
}

fn summarize(pass: &str, before: &Graph, after: &Graph) -> String {
    let computed = |g: &Graph| g.nodes.iter().filter(|n| n.op != Op::Constant).count();
    let (b, a) = (before.nodes.len(), after.nodes.len());
    match pass {
        "fold" => format!(
            "folded {} nodes into constants",
            computed(before).saturating_sub(computed(after))
        ),
        "cse" => format!("merged {} duplicate nodes", b.saturating_sub(a)),
        "dce" => format!("removed {} unused nodes", b.saturating_sub(a)),
        "fuse" => {
            let grouped = after.nodes.iter().filter(|n| n.group.is_some()).count();
            let groups: std::collections::BTreeSet<u32> =
                after.nodes.iter().filter_map(|n| n.group).collect();
            format!("{grouped} nodes in {} fusion groups", groups.len())
        }
        _ => format!("rewrote the graph ({b} -> {a} nodes)"),
    }
}
