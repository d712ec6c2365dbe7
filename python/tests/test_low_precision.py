"""The low-precision element types, bit for bit against ml_dtypes (and ONNX's reference for
saturation and f8e8m0): every code decoded, every f32 edge case and a sweep of values
encoded, with and without saturation, through programs the cpu engine runs."""

from __future__ import annotations

import base64
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx.numpy_helper
import pytest

import xpu

FLOATS = {
    "f8e4m3fn": ml_dtypes.float8_e4m3fn,
    "f8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "f8e5m2": ml_dtypes.float8_e5m2,
    "f8e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "f4e2m1": ml_dtypes.float4_e2m1fn,
}
INTS = {"i4": ml_dtypes.int4, "u4": ml_dtypes.uint4, "i2": ml_dtypes.int2, "u2": ml_dtypes.uint2}
CODES = {"f4e2m1": 16, "i4": 16, "u4": 16, "i2": 4, "u2": 4}


def run(program: str, tmp_path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    path = tmp_path / "p.sgr"
    path.write_text(program)
    (out,) = xpu.InferenceSession(path, engine="cpu").run(None, feed)
    result: np.ndarray = out
    return result


def edge_values() -> np.ndarray:
    """NaN of both signs, ±inf, ±0, the smallest subnormals of f32, values around every
    code's neighbours and far out of range, and a log-spaced sweep."""
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-38, 6.0, 6.5, 7.0,
                        240.0, 248.0, 448.0, 464.0, 465.0, 480.0, 57344.0, 61440.0, 65536.0, 1e30, -1e30],
                       np.float32)
    sweep = np.geomspace(1e-9, 1e6, 4000).astype(np.float32)
    mid = np.concatenate([sweep, -sweep, sweep * 1.0000001, np.linspace(-20, 20, 801, dtype=np.float32)])
    return np.concatenate([special, mid]).astype(np.float32)


@pytest.mark.parametrize("dtype", sorted(FLOATS) + sorted(INTS))
def test_every_code_decodes_as_ml_dtypes_does(dtype: str, tmp_path: Path) -> None:
    ml = {**FLOATS, **INTS}[dtype]
    codes = np.arange(CODES.get(dtype, 256), dtype=np.uint8)
    data = base64.b64encode(codes.tobytes()).decode()
    n = len(codes)
    program = (f'graph "decode" {{\n  %0: {dtype}[{n}] = constant {{value = tensor<{dtype}[{n}]> b64"{data}"}}\n'
               f'  %1: f32[{n}] = cast(%0) {{to = dtype<f32>}}\n  return "y" = %1\n}}\n')
    got = run(program, tmp_path, {})
    want = codes.view(ml).astype(np.float32)
    # Bit for bit: a NaN's sign included.
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("dtype", sorted(FLOATS))
def test_floats_encode_bit_for_bit(dtype: str, saturate: int, tmp_path: Path) -> None:
    x = edge_values()
    n = len(x)
    program = (f'graph "encode" {{\n  %0: f32[{n}] = input "x"\n'
               f'  %1: {dtype}[{n}] = cast(%0) {{saturate = {saturate}, to = dtype<{dtype}>}}\n'
               f'  return "y" = %1\n}}\n')
    got = run(program, tmp_path, {"x": x})
    ml = FLOATS[dtype]
    assert got.dtype == ml, got.dtype
    if saturate and dtype != "f4e2m1":
        # ONNX's reference: clip to the finite range (NaN stays NaN), then round to nearest even.
        want = onnx.numpy_helper.saturate_cast(x, np.dtype(ml))
    else:
        want = x.astype(ml)
    mismatch = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
    assert mismatch.size == 0, [(float(x[i]), int(got.view(np.uint8)[i]), int(want.view(np.uint8)[i]))
                                for i in mismatch[:10]]


@pytest.mark.parametrize("dtype", sorted(INTS))
def test_floats_become_sub_byte_integers_truncated_and_wrapped(dtype: str, tmp_path: Path) -> None:
    x = np.concatenate([edge_values(), np.arange(-40, 40, 0.25, dtype=np.float32)])
    x = x[np.isfinite(x) & (np.abs(x) < 1e9)]
    n = len(x)
    program = (f'graph "ints" {{\n  %0: f32[{n}] = input "x"\n  %1: {dtype}[{n}] = cast(%0) {{to = dtype<{dtype}>}}\n'
               f'  return "y" = %1\n}}\n')
    got = run(program, tmp_path, {"x": x})
    np.testing.assert_array_equal(got.astype(np.int32), x.astype(INTS[dtype]).astype(np.int32))


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_e8m0_rounds_by_its_mode(mode: str, tmp_path: Path) -> None:
    x = edge_values()
    n = len(x)
    program = (f'graph "e8m0" {{\n  %0: f32[{n}] = input "x"\n'
               f'  %1: f8e8m0[{n}] = cast(%0) {{round_mode = "{mode}", to = dtype<f8e8m0>}}\n  return "y" = %1\n}}\n')
    got = run(program, tmp_path, {"x": x})
    want = onnx.numpy_helper.to_float8e8m0(x, True, mode)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_low_precision_values_are_refused_by_arithmetic(tmp_path: Path) -> None:
    program = ('graph "bad" {\n  %0: f32[2] = input "x"\n  %1: f8e4m3fn[2] = cast(%0) {to = dtype<f8e4m3fn>}\n'
               '  %2: f8e4m3fn[2] = add(%1, %1)\n  return "y" = %2\n}\n')
    with pytest.raises(xpu.ProgramError, match="takes no f8e4m3fn input: low-precision values are only cast"):
        run(program, tmp_path, {"x": np.ones(2, np.float32)})
