"""The Python package's figures, run in a fresh interpreter by bench/run.py's
`bench_python` with the release build of the native module on its path: `import xpu` time,
`sess.run` through the ort engine against onnxruntime's own Python API (paired rounds), the
cpu engine through Python against onnxruntime at batch 1 and 64, and a 256 MiB input's
peak-RSS growth. Prints one JSON object."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import numpy as np


def import_ms(reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        out = subprocess.run(
            [sys.executable, "-c", "import time; t = time.perf_counter(); import xpu; print(time.perf_counter() - t)"],
            capture_output=True, text=True, check=True,
        )
        times.append(float(out.stdout) * 1e3)
    return statistics.median(times)


def per_call_us(fn, reps: int) -> float:
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def paired(a, b, rounds: int, reps: int) -> tuple[float, float]:
    """Medians over rounds of each side's median call, the sides alternating each round."""
    xs, ys = [], []
    for _ in range(rounds):
        xs.append(per_call_us(a, reps))
        ys.append(per_call_us(b, reps))
    return statistics.median(xs), statistics.median(ys)


def main(mlp: str, threads: int) -> None:
    import onnxruntime as ort

    import xpu

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    peer = ort.InferenceSession(mlp, so, providers=["CPUExecutionProvider"])
    result: dict[str, float] = {"import_ms": import_ms()}
    run_threads = xpu.ExecutionPolicy(threads=threads)
    via_ort = xpu.InferenceSession(mlp, engine="ort", exec_policy=run_threads)
    # The same with ORT's threads spinning between runs, as onnxruntime's Python default.
    via_ort_latency = xpu.InferenceSession(
        mlp, engine="ort", exec_policy=xpu.ExecutionPolicy(threads=threads, performance="latency")
    )
    via_cpu = xpu.InferenceSession(mlp, engine="cpu", exec_policy=run_threads)
    for batch, reps in ((1, 300), (64, 100)):
        x = np.random.default_rng(2).standard_normal((batch, 784)).astype(np.float32)
        feed = {"x": x}
        for _ in range(50):
            via_ort.run(feed), via_cpu.run(feed), peer.run(None, feed)
        xo, po = paired(lambda: via_ort.run(feed), lambda: peer.run(None, feed), 7, reps)
        xc, pc = paired(lambda: via_cpu.run(feed), lambda: peer.run(None, feed), 7, reps)
        result[f"ort_engine_b{batch}_us"] = xo
        result[f"onnxruntime_b{batch}_us"] = po
        result[f"ort_extra_b{batch}_us"] = xo - po
        xl, pl = paired(lambda: via_ort_latency.run(feed), lambda: peer.run(None, feed), 7, reps)
        result[f"ort_latency_b{batch}_us"] = xl
        result[f"ort_latency_extra_b{batch}_us"] = xl - pl
        result[f"cpu_engine_b{batch}_us"] = xc
        result[f"cpu_vs_onnxruntime_b{batch}"] = pc / xc
    print(json.dumps(result))


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def rss_growth(path: str, writable: bool) -> None:
    """A 256 MiB float32 input through `y = relu(x)`: the run's peak RSS growth (VmHWM
    reset just before it) less the output's own size, as a share of the input's. Read-only
    inputs are read in place; writable ones are copied unless the session borrows them."""
    import xpu

    # Filled in place: no float64 temporary raises the peak before the run.
    x = np.empty((64, 1024, 1024), np.float32)
    x.fill(-0.5)
    x[::2] = 0.75
    x.setflags(write=writable)
    sess = xpu.InferenceSession(path, engine="cpu")
    sess.run({"x": x[:1]})
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_bytes("VmRSS")
    y = sess.run({"x": x})["y"]
    peak = _status_bytes("VmHWM")
    print(json.dumps({"input_bytes": x.nbytes, "output_bytes": y.nbytes, "peak_growth_bytes": peak - before,
                      "hidden_share": (peak - before - y.nbytes) / x.nbytes}))


if __name__ == "__main__":
    if sys.argv[1] == "rss":
        rss_growth(sys.argv[2], writable=sys.argv[3] == "writable")
    else:
        main(sys.argv[1], int(sys.argv[2]))
