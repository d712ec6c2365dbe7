//! Canonicalisation: simple rewrites that put equivalent graphs into one form.
//!
//! - `identity`, inference-mode `dropout` (mask unused), `cast` to the same dtype and
//!   `transpose` with the identity permutation forward their input;
//! - `reshape(reshape(x, a), b)` becomes `reshape(x, b)` when `b` is a constant without 0s;
//! - commutative binary ops take a constant operand second.
//!
//! Nodes made dead are left for `dce`.

use std::collections::HashMap;

use crate::{Graph, Node, Op, ValueId};

/// New inputs of the nodes canonicalisation edits, by node index.
type Edits = HashMap<usize, Vec<Option<ValueId>>>;

pub fn canonicalize(g: &Graph) -> Graph {
    canon_if_changed(g).unwrap_or_else(|| g.clone())
}

/// [`canonicalize`], or `None` when it would give back `g` unchanged.
pub(crate) fn canon_if_changed(g: &Graph) -> Option<Graph> {
    let (edits, replace) = rewrites(g);
    if edits.is_empty() {
        let keep = vec![true; g.nodes.len()];
        return super::rebuilt_if_changed(g, &keep, &replace);
    }
    // An edit always changes the graph: a reshape then reads an earlier value, a swap puts
    // a constant second where a non-constant was. Edits read only earlier values, so a
    // dense graph stays dense and is redirected in place, as its rebuild would be.
    let mut edited = g.clone();
    for (i, inputs) in edits {
        edited.nodes[i].inputs = inputs;
    }
    Some(super::redirected(edited, &replace))
}

/// What canonicalisation changes: new inputs of edited nodes (by node index) and, per value,
/// the value its uses should read instead. The graph itself is not copied until an edit is
/// known to be needed; a later reshape reads an earlier one's edited inputs, as it would
/// have in an edited copy.
fn rewrites(g: &Graph) -> (Edits, Vec<Option<ValueId>>) {
    let mut edits = Edits::new();
    let mut replace: Vec<Option<ValueId>> = vec![None; g.values.len()];
    let uses = g.use_counts();
    for (i, n) in g.nodes.iter().enumerate() {
        let first = n.inputs.first().copied().flatten();
        if forwards(g, n, first, &uses) {
            if let Some(x) = first {
                // A graph output keeps its declared type; only forward when types agree.
                if g.ty(x) == g.ty(n.outputs[0]) || !g.is_output(n.outputs[0]) {
                    replace[n.outputs[0].index()] = Some(x);
                }
            }
            continue;
        }
        if n.op == Op::Reshape {
            if let Some(src) = reshape_source(g, n, &edits) {
                let mut inputs = n.inputs.clone();
                inputs[0] = Some(src);
                edits.insert(i, inputs);
            }
            continue;
        }
        if matches!(
            n.op,
            Op::Add | Op::Mul | Op::Max | Op::Min | Op::And | Op::Or | Op::Xor | Op::Equal
        ) && n.inputs.len() == 2
            && let (Some(a), Some(b)) = (n.inputs[0], n.inputs[1])
            && g.const_value(a).is_some()
            && g.const_value(b).is_none()
        {
            edits.insert(i, vec![Some(b), Some(a)]);
        }
    }
    (edits, replace)
}

/// Whether `n` computes nothing and its output can be replaced by its first input.
fn forwards(g: &Graph, n: &Node, first: Option<ValueId>, uses: &[u32]) -> bool {
    match n.op {
        Op::Identity => true,
        Op::Dropout => {
            n.inputs.get(2).copied().flatten().is_none()
                && n.outputs.get(1).is_none_or(|m| uses[m.index()] == 0 && !g.is_output(*m))
        }
        Op::Cast => first.is_some_and(|x| Some(g.ty(x).dtype) == n.attrs.dtype("to")),
        Op::Transpose => match (n.attrs.ints("perm"), first.and_then(|x| g.ty(x).rank())) {
            (Some(p), _) => p.iter().enumerate().all(|(k, &a)| a == k as i64),
            (None, Some(r)) => r <= 1,
            _ => false,
        },
        _ => false,
    }
}

/// For `reshape(reshape(x, a), b)` with `b` a constant without 0s, `x`: the outer reshape
/// reads it directly. The inner reshape's inputs are as edited so far.
fn reshape_source(g: &Graph, n: &Node, edits: &Edits) -> Option<ValueId> {
    let (Some(x), Some(shape)) = (n.inputs[0], n.inputs[1]) else { return None };
    let inner = g.producer(x)?;
    let b_ok = g.const_value(shape).and_then(|t| t.to_i64_vec()).is_some_and(|s| !s.contains(&0));
    if g.node(inner).op != Op::Reshape || !b_ok {
        return None;
    }
    let inner_inputs = edits.get(&inner.index()).unwrap_or(&g.node(inner).inputs);
    inner_inputs[0]
}
