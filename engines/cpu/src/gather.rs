//! Gather and scatter ops. Negative indices count from the end; an index out of range is an
//! error naming it, never a panic.

use xpu_ir::{Attrs, Tensor};

use crate::any_dtype;
use crate::reduce::{from_f64, to_f64};
use crate::util::{KResult, ints, norm_axis, strides};

fn fix(i: i64, n: usize) -> KResult<usize> {
    let j = if i < 0 { i + n as i64 } else { i };
    if j < 0 || j >= n as i64 {
        Err(format!("index {i} is out of range for a dim of size {n}"))
    } else {
        Ok(j as usize)
    }
}

pub fn gather(attrs: &Attrs, x: &Tensor, idx: &Tensor) -> KResult<Tensor> {
    let axis = norm_axis(attrs.int("axis", 0), x.rank())?;
    let iv = ints(idx, "indices")?;
    let n = x.shape()[axis];
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let fixed: Vec<usize> = iv.iter().map(|&i| fix(i, n)).collect::<KResult<_>>()?;
    let mut shape = x.shape()[..axis].to_vec();
    shape.extend(idx.shape());
    shape.extend(&x.shape()[axis + 1..]);
    any_dtype!(x.dtype(), T => {
        let d = x.as_slice::<T>().unwrap();
        let mut out = Vec::with_capacity(outer * fixed.len() * inner);
        for o in 0..outer {
            for &i in &fixed {
                out.extend_from_slice(&d[(o * n + i) * inner..][..inner]);
            }
        }
        Tensor::from_vec(shape, out).map_err(|e| e.to_string())
    })
}

/// Flat offsets into `x` addressed by GatherElements/ScatterElements indices: each index
/// replaces its own position's coordinate along `axis`.
fn element_offsets(x: &Tensor, idx: &Tensor, axis: usize) -> KResult<Vec<usize>> {
    if idx.rank() != x.rank() {
        return Err("indices must have the data's rank".into());
    }
    let iv = ints(idx, "indices")?;
    let (xs, is) = (strides(x.shape()), strides(idx.shape()));
    iv.iter()
        .enumerate()
        .map(|(flat, &i)| {
            let mut off = 0;
            for k in 0..x.rank() {
                let c = if k == axis {
                    fix(i, x.shape()[axis])?
                } else {
                    (flat / is[k]) % idx.shape()[k]
                };
                if c >= x.shape()[k] {
                    return Err(format!(
                        "index position {c} is outside dim {k} of size {}",
                        x.shape()[k]
                    ));
                }
                off += c * xs[k];
            }
            Ok(off)
        })
        .collect()
}

pub fn gather_elements(attrs: &Attrs, x: &Tensor, idx: &Tensor) -> KResult<Tensor> {
    let axis = norm_axis(attrs.int("axis", 0), x.rank())?;
    let offs = element_offsets(x, idx, axis)?;
    any_dtype!(x.dtype(), T => {
        let d = x.as_slice::<T>().unwrap();
        let out: Vec<T> = offs.iter().map(|&o| d[o].clone()).collect();
        Tensor::from_vec(idx.shape().to_vec(), out).map_err(|e| e.to_string())
    })
}

/// Flat offsets addressed by GatherND/ScatterND index tuples, with the slice size each covers.
fn nd_offsets(
    x_shape: &[usize],
    idx: &Tensor,
    batch_dims: usize,
) -> KResult<(Vec<usize>, usize, Vec<usize>)> {
    let iv = ints(idx, "indices")?;
    let ir = idx.rank();
    if ir == 0 {
        return Err("indices must have rank ≥ 1".into());
    }
    let last = idx.shape()[ir - 1];
    if batch_dims + last > x_shape.len() {
        return Err(format!(
            "index tuples of length {last} exceed the data rank {}",
            x_shape.len()
        ));
    }
    let xs = strides(x_shape);
    let slice: usize = x_shape[batch_dims + last..].iter().product();
    let batch: usize = x_shape[..batch_dims].iter().product();
    let tuples = iv.len() / last.max(1);
    let per_batch = tuples / batch.max(1);
    let mut offs = Vec::with_capacity(tuples);
    for t in 0..tuples {
        let b = t / per_batch.max(1);
        let mut off = 0;
        let mut rem = b;
        for k in (0..batch_dims).rev() {
            off += (rem % x_shape[k]) * xs[k];
            rem /= x_shape[k];
        }
        for j in 0..last {
            off += fix(iv[t * last + j], x_shape[batch_dims + j])? * xs[batch_dims + j];
        }
        offs.push(off);
    }
    let mut shape = idx.shape()[..ir - 1].to_vec();
    shape.extend(&x_shape[batch_dims + last..]);
    Ok((offs, slice, shape))
}

pub fn gather_nd(attrs: &Attrs, x: &Tensor, idx: &Tensor) -> KResult<Tensor> {
    let (offs, slice, shape) =
        nd_offsets(x.shape(), idx, attrs.int("batch_dims", 0).max(0) as usize)?;
    any_dtype!(x.dtype(), T => {
        let d = x.as_slice::<T>().unwrap();
        let mut out = Vec::with_capacity(offs.len() * slice);
        for o in offs {
            out.extend_from_slice(&d[o..o + slice]);
        }
        Tensor::from_vec(shape, out).map_err(|e| e.to_string())
    })
}

fn combine(reduction: &str, a: f64, b: f64) -> f64 {
    match reduction {
        "add" => a + b,
        "mul" => a * b,
        "max" => a.max(b),
        "min" => a.min(b),
        _ => b,
    }
}

pub fn scatter_elements(attrs: &Attrs, x: &Tensor, idx: &Tensor, upd: &Tensor) -> KResult<Tensor> {
    let axis = norm_axis(attrs.int("axis", 0), x.rank())?;
    let reduction = attrs.str("reduction", "none");
    if idx.shape() != upd.shape() {
        return Err("indices and updates must have the same shape".into());
    }
    scatter_at(x, upd, &element_offsets(x, idx, axis)?, 1, reduction)
}

pub fn scatter_nd(attrs: &Attrs, x: &Tensor, idx: &Tensor, upd: &Tensor) -> KResult<Tensor> {
    let (offs, slice, _) = nd_offsets(x.shape(), idx, 0)?;
    if upd.numel() != offs.len() * slice {
        return Err(format!(
            "updates hold {} elements, the indices address {}",
            upd.numel(),
            offs.len() * slice
        ));
    }
    scatter_at(x, upd, &offs, slice, attrs.str("reduction", "none"))
}

fn scatter_at(
    x: &Tensor,
    upd: &Tensor,
    offs: &[usize],
    slice: usize,
    reduction: &str,
) -> KResult<Tensor> {
    if reduction == "none" {
        return any_dtype!(x.dtype(), T => {
            let mut d = x.as_slice::<T>().unwrap().to_vec();
            let u = upd.as_slice::<T>().ok_or("updates dtype differs from data")?;
            for (k, &o) in offs.iter().enumerate() {
                d[o..o + slice].clone_from_slice(&u[k * slice..(k + 1) * slice]);
            }
            Tensor::from_vec(x.shape().to_vec(), d).map_err(|e| e.to_string())
        });
    }
    let mut d = to_f64(x)?.into_raw_vec_and_offset().0;
    let u = to_f64(upd)?.into_raw_vec_and_offset().0;
    for (k, &o) in offs.iter().enumerate() {
        for j in 0..slice {
            d[o + j] = combine(reduction, d[o + j], u[k * slice + j]);
        }
    }
    from_f64(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(x.shape()), d).map_err(|e| e.to_string())?,
        x.dtype(),
    )
}
