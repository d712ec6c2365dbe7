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

/// Rotary position embedding (ONNX RotaryEmbedding-23): 3-D [B, S, H·D] or 4-D [B, H, S, D]
/// input, caches indexed by `position_ids` or given per (batch, position), interleaved or
/// split halves, optionally rotating only the first `rotary_embedding_dim` channels.
pub fn rotary_embedding(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (x, cos_t, sin_t) = (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 2)?);
    let shape = x.shape().to_vec();
    // (batch, seq, heads, head) and a function mapping (b, s, h, d) to a flat offset.
    let (b, s, h, d, four) = match shape.len() {
        4 => (shape[0], shape[2], shape[1], shape[3], true),
        3 => {
            let heads = attrs.int("num_heads", 0);
            if heads <= 0 || shape[2] % heads as usize != 0 {
                return Err(format!(
                    "a 3-D input needs num_heads dividing {}, got {heads}",
                    shape[2]
                ));
            }
            (shape[0], shape[1], heads as usize, shape[2] / heads as usize, false)
        }
        r => return Err(format!("input must be 3-D or 4-D, got rank {r}")),
    };
    let off = |bi: usize, si: usize, hi: usize, di: usize| {
        if four { ((bi * h + hi) * s + si) * d + di } else { ((bi * s + si) * h + hi) * d + di }
    };
    let rot = match attrs.int("rotary_embedding_dim", 0) {
        0 => d,
        r if r > 0 && (r as usize) <= d && r % 2 == 0 => r as usize,
        r => {
            return Err(format!(
                "rotary_embedding_dim {r} must be even and at most the head size {d}"
            ));
        }
    };
    let half = rot / 2;
    let interleaved = attrs.int("interleaved", 0) != 0;
    let (cos, sin) = (cos_t.to_f64_vec(), sin_t.to_f64_vec());
    if cos_t.shape().last() != Some(&half) || sin_t.shape() != cos_t.shape() {
        return Err(format!(
            "cos/sin caches must end in rotary_embedding_dim/2 = {half}, got {:?} and {:?}",
            cos_t.shape(),
            sin_t.shape()
        ));
    }
    let pos: Option<Vec<i64>> = opt(inputs, 3).map(|p| ints(p, "position_ids")).transpose()?;
    let rows = cos_t.numel() / half;
    let xv = x.to_f64_vec();
    let mut out = xv.clone();
    for bi in 0..b {
        for si in 0..s {
            let row = match &pos {
                Some(p) => *p
                    .get(bi * s + si)
                    .or(p.get(si))
                    .ok_or("position_ids do not cover (batch, sequence)")?
                    as usize,
                None => bi * s + si,
            };
            if row >= rows {
                return Err(format!("position {row} is beyond the {rows} cache rows"));
            }
            for hi in 0..h {
                for i in 0..half {
                    let (i1, i2) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                    let (x1, x2) = (xv[off(bi, si, hi, i1)], xv[off(bi, si, hi, i2)]);
                    let (c, sn) = (cos[row * half + i], sin[row * half + i]);
                    out[off(bi, si, hi, i1)] = c * x1 - sn * x2;
                    out[off(bi, si, hi, i2)] = sn * x1 + c * x2;
                }
            }
        }
    }
    from_f64(ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?, x.dtype())
}

/// Greedy non-maximum suppression per (batch, class), as ONNX NonMaxSuppression-11.
pub fn non_max_suppression(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (boxes, scores) = (req(inputs, 0)?, req(inputs, 1)?);
    if boxes.rank() != 3
        || boxes.shape()[2] != 4
        || scores.rank() != 3
        || scores.shape()[0] != boxes.shape()[0]
        || scores.shape()[2] != boxes.shape()[1]
    {
        return Err(format!(
            "boxes must be [batch, n, 4] and scores [batch, classes, n]; got {:?} and {:?}",
            boxes.shape(),
            scores.shape()
        ));
    }
    let scalar = |i: usize| opt(inputs, i).filter(|t| t.numel() > 0).map(|t| t.data().get_f64(0));
    let max_out = scalar(2).unwrap_or(0.0).max(0.0) as usize;
    let iou_thr = scalar(3).unwrap_or(0.0);
    let score_thr = scalar(4);
    let center = attrs.int("center_point_box", 0) != 0;
    let (nb, nc, n) = (scores.shape()[0], scores.shape()[1], boxes.shape()[1]);
    let (bv, sv) = (boxes.to_f64_vec(), scores.to_f64_vec());
    let corners = |bi: usize, k: usize| -> [f64; 4] {
        let v = &bv[(bi * n + k) * 4..][..4];
        if center {
            [v[0] - v[2] / 2.0, v[1] - v[3] / 2.0, v[0] + v[2] / 2.0, v[1] + v[3] / 2.0] // x1 y1 x2 y2
        } else {
            [v[1].min(v[3]), v[0].min(v[2]), v[1].max(v[3]), v[0].max(v[2])]
        }
    };
    let suppress = |bi: usize, a: usize, b: usize| -> bool {
        let (p, q) = (corners(bi, a), corners(bi, b));
        let (ix1, iy1, ix2, iy2) = (p[0].max(q[0]), p[1].max(q[1]), p[2].min(q[2]), p[3].min(q[3]));
        if ix2 <= ix1 || iy2 <= iy1 {
            return false;
        }
        let inter = (ix2 - ix1) * (iy2 - iy1);
        let (a1, a2) = ((p[2] - p[0]) * (p[3] - p[1]), (q[2] - q[0]) * (q[3] - q[1]));
        let union = a1 + a2 - inter;
        inter > 0.0 && a1 > 0.0 && a2 > 0.0 && union > 0.0 && inter / union > iou_thr
    };
    let mut selected: Vec<i64> = Vec::new();
    for bi in 0..nb {
        for ci in 0..nc {
            let sc = &sv[(bi * nc + ci) * n..][..n];
            let mut cand: Vec<usize> =
                (0..n).filter(|&k| score_thr.is_none_or(|t| sc[k] > t)).collect();
            // Highest score first; ties go to the lower box index.
            cand.sort_by(|&a, &b| sc[b].total_cmp(&sc[a]).then(a.cmp(&b)));
            let mut kept: Vec<usize> = Vec::new();
            for k in cand {
                if kept.len() >= max_out {
                    break;
                }
                if kept.iter().all(|&j| !suppress(bi, k, j)) {
                    kept.push(k);
                    selected.extend([bi as i64, ci as i64, k as i64]);
                }
            }
        }
    }
    let rows = selected.len() / 3;
    Tensor::from_vec(vec![rows, 3], selected).map_err(|e| e.to_string())
}

/// Base sampling coordinates of one spatial dim in [-1, 1] (ONNX AffineGrid / GridSample).
fn base_coords(n: usize, align_corners: bool) -> Vec<f64> {
    (0..n)
        .map(|i| {
            if align_corners {
                if n == 1 { -1.0 } else { -1.0 + 2.0 * i as f64 / (n - 1) as f64 }
            } else {
                -1.0 + (2.0 * i as f64 + 1.0) / n as f64
            }
        })
        .collect()
}

/// Sampling grids from affine matrices: theta [N, 2, 3] → grid [N, H, W, 2], or
/// [N, 3, 4] → [N, D, H, W, 3]; the last grid axis is (x, y[, z]).
pub fn affine_grid(attrs: &Attrs, theta: &Tensor, size: &Tensor) -> KResult<Tensor> {
    let size = ints(size, "size")?;
    let nsp = size
        .len()
        .checked_sub(2)
        .filter(|&n| n == 2 || n == 3)
        .ok_or("size must be [N, C, H, W] or [N, C, D, H, W]")?;
    if theta.shape() != [size[0] as usize, nsp, nsp + 1] {
        return Err(format!(
            "theta must be [{}, {nsp}, {}], got {:?}",
            size[0],
            nsp + 1,
            theta.shape()
        ));
    }
    let align = attrs.int("align_corners", 0) != 0;
    let dims: Vec<usize> = size[2..].iter().map(|&d| d.max(0) as usize).collect();
    let axes: Vec<Vec<f64>> = dims.iter().map(|&d| base_coords(d, align)).collect();
    let th = theta.to_f64_vec();
    let n = size[0] as usize;
    let points: usize = dims.iter().product();
    let mut out = Vec::with_capacity(n * points * nsp);
    for b in 0..n {
        for p in 0..points {
            // Homogeneous point (x, y[, z], 1), x along the last spatial dim.
            let mut rem = p;
            let mut coord = vec![0.0; nsp + 1];
            for d in (0..nsp).rev() {
                coord[nsp - 1 - d] = axes[d][rem % dims[d]];
                rem /= dims[d];
            }
            coord[nsp] = 1.0;
            for r in 0..nsp {
                out.push(
                    (0..=nsp).map(|k| th[(b * nsp + r) * (nsp + 1) + k] * coord[k]).sum::<f64>(),
                );
            }
        }
    }
    let mut shape = vec![n];
    shape.extend(&dims);
    shape.push(nsp);
    from_f64(ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?, theta.dtype())
}

fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let range = hi - lo;
    if range <= 0.0 {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let k = (dx / range) as i64;
        let r = dx - k as f64 * range;
        if k % 2 == 0 { lo + r } else { hi - r }
    } else if x > hi {
        let dx = x - hi;
        let k = (dx / range) as i64;
        let r = dx - k as f64 * range;
        if k % 2 == 0 { hi - r } else { lo + r }
    } else {
        x
    }
}

fn cubic_coeffs(t: f64) -> [f64; 4] {
    let a = -0.75;
    let x = t.abs();
    [
        ((a * (x + 1.0) - 5.0 * a) * (x + 1.0) + 8.0 * a) * (x + 1.0) - 4.0 * a,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        ((a + 2.0) * (1.0 - x) - (a + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0,
        ((a * (2.0 - x) - 5.0 * a) * (2.0 - x) + 8.0 * a) * (2.0 - x) - 4.0 * a,
    ]
}

/// Samples X [N, C, spatial…] at grid [N, out…, nsp] (normalised x, y[, z]) with nearest,
/// linear or cubic interpolation and zeros, border or reflection padding.
pub fn grid_sample(attrs: &Attrs, x: &Tensor, grid: &Tensor) -> KResult<Tensor> {
    let nsp = x.rank().checked_sub(2).filter(|&n| n >= 1).ok_or("X must have rank ≥ 3")?;
    if grid.rank() != nsp + 2 || grid.shape()[0] != x.shape()[0] || grid.shape()[nsp + 1] != nsp {
        return Err(format!(
            "grid must be [N, out…, {nsp}] for X {:?}, got {:?}",
            x.shape(),
            grid.shape()
        ));
    }
    let mode = attrs.str("mode", "linear");
    let padding = attrs.str("padding_mode", "zeros");
    let align = attrs.int("align_corners", 0) != 0;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let dims: Vec<usize> = x.shape()[2..].to_vec();
    let out_sp: Vec<usize> = grid.shape()[1..=nsp].to_vec();
    let pts: usize = out_sp.iter().product();
    let plane: usize = dims.iter().product();
    let st = crate::util::strides(&dims);
    let (xv, gv) = (x.to_f64_vec(), grid.to_f64_vec());
    let (lo, hi): (Vec<f64>, Vec<f64>) = dims
        .iter()
        .map(|&d| if align { (0.0, d as f64 - 1.0) } else { (-0.5, d as f64 - 0.5) })
        .unzip();
    // Resolve a tap index along dim `i` per the padding mode (None: contributes zero).
    let resolve = |i: usize, k: i64| -> Option<usize> {
        let d = dims[i] as i64;
        match padding {
            "border" => Some(k.clamp(0, d - 1) as usize),
            "reflection" => Some((reflect(k as f64, lo[i], hi[i]) as i64).clamp(0, d - 1) as usize),
            _ => (0..d).contains(&k).then_some(k as usize),
        }
    };
    let mut out = vec![0.0; n * c * pts];
    for b in 0..n {
        for p in 0..pts {
            let g = &gv[(b * pts + p) * nsp..][..nsp];
            // Grid holds (x, y[, z]): reversed to match X's (…, H, W) dims.
            let mut coord: Vec<f64> = (0..nsp)
                .map(|i| {
                    let v = g[nsp - 1 - i];
                    let len = dims[i] as f64;
                    if align {
                        (v + 1.0) / 2.0 * (len - 1.0)
                    } else {
                        ((v + 1.0) * len - 1.0) / 2.0
                    }
                })
                .collect();
            if mode == "nearest" {
                coord.iter_mut().for_each(|v| *v = v.round_ties_even());
            }
            for (i, v) in coord.iter_mut().enumerate() {
                if *v < lo[i] || *v > hi[i] {
                    match padding {
                        "border" => *v = v.clamp(0.0, dims[i] as f64 - 1.0),
                        "reflection" => *v = reflect(*v, lo[i], hi[i]),
                        _ => {}
                    }
                }
            }
            // Taps per dim: (index, weight).
            let taps: Vec<Vec<(Option<usize>, f64)>> = (0..nsp)
                .map(|i| {
                    let v = coord[i];
                    match mode {
                        "nearest" => vec![(resolve(i, v as i64), 1.0)],
                        "cubic" | "bicubic" => {
                            let f = v.floor();
                            let w = cubic_coeffs(v - f);
                            (0..4).map(|k| (resolve(i, f as i64 - 1 + k as i64), w[k])).collect()
                        }
                        _ => {
                            let f = v.floor();
                            let t = v - f;
                            vec![(resolve(i, f as i64), 1.0 - t), (resolve(i, f as i64 + 1), t)]
                        }
                    }
                })
                .collect();
            let combos: usize = taps.iter().map(Vec::len).product();
            for ch in 0..c {
                let base = (b * c + ch) * plane;
                let mut acc = 0.0;
                for combo in 0..combos {
                    let mut rem = combo;
                    let mut off = 0;
                    let mut w = 1.0;
                    let mut zero = false;
                    for i in (0..nsp).rev() {
                        let (idx, wi) = taps[i][rem % taps[i].len()];
                        rem /= taps[i].len();
                        w *= wi;
                        match idx {
                            Some(k) => off += k * st[i],
                            None => zero = true,
                        }
                    }
                    if !zero {
                        acc += w * xv[base + off];
                    }
                }
                out[(b * c + ch) * pts + p] = acc;
            }
        }
    }
    let mut shape = vec![n, c];
    shape.extend(&out_sp);
    from_f64(ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?, x.dtype())
}

/// Discrete Fourier transform (ONNX DFT-20): input [..., 1] (real) or [..., 2] (complex)
/// along `axis` (an input, default −2), zero-padded or truncated to `dft_length`; forward,
/// inverse (scaled by 1/n), one-sided output for real forward transforms, and Hermitian
/// reconstruction for one-sided inverse transforms (real output [..., 1]).
pub fn dft(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    let r = x.rank();
    let last = *x.shape().last().ok_or("input must have rank ≥ 2")?;
    if r < 2 || !(last == 1 || last == 2) {
        return Err(format!(
            "the last dim must be 1 (real) or 2 (complex), got shape {:?}",
            x.shape()
        ));
    }
    let axis_raw = opt(inputs, 2)
        .map(|t| ints(t, "axis"))
        .transpose()?
        .and_then(|v| v.first().copied())
        .unwrap_or(-2);
    // Negative axes count from the back of the whole tensor (−2 is the last signal dim).
    let axis = norm_axis(axis_raw, r).map_err(|e| format!("axis: {e}"))?;
    if axis == r - 1 {
        return Err("axis must not be the trailing real/imaginary dim".into());
    }
    let inverse = attrs.int("inverse", 0) != 0;
    let onesided = attrs.int("onesided", 0) != 0;
    let n_in = x.shape()[axis];
    let n = match opt(inputs, 1)
        .map(|t| ints(t, "dft_length"))
        .transpose()?
        .and_then(|v| v.first().copied())
    {
        Some(l) if l > 0 => l as usize,
        Some(l) => return Err(format!("dft_length must be positive, got {l}")),
        None if inverse && onesided => 2 * (n_in.max(1) - 1),
        None => n_in,
    };
    let v = x.to_f64_vec();
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..r - 1].iter().product();
    let get = |o: usize, k: usize, i: usize| -> (f64, f64) {
        if k >= n_in {
            return (0.0, 0.0);
        }
        let base = ((o * n_in + k) * inner + i) * last;
        (v[base], if last == 2 { v[base + 1] } else { 0.0 })
    };
    let (out_len, out_last) = if inverse && onesided {
        (n, 1)
    } else if onesided {
        (n / 2 + 1, 2)
    } else {
        (n, 2)
    };
    let mut out = vec![0.0; outer * out_len * inner * out_last];
    let sign = if inverse { 1.0 } else { -1.0 };
    for o in 0..outer {
        for i in 0..inner {
            // The complex input sequence (Hermitian-extended for a one-sided inverse).
            let seq: Vec<(f64, f64)> = (0..n)
                .map(|k| {
                    if inverse && onesided {
                        let half = n_in;
                        if k < half {
                            get(o, k, i)
                        } else {
                            let (re, im) = get(o, n - k, i);
                            (re, -im)
                        }
                    } else {
                        get(o, k, i)
                    }
                })
                .collect();
            for f in 0..out_len {
                let (mut re, mut im) = (0.0, 0.0);
                for (k, &(a, b)) in seq.iter().enumerate() {
                    let t = sign * 2.0 * PI * (f * k % n.max(1)) as f64 / n as f64;
                    re += a * t.cos() - b * t.sin();
                    im += a * t.sin() + b * t.cos();
                }
                if inverse {
                    re /= n as f64;
                    im /= n as f64;
                }
                let at = ((o * out_len + f) * inner + i) * out_last;
                out[at] = re;
                if out_last == 2 {
                    out[at + 1] = im;
                }
            }
        }
    }
    let mut shape = x.shape().to_vec();
    shape[axis] = out_len;
    shape[r - 1] = out_last;
    from_f64(ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?, x.dtype())
}
