//! Normalisations: batch, instance, layer, group, RMS, LRN, Lp, mean-variance.

use ndarray::{ArrayD, Axis, IxDyn};
use xpu_ir::{Attrs, DType, Op, Tensor};

use crate::reduce::{from_f64, to_f64};
use crate::util::{KResult, norm_axis, opt, req};

/// Broadcasts a per-channel vector along axis 1 of an `rank`-D tensor.
fn per_channel(v: &ArrayD<f64>, rank: usize) -> KResult<ArrayD<f64>> {
    let mut shape = vec![1; rank];
    shape[1] = v.len();
    v.to_shape(IxDyn(&shape)).map(|a| a.to_owned()).map_err(|e| e.to_string())
}

pub fn batch_norm(attrs: &Attrs, inputs: &[Option<&Tensor>], n_out: usize) -> KResult<Vec<Tensor>> {
    let x = req(inputs, 0)?;
    let dtype = x.dtype();
    let xf = to_f64(x)?;
    if xf.ndim() < 2 {
        return Err("input must have rank ≥ 2 (N, C, …)".into());
    }
    let [scale, bias, mean, var] = [1, 2, 3, 4].map(|i| req(inputs, i).and_then(to_f64));
    let (scale, bias, mut mean, mut var) = (scale?, bias?, mean?, var?);
    let eps = attrs.float("epsilon", 1e-5);
    let training = attrs.int("training_mode", 0) != 0;
    let r = xf.ndim();
    let mut outputs_extra = Vec::new();
    if training {
        let axes: Vec<usize> = (0..r).filter(|&a| a != 1).collect();
        let c = xf.shape()[1];
        let moved = xf
            .view()
            .permuted_axes(IxDyn(&[1].iter().chain(&axes).copied().collect::<Vec<_>>()))
            .as_standard_layout()
            .into_owned();
        let per = moved.len() / c.max(1);
        let flat = moved.into_shape_with_order(IxDyn(&[c, per])).map_err(|e| e.to_string())?;
        let bm: Vec<f64> = flat.outer_iter().map(|row| row.sum() / per as f64).collect();
        let bv: Vec<f64> = flat
            .outer_iter()
            .zip(&bm)
            .map(|(row, m)| row.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / per as f64)
            .collect();
        let momentum = attrs.float("momentum", 0.9);
        let running_mean: Vec<f64> =
            mean.iter().zip(&bm).map(|(r, b)| r * momentum + b * (1.0 - momentum)).collect();
        let running_var: Vec<f64> =
            var.iter().zip(&bv).map(|(r, b)| r * momentum + b * (1.0 - momentum)).collect();
        outputs_extra.push(from_f64(
            ArrayD::from_shape_vec(IxDyn(&[c]), running_mean).map_err(|e| e.to_string())?,
            req(inputs, 3)?.dtype(),
        )?);
        outputs_extra.push(from_f64(
            ArrayD::from_shape_vec(IxDyn(&[c]), running_var).map_err(|e| e.to_string())?,
            req(inputs, 4)?.dtype(),
        )?);
        mean = ArrayD::from_shape_vec(IxDyn(&[c]), bm).map_err(|e| e.to_string())?;
        var = ArrayD::from_shape_vec(IxDyn(&[c]), bv).map_err(|e| e.to_string())?;
    }
    let (s, b, m, v) = (
        per_channel(&scale, r)?,
        per_channel(&bias, r)?,
        per_channel(&mean, r)?,
        per_channel(&var, r)?,
    );
    let y = (&xf - &m) / (v.mapv(|v| (v + eps).sqrt())) * &s + &b;
    let mut out = vec![from_f64(y, dtype)?];
    out.extend(outputs_extra.into_iter().take(n_out.saturating_sub(1)));
    if out.len() < n_out {
        return Err("running statistics outputs need training_mode = 1".into());
    }
    Ok(out)
}

/// Normalises `x` over the trailing dims from `axis`, returning (y, mean, inv_std) with
/// statistics shaped like x with ones from `axis`.
fn normalize_trailing(
    x: &ArrayD<f64>,
    axis: usize,
    eps: f64,
    rms: bool,
) -> KResult<(ArrayD<f64>, ArrayD<f64>, ArrayD<f64>)> {
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis..].iter().product();
    let flat = x.as_standard_layout();
    let data = flat.as_slice().ok_or("layout")?;
    let mut y = vec![0.0; data.len()];
    let mut means = vec![0.0; outer];
    let mut invs = vec![0.0; outer];
    for o in 0..outer {
        let row = &data[o * inner..(o + 1) * inner];
        let mean = if rms { 0.0 } else { row.iter().sum::<f64>() / inner as f64 };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / inner as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for (k, v) in row.iter().enumerate() {
            y[o * inner + k] = (v - mean) * inv;
        }
        means[o] = mean;
        invs[o] = inv;
    }
    let stat_shape: Vec<usize> =
        x.shape().iter().enumerate().map(|(i, &d)| if i < axis { d } else { 1 }).collect();
    Ok((
        ArrayD::from_shape_vec(IxDyn(x.shape()), y).map_err(|e| e.to_string())?,
        ArrayD::from_shape_vec(IxDyn(&stat_shape), means).map_err(|e| e.to_string())?,
        ArrayD::from_shape_vec(IxDyn(&stat_shape), invs).map_err(|e| e.to_string())?,
    ))
}

fn bcast(a: &ArrayD<f64>, shape: &[usize]) -> KResult<ArrayD<f64>> {
    a.broadcast(IxDyn(shape))
        .map(|v| v.to_owned())
        .ok_or_else(|| format!("shape {:?} does not broadcast to {shape:?}", a.shape()))
}

pub fn layer_norm(
    op: Op,
    attrs: &Attrs,
    inputs: &[Option<&Tensor>],
    n_out: usize,
) -> KResult<Vec<Tensor>> {
    let x = req(inputs, 0)?;
    let xf = to_f64(x)?;
    let axis = norm_axis(attrs.int("axis", -1), xf.ndim())?;
    let eps = attrs.float("epsilon", 1e-5);
    let (y, mean, inv) = normalize_trailing(&xf, axis, eps, op == Op::RmsNormalization)?;
    let mut y = y * bcast(&to_f64(req(inputs, 1)?)?, xf.shape())?;
    if let Some(b) = opt(inputs, 2) {
        y = y + bcast(&to_f64(b)?, xf.shape())?;
    }
    let stash = if attrs.int("stash_type", 1) == 1 { DType::F32 } else { x.dtype() };
    let mut out = vec![from_f64(y, x.dtype())?];
    if n_out > 1 {
        out.push(from_f64(mean, stash)?);
    }
    if n_out > 2 {
        out.push(from_f64(inv, stash)?);
    }
    Ok(out)
}

pub fn instance_norm(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    let xf = to_f64(x)?;
    if xf.ndim() < 3 {
        return Err("input must have rank ≥ 3".into());
    }
    let (y, _, _) = normalize_trailing(&xf, 2, attrs.float("epsilon", 1e-5), false)?;
    let r = xf.ndim();
    let y =
        y * per_channel(&to_f64(req(inputs, 1)?)?, r)? + per_channel(&to_f64(req(inputs, 2)?)?, r)?;
    from_f64(y, x.dtype())
}

pub fn group_norm(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    let xf = to_f64(x)?;
    let shape = xf.shape().to_vec();
    if shape.len() < 3 {
        return Err("input must have rank ≥ 3".into());
    }
    let (n, c) = (shape[0], shape[1]);
    let g = attrs.int("num_groups", 1).max(1) as usize;
    if c % g != 0 {
        return Err(format!("{c} channels do not split into {g} groups"));
    }
    let mut grouped = shape.clone();
    grouped.splice(0..2, [n, g, c / g]);
    let gx = xf.into_shape_with_order(IxDyn(&grouped)).map_err(|e| e.to_string())?;
    let (y, _, _) = normalize_trailing(&gx, 2, attrs.float("epsilon", 1e-5), false)?;
    let y = y.into_shape_with_order(IxDyn(&shape)).map_err(|e| e.to_string())?;
    let (scale, bias) = (to_f64(req(inputs, 1)?)?, to_f64(req(inputs, 2)?)?);
    let expand = |v: ArrayD<f64>| -> ArrayD<f64> {
        if v.len() == g && g != c {
            ArrayD::from_shape_fn(IxDyn(&[c]), |i| v[[i[0] / (c / g)]])
        } else {
            v
        }
    };
    let r = shape.len();
    let y = y * per_channel(&expand(scale), r)? + per_channel(&expand(bias), r)?;
    from_f64(y, x.dtype())
}

pub fn lrn(attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    let xf = to_f64(x)?;
    let size = attrs.int("size", 0).max(1) as usize;
    let (alpha, beta, bias) =
        (attrs.float("alpha", 1e-4), attrs.float("beta", 0.75), attrs.float("bias", 1.0));
    let c = xf.shape()[1];
    let lo = (size - 1) / 2;
    let hi = (size - 1).div_ceil(2);
    let sq = xf.mapv(|v| v * v);
    let mut y = xf.clone();
    for ch in 0..c {
        let start = ch.saturating_sub(lo);
        let end = (ch + hi).min(c - 1);
        let mut s = sq.index_axis(Axis(1), start).to_owned();
        for k in start + 1..=end {
            s = s + sq.index_axis(Axis(1), k);
        }
        let xs = xf.index_axis(Axis(1), ch);
        let v = ndarray::Zip::from(&xs)
            .and(&s)
            .map_collect(|&x, &s| x / (bias + alpha / size as f64 * s).powf(beta));
        y.index_axis_mut(Axis(1), ch).assign(&v);
    }
    from_f64(y, x.dtype())
}

pub fn lp_norm(attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    let mut a = to_f64(x)?;
    let axis = norm_axis(attrs.int("axis", -1), a.ndim())?;
    let p = attrs.int("p", 2);
    for mut lane in a.lanes_mut(Axis(axis)) {
        let n = if p == 1 {
            lane.iter().map(|v| v.abs()).sum::<f64>()
        } else {
            lane.iter().map(|v| v * v).sum::<f64>().sqrt()
        };
        lane.mapv_inplace(|v| if n == 0.0 { 0.0 } else { v / n });
    }
    from_f64(a, x.dtype())
}

pub fn mvn(attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    let xf = to_f64(x)?;
    let axes: Vec<usize> = match attrs.ints("axes") {
        Some(a) => a.iter().map(|&a| norm_axis(a, xf.ndim())).collect::<KResult<_>>()?,
        None => vec![0, 2, 3],
    };
    let mut mean = xf.clone();
    let mut sq = xf.mapv(|v| v * v);
    let mut sorted = axes.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    for &a in &sorted {
        mean = mean.mean_axis(Axis(a)).ok_or("empty axis")?.insert_axis(Axis(a));
        sq = sq.mean_axis(Axis(a)).ok_or("empty axis")?.insert_axis(Axis(a));
    }
    let var = &sq - &mean.mapv(|m| m * m);
    let y = (&xf - &mean) / var.mapv(|v| v.sqrt() + 1e-9);
    from_f64(y, x.dtype())
}
