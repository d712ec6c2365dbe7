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
    /// Policy settings this engine does not honour as asked, with what it does instead:
    /// `execution.capture`, `memory.reuse`, `memory.pool`, `memory.pinned_host`,
    /// `precision.accumulate`. A plan that asks for one records the decision.
    pub unhonoured: &'static [(&'static str, &'static str)],
}

pub const ENGINES: &[KnownEngine] = &[
    KnownEngine {
        name: "cpu",
        feature: "cpu",
        kernels: &["cpu.blas", "cpu.gemm", "cpu.im2col_conv", "cpu.naive"],
        description: "reference engine in Rust: every SGR-ML op on the host",
        unhonoured: &[
            ("memory.pinned_host", "it works in host memory: nothing to pin"),
            (
                "precision.accumulate",
                "f16/bf16 are widened to f32 and f32 accumulates in f32, whatever this says",
            ),
        ],
    },
    KnownEngine {
        name: "llvm",
        feature: "llvm",
        kernels: &["llvm.fused", "llvm.gemm", "llvm.reduce", "llvm.riscv"],
        description: "LLVM JIT for fused groups on the host, AOT for riscv64",
        unhonoured: &[
            (
                "execution.capture",
                "the llvm engine calls its compiled kernels directly; there is nothing to capture",
            ),
            (
                "memory.reuse",
                "the llvm engine gives each fused kernel's output its own buffer; it does not follow the memory plan",
            ),
            ("memory.pool", "the llvm engine allocates its buffers from the process heap"),
            ("memory.pinned_host", "it works in host memory: nothing to pin"),
            (
                "precision.accumulate",
                "llvm reductions accumulate in the compute type (f32 for f16/bf16 storage)",
            ),
        ],
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
        description: "NVIDIA GPUs through cudarc: NVRTC-compiled LIR-ML kernels, CUDA graphs, one arena per executable",
        unhonoured: &[
            (
                "memory.reuse",
                "the cuda arena shares the bytes of dead values (as `buffers`); kernels never write in place",
            ),
            (
                "precision.accumulate",
                "cuda.fused reductions accumulate in the compute type (f32 for f16/bf16 storage)",
            ),
        ],
    },
    KnownEngine {
        name: "ort",
        feature: "ort",
        kernels: &["ort.cpu", "ort.cuda", "ort.tensorrt"],
        description: "ONNX Runtime, one kernel per execution provider",
        unhonoured: &[
            (
                "execution.capture",
                "xpu does not enable ONNX Runtime's CUDA graphs; sessions run eagerly",
            ),
            (
                "memory.reuse",
                "ONNX Runtime plans its own memory (arena, memory patterns), not xpu's plan",
            ),
            ("memory.pinned_host", "xpu hands ONNX Runtime host tensors; no pinned staging yet"),
            ("precision.accumulate", "ONNX Runtime's kernels choose their accumulators"),
        ],
    },
    KnownEngine {
        name: "openvino",
        feature: "openvino",
        kernels: &["openvino.cpu", "openvino.gpu", "openvino.npu", "openvino.auto"],
        description: "OpenVINO, one kernel per device plugin",
        unhonoured: &[
            (
                "execution.capture",
                "OpenVINO compiles the model once and runs infer requests; xpu captures nothing more",
            ),
            ("memory.reuse", "OpenVINO plans its own memory, not xpu's plan"),
            ("memory.pool", "OpenVINO manages its own memory"),
            ("memory.pinned_host", "xpu hands OpenVINO host tensors; no pinned staging"),
            ("precision.accumulate", "OpenVINO follows its inference precision hint"),
        ],
    },
    KnownEngine {
        name: "table",
        feature: "table",
        kernels: &["table.native", "table.duckdb"],
        description: "DuckDB for table operations; describe and numeric group-by natively in Rust",
        unhonoured: &[
            ("execution.capture", "DuckDB runs SQL statements; there is nothing to capture"),
            ("memory.reuse", "DuckDB manages its own memory, bounded by memory.limit"),
            ("memory.pool", "DuckDB manages its own buffer pool"),
            ("memory.pinned_host", "it works in host memory: nothing to pin"),
            ("precision.accumulate", "DuckDB aggregates in its own types (double for floats)"),
        ],
    },
];

pub fn engine(name: &str) -> Option<&'static KnownEngine> {
    ENGINES.iter().find(|e| e.name == name)
}

/// Every known kernel name.
pub fn kernels() -> impl Iterator<Item = &'static str> {
    ENGINES.iter().flat_map(|e| e.kernels.iter().copied())
}

/// A kernel's name as a policy gives it (`cpu.blas`, `ort.cuda`): resolved once from the
/// policy's text, compared with inventory entries by name, and knowing its engine (the part
/// before the first dot) without splitting again.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelId {
    name: std::sync::Arc<str>,
    engine_len: usize,
}

impl KernelId {
    pub fn new(name: &str) -> KernelId {
        KernelId { name: name.into(), engine_len: engine_of(name).len() }
    }

    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The shared name (a plan's choices hold it without a copy).
    pub fn shared(&self) -> &std::sync::Arc<str> {
        &self.name
    }

    /// The engine the kernel belongs to (`cuda.cublaslt` → `cuda`).
    pub fn engine(&self) -> &str {
        &self.name[..self.engine_len]
    }

    /// The kind of device the catalogue says it runs on ([`kernel_device`]).
    pub fn device_kind(&self) -> Option<crate::DeviceKind> {
        kernel_device(&self.name)
    }
}

impl std::fmt::Display for KernelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
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
    self::engine(engine)?.kernels.contains(&kernel).then_some(())?;
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
