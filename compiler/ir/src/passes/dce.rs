//! Dead-code elimination: drop nodes none of whose outputs reach a graph output. Nodes that
//! act on the world (`write_table`, `plot`) are kept whatever uses their result.

use crate::{Graph, Op};

pub fn eliminate_dead_code(g: &Graph) -> Graph {
    dce_if_changed(g).unwrap_or_else(|| g.clone())
}

/// [`eliminate_dead_code`], or `None` when it would give back `g` unchanged.
pub(crate) fn dce_if_changed(g: &Graph) -> Option<Graph> {
    let mut live_value = vec![false; g.values.len()];
    for o in &g.outputs {
        live_value[o.value.index()] = true;
    }
    let mut keep = vec![false; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate().rev() {
        let effect = matches!(n.op, Op::WriteTable | Op::Plot);
        if effect || n.outputs.iter().any(|o| live_value[o.index()]) {
            keep[i] = true;
            for v in n.input_values() {
                live_value[v.index()] = true;
            }
        }
    }
    super::rebuilt_if_changed(g, &keep, &[])
}
