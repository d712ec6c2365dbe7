//! f32 vector × matrix, `y[n] = x[k] · W[k×n]`, for a W whose rows are contiguous — a dense
//! layer at batch 1. The gemm crate's m = 1 path reads W column by column; this one streams
//! W's rows once (four at a time, so `y` is loaded and stored a quarter as often), which is
//! what a memory-bound product wants. Wide W is split by columns across the pool's threads:
//! each output element is still summed over `k` in order, so the result does not depend on
//! the thread count or on the vector width (the same bits on every machine).

use super::Mat;

/// Below this many weights one thread streams them before a second could help (a team
/// job starts in ~0.2 µs; 32 Ki weights take ~2 µs to stream).
const PARALLEL_WEIGHTS: usize = 1 << 15;

/// Output columns per task: a multiple of every vector width, so chunks stay aligned.
const COLUMN_QUANTUM: usize = 64;

pub(super) fn gemv_rows(x: Mat<'_, f32>, w: Mat<'_, f32>, k: usize, n: usize, y: &mut [f32]) {
    let y = &mut y[..n];
    let threads = crate::team::threads();
    if k * n < PARALLEL_WEIGHTS || threads < 2 || n < 2 * COLUMN_QUANTUM {
        columns(x, w, k, 0, y);
        return;
    }
    let per = n.div_ceil(threads).next_multiple_of(COLUMN_QUANTUM);
    crate::team::for_chunks_mut(y, per, |i, chunk| columns(x, w, k, i * per, chunk));
}

/// `y = x · W[:, j0 .. j0 + y.len()]`, on the widest vector unit this CPU has.
fn columns(x: Mat<'_, f32>, w: Mat<'_, f32>, k: usize, j0: usize, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above); the function only reads `x` and `w`
        // inside the bounds `mm` checked (`covers`) and writes `y`.
        unsafe { columns_avx2(x, w, k, j0, y) };
        return;
    }
    columns_portable(x, w, k, j0, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn columns_avx2(x: Mat<'_, f32>, w: Mat<'_, f32>, k: usize, j0: usize, y: &mut [f32]) {
    // The same loop, compiled with AVX2 vectors (no FMA: a fused multiply-add would round
    // differently from the portable path).
    columns_portable(x, w, k, j0, y);
}

#[inline(always)]
fn columns_portable(x: Mat<'_, f32>, w: Mat<'_, f32>, k: usize, j0: usize, y: &mut [f32]) {
    let len = y.len();
    let row = |p: usize| &w.data[p * w.rs + j0..p * w.rs + j0 + len];
    let xv = |p: usize| x.data[p * x.cs];
    y.fill(0.0);
    let mut p = 0;
    while p + 4 <= k {
        let (x0, x1, x2, x3) = (xv(p), xv(p + 1), xv(p + 2), xv(p + 3));
        let (r0, r1, r2, r3) = (row(p), row(p + 1), row(p + 2), row(p + 3));
        // Every operand re-sliced to `len`, so the loop has no bounds checks and vectorises.
        let (r0, r1, r2, r3, y) = (&r0[..len], &r1[..len], &r2[..len], &r3[..len], &mut y[..len]);
        for j in 0..len {
            // Left to right, as four single-row passes would add them.
            y[j] = y[j] + x0 * r0[j] + x1 * r1[j] + x2 * r2[j] + x3 * r3[j];
        }
        p += 4;
    }
    while p < k {
        let (xp, r, y) = (xv(p), &row(p)[..len], &mut y[..len]);
        for j in 0..len {
            y[j] += xp * r[j];
        }
        p += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain sum in `k` order: what every path must equal bit for bit.
    fn reference(x: &[f32], w: &[f32], k: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|j| {
                let mut acc = 0.0f32;
                for p in 0..k {
                    acc += x[p] * w[p * n + j];
                }
                acc
            })
            .collect()
    }

    #[test]
    fn every_path_sums_in_order_whatever_the_threads() {
        // Sizes around the unroll (k % 4), the quantum and the parallel threshold.
        for &(k, n) in &[(1, 1), (3, 5), (7, 130), (784, 512), (1029, 257), (300, 1000)] {
            let x: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.37).collect();
            let w: Vec<f32> = (0..k * n).map(|i| ((i * 11 % 17) as f32 - 8.0) * 0.013).collect();
            let want = reference(&x, &w, k, n);
            for threads in [1, 2, 3] {
                let team = std::sync::Arc::new(crate::team::Team::new(threads).unwrap());
                let mut y = vec![f32::NAN; n];
                crate::team::with_team(&team, || {
                    gemv_rows(Mat::rows(&x, k), Mat::rows(&w, n), k, n, &mut y)
                });
                assert_eq!(y, want, "k {k}, n {n}, {threads} threads");
            }
        }
    }

    #[test]
    fn non_finite_values_propagate() {
        let x = [0.0, 1.0];
        let w = [f32::INFINITY, 1.0, 2.0, 3.0];
        let mut y = [0.0; 2];
        gemv_rows(Mat::rows(&x, 2), Mat::rows(&w, 2), 2, 2, &mut y);
        assert!(y[0].is_nan(), "0 × inf is NaN, as the gemm path gives");
        assert_eq!(y[1], 3.0);
    }
}
