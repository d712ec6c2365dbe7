//! Checks a frozen plan before anything runs it. A plan file is user input: it may be hand
//! edited, truncated by a copy or made by another version. GraphExec indexes placements,
//! partitions and values by the ids a plan holds, so every id is checked to be in range,
//! every cross-reference to agree, every engine and kernel to be one xpu knows, and the
//! graphs to be the ones the hashes say — each failure named by its field.

use std::collections::BTreeSet;

use xpu_engine::{TransferDirection, catalog};
use xpu_ir::{Graph, NodeId};

use crate::model::{CapturePlan, FrozenPlan};

/// What is wrong with a frozen plan: the field (`plan.partitions[0].nodes[2]`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PlanFileError {
    pub field: String,
    pub message: String,
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> PlanFileError {
    PlanFileError { field: field.into(), message: message.into() }
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl FrozenPlan {
    /// Checks the plan against the program it is to run (`source`, whose content hash is
    /// `source_hash`) and against itself. The plan's passes are re-run over `source`
    /// (constants folded through `eval`, as when it was planned) to rebuild the graph the
    /// plan must match.
    pub fn validate(
        &self,
        source: &Graph,
        source_hash: &str,
        eval: Option<&dyn xpu_ir::passes::Evaluator>,
    ) -> Result<(), PlanFileError> {
        let plan = &self.plan;
        for (i, pass) in plan.passes.iter().enumerate() {
            if !xpu_ir::passes::PASS_NAMES.contains(&pass.as_str()) {
                return Err(bad(
                    format!("plan.passes[{i}]"),
                    format!(
                        "unknown pass {:?} (known: {})",
                        pass.chars().take(40).collect::<String>(),
                        xpu_ir::passes::PASS_NAMES.join(", ")
                    ),
                ));
            }
        }
        let names: Vec<&str> = plan.passes.iter().map(String::as_str).collect();
        let rewritten = crate::passes::optimize(source, &names, eval).0;
        let source = rewritten.as_ref().unwrap_or(source);
        for (field, hash) in [
            ("plan.source_graph_hash", &plan.source_graph_hash),
            ("explanation.graph_hash", &self.explanation.graph_hash),
        ] {
            if !is_sha256_hex(hash) {
                return Err(bad(field, "not a SHA-256 in hex (64 characters 0-9a-f)"));
            }
        }
        if plan.source_graph_hash != self.explanation.graph_hash {
            return Err(bad("explanation.graph_hash", "differs from plan.source_graph_hash"));
        }
        if plan.source_graph_hash != source_hash {
            return Err(bad(
                "plan.source_graph_hash",
                format!(
                    "the plan was made for graph {} ({}), not this program ({})",
                    self.explanation.graph_name,
                    &plan.source_graph_hash[..12],
                    &source_hash[..source_hash.len().min(12)]
                ),
            ));
        }
        xpu_ir::verify(&plan.graph).map_err(|errors| {
            let first = errors.first().map(ToString::to_string).unwrap_or_default();
            bad(
                "plan.graph",
                format!("does not verify ({} error(s)); first: {first}", errors.len()),
            )
        })?;
        check_transfers_and_casts(plan, source)?;
        check_graph_matches_source(plan, source)?;
        check_placements(plan, source)?;
        check_partitions(plan)?;
        for (i, d) in self.explanation.decisions.iter().enumerate() {
            if d.node.index() >= source.nodes.len() {
                return Err(bad(
                    format!("explanation.decisions[{i}].node"),
                    format!(
                        "{} is not a node of the program ({} nodes)",
                        d.node,
                        source.nodes.len()
                    ),
                ));
            }
        }
        if plan.execution.threads == Some(0) {
            return Err(bad("plan.execution.threads", "0 threads cannot run anything"));
        }
        Ok(())
    }
}

/// The planned graph is the program's graph, with the plan's casts inserted: without
/// casts the hashes agree, with casts the other nodes are the program's, in order.
fn check_graph_matches_source(plan: &CapturePlan, source: &Graph) -> Result<(), PlanFileError> {
    // Casts the planner inserted, and constants it converted (new nodes too).
    let inserted: BTreeSet<NodeId> = plan.casts.iter().map(|c| c.node).collect();
    if inserted.is_empty() && plan.graph.nodes.len() == source.nodes.len() {
        if plan.graph.content_hash() != source.content_hash() {
            return Err(bad(
                "plan.graph",
                "differs from the program's graph (its hash does not match)",
            ));
        }
        return Ok(());
    }
    let kept: Vec<&str> = plan
        .graph
        .node_ids()
        .filter(|id| !inserted.contains(id))
        .map(|id| plan.graph.node(id).op.name())
        .collect();
    let want: Vec<&str> = source.node_ids().map(|id| source.node(id).op.name()).collect();
    if kept.len() != want.len() {
        return Err(bad(
            "plan.graph",
            format!(
                "has {} nodes besides the plan's casts; the program has {}",
                kept.len(),
                want.len()
            ),
        ));
    }
    if let Some(i) = kept.iter().zip(&want).position(|(a, b)| a != b) {
        return Err(bad(
            "plan.graph",
            format!("node {i} of the program is {} but the plan has {} there", want[i], kept[i]),
        ));
    }
    Ok(())
}

fn check_placements(plan: &CapturePlan, source: &Graph) -> Result<(), PlanFileError> {
    let g = &plan.graph;
    if plan.placements.len() != g.nodes.len() {
        return Err(bad(
            "plan.placements",
            format!("{} placements for {} nodes", plan.placements.len(), g.nodes.len()),
        ));
    }
    for (i, p) in plan.placements.iter().enumerate() {
        let field = |f: &str| format!("plan.placements[{i}].{f}");
        if p.node.index() != i {
            return Err(bad(field("node"), format!("{} where n{i} belongs", p.node)));
        }
        let op = g.node(p.node).op;
        if p.op != op.name() {
            return Err(bad(field("op"), format!("{:?}, but the node is {}", p.op, op.name())));
        }
        if let Some(s) = p.source
            && s.index() >= source.nodes.len()
        {
            return Err(bad(
                field("source"),
                format!("{s} is not a node of the program ({} nodes)", source.nodes.len()),
            ));
        }
        if p.partition >= plan.partitions.len() {
            return Err(bad(
                field("partition"),
                format!(
                    "{} is not a partition (the plan has {})",
                    p.partition,
                    plan.partitions.len()
                ),
            ));
        }
        let Some(known) = catalog::engine(&p.engine) else {
            return Err(bad(field("engine"), format!("{:?} is not an engine xpu knows", p.engine)));
        };
        // A constant with no constant kernel on its engine is embedded in its consumer.
        let embedded = op == xpu_ir::Op::Constant && &*p.kernel == "embedded";
        if !embedded && !known.kernels.contains(&&*p.kernel) {
            return Err(bad(
                field("kernel"),
                format!(
                    "{:?} is not a kernel of engine {} ({})",
                    p.kernel,
                    known.name,
                    known.kernels.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Partitions are numbered in order, cover every node once in graph order, and agree with
/// the placements of their nodes.
fn check_partitions(plan: &CapturePlan) -> Result<(), PlanFileError> {
    let mut next = 0usize;
    for (i, part) in plan.partitions.iter().enumerate() {
        let field = |f: &str| format!("plan.partitions[{i}].{f}");
        if part.id != i {
            return Err(bad(field("id"), format!("{} where {i} belongs", part.id)));
        }
        if part.nodes.is_empty() {
            return Err(bad(field("nodes"), "empty"));
        }
        for (k, n) in part.nodes.iter().enumerate() {
            if n.index() != next {
                return Err(bad(
                    format!("plan.partitions[{i}].nodes[{k}]"),
                    format!(
                        "{n} where n{next} belongs: partitions run the graph's nodes in order, each once"
                    ),
                ));
            }
            let placed = &plan.placements[n.index()];
            if placed.partition != i
                || *placed.engine != part.engine
                || placed.device != part.device
            {
                return Err(bad(
                    format!("plan.partitions[{i}].nodes[{k}]"),
                    format!(
                        "{n} is placed in partition {} on {}@{}, not this one ({}@{})",
                        placed.partition, placed.engine, placed.device, part.engine, part.device
                    ),
                ));
            }
            next += 1;
        }
        if part.assignment.engine != part.engine || part.assignment.device != part.device {
            return Err(bad(
                field("assignment"),
                format!(
                    "for {}@{}, but the partition is {}@{}",
                    part.assignment.engine, part.assignment.device, part.engine, part.device
                ),
            ));
        }
        if part.assignment.options.threads == Some(0) {
            return Err(bad(field("assignment.options.threads"), "0 threads cannot run anything"));
        }
    }
    if next != plan.graph.nodes.len() {
        return Err(bad(
            "plan.partitions",
            format!("cover {next} of the graph's {} nodes", plan.graph.nodes.len()),
        ));
    }
    Ok(())
}

fn check_transfers_and_casts(plan: &CapturePlan, source: &Graph) -> Result<(), PlanFileError> {
    let g = &plan.graph;
    for (i, t) in plan.transfers.iter().enumerate() {
        let field = |f: &str| format!("plan.transfers[{i}].{f}");
        if t.value.index() >= g.values.len() {
            return Err(bad(field("value"), format!("{} is not a value of the graph", t.value)));
        }
        if let Some(p) = t.to_partition
            && p >= plan.partitions.len()
        {
            return Err(bad(field("to_partition"), format!("{p} is not a partition")));
        }
        if TransferDirection::between(t.from_device, t.to_device) != Some(t.direction) {
            return Err(bad(
                field("direction"),
                format!("{} does not go from {} to {}", t.direction, t.from_device, t.to_device),
            ));
        }
    }
    for (i, c) in plan.casts.iter().enumerate() {
        if c.node.index() >= g.nodes.len() {
            return Err(bad(
                format!("plan.casts[{i}].node"),
                format!("{} is not a node of the plan", c.node),
            ));
        }
        if let Some(n) = c.for_node
            && n.index() >= source.nodes.len()
        {
            return Err(bad(
                format!("plan.casts[{i}].for_node"),
                format!("{n} is not a node of the program"),
            ));
        }
    }
    Ok(())
}
