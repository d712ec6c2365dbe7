//! The Prometheus metrics `/metrics` serves (names and labels documented in
//! `docs/metrics.md`; `promtool check metrics` runs over the exposition in the tests).

use prometheus::{
    Counter, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub jobs: IntCounterVec,
    pub job_duration: HistogramVec,
    pub queue_wait: Histogram,
    pub nodes: IntCounterVec,
    pub node_duration: HistogramVec,
    pub fallbacks: IntCounterVec,
    pub precision_overrides: IntCounterVec,
    pub transfer_bytes: IntCounterVec,
    pub plan_cache: IntCounterVec,
    pub prepare: IntCounterVec,
    pub prepared_kept: IntGaugeVec,
    pub engine_plan_cache: IntGaugeVec,
    pub policy_reloads: IntCounterVec,
    pub engine_available: IntGaugeVec,
    pub queue_depth: IntGauge,
    pub running: IntGauge,
    pub job_threads: IntCounterVec,
    pub engine_waiting: IntGauge,
    pub store_write: Histogram,
    pub store_commit: Histogram,
    pub store_pending: IntGauge,
    pub store_replayed: IntGauge,
    pub rejected: IntCounterVec,
    pub http_requests: IntCounterVec,
    pub server_overhead: Histogram,
    pub index_lag: IntGauge,
    pub store_errors: IntCounterVec,
    pub asks: IntCounterVec,
    pub worker_restarts: IntCounterVec,
    pub worker_starts: IntCounterVec,
    pub workers_alive: IntGaugeVec,
    pub workers_retired: IntCounterVec,
    pub worker_crashed_jobs: IntCounterVec,
    pub tuning_explorations: IntCounter,
    pub tuning_choice_changes: IntCounter,
    pub tuning_saved: Counter,
    pub tuning_signatures: IntGauge,
}

/// Buckets for durations from 10 µs to ~100 s.
fn seconds_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(1e-5, 4.0, 12).unwrap_or_default()
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("metric definitions are static and valid");
                registry.register(Box::new(m.clone())).expect("metric names are unique");
                m
            }};
        }
        let h = |name: &str, help: &str| HistogramOpts::new(name, help).buckets(seconds_buckets());
        Metrics {
            jobs: reg!(IntCounterVec::new(
                Opts::new("xpu_jobs_total", "Jobs finished, by final status and policy."),
                &["status", "policy"]
            )),
            job_duration: reg!(HistogramVec::new(
                h("xpu_job_duration_seconds", "Time from a job's start to its result, by policy."),
                &["policy"]
            )),
            queue_wait: reg!(Histogram::with_opts(h(
                "xpu_job_queue_wait_seconds",
                "Time jobs waited in the queue before a worker took them."
            ))),
            nodes: reg!(IntCounterVec::new(
                Opts::new("xpu_nodes_total", "Graph nodes run, by engine, op and kernel."),
                &["engine", "op", "kernel"]
            )),
            node_duration: reg!(HistogramVec::new(
                h("xpu_node_duration_seconds", "Wall time of node kernels, by engine, op and kernel."),
                &["engine", "op", "kernel"]
            )),
            fallbacks: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_fallbacks_total",
                    "Nodes placed on another engine than their first choice, by from, to and reason code."
                ),
                &["from", "to", "reason"]
            )),
            precision_overrides: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_precision_overrides_total",
                    "Nodes run at a precision other than the graph's, by precision and the policy key that chose it."
                ),
                &["precision", "from"]
            )),
            transfer_bytes: reg!(IntCounterVec::new(
                Opts::new("xpu_transfer_bytes_total", "Bytes moved between devices, by direction."),
                &["direction"]
            )),
            plan_cache: reg!(IntCounterVec::new(
                Opts::new("xpu_plan_cache_total", "Plan cache lookups, by result (hit or miss)."),
                &["result"]
            )),
            prepare: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_prepare_total",
                    "Partitions a run got an executable for, by engine and outcome (prepared for it, or reused from the prepared cache).",
                ),
                &["engine", "outcome"]
            )),
            prepared_kept: reg!(IntGaugeVec::new(
                Opts::new(
                    "xpu_prepared_cache",
                    "The prepared cache now, by what: plans, idle executables, bytes of weights they hold, executables evicted so far.",
                ),
                &["what"]
            )),
            engine_plan_cache: reg!(IntGaugeVec::new(
                Opts::new(
                    "xpu_engine_plan_cache",
                    "An engine's per-executable plan cache as the last run on it reported it (the cuda engine's cuBLASLt plans), by engine and what: entries held, entries evicted so far.",
                ),
                &["engine", "what"]
            )),
            policy_reloads: reg!(IntCounterVec::new(
                Opts::new("xpu_policy_reloads_total", "Policy set reloads, by result (ok or rejected)."),
                &["result"]
            )),
            engine_available: reg!(IntGaugeVec::new(
                Opts::new("xpu_engine_available", "1 when the engine can run jobs here, 0 when not."),
                &["engine"]
            )),
            queue_depth: reg!(IntGauge::new("xpu_queue_depth", "Jobs waiting in the queue.")),
            running: reg!(IntGauge::new("xpu_jobs_running", "Jobs running now.")),
            engine_waiting: reg!(IntGauge::new(
                "xpu_engine_waiting_jobs",
                "Planned jobs waiting for an engine at its limits.engine_concurrency."
            )),
            store_write: reg!(Histogram::with_opts(h(
                "xpu_store_write_seconds",
                "Time to journal one finished run, the step before it is reported complete."
            ))),
            store_commit: reg!(Histogram::with_opts(h(
                "xpu_store_commit_seconds",
                "Time of one DuckDB transaction taking journaled runs into the database."
            ))),
            store_pending: reg!(IntGauge::new(
                "xpu_store_pending_runs",
                "Runs journaled (reported complete) but not yet committed to the database."
            )),
            store_replayed: reg!(IntGauge::new(
                "xpu_store_replayed_runs",
                "Runs committed from the journal at start: acknowledged before an unclean stop."
            )),
            job_threads: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_job_threads_total",
                    "Jobs started, by the thread that ran them: http (inline, a small known-fast \
                     waited job), request (in place on the request's blocking thread), worker.",
                ),
                &["thread"]
            )),
            rejected: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_requests_rejected_total",
                    "Requests refused before any work, by reason (queue_full, too_large, unauthorized, forbidden, invalid)."
                ),
                &["reason"]
            )),
            http_requests: reg!(IntCounterVec::new(
                Opts::new("xpu_http_requests_total", "HTTP requests answered, by route and status class."),
                &["route", "class"]
            )),
            tuning_explorations: reg!(IntCounter::new(
                "xpu_tuning_explorations_total",
                "Runs planned with at least one node exploring a candidate with thin evidence ([tuning] online)."
            )),
            tuning_choice_changes: reg!(IntCounter::new(
                "xpu_tuning_choice_changes_total",
                "Node signatures whose fastest measured candidate changed when the evidence was read again."
            )),
            tuning_saved: reg!(Counter::new(
                "xpu_tuning_estimated_saved_seconds_total",
                "Estimated time measured choices saved: per run, the measured medians of the static choices they replaced minus their own."
            )),
            tuning_signatures: reg!(IntGauge::new(
                "xpu_tuning_evidence_signatures",
                "Node signatures in the evidence online tuning last read from the store."
            )),
            server_overhead: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "xpu_job_overhead_seconds",
                    "Server time of a waited job outside its plan's execution (parse, queue, plan lookup, store)."
                )
                .buckets(seconds_buckets())
            )),
            index_lag: reg!(IntGauge::new(
                "xpu_search_index_lag_runs",
                "Committed runs not yet in the search index."
            )),
            store_errors: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_store_errors_total",
                    "Store writes that failed, by stage: journal (the run is reported failed, not stored) or database (retried; the runs stay in the journal)."
                ),
                &["stage"]
            )),
            asks: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_asks_total",
                    "Asks (POST /v1/asks) by event: started, then how each ended (accepted, out_of_attempts, out_of_tokens, out_of_time, endpoint_failed; not_stored when the store refused it)."
                ),
                &["outcome"]
            )),
            worker_restarts: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_worker_restarts_total",
                    "Engine worker processes that ended other than by xpud closing them, by engine and cause (a signal such as SIGSEGV, an exit status, timeout, cancelled, memory)."
                ),
                &["engine", "cause"]
            )),
            worker_starts: reg!(IntCounterVec::new(
                Opts::new("xpu_worker_starts_total", "Engine worker processes started, by engine."),
                &["engine"]
            )),
            workers_alive: reg!(IntGaugeVec::new(
                Opts::new("xpu_workers_alive", "The engine's worker processes running now."),
                &["engine"]
            )),
            workers_retired: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_worker_retired_total",
                    "Engine worker processes closed after isolation.idle_exit_s without a request (not the engine's first), by engine."
                ),
                &["engine"]
            )),
            worker_crashed_jobs: reg!(IntCounterVec::new(
                Opts::new(
                    "xpu_worker_crashed_jobs_total",
                    "Jobs that failed because their engine's worker process died under them."
                ),
                &["engine"]
            )),
            registry,
        }
    }

    /// The engine workers' counts, as of a scrape.
    pub fn observe_workers(&self) {
        let catch_up = |c: prometheus::IntCounter, to: u64| {
            if let Some(d) = to.checked_sub(c.get()).filter(|d| *d > 0) {
                c.inc_by(d);
            }
        };
        for (engine, s) in xpu_runtime::worker::stats_snapshot() {
            catch_up(self.worker_starts.with_label_values(&[&engine]), s.starts);
            catch_up(self.worker_crashed_jobs.with_label_values(&[&engine]), s.crashed_jobs);
            catch_up(self.workers_retired.with_label_values(&[&engine]), s.retired);
            for (cause, n) in &s.restarts {
                catch_up(self.worker_restarts.with_label_values(&[&engine, cause]), *n);
            }
            self.workers_alive.with_label_values(&[&engine]).set(s.alive as i64);
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Counts what a finished run's explanation says.
    pub fn observe_run(&self, ex: &xpu_plan::Explanation) {
        // One lookup table per run, not a scan of the decisions per timing.
        let ops: std::collections::HashMap<xpu_ir::NodeId, &str> =
            ex.decisions.iter().map(|d| (d.node, d.op.as_ref())).collect();
        for t in &ex.timings {
            let op = ops.get(&t.node).copied().unwrap_or("?");
            let labels = [t.engine.as_str(), op, t.kernel.as_str()];
            self.nodes.with_label_values(&labels).inc();
            self.node_duration.with_label_values(&labels).observe(t.nanos as f64 * 1e-9);
        }
        for d in &ex.decisions {
            if let (Some(f), Some(c)) = (&d.fallback, &d.chosen) {
                self.fallbacks
                    .with_label_values(&[f.from.as_str(), c.engine.as_ref(), f.code.name()])
                    .inc();
            }
            if let (Some(p), Some(c)) = (&d.precision_from, &d.chosen)
                && p.key.as_ref() != "graph dtype"
                && let Some(prec) = c.precision
            {
                self.precision_overrides.with_label_values(&[prec.name(), &p.key]).inc();
            }
        }
        for t in &ex.transfers_done {
            self.transfer_bytes.with_label_values(&[t.direction.name()]).inc_by(t.bytes);
        }
        for p in &ex.prepared {
            self.prepare.with_label_values(&[p.engine.as_str(), p.outcome.name()]).inc();
        }
        for f in &ex.facts {
            if let Some(what) = plan_cache_fact(&f.key)
                && let Ok(v) = f.value.parse::<i64>()
            {
                self.engine_plan_cache.with_label_values(&[f.engine.as_str(), what]).set(v);
            }
        }
    }

    /// The prepared cache's sizes, as of a scrape.
    pub fn observe_prepared(&self, s: xpu_plan::PreparedStats) {
        for (what, v) in [
            ("plans", s.plans as u64),
            ("executables", s.idle as u64),
            ("bytes", s.bytes),
            ("evicted", s.evicted),
        ] {
            self.prepared_kept.with_label_values(&[what]).set(v as i64);
        }
    }
}

/// The `what` label of an engine fact that reports a plan cache's size
/// (`xpu_engine_plan_cache`), if `key` is one.
fn plan_cache_fact(key: &str) -> Option<&'static str> {
    match key {
        "cuda.cublaslt_plans" => Some("entries"),
        "cuda.cublaslt_plans_evicted" => Some("evicted"),
        _ => None,
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_plan_cache_facts_set_the_gauge() {
        let fact = |key: &str, value: &str| serde_json::json!({"engine": "cuda", "node": null, "key": key, "value": value});
        let ex: xpu_plan::Explanation = serde_json::from_value(serde_json::json!({
            "graph_hash": "h", "graph_name": "g",
            "policy": {"name": "p", "version": 1, "sha256": "s"}, "policy_files": [],
            "inventory": {"name": "i", "fingerprint": "f"},
            "decisions": [], "casts": [], "transfers": [],
            "memory": {"peak_bytes": null, "arena_bytes": 0, "limit_bytes": null},
            "warnings": [], "errors": [],
            "facts": [
                fact("cuda.cublaslt_plans", "256"),
                fact("cuda.cublaslt_plans_evicted", "17"),
                fact("cuda.device", "NVIDIA H200"),
                fact("cuda.cublaslt_plans", "not a number"),
            ],
        }))
        .unwrap();
        let m = Metrics::new();
        m.observe_run(&ex);
        let text = m.render();
        assert!(
            text.contains("xpu_engine_plan_cache{engine=\"cuda\",what=\"entries\"} 256"),
            "{text}"
        );
        assert!(
            text.contains("xpu_engine_plan_cache{engine=\"cuda\",what=\"evicted\"} 17"),
            "{text}"
        );
    }
}
