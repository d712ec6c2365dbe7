//! The candidate walk: for one node, engines in the order the policy gives (the node's
//! first choice, then `[engines] order`, then every other engine of the inventory), and per
//! engine its kernels in preference order. Every candidate that cannot or may not run the
//! node is rejected with a reason code and the policy key behind it; the first that can is
//! chosen, and the later ones are still listed (as outranked) so the explanation is whole.
//! Nodes with equal [`WalkKey`]s share one walk.

use std::sync::Arc;

use xpu_engine::{Capabilities, DeviceId, KernelCaps, KernelId, PrecisionName};
use xpu_ir::{DType, Op, OpClass};
use xpu_policy::spec::Fallback;
use xpu_policy::{Cited, KernelPick, Key, ResolvedRule};

use super::facts::{NodeFacts, operand_dtypes};
use super::{Placed, Planner, cite};
use crate::model::{Choice, FallbackNote, MeasuredNote, Rejection, RuleRef};
use crate::reason::ReasonCode;

/// The outcome of a node's walk.
#[derive(Clone)]
pub(super) struct Walk {
    pub chosen: Option<Placed>,
    /// The precision of the chosen candidate, and why when it is not the node's target.
    pub precision: Option<PrecisionName>,
    pub precision_note: Option<RuleRef>,
    pub rule: Option<RuleRef>,
    pub fallback: Option<FallbackNote>,
    pub rejected: Arc<Vec<Rejection>>,
    /// What the evidence said, for a node with a lock entry.
    pub measured: Option<MeasuredNote>,
}

/// Everything a candidate walk depends on: nodes with equal keys get equal walks.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct WalkKey {
    op: Op,
    precision: Option<PrecisionName>,
    kernel_dtype: DType,
    operands: u32,
    alternates: bool,
    rule: Option<usize>,
    /// The evidence's entry for the node's signature, and the signature (measured choice;
    /// no entry: on a plan that explores).
    measure: Option<(Option<usize>, u64)>,
    /// Bit d: the node's tensors fit the memory of device d (devices of all engines in
    /// inventory order).
    fits: u64,
}

/// A kernel pinned for the node, and the key that pins it.
struct Pin<'p> {
    kernel: &'p KernelId,
    site: &'p Cited,
}

/// What stays fixed over one node's walk.
pub(super) struct Ask<'p> {
    pub f: &'p NodeFacts,
    rule: Option<&'p ResolvedRule>,
    pin: Option<Pin<'p>>,
    preferred: &'p [KernelId],
    preferred_site: Option<&'p Cited>,
    /// The rule's engine, the pinned kernel's, `table` for table ops, else the order.
    pub first_choice: Vec<Arc<str>>,
    table_op: bool,
    /// A kernel lacking the default precision may run the node at another allowed one.
    other_precisions: bool,
}

impl Ask<'_> {
    pub(super) fn reject(
        &self,
        engine: &str,
        code: ReasonCode,
        detail: String,
        site: Option<&Cited>,
        kernel: Option<&str>,
    ) -> Rejection {
        Rejection {
            engine: engine.to_string(),
            kernel: kernel.map(str::to_string),
            precision: self.f.precision,
            code,
            detail,
            key: site.map(|s| s.key.clone()),
            at: site.map(|s| s.at.clone()),
        }
    }
}

/// The walk so far.
#[derive(Default)]
pub(super) struct Progress {
    pub chosen: Option<Placed>,
    pub precision: Option<PrecisionName>,
    pub precision_note: Option<RuleRef>,
    pub rule: Option<RuleRef>,
    pub fallback: Option<FallbackNote>,
    pub rejected: Vec<Rejection>,
    /// Why the first choice was not taken: the first engine-level rejection.
    first_rejection: Option<(ReasonCode, String)>,
}

impl Progress {
    fn reject(&mut self, r: Rejection, first: bool) {
        if first {
            self.first_rejection.get_or_insert((r.code, r.detail.clone()));
        }
        self.rejected.push(r);
    }
}

/// A kernel that can run the node: at what precision, on which device.
pub(super) struct Fit {
    pub precision: Option<PrecisionName>,
    pub device: DeviceId,
}

impl<'a> Planner<'a> {
    /// The candidate walk for a node, shared with every earlier node of the same key.
    pub(super) fn walk(&mut self, f: &NodeFacts, rule: Option<&'a ResolvedRule>) -> Walk {
        let key = WalkKey {
            op: f.op,
            precision: f.precision,
            kernel_dtype: f.kernel_dtype,
            operands: f.operands,
            alternates: f.alternates(),
            rule: rule.map(|r| r.index),
            measure: self.measure_key(f.measure.as_ref()),
            fits: self.fits(f),
        };
        if let Some(w) = self.walks.get(&key) {
            return w.clone();
        }
        // A default precision changes only when no candidate runs the node at it.
        let mut w = self.walk_uncached(f, rule, false);
        if w.chosen.is_none() && f.alternates() {
            let again = self.walk_uncached(f, rule, true);
            if again.chosen.is_some() {
                w = again;
            }
        }
        self.walks.insert(key, w.clone());
        w
    }

    /// One bit per (engine, device), in inventory order: the node's tensors fit there.
    fn fits(&self, f: &NodeFacts) -> u64 {
        let mut fits = 0u64;
        let devices = self.inventory.engines.iter().flat_map(|e| &e.devices);
        for (i, d) in devices.enumerate().take(64) {
            if d.memory_bytes.is_none_or(|l| f.working_bytes.is_none_or(|b| b <= l)) {
                fits |= 1 << i;
            }
        }
        fits
    }

    fn walk_uncached(
        &mut self,
        f: &NodeFacts,
        rule: Option<&'a ResolvedRule>,
        other_precisions: bool,
    ) -> Walk {
        let ask = self.ask(f, rule, other_precisions);
        let mut st = Progress::default();
        for (pos, e) in self.engine_sequence(&ask.first_choice).iter().enumerate() {
            let Some(ei) = self.engine_gate(&ask, e, &mut st) else { continue };
            if let Some(pick) = self.pick_on_engine(&ask, e, ei, &mut st) {
                self.accept(&ask, pos, e, pick, &mut st);
            }
            // Later engines are still enumerated, so the explanation lists them.
        }
        let measured = match self.measure_key(f.measure.as_ref()) {
            Some((entry, signature)) => self.apply_measured(&ask, entry, signature, &mut st),
            None => None,
        };
        Walk {
            chosen: st.chosen,
            precision: st.precision,
            precision_note: st.precision_note,
            rule: st.rule,
            fallback: st.fallback,
            rejected: Arc::new(st.rejected),
            measured,
        }
    }

    /// The fixed part of a walk: pin, preferences and the first choice.
    fn ask<'p>(
        &self,
        f: &'p NodeFacts,
        rule: Option<&'a ResolvedRule>,
        other_precisions: bool,
    ) -> Ask<'p>
    where
        'a: 'p,
    {
        let selection = self.resolved.kernels_for(f.op);
        let pin = match rule.and_then(|r| r.kernel.as_ref().map(|k| (k, &r.kernel_site))) {
            Some((kernel, site)) => Some(Pin { kernel, site }),
            None => match selection {
                Some(s) => match &s.pick {
                    KernelPick::Pinned(k) if s.by_class && self.pin_misses_op(k, f.op) => None,
                    KernelPick::Pinned(kernel) => Some(Pin { kernel, site: &s.site }),
                    KernelPick::Prefer(_) => None,
                },
                None => None,
            },
        };
        let (preferred, preferred_site) = match selection {
            Some(s) => match &s.pick {
                KernelPick::Prefer(ks) => (&ks[..], Some(&s.site)),
                KernelPick::Pinned(_) => (&[][..], None),
            },
            None => (&[][..], None),
        };
        // The first choice: the rule's engine, else the pinned kernel's, else the policy
        // order — except for table ops, whose data only the `table` engine holds: they go
        // there unless a rule or pin says otherwise, which is no fallback from the order.
        let table_op = f.op.class() == OpClass::Table;
        let first_choice = match rule.and_then(|r| r.engine.clone()) {
            Some(e) => vec![e],
            None => match &pin {
                Some(p) => vec![Arc::from(p.kernel.engine())],
                None if table_op => vec![Arc::from("table")],
                None => self.order.clone(),
            },
        };
        Ask { f, rule, pin, preferred, preferred_site, first_choice, table_op, other_precisions }
    }

    /// A pin by op class covers the ops of the class the kernel runs: an inventory whose
    /// entry for the kernel lacks this op (conv_transpose under `conv = "cpu.im2col_conv"`)
    /// leaves the op unpinned. A pin by op name, or of a kernel this inventory lacks, stays
    /// strict.
    fn pin_misses_op(&self, kernel: &KernelId, op: Op) -> bool {
        self.inventory
            .engines
            .iter()
            .filter_map(|e| e.kernel(kernel.as_str()))
            .any(|kc| !kc.runs_op(op))
    }

    /// The engine sequence: the first choice, then the policy order, then the rest.
    fn engine_sequence(&self, first_choice: &[Arc<str>]) -> Vec<Arc<str>> {
        let mut sequence: Vec<Arc<str>> = first_choice.to_vec();
        let rest = self.inventory.engines.iter().map(|c| c.engine.as_str());
        for e in self.order.iter().map(|e| &**e).chain(rest) {
            if !sequence.iter().any(|s| &**s == e) {
                sequence.push(Arc::from(e));
            }
        }
        sequence
    }

    /// Whether an engine may and can run the node at all: its inventory index, or `None`
    /// with the rejection recorded.
    fn engine_gate(&mut self, ask: &Ask, e: &str, st: &mut Progress) -> Option<usize> {
        let r = self.resolved;
        let f = ask.f;
        if r.is_denied(e) {
            let why = format!("{e} is denied");
            let site = r.site(Key::EnginesDeny);
            st.reject(ask.reject(e, ReasonCode::PolicyDenied, why, Some(site), None), false);
            return None;
        }
        if !ask.first_choice.iter().any(|c| &**c == e) {
            if let Some(rule) = ask.rule.filter(|rule| rule.places()) {
                let why = format!("{} sends this node to {}", rule.label, ask.first_choice[0]);
                let code = ReasonCode::RuleOverride;
                st.reject(ask.reject(e, code, why, Some(&rule.site), None), false);
                return None;
            }
            if !r.order.is_empty() && !r.in_order(e) {
                let why = format!("{e} is not in engines.order");
                let site = r.site(Key::EnginesOrder);
                st.reject(ask.reject(e, ReasonCode::NotInOrder, why, Some(site), None), false);
                return None;
            }
        }
        let Some(ei) = self.inventory.engines.iter().position(|c| c.engine == e) else {
            let why = format!("{e} is not in inventory {}", self.inventory_name());
            st.reject(ask.reject(e, ReasonCode::EngineUnavailable, why, None, None), true);
            return None;
        };
        let caps = &self.inventory.engines[ei];
        if !caps.availability.is_available() {
            let why = format!("{e}: {}", caps.availability);
            st.reject(ask.reject(e, ReasonCode::EngineUnavailable, why, None, None), true);
            return None;
        }
        if self.engine_kernels(ei, f.op).is_empty() {
            let why = format!("no {e} kernel runs {}", f.op);
            st.reject(ask.reject(e, ReasonCode::OpUnsupported, why, None, None), true);
            return None;
        }
        if let Some(pin) = &ask.pin
            && let Some(r) = pin_rejection(ask, pin, caps)
        {
            st.reject(r, true);
            return None;
        }
        Some(ei)
    }

    /// The kernels of engine `ei` that run `op`, in the engine's order.
    fn engine_kernels(&mut self, ei: usize, op: Op) -> Vec<usize> {
        let caps = &self.inventory.engines[ei];
        self.kernels_by_op
            .entry((ei, op))
            .or_insert_with(|| {
                let runs = caps.kernels.iter().enumerate().filter(|(_, k)| k.runs_op(op));
                runs.map(|(i, _)| i).collect()
            })
            .clone()
    }

    /// The first kernel of engine `ei` that can run the node, every other one rejected.
    fn pick_on_engine(
        &mut self,
        ask: &Ask,
        e: &Arc<str>,
        ei: usize,
        st: &mut Progress,
    ) -> Option<Placed> {
        let kernels = self.engine_kernels(ei, ask.f.op);
        let caps = &self.inventory.engines[ei];
        let (ordered, mut rejections) = ordered_kernels(ask, e, caps, &kernels);
        let mut pick: Option<Placed> = None;
        for k in ordered {
            let undecided = pick.is_none() && st.chosen.is_none();
            let fit = match self.fit(ask, e, caps, k, undecided, &mut rejections) {
                Ok(fit) => fit,
                Err(r) => {
                    rejections.push(r);
                    continue;
                }
            };
            if let Some(winner) = pick.as_ref().or(st.chosen.as_ref()) {
                // Degraded is the reason only when the winner is this engine's own kernel
                // (an earlier engine's pick outranks every kernel here anyway).
                let winner = winner.0.kernel.clone();
                let preferred = ask.preferred.iter().any(|p| p.as_str() == k.name);
                let (code, detail) = match &k.degraded {
                    Some(why) if pick.is_some() && !preferred => (
                        ReasonCode::KernelDegraded,
                        format!("{} is degraded here ({why}); {winner} runs instead", k.name),
                    ),
                    _ => (ReasonCode::Outranked, format!("{winner} comes first")),
                };
                rejections.push(ask.reject(e, code, detail, None, Some(&k.name)));
                continue;
            }
            if fit.precision != ask.f.precision {
                let p = fit.precision.map_or("-", |p| p.name());
                let key =
                    format!("precision.allow ({} lacks {}, runs {p})", k.name, ask.f.kernel_dtype);
                let at = Some(self.resolved.site(Key::PrecisionAllow).at.clone());
                st.precision_note = Some(RuleRef { key: key.into(), at });
            }
            st.precision = fit.precision;
            let choice = Choice {
                engine: e.clone(),
                kernel: k.name.as_str().into(),
                precision: fit.precision,
                device: fit.device,
            };
            pick = Some((choice, ei));
        }
        if pick.is_none()
            && let Some(r) = rejections.first()
        {
            st.first_rejection.get_or_insert((r.code, r.detail.clone()));
        }
        st.rejected.extend(rejections);
        pick
    }

    /// Whether kernel `k` can run the node, and how; else the rejection. A kernel that runs
    /// the node at another precision than asked leaves a note in `notes` first.
    pub(super) fn fit(
        &self,
        ask: &Ask,
        e: &str,
        caps: &Capabilities,
        k: &KernelCaps,
        undecided: bool,
        notes: &mut Vec<Rejection>,
    ) -> Result<Fit, Rejection> {
        let r = self.resolved;
        let f = ask.f;
        let reject =
            |code, detail, site: Option<&Cited>| ask.reject(e, code, detail, site, Some(&k.name));
        if let Some(pin) = &ask.pin
            && pin.kernel.as_str() != k.name
        {
            let why = format!("{} is pinned to {}", f.op, pin.kernel);
            return Err(reject(ReasonCode::KernelNotPinned, why, Some(pin.site)));
        }
        if f.precision.is_some_and(|p| !r.allow.contains(&p)) {
            let p = f.precision.map_or("", |p| p.name());
            let why = format!("the node computes at {p} and precision.allow does not list it");
            let site = r.site(Key::PrecisionAllow);
            return Err(reject(ReasonCode::PrecisionNotAllowed, why, Some(site)));
        }
        if r.bitwise && !k.deterministic {
            let why = format!("{} is not bitwise reproducible", k.name);
            let site = r.site(Key::Determinism);
            return Err(reject(ReasonCode::NotDeterministic, why, Some(site)));
        }
        if let Some(d) = k.unheld_operand(operand_dtypes(f.operands)) {
            let why = format!("{} cannot hold a {d} input or output", k.name);
            return Err(reject(ReasonCode::DtypeUnsupported, why, None));
        }
        let mut precision = f.precision;
        if !k.takes(f.op, f.kernel_dtype) {
            let alternate = (ask.other_precisions && undecided)
                .then(|| self.alternate_precision(f, k))
                .flatten();
            let detail = match alternate {
                Some(p) => format!(
                    "{} does not accept {}; it runs the node at {p} (precision.allow)",
                    k.name, f.kernel_dtype
                ),
                None => format!("{} does not accept {}", k.name, f.kernel_dtype),
            };
            let r = reject(ReasonCode::DtypeUnsupported, detail, None);
            match alternate {
                Some(p) => {
                    precision = Some(p);
                    notes.push(r);
                }
                None => return Err(r),
            }
        }
        let device =
            device_for(caps, k).map_err(|why| reject(ReasonCode::KernelUnavailable, why, None))?;
        if let (Some(limit), Some(bytes)) = (device.memory_bytes, f.working_bytes)
            && bytes > limit
        {
            let why = format!("the node's tensors need {bytes} bytes; {} has {limit}", device.id);
            return Err(reject(ReasonCode::MemoryLimitExceeded, why, None));
        }
        Ok(Fit { precision, device: device.id })
    }

    /// A default precision the kernel lacks: the next allowed storage precision it has is a
    /// candidate too (rule and keep_fp32 precisions are strict). Only as wide or wider
    /// (never silently narrower), narrowest first.
    fn alternate_precision(&self, f: &NodeFacts, k: &KernelCaps) -> Option<PrecisionName> {
        let width = |p: PrecisionName| p.storage().map(|d| d.size_bytes()).unwrap_or(0);
        let target = f.precision.map(width).unwrap_or(0);
        let mut c: Vec<PrecisionName> = self
            .resolved
            .allow
            .iter()
            .copied()
            .filter(|p| {
                Some(*p) != f.precision
                    && p.storage().is_some()
                    && width(*p) >= target
                    && k.takes(f.op, p.kernel_dtype())
            })
            .collect();
        c.sort_by_key(|p| width(*p));
        c.first().copied()
    }

    /// Takes an engine's pick: unless it is a fallback the policy denies, it becomes the
    /// node's choice, with the key that decided it.
    fn accept(&mut self, ask: &Ask, pos: usize, e: &str, pick: Placed, st: &mut Progress) {
        let r = self.resolved;
        let first = ask.first_choice.first().map(|f| &**f);
        let is_fallback = first.is_none_or(|f0| f0 != e);
        if is_fallback && r.fallback == Fallback::Deny {
            let why = format!("{e} would be a fallback from {}", first.unwrap_or_default());
            let site = Some(r.site(Key::EnginesFallback));
            let kernel = Some(&*pick.0.kernel);
            st.rejected.push(ask.reject(e, ReasonCode::FallbackDenied, why, site, kernel));
            return;
        }
        if is_fallback {
            let (code, detail) =
                st.first_rejection.clone().unwrap_or((ReasonCode::Unplaceable, String::new()));
            st.fallback =
                Some(FallbackNote { from: first.unwrap_or_default().to_string(), code, detail });
        }
        let mut decided = self.decided_by(ask, pos, is_fallback);
        // A kernel taken from a preference list names that list too (and its line).
        let from_list = ask.preferred.iter().position(|k| *k.as_str() == *pick.0.kernel);
        if let (Some(idx), Some(site)) = (from_list, ask.preferred_site)
            && (decided.key.starts_with("engines.") || &*decided.key == "inventory order")
        {
            decided = RuleRef {
                key: format!("{} + {}[{idx}]", decided.key, site.key).into(),
                at: Some(site.at.clone()),
            };
        }
        st.rule = Some(decided);
        st.chosen = Some(pick);
    }

    /// The policy key that placed the node on the engine at `pos` of its sequence.
    fn decided_by(&self, ask: &Ask, pos: usize, is_fallback: bool) -> RuleRef {
        let r = self.resolved;
        match (ask.rule, &ask.pin) {
            (Some(rule), _) => RuleRef { key: rule.label.clone(), at: Some(rule.site.at.clone()) },
            (None, Some(pin)) => cite(pin.site),
            (None, None) if ask.table_op && !is_fallback => {
                RuleRef { key: "table ops run on the table engine".into(), at: None }
            }
            (None, None) if is_fallback => cite(r.site(Key::EnginesFallback)),
            (None, None) if r.order.is_empty() => {
                RuleRef { key: "inventory order".into(), at: None }
            }
            (None, None) => RuleRef {
                key: format!("engines.order[{pos}]").into(),
                at: Some(r.site(Key::EnginesOrder).at.clone()),
            },
        }
    }
}

/// Why a pinned kernel rules an engine out: the pin is another engine's, or this engine's
/// inventory entry lacks the kernel.
fn pin_rejection(ask: &Ask, pin: &Pin, caps: &Capabilities) -> Option<Rejection> {
    let (e, pk) = (caps.engine.as_str(), pin.kernel);
    if pk.engine() != e {
        let why = format!("{} is pinned to {pk} ({})", ask.f.op, pin.site.key);
        return Some(ask.reject(e, ReasonCode::KernelNotPinned, why, Some(pin.site), None));
    }
    if caps.kernel(pk.as_str()).is_some() {
        return None;
    }
    let why = match caps.unavailable_kernels.get(pk.as_str()) {
        Some(why) => format!("pinned kernel {pk} is unavailable here: {why}"),
        None => format!("pinned kernel {pk} is not in {e}'s inventory entry"),
    };
    let code = ReasonCode::KernelUnavailable;
    Some(ask.reject(e, code, why, Some(pin.site), Some(pk.as_str())))
}

/// An engine's kernels for the node in preference order — the policy's list, then the
/// engine's own order with its degraded kernels last (a policy that prefers or pins one
/// has placed it above already) — and a rejection for each preferred kernel this machine
/// lacks, so the explanation says why the next one ran instead.
fn ordered_kernels<'c>(
    ask: &Ask,
    e: &str,
    caps: &'c Capabilities,
    kernels: &[usize],
) -> (Vec<&'c KernelCaps>, Vec<Rejection>) {
    let mut ordered: Vec<&KernelCaps> = Vec::with_capacity(kernels.len());
    let mut missing = Vec::new();
    for p in ask.preferred {
        if let Some(&k) = kernels.iter().find(|&&k| caps.kernels[k].name == p.as_str()) {
            ordered.push(&caps.kernels[k]);
        } else if let Some(why) = caps.unavailable_kernels.get(p.as_str()) {
            let why = format!("{p} is unavailable here: {why}");
            let code = ReasonCode::KernelUnavailable;
            missing.push(ask.reject(e, code, why, ask.preferred_site, Some(p.as_str())));
        }
    }
    for degraded in [false, true] {
        for &k in kernels {
            let kc = &caps.kernels[k];
            if kc.degraded.is_some() == degraded && !ordered.iter().any(|o| o.name == kc.name) {
                ordered.push(kc);
            }
        }
    }
    (ordered, missing)
}

/// The device a kernel runs on: the engine's first device of the kind the kernel says (its
/// inventory entry's `device`, else the catalogue's: `ort.cuda` → a cuda device); a kernel
/// the catalogue does not know runs on the engine's first device. `Err`: the engine lists
/// no device of that kind.
fn device_for<'c>(
    caps: &'c Capabilities,
    k: &KernelCaps,
) -> Result<&'c xpu_engine::Device, String> {
    match k.device_kind() {
        Some(kind) => caps.devices.iter().find(|d| d.id.kind == kind).ok_or_else(|| {
            format!("{} runs on a {kind} device and {} lists none", k.name, caps.engine)
        }),
        None => caps.devices.first().ok_or_else(|| format!("{} lists no device", caps.engine)),
    }
}
