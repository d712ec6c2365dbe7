//! Policy → OpenVINO properties. The planner's [`Assignment`] (kernels, precision, typed
//! options) becomes one [`CompileOptions`]: the device to compile for and the hints set on
//! it. The table in `docs/engines.md` is this module in prose.

use xpu_engine::options::{Determinism, Fallback, PerformanceHint};
use xpu_engine::{Assignment, EngineError, PrecisionName};

/// Kernel → OpenVINO device, in the engine's preference order.
pub const KERNELS: &[(&str, &str, &str)] = &[
    ("openvino.cpu", "CPU", "OpenVINO's CPU plugin (oneDNN, JIT kernels)"),
    ("openvino.gpu", "GPU", "OpenVINO's Intel GPU plugin"),
    ("openvino.npu", "NPU", "OpenVINO's Intel NPU plugin"),
    ("openvino.auto", "AUTO", "OpenVINO's AUTO device: picks among the devices present"),
];

/// Everything that shapes a compiled model; equal options share one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CompileOptions {
    /// The strongest kernel the plan named (its device, or HETERO of several).
    pub kernel: String,
    /// `CPU`, `GPU`, `NPU`, `AUTO` or `HETERO:NPU,CPU`.
    pub device: String,
    /// INFERENCE_PRECISION_HINT: `f32` unless the plan lowers precision. Always explicit:
    /// the CPU plugin would otherwise compute in bf16 on CPUs with AMX or AVX-512 BF16.
    pub precision: InferencePrecision,
    /// PERFORMANCE_HINT: `LATENCY` or `THROUGHPUT`.
    pub performance: String,
    /// EXECUTION_MODE_HINT: `ACCURACY` when the policy asks for determinism, else
    /// `PERFORMANCE`.
    pub execution_mode: String,
    /// INFERENCE_NUM_THREADS (execution.threads); `None`: the plugin's default.
    pub threads: Option<u32>,
    /// AUTO's ENABLE_STARTUP_FALLBACK / ENABLE_RUNTIME_FALLBACK (engines.fallback).
    pub fallback: bool,
}

/// The element types OpenVINO's INFERENCE_PRECISION_HINT takes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InferencePrecision {
    F32,
    F16,
    Bf16,
}

impl InferencePrecision {
    /// The plan's precision as the hint: fp16 and bf16 as themselves, everything else f32
    /// (tf32 and int8 are modes OpenVINO's hint does not take).
    pub fn of(p: Option<PrecisionName>) -> InferencePrecision {
        match p {
            Some(PrecisionName::Fp16) => InferencePrecision::F16,
            Some(PrecisionName::Bf16) => InferencePrecision::Bf16,
            _ => InferencePrecision::F32,
        }
    }

    /// The property's value as OpenVINO spells it.
    pub fn hint(self) -> &'static str {
        match self {
            InferencePrecision::F32 => "f32",
            InferencePrecision::F16 => "f16",
            InferencePrecision::Bf16 => "bf16",
        }
    }
}

fn device_of(kernel: &str) -> Option<&'static str> {
    KERNELS.iter().find(|(k, _, _)| *k == kernel).map(|(_, d, _)| *d)
}

impl CompileOptions {
    pub fn from_assignment(
        a: &Assignment,
        devices: &[String],
    ) -> Result<CompileOptions, EngineError> {
        let mut named: Vec<&str> = Vec::new();
        for k in a.kernels.values() {
            if device_of(k).is_none() {
                return Err(EngineError::Other(format!("openvino: unknown kernel {k}")));
            }
            if !named.contains(&k.as_str()) {
                named.push(k);
            }
        }
        // Order by device preference: NPU, GPU, CPU (HETERO tries them in this order).
        let rank = |k: &str| match device_of(k) {
            Some("NPU") => 0,
            Some("GPU") => 1,
            Some("CPU") => 2,
            _ => 3,
        };
        named.sort_by_key(|k| rank(k));
        let (kernel, device) = match named.as_slice() {
            [] => ("openvino.cpu".to_string(), "CPU".to_string()),
            [k] => (k.to_string(), device_of(k).unwrap_or("CPU").to_string()),
            many if many.contains(&"openvino.auto") => ("openvino.auto".into(), "AUTO".into()),
            many => (
                many[0].to_string(),
                format!(
                    "HETERO:{}",
                    many.iter().filter_map(|k| device_of(k)).collect::<Vec<_>>().join(",")
                ),
            ),
        };
        for d in device.trim_start_matches("HETERO:").split(',') {
            let present =
                d == "AUTO" || devices.iter().any(|have| have.split('.').next() == Some(d));
            if !present {
                return Err(EngineError::Unavailable {
                    engine: "openvino".into(),
                    reason: format!(
                        "OpenVINO found no {d} device (devices here: {})",
                        devices.join(", ")
                    ),
                });
            }
        }
        let o = &a.options;
        let precision = InferencePrecision::of(a.precision);
        Ok(CompileOptions {
            kernel,
            device,
            precision,
            performance: match o.performance {
                Some(PerformanceHint::Throughput) => "THROUGHPUT",
                _ => "LATENCY",
            }
            .into(),
            execution_mode: match o.determinism {
                Determinism::Bitwise | Determinism::Tolerance => "ACCURACY",
                Determinism::Off => "PERFORMANCE",
            }
            .into(),
            threads: o.threads,
            fallback: o.fallback != Fallback::Deny,
        })
    }

    /// (device, key, value) to set on the core before compiling. Hints go to every real
    /// device the compile uses; AUTO gets its fallback switches.
    pub(crate) fn properties(
        &self,
        devices: &[String],
        profiled: bool,
    ) -> Vec<(String, String, String)> {
        let real: Vec<String> = match self.device.as_str() {
            "AUTO" => {
                devices.iter().map(|d| d.split('.').next().unwrap_or(d).to_string()).collect()
            }
            d => d.trim_start_matches("HETERO:").split(',').map(str::to_string).collect(),
        };
        let mut out = Vec::new();
        for d in real {
            let mut set = |k: &str, v: String| out.push((d.clone(), k.to_string(), v));
            set("INFERENCE_PRECISION_HINT", self.precision.hint().into());
            set("PERFORMANCE_HINT", self.performance.clone());
            set("EXECUTION_MODE_HINT", self.execution_mode.clone());
            if let Some(t) = self.threads.filter(|_| d == "CPU") {
                set("INFERENCE_NUM_THREADS", t.to_string());
            }
            set("PERF_COUNT", if profiled { "YES" } else { "NO" }.into());
        }
        if self.device == "AUTO" {
            let yes = if self.fallback { "YES" } else { "NO" };
            out.push(("AUTO".into(), "ENABLE_STARTUP_FALLBACK".into(), yes.into()));
            out.push(("AUTO".into(), "ENABLE_RUNTIME_FALLBACK".into(), yes.into()));
        }
        out
    }

    /// The options as explanation facts (`openvino.option.*`).
    pub fn describe(&self) -> Vec<(String, String)> {
        let mut v = vec![
            ("kernel".to_string(), self.kernel.clone()),
            ("INFERENCE_PRECISION_HINT".into(), self.precision.hint().into()),
            ("PERFORMANCE_HINT".into(), self.performance.clone()),
            ("EXECUTION_MODE_HINT".into(), self.execution_mode.clone()),
            (
                "INFERENCE_NUM_THREADS".into(),
                self.threads.map(|t| t.to_string()).unwrap_or("default".into()),
            ),
        ];
        if self.device == "AUTO" {
            v.push(("ENABLE_RUNTIME_FALLBACK".into(), self.fallback.to_string()));
        }
        v
    }
}
