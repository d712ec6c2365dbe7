//! Each elementwise SGR-ML op as LIR-ML scalar statements, following the cpu engine's
//! formulas (the reference the differential tests hold this engine to).

use xpu_ir::{Attrs, DType, Op, OpClass};
use xpu_lir::{BinaryOp as B, CmpOp as C, Expr, Literal, ScalarType, Stmt, UnaryOp as U};

/// Builds the statements of one loop body, naming every value `%t<n>` and knowing its
/// type, so a constant combined with a value takes that value's type (a chain may mix
/// f64 and f32 through casts).
pub struct Body {
    pub stmts: Vec<Stmt>,
    next: usize,
    /// The compute type of values the body did not define (a reduction's accumulators).
    pub ty: ScalarType,
    /// Prefixes every name, so one group's statements can be emitted several times in a
    /// kernel (a softmax's passes) with names still defined once.
    prefix: String,
    types: std::collections::HashMap<String, ScalarType>,
    /// Where in `stmts` each value the body defined is, for the idiom rewrites
    /// ([`Body::un`]).
    defs: std::collections::HashMap<String, usize>,
    /// Values that are softplus(v) (the op, or `log(1 + exp(v))` rewritten), by v.
    softplus_of: std::collections::HashMap<String, String>,
    /// Values that are 2 / d (`1 + tanh(z)` rewritten), by d.
    twice_recip_of: std::collections::HashMap<String, String>,
}

impl Body {
    pub fn new(ty: ScalarType) -> Body {
        Body::with_prefix(ty, "t")
    }

    pub fn with_prefix(ty: ScalarType, prefix: &str) -> Body {
        Body {
            stmts: Vec::new(),
            next: 0,
            ty,
            prefix: prefix.to_string(),
            types: Default::default(),
            defs: Default::default(),
            softplus_of: Default::default(),
            twice_recip_of: Default::default(),
        }
    }

    /// The type of a value: what the body defined it as, else the compute type.
    pub fn type_of(&self, name: &str) -> ScalarType {
        self.types.get(name).copied().unwrap_or(self.ty)
    }

    pub fn let_(&mut self, value: Expr) -> String {
        let ty = match &value {
            Expr::Const { ty, .. } | Expr::Reduce { ty, .. } => ty.compute(),
            Expr::Cast { to, .. } => to.compute(),
            Expr::Index(_) => ScalarType::I64,
            Expr::Compare { .. } | Expr::Unary { op: U::IsNan | U::IsInf, .. } => ScalarType::Bool,
            Expr::Unary { arg, .. } => self.type_of(arg),
            Expr::Binary { lhs, .. } => self.type_of(lhs),
            Expr::Select { then, .. } => self.type_of(then),
            Expr::Load { .. } => self.ty,
        };
        self.next += 1;
        let name = format!("{}{}", self.prefix, self.next);
        self.defs.insert(name.clone(), self.stmts.len());
        self.stmts.push(Stmt::Let { name: name.clone(), value });
        self.types.insert(name.clone(), ty);
        name
    }

    /// A load of `buffer[index]`, whose elements are `elem`.
    pub fn load(&mut self, buffer: &str, index: xpu_lir::Affine, elem: ScalarType) -> String {
        let name = self.let_(Expr::Load { buffer: buffer.into(), index: vec![index] });
        self.types.insert(name.clone(), elem.compute());
        name
    }

    /// The constant `v` in the type of value `like`.
    pub fn num_like(&mut self, like: &str, v: f64) -> String {
        let ty = self.type_of(like);
        let value = match ty {
            ScalarType::Bool => Literal::Bool(v != 0.0),
            t if t.is_int() => Literal::Int(v as i64),
            _ => Literal::Float(v),
        };
        self.let_(Expr::Const { ty, value })
    }

    /// A value computed by the caller's statements, adopted so later ones can use it.
    pub fn push(&mut self, stmt: Stmt) {
        self.stmts.push(stmt);
    }

    pub fn num(&mut self, v: f64) -> String {
        let ty = self.ty;
        self.let_(Expr::Const { ty, value: Literal::Float(v) })
    }

    pub fn un(&mut self, op: U, a: &str) -> String {
        if let Some(v) = self.unary_idiom(op, a) {
            return v;
        }
        self.let_(Expr::Unary { op, arg: a.into() })
    }

    pub fn bin(&mut self, op: B, a: &str, b: &str) -> String {
        if let Some(v) = self.binary_idiom(op, a, b) {
            return v;
        }
        self.let_(Expr::Binary { op, lhs: a.into(), rhs: b.into() })
    }

    pub fn cmp(&mut self, op: C, a: &str, b: &str) -> String {
        self.let_(Expr::Compare { op, lhs: a.into(), rhs: b.into() })
    }

    pub fn sel(&mut self, c: &str, a: &str, b: &str) -> String {
        self.let_(Expr::Select { cond: c.into(), then: a.into(), otherwise: b.into() })
    }

    /// `op(a, constant)`.
    fn bin_k(&mut self, op: B, a: &str, k: f64) -> String {
        let k = self.num_like(a, k);
        self.bin(op, a, &k)
    }

    /// `a op constant`, as a compare.
    fn cmp_k(&mut self, op: C, a: &str, k: f64) -> String {
        let k = self.num_like(a, k);
        self.cmp(op, a, &k)
    }

    fn clamp(&mut self, x: &str, lo: f64, hi: f64) -> String {
        let a = self.bin_k(B::Max, x, lo);
        self.bin_k(B::Min, &a, hi)
    }

    /// 1 / (1 + e^-x), as the cpu engine computes it on each side of 0.
    fn sigmoid(&mut self, x: &str) -> String {
        let ax = self.un(U::Abs, x);
        let nax = self.un(U::Neg, &ax);
        let e = self.un(U::Exp, &nax);
        let one = self.num_like(x, 1.0);
        let d = self.bin(B::Add, &one, &e);
        let pos = self.bin(B::Div, &one, &d);
        let neg = self.bin(B::Div, &e, &d);
        let ge = self.cmp_k(C::Ge, x, 0.0);
        self.sel(&ge, &pos, &neg)
    }

    /// ln(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|), as the cpu engine.
    fn softplus(&mut self, x: &str) -> String {
        let sp = self.let_(Expr::Unary { op: U::Softplus, arg: x.into() });
        self.softplus_of.insert(sp.clone(), x.into());
        sp
    }

    /// What the body defined `a` as.
    fn def(&self, a: &str) -> Option<&Expr> {
        match self.stmts.get(*self.defs.get(a)?)? {
            Stmt::Let { value, .. } => Some(value),
            _ => None,
        }
    }

    /// `a` as `op(v)` when the body defined it so.
    fn unary_arg(&self, a: &str, op: U) -> Option<String> {
        match self.def(a) {
            Some(Expr::Unary { op: o, arg }) if *o == op => Some(arg.clone()),
            _ => None,
        }
    }

    /// Whether `a` is the float constant `k`.
    fn is_const(&self, a: &str, k: f64) -> bool {
        self.float_const(a) == Some(k)
    }

    /// `a`'s value when the body defined it as a float constant.
    fn float_const(&self, a: &str) -> Option<f64> {
        match self.def(a) {
            Some(Expr::Const { value: Literal::Float(v), .. }) => Some(*v),
            _ => None,
        }
    }

    /// `a` as `v · k` (either order) for a float constant `k`: `(v, k)`.
    fn times_const(&self, a: &str) -> Option<(String, f64)> {
        let Some(Expr::Binary { op: B::Mul, lhs, rhs }) = self.def(a) else { return None };
        match (self.float_const(lhs), self.float_const(rhs)) {
            (_, Some(k)) => Some((lhs.clone(), k)),
            (Some(k), _) => Some((rhs.clone(), k)),
            _ => None,
        }
    }

    /// Exporters write activations out op by op; three spellings cost a transcendental
    /// function more than an equal form does, and are rewritten (each within a few ulp of
    /// the op-by-op result, more accurate where that one cancels, same NaN/±inf results):
    /// - `log(1 + exp(v))` → softplus(v), kept +inf where exp(v) overflows, as written;
    /// - `tanh(softplus(v))` (Mish) → n / (n + 2), n = e·(e + 2), e = exp(min(v, K)): the
    ///   identity tanh(ln u) = (u² − 1)/(u² + 1) at u = 1 + e; K is where the result is 1.
    fn unary_idiom(&mut self, op: U, a: &str) -> Option<String> {
        let ty = self.type_of(a);
        if !matches!(ty, ScalarType::F32 | ScalarType::F64) {
            return None;
        }
        match op {
            U::Log => {
                let Some(Expr::Binary { op: B::Add, lhs, rhs }) = self.def(a).cloned() else {
                    return None;
                };
                let other = if self.is_const(&lhs, 1.0) {
                    rhs
                } else if self.is_const(&rhs, 1.0) {
                    lhs
                } else {
                    return None;
                };
                let v = self.unary_arg(&other, U::Exp)?;
                let sp = self.softplus(&v);
                // ln of the largest finite value: exp overflows above it.
                let ln_max = if ty == ScalarType::F32 { 88.722_84 } else { 709.782_712_893_384 };
                let big = self.cmp_k(C::Gt, &v, ln_max);
                let inf = self.num_like(&v, f64::INFINITY);
                let r = self.sel(&big, &inf, &sp);
                self.softplus_of.insert(r.clone(), v);
                Some(r)
            }
            U::Tanh => {
                let v = self.softplus_of.get(a)?.clone();
                let k = if ty == ScalarType::F32 { 10.0 } else { 40.0 };
                let vk = self.bin_k(B::Min, &v, k);
                let e = self.let_(Expr::Unary { op: U::Exp, arg: vk });
                let e2 = self.bin_k(B::Add, &e, 2.0);
                let n = self.bin(B::Mul, &e, &e2);
                let d = self.bin_k(B::Add, &n, 2.0);
                Some(self.bin(B::Div, &n, &d))
            }
            _ => None,
        }
    }

    fn binary_idiom(&mut self, op: B, a: &str, b: &str) -> Option<String> {
        if !matches!(self.type_of(a), ScalarType::F32 | ScalarType::F64) {
            return None;
        }
        match op {
            B::Add => self.one_plus_tanh(a, b),
            B::Mul => self.halved_twice_recip(a, b),
            _ => None,
        }
    }

    /// `1 + tanh(z)` (the tanh form of GELU) → 2 / (1 + exp(−2z)), the same value
    /// (2·sigmoid(2z)) without tanh's two branches and without cancelling near z = −∞.
    /// Where z = v·k (GELU's √(2/π)), −2z is v·(−2k): doubling is exact, so that is the
    /// same product but for a subnormal z (where exp gives 1 either way), one multiply less.
    fn one_plus_tanh(&mut self, a: &str, b: &str) -> Option<String> {
        let z = if self.is_const(a, 1.0) {
            self.unary_arg(b, U::Tanh)?
        } else if self.is_const(b, 1.0) {
            self.unary_arg(a, U::Tanh)?
        } else {
            return None;
        };
        let nz = match self.times_const(&z) {
            Some((v, k)) if k.is_finite() => self.bin_k(B::Mul, &v, -2.0 * k),
            _ => self.bin_k(B::Mul, &z, -2.0),
        };
        let e = self.un(U::Exp, &nz);
        let d = self.bin_k(B::Add, &e, 1.0);
        let two = self.num_like(&z, 2.0);
        let r = self.let_(Expr::Binary { op: B::Div, lhs: two, rhs: d.clone() });
        self.twice_recip_of.insert(r.clone(), d);
        Some(r)
    }

    /// GELU's halving of `x · (1 + tanh z)` once that is `x · (2/d)`: `(x · 2/d) · 0.5` and
    /// `(x · 0.5) · 2/d` → `x / d`. Scaling by 2 or ½ is exact, so that is x·(1/d) rounded
    /// once instead of twice (within an ulp of it; the same NaN and ±inf), two multiplies
    /// less.
    fn halved_twice_recip(&mut self, a: &str, b: &str) -> Option<String> {
        let halved = |body: &Body, p: &str, q: &str| -> Option<(String, String)> {
            // p = x · t with t = 2/d, q = 0.5
            if body.float_const(q) == Some(0.5) {
                let Some(Expr::Binary { op: B::Mul, lhs, rhs }) = body.def(p) else {
                    return None;
                };
                if let Some(d) = body.twice_recip_of.get(rhs) {
                    return Some((lhs.clone(), d.clone()));
                }
                return Some((rhs.clone(), body.twice_recip_of.get(lhs)?.clone()));
            }
            // p = t = 2/d, q = x · 0.5
            let d = body.twice_recip_of.get(p)?;
            let (x, k) = body.times_const(q)?;
            (k == 0.5).then(|| (x, d.clone()))
        };
        let (x, d) = halved(self, a, b).or_else(|| halved(self, b, a))?;
        Some(self.let_(Expr::Binary { op: B::Div, lhs: x, rhs: d }))
    }
}

/// Why an op cannot be lowered (the planner keeps such nodes elsewhere; this is the
/// engine's own check).
pub type Unsupported = String;

/// The ops [`lower`] takes; [`dtypes_of`] says at which dtypes.
pub const OPS: &[Op] = &[
    Op::Identity,
    Op::Abs,
    Op::Neg,
    Op::Exp,
    Op::Log,
    Op::Sqrt,
    Op::Reciprocal,
    Op::Floor,
    Op::Ceil,
    Op::Round,
    Op::Sign,
    Op::Sin,
    Op::Cos,
    Op::Tan,
    Op::Erf,
    Op::Tanh,
    Op::Sigmoid,
    Op::Relu,
    Op::Softplus,
    Op::Softsign,
    Op::Mish,
    Op::HardSwish,
    Op::IsNaN,
    Op::IsInf,
    Op::LeakyRelu,
    Op::Elu,
    Op::Selu,
    Op::Celu,
    Op::HardSigmoid,
    Op::ThresholdedRelu,
    Op::Shrink,
    Op::Gelu,
    Op::Swish,
    Op::Clip,
    Op::PRelu,
    Op::Add,
    Op::Sub,
    Op::Mul,
    Op::Div,
    Op::Pow,
    Op::Mod,
    Op::Max,
    Op::Min,
    Op::Sum,
    Op::Mean,
    Op::Equal,
    Op::Less,
    Op::LessOrEqual,
    Op::Greater,
    Op::GreaterOrEqual,
    Op::Where,
    Op::Cast,
    Op::Not,
    Op::And,
    Op::Or,
    Op::Xor,
    Op::BitwiseNot,
    Op::BitwiseAnd,
    Op::BitwiseOr,
    Op::BitwiseXor,
];

/// The arithmetic, compare and select ops of [`OPS`] that also compute on i32 and i64
/// (numpy's integer semantics: wrapping arithmetic). Integer `div` and `mod` are not among
/// them: a zero divisor is an error the cpu engine reports, and compiled code has no error
/// path.
pub const INT_OPS: &[Op] = &[
    Op::Identity,
    Op::Abs,
    Op::Neg,
    Op::Sign,
    Op::Relu,
    Op::Clip,
    Op::Add,
    Op::Sub,
    Op::Mul,
    Op::Max,
    Op::Min,
    Op::Sum,
    Op::Equal,
    Op::Less,
    Op::LessOrEqual,
    Op::Greater,
    Op::GreaterOrEqual,
    Op::Where,
    Op::Cast,
];

/// The ops of [`OPS`] besides the logical ones that also compute on bools.
pub const BOOL_OPS: &[Op] = &[Op::Identity, Op::Equal, Op::Where, Op::Cast];

/// The dtypes a node of `op` computes at in a kernel whose float dtypes are `floats`:
/// logical ops take bools, bitwise ops integers, the rest `floats` and what [`INT_OPS`] and
/// [`BOOL_OPS`] add.
pub fn dtypes_of(op: Op, floats: &[DType]) -> Vec<DType> {
    match op.class() {
        OpClass::Logical => vec![DType::Bool],
        OpClass::Bitwise => vec![DType::I32, DType::I64],
        _ => {
            let mut d = floats.to_vec();
            if INT_OPS.contains(&op) {
                d.extend([DType::I32, DType::I64]);
            }
            if BOOL_OPS.contains(&op) {
                d.push(DType::Bool);
            }
            d
        }
    }
}

/// Emits `op` over `args` (value names; `None` for an omitted optional input) into `b`;
/// `scalar(i)` is input `i`'s value when it is a one-element constant. Returns the name
/// of the result.
pub fn lower(
    b: &mut Body,
    op: Op,
    attrs: &Attrs,
    args: &[Option<String>],
    scalar: &dyn Fn(usize) -> Option<f64>,
    out: ScalarType,
) -> Result<String, Unsupported> {
    let arg = |i: usize| -> Result<String, Unsupported> {
        args.get(i).cloned().flatten().ok_or_else(|| format!("{op}: input {i} is missing"))
    };
    let x = arg(0)?;
    let alpha = |d: f64| attrs.float("alpha", d);
    Ok(match op {
        Op::Identity => x,
        Op::Abs => b.un(U::Abs, &x),
        Op::Neg => b.un(U::Neg, &x),
        Op::Exp => b.un(U::Exp, &x),
        Op::Log => b.un(U::Log, &x),
        Op::Sqrt => b.un(U::Sqrt, &x),
        Op::Reciprocal => b.un(U::Recip, &x),
        Op::Floor => b.un(U::Floor, &x),
        Op::Ceil => b.un(U::Ceil, &x),
        Op::Round => b.un(U::Round, &x),
        Op::Sign => b.un(U::Sign, &x),
        Op::Sin => b.un(U::Sin, &x),
        Op::Cos => b.un(U::Cos, &x),
        Op::Tan => {
            let (s, c) = (b.un(U::Sin, &x), b.un(U::Cos, &x));
            b.bin(B::Div, &s, &c)
        }
        Op::Erf => b.un(U::Erf, &x),
        Op::Tanh => b.un(U::Tanh, &x),
        Op::IsNaN => b.un(U::IsNan, &x),
        Op::IsInf => is_inf(b, &x, attrs),
        Op::Sigmoid => b.sigmoid(&x),
        Op::Relu => {
            let lt = b.cmp_k(C::Lt, &x, 0.0);
            let zero = b.num_like(&x, 0.0);
            b.sel(&lt, &zero, &x)
        }
        Op::Softplus => b.softplus(&x),
        Op::Softsign => {
            let a = b.un(U::Abs, &x);
            let d = b.bin_k(B::Add, &a, 1.0);
            b.bin(B::Div, &x, &d)
        }
        Op::Mish => {
            let sp = b.softplus(&x);
            let t = b.un(U::Tanh, &sp);
            b.bin(B::Mul, &x, &t)
        }
        Op::HardSwish => {
            let d = b.bin_k(B::Div, &x, 6.0);
            let s = b.bin_k(B::Add, &d, 0.5);
            let c = b.clamp(&s, 0.0, 1.0);
            b.bin(B::Mul, &x, &c)
        }
        Op::LeakyRelu => {
            let ax = b.bin_k(B::Mul, &x, alpha(0.01));
            let ge = b.cmp_k(C::Ge, &x, 0.0);
            b.sel(&ge, &x, &ax)
        }
        Op::Elu => {
            let e = b.un(U::Exp, &x);
            let em1 = b.bin_k(B::Sub, &e, 1.0);
            let neg = b.bin_k(B::Mul, &em1, alpha(1.0));
            let ge = b.cmp_k(C::Ge, &x, 0.0);
            b.sel(&ge, &x, &neg)
        }
        Op::Selu => {
            let (a, g) =
                (alpha(1.673_263_192_176_818_8), attrs.float("gamma", 1.050_701_022_148_132_3));
            let pos = b.bin_k(B::Mul, &x, g);
            let e = b.un(U::Exp, &x);
            let ae = b.bin_k(B::Mul, &e, a);
            let d = b.bin_k(B::Sub, &ae, a);
            let neg = b.bin_k(B::Mul, &d, g);
            let gt = b.cmp_k(C::Gt, &x, 0.0);
            b.sel(&gt, &pos, &neg)
        }
        Op::Celu => {
            let a = alpha(1.0);
            let pos = b.bin_k(B::Max, &x, 0.0);
            let xa = b.bin_k(B::Div, &x, a);
            let e = b.un(U::Exp, &xa);
            let em1 = b.bin_k(B::Sub, &e, 1.0);
            let s = b.bin_k(B::Mul, &em1, a);
            let neg = b.bin_k(B::Min, &s, 0.0);
            b.bin(B::Add, &pos, &neg)
        }
        Op::HardSigmoid => {
            let ax = b.bin_k(B::Mul, &x, alpha(0.2));
            let s = b.bin_k(B::Add, &ax, attrs.float("beta", 0.5));
            b.clamp(&s, 0.0, 1.0)
        }
        Op::ThresholdedRelu => {
            let gt = b.cmp_k(C::Gt, &x, alpha(1.0));
            let zero = b.num_like(&x, 0.0);
            b.sel(&gt, &x, &zero)
        }
        Op::Shrink => {
            let (bias, l) = (attrs.float("bias", 0.0), attrs.float("lambd", 0.5));
            let lo = b.cmp_k(C::Lt, &x, -l);
            let hi = b.cmp_k(C::Gt, &x, l);
            let plus = b.bin_k(B::Add, &x, bias);
            let minus = b.bin_k(B::Sub, &x, bias);
            let zero = b.num_like(&x, 0.0);
            let inner = b.sel(&hi, &minus, &zero);
            b.sel(&lo, &plus, &inner)
        }
        Op::Gelu => gelu(b, &x, attrs.str("approximate", "none") == "tanh"),
        Op::Swish => {
            let ax = b.bin_k(B::Mul, &x, alpha(1.0));
            let s = b.sigmoid(&ax);
            b.bin(B::Mul, &x, &s)
        }
        Op::Clip => {
            let mut v = x;
            if let Some(lo) = args.get(1).cloned().flatten() {
                v = b.bin(B::Max, &v, &lo);
            }
            if let Some(hi) = args.get(2).cloned().flatten() {
                v = b.bin(B::Min, &v, &hi);
            }
            v
        }
        Op::PRelu => {
            let slope = arg(1)?;
            let neg = b.bin(B::Mul, &slope, &x);
            let ge = b.cmp_k(C::Ge, &x, 0.0);
            b.sel(&ge, &x, &neg)
        }
        Op::Add => b.bin(B::Add, &x, &arg(1)?),
        Op::Sub => b.bin(B::Sub, &x, &arg(1)?),
        Op::Mul => b.bin(B::Mul, &x, &arg(1)?),
        Op::Div => b.bin(B::Div, &x, &arg(1)?),
        Op::Pow => pow(b, &x, &arg(1)?, scalar(1)),
        Op::Mod => {
            let y = arg(1)?;
            let r = b.bin(B::Rem, &x, &y);
            if attrs.int("fmod", 0) != 0 {
                r
            } else {
                // The divisor's sign, as Python's `%`: r + y where r ≠ 0 and signs differ.
                let nz = b.cmp_k(C::Ne, &r, 0.0);
                let rn = b.cmp_k(C::Lt, &r, 0.0);
                let yn = b.cmp_k(C::Lt, &y, 0.0);
                let differ = b.bin(B::Xor, &rn, &yn);
                let fix = b.bin(B::And, &nz, &differ);
                let adj = b.bin(B::Add, &r, &y);
                b.sel(&fix, &adj, &r)
            }
        }
        Op::Max | Op::Min | Op::Sum | Op::Mean => {
            let f = match op {
                Op::Max => B::Max,
                Op::Min => B::Min,
                _ => B::Add,
            };
            let mut acc = x;
            for i in 1..args.len() {
                acc = b.bin(f, &acc, &arg(i)?);
            }
            if op == Op::Mean {
                acc = b.bin_k(B::Div, &acc, args.len() as f64);
            }
            acc
        }
        Op::Equal => b.cmp(C::Eq, &x, &arg(1)?),
        Op::Less => b.cmp(C::Lt, &x, &arg(1)?),
        Op::LessOrEqual => b.cmp(C::Le, &x, &arg(1)?),
        Op::Greater => b.cmp(C::Gt, &x, &arg(1)?),
        Op::GreaterOrEqual => b.cmp(C::Ge, &x, &arg(1)?),
        Op::Where => {
            let (t, f) = (arg(1)?, arg(2)?);
            b.sel(&x, &t, &f)
        }
        Op::Cast => b.let_(Expr::Cast { arg: x, to: out.compute() }),
        // Logical ops on bools and bitwise ops on integers are the same LIR-ML operations.
        Op::Not | Op::BitwiseNot => b.un(U::Not, &x),
        Op::And | Op::BitwiseAnd => b.bin(B::And, &x, &arg(1)?),
        Op::Or | Op::BitwiseOr => b.bin(B::Or, &x, &arg(1)?),
        Op::Xor | Op::BitwiseXor => b.bin(B::Xor, &x, &arg(1)?),
        other => return Err(format!("the llvm engine does not lower {other}")),
    })
}

fn is_inf(b: &mut Body, x: &str, attrs: &Attrs) -> String {
    let (neg, pos) = (attrs.int("detect_negative", 1) != 0, attrs.int("detect_positive", 1) != 0);
    let inf = b.un(U::IsInf, x);
    match (neg, pos) {
        (true, true) => inf,
        (false, false) => b.let_(Expr::Const { ty: ScalarType::Bool, value: Literal::Bool(false) }),
        (want_neg, _) => {
            let side = b.cmp_k(if want_neg { C::Lt } else { C::Gt }, x, 0.0);
            b.bin(B::And, &inf, &side)
        }
    }
}

/// GELU as the cpu engine computes it: 0.5·x·(1 + erf(x/√2)), or the tanh form
/// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
fn gelu(b: &mut Body, x: &str, tanh_form: bool) -> String {
    let inner = if tanh_form {
        let x2 = b.bin(B::Mul, x, x);
        let x3 = b.bin(B::Mul, &x2, x);
        let c = b.bin_k(B::Mul, &x3, 0.044715);
        let s = b.bin(B::Add, x, &c);
        let k = b.bin_k(B::Mul, &s, (2.0 / std::f64::consts::PI).sqrt());
        b.un(U::Tanh, &k)
    } else {
        let d = b.bin_k(B::Div, x, std::f64::consts::SQRT_2);
        b.un(U::Erf, &d)
    };
    let one = b.bin_k(B::Add, &inner, 1.0);
    let hx = b.bin_k(B::Mul, x, 0.5);
    b.bin(B::Mul, &hx, &one)
}

/// `x^y`, with small integral constant exponents (as exporters write `x^2`, `x^3`) as
/// products.
fn pow(b: &mut Body, x: &str, y: &str, exponent: Option<f64>) -> String {
    match exponent {
        Some(1.0) => x.to_string(),
        Some(2.0) => b.bin(B::Mul, x, x),
        Some(3.0) => {
            let x2 = b.bin(B::Mul, x, x);
            b.bin(B::Mul, &x2, x)
        }
        _ => b.bin(B::Pow, x, y),
    }
}
