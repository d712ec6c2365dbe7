"""The tinygrad frontend: small tinygrad graphs imported as SGR-ML, run by xpu, equal to
tinygrad's own results (its CPU backend, compiled by clang)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

os.environ.setdefault("DEV", "CPU")
os.environ.setdefault("CC", "clang-19")

# `make setup` installs the pinned tinygrad (requirements.txt) and clang-19 (its CPU backend).
from tinygrad.dtype import dtypes  # noqa: E402
from tinygrad.tensor import Tensor  # noqa: E402

import xpu  # noqa: E402
from xpu.frontends import tinygrad as tg  # noqa: E402

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3)).astype(np.float32)
# Fed to the imported programs: not the data the graph was built from, so a value read as a
# constant instead of from its input shows.
X2 = RNG.standard_normal((2, 3)).astype(np.float32)
W = RNG.standard_normal((3, 4)).astype(np.float32)


def run(sgr: str, tmp_path: Path, feed: dict[str, np.ndarray]) -> list[Any]:
    """Runs a program in either form (``to_sgr`` writes JSON unless asked for text)."""
    path = tmp_path / ("g.json" if sgr.startswith("{") else "g.sgr")
    path.write_text(sgr)
    out: list[Any] = xpu.InferenceSession(path).run(None, feed)
    return out


CASES: dict[str, Callable[[Tensor], Tensor]] = {
    "add_const": lambda x: x + 1.5,
    "mul_sub_div": lambda x: (x * x - 2) / 3,
    "max_relu": lambda x: x.relu(),
    "exp2_log2": lambda x: x.abs().add(1).log2().exp2(),
    "sin_sqrt_reciprocal": lambda x: x.sin() + x.abs().sqrt() + (x.abs() + 1).reciprocal(),
    "neg": lambda x: -x,
    "where_cmplt": lambda x: (x < 0).where(x * 2, x),
    "cmpne": lambda x: (x != x.max()).cast(dtypes.float32),
    "sum_axis1": lambda x: x.sum(axis=1),
    "sum_keepdim0": lambda x: x.sum(axis=0, keepdim=True),
    "max_all": lambda x: x.max(),
    "prod_axis0": lambda x: x.prod(axis=0),
    "mean_std": lambda x: x.mean(axis=1) + x.std(axis=1),
    "permute": lambda x: x.permute(1, 0) * 2,
    "reshape_expand": lambda x: x.reshape(1, 2, 3).expand(4, 2, 3) + 0,
    "pad": lambda x: x.pad(((1, 0), (0, 2))) + 0,
    "shrink": lambda x: x.shrink(((0, 1), (1, 3))) + 0,
    "flip": lambda x: x.flip(1) + 0,
    "cast_int": lambda x: (x * 10).cast(dtypes.int32),
    "sqrt_of_ints": lambda x: (x.abs() * 10).cast(dtypes.int32).sqrt(),
    "bool_or_and": lambda x: (((x > 0) + (x < -1)) * (x > -2)).cast(dtypes.float32),
    "softmax": lambda x: x.softmax(axis=-1),
    "matmul_realised_weight": lambda x: x @ Tensor(W).realize(),
    "filled_buffers": lambda x: x + Tensor.ones(2, 3) * Tensor.full((2, 3), 2.5),
    "filled_int_buffer": lambda x: x * Tensor.full((2, 3), 3, dtype=dtypes.int32),
    "arange": lambda x: x + Tensor.arange(3),
    "list_constant_copied": lambda x: x * Tensor([1.0, -2.0, 3.0]),
    "mulacc_by_hand": lambda x: x * x + x,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_op_matches_tinygrad(case: str, tmp_path: Path) -> None:
    x = Tensor(X).realize()
    sgr = tg.to_sgr(CASES[case](x), inputs={"x": x})
    want = CASES[case](Tensor(X2).realize()).numpy()
    (got,) = run(sgr, tmp_path, {"x": X2})
    assert got.shape == want.shape, sgr
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=sgr)


I = np.array([[-7, -6, -5, -4, -1, 0], [1, 3, 4, 5, 6, 7]], np.int32)
# Integer ops and rounding: negative operands tell floor from truncation.
INT_CASES: dict[str, Callable[[Tensor], Tensor]] = {
    "floordiv": lambda i: i // 3,
    "floordiv_negative_divisor": lambda i: i // -4,
    "floormod": lambda i: i % 3,
    "floormod_negative_divisor": lambda i: i % -4,
    "cdiv": lambda i: i.div(3, rounding_mode="trunc"),
    "bitwise": lambda i: ((i & 5) | 8) ^ 3,
    "shift_signed": lambda i: (i << 2) + (i >> 1),
    "wrapping_constant": lambda i: i.cast(dtypes.uint32) + (2**32 - 1) + Tensor.full((2, 6), -1, dtype=dtypes.uint8),
    "shift_unsigned": lambda i: (i.cast(dtypes.uint32) >> 1) + (i.cast(dtypes.uint32) << 3),
    "logic_of_bools": lambda i: (((i < 3) & (i > -5)) ^ (i == 0)).cast(dtypes.int32),
    "trunc_floor_ceil": lambda i: (i.cast(dtypes.float32) / 2.5).trunc() + (i.cast(dtypes.float32) / 3).floor()
    + (i.cast(dtypes.float32) / 3).ceil(),
    "float_floordiv_mod": lambda i: i.cast(dtypes.float32) // 2.5 + i.cast(dtypes.float32) % 2.5,
    "round": lambda i: (i.cast(dtypes.float32) / 2).round(),
    "copy_between_devices": lambda i: i.to("PYTHON").to("CPU") + 1,
    "bitcast": lambda i: (i.cast(dtypes.float32).bitcast(dtypes.int32) >> 23) + i.bitcast(dtypes.uint32).cast(dtypes.int32),
}


@pytest.mark.parametrize("case", sorted(INT_CASES))
def test_integer_ops_match_tinygrad(case: str, tmp_path: Path) -> None:
    i = Tensor(I).realize()
    sgr = tg.to_sgr(INT_CASES[case](i), inputs={"i": i})
    fresh = I[:, ::-1].copy() * 3
    want = INT_CASES[case](Tensor(fresh).realize()).numpy()
    (got,) = run(sgr, tmp_path, {"i": fresh})
    assert got.dtype == want.dtype, sgr
    np.testing.assert_array_equal(got, want, err_msg=sgr)


EDGES = np.array([[-(2**31), -(2**31) + 1, -7, -1, 0, 5, 2**31 - 2, 2**31 - 1]], np.int32)
EDGE_CASES: dict[str, Callable[[Tensor], Tensor]] = {
    "floordiv_at_the_ends": lambda i: (i // 3) + (i // -3),
    "floormod_at_the_ends": lambda i: (i % 3) + (i % -7),
    "shift_right_by_31": lambda i: i >> 31,
    "shift_left_by_31": lambda i: i << 31,
    "shift_right_by_30": lambda i: i >> 30,
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_integer_ops_at_the_ends_of_the_range(case: str, tmp_path: Path) -> None:
    i = Tensor(EDGES).realize()
    sgr = tg.to_sgr(EDGE_CASES[case](i), inputs={"i": i}, format="text")
    want = EDGE_CASES[case](Tensor(EDGES[:, ::-1].copy()).realize()).numpy()
    (got,) = run(sgr, tmp_path, {"i": EDGES[:, ::-1].copy()})
    np.testing.assert_array_equal(got, want, err_msg=sgr)


def test_shifts_by_amounts_out_of_range_and_huge_constants() -> None:
    i = Tensor(I).realize()
    for bad in (-1, 32, 40):
        with pytest.raises(tg.TinygradImportError, match=rf"SHR of i32 by {bad}: the amount must be 0 to 31"):
            tg.to_sgr(i >> bad, inputs={"i": i}, format="text")
    # Python integers beyond 64 bits wrap as C would hold them, not OverflowError.
    j = Tensor(I.astype(np.int64)).realize()
    text = tg.to_sgr(j + 2**70 + 3, inputs={"j": j}, format="text")
    assert "i64[] = constant" in text, text


def test_filled_tensors_stay_one_number_and_bf16_constants_are_two_bytes(tmp_path: Path) -> None:
    x = Tensor(np.ones((300, 400), np.float32)).realize()
    imported = tg.import_graph(x + Tensor.full((300, 400), 2.5), inputs={"x": x})
    assert len(imported.sgr) < 2000, len(imported.sgr)
    (got,) = run(imported.sgr, tmp_path, {"x": np.zeros((300, 400), np.float32)})
    assert got.shape == (300, 400) and (got == 2.5).all()
    # A bf16 weight of 20 elements: written as bf16 (2 bytes each), read back equal.
    y = Tensor(X[:1, :1].repeat(20, axis=1)).realize()
    w = Tensor(np.linspace(-3, 3, 20, dtype=np.float32)).cast(dtypes.bfloat16).realize()
    out = y.cast(dtypes.bfloat16) * w
    imported = tg.import_graph(out, inputs={"y": y})
    (got,) = run(imported.sgr, tmp_path, {"y": y.numpy()})
    np.testing.assert_allclose(np.asarray(got, np.float32), out.float().numpy(), rtol=1e-2)


def test_a_two_layer_mlp_with_weights_as_constants(tmp_path: Path) -> None:
    w1 = Tensor(RNG.standard_normal((3, 8)).astype(np.float32)).realize()
    w2 = Tensor(RNG.standard_normal((8, 2)).astype(np.float32)).realize()
    x = Tensor(X).realize()
    y = ((x @ w1).relu() @ w2).softmax()
    y2 = ((Tensor(X2) @ w1).relu() @ w2).softmax()
    sgr = tg.to_sgr(y, inputs={"x": x}, name="mlp", format="text")
    assert sgr.startswith('graph "mlp"') and "input \"x\"" in sgr
    assert tg.import_graph(y, inputs={"x": x}).raised == {"matmul": 2, "softmax": 1}
    (got,) = run(sgr, tmp_path, {"x": X2})
    np.testing.assert_allclose(got, y2.numpy(), rtol=1e-5, atol=1e-6)


def test_unknown_ops_and_versions_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    x = Tensor(X).realize()
    with pytest.raises(tg.TinygradImportError, match=r"tinygrad op \w+ is not imported yet .*tinygrad 0\.14"):
        tg.to_sgr(x.bitcast(dtypes.uint8) + 1, inputs={"x": x})
    with pytest.raises(tg.TinygradImportError, match=r"BITCAST .*a bitcast of f32 to u8: only between types of one width"):
        tg.to_sgr(x.bitcast(dtypes.uint8) + 1, inputs={"x": x})
    with pytest.raises(tg.TinygradImportError,
                       match=r"THREEFRY \(made by Tensor\.\w+\) .*random numbers: draw them in tinygrad"):
        tg.to_sgr(x + Tensor.rand(2, 3), inputs={"x": x})
    with pytest.raises(tg.TinygradImportError, match=r"SHL of i32 by a computed amount"):
        i = Tensor(I).realize()
        tg.to_sgr(i << (i & 3), inputs={"i": i})
    with pytest.raises(tg.TinygradImportError, match="needs at least one output"):
        tg.to_sgr()
    monkeypatch.setattr(tg, "tinygrad_version", lambda: "0.9.2")
    with pytest.raises(tg.TinygradImportError, match=r"tinygrad 0\.9\.2 is not supported.*0\.14\.x"):
        tg.to_sgr(x + 1, inputs={"x": x})


@pytest.mark.parametrize("shapes", [((2, 3), (3, 4)), ((5, 2, 3), (5, 3, 4)), ((5, 2, 3), (3, 4)), ((1, 7), (7, 1))])
def test_products_are_raised_to_matmul(shapes: tuple[tuple[int, ...], tuple[int, ...]], tmp_path: Path) -> None:
    a_np = RNG.standard_normal(shapes[0]).astype(np.float32)
    b_np = RNG.standard_normal(shapes[1]).astype(np.float32)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    y = a @ b
    imported = tg.import_graph(y, inputs={"a": a, "b": b})
    assert imported.raised == {"matmul": 1}, imported.sgr
    assert "= mul(" not in imported.sgr and "reduce_sum" not in imported.sgr, imported.sgr
    a2, b2 = a_np + 1, b_np - 1
    (got,) = run(imported.sgr, tmp_path, {"a": a2, "b": b2})
    np.testing.assert_allclose(got, (Tensor(a2) @ Tensor(b2)).numpy(), rtol=1e-5, atol=1e-5)
    # Not a product: an elementwise multiply and a sum over another axis stay as they are.
    z = (a * 2).sum(axis=0)
    assert tg.import_graph(z, inputs={"a": a}).raised == {}


X3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def _std1(x: Tensor) -> Tensor:
    """x - mean over the last axis, over the sample standard deviation (1/(n-1)): not a
    layer norm, though it looks like one."""
    c = x - x.mean(-1, keepdim=True)
    out: Tensor = c * ((c * c).sum(-1, keepdim=True) * (1 / 3) + 1e-5).sqrt().reciprocal()
    return out


def _shifted_by_another_axis(x: Tensor) -> Tensor:
    e = (x - x.max(axis=0, keepdim=True)).exp()
    out: Tensor = e / e.sum(-1, keepdim=True)
    return out


# Each: the function, what it raises. The near misses (another axis, another scale) stay
# arithmetic, and every one is still equal to tinygrad's result.
PATTERNS: dict[str, tuple[Callable[[Tensor], Tensor], dict[str, int]]] = {
    "softmax_last": (lambda x: x.softmax(-1), {"softmax": 1}),
    "softmax_axis0": (lambda x: x.softmax(0), {"softmax": 1}),
    "softmax_middle": (lambda x: x.softmax(1), {"softmax": 1}),
    "log_softmax_last": (lambda x: x.log_softmax(-1), {"log_softmax": 1}),
    "log_softmax_axis0": (lambda x: x.log_softmax(0), {"log_softmax": 1}),
    "layernorm": (lambda x: x.layernorm(), {"layer_normalization": 1}),
    "layernorm_eps": (lambda x: x.layernorm(eps=1e-2) * 3 + 1, {"layer_normalization": 1}),
    "two_softmaxes_of_one_input": (lambda x: x.softmax(-1) + x.softmax(0), {"softmax": 2}),
    "softmax_then_product": (lambda x: x.softmax(-1) @ x.permute(0, 2, 1), {"softmax": 1, "matmul": 1}),
    "not_layernorm_on_axis0": (lambda x: x.layernorm(axis=0), {}),
    "not_layernorm_sample_std": (_std1, {}),
    "not_softmax_without_max": (lambda x: x.exp() / x.exp().sum(-1, keepdim=True), {}),
    "not_softmax_max_of_another_axis": (_shifted_by_another_axis, {}),
}


@pytest.mark.parametrize("case", sorted(PATTERNS))
def test_softmax_and_layer_norm_are_raised_exactly_when_they_are_one(case: str, tmp_path: Path) -> None:
    fn, raised = PATTERNS[case]
    x = Tensor(X3).realize()
    imported = tg.import_graph(fn(x), inputs={"x": x})
    assert imported.raised == raised, imported.sgr
    fresh = X3[::-1].copy() * 2
    (got,) = run(imported.sgr, tmp_path, {"x": fresh})
    np.testing.assert_allclose(got, fn(Tensor(fresh)).numpy(), rtol=1e-5, atol=1e-5, err_msg=imported.sgr)


# Each: the input's shape, the convolution, the convolutions raised. Stride, dilation,
# padding (even and not), groups, 1-d and 3-d, inputs and weights seen through movement ops.
CONVS: dict[str, tuple[tuple[int, ...], Callable[[Tensor, Tensor], Tensor], tuple[int, ...], int]] = {
    "plain": ((2, 3, 8, 8), lambda x, w: x.conv2d(w), (4, 3, 3, 3), 1),
    "one_channel": ((2, 1, 8, 8), lambda x, w: x.conv2d(w), (4, 1, 3, 3), 1),
    "padded_strided": ((2, 3, 9, 9), lambda x, w: x.conv2d(w, stride=2, padding=1), (4, 3, 3, 3), 1),
    "uneven_padding": ((1, 3, 7, 8), lambda x, w: x.conv2d(w, padding=(1, 2, 0, 1)), (4, 3, 3, 3), 1),
    "dilated_grouped": ((2, 4, 11, 11), lambda x, w: x.conv2d(w, groups=2, dilation=2, padding=2), (6, 2, 3, 3), 1),
    "depthwise": ((1, 4, 6, 6), lambda x, w: x.conv2d(w, groups=4, padding=1), (4, 1, 3, 3), 1),
    "pointwise_with_bias": ((2, 4, 5, 5), lambda x, w: x.conv2d(w, Tensor.ones(8).contiguous().realize()), (8, 4, 1, 1), 1),
    "rectangular_kernel": ((1, 2, 7, 9), lambda x, w: x.conv2d(w, stride=(2, 1), padding=(0, 1)), (3, 2, 2, 3), 1),
    "conv1d": ((2, 3, 12), lambda x, w: x.conv2d(w, stride=3, padding=2), (5, 3, 4), 1),
    "conv3d": ((1, 2, 5, 5, 5), lambda x, w: x.conv2d(w, padding=1), (3, 2, 3, 3, 3), 1),
    # Negative padding crops: proven as a convolution of the cropped input.
    "negative_padding": ((1, 2, 8, 8), lambda x, w: x.conv2d(w, padding=-1), (3, 2, 3, 3), 1),
    "permuted_input": ((1, 2, 6, 6), lambda x, w: x.permute(0, 1, 3, 2).conv2d(w), (3, 2, 3, 3), 1),
    "flipped_weight": ((1, 2, 6, 6), lambda x, w: x.conv2d(w.flip(3)), (3, 2, 3, 3), 1),
}


@pytest.mark.parametrize("case", sorted(CONVS))
def test_convolutions_are_raised_when_the_indices_prove_them(case: str, tmp_path: Path) -> None:
    shape, fn, wshape, raised = CONVS[case]
    w = _weight(*wshape)
    x = Tensor(RNG.standard_normal(shape).astype(np.float32)).realize()
    imported = tg.import_graph(fn(x, w), inputs={"x": x})
    assert imported.raised.get("conv", 0) == raised, imported.raised
    assert ("= conv(" in imported.sgr) == bool(raised)
    fresh = RNG.standard_normal(shape).astype(np.float32)
    (got,) = run(imported.sgr, tmp_path, {"x": fresh})
    np.testing.assert_allclose(got, fn(Tensor(fresh), w).numpy(), rtol=1e-4, atol=1e-4)


def test_symbolic_shapes_and_fp8_are_refused_and_deep_or_wide_graphs_import() -> None:
    from tinygrad import Variable

    x = Tensor(X).realize()
    n = Variable("n", 1, 2).bind(1)
    with pytest.raises(tg.TinygradImportError, match=r"symbolic dimension \(n\)"):
        tg.to_sgr(x.shrink(((0, n), None)) * 2, inputs={"x": x}, format="text")
    with pytest.raises(tg.TinygradImportError, match=r"tinygrad dtype float8_e4m3 has no SGR-ML equivalent"):
        tg.to_sgr(x.cast(dtypes.fp8e4m3) + 1, inputs={"x": x}, format="text")
    deep = x
    for _ in range(3000):
        deep = deep * 1.0001 + 0.5
    assert tg.import_graph(deep, inputs={"x": x}).values > 6000
    wide = x * 0.0
    for i in range(1, 1500):
        wide = wide + x * float(i)
    assert tg.import_graph(wide, inputs={"x": x}).values >= 4500


def test_a_convolution_too_large_to_prove_is_noted_and_a_symbolic_one_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from tinygrad import Variable

    from xpu.frontends import _tinygrad_conv

    w = _weight(3, 2, 3, 3)
    x = Tensor(RNG.standard_normal((1, 2, 8, 8)).astype(np.float32)).realize()
    monkeypatch.setattr(_tinygrad_conv, "LIMIT", 100)
    imported = tg.import_graph(x.conv2d(w), inputs={"x": x})
    assert "conv" not in imported.raised
    assert any("stays arithmetic: proving it needs an index array" in n for n in imported.notes), imported.notes
    n = Variable("n", 1, 8).bind(4)
    with pytest.raises(tg.TinygradImportError, match="symbolic dimension"):
        tg.to_sgr(x.expand(2, 2, 8, 8).shrink(((0, n), None, None, None)).conv2d(w), inputs={"x": x}, format="text")


def test_a_graph_tinygrad_cannot_shape_is_refused() -> None:
    x = Tensor(X).realize()
    bad = x.reshape(6) + 1
    # A hand-made UOp whose operands do not broadcast: tinygrad raises asking its shape.
    broken = Tensor(bad.uop.replace(src=(bad.uop.src[0], x.uop)))
    with pytest.raises(tg.TinygradImportError, match="tinygrad could not describe the graph at ADD: shape mismatch"):
        tg.to_sgr(broken, inputs={"x": x}, format="text")


ROOT = Path(__file__).resolve().parents[2]
# Each example policy and the engine it must place part of the model on: cpu only, llvm
# first (products on cpu.blas), ONNX Runtime first (the graph exported to ONNX; ort-cpu with
# fallback to cpu for what ORT's CPU provider does not run, such as `where` of bools).
POLICIES = (("cpu-only", "cpu"), ("llvm-host", "llvm"), ("ort-first", "ort"))


def example_policy(name: str) -> Any:
    if name == "ort-first":
        text = ('[policy]\nname = "ort-first"\nversion = 1\nextends = "base"\n\n'
                '[engines]\norder = ["ort", "cpu"]\nfallback = "allow"\n\n[kernels]\nmatmul = "ort.cpu"\n')
        return xpu.Policy.from_toml(text, name="ort-first", base_dir=ROOT / "policies" / "examples")
    return ROOT / "policies" / "examples" / f"{name}.toml"


def check_model(model: Callable[[Tensor], Tensor], example: np.ndarray, fresh: np.ndarray, name: str,
                raised: dict[str, int], tmp_path: Path, atol: float) -> None:
    """Imports ``model`` traced on ``example`` (input ``name``), checks the raised patterns,
    runs the program (its JSON form) on ``fresh`` data under each of :data:`POLICIES` and
    compares with tinygrad's result on it."""
    x = Tensor(example).realize()
    imported = tg.import_graph(model(x), inputs={name: x}, name=model.__name__)
    assert imported.raised == raised, imported
    path = tmp_path / "model.json"
    path.write_text(imported.json())
    want = model(Tensor(fresh)).numpy()
    for policy, engine in POLICIES:
        session = xpu.InferenceSession(path, policy=example_policy(policy))
        (got,) = session.run(None, {name: fresh})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, err_msg=policy)
        engines = {d["chosen"]["engine"] for d in session.explain()["decisions"] if d.get("chosen")}
        assert engine in engines, (policy, engines)


def _weight(*shape: int) -> Tensor:
    return Tensor((RNG.standard_normal(shape) * 0.2).astype(np.float32)).realize()


def test_a_lenet_style_cnn(tmp_path: Path) -> None:
    w1, w2, fc = _weight(4, 1, 3, 3), _weight(8, 4, 3, 3), _weight(32, 10)
    x_np = RNG.standard_normal((2, 1, 16, 16)).astype(np.float32)
    fresh = RNG.standard_normal((2, 1, 16, 16)).astype(np.float32)

    def lenet(x: Tensor) -> Tensor:
        h = x.conv2d(w1).relu().max_pool2d()
        h = h.conv2d(w2).relu().max_pool2d()
        out: Tensor = (h.flatten(1) @ fc).log_softmax()
        return out

    # Both convolutions, the dense layer and the log-softmax are raised; max pooling stays
    # tinygrad's windows and a max.
    check_model(lenet, x_np, fresh, "x", {"conv": 2, "matmul": 1, "log_softmax": 1}, tmp_path, atol=1e-4)


def test_a_transformer_block_with_causal_attention(tmp_path: Path) -> None:
    d, heads, t = 16, 2, 5
    wq, wk, wv, wo = (_weight(d, d) for _ in range(4))
    w1, w2, g, b = _weight(d, 4 * d), _weight(4 * d, d), _weight(d), _weight(d)
    x_np = RNG.standard_normal((1, t, d)).astype(np.float32)
    fresh = RNG.standard_normal((1, t, d)).astype(np.float32)

    def block(x: Tensor) -> Tensor:
        h = x.layernorm() * g + b
        q, k, v = ((h @ w).reshape(1, t, heads, d // heads).permute(0, 2, 1, 3) for w in (wq, wk, wv))
        a = q.scaled_dot_product_attention(k, v, is_causal=True).permute(0, 2, 1, 3).reshape(1, t, d)
        x2 = x + a @ wo
        out: Tensor = x2 + (x2.layernorm() @ w1).gelu() @ w2
        return out

    # Six dense products and the two of attention (scores, weighted values), the
    # attention's softmax and both layer norms.
    check_model(block, x_np, fresh, "x", {"matmul": 8, "softmax": 1, "layer_normalization": 2}, tmp_path, atol=1e-5)


def test_a_small_decoder_of_tinyllamas_shape(tmp_path: Path) -> None:
    # Two layers of RMSNorm, attention with RoPE (rotate-half, cos/sin tables as weights),
    # SwiGLU; token ids as a one-hot input, the embedding as a product.
    vocab, d, heads, t = 64, 32, 4, 6
    hd = d // heads
    emb, final, head = _weight(vocab, d), _weight(d), _weight(d, vocab)
    layers = [{k: _weight(*s) for k, s in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                                            ("g1", (d,)), ("g2", (d,)), ("w1", (d, 2 * d)), ("w3", (d, 2 * d)),
                                            ("w2", (2 * d, d)))} for _ in range(2)]
    angles = np.arange(t)[:, None] * (10000 ** (-np.arange(0, hd, 2) / hd))[None, :]
    cos, sin = Tensor(np.cos(angles).astype(np.float32)).realize(), Tensor(np.sin(angles).astype(np.float32)).realize()

    def rms(x: Tensor, g: Tensor) -> Tensor:
        out: Tensor = x * (x.square().mean(-1, keepdim=True) + 1e-5).rsqrt() * g
        return out

    def rope(x: Tensor) -> Tensor:
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        out: Tensor = (x1 * cos - x2 * sin).cat(x1 * sin + x2 * cos, dim=-1)
        return out

    onehot = np.eye(vocab, dtype=np.float32)[RNG.integers(0, vocab, t)][None]
    fresh = np.eye(vocab, dtype=np.float32)[RNG.integers(0, vocab, t)][None]

    def decoder(ids: Tensor) -> Tensor:
        x = ids @ emb
        for layer in layers:
            h = rms(x, layer["g1"])
            q, k, v = ((h @ layer[w]).reshape(1, t, heads, hd).permute(0, 2, 1, 3) for w in ("wq", "wk", "wv"))
            a = rope(q).scaled_dot_product_attention(rope(k), v, is_causal=True)
            x = x + a.permute(0, 2, 1, 3).reshape(1, t, d) @ layer["wo"]
            h = rms(x, layer["g2"])
            x = x + ((h @ layer["w1"]).silu() * (h @ layer["w3"])) @ layer["w2"]
        out: Tensor = rms(x, final) @ head
        return out

    # Per layer 7 dense products, 2 of attention and its softmax; the embedding and the
    # head. RMSNorm stays arithmetic (the llvm engine fuses it).
    check_model(decoder, onehot, fresh, "ids", {"matmul": 20, "softmax": 2}, tmp_path, atol=1e-5)


@pytest.mark.parametrize("policy,engine", [("cpu-only", "cpu"), ("llvm-host", "llvm"), ("ort-cpu", "ort")])
def test_compile_runs_under_each_engine_policy(policy: str, engine: str) -> None:
    w1, w2 = _weight(3, 8), _weight(8, 2)

    def mlp(x: Tensor) -> Tensor:
        out: Tensor = ((x @ w1).relu() @ w2).softmax()
        return out

    session = tg.compile(mlp, X, names=["x"], policy=ROOT / "policies" / "examples" / f"{policy}.toml")
    (got,) = session.run(None, {"x": X2})
    want = mlp(Tensor(X2)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    engines = {d["chosen"]["engine"] for d in session.explain()["decisions"] if d.get("chosen")}
    assert engine in engines, engines


def test_the_command_line_writes_a_program(tmp_path: Path) -> None:
    import subprocess
    import sys

    model = tmp_path / "model.py"
    model.write_text("def double(x):\n    return (x * 2).sum(axis=1)\n")
    out = tmp_path / "model.sgr"
    done = subprocess.run([sys.executable, "-m", "xpu.frontends.tinygrad", f"{model}:double", "--input", "x=2,3",
                           "-o", str(out)], capture_output=True, text=True, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "values" in done.stdout and out.read_text().startswith('graph "double"')
    bad = subprocess.run([sys.executable, "-m", "xpu.frontends.tinygrad", f"{model}:nope", "-o", str(out)],
                         capture_output=True, text=True, env=dict(os.environ))
    assert bad.returncode == 2 and "no function nope" in bad.stderr
    for args in ([f"{tmp_path}/missing.py:f"], [f"{model}:double", "--input", "x"], [f"{model}:double", "--input", "=2"]):
        refused = subprocess.run([sys.executable, "-m", "xpu.frontends.tinygrad", *args, "-o", str(out)],
                                 capture_output=True, text=True, env=dict(os.environ))
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr


def test_inputs_that_would_be_read_wrongly_are_refused() -> None:
    x = Tensor(X).realize()
    # A value computed from the input and realised on the way cuts the input off.
    cut = (x + 1).realize() * 3
    with pytest.raises(tg.TinygradImportError, match="'x' does not reach the outputs"):
        tg.to_sgr(cut, inputs={"x": x})
    # A 0-d tensor is a shared constant in tinygrad, not a buffer.
    scalar = Tensor(np.array(0.5, np.float32)).realize()
    with pytest.raises(tg.TinygradImportError, match="not a realised buffer"):
        tg.to_sgr(x * scalar, inputs={"x": x, "s": scalar})
    with pytest.raises(tg.TinygradImportError, match="are the same tensor"):
        tg.to_sgr(x + 1, inputs={"x": x, "y": x})
    with pytest.raises(tg.TinygradImportError, match="input name"):
        tg.to_sgr(x + 1, inputs={'a"b': x})


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.float64])
@pytest.mark.parametrize("case", ["gelu", "tanh", "floor_round", "softmax", "layernorm", "mean_of_ints"])
def test_weakly_typed_constants_take_the_graphs_precision(dtype: Any, case: str, tmp_path: Path) -> None:
    fns: dict[str, Callable[[Tensor], Tensor]] = {
        "gelu": lambda x: x.gelu(), "tanh": lambda x: x.tanh(), "floor_round": lambda x: (x * 3).floor() + x.round(),
        "softmax": lambda x: x.softmax(-1), "layernorm": lambda x: x.layernorm(),
        "mean_of_ints": lambda x: (x * 4).cast(dtypes.int32).float().mean(axis=1).cast(dtype),
    }
    x = Tensor(X.astype(np.float16 if dtype == dtypes.float16 else np.float64)).realize()
    imported = tg.import_graph(fns[case](x), inputs={"x": x})
    fresh = X2.astype(x.numpy().dtype)
    want = fns[case](Tensor(fresh).realize()).numpy()
    (got,) = run(imported.sgr, tmp_path, {"x": fresh})
    assert got.dtype == want.dtype, imported.sgr
    tol = 2e-2 if dtype == dtypes.float16 else 1e-9
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, err_msg=imported.sgr)


@pytest.mark.parametrize("dtype,sgr", [(dtypes.int8, "i8"), (dtypes.uint8, "u8"), (dtypes.uint32, "u32"),
                                       (dtypes.float16, "f16"), (dtypes.int64, "i64")])
def test_every_integer_and_float_dtype_is_named(dtype: Any, sgr: str, tmp_path: Path) -> None:
    x = Tensor(X).realize()
    text = tg.to_sgr((x * 4).cast(dtype), inputs={"x": x}, format="text")
    assert f": {sgr}[2,3] = cast(" in text, text
