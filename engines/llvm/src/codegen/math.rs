//! Transcendental functions. f32 ones are inline IR (Cephes-style range reduction and
//! polynomials, branch-free with selects for the special cases), so a loop calling them
//! vectorises and gives the same bits at every vector width; they stay within a few ulp of
//! libm (tested against it). f64 ones call libm (or the LLVM intrinsic that lowers to it).
//!
//! Every routine is an `internal alwaysinline` function, emitted only when used.

use std::collections::BTreeSet;
use std::fmt::Write;

use xpu_lir::{ScalarType, UnaryOp};

/// The function to call for `op` on `ty`, noting inline routines in `used`; `None` for an
/// op that is not a transcendental function.
pub fn function(op: UnaryOp, ty: ScalarType, used: &mut BTreeSet<&'static str>) -> Option<String> {
    use UnaryOp::*;
    if ty == ScalarType::F64 {
        return match op {
            Exp => "@llvm.exp.f64",
            Log => "@llvm.log.f64",
            Sin => "@llvm.sin.f64",
            Cos => "@llvm.cos.f64",
            Tanh => "@tanh",
            Erf => "@erf",
            Log1p => "@log1p",
            Expm1 => "@expm1",
            Expp1 => {
                used.insert("xpu.expp1");
                "@xpu.expp1"
            }
            Softplus => {
                used.insert("xpu.softplus");
                "@xpu.softplus"
            }
            _ => return None,
        }
        .to_string()
        .into();
    }
    let name: &'static str = match op {
        Exp => "xpu.expf",
        Log => "xpu.logf",
        Tanh => "xpu.tanhf",
        Erf => "xpu.erff",
        Log1p => "xpu.log1pf",
        Expm1 => "xpu.expm1f",
        Expp1 => "xpu.expp1f",
        Softplus => "xpu.softplusf",
        Sin => return Some("@llvm.sin.f32".into()),
        Cos => return Some("@llvm.cos.f32".into()),
        _ => return None,
    };
    use_with_callees(name, used);
    Some(format!("@{name}"))
}

/// The f32 `exp` of a value known to be at most `EXP_MAX` or NaN: `exp` without its upper
/// clamp (the same bits).
pub fn expf_at_most_max(used: &mut BTreeSet<&'static str>) -> String {
    use_with_callees("xpu.expf_at_most_max", used);
    "@xpu.expf_at_most_max".into()
}

/// Notes routine `name` and every routine it calls, transitively.
fn use_with_callees(name: &'static str, used: &mut BTreeSet<&'static str>) {
    if !used.insert(name) {
        return;
    }
    let callees: &[&'static str] = match name {
        "xpu.erff" => &["xpu.expf"],
        "xpu.expf" => &["xpu.expf_at_most_max"],
        "xpu.expf_at_most_max" | "xpu.exp_one_factor_at" => &["xpu.expm1_reduced"],
        "xpu.softplusf" => &["xpu.exp_one_factor_at"],
        "xpu.tanhf" | "xpu.expp1f" => &["xpu.exp_one_factor"],
        "xpu.exp_one_factor" => &["xpu.exp_one_factor_at"],
        "xpu.log1pf" => &["xpu.logf"],
        "xpu.expm1f" => &["xpu.expf", "xpu.logf"],
        _ => &[],
    };
    for &c in callees {
        use_with_callees(c, used);
    }
}

/// The definitions of the inline routines in `used`, then a declaration for every
/// intrinsic and libm function `ir` calls.
pub fn definitions(used: &BTreeSet<&'static str>) -> String {
    let mut s = String::new();
    for name in used {
        s.push_str(&expand_constants(&expand_horner(match *name {
            "xpu.expf" => EXPF,
            "xpu.expf_at_most_max" => EXPF_AT_MOST_MAX,
            "xpu.expm1_reduced" => EXPM1_REDUCED,
            "xpu.exp_one_factor" => EXP_ONE_FACTOR,
            "xpu.exp_one_factor_at" => EXP_ONE_FACTOR_AT,
            "xpu.logf" => LOGF,
            "xpu.tanhf" => TANHF,
            "xpu.erff" => ERFF,
            "xpu.log1pf" => LOG1PF,
            "xpu.expm1f" => EXPM1F,
            "xpu.softplusf" => SOFTPLUSF,
            "xpu.softplus" => SOFTPLUS,
            "xpu.expp1f" => EXPP1F,
            "xpu.expp1" => EXPP1,
            _ => "",
        })));
    }
    s
}

/// The routines write a polynomial as `%y = horner float %x, NAME`: Horner's rule over the
/// coefficients of table `NAME`, highest first, one fused multiply-add per step (as
/// `xpu_lir::math::horner` computes it), the steps named `%y.1`, `%y.2`, ….
fn expand_horner(template: &str) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    for line in template.lines() {
        let parsed = line.trim().split_once(" = horner float ").and_then(|(dst, rest)| {
            let (x, name) = rest.split_once(", ")?;
            Some((dst, x, name, table(name)?.len()))
        });
        let Some((dst, x, name, n)) = parsed.filter(|p| p.3 >= 2) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let mut acc = format!("f({name}.0)");
        for i in 1..n {
            let step = if i + 1 == n { dst.to_string() } else { format!("{dst}.{i}") };
            let _ = writeln!(
                out,
                "  {step} = call float @llvm.fma.f32(float {acc}, float {x}, float f({name}.{i}))"
            );
            acc = step;
        }
    }
    out
}

/// A constant the routines name: one of LIR-ML's (`xpu_lir::math::k`, so compiled code
/// and the interpreter use the same values), negated with a leading `-`, or a decimal.
fn constant(name: &str) -> Option<f64> {
    if let Some(named) =
        name.strip_prefix('-').filter(|n| n.starts_with(|c: char| c.is_ascii_uppercase()))
    {
        return constant(named).map(|v| -v);
    }
    let (base, index) = match name.split_once('.') {
        Some((b, i)) if b.chars().all(|c| c.is_ascii_uppercase() || c == '_') => {
            (b, i.parse().ok())
        }
        _ => (name, None),
    };
    let Some(table) = table(base) else { return name.parse::<f64>().ok() };
    table.get(index.unwrap_or(0)).map(|&v| v as f64)
}

/// The values of a named constant of the routines (a polynomial's coefficients, highest
/// first), `None` for a name that is not one.
fn table(base: &str) -> Option<&'static [f32]> {
    use xpu_lir::math::k;
    Some(match base {
        "LOG2E" => &[k::LOG2E],
        "SOFTPLUS_KEEP_TS" => &[k::SOFTPLUS_KEEP_TS],
        "TANH_CUT" => &[k::TANH_CUT],
        "EXPP1_LOW" => &[k::EXPP1_LOW],
        "EXP_MAX" => &[k::EXP_MAX],
        "EXP_SHIFTER_HALF" => &[k::EXP_SHIFTER_HALF],
        "LN2_HI" => &[k::LN2_HI],
        "LN2_LO" => &[k::LN2_LO],
        "MIN_POSITIVE" => &[f32::MIN_POSITIVE],
        "SQRT_HALF" => &[k::SQRT_HALF],
        "ERF_P" => &[k::ERF_P],
        "EXP_P" => &k::EXP_P,
        "EXP_SHIFTER" => &[k::EXP_SHIFTER],
        "EXP_SHIFTER_1" => &[k::EXP_SHIFTER_1],
        "LOG_P" => &k::LOG_P,
        "SOFTPLUS_G" => &k::SOFTPLUS_G,
        "ERF_T" => &k::ERF_T,
        "ERF_A" => &k::ERF_A,
        _ => return None,
    })
}

/// The routines are written with `f(NAME)` or `f(<decimal>)` for constants, which LLVM
/// wants in hex unless exact in decimal; each is rounded to f32 here.
fn expand_constants(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find("f(") {
        let (before, after) = rest.split_at(at);
        let Some(close) = after.find(')') else { break };
        let literal = &after[2..close];
        match constant(literal) {
            Some(v) => {
                out.push_str(before);
                out.push_str(&super::float_lit(ScalarType::F32, v));
                rest = &after[close + 1..];
            }
            None => {
                out.push_str(&rest[..at + 2]);
                rest = &after[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `declare` lines for every `@llvm.*` intrinsic and libm function called in `ir` (the
/// parser needs them; their types come from the call sites).
pub fn declarations(ir: &str) -> String {
    let mut seen = BTreeSet::new();
    let mut s = String::new();
    for line in ir.lines() {
        let Some(at) = line.find("call ") else { continue };
        let call = &line[at + 5..];
        let Some((ret, rest)) = call.split_once(" @") else { continue };
        let Some((name, args)) = rest.split_once('(') else { continue };
        let external = name.starts_with("llvm.") || LIBM.contains(&name);
        if !external || !seen.insert(name.to_string()) {
            continue;
        }
        let args = args.strip_suffix(')').unwrap_or(args);
        let types: Vec<&str> =
            args.split(", ").filter_map(|a| a.split_whitespace().next()).collect();
        let _ = writeln!(s, "declare {ret} @{name}({}) nounwind", types.join(", "));
    }
    s
}

const LIBM: &[&str] = &["tanh", "erf", "log1p", "expm1"];

/// ln(1 + e^x) as `xpu_lir::math::softplusf` computes it: e^-|x| without expf's clamps (one
/// scale factor, from a shifter with one bias), log1p of it as e + e²·G(e) where that scale
/// factor is normal (else 0), max(x, 0) added.
const SOFTPLUSF: &str = r#"
define internal float @xpu.softplusf(float %x) alwaysinline nounwind {
entry:
  %ax = call float @llvm.fabs.f32(float %x)
  %nax = fneg float %ax
  ; The exponential's own shifted sum, tested: a compare LLVM cannot turn back into one
  ; on |x|, and no clamp before it.
  %ts = call float @llvm.fma.f32(float %nax, float f(LOG2E), float f(EXP_SHIFTER_1))
  %keep = fcmp oge float %ts, f(SOFTPLUS_KEEP_TS)
  %e = call float @xpu.exp_one_factor_at(float %nax, float %ts, float f(EXP_SHIFTER_1), float -0.0)
  %g = horner float %e, SOFTPLUS_G
  %q = fmul float %g, %e
  %l = call float @llvm.fma.f32(float %q, float %e, float %e)
  %neg = fcmp olt float %x, 0.0
  %m = select i1 %neg, float 0.0, float %x
  %lc = select i1 %keep, float %l, float 0.0
  %res = fadd float %m, %lc
  ret float %res
}
"#;

/// e^t·2^b + c as `xpu_lir::math::exp_one_factor`: the shifter's bias sets b, 2^(n+b) comes
/// from the shifted sum's bits, then (y + 1)·2^(n+b) + c in one FMA.
const EXP_ONE_FACTOR: &str = r#"
define internal float @xpu.exp_one_factor(float %t, float %shifter, float %c) alwaysinline nounwind {
entry:
  %ts = call float @llvm.fma.f32(float %t, float f(LOG2E), float %shifter)
  %e = call float @xpu.exp_one_factor_at(float %t, float %ts, float %shifter, float %c)
  ret float %e
}
"#;

/// [`EXP_ONE_FACTOR`] given its shifted sum (for softplus, which tests it).
const EXP_ONE_FACTOR_AT: &str = r#"
define internal float @xpu.exp_one_factor_at(float %t, float %ts, float %shifter, float %c) alwaysinline nounwind {
entry:
  %n = fsub float %ts, %shifter
  %y = call float @xpu.expm1_reduced(float %t, float %n)
  %tb = bitcast float %ts to i32
  %sb = shl i32 %tb, 23
  %s = bitcast i32 %sb to float
  %sc = fadd float %s, %c
  %e = call float @llvm.fma.f32(float %y, float %s, float %sc)
  ret float %e
}
"#;

/// 1 + e^x as `xpu_lir::math::expp1f`: x clamped to [−EXPP1_LOW, EXP_MAX], one scale
/// factor 2^(n−1), then (y + 1)·2^(n−1) doubled and 1 added in one FMA.
const EXPP1F: &str = r#"
define internal float @xpu.expp1f(float %x) alwaysinline nounwind {
entry:
  %hi = fcmp ogt float %x, f(EXP_MAX)
  %x1 = select i1 %hi, float f(EXP_MAX), float %x
  %lo = fcmp olt float %x1, f(-EXPP1_LOW)
  %x2 = select i1 %lo, float f(-EXPP1_LOW), float %x1
  %e = call float @xpu.exp_one_factor(float %x2, float f(EXP_SHIFTER_HALF), float -0.0)
  %res = call float @llvm.fma.f32(float %e, float 2.0, float 1.0)
  ret float %res
}
"#;

/// The f64 1 + e^x on libm's exp, as the interpreter computes it.
const EXPP1: &str = r#"
define internal double @xpu.expp1(double %x) alwaysinline nounwind {
entry:
  %e = call double @llvm.exp.f64(double %x)
  %res = fadd double %e, 1.0
  ret double %res
}
"#;

/// The f64 softplus on libm's exp and log1p, as `xpu_lir::math::softplus`.
const SOFTPLUS: &str = r#"
define internal double @xpu.softplus(double %x) alwaysinline nounwind {
entry:
  %ax = call double @llvm.fabs.f64(double %x)
  %nax = fneg double %ax
  %e = call double @llvm.exp.f64(double %nax)
  %l = call double @log1p(double %e)
  %neg = fcmp olt double %x, 0.0
  %m = select i1 %neg, double 0.0, double %x
  %res = fadd double %m, %l
  ret double %res
}
"#;

/// e^(x − n·ln 2) − 1 for n = round(x·log2 e): r = x − n·ln 2 in two parts, then
/// r + r²·P(r) (`xpu_lir::math::expm1_reduced`); the caller adds 1 and scales by 2^n.
const EXPM1_REDUCED: &str = r#"
define internal float @xpu.expm1_reduced(float %x, float %n) alwaysinline nounwind {
entry:
  %r1 = call float @llvm.fma.f32(float %n, float f(-LN2_HI), float %x)
  %r = call float @llvm.fma.f32(float %n, float f(-LN2_LO), float %r1)
  %poly = horner float %r, EXP_P
  %rr = fmul float %r, %r
  %y1 = call float @llvm.fma.f32(float %poly, float %rr, float %r)
  ret float %y1
}
"#;

/// e^x: n = round(x·log2 e) from adding a shifter (the sum's low bits hold n + 254; no
/// float-to-int conversion, so a NaN flows through as a NaN and nothing is poison), then 2^n
/// applied as two factors read from those bits (2^⌊n/2⌋ and the rest) so that results in
/// the subnormal range round once.
const EXPF: &str = r#"
define internal float @xpu.expf(float %x) alwaysinline nounwind {
entry:
  %big = fcmp ogt float %x, f(EXP_MAX)
  %x1 = select i1 %big, float f(EXP_MAX), float %x
  %z = call float @xpu.expf_at_most_max(float %x1)
  ret float %z
}
"#;

/// e^x for x at most `EXP_MAX` (or NaN): [`EXPF`] after its upper clamp, called directly
/// for values a `min` with a constant already holds there.
const EXPF_AT_MOST_MAX: &str = r#"
define internal float @xpu.expf_at_most_max(float %x1) alwaysinline nounwind {
entry:
  %small = fcmp olt float %x1, -104.0
  %x2 = select i1 %small, float -104.0, float %x1
  %t = call float @llvm.fma.f32(float %x2, float f(LOG2E), float f(EXP_SHIFTER))
  %n = fsub float %t, f(EXP_SHIFTER)
  %y1 = call float @xpu.expm1_reduced(float %x2, float %n)
  %m = bitcast float %t to i32
  %m22 = shl i32 %m, 22
  %b1 = and i32 %m22, 2139095040
  %m23 = shl i32 %m, 23
  %b2 = sub i32 %m23, %b1
  %s1 = bitcast i32 %b1 to float
  %s2 = bitcast i32 %b2 to float
  %z1 = call float @llvm.fma.f32(float %y1, float %s1, float %s1)
  %z = fmul float %z1, %s2
  ret float %z
}
"#;

/// ln x: x = m·2^e with m in [√½, √2), f = m − 1, a degree-9 polynomial in f; subnormal
/// inputs are scaled by 2^23 first; x < 0 → NaN, 0 → −inf, inf → inf.
const LOGF: &str = r#"
define internal float @xpu.logf(float %x) alwaysinline nounwind {
entry:
  %sub = fcmp olt float %x, f(MIN_POSITIVE)
  %xs = fmul float %x, f(8388608.0)
  %xn = select i1 %sub, float %xs, float %x
  %adj = select i1 %sub, i32 -23, i32 0
  %bits = bitcast float %xn to i32
  %eb = lshr i32 %bits, 23
  %eb1 = and i32 %eb, 255
  %e0 = sub i32 %eb1, 126
  %e1 = add i32 %e0, %adj
  %mb0 = and i32 %bits, 8388607
  %mb = or i32 %mb0, 1056964608
  %m = bitcast i32 %mb to float
  %lo = fcmp olt float %m, f(SQRT_HALF)
  %e2 = sub i32 %e1, 1
  %e = select i1 %lo, i32 %e2, i32 %e1
  %m2 = fadd float %m, %m
  %mm = select i1 %lo, float %m2, float %m
  %f = fsub float %mm, 1.0
  %z = fmul float %f, %f
  %poly = horner float %f, LOG_P
  %q16 = fmul float %poly, %f
  %y0 = fmul float %q16, %z
  %fe = sitofp i32 %e to float
  %y1 = call float @llvm.fma.f32(float %fe, float f(LN2_LO), float %y0)
  %y2 = call float @llvm.fma.f32(float %z, float -0.5, float %y1)
  %r0 = fadd float %f, %y2
  %r = call float @llvm.fma.f32(float %fe, float f(LN2_HI), float %r0)
  %isinf = fcmp oeq float %x, f(inf)
  %r1 = select i1 %isinf, float %x, float %r
  %zero = fcmp oeq float %x, 0.0
  %r2 = select i1 %zero, float f(-inf), float %r1
  %neg = fcmp olt float %x, 0.0
  %r3 = select i1 %neg, float f(nan), float %r2
  %nan = fcmp uno float %x, 0.0
  %res = select i1 %nan, float %x, float %r3
  ret float %res
}
"#;

/// tanh x as `xpu_lir::math::tanhf`: u = −2|x| held above −TANH_CUT, e^u − 1 as
/// y·2^n + (2^n − 1) in one FMA, then −(e^u − 1)/(e^u + 1) with x's sign.
const TANHF: &str = r#"
define internal float @xpu.tanhf(float %x) alwaysinline nounwind {
entry:
  %ax = call float @llvm.fabs.f32(float %x)
  %u0 = fmul float %ax, -2.0
  %low = fcmp olt float %u0, f(-TANH_CUT)
  %u = select i1 %low, float f(-TANH_CUT), float %u0
  %em1 = call float @xpu.exp_one_factor(float %u, float f(EXP_SHIFTER_1), float -1.0)
  %nem1 = fneg float %em1
  %den = fadd float %em1, 2.0
  %q = fdiv float %nem1, %den
  %res = call float @llvm.copysign.f32(float %q, float %x)
  ret float %res
}
"#;

/// erf x: Cephes' polynomial below |x| = 1, Abramowitz & Stegun 7.1.26 above (absolute
/// error 1.5e-7 where erf is above 0.84).
const ERFF: &str = r#"
define internal float @xpu.erff(float %x) alwaysinline nounwind {
entry:
  %ax = call float @llvm.fabs.f32(float %x)
  %z = fmul float %x, %x
  %near0 = horner float %z, ERF_T
  %ys = fmul float %near0, %x
  %pa1 = call float @llvm.fma.f32(float %ax, float f(ERF_P), float 1.0)
  %t = fdiv float 1.0, %pa1
  %tail = horner float %t, ERF_A
  %a8 = fmul float %tail, %t
  %nz = fneg float %z
  %e = call float @xpu.expf(float %nz)
  %na8 = fneg float %a8
  %r = call float @llvm.fma.f32(float %na8, float %e, float 1.0)
  %rl = call float @llvm.copysign.f32(float %r, float %x)
  %small = fcmp olt float %ax, 1.0
  %res = select i1 %small, float %ys, float %rl
  ret float %res
}
"#;

/// log(1 + x) by Goldberg's correction: log(u)·x/(u − 1) with u = 1 + x.
const LOG1PF: &str = r#"
define internal float @xpu.log1pf(float %x) alwaysinline nounwind {
entry:
  %u = fadd float %x, 1.0
  %d = fsub float %u, 1.0
  %l = call float @xpu.logf(float %u)
  %q = fdiv float %x, %d
  %r = fmul float %l, %q
  %exact = fcmp oeq float %d, 0.0
  %r1 = select i1 %exact, float %x, float %r
  %inf = fcmp oeq float %x, f(inf)
  %res = select i1 %inf, float %x, float %r1
  ret float %res
}
"#;

/// e^x − 1 by Kahan's correction: (u − 1)·x/log(u) with u = e^x.
const EXPM1F: &str = r#"
define internal float @xpu.expm1f(float %x) alwaysinline nounwind {
entry:
  %u = call float @xpu.expf(float %x)
  %um1 = fsub float %u, 1.0
  %l = call float @xpu.logf(float %u)
  %q = fdiv float %x, %l
  %r = fmul float %um1, %q
  %one = fcmp oeq float %u, 1.0
  %r1 = select i1 %one, float %x, float %r
  %m1 = fcmp oeq float %um1, -1.0
  %r2 = select i1 %m1, float -1.0, float %r1
  %big = fcmp ogt float %x, 88.0
  %res = select i1 %big, float %um1, float %r2
  ret float %res
}
"#;
