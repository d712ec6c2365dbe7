"""Models the Python tests run, generated with onnx's helpers (nothing large committed)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _mlp(path: Path, batch: str | int = "N") -> Path:
    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        initializer=[w1, b1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="session")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small MLP with a symbolic batch dim: x[N, 16] → y[N, 4] (softmax)."""
    return _mlp(tmp_path_factory.mktemp("models") / "mlp.onnx")


@pytest.fixture(scope="session")
def mlp_static(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same MLP with batch fixed at 2."""
    return _mlp(tmp_path_factory.mktemp("models") / "mlp2.onnx", batch=2)


@pytest.fixture(scope="session")
def reference(mlp: Path) -> Callable[[np.ndarray], np.ndarray]:
    """ONNX Runtime's outputs for the MLP, the oracle."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(mlp), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"x": x})[0]
