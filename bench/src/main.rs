//! Times the CPU engine on the benchmark workloads and prints JSON for bench/run.py.
//!
//! `xpu-bench matmul N [REPS [KERNEL]]` — f32 N×N·N×N through a prepared matmul graph,
//! optionally pinned to a kernel (`cpu.blas`, `cpu.gemm`).
//! `xpu-bench model PATH.onnx BATCH [REPS [KERNEL]]` — a warm, prepared ONNX model at a batch
//! size, its matrix products optionally pinned to a kernel.
//! `xpu-bench plan NODES POLICY INVENTORY [REPS]` — the planner on a generated
//! transformer-like graph of NODES nodes (weights as inputs), policy and inventory files.
//! `xpu-bench llvm PATH.sgr ROWS REPS THREADS` — an SGR-ML program on the llvm engine, N
//! bound to ROWS. `xpu-bench llvm-pair A.sgr B.sgr ROWS REPS THREADS` — two such programs
//! timed alternately run by run; prints `{"a_median_s", "b_median_s", "reps"}`.
//! The others print `{"median_s": …, "min_s": …, "reps": …}`. Preparation happens once, as a
//! deployed engine would; inputs are borrowed by every run, as a peer's are.

mod daemon;
mod isolation;

use std::time::Instant;

use anyhow::{Context, Result, bail};
use xpu_engine::{Assignment, Engine};
use xpu_ir::{DType, Dim, Graph, Op, Tensor, TensorType};

fn time_runs(
    g: &Graph,
    inputs: &[Tensor],
    reps: usize,
    kernel: Option<&str>,
) -> Result<(f64, f64)> {
    let mut assignment = Assignment::new("cpu");
    if let Some(k) = kernel {
        for id in g.node_ids() {
            if matches!(g.node(id).op, Op::MatMul | Op::Gemm) {
                assignment.kernels.insert(id, k.to_string());
            }
        }
    }
    let exe = xpu_engine_cpu::CpuEngine::new().prepare(g, &assignment)?;
    time_executable(exe, inputs, reps)
}

/// Median and best wall time of `reps` runs of a prepared executable, after a warm-up.
fn time_executable(
    mut exe: Box<dyn xpu_engine::Executable>,
    inputs: &[Tensor],
    reps: usize,
) -> Result<(f64, f64)> {
    // Warm up for at least 0.2 s (bench/run.py's peers get the same): the first runs of a
    // process are slower on these VMs, and a one-run warm-up left 100-run medians in them.
    let warm_until = Instant::now() + std::time::Duration::from_millis(200);
    exe.run(inputs)?;
    while Instant::now() < warm_until {
        exe.run(inputs)?;
    }
    let mut times = Vec::with_capacity(reps);
    // Per-node time summed over the runs and the spread of run times, printed to stderr
    // with XPU_BENCH_NODES=1: where a model's time goes. Not collected otherwise.
    let breakdown = std::env::var_os("XPU_BENCH_NODES").is_some();
    let mut nodes: std::collections::BTreeMap<(u32, String), u64> = Default::default();
    for _ in 0..reps {
        let t = Instant::now();
        let out = exe.run(inputs)?;
        times.push(t.elapsed().as_secs_f64());
        if breakdown {
            for timing in &out.timings {
                *nodes.entry((timing.node.0, timing.kernel.clone())).or_default() += timing.nanos;
            }
        }
        drop(out);
    }
    times.sort_by(f64::total_cmp);
    if breakdown {
        for ((node, kernel), nanos) in &nodes {
            eprintln!("n{node:<4} {kernel:<18} {:10.1} µs/run", *nanos as f64 / reps as f64 / 1e3);
        }
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize] * 1e6;
        eprintln!(
            "run µs: p10 {:.1}  p25 {:.1}  p50 {:.1}  p75 {:.1}  p90 {:.1}",
            at(0.1),
            at(0.25),
            at(0.5),
            at(0.75),
            at(0.9)
        );
    }
    Ok((times[times.len() / 2], times[0]))
}

/// One pseudo-random f32 tensor per graph input, symbolic dims bound to `batch`.
fn model_inputs(g: &Graph, batch: usize) -> Result<Vec<Tensor>> {
    g.inputs
        .iter()
        .map(|&v| {
            let dims: Vec<usize> = g
                .ty(v)
                .dims
                .as_ref()
                .map(|d| d.iter().map(|d| d.known().map(|k| k as usize).unwrap_or(batch)).collect())
                .unwrap_or_default();
            let n = dims.iter().product();
            Tensor::from_vec(dims, pseudo_random(n, 3)).map_err(anyhow::Error::from)
        })
        .collect()
}

fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// A transformer-like stack of exactly `nodes` nodes over f32[N,64]: per layer matmul,
/// add, gelu, matmul, add, softmax, layer norm — the op mix real models give a planner.
fn layered_graph(nodes: usize) -> Result<Graph> {
    let mut g = Graph::new(format!("bench{nodes}"));
    let d = Dim::Known(64);
    let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Sym("N".into()), d.clone()]));
    let w = g.add_input("w", TensorType::new(DType::F32, vec![d.clone(), d.clone()]));
    let b = g.add_input("b", TensorType::new(DType::F32, vec![d.clone()]));
    let mut v = x;
    let pattern =
        [Op::MatMul, Op::Add, Op::Gelu, Op::MatMul, Op::Add, Op::Softmax, Op::LayerNormalization];
    for i in 0..nodes {
        let op = pattern[i % pattern.len()];
        let ins = match op {
            Op::MatMul => vec![v, w],
            Op::Add => vec![v, b],
            Op::LayerNormalization => vec![v, b, b],
            _ => vec![v],
        };
        v = g.add_op(op, &ins, Default::default())?;
        let n = g.producer(v).expect("just added");
        g.nodes[n.index()].name = Some(format!("layer{}.{}", i / pattern.len(), op.name()));
    }
    g.add_output("y", v);
    Ok(g)
}

/// A program (input `x` from a .npy file) under each policy: planned and prepared once on
/// the live inventory with engines in worker processes (as xpud runs them), warmed, then
/// REPS timed runs of each plan (rounded up to whole rounds) in up to five rounds of blocks
/// (as `xpuctl tune`). Prints each policy's median seconds and each round's median.
fn policy_run(args: &[String]) -> Result<()> {
    let program = std::path::Path::new(args.get(2).context("policy-run PROGRAM")?);
    // `-`: a program without inputs (a tables job reading its files).
    let x = match args.get(3).context("policy-run X.npy")?.as_str() {
        "-" => None,
        path => Some(xpu_runtime::tensors::read(std::path::Path::new(path))?.1),
    };
    let reps: usize = args.get(4).context("policy-run REPS")?.parse()?;
    anyhow::ensure!(reps > 0, "policy-run REPS must be at least 1");
    let g = std::sync::Arc::new(xpu_runtime::program::load(program)?);
    let roots = xpu_runtime::program::data_roots_of(program);
    let registry = xpu_runtime::isolated_registry_for(roots.roots());
    let inputs: Vec<_> = x.into_iter().collect();
    let mut execs = Vec::new();
    for path in &args[5..] {
        let policy = xpu_policy::Loader::new()
            .load(std::path::Path::new(path))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let inventory = registry.inventory_for(&g);
        let planned = xpu_runtime::plan_job(&g, &inputs, &policy, &inventory, None, None)
            .map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
        let mut exec = xpu_plan::GraphExec::new(planned.plan, &registry)?;
        let warm_until = Instant::now() + std::time::Duration::from_millis(200);
        while Instant::now() < warm_until {
            exec.run(&inputs)?;
        }
        execs.push((exec, Vec::with_capacity(reps), Vec::new()));
    }
    // Rounds of blocks, as `xpuctl tune` measures: untimed runs first let the previous
    // plan's engine threads (still spinning on a host with few cores) go idle.
    let rounds = reps.clamp(1, 5);
    let n = execs.len();
    for round in 0..rounds {
        // Each round starts one plan later; untimed runs for 20 ms before each block.
        for i in (0..n).map(|k| (k + round) % n) {
            let (exec, times, round_medians) = &mut execs[i];
            let settle = Instant::now();
            exec.run(&inputs)?;
            while settle.elapsed() < std::time::Duration::from_millis(20) {
                exec.run(&inputs)?;
            }
            let mut block = Vec::with_capacity(reps.div_ceil(rounds));
            for _ in 0..reps.div_ceil(rounds) {
                let t = Instant::now();
                exec.run(&inputs)?;
                block.push(t.elapsed().as_secs_f64());
            }
            round_medians.push(median_of(&mut block));
            times.extend(block);
        }
    }
    let medians: Vec<f64> = execs.iter_mut().map(|(_, t, _)| median_of(t)).collect();
    let per_round: Vec<&Vec<f64>> = execs.iter().map(|(_, _, r)| r).collect();
    println!("{}", serde_json::json!({"medians_s": medians, "rounds_s": per_round, "reps": reps}));
    Ok(())
}

fn median_of(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Planning a layered graph with evidence against planning it without, alternately: the
/// same graph and policy, the second choosing by measurement from a lock with figures for
/// every node signature (the winner the static order's runner-up where there is one, so
/// the measured plan differs). Prints both medians and how many decisions changed.
fn plan_measured(args: &[String]) -> Result<()> {
    use xpu_policy::lock::{Evidence, Figure, LOCK_VERSION, LockFile, Machine, NodeChoice};
    let nodes: usize = args.get(2).context("plan-measured NODES")?.parse()?;
    let policy = xpu_policy::Loader::new()
        .load(std::path::Path::new(args.get(3).context("plan-measured POLICY")?))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let inventory = xpu_policy::load_inventory(std::path::Path::new(
        args.get(4).context("plan-measured INVENTORY")?,
    ))
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let reps: usize = args.get(5).map(|s| s.parse()).transpose()?.unwrap_or(200);
    let g = std::sync::Arc::new(layered_graph(nodes)?);
    let hash = g.content_hash();
    let bindings = std::collections::BTreeMap::from([("N".to_string(), 8)]);
    let plan = |p: &xpu_policy::Policy| {
        xpu_plan::plan_shared(&g, &hash, p, &inventory, &bindings, None)
            .map_err(|e| anyhow::anyhow!("the benchmark graph does not plan: {e}"))
    };
    let (_, ex) = plan(&policy)?;
    let pipeline = xpu_plan::passes::pipeline(policy.spec.execution.graph_optimization);
    let optimised =
        xpu_plan::passes::optimize(&g, pipeline, None).0.unwrap_or_else(|| (*g).clone());
    let mut lock = LockFile {
        version: LOCK_VERSION,
        program: g.name.clone(),
        graph_sha256: hash.clone(),
        policy: policy.name().to_string(),
        runs: 10,
        machine: Machine::default(),
        plans: Vec::new(),
        nodes: Vec::new(),
    };
    for d in ex.decisions.iter() {
        let Some(c) = &d.chosen else { continue };
        let sig = xpu_plan::evidence::node_signature(&optimised, d.node, &bindings);
        if d.op == "constant" || lock.nodes.iter().any(|n| n.signature == sig) {
            continue;
        }
        let runner = d.rejected.iter().find(|r| r.code == xpu_plan::ReasonCode::Outranked);
        let (engine, kernel) =
            match runner.and_then(|r| r.kernel.clone().map(|k| (r.engine.clone(), k))) {
                Some(ek) => ek,
                None => (c.engine.to_string(), c.kernel.to_string()),
            };
        let figure = |engine: String, kernel: String, us| Figure {
            engine,
            kernel,
            median_us: us,
            samples: 10,
        };
        lock.nodes.push(NodeChoice {
            signature: sig,
            label: d.op.to_string(),
            op: d.op.to_string(),
            operands: String::new(),
            winner: figure(engine, kernel, 1.0),
            runner_up: Some(figure(c.engine.to_string(), c.kernel.to_string(), 2.0)),
            also: Vec::new(),
        });
    }
    let mut measured = policy.choosing_by(Evidence::new("bench.lock.toml", b"", Ok(lock.clone())));
    if plan(&measured).is_err() {
        // Moving every node to its runner-up can break a rule that stays absolute (a
        // fallback budget): then the evidence confirms the static choices instead — the
        // same lookups, nothing moved.
        for n in &mut lock.nodes {
            if let Some(r) = n.runner_up.take() {
                n.runner_up = Some(std::mem::replace(&mut n.winner, r));
            }
        }
        measured = policy.choosing_by(Evidence::new("bench.lock.toml", b"", Ok(lock)));
    }
    let (_, mex) = plan(&measured)?;
    let changed = ex
        .decisions
        .iter()
        .zip(mex.decisions.iter())
        .filter(|(a, b)| {
            a.chosen.as_ref().map(|c| &c.kernel) != b.chosen.as_ref().map(|c| &c.kernel)
        })
        .count();
    let (mut plain, mut with) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        for (p, times) in [(&policy, &mut plain), (&measured, &mut with)] {
            let t = Instant::now();
            let planned = plan(p);
            times.push(t.elapsed().as_secs_f64());
            drop(planned);
        }
    }
    plain.sort_by(f64::total_cmp);
    with.sort_by(f64::total_cmp);
    println!(
        "{}",
        serde_json::json!({"static_median_s": plain[reps / 2], "measured_median_s": with[reps / 2], "reps": reps, "changed": changed})
    );
    Ok(())
}

/// An SGR-ML program and pseudo-random inputs for it, its symbolic dims bound to ROWS.
fn sgr_program(path: &str, rows: Option<&String>) -> Result<(Graph, Vec<Tensor>)> {
    let rows: usize = rows.context("ROWS")?.parse()?;
    let g = xpu_ir::text::parse(&std::fs::read_to_string(path)?)
        .map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    let inputs = g
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let dims = g.ty(v).dims.as_ref().context("an input of unknown rank")?;
            let shape: Vec<usize> =
                dims.iter().map(|d| d.known().map_or(rows, |n| n as usize)).collect();
            let n = shape.iter().product();
            Ok(Tensor::from_vec(shape, pseudo_random(n, i as u64 + 1))?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((g, inputs))
}

/// An llvm executable for the program at `path` with N bound to `rows`, and its inputs.
fn llvm_prepared(
    path: &str,
    rows: Option<&String>,
    threads: u32,
) -> Result<(Box<dyn xpu_engine::Executable>, Vec<Tensor>)> {
    let (g, inputs) = sgr_program(path, rows)?;
    let mut a = Assignment::new("llvm");
    a.options.threads = Some(threads);
    Ok((xpu_engine_llvm::LlvmEngine::new(None).prepare(&g, &a)?, inputs))
}

type Prepared = (Box<dyn xpu_engine::Executable>, Vec<Tensor>);

/// Median run times of two executables timed alternately, `reps` runs each, after the same
/// 0.2 s warm-up as [`time_executable`].
fn time_alternately(mut a: Prepared, mut b: Prepared, reps: usize) -> Result<(f64, f64)> {
    let warm_until = Instant::now() + std::time::Duration::from_millis(200);
    while Instant::now() < warm_until {
        a.0.run(&a.1)?;
        b.0.run(&b.1)?;
    }
    let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        for (exe, times) in [(&mut a, &mut ta), (&mut b, &mut tb)] {
            let t = Instant::now();
            let out = exe.0.run(&exe.1)?;
            times.push(t.elapsed().as_secs_f64());
            drop(out);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(ta), median(tb)))
}

fn main() -> Result<()> {
    // SAFETY: the first thing main does, before any thread exists.
    unsafe { xpu_engine_cpu::quiet_blas_threads() };
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("isolation") {
        let path = args.get(2).context("isolation MODEL")?;
        let batch: usize = args.get(3).context("isolation BATCH")?.parse()?;
        let reps: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(500);
        let threads: u32 = args.get(5).map(|s| s.parse()).transpose()?.unwrap_or(1);
        return isolation::run(path, batch, reps, threads);
    }
    if args.get(1).map(String::as_str) == Some("ipc-floor") {
        let work_us: f64 = args.get(2).context("ipc-floor WORK_US")?.parse()?;
        let reps: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(1000);
        return isolation::floor(work_us, reps.max(1));
    }
    if args.get(1).map(String::as_str) == Some("daemon") {
        let url = args.get(2).context("daemon URL")?;
        let concurrency: usize = args.get(3).context("daemon CONCURRENCY")?.parse()?;
        let seconds: f64 = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(5.0);
        let body = match args.get(5) {
            Some(path) => Some(std::fs::read(path).with_context(|| format!("reading {path}"))?),
            None => None,
        };
        return daemon::run(url.trim_end_matches('/'), concurrency, seconds, body);
    }
    let (median, min, reps) = match args.get(1).map(String::as_str) {
        Some("matmul") => {
            let n: usize = args.get(2).context("matmul N")?.parse()?;
            let reps: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(5);
            let kernel = args.get(4).map(String::as_str);
            let mut g = Graph::new("matmul");
            let ty = TensorType::new(DType::F32, vec![Dim::Known(n as u64), Dim::Known(n as u64)]);
            let a = g.add_input("a", ty.clone());
            let b = g.add_input("b", ty);
            let c = g.add_op(Op::MatMul, &[a, b], Default::default())?;
            g.add_output("c", c);
            let inputs = vec![
                Tensor::from_vec(vec![n, n], pseudo_random(n * n, 1))?,
                Tensor::from_vec(vec![n, n], pseudo_random(n * n, 2))?,
            ];
            let (m, mi) = time_runs(&g, &inputs, reps, kernel)?;
            (m, mi, reps)
        }
        Some("model") => {
            let path = args.get(2).context("model PATH")?;
            let batch: usize = args.get(3).context("model BATCH")?.parse()?;
            let reps: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(200);
            let kernel = args.get(5).map(String::as_str);
            let g = xpu_onnx::import_model(&std::fs::read(path)?)?;
            let inputs = model_inputs(&g, batch)?;
            let (m, mi) = time_runs(&g, &inputs, reps, kernel)?;
            (m, mi, reps)
        }
        Some(engine @ ("ort" | "openvino")) => {
            // The model as given to the ort or openvino engine (in-process, one warm session
            // or compiled model), with the options a policy would hand it: threads (and for
            // ort, spinning off; for openvino, CPU, fp32 and the latency hint).
            let path = args.get(2).context("PATH")?;
            let batch: usize = args.get(3).context("BATCH")?.parse()?;
            let reps: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(200);
            let threads = args.get(5).context("THREADS")?;
            let bytes = std::fs::read(path)?;
            let inputs = model_inputs(&xpu_onnx::import_model(&bytes)?, batch)?;
            let mut a = Assignment::new(engine);
            a.options.threads = Some(threads.parse().context("THREADS")?);
            let exe: Box<dyn xpu_engine::Executable> = if engine == "ort" {
                let e = xpu_engine_ort::OrtEngine::load(None).without_profiling();
                Box::new(e.prepare_model(path, &bytes, &a)?)
            } else {
                let e = xpu_engine_openvino::OpenVinoEngine::load(None).without_profiling();
                Box::new(e.prepare_model(path, &bytes, &a)?)
            };
            let (m, mi) = time_executable(exe, &inputs, reps)?;
            (m, mi, reps)
        }
        Some("llvm") => {
            // An SGR-ML program through the llvm engine alone (in-process, compiled once
            // before timing), its symbol N bound to ROWS, inputs pseudo-random.
            let reps: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(20);
            let threads: u32 = args.get(5).context("llvm THREADS")?.parse()?;
            let (exe, inputs) =
                llvm_prepared(args.get(2).context("llvm PATH.sgr")?, args.get(3), threads)?;
            let (m, mi) = time_executable(exe, &inputs, reps)?;
            (m, mi, reps)
        }
        Some("llvm-pair") => {
            // Two SGR-ML programs on the llvm engine, run alternately rep by rep (a chain and
            // the STREAM-style triad it is judged against): both see the same stretch of a
            // noisy machine, so the ratio of their medians is side by side.
            let threads: u32 = args.get(6).context("llvm-pair THREADS")?.parse()?;
            let reps: usize = args.get(5).context("llvm-pair REPS")?.parse()?;
            let (first, second) = (
                llvm_prepared(args.get(2).context("llvm-pair A.sgr")?, args.get(4), threads)?,
                llvm_prepared(args.get(3).context("llvm-pair B.sgr")?, args.get(4), threads)?,
            );
            let (a, b) = time_alternately(first, second, reps)?;
            println!("{}", serde_json::json!({"a_median_s": a, "b_median_s": b, "reps": reps}));
            return Ok(());
        }
        Some("llvm-compile") => {
            // A program's first run on an llvm engine with its disk cache in DIR, as
            // `prepare` and `run` do it: on an empty DIR it compiles (cold), a second process
            // finds the shared object. Reported from the run's own facts.
            let (g, inputs) =
                sgr_program(args.get(2).context("llvm-compile PATH.sgr")?, args.get(3))?;
            let dir = args.get(4).context("llvm-compile DIR")?;
            let engine = xpu_engine_llvm::LlvmEngine::new(Some(dir.into()));
            let run = engine.prepare(&g, &Assignment::new("llvm"))?.run(&inputs)?;
            let fact = |key: &str| {
                run.facts
                    .iter()
                    .find(|f| f.key == key)
                    .map(|f| f.value.clone())
                    .context(key.to_string())
            };
            let code = fact("llvm.code")?;
            let source = code.split_once(" (").map_or("", |(_, s)| s.trim_end_matches(')'));
            let kernels: usize = fact("llvm.kernels")?.split(' ').next().unwrap_or("0").parse()?;
            let ms: f64 = fact("llvm.compile_ms")?.parse()?;
            println!("{}", serde_json::json!({"kernels": kernels, "source": source, "ms": ms}));
            return Ok(());
        }
        Some("plan") => {
            let nodes: usize = args.get(2).context("plan NODES")?.parse()?;
            let policy = xpu_policy::Loader::new()
                .load(std::path::Path::new(args.get(3).context("plan POLICY")?))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let inventory = xpu_policy::load_inventory(std::path::Path::new(
                args.get(4).context("plan INVENTORY")?,
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            let reps: usize = args.get(5).map(|s| s.parse()).transpose()?.unwrap_or(200);
            // Shared, as the plan cache and GraphExec hold graphs: no copy per plan.
            let g = std::sync::Arc::new(layered_graph(nodes)?);
            let hash = g.content_hash();
            let bindings = std::collections::BTreeMap::from([("N".to_string(), 8)]);
            xpu_plan::plan_shared(&g, &hash, &policy, &inventory, &bindings, None)
                .map_err(|e| anyhow::anyhow!("the benchmark graph does not plan: {e}"))?;
            let mut times = Vec::with_capacity(reps);
            for _ in 0..reps {
                let t = Instant::now();
                let planned =
                    xpu_plan::plan_shared(&g, &hash, &policy, &inventory, &bindings, None);
                times.push(t.elapsed().as_secs_f64());
                drop(planned);
            }
            times.sort_by(f64::total_cmp);
            (times[times.len() / 2], times[0], reps)
        }
        Some("plan-measured") => {
            plan_measured(&args)?;
            return Ok(());
        }
        Some("policy-run") => {
            policy_run(&args)?;
            return Ok(());
        }
        _ => bail!(
            "usage: xpu-bench plan-measured NODES POLICY INVENTORY REPS | xpu-bench policy-run PROGRAM X.npy|- REPS POLICY... | xpu-bench matmul N [REPS [KERNEL]] | xpu-bench model PATH.onnx BATCH [REPS [KERNEL]] | xpu-bench ort|openvino PATH.onnx BATCH REPS THREADS | xpu-bench plan NODES POLICY INVENTORY [REPS] | xpu-bench llvm PATH.sgr ROWS REPS THREADS | xpu-bench llvm-pair A.sgr B.sgr ROWS REPS THREADS | xpu-bench llvm-compile PATH.sgr ROWS DIR"
        ),
    };
    println!("{}", serde_json::json!({"median_s": median, "min_s": min, "reps": reps}));
    Ok(())
}
