//! Control flow (`if`, `loop`, `scan`): how a node's inputs and outputs split into the parts
//! its subgraphs see, the subgraph signatures the verifier checks, and the output types.
//!
//! Subgraphs are closed. An outer value a subgraph reads is handed to it explicitly: it is one
//! of the node's last `captures` inputs (for `if`, every input after the condition), and the
//! subgraph receives the captures, in the same order, as its last inputs. ONNX subgraphs name
//! outer values directly; the importer turns each such name into a capture.

use crate::{Attrs, DType, Dim, Graph, Node, Op, TensorType};

/// How deep subgraphs may nest (a loop in a branch in a loop …): the parser, the importer and
/// the verifier refuse deeper graphs rather than recurse without bound.
pub const MAX_SUBGRAPH_DEPTH: usize = 32;

/// A loop node's parts: inputs `[M, cond, carried…, captures…]`, outputs
/// `[carried…, scan outputs…]`; its body takes `[i, cond, carried…, captures…]` and gives
/// `[cond, carried…, scan slices…]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopParts {
    pub carried: usize,
    pub captures: usize,
    pub scan_outputs: usize,
}

/// A scan node's parts: inputs `[state…, scan inputs…, captures…]`, outputs
/// `[state…, scan outputs…]`; its body takes `[state…, slices…, captures…]` and gives
/// `[state…, output slices…]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanParts {
    pub states: usize,
    pub scan_inputs: usize,
    pub captures: usize,
    pub scan_outputs: usize,
}

fn captures(attrs: &Attrs, available: usize) -> Result<usize, String> {
    let c = attrs.int("captures", 0);
    usize::try_from(c)
        .ok()
        .filter(|&c| c <= available)
        .ok_or_else(|| format!("`captures` = {c}, but only {available} inputs can be captures"))
}

pub fn loop_parts(attrs: &Attrs, n_inputs: usize, n_outputs: usize) -> Result<LoopParts, String> {
    if n_inputs < 2 {
        return Err("takes M and cond first (either may be omitted, `_`)".into());
    }
    let captures = captures(attrs, n_inputs - 2)?;
    let carried = n_inputs - 2 - captures;
    let scan_outputs = n_outputs.checked_sub(carried).ok_or_else(|| {
        format!("has {n_outputs} outputs, fewer than its {carried} loop-carried values")
    })?;
    Ok(LoopParts { carried, captures, scan_outputs })
}

pub fn scan_parts(attrs: &Attrs, n_inputs: usize, n_outputs: usize) -> Result<ScanParts, String> {
    let m = attrs.int("num_scan_inputs", 0);
    let scan_inputs = usize::try_from(m)
        .ok()
        .filter(|&m| (1..=n_inputs).contains(&m))
        .ok_or_else(|| format!("`num_scan_inputs` = {m}: must be 1 to {n_inputs}"))?;
    let captures = captures(attrs, n_inputs - scan_inputs)?;
    let states = n_inputs - scan_inputs - captures;
    let scan_outputs = n_outputs
        .checked_sub(states)
        .ok_or_else(|| format!("has {n_outputs} outputs, fewer than its {states} state values"))?;
    Ok(ScanParts { states, scan_inputs, captures, scan_outputs })
}

/// One per scan input (or output): `attr`'s entries, 0 where the attribute is absent.
pub fn per_scan(attrs: &Attrs, attr: &str, n: usize) -> Result<Vec<i64>, String> {
    match attrs.ints(attr) {
        None => Ok(vec![0; n]),
        Some(v) if v.len() == n => Ok(v.to_vec()),
        Some(v) => Err(format!("`{attr}` has {} entries for {n} values", v.len())),
    }
}

/// `axis` (negative counts from the end) in `0..rank`.
pub fn scan_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) { Ok(a as usize) } else { Err(format!("axis {axis} for rank {rank}")) }
}

/// How many of `node`'s last inputs are captures: every input after the condition of an
/// `if`, `captures` of a `loop` or `scan`, none for other ops.
pub fn capture_count(node: &Node) -> usize {
    match node.op {
        Op::If => node.inputs.len().saturating_sub(1),
        Op::Loop | Op::Scan => {
            (node.attrs.int("captures", 0).max(0) as usize).min(node.inputs.len())
        }
        _ => 0,
    }
}

/// The type of one slice of a scan input of type `t` along `axis`: that axis removed.
pub fn slice_type(t: &TensorType, axis: i64) -> Result<TensorType, String> {
    let dims = match &t.dims {
        Some(dims) => {
            let mut d = dims.clone();
            d.remove(scan_axis(axis, dims.len())?);
            Some(d)
        }
        None => None,
    };
    Ok(TensorType { dtype: t.dtype, dims })
}

/// The type of slices of type `slice` stacked along `axis` (of the result) into `length`.
fn stacked_type(slice: &TensorType, axis: i64, length: Dim) -> Result<TensorType, String> {
    let dims = match &slice.dims {
        Some(d) => {
            let mut dims = d.clone();
            dims.insert(scan_axis(axis, d.len() + 1)?, length);
            Some(dims)
        }
        None => None,
    };
    Ok(TensorType { dtype: slice.dtype, dims })
}

/// The type two branches' (or iterations') values share: the dtype must agree; dims that
/// differ become unknown, ranks that differ an unknown rank.
fn merge(a: &TensorType, b: &TensorType, what: &str) -> Result<TensorType, String> {
    if a.dtype != b.dtype {
        return Err(format!("{what} is {} in one place and {} in the other", a.dtype, b.dtype));
    }
    let dims = match (&a.dims, &b.dims) {
        (Some(x), Some(y)) if x.len() == y.len() => Some(
            x.iter().zip(y).map(|(p, q)| if p == q { p.clone() } else { Dim::Unknown }).collect(),
        ),
        _ => None,
    };
    Ok(TensorType { dtype: a.dtype, dims })
}

fn one_element(t: &TensorType, dtype: DType, what: &str) -> Result<(), String> {
    if t.dtype != dtype {
        return Err(format!("{what} must be {dtype}, got {t}"));
    }
    if t.numel().is_some_and(|n| n != 1) {
        return Err(format!("{what} must have one element, got {t}"));
    }
    Ok(())
}

fn subgraph<'a>(attrs: &'a Attrs, name: &str) -> Result<&'a Graph, String> {
    attrs.graph(name).ok_or_else(|| format!("attribute `{name}` (a graph) is required"))
}

/// Checks that `g`'s inputs take `given` (by dtype, and by dims where `exact`), in order.
fn check_inputs(
    g: &Graph,
    name: &str,
    given: &[&TensorType],
    exact: impl Fn(usize) -> bool,
) -> Result<(), String> {
    if g.inputs.len() != given.len() {
        return Err(format!(
            "`{name}` takes {} inputs; it is given {}",
            g.inputs.len(),
            given.len()
        ));
    }
    for (i, (&v, t)) in g.inputs.iter().zip(given).enumerate() {
        let declared = g.ty(v);
        let fits = if exact(i) { declared.compatible(t) } else { declared.dtype == t.dtype };
        if !fits {
            return Err(format!("`{name}` input {i} is declared {declared} but is given {t}"));
        }
    }
    Ok(())
}

fn output_types(g: &Graph) -> Vec<TensorType> {
    g.outputs.iter().map(|o| g.ty(o.value).clone()).collect()
}

fn present<'a>(
    inputs: &[Option<&'a TensorType>],
    what: &str,
) -> Result<Vec<&'a TensorType>, String> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| format!("{what} {i} is omitted")))
        .collect()
}

/// Checks a control-flow node's subgraph signatures against its input types and gives its
/// output types.
pub fn infer(
    op: Op,
    attrs: &Attrs,
    inputs: &[Option<&TensorType>],
    n_outputs: usize,
) -> Result<Vec<TensorType>, String> {
    match op {
        Op::If => infer_if(attrs, inputs, n_outputs),
        Op::Loop => infer_loop(attrs, inputs, n_outputs),
        Op::Scan => infer_scan(attrs, inputs, n_outputs),
        _ => Err(format!("{op} is not a control-flow op")),
    }
}

fn infer_if(
    attrs: &Attrs,
    inputs: &[Option<&TensorType>],
    n_outputs: usize,
) -> Result<Vec<TensorType>, String> {
    let cond = inputs.first().copied().flatten().ok_or("the condition is omitted")?;
    one_element(cond, DType::Bool, "the condition")?;
    let captures = present(&inputs[1..], "capture")?;
    let mut branches = Vec::new();
    for name in ["then_branch", "else_branch"] {
        let g = subgraph(attrs, name)?;
        check_inputs(g, name, &captures, |_| true)?;
        if g.outputs.len() != n_outputs {
            return Err(format!("`{name}` gives {} outputs for {n_outputs}", g.outputs.len()));
        }
        branches.push(output_types(g));
    }
    (0..n_outputs)
        .map(|i| merge(&branches[0][i], &branches[1][i], &format!("output {i}")))
        .collect()
}

fn infer_loop(
    attrs: &Attrs,
    inputs: &[Option<&TensorType>],
    n_outputs: usize,
) -> Result<Vec<TensorType>, String> {
    let p = loop_parts(attrs, inputs.len(), n_outputs)?;
    if let Some(m) = inputs[0] {
        one_element(m, DType::I64, "the trip count M")?;
    }
    if let Some(c) = inputs[1] {
        one_element(c, DType::Bool, "the condition")?;
    }
    let rest = present(&inputs[2..], "loop-carried value or capture")?;
    let body = subgraph(attrs, "body")?;
    let (i64_scalar, bool_scalar) =
        (TensorType::new(DType::I64, vec![]), TensorType::new(DType::Bool, vec![]));
    let given: Vec<&TensorType> = [&i64_scalar, &bool_scalar].into_iter().chain(rest).collect();
    // A loop-carried value may change its shape from one iteration to the next.
    check_inputs(body, "body", &given, |i| i >= 2 + p.carried)?;
    let outs = output_types(body);
    if outs.len() != 1 + p.carried + p.scan_outputs {
        return Err(format!(
            "`body` gives {} outputs; the loop needs 1 + {} carried + {} scan outputs",
            outs.len(),
            p.carried,
            p.scan_outputs
        ));
    }
    if outs[0].dtype != DType::Bool {
        return Err(format!("`body` output 0 (the condition) is {}, not bool", outs[0]));
    }
    let mut types = Vec::with_capacity(n_outputs);
    for k in 0..p.carried {
        types.push(merge(given[2 + k], &outs[1 + k], &format!("loop-carried value {k}"))?);
    }
    for slice in &outs[1 + p.carried..] {
        types.push(stacked_type(slice, 0, Dim::Unknown)?);
    }
    Ok(types)
}

fn infer_scan(
    attrs: &Attrs,
    inputs: &[Option<&TensorType>],
    n_outputs: usize,
) -> Result<Vec<TensorType>, String> {
    let p = scan_parts(attrs, inputs.len(), n_outputs)?;
    let given = present(inputs, "input")?;
    let in_axes = per_scan(attrs, "scan_input_axes", p.scan_inputs)?;
    let out_axes = per_scan(attrs, "scan_output_axes", p.scan_outputs)?;
    for attr in ["scan_input_directions", "scan_output_directions"] {
        let n = if attr.starts_with("scan_input") { p.scan_inputs } else { p.scan_outputs };
        if let Some(d) = per_scan(attrs, attr, n)?.iter().find(|d| !matches!(d, 0 | 1)) {
            return Err(format!("`{attr}` has {d}: each is 0 (forward) or 1 (reverse)"));
        }
    }
    let mut slices = Vec::with_capacity(p.scan_inputs);
    let mut length = Dim::Unknown;
    for (j, &axis) in in_axes.iter().enumerate() {
        let t = given[p.states + j];
        slices.push(slice_type(t, axis).map_err(|m| format!("scan input {j}: {m}"))?);
        if let (0, Some(dims)) = (j, &t.dims) {
            length = dims[scan_axis(axis, dims.len())?].clone();
        }
    }
    let body = subgraph(attrs, "body")?;
    let body_given: Vec<&TensorType> = given[..p.states]
        .iter()
        .copied()
        .chain(slices.iter())
        .chain(given[p.states + p.scan_inputs..].iter().copied())
        .collect();
    check_inputs(body, "body", &body_given, |_| true)?;
    let outs = output_types(body);
    if outs.len() != n_outputs {
        return Err(format!("`body` gives {} outputs for the scan's {n_outputs}", outs.len()));
    }
    let mut types = Vec::with_capacity(n_outputs);
    for (k, out) in outs.iter().enumerate().take(p.states) {
        types.push(merge(given[k], out, &format!("state value {k}"))?);
    }
    for (k, slice) in outs[p.states..].iter().enumerate() {
        let t = stacked_type(slice, out_axes[k], length.clone())
            .map_err(|m| format!("scan output {k}: {m}"))?;
        types.push(t);
    }
    Ok(types)
}
