//! From per-node choices to what GraphExec runs: every node of the planned graph placed
//! (an inserted cast runs where its consumer runs), partitions as maximal runs of
//! consecutive nodes on one (engine, device), and each fusion group reported whole or
//! split.

use crate::evidence::signature_bits;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use xpu_engine::Assignment;
use xpu_ir::{Graph, NodeId, Op};

use super::{Placed, Planner};
use crate::model::{CastPlan, Choice, GroupDecision, PartitionPlan, Placement};
use crate::reason::ReasonCode;

/// The partitions of a plan, each node's partition and its placement.
pub(super) struct Parts {
    pub partitions: Vec<PartitionPlan>,
    pub part_of: Vec<usize>,
    pub placements: Vec<Placement>,
}

impl Planner<'_> {
    /// The choice for every node of the planned graph: source nodes as walked, casts where
    /// the node they feed runs (a cast back at a graph output: where its producer ran).
    pub(super) fn place_casts(
        &self,
        planned: &Graph,
        source_of: &[Option<NodeId>],
        casts: &[CastPlan],
        choices: &[Placed],
    ) -> Vec<Placed> {
        let mut placed: Vec<Placed> = Vec::with_capacity(planned.nodes.len());
        // Casts are recorded in node order, so a cursor finds each one.
        let mut next_cast = 0;
        let mut cast_kernels: HashMap<usize, Arc<str>> = HashMap::new();
        for pid in planned.node_ids() {
            if let Some(s) = source_of[pid.index()] {
                placed.push(choices[s.index()].clone());
                continue;
            }
            let cast = &casts[next_cast];
            next_cast += 1;
            debug_assert_eq!(cast.node, pid);
            let owner = cast.for_node.map(|s| choices[s.index()].clone()).unwrap_or_else(|| {
                let input = planned.node(pid).inputs[0].expect("cast has an input");
                let producer = planned.producer(input).and_then(|p| source_of[p.index()]);
                producer.map(|p| choices[p.index()].clone()).unwrap_or_else(|| choices[0].clone())
            });
            let caps = &self.inventory.engines[owner.1];
            let kernel = cast_kernels
                .entry(owner.1)
                .or_insert_with(|| {
                    caps.kernels
                        .iter()
                        .find(|k| k.runs_op(Op::Cast))
                        .map(|k| Arc::from(k.name.as_str()))
                        .unwrap_or_else(|| owner.0.kernel.clone())
                })
                .clone();
            placed.push((Choice { kernel, precision: None, ..owner.0 }, owner.1));
        }
        placed
    }

    /// Partitions: maximal runs of consecutive nodes on one (engine, device).
    pub(super) fn partition(
        &self,
        planned: &Graph,
        placed: &[Placed],
        source_of: &[Option<NodeId>],
        casts: &[CastPlan],
    ) -> Parts {
        // Source nodes the plan lowered: a cast feeds them.
        let mut lowered_source = vec![false; self.graph.nodes.len()];
        for k in casts {
            if let Some(src) = k.for_node {
                lowered_source[src.index()] = true;
            }
        }
        let mut partitions: Vec<PartitionPlan> = Vec::new();
        let mut part_of = vec![0usize; planned.nodes.len()];
        for pid in planned.node_ids() {
            let (c, _) = &placed[pid.index()];
            let same =
                partitions.last().is_some_and(|p| *p.engine == *c.engine && p.device == c.device);
            if !same {
                let mut a = Assignment::new(&c.engine);
                a.device = c.device;
                a.options = self.engine_options();
                partitions.push(PartitionPlan {
                    id: partitions.len(),
                    engine: c.engine.to_string(),
                    device: c.device,
                    nodes: Vec::new(),
                    assignment: a,
                });
            }
            let p = partitions.last_mut().expect("just pushed");
            p.nodes.push(pid);
            part_of[pid.index()] = p.id;
            // A node the plan lowered (a cast feeds it): the partition's compute precision,
            // for engines that take it as a hint (OpenVINO, TensorRT). Natively low-precision
            // graphs set none: their dtypes already say it.
            let lowered = source_of[pid.index()].is_some_and(|src| lowered_source[src.index()]);
            if lowered && p.assignment.precision.is_none() {
                p.assignment.precision = c.precision;
            }
        }
        let placements = planned
            .node_ids()
            .map(|pid| {
                let (c, _) = &placed[pid.index()];
                let source = source_of[pid.index()];
                // What the store files this node's timings under (constants are not timed).
                let signature =
                    source.filter(|s| self.graph.node(*s).op != xpu_ir::Op::Constant).map(|s| {
                        crate::evidence::Signature(signature_bits(self.graph, s, self.bindings))
                    });
                Placement {
                    node: pid,
                    source,
                    signature,
                    op: planned.node(pid).op.name().into(),
                    engine: c.engine.clone(),
                    kernel: c.kernel.clone(),
                    precision: c.precision,
                    device: c.device,
                    partition: part_of[pid.index()],
                }
            })
            .collect();
        Parts { partitions, part_of, placements }
    }
}

/// Each fusion group of the planned graph: whole when all its nodes run on one engine and
/// device in one partition, else split (`FusionSplit`) naming where each node went.
pub(super) fn group_decisions(planned: &Graph, placements: &[Placement]) -> Vec<GroupDecision> {
    let mut members: BTreeMap<u32, Vec<NodeId>> = BTreeMap::new();
    for id in planned.node_ids() {
        if let Some(g) = planned.node(id).group {
            members.entry(g).or_default().push(id);
        }
    }
    members
        .into_iter()
        .map(|(group, nodes)| {
            let at = |n: &NodeId| &placements[n.index()];
            let first = at(&nodes[0]);
            let together = nodes.iter().all(|n| {
                let p = at(n);
                p.engine == first.engine
                    && p.device == first.device
                    && p.partition == first.partition
            });
            let mut kernels: Vec<&str> = nodes.iter().map(|n| &*at(n).kernel).collect();
            kernels.dedup();
            let (whole, split) = if together {
                (Some((first.engine.to_string(), kernels.join("+"), first.partition)), None)
            } else {
                let places: Vec<String> = nodes
                    .iter()
                    .map(|n| format!("{n} on {} (partition {})", at(n).kernel, at(n).partition))
                    .collect();
                (None, Some((ReasonCode::FusionSplit, places.join(", "))))
            };
            GroupDecision { group, nodes, whole, split }
        })
        .collect()
}
