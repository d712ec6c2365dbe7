//! Reductions, arg-reductions, scans, top-k and the softmax family.
//!
//! Values are accumulated in f64 (exact for every int that fits 2^53, and more accurate than
//! f32 accumulation) and converted back to the input's dtype.

use ndarray::{ArrayD, Axis, IxDyn};
use xpu_ir::{Attrs, DType, Op, Tensor};

use crate::util::{KResult, ints, norm_axis, opt, req, tensor, view};
use crate::{numeric, scalar::Scalar};

/// The tensor as f64 values in its shape.
pub fn to_f64(t: &Tensor) -> KResult<ArrayD<f64>> {
    if let Some(s) = t.as_slice::<f64>() {
        return ArrayD::from_shape_vec(IxDyn(t.shape()), s.to_vec()).map_err(|e| e.to_string());
    }
    if let Some(s) = t.as_slice::<f32>() {
        return ArrayD::from_shape_vec(IxDyn(t.shape()), s.iter().map(|&x| x as f64).collect())
            .map_err(|e| e.to_string());
    }
    if t.dtype() == DType::String {
        return Err("string tensors have no numeric value".into());
    }
    ArrayD::from_shape_vec(IxDyn(t.shape()), t.to_f64_vec()).map_err(|e| e.to_string())
}

/// f64 values back into `dtype` (floats round, ints convert as numpy would).
pub fn from_f64(a: ArrayD<f64>, dtype: DType) -> KResult<Tensor> {
    match dtype {
        DType::F64 => Ok(tensor(a)),
        DType::F32 => Ok(tensor(a.mapv(|x| x as f32))),
        DType::Bool => Ok(tensor(a.mapv(|x| x != 0.0))),
        d => numeric!(d, T => Ok(tensor(a.mapv(T::from_f64))), crate::cast::cast(&tensor(a), d)),
    }
}

/// Moves `axes` last and returns (outer shape, rows of the reduced elements).
fn rows(x: &ArrayD<f64>, axes: &[usize]) -> (Vec<usize>, usize, Vec<f64>) {
    let keep: Vec<usize> = (0..x.ndim()).filter(|a| !axes.contains(a)).collect();
    let order: Vec<usize> = keep.iter().chain(axes).copied().collect();
    let p = x.view().permuted_axes(IxDyn(&order));
    let inner: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let data: Vec<f64> = p.iter().copied().collect();
    (keep.iter().map(|&a| x.shape()[a]).collect(), inner, data)
}

fn reduced_shape(shape: &[usize], axes: &[usize], keep: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| if axes.contains(&i) { keep.then_some(1) } else { Some(d) })
        .collect()
}

pub fn reduce(op: Op, attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    let keep = attrs.int("keepdims", 1) != 0;
    let axes_given = match opt(inputs, 1) {
        Some(t) => ints(t, "axes")?,
        None => vec![],
    };
    if axes_given.is_empty() && attrs.int("noop_with_empty_axes", 0) != 0 {
        return Ok(x.clone());
    }
    let r = x.rank();
    let mut axes: Vec<usize> = if axes_given.is_empty() {
        (0..r).collect()
    } else {
        axes_given.iter().map(|&a| norm_axis(a, r)).collect::<KResult<_>>()?
    };
    axes.sort_unstable();
    axes.dedup();
    let xf = to_f64(x)?;
    let (_, inner, data) = rows(&xf, &axes);
    let is_int = !x.dtype().is_float();
    let (lowest, highest) = if x.dtype() == DType::Bool {
        (0.0, 1.0)
    } else if is_int {
        numeric!(x.dtype(), T => (<T as num_traits::Bounded>::min_value().to_f64(), <T as num_traits::Bounded>::max_value().to_f64()), (f64::NEG_INFINITY, f64::INFINITY))
    } else {
        (f64::NEG_INFINITY, f64::INFINITY)
    };
    let f = |row: &[f64]| -> f64 {
        match op {
            Op::ReduceSum => row.iter().sum(),
            Op::ReduceMean => row.iter().sum::<f64>() / row.len() as f64,
            Op::ReduceMax => {
                row.iter().copied().fold(lowest, |a, b| if b.is_nan() || b > a { b } else { a })
            }
            Op::ReduceMin => {
                row.iter().copied().fold(highest, |a, b| if b.is_nan() || b < a { b } else { a })
            }
            Op::ReduceProd => row.iter().product(),
            Op::ReduceL1 => row.iter().map(|v| v.abs()).sum(),
            Op::ReduceL2 => row.iter().map(|v| v * v).sum::<f64>().sqrt(),
            Op::ReduceLogSum => row.iter().sum::<f64>().ln(),
            Op::ReduceLogSumExp => {
                let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                if m.is_infinite() {
                    row.iter().map(|v| v.exp()).sum::<f64>().ln()
                } else {
                    m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
                }
            }
            _ => row.iter().map(|v| v * v).sum(),
        }
    };
    let out: Vec<f64> = if inner == 0 {
        let n = data.len().max(reduced_shape(x.shape(), &axes, false).iter().product());
        vec![f(&[]); n]
    } else {
        data.chunks(inner).map(f).collect()
    };
    let shape = reduced_shape(x.shape(), &axes, keep);
    let a = ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?;
    from_f64(a, x.dtype())
}

pub fn arg(op: Op, attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    let axis = norm_axis(attrs.int("axis", 0), x.rank())?;
    let keep = attrs.int("keepdims", 1) != 0;
    let last = attrs.int("select_last_index", 0) != 0;
    let xf = to_f64(x)?;
    let (_, inner, data) = rows(&xf, &[axis]);
    if inner == 0 {
        return Err(format!("{op} over an empty axis"));
    }
    let out: Vec<i64> = data
        .chunks(inner)
        .map(|row| {
            let mut best = 0usize;
            for (i, &v) in row.iter().enumerate().skip(1) {
                let better = if op == Op::ArgMax {
                    v > row[best] || (last && v == row[best])
                } else {
                    v < row[best] || (last && v == row[best])
                };
                if better {
                    best = i;
                }
            }
            best as i64
        })
        .collect();
    let shape = reduced_shape(x.shape(), &[axis], keep);
    Ok(tensor(ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?))
}

pub fn cumulative(op: Op, attrs: &Attrs, x: &Tensor, axis_t: &Tensor) -> KResult<Tensor> {
    let axis = norm_axis(*ints(axis_t, "axis")?.first().ok_or("axis is empty")?, x.rank())?;
    let exclusive = attrs.int("exclusive", 0) != 0;
    let reverse = attrs.int("reverse", 0) != 0;
    numeric!(x.dtype(), T => {
        let mut a = view::<T>(x)?.to_owned();
        let prod = op == Op::CumProd;
        for mut lane in a.lanes_mut(Axis(axis)) {
            let n = lane.len();
            let mut acc = if prod { T::one() } else { T::zero() };
            for k in 0..n {
                let i = if reverse { n - 1 - k } else { k };
                let v = lane[i];
                if exclusive {
                    lane[i] = acc;
                    acc = if prod { acc.mul(v) } else { acc.add(v) };
                } else {
                    acc = if prod { acc.mul(v) } else { acc.add(v) };
                    lane[i] = acc;
                }
            }
        }
        Ok(tensor(a))
    }, Err(format!("{op} does not support dtype {}", x.dtype())))
}

pub fn top_k(attrs: &Attrs, x: &Tensor, k: &Tensor) -> KResult<Vec<Tensor>> {
    let axis = norm_axis(attrs.int("axis", -1), x.rank())?;
    let k = *ints(k, "k")?.first().ok_or("k is empty")?;
    let n = x.shape()[axis];
    if k < 0 || k as usize > n {
        return Err(format!("k = {k} is outside 0..={n}"));
    }
    let k = k as usize;
    let largest = attrs.int("largest", 1) != 0;
    let xf = to_f64(x)?;
    let (_, inner, data) = rows(&xf, &[axis]);
    let mut vals = Vec::new();
    let mut idxs = Vec::new();
    if inner > 0 {
        for row in data.chunks(inner) {
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|&i, &j| {
                let (a, b) = (row[i], row[j]);
                let c = if largest { b.partial_cmp(&a) } else { a.partial_cmp(&b) };
                c.unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()).reverse()).then(i.cmp(&j))
            });
            for &i in &order[..k] {
                vals.push(row[i]);
                idxs.push(i as i64);
            }
        }
    }
    // Results are laid out with `axis` last; move it back.
    let mut shape_last: Vec<usize> =
        x.shape().iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, &d)| d).collect();
    shape_last.push(k);
    let mut back: Vec<usize> = (0..x.rank() - 1).collect();
    back.insert(axis, x.rank() - 1);
    let v = ArrayD::from_shape_vec(IxDyn(&shape_last), vals)
        .map_err(|e| e.to_string())?
        .permuted_axes(IxDyn(&back));
    let i = ArrayD::from_shape_vec(IxDyn(&shape_last), idxs)
        .map_err(|e| e.to_string())?
        .permuted_axes(IxDyn(&back));
    Ok(vec![
        from_f64(v.as_standard_layout().into_owned(), x.dtype())?,
        tensor(i.as_standard_layout().into_owned()),
    ])
}

/// Rounds an intermediate to the tensor's own type where that type is a 16-bit float.
///
/// ONNX defines Softmax and LogSoftmax (opset 13) by a function body — ReduceMax, Sub, Exp,
/// ReduceSum, Div (Log, Sub) — whose every value has the input's type. At f32 and f64 the
/// difference is far below any tolerance; at f16 and bf16 it is an ulp or two, and ONNX's own
/// expectations (its reference evaluator runs the body op by op) follow the body. Keeping the
/// intermediates exact there made `test_attention_4d_causal_fp16_expanded` two f16 ulps off.
fn intermediate_rounding(dtype: xpu_ir::DType) -> fn(f64) -> f64 {
    match dtype {
        xpu_ir::DType::F16 => |v| half::f16::from_f64(v).to_f64(),
        xpu_ir::DType::BF16 => |v| half::bf16::from_f64(v).to_f64(),
        _ => |v| v,
    }
}

pub fn softmax(op: Op, attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    softmax_with_values_of(op, attrs, x, x.dtype())
}

/// Softmax of `x` (widened to f32 where the graph's type is 16-bit) whose intermediates are
/// values of `value_type`, the graph's type.
pub fn softmax_with_values_of(
    op: Op,
    attrs: &Attrs,
    x: &Tensor,
    value_type: xpu_ir::DType,
) -> KResult<Tensor> {
    let axis = norm_axis(attrs.int("axis", -1), x.rank())?;
    let round = intermediate_rounding(value_type);
    let mut a = to_f64(x)?;
    for mut lane in a.lanes_mut(Axis(axis)) {
        let m = lane.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        match op {
            Op::Hardmax => {
                let first = lane.iter().position(|&v| v == m);
                for (i, v) in lane.iter_mut().enumerate() {
                    *v = if Some(i) == first { 1.0 } else { 0.0 };
                }
            }
            _ => {
                let exp = |v: f64| round(round(v - m).exp());
                // The sum rounded too, unless that overflows (70,000 equal f16 logits sum
                // past 65,504): then it stays exact, as ORT and PyTorch keep it.
                let exact: f64 = lane.iter().map(|&v| exp(v)).sum();
                let sum = Some(round(exact)).filter(|s| s.is_finite()).unwrap_or(exact);
                for v in lane.iter_mut() {
                    *v = if op == Op::Softmax {
                        exp(*v) / sum
                    } else {
                        round(*v - m) - round(sum.ln())
                    };
                }
            }
        }
    }
    from_f64(a, x.dtype())
}
