//! The ort engine against the real ONNX Runtime library (`make setup` puts it in .deps/).

use std::path::Path;

use xpu_engine::options::{Determinism, Fallback, GraphOptimization, Pool};
use xpu_engine::{Assignment, Availability, Engine, EngineError, StopToken};
use xpu_engine_ort::OrtEngine;
use xpu_ir::{DType, Graph, Op, Tensor, TensorType};

fn engine() -> OrtEngine {
    let e = OrtEngine::load(None);
    assert_eq!(e.availability(), Availability::Available, "run `make setup` to fetch ONNX Runtime");
    e
}

/// y = relu(x · w + b), x: [N, 3], w: [3, 2], b: [2].
fn mlp() -> Graph {
    parse(
        r#"graph "mlp" {
  %0: f32[N,3] = input "x"
  %1: f32[3,2] = input "w"
  %2: f32[2] = input "b"
  %3: f32[N,2] = matmul(%0, %1)
  %4: f32[N,2] = add(%3, %2)
  %5: f32[N,2] = relu(%4)
  return "y" = %5
}"#,
    )
}

fn parse(text: &str) -> Graph {
    xpu_ir::text::parse(text).unwrap_or_else(|e| panic!("{e:?}"))
}

fn weights() -> [Tensor; 2] {
    [
        Tensor::from_vec(vec![3, 2], vec![1f32, -1.0, 2.0, 0.5, -3.0, 1.0]).unwrap(),
        Tensor::from_vec(vec![2], vec![0.5f32, -0.5]).unwrap(),
    ]
}

fn with_weights(x: &Tensor) -> Vec<Tensor> {
    let [w, b] = weights();
    vec![x.clone(), w, b]
}

fn cpu_reference(g: &Graph, x: &Tensor) -> Tensor {
    let cpu = xpu_engine_cpu::CpuEngine::new();
    cpu.prepare(g, &Assignment::new("cpu"))
        .unwrap()
        .run(&with_weights(x))
        .unwrap()
        .outputs
        .remove(0)
}

#[test]
fn a_partition_runs_and_agrees_with_the_cpu_engine() {
    let e = engine();
    let g = mlp();
    let x = Tensor::from_vec(vec![2, 3], vec![1.0f32, 2.0, 3.0, -1.0, 0.5, 4.0]).unwrap();
    let mut a = Assignment::new("ort");
    a.options.threads = Some(1);
    let mut exe = e.prepare(&g, &a).unwrap();
    let out = exe.run(&with_weights(&x)).unwrap();
    assert_eq!(out.outputs, vec![cpu_reference(&g, &x)]);
    // The first run is profiled once: ORT's provider per node lands in the facts.
    let providers: Vec<&str> =
        out.facts.iter().filter(|f| f.key == "ort.provider").map(|f| f.value.as_str()).collect();
    assert!(!providers.is_empty(), "{:?}", out.facts);
    assert!(providers.iter().all(|p| p.contains("CPUExecutionProvider")), "{providers:?}");
    let opt = |k: &str| out.facts.iter().find(|f| f.key == k).map(|f| f.value.clone());
    assert_eq!(opt("ort.option.intra_threads").as_deref(), Some("1"));
    assert_eq!(opt("ort.option.spinning").as_deref(), Some("off"));
    // Same model, same options: the session comes from the cache.
    let mut again = e.prepare(&g, &a).unwrap();
    let out2 = again.run(&with_weights(&x)).unwrap();
    assert_eq!(out2.facts.iter().find(|f| f.key == "ort.session").unwrap().value, "cached");
    assert_eq!(out2.outputs, out.outputs);
}

#[test]
fn policy_options_shape_the_session() {
    let mut a = Assignment::new("ort");
    a.options.determinism = Determinism::Bitwise;
    a.options.memory_pool = Pool::None;
    a.options.graph_optimization = Some(GraphOptimization::Basic);
    a.options.fallback = Fallback::Deny;
    let o = xpu_engine_ort::SessionOptions::from_assignment(&a, &["CPUExecutionProvider".into()])
        .unwrap();
    assert!(o.deterministic && !o.arena && !o.spinning);
    assert_eq!(o.optimization.name(), "basic");
    assert!(o.disable_cpu_fallback);
    // Latency asked for explicitly: ORT's threads spin between runs, as its Python default.
    let mut latency = Assignment::new("ort");
    latency.options.performance = Some(xpu_engine::options::PerformanceHint::Latency);
    let o =
        xpu_engine_ort::SessionOptions::from_assignment(&latency, &["CPUExecutionProvider".into()])
            .unwrap();
    assert!(o.spinning);
    let mut throughput = Assignment::new("ort");
    throughput.options.performance = Some(xpu_engine::options::PerformanceHint::Throughput);
    let o = xpu_engine_ort::SessionOptions::from_assignment(
        &throughput,
        &["CPUExecutionProvider".into()],
    )
    .unwrap();
    assert!(!o.spinning);
    // A kernel whose provider this build lacks is unavailable, with the reason.
    let mut cuda = Assignment::new("ort");
    cuda.kernels.insert(xpu_ir::NodeId(0), "ort.cuda".into());
    let err =
        xpu_engine_ort::SessionOptions::from_assignment(&cuda, &["CPUExecutionProvider".into()])
            .unwrap_err();
    assert!(
        matches!(&err, EngineError::Unavailable { reason, .. } if reason.contains("CUDAExecutionProvider")),
        "{err}"
    );
}

#[test]
fn capabilities_list_only_what_runs_here() {
    let caps = engine().capabilities();
    assert_eq!(caps.availability, Availability::Available);
    assert!(caps.version.starts_with("1.31"), "{}", caps.version);
    let names: Vec<&str> = caps.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(names.contains(&"ort.cpu"), "{names:?}");
    // The CPU wheel has no CUDA or TensorRT provider and this machine no GPU.
    assert!(!names.contains(&"ort.cuda") && !names.contains(&"ort.tensorrt"), "{names:?}");
    assert!(caps.supports(Op::MatMul, DType::F32));
    assert!(!caps.supports(Op::ReadCsv, DType::Table));
}

#[test]
fn a_missing_library_is_unavailable_not_a_crash() {
    let e = OrtEngine::load(Some(Path::new("/nonexistent/libonnxruntime.so")));
    // An earlier test in this process may already have loaded the real library.
    match e.availability() {
        Availability::Unavailable { reason } => {
            assert!(reason.contains("/nonexistent/libonnxruntime.so"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let caps = e.capabilities();
    assert!(caps.kernels.is_empty());
    let err = e.prepare(&mlp(), &Assignment::new("ort")).err().unwrap();
    assert!(matches!(err, EngineError::Unavailable { .. }), "{err}");
}

#[test]
fn bad_models_and_inputs_get_errors_naming_the_model() {
    let e = engine();
    let err =
        e.prepare_model("junk.onnx", b"\x08\x07garbage", &Assignment::new("ort")).err().unwrap();
    assert!(err.to_string().contains("junk.onnx"), "{err}");
    let model = xpu_onnx::export_model(&mlp());
    let mut exe = e.prepare_model("mlp.onnx", &model, &Assignment::new("ort")).unwrap();
    // Wrong shape: ORT refuses, the error names the model, the process goes on.
    let bad = Tensor::from_vec(vec![2, 4], vec![0f32; 8]).unwrap();
    let err = xpu_engine::Executable::run(&mut exe, &with_weights(&bad)).unwrap_err();
    assert!(err.to_string().contains("mlp.onnx"), "{err}");
    // Wrong count.
    let err = xpu_engine::Executable::run(&mut exe, &[]).unwrap_err();
    assert!(err.to_string().contains("takes 3 inputs"), "{err}");
    // Partition path: the declared input type is checked before ORT sees it.
    let mut p = e.prepare(&mlp(), &Assignment::new("ort")).unwrap();
    let wrong = Tensor::from_vec(vec![2, 3], vec![0i64; 6]).unwrap();
    let err = p.run(&with_weights(&wrong)).unwrap_err();
    assert!(matches!(err, EngineError::Input { .. }), "{err}");
    let ok = Tensor::from_vec(vec![1, 3], vec![1f32, 1.0, 1.0]).unwrap();
    assert_eq!(xpu_engine::Executable::run(&mut exe, &with_weights(&ok)).unwrap().outputs.len(), 1);
}

#[test]
fn a_cancelled_token_stops_before_running() {
    let e = engine();
    let mut exe = e.prepare(&mlp(), &Assignment::new("ort")).unwrap();
    let stop = StopToken::new();
    stop.cancel();
    let x = Tensor::from_vec(vec![1, 3], vec![1f32, 2.0, 3.0]).unwrap();
    let err = exe.run_until(&with_weights(&x), &stop).unwrap_err();
    assert!(matches!(err, EngineError::Stopped { .. }), "{err}");
}

#[test]
fn strings_and_half_floats_cross_the_boundary() {
    let e = engine();
    let g = parse(
        r#"graph "g" {
  %0: string[3] = input "s"
  %1: f16[2] = input "h"
  %2: string[3] = identity(%0)
  %3: f16[2] = neg(%1)
  return "t" = %2, "k" = %3
}"#,
    );
    let s =
        Tensor::new(vec![3], xpu_ir::TensorData::String(vec!["a".into(), "".into(), "ü".into()]))
            .unwrap();
    let h = Tensor::from_vec(vec![2], vec![half::f16::from_f32(1.5), half::f16::from_f32(-2.0)])
        .unwrap();
    let out = e.prepare(&g, &Assignment::new("ort")).unwrap().run(&[s.clone(), h]).unwrap();
    assert_eq!(out.outputs[0], s);
    assert_eq!(out.outputs[1].ty(), TensorType::of_shape(DType::F16, &[2]));
    assert_eq!(out.outputs[1].as_slice::<half::f16>().unwrap()[1].to_f32(), 2.0);
}

#[test]
fn borrowed_inputs_run_where_they_lie_and_agree_with_owned_ones() {
    // A worker hands ORT its shared memory: views where the bytes are aligned elements,
    // copies for bools, strings and misaligned bytes — the same outputs and facts either way.
    use xpu_ir::BorrowedTensor;
    let e = engine();
    let g = parse(
        r#"graph "g" {
  %0: f32[N,3] = input "x"
  %1: bool[N,3] = input "keep"
  %2: string[2] = input "s"
  %3: f32[] = constant {value = tensor<f32[]> [0.0]}
  %4: f32[N,3] = where(%1, %0, %3)
  %5: string[2] = identity(%2)
  return "y" = %4, "t" = %5
}"#,
    );
    let x = Tensor::from_vec(vec![2, 3], vec![1.0f32, -2.0, f32::NAN, 4.0, 5.5, -0.0]).unwrap();
    let keep = Tensor::from_vec(vec![2, 3], vec![true, false, true, true, false, true]).unwrap();
    let s = Tensor::new(vec![2], xpu_ir::TensorData::String(vec!["ä".into(), "".into()])).unwrap();
    let owned = [x.clone(), keep.clone(), s.clone()];
    let mut exe = e.prepare(&g, &Assignment::new("ort")).unwrap();
    assert!(exe.reads_borrowed());
    let want = exe.run(&owned).unwrap();

    let bytes: Vec<_> = owned.iter().map(|t| t.data().le_bytes().into_owned()).collect();
    // The f32 elements once where they lie (aligned), once shifted by a byte (a copy).
    let mut shifted = vec![0u8; bytes[0].len() + 1];
    shifted[1..].copy_from_slice(&bytes[0]);
    for x_bytes in [&bytes[0][..], &shifted[1..]] {
        let views = [
            BorrowedTensor { dtype: DType::F32, shape: &[2, 3], bytes: x_bytes },
            BorrowedTensor { dtype: DType::Bool, shape: &[2, 3], bytes: &bytes[1] },
            BorrowedTensor { dtype: DType::String, shape: &[2], bytes: &bytes[2] },
        ];
        let got = exe.run_borrowed(&views, &StopToken::default()).unwrap();
        assert_eq!(got.outputs[1], want.outputs[1]);
        assert_eq!(got.outputs[0].data().le_bytes(), want.outputs[0].data().le_bytes());
        let stable = |f: &&xpu_engine::Fact| f.key != "ort.run_us" && f.key != "ort.session";
        assert_eq!(
            got.facts.iter().filter(stable).collect::<Vec<_>>(),
            want.facts.iter().filter(stable).collect::<Vec<_>>()
        );
    }
    // Declared types are checked as for tensors; bytes that are not the shape's elements
    // are refused, named.
    let wrong = [
        BorrowedTensor { dtype: DType::F64, shape: &[2, 3], bytes: &[0; 48] },
        BorrowedTensor { dtype: DType::Bool, shape: &[2, 3], bytes: &bytes[1] },
        BorrowedTensor { dtype: DType::String, shape: &[2], bytes: &bytes[2] },
    ];
    let err = exe.run_borrowed(&wrong, &StopToken::default()).unwrap_err();
    assert!(matches!(err, EngineError::Input { .. }), "{err}");
    let short = [
        BorrowedTensor { dtype: DType::F32, shape: &[2, 3], bytes: &bytes[0][..20] },
        wrong[1],
        wrong[2],
    ];
    let err = exe.run_borrowed(&short, &StopToken::default()).unwrap_err();
    assert!(err.to_string().contains("x"), "{err}");
}
