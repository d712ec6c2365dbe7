//! SGR-ML, the semantic graph IR of xpu: what to compute, never how. It holds dtypes,
//! shapes with symbolic dims, the op registry (ONNX-aligned semantics with typed
//! signatures), a u32-indexed graph arena, the text form (printer and parser that round
//! trip) and the JSON form with its schema, type/shape inference, the verifier and the
//! graph passes (fold, DCE, CSE, canonicalise, fusion grouping, memory planning).
//! Besides tensors, a value may be a table (dtype `table`): the relational ops of class
//! `table` take and make them, and [`Table`] is their materialised form.
//! It knows nothing of engines, policies or HTTP.

pub mod attr;
pub mod borrowed;
pub mod control;
pub mod dtype;
pub mod graph;
pub mod infer;
mod infer_state;
pub mod lowp;
pub mod memory;
pub mod op;
pub mod passes;
pub mod rowexpr;
pub mod shape;
pub mod table;
pub mod table_attrs;
pub mod tensor;
pub mod text;
pub mod verify;

pub use attr::{Attr, AttrKind, Attrs};
pub use borrowed::BorrowedTensor;
pub use dtype::DType;
pub use graph::{Graph, GraphOutput, Node, NodeId, Partition, Value, ValueDef, ValueId};
pub use infer::InferError;
pub use op::{Op, OpClass, OpInfo};
pub use rowexpr::{ColumnType, Literal, RowExpr, RowExprError, RowFunc};
pub use shape::{Dim, TensorType};
pub use table::{Column, ColumnData, Table};
pub use tensor::{Element, Tensor, TensorData};
pub use verify::{Rule, VerifyError, verify};

/// The JSON Schema of the SGR-ML JSON form (committed as `schemas/sgr.schema.json`).
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(Graph);
    let mut s = serde_json::to_string_pretty(&schema).expect("schema serializes");
    s.push('\n');
    s
}

/// Parses the JSON form.
pub fn from_json(s: &str) -> Result<Graph, serde_json::Error> {
    serde_json::from_str(s)
}

/// Writes the JSON form.
pub fn to_json(g: &Graph) -> String {
    serde_json::to_string_pretty(g).expect("graph serializes")
}
