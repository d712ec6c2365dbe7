//! Expressions: scalar ops by type family, casts, and reductions unrolled over their lanes.

use xpu_lir::{BinaryOp, CmpOp, Expr, Literal, ReduceOp, ScalarType, UnaryOp};

use super::{CodegenError, FnEmitter, Val, constant, float_lit, math, reg_type};

type R<T> = Result<T, CodegenError>;

impl FnEmitter<'_> {
    pub(crate) fn expr(&mut self, e: &Expr) -> R<Val> {
        match e {
            Expr::Const { ty, value } => Ok(constant(*ty, *value)),
            Expr::Index(a) => Ok(Val { ty: ScalarType::I64, repr: self.affine(a) }),
            Expr::Load { buffer, index } => self.load(buffer, index),
            Expr::Unary { op, arg } => {
                let v = self.value(arg)?;
                self.unary(*op, v)
            }
            Expr::Binary { op, lhs, rhs } => {
                let (a, b) = (self.value(lhs)?, self.value(rhs)?);
                self.binary(*op, &a, &b)
            }
            Expr::Compare { op, lhs, rhs } => {
                let (a, b) = (self.value(lhs)?, self.value(rhs)?);
                Ok(self.compare(*op, &a, &b))
            }
            Expr::Select { cond, then, otherwise } => {
                let (c, a, b) = (self.value(cond)?, self.value(then)?, self.value(otherwise)?);
                let repr = self.inst(format!(
                    "select i1 {}, {} {}, {} {}",
                    c.repr,
                    a.llty(),
                    a.repr,
                    b.llty(),
                    b.repr
                ));
                Ok(Val { ty: a.ty, repr })
            }
            Expr::Cast { arg, to } => {
                let v = self.value(arg)?;
                Ok(self.cast(&v, to.compute()))
            }
            Expr::Reduce { op, ty, lanes, init, var, lo, hi, body } => {
                self.reduce(*op, *ty, *lanes, *init, var, (lo, hi), body)
            }
        }
    }

    fn unary(&mut self, op: UnaryOp, v: Val) -> R<Val> {
        use UnaryOp::*;
        let t = v.llty();
        let x = &v.repr;
        let repr = match v.ty {
            ScalarType::Bool => match op {
                Not => self.inst(format!("xor i1 {x}, true")),
                _ => return Err(self.err(format!("`{}` of a bool", op.name()))),
            },
            ty if ty.is_int() => match op {
                Neg => self.inst(format!("sub {t} 0, {x}")),
                Not => self.inst(format!("xor {t} {x}, -1")),
                Abs => {
                    let neg = self.inst(format!("sub {t} 0, {x}"));
                    let lt = self.inst(format!("icmp slt {t} {x}, 0"));
                    self.inst(format!("select i1 {lt}, {t} {neg}, {t} {x}"))
                }
                Sign => {
                    let gt = self.inst(format!("icmp sgt {t} {x}, 0"));
                    let lt = self.inst(format!("icmp slt {t} {x}, 0"));
                    let p = self.inst(format!("zext i1 {gt} to {t}"));
                    let n = self.inst(format!("zext i1 {lt} to {t}"));
                    self.inst(format!("sub {t} {p}, {n}"))
                }
                _ => return Err(self.err(format!("`{}` of an integer", op.name()))),
            },
            ty => {
                return self
                    .float_unary(op, ty, x)
                    .map(|repr| Val { ty: float_result(op, ty), repr });
            }
        };
        Ok(Val { ty: v.ty, repr })
    }

    fn float_unary(&mut self, op: UnaryOp, ty: ScalarType, x: &str) -> R<String> {
        use UnaryOp::*;
        let t = reg_type(ty);
        Ok(match op {
            Neg => self.inst(format!("fneg {t} {x}")),
            Abs => self.inst(format!("call {t} @llvm.fabs.{}({t} {x})", suffix(ty))),
            Sqrt => self.inst(format!("call {t} @llvm.sqrt.{}({t} {x})", suffix(ty))),
            Floor => self.inst(format!("call {t} @llvm.floor.{}({t} {x})", suffix(ty))),
            Ceil => self.inst(format!("call {t} @llvm.ceil.{}({t} {x})", suffix(ty))),
            Round => self.inst(format!("call {t} @llvm.roundeven.{}({t} {x})", suffix(ty))),
            Recip => self.inst(format!("fdiv {t} {}, {x}", float_lit(ty, 1.0))),
            IsNan => self.inst(format!("fcmp uno {t} {x}, {}", float_lit(ty, 0.0))),
            IsInf => {
                let a = self.inst(format!("call {t} @llvm.fabs.{}({t} {x})", suffix(ty)));
                self.inst(format!("fcmp oeq {t} {a}, {}", float_lit(ty, f64::INFINITY)))
            }
            Sign => {
                let one = float_lit(ty, 1.0);
                let gt = self.inst(format!("fcmp ogt {t} {x}, {}", float_lit(ty, 0.0)));
                let lt = self.inst(format!("fcmp olt {t} {x}, {}", float_lit(ty, 0.0)));
                let neg =
                    self.inst(format!("select i1 {lt}, {t} {}, {t} {x}", float_lit(ty, -1.0)));
                self.inst(format!("select i1 {gt}, {t} {one}, {t} {neg}"))
            }
            Not => return Err(self.err("`not` of a float")),
            Exp | Expp1 | Log | Log1p | Expm1 | Tanh | Erf | Softplus | Sin | Cos => {
                // exp's upper clamp changes nothing for a value already at most EXP_MAX (or
                // NaN, which passes it): the same bits without it.
                let capped = op == Exp
                    && self
                        .at_most
                        .get(x)
                        .is_some_and(|&c| c <= f64::from(xpu_lir::math::k::EXP_MAX));
                let f = if capped && ty == ScalarType::F32 {
                    Some(math::expf_at_most_max(&mut self.math))
                } else {
                    math::function(op, ty, &mut self.math)
                }
                .ok_or_else(|| self.err(format!("no function for `{}`", op.name())))?;
                self.inst(format!("call {t} {f}({t} {x})"))
            }
        })
    }

    fn binary(&mut self, op: BinaryOp, a: &Val, b: &Val) -> R<Val> {
        use BinaryOp::*;
        if a.ty != b.ty {
            return Err(self.err(format!(
                "`{}` of {} and {}",
                op.name(),
                a.ty.name(),
                b.ty.name()
            )));
        }
        let (t, x, y) = (a.llty(), &a.repr, &b.repr);
        let repr = match a.ty {
            ScalarType::Bool => match op {
                And => self.inst(format!("and i1 {x}, {y}")),
                Or => self.inst(format!("or i1 {x}, {y}")),
                Xor => self.inst(format!("xor i1 {x}, {y}")),
                _ => return Err(self.err(format!("`{}` of bools", op.name()))),
            },
            ty if ty.is_int() => match op {
                Add => self.inst(format!("add {t} {x}, {y}")),
                Sub => self.inst(format!("sub {t} {x}, {y}")),
                Mul => self.inst(format!("mul {t} {x}, {y}")),
                Div | Rem => self.int_division(op == Div, t, x, y),
                Max => {
                    let gt = self.inst(format!("icmp sgt {t} {x}, {y}"));
                    self.inst(format!("select i1 {gt}, {t} {x}, {t} {y}"))
                }
                Min => {
                    let lt = self.inst(format!("icmp slt {t} {x}, {y}"));
                    self.inst(format!("select i1 {lt}, {t} {x}, {t} {y}"))
                }
                And => self.inst(format!("and {t} {x}, {y}")),
                Or => self.inst(format!("or {t} {x}, {y}")),
                Xor => self.inst(format!("xor {t} {x}, {y}")),
                Pow => return Err(self.err("`pow` of integers")),
            },
            ty => match op {
                Add => self.inst(format!("fadd {t} {x}, {y}")),
                Sub => self.inst(format!("fsub {t} {x}, {y}")),
                Mul => self.inst(format!("fmul {t} {x}, {y}")),
                Div => self.inst(format!("fdiv {t} {x}, {y}")),
                Rem => self.inst(format!("frem {t} {x}, {y}")),
                Max | Min => self.float_extreme(op == Max, t, x, y),
                Pow => self.inst(format!("call {t} @llvm.pow.{}({t} {x}, {t} {y})", suffix(ty))),
                And | Or | Xor => return Err(self.err(format!("`{}` of floats", op.name()))),
            },
        };
        Ok(Val { ty: a.ty, repr })
    }

    /// Signed division or remainder that cannot trap: a zero divisor gives 0 and
    /// `MIN / -1` wraps (the interpreter reports the zero divisor as an error instead; the
    /// planner does not give integer division to this engine).
    fn int_division(&mut self, div: bool, t: &str, x: &str, y: &str) -> String {
        let zero = self.inst(format!("icmp eq {t} {y}, 0"));
        let minus1 = self.inst(format!("icmp eq {t} {y}, -1"));
        let bad = self.inst(format!("or i1 {zero}, {minus1}"));
        let safe = self.inst(format!("select i1 {bad}, {t} 1, {t} {y}"));
        let q = self.inst(format!("{} {t} {x}, {safe}", if div { "sdiv" } else { "srem" }));
        let neg = self.inst(format!("sub {t} 0, {x}"));
        let by_minus1 = if div { neg } else { "0".to_string() };
        let r = self.inst(format!("select i1 {minus1}, {t} {by_minus1}, {t} {q}"));
        self.inst(format!("select i1 {zero}, {t} 0, {t} {r}"))
    }

    /// max/min where a NaN operand wins (numpy's `maximum`), the first NaN if both are.
    pub(crate) fn float_extreme(&mut self, max: bool, t: &str, x: &str, y: &str) -> String {
        let pred = if max { "olt" } else { "ogt" };
        let take_y = self.inst(format!("fcmp {pred} {t} {x}, {y}"));
        let pick = self.inst(format!("select i1 {take_y}, {t} {y}, {t} {x}"));
        if let Some(c) = number_constant(y) {
            // A NaN x fails the ordered compare and is picked: nothing more to check (LLVM
            // cannot see that the two NaN selects below are then redundant).
            if !max {
                self.at_most.insert(pick.clone(), c);
            }
            return pick;
        }
        let y_nan = self.inst(format!("fcmp uno {t} {y}, {y}"));
        let x_nan = self.inst(format!("fcmp uno {t} {x}, {x}"));
        let with_y = self.inst(format!("select i1 {y_nan}, {t} {y}, {t} {pick}"));
        self.inst(format!("select i1 {x_nan}, {t} {x}, {t} {with_y}"))
    }

    fn compare(&mut self, op: CmpOp, a: &Val, b: &Val) -> Val {
        let t = a.llty();
        let pred = match (a.ty, op) {
            (ty, op) if ty.is_float() => match op {
                CmpOp::Eq => "fcmp oeq",
                CmpOp::Ne => "fcmp une",
                CmpOp::Lt => "fcmp olt",
                CmpOp::Le => "fcmp ole",
                CmpOp::Gt => "fcmp ogt",
                CmpOp::Ge => "fcmp oge",
            },
            (ScalarType::Bool, op) => match op {
                CmpOp::Eq => "icmp eq",
                CmpOp::Ne => "icmp ne",
                CmpOp::Lt => "icmp ult",
                CmpOp::Le => "icmp ule",
                CmpOp::Gt => "icmp ugt",
                CmpOp::Ge => "icmp uge",
            },
            (_, op) => match op {
                CmpOp::Eq => "icmp eq",
                CmpOp::Ne => "icmp ne",
                CmpOp::Lt => "icmp slt",
                CmpOp::Le => "icmp sle",
                CmpOp::Gt => "icmp sgt",
                CmpOp::Ge => "icmp sge",
            },
        };
        let repr = self.inst(format!("{pred} {t} {}, {}", a.repr, b.repr));
        Val { ty: ScalarType::Bool, repr }
    }

    /// Conversions as the interpreter does them: float→int truncates through i128 and keeps
    /// the low bits (NaN → i64::MIN's), anything
    /// → bool is `≠ 0` (NaN → true), bool → number is 0 or 1.
    pub(crate) fn cast(&mut self, v: &Val, to: ScalarType) -> Val {
        use ScalarType::*;
        let (from, x) = (v.ty, &v.repr);
        let (ft, tt) = (reg_type(from), reg_type(to));
        let repr = match (from, to) {
            _ if from == to => x.clone(),
            (_, Bool) if from.is_float() => {
                self.inst(format!("fcmp une {ft} {x}, {}", float_lit(from, 0.0)))
            }
            (_, Bool) => self.inst(format!("icmp ne {ft} {x}, 0")),
            (Bool, _) if to.is_float() => self.inst(format!("uitofp i1 {x} to {tt}")),
            (Bool, _) => self.inst(format!("zext i1 {x} to {tt}")),
            (I32, I64) => self.inst(format!("sext i32 {x} to i64")),
            (I64, I32) => self.inst(format!("trunc i64 {x} to i32")),
            (_, _) if from.is_int() => self.inst(format!("sitofp {ft} {x} to {tt}")),
            (F32, F64) => self.inst(format!("fpext float {x} to double")),
            (F64, F32) => self.inst(format!("fptrunc double {x} to float")),
            _ => {
                // As the cpu engine (numpy's astype on x86): truncate through i128, NaN is
                // i64::MIN, keep the low bits.
                let wide = self
                    .inst(format!("call i128 @llvm.fptosi.sat.i128.{}({ft} {x})", suffix(from)));
                let nan = self.inst(format!("fcmp uno {ft} {x}, {x}"));
                let w = self.inst(format!("select i1 {nan}, i128 {}, i128 {wide}", i64::MIN));
                self.inst(format!("trunc i128 {w} to {tt}"))
            }
        };
        Val { ty: to, repr }
    }

    /// `lanes` accumulators: iteration k of `lo..hi` combines into lane `k mod lanes`, the
    /// lanes are combined in order at the end (the interpreter's order exactly). The body
    /// is emitted once per lane of a full round, then once per lane of the last, partial
    /// round behind a bound check.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        op: ReduceOp,
        ty: ScalarType,
        lanes: u32,
        init: Literal,
        var: &str,
        (lo, hi): (&xpu_lir::Affine, &xpu_lir::Affine),
        body: &[xpu_lir::Stmt],
    ) -> R<Val> {
        let ty = ty.compute();
        let t = reg_type(ty);
        let lanes = lanes.max(1) as i64;
        let (lo, hi) = (self.affine(lo), self.affine(hi));
        let init = constant(ty, init);
        let slots: Vec<String> = (0..lanes).map(|_| self.alloca(t)).collect();
        for s in &slots {
            self.line(format!("store {t} {}, ptr {s}", init.repr));
        }
        // Rounds of `lanes` iterations up to `end`, the rest after.
        let n = self.inst(format!("sub i64 {hi}, {lo}"));
        let pos = self.inst(format!("call i64 @llvm.smax.i64(i64 {n}, i64 0)"));
        let rest = self.inst(format!("srem i64 {pos}, {lanes}"));
        let full = self.inst(format!("sub i64 {pos}, {rest}"));
        let end = self.inst(format!("add i64 {lo}, {full}"));
        let step = |f: &mut Self, slot: &str, at: &str| -> R<()> {
            let v = f.with_index(var, at, |f| f.block_of(body))?;
            let v = v.ok_or_else(|| f.err("a reduction body yields nothing"))?;
            let acc = f.inst(format!("load {t}, ptr {slot}"));
            let next = f.combine(op, ty, &acc, &v.repr)?;
            f.line(format!("store {t} {next}, ptr {slot}"));
            Ok(())
        };
        self.stepped_loop(&format!("{var}.round"), &lo, &end, lanes, |f, j| {
            for (l, slot) in slots.iter().enumerate() {
                let at = f.add_lane(j, l as i64);
                step(f, slot, &at)?;
            }
            Ok(())
        })?;
        for (l, slot) in slots.iter().enumerate().take(lanes as usize - 1) {
            let at = self.add_lane(&end, l as i64);
            let inside = self.inst(format!("icmp slt i64 {at}, {hi}"));
            let (then, done) = (self.label(), self.label());
            self.line(format!("br i1 {inside}, label %{then}, label %{done}"));
            self.start_block(&then);
            step(self, slot, &at)?;
            self.line(format!("br label %{done}"));
            self.start_block(&done);
        }
        let mut total = self.inst(format!("load {t}, ptr {}", slots[0]));
        for slot in &slots[1..] {
            let lane = self.inst(format!("load {t}, ptr {slot}"));
            total = self.combine(op, ty, &total, &lane)?;
        }
        Ok(Val { ty, repr: total })
    }

    fn add_lane(&mut self, base: &str, l: i64) -> String {
        if l == 0 { base.to_string() } else { self.inst(format!("add nsw i64 {base}, {l}")) }
    }

    fn combine(&mut self, op: ReduceOp, ty: ScalarType, acc: &str, v: &str) -> R<String> {
        let a = Val { ty, repr: acc.to_string() };
        let b = Val { ty, repr: v.to_string() };
        let bop = match op {
            ReduceOp::Add => BinaryOp::Add,
            ReduceOp::Mul => BinaryOp::Mul,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::Min => BinaryOp::Min,
        };
        Ok(self.binary(bop, &a, &b)?.repr)
    }
}

/// Whether an operand is a float constant other than NaN (constants are written as the
/// hex of their f64 bits, [`super::float_lit`]).
/// The value of a float constant written as its bits (`float_lit`), unless it is a NaN.
fn number_constant(repr: &str) -> Option<f64> {
    repr.strip_prefix("0x")
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .map(f64::from_bits)
        .filter(|v| !v.is_nan())
}

/// The LLVM intrinsic suffix of a float type.
pub(crate) fn suffix(ty: ScalarType) -> &'static str {
    match ty {
        ScalarType::F64 => "f64",
        ScalarType::I32 => "i32",
        ScalarType::I64 => "i64",
        _ => "f32",
    }
}

/// The type a float unary op returns (the predicates return bool).
fn float_result(op: UnaryOp, ty: ScalarType) -> ScalarType {
    match op {
        UnaryOp::IsNan | UnaryOp::IsInf => ScalarType::Bool,
        _ => ty,
    }
}
