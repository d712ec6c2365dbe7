//! Measured choice (`choose = "measured"`): among the candidates the policy allows for a
//! node — those that can run it and are outranked only by the static order — the one the
//! evidence measured fastest wins. Pins, denials, precision limits and fallback rules stay
//! absolute: a measured winner the static walk rejected for any other reason is not taken.
//! Where evidence is missing, too thin, from another machine, or names a candidate the
//! policy does not allow, the static order decides and the decision says why.

use xpu_ir::NodeId;
use xpu_policy::lock::{Evidence, Figure, NodeChoice, micros};
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
    /// The evidence's entry for the node's signature (and the signature).
    Entry(usize, u64),
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
        Some(EvidenceRef {
            lock: e.source.to_string(),
            sha256: e.sha256.to_string(),
            from_store: e.from_store,
            unused,
        })
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
                    Some((i, _)) => MeasureAsk::Entry(i, signature),
                    None => MeasureAsk::Missing(signature),
                }
            }
            _ => MeasureAsk::NoEvidence,
        })
    }

    /// What the walk gives the evidence: the signature's entry, or none on a plan that
    /// explores (every candidate is unmeasured there); `None`: the walk is static.
    pub(super) fn measure_key(&self, ask: Option<&MeasureAsk>) -> Option<(Option<usize>, u64)> {
        match (ask?, &self.evidence) {
            (MeasureAsk::Entry(i, sig), _) => Some((Some(*i), *sig)),
            (MeasureAsk::Missing(sig), EvidenceState::Usable(e)) if e.explore => Some((None, *sig)),
            _ => None,
        }
    }

    /// The note for a node whose evidence did not reach its walk.
    pub(super) fn measure_note(&self, ask: &MeasureAsk) -> Option<MeasuredNote> {
        let (code, detail) = match (ask, &self.evidence) {
            (MeasureAsk::Entry(..), _) => return None,
            (MeasureAsk::Missing(sig), EvidenceState::Usable(e)) => (
                ReasonCode::EvidenceMissing,
                format!("{} has no figures for signature {sig:016x}", e.describe()),
            ),
            (_, EvidenceState::Unused(e, why)) => {
                (ReasonCode::EvidenceNotApplicable, format!("{}: {why}", e.describe()))
            }
            _ => (
                ReasonCode::EvidenceMissing,
                "no [measured] lock, and no store evidence".to_string(),
            ),
        };
        Some(MeasuredNote { code: Some(code), detail, saved_nanos: None })
    }

    /// After the static walk: the fastest measured candidate the policy allows for the
    /// node (`entry`: its signature's figures) replaces the static choice; on an exploring
    /// plan, a candidate with thin evidence runs instead. Returns what the evidence said.
    pub(super) fn apply_measured(
        &self,
        ask: &Ask,
        entry: Option<usize>,
        signature: u64,
        st: &mut super::walk::Progress,
    ) -> Option<MeasuredNote> {
        let EvidenceState::Usable(e) = &self.evidence else { return None };
        let lock = e.lock.as_ref().ok()?;
        let node = entry.map(|i| &lock.nodes[i]);
        let (chosen, _) = st.chosen.clone()?;
        let allowed = self.allowed(ask, st, &chosen);
        let min = self.resolved.min_samples;
        let best = node.and_then(|n| {
            n.figures().find(|f| f.samples >= min && allowed.iter().any(|a| **a == *f.kernel))
        });
        let evidence = format!("{} ({})", e.describe(), e.sha256);
        if e.explore
            && let Some(note) =
                self.explore(ask, st, (&chosen, &allowed), node, best, signature, &evidence)
        {
            return Some(note);
        }
        let node = node?;
        if allowed.len() == 1 {
            let detail = self.sole_candidate(ask, st, &allowed[0], &node.winner.kernel);
            return Some(note(ReasonCode::EvidenceNotApplicable, detail));
        }
        let Some(best) = best else {
            return Some(match node.figures().find(|f| allowed.iter().any(|a| **a == *f.kernel)) {
                Some(f) => note(
                    ReasonCode::EvidenceThin,
                    format!(
                        "{} has {} timed run(s); [measured] min_samples is {min}",
                        f.kernel, f.samples
                    ),
                ),
                None => note(
                    ReasonCode::EvidenceNotApplicable,
                    format!(
                        "the measured winner {} is not a candidate the policy allows for this node",
                        node.winner.kernel
                    ),
                ),
            });
        };
        // A store's figures come from what ran: the static choice is compared before it
        // is replaced (a lock's `tune` measured every candidate side by side).
        let static_runs = node.figure(&chosen.kernel).map_or(0, |f| f.samples);
        if e.from_store && *chosen.kernel != *best.kernel && static_runs < min {
            let detail = format!(
                "the static choice {} has {static_runs} timed run(s) of [measured] min_samples {min}: not yet compared with {best}",
                chosen.kernel
            );
            return Some(note(ReasonCode::EvidenceThin, detail));
        }
        let mut saved_nanos = None;
        if *chosen.kernel != *best.kernel {
            let slower = node.figure(&chosen.kernel);
            saved_nanos = slower
                .filter(|f| f.samples >= min && f.median_us > best.median_us)
                .map(|f| ((f.median_us - best.median_us) * 1000.0) as u64);
            let slower = match slower {
                Some(r) => format!("{r}"),
                None => format!("{} (not measured faster)", chosen.kernel),
            };
            let detail = format!("measured slower: {slower}; {best} runs instead");
            if self
                .take(ask, st, &chosen, &best.kernel, ReasonCode::MeasuredSlower, &detail)
                .is_none()
            {
                let detail = format!("{} cannot run the node here", best.kernel);
                return Some(note(ReasonCode::EvidenceNotApplicable, detail));
            }
        }
        st.rule = Some(self.measured_rule(node, best, &evidence));
        Some(MeasuredNote { code: None, detail: format!("{best}"), saved_nanos })
    }

    /// On an exploring plan: runs the candidate [`to_explore`](Self::to_explore) names, if
    /// this plan explores nothing of another signature yet (one per plan: what an
    /// exploring run costs stays that of one node).
    #[allow(clippy::too_many_arguments)]
    fn explore(
        &self,
        ask: &Ask,
        st: &mut super::walk::Progress,
        (chosen, allowed): (&Choice, &[std::sync::Arc<str>]),
        node: Option<&NodeChoice>,
        best: Option<&Figure>,
        signature: u64,
        evidence: &str,
    ) -> Option<MeasuredNote> {
        if self.exploring.get().is_some_and(|s| s != signature) {
            return None;
        }
        let kernel = self.to_explore(ask, chosen, allowed, node, best)?;
        let min = self.resolved.min_samples;
        let samples = node.and_then(|n| n.figure(kernel)).map_or(0, |f| f.samples);
        let detail =
            format!("exploring {kernel}: {samples} of [measured] min_samples {min} timed run(s)");
        if *chosen.kernel != *kernel {
            self.take(ask, st, chosen, kernel, ReasonCode::Exploring, &detail)?;
        }
        self.exploring.set(Some(signature));
        st.rule = Some(RuleRef {
            key: format!("explore: {detail}; {evidence}").into(),
            at: Some(self.resolved.site(Key::MeasuredExploreRuns).at.clone()),
        });
        Some(note(ReasonCode::Exploring, detail))
    }

    /// Why the evidence had nothing to choose among: the policy allows `only` here.
    fn sole_candidate(
        &self,
        ask: &Ask,
        st: &super::walk::Progress,
        only: &str,
        winner: &str,
    ) -> String {
        let could_run = st.rejected.iter().any(|r| {
            r.kernel.as_deref() == Some(winner)
                && matches!(r.code, ReasonCode::Outranked | ReasonCode::KernelDegraded)
        });
        if could_run && self.resolved.fallback == Fallback::Deny {
            let first = ask.first_choice.first().map_or("", |f| &**f);
            format!(
                "the measured winner {winner} would be a fallback from {first} and engines.fallback = \"deny\""
            )
        } else if winner != only {
            format!(
                "the measured winner {winner} is not a candidate the policy allows for this node"
            )
        } else {
            format!("{only} is the only candidate the policy allows for this node")
        }
    }

    /// The kernels the policy allows for the node: the static choice, and those outranked
    /// only by the order (or degraded) — on the first engine only when fallback is denied.
    fn allowed(
        &self,
        ask: &Ask,
        st: &super::walk::Progress,
        chosen: &Choice,
    ) -> Vec<std::sync::Arc<str>> {
        let first = ask.first_choice.first().map(|f| &**f);
        let deny = self.resolved.fallback == Fallback::Deny;
        let mut out = vec![chosen.kernel.clone()];
        for r in &st.rejected {
            if !matches!(r.code, ReasonCode::Outranked | ReasonCode::KernelDegraded) {
                continue;
            }
            if deny && first != Some(r.engine.as_str()) {
                continue;
            }
            if let Some(k) = &r.kernel
                && !out.iter().any(|o| **o == **k)
            {
                out.push(k.as_str().into());
            }
        }
        out
    }

    /// The candidate an exploring plan runs: the first allowed one (other than the one the
    /// evidence or the order picks) thinner than `min_samples`, not already measured
    /// `max_slowdown` times slower than the best, on the static choice's device (a node's
    /// own time does not show what moving it to another device costs), while the
    /// signature's explored runs are within `explore_runs`.
    fn to_explore<'k>(
        &self,
        ask: &Ask,
        chosen: &Choice,
        allowed: &'k [std::sync::Arc<str>],
        node: Option<&NodeChoice>,
        best: Option<&Figure>,
    ) -> Option<&'k str> {
        let r = self.resolved;
        let figure = |k: &str| node.and_then(|n| n.figure(k));
        let exploit = best.map_or(&*allowed[0], |b| b.kernel.as_str());
        // Runs of candidates neither the order nor the evidence picks came from exploring.
        let explored: u64 = allowed
            .iter()
            .filter(|k| ***k != *exploit && ***k != *chosen.kernel)
            .filter_map(|k| figure(k))
            .map(|f| u64::from(f.samples))
            .sum();
        if r.explore_runs == 0 || explored >= u64::from(r.explore_runs) {
            return None;
        }
        let too_slow =
            |f: &Figure| best.is_some_and(|b| f.median_us > r.max_slowdown * b.median_us);
        let thin = |k: &str| match figure(k) {
            None => true,
            Some(f) => f.samples < r.min_samples && !too_slow(f),
        };
        let same_device = |k: &str| {
            self.refit(ask, xpu_engine::catalog::engine_of(k), k)
                .is_some_and(|(c, _)| c.device == chosen.device)
        };
        allowed.iter().map(|k| &**k).filter(|k| *k != exploit).find(|k| thin(k) && same_device(k))
    }

    /// Runs `kernel` instead of the static choice `chosen`, which is rejected with `code`
    /// and `detail`; `None` when the kernel cannot run the node here after all.
    fn take(
        &self,
        ask: &Ask,
        st: &mut super::walk::Progress,
        chosen: &Choice,
        kernel: &str,
        code: ReasonCode,
        detail: &str,
    ) -> Option<()> {
        let engine = xpu_engine::catalog::engine_of(kernel);
        let pick = self.refit(ask, engine, kernel)?;
        let pos = st.rejected.iter().position(|r| r.kernel.as_deref() == Some(kernel))?;
        st.rejected.remove(pos);
        st.rejected.push(ask.reject(
            &chosen.engine,
            code,
            detail.to_string(),
            None,
            Some(&chosen.kernel),
        ));
        // Off the first choice is a fallback, whatever moved it there: the fallback budget
        // counts it and the table shows it.
        let first = ask.first_choice.first().map(|f| &**f);
        st.fallback = match first {
            Some(f0) if f0 != &*pick.0.engine => st.fallback.take().or_else(|| {
                Some(FallbackNote {
                    from: f0.to_string(),
                    code,
                    detail: match code {
                        ReasonCode::Exploring => format!("exploring {kernel}"),
                        _ => format!("{kernel} measured faster"),
                    },
                })
            }),
            _ => None,
        };
        // The precision, and why when the candidate runs the node at another than asked.
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
        Some(())
    }

    /// The decision's rule for a measured choice: the figures and the lock.
    fn measured_rule(&self, node: &NodeChoice, best: &Figure, evidence: &str) -> RuleRef {
        let versus = match node.figures().find(|f| f.kernel != best.kernel) {
            Some(r) => format!(" vs {} {} over {}", r.kernel, micros(r.median_us), r.samples),
            None => String::new(),
        };
        let key = format!(
            "measured: {} {} over {} run(s){versus}; {evidence}",
            best.kernel,
            micros(best.median_us),
            best.samples
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

/// What the evidence said, when the static order decided (or a run explored).
fn note(code: ReasonCode, detail: String) -> MeasuredNote {
    MeasuredNote { code: Some(code), detail, saved_nanos: None }
}
