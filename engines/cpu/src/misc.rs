//! Smaller ops: signal windows, centre crop/pad, max unpooling, string concatenation.

use std::f64::consts::PI;

use ndarray::{ArrayD, IxDyn};
use xpu_ir::{Attrs, DType, Op, Tensor};

use crate::any_dtype;
use crate::elementwise::zip_map;
use crate::reduce::from_f64;
use crate::util::{KResult, checked_numel, ints, norm_axis, opt, req, tensor, view};

/// Hann, Hamming and Blackman windows of length `size` (periodic or symmetric).
pub fn window(op: Op, attrs: &Attrs, size: &Tensor) -> KResult<Tensor> {
    let n = *ints(size, "size")?.first().ok_or("size is empty")?;
    let n = usize::try_from(n).map_err(|_| format!("window size {n} is negative"))?;
    checked_numel(&[n])?;
    let periodic = attrs.int("periodic", 1) != 0;
    let denom = if periodic { n as f64 } else { n.saturating_sub(1).max(1) as f64 };
    let v: Vec<f64> = (0..n)
        .map(|i| {
            let x = 2.0 * PI * i as f64 / denom;
            match op {
                Op::HannWindow => 0.5 - 0.5 * x.cos(),
                Op::HammingWindow => 25.0 / 46.0 - (21.0 / 46.0) * x.cos(),
                _ => 0.42 - 0.5 * x.cos() + 0.08 * (2.0 * x).cos(),
            }
        })
        .collect();
    let dtype = attrs.dtype("output_datatype").unwrap_or(DType::F32);
    from_f64(ArrayD::from_shape_vec(IxDyn(&[n]), v).map_err(|e| e.to_string())?, dtype)
}

pub fn center_crop_pad(attrs: &Attrs, x: &Tensor, shape: &Tensor) -> KResult<Tensor> {
    let target = ints(shape, "shape")?;
    let r = x.rank();
    let axes: Vec<usize> = match attrs.ints("axes") {
        Some(a) => a.iter().map(|&a| norm_axis(a, r)).collect::<KResult<_>>()?,
        None => (0..r).collect(),
    };
    if axes.len() != target.len() {
        return Err(format!("shape has {} values for {} axes", target.len(), axes.len()));
    }
    let mut out_shape = x.shape().to_vec();
    // Per dim: output index o reads input index o + shift (crop: shift > 0, pad: shift < 0).
    let mut shift = vec![0i64; r];
    for (&a, &t) in axes.iter().zip(&target) {
        let dim = x.shape()[a] as i64;
        let t = t.max(0);
        out_shape[a] = t as usize;
        shift[a] = if t < dim { (dim - t) / 2 } else { -((t - dim) / 2) };
    }
    checked_numel(&out_shape)?;
    any_dtype!(x.dtype(), T => {
        let v = view::<T>(x)?;
        let zero = view::<T>(&Tensor::zeros(x.dtype(), vec![1]))?[[0]].clone();
        Ok(tensor(ArrayD::from_shape_fn(IxDyn(&out_shape), |i| {
            let mut idx = Vec::with_capacity(r);
            for d in 0..r {
                let s = i[d] as i64 + shift[d];
                if s < 0 || s >= x.shape()[d] as i64 {
                    return zero.clone();
                }
                idx.push(s as usize);
            }
            v[IxDyn(&idx)].clone()
        })))
    })
}

pub fn max_unpool(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (x, idx) = (req(inputs, 0)?, req(inputs, 1)?);
    let kernel = attrs.ints("kernel_shape").ok_or("attribute `kernel_shape` is required")?.to_vec();
    let nsp = kernel.len();
    if x.rank() != nsp + 2 {
        return Err(format!("X has rank {}, kernel_shape implies {}", x.rank(), nsp + 2));
    }
    let strides = attrs.ints("strides").map(<[i64]>::to_vec).unwrap_or_else(|| vec![1; nsp]);
    let pads = attrs.ints("pads").map(<[i64]>::to_vec).unwrap_or_else(|| vec![0; 2 * nsp]);
    let mut inferred = x.shape()[..2].to_vec();
    for d in 0..nsp {
        inferred.push(
            ((x.shape()[d + 2] as i64 - 1) * strides[d] - (pads[d] + pads[nsp + d]) + kernel[d])
                .max(0) as usize,
        );
    }
    let out_shape: Vec<usize> = match opt(inputs, 2) {
        Some(s) => ints(s, "output_shape")?.iter().map(|&v| v.max(0) as usize).collect(),
        None => inferred.clone(),
    };
    let n_inf = checked_numel(&inferred)?;
    checked_numel(&out_shape)?;
    let iv = ints(idx, "indices")?;
    let xv = x.to_f64_vec();
    let mut flat = vec![0.0; n_inf];
    for (k, &i) in iv.iter().enumerate() {
        let i = usize::try_from(i).ok().filter(|&i| i < n_inf).ok_or_else(|| {
            format!("index {i} is outside the unpooled tensor of {n_inf} elements")
        })?;
        flat[i] = *xv.get(k).ok_or("more indices than values")?;
    }
    let small = ArrayD::from_shape_vec(IxDyn(&inferred), flat).map_err(|e| e.to_string())?;
    let out = ArrayD::from_shape_fn(IxDyn(&out_shape), |i| {
        let inside = (0..out_shape.len()).all(|d| i[d] < inferred[d]);
        if inside { small[i] } else { 0.0 }
    });
    from_f64(out, x.dtype())
}

pub fn string_concat(a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    Ok(tensor(zip_map::<String, String, String>(a, b, |x, y| format!("{x}{y}"))?))
}
