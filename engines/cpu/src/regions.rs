//! Ops that read or write regions of a tensor: `tensor_scatter` (new key/value rows written
//! into a cache at per-batch positions, linear or circular: ONNX opset 24), `roi_align`
//! (bilinear pooling of regions of interest, as detection models use it) and `stft` (the
//! short-time Fourier transform of framed, windowed signals).

use std::f64::consts::PI;

use ndarray::{ArrayD, IxDyn};
use xpu_ir::{Attrs, DType, Tensor, TensorData};

use crate::reduce::from_f64;
use crate::util::{KResult, checked_numel, ints, opt, req};

/// `update` written into a copy of `past` along `axis`, starting at each batch entry's
/// write index (0 when none is given); `circular` wraps positions around the cache.
pub fn tensor_scatter(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (past, update) = (req(inputs, 0)?, req(inputs, 1)?);
    let (ps, us) = (past.shape(), update.shape());
    let r = ps.len();
    let axis = crate::util::norm_axis(attrs.int("axis", -2), r)?;
    if r < 2 || axis == 0 || us.len() != r || update.dtype() != past.dtype() {
        return Err(format!(
            "past_cache {} {ps:?} and update {} {us:?}: same dtype and rank (≥ 2), axis after the batch axis",
            past.dtype(),
            update.dtype()
        ));
    }
    if (0..r).any(|i| if i == axis { us[i] > ps[i] } else { us[i] != ps[i] }) {
        return Err(format!("update {us:?} does not fit past_cache {ps:?} along axis {axis}"));
    }
    let circular = match attrs.str("mode", "linear") {
        "linear" => false,
        "circular" => true,
        m => return Err(format!("mode {m:?}: linear or circular")),
    };
    let starts = opt(inputs, 2).map(|t| ints(t, "write_indices")).transpose()?;
    if let Some(s) = starts.as_ref().filter(|s| s.len() != ps[0]) {
        return Err(format!("write_indices has {} entries for batch {}", s.len(), ps[0]));
    }
    if past.numel() == 0 || update.numel() == 0 {
        return Ok(past.clone());
    }
    let elem = past.dtype().size_bytes();
    if elem == 0 || matches!(past.dtype(), DType::String | DType::Table) {
        return Err(format!("{} values cannot be scattered", past.dtype()));
    }
    let inner: usize = ps[axis + 1..].iter().product::<usize>() * elem;
    let per_batch: usize = ps[1..axis].iter().product();
    let (cap, len) = (ps[axis], us[axis]);
    let mut out = past.le_bytes().into_owned();
    let src = update.le_bytes();
    for b in 0..ps[0] {
        let start = starts.as_ref().map_or(0, |s| s[b]);
        for p in 0..per_batch {
            let row = b * per_batch + p;
            for s in 0..len {
                let at = if circular {
                    (start.rem_euclid(cap as i64) + s as i64) % cap as i64
                } else {
                    start.checked_add(s as i64).unwrap_or(i64::MAX)
                };
                if !(0..cap as i64).contains(&at) {
                    return Err(format!(
                        "batch {b} writes position {at}, outside the cache's {cap} (mode linear)"
                    ));
                }
                let dst = (row * cap + at as usize) * inner;
                out[dst..dst + inner].copy_from_slice(&src[(row * len + s) * inner..][..inner]);
            }
        }
    }
    let data = TensorData::from_le_bytes(past.dtype(), &out).map_err(|e| e.to_string())?;
    Tensor::new(ps.to_vec(), data).map_err(|e| e.to_string())
}

/// The four neighbours and weights of one bilinear sample (all zero outside the map).
fn bilinear(y: f64, x: f64, h: usize, w: usize) -> [(usize, f64); 4] {
    if y < -1.0 || y > h as f64 || x < -1.0 || x > w as f64 {
        return [(0, 0.0); 4];
    }
    let (mut y, mut x) = (y.max(0.0), x.max(0.0));
    let (mut y0, mut x0) = (y as usize, x as usize);
    let y1 = if y0 >= h - 1 {
        y0 = h - 1;
        y = y0 as f64;
        y0
    } else {
        y0 + 1
    };
    let x1 = if x0 >= w - 1 {
        x0 = w - 1;
        x = x0 as f64;
        x0
    } else {
        x0 + 1
    };
    let (ly, lx) = (y - y0 as f64, x - x0 as f64);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    [(y0 * w + x0, hy * hx), (y0 * w + x1, hy * lx), (y1 * w + x0, ly * hx), (y1 * w + x1, ly * lx)]
}

/// RoiAlign-22: per region (x1, y1, x2, y2 in input coordinates times `spatial_scale`), an
/// output_height × output_width grid of bins, each the average (or the maximum, of the
/// weighted neighbours as ONNX defines it) of a grid of bilinear samples.
pub fn roi_align(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (x, rois, batch) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    let &[n, c, h, w] = x.shape() else {
        return Err(format!("X must be [N, C, H, W], has shape {:?}", x.shape()));
    };
    let batch = ints(batch, "batch_indices")?;
    if rois.shape() != [batch.len(), 4] {
        return Err(format!("rois has shape {:?}; expected [{}, 4]", rois.shape(), batch.len()));
    }
    if let Some(b) = batch.iter().find(|&&b| b < 0 || b as usize >= n) {
        return Err(format!("batch index {b} is outside the batch of {n}"));
    }
    let (oh, ow) = (attrs.int("output_height", 1), attrs.int("output_width", 1));
    if oh < 1 || ow < 1 || h == 0 || w == 0 {
        return Err(format!("output {oh}×{ow} of a {h}×{w} map: sizes must be ≥ 1"));
    }
    let (oh, ow) = (oh as usize, ow as usize);
    let ratio = attrs.int("sampling_ratio", 0);
    let scale = attrs.float("spatial_scale", 1.0);
    let half_pixel = match attrs.str("coordinate_transformation_mode", "half_pixel") {
        "half_pixel" => true,
        "output_half_pixel" => false,
        m => {
            return Err(format!(
                "coordinate_transformation_mode {m:?}: half_pixel or output_half_pixel"
            ));
        }
    };
    if checked_numel(&[batch.len(), c, oh, ow])? == 0 {
        return Ok(Tensor::zeros(x.dtype(), vec![batch.len(), c, oh, ow]));
    }
    let max = match attrs.str("mode", "avg") {
        "avg" => false,
        "max" => true,
        m => return Err(format!("mode {m:?}: avg or max")),
    };
    let (xv, rv) = (x.to_f64_vec(), rois.to_f64_vec());
    let mut out = vec![0.0; batch.len() * c * oh * ow];
    let offset = if half_pixel { 0.5 } else { 0.0 };
    for (r, &b) in batch.iter().enumerate() {
        let roi = &rv[r * 4..r * 4 + 4];
        let (x0, y0) = (roi[0] * scale - offset, roi[1] * scale - offset);
        let (mut rw, mut rh) = (roi[2] * scale - offset - x0, roi[3] * scale - offset - y0);
        if !half_pixel {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / oh as f64, rw / ow as f64);
        let grid = |extent: f64, bins: usize| -> usize {
            if ratio > 0 { ratio as usize } else { (extent / bins as f64).ceil().max(0.0) as usize }
        };
        let (gh, gw) = (grid(rh, oh), grid(rw, ow));
        if gh > 1 << 20 || gw > 1 << 20 || gh.saturating_mul(gw) > 1 << 20 {
            return Err(format!("region {r} samples a {gh}×{gw} grid per bin; at most 2^20"));
        }
        let count = (gh * gw).max(1) as f64;
        for ph in 0..oh {
            for pw in 0..ow {
                let samples: Vec<[(usize, f64); 4]> = (0..gh)
                    .flat_map(|iy| (0..gw).map(move |ix| (iy, ix)))
                    .map(|(iy, ix)| {
                        let y = y0 + ph as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                        let xx = x0 + pw as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                        bilinear(y, xx, h, w)
                    })
                    .collect();
                for ch in 0..c {
                    let map = &xv[(b as usize * c + ch) * h * w..][..h * w];
                    let value = |s: &[(usize, f64); 4]| s.map(|(p, wt)| wt * map[p]);
                    let v = if max {
                        samples
                            .iter()
                            .map(|s| value(s).into_iter().fold(f64::NEG_INFINITY, f64::max))
                            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
                            .unwrap_or(0.0)
                    } else {
                        samples.iter().map(|s| value(s).iter().sum::<f64>()).sum::<f64>() / count
                    };
                    out[((r * c + ch) * oh + ph) * ow + pw] = v;
                }
            }
        }
    }
    let a =
        ArrayD::from_shape_vec(IxDyn(&[batch.len(), c, oh, ow]), out).map_err(|e| e.to_string())?;
    from_f64(a, x.dtype())
}

/// STFT-17: signal [B, L, 1 | 2] cut into frames of `frame_length` (or the window's length)
/// every `frame_step`, each multiplied by the window and transformed: [B, frames, bins, 2]
/// (bins = frame_length / 2 + 1 when `onesided`, for real signals).
pub fn stft(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let signal = req(inputs, 0)?;
    let &[b, len, parts] = signal.shape() else {
        return Err(format!("signal must be [B, L, 1 | 2], has shape {:?}", signal.shape()));
    };
    if !(parts == 1 || parts == 2) {
        return Err(format!("signal's last dim must be 1 (real) or 2 (complex), is {parts}"));
    }
    let step = ints(req(inputs, 1)?, "frame_step")?.first().copied().unwrap_or(0);
    let window = opt(inputs, 2).map(Tensor::to_f64_vec);
    // frame_length, else the window's length, else the whole signal.
    let frame = match (opt(inputs, 3).map(|t| ints(t, "frame_length")).transpose()?, &window) {
        (Some(v), _) => v.first().copied().unwrap_or(0),
        (None, Some(w)) => w.len() as i64,
        (None, None) => len as i64,
    };
    if step < 1 || frame < 1 || frame as usize > len {
        return Err(format!("frame_step {step} and frame_length {frame} for a signal of {len}"));
    }
    let (step, frame) = (step as usize, frame as usize);
    if window.as_ref().is_some_and(|w| w.len() != frame) {
        return Err(format!(
            "the window has {} values for frames of {frame}",
            window.map_or(0, |w| w.len())
        ));
    }
    // One-sided: the first frame/2 + 1 bins (of a complex signal too, as ONNX's reference).
    let onesided = attrs.int("onesided", 1) != 0;
    let frames = 1 + (len - frame) / step;
    let bins = if onesided { frame / 2 + 1 } else { frame };
    if (b * frames).saturating_mul(bins).saturating_mul(frame) > 1 << 34 {
        return Err(format!("{frames} frames of {frame} points is too large to transform here"));
    }
    let v = signal.to_f64_vec();
    let mut out = vec![0.0; b * frames * bins * 2];
    for bi in 0..b {
        for f in 0..frames {
            let seq: Vec<(f64, f64)> = (0..frame)
                .map(|n| {
                    let at = (bi * len + f * step + n) * parts;
                    let wt = window.as_ref().map_or(1.0, |w| w[n]);
                    (v[at] * wt, if parts == 2 { v[at + 1] * wt } else { 0.0 })
                })
                .collect();
            for k in 0..bins {
                let (mut re, mut im) = (0.0, 0.0);
                for (n, &(a, bb)) in seq.iter().enumerate() {
                    let t = -2.0 * PI * ((k * n) % frame) as f64 / frame as f64;
                    re += a * t.cos() - bb * t.sin();
                    im += a * t.sin() + bb * t.cos();
                }
                let o = ((bi * frames + f) * bins + k) * 2;
                out[o] = re;
                out[o + 1] = im;
            }
        }
    }
    let a = ArrayD::from_shape_vec(IxDyn(&[b, frames, bins, 2]), out).map_err(|e| e.to_string())?;
    from_f64(a, signal.dtype())
}
