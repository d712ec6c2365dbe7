//! A policy resolved once, after it is loaded and validated, into the typed form the
//! planner reads: op names as [`Op`], classes as [`OpClass`], dtypes as [`DType`],
//! kernels as [`KernelId`], node globs compiled, and every policy key the planner may cite
//! together with where it is set. The planner matches nodes against these values and never
//! parses or formats a policy string per node.
//!
//! Selectors that do not parse cannot reach here from a loaded policy (validation refuses
//! them); should one arrive anyway it matches no node, as the string comparison it
//! replaces did.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use xpu_engine::KernelId;
use xpu_ir::{DType, Op, OpClass};

use crate::load::Policy;
use crate::lock::Evidence;
use crate::spec::{Choose, Determinism, Fallback, KernelChoice, PrecisionName, Rule, RuleMatch};

/// A policy key and where it is set (`file:line`), as an explanation cites it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cited {
    pub key: Arc<str>,
    pub at: Arc<str>,
}

impl Cited {
    fn of(policy: &Policy, key: &str) -> Cited {
        Cited { at: policy.origin(key).short().into(), key: key.into() }
    }
}

/// The policy-wide keys the planner cites, each resolved to its location once.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    EnginesOrder,
    EnginesDeny,
    EnginesFallback,
    FallbackBudget,
    PrecisionAllow,
    PrecisionDefault,
    KeepFp32,
    PrecisionAccumulate,
    Determinism,
    Capture,
    MemoryLimit,
    MemoryPool,
    MemoryReuse,
    PinnedHost,
    EnginesChoose,
    MeasuredLock,
    MeasuredMinSamples,
    MeasuredExploreRuns,
    MeasuredMaxSlowdown,
}

impl Key {
    pub const ALL: [Key; 19] = [
        Key::EnginesOrder,
        Key::EnginesDeny,
        Key::EnginesFallback,
        Key::FallbackBudget,
        Key::PrecisionAllow,
        Key::PrecisionDefault,
        Key::KeepFp32,
        Key::PrecisionAccumulate,
        Key::Determinism,
        Key::Capture,
        Key::MemoryLimit,
        Key::MemoryPool,
        Key::MemoryReuse,
        Key::PinnedHost,
        Key::EnginesChoose,
        Key::MeasuredLock,
        Key::MeasuredMinSamples,
        Key::MeasuredExploreRuns,
        Key::MeasuredMaxSlowdown,
    ];

    /// The key as a policy file spells it.
    pub fn name(self) -> &'static str {
        match self {
            Key::EnginesOrder => "engines.order",
            Key::EnginesDeny => "engines.deny",
            Key::EnginesFallback => "engines.fallback",
            Key::FallbackBudget => "engines.fallback_budget",
            Key::PrecisionAllow => "precision.allow",
            Key::PrecisionDefault => "precision.default",
            Key::KeepFp32 => "precision.keep_fp32",
            Key::PrecisionAccumulate => "precision.accumulate",
            Key::Determinism => "execution.determinism",
            Key::Capture => "execution.capture",
            Key::MemoryLimit => "memory.limit",
            Key::MemoryPool => "memory.pool",
            Key::MemoryReuse => "memory.reuse",
            Key::PinnedHost => "memory.pinned_host",
            Key::EnginesChoose => "engines.choose",
            Key::MeasuredLock => "measured.lock",
            Key::MeasuredMinSamples => "measured.min_samples",
            Key::MeasuredExploreRuns => "measured.explore_runs",
            Key::MeasuredMaxSlowdown => "measured.max_slowdown",
        }
    }
}

/// Ops named one by one or by their class (`keep_fp32`; a `[kernels]` key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpSet {
    pub ops: Vec<Op>,
    pub classes: Vec<OpClass>,
}

impl OpSet {
    fn of<'a>(names: impl IntoIterator<Item = &'a String>) -> OpSet {
        let mut set = OpSet::default();
        for name in names {
            // A name may be both an op and a class (`softmax`): it selects as either.
            set.ops.extend(Op::from_str(name).ok());
            set.classes.extend(OpClass::from_str(name).ok());
        }
        set
    }

    pub fn contains(&self, op: Op) -> bool {
        self.ops.contains(&op) || self.classes.contains(&op.class())
    }
}

/// What a rule's `when` matches, typed.
#[derive(Clone, Debug)]
pub struct Selector {
    pub op: Option<Op>,
    pub class: Option<OpClass>,
    pub node: Option<globset::GlobMatcher>,
    pub min_flops: Option<f64>,
    pub dtype: Option<DType>,
    /// A condition that did not resolve: the rule matches nothing.
    pub unmatchable: bool,
}

impl Selector {
    fn of(w: &RuleMatch) -> Selector {
        let op = w.op.as_deref().map(Op::from_str);
        let class = w.class.as_deref().map(OpClass::from_str);
        let node = w.node.as_deref().map(globset::Glob::new);
        let dtype = w.dtype.as_deref().map(DType::from_str);
        let unmatchable = matches!(op, Some(Err(_)))
            || matches!(class, Some(Err(_)))
            || matches!(node, Some(Err(_)))
            || matches!(dtype, Some(Err(_)));
        Selector {
            op: op.and_then(Result::ok),
            class: class.and_then(Result::ok),
            node: node.and_then(Result::ok).map(|g| g.compile_matcher()),
            min_flops: w.min_flops,
            dtype: dtype.and_then(Result::ok),
            unmatchable,
        }
    }

    /// Whether a node matches: its op, its name, its estimated FLOPs and its first float
    /// dtype (every given condition must hold; a glob needs a named node).
    pub fn matches(&self, op: Op, name: Option<&str>, flops: Option<u64>, dtype: DType) -> bool {
        !self.unmatchable
            && self.op.is_none_or(|o| o == op)
            && self.class.is_none_or(|c| c == op.class())
            && self.node.as_ref().is_none_or(|g| name.is_some_and(|n| g.is_match(n)))
            && self.min_flops.is_none_or(|m| flops.is_some_and(|f| f as f64 >= m))
            && self.dtype.is_none_or(|d| d == dtype)
    }
}

/// One `[[rule]]`, typed, with the keys an explanation cites for it.
#[derive(Clone, Debug)]
pub struct ResolvedRule {
    pub index: usize,
    /// `rule[2] "big-matmuls"`, or `rule[2]` for an unnamed rule.
    pub label: Arc<str>,
    /// `rule[2]` and where the rule is.
    pub site: Cited,
    pub kernel_site: Cited,
    pub precision_site: Cited,
    pub when: Selector,
    pub engine: Option<Arc<str>>,
    pub kernel: Option<KernelId>,
    pub precision: Option<PrecisionName>,
    pub choose: Option<Choose>,
}

impl ResolvedRule {
    fn of(policy: &Policy, index: usize, r: &Rule) -> ResolvedRule {
        let key = format!("rule[{index}]");
        ResolvedRule {
            index,
            label: match &r.name {
                Some(n) => format!("{key} {n:?}").into(),
                None => key.as_str().into(),
            },
            site: Cited::of(policy, &key),
            kernel_site: Cited::of(policy, &format!("{key}.kernel")),
            precision_site: Cited::of(policy, &format!("{key}.precision")),
            when: Selector::of(&r.when),
            engine: r.engine.as_deref().map(Arc::from),
            kernel: r.kernel.as_deref().map(KernelId::new),
            precision: r.precision,
            choose: r.choose,
        }
    }

    /// Whether the rule decides the engine (an `engine` or a `kernel`), not only precision.
    pub fn places(&self) -> bool {
        self.engine.is_some() || self.kernel.is_some()
    }
}

/// A `[kernels]` entry: one kernel pinned, or kernels preferred in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelPick {
    Pinned(KernelId),
    Prefer(Vec<KernelId>),
}

/// The `[kernels]` entry that applies to an op, and how it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSelection {
    /// `kernels.matmul` and where it is set.
    pub site: Cited,
    /// Found through the op's class, not its own name: a pin by class covers only the ops
    /// of the class the pinned kernel runs.
    pub by_class: bool,
    pub pick: KernelPick,
}

/// A policy in the form the planner reads. Built by [`Policy`]'s loader; see the module doc.
#[derive(Clone, Debug, Default)]
pub struct ResolvedPolicy {
    /// `[engines] order` as given (empty: the inventory's order less denied engines).
    pub order: Vec<Arc<str>>,
    pub deny: Vec<Arc<str>>,
    pub fallback: Fallback,
    pub bitwise: bool,
    pub allow: Vec<PrecisionName>,
    pub default_precision: Option<PrecisionName>,
    pub keep_fp32: OpSet,
    pub rules: Vec<ResolvedRule>,
    /// `[engines] choose`; a rule's `choose` overrides it for its nodes.
    pub choose: Choose,
    /// The lock `[measured] lock` names, as read when the policy was loaded.
    pub evidence: Option<Arc<Evidence>>,
    pub min_samples: u32,
    /// `[measured] explore_runs`, 0 where the policy asks for determinism (a run that must
    /// repeat itself never tries another candidate).
    pub explore_runs: u32,
    pub max_slowdown: f64,
    kernels_by_op: HashMap<Op, KernelSelection>,
    kernels_by_class: HashMap<OpClass, KernelSelection>,
    sites: HashMap<Key, Cited>,
}

impl ResolvedPolicy {
    pub(crate) fn of(policy: &Policy, evidence: Option<Arc<Evidence>>) -> ResolvedPolicy {
        let spec = &policy.spec;
        let mut kernels_by_op = HashMap::new();
        let mut kernels_by_class = HashMap::new();
        for (key, choice) in &spec.kernels {
            let pick = match choice {
                KernelChoice::Pinned(k) => KernelPick::Pinned(KernelId::new(k)),
                KernelChoice::Prefer(ks) => {
                    KernelPick::Prefer(ks.iter().map(|k| KernelId::new(k)).collect())
                }
            };
            let site = Cited::of(policy, &format!("kernels.{key}"));
            if let Ok(op) = Op::from_str(key) {
                let by_op =
                    KernelSelection { site: site.clone(), by_class: false, pick: pick.clone() };
                kernels_by_op.insert(op, by_op);
            }
            if let Ok(class) = OpClass::from_str(key) {
                kernels_by_class.insert(class, KernelSelection { site, by_class: true, pick });
            }
        }
        ResolvedPolicy {
            order: spec.engines.order.iter().map(|e| Arc::from(e.as_str())).collect(),
            deny: spec.engines.deny.iter().map(|e| Arc::from(e.as_str())).collect(),
            fallback: spec.engines.fallback,
            bitwise: spec.execution.determinism == Determinism::Bitwise,
            allow: spec.precision.allow.clone(),
            default_precision: spec.precision.default,
            keep_fp32: OpSet::of(&spec.precision.keep_fp32),
            rules: spec
                .rules
                .iter()
                .enumerate()
                .map(|(i, r)| ResolvedRule::of(policy, i, r))
                .collect(),
            choose: spec.engines.choose,
            evidence,
            min_samples: spec.measured.min_samples,
            explore_runs: match spec.execution.determinism {
                Determinism::Off => spec.measured.explore_runs,
                _ => 0,
            },
            max_slowdown: spec.measured.max_slowdown,
            kernels_by_op,
            kernels_by_class,
            sites: Key::ALL.into_iter().map(|k| (k, Cited::of(policy, k.name()))).collect(),
        }
    }

    /// Where a policy-wide key is set.
    pub fn site(&self, key: Key) -> &Cited {
        &self.sites[&key]
    }

    /// The first rule that matches a node (see [`Selector::matches`]).
    pub fn rule_for(
        &self,
        op: Op,
        name: Option<&str>,
        flops: Option<u64>,
        dtype: DType,
    ) -> Option<&ResolvedRule> {
        self.rules.iter().find(|r| r.when.matches(op, name, flops, dtype))
    }

    /// The `[kernels]` entry for an op: its own name first, then its class.
    pub fn kernels_for(&self, op: Op) -> Option<&KernelSelection> {
        self.kernels_by_op.get(&op).or_else(|| self.kernels_by_class.get(&op.class()))
    }

    /// How nodes a rule (or none) matches are chosen.
    pub fn choose_for(&self, rule: Option<&ResolvedRule>) -> Choose {
        rule.and_then(|r| r.choose).unwrap_or(self.choose)
    }

    /// Whether any node may be chosen by measurement.
    pub fn measures(&self) -> bool {
        self.choose == Choose::Measured
            || self.rules.iter().any(|r| r.choose == Some(Choose::Measured))
    }

    pub fn is_denied(&self, engine: &str) -> bool {
        self.deny.iter().any(|d| &**d == engine)
    }

    pub fn in_order(&self, engine: &str) -> bool {
        self.order.iter().any(|o| &**o == engine)
    }
}
