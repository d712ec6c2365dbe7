//! The CPU engine as an engine: kernels agree with each other, pins are checked, inputs are
//! validated, capabilities and timings are reported, absurd sizes are errors.

use xpu_engine::{Assignment, Engine, EngineError};
use xpu_engine_cpu::{CpuEngine, HAS_BLAS};
use xpu_ir::{Graph, NodeId, Tensor, text::parse};

mod common;
use common::rand;

fn run_with(
    g: &Graph,
    kernels: &[(u32, &str)],
    inputs: &[Tensor],
) -> Result<Vec<Tensor>, EngineError> {
    let mut a = Assignment::new("cpu");
    for (n, k) in kernels {
        a.kernels.insert(NodeId(*n), k.to_string());
    }
    Ok(CpuEngine::new().prepare(g, &a)?.run(inputs)?.outputs)
}

fn assert_close(a: &Tensor, b: &Tensor, tol: f32) {
    assert_eq!(a.shape(), b.shape());
    let (x, y) = (a.as_slice::<f32>().unwrap(), b.as_slice::<f32>().unwrap());
    for (i, (p, q)) in x.iter().zip(y).enumerate() {
        assert!((p - q).abs() <= tol * (1.0 + q.abs()), "element {i}: {p} vs {q}");
    }
}

#[test]
fn matmul_kernels_agree_including_batch_broadcast() {
    let g = parse("graph \"g\" {\n  %0: f32[2,1,70,130] = input \"a\"\n  %1: f32[3,130,90] = input \"b\"\n  %2: f32[2,3,70,90] = matmul(%0, %1)\n  return \"c\" = %2\n}").unwrap();
    let inputs = [
        Tensor::from_vec(vec![2, 1, 70, 130], rand(2 * 70 * 130, 1)).unwrap(),
        Tensor::from_vec(vec![3, 130, 90], rand(3 * 130 * 90, 2)).unwrap(),
    ];
    let naive = run_with(&g, &[(0, "cpu.naive")], &inputs).unwrap().remove(0);
    let gemm = run_with(&g, &[(0, "cpu.gemm")], &inputs).unwrap().remove(0);
    assert_close(&gemm, &naive, 1e-4);
    if HAS_BLAS {
        let blas = run_with(&g, &[(0, "cpu.blas")], &inputs).unwrap().remove(0);
        assert_close(&blas, &naive, 1e-4);
    }
    // A hand-checked entry: c[1,2,3,4] = sum_k a[1,0,3,k] * b[2,k,4].
    let (a, b) = (inputs[0].as_slice::<f32>().unwrap(), inputs[1].as_slice::<f32>().unwrap());
    let want: f32 =
        (0..130).map(|k| a[70 * 130 + 3 * 130 + k] * b[2 * 130 * 90 + k * 90 + 4]).sum();
    let got = naive.as_slice::<f32>().unwrap()[((3 + 2) * 70 + 3) * 90 + 4];
    assert!((got - want).abs() < 1e-4, "{got} vs {want}");
}

#[test]
fn conv_im2col_agrees_with_naive_for_groups_strides_and_ranks() {
    for src in [
        "graph \"g\" {\n  %0: f32[2,4,9,7] = input \"x\"\n  %1: f32[6,2,3,3] = input \"w\"\n  %2: f32[2,6,5,4] = conv(%0, %1) {group = 2, pads = [1, 1, 1, 1], strides = [2, 2]}\n  return \"y\" = %2\n}",
        "graph \"g\" {\n  %0: f32[1,3,11] = input \"x\"\n  %1: f32[5,3,4] = input \"w\"\n  %2: f32[1,5,5] = conv(%0, %1) {dilations = [2], strides = [1]}\n  return \"y\" = %2\n}",
        "graph \"g\" {\n  %0: f32[1,2,5,5,5] = input \"x\"\n  %1: f32[3,2,2,2,2] = input \"w\"\n  %2: f32[1,3,4,4,4] = conv(%0, %1)\n  return \"y\" = %2\n}",
    ] {
        let g = parse(src).unwrap();
        xpu_ir::verify(&g).unwrap();
        let inputs: Vec<Tensor> = g
            .inputs
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let shape = g.ty(v).static_shape().unwrap();
                let n = shape.iter().product();
                Tensor::from_vec(shape, rand(n, i as u64 + 7)).unwrap()
            })
            .collect();
        let fast = run_with(&g, &[], &inputs).unwrap().remove(0);
        let naive = run_with(&g, &[(0, "cpu.naive")], &inputs).unwrap().remove(0);
        assert_close(&fast, &naive, 1e-4);
        assert_eq!(fast.shape(), g.ty(g.outputs[0].value).static_shape().unwrap().as_slice());
    }
}

#[test]
fn pinning_a_kernel_that_cannot_run_the_op_is_an_error() {
    let g = parse("graph \"g\" {\n  %0: f32[2,2] = input \"a\"\n  %1: f32[2,2] = matmul(%0, %0) @name(\"mm\")\n  return \"c\" = %1\n}").unwrap();
    let err =
        run_with(&g, &[(0, "cpu.im2col_conv")], &[Tensor::zeros(xpu_ir::DType::F32, vec![2, 2])])
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("n0 (matmul \"mm\")")
            && err.contains("does not support kernel cpu.im2col_conv for op matmul"),
        "{err}"
    );
    let err =
        run_with(&g, &[(0, "cuda.cublaslt")], &[Tensor::zeros(xpu_ir::DType::F32, vec![2, 2])])
            .unwrap_err()
            .to_string();
    assert!(err.contains("kernel cuda.cublaslt"), "{err}");
}

#[test]
fn capabilities_are_reported_as_data() {
    let caps = CpuEngine::new().capabilities();
    assert!(caps.availability.is_available());
    let names: Vec<&str> = caps.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(
        names.contains(&"cpu.naive")
            && names.contains(&"cpu.gemm")
            && names.contains(&"cpu.im2col_conv")
    );
    assert_eq!(names.contains(&"cpu.blas"), HAS_BLAS);
    let naive = caps.kernels.iter().find(|k| k.name == "cpu.naive").unwrap();
    let tensor_ops = xpu_ir::Op::ALL
        .iter()
        .filter(|op| !matches!(op.class(), xpu_ir::OpClass::Table | xpu_ir::OpClass::Opaque));
    assert_eq!(
        naive.ops.len(),
        tensor_ops.count(),
        "the reference engine implements every tensor op"
    );
    assert!(!naive.ops.contains(&xpu_ir::Op::OnnxOp), "opaque ONNX nodes are for ONNX engines");
    assert!(!naive.ops.contains(&xpu_ir::Op::ReadCsv), "table ops belong to the table engine");
    assert!(caps.supports(xpu_ir::Op::Conv, xpu_ir::DType::F16));
    assert!(!caps.supports(xpu_ir::Op::Conv, xpu_ir::DType::String));
}

#[test]
fn inputs_are_checked_and_timings_reported() {
    let g = parse("graph \"g\" {\n  %0: f32[N,3] = input \"a\"\n  %1: f32[N,3] = input \"b\"\n  %2: f32[N,3] = add(%0, %1)\n  %3: f32[N,3] = relu(%2)\n  return \"c\" = %3\n}").unwrap();
    let mut exe = CpuEngine::new().prepare(&g, &Assignment::new("cpu")).unwrap();
    let t = |shape: Vec<usize>| Tensor::zeros(xpu_ir::DType::F32, shape);
    let err = exe.run(&[t(vec![2, 3])]).unwrap_err().to_string();
    assert!(err.contains("takes 2 inputs") && err.contains("\"a\", \"b\""), "{err}");
    let err = exe.run(&[t(vec![2, 3]), t(vec![4, 3])]).unwrap_err().to_string();
    assert!(err.contains("input \"b\"") && err.contains("symbol N, bound to 2"), "{err}");
    let err = exe
        .run(&[t(vec![2, 3]), Tensor::zeros(xpu_ir::DType::F64, vec![2, 3])])
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected dtype f32, got f64"), "{err}");
    let a = Tensor::from_vec(vec![1, 3], vec![-1.0f32, 2.0, -3.0]).unwrap();
    let b = Tensor::from_vec(vec![1, 3], vec![0.5f32, 0.5, 0.5]).unwrap();
    let out = exe.run(&[a.clone(), b]).unwrap();
    assert_eq!(out.outputs[0].as_slice::<f32>().unwrap(), &[0.0, 2.5, 0.0]);
    assert_eq!(out.timings.len(), 2);
    assert_eq!(out.timings[1].kernel, "cpu.naive");
    assert_eq!(a.as_slice::<f32>().unwrap()[0], -1.0, "inputs stay the caller's");
}

#[test]
fn absurd_shapes_are_errors_not_aborts() {
    let g = parse("graph \"g\" {\n  %0: i64[3] = input \"s\"\n  %1: f32[?,?,?] = constant_of_shape(%0)\n  return \"y\" = %1\n}").unwrap();
    let shape = Tensor::from_vec(vec![3], vec![1i64 << 20, 1 << 20, 1 << 20]).unwrap();
    let err = run_with(&g, &[], &[shape]).unwrap_err().to_string();
    assert!(err.contains("too large to allocate"), "{err}");
}

#[test]
fn evaluator_folds_through_the_engine() {
    let g = parse("graph \"g\" {\n  %0: f32[2] = input \"x\"\n  %1: f32[2] = constant {value = tensor<f32[2]> [1.0, 4.0]}\n  %2: f32[2] = sqrt(%1)\n  %3: f32[2] = add(%0, %2)\n  return \"y\" = %3\n}").unwrap();
    let folded = xpu_ir::passes::fold_constants(&g, &xpu_engine_cpu::CpuEvaluator);
    let folded = xpu_ir::passes::eliminate_dead_code(&folded);
    assert!(
        xpu_ir::text::print(&folded).contains("tensor<f32[2]> [1.0, 2.0]"),
        "{}",
        xpu_ir::text::print(&folded)
    );
    assert_eq!(folded.nodes.len(), 2);
}

#[test]
fn rnn_sequence_lengths_stop_each_batch_entry() {
    // hidden 1, input 1, W = 1, R = 0, no bias, identity-like activation (Affine 1, 0):
    // h_t = x_t, so Y copies X until each entry's length, then holds 0; Y_h is the last valid h.
    let g = parse(
        "graph \"g\" {\n  %0: f32[3,2,1] = input \"x\"\n  %1: i32[2] = input \"lens\"\n  %2: f32[1,1,1] = constant {value = tensor<f32[1,1,1]> [1.0]}\n  %3: f32[1,1,1] = constant {value = tensor<f32[1,1,1]> [0.0]}\n  %4: f32[3,1,2,1], %5: f32[1,2,1] = rnn(%0, %2, %3, _, %1) {activations = [\"Affine\"], hidden_size = 1}\n  return \"y\" = %4, \"h\" = %5\n}",
    )
    .unwrap();
    xpu_ir::verify(&g).unwrap();
    let x = Tensor::from_vec(vec![3, 2, 1], vec![1.0f32, 10.0, 2.0, 20.0, 3.0, 30.0]).unwrap();
    let lens = Tensor::from_vec(vec![2], vec![3i32, 1]).unwrap();
    let out = run_with(&g, &[], &[x, lens]).unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &[1.0, 10.0, 2.0, 0.0, 3.0, 0.0]);
    assert_eq!(out[1].as_slice::<f32>().unwrap(), &[3.0, 10.0]);
}

#[test]
fn cache_keys_are_stable_and_discriminating() {
    // Graph hashes and inventory fingerprints key plan caches: equal inputs, equal keys.
    let src = "graph \"g\" {\n  %0: f32[N,2] = input \"x\"\n  %1: f32[N,2] = relu(%0)\n  return \"y\" = %1\n}";
    let (a, b) = (parse(src).unwrap(), parse(src).unwrap());
    assert_eq!(a.content_hash(), b.content_hash());
    let c = parse(&src.replace("relu", "neg")).unwrap();
    assert_ne!(a.content_hash(), c.content_hash());
    let inv = xpu_engine::Inventory {
        engines: vec![CpuEngine::new().capabilities()],
        ..Default::default()
    };
    assert_eq!(
        inv.fingerprint(),
        xpu_engine::Inventory {
            engines: vec![CpuEngine::new().capabilities()],
            ..Default::default()
        }
        .fingerprint()
    );
    assert_ne!(inv.fingerprint(), xpu_engine::Inventory::default().fingerprint());
}

/// memory.limit holds when sizes are known only at run time: inputs and live values are
/// counted, values past their last use are not, and the error names the node.
#[test]
fn memory_limit_is_enforced_on_live_tensors() {
    let g = parse("graph \"g\" {\n  %0: f32[N,4] = input \"a\"\n  %1: f32[N,4] = relu(%0)\n  %2: f32[N,4] = relu(%1)\n  %3: f32[N,4] = relu(%2)\n  return \"c\" = %3\n}").unwrap();
    let run = |rows: usize, limit: u64| {
        let mut a = Assignment::new("cpu");
        a.options.memory_limit = Some(limit);
        let mut exe = CpuEngine::new().prepare(&g, &a)?;
        exe.run(&[Tensor::zeros(xpu_ir::DType::F32, vec![rows, 4])]).map(|e| e.outputs.len())
    };
    // 100 rows are 1,600 bytes; at most two values (input and one relu, or two relus) live.
    assert_eq!(run(100, 3200), Ok(1));
    let err = run(100, 3199).unwrap_err();
    assert!(matches!(err, EngineError::MemoryLimit { needed: 3200, limit: 3199, .. }), "{err:?}");
    let err = err.to_string();
    assert!(
        err.contains("memory.limit") && err.contains("3200 bytes") && err.contains("relu"),
        "{err}"
    );
    let err = run(1000, 3200).unwrap_err();
    assert!(matches!(err, EngineError::MemoryLimit { needed: 32000, .. }), "a bigger input: {err}");
}

#[test]
fn half_softmax_follows_onnx_function_body_bit_for_bit() {
    // ONNX defines Softmax/LogSoftmax by a body whose every value has the input's type; the
    // engine rounds those intermediates, so the fused op equals the body run op by op.
    for ty in ["f16", "bf16"] {
        let fused = parse(&format!(
            "graph \"g\" {{\n  %0: {ty}[6,37] = input \"x\"\n  %1: {ty}[6,37] = softmax(%0) {{axis = 1}}\n  %2: {ty}[6,37] = log_softmax(%0) {{axis = 1}}\n  return \"s\" = %1\n  return \"l\" = %2\n}}"
        ))
        .unwrap();
        let body = parse(&format!(
            "graph \"g\" {{\n  %0: {ty}[6,37] = input \"x\"\n  %1: i64[1] = constant {{value = tensor<i64[1]> [1]}}\n  %2: {ty}[6,1] = reduce_max(%0, %1) {{keepdims = 1}}\n  %3: {ty}[6,37] = sub(%0, %2)\n  %4: {ty}[6,37] = exp(%3)\n  %5: {ty}[6,1] = reduce_sum(%4, %1) {{keepdims = 1}}\n  %6: {ty}[6,37] = div(%4, %5)\n  %7: {ty}[6,1] = log(%5)\n  %8: {ty}[6,37] = sub(%3, %7)\n  return \"s\" = %6\n  return \"l\" = %8\n}}"
        ))
        .unwrap();
        let values: Vec<f32> = rand(6 * 37, 11).iter().map(|v| v * 6.0).collect();
        let x = match ty {
            "f16" => Tensor::from_vec(
                vec![6, 37],
                values.iter().map(|&v| half::f16::from_f32(v)).collect(),
            ),
            _ => Tensor::from_vec(
                vec![6, 37],
                values.iter().map(|&v| half::bf16::from_f32(v)).collect(),
            ),
        }
        .unwrap();
        let a = run_with(&fused, &[], std::slice::from_ref(&x)).unwrap();
        let b = run_with(&body, &[], &[x]).unwrap();
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert_eq!(p.dtype(), q.dtype());
            let (p, q) = (p.le_bytes(), q.le_bytes());
            assert_eq!(p, q, "{ty} output {i}");
        }
    }
}

#[test]
fn half_softmax_over_a_long_flat_lane_does_not_overflow() {
    // 70,000 equal f16 logits: the sum of the exponentials (70,000) is past f16's 65,504.
    let n = 70_000;
    let g = parse(&format!(
        "graph \"g\" {{\n  %0: f16[{n}] = input \"x\"\n  %1: f16[{n}] = softmax(%0)\n  %2: f16[{n}] = log_softmax(%0)\n  return \"s\" = %1\n  return \"l\" = %2\n}}"
    ))
    .unwrap();
    let x = Tensor::from_vec(vec![n], vec![half::f16::ZERO; n]).unwrap();
    let out = run_with(&g, &[], &[x]).unwrap();
    let s = out[0].as_slice::<half::f16>().unwrap();
    let l = out[1].as_slice::<half::f16>().unwrap();
    assert!((s[0].to_f64() - 1.0 / n as f64).abs() < 1e-7, "{}", s[0]);
    assert!((l[0].to_f64() + (n as f64).ln()).abs() < 0.01, "{}", l[0]);
}

#[test]
fn tensor_scatter_writes_cache_rows_and_refuses_writes_past_a_linear_cache() {
    let src = |mode: &str| {
        format!(
            "graph \"g\" {{\n  %0: f32[2,4,1] = input \"cache\"\n  %1: f32[2,2,1] = input \"new\"\n  %2: i64[2] = input \"at\"\n  %3: f32[2,4,1] = tensor_scatter(%0, %1, %2) {{axis = 1, mode = \"{mode}\"}}\n  return \"y\" = %3\n}}"
        )
    };
    let cache = Tensor::from_vec(vec![2, 4, 1], vec![0.0f32; 8]).unwrap();
    let new = Tensor::from_vec(vec![2, 2, 1], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let at = Tensor::from_vec(vec![2], vec![1i64, 3]).unwrap();
    let g = parse(&src("circular")).unwrap();
    let y = run_with(&g, &[], &[cache.clone(), new.clone(), at.clone()]).unwrap();
    // Batch 0 writes rows 1, 2; batch 1 writes row 3 and wraps to row 0.
    assert_eq!(y[0].as_slice::<f32>().unwrap(), [0.0, 1.0, 2.0, 0.0, 4.0, 0.0, 0.0, 3.0]);
    let g = parse(&src("linear")).unwrap();
    let e = run_with(&g, &[], &[cache, new, at]).unwrap_err().to_string();
    assert!(e.contains("batch 1 writes position 4, outside the cache's 4"), "{e}");
}

#[test]
fn region_and_state_ops_refuse_hostile_shapes_with_errors() {
    // Each graph is well typed; its attributes or values would hang, overflow or
    // allocate without bound if taken at face value.
    let cases: &[(&str, Vec<Tensor>, &str)] = &[
        (
            // A region 1e15 tall sampled at the default ratio: a grid past 2^20.
            "graph \"g\" {\n  %0: f32[1,1,2,2] = input \"x\"\n  %1: f32[1,4] = input \"rois\"\n  %2: i64[1] = input \"b\"\n  %3: f32[1,1,1,1] = roi_align(%0, %1, %2)\n  return \"y\" = %3\n}",
            vec![
                Tensor::from_vec(vec![1, 1, 2, 2], vec![1.0f32; 4]).unwrap(),
                Tensor::from_vec(vec![1, 4], vec![0.0f32, 0.0, -1.0, 1e15]).unwrap(),
                Tensor::from_vec(vec![1], vec![0i64]).unwrap(),
            ],
            "grid per bin",
        ),
        (
            // Output bins 2^32 × 2^32.
            "graph \"g\" {\n  %0: f32[1,1,2,2] = input \"x\"\n  %1: f32[1,4] = input \"rois\"\n  %2: i64[1] = input \"b\"\n  %3: f32[1,1,4294967296,4294967296] = roi_align(%0, %1, %2) {output_height = 4294967296, output_width = 4294967296}\n  return \"y\" = %3\n}",
            vec![
                Tensor::from_vec(vec![1, 1, 2, 2], vec![1.0f32; 4]).unwrap(),
                Tensor::from_vec(vec![1, 4], vec![0.0f32, 0.0, 1.0, 1.0]).unwrap(),
                Tensor::from_vec(vec![1], vec![0i64]).unwrap(),
            ],
            "too large to allocate",
        ),
        (
            // Circular cache write from i64::MAX.
            "graph \"g\" {\n  %0: f32[1,4,1] = input \"c\"\n  %1: f32[1,2,1] = input \"u\"\n  %2: i64[1] = input \"at\"\n  %3: f32[1,4,1] = tensor_scatter(%0, %1, %2) {axis = 1}\n  return \"y\" = %3\n}",
            vec![
                Tensor::from_vec(vec![1, 4, 1], vec![0.0f32; 4]).unwrap(),
                Tensor::from_vec(vec![1, 2, 1], vec![1.0f32; 2]).unwrap(),
                Tensor::from_vec(vec![1], vec![i64::MAX]).unwrap(),
            ],
            "outside the cache",
        ),
        (
            // Value heads of 0 dims.
            "graph \"g\" {\n  %0: f32[1,1,2] = input \"q\"\n  %1: f32[1,1,2] = input \"k\"\n  %2: f32[1,1,0] = input \"v\"\n  %3: f32[1,1,0] = linear_attention(%0, %1, %2) {kv_num_heads = 1, q_num_heads = 1, update_rule = \"linear\"}\n  return \"y\" = %3\n}",
            vec![
                Tensor::from_vec(vec![1, 1, 2], vec![1.0f32; 2]).unwrap(),
                Tensor::from_vec(vec![1, 1, 2], vec![1.0f32; 2]).unwrap(),
                Tensor::from_vec(vec![1, 1, 0], Vec::<f32>::new()).unwrap(),
            ],
            "each must be ≥ 1",
        ),
    ];
    for (src, inputs, want) in cases {
        let g = parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let e = run_with(&g, &[], inputs).expect_err(want).to_string();
        assert!(e.contains(want), "{e}");
    }
}
