//! LIR-ML's f32 transcendental functions, defined by these exact operation sequences:
//! Cephes-style range reduction and polynomials, branch-free (special cases chosen at the
//! end), with fused multiply-adds exactly where written (`mul_add`: one rounding, the same
//! on every IEEE machine, and half the dependent steps of a Horner polynomial). Code
//! generators emit the same sequence (the llvm engine's `codegen::math`, as `llvm.fma`), so
//! compiled kernels and the interpreter agree bit for bit and a kernel's results do not
//! depend on the machine's vector width or libm. Accuracy is
//! within a few ulp of the correctly rounded result (tested below against f64 libm).
//! f64 functions are libm's.

/// The constants, shared with code generators so both sides use the same values. The
/// polynomial coefficients are Cephes' (and Abramowitz & Stegun's) as published, except
/// `EXP_P` and `SOFTPLUS_G`, fitted for these sequences (their docs say how).
#[allow(clippy::excessive_precision, clippy::approx_constant)]
pub mod k {
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const LN2_HI: f32 = 0.693_359_4_f32;
    pub const LN2_LO: f32 = -2.121_944_4e-4_f32;
    /// e^r = 1 + r + r²·P(r) on |r| ≤ ln 2 / 2: P of degree 4 fitted here (minimax of the
    /// relative error, Lawson's iteration on Chebyshev nodes; 3.1e-9 before rounding the
    /// coefficients to f32, a fortieth of an ulp). Cephes' degree 5 is one step more than
    /// f32 needs.
    pub const EXP_P: [f32; 5] =
        [1.381_453_9e-3, 8.368_745_4e-3, 4.166_838_9e-2, 1.666_652_1e-1, 4.999_999_4e-1];
    pub const EXP_MAX: f32 = 89.0;
    /// 1.5·2^23 + 254: added to x·log2 e it rounds to the nearest integer n (ties to even)
    /// and leaves n + 254, the two halves of 2^n's biased exponents summed, in the low
    /// mantissa bits (|n| ≤ 150 here, far below 2^22).
    pub const EXP_SHIFTER: f32 = 12_583_166.0;
    /// The same with one bias (n + 127), for a single scale factor.
    pub const EXP_SHIFTER_1: f32 = 12_583_039.0;
    /// The same with the bias less one (n + 126): the scale factor 2^(n−1).
    pub const EXP_SHIFTER_HALF: f32 = 12_583_038.0;
    /// Below x = −this, eˣ < 2^-43 and 1 + eˣ is 1; 2^(n−1) is normal there.
    pub const EXPP1_LOW: f32 = 30.0;
    pub const EXP_MIN: f32 = -104.0;
    pub const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
    pub const LOG_P: [f32; 9] = [
        7.037_683_6e-2,
        -1.151_461e-1,
        1.167_699_9e-1,
        -1.242_014_1e-1,
        1.424_932_3e-1,
        -1.666_805_8e-1,
        2.000_071_4e-1,
        -2.499_999_4e-1,
        3.333_333e-1,
    ];
    /// Below u = −2|x| = −this, tanh |x| is 1 to f32 precision (e^u < 2^-28) and 2^n stays
    /// normal.
    pub const TANH_CUT: f32 = 20.0;
    pub const ERF_T: [f32; 7] = [
        7.853_861_4e-5,
        -8.010_193_6e-4,
        5.188_327_7e-3,
        -2.685_381_2e-2,
        1.128_358_5e-1,
        -3.761_262_6e-1,
        1.128_379_2,
    ];
    pub const ERF_P: f32 = 0.327_591_1;
    /// softplus keeps its log1p term while the shifted sum of its e^−|x| (`EXP_SHIFTER_1`
    /// added) is at least this: n ≥ −125, so 2^n and e^−|x| are normal (|x| up to about
    /// 86.98; above, softplus is max(x, 0) to f32 precision). A NaN compares false.
    pub const SOFTPLUS_KEEP_TS: f32 = EXP_SHIFTER_1 - 125.0;
    /// log1p(t) = t + t²·G(t) on t in [0, 1]: G of degree 7 fitted here (minimax of the
    /// error relative to log1p(t), Lawson's iteration on Chebyshev nodes), within 2 ulp of
    /// softplus evaluated as `softplusf` does it (degree 6 gives 5).
    pub const SOFTPLUS_G: [f32; 8] = [
        5.364_818_5e-3,
        -3.006_576_9e-2,
        7.920_45e-2,
        -1.375_379_9e-1,
        1.915_365_3e-1,
        -2.485_716_3e-1,
        3.332_132_4e-1,
        -4.999_964_8e-1,
    ];
    pub const ERF_A: [f32; 5] = [1.061_405_4, -1.453_152, 1.421_413_7, -0.284_496_74, 0.254_829_6];
}

/// Horner's rule, highest coefficient first: `((c0·x + c1)·x + c2)…`, each step one fused
/// multiply-add.
fn horner(x: f32, c: &[f32]) -> f32 {
    let mut p = c[0];
    for &ci in &c[1..] {
        p = p.mul_add(x, ci);
    }
    p
}

/// e^(x − n·ln 2) − 1 for n = round(x·log2 e): r = x − n·ln 2 in two parts (ln 2 split so
/// n·LN2_HI is exact), then r + r²·P(r). The caller adds 1 and scales by 2^n.
fn expm1_reduced(x: f32, n: f32) -> f32 {
    // n times −ln 2 rather than −n times ln 2: the same products, and a NaN n keeps its
    // sign (e^NaN is the input's NaN, as numpy gives it, not its negation).
    let r = n.mul_add(-k::LN2_LO, n.mul_add(-k::LN2_HI, x));
    horner(r, &k::EXP_P).mul_add(r * r, r)
}

/// e^t·2^b + c with one scale factor: n = round(t·log2 e) from adding `shifter` (whose
/// bias sets b: 0 with `EXP_SHIFTER_1`, −1 with `EXP_SHIFTER_HALF`), 2^(n+b) read from the
/// sum's bits, and (y + 1)·2^(n+b) + c as one fused step with y = e^r − 1. For t the caller
/// holds where 2^(n+b) is normal; c = −0.0 adds nothing, exactly, whatever the sign.
fn exp_one_factor(t: f32, shifter: f32, c: f32) -> f32 {
    exp_one_factor_at(t, shifted(t, shifter), shifter, c)
}

/// t·log2 e + `shifter`: the sum whose low bits hold n plus the shifter's bias.
fn shifted(t: f32, shifter: f32) -> f32 {
    t.mul_add(k::LOG2E, shifter)
}

/// [`exp_one_factor`] given its shifted sum `ts` ([`shifted`]), for a caller that tests it.
fn exp_one_factor_at(t: f32, ts: f32, shifter: f32, c: f32) -> f32 {
    let s = f32::from_bits(ts.to_bits() << 23);
    expm1_reduced(t, ts - shifter).mul_add(s, s + c)
}

/// e^x. n = round(x·log2 e) comes from adding a shifter (no float-to-int conversion: a NaN
/// flows through as a NaN, with nothing undefined on the way), and 2^n is applied as two
/// factors read from the shifted sum's bits so that subnormal results round once:
/// s1 = 2^⌊n/2⌋, s2 = 2^(n − ⌊n/2⌋).
pub fn expf(x: f32) -> f32 {
    let x1 = if x > k::EXP_MAX { k::EXP_MAX } else { x };
    let x2 = if x1 < k::EXP_MIN { k::EXP_MIN } else { x1 };
    let t = x2.mul_add(k::LOG2E, k::EXP_SHIFTER);
    let n = t - k::EXP_SHIFTER;
    let (b1, b2) = exp_scale_bits(t.to_bits());
    let s1 = f32::from_bits(b1);
    // (y + 1)·s1 as one fused step: s1 is in [2^-75, 2^64], so (y + 1)·s1 is normal and
    // rounding it once is rounding y + 1 and scaling exactly — the same bits, one step less.
    expm1_reduced(x2, n).mul_add(s1, s1) * f32::from_bits(b2)
}

/// The two scale factors' bits from the shifted sum's bits `m` (low bits n + 254): the
/// first exponent field is (n + 254) >> 1, the second the rest of n + 254.
fn exp_scale_bits(m: u32) -> (u32, u32) {
    let b1 = (m << 22) & 0x7f80_0000;
    (b1, (m << 23).wrapping_sub(b1))
}

/// 1 + eˣ: x held in [−EXPP1_LOW, EXP_MAX] (below, eˣ is under 2^-43 and the sum 1; above,
/// it overflows as e^89 does), e^x = (y + 1)·2^(n−1)·2 with one normal scale factor
/// 2^(n−1) (n ≤ 128 at the top, so the halving keeps it normal), and the doubling and the
/// + 1 as one fused step. A NaN passes the clamps (both comparisons are false).
pub fn expp1f(x: f32) -> f32 {
    let x1 = if x > k::EXP_MAX { k::EXP_MAX } else { x };
    let x2 = if x1 < -k::EXPP1_LOW { -k::EXPP1_LOW } else { x1 };
    exp_one_factor(x2, k::EXP_SHIFTER_HALF, -0.0).mul_add(2.0, 1.0)
}

pub fn logf(x: f32) -> f32 {
    let sub = x < f32::MIN_POSITIVE;
    let xn = if sub { x * 8_388_608.0 } else { x };
    let adj = if sub { -23 } else { 0 };
    let bits = xn.to_bits();
    let e1 = ((bits >> 23) & 255) as i32 - 126 + adj;
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let lo = m < k::SQRT_HALF;
    let e = if lo { e1 - 1 } else { e1 };
    let f = if lo { m + m } else { m } - 1.0;
    let z = f * f;
    let y0 = horner(f, &k::LOG_P) * f * z;
    let fe = e as f32;
    let y1 = fe.mul_add(k::LN2_LO, y0);
    let y2 = z.mul_add(-0.5, y1);
    let r = fe.mul_add(k::LN2_HI, f + y2);
    let r1 = if x == f32::INFINITY { x } else { r };
    let r2 = if x == 0.0 { f32::NEG_INFINITY } else { r1 };
    let r3 = if x < 0.0 { f32::NAN } else { r2 };
    if x.is_nan() { x } else { r3 }
}

/// tanh |x| = −(e^u − 1)/(e^u + 1) with u = −2|x|, and x's sign. e^u − 1 is
/// (y + 1)·2^n − 1 = y·2^n + (2^n − 1) in one fused step, y = e^r − 1 from
/// [`expm1_reduced`]: near 0, n = 0 and it is y itself, so small |x| keeps its relative
/// accuracy with no polynomial of its own and no select; u is held above −`TANH_CUT`, where
/// tanh is 1 to f32 precision and 2^n one normal scale factor. A NaN passes the clamp (the
/// comparison is false) and comes out a NaN.
pub fn tanhf(x: f32) -> f32 {
    let u0 = -2.0 * x.abs();
    let u = if u0 < -k::TANH_CUT { -k::TANH_CUT } else { u0 };
    let em1 = exp_one_factor(u, k::EXP_SHIFTER_1, -1.0);
    (-em1 / (em1 + 2.0)).copysign(x)
}

pub fn erff(x: f32) -> f32 {
    let ax = x.abs();
    let z = x * x;
    let ys = horner(z, &k::ERF_T) * x;
    let t = 1.0 / ax.mul_add(k::ERF_P, 1.0);
    let a = horner(t, &k::ERF_A) * t;
    let e = expf(-z);
    let r = (-a).mul_add(e, 1.0);
    let rl = r.copysign(x);
    if ax < 1.0 { ys } else { rl }
}

pub fn log1pf(x: f32) -> f32 {
    let u = x + 1.0;
    let d = u - 1.0;
    let r = logf(u) * (x / d);
    let r1 = if d == 0.0 { x } else { r };
    if x == f32::INFINITY { x } else { r1 }
}

pub fn expm1f(x: f32) -> f32 {
    let u = expf(x);
    let um1 = u - 1.0;
    let r = um1 * (x / logf(u));
    let r1 = if u == 1.0 { x } else { r };
    let r2 = if um1 == -1.0 { -1.0 } else { r1 };
    if x > 88.0 { um1 } else { r2 }
}

/// ln(1 + eˣ) = max(x, 0) + log1p(e^−|x|). e^−|x| is expf's sequence without its clamps
/// and special cases, on one scale factor 2^n, and log1p(e) for e in (0, 1] is e + e²·G(e),
/// one polynomial on [0, 1] (`k::SOFTPLUS_G`) — no exponent to take apart, no branch, no
/// cancellation, and half logf's work. Where 2^n would not be normal (n < −125, |x| above
/// about 86.98) or x is NaN, the log1p term is dropped: the test reads the exponential's
/// own shifted sum, so no clamp comes first and what those lanes computed is never used.
/// NaN propagates through the `x < 0` test (false for NaN).
pub fn softplusf(x: f32) -> f32 {
    let nax = -x.abs();
    let ts = shifted(nax, k::EXP_SHIFTER_1);
    let keep = ts >= k::SOFTPLUS_KEEP_TS;
    // (y + 1)·2^n as one fused step: 2^n is normal and e too, so the product is exact
    // either way and the separate + 1 is saved.
    let e = exp_one_factor_at(nax, ts, k::EXP_SHIFTER_1, -0.0);
    let l = (horner(e, &k::SOFTPLUS_G) * e).mul_add(e, e);
    let m = if x < 0.0 { 0.0 } else { x };
    m + if keep { l } else { 0.0 }
}

/// f64 softplus: the same formula on libm's exp and log1p (what the code generators call).
pub fn softplus(x: f64) -> f64 {
    let l = (-x.abs()).exp().ln_1p();
    let m = if x < 0.0 { 0.0 } else { x };
    m + l
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in representable f32s between `got` and the correctly rounded `want`.
    fn ulps(got: f32, want: f64) -> u64 {
        let w = want as f32;
        if got.is_nan() || w.is_nan() {
            return if got.is_nan() == w.is_nan() { 0 } else { u64::MAX };
        }
        if got == w {
            return 0;
        }
        let key = |f: f32| {
            let b = f.to_bits() as i64;
            if b < 0x8000_0000 { b } else { 0x8000_0000 - b }
        };
        (key(got) - key(w)).unsigned_abs()
    }

    fn sweep(lo: f32, hi: f32, n: usize) -> impl Iterator<Item = f32> {
        (0..=n).map(move |i| lo + (hi - lo) * (i as f32 / n as f32))
    }

    #[allow(clippy::type_complexity)]
    fn check(
        name: &str,
        f: fn(f32) -> f32,
        want: fn(f64) -> f64,
        xs: impl Iterator<Item = f32>,
        max: u64,
    ) {
        let mut worst = (0, 0.0f32);
        for x in xs {
            let u = ulps(f(x), want(x as f64));
            if u > worst.0 {
                worst = (u, x);
            }
        }
        assert!(
            worst.0 <= max,
            "{name}: {} ulp at x = {:e} (got {}, want {})",
            worst.0,
            worst.1,
            f(worst.1),
            want(worst.1 as f64)
        );
    }

    #[test]
    fn functions_stay_within_a_few_ulp_of_libm() {
        check("exp", expf, f64::exp, sweep(-103.0, 88.7, 200_000), 2);
        check("exp (subnormal results)", expf, f64::exp, sweep(-103.97, -87.0, 100_000), 1);
        check("exp (near 0)", expf, f64::exp, sweep(-1e-3, 1e-3, 20_000), 1);
        check("exp (overflow edge)", expf, f64::exp, sweep(88.0, 88.75, 20_000), 2);
        check("log", logf, f64::ln, sweep(1e-30, 1e4, 200_000), 2);
        check("log (small)", logf, f64::ln, sweep(1e-44, 1e-37, 10_000), 2);
        check("log (near 1)", logf, f64::ln, sweep(0.5, 2.0, 200_000), 2);
        check("tanh", tanhf, f64::tanh, sweep(-12.0, 12.0, 200_000), 4);
        let expp1 = |x: f64| x.exp() + 1.0;
        check("expp1", expp1f, expp1, sweep(-40.0, 88.7, 200_000), 2);
        check("expp1 (near 0)", expp1f, expp1, sweep(-3.0, 3.0, 200_000), 1);
        check("expp1 (overflow edge)", expp1f, expp1, sweep(88.0, 88.75, 20_000), 2);
        check("tanh (near 0)", tanhf, f64::tanh, sweep(-0.7, 0.7, 200_000), 4);
        check("tanh (tiny)", tanhf, f64::tanh, sweep(-1e-5, 1e-5, 20_000), 2);
        check("erf", erff, libm::erf, sweep(-6.0, 6.0, 200_000), 6);
        check("log1p", log1pf, f64::ln_1p, sweep(-0.999, 50.0, 200_000), 4);
        check("expm1", expm1f, f64::exp_m1, sweep(-20.0, 20.0, 200_000), 4);
        check("expm1 (small)", expm1f, f64::exp_m1, sweep(-1e-3, 1e-3, 20_000), 4);
        check("softplus", softplusf, softplus, sweep(-86.0, 90.0, 200_000), 2);
        check("softplus (near 0)", softplusf, softplus, sweep(-2.0, 2.0, 200_000), 2);
        // x < 0: the result is log1p(e^x) alone, so its relative error is the polynomial's.
        check("softplus (negative)", softplusf, softplus, sweep(-30.0, 0.0, 200_000), 2);
        check("softplus (tiny results)", softplusf, softplus, sweep(-86.9, -15.0, 100_000), 2);
    }

    #[test]
    fn special_values_follow_ieee_and_numpy() {
        let inf = f32::INFINITY;
        assert_eq!(expf(inf), inf);
        assert_eq!(expf(-inf), 0.0);
        assert_eq!(expf(89.0), inf);
        assert!(expf(f32::NAN).is_nan());
        assert!(expf(-100.0) > 0.0, "subnormal results are kept");
        assert_eq!(expf(-104.0), 0.0, "below half the least subnormal");
        assert_eq!(expf(88.72), (88.72f32 as f64).exp() as f32, "the largest finite results");
        assert_eq!(expf(88.73), inf);
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(-0.0), 1.0);
        // A NaN flows through the shifter as a NaN, whatever its sign or payload, and
        // keeps its sign.
        for bits in [0x7fc0_0000u32, 0xffc0_0000, 0x7f80_0001, 0x7fff_ffff, 0xffc0_1234] {
            let e = expf(f32::from_bits(bits));
            assert!(e.is_nan(), "{bits:#x}");
            assert_eq!(e.is_sign_negative(), bits >> 31 == 1, "{bits:#x} -> {:#x}", e.to_bits());
        }
        assert_eq!(logf(0.0), -inf);
        assert_eq!(logf(inf), inf);
        assert!(logf(-1.0).is_nan());
        assert!(logf(f32::NAN).is_nan());
        assert_eq!(expp1f(inf), inf);
        assert_eq!(expp1f(89.0), inf);
        assert_eq!(expp1f(88.72), ((88.72f32 as f64).exp() + 1.0) as f32);
        assert_eq!(expp1f(-inf), 1.0);
        assert_eq!(expp1f(-31.0), 1.0);
        assert_eq!(expp1f(0.0), 2.0);
        assert_eq!(expp1f(-0.0), 2.0);
        assert_eq!(tanhf(inf), 1.0);
        assert_eq!(tanhf(-inf), -1.0);
        assert_eq!(tanhf(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(erff(inf), 1.0);
        assert_eq!(erff(-inf), -1.0);
        assert_eq!(log1pf(-1.0), -inf);
        assert_eq!(log1pf(inf), inf);
        assert_eq!(expm1f(-inf), -1.0);
        assert_eq!(expm1f(inf), inf);
        assert_eq!(softplusf(inf), inf);
        assert_eq!(softplusf(-inf), 0.0);
        assert_eq!(softplusf(100.0), 100.0);
        assert_eq!(softplusf(-100.0), 0.0, "below e^-87 the log1p term is dropped");
        // Around the cut (n = −125 ↔ |x| ≈ 86.98): below it the term is kept and normal,
        // above it softplus is max(x, 0); far beyond, what the dropped lanes computed
        // (garbage exponent bits) never shows.
        let kept = softplusf(-86.9);
        assert!(
            kept.is_normal() && (kept as f64 / f64::from(-86.9f32).exp() - 1.0).abs() < 3e-7,
            "{kept}"
        );
        for x in [87.0f32, 88.0, 88.7, 1e30, f32::MAX] {
            assert_eq!(softplusf(x), x);
            assert_eq!(softplusf(-x), 0.0);
        }
        assert_eq!(softplusf(0.0), std::f32::consts::LN_2);
        for f in [expf, logf, tanhf, erff, log1pf, expm1f, softplusf, expp1f] {
            assert!(f(f32::NAN).is_nan());
        }
    }
}
