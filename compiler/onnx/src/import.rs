//! ONNX ModelProto -> SGR-ML graph.

use std::collections::HashMap;

use prost::Message;
use xpu_ir::{Attr, Attrs, DType, Dim, Graph, Op, Tensor, TensorType, ValueId};

use crate::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, TypeProto, ValueInfoProto,
    attribute_proto::AttributeType, type_proto,
};
use crate::tensor::{dtype_from_onnx, onnx_type_name, tensor_from_proto};
use crate::{OnnxError, invalid};

/// Imports ONNX model bytes.
pub fn import_model(bytes: &[u8]) -> Result<Graph, OnnxError> {
    let model = ModelProto::decode(bytes)?;
    import_model_proto(&model)
}

/// A value known by ONNX name: either materialised in the graph or a constant waiting for
/// its first use (so constants appear in first-use order and round trips are stable).
#[derive(Clone)]
pub(crate) enum Binding {
    Value(ValueId),
    Pending(Tensor),
}

pub(crate) struct Importer<'m> {
    pub(crate) g: Graph,
    pub(crate) env: HashMap<String, Binding>,
    pub(crate) opset: i64,
    /// Every domain's opset version (`""` for the default domain).
    pub(crate) opsets: HashMap<String, i64>,
    pub(crate) declared: HashMap<&'m str, &'m TypeProto>,
    /// How many subgraphs enclose the graph being imported.
    pub(crate) depth: usize,
}

/// Imports a decoded model.
pub fn import_model_proto(model: &ModelProto) -> Result<Graph, OnnxError> {
    let graph = model.graph.as_ref().ok_or(OnnxError::NoGraph)?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
        .unwrap_or(1);
    let mut imp = Importer {
        g: Graph::new(graph.name.clone().unwrap_or_default()),
        env: HashMap::new(),
        opset,
        opsets: model
            .opset_import
            .iter()
            .map(|o| {
                let d = o.domain.clone().unwrap_or_default();
                (if d == "ai.onnx" { String::new() } else { d }, o.version.unwrap_or(1))
            })
            .collect(),
        declared: HashMap::new(),
        depth: 0,
    };
    for vi in graph.value_info.iter().chain(&graph.output) {
        if let (Some(name), Some(ty)) = (vi.name.as_deref(), vi.r#type.as_ref()) {
            imp.declared.insert(name, ty);
        }
    }
    imp.graph(graph)?;
    Ok(imp.g)
}

fn value_info_type(vi: &ValueInfoProto, context: &str) -> Result<TensorType, OnnxError> {
    let ty = vi.r#type.as_ref().ok_or_else(|| invalid(context, "has no type"))?;
    tensor_type(ty, context)
}

pub(crate) fn tensor_type(ty: &TypeProto, context: &str) -> Result<TensorType, OnnxError> {
    match &ty.value {
        Some(type_proto::Value::TensorType(t)) => {
            let code = t.elem_type.unwrap_or(0);
            let dtype = dtype_from_onnx(code).ok_or_else(|| OnnxError::UnsupportedDType {
                context: context.to_string(),
                name: onnx_type_name(code),
            })?;
            let dims =
                t.shape.as_ref().map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(crate::proto::tensor_shape_proto::dimension::Value::DimValue(
                                n,
                            )) if *n >= 0 => Dim::Known(*n as u64),
                            Some(crate::proto::tensor_shape_proto::dimension::Value::DimParam(
                                p,
                            )) if !p.is_empty() => Dim::Sym(sanitize_symbol(p)),
                            _ => Dim::Unknown,
                        })
                        .collect()
                });
            Ok(TensorType { dtype, dims })
        }
        Some(type_proto::Value::SequenceType(_)) => {
            Err(invalid(context, "sequence values are not supported (tensors only)"))
        }
        Some(type_proto::Value::OptionalType(_)) => {
            Err(invalid(context, "optional values are not supported (tensors only)"))
        }
        Some(type_proto::Value::MapType(_)) => {
            Err(invalid(context, "map values are not supported (tensors only)"))
        }
        Some(_) => Err(invalid(context, "only tensor values are supported")),
        None => Err(invalid(context, "has no type")),
    }
}

/// Symbols in the text form are identifiers; other characters become `_`.
fn sanitize_symbol(p: &str) -> String {
    let mut s: String = p
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c } else { '_' })
        .collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        s.insert(0, '_');
    }
    s
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::from_vec(vec![v.len()], v.to_vec()).expect("1-D length matches")
}

impl<'m> Importer<'m> {
    fn graph(&mut self, graph: &'m GraphProto) -> Result<(), OnnxError> {
        for init in &graph.initializer {
            let name = init.name.clone().unwrap_or_default();
            let t = tensor_from_proto(init, &format!("initializer {name:?}"))?;
            self.env.insert(name, Binding::Pending(t));
        }
        if !graph.sparse_initializer.is_empty() {
            return Err(invalid("graph", "sparse initializers are not supported"));
        }
        for vi in &graph.input {
            let name = vi.name.clone().unwrap_or_default();
            if self.env.contains_key(&name) {
                continue; // an initializer with a declared input: a constant here
            }
            let ty = value_info_type(vi, &format!("graph input {name:?}"))?;
            let v = self.g.add_input(name.clone(), ty);
            self.env.insert(name, Binding::Value(v));
        }
        self.nodes_and_outputs(graph, "graph ")
    }

    /// Imports `graph`'s nodes, then binds its outputs; `context` names the graph in errors.
    pub(crate) fn nodes_and_outputs(
        &mut self,
        graph: &'m GraphProto,
        context: &str,
    ) -> Result<(), OnnxError> {
        for node in &graph.node {
            self.node(node)?;
        }
        for vi in &graph.output {
            let name = vi.name.clone().unwrap_or_default();
            let v = self.lookup(&name).map_err(|_| {
                invalid(
                    format!("{context}output {name:?}"),
                    "is not produced by any node, input or initializer",
                )
            })?;
            self.g.add_output(name, v);
        }
        Ok(())
    }

    /// A node's inputs by name; an empty name is an omitted input.
    pub(crate) fn node_inputs(
        &mut self,
        node: &NodeProto,
    ) -> Result<Vec<Option<ValueId>>, OnnxError> {
        node.input
            .iter()
            .map(|i| if i.is_empty() { Ok(None) } else { self.lookup(i).map(Some) })
            .collect()
    }

    pub(crate) fn lookup(&mut self, name: &str) -> Result<ValueId, OnnxError> {
        match self.env.get(name).cloned() {
            Some(Binding::Value(v)) => Ok(v),
            Some(Binding::Pending(t)) => {
                let v = self.g.add_const(t);
                self.g.values[v.index()].name = Some(name.to_string());
                self.env.insert(name.to_string(), Binding::Value(v));
                Ok(v)
            }
            None => Err(invalid(format!("value {name:?}"), "is used but never defined")),
        }
    }

    pub(crate) fn node(&mut self, node: &'m NodeProto) -> Result<(), OnnxError> {
        let op_type = node.op_type.clone().unwrap_or_default();
        let domain = node.domain.clone().unwrap_or_default();
        let name = node.name.clone().unwrap_or_default();
        let opset = self.opset;
        let unsupported = || OnnxError::UnsupportedOp {
            op_type: op_type.clone(),
            domain: domain.clone(),
            node: name.clone(),
            opset,
        };
        if !(domain.is_empty() || domain == "ai.onnx") {
            return self.opaque(node, &op_type, &domain, unsupported);
        }
        let node_err = |message: String| OnnxError::Node {
            node: name.clone(),
            op_type: op_type.clone(),
            message,
        };
        let control = match op_type.as_str() {
            "If" => Some(Op::If),
            "Loop" => Some(Op::Loop),
            "Scan" => Some(Op::Scan),
            _ => None,
        };
        if let Some(op) = control {
            return self.control(node, op);
        }

        let mut attrs = Attrs::new();
        for a in &node.attribute {
            let aname = a.name.clone().unwrap_or_default();
            let v = convert_attr(a).map_err(|m| node_err(format!("attribute `{aname}`: {m}")))?;
            attrs.set(&aname, v);
        }
        let mut inputs = self.node_inputs(node).map_err(|e| node_err(e.to_string()))?;
        // Trailing omitted inputs carry no meaning.
        while inputs.last() == Some(&None) {
            inputs.pop();
        }
        let n_out = node.output.len();

        if op_type == "SwiGLU" {
            return self.swiglu(node, &attrs, &inputs, &name);
        }
        if op_type == "Constant" {
            let t = constant_value(&attrs).map_err(node_err)?;
            let out = node.output.first().cloned().unwrap_or_default();
            self.env.insert(out, Binding::Pending(t));
            return Ok(());
        }

        let op = match op_type.as_str() {
            "Upsample" => Op::Resize,
            "Scatter" => Op::ScatterElements,
            other => match Op::from_onnx(other) {
                Some(op) => op,
                None => return self.opaque(node, &op_type, "", unsupported),
            },
        };
        // Opset normalisation: everything below rewrites older forms into the newest one.
        let const_input = |this: &mut Self, t: Tensor| Some(this.g.add_const(t));
        let to_dtype = |attrs: &mut Attrs, key: &str| -> Result<(), OnnxError> {
            if let Some(Attr::Int(code)) = attrs.get(key).cloned() {
                let d =
                    dtype_from_onnx(code as i32).ok_or_else(|| OnnxError::UnsupportedDType {
                        context: format!("node {name:?} ({op_type}) attribute `{key}`"),
                        name: onnx_type_name(code as i32),
                    })?;
                attrs.set(key, Attr::DType(d));
            }
            if let Some(Attr::Str(s)) = attrs.get(key).cloned() {
                // Cast-1 spelled the type as a string.
                let code = crate::proto::tensor_proto::DataType::from_str_name(&s.to_uppercase())
                    .map(|d| d as i32)
                    .unwrap_or(0);
                let d = dtype_from_onnx(code).ok_or_else(|| OnnxError::UnsupportedDType {
                    context: format!("node {name:?} ({op_type})"),
                    name: s.clone(),
                })?;
                attrs.set(key, Attr::DType(d));
            }
            Ok(())
        };
        let move_ints_attr_to_input = |this: &mut Self,
                                       attrs: &mut Attrs,
                                       key: &str,
                                       inputs: &mut Vec<Option<ValueId>>,
                                       at: usize| {
            if let Some(Attr::Ints(v)) = attrs.0.remove(key) {
                while inputs.len() < at {
                    inputs.push(None);
                }
                let c = const_input(this, i64s(&v));
                if inputs.len() == at {
                    inputs.push(c);
                } else {
                    inputs[at] = c;
                }
            }
        };
        for k in ["consumed_inputs", "is_test", "spatial"] {
            attrs.0.remove(k);
        }
        if opset < 7 && attrs.get("broadcast").is_some() {
            return Err(node_err("opset < 7 broadcast attributes are not supported".into()));
        }
        attrs.0.remove("broadcast");
        match op {
            Op::Cast | Op::BitCast => to_dtype(&mut attrs, "to")?,
            // DCR is SpaceToDepth's only order before opset 28: drop it so exports stay older.
            Op::SpaceToDepth if attrs.str("mode", "DCR") == "DCR" => {
                attrs.0.remove("mode");
            }
            Op::EyeLike => to_dtype(&mut attrs, "dtype")?,
            Op::HannWindow | Op::HammingWindow | Op::BlackmanWindow => {
                to_dtype(&mut attrs, "output_datatype")?
            }
            Op::QuantizeLinear | Op::DequantizeLinear => {
                to_dtype(&mut attrs, "output_dtype")?;
                to_dtype(&mut attrs, "precision")?;
            }
            Op::ReduceSum if opset < 13 => {
                move_ints_attr_to_input(self, &mut attrs, "axes", &mut inputs, 1)
            }
            Op::ReduceMean
            | Op::ReduceMax
            | Op::ReduceMin
            | Op::ReduceProd
            | Op::ReduceL1
            | Op::ReduceL2
            | Op::ReduceLogSum
            | Op::ReduceLogSumExp
            | Op::ReduceSumSquare
                if opset < 18 =>
            {
                move_ints_attr_to_input(self, &mut attrs, "axes", &mut inputs, 1)
            }
            Op::Squeeze | Op::Unsqueeze if opset < 13 => {
                move_ints_attr_to_input(self, &mut attrs, "axes", &mut inputs, 1)
            }
            Op::Split => {
                if opset < 13 {
                    move_ints_attr_to_input(self, &mut attrs, "split", &mut inputs, 1);
                }
                // Split without sizes means equal parts, one per output: Split-18's num_outputs.
                if inputs.get(1).copied().flatten().is_none() && attrs.get("num_outputs").is_none()
                {
                    attrs.set("num_outputs", Attr::Int(n_out as i64));
                }
            }
            Op::Slice if opset < 10 => {
                let starts = attrs.0.remove("starts");
                let ends = attrs.0.remove("ends");
                let axes = attrs.0.remove("axes");
                for (k, a) in [starts, ends, axes].into_iter().enumerate() {
                    if let Some(Attr::Ints(v)) = a {
                        let c = const_input(self, i64s(&v));
                        inputs.push(c);
                    } else if k < 2 {
                        return Err(node_err("Slice-1 needs `starts` and `ends`".into()));
                    }
                }
            }
            Op::TopK if opset < 10 => {
                let k = attrs
                    .0
                    .remove("k")
                    .and_then(|a| if let Attr::Int(k) = a { Some(k) } else { None })
                    .ok_or_else(|| node_err("TopK-1 needs `k`".into()))?;
                let c = const_input(self, i64s(&[k]));
                inputs.push(c);
            }
            Op::Pad if opset < 11 => {
                let pads = attrs.0.remove("pads").or_else(|| attrs.0.remove("paddings"));
                let value = attrs.0.remove("value");
                let Some(Attr::Ints(p)) = pads else {
                    return Err(node_err("Pad-2 needs `pads`".into()));
                };
                let c = const_input(self, i64s(&p));
                inputs.push(c);
                let dtype = inputs[0].map(|v| self.g.ty(v).dtype).unwrap_or(DType::F32);
                let v = match value {
                    Some(Attr::Float(f)) => f,
                    Some(Attr::Int(i)) => i as f64,
                    _ => 0.0,
                };
                let c = const_input(self, scalar_of(dtype, v));
                inputs.push(c);
            }
            Op::Clip if opset < 11 => {
                let dtype = inputs[0].map(|v| self.g.ty(v).dtype).unwrap_or(DType::F32);
                let min = attrs
                    .0
                    .remove("min")
                    .map(|a| if let Attr::Float(f) = a { f } else { f64::NEG_INFINITY });
                let max = attrs
                    .0
                    .remove("max")
                    .map(|a| if let Attr::Float(f) = a { f } else { f64::INFINITY });
                let c = const_input(self, scalar_of(dtype, min.unwrap_or(f32::MIN as f64)));
                inputs.push(c);
                let c = const_input(self, scalar_of(dtype, max.unwrap_or(f32::MAX as f64)));
                inputs.push(c);
            }
            Op::Dft if opset < 20 => {
                // DFT-17 had `axis` as an attribute (default 1); DFT-20 takes it as input 2.
                let axis = attrs
                    .0
                    .remove("axis")
                    .and_then(|a| if let Attr::Int(v) = a { Some(v) } else { None })
                    .unwrap_or(1);
                while inputs.len() < 2 {
                    inputs.push(None);
                }
                let c = const_input(self, Tensor::scalar(axis));
                inputs.push(c);
            }
            Op::Dropout => {
                attrs.0.remove("ratio");
            }
            // RoiAlign before opset 16 sampled without the half-pixel shift.
            Op::RoiAlign if opset < 16 && attrs.get("coordinate_transformation_mode").is_none() => {
                attrs.set("coordinate_transformation_mode", Attr::Str("output_half_pixel".into()));
            }
            Op::Resize if op_type == "Upsample" || opset < 11 => {
                // Upsample-7 (scales attribute), Upsample-9 and Resize-10 (scales input):
                // asymmetric coordinates, nearest rounding down (what ONNX Runtime does for both).
                let scales = match attrs.0.remove("scales") {
                    Some(Attr::Floats(s)) => Some(
                        Tensor::from_vec(vec![s.len()], s.iter().map(|&x| x as f32).collect())
                            .expect("1-D"),
                    ),
                    _ => None,
                };
                let x = inputs[0];
                let scales_v = match scales {
                    Some(t) => const_input(self, t),
                    None => inputs.get(1).copied().flatten(),
                };
                inputs = vec![x, None, scales_v];
                attrs.set("coordinate_transformation_mode", Attr::Str("asymmetric".into()));
                if attrs.str("mode", "nearest") == "nearest" {
                    attrs.set("nearest_mode", Attr::Str("floor".into()));
                }
                if attrs.str("mode", "nearest") == "bilinear"
                    || attrs.str("mode", "nearest") == "trilinear"
                {
                    attrs.set("mode", Attr::Str("linear".into()));
                }
            }
            Op::Softmax | Op::LogSoftmax | Op::Hardmax if opset < 13 => {
                return self.legacy_softmax(node, op, attrs, inputs, &name);
            }
            _ => {}
        }
        let info = op.info();
        for (k, _) in attrs.iter() {
            if !info.attrs.iter().any(|(n, _)| n == k) {
                return Err(node_err(format!("attribute `{k}` is not supported for {op_type}")));
            }
        }
        let id = self.g.add_inferred(op, inputs, attrs, n_out).map_err(|e| node_err(e.message))?;
        self.finish_node(node, id, &name);
        Ok(())
    }

    /// An ONNX node xpu has no op for, kept whole as `onnx_op` so engines that take ONNX can
    /// run it: possible when its attributes are plain values (no subgraphs) and the model
    /// declares every output's type (value_info or graph outputs). Otherwise the node is
    /// unsupported, as before.
    fn opaque(
        &mut self,
        node: &NodeProto,
        op_type: &str,
        domain: &str,
        unsupported: impl Fn() -> OnnxError,
    ) -> Result<(), OnnxError> {
        let domain = if domain == "ai.onnx" { "" } else { domain };
        let mut attrs = Attrs::new();
        for a in &node.attribute {
            let aname = a.name.clone().unwrap_or_default();
            if matches!(aname.as_str(), "op_type" | "domain" | "opset") {
                return Err(unsupported());
            }
            attrs.set(&aname, convert_attr(a).map_err(|_| unsupported())?);
        }
        let mut types = Vec::with_capacity(node.output.len());
        for out in &node.output {
            let ty = self
                .declared
                .get(out.as_str())
                .and_then(|t| tensor_type(t, "").ok())
                .filter(|t| t.dtype != xpu_ir::DType::Table)
                .ok_or_else(&unsupported)?;
            types.push(ty);
        }
        if types.is_empty() {
            return Err(unsupported());
        }
        let inputs = self.node_inputs(node)?;
        let opset = self.opsets.get(domain).copied().unwrap_or(self.opset);
        attrs.set("op_type", Attr::Str(op_type.to_string()));
        attrs.set("domain", Attr::Str(domain.to_string()));
        attrs.set("opset", Attr::Int(opset));
        let id = self.g.add_node(Op::OnnxOp, inputs, attrs, types);
        let name = node.name.clone().unwrap_or_default();
        self.finish_node(node, id, &name);
        Ok(())
    }

    /// Binds a node's outputs by name, refining inferred types with declared ones.
    pub(crate) fn finish_node(&mut self, node: &NodeProto, id: xpu_ir::NodeId, name: &str) {
        if !name.is_empty() {
            self.g.nodes[id.index()].name = Some(name.to_string());
        }
        let outputs = self.g.nodes[id.index()].outputs.clone();
        for (out_name, v) in node.output.iter().zip(outputs) {
            if out_name.is_empty() {
                continue;
            }
            if let Some(decl) =
                self.declared.get(out_name.as_str()).and_then(|t| tensor_type(t, "").ok())
            {
                let ty = &mut self.g.values[v.index()].ty;
                if decl.dtype == ty.dtype {
                    match (&mut ty.dims, decl.dims) {
                        (None, d) => ty.dims = d,
                        (Some(have), Some(d)) if have.len() == d.len() => {
                            for (h, x) in have.iter_mut().zip(d) {
                                if *h == Dim::Unknown {
                                    *h = x;
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            self.g.values[v.index()].name = Some(out_name.clone());
            self.env.insert(out_name.clone(), Binding::Value(v));
        }
    }

    /// SwiGLU-28 (`swish_alpha(a) · b`, same shapes) as the two ops it is made of.
    fn swiglu(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
        inputs: &[Option<ValueId>],
        name: &str,
    ) -> Result<(), OnnxError> {
        let err = |m: String| OnnxError::Node {
            node: name.to_string(),
            op_type: "SwiGLU".into(),
            message: m,
        };
        let (Some(Some(a)), Some(Some(b)), 2) = (inputs.first(), inputs.get(1), inputs.len())
        else {
            return Err(err("takes two inputs, a gate and a value".into()));
        };
        if let Some((k, _)) = attrs.iter().find(|(k, _)| k.as_str() != "alpha") {
            return Err(err(format!("attribute `{k}` is not supported for SwiGLU")));
        }
        if let (Some(da), Some(db)) = (&self.g.ty(*a).dims, &self.g.ty(*b).dims) {
            let differ = |(x, y): (&xpu_ir::Dim, &xpu_ir::Dim)| matches!((x.known(), y.known()), (Some(p), Some(q)) if p != q);
            if da.len() != db.len() || da.iter().zip(db).any(differ) {
                return Err(err("the gate and the value must have the same shape".into()));
            }
        }
        let alpha = Attrs::new().with("alpha", Attr::Float(attrs.float("alpha", 1.0)));
        let gate = self.g.add_op(Op::Swish, &[*a], alpha).map_err(|e| err(e.message))?;
        let id = self
            .g
            .add_inferred(Op::Mul, vec![Some(gate), Some(*b)], Attrs::new(), 1)
            .map_err(|e| err(e.message))?;
        self.finish_node(node, id, name);
        Ok(())
    }

    /// Softmax-1/11 flatten to 2-D at `axis` (default 1): shape → flatten → op(axis=1) → reshape.
    fn legacy_softmax(
        &mut self,
        node: &NodeProto,
        op: Op,
        attrs: Attrs,
        inputs: Vec<Option<ValueId>>,
        name: &str,
    ) -> Result<(), OnnxError> {
        let err = |m: xpu_ir::InferError| OnnxError::Node {
            node: name.to_string(),
            op_type: node.op_type.clone().unwrap_or_default(),
            message: m.message,
        };
        let x = inputs
            .first()
            .copied()
            .flatten()
            .ok_or_else(|| invalid(format!("node {name:?}"), "needs an input"))?;
        let axis = attrs.int("axis", 1);
        let shape = self.g.add_op(Op::Shape, &[x], Attrs::new()).map_err(err)?;
        let flat = self
            .g
            .add_op(Op::Flatten, &[x], Attrs::new().with("axis", Attr::Int(axis)))
            .map_err(err)?;
        let y = self.g.add_op(op, &[flat], Attrs::new().with("axis", Attr::Int(1))).map_err(err)?;
        let id = self
            .g
            .add_inferred(Op::Reshape, vec![Some(y), Some(shape)], Attrs::new(), 1)
            .map_err(err)?;
        // The reshape restores x's shape exactly.
        let out = self.g.nodes[id.index()].outputs[0];
        self.g.values[out.index()].ty = self.g.ty(x).clone();
        self.finish_node(node, id, name);
        Ok(())
    }
}

/// A scalar of `dtype` holding `v` (importer-made constants: Pad-2's value, Clip-6's bounds;
/// float-to-int conversion saturates).
fn scalar_of(dtype: DType, v: f64) -> Tensor {
    use xpu_ir::TensorData as D;
    let data = match dtype {
        DType::F32 => D::F32(vec![v as f32]),
        DType::F64 => D::F64(vec![v]),
        DType::F16 => D::F16(vec![half::f16::from_f64(v)]),
        DType::BF16 => D::BF16(vec![half::bf16::from_f64(v)]),
        DType::I8 => D::I8(vec![v as i8]),
        DType::I16 => D::I16(vec![v as i16]),
        DType::I32 => D::I32(vec![v as i32]),
        DType::I64 => D::I64(vec![v as i64]),
        DType::U8 => D::U8(vec![v as u8]),
        DType::U16 => D::U16(vec![v as u16]),
        DType::U32 => D::U32(vec![v as u32]),
        DType::U64 => D::U64(vec![v as u64]),
        DType::Bool => D::Bool(vec![v != 0.0]),
        DType::String => D::String(vec![v.to_string()]),
        // ONNX types never map to tables; an empty one keeps this total.
        DType::Table => D::Table(vec![Default::default()]),
        d => {
            let l = d.lowp().expect("every other dtype is listed");
            D::Lowp(l, vec![l.from_f32(v as f32, true, xpu_ir::lowp::RoundMode::Nearest)])
        }
    };
    Tensor::new(vec![], data).expect("one element for a scalar")
}

fn constant_value(attrs: &Attrs) -> Result<Tensor, String> {
    let scalar_or_list = |name: &str| -> Option<Tensor> {
        match attrs.get(name)? {
            Attr::Float(f) => Some(Tensor::scalar(*f as f32)),
            Attr::Int(i) => Some(Tensor::scalar(*i)),
            Attr::Str(s) => Some(Tensor::scalar(s.clone())),
            Attr::Floats(v) => {
                Tensor::from_vec(vec![v.len()], v.iter().map(|&x| x as f32).collect()).ok()
            }
            Attr::Ints(v) => Tensor::from_vec(vec![v.len()], v.clone()).ok(),
            Attr::Strs(v) => Tensor::from_vec(vec![v.len()], v.clone()).ok(),
            _ => None,
        }
    };
    if let Some(t) = attrs.tensor("value") {
        return Ok(t.clone());
    }
    for k in
        ["value_float", "value_int", "value_string", "value_floats", "value_ints", "value_strings"]
    {
        if let Some(t) = scalar_or_list(k) {
            return Ok(t);
        }
    }
    Err("Constant needs one of value, value_float(s), value_int(s), value_string(s)".into())
}

pub(crate) fn convert_attr(a: &AttributeProto) -> Result<Attr, String> {
    let ty = a.r#type.and_then(|t| AttributeType::try_from(t).ok());
    let utf8 =
        |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| "string is not UTF-8".to_string());
    Ok(match ty {
        Some(AttributeType::Float) => Attr::Float(a.f.unwrap_or(0.0) as f64),
        Some(AttributeType::Int) => Attr::Int(a.i.unwrap_or(0)),
        Some(AttributeType::String) => Attr::Str(utf8(a.s.as_deref().unwrap_or_default())?),
        Some(AttributeType::Floats) => Attr::Floats(a.floats.iter().map(|&f| f as f64).collect()),
        Some(AttributeType::Ints) => Attr::Ints(a.ints.clone()),
        Some(AttributeType::Strings) => {
            Attr::Strs(a.strings.iter().map(|s| utf8(s)).collect::<Result<_, _>>()?)
        }
        Some(AttributeType::Tensor) => Attr::Tensor(
            tensor_from_proto(
                a.t.as_ref().ok_or("tensor attribute without a tensor")?,
                "attribute",
            )
            .map_err(|e| e.to_string())?,
        ),
        Some(AttributeType::Graph) | Some(AttributeType::Graphs) => {
            return Err("subgraph attributes (control flow) are not supported".into());
        }
        Some(other) => {
            return Err(format!("attribute type {} is not supported", other.as_str_name()));
        }
        None => {
            // IR < 0.0.2 had no type field: infer from the populated field.
            if let Some(f) = a.f {
                Attr::Float(f as f64)
            } else if let Some(i) = a.i {
                Attr::Int(i)
            } else if let Some(s) = &a.s {
                Attr::Str(utf8(s)?)
            } else if !a.ints.is_empty() {
                Attr::Ints(a.ints.clone())
            } else if !a.floats.is_empty() {
                Attr::Floats(a.floats.iter().map(|&f| f as f64).collect())
            } else {
                return Err("attribute has no type and no value".into());
            }
        }
    })
}
