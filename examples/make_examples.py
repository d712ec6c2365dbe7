"""Regenerates the committed examples: a small seeded MLP as ONNX and an input batch.

    .venv/bin/python examples/make_examples.py && \
    xpuctl ir import examples/mlp.onnx -o examples/mlp.sgr
"""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(7)
w1 = (rng.standard_normal((16, 32)) * 0.25).astype(np.float32)
b1 = (rng.standard_normal(32) * 0.1).astype(np.float32)
w2 = (rng.standard_normal((32, 4)) * 0.25).astype(np.float32)
b2 = (rng.standard_normal(4) * 0.1).astype(np.float32)
nodes = [
    helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
    helper.make_node("Add", ["h0", "b1"], ["h1"]),
    helper.make_node("Relu", ["h1"], ["h2"]),
    helper.make_node("MatMul", ["h2", "w2"], ["l0"], name="fc2"),
    helper.make_node("Add", ["l0", "b2"], ["logits"]),
    helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
]
graph = helper.make_graph(
    nodes,
    "mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
    [
        helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 4]),
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4]),
    ],
    [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], producer_name="xpu-examples")
model.ir_version = 10
onnx.checker.check_model(model)
onnx.save(model, os.path.join(HERE, "mlp.onnx"))
np.save(os.path.join(HERE, "mlp_input.npy"), rng.standard_normal((3, 16)).astype(np.float32))
print("wrote examples/mlp.onnx and examples/mlp_input.npy")
