//! Online tuning (`[tuning] online = true`): a policy that chooses by measurement, names no
//! lock and asks for no determinism is planned with the evidence of the runs this store
//! holds for this machine — per node signature and candidate, the median of every stored
//! timed run — and a share of its runs (`explore_share`) is planned to explore a candidate
//! whose evidence is thinner than the policy's `min_samples`.
//!
//! The evidence is read by a thread of its own every `refresh_s`, never on a job's path; a
//! new snapshot replaces the old one only when what plans depend on changed (its digest,
//! `Evidence::from_store`), so plans and prepared executables are not made again for every
//! run stored. Within one snapshot a (policy, graph) explores on at most `min_samples`
//! runs: the exploring plan is the same until the next read, which sees what it measured.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use xpu_engine::options::Determinism;
use xpu_plan::{Explanation, ReasonCode};
use xpu_policy::Policy;
use xpu_policy::lock::{Evidence, Figure, Machine, SignatureFigure};
use xpu_store::Store;

use crate::config::TuningSettings;
use crate::metrics::Metrics;

/// The evidence online tuning read last, and what was planned with it.
struct Snapshot {
    exploit: Arc<Evidence>,
    explore: Arc<Evidence>,
    /// Per (policy digest, exploring): the policy reading this evidence.
    policies: Mutex<HashMap<(String, bool), Arc<Policy>>>,
    /// Per (policy digest, graph hash): the exploring runs handed out with this evidence.
    explored: Mutex<HashMap<(String, Arc<str>), u32>>,
}

/// Most entries each of a snapshot's maps keeps; past it the map starts over.
const KEPT: usize = 4096;

impl Snapshot {
    fn of(exploit: Evidence) -> Snapshot {
        Snapshot {
            explore: Arc::new(exploit.exploring()),
            exploit: Arc::new(exploit),
            policies: Mutex::new(HashMap::new()),
            explored: Mutex::new(HashMap::new()),
        }
    }
}

/// The policy a job is planned under, and the one to fall back to if an exploring plan
/// cannot be made.
pub struct Planning {
    pub policy: Arc<Policy>,
    pub exploit: Option<Arc<Policy>>,
}

pub struct Tuning {
    settings: TuningSettings,
    machine: Machine,
    fingerprint: String,
    snapshot: RwLock<Arc<Snapshot>>,
    /// Per policy digest, runs planned with store evidence so far: every `period`-th explores.
    runs: Mutex<HashMap<String, u64>>,
    period: u64,
}

impl Tuning {
    pub fn new(settings: TuningSettings, inventory: &xpu_engine::Inventory) -> Tuning {
        let machine = Machine::of(inventory);
        let fingerprint = machine.fingerprint();
        let share = settings.explore_share;
        let period = if share > 0.0 { (1.0 / share).round().max(1.0) as u64 } else { 0 };
        let empty = Evidence::from_store("store", machine.clone(), Vec::new());
        Tuning {
            settings,
            machine,
            fingerprint,
            snapshot: RwLock::new(Arc::new(Snapshot::of(empty))),
            runs: Mutex::new(HashMap::new()),
            period,
        }
    }

    pub fn online(&self) -> bool {
        self.settings.online
    }

    pub fn refresh_every(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.settings.refresh_s)
    }

    /// This machine's fingerprint, filed with every stored run.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn current(&self) -> Arc<Snapshot> {
        self.snapshot.read().map(|s| s.clone()).unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Whether `policy` is planned with the store's evidence here.
    fn reads_store(&self, policy: &Policy) -> bool {
        self.settings.online
            && policy.resolved().measures()
            && policy.spec.measured.lock.is_none()
            && policy.spec.execution.determinism == Determinism::Off
    }

    /// The policy a job of `graph` is planned under: `policy` itself, or — tuning online —
    /// the policy reading the store's evidence, exploring on one run in
    /// `1 / explore_share` while this evidence has explored fewer than `min_samples` runs
    /// of the graph.
    pub fn planning(&self, policy: &Arc<Policy>, graph: &Arc<str>) -> Planning {
        if !self.reads_store(policy) {
            return Planning { policy: policy.clone(), exploit: None };
        }
        let snap = self.current();
        let exploit = self.with(&snap, policy, false);
        if !self.may_explore(&snap, policy, graph) {
            return Planning { policy: exploit, exploit: None };
        }
        Planning { policy: self.with(&snap, policy, true), exploit: Some(exploit) }
    }

    /// The policy a dry run shows: what a run that does not explore gets.
    pub fn showing(&self, policy: &Arc<Policy>) -> Arc<Policy> {
        if !self.reads_store(policy) {
            return policy.clone();
        }
        self.with(&self.current(), policy, false)
    }

    fn may_explore(&self, snap: &Snapshot, policy: &Policy, graph: &Arc<str>) -> bool {
        if policy.resolved().explore_runs == 0 || self.period == 0 {
            return false;
        }
        let Ok(mut runs) = self.runs.lock() else { return false };
        if runs.len() >= KEPT {
            runs.clear();
        }
        let n = runs.entry(policy.sha256.clone()).or_insert(0);
        let turn = n.is_multiple_of(self.period);
        *n += 1;
        if !turn {
            return false;
        }
        let Ok(mut explored) = snap.explored.lock() else { return false };
        if explored.len() >= KEPT {
            explored.clear();
        }
        let done = explored.entry((policy.sha256.clone(), graph.clone())).or_insert(0);
        if *done >= policy.resolved().min_samples {
            return false;
        }
        *done += 1;
        true
    }

    fn with(&self, snap: &Snapshot, policy: &Arc<Policy>, explore: bool) -> Arc<Policy> {
        let evidence = if explore { &snap.explore } else { &snap.exploit };
        let Ok(mut policies) = snap.policies.lock() else {
            return Arc::new(policy.with_evidence(evidence.clone()));
        };
        if policies.len() >= KEPT {
            policies.clear();
        }
        policies
            .entry((policy.sha256.clone(), explore))
            .or_insert_with(|| Arc::new(policy.with_evidence(evidence.clone())))
            .clone()
    }

    /// Reads the evidence again (the refresh thread's work): a new snapshot when what plans
    /// depend on changed; counts the signatures whose fastest candidate changed.
    pub fn refresh(&self, store: &Store, metrics: &Metrics) {
        let rows = match store.evidence(&self.fingerprint, None) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!("online tuning: cannot read the store's evidence: {e}");
                return;
            }
        };
        let figures: Vec<SignatureFigure> = rows
            .into_iter()
            .map(|r| SignatureFigure {
                signature: r.signature,
                figure: Figure {
                    engine: r.engine,
                    kernel: r.kernel,
                    median_us: r.median_us,
                    samples: r.samples.min(u64::from(u32::MAX)) as u32,
                },
            })
            .collect();
        let fresh = Evidence::from_store("store", self.machine.clone(), figures);
        let last = self.current();
        if fresh.sha256 == last.exploit.sha256 {
            return;
        }
        let fresh = Snapshot::of(fresh);
        let (before, now) = (fastest(&last.exploit), fastest(&fresh.exploit));
        let changed =
            now.iter().filter(|(sig, k)| before.get(*sig).is_some_and(|old| old != *k)).count();
        metrics.tuning_choice_changes.inc_by(changed as u64);
        metrics.tuning_signatures.set(now.len() as i64);
        if let Ok(mut s) = self.snapshot.write() {
            *s = Arc::new(fresh);
        }
    }

    /// Counts what a run's plan did with the evidence: an exploring run, and the time its
    /// measured choices are estimated to save.
    pub fn observe(&self, explanation: &Explanation, metrics: &Metrics) {
        if explanation.evidence.is_none() {
            return;
        }
        let mut explored = false;
        let mut saved: u64 = 0;
        for d in explanation.decisions.iter() {
            if let Some(m) = &d.measured {
                explored |= m.code == Some(ReasonCode::Exploring);
                saved += m.saved_nanos.unwrap_or(0);
            }
        }
        if explored {
            metrics.tuning_explorations.inc();
        }
        if saved > 0 {
            metrics.tuning_saved.inc_by(saved as f64 * 1e-9);
        }
    }
}

/// Per signature, the fastest candidate's kernel.
fn fastest(e: &Evidence) -> HashMap<&str, &str> {
    let nodes = e.lock.as_ref().map(|l| l.nodes.as_slice()).unwrap_or_default();
    nodes.iter().map(|n| (n.signature.as_str(), n.winner.kernel.as_str())).collect()
}
