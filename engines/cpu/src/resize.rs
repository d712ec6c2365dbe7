//! `resize`: nearest, linear and cubic resampling (with antialiasing), every coordinate
//! transformation mode of ONNX Resize-19, `axes`, `keep_aspect_ratio_policy` and
//! `tf_crop_and_resize` extrapolation. Interpolation is separable, one axis at a time, in f64.

use ndarray::{ArrayD, Axis, IxDyn};
use xpu_ir::{Attrs, Tensor};

use crate::reduce::{from_f64, to_f64};
use crate::util::{KResult, checked_numel, ints, norm_axis, opt, req};

#[derive(Clone, Copy)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

struct Params<'a> {
    mode: Mode,
    nearest_mode: &'a str,
    coord: &'a str,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
    antialias: bool,
}

impl Params<'_> {
    /// Interpolation weights for a source coordinate with fractional part `ratio`.
    fn coeffs(&self, ratio: f64, scale: f64) -> KResult<Vec<f64>> {
        Ok(match self.mode {
            Mode::Nearest => {
                if ratio.fract() == 0.0 {
                    vec![0.0, 1.0]
                } else {
                    let take_second = match self.nearest_mode {
                        "round_prefer_floor" => ratio > 0.5,
                        "round_prefer_ceil" => ratio >= 0.5,
                        "floor" => false,
                        "ceil" => true,
                        other => return Err(format!("unknown nearest_mode `{other}`")),
                    };
                    if take_second { vec![0.0, 1.0] } else { vec![1.0, 0.0] }
                }
            }
            Mode::Linear if self.antialias => {
                let scale = scale.min(1.0);
                let start = (-1.0 / scale).floor() as i64 + 1;
                let footprint = 2 - 2 * start;
                let c: Vec<f64> = (start..start + footprint)
                    .map(|i| (1.0 - ((i as f64 - ratio) * scale).abs()).clamp(0.0, 1.0))
                    .collect();
                let sum: f64 = c.iter().sum();
                c.into_iter().map(|x| x / sum).collect()
            }
            Mode::Linear => vec![1.0 - ratio, ratio],
            Mode::Cubic if self.antialias => {
                let a = self.cubic_a;
                let scale = scale.min(1.0);
                let f = |x: f64| {
                    let x = x.abs();
                    if x <= 1.0 {
                        (a + 2.0) * x.powi(3) - (a + 3.0) * x * x + 1.0
                    } else if x < 2.0 {
                        a * x.powi(3) - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / scale).floor() as i64 + 1;
                let end = 2 - start;
                let c: Vec<f64> = (start..end).map(|i| f(scale * (i as f64 - ratio))).collect();
                let sum: f64 = c.iter().sum();
                c.into_iter().map(|x| x / sum).collect()
            }
            Mode::Cubic => {
                let a = self.cubic_a;
                let r = ratio;
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * (1.0 - r) - (a + 3.0)) * (1.0 - r) * (1.0 - r) + 1.0,
                    ((a * ((1.0 - r) + 1.0) - 5.0 * a) * ((1.0 - r) + 1.0) + 8.0 * a)
                        * ((1.0 - r) + 1.0)
                        - 4.0 * a,
                ]
            }
        })
    }

    /// Source coordinate of output index `y`, and whether it extrapolates.
    fn source(
        &self,
        y: f64,
        scale: f64,
        in_w: usize,
        out_int: usize,
        roi: Option<(f64, f64)>,
    ) -> KResult<(f64, bool)> {
        let in_w = in_w as f64;
        let out_w = scale * in_w;
        Ok(match self.coord {
            "align_corners" => {
                (if out_w == 1.0 { 0.0 } else { y * (in_w - 1.0) / (out_w - 1.0) }, false)
            }
            "asymmetric" => (y / scale, false),
            "tf_crop_and_resize" => {
                let (r0, r1) = roi.ok_or("tf_crop_and_resize needs roi")?;
                let x = if out_w == 1.0 {
                    (r1 - r0) * (in_w - 1.0) / 2.0
                } else {
                    y * (r1 - r0) * (in_w - 1.0) / (out_w - 1.0)
                } + r0 * (in_w - 1.0);
                (x, x < 0.0 || x > in_w - 1.0)
            }
            "pytorch_half_pixel" => {
                (if out_w == 1.0 { -0.5 } else { (y + 0.5) / scale - 0.5 }, false)
            }
            "half_pixel" => ((y + 0.5) / scale - 0.5, false),
            "half_pixel_symmetric" => {
                let adjustment = out_int as f64 / out_w;
                let offset = in_w / 2.0 * (1.0 - adjustment);
                (offset + (y + 0.5) / scale - 0.5, false)
            }
            other => return Err(format!("unknown coordinate_transformation_mode `{other}`")),
        })
    }
}

fn resize_axis(
    data: &ArrayD<f64>,
    axis: usize,
    scale: f64,
    out_w: usize,
    roi: Option<(f64, f64)>,
    p: &Params<'_>,
) -> KResult<ArrayD<f64>> {
    let in_w = data.shape()[axis];
    let mut shape = data.shape().to_vec();
    shape[axis] = out_w;
    checked_numel(&shape)?;
    let mut out = ArrayD::<f64>::zeros(IxDyn(&shape));
    if out_w == 0 || in_w == 0 {
        return Ok(out);
    }
    for y in 0..out_w {
        let (x, extrapolated) = p.source(y as f64, scale, in_w, out_w, roi)?;
        let mut slot = out.index_axis_mut(Axis(axis), y);
        if extrapolated {
            slot.fill(p.extrapolation);
            continue;
        }
        let xi = x.floor();
        let ratio = if x == xi { 1.0 } else { x - xi };
        let mut coeffs = p.coeffs(ratio, scale)?;
        let n = coeffs.len() as i64;
        let pad = (n + 1) / 2;
        let xp = x + pad as f64;
        let pp = xp.floor();
        let frac = xp - pp;
        let off = if n % 2 == 0 {
            if frac == 0.0 { -(n / 2) } else { -(n / 2) + 1 }
        } else if frac <= 0.5 {
            -((n - 1) / 2)
        } else {
            -((n - 1) / 2) + 1
        };
        let start = pp as i64 + off - pad;
        let idx: Vec<i64> = (0..n).map(|k| start + k).collect();
        if p.exclude_outside {
            for (c, &i) in coeffs.iter_mut().zip(&idx) {
                if i < 0 || i >= in_w as i64 {
                    *c = 0.0;
                }
            }
            let sum: f64 = coeffs.iter().sum();
            let sum = if sum == 0.0 { 1.0 } else { sum };
            coeffs.iter_mut().for_each(|c| *c /= sum);
        }
        for (c, &i) in coeffs.iter().zip(&idx) {
            if *c == 0.0 {
                continue;
            }
            let src = data.index_axis(Axis(axis), i.clamp(0, in_w as i64 - 1) as usize);
            slot.scaled_add(*c, &src);
        }
    }
    Ok(out)
}

pub fn resize(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    let r = x.rank();
    let mode = match attrs.str("mode", "nearest") {
        "nearest" => Mode::Nearest,
        "linear" => Mode::Linear,
        "cubic" => Mode::Cubic,
        other => return Err(format!("unknown mode `{other}` (nearest, linear or cubic)")),
    };
    let p = Params {
        mode,
        nearest_mode: attrs.str("nearest_mode", "round_prefer_floor"),
        coord: attrs.str("coordinate_transformation_mode", "half_pixel"),
        cubic_a: attrs.float("cubic_coeff_a", -0.75),
        exclude_outside: attrs.int("exclude_outside", 0) != 0,
        extrapolation: attrs.float("extrapolation_value", 0.0),
        antialias: attrs.int("antialias", 0) != 0,
    };
    let axes: Vec<usize> = match attrs.ints("axes") {
        Some(a) => a.iter().map(|&a| norm_axis(a, r)).collect::<KResult<_>>()?,
        None => (0..r).collect(),
    };
    let roi_in: Vec<f64> = opt(inputs, 1).map(|t| t.to_f64_vec()).unwrap_or_default();
    let roi: Option<Vec<f64>> = if roi_in.is_empty() {
        None
    } else if roi_in.len() == 2 * axes.len() {
        let mut full: Vec<f64> = vec![0.0; r].into_iter().chain(vec![1.0; r]).collect();
        for (i, &d) in axes.iter().enumerate() {
            full[d] = roi_in[i];
            full[r + d] = roi_in[axes.len() + i];
        }
        Some(full)
    } else {
        return Err(format!("roi has {} values, expected {}", roi_in.len(), 2 * axes.len()));
    };
    let scales_in: Vec<f64> = opt(inputs, 2).map(|t| t.to_f64_vec()).unwrap_or_default();
    let sizes_in: Vec<i64> = match opt(inputs, 3) {
        Some(t) => ints(t, "sizes")?,
        None => vec![],
    };
    let shape = x.shape();
    let (scales, sizes): (Vec<f64>, Vec<usize>) = if !sizes_in.is_empty() {
        if sizes_in.len() != axes.len() {
            return Err(format!("sizes has {} values for {} axes", sizes_in.len(), axes.len()));
        }
        let mut size: Vec<usize> = shape.to_vec();
        for (i, &d) in axes.iter().enumerate() {
            size[d] = usize::try_from(sizes_in[i])
                .map_err(|_| format!("negative size {}", sizes_in[i]))?;
        }
        let mut scale: Vec<f64> = (0..r).map(|i| size[i] as f64 / shape[i] as f64).collect();
        match attrs.str("keep_aspect_ratio_policy", "stretch") {
            "stretch" => {}
            policy @ ("not_larger" | "not_smaller") => {
                let picked = axes.iter().map(|&a| scale[a]);
                let s = if policy == "not_larger" {
                    picked.fold(f64::INFINITY, f64::min)
                } else {
                    picked.fold(f64::NEG_INFINITY, f64::max)
                };
                for i in 0..r {
                    scale[i] = if axes.contains(&i) { s } else { 1.0 };
                    size[i] = if axes.contains(&i) {
                        (s * shape[i] as f64 + 0.5) as usize
                    } else {
                        shape[i]
                    };
                }
            }
            other => return Err(format!("unknown keep_aspect_ratio_policy `{other}`")),
        }
        (scale, size)
    } else if !scales_in.is_empty() {
        if scales_in.len() != axes.len() {
            return Err(format!("scales has {} values for {} axes", scales_in.len(), axes.len()));
        }
        let mut scale = vec![1.0; r];
        for (i, &d) in axes.iter().enumerate() {
            if scales_in[i] <= 0.0 {
                return Err(format!("scale {} must be positive", scales_in[i]));
            }
            scale[d] = scales_in[i];
        }
        let size = (0..r).map(|i| (scale[i] * shape[i] as f64) as usize).collect();
        (scale, size)
    } else {
        return Err("resize needs scales or sizes".into());
    };
    let mut data = to_f64(x)?;
    for &axis in &axes {
        let identity = (scales[axis] - 1.0).abs() < 1e-9
            && sizes[axis] == data.shape()[axis]
            && roi
                .as_ref()
                .is_none_or(|roi| roi[axis].abs() < 1e-9 && (roi[axis + r] - 1.0).abs() < 1e-9);
        if identity {
            continue;
        }
        let axis_roi = roi.as_ref().map(|roi| (roi[axis], roi[axis + r]));
        data = resize_axis(&data, axis, scales[axis], sizes[axis], axis_roi, &p)?;
    }
    if !x.dtype().is_float() {
        // saturate_cast: clamp into the integer range before converting.
        let (lo, hi) = crate::numeric!(x.dtype(), T => (crate::scalar::Scalar::to_f64(<T as num_traits::Bounded>::min_value()), crate::scalar::Scalar::to_f64(<T as num_traits::Bounded>::max_value())), (0.0, 1.0));
        data.mapv_inplace(|v| v.round().clamp(lo, hi));
    }
    from_f64(data, x.dtype())
}
