//! The CPU reference engine: every SGR-ML op on the host, written for clarity first and
//! speed where it matters (matrix products through OpenBLAS or the gemm crate, convolution
//! as im2col + GEMM). Its kernels are named — `cpu.blas`, `cpu.gemm`, `cpu.im2col_conv`,
//! `cpu.naive` — so a policy can pin them, and its results are the reference other engines
//! are compared with. f16/bf16 are computed by widening to f32. It also serves as the
//! constant-folding evaluator of the IR passes.

// Kernels are generated over every dtype with one macro body; `clone()` is needed for
// strings and is a copy for the numeric types.
#![allow(clippy::clone_on_copy)]

#[cfg(feature = "openblas")]
mod blas;

mod attention;
mod cast;
mod conv;
mod elementwise;
mod gather;
mod linalg;
mod loss;
mod misc;
mod movement;
mod norm;
mod quant;
mod reduce;
mod resize;
mod rnn;
mod scalar;
mod util;

use std::sync::Arc;
use std::time::Instant;

use xpu_engine::{
    Assignment, Availability, Capabilities, Device, Engine, EngineError, Executable, Execution,
    Fact, KernelCaps, NodeTiming, StopToken,
};
use xpu_ir::{DType, Graph, Node, NodeId, Op, OpClass, Tensor};

pub use cast::cast;
pub use linalg::MatMulKernel;

use util::{KResult, is_half, narrow, opt, req, widen};

/// Kernel names this engine offers.
pub const KERNEL_BLAS: &str = "cpu.blas";
pub const KERNEL_GEMM: &str = "cpu.gemm";
pub const KERNEL_IM2COL: &str = "cpu.im2col_conv";
pub const KERNEL_NAIVE: &str = "cpu.naive";

/// Ops the CPU engine implements: the whole SGR-ML op set (it is the reference engine).
pub fn supported_ops() -> Vec<Op> {
    // Tables live in the `table` engine; every tensor op runs here but opaque ONNX nodes,
    // which only engines that take ONNX run.
    Op::ALL
        .iter()
        .copied()
        .filter(|o| !matches!(o.class(), OpClass::Table | OpClass::Opaque))
        .collect()
}

/// Whether this build links OpenBLAS (the `cpu.blas` kernel).
pub const HAS_BLAS: bool = cfg!(feature = "openblas");

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kernel {
    Blas,
    Gemm,
    Im2col,
    Naive,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::Blas => KERNEL_BLAS,
            Kernel::Gemm => KERNEL_GEMM,
            Kernel::Im2col => KERNEL_IM2COL,
            Kernel::Naive => KERNEL_NAIVE,
        }
    }

    fn default_for(op: Op) -> Kernel {
        match op {
            Op::MatMul | Op::Gemm if HAS_BLAS => Kernel::Blas,
            Op::MatMul | Op::Gemm => Kernel::Gemm,
            Op::Conv => Kernel::Im2col,
            _ => Kernel::Naive,
        }
    }

    fn parse(name: &str, op: Op) -> Option<Kernel> {
        let k = match name {
            KERNEL_BLAS if HAS_BLAS => Kernel::Blas,
            KERNEL_GEMM => Kernel::Gemm,
            KERNEL_IM2COL => Kernel::Im2col,
            KERNEL_NAIVE => Kernel::Naive,
            _ => return None,
        };
        let ok = match k {
            Kernel::Blas | Kernel::Gemm => matches!(op, Op::MatMul | Op::Gemm),
            Kernel::Im2col => op == Op::Conv,
            Kernel::Naive => true,
        };
        ok.then_some(k)
    }

    /// The matrix-product implementation this kernel uses (convolution's GEMM step uses the
    /// best one built in).
    fn matmul(self) -> MatMulKernel {
        match self {
            Kernel::Naive => MatMulKernel::Naive,
            Kernel::Gemm => MatMulKernel::Gemm,
            Kernel::Blas | Kernel::Im2col if HAS_BLAS => MatMulKernel::Blas,
            Kernel::Blas | Kernel::Im2col => MatMulKernel::Gemm,
        }
    }
}

/// Evaluates one node. `out_dtypes` are the declared output dtypes (f16/bf16 results are
/// computed in f32 and narrowed to them).
fn eval(
    node: &Node,
    kernel: Kernel,
    inputs: &[Option<&Tensor>],
    out_dtypes: &[DType],
) -> KResult<Vec<Tensor>> {
    let class = node.op.class();
    let computes = !matches!(
        class,
        OpClass::Movement
            | OpClass::Gather
            | OpClass::Scatter
            | OpClass::Constant
            | OpClass::Select
            | OpClass::Compare
            | OpClass::Logical
    ) && node.op != Op::Identity;
    if computes && inputs.iter().flatten().any(|t| is_half(t.dtype())) {
        let widened: Vec<Option<Tensor>> = inputs.iter().map(|t| t.map(widen)).collect();
        let refs: Vec<Option<&Tensor>> = widened.iter().map(Option::as_ref).collect();
        let out = eval_native(node, kernel, &refs, out_dtypes.len())?;
        return Ok(out
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let to = out_dtypes.get(i).copied().unwrap_or(t.dtype());
                narrow(t, to)
            })
            .collect());
    }
    eval_native(node, kernel, inputs, out_dtypes.len())
}

fn eval_native(
    node: &Node,
    kernel: Kernel,
    inputs: &[Option<&Tensor>],
    n_out: usize,
) -> KResult<Vec<Tensor>> {
    let a = &node.attrs;
    let x = || req(inputs, 0);
    let all = || -> KResult<Vec<&Tensor>> {
        inputs
            .iter()
            .enumerate()
            .map(|(i, t)| t.ok_or_else(|| format!("input {i} is required")))
            .collect()
    };
    let mk = kernel.matmul();
    let one = |t: KResult<Tensor>| t.map(|t| vec![t]);
    use Op::*;
    match node.op {
        Constant => {
            one(a.tensor("value").cloned().ok_or_else(|| "constant without `value`".to_string()))
        }
        ConstantOfShape => one(movement::constant_of_shape(a, x()?)),
        Range => one(movement::range(inputs)),
        EyeLike => one(movement::eye_like(a, x()?)),
        Max | Min | Sum | Mean if inputs.len() != 2 => one(elementwise::variadic(node.op, &all()?)),
        Mean => one(elementwise::variadic(node.op, &all()?)),
        Clip => one(elementwise::clip(inputs)),
        Where => one(elementwise::where_(x()?, req(inputs, 1)?, req(inputs, 2)?)),
        Cast => one(cast::cast(x()?, a.dtype("to").ok_or("cast needs `to`")?)),
        CastLike => one(cast::cast(x()?, req(inputs, 1)?.dtype())),
        MatMul => one(linalg::matmul(mk, x()?, req(inputs, 1)?)),
        Gemm => one(linalg::gemm_op(mk, a, inputs)),
        Einsum => one(linalg::einsum(a, &all()?)),
        Det => one(linalg::det(x()?)),
        Conv => one(conv::conv(mk, a, inputs)),
        ConvTranspose => one(conv::conv_transpose(a, inputs)),
        MaxPool | AveragePool | LpPool | GlobalAveragePool | GlobalMaxPool | GlobalLpPool => {
            conv::pool(node.op, a, x()?, n_out)
        }
        BatchNormalization => norm::batch_norm(a, inputs, n_out),
        LayerNormalization | RmsNormalization => norm::layer_norm(node.op, a, inputs, n_out),
        InstanceNormalization => one(norm::instance_norm(a, inputs)),
        GroupNormalization => one(norm::group_norm(a, inputs)),
        Lrn => one(norm::lrn(a, x()?)),
        LpNormalization => one(norm::lp_norm(a, x()?)),
        MeanVarianceNormalization => one(norm::mvn(a, x()?)),
        Softmax | LogSoftmax | Hardmax => one(reduce::softmax(node.op, a, x()?)),
        ReduceSum | ReduceMean | ReduceMax | ReduceMin | ReduceProd | ReduceL1 | ReduceL2
        | ReduceLogSum | ReduceLogSumExp | ReduceSumSquare => {
            one(reduce::reduce(node.op, a, inputs))
        }
        ArgMax | ArgMin => one(reduce::arg(node.op, a, x()?)),
        CumSum | CumProd => one(reduce::cumulative(node.op, a, x()?, req(inputs, 1)?)),
        TopK => reduce::top_k(a, x()?, req(inputs, 1)?),
        NonZero => one(movement::non_zero(x()?)),
        Reshape => one(movement::reshape(a, x()?, req(inputs, 1)?)),
        Transpose => one(movement::transpose(x()?, a.ints("perm"))),
        Squeeze => one(movement::squeeze(x()?, opt(inputs, 1))),
        Unsqueeze => one(movement::unsqueeze(x()?, req(inputs, 1)?)),
        Flatten => one(movement::flatten(a, x()?)),
        Concat => one(movement::concat(a, &all()?)),
        Split => movement::split(a, inputs, n_out),
        Slice => one(movement::slice(inputs)),
        Expand => one(movement::expand(x()?, req(inputs, 1)?)),
        Tile => one(movement::tile(x()?, req(inputs, 1)?)),
        Pad => one(movement::pad(a, inputs)),
        Shape => one(movement::shape_of(a, x()?)),
        Size => one(Ok(Tensor::scalar(x()?.numel() as i64))),
        DepthToSpace | SpaceToDepth => one(movement::depth_space(node.op, a, x()?)),
        Trilu => one(movement::trilu(a, inputs)),
        OneHot => one(movement::one_hot(a, inputs)),
        Compress => one(movement::compress(a, x()?, req(inputs, 1)?)),
        ReverseSequence => one(movement::reverse_sequence(a, x()?, req(inputs, 1)?)),
        Dropout => {
            let training = opt(inputs, 2)
                .map(|t| t.to_f64_vec().first().copied().unwrap_or(0.0) != 0.0)
                .unwrap_or(false);
            let ratio = opt(inputs, 1)
                .map(|t| t.to_f64_vec().first().copied().unwrap_or(0.5))
                .unwrap_or(0.5);
            if training && ratio != 0.0 {
                return Err("dropout in training mode (random masks) is not supported".into());
            }
            let t = x()?.clone();
            let mut out = vec![t.clone()];
            if n_out > 1 {
                out.push(
                    Tensor::from_vec(t.shape().to_vec(), vec![true; t.numel()])
                        .map_err(|e| e.to_string())?,
                );
            }
            Ok(out)
        }
        Attention => attention::attention(a, inputs, n_out),
        Resize => one(resize::resize(a, inputs)),
        Rnn | Gru | Lstm => rnn::recurrent(node.op, a, inputs, n_out),
        HannWindow | HammingWindow | BlackmanWindow => one(misc::window(node.op, a, x()?)),
        CenterCropPad => one(misc::center_crop_pad(a, x()?, req(inputs, 1)?)),
        MaxUnpool => one(misc::max_unpool(a, inputs)),
        StringConcat => one(misc::string_concat(x()?, req(inputs, 1)?)),
        RotaryEmbedding => one(misc::rotary_embedding(a, inputs)),
        Dft => one(misc::dft(a, inputs)),
        AffineGrid => one(misc::affine_grid(a, x()?, req(inputs, 1)?)),
        GridSample => one(misc::grid_sample(a, x()?, req(inputs, 1)?)),
        NonMaxSuppression => one(misc::non_max_suppression(a, inputs)),
        QuantizeLinear => one(quant::quantize_linear(a, inputs)),
        DequantizeLinear => one(quant::dequantize_linear(a, inputs)),
        DynamicQuantizeLinear => quant::dynamic_quantize_linear(x()?),
        MatMulInteger => one(quant::matmul_integer(inputs)),
        ConvInteger => one(quant::conv_integer(a, inputs)),
        QLinearMatMul => one(quant::qlinear_matmul(inputs)),
        QLinearConv => one(quant::qlinear_conv(a, inputs)),
        NegativeLogLikelihoodLoss => one(loss::negative_log_likelihood(a, inputs)),
        SoftmaxCrossEntropyLoss => loss::softmax_cross_entropy(a, inputs, n_out),
        Gather => one(gather::gather(a, x()?, req(inputs, 1)?)),
        GatherElements => one(gather::gather_elements(a, x()?, req(inputs, 1)?)),
        GatherNd => one(gather::gather_nd(a, x()?, req(inputs, 1)?)),
        ScatterElements => one(gather::scatter_elements(a, x()?, req(inputs, 1)?, req(inputs, 2)?)),
        ScatterNd => one(gather::scatter_nd(a, x()?, req(inputs, 1)?, req(inputs, 2)?)),
        op if matches!(op.class(), OpClass::Unary | OpClass::Activation) && inputs.len() == 1
            || op == BitwiseNot
            || op == Not
            || op == IsNaN
            || op == IsInf =>
        {
            one(elementwise::unary(op, a, x()?))
        }
        op if inputs.len() == 2
            && matches!(
                op.class(),
                OpClass::Binary
                    | OpClass::Compare
                    | OpClass::Logical
                    | OpClass::Bitwise
                    | OpClass::Activation
            ) =>
        {
            one(elementwise::binary(op, a, x()?, req(inputs, 1)?))
        }
        op => Err(format!("the cpu engine does not implement {op}")),
    }
}

/// The CPU engine.
#[derive(Debug, Default)]
pub struct CpuEngine;

impl CpuEngine {
    pub fn new() -> CpuEngine {
        CpuEngine
    }
}

impl Engine for CpuEngine {
    fn name(&self) -> &str {
        "cpu"
    }

    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    fn capabilities(&self) -> Capabilities {
        let floats = vec![DType::F32, DType::F64, DType::F16, DType::BF16];
        let mut all = DType::ALL.to_vec();
        all.retain(|d| *d != DType::String);
        Capabilities {
            engine: "cpu".into(),
            version: self.version(),
            availability: Availability::Available,
            devices: vec![Device::host()],
            kernels: [
                HAS_BLAS.then(|| KernelCaps {
                    device: None,
                    name: KERNEL_BLAS.into(),
                    ops: vec![Op::MatMul, Op::Gemm],
                    classes: vec![],
                    deterministic: true,
                    dtypes: vec![DType::F32, DType::F64, DType::F16, DType::BF16],
                    description: "OpenBLAS SGEMM/DGEMM".into(),
                }),
                Some(KernelCaps {
                    device: None,
                    name: KERNEL_GEMM.into(),
                    ops: vec![Op::MatMul, Op::Gemm],
                    classes: vec![],
                    deterministic: true,
                    dtypes: floats.clone(),
                    description: "packed GEMM (gemm crate), rayon threads".into(),
                }),
                Some(KernelCaps {
                    device: None,
                    name: KERNEL_IM2COL.into(),
                    ops: vec![Op::Conv],
                    classes: vec![],
                    deterministic: true,
                    dtypes: floats,
                    description: "im2col + GEMM convolution".into(),
                }),
                Some(KernelCaps {
                    device: None,
                    name: KERNEL_NAIVE.into(),
                    ops: supported_ops(),
                    classes: vec![],
                    deterministic: true,
                    dtypes: all,
                    description: "reference loops for every op".into(),
                }),
            ]
            .into_iter()
            .flatten()
            .collect(),
            unavailable_kernels: Default::default(),
        }
    }

    fn prepare(
        &self,
        partition: &Graph,
        assignment: &Assignment,
    ) -> Result<Box<dyn Executable>, EngineError> {
        let mut kernels = Vec::with_capacity(partition.nodes.len());
        for id in partition.node_ids() {
            let node = partition.node(id);
            if matches!(node.op.class(), OpClass::Table | OpClass::Opaque)
                && node.op != Op::Constant
            {
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
                Some(name) => {
                    Kernel::parse(name, node.op).ok_or_else(|| EngineError::Unsupported {
                        engine: "cpu".into(),
                        node: node.label(id),
                        what: format!("kernel {name} for op {}", node.op),
                    })?
                }
                None => Kernel::default_for(node.op),
            };
            kernels.push(k);
        }
        let mut last_use = vec![usize::MAX; partition.values.len()];
        for (i, n) in partition.nodes.iter().enumerate() {
            for v in n.input_values() {
                last_use[v.index()] = i;
            }
        }
        for o in &partition.outputs {
            last_use[o.value.index()] = usize::MAX;
        }
        let consts = partition
            .nodes
            .iter()
            .map(|n| {
                if n.op == Op::Constant {
                    n.attrs.tensor("value").cloned().map(Arc::new)
                } else {
                    None
                }
            })
            .collect();
        let out_dtypes = partition
            .nodes
            .iter()
            .map(|n| n.outputs.iter().map(|&o| partition.ty(o).dtype).collect())
            .collect();
        // `threads` (from the policy's execution.threads) bounds this executable's rayon
        // workers; OpenBLAS keeps its own process-wide pool.
        let pool = match assignment.options.threads {
            None => None,
            Some(0) => {
                return Err(EngineError::InvalidOption {
                    engine: "cpu",
                    key: "threads",
                    value: "0".into(),
                    expected: "a positive thread count",
                });
            }
            Some(n) => {
                let n = n as usize;
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("xpu-cpu-{i}"))
                    .build()
                    .map_err(|e| EngineError::Other(format!("cannot start {n} threads: {e}")))?;
                Some(Arc::new(pool))
            }
        };
        let memory_limit = assignment.options.memory_limit;
        Ok(Box::new(CpuExecutable {
            graph: partition.clone(),
            kernels,
            last_use,
            consts,
            out_dtypes,
            pool,
            memory_limit,
        }))
    }
}

struct CpuExecutable {
    graph: Graph,
    kernels: Vec<Kernel>,
    /// Index of the last node reading each value (`usize::MAX`: graph output or unused).
    last_use: Vec<usize>,
    consts: Vec<Option<Arc<Tensor>>>,
    /// Declared output dtypes of each node (f16/bf16 results are narrowed to them).
    out_dtypes: Vec<Vec<DType>>,
    /// Workers for this executable when the assignment bounds threads.
    pool: Option<Arc<rayon::ThreadPool>>,
    /// The policy's memory.limit: the bytes of live tensors (inputs and computed values,
    /// constants aside — as the planner counts them) a run may hold at once.
    memory_limit: Option<u64>,
}

/// A value during execution: borrowed from the caller (graph inputs) or produced here.
#[derive(Clone)]
enum Slot<'a> {
    Borrowed(&'a Tensor),
    Shared(Arc<Tensor>),
}

impl Slot<'_> {
    fn get(&self) -> &Tensor {
        match self {
            Slot::Borrowed(t) => t,
            Slot::Shared(t) => t,
        }
    }

    fn into_owned(self) -> Tensor {
        match self {
            Slot::Borrowed(t) => t.clone(),
            Slot::Shared(t) => Arc::try_unwrap(t).unwrap_or_else(|a| (*a).clone()),
        }
    }
}

impl Executable for CpuExecutable {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        match self.pool.clone() {
            Some(pool) => {
                let mut result = pool.install(|| self.run_here(inputs, stop));
                if let Ok(e) = &mut result {
                    e.facts.push(Fact {
                        node: None,
                        key: "threads".into(),
                        value: pool.current_num_threads().to_string(),
                    });
                }
                result
            }
            None => self.run_here(inputs, stop),
        }
    }
}

impl CpuExecutable {
    fn run_here(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        let g = &self.graph;
        xpu_engine::check_inputs(g, inputs)?;
        let mut values: Vec<Option<Slot<'_>>> = vec![None; g.values.len()];
        for (&v, t) in g.inputs.iter().zip(inputs) {
            values[v.index()] = Some(Slot::Borrowed(t));
        }
        let mut timings = Vec::with_capacity(g.nodes.len());
        // Bytes of live tensors, checked against memory.limit: the planner checks the plan's
        // peak when every size is known; this catches sizes known only when running.
        let mut live: u64 = inputs.iter().map(|t| t.size_bytes() as u64).sum();
        for (i, node) in g.nodes.iter().enumerate() {
            if self.consts[i].is_none() {
                stop.check(|| node.label(NodeId(i as u32)))?;
            }
            let start = Instant::now();
            let outs: Vec<Slot<'_>> = if let Some(c) = &self.consts[i] {
                vec![Slot::Shared(c.clone())]
            } else {
                let args: Vec<Option<&Tensor>> = node
                    .inputs
                    .iter()
                    .map(|v| v.and_then(|v| values[v.index()].as_ref().map(Slot::get)))
                    .collect();
                let id = NodeId(i as u32);
                // A kernel bug must not take the process down: a panic becomes an error that
                // names the node (the conformance suite runs with zero panics).
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    eval(node, self.kernels[i], &args, &self.out_dtypes[i])
                }));
                let outs = match result {
                    Ok(r) => {
                        r.map_err(|message| EngineError::Kernel { node: node.label(id), message })?
                    }
                    Err(p) => {
                        let what = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        return Err(EngineError::Kernel {
                            node: node.label(id),
                            message: format!(
                                "internal error in the cpu engine (please report): {what}"
                            ),
                        });
                    }
                };
                if outs.len() != node.outputs.len() {
                    return Err(EngineError::Kernel {
                        node: node.label(id),
                        message: format!(
                            "produced {} outputs, expected {}",
                            outs.len(),
                            node.outputs.len()
                        ),
                    });
                }
                if let Some(limit) = self.memory_limit {
                    live += outs.iter().map(|t| t.size_bytes() as u64).sum::<u64>();
                    if live > limit {
                        return Err(EngineError::MemoryLimit {
                            what: format!("{}: live tensors", node.label(id)),
                            needed: live,
                            limit,
                        });
                    }
                }
                outs.into_iter().map(|t| Slot::Shared(Arc::new(t))).collect()
            };
            for (&o, t) in node.outputs.iter().zip(outs) {
                values[o.index()] = Some(t);
            }
            // Move semantics: an intermediate's buffer is released after its last use.
            for v in node.input_values() {
                if self.last_use[v.index()] == i {
                    if self.memory_limit.is_some()
                        && g.producer(v).is_none_or(|p| self.consts[p.index()].is_none())
                        && let Some(slot) = &values[v.index()]
                    {
                        live = live.saturating_sub(slot.get().size_bytes() as u64);
                    }
                    values[v.index()] = None;
                }
            }
            timings.push(NodeTiming {
                node: NodeId(i as u32),
                kernel: self.kernels[i].name().to_string(),
                nanos: start.elapsed().as_nanos() as u64,
            });
        }
        // Move each output out of its slot (the last output naming a value takes it; earlier
        // ones copy), so a result is never copied needlessly.
        let mut outputs = Vec::with_capacity(g.outputs.len());
        for (k, o) in g.outputs.iter().enumerate() {
            let last = !g.outputs[k + 1..].iter().any(|later| later.value == o.value);
            let slot =
                if last { values[o.value.index()].take() } else { values[o.value.index()].clone() };
            outputs.push(slot.map(Slot::into_owned).ok_or_else(|| {
                EngineError::Other(format!("output {:?} was not computed", o.name))
            })?);
        }
        Ok(Execution { outputs, timings, facts: vec![] })
    }
}

/// Constant folding through the CPU kernels.
#[derive(Debug, Default)]
pub struct CpuEvaluator;

impl xpu_ir::passes::Evaluator for CpuEvaluator {
    fn evaluate(
        &self,
        node: &Node,
        inputs: &[Option<&Tensor>],
        output_dtypes: &[DType],
    ) -> Result<Vec<Tensor>, String> {
        eval(node, Kernel::default_for(node.op), inputs, output_dtypes)
    }
}

/// Runs a whole graph on the CPU engine with default kernels (tests, folding, `xpuctl run`).
pub fn run_graph(g: &Graph, inputs: &[Tensor]) -> Result<Execution, EngineError> {
    CpuEngine.prepare(g, &Assignment::new("cpu"))?.run(inputs)
}
