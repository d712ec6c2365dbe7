//! Online tuning (`[tuning] online = true`): a policy that chooses by measurement and names
//! no lock is planned with the evidence of the runs this store holds for this machine — per
//! node signature and candidate, the median of every stored timed run, read again every
//! `refresh_s` — and a share of its runs (`explore_share`) is planned to explore candidates
//! whose evidence is thinner than the policy's `min_samples`. The evidence snapshot's digest
//! is part of each plan's cache key, so the same evidence always gives the same plan; a
//! policy with a lock keeps its lock (reviewed in git) and never explores.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xpu_plan::{Explanation, ReasonCode};
use xpu_policy::Policy;
use xpu_policy::lock::{Evidence, Figure, Machine, SignatureFigure};
use xpu_store::Store;

use crate::config::TuningSettings;
use crate::metrics::Metrics;

/// The evidence online tuning last read, and the policies planned with it.
struct Snapshot {
    read_at: Instant,
    exploit: Arc<Evidence>,
    explore: Arc<Evidence>,
    /// Per signature, the fastest candidate's kernel (to count changes between reads).
    fastest: HashMap<String, String>,
    /// Per (policy digest, exploring): the policy reading this evidence.
    policies: HashMap<(String, bool), Arc<Policy>>,
}

/// Most policies kept per snapshot; past it the map starts over.
const POLICIES_KEPT: usize = 1024;

pub struct Tuning {
    settings: TuningSettings,
    machine: Machine,
    fingerprint: String,
    snapshot: Mutex<Option<Snapshot>>,
    /// Runs planned with store evidence so far: every `period`-th one explores.
    planned: AtomicU64,
    period: u64,
}

impl Tuning {
    pub fn new(settings: TuningSettings, inventory: &xpu_engine::Inventory) -> Tuning {
        let machine = Machine::of(inventory);
        let fingerprint = machine.fingerprint();
        let share = settings.explore_share;
        let period = if share > 0.0 { (1.0 / share).round().max(1.0) as u64 } else { 0 };
        Tuning {
            settings,
            machine,
            fingerprint,
            snapshot: Mutex::new(None),
            planned: AtomicU64::new(0),
            period,
        }
    }

    /// This machine's fingerprint, filed with every stored run.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The policy a job is planned under: `policy` itself, or — tuning online, the policy
    /// choosing by measurement without a lock — the policy reading the store's evidence,
    /// on an exploring plan for one run in `1 / explore_share`.
    pub fn policy_for(
        &self,
        policy: &Arc<Policy>,
        store: &Store,
        metrics: &Metrics,
    ) -> Arc<Policy> {
        if !self.settings.online
            || !policy.resolved().measures()
            || policy.spec.measured.lock.is_some()
        {
            return policy.clone();
        }
        let n = self.planned.fetch_add(1, Ordering::Relaxed);
        let explore = policy.resolved().explore_runs > 0 && self.period > 0 && n.is_multiple_of(self.period);
        let Ok(mut guard) = self.snapshot.lock() else { return policy.clone() };
        let stale = guard
            .as_ref()
            .is_none_or(|s| s.read_at.elapsed() >= Duration::from_secs(self.settings.refresh_s));
        if stale {
            match self.read(store, guard.as_ref(), metrics) {
                Ok(fresh) => *guard = Some(fresh),
                Err(e) => {
                    tracing::warn!("online tuning: cannot read the store's evidence: {e}");
                    if guard.is_none() {
                        return policy.clone();
                    }
                }
            }
        }
        let Some(snap) = guard.as_mut() else { return policy.clone() };
        if snap.policies.len() >= POLICIES_KEPT {
            snap.policies.clear();
        }
        let evidence = if explore { &snap.explore } else { &snap.exploit };
        snap.policies
            .entry((policy.sha256.clone(), explore))
            .or_insert_with(|| Arc::new(policy.with_evidence(evidence.clone())))
            .clone()
    }

    /// Reads the evidence again; counts the signatures whose fastest candidate changed.
    fn read(
        &self,
        store: &Store,
        last: Option<&Snapshot>,
        metrics: &Metrics,
    ) -> Result<Snapshot, xpu_store::StoreError> {
        let rows = store.evidence(&self.fingerprint, None)?;
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
        let exploit = Evidence::from_store("store", self.machine.clone(), figures);
        let fastest: HashMap<String, String> = exploit
            .lock
            .as_ref()
            .map(|l| {
                l.nodes.iter().map(|n| (n.signature.clone(), n.winner.kernel.clone())).collect()
            })
            .unwrap_or_default();
        if let Some(last) = last {
            let changed = fastest
                .iter()
                .filter(|(sig, k)| last.fastest.get(*sig).is_some_and(|old| old != *k))
                .count();
            metrics.tuning_choice_changes.inc_by(changed as u64);
        }
        metrics.tuning_signatures.set(fastest.len() as i64);
        let explore = Arc::new(exploit.exploring());
        Ok(Snapshot {
            read_at: Instant::now(),
            exploit: Arc::new(exploit),
            explore,
            fastest,
            policies: HashMap::new(),
        })
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
