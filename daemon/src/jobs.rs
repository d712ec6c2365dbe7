//! Jobs: a bounded queue in front of a fixed set of worker threads, admission by execution
//! slots and per-engine limits ([`crate::gate`]), and the store's journal. The life of a job:
//!
//! 1. submit (HTTP handler): the program is compiled (or found in the compile cache) and the
//!    policy resolved at once, so a job that cannot run is refused with a 4xx and never
//!    queued; a binary program (ONNX) is kept in the blob store for replays; a full queue
//!    answers 429. A waited job that finds a slot free and nothing queued runs in place on
//!    the request's blocking thread: no hand-off.
//! 2. a worker plans it (a plan-cache probe when warm); if one of its engines is at its
//!    `limits.engine_concurrency`, the job is parked without holding the worker and run
//!    when that engine frees. It runs on a fresh engine registry (the table engine's
//!    DuckDB connection is per job) under the job's stop token (cancel, timeout), and its
//!    outputs are kept as blobs named by their SHA-256.
//! 3. the worker appends the finished run to the store's journal, with its inputs (for a
//!    replay) and its new small output blobs in the same frame, and only then marks it
//!    complete and wakes whoever waits on it: a run reported complete survives a crash of
//!    the daemon, explains at once and serves its outputs at once (from memory until the
//!    store's feeder has written its files and committed it to DuckDB, in batches, in the
//!    background). No file is created on a job's way through (one `write(2)`, the journal's).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use xpu_engine::{Inventory, StopToken};
use xpu_ir::{Graph, Tensor};
use xpu_minilang::paths::DataRoots;
use xpu_plan::{PlanCache, PreparedCache};
use xpu_policy::Policy;
use xpu_runtime::Planned;
use xpu_store::{KeptFile, OutputInfo, RunRecord, RunStatus, RunSummary, Store};

use crate::metrics::Metrics;
use crate::policies::PolicySet;

pub fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// What a job runs: everything resolved at submit time.
pub struct JobSpec {
    pub program_name: String,
    pub program_kind: &'static str,
    /// Empty when the program is a model file known unchanged and compiled before
    /// (`program_file`): its bytes were not read for this job.
    pub program_bytes: Vec<u8>,
    /// The model file whose bytes `program_bytes` leaves unread, read only if the blob
    /// store lacks them.
    pub program_file: Option<PathBuf>,
    pub program_sha256: String,
    pub program_text: bool,
    pub graph: Arc<Graph>,
    /// The graph's content hash (the plan cache's key), computed once when compiled.
    pub graph_hash: Arc<str>,
    pub inputs: Vec<Tensor>,
    pub input_names: Vec<String>,
    pub policy: Arc<Policy>,
    pub labels: BTreeMap<String, String>,
    pub tenant: Option<String>,
    /// Set for replays: the run this one repeats.
    pub replay_of: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    Queued,
    Running,
    /// Committed to the store.
    Done(Box<RunSummary>),
}

/// A job the daemon holds in memory until its run is committed.
pub struct Job {
    pub run_id: String,
    pub spec: JobSpec,
    pub submitted: Instant,
    pub submitted_us: i64,
    /// Cancels the job: before it runs, or while it runs (engines check between nodes).
    pub stop: StopToken,
    phase: tokio::sync::watch::Sender<Phase>,
    /// Where the job's time went, in nanoseconds (Server-Timing, the overhead metric).
    pub timings: JobTimings,
}

/// A job's steps, in nanoseconds: keeping its program at submit (a model not kept before),
/// planning (a plan-cache lookup when warm), executing the plan, keeping its outputs,
/// journaling the run.
#[derive(Default)]
pub struct JobTimings {
    pub files: AtomicU64,
    pub plan: AtomicU64,
    pub run: AtomicU64,
    pub outputs: AtomicU64,
    pub store: AtomicU64,
}

fn nanos_since(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

impl Job {
    pub fn phase(&self) -> Phase {
        self.phase.borrow().clone()
    }

    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    pub fn is_cancelled(&self) -> bool {
        self.stop.is_cancelled()
    }
}

/// Which thread [`Jobs::submit_and_run_here`] is called on (the `thread` label of
/// `xpu_job_threads_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Here {
    /// An HTTP (async) thread: only for jobs [`Jobs::runs_inline`] allows.
    Http,
    /// The request's blocking-pool thread.
    Request,
}

impl Here {
    fn label(self) -> &'static str {
        match self {
            Here::Http => "http",
            Here::Request => "request",
        }
    }
}

/// A planned job waiting for its engine (see [`crate::gate`]).
type Admitted = (Arc<Job>, Planned);

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the queue is full ({0} jobs waiting)")]
    QueueFull(usize),
    #[error("the daemon is shutting down")]
    Draining,
    #[error("cannot keep the job's files: {0}")]
    Io(String),
}

pub struct Jobs {
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub policies: RwLock<Arc<PolicySet>>,
    pub cache: PlanCache,
    /// Prepared GraphExecs kept beside their plans: a repeated job prepares nothing.
    pub prepared: PreparedCache,
    pub compiled: crate::compiled::CompileCache,
    pub data_roots: DataRoots,
    pub model_roots: DataRoots,
    /// Digests of program files named by path, kept while the file stays the same.
    pub(crate) file_digests: crate::digests::FileDigests,
    runs_dir: PathBuf,
    blobs: crate::blobs::Blobs,
    engines: xpu_runtime::SharedEngines,
    /// The engines every job gets (the registry is fixed for the process), and their
    /// fingerprint: computed once, so a warm plan lookup hashes nothing.
    inventory: Inventory,
    inventory_fingerprint: String,
    /// Online tuning: the store's evidence for policies that choose by measurement.
    tuning: crate::tuning::Tuning,
    gate: crate::gate::Gate<Admitted>,
    live: Mutex<HashMap<String, Arc<Job>>>,
    queue: SyncSender<Arc<Job>>,
    /// Jobs in `queue` (a waited job runs in place only when it is empty).
    queued: AtomicUsize,
    capacity: usize,
    draining: AtomicBool,
    /// Set when draining ran out of time: runs finishing after it are not stored.
    closed: AtomicBool,
    /// `limits.inline_run_us`, in nanoseconds (0: no job runs on an HTTP thread).
    inline_run_nanos: u64,
    /// How long the last run of each (graph, policy) took on its thread, plan to outputs:
    /// what decides whether the next one may run inline ([`Jobs::runs_inline`]).
    run_costs: Mutex<HashMap<RunKey, u64>>,
}

/// A graph (by content hash) under a policy (by SHA-256).
type RunKey = (Arc<str>, String);

/// Most (graph, policy) pairs whose last run cost is kept; past it the map starts over.
const RUN_COSTS_KEPT: usize = 4096;

impl Jobs {
    /// Starts `workers` worker threads and the search indexer.
    pub fn start(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        policies: PolicySet,
        data_roots: DataRoots,
        model_roots: DataRoots,
        workers: usize,
        limits: &crate::config::Limits,
        durability: xpu_store::Durability,
        engines: xpu_runtime::SharedEngines,
        tuning: &crate::config::TuningSettings,
    ) -> Arc<Jobs> {
        let capacity = limits.queue_capacity;
        let inline_run = Duration::from_micros(limits.inline_run_us);
        let (queue, rx) = std::sync::mpsc::sync_channel::<Arc<Job>>(capacity);
        let runs_dir = store.dir().join("runs");
        let sync = durability == xpu_store::Durability::Machine;
        let blobs = crate::blobs::Blobs::new(store.dir().join(crate::blobs::DIR), sync);
        let inventory = registry(&engines, &data_roots).inventory();
        let workers = workers.max(1);
        let jobs = Arc::new(Jobs {
            store,
            metrics,
            policies: RwLock::new(Arc::new(policies)),
            cache: PlanCache::new(1024).with_evaluator(xpu_runtime::fold_evaluator()),
            compiled: crate::compiled::CompileCache::new(1024),
            data_roots,
            model_roots,
            file_digests: Default::default(),
            runs_dir,
            blobs,
            engines,
            inventory_fingerprint: inventory.fingerprint(),
            tuning: crate::tuning::Tuning::new(tuning.clone(), &inventory),
            inventory,
            gate: crate::gate::Gate::new(workers, limits.engine_concurrency.clone()),
            prepared: PreparedCache::new(limits.prepared_plans, workers, limits.prepared_bytes),
            live: Mutex::new(HashMap::new()),
            queue,
            queued: AtomicUsize::new(0),
            capacity,
            draining: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            inline_run_nanos: inline_run.as_nanos() as u64,
            run_costs: Mutex::new(HashMap::new()),
        });
        // The threads live as long as the process (workers end when the queue closes).
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers {
            let (jobs, rx) = (jobs.clone(), rx.clone());
            std::thread::Builder::new()
                .name(format!("xpud-worker-{i}"))
                .spawn(move || jobs.work(&rx))
                .expect("spawn worker");
        }
        if jobs.tuning.online() {
            let j = Arc::downgrade(&jobs);
            std::thread::Builder::new()
                .name("xpud-tuning".into())
                .spawn(move || {
                    xpu_store::lower_priority();
                    // The store's evidence read again every refresh_s, off every job's path.
                    while let Some(jobs) = j.upgrade() {
                        let every = jobs.tuning.refresh_every();
                        jobs.tuning.refresh(&jobs.store, &jobs.metrics);
                        drop(jobs);
                        std::thread::sleep(every);
                    }
                })
                .expect("spawn tuning");
        }
        let j = Arc::downgrade(&jobs);
        std::thread::Builder::new()
            .name("xpud-index".into())
            .spawn(move || {
                xpu_store::lower_priority();
                // The search index follows the database in one tantivy commit a second
                // (each commit is a new segment to merge later: fewer is cheaper).
                while let Some(jobs) = j.upgrade() {
                    let tick = Instant::now() + Duration::from_secs(1);
                    let _ = jobs.store.index_pending();
                    if let Ok(p) = jobs.store.progress() {
                        jobs.metrics.index_lag.set(p.committed.saturating_sub(p.indexed) as i64);
                        jobs.metrics
                            .store_pending
                            .set(p.journaled.saturating_sub(p.committed) as i64);
                    }
                    drop(jobs);
                    std::thread::sleep(tick.saturating_duration_since(Instant::now()));
                }
            })
            .expect("spawn indexer");
        jobs
    }

    /// The engines one job runs on: the shared engines (cpu, ort) and a fresh table engine, whose
    /// DuckDB connection is then the job's own.
    pub fn registry(&self) -> xpu_engine::Registry {
        registry(&self.engines, &self.data_roots)
    }

    /// Runs `f` holding one of the `limits.workers` execution slots, as a job does (an ask's
    /// dry run, so asks do not run beside the jobs uncounted); waits for a free slot until
    /// `deadline` and answers `None` if none came.
    pub fn in_slot<R>(&self, deadline: std::time::Instant, f: impl FnOnce() -> R) -> Option<R> {
        while !self.gate.try_take_slot() {
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        struct Release<'a>(&'a crate::gate::Gate<Admitted>);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.release_slot();
            }
        }
        let _slot = Release(&self.gate);
        Some(f())
    }

    /// [`registry`](Jobs::registry) with a table engine confined to other roots (an ask's
    /// dry run reads its sample).
    pub fn registry_in(&self, roots: &DataRoots) -> xpu_engine::Registry {
        registry(&self.engines, roots)
    }

    /// What the planner sees of [`registry`](Jobs::registry)'s engines.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The plan cache's keys for a job, both computed already (at compile, at start).
    pub fn plan_keys<'a>(&'a self, spec: &'a JobSpec) -> xpu_plan::Keys<'a> {
        xpu_plan::Keys {
            graph_hash: &spec.graph_hash,
            inventory_fingerprint: &self.inventory_fingerprint,
        }
    }

    /// The policy a dry run of `policy` is planned under (online tuning: the store's
    /// evidence, as a run that does not explore gets it).
    pub fn showing_policy(&self, policy: &Arc<Policy>) -> Arc<Policy> {
        self.tuning.showing(policy)
    }

    /// This machine's fingerprint: what the store files run timings under.
    pub fn machine_fingerprint(&self) -> &str {
        self.tuning.fingerprint()
    }

    pub fn policies(&self) -> Arc<PolicySet> {
        self.policies.read().map(|p| p.clone()).unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Queues a job; its files are written first so a replay can repeat it.
    pub fn submit(&self, spec: JobSpec) -> Result<Arc<Job>, SubmitError> {
        let job = self.accept(spec)?;
        self.enqueue(job)
    }

    /// Runs a job here, on the calling (blocking) thread, when a slot is free and nothing
    /// is queued — a waited job then pays no hand-off to a worker and back; otherwise
    /// queues it like [`submit`](Jobs::submit). `accepted` is told once, before the job
    /// runs (so a waiter can stop waiting at its limit while it runs on) or once it is
    /// queued, or with the reason it was refused.
    pub fn submit_and_run_here(
        &self,
        spec: JobSpec,
        here: Here,
        accepted: impl FnOnce(Result<Arc<Job>, SubmitError>),
    ) {
        let job = match self.accept(spec) {
            Ok(job) => job,
            Err(e) => return accepted(Err(e)),
        };
        if self.queued.load(Ordering::Acquire) > 0 || !self.gate.try_take_slot() {
            return accepted(self.enqueue(job));
        }
        accepted(Ok(job.clone()));
        self.metrics.job_threads.with_label_values(&[here.label()]).inc();
        self.execute(job);
        self.gate.release_slot();
    }

    /// Whether a waited job of `spec` may run on the HTTP thread that received it: the last
    /// run of its graph under its policy took at most `limits.inline_run_us` (plan to
    /// outputs kept), nothing is queued, and the store takes a run without waiting. Such a job
    /// then costs no hand-off to the blocking pool and back (about half the server's time
    /// for a tiny job); one never seen, or slow, runs off the HTTP threads.
    pub fn runs_inline(&self, spec: &JobSpec) -> bool {
        if self.inline_run_nanos == 0 || self.queued.load(Ordering::Acquire) > 0 {
            return false;
        }
        let key = (spec.graph_hash.clone(), spec.policy.sha256.clone());
        let fast = self
            .run_costs
            .lock()
            .ok()
            .and_then(|c| c.get(&key).copied())
            .is_some_and(|nanos| nanos <= self.inline_run_nanos);
        fast && !self.store.backlogged()
    }

    fn note_run_cost(&self, spec: &JobSpec, nanos: u64) {
        if let Ok(mut costs) = self.run_costs.lock() {
            if costs.len() >= RUN_COSTS_KEPT {
                costs.clear();
            }
            costs.insert((spec.graph_hash.clone(), spec.policy.sha256.clone()), nanos);
        }
    }

    /// Makes a job of `spec`: its files kept, it is live (findable by id) from here on.
    fn accept(&self, spec: JobSpec) -> Result<Arc<Job>, SubmitError> {
        if self.draining.load(Ordering::Acquire) {
            return Err(SubmitError::Draining);
        }
        let run_id = ulid::Ulid::new().to_string().to_ascii_lowercase();
        let start = Instant::now();
        self.keep_program(&spec)?;
        let files = nanos_since(start);
        let (phase, _) = tokio::sync::watch::channel(Phase::Queued);
        let job = Arc::new(Job {
            run_id: run_id.clone(),
            spec,
            submitted: Instant::now(),
            submitted_us: now_us(),
            stop: StopToken::new(),
            phase,
            timings: JobTimings { files: AtomicU64::new(files), ..JobTimings::default() },
        });
        self.live.lock().map_err(|_| SubmitError::Draining)?.insert(run_id, job.clone());
        Ok(job)
    }

    fn enqueue(&self, job: Arc<Job>) -> Result<Arc<Job>, SubmitError> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        match self.queue.try_send(job.clone()) {
            Ok(()) => {
                self.metrics.queue_depth.inc();
                Ok(job)
            }
            Err(e) => {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                if let Ok(mut live) = self.live.lock() {
                    live.remove(&job.run_id);
                }
                Err(match e {
                    TrySendError::Full(_) => SubmitError::QueueFull(self.capacity),
                    TrySendError::Disconnected(_) => SubmitError::Draining,
                })
            }
        }
    }

    /// Cancels a live job: one waiting (queued, or parked for its engine) ends cancelled
    /// without running; a running one stops at its engine's next check (between nodes; a
    /// DuckDB query is interrupted) and ends cancelled, its outputs discarded.
    pub fn cancel(&self, job: &Arc<Job>) {
        job.stop.cancel();
        if let Some((parked, planned)) = self.gate.unpark(|(j, _)| j.run_id == job.run_id) {
            self.metrics.queue_depth.dec();
            self.metrics.engine_waiting.set(self.gate.parked() as i64);
            let mut r = self.base_record(&parked, RunStatus::Cancelled);
            r.queue_us = parked.submitted.elapsed().as_micros() as u64;
            r.error = Some("cancelled while waiting for its engine".into());
            r.explanation = Some(planned.explanation);
            self.finish(&parked, r);
        }
    }

    /// A job not yet stored.
    pub fn live(&self, run_id: &str) -> Option<Arc<Job>> {
        self.live.lock().ok()?.get(run_id).cloned()
    }

    pub fn live_count(&self) -> usize {
        self.live.lock().map_or(0, |l| l.len())
    }

    /// Where a run's kept files are (its inputs).
    pub fn run_dir(&self, run_id: &str) -> PathBuf {
        self.runs_dir.join(run_id)
    }

    /// A binary program (ONNX) a run was submitted with: from the blob store, or from the
    /// run's directory, where runs stored by earlier versions kept it.
    pub fn kept_program(&self, run_id: &str, name: &str, sha256: &str) -> std::io::Result<Vec<u8>> {
        match self.blobs.get(sha256, program_ext(name)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::read(self.run_dir(run_id).join(format!("program.{}", program_ext(name))))
            }
            other => other,
        }
    }

    /// The bytes of a run's output (`ext` npy or csv), by the SHA-256 its record lists.
    pub fn output_bytes(&self, sha256: &str, ext: &str) -> std::io::Result<Vec<u8>> {
        self.store.read_kept(&crate::blobs::Blobs::relative_path(sha256, ext)?)
    }

    /// Stops taking jobs and waits up to `bound` for the queued and running ones to be
    /// stored; runs finishing later are not. Returns how many were still unfinished.
    pub fn drain(&self, bound: Duration) -> usize {
        self.draining.store(true, Ordering::Release);
        let until = Instant::now() + bound;
        while self.live_count() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.closed.store(true, Ordering::Release);
        self.live_count()
    }

    fn work(&self, rx: &Mutex<Receiver<Arc<Job>>>) {
        loop {
            let next = match rx.lock() {
                Ok(r) => r.recv(),
                Err(_) => return,
            };
            let Ok(job) = next else { return };
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.metrics.queue_depth.dec();
            self.gate.take_slot();
            self.metrics.job_threads.with_label_values(&["worker"]).inc();
            self.execute(job);
            self.gate.release_slot();
        }
    }

    /// Plans a job and runs it (or parks it for its engine), then every parked job its
    /// engines' release admits, on this thread (which holds an execution slot).
    fn execute(&self, job: Arc<Job>) {
        let start = Instant::now();
        if job.is_cancelled() {
            let queue_us = job.submitted.elapsed().as_micros() as u64;
            let mut r = self.base_record(&job, RunStatus::Cancelled);
            r.queue_us = queue_us;
            r.error = Some("cancelled before it started".into());
            return self.finish(&job, r);
        }
        let planned = match self.plan(&job) {
            Ok(p) => p,
            Err(mut r) => {
                r.queue_us = job.submitted.elapsed().as_micros() as u64;
                return self.finish(&job, *r);
            }
        };
        let engines = self.gate.limited(planned.engines());
        let Some(first) = self.gate.enter(engines, (job, planned)) else {
            // Parked: its engine's next release runs it.
            self.metrics.queue_depth.inc();
            self.metrics.engine_waiting.set(self.gate.parked() as i64);
            return;
        };
        let mut ready = vec![first];
        let mut first_run = true;
        while let Some((job, planned)) = ready.pop() {
            let engines = self.gate.limited(planned.engines());
            self.metrics.running.inc();
            let (record, files) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run(&job, planned)))
                    .unwrap_or_else(|_| {
                        let error = "internal error: the job's engine panicked".into();
                        (self.failed(&job, None, error), Vec::new())
                    });
            self.metrics.running.dec();
            if first_run {
                // The job this call was for, planned and run without waiting (noted before
                // its waiter is woken, so that the client's next job finds it).
                self.note_run_cost(&job.spec, nanos_since(start));
                first_run = false;
            }
            self.finish_with(&job, record, files);
            let admitted = self.gate.leave(&engines);
            if !admitted.is_empty() {
                self.metrics.queue_depth.sub(admitted.len() as i64);
                self.metrics.engine_waiting.set(self.gate.parked() as i64);
            }
            ready.extend(admitted.into_iter().rev());
        }
    }

    /// Stores a finished run and reports it, unless draining ran out of time.
    fn finish(&self, job: &Job, record: RunRecord) {
        self.finish_with(job, record, Vec::new());
    }

    /// [`finish`](Jobs::finish) for a run that made output blobs to keep with it.
    fn finish_with(&self, job: &Job, record: RunRecord, outputs: Vec<KeptFile>) {
        if self.closed.load(Ordering::Acquire) {
            // Draining ran out of time: this run is not stored (nor reported).
            if let Ok(mut live) = self.live.lock() {
                live.remove(&job.run_id);
            }
            return;
        }
        self.store_run(job, record, outputs);
    }

    fn base_record(&self, job: &Job, status: RunStatus) -> RunRecord {
        let s = &job.spec;
        RunRecord {
            run_id: job.run_id.clone(),
            tenant: s.tenant.clone(),
            status,
            program_name: s.program_name.clone(),
            program_kind: s.program_kind.to_string(),
            program_sha256: s.program_sha256.clone(),
            program_source: s
                .program_text
                .then(|| String::from_utf8_lossy(&s.program_bytes).into_owned()),
            policy_name: s.policy.name().to_string(),
            policy_version: s.policy.spec.policy.version,
            policy_sha256: s.policy.sha256.clone(),
            labels: s.labels.clone(),
            submitted_us: job.submitted_us,
            started_us: None,
            finished_us: now_us(),
            queue_us: 0,
            run_us: 0,
            error: None,
            outputs: Vec::new(),
            explanation: None,
            environment: environment(),
            machine: Some(self.tuning.fingerprint().to_string()),
        }
    }

    fn failed(
        &self,
        job: &Job,
        explanation: Option<xpu_plan::Explanation>,
        error: String,
    ) -> RunRecord {
        let mut r = self.base_record(job, RunStatus::Failed);
        r.error = Some(error);
        r.explanation = explanation;
        r
    }

    /// The job's plan: a cache probe when warm (the graph's hash and the inventory's
    /// fingerprint are known already). A job with no plan ends here, failed, explained.
    fn plan(&self, job: &Job) -> Result<Planned, Box<RunRecord>> {
        let s = &job.spec;
        let keys = self.plan_keys(s);
        let tuning = self.tuning.planning(&s.policy, &s.graph_hash);
        let plan_under = |policy: &Policy| {
            xpu_runtime::plan_job(
                &s.graph,
                &s.inputs,
                policy,
                &self.inventory,
                Some(&self.cache),
                Some(keys),
            )
        };
        let mut planned = plan_under(&tuning.policy);
        // An exploring plan that cannot be made (a fallback budget it exceeds) leaves the
        // run to the plan that does not explore.
        if planned.is_err()
            && let Some(exploit) = &tuning.exploit
        {
            planned = plan_under(exploit);
        }
        let planned = planned.map_err(|e| {
            let ex = e.explanation().cloned();
            Box::new(self.failed(job, ex, e.to_string()))
        })?;
        self.metrics
            .plan_cache
            .with_label_values(&[if planned.cache_hit { "hit" } else { "miss" }])
            .inc();
        job.timings.plan.store(planned.plan_nanos, Ordering::Release);
        self.tuning.observe(&planned.explanation, &self.metrics);
        Ok(planned)
    }

    /// Runs a planned job: its record, and the output blobs it made that are not kept yet.
    fn run(&self, job: &Job, planned: Planned) -> (RunRecord, Vec<KeptFile>) {
        // Waiting: in the queue, and parked for an engine (planning is not waiting).
        let queue_us = (job.submitted.elapsed().as_nanos() as u64)
            .saturating_sub(job.timings.plan.load(Ordering::Acquire))
            / 1000;
        self.metrics.queue_wait.observe(queue_us as f64 * 1e-6);
        job.phase.send_replace(Phase::Running);
        let started_us = now_us();
        let start = Instant::now();
        let registry = self.registry();
        let s = &job.spec;
        let result = xpu_runtime::run_planned(
            &s.graph,
            planned,
            &s.inputs,
            &registry,
            &job.stop,
            Some(&self.prepared),
        );
        let run_us = start.elapsed().as_micros() as u64;
        let mut files = Vec::new();
        let mut record = match result {
            Ok(ran) => {
                job.timings.run.store(ran.run_nanos, Ordering::Release);
                let cancelled = job.is_cancelled();
                let mut r = self.base_record(
                    job,
                    if cancelled { RunStatus::Cancelled } else { RunStatus::Succeeded },
                );
                if cancelled {
                    r.error = Some("cancelled while running; outputs discarded".into());
                } else {
                    let start = Instant::now();
                    match self.keep_outputs(&ran.outputs) {
                        Ok((outputs, new)) => {
                            r.outputs = outputs;
                            files = new;
                        }
                        Err(e) => {
                            r.status = RunStatus::Failed;
                            r.error = Some(format!("cannot keep the outputs: {e}"));
                        }
                    }
                    job.timings.outputs.store(nanos_since(start), Ordering::Release);
                }
                self.metrics.observe_run(&ran.explanation);
                r.explanation = Some(ran.explanation);
                r
            }
            Err(e) => {
                use xpu_plan::ExecError;
                let ex = e.explanation().cloned();
                let mut r = self.failed(job, ex, e.to_string());
                match &e {
                    xpu_runtime::RunError::Exec(ExecError::Timeout { .. }) => {
                        r.status = RunStatus::TimedOut;
                    }
                    xpu_runtime::RunError::Exec(ExecError::Cancelled { .. }) => {
                        r.status = RunStatus::Cancelled;
                    }
                    _ => {}
                }
                r
            }
        };
        record.queue_us = queue_us;
        record.started_us = Some(started_us);
        record.run_us = run_us;
        record.finished_us = now_us();
        (record, files)
    }

    /// Keeps each output (`.npy` for tensors, `.csv` for tables) as a blob named by its
    /// SHA-256, which the run's record lists: returns the records' entries and the blobs not
    /// kept yet, which travel with the run into the store's journal.
    fn keep_outputs(
        &self,
        outputs: &[(String, Tensor)],
    ) -> Result<(Vec<OutputInfo>, Vec<KeptFile>), String> {
        let mut infos = Vec::new();
        let mut new = Vec::new();
        for (name, t) in outputs {
            let (bytes, ext) = xpu_runtime::tensors::value_file(t).map_err(|e| e.to_string())?;
            let sha256 = sha256_hex(&bytes);
            let size = bytes.len() as u64;
            // Memory only: a new output's `stat` cost more than carrying it in the frame, and
            // one already on disk from an earlier process is left as it is by the feeder.
            if !self.blobs.kept_here(&sha256, ext) {
                let path =
                    crate::blobs::Blobs::relative_path(&sha256, ext).map_err(|e| e.to_string())?;
                new.push(KeptFile { path, bytes });
            }
            infos.push(OutputInfo {
                name: name.clone(),
                dtype: t.dtype().name().to_string(),
                shape: t.shape().to_vec(),
                sha256,
                bytes: size,
            });
        }
        Ok((infos, new))
    }

    /// What a run keeps beside its record for a replay: its inputs (`.npy` tensors, `.csv`
    /// tables) under `runs/<id>/inputs/`. A text program is in the record itself
    /// (`program_source`), a binary one in the blob store.
    fn input_files(&self, job: &Job) -> Result<Vec<KeptFile>, String> {
        let s = &job.spec;
        s.input_names
            .iter()
            .zip(&s.inputs)
            .map(|(name, t)| {
                let (bytes, ext) =
                    xpu_runtime::tensors::value_file(t).map_err(|e| e.to_string())?;
                let file = xpu_runtime::tensors::output_file_name(name);
                Ok(KeptFile { path: format!("runs/{}/inputs/{file}.{ext}", job.run_id), bytes })
            })
            .collect()
    }

    /// Journals a finished run, then reports it complete. A run the store cannot take
    /// (its disk is full) is reported failed with the reason, and is not stored.
    fn store_run(&self, job: &Job, mut record: RunRecord, outputs: Vec<KeptFile>) {
        let start = Instant::now();
        let mut files = match self.input_files(job) {
            Ok(files) => files,
            Err(e) => {
                record.status = RunStatus::Failed;
                record.error = Some(format!("cannot keep the inputs for a replay: {e}"));
                Vec::new()
            }
        };
        let new_blobs: Vec<String> = outputs.iter().map(|f| f.path.clone()).collect();
        files.extend(outputs);
        let mut summary = record.summary(0);
        let stored = self.store.append_with_files(vec![(record, files)]);
        if stored.is_ok() {
            // Only once journaled: a blob is kept before another run may count on it.
            self.blobs.remember_kept(&new_blobs);
        }
        job.timings.store.store(nanos_since(start), Ordering::Release);
        self.metrics.store_write.observe(start.elapsed().as_secs_f64());
        match stored {
            Ok(seqs) => {
                summary.seq = seqs.first().copied().unwrap_or(0);
                self.metrics
                    .jobs
                    .with_label_values(&[summary.status.name(), summary.policy_name.as_str()])
                    .inc();
                self.metrics
                    .job_duration
                    .with_label_values(&[&summary.policy_name])
                    .observe(summary.run_us as f64 * 1e-6);
            }
            Err(e) => {
                tracing::error!("run {} could not be stored: {e}", job.run_id);
                self.metrics.store_errors.with_label_values(&["journal"]).inc();
                summary.status = RunStatus::Failed;
                summary.error = Some(format!("the run finished but could not be stored: {e}"));
            }
        }
        // Out of the live set first: the store already holds the run, and a client woken by
        // `Done` must find it there (not a live job answering "not finished").
        if let Ok(mut live) = self.live.lock() {
            live.remove(&job.run_id);
        }
        job.phase.send_replace(Phase::Done(Box::new(summary)));
    }

    /// Keeps a binary program (ONNX) in the blob store for replays, once: a model submitted
    /// again and again is written the first time only (and a known model file not read).
    fn keep_program(&self, spec: &JobSpec) -> Result<(), SubmitError> {
        let io = |e: std::io::Error| SubmitError::Io(e.to_string());
        if !spec.program_text {
            // Content-addressed: a model submitted again and again is written once.
            let ext = program_ext(&spec.program_name);
            match &spec.program_file {
                Some(file) if !self.blobs.has(&spec.program_sha256, ext) => {
                    let bytes = std::fs::read(file).map_err(io)?;
                    if sha256_hex(&bytes) != spec.program_sha256 {
                        return Err(SubmitError::Io(format!(
                            "{} changed while the job was submitted",
                            file.display()
                        )));
                    }
                    self.blobs.put(&spec.program_sha256, ext, &bytes).map_err(io)?;
                }
                Some(_) => {}
                None => {
                    self.blobs.put(&spec.program_sha256, ext, &spec.program_bytes).map_err(io)?
                }
            }
        }
        Ok(())
    }
}

/// The engines every job runs on: the shared engines and a fresh table engine.
fn registry(engines: &xpu_runtime::SharedEngines, roots: &DataRoots) -> xpu_engine::Registry {
    engines.registry(xpu_engine_table::TableEngine::with_canonical_roots(roots.roots().to_vec()))
}

/// The extension a kept binary program has (in the blob store, by its SHA-256).
fn program_ext(program_name: &str) -> &str {
    Path::new(program_name).extension().and_then(|e| e.to_str()).unwrap_or("bin")
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// What a run records about where it ran.
fn environment() -> Vec<(String, String)> {
    vec![
        ("xpud".into(), env!("CARGO_PKG_VERSION").into()),
        ("os".into(), std::env::consts::OS.into()),
        ("arch".into(), std::env::consts::ARCH.into()),
    ]
}
