//! One job, end to end, for every front end (`xpuctl run`, the REPL, `xpud`): load a
//! program (MiniLang, SGR-ML or ONNX) inside its data roots, plan it under a policy on this
//! process's engines (through a plan cache when given one), run the plan with GraphExec and
//! return the outputs with the explanation of the run. Also the tensor and table file
//! formats jobs read and write (re-exported from `xpu-tensorfile`). No I/O beyond the program's own files; no printing.

pub mod policy_tests;
pub mod program;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;

use xpu_engine::{Inventory, Registry, StopToken};
use xpu_ir::{Graph, Tensor};
use xpu_plan::{
    CapturePlan, ExecError, Explanation, GraphExec, Keys, PlanCache, PlanFailure, PreparedCache,
};
use xpu_policy::Policy;

pub use program::{Compiled, ProgramError, ProgramKind};
/// The tensor and table file formats (their own crate, so that parsers can be fuzzed alone).
pub use xpu_tensorfile as tensors;

/// Where engines that load a runtime library at run time find it, from configuration
/// (`[engines.ort] library`, `[engines.openvino] library_dir`). Each engine's environment
/// variable overrides these; with neither, the engine looks in `.deps/` (`make setup`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EngineLibraries {
    /// The cpu engine's OpenBLAS (`[engines.cpu] blas_library`); `None`: `$XPU_BLAS_LIBRARY`,
    /// else numpy's OpenBLAS from `make setup`/`make install`, else the system's.
    #[serde(default)]
    pub blas: Option<PathBuf>,
    pub ort: Option<PathBuf>,
    pub openvino_dir: Option<PathBuf>,
    /// Where OpenVINO keeps compiled models between runs (`[engines.openvino] cache_dir`).
    pub openvino_cache_dir: Option<PathBuf>,
    /// Where the llvm engine keeps compiled kernels between runs (`[engines.llvm]
    /// cache_dir`); `None`: its default (`$XPU_CACHE_DIR/llvm` or `~/.cache/xpu/llvm`).
    pub llvm_cache_dir: Option<PathBuf>,
    /// The command that runs riscv64 programs for the llvm engine's riscv64 device
    /// (`[engines.llvm] riscv_runner`); `None`: `$XPU_RISCV_RUNNER`, else `qemu-riscv64`.
    pub llvm_riscv_runner: Option<Vec<String>>,
    /// The instruction set of the llvm engine's host code (`[engines.llvm] host_cpu`);
    /// `None`: `$XPU_LLVM_HOST_CPU`, else `native`.
    #[serde(default)]
    pub llvm_host_cpu: Option<xpu_engine::HostCpu>,
    /// The ISA the llvm engine's riscv64 device builds for (`[engines.llvm] riscv_cpu`);
    /// `None`: `$XPU_RISCV_CPU`, else `rv64gc`.
    #[serde(default)]
    pub llvm_riscv_cpu: Option<xpu_engine::RiscvCpu>,
    /// Where the cuda engine finds libcuda, NVRTC and ptxas (`[engines.cuda] library_dir`).
    pub cuda_library_dir: Option<PathBuf>,
    /// Where the cuda engine keeps compiled kernels (`[engines.cuda] cache_dir`); `None`:
    /// `$XPU_CACHE_DIR/cuda` or `~/.cache/xpu/cuda`.
    pub cuda_cache_dir: Option<PathBuf>,
}

/// The engines a process loads once and shares between jobs: cpu, and ort, openvino, llvm
/// and cuda when built (each `Unavailable` with the reason when its library is missing).
#[derive(Clone)]
pub struct SharedEngines {
    engines: Vec<Arc<dyn xpu_engine::Engine>>,
}

impl std::fmt::Debug for SharedEngines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.engines.iter().map(|e| e.name())).finish()
    }
}

impl SharedEngines {
    /// Registers cpu at once; the engines that load a runtime library (ort, openvino) load
    /// it when first asked for their capabilities or to prepare, so commands that never plan
    /// never pay for it.
    pub fn load(libraries: &EngineLibraries) -> SharedEngines {
        // One BLAS per process: a second, different path is not loaded (the first stays).
        xpu_engine_cpu::configure_blas(libraries.blas.clone());
        let mut engines: Vec<Arc<dyn xpu_engine::Engine>> =
            vec![Arc::new(xpu_engine_cpu::CpuEngine::new())];
        #[cfg(feature = "ort")]
        {
            let path = libraries.ort.clone();
            engines.push(Arc::new(Deferred::new("ort", move || {
                Arc::new(xpu_engine_ort::OrtEngine::load(path.as_deref()))
            })));
        }
        #[cfg(feature = "openvino")]
        {
            let (dir, cache) =
                (libraries.openvino_dir.clone(), libraries.openvino_cache_dir.clone());
            engines.push(Arc::new(Deferred::new("openvino", move || {
                Arc::new(
                    xpu_engine_openvino::OpenVinoEngine::load(dir.as_deref()).with_cache_dir(cache),
                )
            })));
        }
        #[cfg(feature = "llvm")]
        {
            let cache = libraries
                .llvm_cache_dir
                .clone()
                .or_else(xpu_engine_llvm::LlvmEngine::default_cache_dir);
            let (runner, host_cpu, riscv_cpu) = (
                libraries.llvm_riscv_runner.clone(),
                libraries.llvm_host_cpu,
                libraries.llvm_riscv_cpu,
            );
            engines.push(Arc::new(Deferred::new("llvm", move || {
                Arc::new(xpu_engine_llvm::LlvmEngine::configured(
                    cache, runner, host_cpu, riscv_cpu,
                ))
            })));
        }
        #[cfg(feature = "cuda")]
        {
            let config = xpu_engine_cuda::CudaConfig {
                library_dir: libraries.cuda_library_dir.clone(),
                cache_dir: libraries
                    .cuda_cache_dir
                    .clone()
                    .or_else(xpu_engine_cuda::CudaEngine::default_cache_dir),
            };
            engines.push(Arc::new(Deferred::new("cuda", move || {
                Arc::new(xpu_engine_cuda::CudaEngine::new(config))
            })));
        }
        let _ = libraries;
        SharedEngines { engines }
    }

    /// [`load`](SharedEngines::load), with the engines `workers` names run in supervised
    /// worker processes instead of this one (docs/daemon.md, "Isolation"), including those
    /// this build does not link.
    pub fn load_isolated(libraries: &EngineLibraries, workers: &worker::Workers) -> SharedEngines {
        let mut shared = SharedEngines::load(libraries);
        for e in &mut shared.engines {
            if workers.engines.iter().any(|n| n == e.name()) {
                *e = Arc::new(workers.engine(e.name(), libraries));
            }
        }
        // An engine this build leaves out (the Python module is built without LLVM) runs
        // only in the worker program, which has it; a worker that cannot start makes it
        // unavailable with the reason.
        // It takes its usual place in the order (the inventory's and the default policy's).
        const ORDER: [&str; 5] = ["cpu", "ort", "openvino", "llvm", "cuda"];
        let rank = |name: &str| ORDER.iter().position(|n| *n == name).unwrap_or(ORDER.len());
        for name in &workers.engines {
            if shared.get(name).is_none() && name != "table" {
                let at = shared.engines.iter().position(|e| rank(e.name()) > rank(name));
                let engine: Arc<dyn xpu_engine::Engine> = Arc::new(workers.engine(name, libraries));
                shared.engines.insert(at.unwrap_or(shared.engines.len()), engine);
            }
        }
        shared
    }

    /// The engine called `name`, if this build has it.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn xpu_engine::Engine>> {
        self.engines.iter().find(|e| e.name() == name)
    }

    /// A job's engines: the shared ones and `table`, the job's own table engine (its
    /// DuckDB connection is the job's).
    pub fn registry(&self, table: xpu_engine_table::TableEngine) -> Registry {
        let mut r = Registry::new();
        for e in &self.engines {
            r.register(e.clone());
        }
        r.register(Arc::new(table));
        r
    }
}

/// An engine loaded at its first use (capabilities or prepare), not when registered: a
/// process that never asks for it never loads its library. (Not on a thread of its own: a
/// process exiting while a native library is half loaded can crash in its destructors.)
struct Deferred {
    name: &'static str,
    engine: std::sync::OnceLock<Arc<dyn xpu_engine::Engine>>,
    load: std::sync::Mutex<Option<Box<dyn FnOnce() -> Arc<dyn xpu_engine::Engine> + Send>>>,
}

impl Deferred {
    fn new(
        name: &'static str,
        load: impl FnOnce() -> Arc<dyn xpu_engine::Engine> + Send + 'static,
    ) -> Deferred {
        Deferred {
            name,
            engine: std::sync::OnceLock::new(),
            load: std::sync::Mutex::new(Some(Box::new(load))),
        }
    }

    fn get(&self) -> &Arc<dyn xpu_engine::Engine> {
        self.engine.get_or_init(|| match self.load.lock().ok().and_then(|mut l| l.take()) {
            Some(load) => load(),
            // Only reachable if a previous load panicked while holding the lock.
            None => Arc::new(Absent(self.name)),
        })
    }
}

impl xpu_engine::Engine for Deferred {
    fn name(&self) -> &str {
        self.name
    }

    fn version(&self) -> String {
        self.get().version()
    }

    fn capabilities(&self) -> xpu_engine::Capabilities {
        self.get().capabilities()
    }

    fn classes_without_loading(&self) -> Option<Vec<xpu_ir::OpClass>> {
        // ort and openvino take any ONNX op.
        Some(xpu_engine::dylib::onnx_classes())
    }

    fn prepare(
        &self,
        partition: &Graph,
        assignment: &xpu_engine::Assignment,
    ) -> Result<Box<dyn xpu_engine::Executable>, xpu_engine::EngineError> {
        self.get().prepare(partition, assignment)
    }

    fn device_memory(&self, device: xpu_engine::DeviceId) -> bool {
        self.get().device_memory(device)
    }

    fn pinned_staging(&self, device: xpu_engine::DeviceId) -> Option<u64> {
        self.get().pinned_staging(device)
    }

    fn poisoned(&self) -> Option<String> {
        // Never loads: an engine not loaded yet has run nothing.
        self.engine.get().and_then(|e| e.poisoned())
    }

    fn upload(
        &self,
        tensor: &Tensor,
        device: xpu_engine::DeviceId,
        host: xpu_engine::HostMemory,
    ) -> Result<xpu_engine::Value, xpu_engine::EngineError> {
        self.get().upload(tensor, device, host)
    }

    fn download(
        &self,
        buffer: &dyn xpu_engine::DeviceBuffer,
        host: xpu_engine::HostMemory,
    ) -> Result<Tensor, xpu_engine::EngineError> {
        self.get().download(buffer, host)
    }
}

/// An engine whose loader panicked (the engines' own loaders report failures as data).
struct Absent(&'static str);

impl xpu_engine::Engine for Absent {
    fn name(&self) -> &str {
        self.0
    }

    fn version(&self) -> String {
        String::new()
    }

    fn capabilities(&self) -> xpu_engine::Capabilities {
        xpu_engine::Capabilities::absent(
            self.0,
            xpu_engine::Availability::Unavailable { reason: "its loader panicked".into() },
        )
    }

    fn prepare(
        &self,
        _: &Graph,
        _: &xpu_engine::Assignment,
    ) -> Result<Box<dyn xpu_engine::Executable>, xpu_engine::EngineError> {
        Err(xpu_engine::EngineError::Unavailable {
            engine: self.0.into(),
            reason: "its loader panicked".into(),
        })
    }
}

/// The engines of this build with libraries found by default: the shared engines, and the
/// table engine with its DuckDB connection confined to `roots` (created when a job first
/// uses it).
pub fn registry_for(roots: &[PathBuf]) -> Registry {
    SharedEngines::load(&EngineLibraries::default())
        .registry(xpu_engine_table::TableEngine::new(roots.to_vec()))
}

/// [`registry_for`] with the engines that load native code in worker processes
/// (`xpuctl run --isolate`; docs/daemon.md, "Isolation").
pub fn isolated_registry_for(roots: &[PathBuf]) -> Registry {
    SharedEngines::load_isolated(&EngineLibraries::default(), &worker::Workers::native())
        .registry(xpu_engine_table::TableEngine::new(roots.to_vec()))
}

/// Why a planned job did not produce outputs.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("no plan under policy {policy}:\n{failure}")]
    NoPlan { policy: String, failure: Box<PlanFailure> },
    #[error("cannot prepare the plan: {0}")]
    Prepare(ExecError),
    #[error("run failed: {0}")]
    Exec(ExecError),
}

impl RunError {
    /// The explanation made before the failure (a failed plan explains why it failed).
    pub fn explanation(&self) -> Option<&Explanation> {
        match self {
            RunError::NoPlan { failure, .. } => Some(&failure.explanation),
            _ => None,
        }
    }
}

/// A job that ran.
#[derive(Debug)]
pub struct Ran {
    /// In graph-output order, with their names.
    pub outputs: Vec<(String, Tensor)>,
    /// The plan's explanation with the run's timings, transfers and engine facts.
    pub explanation: Explanation,
    pub plan: Arc<CapturePlan>,
    /// Whether the plan came from the cache.
    pub cache_hit: bool,
    pub plan_nanos: u64,
    pub run_nanos: u64,
}

impl Ran {
    /// The engines that ran partitions, sorted, `+`-joined (`cpu+table`).
    pub fn engines(&self) -> String {
        let engines: std::collections::BTreeSet<&str> =
            self.plan.partitions.iter().map(|p| p.engine.as_str()).collect();
        engines.into_iter().collect::<Vec<_>>().join("+")
    }
}

/// What folds constants in the pass pipeline before planning: the cpu engine's reference
/// kernels (a pure computation, whatever engines the policy allows for the run itself).
pub fn fold_evaluator() -> Arc<dyn xpu_ir::passes::Evaluator> {
    Arc::new(xpu_engine_cpu::CpuEvaluator)
}

/// Plans `graph` (passes included, constants folded by [`fold_evaluator`]) without a cache:
/// what `xpuctl policy resolve|test|diff` show is what a run would plan.
pub fn plan_graph(
    graph: &Graph,
    policy: &Policy,
    inventory: &Inventory,
    bindings: &std::collections::BTreeMap<String, u64>,
) -> Result<(CapturePlan, Explanation), PlanFailure> {
    let shared = Arc::new(graph.clone());
    let hash = graph.content_hash();
    let eval = fold_evaluator();
    xpu_plan::plan_shared(&shared, &hash, policy, inventory, bindings, Some(eval.as_ref()))
}

/// Plans `graph` under `policy` for these inputs on `registry`'s engines and runs it.
pub fn plan_and_run(
    graph: &Arc<Graph>,
    inputs: &[Tensor],
    policy: &Policy,
    registry: &Registry,
    cache: Option<&PlanCache>,
) -> Result<Ran, RunError> {
    let inventory = registry.inventory_for(graph);
    let planned = plan_job(graph, inputs, policy, &inventory, cache, None)?;
    run_planned(graph, planned, inputs, registry, &StopToken::default(), None)
}

/// A plan made (or found in the cache) for one job, not yet run.
#[derive(Debug)]
pub struct Planned {
    pub plan: Arc<CapturePlan>,
    pub explanation: Explanation,
    pub cache_hit: bool,
    pub plan_nanos: u64,
}

impl Planned {
    /// The engines the plan's partitions run on, sorted and distinct.
    pub fn engines(&self) -> Vec<&str> {
        let engines: std::collections::BTreeSet<&str> =
            self.plan.partitions.iter().map(|p| p.engine.as_str()).collect();
        engines.into_iter().collect()
    }
}

/// Plans `graph` under `policy` for these inputs on the engines of `inventory`, through
/// `cache` when given. `keys` are the graph's hash and the inventory's fingerprint when the
/// caller already knows them (a warm daemon): the cache lookup then hashes nothing.
pub fn plan_job(
    graph: &Arc<Graph>,
    inputs: &[Tensor],
    policy: &Policy,
    inventory: &Inventory,
    cache: Option<&PlanCache>,
    keys: Option<Keys<'_>>,
) -> Result<Planned, RunError> {
    let start = std::time::Instant::now();
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let no_plan = |f: PlanFailure| RunError::NoPlan {
        policy: policy.name().to_string(),
        failure: Box::new(f),
    };
    let (plan, explanation, cache_hit) = match cache {
        Some(cache) => {
            let (cached, hit) = match keys {
                Some(keys) => cache.get_or_plan_keyed(graph, policy, inventory, &shapes, keys),
                None => cache.get_or_plan(graph, policy, inventory, &shapes),
            }
            .map_err(no_plan)?;
            (cached.0.clone(), cached.1.clone(), hit)
        }
        None => {
            let bindings = xpu_plan::bind_symbols(graph, &shapes);
            let hash = keys.map_or_else(|| graph.content_hash(), |k| k.graph_hash.to_string());
            let eval = fold_evaluator();
            let (p, e) = xpu_plan::plan_shared(
                graph,
                &hash,
                policy,
                inventory,
                &bindings,
                Some(eval.as_ref()),
            )
            .map_err(no_plan)?;
            (Arc::new(p), e, false)
        }
    };
    let plan_nanos = start.elapsed().as_nanos() as u64;
    Ok(Planned { plan, explanation, cache_hit, plan_nanos })
}

/// Runs an already made plan (a frozen one, or one from [`plan_and_run`]'s cache).
pub fn run_plan(
    graph: &Graph,
    plan: Arc<CapturePlan>,
    explanation: Explanation,
    inputs: &[Tensor],
    registry: &Registry,
    cache_hit: bool,
    start: std::time::Instant,
) -> Result<Ran, RunError> {
    let planned =
        Planned { plan, explanation, cache_hit, plan_nanos: start.elapsed().as_nanos() as u64 };
    run_planned(graph, planned, inputs, registry, &StopToken::default(), None)
}

/// Runs `plan` until it ends or `stop` stops it, on a GraphExec from `prepared` when given
/// (given back after a successful run), else prepared for this run alone: the run's record,
/// outputs included, not yet merged into an explanation (callers that rarely explain a run,
/// such as the Python package's sessions, merge it only when asked).
pub fn run_record(
    plan: &Arc<CapturePlan>,
    inputs: &[Tensor],
    registry: &Registry,
    stop: &StopToken,
    prepared: Option<&PreparedCache>,
) -> Result<xpu_plan::RunRecord, RunError> {
    let mut exec = match prepared {
        Some(cache) => cache.checkout(plan, registry),
        None => GraphExec::new(plan.clone(), registry),
    }
    .map_err(RunError::Prepare)?;
    let record = exec.run_until(inputs, stop).map_err(RunError::Exec)?;
    if let Some(cache) = prepared {
        cache.checkin(exec);
    }
    Ok(record)
}

/// Runs a plan from [`plan_job`] until it ends or `stop` stops it, on a GraphExec from
/// `prepared` when given (reused if one of this plan is idle there, and given back after a
/// successful run), else prepared for this run alone.
pub fn run_planned(
    graph: &Graph,
    planned: Planned,
    inputs: &[Tensor],
    registry: &Registry,
    stop: &StopToken,
    prepared: Option<&PreparedCache>,
) -> Result<Ran, RunError> {
    let Planned { plan, mut explanation, cache_hit, plan_nanos } = planned;
    let record = run_record(&plan, inputs, registry, stop, prepared)?;
    // The run alone, as GraphExec timed it (a prepare for this run is not in it).
    let run_nanos = record.wall_nanos;
    explanation.record_run(&record);
    let outputs = graph.outputs.iter().map(|o| o.name.clone()).zip(record.outputs).collect();
    Ok(Ran { outputs, explanation, plan, cache_hit, plan_nanos, run_nanos })
}

#[cfg(test)]
mod tests {
    use super::Deferred;
    use std::sync::Arc;
    use xpu_engine::Engine;

    /// An engine that says its process is poisoned (as cuda does after a sticky error).
    struct Poisoned;

    impl Engine for Poisoned {
        fn name(&self) -> &str {
            "cuda"
        }
        fn version(&self) -> String {
            String::new()
        }
        fn capabilities(&self) -> xpu_engine::Capabilities {
            xpu_engine::Capabilities::absent("cuda", xpu_engine::Availability::Available)
        }
        fn prepare(
            &self,
            _: &xpu_ir::Graph,
            _: &xpu_engine::Assignment,
        ) -> Result<Box<dyn xpu_engine::Executable>, xpu_engine::EngineError> {
            Err(xpu_engine::EngineError::Other("poisoned".into()))
        }
        fn poisoned(&self) -> Option<String> {
            Some("a sticky error".into())
        }
    }

    #[test]
    fn a_deferred_engine_passes_on_poisoned_without_loading_for_it() {
        // The worker asks after every reply: the engine xpu-worker hosts is wrapped.
        let engine = Deferred::new("cuda", || Arc::new(Poisoned));
        assert_eq!(engine.poisoned(), None, "not loaded: nothing ran, nothing loaded to ask");
        assert!(engine.engine.get().is_none(), "asking did not load it");
        let _ = engine.version();
        assert_eq!(engine.poisoned().as_deref(), Some("a sticky error"));
    }
}
