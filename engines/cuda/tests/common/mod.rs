//! What the cuda engine's tests share: the example programs and their inputs.

use xpu_ir::{Graph, Tensor};
use xpu_lower::{self as lower, Program};

/// The fused chains and row groups of the llvm issue's benchmarks, and softmax as one op.
pub const CHAINS_AND_ROWS: &[&str] = &[
    "gelu_chain",
    "silu_chain",
    "mish_chain",
    "softplus_chain",
    "softmax_rows",
    "layernorm_rows",
    "rmsnorm_rows",
    "logsumexp_rows",
    "softmax_op_rows",
];

/// `tests/programs/NAME.sgr`, parsed.
pub fn program(name: &str) -> Graph {
    let path = format!("{}/../../tests/programs/{name}.sgr", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).unwrap();
    xpu_ir::text::parse(&src).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `g`'s input shapes with every symbolic dimension bound to `rows`.
pub fn shapes(g: &Graph, rows: usize) -> Vec<Vec<usize>> {
    g.inputs
        .iter()
        .map(|v| {
            g.ty(*v)
                .dims
                .iter()
                .flatten()
                .map(|d| match d {
                    xpu_ir::Dim::Known(n) => *n as usize,
                    _ => rows,
                })
                .collect()
        })
        .collect()
}

/// Inputs for `g` with its symbolic batch bound to `rows`: varied values, NaN-free.
#[allow(dead_code)] // not every test file feeds inputs
pub fn inputs(g: &Graph, rows: usize) -> Vec<Tensor> {
    shapes(g, rows)
        .into_iter()
        .enumerate()
        .map(|(k, shape)| {
            let n: usize = shape.iter().product();
            let data: Vec<f32> =
                (0..n).map(|i| (((i * 7919 + k * 31) % 1000) as f32 / 125.0) - 4.0).collect();
            Tensor::from_vec(shape, data).unwrap()
        })
        .collect()
}

/// `g` lowered with its symbolic batch bound to `rows`.
pub fn lowered(g: &Graph, rows: usize) -> Program {
    let shapes = shapes(g, rows);
    lower::lower(g, &shapes, &vec![None; shapes.len()]).unwrap()
}
