//! GraphExec: runs a [`CapturePlan`] over the engines registered in this process. Each
//! partition is cut out of the planned graph, prepared once by its engine under the plan's
//! assignment, and run in order; values cross partitions through a value table. A plan that
//! needs an engine this process lacks is an error naming the engine and why — never a silent
//! run somewhere else.

use std::sync::Arc;
use std::time::Instant;

use xpu_engine::{
    DeviceId, EngineError, Executable, Registry, StopReason, StopToken, TransferDirection,
};
use xpu_ir::{NodeId, Tensor, ValueId};

use crate::model::{
    CapturePlan, EngineFact, NodeTime, PartitionPrepared, PrepareOutcome, TransferDone,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("engine {engine} is not available here: {reason}")]
    EngineAbsent { engine: String, reason: String },
    /// The engine's message is part of this one's text (not a `source`), so an error
    /// chain prints it once.
    #[error("partition {partition} ({engine}): {error}")]
    Engine { partition: usize, engine: String, error: EngineError },
    #[error("inputs: {0}")]
    Inputs(EngineError),
    /// `at` says where it stopped: before a node, or at the end of a partition.
    #[error("the run exceeded execution.timeout ({limit_ms} ms) in partition {partition}, {at}")]
    Timeout { limit_ms: u64, partition: usize, at: String },
    #[error("the run was cancelled in partition {partition}, {at}")]
    Cancelled { partition: usize, at: String },
}

struct Prepared {
    partition: usize,
    engine: String,
    device: DeviceId,
    inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
    /// Partition-local node → planned-graph node.
    sources: Vec<Option<NodeId>>,
    exe: Box<dyn Executable>,
    prepare_nanos: u64,
}

/// The outcome of one run: outputs in graph-output order, and what happened.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub outputs: Vec<Tensor>,
    pub timings: Vec<NodeTime>,
    pub transfers: Vec<TransferDone>,
    pub facts: Vec<EngineFact>,
    /// Per partition: prepared for this run (the GraphExec's first) or reused.
    pub prepared: Vec<PartitionPrepared>,
    pub wall_nanos: u64,
}

/// A prepared, replayable plan.
pub struct GraphExec {
    plan: Arc<CapturePlan>,
    parts: Vec<Prepared>,
    /// Runs begun on it: the first one reports its partitions `prepared`, later ones
    /// `reused`.
    runs: u64,
    /// Bytes of the constants (weights) its executables hold.
    weight_bytes: u64,
}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec").field("partitions", &self.parts.len()).finish()
    }
}

impl GraphExec {
    /// Prepares every partition of `plan` on its engine.
    pub fn new(plan: Arc<CapturePlan>, registry: &Registry) -> Result<GraphExec, ExecError> {
        let mut parts = Vec::with_capacity(plan.partitions.len());
        for p in &plan.partitions {
            let Some(engine) = registry.get(&p.engine) else {
                let reason = match xpu_engine::catalog::engine(&p.engine) {
                    Some(k) => format!(
                        "this build has no {} engine (cargo feature `{}`); the plan was made for inventory {:?}",
                        k.name, k.feature, plan.inventory.name
                    ),
                    None => format!(
                        "no engine of that name is registered; the plan was made for inventory {:?}",
                        plan.inventory.name
                    ),
                };
                return Err(ExecError::EngineAbsent { engine: p.engine.clone(), reason });
            };
            let caps = engine.capabilities();
            if !caps.availability.is_available() {
                return Err(ExecError::EngineAbsent {
                    engine: p.engine.clone(),
                    reason: caps.availability.to_string(),
                });
            }
            // A plan of one partition runs the planned graph itself: no copy of its constants.
            let whole = plan.partitions.len() == 1 && p.nodes.len() == plan.graph.nodes.len();
            let cut = (!whole).then(|| plan.graph.partition(&p.nodes));
            let (graph, inputs, outputs, sources) = match &cut {
                Some(part) => {
                    (&part.graph, part.inputs.clone(), part.outputs.clone(), part.sources.clone())
                }
                None => (
                    &*plan.graph,
                    plan.graph.inputs.clone(),
                    plan.graph.outputs.iter().map(|o| o.value).collect(),
                    plan.graph.node_ids().map(Some).collect(),
                ),
            };
            // Kernels come from the placements (by planned-graph node); the engine wants
            // partition-local ids. Constants run on the engine's own constant path.
            let mut assignment = p.assignment.clone();
            assignment.kernels = sources
                .iter()
                .enumerate()
                .filter_map(|(local, src)| {
                    let placement = plan.placements.get((*src)?.index())?;
                    (placement.op != "constant")
                        .then(|| (NodeId(local as u32), placement.kernel.to_string()))
                })
                .collect();
            let started = Instant::now();
            let exe = engine.prepare(graph, &assignment).map_err(|error| ExecError::Engine {
                partition: p.id,
                engine: p.engine.clone(),
                error,
            })?;
            let prepare_nanos = started.elapsed().as_nanos() as u64;
            parts.push(Prepared {
                partition: p.id,
                engine: p.engine.clone(),
                device: p.device,
                inputs,
                outputs,
                sources,
                exe,
                prepare_nanos,
            });
        }
        let weight_bytes = plan
            .graph
            .nodes
            .iter()
            .filter_map(|n| n.attrs.tensor("value"))
            .map(|t| t.size_bytes() as u64)
            .sum();
        Ok(GraphExec { plan, parts, runs: 0, weight_bytes })
    }

    pub fn plan(&self) -> &CapturePlan {
        &self.plan
    }

    /// The plan it was prepared for, shared.
    pub fn plan_arc(&self) -> &Arc<CapturePlan> {
        &self.plan
    }

    /// Bytes of the weights (constants) its prepared executables hold: what keeping it
    /// costs, for the prepared cache's byte bound.
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// Runs begun on it.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Runs the plan on one tensor per graph input.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<RunRecord, ExecError> {
        self.run_until(inputs, &StopToken::default())
    }

    /// [`run`](GraphExec::run) that stops when `stop` is cancelled (engines check it between
    /// nodes; DuckDB queries are interrupted) or when the plan's `execution.timeout` passes.
    pub fn run_until(
        &mut self,
        inputs: &[Tensor],
        stop: &StopToken,
    ) -> Result<RunRecord, ExecError> {
        let limit = self.plan.execution.timeout_ms;
        let own;
        let stop = match limit {
            Some(ms) => {
                // The caller's token may be the inert default, which carries no deadline.
                let stop = if stop.is_inert() {
                    own = StopToken::new();
                    &own
                } else {
                    stop
                };
                stop.set_deadline(std::time::Duration::from_millis(ms));
                stop
            }
            None => stop,
        };
        let g = &self.plan.graph;
        xpu_engine::check_inputs(g, inputs).map_err(ExecError::Inputs)?;
        let start = Instant::now();
        let mut values: Vec<Option<Tensor>> = vec![None; g.values.len()];
        let mut device_of: Vec<DeviceId> = vec![DeviceId::HOST; g.values.len()];
        for (&v, t) in g.inputs.iter().zip(inputs) {
            values[v.index()] = Some(t.clone());
        }
        let outcome =
            if self.runs == 0 { PrepareOutcome::Prepared } else { PrepareOutcome::Reused };
        self.runs += 1;
        let mut record = RunRecord {
            outputs: Vec::new(),
            timings: Vec::new(),
            transfers: Vec::new(),
            facts: Vec::new(),
            prepared: self
                .parts
                .iter()
                .map(|p| PartitionPrepared {
                    partition: p.partition,
                    engine: p.engine.clone(),
                    outcome,
                    prepare_nanos: p.prepare_nanos,
                })
                .collect(),
            wall_nanos: 0,
        };
        let stopped = |reason: StopReason, partition: usize, at: String| match reason {
            StopReason::Cancelled => ExecError::Cancelled { partition, at },
            StopReason::DeadlinePassed => {
                ExecError::Timeout { limit_ms: limit.unwrap_or(0), partition, at }
            }
        };
        for p in &mut self.parts {
            let mut args = Vec::with_capacity(p.inputs.len());
            for &v in &p.inputs {
                let t = values[v.index()].clone().expect("plan order defines values before use");
                if let Some(direction) = TransferDirection::between(device_of[v.index()], p.device)
                {
                    record.transfers.push(TransferDone {
                        value: v,
                        direction,
                        bytes: t.size_bytes() as u64,
                    });
                }
                args.push(t);
            }
            let exec = p.exe.run_until(&args, stop).map_err(|error| match error {
                EngineError::Stopped { node, reason } => {
                    stopped(reason, p.partition, format!("before node {node}"))
                }
                error => {
                    ExecError::Engine { partition: p.partition, engine: p.engine.clone(), error }
                }
            })?;
            for (&v, t) in p.outputs.iter().zip(exec.outputs) {
                values[v.index()] = Some(t);
                device_of[v.index()] = p.device;
            }
            for t in exec.timings {
                if let Some(Some(node)) = p.sources.get(t.node.index()) {
                    record.timings.push(NodeTime {
                        node: *node,
                        engine: p.engine.clone(),
                        kernel: t.kernel,
                        nanos: t.nanos,
                    });
                }
            }
            for f in exec.facts {
                let node = f.node.and_then(|n| p.sources.get(n.index()).copied().flatten());
                record.facts.push(EngineFact {
                    engine: p.engine.clone(),
                    node,
                    key: f.key,
                    value: f.value,
                });
            }
            if let Some(reason) = stop.reason() {
                return Err(stopped(reason, p.partition, "at its end".into()));
            }
        }
        for o in &g.outputs {
            let t = values[o.value.index()].clone().expect("outputs are computed");
            if !device_of[o.value.index()].is_host() {
                record.transfers.push(TransferDone {
                    value: o.value,
                    direction: TransferDirection::DeviceToHost,
                    bytes: t.size_bytes() as u64,
                });
            }
            record.outputs.push(t);
        }
        record.wall_nanos = start.elapsed().as_nanos() as u64;
        Ok(record)
    }
}
