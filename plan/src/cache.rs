//! The plan cache: plans are pure, so a plan made once is reused while the graph, the
//! policy, the input shapes and the inventory stay the same.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use xpu_engine::Inventory;
use xpu_ir::passes::Evaluator;
use xpu_ir::{Dim, Graph};
use xpu_policy::Policy;

use crate::model::{CapturePlan, Explanation};
use crate::planner::{PlanFailure, plan_shared};

/// What a plan depends on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlanKey {
    pub graph_hash: String,
    pub policy_sha256: String,
    pub input_shapes: Vec<Vec<usize>>,
    pub inventory_fingerprint: String,
    /// The digest of the evidence the policy reads (`[measured] lock`), if any: the same
    /// policy with other evidence plans anew.
    pub evidence: Option<Arc<str>>,
}

/// Binds each symbolic dim of the graph's inputs to its size in `shapes`.
pub fn bind_symbols(g: &Graph, shapes: &[Vec<usize>]) -> BTreeMap<String, u64> {
    let mut b = BTreeMap::new();
    for (&v, shape) in g.inputs.iter().zip(shapes) {
        if let Some(dims) = &g.ty(v).dims {
            for (d, &n) in dims.iter().zip(shape) {
                if let Dim::Sym(s) = d {
                    b.entry(s.clone()).or_insert(n as u64);
                }
            }
        }
    }
    b
}

/// A plan (shared with every run of it) and the explanation of how it was made.
pub type CachedPlan = Arc<(Arc<CapturePlan>, Explanation)>;

/// What a caller may have computed already: the graph's [`Graph::content_hash`] and the
/// inventory's [`Inventory::fingerprint`].
#[derive(Clone, Copy, Debug)]
pub struct Keys<'a> {
    pub graph_hash: &'a str,
    pub inventory_fingerprint: &'a str,
}

/// A bounded map from [`PlanKey`] to plans, with hit and miss counters.
pub struct PlanCache {
    capacity: usize,
    /// Folds constants in the pass pipeline before planning (the cpu engine's kernels).
    evaluator: Option<Arc<dyn Evaluator>>,
    entries: Mutex<HashMap<PlanKey, (u64, CachedPlan)>>,
    tick: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanCache")
            .field("capacity", &self.capacity)
            .field("folds", &self.evaluator.is_some())
            .finish_non_exhaustive()
    }
}

impl PlanCache {
    pub fn new(capacity: usize) -> PlanCache {
        PlanCache {
            capacity: capacity.max(1),
            evaluator: None,
            entries: Mutex::new(HashMap::new()),
            tick: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The cached plan for these inputs, or a new one (cached on success). The flag says
    /// whether it was a hit.
    /// Plans through `evaluator` from now on: the pass pipeline folds constants with it.
    pub fn with_evaluator(mut self, evaluator: Arc<dyn Evaluator>) -> PlanCache {
        self.evaluator = Some(evaluator);
        self
    }

    pub fn get_or_plan(
        &self,
        graph: &Arc<Graph>,
        policy: &Policy,
        inventory: &Inventory,
        input_shapes: &[Vec<usize>],
    ) -> Result<(CachedPlan, bool), PlanFailure> {
        let keys = Keys {
            graph_hash: &graph.content_hash(),
            inventory_fingerprint: &inventory.fingerprint(),
        };
        self.get_or_plan_keyed(graph, policy, inventory, input_shapes, keys)
    }

    /// [`get_or_plan`](PlanCache::get_or_plan) with the graph's content hash and the
    /// inventory's fingerprint already known (a daemon computes them once, not per job):
    /// a warm lookup is then one hash probe.
    pub fn get_or_plan_keyed(
        &self,
        graph: &Arc<Graph>,
        policy: &Policy,
        inventory: &Inventory,
        input_shapes: &[Vec<usize>],
        keys: Keys<'_>,
    ) -> Result<(CachedPlan, bool), PlanFailure> {
        let key = PlanKey {
            graph_hash: keys.graph_hash.to_string(),
            policy_sha256: policy.sha256.clone(),
            input_shapes: input_shapes.to_vec(),
            inventory_fingerprint: keys.inventory_fingerprint.to_string(),
            evidence: policy
                .resolved()
                .evidence
                .as_ref()
                .filter(|_| policy.resolved().measures())
                .map(|e| e.sha256.clone()),
        };
        let now = self.tick.fetch_add(1, Ordering::Relaxed);
        if let Some(entry) = self.entries.lock().expect("cache lock").get_mut(&key) {
            entry.0 = now;
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok((entry.1.clone(), true));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let (plan, explanation) = plan_shared(
            graph,
            &key.graph_hash,
            policy,
            inventory,
            &bind_symbols(graph, input_shapes),
            self.evaluator.as_deref(),
        )?;
        let planned = Arc::new((Arc::new(plan), explanation));
        let mut entries = self.entries.lock().expect("cache lock");
        if entries.len() >= self.capacity {
            // Evict the least recently used entry.
            if let Some(old) = entries.iter().min_by_key(|(_, (t, _))| *t).map(|(k, _)| k.clone()) {
                entries.remove(&old);
            }
        }
        entries.insert(key, (now, planned.clone()));
        Ok((planned, false))
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.entries.lock().expect("cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
