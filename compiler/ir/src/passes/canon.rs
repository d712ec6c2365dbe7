//! Canonicalisation: simple rewrites that put equivalent graphs into one form.
//!
//! - `identity`, inference-mode `dropout` (mask unused), `cast` to the same dtype and
//!   `transpose` with the identity permutation forward their input;
//! - `reshape(reshape(x, a), b)` becomes `reshape(x, b)` when `b` is a constant without 0s;
//! - commutative binary ops take a constant operand second.
//!
//! Nodes made dead are left for `dce`.

use crate::{Graph, Op, ValueId};

pub fn canonicalize(g: &Graph) -> Graph {
    let mut g = g.clone();
    let mut replace: Vec<Option<ValueId>> = vec![None; g.values.len()];
    let uses = g.uses();
    for i in 0..g.nodes.len() {
        let n = &g.nodes[i];
        let first = n.inputs.first().copied().flatten();
        let forward = match n.op {
            Op::Identity => true,
            Op::Dropout => {
                n.inputs.get(2).copied().flatten().is_none()
                    && n.outputs
                        .get(1)
                        .is_none_or(|m| uses[m.index()].is_empty() && !g.is_output(*m))
            }
            Op::Cast => first.is_some_and(|x| Some(g.ty(x).dtype) == n.attrs.dtype("to")),
            Op::Transpose => match (n.attrs.ints("perm"), first.and_then(|x| g.ty(x).rank())) {
                (Some(p), _) => p.iter().enumerate().all(|(k, &a)| a == k as i64),
                (None, Some(r)) => r <= 1,
                _ => false,
            },
            _ => false,
        };
        if forward {
            if let Some(x) = first {
                // A graph output keeps its declared type; only forward when types agree.
                if g.ty(x) == g.ty(n.outputs[0]) || !g.is_output(n.outputs[0]) {
                    replace[n.outputs[0].index()] = Some(x);
                }
            }
            continue;
        }
        if n.op == Op::Reshape {
            let (x, shape) = (n.inputs[0], n.inputs[1]);
            if let (Some(x), Some(shape)) = (x, shape) {
                let inner = g.producer(x).map(|p| g.node(p));
                let b_ok = g
                    .const_value(shape)
                    .and_then(|t| t.to_i64_vec())
                    .is_some_and(|s| !s.contains(&0));
                if let Some(inner) = inner.filter(|p| p.op == Op::Reshape && b_ok)
                    && let Some(src) = inner.inputs[0]
                {
                    g.nodes[i].inputs[0] = Some(src);
                }
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
            g.nodes[i].inputs.swap(0, 1);
        }
    }
    let keep = vec![true; g.nodes.len()];
    g.rebuild(&keep, &replace)
}
