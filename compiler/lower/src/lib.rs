//! SGR-ML partition → LIR-ML kernels, for concrete input shapes. Elementwise nodes are
//! computed inside the kernels of their consumers (see `Lowering::inlined`: a value used
//! several times in one kernel — GELU's `x` — is computed once per element; one used by a
//! few kernels — softmax's `exp(x − m)` — is recomputed by each rather than stored), and
//! every other node roots a kernel: a loop nest over its output whose innermost body loads
//! each leaf once, computes every member as scalars and stores the root; reductions and
//! softmax (`reduce.rs`) put their members inside the reduction body. Dimensions are coalesced first — adjacent
//! dimensions merge where every operand steps through them contiguously (or broadcasts
//! both) — so a 4-D elementwise chain is one flat loop and a row broadcast is two loops.
//! Buffers are flat; every index is affine in the loop counters, so the verifier proves
//! each access in bounds. Constants of one element are inlined; larger ones are buffers.

mod gemm;
pub mod ops;
mod reduce;

use std::collections::HashMap;

use xpu_ir::infer::broadcast_shapes;
use xpu_ir::{DType, Graph, NodeId, Op, OpClass, Tensor, ValueId};
use xpu_lir::{Access, Affine, Buffer, Expr, Kernel, Literal, ScalarType, Stmt};

use ops::Body;

/// The ops `llvm.reduce` takes: reductions and softmax.
pub const REDUCE_OPS: &[Op] = &[
    Op::ReduceSum,
    Op::ReduceMean,
    Op::ReduceMax,
    Op::ReduceMin,
    Op::ReduceProd,
    Op::ReduceL1,
    Op::ReduceL2,
    Op::ReduceLogSum,
    Op::ReduceLogSumExp,
    Op::ReduceSumSquare,
    Op::Softmax,
    Op::LogSoftmax,
];

/// The dtypes softmax and log_softmax are lowered at. At f16/bf16 ONNX defines them by a
/// function body that rounds every intermediate to the input's type (the cpu engine does
/// so), and LIR-ML has no rounding to a storage type inside a kernel: computed in f32 they
/// land an ulp or two from ONNX's answer, so engines leave them to the cpu engine.
pub const SOFTMAX_DTYPES: [DType; 2] = [DType::F32, DType::F64];

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

impl ValueInfo {
    /// The bytes its elements take.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_bytes()
    }
}

/// One kernel call: the kernel and, per buffer, where its data is.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub kernel: Kernel,
    /// The catalogue kernel it implements: `llvm.fused` or `llvm.reduce`.
    pub implements: &'static str,
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

impl Program {
    /// The kernels, in step order, as one LIR-ML module.
    pub fn module(&self) -> xpu_lir::Module {
        xpu_lir::Module { kernels: self.steps.iter().map(|s| s.kernel.clone()).collect() }
    }
}

/// What LIR-ML buffers hold: every input and output of a lowered node has one.
pub const OPERAND_DTYPES: [DType; 7] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::Bool];

/// The float dtypes kernels compute at (a node's dtype is its first float input's); the
/// elementwise lowering takes i32, i64 and bool too, for the ops `ops::dtypes_of` names.
pub const FUSED_DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// The elementwise ops whose dtypes are narrower than `floats` + i32 + i64 + bool, grouped
/// by those dtypes: float functions take `floats` only, logical ops bools only, and so on
/// (`ops::dtypes_of`).
pub fn narrower_dtypes(floats: &[DType]) -> Vec<(Vec<Op>, Vec<DType>)> {
    let all: Vec<DType> =
        floats.iter().copied().chain([DType::I32, DType::I64, DType::Bool]).collect();
    let mut entries: Vec<(Vec<Op>, Vec<DType>)> = Vec::new();
    for &op in ops::OPS {
        let dtypes = ops::dtypes_of(op, floats);
        if dtypes == all {
            continue;
        }
        match entries.iter_mut().find(|e| e.1 == dtypes) {
            Some(e) => e.0.push(op),
            None => entries.push((vec![op], dtypes)),
        }
    }
    entries
}

/// The op classes the lowering takes (elementwise ops, reductions and softmax, matmul):
/// what an engine compiling its programs could ever run, known without loading anything.
pub fn op_classes() -> Vec<OpClass> {
    let mut classes: Vec<OpClass> = ops::OPS
        .iter()
        .chain(REDUCE_OPS)
        .chain(&[Op::MatMul, Op::Transpose, Op::LayerNormalization])
        .map(|o| o.class())
        .collect();
    classes.sort();
    classes.dedup();
    classes
}

/// The input shapes when every one is known and no input's value shapes the code: a
/// partition an engine can compile at prepare time, so errors show there.
pub fn shapes_known_at_prepare(g: &Graph) -> Option<Vec<Vec<usize>>> {
    if !structural_inputs(g).is_empty() {
        return None;
    }
    g.inputs.iter().map(|&v| g.ty(v).static_shape()).collect()
}

/// A partition this lowering cannot take, naming the node and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{node}: {message}")]
pub struct LowerError {
    pub node: String,
    pub message: String,
}

/// The LIR type that stores `d`, if any.
/// Whether an integer survives the trip through f64 that inlined constants take.
fn exact_in_f64(i: i64) -> bool {
    i.unsigned_abs() <= 1 << 53
}

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

/// Users a value may have and still be recomputed by each instead of stored.
const MAX_SHARED_USERS: usize = 4;
/// Nodes a shared value may cost to recompute.
const MAX_RECOMPUTED: usize = 8;
/// Nodes one kernel computes at most: a longer chain is cut into kernels of this size, so
/// a hostile or generated program cannot hand LLVM one enormous function.
const MAX_KERNEL_NODES: usize = 256;

/// The materialised values a group reads, their shapes, and the shape they broadcast to.
struct Leaves {
    values: Vec<ValueId>,
    shapes: Vec<Vec<usize>>,
    shape: Vec<usize>,
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
    /// The values of graph inputs that shape the code (a reduction's axes), by input.
    structural: &'g [Option<Vec<i64>>],
    outputs: Vec<bool>,
    places: HashMap<ValueId, Place>,
    values: Vec<ValueInfo>,
    steps: Vec<Step>,
}

/// The graph inputs whose values shape the code: a reduction's axes given as an input
/// rather than a constant. Kernels are specialised to these values as to the shapes.
pub fn structural_inputs(g: &Graph) -> Vec<usize> {
    g.inputs
        .iter()
        .enumerate()
        .filter(|(_, v)| {
            g.nodes
                .iter()
                .any(|n| reduce::is_reduction(n.op) && n.inputs.get(1) == Some(&Some(**v)))
        })
        .map(|(i, _)| i)
        .collect()
}

/// Lowers `g` for inputs of `shapes` (and, for the inputs [`structural_inputs`] names,
/// their values in `structural`; `None` elsewhere).
pub fn lower(
    g: &Graph,
    shapes: &[Vec<usize>],
    structural: &[Option<Vec<i64>>],
) -> Result<Program, LowerError> {
    let mut outputs = vec![false; g.values.len()];
    for o in &g.outputs {
        outputs[o.value.index()] = true;
    }
    let mut l = Lowering {
        g,
        structural,
        outputs,
        places: HashMap::new(),
        values: Vec::new(),
        steps: Vec::new(),
    };
    for (i, (&v, shape)) in g.inputs.iter().zip(shapes).enumerate() {
        l.places.insert(v, Place::Slot(Slot::Input(i), shape.clone()));
    }
    let inlined = l.inlined();
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
        if inlined[id.index()] {
            l.places.insert(n.outputs[0], Place::Fused);
            continue;
        }
        let members = l.members(id, &inlined);
        l.group(id, &members)?;
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

    /// Which nodes are computed inside their consumers' kernels instead of being stored:
    /// elementwise nodes whose value is not an output and whose every user takes it into its
    /// loop body (an elementwise node, or a reduction or softmax reading it as its data).
    /// A value with one user is always taken; one with several (up to [`MAX_SHARED_USERS`])
    /// is recomputed by each — softmax's `exp(x − m)` feeds both the sum and the division,
    /// and reading `x` twice beats writing and reading `e` — when what it costs to recompute
    /// (the nodes inlined under it) stays within [`MAX_RECOMPUTED`]. Decided producers first.
    fn inlined(&self) -> Vec<bool> {
        let g = self.g;
        let users = g.uses();
        let mut inlined = vec![false; g.nodes.len()];
        let mut cost = vec![0usize; g.nodes.len()];
        // Whether a matrix product is computed inside (its epilogue chain): never recomputed,
        // never inside a reduction body.
        let mut gemm = vec![false; g.nodes.len()];
        for id in g.node_ids() {
            let n = g.node(id);
            let Some(&v) = n.outputs.first() else { continue };
            let below =
                || n.input_values().filter_map(|i| g.producer(i)).filter(|p| inlined[p.index()]);
            cost[id.index()] = 1 + below().map(|p| cost[p.index()]).sum::<usize>();
            gemm[id.index()] = n.op == Op::MatMul || below().any(|p| gemm[p.index()]);
            let us = &users[v.index()];
            let mut distinct = us.clone();
            distinct.dedup();
            if n.op == Op::MatMul {
                // A product feeds its epilogue: the elementwise ops of its one consumer.
                inlined[id.index()] = !self.outputs[v.index()]
                    && distinct.len() == 1
                    && g.node(distinct[0]).op.is_elementwise();
                continue;
            }
            if !n.op.is_elementwise() || n.outputs.len() != 1 || self.outputs[v.index()] {
                continue;
            }
            let takes = |u: &NodeId| {
                let c = g.node(*u);
                c.op.is_elementwise()
                    || (!gemm[id.index()]
                        && REDUCE_OPS.contains(&c.op)
                        && c.inputs.first() == Some(&Some(v))
                        && c.inputs[1..].iter().all(|i| *i != Some(v)))
            };
            inlined[id.index()] = !us.is_empty()
                && us.iter().all(takes)
                && cost[id.index()] <= MAX_KERNEL_NODES
                && (distinct.len() == 1
                    || (!gemm[id.index()]
                        && distinct.len() <= MAX_SHARED_USERS
                        && cost[id.index()] <= MAX_RECOMPUTED));
        }
        inlined
    }

    /// The nodes `root`'s kernel computes: `root` and, through inlined producers, everything
    /// it reads that is not stored, in node order.
    fn members(&self, root: NodeId, inlined: &[bool]) -> Vec<NodeId> {
        let g = self.g;
        let mut seen = vec![false; g.nodes.len()];
        let mut stack = vec![root];
        let mut out = Vec::new();
        while let Some(id) = stack.pop() {
            if std::mem::replace(&mut seen[id.index()], true) {
                continue;
            }
            out.push(id);
            for v in g.node(id).input_values() {
                if let Some(p) = g.producer(v)
                    && inlined[p.index()]
                {
                    stack.push(p);
                }
            }
        }
        out.sort();
        out
    }

    /// Emits the kernel of the group rooted at `root` (`nodes`: its members in order).
    fn group(&mut self, root: NodeId, nodes: &[NodeId]) -> Result<(), LowerError> {
        let op = self.g.node(root).op;
        if reduce::is_reduction(op) {
            return self.reduction(root, &nodes[..nodes.len() - 1]);
        }
        if matches!(op, Op::Softmax | Op::LogSoftmax) {
            return self.softmax(root, &nodes[..nodes.len() - 1]);
        }
        if op == Op::MatMul {
            return self.matmul(root, None);
        }
        if op == Op::Transpose {
            return self.transpose(root);
        }
        if op == Op::LayerNormalization {
            return self.layer_norm(root);
        }
        let products: Vec<NodeId> =
            nodes.iter().copied().filter(|&n| self.g.node(n).op == Op::MatMul).collect();
        if let Some((&mm, others)) = products.split_last() {
            // One product per kernel: any other (`x @ w + h @ u`) is stored first and read
            // by the epilogue like any operand.
            for &other in others {
                self.matmul(other, None)?;
            }
            let epilogue: Vec<NodeId> =
                nodes.iter().copied().filter(|&n| !products.contains(&n)).collect();
            if self.epilogue_fits(mm, root, &epilogue)? {
                return self.matmul(mm, Some((root, &epilogue)));
            }
            // The epilogue broadcasts past the product or changes its type: store the
            // product, then run the epilogue as its own kernel.
            self.matmul(mm, None)?;
            return self.group(root, &epilogue);
        }
        let g = self.g;
        let out_v = g.node(root).outputs[0];
        let leaves = self.leaves(root, nodes)?;
        let shape = leaves.shape.clone();
        let compute = self.compute_type(nodes);
        let dims = coalesce(&shape, &leaves.shapes);
        self.elementwise_kernel(root, nodes, &leaves, &dims, compute, out_v)
    }

    /// The kernel of `nodes` (rooted at `root`; none: a copy of the one leaf) over `dims`:
    /// each leaf loaded at its strides, `nodes` computed in `compute`, value `out_v` stored
    /// at the output's strides.
    fn elementwise_kernel(
        &mut self,
        root: NodeId,
        nodes: &[NodeId],
        leaves: &Leaves,
        dims: &Dims,
        compute: ScalarType,
        out_v: ValueId,
    ) -> Result<(), LowerError> {
        let (mut buffers, mut slots, scalars) = self.leaf_buffers(root, leaves)?;
        let mut body = Body::new(compute);
        let names =
            self.prologue(&mut body, nodes, leaves, &scalars, &|k| flat_index(&dims.strides[k]))?;
        let value = names[&out_v].clone();
        let (out, slot) = self.output(root, &leaves.shape)?;
        body.stmts.push(Stmt::Store {
            buffer: out.name.clone(),
            index: vec![flat_index(&dims.out_strides)],
            value,
        });
        buffers.push(out);
        slots.push(slot);
        let members = if nodes.is_empty() { vec![root] } else { nodes.to_vec() };
        self.push_kernel(root, &members, buffers, slots, loop_nest(&dims.sizes, body.stmts));
        Ok(())
    }

    /// A transpose: a loop nest over the output reading its (stored) input at permuted
    /// strides — dims that stay in order and adjacent merge, so a batch of matrix
    /// transposes is a 3-deep nest.
    fn transpose(&mut self, root: NodeId) -> Result<(), LowerError> {
        let g = self.g;
        let n = g.node(root);
        let input =
            n.inputs.first().copied().flatten().ok_or_else(|| self.err(root, "no input"))?;
        let Some(Place::Slot(_, in_shape)) = self.places.get(&input).cloned() else {
            return Err(self.err(root, format!("reads {input}, which is not computed yet")));
        };
        let r = in_shape.len();
        let perm: Vec<usize> = match n.attrs.ints("perm") {
            None => (0..r).rev().collect(),
            Some(p) => {
                let perm: Vec<usize> =
                    p.iter().filter_map(|&d| usize::try_from(d).ok().filter(|&d| d < r)).collect();
                let mut seen = perm.clone();
                seen.sort_unstable();
                seen.dedup();
                if perm.len() != r || seen.len() != r {
                    return Err(
                        self.err(root, format!("perm {p:?} is not a permutation of {r} dims"))
                    );
                }
                perm
            }
        };
        let out_shape: Vec<usize> = perm.iter().map(|&p| in_shape[p]).collect();
        let in_strides = strides_in(&in_shape, &in_shape);
        let dims =
            coalesce_strides(&out_shape, vec![perm.iter().map(|&p| in_strides[p]).collect()]);
        let leaves = Leaves { values: vec![input], shapes: vec![in_shape], shape: out_shape };
        let elem = scalar_type(g.ty(input).dtype).unwrap_or(ScalarType::F32);
        self.elementwise_kernel(root, &[], &leaves, &dims, elem.compute(), input)
    }

    /// The materialised values `nodes` read, in first-use order, their shapes and the
    /// shape they broadcast to.
    fn leaves(&self, root: NodeId, nodes: &[NodeId]) -> Result<Leaves, LowerError> {
        let g = self.g;
        let mut values: Vec<ValueId> = Vec::new();
        for &id in nodes {
            for v in g.node(id).input_values() {
                if !matches!(self.places.get(&v), Some(Place::Fused)) && !values.contains(&v) {
                    values.push(v);
                }
            }
        }
        let mut shapes = Vec::new();
        let mut shape = Vec::new();
        for v in &values {
            let Some(Place::Slot(_, s)) = self.places.get(v) else {
                return Err(self.err(root, format!("reads {v}, which is not computed yet")));
            };
            shape = broadcast_shapes(&shape, s).map_err(|m| self.err(root, m))?;
            shapes.push(s.clone());
        }
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel.is_none_or(|n| n > i64::MAX as usize / 16) {
            return Err(self.err(root, format!("shape {shape:?} overflows index arithmetic")));
        }
        Ok(Leaves { values, shapes, shape })
    }

    /// One `in` buffer per leaf that is not a one-element constant (those are inlined: their
    /// values are returned by leaf), with where each buffer's data comes from.
    fn leaf_buffers(
        &self,
        root: NodeId,
        leaves: &Leaves,
    ) -> Result<(Vec<Buffer>, Vec<Slot>, HashMap<ValueId, f64>), LowerError> {
        let g = self.g;
        let (mut buffers, mut slots, mut scalars) = (Vec::new(), Vec::new(), HashMap::new());
        for (k, v) in leaves.values.iter().enumerate() {
            let Some(Place::Slot(slot, s)) = self.places.get(v).cloned() else { unreachable!() };
            let elem = scalar_type(g.ty(*v).dtype).ok_or_else(|| {
                self.err(root, format!("input dtype {} is not one LIR-ML stores", g.ty(*v).dtype))
            })?;
            if let Slot::Constant(t) = &slot
                && t.numel() == 1
                && elem != ScalarType::Bool
                && (!elem.is_int() || t.to_i64_vec().is_some_and(|v| exact_in_f64(v[0])))
            {
                scalars.insert(*v, t.to_f64_vec()[0]);
                continue;
            }
            let len = s.iter().product::<usize>() as i64;
            buffers.push(Buffer {
                name: format!("in{k}"),
                elem,
                shape: vec![Affine::constant(len)],
                access: Access::In,
            });
            slots.push(slot);
        }
        Ok((buffers, slots, scalars))
    }

    /// Statements computing `nodes` at one element into `body`: leaf `k` loaded at
    /// `index(k)` (or its inlined constant). Returns the name of every value computed.
    fn prologue(
        &self,
        body: &mut Body,
        nodes: &[NodeId],
        leaves: &Leaves,
        scalars: &HashMap<ValueId, f64>,
        index: &dyn Fn(usize) -> Affine,
    ) -> Result<HashMap<ValueId, String>, LowerError> {
        self.prologue_with(body, nodes, leaves, scalars, index, &[])
    }

    /// [`prologue`](Self::prologue) with some values already computed by the caller (a
    /// matrix product's element, for its epilogue).
    fn prologue_with(
        &self,
        body: &mut Body,
        nodes: &[NodeId],
        leaves: &Leaves,
        scalars: &HashMap<ValueId, f64>,
        index: &dyn Fn(usize) -> Affine,
        bound: &[(ValueId, String)],
    ) -> Result<HashMap<ValueId, String>, LowerError> {
        let g = self.g;
        let compute = body.ty;
        let mut names: HashMap<ValueId, String> = bound.iter().cloned().collect();
        for (k, v) in leaves.values.iter().enumerate() {
            let elem = scalar_type(g.ty(*v).dtype).unwrap_or(ScalarType::F32);
            let name = match scalars.get(v) {
                Some(&x) => {
                    let ty = elem.compute();
                    let value =
                        if ty.is_int() { Literal::Int(x as i64) } else { Literal::Float(x) };
                    body.let_(Expr::Const { ty, value })
                }
                None => body.load(&format!("in{k}"), index(k), elem),
            };
            names.insert(*v, name);
        }
        for &id in nodes {
            let n = g.node(id);
            let mut args: Vec<Option<String>> =
                n.inputs.iter().map(|i| i.map(|v| names[&v].clone())).collect();
            if n.op == Op::Pow {
                // ONNX's pow mixes types (f32 ^ i64, i32 ^ f32): compute in the float type.
                let float = n
                    .inputs
                    .iter()
                    .zip(&args)
                    .find(|(v, _)| v.is_some_and(|v| g.ty(v).dtype.is_float()))
                    .and_then(|(_, a)| a.as_deref().map(|a| body.type_of(a)))
                    .unwrap_or(compute);
                for (arg, input) in args.iter_mut().zip(&n.inputs) {
                    if let (Some(a), Some(v)) = (arg.as_mut(), input)
                        && !g.ty(*v).dtype.is_float()
                    {
                        *a = body.let_(Expr::Cast { arg: a.clone(), to: float });
                    }
                }
            }
            let scalar = |i: usize| {
                n.inputs.get(i).copied().flatten().and_then(|v| scalars.get(&v).copied())
            };
            let out = scalar_type(g.ty(n.outputs[0]).dtype).unwrap_or(compute);
            let mut name = ops::lower(body, n.op, &n.attrs, &args, &scalar, out)
                .map_err(|m| self.err(id, m))?;
            if n.op == Op::Pow && out.is_int() {
                name = body.let_(Expr::Cast { arg: name, to: out });
            }
            names.insert(n.outputs[0], name);
        }
        Ok(names)
    }

    /// The `out` buffer of `root`'s value, of `shape`, and its slot.
    fn output(&mut self, root: NodeId, shape: &[usize]) -> Result<(Buffer, Slot), LowerError> {
        let out_dtype = self.g.ty(self.g.node(root).outputs[0]).dtype;
        let elem = scalar_type(out_dtype)
            .ok_or_else(|| self.err(root, format!("dtype {out_dtype} is not one LIR-ML stores")))?;
        let value = self.values.len();
        self.values.push(ValueInfo { dtype: out_dtype, shape: shape.to_vec() });
        let len = shape.iter().product::<usize>() as i64;
        let buffer = Buffer {
            name: "out".into(),
            elem,
            shape: vec![Affine::constant(len)],
            access: Access::Out,
        };
        Ok((buffer, Slot::Computed(value)))
    }

    /// Records the kernel computing `root` (and `nodes`) and where its value now is.
    fn push_kernel(
        &mut self,
        root: NodeId,
        nodes: &[NodeId],
        buffers: Vec<Buffer>,
        slots: Vec<Slot>,
        body: Vec<Stmt>,
    ) {
        let g = self.g;
        let kernel = Kernel {
            name: format!("k{}_{}", self.steps.len(), g.node(root).op.name()),
            syms: Vec::new(),
            buffers,
            body,
        };
        let Some(Slot::Computed(value)) = slots.last().cloned() else { unreachable!() };
        let shape = self.values[value].shape.clone();
        self.places.insert(g.node(root).outputs[0], Place::Slot(Slot::Computed(value), shape));
        let mut all = nodes.to_vec();
        if !all.contains(&root) {
            all.push(root);
        }
        let op = g.node(root).op;
        let implements = if REDUCE_OPS.contains(&op) || op == Op::LayerNormalization {
            "llvm.reduce"
        } else if op == Op::MatMul {
            "llvm.gemm"
        } else {
            "llvm.fused"
        };
        // Idiom rewrites and fusions leave the spelling they replaced behind.
        let mut kernel = kernel;
        xpu_lir::fuse_exp_plus_one(&mut kernel);
        xpu_lir::remove_dead_values(&mut kernel);
        self.steps.push(Step { kernel, implements, buffers: slots, nodes: all });
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
    coalesce_strides(shape, leaves.iter().map(|s| strides_in(shape, s)).collect())
}

/// [`coalesce`] for leaves given by their strides over `shape` (a transposed view walks
/// its input at permuted strides).
fn coalesce_strides(shape: &[usize], leaves: Vec<Vec<i64>>) -> Dims {
    let r = shape.len();
    let mut all = leaves;
    all.push(strides_in(shape, shape));
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
    let vars: Vec<String> = (0..strides.len()).map(|d| format!("i{d}")).collect();
    index(&vars, strides)
}

/// `Σ coefficient · %var` over the variables with a nonzero coefficient (each variable
/// named once, so the terms never overflow).
pub(crate) fn index<V: AsRef<str>>(vars: &[V], coefficients: &[i64]) -> Affine {
    let terms = vars
        .iter()
        .zip(coefficients)
        .filter(|(_, c)| **c != 0)
        .map(|(v, c)| (xpu_lir::Var::Loop(v.as_ref().to_string()), *c))
        .collect();
    Affine::from_terms(0, terms).expect("distinct variables with i64 coefficients")
}

/// Right-aligned row-major strides of `leaf` inside `shape`, 0 where it broadcasts.
pub(crate) fn strides_in(shape: &[usize], leaf: &[usize]) -> Vec<i64> {
    let r = shape.len();
    let mut out = vec![0i64; r];
    let mut acc = 1i64;
    for d in (0..r).rev() {
        let Some(k) = (d + leaf.len()).checked_sub(r) else { continue };
        if leaf[k] != 1 {
            out[d] = acc;
        }
        acc = acc.saturating_mul(leaf[k] as i64);
    }
    out
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
    fn shapes_that_overflow_index_arithmetic_are_refused_by_name() {
        let g = xpu_ir::text::parse(
            "graph \"h\" {\n  %0: f32[N,M] = input \"x\"\n  %1: f32[N,M] = exp(%0)\n  %2: i64[1] = constant {value = tensor<i64[1]> [1]}\n  %3: f32[N,1] = reduce_sum(%1, %2)\n  return \"y\" = %3\n}",
        )
        .unwrap();
        let huge = vec![vec![1usize << 40, 1usize << 40]];
        let err = lower(&g, &huge, &[None]).unwrap_err();
        assert!(err.message.contains("overflows index arithmetic"), "{err}");
        let mm = xpu_ir::text::parse(
            "graph \"m\" {\n  %0: f32[N,K] = input \"a\"\n  %1: f32[K,M] = input \"b\"\n  %2: f32[N,M] = matmul(%0, %1)\n  return \"c\" = %2\n}",
        )
        .unwrap();
        let err = lower(&mm, &[vec![1 << 31, 1 << 31], vec![1 << 31, 1 << 31]], &[None, None])
            .unwrap_err();
        assert!(err.message.contains("overflow index arithmetic"), "{err}");
    }

    /// The `gelu` op's tanh form (x·½ first) and the chain as exporters write it (the
    /// product halved last) both lower to one expp1 (1 + exp), one division and no tanh,
    /// with the ½ and the −2 folded into other products: 4 multiplies per element, the last
    /// step x / d.
    #[test]
    fn gelu_tanh_form_lowers_to_one_exp_and_one_division_either_way() {
        let op = "%1: f32[4,8] = gelu(%0) {approximate = \"tanh\"}\n  return \"y\" = %1";
        let chain = "%9: f32[] = constant {value = tensor<f32[]> [3.0]}\n  %1: f32[4,8] = pow(%0, %9)\n  %2: f32[] = constant {value = tensor<f32[]> [0.044715]}\n  %3: f32[4,8] = mul(%1, %2)\n  %4: f32[4,8] = add(%0, %3)\n  %5: f32[] = constant {value = tensor<f32[]> [0.7978845608028654]}\n  %6: f32[4,8] = mul(%4, %5)\n  %7: f32[4,8] = tanh(%6)\n  %8: f32[] = constant {value = tensor<f32[]> [1.0]}\n  %10: f32[4,8] = add(%7, %8)\n  %11: f32[4,8] = mul(%0, %10)\n  %12: f32[] = constant {value = tensor<f32[]> [0.5]}\n  %13: f32[4,8] = mul(%11, %12)\n  return \"y\" = %13";
        for body in [op, chain] {
            let src = format!("graph \"g\" {{\n  %0: f32[4,8] = input \"x\"\n  {body}\n}}");
            let g = xpu_ir::text::parse(&src).unwrap();
            let text = lower(&g, &[vec![4, 8]], &[None]).unwrap().module().to_string();
            let count = |op: &str| text.matches(&format!(" = {op} ")).count();
            let counts = (count("exp"), count("expp1"), count("div"), count("tanh"));
            assert_eq!(counts, (0, 1, 1, 0), "{text}");
            assert_eq!(count("mul"), 4, "x², x³, ·0.044715, ·(−2k):\n{text}");
            assert!(!text.contains("const 0.5 "), "the halving is folded:\n{text}");
        }
    }

    #[test]
    fn a_transpose_walks_its_input_at_permuted_strides_merging_dims_that_stay_together() {
        // [2,3,4] with perm [0,2,1]: out [2,4,3] reads the input at strides [12,1,4]; no
        // two dims stay adjacent in both.
        let d = coalesce_strides(&[2, 4, 3], vec![vec![12, 1, 4]]);
        assert_eq!(
            (d.sizes, d.strides, d.out_strides),
            (vec![2, 4, 3], vec![vec![12, 1, 4]], vec![12, 3, 1])
        );
        // perm [1,2,0]: out [3,4,2] at strides [4,1,12]; the first two dims move together.
        let d = coalesce_strides(&[3, 4, 2], vec![vec![4, 1, 12]]);
        assert_eq!(
            (d.sizes, d.strides, d.out_strides),
            (vec![12, 2], vec![vec![1, 12]], vec![2, 1])
        );
        // Lowered: one kernel, a copy at those strides; a perm naming a dim twice is refused.
        let text = |perm: &str| {
            format!(
                "graph \"t\" {{\n  %0: f32[2,3,4] = input \"x\"\n  %1: f32[2,4,3] = transpose(%0) {{perm = [{perm}]}}\n  return \"y\" = %1\n}}"
            )
        };
        let g = xpu_ir::text::parse(&text("0, 2, 1")).unwrap();
        let p = lower(&g, &[vec![2, 3, 4]], &[None]).unwrap();
        assert_eq!(p.steps.len(), 1);
        let lir = p.module().to_string();
        assert!(lir.contains("load %in0[%i0*12 + %i1 + %i2*4]"), "{lir}");
        assert!(lir.contains("store %out[%i0*12 + %i1*3 + %i2]"), "{lir}");
        if let Ok(g) = xpu_ir::text::parse(&text("0, 1, 1")) {
            let e = lower(&g, &[vec![2, 3, 4]], &[None]).unwrap_err();
            assert!(e.message.contains("not a permutation"), "{e}");
        }
    }

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
