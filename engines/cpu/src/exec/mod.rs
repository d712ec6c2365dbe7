//! The cpu engine's prepared executable: a partition cut into steps once (constants
//! resolved, kernels chosen, epilogues fused), then run any number of times over a pool of
//! buffers that executes the memory plan (`memory.reuse`, `memory.pool`,
//! `execution.capture`; see `pool.rs`). Each run reports its memory as facts: peak live and
//! held bytes, allocations, reused buffers, in-place writes and the capture outcome.

mod epilogue;
mod pool;
mod run;

use std::sync::Arc;

use xpu_engine::options::{Capture, GraphOptimization, Pool as PoolSetting, Reuse};
use xpu_engine::{Assignment, EngineError, Executable, Execution, Fact, StopToken};
use xpu_ir::{DType, Graph, NodeId, Op, OpClass, Tensor, ValueId};

use crate::Kernel;
pub(crate) use epilogue::Act;
use epilogue::{Epilogue, plan_epilogues};
use pool::Pool;

/// What one step computes.
enum Work {
    /// A constant node: its tensor, shared.
    Const(Arc<Tensor>),
    /// One node through the kernels (in place or into a pooled buffer where it can be).
    Node,
    /// A `Conv`, `MatMul` or `Gemm` with the nodes it absorbed.
    Fused(Epilogue),
}

/// One unit of execution: a node, or an anchor node with its fused epilogue.
struct Step {
    /// The node whose kernel runs (the anchor of a fused step).
    node: usize,
    work: Work,
    /// The values the step reads (its node's inputs and a fused residual).
    reads: Vec<ValueId>,
    /// The values it defines (for a fused step, the last absorbed node's output).
    outputs: Vec<ValueId>,
}

/// How the executable treats memory, from the assignment's options.
#[derive(Clone, Copy, Debug)]
struct MemoryMode {
    reuse: Reuse,
    pool: PoolSetting,
    capture: Capture,
}

pub(crate) struct CpuExecutable {
    graph: Graph,
    kernels: Vec<Kernel>,
    steps: Vec<Step>,
    /// Index of the last step reading each value (`usize::MAX`: graph output or unused).
    last_use: Vec<usize>,
    /// Declared output dtypes of each node (f16/bf16 results are narrowed to them).
    out_dtypes: Vec<Vec<DType>>,
    /// Workers for this executable when the assignment bounds threads.
    pool_threads: Option<Arc<crate::team::Team>>,
    /// The policy's memory.limit: the bytes of live tensors (inputs and computed values,
    /// constants aside — as the planner counts them) a run may hold at once.
    memory_limit: Option<u64>,
    mode: MemoryMode,
    buffers: Pool,
    /// im2col workspace, kept across runs.
    scratch: Vec<f32>,
    /// Input shapes of the last run (the pool's recorded assignment is for them).
    captured: Option<Vec<Vec<usize>>>,
    recaptures: u64,
    /// What every run reports the same: fused epilogues, nodes computed at prepare.
    prepared_facts: Vec<Fact>,
    /// Whether a node runs subgraphs (if, loop, scan): only then does a run publish its
    /// stop token for them.
    has_control: bool,
}

pub(crate) fn prepare(
    partition: &Graph,
    assignment: &Assignment,
) -> Result<Box<dyn Executable>, EngineError> {
    let mut kernels = Vec::with_capacity(partition.nodes.len());
    for id in partition.node_ids() {
        let node = partition.node(id);
        if matches!(node.op.class(), OpClass::Table | OpClass::Opaque) && node.op != Op::Constant {
            return Err(EngineError::Unsupported {
                engine: "cpu".into(),
                node: node.label(id),
                what: match node.op {
                    Op::OnnxOp => format!(
                        "ONNX op {} (an opaque node: an engine that takes ONNX runs it)",
                        node.attrs.str("op_type", "?")
                    ),
                    op => format!("op {op}"),
                },
            });
        }
        let k = match assignment.kernels.get(&id) {
            Some(name) => Kernel::parse(name, node.op).ok_or_else(|| EngineError::Unsupported {
                engine: "cpu".into(),
                node: node.label(id),
                what: format!("kernel {name} for op {}", node.op),
            })?,
            None => Kernel::default_for(node.op),
        };
        kernels.push(k);
    }
    let consts: Vec<Option<Arc<Tensor>>> = partition
        .nodes
        .iter()
        .map(|n| {
            (n.op == Op::Constant).then(|| n.attrs.tensor("value").cloned().map(Arc::new)).flatten()
        })
        .collect();
    // Epilogue fusion is one of the engine's own compound kernels: on unless the policy
    // keeps the graph as planned (graph_optimization none or basic).
    let fuse = !matches!(
        assignment.options.graph_optimization,
        Some(GraphOptimization::None | GraphOptimization::Basic)
    );
    let epilogues = if fuse { plan_epilogues(partition) } else { vec![] };
    let mut steps = cut_steps(partition, consts, epilogues);
    let out_dtypes: Vec<Vec<DType>> = partition
        .nodes
        .iter()
        .map(|n| n.outputs.iter().map(|&o| partition.ty(o).dtype).collect())
        .collect();
    let prepacked = hoist_constant_steps(partition, &mut steps, &kernels, &out_dtypes);
    let prepared_facts = prepared_facts(partition, &steps, &kernels, &prepacked);
    let mut last_use = vec![usize::MAX; partition.values.len()];
    for (si, step) in steps.iter().enumerate() {
        for v in &step.reads {
            last_use[v.index()] = si;
        }
    }
    // A value nobody reads dies where it is defined (as the memory plan has it).
    for (si, step) in steps.iter().enumerate() {
        for v in &step.outputs {
            if last_use[v.index()] == usize::MAX {
                last_use[v.index()] = si;
            }
        }
    }
    for o in &partition.outputs {
        last_use[o.value.index()] = usize::MAX;
    }
    let options = &assignment.options;
    Ok(Box::new(CpuExecutable {
        graph: partition.clone(),
        kernels,
        steps,
        last_use,
        out_dtypes,
        pool_threads: thread_pool(options.threads)?,
        memory_limit: options.memory_limit,
        mode: MemoryMode {
            reuse: options.memory_reuse,
            pool: options.memory_pool,
            capture: options.capture,
        },
        buffers: Pool::default(),
        scratch: Vec::new(),
        captured: None,
        recaptures: 0,
        prepared_facts,
        has_control: partition.nodes.iter().any(|n| n.op.class() == OpClass::Control),
    }))
}

/// The facts of what preparing decided, the same for every run: each fused step (on its
/// anchor, and on every node it absorbed) and each node computed at prepare.
fn prepared_facts(
    g: &Graph,
    steps: &[Step],
    kernels: &[Kernel],
    prepacked: &[NodeId],
) -> Vec<Fact> {
    let fact = |node: usize, key: &str, value: String| Fact {
        node: Some(NodeId(node as u32)),
        key: key.into(),
        value,
    };
    let mut facts = Vec::new();
    for step in steps {
        let Work::Fused(epi) = &step.work else { continue };
        let names: Vec<&str> = epi.absorbed.iter().map(|&j| g.nodes[j].op.name()).collect();
        facts.push(fact(step.node, "fused", format!("epilogue {}", names.join(" + "))));
        let kernel = kernels[step.node].name();
        for &j in &epi.absorbed {
            facts.push(fact(j, "fused", format!("into n{} ({kernel})", step.node)));
        }
    }
    for node in prepacked {
        let value = "computed once when the executable was prepared (its inputs are constants)";
        facts.push(fact(node.index(), "prepacked", value.into()));
    }
    // Which BLAS large products run on, as it describes itself (release, the core it
    // detected): the same kernel name runs several times slower on a BLAS that does not
    // know the CPU, so the explanation says which one it was.
    if kernels.iter().any(|k| k.matmul() == crate::MatMulKernel::Blas) {
        facts.push(Fact { node: None, key: "cpu.blas".into(), value: crate::blas_summary() });
    }
    facts
}

/// Nodes whose every input is a constant compute the same tensor on every run — weights
/// cast to the plan's precision, transposed or reshaped: computed here once, with the kernel
/// a run would use (so the results are the same), they become constants of the executable.
/// Returns the nodes computed so.
fn hoist_constant_steps(
    g: &Graph,
    steps: &mut [Step],
    kernels: &[Kernel],
    out_dtypes: &[Vec<DType>],
) -> Vec<NodeId> {
    let mut known: Vec<Option<Arc<Tensor>>> = vec![None; g.values.len()];
    let mut hoisted = Vec::new();
    for step in steps.iter_mut() {
        if let Work::Const(c) = &step.work {
            step.outputs.iter().for_each(|o| known[o.index()] = Some(c.clone()));
            continue;
        }
        let node = &g.nodes[step.node];
        let constant_inputs = !step.reads.is_empty()
            && step.reads.iter().all(|v| known[v.index()].is_some())
            && step.outputs.len() == 1;
        // Control flow runs when the job runs (a loop over constants could be unbounded).
        if !matches!(step.work, Work::Node)
            || !constant_inputs
            || node.op.class() == OpClass::Control
        {
            continue;
        }
        let args: Vec<Option<&Tensor>> =
            node.inputs.iter().map(|v| v.and_then(|v| known[v.index()].as_deref())).collect();
        // A node that fails (or panics) here fails the same way when run: left to the run,
        // whose error names it.
        let computed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::eval(node, kernels[step.node], &args, &out_dtypes[step.node])
        }));
        let Ok(Ok(mut outs)) = computed else { continue };
        let Some(t) = outs.pop().filter(|_| outs.is_empty()) else { continue };
        let t = Arc::new(t);
        known[step.outputs[0].index()] = Some(t.clone());
        step.work = Work::Const(t);
        step.reads.clear();
        hoisted.push(NodeId(step.node as u32));
    }
    hoisted
}

/// The executable's own worker team when the policy bounds threads (`execution.threads`);
/// otherwise kernels use the process's default team (one thread per core).
fn thread_pool(threads: Option<u32>) -> Result<Option<Arc<crate::team::Team>>, EngineError> {
    match threads {
        None => Ok(None),
        Some(0) => Err(EngineError::InvalidOption {
            engine: "cpu".into(),
            key: "threads".into(),
            value: "0".into(),
            expected: "a positive thread count".into(),
        }),
        Some(n) => {
            let team = crate::team::Team::new(n as usize)
                .map_err(|e| EngineError::Other(format!("cannot start {n} threads: {e}")))?;
            Ok(Some(Arc::new(team)))
        }
    }
}

/// Steps in node order; a fused step runs where its last absorbed node stood, so a
/// residual computed between the anchor and that node is ready.
fn cut_steps(
    g: &Graph,
    mut consts: Vec<Option<Arc<Tensor>>>,
    mut epilogues: Vec<Option<Epilogue>>,
) -> Vec<Step> {
    epilogues.resize(g.nodes.len(), None);
    // The anchor whose step runs at each node index (its last absorbed node).
    let mut runs_at: Vec<Option<usize>> = vec![None; g.nodes.len()];
    let mut absorbed = vec![false; g.nodes.len()];
    for (anchor, epi) in epilogues.iter().enumerate() {
        let Some(epi) = epi else { continue };
        // Epilogues are disjoint: plan_epilogues claims each node once.
        debug_assert!(epi.absorbed.iter().all(|&j| !absorbed[j]), "n{anchor}'s epilogue overlaps");
        epi.absorbed.iter().for_each(|&j| absorbed[j] = true);
        runs_at[*epi.absorbed.last().expect("an epilogue absorbs a node")] = Some(anchor);
    }
    let mut steps = Vec::with_capacity(g.nodes.len());
    for (i, node) in g.nodes.iter().enumerate() {
        let inputs = || node.inputs.iter().flatten().copied().collect::<Vec<_>>();
        if let Some(anchor) = runs_at[i] {
            let epi = epilogues[anchor].take().expect("one step per epilogue");
            let mut reads: Vec<ValueId> =
                g.nodes[anchor].inputs.iter().flatten().copied().collect();
            reads.extend(epi.residual);
            steps.push(Step {
                node: anchor,
                reads,
                outputs: node.outputs.clone(),
                work: Work::Fused(epi),
            });
        } else if absorbed[i] || epilogues[i].is_some() {
            continue; // Part of a fused step emitted at its last node.
        } else if let Some(c) = consts[i].take() {
            steps.push(Step {
                node: i,
                work: Work::Const(c),
                reads: vec![],
                outputs: node.outputs.clone(),
            });
        } else {
            steps.push(Step {
                node: i,
                work: Work::Node,
                reads: inputs(),
                outputs: node.outputs.clone(),
            });
        }
    }
    steps
}

impl Executable for CpuExecutable {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        match self.pool_threads.clone() {
            Some(pool) => {
                let mut result = crate::team::with_team(&pool, || self.run_here(inputs, stop));
                if let Ok(e) = &mut result {
                    e.facts.push(Fact {
                        node: None,
                        key: "threads".into(),
                        value: pool.threads().to_string(),
                    });
                }
                result
            }
            None => self.run_here(inputs, stop),
        }
    }
}
