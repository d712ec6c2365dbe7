//! SGR-ML graph -> ONNX ModelProto bytes.

use std::collections::HashMap;

use prost::Message;
use xpu_ir::{Attr, Dim, Graph, Op, TensorType, ValueId};

use crate::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto,
    TypeProto, ValueInfoProto, attribute_proto::AttributeType, tensor_shape_proto, type_proto,
};
use crate::tensor::{dtype_to_onnx, tensor_to_proto};

/// The default-domain opset exported graphs declare: SGR-ML ops follow these semantics.
pub const EXPORT_OPSET: i64 = 21;
/// The ONNX IR version that goes with [`EXPORT_OPSET`].
pub const EXPORT_IR_VERSION: i64 = 10;

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

fn attr_proto(name: &str, a: &Attr) -> AttributeProto {
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
    };
    p.r#type = Some(ty as i32);
    p
}

/// Serialises a graph as an ONNX model at [`EXPORT_OPSET`]. Constants become initializers;
/// graph outputs keep their names (an `Identity` is added when an output name cannot name
/// the value itself: a graph input, a constant or a value exported twice).
pub fn export_model(g: &Graph) -> Vec<u8> {
    let mut names: Vec<String> = (0..g.values.len()).map(|i| format!("v{i}")).collect();
    let mut output_count: HashMap<ValueId, usize> = HashMap::new();
    for o in &g.outputs {
        *output_count.entry(o.value).or_default() += 1;
    }
    let mut renamed_outputs = std::collections::HashSet::new();
    for o in &g.outputs {
        // Node outputs and constants (initializers) can carry the output's name directly.
        if g.producer(o.value).is_some() && output_count[&o.value] == 1 {
            names[o.value.index()] = o.name.clone();
            renamed_outputs.insert(o.value);
        }
    }
    for &i in &g.inputs {
        names[i.index()] = g.value(i).name.clone().unwrap_or_else(|| format!("v{}", i.0));
    }
    let mut graph = GraphProto { name: Some(g.name.clone()), ..Default::default() };
    for &i in &g.inputs {
        graph.input.push(value_info(&names[i.index()], g.ty(i)));
    }
    for n in &g.nodes {
        if n.op == Op::Constant {
            if let Some(t) = n.attrs.tensor("value") {
                graph.initializer.push(tensor_to_proto(t, &names[n.outputs[0].index()]));
            }
            continue;
        }
        graph.node.push(NodeProto {
            op_type: Some(n.op.info().onnx.to_string()),
            name: n.name.clone(),
            input: n
                .inputs
                .iter()
                .map(|v| v.map(|v| names[v.index()].clone()).unwrap_or_default())
                .collect(),
            output: n.outputs.iter().map(|v| names[v.index()].clone()).collect(),
            attribute: n.attrs.iter().map(|(k, a)| attr_proto(k, a)).collect(),
            ..Default::default()
        });
    }
    for o in &g.outputs {
        if !renamed_outputs.contains(&o.value) {
            graph.node.push(NodeProto {
                op_type: Some("Identity".into()),
                input: vec![names[o.value.index()].clone()],
                output: vec![o.name.clone()],
                ..Default::default()
            });
        }
        graph.output.push(value_info(&o.name, g.ty(o.value)));
    }
    let model = ModelProto {
        ir_version: Some(EXPORT_IR_VERSION),
        producer_name: Some("xpu".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(EXPORT_OPSET),
        }],
        graph: Some(graph),
        ..Default::default()
    };
    model.encode_to_vec()
}
