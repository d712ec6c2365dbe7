//! Reductions over any axes and softmax along an axis, each one kernel with its
//! elementwise producers computed inside the reduction body (`reduce_sum(exp(x − m))`
//! reads `x` and `m`, never a materialised `exp`). Kept dimensions are loops (the outermost
//! parallel); reduced dimensions are nested `reduce`s, the innermost with 8 lanes so it
//! vectorises with a fixed accumulator layout.

use xpu_ir::{NodeId, Op, ValueId};
use xpu_lir::{Affine, BinaryOp as B, Expr, Literal, ReduceOp, Stmt, UnaryOp as U};

use super::ops::Body;
use super::{Leaves, LowerError, Lowering, index, strides_in};

/// `row` inside a loop `%i<d>` over each of `dims` (dim, extent), the outermost parallel.
fn row_loops(dims: &[(usize, usize)], row: Vec<Stmt>) -> Vec<Stmt> {
    let mut body = row;
    for (i, &(d, extent)) in dims.iter().enumerate().rev() {
        body = vec![Stmt::For {
            var: format!("i{d}"),
            lo: Affine::constant(0),
            hi: Affine::constant(extent as i64),
            parallel: i == 0,
            body,
        }];
    }
    body
}

/// Lanes of the innermost reduction.
const LANES: u32 = 8;

pub fn is_reduction(op: Op) -> bool {
    op.class() == xpu_ir::OpClass::Reduction
}

fn reduce_expr(
    op: ReduceOp,
    ty: xpu_lir::ScalarType,
    lanes: u32,
    var: &str,
    n: usize,
    body: Vec<Stmt>,
) -> Expr {
    let init = match op {
        ReduceOp::Add => 0.0,
        ReduceOp::Mul => 1.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    };
    Expr::Reduce {
        op,
        ty,
        lanes,
        init: Literal::Float(init),
        var: var.to_string(),
        lo: Affine::constant(0),
        hi: Affine::constant(n as i64),
        body,
    }
}

impl Lowering<'_> {
    /// The axes a reduction node reduces (sorted, deduplicated), or `None` for a no-op.
    fn axes(&self, root: NodeId, rank: usize) -> Result<Option<Vec<usize>>, LowerError> {
        let n = self.g.node(root);
        let given: Vec<i64> = match n.inputs.get(1).copied().flatten() {
            Some(v) => match self.places.get(&v) {
                Some(super::Place::Slot(super::Slot::Constant(t), _)) => {
                    t.to_i64_vec().ok_or_else(|| self.err(root, "axes that are not integers"))?
                }
                Some(super::Place::Slot(super::Slot::Input(i), _)) => {
                    self.structural.get(*i).cloned().flatten().ok_or_else(|| {
                        self.err(root, "axes given as an input whose value is not known")
                    })?
                }
                _ => return Err(self.err(root, "axes computed at run time")),
            },
            None => Vec::new(),
        };
        if given.is_empty() && n.attrs.int("noop_with_empty_axes", 0) != 0 {
            return Ok(None);
        }
        let mut axes: Vec<usize> = if given.is_empty() {
            (0..rank).collect()
        } else {
            given
                .iter()
                .map(|&a| {
                    xpu_ir::infer::normalize_axis(a, rank).ok_or_else(|| {
                        self.err(root, format!("axis {a} out of range for rank {rank}"))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        axes.sort_unstable();
        axes.dedup();
        Ok(Some(axes))
    }

    /// A reduction of its input (computed by `prologue` nodes at each element).
    pub(super) fn reduction(
        &mut self,
        root: NodeId,
        prologue: &[NodeId],
    ) -> Result<(), LowerError> {
        let g = self.g;
        let op = g.node(root).op;
        let x = g.node(root).inputs[0].ok_or_else(|| self.err(root, "no input"))?;
        let data = prologue;
        // The reduced value's own leaves: the prologue's, or the input itself.
        let leaves =
            if data.is_empty() { self.value_leaves(root, x)? } else { self.leaves(root, data)? };
        let shape = leaves.shape.clone();
        // No axes with noop_with_empty_axes: the input itself (a copy of the element).
        let (axes, copy) = match self.axes(root, shape.len())? {
            Some(axes) => (axes, false),
            None => (Vec::new(), true),
        };
        let compute = self.compute_type(&[root]);
        let (mut buffers, mut slots, scalars) = self.leaf_buffers(root, &leaves)?;
        let vars: Vec<String> = (0..shape.len())
            .map(|d| if axes.contains(&d) { format!("r{d}") } else { format!("i{d}") })
            .collect();
        let strides: Vec<Vec<i64>> = leaves.shapes.iter().map(|l| strides_in(&shape, l)).collect();
        let (rop, two_pass) = match op {
            Op::ReduceMax => (ReduceOp::Max, false),
            Op::ReduceMin => (ReduceOp::Min, false),
            Op::ReduceProd => (ReduceOp::Mul, false),
            Op::ReduceLogSumExp => (ReduceOp::Add, true),
            _ => (ReduceOp::Add, false),
        };
        // One pass: the element (transformed) reduced over the axes, innermost first.
        let pass = |this: &Self,
                    prefix: &str,
                    rop: ReduceOp,
                    shift: Option<&str>|
         -> Result<Expr, LowerError> {
            let mut body = Body::with_prefix(compute, prefix);
            let names =
                this.prologue(&mut body, data, &leaves, &scalars, &|k| index(&vars, &strides[k]))?;
            let value = names[&x].clone();
            let v = match (op, shift) {
                (_, Some(m)) => {
                    let d = body.bin(B::Sub, &value, m);
                    body.un(U::Exp, &d)
                }
                (Op::ReduceL1, _) => body.un(U::Abs, &value),
                (Op::ReduceL2 | Op::ReduceSumSquare, _) => body.bin(B::Mul, &value, &value),
                _ => value,
            };
            body.push(Stmt::Yield(v));
            let mut stmts = body.stmts;
            let mut expr = None;
            for (i, &a) in axes.iter().enumerate().rev() {
                let lanes = if i + 1 == axes.len() { LANES } else { 1 };
                let e = reduce_expr(rop, compute, lanes, &vars[a], shape[a], stmts);
                let name = format!("{prefix}acc{a}");
                stmts = vec![Stmt::Let { name: name.clone(), value: e.clone() }, Stmt::Yield(name)];
                expr = Some(e);
            }
            Ok(expr.unwrap_or(Expr::Const { ty: compute, value: Literal::Float(0.0) }))
        };
        let mut tail = Body::with_prefix(compute, "f");
        let result = if copy {
            let names =
                self.prologue(&mut tail, data, &leaves, &scalars, &|k| index(&vars, &strides[k]))?;
            names[&x].clone()
        } else if two_pass {
            // log Σ e^x = m + log Σ e^(x − m), m the maximum (0 where it is infinite).
            tail.push(Stmt::Let {
                name: "m0".into(),
                value: pass(self, "a", ReduceOp::Max, None)?,
            });
            let inf = tail.un(U::IsInf, "m0");
            let zero = tail.num(0.0);
            let m = tail.sel(&inf, &zero, "m0");
            tail.push(Stmt::Let {
                name: "s0".into(),
                value: pass(self, "b", ReduceOp::Add, Some(&m))?,
            });
            let l = tail.un(U::Log, "s0");
            tail.bin(B::Add, &m, &l)
        } else {
            tail.push(Stmt::Let { name: "s0".into(), value: pass(self, "a", rop, None)? });
            let count: usize = axes.iter().map(|&a| shape[a]).product();
            match op {
                Op::ReduceMean => {
                    let n = tail.num(count as f64);
                    tail.bin(B::Div, "s0", &n)
                }
                Op::ReduceL2 => tail.un(U::Sqrt, "s0"),
                Op::ReduceLogSum => tail.un(U::Log, "s0"),
                _ => "s0".to_string(),
            }
        };
        let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
        let keep_shape: Vec<usize> =
            shape.iter().enumerate().map(|(d, &n)| if axes.contains(&d) { 1 } else { n }).collect();
        let out_shape: Vec<usize> = if g.node(root).attrs.int("keepdims", 1) != 0 {
            keep_shape.clone()
        } else {
            kept.iter().map(|&d| shape[d]).collect()
        };
        // Row-major over the kept dims; 0 along the reduced ones (size 1 in the output).
        let out_strides = strides_in(&shape, &keep_shape);
        let (out, slot) = self.output(root, &out_shape)?;
        tail.push(Stmt::Store {
            buffer: out.name.clone(),
            index: vec![index(&vars, &out_strides)],
            value: result,
        });
        buffers.push(out);
        slots.push(slot);
        let mut body = tail.stmts;
        for (i, &d) in kept.iter().enumerate().rev() {
            body = vec![Stmt::For {
                var: vars[d].clone(),
                lo: Affine::constant(0),
                hi: Affine::constant(shape[d] as i64),
                parallel: i == 0,
                body,
            }];
        }
        self.push_kernel(root, data, buffers, slots, body);
        Ok(())
    }

    /// A single materialised value as the only leaf.
    fn value_leaves(&self, root: NodeId, v: ValueId) -> Result<Leaves, LowerError> {
        match self.places.get(&v) {
            Some(super::Place::Slot(_, s)) => {
                Ok(Leaves { values: vec![v], shapes: vec![s.clone()], shape: s.clone() })
            }
            _ => Err(self.err(root, format!("reads {v}, which is not computed yet"))),
        }
    }

    /// softmax / log_softmax along `axis`: per position of the other dims, the maximum, then
    /// (softmax) e^(x − max) into the output row, its sum, and the row scaled in place; or
    /// (log_softmax) the sum of e^(x − max) and every element from x again. The prologue is
    /// computed again in each pass that reads x instead of being stored.
    pub(super) fn softmax(&mut self, root: NodeId, prologue: &[NodeId]) -> Result<(), LowerError> {
        let g = self.g;
        let log = g.node(root).op == Op::LogSoftmax;
        let x = g.node(root).inputs[0].ok_or_else(|| self.err(root, "no input"))?;
        let data = prologue;
        let leaves =
            if data.is_empty() { self.value_leaves(root, x)? } else { self.leaves(root, data)? };
        let shape = leaves.shape.clone();
        let rank = shape.len();
        let axis_attr = g.node(root).attrs.int("axis", -1);
        let axis = xpu_ir::infer::normalize_axis(axis_attr, rank.max(1)).ok_or_else(|| {
            self.err(root, format!("axis {axis_attr} out of range for rank {rank}"))
        })?;
        if rank == 0 {
            return Err(self.err(root, "softmax of a scalar"));
        }
        let compute = self.compute_type(&[root]);
        let (mut buffers, mut slots, scalars) = self.leaf_buffers(root, &leaves)?;
        let strides: Vec<Vec<i64>> = leaves.shapes.iter().map(|l| strides_in(&shape, l)).collect();
        let vars_with = |a: &str| -> Vec<String> {
            (0..rank).map(|d| if d == axis { a.to_string() } else { format!("i{d}") }).collect()
        };
        let element = |this: &Self, body: &mut Body, a: &str| -> Result<String, LowerError> {
            let vars = vars_with(a);
            let names =
                this.prologue(body, data, &leaves, &scalars, &|k| index(&vars, &strides[k]))?;
            Ok(names[&x].clone())
        };
        let n = shape[axis];
        let mut row = Body::with_prefix(compute, "f");
        // Pass 1: the maximum.
        let mut b = Body::with_prefix(compute, "a");
        let v = element(self, &mut b, "a")?;
        b.push(Stmt::Yield(v));
        row.push(Stmt::Let {
            name: "m0".into(),
            value: reduce_expr(ReduceOp::Max, compute, LANES, "a", n, b.stmts),
        });
        let (mut out, slot) = self.output(root, &shape)?;
        let out_vars = |a: &str| index(&vars_with(a), &strides_in(&shape, &shape));
        let out_dtype = g.ty(g.node(root).outputs[0]).dtype;
        let for_ = |var: &str, body: Vec<Stmt>| Stmt::For {
            var: var.into(),
            lo: Affine::constant(0),
            hi: Affine::constant(n as i64),
            parallel: false,
            body,
        };
        if !log && matches!(out_dtype, xpu_ir::DType::F32 | xpu_ir::DType::F64) {
            // softmax: e^(x − m) computed once, kept in the output row (in cache), summed
            // from there and scaled in place — the same bits as summing it as computed.
            out.access = xpu_lir::Access::InOut;
            let mut b = Body::with_prefix(compute, "b");
            let v = element(self, &mut b, "b")?;
            let d = b.bin(B::Sub, &v, "m0");
            let e = b.un(U::Exp, &d);
            b.push(Stmt::Store { buffer: out.name.clone(), index: vec![out_vars("b")], value: e });
            row.push(for_("b", b.stmts));
            let mut b = Body::with_prefix(compute, "c");
            let e = b.let_(Expr::Load { buffer: out.name.clone(), index: vec![out_vars("c")] });
            b.push(Stmt::Yield(e));
            row.push(Stmt::Let {
                name: "s0".into(),
                value: reduce_expr(ReduceOp::Add, compute, LANES, "c", n, b.stmts),
            });
            let scale = row.un(U::Recip, "s0");
            let mut b = Body::with_prefix(compute, "d");
            let e = b.let_(Expr::Load { buffer: out.name.clone(), index: vec![out_vars("d")] });
            let y = b.bin(B::Mul, &e, &scale);
            b.push(Stmt::Store { buffer: out.name.clone(), index: vec![out_vars("d")], value: y });
            row.push(for_("d", b.stmts));
        } else {
            // Pass 2: Σ e^(x − m); pass 3: each element from x again (log_softmax needs no
            // exponential there; f16/bf16 outputs would round a stored e^(x − m)).
            let mut b = Body::with_prefix(compute, "b");
            let v = element(self, &mut b, "b")?;
            let d = b.bin(B::Sub, &v, "m0");
            let e = b.un(U::Exp, &d);
            b.push(Stmt::Yield(e));
            row.push(Stmt::Let {
                name: "s0".into(),
                value: reduce_expr(ReduceOp::Add, compute, LANES, "b", n, b.stmts),
            });
            let scale = if log { row.un(U::Log, "s0") } else { row.un(U::Recip, "s0") };
            let mut b = Body::with_prefix(compute, "c");
            let v = element(self, &mut b, "c")?;
            let d = b.bin(B::Sub, &v, "m0");
            let y = if log {
                b.bin(B::Sub, &d, &scale)
            } else {
                let e = b.un(U::Exp, &d);
                b.bin(B::Mul, &e, &scale)
            };
            b.push(Stmt::Store { buffer: out.name.clone(), index: vec![out_vars("c")], value: y });
            row.push(for_("c", b.stmts));
        }
        buffers.push(out);
        slots.push(slot);
        let others: Vec<(usize, usize)> =
            (0..rank).filter(|&d| d != axis).map(|d| (d, shape[d])).collect();
        self.push_kernel(root, data, buffers, slots, row_loops(&others, row.stmts));
        Ok(())
    }
}

impl Lowering<'_> {
    /// ONNX LayerNormalization over the dims from `axis` on (flattened into one row, which
    /// they are in memory): per row the mean, the variance about it, then
    /// `(x − mean) · 1/√(var + ε) · scale + bias`. Scale and bias must cover the whole
    /// normalised shape (a partly broadcast one would not flatten); the optional mean and
    /// inverse-deviation outputs are stored per row.
    pub(super) fn layer_norm(&mut self, root: NodeId) -> Result<(), LowerError> {
        let g = self.g;
        let node = g.node(root);
        let input = |i: usize| node.inputs.get(i).copied().flatten();
        let (Some(x), Some(scale)) = (input(0), input(1)) else {
            return Err(self.err(root, "layer_normalization needs X and Scale"));
        };
        let shape_of = |v: ValueId| match self.places.get(&v) {
            Some(super::Place::Slot(_, s)) => Ok(s.clone()),
            _ => Err(self.err(root, format!("reads {v}, which is not computed yet"))),
        };
        let xs = shape_of(x)?;
        let rank = xs.len();
        let axis_attr = node.attrs.int("axis", -1);
        let axis =
            xpu_ir::infer::normalize_axis(axis_attr, rank.max(1)).filter(|_| rank > 0).ok_or_else(
                || self.err(root, format!("axis {axis_attr} out of range for rank {rank}")),
            )?;
        let n: usize = xs[axis..].iter().product();
        let mut leaves = Leaves { values: vec![x], shapes: Vec::new(), shape: Vec::new() };
        let mut view: Vec<usize> = xs[..axis].to_vec();
        view.push(n);
        leaves.shapes.push(view.clone());
        for v in [Some(scale), input(2)].into_iter().flatten() {
            let s = shape_of(v)?;
            let trailing: Vec<usize> = s.iter().copied().skip_while(|&d| d == 1).collect();
            let want: Vec<usize> = xs[axis..].iter().copied().skip_while(|&d| d == 1).collect();
            if trailing != want && s.iter().product::<usize>() != 1 {
                return Err(self.err(
                    root,
                    format!("scale/bias of shape {s:?} over normalised dims {:?}", &xs[axis..]),
                ));
            }
            leaves.values.push(v);
            leaves.shapes.push(if s.iter().product::<usize>() == 1 { vec![1] } else { vec![n] });
        }
        leaves.shape = view.clone();
        let compute = self.compute_type(&[root]);
        let (mut buffers, mut slots, scalars) = self.leaf_buffers(root, &leaves)?;
        let strides: Vec<Vec<i64>> = leaves.shapes.iter().map(|l| strides_in(&view, l)).collect();
        let r = view.len() - 1;
        let vars = |a: &str| -> Vec<String> {
            (0..=r).map(|d| if d == r { a.to_string() } else { format!("i{d}") }).collect()
        };
        // Leaf k at the row position named `a` (an inlined scalar as its constant).
        let leaf = |body: &mut Body, k: usize, a: &str| -> String {
            let v = leaves.values[k];
            match scalars.get(&v) {
                Some(&c) => body.num(c),
                None => {
                    let elem = super::scalar_type(g.ty(v).dtype).unwrap_or(compute);
                    body.load(&format!("in{k}"), index(&vars(a), &strides[k]), elem)
                }
            }
        };
        let sum =
            |body: Body, var: &str| reduce_expr(ReduceOp::Add, compute, LANES, var, n, body.stmts);
        let mut row = Body::with_prefix(compute, "f");
        let mut b = Body::with_prefix(compute, "a");
        let v = leaf(&mut b, 0, "a");
        b.push(Stmt::Yield(v));
        row.push(Stmt::Let { name: "u0".into(), value: sum(b, "a") });
        let count = row.num(n as f64);
        let mean = row.bin(B::Div, "u0", &count);
        let mut b = Body::with_prefix(compute, "b");
        let v = leaf(&mut b, 0, "b");
        let d = b.bin(B::Sub, &v, &mean);
        let sq = b.bin(B::Mul, &d, &d);
        b.push(Stmt::Yield(sq));
        row.push(Stmt::Let { name: "v0".into(), value: sum(b, "b") });
        let var = row.bin(B::Div, "v0", &count);
        let eps = row.num(node.attrs.float("epsilon", 1e-5));
        let shifted = row.bin(B::Add, &var, &eps);
        let dev = row.un(U::Sqrt, &shifted);
        let inv = row.un(U::Recip, &dev);
        // Mean and 1/σ (outputs 1 and 2), one element per row.
        let mut row_shape = xs[..axis].to_vec();
        row_shape.resize(rank, 1);
        let outer: Vec<String> = (0..r).map(|d| format!("i{d}")).collect();
        let row_index = index(&outer, &strides_in(&view[..r], &view[..r]));
        for (k, value) in [(1, &mean), (2, &inv)] {
            let Some(&v) = node.outputs.get(k) else { continue };
            let dtype = g.ty(v).dtype;
            let elem = super::scalar_type(dtype)
                .ok_or_else(|| self.err(root, format!("dtype {dtype} is not one LIR-ML stores")))?;
            let id = self.values.len();
            self.values.push(super::ValueInfo { dtype, shape: row_shape.clone() });
            let name = format!("out{k}");
            buffers.push(xpu_lir::Buffer {
                name: name.clone(),
                elem,
                shape: vec![Affine::constant(row_shape.iter().product::<usize>() as i64)],
                access: xpu_lir::Access::Out,
            });
            slots.push(super::Slot::Computed(id));
            row.push(Stmt::Store {
                buffer: name,
                index: vec![row_index.clone()],
                value: value.clone(),
            });
            self.places.insert(v, super::Place::Slot(super::Slot::Computed(id), row_shape.clone()));
        }
        let (out, slot) = self.output(root, &xs)?;
        let mut b = Body::with_prefix(compute, "c");
        let v = leaf(&mut b, 0, "c");
        let d = b.bin(B::Sub, &v, &mean);
        let z = b.bin(B::Mul, &d, &inv);
        let s = leaf(&mut b, 1, "c");
        let mut y = b.bin(B::Mul, &z, &s);
        if leaves.values.len() > 2 {
            let bias = leaf(&mut b, 2, "c");
            y = b.bin(B::Add, &y, &bias);
        }
        b.push(Stmt::Store {
            buffer: out.name.clone(),
            index: vec![index(&vars("c"), &strides_in(&view, &view))],
            value: y,
        });
        row.push(Stmt::For {
            var: "c".into(),
            lo: Affine::constant(0),
            hi: Affine::constant(n as i64),
            parallel: false,
            body: b.stmts,
        });
        buffers.push(out);
        slots.push(slot);
        let outer: Vec<(usize, usize)> = (0..r).map(|d| (d, view[d])).collect();
        self.push_kernel(root, &[root], buffers, slots, row_loops(&outer, row.stmts));
        Ok(())
    }
}
