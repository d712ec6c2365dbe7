//! LIR-ML kernels as CUDA C++. One `extern "C" __global__` function per kernel: the
//! outermost loops whose iterations write disjoint elements (a perfect nest whose every
//! store is indexed by each of them) are collapsed into one flat index spread over the
//! grid (a grid-stride loop); everything under them runs serially in each thread, so a
//! reduction sums in LIR-ML's declared lane order (no atomics: the same bits on every
//! launch shape) — except where an iteration reduces a row (softmax, norms): there a warp
//! takes each iteration on the GPU, its lanes reading consecutive elements and combining
//! their partials in a fixed butterfly (still no atomics, still the same bits at any grid). The source compiles with NVRTC for a GPU and, through `host.h`, with the
//! host C++ compiler, which runs the same kernel logic on the CPU ([`crate::host`]).

use std::collections::HashMap;
use std::fmt::Write;

use crate::row_cache::{self, RowCache, Use};
use crate::vector::{self, VectorPlan};

use xpu_lir::{
    Access, Affine, BinaryOp, CmpOp, Expr, Kernel, Literal, ReduceOp, ScalarType, Stmt, UnaryOp,
    Var,
};

/// Why a kernel has no CUDA form.
#[derive(Debug, thiserror::Error)]
#[error("kernel `{kernel}`: {message}")]
pub struct CodegenError {
    pub kernel: String,
    pub message: String,
}

/// Definitions every kernel source starts with: NaN-propagating max/min (numpy's for
/// elementwise ops; for reductions +0 is the larger of ±0 whatever the order, so a warp's
/// butterfly leaves every lane the same bits), the
/// float → int conversion LIR-ML defines (truncate, wrap to the low bits, NaN → i64::MIN),
/// sign, softplus and integer division by zero giving 0.
pub const PRELUDE: &str = r#"
#define XPU_FN static __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define XPU_UNROLL_8 _Pragma("unroll 8")
#define XPU_UNROLL_ALL _Pragma("unroll")
#else
#define XPU_UNROLL_8
#define XPU_UNROLL_ALL
#endif
#ifdef XPU_HOST_EMULATION
#define XPU_INFF __builtin_inff()
#define XPU_NANF __builtin_nanf("")
#define XPU_INF __builtin_inf()
#define XPU_NAN __builtin_nan("")
#else
#define XPU_INFF __int_as_float(0x7f800000)
#define XPU_NANF __int_as_float(0x7fc00000)
#define XPU_INF __longlong_as_double(0x7ff0000000000000LL)
#define XPU_NAN __longlong_as_double(0x7ff8000000000000LL)
#endif
XPU_FN long long xpu_maxi(long long a, long long b) { return a < b ? b : a; }
XPU_FN long long xpu_mini(long long a, long long b) { return b < a ? b : a; }
XPU_FN float xpu_signf(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
XPU_FN double xpu_sign(double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : x); }
XPU_FN float xpu_softplusf(float x) { return (x < 0.0f ? 0.0f : x) + log1pf(expf(-fabsf(x))); }
XPU_FN double xpu_softplus(double x) { return (x < 0.0 ? 0.0 : x) + log1p(exp(-fabs(x))); }
XPU_FN long long xpu_f2i(double x) {
  if (x != x) return (long long)0x8000000000000000ULL;
  double t = trunc(x);
  if (t > -9223372036854775808.0 && t < 9223372036854775808.0) return (long long)t;
  if (t >= 1.7014118346046923e38) return -1LL;
  if (t <= -1.7014118346046923e38) return 0LL;
  double m = fmod(t, 18446744073709551616.0);
  if (m < 0.0) m += 18446744073709551616.0;
  return (long long)(unsigned long long)m;
}
// f16/bf16 storage, computed in f32: conversions by bits (round to nearest even, as the
// cpu engine's `half` crate), the same on the device and the host, no CUDA headers.
union xpu_bits { unsigned int u; float f; };
XPU_FN float xpu_from_bits(unsigned int u) { xpu_bits b; b.u = u; return b.f; }
XPU_FN unsigned int xpu_to_bits(float f) { xpu_bits b; b.f = f; return b.u; }
XPU_FN float xpu_bf2f(unsigned short h) { return xpu_from_bits(((unsigned int)h) << 16); }
XPU_FN unsigned short xpu_f2bf(float f) {
  unsigned int u = xpu_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Elementwise max/min as numpy's maximum/minimum: a NaN operand is the result (`a` first),
// a tie (±0) gives `a`. One select each.
XPU_FN float xpu_maxf(float a, float b) { return (a != a || a >= b) ? a : b; }
XPU_FN float xpu_minf(float a, float b) { return (a != a || a <= b) ? a : b; }
XPU_FN double xpu_max(double a, double b) { return (a != a || a >= b) ? a : b; }
XPU_FN double xpu_min(double a, double b) { return (a != a || a <= b) ? a : b; }
// The same as a reduction's combine, symmetric: +0 is the max and -0 the min of ±0 in
// either order (the AND / OR of two equal values' bits), so each lane of a warp's butterfly
// (lane i combines (i, j), lane j combines (j, i)) ends with the same bits. Selects, not
// branches: in an unrolled row loop a branch per element keeps the compiler from issuing
// the row's loads together.
union xpu_dbits { unsigned long long u; double f; };
XPU_FN double xpu_dfrom(unsigned long long u) { xpu_dbits b; b.u = u; return b.f; }
XPU_FN unsigned long long xpu_dto(double f) { xpu_dbits b; b.f = f; return b.u; }
#define XPU_REDUCE_MINMAX(T, NAME, FIRST_LOSES, JOIN, FROM, TO) \
  XPU_FN T NAME(T a, T b) { \
    T r = (FIRST_LOSES) ? b : a; \
    r = a == b ? FROM(TO(a) JOIN TO(b)) : r; \
    r = b != b ? b : r; \
    return a != a ? a : r; \
  }
// f32 (and f16/bf16, computed in f32) the same, in one instruction each on sm_80 and
// later (PTX max.NaN / min.NaN: any NaN gives the canonical NaN, +0 is the max and -0 the
// min of ±0 in either order); older GPUs and the host emulation give the same bits with
// selects.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
XPU_FN float xpu_rmaxf(float a, float b) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
XPU_FN float xpu_rminf(float a, float b) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
#else
XPU_FN float xpu_rmaxf(float a, float b) {
  float r = a < b ? b : a;
  r = a == b ? xpu_from_bits(xpu_to_bits(a) & xpu_to_bits(b)) : r;
  return (a != a || b != b) ? xpu_from_bits(0x7fffffffu) : r;
}
XPU_FN float xpu_rminf(float a, float b) {
  float r = b < a ? b : a;
  r = a == b ? xpu_from_bits(xpu_to_bits(a) | xpu_to_bits(b)) : r;
  return (a != a || b != b) ? xpu_from_bits(0x7fffffffu) : r;
}
#endif
XPU_REDUCE_MINMAX(double, xpu_rmax, a < b, &, xpu_dfrom, xpu_dto)
XPU_REDUCE_MINMAX(double, xpu_rmin, b < a, |, xpu_dfrom, xpu_dto)
XPU_FN float xpu_h2f(unsigned short h) {
  unsigned int s = ((unsigned int)h & 0x8000u) << 16, e = ((unsigned int)h >> 10) & 0x1fu, m = (unsigned int)h & 0x3ffu;
  if (e == 0) { float f = (float)m * 5.9604644775390625e-8f; return s ? -f : f; }
  if (e == 31) return xpu_from_bits(s | 0x7f800000u | (m << 13));
  return xpu_from_bits(s | ((e + 112u) << 23) | (m << 13));
}
XPU_FN unsigned short xpu_f2h(float f) {
  unsigned int u = xpu_to_bits(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (unsigned short)(s | 0x7c00u);
  if (a < 0x38800000u) return (unsigned short)(s | (unsigned int)rintf(xpu_from_bits(a) * 16777216.0f));
  unsigned int r = a - 0x38000000u;
  r = r + 0xfffu + ((r >> 13) & 1u);
  return (unsigned short)(s | (r >> 13));
}
// 16-byte loads and stores of four floats. The host emulation copies bytes (no aliasing)
// and traps on an address the GPU would fault on, so its tests see a misaligned access.
#ifdef XPU_HOST_EMULATION
XPU_FN void xpu_aligned16(const void* p) { if ((unsigned long long)p & 15ULL) __builtin_trap(); }
XPU_FN float4 xpu_ld4(const float* p) { xpu_aligned16(p); float4 v; memcpy(&v, p, sizeof v); return v; }
XPU_FN void xpu_st4(float* p, float a, float b, float c, float d) { xpu_aligned16(p); float4 v = {a, b, c, d}; memcpy(p, &v, sizeof v); }
#else
XPU_FN float4 xpu_ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
XPU_FN void xpu_st4(float* p, float a, float b, float c, float d) { *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d); }
#endif
XPU_FN long long xpu_divi(long long a, long long b) { return b == 0 ? 0 : (b == -1 ? (long long)(0ULL - (unsigned long long)a) : a / b); }
XPU_FN long long xpu_remi(long long a, long long b) { return (b == 0 || b == -1) ? 0 : a % b; }
"#;

/// The CUDA C++ source of `kernels` (one translation unit, the prelude once).
pub fn source(kernels: &[Kernel]) -> Result<String, CodegenError> {
    let mut s = String::from(PRELUDE);
    for k in kernels {
        s.push_str(&kernel_source(k)?);
    }
    Ok(s)
}

/// One kernel's function, plus (under `XPU_HOST_EMULATION`) a host entry point that runs
/// it over a grid: `NAME_host(void **buffers, long long grid, long long block)`.
pub fn kernel_source(k: &Kernel) -> Result<String, CodegenError> {
    let mut e = Emitter {
        kernel: k,
        out: String::new(),
        types: HashMap::new(),
        depth: 1,
        cache: RowCache::default(),
        lane: None,
        lane_loops: 0,
        vector: None,
    };
    if !k.syms.is_empty() {
        return Err(e.err("symbolic sizes: CUDA kernels are specialised for concrete shapes"));
    }
    let mut params = Vec::new();
    for b in &k.buffers {
        let t = storage_type(b.elem);
        let cv = if b.access == Access::In { "const " } else { "" };
        params.push(format!("{cv}{t}* __restrict__ b_{}", ident(&b.name)));
    }
    let (band, body) = band(&k.body);
    let _ = writeln!(
        e.out,
        "\nextern \"C\" __global__ void {}({}) {{",
        ident(&k.name),
        params.join(", ")
    );
    if band.is_empty() {
        e.line("if (blockIdx.x != 0 || threadIdx.x != 0) return;");
        e.block(body)?;
    } else if cooperative(body) {
        // On the GPU a warp takes each iteration (its reductions split over the lanes);
        // the host emulation, which has no warps, runs the same iterations one per thread.
        e.out.push_str("#ifdef __CUDA_ARCH__\n");
        e.band_loop(&band, body, true)?;
        e.out.push_str("#else\n");
        e.band_loop(&band, body, false)?;
        e.out.push_str("#endif\n");
    } else if let Some(plan) = VectorPlan::for_band(k, &band, body) {
        // Four elements a thread when every contiguous buffer is 16-byte aligned (the
        // engine's allocations are), else one.
        let aligned: Vec<String> =
            plan.aligned.iter().map(|b| format!("(unsigned long long)b_{}", ident(b))).collect();
        e.line(&format!("if ((({}) & 15ULL) == 0ULL) {{", aligned.join(" | ")));
        e.depth += 1;
        e.vector = Some((plan, 0));
        e.band_loop(&band, body, false)?;
        e.vector = None;
        e.depth -= 1;
        e.line("} else {");
        e.depth += 1;
        e.band_loop(&band, body, false)?;
        e.depth -= 1;
        e.line("}");
    } else {
        e.band_loop(&band, body, false)?;
    }
    e.out.push_str("}\n");
    e.host_entry();
    Ok(e.out)
}

/// How many flat iterations a kernel spreads over the grid: the product of its band's
/// extents (1 for a kernel that runs on one thread), a quarter of it for a vectorised one
/// ([`vector`]). Kernels are specialised to concrete shapes, so the extents are constants;
/// `None` when one is not, or the product overflows.
pub fn parallel_iterations(k: &Kernel) -> Option<u64> {
    let (band, body) = band(&k.body);
    let elements = band.iter().try_fold(1u64, |acc, (_, lo, hi)| {
        let n = hi.as_constant()?.checked_sub(lo.as_constant()?)?.max(0) as u64;
        acc.checked_mul(n)
    })?;
    // A vectorised kernel's thread takes four elements an iteration (on its aligned path,
    // the one the engine's allocations take).
    let vectorised = !cooperative(body) && VectorPlan::for_band(k, &band, body).is_some();
    Some(if vectorised { elements / vector::WIDTH as u64 } else { elements })
}

/// The fewest elements a reduction must span for its iteration to take a warp: below it
/// the lanes would mostly idle.
const WARP_REDUCTION_MIN: i64 = 32;

/// Whether a band's statements reduce over enough elements that a warp per iteration
/// (its lanes reading consecutive elements) beats a thread per iteration (each thread
/// walking a row of its own, no two threads' loads coalescing).
fn cooperative(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Let { value: Expr::Reduce { lo, hi, .. }, .. } => {
            match (lo.as_constant(), hi.as_constant()) {
                (Some(lo), Some(hi)) => hi - lo >= WARP_REDUCTION_MIN,
                _ => true,
            }
        }
        _ => false,
    })
}

/// Threads each flat iteration of `k` takes on the GPU: a warp where its reductions are
/// split over lanes, else one.
pub fn threads_per_iteration(k: &Kernel) -> u64 {
    let (band, body) = band(&k.body);
    if !band.is_empty() && cooperative(body) { 32 } else { 1 }
}

/// Threads per block of every launch (a multiple of the warp size).
pub const BLOCK: u32 = 256;

/// The grid for `iterations` flat iterations on a device with `multiprocessors` SMs: one
/// thread per iteration up to 32 resident blocks per SM, beyond which the kernel's
/// grid-stride loop takes the rest (the result is the same at any grid: each iteration's
/// stores are its own).
pub fn grid_for(iterations: u64, multiprocessors: u32) -> u32 {
    let wanted = iterations.div_ceil(BLOCK as u64).max(1);
    let cap = (multiprocessors.max(1) as u64) * 32;
    wanted.min(cap).min(u32::MAX as u64) as u32
}

/// The outermost loops to spread over threads, and the statements under them.
fn band(body: &[Stmt]) -> (Vec<(&str, &Affine, &Affine)>, &[Stmt]) {
    let mut loops = Vec::new();
    let mut cur = body;
    while let [Stmt::For { var, lo, hi, body: inner, .. }] = cur {
        let bounds_fixed = [lo, hi].iter().all(|a| a.vars().all(|v| !matches!(v, Var::Loop(_))));
        if !bounds_fixed || !stores_indexed_by(inner, var) {
            break;
        }
        loops.push((var.as_str(), lo, hi));
        cur = inner;
    }
    (loops, cur)
}

/// Whether every store under `body` has `var` in its index, so iterations of `var` write
/// disjoint elements (an accumulation across iterations stores to one element and keeps
/// its loop serial).
pub(crate) fn stores_indexed_by(body: &[Stmt], var: &str) -> bool {
    let v = Var::Loop(var.to_string());
    body.iter().all(|s| match s {
        Stmt::Store { index, .. } => index.iter().any(|a| a.vars().any(|x| *x == v)),
        Stmt::For { body, .. } => stores_indexed_by(body, var),
        Stmt::Let { value: Expr::Reduce { body, .. }, .. } => stores_indexed_by(body, var),
        Stmt::Let { .. } | Stmt::Yield(_) => true,
    })
}

/// A LIR-ML name as a C identifier (a kernel's function is `ident(kernel.name)`).
pub(crate) fn ident(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

fn c_type(t: ScalarType) -> &'static str {
    match t {
        ScalarType::Bool => "bool",
        ScalarType::I32 => "int",
        ScalarType::I64 => "long long",
        ScalarType::F32 | ScalarType::F16 | ScalarType::BF16 => "float",
        ScalarType::F64 => "double",
    }
}

/// How a buffer's elements are stored (f16/bf16 as their bits).
fn storage_type(t: ScalarType) -> &'static str {
    match t {
        ScalarType::Bool => "unsigned char",
        ScalarType::F16 | ScalarType::BF16 => "unsigned short",
        t => c_type(t),
    }
}

struct Emitter<'k> {
    kernel: &'k Kernel,
    out: String,
    types: HashMap<String, ScalarType>,
    depth: usize,
    /// A warp-per-row body's loads kept in registers ([`row_cache`]).
    cache: RowCache,
    /// The lane loop whose body is being emitted (not inside a loop nested in it).
    lane: Option<LaneLoop>,
    /// Lane loops opened so far in this kernel: the next one's ordinal.
    lane_loops: usize,
    /// In a vectorised body: the plan, and which of the four elements is being emitted.
    vector: Option<(VectorPlan, i64)>,
}

/// A lane loop being emitted: its LIR variable, range, constant trips (if any) and ordinal.
struct LaneLoop {
    var: String,
    lo: Affine,
    trips: Option<i64>,
    ordinal: usize,
}

/// Partial results a lane keeps in a warp reduction with a constant trip count (combined
/// as `(p0 ∘ p1) ∘ (p2 ∘ p3)`).
const ACCUMULATORS: usize = 4;

/// Trips each lane takes over `lo..hi` when the range is a positive constant multiple of
/// the warp size (every lane the same count).
pub(crate) fn lane_trips(lo: &Affine, hi: &Affine) -> Option<i64> {
    match (lo.as_constant(), hi.as_constant()) {
        (Some(l), Some(h)) if h > l && (h - l) % 32 == 0 => Some((h - l) / 32),
        _ => None,
    }
}

impl Emitter<'_> {
    fn err(&self, message: impl Into<String>) -> CodegenError {
        CodegenError { kernel: self.kernel.name.clone(), message: message.into() }
    }

    fn line(&mut self, s: &str) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn affine(&self, a: &Affine) -> String {
        let mut s = format!("{}LL", a.constant);
        for (v, c) in a.terms() {
            let name = match (v, &self.vector) {
                // The k-th of a thread's four elements along the vectorised loop.
                (Var::Loop(n), Some((plan, k))) if *n == plan.var && *k > 0 => {
                    format!("(i_{} + {k}LL)", ident(n))
                }
                (Var::Loop(n), _) => format!("i_{}", ident(n)),
                (Var::Sym(n), _) => format!("s_{}", ident(n)),
            };
            let _ = write!(s, " + {c}LL * {name}");
        }
        s
    }

    /// The flat element offset of `index` into `buffer` (row-major over its shape).
    fn offset(&self, buffer: &str, index: &[Affine]) -> Result<String, CodegenError> {
        let b =
            self.kernel.buffer(buffer).ok_or_else(|| self.err(format!("no buffer `{buffer}`")))?;
        let mut s = String::from("0LL");
        for (d, a) in index.iter().enumerate() {
            let extent = b.shape.get(d).map(|e| self.affine(e)).unwrap_or_else(|| "1LL".into());
            s = format!("({s}) * ({extent}) + ({})", self.affine(a));
        }
        Ok(s)
    }

    /// The C name of LIR value `name`: `v_NAME`, and in a vectorised body `v_NAME_K` for
    /// the k-th of the thread's four elements.
    fn val(&self, name: &str) -> String {
        match &self.vector {
            Some((_, k)) => format!("v_{}_{k}", ident(name)),
            None => format!("v_{}", ident(name)),
        }
    }

    /// A vectorised band's statements, each for the thread's four elements in turn: a
    /// contiguous f32 load as one 16-byte load split into four values, a contiguous f32
    /// store as one 16-byte store of the four, anything else four times over (a broadcast
    /// load four times from one address, which the compiler reads once).
    fn vector_block(&mut self, body: &[Stmt]) -> Result<(), CodegenError> {
        const FIELDS: [&str; 4] = ["x", "y", "z", "w"];
        for s in body {
            let contiguous = |e: &Self, buffer: &str, index: &[Affine]| {
                e.vector.as_ref().is_some_and(|(p, _)| p.is_contiguous(e.kernel, buffer, index))
            };
            match s {
                Stmt::Let { name, value: Expr::Load { buffer, index } }
                    if contiguous(self, buffer, index) =>
                {
                    self.set_element(0);
                    let at = self.offset(buffer, index)?;
                    let q = format!("q_{}", ident(name));
                    self.line(&format!("const float4 {q} = xpu_ld4(&b_{}[{at}]);", ident(buffer)));
                    for (k, field) in FIELDS.iter().enumerate() {
                        self.set_element(k as i64);
                        let v = self.val(name);
                        self.line(&format!("const float {v} = {q}.{field};"));
                    }
                    self.types.insert(name.clone(), ScalarType::F32);
                }
                Stmt::Store { buffer, index, value } if contiguous(self, buffer, index) => {
                    self.set_element(0);
                    let at = self.offset(buffer, index)?;
                    let values: Vec<String> = (0..4)
                        .map(|k| {
                            self.set_element(k);
                            format!("(float){}", self.val(value))
                        })
                        .collect();
                    let b = ident(buffer);
                    self.line(&format!("xpu_st4(&b_{b}[{at}], {});", values.join(", ")));
                }
                s => {
                    for k in 0..vector::WIDTH {
                        self.set_element(k);
                        self.block(std::slice::from_ref(s))?;
                    }
                }
            }
        }
        self.set_element(0);
        Ok(())
    }

    fn set_element(&mut self, k: i64) {
        if let Some((_, at)) = &mut self.vector {
            *at = k;
        }
    }

    fn ty(&self, name: &str) -> Result<ScalarType, CodegenError> {
        self.types
            .get(name)
            .copied()
            .ok_or_else(|| self.err(format!("`%{name}` used before it is defined")))
    }

    /// The grid-stride loop over the band's flat iterations, its loop variables recovered
    /// from the flat index: one iteration per thread, or per warp (`warp`), whose 32 lanes
    /// share the iteration's reductions and row loops ([`Emitter::warp_block`]).
    fn band_loop(
        &mut self,
        band: &[(&str, &Affine, &Affine)],
        body: &[Stmt],
        warp: bool,
    ) -> Result<(), CodegenError> {
        let width = if self.vector.is_some() { vector::WIDTH } else { 1 };
        let mut extents: Vec<String> = band
            .iter()
            .map(|(_, lo, hi)| format!("(({}) - ({}))", self.affine(hi), self.affine(lo)))
            .collect();
        if width > 1 {
            // The innermost loop counts groups of four elements.
            let last = extents.len() - 1;
            extents[last] = format!("({} / {width}LL)", extents[last]);
        }
        self.line(&format!("const long long total = {};", extents.join(" * ")));
        if warp {
            self.line("const long long stride = ((long long)gridDim.x * blockDim.x) / 32;");
            self.line("const int lane = (int)(threadIdx.x & 31u);");
            self.line("for (long long flat = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; flat < total; flat += stride) {");
        } else {
            self.line("const long long stride = (long long)gridDim.x * blockDim.x;");
            self.line("for (long long flat = (long long)blockIdx.x * blockDim.x + threadIdx.x; flat < total; flat += stride) {");
        }
        self.depth += 1;
        self.line("long long rest = flat;");
        for (i, (var, lo, _)) in band.iter().enumerate().rev() {
            let lo = self.affine(lo);
            let scale = if i == band.len() - 1 && width > 1 {
                format!("{width}LL * ")
            } else {
                String::new()
            };
            if i == 0 {
                self.line(&format!("const long long i_{} = ({lo}) + {scale}rest;", ident(var)));
            } else {
                self.line(&format!(
                    "const long long i_{} = ({lo}) + {scale}(rest % {});",
                    ident(var),
                    extents[i]
                ));
                self.line(&format!("rest /= {};", extents[i]));
            }
        }
        if warp {
            self.cache = RowCache::plan(self.kernel, body);
            let slots: Vec<String> = (self.cache.declared.iter().enumerate())
                .map(|(slot, (ty, trips))| format!("{} c{slot}[{trips}];", c_type(*ty)))
                .collect();
            for line in slots {
                self.line(&line);
            }
            self.lane_loops = 0;
            self.warp_block(body)?;
            self.cache = RowCache::default();
        } else if self.vector.is_some() {
            self.vector_block(body)?
        } else {
            self.block(body)?
        }
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    /// An iteration's statements for the 32 lanes of a warp: a reduction is split over the
    /// lanes (lane `l` takes elements `l, l + 32, …` in order, then a butterfly of
    /// shuffles combines them — a fixed order, and every lane ends with the same value); a
    /// loop whose iterations store disjoint elements is strided over the lanes; any other
    /// loop, and every store outside a loop, runs on lane 0.
    fn warp_block(&mut self, body: &[Stmt]) -> Result<(), CodegenError> {
        for s in body {
            match s {
                Stmt::Let { name, value: Expr::Reduce { op, ty, init, var, lo, hi, body, .. } } => {
                    self.warp_reduce(name, *op, *ty, *init, var, lo, hi, body)?
                }
                Stmt::For { var, lo, hi, body, .. } if stores_indexed_by(body, var) => {
                    self.lane_loop(var, lo, hi);
                    self.depth += 1;
                    self.block(body)?;
                    self.depth -= 1;
                    self.line("}");
                    self.lane = None;
                    // What one lane stored, the others may read next (a merged row kernel
                    // reads its own per-row scalars): the warp's memory is ordered here.
                    self.line("__syncwarp();");
                }
                Stmt::For { .. } | Stmt::Store { .. } => {
                    self.line("if (lane == 0) {");
                    self.depth += 1;
                    self.block(std::slice::from_ref(s))?;
                    self.depth -= 1;
                    self.line("}");
                    self.line("__syncwarp();");
                }
                Stmt::Let { .. } | Stmt::Yield(_) => self.block(std::slice::from_ref(s))?,
            }
        }
        Ok(())
    }

    /// `a` and `b` combined by the reduction `op` of `ty`, or an error naming it.
    fn combine(
        &self,
        op: ReduceOp,
        ty: ScalarType,
        a: &str,
        b: &str,
    ) -> Result<String, CodegenError> {
        combine(op, ty, a, b)
            .ok_or_else(|| self.err(format!("a `{}` reduction of {}", op.name(), ty.name())))
    }

    /// Opens a loop of `var` over `lo..hi` strided over the warp's lanes (lane `l` takes
    /// `lo + l`, `lo + l + 32`, …). Where the range is a constant multiple of 32 every lane
    /// takes the same count of elements: the loop counts trips instead, with no bound to
    /// test per element, so its unrolled loads are issued together. A loop that fills or
    /// reads a register-cached row is unrolled fully (a register array needs constant
    /// indices). Its body is emitted with `self.lane` set; the caller clears it.
    fn lane_loop(&mut self, var: &str, lo: &Affine, hi: &Affine) {
        let v = format!("i_{}", ident(var));
        let span = lane_trips(lo, hi);
        let ordinal = self.lane_loops;
        self.lane_loops += 1;
        self.lane = Some(LaneLoop { var: var.to_string(), lo: lo.clone(), trips: span, ordinal });
        let (lo, hi) = (self.affine(lo), self.affine(hi));
        match span {
            Some(trips) => {
                let cached = self.cache.touching.contains(&ordinal);
                self.line(if cached { "XPU_UNROLL_ALL" } else { "XPU_UNROLL_8" });
                self.line(&format!("for (long long t_{v} = 0; t_{v} < {trips}LL; ++t_{v}) {{"));
                self.line(&format!("  const long long {v} = ({lo}) + lane + 32LL * t_{v};"));
            }
            None => {
                self.line(&format!("for (long long {v} = ({lo}) + lane; {v} < {hi}; {v} += 32) {{"))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn warp_reduce(
        &mut self,
        name: &str,
        op: ReduceOp,
        ty: ScalarType,
        init: Literal,
        var: &str,
        lo: &Affine,
        hi: &Affine,
        body: &[Stmt],
    ) -> Result<(), CodegenError> {
        let (t, n) = (c_type(ty), ident(name));
        let combine = |a: &str, b: &str| self.combine(op, ty, a, b);
        let step = combine("acc", "y")?;
        let across = combine("acc", "other")?;
        let partial = format!("part[t_i_{} % {ACCUMULATORS}]", ident(var));
        let partial_step = format!("{partial} = {};", combine(&partial, "y")?);
        let (left, right) = (combine("part[0]", "part[1]")?, combine("part[2]", "part[3]")?);
        let partials = combine(&format!("({left})"), &format!("({right})"))?;
        let shuffled = if ty == ScalarType::Bool {
            "(__shfl_xor_sync(0xffffffffu, (int)acc, o) != 0)".to_string()
        } else {
            "__shfl_xor_sync(0xffffffffu, acc, o)".to_string()
        };
        self.line(&format!("{t} v_{n};"));
        self.line("{");
        self.depth += 1;
        let init = literal(ty, init);
        // A lane walking a constant count of elements keeps ACCUMULATORS partials (element
        // `t` into partial `t % ACCUMULATORS`, combined in a fixed order after the loop):
        // four short dependency chains instead of one long one, so a lane's loads and
        // arithmetic overlap. Any other lane loop keeps one partial.
        let split = lane_trips(lo, hi).is_some_and(|trips| trips >= ACCUMULATORS as i64);
        if split {
            let inits = [init.as_str(); ACCUMULATORS].join(", ");
            self.line(&format!("{t} part[{ACCUMULATORS}] = {{{inits}}};"));
        } else {
            self.line(&format!("{t} acc = {init};"));
        }
        self.lane_loop(var, lo, hi);
        self.depth += 1;
        self.line(&format!("{t} y;"));
        self.block(body)?;
        if split {
            self.line(&partial_step);
        } else {
            self.line(&format!("acc = {step};"));
        }
        self.depth -= 1;
        self.line("}");
        self.lane = None;
        if split {
            self.line(&format!("{t} acc = {partials};"));
        }
        self.line("for (int o = 16; o > 0; o >>= 1) {");
        self.depth += 1;
        self.line(&format!("const {t} other = {shuffled};"));
        self.line(&format!("acc = {across};"));
        self.depth -= 1;
        self.line("}");
        self.line(&format!("v_{n} = acc;"));
        self.depth -= 1;
        self.line("}");
        self.types.insert(name.to_string(), ty);
        Ok(())
    }

    fn block(&mut self, body: &[Stmt]) -> Result<(), CodegenError> {
        for s in body {
            match s {
                Stmt::For { var, lo, hi, body, .. } => {
                    let v = format!("i_{}", ident(var));
                    let (lo, hi) = (self.affine(lo), self.affine(hi));
                    self.line(&format!("for (long long {v} = {lo}; {v} < {hi}; ++{v}) {{"));
                    self.depth += 1;
                    // A nested loop's loads vary with its own index: none is a cached row.
                    let lane = self.lane.take();
                    self.block(body)?;
                    self.lane = lane;
                    self.depth -= 1;
                    self.line("}");
                }
                Stmt::Let { name, value } => self.let_(name, value)?,
                Stmt::Store { buffer, index, value } => {
                    let b = self
                        .kernel
                        .buffer(buffer)
                        .ok_or_else(|| self.err(format!("no buffer `{buffer}`")))?;
                    let elem = b.elem;
                    let value = self.val(value);
                    let v = &value;
                    let v = match elem {
                        ScalarType::Bool => format!("(unsigned char)({v} ? 1 : 0)"),
                        ScalarType::F16 => format!("xpu_f2h({v})"),
                        ScalarType::BF16 => format!("xpu_f2bf({v})"),
                        t => format!("({}){v}", c_type(t)),
                    };
                    let at = self.offset(buffer, index)?;
                    let kept = self.kept(buffer, index, true);
                    if !matches!(kept, Some((Use::ForwardOnly(_) | Use::Elide, _))) {
                        self.line(&format!("b_{}[{at}] = {v};", ident(buffer)));
                    }
                    if let Some((Use::Forward(slot) | Use::ForwardOnly(slot), trip)) = kept {
                        // The value a later loop's load would read back: rounded to the
                        // buffer's storage type.
                        let back = match elem {
                            ScalarType::Bool => value,
                            ScalarType::F16 => format!("xpu_h2f(xpu_f2h({value}))"),
                            ScalarType::BF16 => format!("xpu_bf2f(xpu_f2bf({value}))"),
                            t => format!("({}){value}", c_type(t)),
                        };
                        self.line(&format!("c{slot}[{trip}] = {back};"));
                    }
                }
                Stmt::Yield(v) => self.line(&format!("y = v_{};", ident(v))),
            }
        }
        Ok(())
    }

    fn let_(&mut self, name: &str, value: &Expr) -> Result<(), CodegenError> {
        let (ty, rhs) = match value {
            Expr::Reduce { op, ty, lanes, init, var, lo, hi, body } => {
                let lane = self.lane.take();
                let r = self.reduce(name, *op, *ty, *lanes, *init, var, lo, hi, body);
                self.lane = lane;
                return r;
            }
            e => self.expr(e)?,
        };
        self.types.insert(name.to_string(), ty);
        let t = c_type(ty);
        let n = self.val(name);
        let n = n.strip_prefix("v_").unwrap_or(&n);
        let kept = match value {
            Expr::Load { buffer, index } => self.kept(buffer, index, false),
            _ => None,
        };
        match kept {
            Some((Use::Read(slot), trip)) => {
                self.line(&format!("const {t} v_{n} = c{slot}[{trip}];"))
            }
            Some((Use::Fill(slot) | Use::Forward(slot) | Use::ForwardOnly(slot), trip)) => {
                self.line(&format!("const {t} v_{n} = {rhs};"));
                self.line(&format!("c{slot}[{trip}] = v_{n};"));
            }
            Some((Use::Elide, _)) | None => self.line(&format!("const {t} v_{n} = {rhs};")),
        }
        Ok(())
    }

    /// What the current lane loop does with the element of `buffer` at `index` it loads or
    /// stores, if it is kept in registers ([`row_cache`]), and the trip variable indexing
    /// the slot.
    fn kept(&self, buffer: &str, index: &[Affine], store: bool) -> Option<(Use, String)> {
        let lane = self.lane.as_ref()?;
        let key = row_cache::key(buffer, index, &lane.var, &lane.lo, lane.trips?)?;
        let kept = self.cache.use_of(lane.ordinal, &key, store)?;
        Some((kept, format!("t_i_{}", ident(&lane.var))))
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        name: &str,
        op: ReduceOp,
        ty: ScalarType,
        lanes: u32,
        init: Literal,
        var: &str,
        lo: &Affine,
        hi: &Affine,
        body: &[Stmt],
    ) -> Result<(), CodegenError> {
        let (t, n, v) = (c_type(ty), ident(name), format!("i_{}", ident(var)));
        let lanes = lanes.max(1);
        self.line(&format!("{t} v_{n};"));
        self.line("{");
        self.depth += 1;
        self.line(&format!("{t} acc[{lanes}];"));
        let init = literal(ty, init);
        self.line(&format!("for (int l = 0; l < {lanes}; ++l) acc[l] = {init};"));
        let (lo, hi) = (self.affine(lo), self.affine(hi));
        self.line(&format!("for (long long {v} = {lo}; {v} < {hi}; ++{v}) {{"));
        self.depth += 1;
        self.line(&format!("{t} y;"));
        self.block(body)?;
        let lane = format!("acc[({v} - ({lo})) % {lanes}]");
        let combine = |a: &str, b: &str| self.combine(op, ty, a, b);
        let combined = combine(&lane, "y")?;
        let total = combine(&format!("v_{n}"), "acc[l]")?;
        self.line(&format!("{lane} = {combined};"));
        self.depth -= 1;
        self.line("}");
        self.line(&format!("v_{n} = acc[0];"));
        self.line(&format!("for (int l = 1; l < {lanes}; ++l) v_{n} = {total};"));
        self.depth -= 1;
        self.line("}");
        self.types.insert(name.to_string(), ty);
        Ok(())
    }

    fn expr(&self, e: &Expr) -> Result<(ScalarType, String), CodegenError> {
        let v = |n: &str| self.val(n);
        Ok(match e {
            Expr::Const { ty, value } => (*ty, literal(*ty, *value)),
            Expr::Index(a) => (ScalarType::I64, self.affine(a)),
            Expr::Load { buffer, index } => {
                let b = self
                    .kernel
                    .buffer(buffer)
                    .ok_or_else(|| self.err(format!("no buffer `{buffer}`")))?;
                let at = format!("b_{}[{}]", ident(buffer), self.offset(buffer, index)?);
                match b.elem {
                    ScalarType::Bool => (ScalarType::Bool, format!("({at} != 0)")),
                    ScalarType::F16 => (ScalarType::F32, format!("xpu_h2f({at})")),
                    ScalarType::BF16 => (ScalarType::F32, format!("xpu_bf2f({at})")),
                    t => (t.compute(), at),
                }
            }
            Expr::Unary { op, arg } => {
                let t = self.ty(arg)?;
                unary(*op, t, &v(arg))
                    .ok_or_else(|| self.err(format!("`{}` of {}", op.name(), t.name())))?
            }
            Expr::Binary { op, lhs, rhs } => {
                let t = self.ty(lhs)?;
                (
                    t,
                    binary(*op, t, &v(lhs), &v(rhs))
                        .ok_or_else(|| self.err(format!("`{}` of {}", op.name(), t.name())))?,
                )
            }
            Expr::Compare { op, lhs, rhs } => {
                let o = match op {
                    CmpOp::Eq => "==",
                    CmpOp::Ne => "!=",
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                };
                (ScalarType::Bool, format!("({} {o} {})", v(lhs), v(rhs)))
            }
            Expr::Select { cond, then, otherwise } => {
                (self.ty(then)?, format!("({} ? {} : {})", v(cond), v(then), v(otherwise)))
            }
            Expr::Cast { arg, to } => {
                let from = self.ty(arg)?;
                (to.compute(), cast(from, to.compute(), &v(arg)))
            }
            Expr::Reduce { .. } => return Err(self.err("a reduction inside an expression")),
        })
    }

    /// The host entry point of the emulation build: every (block, thread) of a 1-D grid in
    /// turn, the buffers passed as an array of pointers.
    fn host_entry(&mut self) {
        let k = self.kernel;
        let name = ident(&k.name);
        let args: Vec<String> = k
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| format!("({}*)buffers[{i}]", storage_type(b.elem)))
            .collect();
        let _ = writeln!(
            self.out,
            "#ifdef XPU_HOST_EMULATION\nextern \"C\" void {name}_host(void **buffers, long long grid, long long block) {{\n  xpu_launch(grid, block, [&] {{ {name}({}); }});\n}}\n#endif",
            args.join(", ")
        );
    }
}

fn literal(ty: ScalarType, l: Literal) -> String {
    let f = match l {
        Literal::Bool(b) => {
            return if ty == ScalarType::Bool { b.to_string() } else { (b as i64).to_string() };
        }
        Literal::Int(i) => match ty {
            ScalarType::I32 => return format!("{}", i as i32),
            ScalarType::I64 => return format!("(long long){i}LL"),
            ScalarType::Bool => return (i != 0).to_string(),
            _ => i as f64,
        },
        Literal::Float(x) => x,
    };
    match ty.compute() {
        ScalarType::F64 => float_literal(f, false),
        ScalarType::F32 => float_literal(f as f32 as f64, true),
        ScalarType::I32 => format!("{}", f as i32),
        ScalarType::I64 => format!("(long long){}LL", f as i64),
        _ => (f != 0.0).to_string(),
    }
}

fn float_literal(x: f64, single: bool) -> String {
    let suffix = if single { "f" } else { "" };
    if x.is_nan() {
        return if single { "XPU_NANF".into() } else { "XPU_NAN".into() };
    }
    if x.is_infinite() {
        let inf = if single { "XPU_INFF" } else { "XPU_INF" };
        return if x > 0.0 { inf.into() } else { format!("(-{inf})") };
    }
    // 17 significant digits read back to the same double (and its f32 value exactly).
    format!("{x:.16e}{suffix}")
}

fn unary(op: UnaryOp, t: ScalarType, x: &str) -> Option<(ScalarType, String)> {
    use UnaryOp::*;
    let f32_ = t == ScalarType::F32;
    if t.is_int() || t == ScalarType::Bool {
        let c = c_type(t);
        return Some((
            t,
            match op {
                Neg => format!("({c})(0ULL - (unsigned long long){x})"),
                Abs => format!(
                    "({c})({x} < 0 ? 0ULL - (unsigned long long){x} : (unsigned long long){x})"
                ),
                Sign => format!("({c})(({x} > 0) - ({x} < 0))"),
                Not if t == ScalarType::Bool => format!("(!{x})"),
                Not => format!("(~{x})"),
                _ => return None,
            },
        ));
    }
    let m = |name: &str| if f32_ { format!("{name}f({x})") } else { format!("{name}({x})") };
    Some(match op {
        IsNan => (ScalarType::Bool, format!("({x} != {x})")),
        IsInf => {
            (ScalarType::Bool, format!("({} == {})", m("fabs"), float_literal(f64::INFINITY, f32_)))
        }
        _ => (
            t,
            match op {
                Neg => format!("(-{x})"),
                Abs => m("fabs"),
                Exp => m("exp"),
                Log => m("log"),
                Log1p => m("log1p"),
                Expm1 => m("expm1"),
                Expp1 => format!("({} + {})", m("exp"), float_literal(1.0, f32_)),
                Sqrt => m("sqrt"),
                Recip => format!("({} / {x})", float_literal(1.0, f32_)),
                Tanh => m("tanh"),
                Softplus => {
                    if f32_ {
                        format!("xpu_softplusf({x})")
                    } else {
                        format!("xpu_softplus({x})")
                    }
                }
                Erf => m("erf"),
                Sin => m("sin"),
                Cos => m("cos"),
                Floor => m("floor"),
                Ceil => m("ceil"),
                Round => m("rint"),
                Sign => {
                    if f32_ {
                        format!("xpu_signf({x})")
                    } else {
                        format!("xpu_sign({x})")
                    }
                }
                Not | IsNan | IsInf => return None,
            },
        ),
    })
}

fn binary(op: BinaryOp, t: ScalarType, a: &str, b: &str) -> Option<String> {
    use BinaryOp::*;
    let c = c_type(t);
    if t == ScalarType::Bool {
        return Some(match op {
            And | Mul | Min => format!("({a} && {b})"),
            Or | Add | Max => format!("({a} || {b})"),
            Xor | Sub => format!("({a} != {b})"),
            _ => return None,
        });
    }
    if t.is_int() {
        // Wrapping arithmetic through unsigned, as LIR-ML's.
        let u = |o: &str| format!("({c})((unsigned long long){a} {o} (unsigned long long){b})");
        return Some(match op {
            Add => u("+"),
            Sub => u("-"),
            Mul => u("*"),
            Div => format!("({c})xpu_divi({a}, {b})"),
            Rem => format!("({c})xpu_remi({a}, {b})"),
            Max => format!("({c})xpu_maxi({a}, {b})"),
            Min => format!("({c})xpu_mini({a}, {b})"),
            And => format!("({a} & {b})"),
            Or => format!("({a} | {b})"),
            Xor => format!("({a} ^ {b})"),
            Pow => return None,
        });
    }
    let f = t == ScalarType::F32;
    Some(match op {
        Add => format!("({a} + {b})"),
        Sub => format!("({a} - {b})"),
        Mul => format!("({a} * {b})"),
        Div => format!("({a} / {b})"),
        Rem => {
            if f {
                format!("fmodf({a}, {b})")
            } else {
                format!("fmod({a}, {b})")
            }
        }
        Max => {
            if f {
                format!("xpu_maxf({a}, {b})")
            } else {
                format!("xpu_max({a}, {b})")
            }
        }
        Min => {
            if f {
                format!("xpu_minf({a}, {b})")
            } else {
                format!("xpu_min({a}, {b})")
            }
        }
        Pow => {
            if f {
                format!("powf({a}, {b})")
            } else {
                format!("pow({a}, {b})")
            }
        }
        And | Or | Xor => return None,
    })
}

/// A reduction's combine: integer and arithmetic ones as the binary op; float max/min the
/// symmetric forms (`xpu_rmax*`, the same bits whichever operand comes first).
fn combine(op: ReduceOp, t: ScalarType, a: &str, b: &str) -> Option<String> {
    let single = matches!(t, ScalarType::F32 | ScalarType::F16 | ScalarType::BF16);
    let bop = match op {
        ReduceOp::Add => BinaryOp::Add,
        ReduceOp::Mul => BinaryOp::Mul,
        ReduceOp::Max if t.is_float() => {
            return Some(format!("xpu_rmax{}({a}, {b})", if single { "f" } else { "" }));
        }
        ReduceOp::Min if t.is_float() => {
            return Some(format!("xpu_rmin{}({a}, {b})", if single { "f" } else { "" }));
        }
        ReduceOp::Max => BinaryOp::Max,
        ReduceOp::Min => BinaryOp::Min,
    };
    binary(bop, t, a, b)
}

fn cast(from: ScalarType, to: ScalarType, x: &str) -> String {
    match (from, to) {
        (_, ScalarType::Bool) if from.is_float() => format!("({x} != 0 || {x} != {x})"),
        (_, ScalarType::Bool) => format!("({x} != 0)"),
        (f, ScalarType::I32 | ScalarType::I64) if f.is_float() => {
            format!("({})xpu_f2i((double){x})", c_type(to))
        }
        _ => format!("({}){x}", c_type(to)),
    }
}
