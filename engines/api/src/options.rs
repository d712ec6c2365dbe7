//! What an engine is told besides its partition: the typed settings the planner derives from
//! the policy ([`EngineOptions`]) and the precision a partition computes at. The policy
//! format uses these same types for its keys, so a value the policy accepts is one every
//! engine understands, and nothing is re-parsed from strings on the engine side.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// A node the first engine cannot take goes to the next one (recorded as a fallback).
    #[default]
    Allow,
    /// A node the first choice cannot take fails the plan.
    Deny,
}

/// A compute precision.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PrecisionName {
    Fp64,
    Fp32,
    /// fp32 tensors, TF32 tensor-core math (an engine mode; tensors stay fp32).
    Tf32,
    Fp16,
    Bf16,
    /// Quantized execution (an engine mode; tensors stay as the graph declares).
    Int8,
}

impl PrecisionName {
    pub const ALL: [PrecisionName; 6] = [
        PrecisionName::Fp64,
        PrecisionName::Fp32,
        PrecisionName::Tf32,
        PrecisionName::Fp16,
        PrecisionName::Bf16,
        PrecisionName::Int8,
    ];

    pub fn from_name(name: &str) -> Option<PrecisionName> {
        PrecisionName::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            PrecisionName::Fp64 => "fp64",
            PrecisionName::Fp32 => "fp32",
            PrecisionName::Tf32 => "tf32",
            PrecisionName::Fp16 => "fp16",
            PrecisionName::Bf16 => "bf16",
            PrecisionName::Int8 => "int8",
        }
    }

    /// The element type tensors are stored in at this precision; `None` for engine modes
    /// (tf32, int8) that do not retype the graph.
    pub fn storage(self) -> Option<xpu_ir::DType> {
        match self {
            PrecisionName::Fp64 => Some(xpu_ir::DType::F64),
            PrecisionName::Fp32 => Some(xpu_ir::DType::F32),
            PrecisionName::Fp16 => Some(xpu_ir::DType::F16),
            PrecisionName::Bf16 => Some(xpu_ir::DType::BF16),
            PrecisionName::Tf32 | PrecisionName::Int8 => None,
        }
    }

    /// The element type a kernel must accept to run at this precision.
    pub fn kernel_dtype(self) -> xpu_ir::DType {
        match self {
            PrecisionName::Tf32 => xpu_ir::DType::F32,
            PrecisionName::Int8 => xpu_ir::DType::I8,
            p => p.storage().expect("storage precisions"),
        }
    }

    pub fn of_dtype(d: xpu_ir::DType) -> Option<PrecisionName> {
        match d {
            xpu_ir::DType::F64 => Some(PrecisionName::Fp64),
            xpu_ir::DType::F32 => Some(PrecisionName::Fp32),
            xpu_ir::DType::F16 => Some(PrecisionName::Fp16),
            xpu_ir::DType::BF16 => Some(PrecisionName::Bf16),
            _ => None,
        }
    }
}

impl fmt::Display for PrecisionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    #[default]
    Arena,
    Caching,
    None,
}

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Reuse {
    /// Elementwise nodes write over operands that die there; dead buffers are reused.
    #[default]
    #[serde(rename = "in-place")]
    InPlace,
    /// Dead buffers are reused, never written in place.
    #[serde(rename = "buffers")]
    Buffers,
    #[serde(rename = "none")]
    None,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GraphOptimization {
    /// No rewrites: the graph runs as planned.
    None,
    /// Semantics-preserving rewrites (constant folding, redundant node removal).
    Basic,
    /// Also fusions into the engine's own compound kernels.
    Extended,
    /// Also layout changes (ONNX Runtime's default).
    All,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PerformanceHint {
    /// One request at a time, as fast as possible.
    Latency,
    /// Many requests in flight (more streams, batching where the device likes it).
    Throughput,
}

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Capture {
    /// Freeze the plan once and replay it (CUDA graphs where the engine can).
    #[default]
    Graph,
    Eager,
}

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Determinism {
    /// Same inputs give bit-identical outputs: deterministic kernels only.
    Bitwise,
    /// Results may differ within the engine's tolerance.
    Tolerance,
    #[default]
    Off,
}

/// The name of a setting's value as the policy writes it (`bitwise`, `in-place`).
pub fn value_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        other => format!("{other:?}"),
    }
}

/// Every setting an engine receives, derived from the policy by the planner. Engines read
/// what applies to them; what an engine cannot honour it reports as a decision (a fact or
/// a reason code), never silently.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineOptions {
    /// `execution.determinism`.
    pub determinism: Determinism,
    /// `execution.capture`.
    pub capture: Capture,
    /// `execution.threads`: worker threads; `None` is the engine's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// `precision.accumulate`: accumulator precision of reductions and contractions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accumulate: Option<PrecisionName>,
    /// `memory.limit` in bytes, which the engine holds while running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    /// `memory.pool`.
    pub memory_pool: Pool,
    /// `memory.reuse`.
    pub memory_reuse: Reuse,
    /// `memory.pinned_host`.
    pub pinned_host: bool,
    /// `engines.fallback`: whether an engine may move work to its own fallback device.
    pub fallback: Fallback,
    /// `execution.graph_optimization`; `None` is the engine's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_optimization: Option<GraphOptimization>,
    /// `execution.performance`; `None` is latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub performance: Option<PerformanceHint>,
}
