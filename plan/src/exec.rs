//! GraphExec: runs a [`CapturePlan`] over the engines registered in this process. Each
//! partition is cut out of the planned graph, prepared once by its engine under the plan's
//! assignment, and run in order; values cross partitions through a value table. A plan that
//! needs an engine this process lacks is an error naming the engine and why — never a silent
//! run somewhere else.

use std::sync::Arc;
use std::time::Instant;

use xpu_engine::{
    DeviceId, Engine, EngineError, Executable, HostMemory, Registry, StopReason, StopToken,
    TransferDirection, Value,
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
    /// Moving a value between devices failed (an upload or a download).
    #[error("moving {value} {from} -> {to}: {error}")]
    Transfer { value: ValueId, from: DeviceId, to: DeviceId, error: EngineError },
    /// `at` says where it stopped: before a node, or at the end of a partition.
    #[error("the run exceeded execution.timeout ({limit_ms} ms) in partition {partition}, {at}")]
    Timeout { limit_ms: u64, partition: usize, at: String },
    #[error("the run was cancelled in partition {partition}, {at}")]
    Cancelled { partition: usize, at: String },
}

struct Prepared {
    partition: usize,
    engine: String,
    engine_ref: Arc<dyn Engine>,
    device: DeviceId,
    /// The engine keeps values in the device's memory: it takes and returns its buffers.
    device_memory: bool,
    inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
    /// Partition-local node → planned-graph node.
    sources: Vec<Option<NodeId>>,
    /// The partition's one timed (non-constant) node, if it has exactly one: a run whose
    /// engine reports no per-node times gives it the partition's time.
    sole_timed: Option<NodeId>,
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
    /// Per partition in plan order: its engine's run, as GraphExec timed it (inputs moved
    /// in not included). What a partition costs beyond its nodes' own times.
    pub partition_nanos: Vec<u64>,
    pub wall_nanos: u64,
}

/// A prepared, replayable plan.
pub struct GraphExec {
    plan: Arc<CapturePlan>,
    parts: Vec<Prepared>,
    /// Runs begun on it: the first one reports its partitions `prepared`, later ones
    /// `reused`.
    runs: u64,
    /// The host memory its transfers go through (`memory.pinned_host`).
    host: HostMemory,
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
                engine_ref: engine.clone(),
                device: p.device,
                device_memory: !p.device.is_host() && engine.device_memory(p.device),
                inputs,
                outputs,
                sole_timed: sole_timed(&plan.graph, &sources),
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
        // `memory.pinned_host` is one policy key: the plan's execution options carry it.
        let host = if plan.partitions.iter().any(|p| p.assignment.options.pinned_host) {
            HostMemory::Pinned
        } else {
            HostMemory::Pageable
        };
        Ok(GraphExec { plan, parts, runs: 0, weight_bytes, host })
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
        let mut values = ValueTable::new(g.values.len(), self.host);
        for (&v, t) in g.inputs.iter().zip(inputs) {
            values.set(v, Value::Host(t.clone()));
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
            partition_nanos: Vec::with_capacity(self.parts.len()),
            wall_nanos: 0,
        };
        let stopped = |reason: StopReason, partition: usize, at: String| match reason {
            StopReason::Cancelled => ExecError::Cancelled { partition, at },
            StopReason::DeadlinePassed => {
                ExecError::Timeout { limit_ms: limit.unwrap_or(0), partition, at }
            }
        };
        let engines: Vec<Arc<dyn Engine>> =
            self.parts.iter().map(|p| p.engine_ref.clone()).collect();
        for p in &mut self.parts {
            let mut args = Vec::with_capacity(p.inputs.len());
            for &v in &p.inputs {
                args.push(values.argument(v, p, &engines, &mut record.transfers)?);
            }
            let began = Instant::now();
            let exec = p.exe.run_values(&args, stop).map_err(|error| match error {
                EngineError::Stopped { node, reason } => {
                    stopped(reason, p.partition, format!("before node {node}"))
                }
                error => {
                    ExecError::Engine { partition: p.partition, engine: p.engine.clone(), error }
                }
            })?;
            record.partition_nanos.push(began.elapsed().as_nanos() as u64);
            drop(args);
            for (&v, out) in p.outputs.iter().zip(exec.outputs) {
                values.set(v, out);
            }
            let reported = record.timings.len();
            for t in exec.timings {
                if let Some(Some(node)) = p.sources.get(t.node.index()) {
                    let placed = &self.plan.placements[node.index()];
                    // Evidence only of the planned kernel's own time: not a node timed
                    // inside another's (a fused epilogue's 0 ns) or under another name (a
                    // captured CUDA graph's share).
                    let own = t.nanos > 0 && *placed.kernel == *t.kernel;
                    record.timings.push(NodeTime {
                        node: *node,
                        engine: p.engine.clone(),
                        signature: placed.signature.filter(|_| own),
                        kernel: t.kernel,
                        nanos: t.nanos,
                    });
                }
            }
            if record.timings.len() == reported {
                // An engine that times only the whole partition (ONNX Runtime and OpenVINO
                // past a first, profiled run): a partition of one timed node is that node.
                let nanos = record.partition_nanos.last().copied().unwrap_or(0);
                if let Some(node) = p.sole_timed {
                    let placed = &self.plan.placements[node.index()];
                    record.timings.push(NodeTime {
                        node,
                        engine: p.engine.clone(),
                        kernel: placed.kernel.to_string(),
                        nanos,
                        signature: placed.signature,
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
            let t = values.output_on_host(o.value, &engines, &mut record.transfers)?;
            record.outputs.push(t);
        }
        record.wall_nanos = start.elapsed().as_nanos() as u64;
        Ok(record)
    }
}

/// A partition's one timed node (constants are not timed); `None` for several or none.
fn sole_timed(g: &xpu_ir::Graph, sources: &[Option<NodeId>]) -> Option<NodeId> {
    let mut timed = sources.iter().flatten().filter(|n| g.node(**n).op != xpu_ir::Op::Constant);
    let node = *timed.next()?;
    timed.next().is_none().then_some(node)
}

/// The values of one run, by planned-graph value id: where each lives now, and the host
/// copy a download made (so a value read on the host twice is downloaded once).
struct ValueTable {
    values: Vec<Option<Value>>,
    host_copies: Vec<Option<Tensor>>,
    /// The host memory transfers go through (`memory.pinned_host`).
    host: HostMemory,
}

impl ValueTable {
    fn new(n: usize, host: HostMemory) -> ValueTable {
        ValueTable { values: vec![None; n], host_copies: vec![None; n], host }
    }

    /// Whether a transfer of `bytes` by `engine` on `device` went through pinned staging.
    fn pinned(&self, engine: &dyn Engine, device: DeviceId, bytes: u64) -> bool {
        self.host == HostMemory::Pinned
            && engine.pinned_staging(device).is_some_and(|least| bytes >= least)
    }

    fn set(&mut self, v: ValueId, value: Value) {
        self.values[v.index()] = Some(value);
    }

    fn get(&self, v: ValueId) -> &Value {
        self.values[v.index()].as_ref().expect("plan order defines values before use")
    }

    /// Value `v` as partition `p` takes it, performing (and recording) the transfer the plan
    /// lists when it lives elsewhere. An engine with device memory gets its own buffer on
    /// its device — passed straight from an adjacent partition of the same engine and
    /// device, else uploaded; any other engine gets a host tensor, downloaded from a device
    /// if need be, and moves it to its device inside its run.
    fn argument(
        &mut self,
        v: ValueId,
        p: &Prepared,
        engines: &[Arc<dyn Engine>],
        done: &mut Vec<TransferDone>,
    ) -> Result<Value, ExecError> {
        let current = self.get(v).clone();
        let from = current.device();
        if p.device_memory && current.buffer_of(&p.engine, p.device).is_some() {
            return Ok(current);
        }
        if !p.device_memory
            && p.device.is_host()
            && let Some(t) = &self.host_copies[v.index()]
        {
            return Ok(Value::Host(t.clone()));
        }
        let bytes = current.size_bytes();
        let mut by = Vec::new();
        let mut nanos = None;
        let mut pinned_host = false;
        let host = match &current {
            Value::Host(t) => t.clone(),
            Value::Device(buffer) => {
                let started = Instant::now();
                let (t, pinned) = self.download_once(v, engines, p.device)?;
                nanos = Some(started.elapsed().as_nanos() as u64);
                by.push(buffer.engine().to_string());
                pinned_host |= pinned;
                t
            }
        };
        let arg = if p.device_memory {
            let started = Instant::now();
            let up = p
                .engine_ref
                .upload(&host, p.device, self.host)
                .map_err(|error| ExecError::Transfer { value: v, from, to: p.device, error })?;
            *nanos.get_or_insert(0) += started.elapsed().as_nanos() as u64;
            by.push(p.engine.clone());
            pinned_host |= self.pinned(p.engine_ref.as_ref(), p.device, bytes);
            up
        } else {
            if !p.device.is_host() {
                by.push(p.engine.clone());
            }
            Value::Host(host)
        };
        if let Some(direction) = TransferDirection::between(from, p.device) {
            by.dedup();
            done.push(TransferDone {
                value: v,
                direction,
                from_device: from,
                to_device: p.device,
                bytes,
                nanos,
                by: by.join(" -> "),
                pinned_host,
            });
        }
        Ok(arg)
    }

    /// Value `v` in host memory for the caller (a graph output), downloaded if it lives on
    /// a device, and the download recorded.
    fn output_on_host(
        &mut self,
        v: ValueId,
        engines: &[Arc<dyn Engine>],
        done: &mut Vec<TransferDone>,
    ) -> Result<Tensor, ExecError> {
        let current = self.get(v).clone();
        let Value::Device(buffer) = &current else {
            return Ok(current.as_host().expect("a host value").clone());
        };
        let started = Instant::now();
        let (t, pinned_host) = self.download_once(v, engines, DeviceId::HOST)?;
        done.push(TransferDone {
            value: v,
            direction: TransferDirection::DeviceToHost,
            from_device: buffer.device(),
            to_device: DeviceId::HOST,
            bytes: buffer.size_bytes(),
            nanos: Some(started.elapsed().as_nanos() as u64),
            by: buffer.engine().to_string(),
            pinned_host,
        });
        Ok(t)
    }

    /// The host copy of device value `v`, downloading it through its owner the first time,
    /// and whether that download went through pinned staging (false for a kept copy).
    fn download_once(
        &mut self,
        v: ValueId,
        engines: &[Arc<dyn Engine>],
        to: DeviceId,
    ) -> Result<(Tensor, bool), ExecError> {
        if let Some(t) = &self.host_copies[v.index()] {
            return Ok((t.clone(), false));
        }
        let Value::Device(buffer) = self.get(v) else {
            unreachable!("only device values are downloaded")
        };
        let from = buffer.device();
        let engine = engines.iter().find(|e| e.name() == buffer.engine()).ok_or_else(|| {
            ExecError::Transfer {
                value: v,
                from,
                to,
                error: EngineError::NoDevice {
                    engine: buffer.engine().to_string(),
                    device: from,
                    what: "download a buffer of an engine this plan does not run".into(),
                },
            }
        })?;
        let t = engine
            .download(buffer.as_ref(), self.host)
            .map_err(|error| ExecError::Transfer { value: v, from, to, error })?;
        let pinned = self.pinned(engine.as_ref(), from, buffer.size_bytes());
        self.host_copies[v.index()] = Some(t.clone());
        Ok((t, pinned))
    }
}
