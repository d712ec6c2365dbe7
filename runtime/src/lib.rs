//! One job, end to end, for every front end (`xpuctl run`, the REPL, `xpud`): load a
//! program (MiniLang, SGR-ML or ONNX) inside its data roots, plan it under a policy on this
//! process's engines (through a plan cache when given one), run the plan with GraphExec and
//! return the outputs with the explanation of the run. Also the tensor and table file
//! formats jobs read and write. No I/O beyond the program's own files; no printing.

pub mod program;
pub mod tensors;

use std::path::PathBuf;
use std::sync::Arc;

use xpu_engine::Registry;
use xpu_ir::{Graph, Tensor};
use xpu_plan::{CapturePlan, ExecError, Explanation, GraphExec, PlanCache, PlanFailure};
use xpu_policy::Policy;

pub use program::{Compiled, ProgramError, ProgramKind};

/// The engines of this build: the CPU engine, and the table engine with its DuckDB
/// connection confined to `roots` (created when a job first uses it).
pub fn registry_for(roots: &[PathBuf]) -> Registry {
    let mut r = Registry::new();
    r.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    r.register(Arc::new(xpu_engine_table::TableEngine::new(roots.to_vec())));
    r
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

/// Plans `graph` under `policy` for these inputs on `registry`'s engines and runs it.
pub fn plan_and_run(
    graph: &Arc<Graph>,
    inputs: &[Tensor],
    policy: &Policy,
    registry: &Registry,
    cache: Option<&PlanCache>,
) -> Result<Ran, RunError> {
    let start = std::time::Instant::now();
    let inventory = registry.inventory();
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let no_plan = |f: PlanFailure| RunError::NoPlan {
        policy: policy.name().to_string(),
        failure: Box::new(f),
    };
    let (plan, explanation, cache_hit) = match cache {
        Some(cache) => {
            let (cached, hit) =
                cache.get_or_plan(graph, policy, &inventory, &shapes).map_err(no_plan)?;
            (Arc::new(cached.0.clone()), cached.1.clone(), hit)
        }
        None => {
            let bindings = xpu_plan::bind_symbols(graph, &shapes);
            let (p, e) =
                xpu_plan::plan_shared(graph, &graph.content_hash(), policy, &inventory, &bindings)
                    .map_err(no_plan)?;
            (Arc::new(p), e, false)
        }
    };
    run_plan(graph, plan, explanation, inputs, registry, cache_hit, start)
}

/// Runs an already made plan (a frozen one, or one from [`plan_and_run`]'s cache).
pub fn run_plan(
    graph: &Graph,
    plan: Arc<CapturePlan>,
    mut explanation: Explanation,
    inputs: &[Tensor],
    registry: &Registry,
    cache_hit: bool,
    start: std::time::Instant,
) -> Result<Ran, RunError> {
    let plan_nanos = start.elapsed().as_nanos() as u64;
    let mut exec = GraphExec::new(plan.clone(), registry).map_err(RunError::Prepare)?;
    let run_start = std::time::Instant::now();
    let record = exec.run(inputs).map_err(RunError::Exec)?;
    let run_nanos = run_start.elapsed().as_nanos() as u64;
    explanation.record_run(&record);
    let outputs = graph.outputs.iter().map(|o| o.name.clone()).zip(record.outputs).collect();
    Ok(Ran { outputs, explanation, plan, cache_hit, plan_nanos, run_nanos })
}
