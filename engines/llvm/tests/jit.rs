//! Generated code against the LIR-ML interpreter (the oracle), bit for bit, and the inline
//! f32 math against libm.

use std::sync::Arc;

use xpu_engine::HostCpu;
use xpu_engine_llvm::cache::CodeCache;
use xpu_engine_llvm::codegen;
use xpu_engine_llvm::{Target, cache};
use xpu_lir::interp::{self, Value};
use xpu_lir::{Kernel, ScalarType};

fn code_cache() -> Arc<CodeCache> {
    code_cache_for(Target::host())
}

fn code_cache_for(target: Target) -> Arc<CodeCache> {
    let linker = cache::find_linker().expect("a linker (make setup installs gcc)");
    Arc::new(CodeCache::new(target, None, linker).unwrap())
}

/// The host's own code, and where the host has AVX-512, the same kernels held to
/// `x86-64-v3` too (256-bit vectors, what a host without AVX-512 runs): both must give the
/// interpreter's bits.
fn code_caches() -> Vec<Arc<CodeCache>> {
    let mut caches = vec![code_cache()];
    if let Ok(avx2) = Target::host_for(HostCpu::X86_64V3)
        && avx2.vector_bits() != caches[0].target.vector_bits()
    {
        caches.push(code_cache_for(avx2));
    }
    caches
}

/// Buffers as raw little-endian bytes of their element type.
fn to_bytes(elem: ScalarType, vals: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        match (elem, v) {
            (ScalarType::F32, Value::F32(x)) => out.extend(x.to_le_bytes()),
            (ScalarType::F64, Value::F64(x)) => out.extend(x.to_le_bytes()),
            (ScalarType::I32, Value::I32(x)) => out.extend(x.to_le_bytes()),
            (ScalarType::I64, Value::I64(x)) => out.extend(x.to_le_bytes()),
            (ScalarType::Bool, Value::Bool(x)) => out.push(*x as u8),
            (ScalarType::F16, Value::F32(x)) => out.extend(half::f16::from_f32(*x).to_le_bytes()),
            (ScalarType::BF16, Value::F32(x)) => out.extend(half::bf16::from_f32(*x).to_le_bytes()),
            other => panic!("no bytes for {other:?}"),
        }
    }
    out
}

fn from_bytes(elem: ScalarType, bytes: &[u8]) -> Vec<Value> {
    let n = elem.size();
    bytes
        .chunks_exact(n)
        .map(|c| match elem {
            ScalarType::F32 => Value::F32(f32::from_le_bytes(c.try_into().unwrap())),
            ScalarType::F64 => Value::F64(f64::from_le_bytes(c.try_into().unwrap())),
            ScalarType::I32 => Value::I32(i32::from_le_bytes(c.try_into().unwrap())),
            ScalarType::I64 => Value::I64(i64::from_le_bytes(c.try_into().unwrap())),
            ScalarType::Bool => Value::Bool(c[0] != 0),
            ScalarType::F16 => Value::F32(half::f16::from_le_bytes(c.try_into().unwrap()).to_f32()),
            ScalarType::BF16 => {
                Value::F32(half::bf16::from_le_bytes(c.try_into().unwrap()).to_f32())
            }
        })
        .collect()
}

/// Runs `kernel` compiled, one thread, every stage over its whole range.
fn run_compiled(cache: &CodeCache, kernel: &Kernel, syms: &[i64], buffers: &mut [Vec<Value>]) {
    let emitted =
        codegen::emit(kernel, cache.target.vector_bits()).unwrap_or_else(|e| panic!("{e}"));
    let (code, _, _) = cache.get(&emitted.ir).unwrap_or_else(|e| panic!("{e}\n{}", emitted.ir));
    let mut raw: Vec<Vec<u8>> =
        kernel.buffers.iter().zip(buffers.iter()).map(|(b, v)| to_bytes(b.elem, v)).collect();
    let ptrs: Vec<*mut u8> = raw.iter_mut().map(|r| r.as_mut_ptr()).collect();
    for stage in &emitted.stages {
        let f = code.stage(&stage.symbol).unwrap();
        let (lo, hi) = match &stage.parallel {
            Some((lo, hi)) => (eval(lo, kernel, syms), eval(hi, kernel, syms)),
            None => (0, 0),
        };
        // SAFETY: the buffers have the kernel's element types and the sizes its shapes
        // give for `syms` (the test builds them so), which the verifier proved sufficient.
        unsafe { f(ptrs.as_ptr(), syms.as_ptr(), lo, hi) };
    }
    for ((b, v), r) in kernel.buffers.iter().zip(buffers.iter_mut()).zip(&raw) {
        *v = from_bytes(b.elem, r);
    }
}

fn eval(a: &xpu_lir::Affine, k: &Kernel, syms: &[i64]) -> i64 {
    a.terms().iter().fold(a.constant, |acc, (v, c)| match v {
        xpu_lir::Var::Sym(s) => acc + c * syms[k.syms.iter().position(|x| x == s).unwrap()],
        xpu_lir::Var::Loop(_) => panic!("a loop index in a parallel bound"),
    })
}

fn bits(v: &Value) -> u64 {
    match v {
        Value::F32(x) => x.to_bits() as u64,
        Value::F64(x) => x.to_bits(),
        Value::I32(x) => *x as u32 as u64,
        Value::I64(x) => *x as u64,
        Value::Bool(b) => *b as u64,
    }
}

/// xorshift floats in [lo, hi), with the edge values mixed in.
fn floats(n: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect();
    let edges =
        [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e-40, 88.8, -104.5];
    for (i, e) in edges.iter().enumerate() {
        if i < v.len() {
            v[i * 7 % n] = *e;
        }
    }
    v
}

/// Runs the file's kernel compiled and interpreted on the same inputs; every output
/// element must have the same bits.
fn check_same_as_interpreter(src: &str, syms: &[i64], inputs: Vec<Vec<Value>>) {
    let module = xpu_lir::parse(src).unwrap_or_else(|e| panic!("{e}"));
    xpu_lir::verify(&module).unwrap();
    let kernel = &module.kernels[0];
    let mut want = inputs.clone();
    interp::run(kernel, syms, &mut want).unwrap();
    for cache in code_caches() {
        let mut got = inputs.clone();
        run_compiled(&cache, kernel, syms, &mut got);
        for (b, (w, g)) in kernel.buffers.iter().zip(want.iter().zip(&got)) {
            for (i, (x, y)) in w.iter().zip(g).enumerate() {
                // f64 transcendental functions are the platform libm's (glibc in compiled
                // code, the libm crate in the interpreter): they may differ in the last bit.
                let slack = if matches!(x, Value::F64(_)) { 2 } else { 0 };
                assert!(
                    bits(x).abs_diff(bits(y)) <= slack,
                    "@{} %{}[{i}] ({}): interpreter {x:?}, compiled {y:?}",
                    kernel.name,
                    b.name,
                    cache.target.cpu
                );
            }
        }
    }
}

#[test]
fn softmax_rows_compiled_match_the_interpreter_bit_for_bit() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/filetests/lir/softmax.lir"
    ))
    .unwrap();
    let rows = 3;
    let mut x: Vec<Value> =
        floats(rows * 1000, -20.0, 20.0, 7).into_iter().map(Value::F32).collect();
    // One row with a NaN, one with an infinity, one plain.
    x[5] = Value::F32(f32::NAN);
    x[1000 + 17] = Value::F32(f32::INFINITY);
    for v in x.iter_mut().skip(2000) {
        if let Value::F32(f) = v
            && !f.is_finite()
        {
            *v = Value::F32(1.0);
        }
    }
    let y = vec![Value::F32(0.0); rows * 1000];
    check_same_as_interpreter(&src, &[rows as i64], vec![x, y]);
}

/// A NaN of either sign, with or without a payload, through every f32 transcendental
/// function: compiled code gives the interpreter's bits, and `exp` keeps the input's sign
/// (as numpy's `exp(nan)` is `nan`). Elementwise only: where a reduction meets NaNs of
/// different signs, which one survives depends on the order of the adds.
#[test]
fn nans_through_the_transcendental_functions_keep_their_bits() {
    // One row of `y` per function, exp first.
    let functions = ["exp", "log", "tanh", "erf", "log1p", "expm1", "softplus", "expp1"];
    let rows: String = functions
        .iter()
        .enumerate()
        .map(|(r, f)| format!("    %v{r} = {f} %a\n    store %y[{r}, %i], %v{r}\n"))
        .collect();
    let src = format!(
        "kernel @nan_fns(%x: f32[8] in, %y: f32[{}, 8] out) {{\n  for %i in 0..8 {{\n    %a = load %x[%i]\n{rows}  }}\n}}\n",
        functions.len()
    );
    let nans = [0x7fc0_0000u32, 0xffc0_0000, 0x7fc0_1234, 0xffc0_1234, 0x7f80_0001];
    let mut x: Vec<Value> = nans.iter().map(|&b| Value::F32(f32::from_bits(b))).collect();
    x.extend([Value::F32(1.5), Value::F32(-2.0), Value::F32(0.0)]);
    let y = vec![Value::F32(0.0); functions.len() * 8];
    check_same_as_interpreter(&src, &[], vec![x.clone(), y.clone()]);
    let module = xpu_lir::parse(&src).unwrap();
    let mut got = vec![x, y];
    run_compiled(&code_cache(), &module.kernels[0], &[], &mut got);
    for (i, &b) in nans.iter().enumerate() {
        let Value::F32(e) = got[1][i] else { panic!("f32 output") };
        assert!(
            e.is_nan() && e.is_sign_negative() == (b >> 31 == 1),
            "exp({b:#x}) = {:#x}",
            e.to_bits()
        );
    }
}

/// softplus across its cut (the log1p term kept while n ≥ −125, |x| up to about 86.98) and
/// far past it, where lanes compute exponent garbage that the select must drop: compiled
/// = interpreted bit for bit, at every width the host runs.
#[test]
fn softplus_across_its_cut_matches_the_interpreter() {
    let mut x: Vec<f32> = (0..=400).map(|i| 86.8 + i as f32 * 0.001).collect();
    x.extend((0..=2000).map(|i| -100.0 + i as f32 * 0.1));
    x.extend([88.72, 88.8, 89.0, 1e30, f32::MAX, f32::INFINITY, 0.0, f32::MIN_POSITIVE, 1e-30]);
    x.extend(x.clone().into_iter().map(|v| -v).collect::<Vec<_>>());
    x.extend([f32::NAN, -f32::NAN]);
    let n = x.len();
    let src = format!(
        "kernel @softplus_cut(%x: f32[{n}] in, %y: f32[{n}] out) {{\n  for %i in 0..{n} {{\n    %a = load %x[%i]\n    %s = softplus %a\n    store %y[%i], %s\n  }}\n}}\n"
    );
    let inputs = vec![x.into_iter().map(Value::F32).collect(), vec![Value::F32(0.0); n]];
    check_same_as_interpreter(&src, &[], inputs);
}

/// `exp` of a value a `min` with a constant holds at most `EXP_MAX` skips its own upper
/// clamp (Mish's `min(v, 10)`); a larger constant keeps it. Both give the interpreter's
/// bits, NaNs and infinities included.
#[test]
fn exp_after_a_min_with_a_constant_matches_the_interpreter() {
    let mut x: Vec<f32> = (0..=2400).map(|i| -120.0 + i as f32 * 0.1).collect();
    x.extend([88.9, 89.0, 89.1, 1e30, f32::MAX, f32::INFINITY, f32::NEG_INFINITY]);
    x.extend([f32::NAN, -f32::NAN, f32::from_bits(0x7fc0_1234)]);
    let n = x.len();
    let src = format!(
        "kernel @exp_min(%x: f32[{n}] in, %y: f32[3, {n}] out) {{\n  for %i in 0..{n} {{\n    %a = load %x[%i]\n    %c10 = const 10.0 : f32\n    %m10 = min %a, %c10\n    %e10 = exp %m10\n    store %y[0, %i], %e10\n    %c89 = const 89.0 : f32\n    %m89 = min %a, %c89\n    %e89 = exp %m89\n    store %y[1, %i], %e89\n    %c95 = const 95.0 : f32\n    %m95 = min %a, %c95\n    %e95 = exp %m95\n    store %y[2, %i], %e95\n  }}\n}}\n"
    );
    let module = xpu_lir::parse(&src).unwrap();
    let (ir, _) = codegen::emit_module(&module.kernels, 256).unwrap();
    // The first two skip the clamp; the third (95 > EXP_MAX) keeps it.
    assert_eq!(ir.matches("call float @xpu.expf_at_most_max(").count(), 3, "{ir}");
    assert_eq!(ir.matches("call float @xpu.expf(").count(), 1, "{ir}");
    let inputs = vec![x.into_iter().map(Value::F32).collect(), vec![Value::F32(0.0); 3 * n]];
    check_same_as_interpreter(&src, &[], inputs);
}

/// Every kernel of a file, each on inputs made from its buffer types.
fn check_file_against_interpreter(path: &str, syms: &[i64]) {
    let src = std::fs::read_to_string(path).unwrap();
    let module = xpu_lir::parse(&src).unwrap();
    for (n, k) in module.kernels.iter().enumerate() {
        let one = xpu_lir::Module { kernels: vec![k.clone()] };
        let syms: Vec<i64> = syms.iter().copied().take(k.syms.len()).collect();
        let inputs: Vec<Vec<Value>> = k
            .buffers
            .iter()
            .enumerate()
            .map(|(b, buf)| {
                let len: i64 = buf.shape.iter().map(|d| eval(d, k, &syms)).product();
                sample(buf.elem, len as usize, (n * 31 + b) as u64 + 1)
            })
            .collect();
        check_same_as_interpreter(&one.to_string(), &syms, inputs);
    }
}

/// Values of `elem` spread over a wide range, edge values included.
fn sample(elem: ScalarType, len: usize, seed: u64) -> Vec<Value> {
    let f = floats(len.max(1), -12.0, 12.0, seed);
    f.into_iter()
        .take(len)
        .enumerate()
        .map(|(i, x)| match elem {
            ScalarType::F32 | ScalarType::F16 | ScalarType::BF16 => Value::F32(x),
            ScalarType::F64 => Value::F64(x as f64 * 1.000_000_1),
            ScalarType::I32 => Value::I32((x * 1000.0) as i32),
            ScalarType::I64 => Value::I64((x * 1e6) as i64),
            ScalarType::Bool => Value::Bool(i % 3 == 0),
        })
        .map(|v| match (elem, v) {
            // What the buffer can hold: f16/bf16 inputs are rounded on the way in.
            (ScalarType::F16, Value::F32(x)) => Value::F32(half::f16::from_f32(x).to_f32()),
            (ScalarType::BF16, Value::F32(x)) => Value::F32(half::bf16::from_f32(x).to_f32()),
            (_, v) => v,
        })
        .collect()
}

#[test]
fn golden_lir_files_compiled_match_the_interpreter() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/filetests/lir/");
    check_file_against_interpreter(&format!("{dir}bias_gelu.lir"), &[37]);
    check_file_against_interpreter(&format!("{dir}softmax.lir"), &[5]);
}

/// One kernel per op family over the same inputs: float math (the inline routines),
/// arithmetic-heavy loops over big buffers (prefetched in blocks, a remainder after them),
/// NaN-propagating max/min (of two values, and with a constant on either side), compares
/// and selects, casts (saturating, NaN → 0), f16/bf16 and bool stores, f64 through libm,
/// integer arithmetic, and a reduction whose length is not a multiple of its lanes.
const OPS: &str = r#"
kernel @float_math(%x: f32[4099] in, %w: f32[4099] in, %y: f32[19, 4099] out) {
  for %i in 0..4099 parallel {
    %a = load %x[%i]
    %b = load %w[%i]
    %e = exp %a
    store %y[0, %i], %e
    %l = log %a
    store %y[1, %i], %l
    %t = tanh %a
    store %y[2, %i], %t
    %r = erf %a
    store %y[3, %i], %r
    %p = log1p %a
    store %y[4, %i], %p
    %m = expm1 %a
    store %y[5, %i], %m
    %mx = max %a, %b
    store %y[6, %i], %mx
    %mn = min %a, %b
    store %y[7, %i], %mn
    %s = sqrt %a
    store %y[8, %i], %s
    %rd = round %a
    store %y[9, %i], %rd
    %sg = sign %a
    store %y[10, %i], %sg
    %rm = rem %a, %b
    store %y[11, %i], %rm
    %pw = pow %a, %b
    store %y[12, %i], %pw
    %rc = recip %a
    store %y[13, %i], %rc
    %three = const 3.0 : f32
    %mxc = max %a, %three
    store %y[14, %i], %mxc
    %mnc = min %a, %three
    store %y[15, %i], %mnc
    %cmx = max %three, %a
    store %y[16, %i], %cmx
    %cmn = min %three, %a
    store %y[17, %i], %cmn
    %ep = expp1 %a
    store %y[18, %i], %ep
  }
}

kernel @casts_and_stores(%x: f32[777] in, %h: f16[777] out, %bf: bf16[777] out, %i: i32[777] out, %q: i64[777] out, %n: bool[777] out, %d: f64[777] out) {
  for %k in 0..777 {
    %a = load %x[%k]
    %big = const 1.0e10 : f32
    %s = mul %a, %big
    store %h[%k], %a
    store %bf[%k], %a
    %c = cast %s to i32
    store %i[%k], %c
    %c64 = cast %s to i64
    store %q[%k], %c64
    %nan = isnan %a
    %inf = isinf %s
    %either = or %nan, %inf
    store %n[%k], %either
    %w = cast %a to f64
    %t = tanh %w
    %e = erf %w
    %sum = add %t, %e
    %ep = expp1 %w
    %sum2 = add %sum, %ep
    store %d[%k], %sum2
  }
}

kernel @ints(%a: i32[300] in, %b: i32[300] in, %y: i32[6, 300] out) {
  for %k in 0..300 {
    %x = load %a[%k]
    %z = load %b[%k]
    %s = sub %x, %z
    store %y[0, %k], %s
    %m = mul %x, %z
    store %y[1, %k], %m
    %mx = max %x, %z
    store %y[2, %k], %mx
    %ab = abs %x
    store %y[3, %k], %ab
    %sg = sign %z
    store %y[4, %k], %sg
    %x1 = xor %x, %z
    store %y[5, %k], %x1
  }
}

kernel @streams(%x: f32[37, 1003] in, %b: f32[1003] in, %y: f32[37, 1003] out) {
  for %i in 0..37 parallel {
    for %j in 0..1003 {
      %a = load %x[%i, %j]
      %c = load %b[%j]
      %v = add %a, %c
      %e = exp %v
      %s = mul %v, %e
      store %y[%i, %j], %s
    }
  }
}

kernel @flat_stream(%x: f32[40003] in, %y: f32[40003] out) {
  for %k in 0..40003 parallel {
    %a = load %x[%k]
    %t = tanh %a
    store %y[%k], %t
  }
}

kernel @row_sums[?n](%x: f32[?n, 1003] in, %y: f32[?n] out, %m: f32[?n] out) {
  for %i in 0..?n parallel {
    %s = reduce add : f32 lanes 8 init 0.0 for %j in 0..1003 {
      %a = load %x[%i, %j]
      %e = exp %a
      yield %e
    }
    store %y[%i], %s
    %t = reduce max : f32 lanes 4 init -inf for %k in 0..1003 {
      %b = load %x[%i, %k]
      yield %b
    }
    store %m[%i], %t
  }
}
"#;

#[test]
fn every_op_family_compiled_matches_the_interpreter() {
    let path = std::env::temp_dir().join(format!("xpu-llvm-ops-{}.lir", std::process::id()));
    std::fs::write(&path, OPS).unwrap();
    check_file_against_interpreter(path.to_str().unwrap(), &[6]);
    let _ = std::fs::remove_file(path);
}

/// Only arithmetic-heavy loops over a few big buffers prefetch, and only those buffers: a
/// loop of plain arithmetic (a triad), over small buffers or over many streams is emitted
/// as it was.
#[test]
fn only_heavy_loops_over_big_buffers_prefetch() {
    let module = xpu_lir::parse(OPS).unwrap();
    let emit = |name: &str, vector_bits| {
        let k = module.kernels.iter().find(|k| k.name == name).unwrap();
        codegen::emit(k, vector_bits).unwrap().ir
    };
    let ir = |name: &str| emit(name, 256);
    let prefetches = |ir: &str| ir.matches("call void @llvm.prefetch.p0(").count();
    // %x and %y, 2 lines a block each (32 f32); the bias row is not a stream.
    assert_eq!(prefetches(&ir("streams")), 4, "{}", ir("streams"));
    // A block is one vectorised iteration: 2 × 16 f32 with 512-bit vectors (2 lines a
    // stream), 4 × 4 with 128-bit ones (1 line).
    let wide = emit("streams", 512);
    assert_eq!(prefetches(&wide), 4, "{wide}");
    assert!(wide.contains("!\"llvm.loop.interleave.count\", i32 2}"), "{wide}");
    assert!(ir("streams").contains("!\"llvm.loop.interleave.count\", i32 4}"));
    assert_eq!(prefetches(&emit("streams", 128)), 2);
    assert_eq!(prefetches(&ir("flat_stream")), 4);
    assert!(ir("streams").contains("i32 1, i32 3, i32 1)"), "the output is prefetched for writing");
    assert_eq!(prefetches(&ir("float_math")), 0, "19 output rows: more streams than pay");
    let triad = xpu_lir::parse(
        "kernel @triad(%b: f32[65536] in, %c: f32[65536] in, %a: f32[65536] out) {\n  for %i in 0..65536 parallel {\n    %x = load %b[%i]\n    %y = load %c[%i]\n    %k = const 3.0 : f32\n    %z = mul %y, %k\n    %s = add %x, %z\n    store %a[%i], %s\n  }\n}\n",
    )
    .unwrap();
    assert_eq!(prefetches(&codegen::emit(&triad.kernels[0], 256).unwrap().ir), 0, "memory-bound");
}

#[test]
fn a_second_cache_on_the_same_directory_compiles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let linker = cache::find_linker().unwrap();
    let module = xpu_lir::parse(OPS).unwrap();
    let ir = codegen::emit(&module.kernels[0], 256).unwrap().ir;
    let first = CodeCache::new(Target::host(), Some(dir.path().into()), linker.clone()).unwrap();
    let (_, source, _) = first.get(&ir).unwrap();
    assert_eq!(source, cache::Source::Compiled);
    let (_, again, _) = first.get(&ir).unwrap();
    assert_eq!(again, cache::Source::Memory);
    // A new cache (as a new process would make) finds the shared object on disk.
    let second = CodeCache::new(Target::host(), Some(dir.path().into()), linker.clone()).unwrap();
    let (code, source, _) = second.get(&ir).unwrap();
    assert_eq!(source, cache::Source::Disk);
    assert!(code.stage("xpu_float_math_s0").is_ok());
    // A cached file that no longer loads (a later process finds it damaged) is rebuilt,
    // not an error. Nothing here may hold it loaded, and it is replaced by a rename, as
    // the cache itself writes, never rewritten in place under a mapping.
    let key = second.key(&ir);
    drop((code, first, second));
    let so = dir.path().join(format!("{key}.so"));
    let damaged = dir.path().join("damaged.tmp");
    std::fs::write(&damaged, b"truncated").unwrap();
    std::fs::rename(&damaged, &so).unwrap();
    let later = CodeCache::new(Target::host(), Some(dir.path().into()), linker).unwrap();
    let (code, source, _) = later.get(&ir).unwrap();
    assert_eq!(source, cache::Source::Compiled, "the damaged file was rebuilt");
    assert!(code.stage("xpu_float_math_s0").is_ok());
    drop(code);
    // A different CPU is a different key.
    let mut other = Target::host();
    other.cpu = "x86-64".into();
    other.features = String::new();
    let third =
        CodeCache::new(other, Some(dir.path().into()), cache::find_linker().unwrap()).unwrap();
    assert_ne!(third.key(&ir), key);
}

#[test]
fn bad_ir_is_an_error_naming_what_llvm_said() {
    let cache = code_cache();
    let err = cache.get("define void @f( {").err().expect("garbage does not compile");
    let msg = err.to_string();
    assert!(msg.contains("could not parse"), "{msg}");
}
