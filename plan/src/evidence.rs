//! Measured planning's keys: a node's signature — what its measured time depends on
//! besides the candidate: op, attributes, operand dtypes and a bucket of each operand's
//! shape — stable across runs, programs and machines, so figures measured for one node
//! apply to every node like it. The machine and engine versions are not in the signature:
//! evidence records them once and is not applied on another machine.

use std::collections::BTreeMap;
use std::fmt::Write;

use sha2::{Digest, Sha256};
use xpu_ir::{Dim, Graph, NodeId, ValueId};

/// Dims up to this size are kept exactly; larger ones are rounded up to a power of two.
const EXACT_DIMS: u64 = 16;

/// The signature of node `id`: 16 hex digits.
pub fn node_signature(g: &Graph, id: NodeId, bindings: &BTreeMap<String, u64>) -> String {
    let n = g.node(id);
    let mut h = Sha256::new();
    h.update(n.op.name().as_bytes());
    h.update(b"\0");
    h.update(serde_json::to_vec(&n.attrs).unwrap_or_default());
    for v in n.input_values() {
        h.update(b"\0in ");
        h.update(operand(g, v, bindings, true).as_bytes());
    }
    for &v in &n.outputs {
        h.update(b"\0out ");
        h.update(g.ty(v).dtype.name().as_bytes());
    }
    h.finalize().iter().take(8).fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The node's operands as a reader sees them (`f32[1,784] f32[784,512] -> f32[1,512]`),
/// shapes as bound, not bucketed.
pub fn operands(g: &Graph, id: NodeId, bindings: &BTreeMap<String, u64>) -> String {
    let n = g.node(id);
    let ins: Vec<String> = n.input_values().map(|v| operand(g, v, bindings, false)).collect();
    let outs: Vec<String> = n.outputs.iter().map(|&v| operand(g, v, bindings, false)).collect();
    format!("{} -> {}", ins.join(" "), outs.join(" "))
}

fn operand(g: &Graph, v: ValueId, bindings: &BTreeMap<String, u64>, bucketed: bool) -> String {
    let ty = g.ty(v);
    let dims = match &ty.dims {
        None => "?".to_string(),
        Some(dims) => {
            let d: Vec<String> = dims
                .iter()
                .map(|d| match d {
                    Dim::Known(n) => size(*n, bucketed),
                    Dim::Sym(s) => {
                        bindings.get(s).map_or_else(|| s.clone(), |n| size(*n, bucketed))
                    }
                    Dim::Unknown => "?".into(),
                })
                .collect();
            format!("[{}]", d.join(","))
        }
    };
    format!("{}{dims}", ty.dtype.name())
}

fn size(n: u64, bucketed: bool) -> String {
    if bucketed && n > EXACT_DIMS { n.next_power_of_two().to_string() } else { n.to_string() }
}
