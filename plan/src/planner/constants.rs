//! Constants are not walked: each follows its first consumer (it is embedded in that
//! consumer's partition), or, read by no placed node, goes to the first available engine.

use std::sync::Arc;

use xpu_engine::DeviceId;
use xpu_ir::{NodeId, Op};

use super::{Placed, Placing, Planner};
use crate::model::{Choice, RuleRef};

impl Planner<'_> {
    pub(super) fn place_constants(&self, placing: &mut Placing) {
        let g = self.graph;
        // The uses of every value are listed at the first constant: a graph without
        // constants does not need them.
        let mut uses: Option<Vec<Vec<NodeId>>> = None;
        for id in (0..g.nodes.len() as u32).rev().map(NodeId) {
            let n = g.node(id);
            if n.op != Op::Constant {
                continue;
            }
            let users: &[Vec<NodeId>] = uses.get_or_insert_with(|| g.uses());
            let consumer = n
                .outputs
                .iter()
                .flat_map(|o| users[o.index()].iter())
                .find_map(|u| placing.choices[u.index()].clone());
            let Some((mut c, ei)) = consumer.or_else(|| self.first_available_engine()) else {
                continue;
            };
            c.kernel = self.inventory.engines[ei]
                .kernels
                .iter()
                .find(|k| k.runs_op(Op::Constant))
                .map(|k| Arc::from(k.name.as_str()))
                .unwrap_or_else(|| "embedded".into());
            c.precision = None;
            let d = &mut placing.decisions[id.index()];
            d.chosen = Some(c.clone());
            d.rule = Some(RuleRef { key: "constant follows its consumer".into(), at: None });
            placing.choices[id.index()] = Some((c, ei));
        }
    }

    /// Where a constant no placed node reads goes: the first available engine's first
    /// device.
    fn first_available_engine(&self) -> Option<Placed> {
        let ei = self.inventory.engines.iter().position(|c| c.availability.is_available())?;
        let caps = &self.inventory.engines[ei];
        let choice = Choice {
            engine: caps.engine.as_str().into(),
            kernel: "".into(),
            precision: None,
            device: caps.devices.first().map_or(DeviceId::HOST, |d| d.id),
        };
        Some((choice, ei))
    }
}
