//! One run of a prepared cpu executable: steps in order over a value table, each output
//! written in place, into a pooled buffer or (ops without a buffer-taking variant) into
//! memory its kernel allocates; every value released at its last use.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use ndarray::{ArrayViewMutD, IxDyn, Zip};
use xpu_engine::options::{Capture, Pool as PoolSetting, Reuse};
use xpu_engine::{EngineError, Execution, Fact, NodeTiming, StopToken};
use xpu_ir::{DType, Node, NodeId, Op, Tensor, TensorData, ValueId};

use super::epilogue::{Epilogue, Layout};
use super::{Act, CpuExecutable, Pool, Work};
use crate::conv::{ConvOperands, conv_into, pool_2d_into};
use crate::elementwise::broadcast_shape;
use crate::linalg::{gemm_into, matmul_rows_into};
use crate::util::{KResult, view};

/// A value during a run: borrowed from the caller (graph inputs) or held here.
enum Slot<'a> {
    Borrowed(&'a Tensor),
    Held(Tensor),
}

impl Slot<'_> {
    fn get(&self) -> &Tensor {
        match self {
            Slot::Borrowed(t) => t,
            Slot::Held(t) => t,
        }
    }
}

/// The run's values and the accounting of their storage.
struct Values<'a> {
    slots: Vec<Option<Slot<'a>>>,
    /// Live storage: id → what it is. Inputs and constants are not in it.
    storage: HashMap<usize, Storage>,
    /// Storage owned elsewhere (the caller's inputs, the graph's constants).
    external: HashSet<usize>,
}

/// A buffer live values hold (several when a reshape shares it).
struct Storage {
    bytes: u64,
    holders: u32,
    /// The pool slot it came from, if any: it returns there when its last holder dies.
    pool_slot: Option<usize>,
}

impl<'a> Values<'a> {
    fn get(&self, v: ValueId) -> Option<&Tensor> {
        self.slots[v.index()].as_ref().map(Slot::get)
    }

    /// Stores a computed value, counting its storage once however many values share it.
    fn define(&mut self, v: ValueId, t: Tensor, slot: Option<usize>, pool: &mut Pool) {
        let id = t.storage_id();
        if !self.external.contains(&id) {
            let bytes = t.size_bytes() as u64;
            let entry =
                self.storage.entry(id).or_insert(Storage { bytes, holders: 0, pool_slot: None });
            if entry.holders == 0 {
                pool.live_add(bytes);
            }
            entry.holders += 1;
            entry.pool_slot = entry.pool_slot.or(slot);
        }
        self.slots[v.index()] = Some(Slot::Held(t));
    }

    /// Takes a value out of the table (it dies here), uncounting its storage; with it the
    /// pool slot of its buffer when it was the buffer's last holder.
    /// The caller's inputs stay where they are (`None`): they are not ours to take.
    fn take(&mut self, v: ValueId, pool: &mut Pool) -> Option<(Tensor, Option<usize>)> {
        let Some(Slot::Held(t)) =
            self.slots[v.index()].take_if(|slot| matches!(slot, Slot::Held(_)))
        else {
            return None;
        };
        let id = t.storage_id();
        let mut slot = None;
        if let Some(entry) = self.storage.get_mut(&id) {
            entry.holders -= 1;
            if entry.holders == 0 {
                pool.live_sub(entry.bytes);
                slot = entry.pool_slot;
                self.storage.remove(&id);
            }
        }
        Some((t, slot))
    }

    /// Releases a dead value; its buffer goes back to the pool when nothing shares it.
    fn release(&mut self, v: ValueId, pool: &mut Pool, reuse: bool) {
        let taken = self.take(v, pool);
        self.slots[v.index()] = None;
        if let Some((t, slot)) = taken
            && reuse
            && let Ok((_, data)) = t.try_into_parts()
        {
            pool.give(data, slot);
        }
    }
}

impl CpuExecutable {
    pub(super) fn run_here(
        &mut self,
        inputs: &[Tensor],
        stop: &StopToken,
    ) -> Result<Execution, EngineError> {
        xpu_engine::check_inputs(&self.graph, inputs)?;
        let capture = self.begin_capture(inputs);
        self.buffers.begin(capture);
        // The caller's inputs are live for the whole run (the memory plan counts them so).
        let input_bytes: u64 = inputs.iter().map(|t| t.size_bytes() as u64).sum();
        let result = self.run_steps(inputs, input_bytes, stop);
        self.buffers.end(self.mode.pool != PoolSetting::None);
        let mut execution = result?;
        execution.facts.extend(self.memory_facts(input_bytes, capture));
        Ok(execution)
    }

    /// Under `capture = "graph"` with a kept pool: `Some(true)` replays the assignment
    /// recorded for these input shapes, `Some(false)` records one (first run, or the shapes
    /// changed). `None`: best fit, nothing recorded. When the shapes change, an arena
    /// (`memory.pool = "arena"`) is rebuilt for them; a caching pool keeps its buffers.
    fn begin_capture(&mut self, inputs: &[Tensor]) -> Option<bool> {
        let same =
            |s: &Vec<Vec<usize>>| s.iter().map(Vec::as_slice).eq(inputs.iter().map(Tensor::shape));
        let first = self.captured.is_none();
        let changed = self.captured.as_ref().is_some_and(|s| !same(s));
        if changed && self.mode.pool == PoolSetting::Arena {
            self.buffers.clear();
        }
        if first || changed {
            // Copied only when they differ: a steady run allocates nothing here.
            self.captured = Some(inputs.iter().map(|t| t.shape().to_vec()).collect());
        }
        let kept = self.mode.pool != PoolSetting::None && self.mode.reuse != Reuse::None;
        if self.mode.capture != Capture::Graph || !kept {
            return None;
        }
        if changed {
            self.recaptures += 1;
        }
        Some(!first && !changed)
    }

    fn run_steps(
        &mut self,
        inputs: &[Tensor],
        input_bytes: u64,
        stop: &StopToken,
    ) -> Result<Execution, EngineError> {
        let _loops_stop_here = self.has_control.then(|| crate::control::StopScope::enter(stop));
        let g = &self.graph;
        let reuse = self.mode.reuse != Reuse::None;
        let mut values = Values {
            slots: (0..g.values.len()).map(|_| None).collect(),
            storage: HashMap::new(),
            external: inputs.iter().map(Tensor::storage_id).collect(),
        };
        for (&v, t) in g.inputs.iter().zip(inputs) {
            values.slots[v.index()] = Some(Slot::Borrowed(t));
        }
        let mut timings = Vec::with_capacity(g.nodes.len());
        for (si, step) in self.steps.iter().enumerate() {
            let node = &g.nodes[step.node];
            let id = NodeId(step.node as u32);
            let start = Instant::now();
            let outs: Vec<(Tensor, Option<usize>)> = match &step.work {
                Work::Const(c) => {
                    values.external.insert(c.storage_id());
                    vec![((**c).clone(), None)]
                }
                work => {
                    stop.check(|| node.label(id))?;
                    let ctx = StepCtx {
                        node,
                        kernel: self.kernels[step.node],
                        out_dtypes: &self.out_dtypes[step.node],
                        in_place: self.mode.reuse == Reuse::InPlace,
                        pooled: reuse,
                        leaves: step.outputs.iter().any(|o| self.last_use[o.index()] == usize::MAX),
                        last_here: |v: ValueId| self.last_use[v.index()] == si,
                    };
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        ctx.run(work, &mut values, &mut self.buffers, &mut self.scratch)
                    }));
                    let outs = match result {
                        Ok(r) => r.map_err(|message| EngineError::Kernel {
                            node: node.label(id),
                            message,
                        })?,
                        Err(p) => return Err(kernel_panic(node, id, p)),
                    };
                    if outs.len() != step.outputs.len() {
                        return Err(EngineError::Kernel {
                            node: node.label(id),
                            message: format!(
                                "produced {} outputs, expected {}",
                                outs.len(),
                                step.outputs.len()
                            ),
                        });
                    }
                    outs
                }
            };
            for (&o, (t, slot)) in step.outputs.iter().zip(outs) {
                values.define(o, t, slot, &mut self.buffers);
            }
            if let Some(limit) = self.memory_limit {
                let needed = input_bytes + self.buffers.stats.live;
                if needed > limit {
                    return Err(EngineError::MemoryLimit {
                        what: format!("{}: live tensors", node.label(id)),
                        needed,
                        limit,
                    });
                }
            }
            // Move semantics: a value is released after its last use.
            for v in step.reads.iter().chain(&step.outputs) {
                if self.last_use[v.index()] == si {
                    values.release(*v, &mut self.buffers, reuse);
                }
            }
            let nanos = start.elapsed().as_nanos() as u64;
            let kernel = self.kernels[step.node].name();
            timings.push(NodeTiming { node: id, kernel: kernel.to_string(), nanos });
            // Absorbed nodes ran inside the anchor's time: no time of their own.
            if let Work::Fused(epi) = &step.work {
                timings.extend(epi.absorbed.iter().map(|&j| NodeTiming {
                    node: NodeId(j as u32),
                    kernel: kernel.to_string(),
                    nanos: 0,
                }));
            }
        }
        // Move each output out of its slot (the last output naming a value takes it; earlier
        // ones share it), so a result is never copied.
        let mut outputs = Vec::with_capacity(g.outputs.len());
        for (k, o) in g.outputs.iter().enumerate() {
            let t = values.get(o.value).cloned().ok_or_else(|| {
                EngineError::Other(format!("output {:?} was not computed", o.name))
            })?;
            if !g.outputs[k + 1..].iter().any(|later| later.value == o.value) {
                values.take(o.value, &mut self.buffers);
            }
            outputs.push(t);
        }
        Ok(Execution { outputs, timings, facts: self.prepared_facts.clone() })
    }

    /// The run's memory figures and capture outcome as facts (see docs/policies.md).
    fn memory_facts(&self, input_bytes: u64, capture: Option<bool>) -> Vec<Fact> {
        let s = &self.buffers.stats;
        let fact = |key: &str, value: String| Fact { node: None, key: key.into(), value };
        let mut facts = vec![
            fact("memory.peak_live_bytes", (input_bytes + s.peak_live).to_string()),
            fact("memory.peak_held_bytes", (input_bytes + s.peak_held).to_string()),
            fact("memory.allocated_buffers", s.allocations.to_string()),
            fact("memory.reused_buffers", s.reused.to_string()),
            fact("memory.in_place", s.in_place.to_string()),
            fact("memory.kernel_allocations", s.kernel_allocations.to_string()),
        ];
        if let Some(replayed) = capture {
            let what = if replayed {
                format!("replayed ({} buffer requests off their recorded buffer)", s.replay_misses)
            } else if self.recaptures > 0 {
                format!("recorded again: input shapes changed ({} re-captures)", self.recaptures)
            } else {
                "recorded (first run for these input shapes)".to_string()
            };
            facts.push(fact("capture", what));
        }
        facts
    }
}

fn kernel_panic(node: &Node, id: NodeId, p: Box<dyn std::any::Any + Send>) -> EngineError {
    let what = xpu_engine::panic_message(&*p);
    EngineError::Kernel {
        node: node.label(id),
        message: format!("internal error in the cpu engine (please report): {what}"),
    }
}

/// What a step needs to know about its node and the memory mode.
struct StepCtx<'n, F: Fn(ValueId) -> bool> {
    node: &'n Node,
    kernel: crate::Kernel,
    out_dtypes: &'n [DType],
    in_place: bool,
    pooled: bool,
    /// The step's result leaves with the caller (a graph output): it gets its own exact
    /// allocation, so a pooled buffer — maybe far larger — does not leave with it.
    leaves: bool,
    /// Whether a value's last use is this step.
    last_here: F,
}

type Outs = Vec<(Tensor, Option<usize>)>;

impl<F: Fn(ValueId) -> bool> StepCtx<'_, F> {
    fn run(
        &self,
        work: &Work,
        values: &mut Values<'_>,
        pool: &mut Pool,
        scratch: &mut Vec<f32>,
    ) -> KResult<Outs> {
        let epi = match work {
            Work::Fused(epi) => Some(epi),
            _ => None,
        };
        let n = self.node;
        let f32_out = self.out_dtypes.first() == Some(&DType::F32) && self.out_dtypes.len() == 1;
        if f32_out
            && (epi.is_some() || self.pooled)
            && let Some(out) = self.fast(epi, values, pool, scratch)?
        {
            return Ok(out);
        }
        if f32_out
            && self.pooled
            && let Some(out) = self.elementwise(values, pool)?
        {
            return Ok(out);
        }
        // The general path: the kernel allocates its outputs.
        let args: Vec<Option<&Tensor>> =
            n.inputs.iter().map(|v| v.and_then(|v| values.get(v))).collect();
        let mut outs = crate::eval(n, self.kernel, &args, self.out_dtypes)?;
        if let Some(epi) = epi {
            let residual = fused_residual(epi, values)?.cloned();
            let t = outs.pop().ok_or("no output")?;
            outs = vec![apply_after(t, epi, residual.as_ref(), n.op)?];
        }
        // Outputs that share an input's storage (reshapes, identities) allocated nothing.
        for t in &outs {
            if !args.iter().flatten().any(|a| a.shares_data_with(t)) {
                pool.kernel_allocated(t.size_bytes() as u64);
            }
        }
        Ok(outs.into_iter().map(|t| (t, None)).collect())
    }

    /// Conv, MatMul, Gemm and 2-D pooling on f32 into a pooled buffer, with the epilogue
    /// applied per image (conv) or over the product (dense). `None`: not of that form.
    fn fast(
        &self,
        epi: Option<&Epilogue>,
        values: &Values<'_>,
        pool: &mut Pool,
        scratch: &mut Vec<f32>,
    ) -> KResult<Option<Outs>> {
        let n = self.node;
        let arg = |i: usize| n.inputs.get(i).copied().flatten().and_then(|v| values.get(v));
        let residual = match epi {
            Some(epi) => fused_residual(epi, values)?,
            None => None,
        };
        let all_f32 = n
            .inputs
            .iter()
            .flatten()
            .all(|&v| values.get(v).is_some_and(|t| t.dtype() == DType::F32));
        if !all_f32 {
            return Ok(None);
        }
        let mut slot = None;
        let mut take = |len: usize| {
            let (v, s) = self.buffer(pool, len);
            slot = s;
            v
        };
        let mk = self.kernel.matmul();
        let (data, shape) = match n.op {
            Op::Conv => {
                let (Some(x), Some(w)) = (arg(0), arg(1)) else { return Ok(None) };
                let m = w.shape().first().copied().unwrap_or(0);
                if epi.is_some_and(|e| !e.fits(m)) {
                    return Err(format!("a fused bias does not fit {m} channels"));
                }
                let res =
                    residual.map(|r| r.as_slice::<f32>().ok_or("residual dtype")).transpose()?;
                // The residual's type is the output's (checked when fusing). A shape that
                // still differs at run time is never read out of range here and fails the
                // step below.
                let per_image = |b: usize, dst: &mut [f32]| {
                    let Some(epi) = epi else { return };
                    let r = res.and_then(|r| r.get(b * dst.len()..(b + 1) * dst.len()));
                    let inner = dst.len() / m.max(1);
                    epi.apply(dst, r, Layout::Planes { channels: m, inner });
                };
                let ops = ConvOperands { x, w, bias: arg(2) };
                let (data, shape) =
                    conv_into::<f32>(mk, &n.attrs, ops, &mut take, scratch, &per_image)?;
                if let Some(r) = residual {
                    check_residual(r, &shape)?;
                }
                (data, shape)
            }
            Op::MatMul => {
                let (Some(a), Some(b)) = (arg(0), arg(1)) else { return Ok(None) };
                match matmul_rows_into::<f32>(mk, a, b, &mut take)? {
                    Some(r) => r,
                    None => return Ok(None),
                }
            }
            Op::Gemm => {
                let args: Vec<Option<&Tensor>> = (0..n.inputs.len()).map(arg).collect();
                gemm_into::<f32>(mk, &n.attrs, &args, &mut take)?
            }
            Op::MaxPool | Op::AveragePool | Op::GlobalAveragePool | Op::GlobalMaxPool
                if epi.is_none() =>
            {
                let Some(x) = arg(0) else { return Ok(None) };
                match pool_2d_into::<f32>(n.op, &n.attrs, x, n.outputs.len(), &mut take)? {
                    Some(r) => r,
                    None => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let mut t = Tensor::from_vec(shape, data).map_err(|e| e.to_string())?;
        if let Some(epi) = epi
            && n.op != Op::Conv
        {
            t = apply_after(t, epi, residual, n.op)?;
        }
        Ok(Some(vec![(t, slot)]))
    }

    /// A buffer for this step's result of `len` elements and its pool slot: a pooled one,
    /// or for a result that leaves with the caller its own (the kernel sizes it exactly).
    fn buffer(&self, pool: &mut Pool, len: usize) -> (Vec<f32>, Option<usize>) {
        if self.leaves {
            return (pool.take_fresh(), None);
        }
        let (v, slot) = pool.take_f32(len);
        (v, Some(slot))
    }

    /// Activations and broadcasting Add/Sub/Mul/Div on f32: over a dying operand's buffer
    /// (`reuse = "in-place"`), else over a pooled copy of the operand of the output's shape.
    fn elementwise(&self, values: &mut Values<'_>, pool: &mut Pool) -> KResult<Option<Outs>> {
        let n = self.node;
        let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
        if ins.len() != n.inputs.len()
            || ins.iter().any(|&v| values.get(v).is_none_or(|t| t.dtype() != DType::F32))
        {
            return Ok(None);
        }
        // Clip's bounds must be one-value tensors, as for fusion.
        let act = Act::of(n, |i| n.inputs.get(i).copied().flatten().and_then(|v| values.get(v)));
        let binary = matches!(n.op, Op::Add | Op::Sub | Op::Mul | Op::Div) && ins.len() == 2;
        if act.is_none() && !binary {
            return Ok(None);
        }
        let shape = if binary {
            broadcast_shape(
                values.get(ins[0]).unwrap().shape(),
                values.get(ins[1]).unwrap().shape(),
            )?
        } else {
            values.get(ins[0]).unwrap().shape().to_vec()
        };
        // The operand the result is written over: of the output's shape; dying here first.
        let candidates: Vec<usize> = if binary { vec![0, 1] } else { vec![0] };
        let full: Vec<usize> = candidates
            .into_iter()
            .filter(|&i| values.get(ins[i]).unwrap().shape() == shape.as_slice())
            .collect();
        let Some(&first_full) = full.first() else { return Ok(None) };
        let dying = full.iter().copied().find(|&i| {
            self.in_place
                && (self.last_here)(ins[i])
                && ins.iter().filter(|&&v| v == ins[i]).count() == 1
        });
        let (target, mut buf, slot, in_place) = match dying.and_then(|i| {
            let (t, slot) = values.take(ins[i], pool)?;
            match t.try_into_parts() {
                // A result that leaves with the caller takes the buffer only when it is
                // exactly its size: a larger pooled buffer stays in the pool.
                Ok((_, TensorData::F32(v))) if !self.leaves || v.capacity() == v.len() => {
                    Some((i, v, slot))
                }
                Ok((shape, data)) => {
                    if let Ok(t) = Tensor::new(shape, data) {
                        values.define(ins[i], t, slot, pool);
                    }
                    None
                }
                Err(t) => {
                    values.define(ins[i], t, slot, pool);
                    None
                }
            }
        }) {
            Some((i, v, slot)) => (i, v, slot, true),
            None => {
                let src = values.get(ins[first_full]).unwrap().as_slice::<f32>().ok_or("dtype")?;
                let (mut v, s) = self.buffer(pool, src.len());
                v.clear();
                v.extend_from_slice(src);
                (first_full, v, s, false)
            }
        };
        if in_place {
            pool.stats.in_place += 1;
        }
        if let Some(act) = act {
            act.apply(&mut buf);
        } else {
            let other = values.get(ins[1 - target]).ok_or("operand released")?;
            binary_over(n.op, &mut buf, &shape, target == 0, other)?;
        }
        let t = Tensor::from_vec(shape, buf).map_err(|e| e.to_string())?;
        Ok(Some(vec![(t, slot)]))
    }
}

/// The residual a fused step adds, which must be computed by now.
fn fused_residual<'v>(epi: &Epilogue, values: &'v Values<'_>) -> KResult<Option<&'v Tensor>> {
    match epi.residual {
        None => Ok(None),
        Some(v) => {
            values.get(v).map(Some).ok_or_else(|| format!("the fused residual {v} is not computed"))
        }
    }
}

/// `dst = dst ∘ other` (`dst_left`) or `other ∘ dst`, `other` broadcast to `shape`: the
/// elementwise kernel's arithmetic, written over `dst`.
fn binary_over(
    op: Op,
    dst: &mut [f32],
    shape: &[usize],
    dst_left: bool,
    other: &Tensor,
) -> KResult<()> {
    let o = view::<f32>(other)?;
    let o = o.broadcast(IxDyn(shape)).ok_or("broadcast failed")?;
    let mut d = ArrayViewMutD::from_shape(IxDyn(shape), dst).map_err(|e| e.to_string())?;
    macro_rules! go {
        ($f:expr) => {{
            let f = $f;
            if dst_left {
                Zip::from(&mut d).and(&o).for_each(|d, &o| *d = f(*d, o));
            } else {
                Zip::from(&mut d).and(&o).for_each(|d, &o| *d = f(o, *d));
            }
        }};
    }
    match op {
        Op::Add => go!(|a: f32, b: f32| a + b),
        Op::Sub => go!(|a: f32, b: f32| a - b),
        Op::Mul => go!(|a: f32, b: f32| a * b),
        Op::Div => go!(|a: f32, b: f32| a / b),
        _ => return Err(format!("{op} is not a binary arithmetic op")),
    }
    Ok(())
}

/// An epilogue over a finished product `t` (rows along its last axis; channel planes for
/// a convolution the general kernel ran).
fn apply_after(t: Tensor, epi: &Epilogue, residual: Option<&Tensor>, op: Op) -> KResult<Tensor> {
    let shape = t.shape().to_vec();
    if let Some(r) = residual {
        check_residual(r, &shape)?;
    }
    let layout = match op {
        Op::Conv if shape.len() >= 2 => {
            Layout::Planes { channels: shape[1], inner: shape[2..].iter().product() }
        }
        _ => Layout::Rows { n: shape.last().copied().unwrap_or(1) },
    };
    let channels = match layout {
        Layout::Planes { channels, .. } => channels,
        Layout::Rows { n } => n,
    };
    if !epi.fits(channels) {
        return Err(format!("a fused bias does not fit {channels} channels"));
    }
    let (_, data) = t.into_parts();
    let TensorData::F32(mut v) = data else { return Err("a fused epilogue needs f32".into()) };
    epi.apply(&mut v, residual.and_then(|r| r.as_slice::<f32>()), layout);
    Tensor::from_vec(shape, v).map_err(|e| e.to_string())
}

fn check_residual(r: &Tensor, shape: &[usize]) -> KResult<()> {
    if r.shape() != shape || r.dtype() != DType::F32 {
        return Err(format!(
            "the fused residual {:?} {} does not match the output {shape:?}",
            r.shape(),
            r.dtype()
        ));
    }
    Ok(())
}
