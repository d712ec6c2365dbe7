//! The CNN workhorse pool, 2×2 windows at stride 2 without padding over even-sized f32
//! planes, as one pass over row pairs. The general pooling loop pays a call, a border check
//! and a scalar tail per output row — most of its time on the 7- and 14-wide rows of a
//! small conv net. Here every output row is one or two AVX-512 steps: the two input rows
//! loaded under a mask, their element-wise maximum, the even and odd columns split by a
//! permute and reduced, the outputs stored under a mask. NaN wins (ONNX's rule), as in the
//! general loop. Without AVX-512 the portable loop does the same pairwise reduction.

/// At or above this many outputs the rows are split across the team (a job starts in
/// ~0.2 µs; 4 Ki outputs take ~1 µs on one core).
const PARALLEL_OUTPUTS: usize = 1 << 12;

/// Max-pools `x`, rows of `2·ow` values taken in pairs, into `out` (`ow` values per pair,
/// so `x` holds four inputs per output).
pub(crate) fn max_pool_2x2(x: &[f32], ow: usize, out: &mut [f32]) {
    assert!(
        ow > 0 && x.len() == 4 * out.len() && out.len().is_multiple_of(ow),
        "2×2 pool geometry"
    );
    let rows = out.len() / ow;
    let threads = crate::team::threads();
    if out.len() < PARALLEL_OUTPUTS || threads < 2 || rows < 2 {
        rows_of(x, ow, out);
        return;
    }
    let per = rows.div_ceil(threads) * ow;
    crate::team::for_chunks_mut(out, per, |t, dst| {
        let first_row = t * per / ow;
        rows_of(&x[first_row * 4 * ow..][..4 * dst.len()], ow, dst)
    });
}

/// The output rows `out` holds, from the input row pairs `x` holds, on the widest vector
/// unit this CPU has.
fn rows_of(x: &[f32], ow: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked just above); `max_pool_2x2` checked that `x`
        // holds four inputs per output, which is all the kernel reads.
        unsafe { rows_avx512(x, ow, out) };
        return;
    }
    rows_portable(x, ow, out);
}

/// The larger of two values; NaN wins.
#[inline(always)]
fn max_nan(a: f32, b: f32) -> f32 {
    if a > b || a.is_nan() { a } else { b }
}

fn rows_portable(x: &[f32], ow: usize, out: &mut [f32]) {
    let iw = 2 * ow;
    for (pair, dst) in x.chunks_exact(2 * iw).zip(out.chunks_exact_mut(ow)) {
        let (top, bottom) = pair.split_at(iw);
        for (i, o) in dst.iter_mut().enumerate() {
            let left = max_nan(top[2 * i], bottom[2 * i]);
            let right = max_nan(top[2 * i + 1], bottom[2 * i + 1]);
            *o = max_nan(left, right);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows_avx512(x: &[f32], ow: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    // NaN wins: `max_ps` answers its second operand when either is NaN, so a NaN in `a` is
    // put back by a blend on `a`'s own unordered mask.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn max_nan(a: __m512, b: __m512) -> __m512 {
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a), _mm512_max_ps(a, b), a)
    }
    let mask = |n: usize| -> __mmask16 { if n >= 16 { 0xffff } else { (1u16 << n) - 1 } };
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let iw = 2 * ow;
    for (pair, dst) in x.chunks_exact(2 * iw).zip(out.chunks_exact_mut(ow)) {
        let (top, bottom) = pair.split_at(iw);
        // 32 input columns (16 outputs) per step; the last step is masked.
        for step in (0..iw).step_by(32) {
            let n = (iw - step).min(32);
            let (lo, hi) = (mask(n), mask(n.saturating_sub(16)));
            // SAFETY: the masks admit only columns `step .. step + n`, inside `top` and
            // `bottom` (`n ≤ iw − step`); masked-off lanes are not read.
            let (t0, t1, b0, b1) = unsafe {
                (
                    _mm512_maskz_loadu_ps(lo, top.as_ptr().add(step)),
                    _mm512_maskz_loadu_ps(hi, top.as_ptr().add(step + 16)),
                    _mm512_maskz_loadu_ps(lo, bottom.as_ptr().add(step)),
                    _mm512_maskz_loadu_ps(hi, bottom.as_ptr().add(step + 16)),
                )
            };
            let (v0, v1) = (max_nan(t0, b0), max_nan(t1, b1));
            let pooled =
                max_nan(_mm512_permutex2var_ps(v0, even, v1), _mm512_permutex2var_ps(v0, odd, v1));
            // SAFETY: `n / 2` outputs from `step / 2`, inside `dst` (`ow = iw / 2`).
            unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr().add(step / 2), mask(n / 2), pooled) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs with NaNs, ties, signed zeros and infinities sprinkled in.
    fn input(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match s % 23 {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => -0.0,
                    3 => 0.0,
                    _ => (s % 1000) as f32 / 100.0 - 5.0,
                }
            })
            .collect()
    }

    /// Window by window, from the definition.
    fn reference(x: &[f32], ow: usize, rows: usize) -> Vec<f32> {
        let iw = 2 * ow;
        let mut out = Vec::new();
        for r in 0..rows {
            for i in 0..ow {
                let taps = [0, 1, iw, iw + 1].map(|d| x[2 * r * iw + 2 * i + d]);
                out.push(if taps.iter().any(|v| v.is_nan()) {
                    f32::NAN
                } else {
                    taps.into_iter().fold(f32::NEG_INFINITY, f32::max)
                });
            }
        }
        out
    }

    fn same(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(p, q)| p == q || (p.is_nan() && q.is_nan()))
    }

    #[test]
    fn every_width_matches_the_definition_on_every_path() {
        for ow in [1, 2, 7, 8, 15, 16, 17, 31, 33, 50] {
            for rows in [1, 3, 300] {
                let x = input(4 * ow * rows, (ow * 1000 + rows) as u64);
                let want = reference(&x, ow, rows);
                let mut out = vec![1.5; ow * rows];
                max_pool_2x2(&x, ow, &mut out);
                assert!(same(&out, &want), "dispatching path, ow {ow} rows {rows}");
                let mut portable = vec![1.5; ow * rows];
                rows_portable(&x, ow, &mut portable);
                assert!(same(&portable, &want), "portable path, ow {ow} rows {rows}");
            }
        }
    }
}
