//! Common-subexpression elimination: a node identical to an earlier one (same op, same
//! inputs after earlier replacements, same attributes) reuses the earlier node's outputs.
//!
//! Attributes are the same when they read the same in the text form; tensors when their
//! content hashes agree. Nodes are found by a 64-bit hash of all that, and every hash match
//! is confirmed by comparing the two nodes exactly, so a collision merges nothing.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use crate::{Attr, Attrs, DType, Graph, Node, ValueId};

pub fn eliminate_common_subexpressions(g: &Graph) -> Graph {
    cse_if_changed(g).unwrap_or_else(|| g.clone())
}

/// [`eliminate_common_subexpressions`], or `None` when it would give back `g` unchanged.
pub(crate) fn cse_if_changed(g: &Graph) -> Option<Graph> {
    let mut replace: Vec<Option<ValueId>> = vec![None; g.values.len()];
    let mut keep = vec![true; g.nodes.len()];
    let shared = shared_tensor_types(g);
    // Kept nodes by hash: `heads` holds the latest node of each hash, `chain[i]` the one
    // before node i with the same hash (collisions are rare: the chain is short).
    let mut heads = ByHash::with_capacity_and_hasher(g.nodes.len(), Default::default());
    let mut chain: Vec<Option<usize>> = vec![None; g.nodes.len()];
    let mut scratch = Scratch::default();
    for (i, n) in g.nodes.iter().enumerate() {
        // A node holding a tensor no other tensor could equal never merges.
        let Some(h) = node_hash(n, &replace, &shared, &mut scratch) else { continue };
        let mut candidate = heads.get(&h).copied();
        while let Some(j) = candidate {
            if same_node(n, &g.nodes[j], &replace, &mut scratch) {
                break;
            }
            candidate = chain[j];
        }
        match candidate {
            Some(first) => {
                keep[i] = false;
                for (o, &prev) in n.outputs.iter().zip(&g.nodes[first].outputs) {
                    replace[o.index()] = Some(prev);
                }
            }
            None => chain[i] = heads.insert(h, i),
        }
    }
    super::rebuilt_if_changed(g, &keep, &replace)
}

/// Nodes by their [`node_hash`].
type ByHash = HashMap<u64, usize, BuildHasherDefault<Mix>>;

/// A fast hasher for a node's few small fields (FxHash's mixing step) instead of SipHash:
/// nothing here needs resistance to chosen collisions, and a collision only costs a
/// comparison, since every match is confirmed by comparing the nodes.
#[derive(Default)]
struct Mix(u64);

impl Mix {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// A use's value after the replacements made so far. A replacement is the output of a kept
/// node, never itself replaced, so one step is enough.
fn resolve(replace: &[Option<ValueId>], v: ValueId) -> ValueId {
    replace[v.index()].unwrap_or(v)
}

/// Tensor attributes per (dtype, shape).
type TypeCounts<'g> = HashMap<(DType, &'g [usize]), usize>;

/// How many tensor attributes have each (dtype, shape). Hashing a weight is the expensive
/// part: only tensors that share dtype and shape with another could be equal, so only those
/// are hashed.
fn shared_tensor_types(g: &Graph) -> TypeCounts<'_> {
    let mut count = TypeCounts::new();
    for n in &g.nodes {
        for (_, a) in n.attrs.iter() {
            if let Attr::Tensor(t) = a {
                *count.entry((t.dtype(), t.shape())).or_default() += 1;
            }
        }
    }
    count
}

/// Reused text buffers for attributes, so rendering one allocates nothing once warm.
#[derive(Default)]
struct Scratch {
    a: String,
    b: String,
}

/// Hash of what makes a node a duplicate: op, output count, inputs after replacement and
/// attributes (text form; tensors by content hash). `None`: the node holds a tensor whose
/// dtype and shape no other tensor has, so no other node can equal it.
fn node_hash<'g>(
    n: &'g Node,
    replace: &[Option<ValueId>],
    shared: &TypeCounts<'g>,
    scratch: &mut Scratch,
) -> Option<u64> {
    let mut h = Mix::default();
    n.op.hash(&mut h);
    n.outputs.len().hash(&mut h);
    n.inputs.len().hash(&mut h);
    for v in &n.inputs {
        v.map(|v| resolve(replace, v)).hash(&mut h);
    }
    for (k, a) in n.attrs.iter() {
        k.hash(&mut h);
        match a {
            Attr::Tensor(t) if shared[&(t.dtype(), t.shape())] == 1 => return None,
            Attr::Tensor(t) => t.content_hash().hash(&mut h),
            a => {
                scratch.a.clear();
                write!(scratch.a, "{a}").expect("writing to a string");
                scratch.a.hash(&mut h);
            }
        }
    }
    Some(h.finish())
}

/// Whether `n` duplicates the earlier node `m`: equal ops and output counts, the same inputs
/// after replacement, and attributes equal as [`node_hash`] sees them.
fn same_node(n: &Node, m: &Node, replace: &[Option<ValueId>], scratch: &mut Scratch) -> bool {
    let input = |v: &Option<ValueId>| v.map(|v| resolve(replace, v));
    n.op == m.op
        && n.outputs.len() == m.outputs.len()
        && n.inputs.len() == m.inputs.len()
        && n.inputs.iter().zip(&m.inputs).all(|(a, b)| input(a) == input(b))
        && same_attrs(&n.attrs, &m.attrs, scratch)
}

fn same_attrs(x: &Attrs, y: &Attrs, scratch: &mut Scratch) -> bool {
    x.0.len() == y.0.len()
        && x.iter().zip(y.iter()).all(|((kx, ax), (ky, ay))| kx == ky && same_attr(ax, ay, scratch))
}

fn same_attr(x: &Attr, y: &Attr, scratch: &mut Scratch) -> bool {
    match (x, y) {
        (Attr::Tensor(s), Attr::Tensor(t)) => s.content_hash() == t.content_hash(),
        (Attr::Tensor(_), _) | (_, Attr::Tensor(_)) => false,
        _ => {
            scratch.a.clear();
            scratch.b.clear();
            write!(scratch.a, "{x}").expect("writing to a string");
            write!(scratch.b, "{y}").expect("writing to a string");
            scratch.a == scratch.b
        }
    }
}
