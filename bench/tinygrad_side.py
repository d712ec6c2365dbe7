"""The tinygrad frontend's figures, run in a fresh interpreter by bench/run.py's
`bench_tinygrad` with the release build of the native module on its path and tinygrad's CPU
backend selected (DEV=CPU, CC=clang-19, NUM_CPU_THREADS = the bench's thread count).

Each model is written once in tinygrad and run two ways on the same numpy input: by
tinygrad itself (the forward pass under `TinyJit`, tinygrad's own fast path: kernels
compiled by clang once, replayed), and by xpu (`xpu.frontends.tinygrad.compile` under the
llvm-first example policy, in-process, warm). Both take a numpy array in and give one out.
The two sides alternate for ROUNDS rounds; each keeps its median per round, and the figure
is the median over rounds. tinygrad's kernels alone (its input already on the device,
the output left there, no numpy on either end) are timed too: a stricter reference that
xpu, which takes and returns numpy, is also compared with. Also the import time of the decoder-shaped model (its UOp graph
walked into SGR-ML, no run). Prints one JSON object."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from python_side import per_call_us  # bench/, this script's directory

ROOT = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(11)


def weight(*shape: int) -> Any:
    from tinygrad.tensor import Tensor

    return Tensor((RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)).realize()


def mlp_model() -> tuple[Callable[[Any], Any], np.ndarray]:
    """784-512-512-10 at batch 64, the shape of bench/run.py's ONNX MLP."""
    w1, b1, w2, b2, w3, b3 = weight(784, 512), weight(512), weight(512, 512), weight(512), weight(512, 10), weight(10)

    def mlp(x: Any) -> Any:
        return (((x @ w1 + b1).relu() @ w2 + b2).relu() @ w3 + b3).log_softmax()

    return mlp, RNG.standard_normal((64, 784)).astype(np.float32)


def block_model() -> tuple[Callable[[Any], Any], np.ndarray]:
    """A pre-norm transformer block: d 256, 4 heads, 128 tokens, causal attention, GELU MLP."""
    d, heads, t = 256, 4, 128
    wq, wk, wv, wo = (weight(d, d) for _ in range(4))
    w1, w2 = weight(d, 4 * d), weight(4 * d, d)
    g1, b1, g2, b2 = weight(d), weight(d), weight(d), weight(d)

    def block(x: Any) -> Any:
        h = x.layernorm() * g1 + b1
        q, k, v = ((h @ w).reshape(1, t, heads, d // heads).permute(0, 2, 1, 3) for w in (wq, wk, wv))
        a = q.scaled_dot_product_attention(k, v, is_causal=True).permute(0, 2, 1, 3).reshape(1, t, d)
        x2 = x + a @ wo
        return x2 + ((x2.layernorm() * g2 + b2) @ w1).gelu() @ w2

    return block, RNG.standard_normal((1, t, d)).astype(np.float32)


def decoder_model() -> tuple[Callable[[Any], Any], np.ndarray]:
    """TinyLlama's layout at a small size: 4 layers of d 256, 8 heads, RMSNorm, RoPE, SwiGLU."""
    from tinygrad.tensor import Tensor

    vocab, d, heads, t, layers_n = 512, 256, 8, 64, 4
    hd = d // heads
    emb, final, head = weight(vocab, d), weight(d), weight(d, vocab)
    layers = [{k: weight(*s) for k, s in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                                           ("g1", (d,)), ("g2", (d,)), ("w1", (d, 3 * d)), ("w3", (d, 3 * d)),
                                           ("w2", (3 * d, d)))} for _ in range(layers_n)]
    angles = np.arange(t)[:, None] * (10000 ** (-np.arange(0, hd, 2) / hd))[None, :]
    cos, sin = Tensor(np.cos(angles).astype(np.float32)).realize(), Tensor(np.sin(angles).astype(np.float32)).realize()

    def rms(x: Any, g: Any) -> Any:
        return x * (x.square().mean(-1, keepdim=True) + 1e-5).rsqrt() * g

    def rope(x: Any) -> Any:
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return (x1 * cos - x2 * sin).cat(x1 * sin + x2 * cos, dim=-1)

    def decoder(ids: Any) -> Any:
        x = ids @ emb
        for layer in layers:
            h = rms(x, layer["g1"])
            q, k, v = ((h @ layer[w]).reshape(1, t, heads, hd).permute(0, 2, 1, 3) for w in ("wq", "wk", "wv"))
            a = rope(q).scaled_dot_product_attention(rope(k), v, is_causal=True)
            x = x + a.permute(0, 2, 1, 3).reshape(1, t, d) @ layer["wo"]
            h = rms(x, layer["g2"])
            x = x + ((h @ layer["w1"]).silu() * (h @ layer["w3"])) @ layer["w2"]
        return rms(x, final) @ head

    return decoder, np.eye(vocab, dtype=np.float32)[RNG.integers(0, vocab, t)][None]


def compare(model: Callable[[Any], Any], x: np.ndarray, threads: int, rounds: int, reps: int) -> dict[str, Any]:
    from tinygrad import Device
    from tinygrad.engine.jit import TinyJit
    from tinygrad.tensor import Tensor

    import xpu
    from xpu.frontends import tinygrad as tg

    jitted = TinyJit(lambda t: model(t).realize())

    def tinygrad_run() -> np.ndarray:
        out: np.ndarray = jitted(Tensor(x).realize()).numpy()
        return out

    # tinygrad's kernels alone: an input already on its device, the output left there.
    resident = Tensor(x).realize()

    def tinygrad_kernels() -> None:
        jitted(resident)
        Device["CPU"].synchronize()

    example = Tensor(x).realize()
    traced = model(example)
    started = time.perf_counter()
    imported = tg.import_graph(traced, inputs={"x": example})
    import_ms = (time.perf_counter() - started) * 1e3
    session = tg.compile(model, x, names=["x"], policy=ROOT / "policies" / "examples" / "llvm-host.toml",
                         exec_policy=xpu.ExecutionPolicy(threads=threads))

    def xpu_run() -> np.ndarray:
        out: np.ndarray = session.run(None, {"x": x})[0]
        return out

    # Same answer first (tinygrad's jit needs two calls to capture, a third to replay).
    for _ in range(3):
        want = tinygrad_run()
    got = xpu_run()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    xs, ts, ks = [], [], []
    for r in range(rounds):
        # Each side goes first every other round.
        sides = [(xs, xpu_run), (ts, tinygrad_run), (ks, tinygrad_kernels)]
        for samples, fn in (sides if r % 2 == 0 else sides[::-1]):
            samples.append(per_call_us(fn, reps))
    engines: dict[str, int] = {}
    for d in session.explain()["decisions"]:
        if d.get("chosen"):
            kernel = d["chosen"].get("kernel") or d["chosen"]["engine"]
            engines[kernel] = engines.get(kernel, 0) + 1
    x_us, t_us, k_us = statistics.median(xs), statistics.median(ts), statistics.median(ks)
    return {"xpu_us": x_us, "tinygrad_us": t_us, "ratio": t_us / x_us, "tinygrad_kernels_us": k_us,
            "kernels_ratio": k_us / x_us, "raised": imported.raised,
            "values": imported.values, "import_ms": import_ms, "kernels": engines}


def main(threads: int, rounds: int) -> None:
    from tinygrad.tensor import Tensor

    from xpu.frontends import tinygrad as tg

    result: dict[str, Any] = {}
    for name, build, reps in (("mlp", mlp_model, 50), ("block", block_model, 20)):
        model, x = build()
        result[name] = compare(model, x, threads, rounds, reps)
    decoder, ids = decoder_model()
    times = []
    for _ in range(3):
        t = Tensor(ids).realize()
        traced = decoder(t)
        started = time.perf_counter()
        imported = tg.import_graph(traced, inputs={"ids": t})
        times.append((time.perf_counter() - started) * 1e3)
    result["decoder_import"] = {"ms": statistics.median(times), "values": imported.values,
                                "raised": imported.raised}
    print(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
