"""Export ONNX's node test cases into a cache the Rust conformance runner reads.

Each case becomes DIR/<case>/model.onnx plus DIR/<case>/<k>/input_<i>.pb and
output_<i>.pb (TensorProto, or SequenceProto / OptionalProto for non-tensor values),
and DIR/manifest.json lists every case with its rtol/atol and the kind of each value, and
the reason for each case whose expectation was replaced (ERRATA below).
The export is keyed by the onnx version and the export format: a stale cache is rebuilt.
"""

import json
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases


# Bump when the export layout changes, so stale caches are rebuilt.
FORMAT = f"onnx-{onnx.__version__}/3"

# Cases whose stored expectation is further from the exact answer than the case's own
# tolerance allows. Their expectation is replaced by the exact answer (ONNX's reference
# evaluator run on a float64 copy of the model, rounded to the output type) — but only
# after proving, at every export, that the stored one fails against it; an onnx release
# that fixes the data makes the export fail here, naming the erratum to remove.
ERRATA = {
    "test_dft_inverse": "the reference computes the inverse DFT in float32; 10 outputs whose "
    "exact value is 0 come out as ±1.9e-7, beyond the case's atol of 1e-7",
    "test_dft_inverse_opset19": "the reference computes the inverse DFT in float32; 10 outputs "
    "whose exact value is 0 come out as ±1.9e-7, beyond the case's atol of 1e-7",
}


def value_to_proto(value, vinfo):
    """Serialize one input/output value the way ONNX's own backend tests do."""
    kind = vinfo.type.WhichOneof("value") if vinfo is not None else "tensor_type"
    name = vinfo.name if vinfo is not None else ""
    if isinstance(value, onnx.TensorProto):
        proto = onnx.TensorProto()
        proto.CopyFrom(value)
        proto.name = name
        return "tensor", proto.SerializeToString()
    if kind == "tensor_type":
        arr = np.asarray(value)
        return "tensor", numpy_helper.from_array(arr, name=name).SerializeToString()
    if kind == "sequence_type":
        return "sequence", numpy_helper.from_list(list(value)).SerializeToString()
    if kind == "optional_type":
        return "optional", numpy_helper.from_optional(value).SerializeToString()
    if kind == "map_type":
        return "map", numpy_helper.from_dict(value).SerializeToString()
    return kind or "unknown", b""


def float64_copy(model):
    """The model with every float32 value, initializer and cast target made float64."""
    f32, f64 = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.tensor_type.elem_type == f32:
            v.type.tensor_type.elem_type = f64
    for i, init in enumerate(g.initializer):
        if init.data_type == f32:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float64), init.name))
    for node in g.node:
        for a in node.attribute:
            if a.name == "to" and a.i == f32:
                a.i = f64
    return m


def exact_outputs(case, inputs, outputs):
    """The erratum's replacement expectation, after checking the stored one is wrong."""
    from onnx.reference import ReferenceEvaluator

    graph = case.model.graph
    wide = [np.asarray(x).astype(np.float64) if np.asarray(x).dtype == np.float32 else x for x in inputs]
    exact = ReferenceEvaluator(float64_copy(case.model)).run(None, {graph.input[i].name: x for i, x in enumerate(wide)})
    replaced, wrong = [], 0
    for stored, e in zip(outputs, exact):
        stored = np.asarray(stored)
        rounded = np.asarray(e).astype(stored.dtype)
        tol = case.atol + case.rtol * np.abs(rounded.astype(np.float64))
        wrong += int((np.abs(stored.astype(np.float64) - rounded.astype(np.float64)) > tol).sum())
        replaced.append(rounded)
    if wrong == 0:
        raise SystemExit(f"erratum {case.name}: the stored expectation now agrees with the exact answer; remove it from ERRATA in {__file__}")
    return replaced


def main(out_dir):
    stamp_path = os.path.join(out_dir, "manifest.json")
    if os.path.exists(stamp_path):
        with open(stamp_path) as f:
            if json.load(f).get("format") == FORMAT:
                print(f"conformance cache up to date: {out_dir}")
                return
    os.makedirs(out_dir, exist_ok=True)
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    cases = []
    for case in collect_testcases(None):
        case_dir = os.path.join(out_dir, case.name)
        os.makedirs(case_dir, exist_ok=True)
        with open(os.path.join(case_dir, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        graph = case.model.graph
        data_sets = []
        for k, (inputs, outputs) in enumerate(case.data_sets or []):
            if case.name in ERRATA:
                outputs = exact_outputs(case, inputs, outputs)
            ds_dir = os.path.join(case_dir, str(k))
            os.makedirs(ds_dir, exist_ok=True)
            kinds = {"inputs": [], "outputs": []}
            for role, values, infos in (("input", inputs, graph.input), ("output", outputs, graph.output)):
                for i, value in enumerate(values):
                    info = infos[i] if i < len(infos) else None
                    try:
                        kind, blob = value_to_proto(value, info)
                    except Exception as e:  # a value numpy_helper cannot serialize
                        kind, blob = f"unexportable: {type(e).__name__}", b""
                    with open(os.path.join(ds_dir, f"{role}_{i}.pb"), "wb") as f:
                        f.write(blob)
                    kinds[role + "s"].append(kind)
            data_sets.append(kinds)
        cases.append(
            {
                "name": case.name,
                "rtol": float(case.rtol),
                "atol": float(case.atol),
                "data_sets": data_sets,
                "ops": sorted({n.op_type for n in graph.node}),
                "erratum": ERRATA.get(case.name),
            }
        )
    with open(stamp_path, "w") as f:
        json.dump({"format": FORMAT, "onnx_version": onnx.__version__, "cases": cases}, f, indent=1)
    print(f"exported {len(cases)} ONNX node test cases to {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".cache/onnx-node")
