//! The llvm engine: SGR-ML partitions lowered to LIR-ML ([`lower`]), LIR-ML to LLVM IR
//! ([`codegen`]), compiled by LLVM 19 for this machine's CPU name and features
//! ([`compile`]) into a shared object kept in a memory and disk cache ([`cache`]), and run
//! with the outer loop of each kernel split into fixed chunks over `execution.threads`
//! ([`exec`]). Kernels are specialised to the input shapes of a run (compiled once per
//! shape set). Floating point follows IEEE without fast-math, so outputs are the same bit
//! for bit at any thread count and vector width. Float elementwise ops (`llvm.fused`),
//! reductions and softmax (`llvm.reduce`) are covered today; see `docs/engines.md` for
//! what is not yet.

pub mod cache;
pub mod codegen;
pub mod compile;
mod exec;
pub mod riscv;

use std::path::PathBuf;
use std::sync::Arc;

use xpu_engine::{
    Assignment, Availability, Capabilities, Device, DeviceBuffer, DeviceId, Engine, EngineError,
    Executable, HostCpu, HostMemory, KernelCaps, OpDtypes, RiscvCpu, Value,
};
use xpu_ir::{DType, Graph, Op, OpClass, Tensor};

pub use compile::{Emit, Target};
/// The lowering the engine compiles (SGR-ML partition → LIR-ML program).
pub use xpu_lower as lower;
pub use xpu_lower::{FUSED_DTYPES, OPERAND_DTYPES};

/// A partition the lowering cannot take: a node the engine does not support.
pub(crate) fn unsupported(e: lower::LowerError) -> EngineError {
    EngineError::Unsupported { engine: "llvm".into(), node: e.node, what: e.message }
}

/// The engine: host kernels through the code cache, and a riscv64 device when a cross
/// compiler and a runner are installed.
pub struct LlvmEngine {
    state: Result<Arc<cache::CodeCache>, String>,
    riscv: Result<Arc<riscv::device::RiscvDevice>, String>,
}

impl LlvmEngine {
    /// An engine compiling for this machine, caching compiled code under `cache_dir` (no
    /// disk cache when `None`). Unavailable, with the reason, when no linker is found.
    pub fn new(cache_dir: Option<PathBuf>) -> LlvmEngine {
        LlvmEngine::configured(cache_dir, None, None, None)
    }

    /// [`new`](Self::new) with the riscv64 runner of [`with_riscv_runner`]
    /// (Self::with_riscv_runner) and host code held to `host_cpu` (`[engines.llvm]
    /// host_cpu`; `None`: `$XPU_LLVM_HOST_CPU`, else `native`), each set up once. A level
    /// this host lacks, or a bad name in the variable, makes the engine unavailable (its
    /// riscv64 device too, as a missing linker does), with the reason. The riscv64 device
    /// builds for `riscv_cpu` (`[engines.llvm] riscv_cpu`; `None`: `$XPU_RISCV_CPU`, else
    /// `rv64gc`).
    pub fn configured(
        cache_dir: Option<PathBuf>,
        riscv_runner: Option<Vec<String>>,
        host_cpu: Option<HostCpu>,
        riscv_cpu: Option<RiscvCpu>,
    ) -> LlvmEngine {
        let state = host_target(host_cpu).and_then(|target| {
            let linker = cache::find_linker()?;
            cache::CodeCache::new(target, cache_dir, linker)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        LlvmEngine { state, riscv: riscv_device(riscv_runner, riscv_cpu) }
    }

    /// The command that runs riscv64 programs (`[engines.llvm] riscv_runner`): `None` is
    /// `$XPU_RISCV_RUNNER` (split on whitespace), else `qemu-riscv64`. A board takes qemu's
    /// place through a command that runs the program there (`ssh board` with the files
    /// shared, for example).
    pub fn with_riscv_runner(mut self, runner: Option<Vec<String>>) -> LlvmEngine {
        let isa = self.riscv.as_ref().ok().map(|d| d.isa);
        self.riscv = riscv_device(runner, isa);
        self
    }

    /// The default disk cache: `$XPU_CACHE_DIR/llvm`, else `$XDG_CACHE_HOME/xpu/llvm`, else
    /// `~/.cache/xpu/llvm`.
    pub fn default_cache_dir() -> Option<PathBuf> {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        env("XPU_CACHE_DIR")
            .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("xpu")))
            .or_else(|| env("HOME").map(|h| h.join(".cache").join("xpu")))
            .map(|d| d.join("llvm"))
    }
}

/// The host target held to `cpu`, else to `$XPU_LLVM_HOST_CPU`, else the host's all: what
/// the engine compiles for (and `xpuctl ir lir --emit asm` shows).
pub fn host_target(cpu: Option<HostCpu>) -> Result<Target, String> {
    let (cpu, from) = match cpu {
        Some(cpu) => (cpu, "[engines.llvm] host_cpu"),
        None => match std::env::var("XPU_LLVM_HOST_CPU") {
            Ok(name) if !name.trim().is_empty() => {
                let cpu = name.parse().map_err(|e| format!("XPU_LLVM_HOST_CPU: {e}"))?;
                (cpu, "XPU_LLVM_HOST_CPU")
            }
            _ => (HostCpu::Native, "host"),
        },
    };
    Target::host_for(cpu).map_err(|e| format!("{from}: {e}"))
}

/// The riscv64 device building for `isa` (else `$XPU_RISCV_CPU`, else rv64gc), run by
/// `runner`, else `$XPU_RISCV_RUNNER`, else `qemu-riscv64` (with RVV 1.0 enabled for a
/// vector ISA).
fn riscv_device(
    runner: Option<Vec<String>>,
    isa: Option<RiscvCpu>,
) -> Result<Arc<riscv::device::RiscvDevice>, String> {
    let isa = match isa {
        Some(isa) => isa,
        None => match std::env::var("XPU_RISCV_CPU") {
            Ok(name) if !name.trim().is_empty() => {
                name.parse().map_err(|e| format!("XPU_RISCV_CPU: {e}"))?
            }
            _ => RiscvCpu::default(),
        },
    };
    let runner = runner
        .or_else(|| {
            std::env::var("XPU_RISCV_RUNNER")
                .ok()
                .map(|r| r.split_whitespace().map(str::to_string).collect())
                .filter(|r: &Vec<String>| !r.is_empty())
        })
        .unwrap_or_else(|| {
            let mut qemu = vec!["qemu-riscv64".to_string()];
            if isa.has_vector() {
                qemu.extend(["-cpu".to_string(), riscv::QEMU_RVV_CPU.to_string()]);
            }
            qemu
        });
    riscv::device::RiscvDevice::new(runner, isa).map(Arc::new)
}

/// `llvm.riscv`: what the riscv64 device runs (f32 and f64: no f16 conversions in the
/// riscv64 runtime, no bf16 .npy form; and the integer and bool ops).
fn riscv_kernel(isa: RiscvCpu) -> KernelCaps {
    let floats = [DType::F32, DType::F64];
    let mut ops = lower::ops::OPS.to_vec();
    ops.extend(lower::REDUCE_OPS);
    ops.extend([Op::MatMul, Op::Constant]);
    let mut narrower = elementwise_dtypes(&floats);
    narrower.push(OpDtypes {
        ops: lower::REDUCE_OPS.iter().copied().chain([Op::MatMul]).collect(),
        dtypes: floats.to_vec(),
    });
    KernelCaps {
        name: "llvm.riscv".into(),
        ops,
        classes: Vec::new(),
        // A subset of the host kernels' ops × dtypes, listed after them: with llvm first,
        // nothing lands on the riscv64 device unless a policy pins it there.
        dtypes: vec![DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool],
        deterministic: true,
        description: format!(
            "partitions compiled ahead of time for riscv64 ({isa}, lp64d) and run on the riscv64 device"
        ),
        device: Some(xpu_engine::DeviceKind::Riscv64),
        operand_dtypes: vec![DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool],
        op_dtypes: narrower,
        degraded: None,
    }
}

/// The elementwise ops' dtypes where they are narrower than floats + ints + bool
/// ([`lower::narrower_dtypes`]), as kernel caps say it.
pub fn elementwise_dtypes(floats: &[DType]) -> Vec<OpDtypes> {
    lower::narrower_dtypes(floats)
        .into_iter()
        .map(|(ops, dtypes)| OpDtypes { ops, dtypes })
        .collect()
}

/// Softmax and LogSoftmax at the dtypes the lowering computes them as ONNX defines them
/// ([`lower::SOFTMAX_DTYPES`]); at f16/bf16 they are left to the cpu engine.
pub fn softmax_dtypes() -> OpDtypes {
    OpDtypes { ops: vec![Op::Softmax, Op::LogSoftmax], dtypes: lower::SOFTMAX_DTYPES.to_vec() }
}

fn kernels() -> Vec<KernelCaps> {
    let mut ops = lower::ops::OPS.to_vec();
    ops.extend([Op::Transpose, Op::Constant]);
    let reduce = KernelCaps {
        name: "llvm.reduce".into(),
        ops: lower::REDUCE_OPS.iter().copied().chain([Op::LayerNormalization]).collect(),
        classes: Vec::new(),
        dtypes: FUSED_DTYPES.to_vec(),
        deterministic: true,
        description: "reductions over any axes, softmax along an axis and layer normalisation over the trailing dims, elementwise producers computed inside; fixed 8-lane accumulators".into(),
        device: None,
        operand_dtypes: OPERAND_DTYPES.to_vec(),
        op_dtypes: vec![softmax_dtypes()],
        degraded: None,
    };
    let gemm = KernelCaps {
        name: "llvm.gemm".into(),
        ops: vec![Op::MatMul],
        classes: Vec::new(),
        dtypes: vec![DType::F32, DType::F64],
        deterministic: true,
        description: "numpy matmul (batched, broadcast, 1-D operands): 4-row blocks sharing each load of B, L2 panels of B, vectorised over j; k summed in order".into(),
        device: None,
        // The row of C accumulates in the output: f16/bf16 would round at every step.
        operand_dtypes: vec![DType::F32, DType::F64],
        op_dtypes: Vec::new(),
        degraded: None,
    };
    vec![reduce, gemm, KernelCaps {
        name: "llvm.fused".into(),
        ops,
        classes: Vec::new(),
        dtypes: OPERAND_DTYPES.to_vec(),
        deterministic: true,
        description: "elementwise chains fused into one loop nest per group (a transpose a nest of its own), JIT-compiled for the host CPU (f16/bf16 stored, computed in f32; i32/i64 arithmetic wraps)".into(),
        device: None,
        operand_dtypes: OPERAND_DTYPES.to_vec(),
        op_dtypes: elementwise_dtypes(&FUSED_DTYPES),
        degraded: None,
    }]
}

impl Engine for LlvmEngine {
    fn name(&self) -> &str {
        "llvm"
    }

    fn version(&self) -> String {
        format!("LLVM {}", compile::llvm_version())
    }

    fn capabilities(&self) -> Capabilities {
        match &self.state {
            Err(reason) => {
                Capabilities::absent("llvm", Availability::Unavailable { reason: reason.clone() })
            }
            Ok(cache) => {
                let mut unavailable = std::collections::BTreeMap::new();
                let mut devices = vec![Device::host()];
                let mut kernels = kernels();
                match &self.riscv {
                    Ok(d) => {
                        devices.push(Device {
                            id: riscv::device::DEVICE,
                            name: d.runner.join(" "),
                            memory_bytes: None,
                        });
                        kernels.push(riscv_kernel(d.isa));
                    }
                    Err(why) => {
                        unavailable.insert("llvm.riscv".to_string(), why.clone());
                    }
                }
                Capabilities {
                    engine: "llvm".into(),
                    version: format!(
                        "LLVM {} ({} {})",
                        compile::llvm_version(),
                        cache.target.triple,
                        cache.target.cpu
                    ),
                    availability: Availability::Available,
                    devices,
                    kernels,
                    unavailable_kernels: unavailable,
                }
            }
        }
    }

    fn classes_without_loading(&self) -> Option<Vec<OpClass>> {
        Some(lower::op_classes())
    }

    fn prepare(
        &self,
        partition: &Graph,
        assignment: &Assignment,
    ) -> Result<Box<dyn Executable>, EngineError> {
        let cache = self
            .state
            .clone()
            .map_err(|reason| EngineError::Unavailable { engine: "llvm".into(), reason })?;
        if assignment.device == riscv::device::DEVICE {
            let device = self.riscv.clone().map_err(|reason| EngineError::Unavailable {
                engine: "llvm".into(),
                reason: format!("riscv64: {reason}"),
            })?;
            let cache = self.state.as_ref().ok().and_then(|c| c.dir()).map(PathBuf::from);
            return Ok(Box::new(riscv::device::RiscvExecutable::new(
                partition.clone(),
                device,
                cache,
            )));
        }
        let threads = assignment
            .options
            .threads
            .map(|t| t.max(1) as usize)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        exec::LlvmExecutable::prepare(partition.clone(), cache, threads)
    }

    fn device_memory(&self, device: DeviceId) -> bool {
        device == riscv::device::DEVICE && self.riscv.is_ok()
    }

    /// The board's transfers go through the runner's pipes: no page-locked staging.
    fn upload(
        &self,
        tensor: &Tensor,
        device: DeviceId,
        _host: HostMemory,
    ) -> Result<Value, EngineError> {
        match &self.riscv {
            Ok(d) if device == riscv::device::DEVICE => d.upload(tensor),
            _ => Err(EngineError::NoDevice {
                engine: "llvm".into(),
                device,
                what: "upload a value to it".into(),
            }),
        }
    }

    fn download(
        &self,
        buffer: &dyn DeviceBuffer,
        _host: HostMemory,
    ) -> Result<Tensor, EngineError> {
        match &self.riscv {
            Ok(d) if buffer.device() == riscv::device::DEVICE => d.download(buffer),
            _ => Err(EngineError::NoDevice {
                engine: "llvm".into(),
                device: buffer.device(),
                what: "download a value from it".into(),
            }),
        }
    }
}
