//! The graph arena: values and nodes in vectors, addressed by u32 ids.
//!
//! Invariant kept by every builder method and checked by the verifier: values are numbered
//! in definition order (graph inputs first, then node outputs in node order) and nodes are
//! stored in a topological order, so printing and re-parsing yields identical ids.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::infer::{InferError, infer_types};
use crate::{Attr, Attrs, Op, Tensor, TensorType};

/// A value (an SSA tensor). Displays as `%N`.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct ValueId(pub u32);

/// A node. Displays as `nN`.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// Where a value comes from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ValueDef {
    /// The i-th graph input.
    Input(u32),
    /// Output `index` of a node.
    Node { node: NodeId, index: u32 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Value {
    pub ty: TensorType,
    pub def: ValueDef,
    /// Source name (ONNX value name, graph input name), kept for explanations and export.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Node {
    pub op: Op,
    /// `None` is an omitted optional input.
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<ValueId>,
    #[serde(default, skip_serializing_if = "Attrs::is_empty")]
    pub attrs: Attrs,
    /// Source node name, kept for explanations and policy globs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Elementwise fusion group assigned by the fusion pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
}

impl Node {
    /// The defined (non-omitted) inputs.
    pub fn input_values(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.inputs.iter().flatten().copied()
    }

    /// A human label for errors: `n3 (matmul "fc1")`.
    pub fn label(&self, id: NodeId) -> String {
        match &self.name {
            Some(n) => format!("{id} ({} {n:?})", self.op),
            None => format!("{id} ({})", self.op),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GraphOutput {
    pub name: String,
    pub value: ValueId,
}

/// `v` after following `replace` (value → replacement value) to its end.
fn resolve(replace: &[Option<ValueId>], mut v: ValueId) -> ValueId {
    while let Some(r) = replace.get(v.index()).copied().flatten() {
        if r == v {
            break;
        }
        v = r;
    }
    v
}

/// A subgraph cut out by [`Graph::partition`], with the ids its inputs and outputs have in
/// the graph it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    pub graph: Graph,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// For each node of the partition graph, the node of `self` it copies (`None` for an
    /// outside constant copied in).
    pub sources: Vec<Option<NodeId>>,
}

/// An SGR-ML graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<GraphOutput>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            values: Vec::new(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    pub fn value(&self, v: ValueId) -> &Value {
        &self.values[v.index()]
    }

    pub fn node(&self, n: NodeId) -> &Node {
        &self.nodes[n.index()]
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v.index()].ty
    }

    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> ValueId {
        let id = ValueId(self.values.len() as u32);
        let index = self.inputs.len() as u32;
        self.values.push(Value { ty, def: ValueDef::Input(index), name: Some(name.into()) });
        self.inputs.push(id);
        id
    }

    /// Appends a node whose output types are given.
    pub fn add_node(
        &mut self,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        attrs: Attrs,
        output_types: Vec<TensorType>,
    ) -> NodeId {
        let node = NodeId(self.nodes.len() as u32);
        let outputs = output_types
            .into_iter()
            .enumerate()
            .map(|(i, ty)| {
                let id = ValueId(self.values.len() as u32);
                self.values.push(Value {
                    ty,
                    def: ValueDef::Node { node, index: i as u32 },
                    name: None,
                });
                id
            })
            .collect();
        self.nodes.push(Node { op, inputs, outputs, attrs, name: None, group: None });
        node
    }

    /// Appends a node with `n_outputs` outputs whose types come from shape inference.
    pub fn add_inferred(
        &mut self,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        attrs: Attrs,
        n_outputs: usize,
    ) -> Result<NodeId, InferError> {
        let types = self.infer_node_types(op, &inputs, &attrs, n_outputs)?;
        Ok(self.add_node(op, inputs, attrs, types))
    }

    /// Convenience: a single-output inferred node, returning its value.
    pub fn add_op(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        attrs: Attrs,
    ) -> Result<ValueId, InferError> {
        let n = self.add_inferred(op, inputs.iter().map(|&v| Some(v)).collect(), attrs, 1)?;
        Ok(self.nodes[n.index()].outputs[0])
    }

    pub fn add_const(&mut self, t: Tensor) -> ValueId {
        let ty = t.ty();
        let n = self.add_node(
            Op::Constant,
            vec![],
            Attrs::new().with("value", Attr::Tensor(t)),
            vec![ty],
        );
        self.nodes[n.index()].outputs[0]
    }

    pub fn add_output(&mut self, name: impl Into<String>, value: ValueId) {
        self.outputs.push(GraphOutput { name: name.into(), value });
    }

    /// Runs shape inference for a prospective node against this graph's values.
    pub fn infer_node_types(
        &self,
        op: Op,
        inputs: &[Option<ValueId>],
        attrs: &Attrs,
        n_outputs: usize,
    ) -> Result<Vec<TensorType>, InferError> {
        let tys: Vec<Option<(&TensorType, Option<&Tensor>)>> =
            inputs.iter().map(|v| v.map(|v| (self.ty(v), self.const_value(v)))).collect();
        infer_types(op, attrs, &tys, n_outputs)
    }

    /// The node defining `v`, if any.
    pub fn producer(&self, v: ValueId) -> Option<NodeId> {
        match self.values[v.index()].def {
            ValueDef::Node { node, .. } => Some(node),
            ValueDef::Input(_) => None,
        }
    }

    /// The tensor of a value defined by a `constant` node.
    pub fn const_value(&self, v: ValueId) -> Option<&Tensor> {
        let n = self.producer(v)?;
        // `get`: the verifier asks this of graphs it has not yet found well formed.
        let node = self.nodes.get(n.index())?;
        if node.op == Op::Constant { node.attrs.tensor("value") } else { None }
    }

    /// For every value, the nodes using it (in node order, one entry per use).
    pub fn uses(&self) -> Vec<Vec<NodeId>> {
        let mut uses = vec![Vec::new(); self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for v in n.input_values() {
                uses[v.index()].push(NodeId(i as u32));
            }
        }
        uses
    }

    /// For every value, how many uses it has (one per use, as [`Graph::uses`] lists them):
    /// for passes that only count, without a vector per value.
    pub fn use_counts(&self) -> Vec<u32> {
        let mut counts = vec![0u32; self.values.len()];
        for n in &self.nodes {
            for v in n.input_values() {
                counts[v.index()] += 1;
            }
        }
        counts
    }

    /// Whether `v` is a graph output.
    pub fn is_output(&self, v: ValueId) -> bool {
        self.outputs.iter().any(|o| o.value == v)
    }

    /// Whether the arena is already in the form [`Graph::rebuild`] produces: graph inputs are
    /// the first values, node outputs follow in node order, every recorded definition agrees,
    /// and every use and graph output reads a value defined before it. Rebuilding such a graph
    /// keeping every node and replacing nothing gives it back unchanged, so a pass that finds
    /// nothing to do in it can return it as is instead of rebuilding and comparing a copy.
    pub fn is_dense(&self) -> bool {
        let value_def = |v: usize| self.values.get(v).map(|x| x.def);
        for (k, &v) in self.inputs.iter().enumerate() {
            if v.index() != k || value_def(k) != Some(ValueDef::Input(k as u32)) {
                return false;
            }
        }
        let mut next = self.inputs.len();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.input_values().any(|v| v.index() >= next) {
                return false;
            }
            for (k, &o) in n.outputs.iter().enumerate() {
                let def = ValueDef::Node { node: NodeId(i as u32), index: k as u32 };
                if o.index() != next || value_def(next) != Some(def) {
                    return false;
                }
                next += 1;
            }
        }
        next == self.values.len() && self.outputs.iter().all(|o| o.value.index() < next)
    }

    /// Whether some use or graph output reads a value `replace` redirects (what
    /// [`Graph::rebuild`] would rewire).
    pub fn reads_replaced(&self, replace: &[Option<ValueId>]) -> bool {
        let moved = |v: ValueId| replace.get(v.index()).copied().flatten().is_some_and(|r| r != v);
        self.nodes.iter().any(|n| n.input_values().any(moved))
            || self.outputs.iter().any(|o| moved(o.value))
    }

    /// In place, what [`Graph::rebuild`] keeping every node does to a dense graph
    /// ([`Graph::is_dense`]): uses and graph outputs read through `replace`. Values keep their
    /// numbers there, so no copy of the arena is needed.
    pub fn redirect_uses(&mut self, replace: &[Option<ValueId>]) {
        debug_assert!(self.is_dense(), "renumbering needs rebuild");
        for n in &mut self.nodes {
            for v in n.inputs.iter_mut().flatten() {
                *v = resolve(replace, *v);
            }
        }
        for o in &mut self.outputs {
            o.value = resolve(replace, o.value);
        }
    }

    /// Appends a copy of `src`'s graph input `v` (name and type).
    pub fn copy_input(&mut self, src: &Graph, v: ValueId) -> ValueId {
        let val = src.value(v);
        let id = self.add_input(String::new(), val.ty.clone());
        self.values[id.index()].name = val.name.clone();
        id
    }

    /// Appends a copy of `src`'s node `n` (op, attributes, name, fusion group, output types
    /// and value names) reading `inputs`, and records each old output's new id in `map`.
    pub fn copy_node(
        &mut self,
        src: &Graph,
        n: &Node,
        inputs: Vec<Option<ValueId>>,
        map: &mut [Option<ValueId>],
    ) -> NodeId {
        let tys = n.outputs.iter().map(|&o| src.ty(o).clone()).collect();
        let id = self.add_node(n.op, inputs, n.attrs.clone(), tys);
        self.nodes[id.index()].name = n.name.clone();
        self.nodes[id.index()].group = n.group;
        for (k, &old) in n.outputs.iter().enumerate() {
            let new = self.nodes[id.index()].outputs[k];
            map[old.index()] = Some(new);
            self.values[new.index()].name = src.value(old).name.clone();
        }
        id
    }

    /// Rebuilds the graph keeping only `keep[n]` nodes, with values renumbered densely and
    /// uses remapped through `replace` first (value → replacement value). Used by passes.
    pub fn rebuild(&self, keep: &[bool], replace: &[Option<ValueId>]) -> Graph {
        let mut out = Graph::new(self.name.clone());
        let mut map: Vec<Option<ValueId>> = vec![None; self.values.len()];
        for &inp in &self.inputs {
            map[inp.index()] = Some(out.copy_input(self, inp));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            let inputs = n
                .inputs
                .iter()
                .map(|v| v.map(|v| map[resolve(replace, v).index()].expect("use before def")))
                .collect();
            out.copy_node(self, n, inputs, &mut map);
        }
        for o in &self.outputs {
            let v = map[resolve(replace, o.value).index()].expect("graph output removed");
            out.add_output(o.name.clone(), v);
        }
        out
    }

    /// Cuts `nodes` out as a standalone graph: values they read but do not define become
    /// inputs (named after the value, or `%N`), constants they read are copied in, and values
    /// they define that are read elsewhere or are graph outputs become outputs. Returns the
    /// partition and, for its inputs and outputs, the value ids in `self`. Engines that run
    /// partitions (ort, openvino) export this graph.
    pub fn partition(&self, nodes: &[NodeId]) -> Partition {
        let mut inside = vec![false; self.nodes.len()];
        for n in nodes {
            inside[n.index()] = true;
        }
        let defined_inside = |v: ValueId| self.producer(v).is_some_and(|p| inside[p.index()]);
        let mut g = Graph::new(format!("{}.part", self.name));
        let mut map: Vec<Option<ValueId>> = vec![None; self.values.len()];
        let mut inputs = Vec::new();
        let mut sources = Vec::new();
        // Inputs first (definition order keeps the arena invariant), then nodes.
        for (i, n) in self.nodes.iter().enumerate() {
            if !inside[i] {
                continue;
            }
            for v in n.input_values() {
                let is_const = self.const_value(v).is_some();
                if map[v.index()].is_none() && !defined_inside(v) && !is_const {
                    let name = self.value(v).name.clone().unwrap_or_else(|| v.to_string());
                    map[v.index()] = Some(g.add_input(name, self.ty(v).clone()));
                    inputs.push(v);
                }
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if !inside[i] {
                continue;
            }
            for v in n.input_values() {
                if map[v.index()].is_none() {
                    let t = self
                        .const_value(v)
                        .expect("outside non-constant values are inputs")
                        .clone();
                    map[v.index()] = Some(g.add_const(t));
                    sources.push(None);
                }
            }
            let ins =
                n.inputs.iter().map(|v| v.map(|v| map[v.index()].expect("mapped above"))).collect();
            g.copy_node(self, n, ins, &mut map);
            sources.push(Some(NodeId(i as u32)));
        }
        let uses = self.uses();
        let mut outputs = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !inside[i] {
                continue;
            }
            for &o in &n.outputs {
                let used_outside = uses[o.index()].iter().any(|u| !inside[u.index()]);
                if used_outside || self.is_output(o) {
                    let name = self
                        .outputs
                        .iter()
                        .find(|x| x.value == o)
                        .map(|x| x.name.clone())
                        .or_else(|| self.value(o).name.clone())
                        .unwrap_or_else(|| o.to_string());
                    g.add_output(name, map[o.index()].expect("defined inside"));
                    outputs.push(o);
                }
            }
        }
        Partition { graph: g, inputs, outputs, sources }
    }

    /// Stable content hash of the graph's JSON form (plan caches, explanations). The JSON
    /// streams straight into the hasher: no copy of the serialized graph is kept.
    pub fn content_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        struct HashWriter(Sha256);
        impl std::io::Write for HashWriter {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.update(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut w = std::io::BufWriter::with_capacity(8192, HashWriter(Sha256::new()));
        serde_json::to_writer(&mut w, self).expect("graph serializes");
        let w = w.into_inner().unwrap_or_else(|_| unreachable!("hashing cannot fail"));
        w.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}
