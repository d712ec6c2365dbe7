//! The ort engine: ONNX Runtime behind xpu's engine API. The runtime library is loaded at
//! run time (the `onnxruntime` wheel's `libonnxruntime.so`, fetched by `make setup`); when
//! it is missing or the wrong version the engine stays registered as `Unavailable{reason}`
//! and nothing of ORT is touched. It runs SGR-ML partitions exported to ONNX and whole ONNX
//! models handed over as they are ([`OrtEngine::prepare_model`]). The kernel picks the
//! execution provider (`ort.cpu`, `ort.cuda`, `ort.tensorrt`); the policy's options map onto
//! session and provider options ([`options`], documented in `docs/engines.md`). Sessions are
//! cached by model hash + options; the first run of each session is also profiled once, and
//! ORT's own per-node provider and time go into the explanation as facts.

mod convert;
mod cpu_gaps;
pub mod options;
mod profile;
mod session;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use xpu_engine::{
    Assignment, Availability, Capabilities, Device, DeviceId, DeviceKind, Engine, EngineError,
    Executable, KernelCaps,
};
use xpu_ir::{DType, Graph};

pub use options::SessionOptions;
pub use session::{OrtExecutable, SessionCache};

pub const ENGINE: &str = "ort";
/// The environment variable that overrides every configured library path.
pub const LIBRARY_ENV: &str = "XPU_ORT_LIBRARY";
/// Where `make setup` puts the library, relative to the repository (searched upwards from
/// the working directory).
pub const DEPS_PATH: &str = ".deps/onnxruntime/libonnxruntime.so";

/// ONNX Runtime as loaded into this process (once: ORT's API table is process-global).
struct Runtime {
    env: ort::environment::Environment,
    version: String,
    providers: Vec<String>,
}

static RUNTIME: xpu_engine::LoadedOnce<Runtime> = xpu_engine::LoadedOnce::new();

/// Finds the library: `$XPU_ORT_LIBRARY`, then the configured path, then `$ORT_DYLIB_PATH`,
/// then `.deps/onnxruntime/` in the working directory or one of its parents.
pub fn locate(configured: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(LIBRARY_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = configured {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    xpu_engine::find_upwards(Path::new(DEPS_PATH)).ok_or_else(|| {
        format!(
            "no ONNX Runtime library: set [engines.ort] library or ${LIBRARY_ENV}, or run `make setup` (it puts the library in {DEPS_PATH})"
        )
    })
}

fn load(library: &Path) -> Result<Runtime, String> {
    let builder = ort::init_from(library).map_err(|e| e.to_string())?;
    let env = builder.with_name("xpu").build().map_err(|e| e.to_string())?;
    // ORT's own log would repeat on stderr what every error already carries to the caller.
    env.set_log_level(ort::logging::LogLevel::Fatal);
    let version = ort_version(library);
    let providers = session::available_providers();
    Ok(Runtime { env, version, providers })
}

/// The release, from the library's real file name (`libonnxruntime.so.1.31.1`); ORT's
/// build-info string when the name has none.
fn ort_version(library: &Path) -> String {
    let real = std::fs::canonicalize(library).unwrap_or_else(|_| library.to_path_buf());
    let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.split_once(".so.") {
        Some((_, v)) if v.chars().next().is_some_and(|c| c.is_ascii_digit()) => v.to_string(),
        _ => ort::info().trim().to_string(),
    }
}

/// The ort engine. Cheap to clone; all clones share the loaded runtime and session cache.
#[derive(Clone)]
pub struct OrtEngine {
    runtime: xpu_engine::Loaded<Runtime>,
    cache: Arc<SessionCache>,
    /// Profile each session's first run once (ORT's per-node provider and time).
    profile: bool,
}

impl std::fmt::Debug for OrtEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtEngine").field("availability", &self.availability()).finish()
    }
}

impl OrtEngine {
    /// Loads ONNX Runtime from [`locate`]`(configured)`. Never fails: a missing or wrong
    /// library makes an engine that reports `Unavailable` with the reason. The first load
    /// in a process wins; a later call naming another file reports that.
    pub fn load(configured: Option<&Path>) -> OrtEngine {
        let runtime =
            locate(configured).and_then(|path| RUNTIME.get_or_load("ONNX Runtime", &path, load));
        OrtEngine { runtime, cache: Arc::new(SessionCache::new(64)), profile: true }
    }

    /// No profiled first runs (conformance sweeps, benchmarks of session creation): the
    /// explanation then has no per-node provider facts.
    pub fn without_profiling(mut self) -> OrtEngine {
        self.profile = false;
        self
    }

    pub fn availability(&self) -> Availability {
        xpu_engine::dylib::availability(&self.runtime)
    }

    fn runtime(&self) -> Result<&Arc<Runtime>, EngineError> {
        xpu_engine::dylib::require(ENGINE, &self.runtime)
    }

    /// Prepares a whole ONNX model as it is (no import or export), for an assignment whose
    /// options come from a plan. `name` names the model in errors.
    pub fn prepare_model(
        &self,
        name: &str,
        model: &[u8],
        assignment: &Assignment,
    ) -> Result<OrtExecutable, EngineError> {
        let rt = self.runtime()?;
        let opts = SessionOptions::from_assignment(assignment, &rt.providers)?;
        let session = self.cache.get_or_create(&rt.env, name, model, &opts)?;
        Ok(OrtExecutable::new(session, opts, None, rt.env.clone(), self.profile))
    }
}

impl Engine for OrtEngine {
    fn name(&self) -> &str {
        ENGINE
    }

    fn version(&self) -> String {
        self.runtime.as_ref().map(|r| r.version.clone()).unwrap_or_default()
    }

    fn capabilities(&self) -> Capabilities {
        let Ok(rt) = &self.runtime else {
            return Capabilities::absent(ENGINE, self.availability());
        };
        // ORT runs every ONNX op, at the types its CPU provider has kernels for.
        let classes = xpu_engine::dylib::onnx_classes();
        let mut kernels = Vec::new();
        let mut unavailable_kernels = std::collections::BTreeMap::new();
        let mut devices = vec![Device::host()];
        for (kernel, provider, description) in options::KERNELS {
            if !rt.providers.iter().any(|p| p == provider) {
                let reason = format!("this ONNX Runtime build has no {provider}");
                unavailable_kernels.insert(kernel.to_string(), reason);
                continue;
            }
            if *kernel != options::CPU_KERNEL && !session::cuda_device_present() {
                let reason = "no NVIDIA GPU on this machine".to_string();
                unavailable_kernels.insert(kernel.to_string(), reason);
                continue;
            }
            kernels.push(KernelCaps {
                device: None,
                // No node that reads or writes a low-precision value (a cast to f8, say):
                // the engine does not hand those to ORT.
                operand_dtypes: tensor_dtypes(),
                // The CUDA provider's gaps are not measured (no GPU here): it claims all.
                op_dtypes: if *kernel == options::CPU_KERNEL {
                    cpu_gaps::cpu_op_dtypes()
                } else {
                    Vec::new()
                },
                name: (*kernel).into(),
                ops: Vec::new(),
                classes: classes.clone(),
                // Every element type but tables (not tensors to ORT) and low precision.
                dtypes: tensor_dtypes(),
                deterministic: *kernel == options::CPU_KERNEL,
                description: (*description).into(),
                degraded: None,
            });
        }
        if kernels.iter().any(|k| k.name != options::CPU_KERNEL) {
            devices.push(Device {
                id: DeviceId::new(DeviceKind::Cuda, 0),
                name: String::new(),
                memory_bytes: None,
            });
        }
        Capabilities {
            engine: ENGINE.into(),
            version: rt.version.clone(),
            availability: Availability::Available,
            devices,
            kernels,
            unavailable_kernels,
        }
    }

    fn prepare(
        &self,
        partition: &Graph,
        assignment: &Assignment,
    ) -> Result<Box<dyn Executable>, EngineError> {
        let rt = self.runtime()?;
        let opts = SessionOptions::from_assignment(assignment, &rt.providers)?;
        // Node names carry the partition's node ids, so ORT's profile maps back onto them.
        let mut named = partition.clone();
        for (i, n) in named.nodes.iter_mut().enumerate() {
            n.name = Some(profile::node_name(i));
        }
        let model = xpu_onnx::export_model(&named);
        let session = self.cache.get_or_create(&rt.env, &partition.name, &model, &opts)?;
        Ok(Box::new(OrtExecutable::new(
            session,
            opts,
            Some(partition.clone()),
            rt.env.clone(),
            self.profile,
        )))
    }
}

/// The element types the engine hands ORT: every tensor type but the low-precision ones.
fn tensor_dtypes() -> Vec<DType> {
    DType::ALL.iter().copied().filter(|d| *d != DType::Table && !d.is_low_precision()).collect()
}
