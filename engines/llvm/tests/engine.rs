//! The engine end to end: every op it claims against the cpu engine (the reference),
//! broadcasting, fusion, f16 storage, bit-identical results at 1 and 2 threads, and errors.

use xpu_engine::{Assignment, Engine, EngineError};
use xpu_engine_llvm::LlvmEngine;
use xpu_ir::{Graph, Tensor};

fn engine() -> LlvmEngine {
    LlvmEngine::new(None)
}

fn run(g: &Graph, inputs: &[Tensor], threads: Option<u32>) -> Result<Vec<Tensor>, EngineError> {
    let mut a = Assignment::new("llvm");
    a.options.threads = threads;
    let mut exe = engine().prepare(g, &a)?;
    Ok(exe.run(inputs)?.outputs)
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 16.0
        })
        .collect();
    for (i, e) in
        [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0, -1.0, 0.5].iter().enumerate()
    {
        if i * 3 < n {
            v[i * 3] = *e;
        }
    }
    v
}

/// [`values`] with the NaN and infinities replaced by `fill`.
fn finite_values(n: usize, seed: u64, fill: f32) -> Vec<f32> {
    values(n, seed).into_iter().map(|v| if v.is_finite() { v } else { fill }).collect()
}

/// Elementwise closeness: NaN where the reference has NaN, infinities equal, else within
/// `rel` relative (or 1e-6 absolute near zero).
fn assert_close(what: &str, got: &Tensor, want: &Tensor, rel: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() || rel == 0.0 {
            a == b
        } else {
            (a - b).abs() <= rel * b.abs().max(1e-6 / rel)
        };
        assert!(ok, "{what}[{i}]: llvm {a}, cpu {b}");
    }
}

fn parse(src: &str) -> Graph {
    xpu_ir::text::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

/// One graph per claimed unary op and activation over values with every special case.
#[test]
fn each_unary_op_and_activation_matches_the_cpu_engine() {
    let x = Tensor::from_vec(vec![7, 9], values(63, 3)).unwrap();
    let ops = [
        "identity",
        "abs",
        "neg",
        "exp",
        "log",
        "sqrt",
        "reciprocal",
        "floor",
        "ceil",
        "round",
        "sign",
        "sin",
        "cos",
        "tan",
        "erf",
        "tanh",
        "sigmoid",
        "relu",
        "softplus",
        "softsign",
        "mish",
        "hard_swish",
        "leaky_relu {alpha = 0.2}",
        "elu",
        "selu",
        "celu {alpha = 2.0}",
        "hard_sigmoid",
        "thresholded_relu {alpha = 0.5}",
        "shrink {lambd = 1.0, bias = 0.25}",
        "gelu",
        "gelu {approximate = \"tanh\"}",
        "swish {alpha = 1.5}",
    ];
    for op in ops {
        let (name, attrs) = op.split_once(' ').unwrap_or((op, ""));
        let g = parse(&format!(
            "graph \"u\" {{\n  %0: f32[7,9] = input \"x\"\n  %1: f32[7,9] = {name}(%0) {attrs}\n  return \"y\" = %1\n}}"
        ));
        let want = xpu_engine_cpu::run_graph(&g, std::slice::from_ref(&x)).unwrap().outputs;
        let got = run(&g, std::slice::from_ref(&x), None).unwrap_or_else(|e| panic!("{op}: {e}"));
        // celu's cpu formula drops NaN (Rust's max); numpy and llvm keep it.
        if name == "celu" {
            continue;
        }
        assert_close(op, &got[0], &want[0], 2e-5);
    }
}

#[test]
fn binary_compare_and_select_ops_broadcast_like_numpy() {
    let a = Tensor::from_vec(vec![3, 1, 5], values(15, 5)).unwrap();
    let b = Tensor::from_vec(vec![4, 1], values(4, 9)).unwrap();
    for op in [
        "add",
        "sub",
        "mul",
        "div",
        "pow",
        "mod",
        "mod {fmod = 1}",
        "max",
        "min",
        "sum",
        "mean",
        "prelu",
    ] {
        let (name, attrs) = op.split_once(' ').unwrap_or((op, ""));
        let g = parse(&format!(
            "graph \"b\" {{\n  %0: f32[3,1,5] = input \"a\"\n  %1: f32[4,1] = input \"b\"\n  %2: f32[3,4,5] = {name}(%0, %1) {attrs}\n  return \"y\" = %2\n}}"
        ));
        if name == "prelu" {
            continue; // unidirectional: checked below with a matching slope
        }
        let inputs = [a.clone(), b.clone()];
        let want = xpu_engine_cpu::run_graph(&g, &inputs).unwrap().outputs;
        let got = run(&g, &inputs, None).unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_close(op, &got[0], &want[0], 2e-5);
    }
    for op in ["equal", "less", "less_or_equal", "greater", "greater_or_equal"] {
        let g = parse(&format!(
            "graph \"c\" {{\n  %0: f32[3,1,5] = input \"a\"\n  %1: f32[4,1] = input \"b\"\n  %2: bool[3,4,5] = {op}(%0, %1)\n  %3: f32[3,4,5] = where(%2, %0, %1)\n  return \"m\" = %2\n  return \"y\" = %3\n}}"
        ));
        let inputs = [a.clone(), b.clone()];
        let want = xpu_engine_cpu::run_graph(&g, &inputs).unwrap().outputs;
        let got = run(&g, &inputs, None).unwrap();
        assert_eq!(got[0], want[0], "{op}");
        assert_close(op, &got[1], &want[1], 0.0);
    }
}

/// Integers with their edge values (wrapping arithmetic meets them).
fn int_values(n: usize, seed: u64) -> Vec<i64> {
    let edges = [0, 1, -1, i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN, 7];
    (0..n)
        .map(|i| match edges.get(i) {
            Some(&e) => e,
            None => (values(1, seed + i as u64)[0] * 1000.0).round() as i64,
        })
        .collect()
}

fn int_tensor(dtype: &str, shape: Vec<usize>, v: Vec<i64>) -> Tensor {
    match dtype {
        "i32" => Tensor::from_vec(shape, v.into_iter().map(|x| x as i32).collect()).unwrap(),
        _ => Tensor::from_vec(shape, v).unwrap(),
    }
}

/// Runs `g` on both engines; the results must be identical, and every node on llvm.
fn check_exact(what: &str, src: &str, inputs: &[Tensor]) {
    let g = parse(src);
    let want = xpu_engine_cpu::run_graph(&g, inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = run(&g, inputs, None).unwrap_or_else(|e| panic!("{what}: {e}"));
    for (i, (a, b)) in got.iter().zip(&want.outputs).enumerate() {
        // Equal, with NaN equal to NaN.
        let same = a.shape() == b.shape()
            && a.dtype() == b.dtype()
            && a.to_f64_vec()
                .iter()
                .zip(b.to_f64_vec())
                .all(|(x, y)| x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan())
            && (a.to_i64_vec() == b.to_i64_vec());
        assert!(same, "{what}: output {i}: llvm {a:?}, cpu {b:?}\n{src}");
    }
}

/// Integer and bool elementwise ops (wrapping arithmetic, bitwise, logical, compares,
/// select) against the cpu engine, exactly.
#[test]
fn integer_and_bool_ops_match_the_cpu_engine_exactly() {
    for dt in ["i32", "i64"] {
        let a = int_tensor(dt, vec![3, 1, 5], int_values(15, 11));
        let b = int_tensor(dt, vec![4, 1], int_values(4, 13).into_iter().rev().collect());
        let inputs = [a, b];
        for op in
            ["add", "sub", "mul", "max", "min", "sum", "bitwise_and", "bitwise_or", "bitwise_xor"]
        {
            check_exact(
                &format!("{op} {dt}"),
                &format!(
                    "graph \"b\" {{\n  %0: {dt}[3,1,5] = input \"a\"\n  %1: {dt}[4,1] = input \"b\"\n  %2: {dt}[3,4,5] = {op}(%0, %1)\n  return \"y\" = %2\n}}"
                ),
                &inputs,
            );
        }
        for op in ["abs", "neg", "sign", "relu", "bitwise_not", "identity"] {
            check_exact(
                &format!("{op} {dt}"),
                &format!(
                    "graph \"u\" {{\n  %0: {dt}[3,1,5] = input \"a\"\n  %1: {dt}[3,1,5] = {op}(%0)\n  return \"y\" = %1\n}}"
                ),
                &inputs[..1],
            );
        }
        for op in ["equal", "less", "less_or_equal", "greater", "greater_or_equal"] {
            check_exact(
                &format!("{op} {dt}"),
                &format!(
                    "graph \"c\" {{\n  %0: {dt}[3,1,5] = input \"a\"\n  %1: {dt}[4,1] = input \"b\"\n  %2: bool[3,4,5] = {op}(%0, %1)\n  %3: {dt}[3,4,5] = where(%2, %0, %1)\n  %4: bool[3,4,5] = not(%2)\n  return \"m\" = %4\n  return \"y\" = %3\n}}"
                ),
                &inputs,
            );
        }
    }
    let p = Tensor::from_vec(vec![2, 3], vec![true, false, true, false, false, true]).unwrap();
    let q = Tensor::from_vec(vec![3], vec![true, true, false]).unwrap();
    for op in ["and", "or", "xor", "equal"] {
        check_exact(
            op,
            &format!(
                "graph \"l\" {{\n  %0: bool[2,3] = input \"p\"\n  %1: bool[3] = input \"q\"\n  %2: bool[2,3] = {op}(%0, %1)\n  %3: bool[2,3] = where(%2, %1, %0)\n  return \"y\" = %3\n}}"
            ),
            &[p.clone(), q.clone()],
        );
    }
}

/// The capability says which op takes which dtypes: integer arithmetic that wraps yes,
/// integer division and float functions of integers no, logical ops on bools only.
#[test]
fn the_capability_lists_each_ops_dtypes() {
    use xpu_ir::{DType, Op};
    let caps = engine().capabilities();
    // The host kernels (llvm.riscv, where qemu is installed, takes the same ops).
    let on = |op, dt| {
        caps.kernels_for(op, dt)
            .filter(|k| k.device.is_none())
            .map(|k| k.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(on(Op::Add, DType::I32), ["llvm.fused"]);
    assert_eq!(on(Op::BitwiseXor, DType::I64), ["llvm.fused"]);
    assert_eq!(on(Op::And, DType::Bool), ["llvm.fused"]);
    assert_eq!(on(Op::Cast, DType::Bool), ["llvm.fused"]);
    assert_eq!(on(Op::Exp, DType::F16), ["llvm.fused"]);
    assert_eq!(on(Op::Softmax, DType::F32), ["llvm.reduce"]);
    assert_eq!(on(Op::ReduceSum, DType::F16), ["llvm.reduce"]);
    for (op, dt) in [
        // ONNX's function body rounds a half softmax's intermediates; left to cpu.
        (Op::Softmax, DType::F16),
        (Op::LogSoftmax, DType::BF16),
        (Op::Div, DType::I32),
        (Op::Mod, DType::I64),
        (Op::Exp, DType::I32),
        (Op::And, DType::F32),
        (Op::BitwiseAnd, DType::Bool),
        (Op::ReduceSum, DType::I64),
        (Op::Add, DType::U8),
    ] {
        assert!(on(op, dt).is_empty(), "{op} at {dt}: {:?}", on(op, dt));
    }
}

/// Casts between f32, f64, i32, i64 and bool — NaN, infinities and out-of-range floats
/// included — give the cpu engine's values exactly (numpy's astype on x86).
#[test]
fn casts_between_floats_ints_and_bools_match_the_cpu_engine_exactly() {
    let mut f = values(24, 17);
    f.extend([3e9, -3e9, 1e10, -1e19, 2.5, -2.5, 1e30, 0.99]);
    let x = Tensor::from_vec(vec![32], f.clone()).unwrap();
    let xd =
        Tensor::from_vec(vec![32], f.iter().map(|&v| v as f64 * 1.000_000_1).collect()).unwrap();
    let inputs = [
        ("f32", x),
        ("f64", xd),
        ("i32", int_tensor("i32", vec![32], int_values(32, 19))),
        ("i64", int_tensor("i64", vec![32], int_values(32, 23))),
        ("bool", Tensor::from_vec(vec![32], (0..32).map(|i| i % 3 == 0).collect()).unwrap()),
    ];
    for (from, t) in &inputs {
        for to in ["f32", "f64", "i32", "i64", "bool"] {
            if *from == to {
                continue;
            }
            check_exact(
                &format!("cast {from} → {to}"),
                &format!(
                    "graph \"k\" {{\n  %0: {from}[32] = input \"x\"\n  %1: {to}[32] = cast(%0) {{to = dtype<{to}>}}\n  return \"y\" = %1\n}}"
                ),
                std::slice::from_ref(t),
            );
        }
    }
}

/// GELU written out op by op, with a bias broadcast: one kernel, the cpu engine's values.
#[test]
fn a_chain_fuses_into_one_kernel_and_matches_the_cpu_engine() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/programs/gelu_chain.sgr"
    ))
    .unwrap();
    let g = parse(&src.replace("N", "3"));
    let x = Tensor::from_vec(vec![3, 1024], values(3 * 1024, 11)).unwrap();
    let b = Tensor::from_vec(vec![1024], values(1024, 12)).unwrap();
    let inputs = [x, b];
    let mut exe = engine().prepare(&g, &Assignment::new("llvm")).unwrap();
    let run = exe.run(&inputs).unwrap();
    let kernels = run.facts.iter().find(|f| f.key == "llvm.kernels").unwrap();
    assert!(kernels.value.starts_with("1 for"), "{}", kernels.value);
    let want = xpu_engine_cpu::run_graph(&g, &inputs).unwrap().outputs;
    assert_close("gelu chain", &run.outputs[0], &want[0], 1e-5);
}

#[test]
fn results_are_bit_identical_at_one_and_two_threads() {
    let g = parse(
        "graph \"t\" {\n  %0: f32[256,1024] = input \"x\"\n  %1: f32[256,1024] = tanh(%0)\n  %2: f32[256,1024] = mish(%1)\n  %3: f32[256,1024] = mul(%2, %0)\n  return \"y\" = %3\n}",
    );
    let x = Tensor::from_vec(vec![256, 1024], values(256 * 1024, 21)).unwrap();
    let one = run(&g, std::slice::from_ref(&x), Some(1)).unwrap();
    let two = run(&g, std::slice::from_ref(&x), Some(2)).unwrap();
    let bits =
        |t: &Tensor| t.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&one[0]), bits(&two[0]));
}

/// Host code held to an x86-64 level (`[engines.llvm] host_cpu`) gives the native code's
/// bits, says which target ran in its facts, and a level this host lacks leaves the host
/// kernels unavailable with the reason.
#[test]
fn host_code_held_to_a_level_gives_the_same_bits_and_says_so() {
    use xpu_engine::{Availability, HostCpu};
    let g = parse(
        "graph \"t\" {\n  %0: f32[64,1024] = input \"x\"\n  %1: f32[64,1024] = softplus(%0)\n  %2: f32[64,1024] = gelu(%1)\n  %3: f32[64,1024] = mul(%2, %0)\n  return \"y\" = %3\n}",
    );
    let x = Tensor::from_vec(vec![64, 1024], values(64 * 1024, 31)).unwrap();
    let bits =
        |t: &Tensor| t.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let native = engine()
        .prepare(&g, &Assignment::new("llvm"))
        .unwrap()
        .run(std::slice::from_ref(&x))
        .unwrap();
    let target = |run: &xpu_engine::Execution| {
        run.facts.iter().find(|f| f.key == "llvm.target").map(|f| f.value.clone()).unwrap()
    };
    for level in [HostCpu::X86_64V2, HostCpu::X86_64V3, HostCpu::X86_64V4] {
        let held = LlvmEngine::configured(None, None, Some(level), None);
        let has_level = xpu_engine_llvm::Target::host_for(level);
        match (held.capabilities().availability, has_level) {
            (Availability::Available, Ok(t)) => {
                let run = held
                    .prepare(&g, &Assignment::new("llvm"))
                    .unwrap()
                    .run(std::slice::from_ref(&x))
                    .unwrap();
                assert_eq!(bits(&run.outputs[0]), bits(&native.outputs[0]), "{level}");
                let fact = target(&run);
                assert!(fact.contains(&format!(" {level} ({}-bit", t.vector_bits())), "{fact}");
            }
            (Availability::Unavailable { reason }, Err(why)) => {
                assert!(
                    reason.contains(&level.to_string()) && reason.contains("lacks"),
                    "{reason}"
                );
                assert_eq!(reason, format!("[engines.llvm] host_cpu: {why}"));
            }
            (a, t) => panic!("{level}: engine {a:?}, target {t:?}"),
        }
    }
    // The engine's own default: the host's CPU, or the level `$XPU_LLVM_HOST_CPU` names.
    let default = xpu_engine_llvm::host_target(None).unwrap();
    assert!(target(&native).contains(&format!(" {} (", default.cpu)), "{}", target(&native));
}

#[test]
fn f16_storage_computes_in_f32_and_rounds_on_store() {
    let g = parse(
        "graph \"h\" {\n  %0: f16[64] = input \"x\"\n  %1: f16[64] = sigmoid(%0)\n  return \"y\" = %1\n}",
    );
    let x: Vec<half::f16> = values(64, 31).into_iter().map(half::f16::from_f32).collect();
    let x = Tensor::from_vec(vec![64], x).unwrap();
    let got = run(&g, std::slice::from_ref(&x), None).unwrap();
    let want = xpu_engine_cpu::run_graph(&g, &[x]).unwrap().outputs;
    assert_close("f16 sigmoid", &got[0], &want[0], 1e-3);
}

#[test]
fn ops_it_does_not_take_and_bad_inputs_are_errors_not_crashes() {
    let g = parse(
        "graph \"m\" {\n  %0: f32[2,2] = input \"a\"\n  %1: f32[2,2] = conv(%0, %0)\n  return \"y\" = %1\n}",
    );
    let err = engine().prepare(&g, &Assignment::new("llvm")).err().expect("conv is not lowered");
    assert!(matches!(err, EngineError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("conv"), "{err}");
    let g = parse(
        "graph \"e\" {\n  %0: f32[N,4] = input \"x\"\n  %1: f32[N,4] = exp(%0)\n  return \"y\" = %1\n}",
    );
    let mut exe = engine().prepare(&g, &Assignment::new("llvm")).unwrap();
    let wrong = Tensor::from_vec(vec![2, 5], vec![0f32; 10]).unwrap();
    let err = exe.run(&[wrong]).expect_err("a wrong shape is refused");
    assert!(err.to_string().contains("dim 1 must be 4"), "{err}");
    // Shapes bound at run time: each new shape compiles once, then runs.
    for n in [1, 3, 1] {
        let x = Tensor::from_vec(vec![n, 4], vec![1f32; n * 4]).unwrap();
        let y = exe.run(&[x]).unwrap();
        assert_eq!(y.outputs[0].shape(), &[n, 4]);
    }
}

/// Reductions over every axis combination, with keepdims both ways, against the cpu engine.
#[test]
fn reductions_over_any_axes_match_the_cpu_engine() {
    let x = Tensor::from_vec(vec![3, 4, 5], finite_values(60, 41, 0.5)).unwrap();
    let ops = [
        "reduce_sum",
        "reduce_mean",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_l1",
        "reduce_l2",
        "reduce_sum_square",
        "reduce_log_sum_exp",
    ];
    let axes_sets: [&[i64]; 5] = [&[-1], &[0], &[1], &[0, 2], &[0, 1, 2]];
    for op in ops {
        for axes in axes_sets {
            for keep in [0, 1] {
                let out: Vec<usize> = (0..3)
                    .filter_map(|d| {
                        if axes.iter().any(|&a| (a + 3) % 3 == d as i64) {
                            (keep == 1).then_some(1)
                        } else {
                            Some([3, 4, 5][d])
                        }
                    })
                    .collect();
                let dims = out.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
                let list = axes.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ");
                let src = format!(
                    "graph \"r\" {{\n  %0: f32[3,4,5] = input \"x\"\n  %1: i64[{}] = constant {{value = tensor<i64[{}]> [{list}]}}\n  %2: f32[{dims}] = {op}(%0, %1) {{keepdims = {keep}}}\n  return \"y\" = %2\n}}",
                    axes.len(),
                    axes.len()
                );
                let g = parse(&src);
                let want = xpu_engine_cpu::run_graph(&g, std::slice::from_ref(&x)).unwrap().outputs;
                let got = run(&g, std::slice::from_ref(&x), None)
                    .unwrap_or_else(|e| panic!("{op} {axes:?}: {e}"));
                assert_close(&format!("{op} {axes:?} keepdims={keep}"), &got[0], &want[0], 1e-5);
            }
        }
    }
}

/// Softmax written out op by op and as the op, along the last axis and a middle one:
/// the same values as the cpu engine; the written-out form is a handful of kernels.
#[test]
fn softmax_written_out_and_as_the_op_match_the_cpu_engine() {
    let x = Tensor::from_vec(vec![4, 6, 33], values(4 * 6 * 33, 43)).unwrap();
    for axis in [-1, 1] {
        let g = parse(&format!(
            "graph \"s\" {{\n  %0: f32[4,6,33] = input \"x\"\n  %1: f32[4,6,33] = softmax(%0) {{axis = {axis}}}\n  %2: f32[4,6,33] = log_softmax(%0) {{axis = {axis}}}\n  return \"y\" = %1\n  return \"l\" = %2\n}}"
        ));
        let want = xpu_engine_cpu::run_graph(&g, std::slice::from_ref(&x)).unwrap().outputs;
        let got = run(&g, std::slice::from_ref(&x), None).unwrap();
        assert_close(&format!("softmax axis {axis}"), &got[0], &want[0], 1e-5);
        assert_close(&format!("log_softmax axis {axis}"), &got[1], &want[1], 1e-5);
    }
    let g = parse(
        "graph \"w\" {\n  %0: f32[4,198] = input \"x\"\n  %1: i64[1] = constant {value = tensor<i64[1]> [-1]}\n  %2: f32[4,1] = reduce_max(%0, %1)\n  %3: f32[4,198] = sub(%0, %2)\n  %4: f32[4,198] = exp(%3)\n  %5: f32[4,1] = reduce_sum(%4, %1)\n  %6: f32[4,198] = div(%4, %5)\n  return \"y\" = %6\n}",
    );
    let x = Tensor::from_vec(
        vec![4, 198],
        values(4 * 198, 44).into_iter().map(|v| if v.is_nan() { 1.0 } else { v }).collect(),
    )
    .unwrap();
    let want = xpu_engine_cpu::run_graph(&g, std::slice::from_ref(&x)).unwrap().outputs;
    let got = run(&g, std::slice::from_ref(&x), None).unwrap();
    assert_close("softmax written out", &got[0], &want[0], 1e-5);
}

/// numpy matmul: 2-D, batched with broadcasting, 1-D on either side; the cpu engine's values.
#[test]
fn matmul_in_every_numpy_form_matches_the_cpu_engine() {
    // The last four take the tiled path: row blocks in chunks of 16 (64 rows), of 9 with a
    // row left over, batched with 11-block chunks and a `k` tail after the panel, and
    // 8-row panels of a wide `B` with a tail.
    let cases: [(&[usize], &[usize], &[usize]); 9] = [
        (&[7, 13], &[13, 5], &[7, 5]),
        (&[3, 7, 13], &[13, 5], &[3, 7, 5]),
        (&[2, 1, 4, 6], &[3, 6, 2], &[2, 3, 4, 2]),
        (&[13], &[13, 5], &[5]),
        (&[7, 13], &[13], &[7]),
        (&[64, 200], &[200, 96], &[64, 96]),
        (&[37, 300], &[300, 70], &[37, 70]),
        (&[2, 45, 2000], &[2000, 40], &[2, 45, 40]),
        (&[8, 9], &[9, 8000], &[8, 8000]),
    ];
    let dims = |s: &[usize]| s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
    for (a, b, c) in cases {
        let g = parse(&format!(
            "graph \"m\" {{\n  %0: f32[{}] = input \"a\"\n  %1: f32[{}] = input \"b\"\n  %2: f32[{}] = matmul(%0, %1)\n  return \"c\" = %2\n}}",
            dims(a),
            dims(b),
            dims(c)
        ));
        let clean = |n: usize, seed| finite_values(n, seed, 0.25);
        let inputs = [
            Tensor::from_vec(a.to_vec(), clean(a.iter().product(), 51)).unwrap(),
            Tensor::from_vec(b.to_vec(), clean(b.iter().product(), 52)).unwrap(),
        ];
        let got = run(&g, &inputs, None).unwrap_or_else(|e| panic!("{a:?} @ {b:?}: {e}"));
        assert_product_close(&format!("{a:?} @ {b:?}"), &g, &inputs, &got[0]);
        // The same bits at 1 and 2 threads.
        let one = run(&g, &inputs, Some(1)).unwrap();
        assert_eq!(one[0], got[0]);
    }
}

/// A product (and what follows it) within the standard bound of the cpu engine's:
/// |got − want| ≤ 4·k·2⁻²⁴·(|a|·|b|), the second product computed on absolute values —
/// sums of many terms cancel, and the two engines add them in different orders.
fn assert_product_close(what: &str, g: &Graph, inputs: &[Tensor], got: &Tensor) {
    let want = xpu_engine_cpu::run_graph(g, inputs).unwrap().outputs;
    let abs: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            let v: Vec<f32> = t.to_f64_vec().iter().map(|x| x.abs() as f32).collect();
            Tensor::from_vec(t.shape().to_vec(), v).unwrap()
        })
        .collect();
    let scale = xpu_engine_cpu::run_graph(g, &abs).unwrap().outputs;
    let k = inputs[0].shape().last().copied().unwrap_or(1) as f64;
    assert_eq!(got.shape(), want[0].shape(), "{what}: shape");
    let (g, w, s) = (got.to_f64_vec(), want[0].to_f64_vec(), scale[0].to_f64_vec());
    for (i, ((a, b), m)) in g.iter().zip(&w).zip(&s).enumerate() {
        let bound = 4.0 * k * f64::from(f32::EPSILON) / 2.0 * m.abs() + 1e-6;
        assert!((a - b).abs() <= bound, "{what}[{i}]: llvm {a}, cpu {b}, bound {bound}");
    }
}

/// The tiled path's epilogue runs over every row of every block and the rows left over.
#[test]
fn a_tiled_product_with_an_epilogue_matches_the_cpu_engine() {
    let g = parse(
        "graph \"d\" {\n  %0: f32[37,300] = input \"x\"\n  %1: f32[300,70] = input \"w\"\n  %2: f32[70] = input \"b\"\n  %3: f32[37,70] = matmul(%0, %1)\n  %4: f32[37,70] = add(%3, %2)\n  %5: f32[37,70] = relu(%4)\n  return \"y\" = %5\n}",
    );
    let inputs = [
        Tensor::from_vec(vec![37, 300], finite_values(37 * 300, 61, 0.5)).unwrap(),
        Tensor::from_vec(vec![300, 70], finite_values(300 * 70, 62, 0.5)).unwrap(),
        Tensor::from_vec(vec![70], finite_values(70, 63, 0.5)).unwrap(),
    ];
    let got = run(&g, &inputs, Some(2)).unwrap();
    assert_product_close("relu(x @ w + b)", &g, &inputs, &got[0]);
    assert_eq!(run(&g, &inputs, Some(1)).unwrap()[0], got[0], "1 and 2 threads");
}

/// A dense layer `relu(x @ w + b)` is one kernel (the bias and activation run over each
/// finished row); an epilogue that broadcasts past the product's shape gets its own kernel.
#[test]
fn matmul_epilogues_fuse_when_they_keep_the_products_shape() {
    let clean = |n: usize, seed| finite_values(n, seed, 0.5);
    let g = parse(
        "graph \"d\" {\n  %0: f32[6,20] = input \"x\"\n  %1: f32[20,9] = input \"w\"\n  %2: f32[9] = input \"b\"\n  %3: f32[6,9] = matmul(%0, %1)\n  %4: f32[6,9] = add(%3, %2)\n  %5: f32[6,9] = relu(%4)\n  return \"y\" = %5\n}",
    );
    let inputs = [
        Tensor::from_vec(vec![6, 20], clean(120, 61)).unwrap(),
        Tensor::from_vec(vec![20, 9], clean(180, 62)).unwrap(),
        Tensor::from_vec(vec![9], clean(9, 63)).unwrap(),
    ];
    let mut exe = engine().prepare(&g, &Assignment::new("llvm")).unwrap();
    let out = exe.run(&inputs).unwrap();
    let kernels = out.facts.iter().find(|f| f.key == "llvm.kernels").unwrap();
    assert!(kernels.value.starts_with("1 for"), "{}", kernels.value);
    let want = xpu_engine_cpu::run_graph(&g, &inputs).unwrap().outputs;
    assert_close("dense relu", &out.outputs[0], &want[0], 1e-4);
    let g = parse(
        "graph \"e\" {\n  %0: f32[4,7] = input \"x\"\n  %1: f32[7,5] = input \"w\"\n  %2: f32[3,4,5] = input \"y\"\n  %3: f32[4,5] = matmul(%0, %1)\n  %4: f32[3,4,5] = add(%3, %2)\n  return \"z\" = %4\n}",
    );
    let inputs = [
        Tensor::from_vec(vec![4, 7], clean(28, 64)).unwrap(),
        Tensor::from_vec(vec![7, 5], clean(35, 65)).unwrap(),
        Tensor::from_vec(vec![3, 4, 5], clean(60, 66)).unwrap(),
    ];
    let mut exe = engine().prepare(&g, &Assignment::new("llvm")).unwrap();
    let out = exe.run(&inputs).unwrap();
    let kernels = out.facts.iter().find(|f| f.key == "llvm.kernels").unwrap();
    assert!(kernels.value.starts_with("2 for"), "{}", kernels.value);
    let want = xpu_engine_cpu::run_graph(&g, &inputs).unwrap().outputs;
    assert_close("broadcast epilogue", &out.outputs[0], &want[0], 1e-4);
}

/// A 3,000-op chain is cut into kernels of at most 256 nodes, each compiled quickly, with
/// the cpu engine's result.
#[test]
fn a_very_long_chain_is_cut_into_bounded_kernels() {
    let mut src = String::from("graph \"long\" {\n  %0: f32[4,8] = input \"x\"\n");
    for i in 0..3000 {
        let op = ["neg", "abs", "sin"][i % 3];
        src.push_str(&format!("  %{}: f32[4,8] = {op}(%{i})\n", i + 1));
    }
    src.push_str("  return \"y\" = %3000\n}");
    let g = parse(&src);
    let x = Tensor::from_vec(vec![4, 8], finite_values(32, 71, 0.5)).unwrap();
    let mut exe = engine().prepare(&g, &Assignment::new("llvm")).unwrap();
    let out = exe.run(std::slice::from_ref(&x)).unwrap();
    let kernels = out.facts.iter().find(|f| f.key == "llvm.kernels").unwrap();
    let n: usize = kernels.value.split(' ').next().unwrap().parse().unwrap();
    assert!((12..=20).contains(&n), "{}", kernels.value);
    let want = xpu_engine_cpu::run_graph(&g, &[x]).unwrap().outputs;
    assert_close("long chain", &out.outputs[0], &want[0], 1e-4);
}

/// Two products feeding one elementwise op (a recurrent gate `x @ w + h @ u`): one is
/// stored, the other keeps the epilogue; and a chain mixing f64 and f32 through casts
/// inside a reduction body: both as the cpu engine computes them.
#[test]
fn two_products_in_one_epilogue_and_mixed_precision_prologues() {
    let g = parse(
        "graph \"gate\" {\n  %0: f32[3,5] = input \"x\"\n  %1: f32[5,4] = input \"w\"\n  %2: f32[3,6] = input \"h\"\n  %3: f32[6,4] = input \"u\"\n  %4: f32[3,4] = matmul(%0, %1)\n  %5: f32[3,4] = matmul(%2, %3)\n  %6: f32[3,4] = add(%4, %5)\n  %7: f32[3,4] = tanh(%6)\n  return \"y\" = %7\n}",
    );
    let inputs = [
        Tensor::from_vec(vec![3, 5], finite_values(15, 81, 0.5)).unwrap(),
        Tensor::from_vec(vec![5, 4], finite_values(20, 82, 0.5)).unwrap(),
        Tensor::from_vec(vec![3, 6], finite_values(18, 83, 0.5)).unwrap(),
        Tensor::from_vec(vec![6, 4], finite_values(24, 84, 0.5)).unwrap(),
    ];
    let want = xpu_engine_cpu::run_graph(&g, &inputs).unwrap().outputs;
    let got = run(&g, &inputs, None).unwrap();
    assert_close("gate", &got[0], &want[0], 1e-4);
    let g = parse(
        "graph \"mixed\" {\n  %0: f64[4,9] = input \"x\"\n  %1: f64[4,9] = relu(%0)\n  %2: f32[4,9] = cast(%1) {to = dtype<f32>}\n  %3: f32[4,9] = mul(%2, %2)\n  %4: i64[1] = constant {value = tensor<i64[1]> [-1]}\n  %5: f32[4,1] = reduce_sum(%3, %4)\n  return \"y\" = %5\n}",
    );
    let x: Vec<f64> = finite_values(36, 85, 0.5).into_iter().map(f64::from).collect();
    let x = Tensor::from_vec(vec![4, 9], x).unwrap();
    let want = xpu_engine_cpu::run_graph(&g, std::slice::from_ref(&x)).unwrap().outputs;
    let got = run(&g, std::slice::from_ref(&x), None).unwrap();
    assert_close("mixed precision", &got[0], &want[0], 1e-5);
}

/// Wide inputs for the idiom tests: every special value, both sides of where exp
/// overflows and where the rewritten forms switch (|v| = 10, 87), and a grid over ±100.
fn wide_values() -> Vec<f64> {
    let mut v: Vec<f64> = (0..1000).map(|i| -100.0 + 0.2 * i as f64 + 0.013).collect();
    v.extend([
        0.0,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-30,
        -1e-30,
        9.99,
        10.01,
        -86.9,
        -87.1,
        88.5,
        88.8,
        700.0,
        -700.0,
    ]);
    v.resize(1024, 0.5);
    v
}

/// `wide_values()` as a [64, 16] tensor of `ty` (f32 or f64).
fn wide_input(ty: &str) -> Tensor {
    match ty {
        "f32" => {
            Tensor::from_vec(vec![64, 16], wide_values().into_iter().map(|v| v as f32).collect())
        }
        _ => Tensor::from_vec(vec![64, 16], wide_values()),
    }
    .unwrap()
}

/// The program `src` on llvm (2 threads) gives the cpu engine's values for input `x` of
/// `ty`, within 2e-5 relative in f32 (1e-11 in f64).
fn assert_like_the_cpu_engine(what: &str, src: &str, x: &Tensor, ty: &str) {
    let g = parse(src);
    let want = xpu_engine_cpu::run_graph(&g, std::slice::from_ref(x)).unwrap().outputs;
    let got = run(&g, std::slice::from_ref(x), Some(2)).unwrap();
    let rel = if ty == "f32" { 2e-5 } else { 1e-11 };
    assert_close(what, &got[0], &want[0], rel);
}

/// GELU's tanh form ends by halving v·(1 + tanh(v·k)); the lowering folds the halving into
/// the rewritten 2/(1 + exp(v·(−2k))) (lower/ops.rs), in whichever order the product is
/// written (as the `gelu` op lowers it, as exporters write it, operands swapped). The
/// values stay the op-by-op ones, NaN and ±inf included, in f32 and f64.
#[test]
fn gelu_halving_folds_keep_the_op_by_op_values() {
    let tails = [
        "%6 = mul(%0, %5)\n  %7 = mul(%6, %8)",
        "%6 = mul(%0, %8)\n  %7 = mul(%6, %5)",
        "%6 = mul(%8, %0)\n  %7 = mul(%5, %6)",
        "%6 = mul(%5, %0)\n  %7 = mul(%8, %6)",
    ];
    for ty in ["f32", "f64"] {
        let x = wide_input(ty);
        for tail in tails {
            let tail = tail.replace(" = ", &format!(": {ty}[64,16] = "));
            let src = format!(
                "graph \"gelu\" {{\n  %0: {ty}[64,16] = input \"x\"\n  %1: {ty}[] = constant {{value = tensor<{ty}[]> [1.0]}}\n  %8: {ty}[] = constant {{value = tensor<{ty}[]> [0.5]}}\n  %9: {ty}[] = constant {{value = tensor<{ty}[]> [0.7978845608028654]}}\n  %3: {ty}[64,16] = mul(%0, %9)\n  %4: {ty}[64,16] = tanh(%3)\n  %5: {ty}[64,16] = add(%1, %4)\n  {tail}\n  return \"y\" = %7\n}}"
            );
            assert_like_the_cpu_engine(&format!("gelu, {tail} ({ty})"), &src, &x, ty);
        }
    }
}

/// `log(1 + exp(v))`, Mish and the tanh form of GELU written out op by op are rewritten
/// (lower/ops.rs); the results stay the op-by-op ones (the cpu engine's), NaN and ±inf
/// included, in f32 and f64.
#[test]
fn rewritten_activation_spellings_keep_the_op_by_op_values() {
    let chains = [
        ("softplus", "%1 = exp(%0)\n  %3 = add(%2, %1)\n  %4 = log(%3)\n  return \"y\" = %4"),
        (
            "mish",
            "%1 = exp(%0)\n  %3 = add(%1, %2)\n  %4 = log(%3)\n  %5 = tanh(%4)\n  %6 = mul(%0, %5)\n  return \"y\" = %6",
        ),
        (
            "1 + tanh",
            "%1 = mul(%0, %2)\n  %3 = tanh(%1)\n  %4 = add(%2, %3)\n  %5 = mul(%0, %4)\n  return \"y\" = %5",
        ),
    ];
    for ty in ["f32", "f64"] {
        let x = wide_input(ty);
        for (name, body) in chains {
            // Every value is [64, 16] of `ty`; %2 is the constant 1.
            let body = body.replace(" = ", &format!(": {ty}[64,16] = "));
            let body = body.replace(&format!("return \"y\": {ty}[64,16] ="), "return \"y\" =");
            let src = format!(
                "graph \"idiom\" {{\n  %0: {ty}[64,16] = input \"x\"\n  %2: {ty}[] = constant {{value = tensor<{ty}[]> [1.0]}}\n  {body}\n}}"
            );
            assert_like_the_cpu_engine(&format!("{name} ({ty})"), &src, &x, ty);
        }
    }
}
