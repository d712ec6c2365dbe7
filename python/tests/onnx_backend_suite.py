"""ONNX's own backend test suite (onnx.backend.test.BackendTest) through xpu.onnx_backend,
per route (the default policy, ort first, llvm first): every `_cpu` case that needs no
download. The cases a route does not pass yet are listed in
python/tests/onnx_backend_expected/ROUTE.txt and excluded; every other case must pass, so a
regression fails CI. `XPU_BLESS=1 python python/tests/onnx_backend_suite.py` rewrites the
lists (and prints the counts docs/conformance.md reports)."""

from __future__ import annotations

import os
import re
import sys
import unittest
import warnings
from pathlib import Path

import onnx.backend.test

import xpu.onnx_backend as backend

EXPECTED = Path(__file__).with_name("onnx_backend_expected")
# Engine each route prefers (None: the built-in policy's order).
ROUTES: dict[str, str | None] = {"default": None, "ort": "ort", "llvm": "llvm"}
# Cases whose models are downloaded (onnx.backend.test's real-model class).
DOWNLOADED = "OnnxBackendRealModelTest"


def route_backend(route: str) -> type[backend.XpuBackend]:
    engine = ROUTES[route]

    class Route(backend.XpuBackend):
        @classmethod
        def route(cls):  # type: ignore[no-untyped-def]
            return engine, None

    Route.__name__ = f"XpuBackend_{route}"
    return Route


def suite(route: str, excluded: list[str]) -> dict[str, type]:
    """The route's test classes, `_cpu` cases only, downloads and `excluded` left out."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bt = onnx.backend.test.BackendTest(route_backend(route), f"{__name__}_{route}")
    bt.include(r".*_cpu$")
    for name in excluded:
        bt.exclude("^" + re.escape(name) + "$")
    return {k: v for k, v in bt.test_cases.items() if not k.endswith(DOWNLOADED)}


def expected_failures(route: str) -> list[str]:
    path = EXPECTED / f"{route}.txt"
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def bless() -> None:
    EXPECTED.mkdir(exist_ok=True)
    for route in ROUTES:
        failed: list[str] = []
        total = 0
        for cls in suite(route, []).values():
            for name in sorted(n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu")):
                total += 1
                result = unittest.TestResult()
                cls(name).run(result)
                if not result.wasSuccessful() or result.skipped:
                    failed.append(name)
        lines = [
            f"# {route}: {total - len(failed)} of {total} ONNX backend `_cpu` cases pass through xpu.onnx_backend;",
            "# the cases below do not yet (excluded from make test). Re-bless: XPU_BLESS=1 python python/tests/onnx_backend_suite.py",
        ]
        (EXPECTED / f"{route}.txt").write_text("\n".join(lines + sorted(failed)) + "\n")
        print(f"{route}: {total - len(failed)} / {total} pass")


if __name__ == "__main__" and os.environ.get("XPU_BLESS"):
    bless()
