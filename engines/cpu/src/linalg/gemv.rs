//! f32 vector × matrix, `y[n] = x[k] · W[k×n]`, for a W whose rows are contiguous — a dense
//! layer at batch 1. The gemm crate's m = 1 path reads W column by column; this one streams
//! W's rows once (four at a time, so `y` is loaded and stored a quarter as often), which is
//! what a memory-bound product wants. A large W is cut into bands of whole rows, each one
//! contiguous stretch of memory streamed into its own partial `y`, and the team's threads
//! each take one contiguous run of bands (not a band at a time, claimed by whichever thread
//! comes first), so a core streams the same weights from its own cache call after call:
//! MLP batch 1 38 → 30 µs on a Xeon. The partials are then added in band order. (Cutting
//! by columns instead left each task a 1 KiB piece of every 2 KiB row: 33% slower on the
//! MLP's 784×512 layer.) The bands depend
//! on the shape alone, and each is summed over its rows in order, so the result does not
//! depend on the thread count or on the vector width (the same bits on every machine).

use std::cell::RefCell;

use super::Mat;

/// Weights per band: 128 KiB, a few µs of streaming, well above a team job's ~0.2 µs start.
const BAND_WEIGHTS: usize = 1 << 15;

/// Rows per band are a multiple of the unroll, so a band's sum is grouped as the whole
/// product's would be.
const ROW_QUANTUM: usize = 4;

thread_local! {
    /// The partial sums of bands after the first: grow-only, reused by every product.
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Rows per band for a k×n weight matrix (all `k` when it is one band).
fn band_rows(k: usize, n: usize) -> usize {
    let bands = (k.saturating_mul(n) / BAND_WEIGHTS).clamp(1, k.div_ceil(ROW_QUANTUM));
    k.div_ceil(bands).next_multiple_of(ROW_QUANTUM)
}

pub(super) fn gemv_rows(x: Mat<'_, f32>, w: Mat<'_, f32>, k: usize, n: usize, y: &mut [f32]) {
    let y = &mut y[..n];
    let rows = band_rows(k, n);
    if rows >= k {
        columns(x, w, k, y);
        return;
    }
    let bands = k.div_ceil(rows);
    let band = |b: usize, dst: &mut [f32]| {
        let (p0, p1) = (b * rows, ((b + 1) * rows).min(k));
        let x = Mat { data: &x.data[p0 * x.cs..], ..x };
        let w = Mat { data: &w.data[p0 * w.rs..], ..w };
        columns(x, w, p1 - p0, dst);
    };
    PARTIALS.with_borrow_mut(|partials| {
        partials.resize(partials.len().max((bands - 1) * n), 0.0);
        let partials = &mut partials[..(bands - 1) * n];
        let (first, rest) = (crate::team::SendPtr::new(y), crate::team::SendPtr::new(partials));
        let runs = crate::team::threads().clamp(1, bands);
        crate::team::for_each(runs, |t| {
            for b in t * bands / runs..(t + 1) * bands / runs {
                // SAFETY: band 0 writes `y`, band b > 0 the b−1-th n-long piece of
                // `partials`: disjoint, and both stay exclusively borrowed until `for_each`
                // returns.
                let dst = unsafe {
                    let base = if b == 0 { first.at(0) } else { rest.at((b - 1) * n) };
                    std::slice::from_raw_parts_mut(base, n)
                };
                band(b, dst);
            }
        });
        for part in partials.chunks_exact(n) {
            y.iter_mut().zip(part).for_each(|(acc, v)| *acc += v);
        }
    });
}

/// `y = x[..k] · W[..k, .. y.len()]` summed over `k` in order, on the widest vector unit
/// this CPU has.
fn columns(x: Mat<'_, f32>, w: Mat<'_, f32>, k: usize, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked just above); bounds as below.
        unsafe { columns_avx512(x, w, k, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above); the function only reads `x` and `w`
        // inside the bounds `mm` checked (`covers`) and writes `y`.
        unsafe { columns_avx2(x, w, k, y) };
        return;
    }
    columns_portable(x, w, k, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn columns_avx2(x: Mat<'_, f32>, w: Mat<'_, f32>, k: usize, y: &mut [f32]) {
    // The same loop, compiled with AVX2 vectors (no FMA: a fused multiply-add would round
    // differently from the portable path).
    columns_portable(x, w, k, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn columns_avx512(x: Mat<'_, f32>, w: Mat<'_, f32>, k: usize, y: &mut [f32]) {
    // Twice the lanes per instruction, the same per-element arithmetic (no FMA either).
    columns_portable(x, w, k, y);
}

#[inline(always)]
fn columns_portable(x: Mat<'_, f32>, w: Mat<'_, f32>, k: usize, y: &mut [f32]) {
    let len = y.len();
    let row = |p: usize| &w.data[p * w.rs..p * w.rs + len];
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

    /// Each band's plain sum in `k` order, the bands' sums added in order: what every path
    /// must equal bit for bit.
    fn reference(x: &[f32], w: &[f32], k: usize, n: usize) -> Vec<f32> {
        let rows = band_rows(k, n);
        (0..n)
            .map(|j| {
                let band = |p0: usize| {
                    let mut acc = 0.0f32;
                    for p in p0..(p0 + rows).min(k) {
                        acc += x[p] * w[p * n + j];
                    }
                    acc
                };
                let mut total = band(0);
                for p0 in (rows..k).step_by(rows) {
                    total += band(p0);
                }
                total
            })
            .collect()
    }

    #[test]
    fn bands_are_whole_row_groups_and_one_below_the_threshold() {
        assert_eq!(band_rows(100, 100), 100, "10 Ki weights are one band");
        assert_eq!(band_rows(784, 512), 68, "12 bands of 68 rows");
        assert!(
            (1..3000)
                .all(|k| band_rows(k, 999).is_multiple_of(ROW_QUANTUM) || band_rows(k, 999) >= k)
        );
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
