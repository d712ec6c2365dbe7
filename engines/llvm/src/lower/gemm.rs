//! Matrix products (`llvm.gemm`): numpy's matmul with batch dims broadcast and 1-D operands,
//! as loops `i, k, j` — the row of `C` accumulated in place while `j` walks contiguous rows
//! of `B`, so the innermost loop vectorises — with the outermost loop (a batch dim, else
//! `i`) split across threads. The sum over `k` runs in order, with no FMA contraction: the
//! same bits at any thread count or vector width. An epilogue — the elementwise ops that
//! consume the product (bias, activation) — runs over the finished row before it is
//! stored, so `relu(x @ w + b)` is one kernel. Not tiled for cache yet.

use xpu_ir::{DType, NodeId, ValueId};
use xpu_lir::{Access, Affine, BinaryOp as B, Buffer, Expr, Literal, Stmt};

use super::ops::Body;
use super::{LowerError, Lowering, Place, index, scalar_type, strides_in};

/// The loop structure of one product.
struct Dims {
    batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    out: Vec<usize>,
    /// Output dim → the loop variable that walks it.
    out_vars: Vec<String>,
    a: Vec<usize>,
    b: Vec<usize>,
}

impl Lowering<'_> {
    fn shape_of(&self, root: NodeId, v: ValueId) -> Result<Vec<usize>, LowerError> {
        match self.places.get(&v) {
            Some(Place::Slot(_, s)) => Ok(s.clone()),
            _ => Err(self.err(root, format!("reads {v}, which is not computed yet"))),
        }
    }

    fn operands(&self, mm: NodeId) -> Result<(ValueId, ValueId), LowerError> {
        match (
            self.g.node(mm).inputs.first().copied().flatten(),
            self.g.node(mm).inputs.get(1).copied().flatten(),
        ) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(self.err(mm, "matmul needs two inputs")),
        }
    }

    fn dims(&self, mm: NodeId) -> Result<Dims, LowerError> {
        let (a, b) = self.operands(mm)?;
        let (sa, sb) = (self.shape_of(mm, a)?, self.shape_of(mm, b)?);
        if sa.is_empty() || sb.is_empty() {
            return Err(self.err(mm, "matmul of a scalar"));
        }
        // 1-D operands: a row vector on the left, a column vector on the right.
        let (m, k) = if sa.len() == 1 { (1, sa[0]) } else { (sa[sa.len() - 2], sa[sa.len() - 1]) };
        let (k2, n) = if sb.len() == 1 { (sb[0], 1) } else { (sb[sb.len() - 2], sb[sb.len() - 1]) };
        if k != k2 {
            return Err(self.err(mm, format!("inner dims differ: {sa:?} @ {sb:?}")));
        }
        let batch = xpu_ir::infer::broadcast_shapes(
            &sa[..sa.len().saturating_sub(2)],
            &sb[..sb.len().saturating_sub(2)],
        )
        .map_err(|e| self.err(mm, e))?;
        let mut out = batch.clone();
        let mut out_vars: Vec<String> = (0..batch.len()).map(|d| format!("b{d}")).collect();
        if sa.len() > 1 {
            out.push(m);
            out_vars.push("i".into());
        }
        if sb.len() > 1 {
            out.push(n);
            out_vars.push("j".into());
        }
        let total = out.iter().try_fold(1usize, |x, &d| x.checked_mul(d));
        if total.is_none_or(|t| t.checked_mul(k.max(1)).is_none_or(|w| w > i64::MAX as usize / 16))
        {
            return Err(self.err(mm, format!("shapes {sa:?} @ {sb:?} overflow index arithmetic")));
        }
        Ok(Dims { batch, m, k, n, out, out_vars, a: sa, b: sb })
    }

    /// Whether `epilogue` (rooted at `root`) can run over the product's rows in place: its
    /// value has the product's shape and type.
    pub(super) fn epilogue_fits(
        &self,
        mm: NodeId,
        root: NodeId,
        epilogue: &[NodeId],
    ) -> Result<bool, LowerError> {
        let g = self.g;
        let dims = self.dims(mm)?;
        let leaves = self.leaves(root, epilogue)?;
        let shape = xpu_ir::infer::broadcast_shapes(&dims.out, &leaves.shape)
            .map_err(|e| self.err(root, e))?;
        let same_type = g.ty(g.node(root).outputs[0]).dtype == g.ty(g.node(mm).outputs[0]).dtype;
        Ok(shape == dims.out && same_type)
    }

    /// The product `mm`, with `epilogue` (its root and members) applied to each finished row.
    pub(super) fn matmul(
        &mut self,
        mm: NodeId,
        epilogue: Option<(NodeId, &[NodeId])>,
    ) -> Result<(), LowerError> {
        let g = self.g;
        let (a, b) = self.operands(mm)?;
        let d = self.dims(mm)?;
        let out_dtype = g.ty(g.node(mm).outputs[0]).dtype;
        if !matches!(out_dtype, DType::F32 | DType::F64) {
            // The row of C accumulates in the output buffer: f16/bf16 would round every step.
            return Err(self.err(mm, format!("matmul into {out_dtype} (f32 and f64 only)")));
        }
        let compute = self.compute_type(&[mm]);
        // Batch strides of each operand (0 where it broadcasts) and of the output, in
        // elements: the strides inside the batch dims times one matrix.
        let batch_strides = |own: &[usize], matrix: usize| -> Vec<i64> {
            let own = &own[..own.len().saturating_sub(2)];
            strides_in(&d.batch, own).into_iter().map(|s| s * matrix as i64).collect()
        };
        let (ba, bb, bc) = (
            batch_strides(&d.a, d.m * d.k),
            batch_strides(&d.b, d.k * d.n),
            strides_in(&d.batch, &d.batch)
                .into_iter()
                .map(|s| s * (d.m * d.n) as i64)
                .collect::<Vec<_>>(),
        );
        let mut buffers = Vec::new();
        let mut slots = Vec::new();
        for (name, v) in [("a", a), ("b", b)] {
            let Some(Place::Slot(slot, s)) = self.places.get(&v).cloned() else { unreachable!() };
            let elem = scalar_type(g.ty(v).dtype)
                .ok_or_else(|| self.err(mm, "an operand LIR-ML cannot hold"))?;
            let len = s.iter().product::<usize>() as i64;
            buffers.push(Buffer {
                name: name.into(),
                elem,
                shape: vec![Affine::constant(len)],
                access: Access::In,
            });
            slots.push(slot);
        }
        let vars: Vec<String> = (0..d.batch.len()).map(|x| format!("b{x}")).collect();
        let with_batch = |strides: &[i64], rest: &[(&str, i64)]| {
            let names: Vec<&str> =
                vars.iter().map(String::as_str).chain(rest.iter().map(|r| r.0)).collect();
            let coefficients: Vec<i64> =
                strides.iter().copied().chain(rest.iter().map(|r| r.1)).collect();
            index(&names, &coefficients)
        };
        let (ka, kb) = (d.k as i64, d.n as i64);
        let c_at = with_batch(&bc, &[("i", kb), ("j", 1)]);
        // The epilogue's own leaves, indexed by the output's loop variables.
        let (root, ep_nodes) = epilogue.unwrap_or((mm, &[]));
        let (mut ep_buffers, mut ep_slots) = (Vec::new(), Vec::new());
        let ep_leaves = if ep_nodes.is_empty() {
            None
        } else {
            let leaves = self.leaves(root, ep_nodes)?;
            let (bufs, sl, sc) = self.leaf_buffers(root, &leaves)?;
            (ep_buffers, ep_slots) = (bufs, sl);
            Some((leaves, sc))
        };
        let (mut out, slot) = self.output(root, &d.out)?;
        out.access = Access::InOut;
        let for_ = |var: &str, n: usize, parallel: bool, body: Vec<Stmt>| Stmt::For {
            var: var.into(),
            lo: Affine::constant(0),
            hi: Affine::constant(n as i64),
            parallel,
            body,
        };
        let mut zero = Body::with_prefix(compute, "z");
        let z = zero.let_(Expr::Const { ty: compute, value: Literal::Float(0.0) });
        zero.push(Stmt::Store { buffer: out.name.clone(), index: vec![c_at.clone()], value: z });
        let mut inner = Body::with_prefix(compute, "m");
        let cv = inner.let_(Expr::Load { buffer: out.name.clone(), index: vec![c_at.clone()] });
        let bv = inner.let_(Expr::Load {
            buffer: "b".into(),
            index: vec![with_batch(&bb, &[("k", kb), ("j", 1)])],
        });
        let p = inner.bin(B::Mul, "av", &bv);
        let s = inner.bin(B::Add, &cv, &p);
        inner.push(Stmt::Store { buffer: out.name.clone(), index: vec![c_at.clone()], value: s });
        let mut row = vec![
            for_("j", d.n, false, zero.stmts),
            for_(
                "k",
                d.k,
                false,
                vec![
                    Stmt::Let {
                        name: "av".into(),
                        value: Expr::Load {
                            buffer: "a".into(),
                            index: vec![with_batch(&ba, &[("i", ka), ("k", 1)])],
                        },
                    },
                    for_("j", d.n, false, inner.stmts),
                ],
            ),
        ];
        if let Some((leaves, scalars)) = &ep_leaves {
            let mut ep = Body::with_prefix(compute, "e");
            let c = ep.let_(Expr::Load { buffer: out.name.clone(), index: vec![c_at.clone()] });
            let strides: Vec<Vec<i64>> =
                leaves.shapes.iter().map(|l| strides_in(&d.out, l)).collect();
            let index_of = |k: usize| index(&d.out_vars, &strides[k]);
            let mm_out = g.node(mm).outputs[0];
            let names =
                self.prologue_with(&mut ep, ep_nodes, leaves, scalars, &index_of, &[(mm_out, c)])?;
            let value = names[&g.node(root).outputs[0]].clone();
            ep.push(Stmt::Store { buffer: out.name.clone(), index: vec![c_at], value });
            row.push(for_("j", d.n, false, ep.stmts));
        }
        let mut body = vec![for_("i", d.m, d.batch.is_empty(), row)];
        for (x, &n) in d.batch.iter().enumerate().rev() {
            body = vec![for_(&vars[x], n, x == 0, body)];
        }
        buffers.append(&mut ep_buffers);
        slots.append(&mut ep_slots);
        buffers.push(out);
        slots.push(slot);
        let mut members = vec![mm];
        members.extend_from_slice(ep_nodes);
        self.push_kernel(root, &members, buffers, slots, body);
        Ok(())
    }
}
