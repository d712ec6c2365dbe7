"""Old-opset models (7 to 12) whose forms xpu's importer rewrites, with onnxruntime's
outputs as the expected data, in the layout of export_cases.py, so the same conformance
runner checks them: `legacy_opsets.py DIR`.
"""

import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

FORMAT = f"legacy-{onnx.__version__}-{ort.__version__}/1"
rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def case(name, opset, node, inputs, outputs, inits=()):
    """inputs: list of (name, array); outputs: list of (name, elem_type)."""
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="xpu-legacy")
    model.ir_version = 7 if opset < 13 else 8
    # onnxruntime loads and validates it below.
    return name, model, inputs


def cases():
    x4 = f32(1, 2, 3, 4)
    yield case("upsample7_nearest", 7, helper.make_node("Upsample", ["x"], ["y"], mode="nearest", scales=[1.0, 1.0, 2.0, 3.0]), [("x", x4)], [("y", TensorProto.FLOAT)])
    yield case("upsample9_linear", 9, helper.make_node("Upsample", ["x", "s"], ["y"], mode="linear"), [("x", x4)], [("y", TensorProto.FLOAT)], [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")])
    yield case("resize10_nearest", 10, helper.make_node("Resize", ["x", "s"], ["y"], mode="nearest"), [("x", x4)], [("y", TensorProto.FLOAT)], [numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "s")])
    x3 = f32(2, 3, 4)
    for op, axis in (("Softmax", 1), ("LogSoftmax", 2), ("Hardmax", 0), ("Softmax", -1)):
        yield case(f"{op.lower()}11_axis{axis}", 11, helper.make_node(op, ["x"], ["y"], axis=axis), [("x", x3)], [("y", TensorProto.FLOAT)])
    yield case("softmax7_default_axis", 7, helper.make_node("Softmax", ["x"], ["y"]), [("x", x3)], [("y", TensorProto.FLOAT)])
    c = 2
    bn = [numpy_helper.from_array(a, n) for a, n in ((np.array([1.5, 0.5], np.float32), "g"), (np.array([0.1, -0.2], np.float32), "b"), (np.array([0.3, -0.1], np.float32), "m"), (np.array([0.9, 1.4], np.float32), "v"))]
    yield case("batchnorm7_spatial", 7, helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], epsilon=1e-3, spatial=1), [("x", f32(2, c, 3, 3))], [("y", TensorProto.FLOAT)], bn)
    yield case("dropout7_ratio", 7, helper.make_node("Dropout", ["x"], ["y"], ratio=0.3), [("x", x3)], [("y", TensorProto.FLOAT)])
    yield case("pad2_reflect", 7, helper.make_node("Pad", ["x"], ["y"], mode="reflect", pads=[0, 0, 1, 2, 0, 0, 2, 1]), [("x", x4)], [("y", TensorProto.FLOAT)])
    yield case("pad2_constant_value", 7, helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 1, 0, 0, 1], value=2.5), [("x", x3)], [("y", TensorProto.FLOAT)])
    yield case("slice1_attrs", 7, helper.make_node("Slice", ["x"], ["y"], starts=[1, 0], ends=[3, -1], axes=[2, 1]), [("x", x3)], [("y", TensorProto.FLOAT)])
    yield case("topk1_k", 7, helper.make_node("TopK", ["x"], ["v", "i"], k=2, axis=-1), [("x", x3)], [("v", TensorProto.FLOAT), ("i", TensorProto.INT64)])
    yield case("clip6_min_max", 7, helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.7), [("x", x3)], [("y", TensorProto.FLOAT)])
    yield case("split2_sizes", 7, helper.make_node("Split", ["x"], ["a", "b"], axis=2, split=[1, 3]), [("x", x3)], [("a", TensorProto.FLOAT), ("b", TensorProto.FLOAT)])
    yield case("split2_equal", 7, helper.make_node("Split", ["x"], ["a", "b"], axis=2), [("x", x3)], [("a", TensorProto.FLOAT), ("b", TensorProto.FLOAT)])
    yield case("squeeze1_axes", 7, helper.make_node("Squeeze", ["x"], ["y"], axes=[0, 2]), [("x", f32(1, 3, 1, 2))], [("y", TensorProto.FLOAT)])
    yield case("unsqueeze1_axes", 7, helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0, 3]), [("x", x3)], [("y", TensorProto.FLOAT)])
    yield case("reducesum1_axes", 7, helper.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0), [("x", x3)], [("y", TensorProto.FLOAT)])
    yield case("reducemean11_axes", 11, helper.make_node("ReduceMean", ["x"], ["y"], axes=[0, 2]), [("x", x3)], [("y", TensorProto.FLOAT)])
    yield case("reducemax12_all", 12, helper.make_node("ReduceMax", ["x"], ["y"], keepdims=0), [("x", x3)], [("y", TensorProto.FLOAT)])
    yield case("cast6_to_int32", 7, helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT32), [("x", x3 * 10)], [("y", TensorProto.INT32)])
    yield case("gemm7_bias_vector", 7, helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transB=1), [("a", f32(3, 4)), ("b", f32(5, 4)), ("c", f32(5))], [("y", TensorProto.FLOAT)])
    yield case("maxpool8_indices", 8, helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[1, 2]), [("x", f32(1, 2, 5, 6))], [("y", TensorProto.FLOAT), ("i", TensorProto.INT64)])
    yield case("averagepool7_pads", 7, helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1), [("x", f32(1, 2, 5, 5))], [("y", TensorProto.FLOAT)])
    yield case("lrn1", 7, helper.make_node("LRN", ["x"], ["y"], size=3, alpha=1e-3, beta=0.75, bias=1.0), [("x", f32(1, 5, 3, 3))], [("y", TensorProto.FLOAT)])


def main(out_dir):
    manifest = os.path.join(out_dir, "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            if json.load(f).get("format") == FORMAT:
                print(f"legacy-opset cases up to date: {out_dir}")
                return
    os.makedirs(out_dir, exist_ok=True)
    entries = []
    for name, model, inputs in cases():
        d = os.path.join(out_dir, name)
        os.makedirs(os.path.join(d, "0"), exist_ok=True)
        onnx.save(model, os.path.join(d, "model.onnx"))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs = sess.run(None, dict(inputs))
        for i, (n, a) in enumerate(inputs):
            with open(os.path.join(d, "0", f"input_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(a, n).SerializeToString())
        for i, (o, a) in enumerate(zip(model.graph.output, outs)):
            with open(os.path.join(d, "0", f"output_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(np.asarray(a), o.name).SerializeToString())
        entries.append({"name": name, "rtol": 1e-4, "atol": 1e-5, "data_sets": [{"inputs": ["tensor"] * len(inputs), "outputs": ["tensor"] * len(outs)}], "ops": [model.graph.node[0].op_type]})
    with open(manifest, "w") as f:
        json.dump({"format": FORMAT, "onnx_version": onnx.__version__, "cases": entries}, f, indent=1)
    print(f"wrote {len(entries)} legacy-opset cases to {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".cache/legacy-opsets")
