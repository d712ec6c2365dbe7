//! f32 products on AVX-512 without packing: a 12×32 register tile (24 accumulators, the
//! most that leave room for B's two vectors and A's broadcast) reads A by broadcasts at any
//! strides and B's rows in place. OpenBLAS copies both operands into panels on every call;
//! for the products CNN and MLP layers make — a few dozen rows (the batch, or a conv's
//! output channels), B a weight matrix or an im2col buffer already in cache — that copy
//! costs as much as the arithmetic (a 16×9·9×784 conv GEMM spent more time packing than
//! multiplying). Blocking: `KC` steps of B's panel (32 KiB) stay in L1 while every row
//! block passes over it; `MC` rows of A (≤ 144 KiB) stay in L2 while every column panel
//! does. Column tails are masked, so nothing past an operand is read or written.

use std::arch::x86_64::*;

use super::Mat;

/// Rows per register tile.
const MR: usize = 12;
/// Columns per register tile: two 16-lane vectors.
const NR: usize = 32;
/// Steps of `k` per pass: a 256×32 panel of B is 32 KiB, L1-resident.
const KC: usize = 256;
/// Rows of A per pass over the column panels: 144 rows × 256 steps × 4 bytes in L2.
const MC: usize = 12 * MR;

/// Whether this CPU runs the kernel.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// C[m×n] (row stride `ldc`) = A[m×k] · B[k×n], B's rows contiguous (`b.cs == 1`).
///
/// # Safety
/// The CPU has AVX-512F ([`available`]); A and B cover m×k and k×n at their strides; `c`
/// points at an m×n block with row stride `ldc` that nothing else reads or writes meanwhile.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_, f32>,
    b: Mat<'_, f32>,
    c: *mut f32,
    ldc: usize,
) {
    debug_assert!(b.cs == 1 && a.covers(m, k) && b.covers(k, n));
    for p0 in (0..k).step_by(KC) {
        let kc = KC.min(k - p0);
        for i1 in (0..m).step_by(MC) {
            let mc = MC.min(m - i1);
            for j0 in (0..n).step_by(NR) {
                let nr = NR.min(n - j0);
                // Near-equal row tiles (16 rows as 8 + 8, not 12 + 4): a short tile has too
                // few accumulators to hide the FMA latency.
                let tiles = mc.div_ceil(MR);
                let mut i0 = i1;
                for t in 0..tiles {
                    let mr = (mc - (i0 - i1)).div_ceil(tiles - t);
                    let tile = Tile {
                        a: a.data[i0 * a.rs + p0 * a.cs..].as_ptr(),
                        a_rs: a.rs,
                        a_cs: a.cs,
                        b: b.data[p0 * b.rs + j0..].as_ptr(),
                        b_rs: b.rs,
                        // SAFETY: (i0, j0) lies inside the m×n block `c` points at.
                        c: unsafe { c.add(i0 * ldc + j0) },
                        ldc,
                        kc,
                        nr,
                        accumulate: p0 > 0,
                    };
                    // SAFETY: the tile's rows, columns and steps lie inside A, B and C (the
                    // loops stay below m, n and k), and the CPU has AVX-512F (contract).
                    unsafe { tile.run(mr) };
                    i0 += mr;
                }
            }
        }
    }
}

/// One register tile's operands: `mr` (≤ MR) rows from `a`, `nr` (≤ NR) columns from `b`,
/// `kc` steps, into `c` (added to it when `accumulate`, a later pass over `k`).
struct Tile {
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    b_rs: usize,
    c: *mut f32,
    ldc: usize,
    kc: usize,
    nr: usize,
    accumulate: bool,
}

/// `tile.rows::<V, R>()` for the runtime row count `mr` (1..=MR).
macro_rules! rows_for {
    ($tile:expr, $v:literal, $mr:expr) => {
        match $mr {
            12 => $tile.rows::<$v, 12>(),
            11 => $tile.rows::<$v, 11>(),
            10 => $tile.rows::<$v, 10>(),
            9 => $tile.rows::<$v, 9>(),
            8 => $tile.rows::<$v, 8>(),
            7 => $tile.rows::<$v, 7>(),
            6 => $tile.rows::<$v, 6>(),
            5 => $tile.rows::<$v, 5>(),
            4 => $tile.rows::<$v, 4>(),
            3 => $tile.rows::<$v, 3>(),
            2 => $tile.rows::<$v, 2>(),
            1 => $tile.rows::<$v, 1>(),
            _ => unreachable!("a tile has 1..={MR} rows"),
        }
    };
}

impl Tile {
    /// # Safety
    /// As [`Tile::rows`], with `mr ≤ MR`.
    #[target_feature(enable = "avx512f")]
    unsafe fn run(&self, mr: usize) {
        // SAFETY: (both arms) forwarded; the row count is `mr`. A tile of at most 16 columns
        // takes one vector per row, so a narrow column tail does not pay for an empty second.
        unsafe { if self.nr <= 16 { rows_for!(self, 1, mr) } else { rows_for!(self, 2, mr) } }
    }

    /// `V` (1 or 2) vectors of 16 columns per row.
    ///
    /// # Safety
    /// A covers `R` rows × `kc` steps from `a`, B `kc` rows × `nr` columns from `b`, C `R`
    /// rows × `nr` columns from `c`, and the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn rows<const V: usize, const R: usize>(&self) {
        let lanes = |n: usize| -> __mmask16 { if n >= 16 { 0xffff } else { (1u16 << n) - 1 } };
        let (m0, m1) = (lanes(self.nr), lanes(self.nr.saturating_sub(16)));
        let masks = [m0, m1];
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for p in 0..self.kc {
            // SAFETY: step `p` of B's rows, its `nr` columns admitted by the masks (masked-off
            // lanes are not read); A's element (i, p) for i < R (this function's contract).
            unsafe {
                let row = self.b.add(p * self.b_rs);
                let mut b = [_mm512_setzero_ps(); V];
                for (v, b) in b.iter_mut().enumerate() {
                    *b = _mm512_maskz_loadu_ps(masks[v], row.add(16 * v));
                }
                let col = self.a.add(p * self.a_cs);
                for (i, acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*col.add(i * self.a_rs));
                    for v in 0..V {
                        acc[v] = _mm512_fmadd_ps(x, b[v], acc[v]);
                    }
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (v, &sum) in acc.iter().enumerate() {
                // SAFETY: row i < R of C, its `nr` columns admitted by the masks.
                unsafe {
                    let out = self.c.add(i * self.ldc + 16 * v);
                    let sum = if self.accumulate {
                        _mm512_add_ps(sum, _mm512_maskz_loadu_ps(masks[v], out))
                    } else {
                        sum
                    };
                    _mm512_mask_storeu_ps(out, masks[v], sum);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * 7919 + seed * 104729) % 2003) as f32 / 1001.0 - 1.0).collect()
    }

    /// Every blocking edge (rows around MR and MC, columns around 16 and NR, steps around
    /// KC) and transposed A, against the f64 triple loop.
    #[test]
    fn every_edge_matches_the_triple_loop() {
        if !available() {
            return; // The dispatcher never calls the kernel on this CPU.
        }
        for (m, n, k) in
            [(1, 1, 1), (5, 17, 3), (12, 32, 256), (13, 33, 257), (145, 70, 600), (64, 512, 9)]
        {
            for transposed in [false, true] {
                let av = data(m * k, m + n);
                let bv = data(k * n + 3, k);
                let a = if transposed { Mat::transposed(&av, m) } else { Mat::rows(&av, k) };
                let b = Mat { data: &bv[3..], rs: n, cs: 1 };
                let ldc = n + 5;
                let mut c = vec![f32::NAN; m * ldc];
                // SAFETY: AVX-512F is present (checked); the operands cover their shapes.
                unsafe { gemm(m, n, k, a, b, c.as_mut_ptr(), ldc) };
                for i in 0..m {
                    for j in 0..ldc {
                        let got = c[i * ldc + j];
                        if j >= n {
                            assert!(got.is_nan(), "wrote past the block at ({i}, {j})");
                            continue;
                        }
                        let want: f64 = (0..k)
                            .map(|p| {
                                a.data[i * a.rs + p * a.cs] as f64 * b.data[p * b.rs + j] as f64
                            })
                            .sum();
                        assert!(
                            (got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{m}×{n}×{k} ({i}, {j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
