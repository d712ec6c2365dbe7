//! The reference interpreter: runs a verified kernel over host buffers, one scalar at a
//! time, with exactly the semantics the code generators must reproduce — f32 arithmetic in
//! f32 (transcendental functions by [`math`]'s exact sequences), f16/bf16 rounded on
//! store, reductions in their declared lane layout, NaN-propagating `max`/`min`, float→int
//! casts through i128 (numpy on x86). It is the oracle generated code is tested against,
//! and the way to run LIR where no compiler is available.

use std::collections::HashMap;

use crate::{
    Affine, BinaryOp, CmpOp, Expr, Kernel, Literal, ReduceOp, ScalarType, Stmt, UnaryOp, Var, math,
};

/// One scalar.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Value {
    Bool(bool),
    I32(i32),
    I64(i64),
    F32(f32),
    F64(f64),
}

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel @{kernel}: {message}")]
pub struct RunError {
    pub kernel: String,
    pub message: String,
}

/// Runs `kernel` (verified) with `syms` bound (in the kernel's symbol order) over
/// `buffers` (in parameter order, each exactly its shape's length, holding values of the
/// buffer's compute type). Writes land in the `out`/`inout` buffers.
pub fn run(kernel: &Kernel, syms: &[i64], buffers: &mut [Vec<Value>]) -> Result<(), RunError> {
    let err = |message: String| RunError { kernel: kernel.name.clone(), message };
    if syms.len() != kernel.syms.len() || buffers.len() != kernel.buffers.len() {
        return Err(err(format!(
            "{} symbols and {} buffers given for {} and {}",
            syms.len(),
            buffers.len(),
            kernel.syms.len(),
            kernel.buffers.len()
        )));
    }
    let mut ix: HashMap<Var, i64> = HashMap::new();
    for (name, &v) in kernel.syms.iter().zip(syms) {
        if v < 0 {
            return Err(err(format!("?{name} = {v} is negative")));
        }
        ix.insert(Var::Sym(name.clone()), v);
    }
    let mut dims = Vec::new();
    for (b, data) in kernel.buffers.iter().zip(buffers.iter()) {
        let extents: Vec<i64> = b
            .shape
            .iter()
            .map(|d| eval(d, &ix))
            .collect::<Option<_>>()
            .ok_or_else(|| err("shape overflows i64".into()))?;
        let len = extents
            .iter()
            .try_fold(1i64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| err(format!("%{} overflows i64", b.name)))?;
        if data.len() as i64 != len {
            return Err(err(format!(
                "%{} holds {} values; its shape needs {len}",
                b.name,
                data.len()
            )));
        }
        if let Some(v) = data.iter().find(|v| type_of(**v) != b.elem.compute()) {
            return Err(err(format!(
                "%{} holds {v:?}, not {} values",
                b.name,
                b.elem.compute().name()
            )));
        }
        dims.push(extents);
    }
    let mut m = Machine { kernel, buffers, dims, ix, values: HashMap::new() };
    m.block(&kernel.body).map_err(err)?;
    Ok(())
}

fn type_of(v: Value) -> ScalarType {
    match v {
        Value::Bool(_) => ScalarType::Bool,
        Value::I32(_) => ScalarType::I32,
        Value::I64(_) => ScalarType::I64,
        Value::F32(_) => ScalarType::F32,
        Value::F64(_) => ScalarType::F64,
    }
}

fn eval(a: &Affine, ix: &HashMap<Var, i64>) -> Option<i64> {
    a.terms()
        .iter()
        .try_fold(a.constant, |acc, (v, c)| acc.checked_add(ix.get(v)?.checked_mul(*c)?))
}

struct Machine<'k, 'b> {
    kernel: &'k Kernel,
    buffers: &'b mut [Vec<Value>],
    dims: Vec<Vec<i64>>,
    ix: HashMap<Var, i64>,
    values: HashMap<&'k str, Value>,
}

impl<'k> Machine<'k, '_> {
    fn index(&self, a: &Affine) -> Result<i64, String> {
        eval(a, &self.ix).ok_or_else(|| format!("index {a} overflows i64"))
    }

    /// The buffer `name` (its parameter number) and the flat position of `index` in it; out
    /// of range is an error (a verified kernel never gets one).
    fn place(&self, name: &str, index: &[Affine]) -> Result<(usize, usize), String> {
        let b = self
            .kernel
            .buffers
            .iter()
            .position(|b| b.name == name)
            .ok_or(format!("no buffer %{name}"))?;
        let mut flat = 0i64;
        for (a, &extent) in index.iter().zip(&self.dims[b]) {
            let i = self.index(a)?;
            if !(0..extent).contains(&i) {
                return Err(format!("%{name}: index {i} outside 0..{extent}"));
            }
            flat = flat * extent + i;
        }
        Ok((b, flat as usize))
    }

    fn get(&self, name: &str) -> Result<Value, String> {
        self.values.get(name).copied().ok_or(format!("%{name} has no value"))
    }

    fn block(&mut self, body: &'k [Stmt]) -> Result<Option<Value>, String> {
        for s in body {
            match s {
                Stmt::For { var, lo, hi, body, .. } => {
                    let (lo, hi) = (self.index(lo)?, self.index(hi)?);
                    let var = Var::Loop(var.clone());
                    for i in lo..hi {
                        self.ix.insert(var.clone(), i);
                        self.block(body)?;
                    }
                    self.ix.remove(&var);
                }
                Stmt::Let { name, value } => {
                    let v = self.expr(value)?;
                    self.values.insert(name, v);
                }
                Stmt::Store { buffer, index, value } => {
                    let (b, at) = self.place(buffer, index)?;
                    let v = narrow(self.kernel.buffers[b].elem, self.get(value)?);
                    self.buffers[b][at] = v;
                }
                Stmt::Yield(v) => return Ok(Some(self.get(v)?)),
            }
        }
        Ok(None)
    }

    fn expr(&mut self, e: &'k Expr) -> Result<Value, String> {
        Ok(match e {
            Expr::Const { ty, value } => constant(*ty, *value),
            Expr::Index(a) => Value::I64(self.index(a)?),
            Expr::Load { buffer, index } => {
                let (b, at) = self.place(buffer, index)?;
                self.buffers[b][at]
            }
            Expr::Unary { op, arg } => unary(*op, self.get(arg)?)?,
            Expr::Binary { op, lhs, rhs } => binary(*op, self.get(lhs)?, self.get(rhs)?)?,
            Expr::Compare { op, lhs, rhs } => {
                Value::Bool(compare(*op, self.get(lhs)?, self.get(rhs)?))
            }
            Expr::Select { cond, then, otherwise } => match self.get(cond)? {
                Value::Bool(true) => self.get(then)?,
                _ => self.get(otherwise)?,
            },
            Expr::Cast { arg, to } => cast(self.get(arg)?, *to),
            Expr::Reduce { op, ty, lanes, init, var, lo, hi, body } => {
                let (lo, hi) = (self.index(lo)?, self.index(hi)?);
                let mut acc = vec![constant(*ty, *init); *lanes as usize];
                let var = Var::Loop(var.clone());
                for (k, j) in (lo..hi).enumerate() {
                    self.ix.insert(var.clone(), j);
                    let v = self.block(body)?.ok_or("a reduction body yielded nothing")?;
                    let lane = &mut acc[k % *lanes as usize];
                    *lane = combine(*op, *lane, v)?;
                }
                self.ix.remove(&var);
                let mut total = acc[0];
                for &v in &acc[1..] {
                    total = combine(*op, total, v)?;
                }
                total
            }
        })
    }
}

/// A stored value, rounded to the buffer's storage type.
fn narrow(elem: ScalarType, v: Value) -> Value {
    match (elem, v) {
        (ScalarType::F16, Value::F32(x)) => Value::F32(half::f16::from_f32(x).to_f32()),
        (ScalarType::BF16, Value::F32(x)) => Value::F32(half::bf16::from_f32(x).to_f32()),
        _ => v,
    }
}

fn constant(ty: ScalarType, l: Literal) -> Value {
    let f = match l {
        Literal::Bool(b) => return Value::Bool(b),
        Literal::Int(i) => i as f64,
        Literal::Float(x) => x,
    };
    match (ty, l) {
        (ScalarType::I32, Literal::Int(i)) => Value::I32(i as i32),
        (ScalarType::I64, Literal::Int(i)) => Value::I64(i),
        (ScalarType::F64, _) => Value::F64(f),
        _ => Value::F32(f as f32),
    }
}

/// Applies `$f` to the float payload, keeping its width.
macro_rules! float_op {
    ($v:expr, $op:literal, |$x:ident| $f:expr) => {
        match $v {
            Value::F32($x) => Value::F32($f),
            Value::F64($x) => Value::F64($f),
            v => return Err(format!("`{}` of {v:?}", $op)),
        }
    };
}

fn unary(op: UnaryOp, v: Value) -> Result<Value, String> {
    use UnaryOp::*;
    Ok(match (op, v) {
        (Neg, Value::I32(i)) => Value::I32(i.wrapping_neg()),
        (Neg, Value::I64(i)) => Value::I64(i.wrapping_neg()),
        (Abs, Value::I32(i)) => Value::I32(i.wrapping_abs()),
        (Abs, Value::I64(i)) => Value::I64(i.wrapping_abs()),
        (Sign, Value::I32(i)) => Value::I32(i.signum()),
        (Sign, Value::I64(i)) => Value::I64(i.signum()),
        (Not, Value::Bool(b)) => Value::Bool(!b),
        (Not, Value::I32(i)) => Value::I32(!i),
        (Not, Value::I64(i)) => Value::I64(!i),
        (IsNan, Value::F32(x)) => Value::Bool(x.is_nan()),
        (IsNan, Value::F64(x)) => Value::Bool(x.is_nan()),
        (IsInf, Value::F32(x)) => Value::Bool(x.is_infinite()),
        (IsInf, Value::F64(x)) => Value::Bool(x.is_infinite()),
        (Neg, v) => float_op!(v, "neg", |x| -x),
        (Abs, v) => float_op!(v, "abs", |x| x.abs()),
        (Sign, v) => float_op!(v, "sign", |x| if x.is_nan() || x == 0.0 { x } else { x.signum() }),
        (Exp, Value::F32(x)) => Value::F32(math::expf(x)),
        (Log, Value::F32(x)) => Value::F32(math::logf(x)),
        (Log1p, Value::F32(x)) => Value::F32(math::log1pf(x)),
        (Expm1, Value::F32(x)) => Value::F32(math::expm1f(x)),
        (Expp1, Value::F32(x)) => Value::F32(math::expp1f(x)),
        (Tanh, Value::F32(x)) => Value::F32(math::tanhf(x)),
        (Erf, Value::F32(x)) => Value::F32(math::erff(x)),
        (Softplus, Value::F32(x)) => Value::F32(math::softplusf(x)),
        (Exp, v) => float_op!(v, "exp", |x| x.exp()),
        (Log, v) => float_op!(v, "log", |x| x.ln()),
        (Log1p, v) => float_op!(v, "log1p", |x| x.ln_1p()),
        (Expm1, v) => float_op!(v, "expm1", |x| x.exp_m1()),
        (Expp1, v) => float_op!(v, "expp1", |x| x.exp() + 1.0),
        (Sqrt, v) => float_op!(v, "sqrt", |x| x.sqrt()),
        (Recip, v) => float_op!(v, "recip", |x| 1.0 / x),
        (Tanh, v) => float_op!(v, "tanh", |x| x.tanh()),
        (Sin, v) => float_op!(v, "sin", |x| x.sin()),
        (Cos, v) => float_op!(v, "cos", |x| x.cos()),
        (Floor, v) => float_op!(v, "floor", |x| x.floor()),
        (Ceil, v) => float_op!(v, "ceil", |x| x.ceil()),
        (Round, v) => float_op!(v, "round", |x| x.round_ties_even()),
        (Erf, Value::F64(x)) => Value::F64(libm::erf(x)),
        (Softplus, Value::F64(x)) => Value::F64(math::softplus(x)),
        (op, v) => return Err(format!("`{}` of {v:?}", op.name())),
    })
}

/// The larger (`max`) or smaller of two floats; NaN wins.
fn extreme<T: PartialOrd + Copy>(max: bool, a: T, b: T, nan: impl Fn(T) -> bool) -> T {
    if nan(a) || nan(b) {
        return if nan(a) { a } else { b };
    }
    if (a < b) == max { b } else { a }
}

fn binary(op: BinaryOp, a: Value, b: Value) -> Result<Value, String> {
    use BinaryOp::*;
    macro_rules! int {
        ($x:expr, $y:expr, $wrap:path) => {
            $wrap(match op {
                Add => $x.wrapping_add($y),
                Sub => $x.wrapping_sub($y),
                Mul => $x.wrapping_mul($y),
                Div | Rem if $y == 0 => return Err("integer division by zero".into()),
                Div => $x.wrapping_div($y),
                Rem => $x.wrapping_rem($y),
                Max => $x.max($y),
                Min => $x.min($y),
                And => $x & $y,
                Or => $x | $y,
                Xor => $x ^ $y,
                Pow => return Err("`pow` of integers".into()),
            })
        };
    }
    macro_rules! float {
        ($x:expr, $y:expr, $wrap:path) => {
            $wrap(match op {
                Add => $x + $y,
                Sub => $x - $y,
                Mul => $x * $y,
                Div => $x / $y,
                Rem => $x % $y,
                Max => extreme(true, $x, $y, |v| v.is_nan()),
                Min => extreme(false, $x, $y, |v| v.is_nan()),
                Pow => $x.powf($y),
                And | Or | Xor => return Err(format!("`{}` of floats", op.name())),
            })
        };
    }
    Ok(match (a, b) {
        (Value::I32(x), Value::I32(y)) => int!(x, y, Value::I32),
        (Value::I64(x), Value::I64(y)) => int!(x, y, Value::I64),
        (Value::F32(x), Value::F32(y)) => float!(x, y, Value::F32),
        (Value::F64(x), Value::F64(y)) => float!(x, y, Value::F64),
        (Value::Bool(x), Value::Bool(y)) => Value::Bool(match op {
            And => x & y,
            Or => x | y,
            Xor => x ^ y,
            _ => return Err(format!("`{}` of bools", op.name())),
        }),
        (a, b) => return Err(format!("`{}` of {a:?} and {b:?}", op.name())),
    })
}

fn compare(op: CmpOp, a: Value, b: Value) -> bool {
    let ord = match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x.partial_cmp(&y),
        (Value::I32(x), Value::I32(y)) => x.partial_cmp(&y),
        (Value::I64(x), Value::I64(y)) => x.partial_cmp(&y),
        (Value::F32(x), Value::F32(y)) => x.partial_cmp(&y),
        (Value::F64(x), Value::F64(y)) => x.partial_cmp(&y),
        _ => None,
    };
    use std::cmp::Ordering::*;
    match op {
        CmpOp::Eq => ord == Some(Equal),
        CmpOp::Ne => ord != Some(Equal),
        CmpOp::Lt => ord == Some(Less),
        CmpOp::Le => matches!(ord, Some(Less | Equal)),
        CmpOp::Gt => ord == Some(Greater),
        CmpOp::Ge => matches!(ord, Some(Greater | Equal)),
    }
}

/// A float's integer value before narrowing: truncated toward zero, saturated at i128's
/// range, NaN as i64::MIN.
fn float_to_int(f: f64) -> i128 {
    if f.is_nan() { i64::MIN as i128 } else { f as i128 }
}

/// Conversions: float→int keeps the low bits of [`float_to_int`], anything→bool is `≠ 0`,
/// bool→number is 0/1.
fn cast(v: Value, to: ScalarType) -> Value {
    let f = match v {
        Value::Bool(b) => b as i64 as f64,
        Value::I32(i) => i as f64,
        Value::I64(i) => i as f64,
        Value::F32(x) => x as f64,
        Value::F64(x) => x,
    };
    match (to, v) {
        (ScalarType::Bool, _) => Value::Bool(f != 0.0), // NaN ≠ 0: true
        (ScalarType::I32, Value::I64(i)) => Value::I32(i as i32),
        (ScalarType::I64, Value::I64(i)) => Value::I64(i),
        // float → int as numpy's astype on x86 (and the cpu engine): truncate toward zero
        // through a 128-bit integer, keep the low bits; NaN is i64::MIN.
        (ScalarType::I32, _) => Value::I32(float_to_int(f) as i32),
        (ScalarType::I64, _) => Value::I64(float_to_int(f) as i64),
        (ScalarType::F64, Value::I64(i)) => Value::F64(i as f64),
        (ScalarType::F64, _) => Value::F64(f),
        (_, Value::I64(i)) => Value::F32(i as f32),
        _ => Value::F32(match v {
            Value::F64(x) => x as f32,
            Value::F32(x) => x,
            _ => f as f32,
        }),
    }
}

fn combine(op: ReduceOp, a: Value, b: Value) -> Result<Value, String> {
    binary(
        match op {
            ReduceOp::Add => BinaryOp::Add,
            ReduceOp::Mul => BinaryOp::Mul,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::Min => BinaryOp::Min,
        },
        a,
        b,
    )
}
