"""What ONNX Runtime's CPU execution provider cannot run, by op and element type.

For each op in OPS and each tensor type, a one-node ONNX model (opset 21) is checked by
ONNX's shape inference and then given to `onnxruntime.InferenceSession` on the CPU
provider; a type the spec refuses or the provider has no kernel for is a gap.
`engines/ort/src/cpu_gaps.rs` holds the result as the `ort.cpu` kernel's dtypes, and
`python/tests/test_engines.py` holds that table to this probe of the installed ORT.
`python tools/ort_cpu_gaps.py` prints the gaps as JSON ({op: [dtype, …]}) with ORT's version."""

from __future__ import annotations

import json

import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper

T = {"f32": TP.FLOAT, "f64": TP.DOUBLE, "f16": TP.FLOAT16, "bf16": TP.BFLOAT16, "i8": TP.INT8, "i16": TP.INT16,
     "i32": TP.INT32, "i64": TP.INT64, "u8": TP.UINT8, "u16": TP.UINT16, "u32": TP.UINT32, "u64": TP.UINT64, "bool": TP.BOOL}
# SGR-ML op: (ONNX op, number of inputs of the type probed, attributes, output is bool)
OPS = {
 "add": ("Add", 2, {}, False), "sub": ("Sub", 2, {}, False), "mul": ("Mul", 2, {}, False), "div": ("Div", 2, {}, False),
 "pow": ("Pow", 2, {}, False), "mod": ("Mod", 2, {"fmod": 0}, False), "max": ("Max", 2, {}, False), "min": ("Min", 2, {}, False),
 "neg": ("Neg", 1, {}, False), "abs": ("Abs", 1, {}, False), "sqrt": ("Sqrt", 1, {}, False), "reciprocal": ("Reciprocal", 1, {}, False),
 "exp": ("Exp", 1, {}, False), "log": ("Log", 1, {}, False), "sin": ("Sin", 1, {}, False), "floor": ("Floor", 1, {}, False),
 "ceil": ("Ceil", 1, {}, False), "relu": ("Relu", 1, {}, False), "sign": ("Sign", 1, {}, False),
 "equal": ("Equal", 2, {}, True), "less": ("Less", 2, {}, True), "greater": ("Greater", 2, {}, True),
 "less_or_equal": ("LessOrEqual", 2, {}, True), "greater_or_equal": ("GreaterOrEqual", 2, {}, True),
 "and": ("And", 2, {}, True), "or": ("Or", 2, {}, True), "xor": ("Xor", 2, {}, True), "not": ("Not", 1, {}, True),
 "bitwise_and": ("BitwiseAnd", 2, {}, False), "bitwise_or": ("BitwiseOr", 2, {}, False), "bitwise_xor": ("BitwiseXor", 2, {}, False),
 "bitwise_not": ("BitwiseNot", 1, {}, False), "bit_shift": ("BitShift", 2, {"direction": "LEFT"}, False),
 "where": ("Where", 2, {}, False), "identity": ("Identity", 1, {}, False),
 "transpose": ("Transpose", 1, {}, False), "concat": ("Concat", 2, {"axis": 0}, False),
 "expand": ("Expand", 1, {}, False), "reshape": ("Reshape", 1, {}, False), "slice": ("Slice", 1, {}, False), "pad": ("Pad", 1, {}, False),
 "reduce_sum": ("ReduceSum", 1, {}, False), "reduce_max": ("ReduceMax", 1, {}, False), "reduce_min": ("ReduceMin", 1, {}, False),
 "reduce_prod": ("ReduceProd", 1, {}, False), "reduce_mean": ("ReduceMean", 1, {}, False),
 "matmul": ("MatMul", 2, {}, False), "softmax": ("Softmax", 1, {}, False), "log_softmax": ("LogSoftmax", 1, {}, False),
 "cast": ("Cast", 1, {"to": TP.FLOAT}, False), "tile": ("Tile", 1, {}, False), "gather": ("Gather", 1, {}, False),
 "clip": ("Clip", 1, {}, False), "erf": ("Erf", 1, {}, False), "tanh": ("Tanh", 1, {}, False), "sigmoid": ("Sigmoid", 1, {}, False),
 "cum_sum": ("CumSum", 1, {}, False), "arg_max": ("ArgMax", 1, {}, False), "squeeze": ("Squeeze", 1, {}, False),
 "unsqueeze": ("Unsqueeze", 1, {}, False), "flatten": ("Flatten", 1, {}, False), "split": ("Split", 1, {"num_outputs": 2}, False),
 "trilu": ("Trilu", 1, {}, False), "top_k": ("TopK", 1, {}, False), "non_zero": ("NonZero", 1, {}, False),
 "is_nan": ("IsNaN", 1, {}, True), "is_inf": ("IsInf", 1, {}, True), "round": ("Round", 1, {}, False),
}
def extra(op: str) -> tuple[list[onnx.TensorProto], list[str]]:
    def i64(name: str, v: list[int]) -> onnx.TensorProto:
        return helper.make_tensor(name, TP.INT64, [len(v)], v)

    return {
        "expand": ([i64("s", [2, 2])], ["s"]), "reshape": ([i64("s", [4])], ["s"]),
        "slice": ([i64("st", [0]), i64("en", [1])], ["st", "en"]), "pad": ([i64("p", [0, 1, 0, 1])], ["p"]),
        "reduce_sum": ([i64("ax", [1])], ["ax"]), "tile": ([i64("r", [1, 2])], ["r"]),
        "gather": ([i64("ix", [0])], ["ix"]), "cum_sum": ([helper.make_tensor("ax", TP.INT64, [], [0])], ["ax"]),
        "squeeze": ([], []), "unsqueeze": ([i64("ax", [0])], ["ax"]), "top_k": ([i64("k", [1])], ["k"]),
        "split": ([], []),
    }.get(op, ([], []))


def gaps() -> dict[str, list[str]]:
    """{SGR-ML op: [dtype ORT's CPU provider cannot run it at]} for the ops of OPS."""
    bad: dict[str, list[str]] = {}
    for op, (onnx_op, n, attrs, _) in OPS.items():
        for dn, dt in T.items():
            ins = [f"x{i}" for i in range(n)]
            inits, names = extra(op)
            node_in = (["c"] if op == "where" else []) + ins + names
            outs = ["y", "y2"] if op in ("split", "top_k") else ["y"]
            node = helper.make_node(onnx_op, node_in, outs, **attrs)
            inputs = [helper.make_tensor_value_info(x, dt, [2, 2]) for x in ins]
            if op == "where":
                inputs.append(helper.make_tensor_value_info("c", TP.BOOL, [2, 2]))
            g = helper.make_graph([node], "p", inputs, [helper.make_empty_tensor_value_info(o) for o in outs],
                                  initializer=inits)
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
            m.ir_version = 10
            try:
                m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
                ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            except Exception:  # the spec refuses the type, or ORT has no kernel for it
                bad.setdefault(op, []).append(dn)
    return bad


if __name__ == "__main__":
    print(json.dumps({"onnxruntime": ort.__version__, "gaps": gaps()}, indent=1))
