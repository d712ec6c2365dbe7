//! The ort and openvino engines through `xpuctl run`: the example policies put the whole
//! model on them, outputs match the cpu engine, the explanation carries each engine's own
//! facts, and on this CPU-only machine the NPU policy says the NPU is unavailable and what
//! ran instead — or fails with that reason when fallback is denied.

use std::process::Command;

mod common;
use common::{repo, xpuctl};

/// Runs examples/mlp.onnx under `policy`; returns (stdout, the `probs` output as f32s).
fn run_mlp(policy: &str) -> (String, Vec<f32>) {
    run_mlp_with(policy, &[])
}

/// [`run_mlp`] with more `xpuctl run` arguments.
fn run_mlp_with(policy: &str, more: &[&str]) -> (String, Vec<f32>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let mut args = vec![
        "run",
        "--policy",
        policy,
        "examples/mlp.onnx",
        "-i",
        "x=examples/mlp_input.npy",
        "--explain",
        "--out",
        &out,
    ];
    args.extend_from_slice(more);
    let (code, stdout, stderr) = xpuctl(&args);
    assert_eq!(code, 0, "{policy}: {stderr}\n{stdout}");
    let bytes = std::fs::read(dir.path().join("probs.npy")).unwrap();
    let header = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let probs = bytes[header..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (stdout, probs)
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

#[test]
fn example_policies_run_the_whole_model_on_ort_and_openvino() {
    let (_, reference) = run_mlp("policies/examples/cpu-only.toml");
    let (ort, probs) = run_mlp("policies/examples/ort-cpu.toml");
    assert!(ort.contains("on ort in"), "{ort}");
    assert!(ort.contains("ort.provider") && ort.contains("CPUExecutionProvider"), "{ort}");
    assert!(ort.contains("ort.option.intra_threads = 2"), "{ort}");
    assert!(close(&probs, &reference, 1e-5), "{probs:?} vs {reference:?}");
    let (ov, probs) = run_mlp("policies/examples/openvino-cpu.toml");
    assert!(ov.contains("on openvino in"), "{ov}");
    assert!(ov.contains("openvino.execution_devices = CPU"), "{ov}");
    assert!(ov.contains("INFERENCE_PRECISION_HINT = f32"), "{ov}");
    assert!(ov.contains("openvino.layer") && ov.contains("_f32"), "{ov}");
    assert!(close(&probs, &reference, 1e-5), "{probs:?} vs {reference:?}");
}

/// `--isolate`: ort and openvino run in worker processes (tensors through shared memory)
/// and give the in-process engines' outputs bit for bit, with their own facts.
#[test]
fn isolated_engines_give_the_same_outputs() {
    for (policy, engine) in [("ort-cpu", "ort"), ("openvino-cpu", "openvino")] {
        let policy = format!("policies/examples/{policy}.toml");
        let (_, in_process) = run_mlp(&policy);
        let (out, isolated) = run_mlp_with(&policy, &["--isolate"]);
        assert!(out.contains(&format!("on {engine} in")), "{out}");
        assert_eq!(isolated, in_process, "{engine}: worker and in-process outputs differ");
    }
}

#[test]
fn the_npu_policy_explains_the_missing_npu_and_what_ran_instead() {
    let (out, probs) = run_mlp("policies/examples/npu-openvino.toml");
    assert!(
        out.contains("not used: openvino.npu is unavailable here: OpenVINO found no NPU device"),
        "{out}"
    );
    assert!(out.contains("instead n1 on openvino.cpu"), "{out}");
    // fp16 as the policy asks; the CPU plugin says what it really computed in.
    assert!(out.contains("INFERENCE_PRECISION_HINT = f16"), "{out}");
    let (_, reference) = run_mlp("policies/examples/cpu-only.toml");
    assert!(close(&probs, &reference, 2e-2), "{probs:?} vs {reference:?}");
}

#[test]
fn pinning_the_npu_with_fallback_denied_fails_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("npu-only.toml");
    std::fs::write(
        &policy,
        "[policy]\nname = \"npu-only\"\n[engines]\norder = [\"openvino\", \"cpu\"]\nfallback = \"deny\"\n[kernels]\nmatmul = \"openvino.npu\"\n",
    )
    .unwrap();
    let (code, stdout, stderr) = xpuctl(&[
        "run",
        "--policy",
        policy.to_str().unwrap(),
        "examples/mlp.onnx",
        "-i",
        "x=examples/mlp_input.npy",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("openvino.npu is unavailable here: OpenVINO found no NPU device"),
        "{stderr}"
    );
    // Nothing else may take the pinned op: the plan fails, naming the node and why.
    assert!(stderr.contains("no plan") && stderr.contains("Unplaceable: n1"), "{stderr}");
}

#[test]
fn engines_lists_both_with_their_kernels() {
    let (code, stdout, stderr) = xpuctl(&["engines", "--format", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let inv: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let engine = |name: &str| {
        inv["engines"].as_array().unwrap().iter().find(|e| e["engine"] == name).cloned().unwrap()
    };
    assert_eq!(engine("ort")["availability"]["status"], "available");
    assert_eq!(engine("openvino")["availability"]["status"], "available");
    let npu = &engine("openvino")["unavailable_kernels"]["openvino.npu"];
    assert!(npu.as_str().unwrap().contains("no NPU device"), "{npu}");
    // Devices are typed ids; OpenVINO's CPU plugin is the host, under its own name.
    assert_eq!(engine("cpu")["devices"], serde_json::json!([{ "id": "host" }]));
    assert_eq!(
        engine("openvino")["devices"][0],
        serde_json::json!({ "id": "host", "name": "CPU" })
    );
    let (code, text, stderr) = xpuctl(&["engines"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(text.contains("cpu 0.1.0 — available — devices: host"), "{text}");
    assert!(text.contains("devices: host (CPU)"), "{text}");
    assert!(text.contains(", on host"), "{text}");
}

#[test]
fn a_missing_runtime_library_is_reported_not_fatal() {
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .args(["engines", "--format", "json"])
        .current_dir(repo())
        .env("XPU_ORT_LIBRARY", "/nonexistent/libonnxruntime.so")
        .env("XPU_OPENVINO_DIR", "/nonexistent/openvino")
        .output()
        .unwrap();
    assert!(out.status.success());
    let inv: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in ["ort", "openvino"] {
        let e = inv["engines"].as_array().unwrap().iter().find(|e| e["engine"] == name).unwrap();
        assert_eq!(e["availability"]["status"], "unavailable", "{e}");
        assert!(e["availability"]["reason"].as_str().unwrap().contains("/nonexistent/"), "{e}");
    }
}

#[test]
fn a_library_of_the_wrong_kind_is_reported_not_fatal() {
    // Each engine pointed at the other's library: both load nothing and say why.
    let deps = repo().join(".deps");
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .args(["engines", "--format", "json"])
        .current_dir(repo())
        .env("XPU_ORT_LIBRARY", deps.join("openvino/libopenvino_c.so"))
        .env("XPU_OPENVINO_DIR", deps.join("onnxruntime/libonnxruntime.so"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let inv: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (name, says) in [("ort", "OrtGetApiBase"), ("openvino", "not a usable OpenVINO")] {
        let e = inv["engines"].as_array().unwrap().iter().find(|e| e["engine"] == name).unwrap();
        assert_eq!(e["availability"]["status"], "unavailable", "{e}");
        let reason = e["availability"]["reason"].as_str().unwrap();
        assert!(reason.contains(says), "{name}: {reason}");
    }
}
