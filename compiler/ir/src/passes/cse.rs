//! Common-subexpression elimination: a node identical to an earlier one (same op, same
//! inputs after earlier replacements, same attributes) reuses the earlier node's outputs.

use std::collections::HashMap;

use crate::{Attr, Graph, ValueId};

pub fn eliminate_common_subexpressions(g: &Graph) -> Graph {
    let mut replace: Vec<Option<ValueId>> = vec![None; g.values.len()];
    let mut keep = vec![true; g.nodes.len()];
    let mut seen: HashMap<String, usize> = HashMap::new();
    let resolve = |replace: &[Option<ValueId>], v: ValueId| replace[v.index()].unwrap_or(v);
    // Hashing a weight is the expensive part: only tensors that share dtype and shape with
    // another could be equal, so only those are hashed.
    let mut same_type: HashMap<(crate::DType, Vec<usize>), usize> = HashMap::new();
    for n in &g.nodes {
        for (_, a) in n.attrs.iter() {
            if let Attr::Tensor(t) = a {
                *same_type.entry((t.dtype(), t.shape().to_vec())).or_default() += 1;
            }
        }
    }
    for (i, n) in g.nodes.iter().enumerate() {
        let mut key = format!("{}|{}|", n.op, n.outputs.len());
        for v in &n.inputs {
            match v {
                Some(v) => key.push_str(&format!("{},", resolve(&replace, *v).0)),
                None => key.push_str("_,"),
            }
        }
        for (k, a) in n.attrs.iter() {
            match a {
                Attr::Tensor(t) if same_type[&(t.dtype(), t.shape().to_vec())] == 1 => {
                    key.push_str(&format!("{k}=unique tensor of node {i};"));
                }
                Attr::Tensor(t) => {
                    let h: String = t.content_hash().iter().map(|b| format!("{b:02x}")).collect();
                    key.push_str(&format!("{k}=tensor:{h};"));
                }
                a => key.push_str(&format!("{k}={a};")),
            }
        }
        match seen.get(&key) {
            Some(&first) => {
                keep[i] = false;
                for (o, &prev) in n.outputs.iter().zip(&g.nodes[first].outputs) {
                    replace[o.index()] = Some(prev);
                }
            }
            None => {
                seen.insert(key, i);
            }
        }
    }
    g.rebuild(&keep, &replace)
}
