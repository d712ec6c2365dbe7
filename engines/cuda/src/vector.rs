//! Four elements per thread in elementwise kernels. A chain like softplus spends a third of
//! its instructions on indexing, 4-byte loads and the grid-stride loop; taking four
//! consecutive elements of the innermost dimension per iteration moves an f32 buffer read
//! or written contiguously with one 16-byte load or store and computes the indices once
//! for the four. Which kernels qualify: a band (the loops spread over the grid) whose
//! innermost loop has a constant extent that is a multiple of 4, a body of plain
//! statements (no nested loop or reduction), and at least one contiguous f32 access. An
//! access is contiguous when its flat offset moves by 1 with the innermost index and its
//! other terms keep the first of the four 16-byte aligned (multiples of 4); an access that
//! does not move with it (a broadcast) is read once per thread; any other is read per
//! element. The kernel tests its buffers' alignment when it starts and takes the element
//! at a time path when one is not 16-byte aligned, so a misaligned pointer costs speed,
//! never a fault.

use std::collections::BTreeSet;

use xpu_lir::{Affine, Expr, Kernel, ScalarType, Stmt, Var};

/// Elements each thread takes per iteration.
pub const WIDTH: i64 = 4;

/// How a vectorised kernel reaches its buffers.
#[derive(Debug, Default, PartialEq)]
pub struct VectorPlan {
    /// The innermost band loop, taken four at a time.
    pub var: String,
    /// Accesses `(buffer, flat offset as text key)` moved with one 16-byte load or store.
    contiguous: BTreeSet<(String, String)>,
    /// Buffers with a contiguous access: the alignment test covers them.
    pub aligned: BTreeSet<String>,
}

/// The flat element offset of `index` into a buffer of `shape` (row-major), when every
/// extent is a constant.
pub fn flat_offset(shape: &[Affine], index: &[Affine]) -> Option<Affine> {
    let mut offset = Affine::constant(0);
    for (d, a) in index.iter().enumerate() {
        let extent = shape.get(d).map_or(Some(1), Affine::as_constant)?;
        offset = offset.checked_scale(extent)?.checked_add(a)?;
    }
    Some(offset)
}

/// The coefficient of loop `var` in `a`.
fn coefficient(a: &Affine, var: &str) -> i64 {
    a.terms().iter().find(|(v, _)| *v == Var::Loop(var.to_string())).map_or(0, |(_, c)| *c)
}

impl VectorPlan {
    /// The plan for a kernel whose band is `band` (outermost first) over `body`, or `None`
    /// when it does not qualify.
    pub fn for_band(k: &Kernel, band: &[(&str, &Affine, &Affine)], body: &[Stmt]) -> Option<Self> {
        let &(var, lo, hi) = band.last()?;
        let (lo, hi) = (lo.as_constant()?, hi.as_constant()?);
        if hi <= lo || (hi - lo) % WIDTH != 0 || lo % WIDTH != 0 {
            return None;
        }
        let mut plan = VectorPlan { var: var.to_string(), ..Default::default() };
        for s in body {
            let (buffer, index) = match s {
                Stmt::Let { value: Expr::Load { buffer, index }, .. } => (buffer, index),
                Stmt::Store { buffer, index, .. } => (buffer, index),
                Stmt::Let { value: Expr::Reduce { .. }, .. } | Stmt::For { .. } => return None,
                Stmt::Let { .. } | Stmt::Yield(_) => continue,
            };
            let b = k.buffer(buffer)?;
            let offset = flat_offset(&b.shape, index)?;
            let aligned_rest = offset.constant % WIDTH == 0
                && offset
                    .terms()
                    .iter()
                    .all(|(v, c)| *v == Var::Loop(var.to_string()) || c % WIDTH == 0);
            if b.elem == ScalarType::F32 && coefficient(&offset, var) == 1 && aligned_rest {
                plan.contiguous.insert((buffer.clone(), offset.to_string()));
                plan.aligned.insert(buffer.clone());
            }
        }
        (!plan.contiguous.is_empty()).then_some(plan)
    }

    /// Whether the access of `buffer` at `index` moves with one 16-byte load or store.
    pub fn is_contiguous(&self, k: &Kernel, buffer: &str, index: &[Affine]) -> bool {
        let Some(offset) = k.buffer(buffer).and_then(|b| flat_offset(&b.shape, index)) else {
            return false;
        };
        self.contiguous.contains(&(buffer.to_string(), offset.to_string()))
    }
}
