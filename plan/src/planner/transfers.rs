//! Transfers: a partition that reads a value living on another device gets a transfer
//! before it, and a graph output computed off the host goes back to the caller.

use xpu_engine::{DeviceId, TransferDirection};
use xpu_ir::Graph;
use xpu_ir::passes::value_bytes;

use super::Planner;
use crate::model::{PartitionPlan, Transfer};

impl Planner<'_> {
    pub(super) fn transfers(
        &self,
        planned: &Graph,
        partitions: &[PartitionPlan],
        part_of: &[usize],
    ) -> Vec<Transfer> {
        let mut out = Vec::new();
        // seen[v] == partition id + 1: v was already considered for this partition.
        let mut seen = vec![0usize; planned.values.len()];
        for p in partitions {
            for &nid in &p.nodes {
                for v in planned.node(nid).input_values() {
                    if seen[v.index()] == p.id + 1 {
                        continue;
                    }
                    seen[v.index()] = p.id + 1;
                    if planned.const_value(v).is_some() {
                        continue;
                    }
                    let from = match planned.producer(v) {
                        Some(prod) => {
                            let q = part_of[prod.index()];
                            if q == p.id {
                                continue;
                            }
                            partitions[q].device
                        }
                        None => DeviceId::HOST,
                    };
                    if let Some(direction) = TransferDirection::between(from, p.device) {
                        out.push(Transfer {
                            value: v,
                            direction,
                            bytes: value_bytes(planned, v, self.bindings),
                            from_device: from,
                            to_device: p.device,
                            to_partition: Some(p.id),
                            reason: format!(
                                "partition {} on {} reads {v} from {from}",
                                p.id, p.device
                            ),
                        });
                    }
                }
            }
        }
        for o in &planned.outputs {
            if let Some(prod) = planned.producer(o.value) {
                let dev = partitions[part_of[prod.index()]].device;
                if !dev.is_host() {
                    out.push(Transfer {
                        value: o.value,
                        direction: TransferDirection::DeviceToHost,
                        bytes: value_bytes(planned, o.value, self.bindings),
                        from_device: dev,
                        to_device: DeviceId::HOST,
                        to_partition: None,
                        reason: format!("output {:?} returns to the caller", o.name),
                    });
                }
            }
        }
        out
    }
}
