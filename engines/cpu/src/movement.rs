//! Shape and data movement: reshape, transpose, slicing, concatenation, padding, tiling,
//! and the generators (range, constant_of_shape, eye_like).

use ndarray::{ArrayD, Axis, IxDyn, Slice};
use xpu_ir::{Attrs, DType, Op, Tensor};

use crate::util::{KResult, checked_numel, ints, norm_axis, opt, req, strides, tensor, view};
use crate::{any_dtype, numeric};

pub fn reshape_dims(x: &Tensor, spec: &[i64], allow_zero: bool) -> KResult<Vec<usize>> {
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &s) in spec.iter().enumerate() {
        out.push(match s {
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            -1 => return Err("shape has more than one -1".into()),
            0 if !allow_zero => *x.shape().get(i).ok_or_else(|| {
                format!("shape[{i}] = 0 copies a dim the input (shape {:?}) lacks", x.shape())
            })?,
            s if s < 0 => return Err(format!("shape[{i}] = {s} is invalid")),
            s => s as usize,
        });
    }
    if let Some(i) = infer {
        let rest: usize =
            out.iter().enumerate().filter(|(k, _)| *k != i).map(|(_, &d)| d).product();
        if rest == 0 || !x.numel().is_multiple_of(rest) {
            return Err(format!(
                "cannot reshape {} elements (shape {:?}) into {spec:?}",
                x.numel(),
                x.shape()
            ));
        }
        out[i] = x.numel() / rest;
    }
    if out.iter().product::<usize>() != x.numel() {
        return Err(format!(
            "cannot reshape {} elements (shape {:?}) into {spec:?}",
            x.numel(),
            x.shape()
        ));
    }
    Ok(out)
}

pub fn reshape(attrs: &Attrs, x: &Tensor, shape: &Tensor) -> KResult<Tensor> {
    let dims = reshape_dims(x, &ints(shape, "shape")?, attrs.int("allowzero", 0) != 0)?;
    x.clone().reshaped(dims).map_err(|e| e.to_string())
}

pub fn transpose(x: &Tensor, perm: Option<&[i64]>) -> KResult<Tensor> {
    let r = x.rank();
    let perm: Vec<usize> = match perm {
        Some(p) => p.iter().map(|&a| norm_axis(a, r)).collect::<KResult<_>>()?,
        None => (0..r).rev().collect(),
    };
    if perm.len() != r {
        return Err(format!("perm {perm:?} does not match rank {r}"));
    }
    any_dtype!(x.dtype(), T => {
        let v = view::<T>(x)?.permuted_axes(IxDyn(&perm));
        Ok(tensor(v.as_standard_layout().into_owned()))
    })
}

pub fn squeeze(x: &Tensor, axes: Option<&Tensor>) -> KResult<Tensor> {
    let r = x.rank();
    let axes: Vec<usize> = match axes {
        Some(a) => ints(a, "axes")?.iter().map(|&a| norm_axis(a, r)).collect::<KResult<_>>()?,
        None => (0..r).filter(|&i| x.shape()[i] == 1).collect(),
    };
    for &a in &axes {
        if x.shape()[a] != 1 {
            return Err(format!("cannot squeeze axis {a} of size {}", x.shape()[a]));
        }
    }
    let shape =
        x.shape().iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
    x.clone().reshaped(shape).map_err(|e| e.to_string())
}

pub fn unsqueeze(x: &Tensor, axes: &Tensor) -> KResult<Tensor> {
    let a = ints(axes, "axes")?;
    let r = x.rank() + a.len();
    let mut axes: Vec<usize> = a.iter().map(|&a| norm_axis(a, r)).collect::<KResult<_>>()?;
    axes.sort_unstable();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        return Err("axes repeat".into());
    }
    let mut it = x.shape().iter();
    let shape =
        (0..r).map(|i| if axes.contains(&i) { 1 } else { *it.next().unwrap_or(&1) }).collect();
    x.clone().reshaped(shape).map_err(|e| e.to_string())
}

pub fn flatten(attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    let r = x.rank() as i64;
    let mut axis = attrs.int("axis", 1);
    if axis < 0 {
        axis += r;
    }
    if !(0..=r).contains(&axis) {
        return Err(format!("axis {axis} is out of range for rank {r}"));
    }
    let (a, b) = x.shape().split_at(axis as usize);
    let shape = vec![a.iter().product(), b.iter().product()];
    x.clone().reshaped(shape).map_err(|e| e.to_string())
}

pub fn concat(attrs: &Attrs, inputs: &[&Tensor]) -> KResult<Tensor> {
    let first = inputs.first().ok_or("concat needs inputs")?;
    let axis = norm_axis(attrs.int("axis", 0), first.rank())?;
    any_dtype!(first.dtype(), T => {
        let views: Vec<_> = inputs.iter().map(|t| view::<T>(t)).collect::<KResult<_>>()?;
        Ok(tensor(ndarray::concatenate(Axis(axis), &views).map_err(|e| format!("inputs do not concatenate along axis {axis}: {e}"))?))
    })
}

/// `inputs` joined along `axis` (their other dims equal).
pub fn concat_tensors(inputs: &[&Tensor], axis: usize) -> KResult<Tensor> {
    concat(&Attrs::new().with("axis", xpu_ir::Attr::Int(axis as i64)), inputs)
}

/// Slice `index` of `x` along `axis`, with that axis removed.
pub fn index_axis(x: &Tensor, axis: usize, index: usize) -> KResult<Tensor> {
    if axis >= x.rank() || index >= x.shape()[axis] {
        return Err(format!("slice {index} along axis {axis} of shape {:?}", x.shape()));
    }
    any_dtype!(x.dtype(), T => {
        let v = view::<T>(x)?;
        Ok(tensor(v.index_axis(Axis(axis), index).to_owned()))
    })
}

pub fn split(attrs: &Attrs, inputs: &[Option<&Tensor>], n_out: usize) -> KResult<Vec<Tensor>> {
    let x = req(inputs, 0)?;
    let axis = norm_axis(attrs.int("axis", 0), x.rank())?;
    let dim = x.shape()[axis];
    let sizes: Vec<usize> = match opt(inputs, 1) {
        Some(s) => ints(s, "split")?.iter().map(|&v| v.max(0) as usize).collect(),
        None => {
            let parts = attrs.opt_int("num_outputs").map(|v| v as usize).unwrap_or(n_out).max(1);
            let chunk = dim.div_ceil(parts);
            (0..parts).map(|i| dim.saturating_sub(i * chunk).min(chunk)).collect()
        }
    };
    if sizes.iter().sum::<usize>() != dim || sizes.len() != n_out {
        return Err(format!("split sizes {sizes:?} do not cover dim {dim} in {n_out} outputs"));
    }
    let mut start = 0;
    let mut out = Vec::new();
    for s in sizes {
        out.push(slice_axis(x, axis, start, start + s, 1)?);
        start += s;
    }
    Ok(out)
}

fn slice_axis(x: &Tensor, axis: usize, start: usize, end: usize, step: isize) -> KResult<Tensor> {
    any_dtype!(x.dtype(), T => {
        let v = view::<T>(x)?;
        Ok(tensor(v.slice_axis(Axis(axis), Slice::new(start as isize, Some(end as isize), step)).to_owned()))
    })
}

pub fn slice(inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    let starts = ints(req(inputs, 1)?, "starts")?;
    let ends = ints(req(inputs, 2)?, "ends")?;
    let r = x.rank();
    let axes: Vec<usize> = match opt(inputs, 3) {
        Some(a) => ints(a, "axes")?.iter().map(|&a| norm_axis(a, r)).collect::<KResult<_>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = match opt(inputs, 4) {
        Some(s) => ints(s, "steps")?,
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps must have the same length".into());
    }
    let mut spec: Vec<Slice> = (0..r).map(|_| Slice::new(0, None, 1)).collect();
    for k in 0..starts.len() {
        let n = x.shape()[axes[k]] as i64;
        let step = steps[k];
        if step == 0 {
            return Err("slice step must not be 0".into());
        }
        let (s, e) = xpu_ir::infer::slice_bounds(n, starts[k], ends[k], step);
        spec[axes[k]] = if step > 0 {
            Slice::new(s as isize, Some(e.max(s) as isize), step as isize)
        } else {
            // ndarray walks [lo, hi) backwards from hi-1: ONNX's s, s+step, … > e.
            let (lo, hi) = (e + 1, s + 1);
            Slice::new(lo.min(hi) as isize, Some(hi as isize), step as isize)
        };
    }
    any_dtype!(x.dtype(), T => {
        let v = view::<T>(x)?;
        Ok(tensor(v.slice_each_axis(|ax| spec[ax.axis.index()]).to_owned()))
    })
}

pub fn expand(x: &Tensor, shape: &Tensor) -> KResult<Tensor> {
    let s: Vec<usize> = ints(shape, "shape")?.iter().map(|&v| v.max(0) as usize).collect();
    let target = crate::elementwise::broadcast_shape(x.shape(), &s)?;
    checked_numel(&target)?;
    any_dtype!(x.dtype(), T => {
        let v = view::<T>(x)?;
        Ok(tensor(v.broadcast(IxDyn(&target)).ok_or("broadcast failed")?.to_owned()))
    })
}

pub fn tile(x: &Tensor, repeats: &Tensor) -> KResult<Tensor> {
    let reps = ints(repeats, "repeats")?;
    if reps.len() != x.rank() || reps.iter().any(|&r| r < 0) {
        return Err(format!("repeats {reps:?} must be {} non-negative values", x.rank()));
    }
    let shape: Vec<usize> =
        x.shape().iter().zip(&reps).map(|(&d, &r)| d.saturating_mul(r as usize)).collect();
    checked_numel(&shape)?;
    any_dtype!(x.dtype(), T => {
        let v = view::<T>(x)?;
        let src = x.shape().to_vec();
        Ok(tensor(ArrayD::from_shape_fn(IxDyn(&shape), |i| {
            let idx: Vec<usize> = (0..src.len()).map(|d| i[d] % src[d]).collect();
            v[IxDyn(&idx)].clone()
        })))
    })
}

pub fn pad(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    let r = x.rank();
    let p = ints(req(inputs, 1)?, "pads")?;
    let axes: Vec<usize> = match opt(inputs, 3) {
        Some(a) => ints(a, "axes")?.iter().map(|&a| norm_axis(a, r)).collect::<KResult<_>>()?,
        None => (0..r).collect(),
    };
    if p.len() != 2 * axes.len() {
        return Err(format!("pads has {} values, expected {}", p.len(), 2 * axes.len()));
    }
    let mut before = vec![0i64; r];
    let mut after = vec![0i64; r];
    for (k, &a) in axes.iter().enumerate() {
        before[a] = p[k];
        after[a] = p[k + axes.len()];
    }
    let shape: Vec<usize> = (0..r)
        .map(|d| {
            (x.shape()[d] as i64).saturating_add(before[d]).saturating_add(after[d]).max(0) as usize
        })
        .collect();
    checked_numel(&shape)?;
    let mode = attrs.str("mode", "constant").to_string();
    let src = x.shape().to_vec();
    if mode != "constant" && src.contains(&0) && shape.iter().any(|&d| d > 0) {
        return Err(format!("{mode} padding needs a non-empty input"));
    }
    any_dtype!(x.dtype(), T => {
        let v = view::<T>(x)?;
        let fill: T = match opt(inputs, 2) {
            Some(c) if c.numel() > 0 => view::<T>(c)?.iter().next().cloned().ok_or("empty constant")?,
            _ => view::<T>(&Tensor::zeros(x.dtype(), vec![1]))?[[0]].clone(),
        };
        Ok(tensor(ArrayD::from_shape_fn(IxDyn(&shape), |i| {
            let mut idx = Vec::with_capacity(r);
            for d in 0..r {
                let n = src[d] as i64;
                let mut s = i[d] as i64 - before[d];
                if s < 0 || s >= n {
                    match mode.as_str() {
                        "edge" => s = s.clamp(0, n - 1),
                        "wrap" => s = s.rem_euclid(n),
                        "reflect" => {
                            if n == 1 {
                                s = 0;
                            } else {
                                let period = 2 * (n - 1);
                                s = s.rem_euclid(period);
                                if s >= n {
                                    s = period - s;
                                }
                            }
                        }
                        _ => return fill.clone(),
                    }
                }
                idx.push(s as usize);
            }
            v[IxDyn(&idx)].clone()
        })))
    })
}

pub fn shape_of(attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    let r = x.rank() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (s, e) = (clamp(attrs.int("start", 0)), clamp(attrs.int("end", r)));
    let dims: Vec<i64> = x.shape()[s..e.max(s)].iter().map(|&d| d as i64).collect();
    Tensor::from_vec(vec![dims.len()], dims).map_err(|e| e.to_string())
}

pub fn depth_space(op: Op, attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    let b = attrs.int("blocksize", 0);
    if b <= 0 || x.rank() != 4 {
        return Err("needs a 4-D input and a positive blocksize".into());
    }
    let b = b as usize;
    let (n, c, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (tmp, perm, out): (Vec<usize>, Vec<usize>, Vec<usize>) = if op == Op::DepthToSpace {
        if c % (b * b) != 0 {
            return Err(format!("{c} channels are not divisible by blocksize² = {}", b * b));
        }
        if attrs.str("mode", "DCR") == "CRD" {
            (
                vec![n, c / (b * b), b, b, h, w],
                vec![0, 1, 4, 2, 5, 3],
                vec![n, c / (b * b), h * b, w * b],
            )
        } else {
            (
                vec![n, b, b, c / (b * b), h, w],
                vec![0, 3, 4, 1, 5, 2],
                vec![n, c / (b * b), h * b, w * b],
            )
        }
    } else {
        if h % b != 0 || w % b != 0 {
            return Err(format!("spatial dims {h}×{w} are not divisible by blocksize {b}"));
        }
        // Channels ordered (block row, block column, channel), or with CRD (channel, …).
        let perm = match attrs.str("mode", "DCR") {
            "DCR" => vec![0, 3, 5, 1, 2, 4],
            "CRD" => vec![0, 1, 3, 5, 2, 4],
            m => return Err(format!("mode {m:?}: expected DCR or CRD")),
        };
        (vec![n, c, h / b, b, w / b, b], perm, vec![n, c * b * b, h / b, w / b])
    };
    let t = x.clone().reshaped(tmp).map_err(|e| e.to_string())?;
    let p: Vec<i64> = perm.iter().map(|&v| v as i64).collect();
    transpose(&t, Some(&p))?.reshaped(out).map_err(|e| e.to_string())
}

pub fn trilu(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    if x.rank() < 2 {
        return Err("trilu needs rank ≥ 2".into());
    }
    let k = match opt(inputs, 1) {
        Some(t) => *ints(t, "k")?.first().ok_or("k is empty")?,
        None => 0,
    };
    let upper = attrs.int("upper", 1) != 0;
    let r = x.rank();
    any_dtype!(x.dtype(), T => {
        let mut a = view::<T>(x)?.to_owned();
        let zero = view::<T>(&Tensor::zeros(x.dtype(), vec![1]))?[[0]].clone();
        for (idx, v) in a.indexed_iter_mut() {
            let (i, j) = (idx[r - 2] as i64, idx[r - 1] as i64);
            let keep = if upper { j - i >= k } else { j - i <= k };
            if !keep {
                *v = zero.clone();
            }
        }
        Ok(tensor(a))
    })
}

pub fn range(inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (s, l, d) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    if crate::util::is_half(s.dtype()) {
        let w: Vec<Tensor> = [s, l, d].iter().map(|t| crate::util::widen(t)).collect();
        let r = range(&[Some(&w[0]), Some(&w[1]), Some(&w[2])])?;
        return Ok(crate::util::narrow(r, s.dtype()));
    }
    numeric!(s.dtype(), T => {
        let (start, limit, delta) = (view::<T>(s)?.iter().next().copied().ok_or("empty start")?, view::<T>(l)?.iter().next().copied().ok_or("empty limit")?, view::<T>(d)?.iter().next().copied().ok_or("empty delta")?);
        use crate::scalar::Scalar;
        if delta.to_f64() == 0.0 {
            return Err("delta must not be 0".into());
        }
        let n = ((limit.to_f64() - start.to_f64()) / delta.to_f64()).ceil().max(0.0) as usize;
        if n > 1 << 31 {
            return Err(format!("range of {n} elements is too large"));
        }
        let mut out = Vec::with_capacity(n);
        let mut v = start;
        for _ in 0..n {
            out.push(v);
            v = v.add(delta);
        }
        Tensor::from_vec(vec![n], out).map_err(|e| e.to_string())
    }, Err(format!("range does not support dtype {}", s.dtype())))
}

pub fn constant_of_shape(attrs: &Attrs, shape: &Tensor) -> KResult<Tensor> {
    let dims: Vec<usize> = ints(shape, "shape")?
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dim {d}")))
        .collect::<KResult<_>>()?;
    let value = attrs.tensor("value").cloned().unwrap_or_else(|| Tensor::scalar(0.0f32));
    let n = checked_numel(&dims)?;
    any_dtype!(value.dtype(), T => {
        let v = value.as_slice::<T>().and_then(|s| s.first().cloned()).ok_or("`value` must hold one element")?;
        Tensor::from_vec(dims, vec![v; n]).map_err(|e| e.to_string())
    })
}

pub fn eye_like(attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    if x.rank() != 2 {
        return Err("eye_like needs a 2-D input".into());
    }
    let dtype = attrs.dtype("dtype").unwrap_or(x.dtype());
    let k = attrs.int("k", 0);
    let (r, c) = (x.shape()[0], x.shape()[1]);
    checked_numel(&[r, c])?;
    let ones: Vec<f64> =
        (0..r * c).map(|i| if (i % c) as i64 - (i / c) as i64 == k { 1.0 } else { 0.0 }).collect();
    crate::reduce::from_f64(
        ArrayD::from_shape_vec(IxDyn(&[r, c]), ones).map_err(|e| e.to_string())?,
        dtype,
    )
}

pub fn one_hot(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (idx, depth, values) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    let depth = depth.to_f64_vec().first().copied().ok_or("depth is empty")? as i64;
    if depth <= 0 {
        return Err(format!("depth must be positive, got {depth}"));
    }
    let r = idx.rank() + 1;
    let axis = norm_axis(attrs.int("axis", -1), r)?;
    let iv = idx.to_f64_vec();
    let mut shape = idx.shape().to_vec();
    shape.insert(axis, depth as usize);
    checked_numel(&shape)?;
    let inner: usize = idx.shape()[axis..].iter().product();
    any_dtype!(values.dtype(), T => {
        let vals = values.as_slice::<T>().ok_or("values dtype")?;
        if vals.len() != 2 {
            return Err("values must hold [off, on]".into());
        }
        let n: usize = shape.iter().product();
        let mut out = vec![vals[0].clone(); n];
        for (flat, &v) in iv.iter().enumerate() {
            let mut v = v as i64;
            if v < 0 {
                v += depth;
            }
            if (0..depth).contains(&v) {
                let (outer, inn) = (flat / inner.max(1), flat % inner.max(1));
                out[(outer * depth as usize + v as usize) * inner + inn] = vals[1].clone();
            }
        }
        Tensor::from_vec(shape, out).map_err(|e| e.to_string())
    })
}

pub fn compress(attrs: &Attrs, x: &Tensor, cond: &Tensor) -> KResult<Tensor> {
    let c = cond.as_slice::<bool>().ok_or("condition must be bool")?;
    let (x, axis) = match attrs.opt_int("axis") {
        Some(a) => (x.clone(), norm_axis(a, x.rank())?),
        None => (x.clone().reshaped(vec![x.numel()]).map_err(|e| e.to_string())?, 0),
    };
    let keep: Vec<usize> =
        c.iter().enumerate().filter(|(i, b)| **b && *i < x.shape()[axis]).map(|(i, _)| i).collect();
    any_dtype!(x.dtype(), T => Ok(tensor(view::<T>(&x)?.select(Axis(axis), &keep))))
}

pub fn non_zero(x: &Tensor) -> KResult<Tensor> {
    let r = x.rank();
    let st = strides(x.shape());
    let nz: Vec<usize> = match x.dtype() {
        DType::String => return Err("non_zero does not support strings".into()),
        DType::Bool => x
            .as_slice::<bool>()
            .unwrap()
            .iter()
            .enumerate()
            .filter(|(_, b)| **b)
            .map(|(i, _)| i)
            .collect(),
        _ => (0..x.numel()).filter(|&i| x.data().get_f64(i) != 0.0).collect(),
    };
    let mut out = vec![0i64; r * nz.len()];
    for (k, &flat) in nz.iter().enumerate() {
        for d in 0..r {
            out[d * nz.len() + k] = ((flat / st[d]) % x.shape()[d]) as i64;
        }
    }
    Tensor::from_vec(vec![r, nz.len()], out).map_err(|e| e.to_string())
}

pub fn reverse_sequence(attrs: &Attrs, x: &Tensor, lens: &Tensor) -> KResult<Tensor> {
    let batch_axis = norm_axis(attrs.int("batch_axis", 1), x.rank())?;
    let time_axis = norm_axis(attrs.int("time_axis", 0), x.rank())?;
    let lens = ints(lens, "sequence_lens")?;
    any_dtype!(x.dtype(), T => {
        let v = view::<T>(x)?;
        Ok(tensor(ArrayD::from_shape_fn(IxDyn(x.shape()), |i| {
            let mut idx: Vec<usize> = ndarray::Dimension::slice(&i).to_vec();
            let l = lens.get(idx[batch_axis]).copied().unwrap_or(0).max(0) as usize;
            if idx[time_axis] < l {
                idx[time_axis] = l - 1 - idx[time_axis];
            }
            v[IxDyn(&idx)].clone()
        })))
    })
}
