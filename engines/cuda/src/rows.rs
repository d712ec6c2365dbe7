//! Row groups as one kernel. The lowering writes softmax, the norms and log-sum-exp as two or
//! three kernels over the same rows — a reduction per row stored as one scalar per row, then
//! the next kernel reading that scalar while it walks the row again — so each kernel reads
//! the whole tensor from device memory. On a GPU that is two or three passes over memory
//! for what one pass can do: here consecutive kernels over the same rows are merged into
//! one, so a row's later passes read it while it is still in cache.
//!
//! Two steps merge when both are one loop over the same constant range, and every value the
//! second reads from the first is a per-row scalar (f32, f64, i32 or i64): stored by the
//! first once, at its top level, at the row's index, and loaded by the second only at that
//! index. The merged loop runs the first body then the second (renamed apart), the second
//! reading the first's value itself where it loaded the scalar (the store stays: the value
//! may be read later or be an output); every store stays indexed by the row, so rows stay
//! independent. The merged kernel must take a warp per row (a reduction of 32 or more
//! elements), have at least 64 rows, and pass the LIR-ML verifier, else the steps stay
//! apart.

use std::collections::HashMap;

use xpu_lir::{Access, Affine, Expr, Kernel, Module, ScalarType, Stmt, Var};
use xpu_lower::{Program, Slot, Step};

/// The fewest rows a merged kernel takes (a warp each).
const MIN_ROWS: i64 = 64;

/// `program` with consecutive row kernels merged (see the module doc).
pub fn merge_row_steps(program: Program) -> Program {
    let Program { steps, values, outputs } = program;
    let mut merged: Vec<Step> = Vec::with_capacity(steps.len());
    for (k, step) in steps.into_iter().enumerate() {
        match merged.last() {
            // `k` names the second kernel's values apart from every kernel merged before.
            Some(prev) => match merge(prev, &step, k) {
                Some(m) => {
                    merged.pop();
                    merged.push(m);
                }
                None => merged.push(step),
            },
            None => merged.push(step),
        }
    }
    Program { steps: merged, values, outputs }
}

/// The one loop a kernel's body is, with constant bounds: (var, lo, hi, parallel, body).
fn single_loop(k: &Kernel) -> Option<(&str, i64, i64, bool, &[Stmt])> {
    match k.body.as_slice() {
        [Stmt::For { var, lo, hi, parallel, body }] if k.syms.is_empty() => {
            Some((var, lo.as_constant()?, hi.as_constant()?, *parallel, body))
        }
        _ => None,
    }
}

fn merge(a: &Step, b: &Step, count: usize) -> Option<Step> {
    let (va, lo, hi, parallel, a_body) = single_loop(&a.kernel)?;
    let (vb, lo_b, hi_b, _, b_body) = single_loop(&b.kernel)?;
    if (lo, hi) != (lo_b, hi_b) {
        return None;
    }
    // B's buffers: shared with A (same computed value, or the same input), or its own.
    let row = |v: &str| vec![Affine::var(Var::Loop(v.to_string()))];
    let mut rename_buffer: HashMap<String, String> = HashMap::new();
    // B's buffers of A's per-row scalars → the value A stored (and its type): B reads the
    // value itself, not the memory (every lane of a warp holds it; a load could race the
    // one lane's store).
    let mut scalars: HashMap<String, (String, ScalarType)> = HashMap::new();
    let mut read_from_a: Vec<String> = Vec::new();
    let mut buffers = a.kernel.buffers.clone();
    let mut slots = a.buffers.clone();
    let prefix = format!("m{count}_");
    for (bb, slot) in b.kernel.buffers.iter().zip(&b.buffers) {
        let same = a.kernel.buffers.iter().zip(&a.buffers).find(|(ab, aslot)| {
            !matches!(slot, Slot::Constant(_))
                && *aslot == slot
                && ab.shape == bb.shape
                && ab.elem == bb.elem
        });
        match same {
            Some((ab, _)) if ab.access != Access::In => {
                // A value A writes and B reads: only as a per-row scalar, both sides, and
                // stored at A's top level from a value B can take as it is.
                let stored = stored_at_top(a_body, &ab.name, &row(va))?;
                let exact = matches!(
                    ab.elem,
                    ScalarType::F32 | ScalarType::F64 | ScalarType::I32 | ScalarType::I64
                );
                if bb.access != Access::In
                    || !exact
                    || !only_at(a_body, &ab.name, &row(va), true)
                    || !only_at(b_body, &bb.name, &row(vb), false)
                {
                    return None;
                }
                read_from_a.push(ab.name.clone());
                rename_buffer.insert(bb.name.clone(), ab.name.clone());
                scalars.insert(bb.name.clone(), (stored, ab.elem));
            }
            Some((ab, _)) if bb.access == Access::In => {
                rename_buffer.insert(bb.name.clone(), ab.name.clone());
            }
            Some(_) => return None,
            None => {
                let name = format!("{prefix}{}", bb.name);
                rename_buffer.insert(bb.name.clone(), name.clone());
                let mut own = bb.clone();
                own.name = name;
                buffers.push(own);
                slots.push(slot.clone());
            }
        }
    }
    if read_from_a.is_empty() {
        // Nothing flows from A to B: merging would only lengthen one kernel.
        return None;
    }
    for buf in &mut buffers {
        if read_from_a.contains(&buf.name) {
            buf.access = Access::InOut;
        }
    }
    let names = Renamer {
        prefix: &prefix,
        row_from: vb,
        row_to: va,
        buffers: &rename_buffer,
        scalars: &scalars,
    };
    let mut body = a_body.to_vec();
    body.extend(b_body.iter().map(|s| names.stmt(s)));
    let kernel = Kernel {
        name: format!("{}_{}", a.kernel.name, b.kernel.name),
        syms: Vec::new(),
        buffers,
        body: vec![Stmt::For {
            var: va.to_string(),
            lo: Affine::constant(lo),
            hi: Affine::constant(hi),
            parallel,
            body,
        }],
    };
    // Merging takes the second kernel's row loop out of the grid: worth it only where a
    // warp takes each row (a reduction of 32 or more elements) and there are rows enough
    // to fill warps — else one thread, or a few warps, would walk long rows that a grid of
    // threads covered.
    if crate::codegen::threads_per_iteration(&kernel) != 32 || hi - lo < MIN_ROWS {
        return None;
    }
    xpu_lir::verify(&Module { kernels: vec![kernel.clone()] }).ok()?;
    let mut nodes = a.nodes.clone();
    nodes.extend(&b.nodes);
    let implements = if a.implements == b.implements { a.implements } else { "llvm.reduce" };
    Some(Step { kernel, implements, buffers: slots, nodes })
}

/// The value stored into `buffer` at `index` by a statement at the top of `body` (the one
/// store of it there), if that is how `body` writes it.
fn stored_at_top(body: &[Stmt], buffer: &str, index: &[Affine]) -> Option<String> {
    let mut found = None;
    for s in body {
        if let Stmt::Store { buffer: b, index: i, value } = s
            && b == buffer
        {
            if i != index || found.is_some() {
                return None;
            }
            found = Some(value.clone());
        }
    }
    found
}

/// Whether every access (stores when `stores`, else loads) of `buffer` under `body` is at
/// exactly `index`.
fn only_at(body: &[Stmt], buffer: &str, index: &[Affine], stores: bool) -> bool {
    body.iter().all(|s| match s {
        Stmt::For { body, .. } => only_at(body, buffer, index, stores),
        Stmt::Let { value, .. } => match value {
            Expr::Load { buffer: b, index: i } if !stores && b == buffer => i == index,
            Expr::Reduce { body, .. } => only_at(body, buffer, index, stores),
            _ => true,
        },
        Stmt::Store { buffer: b, index: i, .. } => !stores || b != buffer || i == index,
        Stmt::Yield(_) => true,
    })
}

/// Renames the second kernel's names apart from the first's: values and loop variables get
/// a prefix, its row variable becomes the first's, buffers follow the map.
struct Renamer<'a> {
    prefix: &'a str,
    row_from: &'a str,
    row_to: &'a str,
    buffers: &'a HashMap<String, String>,
    /// Buffers of per-row scalars the first kernel computed → its value and type.
    scalars: &'a HashMap<String, (String, ScalarType)>,
}

impl Renamer<'_> {
    fn value(&self, n: &str) -> String {
        format!("{}{n}", self.prefix)
    }

    fn var(&self, n: &str) -> String {
        if n == self.row_from { self.row_to.to_string() } else { self.value(n) }
    }

    fn buffer(&self, n: &str) -> String {
        self.buffers.get(n).cloned().unwrap_or_else(|| self.value(n))
    }

    fn affine(&self, a: &Affine) -> Affine {
        let terms = a
            .terms()
            .iter()
            .map(|(v, c)| match v {
                Var::Loop(n) => (Var::Loop(self.var(n)), *c),
                Var::Sym(_) => (v.clone(), *c),
            })
            .collect();
        Affine::from_terms(a.constant, terms).unwrap_or_else(|| a.clone())
    }

    fn index(&self, i: &[Affine]) -> Vec<Affine> {
        i.iter().map(|a| self.affine(a)).collect()
    }

    fn stmt(&self, s: &Stmt) -> Stmt {
        match s {
            Stmt::For { var, lo, hi, parallel, body } => Stmt::For {
                var: self.var(var),
                lo: self.affine(lo),
                hi: self.affine(hi),
                parallel: *parallel,
                body: body.iter().map(|s| self.stmt(s)).collect(),
            },
            Stmt::Let { name, value } => {
                Stmt::Let { name: self.value(name), value: self.expr(value) }
            }
            Stmt::Store { buffer, index, value } => Stmt::Store {
                buffer: self.buffer(buffer),
                index: self.index(index),
                value: self.value(value),
            },
            Stmt::Yield(v) => Stmt::Yield(self.value(v)),
        }
    }

    fn expr(&self, e: &Expr) -> Expr {
        let v = |n: &String| self.value(n);
        match e {
            Expr::Const { .. } => e.clone(),
            Expr::Index(a) => Expr::Index(self.affine(a)),
            Expr::Load { buffer, .. } if self.scalars.contains_key(buffer) => {
                // The first kernel's value, unrenamed (it is the first kernel's name); a
                // cast to its own type is the identity.
                let (value, ty) = &self.scalars[buffer];
                Expr::Cast { arg: value.clone(), to: *ty }
            }
            Expr::Load { buffer, index } => {
                Expr::Load { buffer: self.buffer(buffer), index: self.index(index) }
            }
            Expr::Unary { op, arg } => Expr::Unary { op: *op, arg: v(arg) },
            Expr::Binary { op, lhs, rhs } => Expr::Binary { op: *op, lhs: v(lhs), rhs: v(rhs) },
            Expr::Compare { op, lhs, rhs } => Expr::Compare { op: *op, lhs: v(lhs), rhs: v(rhs) },
            Expr::Select { cond, then, otherwise } => {
                Expr::Select { cond: v(cond), then: v(then), otherwise: v(otherwise) }
            }
            Expr::Cast { arg, to } => Expr::Cast { arg: v(arg), to: *to },
            Expr::Reduce { op, ty, lanes, init, var, lo, hi, body } => Expr::Reduce {
                op: *op,
                ty: *ty,
                lanes: *lanes,
                init: *init,
                var: self.var(var),
                lo: self.affine(lo),
                hi: self.affine(hi),
                body: body.iter().map(|s| self.stmt(s)).collect(),
            },
        }
    }
}
