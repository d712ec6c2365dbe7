//! The planner: a pure function of (graph, policy, inventory, symbol bindings). For every
//! node it walks the candidates — engines in policy order, then every other engine of the
//! inventory; per engine its kernels in preference order — and rejects each that cannot or
//! may not run the node with a [`ReasonCode`] and the policy location behind it. Constants
//! follow their first consumer. Nodes are then grouped into engine-contiguous partitions in
//! topological order, precision casts are inserted where a node's compute precision differs
//! from its operands', transfers are added where a partition reads a value from another
//! device, and the memory plan's peak is checked against `[memory] limit`.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::sync::Arc;

use xpu_engine::{
    Assignment, Capabilities, DeviceId, EngineOptions, Inventory, KernelCaps, TransferDirection,
};
use xpu_ir::passes::cost::node_flops;
use xpu_ir::passes::{Evaluator, plan_memory, value_bytes};
use xpu_ir::{DType, Graph, NodeId, Op, OpClass, ValueId};
use xpu_policy::Policy;
use xpu_policy::spec::{Fallback, KernelChoice, OnExceeded, PrecisionName, Rule};

use crate::model::*;
use crate::reason::ReasonCode;

/// A plan that cannot be made: the errors, and the explanation of every decision so far.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .errors.iter().map(|e| format!("{}: {}", e.code.name(), e.message)).collect::<Vec<_>>().join("\n"))]
pub struct PlanFailure {
    pub errors: Vec<Note>,
    pub explanation: Box<Explanation>,
}

/// Plans `graph` under `policy` for `inventory` with no symbol bindings.
pub fn plan(
    graph: &Graph,
    policy: &Policy,
    inventory: &Inventory,
) -> Result<(CapturePlan, Explanation), PlanFailure> {
    plan_with(graph, policy, inventory, &BTreeMap::new())
}

/// Plans with symbolic dims bound (`N` → 64) for FLOP estimates, transfer sizes and memory.
pub fn plan_with(
    graph: &Graph,
    policy: &Policy,
    inventory: &Inventory,
    bindings: &BTreeMap<String, u64>,
) -> Result<(CapturePlan, Explanation), PlanFailure> {
    let hash = graph.content_hash();
    plan_shared(&Arc::new(graph.clone()), &hash, policy, inventory, bindings, None)
}

/// [`plan_with`] for a graph the caller already shares and has hashed
/// ([`Graph::content_hash`]): a plan that inserts no casts keeps a reference to the graph
/// instead of a copy, and the hash is not recomputed (the plan cache, which hashes for its
/// key, and the daemon, which hashes a program once at submission, use this).
///
/// The graph first goes through the pass pipeline `execution.graph_optimization` asks for
/// ([`crate::passes`]), constants folded through `eval` when given; the plan is of the
/// rewritten graph, and the explanation records each pass.
pub fn plan_shared(
    graph: &Arc<Graph>,
    graph_hash: &str,
    policy: &Policy,
    inventory: &Inventory,
    bindings: &BTreeMap<String, u64>,
    eval: Option<&dyn Evaluator>,
) -> Result<(CapturePlan, Explanation), PlanFailure> {
    let pipeline = crate::passes::pipeline(policy.spec.execution.graph_optimization);
    let (rewritten, records) = crate::passes::optimize(graph, pipeline, eval);
    let graph = rewritten.map(Arc::new).unwrap_or_else(|| graph.clone());
    let result = Planner::new(&graph, policy, inventory, bindings).run(&graph, graph_hash);
    let passes: Vec<String> = pipeline.iter().map(|p| p.to_string()).collect();
    match result {
        Ok((mut plan, mut explanation)) => {
            plan.passes = passes;
            explanation.passes = records;
            Ok((plan, explanation))
        }
        Err(mut failure) => {
            failure.explanation.passes = records;
            Err(failure)
        }
    }
}

struct Planner<'a> {
    graph: &'a Graph,
    policy: &'a Policy,
    inventory: &'a Inventory,
    bindings: &'a BTreeMap<String, u64>,
    /// Effective engine order (policy order, or the inventory's minus denied engines).
    order: Vec<String>,
    rules: Vec<(Option<globset::GlobMatcher>, &'a Rule)>,
    kernels_by_op: HashMap<(usize, Op), Vec<usize>>,
    at_cache: HashMap<String, Option<Arc<str>>>,
    cast_reasons: HashMap<DType, Arc<str>>,
    walks: HashMap<WalkKey, Walk>,
    /// Where a node's precision came from: graph dtype, keep_fp32, default, then per rule.
    precision_refs: Vec<RuleRef>,
}

/// Facts about one node the candidate walk needs.
struct NodeFacts {
    op: Op,
    /// Precision the node computes at (float nodes) and the dtype kernels must accept.
    precision: Option<PrecisionName>,
    kernel_dtype: DType,
    /// The dtypes of the node's inputs and outputs, one bit per `DType::ALL` entry.
    operands: u32,
    /// The precision came from `precision.default`: a kernel that lacks it may run the node
    /// at another allowed precision instead (a precision candidate, recorded).
    alternates: bool,
    flops: Option<u64>,
    working_bytes: Option<u64>,
}

#[derive(Clone)]
struct Walk {
    chosen: Option<(Choice, usize)>,
    /// The precision of the chosen candidate, and why when it is not the node's target.
    precision: Option<PrecisionName>,
    precision_note: Option<RuleRef>,
    rule: Option<RuleRef>,
    fallback: Option<FallbackNote>,
    rejected: std::sync::Arc<Vec<Rejection>>,
}

struct WalkBuild {
    chosen: Option<(Choice, usize)>,
    precision: Option<PrecisionName>,
    precision_note: Option<RuleRef>,
    rule: Option<RuleRef>,
    fallback: Option<FallbackNote>,
    rejected: Vec<Rejection>,
}

/// Everything a candidate walk depends on: nodes with equal keys get equal walks.
#[derive(Clone, PartialEq, Eq, Hash)]
struct WalkKey {
    op: Op,
    precision: Option<PrecisionName>,
    kernel_dtype: DType,
    operands: u32,
    alternates: bool,
    rule: Option<usize>,
    /// Bit d: the node's tensors fit the memory of device d (devices of all engines in
    /// inventory order).
    fits: u64,
}

impl<'a> Planner<'a> {
    fn new(
        graph: &'a Graph,
        policy: &'a Policy,
        inventory: &'a Inventory,
        bindings: &'a BTreeMap<String, u64>,
    ) -> Planner<'a> {
        let spec = &policy.spec;
        let order = policy.effective_order(inventory);
        let rules = spec
            .rules
            .iter()
            .map(|r| {
                let glob = r
                    .when
                    .node
                    .as_ref()
                    .and_then(|g| globset::Glob::new(g).ok())
                    .map(|g| g.compile_matcher());
                (glob, r)
            })
            .collect();
        let mut p = Planner {
            graph,
            policy,
            inventory,
            bindings,
            order,
            rules,
            kernels_by_op: HashMap::new(),
            at_cache: HashMap::new(),
            cast_reasons: HashMap::new(),
            walks: HashMap::new(),
            precision_refs: Vec::new(),
        };
        let mut refs = vec![RuleRef { key: "graph dtype".into(), at: None }];
        for key in ["precision.keep_fp32", "precision.default"] {
            refs.push(RuleRef { key: key.into(), at: p.at(key) });
        }
        for i in 0..spec.rules.len() {
            let key = format!("rule[{i}].precision");
            refs.push(RuleRef { at: p.at(&key), key: key.into() });
        }
        p.precision_refs = refs;
        p
    }

    /// The policy key behind a rejection and where it is set.
    fn loc(&mut self, key: &str) -> Option<(Arc<str>, Option<Arc<str>>)> {
        let at = self.at(key);
        Some((Arc::from(key), at))
    }

    fn at(&mut self, key: &str) -> Option<Arc<str>> {
        if let Some(a) = self.at_cache.get(key) {
            return a.clone();
        }
        let a = Some(Arc::from(self.policy.origin(key).short()));
        self.at_cache.insert(key.to_string(), a.clone());
        a
    }

    fn engine_kernels(&mut self, e: usize, op: Op) -> Vec<usize> {
        let caps = &self.inventory.engines[e];
        self.kernels_by_op
            .entry((e, op))
            .or_insert_with(|| {
                caps.kernels
                    .iter()
                    .enumerate()
                    .filter(|(_, k)| k.runs_op(op))
                    .map(|(i, _)| i)
                    .collect()
            })
            .clone()
    }

    fn facts(&self, id: NodeId) -> (NodeFacts, Option<RuleRef>, Option<usize>) {
        let g = self.graph;
        let n = g.node(id);
        let flops = node_flops(g, id, self.bindings);
        let primary = n
            .input_values()
            .map(|v| g.ty(v).dtype)
            .find(|d| d.is_float())
            .or_else(|| n.input_values().next().map(|v| g.ty(v).dtype))
            .or_else(|| n.outputs.first().map(|&o| g.ty(o).dtype))
            .unwrap_or(DType::F32);
        let rule = self.matching_rule(id, primary, flops);
        let spec = &self.policy.spec;
        let retypable =
            primary.is_float() && !matches!(n.op, Op::Cast | Op::CastLike | Op::Constant);
        let (precision, from) = if !primary.is_float() {
            (None, None)
        } else if !retypable {
            (PrecisionName::of_dtype(primary), Some(self.precision_refs[0].clone()))
        } else if let Some(p) = rule.and_then(|i| self.rules[i].1.precision) {
            (Some(p), Some(self.precision_refs[3 + rule.unwrap_or(0)].clone()))
        } else if spec
            .precision
            .keep_fp32
            .iter()
            .any(|k| k == n.op.name() || k == n.op.class().name())
        {
            (Some(PrecisionName::Fp32), Some(self.precision_refs[1].clone()))
        } else if let Some(d) = spec.precision.default {
            (Some(d), Some(self.precision_refs[2].clone()))
        } else {
            (PrecisionName::of_dtype(primary), Some(self.precision_refs[0].clone()))
        };
        let kernel_dtype = precision.map(|p| p.kernel_dtype()).unwrap_or(primary);
        let working_bytes = n
            .input_values()
            .chain(n.outputs.iter().copied())
            .map(|v| value_bytes(g, v, self.bindings))
            .sum::<Option<u64>>();
        let alternates = from.as_ref().is_some_and(|r| &*r.key == "precision.default");
        (
            NodeFacts {
                op: n.op,
                precision,
                kernel_dtype,
                operands: operand_bits(g, n),
                alternates,
                flops,
                working_bytes,
            },
            from,
            rule,
        )
    }

    fn matching_rule(&self, id: NodeId, dtype: DType, flops: Option<u64>) -> Option<usize> {
        let n = self.graph.node(id);
        self.rules.iter().position(|(glob, r)| {
            let w = &r.when;
            w.op.as_ref().is_none_or(|o| o == n.op.name())
                && w.class.as_ref().is_none_or(|c| c == n.op.class().name())
                && glob
                    .as_ref()
                    .is_none_or(|g| n.name.as_ref().is_some_and(|name| g.is_match(name)))
                && w.node.is_none() == glob.is_none()
                && w.min_flops.is_none_or(|m| flops.is_some_and(|f| f as f64 >= m))
                && w.dtype.as_ref().is_none_or(|d| DType::from_str(d).ok() == Some(dtype))
        })
    }

    /// The `[kernels]` entry for an op: its op name first, then its class.
    fn kernel_choice(&self, op: Op) -> Option<(String, &'a KernelChoice)> {
        let k = &self.policy.spec.kernels;
        k.get(op.name())
            .map(|c| (op.name().to_string(), c))
            .or_else(|| k.get(op.class().name()).map(|c| (op.class().name().to_string(), c)))
    }

    /// The device a kernel runs on: the engine's first device of the kind the kernel says
    /// (its inventory entry's `device`, else the catalogue's: `ort.cuda` → a cuda device); a
    /// kernel the catalogue does not know runs on the engine's first device. `Err`: the engine lists no device of that kind.
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

    /// The candidate walk for a node, shared with every earlier node of the same key.
    fn walk(&mut self, f: &NodeFacts, rule_idx: Option<usize>) -> Walk {
        // One bit per (engine, device), in inventory order.
        let mut fits = 0u64;
        let devices = self.inventory.engines.iter().flat_map(|e| &e.devices);
        for (i, d) in devices.enumerate().take(64) {
            if d.memory_bytes.is_none_or(|l| f.working_bytes.is_none_or(|b| b <= l)) {
                fits |= 1 << i;
            }
        }
        let key = WalkKey {
            op: f.op,
            precision: f.precision,
            kernel_dtype: f.kernel_dtype,
            operands: f.operands,
            alternates: f.alternates,
            rule: rule_idx,
            fits,
        };
        if let Some(w) = self.walks.get(&key) {
            return w.clone();
        }
        // A default precision changes only when no candidate runs the node at it.
        let mut w = self.walk_uncached(f, rule_idx, false);
        if w.chosen.is_none() && f.alternates {
            let again = self.walk_uncached(f, rule_idx, true);
            if again.chosen.is_some() {
                w = again;
            }
        }
        self.walks.insert(key, w.clone());
        w
    }

    fn walk_uncached(
        &mut self,
        f: &NodeFacts,
        rule_idx: Option<usize>,
        other_precisions: bool,
    ) -> Walk {
        let spec = &self.policy.spec;
        let rule = rule_idx.map(|i| (i, self.rules[i].1));
        let rule_key = |i: usize, r: &Rule| match &r.name {
            Some(n) => format!("rule[{i}] {n:?}"),
            None => format!("rule[{i}]"),
        };
        let prec_name = f.precision.map(|p| p.name().to_string());
        // Pinned kernel: a rule's kernel, else `[kernels]` with one kernel.
        let pinned: Option<(String, String)> = match rule
            .and_then(|(i, r)| r.kernel.clone().map(|k| (k, format!("rule[{i}].kernel"))))
        {
            Some(p) => Some(p),
            None => match self.kernel_choice(f.op) {
                // A pin by op class covers the ops of the class the kernel runs: an inventory
                // whose entry for the kernel lacks this op (conv_transpose under
                // `conv = "cpu.im2col_conv"`) leaves the op unpinned. A pin by op name, or of a
                // kernel this inventory lacks, stays strict.
                Some((key, KernelChoice::Pinned(k)))
                    if key != f.op.name()
                        && self
                            .inventory
                            .engines
                            .iter()
                            .filter_map(|e| e.kernel(k))
                            .any(|kc| !kc.runs_op(f.op)) =>
                {
                    None
                }
                Some((key, KernelChoice::Pinned(k))) => Some((k.clone(), format!("kernels.{key}"))),
                _ => None,
            },
        };
        // The first choice: the rule's engine, else the pinned kernel's, else the policy order
        // — except for table ops, whose data only the `table` engine holds: they go there
        // unless a rule or pin says otherwise, which is no fallback from the order.
        let table_op = f.op.class() == OpClass::Table;
        let first_choice: Vec<String> = match rule.and_then(|(_, r)| r.engine.clone()) {
            Some(e) => vec![e],
            None => match &pinned {
                Some((k, _)) => vec![xpu_engine::catalog::engine_of(k).to_string()],
                None if table_op => vec!["table".to_string()],
                None => self.order.clone(),
            },
        };
        let (preferred, pref_key): (Vec<String>, Option<String>) = match self.kernel_choice(f.op) {
            Some((key, KernelChoice::Prefer(ks))) => (ks.clone(), Some(format!("kernels.{key}"))),
            _ => (Vec::new(), None),
        };
        let pref_loc = pref_key.as_deref().and_then(|k| self.loc(k));
        // The engine sequence: the first choice, then the policy order, then the rest.
        let mut sequence: Vec<String> = first_choice.clone();
        for e in self.order.iter().chain(self.inventory.engines.iter().map(|c| &c.engine)) {
            if !sequence.contains(e) {
                sequence.push(e.clone());
            }
        }
        let bitwise = spec.execution.determinism == xpu_policy::spec::Determinism::Bitwise;
        let allowed_precision = f.precision.is_none_or(|p| spec.precision.allow.contains(&p));
        let mut out = WalkBuild {
            chosen: None,
            precision: None,
            precision_note: None,
            rule: None,
            fallback: None,
            rejected: Vec::new(),
        };
        let mut first_rejection: Option<(ReasonCode, String)> = None;
        for (pos, e) in sequence.iter().enumerate() {
            let in_first = first_choice.contains(e);
            let reject = |code: ReasonCode,
                          detail: String,
                          loc: Option<(Arc<str>, Option<Arc<str>>)>,
                          kernel: Option<String>| {
                let (key, at) = match loc {
                    Some((k, a)) => (Some(k), a),
                    None => (None, None),
                };
                Rejection {
                    engine: e.clone(),
                    kernel,
                    precision: prec_name.clone(),
                    code,
                    detail,
                    key,
                    at,
                }
            };
            if spec.engines.deny.contains(e) {
                let at = self.loc("engines.deny");
                out.rejected.push(reject(
                    ReasonCode::PolicyDenied,
                    format!("{e} is denied"),
                    at,
                    None,
                ));
                continue;
            }
            if !in_first {
                if let Some((i, r)) = rule.filter(|(_, r)| r.engine.is_some() || r.kernel.is_some())
                {
                    let at = self.loc(&format!("rule[{i}]"));
                    out.rejected.push(reject(
                        ReasonCode::RuleOverride,
                        format!("{} sends this node to {}", rule_key(i, r), first_choice[0]),
                        at,
                        None,
                    ));
                    continue;
                }
                if !spec.engines.order.is_empty() && !spec.engines.order.contains(e) {
                    let at = self.loc("engines.order");
                    out.rejected.push(reject(
                        ReasonCode::NotInOrder,
                        format!("{e} is not in engines.order"),
                        at,
                        None,
                    ));
                    continue;
                }
            }
            let Some(ei) = self.inventory.engines.iter().position(|c| &c.engine == e) else {
                let detail = format!("{e} is not in inventory {}", self.inventory_name());
                first_rejection.get_or_insert((ReasonCode::EngineUnavailable, detail.clone()));
                out.rejected.push(reject(ReasonCode::EngineUnavailable, detail, None, None));
                continue;
            };
            let caps = &self.inventory.engines[ei];
            if !caps.availability.is_available() {
                let detail = format!("{e}: {}", caps.availability);
                first_rejection.get_or_insert((ReasonCode::EngineUnavailable, detail.clone()));
                out.rejected.push(reject(ReasonCode::EngineUnavailable, detail, None, None));
                continue;
            }
            let kernels = self.engine_kernels(ei, f.op);
            let caps = &self.inventory.engines[ei];
            if kernels.is_empty() {
                let detail = format!("no {e} kernel runs {}", f.op);
                first_rejection.get_or_insert((ReasonCode::OpUnsupported, detail.clone()));
                out.rejected.push(reject(ReasonCode::OpUnsupported, detail, None, None));
                continue;
            }
            if let Some((pk, key)) = &pinned {
                if xpu_engine::catalog::engine_of(pk) != e {
                    let at = self.loc(key);
                    let detail = format!("{} is pinned to {pk} ({key})", f.op);
                    first_rejection.get_or_insert((ReasonCode::KernelNotPinned, detail.clone()));
                    out.rejected.push(reject(ReasonCode::KernelNotPinned, detail, at, None));
                    continue;
                }
                if caps.kernel(pk).is_none() {
                    let at = self.loc(key);
                    let detail = match caps.unavailable_kernels.get(pk.as_str()) {
                        Some(why) => format!("pinned kernel {pk} is unavailable here: {why}"),
                        None => format!("pinned kernel {pk} is not in {e}'s inventory entry"),
                    };
                    first_rejection.get_or_insert((ReasonCode::KernelUnavailable, detail.clone()));
                    out.rejected.push(reject(
                        ReasonCode::KernelUnavailable,
                        detail,
                        at,
                        Some(pk.clone()),
                    ));
                    continue;
                }
            }
            // Kernels in preference order: the policy's list, then the engine's own order.
            let mut ordered: Vec<&KernelCaps> = Vec::with_capacity(kernels.len());
            let mut missing_preferred = Vec::new();
            for p in &preferred {
                if let Some(&k) = kernels.iter().find(|&&k| &caps.kernels[k].name == p) {
                    ordered.push(&caps.kernels[k]);
                } else if let Some(why) = caps.unavailable_kernels.get(p.as_str()) {
                    // A preferred kernel this machine lacks: the explanation says why the
                    // next one ran instead.
                    missing_preferred.push(reject(
                        ReasonCode::KernelUnavailable,
                        format!("{p} is unavailable here: {why}"),
                        pref_loc.clone(),
                        Some(p.clone()),
                    ));
                }
            }
            // The engine's own order, its degraded kernels last (a policy that prefers or
            // pins one has placed it above already).
            for degraded in [false, true] {
                for &k in &kernels {
                    let kc = &caps.kernels[k];
                    if kc.degraded.is_some() == degraded
                        && !ordered.iter().any(|o| o.name == kc.name)
                    {
                        ordered.push(kc);
                    }
                }
            }
            let mut engine_rejections = missing_preferred;
            let mut engine_pick: Option<(Choice, usize)> = None;
            for k in ordered {
                let kname = Some(k.name.clone());
                if let Some((pk, key)) = &pinned
                    && &k.name != pk
                {
                    let at = self.loc(key);
                    engine_rejections.push(reject(
                        ReasonCode::KernelNotPinned,
                        format!("{} is pinned to {pk}", f.op),
                        at,
                        kname,
                    ));
                    continue;
                }
                if !allowed_precision {
                    let at = self.loc("precision.allow");
                    engine_rejections.push(reject(
                        ReasonCode::PrecisionNotAllowed,
                        format!(
                            "the node computes at {} and precision.allow does not list it",
                            prec_name.clone().unwrap_or_default()
                        ),
                        at,
                        kname,
                    ));
                    continue;
                }
                if bitwise && !k.deterministic {
                    let at = self.loc("execution.determinism");
                    engine_rejections.push(reject(
                        ReasonCode::NotDeterministic,
                        format!("{} is not bitwise reproducible", k.name),
                        at,
                        kname,
                    ));
                    continue;
                }
                if let Some(d) = k.unheld_operand(operand_dtypes(f.operands)) {
                    engine_rejections.push(reject(
                        ReasonCode::DtypeUnsupported,
                        format!("{} cannot hold a {d} input or output", k.name),
                        None,
                        kname.clone(),
                    ));
                    continue;
                }
                let mut precision = f.precision;
                if !k.takes(f.op, f.kernel_dtype) {
                    // A default precision the kernel lacks: the next allowed storage precision
                    // it has is a candidate too; rule and keep_fp32 precisions are strict.
                    // Only as wide or wider (never silently narrower), narrowest first.
                    let width = |p: PrecisionName| p.storage().map(|d| d.size_bytes()).unwrap_or(0);
                    let target = f.precision.map(width).unwrap_or(0);
                    let undecided = engine_pick.is_none() && out.chosen.is_none();
                    let alternate = (other_precisions && undecided)
                        .then(|| {
                            let mut c: Vec<PrecisionName> = spec
                                .precision
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
                        })
                        .flatten();
                    engine_rejections.push(reject(
                        ReasonCode::DtypeUnsupported,
                        match alternate {
                            Some(p) => format!(
                                "{} does not accept {}; it runs the node at {p} (precision.allow)",
                                k.name, f.kernel_dtype
                            ),
                            None => format!("{} does not accept {}", k.name, f.kernel_dtype),
                        },
                        None,
                        kname.clone(),
                    ));
                    match alternate {
                        Some(p) => precision = Some(p),
                        None => continue,
                    }
                }
                let device = match Self::device_for(caps, k) {
                    Ok(d) => d,
                    Err(why) => {
                        engine_rejections.push(reject(
                            ReasonCode::KernelUnavailable,
                            why,
                            None,
                            kname,
                        ));
                        continue;
                    }
                };
                if let (Some(limit), Some(bytes)) = (device.memory_bytes, f.working_bytes)
                    && bytes > limit
                {
                    engine_rejections.push(reject(
                        ReasonCode::MemoryLimitExceeded,
                        format!("the node's tensors need {bytes} bytes; {} has {limit}", device.id),
                        None,
                        kname,
                    ));
                    continue;
                }
                let device = device.id;
                if engine_pick.is_some() || out.chosen.is_some() {
                    let winner = engine_pick
                        .as_ref()
                        .or(out.chosen.as_ref())
                        .map(|c| c.0.kernel.clone())
                        .unwrap_or_default();
                    // Degraded is the reason only when the winner is this engine's own kernel
                    // (an earlier engine's pick outranks every kernel here anyway).
                    let (code, detail) = match &k.degraded {
                        Some(why) if engine_pick.is_some() && !preferred.contains(&k.name) => (
                            ReasonCode::KernelDegraded,
                            format!("{} is degraded here ({why}); {winner} runs instead", k.name),
                        ),
                        _ => (ReasonCode::Outranked, format!("{winner} comes first")),
                    };
                    engine_rejections.push(reject(code, detail, None, kname));
                    continue;
                }
                if precision != f.precision {
                    let p = precision.map(|p| p.name()).unwrap_or("-");
                    out.precision_note = Some(RuleRef {
                        key: format!(
                            "precision.allow ({} lacks {}, runs {p})",
                            k.name, f.kernel_dtype
                        )
                        .into(),
                        at: self.at("precision.allow"),
                    });
                }
                out.precision = precision;
                engine_pick = Some((
                    Choice {
                        engine: e.as_str().into(),
                        kernel: k.name.as_str().into(),
                        precision: precision.map(|p| Arc::from(p.name())),
                        device,
                    },
                    ei,
                ));
            }
            if engine_pick.is_none()
                && let Some(r) = engine_rejections.first()
            {
                first_rejection.get_or_insert((r.code, r.detail.clone()));
            }
            out.rejected.extend(engine_rejections);
            if let Some(pick) = engine_pick {
                let is_fallback = first_choice.first().is_none_or(|f0| f0 != e);
                if is_fallback && spec.engines.fallback == Fallback::Deny {
                    let at = self.loc("engines.fallback");
                    out.rejected.push(reject(
                        ReasonCode::FallbackDenied,
                        format!(
                            "{e} would be a fallback from {}",
                            first_choice.first().cloned().unwrap_or_default()
                        ),
                        at,
                        Some(pick.0.kernel.to_string()),
                    ));
                    continue;
                }
                if is_fallback {
                    let (code, detail) =
                        first_rejection.clone().unwrap_or((ReasonCode::Unplaceable, String::new()));
                    out.fallback = Some(FallbackNote {
                        from: first_choice.first().cloned().unwrap_or_default(),
                        code,
                        detail,
                    });
                }
                out.rule = Some(match (rule, &pinned) {
                    (Some((i, r)), _) => {
                        RuleRef { key: rule_key(i, r).into(), at: self.at(&format!("rule[{i}]")) }
                    }
                    (None, Some((_, key))) => {
                        RuleRef { key: key.as_str().into(), at: self.at(key) }
                    }
                    (None, None) if table_op && !is_fallback => {
                        RuleRef { key: "table ops run on the table engine".into(), at: None }
                    }
                    (None, None) if is_fallback => {
                        RuleRef { key: "engines.fallback".into(), at: self.at("engines.fallback") }
                    }
                    (None, None) if spec.engines.order.is_empty() => {
                        RuleRef { key: "inventory order".into(), at: None }
                    }
                    (None, None) => RuleRef {
                        key: format!("engines.order[{pos}]").into(),
                        at: self.at("engines.order"),
                    },
                });
                // A kernel taken from a preference list names that list too (and its line).
                let from_list = preferred.iter().position(|k| *k == *pick.0.kernel);
                if let (Some(idx), Some(pk), Some(r)) = (from_list, &pref_key, &mut out.rule)
                    && (r.key.starts_with("engines.") || &*r.key == "inventory order")
                {
                    r.key = format!("{} + {pk}[{idx}]", r.key).into();
                    r.at = self.at(pk);
                }
                out.chosen = Some(pick);
                // Later engines are still enumerated, so the explanation lists them.
            }
        }
        Walk {
            chosen: out.chosen,
            precision: out.precision,
            precision_note: out.precision_note,
            rule: out.rule,
            fallback: out.fallback,
            rejected: std::sync::Arc::new(out.rejected),
        }
    }

    fn inventory_name(&self) -> String {
        if self.inventory.name.is_empty() {
            "(unnamed)".into()
        } else {
            self.inventory.name.clone()
        }
    }

    fn run(
        mut self,
        shared: &Arc<Graph>,
        graph_hash: &str,
    ) -> Result<(CapturePlan, Explanation), PlanFailure> {
        let g = self.graph;
        let spec = &self.policy.spec;
        let n_nodes = g.nodes.len();
        let mut decisions: Vec<Decision> = Vec::with_capacity(n_nodes);
        let mut choices: Vec<Option<(Choice, usize)>> = vec![None; n_nodes];
        let mut precisions: Vec<Option<PrecisionName>> = vec![None; n_nodes];
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        for id in g.node_ids() {
            let n = g.node(id);
            let (facts, precision_from, rule_idx) = self.facts(id);
            precisions[id.index()] = facts.precision;
            let mut d = Decision {
                node: id,
                name: n.name.clone(),
                op: std::borrow::Cow::Borrowed(n.op.name()),
                class: std::borrow::Cow::Borrowed(n.op.class().name()),
                flops: facts.flops,
                chosen: None,
                rule: None,
                precision_from,
                fallback: None,
                rejected: Default::default(),
            };
            if n.op == Op::Constant {
                decisions.push(d);
                continue;
            }
            let w = self.walk(&facts, rule_idx);
            if w.chosen.is_some() && w.precision != facts.precision {
                precisions[id.index()] = w.precision;
                d.precision_from = w.precision_note.clone();
            }
            d.rule = w.rule;
            d.fallback = w.fallback;
            d.rejected = w.rejected;
            if let Some((c, ei)) = w.chosen {
                d.chosen = Some(c.clone());
                choices[id.index()] = Some((c, ei));
            } else {
                errors.push(Note {
                    code: ReasonCode::Unplaceable,
                    message: format!(
                        "{}: no candidate left ({})",
                        n.label(id),
                        d.rejected
                            .iter()
                            .map(|r| format!("{} {}: {}", r.engine, r.code.name(), r.detail))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                    at: None,
                });
            }
            decisions.push(d);
        }
        // Constants follow their first consumer (they are embedded in its partition). The
        // uses of every value are listed at the first constant: a graph without constants
        // does not need them.
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
                .find_map(|u| choices[u.index()].clone());
            let placed = consumer.or_else(|| {
                self.inventory.engines.iter().position(|c| c.availability.is_available()).map(
                    |ei| {
                        let caps = &self.inventory.engines[ei];
                        (
                            Choice {
                                engine: caps.engine.as_str().into(),
                                kernel: "".into(),
                                precision: None,
                                device: caps.devices.first().map_or(DeviceId::HOST, |d| d.id),
                            },
                            ei,
                        )
                    },
                )
            });
            if let Some((mut c, ei)) = placed {
                c.kernel = self.inventory.engines[ei]
                    .kernels
                    .iter()
                    .find(|k| k.runs_op(Op::Constant))
                    .map(|k| Arc::from(k.name.as_str()))
                    .unwrap_or_else(|| "embedded".into());
                c.precision = None;
                let d = &mut decisions[id.index()];
                d.chosen = Some(c.clone());
                d.rule = Some(RuleRef { key: "constant follows its consumer".into(), at: None });
                choices[id.index()] = Some((c, ei));
            }
        }
        // Fallback budget: nodes and FLOPs.
        if let (Some(b), Fallback::Allow) = (&spec.engines.fallback_budget, spec.engines.fallback) {
            let placed: Vec<&Decision> = decisions.iter().filter(|d| d.op != "constant").collect();
            let fb: Vec<&&Decision> = placed.iter().filter(|d| d.fallback.is_some()).collect();
            let node_pct =
                if placed.is_empty() { 0.0 } else { 100.0 * fb.len() as f64 / placed.len() as f64 };
            let total_flops: u64 = placed.iter().filter_map(|d| d.flops).sum();
            let fb_flops: u64 = fb.iter().filter_map(|d| d.flops).sum();
            let flops_pct =
                if total_flops == 0 { 0.0 } else { 100.0 * fb_flops as f64 / total_flops as f64 };
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
            if !over.is_empty() {
                let at = self.at("engines.fallback_budget");
                let note =
                    Note { code: ReasonCode::FallbackBudgetExceeded, message: over.join("; "), at };
                match b.on_exceeded {
                    OnExceeded::Fail => errors.push(note),
                    OnExceeded::Warn => warnings.push(note),
                }
            }
        }
        let inventory = InventoryRef {
            name: self.inventory.name.clone(),
            fingerprint: self.inventory.fingerprint(),
        };
        let policy_ref = PolicyRef {
            name: spec.policy.name.clone(),
            version: spec.policy.version,
            sha256: self.policy.sha256.clone(),
        };
        let mut explanation = Explanation {
            graph_hash: graph_hash.to_string(),
            graph_name: g.name.clone(),
            policy: policy_ref.clone(),
            policy_files: self.policy.files.iter().map(|f| f.display().to_string()).collect(),
            inventory: inventory.clone(),
            decisions: decisions.into(),
            casts: Vec::new(),
            transfers: Vec::new(),
            memory: MemorySummary::default(),
            warnings,
            errors: Vec::new(),
            settings: Vec::new(),
            timings: Vec::new(),
            transfers_done: Vec::new(),
            prepared: Vec::new(),
            facts: Vec::new(),
            passes: Vec::new(),
            groups: Vec::new(),
        };
        if !errors.is_empty() {
            explanation.errors = errors.clone();
            return Err(PlanFailure { errors, explanation: Box::new(explanation) });
        }
        let choices: Vec<(Choice, usize)> =
            choices.into_iter().map(|c| c.expect("every node placed")).collect();
        // Precision: retype the graph where a node computes in another element type.
        let (planned, source_of, casts) = match self.retype(&precisions, &mut explanation) {
            Some((g, s, c)) => (Arc::new(g), s, c),
            None => (shared.clone(), g.node_ids().map(Some).collect(), Vec::new()),
        };
        // Placements of the planned graph; casts run where their consumer runs.
        let mut placed: Vec<(Choice, usize)> = Vec::with_capacity(planned.nodes.len());
        // Casts are recorded in node order, so a cursor finds each one.
        let mut next_cast = 0;
        let mut cast_kernels: HashMap<usize, Arc<str>> = HashMap::new();
        for pid in planned.node_ids() {
            let c = match source_of[pid.index()] {
                Some(s) => choices[s.index()].clone(),
                None => {
                    let cast = &casts[next_cast];
                    next_cast += 1;
                    debug_assert_eq!(cast.node, pid);
                    let owner =
                        cast.for_node.map(|s| choices[s.index()].clone()).unwrap_or_else(|| {
                            // A cast back at a graph output runs where the producer ran.
                            let input = planned.node(pid).inputs[0].expect("cast has an input");
                            let producer =
                                planned.producer(input).and_then(|p| source_of[p.index()]);
                            producer
                                .map(|p| choices[p.index()].clone())
                                .unwrap_or_else(|| choices[0].clone())
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
                    (Choice { kernel, precision: None, ..owner.0 }, owner.1)
                }
            };
            placed.push(c);
        }
        // Source nodes the plan lowered: a cast feeds them.
        let mut lowered_source = vec![false; g.nodes.len()];
        for k in &casts {
            if let Some(src) = k.for_node {
                lowered_source[src.index()] = true;
            }
        }
        // Partitions: maximal runs of consecutive nodes on one (engine, device).
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
                p.assignment.precision = c.precision.as_deref().and_then(PrecisionName::from_name);
            }
        }
        let placements: Vec<Placement> = planned
            .node_ids()
            .map(|pid| {
                let (c, _) = &placed[pid.index()];
                Placement {
                    node: pid,
                    source: source_of[pid.index()],
                    op: planned.node(pid).op.name().into(),
                    engine: c.engine.clone(),
                    kernel: c.kernel.clone(),
                    precision: c.precision.clone(),
                    device: c.device,
                    partition: part_of[pid.index()],
                }
            })
            .collect();
        explanation.groups = group_decisions(&planned, &placements);
        // Transfers: a partition reading a value that lives on another device.
        let transfers = self.transfers(&planned, &partitions, &part_of);
        // Memory.
        let mem = plan_memory(&planned, self.bindings);
        let memory = MemorySummary {
            peak_bytes: mem.unsized_values.is_empty().then_some(mem.peak_live_bytes),
            arena_bytes: mem.arena_bytes,
            limit_bytes: spec.memory.limit.map(|l| l.0),
        };
        explanation.casts = casts.clone();
        explanation.transfers = transfers.clone();
        explanation.memory = memory.clone();
        explanation.settings = self.setting_decisions(&partitions);
        if let Some(limit) = spec.memory.limit {
            match memory.peak_bytes {
                Some(peak) if peak > limit.0 => {
                    let note = Note {
                        code: ReasonCode::MemoryLimitExceeded,
                        message: format!("the plan needs a peak of {peak} bytes of live tensors; memory.limit is {limit} ({} bytes)", limit.0),
                        at: self.at("memory.limit"),
                    };
                    explanation.errors.push(note.clone());
                    return Err(PlanFailure { errors: vec![note], explanation: Box::new(explanation) });
                }
                None => explanation.warnings.push(Note {
                    code: ReasonCode::MemoryLimitExceeded,
                    message: format!("memory.limit {limit} not checked: {} value(s) have sizes that depend on unknown or unbound dims (bind them)", mem.unsized_values.len()),
                    at: self.at("memory.limit"),
                }),
                _ => {}
            }
        }
        let ex = &spec.execution;
        let plan = CapturePlan {
            source_graph_hash: explanation.graph_hash.clone(),
            passes: Vec::new(),
            policy: policy_ref,
            inventory,
            bindings: self.bindings.clone(),
            graph: planned,
            placements,
            partitions,
            transfers,
            casts,
            memory,
            execution: ExecutionSettings {
                capture: ex.capture,
                determinism: ex.determinism,
                threads: ex.threads,
                timeout_ms: ex.timeout.map(|t| t.0.as_millis() as u64),
            },
        };
        Ok((plan, explanation))
    }

    /// What the engine-facing settings (`execution.capture`, `memory.reuse`, `memory.pool`,
    /// `memory.pinned_host`, `precision.accumulate`) do on each engine the plan uses, where the
    /// engine does not honour what they ask: one recorded decision per engine and setting.
    fn setting_decisions(&mut self, partitions: &[PartitionPlan]) -> Vec<Note> {
        use xpu_engine::options::{Capture, Pool, Reuse, value_name};
        let spec = &self.policy.spec;
        // The settings this policy asks of engines, with their values.
        let asked: Vec<(&str, String, ReasonCode)> = [
            (spec.execution.capture == Capture::Graph)
                .then(|| ("execution.capture", "graph".into(), ReasonCode::CaptureUnsupported)),
            (spec.memory.reuse != Reuse::None).then(|| {
                ("memory.reuse", value_name(&spec.memory.reuse), ReasonCode::ReuseUnsupported)
            }),
            (spec.memory.pool != Pool::None).then(|| {
                ("memory.pool", value_name(&spec.memory.pool), ReasonCode::SettingUnsupported)
            }),
            spec.memory
                .pinned_host
                .then(|| ("memory.pinned_host", "true".into(), ReasonCode::SettingUnsupported)),
            spec.precision.accumulate.map(|a| {
                ("precision.accumulate", a.name().to_string(), ReasonCode::SettingUnsupported)
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut engines: Vec<&str> = partitions.iter().map(|p| p.engine.as_str()).collect();
        engines.sort_unstable();
        engines.dedup();
        let mut notes = Vec::new();
        for engine in engines {
            let Some(known) = xpu_engine::catalog::engine(engine) else { continue };
            for (key, value, code) in &asked {
                if let Some((_, what)) = known.unhonoured.iter().find(|(k, _)| k == key) {
                    notes.push(Note {
                        code: *code,
                        message: format!("{key} = {value}: on {engine}, {what}"),
                        at: self.at(key),
                    });
                }
            }
        }
        notes
    }

    fn engine_options(&self) -> EngineOptions {
        let spec = &self.policy.spec;
        EngineOptions {
            determinism: spec.execution.determinism,
            capture: spec.execution.capture,
            threads: spec.execution.threads,
            accumulate: spec.precision.accumulate,
            memory_limit: spec.memory.limit.map(|l| l.0),
            memory_pool: spec.memory.pool,
            memory_reuse: spec.memory.reuse,
            pinned_host: spec.memory.pinned_host,
            fallback: spec.engines.fallback,
            graph_optimization: spec.execution.graph_optimization,
            performance: spec.execution.performance,
        }
    }

    /// Builds the planned graph: float operands cast to each node's compute precision, graph
    /// outputs cast back to their declared dtype. When nothing changes precision, the source
    /// graph is used as is.
    fn retype(
        &mut self,
        precisions: &[Option<PrecisionName>],
        explanation: &mut Explanation,
    ) -> Option<(Graph, Vec<Option<NodeId>>, Vec<CastPlan>)> {
        let g = self.graph;
        let target = |id: NodeId| precisions[id.index()].and_then(|p| p.storage());
        let needs = g.node_ids().any(|id| {
            let n = g.node(id);
            target(id).is_some_and(|t| {
                n.input_values().any(|v| g.ty(v).dtype.is_float() && g.ty(v).dtype != t)
            })
        });
        if !needs {
            return None;
        }
        let mut out = Graph::new(g.name.clone());
        let mut map: Vec<Option<ValueId>> = vec![None; g.values.len()];
        let mut source_of: Vec<Option<NodeId>> = Vec::new();
        let mut casts = Vec::new();
        let mut cast_memo: HashMap<(ValueId, DType), ValueId> = HashMap::new();
        for &v in &g.inputs {
            map[v.index()] = Some(out.copy_input(g, v));
        }
        for id in g.node_ids() {
            let n = g.node(id);
            let primary = n.input_values().map(|v| g.ty(v).dtype).find(|d| d.is_float());
            let want = target(id);
            // The dtype each operand should have: data operands (the node's float dtype) at
            // the node's precision; index-like float inputs (resize scales) and everything
            // else as the source graph declares.
            let desired = |orig: ValueId| match (want, primary) {
                (Some(t), Some(p)) if g.ty(orig).dtype == p => t,
                _ => g.ty(orig).dtype,
            };
            let mark = (out.nodes.len(), out.values.len(), casts.len());
            let mut inputs = mapped_inputs(n, &map);
            for (slot, orig) in inputs.iter_mut().zip(&n.inputs) {
                if let (Some(cur), Some(orig)) = (slot.as_mut(), orig) {
                    let to = desired(*orig);
                    let reasons = &mut self.cast_reasons;
                    let why = || {
                        reasons
                            .entry(to)
                            .or_insert_with(|| {
                                let p = PrecisionName::of_dtype(to)
                                    .map(|p| p.name())
                                    .unwrap_or(to.name());
                                Arc::from(format!("the node computes at {p}"))
                            })
                            .clone()
                    };
                    *cur = cast_to(
                        &mut out,
                        &mut cast_memo,
                        &mut casts,
                        &mut source_of,
                        *cur,
                        to,
                        Some(id),
                        why,
                    );
                }
            }
            let changed = inputs
                .iter()
                .zip(&n.inputs)
                .any(|(a, b)| a.map(|v| out.ty(v).dtype) != b.map(|v| g.ty(v).dtype));
            if changed {
                // Single-output ops whose output dtype follows their data operands (most of a
                // model) retype without running shape inference again.
                let follows = n.outputs.len() == 1
                    && !matches!(n.op, Op::Cast | Op::CastLike)
                    && (n.op.is_elementwise()
                        || matches!(
                            n.op.class(),
                            OpClass::MatMul
                                | OpClass::Conv
                                | OpClass::Pool
                                | OpClass::Norm
                                | OpClass::Softmax
                                | OpClass::Movement
                        ));
                let types = if follows {
                    let mut ty = g.ty(n.outputs[0]).clone();
                    if Some(ty.dtype) == primary {
                        ty.dtype = want.unwrap_or(ty.dtype);
                    }
                    Ok(vec![ty])
                } else {
                    out.infer_node_types(n.op, &inputs, &n.attrs, n.outputs.len())
                };
                match types {
                    Ok(tys) => {
                        let new =
                            out.add_node(n.op, std::mem::take(&mut inputs), n.attrs.clone(), tys);
                        out.nodes[new.index()].name = n.name.clone();
                        for (k, &old) in n.outputs.iter().enumerate() {
                            let nv = out.nodes[new.index()].outputs[k];
                            map[old.index()] = Some(nv);
                            out.values[nv.index()].name = g.value(old).name.clone();
                        }
                        source_of.push(Some(id));
                        continue;
                    }
                    Err(e) => {
                        // The op does not take this precision: undo, feed it its source dtypes.
                        out.nodes.truncate(mark.0);
                        out.values.truncate(mark.1);
                        casts.truncate(mark.2);
                        source_of.truncate(mark.0);
                        cast_memo.retain(|_, v| v.index() < mark.1);
                        // `map` is as it was before the node: its inputs map as they did.
                        inputs = mapped_inputs(n, &map);
                        for (slot, orig) in inputs.iter_mut().zip(&n.inputs) {
                            if let (Some(cur), Some(orig)) = (slot.as_mut(), orig) {
                                let why = || {
                                    Arc::from(format!(
                                        "{} keeps {}",
                                        n.label(id),
                                        g.ty(*orig).dtype
                                    ))
                                };
                                *cur = cast_to(
                                    &mut out,
                                    &mut cast_memo,
                                    &mut casts,
                                    &mut source_of,
                                    *cur,
                                    g.ty(*orig).dtype,
                                    Some(id),
                                    why,
                                );
                            }
                        }
                        if let Some(p) = primary
                            && let Some(d) = explanation.decisions.get_mut(id.index())
                        {
                            if let Some(c) = &mut d.chosen {
                                c.precision =
                                    PrecisionName::of_dtype(p).map(|x| Arc::from(x.name()));
                            }
                            d.precision_from = Some(RuleRef {
                                key: format!(
                                    "graph dtype ({} cannot compute at {}: {e})",
                                    n.op,
                                    want.map(|t| t.name()).unwrap_or("?")
                                )
                                .into(),
                                at: None,
                            });
                        }
                    }
                }
            }
            let new = out.copy_node(g, n, inputs, &mut map);
            debug_assert_eq!(new.index(), source_of.len());
            source_of.push(Some(id));
        }
        for o in &g.outputs {
            let v = map[o.value.index()].expect("outputs are defined");
            let want = g.ty(o.value).dtype;
            let why = || Arc::from(format!("output {:?} is declared {want}", o.name));
            let v =
                cast_to(&mut out, &mut cast_memo, &mut casts, &mut source_of, v, want, None, why);
            out.add_output(o.name.clone(), v);
        }
        Some((out, source_of, casts))
    }

    fn transfers(
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

/// The inputs of source node `n` as values of the planned graph. Computed again rather than
/// kept in a copy: only a node whose retyping fails needs them a second time.
fn mapped_inputs(n: &xpu_ir::Node, map: &[Option<ValueId>]) -> Vec<Option<ValueId>> {
    n.inputs.iter().map(|v| v.map(|v| map[v.index()].expect("defined earlier"))).collect()
}

/// `v` as `dtype`: itself, an earlier cast of it, or a new cast node (recorded).
fn cast_to(
    out: &mut Graph,
    memo: &mut HashMap<(ValueId, DType), ValueId>,
    casts: &mut Vec<CastPlan>,
    source_of: &mut Vec<Option<NodeId>>,
    v: ValueId,
    dtype: DType,
    for_node: Option<NodeId>,
    reason: impl FnOnce() -> Arc<str>,
) -> ValueId {
    let from = out.ty(v).dtype;
    if from == dtype {
        return v;
    }
    if let Some(&c) = memo.get(&(v, dtype)) {
        return c;
    }
    // Constants are converted now rather than cast at every run.
    let folded = out.const_value(v).and_then(|t| t.to_float_dtype(dtype));
    let is_folded = folded.is_some();
    let c = match folded {
        Some(t) => out.add_const(t),
        None => {
            let attrs = xpu_ir::Attrs::new().with("to", xpu_ir::Attr::DType(dtype));
            let Ok(c) = out.add_op(Op::Cast, &[v], attrs) else { return v };
            c
        }
    };
    casts.push(CastPlan {
        node: out.producer(c).expect("just added"),
        from: from.name().into(),
        to: dtype.name().into(),
        for_node,
        reason: reason(),
        folded: is_folded,
    });
    source_of.push(None);
    memo.insert((v, dtype), c);
    c
}

/// The dtypes of a node's inputs and outputs as bits of `DType::ALL` (walk-cache keys).
fn operand_bits(g: &Graph, n: &xpu_ir::Node) -> u32 {
    n.input_values().chain(n.outputs.iter().copied()).fold(0, |bits, v| {
        let d = g.ty(v).dtype;
        bits | DType::ALL.iter().position(|x| *x == d).map_or(0, |i| 1 << i)
    })
}

fn operand_dtypes(bits: u32) -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().enumerate().filter(move |(i, _)| bits & (1 << i) != 0).map(|(_, d)| d)
}

/// Each fusion group of the planned graph: whole when all its nodes run on one engine and
/// device in one partition, else split (`FusionSplit`) naming where each node went.
fn group_decisions(planned: &Graph, placements: &[Placement]) -> Vec<GroupDecision> {
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
