//! Static cost estimates: floating-point operations per node, for policy rules
//! (`min_flops`) and the fallback budget. Estimates count multiply-adds as two operations
//! for contractions (matmul, gemm, conv, attention) and one operation per element otherwise.

use std::collections::BTreeMap;

use crate::passes::memory::value_bytes;
use crate::{Graph, NodeId, Op, ValueId};

fn numel(g: &Graph, v: ValueId, bindings: &BTreeMap<String, u64>) -> Option<u64> {
    value_bytes(g, v, bindings).map(|b| b / g.ty(v).dtype.size_bytes().max(1) as u64)
}

fn dim(g: &Graph, v: ValueId, i: isize, bindings: &BTreeMap<String, u64>) -> Option<u64> {
    let dims = g.ty(v).dims.as_ref()?;
    let idx = if i < 0 { dims.len().checked_sub(i.unsigned_abs())? } else { i as usize };
    match dims.get(idx)? {
        crate::Dim::Known(k) => Some(*k),
        crate::Dim::Sym(s) => bindings.get(s).copied(),
        crate::Dim::Unknown => None,
    }
}

/// Estimated operations of one node; `None` when a size it depends on is unknown.
pub fn node_flops(g: &Graph, id: NodeId, bindings: &BTreeMap<String, u64>) -> Option<u64> {
    let n = g.node(id);
    let input = |i: usize| n.inputs.get(i).copied().flatten();
    let out = *n.outputs.first()?;
    let out_elems = numel(g, out, bindings);
    match n.op {
        Op::MatMul | Op::Gemm => {
            let a = input(0)?;
            let trans_a = n.op == Op::Gemm && n.attrs.int("transA", 0) == 1;
            let k = dim(g, a, if trans_a { -2 } else { -1 }, bindings)?;
            Some(2 * out_elems? * k)
        }
        Op::Conv | Op::ConvTranspose => {
            let w = input(1)?;
            let per_output: u64 = {
                let dims = g.ty(w).dims.as_ref()?;
                let mut p = 1;
                for i in 1..dims.len() {
                    p *= dim(g, w, i as isize, bindings)?;
                }
                p
            };
            let elems = if n.op == Op::Conv { out_elems? } else { numel(g, input(0)?, bindings)? };
            Some(2 * elems * per_output)
        }
        Op::Attention => {
            // q [.., S, D] · kᵀ [.., D, L] and probs [.., S, L] · v [.., L, Dv].
            let q = input(0)?;
            let k = input(1)?;
            let l = dim(g, k, -2, bindings)?;
            Some(4 * numel(g, q, bindings)? * l)
        }
        _ => {
            let ins = n.input_values().filter_map(|v| numel(g, v, bindings)).max().unwrap_or(0);
            Some(ins.max(out_elems?))
        }
    }
}

/// Sum of [`node_flops`] over the graph, counting unknown nodes as zero.
pub fn graph_flops(g: &Graph, bindings: &BTreeMap<String, u64>) -> u64 {
    g.node_ids().filter_map(|id| node_flops(g, id, bindings)).sum()
}
