//! Precision: the planned graph is the source graph with float operands cast to each
//! node's compute precision and graph outputs cast back to their declared dtype. Constants
//! are converted at plan time rather than cast at every run; a cast of a value to a dtype
//! is made once and shared by its readers. An op that cannot compute at the precision it
//! was given keeps its source dtypes, and its decision says why.

use std::collections::HashMap;
use std::sync::Arc;

use xpu_engine::PrecisionName;
use xpu_ir::{DType, Graph, Node, NodeId, Op, OpClass, ValueId};

use super::Planner;
use crate::model::{CastPlan, Explanation, RuleRef};

/// The planned graph under construction.
struct Retyping {
    out: Graph,
    /// Source value → planned value.
    map: Vec<Option<ValueId>>,
    /// Planned node → the source node it came from (`None`: an inserted cast).
    source_of: Vec<Option<NodeId>>,
    casts: Vec<CastPlan>,
    cast_memo: HashMap<(ValueId, DType), ValueId>,
}

/// Where a retyping can be undone to: the lengths of what it grows.
#[derive(Copy, Clone)]
struct Mark {
    nodes: usize,
    values: usize,
    casts: usize,
}

impl Retyping {
    fn mark(&self) -> Mark {
        Mark { nodes: self.out.nodes.len(), values: self.out.values.len(), casts: self.casts.len() }
    }

    fn undo(&mut self, m: Mark) {
        self.out.nodes.truncate(m.nodes);
        self.out.values.truncate(m.values);
        self.casts.truncate(m.casts);
        self.source_of.truncate(m.nodes);
        self.cast_memo.retain(|_, v| v.index() < m.values);
    }

    /// The inputs of source node `n` as values of the planned graph. Computed again rather
    /// than kept in a copy: only a node whose retyping fails needs them a second time.
    fn mapped_inputs(&self, n: &Node) -> Vec<Option<ValueId>> {
        n.inputs.iter().map(|v| v.map(|v| self.map[v.index()].expect("defined earlier"))).collect()
    }

    /// `v` as `dtype`: itself, an earlier cast of it, or a new cast node (recorded).
    fn cast_to(
        &mut self,
        v: ValueId,
        dtype: DType,
        for_node: Option<NodeId>,
        reason: impl FnOnce() -> Arc<str>,
    ) -> ValueId {
        let from = self.out.ty(v).dtype;
        if from == dtype {
            return v;
        }
        if let Some(&c) = self.cast_memo.get(&(v, dtype)) {
            return c;
        }
        // Constants are converted now rather than cast at every run.
        let folded = self.out.const_value(v).and_then(|t| t.to_float_dtype(dtype));
        let is_folded = folded.is_some();
        let c = match folded {
            Some(t) => self.out.add_const(t),
            None => {
                let attrs = xpu_ir::Attrs::new().with("to", xpu_ir::Attr::DType(dtype));
                let Ok(c) = self.out.add_op(Op::Cast, &[v], attrs) else { return v };
                c
            }
        };
        self.casts.push(CastPlan {
            node: self.out.producer(c).expect("just added"),
            from: from.name().into(),
            to: dtype.name().into(),
            for_node,
            reason: reason(),
            folded: is_folded,
        });
        self.source_of.push(None);
        self.cast_memo.insert((v, dtype), c);
        c
    }
}

impl Planner<'_> {
    /// Builds the planned graph (see the module doc). `None` when nothing changes
    /// precision: the source graph is used as is.
    pub(super) fn retype(
        &mut self,
        precisions: &[Option<PrecisionName>],
        explanation: &mut Explanation,
    ) -> Option<(Graph, Vec<Option<NodeId>>, Vec<CastPlan>)> {
        let g = self.graph;
        let target = |id: NodeId| precisions[id.index()].and_then(|p| p.storage());
        let needs = g.node_ids().any(|id| {
            let n = g.node(id);
            target(id).is_some_and(|t| {
                n.input_values().any(|v| g.ty(v).dtype.is_float() && g.ty(v).dtype != t)
            })
        });
        if !needs {
            return None;
        }
        let mut r = Retyping {
            out: Graph::new(g.name.clone()),
            map: vec![None; g.values.len()],
            source_of: Vec::new(),
            casts: Vec::new(),
            cast_memo: HashMap::new(),
        };
        for &v in &g.inputs {
            r.map[v.index()] = Some(r.out.copy_input(g, v));
        }
        for id in g.node_ids() {
            self.retype_node(&mut r, id, target(id), explanation);
        }
        for o in &g.outputs {
            let v = r.map[o.value.index()].expect("outputs are defined");
            let want = g.ty(o.value).dtype;
            let v = r.cast_to(v, want, None, || {
                Arc::from(format!("output {:?} is declared {want}", o.name))
            });
            r.out.add_output(o.name.clone(), v);
        }
        Some((r.out, r.source_of, r.casts))
    }

    /// One source node into the planned graph, its float data operands at `want`.
    fn retype_node(
        &mut self,
        r: &mut Retyping,
        id: NodeId,
        want: Option<DType>,
        explanation: &mut Explanation,
    ) {
        let g = self.graph;
        let n = g.node(id);
        let primary = n.input_values().map(|v| g.ty(v).dtype).find(|d| d.is_float());
        // The dtype each operand should have: data operands (the node's float dtype) at the
        // node's precision; index-like float inputs (resize scales) and everything else as
        // the source graph declares.
        let desired = |orig: ValueId| match (want, primary) {
            (Some(t), Some(p)) if g.ty(orig).dtype == p => t,
            _ => g.ty(orig).dtype,
        };
        let mark = r.mark();
        let mut inputs = r.mapped_inputs(n);
        for (slot, orig) in inputs.iter_mut().zip(&n.inputs) {
            if let (Some(cur), Some(orig)) = (slot.as_mut(), orig) {
                let to = desired(*orig);
                let reasons = &mut self.cast_reasons;
                *cur = r.cast_to(*cur, to, Some(id), || cast_reason(reasons, to));
            }
        }
        let changed = inputs
            .iter()
            .zip(&n.inputs)
            .any(|(a, b)| a.map(|v| r.out.ty(v).dtype) != b.map(|v| g.ty(v).dtype));
        if changed {
            match self.add_retyped(r, id, &mut inputs, primary, want) {
                Ok(()) => return,
                Err(e) => {
                    // The op does not take this precision: undo, feed it its source dtypes.
                    r.undo(mark);
                    inputs = self.source_dtype_inputs(r, id);
                    if let Some(p) = primary {
                        note_kept_dtype(explanation, id, n.op, p, want, &e);
                    }
                }
            }
        }
        let new = r.out.copy_node(g, n, inputs, &mut r.map);
        debug_assert_eq!(new.index(), r.source_of.len());
        r.source_of.push(Some(id));
    }

    /// Adds node `id` with retyped `inputs`; `Err` when its types cannot be inferred at the
    /// new precision.
    fn add_retyped(
        &self,
        r: &mut Retyping,
        id: NodeId,
        inputs: &mut Vec<Option<ValueId>>,
        primary: Option<DType>,
        want: Option<DType>,
    ) -> Result<(), String> {
        let g = self.graph;
        let n = g.node(id);
        // Single-output ops whose output dtype follows their data operands (most of a model)
        // retype without running shape inference again.
        let follows = n.outputs.len() == 1
            && !matches!(n.op, Op::Cast | Op::CastLike)
            && (n.op.is_elementwise()
                || matches!(
                    n.op.class(),
                    OpClass::MatMul
                        | OpClass::Conv
                        | OpClass::Pool
                        | OpClass::Norm
                        | OpClass::Softmax
                        | OpClass::Movement
                ));
        let types = if follows {
            let mut ty = g.ty(n.outputs[0]).clone();
            if Some(ty.dtype) == primary {
                ty.dtype = want.unwrap_or(ty.dtype);
            }
            vec![ty]
        } else {
            r.out
                .infer_node_types(n.op, inputs, &n.attrs, n.outputs.len())
                .map_err(|e| e.to_string())?
        };
        let new = r.out.add_node(n.op, std::mem::take(inputs), n.attrs.clone(), types);
        r.out.nodes[new.index()].name = n.name.clone();
        for (k, &old) in n.outputs.iter().enumerate() {
            let nv = r.out.nodes[new.index()].outputs[k];
            r.map[old.index()] = Some(nv);
            r.out.values[nv.index()].name = g.value(old).name.clone();
        }
        r.source_of.push(Some(id));
        Ok(())
    }

    /// Node `id`'s inputs cast back to the dtypes the source graph declares.
    fn source_dtype_inputs(&self, r: &mut Retyping, id: NodeId) -> Vec<Option<ValueId>> {
        let g = self.graph;
        let n = g.node(id);
        // `map` is as it was before the node: its inputs map as they did.
        let mut inputs = r.mapped_inputs(n);
        for (slot, orig) in inputs.iter_mut().zip(&n.inputs) {
            if let (Some(cur), Some(orig)) = (slot.as_mut(), orig) {
                let keep = g.ty(*orig).dtype;
                *cur = r.cast_to(*cur, keep, Some(id), || {
                    Arc::from(format!("{} keeps {keep}", n.label(id)))
                });
            }
        }
        inputs
    }
}

/// Why values are cast to `to` (one text shared by every cast to it).
fn cast_reason(reasons: &mut HashMap<DType, Arc<str>>, to: DType) -> Arc<str> {
    reasons
        .entry(to)
        .or_insert_with(|| {
            let p = PrecisionName::of_dtype(to).map(|p| p.name()).unwrap_or(to.name());
            Arc::from(format!("the node computes at {p}"))
        })
        .clone()
}

/// A node that cannot compute at the precision it was given runs at its graph dtype: its
/// decision says so, and why.
fn note_kept_dtype(
    explanation: &mut Explanation,
    id: NodeId,
    op: Op,
    primary: DType,
    want: Option<DType>,
    why: &str,
) {
    let Some(d) = explanation.decisions.get_mut(id.index()) else { return };
    if let Some(c) = &mut d.chosen {
        c.precision = PrecisionName::of_dtype(primary);
    }
    d.precision_from = Some(RuleRef {
        key: format!(
            "graph dtype ({op} cannot compute at {}: {why})",
            want.map(|t| t.name()).unwrap_or("?")
        )
        .into(),
        at: None,
    });
}
