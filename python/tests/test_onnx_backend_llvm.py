"""ONNX's backend suite through xpu.onnx_backend, route `llvm` (onnx_backend_suite.py)."""

from onnx_backend_suite import expected_failures, suite

globals().update(suite("llvm", expected_failures("llvm")))
