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

use crate::{DType, Graph, Node, Tensor};

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
    Ok(match name {
        "fold" => fold_constants(g, eval.ok_or(PassError::NoEvaluator)?),
        "dce" => eliminate_dead_code(g),
        "cse" => eliminate_common_subexpressions(g),
        "canon" => canonicalize(g),
        "fuse" => group_elementwise(g),
        other => return Err(PassError::Unknown(other.to_string())),
    })
}
