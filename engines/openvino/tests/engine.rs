//! The openvino engine against the real OpenVINO libraries (`make setup` puts them in .deps/).

use std::path::Path;

use xpu_engine::{Assignment, Availability, Engine, EngineError, StopToken};
use xpu_engine_openvino::{CompileOptions, OpenVinoEngine};
use xpu_ir::{DType, Graph, NodeId, Op, Tensor};

fn engine() -> OpenVinoEngine {
    let e = OpenVinoEngine::load(None);
    assert_eq!(e.availability(), Availability::Available, "run `make setup` to fetch OpenVINO");
    e
}

fn parse(text: &str) -> Graph {
    xpu_ir::text::parse(text).unwrap_or_else(|e| panic!("{e:?}"))
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

fn with_weights(x: &Tensor) -> Vec<Tensor> {
    vec![
        x.clone(),
        Tensor::from_vec(vec![3, 2], vec![1f32, -1.0, 2.0, 0.5, -3.0, 1.0]).unwrap(),
        Tensor::from_vec(vec![2], vec![0.5f32, -0.5]).unwrap(),
    ]
}

#[test]
fn a_partition_runs_agrees_with_cpu_and_explains_its_layers() {
    let e = engine();
    let g = mlp();
    let x = Tensor::from_vec(vec![2, 3], vec![1.0f32, 2.0, 3.0, -1.0, 0.5, 4.0]).unwrap();
    let cpu = xpu_engine_cpu::CpuEngine::new();
    let want = cpu.prepare(&g, &Assignment::new("cpu")).unwrap().run(&with_weights(&x)).unwrap();
    let mut a = Assignment::new("openvino");
    a.options.threads = Some(1);
    let out = e.prepare(&g, &a).unwrap().run(&with_weights(&x)).unwrap();
    assert_eq!(out.outputs, want.outputs);
    let fact = |k: &str| out.facts.iter().find(|f| f.key == k).map(|f| f.value.clone());
    assert_eq!(fact("openvino.device").as_deref(), Some("CPU"));
    assert!(fact("openvino.execution_devices").unwrap().contains("CPU"), "{:?}", out.facts);
    // fp32 unless the plan lowers it: never the plugin's silent bf16.
    assert_eq!(fact("openvino.option.INFERENCE_PRECISION_HINT").as_deref(), Some("f32"));
    let layers: Vec<&str> =
        out.facts.iter().filter(|f| f.key == "openvino.layer").map(|f| f.value.as_str()).collect();
    assert!(!layers.is_empty(), "{:?}", out.facts);
    // Each executed layer names its primitive and runtime precision (`… ran as jit_…_FP32`).
    assert!(layers.iter().any(|l| l.contains("FP32") || l.contains("f32")), "{layers:?}");
    assert!(out.facts.iter().any(|f| f.key == "openvino.layer" && f.node.is_some()), "{layers:?}");
}

#[test]
fn policy_options_become_hints() {
    let devices = vec!["CPU".to_string()];
    let mut a = Assignment::new("openvino");
    a.precision = Some(xpu_engine::PrecisionName::Fp16);
    a.options.determinism = xpu_engine::options::Determinism::Bitwise;
    a.options.performance = Some(xpu_engine::options::PerformanceHint::Throughput);
    let o = CompileOptions::from_assignment(&a, &devices).unwrap();
    assert_eq!((o.device.as_str(), o.precision.hint()), ("CPU", "f16"));
    assert_eq!(o.execution_mode, "ACCURACY");
    assert_eq!(o.performance, "THROUGHPUT");
    // Several devices in one partition: HETERO, NPU first.
    let mut h = Assignment::new("openvino");
    h.kernels.insert(NodeId(0), "openvino.cpu".into());
    h.kernels.insert(NodeId(1), "openvino.npu".into());
    let here = CompileOptions::from_assignment(&h, &["CPU".into(), "NPU".into()]).unwrap();
    assert_eq!(here.device, "HETERO:NPU,CPU");
    // …which this machine cannot do: unavailable, naming the device.
    let err = CompileOptions::from_assignment(&h, &devices).unwrap_err();
    assert!(
        matches!(&err, EngineError::Unavailable { reason, .. } if reason.contains("no NPU device")),
        "{err}"
    );
}

#[test]
fn capabilities_say_why_the_npu_and_gpu_kernels_are_missing() {
    let caps = engine().capabilities();
    let names: Vec<&str> = caps.kernels.iter().map(|k| k.name.as_str()).collect();
    assert!(names.contains(&"openvino.cpu") && names.contains(&"openvino.auto"), "{names:?}");
    assert!(caps.version.starts_with("2026.4"), "{}", caps.version);
    let npu = caps.unavailable_kernels.get("openvino.npu").expect("npu is explained");
    assert!(npu.contains("no NPU device"), "{npu}");
    assert!(caps.supports(Op::Conv, DType::F32));
    assert!(!caps.supports(Op::Identity, DType::String));
}

#[test]
fn a_missing_library_is_unavailable_not_a_crash() {
    let e = OpenVinoEngine::load(Some(Path::new("/nonexistent/openvino")));
    match e.availability() {
        Availability::Unavailable { reason } => {
            assert!(reason.contains("/nonexistent/openvino"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(e.capabilities().kernels.is_empty());
    let err = e.prepare(&mlp(), &Assignment::new("openvino")).err().unwrap();
    assert!(matches!(err, EngineError::Unavailable { .. }), "{err}");
}

#[test]
fn bad_models_and_inputs_get_errors_naming_the_model() {
    let e = engine();
    let err = e
        .prepare_model("junk.onnx", b"\x08\x07garbage", &Assignment::new("openvino"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("junk.onnx"), "{err}");
    let model = xpu_onnx::export_model(&mlp());
    let mut exe = e.prepare_model("mlp.onnx", &model, &Assignment::new("openvino")).unwrap();
    let bad = Tensor::from_vec(vec![2, 4], vec![0f32; 8]).unwrap();
    let err = xpu_engine::Executable::run(&mut exe, &with_weights(&bad)).unwrap_err();
    assert!(err.to_string().contains("mlp.onnx"), "{err}");
    let err = xpu_engine::Executable::run(&mut exe, &[]).unwrap_err();
    assert!(err.to_string().contains("takes 3 inputs"), "{err}");
    let ok = Tensor::from_vec(vec![1, 3], vec![1f32, 1.0, 1.0]).unwrap();
    assert_eq!(xpu_engine::Executable::run(&mut exe, &with_weights(&ok)).unwrap().outputs.len(), 1);
}

#[test]
fn a_cancelled_token_stops_before_running() {
    let mut exe = engine().prepare(&mlp(), &Assignment::new("openvino")).unwrap();
    let stop = StopToken::new();
    stop.cancel();
    let x = Tensor::from_vec(vec![1, 3], vec![1f32, 2.0, 3.0]).unwrap();
    let err = exe.run_until(&with_weights(&x), &stop).unwrap_err();
    assert!(matches!(err, EngineError::Stopped { .. }), "{err}");
}
