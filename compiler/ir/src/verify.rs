//! The verifier: structural and type rules every graph must satisfy between passes.

use std::fmt;

use crate::{Graph, NodeId, ValueDef, ValueId};

/// The rule a graph breaks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A use refers to a value that does not exist or is defined later (cycle or bad order).
    DefinedBeforeUse,
    /// A value's recorded definition disagrees with the node or input that defines it.
    SingleAssignment,
    /// Input or output count outside the op's arity.
    Arity,
    /// An attribute the op does not have, or of the wrong kind.
    Attribute,
    /// Declared output types disagree with inference, or inputs break the op's type rules.
    Types,
    /// Graph outputs must name existing values, with unique names.
    Outputs,
    /// A subgraph of a control-flow node breaks a rule (or nests too deep).
    Subgraph,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::DefinedBeforeUse => "defined-before-use",
            Rule::SingleAssignment => "single-assignment",
            Rule::Arity => "arity",
            Rule::Attribute => "attribute",
            Rule::Types => "types",
            Rule::Outputs => "outputs",
            Rule::Subgraph => "subgraph",
        })
    }
}

/// A broken rule, naming the node (when there is one) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}[{rule}] {message}", .node.as_ref().map(|n| format!("{n}: ")).unwrap_or_default())]
pub struct VerifyError {
    /// Label of the offending node, e.g. `n3 (matmul "fc1")`.
    pub node: Option<String>,
    pub rule: Rule,
    pub message: String,
}

/// Checks every rule; returns all violations found (empty when the graph is valid).
pub fn verify(g: &Graph) -> Result<(), Vec<VerifyError>> {
    verify_at(g, 0)
}

/// `verify` of a graph nested `depth` subgraphs deep.
fn verify_at(g: &Graph, depth: usize) -> Result<(), Vec<VerifyError>> {
    let mut errs = Vec::new();
    let mut defined = vec![false; g.values.len()];
    let err = |errs: &mut Vec<VerifyError>, node: Option<NodeId>, rule, message: String| {
        errs.push(VerifyError { node: node.map(|n| g.node(n).label(n)), rule, message });
    };
    for (i, &v) in g.inputs.iter().enumerate() {
        if v.index() >= g.values.len() {
            err(
                &mut errs,
                None,
                Rule::DefinedBeforeUse,
                format!("graph input {i} is {v}, which does not exist"),
            );
            continue;
        }
        if g.value(v).def != ValueDef::Input(i as u32) {
            err(
                &mut errs,
                None,
                Rule::SingleAssignment,
                format!("{v} is graph input {i} but records {:?}", g.value(v).def),
            );
        }
        defined[v.index()] = true;
    }
    for id in g.node_ids() {
        let n = g.node(id);
        let info = n.op.info();
        let mut ok = true;
        for v in n.input_values() {
            if v.index() >= g.values.len() || !defined[v.index()] {
                err(
                    &mut errs,
                    Some(id),
                    Rule::DefinedBeforeUse,
                    format!("uses {v} before it is defined"),
                );
                ok = false;
            }
        }
        if n.inputs.len() < info.inputs.0 || n.inputs.len() > info.inputs.1 {
            err(
                &mut errs,
                Some(id),
                Rule::Arity,
                format!(
                    "has {} inputs; {} takes {}..={}",
                    n.inputs.len(),
                    n.op,
                    info.inputs.0,
                    info.inputs.1.min(9999)
                ),
            );
            ok = false;
        }
        // A loop's trip count and condition (its first two inputs) may be omitted.
        let required = if n.op == crate::Op::Loop { 0 } else { info.inputs.0 };
        for i in 0..required.min(n.inputs.len()) {
            if n.inputs[i].is_none() {
                err(&mut errs, Some(id), Rule::Arity, format!("required input {i} is omitted"));
                ok = false;
            }
        }
        for (k, a) in n.attrs.iter() {
            match info.attrs.iter().find(|(name, _)| name == k) {
                // An opaque ONNX node carries the node's own attributes besides its schema's.
                None if n.op == crate::Op::OnnxOp => {}
                None => err(
                    &mut errs,
                    Some(id),
                    Rule::Attribute,
                    format!(
                        "{} has no attribute `{k}` (it has: {})",
                        n.op,
                        info.attrs.iter().map(|a| a.0).collect::<Vec<_>>().join(", ")
                    ),
                ),
                Some((_, kind)) if !a.fits(*kind) => err(
                    &mut errs,
                    Some(id),
                    Rule::Attribute,
                    format!("attribute `{k}` must be {}, got {}", kind.name(), a.kind().name()),
                ),
                _ => {}
            }
        }
        for (i, &o) in n.outputs.iter().enumerate() {
            if o.index() >= g.values.len() {
                err(
                    &mut errs,
                    Some(id),
                    Rule::SingleAssignment,
                    format!("output {i} is {o}, which does not exist"),
                );
                ok = false;
                continue;
            }
            if defined[o.index()]
                || g.value(o).def != (ValueDef::Node { node: id, index: i as u32 })
            {
                err(
                    &mut errs,
                    Some(id),
                    Rule::SingleAssignment,
                    format!("output {o} is defined more than once or records another definition"),
                );
                ok = false;
            }
            defined[o.index()] = true;
        }
        for (name, sub) in n.attrs.graphs() {
            let nested = if depth >= crate::control::MAX_SUBGRAPH_DEPTH {
                Err(vec![VerifyError {
                    node: None,
                    rule: Rule::Subgraph,
                    message: format!(
                        "subgraphs nest more than {} deep",
                        crate::control::MAX_SUBGRAPH_DEPTH
                    ),
                }])
            } else {
                verify_at(sub, depth + 1)
            };
            for e in nested.err().into_iter().flatten() {
                let inner = e.node.map(|l| format!("{l}: ")).unwrap_or_default();
                err(
                    &mut errs,
                    Some(id),
                    Rule::Subgraph,
                    format!("in `{name}`: {inner}[{}] {}", e.rule, e.message),
                );
                ok = false;
            }
        }
        // Nothing in xpu can infer an opaque node's types: they are the model's declaration.
        if !ok || n.op == crate::Op::OnnxOp {
            continue;
        }
        match g.infer_node_types(n.op, &n.inputs, &n.attrs, n.outputs.len()) {
            Err(e) => err(&mut errs, Some(id), Rule::Types, e.message),
            Ok(tys) => {
                for (o, inferred) in n.outputs.iter().zip(tys) {
                    let declared = g.ty(*o);
                    if !declared.compatible(&inferred) {
                        err(
                            &mut errs,
                            Some(id),
                            Rule::Types,
                            format!("{o} is declared {declared} but the op produces {inferred}"),
                        );
                    }
                }
            }
        }
    }
    for (i, &is_defined) in defined.iter().enumerate() {
        if !is_defined {
            err(
                &mut errs,
                None,
                Rule::SingleAssignment,
                format!("{} has no definition", ValueId(i as u32)),
            );
        }
    }
    let mut names = std::collections::HashSet::new();
    for o in &g.outputs {
        if o.value.index() >= g.values.len() || !defined[o.value.index()] {
            err(
                &mut errs,
                None,
                Rule::Outputs,
                format!("output {:?} refers to {}, which is not defined", o.name, o.value),
            );
        }
        if !names.insert(&o.name) {
            err(&mut errs, None, Rule::Outputs, format!("output name {:?} is used twice", o.name));
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}
