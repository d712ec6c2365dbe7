//! Helpers the cpu engine's test files share.

/// `n` pseudo-random values in [-1, 1], the same for the same seed (xorshift).
pub fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}
