//! ONNX frontend and exporter for SGR-ML.
//!
//! [`import_model`] turns ONNX bytes (opsets 7 to the newest onnx 1.23 knows) into a
//! [`Graph`], normalising older opsets to the newest semantics (attributes that later became
//! inputs, legacy 2-D softmax, `Upsample`, …). [`export_model`] writes a graph — or a
//! partition cut out of one with [`xpu_ir::Graph`] tools — back to ONNX bytes at
//! [`EXPORT_OPSET`]. Protobuf is generated from the vendored `onnx.proto` by prost.
//! Malformed input is an [`OnnxError`], never a panic.

mod export;
mod import;
mod import_control;
mod tensor;

pub use export::{EXPORT_IR_VERSION, EXPORT_OPSET, export_model};
pub use import::{import_model, import_model_proto};
pub use tensor::{
    dtype_from_onnx, dtype_to_onnx, onnx_type_name, read_tensor_proto, tensor_from_proto,
    tensor_to_proto,
};

/// Generated protobuf types of `onnx.proto` (onnx-ml) and `onnx-data.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// Where the list of supported ONNX ops is documented (named in unsupported-op errors).
pub const SUPPORTED_OPS_DOC: &str = "docs/onnx-support.md";

/// Anything that stops an import or export.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("not a valid ONNX protobuf: {0}")]
    Decode(prost::DecodeError),
    #[error("the model has no graph")]
    NoGraph,
    #[error(
        "unsupported op `{op_type}`{} (node {node:?}, opset {opset}); supported ops are listed in {}",
        if domain.is_empty() { String::new() } else { format!(" in domain `{domain}`") },
        SUPPORTED_OPS_DOC
    )]
    UnsupportedOp { op_type: String, domain: String, node: String, opset: i64 },
    #[error("{context}: unsupported data type {name}")]
    UnsupportedDType { context: String, name: String },
    #[error("node {node:?} ({op_type}): {message}")]
    Node { node: String, op_type: String, message: String },
    #[error("{context}: {message}")]
    Invalid { context: String, message: String },
}

impl From<prost::DecodeError> for OnnxError {
    fn from(e: prost::DecodeError) -> Self {
        OnnxError::Decode(e)
    }
}

fn invalid(context: impl Into<String>, message: impl Into<String>) -> OnnxError {
    OnnxError::Invalid { context: context.into(), message: message.into() }
}

/// ONNX op types (default domain) the importer accepts, with the SGR-ML op each maps to.
pub fn supported_onnx_ops() -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<(&'static str, &'static str)> =
        // "—" marks SGR-ML ops with no ONNX counterpart (the table ops).
        xpu_ir::Op::ALL
            .iter()
            .filter(|op| op.info().onnx != "—")
            .map(|op| (op.info().onnx, op.name()))
            .collect();
    v.push(("Upsample", "resize"));
    v.push(("Scatter", "scatter_elements"));
    v.sort();
    v
}

/// The import support page (`docs/onnx-support.md`), generated so it cannot drift.
pub fn support_markdown() -> String {
    let mut s = String::from(
        "# ONNX import support\n\nGenerated from the importer (`XPU_BLESS=1 cargo test -p xpu-tests --test generated` rewrites it). \
Models of opset 7 and newer in the default domain import; older forms (attributes that later became inputs, 2-D Softmax, \
Upsample, …) are rewritten into the newest semantics. Element types: float, double, float16, bfloat16, int8/16/32/64, \
uint8/16/32/64, bool, string. A node of an op not listed here (any domain, `ai.onnx.ml` included) imports as an opaque \
`onnx_op` node when its attributes are plain values and the model declares its output types: xpu's cpu engine does not run it, \
engines that take ONNX (ort, openvino) do, and export writes it back as it was. If, Loop and Scan import with their subgraphs \
(outer values a subgraph reads become explicit captures). Not supported: opaque nodes without declared output types, \
sequence/optional/map values, Scan-8, sparse and external-data tensors. Whether an engine can run an op is a separate question: see `xpuctl engines` and the \
conformance reports `tests/conformance/onnx-node-report.md` and `engines-report.md`.\n\n\
| ONNX op | SGR-ML op |\n|---|---|\n",
    );
    for (onnx, sgr) in supported_onnx_ops() {
        s.push_str(&format!("| {onnx} | `{sgr}` |\n"));
    }
    s
}
