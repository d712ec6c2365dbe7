"""ONNX's backend suite through xpu.onnx_backend, route `ort` (onnx_backend_suite.py)."""

from onnx_backend_suite import expected_failures, suite

globals().update(suite("ort", expected_failures("ort")))
