//! Policy → ONNX Runtime options. The planner hands the engine an [`Assignment`] (kernel per
//! node, precision, device, typed options from the policy); this module turns it into one
//! [`SessionOptions`], the session-cache key, and applies it to a session builder. The
//! table in `docs/engines.md` is this module in prose.

use ort::ep::{self, ArenaExtendStrategy, ExecutionProviderDispatch};
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use xpu_engine::options::{Determinism, Fallback, GraphOptimization, PerformanceHint, Pool};
use xpu_engine::{Assignment, DeviceKind, EngineError, PrecisionName};

pub const CPU_KERNEL: &str = "ort.cpu";
pub const CUDA_KERNEL: &str = "ort.cuda";
pub const TENSORRT_KERNEL: &str = "ort.tensorrt";

/// Kernel → the execution provider it selects, in the engine's preference order.
pub const KERNELS: &[(&str, &str, &str)] = &[
    (CPU_KERNEL, "CPUExecutionProvider", "ONNX Runtime's CPU execution provider (MLAS)"),
    (CUDA_KERNEL, "CUDAExecutionProvider", "ONNX Runtime's CUDA execution provider"),
    (
        TENSORRT_KERNEL,
        "TensorrtExecutionProvider",
        "ONNX Runtime's TensorRT execution provider (CUDA for what TensorRT leaves)",
    ),
];

/// Everything that shapes a session; equal options share a cached session.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionOptions {
    /// `ort.cpu`, `ort.cuda` or `ort.tensorrt`.
    pub kernel: String,
    pub device_id: i32,
    /// TensorRT precision flags from the policy's precision.
    pub precision: Option<PrecisionName>,
    /// CUDA EP `gpu_mem_limit` (memory.limit).
    pub gpu_mem_limit: Option<u64>,
    /// The CPU arena (memory.pool = arena | caching) or none.
    pub arena: bool,
    /// CUDA arena growth: powers of two (arena) or as requested (caching).
    pub arena_same_as_requested: bool,
    /// determinism = bitwise.
    pub deterministic: bool,
    /// execution.threads → intra-op threads (inter-op is 1: ORT runs nodes in sequence).
    pub intra_threads: Option<usize>,
    /// `execution.performance = "latency"` set explicitly: ORT's intra-op threads spin
    /// between runs (onnxruntime's own default), so a call does not wait for sleeping
    /// threads to wake; unset or `throughput`, they sleep, leaving a shared host's cores to
    /// other work.
    pub spinning: bool,
    pub optimization: Optimization,
    /// engines.fallback = "deny": nodes the provider cannot take fail the session instead
    /// of running on ORT's CPU provider.
    pub disable_cpu_fallback: bool,
}

/// ORT's graph optimisation level (execution.graph_optimization).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Optimization {
    Disable,
    Basic,
    Extended,
    All,
}

impl Optimization {
    pub fn of(g: GraphOptimization) -> Optimization {
        match g {
            GraphOptimization::None => Optimization::Disable,
            GraphOptimization::Basic => Optimization::Basic,
            GraphOptimization::Extended => Optimization::Extended,
            GraphOptimization::All => Optimization::All,
        }
    }

    fn level(self) -> GraphOptimizationLevel {
        match self {
            Optimization::Disable => GraphOptimizationLevel::Disable,
            Optimization::Basic => GraphOptimizationLevel::Level1,
            Optimization::Extended => GraphOptimizationLevel::Level2,
            Optimization::All => GraphOptimizationLevel::All,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Optimization::Disable => "none",
            Optimization::Basic => "basic",
            Optimization::Extended => "extended",
            Optimization::All => "all",
        }
    }
}

impl SessionOptions {
    /// The options for one partition. The kernel is the strongest one the plan named for
    /// any node (one session has one provider list: TensorRT, then CUDA, then CPU).
    pub fn from_assignment(
        a: &Assignment,
        providers: &[String],
    ) -> Result<SessionOptions, EngineError> {
        let kernel = [TENSORRT_KERNEL, CUDA_KERNEL, CPU_KERNEL]
            .into_iter()
            .find(|k| a.kernels.values().any(|n| n == k))
            .unwrap_or(CPU_KERNEL)
            .to_string();
        if let Some(other) = a.kernels.values().find(|k| !KERNELS.iter().any(|(n, _, _)| n == k)) {
            return Err(EngineError::Other(format!("ort: unknown kernel {other}")));
        }
        let provider = KERNELS.iter().find(|(k, _, _)| *k == kernel).map(|(_, p, _)| *p);
        if let Some(p) = provider
            && !providers.iter().any(|have| have == p)
        {
            return Err(EngineError::Unavailable {
                engine: "ort".into(),
                reason: format!(
                    "kernel {kernel} needs {p}, which this ONNX Runtime build lacks (it has {})",
                    providers.join(", ")
                ),
            });
        }
        let o = &a.options;
        let device_id = match a.device.kind {
            DeviceKind::Cuda => {
                i32::try_from(a.device.ordinal).map_err(|_| EngineError::InvalidOption {
                    engine: "ort".into(),
                    key: "device".into(),
                    value: a.device.to_string(),
                    expected: "a CUDA device ordinal ORT can address".into(),
                })?
            }
            _ => 0,
        };
        Ok(SessionOptions {
            kernel,
            device_id,
            precision: a.precision,
            gpu_mem_limit: o.memory_limit,
            arena: o.memory_pool != Pool::None,
            arena_same_as_requested: o.memory_pool == Pool::Caching,
            deterministic: o.determinism == Determinism::Bitwise,
            intra_threads: o.threads.map(|t| t as usize),
            spinning: o.performance == Some(PerformanceHint::Latency),
            optimization: o.graph_optimization.map_or(Optimization::All, Optimization::of),
            disable_cpu_fallback: o.fallback == Fallback::Deny,
        })
    }

    /// The execution providers, strongest first; ORT's CPU provider is always last unless
    /// CPU fallback is disabled.
    fn providers(&self) -> Vec<ExecutionProviderDispatch> {
        let strategy = if self.arena_same_as_requested {
            ArenaExtendStrategy::SameAsRequested
        } else {
            ArenaExtendStrategy::NextPowerOfTwo
        };
        let mut cuda =
            ep::CUDA::default().with_device_id(self.device_id).with_arena_extend_strategy(strategy);
        if let Some(limit) = self.gpu_mem_limit {
            cuda = cuda.with_memory_limit(limit as usize);
        }
        let cuda = cuda.build().error_on_failure();
        let cpu = ep::CPU::default().with_arena_allocator(self.arena).build().error_on_failure();
        match self.kernel.as_str() {
            TENSORRT_KERNEL => {
                let trt = ep::TensorRT::default()
                    .with_device_id(self.device_id)
                    .with_fp16(self.precision == Some(PrecisionName::Fp16))
                    .with_bf16(self.precision == Some(PrecisionName::Bf16))
                    .with_int8(self.precision == Some(PrecisionName::Int8))
                    .build()
                    .error_on_failure();
                vec![trt, cuda, cpu]
            }
            CUDA_KERNEL => vec![cuda, cpu],
            _ => vec![cpu],
        }
    }

    /// Applies these options to a fresh builder.
    pub(crate) fn apply(&self, b: SessionBuilder) -> Result<SessionBuilder, String> {
        let e = |e: ort::Error<SessionBuilder>| e.to_string();
        let mut b = b
            .with_optimization_level(self.optimization.level())
            .map_err(e)?
            .with_inter_threads(1)
            .map_err(e)?
            .with_parallel_execution(false)
            .map_err(e)?
            .with_intra_op_spinning(self.spinning)
            .map_err(e)?
            .with_inter_op_spinning(self.spinning)
            .map_err(e)?
            .with_deterministic_compute(self.deterministic)
            .map_err(e)?
            .with_memory_pattern(self.arena)
            .map_err(e)?;
        if let Some(t) = self.intra_threads {
            b = b.with_intra_threads(t).map_err(e)?;
        }
        if self.disable_cpu_fallback && self.kernel != CPU_KERNEL {
            b = b.with_disable_cpu_fallback().map_err(e)?;
        }
        b.with_execution_providers(self.providers()).map_err(e)
    }

    /// The options as explanation facts (`ort.option.*`).
    pub fn describe(&self) -> Vec<(String, String)> {
        let mut v = vec![
            ("kernel".to_string(), self.kernel.clone()),
            ("graph_optimization".into(), self.optimization.name().into()),
            (
                "intra_threads".into(),
                self.intra_threads.map(|t| t.to_string()).unwrap_or("default".into()),
            ),
            ("spinning".into(), if self.spinning { "on" } else { "off" }.into()),
            ("deterministic_compute".into(), self.deterministic.to_string()),
            ("cpu_arena".into(), self.arena.to_string()),
        ];
        if self.kernel != CPU_KERNEL {
            v.push(("device_id".into(), self.device_id.to_string()));
            v.push(("disable_cpu_fallback".into(), self.disable_cpu_fallback.to_string()));
            if let Some(l) = self.gpu_mem_limit {
                v.push(("gpu_mem_limit".into(), l.to_string()));
            }
        }
        if self.kernel == TENSORRT_KERNEL
            && let Some(p) = self.precision
        {
            v.push(("tensorrt_precision".into(), p.to_string()));
        }
        v
    }
}
