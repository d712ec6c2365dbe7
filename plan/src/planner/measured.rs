//! Measured choice (`choose = "measured"`): among the candidates the policy allows for a
//! node — those that can run it and are outranked only by the static order — the one the
//! evidence measured fastest wins. Pins, denials, precision limits and fallback rules stay
//! absolute: a measured winner the static walk rejected for any other reason is not taken.
//! Where evidence is missing, too thin, from another machine, or names a candidate the
//! policy does not allow, the static order decides and the decision says why.

use xpu_ir::NodeId;
use xpu_policy::lock::{Evidence, micros};
use xpu_policy::spec::{Choose, Fallback};
use xpu_policy::{Key, ResolvedRule};

use super::walk::Ask;
use super::{Placed, Planner};
use crate::evidence::signature_bits;
use crate::model::{Choice, EvidenceRef, FallbackNote, MeasuredNote, Rejection, RuleRef};
use crate::reason::ReasonCode;

/// The evidence of a plan, as the planner found it.
pub(super) enum EvidenceState<'a> {
    /// The policy chooses nothing by measurement, or names no lock.
    Absent,
    /// A lock that cannot be used here, and why.
    Unused(&'a Evidence, String),
    Usable(&'a Evidence),
}

/// What a node whose policy chooses by measurement asks of the evidence.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum MeasureAsk {
    /// The lock's entry for the node's signature.
    Entry(usize),
    /// No entry for this signature.
    Missing(u64),
    /// No usable evidence at all.
    NoEvidence,
}

impl<'a> EvidenceState<'a> {
    pub fn of(planner_evidence: Option<&'a Evidence>, inventory: &xpu_engine::Inventory) -> Self {
        match planner_evidence {
            None => EvidenceState::Absent,
            Some(e) => match &e.lock {
                Err(err) => EvidenceState::Unused(e, err.to_string()),
                Ok(_) => match e.mismatch(inventory) {
                    Some(why) => EvidenceState::Unused(e, why),
                    None => EvidenceState::Usable(e),
                },
            },
        }
    }

    /// The reference plans and explanations carry.
    pub fn reference(&self) -> Option<EvidenceRef> {
        let (e, unused) = match self {
            EvidenceState::Absent => return None,
            EvidenceState::Unused(e, why) => (e, Some(why.clone())),
            EvidenceState::Usable(e) => (e, None),
        };
        Some(EvidenceRef { lock: e.source.to_string(), sha256: e.sha256.to_string(), unused })
    }
}

impl<'a> Planner<'a> {
    /// What node `id` asks of the evidence, when its policy chooses by measurement.
    pub(super) fn measure_ask(
        &self,
        id: NodeId,
        rule: Option<&ResolvedRule>,
    ) -> Option<MeasureAsk> {
        if self.resolved.choose_for(rule) != Choose::Measured {
            return None;
        }
        Some(match &self.evidence {
            EvidenceState::Usable(e) => {
                let signature = signature_bits(self.graph, id, self.bindings);
                match e.node_bits(signature) {
                    Some((i, _)) => MeasureAsk::Entry(i),
                    None => MeasureAsk::Missing(signature),
                }
            }
            _ => MeasureAsk::NoEvidence,
        })
    }

    /// The note for a node whose evidence did not reach its walk.
    pub(super) fn measure_note(&self, ask: &MeasureAsk) -> Option<MeasuredNote> {
        let (code, detail) = match (ask, &self.evidence) {
            (MeasureAsk::Entry(_), _) => return None,
            (MeasureAsk::Missing(sig), EvidenceState::Usable(e)) => (
                ReasonCode::EvidenceMissing,
                format!("lock {} has no figures for signature {sig:016x}", e.source),
            ),
            (_, EvidenceState::Unused(e, why)) => {
                (ReasonCode::EvidenceNotApplicable, format!("lock {}: {why}", e.source))
            }
            _ => (ReasonCode::EvidenceMissing, "no [measured] lock".to_string()),
        };
        Some(MeasuredNote { code: Some(code), detail })
    }

    /// After the static walk: the lock's winner for the node, if the policy allows it,
    /// replaces the static choice. Returns what the evidence said.
    pub(super) fn apply_measured(
        &self,
        ask: &Ask,
        entry: usize,
        st: &mut super::walk::Progress,
    ) -> Option<MeasuredNote> {
        let EvidenceState::Usable(e) = &self.evidence else { return None };
        let lock = e.lock.as_ref().ok()?;
        let node = &lock.nodes[entry];
        let (chosen, _) = st.chosen.clone()?;
        let not_here = |detail: String| {
            Some(MeasuredNote { code: Some(ReasonCode::EvidenceNotApplicable), detail })
        };
        if node.winner.samples < self.resolved.min_samples {
            let detail = format!(
                "{} has {} timed run(s); [measured] min_samples is {}",
                node.winner.kernel, node.winner.samples, self.resolved.min_samples
            );
            return Some(MeasuredNote { code: Some(ReasonCode::EvidenceThin), detail });
        }
        let evidence = format!("lock {} ({})", e.source, e.sha256);
        if *chosen.kernel == *node.winner.kernel {
            st.rule = Some(self.measured_rule(node, &evidence));
            return Some(MeasuredNote { code: None, detail: format!("{}", node.winner) });
        }
        let Some(pos) = st.rejected.iter().position(|r| {
            r.kernel.as_deref() == Some(node.winner.kernel.as_str())
                && matches!(r.code, ReasonCode::Outranked | ReasonCode::KernelDegraded)
        }) else {
            return not_here(format!(
                "the measured winner {} is not a candidate the policy allows for this node",
                node.winner.kernel
            ));
        };
        let first = ask.first_choice.first().map(|f| &**f);
        if self.resolved.fallback == Fallback::Deny && first != Some(node.winner.engine.as_str()) {
            return not_here(format!(
                "the measured winner {} would be a fallback from {} and engines.fallback = \"deny\"",
                node.winner.kernel,
                first.unwrap_or_default()
            ));
        }
        let Some(pick) = self.refit(ask, &node.winner.engine, &node.winner.kernel) else {
            return not_here(format!("{} cannot run the node here", node.winner.kernel));
        };
        st.rejected.remove(pos);
        let slower = match &node.runner_up {
            Some(r) if r.kernel == *chosen.kernel => format!("{r}"),
            _ => format!("{} (not measured faster)", chosen.kernel),
        };
        let detail = format!("measured slower: {slower}; {} runs instead", node.winner);
        st.rejected.push(ask.reject(
            &chosen.engine,
            ReasonCode::MeasuredSlower,
            detail,
            None,
            Some(&chosen.kernel),
        ));
        // Off the first choice is a fallback, whatever moved it there: the fallback budget
        // counts it and the table shows it.
        st.fallback = match first {
            Some(f0) if f0 != &*pick.0.engine => st.fallback.take().or_else(|| {
                Some(FallbackNote {
                    from: f0.to_string(),
                    code: ReasonCode::MeasuredSlower,
                    detail: format!("{} measured faster", node.winner.kernel),
                })
            }),
            _ => None,
        };
        // The precision, and why when the winner runs the node at another than asked.
        st.precision_note = (pick.0.precision != ask.f.precision).then(|| RuleRef {
            key: format!(
                "precision.allow ({} runs {})",
                pick.0.kernel,
                pick.0.precision.map_or("-", |p| p.name())
            )
            .into(),
            at: Some(self.resolved.site(Key::PrecisionAllow).at.clone()),
        });
        st.precision = pick.0.precision;
        st.chosen = Some(pick);
        st.rule = Some(self.measured_rule(node, &evidence));
        Some(MeasuredNote { code: None, detail: format!("{}", node.winner) })
    }

    /// The decision's rule for a measured choice: the figures and the lock.
    fn measured_rule(&self, node: &xpu_policy::lock::NodeChoice, evidence: &str) -> RuleRef {
        let versus = match &node.runner_up {
            Some(r) => format!(" vs {} {} over {}", r.kernel, micros(r.median_us), r.samples),
            None => String::new(),
        };
        let key = format!(
            "measured: {} {} over {} run(s){versus}; {evidence}",
            node.winner.kernel,
            micros(node.winner.median_us),
            node.winner.samples
        );
        RuleRef { key: key.into(), at: Some(self.resolved.site(Key::MeasuredLock).at.clone()) }
    }

    /// The winner as a choice: its engine's inventory entry and the kernel's fit.
    fn refit(&self, ask: &Ask, engine: &str, kernel: &str) -> Option<Placed> {
        let ei = self.inventory.engines.iter().position(|c| c.engine == engine)?;
        let caps = &self.inventory.engines[ei];
        let k = caps.kernel(kernel)?;
        let mut notes: Vec<Rejection> = Vec::new();
        let fit = self.fit(ask, engine, caps, k, true, &mut notes).ok()?;
        let choice = Choice {
            engine: caps.engine.as_str().into(),
            kernel: k.name.as_str().into(),
            precision: fit.precision,
            device: fit.device,
        };
        Some((choice, ei))
    }
}
