//! Element types of SGR-ML tensors.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;

use crate::lowp::Lowp;
use serde::{Deserialize, Serialize};

/// The element type of a tensor. The text form is the lower-case name (`f32`, `bool`, …).
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
    /// UTF-8 strings (ONNX `STRING`); only movement ops and comparisons accept them.
    String,
    /// A relation (named, typed columns), the value of MiniLang table operations. A table
    /// value has shape `[]`; only ops of class `table` take or make one.
    Table,
    /// The low-precision types (`crate::lowp`), held one element per byte: 8-bit floats
    /// (ONNX `FLOAT8E4M3FN` …, `FLOAT8E8M0`), the 4-bit float `FLOAT4E2M1` and 4- and
    /// 2-bit integers. Casts, quantization and movement ops take them; nothing computes in
    /// them.
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    F8E8M0,
    F4E2M1,
    I4,
    U4,
    I2,
    U2,
}

impl DType {
    pub const ALL: [DType; 25] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
        DType::String,
        DType::Table,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F8E8M0,
        DType::F4E2M1,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::String => "string",
            DType::Table => "table",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::F8E8M0 => "f8e8m0",
            DType::F4E2M1 => "f4e2m1",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::I2 => "i2",
            DType::U2 => "u2",
        }
    }

    /// The low-precision type this is, if it is one.
    pub fn lowp(self) -> Option<Lowp> {
        // `Lowp::dtype` is the one mapping between the two enums.
        Lowp::ALL.into_iter().find(|l| l.dtype() == self)
    }

    pub fn is_low_precision(self) -> bool {
        self.lowp().is_some()
    }

    /// Bytes per element; strings count as a pointer-sized handle for memory planning.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            // Held one element per byte (packed only in ONNX files).
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0
            | DType::F4E2M1
            | DType::I4
            | DType::U4
            | DType::I2
            | DType::U2 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::String => 16,
            // A handle; the engine holding the table accounts for its rows.
            DType::Table => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8
                | DType::I16
                | DType::I32
                | DType::I64
                | DType::U8
                | DType::U16
                | DType::U32
                | DType::U64
        )
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error for an unknown dtype name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown dtype `{0}` (expected one of f32, f64, f16, bf16, i8, i16, i32, i64, u8, u16, u32, u64, bool, string, table, f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f8e8m0, f4e2m1, i4, u4, i2, u2)"
)]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL.iter().copied().find(|d| d.name() == s).ok_or_else(|| UnknownDType(s.into()))
    }
}
