//! The prepared-executable cache: prepare once, run many. A [`GraphExec`] holds every
//! partition's engine executable (compiled kernels, sessions, prepacked weights); preparing
//! one costs far more than a small job's run. The cache keeps idle GraphExecs beside the plan
//! they were prepared for — keyed by the plan's identity, which the [`PlanCache`] keeps the
//! same for as long as the graph, the policy, the input shapes and the inventory stay the
//! same — and hands one out per run. Bounded by plans, by idle executables per plan, and by
//! the bytes of weights the idle ones hold; the least recently used plan goes first.
//!
//! A GraphExec runs one job at a time (`&mut`): concurrent jobs of the same plan take
//! different idle executables, or prepare a new one. A run that fails does not come back:
//! its executable may be half-way through something.
//!
//! [`PlanCache`]: crate::PlanCache

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use xpu_engine::Registry;

use crate::exec::{ExecError, GraphExec};
use crate::model::CapturePlan;

/// Counters and sizes, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreparedStats {
    /// Plans with at least one idle executable kept.
    pub plans: usize,
    /// Idle executables kept, all plans together.
    pub idle: usize,
    /// Bytes of weights the idle executables hold.
    pub bytes: u64,
    /// Checkouts that prepared a new GraphExec.
    pub prepared: u64,
    /// Checkouts that reused a kept one.
    pub reused: u64,
    /// Executables dropped to stay within the bounds.
    pub evicted: u64,
}

struct Entry {
    /// Held so that the plan's address (the key) cannot be reused while the entry lives.
    plan: Arc<CapturePlan>,
    idle: Vec<GraphExec>,
}

struct Inner {
    entries: lru::LruCache<usize, Entry>,
    bytes: u64,
}

/// Idle prepared GraphExecs by plan; see the module doc.
pub struct PreparedCache {
    max_plans: usize,
    max_idle_per_plan: usize,
    max_bytes: u64,
    inner: Mutex<Inner>,
    prepared: AtomicU64,
    reused: AtomicU64,
    evicted: AtomicU64,
}

impl std::fmt::Debug for PreparedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedCache").field("stats", &self.stats()).finish()
    }
}

fn key(plan: &Arc<CapturePlan>) -> usize {
    Arc::as_ptr(plan) as usize
}

impl PreparedCache {
    /// A cache of at most `max_plans` plans, `max_idle_per_plan` idle executables each, and
    /// `max_bytes` of weights in all. `max_plans = 0` keeps nothing (every run prepares).
    pub fn new(max_plans: usize, max_idle_per_plan: usize, max_bytes: u64) -> PreparedCache {
        PreparedCache {
            max_plans,
            max_idle_per_plan: max_idle_per_plan.max(1),
            max_bytes,
            inner: Mutex::new(Inner { entries: lru::LruCache::unbounded(), bytes: 0 }),
            prepared: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Entries are whole GraphExecs or absent: consistent after a panic elsewhere.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle GraphExec of `plan`, or a new one prepared on `registry`'s engines (outside
    /// the lock: other plans' jobs do not wait for it).
    pub fn checkout(
        &self,
        plan: &Arc<CapturePlan>,
        registry: &Registry,
    ) -> Result<GraphExec, ExecError> {
        {
            let mut inner = self.lock();
            let taken = inner.entries.get_mut(&key(plan)).and_then(|e| e.idle.pop());
            if let Some(exec) = taken {
                inner.bytes -= exec.weight_bytes();
                self.reused.fetch_add(1, Ordering::Relaxed);
                return Ok(exec);
            }
        }
        self.prepared.fetch_add(1, Ordering::Relaxed);
        GraphExec::new(plan.clone(), registry)
    }

    /// Gives back a GraphExec after a successful run, to be reused; evicts what the bounds
    /// no longer allow, least recently used plans first. Returns how many executables it
    /// dropped (this one included, when it is not kept).
    pub fn checkin(&self, exec: GraphExec) -> usize {
        let bytes = exec.weight_bytes();
        if self.max_plans == 0 || bytes > self.max_bytes {
            self.evicted.fetch_add(1, Ordering::Relaxed);
            return 1;
        }
        let plan = exec.plan_arc().clone();
        let mut dropped = Vec::new();
        {
            let mut inner = self.lock();
            let entry = inner
                .entries
                .get_or_insert_mut(key(&plan), || Entry { plan: plan.clone(), idle: Vec::new() });
            debug_assert!(Arc::ptr_eq(&entry.plan, &plan), "a live plan's address is unique");
            if entry.idle.len() >= self.max_idle_per_plan {
                dropped.push(exec);
            } else {
                entry.idle.push(exec);
                inner.bytes += bytes;
            }
            while inner.bytes > self.max_bytes || inner.entries.len() > self.max_plans {
                let Some((_, mut old)) = inner.entries.pop_lru() else { break };
                for e in old.idle.drain(..) {
                    inner.bytes -= e.weight_bytes();
                    dropped.push(e);
                }
            }
            // An entry emptied by checkouts stays until evicted: it costs no executable.
        }
        self.evicted.fetch_add(dropped.len() as u64, Ordering::Relaxed);
        // Engines release their executables here, after the lock.
        dropped.len()
    }

    pub fn stats(&self) -> PreparedStats {
        let inner = self.lock();
        PreparedStats {
            plans: inner.entries.iter().filter(|(_, e)| !e.idle.is_empty()).count(),
            idle: inner.entries.iter().map(|(_, e)| e.idle.len()).sum(),
            bytes: inner.bytes,
            prepared: self.prepared.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }
}

/// The default bounds of a daemon's cache: plans kept, idle executables per plan, bytes.
pub const DEFAULT_MAX_PLANS: usize = 256;
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
