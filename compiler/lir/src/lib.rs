//! LIR-ML, the loop-level IR that codegen engines lower fused SGR-ML groups into: the *how*
//! beside SGR-ML's *what*. A kernel takes typed buffers (shapes of constants and symbols
//! such as `?n`, each marked `in`, `out` or `inout`) and runs a tree of loop nests over
//! them: loops with affine bounds (serial, or `parallel` for a static split across
//! threads), loads and stores with one affine index per dimension (a broadcast dimension is
//! index 0, a stride a coefficient), scalar arithmetic in SSA form, and reductions whose
//! accumulator layout is explicit (`lanes 8`: the k-th iteration adds into lane `k mod 8`,
//! the lanes are combined in order at the end — so the result does not depend on the vector
//! width of the machine that runs it). It has a text form that round-trips ([`parse`],
//! [`Module`]'s `Display`) and a verifier ([`verify`]) that proves every access in bounds
//! for every value of the symbols, so the code generated from a verified kernel needs no
//! per-access checks; [`interp`] runs a kernel scalar by scalar, the oracle generated code
//! is tested against. Modelled on MLIR's `scf` + `memref` + `arith` dialects, cut down to
//! what fused elementwise chains, row reductions and GEMM tiles need.

mod affine;
mod dce;
mod fuse;
pub mod interp;
pub mod math;
mod text;
mod verify;

pub use affine::{Affine, Var};
pub use dce::remove_dead_values;
pub use fuse::fuse_exp_plus_one;
pub use text::{ParseError, parse};
pub use verify::{VerifyError, verify};

/// The element types of buffers and values. `f16`/`bf16` exist only in buffers: a load
/// widens them to f32 and a store narrows f32 back ([`ScalarType::compute`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ScalarType {
    Bool,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

impl ScalarType {
    pub const ALL: [ScalarType; 7] = [
        ScalarType::Bool,
        ScalarType::I32,
        ScalarType::I64,
        ScalarType::F16,
        ScalarType::BF16,
        ScalarType::F32,
        ScalarType::F64,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ScalarType::Bool => "bool",
            ScalarType::I32 => "i32",
            ScalarType::I64 => "i64",
            ScalarType::F16 => "f16",
            ScalarType::BF16 => "bf16",
            ScalarType::F32 => "f32",
            ScalarType::F64 => "f64",
        }
    }

    pub fn from_name(name: &str) -> Option<ScalarType> {
        ScalarType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The type a value loaded from a buffer of this type has.
    pub fn compute(self) -> ScalarType {
        match self {
            ScalarType::F16 | ScalarType::BF16 => ScalarType::F32,
            t => t,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, ScalarType::F16 | ScalarType::BF16 | ScalarType::F32 | ScalarType::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(self, ScalarType::I32 | ScalarType::I64)
    }

    /// Bytes per element in a buffer.
    pub fn size(self) -> usize {
        match self {
            ScalarType::Bool => 1,
            ScalarType::F16 | ScalarType::BF16 => 2,
            ScalarType::I32 | ScalarType::F32 => 4,
            ScalarType::I64 | ScalarType::F64 => 8,
        }
    }
}

/// Whether a kernel reads a buffer, writes it, or both.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    In,
    Out,
    InOut,
}

impl Access {
    pub fn name(self) -> &'static str {
        match self {
            Access::In => "in",
            Access::Out => "out",
            Access::InOut => "inout",
        }
    }

    pub fn reads(self) -> bool {
        self != Access::Out
    }

    pub fn writes(self) -> bool {
        self != Access::In
    }
}

/// A kernel parameter: a dense row-major buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub name: String,
    pub elem: ScalarType,
    /// Each dimension's extent, affine in the kernel's symbols.
    pub shape: Vec<Affine>,
    pub access: Access,
}

/// A constant in the text form: its type comes from the op that holds it.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Literal {
    Bool(bool),
    Int(i64),
    Float(f64),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Not,
    Exp,
    Log,
    Log1p,
    Expm1,
    /// 1 + eˣ, in one sequence with a single scale factor (`math::expp1f`): the
    /// denominator of sigmoid, SiLU and the tanh form of GELU, a few instructions less than
    /// `exp` then `add`, which must also get subnormal results and overflow right.
    Expp1,
    Sqrt,
    Recip,
    Tanh,
    /// ln(1 + eˣ), computed as max(x, 0) + log1p(e^−|x|): no overflow, no cancellation.
    Softplus,
    Erf,
    Sin,
    Cos,
    Floor,
    Ceil,
    Round,
    Sign,
    IsNan,
    IsInf,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Max,
    Min,
    Pow,
    And,
    Or,
    Xor,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// How a reduction combines: `max`/`min` propagate NaN (numpy's rule).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Add,
    Mul,
    Max,
    Min,
}

/// Spelling of every op family, shared by the printer and the parser.
macro_rules! names {
    ($ty:ident { $($variant:ident => $name:literal),* $(,)? }) => {
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$variant),*];
            pub fn name(self) -> &'static str {
                match self { $($ty::$variant => $name),* }
            }
            pub fn from_name(name: &str) -> Option<$ty> {
                Self::ALL.iter().copied().find(|op| op.name() == name)
            }
        }
    };
}

names!(UnaryOp {
    Neg => "neg", Abs => "abs", Not => "not", Exp => "exp", Log => "log", Log1p => "log1p",
    Expm1 => "expm1", Expp1 => "expp1", Sqrt => "sqrt", Recip => "recip", Tanh => "tanh", Erf => "erf",
    Softplus => "softplus", Sin => "sin", Cos => "cos", Floor => "floor", Ceil => "ceil", Round => "round",
    Sign => "sign", IsNan => "isnan", IsInf => "isinf",
});
names!(BinaryOp {
    Add => "add", Sub => "sub", Mul => "mul", Div => "div", Rem => "rem", Max => "max",
    Min => "min", Pow => "pow", And => "and", Or => "or", Xor => "xor",
});
names!(CmpOp { Eq => "eq", Ne => "ne", Lt => "lt", Le => "le", Gt => "gt", Ge => "ge" });
names!(ReduceOp { Add => "add", Mul => "mul", Max => "max", Min => "min" });

/// The right-hand side of `%name = …`.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Const {
        ty: ScalarType,
        value: Literal,
    },
    /// A loop index or symbol expression as an i64 value.
    Index(Affine),
    Load {
        buffer: String,
        index: Vec<Affine>,
    },
    Unary {
        op: UnaryOp,
        arg: String,
    },
    Binary {
        op: BinaryOp,
        lhs: String,
        rhs: String,
    },
    Compare {
        op: CmpOp,
        lhs: String,
        rhs: String,
    },
    Select {
        cond: String,
        then: String,
        otherwise: String,
    },
    Cast {
        arg: String,
        to: ScalarType,
    },
    /// `op` over `var` in `lo..hi` of the value the body yields, into `lanes` accumulators
    /// that start at `init` and are combined in lane order at the end.
    Reduce {
        op: ReduceOp,
        ty: ScalarType,
        lanes: u32,
        init: Literal,
        var: String,
        lo: Affine,
        hi: Affine,
        body: Vec<Stmt>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `var` from `lo` up to (not including) `hi`; a `parallel` loop's range is split into
    /// fixed chunks run by different threads.
    For {
        var: String,
        lo: Affine,
        hi: Affine,
        parallel: bool,
        body: Vec<Stmt>,
    },
    Let {
        name: String,
        value: Expr,
    },
    Store {
        buffer: String,
        index: Vec<Affine>,
        value: String,
    },
    /// The value a reduction body contributes: its last statement.
    Yield(String),
}

/// One compiled unit: symbols (sizes bound at call time from the buffers' shapes), buffers
/// and the statements that run over them.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub syms: Vec<String>,
    pub buffers: Vec<Buffer>,
    pub body: Vec<Stmt>,
}

impl Kernel {
    pub fn buffer(&self, name: &str) -> Option<&Buffer> {
        self.buffers.iter().find(|b| b.name == name)
    }
}

/// The kernels of one program or one fused group's lowering.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Module {
    pub kernels: Vec<Kernel>,
}

/// Nesting deeper than this is refused by the parser and the verifier: no real kernel
/// comes near it, and recursion over a hostile file must not exhaust the stack.
pub const MAX_DEPTH: usize = 64;
