"""Finding the engines' runtime libraries the way the daemon does, from wheels: ONNX Runtime
from the ``onnxruntime`` wheel (extra ``xpu[ort]``), OpenVINO from ``openvino``
(``xpu[openvino]``), the cpu engine's OpenBLAS from ``scipy-openblas32`` (a dependency).
Only paths are looked up (no package is imported), once, before the first session; each
engine's environment variable (``XPU_ORT_LIBRARY``, ``XPU_OPENVINO_DIR``,
``XPU_BLAS_LIBRARY``) still wins, and an engine whose library is missing is reported
unavailable with its reason."""

from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path

from types import ModuleType

_native: ModuleType | None = None


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _first(pattern: str, exclude: str = "") -> Path | None:
    found = sorted(p for p in glob.glob(pattern) if not (exclude and exclude in os.path.basename(p)))
    return Path(found[0]) if found else None


def worker_program() -> Path | None:
    """The ``xpu-worker`` program the llvm engine runs in: ``$XPU_WORKER_PROGRAM``, else the
    one the package carries beside its module (``None``: neither)."""
    if os.environ.get("XPU_WORKER_PROGRAM"):
        return Path(os.environ["XPU_WORKER_PROGRAM"])
    beside = Path(__file__).resolve().parent / "xpu-worker"
    return beside if beside.exists() else None


def libraries() -> dict[str, Path | None]:
    """Where each engine's library is, as found now (``None``: not installed)."""
    ort = _package_dir("onnxruntime")
    openvino = _package_dir("openvino")
    blas = _package_dir("scipy_openblas32")
    return {
        "ort": _first(str(ort / "capi" / "libonnxruntime.so.*"), "providers") if ort else None,
        "openvino_dir": _first(str(openvino / "libs" / "libopenvino_c.so*")) if openvino else None,
        "blas": _first(str(blas / "lib" / "libscipy_openblas*.so")) if blas else None,
    }


def native() -> ModuleType:
    """The native module, loaded at first use (it links DuckDB: ``import xpu`` alone does
    not load it), with the libraries found handed to it before its engines load."""
    global _native
    if _native is None:
        module = importlib.import_module("xpu._xpu")
        module.configure(**libraries(), worker=worker_program())
        _native = module
    return _native
