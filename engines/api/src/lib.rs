//! The engine API: what every execution engine (cpu, llvm, cuda, ort, openvino, table)
//! implements and how the rest of xpu talks to it. An engine reports its capabilities —
//! ops × dtypes per named kernel, devices, and whether it is available at all, as data —
//! prepares an executable for a graph partition under an [`Assignment`] (engine, kernels,
//! precision, device, options; never a policy), and runs it, reporting outputs, per-node
//! timings and facts back.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use xpu_ir::{BorrowedTensor, DType, Graph, NodeId, Op, OpClass, Tensor};

pub use xpu_ir;

pub mod catalog;
pub mod device;
pub mod dylib;
pub mod host_cpu;
pub mod machine;
pub mod options;
mod registry;
pub mod riscv_cpu;
mod stop;
pub mod value;

pub use catalog::KernelId;
pub use device::{Device, DeviceId, DeviceKind, HostMemory, TransferDirection};
pub use dylib::{Loaded, LoadedOnce, find_upwards};
pub use host_cpu::HostCpu;
pub use machine::HostMachine;
pub use options::{EngineOptions, PrecisionName};
pub use registry::Registry;
pub use riscv_cpu::RiscvCpu;
pub use stop::{HookGuard, StopReason, StopToken};
pub use value::{DeviceBuffer, Value};

/// Whether an engine can run here. Never a panic: a missing library is data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Availability {
    Available,
    /// Compiled out: the cargo feature is off.
    SupportDisabled {
        feature: String,
    },
    /// Compiled in, but its library or device is missing here.
    Unavailable {
        reason: String,
    },
}

impl Availability {
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available)
    }
}

impl fmt::Display for Availability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Availability::Available => f.write_str("available"),
            Availability::SupportDisabled { feature } => {
                write!(f, "support disabled (built without feature `{feature}`)")
            }
            Availability::Unavailable { reason } => write!(f, "unavailable: {reason}"),
        }
    }
}

/// A named kernel and what it accepts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelCaps {
    /// `engine.kernel`, e.g. `cpu.gemm`.
    pub name: String,
    /// Ops it runs, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<Op>,
    /// Whole op classes it runs (declared inventories use these for broad kernels).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<OpClass>,
    pub dtypes: Vec<DType>,
    /// Whether the same inputs always give bit-identical outputs (no atomics-order
    /// reductions, no run-to-run algorithm choice). `determinism = "bitwise"` policies use
    /// only these.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub deterministic: bool,
    #[serde(default)]
    pub description: String,
    /// The kind of device it runs on, where it differs from the catalogue's
    /// (`catalog::kernel_device`): `llvm.riscv` on a riscv64 board running xpu itself is
    /// `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceKind>,
    /// When not empty, every input and output of a node must have one of these dtypes —
    /// for kernels that hold only some types in memory (`llvm.fused` stores no u8), where
    /// `dtypes` alone (the dtype a node computes at) would let such a node through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operand_dtypes: Vec<DType>,
    /// Ops that compute at fewer dtypes than `dtypes` lists (`llvm.fused` adds integers
    /// but not integer `exp`): a node of an op named here runs only at the dtypes its
    /// entries list. Ops not named take every dtype of `dtypes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub op_dtypes: Vec<OpDtypes>,
    /// Why the kernel runs here below what the machine can do (`cpu.blas` over a BLAS that
    /// does not know the CPU), or `None`. The planner places a node on a degraded kernel
    /// only when the policy names it or no other kernel of the engine can run the node
    /// (reason `KernelDegraded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
}

/// A narrower dtype list for some of a kernel's ops.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpDtypes {
    pub ops: Vec<Op>,
    pub dtypes: Vec<DType>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl KernelCaps {
    /// The kind of device it runs on: its own `device`, else the catalogue's; `None` for a
    /// kernel the catalogue does not know.
    pub fn device_kind(&self) -> Option<DeviceKind> {
        self.device.or_else(|| catalog::kernel_device(&self.name))
    }

    pub fn runs_op(&self, op: Op) -> bool {
        self.ops.contains(&op) || self.classes.contains(&op.class())
    }

    pub fn supports(&self, op: Op, dtype: DType) -> bool {
        self.runs_op(op) && self.takes(op, dtype)
    }

    /// Whether a node of `op` may compute at `dtype` here: `dtype` is one of `dtypes` and of
    /// every `op_dtypes` entry naming `op`.
    pub fn takes(&self, op: Op, dtype: DType) -> bool {
        self.dtypes.contains(&dtype)
            && self
                .op_dtypes
                .iter()
                .filter(|e| e.ops.contains(&op))
                .all(|e| e.dtypes.contains(&dtype))
    }

    /// The first of `operands` (a node's input and output dtypes) this kernel cannot hold.
    pub fn unheld_operand(&self, operands: impl IntoIterator<Item = DType>) -> Option<DType> {
        if self.operand_dtypes.is_empty() {
            return None;
        }
        operands.into_iter().find(|d| !self.operand_dtypes.contains(d))
    }
}

/// An engine's capability report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    pub engine: String,
    pub version: String,
    pub availability: Availability,
    #[serde(default)]
    pub devices: Vec<Device>,
    /// In the engine's own preference order.
    #[serde(default)]
    pub kernels: Vec<KernelCaps>,
    /// Known kernels of an available engine that cannot run here, with why (`openvino.npu`:
    /// no NPU device). Plans that pin one say this reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unavailable_kernels: BTreeMap<String, String>,
}

impl Capabilities {
    /// Kernels able to run `op` on `dtype`, in preference order.
    pub fn kernels_for(&self, op: Op, dtype: DType) -> impl Iterator<Item = &KernelCaps> {
        self.kernels.iter().filter(move |k| k.supports(op, dtype))
    }

    pub fn kernel(&self, name: &str) -> Option<&KernelCaps> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// A capability report for an engine that cannot run here.
    pub fn absent(engine: &str, availability: Availability) -> Capabilities {
        Capabilities {
            engine: engine.into(),
            version: String::new(),
            availability,
            devices: Vec::new(),
            kernels: Vec::new(),
            unavailable_kernels: BTreeMap::new(),
        }
    }

    pub fn supports(&self, op: Op, dtype: DType) -> bool {
        self.kernels_for(op, dtype).next().is_some()
    }
}

/// Every engine known to a process or declared for a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    /// What machine this describes (`live` for the running process).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default)]
    pub engines: Vec<Capabilities>,
    /// The host's CPU (live inventories; a declared one may say which machine it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostMachine>,
    /// What the file should change to stay loadable (old device forms), for the reader.
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// An inventory file that cannot be read: the message names `line:col` when it can.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", location.map(|(l, c)| format!("{l}:{c}: ")).unwrap_or_default())]
pub struct InventoryError {
    pub location: Option<(usize, usize)>,
    pub message: String,
}

impl Inventory {
    /// Parses a TOML inventory (the form `xpuctl engines --format toml` writes).
    pub fn from_toml(text: &str) -> Result<Inventory, InventoryError> {
        let inv: Inventory = toml::from_str(text).map_err(|e| {
            let location = e.span().map(|s| line_col(text, s.start));
            InventoryError { location, message: e.message().trim().to_string() }
        })?;
        let mut inv = inv;
        inv.notes = legacy_device_notes(text);
        let mut seen = std::collections::BTreeSet::new();
        for e in &inv.engines {
            if !seen.insert(e.engine.as_str()) {
                return Err(InventoryError {
                    location: None,
                    message: format!("engine `{}` is listed twice", e.engine),
                });
            }
            for k in &e.kernels {
                if !k.name.starts_with(&format!("{}.", e.engine)) {
                    return Err(InventoryError {
                        location: None,
                        message: format!(
                            "kernel `{}` of engine `{}` must be named `{}.<kernel>`",
                            k.name, e.engine, e.engine
                        ),
                    });
                }
            }
        }
        Ok(inv)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("inventory serializes to TOML")
    }

    pub fn engine(&self, name: &str) -> Option<&Capabilities> {
        self.engines.iter().find(|e| e.engine == name)
    }

    /// Stable hash of the inventory (plan-cache keys, explanations).
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let json = serde_json::to_vec(self).expect("inventory serializes");
        Sha256::digest(&json).iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

/// One note per device written the old way (`name` + `kind`), saying what to write instead.
fn legacy_device_notes(text: &str) -> Vec<String> {
    let Ok(doc) = text.parse::<toml::Table>() else { return Vec::new() };
    let mut notes = Vec::new();
    let engines = doc.get("engines").and_then(|e| e.as_array()).map(Vec::as_slice).unwrap_or(&[]);
    for (i, e) in engines.iter().enumerate() {
        let devices = e.get("devices").and_then(|d| d.as_array()).map(Vec::as_slice).unwrap_or(&[]);
        for (j, d) in devices.iter().enumerate() {
            let Some(kind) = d.get("kind").and_then(|k| k.as_str()) else { continue };
            let name = d.get("name").and_then(|n| n.as_str()).unwrap_or("");
            if let Ok(id) = device::id_from_name_and_kind(name, kind) {
                notes.push(format!(
                    "engines[{i}].devices[{j}]: `name = {name:?}, kind = {kind:?}` is the old device form, read as id = \"{id}\"; write `id = \"{id}\"` instead"
                ));
            }
        }
    }
    notes
}

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

/// What the planner decided for a partition: the engine receives this, never a policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    pub engine: String,
    /// Kernel per node of the partition; nodes not listed use the engine's default.
    pub kernels: BTreeMap<NodeId, String>,
    /// Compute precision, when the plan sets one (`tf32` and `int8` are engine modes: the
    /// graph's dtypes stay); `None` keeps the graph's dtypes.
    pub precision: Option<PrecisionName>,
    pub device: DeviceId,
    pub options: EngineOptions,
}

impl Assignment {
    pub fn new(engine: &str) -> Assignment {
        Assignment { engine: engine.to_string(), ..Default::default() }
    }
}

/// Wall time of one node, with the kernel that ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTiming {
    pub node: NodeId,
    pub kernel: String,
    pub nanos: u64,
}

/// Something an engine observed and wants in the explanation (e.g. ORT's provider per node).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fact {
    pub node: Option<NodeId>,
    pub key: String,
    pub value: String,
}

/// The result of one execution: host tensors from [`Executable::run`], [`Value`]s from
/// [`Executable::run_values`].
#[derive(Clone, Debug, PartialEq)]
pub struct Execution<O = Tensor> {
    pub outputs: Vec<O>,
    pub timings: Vec<NodeTiming>,
    pub facts: Vec<Fact>,
}

/// Why an engine could not prepare or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("engine {engine} is not available here: {reason}")]
    Unavailable { engine: String, reason: String },
    #[error("{node}: {engine} does not support {what}")]
    Unsupported { engine: String, node: String, what: String },
    #[error("input {name:?}: {message}")]
    Input { name: String, message: String },
    #[error("{node}: {message}")]
    Kernel { node: String, message: String },
    /// The run was stopped (cancelled, or past its deadline) before `node`.
    #[error("{node}: stopped ({reason})")]
    Stopped { node: String, reason: StopReason },
    /// The run needed more than the policy's `memory.limit`.
    #[error("{what}: needs {needed} bytes, over memory.limit ({limit} bytes)")]
    MemoryLimit { what: String, needed: u64, limit: u64 },
    /// The device had not enough free memory: what was asked, what the device had free, and
    /// what the engine itself held there (its arenas, workspaces and bound buffers) — the
    /// part a smaller `memory.limit` or another pool could give back.
    #[error(
        "{device}: out of memory: {requested} bytes requested, {available} available, {reserved} held by the engine"
    )]
    OutOfMemory { device: DeviceId, requested: u64, available: u64, reserved: u64 },
    /// A device value was asked of an engine that keeps none on that device (it computes on
    /// the host, or the buffer is another engine's).
    #[error("{engine} keeps no values on {device}: cannot {what}")]
    NoDevice { engine: String, device: DeviceId, what: Arc<str> },
    /// An assignment option the engine cannot take.
    #[error("{engine}: option {key} = {value:?}: {expected}")]
    InvalidOption { engine: Arc<str>, key: Arc<str>, value: String, expected: Arc<str> },
    /// A step that cannot be recorded into a device graph was met while capturing one (a
    /// library call that allocates, a host synchronisation): the engine runs the partition
    /// uncaptured instead, and says so.
    #[error("{engine}: {node}: {what} inside a graph capture")]
    Uncapturable { engine: String, node: String, what: String },
    /// The engine's worker process died while it ran `node` (a signal, an abort, an exit):
    /// only the jobs on that worker fail; the next use starts a new one.
    #[error("{node}: engine {engine} crashed ({cause}); its worker is restarted")]
    Crashed { engine: String, node: String, cause: String },
    /// A partition that crashed the engine's worker again and again is refused rather than
    /// crash it once more.
    #[error("{node}: refused: it crashed engine {engine}'s worker {crashes} times (quarantined)")]
    Quarantined { engine: String, node: String, crashes: u32 },
    #[error("{0}")]
    Other(String),
}

impl EngineError {
    /// A stable label for the kind of error (API error codes, metric labels).
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::Unavailable { .. } => "unavailable",
            EngineError::Unsupported { .. } => "unsupported",
            EngineError::Input { .. } => "input",
            EngineError::Kernel { .. } => "kernel",
            EngineError::Stopped { .. } => "stopped",
            EngineError::MemoryLimit { .. } => "memory_limit",
            EngineError::OutOfMemory { .. } => "out_of_memory",
            EngineError::InvalidOption { .. } => "invalid_option",
            EngineError::NoDevice { .. } => "no_device",
            EngineError::Uncapturable { .. } => "uncapturable",
            EngineError::Crashed { .. } => "engine_crashed",
            EngineError::Quarantined { .. } => "quarantined",
            EngineError::Other(_) => "other",
        }
    }
}

/// An execution engine.
pub trait Engine: Send + Sync {
    fn name(&self) -> &str;
    fn version(&self) -> String;
    fn capabilities(&self) -> Capabilities;
    /// The op classes this engine could ever run, when known without loading anything
    /// (engines that load a runtime library at first use). `None`: ask `capabilities`.
    fn classes_without_loading(&self) -> Option<Vec<OpClass>> {
        None
    }
    /// Compiles a partition for repeated execution.
    fn prepare(
        &self,
        partition: &Graph,
        assignment: &Assignment,
    ) -> Result<Box<dyn Executable>, EngineError>;

    /// Whether this engine keeps values in `device`'s memory between partitions: its
    /// executables there take and return its [`DeviceBuffer`]s, and [`upload`](Engine::upload)
    /// / [`download`](Engine::download) move values in and out. `false` (every host engine,
    /// and engines such as ONNX Runtime's CUDA provider that copy inside their run): the
    /// engine takes host tensors and any transfer happens inside its run.
    fn device_memory(&self, _device: DeviceId) -> bool {
        false
    }

    /// The smallest transfer (bytes) that [`upload`](Engine::upload) and
    /// [`download`](Engine::download) on `device` stage through page-locked host memory
    /// when asked ([`HostMemory::Pinned`]); `None` when the engine never does.
    fn pinned_staging(&self, _device: DeviceId) -> Option<u64> {
        None
    }

    /// Copies a host tensor into a buffer on `device`, through `host` memory where the
    /// engine [stages pinned](Engine::stages_pinned).
    fn upload(
        &self,
        _tensor: &Tensor,
        device: DeviceId,
        _host: HostMemory,
    ) -> Result<Value, EngineError> {
        Err(EngineError::NoDevice {
            engine: self.name().to_string(),
            device,
            what: "upload a value to it".into(),
        })
    }

    /// Copies one of this engine's device buffers back to the host, through `host` memory
    /// where the engine [stages pinned](Engine::stages_pinned).
    fn download(
        &self,
        buffer: &dyn DeviceBuffer,
        _host: HostMemory,
    ) -> Result<Tensor, EngineError> {
        Err(EngineError::NoDevice {
            engine: self.name().to_string(),
            device: buffer.device(),
            what: "download a value from it".into(),
        })
    }

    /// Why this engine can take no more work in this process, if it cannot: a device error
    /// that poisons the process's driver state (CUDA's sticky errors — an illegal address,
    /// a trap — leave every context of the process unusable, new ones included). A worker
    /// hosting such an engine exits after its reply and the next job gets a fresh process.
    fn poisoned(&self) -> Option<String> {
        None
    }
}

/// A prepared partition.
pub trait Executable: Send {
    /// Runs with one tensor per graph input, in order; returns one per graph output. Inputs
    /// stay the caller's: an engine copies what it must keep.
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError>;

    /// [`run`](Executable::run), stopping when `stop` says so. Engines that run node by
    /// node check it between nodes; this default checks once before the whole partition.
    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        stop.check(|| "partition".into())?;
        self.run(inputs)
    }

    /// Runs on [`Value`]s. The default is a host engine's: every input must be a host tensor
    /// (a device buffer here means the plan lacks a transfer — an error, never a silent
    /// copy) and the outputs are host tensors. Engines with [`Engine::device_memory`] take
    /// their own buffers and return buffers.
    fn run_values(
        &mut self,
        inputs: &[Value],
        stop: &StopToken,
    ) -> Result<Execution<Value>, EngineError> {
        let mut host = Vec::with_capacity(inputs.len());
        for v in inputs {
            match v {
                Value::Host(t) => host.push(t.clone()),
                Value::Device(b) => {
                    return Err(EngineError::NoDevice {
                        engine: b.engine().to_string(),
                        device: b.device(),
                        what: "hand its buffer to a partition that computes on the host".into(),
                    });
                }
            }
        }
        let run = self.run_until(&host, stop)?;
        Ok(Execution {
            outputs: run.outputs.into_iter().map(Value::Host).collect(),
            timings: run.timings,
            facts: run.facts,
        })
    }

    /// Whether [`run_borrowed`](Executable::run_borrowed) reads borrowed elements where
    /// they lie. False (the default): it copies them into tensors first, and a caller that
    /// keeps buffers from run to run (a worker process) does better copying into those.
    fn reads_borrowed(&self) -> bool {
        false
    }

    /// [`run_until`](Executable::run_until) on inputs whose elements the caller lends for
    /// the run (a worker's shared memory). The default copies them into tensors.
    fn run_borrowed(
        &mut self,
        inputs: &[BorrowedTensor<'_>],
        stop: &StopToken,
    ) -> Result<Execution, EngineError> {
        // An input whose bytes are not its dtype's elements in its shape is refused, named
        // by its position.
        let tensors = inputs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                b.to_tensor()
                    .map_err(|message| EngineError::Input { name: format!("#{i}"), message })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.run_until(&tensors, stop)
    }
}

/// The message a caught panic carried (`panic!` with a literal or a formatted string), for
/// the errors that report it instead of taking the process down.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Checks run-time inputs against a graph's declared inputs: count, dtype, rank, static
/// dims and consistent binding of symbolic dims. Engines call this before running.
pub fn check_inputs(g: &Graph, inputs: &[Tensor]) -> Result<(), EngineError> {
    check_input_types(g, inputs.iter().map(|t| (t.dtype(), t.shape())))
}

/// [`check_inputs`] for inputs known by dtype and shape only (borrowed ones).
pub fn check_input_types<'a>(
    g: &Graph,
    inputs: impl ExactSizeIterator<Item = (DType, &'a [usize])>,
) -> Result<(), EngineError> {
    use xpu_ir::Dim;
    if inputs.len() != g.inputs.len() {
        return Err(EngineError::Other(format!(
            "the graph takes {} inputs ({}), got {}",
            g.inputs.len(),
            g.inputs
                .iter()
                .map(|&v| format!("{:?}", g.value(v).name.as_deref().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(", "),
            inputs.len()
        )));
    }
    let mut bound: BTreeMap<&str, usize> = BTreeMap::new();
    for (&v, (dtype, shape)) in g.inputs.iter().zip(inputs) {
        let val = g.value(v);
        let name = val.name.clone().unwrap_or_else(|| v.to_string());
        let err = |message: String| EngineError::Input { name: name.clone(), message };
        if dtype != val.ty.dtype {
            return Err(err(format!("expected dtype {}, got {dtype}", val.ty.dtype)));
        }
        let Some(dims) = &val.ty.dims else { continue };
        if dims.len() != shape.len() {
            return Err(err(format!(
                "expected shape {}, got rank {} {shape:?}",
                val.ty,
                shape.len()
            )));
        }
        for (i, (d, &n)) in dims.iter().zip(shape).enumerate() {
            match d {
                Dim::Known(k) if *k as usize != n => {
                    return Err(err(format!(
                        "dim {i} must be {k} (declared {}), got {n} in shape {shape:?}",
                        val.ty
                    )));
                }
                Dim::Sym(s) => {
                    if let Some(&prev) = bound.get(s.as_str()) {
                        if prev != n {
                            return Err(err(format!(
                                "dim {i} is symbol {s}, bound to {prev} by an earlier input, but is {n} here"
                            )));
                        }
                    } else {
                        bound.insert(s, n);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}
