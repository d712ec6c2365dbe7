//! Scaled dot-product attention (ONNX `Attention`, opsets 23–25): 3-D or 4-D inputs, grouped
//! query heads, boolean or additive masks, causal masking aligned to the past cache or to
//! `nonpad_kv_seqlen`, sliding windows, softcap, and the four `qk_matmul_output_mode`s.
//! Computed in f64; fully masked rows give zeros, as the reference does.

use ndarray::{Array2, Array4, ArrayD, Axis, IxDyn, s};
use xpu_ir::{Attrs, DType, Tensor};

use crate::reduce::{from_f64, to_f64};
use crate::util::{KResult, ints, opt, req};

/// [B, S, H·D] → [B, H, S, D].
fn split_heads(x: ArrayD<f64>, heads: usize) -> KResult<Array4<f64>> {
    let (b, sq, hidden) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    if heads == 0 || hidden % heads != 0 {
        return Err(format!("hidden size {hidden} is not divisible by {heads} heads"));
    }
    let x = x
        .into_shape_with_order(IxDyn(&[b, sq, heads, hidden / heads]))
        .map_err(|e| e.to_string())?;
    let x = x.permuted_axes(IxDyn(&[0, 2, 1, 3])).as_standard_layout().into_owned();
    x.into_dimensionality().map_err(|e| e.to_string())
}

fn four_d(x: ArrayD<f64>) -> KResult<Array4<f64>> {
    x.into_dimensionality().map_err(|e| format!("expected a 4-D tensor: {e}"))
}

pub fn attention(attrs: &Attrs, inputs: &[Option<&Tensor>], n_out: usize) -> KResult<Vec<Tensor>> {
    let (q_t, k_t, v_t) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    let dtype = q_t.dtype();
    let rank = q_t.rank();
    if k_t.rank() != rank || v_t.rank() != rank || !(rank == 3 || rank == 4) {
        return Err("Q, K and V must all be 3-D or all be 4-D".into());
    }
    let (mut q, mut k, mut v) = if rank == 3 {
        let qh = attrs.opt_int("q_num_heads").ok_or("3-D inputs need q_num_heads")? as usize;
        let kvh = attrs.opt_int("kv_num_heads").ok_or("3-D inputs need kv_num_heads")? as usize;
        (
            split_heads(to_f64(q_t)?, qh)?,
            split_heads(to_f64(k_t)?, kvh)?,
            split_heads(to_f64(v_t)?, kvh)?,
        )
    } else {
        (four_d(to_f64(q_t)?)?, four_d(to_f64(k_t)?)?, four_d(to_f64(v_t)?)?)
    };
    let past_key = opt(inputs, 4);
    let past_value = opt(inputs, 5);
    if past_key.is_some() != past_value.is_some() {
        return Err("past_key and past_value must be given together".into());
    }
    let past_len = past_key.map(|t| t.shape().get(2).copied().unwrap_or(0)).unwrap_or(0);
    if let (Some(pk), Some(pv)) = (past_key, past_value) {
        k = ndarray::concatenate(Axis(2), &[four_d(to_f64(pk)?)?.view(), k.view()])
            .map_err(|e| format!("past_key does not concatenate with K: {e}"))?;
        v = ndarray::concatenate(Axis(2), &[four_d(to_f64(pv)?)?.view(), v.view()])
            .map_err(|e| format!("past_value does not concatenate with V: {e}"))?;
    }
    let nonpad: Option<Vec<i64>> =
        opt(inputs, 6).map(|t| ints(t, "nonpad_kv_seqlen")).transpose()?;
    let (b, hq, sq, dq) = q.dim();
    let (_, hkv, skv, dk) = k.dim();
    let dv = v.dim().3;
    if dq != dk {
        return Err(format!("Q head size {dq} differs from K head size {dk}"));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(format!("{hq} query heads are not a multiple of {hkv} key/value heads"));
    }
    let scale = attrs.opt_float("scale").unwrap_or(1.0 / (dq as f64).sqrt());
    q.mapv_inplace(|x| x * scale);

    // The additive bias, broadcast to [B, 1 or H, S, KV].
    let mut bias = ArrayD::<f64>::zeros(IxDyn(&[1, 1, sq, skv]));
    if let Some(m) = opt(inputs, 3) {
        let is_bool = m.dtype() == DType::Bool;
        let mut mf = to_f64(m)?;
        if is_bool {
            mf.mapv_inplace(|x| if x != 0.0 { 0.0 } else { f64::NEG_INFINITY });
        }
        let last = mf.ndim() - 1;
        let have = mf.shape()[last];
        if have < skv {
            let mut shape = mf.shape().to_vec();
            shape[last] = skv;
            let mut padded = ArrayD::from_elem(IxDyn(&shape), f64::NEG_INFINITY);
            padded.slice_axis_mut(Axis(last), ndarray::Slice::from(0..have)).assign(&mf);
            mf = padded;
        }
        while mf.ndim() < 4 {
            mf.insert_axis_inplace(Axis(0));
        }
        bias = mf;
    }
    let offsets: Vec<i64> = match (&nonpad, past_key) {
        (Some(np), None) => {
            (0..b).map(|i| np.get(i).copied().unwrap_or(skv as i64) - sq as i64).collect()
        }
        _ => vec![past_len as i64; b],
    };
    let causal = attrs.int("is_causal", 0) != 0;
    let left = attrs.int("left_window_size", -1);
    let right = attrs.int("right_window_size", -1);
    let per_batch = causal || left >= 0 || right >= 0 || nonpad.is_some();
    if per_batch {
        let hb = bias.shape()[1];
        let shape = [b, hb, sq, skv];
        let mut full = bias
            .broadcast(IxDyn(&shape))
            .ok_or("attn_mask does not broadcast to (batch, heads, q, kv)")?
            .to_owned();
        for ((bi, _, i, j), x) in full
            .view_mut()
            .into_dimensionality::<ndarray::Ix4>()
            .map_err(|e| e.to_string())?
            .indexed_iter_mut()
        {
            let diff = i as i64 + offsets[bi] - j as i64;
            let mut allowed = true;
            if causal && diff < 0 {
                allowed = false;
            }
            if left >= 0 && diff > left {
                allowed = false;
            }
            if right >= 0 && -diff > right {
                allowed = false;
            }
            if let Some(np) = &nonpad
                && j as i64 >= np.get(bi).copied().unwrap_or(skv as i64)
            {
                allowed = false;
            }
            if !allowed {
                *x = f64::NEG_INFINITY;
            }
        }
        bias = full;
    }
    let bias4: Array4<f64> = bias.into_dimensionality().map_err(|e| e.to_string())?;
    if (bias4.dim().0 != 1 && bias4.dim().0 != b)
        || (bias4.dim().1 != 1 && bias4.dim().1 != hq)
        || bias4.dim().2 != sq
        || bias4.dim().3 != skv
    {
        return Err(format!(
            "attn_mask of shape {:?} does not broadcast to ({b}, {hq}, {sq}, {skv})",
            bias4.dim()
        ));
    }
    let softcap = attrs.opt_float("softcap").filter(|&c| c > 0.0);
    let mode = attrs.int("qk_matmul_output_mode", 0);
    let mut y = Array4::<f64>::zeros((b, hq, sq, dv));
    let mut qk_out = Array4::<f64>::zeros((b, hq, sq, skv));
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            let qm = q.slice(s![bi, h, .., ..]);
            let km = k.slice(s![bi, kh, .., ..]);
            let mut scores: Array2<f64> = qm.dot(&km.t());
            if let Some(c) = softcap {
                scores.mapv_inplace(|x| (x / c).tanh() * c);
            }
            let bm = bias4.slice(s![
                if bias4.dim().0 == 1 { 0 } else { bi },
                if bias4.dim().1 == 1 { 0 } else { h },
                ..,
                ..
            ]);
            let with_bias = &scores + &bm;
            let mut probs = with_bias.clone();
            for (i, mut row) in probs.outer_iter_mut().enumerate() {
                let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let bias_max = bm.row(i).iter().copied().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY || bias_max == f64::NEG_INFINITY {
                    row.fill(0.0);
                    continue;
                }
                row.mapv_inplace(|x| (x - m).exp());
                let sum = row.sum();
                row.mapv_inplace(|x| x / sum);
            }
            let out = probs.dot(&v.slice(s![bi, kh, .., ..]));
            y.slice_mut(s![bi, h, .., ..]).assign(&out);
            let qk = match mode {
                2 => with_bias,
                3 => probs,
                _ => scores,
            };
            qk_out.slice_mut(s![bi, h, .., ..]).assign(&qk);
        }
    }
    let y = if rank == 3 {
        let t = y.permuted_axes([0, 2, 1, 3]).as_standard_layout().into_owned();
        t.into_shape_with_order(IxDyn(&[b, sq, hq * dv])).map_err(|e| e.to_string())?
    } else {
        y.into_dyn()
    };
    let mut outs = vec![from_f64(y, dtype)?];
    if n_out > 1 {
        outs.push(from_f64(k.into_dyn(), k_t.dtype())?);
    }
    if n_out > 2 {
        outs.push(from_f64(v.into_dyn(), v_t.dtype())?);
    }
    if n_out > 3 {
        outs.push(from_f64(qk_out.into_dyn(), dtype)?);
    }
    Ok(outs)
}
