//! Convolution (im2col + GEMM, kernel `cpu.im2col_conv`), transposed convolution and
//! pooling, for any number of spatial dims.

use ndarray::{ArrayD, IxDyn};
use xpu_ir::{Attrs, Op, Tensor};

use crate::linalg::MatMulKernel;
use crate::reduce::{from_f64, to_f64};
use crate::scalar::Scalar;
use crate::util::{KResult, opt, req, strides};

/// Below this many multiply-adds (or pooling taps) a convolution or pooling runs on the
/// calling thread: a few microseconds of work, where splitting saves less than it costs.
const PARALLEL_WORK: usize = 1 << 16;

/// Column-matrix elements below which im2col runs on the calling thread.
const PARALLEL_IM2COL: usize = 1 << 13;

/// Resolved geometry of one spatial dim.
#[derive(Clone, Copy, Debug)]
struct Geo {
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    pad_begin: usize,
    out: usize,
}

fn geometry(
    attrs: &Attrs,
    in_spatial: &[usize],
    kernel: &[usize],
    ceil: bool,
) -> KResult<Vec<Geo>> {
    let n = in_spatial.len();
    let get = |key: &str, default: i64, len: usize| -> KResult<Vec<i64>> {
        match attrs.ints(key) {
            Some(v) if v.len() == len => Ok(v.to_vec()),
            Some(v) => Err(format!("attribute `{key}` has {} values, expected {len}", v.len())),
            None => Ok(vec![default; len]),
        }
    };
    let strides = get("strides", 1, n)?;
    let dil = get("dilations", 1, n)?;
    let pads = get("pads", 0, 2 * n)?;
    if pads.iter().any(|&p| p < 0) {
        return Err(format!("pads {pads:?} must not be negative"));
    }
    let auto_pad = attrs.str("auto_pad", "NOTSET");
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (x, k, s, d) = (in_spatial[i] as i64, kernel[i] as i64, strides[i], dil[i]);
        if s <= 0 || d <= 0 {
            return Err("strides and dilations must be positive".into());
        }
        if k <= 0 {
            return Err(format!("kernel dims {kernel:?} must be positive"));
        }
        let eff = (k - 1) * d + 1;
        let (pb, o) = match auto_pad {
            "SAME_UPPER" | "SAME_LOWER" => {
                let o = (x + s - 1) / s;
                let total = ((o - 1) * s + eff - x).max(0);
                let pb = if auto_pad == "SAME_UPPER" { total / 2 } else { total - total / 2 };
                (pb, o)
            }
            "VALID" => (0, (x - eff) / s + 1),
            "NOTSET" | "" => {
                let o = xpu_ir::infer::window_out(x, k, s, d, pads[i], pads[i + n], "NOTSET", ceil);
                (pads[i], o)
            }
            other => return Err(format!("unknown auto_pad `{other}`")),
        };
        if o < 0 {
            return Err(format!("window of {eff} does not fit spatial dim {x}"));
        }
        out.push(Geo {
            input: x as usize,
            kernel: k as usize,
            stride: s as usize,
            dilation: d as usize,
            pad_begin: pb.max(0) as usize,
            out: o as usize,
        });
    }
    Ok(out)
}

/// Input coordinate of output position `o` and kernel offset `k`, if inside the input.
#[inline]
fn src(g: &Geo, o: usize, k: usize) -> Option<usize> {
    let p = (o * g.stride + k * g.dilation) as isize - g.pad_begin as isize;
    (p >= 0 && (p as usize) < g.input).then_some(p as usize)
}

fn unravel(mut i: usize, dims: &[usize], out: &mut [usize]) {
    for d in (0..dims.len()).rev() {
        out[d] = i % dims[d];
        i /= dims[d];
    }
}

pub fn conv(kernel: MatMulKernel, attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    crate::float!(x.dtype(), T => {
        let (out, shape) = conv_into::<T>(
            kernel,
            attrs,
            ConvOperands { x, w: req(inputs, 1)?, bias: opt(inputs, 2) },
            // Empty: sized by resize_for_overwrite (zeroed pages, no fill, when large).
            |_| Vec::new(),
            &mut Vec::new(),
            &|_, _| {},
        )?;
        Tensor::from_vec(shape, out).map_err(|e| e.to_string())
    }, Err(format!("conv does not support dtype {}", x.dtype())))
}

/// The tensors of one convolution: input, weights and the optional per-channel bias.
#[derive(Clone, Copy)]
pub(crate) struct ConvOperands<'a> {
    pub x: &'a Tensor,
    pub w: &'a Tensor,
    pub bias: Option<&'a Tensor>,
}

/// What runs on each image's output (`[M, spatial…]`, bias added) while it is still in
/// cache: a fused epilogue (residual add, activation). Gets the image index.
pub(crate) type ImageEpilogue<'a, T> = &'a (dyn Fn(usize, &mut [T]) + Sync);

/// Convolution into the buffer `buffer(len)` gives (stale contents are overwritten), one
/// image at a time: im2col into `scratch` (skipped for pointwise convolutions, whose input
/// already is the column matrix), one GEMM per group straight into the image's output, then
/// the bias and `epilogue`. Images whose product is too small to thread run in parallel.
/// Returns the output and its shape.
pub(crate) fn conv_into<T: Scalar>(
    kernel: MatMulKernel,
    attrs: &Attrs,
    ops: ConvOperands<'_>,
    buffer: impl FnOnce(usize) -> Vec<T>,
    scratch: &mut Vec<T>,
    epilogue: ImageEpilogue<'_, T>,
) -> KResult<(Vec<T>, Vec<usize>)> {
    let (x, w) = (ops.x, ops.w);
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(format!("X {xs:?} and W {ws:?} must have the same rank ≥ 3"));
    }
    let g = attrs.int("group", 1).max(1) as usize;
    let (n, c, m) = (xs[0], xs[1], ws[0]);
    let cg = c / g;
    if c % g != 0 || m % g != 0 || ws[1] != cg {
        return Err(format!("channels do not match: X has {c}, W {ws:?}, group {g}"));
    }
    let geo = geometry(attrs, &xs[2..], &ws[2..], false)?;
    let out_sp: Vec<usize> = geo.iter().map(|g| g.out).collect();
    let mut shape = vec![n, m];
    shape.extend(&out_sp);
    let total = crate::util::checked_numel(&shape)?;
    let ksz: usize = ws[2..].iter().product();
    let osz: usize = out_sp.iter().product();
    let isz: usize = xs[2..].iter().product();
    let xv = x.as_slice::<T>().ok_or("X dtype")?;
    let wv = w.as_slice::<T>().ok_or("W dtype")?;
    let bias = match ops.bias {
        Some(b) => {
            let bv = b.as_slice::<T>().ok_or("B dtype")?;
            if bv.len() != m {
                return Err(format!("B has {} values for {m} output channels", bv.len()));
            }
            Some(bv)
        }
        None => None,
    };
    let (mg, rows) = (m / g, cg * ksz);
    // A pointwise convolution's input image is already its column matrix.
    let pointwise =
        geo.iter().all(|g| g.kernel == 1 && g.stride == 1 && g.pad_begin == 0 && g.out == g.input);
    if !pointwise {
        crate::util::checked_numel(&[rows, osz])?; // the im2col workspace
    }
    let mut out = buffer(total);
    crate::util::resize_for_overwrite(&mut out, total);
    if total == 0 {
        return Ok((out, shape));
    }
    // im2col writes every element (zeros in the padding), so workspaces are never cleared;
    // they only grow (a conv net's layers alternate sizes: shrinking and regrowing would
    // zero-fill them on every run).
    let need = if pointwise { 0 } else { rows * osz };
    let image = |b: usize, dst: &mut [T], work: &mut [T]| {
        for gi in 0..g {
            let x_img = &xv[(b * c + gi * cg) * isz..][..cg * isz];
            let col: &[T] = if pointwise {
                x_img
            } else {
                im2col(x_img, cg, &geo, &mut work[..need]);
                &work[..need]
            };
            crate::linalg::mm(
                kernel,
                mg,
                osz,
                rows,
                crate::linalg::Mat::rows(&wv[gi * mg * rows..][..mg * rows], rows),
                crate::linalg::Mat::rows(col, osz),
                &mut dst[gi * mg * osz..][..mg * osz],
            );
        }
        if let Some(bv) = bias {
            for (plane, &bias) in dst.chunks_exact_mut(osz).zip(bv) {
                plane.iter_mut().for_each(|v| *v = v.add(bias));
            }
        }
        epilogue(b, dst);
    };
    let per_image = m * osz * rows;
    let threads = crate::team::threads();
    if n >= threads && threads > 1 && n * per_image >= PARALLEL_WORK {
        // One contiguous run of images per thread, each with its own workspace; each
        // image's product runs whole on its thread.
        let per_thread = n.div_ceil(threads);
        let tasks = n.div_ceil(per_thread);
        grow(scratch, tasks * need);
        crate::team::for_chunk_pairs_mut(
            (&mut out, per_thread * m * osz),
            (&mut scratch[..tasks * need], need),
            |t, dst, work| {
                for (i, img) in dst.chunks_exact_mut(m * osz).enumerate() {
                    image(t * per_thread + i, img, work);
                }
            },
        );
    } else {
        // Fewer images than threads: each image's product is split over the team instead.
        grow(scratch, need);
        for (b, dst) in out.chunks_exact_mut(m * osz).enumerate() {
            image(b, dst, &mut scratch[..need]);
        }
    }
    Ok((out, shape))
}

/// Makes `v` at least `n` long; what it already holds is kept (and not cleared).
fn grow<T: Scalar>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::zero());
    }
}

/// im2col of one image's `channels` planes into `col` (`[channels·kernel, out]`, row-major).
fn im2col<T: Scalar>(x: &[T], channels: usize, geo: &[Geo], col: &mut [T]) {
    let osz: usize = geo.iter().map(|g| g.out).product();
    if geo.len() == 2 {
        let threads = crate::team::threads();
        if threads > 1 && channels > 1 && col.len() >= PARALLEL_IM2COL {
            // Channel runs in parallel: each writes its own band of rows.
            let isz = geo[0].input * geo[1].input;
            let band = channels.div_ceil(threads);
            let rows_per_channel = geo[0].kernel * geo[1].kernel;
            crate::team::for_chunks_mut(col, band * rows_per_channel * osz, |i, piece| {
                let count = piece.len() / (rows_per_channel * osz);
                im2col_2d_strided(&x[i * band * isz..], count, geo, piece);
            });
        } else {
            im2col_2d_strided(x, channels, geo, col);
        }
        return;
    }
    let out_sp: Vec<usize> = geo.iter().map(|g| g.out).collect();
    let ksp: Vec<usize> = geo.iter().map(|g| g.kernel).collect();
    let in_sp: Vec<usize> = geo.iter().map(|g| g.input).collect();
    let (isz, ksz): (usize, usize) = (in_sp.iter().product(), ksp.iter().product());
    let in_st = strides(&in_sp);
    let (mut oi, mut ki) = (vec![0; geo.len()], vec![0; geo.len()]);
    for ci in 0..channels {
        let chan = &x[ci * isz..][..isz];
        for kp in 0..ksz {
            unravel(kp, &ksp, &mut ki);
            let row = &mut col[(ci * ksz + kp) * osz..][..osz];
            for (op, slot) in row.iter_mut().enumerate() {
                unravel(op, &out_sp, &mut oi);
                let mut off = 0;
                let mut inside = true;
                for d in 0..geo.len() {
                    match src(&geo[d], oi[d], ki[d]) {
                        Some(p) => off += p * in_st[d],
                        None => {
                            inside = false;
                            break;
                        }
                    }
                }
                *slot = if inside { chan[off] } else { T::zero() };
            }
        }
    }
}

/// 2-D im2col of `channels` planes into `col` (`[channels·kh·kw, oh·ow]`, row-major). Each plane is first copied into a zero-bordered buffer covering
/// every tap's reach, so each column-matrix row is plain copies of `out_w` elements with no
/// bounds logic: small feature maps (14×14) made the bounds-checked version spend most of
/// its time in thousands of one-element `memset`/`memcpy` calls.
fn im2col_2d_strided<T: Scalar>(x: &[T], channels: usize, geo: &[Geo], col: &mut [T]) {
    let (gh, gw) = (geo[0], geo[1]);
    let (ih, iw, oh, ow) = (gh.input, gw.input, gh.out, gw.out);
    if oh == 0 || ow == 0 {
        return;
    }
    // The padded extent every output's window reaches.
    let ph = (oh - 1) * gh.stride + (gh.kernel - 1) * gh.dilation + 1;
    let pw = (ow - 1) * gw.stride + (gw.kernel - 1) * gw.dilation + 1;
    let bound = (ih * iw).max(oh * ow).saturating_mul(4).max(1 << 16);
    if ph.checked_mul(pw).is_none_or(|n| n > bound) {
        return im2col_2d_bounded(x, channels, geo, col);
    }
    let mut padded = vec![T::zero(); ph * pw];
    let mut row = 0;
    for ci in 0..channels {
        let plane = &x[ci * ih * iw..][..ih * iw];
        pad_plane(plane, ih, iw, gh.pad_begin, gw.pad_begin, &mut padded, ph, pw);
        for ky in 0..gh.kernel {
            for kx in 0..gw.kernel {
                let dst = &mut col[row * oh * ow..][..oh * ow];
                for (oy, out_row) in dst.chunks_exact_mut(ow).enumerate() {
                    let y = oy * gh.stride + ky * gh.dilation;
                    let src = &padded[y * pw + kx * gw.dilation..];
                    if gw.stride == 1 {
                        copy_short(out_row, &src[..ow]);
                    } else {
                        out_row
                            .iter_mut()
                            .zip(src.iter().step_by(gw.stride))
                            .for_each(|(d, &v)| *d = v);
                    }
                }
                row += 1;
            }
        }
    }
}

/// 2-D im2col checking each tap's bounds, for geometries whose padded extent would be far
/// larger than the image: `col[(ci·kh·kw + ky·kw + kx)·oh·ow + oy·ow + ox] = x[ci, iy, ix]`
/// (0 in padding).
fn im2col_2d_bounded<T: Scalar>(x: &[T], channels: usize, geo: &[Geo], col: &mut [T]) {
    let (gh, gw) = (geo[0], geo[1]);
    let (ih, iw, oh, ow) = (gh.input, gw.input, gh.out, gw.out);
    let mut row = 0;
    for ci in 0..channels {
        let plane = &x[ci * ih * iw..][..ih * iw];
        for ky in 0..gh.kernel {
            for kx in 0..gw.kernel {
                let dst = &mut col[row * oh * ow..][..oh * ow];
                for oy in 0..oh {
                    let iy = (oy * gh.stride + ky * gh.dilation) as isize - gh.pad_begin as isize;
                    let out_row = &mut dst[oy * ow..][..ow];
                    if iy < 0 || iy as usize >= ih {
                        out_row.iter_mut().for_each(|v| *v = T::zero());
                        continue;
                    }
                    let src = &plane[iy as usize * iw..][..iw];
                    let x0 = (kx * gw.dilation) as isize - gw.pad_begin as isize;
                    // Columns whose source lies inside the row: [lo, hi); zeros around.
                    let s = gw.stride as isize;
                    let lo =
                        if x0 >= 0 { 0 } else { (x0.unsigned_abs()).div_ceil(gw.stride) }.min(ow);
                    let hi = if x0 >= iw as isize {
                        lo
                    } else {
                        (((iw as isize - 1 - x0) / s + 1) as usize).clamp(lo, ow)
                    };
                    out_row[..lo].iter_mut().for_each(|v| *v = T::zero());
                    out_row[hi..].iter_mut().for_each(|v| *v = T::zero());
                    if hi > lo {
                        let first = (x0 + lo as isize * s) as usize;
                        let dst = &mut out_row[lo..hi];
                        if gw.stride == 1 {
                            dst.copy_from_slice(&src[first..first + (hi - lo)]);
                        } else {
                            dst.iter_mut()
                                .zip(src[first..].iter().step_by(gw.stride))
                                .for_each(|(d, &v)| *d = v);
                        }
                    }
                }
                row += 1;
            }
        }
    }
}

/// `padded[y][x] = plane[y − top][x − left]` inside the plane, zero outside.
#[allow(clippy::too_many_arguments)]
fn pad_plane<T: Scalar>(
    plane: &[T],
    ih: usize,
    iw: usize,
    top: usize,
    left: usize,
    padded: &mut [T],
    ph: usize,
    pw: usize,
) {
    for (y, dst) in padded.chunks_exact_mut(pw).enumerate().take(ph) {
        let iy = y.wrapping_sub(top);
        if iy >= ih {
            dst.fill(T::zero());
            continue;
        }
        let src = &plane[iy * iw..][..iw];
        // Columns [left, left + iw) ∩ [0, pw) come from the plane.
        let lo = left.min(pw);
        let hi = (left + iw).min(pw);
        dst[..lo].fill(T::zero());
        dst[lo..hi].copy_from_slice(&src[..hi - lo]);
        dst[hi..].fill(T::zero());
    }
}

/// `dst.copy_from_slice(src)` for the short rows of small feature maps: eight elements at a
/// time (the last eight overlapping), which compiles to vector moves rather than a library
/// call per row.
#[inline(always)]
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    const W: usize = 8;
    let n = dst.len();
    if n < W {
        dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v);
        return;
    }
    let mut i = 0;
    while i + W <= n {
        let chunk: &[T; W] = src[i..i + W].try_into().expect("W elements");
        dst[i..i + W].copy_from_slice(chunk);
        i += W;
    }
    if i < n {
        let chunk: &[T; W] = src[n - W..n].try_into().expect("W elements");
        dst[n - W..n].copy_from_slice(chunk);
    }
}

pub fn conv_transpose(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let (x, w) = (req(inputs, 0)?, req(inputs, 1)?);
    let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(format!("X {xs:?} and W {ws:?} must have the same rank ≥ 3"));
    }
    let nsp = xs.len() - 2;
    let g = attrs.int("group", 1).max(1) as usize;
    let (n, c) = (xs[0], xs[1]);
    if ws[0] != c || c % g != 0 {
        return Err(format!("W {ws:?} does not match {c} input channels"));
    }
    let mg = ws[1];
    let m = mg * g;
    let get = |key: &str, default: i64, len: usize| -> Vec<i64> {
        attrs
            .ints(key)
            .filter(|v| v.len() == len)
            .map(<[i64]>::to_vec)
            .unwrap_or_else(|| vec![default; len])
    };
    let strides_ = get("strides", 1, nsp);
    let dil = get("dilations", 1, nsp);
    let out_pad = get("output_padding", 0, nsp);
    let mut pads = get("pads", 0, 2 * nsp);
    let kernel: Vec<i64> = attrs
        .ints("kernel_shape")
        .map(<[i64]>::to_vec)
        .unwrap_or_else(|| ws[2..].iter().map(|&k| k as i64).collect());
    let auto_pad = attrs.str("auto_pad", "NOTSET");
    let mut out_sp = vec![0usize; nsp];
    let explicit = attrs.ints("output_shape").map(|s| s[s.len().saturating_sub(nsp)..].to_vec());
    for i in 0..nsp {
        let full = strides_[i] * (xs[2 + i] as i64 - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1;
        if let Some(target) = explicit
            .as_ref()
            .map(|s| s[i])
            .or_else(|| auto_pad.starts_with("SAME").then(|| xs[2 + i] as i64 * strides_[i]))
        {
            // May be negative: the output is then zero-extended to the requested shape.
            let total = full - target;
            let (b, e) =
                if auto_pad == "SAME_UPPER" || explicit.is_some() && auto_pad != "SAME_LOWER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                };
            pads[i] = b;
            pads[i + nsp] = e;
        }
        out_sp[i] = (full - pads[i] - pads[i + nsp]).max(0) as usize;
    }
    let xf = to_f64(x)?;
    let wf = to_f64(w)?;
    let osz: usize = out_sp.iter().product();
    let isp = &xs[2..];
    let isz: usize = isp.iter().product();
    let ksp: Vec<usize> = kernel.iter().map(|&k| k as usize).collect();
    let ksz: usize = ksp.iter().product();
    let ost = strides(&out_sp);
    let xd = xf.as_standard_layout();
    let xd = xd.as_slice().ok_or("layout")?;
    let wd = wf.as_standard_layout();
    let wd = wd.as_slice().ok_or("layout")?;
    let mut out = vec![0.0; n * m * osz];
    let cg = c / g;
    let (mut ii, mut ki) = (vec![0; nsp], vec![0; nsp]);
    for b in 0..n {
        for gi in 0..g {
            for ci in 0..cg {
                let cin = gi * cg + ci;
                for ip in 0..isz {
                    let xv = xd[(b * c + cin) * isz + ip];
                    unravel(ip, isp, &mut ii);
                    for kp in 0..ksz {
                        unravel(kp, &ksp, &mut ki);
                        let mut off = 0usize;
                        let mut inside = true;
                        for d in 0..nsp {
                            let p = ii[d] as i64 * strides_[d] + ki[d] as i64 * dil[d] - pads[d];
                            if p < 0 || p >= out_sp[d] as i64 {
                                inside = false;
                                break;
                            }
                            off += p as usize * ost[d];
                        }
                        if !inside {
                            continue;
                        }
                        for mo in 0..mg {
                            let wv = wd[((cin * mg) + mo) * ksz + kp];
                            out[(b * m + gi * mg + mo) * osz + off] += xv * wv;
                        }
                    }
                }
            }
        }
    }
    if let Some(bias) = opt(inputs, 2) {
        let bv = to_f64(bias)?;
        for b in 0..n {
            for oc in 0..m {
                for v in &mut out[(b * m + oc) * osz..][..osz] {
                    *v += bv[[oc]];
                }
            }
        }
    }
    let mut shape = vec![n, m];
    shape.extend(out_sp);
    from_f64(ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?, x.dtype())
}

/// 2-D max/average pooling in the tensor's own float type (no f64 round trip): the common
/// case of CNNs. Returns `None` when another path must handle the request.
/// One window element into a max (NaN tracked by flag) or a sum.
#[inline(always)]
fn accumulate<T: Scalar>(is_max: bool, acc: &mut T, nan: &mut bool, v: T) {
    if is_max {
        *nan |= v.is_nan();
        if v > *acc {
            *acc = v;
        }
    } else {
        *acc = acc.add(v);
    }
}

/// The larger of two values, the first on ties; NaN wins and stays (max pooling's rule).
#[inline]
fn max_nan<T: Scalar>(acc: T, v: T) -> T {
    if v > acc || (v.is_nan() && !acc.is_nan()) { v } else { acc }
}

/// The row geometry of a 2-D pooling: which output columns' windows lie inside the input.
struct PoolRows {
    gh: Geo,
    gw: Geo,
    ih: usize,
    iw: usize,
    ow: usize,
    run: std::ops::Range<usize>,
    pads_end: [isize; 2],
    include_pad: bool,
}

impl PoolRows {
    /// One output row of max (NaN propagates: once a window's maximum is NaN it stays
    /// NaN) or average pooling over `plane`.
    fn row<T: Scalar>(&self, is_max: bool, plane: &[T], oy: usize, dst: &mut [T]) {
        let (gh, gw) = (self.gh, self.gw);
        let y0 = (oy * gh.stride) as isize - gh.pad_begin as isize;
        let y_inside = y0 >= 0 && y0 as usize + (gh.kernel - 1) * gh.dilation < self.ih;
        let init = if is_max { T::from_f64(f64::NEG_INFINITY) } else { T::zero() };
        if y_inside && !self.run.is_empty() {
            let run = &mut dst[self.run.clone()];
            run.iter_mut().for_each(|v| *v = init);
            let x_first = self.run.start * gw.stride - gw.pad_begin;
            if is_max
                && (gh.kernel, gw.kernel, gw.stride, gh.dilation, gw.dilation) == (2, 2, 2, 1, 1)
            {
                // The common 2×2/2 max pool: the window's four taps in row-major order.
                // Indexed over slices cut to length, so the loop has no bounds checks and
                // vectorises (the zipped pair iterators did not).
                let len = run.len();
                let r0 = &plane[y0 as usize * self.iw + x_first..][..2 * len];
                let r1 = &plane[(y0 as usize + 1) * self.iw + x_first..][..2 * len];
                for i in 0..len {
                    let (a0, a1, b0, b1) = (r0[2 * i], r0[2 * i + 1], r1[2 * i], r1[2 * i + 1]);
                    run[i] = max_nan(max_nan(max_nan(a0, a1), b0), b1);
                }
                return self.borders(is_max, plane, y0, true, dst, init);
            }
            for ky in 0..gh.kernel {
                let row = &plane[(y0 as usize + ky * gh.dilation) * self.iw..][..self.iw];
                for kx in 0..gw.kernel {
                    let first = x_first + kx * gw.dilation;
                    let sx = gw.stride;
                    if is_max {
                        for (i, acc) in run.iter_mut().enumerate() {
                            *acc = max_nan(*acc, row[first + i * sx]);
                        }
                    } else {
                        for (i, acc) in run.iter_mut().enumerate() {
                            *acc = acc.add(row[first + i * sx]);
                        }
                    }
                }
            }
            if !is_max {
                let full = T::from_f64((gh.kernel * gw.kernel) as f64);
                run.iter_mut().for_each(|v| *v = v.div(full).unwrap_or(*v));
            }
        }
        self.borders(is_max, plane, y0, y_inside, dst, init);
    }

    /// The outputs of a row outside its inside run (all of them when the row's windows
    /// reach into the padding).
    fn borders<T: Scalar>(
        &self,
        is_max: bool,
        plane: &[T],
        y0: isize,
        y_inside: bool,
        dst: &mut [T],
        init: T,
    ) {
        if y_inside && self.run == (0..self.ow) {
            return;
        }
        for (ox, out) in dst.iter_mut().enumerate().take(self.ow) {
            if !(y_inside && self.run.contains(&ox)) {
                *out = self.border(is_max, plane, y0, ox, init);
            }
        }
    }

    /// One output whose window may reach into the padding.
    fn border<T: Scalar>(&self, is_max: bool, plane: &[T], y0: isize, ox: usize, init: T) -> T {
        let (gh, gw) = (self.gh, self.gw);
        let x0 = (ox * gw.stride) as isize - gw.pad_begin as isize;
        let mut acc = init;
        let mut nan = false;
        let (mut count, mut padded) = (0usize, 0usize);
        for ky in 0..gh.kernel {
            let iy = y0 + (ky * gh.dilation) as isize;
            let row_ok = iy >= 0 && (iy as usize) < self.ih;
            for kx in 0..gw.kernel {
                let ix = x0 + (kx * gw.dilation) as isize;
                // Positions past input + end padding (ceil mode) never count.
                if iy < self.ih as isize + self.pads_end[0]
                    && ix < self.iw as isize + self.pads_end[1]
                {
                    padded += 1;
                }
                if !row_ok || ix < 0 || ix as usize >= self.iw {
                    continue;
                }
                count += 1;
                accumulate(is_max, &mut acc, &mut nan, plane[iy as usize * self.iw + ix as usize]);
            }
        }
        if is_max {
            if nan { T::from_f64(f64::NAN) } else { acc }
        } else {
            let n = T::from_f64((if self.include_pad { padded } else { count }).max(1) as f64);
            acc.div(n).unwrap_or(acc)
        }
    }
}

fn pool_2d_native<T: Scalar>(
    op: Op,
    attrs: &Attrs,
    x: &Tensor,
    n_out: usize,
) -> KResult<Option<Vec<Tensor>>> {
    Ok(match pool_2d_into::<T>(op, attrs, x, n_out, |_| Vec::new())? {
        Some((out, shape)) => Some(vec![Tensor::from_vec(shape, out).map_err(|e| e.to_string())?]),
        None => None,
    })
}

/// 2-D max/average pooling (4-D input, one output) into the buffer `buffer(len)` gives
/// (stale contents are overwritten); `None` when the node is not of that form and the general path must run
/// it. Returns the output and its shape.
pub(crate) fn pool_2d_into<T: Scalar>(
    op: Op,
    attrs: &Attrs,
    x: &Tensor,
    n_out: usize,
    buffer: impl FnOnce(usize) -> Vec<T>,
) -> KResult<Option<(Vec<T>, Vec<usize>)>> {
    let xs = x.shape();
    let global = matches!(op, Op::GlobalAveragePool | Op::GlobalMaxPool);
    if xs.len() != 4
        || !matches!(op, Op::MaxPool | Op::AveragePool | Op::GlobalAveragePool | Op::GlobalMaxPool)
        || attrs.int("storage_order", 0) != 0
        || n_out > 1
    {
        return Ok(None);
    }
    let kernel = pool_kernel(global, xs, attrs)?;
    if kernel.len() != 2 {
        return Err(format!("kernel_shape has {} dims for 2 spatial dims", kernel.len()));
    }
    let geo = if global {
        geometry(&Attrs::new(), &xs[2..], &kernel, false)?
    } else {
        geometry(attrs, &xs[2..], &kernel, attrs.int("ceil_mode", 0) != 0)?
    };
    let (gh, gw) = (geo[0], geo[1]);
    let is_max = matches!(op, Op::MaxPool | Op::GlobalMaxPool);
    let include_pad = attrs.int("count_include_pad", 0) != 0;
    let pads_end: Vec<isize> = (0..2)
        .map(|d| {
            if global {
                0
            } else {
                attrs.ints("pads").map(|p| p[d + 2]).unwrap_or(0).max(0) as isize
            }
        })
        .collect();
    let xv = x.as_slice::<T>().ok_or("dtype")?;
    let (ih, iw) = (gh.input, gw.input);
    let (oh, ow) = (gh.out, gw.out);
    let nc = xs[0] * xs[1];
    let total = crate::util::checked_numel(&[xs[0], xs[1], oh, ow])?;
    let mut out = buffer(total);
    crate::util::resize_for_overwrite(&mut out, total);
    if out.is_empty() {
        return Ok(Some((out, vec![xs[0], xs[1], oh, ow])));
    }
    if is_max
        && (gh.kernel, gw.kernel, gh.stride, gw.stride, gh.dilation, gw.dilation)
            == (2, 2, 2, 2, 1, 1)
        && (gh.pad_begin, gw.pad_begin, pads_end[0], pads_end[1]) == (0, 0, 0, 0)
        && (ih, iw) == (2 * oh, 2 * ow)
        && let (Some(x), Some(dst)) = (crate::util::as_f32(xv), crate::util::as_f32_mut(&mut out))
    {
        crate::maxpool2::max_pool_2x2(x, ow, dst);
        return Ok(Some((out, vec![xs[0], xs[1], oh, ow])));
    }
    // Output columns whose windows lie inside the input form one run per row, taken a
    // kernel tap at a time over the whole run (no per-output bounds checks); the border
    // outputs take the general loop.
    let x_inside = |ox: usize| {
        let x0 = (ox * gw.stride) as isize - gw.pad_begin as isize;
        x0 >= 0 && x0 as usize + (gw.kernel - 1) * gw.dilation < iw
    };
    let run_lo = (0..ow).find(|&ox| x_inside(ox)).unwrap_or(ow);
    let run_hi = (run_lo..ow).find(|&ox| !x_inside(ox)).unwrap_or(ow);
    let geometry = PoolRows {
        gh,
        gw,
        ih,
        iw,
        ow,
        run: run_lo..run_hi,
        pads_end: [pads_end[0], pads_end[1]],
        include_pad,
    };
    let plane_out = |ch: usize, dst: &mut [T]| {
        let plane = &xv[ch * ih * iw..][..ih * iw];
        for (oy, row) in dst.chunks_exact_mut(ow).enumerate() {
            geometry.row(is_max, plane, oy, row);
        }
    };
    let work = out.len().saturating_mul(gh.kernel.saturating_mul(gw.kernel));
    let threads = crate::team::threads();
    if work >= PARALLEL_WORK && threads > 1 {
        // One contiguous run of planes per thread.
        let per_thread = nc.div_ceil(threads);
        crate::team::for_chunks_mut(&mut out, per_thread * oh * ow, |t, dst| {
            for (i, plane) in dst.chunks_exact_mut(oh * ow).enumerate() {
                plane_out(t * per_thread + i, plane);
            }
        });
    } else {
        out.chunks_exact_mut(oh * ow).enumerate().for_each(|(ch, dst)| plane_out(ch, dst));
    }
    Ok(Some((out, vec![xs[0], xs[1], oh, ow])))
}

pub fn pool(op: Op, attrs: &Attrs, x: &Tensor, n_out: usize) -> KResult<Vec<Tensor>> {
    let native = crate::float!(x.dtype(), T => pool_2d_native::<T>(op, attrs, x, n_out)?, None);
    if let Some(out) = native {
        return Ok(out);
    }
    let xs = x.shape().to_vec();
    if xs.len() < 3 {
        return Err("pooling needs rank ≥ 3 (N, C, spatial…)".into());
    }
    let nsp = xs.len() - 2;
    let global = matches!(op, Op::GlobalAveragePool | Op::GlobalMaxPool | Op::GlobalLpPool);
    let kernel = pool_kernel(global, &xs, attrs)?;
    if kernel.len() != nsp {
        return Err(format!("kernel_shape has {} dims for {nsp} spatial dims", kernel.len()));
    }
    let geo = if global {
        geometry(&Attrs::new(), &xs[2..], &kernel, false)?
    } else {
        geometry(attrs, &xs[2..], &kernel, attrs.int("ceil_mode", 0) != 0)?
    };
    let out_sp: Vec<usize> = geo.iter().map(|g| g.out).collect();
    let osz: usize = out_sp.iter().product();
    let isz: usize = xs[2..].iter().product();
    let ksz: usize = kernel.iter().product();
    let in_st = strides(&xs[2..]);
    let xf = to_f64(x)?;
    let xd = xf.as_standard_layout();
    let xd = xd.as_slice().ok_or("layout")?;
    let nc = xs[0] * xs[1];
    let p =
        if matches!(op, Op::LpPool | Op::GlobalLpPool) { attrs.int("p", 2) as f64 } else { 2.0 };
    let include_pad = attrs.int("count_include_pad", 0) != 0;
    let is_max = matches!(op, Op::MaxPool | Op::GlobalMaxPool);
    let mut out = vec![0.0; nc * osz];
    let mut idx = vec![0i64; nc * osz];
    let (mut oi, mut ki) = (vec![0; nsp], vec![0; nsp]);
    for ch in 0..nc {
        let plane = &xd[ch * isz..][..isz];
        for op_ in 0..osz {
            unravel(op_, &out_sp, &mut oi);
            let mut acc = if is_max { f64::NEG_INFINITY } else { 0.0 };
            let mut best = -1i64;
            let mut count = 0usize;
            let mut padded_count = 0usize;
            for kp in 0..ksz {
                unravel(kp, &kernel, &mut ki);
                let mut off = 0;
                let mut inside = true;
                let mut in_padded = true;
                for d in 0..nsp {
                    let pos = (oi[d] * geo[d].stride + ki[d] * geo[d].dilation) as isize
                        - geo[d].pad_begin as isize;
                    // Positions past input + end padding (ceil mode) never count.
                    let pads_end =
                        attrs.ints("pads").map(|p| p[d + nsp]).unwrap_or(0).max(0) as isize;
                    if pos >= geo[d].input as isize + pads_end {
                        in_padded = false;
                    }
                    match src(&geo[d], oi[d], ki[d]) {
                        Some(p) => off += p * in_st[d],
                        None => inside = false,
                    }
                }
                if in_padded {
                    padded_count += 1;
                }
                if !inside {
                    continue;
                }
                let v = plane[off];
                count += 1;
                if is_max {
                    // NaN propagates: once the maximum is NaN it stays NaN.
                    if !acc.is_nan() && (v > acc || best < 0 || v.is_nan()) {
                        acc = v;
                        best = off as i64;
                    }
                } else if matches!(op, Op::LpPool | Op::GlobalLpPool) {
                    acc += v.abs().powf(p);
                } else {
                    acc += v;
                }
            }
            out[ch * osz + op_] = match op {
                Op::MaxPool | Op::GlobalMaxPool => acc,
                Op::LpPool | Op::GlobalLpPool => acc.powf(1.0 / p),
                _ => acc / (if include_pad { padded_count } else { count }).max(1) as f64,
            };
            idx[ch * osz + op_] = if attrs.int("storage_order", 0) != 0 {
                // Column-major flat index within the plane (2-D only in practice).
                let mut pos = vec![0; nsp];
                unravel(best.max(0) as usize, &xs[2..], &mut pos);
                let mut o = 0usize;
                let mut mul = 1usize;
                for d in 0..nsp {
                    o += pos[d] * mul;
                    mul *= xs[2 + d];
                }
                (ch * isz + o) as i64
            } else {
                ch as i64 * isz as i64 + best.max(0)
            };
        }
    }
    let mut shape = vec![xs[0], xs[1]];
    shape.extend(out_sp);
    let mut res = vec![from_f64(
        ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?,
        x.dtype(),
    )?];
    if n_out > 1 {
        res.push(Tensor::from_vec(shape, idx).map_err(|e| e.to_string())?);
    }
    Ok(res)
}

/// The pooling window: the whole spatial extent for global pools, else `kernel_shape`.
fn pool_kernel(global: bool, xs: &[usize], attrs: &Attrs) -> Result<Vec<usize>, String> {
    if global {
        return Ok(xs[2..].to_vec());
    }
    Ok(attrs
        .ints("kernel_shape")
        .ok_or("attribute `kernel_shape` is required")?
        .iter()
        .map(|&k| k as usize)
        .collect())
}

/// `col2im`: columns (N, C·∏block, L) summed back into an image (N, C, image_shape) — each
/// column is one block position (row-major over the blocks that fit the padded image), each
/// row one (channel, offset in the block). Overlapping blocks add up; padding is dropped.
pub fn col2im(attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    let image = crate::util::ints(req(inputs, 1)?, "image_shape")?;
    let block = crate::util::ints(req(inputs, 2)?, "block_shape")?;
    let nsp = image.len();
    if x.rank() != 3 || block.len() != nsp || nsp == 0 {
        return Err(format!(
            "needs input (N, C·∏block, L) and image and block shapes of one length, got {:?}, {image:?}, {block:?}",
            x.shape()
        ));
    }
    if image.iter().chain(&block).any(|&d| d <= 0) {
        return Err(format!("image {image:?} and block {block:?} must be positive"));
    }
    let get = |key: &str, default: i64, len: usize| -> KResult<Vec<i64>> {
        match attrs.ints(key) {
            None => Ok(vec![default; len]),
            Some(v) if v.len() == len => Ok(v.to_vec()),
            Some(v) => Err(format!("{key} {v:?}: expected {len} values")),
        }
    };
    let (strides_, dil, pads) =
        (get("strides", 1, nsp)?, get("dilations", 1, nsp)?, get("pads", 0, 2 * nsp)?);
    if strides_.iter().chain(&dil).any(|&v| v <= 0) || pads.iter().any(|&p| p < 0) {
        return Err("strides and dilations must be positive, pads not negative".into());
    }
    // Blocks along each spatial dim of the padded image.
    let mut blocks = Vec::with_capacity(nsp);
    for j in 0..nsp {
        let span = dil[j] * (block[j] - 1) + 1;
        let padded = image[j] + pads[j] + pads[j + nsp];
        blocks.push(if padded < span { 0 } else { (padded - span) / strides_[j] + 1 });
    }
    let k: i64 = block.iter().product();
    let l: i64 = blocks.iter().product();
    let (n, rows, cols) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    if rows as i64 % k != 0 || cols as i64 != l {
        return Err(format!(
            "input {:?} does not hold {k}-element blocks at {l} positions (blocks {blocks:?})",
            x.shape()
        ));
    }
    let c = rows / k as usize;
    let xs = to_f64(x)?;
    let xs = xs.as_slice().ok_or("input is not contiguous")?;
    let mut shape = vec![n, c];
    shape.extend(image.iter().map(|&d| d as usize));
    let img = crate::util::checked_numel(&shape)? / (n * c).max(1);
    let mut out = vec![0.0f64; n * c * img];
    let unravel = |mut i: i64, dims: &[i64]| -> Vec<i64> {
        let mut idx = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            idx[d] = i % dims[d];
            i /= dims[d];
        }
        idx
    };
    for ki in 0..k {
        let off = unravel(ki, &block);
        for li in 0..l {
            let pos = unravel(li, &blocks);
            // The image element this (offset, block) reads, if it is not padding.
            let mut flat = 0i64;
            let mut inside = true;
            for j in 0..nsp {
                let at = pos[j] * strides_[j] + off[j] * dil[j] - pads[j];
                inside &= (0..image[j]).contains(&at);
                flat = flat * image[j] + at;
            }
            if !inside {
                continue;
            }
            for b in 0..n {
                for ch in 0..c {
                    let src = (b * rows + ch * k as usize + ki as usize) * cols + li as usize;
                    out[(b * c + ch) * img + flat as usize] += xs[src];
                }
            }
        }
    }
    from_f64(ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| e.to_string())?, x.dtype())
}
