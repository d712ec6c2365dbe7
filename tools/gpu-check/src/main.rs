//! `xpu-gpu-check`: the cuda engine on a real GPU, from a slim release binary (no LLVM, no
//! DuckDB, no ONNX Runtime: it fits the 64 MiB a GPU test machine takes). `make gpu-check`
//! runs it there (tools/gpu-check/run.sh) beside PyTorch's side of the benchmarks.
//!
//! `xpu-gpu-check PROGRAMS_DIR` prints one JSON object: the engine's availability and
//! device facts; every program of the directory at a small batch on the cuda engine (eager
//! and captured-graph runs) against the cpu engine; fused chains and row groups on 16M
//! elements (device-resident inputs, median of timed runs) with their bandwidth against a
//! device-to-device copy of the same bytes; and a captured 100-kernel partition replayed
//! against the same partition launched eagerly; cuBLASLt cases and bf16 GEMMs; and every
//! program planned under `policies/examples/latency-gpu.toml` on the cuda and cpu engines
//! and run by GraphExec, as a job would be; last, a sticky error in a worker process and in
//! this one ([`sticky`]). Exit 0 when every program matched, 1 when one
//! did not, 3 when the engine is unavailable (the reason is in the JSON).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{Value as Json, json};
use xpu_engine::options::Capture;
use xpu_engine::{Assignment, Engine, HostMemory, StopToken, Value};
use xpu_engine_cuda::{CudaConfig, CudaEngine};
use xpu_ir::{Graph, Tensor};

/// Elements of the benchmark tensors: 16M, as the issue's bars name them.
const BENCH_ROWS: usize = 16 * 1024;

mod sticky;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // Started again by the sticky-error check as the cuda engine's worker process.
    if args.iter().any(|a| a == "--engine") {
        std::process::exit(sticky::serve_worker());
    }
    let dir = PathBuf::from(args.get(1).map_or("tests/programs", String::as_str));
    match check(&dir) {
        Ok((report, code)) => {
            println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            std::process::exit(code);
        }
        Err(e) => {
            eprintln!("xpu-gpu-check: {e:#}");
            std::process::exit(2);
        }
    }
}

/// The engine's configuration here and in the worker: NVRTC and cuBLASLt from
/// `$XPU_CUDA_LIBRARY_DIR` (run.sh sets it), no disk cache.
fn cuda_config() -> CudaConfig {
    CudaConfig {
        library_dir: std::env::var_os("XPU_CUDA_LIBRARY_DIR").map(PathBuf::from),
        cache_dir: None,
    }
}

fn check(dir: &Path) -> Result<(Json, i32)> {
    let engine = CudaEngine::new(cuda_config());
    let caps = engine.capabilities();
    if let Some(reason) = engine.unavailable_reason() {
        return Ok((json!({"available": false, "reason": reason}), 3));
    }
    let programs = programs(dir)?;
    let mut rows = Vec::new();
    let mut all_ok = true;
    for (name, g) in &programs {
        let row = conformance(&engine, name, g);
        all_ok &= row["ok"].as_bool().unwrap_or(false);
        rows.push(row);
    }
    let copy = device_copy_gbps(&engine)?;
    let mut bench = Vec::new();
    for (name, g) in &programs {
        if name.ends_with("_chain") || name.ends_with("_rows") {
            bench.push(
                throughput(&engine, name, g, copy)
                    .unwrap_or_else(|e| json!({"program": name, "error": format!("{e:#}")})),
            );
        }
    }
    // The simplest chain (one add, a broadcast row): what a generated kernel reaches when
    // it is all memory, the roof the other chains are read against.
    // And the simplest row reduction (a sum per row): what a kernel that only reads
    // reaches, the roof log-sum-exp is read against.
    for (name, text) in [("add_row (reference)", ADD_ROW), ("sum_rows (reference)", SUM_ROWS)] {
        let g = xpu_ir::text::parse(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        bench.push(
            throughput(&engine, name, &g, copy)
                .unwrap_or_else(|e| json!({"program": name, "error": format!("{e:#}")})),
        );
    }
    let replay = replay_vs_eager(&engine).unwrap_or_else(|e| json!({"error": format!("{e:#}")}));
    let transfers = transfers(&engine).unwrap_or_else(|e| json!({"error": format!("{e:#}")}));
    let oom = out_of_memory(&engine);
    all_ok &= oom["ok"].as_bool().unwrap_or(false);
    let mut whole = Vec::new();
    for (name, g) in programs.iter().filter(|(n, _)| n == "mlp" || n == "matmul_square") {
        whole.push(
            whole_capture(&engine, g)
                .map(|mut r| {
                    r["program"] = json!(name);
                    r
                })
                .unwrap_or_else(|e| json!({"program": name, "error": format!("{e:#}")})),
        );
    }
    all_ok &= transfers["ok"].as_bool().unwrap_or(false);
    let mut products = Vec::new();
    for case in library_cases() {
        let row = library_case(&engine, &case);
        all_ok &= row["ok"].as_bool().unwrap_or(false);
        products.push(row);
    }
    for case in [("bias + relu", BIAS_RELU), ("bias + gelu(tanh)", BIAS_GELU)] {
        let row = special_values(&engine, case.0, case.1);
        all_ok &= row["ok"].as_bool().unwrap_or(false);
        products.push(row);
    }
    let planned_runs = planned(dir, &programs).unwrap_or_else(|e| {
        vec![json!({"program": "(all)", "ok": false, "error": format!("{e:#}")})]
    });
    for r in &planned_runs {
        all_ok &= r["ok"].as_bool().unwrap_or(false);
    }
    let mut gemm = serde_json::Map::new();
    for n in [4096usize, 8192] {
        gemm.insert(
            n.to_string(),
            gemm_bf16(&engine, n).unwrap_or_else(|e| json!({"error": format!("{e:#}")})),
        );
    }
    // Last: it poisons this process's CUDA state (the engine is unavailable after it).
    let sticky = sticky::sticky_error(&engine, &programs);
    all_ok &= sticky["ok"].as_bool().unwrap_or(false);
    let report = json!({
        "available": true,
        "engine": caps.version,
        "devices": caps.devices.iter().map(|d| json!({"id": d.id.to_string(), "name": d.name, "memory_bytes": d.memory_bytes})).collect::<Vec<_>>(),
        "unavailable_kernels": caps.unavailable_kernels,
        "conformance": rows,
        "device_copy_gbps": copy,
        "throughput": bench,
        "graph_replay": replay,
        "transfers": transfers,
        "out_of_memory": oom,
        "whole_capture": whole,
        "cublaslt": products,
        "planned": planned_runs,
        "gemm_bf16": gemm,
        "sticky_error": sticky,
    });
    Ok((report, if all_ok { 0 } else { 1 }))
}

/// Every `.sgr` program of `dir`, by file stem, sorted.
fn programs(dir: &Path) -> Result<Vec<(String, Graph)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("sgr") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let g =
            xpu_ir::text::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("program").to_string();
        out.push((stem, g));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Inputs for `g` with every symbolic dimension bound to `rows`: varied, NaN-free values
/// in [-4, 4).
fn inputs(g: &Graph, rows: usize) -> Result<Vec<Tensor>> {
    inputs_within(g, rows, 4.0)
}

/// [`inputs`] in [-half, half) (`half` a power of two keeps the values exact multiples).
fn inputs_within(g: &Graph, rows: usize, half: f32) -> Result<Vec<Tensor>> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let dims = g.ty(v).dims.as_ref().context("an input of unknown rank")?;
            let shape: Vec<usize> =
                dims.iter().map(|d| d.known().map_or(rows, |n| n as usize)).collect();
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n)
                .map(|i| ((((i * 7919 + k * 31) % 1000) as f32 / 125.0) - 4.0) * (half / 4.0))
                .collect();
            Ok(Tensor::from_vec(shape, data)?)
        })
        .collect()
}

fn assignment(engine: &str, capture: Capture) -> Assignment {
    let mut a = Assignment::new(engine);
    a.options.capture = capture;
    a
}

/// The variants a program runs in: eager and captured with the default (contracted) math,
/// and eager under `determinism = "bitwise"` (strict math), each named for the report.
fn variants() -> [(&'static str, Assignment); 3] {
    let mut strict = assignment("cuda", Capture::Eager);
    strict.options.determinism = xpu_engine::options::Determinism::Bitwise;
    [
        ("eager", assignment("cuda", Capture::Eager)),
        ("graph", assignment("cuda", Capture::Graph)),
        ("bitwise", strict),
    ]
}

/// `g` at batch 37 on the cuda engine, three runs in each variant (captured: warm-up,
/// capture, replay), against the cpu engine: the largest error relative to the values;
/// the bitwise runs must also repeat their bits exactly.
fn conformance(engine: &CudaEngine, name: &str, g: &Graph) -> Json {
    let run = || -> Result<Json> {
        let inputs = inputs(g, 37)?;
        let want = xpu_engine_cpu::CpuEngine::new()
            .prepare(g, &Assignment::new("cpu"))?
            .run(&inputs)?
            .outputs;
        let mut worst = 0f64;
        let mut facts = Vec::new();
        let mut timings = Vec::new();
        let mut repeats = true;
        for (variant, a) in variants() {
            let mut exe = engine.prepare(g, &a)?;
            let mut first: Option<Vec<Tensor>> = None;
            for _ in 0..3 {
                let got = exe.run(&inputs)?;
                for (a, b) in got.outputs.iter().zip(&want) {
                    worst = worst.max(relative_error(a, b)?);
                }
                if variant == "bitwise" {
                    match &first {
                        None => first = Some(got.outputs.clone()),
                        Some(f) => {
                            repeats &= f.iter().zip(&got.outputs).all(|(x, y)| same_bits(x, y))
                        }
                    }
                }
                facts = got.facts;
                timings = got.timings;
            }
        }
        let ok = worst <= 1e-5 && repeats;
        Ok(
            json!({"program": name, "ok": ok, "max_relative_error": worst, "bitwise_repeats": repeats,
                  "kernels": kernels_of(&timings),
                  "facts": facts.iter().map(|f| format!("{} = {}", f.key, f.value)).collect::<Vec<_>>()}),
        )
    };
    run().unwrap_or_else(|e| {
        // A program with ops the engine does not claim runs elsewhere under a plan; here it
        // is reported, not failed.
        let unsupported = e
            .downcast_ref::<xpu_engine::EngineError>()
            .is_some_and(|e| matches!(e, xpu_engine::EngineError::Unsupported { .. }));
        json!({"program": name, "ok": unsupported, "unsupported": unsupported, "error": format!("{e:#}")})
    })
}

/// The distinct kernels a run's timings name.
fn kernels_of(timings: &[xpu_engine::NodeTiming]) -> Vec<String> {
    let mut k: Vec<String> = timings.iter().map(|t| t.kernel.clone()).collect();
    k.sort();
    k.dedup();
    k
}

/// Whether two tensors hold the same bits (a NaN equal to a NaN of the same bits).
fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    a.shape() == b.shape()
        && a.dtype() == b.dtype()
        && a.data().to_le_bytes() == b.data().to_le_bytes()
}

/// max |a − b| / max(1, max |b|): the largest error relative to the output's scale (a
/// product's elements that cancel to near zero carry the rounding of their large terms).
/// NaN where both are NaN counts as equal.
fn relative_error(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    anyhow::ensure!(
        x.len() == y.len() && a.shape() == b.shape(),
        "shape {:?} vs {:?}",
        a.shape(),
        b.shape()
    );
    let scale = y.iter().filter(|q| q.is_finite()).fold(1.0f64, |m, q| m.max(q.abs()));
    Ok(x.iter()
        .zip(&y)
        .map(|(p, q)| if p.is_nan() && q.is_nan() || p == q { 0.0 } else { (p - q).abs() / scale })
        .fold(0.0, f64::max))
}

/// Median seconds of `reps` calls of `f` after three warm-up calls.
/// Uploads and downloads of 64 MiB through the tensor's pageable pages and through the
/// engine's pinned staging (`memory.pinned_host`): GB/s of each (median of 10 whole calls),
/// and whether every round trip gave back the bytes it sent.
fn transfers(engine: &CudaEngine) -> Result<Json> {
    let n = 16 << 20;
    let t = Tensor::from_vec(vec![n], (0..n).map(|i| (i % 65_521) as f32 * 0.5).collect())?;
    let bytes = (n * 4) as f64;
    let mut out = json!({"bytes": n * 4, "ok": true});
    for (name, host) in [("pageable", HostMemory::Pageable), ("pinned", HostMemory::Pinned)] {
        let mut back = None;
        let up = median_secs(10, || {
            back = Some(engine.upload(&t, xpu_engine_cuda::DEVICE, host)?);
            Ok(())
        })?;
        let Some(Value::Device(b)) = back else { anyhow::bail!("upload gave no device value") };
        let mut got = None;
        let down = median_secs(10, || {
            got = Some(engine.download(b.as_ref(), host)?);
            Ok(())
        })?;
        let same = got.as_ref() == Some(&t);
        out["ok"] = json!(out["ok"].as_bool().unwrap_or(false) && same);
        out[name] = json!({"upload_gbps": bytes / up / 1e9, "download_gbps": bytes / down / 1e9, "round_trip_equal": same});
    }
    Ok(out)
}

/// A program with cuBLASLt calls at batch 37, device-resident: median whole-call time of
/// eager runs and of replays of the partition captured whole (cuBLASLt calls and kernels
/// in one graph), the capture fact, and whether the replays' outputs equal the eager ones.
fn whole_capture(engine: &CudaEngine, g: &Graph) -> Result<Json> {
    let values: Vec<Value> = inputs(g, 37)?
        .iter()
        .map(|t| engine.upload(t, xpu_engine_cuda::DEVICE, HostMemory::Pageable))
        .collect::<Result<_, _>>()?;
    let mut out = json!({});
    let mut results: Vec<Vec<Tensor>> = Vec::new();
    for capture in [Capture::Eager, Capture::Graph] {
        let mut exe = engine.prepare(g, &assignment("cuda", capture))?;
        let mut facts = Vec::new();
        let mut last = Vec::new();
        let secs = median_secs(50, || {
            let run = exe.run_values(&values, &StopToken::default())?;
            facts = run.facts;
            last = run.outputs;
            Ok(())
        })?;
        let host: Vec<Tensor> = last
            .iter()
            .map(|v| match v {
                Value::Device(b) => Ok(engine.download(b.as_ref(), HostMemory::Pageable)?),
                Value::Host(t) => Ok(t.clone()),
            })
            .collect::<Result<_>>()?;
        results.push(host);
        let name = if capture == Capture::Eager { "eager_us" } else { "graph_us" };
        out[name] = json!(secs * 1e6);
        if capture == Capture::Graph {
            out["capture"] =
                json!(facts.iter().find(|f| f.key == "cuda.capture").map(|f| f.value.clone()));
        }
    }
    out["equal"] = json!(results[0] == results[1]);
    Ok(out)
}

fn median_secs(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Runs each 16M-element program is timed over, and copies the copy is: the same count and
/// the same statistic (the median) on both sides of the ratio.
const BENCH_REPS: usize = 50;

/// Device-to-device copy bandwidth (bytes read + written per second) over 64 MiB, timed
/// by the engine with events around `cuMemcpyDtoDAsync` (one copy a measurement, as a
/// program's run is one run): the memory roof the fused kernels are measured against.
fn device_copy_gbps(engine: &CudaEngine) -> Result<f64> {
    let bytes = 64 << 20;
    let mut times = Vec::with_capacity(BENCH_REPS);
    for _ in 0..BENCH_REPS {
        times.push(engine.time_device_copy(bytes)?);
    }
    times.sort_by(f64::total_cmp);
    Ok(2.0 * bytes as f64 / times[times.len() / 2] / 1e9)
}

/// A program on 16M-element inputs already on the device: median time of a run (launches
/// and the output copy, synchronised: `ms`), median device time of its kernels (events
/// around them: `device_ms`, what the copy is timed by too) and the bandwidth that gives
/// (inputs + outputs bytes) against the copy's.
fn throughput(engine: &CudaEngine, name: &str, g: &Graph, copy_gbps: f64) -> Result<Json> {
    let inputs = inputs(g, BENCH_ROWS)?;
    let values: Vec<Value> = inputs
        .iter()
        .map(|t| engine.upload(t, xpu_engine_cuda::DEVICE, HostMemory::Pageable))
        .collect::<Result<_, _>>()?;
    let mut out = json!({"program": name});
    for (variant, a) in variants() {
        let mut exe = engine.prepare(g, &a)?;
        let mut out_bytes = 0u64;
        let mut device = Vec::new();
        let secs = median_secs(BENCH_REPS, || {
            let run = exe.run_values(&values, &StopToken::default())?;
            out_bytes = run.outputs.iter().map(|v| v.size_bytes()).sum();
            device.push(run.timings.iter().map(|t| t.nanos).sum::<u64>() as f64 / 1e9);
            Ok(())
        })?;
        device.sort_by(f64::total_cmp);
        let device_secs = device[device.len() / 2];
        let in_bytes: u64 = values.iter().map(|v| v.size_bytes()).sum();
        let gbps = (in_bytes + out_bytes) as f64 / device_secs / 1e9;
        out[variant] = json!({
            "ms": secs * 1e3, "device_ms": device_secs * 1e3, "gbps": gbps,
            "of_copy": gbps / copy_gbps});
    }
    Ok(out)
}

/// A partition of 100 small kernels (softmax of softmax … over 8×64: a reduction roots each
/// kernel) replayed from a captured graph against the same launched eagerly: µs per kernel.
fn replay_vs_eager(engine: &CudaEngine) -> Result<Json> {
    let mut text = String::from("graph \"softmax100\" {\n  %0: f32[8,64] = input \"x\"\n");
    for i in 1..=100 {
        text.push_str(&format!("  %{i}: f32[8,64] = softmax(%{}) {{axis = -1}}\n", i - 1));
    }
    text.push_str("  return \"y\" = %100\n}\n");
    let g = xpu_ir::text::parse(&text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let x = engine.upload(&inputs(&g, 8)?[0], xpu_engine_cuda::DEVICE, HostMemory::Pageable)?;
    let mut out = json!({"kernels": 100});
    for capture in [Capture::Eager, Capture::Graph] {
        let mut exe = engine.prepare(&g, &assignment("cuda", capture))?;
        let mut facts = Vec::new();
        let mut capture_ms = None;
        let secs = median_secs(50, || {
            facts = exe.run_values(std::slice::from_ref(&x), &StopToken::default())?.facts;
            // The run that captured (and instantiated) the graph says what that cost.
            if let Some(f) = facts.iter().find(|f| f.key == "cuda.capture_ms") {
                capture_ms = Some(f.value.clone());
            }
            Ok(())
        })?;
        out[format!("{capture:?}").to_lowercase()] = json!({
            "us_per_kernel": secs * 1e6 / 100.0,
            "capture_and_instantiate_ms": capture_ms,
            "facts": facts.iter().map(|f| format!("{} = {}", f.key, f.value)).collect::<Vec<_>>(),
        });
    }
    Ok(out)
}

const SUM_ROWS: &str = r#"graph "sum_rows" {
  %0: f32[N,1024] = input "x"
  %1: i64[1] = constant {value = tensor<i64[1]> [-1]}
  %2: f32[N,1] = reduce_sum(%0, %1)
  return "y" = %2
}"#;

const ADD_ROW: &str = r#"graph "add_row" {
  %0: f32[N,1024] = input "x"
  %1: f32[1024] = input "b"
  %2: f32[N,1024] = add(%0, %1)
  return "y" = %2
}"#;

/// A product checked on cuBLASLt: its program (`{T}` the operands' dtype), the dtype, the
/// precision asked for, the largest error allowed and the epilogue the explanation must
/// name.
struct LibraryCase {
    name: &'static str,
    text: &'static str,
    dtype: &'static str,
    tf32: bool,
    tolerance: f64,
    epilogue: &'static str,
}

fn library_cases() -> Vec<LibraryCase> {
    let case = |name, text, dtype, tf32, tolerance, epilogue| LibraryCase {
        name,
        text,
        dtype,
        tf32,
        tolerance,
        epilogue,
    };
    vec![
        case("f32 strict, bias + relu", BIAS_RELU, "f32", false, 1e-5, "bias + relu"),
        case("tf32, bias + relu", BIAS_RELU, "f32", true, 5e-3, "bias + relu"),
        case("bf16, bias + relu", BIAS_RELU, "bf16", false, 2e-2, "bias + relu"),
        case("f16, bias + gelu(tanh)", BIAS_GELU, "f16", false, 1e-2, "bias + gelu(tanh)"),
        case("f32 batched, broadcast b", BATCHED, "f32", false, 1e-5, "none"),
        case("bf16 batched, both", BATCHED_BOTH, "bf16", false, 2e-2, "none"),
        case("Gemm f32 transB, C bias + relu", GEMM_LINEAR, "f32", false, 1e-5, "bias + relu"),
        case("Gemm bf16 transA, alpha/beta, C matrix", GEMM_FULL_C, "bf16", false, 2e-2, "none"),
        // Attention's scores: k transposed by a node the call folds into its B flag.
        case("f32 batched q·kᵀ, transpose folded (Bᵀ)", QK_T, "f32", false, 1e-5, "none"),
        case(
            "bf16 batched q·kᵀ + bias + relu, transpose folded (Bᵀ)",
            QK_T_RELU,
            "bf16",
            false,
            2e-2,
            "bias + relu",
        ),
    ]
}

const QK_T: &str = r#"graph "lt" {
  %0: {T}[3,37,64] = input "q"
  %1: {T}[3,48,64] = input "k"
  %2: {T}[3,64,48] = transpose(%1) {perm = [0, 2, 1]}
  %3: {T}[3,37,48] = matmul(%0, %2) @name("scores")
  return "s" = %3
}"#;

const QK_T_RELU: &str = r#"graph "lt" {
  %0: {T}[3,37,64] = input "q"
  %1: {T}[3,48,64] = input "k"
  %2: {T}[48] = input "bias"
  %3: {T}[3,64,48] = transpose(%1) {perm = [0, 2, 1]}
  %4: {T}[3,37,48] = matmul(%0, %3) @name("scores")
  %5: {T}[3,37,48] = add(%4, %2)
  %6: {T}[3,37,48] = relu(%5)
  return "s" = %6
}"#;

const BIAS_RELU: &str = r#"graph "lt" {
  %0: {T}[37,64] = input "a"
  %1: {T}[64,48] = input "b"
  %2: {T}[48] = input "bias"
  %3: {T}[37,48] = matmul(%0, %1) @name("mm")
  %4: {T}[37,48] = add(%3, %2)
  %5: {T}[37,48] = relu(%4)
  return "y" = %5
}"#;

const BIAS_GELU: &str = r#"graph "lt" {
  %0: {T}[33,128] = input "a"
  %1: {T}[128,64] = input "b"
  %2: {T}[64] = input "bias"
  %3: {T}[33,64] = matmul(%0, %1) @name("mm")
  %4: {T}[33,64] = add(%2, %3)
  %5: {T}[33,64] = gelu(%4) {approximate = "tanh"}
  return "y" = %5
}"#;

const GEMM_LINEAR: &str = r#"graph "lt" {
  %0: {T}[37,64] = input "a"
  %1: {T}[48,64] = input "w"
  %2: {T}[48] = input "c"
  %3: {T}[37,48] = gemm(%0, %1, %2) {transB = 1} @name("mm")
  %4: {T}[37,48] = relu(%3)
  return "y" = %4
}"#;

const GEMM_FULL_C: &str = r#"graph "lt" {
  %0: {T}[64,37] = input "a"
  %1: {T}[64,48] = input "b"
  %2: {T}[37,48] = input "c"
  %3: {T}[37,48] = gemm(%0, %1, %2) {transA = 1, alpha = 0.5, beta = 2.0} @name("mm")
  return "y" = %3
}"#;

const BATCHED: &str = r#"graph "lt" {
  %0: {T}[3,37,64] = input "a"
  %1: {T}[64,48] = input "b"
  %2: {T}[3,37,48] = matmul(%0, %1) @name("mm")
  return "y" = %2
}"#;

const BATCHED_BOTH: &str = r#"graph "lt" {
  %0: {T}[2,3,37,64] = input "a"
  %1: {T}[2,3,64,48] = input "b"
  %2: {T}[2,3,37,48] = matmul(%0, %1) @name("mm")
  %3: {T}[2,3,37,48] = softmax(%2) {axis = -1}
  return "y" = %3
}"#;

/// A product on cuBLASLt against the cpu engine in f32 on the same (rounded) inputs; the
/// run must name `cuda.cublaslt` for the product and the epilogue it fused.
fn library_case(engine: &CudaEngine, case: &LibraryCase) -> Json {
    let run = || -> Result<Json> {
        let parse = |t: &str| {
            xpu_ir::text::parse(&case.text.replace("{T}", t)).map_err(|e| anyhow::anyhow!("{e}"))
        };
        let (g, reference) = (parse(case.dtype)?, parse("f32")?);
        let dtype = g.ty(g.inputs[0]).dtype;
        // Scaled to ±0.5: the products stay near 1, where bf16's rounding of the result
        // is what the tolerance allows for (at ±4 a softmax of bf16 logits near 100 moves by
        // more than any tolerance that still catches a wrong product).
        let f32_inputs = inputs_within(&reference, 1, 0.5)?;
        let typed: Vec<Tensor> = f32_inputs
            .iter()
            .map(|t| t.to_float_dtype(dtype).context("cast"))
            .collect::<Result<_>>()?;
        let rounded: Vec<Tensor> = typed
            .iter()
            .map(|t| t.to_float_dtype(xpu_ir::DType::F32).context("cast back"))
            .collect::<Result<_>>()?;
        let want = xpu_engine_cpu::CpuEngine::new()
            .prepare(&reference, &Assignment::new("cpu"))?
            .run(&rounded)?
            .outputs;
        let mut a = assignment("cuda", Capture::Eager);
        if case.tf32 {
            a.precision = Some(xpu_engine::options::PrecisionName::Tf32);
        }
        let got = engine.prepare(&g, &a)?.run(&typed)?;
        let mut worst = 0f64;
        for (x, y) in got.outputs.iter().zip(&want) {
            worst = worst.max(relative_error(x, y)?);
        }
        let plan = fact(&got.facts, "cuda.cublaslt");
        let on_library = kernels_of(&got.timings).iter().any(|k| k == "cuda.cublaslt");
        // A folded transpose shows as the operand flag in the plan.
        let flag = !case.name.contains("(Bᵀ)") || plan.contains(" Bᵀ");
        let fused = plan.contains(&format!("epilogue {}:", case.epilogue)) && flag;
        Ok(json!({"case": case.name, "ok": worst <= case.tolerance && on_library && fused,
                  "max_relative_error": worst, "tolerance": case.tolerance,
                  "kernels": kernels_of(&got.timings), "plan": plan}))
    };
    run().unwrap_or_else(|e| json!({"case": case.name, "ok": false, "error": format!("{e:#}")}))
}

/// A fused cuBLASLt epilogue fed NaN and ±inf (placed in the bias, so whole columns of the
/// product carry them) against the cpu engine, element by element: a NaN must stay a NaN
/// (the cpu engine's ReLU keeps it), an infinity its sign.
fn special_values(engine: &CudaEngine, epilogue: &str, text: &str) -> Json {
    let name = format!("f32 {epilogue}, NaN and ±inf in the bias");
    let run = || -> Result<Json> {
        let g =
            xpu_ir::text::parse(&text.replace("{T}", "f32")).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut ins = inputs_within(&g, 1, 0.5)?;
        let mut bias = ins[2].to_f64_vec().iter().map(|&v| v as f32).collect::<Vec<_>>();
        for (i, v) in
            [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN].into_iter().enumerate()
        {
            bias[3 * i + 1] = v;
        }
        ins[2] = Tensor::from_vec(ins[2].shape().to_vec(), bias)?;
        let want = xpu_engine_cpu::CpuEngine::new()
            .prepare(&g, &Assignment::new("cpu"))?
            .run(&ins)?
            .outputs;
        let got = engine.prepare(&g, &assignment("cuda", Capture::Eager))?.run(&ins)?;
        let (x, y) = (got.outputs[0].to_f64_vec(), want[0].to_f64_vec());
        let mut mismatched = Vec::new();
        for (i, (a, b)) in x.iter().zip(&y).enumerate() {
            let same = (a.is_nan() && b.is_nan())
                || (a.is_infinite() && a == b)
                || (a.is_finite() && b.is_finite() && (a - b).abs() <= 1e-5 * b.abs().max(1.0));
            if !same && mismatched.len() < 4 {
                mismatched.push(format!("[{i}] cuda {a} cpu {b}"));
            }
        }
        let plan = fact(&got.facts, "cuda.cublaslt");
        Ok(json!({"case": name, "ok": mismatched.is_empty(), "max_relative_error": 0.0,
                  "tolerance": 1e-5, "mismatches": mismatched, "plan": plan}))
    };
    run().unwrap_or_else(|e| json!({"case": name, "ok": false, "error": format!("{e:#}")}))
}

/// A partition whose arena cannot fit the device (two 256 GiB values, shapes known, so it
/// is made at prepare): the typed error with the bytes asked for, free and held by the
/// engine, and the engine usable afterwards.
fn out_of_memory(engine: &CudaEngine) -> Json {
    let text = "graph \"huge\" {\n  %0: f32[65536,1048576] = input \"x\"\n  %1: f32[65536,1048576] = exp(%0)\n  %2: f32[65536,1048576] = neg(%1)\n  %3: f32[65536,1048576] = exp(%2)\n  return \"y\" = %3\n}";
    let g = match xpu_ir::text::parse(text) {
        Ok(g) => g,
        Err(e) => return json!({"ok": false, "error": e.to_string()}),
    };
    let err = match engine.prepare(&g, &assignment("cuda", Capture::Eager)) {
        Ok(_) => return json!({"ok": false, "error": "a 512 GiB arena was allocated"}),
        Err(e) => e,
    };
    let typed = matches!(err, xpu_engine::EngineError::OutOfMemory { requested, available, .. } if requested >= 1 << 38 && available > 0);
    // The context survives an out-of-memory error: a small program still runs.
    let after = xpu_ir::text::parse(ADD_ROW).ok().and_then(|g| {
        Some(
            engine
                .prepare(&g, &assignment("cuda", Capture::Eager))
                .ok()?
                .run(&inputs(&g, 4).ok()?)
                .is_ok(),
        )
    });
    json!({"ok": typed && after == Some(true), "error": err.to_string(), "runs_after": after})
}

/// The value of fact `key` among `facts` (empty when absent).
fn fact(facts: &[xpu_engine::Fact], key: &str) -> String {
    facts.iter().find(|f| f.key == key).map(|f| f.value.clone()).unwrap_or_default()
}

/// bf16 `n³` through cuBLASLt on device-resident inputs: median device time of the product
/// (events around the call) over 20 runs after warm-up, and TFLOP/s.
fn gemm_bf16(engine: &CudaEngine, n: usize) -> Result<Json> {
    let text = format!(
        "graph \"gemm\" {{\n  %0: bf16[{n},{n}] = input \"a\"\n  %1: bf16[{n},{n}] = input \"b\"\n  %2: bf16[{n},{n}] = matmul(%0, %1) @name(\"mm\")\n  return \"c\" = %2\n}}\n"
    );
    let g = xpu_ir::text::parse(&text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let values: Vec<Value> = (0..2)
        .map(|k| {
            let data: Vec<f32> =
                (0..n * n).map(|i| (((i * 7919 + k * 31) % 1000) as f32 / 500.0) - 1.0).collect();
            let t = Tensor::from_vec(vec![n, n], data)?
                .to_float_dtype(xpu_ir::DType::BF16)
                .context("bf16")?;
            Ok(engine.upload(&t, xpu_engine_cuda::DEVICE, HostMemory::Pageable)?)
        })
        .collect::<Result<_>>()?;
    let mut exe = engine.prepare(&g, &assignment("cuda", Capture::Eager))?;
    let mut device = Vec::new();
    let mut plan = String::new();
    let wall = median_secs(20, || {
        let run = exe.run_values(&values, &StopToken::default())?;
        anyhow::ensure!(
            run.timings.iter().all(|t| t.kernel == "cuda.cublaslt"),
            "the product did not run on cuBLASLt: {:?}",
            kernels_of(&run.timings)
        );
        device.push(run.timings.iter().map(|t| t.nanos).sum::<u64>() as f64 / 1e9);
        if let Some(f) = run.facts.iter().find(|f| f.key == "cuda.cublaslt") {
            plan = f.value.clone();
        }
        Ok(())
    })?;
    device.sort_by(f64::total_cmp);
    let secs = device[device.len() / 2];
    let flops = 2.0 * (n as f64).powi(3);
    Ok(
        json!({"ms": secs * 1e3, "wall_ms": wall * 1e3, "tflops": flops / secs / 1e12, "plan": plan}),
    )
}

/// Every program planned under the headline GPU policy (`latency-gpu.toml`: cuda first,
/// cuBLASLt for matmul, bf16 with softmax and norms kept in f32, captured graphs) on this
/// process's cuda and cpu engines, and run by GraphExec against the cpu engine alone. The
/// policy's bf16 makes the tolerance 5e-2 of the output's scale (inputs scaled to ±0.5).
fn planned(dir: &Path, programs: &[(String, Graph)]) -> Result<Vec<Json>> {
    use std::sync::Arc;
    let policy_path = dir.join("../../policies/examples/latency-gpu.toml");
    let policy = xpu_policy::Loader::new()
        .load(&policy_path)
        .map_err(|d| anyhow::anyhow!("{}: {d}", policy_path.display()))?;
    let mut registry = xpu_engine::Registry::new();
    registry.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    registry.register(Arc::new(CudaEngine::new(CudaConfig {
        library_dir: std::env::var_os("XPU_CUDA_LIBRARY_DIR").map(PathBuf::from),
        cache_dir: None,
    })));
    let mut rows = Vec::new();
    for (name, g) in programs {
        let run = || -> Result<Json> {
            let bindings: std::collections::BTreeMap<String, u64> =
                [("N".to_string(), 37u64)].into_iter().collect();
            let ins = inputs_within(g, 37, 0.5)?;
            let want = xpu_engine_cpu::run_graph(g, &ins)?.outputs;
            let shared = Arc::new(g.clone());
            let inventory = registry.inventory_for(g);
            let plan = xpu_plan::plan_shared(
                &shared,
                &g.content_hash(),
                &policy,
                &inventory,
                &bindings,
                None,
            );
            let (plan, _) = match plan {
                Ok(p) => p,
                // The policy may refuse a program (a fallback budget, a pin): reported as
                // the planner's answer, not as a GPU failure.
                Err(f) => {
                    return Ok(json!({"program": name, "ok": true, "not_planned": f.to_string()}));
                }
            };
            let placement: Vec<String> = plan
                .partitions
                .iter()
                .map(|p| format!("{}: {} node(s)", p.engine, p.nodes.len()))
                .collect();
            // The planned graph (precision casts inserted) on the cpu engine: the same
            // roundings, so what is left is the order of sums.
            let same_casts = xpu_engine_cpu::run_graph(&plan.graph, &ins)?.outputs;
            let mut exec = xpu_plan::GraphExec::new(Arc::new(plan), &registry)?;
            let (mut worst, mut vs_f32) = (0f64, 0f64);
            let mut record = None;
            let f32_of =
                |t: &Tensor| t.to_float_dtype(xpu_ir::DType::F32).unwrap_or_else(|| t.clone());
            // Three runs: the captured partitions warm up, capture, then replay.
            for _ in 0..3 {
                let r = exec.run(&ins)?;
                for ((a, b), c) in r.outputs.iter().zip(&same_casts).zip(&want) {
                    worst = worst.max(relative_error(&f32_of(a), &f32_of(b))?);
                    vs_f32 = vs_f32.max(relative_error(&f32_of(a), c)?);
                }
                record = Some(r);
            }
            let r = record.context("no run")?;
            let mut kernels: Vec<String> =
                r.timings.iter().map(|t| format!("{}/{}", t.engine, t.kernel)).collect();
            kernels.sort();
            kernels.dedup();
            let facts: Vec<String> = r
                .facts
                .iter()
                .filter(|f| f.key.starts_with("cuda.cublaslt") || f.key == "cuda.captures")
                .map(|f| format!("{} = {}", f.key, f.value))
                .collect();
            // How far the policy's precision itself moves the result (the cpu engine's run
            // of the planned graph against the f32 program): an output that bf16 moves
            // more than 2e-2 (a softmax over logits closer than bf16 resolves) is judged
            // against that gap instead.
            let mut gap = 0f64;
            for (b, c) in same_casts.iter().zip(&want) {
                gap = gap.max(relative_error(&f32_of(b), c)?);
            }
            let tolerance = gap.max(2e-2);
            Ok(json!({"program": name, "ok": worst <= tolerance, "max_relative_error": worst,
                      "tolerance": tolerance, "precision_gap": gap, "vs_f32_program": vs_f32,
                      "partitions": placement, "kernels": kernels, "facts": facts,
                      "transfers": r.transfers.len()}))
        };
        rows.push(
            run().unwrap_or_else(
                |e| json!({"program": name, "ok": false, "error": format!("{e:#}")}),
            ),
        );
    }
    Ok(rows)
}
