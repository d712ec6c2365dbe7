//! Control flow: `if`, `loop` and `scan` run their subgraphs on this engine, each subgraph
//! prepared once per node run and executed per branch, iteration or slice.
//!
//! A loop is bounded: it stops with an error after [`MAX_LOOP_ITERATIONS`] iterations, or
//! when its scan outputs would hold more than [`MAX_SCAN_OUTPUT_BYTES`], and it checks the
//! run's stop token (cancel, deadline) every iteration.

use std::cell::RefCell;

use xpu_engine::{Assignment, Engine, Executable, StopToken};
use xpu_ir::control::{self, LoopParts, ScanParts};
use xpu_ir::{Graph, Node, Op, Tensor};

use crate::util::KResult;

/// The most iterations a loop (or slices a scan) may run: a trip count of 2^62 with a
/// condition that never turns false is an error, not a hang.
pub const MAX_LOOP_ITERATIONS: u64 = 1_000_000;

/// The most bytes a loop's or scan's stacked outputs may hold.
pub const MAX_SCAN_OUTPUT_BYTES: usize = 4 << 30;

thread_local! {
    /// The stop token of the run executing on this thread, for loops inside one node.
    static STOP: RefCell<StopToken> = RefCell::new(StopToken::default());
}

/// Makes `stop` the token loops on this thread check until the guard drops.
pub(crate) struct StopScope(Option<StopToken>);

impl StopScope {
    pub(crate) fn enter(stop: &StopToken) -> StopScope {
        StopScope(Some(STOP.with(|s| s.replace(stop.clone()))))
    }
}

impl Drop for StopScope {
    fn drop(&mut self) {
        if let Some(previous) = self.0.take() {
            STOP.with(|s| *s.borrow_mut() = previous);
        }
    }
}

fn current_stop() -> StopToken {
    STOP.with(|s| s.borrow().clone())
}

/// A subgraph prepared on this engine.
struct Sub {
    exe: Box<dyn Executable>,
    what: &'static str,
}

impl Sub {
    fn new(g: &Graph, what: &'static str) -> KResult<Sub> {
        let exe = crate::CpuEngine::new()
            .prepare(g, &Assignment::new("cpu"))
            .map_err(|e| format!("`{what}`: {e}"))?;
        Ok(Sub { exe, what })
    }

    fn run(&mut self, inputs: &[Tensor], stop: &StopToken) -> KResult<Vec<Tensor>> {
        self.exe
            .run_until(inputs, stop)
            .map(|r| r.outputs)
            .map_err(|e| format!("`{}`: {e}", self.what))
    }
}

fn graph<'a>(node: &'a Node, name: &str) -> KResult<&'a Graph> {
    node.attrs.graph(name).ok_or_else(|| format!("attribute `{name}` (a graph) is required"))
}

fn owned(inputs: &[Option<&Tensor>], what: &str) -> KResult<Vec<Tensor>> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, t)| t.map(|t| (*t).clone()).ok_or_else(|| format!("{what} {i} is omitted")))
        .collect()
}

/// The value of a one-element tensor (a condition, a trip count).
fn one_value(t: &Tensor, what: &str) -> KResult<f64> {
    if t.numel() != 1 {
        return Err(format!("{what} must have one element, has shape {:?}", t.shape()));
    }
    Ok(t.data().get_f64(0))
}

/// The truth of a one-element tensor (a condition).
fn truth(t: &Tensor, what: &str) -> KResult<bool> {
    Ok(one_value(t, what)? != 0.0)
}

pub fn eval(node: &Node, inputs: &[Option<&Tensor>], n_out: usize) -> KResult<Vec<Tensor>> {
    let stop = current_stop();
    match node.op {
        Op::If => run_if(node, inputs, &stop),
        Op::Loop => {
            let parts = control::loop_parts(&node.attrs, inputs.len(), n_out)?;
            run_loop(node, inputs, parts, &stop)
        }
        Op::Scan => {
            let parts = control::scan_parts(&node.attrs, inputs.len(), n_out)?;
            run_scan(node, inputs, parts, &stop)
        }
        op => Err(format!("{op} is not a control-flow op")),
    }
}

fn run_if(node: &Node, inputs: &[Option<&Tensor>], stop: &StopToken) -> KResult<Vec<Tensor>> {
    let cond = inputs.first().copied().flatten().ok_or("the condition is omitted")?;
    let branch = if truth(cond, "the condition")? { "then_branch" } else { "else_branch" };
    let captures = owned(&inputs[1..], "capture")?;
    Sub::new(graph(node, branch)?, branch)?.run(&captures, stop)
}

/// Stacks per-iteration slices along a new axis 0 (`empty_slice` gives the slice type when
/// there were no iterations).
fn stack(slices: Vec<Tensor>, empty_slice: &xpu_ir::TensorType, axis: usize) -> KResult<Tensor> {
    let Some(first) = slices.first() else {
        let mut shape: Vec<usize> = empty_slice
            .dims
            .as_ref()
            .map(|d| d.iter().map(|d| d.known().unwrap_or(0) as usize).collect())
            .unwrap_or_default();
        shape.insert(axis.min(shape.len()), 0);
        return Ok(Tensor::zeros(empty_slice.dtype, shape));
    };
    let shape = first.shape().to_vec();
    if let Some(t) =
        slices.iter().find(|t| t.shape() != shape.as_slice() || t.dtype() != first.dtype())
    {
        return Err(format!(
            "scan output slices differ: {} {:?} and {} {:?}",
            first.dtype(),
            shape,
            t.dtype(),
            t.shape()
        ));
    }
    let expanded: Vec<Tensor> = slices
        .iter()
        .map(|t| {
            let mut s = shape.clone();
            s.insert(axis, 1);
            t.clone().reshaped(s)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let refs: Vec<&Tensor> = expanded.iter().collect();
    crate::movement::concat_tensors(&refs, axis)
}

fn run_loop(
    node: &Node,
    inputs: &[Option<&Tensor>],
    p: LoopParts,
    stop: &StopToken,
) -> KResult<Vec<Tensor>> {
    let body_graph = graph(node, "body")?;
    let mut body = Sub::new(body_graph, "body")?;
    let trip = match inputs[0] {
        Some(m) => Some(one_value(m, "the trip count M")?.max(0.0) as u64),
        None => None,
    };
    let mut cond = match inputs[1] {
        Some(c) => truth(c, "the condition")?,
        None => true,
    };
    let rest = owned(&inputs[2..], "loop-carried value or capture")?;
    let (mut carried, captures) = (rest[..p.carried].to_vec(), &rest[p.carried..]);
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); p.scan_outputs];
    let mut scan_bytes = 0usize;
    let mut i: u64 = 0;
    while cond && trip.is_none_or(|m| i < m) {
        if i >= MAX_LOOP_ITERATIONS {
            return Err(format!(
                "the loop ran {MAX_LOOP_ITERATIONS} iterations without stopping (trip count {}); xpu stops loops there",
                trip.map_or("none".to_string(), |m| m.to_string())
            ));
        }
        stop.check(|| format!("loop iteration {i}")).map_err(|e| e.to_string())?;
        let mut args = Vec::with_capacity(2 + rest.len());
        args.push(Tensor::scalar(i as i64));
        args.push(Tensor::scalar(cond));
        args.extend(carried.iter().cloned());
        args.extend(captures.iter().cloned());
        let mut out = body.run(&args, stop)?.into_iter();
        cond = truth(&out.next().ok_or("`body` gave no condition")?, "`body`'s condition")?;
        carried = out.by_ref().take(p.carried).collect();
        for (k, t) in out.enumerate() {
            scan_bytes += t.size_bytes();
            if scan_bytes > MAX_SCAN_OUTPUT_BYTES {
                return Err(format!(
                    "the loop's scan outputs passed {} GiB at iteration {i}",
                    MAX_SCAN_OUTPUT_BYTES >> 30
                ));
            }
            scans[k].push(t);
        }
        i += 1;
    }
    let slice_types: Vec<xpu_ir::TensorType> = body_graph.outputs[1 + p.carried..]
        .iter()
        .map(|o| body_graph.ty(o.value).clone())
        .collect();
    let mut outs = carried;
    for (slices, ty) in scans.into_iter().zip(&slice_types) {
        outs.push(stack(slices, ty, 0)?);
    }
    Ok(outs)
}

fn run_scan(
    node: &Node,
    inputs: &[Option<&Tensor>],
    p: ScanParts,
    stop: &StopToken,
) -> KResult<Vec<Tensor>> {
    let body_graph = graph(node, "body")?;
    let mut body = Sub::new(body_graph, "body")?;
    let all = owned(inputs, "input")?;
    let (mut state, rest) = (all[..p.states].to_vec(), &all[p.states..]);
    let (scan_inputs, captures) = rest.split_at(p.scan_inputs);
    let in_axes = control::per_scan(&node.attrs, "scan_input_axes", p.scan_inputs)?;
    let in_dirs = control::per_scan(&node.attrs, "scan_input_directions", p.scan_inputs)?;
    let out_axes = control::per_scan(&node.attrs, "scan_output_axes", p.scan_outputs)?;
    let out_dirs = control::per_scan(&node.attrs, "scan_output_directions", p.scan_outputs)?;
    let mut axes = Vec::with_capacity(p.scan_inputs);
    let mut length = None;
    for (j, t) in scan_inputs.iter().enumerate() {
        let a =
            control::scan_axis(in_axes[j], t.rank()).map_err(|m| format!("scan input {j}: {m}"))?;
        let n = t.shape()[a];
        if length.is_some_and(|l| l != n) {
            return Err(format!(
                "scan input {j} has {n} slices along axis {a}; scan input 0 has {}",
                length.unwrap_or(0)
            ));
        }
        length = Some(n);
        axes.push(a);
    }
    let length = length.unwrap_or(0);
    if length as u64 > MAX_LOOP_ITERATIONS {
        return Err(format!("the scan has {length} slices; xpu stops at {MAX_LOOP_ITERATIONS}"));
    }
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); p.scan_outputs];
    for t in 0..length {
        stop.check(|| format!("scan slice {t}")).map_err(|e| e.to_string())?;
        let mut args = state.clone();
        for (j, x) in scan_inputs.iter().enumerate() {
            let at = if in_dirs[j] == 1 { length - 1 - t } else { t };
            args.push(crate::movement::index_axis(x, axes[j], at)?);
        }
        args.extend(captures.iter().cloned());
        let mut out = body.run(&args, stop)?.into_iter();
        state = out.by_ref().take(p.states).collect();
        for (k, slice) in out.enumerate() {
            scans[k].push(slice);
        }
    }
    let mut outs = state;
    for (k, mut slices) in scans.into_iter().enumerate() {
        if out_dirs[k] == 1 {
            slices.reverse();
        }
        let ty = body_graph.ty(body_graph.outputs[p.states + k].value);
        let rank = slices.first().map_or(ty.rank().unwrap_or(0), Tensor::rank);
        let axis = control::scan_axis(out_axes[k], rank + 1)
            .map_err(|m| format!("scan output {k}: {m}"))?;
        outs.push(stack(slices, ty, axis)?);
    }
    Ok(outs)
}
