//! Matrix products (`llvm.gemm`): numpy's matmul with batch dims broadcast and 1-D operands,
//! as loops `i, k, j` — the row of `C` accumulated in place while `j` walks contiguous rows
//! of `B`, so the innermost loop vectorises — with the outermost loop (a batch dim, else
//! `i`) split across threads. The sum over `k` runs in order, with no FMA contraction: the
//! same bits at any thread count or vector width. Not tiled for cache yet.

use xpu_ir::NodeId;
use xpu_lir::{Access, Affine, BinaryOp as B, Expr, Literal, Stmt, Var};

use super::ops::Body;
use super::{LowerError, Lowering};

/// `Σ coefficient · %var`.
fn index(terms: &[(&str, i64)]) -> Affine {
    let terms = terms
        .iter()
        .filter(|(_, c)| *c != 0)
        .map(|(v, c)| (Var::Loop(v.to_string()), *c))
        .collect();
    Affine::from_terms(0, terms).unwrap_or_default()
}

impl Lowering<'_> {
    pub(super) fn matmul(&mut self, root: NodeId) -> Result<(), LowerError> {
        let g = self.g;
        let n = g.node(root);
        let (Some(a), Some(b)) = (n.inputs[0], n.inputs.get(1).copied().flatten()) else {
            return Err(self.err(root, "matmul needs two inputs"));
        };
        let leaves = super::Leaves {
            values: vec![a, b],
            shapes: vec![self.shape_of(root, a)?, self.shape_of(root, b)?],
            shape: Vec::new(),
        };
        let (sa, sb) = (leaves.shapes[0].clone(), leaves.shapes[1].clone());
        if sa.is_empty() || sb.is_empty() {
            return Err(self.err(root, "matmul of a scalar"));
        }
        // 1-D operands: a row vector on the left, a column vector on the right.
        let (m, k) = if sa.len() == 1 { (1, sa[0]) } else { (sa[sa.len() - 2], sa[sa.len() - 1]) };
        let (k2, nn) =
            if sb.len() == 1 { (sb[0], 1) } else { (sb[sb.len() - 2], sb[sb.len() - 1]) };
        if k != k2 {
            return Err(self.err(root, format!("inner dims differ: {sa:?} @ {sb:?}")));
        }
        let batch_a = &sa[..sa.len().saturating_sub(2)];
        let batch_b = &sb[..sb.len().saturating_sub(2)];
        let batch =
            xpu_ir::infer::broadcast_shapes(batch_a, batch_b).map_err(|e| self.err(root, e))?;
        let mut out_shape = batch.clone();
        if sa.len() > 1 {
            out_shape.push(m);
        }
        if sb.len() > 1 {
            out_shape.push(nn);
        }
        let total = out_shape.iter().try_fold(1usize, |x, &d| x.checked_mul(d));
        if total.is_none_or(|t| t.checked_mul(k.max(1)).is_none_or(|w| w > i64::MAX as usize / 16))
        {
            return Err(self.err(root, format!("shapes {sa:?} @ {sb:?} overflow index arithmetic")));
        }
        // Batch strides of each operand (0 where it broadcasts) and of the output.
        let batch_strides = |own: &[usize], matrix: usize| -> Vec<i64> {
            let r = batch.len();
            let mut out = vec![0i64; r];
            let mut acc = matrix as i64;
            for d in (0..r).rev() {
                let Some(o) = (d + own.len()).checked_sub(r) else { continue };
                if own[o] != 1 {
                    out[d] = acc;
                }
                acc *= own[o] as i64;
            }
            out
        };
        let (ba, bb, bc) = (
            batch_strides(batch_a, m * k),
            batch_strides(batch_b, k * nn),
            batch_strides(&batch, m * nn),
        );
        let compute = self.compute_type(&[root]);
        let out_dtype = g.ty(n.outputs[0]).dtype;
        if !matches!(out_dtype, xpu_ir::DType::F32 | xpu_ir::DType::F64) {
            // The row of C accumulates in the output buffer: f16/bf16 would round every step.
            return Err(self.err(root, format!("matmul into {out_dtype} (f32 and f64 only)")));
        }
        let (mut buffers, mut slots, _) = self.leaf_buffers(root, &leaves)?;
        let (mut out, slot) = self.output(root, &out_shape)?;
        out.access = Access::InOut;
        let vars: Vec<String> = (0..batch.len()).map(|d| format!("b{d}")).collect();
        let with_batch = |strides: &[i64], rest: &[(&str, i64)]| {
            let mut terms: Vec<(&str, i64)> =
                vars.iter().map(String::as_str).zip(strides.iter().copied()).collect();
            terms.extend_from_slice(rest);
            index(&terms)
        };
        let (ka, kb) = (k as i64, nn as i64);
        let c_at = with_batch(&bc, &[("i", kb), ("j", 1)]);
        let mut zero = Body::with_prefix(compute, "z");
        let z = zero.let_(Expr::Const { ty: compute, value: Literal::Float(0.0) });
        zero.push(Stmt::Store { buffer: out.name.clone(), index: vec![c_at.clone()], value: z });
        let mut inner = Body::with_prefix(compute, "m");
        let cv = inner.let_(Expr::Load { buffer: out.name.clone(), index: vec![c_at.clone()] });
        let bv = inner.let_(Expr::Load {
            buffer: "in1".into(),
            index: vec![with_batch(&bb, &[("k", kb), ("j", 1)])],
        });
        let p = inner.bin(B::Mul, "av", &bv);
        let s = inner.bin(B::Add, &cv, &p);
        inner.push(Stmt::Store { buffer: out.name.clone(), index: vec![c_at], value: s });
        let for_ = |var: &str, n: usize, parallel: bool, body: Vec<Stmt>| Stmt::For {
            var: var.into(),
            lo: Affine::constant(0),
            hi: Affine::constant(n as i64),
            parallel,
            body,
        };
        let row = vec![
            for_("j", nn, false, zero.stmts),
            for_(
                "k",
                k,
                false,
                vec![
                    Stmt::Let {
                        name: "av".into(),
                        value: Expr::Load {
                            buffer: "in0".into(),
                            index: vec![with_batch(&ba, &[("i", ka), ("k", 1)])],
                        },
                    },
                    for_("j", nn, false, inner.stmts),
                ],
            ),
        ];
        let mut body = vec![for_("i", m, batch.is_empty(), row)];
        for (d, &n) in batch.iter().enumerate().rev() {
            body = vec![for_(&vars[d], n, d == 0, body)];
        }
        buffers.push(out);
        slots.push(slot);
        self.push_kernel(root, &[root], buffers, slots, body);
        Ok(())
    }

    fn shape_of(&self, root: NodeId, v: xpu_ir::ValueId) -> Result<Vec<usize>, LowerError> {
        match self.places.get(&v) {
            Some(super::Place::Slot(_, s)) => Ok(s.clone()),
            _ => Err(self.err(root, format!("reads {v}, which is not computed yet"))),
        }
    }
}
