//! Constant folding: a node whose inputs are all constants becomes constants, computed by
//! the caller's evaluator. Results larger than [`MAX_FOLDED_ELEMENTS`] stay as nodes so the
//! graph does not bloat; a node the evaluator rejects is left alone.

use crate::{Graph, Node, Op, Tensor, ValueId};

use super::Evaluator;

/// Largest tensor folding will materialise.
pub const MAX_FOLDED_ELEMENTS: usize = 1 << 16;

/// [`fold_constants`], or `None` when it would give back `g` unchanged. A dense graph (see
/// [`Graph::is_dense`]) with no node whose inputs are all constants folds nothing, so it is
/// neither evaluated nor copied; otherwise the folded graph is built and compared.
pub(crate) fn fold_if_changed(g: &Graph, eval: &dyn Evaluator) -> Option<Graph> {
    if g.is_dense() && !g.nodes.iter().any(|n| foldable(g, n)) {
        return None;
    }
    let out = fold_constants(g, eval);
    (out != *g).then_some(out)
}

/// Whether `n` is a candidate for folding: a computing node whose inputs are all constants
/// (omitted optional inputs aside). Until a first node folds, these are exactly the nodes
/// folding asks the evaluator about.
fn foldable(g: &Graph, n: &Node) -> bool {
    foldable_op(n) && n.input_values().all(|v| g.const_value(v).is_some())
}

/// Whether folding may evaluate `n` once its inputs are constants. Control flow runs when
/// the job runs: folding it could run an unbounded loop at compile time.
fn foldable_op(n: &Node) -> bool {
    n.op != Op::Constant && n.op.class() != crate::OpClass::Control && !n.inputs.is_empty()
}

pub fn fold_constants(g: &Graph, eval: &dyn Evaluator) -> Graph {
    let mut out = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values.len()];
    for &i in &g.inputs {
        map[i.index()] = Some(out.copy_input(g, i));
    }
    for n in &g.nodes {
        let inputs: Vec<Option<ValueId>> =
            n.inputs.iter().map(|v| v.map(|v| map[v.index()].expect("verified graph"))).collect();
        let consts: Option<Vec<Option<&Tensor>>> = inputs
            .iter()
            .map(|v| match v {
                Some(v) => out.const_value(*v).map(Some),
                None => Some(None),
            })
            .collect();
        let folded = match consts {
            Some(c) if foldable_op(n) => {
                let c: Vec<Option<&Tensor>> = c;
                let dtypes: Vec<_> = n.outputs.iter().map(|&o| g.ty(o).dtype).collect();
                match eval.evaluate(n, &c, &dtypes) {
                    Ok(ts)
                        if ts.len() == n.outputs.len()
                            && ts.iter().all(|t| t.numel() <= MAX_FOLDED_ELEMENTS) =>
                    {
                        Some(ts)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        match folded {
            Some(ts) => {
                for (&o, t) in n.outputs.iter().zip(ts) {
                    let c = out.add_const(t);
                    out.values[c.index()].name = g.value(o).name.clone();
                    map[o.index()] = Some(c);
                }
            }
            None => {
                out.copy_node(g, n, inputs, &mut map);
            }
        }
    }
    for o in &g.outputs {
        out.add_output(o.name.clone(), map[o.value.index()].expect("verified graph"));
    }
    out
}
