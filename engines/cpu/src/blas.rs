//! The `cpu.blas` kernel: row-major SGEMM/DGEMM through the system OpenBLAS (CBLAS).

use std::any::TypeId;
use std::os::raw::c_int;

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

/// C[m×n] = A[m×k]·B[k×n] for f32/f64; returns false (nothing written) for other types or
/// dims beyond CBLAS's 32-bit ints, so the caller falls back to another kernel.
pub fn gemm<T: 'static>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &mut [T],
) -> bool {
    let fits = [m, n, k, lda, ldb].iter().all(|&d| d <= c_int::MAX as usize);
    if !fits || m == 0 || n == 0 || k == 0 {
        return false;
    }
    assert!(
        a.len() >= (m - 1) * lda + k && b.len() >= (k - 1) * ldb + n && c.len() >= m * n,
        "gemm operands too short"
    );
    let (m, n, k, lda, ldb) = (m as c_int, n as c_int, k as c_int, lda as c_int, ldb as c_int);
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        // SAFETY: T is f32 (checked above); the asserted lengths cover the row-major m×k,
        // k×n and m×n operands at the given leading dimensions.
        unsafe {
            cblas_sgemm(
                ROW_MAJOR,
                NO_TRANS,
                NO_TRANS,
                m,
                n,
                k,
                1.0,
                a.as_ptr().cast(),
                lda,
                b.as_ptr().cast(),
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
                NO_TRANS,
                NO_TRANS,
                m,
                n,
                k,
                1.0,
                a.as_ptr().cast(),
                lda,
                b.as_ptr().cast(),
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
