//! `xpu-gpu-check`: the cuda engine on a real GPU, from a slim release binary (no LLVM, no
//! DuckDB, no ONNX Runtime: it fits the 64 MiB a GPU test machine takes). `make gpu-check`
//! runs it there (tools/gpu-check/run.sh) beside PyTorch's side of the benchmarks.
//!
//! `xpu-gpu-check PROGRAMS_DIR` prints one JSON object: the engine's availability and
//! device facts; every program of the directory at a small batch on the cuda engine (eager
//! and captured-graph runs) against the cpu engine; fused chains and row groups on 16M
//! elements (device-resident inputs, median of timed runs) with their bandwidth against a
//! device-to-device copy of the same bytes; and a captured 100-kernel partition replayed
//! against the same partition launched eagerly. Exit 0 when every program matched, 1 when
//! one did not, 3 when the engine is unavailable (the reason is in the JSON).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{Value as Json, json};
use xpu_engine::options::Capture;
use xpu_engine::{Assignment, Engine, StopToken, Value};
use xpu_engine_cuda::{CudaConfig, CudaEngine};
use xpu_ir::{Graph, Tensor};

/// Elements of the benchmark tensors: 16M, as the bars name them.
const BENCH_ROWS: usize = 16 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().collect();
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

fn check(dir: &Path) -> Result<(Json, i32)> {
    let engine = CudaEngine::new(CudaConfig {
        library_dir: std::env::var_os("XPU_CUDA_LIBRARY_DIR").map(PathBuf::from),
        cache_dir: None,
    });
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
    let replay = replay_vs_eager(&engine).unwrap_or_else(|e| json!({"error": format!("{e:#}")}));
    let report = json!({
        "available": true,
        "engine": caps.version,
        "devices": caps.devices.iter().map(|d| json!({"id": d.id.to_string(), "name": d.name, "memory_bytes": d.memory_bytes})).collect::<Vec<_>>(),
        "unavailable_kernels": caps.unavailable_kernels,
        "conformance": rows,
        "device_copy_gbps": copy,
        "throughput": bench,
        "graph_replay": replay,
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

/// Inputs for `g` with every symbolic dimension bound to `rows`: varied, NaN-free values.
fn inputs(g: &Graph, rows: usize) -> Result<Vec<Tensor>> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let dims = g.ty(v).dims.as_ref().context("an input of unknown rank")?;
            let shape: Vec<usize> =
                dims.iter().map(|d| d.known().map_or(rows, |n| n as usize)).collect();
            let n: usize = shape.iter().product();
            let data: Vec<f32> =
                (0..n).map(|i| (((i * 7919 + k * 31) % 1000) as f32 / 125.0) - 4.0).collect();
            Ok(Tensor::from_vec(shape, data)?)
        })
        .collect()
}

fn assignment(engine: &str, capture: Capture) -> Assignment {
    let mut a = Assignment::new(engine);
    a.options.capture = capture;
    a
}

/// `g` at batch 37 on the cuda engine, three runs eager and three captured (warm-up,
/// capture, replay), against the cpu engine: the largest error relative to the values.
fn conformance(engine: &CudaEngine, name: &str, g: &Graph) -> Json {
    let run = || -> Result<Json> {
        let inputs = inputs(g, 37)?;
        let want = xpu_engine_cpu::CpuEngine::new()
            .prepare(g, &Assignment::new("cpu"))?
            .run(&inputs)?
            .outputs;
        let mut worst = 0f64;
        let mut facts = Vec::new();
        for capture in [Capture::Eager, Capture::Graph] {
            let mut exe = engine.prepare(g, &assignment("cuda", capture))?;
            for _ in 0..3 {
                let got = exe.run(&inputs)?;
                for (a, b) in got.outputs.iter().zip(&want) {
                    worst = worst.max(relative_error(a, b)?);
                }
                facts = got.facts;
            }
        }
        let ok = worst <= 1e-5;
        Ok(json!({"program": name, "ok": ok, "max_relative_error": worst,
                  "facts": facts.iter().map(|f| format!("{} = {}", f.key, f.value)).collect::<Vec<_>>()}))
    };
    run().unwrap_or_else(|e| json!({"program": name, "ok": false, "error": format!("{e:#}")}))
}

/// max |a − b| / max(1, |b|) over the elements (NaN where both are NaN counts as equal).
fn relative_error(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    anyhow::ensure!(
        x.len() == y.len() && a.shape() == b.shape(),
        "shape {:?} vs {:?}",
        a.shape(),
        b.shape()
    );
    Ok(x.iter()
        .zip(&y)
        .map(|(p, q)| {
            if p.is_nan() && q.is_nan() || p == q { 0.0 } else { (p - q).abs() / q.abs().max(1.0) }
        })
        .fold(0.0, f64::max))
}

/// Median seconds of `reps` calls of `f` after three warm-up calls.
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

/// Device-to-device copy bandwidth (bytes read + written per second) over 64 MiB, timed
/// by the engine with events around `cuMemcpyDtoDAsync`: the memory roof the fused kernels
/// are measured against.
fn device_copy_gbps(engine: &CudaEngine) -> Result<f64> {
    let bytes = 64 << 20;
    let mut best = f64::INFINITY;
    for _ in 0..20 {
        best = best.min(engine.time_device_copy(bytes)?);
    }
    Ok(2.0 * bytes as f64 / best / 1e9)
}

/// A program on 16M-element inputs already on the device: median time of a run (launches
/// and the output copy, synchronised) and its bandwidth (inputs + outputs) against a copy.
fn throughput(engine: &CudaEngine, name: &str, g: &Graph, copy_gbps: f64) -> Result<Json> {
    let inputs = inputs(g, BENCH_ROWS)?;
    let values: Vec<Value> = inputs
        .iter()
        .map(|t| engine.upload(t, xpu_engine_cuda::DEVICE))
        .collect::<Result<_, _>>()?;
    let mut out = json!({"program": name});
    for capture in [Capture::Eager, Capture::Graph] {
        let mut exe = engine.prepare(g, &assignment("cuda", capture))?;
        let mut out_bytes = 0u64;
        let secs = median_secs(20, || {
            let run = exe.run_values(&values, &StopToken::default())?;
            out_bytes = run.outputs.iter().map(|v| v.size_bytes()).sum();
            Ok(())
        })?;
        let in_bytes: u64 = values.iter().map(|v| v.size_bytes()).sum();
        let gbps = (in_bytes + out_bytes) as f64 / secs / 1e9;
        out[format!("{capture:?}").to_lowercase()] =
            json!({"ms": secs * 1e3, "gbps": gbps, "of_copy": gbps / copy_gbps});
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
    let x = engine.upload(&inputs(&g, 8)?[0], xpu_engine_cuda::DEVICE)?;
    let mut out = json!({"kernels": 100});
    for capture in [Capture::Eager, Capture::Graph] {
        let mut exe = engine.prepare(&g, &assignment("cuda", capture))?;
        let mut facts = Vec::new();
        let secs = median_secs(50, || {
            facts = exe.run_values(std::slice::from_ref(&x), &StopToken::default())?.facts;
            Ok(())
        })?;
        out[format!("{capture:?}").to_lowercase()] = json!({
            "us_per_kernel": secs * 1e6 / 100.0,
            "facts": facts.iter().map(|f| format!("{} = {}", f.key, f.value)).collect::<Vec<_>>(),
        });
    }
    Ok(out)
}
