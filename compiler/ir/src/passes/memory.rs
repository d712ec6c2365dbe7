//! Liveness and the memory plan.
//!
//! Values get buffers in node order. A value's buffer returns to the free list after its last
//! use (move semantics). Graph inputs belong to the caller: they stay live for the whole run
//! and are never written over nor reused. An elementwise node whose operand dies at that node and has the
//! output's byte size writes in place into the operand's buffer; when the operand stays live
//! the node needs an explicit copy (the plan records it). Otherwise the best-fitting free
//! buffer is reused, or a new one is allocated. Constants live in the graph, not in the arena.

use std::collections::BTreeMap;
use std::fmt;

use crate::{Dim, Graph, Op, ValueId};

/// How a value obtained its buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BufferUse {
    /// A graph input, provided by the caller.
    Input,
    /// A new buffer.
    Fresh,
    /// A free buffer another, dead value held.
    Reused { previous: ValueId },
    /// Written in place over an operand that dies at this node.
    InPlace { operand: ValueId },
    /// An in-place op whose operand stays live: it is copied first.
    Copy { operand: ValueId },
    /// A constant stored in the graph.
    Constant,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValuePlacement {
    pub value: ValueId,
    /// Arena buffer index (`None` for constants).
    pub buffer: Option<usize>,
    pub bytes: u64,
    pub how: BufferUse,
    /// Index of the node defining it (`None` for inputs) and of its last use.
    pub defined_at: Option<usize>,
    pub last_use: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MemoryPlan {
    pub placements: Vec<ValuePlacement>,
    /// Size of every arena buffer.
    pub buffers: Vec<u64>,
    /// Largest sum of live value bytes at any node.
    pub peak_live_bytes: u64,
    /// Arena size: the sum of all buffers.
    pub arena_bytes: u64,
    pub constant_bytes: u64,
    /// Values whose size depends on an unbound symbol or unknown dim (counted as 0).
    pub unsized_values: Vec<ValueId>,
}

impl MemoryPlan {
    pub fn copies(&self) -> usize {
        self.placements.iter().filter(|p| matches!(p.how, BufferUse::Copy { .. })).count()
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.placements {
            let buf = p.buffer.map(|b| format!("buf{b}")).unwrap_or_else(|| "const".into());
            let how = match &p.how {
                BufferUse::Input => "input".to_string(),
                BufferUse::Fresh => "fresh".to_string(),
                BufferUse::Reused { previous } => format!("reuse({previous})"),
                BufferUse::InPlace { operand } => format!("in-place({operand})"),
                BufferUse::Copy { operand } => format!("copy({operand})"),
                BufferUse::Constant => "constant".to_string(),
            };
            let last = p.last_use.map(|n| format!("n{n}")).unwrap_or_else(|| "end".into());
            writeln!(f, "{}: {buf} {how} {} bytes, live until {last}", p.value, p.bytes)?;
        }
        write!(
            f,
            "peak {} bytes live, arena {} bytes in {} buffers, constants {} bytes, {} copies",
            self.peak_live_bytes,
            self.arena_bytes,
            self.buffers.len(),
            self.constant_bytes,
            self.copies()
        )?;
        if !self.unsized_values.is_empty() {
            write!(f, ", {} values of unknown size", self.unsized_values.len())?;
        }
        writeln!(f)
    }
}

/// Size of a value in bytes with symbols bound by `bindings`.
pub fn value_bytes(g: &Graph, v: ValueId, bindings: &BTreeMap<String, u64>) -> Option<u64> {
    let ty = g.ty(v);
    let mut n = ty.dtype.size_bytes() as u64;
    for d in ty.dims.as_ref()? {
        n *= match d {
            Dim::Known(k) => *k,
            Dim::Sym(s) => *bindings.get(s)?,
            Dim::Unknown => return None,
        };
    }
    Some(n)
}

pub fn plan_memory(g: &Graph, bindings: &BTreeMap<String, u64>) -> MemoryPlan {
    const END: usize = usize::MAX;
    let mut last_use: Vec<Option<usize>> = vec![None; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for v in n.input_values() {
            last_use[v.index()] = Some(i);
        }
    }
    for o in &g.outputs {
        last_use[o.value.index()] = Some(END);
    }
    let mut plan = MemoryPlan::default();
    let mut bytes = vec![0u64; g.values.len()];
    let mut buffer_of: Vec<Option<usize>> = vec![None; g.values.len()];
    let mut free: Vec<(usize, ValueId)> = Vec::new(); // (buffer, last holder)
    let mut live_bytes = 0u64;
    let size_of = |v: ValueId, plan: &mut MemoryPlan| match value_bytes(g, v, bindings) {
        Some(b) => b,
        None => {
            plan.unsized_values.push(v);
            0
        }
    };
    let place =
        |plan: &mut MemoryPlan, v: ValueId, buffer, bytes, how, defined_at, last: Option<usize>| {
            plan.placements.push(ValuePlacement {
                value: v,
                buffer,
                bytes,
                how,
                defined_at,
                last_use: last.filter(|&l| l != END),
            });
        };
    for &v in &g.inputs {
        let b = size_of(v, &mut plan);
        bytes[v.index()] = b;
        let buf = plan.buffers.len();
        plan.buffers.push(b);
        buffer_of[v.index()] = Some(buf);
        live_bytes += b;
        place(&mut plan, v, Some(buf), b, BufferUse::Input, None, last_use[v.index()]);
    }
    let mut input_flags = vec![false; g.values.len()];
    g.inputs.iter().for_each(|v| input_flags[v.index()] = true);
    let is_input = |x: ValueId| input_flags[x.index()];
    plan.peak_live_bytes = live_bytes;
    for (i, n) in g.nodes.iter().enumerate() {
        if n.op == Op::Constant {
            let o = n.outputs[0];
            let b = size_of(o, &mut plan);
            plan.constant_bytes += b;
            place(&mut plan, o, None, b, BufferUse::Constant, Some(i), last_use[o.index()]);
            continue;
        }
        let mut taken_in_place = Vec::new();
        for &o in &n.outputs {
            let b = size_of(o, &mut plan);
            bytes[o.index()] = b;
            let mut how = None;
            if n.op.is_elementwise() {
                let candidates = n.input_values().filter(|x| {
                    buffer_of[x.index()].is_some()
                        && !is_input(*x)
                        && bytes[x.index()] == b
                        && !taken_in_place.contains(x)
                });
                let mut copy_from = None;
                for x in candidates {
                    if last_use[x.index()] == Some(i) {
                        how = Some((
                            buffer_of[x.index()].unwrap(),
                            BufferUse::InPlace { operand: x },
                        ));
                        taken_in_place.push(x);
                        break;
                    }
                    copy_from.get_or_insert(x);
                }
                if how.is_none()
                    && let Some(x) = copy_from
                {
                    how = Some((usize::MAX, BufferUse::Copy { operand: x }));
                }
            }
            let (buf, how) = match how {
                Some((buf, h @ BufferUse::InPlace { .. })) => (buf, h),
                other => {
                    // Best fit among free buffers at least as large; else a new buffer.
                    let best = free
                        .iter()
                        .enumerate()
                        .filter(|(_, (fb, _))| plan.buffers[*fb] >= b)
                        .min_by_key(|(_, (fb, _))| plan.buffers[*fb]);
                    let (buf, reuse) = match best {
                        Some((k, &(fb, prev))) => {
                            free.remove(k);
                            (fb, Some(prev))
                        }
                        None => {
                            plan.buffers.push(b);
                            (plan.buffers.len() - 1, None)
                        }
                    };
                    let how = match (other, reuse) {
                        (Some((_, h @ BufferUse::Copy { .. })), _) => h,
                        (_, Some(prev)) => BufferUse::Reused { previous: prev },
                        (_, None) => BufferUse::Fresh,
                    };
                    live_bytes += b;
                    (buf, how)
                }
            };
            buffer_of[o.index()] = Some(buf);
            place(&mut plan, o, Some(buf), b, how, Some(i), last_use[o.index()]);
        }
        plan.peak_live_bytes = plan.peak_live_bytes.max(live_bytes);
        // Operands dying here release their buffers, unless an output took them over in
        // place (then the bytes stay live under the output's name).
        // A node reads few values: a list finds a repeated operand faster than a set.
        let mut released: Vec<ValueId> = Vec::new();
        for x in n.input_values() {
            let dies = last_use[x.index()] == Some(i)
                && !taken_in_place.contains(&x)
                && !is_input(x)
                && !released.contains(&x);
            if !dies {
                continue;
            }
            released.push(x);
            if let Some(buf) = buffer_of[x.index()] {
                live_bytes -= bytes[x.index()];
                free.push((buf, x));
            }
        }
        for &o in &n.outputs {
            if last_use[o.index()].is_none() {
                live_bytes -= bytes[o.index()];
                free.push((buffer_of[o.index()].unwrap(), o));
            }
        }
    }
    plan.arena_bytes = plan.buffers.iter().sum();
    plan
}
