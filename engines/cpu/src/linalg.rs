//! Matrix products: `matmul` and `gemm` through the tuned path (kernel `cpu.blas`: OpenBLAS
//! for large products, this crate's AVX-512 register tiles for small ones and its own GEMV
//! at one row), the gemm crate (`cpu.gemm`) or a plain triple loop (`cpu.naive`), plus
//! `einsum` and `det`.

use gemm::Parallelism;
use ndarray::{ArrayD, IxDyn};
use xpu_ir::{Attrs, Tensor};

use crate::elementwise::broadcast_shape;
use crate::numeric;
use crate::reduce::{from_f64, to_f64};
use crate::scalar::Scalar;
use crate::util::{self, KResult, opt, req, strides};

#[cfg(target_arch = "x86_64")]
mod avx512;
mod gemv;

/// Which implementation a matrix product uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MatMulKernel {
    /// The tuned path (`cpu.blas`, needs the `openblas` feature): OpenBLAS SGEMM/DGEMM,
    /// with f32 products of up to `UNPACKED_PRODUCT` multiply-adds on the AVX-512 kernel and
    /// single rows on the GEMV kernel where the CPU has them.
    Blas,
    /// The gemm crate (`cpu.gemm`).
    Gemm,
    /// Triple loop (`cpu.naive`).
    Naive,
}

/// Below this many multiply-adds a product runs on one thread: splitting it costs more
/// than the second thread saves (a team job starts in ~0.2 µs; 2^18 multiply-adds take
/// ~3 µs).
const SMALL_PRODUCT: usize = 1 << 18;

/// Up to this many multiply-adds per block, an f32 product on an AVX-512 CPU runs the
/// unpacked register-tile kernel (`avx512.rs`); above it OpenBLAS's packed panels win
/// (measured: the kernel is 10–20% faster for the MLP's 64×784·784×512 and ResNet-50's
/// convolutions, even at 768³, 8% slower at 1024³, 25% at 3072³).
const UNPACKED_PRODUCT: usize = 1 << 27;

/// Column blocks of a split product are multiples of this (every kernel's register width).
const COLUMN_QUANTUM: usize = 16;

/// A strided matrix operand: element (i, j) is `data[i·rs + j·cs]`. Transposes are views.
#[derive(Copy, Clone, Debug)]
pub struct Mat<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// Row-major with leading dimension `ld`.
    pub fn rows(data: &'a [T], ld: usize) -> Self {
        Mat { data, rs: ld, cs: 1 }
    }

    /// The transpose of a row-major matrix with leading dimension `ld`.
    pub fn transposed(data: &'a [T], ld: usize) -> Self {
        Mat { data, rs: 1, cs: ld }
    }

    /// The same view typed as f32, when `T` is f32.
    fn as_f32(&self) -> Option<Mat<'a, f32>>
    where
        T: 'static,
    {
        Some(Mat { data: util::as_f32(self.data)?, rs: self.rs, cs: self.cs })
    }

    fn covers(&self, r: usize, c: usize) -> bool {
        r == 0 || c == 0 || (r - 1) * self.rs + (c - 1) * self.cs < self.data.len()
    }
}

/// C[m×n] (row-major, dense) = A[m×k] · B[k×n]. A large product is cut into column blocks
/// (row blocks when C is narrow), one per team thread, each run by the single-threaded
/// kernel: the team is the only pool, so nothing waits for another pool's threads to wake.
pub(crate) fn mm<T: Scalar>(
    kernel: MatMulKernel,
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    c: &mut [T],
) {
    assert!(
        a.covers(m, k) && b.covers(k, n) && c.len() >= m * n,
        "matrix operands do not cover their shapes"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.iter_mut().for_each(|v| *v = T::zero());
        return;
    }
    if kernel != MatMulKernel::Naive
        && m == 1
        && b.cs == 1
        && let (Some(x), Some(w), Some(y)) = (a.as_f32(), b.as_f32(), util::as_f32_mut(c))
    {
        gemv::gemv_rows(x, w, k, n, y);
        return;
    }
    let product = m.saturating_mul(n).saturating_mul(k);
    let parts = if product < SMALL_PRODUCT { 1 } else { crate::team::threads() };
    // Which kernel runs is decided on the whole product, not per block: blocks shrink with
    // the thread count, and the bits must not depend on it.
    let unpacked = product <= UNPACKED_PRODUCT;
    let c = crate::team::SendPtr::new(c);
    // Every `block` call below gets a disjoint rectangle of the m×n C, whose slice the assert
    // checked and which stays exclusively borrowed until `mm` returns; A's rows and B's
    // columns of each block lie inside the operands `covers` checked.
    if parts <= 1 {
        // SAFETY: one block, the whole C (offset 0, row stride n, m, n > 0): no other thread
        // touches it; A and B are the full operands the assert checked.
        unsafe { block(kernel, unpacked, m, n, k, a, b, c.at(0), n) };
    } else if n >= parts * 2 * COLUMN_QUANTUM {
        let per = n.div_ceil(parts).next_multiple_of(COLUMN_QUANTUM);
        crate::team::for_each(n.div_ceil(per), |i| {
            let (c0, c1) = (i * per, ((i + 1) * per).min(n));
            let b = Mat { data: &b.data[c0 * b.cs..], ..b };
            // SAFETY: task i owns columns c0..c1 of every row (c0 < n, so `at(c0)` is inside
            // C); the column ranges of different tasks are disjoint, and B sliced from column
            // c0 still covers k×(c1 - c0) because B covered k×n.
            unsafe { block(kernel, unpacked, m, c1 - c0, k, a, b, c.at(c0), n) };
        });
    } else {
        let per = m.div_ceil(parts.min(m));
        crate::team::for_each(m.div_ceil(per), |i| {
            let (r0, r1) = (i * per, ((i + 1) * per).min(m));
            let a = Mat { data: &a.data[r0 * a.rs..], ..a };
            // SAFETY: task i owns rows r0..r1 of C (r0 < m, so `at(r0 * n)` is inside C); the
            // row ranges of different tasks are disjoint, and A sliced from row r0 still
            // covers (r1 - r0)×k because A covered m×k.
            unsafe { block(kernel, unpacked, r1 - r0, n, k, a, b, c.at(r0 * n), n) };
        });
    }
}

/// One block of a product on the calling thread: C[m×n] (row stride `ldc`) = A · B;
/// `unpacked`: the whole product is small enough for the AVX-512 register-tile kernel.
///
/// # Safety
/// `c` points at an m×n block with row stride `ldc` that nothing else reads or writes
/// meanwhile; A and B cover m×k and k×n at their strides.
#[allow(clippy::too_many_arguments)]
unsafe fn block<T: Scalar>(
    kernel: MatMulKernel,
    unpacked: bool,
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    c: *mut T,
    ldc: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if kernel == MatMulKernel::Blas
        && b.cs == 1
        && unpacked
        && avx512::available()
        && let (Some(a), Some(b)) = (a.as_f32(), b.as_f32())
    {
        // SAFETY: AVX-512F is present (checked); T is f32 (the casts succeeded); operands and
        // C as this function's contract says.
        unsafe { avx512::gemm(m, n, k, a, b, c.cast(), ldc) };
        return;
    }
    #[cfg(feature = "openblas")]
    // SAFETY: forwarded from this function's contract.
    if kernel == MatMulKernel::Blas && unsafe { crate::blas::gemm(m, n, k, a, b, c, ldc) } {
        return;
    }
    let float = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
        || std::any::TypeId::of::<T>() == std::any::TypeId::of::<f64>();
    if kernel != MatMulKernel::Naive && float {
        // SAFETY: A and B cover their strided shapes and C is an exclusive m×n block with
        // row stride ldc (this function's contract); T is f32 or f64, which gemm supports;
        // dst is not read (alpha is ignored when read_dst is false).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c,
                1,
                ldc as isize,
                false,
                a.data.as_ptr(),
                a.cs as isize,
                a.rs as isize,
                b.data.as_ptr(),
                b.cs as isize,
                b.rs as isize,
                T::zero(),
                T::one(),
                false,
                false,
                false,
                Parallelism::None,
            );
        }
        return;
    }
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::zero();
            for p in 0..k {
                acc = acc.add(a.data[i * a.rs + p * a.cs].mul(b.data[p * b.rs + j * b.cs]));
            }
            // SAFETY: (i, j) lies in the block this function's contract hands it.
            unsafe { *c.add(i * ldc + j) = acc };
        }
    }
}

/// A dense layer's product into the buffer `buffer(len)` gives (stale contents are
/// overwritten): A `[…, k]` of rank ≥ 2, its leading dims taken as rows of one product, times
/// a 2-D B `[k, n]`. `None` when the operands are not of that form (the general [`matmul`]
/// handles them).
pub(crate) fn matmul_rows_into<T: Scalar>(
    kernel: MatMulKernel,
    a: &Tensor,
    b: &Tensor,
    buffer: impl FnOnce(usize) -> Vec<T>,
) -> KResult<Option<(Vec<T>, Vec<usize>)>> {
    let (sa, sb) = (a.shape(), b.shape());
    let (Some(av), Some(bv)) = (a.as_slice::<T>(), b.as_slice::<T>()) else { return Ok(None) };
    if sa.len() < 2 || sb.len() != 2 || !T::IS_FLOAT {
        return Ok(None);
    }
    let (k, n) = (sb[0], sb[1]);
    if sa[sa.len() - 1] != k {
        return Err(format!("matmul inner dims differ: {sa:?} × {sb:?}"));
    }
    let mut shape = sa.to_vec();
    *shape.last_mut().expect("rank ≥ 2") = n;
    let total = crate::util::checked_numel(&shape)?;
    let rows = total.checked_div(n).unwrap_or(0);
    let mut out = buffer(total);
    crate::util::resize_for_overwrite(&mut out, total);
    mm(kernel, rows, n, k, Mat::rows(av, k), Mat::rows(bv, n), &mut out);
    Ok(Some((out, shape)))
}

pub fn matmul(kernel: MatMulKernel, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    if a.dtype() == b.dtype() {
        let fast = crate::float!(a.dtype(), T => {
            matmul_rows_into::<T>(kernel, a, b, |_| Vec::new())?
                .map(|(out, shape)| Tensor::from_vec(shape, out).map_err(|e| e.to_string()))
        }, None);
        if let Some(t) = fast {
            return t;
        }
    }
    if a.dtype() != b.dtype() {
        return Err(format!("operand dtypes differ ({} and {})", a.dtype(), b.dtype()));
    }
    if a.rank() == 0 || b.rank() == 0 {
        return Err("matmul operands must have rank ≥ 1".into());
    }
    let (sa, sb) = (a.shape(), b.shape());
    let a2: Vec<usize> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.to_vec() };
    let b2: Vec<usize> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.to_vec() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(format!("matmul inner dims differ: {sa:?} × {sb:?}"));
    }
    let ba = &a2[..a2.len() - 2];
    let bb = &b2[..b2.len() - 2];
    let batch = broadcast_shape(ba, bb)?;
    let nb: usize = batch.iter().product();
    let mut out_shape = batch.clone();
    if sa.len() > 1 {
        out_shape.push(m);
    }
    if sb.len() > 1 {
        out_shape.push(n);
    }
    // Element offset of a batch operand's matrix; broadcast (size-1) dims do not move.
    let (sta, stb) = (strides(ba), strides(bb));
    let offset = |shape: &[usize], st: &[usize], idx: &[usize], mat: usize| -> usize {
        let pad = idx.len() - shape.len();
        shape
            .iter()
            .enumerate()
            .map(|(i, &d)| if d == 1 { 0 } else { idx[pad + i] * st[i] })
            .sum::<usize>()
            * mat
    };
    numeric!(a.dtype(), T => {
        let (av, bv) = (a.as_slice::<T>().unwrap(), b.as_slice::<T>().unwrap());
        let total = nb * m * n;
        let bst = strides(&batch);
        let direct = kernel != MatMulKernel::Naive && T::IS_FLOAT && k > 0;
        // The GEMM kernel writes every output element without reading it: skip zero-filling
        // (a measurable share of a large product) by writing into uninitialised memory.
        let mut out = crate::util::alloc_uninit::<T>(total);
        if !direct {
            out.iter_mut().for_each(|v| *v = std::mem::MaybeUninit::new(T::zero()));
        }
        for bi in 0..nb {
            let idx: Vec<usize> = bst.iter().zip(&batch).map(|(&s, &d)| (bi / s) % d.max(1)).collect();
            let oa = offset(ba, &sta, &idx, m * k);
            let ob = offset(bb, &stb, &idx, k * n);
            let dst = &mut out[bi * m * n..(bi + 1) * m * n];
            // SAFETY: MaybeUninit<T> has T's layout; `mm` only writes `dst` on the direct path
            // (read_dst = false) and the other paths run over initialised zeros.
            let dst = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut T, dst.len()) };
            mm(kernel, m, n, k, Mat::rows(&av[oa..oa + m * k], k), Mat::rows(&bv[ob..ob + k * n], n), dst);
        }
        // SAFETY: every element was written above (GEMM over m×n per batch, or zero-filled).
        let out: Vec<T> = unsafe {
            let mut out = std::mem::ManuallyDrop::new(out);
            Vec::from_raw_parts(out.as_mut_ptr() as *mut T, out.len(), out.capacity())
        };
        Tensor::from_vec(out_shape, out).map_err(|e| e.to_string())
    }, Err(format!("matmul does not support dtype {}", a.dtype())))
}

pub fn gemm_op(kernel: MatMulKernel, attrs: &Attrs, inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let a = req(inputs, 0)?;
    numeric!(a.dtype(), T => {
        let (out, shape) = gemm_into::<T>(kernel, attrs, inputs, |_| Vec::new())?;
        Tensor::from_vec(shape, out).map_err(|e| e.to_string())
    }, Err(format!("gemm does not support dtype {}", a.dtype())))
}

/// ONNX Gemm (`alpha·op(A)·op(B) + beta·C`) into the buffer `buffer(len)` gives (stale
/// contents are overwritten). Returns the output and its shape `[m, n]`.
pub(crate) fn gemm_into<T: Scalar>(
    kernel: MatMulKernel,
    attrs: &Attrs,
    inputs: &[Option<&Tensor>],
    buffer: impl FnOnce(usize) -> Vec<T>,
) -> KResult<(Vec<T>, Vec<usize>)> {
    let (a, b) = (req(inputs, 0)?, req(inputs, 1)?);
    if a.rank() != 2 || b.rank() != 2 {
        return Err("gemm operands must be 2-D".into());
    }
    if a.dtype() != b.dtype() {
        return Err(format!("operand dtypes differ ({} and {})", a.dtype(), b.dtype()));
    }
    let (ta, tb) = (attrs.int("transA", 0) != 0, attrs.int("transB", 0) != 0);
    let (m, k) = if ta { (a.shape()[1], a.shape()[0]) } else { (a.shape()[0], a.shape()[1]) };
    let (k2, n) = if tb { (b.shape()[1], b.shape()[0]) } else { (b.shape()[0], b.shape()[1]) };
    if k != k2 {
        return Err(format!(
            "gemm inner dims differ: A {:?} (transA {ta}) × B {:?} (transB {tb})",
            a.shape(),
            b.shape()
        ));
    }
    let (alpha, beta) = (attrs.float("alpha", 1.0), attrs.float("beta", 1.0));
    // C broadcasts unidirectionally to [m, n]: view it as [cm, cn] with cm ∈ {1, m}, cn ∈ {1, n}.
    let c = opt(inputs, 2);
    let (cm, cn) = match c.map(|c| c.shape().to_vec()) {
        None => (0, 0),
        Some(s) if s.is_empty() => (1, 1),
        Some(s) if s.len() == 1 => (1, s[0]),
        Some(s) if s.len() == 2 => (s[0], s[1]),
        Some(s) => return Err(format!("C of shape {s:?} must have rank ≤ 2")),
    };
    if c.is_some() && !((cm == 1 || cm == m) && (cn == 1 || cn == n)) {
        return Err(format!(
            "C of shape {:?} does not broadcast to [{m}, {n}]",
            c.map(|c| c.shape().to_vec()).unwrap_or_default()
        ));
    }
    let type_error = || format!("gemm does not support dtype {}", a.dtype());
    let (av, bv) =
        (a.as_slice::<T>().ok_or_else(type_error)?, b.as_slice::<T>().ok_or_else(type_error)?);
    // Transposes are strides, never copies.
    let am = if ta { Mat::transposed(av, m) } else { Mat::rows(av, k) };
    let bm = if tb { Mat::transposed(bv, k) } else { Mat::rows(bv, n) };
    crate::util::checked_numel(&[m, n])?;
    let mut out = buffer(m * n);
    crate::util::resize_for_overwrite(&mut out, m * n);
    mm(kernel, m, n, k, am, bm, &mut out);
    let (alpha, beta) = (T::from_f64(alpha), T::from_f64(beta));
    if alpha.to_f64() != 1.0 {
        out.iter_mut().for_each(|v| *v = v.mul(alpha));
    }
    if let Some(c) = c {
        let cv = c.as_slice::<T>().ok_or("C dtype differs from A")?;
        for (i, row) in out.chunks_exact_mut(n.max(1)).enumerate().take(m) {
            let crow = &cv[if cm == 1 { 0 } else { i } * cn..];
            for (j, v) in row.iter_mut().enumerate() {
                *v = v.add(crow[if cn == 1 { 0 } else { j }].mul(beta));
            }
        }
    }
    Ok((out, vec![m, n]))
}

pub fn einsum(attrs: &Attrs, inputs: &[&Tensor]) -> KResult<Tensor> {
    let eq: String = attrs.str("equation", "").chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != inputs.len() {
        return Err(format!("equation has {} operands, got {} inputs", terms.len(), inputs.len()));
    }
    // Expand `...` into fresh upper-case letters per operand rank.
    let ell_rank = terms
        .iter()
        .zip(inputs)
        .map(|(t, x)| if t.contains("...") { x.rank() + 3 - t.len() } else { 0 })
        .max()
        .unwrap_or(0);
    let ell: String = (0..ell_rank).map(|i| (b'A' + i as u8) as char).collect();
    // Replaces `...` with the last `n` ellipsis letters.
    let expand = |t: &str, n: usize| -> String {
        match t.find("...") {
            Some(pos) => format!("{}{}{}", &t[..pos], &ell[ell_rank - n..], &t[pos + 3..]),
            None => t.to_string(),
        }
    };
    let terms: Vec<Vec<char>> = terms
        .iter()
        .zip(inputs)
        .map(|(t, x)| {
            expand(t, if t.contains("...") { (x.rank() + 3).saturating_sub(t.len()) } else { 0 })
                .chars()
                .collect()
        })
        .collect();
    let mut sizes: std::collections::BTreeMap<char, usize> = Default::default();
    for (t, x) in terms.iter().zip(inputs) {
        if t.len() != x.rank() {
            return Err(format!(
                "term {:?} does not match an operand of rank {}",
                t.iter().collect::<String>(),
                x.rank()
            ));
        }
        for (&c, &d) in t.iter().zip(x.shape()) {
            let e = sizes.entry(c).or_insert(d);
            if *e != d && d != 1 {
                if *e == 1 {
                    *e = d;
                } else {
                    return Err(format!("letter {c} has sizes {e} and {d}"));
                }
            }
        }
    }
    let out: Vec<char> = match rhs {
        Some(r) => expand(&r, ell_rank).chars().collect(),
        None => {
            let mut counts: std::collections::BTreeMap<char, usize> = Default::default();
            for t in &terms {
                for &c in t {
                    *counts.entry(c).or_default() += 1;
                }
            }
            ell.chars()
                .chain(
                    counts.iter().filter(|(c, n)| **n == 1 && !ell.contains(**c)).map(|(c, _)| *c),
                )
                .collect()
        }
    };
    let letters: Vec<char> =
        out.iter().copied().chain(sizes.keys().copied().filter(|c| !out.contains(c))).collect();
    let dims: Vec<usize> = letters.iter().map(|c| sizes[c]).collect();
    let dtype = inputs[0].dtype();
    let data: Vec<ArrayD<f64>> = inputs.iter().map(|t| to_f64(t)).collect::<KResult<_>>()?;
    let out_shape: Vec<usize> = out.iter().map(|c| sizes[c]).collect();
    let out_n: usize = out_shape.iter().product();
    let mut result = vec![0.0; out_n];
    let total: usize = dims.iter().product();
    let pos: Vec<Vec<usize>> = terms
        .iter()
        .map(|t| t.iter().map(|c| letters.iter().position(|l| l == c).unwrap()).collect())
        .collect();
    let out_st = strides(&out_shape);
    let mut idx = vec![0usize; letters.len()];
    for _ in 0..total {
        let mut prod = 1.0;
        for (k, a) in data.iter().enumerate() {
            let i: Vec<usize> = pos[k]
                .iter()
                .zip(a.shape())
                .map(|(&p, &d)| if d == 1 { 0 } else { idx[p] })
                .collect();
            prod *= a[IxDyn(&i)];
        }
        let o: usize = (0..out.len()).map(|p| idx[p] * out_st[p]).sum();
        result[o] += prod;
        for p in (0..idx.len()).rev() {
            idx[p] += 1;
            if idx[p] < dims[p] {
                break;
            }
            idx[p] = 0;
        }
    }
    from_f64(ArrayD::from_shape_vec(IxDyn(&out_shape), result).map_err(|e| e.to_string())?, dtype)
}

pub fn det(x: &Tensor) -> KResult<Tensor> {
    let r = x.rank();
    if r < 2 || x.shape()[r - 1] != x.shape()[r - 2] {
        return Err(format!("det needs square trailing matrices, got shape {:?}", x.shape()));
    }
    let n = x.shape()[r - 1];
    let a = to_f64(x)?;
    let flat = a.as_standard_layout();
    let data = flat.as_slice().ok_or("layout")?;
    let out: Vec<f64> = data
        .chunks(n * n)
        .map(|m| {
            let mut m = m.to_vec();
            let mut det = 1.0;
            for col in 0..n {
                let piv = (col..n)
                    .max_by(|&i, &j| m[i * n + col].abs().total_cmp(&m[j * n + col].abs()))
                    .unwrap();
                if m[piv * n + col] == 0.0 {
                    return 0.0;
                }
                if piv != col {
                    for k in 0..n {
                        m.swap(piv * n + k, col * n + k);
                    }
                    det = -det;
                }
                det *= m[col * n + col];
                for row in col + 1..n {
                    let f = m[row * n + col] / m[col * n + col];
                    for k in col..n {
                        m[row * n + k] -= f * m[col * n + k];
                    }
                }
            }
            det
        })
        .collect();
    from_f64(
        ArrayD::from_shape_vec(IxDyn(&x.shape()[..r - 2]), out).map_err(|e| e.to_string())?,
        x.dtype(),
    )
}
