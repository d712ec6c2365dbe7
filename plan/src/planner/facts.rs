//! What the candidate walk needs to know about a node: its op, the precision it computes
//! at and where that came from, the dtypes kernels must take, its estimated FLOPs and the
//! bytes of its tensors, and the first `[[rule]]` that matches it.

use xpu_engine::PrecisionName;
use xpu_ir::passes::cost::node_flops;
use xpu_ir::passes::value_bytes;
use xpu_ir::{DType, Graph, NodeId, Op};
use xpu_policy::ResolvedRule;

use super::measured::MeasureAsk;
use super::{Planner, cite};
use crate::model::RuleRef;

/// Where a node's compute precision came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum PrecisionSource {
    /// The graph's own dtype (no key asked for another, or the node cannot be retyped).
    GraphDtype,
    /// `rule[i].precision`.
    Rule(usize),
    KeepFp32,
    /// `precision.default`: a kernel that lacks it may run the node at another allowed
    /// precision instead (a precision candidate, recorded).
    Default,
}

/// Facts about one node the candidate walk needs.
pub(super) struct NodeFacts {
    pub op: Op,
    /// Precision the node computes at (float nodes) and the dtype kernels must accept.
    pub precision: Option<PrecisionName>,
    pub source: Option<PrecisionSource>,
    pub kernel_dtype: DType,
    /// The dtypes of the node's inputs and outputs, one bit per `DType::ALL` entry.
    pub operands: u32,
    pub flops: Option<u64>,
    pub working_bytes: Option<u64>,
    /// What the node asks of the evidence (its policy chooses by measurement).
    pub measure: Option<MeasureAsk>,
}

impl NodeFacts {
    /// Whether a kernel lacking the precision may run the node at another allowed one.
    pub fn alternates(&self) -> bool {
        self.source == Some(PrecisionSource::Default)
    }
}

impl<'a> Planner<'a> {
    /// The node's facts and the first rule that matches it.
    pub(super) fn facts(&self, id: NodeId) -> (NodeFacts, Option<&'a ResolvedRule>) {
        let g = self.graph;
        let n = g.node(id);
        let flops = node_flops(g, id, self.bindings);
        let primary = primary_dtype(g, id);
        let rule = self.resolved.rule_for(n.op, n.name.as_deref(), flops, primary);
        let (precision, source) = self.precision_of(n.op, primary, rule);
        let kernel_dtype = precision.map(|p| p.kernel_dtype()).unwrap_or(primary);
        let working_bytes = n
            .input_values()
            .chain(n.outputs.iter().copied())
            .map(|v| value_bytes(g, v, self.bindings))
            .sum::<Option<u64>>();
        let facts = NodeFacts {
            op: n.op,
            precision,
            source,
            kernel_dtype,
            operands: operand_bits(g, id),
            flops,
            working_bytes,
            measure: if n.op == Op::Constant { None } else { self.measure_ask(id, rule) },
        };
        (facts, rule)
    }

    /// The precision a node computes at: a rule's, else fp32 for `keep_fp32` ops, else
    /// `precision.default`, else its graph dtype. Non-float nodes have none; casts and
    /// constants keep their dtype.
    fn precision_of(
        &self,
        op: Op,
        primary: DType,
        rule: Option<&ResolvedRule>,
    ) -> (Option<PrecisionName>, Option<PrecisionSource>) {
        let graph = || (PrecisionName::of_dtype(primary), Some(PrecisionSource::GraphDtype));
        if !primary.is_float() {
            return (None, None);
        }
        if matches!(op, Op::Cast | Op::CastLike | Op::Constant) {
            return graph();
        }
        let r = self.resolved;
        if let Some(rule) = rule
            && let Some(p) = rule.precision
        {
            (Some(p), Some(PrecisionSource::Rule(rule.index)))
        } else if r.keep_fp32.contains(op) {
            (Some(PrecisionName::Fp32), Some(PrecisionSource::KeepFp32))
        } else if let Some(d) = r.default_precision {
            (Some(d), Some(PrecisionSource::Default))
        } else {
            graph()
        }
    }

    /// The explanation's reference for a precision source.
    pub(super) fn precision_ref(&self, source: PrecisionSource) -> RuleRef {
        use xpu_policy::Key;
        match source {
            PrecisionSource::GraphDtype => RuleRef { key: "graph dtype".into(), at: None },
            PrecisionSource::Rule(i) => cite(&self.resolved.rules[i].precision_site),
            PrecisionSource::KeepFp32 => cite(self.resolved.site(Key::KeepFp32)),
            PrecisionSource::Default => cite(self.resolved.site(Key::PrecisionDefault)),
        }
    }
}

/// The dtype that decides a node's precision, rule matches and the kernels that take it: its
/// first float value input, else its first value input (a `where`'s condition is not one),
/// else its first output.
fn primary_dtype(g: &Graph, id: NodeId) -> DType {
    let n = g.node(id);
    // `where` computes at its values' type, not its condition's (bool): ORT's CPU provider
    // has `where` of i32 but not of i16 or bool.
    let skip = usize::from(n.op == Op::Where);
    n.input_values()
        .skip(skip)
        .map(|v| g.ty(v).dtype)
        .find(|d| d.is_float())
        .or_else(|| n.input_values().nth(skip).map(|v| g.ty(v).dtype))
        .or_else(|| n.outputs.first().map(|&o| g.ty(o).dtype))
        .unwrap_or(DType::F32)
}

/// The dtypes of a node's inputs and outputs as bits of `DType::ALL` (walk-cache keys).
fn operand_bits(g: &Graph, id: NodeId) -> u32 {
    let n = g.node(id);
    n.input_values().chain(n.outputs.iter().copied()).fold(0, |bits, v| {
        let d = g.ty(v).dtype;
        bits | DType::ALL.iter().position(|x| *x == d).map_or(0, |i| 1 << i)
    })
}

/// The dtypes a set of [`operand_bits`] stands for.
pub(super) fn operand_dtypes(bits: u32) -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().enumerate().filter(move |(i, _)| bits & (1 << i) != 0).map(|(_, d)| d)
}
