//! Matrix products (`llvm.gemm`): numpy's matmul with batch dims broadcast and 1-D operands,
//! as loops `i, k, j` — rows of `C` accumulated in place while `j` walks contiguous rows
//! of `B`, so the innermost loop vectorises. Tiled: rows go in blocks of [`ROWS`] that share
//! each load of `B[k, j]`; blocks go in parallel chunks of up to [`GROUP`], and `k` in
//! panels of `B` ([`PANEL`] elements) that every block of the chunk uses while the panel is
//! in L2; the rows left over go one at a time. The outermost loop (a batch dim, else the
//! chunks) is split across threads. Each element sums its `k` in order, with no FMA
//! contraction: the same bits at any tiling, thread count or vector width. An epilogue — the
//! elementwise ops that consume the product (bias, activation) — runs over the finished
//! rows before they are stored, so `relu(x @ w + b)` is one kernel.

use xpu_ir::{DType, NodeId, ValueId};
use xpu_lir::{Access, Affine, BinaryOp as B, Buffer, Expr, Literal, Stmt};

use super::ops::Body;
use super::{LowerError, Lowering, Place, scalar_type, strides_in};

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
        let ctx = RowCtx {
            vars: &vars,
            strides: [ba, bb, bc],
            k: d.k,
            n: d.n,
            compute,
            out: out.name.clone(),
        };
        let epilogue_rows = |row: RowAt, prefix: &str| -> Result<Vec<Stmt>, LowerError> {
            let Some((leaves, scalars)) = &ep_leaves else { return Ok(Vec::new()) };
            let mut ep = Body::with_prefix(compute, prefix);
            let c_at = ctx.at(2, row, &[("j", 1)]);
            let c = ep.let_(Expr::Load { buffer: ctx.out.clone(), index: vec![c_at.clone()] });
            let strides: Vec<Vec<i64>> =
                leaves.shapes.iter().map(|l| strides_in(&d.out, l)).collect();
            let index_of = |k: usize| row.substitute(&d.out_vars, &strides[k]);
            let mm_out = g.node(mm).outputs[0];
            let names =
                self.prologue_with(&mut ep, ep_nodes, leaves, scalars, &index_of, &[(mm_out, c)])?;
            let value = names[&g.node(root).outputs[0]].clone();
            ep.push(Stmt::Store { buffer: ctx.out.clone(), index: vec![c_at], value });
            Ok(vec![for_("j", 0, d.n, false, ep.stmts)])
        };
        // Rows in blocks of ROWS sharing each load of B, GROUP blocks to a parallel chunk
        // sharing each panel of B in cache; then the rows left, one by one.
        let blocks = if d.m >= 2 * ROWS { d.m / ROWS } else { 0 };
        let group = (1..=GROUP).rev().find(|g| blocks % g == 0).unwrap_or(1);
        let mut chunk = Vec::new();
        if blocks > 0 {
            chunk = ctx.blocked_rows(group);
            let mut ep = Vec::new();
            for r in 0..ROWS {
                ep.extend(epilogue_rows(RowAt::block(group, r), &format!("e{r}x"))?);
            }
            if !ep.is_empty() {
                chunk.push(for_("ib", 0, group, false, ep));
            }
        }
        let mut single = ctx.rows(&[RowAt::single()], "s", (0, d.k));
        single.insert(0, ctx.zero(&[RowAt::single()], "zs"));
        single.extend(epilogue_rows(RowAt::single(), "e")?);
        let parallel = d.batch.is_empty();
        let mut body = Vec::new();
        if blocks > 0 {
            body.push(for_("ic", 0, blocks / group, parallel, chunk));
        }
        body.push(for_("i", blocks * ROWS, d.m, parallel, single));
        for (x, &n) in d.batch.iter().enumerate().rev() {
            body = vec![for_(&vars[x], 0, n, x == 0, body)];
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

/// Rows of `C` computed together: each element of `B` loaded once feeds this many rows.
/// Four rows of a 1024-wide f32 `C` are 16 KiB, inside L1 with the streamed row of `B`.
const ROWS: usize = 4;

/// Row blocks per parallel chunk, at most: the chunk's blocks share each panel of `B`
/// (`PANEL` elements) while it is in L2.
const GROUP: usize = 16;

/// Elements of `B` per panel: 64 Ki f32 are 256 KiB, a quarter of a typical L2.
const PANEL: usize = 1 << 16;

fn for_(var: &str, lo: usize, hi: usize, parallel: bool, body: Vec<Stmt>) -> Stmt {
    Stmt::For {
        var: var.into(),
        lo: Affine::constant(lo as i64),
        hi: Affine::constant(hi as i64),
        parallel,
        body,
    }
}

/// Which row of the product a statement is about: `Σ coefficient · var + offset` (`i`, or
/// row `r` of block `ib` of chunk `ic`: `ROWS · (group · ic + ib) + r`).
#[derive(Clone, Copy)]
struct RowAt {
    terms: [(&'static str, i64); 2],
    offset: i64,
}

impl RowAt {
    fn single() -> RowAt {
        RowAt { terms: [("i", 1), ("", 0)], offset: 0 }
    }

    fn block(group: usize, r: usize) -> RowAt {
        let rows = ROWS as i64;
        RowAt { terms: [("ic", rows * group as i64), ("ib", rows)], offset: r as i64 }
    }

    /// The row's terms scaled by `stride`, and its constant.
    fn scaled(&self, stride: i64) -> (Vec<(xpu_lir::Var, i64)>, i64) {
        let terms = self
            .terms
            .iter()
            .filter(|(_, c)| *c != 0 && stride != 0)
            .map(|(v, c)| (xpu_lir::Var::Loop((*v).into()), c * stride))
            .collect();
        (terms, self.offset * stride)
    }

    /// `Σ coefficient · var` over the output's loop variables, its row variable `i`
    /// replaced by this row.
    fn substitute(&self, vars: &[String], coefficients: &[i64]) -> Affine {
        let mut constant = 0;
        let mut terms = Vec::new();
        for (v, &c) in vars.iter().zip(coefficients) {
            if c == 0 {
                continue;
            }
            if v == "i" {
                let (t, k) = self.scaled(c);
                terms.extend(t);
                constant += k;
            } else {
                terms.push((xpu_lir::Var::Loop(v.clone()), c));
            }
        }
        Affine::from_terms(constant, terms).expect("distinct variables with i64 coefficients")
    }
}

/// What the row loops of one product share.
struct RowCtx<'a> {
    /// The batch loop variables.
    vars: &'a [String],
    /// Batch strides of `a`, `b` and the output.
    strides: [Vec<i64>; 3],
    k: usize,
    n: usize,
    compute: xpu_lir::ScalarType,
    out: String,
}

impl RowCtx<'_> {
    /// The index into operand `which` (0 `a`, 1 `b`, 2 the output) at `row` (none for `b`)
    /// plus `rest`.
    fn at(&self, which: usize, row: RowAt, rest: &[(&str, i64)]) -> Affine {
        let row_stride = match which {
            0 => self.k as i64,
            1 => 0,
            _ => self.n as i64,
        };
        let mut terms: Vec<(xpu_lir::Var, i64)> = self
            .vars
            .iter()
            .zip(&self.strides[which])
            .filter(|(_, s)| **s != 0)
            .map(|(v, s)| (xpu_lir::Var::Loop(v.clone()), *s))
            .collect();
        let (row_terms, constant) = row.scaled(row_stride);
        terms.extend(row_terms);
        terms.extend(
            rest.iter()
                .filter(|(_, c)| *c != 0)
                .map(|(v, c)| (xpu_lir::Var::Loop((*v).into()), *c)),
        );
        Affine::from_terms(constant, terms).expect("distinct variables with i64 coefficients")
    }

    /// A chunk of `group` blocks of [`ROWS`] rows: zeroed, then `k` in panels of `B` — for
    /// each panel, every block of the chunk — then the `k` left after the last panel. Each
    /// element still sums its `k` in order.
    fn blocked_rows(&self, group: usize) -> Vec<Stmt> {
        let rows: Vec<RowAt> = (0..ROWS).map(|r| RowAt::block(group, r)).collect();
        let panel = (PANEL / self.n.max(1)).clamp(8, self.k.max(8));
        let panels = self.k / panel;
        let mut chunk = vec![for_("ib", 0, group, false, vec![self.zero(&rows, "zb")])];
        if panels > 0 {
            let k_of = |var: &str| {
                let lo =
                    Affine::from_terms(0, vec![(xpu_lir::Var::Loop(var.into()), panel as i64)]);
                lo.expect("one variable")
            };
            let lo = k_of("kc");
            let hi = lo.checked_add(&Affine::constant(panel as i64)).expect("small bounds");
            let blocks = self.rows_between(&rows, "b", lo, hi);
            chunk.push(for_("kc", 0, panels, false, vec![for_("ib", 0, group, false, blocks)]));
        }
        if panels * panel < self.k {
            let tail = self.rows(&rows, "t", (panels * panel, self.k));
            chunk.push(for_("ib", 0, group, false, tail));
        }
        chunk
    }

    /// `C[row, :] = 0` for every row of `rows`.
    fn zero(&self, rows: &[RowAt], prefix: &str) -> Stmt {
        let mut zero = Body::with_prefix(self.compute, prefix);
        let z = zero.let_(Expr::Const { ty: self.compute, value: Literal::Float(0.0) });
        for &row in rows {
            let at = self.at(2, row, &[("j", 1)]);
            zero.push(Stmt::Store { buffer: self.out.clone(), index: vec![at], value: z.clone() });
        }
        for_("j", 0, self.n, false, zero.stmts)
    }

    /// [`Self::rows_between`] constant bounds.
    fn rows(&self, rows: &[RowAt], tag: &str, (lo, hi): (usize, usize)) -> Vec<Stmt> {
        self.rows_between(rows, tag, Affine::constant(lo as i64), Affine::constant(hi as i64))
    }

    /// For each `k` in `lo..hi` in order, `C[row, j] += A[row, k] · B[k, j]` for every row
    /// of `rows` at once: one load of `B[k, j]` serves them all. Values are named after
    /// `tag`, so a kernel holds several such loops.
    fn rows_between(&self, rows: &[RowAt], tag: &str, lo: Affine, hi: Affine) -> Vec<Stmt> {
        let mut inner = Body::with_prefix(self.compute, &format!("m{tag}"));
        let bv = inner.let_(Expr::Load {
            buffer: "b".into(),
            index: vec![self.at(1, RowAt::single(), &[("k", self.n as i64), ("j", 1)])],
        });
        let mut a_values = Vec::new();
        for (r, &row) in rows.iter().enumerate() {
            let name = format!("a{tag}{r}");
            a_values.push(Stmt::Let {
                name: name.clone(),
                value: Expr::Load { buffer: "a".into(), index: vec![self.at(0, row, &[("k", 1)])] },
            });
            let at = self.at(2, row, &[("j", 1)]);
            let cv = inner.let_(Expr::Load { buffer: self.out.clone(), index: vec![at.clone()] });
            let p = inner.bin(B::Mul, &name, &bv);
            let s = inner.bin(B::Add, &cv, &p);
            inner.push(Stmt::Store { buffer: self.out.clone(), index: vec![at], value: s });
        }
        a_values.push(for_("j", 0, self.n, false, inner.stmts));
        vec![Stmt::For { var: "k".into(), lo, hi, parallel: false, body: a_values }]
    }
}
