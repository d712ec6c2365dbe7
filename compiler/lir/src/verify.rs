//! The verifier: names defined once and used in scope, types that agree, buffers read and
//! written as declared, every index provably inside its buffer for every value of the
//! symbols, reductions well formed, parallel loops only at the top of a nest. Code generated
//! from a verified kernel needs no per-access bounds checks; the caller binds the symbols
//! from the actual buffers' shapes and checks their sizes once per call.

use std::collections::{HashMap, HashSet};

use crate::{
    Affine, BinaryOp, Buffer, Expr, Kernel, Literal, MAX_DEPTH, Module, ScalarType, Stmt, UnaryOp,
    Var,
};

/// What is wrong, naming the kernel and the statement (`%name`, `store %buf`, `for %i`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel @{kernel}: {at}: {message}")]
pub struct VerifyError {
    pub kernel: String,
    pub at: String,
    pub message: String,
}

/// Checks every kernel of `module`; the first problem found is returned.
pub fn verify(module: &Module) -> Result<(), VerifyError> {
    let mut names = HashSet::new();
    for k in &module.kernels {
        if !names.insert(&k.name) {
            return Err(VerifyError {
                kernel: k.name.clone(),
                at: "header".into(),
                message: "a second kernel of this name".into(),
            });
        }
        Checker::new(k)?.block(&k.body, &Ctx::default())?;
    }
    Ok(())
}

/// Every value's type in a kernel that verifies (`None` for one that does not): the
/// verifier's own typing, for passes that need a value's type.
pub(crate) fn value_types(kernel: &Kernel) -> Option<HashMap<String, ScalarType>> {
    let mut c = Checker::new(kernel).ok()?;
    c.block(&kernel.body, &Ctx::default()).ok()?;
    Some(c.values.into_iter().map(|(name, (ty, _))| (name, ty)).collect())
}

/// Where a statement sits: the loop indices in scope (with their ranges), whether inside a
/// parallel loop or a reduction body, and the nesting depth.
#[derive(Clone, Default)]
struct Ctx {
    loops: Vec<(String, Affine, Affine)>,
    in_parallel: bool,
    in_reduce: bool,
    depth: usize,
}

struct Checker<'k> {
    kernel: &'k Kernel,
    /// Every value defined so far, with its type and whether it is still in scope.
    values: HashMap<String, (ScalarType, bool)>,
}

impl<'k> Checker<'k> {
    fn new(kernel: &'k Kernel) -> Result<Self, VerifyError> {
        let c = Checker { kernel, values: HashMap::new() };
        let mut seen = HashSet::new();
        for s in &kernel.syms {
            if !seen.insert(format!("?{s}")) {
                return Err(c.err("header", format!("symbol ?{s} declared twice")));
            }
        }
        for b in &kernel.buffers {
            if !seen.insert(format!("%{}", b.name)) {
                return Err(c.err("header", format!("buffer %{} declared twice", b.name)));
            }
            for d in &b.shape {
                c.affine_vars(d, &Ctx::default(), &format!("buffer %{}", b.name))?;
                if !d.never_negative() {
                    return Err(c.err(
                        &format!("buffer %{}", b.name),
                        format!("extent {d} can be negative"),
                    ));
                }
            }
        }
        Ok(c)
    }

    fn err(&self, at: &str, message: impl Into<String>) -> VerifyError {
        VerifyError {
            kernel: self.kernel.name.clone(),
            at: at.to_string(),
            message: message.into(),
        }
    }

    /// Variables of `a` must be declared symbols or loop indices in scope.
    fn affine_vars(&self, a: &Affine, ctx: &Ctx, at: &str) -> Result<(), VerifyError> {
        for v in a.vars() {
            let known = match v {
                Var::Sym(s) => self.kernel.syms.contains(s),
                Var::Loop(i) => ctx.loops.iter().any(|(name, ..)| name == i),
            };
            if !known {
                return Err(self.err(
                    at,
                    format!("{v} is not a symbol of the kernel or a loop index in scope"),
                ));
            }
        }
        Ok(())
    }

    fn block(&mut self, body: &[Stmt], ctx: &Ctx) -> Result<(), VerifyError> {
        if ctx.depth > MAX_DEPTH {
            return Err(self.err("body", format!("blocks nested deeper than {MAX_DEPTH}")));
        }
        let mut defined_here = Vec::new();
        for (i, s) in body.iter().enumerate() {
            match s {
                Stmt::For { var, lo, hi, parallel, body } => {
                    let at = format!("for %{var}");
                    if *parallel && (ctx.in_parallel || ctx.in_reduce) {
                        return Err(
                            self.err(&at, "a parallel loop inside a parallel loop or a reduction")
                        );
                    }
                    let inner = self.enter_loop(ctx, var, lo, hi, &at)?;
                    let inner = Ctx { in_parallel: ctx.in_parallel || *parallel, ..inner };
                    self.block(body, &inner)?;
                }
                Stmt::Let { name, value } => {
                    let at = format!("%{name}");
                    if self.values.contains_key(name) || ctx.loops.iter().any(|(l, ..)| l == name) {
                        return Err(self.err(
                            &at,
                            "defined twice (values and loop indices are named once per kernel)",
                        ));
                    }
                    let ty = self.expr(value, ctx, &at)?;
                    self.values.insert(name.clone(), (ty, true));
                    defined_here.push(name.clone());
                }
                Stmt::Store { buffer, index, value } => {
                    let at = format!("store %{buffer}");
                    if ctx.in_reduce {
                        return Err(self.err(&at, "a store inside a reduction body"));
                    }
                    let b = self.access(buffer, index, ctx, &at)?;
                    if !b.access.writes() {
                        return Err(self.err(&at, format!("%{buffer} is an `in` buffer")));
                    }
                    let ty = self.use_value(value, &at)?;
                    if ty != b.elem.compute() {
                        return Err(self.err(
                            &at,
                            format!("stores a {} value into a {} buffer", ty.name(), b.elem.name()),
                        ));
                    }
                }
                Stmt::Yield(v) => {
                    if !ctx.in_reduce || i + 1 != body.len() {
                        return Err(self.err(
                            &format!("yield %{v}"),
                            "`yield` must be the last statement of a reduction body",
                        ));
                    }
                    self.use_value(v, &format!("yield %{v}"))?;
                }
            }
        }
        // Values defined in this block go out of scope with it.
        for name in defined_here {
            if let Some(v) = self.values.get_mut(&name) {
                v.1 = false;
            }
        }
        Ok(())
    }

    /// The context inside a loop (or reduction) over `var` in `lo..hi`.
    fn enter_loop(
        &self,
        ctx: &Ctx,
        var: &str,
        lo: &Affine,
        hi: &Affine,
        at: &str,
    ) -> Result<Ctx, VerifyError> {
        if self.values.contains_key(var) || ctx.loops.iter().any(|(l, ..)| l == var) {
            return Err(self.err(at, format!("%{var} is already defined")));
        }
        self.affine_vars(lo, ctx, at)?;
        self.affine_vars(hi, ctx, at)?;
        if !self.lower_bound(lo, ctx).is_some_and(|l| l.never_negative()) {
            return Err(self.err(at, format!("lower bound {lo} can be negative")));
        }
        let mut inner = ctx.clone();
        inner.loops.push((var.to_string(), lo.clone(), hi.clone()));
        inner.depth += 1;
        Ok(inner)
    }

    fn use_value(&self, name: &str, at: &str) -> Result<ScalarType, VerifyError> {
        match self.values.get(name) {
            Some((ty, true)) => Ok(*ty),
            Some((_, false)) => {
                Err(self.err(at, format!("%{name} is used outside the block that defines it")))
            }
            None => Err(self.err(at, format!("%{name} is not defined before this use"))),
        }
    }

    /// The buffer `name`, checked to be indexed with one in-bounds index per dimension.
    fn access(
        &self,
        name: &str,
        index: &[Affine],
        ctx: &Ctx,
        at: &str,
    ) -> Result<&'k Buffer, VerifyError> {
        let b =
            self.kernel.buffer(name).ok_or_else(|| self.err(at, format!("no buffer %{name}")))?;
        if index.len() != b.shape.len() {
            return Err(self
                .err(at, format!("{} indices for a rank-{} buffer", index.len(), b.shape.len())));
        }
        for (d, (i, extent)) in index.iter().zip(&b.shape).enumerate() {
            self.affine_vars(i, ctx, at)?;
            let low = self.lower_bound(i, ctx);
            let high = self
                .upper_bound(i, ctx)
                .and_then(|h| h.checked_sub(extent)?.checked_add(&Affine::constant(1)));
            match (low, high) {
                (Some(l), Some(h)) if l.never_negative() && h.never_positive() => {}
                (Some(_), Some(_)) => {
                    return Err(self.err(
                        at,
                        format!("index {i} of dimension {d} may fall outside 0..{extent}"),
                    ));
                }
                _ => return Err(self.err(at, format!("index {i} of dimension {d} overflows i64"))),
            }
        }
        Ok(b)
    }

    /// The least value of `a` over the loop ranges in scope, as an expression in symbols.
    fn lower_bound(&self, a: &Affine, ctx: &Ctx) -> Option<Affine> {
        self.bound(a, ctx, false)
    }

    /// The greatest value of `a` over the loop ranges in scope (a loop's last index is
    /// `hi − 1`), as an expression in symbols.
    fn upper_bound(&self, a: &Affine, ctx: &Ctx) -> Option<Affine> {
        self.bound(a, ctx, true)
    }

    /// Replaces loop indices, innermost first, by the end of their range that maximises (or
    /// minimises) the expression; bounds only mention outer indices, so this terminates.
    fn bound(&self, a: &Affine, ctx: &Ctx, upper: bool) -> Option<Affine> {
        let mut e = a.clone();
        for (var, lo, hi) in ctx.loops.iter().rev() {
            let Some(&(_, c)) = e.terms().iter().find(|(v, _)| *v == Var::Loop(var.clone())) else {
                continue;
            };
            let last = hi.checked_sub(&Affine::constant(1))?;
            let end = if (c > 0) == upper { &last } else { lo };
            let without = e.checked_sub(&Affine::index(var).checked_scale(c)?)?;
            e = without.checked_add(&end.checked_scale(c)?)?;
        }
        Some(e)
    }

    fn expr(&mut self, e: &Expr, ctx: &Ctx, at: &str) -> Result<ScalarType, VerifyError> {
        match e {
            Expr::Const { ty, value } => {
                self.literal_fits(*ty, *value, at)?;
                Ok(*ty)
            }
            Expr::Index(a) => {
                self.affine_vars(a, ctx, at)?;
                Ok(ScalarType::I64)
            }
            Expr::Load { buffer, index } => {
                let b = self.access(buffer, index, ctx, at)?;
                if !b.access.reads() {
                    return Err(self.err(at, format!("%{buffer} is an `out` buffer")));
                }
                Ok(b.elem.compute())
            }
            Expr::Unary { op, arg } => {
                let t = self.use_value(arg, at)?;
                unary_type(*op, t).ok_or_else(|| {
                    self.err(at, format!("`{}` does not take {}", op.name(), t.name()))
                })
            }
            Expr::Binary { op, lhs, rhs } => {
                let (l, r) = (self.use_value(lhs, at)?, self.use_value(rhs, at)?);
                if l != r {
                    return Err(
                        self.err(at, format!("`{}` of {} and {}", op.name(), l.name(), r.name()))
                    );
                }
                let ok = match op {
                    BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
                        l == ScalarType::Bool || l.is_int()
                    }
                    BinaryOp::Pow => l.is_float(),
                    _ => l != ScalarType::Bool,
                };
                ok.then_some(l).ok_or_else(|| {
                    self.err(at, format!("`{}` does not take {}", op.name(), l.name()))
                })
            }
            Expr::Compare { op, lhs, rhs } => {
                let (l, r) = (self.use_value(lhs, at)?, self.use_value(rhs, at)?);
                if l != r {
                    return Err(self
                        .err(at, format!("`cmp {}` of {} and {}", op.name(), l.name(), r.name())));
                }
                Ok(ScalarType::Bool)
            }
            Expr::Select { cond, then, otherwise } => {
                if self.use_value(cond, at)? != ScalarType::Bool {
                    return Err(self.err(at, "`select` needs a bool condition"));
                }
                let (t, f) = (self.use_value(then, at)?, self.use_value(otherwise, at)?);
                if t != f {
                    return Err(
                        self.err(at, format!("`select` between {} and {}", t.name(), f.name()))
                    );
                }
                Ok(t)
            }
            Expr::Cast { arg, to } => {
                self.use_value(arg, at)?;
                if to.compute() != *to {
                    return Err(
                        self.err(at, format!("{} is a storage type; values are f32", to.name()))
                    );
                }
                Ok(*to)
            }
            Expr::Reduce { ty, lanes, init, var, lo, hi, body, .. } => {
                if ty.compute() != *ty || *ty == ScalarType::Bool {
                    return Err(self.err(at, format!("a reduction over {}", ty.name())));
                }
                if !(1..=64).contains(lanes) {
                    return Err(self.err(at, format!("{lanes} lanes (1 to 64)")));
                }
                self.literal_fits(*ty, *init, at)?;
                let inner = self.enter_loop(ctx, var, lo, hi, at)?;
                let inner = Ctx { in_reduce: true, ..inner };
                let Some(Stmt::Yield(y)) = body.last() else {
                    return Err(self.err(at, "a reduction body must end with `yield`"));
                };
                self.block(body, &inner)?;
                let yielded = self.values.get(y).map(|v| v.0);
                if yielded != Some(*ty) {
                    return Err(
                        self.err(at, format!("the body yields %{y}, not a {} value", ty.name()))
                    );
                }
                Ok(*ty)
            }
        }
    }

    fn literal_fits(&self, ty: ScalarType, value: Literal, at: &str) -> Result<(), VerifyError> {
        let ok = match (ty, value) {
            (ScalarType::Bool, Literal::Bool(_)) => true,
            (ScalarType::I32, Literal::Int(v)) => i32::try_from(v).is_ok(),
            (ScalarType::I64, Literal::Int(_)) => true,
            (t, Literal::Int(_) | Literal::Float(_)) if t.is_float() => t.compute() == t,
            _ => false,
        };
        ok.then_some(())
            .ok_or_else(|| self.err(at, format!("{value:?} is not a {} constant", ty.name())))
    }
}

/// The result type of a unary op on `t`, if it takes `t`.
fn unary_type(op: UnaryOp, t: ScalarType) -> Option<ScalarType> {
    use UnaryOp::*;
    match op {
        Not => (t == ScalarType::Bool || t.is_int()).then_some(t),
        Neg | Abs | Sign => (t != ScalarType::Bool).then_some(t),
        IsNan | IsInf => t.is_float().then_some(ScalarType::Bool),
        _ => t.is_float().then_some(t),
    }
}
