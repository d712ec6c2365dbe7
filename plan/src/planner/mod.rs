//! The planner: a pure function of (graph, policy, inventory, symbol bindings). For every
//! node it walks the candidates — engines in policy order, then every other engine of the
//! inventory; per engine its kernels in preference order — and rejects each that cannot or
//! may not run the node with a [`ReasonCode`] and the policy location behind it. Constants
//! follow their first consumer. Nodes are then grouped into engine-contiguous partitions in
//! topological order, precision casts are inserted where a node's compute precision differs
//! from its operands', transfers are added where a partition reads a value from another
//! device, and the memory plan's peak is checked against `[memory] limit`.
//!
//! The planner reads the policy in its resolved form ([`ResolvedPolicy`]: typed ops,
//! classes, dtypes, kernels and cited keys) and never parses a policy string. Each concern
//! has its module: [`facts`] (what a node is and the precision it asks for), [`walk`] (the
//! candidate walk, memoised per node signature), [`constants`], [`budget`] (the fallback
//! budget), [`retype`] (precision casts), [`partition`] (placements, partitions, fusion
//! groups), [`transfers`], [`settings`] (engine options and unhonoured settings) and
//! [`memory`].

mod budget;
mod constants;
mod facts;
mod measured;
mod memory;
mod partition;
mod retype;
mod settings;
mod transfers;
mod walk;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use xpu_engine::{Inventory, PrecisionName};
use xpu_ir::passes::Evaluator;
use xpu_ir::{DType, Graph, NodeId, Op};
use xpu_policy::{Cited, Policy, ResolvedPolicy};

use crate::model::*;
use crate::reason::ReasonCode;

use measured::{EvidenceState, MeasureAsk};
use walk::{Walk, WalkKey};

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

/// A node's chosen candidate and the index of its engine in the inventory.
type Placed = (Choice, usize);

struct Planner<'a> {
    graph: &'a Graph,
    policy: &'a Policy,
    resolved: &'a ResolvedPolicy,
    inventory: &'a Inventory,
    bindings: &'a BTreeMap<String, u64>,
    /// Effective engine order (policy order, or the inventory's minus denied engines).
    order: Vec<Arc<str>>,
    kernels_by_op: HashMap<(usize, Op), Vec<usize>>,
    cast_reasons: HashMap<DType, Arc<str>>,
    walks: HashMap<WalkKey, Walk>,
    /// The evidence measured choices read.
    evidence: EvidenceState<'a>,
    /// The signature an exploring plan explores (one per plan).
    exploring: std::cell::Cell<Option<u64>>,
}

/// What placing every node gave: per node its decision, its choice and its precision.
struct Placing {
    decisions: Vec<Decision>,
    choices: Vec<Option<Placed>>,
    precisions: Vec<Option<PrecisionName>>,
    errors: Vec<Note>,
}

impl<'a> Planner<'a> {
    fn new(
        graph: &'a Graph,
        policy: &'a Policy,
        inventory: &'a Inventory,
        bindings: &'a BTreeMap<String, u64>,
    ) -> Planner<'a> {
        let resolved = policy.resolved();
        let order = if resolved.order.is_empty() {
            inventory
                .engines
                .iter()
                .filter(|c| !resolved.is_denied(&c.engine))
                .map(|c| Arc::from(c.engine.as_str()))
                .collect()
        } else {
            resolved.order.clone()
        };
        Planner {
            graph,
            policy,
            resolved,
            inventory,
            bindings,
            order,
            kernels_by_op: HashMap::new(),
            cast_reasons: HashMap::new(),
            walks: HashMap::new(),
            evidence: EvidenceState::of(
                resolved.evidence.as_deref().filter(|_| resolved.measures()),
                inventory,
            ),
            exploring: std::cell::Cell::new(None),
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
        let mut placing = self.place_nodes();
        self.place_constants(&mut placing);
        let mut warnings = Vec::new();
        if let Some(note) = self.fallback_budget(&placing.decisions) {
            match self.policy.spec.engines.fallback_budget.as_ref().map(|b| b.on_exceeded) {
                Some(xpu_policy::spec::OnExceeded::Fail) => placing.errors.push(note),
                _ => warnings.push(note),
            }
        }
        let Placing { decisions, choices, precisions, errors } = placing;
        let mut explanation = self.explanation(graph_hash, decisions, warnings);
        if !errors.is_empty() {
            explanation.errors = errors.clone();
            return Err(PlanFailure { errors, explanation: Box::new(explanation) });
        }
        let choices: Vec<Placed> =
            choices.into_iter().map(|c| c.expect("every node placed")).collect();
        // Precision: retype the graph where a node computes in another element type.
        let (planned, source_of, casts) = match self.retype(&precisions, &mut explanation) {
            Some((g, s, c)) => (Arc::new(g), s, c),
            None => (shared.clone(), self.graph.node_ids().map(Some).collect(), Vec::new()),
        };
        let placed = self.place_casts(&planned, &source_of, &casts, &choices);
        let parts = self.partition(&planned, &placed, &source_of, &casts);
        explanation.groups = partition::group_decisions(&planned, &parts.placements);
        let transfers = self.transfers(&planned, &parts.partitions, &parts.part_of);
        explanation.casts = casts.clone();
        explanation.transfers = transfers.clone();
        explanation.settings = self.setting_decisions(&parts.partitions);
        let memory = self.check_memory(&planned, &mut explanation)?;
        let plan = CapturePlan {
            source_graph_hash: explanation.graph_hash.clone(),
            passes: Vec::new(),
            policy: explanation.policy.clone(),
            inventory: explanation.inventory.clone(),
            bindings: self.bindings.clone(),
            graph: planned,
            placements: parts.placements,
            partitions: parts.partitions,
            transfers,
            casts,
            memory,
            execution: self.execution_settings(),
            evidence: explanation.evidence.clone(),
        };
        Ok((plan, explanation))
    }

    /// Walks the candidates of every node but constants, which follow their consumers.
    fn place_nodes(&mut self) -> Placing {
        let g = self.graph;
        let n_nodes = g.nodes.len();
        let mut placing = Placing {
            decisions: Vec::with_capacity(n_nodes),
            choices: vec![None; n_nodes],
            precisions: vec![None; n_nodes],
            errors: Vec::new(),
        };
        for id in g.node_ids() {
            let n = g.node(id);
            let (facts, rule) = self.facts(id);
            placing.precisions[id.index()] = facts.precision;
            let mut d = Decision {
                node: id,
                name: n.name.clone(),
                op: std::borrow::Cow::Borrowed(n.op.name()),
                class: std::borrow::Cow::Borrowed(n.op.class().name()),
                flops: facts.flops,
                chosen: None,
                rule: None,
                precision_from: facts.source.map(|s| self.precision_ref(s)),
                fallback: None,
                rejected: Default::default(),
                measured: None,
            };
            if n.op == Op::Constant {
                placing.decisions.push(d);
                continue;
            }
            let w = self.walk(&facts, rule);
            if w.chosen.is_some() && w.precision != facts.precision {
                placing.precisions[id.index()] = w.precision;
                d.precision_from = w.precision_note.clone();
            }
            d.rule = w.rule;
            d.fallback = w.fallback;
            d.rejected = w.rejected;
            d.measured = match &facts.measure {
                Some(MeasureAsk::Entry(..)) => w.measured,
                Some(ask) => w.measured.or_else(|| self.measure_note(ask)),
                None => None,
            };
            match w.chosen {
                Some((c, ei)) => {
                    d.chosen = Some(c.clone());
                    placing.choices[id.index()] = Some((c, ei));
                }
                None => placing.errors.push(unplaceable(g, id, &d)),
            }
            placing.decisions.push(d);
        }
        placing
    }

    /// The explanation of the decisions so far (casts, transfers and memory come later).
    fn explanation(
        &self,
        graph_hash: &str,
        decisions: Vec<Decision>,
        warnings: Vec<Note>,
    ) -> Explanation {
        let spec = &self.policy.spec;
        Explanation {
            graph_hash: graph_hash.to_string(),
            graph_name: self.graph.name.clone(),
            policy: PolicyRef {
                name: spec.policy.name.clone(),
                version: spec.policy.version,
                sha256: self.policy.sha256.clone(),
            },
            policy_files: self.policy.files.iter().map(|f| f.display().to_string()).collect(),
            inventory: InventoryRef {
                name: self.inventory.name.clone(),
                fingerprint: self.inventory.fingerprint(),
            },
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
            evidence: self.evidence.reference(),
        }
    }
}

/// The error for a node no candidate can run: every rejection, in walk order.
fn unplaceable(g: &Graph, id: NodeId, d: &Decision) -> Note {
    let rejected: Vec<String> = d
        .rejected
        .iter()
        .map(|r| format!("{} {}: {}", r.engine, r.code.name(), r.detail))
        .collect();
    Note {
        code: ReasonCode::Unplaceable,
        message: format!("{}: no candidate left ({})", g.node(id).label(id), rejected.join("; ")),
        at: None,
    }
}

/// A cited policy key as the explanation's reference to it.
fn cite(c: &Cited) -> RuleRef {
    RuleRef { key: c.key.clone(), at: Some(c.at.clone()) }
}
