//! The openvino engine: OpenVINO behind xpu's engine API. Its libraries are loaded at run
//! time (the `openvino` wheel's `libs/`, fetched by `make setup`); when they are missing the
//! engine stays registered as `Unavailable{reason}`. It compiles whole ONNX models as given
//! ([`OpenVinoEngine::prepare_model`]) and SGR-ML partitions exported to ONNX, for the device
//! its kernels name: `openvino.cpu`, `openvino.gpu`, `openvino.npu`, `openvino.auto` (several
//! in one partition: HETERO). The policy's precision, performance, determinism, threads and
//! fallback map onto OpenVINO's hints ([`options`], table in `docs/engines.md`). Compiled
//! models are cached by model hash + options (and on disk when a cache dir is configured).
//! The first run of each compiled model also runs a profiled twin once: the execution
//! devices and every layer's primitive and runtime precision go into the explanation.

mod ffi;
pub mod options;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};
use xpu_engine::{
    Assignment, Availability, Capabilities, Device, Engine, EngineError, Executable, Execution,
    Fact, KernelCaps, NodeTiming, StopToken,
};
use xpu_ir::{DType, Graph, NodeId, Tensor};

pub use ffi::Layer;
pub use options::CompileOptions;

pub const ENGINE: &str = "openvino";
/// Overrides every configured library directory.
pub const LIBRARY_ENV: &str = "XPU_OPENVINO_DIR";
/// Where `make setup` puts the libraries (searched upwards from the working directory).
pub const DEPS_PATH: &str = ".deps/openvino/libopenvino_c.so";

/// Finds `libopenvino_c.so`: `$XPU_OPENVINO_DIR`, then the configured directory, then
/// `.deps/openvino/` in the working directory or one of its parents.
pub fn locate(configured_dir: Option<&Path>) -> Result<PathBuf, String> {
    let in_dir = |d: PathBuf| if d.is_dir() { d.join("libopenvino_c.so") } else { d };
    if let Some(d) = std::env::var_os(LIBRARY_ENV).filter(|d| !d.is_empty()) {
        return Ok(in_dir(PathBuf::from(d)));
    }
    if let Some(d) = configured_dir {
        return Ok(in_dir(d.to_path_buf()));
    }
    xpu_engine::find_upwards(Path::new(DEPS_PATH)).ok_or_else(|| {
        format!(
            "no OpenVINO libraries: set [engines.openvino] library_dir or ${LIBRARY_ENV}, or run `make setup` (it puts them in .deps/openvino/)"
        )
    })
}

/// OpenVINO as loaded into this process (once: the C API table is process-global).
struct Runtime {
    version: String,
    devices: Vec<String>,
    /// Properties are set on the core per device before each compile: one compile at a time.
    core: Mutex<ffi::Core>,
}

static RUNTIME: xpu_engine::LoadedOnce<Runtime> = xpu_engine::LoadedOnce::new();

fn load(library: &Path) -> Result<Runtime, String> {
    ffi::load_library(library)?;
    let core = ffi::Core::new()?;
    let devices = core.available_devices()?;
    let version = library_version(library);
    Ok(Runtime { version, devices, core: Mutex::new(core) })
}

/// `libopenvino_c.so.2641` → `2026.4.1`; the wheel's file names carry no other version.
fn library_version(library: &Path) -> String {
    let real = std::fs::canonicalize(library).unwrap_or_else(|_| library.to_path_buf());
    let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.split_once(".so.") {
        Some((_, v)) if v.len() == 4 && v.chars().all(|c| c.is_ascii_digit()) => {
            format!("20{}.{}.{}", &v[..2], &v[2..3], &v[3..])
        }
        Some((_, v)) => v.to_string(),
        None => "unknown".into(),
    }
}

/// A compiled model and what its profiled first run taught.
struct CompiledEntry {
    compiled: ffi::Compiled,
    device: String,
    execution_devices: String,
    /// Kept until the first run compiles the profiled twin from it.
    model: Mutex<Option<Vec<u8>>>,
    layers: Mutex<Vec<Layer>>,
}

type Key = ([u8; 16], CompileOptions);

/// The openvino engine. Clones share the runtime and the compiled-model cache.
#[derive(Clone)]
pub struct OpenVinoEngine {
    runtime: xpu_engine::Loaded<Runtime>,
    cache: Arc<Mutex<HashMap<Key, (u64, Arc<CompiledEntry>)>>>,
    clock: Arc<std::sync::atomic::AtomicU64>,
    cache_dir: Option<PathBuf>,
    profile: bool,
}

impl std::fmt::Debug for OpenVinoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenVinoEngine").field("availability", &self.availability()).finish()
    }
}

const CACHE_CAPACITY: usize = 64;

impl OpenVinoEngine {
    /// Loads OpenVINO from [`locate`]`(configured_dir)`. Never fails: missing libraries make
    /// an engine that reports `Unavailable` with the reason.
    pub fn load(configured_dir: Option<&Path>) -> OpenVinoEngine {
        let runtime =
            locate(configured_dir).and_then(|path| RUNTIME.get_or_load("OpenVINO C", &path, load));
        OpenVinoEngine {
            runtime,
            cache: Arc::default(),
            clock: Arc::default(),
            cache_dir: None,
            profile: true,
        }
    }

    /// Keeps compiled models on disk too (OpenVINO's CACHE_DIR): a restart skips compiling.
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> OpenVinoEngine {
        self.cache_dir = dir;
        self
    }

    /// No profiled first runs (conformance sweeps, benchmarks).
    pub fn without_profiling(mut self) -> OpenVinoEngine {
        self.profile = false;
        self
    }

    pub fn availability(&self) -> Availability {
        xpu_engine::dylib::availability(&self.runtime)
    }

    fn runtime(&self) -> Result<&Arc<Runtime>, EngineError> {
        xpu_engine::dylib::require(ENGINE, &self.runtime)
    }

    /// Compiles a whole ONNX model as given; `name` names it in errors.
    pub fn prepare_model(
        &self,
        name: &str,
        model: &[u8],
        assignment: &Assignment,
    ) -> Result<OpenVinoExecutable, EngineError> {
        let rt = self.runtime()?;
        let opts = CompileOptions::from_assignment(assignment, &rt.devices)?;
        let entry = self.compiled(rt, name, model, &opts)?;
        OpenVinoExecutable::new(name, entry, opts, None, self.clone(), Some(declared_inputs(model)))
    }

    fn compiled(
        &self,
        rt: &Runtime,
        name: &str,
        model: &[u8],
        opts: &CompileOptions,
    ) -> Result<Arc<CompiledEntry>, EngineError> {
        let mut hash = [0u8; 16];
        hash.copy_from_slice(&Sha256::digest(model)[..16]);
        let key = (hash, opts.clone());
        let tick = self.clock.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let lock_err =
            |_| EngineError::Other("openvino: compiled-model cache lock poisoned".into());
        if let Some((used, e)) = self.cache.lock().map_err(lock_err)?.get_mut(&key) {
            *used = tick;
            return Ok(e.clone());
        }
        let compiled = self.compile(rt, name, model, opts, false)?;
        let execution_devices = compiled.property("EXECUTION_DEVICES").unwrap_or_default();
        let entry = Arc::new(CompiledEntry {
            compiled,
            device: opts.device.clone(),
            execution_devices,
            model: Mutex::new(self.profile.then(|| model.to_vec())),
            layers: Mutex::new(Vec::new()),
        });
        let mut cache = self.cache.lock().map_err(lock_err)?;
        if cache.len() >= CACHE_CAPACITY
            && let Some(oldest) = cache.iter().min_by_key(|(_, (u, _))| *u).map(|(k, _)| k.clone())
        {
            cache.remove(&oldest);
        }
        Ok(cache.entry(key).or_insert((tick, entry)).1.clone())
    }

    /// Reads and compiles `model` under `opts` (with per-layer profiling when `profiled`).
    fn compile(
        &self,
        rt: &Runtime,
        name: &str,
        model: &[u8],
        opts: &CompileOptions,
        profiled: bool,
    ) -> Result<ffi::Compiled, EngineError> {
        let reject = |m: String| EngineError::Other(format!("openvino: model {name}: {m}"));
        let mut core = rt
            .core
            .lock()
            .map_err(|_| EngineError::Other("openvino: core lock poisoned".into()))?;
        for (device, key, value) in opts.properties(&rt.devices, profiled) {
            core.set_property(&device, &key, &value).map_err(reject)?;
        }
        if let Some(dir) = &self.cache_dir {
            let dir = dir.to_string_lossy();
            core.set_property("", "CACHE_DIR", &dir).map_err(reject)?;
        }
        let m = core.read_onnx(model).map_err(reject)?;
        let compiled = core.compile(&m, &opts.device).map_err(reject)?;
        Ok(compiled)
    }
}

impl Engine for OpenVinoEngine {
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
        let classes = xpu_engine::dylib::onnx_classes();
        let mut kernels = Vec::new();
        let mut unavailable_kernels = BTreeMap::new();
        let devices_here = rt.devices.join(", ");
        for (kernel, device, description) in options::KERNELS {
            let present = *device == "AUTO" && !rt.devices.is_empty()
                || rt.devices.iter().any(|d| d.split('.').next() == Some(device));
            if !present {
                unavailable_kernels.insert(
                    kernel.to_string(),
                    format!("OpenVINO found no {device} device (devices here: {devices_here})"),
                );
                continue;
            }
            kernels.push(KernelCaps {
                device: None,
                // Every input and output too (a cast to f8 reads f32 but writes f8).
                operand_dtypes: ffi::dtypes(),
                op_dtypes: Vec::new(),
                name: (*kernel).into(),
                ops: Vec::new(),
                classes: classes.clone(),
                dtypes: ffi::dtypes(),
                // With EXECUTION_MODE_HINT = ACCURACY (determinism set) the CPU plugin's
                // results do not change run to run.
                deterministic: *device == "CPU",
                description: (*description).into(),
                degraded: None,
            });
        }
        Capabilities {
            engine: ENGINE.into(),
            version: rt.version.clone(),
            availability: Availability::Available,
            // The CPU plugin works in host memory: no transfer to plan for it.
            devices: rt
                .devices
                .iter()
                .filter_map(|d| {
                    // `GPU.1` is the second GPU; a plugin of a kind xpu has no memory
                    // domain for is left out.
                    let kind = d.split('.').next().unwrap_or(d).to_ascii_lowercase();
                    let id = xpu_engine::device::id_from_name_and_kind(d, &kind).ok()?;
                    Some(Device { id, name: d.clone(), memory_bytes: None })
                })
                .collect(),
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
        if let Some(v) = partition.inputs.iter().find(|&&v| partition.ty(v).dtype == DType::String)
        {
            return Err(EngineError::Unsupported {
                engine: ENGINE.into(),
                node: partition.value(*v).name.clone().unwrap_or_default(),
                what: "string tensors".into(),
            });
        }
        // The plan's precision (set when it lowered the partition) is the hint.
        let opts = CompileOptions::from_assignment(assignment, &rt.devices)?;
        let mut named = partition.clone();
        for (i, n) in named.nodes.iter_mut().enumerate() {
            n.name = Some(format!("xpu_n{i}"));
        }
        let model = xpu_onnx::export_model(&named);
        let entry = self.compiled(rt, &partition.name, &model, &opts)?;
        let declared = declared_inputs(&model);
        Ok(Box::new(OpenVinoExecutable::new(
            &partition.name,
            entry,
            opts,
            Some(partition.clone()),
            self.clone(),
            Some(declared),
        )?))
    }
}

/// The partition node a layer name came from (`xpu_n3`, or a fused `xpu_n3/...`); a layer
/// that computes a partition output takes that output's name, so it maps to the output's
/// producer.
fn node_of(layer: &str, partition: &Graph) -> Option<NodeId> {
    let Some(at) = layer.find("xpu_n").map(|at| at + "xpu_n".len()) else {
        let out = partition.outputs.iter().find(|o| o.name == layer)?;
        return partition.producer(out.value);
    };
    let digits: String = layer[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok().map(NodeId)
}

/// A compiled model with its own infer request.
pub struct OpenVinoExecutable {
    name: String,
    entry: Arc<CompiledEntry>,
    request: ffi::Request,
    opts: CompileOptions,
    partition: Option<Graph>,
    engine: OpenVinoEngine,
    /// How many inputs the caller passes (the model's declared inputs).
    inputs: usize,
    /// For each compiled-model input, the caller's input it reads: OpenVINO drops declared
    /// inputs nothing reads (Dropout's ratio in inference), so positions can shift.
    binding: Vec<usize>,
    outputs: usize,
    /// Facts every run reports (device, execution devices, options).
    fixed_facts: Vec<Fact>,
}

/// The declared (non-initializer) input names of an ONNX model, in order.
fn declared_inputs(model: &[u8]) -> Vec<String> {
    use prost::Message;
    let Ok(m) = xpu_onnx::proto::ModelProto::decode(model) else { return Vec::new() };
    let Some(g) = m.graph else { return Vec::new() };
    let inits: std::collections::HashSet<&str> =
        g.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    g.input.iter().filter_map(|i| i.name.clone()).filter(|n| !inits.contains(n.as_str())).collect()
}

impl OpenVinoExecutable {
    fn new(
        name: &str,
        entry: Arc<CompiledEntry>,
        opts: CompileOptions,
        partition: Option<Graph>,
        engine: OpenVinoEngine,
        declared: Option<Vec<String>>,
    ) -> Result<OpenVinoExecutable, EngineError> {
        let fail = |m: String| EngineError::Other(format!("openvino: model {name}: {m}"));
        let request = entry.compiled.request().map_err(fail)?;
        let compiled_inputs = entry.compiled.inputs().map_err(fail)?;
        let outputs = entry.compiled.outputs().map_err(fail)?;
        let declared = declared.unwrap_or_default();
        let binding = (0..compiled_inputs)
            .map(|i| {
                let name = entry.compiled.input_name(i).unwrap_or_default();
                declared.iter().position(|d| *d == name).unwrap_or(i)
            })
            .collect();
        let mut fixed_facts = vec![
            Fact { node: None, key: "openvino.device".into(), value: entry.device.clone() },
            Fact {
                node: None,
                key: "openvino.execution_devices".into(),
                value: entry.execution_devices.clone(),
            },
        ];
        fixed_facts.extend(opts.describe().into_iter().map(|(k, v)| Fact {
            node: None,
            key: format!("openvino.option.{k}"),
            value: v,
        }));
        Ok(OpenVinoExecutable {
            fixed_facts,
            name: name.to_string(),
            entry,
            request,
            opts,
            partition,
            engine,
            inputs: declared.len().max(compiled_inputs),
            binding,
            outputs,
        })
    }

    /// Runs the profiled twin once per compiled model and keeps its layers; true when this
    /// call did.
    fn profile_once(&self, inputs: &[Tensor]) -> bool {
        let Some(model) = self.entry.model.lock().ok().and_then(|mut m| m.take()) else {
            return false;
        };
        let layers = (|| -> Result<Vec<Layer>, String> {
            let rt = self.engine.runtime().map_err(|e| e.to_string())?;
            let compiled = self
                .engine
                .compile(rt, &self.name, &model, &self.opts, true)
                .map_err(|e| e.to_string())?;
            let mut req = compiled.request()?;
            let mut bound = Vec::with_capacity(self.binding.len());
            for (i, &from) in self.binding.iter().enumerate() {
                let t = inputs.get(from).ok_or("an input is missing")?;
                bound.push(req.set_input(i, t)?);
            }
            req.infer()?;
            req.profile()
        })();
        if let Ok(mut l) = self.entry.layers.lock() {
            *l = layers.unwrap_or_else(|e| {
                vec![Layer {
                    name: String::new(),
                    layer_type: String::new(),
                    exec_type: format!("unknown (profile failed: {e})"),
                    executed: false,
                    real_us: 0,
                }]
            });
        }
        true
    }
}

impl Executable for OpenVinoExecutable {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        stop.check(|| "partition".into())?;
        if let Some(g) = &self.partition {
            xpu_engine::check_inputs(g, inputs)?;
        }
        let name = self.name.clone();
        if inputs.len() != self.inputs {
            return Err(EngineError::Input {
                name,
                message: format!("the model takes {} inputs, got {}", self.inputs, inputs.len()),
            });
        }
        let fail =
            |m: String| EngineError::Kernel { node: format!("openvino model {name}"), message: m };
        let mut bound = Vec::with_capacity(self.binding.len());
        for (i, &from) in self.binding.iter().enumerate() {
            let t = inputs.get(from).ok_or_else(|| EngineError::Input {
                name: self.name.clone(),
                message: format!("compiled input {i} reads input {from}, which was not given"),
            })?;
            bound.push(self.request.set_input(i, t).map_err(|m| EngineError::Input {
                name: format!("{} input {from}", self.name),
                message: m,
            })?);
        }
        let canceller = self.request.canceller();
        let hook = stop.on_stop(move || canceller.cancel());
        let start = Instant::now();
        let result = self.request.infer();
        let nanos = start.elapsed().as_nanos() as u64;
        drop(hook);
        if let Err(m) = result {
            stop.check(|| format!("openvino model {}", self.name))?;
            return Err(fail(m));
        }
        let outputs = (0..self.outputs)
            .map(|i| self.request.output(i).map_err(fail))
            .collect::<Result<Vec<_>, _>>()?;
        drop(bound);
        let profiled_now = self.engine.profile && self.profile_once(inputs);
        // Device and option facts are the same every run: made once, cloned here.
        let mut facts = self.fixed_facts.clone();
        let mut timings = Vec::new();
        let layers = self.entry.layers.lock().map(|l| l.clone()).unwrap_or_default();
        for l in layers.iter().filter(|l| l.executed || l.name.is_empty()) {
            let node = self.partition.as_ref().and_then(|p| node_of(&l.name, p));
            facts.push(Fact {
                node,
                key: "openvino.layer".into(),
                value: if l.name.is_empty() {
                    l.exec_type.clone()
                } else {
                    format!(
                        "{} ({}) ran as {}, {} µs",
                        l.name, l.layer_type, l.exec_type, l.real_us
                    )
                },
            });
            // Per-layer times are the profiled twin's: reported with the run that made them.
            if let Some(node) = node.filter(|_| profiled_now) {
                timings.push(NodeTiming {
                    node,
                    kernel: self.opts.kernel.clone(),
                    nanos: l.real_us.max(0) as u64 * 1000,
                });
            }
        }
        // The plugin may compute in another precision than the hint asked (f16 on a CPU
        // without fp16 arithmetic runs bf16): say so, with the layers that did.
        let asked = self.opts.precision.hint();
        let ran_other: Vec<&str> = layers
            .iter()
            .filter(|l| l.executed)
            .filter(|l| {
                let t = l.exec_type.to_ascii_lowercase();
                ["f32", "bf16", "f16"].iter().any(|p| *p != asked && t.ends_with(&format!("_{p}")))
                    && !t.ends_with(&format!("_{asked}"))
            })
            .filter(|l| l.layer_type != "Reorder" && l.layer_type != "Convert")
            .map(|l| l.exec_type.as_str())
            .collect();
        if asked != "f32" && !ran_other.is_empty() {
            facts.push(Fact {
                node: None,
                key: "openvino.precision_differs".into(),
                value: format!(
                    "INFERENCE_PRECISION_HINT = {asked}, but {} layer(s) ran as {}",
                    ran_other.len(),
                    ran_other.join(", ")
                ),
            });
        }
        facts.push(Fact {
            node: None,
            key: "openvino.run_us".into(),
            value: (nanos / 1000).to_string(),
        });
        Ok(Execution { outputs, timings, facts })
    }
}
