//! The plan's memory: the peak of live tensor bytes of the planned graph, checked against
//! `[memory] limit` (an error when over it; a warning when sizes depend on unbound dims).

use xpu_ir::Graph;
use xpu_ir::passes::plan_memory;
use xpu_policy::Key;

use super::{PlanFailure, Planner};
use crate::model::{Explanation, MemorySummary, Note};
use crate::reason::ReasonCode;

impl Planner<'_> {
    pub(super) fn check_memory(
        &self,
        planned: &Graph,
        explanation: &mut Explanation,
    ) -> Result<MemorySummary, PlanFailure> {
        let limit = self.policy.spec.memory.limit;
        let mem = plan_memory(planned, self.bindings);
        let memory = MemorySummary {
            peak_bytes: mem.unsized_values.is_empty().then_some(mem.peak_live_bytes),
            arena_bytes: mem.arena_bytes,
            limit_bytes: limit.map(|l| l.0),
        };
        explanation.memory = memory.clone();
        let Some(limit) = limit else { return Ok(memory) };
        let at = Some(self.resolved.site(Key::MemoryLimit).at.clone());
        match memory.peak_bytes {
            Some(peak) if peak > limit.0 => {
                let note = Note {
                    code: ReasonCode::MemoryLimitExceeded,
                    message: format!(
                        "the plan needs a peak of {peak} bytes of live tensors; memory.limit is {limit} ({} bytes)",
                        limit.0
                    ),
                    at,
                };
                explanation.errors.push(note.clone());
                let explanation = Box::new(explanation.clone());
                Err(PlanFailure { errors: vec![note], explanation })
            }
            None => {
                explanation.warnings.push(Note {
                    code: ReasonCode::MemoryLimitExceeded,
                    message: format!(
                        "memory.limit {limit} not checked: {} value(s) have sizes that depend on unknown or unbound dims (bind them)",
                        mem.unsized_values.len()
                    ),
                    at,
                });
                Ok(memory)
            }
            _ => Ok(memory),
        }
    }
}
