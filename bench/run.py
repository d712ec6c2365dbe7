"""`make bench`: xpu's CPU engine side by side with its peers, in one run, on the same cores.

- f32 matmul 1024³ and 3072³: xpu (kernels cpu.blas and cpu.gemm) vs numpy (OpenBLAS).
  Bar: ≥ 0.9× numpy.
- An MLP (784-512-512-10) at batch 1 and 64, a small conv net and a ResNet-50-shaped model
  (generated, batch norm folded) at batch 1 and 8: xpu's CPU engine vs onnxruntime's CPU
  provider with the same thread count, both warm and in-process. Bars: the MLP ≥ 0.9×
  onnxruntime's speed; the conv nets ≤ 2× its time.
- The same MLP and conv net through xpu's ort engine (in-process, warm session, the model
  as given) vs onnxruntime's Python API, same thread count and options (spinning off).
  Bars: overhead ≤ 5% at batch 64 and ≤ 30 µs per call at batch 1. The openvino engine
  against OpenVINO's Python API the same way (CPU, fp32, latency hint), reported.
- Whole process: `xpuctl run` of a one-node 3072³ f32 matmul ONNX model, two `.npy` inputs,
  the `.npy` output, against a Python process doing `np.load` ×2, `a @ b`, `np.save`.
  Bar: ≤ 1.2× numpy's time.
- The planner on a generated 1,000-node transformer-like graph under three example policies
  and their declared inventories (cpu-only, latency-gpu with bf16 casts, npu-openvino).
  Bar: ≤ 1 ms per plan (median); reported as budget / time. There is no peer planner.
- Tables: a generated 1,000,000-row CSV of 8 numeric columns; `xpuctl run` of a MiniLang
  job (load_csv + stats with all 8 statistics) against a Python process doing pandas
  `read_csv` + `describe()`, each a whole process from start to exit. Bar: xpu ≥ 3× faster.
  group_by + agg (+ head) on the same file against pandas' `groupby().agg()`: bar ≥ 2×.
- The llvm engine: GELU (tanh form), SiLU, Mish and softplus chains written out op by op on
  4096×1024 f32, in-process, against numpy (one op at a time) and numexpr on the same
  threads. Bars: ≥ 2× numpy and ≥ numexpr (geometric means). Each chain's bandwidth
  (bytes in + out per second) against a STREAM-style triad compiled by the same engine:
  ≥ 70%. Whole process: `xpuctl run` of the GELU chain with `.npy` in/out against a Python
  script doing np.load, the expression, np.save: ≥ 1.5×. Row-wise groups (softmax,
  LayerNorm, RMSNorm, log-sum-exp written out op by op) against numpy: ≥ 2×. JIT compile
  time of each program's kernels, cold and from the disk cache: reported. `llvm.gemm` f32
  1024³ against numpy/OpenBLAS: reported.
- xpud: a tiny MiniLang job submitted with `wait` over loopback keep-alive connections, at
  concurrency 1, 4 and 16 (`xpu-bench daemon`), every run stored and indexed. Server-side
  overhead (the request's time in the server less its queue wait and execution, from the
  `Server-Timing` header) p50/p90/p99, and jobs/s. Bars: overhead p50 ≤ 100 µs and
  p99 ≤ 500 µs at concurrency 1; ≥ 2,000 jobs/s. Anchor (no peer run here): Triton's
  perf_analyzer quick start, ~1,408 infer/s with ~41 µs server overhead at concurrency 1.
- The tinygrad frontend: a tinygrad MLP (784-512-512-10, batch 64) and transformer block
  (d 256, 128 tokens) imported by `xpu.frontends.tinygrad` and run under the llvm-first
  policy, in-process, against tinygrad's own CPU backend (DEV=CPU, clang, TinyJit) on the
  same threads. Bar: ≥ 1.0× for both. Import time of a decoder-shaped model: reported.
- xpud, the MLP (ONNX, batch 1) submitted again and again at concurrency 1: server
  overhead when its prepared executable is reused (the default) against a server that
  prepares every job afresh (`limits.prepared_plans = 0`); reported as afresh / reused.

Every figure is a median over the same number of back-to-back runs on each side, after a
warm-up. The two sides alternate for ROUNDS rounds and each keeps its best median, so a
burst of noise on a shared machine cannot favour either side. Ratios are peer_time /
xpu_time (above 1: xpu is faster). Results are printed and written to
.cache/bench/results.md.
"""

import contextlib
import json
import re
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, ".cache", "bench")
THREADS = int(os.environ.get("XPU_BENCH_THREADS", os.cpu_count() or 2))
ROUNDS = int(os.environ.get("XPU_BENCH_ROUNDS", 3))
# Rounds of the llvm chains against the triad (each 20 runs of both, alternately, in one
# process; well under a second): a round's ratio swings ±0.1 with the neighbours' load on a
# shared host, so the bar is judged on the median of more of them than the other figures.
PAIR_ROUNDS = max(ROUNDS, int(os.environ.get("XPU_BENCH_PAIR_ROUNDS", 7)))
BENCH_BIN = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "xpu-bench")
XPUCTL = os.path.join(os.path.dirname(BENCH_BIN), "xpuctl")
TABLE_ROWS = int(os.environ.get("XPU_BENCH_TABLE_ROWS", 1_000_000))
# Processes per policy comparison in bench_measured (each measures every policy in rounds).
POLICY_PROCESSES = int(os.environ.get("XPU_BENCH_POLICY_PROCESSES", 5))


def median_time(fn, reps):
    # Warm for at least 0.2 s, as xpu-bench does: the first runs of a process (or after an
    # idle spell) are slower on these VMs, and a one-run warm-up left the median in them.
    warm_until = time.perf_counter() + 0.2
    fn()
    while time.perf_counter() < warm_until:
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def xpu(*args):
    out = subprocess.run([BENCH_BIN, *map(str, args)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["median_s"]


def xpu_pair(a, b, rows, reps, threads, env=None):
    """Median times of two SGR-ML programs on the llvm engine, run alternately in one
    process (`xpu-bench llvm-pair`); `env` adds to the environment (`XPU_LLVM_HOST_CPU`)."""
    out = subprocess.run([BENCH_BIN, "llvm-pair", a, b, str(rows), str(reps), str(threads)],
                         check=True, capture_output=True, text=True, env={**os.environ, **(env or {})})
    got = json.loads(out.stdout)
    return got["a_median_s"], got["b_median_s"]


def against_triad(program, nbytes, triad, rows, env=None):
    """One paired round of `program` (moving `nbytes` a run) with the triad over `rows`×1024
    f32 (3 arrays counted, as STREAM does): (bandwidth ratio, program's time, triad's)."""
    t_a, t_tr = xpu_pair(program, triad, rows, 20, THREADS, env)
    return (nbytes / t_a) / (3 * 4 * rows * 1024 / t_tr), t_a, t_tr


def mlp_model(path):
    rng = np.random.default_rng(0)
    dims = [784, 512, 512, 10]
    nodes, inits, prev = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        b = (rng.standard_normal(dims[i + 1]) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        prev = f"a{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 784])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    save(g, path)


def conv_model(path):
    rng = np.random.default_rng(1)
    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
    inits = [w("c1w", (16, 1, 3, 3)), w("c1b", (16,)), w("c2w", (32, 16, 3, 3)), w("c2b", (32,)), w("fw", (10, 32 * 7 * 7)), w("fb", (10,))]
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p2"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    g = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    save(g, path)


def resnet50_model(path):
    """A ResNet-50-shaped model as exporters emit it for inference (batch norm folded into
    each convolution's bias): a 7×7/2 stem, a 3×3/2 max pool, bottleneck stages of 3, 4, 6
    and 3 blocks (1×1, 3×3, 1×1 convolutions, stride on the 3×3, a 1×1 projection on each
    stage's first block), global average pooling and a 1000-way dense layer. Random
    weights scaled to keep activations in range; 25.5M parameters."""
    rng = np.random.default_rng(3)
    nodes, inits = [], []

    def conv(x, cin, cout, k, stride, relu, name):
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)) * 0.5).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.01).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, name + "_w"), numpy_helper.from_array(b, name + "_b")])
        p = k // 2
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[p, p, p, p]))
        if not relu:
            return name
        nodes.append(helper.make_node("Relu", [name], [name + "_r"]))
        return name + "_r"

    x = conv("x", 3, 64, 7, 2, True, "stem")
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512))):
        for block in range(blocks):
            name = f"s{stage}b{block}"
            stride = 2 if block == 0 and stage > 0 else 1
            y = conv(x, cin, width, 1, 1, True, name + "a")
            y = conv(y, width, width, 3, stride, True, name + "b")
            y = conv(y, width, width * 4, 1, 1, False, name + "c")
            shortcut = conv(x, cin, width * 4, 1, stride, False, name + "p") if block == 0 else x
            nodes.append(helper.make_node("Add", [y, shortcut], [name + "_sum"]))
            nodes.append(helper.make_node("Relu", [name + "_sum"], [name + "_out"]))
            x, cin = name + "_out", width * 4
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1))
    fw = (rng.standard_normal((1000, 2048)) / np.sqrt(2048)).astype(np.float32)
    inits.extend([numpy_helper.from_array(fw, "fc_w"), numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b")])
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1))
    g = helper.make_graph(nodes, "resnet50", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1000])], inits)
    save(g, path)


def save(graph, path):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="xpu-bench")
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)


def main():
    if not os.path.exists(BENCH_BIN):
        sys.exit(f"{BENCH_BIN} is missing: build it with `cargo build --release -p xpu-bench`")
    os.makedirs(OUT, exist_ok=True)
    rows = []
    print(f"threads: {THREADS} (numpy/OpenBLAS, onnxruntime intra-op, xpu); best median of {ROUNDS} alternating rounds")
    print("\nf32 matmul                       xpu GFLOP/s   numpy GFLOP/s   ratio (bar ≥ 0.9)")
    matmul_ok = True
    for n, reps in ((1024, 50), (3072, 7)):
        a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
        b = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
        best = {"numpy": float("inf"), "cpu.blas": float("inf"), "cpu.gemm": float("inf")}
        for _ in range(ROUNDS):
            best["numpy"] = min(best["numpy"], median_time(lambda: a @ b, reps))
            for kernel in ("cpu.blas", "cpu.gemm"):
                best[kernel] = min(best[kernel], xpu("matmul", n, reps, kernel))
        t_np = best["numpy"]
        for kernel in ("cpu.blas", "cpu.gemm"):
            t_x = best[kernel]
            flops = 2 * n ** 3
            ratio = t_np / t_x
            bar = kernel == "cpu.blas"
            if bar and ratio < 0.9:
                matmul_ok = False
            line = f"{n}³ {kernel:<9}                 {flops / t_x / 1e9:8.1f}      {flops / t_np / 1e9:8.1f}      {ratio:5.2f}{'  (bar)' if bar else '  (pure-Rust kernel, no bar)'}"
            print(line)
            rows.append(("matmul", f"{n}³", kernel, flops / t_x / 1e9, flops / t_np / 1e9, ratio))
    mlp, conv = os.path.join(OUT, "mlp.onnx"), os.path.join(OUT, "convnet.onnx")
    resnet = os.path.join(OUT, "resnet50.onnx")
    mlp_model(mlp)
    conv_model(conv)
    if not os.path.exists(resnet):
        resnet50_model(resnet)
    models_ok = bench_models(rows, mlp, conv, resnet)
    engines_ok = bench_engines(rows, mlp, conv)
    llvm_ok = bench_llvm(rows)
    riscv_ok = bench_riscv(rows)
    print("\nplanner, 1,000 nodes           median ms   budget/median (bar ≥ 1.0)")
    plan_ok = True
    for policy, inventory in (("cpu-only", "cpu-x86"), ("latency-gpu", "h100"), ("npu-openvino", "npu-laptop")):
        args = ("plan", 1000, os.path.join(ROOT, "policies/examples", policy + ".toml"),
                os.path.join(ROOT, "policies/inventories", inventory + ".toml"), 300)
        best = float("inf")
        for _ in range(ROUNDS):
            best = min(best, xpu(*args))
        ratio = 1e-3 / best
        plan_ok = plan_ok and ratio >= 1.0
        print(f"{policy:<14} on {inventory:<12} {best * 1e3:9.3f}            {ratio:5.2f}")
        rows.append(("plan 1000 nodes", policy, inventory, best * 1e3, 1.0, ratio))
    measured_ok = bench_measured(rows, mlp, conv, resnet)
    whole_ok = bench_whole_matmul(rows)
    tables_ok = bench_tables(rows)
    daemon_ok = bench_daemon(rows)
    model_job_ok = bench_prepared(rows, mlp)
    isolation_ok = bench_isolation(rows, mlp)
    bench_pool(rows, mlp)
    bench_python(rows, mlp)
    tinygrad_ok = bench_tinygrad(rows)
    with open(os.path.join(OUT, "results.md"), "w") as f:
        f.write("| workload | size | xpu kernel | xpu | peer | ratio |\n|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.2f} |\n")
    print(f"\nwrote {os.path.join(OUT, 'results.md')}")
    if not matmul_ok:
        sys.exit("matmul is below 0.9× numpy")
    if not plan_ok:
        sys.exit("planning a 1,000-node graph takes more than 1 ms")
    if not tables_ok:
        sys.exit("load_csv + stats is less than 3× faster than pandas read_csv + describe")
    if not daemon_ok:
        sys.exit("xpud misses its overhead or throughput bar")
    if not whole_ok:
        sys.exit("xpuctl run of the 3072³ matmul takes more than 1.2× numpy's whole process")
    if not models_ok:
        sys.exit("the cpu engine misses a model bar (MLP ≥ 0.9× onnxruntime, conv nets ≤ 2× its time)")
    if not engines_ok:
        sys.exit("the ort engine adds more than 5% at batch 64 or 30 µs per call at batch 1")
    if not isolation_ok:
        sys.exit("the ort engine in a worker process adds more than 50 µs per call at batch 1 or 5% at batch 64")
    if not model_job_ok:
        sys.exit("xpud's overhead on a model job it knows (the MLP by path, batch 1) is over 150 µs")
    if not measured_ok:
        sys.exit("measured planning misses a bar (tuned plan ≤ 1.05× the best single-engine policy, better than each on the mixed model, planning with evidence ≤ 1.2× the static planner)")
    if not tinygrad_ok:
        sys.exit("a tinygrad model imported into xpu (llvm-first) is slower than tinygrad's own CPU backend")
    if not riscv_ok:
        sys.exit("riscv64 vector builds execute fewer than 3× fewer instructions than scalar ones")
    if not llvm_ok:
        sys.exit("the llvm engine misses a bar (chains ≥ 2× numpy and ≥ numexpr, ≥ 70% of triad bandwidth, whole process ≥ 1.5× numpy, row groups ≥ 2× numpy)")


def mixed_model(path):
    """A model where engines win on different nodes: three GELU layers (tanh form) written
    out op by op over x + b, 27 elementwise ops (one fused loop for the llvm engine, passes
    or fused kernels elsewhere), then a 512×1024·1024×1024 product (a BLAS's job, in-process
    for the cpu engine; the llvm engine's own product is several times slower)."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((1024, 1024)).astype(np.float32) / 32, "w")
    b = numpy_helper.from_array(rng.standard_normal(1024).astype(np.float32), "b")
    consts = [numpy_helper.from_array(np.array(v, dtype=np.float32), n) for n, v in
              (("three", 3.0), ("c", 0.044715), ("r", 0.7978845608028654), ("one", 1.0), ("h", 0.5))]
    steps, cur = [], "x"
    for i in range(3):
        s = f"_{i}"
        steps += [("Add", [cur, "b"], "v" + s), ("Pow", ["v" + s, "three"], "t0" + s),
                  ("Mul", ["t0" + s, "c"], "t1" + s), ("Add", ["v" + s, "t1" + s], "t2" + s),
                  ("Mul", ["t2" + s, "r"], "t3" + s), ("Tanh", ["t3" + s], "t4" + s),
                  ("Add", ["t4" + s, "one"], "t5" + s), ("Mul", ["v" + s, "t5" + s], "t6" + s),
                  ("Mul", ["t6" + s, "h"], "g" + s)]
        cur = "g" + s
    steps.append(("MatMul", [cur, "w"], "y"))
    nodes = [helper.make_node(op, ins, [out], name=out) for op, ins, out in steps]
    graph = helper.make_graph(
        nodes, "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1024])],
        [w, b] + consts)
    save(graph, path)


def gelu_chain_model(path, rows):
    """The llvm engine's GELU chain (tanh form) written out op by op as ONNX, the bias a
    constant: one fused loop for llvm, nine passes for an engine that does not fuse."""
    rng = np.random.default_rng(7)
    b = numpy_helper.from_array(rng.standard_normal(1024).astype(np.float32), "b")
    consts = [numpy_helper.from_array(np.array(v, dtype=np.float32), n) for n, v in
              (("three", 3.0), ("c", 0.044715), ("r", 0.7978845608028654), ("one", 1.0), ("h", 0.5))]
    steps = [("Add", ["x", "b"], "v"), ("Pow", ["v", "three"], "t0"), ("Mul", ["t0", "c"], "t1"),
             ("Add", ["v", "t1"], "t2"), ("Mul", ["t2", "r"], "t3"), ("Tanh", ["t3"], "t4"),
             ("Add", ["t4", "one"], "t5"), ("Mul", ["v", "t5"], "t6"), ("Mul", ["t6", "h"], "y")]
    nodes = [helper.make_node(op, ins, [out], name=out) for op, ins, out in steps]
    graph = helper.make_graph(
        nodes, "gelu_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1024])],
        [b] + consts)
    save(graph, path)


def bench_measured(rows, mlp, conv, resnet):
    """Measured planning. For each model (the MLP, the conv net, the GELU chain, the
    ResNet-50-shaped model and the mixed model): `xpuctl tune` (release, engines in worker
    processes as xpud runs them) writes a lock for a policy that allows every engine; then
    each single-engine policy (the engine first, cpu for what it cannot run) and the policy
    choosing by measurement from that lock are run side by side (`xpu-bench policy-run`:
    rounds of blocks in one process, in five processes), the ratio taken round by round
    against the best single-engine policy. Bars: the measured plan ≤ 1.05× the best single-engine
    policy on every model (the tables group-by job compares the table engine's two
    kernels), and faster than every one on the mixed model; planning a
    1,000-node graph with evidence ≤ 1.2× the static planner."""
    import tempfile
    ok = True
    mixed = os.path.join(OUT, "mixed.onnx")
    mixed_model(mixed)
    gelu = os.path.join(OUT, "gelu_chain.onnx")
    gelu_chain_model(gelu, 4096)
    print("\nmeasured plan vs single-engine policies   batch   measured ms   best single ms (engine)   ratio (bar)")
    cases = (("mlp", mlp, (784,), 64), ("convnet", conv, (1, 28, 28), 8),
             ("gelu chain", gelu, (1024,), 4096), ("resnet50", resnet, (3, 224, 224), 1),
             ("mixed", mixed, (1024,), 512),
             # The table engine's two kernels (its own and DuckDB's) on the group-by job.
             ("tables group_by", table_job(tables_data(), "group_by+agg"), None, TABLE_ROWS))
    for name, path, shape, batch in cases:
        with tempfile.TemporaryDirectory() as d:
            x, given = "-", []
            if shape is not None:
                x = os.path.join(d, "x.npy")
                np.save(x, np.random.default_rng(2).standard_normal((batch, *shape)).astype(np.float32))
                given = ["-i", f"x={x}"]
            engines = ["cpu", "ort", "openvino", "llvm"] if shape is not None else ["table"]
            policies = {}
            for e in engines:
                order = [e] if e in ("cpu", "table") else [e, "cpu"]
                policies[f"only {e}"] = write_policy(d, f"only-{e}", f'[engines]\norder = {json.dumps(order)}\n')
            tuned = write_policy(d, "tuned", f'[engines]\norder = {json.dumps(engines)}\n')
            out = subprocess.run([XPUCTL, "tune", path, "--policy", tuned, *given, "--runs", "10"],
                                 check=True, capture_output=True, text=True, cwd=d)
            locked = next((l for l in out.stdout.splitlines() if l.startswith("locked plan:")), "")
            with open(tuned, "a") as f:
                f.write('choose = "measured"\n[measured]\nlock = "tuned.lock.toml"\n')
            policies["measured"] = tuned
            per_round = {}
            times = policy_run(path, x, policies, per_round)
        single = {k: v for k, v in times.items() if k != "measured"}
        best = min(single, key=single.get)
        # Round by round against the best single-engine policy: the drift of a shared host
        # between rounds cancels.
        ratio = paired_ratio(per_round, "measured", best)
        good = ratio <= 1.05 and (name != "mixed" or ratio < 1.0)
        ok = ok and good
        bar = "< 1.0" if name == "mixed" else "≤ 1.05"
        print(f"{name:<40} {batch:5}   {times['measured'] * 1e3:10.3f}   {single[best] * 1e3:10.3f} ({best:<13})  {ratio:5.2f} ({bar}){'' if good else '  MISSED'}")
        for k, v in sorted(times.items()):
            print(f"    {k:<14} {v * 1e3:10.3f} ms")
        print(f"    {locked}")
        rows.append((f"measured plan {name}", str(batch), best, times["measured"] * 1e3, single[best] * 1e3, 1 / ratio))
    print("\nplanning with evidence, 1,000 nodes   static ms   measured ms   ratio (bar ≤ 1.2)")
    for policy, inventory in (("cpu-only", "cpu-x86"), ("latency-gpu", "h100"), ("npu-openvino", "npu-laptop")):
        out = subprocess.run([BENCH_BIN, "plan-measured", "1000",
                              os.path.join(ROOT, "policies/examples", policy + ".toml"),
                              os.path.join(ROOT, "policies/inventories", inventory + ".toml"), "300"],
                             check=True, capture_output=True, text=True)
        got = json.loads(out.stdout)
        ratio = got["measured_median_s"] / got["static_median_s"]
        good = ratio <= 1.2
        ok = ok and good
        print(f"{policy:<14} on {inventory:<12} {got['static_median_s'] * 1e3:9.3f}   {got['measured_median_s'] * 1e3:9.3f}     {ratio:5.2f}  ({got['changed']} decisions moved){'' if good else '  MISSED'}")
        rows.append(("plan 1000 nodes with evidence", policy, inventory, got["measured_median_s"] * 1e3, got["static_median_s"] * 1e3, ratio))
    return ok


def write_policy(d, name, body):
    path = os.path.join(d, f"{name}.toml")
    with open(path, "w") as f:
        f.write(f'[policy]\nname = "{name}"\n{body}')
    return path


def policy_run(program, x, policies, rounds=None):
    """Median seconds per run of `program` under each policy (name → file), planned once,
    prepared once, run in rounds of blocks in one xpu-bench process with engines in worker
    processes as xpud runs them; the median over POLICY_PROCESSES processes (a process
    whose engine threads landed luckily or badly on this shared host's cores is one of
    several). `rounds`, when given, collects
    each policy's per-round medians (name → list) for paired comparisons."""
    names = list(policies)
    args = [BENCH_BIN, "policy-run", program, x, "30"] + [policies[n] for n in names]
    medians = {n: [] for n in names}
    for _ in range(POLICY_PROCESSES):
        out = subprocess.run(args, check=True, capture_output=True, text=True)
        got = json.loads(out.stdout)
        for n, t, r in zip(names, got["medians_s"], got["rounds_s"]):
            medians[n].append(t)
            if rounds is not None:
                rounds.setdefault(n, []).extend(r)
    return {n: sorted(t)[len(t) // 2] for n, t in medians.items()}


def paired_ratio(rounds, a, b):
    """The median over rounds of a's round median over b's (same process, same round)."""
    ratios = sorted(x / y for x, y in zip(rounds[a], rounds[b]))
    return ratios[len(ratios) // 2]


def python_package_dir():
    """python/xpu with the release build's native module beside it (and DuckDB's library),
    in a scratch dir: the package as the wheel lays it out, without installing it."""
    lib = os.path.join(os.path.dirname(BENCH_BIN), "lib_xpu.so")
    if not os.path.exists(lib):
        sys.exit(f"{lib} is missing: `make release` builds it")
    root = os.path.join(OUT, "python-pkg")
    pkg = os.path.join(root, "xpu")
    shutil.rmtree(root, ignore_errors=True)
    # Not the test build's module, DuckDB link or worker that `make test` leaves in python/xpu.
    shutil.copytree(os.path.join(ROOT, "python", "xpu"), pkg,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "xpu-worker"))
    shutil.copy(lib, os.path.join(pkg, "_xpu.abi3.so"))
    # The llvm engine runs in the release build's worker program, as the wheel carries it.
    os.symlink(os.path.join(os.path.dirname(BENCH_BIN), "xpu-worker"), os.path.join(pkg, "xpu-worker"))
    os.symlink(os.path.join(os.environ.get("DUCKDB_LIB_DIR", os.path.join(os.path.dirname(os.path.dirname(BENCH_BIN)), "duckdb")), "libduckdb.so"),
               os.path.join(pkg, "libduckdb.so"))
    return root


def bench_python(rows, mlp):
    """The Python package (bench/python_side.py in a fresh interpreter, release build):
    issue bars, reported: import ≤ 150 ms, the ort engine's extra cost per `sess.run` ≤ 5 µs
    over onnxruntime's Python API at batch 1, the cpu engine through Python ≥ 0.9×
    onnxruntime at batch 1 and 64, a 256 MiB input's hidden copies < 10% of it."""
    env = dict(os.environ, PYTHONPATH=python_package_dir())
    side = os.path.join(ROOT, "bench", "python_side.py")
    out = subprocess.run([sys.executable, side, mlp, str(THREADS)], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"\nPython package: failed\n{out.stderr[-2000:]}")
        return False
    r = json.loads(out.stdout.strip().splitlines()[-1])
    relu = os.path.join(OUT, "relu.onnx")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024, 1024])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1024, 1024])])
    save(g, relu)
    def hidden(flag):
        rss = subprocess.run([sys.executable, side, "rss", relu, flag], env=env, capture_output=True, text=True)
        return json.loads(rss.stdout.strip().splitlines()[-1]) if rss.returncode == 0 else {"hidden_share": float("nan")}
    m, w = hidden("readonly"), hidden("writable")
    print("\nPython package (release module)            xpu         onnxruntime   figure        bar")
    print(f"import xpu                                 {r['import_ms']:7.1f} ms                              ≤ 150 ms")
    print(f"sess.run, ort engine, MLP batch 1          {r['ort_engine_b1_us']:7.1f} µs  {r['onnxruntime_b1_us']:7.1f} µs   +{r['ort_extra_b1_us']:.1f} µs     ≤ +5 µs")
    print(f"  the same, performance = latency (spin)   {r['ort_latency_b1_us']:7.1f} µs                 +{r['ort_latency_extra_b1_us']:.1f} µs")
    for b in (1, 64):
        print(f"sess.run, cpu engine, MLP batch {b:<2}         {r[f'cpu_engine_b{b}_us']:7.1f} µs  {r[f'onnxruntime_b{b}_us']:7.1f} µs   {r[f'cpu_vs_onnxruntime_b{b}']:.2f}×        ≥ 0.9×")
    print(f"256 MiB read-only input: peak RSS beyond the output {m['hidden_share'] * 100:6.1f} % of the input        < 10 %")
    print(f"  the same input writable (copied by rule)         {w['hidden_share'] * 100:6.1f} %")
    rows.append(("python import", "", "xpu", r["import_ms"], 150.0, 150.0 / r["import_ms"]))
    rows.append(("python sess.run ort", "1", "ort", r["ort_engine_b1_us"], r["onnxruntime_b1_us"], r["onnxruntime_b1_us"] / r["ort_engine_b1_us"]))
    for b in (1, 64):
        rows.append(("python sess.run cpu", str(b), "cpu", r[f"cpu_engine_b{b}_us"], r[f"onnxruntime_b{b}_us"], r[f"cpu_vs_onnxruntime_b{b}"]))
    return True


def bench_tinygrad(rows):
    """The tinygrad frontend (bench/tinygrad_side.py in a fresh interpreter, release build):
    a tinygrad MLP (784-512-512-10, batch 64) and a transformer block (d 256, 128 tokens)
    run by xpu under the llvm-first policy, in-process, against tinygrad's own CPU backend
    (DEV=CPU: kernels compiled by clang, replayed by TinyJit), both on THREADS threads,
    numpy in and out on both sides. Bar: ≥ 1.0× tinygrad's speed for both. tinygrad's
    kernels alone (input resident, output left on the device): reported beside it. The decoder-shaped model's import time: reported."""
    env = dict(os.environ, PYTHONPATH=python_package_dir(), DEV="CPU", CC="clang-19",
               NUM_CPU_THREADS=str(THREADS))
    side = os.path.join(ROOT, "bench", "tinygrad_side.py")
    out = subprocess.run([sys.executable, side, str(THREADS), str(ROUNDS)], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"the tinygrad frontend's benchmark failed (is `make setup` done?):\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print("\ntinygrad frontend (llvm-first)      xpu         tinygrad CPU   ratio (bar ≥ 1.0)   kernels only   ratio   raised")
    ok = True
    for name, label in (("mlp", "MLP 784-512-512-10, batch 64"), ("block", "transformer block d256 t128")):
        m = r[name]
        ok = ok and m["ratio"] >= 1.0
        raised = ", ".join(f"{k} {v}" for k, v in sorted(m["raised"].items()))
        print(f"{label:<34} {m['xpu_us'] / 1e3:7.2f} ms  {m['tinygrad_us'] / 1e3:7.2f} ms      {m['ratio']:5.2f}"
              f"           {m['tinygrad_kernels_us'] / 1e3:7.2f} ms   {m['kernels_ratio']:5.2f}   {raised}")
        rows.append(("tinygrad " + name, "", "llvm-first", m["xpu_us"] / 1e3, m["tinygrad_us"] / 1e3, m["ratio"]))
    d = r["decoder_import"]
    print(f"import of the decoder (4 layers, {d['values']} SGR-ML values): {d['ms']:.1f} ms")
    return ok


def bench_models(rows, mlp, conv, resnet):
    """xpu's cpu engine (a warm, prepared executable) against onnxruntime's CPU provider,
    same thread count, in-process, warm. Bars: the MLP at ≥ 0.9× onnxruntime's speed, the
    conv nets at ≤ 2× its time (ratio ort/xpu ≥ 0.5)."""
    print("\nmodel            batch    xpu ms   onnxruntime ms   ratio (ort/xpu)   bar")
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    ok = True
    cases = (("mlp", mlp, (784,), ((1, 300), (64, 100)), 0.9),
             ("convnet", conv, (1, 28, 28), ((1, 300), (8, 100)), 0.5),
             ("resnet50", resnet, (3, 224, 224), ((1, 5), (8, 3)), 0.5))
    for name, path, shape, batches, bar in cases:
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        for batch, reps in batches:
            x = np.random.default_rng(2).standard_normal((batch, *shape)).astype(np.float32)
            t_ort, t_x = float("inf"), float("inf")
            for _ in range(ROUNDS):
                t_ort = min(t_ort, median_time(lambda: sess.run(None, {"x": x}), reps))
                t_x = min(t_x, xpu("model", path, batch, reps))
            ratio = t_ort / t_x
            ok = ok and ratio >= bar
            print(f"{name:<16} {batch:5}  {t_x * 1e3:8.3f}   {t_ort * 1e3:12.3f}     {ratio:5.2f}            ≥ {bar}")
            rows.append((name, str(batch), "cpu", t_x * 1e3, t_ort * 1e3, ratio))
    return ok


def bench_engines(rows, mlp, conv):
    """xpu's ort engine (in-process, warm session, the model as given) against onnxruntime's
    Python API on the same model, thread count and options (one intra-op pool of THREADS,
    sequential, spinning off: the setting xpu's policies give ORT). Bars: overhead ≤ 5% at
    batch 64 and ≤ 30 µs per call at batch 1."""
    print("\nort engine vs onnxruntime (Python)   batch   xpu ms   python ms   overhead")
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    ok = True
    # Both sides run the same library on the same model, so the bar is about a few percent
    # between two equal computations: on this shared VM one round's median moves by ±5 %.
    # More alternating rounds (each side keeps its best median) let both minima settle.
    rounds = max(ROUNDS, 5)
    for name, path, shape in (("mlp 784-512-512-10", mlp, (784,)), ("convnet", conv, (1, 28, 28))):
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        for batch, reps in ((1, 2000), (64, 300)):
            x = np.random.default_rng(2).standard_normal((batch, *shape)).astype(np.float32)
            t_py, t_x = float("inf"), float("inf")
            for _ in range(rounds):
                t_py = min(t_py, median_time(lambda: sess.run(None, {"x": x}), reps))
                t_x = min(t_x, xpu("ort", path, batch, reps, THREADS))
            if batch == 1:
                over = (t_x - t_py) * 1e6
                good = over <= 30
                verdict = f"{over:+7.1f} µs/call (bar ≤ 30 µs)"
            else:
                over = (t_x / t_py - 1) * 100
                good = over <= 5
                verdict = f"{over:+6.1f}% (bar ≤ 5%)"
            ok = ok and good
            print(f"{name:<34} {batch:5}  {t_x * 1e3:8.3f}   {t_py * 1e3:8.3f}   {verdict}{'' if good else '  MISSED'}")
            rows.append((f"ort engine {name}", str(batch), "ort.cpu", t_x * 1e3, t_py * 1e3, t_py / t_x))
    # OpenVINO: reported the same way (no bar): CPU device, fp32 hint, latency hint, the
    # same thread count, one infer request, synchronous calls on both sides.
    import openvino as ov
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
              "EXECUTION_MODE_HINT": "PERFORMANCE", "INFERENCE_NUM_THREADS": THREADS}
    print("\nopenvino engine vs openvino (Python) batch   xpu ms   python ms   overhead (reported)")
    for name, path, shape in (("mlp 784-512-512-10", mlp, (784,)), ("convnet", conv, (1, 28, 28))):
        compiled = core.compile_model(core.read_model(path), "CPU", config)
        request = compiled.create_infer_request()
        for batch, reps in ((1, 2000), (64, 300)):
            x = np.random.default_rng(2).standard_normal((batch, *shape)).astype(np.float32)
            t_py, t_x = float("inf"), float("inf")
            for _ in range(ROUNDS):
                t_py = min(t_py, median_time(lambda: request.infer([x]), reps))
                t_x = min(t_x, xpu("openvino", path, batch, reps, THREADS))
            over = f"{(t_x - t_py) * 1e6:+7.1f} µs/call" if batch == 1 else f"{(t_x / t_py - 1) * 100:+6.1f}%"
            print(f"{name:<34} {batch:5}  {t_x * 1e3:8.3f}   {t_py * 1e3:8.3f}   {over}")
            rows.append((f"openvino engine {name}", str(batch), "openvino.cpu", t_x * 1e3, t_py * 1e3, t_py / t_x))
    return ok



PROGRAMS = os.path.join(ROOT, "tests", "programs")
CHAIN_ROWS = int(os.environ.get("XPU_BENCH_CHAIN_ROWS", 4096))


def chain_cases(rows):
    """The fused chains of the llvm engine's bar: program, inputs, numpy one op at a time,
    and the numexpr expression of the same computation (float32 constants)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((rows, 1024)).astype(np.float32)
    b = rng.standard_normal(1024).astype(np.float32)
    s = rng.standard_normal(1024).astype(np.float32)
    s_rows = rng.standard_normal((rows, 1)).astype(np.float32)
    f = np.float32

    def gelu(x, b):
        v = x + b
        t = np.power(v, f(3.0))
        t = t * f(0.044715)
        t = v + t
        t = t * f(0.7978845608028654)
        t = np.tanh(t)
        t = t + f(1.0)
        t = v * t
        return t * f(0.5)

    def silu(x, s, b):
        v = x * s
        v = v + b
        t = np.negative(v)
        t = np.exp(t)
        t = t + f(1.0)
        return v / t

    def mish(x, b):
        v = x + b
        t = np.exp(v)
        t = t + f(1.0)
        t = np.log(t)
        t = np.tanh(t)
        return v * t

    def softplus(x, s, b):
        v = x * s
        v = v + b
        t = np.exp(v)
        t = t + f(1.0)
        return np.log(t)

    k = {"h": f(0.5), "one": f(1.0), "c": f(0.044715), "r": f(0.7978845608028654), "three": f(3.0)}
    return [
        ("gelu (tanh form)", "gelu_chain.sgr", {"x": x, "b": b}, gelu,
         "(x + b) * h * (one + tanh(r * ((x + b) + c * (x + b) ** three)))", k),
        ("silu", "silu_chain.sgr", {"x": x, "s": s, "b": b}, silu,
         "(x * s + b) / (one + exp(-(x * s + b)))", k),
        ("mish", "mish_chain.sgr", {"x": x, "b": b}, mish,
         "(x + b) * tanh(log(one + exp(x + b)))", k),
        ("softplus, broadcasts", "softplus_chain.sgr", {"x": x, "s": s_rows, "b": b}, softplus,
         "log(one + exp(x * s + b))", k),
    ]


def bench_llvm(rows):
    """The llvm engine's fused chains (GELU, SiLU, Mish, softplus written out op by op) on
    CHAIN_ROWS×1024 f32, in-process, against numpy one op at a time and numexpr on THREADS
    threads. Bars: ≥ 2× numpy and ≥ numexpr (geometric means). Also each chain's bandwidth
    (bytes in + out per second) against a STREAM-style triad compiled by the same engine
    (a = b + k·c over arrays of the same size; 3 arrays counted, as STREAM does): bar ≥ 70%;
    and the whole `xpuctl run` process against a Python script (np.load, the expression,
    np.save): bar ≥ 1.5×."""
    import numexpr as ne
    ne.set_num_threads(THREADS)
    n = CHAIN_ROWS
    print(f"\nllvm fused chains, {n}×1024 f32          xpu ms   numpy ms   numexpr ms   ×numpy   ×numexpr")
    # STREAM-style triad through the same engine: 2 arrays read, 1 written.
    triad = os.path.join(OUT, "triad.sgr")
    with open(triad, "w") as fh:
        fh.write('graph "triad" {\n  %0: f32[N,1024] = input "b"\n  %1: f32[N,1024] = input "c"\n'
                 '  %2: f32[] = constant {value = tensor<f32[]> [3.0]}\n  %3: f32[N,1024] = mul(%1, %2)\n'
                 '  %4: f32[N,1024] = add(%0, %3)\n  return "a" = %4\n}\n')
    t_triad = float("inf")
    vs_np, vs_ne, ok = [], [], True
    moved = {}
    cases = chain_cases(n)
    for name, program, inputs, np_fn, expr, consts in cases:
        args = list(inputs.values())
        local = {**inputs, **consts}
        out_np = np_fn(*args)
        out_ne = ne.evaluate(expr, local_dict=local)
        assert out_ne.dtype == np.float32 and np.allclose(out_np, out_ne, rtol=1e-4, atol=1e-5), name
        best = {"xpu": float("inf"), "numpy": float("inf"), "numexpr": float("inf")}
        nbytes = sum(v.nbytes for v in inputs.values()) + out_np.nbytes
        ratios = []
        for _ in range(ROUNDS):
            # The chain and the triad run alternately in one process, run by run, so both
            # see the same stretch of this noisy machine: each round gives one ratio of
            # their medians, and the bar is judged on the median round.
            ratio, t_chain, t_tr = against_triad(os.path.join(PROGRAMS, program), nbytes, triad, n)
            ratios.append(ratio)
            t_triad = min(t_triad, t_tr)
            best["xpu"] = min(best["xpu"], t_chain)
            best["numpy"] = min(best["numpy"], median_time(lambda: np_fn(*args), 20))
            best["numexpr"] = min(best["numexpr"], median_time(lambda: ne.evaluate(expr, local_dict=local), 20))
        # More rounds against the triad only: xpu's time against numpy and numexpr stays the
        # best of the ROUNDS rounds all three had.
        for _ in range(PAIR_ROUNDS - ROUNDS):
            ratio, _, t_tr = against_triad(os.path.join(PROGRAMS, program), nbytes, triad, n)
            ratios.append(ratio)
            t_triad = min(t_triad, t_tr)
        r_np, r_ne = best["numpy"] / best["xpu"], best["numexpr"] / best["xpu"]
        vs_np.append(r_np)
        vs_ne.append(r_ne)
        moved[name] = (nbytes / best["xpu"], sorted(ratios))
        print(f"{name:<38} {best['xpu'] * 1e3:7.2f}   {best['numpy'] * 1e3:8.2f}   {best['numexpr'] * 1e3:10.2f}   {r_np:6.2f}   {r_ne:8.2f}")
        rows.append(("llvm chain vs numpy", name, "llvm.fused", best["xpu"] * 1e3, best["numpy"] * 1e3, r_np))
        rows.append(("llvm chain vs numexpr", name, "llvm.fused", best["xpu"] * 1e3, best["numexpr"] * 1e3, r_ne))
    g_np, g_ne = geomean(vs_np), geomean(vs_ne)
    ok = g_np >= 2.0 and g_ne >= 1.0
    print(f"{'geometric mean':<38} {'':>7}   {'':>8}   {'':>10}   {g_np:6.2f}   {g_ne:8.2f}   (bars ≥ 2.0, ≥ 1.0){'' if ok else '  MISSED'}")
    bw_triad = 3 * 4 * n * 1024 / t_triad
    print(f"bandwidth (inputs + output bytes / time) against a triad run alternately with it (best triad {bw_triad / 1e9:.1f} GB/s;")
    print(f"  median of {PAIR_ROUNDS} rounds [lowest, highest]; bar ≥ 0.70 for each chain):")
    bw_ok = True
    for name, (bw, ratios) in moved.items():
        ratio = ratios[len(ratios) // 2]
        bw_ok = bw_ok and ratio >= 0.7
        print(f"  {name:<36} {bw / 1e9:6.1f} GB/s   {ratio:5.2f} [{ratios[0]:.2f}, {ratios[-1]:.2f}]{'' if ratio >= 0.7 else '  MISSED'}")
        rows.append(("llvm chain bandwidth / triad", name, "llvm.fused", bw / 1e9, bw_triad / 1e9, ratio))
    # A memory-bound chain (bias + ReLU, as an epilogue writes it), for reference: what a
    # chain with little arithmetic per byte reaches against the same triad (not a bar chain).
    bias_relu = os.path.join(OUT, "bias_relu.sgr")
    with open(bias_relu, "w") as fh:
        fh.write('graph "bias_relu" {\n  %0: f32[N,1024] = input "x"\n  %1: f32[1024] = input "b"\n'
                 '  %2: f32[N,1024] = add(%0, %1)\n  %3: f32[N,1024] = relu(%2)\n  return "y" = %3\n}\n')
    ratios, t_br = [], float("inf")
    for _ in range(PAIR_ROUNDS):
        ratio, t_b, _ = against_triad(bias_relu, 2 * 4 * n * 1024, triad, n)
        ratios.append(ratio)
        t_br = min(t_br, t_b)
    ratio = sorted(ratios)[len(ratios) // 2]
    print(f"  {'bias + relu (reference, no bar)':<36} {2 * 4 * n * 1024 / t_br / 1e9:6.1f} GB/s   {ratio:5.2f}")
    rows.append(("llvm chain bandwidth / triad", "bias + relu (reference)", "llvm.fused", 2 * 4 * n * 1024 / t_br / 1e9, bw_triad / 1e9, ratio))
    bench_llvm_held(rows, cases, triad, n)
    whole_ok = bench_whole_chain(rows, cases[0])
    rows_ok = bench_llvm_rows(rows)
    # llvm.gemm against numpy/OpenBLAS: reported (no bar yet).
    a = np.random.default_rng(9).standard_normal((1024, 1024)).astype(np.float32)
    bm = np.random.default_rng(10).standard_normal((1024, 1024)).astype(np.float32)
    t_g, t_np = float("inf"), float("inf")
    for _ in range(ROUNDS):
        t_g = min(t_g, xpu("llvm", os.path.join(PROGRAMS, "matmul_square.sgr"), 1024, 5, THREADS))
        t_np = min(t_np, median_time(lambda: a @ bm, 10))
    flops = 2 * 1024 ** 3
    print(f"\nllvm.gemm f32 1024³: {flops / t_g / 1e9:.1f} GFLOP/s, numpy {flops / t_np / 1e9:.1f} GFLOP/s: {t_np / t_g:.2f}× (reported, no bar)")
    rows.append(("llvm.gemm 1024³ GFLOP/s", "1024³", "llvm.gemm", flops / t_g / 1e9, flops / t_np / 1e9, t_np / t_g))
    print("\nllvm compile time per program (all its kernels)   kernels   cold ms   disk cache ms")
    import tempfile
    for program in ("gelu_chain", "silu_chain", "mish_chain", "softplus_chain", "softmax_rows",
                    "layernorm_rows", "rmsnorm_rows", "logsumexp_rows"):
        with tempfile.TemporaryDirectory() as cache:
            argv = [BENCH_BIN, "llvm-compile", os.path.join(PROGRAMS, program + ".sgr"), str(n), cache]
            cold, disk = (json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
                          for _ in range(2))
        assert cold["source"] == "compiled" and disk["source"] == "disk cache", (cold, disk)
        print(f"{program:<50} {cold['kernels']:7d}   {cold['ms']:7.1f}   {disk['ms']:13.2f}")
        rows.append(("llvm compile ms (cold / disk)", program, "llvm", cold["ms"], disk["ms"], cold["ms"] / max(disk["ms"], 1e-3)))
    return ok and bw_ok and whole_ok and rows_ok


def row_cases(rows):
    """Row-wise groups written out op by op (programs) and numpy doing the same ops."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((rows, 1024)).astype(np.float32)
    g = rng.standard_normal(1024).astype(np.float32)
    b = rng.standard_normal(1024).astype(np.float32)
    f = np.float32

    def softmax(x):
        m = x.max(-1, keepdims=True)
        e = np.exp(x - m)
        return e / e.sum(-1, keepdims=True)

    def layernorm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        d = x - mu
        var = (d * d).mean(-1, keepdims=True)
        return d / np.sqrt(var + f(1e-5)) * g + b

    def rmsnorm(x, g):
        ms = (x * x).mean(-1, keepdims=True)
        return x / np.sqrt(ms + f(1e-6)) * g

    def logsumexp(x):
        m = x.max(-1, keepdims=True)
        return np.log(np.exp(x - m).sum(-1, keepdims=True)) + m

    return [
        ("softmax", "softmax_rows.sgr", {"x": x}, softmax),
        ("layernorm", "layernorm_rows.sgr", {"x": x, "gamma": g, "beta": b}, layernorm),
        ("rmsnorm", "rmsnorm_rows.sgr", {"x": x, "gamma": g}, rmsnorm),
        ("log-sum-exp", "logsumexp_rows.sgr", {"x": x}, logsumexp),
    ]


def bench_riscv(rows):
    """The fused chains built for riscv64 twice (`xpuctl build --cpu rv64gc` and `rv64gcv`)
    and run under qemu, counting the instructions their kernels execute (qemu one
    instruction per block, `-d exec`: a count, not a time, so repeatable on a shared VM).
    Bar: the vector build (scalable vectors, vlen=128) executes ≥ 3× fewer; vlen=256 is
    reported too."""
    import tempfile
    rvv = "rv64,v=true,vext_spec=v1.0"
    n = 4
    print(f"\nriscv64 fused chains, {n}×1024 f32: kernel instructions   rv64gc   rv64gcv vlen=128   vlen=256   scalar/vector (bar ≥ 3)")
    ok = True
    for program in ("gelu_chain", "silu_chain", "mish_chain", "softplus_chain"):
        with tempfile.TemporaryDirectory() as d:
            src = open(os.path.join(PROGRAMS, f"{program}.sgr")).read()
            inputs = re.findall(r'f32\[([^\]]*)\] = input "(\w+)"', src)
            args = []
            for dims, name in inputs:
                shape = [n if x.strip() == "N" else int(x) for x in dims.split(",")]
                path = os.path.join(d, f"{name}.npy")
                np.save(path, np.random.default_rng(len(args)).standard_normal(shape).astype(np.float32))
                args += ["--input", f"{name}={path}"]
            counts = {}
            for isa, runner in (("rv64gc", "qemu-riscv64 -cpu rv64,v=false"), ("rv64gcv", f"qemu-riscv64 -cpu {rvv},vlen=128"),
                                ("rv64gcv", f"qemu-riscv64 -cpu {rvv},vlen=256")):
                build = os.path.join(d, isa)
                if not os.path.exists(build):
                    subprocess.run([XPUCTL, "build", os.path.join(PROGRAMS, f"{program}.sgr"), "--target", "riscv64",
                                    "--cpu", isa, "--bind", f"N={n}", "-o", build], check=True, capture_output=True)
                counts[runner] = riscv_kernel_instructions(build, runner, args, d)
            scalar, v128, v256 = counts.values()
            ratio = scalar / max(v128, 1)
            ok = ok and ratio >= 3
            print(f"{program:<44} {scalar:9,} {v128:12,} {v256:11,}   {ratio:5.2f}{'' if ratio >= 3 else '  MISSED'}")
            rows.append((f"riscv64 {program} instructions", f"{n}×1024", "llvm.riscv rv64gcv", v128, scalar, ratio))
    return ok


def riscv_kernel_instructions(build, runner, args, d):
    """Instructions executed inside the build's kernels (its `xpu…` functions) for one run."""
    nm = subprocess.run(["riscv64-linux-gnu-nm", "--defined-only", "--print-size", os.path.join(build, "program")],
                        check=True, capture_output=True, text=True).stdout
    ranges = []
    for line in nm.splitlines():
        f = line.split()
        if len(f) == 4 and f[2] in ("t", "T") and f[3].startswith("xpu"):
            start = int(f[0], 16)
            ranges.append((start, start + int(f[1], 16)))
    log = os.path.join(d, "exec.log")
    cmd = runner.split() + ["-singlestep", "-d", "exec,nochain", "-D", log, os.path.join(build, "program")]
    subprocess.run(cmd + args + ["--out", os.path.join(d, "out")], check=True, capture_output=True)
    count = 0
    with open(log) as fh:
        for line in fh:
            try:
                pc = int(line.split("[", 1)[1].split("/")[1], 16)
            except (IndexError, ValueError):
                continue
            if any(a <= pc < b for a, b in ranges):
                count += 1
    os.remove(log)
    return count


def bench_llvm_held(rows, cases, triad, n):
    """On a host with AVX-512, the bandwidth ratios again with both the chains and the triad
    held to x86-64-v3 (`XPU_LLVM_HOST_CPU`: AVX2, 256-bit vectors), what a host without
    AVX-512 but with this one's memory would get: reported, no bar (the bar is the host's
    own code, above)."""
    with open("/proc/cpuinfo") as fh:
        if " avx512f" not in fh.read():
            return
    held = {"XPU_LLVM_HOST_CPU": "x86-64-v3"}
    print("  held to x86-64-v3 (AVX2 code on this host, both sides; reported, no bar):")
    for name, program, inputs, *_ in cases:
        nbytes = sum(v.nbytes for v in inputs.values()) + 4 * n * 1024  # inputs + the f32 output
        ratios = []
        for _ in range(PAIR_ROUNDS):
            try:
                ratio, _, _ = against_triad(os.path.join(PROGRAMS, program), nbytes, triad, n, held)
            except subprocess.CalledProcessError as e:
                print(f"  {name:<36} unavailable: {(e.stderr or '').strip()[-200:]}")
                break
            ratios.append(ratio)
        if not ratios:
            continue
        ratios.sort()
        ratio = ratios[len(ratios) // 2]
        print(f"  {name:<36} {'':>11}   {ratio:5.2f} [{ratios[0]:.2f}, {ratios[-1]:.2f}]")
        rows.append(("llvm chain bandwidth / triad, x86-64-v3 code", name, "llvm.fused", 0.0, 0.0, ratio))


def bench_llvm_rows(rows):
    """Row-wise groups (softmax, LayerNorm, RMSNorm, log-sum-exp written out op by op) on
    CHAIN_ROWS×1024 f32 through the llvm engine, in-process, against numpy doing the same
    ops. Bar: ≥ 2× numpy (geometric mean)."""
    n = CHAIN_ROWS
    print(f"\nllvm row groups, {n}×1024 f32           xpu ms   numpy ms   ×numpy")
    ratios = []
    for name, program, inputs, np_fn in row_cases(n):
        args = list(inputs.values())
        best = {"xpu": float("inf"), "numpy": float("inf")}
        for _ in range(ROUNDS):
            best["xpu"] = min(best["xpu"], xpu("llvm", os.path.join(PROGRAMS, program), n, 20, THREADS))
            best["numpy"] = min(best["numpy"], median_time(lambda: np_fn(*args), 20))
        r = best["numpy"] / best["xpu"]
        ratios.append(r)
        print(f"{name:<38} {best['xpu'] * 1e3:7.2f}   {best['numpy'] * 1e3:8.2f}   {r:6.2f}")
        rows.append(("llvm row group vs numpy", name, "llvm.reduce", best["xpu"] * 1e3, best["numpy"] * 1e3, r))
    gm = geomean(ratios)
    ok = gm >= 2.0
    print(f"{'geometric mean':<38} {'':>7}   {'':>8}   {gm:6.2f}   (bar ≥ 2.0){'' if ok else '  MISSED'}")
    return ok


def geomean(ratios):
    return float(np.exp(np.mean(np.log(ratios))))


def bench_whole_chain(rows, case):
    """`xpuctl run` of the GELU chain under the llvm-host policy (kernels from the disk cache
    after the warm-up) against a Python process doing np.load ×2, the expression, np.save."""
    d = os.path.join(OUT, "whole-chain")
    os.makedirs(d, exist_ok=True)
    name, program, inputs, _, _, _ = case
    for k, v in inputs.items():
        np.save(os.path.join(d, f"{k}.npy"), v)
    env_cache = {"XPU_CACHE_DIR": os.path.join(OUT, "xpu-cache")}
    argv = [XPUCTL, "run", os.path.join(PROGRAMS, program), "--policy", os.path.join(ROOT, "policies", "examples", "llvm-host.toml"),
            "--input", "x=x.npy", "--input", "b=b.npy", "--out", "out-xpu"]
    py = ("import numpy as np; x = np.load('x.npy'); b = np.load('b.npy'); v = x + b; "
          "np.save('y.npy', np.float32(0.5) * v * (np.float32(1) + np.tanh(np.float32(0.7978845608028654) "
          "* (v + np.float32(0.044715) * v ** 3))))")

    def timed(cmd):
        def once():
            subprocess.run(cmd, cwd=d, check=True, capture_output=True, env={**os.environ, **env_cache})
        return median_time(once, 5)

    t_x, t_np = float("inf"), float("inf")
    for _ in range(ROUNDS):
        t_x = min(t_x, timed(argv))
        t_np = min(t_np, timed([sys.executable, "-c", py]))
    ratio = t_np / t_x
    ok = ratio >= 1.5
    print(f"whole process, {name} .npy in/out: xpuctl {t_x * 1e3:.0f} ms, python {t_np * 1e3:.0f} ms: {ratio:.2f}× (bar ≥ 1.5){'' if ok else '  MISSED'}")
    rows.append(("whole process llvm chain", name, "llvm.fused", t_x, t_np, ratio))
    return ok


def process_time(argv, cwd, reps=3, env=None):
    """Median wall time of a whole process (start to exit), after one warm-up run."""
    def once():
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True, env=env)
    return median_time(once, reps)


# OpenBLAS's own variables, which some machines set in the environment to keep old builds
# working; a run that compares BLAS kernels sets them itself for both sides.
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def blas_env(coretype=None):
    env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_VARS}
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def blas_cores(env, cwd):
    """(xpu's BLAS, numpy's BLAS) as each describes itself under `env`: release and core."""
    out = subprocess.run([XPUCTL, "engines", "--format", "json"], cwd=cwd, env=env,
                         capture_output=True, text=True, check=True).stdout
    xpu_blas = "?"
    for engine in json.loads(out)["engines"]:
        for k in engine.get("kernels", []):
            if k.get("name") == "cpu.blas":
                xpu_blas = k.get("description", "?").split("GEMV, ")[-1].split(" from ")[0]
                if k.get("degraded"):
                    xpu_blas += " (degraded)"
    probe = ("import ctypes, glob, os, numpy\n"
             "libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__), os.pardir, 'numpy.libs', '*openblas*.so'))\n"
             "l = ctypes.CDLL(libs[0])\n"
             "for s in ('corename', 'config'):\n"
             "    f = next(getattr(l, n) for n in (f'scipy_openblas_get_{s}64_', f'scipy_openblas_get_{s}', f'openblas_get_{s}') if hasattr(l, n))\n"
             "    f.restype = ctypes.c_char_p\n"
             "    print(f().decode())\n")
    r = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True)
    lines = r.stdout.split("\n")
    np_blas = f"{' '.join(lines[1].split()[:2])}, core {lines[0]}" if r.returncode == 0 and len(lines) > 1 else "?"
    return xpu_blas, np_blas


def bench_whole_matmul(rows):
    """A user's whole process: `xpuctl run` of a one-node 3072³ f32 matmul ONNX model with two
    `.npy` inputs and the `.npy` output, against a Python process doing `np.load` ×2,
    `a @ b`, `np.save`. Bar: xpu's process ≤ 1.2× numpy's."""
    d = os.path.join(OUT, "whole-matmul")
    os.makedirs(d, exist_ok=True)
    n = 3072
    model = os.path.join(d, "matmul.onnx")
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "matmul",
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in ("a", "b")],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    save(g, model)
    rng = np.random.default_rng(4)
    for name in ("a", "b"):
        np.save(os.path.join(d, f"{name}.npy"), rng.standard_normal((n, n)).astype(np.float32))
    xpu_argv = [XPUCTL, "run", model, "--input", "a=a.npy", "--input", "b=b.npy", "--out", "out-xpu"]
    py = "import numpy as np; a = np.load('a.npy'); b = np.load('b.npy'); np.save('c.npy', a @ b)"
    # The machine as it is, then (on an AVX-512 host) an AVX2-only CPU as OpenBLAS can
    # simulate one: both processes told to run OpenBLAS's Haswell kernels.
    configs = [("native", blas_env())]
    if "avx512f" in open("/proc/cpuinfo").read():
        configs.append(("AVX2 (OPENBLAS_CORETYPE=Haswell)", blas_env("Haswell")))
    print(f"\nwhole process, {n}³ f32 matmul .npy in/out   xpuctl s   python s   xpu/numpy (bar ≤ 1.2)")
    ok = True
    for label, env in configs:
        xpu_blas, np_blas = blas_cores(env, d)
        t_x, t_np = float("inf"), float("inf")
        for _ in range(ROUNDS):
            t_x = min(t_x, process_time(xpu_argv, d, env=env))
            t_np = min(t_np, process_time([sys.executable, "-c", py], d, env=env))
        ratio = t_x / t_np
        ok = ok and ratio <= 1.2
        print(f"{label:<42} {t_x:8.3f}   {t_np:8.3f}   {ratio:5.2f}{'' if ratio <= 1.2 else '  MISSED'}")
        print(f"    xpu: {xpu_blas}; numpy: {np_blas}")
        rows.append((f"whole process matmul, {label}", f"{n}³", "cpu.blas", t_x, t_np, t_np / t_x))
    return ok


def tables_data():
    """The tables jobs' directory, with numbers.csv written if missing."""
    d = os.path.join(OUT, "tables")
    os.makedirs(d, exist_ok=True)
    csv_path = os.path.join(d, "numbers.csv")
    # Written the way pandas writes a frame (`round(6).to_csv`): shortest round-trip floats,
    # so values below 1e-4 come out as `1e-05`, as in real exports. The stamp names the
    # writer, so a file from an older generator is rewritten.
    stamp = csv_path + ".pandas-round6"
    if not os.path.exists(stamp) or os.path.getsize(csv_path) < TABLE_ROWS * 8:
        rng = np.random.default_rng(0)
        cols = {"k": rng.integers(0, 100, TABLE_ROWS)}
        for i in range(1, 8):
            cols[f"c{i}"] = rng.standard_normal(TABLE_ROWS) * 10 ** (i % 4)
        import pandas as pd
        pd.DataFrame(cols).round(6).to_csv(csv_path, index=False)
        open(stamp, "w").close()
    return d


TABLE_JOBS = {
    "stats": ('print stats(load_csv("numbers.csv"))\n',
              "import pandas as pd; print(pd.read_csv('numbers.csv').describe())"),
    "group_by+agg": ('print head(load_csv("numbers.csv") |> group_by("k") |> agg(n = count(), m = mean(c1), s = std(c2), hi = max(c3)), 3)\n',
                     "import pandas as pd; print(pd.read_csv('numbers.csv').groupby('k').agg(n=('c1', 'size'), m=('c1', 'mean'), s=('c2', 'std'), hi=('c3', 'max')).head(3))"),
}


def table_job(d, name):
    """Writes the MiniLang job `name` of TABLE_JOBS into `d`; returns its path."""
    job = os.path.join(d, f"{name.replace('+', '_')}.ml")
    with open(job, "w") as f:
        f.write(TABLE_JOBS[name][0])
    return job


def bench_tables(rows):
    d = tables_data()
    print(f"\ntables, {TABLE_ROWS:,} rows x 8 columns   xpu s    pandas s   ratio (pandas/xpu)")
    ok = True
    for name, (ml, py) in TABLE_JOBS.items():
        job = table_job(d, name)
        t_x, t_pd = float("inf"), float("inf")
        for _ in range(ROUNDS):
            t_x = min(t_x, process_time([XPUCTL, "run", job, "--out", os.path.join(d, "out")], d))
            t_pd = min(t_pd, process_time([sys.executable, "-c", py], d))
        ratio = t_pd / t_x
        bar = 3.0 if name == "stats" else 2.0
        ok = ok and ratio >= bar
        print(f"{name:<36} {t_x:6.3f}   {t_pd:8.3f}   {ratio:5.2f}  (bar ≥ {bar:g})")
        # Both run on table.native: describe, and the group-by of a plainly numeric file.
        kernel = "table.native"
        rows.append((f"tables {name}", f"{TABLE_ROWS} rows", kernel, t_x, t_pd, ratio))
    return ok


@contextlib.contextmanager
def xpud_server(name, env=None):
    """A release xpud in dev mode on a free loopback port, with its own data directory."""
    import shutil
    import socket
    import urllib.request

    xpud = os.path.join(os.path.dirname(BENCH_BIN), "xpud")
    data = os.path.join(OUT, name)
    shutil.rmtree(data, ignore_errors=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([xpud, "--dev", "--listen", f"127.0.0.1:{port}", "--data-dir", data],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, **(env or {})})
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/readyz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def npy_b64(array):
    """`array` as the base64 of its `.npy` bytes (a job's `npy_base64` input)."""
    import base64
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return base64.b64encode(buf.getvalue()).decode()


def bench_prepared(rows, mlp):
    """The MLP submitted again and again: server overhead (total − run − queue) when its
    prepared executable is reused (the default) against prepared afresh for every job."""
    x = np.random.default_rng(3).standard_normal((1, 784)).astype(np.float32)
    # The model by path under a model root (the bench's output directory), as a deployment
    # names its models: the request carries only the input, so the overhead is the server's.
    body = {"program": {"path": os.path.basename(mlp)},
            "inputs": {"x": {"npy_base64": npy_b64(x)}}, "wait": True}
    body_path = os.path.join(OUT, "mlp-job.json")
    with open(body_path, "w") as f:
        json.dump(body, f)
    print("\nxpud, MLP batch 1 with wait   overhead µs p50 / p90   jobs/s")
    result = {}
    roots = {"XPU_MODEL_ROOTS": json.dumps([os.path.dirname(mlp)])}
    for label, env in (("reused", roots), ("prepared afresh", {**roots, "XPU_LIMITS__PREPARED_PLANS": "0"})):
        with xpud_server("xpud-prepared", env) as url:
            out = subprocess.run([BENCH_BIN, "daemon", url, "1", "3", body_path], check=True,
                                 capture_output=True, text=True)
        r = json.loads(out.stdout)
        o = r["overhead_us"]
        result[label] = o["p50"]
        print(f"{label:<22}       {o['p50']:8.0f} / {o['p90']:6.0f}   {r['jobs_per_s']:8.0f}")
        print("    steps, µs p50: " + ", ".join(f"{k} {v:.0f}" for k, v in r["steps_p50_us"].items()))
    ratio = result["prepared afresh"] / max(result["reused"], 1e-9)
    print(f"prepared afresh / reused overhead: {ratio:.2f}x")
    ok = result["reused"] <= 150
    print(f"model job overhead, reused: {result['reused']:.0f} µs p50 (bar ≤ 150){'' if ok else '  MISSED'}")
    rows.append(("xpud MLP overhead p50 (µs)", "reused vs prepared afresh", "cpu", result["reused"], result["prepared afresh"], ratio))
    return ok


def bench_isolation(rows, mlp):
    """The ort engine in-process against the same engine in a worker process, on the MLP,
    timed in one process (`xpu-bench isolation`) in two orders: call by call (the worker
    idle through each in-process call, so every request wakes it: sparse jobs) and in runs
    of 25 calls a side (a stream of calls: a job's nodes, a busy daemon). Bars, on the
    stream: ≤ 50 µs more per call at batch 1, ≤ 5% at batch 64; call by call is reported
    beside the machine's floor for one wake-up round trip. Also the worker's cold start and
    its restart after SIGKILL."""
    print("\nort in a worker process vs in-process (MLP)")
    ok = True
    pattern = (r"in-process ([0-9.]+) µs, worker ([0-9.]+) µs, overhead -?[0-9.]+ µs \([0-9.-]+%\); "
               r"in runs of 25: in-process ([0-9.]+) µs, worker ([0-9.]+) µs")
    for batch, reps in ((1, 2000), (64, 500)):
        best = None
        for _ in range(ROUNDS):
            out = subprocess.run([BENCH_BIN, "isolation", mlp, str(batch), str(reps), str(THREADS)], check=True,
                                 capture_output=True, text=True).stdout.strip()
            m = re.search(pattern, out)
            call_in, call_w, inproc, worker = (float(g) for g in m.groups())
            if best is None or worker - inproc < best[1] - best[0]:
                best = (inproc, worker, out, call_in, call_w)
        inproc, worker, line, call_in, call_w = best
        over_us, over_pct = worker - inproc, (worker / inproc - 1) * 100
        bar_ok = over_us <= 50 if batch == 1 else over_pct <= 5
        ok = ok and bar_ok
        print(f"  {line}")
        print(f"    in runs (bar {'≤ 50 µs' if batch == 1 else '≤ 5%'}): {over_us:.1f} µs ({over_pct:.1f}%) "
              f"{'ok' if bar_ok else 'MISSED'}; call by call (reported): {call_w - call_in:.1f} µs "
              f"({(call_w / call_in - 1) * 100:.1f}%)")
        # The floor under call by call: one bare socket round trip around the same work on
        # each side.
        floor = subprocess.run([BENCH_BIN, "ipc-floor", f"{call_in:.0f}", "1000"], check=True,
                               capture_output=True, text=True).stdout.strip()
        print(f"    {floor}")
        rows.append(("ort worker overhead, in runs", f"MLP batch {batch}", "ort", worker, inproc, inproc / worker))
        rows.append(("ort worker overhead, call by call", f"MLP batch {batch}", "ort", call_w, call_in, call_in / call_w))
    return ok


def bench_pool(rows, mlp):
    """Concurrent jobs on one isolated engine (ort), with one worker process per engine
    against the default pool (`isolation.processes_per_engine`): the MLP at batch 1 alone at
    concurrency 2 (jobs/s), and the same short job's latency while another client keeps a
    long ort job (a chain of 256² matmuls) running — the head-of-line wait a single worker
    imposes. Reported, no bar."""
    import threading
    import urllib.request

    x = np.random.default_rng(3).standard_normal((1, 784)).astype(np.float32)
    short = {"program": {"path": os.path.basename(mlp)}, "policy": "ort-cpu", "wait": True,
             "inputs": {"x": {"npy_base64": npy_b64(x)}}}
    short_path = os.path.join(OUT, "pool-short.json")
    with open(short_path, "w") as f:
        json.dump(short, f)
    src = ["let x = input(\"x\")", "let y0 = x"] + [f"let y{i} = tanh(y{i - 1} @ x)" for i in range(1, 201)]
    long_job = json.dumps({"program": {"name": "chain.ml", "source": "\n".join(src + ["print y200", ""])},
                           "policy": "ort-cpu", "wait": True,
                           "inputs": {"x": {"npy_base64": npy_b64((np.random.default_rng(1).standard_normal((256, 256)) / 32).astype(np.float32))}}}).encode()
    print("\nort jobs side by side: one worker per engine vs the pool      1 worker   pool   ratio")
    # Each side keeps its best figure over ROUNDS alternating rounds (this VM's speed drifts).
    result = {"one": (0.0, float("inf")), "pool": (0.0, float("inf"))}
    for _ in range(ROUNDS):
        for label, procs in (("one", "1"), ("pool", "0")):
            env = {"XPU_MODEL_ROOTS": json.dumps([os.path.dirname(mlp)]), "XPU_ISOLATION__PROCESSES_PER_ENGINE": procs}
            with xpud_server("xpud-pool", env) as url:
                out = subprocess.run([BENCH_BIN, "daemon", url, "2", "3", short_path], check=True,
                                     capture_output=True, text=True)
                jobs_per_s = json.loads(out.stdout)["jobs_per_s"]
                stop = threading.Event()

                def keep_long_running():
                    while not stop.is_set():
                        req = urllib.request.Request(f"{url}/v1/jobs", data=long_job,
                                                     headers={"content-type": "application/json"})
                        urllib.request.urlopen(req, timeout=120).read()

                busy = threading.Thread(target=keep_long_running)
                busy.start()
                time.sleep(0.5)
                try:
                    out = subprocess.run([BENCH_BIN, "daemon", url, "1", "3", short_path], check=True,
                                         capture_output=True, text=True)
                finally:
                    stop.set()
                    busy.join()
                latency = json.loads(out.stdout)["client_latency_us"]["p50"]
                best_jobs, best_latency = result[label]
                result[label] = (max(best_jobs, jobs_per_s), min(best_latency, latency))
    (j1, l1), (jp, lp) = result["one"], result["pool"]
    print(f"  MLP batch 1 at concurrency 2, jobs/s                          {j1:8.0f} {jp:6.0f}   {jp / j1:5.2f}")
    print(f"  MLP batch 1 beside a long ort job, latency p50 µs             {l1:8.0f} {lp:6.0f}   {l1 / max(lp, 1e-9):5.2f}")
    rows.append(("ort worker pool", "MLP b1 conc 2 jobs/s", "ort", jp, j1, jp / j1))
    rows.append(("ort worker pool", "MLP b1 beside a long job, p50 µs", "ort", lp, l1, l1 / max(lp, 1e-9)))


def bench_daemon(rows):
    """xpud under a closed loop of waited submits; the server's own timings."""
    import urllib.request

    ok = True
    with xpud_server("xpud") as url:
        print("\nxpud, tiny job with wait     jobs/s   overhead µs p50 / p90 / p99   queue µs p50")
        total = 0
        load_seconds = 0.0
        for conc in (1, 4, 16):
            out = subprocess.run([BENCH_BIN, "daemon", url, str(conc), "5"], check=True,
                                 capture_output=True, text=True)
            r = json.loads(out.stdout)
            total += r["jobs"]
            load_seconds += r["seconds"]
            o = r["overhead_us"]
            print(f"concurrency {conc:<3}               {r['jobs_per_s']:8.0f}   {o['p50']:8.0f} / {o['p90']:6.0f} / {o['p99']:6.0f}   {r['queue_us']['p50']:8.0f}")
            steps = ", ".join(f"{k} {v:.0f}" for k, v in r["steps_p50_us"].items())
            print(f"    steps, µs p50: {steps}")
            rows.append(("xpud overhead p50 (µs)", f"concurrency {conc}", "cpu", o["p50"], 100.0, 100.0 / max(o["p50"], 1e-9)))
            rows.append(("xpud jobs/s", f"concurrency {conc}", "cpu", r["jobs_per_s"], 2000.0, r["jobs_per_s"] / 2000.0))
            if conc == 1:
                ok = ok and o["p50"] <= 100 and o["p99"] <= 500
            ok = ok and (conc == 1 or r["jobs_per_s"] >= 2000)
        # Every acknowledged run must reach the database and the search index: wait for
        # both to catch up and count that time against the throughput.
        def gauge(text, name):
            for line in text.splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
            return float("nan")
        caught_up = time.time()
        while True:
            metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
            behind = gauge(metrics, "xpu_store_pending_runs") + gauge(metrics, "xpu_search_index_lag_runs")
            if behind == 0 or time.time() - caught_up > 120:
                break
            time.sleep(0.2)
        catch_up = time.time() - caught_up
        stored_rate = total / (load_seconds + catch_up)
        print(f"runs acknowledged: {total} in {load_seconds:.1f} s of load; database and index "
              f"caught up {catch_up:.1f} s after the load ({'all' if behind == 0 else 'NOT all'} "
              f"stored and indexed): {stored_rate:.0f} jobs/s stored and indexed; from /metrics:")
        ok = ok and behind == 0 and stored_rate >= 2000
        rows.append(("xpud jobs/s stored+indexed", "concurrency 1/4/16 run", "cpu", stored_rate, 2000.0, stored_rate / 2000.0))
        for line in metrics.splitlines():
            if line.startswith(("xpu_jobs_total", "xpu_store_", "xpu_search_index_lag")) and "bucket" not in line:
                print("  " + line)
    return ok


if __name__ == "__main__":
    main()

