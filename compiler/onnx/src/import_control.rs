//! ONNX `If`, `Loop` and `Scan` → SGR-ML control-flow nodes with closed subgraphs.
//!
//! An ONNX subgraph names outer values directly. Before a subgraph is imported, its free
//! names (used, nested subgraphs included, but defined nowhere inside) are collected; each
//! becomes a capture: an input appended to the node, and the matching last input of every
//! subgraph of the node (`xpu_ir::control`).

use std::collections::{HashMap, HashSet};

use xpu_ir::control::MAX_SUBGRAPH_DEPTH;
use xpu_ir::{Attr, Attrs, DType, Graph, Op, TensorType, ValueId};

use crate::OnnxError;
use crate::import::{Binding, Importer, convert_attr, tensor_type};
use crate::proto::{GraphProto, NodeProto, attribute_proto::AttributeType};
use crate::tensor::tensor_from_proto;

/// The names `g` uses but does not define, in order of first use (nested subgraphs'
/// free names count as uses).
fn free_names(g: &GraphProto, depth: usize) -> Result<Vec<String>, String> {
    if depth > MAX_SUBGRAPH_DEPTH {
        return Err(format!("subgraphs nest more than {MAX_SUBGRAPH_DEPTH} deep"));
    }
    let mut defined: HashSet<&str> = HashSet::new();
    defined.extend(g.input.iter().filter_map(|v| v.name.as_deref()));
    defined.extend(g.initializer.iter().filter_map(|t| t.name.as_deref()));
    defined.extend(g.node.iter().flat_map(|n| n.output.iter().map(String::as_str)));
    let mut free = Vec::new();
    let mut seen = HashSet::new();
    let mut use_name = |name: &str, free: &mut Vec<String>| {
        if !name.is_empty() && !defined.contains(name) && seen.insert(name.to_string()) {
            free.push(name.to_string());
        }
    };
    for n in &g.node {
        for i in &n.input {
            use_name(i, &mut free);
        }
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                for name in free_names(sub, depth + 1)? {
                    use_name(&name, &mut free);
                }
            }
        }
    }
    for o in &g.output {
        use_name(o.name.as_deref().unwrap_or_default(), &mut free);
    }
    Ok(free)
}

/// The subgraph attributes a control-flow op has.
fn subgraph_attrs(op: Op) -> &'static [&'static str] {
    match op {
        Op::If => &["then_branch", "else_branch"],
        _ => &["body"],
    }
}

impl<'m> Importer<'m> {
    /// Imports an `If`, `Loop` or `Scan` node.
    pub(crate) fn control(&mut self, node: &'m NodeProto, op: Op) -> Result<(), OnnxError> {
        let name = node.name.clone().unwrap_or_default();
        let op_type = node.op_type.clone().unwrap_or_default();
        let node_err = |message: String| OnnxError::Node {
            node: name.clone(),
            op_type: op_type.clone(),
            message,
        };
        if op == Op::Scan && self.opset < 9 {
            return Err(node_err("Scan-8 (with a batch axis and sequence lengths) is not supported; opset 9 and newer are".into()));
        }
        let mut attrs = Attrs::new();
        let mut protos: HashMap<&str, &'m GraphProto> = HashMap::new();
        for a in &node.attribute {
            let aname = a.name.as_deref().unwrap_or_default();
            if a.r#type == Some(AttributeType::Graph as i32) || a.g.is_some() {
                let Some(&key) = subgraph_attrs(op).iter().find(|k| **k == aname) else {
                    return Err(node_err(format!("{op_type} has no subgraph attribute `{aname}`")));
                };
                protos.insert(
                    key,
                    a.g.as_ref().ok_or_else(|| node_err(format!("`{aname}` holds no graph")))?,
                );
                continue;
            }
            let v = convert_attr(a).map_err(|m| node_err(format!("attribute `{aname}`: {m}")))?;
            attrs.set(aname, v);
        }
        let mut inputs = self.node_inputs(node).map_err(|e| node_err(e.to_string()))?;
        if op == Op::Loop {
            inputs.resize(inputs.len().max(2), None);
        }
        // The captures: every subgraph's free names, in order, each bound out here.
        let mut capture_names: Vec<String> = Vec::new();
        for key in subgraph_attrs(op) {
            let proto = protos
                .get(key)
                .ok_or_else(|| node_err(format!("attribute `{key}` (a graph) is required")))?;
            for n in free_names(proto, self.depth + 1).map_err(node_err)? {
                if !capture_names.contains(&n) {
                    capture_names.push(n);
                }
            }
        }
        let mut captures: Vec<(String, ValueId)> = Vec::with_capacity(capture_names.len());
        for n in capture_names {
            let v = self.lookup(&n).map_err(|_| {
                node_err(format!("a subgraph uses `{n}`, which no enclosing graph defines"))
            })?;
            captures.push((n, v));
        }
        let formal =
            self.formal_inputs(op, &attrs, &inputs, node.output.len()).map_err(node_err)?;
        for key in subgraph_attrs(op) {
            let g = self.subgraph(protos[key], &formal, &captures)?;
            attrs.set(key, Attr::Graph(Box::new(g)));
        }
        if op != Op::If {
            attrs.set("captures", Attr::Int(captures.len() as i64));
        }
        inputs.extend(captures.iter().map(|(_, v)| Some(*v)));
        let id = self
            .g
            .add_inferred(op, inputs, attrs, node.output.len())
            .map_err(|e| node_err(e.message))?;
        self.finish_node(node, id, &name);
        Ok(())
    }

    /// The types of a subgraph's own inputs (before its captures), for subgraph inputs the
    /// model declares without a type: the iteration number and condition of a loop, the
    /// carried values and the slices of the scan inputs.
    fn formal_inputs(
        &self,
        op: Op,
        attrs: &Attrs,
        inputs: &[Option<ValueId>],
        n_outputs: usize,
    ) -> Result<Vec<TensorType>, String> {
        let ty = |v: Option<ValueId>| -> Result<TensorType, String> {
            v.map(|v| self.g.ty(v).clone()).ok_or_else(|| "an input is omitted".to_string())
        };
        Ok(match op {
            Op::If => Vec::new(),
            Op::Loop => {
                let mut t =
                    vec![TensorType::new(DType::I64, vec![]), TensorType::new(DType::Bool, vec![])];
                // A loop-carried value may change its shape from one iteration to the next:
                // unless the model declares its shape, the body takes any.
                for &v in &inputs[2..] {
                    t.push(TensorType::unranked(ty(v)?.dtype));
                }
                t
            }
            _ => {
                let m = xpu_ir::control::scan_parts(attrs, inputs.len(), n_outputs)?.scan_inputs;
                let states = inputs.len() - m;
                let axes = xpu_ir::control::per_scan(attrs, "scan_input_axes", m)?;
                let mut t = Vec::with_capacity(inputs.len());
                for &v in &inputs[..states] {
                    t.push(ty(v)?);
                }
                for (j, &v) in inputs[states..].iter().enumerate() {
                    t.push(xpu_ir::control::slice_type(&ty(v)?, axes[j])?);
                }
                t
            }
        })
    }

    /// Imports one subgraph: its declared inputs (typed from `formal` where the model gives
    /// no type), then one input per capture, then its nodes.
    fn subgraph(
        &self,
        proto: &'m GraphProto,
        formal: &[TensorType],
        captures: &[(String, ValueId)],
    ) -> Result<Graph, OnnxError> {
        let context = format!("subgraph {:?}", proto.name.as_deref().unwrap_or_default());
        let invalid = |m: String| crate::invalid(context.clone(), m);
        if self.depth + 1 > MAX_SUBGRAPH_DEPTH {
            return Err(invalid(format!("subgraphs nest more than {MAX_SUBGRAPH_DEPTH} deep")));
        }
        if proto.input.len() != formal.len() {
            return Err(invalid(format!(
                "declares {} inputs; its node gives it {}",
                proto.input.len(),
                formal.len()
            )));
        }
        let mut child = Importer {
            g: Graph::new(proto.name.clone().unwrap_or_default()),
            env: HashMap::new(),
            opset: self.opset,
            opsets: self.opsets.clone(),
            declared: HashMap::new(),
            depth: self.depth + 1,
        };
        for vi in proto.value_info.iter().chain(&proto.output) {
            if let (Some(n), Some(t)) = (vi.name.as_deref(), vi.r#type.as_ref()) {
                child.declared.insert(n, t);
            }
        }
        for (vi, given) in proto.input.iter().zip(formal) {
            let n = vi.name.clone().unwrap_or_default();
            let declared =
                vi.r#type.as_ref().map(|t| tensor_type(t, &format!("{context} input {n:?}")));
            let ty = match declared {
                Some(Ok(t)) if t.dtype == given.dtype => {
                    // The model's dims where it declares them: any declared shape for a
                    // loop-carried value (given unranked), else where the rank matches.
                    let rank = |t: &TensorType| t.dims.as_ref().map(Vec::len);
                    if rank(&t) == rank(given) || given.dims.is_none() { t } else { given.clone() }
                }
                Some(Ok(t)) => {
                    return Err(invalid(format!(
                        "input {n:?} is declared {t} but is given {given}"
                    )));
                }
                Some(Err(e)) => return Err(e),
                None => given.clone(),
            };
            let v = child.g.add_input(n.clone(), ty);
            child.env.insert(n, Binding::Value(v));
        }
        // A capture is found by its ONNX name but labelled by its place: the outer value's
        // name is not kept through an export (intermediate values are written `vN`), and a
        // label that changed would make import → export → import differ.
        for (k, (n, outer)) in captures.iter().enumerate() {
            let v = child.g.add_input(format!("capture{k}"), self.g.ty(*outer).clone());
            child.env.insert(n.clone(), Binding::Value(v));
        }
        for init in &proto.initializer {
            let n = init.name.clone().unwrap_or_default();
            let t = tensor_from_proto(init, &format!("{context} initializer {n:?}"))?;
            child.env.insert(n, Binding::Pending(t));
        }
        child.nodes_and_outputs(proto, &format!("{context} "))?;
        Ok(child.g)
    }
}
