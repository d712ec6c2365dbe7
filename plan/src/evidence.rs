//! Measured planning's keys: a node's signature — what its measured time depends on
//! besides the candidate: op, attributes, operand dtypes and a bucket of each operand's
//! shape — stable across runs, programs and machines, so figures measured for one node
//! apply to every node like it. The machine and engine versions are not in the signature:
//! evidence records them once and is not applied on another machine.

use std::collections::BTreeMap;

use xpu_ir::{Attr, Dim, Graph, NodeId, ValueId};

/// A node signature's 64 bits, written as 16 hex digits (in JSON too: a number that
/// large does not survive JavaScript).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signature(pub u64);

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl std::str::FromStr for Signature {
    type Err = String;
    fn from_str(s: &str) -> Result<Signature, String> {
        if s.len() != 16 {
            return Err(format!("signature {s:?} is not 16 hex digits"));
        }
        u64::from_str_radix(s, 16)
            .map(Signature)
            .map_err(|_| format!("signature {s:?} is not 16 hex digits"))
    }
}

impl serde::Serialize for Signature {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Signature {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Signature, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Dims up to this size are kept exactly; larger ones are rounded up to a power of two.
const EXACT_DIMS: u64 = 16;

/// The signature of node `id`: 16 hex digits of a 64-bit FNV-1a hash (a fixed, documented
/// function: signatures written into lock files stay valid across builds and machines).
/// Cheap enough to take for every node of every plan.
pub fn node_signature(g: &Graph, id: NodeId, bindings: &BTreeMap<String, u64>) -> String {
    format!("{:016x}", signature_bits(g, id, bindings))
}

/// [`node_signature`] as its 64 bits (what the planner looks up, no allocation).
pub fn signature_bits(g: &Graph, id: NodeId, bindings: &BTreeMap<String, u64>) -> u64 {
    let n = g.node(id);
    let mut h = Fnv::new();
    h.bytes(n.op.name().as_bytes());
    for (key, value) in &n.attrs.0 {
        h.bytes(key.as_bytes());
        attr_hash(&mut h, value);
    }
    for v in n.input_values() {
        h.byte(b'i');
        operand_hash(&mut h, g, v, bindings);
    }
    for &v in &n.outputs {
        h.byte(b'o');
        h.bytes(g.ty(v).dtype.name().as_bytes());
    }
    h.0
}

/// An attribute's value: numbers by their bits, names by their text; a tensor, a row
/// expression or a subgraph (rare outside constants, table ops and control flow) by its JSON
/// form.
fn attr_hash(h: &mut Fnv, a: &Attr) {
    match a {
        Attr::Int(i) => h.bytes(&i.to_le_bytes()),
        Attr::Float(f) => h.bytes(&f.to_bits().to_le_bytes()),
        Attr::Str(s) => h.bytes(s.as_bytes()),
        Attr::Ints(v) => v.iter().for_each(|i| h.bytes(&i.to_le_bytes())),
        Attr::Floats(v) => v.iter().for_each(|f| h.bytes(&f.to_bits().to_le_bytes())),
        Attr::Strs(v) => v.iter().for_each(|s| h.bytes(s.as_bytes())),
        Attr::DType(d) => h.bytes(d.name().as_bytes()),
        Attr::Tensor(_) | Attr::Row(_) | Attr::Graph(_) => {
            h.bytes(&serde_json::to_vec(a).unwrap_or_default())
        }
    }
    h.byte(b';');
}

/// 64-bit FNV-1a.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn byte(&mut self, b: u8) {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
        self.byte(0xff);
    }
}

/// An operand's dtype and bucketed dims (unknown: `?`; an unbound symbol: its name).
fn operand_hash(h: &mut Fnv, g: &Graph, v: ValueId, bindings: &BTreeMap<String, u64>) {
    let ty = g.ty(v);
    h.bytes(ty.dtype.name().as_bytes());
    let Some(dims) = &ty.dims else {
        h.byte(b'?');
        return;
    };
    for d in dims {
        match d {
            Dim::Known(n) => h.bytes(&bucket(*n).to_le_bytes()),
            Dim::Sym(s) => match bindings.get(s) {
                Some(n) => h.bytes(&bucket(*n).to_le_bytes()),
                None => h.bytes(s.as_bytes()),
            },
            Dim::Unknown => h.byte(b'?'),
        }
    }
}

fn bucket(n: u64) -> u64 {
    if n > EXACT_DIMS { n.checked_next_power_of_two().unwrap_or(u64::MAX) } else { n }
}

/// The node's operands as a reader sees them (`f32[1,784] f32[784,512] -> f32[1,512]`),
/// shapes as bound, not bucketed.
pub fn operands(g: &Graph, id: NodeId, bindings: &BTreeMap<String, u64>) -> String {
    let n = g.node(id);
    let ins: Vec<String> = n.input_values().map(|v| operand(g, v, bindings)).collect();
    let outs: Vec<String> = n.outputs.iter().map(|&v| operand(g, v, bindings)).collect();
    format!("{} -> {}", ins.join(" "), outs.join(" "))
}

fn operand(g: &Graph, v: ValueId, bindings: &BTreeMap<String, u64>) -> String {
    let ty = g.ty(v);
    let dims = match &ty.dims {
        None => "?".to_string(),
        Some(dims) => {
            let d: Vec<String> = dims
                .iter()
                .map(|d| match d {
                    Dim::Known(n) => n.to_string(),
                    Dim::Sym(s) => bindings.get(s).map_or_else(|| s.clone(), |n| n.to_string()),
                    Dim::Unknown => "?".into(),
                })
                .collect();
            format!("[{}]", d.join(","))
        }
    };
    format!("{}{dims}", ty.dtype.name())
}
