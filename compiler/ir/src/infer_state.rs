//! Output types of the stateful sequence ops of linear-attention and state-space models
//! (`linear_attention`, `causal_conv_with_state`, ONNX opset 27), and of the region ops
//! `stft` and `roi_align`.

use crate::infer::{Cx, known};
use crate::{Attrs, Dim, InferError, TensorType};

/// `d / by` when `d` is known and divisible.
fn per_head(d: &Dim, by: i64) -> Dim {
    match d {
        Dim::Known(n) if by > 0 && *n as i64 % by == 0 => known(*n as i64 / by),
        _ => Dim::Unknown,
    }
}

fn rank3<'a>(cx: &Cx<'a>, i: usize, what: &str) -> Result<Option<&'a Vec<Dim>>, InferError> {
    let dims = cx.dims(i)?;
    cx.require(dims.is_none_or(|d| d.len() == 3), format!("{what} must be rank 3"))?;
    Ok(dims)
}

/// A linear-attention `update_rule`: whether it gates the state (reads the decay input)
/// and whether it corrects by delta (reads the beta input).
pub fn update_rule(rule: &str) -> Result<(bool, bool), String> {
    match rule {
        "linear" => Ok((false, false)),
        "gated" => Ok((true, false)),
        "delta" => Ok((false, true)),
        "gated_delta" => Ok((true, true)),
        r => Err(format!("update_rule {r:?}: one of linear, gated, delta, gated_delta")),
    }
}

pub(crate) fn linear_attention(
    cx: &Cx<'_>,
    attrs: &Attrs,
    n_outputs: usize,
) -> Result<Vec<TensorType>, InferError> {
    let (hq, hkv) = (attrs.int("q_num_heads", 0), attrs.int("kv_num_heads", 0));
    cx.require(
        hq > 0 && hkv > 0 && hq % hkv == 0,
        format!("q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv}); both are required"),
    )?;
    let rule = attrs.str("update_rule", "gated_delta");
    let (gating, delta) = match update_rule(rule) {
        Ok(r) => r,
        Err(m) => return cx.err(m),
    };
    cx.require(
        gating == cx.opt_ty(4).is_some(),
        format!(
            "update_rule {rule:?} {} the decay input (4)",
            if gating { "needs" } else { "takes no" }
        ),
    )?;
    cx.require(
        delta == cx.opt_ty(5).is_some(),
        format!(
            "update_rule {rule:?} {} the beta input (5)",
            if delta { "needs" } else { "takes no" }
        ),
    )?;
    let q = cx.ty(0)?;
    cx.require(q.dtype.is_float(), format!("query must be a float tensor, got {}", q.dtype))?;
    for (i, what) in [(1, "key"), (2, "value")] {
        cx.require(
            cx.ty(i)?.dtype == q.dtype,
            format!("{what} must be {} like the query", q.dtype),
        )?;
    }
    let (qd, vd) = (rank3(cx, 0, "query")?, rank3(cx, 2, "value")?);
    rank3(cx, 1, "key")?;
    let dk = qd.map_or(Dim::Unknown, |d| per_head(&d[2], hq));
    let dv = vd.map_or(Dim::Unknown, |d| per_head(&d[2], hkv));
    let out_last = match &dv {
        Dim::Known(n) => (*n as i64).checked_mul(hq).map_or(Dim::Unknown, known),
        _ => Dim::Unknown,
    };
    let (b, t) = qd.map_or((Dim::Unknown, Dim::Unknown), |d| (d[0].clone(), d[1].clone()));
    let state_dtype = cx.opt_ty(3).map_or(q.dtype, |t| t.dtype);
    let mut out = vec![
        TensorType::new(q.dtype, vec![b.clone(), t, out_last]),
        TensorType::new(state_dtype, vec![b, known(hkv), dk, dv]),
    ];
    out.truncate(n_outputs);
    Ok(out)
}

pub(crate) fn causal_conv(
    cx: &Cx<'_>,
    attrs: &Attrs,
    n_outputs: usize,
) -> Result<Vec<TensorType>, InferError> {
    let act = attrs.str("activation", "none");
    cx.require(
        matches!(act, "none" | "silu" | "swish"),
        format!("activation {act:?}: one of none, silu, swish"),
    )?;
    let x = cx.ty(0)?;
    cx.require(x.dtype.is_float(), format!("input must be a float tensor, got {}", x.dtype))?;
    let xd = rank3(cx, 0, "input")?;
    let wd = rank3(cx, 1, "weight")?;
    let k = wd.map_or(Dim::Unknown, |d| match &d[2] {
        Dim::Known(k) if *k >= 1 => Dim::Known(*k - 1),
        _ => Dim::Unknown,
    });
    let (b, c) = xd.map_or((Dim::Unknown, Dim::Unknown), |d| (d[0].clone(), d[1].clone()));
    let y = TensorType { dtype: x.dtype, dims: xd.cloned() };
    let mut out = vec![y, TensorType::new(x.dtype, vec![b, c, k])];
    out.truncate(n_outputs);
    Ok(out)
}

pub(crate) fn stft(cx: &Cx<'_>, attrs: &Attrs) -> Result<Vec<TensorType>, InferError> {
    let x = cx.ty(0)?;
    cx.require(x.dtype.is_float(), format!("signal must be a float tensor, got {}", x.dtype))?;
    let dims = rank3(cx, 0, "signal")?;
    let step = cx.const_ints(1).and_then(|v| v.first().copied());
    // frame_length, else the window's length, else the whole signal.
    let frame = cx
        .const_ints(3)
        .and_then(|v| v.first().copied())
        .or_else(|| cx.opt_ty(2).and_then(|w| w.dims.as_ref()?.first()?.known()).map(|n| n as i64))
        .or_else(|| {
            let given = cx.opt_ty(2).is_some() || cx.opt_ty(3).is_some();
            if given { None } else { dims.and_then(|d| d[1].known()).map(|n| n as i64) }
        });
    let frames = match (dims.and_then(|d| d[1].known()), step, frame) {
        (Some(len), Some(s), Some(f)) if s > 0 && f > 0 && f as u64 <= len => {
            known(1 + (len as i64 - f) / s)
        }
        _ => Dim::Unknown,
    };
    let bins = match frame {
        Some(f) if f > 0 && attrs.int("onesided", 1) != 0 => known(f / 2 + 1),
        Some(f) if f > 0 => known(f),
        _ => Dim::Unknown,
    };
    let b = dims.map_or(Dim::Unknown, |d| d[0].clone());
    Ok(vec![TensorType::new(x.dtype, vec![b, frames, bins, known(2)])])
}

pub(crate) fn roi_align(cx: &Cx<'_>, attrs: &Attrs) -> Result<Vec<TensorType>, InferError> {
    let x = cx.ty(0)?;
    cx.require(x.dtype.is_float(), format!("X must be a float tensor, got {}", x.dtype))?;
    let xd = cx.dims(0)?;
    cx.require(xd.is_none_or(|d| d.len() == 4), "X must be [N, C, H, W]")?;
    let rois = cx.dims(1)?;
    let r = rois.and_then(|d| d.first().cloned()).unwrap_or(Dim::Unknown);
    let c = xd.map_or(Dim::Unknown, |d| d[1].clone());
    let (oh, ow) = (attrs.int("output_height", 1), attrs.int("output_width", 1));
    cx.require(oh >= 1 && ow >= 1, "output_height and output_width must be ≥ 1")?;
    Ok(vec![TensorType::new(x.dtype, vec![r, c, known(oh), known(ow)])])
}
