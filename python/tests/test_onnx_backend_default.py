"""ONNX's backend suite through xpu.onnx_backend, route `default` (onnx_backend_suite.py)."""

from onnx_backend_suite import expected_failures, suite

globals().update(suite("default", expected_failures("default")))
