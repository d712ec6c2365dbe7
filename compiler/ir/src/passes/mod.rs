//! Graph-to-graph passes and the memory-planning analysis.
//!
//! Every pass takes a verified graph and returns a verified graph (tests run the verifier
//! between passes). Constant folding evaluates ops through an [`Evaluator`] supplied by the
//! caller, so this crate never depends on an engine.

mod canon;
pub mod cost;
mod cse;
mod dce;
mod fold;
mod fuse;
mod memory;

pub use canon::canonicalize;
pub use cse::eliminate_common_subexpressions;
pub use dce::eliminate_dead_code;
pub use fold::fold_constants;
pub use fuse::group_elementwise;
pub use memory::{BufferUse, MemoryPlan, ValuePlacement, plan_memory, value_bytes};

use crate::{DType, Graph, Node, Tensor, ValueId};

/// Evaluates one node on constant inputs (implemented by the CPU engine); `output_dtypes`
/// are the node's declared output dtypes.
pub trait Evaluator: Send + Sync {
    fn evaluate(
        &self,
        node: &Node,
        inputs: &[Option<&Tensor>],
        output_dtypes: &[DType],
    ) -> Result<Vec<Tensor>, String>;
}

/// The passes `xpuctl ir opt --passes` and filetests name.
pub const PASS_NAMES: &[&str] = &["fold", "dce", "cse", "canon", "fuse"];

/// The default pipeline for `xpuctl ir opt` without `--passes`.
pub const DEFAULT_PIPELINE: &[&str] = &["canon", "fold", "cse", "dce", "fuse"];

/// A pass that could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PassError {
    #[error("unknown pass `{0}` (known: fold, dce, cse, canon, fuse)")]
    Unknown(String),
    #[error("pass `fold` needs an evaluator (an engine to compute constants)")]
    NoEvaluator,
}

/// Runs one pass by name.
pub fn run_pass(name: &str, g: &Graph, eval: Option<&dyn Evaluator>) -> Result<Graph, PassError> {
    Ok(run_pass_if_changed(name, g, eval)?.unwrap_or_else(|| g.clone()))
}

/// Runs one pass by name; `Ok(None)` when its result would equal `g` (the pass found nothing
/// to do). The plan pipeline runs every program through the passes before planning, and most
/// passes change nothing in most graphs: this way they neither copy the graph nor compare a
/// copy with it.
pub fn run_pass_if_changed(
    name: &str,
    g: &Graph,
    eval: Option<&dyn Evaluator>,
) -> Result<Option<Graph>, PassError> {
    Ok(match name {
        "fold" => fold::fold_if_changed(g, eval.ok_or(PassError::NoEvaluator)?),
        "dce" => dce::dce_if_changed(g),
        "cse" => cse::cse_if_changed(g),
        "canon" => canon::canon_if_changed(g),
        "fuse" => fuse::fuse_if_changed(g),
        other => return Err(PassError::Unknown(other.to_string())),
    })
}

/// [`Graph::rebuild`] for a pass that keeps `keep` nodes and redirects uses through
/// `replace`, or `None` when that would give back `g` itself: a dense graph (the form every
/// rebuild produces) keeping every node and redirecting no use. A graph that is not dense
/// always differs from its rebuild, which is dense.
fn rebuilt_if_changed(g: &Graph, keep: &[bool], replace: &[Option<ValueId>]) -> Option<Graph> {
    if keep.iter().all(|&k| k) && g.is_dense() {
        // Rebuilding would only redirect uses: no copy at all when none reads a replaced
        // value, else one copy redirected in place.
        return g.reads_replaced(replace).then(|| redirected(g.clone(), replace));
    }
    Some(g.rebuild(keep, replace))
}

/// [`Graph::rebuild`] keeping every node of `g`, uses redirected through `replace`: in place
/// when `g` is dense (its values keep their numbers), so the arena is not copied again.
fn redirected(mut g: Graph, replace: &[Option<ValueId>]) -> Graph {
    if !g.is_dense() {
        let keep = vec![true; g.nodes.len()];
        return g.rebuild(&keep, replace);
    }
    g.redirect_uses(replace);
    g
}
