//! The engines and kernels xpu knows of, whether or not this build or machine has them.
//! Policies are checked against this catalogue without any environment (a CPU-only CI can
//! validate a GPU policy); what a machine really has is its [`Inventory`](crate::Inventory).

/// A known engine: its name, the cargo feature that builds it, its kernels in the engine's
/// default preference order, and the device kinds it places work on.
#[derive(Debug, Clone, Copy)]
pub struct KnownEngine {
    pub name: &'static str,
    pub feature: &'static str,
    pub kernels: &'static [&'static str],
    pub description: &'static str,
}

pub const ENGINES: &[KnownEngine] = &[
    KnownEngine {
        name: "cpu",
        feature: "cpu",
        kernels: &["cpu.blas", "cpu.gemm", "cpu.im2col_conv", "cpu.naive"],
        description: "reference engine in Rust: every SGR-ML op on the host",
    },
    KnownEngine {
        name: "llvm",
        feature: "llvm",
        kernels: &["llvm.fused", "llvm.gemm", "llvm.reduce", "llvm.riscv"],
        description: "LLVM JIT for fused groups on the host, AOT for riscv64",
    },
    KnownEngine {
        name: "cuda",
        feature: "cuda",
        kernels: &[
            "cuda.cublaslt",
            "cuda.cublas",
            "cuda.cudnn",
            "cuda.flash_v2",
            "cuda.fused",
            "cuda.naive",
        ],
        description: "NVIDIA GPUs through cudarc: cuBLAS(Lt), cuDNN, NVRTC-fused kernels",
    },
    KnownEngine {
        name: "ort",
        feature: "ort",
        kernels: &["ort.cpu", "ort.cuda", "ort.tensorrt"],
        description: "ONNX Runtime, one kernel per execution provider",
    },
    KnownEngine {
        name: "openvino",
        feature: "openvino",
        kernels: &["openvino.cpu", "openvino.gpu", "openvino.npu", "openvino.auto"],
        description: "OpenVINO, one kernel per device plugin",
    },
    KnownEngine {
        name: "table",
        feature: "table",
        kernels: &["table.native", "table.duckdb"],
        description: "DuckDB for table operations; describe natively in Rust",
    },
];

pub fn engine(name: &str) -> Option<&'static KnownEngine> {
    ENGINES.iter().find(|e| e.name == name)
}

/// Every known kernel name.
pub fn kernels() -> impl Iterator<Item = &'static str> {
    ENGINES.iter().flat_map(|e| e.kernels.iter().copied())
}

/// The engine a kernel name belongs to (`cuda.cublaslt` → `cuda`).
pub fn engine_of(kernel: &str) -> &str {
    kernel.split_once('.').map(|(e, _)| e).unwrap_or(kernel)
}

/// The kind of device a known kernel runs on (`ort.cuda` → cuda, `openvino.npu` → npu,
/// `llvm.riscv` → riscv64); `None` for a kernel the catalogue does not know.
pub fn kernel_device(kernel: &str) -> Option<crate::DeviceKind> {
    use crate::DeviceKind::*;
    let (engine, _) = kernel.split_once('.')?;
    engine_kernels(engine)?.contains(&kernel).then_some(())?;
    Some(match kernel {
        "ort.cuda" | "ort.tensorrt" => Cuda,
        "openvino.gpu" => Gpu,
        "openvino.npu" => Npu,
        "llvm.riscv" => Riscv64,
        _ if engine == "cuda" => Cuda,
        // openvino.auto picks its devices itself and takes its inputs from host memory.
        _ => Host,
    })
}

fn engine_kernels(engine: &str) -> Option<&'static [&'static str]> {
    self::engine(engine).map(|e| e.kernels)
}

/// Precision names a policy may use, with the element type each computes in.
pub const PRECISIONS: &[(&str, xpu_ir::DType)] = &[
    ("fp64", xpu_ir::DType::F64),
    ("fp32", xpu_ir::DType::F32),
    ("tf32", xpu_ir::DType::F32),
    ("fp16", xpu_ir::DType::F16),
    ("bf16", xpu_ir::DType::BF16),
    ("int8", xpu_ir::DType::I8),
];

/// The precision name of a float element type (`f32` → `fp32`).
pub fn precision_of(dtype: xpu_ir::DType) -> Option<&'static str> {
    match dtype {
        xpu_ir::DType::F64 => Some("fp64"),
        xpu_ir::DType::F32 => Some("fp32"),
        xpu_ir::DType::F16 => Some("fp16"),
        xpu_ir::DType::BF16 => Some("bf16"),
        _ => None,
    }
}
