//! The `cpu.blas` kernel: row-major SGEMM/DGEMM through the system OpenBLAS (CBLAS).

use std::any::TypeId;
use std::os::raw::c_int;

use crate::linalg::Mat;

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;

unsafe extern "C" {
    fn cblas_sgemm(
        order: c_int,
        ta: c_int,
        tb: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        b: *const f32,
        ldb: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
    );
    fn cblas_dgemm(
        order: c_int,
        ta: c_int,
        tb: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f64,
        a: *const f64,
        lda: c_int,
        b: *const f64,
        ldb: c_int,
        beta: f64,
        c: *mut f64,
        ldc: c_int,
    );
}

const TRANS: c_int = 112;

/// (transpose flag, leading dimension) for a strided operand CBLAS can take directly.
fn layout<T>(m: &Mat<'_, T>) -> Option<(c_int, usize)> {
    if m.cs == 1 {
        Some((NO_TRANS, m.rs))
    } else if m.rs == 1 {
        Some((TRANS, m.cs))
    } else {
        None
    }
}

/// C[m×n] = A[m×k]·B[k×n] for f32/f64 operands that are row-major or transposed views;
/// returns false (nothing written) otherwise, or for dims beyond CBLAS's 32-bit ints, so
/// the caller falls back to another kernel.
pub fn gemm<T: 'static>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    c: &mut [T],
) -> bool {
    let (Some((ta, lda)), Some((tb, ldb))) = (layout(&a), layout(&b)) else { return false };
    let fits = [m, n, k, lda, ldb].iter().all(|&d| d <= c_int::MAX as usize);
    if !fits || m == 0 || n == 0 || k == 0 || c.len() < m * n {
        return false;
    }
    // The caller (`linalg::mm`) checked that both operands cover their strided shapes.
    let (m, n, k, lda, ldb) = (m as c_int, n as c_int, k as c_int, lda as c_int, ldb as c_int);
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        // SAFETY: T is f32 (checked above); operands cover their shapes at these strides.
        unsafe {
            cblas_sgemm(
                ROW_MAJOR,
                ta,
                tb,
                m,
                n,
                k,
                1.0,
                a.data.as_ptr().cast(),
                lda,
                b.data.as_ptr().cast(),
                ldb,
                0.0,
                c.as_mut_ptr().cast(),
                n,
            )
        };
        true
    } else if TypeId::of::<T>() == TypeId::of::<f64>() {
        // SAFETY: as above, with T = f64.
        unsafe {
            cblas_dgemm(
                ROW_MAJOR,
                ta,
                tb,
                m,
                n,
                k,
                1.0,
                a.data.as_ptr().cast(),
                lda,
                b.data.as_ptr().cast(),
                ldb,
                0.0,
                c.as_mut_ptr().cast(),
                n,
            )
        };
        true
    } else {
        false
    }
}
