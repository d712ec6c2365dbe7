"""The engines as the package loads them: the llvm engine runs in the worker program the
package carries, and a machine without the system's LLVM (or without the program) gets the
engine reported unavailable with the loader's words while everything else still runs. Each
case is a fresh interpreter: a process configures its engines once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import xpu

_PROBE = r"""
import json, sys
import numpy as np
import xpu
inventory = json.loads(xpu._engines.native().inventory())
llvm = next(e for e in inventory["engines"] if e["engine"] == "llvm")
model = sys.argv[1]
x = np.ones((2, 16), np.float32)
s = xpu.InferenceSession(model)
s.run({"x": x})
ran_on = sorted({d["chosen"]["engine"] for d in s.explain()["decisions"] if d.get("chosen")})
try:
    xpu.InferenceSession(model, engine="llvm")
    pinned = None
except xpu.EngineUnavailable as e:
    pinned = {"engine": e.engine, "reason": e.reason}
print(json.dumps({"llvm": llvm["availability"], "ran_on": ran_on, "pinned": pinned}))
"""


def _probe(mlp: Path, worker: str) -> dict[str, object]:
    env = dict(os.environ, XPU_WORKER_PROGRAM=worker)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(mlp)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _carried_worker() -> Path:
    worker = xpu._engines.worker_program()
    assert worker is not None and worker.exists(), "the package carries xpu-worker beside its module"
    return worker.resolve()


def test_llvm_runs_in_the_carried_worker(mlp: Path) -> None:
    sess = xpu.InferenceSession(mlp, engine="llvm", fallback=True)
    sess.run({"x": __import__("numpy").ones((2, 16), "float32")})
    inventory = json.loads(xpu._engines.native().inventory())
    llvm = next(e for e in inventory["engines"] if e["engine"] == "llvm")
    assert llvm["availability"] == {"status": "available"}, llvm
    chosen = {d["chosen"]["engine"] for d in sess.explain()["decisions"] if d.get("chosen")}
    assert "llvm" in chosen, chosen


def test_without_the_systems_llvm_the_engine_is_unavailable_with_the_loaders_words(
    mlp: Path, tmp_path: Path
) -> None:
    # The carried worker with its LLVM dependency renamed to one no machine has: what a
    # machine without libllvm19 sees, by the real loader.
    data = _carried_worker().read_bytes()
    needed = b"libLLVM.so.19.1\0"
    assert needed in data, "the worker program links LLVM 19"
    patched = tmp_path / "xpu-worker"
    patched.write_bytes(data.replace(needed, b"libLLVM.so.00.0\0"))
    patched.chmod(0o755)
    result = _probe(mlp, str(patched))
    llvm = result["llvm"]
    assert isinstance(llvm, dict) and llvm["status"] == "unavailable", llvm
    assert "libLLVM.so.00.0" in llvm["reason"] and "cannot open shared object file" in llvm["reason"], llvm
    assert result["ran_on"] == ["cpu"], result
    pinned = result["pinned"]
    assert isinstance(pinned, dict) and pinned["engine"] == "llvm", pinned
    assert "libLLVM.so.00.0" in pinned["reason"], pinned


def test_without_the_worker_program_the_engine_is_unavailable_naming_it(mlp: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "xpu-worker"
    result = _probe(mlp, str(missing))
    llvm = result["llvm"]
    assert isinstance(llvm, dict) and llvm["status"] == "unavailable", llvm
    assert str(missing) in llvm["reason"] and "No such file" in llvm["reason"], llvm
    assert result["ran_on"] == ["cpu"], result


@pytest.mark.parametrize("engine", ["cpu", "table"])
def test_in_process_engines_are_available(engine: str) -> None:
    inventory = json.loads(xpu._engines.native().inventory())
    found = next(e for e in inventory["engines"] if e["engine"] == engine)
    assert found["availability"] == {"status": "available"}, found


TENSOR_TYPES = {"f32", "f64", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool"}


def test_the_ort_cpu_kernel_claims_exactly_the_types_the_installed_onnxruntime_runs() -> None:
    # tools/ort_cpu_gaps.py builds a one-node model per op and type and asks ORT for a
    # session; the engine's table (engines/ort/src/cpu_gaps.rs) must say the same.
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "ort_cpu_gaps", Path(__file__).resolve().parents[2] / "tools" / "ort_cpu_gaps.py")
    assert spec is not None and spec.loader is not None
    ort_cpu_gaps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ort_cpu_gaps)
    probed = ort_cpu_gaps.gaps()
    engine = next(e for e in xpu.inventory()["engines"] if e["engine"] == "ort")
    kernel = next(k for k in engine["kernels"] if k["name"] == "ort.cpu")
    claimed = {op: set(entry["dtypes"]) & TENSOR_TYPES for entry in kernel.get("op_dtypes", []) for op in entry["ops"]}
    assert "bool" not in claimed["where"] and "f32" in claimed["where"], claimed["where"]
    for op in ort_cpu_gaps.OPS:
        runs = TENSOR_TYPES - set(probed.get(op, []))
        assert claimed.get(op, TENSOR_TYPES) == runs, (op, sorted(claimed.get(op, TENSOR_TYPES) ^ runs))
