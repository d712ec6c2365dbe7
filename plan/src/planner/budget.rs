//! `[engines] fallback_budget`: how much of a graph, by nodes and by estimated FLOPs, may
//! run on a fallback engine before the plan fails or warns.

use xpu_policy::Key;
use xpu_policy::spec::Fallback;

use super::Planner;
use crate::model::{Decision, Note};
use crate::reason::ReasonCode;

impl Planner<'_> {
    /// The note when the fallbacks exceed the budget (an error or a warning, as
    /// `on_exceeded` says; the caller files it).
    pub(super) fn fallback_budget(&self, decisions: &[Decision]) -> Option<Note> {
        let spec = &self.policy.spec;
        let (Some(b), Fallback::Allow) = (&spec.engines.fallback_budget, spec.engines.fallback)
        else {
            return None;
        };
        let placed: Vec<&Decision> = decisions.iter().filter(|d| d.op != "constant").collect();
        let fb: Vec<&&Decision> = placed.iter().filter(|d| d.fallback.is_some()).collect();
        let node_pct = percent(fb.len() as f64, placed.len() as f64);
        let total_flops: u64 = placed.iter().filter_map(|d| d.flops).sum();
        let fb_flops: u64 = fb.iter().filter_map(|d| d.flops).sum();
        let flops_pct = percent(fb_flops as f64, total_flops as f64);
        let mut over = Vec::new();
        if let Some(m) = b.max_nodes_pct
            && node_pct > m
        {
            over.push(format!(
                "{} of {} nodes ({node_pct:.1}%) fell back, budget {m}%",
                fb.len(),
                placed.len()
            ));
        }
        if let Some(m) = b.max_flops_pct
            && flops_pct > m
        {
            over.push(format!("{flops_pct:.1}% of estimated FLOPs fell back, budget {m}%"));
        }
        if over.is_empty() {
            return None;
        }
        let at = Some(self.resolved.site(Key::FallbackBudget).at.clone());
        Some(Note { code: ReasonCode::FallbackBudgetExceeded, message: over.join("; "), at })
    }
}

fn percent(part: f64, whole: f64) -> f64 {
    if whole == 0.0 { 0.0 } else { 100.0 * part / whole }
}
