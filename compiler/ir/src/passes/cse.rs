//! Common-subexpression elimination: a node identical to an earlier one (same op, same
//! inputs after earlier replacements, same attributes) reuses the earlier node's outputs.

use std::collections::HashMap;

use crate::{Attr, Graph, ValueId};

pub fn eliminate_common_subexpressions(g: &Graph) -> Graph {
    let mut replace: Vec<Option<ValueId>> = vec![None; g.values.len()];
    let mut keep = vec![true; g.nodes.len()];
    let mut seen: HashMap<String, usize> = HashMap::new();
    let resolve = |replace: &[Option<ValueId>], v: ValueId| replace[v.index()].unwrap_or(v);
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
