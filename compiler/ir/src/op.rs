//! The SGR-ML op set: one registry row per op with its text name, ONNX name, class,
//! arity, attribute schema and meaning. ONNX semantics (newest opset) are the reference;
//! `docs/sgr-ops.md` is generated from this table.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::AttrKind;

/// Coarse op families: what policies name (`[kernels] matmul = …`) and what passes reason about.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    /// Elementwise math on one input.
    Unary,
    /// Elementwise activations with parameters.
    Activation,
    /// Elementwise arithmetic with multidirectional broadcasting.
    Binary,
    /// Elementwise comparisons producing bool.
    Compare,
    /// Boolean logic.
    Logical,
    /// Integer bit operations.
    Bitwise,
    /// Selection and conversion (where, cast).
    Select,
    #[serde(rename = "matmul")]
    MatMul,
    Conv,
    Pool,
    Norm,
    Softmax,
    Reduction,
    /// Index-producing or scan ops (argmax, top_k, cumsum).
    Index,
    /// Shape and data movement (reshape, transpose, slice, concat, pad, …).
    Movement,
    Gather,
    Scatter,
    /// Constants and generators (constant, range, eye_like).
    Constant,
    Attention,
    Loss,
    Resize,
    Recurrent,
    Quant,
    /// ONNX nodes xpu has no op for, kept as they are for engines that take ONNX.
    Opaque,
    /// Control flow with subgraphs (if, loop, scan).
    Control,
    /// Relational ops on tables (load, filter, group, join, …), run by the `table` engine.
    Table,
}

impl OpClass {
    pub const ALL: [OpClass; 26] = [
        OpClass::Unary,
        OpClass::Activation,
        OpClass::Binary,
        OpClass::Compare,
        OpClass::Logical,
        OpClass::Bitwise,
        OpClass::Select,
        OpClass::MatMul,
        OpClass::Conv,
        OpClass::Pool,
        OpClass::Norm,
        OpClass::Softmax,
        OpClass::Reduction,
        OpClass::Index,
        OpClass::Movement,
        OpClass::Gather,
        OpClass::Scatter,
        OpClass::Constant,
        OpClass::Attention,
        OpClass::Loss,
        OpClass::Resize,
        OpClass::Recurrent,
        OpClass::Quant,
        OpClass::Opaque,
        OpClass::Control,
        OpClass::Table,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpClass::Unary => "unary",
            OpClass::Activation => "activation",
            OpClass::Binary => "binary",
            OpClass::Compare => "compare",
            OpClass::Logical => "logical",
            OpClass::Bitwise => "bitwise",
            OpClass::Select => "select",
            OpClass::MatMul => "matmul",
            OpClass::Conv => "conv",
            OpClass::Pool => "pool",
            OpClass::Norm => "norm",
            OpClass::Softmax => "softmax",
            OpClass::Reduction => "reduction",
            OpClass::Index => "index",
            OpClass::Movement => "movement",
            OpClass::Gather => "gather",
            OpClass::Scatter => "scatter",
            OpClass::Constant => "constant",
            OpClass::Attention => "attention",
            OpClass::Loss => "loss",
            OpClass::Resize => "resize",
            OpClass::Recurrent => "recurrent",
            OpClass::Quant => "quant",
            OpClass::Opaque => "opaque",
            OpClass::Control => "control",
            OpClass::Table => "table",
        }
    }

    /// Classes whose ops are pointwise over (broadcast) inputs: candidates for fusion.
    pub fn is_elementwise(self) -> bool {
        matches!(
            self,
            OpClass::Unary
                | OpClass::Activation
                | OpClass::Binary
                | OpClass::Compare
                | OpClass::Logical
                | OpClass::Bitwise
                | OpClass::Select
        )
    }
}

impl fmt::Display for OpClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OpClass {
    type Err = UnknownOp;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OpClass::ALL.iter().copied().find(|c| c.name() == s).ok_or_else(|| UnknownOp(s.into()))
    }
}

/// Variadic arity marker.
pub const MANY: usize = usize::MAX;

/// Static description of one op.
#[derive(Debug)]
pub struct OpInfo {
    pub name: &'static str,
    pub onnx: &'static str,
    pub class: OpClass,
    pub inputs: (usize, usize),
    pub outputs: (usize, usize),
    pub attrs: &'static [(&'static str, AttrKind)],
    pub doc: &'static str,
}

macro_rules! define_ops {
    ($( $variant:ident $text:literal $onnx:literal $class:ident
        ($imin:expr, $imax:expr) -> ($omin:expr, $omax:expr)
        [$($aname:literal : $akind:ident),*] $doc:literal ;)*) => {
        /// An SGR-ML operation. Its `Display`, JSON and TOML forms are the text-form name.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op { $($variant,)* }

        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$variant,)*];

            pub fn info(self) -> &'static OpInfo {
                match self {
                    $(Op::$variant => {
                        const INFO: OpInfo = OpInfo {
                            name: $text,
                            onnx: $onnx,
                            class: OpClass::$class,
                            inputs: ($imin, $imax),
                            outputs: ($omin, $omax),
                            attrs: &[$(($aname, AttrKind::$akind)),*],
                            doc: $doc,
                        };
                        &INFO
                    })*
                }
            }
        }
    };
}

define_ops! {
    // ---- constants and generators
    Constant "constant" "Constant" Constant (0,0)->(1,1) ["value": Tensor] "The tensor in `value`.";
    ConstantOfShape "constant_of_shape" "ConstantOfShape" Constant (1,1)->(1,1) ["value": Tensor] "A tensor of shape `input` (i64 dims) filled with the one element of `value` (default f32 0).";
    Range "range" "Range" Constant (3,3)->(1,1) [] "`start, start+delta, …` up to (excluding) `limit`; inputs are scalars start, limit, delta.";
    EyeLike "eye_like" "EyeLike" Constant (1,1)->(1,1) ["dtype": DType, "k": Int] "A 2-D tensor shaped like the input with ones on diagonal `k`.";
    // ---- unary math
    Identity "identity" "Identity" Unary (1,1)->(1,1) [] "The input, unchanged.";
    Abs "abs" "Abs" Unary (1,1)->(1,1) [] "|x|.";
    Neg "neg" "Neg" Unary (1,1)->(1,1) [] "-x.";
    Exp "exp" "Exp" Unary (1,1)->(1,1) [] "e^x.";
    Log "log" "Log" Unary (1,1)->(1,1) [] "Natural logarithm.";
    Sqrt "sqrt" "Sqrt" Unary (1,1)->(1,1) [] "Square root.";
    Reciprocal "reciprocal" "Reciprocal" Unary (1,1)->(1,1) [] "1/x.";
    Floor "floor" "Floor" Unary (1,1)->(1,1) [] "Round toward -inf.";
    Ceil "ceil" "Ceil" Unary (1,1)->(1,1) [] "Round toward +inf.";
    Round "round" "Round" Unary (1,1)->(1,1) [] "Round half to even.";
    Sign "sign" "Sign" Unary (1,1)->(1,1) [] "-1, 0 or 1.";
    Sin "sin" "Sin" Unary (1,1)->(1,1) [] "Sine.";
    Cos "cos" "Cos" Unary (1,1)->(1,1) [] "Cosine.";
    Tan "tan" "Tan" Unary (1,1)->(1,1) [] "Tangent.";
    Asin "asin" "Asin" Unary (1,1)->(1,1) [] "Arcsine.";
    Acos "acos" "Acos" Unary (1,1)->(1,1) [] "Arccosine.";
    Atan "atan" "Atan" Unary (1,1)->(1,1) [] "Arctangent.";
    Sinh "sinh" "Sinh" Unary (1,1)->(1,1) [] "Hyperbolic sine.";
    Cosh "cosh" "Cosh" Unary (1,1)->(1,1) [] "Hyperbolic cosine.";
    Asinh "asinh" "Asinh" Unary (1,1)->(1,1) [] "Inverse hyperbolic sine.";
    Acosh "acosh" "Acosh" Unary (1,1)->(1,1) [] "Inverse hyperbolic cosine.";
    Atanh "atanh" "Atanh" Unary (1,1)->(1,1) [] "Inverse hyperbolic tangent.";
    Erf "erf" "Erf" Unary (1,1)->(1,1) [] "Gauss error function.";
    Tanh "tanh" "Tanh" Unary (1,1)->(1,1) [] "Hyperbolic tangent.";
    Sigmoid "sigmoid" "Sigmoid" Unary (1,1)->(1,1) [] "1/(1+e^-x).";
    Relu "relu" "Relu" Unary (1,1)->(1,1) [] "max(x, 0).";
    Softplus "softplus" "Softplus" Unary (1,1)->(1,1) [] "ln(1+e^x).";
    Softsign "softsign" "Softsign" Unary (1,1)->(1,1) [] "x/(1+|x|).";
    Mish "mish" "Mish" Unary (1,1)->(1,1) [] "x·tanh(softplus(x)).";
    HardSwish "hard_swish" "HardSwish" Unary (1,1)->(1,1) [] "x·max(0, min(1, x/6 + 1/2)).";
    Not "not" "Not" Logical (1,1)->(1,1) [] "Logical negation of a bool tensor.";
    IsNaN "is_nan" "IsNaN" Compare (1,1)->(1,1) [] "Whether each element is NaN.";
    IsInf "is_inf" "IsInf" Compare (1,1)->(1,1) ["detect_negative": Int, "detect_positive": Int] "Whether each element is ±inf (each sign selectable).";
    BitwiseNot "bitwise_not" "BitwiseNot" Bitwise (1,1)->(1,1) [] "Bitwise complement.";
    // ---- parameterised activations
    LeakyRelu "leaky_relu" "LeakyRelu" Activation (1,1)->(1,1) ["alpha": Float] "x if x ≥ 0 else alpha·x (alpha 0.01).";
    Elu "elu" "Elu" Activation (1,1)->(1,1) ["alpha": Float] "x if x ≥ 0 else alpha·(e^x − 1).";
    Selu "selu" "Selu" Activation (1,1)->(1,1) ["alpha": Float, "gamma": Float] "gamma·(x if x > 0 else alpha·(e^x − 1)).";
    Celu "celu" "Celu" Activation (1,1)->(1,1) ["alpha": Float] "max(0,x) + min(0, alpha·(e^(x/alpha) − 1)).";
    HardSigmoid "hard_sigmoid" "HardSigmoid" Activation (1,1)->(1,1) ["alpha": Float, "beta": Float] "max(0, min(1, alpha·x + beta)).";
    ThresholdedRelu "thresholded_relu" "ThresholdedRelu" Activation (1,1)->(1,1) ["alpha": Float] "x if x > alpha else 0.";
    Shrink "shrink" "Shrink" Activation (1,1)->(1,1) ["bias": Float, "lambd": Float] "x+bias if x < −lambd, x−bias if x > lambd, else 0.";
    Gelu "gelu" "Gelu" Activation (1,1)->(1,1) ["approximate": Str] "Gaussian error linear unit (`none` or `tanh` approximation).";
    Swish "swish" "Swish" Activation (1,1)->(1,1) ["alpha": Float] "x·sigmoid(alpha·x).";
    Clip "clip" "Clip" Activation (1,3)->(1,1) [] "Clamp to optional inputs min and max.";
    PRelu "prelu" "PRelu" Activation (2,2)->(1,1) [] "x if x ≥ 0 else slope·x, slope broadcast unidirectionally.";
    // ---- binary arithmetic
    Add "add" "Add" Binary (2,2)->(1,1) [] "a + b with broadcasting.";
    Sub "sub" "Sub" Binary (2,2)->(1,1) [] "a − b with broadcasting.";
    Mul "mul" "Mul" Binary (2,2)->(1,1) [] "a · b with broadcasting.";
    Div "div" "Div" Binary (2,2)->(1,1) [] "a / b with broadcasting (integer division truncates).";
    Pow "pow" "Pow" Binary (2,2)->(1,1) [] "a^b; the result has a's dtype.";
    Mod "mod" "Mod" Binary (2,2)->(1,1) ["fmod": Int] "Remainder: sign of the divisor (fmod=0, ints) or of the dividend (fmod=1).";
    Max "max" "Max" Binary (1,MANY)->(1,1) [] "Elementwise maximum of all inputs.";
    Min "min" "Min" Binary (1,MANY)->(1,1) [] "Elementwise minimum of all inputs.";
    Sum "sum" "Sum" Binary (1,MANY)->(1,1) [] "Elementwise sum of all inputs.";
    Mean "mean" "Mean" Binary (1,MANY)->(1,1) [] "Elementwise mean of all inputs.";
    BitShift "bit_shift" "BitShift" Bitwise (2,2)->(1,1) ["direction": Str] "Shift unsigned ints left or right.";
    BitwiseAnd "bitwise_and" "BitwiseAnd" Bitwise (2,2)->(1,1) [] "Bitwise and.";
    BitwiseOr "bitwise_or" "BitwiseOr" Bitwise (2,2)->(1,1) [] "Bitwise or.";
    BitwiseXor "bitwise_xor" "BitwiseXor" Bitwise (2,2)->(1,1) [] "Bitwise xor.";
    And "and" "And" Logical (2,2)->(1,1) [] "Logical and.";
    Or "or" "Or" Logical (2,2)->(1,1) [] "Logical or.";
    Xor "xor" "Xor" Logical (2,2)->(1,1) [] "Logical xor.";
    Equal "equal" "Equal" Compare (2,2)->(1,1) [] "a == b.";
    Less "less" "Less" Compare (2,2)->(1,1) [] "a < b.";
    LessOrEqual "less_or_equal" "LessOrEqual" Compare (2,2)->(1,1) [] "a ≤ b.";
    Greater "greater" "Greater" Compare (2,2)->(1,1) [] "a > b.";
    GreaterOrEqual "greater_or_equal" "GreaterOrEqual" Compare (2,2)->(1,1) [] "a ≥ b.";
    Where "where" "Where" Select (3,3)->(1,1) [] "cond ? a : b with broadcasting.";
    Cast "cast" "Cast" Select (1,1)->(1,1) ["to": DType, "saturate": Int, "round_mode": Str] "Convert to dtype `to` (8-bit float targets saturate unless `saturate = 0`; `f8e8m0` rounds by `round_mode`: up, down, nearest).";
    BitCast "bit_cast" "BitCast" Select (1,1)->(1,1) ["to": DType] "Reinterpret each element's bits as dtype `to` (of the same width).";
    CastLike "cast_like" "CastLike" Select (2,2)->(1,1) ["saturate": Int, "round_mode": Str] "Convert input 0 to the dtype of input 1.";
    // ---- linear algebra
    MatMul "matmul" "MatMul" MatMul (2,2)->(1,1) [] "numpy matmul: batched, broadcasting over leading dims.";
    Gemm "gemm" "Gemm" MatMul (2,3)->(1,1) ["alpha": Float, "beta": Float, "transA": Int, "transB": Int] "alpha·op(A)·op(B) + beta·C.";
    Einsum "einsum" "Einsum" MatMul (1,MANY)->(1,1) ["equation": Str] "Einstein summation.";
    Det "det" "Det" MatMul (1,1)->(1,1) [] "Determinant of the trailing square matrices.";
    // ---- convolution and pooling
    Conv "conv" "Conv" Conv (2,3)->(1,1) ["auto_pad": Str, "dilations": Ints, "group": Int, "kernel_shape": Ints, "pads": Ints, "strides": Ints] "N-d convolution (cross-correlation) with optional bias.";
    CausalConvWithState "causal_conv_with_state" "CausalConvWithState" Conv (2,4)->(1,2) ["activation": Str] "Causal depthwise 1-D convolution of [B, C, L] with weight [C, 1, K] (ONNX opset 27): the past state (or zeros) prepended, optional bias and SiLU; outputs y and the last K−1 positions as the present state.";
    Col2Im "col2im" "Col2Im" Conv (3,3)->(1,1) ["dilations": Ints, "pads": Ints, "strides": Ints] "Sum column blocks (N, C·∏block, L) back into an image (N, C, image_shape): the inverse of im2col.";
    ConvTranspose "conv_transpose" "ConvTranspose" Conv (2,3)->(1,1) ["auto_pad": Str, "dilations": Ints, "group": Int, "kernel_shape": Ints, "output_padding": Ints, "output_shape": Ints, "pads": Ints, "strides": Ints] "Transposed convolution.";
    MaxPool "max_pool" "MaxPool" Pool (1,1)->(1,2) ["auto_pad": Str, "ceil_mode": Int, "dilations": Ints, "kernel_shape": Ints, "pads": Ints, "storage_order": Int, "strides": Ints] "Max over windows; optional flat indices output.";
    AveragePool "average_pool" "AveragePool" Pool (1,1)->(1,1) ["auto_pad": Str, "ceil_mode": Int, "count_include_pad": Int, "dilations": Ints, "kernel_shape": Ints, "pads": Ints, "strides": Ints] "Mean over windows.";
    LpPool "lp_pool" "LpPool" Pool (1,1)->(1,1) ["auto_pad": Str, "ceil_mode": Int, "dilations": Ints, "kernel_shape": Ints, "p": Int, "pads": Ints, "strides": Ints] "Lp norm over windows.";
    GlobalAveragePool "global_average_pool" "GlobalAveragePool" Pool (1,1)->(1,1) [] "Mean over all spatial dims.";
    GlobalMaxPool "global_max_pool" "GlobalMaxPool" Pool (1,1)->(1,1) [] "Max over all spatial dims.";
    GlobalLpPool "global_lp_pool" "GlobalLpPool" Pool (1,1)->(1,1) ["p": Int] "Lp norm over all spatial dims.";
    // ---- normalisation
    BatchNormalization "batch_normalization" "BatchNormalization" Norm (5,5)->(1,3) ["epsilon": Float, "momentum": Float, "training_mode": Int] "Per-channel (x−mean)/sqrt(var+eps)·scale + bias.";
    InstanceNormalization "instance_normalization" "InstanceNormalization" Norm (3,3)->(1,1) ["epsilon": Float] "Normalise each (n, c) over spatial dims.";
    LayerNormalization "layer_normalization" "LayerNormalization" Norm (2,3)->(1,3) ["axis": Int, "epsilon": Float, "stash_type": Int] "Normalise over dims ≥ axis; outputs Y, mean, inv_std_dev.";
    GroupNormalization "group_normalization" "GroupNormalization" Norm (3,3)->(1,1) ["epsilon": Float, "num_groups": Int, "stash_type": Int] "Normalise channel groups; per-channel scale and bias.";
    RmsNormalization "rms_normalization" "RMSNormalization" Norm (2,2)->(1,1) ["axis": Int, "epsilon": Float, "stash_type": Int] "x / sqrt(mean(x²)+eps) · scale over dims ≥ axis.";
    Lrn "lrn" "LRN" Norm (1,1)->(1,1) ["alpha": Float, "beta": Float, "bias": Float, "size": Int] "Local response normalisation across channels.";
    LpNormalization "lp_normalization" "LpNormalization" Norm (1,1)->(1,1) ["axis": Int, "p": Int] "x / ||x||_p along axis.";
    MeanVarianceNormalization "mean_variance_normalization" "MeanVarianceNormalization" Norm (1,1)->(1,1) ["axes": Ints] "(x − mean)/std over axes (default 0, 2, 3).";
    // ---- softmax family
    Softmax "softmax" "Softmax" Softmax (1,1)->(1,1) ["axis": Int] "exp(x)/sum(exp(x)) along axis (default −1).";
    LogSoftmax "log_softmax" "LogSoftmax" Softmax (1,1)->(1,1) ["axis": Int] "log(softmax(x)) along axis.";
    Hardmax "hardmax" "Hardmax" Softmax (1,1)->(1,1) ["axis": Int] "1 at the first maximum along axis, 0 elsewhere.";
    // ---- reductions (axes as optional input 1)
    ReduceSum "reduce_sum" "ReduceSum" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "Sum over axes.";
    ReduceMean "reduce_mean" "ReduceMean" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "Mean over axes.";
    ReduceMax "reduce_max" "ReduceMax" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "Maximum over axes.";
    ReduceMin "reduce_min" "ReduceMin" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "Minimum over axes.";
    ReduceProd "reduce_prod" "ReduceProd" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "Product over axes.";
    ReduceL1 "reduce_l1" "ReduceL1" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "Sum of |x| over axes.";
    ReduceL2 "reduce_l2" "ReduceL2" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "sqrt(sum(x²)) over axes.";
    ReduceLogSum "reduce_log_sum" "ReduceLogSum" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "log(sum(x)) over axes.";
    ReduceLogSumExp "reduce_log_sum_exp" "ReduceLogSumExp" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "log(sum(e^x)) over axes.";
    ReduceSumSquare "reduce_sum_square" "ReduceSumSquare" Reduction (1,2)->(1,1) ["keepdims": Int, "noop_with_empty_axes": Int] "sum(x²) over axes.";
    ArgMax "arg_max" "ArgMax" Index (1,1)->(1,1) ["axis": Int, "keepdims": Int, "select_last_index": Int] "Index of the maximum along axis.";
    ArgMin "arg_min" "ArgMin" Index (1,1)->(1,1) ["axis": Int, "keepdims": Int, "select_last_index": Int] "Index of the minimum along axis.";
    CumSum "cum_sum" "CumSum" Index (2,2)->(1,1) ["exclusive": Int, "reverse": Int] "Running sum along the axis given by input 1.";
    CumProd "cum_prod" "CumProd" Index (2,2)->(1,1) ["exclusive": Int, "reverse": Int] "Running product along the axis given by input 1.";
    TopK "top_k" "TopK" Index (2,2)->(2,2) ["axis": Int, "largest": Int, "sorted": Int] "The k largest (or smallest) values and their indices along axis.";
    NonZero "non_zero" "NonZero" Index (1,1)->(1,1) [] "Indices of non-zero elements, shape [rank, count].";
    Unique "unique" "Unique" Index (1,1)->(1,4) ["axis": Int, "sorted": Int] "The distinct elements (or slices along axis), sorted (default) or in order of first occurrence; their first indices, each input's index into them, and their counts.";
    // ---- shape and movement
    Reshape "reshape" "Reshape" Movement (2,2)->(1,1) ["allowzero": Int] "Same data, shape from input 1 (0 copies, −1 infers).";
    Transpose "transpose" "Transpose" Movement (1,1)->(1,1) ["perm": Ints] "Permute dims (default: reverse).";
    Squeeze "squeeze" "Squeeze" Movement (1,2)->(1,1) [] "Drop size-1 dims (listed in input 1, or all).";
    Unsqueeze "unsqueeze" "Unsqueeze" Movement (2,2)->(1,1) [] "Insert size-1 dims at the axes in input 1.";
    Flatten "flatten" "Flatten" Movement (1,1)->(1,1) ["axis": Int] "2-D: dims before axis × dims from axis.";
    Concat "concat" "Concat" Movement (1,MANY)->(1,1) ["axis": Int] "Join along axis.";
    Split "split" "Split" Movement (1,2)->(1,MANY) ["axis": Int, "num_outputs": Int] "Split along axis into parts (sizes in input 1, or equal).";
    Slice "slice" "Slice" Movement (3,5)->(1,1) [] "Strided slice: starts, ends, axes, steps inputs.";
    Expand "expand" "Expand" Movement (2,2)->(1,1) [] "Broadcast to the shape in input 1.";
    Tile "tile" "Tile" Movement (2,2)->(1,1) [] "Repeat along each dim by input 1.";
    Pad "pad" "Pad" Movement (2,4)->(1,1) ["mode": Str] "Pad with pads, constant value and axes inputs; mode constant, reflect, edge or wrap.";
    Shape "shape" "Shape" Movement (1,1)->(1,1) ["end": Int, "start": Int] "The input's dims as i64, optionally sliced.";
    Size "size" "Size" Movement (1,1)->(1,1) [] "Element count as an i64 scalar.";
    DepthToSpace "depth_to_space" "DepthToSpace" Movement (1,1)->(1,1) ["blocksize": Int, "mode": Str] "Move channel blocks into spatial blocks (DCR or CRD).";
    SpaceToDepth "space_to_depth" "SpaceToDepth" Movement (1,1)->(1,1) ["blocksize": Int, "mode": Str] "Move spatial blocks into channels, ordered depth-column-row (DCR, default) or column-row-depth (CRD).";
    Trilu "trilu" "Trilu" Movement (1,2)->(1,1) ["upper": Int] "Keep the upper or lower triangle, offset by input 1.";
    OneHot "one_hot" "OneHot" Movement (3,3)->(1,1) ["axis": Int] "One-hot encode indices with depth and [off, on] values.";
    Compress "compress" "Compress" Movement (2,2)->(1,1) ["axis": Int] "Keep slices where the bool condition is true.";
    ReverseSequence "reverse_sequence" "ReverseSequence" Movement (2,2)->(1,1) ["batch_axis": Int, "time_axis": Int] "Reverse the first seq_lens[b] steps of each batch entry.";
    Dropout "dropout" "Dropout" Movement (1,3)->(1,2) ["seed": Int] "Identity at inference (training_mode false); optional all-true mask.";
    Resize "resize" "Resize" Resize (1,4)->(1,1) ["antialias": Int, "axes": Ints, "coordinate_transformation_mode": Str, "cubic_coeff_a": Float, "exclude_outside": Int, "extrapolation_value": Float, "keep_aspect_ratio_policy": Str, "mode": Str, "nearest_mode": Str] "Resample with roi, scales or sizes inputs (nearest, linear, cubic).";
    // ---- gather and scatter
    Gather "gather" "Gather" Gather (2,2)->(1,1) ["axis": Int] "Take slices along axis at the indices.";
    GatherElements "gather_elements" "GatherElements" Gather (2,2)->(1,1) ["axis": Int] "Take elements along axis, indices shaped like the output.";
    GatherNd "gather_nd" "GatherND" Gather (2,2)->(1,1) ["batch_dims": Int] "Take slices addressed by index tuples.";
    ScatterElements "scatter_elements" "ScatterElements" Scatter (3,3)->(1,1) ["axis": Int, "reduction": Str] "Write updates along axis at indices.";
    TensorScatter "tensor_scatter" "TensorScatter" Scatter (2,3)->(1,1) ["axis": Int, "mode": Str] "Write update into a copy of past_cache along axis (default −2), from each batch entry's write index (input 2, default 0); mode circular wraps around the cache (ONNX opset 24, KV caches).";
    ScatterNd "scatter_nd" "ScatterND" Scatter (3,3)->(1,1) ["reduction": Str] "Write update slices at index tuples.";
    // ---- signal windows and small utilities
    HannWindow "hann_window" "HannWindow" Constant (1,1)->(1,1) ["output_datatype": DType, "periodic": Int] "Hann window of the given length.";
    HammingWindow "hamming_window" "HammingWindow" Constant (1,1)->(1,1) ["output_datatype": DType, "periodic": Int] "Hamming window (α = 25/46) of the given length.";
    BlackmanWindow "blackman_window" "BlackmanWindow" Constant (1,1)->(1,1) ["output_datatype": DType, "periodic": Int] "Blackman window of the given length.";
    CenterCropPad "center_crop_pad" "CenterCropPad" Movement (2,2)->(1,1) ["axes": Ints] "Centre-crop or zero-pad each listed axis to the target size.";
    MaxUnpool "max_unpool" "MaxUnpool" Pool (2,3)->(1,1) ["kernel_shape": Ints, "pads": Ints, "strides": Ints] "Scatter max-pooled values back to their indices; zeros elsewhere.";
    RotaryEmbedding "rotary_embedding" "RotaryEmbedding" Attention (3,4)->(1,1) ["interleaved": Int, "num_heads": Int, "rotary_embedding_dim": Int] "Rotary position embedding of a 3-D or 4-D input from cos/sin caches.";
    NonMaxSuppression "non_max_suppression" "NonMaxSuppression" Index (2,5)->(1,1) ["center_point_box": Int] "Greedy IoU suppression per batch and class; [n, 3] selected (batch, class, box) indices.";
    AffineGrid "affine_grid" "AffineGrid" Resize (2,2)->(1,1) ["align_corners": Int] "Sampling grid [N, H, W, 2] (or 3-D) from affine matrices theta.";
    GridSample "grid_sample" "GridSample" Resize (2,2)->(1,1) ["align_corners": Int, "mode": Str, "padding_mode": Str] "Sample X at normalised grid points (nearest, linear, cubic; zeros, border, reflection padding).";
    Dft "dft" "DFT" Resize (1,3)->(1,1) ["inverse": Int, "onesided": Int] "Discrete Fourier transform along an axis (input 2, default −2) of real [...,1] or complex [...,2] data.";
    Stft "stft" "STFT" Resize (2,4)->(1,1) ["onesided": Int] "Short-time Fourier transform of a [B, L, 1|2] signal: frames of frame_length (input 3, or the window's length, input 2) every frame_step (input 1), windowed and transformed to [B, frames, bins, 2].";
    RoiAlign "roi_align" "RoiAlign" Resize (3,3)->(1,1) ["coordinate_transformation_mode": Str, "mode": Str, "output_height": Int, "output_width": Int, "sampling_ratio": Int, "spatial_scale": Float] "Pool each region of interest (rois [R, 4], from batch_indices) of X [N, C, H, W] into [R, C, output_height, output_width] by averaging (or taking the max of) bilinear samples.";
    StringConcat "string_concat" "StringConcat" Binary (2,2)->(1,1) [] "Elementwise string concatenation with broadcasting.";
    // ---- tables (no ONNX counterpart). Row expressions (`predicate`, `expr`) are SQL
    // expressions over the input's columns, identifiers double-quoted.
    ReadCsv "read_csv" "—" Table (0,0)->(1,1) ["header": Int, "na_values": Strs, "path": Str, "sep": Str] "Table from a CSV file (quoted fields; types sniffed; `na_values` read as missing).";
    ReadXlsx "read_xlsx" "—" Table (0,0)->(1,1) ["path": Str, "sheet": Str] "Table from one sheet of an Excel workbook (first row the header; first sheet by default).";
    ReadParquet "read_parquet" "—" Table (0,0)->(1,1) ["path": Str] "Table from a Parquet file.";
    WriteTable "write_table" "—" Table (1,1)->(1,1) ["format": Str, "path": Str] "Write a table as `csv` (with header) or `parquet`; yields the number of rows written (i64).";
    SelectColumns "select_columns" "—" Table (1,1)->(1,1) ["columns": Strs] "The named columns, in that order.";
    FilterRows "filter_rows" "—" Table (1,1)->(1,1) ["predicate": Row] "Rows where the predicate is true (missing counts as false).";
    WithColumn "with_column" "—" Table (1,1)->(1,1) ["expr": Row, "name": Str] "Add (or replace) a column computed per row.";
    GroupAgg "group_agg" "—" Table (1,1)->(1,1) ["columns": Strs, "funcs": Strs, "keys": Strs, "names": Strs] "Group by `keys` (sorted), then aggregate `funcs[i](columns[i])` into `names[i]` (count, sum, mean, std, var, min, max, median, first, nunique).";
    Describe "describe" "—" Table (1,1)->(1,1) ["columns": Strs, "stats": Strs] "pandas describe() of the numeric columns (or the `columns` named, which must be numeric): rows count, mean, std (sample), min, 25%, 50%, 75%, max (or the `stats` named), nulls skipped, quantiles linear.";
    Pivot "pivot" "—" Table (1,1)->(1,1) ["agg": Str, "columns": Str, "index": Str, "values": Str] "Pivot table: one row per `index` value, one column per distinct `columns` value, cells `agg(values)`.";
    Join "join" "—" Table (2,2)->(1,1) ["how": Str, "on": Strs] "Join two tables on equal `on` columns (inner, left or outer).";
    ConcatTables "concat_tables" "—" Table (1,MANY)->(1,1) [] "Rows of every input in order; columns matched by name (missing ones null).";
    SortRows "sort_rows" "—" Table (1,1)->(1,1) ["columns": Strs, "descending": Int] "Rows ordered by the columns (stable; missing values last).";
    Head "head" "—" Table (1,1)->(1,1) ["n": Int] "The first n rows.";
    Distinct "distinct" "—" Table (1,1)->(1,1) [] "Distinct rows, in order of first appearance.";
    ValueCounts "value_counts" "—" Table (1,1)->(1,1) ["column": Str] "Distinct values of a column with their counts (`count`), most frequent first.";
    TableToTensor "table_to_tensor" "—" Table (1,1)->(1,1) ["columns": Strs, "rows": Str] "f64 tensor [rows, len(columns)] of numeric columns (missing values NaN); `rows` names the row-count symbol.";
    Plot "plot" "—" Table (1,1)->(1,1) ["kind": Str, "path": Str, "title": Str, "x": Str, "y": Strs] "Draw a bar, line, scatter or hist chart of the columns to a PNG or SVG file; yields the rows drawn (i64).";
    // ---- quantization
    QuantizeLinear "quantize_linear" "QuantizeLinear" Quant (2,3)->(1,1) ["axis": Int, "block_size": Int, "output_dtype": DType, "precision": DType, "saturate": Int] "saturate(round(x / scale) + zero_point), scales per tensor, axis or block.";
    // ---- control flow: subgraphs are closed (`docs/sgr-ml.md`, control flow): each takes the
    // node's last `captures` inputs (outer values it reads) as its last inputs
    If "if" "If" Control (1,MANY)->(1,MANY) ["else_branch": Graph, "then_branch": Graph] "Runs then_branch if the one-element bool input 0 is true, else else_branch; each branch takes the node's other inputs (its captures) and gives the node's outputs.";
    Loop "loop" "Loop" Control (2,MANY)->(1,MANY) ["body": Graph, "captures": Int] "While the iteration count is below M (input 0, omitted: no limit) and the condition (input 1, omitted: true) holds, runs body(i, cond, carried…, captures…) → (cond, carried…, scan outputs…); outputs the final carried values and each scan output stacked along a new axis 0.";
    Scan "scan" "Scan" Control (1,MANY)->(1,MANY) ["body": Graph, "captures": Int, "num_scan_inputs": Int, "scan_input_axes": Ints, "scan_input_directions": Ints, "scan_output_axes": Ints, "scan_output_directions": Ints] "Runs body(state…, slices…, captures…) → (state…, output slices…) once per slice of the scan inputs along their axes (forward or reverse); outputs the final state and the output slices stacked along their axes.";
    OnnxOp "onnx_op" "—" Opaque (0,64)->(1,64) ["op_type": Str, "domain": Str, "opset": Int] "An ONNX node xpu has no op for (`op_type` in `domain` at `opset`), kept as it is so engines that take ONNX (ort, openvino) can run it; its other attributes are the node's own and its output types are the ones the model declares.";
    DequantizeLinear "dequantize_linear" "DequantizeLinear" Quant (2,3)->(1,1) ["axis": Int, "block_size": Int, "output_dtype": DType] "(x − zero_point) · scale, scales per tensor, axis or block.";
    DynamicQuantizeLinear "dynamic_quantize_linear" "DynamicQuantizeLinear" Quant (1,1)->(3,3) [] "u8 quantization with scale and zero point computed from the input's range.";
    MatMulInteger "matmul_integer" "MatMulInteger" Quant (2,4)->(1,1) [] "(A − a_zero_point) · (B − b_zero_point) in i32.";
    ConvInteger "conv_integer" "ConvInteger" Quant (2,4)->(1,1) ["auto_pad": Str, "dilations": Ints, "group": Int, "kernel_shape": Ints, "pads": Ints, "strides": Ints] "Convolution of (x − x_zero_point) and (w − w_zero_point) in i32.";
    QLinearMatMul "qlinear_matmul" "QLinearMatMul" Quant (8,8)->(1,1) [] "Quantized matmul: requantized (a − a_zp)·(b − b_zp)·a_scale·b_scale / y_scale + y_zp.";
    QLinearConv "qlinear_conv" "QLinearConv" Quant (8,9)->(1,1) ["auto_pad": Str, "dilations": Ints, "group": Int, "kernel_shape": Ints, "pads": Ints, "strides": Ints] "Quantized convolution with i32 bias, requantized to y_scale and y_zero_point.";
    // ---- recurrent layers
    Rnn "rnn" "RNN" Recurrent (3,6)->(0,2) ["activation_alpha": Floats, "activation_beta": Floats, "activations": Strs, "clip": Float, "direction": Str, "hidden_size": Int, "layout": Int] "Elman RNN over a sequence: outputs Y (all hidden states) and Y_h (last).";
    Gru "gru" "GRU" Recurrent (3,6)->(0,2) ["activation_alpha": Floats, "activation_beta": Floats, "activations": Strs, "clip": Float, "direction": Str, "hidden_size": Int, "layout": Int, "linear_before_reset": Int] "Gated recurrent unit over a sequence (gates z, r, h).";
    Lstm "lstm" "LSTM" Recurrent (3,8)->(0,3) ["activation_alpha": Floats, "activation_beta": Floats, "activations": Strs, "clip": Float, "direction": Str, "hidden_size": Int, "input_forget": Int, "layout": Int] "Long short-term memory over a sequence (gates i, o, f, c; optional peepholes): outputs Y, Y_h, Y_c.";
    // ---- attention and losses
    LinearAttention "linear_attention" "LinearAttention" Attention (3,6)->(1,2) ["chunk_size": Int, "kv_num_heads": Int, "q_num_heads": Int, "scale": Float, "update_rule": Str] "Linear attention over packed [B, T, H·D] query, key and value (ONNX opset 27): a recurrent state S per KV head, updated per token by the `update_rule` (linear, gated, delta, gated_delta; decay input 4, beta input 5), read as scale·qᵀS; optional past state in, present state out.";
    Attention "attention" "Attention" Attention (3,7)->(1,4) ["is_causal": Int, "kv_num_heads": Int, "left_window_size": Int, "q_num_heads": Int, "qk_matmul_output_mode": Int, "right_window_size": Int, "scale": Float, "softcap": Float, "softmax_precision": Int] "Scaled dot-product attention (ONNX opsets 23–25): optional mask, past key/value, padding lengths, causal and sliding-window masks.";
    SoftmaxCrossEntropyLoss "softmax_cross_entropy_loss" "SoftmaxCrossEntropyLoss" Loss (2,3)->(1,2) ["ignore_index": Int, "reduction": Str] "Cross entropy of softmax(scores) against labels; optional log-prob output.";
    NegativeLogLikelihoodLoss "negative_log_likelihood_loss" "NegativeLogLikelihoodLoss" Loss (2,3)->(1,1) ["ignore_index": Int, "reduction": Str] "−input[n, target[n], …]·weight, reduced.";
}

impl Op {
    pub fn name(self) -> &'static str {
        self.info().name
    }

    pub fn class(self) -> OpClass {
        self.info().class
    }

    pub fn is_elementwise(self) -> bool {
        self.class().is_elementwise()
    }

    /// Looks an op up by its ONNX (default domain) name.
    pub fn from_onnx(name: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|op| op.info().onnx == name)
    }
}

impl Serialize for Op {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Op {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Op, D::Error> {
        let name = std::borrow::Cow::<str>::deserialize(d)?;
        name.parse().map_err(|_| {
            let near = Op::ALL
                .iter()
                .map(|o| o.name())
                .find(|n| n.replace('_', "") == name.replace('_', "").to_ascii_lowercase());
            serde::de::Error::custom(match near {
                Some(n) => format!("unknown op `{name}`, did you mean `{n}`?"),
                None => format!("unknown op `{name}` (see docs/sgr-ops.md for the op set)"),
            })
        })
    }
}

impl JsonSchema for Op {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Op".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
        schemars::json_schema!({
            "description": "An SGR-ML op by its text-form name (docs/sgr-ops.md).",
            "type": "string",
            "enum": names,
        })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error for an unknown op name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown op `{0}` (see docs/sgr-ops.md for the op set)")]
pub struct UnknownOp(pub String);

impl FromStr for Op {
    type Err = UnknownOp;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Op::ALL.iter().copied().find(|op| op.name() == s).ok_or_else(|| UnknownOp(s.into()))
    }
}

/// The op reference (`docs/sgr-ops.md`), generated from the registry so it cannot drift.
pub fn reference_markdown() -> String {
    let arity = |(lo, hi): (usize, usize)| {
        if lo == hi {
            lo.to_string()
        } else if hi == MANY {
            format!("{lo}+")
        } else {
            format!("{lo}–{hi}")
        }
    };
    let mut s = String::from(
        "# SGR-ML op reference\n\nGenerated from `compiler/ir/src/op.rs` (`XPU_BLESS=1 cargo test -p xpu-tests --test generated` rewrites it). \
Semantics follow the newest ONNX opset of the op of the same name; older ONNX opsets are normalised by the importer. \
Inputs listed as a range are optional from the lower bound on; an omitted optional input is written `_` in the text form. \
Every op has a shape-inference rule (`compiler/ir/src/infer.rs`): dtypes are always inferred, dims where the inputs make them knowable.\n\n\
| op | ONNX | class | inputs | outputs | attributes | meaning |\n|---|---|---|---|---|---|---|\n",
    );
    for op in Op::ALL {
        let i = op.info();
        let attrs: Vec<String> =
            i.attrs.iter().map(|(n, k)| format!("`{n}`: {}", k.name())).collect();
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} |\n",
            i.name,
            i.onnx,
            i.class.name(),
            arity(i.inputs),
            arity(i.outputs),
            attrs.join(", "),
            i.doc.replace('|', "\\|")
        ));
    }
    s
}
