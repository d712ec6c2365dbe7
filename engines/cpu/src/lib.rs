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

/// Keeps OpenBLAS from starting its own thread pool (the engine splits products over its
/// own team); a no-op without the `openblas` feature.
///
/// # Safety
/// Call at the top of `main`, before any other thread exists: it may set an environment
/// variable.
pub unsafe fn quiet_blas_threads() {
    #[cfg(feature = "openblas")]
    // SAFETY: forwarded from this function's contract.
    unsafe {
        blas::quiet_openblas_threads()
    };
}

mod attention;
mod cast;
mod control;
mod conv;
mod elementwise;
mod exec;
mod gather;
mod linalg;
mod loss;
mod maxpool2;
mod misc;
mod movement;
mod norm;
mod quant;
mod reduce;
mod regions;
mod resize;
mod rnn;
mod scalar;
mod state_space;
mod team;
mod unique;
mod util;

use xpu_engine::{
    Assignment, Availability, Capabilities, Device, Engine, EngineError, Executable, Execution,
    KernelCaps,
};
use xpu_ir::{DType, Graph, Node, Op, OpClass, Tensor};

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

/// Whether this build has the `cpu.blas` kernel (OpenBLAS, loaded at run time).
pub const HAS_BLAS: bool = cfg!(feature = "openblas");

/// Sets the OpenBLAS library this process loads when `$XPU_BLAS_LIBRARY` is unset
/// (`[engines.cpu] blas_library`); `None` keeps the search (numpy's OpenBLAS from
/// `make setup` or `make install`, then the system's). Only the first call counts: false
/// when another library was set before.
pub fn configure_blas(library: Option<std::path::PathBuf>) -> bool {
    #[cfg(feature = "openblas")]
    return blas::configure(library);
    #[cfg(not(feature = "openblas"))]
    library.is_none()
}

/// What the OpenBLAS this process loads says of itself (release, detected core, whether it
/// runs below this CPU), or why none loads. `Err` in a build without the `openblas` feature.
pub fn blas_info() -> Result<String, String> {
    #[cfg(feature = "openblas")]
    return blas::info().map(|i| i.to_string()).map_err(str::to_string);
    #[cfg(not(feature = "openblas"))]
    Err("built without the `openblas` feature".into())
}

/// Why `cpu.blas` runs below this machine (a BLAS that does not know the CPU, or none
/// loaded), or `None`: the planner then prefers `cpu.gemm` (reason `KernelDegraded`).
pub fn blas_degraded() -> Option<String> {
    #[cfg(feature = "openblas")]
    return match blas::info() {
        Ok(i) => i.degraded.clone(),
        Err(e) => Some(format!("{e}: products above the register-tile size run on the gemm crate")),
    };
    #[cfg(not(feature = "openblas"))]
    Some("built without the `openblas` feature".into())
}

/// The BLAS as an explanation states it: what it says of itself, and why it is degraded
/// where it is (the `cpu.blas` fact of a run, xpud's start-up line).
pub fn blas_summary() -> String {
    match (blas_info(), blas_degraded()) {
        (Ok(info), None) => info,
        (Ok(info), Some(why)) => format!("{info}; degraded: {why}"),
        (Err(_), Some(why)) | (Err(why), None) => why,
    }
}

/// Whether unpinned products (constant folding, convolution's GEMM step) take the tuned
/// `cpu.blas` path: built in and not degraded. Asked per product, so it reads the loaded
/// library's description in place rather than copying the reason out.
fn blas_preferred() -> bool {
    #[cfg(feature = "openblas")]
    return blas::info().is_ok_and(|i| i.degraded.is_none());
    #[cfg(not(feature = "openblas"))]
    false
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
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
            Op::MatMul | Op::Gemm if blas_preferred() => Kernel::Blas,
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
            Kernel::Blas if HAS_BLAS => MatMulKernel::Blas,
            Kernel::Im2col if blas_preferred() => MatMulKernel::Blas,
            Kernel::Blas | Kernel::Im2col => MatMulKernel::Gemm,
        }
    }
}

/// Evaluates one node. `out_dtypes` are the declared output dtypes (f16/bf16 results are
/// computed in f32 and narrowed to them).
pub(crate) fn eval(
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
            | OpClass::Control
    ) && node.op != Op::Identity;
    if let (Op::Softmax | Op::LogSoftmax, Some(Some(x))) = (node.op, inputs.first())
        && is_half(x.dtype())
    {
        // The function body's intermediates are values of the graph's 16-bit type.
        let y = reduce::softmax_with_values_of(node.op, &node.attrs, &widen(x), x.dtype())?;
        return Ok(vec![narrow(y, out_dtypes.first().copied().unwrap_or(x.dtype()))]);
    }
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
        If | Loop | Scan => control::eval(node, inputs, n_out),
        ConstantOfShape => one(movement::constant_of_shape(a, x()?)),
        Range => one(movement::range(inputs)),
        EyeLike => one(movement::eye_like(a, x()?)),
        Max | Min | Sum | Mean if inputs.len() != 2 => one(elementwise::variadic(node.op, &all()?)),
        Mean => one(elementwise::variadic(node.op, &all()?)),
        Clip => one(elementwise::clip(inputs)),
        Where => one(elementwise::where_(x()?, req(inputs, 1)?, req(inputs, 2)?)),
        Cast => one(cast::cast_node(a, x()?, a.dtype("to").ok_or("cast needs `to`")?)),
        CastLike => one(cast::cast_node(a, x()?, req(inputs, 1)?.dtype())),
        MatMul => one(linalg::matmul(mk, x()?, req(inputs, 1)?)),
        Gemm => one(linalg::gemm_op(mk, a, inputs)),
        Einsum => one(linalg::einsum(a, &all()?)),
        Det => one(linalg::det(x()?)),
        Conv => one(conv::conv(mk, a, inputs)),
        ConvTranspose => one(conv::conv_transpose(a, inputs)),
        Col2Im => one(conv::col2im(a, inputs)),
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
        Unique => unique::unique(a, x()?, n_out),
        BitCast => one(cast::bit_cast(x()?, a.dtype("to").ok_or("bit_cast needs `to`")?)),
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
        TensorScatter => one(regions::tensor_scatter(a, inputs)),
        RoiAlign => one(regions::roi_align(a, inputs)),
        Stft => one(regions::stft(a, inputs)),
        LinearAttention => state_space::linear_attention(a, inputs, n_out),
        CausalConvWithState => state_space::causal_conv_with_state(a, inputs, n_out),
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
                    operand_dtypes: Vec::new(),
                    op_dtypes: Vec::new(),
                    name: KERNEL_BLAS.into(),
                    ops: vec![Op::MatMul, Op::Gemm],
                    classes: vec![],
                    deterministic: true,
                    dtypes: vec![DType::F32, DType::F64, DType::F16, DType::BF16],
                    description: match blas_info() {
                        Ok(info) => format!("tuned products: register tiles, GEMV, {info}"),
                        Err(e) => format!("tuned products: register tiles, GEMV ({e})"),
                    },
                    degraded: blas_degraded(),
                }),
                Some(KernelCaps {
                    device: None,
                    operand_dtypes: Vec::new(),
                    op_dtypes: Vec::new(),
                    name: KERNEL_GEMM.into(),
                    ops: vec![Op::MatMul, Op::Gemm],
                    classes: vec![],
                    deterministic: true,
                    dtypes: floats.clone(),
                    description: "packed GEMM (gemm crate), split over the engine's threads".into(),
                    degraded: None,
                }),
                Some(KernelCaps {
                    device: None,
                    operand_dtypes: Vec::new(),
                    op_dtypes: Vec::new(),
                    name: KERNEL_IM2COL.into(),
                    ops: vec![Op::Conv],
                    classes: vec![],
                    deterministic: true,
                    dtypes: floats,
                    description: "im2col + GEMM convolution".into(),
                    degraded: None,
                }),
                Some(KernelCaps {
                    device: None,
                    operand_dtypes: Vec::new(),
                    op_dtypes: Vec::new(),
                    name: KERNEL_NAIVE.into(),
                    ops: supported_ops(),
                    classes: vec![],
                    deterministic: true,
                    dtypes: all,
                    description: "reference loops for every op".into(),
                    degraded: None,
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
        exec::prepare(partition, assignment)
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
