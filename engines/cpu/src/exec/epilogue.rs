//! Epilogue fusion, decided when a partition is prepared: a convolution or dense product
//! (`Conv`, `MatMul`, `Gemm`) absorbs the elementwise nodes that only consume its result —
//! a constant bias add, one residual add, activations — and applies them to each block of
//! its output while that block is still in cache, so the intermediate tensors never exist.
//! The fused arithmetic is the unfused nodes' arithmetic, in the same order: results are
//! bit-identical (tested against the elementwise kernels).

use std::sync::Arc;

use xpu_ir::{DType, Dim, Graph, Op, Tensor, ValueId};

/// An activation applied in place: the same formula as the cpu engine's elementwise kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Act {
    Relu,
    LeakyRelu(f32),
    Sigmoid,
    Tanh,
    /// `Clip` with constant bounds (absent bounds are infinite).
    Clip(f32, f32),
}

impl Act {
    /// The activation a node computes on f32, if it is one of these; `arg(i)` is the
    /// node's input `i` where known (Clip's bounds must be one-value f32 tensors).
    pub fn of<'t>(node: &xpu_ir::Node, arg: impl Fn(usize) -> Option<&'t Tensor>) -> Option<Act> {
        match node.op {
            Op::Relu => Some(Act::Relu),
            Op::Sigmoid => Some(Act::Sigmoid),
            Op::Tanh => Some(Act::Tanh),
            Op::LeakyRelu => {
                let alpha = node.attrs.float("alpha", f64::NAN) as f32;
                Some(Act::LeakyRelu(if alpha.is_nan() { 0.01 } else { alpha }))
            }
            Op::Clip => {
                let bound = |i: usize, default: f32| match node.inputs.get(i).copied().flatten() {
                    None => Some(default),
                    Some(_) => match arg(i)?.as_slice::<f32>()? {
                        [x] => Some(*x),
                        _ => None,
                    },
                };
                Some(Act::Clip(bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?))
            }
            _ => None,
        }
    }

    pub fn apply(self, xs: &mut [f32]) {
        match self {
            // NaN stays NaN, as numpy's maximum(x, 0).
            Act::Relu => xs.iter_mut().for_each(|v| *v = if *v < 0.0 { 0.0 } else { *v }),
            Act::LeakyRelu(a) => {
                xs.iter_mut().for_each(|v| *v = if *v >= 0.0 { *v } else { a * *v })
            }
            Act::Sigmoid => xs.iter_mut().for_each(|v| {
                let x = *v;
                *v = if x >= 0.0 { 1.0 / (1.0 + (-x).exp()) } else { x.exp() / (1.0 + x.exp()) }
            }),
            Act::Tanh => xs.iter_mut().for_each(|v| *v = v.tanh()),
            Act::Clip(lo, hi) => xs.iter_mut().for_each(|v| {
                let x = if *v < lo { lo } else { *v };
                *v = if x > hi { hi } else { x }
            }),
        }
    }
}

/// One fused operation, in the order the graph applies them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum EpiOp {
    /// A constant added along the channel axis (one value, or one per channel).
    Bias(Arc<[f32]>),
    /// The step's residual operand, of the output's shape, added element by element.
    Residual,
    Act(Act),
}

/// How an output block is laid out with respect to the bias axis.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Layout {
    /// `[…, channels, inner]`: each run of `inner` elements is one channel (convolution).
    Planes { channels: usize, inner: usize },
    /// `[…, n]`: the bias runs along each row (dense products).
    Rows { n: usize },
}

/// A fused epilogue: its operations and the nodes they came from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Epilogue {
    pub ops: Vec<EpiOp>,
    /// Node indices absorbed, in order; the last one defines the step's output.
    pub absorbed: Vec<usize>,
    pub residual: Option<ValueId>,
}

impl Epilogue {
    /// Applies the operations to `dst` (`residual`: the matching slice of the residual).
    pub fn apply(&self, dst: &mut [f32], residual: Option<&[f32]>, layout: Layout) {
        let chunk = match layout {
            Layout::Planes { inner, .. } => inner,
            Layout::Rows { n } => n,
        };
        if chunk == 0 {
            return;
        }
        for (p, part) in dst.chunks_exact_mut(chunk).enumerate() {
            for op in &self.ops {
                match op {
                    EpiOp::Bias(b) => match layout {
                        _ if b.len() == 1 => part.iter_mut().for_each(|v| *v += b[0]),
                        Layout::Planes { channels, .. } => {
                            let add = b[p % channels];
                            part.iter_mut().for_each(|v| *v += add);
                        }
                        Layout::Rows { .. } => {
                            part.iter_mut().zip(b.iter()).for_each(|(v, b)| *v += b)
                        }
                    },
                    EpiOp::Residual => {
                        if let Some(r) = residual {
                            let r = &r[p * chunk..][..chunk];
                            part.iter_mut().zip(r).for_each(|(v, r)| *v += r);
                        }
                    }
                    EpiOp::Act(a) => a.apply(part),
                }
            }
        }
    }

    /// Whether every bias fits `channels` (one value or one per channel).
    pub fn fits(&self, channels: usize) -> bool {
        self.ops.iter().all(|op| match op {
            EpiOp::Bias(b) => b.len() == 1 || b.len() == channels,
            _ => true,
        })
    }
}

/// The epilogue each node could absorb: `Some` for a `Conv`, `MatMul` or `Gemm` computing
/// f32 whose result flows only into fusable nodes (each consumed once, none a graph output).
pub(crate) fn plan_epilogues(g: &Graph) -> Vec<Option<Epilogue>> {
    let uses = g.uses();
    // The one node consuming `v`, when it is consumed once and is not a graph output.
    let sole_consumer = |v: ValueId| match uses[v.index()].as_slice() {
        [j] if !g.is_output(v) => Some(j.index()),
        _ => None,
    };
    let is_f32 = |v: ValueId| g.ty(v).dtype == DType::F32;
    // A node joins at most one epilogue: `relu(conv_a + conv_b)` fuses into conv_a's step
    // (conv_b's output its residual), never into both.
    let mut claimed = vec![false; g.nodes.len()];
    g.nodes
        .iter()
        .map(|anchor| {
            let channel_axis = match anchor.op {
                Op::Conv => ChannelAxis::Second,
                Op::MatMul | Op::Gemm => ChannelAxis::Last,
                _ => return None,
            };
            let out = *anchor.outputs.first()?;
            if anchor.outputs.len() != 1 || !is_f32(out) {
                return None;
            }
            let mut epi = Epilogue { ops: vec![], absorbed: vec![], residual: None };
            let mut cur = out;
            while let Some(j) = sole_consumer(cur) {
                if claimed[j] {
                    break;
                }
                let node = &g.nodes[j];
                let next = match node.outputs.as_slice() {
                    [o] if is_f32(*o) => *o,
                    _ => break,
                };
                let constant_arg = |i: usize| g.const_value(node.inputs.get(i).copied().flatten()?);
                let op = if let Some(a) = Act::of(node, constant_arg) {
                    (node.inputs.first().copied().flatten() == Some(cur)).then_some(EpiOp::Act(a))
                } else if node.op == Op::Add && node.inputs.len() == 2 {
                    let other = node.inputs.iter().flatten().copied().find(|&v| v != cur);
                    other.and_then(|other| match g.const_value(other) {
                        Some(c) => bias_of(c, g.ty(cur).dims.as_deref()?, channel_axis),
                        None if epi.residual.is_none()
                            && g.ty(other) == g.ty(cur)
                            && static_or_named(g.ty(cur).dims.as_deref()) =>
                        {
                            epi.residual = Some(other);
                            Some(EpiOp::Residual)
                        }
                        None => None,
                    })
                } else {
                    None
                };
                let Some(op) = op else { break };
                epi.ops.push(op);
                epi.absorbed.push(j);
                claimed[j] = true;
                cur = next;
            }
            (!epi.absorbed.is_empty()).then_some(epi)
        })
        .collect()
}

#[derive(Clone, Copy)]
enum ChannelAxis {
    /// Axis 1 of `[N, C, spatial…]`.
    Second,
    /// The last axis.
    Last,
}

/// The per-channel values of a constant added to an output of `dims`, when it broadcasts
/// along the channel axis only (or is one value).
fn bias_of(c: &Tensor, dims: &[Dim], axis: ChannelAxis) -> Option<EpiOp> {
    let values = c.as_slice::<f32>()?;
    let rank = dims.len();
    let shape = c.shape();
    if shape.len() > rank || values.is_empty() {
        return None;
    }
    let channel = match axis {
        ChannelAxis::Second if rank >= 2 => 1,
        ChannelAxis::Last if rank >= 1 => rank - 1,
        _ => return None,
    };
    let offset = rank - shape.len();
    let along_channel_only =
        shape.iter().enumerate().all(|(i, &d)| d == 1 || i + offset == channel);
    (along_channel_only && (values.len() == 1 || dims[channel] == Dim::Known(values.len() as u64)))
        .then(|| EpiOp::Bias(values.into()))
}

/// Dims known or named (so equal types mean equal shapes at run time).
fn static_or_named(dims: Option<&[Dim]>) -> bool {
    dims.is_some_and(|d| d.iter().all(|d| !matches!(d, Dim::Unknown)))
}
