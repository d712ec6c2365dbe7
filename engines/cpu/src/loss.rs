//! Losses: negative log-likelihood and softmax cross-entropy (ONNX semantics, including
//! per-class weights, `ignore_index` and the none/sum/mean reductions).

use ndarray::{ArrayD, IxDyn};
use xpu_ir::{Attrs, Tensor};

use crate::reduce::{from_f64, to_f64};
use crate::util::{KResult, ints, opt, req};

/// NLL over log-probabilities `x` [N, C, d…] and integer `target` [N, d…].
fn nll(
    x: &ArrayD<f64>,
    target: &[i64],
    target_shape: &[usize],
    weight: Option<&[f64]>,
    attrs: &Attrs,
) -> KResult<ArrayD<f64>> {
    let shape = x.shape();
    if shape.len() < 2 {
        return Err(format!("input must have rank ≥ 2 (N, C, …), got shape {shape:?}"));
    }
    let (n, c) = (shape[0], shape[1]);
    let d: usize = shape[2..].iter().product();
    if target.len() != n * d {
        return Err(format!(
            "target has {} elements, input {shape:?} needs {}",
            target.len(),
            n * d
        ));
    }
    let ignore = attrs.opt_int("ignore_index");
    let xs = x.as_standard_layout();
    let xs = xs.as_slice().ok_or("layout")?;
    let mut loss = vec![0.0; n * d];
    let mut w = vec![1.0; n * d];
    for i in 0..n {
        for j in 0..d {
            let t = target[i * d + j];
            if Some(t) == ignore {
                w[i * d + j] = 0.0;
                continue;
            }
            if t < 0 || t as usize >= c {
                return Err(format!("target value {t} is outside 0..{c}"));
            }
            let t = t as usize;
            let wt = weight.map(|w| w[t]).unwrap_or(1.0);
            w[i * d + j] = wt;
            loss[i * d + j] = -xs[(i * c + t) * d + j] * wt;
        }
    }
    let out = match attrs.str("reduction", "mean") {
        "none" => {
            return ArrayD::from_shape_vec(IxDyn(target_shape), loss).map_err(|e| e.to_string());
        }
        "sum" => loss.iter().sum::<f64>(),
        "mean" if weight.is_some() || ignore.is_some() => {
            loss.iter().sum::<f64>() / w.iter().sum::<f64>()
        }
        "mean" => loss.iter().sum::<f64>() / loss.len() as f64,
        other => return Err(format!("unknown reduction `{other}` (none, sum or mean)")),
    };
    Ok(ArrayD::from_elem(IxDyn(&[]), out))
}

pub fn negative_log_likelihood(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    let t = req(inputs, 1)?;
    let w = opt(inputs, 2).map(|w| to_f64(w).map(|a| a.into_raw_vec_and_offset().0)).transpose()?;
    let loss = nll(&to_f64(x)?, &ints(t, "target")?, t.shape(), w.as_deref(), attrs)?;
    from_f64(loss, x.dtype())
}

pub fn softmax_cross_entropy(
    attrs: &Attrs,
    inputs: &[Option<&Tensor>],
    n_out: usize,
) -> KResult<Vec<Tensor>> {
    let x = req(inputs, 0)?;
    let t = req(inputs, 1)?;
    let mut scores = to_f64(x)?;
    if scores.ndim() < 2 {
        return Err("scores must have rank ≥ 2 (N, C, …)".into());
    }
    // log_softmax over the class axis (1).
    for mut lane in scores.lanes_mut(ndarray::Axis(1)) {
        let m = lane.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + lane.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        lane.mapv_inplace(|v| v - lse);
    }
    let w = opt(inputs, 2).map(|w| to_f64(w).map(|a| a.into_raw_vec_and_offset().0)).transpose()?;
    let loss = nll(&scores, &ints(t, "labels")?, t.shape(), w.as_deref(), attrs)?;
    let mut out = vec![from_f64(loss, x.dtype())?];
    if n_out > 1 {
        out.push(from_f64(scores, x.dtype())?);
    }
    Ok(out)
}
