//! The element types ONNX Runtime's CPU execution provider runs each op at, where they are
//! fewer than ONNX allows: kernels its build does not register (`Where` of bool, `Max` of
//! i16, almost everything of bf16) and types the ONNX spec does not allow for the op (`Neg`
//! of u8, `Sqrt` of ints). The planner reads them as the `ort.cpu` kernel's `op_dtypes`, so
//! such a node is placed on another engine instead of failing when ORT builds its session.
//! Measured against ONNX Runtime 1.31.1 at opset 21 by `tools/ort_cpu_gaps.py`, which
//! `python/tests/test_engines.py` runs to hold this table to the ORT that is installed.

use xpu_engine::OpDtypes;
use xpu_ir::{DType, Op};

/// Ops whose nodes ORT's CPU provider runs only at these element types (the dtype a node
/// computes at: its first float input's, else its first value input's; strings as ONNX
/// allows). Ops not listed run at every tensor type.
// One line per set of ops: a data table, kept as measured rather than one type per line.
#[rustfmt::skip]
const RUNS: &[(&[Op], &[DType])] = &[
    // ONNX opset 27's state-space ops: ONNX Runtime 1.31 has no kernel for them at all.
    (&[Op::LinearAttention, Op::CausalConvWithState], &[]),
    (
        &[Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Mod, Op::Abs, Op::Less, Op::Greater, Op::LessOrEqual, Op::GreaterOrEqual],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64],
    ),
    (
        &[Op::Pow, Op::ReduceSum, Op::ReduceProd, Op::ReduceMean, Op::CumSum],
        &[DType::F32, DType::F64, DType::F16, DType::I32, DType::I64],
    ),
    (
        &[Op::Max, Op::Min],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I32, DType::I64, DType::U8, DType::U32, DType::U64],
    ),
    (
        &[Op::Neg],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I16, DType::I32, DType::I64],
    ),
    (
        &[Op::Sqrt, Op::Reciprocal, Op::Exp, Op::Log, Op::Sin, Op::Floor, Op::Ceil, Op::Softmax, Op::LogSoftmax, Op::Tanh, Op::Sigmoid, Op::Round],
        &[DType::F32, DType::F64, DType::F16],
    ),
    (
        &[Op::Relu],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I32],
    ),
    (
        &[Op::Sign, Op::Clip],
        &[DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64],
    ),
    (
        &[Op::Equal, Op::Expand, Op::Tile],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64, DType::Bool],
    ),
    (
        &[Op::And, Op::Or, Op::Xor, Op::Not],
        &[DType::Bool],
    ),
    (
        &[Op::BitwiseAnd, Op::BitwiseOr, Op::BitwiseXor, Op::BitwiseNot],
        &[DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64],
    ),
    (
        &[Op::BitShift],
        &[DType::U8, DType::U32, DType::U64],
    ),
    (
        &[Op::Where],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I32, DType::I64, DType::U8, DType::U32],
    ),
    (
        &[Op::Pad],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I32, DType::I64, DType::U8, DType::U32, DType::U64, DType::Bool],
    ),
    (
        &[Op::ReduceMax, Op::ReduceMin],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I32, DType::I64, DType::U8, DType::Bool],
    ),
    (
        &[Op::MatMul],
        &[DType::F32, DType::F64, DType::F16, DType::I32, DType::I64, DType::U32, DType::U64],
    ),
    (
        &[Op::Erf],
        &[DType::F32, DType::F16],
    ),
    (
        &[Op::ArgMax],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I32, DType::I64, DType::U8],
    ),
    (
        &[Op::Trilu],
        &[DType::F32, DType::F64, DType::F16, DType::I32, DType::I64, DType::Bool],
    ),
    (
        &[Op::TopK],
        &[DType::F32, DType::F64, DType::F16, DType::I8, DType::I16, DType::I32, DType::I64, DType::U8],
    ),
    (
        &[Op::NonZero],
        &[DType::F32, DType::F16, DType::I32, DType::I64, DType::U8, DType::Bool],
    ),
    (
        &[Op::IsNaN, Op::IsInf],
        &[DType::F32, DType::F64, DType::F16, DType::BF16],
    ),
];

/// The CPU kernel's `op_dtypes`.
pub fn cpu_op_dtypes() -> Vec<OpDtypes> {
    RUNS.iter()
        .map(|(ops, dtypes)| {
            let mut dtypes = dtypes.to_vec();
            dtypes.push(DType::String);
            OpDtypes { ops: ops.to_vec(), dtypes }
        })
        .collect()
}
