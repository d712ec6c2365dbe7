//! Linear quantization: `quantize_linear` / `dequantize_linear` (per-tensor, per-axis and
//! blocked scales), `dynamic_quantize_linear`, integer products (`matmul_integer`,
//! `conv_integer`) and quantized products (`qlinear_matmul`, `qlinear_conv`). Rounding is
//! half to even and results saturate, as ONNX specifies; scale arithmetic follows the
//! reference's precision (f32) so integer outputs match exactly.

use xpu_ir::{Attrs, DType, Tensor};

use crate::linalg::MatMulKernel;
use crate::reduce::from_f64;
use crate::util::{KResult, norm_axis, opt, req, strides};

fn range_of(d: DType) -> KResult<(f64, f64)> {
    Ok(match d {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        other => return Err(format!("{other} is not a quantized type (u8, i8, u16, i16)")),
    })
}

/// For each element of a tensor of `shape`, the index into a scale/zero-point tensor `p`
/// that is a scalar, a per-axis vector, or a blocked tensor (`block` > 0).
fn param_index(p: &Tensor, shape: &[usize], axis: i64, block: i64) -> KResult<Vec<usize>> {
    let n: usize = shape.iter().product();
    if p.numel() == 1 {
        return Ok(vec![0; n]);
    }
    let axis = norm_axis(axis, shape.len())?;
    let st = strides(shape);
    if block <= 0 {
        if p.rank() != 1 || p.numel() != shape[axis] {
            return Err(format!(
                "a per-axis scale needs {} values along axis {axis}, got shape {:?}",
                shape[axis],
                p.shape()
            ));
        }
        return Ok((0..n).map(|i| (i / st[axis]) % shape[axis]).collect());
    }
    if p.rank() != shape.len() {
        return Err(format!(
            "a blocked scale needs rank {}, got shape {:?}",
            shape.len(),
            p.shape()
        ));
    }
    let pst = strides(p.shape());
    (0..n)
        .map(|i| {
            let mut off = 0;
            for d in 0..shape.len() {
                let mut c = (i / st[d]) % shape[d];
                if d == axis {
                    c /= block as usize;
                }
                if c >= p.shape()[d] {
                    return Err(format!(
                        "blocked scale of shape {:?} does not cover input shape {shape:?}",
                        p.shape()
                    ));
                }
                off += c * pst[d];
            }
            Ok(off)
        })
        .collect()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_f64_vec().into_iter().map(|v| v as f32).collect()
}

pub fn quantize_linear(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (x, scale) = (req(inputs, 0)?, req(inputs, 1)?);
    let zp = opt(inputs, 2);
    let out = zp.map(|z| z.dtype()).or(attrs.dtype("output_dtype")).unwrap_or(DType::U8);
    let lowp = out.lowp();
    let (lo, hi) = match lowp.map(|l| (l, l.sub_byte())) {
        Some((_, Some(i))) => (i.range().0 as f64, i.range().1 as f64),
        // 8- and 4-bit floats saturate (or not) as they are encoded.
        Some((_, None)) => (f64::NEG_INFINITY, f64::INFINITY),
        None => range_of(out)?,
    };
    let float_target = lowp.is_some_and(|l| !l.is_int());
    let (axis, block) = (attrs.int("axis", 1), attrs.int("block_size", 0));
    let si = param_index(scale, x.shape(), axis, block)?;
    let zi = zp.map(|z| param_index(z, x.shape(), axis, block)).transpose()?;
    let (xs, ss) = (x.to_f64_vec(), scale.to_f64_vec());
    let zs = zp.map(|z| z.to_f64_vec());
    let single = x.dtype() != DType::F64;
    let q: Vec<f64> = xs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            // x / scale in the input's precision, as the reference divides f32 by f32.
            let r = if single { (v as f32 / ss[si[i]] as f32) as f64 } else { v / ss[si[i]] };
            let z = zs.as_ref().map(|z| z[zi.as_ref().unwrap()[i]]).unwrap_or(0.0);
            // A float target takes x / scale (+ zero point) as it is; integers round.
            if float_target { r + z } else { (r.round_ties_even() + z).clamp(lo, hi) }
        })
        .collect();
    if let Some(l) = lowp {
        let saturate = attrs.int("saturate", 1) != 0;
        let codes = q
            .iter()
            .map(|&v| l.from_f32(v as f32, saturate, xpu_ir::lowp::RoundMode::Nearest))
            .collect();
        return Tensor::new(x.shape().to_vec(), xpu_ir::TensorData::Lowp(l, codes))
            .map_err(|e| e.to_string());
    }
    from_f64(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(x.shape()), q).map_err(|e| e.to_string())?,
        out,
    )
}

pub fn dequantize_linear(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (x, scale) = (req(inputs, 0)?, req(inputs, 1)?);
    let zp = opt(inputs, 2);
    let out = attrs.dtype("output_dtype").unwrap_or(scale.dtype());
    let (axis, block) = (attrs.int("axis", 1), attrs.int("block_size", 0));
    let si = param_index(scale, x.shape(), axis, block)?;
    let zi = zp.map(|z| param_index(z, x.shape(), axis, block)).transpose()?;
    let (xs, ss) = (x.to_f64_vec(), f32s(scale));
    let zs = zp.map(f32s);
    let y: Vec<f64> = xs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let z = zs.as_ref().map(|z| z[zi.as_ref().unwrap()[i]]).unwrap_or(0.0);
            ((v as f32 - z) * ss[si[i]]) as f64
        })
        .collect();
    from_f64(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(x.shape()), y).map_err(|e| e.to_string())?,
        out,
    )
}

pub fn dynamic_quantize_linear(x: &Tensor) -> KResult<Vec<Tensor>> {
    let xs = f32s(x);
    let maxx = xs.iter().copied().fold(0.0f32, f32::max);
    let minx = xs.iter().copied().fold(0.0f32, f32::min);
    let scale = (if maxx == minx { 1.0 } else { maxx - minx }) / 255.0f32;
    let zp = (0.0f32 - minx / scale).clamp(0.0, 255.0).round_ties_even();
    let y: Vec<u8> =
        xs.iter().map(|&v| ((v / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8).collect();
    Ok(vec![
        Tensor::from_vec(x.shape().to_vec(), y).map_err(|e| e.to_string())?,
        from_f64(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[]), scale as f64), x.dtype())?,
        Tensor::scalar(zp as u8),
    ])
}

/// `t − zero_point` as f64, with the zero point per row (`axis` 0 of a 2-D operand), per
/// column (`axis` 1) or scalar.
fn centered(t: &Tensor, zp: Option<&Tensor>, per: usize) -> KResult<Tensor> {
    let mut v = t.to_f64_vec();
    if let Some(z) = zp {
        let zv = z.to_f64_vec();
        if zv.len() == 1 {
            v.iter_mut().for_each(|x| *x -= zv[0]);
        } else if t.rank() >= 2 {
            let st = strides(t.shape());
            let d = t.rank() - 2 + per;
            if zv.len() != t.shape()[d] {
                return Err(format!(
                    "zero point has {} values, the operand's dim {d} is {}",
                    zv.len(),
                    t.shape()[d]
                ));
            }
            for (i, x) in v.iter_mut().enumerate() {
                *x -= zv[(i / st[d]) % t.shape()[d]];
            }
        } else {
            return Err("a per-row/column zero point needs a matrix operand".into());
        }
    }
    Tensor::from_vec(t.shape().to_vec(), v).map_err(|e| e.to_string())
}

pub fn matmul_integer(inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let a = centered(req(inputs, 0)?, opt(inputs, 2), 0)?;
    let b = centered(req(inputs, 1)?, opt(inputs, 3), 1)?;
    crate::cast::cast(&crate::linalg::matmul(MatMulKernel::Naive, &a, &b)?, DType::I32)
}

fn requantize(
    acc: &Tensor,
    scale: &[f32],
    per_col_dim: Option<usize>,
    y_zp: Option<&Tensor>,
    out: DType,
) -> KResult<Tensor> {
    let (lo, hi) = range_of(out)?;
    let z = y_zp.map(|z| z.to_f64_vec()[0]).unwrap_or(0.0);
    let st = strides(acc.shape());
    let v: Vec<f64> = acc
        .to_f64_vec()
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let s = match per_col_dim {
                Some(d) if scale.len() > 1 => scale[(i / st[d]) % acc.shape()[d]],
                _ => scale[0],
            };
            (c * s as f64 + z).round_ties_even().clamp(lo, hi)
        })
        .collect();
    from_f64(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(acc.shape()), v)
            .map_err(|e| e.to_string())?,
        out,
    )
}

pub fn qlinear_matmul(inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (a, a_s, b, b_s, y_s) =
        (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 3)?, req(inputs, 4)?, req(inputs, 6)?);
    let acc = crate::linalg::matmul(
        MatMulKernel::Naive,
        &centered(a, opt(inputs, 2), 0)?,
        &centered(b, opt(inputs, 5), 1)?,
    )?;
    let (av, bv, yv) = (f32s(a_s), f32s(b_s), f32s(y_s));
    // a_scale · b_scale / y_scale in f32, per output column when b's scale is per column.
    let scale: Vec<f32> = (0..bv.len().max(av.len()))
        .map(|i| av[i.min(av.len() - 1)] * bv[i.min(bv.len() - 1)] / yv[0])
        .collect();
    let out = opt(inputs, 7).map(|z| z.dtype()).unwrap_or(a.dtype());
    requantize(&acc, &scale, Some(acc.rank() - 1), opt(inputs, 7), out)
}

pub fn conv_integer(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = centered(req(inputs, 0)?, opt(inputs, 2), 0)?;
    let w = centered_per_channel(req(inputs, 1)?, opt(inputs, 3))?;
    crate::cast::cast(
        &crate::conv::conv(MatMulKernel::Naive, attrs, &[Some(&x), Some(&w)])?,
        DType::I32,
    )
}

/// Weight minus its zero point, which is scalar or per output channel (dim 0).
fn centered_per_channel(w: &Tensor, zp: Option<&Tensor>) -> KResult<Tensor> {
    let mut v = w.to_f64_vec();
    if let Some(z) = zp {
        let zv = z.to_f64_vec();
        let per = w.numel() / w.shape().first().copied().unwrap_or(1).max(1);
        for (i, x) in v.iter_mut().enumerate() {
            *x -= if zv.len() == 1 { zv[0] } else { zv[(i / per).min(zv.len() - 1)] };
        }
    }
    Tensor::from_vec(w.shape().to_vec(), v).map_err(|e| e.to_string())
}

pub fn qlinear_conv(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (x, x_s, w, w_s, y_s) =
        (req(inputs, 0)?, req(inputs, 1)?, req(inputs, 3)?, req(inputs, 4)?, req(inputs, 6)?);
    let xc = centered(x, opt(inputs, 2), 0)?;
    let wc = centered_per_channel(w, opt(inputs, 5))?;
    let bias = opt(inputs, 8)
        .map(|b| Tensor::from_vec(b.shape().to_vec(), b.to_f64_vec()))
        .transpose()
        .map_err(|e| e.to_string())?;
    let acc =
        crate::conv::conv(MatMulKernel::Naive, attrs, &[Some(&xc), Some(&wc), bias.as_ref()])?;
    let (xv, wv, yv) = (f32s(x_s), f32s(w_s), f32s(y_s));
    let scale: Vec<f32> = (0..wv.len()).map(|i| xv[0] * wv[i] / yv[0]).collect();
    let out = opt(inputs, 7).map(|z| z.dtype()).unwrap_or(x.dtype());
    requantize(&acc, &scale, Some(1), opt(inputs, 7), out)
}
