//! SGR-ML graph -> ONNX ModelProto bytes.

use std::collections::{HashMap, HashSet};

use prost::Message;
use xpu_ir::{Attr, Dim, Graph, Op, OpClass, TensorType, ValueId};

use crate::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto,
    TypeProto, ValueInfoProto, attribute_proto::AttributeType, tensor_shape_proto, type_proto,
};
use crate::tensor::{dtype_to_onnx, tensor_to_proto};

/// The default-domain opset exported graphs declare unless an op needs a newer one: SGR-ML
/// ops follow these semantics, and runtimes of this era (ORT 1.31, OpenVINO 2026) accept it.
pub const EXPORT_OPSET: i64 = 21;
/// The ONNX IR version that goes with [`EXPORT_OPSET`].
pub const EXPORT_IR_VERSION: i64 = 10;

/// The oldest default-domain opset that has `node` with its inputs, attributes and element
/// types (only ops introduced or extended after [`EXPORT_OPSET`] are listed; `g` gives the
/// input dtypes).
fn required_opset(g: &Graph, node: &xpu_ir::Node) -> i64 {
    let dtype = node.inputs.first().copied().flatten().map(|v| g.ty(v).dtype);
    let half = matches!(dtype, Some(xpu_ir::DType::F16 | xpu_ir::DType::BF16));
    let bf16 = dtype == Some(xpu_ir::DType::BF16);
    let signed = dtype.is_some_and(|d| d.is_signed_int());
    // The opset that added each low-precision type to Cast, Q/DQ and the movement ops.
    let types = node
        .inputs
        .iter()
        .flatten()
        .chain(&node.outputs)
        .map(|&v| match g.ty(v).dtype {
            xpu_ir::DType::F4E2M1 => 23,
            xpu_ir::DType::F8E8M0 => 24,
            xpu_ir::DType::I2 | xpu_ir::DType::U2 => 25,
            _ => EXPORT_OPSET,
        })
        .max()
        .unwrap_or(EXPORT_OPSET);
    let attrs = if node.attrs.get("round_mode").is_some() { 24 } else { EXPORT_OPSET };
    types.max(attrs).max(match node.op {
        // An opaque node keeps the default-domain opset its model had.
        Op::OnnxOp if node.attrs.str("domain", "").is_empty() => {
            node.attrs.int("opset", EXPORT_OPSET)
        }
        Op::BitShift if signed => 28,
        Op::Einsum | Op::ReverseSequence | Op::Compress if bf16 => 28,
        Op::Celu if half => 28,
        // Pool-22 drops a last ceil-mode window that starts in the padding (SGR-ML's rule).
        Op::MaxPool | Op::AveragePool | Op::LpPool if node.attrs.int("ceil_mode", 0) != 0 => 22,
        Op::OneHot
            if node
                .inputs
                .get(2)
                .copied()
                .flatten()
                .is_some_and(|v| g.ty(v).dtype == xpu_ir::DType::BF16) =>
        {
            28
        }
        Op::Range if half => 27,
        Op::Elu if bf16 => 22,
        Op::Attention
            if node.attrs.get("left_window_size").is_some()
                || node.attrs.get("right_window_size").is_some() =>
        {
            25
        }
        Op::Attention if node.inputs.len() >= 7 => 24,
        Op::Attention | Op::RmsNormalization | Op::RotaryEmbedding => 23,
        Op::QuantizeLinear if node.attrs.get("precision").is_some() => 23,
        Op::Swish => 24,
        Op::CumProd | Op::BitCast => 26,
        Op::LinearAttention | Op::CausalConvWithState => 27,
        Op::TensorScatter => 24,
        Op::SpaceToDepth if node.attrs.get("mode").is_some() => 28,
        Op::Unique if bf16 => 28,
        _ => EXPORT_OPSET,
    })
}

/// The other domains opaque nodes use (`ai.onnx.ml`, …), each at the highest opset a node
/// of it had.
fn other_domains(g: &Graph) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = Vec::new();
    other_domains_into(g, &mut out);
    out
}

/// [`other_domains`] of `g` and its subgraphs, added to `out`.
fn other_domains_into(g: &Graph, out: &mut Vec<(String, i64)>) {
    for (_, sub) in g.nodes.iter().flat_map(|n| n.attrs.graphs()) {
        other_domains_into(sub, out);
    }
    for n in g.nodes.iter().filter(|n| n.op == Op::OnnxOp) {
        let domain = n.attrs.str("domain", "");
        if domain.is_empty() {
            continue;
        }
        let v = n.attrs.int("opset", 1);
        match out.iter_mut().find(|(d, _)| d == domain) {
            Some((_, have)) => *have = (*have).max(v),
            None => out.push((domain.to_string(), v)),
        }
    }
}

/// The ONNX IR version that an opset was released with (onnx.helper.VERSION_TABLE).
fn ir_version_for(opset: i64) -> i64 {
    match opset {
        ..=22 => EXPORT_IR_VERSION,
        23 => 11,
        24 => 12,
        25..=27 => 13,
        _ => 14,
    }
}

fn type_proto(t: &TensorType) -> TypeProto {
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(dtype_to_onnx(t.dtype)),
            shape: t.dims.as_ref().map(|dims| TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|d| tensor_shape_proto::Dimension {
                        denotation: None,
                        value: match d {
                            Dim::Known(n) => {
                                Some(tensor_shape_proto::dimension::Value::DimValue(*n as i64))
                            }
                            Dim::Sym(s) => {
                                Some(tensor_shape_proto::dimension::Value::DimParam(s.clone()))
                            }
                            Dim::Unknown => None,
                        },
                    })
                    .collect(),
            }),
        })),
        denotation: None,
    }
}

fn value_info(name: &str, t: &TensorType) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(type_proto(t)),
        ..Default::default()
    }
}

/// An attribute; `subgraph` writes a subgraph attribute's graph (it needs its node's names).
fn attr_proto(
    name: &str,
    a: &Attr,
    subgraph: &mut dyn FnMut(&Graph) -> GraphProto,
) -> AttributeProto {
    let mut p = AttributeProto { name: Some(name.to_string()), ..Default::default() };
    let ty = match a {
        Attr::Int(v) => {
            p.i = Some(*v);
            AttributeType::Int
        }
        Attr::Float(v) => {
            p.f = Some(*v as f32);
            AttributeType::Float
        }
        Attr::Str(s) => {
            p.s = Some(s.as_bytes().to_vec());
            AttributeType::String
        }
        Attr::Ints(v) => {
            p.ints = v.clone();
            AttributeType::Ints
        }
        Attr::Floats(v) => {
            p.floats = v.iter().map(|&x| x as f32).collect();
            AttributeType::Floats
        }
        Attr::Strs(v) => {
            p.strings = v.iter().map(|s| s.as_bytes().to_vec()).collect();
            AttributeType::Strings
        }
        Attr::Tensor(t) => {
            p.t = Some(tensor_to_proto(t, ""));
            AttributeType::Tensor
        }
        Attr::DType(d) => {
            p.i = Some(dtype_to_onnx(*d) as i64);
            AttributeType::Int
        }
        // Only table ops carry row expressions and they have no ONNX form; written as their
        // SGR-ML text so nothing is lost should one ever be exported.
        Attr::Row(e) => {
            p.s = Some(e.to_string().into_bytes());
            AttributeType::String
        }
        Attr::Graph(g) => {
            p.g = Some(subgraph(g));
            AttributeType::Graph
        }
    };
    p.r#type = Some(ty as i32);
    p
}

/// Serialises a graph as an ONNX model at [`EXPORT_OPSET`], or at the newer opset an op in
/// it requires. Constants become initializers;
/// graph outputs keep their names (an `Identity` is added when an output name cannot name
/// the value itself: a graph input, a constant or a value exported twice). Subgraphs of
/// control-flow nodes are written as ONNX subgraphs: their captures become references to the
/// outer values' names.
pub fn export_model(g: &Graph) -> Vec<u8> {
    let graph = graph_proto(g, "", &[], &mut HashSet::new(), true);
    let opset = max_required_opset(g);
    let model = ModelProto {
        ir_version: Some(ir_version_for(opset)),
        producer_name: Some("xpu".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        opset_import: std::iter::once((String::new(), opset))
            .chain(other_domains(g))
            .map(|(domain, version)| OperatorSetIdProto {
                domain: Some(domain),
                version: Some(version),
            })
            .collect(),
        graph: Some(graph),
        ..Default::default()
    };
    model.encode_to_vec()
}

/// The newest opset any node of `g` or of its subgraphs needs.
fn max_required_opset(g: &Graph) -> i64 {
    g.nodes
        .iter()
        .map(|n| {
            let nested = n.attrs.graphs().map(|(_, sub)| max_required_opset(sub)).max();
            required_opset(g, n).max(nested.unwrap_or(EXPORT_OPSET))
        })
        .max()
        .unwrap_or(EXPORT_OPSET)
        .max(EXPORT_OPSET)
}

/// The ONNX graph of `g`. Value names start with `prefix` (empty for the model's graph, so
/// its names are as they always were); the last `captured.len()` inputs of a subgraph are
/// the node's captures and are written as references to those outer names, not as inputs.
///
/// A subgraph's inputs and outputs keep their own names where no other value of the model
/// has them yet (`used`), so import → export → import gives the same graph.
///
/// `shapes`: whether its inputs and outputs declare their shapes. The branches of an `if`
/// declare element types only: ONNX infers a branch's shapes from the outer values it reads,
/// and the branch not taken may compute shapes the taken one never would.
fn graph_proto(
    g: &Graph,
    prefix: &str,
    captured: &[String],
    used: &mut HashSet<String>,
    shapes: bool,
) -> GraphProto {
    let mut names: Vec<String> = (0..g.values.len()).map(|i| format!("{prefix}v{i}")).collect();
    let mut output_count: HashMap<ValueId, usize> = HashMap::new();
    for o in &g.outputs {
        *output_count.entry(o.value).or_default() += 1;
    }
    let mut renamed_outputs = std::collections::HashSet::new();
    for o in &g.outputs {
        // Node outputs and constants (initializers) can carry the output's name directly.
        if g.producer(o.value).is_some() && output_count[&o.value] == 1 {
            names[o.value.index()] = claim_name(&o.name, prefix, used);
            renamed_outputs.insert(o.value);
        }
    }
    let formal = g.inputs.len().saturating_sub(captured.len());
    for (k, &i) in g.inputs.iter().enumerate() {
        names[i.index()] = match k.checked_sub(formal) {
            Some(c) => captured[c].clone(),
            None => {
                let own = g.value(i).name.clone().unwrap_or_else(|| format!("v{}", i.0));
                claim_name(&own, prefix, used)
            }
        };
    }
    used.extend(names.iter().cloned());
    let mut graph = GraphProto { name: Some(g.name.clone()), ..Default::default() };
    let declared = |t: &TensorType| if shapes { t.clone() } else { TensorType::unranked(t.dtype) };
    for &i in &g.inputs[..formal] {
        graph.input.push(value_info(&names[i.index()], &declared(g.ty(i))));
    }
    for (index, n) in g.nodes.iter().enumerate() {
        if n.op == Op::Constant {
            if let Some(t) = n.attrs.tensor("value") {
                graph.initializer.push(tensor_to_proto(t, &names[n.outputs[0].index()]));
            }
            continue;
        }
        graph.node.push(node_proto(n, &names, &format!("{prefix}n{index}."), used));
    }
    for o in &g.outputs {
        let out_name = if renamed_outputs.contains(&o.value) {
            names[o.value.index()].clone()
        } else {
            claim_name(&o.name, prefix, used)
        };
        if !renamed_outputs.contains(&o.value) {
            graph.node.push(NodeProto {
                op_type: Some("Identity".into()),
                input: vec![names[o.value.index()].clone()],
                output: vec![out_name.clone()],
                ..Default::default()
            });
        }
        graph.output.push(value_info(&out_name, &declared(g.ty(o.value))));
    }
    graph
}

/// `name` for a value of the graph written with `prefix`: as it is in the model's own graph
/// (empty prefix) or where no other value has it yet, else prefixed.
fn claim_name(name: &str, prefix: &str, used: &mut HashSet<String>) -> String {
    let mut claimed = name.to_string();
    if !prefix.is_empty() {
        let mut k = 0;
        while used.contains(&claimed) {
            claimed =
                if k == 0 { format!("{prefix}{name}") } else { format!("{prefix}{name}.{k}") };
            k += 1;
        }
    }
    used.insert(claimed.clone());
    claimed
}

/// One node; `prefix` names the values of its subgraphs.
fn node_proto(
    n: &xpu_ir::Node,
    names: &[String],
    prefix: &str,
    used: &mut HashSet<String>,
) -> NodeProto {
    let opaque = n.op == Op::OnnxOp;
    // A control-flow node's captures travel inside its subgraphs, by name, not as inputs.
    let own_inputs = n.inputs.len() - xpu_ir::control::capture_count(n);
    let captures: Vec<String> =
        n.inputs[own_inputs..].iter().flatten().map(|v| names[v.index()].clone()).collect();
    let mut attribute = Vec::with_capacity(n.attrs.0.len());
    for (k, a) in n.attrs.iter() {
        let xpu_only = (opaque && matches!(k.as_str(), "op_type" | "domain" | "opset"))
            || (n.op.class() == OpClass::Control && k == "captures");
        if xpu_only {
            continue;
        }
        let shapes = n.op != Op::If;
        let prefix = format!("{prefix}{k}.");
        let mut subgraph = |sub: &Graph| graph_proto(sub, &prefix, &captures, used, shapes);
        attribute.push(attr_proto(k, a, &mut subgraph));
    }
    // Split-18+ needs `num_outputs` when no sizes are given (older Split implied it).
    if n.op == Op::Split
        && n.inputs.get(1).copied().flatten().is_none()
        && n.attrs.get("num_outputs").is_none()
    {
        let count = Attr::Int(n.outputs.len() as i64);
        attribute.push(attr_proto("num_outputs", &count, &mut |_| GraphProto::default()));
    }
    let (op_type, domain) = if opaque {
        let domain = n.attrs.str("domain", "").to_string();
        (n.attrs.str("op_type", "").to_string(), Some(domain))
    } else {
        (n.op.info().onnx.to_string(), None)
    };
    NodeProto {
        op_type: Some(op_type),
        domain: domain.filter(|d| !d.is_empty()),
        name: n.name.clone(),
        input: n.inputs[..own_inputs]
            .iter()
            .map(|v| v.map(|v| names[v.index()].clone()).unwrap_or_default())
            .collect(),
        output: n.outputs.iter().map(|v| names[v.index()].clone()).collect(),
        attribute,
        ..Default::default()
    }
}
