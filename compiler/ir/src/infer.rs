//! Type and shape inference for every op.
//!
//! Dtypes are always inferred exactly. Dims are inferred where the op's inputs make them
//! knowable (static dims, symbols carried through, constant shape operands); otherwise a dim
//! is `?`, or the rank is unknown. Engines compute the real shapes at run time.

use crate::{Attrs, DType, Dim, Op, OpClass, Tensor, TensorType};

/// Why a node's types cannot be inferred: a rule of the op is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct InferError {
    pub op: Op,
    pub message: String,
}

type In<'a> = Option<(&'a TensorType, Option<&'a Tensor>)>;

pub use crate::infer_state::update_rule as linear_attention_update_rule;

pub(crate) struct Cx<'a> {
    op: Op,
    attrs: &'a Attrs,
    inputs: &'a [In<'a>],
}

impl<'a> Cx<'a> {
    pub(crate) fn err<T>(&self, message: impl Into<String>) -> Result<T, InferError> {
        Err(InferError { op: self.op, message: message.into() })
    }

    pub(crate) fn ty(&self, i: usize) -> Result<&'a TensorType, InferError> {
        match self.inputs.get(i).copied().flatten() {
            Some((t, _)) => Ok(t),
            None => self.err(format!("input {i} is required")),
        }
    }

    pub(crate) fn opt_ty(&self, i: usize) -> Option<&'a TensorType> {
        self.inputs.get(i).copied().flatten().map(|(t, _)| t)
    }

    pub(crate) fn const_ints(&self, i: usize) -> Option<Vec<i64>> {
        self.inputs.get(i).copied().flatten()?.1?.to_i64_vec()
    }

    fn const_tensor(&self, i: usize) -> Option<&'a Tensor> {
        self.inputs.get(i).copied().flatten()?.1
    }

    pub(crate) fn dims(&self, i: usize) -> Result<Option<&'a Vec<Dim>>, InferError> {
        Ok(self.ty(i)?.dims.as_ref())
    }

    pub(crate) fn require(&self, ok: bool, message: impl Into<String>) -> Result<(), InferError> {
        if ok { Ok(()) } else { self.err(message) }
    }

    pub(crate) fn same_dtype(&self, indices: &[usize]) -> Result<DType, InferError> {
        let d0 = self.ty(indices[0])?.dtype;
        for &i in &indices[1..] {
            if let Some(t) = self.opt_ty(i)
                && t.dtype != d0
            {
                return self.err(format!(
                    "input {i} has dtype {} but input {} has {d0}; they must match",
                    t.dtype, indices[0]
                ));
            }
        }
        Ok(d0)
    }

    fn axis(&self, axis: i64, rank: usize) -> Result<usize, InferError> {
        normalize_axis(axis, rank).ok_or_else(|| InferError {
            op: self.op,
            message: format!("axis {axis} is out of range for rank {rank}"),
        })
    }
}

/// Maps a possibly negative axis into `0..rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Multidirectional (numpy) broadcasting of two concrete shapes; the error names the
/// dims that differ.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            match (x, y) {
                _ if x == y => Ok(x),
                (1, y) => Ok(y),
                (x, 1) => Ok(x),
                _ => Err(format!("shapes {a:?} and {b:?} do not broadcast (dim {x} vs {y})")),
            }
        })
        .collect()
}

/// Multidirectional (numpy) broadcasting of dims.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, String> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = if i + a.len() >= n { &a[i + a.len() - n] } else { &Dim::Known(1) };
        let db = if i + b.len() >= n { &b[i + b.len() - n] } else { &Dim::Known(1) };
        let d = match (da, db) {
            (Dim::Known(1), d) | (d, Dim::Known(1)) => d.clone(),
            (Dim::Known(x), Dim::Known(y)) if x == y => Dim::Known(*x),
            (Dim::Known(x), Dim::Known(y)) => {
                return Err(format!("dims {x} and {y} do not broadcast"));
            }
            (Dim::Known(x), _) | (_, Dim::Known(x)) => Dim::Known(*x),
            (Dim::Sym(x), Dim::Sym(y)) if x == y => Dim::Sym(x.clone()),
            _ => Dim::Unknown,
        };
        out.push(d);
    }
    Ok(out)
}

pub(crate) fn known(n: i64) -> Dim {
    Dim::Known(n.max(0) as u64)
}

/// The ops that take low-precision inputs ([`DType::is_low_precision`]).
pub const LOW_PRECISION_OPS: &[Op] = &[
    Op::Cast,
    Op::CastLike,
    Op::Identity,
    Op::Reshape,
    Op::Squeeze,
    Op::Unsqueeze,
    Op::Flatten,
    Op::Shape,
    Op::Size,
    Op::QuantizeLinear,
    Op::DequantizeLinear,
    Op::BitCast,
];

/// Infers the output types of one node.
pub fn infer_types(
    op: Op,
    attrs: &Attrs,
    inputs: &[In<'_>],
    n_outputs: usize,
) -> Result<Vec<TensorType>, InferError> {
    let out = infer_node(op, attrs, inputs, n_outputs)?;
    // Only the ops that take low-precision values may make them (and constants).
    // (Control flow passes on what its subgraphs made; they are checked on their own.)
    if let Some(t) = out.iter().find(|t| t.dtype.is_low_precision())
        && !LOW_PRECISION_OPS.contains(&op)
        && op != Op::Constant
        && op.class() != OpClass::Control
    {
        return Err(InferError {
            op,
            message: format!(
                "cannot make {} values: low-precision values come only from casts, quantization and constants",
                t.dtype
            ),
        });
    }
    Ok(out)
}

fn infer_node(
    op: Op,
    attrs: &Attrs,
    inputs: &[In<'_>],
    n_outputs: usize,
) -> Result<Vec<TensorType>, InferError> {
    let cx = Cx { op, attrs, inputs };
    let info = op.info();
    let given = inputs.len();
    if given < info.inputs.0 || given > info.inputs.1 {
        return cx.err(format!("takes {} inputs, got {given}", arity(info.inputs)));
    }
    if n_outputs < info.outputs.0 || n_outputs > info.outputs.1 {
        return cx.err(format!("has {} outputs, got {n_outputs}", arity(info.outputs)));
    }
    if op.class() == OpClass::Control {
        let tys: Vec<Option<&TensorType>> = inputs.iter().map(|i| i.map(|(t, _)| t)).collect();
        return crate::control::infer(op, attrs, &tys, n_outputs)
            .map_err(|message| InferError { op, message });
    }
    for i in 0..info.inputs.0 {
        cx.ty(i)?;
    }
    if op == Op::OnnxOp {
        return cx.err(
            "an opaque ONNX node's output types are the model's declaration; xpu cannot infer them",
        );
    }
    let one = |t: TensorType| Ok(vec![t]);
    let same_as = |i: usize| -> Result<Vec<TensorType>, InferError> { Ok(vec![cx.ty(i)?.clone()]) };

    // Low-precision values are stored, not computed with: they are cast, reshaped or passed
    // through (quantization reads and writes them as well).
    if let Some((t, _)) = inputs.iter().flatten().find(|(t, _)| t.dtype.is_low_precision())
        && !LOW_PRECISION_OPS.contains(&op)
    {
        return cx.err(format!(
            "takes no {} input: low-precision values are only cast, quantized, reshaped or passed through",
            t.dtype
        ));
    }

    // Tables flow only through table ops, and table ops take only tables.
    let table_inputs = inputs.iter().flatten().filter(|(t, _)| t.dtype == DType::Table).count();
    if op.class() == OpClass::Table {
        if table_inputs != inputs.iter().flatten().count() {
            return cx.err("takes tables only");
        }
        if let Err(m) = crate::table_attrs::check(op, attrs) {
            return cx.err(m);
        }
        let table = TensorType::new(DType::Table, vec![]);
        return match op {
            Op::TableToTensor => {
                let cols = attrs.strs("columns").map_or(0, |c| c.len()) as u64;
                let rows = Dim::Sym(attrs.str("rows", "rows").to_string());
                one(TensorType::new(DType::F64, vec![rows, Dim::Known(cols)]))
            }
            Op::WriteTable | Op::Plot => one(TensorType::new(DType::I64, vec![])),
            _ => one(table),
        };
    }
    if table_inputs > 0 {
        return cx.err("does not take tables (only ops of class `table` do)");
    }

    match op {
        Op::Constant => match attrs.tensor("value") {
            Some(t) => one(t.ty()),
            None => cx.err("attribute `value` (a tensor) is required"),
        },
        Op::ConstantOfShape => {
            let dtype = attrs.tensor("value").map(|t| t.dtype()).unwrap_or(DType::F32);
            let dims = match cx.const_ints(0) {
                Some(s) => Some(s.into_iter().map(known).collect()),
                None => cx
                    .dims(0)?
                    .and_then(|d| d.first()?.known())
                    .map(|n| vec![Dim::Unknown; n as usize]),
            };
            one(TensorType { dtype, dims })
        }
        Op::Range => {
            let dtype = cx.same_dtype(&[0, 1, 2])?;
            let dim = match (cx.const_tensor(0), cx.const_tensor(1), cx.const_tensor(2)) {
                (Some(s), Some(l), Some(d))
                    if s.numel() == 1 && l.numel() == 1 && d.numel() == 1 =>
                {
                    let (s, l, d) = (s.data().get_f64(0), l.data().get_f64(0), d.data().get_f64(0));
                    known(((l - s) / d).ceil().max(0.0) as i64)
                }
                _ => Dim::Unknown,
            };
            one(TensorType::new(dtype, vec![dim]))
        }
        Op::EyeLike => {
            let t = cx.ty(0)?;
            cx.require(t.rank().is_none_or(|r| r == 2), "input must be 2-D")?;
            one(TensorType { dtype: attrs.dtype("dtype").unwrap_or(t.dtype), dims: t.dims.clone() })
        }
        Op::IsNaN | Op::IsInf => {
            let t = cx.ty(0)?;
            cx.require(t.dtype.is_float(), format!("needs a float input, got {}", t.dtype))?;
            one(TensorType { dtype: DType::Bool, dims: t.dims.clone() })
        }
        Op::Not => {
            cx.require(cx.ty(0)?.dtype == DType::Bool, "needs a bool input")?;
            same_as(0)
        }
        Op::BitwiseNot => {
            cx.require(cx.ty(0)?.dtype.is_int(), "needs an integer input")?;
            same_as(0)
        }
        Op::Clip => {
            cx.same_dtype(&[0, 1, 2])?;
            same_as(0)
        }
        Op::PRelu => {
            cx.same_dtype(&[0, 1])?;
            same_as(0)
        }
        _ if matches!(info.class, OpClass::Unary | OpClass::Activation) => {
            let t = cx.ty(0)?;
            let float_only = !matches!(
                op,
                Op::Identity
                    | Op::Abs
                    | Op::Neg
                    | Op::Sign
                    | Op::Relu
                    | Op::Floor
                    | Op::Ceil
                    | Op::Round
            );
            if float_only {
                cx.require(t.dtype.is_float(), format!("needs a float input, got {}", t.dtype))?;
            }
            same_as(0)
        }
        Op::Max | Op::Min | Op::Sum | Op::Mean => {
            let all: Vec<usize> = (0..given).collect();
            let dtype = cx.same_dtype(&all)?;
            one(TensorType { dtype, dims: broadcast_all(&cx, &all)? })
        }
        Op::Pow => one(TensorType { dtype: cx.ty(0)?.dtype, dims: broadcast_all(&cx, &[0, 1])? }),
        _ if matches!(info.class, OpClass::Binary | OpClass::Bitwise | OpClass::Logical) => {
            let dtype = cx.same_dtype(&[0, 1])?;
            if info.class == OpClass::Logical {
                cx.require(dtype == DType::Bool, format!("needs bool inputs, got {dtype}"))?;
            }
            if info.class == OpClass::Bitwise {
                cx.require(dtype.is_int(), format!("needs integer inputs, got {dtype}"))?;
            }
            one(TensorType { dtype, dims: broadcast_all(&cx, &[0, 1])? })
        }
        Op::Equal | Op::Less | Op::LessOrEqual | Op::Greater | Op::GreaterOrEqual => {
            cx.same_dtype(&[0, 1])?;
            one(TensorType { dtype: DType::Bool, dims: broadcast_all(&cx, &[0, 1])? })
        }
        Op::Where => {
            cx.require(cx.ty(0)?.dtype == DType::Bool, "condition (input 0) must be bool")?;
            let dtype = cx.same_dtype(&[1, 2])?;
            one(TensorType { dtype, dims: broadcast_all(&cx, &[0, 1, 2])? })
        }
        Op::Cast => match attrs.dtype("to") {
            Some(to) => one(TensorType { dtype: to, dims: cx.ty(0)?.dims.clone() }),
            None => cx.err("attribute `to` (a dtype) is required"),
        },
        Op::CastLike => one(TensorType { dtype: cx.ty(1)?.dtype, dims: cx.ty(0)?.dims.clone() }),
        Op::BitCast => {
            let (from, to) = (cx.ty(0)?.dtype, attrs.dtype("to"));
            let Some(to) = to else { return cx.err("attribute `to` (a dtype) is required") };
            let bits = |d: DType| match d.lowp() {
                Some(l) => Some(l.bits() as usize),
                None if matches!(d, DType::String | DType::Table) => None,
                None => Some(d.size_bytes() * 8),
            };
            match (bits(from), bits(to)) {
                (Some(a), Some(b)) if a == b => {}
                _ => {
                    return cx
                        .err(format!("cannot reinterpret {from} as {to}: not the same width"));
                }
            }
            one(TensorType { dtype: to, dims: cx.ty(0)?.dims.clone() })
        }
        Op::MatMul => {
            let dtype = cx.same_dtype(&[0, 1])?;
            let dims = match (cx.dims(0)?, cx.dims(1)?) {
                (Some(a), Some(b)) => Some(matmul_dims(&cx, a, b)?),
                _ => None,
            };
            one(TensorType { dtype, dims })
        }
        Op::Gemm => {
            let dtype = cx.same_dtype(&[0, 1, 2])?;
            let (a, b) = (cx.ty(0)?, cx.ty(1)?);
            let dims = match (&a.dims, &b.dims) {
                (Some(a), Some(b)) => {
                    cx.require(a.len() == 2 && b.len() == 2, "A and B must be 2-D")?;
                    let m = if attrs.int("transA", 0) != 0 { &a[1] } else { &a[0] };
                    let (k1, k2) = (
                        if attrs.int("transA", 0) != 0 { &a[0] } else { &a[1] },
                        if attrs.int("transB", 0) != 0 { &b[1] } else { &b[0] },
                    );
                    cx.require(k1.compatible(k2), format!("inner dims {k1} and {k2} differ"))?;
                    let n = if attrs.int("transB", 0) != 0 { &b[0] } else { &b[1] };
                    Some(vec![m.clone(), n.clone()])
                }
                _ => None,
            };
            one(TensorType { dtype, dims })
        }
        Op::Einsum => {
            let all: Vec<usize> = (0..given).collect();
            let dtype = cx.same_dtype(&all)?;
            one(TensorType { dtype, dims: einsum_dims(&cx)? })
        }
        Op::Det => {
            let t = cx.ty(0)?;
            let dims = t.dims.as_ref().map(|d| d[..d.len().saturating_sub(2)].to_vec());
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Col2Im => {
            let t = cx.ty(0)?;
            cx.require(t.rank().is_none_or(|r| r == 3), "input must be (N, C·∏block, L)")?;
            let image = cx.const_ints(1);
            let block = cx.const_ints(2);
            let spatial = image.as_ref().map(Vec::len).or(block.as_ref().map(Vec::len));
            let (n, cols) = match &t.dims {
                Some(d) => (d[0].clone(), d[1].clone()),
                None => (Dim::Unknown, Dim::Unknown),
            };
            let c = match (cols.known(), &block) {
                (Some(cols), Some(b)) => {
                    let k: i64 = b.iter().product();
                    cx.require(
                        k > 0 && cols as i64 % k == 0,
                        "the columns are not a whole number of blocks",
                    )?;
                    known(cols as i64 / k)
                }
                _ => Dim::Unknown,
            };
            let dims = match (spatial, &image) {
                (_, Some(img)) => {
                    Some([n, c].into_iter().chain(img.iter().map(|&d| known(d))).collect())
                }
                (Some(s), None) => Some([n, c].into_iter().chain(vec![Dim::Unknown; s]).collect()),
                (None, None) => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Conv | Op::ConvTranspose => {
            let dtype = cx.same_dtype(&[0, 1, 2])?;
            let dims = conv_dims(&cx)?;
            one(TensorType { dtype, dims })
        }
        Op::MaxPool | Op::AveragePool | Op::LpPool => {
            let t = cx.ty(0)?;
            let dims = pool_dims(&cx, t)?;
            let mut out = vec![TensorType { dtype: t.dtype, dims: dims.clone() }];
            if n_outputs == 2 {
                out.push(TensorType { dtype: DType::I64, dims });
            }
            Ok(out)
        }
        Op::GlobalAveragePool | Op::GlobalMaxPool | Op::GlobalLpPool => {
            let t = cx.ty(0)?;
            let dims = t.dims.as_ref().map(|d| {
                d.iter()
                    .enumerate()
                    .map(|(i, x)| if i < 2 { x.clone() } else { Dim::Known(1) })
                    .collect()
            });
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::BatchNormalization => {
            let t = cx.ty(0)?;
            let mut out = vec![t.clone()];
            for i in 1..n_outputs {
                out.push(cx.ty(2 + i)?.clone());
            }
            Ok(out)
        }
        Op::LayerNormalization => {
            let t = cx.ty(0)?;
            let mut out = vec![t.clone()];
            let stash = if attrs.int("stash_type", 1) == 1 { DType::F32 } else { t.dtype };
            let stat_dims = match &t.dims {
                Some(d) => {
                    let axis = cx.axis(attrs.int("axis", -1), d.len())?;
                    Some(
                        d.iter()
                            .enumerate()
                            .map(|(i, x)| if i < axis { x.clone() } else { Dim::Known(1) })
                            .collect(),
                    )
                }
                None => None,
            };
            for _ in 1..n_outputs {
                out.push(TensorType { dtype: stash, dims: stat_dims.clone() });
            }
            Ok(out)
        }
        _ if matches!(info.class, OpClass::Norm | OpClass::Softmax) => {
            let t = cx.ty(0)?;
            cx.require(t.dtype.is_float(), format!("needs a float input, got {}", t.dtype))?;
            same_as(0)
        }
        _ if info.class == OpClass::Reduction => {
            let t = cx.ty(0)?;
            let keep = attrs.int("keepdims", 1) != 0;
            let dims = match (&t.dims, cx.opt_ty(1)) {
                (None, _) => None,
                (Some(d), None) => {
                    if attrs.int("noop_with_empty_axes", 0) != 0 {
                        Some(d.clone())
                    } else {
                        Some(if keep { vec![Dim::Known(1); d.len()] } else { vec![] })
                    }
                }
                (Some(d), Some(_)) => match cx.const_ints(1) {
                    Some(axes) if axes.is_empty() && attrs.int("noop_with_empty_axes", 0) != 0 => {
                        Some(d.clone())
                    }
                    Some(axes) if axes.is_empty() => {
                        Some(if keep { vec![Dim::Known(1); d.len()] } else { vec![] })
                    }
                    Some(axes) => {
                        let axes: Vec<usize> =
                            axes.iter().map(|&a| cx.axis(a, d.len())).collect::<Result<_, _>>()?;
                        Some(reduce_dims(d, &axes, keep))
                    }
                    None if keep => Some(vec![Dim::Unknown; d.len()]),
                    None => None,
                },
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::ArgMax | Op::ArgMin => {
            let t = cx.ty(0)?;
            let dims = match &t.dims {
                Some(d) => {
                    let a = cx.axis(attrs.int("axis", 0), d.len())?;
                    Some(reduce_dims(d, &[a], attrs.int("keepdims", 1) != 0))
                }
                None => None,
            };
            one(TensorType { dtype: DType::I64, dims })
        }
        Op::CumSum | Op::CumProd => same_as(0),
        Op::TopK => {
            let t = cx.ty(0)?;
            let dims = match &t.dims {
                Some(d) => {
                    let a = cx.axis(attrs.int("axis", -1), d.len())?;
                    let mut d = d.clone();
                    d[a] = cx
                        .const_ints(1)
                        .and_then(|k| k.first().copied())
                        .map(known)
                        .unwrap_or(Dim::Unknown);
                    Some(d)
                }
                None => None,
            };
            Ok(vec![
                TensorType { dtype: t.dtype, dims: dims.clone() },
                TensorType { dtype: DType::I64, dims },
            ])
        }
        Op::NonZero => {
            let r = cx.ty(0)?.rank().map(|r| Dim::Known(r as u64)).unwrap_or(Dim::Unknown);
            one(TensorType::new(DType::I64, vec![r, Dim::Unknown]))
        }
        Op::Unique => {
            let t = cx.ty(0)?;
            let (y, along) = match (attrs.get("axis"), &t.dims) {
                (None, _) => {
                    let n = t.numel().map_or(Dim::Unknown, |n| Dim::Known(n as u64));
                    (TensorType::new(t.dtype, vec![Dim::Unknown]), n)
                }
                (Some(_), Some(dims)) => {
                    let a = cx.axis(attrs.int("axis", 0), dims.len())?;
                    let mut ydims = dims.clone();
                    ydims[a] = Dim::Unknown;
                    (TensorType::new(t.dtype, ydims), dims[a].clone())
                }
                (Some(_), None) => (TensorType { dtype: t.dtype, dims: None }, Dim::Unknown),
            };
            let ints = |d: Dim| TensorType::new(DType::I64, vec![d]);
            let all = [y, ints(Dim::Unknown), ints(along), ints(Dim::Unknown)];
            Ok(all.into_iter().take(n_outputs).collect())
        }
        Op::Reshape => {
            let t = cx.ty(0)?;
            let dims = match cx.const_ints(1) {
                Some(shape) => Some(reshape_dims(&cx, t, &shape)?),
                None => cx
                    .dims(1)?
                    .and_then(|d| d.first()?.known())
                    .map(|n| vec![Dim::Unknown; n as usize]),
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Transpose => {
            let t = cx.ty(0)?;
            let dims = match &t.dims {
                Some(d) => {
                    let perm: Vec<i64> = attrs
                        .ints("perm")
                        .map(<[i64]>::to_vec)
                        .unwrap_or_else(|| (0..d.len() as i64).rev().collect());
                    cx.require(
                        perm.len() == d.len(),
                        format!("perm has {} entries for rank {}", perm.len(), d.len()),
                    )?;
                    let mut seen = vec![false; d.len()];
                    let mut out = Vec::new();
                    for &p in &perm {
                        let a = cx.axis(p, d.len())?;
                        cx.require(!seen[a], format!("perm repeats axis {a}"))?;
                        seen[a] = true;
                        out.push(d[a].clone());
                    }
                    Some(out)
                }
                None => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Squeeze => {
            let t = cx.ty(0)?;
            let dims = match (&t.dims, cx.opt_ty(1)) {
                (Some(d), None) => {
                    if d.iter().all(|x| x.known().is_some()) {
                        Some(d.iter().filter(|x| x.known() != Some(1)).cloned().collect())
                    } else {
                        None
                    }
                }
                (Some(d), Some(_)) => match cx.const_ints(1) {
                    Some(axes) => {
                        let axes: Vec<usize> =
                            axes.iter().map(|&a| cx.axis(a, d.len())).collect::<Result<_, _>>()?;
                        for &a in &axes {
                            cx.require(
                                d[a].known().is_none_or(|n| n == 1),
                                format!("cannot squeeze axis {a} of size {}", d[a]),
                            )?;
                        }
                        Some(
                            d.iter()
                                .enumerate()
                                .filter(|(i, _)| !axes.contains(i))
                                .map(|(_, x)| x.clone())
                                .collect(),
                        )
                    }
                    None => None,
                },
                (None, _) => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Unsqueeze => {
            let t = cx.ty(0)?;
            let dims = match (&t.dims, cx.const_ints(1)) {
                (Some(d), Some(axes)) => {
                    let r = d.len() + axes.len();
                    let axes: Vec<usize> =
                        axes.iter().map(|&a| cx.axis(a, r)).collect::<Result<_, _>>()?;
                    let mut it = d.iter();
                    Some(
                        (0..r)
                            .map(|i| {
                                if axes.contains(&i) {
                                    Dim::Known(1)
                                } else {
                                    it.next().cloned().unwrap_or(Dim::Unknown)
                                }
                            })
                            .collect(),
                    )
                }
                _ => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Flatten => {
            let t = cx.ty(0)?;
            let dims = match &t.dims {
                Some(d) => {
                    let r = d.len() as i64;
                    let mut axis = attrs.int("axis", 1);
                    if axis < 0 {
                        axis += r;
                    }
                    cx.require(
                        (0..=r).contains(&axis),
                        format!("axis {axis} is out of range for rank {r}"),
                    )?;
                    let (a, b) = d.split_at(axis as usize);
                    Some(vec![product(a), product(b)])
                }
                None => Some(vec![Dim::Unknown, Dim::Unknown]),
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Concat => {
            let all: Vec<usize> = (0..given).collect();
            let dtype = cx.same_dtype(&all)?;
            let mut acc: Option<Vec<Dim>> = None;
            let mut ranked = true;
            for i in all {
                match cx.dims(i)? {
                    Some(d) => match &mut acc {
                        None => acc = Some(d.clone()),
                        Some(a) => {
                            cx.require(
                                a.len() == d.len(),
                                format!(
                                    "input {i} has rank {} but input 0 has rank {}",
                                    d.len(),
                                    a.len()
                                ),
                            )?;
                            let axis = cx.axis(attrs.int("axis", 0), a.len())?;
                            a[axis] = match (&a[axis], &d[axis]) {
                                (Dim::Known(x), Dim::Known(y)) => Dim::Known(x + y),
                                _ => Dim::Unknown,
                            };
                            for k in 0..a.len() {
                                if k != axis && a[k].known().is_none() {
                                    a[k] = d[k].clone();
                                }
                            }
                        }
                    },
                    None => ranked = false,
                }
            }
            if let Some(a) = &acc {
                cx.axis(attrs.int("axis", 0), a.len())?;
            }
            one(TensorType { dtype, dims: if ranked { acc } else { None } })
        }
        Op::Split => {
            let t = cx.ty(0)?;
            let mut out = Vec::new();
            match &t.dims {
                Some(d) => {
                    let axis = cx.axis(attrs.int("axis", 0), d.len())?;
                    let sizes: Option<Vec<i64>> = match cx.const_ints(1) {
                        Some(s) => {
                            cx.require(
                                s.len() == n_outputs,
                                format!("split has {} sizes for {n_outputs} outputs", s.len()),
                            )?;
                            Some(s)
                        }
                        None if cx.opt_ty(1).is_none() => d[axis].known().map(|n| {
                            let n = n as i64;
                            let parts = n_outputs as i64;
                            let chunk = (n + parts - 1) / parts;
                            (0..parts).map(|i| (n - i * chunk).clamp(0, chunk)).collect()
                        }),
                        None => None,
                    };
                    for i in 0..n_outputs {
                        let mut dd = d.clone();
                        dd[axis] = sizes.as_ref().map(|s| known(s[i])).unwrap_or(Dim::Unknown);
                        out.push(TensorType { dtype: t.dtype, dims: Some(dd) });
                    }
                }
                None => out = vec![t.clone(); n_outputs],
            }
            Ok(out)
        }
        Op::Slice => {
            let t = cx.ty(0)?;
            one(TensorType { dtype: t.dtype, dims: slice_dims(&cx, t)? })
        }
        Op::Expand => {
            let t = cx.ty(0)?;
            let dims = match (&t.dims, cx.const_ints(1)) {
                (Some(d), Some(shape)) => {
                    let s: Vec<Dim> = shape.iter().map(|&x| known(x)).collect();
                    Some(broadcast_dims(d, &s).or_else(|e| cx.err(e))?)
                }
                _ => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Tile => {
            let t = cx.ty(0)?;
            let dims = match (&t.dims, cx.const_ints(1)) {
                (Some(d), Some(r)) => {
                    cx.require(r.len() == d.len(), "repeats must have one entry per dim")?;
                    Some(
                        d.iter()
                            .zip(&r)
                            .map(|(x, &k)| match x {
                                Dim::Known(n) => known((*n as i64).saturating_mul(k)),
                                _ if k == 1 => x.clone(),
                                _ => Dim::Unknown,
                            })
                            .collect(),
                    )
                }
                (Some(d), None) => Some(vec![Dim::Unknown; d.len()]),
                _ => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Pad => {
            let t = cx.ty(0)?;
            let dims = match (&t.dims, cx.const_ints(1)) {
                (Some(d), Some(p)) => {
                    let axes: Vec<usize> = match cx.const_ints(3) {
                        Some(a) => {
                            a.iter().map(|&a| cx.axis(a, d.len())).collect::<Result<_, _>>()?
                        }
                        None if cx.opt_ty(3).is_some() => {
                            return one(TensorType {
                                dtype: t.dtype,
                                dims: Some(vec![Dim::Unknown; d.len()]),
                            });
                        }
                        None => (0..d.len()).collect(),
                    };
                    cx.require(
                        p.len() == 2 * axes.len(),
                        format!("pads has {} entries, needs {}", p.len(), 2 * axes.len()),
                    )?;
                    let mut out = d.clone();
                    for (k, &a) in axes.iter().enumerate() {
                        if let Dim::Known(n) = d[a] {
                            out[a] = known(
                                (n as i64).saturating_add(p[k]).saturating_add(p[k + axes.len()]),
                            );
                        } else {
                            out[a] = Dim::Unknown;
                        }
                    }
                    Some(out)
                }
                (Some(d), None) => Some(vec![Dim::Unknown; d.len()]),
                _ => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Shape => {
            let n = match cx.ty(0)?.rank() {
                Some(r) => {
                    let clamp = |x: i64| (if x < 0 { x + r as i64 } else { x }).clamp(0, r as i64);
                    let s = clamp(attrs.int("start", 0));
                    let e = clamp(attrs.int("end", r as i64));
                    known((e - s).max(0))
                }
                None => Dim::Unknown,
            };
            one(TensorType::new(DType::I64, vec![n]))
        }
        Op::Size => one(TensorType::new(DType::I64, vec![])),
        Op::DepthToSpace | Op::SpaceToDepth => {
            let t = cx.ty(0)?;
            let b = attrs.int("blocksize", 0);
            cx.require(b > 0, "attribute `blocksize` must be positive")?;
            let dims = match &t.dims {
                Some(d) => {
                    cx.require(d.len() == 4, "input must be 4-D (N, C, H, W)")?;
                    let f = |x: &Dim, mul: bool| match x {
                        Dim::Known(n) => known(if mul {
                            (*n as i64).saturating_mul(b.saturating_mul(b))
                        } else {
                            *n as i64 / b.saturating_mul(b)
                        }),
                        _ => Dim::Unknown,
                    };
                    let g = |x: &Dim, mul: bool| match x {
                        Dim::Known(n) => {
                            known(if mul { (*n as i64).saturating_mul(b) } else { *n as i64 / b })
                        }
                        _ => Dim::Unknown,
                    };
                    let s2d = op == Op::SpaceToDepth;
                    Some(vec![d[0].clone(), f(&d[1], s2d), g(&d[2], !s2d), g(&d[3], !s2d)])
                }
                None => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Trilu | Op::ReverseSequence => same_as(0),
        Op::Resize => {
            let t = cx.ty(0)?;
            let dims = match &t.dims {
                Some(d) => {
                    let axes: Vec<usize> = match attrs.ints("axes") {
                        Some(a) => {
                            a.iter().map(|&a| cx.axis(a, d.len())).collect::<Result<_, _>>()?
                        }
                        None => (0..d.len()).collect(),
                    };
                    let mut out = d.clone();
                    if let Some(sizes) = cx.const_ints(3).filter(|s| !s.is_empty()) {
                        if attrs.str("keep_aspect_ratio_policy", "stretch") == "stretch"
                            && sizes.len() == axes.len()
                        {
                            for (k, &a) in axes.iter().enumerate() {
                                out[a] = known(sizes[k]);
                            }
                        } else {
                            out = vec![Dim::Unknown; d.len()];
                        }
                    } else if let Some(scales) = cx.const_tensor(2).filter(|s| s.numel() > 0) {
                        let sc = scales.to_f64_vec();
                        for (k, &a) in axes.iter().enumerate() {
                            out[a] = match (&d[a], sc.get(k)) {
                                (Dim::Known(n), Some(s)) => known((*n as f64 * s).floor() as i64),
                                _ => Dim::Unknown,
                            };
                        }
                    } else {
                        out = vec![Dim::Unknown; d.len()];
                    }
                    Some(out)
                }
                None => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::OneHot => {
            let t = cx.ty(0)?;
            let dtype = cx.ty(2)?.dtype;
            let dims = match &t.dims {
                Some(d) => {
                    let r = d.len() + 1;
                    let axis = cx.axis(attrs.int("axis", -1), r)?;
                    let depth = cx
                        .const_tensor(1)
                        .filter(|t| t.numel() == 1)
                        .map(|t| known(t.data().get_f64(0) as i64))
                        .unwrap_or(Dim::Unknown);
                    let mut out = d.clone();
                    out.insert(axis, depth);
                    Some(out)
                }
                None => None,
            };
            one(TensorType { dtype, dims })
        }
        Op::Compress => {
            let t = cx.ty(0)?;
            let dims = match (&t.dims, attrs.opt_int("axis")) {
                (_, None) => Some(vec![Dim::Unknown]),
                (Some(d), Some(a)) => {
                    let a = cx.axis(a, d.len())?;
                    let mut out = d.clone();
                    out[a] = Dim::Unknown;
                    Some(out)
                }
                (None, _) => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::Dropout => {
            let t = cx.ty(0)?;
            let mut out = vec![t.clone()];
            if n_outputs == 2 {
                out.push(TensorType { dtype: DType::Bool, dims: t.dims.clone() });
            }
            Ok(out)
        }
        Op::Gather => {
            let t = cx.ty(0)?;
            let idx = cx.ty(1)?;
            cx.require(idx.dtype.is_int(), "indices must be integers")?;
            let dims = match (&t.dims, &idx.dims) {
                (Some(d), Some(i)) => {
                    let a = cx.axis(attrs.int("axis", 0), d.len())?;
                    let mut out = d[..a].to_vec();
                    out.extend(i.iter().cloned());
                    out.extend(d[a + 1..].iter().cloned());
                    Some(out)
                }
                _ => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::GatherElements => {
            cx.require(cx.ty(1)?.dtype.is_int(), "indices must be integers")?;
            one(TensorType { dtype: cx.ty(0)?.dtype, dims: cx.ty(1)?.dims.clone() })
        }
        Op::GatherNd => {
            let t = cx.ty(0)?;
            let idx = cx.ty(1)?;
            let b = attrs.int("batch_dims", 0).max(0) as usize;
            let dims = match (&t.dims, &idx.dims) {
                (Some(d), Some(i)) if !i.is_empty() => match i.last().and_then(Dim::known) {
                    Some(last) => {
                        let mut out = i[..i.len() - 1].to_vec();
                        let start = b + last as usize;
                        cx.require(start <= d.len(), "index tuples are longer than the data rank")?;
                        out.extend(d[start..].iter().cloned());
                        Some(out)
                    }
                    None => None,
                },
                _ => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::ScatterElements | Op::ScatterNd => {
            cx.same_dtype(&[0, 2])?;
            same_as(0)
        }
        Op::TensorScatter => {
            let d = cx.same_dtype(&[0, 1])?;
            cx.require(
                d != DType::String,
                "takes no strings (rows are copied as fixed-size elements)",
            )?;
            same_as(0)
        }
        Op::Stft => crate::infer_state::stft(&cx, attrs),
        Op::RoiAlign => crate::infer_state::roi_align(&cx, attrs),
        Op::LinearAttention => crate::infer_state::linear_attention(&cx, attrs, n_outputs),
        Op::CausalConvWithState => crate::infer_state::causal_conv(&cx, attrs, n_outputs),
        Op::Attention => {
            let q = cx.ty(0)?;
            let v = cx.ty(2)?;
            let mut out = Vec::new();
            let y_dims = match (&q.dims, &v.dims) {
                (Some(qd), Some(vd)) if qd.len() == 4 && vd.len() == 4 => {
                    Some(vec![qd[0].clone(), qd[1].clone(), qd[2].clone(), vd[3].clone()])
                }
                (Some(qd), _) if qd.len() == 3 => {
                    Some(vec![qd[0].clone(), qd[1].clone(), Dim::Unknown])
                }
                _ => None,
            };
            out.push(TensorType { dtype: q.dtype, dims: y_dims });
            for _ in 1..n_outputs {
                out.push(TensorType { dtype: q.dtype, dims: Some(vec![Dim::Unknown; 4]) });
            }
            Ok(out)
        }
        Op::HannWindow | Op::HammingWindow | Op::BlackmanWindow => {
            let n = cx
                .const_ints(0)
                .and_then(|v| v.first().copied())
                .map(known)
                .unwrap_or(Dim::Unknown);
            one(TensorType::new(attrs.dtype("output_datatype").unwrap_or(DType::F32), vec![n]))
        }
        Op::CenterCropPad => {
            let t = cx.ty(0)?;
            let dims = match (&t.dims, cx.const_ints(1)) {
                (Some(d), Some(target)) => {
                    let axes: Vec<usize> = match attrs.ints("axes") {
                        Some(a) => {
                            a.iter().map(|&a| cx.axis(a, d.len())).collect::<Result<_, _>>()?
                        }
                        None => (0..d.len()).collect(),
                    };
                    cx.require(axes.len() == target.len(), "shape must give one size per axis")?;
                    let mut out = d.clone();
                    for (&a, &s) in axes.iter().zip(&target) {
                        out[a] = known(s);
                    }
                    Some(out)
                }
                (Some(d), None) => Some(vec![Dim::Unknown; d.len()]),
                _ => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::RotaryEmbedding => same_as(0),
        Op::Dft => {
            let t = cx.ty(0)?;
            let inverse = attrs.int("inverse", 0) != 0;
            let onesided = attrs.int("onesided", 0) != 0;
            let dims = match &t.dims {
                Some(d) if d.len() >= 2 => {
                    let mut out = d.clone();
                    let axis = match cx.opt_ty(2) {
                        None => Some(cx.axis(-2, d.len())?),
                        Some(_) => match cx.const_ints(2).and_then(|v| v.first().copied()) {
                            Some(a) => Some(cx.axis(a, d.len())?),
                            None => None,
                        },
                    };
                    let last = d.len() - 1;
                    out[last] = Dim::Known(if inverse && onesided { 1 } else { 2 });
                    match axis {
                        Some(a) => {
                            cx.require(
                                a != last,
                                "axis must not be the trailing real/imaginary dim",
                            )?;
                            let n = match (
                                cx.opt_ty(1),
                                cx.const_ints(1).and_then(|v| v.first().copied()),
                            ) {
                                (Some(_), Some(l)) => Some(l),
                                (Some(_), None) => None,
                                (None, _) => d[a].known().map(|k| {
                                    if inverse && onesided { 2 * (k as i64 - 1) } else { k as i64 }
                                }),
                            };
                            out[a] = match n {
                                Some(n) if onesided && !inverse => known(n / 2 + 1),
                                Some(n) => known(n),
                                None => Dim::Unknown,
                            };
                        }
                        None => out.iter_mut().take(last).for_each(|x| *x = Dim::Unknown),
                    }
                    Some(out)
                }
                Some(d) => return cx.err(format!("input must have rank ≥ 2, got {}", d.len())),
                None => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::AffineGrid => {
            let t = cx.ty(0)?;
            let dims = match cx.const_ints(1) {
                Some(size) if size.len() >= 3 => {
                    let mut d: Vec<Dim> = vec![known(size[0])];
                    d.extend(size[2..].iter().map(|&v| known(v)));
                    d.push(known(size.len() as i64 - 2));
                    Some(d)
                }
                _ => None,
            };
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::GridSample => {
            let (x, g) = (cx.ty(0)?, cx.ty(1)?);
            let dims = match (&x.dims, &g.dims) {
                (Some(xd), Some(gd)) if xd.len() >= 3 && gd.len() == xd.len() => {
                    let mut d = vec![xd[0].clone(), xd[1].clone()];
                    d.extend(gd[1..gd.len() - 1].iter().cloned());
                    Some(d)
                }
                (Some(xd), _) => Some(vec![Dim::Unknown; xd.len()]),
                _ => None,
            };
            one(TensorType { dtype: x.dtype, dims })
        }
        Op::NonMaxSuppression => {
            one(TensorType::new(DType::I64, vec![Dim::Unknown, Dim::Known(3)]))
        }
        Op::MaxUnpool => {
            let t = cx.ty(0)?;
            let dims = t.rank().map(|r| vec![Dim::Unknown; r]);
            one(TensorType { dtype: t.dtype, dims })
        }
        Op::QuantizeLinear => {
            let x = cx.ty(0)?;
            let dtype =
                cx.opt_ty(2).map(|t| t.dtype).or(attrs.dtype("output_dtype")).unwrap_or(DType::U8);
            one(TensorType { dtype, dims: x.dims.clone() })
        }
        Op::DequantizeLinear => {
            let dtype = attrs.dtype("output_dtype").unwrap_or(cx.ty(1)?.dtype);
            cx.require(dtype.is_float(), format!("dequantizes to a float type, not {dtype}"))?;
            one(TensorType { dtype, dims: cx.ty(0)?.dims.clone() })
        }
        Op::DynamicQuantizeLinear => {
            let x = cx.ty(0)?;
            Ok(vec![
                TensorType { dtype: DType::U8, dims: x.dims.clone() },
                TensorType::new(x.dtype, vec![]),
                TensorType::new(DType::U8, vec![]),
            ])
        }
        Op::MatMulInteger | Op::QLinearMatMul => {
            let (ai, bi) = if op == Op::MatMulInteger { (0, 1) } else { (0, 3) };
            let dims = match (cx.dims(ai)?, cx.dims(bi)?) {
                (Some(a), Some(b)) => Some(matmul_dims(&cx, a, b)?),
                _ => None,
            };
            let dtype = if op == Op::MatMulInteger { DType::I32 } else { cx.ty(7)?.dtype };
            one(TensorType { dtype, dims })
        }
        Op::ConvInteger | Op::QLinearConv => {
            let (xi, wi, dtype) =
                if op == Op::ConvInteger { (0, 1, DType::I32) } else { (0, 3, cx.ty(7)?.dtype) };
            one(TensorType { dtype, dims: conv_dims_at(&cx, xi, wi)? })
        }
        Op::Rnn | Op::Gru | Op::Lstm => {
            let x = cx.ty(0)?;
            let w = cx.ty(1)?;
            let r = cx.ty(2)?;
            let layout = attrs.int("layout", 0);
            let dirs = w.dims.as_ref().and_then(|d| d.first().cloned()).unwrap_or(Dim::Unknown);
            let hidden = attrs
                .opt_int("hidden_size")
                .map(known)
                .or_else(|| r.dims.as_ref().and_then(|d| d.get(2).cloned()))
                .unwrap_or(Dim::Unknown);
            let (seq, batch) = match &x.dims {
                Some(d) if d.len() == 3 => {
                    if layout == 1 {
                        (d[1].clone(), d[0].clone())
                    } else {
                        (d[0].clone(), d[1].clone())
                    }
                }
                Some(d) => return cx.err(format!("X must be 3-D, got rank {}", d.len())),
                None => (Dim::Unknown, Dim::Unknown),
            };
            let y = if layout == 1 {
                vec![batch.clone(), seq, dirs.clone(), hidden.clone()]
            } else {
                vec![seq, dirs.clone(), batch.clone(), hidden.clone()]
            };
            let state =
                if layout == 1 { vec![batch, dirs, hidden] } else { vec![dirs, batch, hidden] };
            let mut out = vec![TensorType::new(x.dtype, y)];
            for _ in 1..n_outputs {
                out.push(TensorType::new(x.dtype, state.clone()));
            }
            Ok(out)
        }
        Op::SoftmaxCrossEntropyLoss | Op::NegativeLogLikelihoodLoss => {
            let t = cx.ty(0)?;
            let labels = cx.ty(1)?;
            cx.require(labels.dtype.is_int(), "labels must be integers")?;
            let dims = if attrs.str("reduction", "mean") == "none" {
                labels.dims.clone()
            } else {
                Some(vec![])
            };
            let mut out = vec![TensorType { dtype: t.dtype, dims }];
            if n_outputs == 2 {
                out.push(t.clone());
            }
            Ok(out)
        }
        _ => cx.err("no inference rule (internal error)"),
    }
}

fn arity((lo, hi): (usize, usize)) -> String {
    if lo == hi {
        format!("{lo}")
    } else if hi == crate::op::MANY {
        format!("at least {lo}")
    } else {
        format!("{lo} to {hi}")
    }
}

/// The product of dims: known when all are known; a symbol when exactly one dim is a symbol
/// and the others are 1 (flattening `[N, 1, 1]` keeps `N`); else unknown.
fn product(d: &[Dim]) -> Dim {
    let mut p = 1u64;
    let mut symbol = None;
    for x in d {
        match x {
            Dim::Known(n) => p = p.saturating_mul(*n),
            Dim::Sym(s) if symbol.is_none() => symbol = Some(s),
            _ => return Dim::Unknown,
        }
    }
    match symbol {
        None => Dim::Known(p),
        Some(s) if p == 1 => Dim::Sym(s.clone()),
        Some(_) => Dim::Unknown,
    }
}

fn reduce_dims(d: &[Dim], axes: &[usize], keep: bool) -> Vec<Dim> {
    d.iter()
        .enumerate()
        .filter_map(
            |(i, x)| {
                if axes.contains(&i) { keep.then_some(Dim::Known(1)) } else { Some(x.clone()) }
            },
        )
        .collect()
}

fn broadcast_all(cx: &Cx<'_>, idx: &[usize]) -> Result<Option<Vec<Dim>>, InferError> {
    let mut acc: Vec<Dim> = Vec::new();
    for &i in idx {
        match cx.dims(i)? {
            Some(d) => {
                acc = broadcast_dims(&acc, d)
                    .or_else(|e| cx.err(format!("inputs do not broadcast: {e}")))?
            }
            None => return Ok(None),
        }
    }
    Ok(Some(acc))
}

fn matmul_dims(cx: &Cx<'_>, a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, InferError> {
    cx.require(!a.is_empty() && !b.is_empty(), "inputs must have rank ≥ 1")?;
    let a2: Vec<Dim> = if a.len() == 1 { vec![Dim::Known(1), a[0].clone()] } else { a.to_vec() };
    let b2: Vec<Dim> = if b.len() == 1 { vec![b[0].clone(), Dim::Known(1)] } else { b.to_vec() };
    let (k1, k2) = (&a2[a2.len() - 1], &b2[b2.len() - 2]);
    cx.require(k1.compatible(k2), format!("inner dims {k1} and {k2} differ"))?;
    let batch = broadcast_dims(&a2[..a2.len() - 2], &b2[..b2.len() - 2])
        .or_else(|e| cx.err(format!("batch dims do not broadcast: {e}")))?;
    let mut out = batch;
    if a.len() > 1 {
        out.push(a2[a2.len() - 2].clone());
    }
    if b.len() > 1 {
        out.push(b2[b2.len() - 1].clone());
    }
    Ok(out)
}

fn einsum_dims(cx: &Cx<'_>) -> Result<Option<Vec<Dim>>, InferError> {
    let eq: String = cx.attrs.str("equation", "").chars().filter(|c| !c.is_whitespace()).collect();
    let Some((lhs, rhs)) = eq.split_once("->") else { return Ok(None) };
    if eq.contains("...") {
        return Ok(None);
    }
    let mut letter_dims = std::collections::HashMap::new();
    for (i, term) in lhs.split(',').enumerate() {
        if let Some(d) = cx.dims(i)? {
            if d.len() != term.len() {
                return cx.err(format!(
                    "term `{term}` has {} letters but input {i} has rank {}",
                    term.len(),
                    d.len()
                ));
            }
            for (c, x) in term.chars().zip(d) {
                letter_dims.entry(c).or_insert_with(|| x.clone());
            }
        }
    }
    Ok(Some(rhs.chars().map(|c| letter_dims.get(&c).cloned().unwrap_or(Dim::Unknown)).collect()))
}

fn spatial_params(cx: &Cx<'_>, n: usize) -> Result<(Vec<i64>, Vec<i64>, Vec<i64>), InferError> {
    let get = |key: &str, default: i64, len: usize| -> Result<Vec<i64>, InferError> {
        match cx.attrs.ints(key) {
            Some(v) if v.len() == len => Ok(v.to_vec()),
            Some(v) => cx.err(format!("attribute `{key}` has {} values, expected {len}", v.len())),
            None => Ok(vec![default; len]),
        }
    };
    let strides = get("strides", 1, n)?;
    let dil = get("dilations", 1, n)?;
    let pads = get("pads", 0, 2 * n)?;
    cx.require(
        strides.iter().chain(&dil).all(|&v| v > 0),
        "strides and dilations must be positive",
    )?;
    Ok((strides, dil, pads))
}

/// Output extent of one pooled/convolved spatial dim.
pub fn window_out(
    input: i64,
    kernel: i64,
    stride: i64,
    dilation: i64,
    pad_begin: i64,
    pad_end: i64,
    auto_pad: &str,
    ceil: bool,
) -> i64 {
    // Saturating arithmetic: attribute values come from untrusted files.
    let stride = stride.max(1);
    let eff = kernel.saturating_sub(1).saturating_mul(dilation).saturating_add(1);
    match auto_pad {
        "SAME_UPPER" | "SAME_LOWER" => input.saturating_add(stride - 1) / stride,
        "VALID" => input.saturating_sub(eff) / stride + 1,
        _ => {
            let span = input.saturating_add(pad_begin).saturating_add(pad_end).saturating_sub(eff);
            if ceil {
                let mut out = span.saturating_add(stride - 1).div_euclid(stride) + 1;
                // The last window must start inside the input or left padding.
                if (out - 1).saturating_mul(stride) >= input.saturating_add(pad_begin) {
                    out -= 1;
                }
                out
            } else {
                span.div_euclid(stride) + 1
            }
        }
    }
}

fn conv_dims(cx: &Cx<'_>) -> Result<Option<Vec<Dim>>, InferError> {
    conv_dims_at(cx, 0, 1)
}

/// Output dims of a convolution whose data and weight are inputs `xi` and `wi`.
fn conv_dims_at(cx: &Cx<'_>, xi: usize, wi: usize) -> Result<Option<Vec<Dim>>, InferError> {
    let (Some(x), Some(w)) = (cx.dims(xi)?, cx.dims(wi)?) else { return Ok(None) };
    cx.require(x.len() >= 3 && w.len() == x.len(), "X and W must have the same rank ≥ 3")?;
    let n = x.len() - 2;
    let group = cx.attrs.int("group", 1);
    let kernel: Vec<Option<i64>> = match cx.attrs.ints("kernel_shape") {
        Some(k) => k.iter().map(|&k| Some(k)).collect(),
        None => w[2..].iter().map(|d| d.known().map(|k| k as i64)).collect(),
    };
    let (strides, dil, pads) = spatial_params(cx, n)?;
    let auto_pad = cx.attrs.str("auto_pad", "NOTSET");
    let mut out = vec![x[0].clone()];
    if cx.op != Op::ConvTranspose {
        out.push(w[0].clone());
        for i in 0..n {
            out.push(match (x[2 + i].known(), kernel.get(i).copied().flatten()) {
                (Some(xi), Some(k)) => known(window_out(
                    xi as i64,
                    k,
                    strides[i],
                    dil[i],
                    pads[i],
                    pads[i + n],
                    auto_pad,
                    false,
                )),
                _ => Dim::Unknown,
            });
        }
    } else {
        out.push(match w[1].known() {
            Some(m) => known((m as i64).saturating_mul(group)),
            None => Dim::Unknown,
        });
        let out_pad =
            cx.attrs.ints("output_padding").map(<[i64]>::to_vec).unwrap_or_else(|| vec![0; n]);
        if let Some(shape) = cx.attrs.ints("output_shape") {
            let shape = &shape[shape.len().saturating_sub(n)..];
            out.extend(shape.iter().map(|&s| known(s)));
            return Ok(Some(out));
        }
        for i in 0..n {
            out.push(match (x[2 + i].known(), kernel.get(i).copied().flatten()) {
                (Some(xi), Some(k)) => {
                    let full = strides[i]
                        .saturating_mul(xi as i64 - 1)
                        .saturating_add(out_pad[i])
                        .saturating_add((k - 1).saturating_mul(dil[i]))
                        .saturating_add(1);
                    if auto_pad.starts_with("SAME") {
                        known(xi as i64 * strides[i])
                    } else {
                        known(full - pads[i] - pads[i + n])
                    }
                }
                _ => Dim::Unknown,
            });
        }
    }
    Ok(Some(out))
}

fn pool_dims(cx: &Cx<'_>, t: &TensorType) -> Result<Option<Vec<Dim>>, InferError> {
    let Some(x) = &t.dims else { return Ok(None) };
    cx.require(x.len() >= 3, "input must have rank ≥ 3 (N, C, spatial…)")?;
    let n = x.len() - 2;
    let Some(kernel) = cx.attrs.ints("kernel_shape") else {
        return cx.err("attribute `kernel_shape` is required");
    };
    cx.require(
        kernel.len() == n,
        format!("kernel_shape has {} dims for {n} spatial dims", kernel.len()),
    )?;
    let (strides, dil, pads) = spatial_params(cx, n)?;
    let auto_pad = cx.attrs.str("auto_pad", "NOTSET");
    let ceil = cx.attrs.int("ceil_mode", 0) != 0;
    let mut out = vec![x[0].clone(), x[1].clone()];
    for i in 0..n {
        out.push(match x[2 + i].known() {
            Some(xi) => known(window_out(
                xi as i64,
                kernel[i],
                strides[i],
                dil[i],
                pads[i],
                pads[i + n],
                auto_pad,
                ceil,
            )),
            None => Dim::Unknown,
        });
    }
    Ok(Some(out))
}

fn reshape_dims(cx: &Cx<'_>, t: &TensorType, shape: &[i64]) -> Result<Vec<Dim>, InferError> {
    let allow_zero = cx.attrs.int("allowzero", 0) != 0;
    let mut out: Vec<Dim> = Vec::with_capacity(shape.len());
    let mut infer_at = None;
    for (i, &s) in shape.iter().enumerate() {
        out.push(match s {
            -1 => {
                cx.require(infer_at.is_none(), "shape has more than one -1")?;
                infer_at = Some(i);
                Dim::Unknown
            }
            0 if !allow_zero => match &t.dims {
                Some(d) if i < d.len() => d[i].clone(),
                Some(_) => {
                    return cx.err(format!("shape[{i}] = 0 copies a dim the input does not have"));
                }
                None => Dim::Unknown,
            },
            s if s < 0 => return cx.err(format!("shape[{i}] = {s} is negative")),
            s => Dim::Known(s as u64),
        });
    }
    if let (Some(at), Some(total)) = (infer_at, t.numel()) {
        let rest: Option<u64> = out
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != at)
            .try_fold(1u64, |acc, (_, d)| acc.checked_mul(d.known()?));
        if let Some(rest) = rest {
            cx.require(
                rest != 0 && (total as u64).is_multiple_of(rest),
                format!("cannot reshape {} elements into {shape:?}", total),
            )?;
            out[at] = Dim::Known(total as u64 / rest);
        }
    } else if let (None, Some(total), Some(n)) =
        (infer_at, t.numel(), out.iter().try_fold(1u64, |acc, d| acc.checked_mul(d.known()?)))
    {
        cx.require(total as u64 == n, format!("cannot reshape {total} elements into {shape:?}"))?;
    }
    Ok(out)
}

fn slice_dims(cx: &Cx<'_>, t: &TensorType) -> Result<Option<Vec<Dim>>, InferError> {
    let Some(d) = &t.dims else { return Ok(None) };
    let (Some(starts), Some(ends)) = (cx.const_ints(1), cx.const_ints(2)) else {
        return Ok(Some(vec![Dim::Unknown; d.len()]));
    };
    cx.require(starts.len() == ends.len(), "starts and ends differ in length")?;
    let axes: Vec<usize> = match (cx.opt_ty(3), cx.const_ints(3)) {
        (None, _) => (0..starts.len()).collect(),
        (Some(_), Some(a)) => a.iter().map(|&a| cx.axis(a, d.len())).collect::<Result<_, _>>()?,
        (Some(_), None) => return Ok(Some(vec![Dim::Unknown; d.len()])),
    };
    let steps: Vec<i64> = match (cx.opt_ty(4), cx.const_ints(4)) {
        (None, _) => vec![1; starts.len()],
        (Some(_), Some(s)) => s,
        (Some(_), None) => return Ok(Some(vec![Dim::Unknown; d.len()])),
    };
    cx.require(
        axes.len() == starts.len() && steps.len() == starts.len(),
        "axes and steps must match starts",
    )?;
    let mut out = d.clone();
    for (k, &a) in axes.iter().enumerate() {
        cx.require(steps[k] != 0, "slice step 0")?;
        out[a] = match d[a].known() {
            Some(n) => known(slice_len(n as i64, starts[k], ends[k], steps[k])),
            None => Dim::Unknown,
        };
    }
    Ok(Some(out))
}

/// Number of elements ONNX Slice selects from a dim of size `n`.
pub fn slice_len(n: i64, start: i64, end: i64, step: i64) -> i64 {
    let (s, e) = slice_bounds(n, start, end, step);
    if step > 0 {
        ((e - s) + step - 1).div_euclid(step).max(0)
    } else {
        ((s - e) + (-step) - 1).div_euclid(-step).max(0)
    }
}

/// Clamped (start, end) of an ONNX Slice along a dim of size `n`.
pub fn slice_bounds(n: i64, start: i64, end: i64, step: i64) -> (i64, i64) {
    let fix = |x: i64| if x < 0 { x.saturating_add(n) } else { x };
    let (s, e) = (fix(start), fix(end));
    if step > 0 { (s.clamp(0, n), e.clamp(0, n)) } else { (s.clamp(-1, n - 1), e.clamp(-1, n - 1)) }
}
