//! SGR-ML partition → LIR-ML kernels, for concrete input shapes. Elementwise nodes are
//! fused into groups — a node joins its consumers' group when all its uses are in that one
//! group and its value is not an output, so a value used twice (GELU's `x`) is computed
//! once per element inside the loop instead of being materialised — and each group becomes
//! one kernel: a loop nest over the group's output whose innermost body loads each leaf
//! once, computes every node as scalars and stores the root. Dimensions are coalesced first — adjacent
//! dimensions merge where every operand steps through them contiguously (or broadcasts
//! both) — so a 4-D elementwise chain is one flat loop and a row broadcast is two loops.
//! Buffers are flat; every index is affine in the loop counters, so the verifier proves
//! each access in bounds. Constants of one element are inlined; larger ones are buffers.

pub mod ops;

use std::collections::HashMap;

use xpu_ir::infer::broadcast_shapes;
use xpu_ir::{DType, Graph, NodeId, Op, Tensor, ValueId};
use xpu_lir::{Access, Affine, Buffer, Expr, Kernel, Literal, ScalarType, Stmt};

use ops::Body;

/// Where a kernel buffer's data comes from at run time.
#[derive(Clone, Debug, PartialEq)]
pub enum Slot {
    /// Graph input `i`.
    Input(usize),
    /// A constant of the partition (data copied at lowering).
    Constant(Tensor),
    /// A value computed by an earlier kernel (or an output): index into `Program::values`.
    Computed(usize),
}

/// A computed value: its dtype and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// One kernel call: the kernel and, per buffer, where its data is.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub kernel: Kernel,
    pub buffers: Vec<Slot>,
    /// The partition nodes the kernel computes (timings, explanations).
    pub nodes: Vec<NodeId>,
}

/// A partition lowered for one set of input shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub steps: Vec<Step>,
    pub values: Vec<ValueInfo>,
    /// Per graph output, where it is.
    pub outputs: Vec<Slot>,
}

/// A partition this lowering cannot take, naming the node and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{node}: {message}")]
pub struct LowerError {
    pub node: String,
    pub message: String,
}

/// The LIR type that stores `d`, if any.
pub fn scalar_type(d: DType) -> Option<ScalarType> {
    Some(match d {
        DType::Bool => ScalarType::Bool,
        DType::I32 => ScalarType::I32,
        DType::I64 => ScalarType::I64,
        DType::F16 => ScalarType::F16,
        DType::BF16 => ScalarType::BF16,
        DType::F32 => ScalarType::F32,
        DType::F64 => ScalarType::F64,
        _ => return None,
    })
}

/// Where each partition value is during lowering.
#[derive(Clone)]
enum Place {
    Slot(Slot, Vec<usize>),
    /// Computed inside the tree rooted at this node (not materialised).
    Fused,
}

struct Lowering<'g> {
    g: &'g Graph,
    outputs: Vec<bool>,
    places: HashMap<ValueId, Place>,
    values: Vec<ValueInfo>,
    steps: Vec<Step>,
}

/// Lowers `g` for inputs of `shapes`.
pub fn lower(g: &Graph, shapes: &[Vec<usize>]) -> Result<Program, LowerError> {
    let mut outputs = vec![false; g.values.len()];
    for o in &g.outputs {
        outputs[o.value.index()] = true;
    }
    let mut l =
        Lowering { g, outputs, places: HashMap::new(), values: Vec::new(), steps: Vec::new() };
    for (i, (&v, shape)) in g.inputs.iter().zip(shapes).enumerate() {
        l.places.insert(v, Place::Slot(Slot::Input(i), shape.clone()));
    }
    let roots = l.roots();
    let mut members: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for id in g.node_ids() {
        members.entry(roots[id.index()]).or_default().push(id);
    }
    for id in g.node_ids() {
        let n = g.node(id);
        if n.op == Op::Constant {
            let t = n
                .attrs
                .tensor("value")
                .cloned()
                .ok_or_else(|| l.err(id, "a constant without a value"))?;
            let shape = t.shape().to_vec();
            l.places.insert(n.outputs[0], Place::Slot(Slot::Constant(t), shape));
            continue;
        }
        if roots[id.index()] != id {
            l.places.insert(n.outputs[0], Place::Fused);
            continue;
        }
        l.group(id, &members[&id])?;
    }
    let outputs = g
        .outputs
        .iter()
        .map(|o| match l.places.get(&o.value) {
            Some(Place::Slot(s, _)) => Ok(s.clone()),
            _ => Err(LowerError {
                node: o.name.clone(),
                message: "an output nothing computes".into(),
            }),
        })
        .collect::<Result<_, _>>()?;
    Ok(Program { steps: l.steps, values: l.values, outputs })
}

impl Lowering<'_> {
    fn err(&self, id: NodeId, message: impl Into<String>) -> LowerError {
        LowerError { node: self.g.node(id).label(id), message: message.into() }
    }

    /// The group root of every node: an elementwise node joins its consumers' group when
    /// its value is not an output and every use is by an elementwise node of one group (so
    /// the value lives only inside that group's loop body, computed once per element even
    /// when used several times); any other node roots its own group. Decided consumers
    /// first, in reverse node order.
    fn roots(&self) -> Vec<NodeId> {
        let g = self.g;
        let users = g.uses();
        let mut root: Vec<NodeId> = g.node_ids().collect();
        for id in g.node_ids().collect::<Vec<_>>().into_iter().rev() {
            let n = g.node(id);
            let Some(&v) = n.outputs.first() else { continue };
            if !n.op.is_elementwise() || n.outputs.len() != 1 || self.outputs[v.index()] {
                continue;
            }
            let mut groups =
                users[v.index()].iter().map(|u| (g.node(*u).op.is_elementwise(), root[u.index()]));
            if let Some((true, r)) = groups.next()
                && groups.all(|(e, other)| e && other == r)
            {
                root[id.index()] = r;
            }
        }
        root
    }

    /// Emits the kernel of the group rooted at `root` (`nodes`: its members in order).
    fn group(&mut self, root: NodeId, nodes: &[NodeId]) -> Result<(), LowerError> {
        let g = self.g;
        let out_v = g.node(root).outputs[0];
        let out_dtype = g.ty(out_v).dtype;
        let out_elem = scalar_type(out_dtype)
            .ok_or_else(|| self.err(root, format!("dtype {out_dtype} is not one LIR-ML stores")))?;
        // Leaves: materialised values the group reads, in first-use order.
        let mut leaves: Vec<ValueId> = Vec::new();
        for &id in nodes {
            for v in g.node(id).input_values() {
                if !matches!(self.places.get(&v), Some(Place::Fused)) && !leaves.contains(&v) {
                    leaves.push(v);
                }
            }
        }
        let mut leaf_shapes = Vec::new();
        let mut shape = Vec::new();
        for v in &leaves {
            let Some(Place::Slot(_, s)) = self.places.get(v) else {
                return Err(self.err(root, format!("reads {v}, which is not computed yet")));
            };
            shape = broadcast_shapes(&shape, s).map_err(|m| self.err(root, m))?;
            leaf_shapes.push(s.clone());
        }
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel.is_none_or(|n| n > i64::MAX as usize / 16) {
            return Err(self.err(root, format!("shape {shape:?} overflows index arithmetic")));
        }
        let compute = self.compute_type(nodes);
        let dims = coalesce(&shape, &leaf_shapes);
        // Scalar constants are inlined; the other leaves are buffers.
        let mut buffers = Vec::new();
        let mut slots = Vec::new();
        let mut body = Body::new(compute);
        let mut names: HashMap<ValueId, String> = HashMap::new();
        let mut scalars: HashMap<ValueId, f64> = HashMap::new();
        for (k, v) in leaves.iter().enumerate() {
            let Some(Place::Slot(slot, s)) = self.places.get(v).cloned() else { unreachable!() };
            let elem = scalar_type(g.ty(*v).dtype).ok_or_else(|| {
                self.err(root, format!("input dtype {} is not one LIR-ML stores", g.ty(*v).dtype))
            })?;
            if let Slot::Constant(t) = &slot
                && t.numel() == 1
                && elem != ScalarType::Bool
            {
                let x = t.to_f64_vec()[0];
                scalars.insert(*v, x);
                let ty = elem.compute();
                let value = if ty.is_int() { Literal::Int(x as i64) } else { Literal::Float(x) };
                names.insert(*v, body.let_(Expr::Const { ty, value }));
                continue;
            }
            let name = format!("in{k}");
            let index = flat_index(&dims.strides[k]);
            names.insert(*v, body.let_(Expr::Load { buffer: name.clone(), index: vec![index] }));
            let len = s.iter().product::<usize>() as i64;
            buffers.push(Buffer {
                name,
                elem,
                shape: vec![Affine::constant(len)],
                access: Access::In,
            });
            slots.push(slot);
        }
        for &id in nodes {
            let n = g.node(id);
            let mut args: Vec<Option<String>> =
                n.inputs.iter().map(|i| i.map(|v| names[&v].clone())).collect();
            if n.op == Op::Pow {
                // ONNX's pow mixes types (f32 ^ i64, i32 ^ f32): compute in the float type.
                for (arg, input) in args.iter_mut().zip(&n.inputs) {
                    if let (Some(a), Some(v)) = (arg.as_mut(), input)
                        && !g.ty(*v).dtype.is_float()
                    {
                        *a = body.let_(Expr::Cast { arg: a.clone(), to: compute });
                    }
                }
            }
            let scalar = |i: usize| {
                n.inputs.get(i).copied().flatten().and_then(|v| scalars.get(&v).copied())
            };
            let out = scalar_type(g.ty(n.outputs[0]).dtype).unwrap_or(compute);
            let mut name = ops::lower(&mut body, n.op, &n.attrs, &args, &scalar, out)
                .map_err(|m| self.err(id, m))?;
            if n.op == Op::Pow && out.is_int() {
                name = body.let_(Expr::Cast { arg: name, to: out });
            }
            names.insert(n.outputs[0], name);
        }
        // Store the root.
        let value = self.values.len();
        self.values.push(ValueInfo { dtype: out_dtype, shape: shape.clone() });
        let numel = numel.unwrap_or(0) as i64;
        buffers.push(Buffer {
            name: "out".into(),
            elem: out_elem,
            shape: vec![Affine::constant(numel)],
            access: Access::Out,
        });
        slots.push(Slot::Computed(value));
        body.stmts.push(Stmt::Store {
            buffer: "out".into(),
            index: vec![flat_index(&dims.out_strides)],
            value: names[&out_v].clone(),
        });
        let kernel = Kernel {
            name: format!("k{}_{}", self.steps.len(), g.node(root).op.name()),
            syms: Vec::new(),
            buffers,
            body: loop_nest(&dims.sizes, body.stmts),
        };
        self.places.insert(out_v, Place::Slot(Slot::Computed(value), shape));
        self.steps.push(Step { kernel, buffers: slots, nodes: nodes.to_vec() });
        Ok(())
    }

    /// f64 when any float value of the tree is f64, else f32 (f16/bf16 compute in f32).
    fn compute_type(&self, nodes: &[NodeId]) -> ScalarType {
        let g = self.g;
        let mut ty = ScalarType::F32;
        for &id in nodes {
            for v in g.node(id).input_values().chain(g.node(id).outputs.iter().copied()) {
                if g.ty(v).dtype == DType::F64 {
                    ty = ScalarType::F64;
                }
            }
        }
        ty
    }
}

/// Loop sizes after coalescing, and per leaf (and for the output) the stride of each loop.
struct Dims {
    sizes: Vec<usize>,
    strides: Vec<Vec<i64>>,
    out_strides: Vec<i64>,
}

/// Drops size-1 dimensions and merges adjacent ones that every operand (and the output)
/// walks contiguously or broadcasts along both.
fn coalesce(shape: &[usize], leaves: &[Vec<usize>]) -> Dims {
    let r = shape.len();
    let strides_of = |s: &[usize]| -> Vec<i64> {
        // Right-aligned, 0 where broadcast.
        let mut out = vec![0i64; r];
        let mut acc = 1i64;
        for d in (0..r).rev() {
            let k = d as isize - (r - s.len()) as isize;
            if k < 0 {
                continue;
            }
            let n = s[k as usize];
            if n != 1 {
                out[d] = acc;
            }
            acc = acc.saturating_mul(n as i64);
        }
        out
    };
    let mut all: Vec<Vec<i64>> = leaves.iter().map(|s| strides_of(s)).collect();
    all.push(strides_of(shape));
    let mut sizes: Vec<usize> = Vec::new();
    let mut merged: Vec<Vec<i64>> = vec![Vec::new(); all.len()];
    for d in 0..r {
        if shape[d] == 1 {
            continue;
        }
        let n = shape[d] as i64;
        let joins = !sizes.is_empty()
            && all.iter().zip(&merged).all(|(st, m)| *m.last().unwrap() == st[d] * n);
        if joins {
            *sizes.last_mut().unwrap() *= shape[d];
            for (st, m) in all.iter().zip(merged.iter_mut()) {
                *m.last_mut().unwrap() = st[d];
            }
        } else {
            sizes.push(shape[d]);
            for (st, m) in all.iter().zip(merged.iter_mut()) {
                m.push(st[d]);
            }
        }
    }
    if sizes.is_empty() {
        sizes.push(1);
        for m in merged.iter_mut() {
            m.push(0);
        }
    }
    let out_strides = merged.pop().unwrap_or_default();
    Dims { sizes, strides: merged, out_strides }
}

/// `Σ stride_d · %i<d>`.
fn flat_index(strides: &[i64]) -> Affine {
    let terms = strides
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != 0)
        .map(|(d, s)| (xpu_lir::Var::Loop(format!("i{d}")), *s))
        .collect();
    Affine::from_terms(0, terms).unwrap_or_default()
}

/// `for %i0 in 0..n0 parallel { for %i1 in 0..n1 { … body } }`.
fn loop_nest(sizes: &[usize], body: Vec<Stmt>) -> Vec<Stmt> {
    let mut stmts = body;
    for (d, &n) in sizes.iter().enumerate().rev() {
        stmts = vec![Stmt::For {
            var: format!("i{d}"),
            lo: Affine::constant(0),
            hi: Affine::constant(n as i64),
            parallel: d == 0,
            body: stmts,
        }];
    }
    stmts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing_merges_contiguous_dims_and_keeps_broadcast_boundaries() {
        // A bias over the last dim: two loops, the bias indexed by the inner one only.
        let d = coalesce(&[8, 4, 16], &[vec![8, 4, 16], vec![16]]);
        assert_eq!(d.sizes, vec![32, 16]);
        assert_eq!(d.strides, vec![vec![16, 1], vec![0, 1]]);
        assert_eq!(d.out_strides, vec![16, 1]);
        // Same shapes everywhere: one flat loop.
        let d = coalesce(&[2, 3, 4], &[vec![2, 3, 4], vec![2, 3, 4]]);
        assert_eq!(d.sizes, vec![24]);
        // A per-row scalar [8,1] against [8,16], and size-1 dims dropped.
        let d = coalesce(&[8, 1, 16], &[vec![8, 1, 1], vec![1, 16]]);
        assert_eq!(d.sizes, vec![8, 16]);
        assert_eq!(d.strides, vec![vec![1, 0], vec![0, 1]]);
        // A scalar output.
        let d = coalesce(&[], &[vec![]]);
        assert_eq!(d.sizes, vec![1]);
    }
}
