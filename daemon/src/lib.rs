//! xpud, the xpu daemon, as a library (the binary is `main.rs`; tests drive the router
//! without a socket). Jobs arrive over REST (`api`), wait in a bounded queue and run on
//! worker threads (`jobs`) under policies (`policies`); every finished run is committed to
//! the explanation store before it is reported complete; Prometheus metrics (`metrics`);
//! bearer-token auth with scopes and tenants (`auth`); figment configuration (`config`).

pub mod api;
pub mod asks;
pub mod auth;
mod blobs;
pub mod compiled;
pub mod config;
mod digests;
/// The request and response bodies (their own crate, `xpu-api`).
pub use xpu_api as dto;
pub mod error;
pub mod gate;
pub mod jobs;
pub mod metrics;
pub mod policies;
pub mod tuning;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

pub use config::Config;

/// Everything a request handler reaches.
pub struct App {
    pub config: Config,
    /// `None` under `--dev` (no authentication).
    pub tokens: Option<auth::Tokens>,
    pub jobs: Arc<jobs::Jobs>,
    pub metrics: Arc<metrics::Metrics>,
    pub draining: AtomicBool,
    /// The asks running now.
    pub asks: asks::Asks,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Store(#[from] xpu_store::StoreError),
    #[error("policies: {0}")]
    Policies(String),
    #[error(transparent)]
    Tokens(#[from] auth::TokensError),
    #[error(
        "no tokens file: set auth.tokens_file (or XPU_AUTH__TOKENS_FILE), or run with --dev on a loopback address"
    )]
    NoAuth,
}

impl App {
    /// Opens the store, loads policies and tokens, starts the workers.
    pub fn start(config: Config) -> Result<Arc<App>, StartError> {
        let tokens = if config.dev {
            None
        } else {
            let file = config.auth.tokens_file.as_ref().ok_or(StartError::NoAuth)?;
            Some(auth::Tokens::load(file)?)
        };
        let metrics = Arc::new(metrics::Metrics::new());
        let m = metrics.clone();
        let on_commit = move |took: std::time::Duration, _runs: usize, err: Option<&_>| {
            m.store_commit.observe(took.as_secs_f64());
            if err.is_some() {
                m.store_errors.with_label_values(&["database"]).inc();
            }
        };
        let options = xpu_store::StoreOptions {
            durability: config.store.durability,
            memory_limit_mb: Some(config.store.memory_limit_mb).filter(|&mib| mib > 0),
            on_commit: Some(Box::new(on_commit)),
        };
        let store = Arc::new(xpu_store::Store::open_with(&config.data_dir, options)?);
        metrics.store_replayed.set(store.replayed() as i64);
        if store.replayed() > 0 {
            tracing::warn!(
                "{} run(s) acknowledged before an unclean stop were committed from the journal",
                store.replayed()
            );
        }
        let policies =
            policies::PolicySet::load(&config.policy_dirs).map_err(StartError::Policies)?;
        let data_roots = xpu_minilang::paths::DataRoots::new(config.data_roots.clone());
        let model_roots = xpu_minilang::paths::DataRoots::new(config.model_roots.clone());
        let engines = xpu_runtime::SharedEngines::load_isolated(
            &config.engines.libraries(&config.data_dir),
            &config.engines.workers(&config.isolation, config.workers()),
        );
        let jobs = jobs::Jobs::start(
            store,
            metrics.clone(),
            policies,
            data_roots,
            model_roots,
            config.workers(),
            &config.limits,
            config.store.durability,
            engines,
            &config.tuning,
        );
        for e in &jobs.inventory().engines {
            metrics
                .engine_available
                .with_label_values(&[&e.engine])
                .set(e.availability.is_available() as i64);
        }
        asks::clear_scratch(&config.data_dir);
        Ok(Arc::new(App {
            config,
            tokens,
            jobs,
            metrics,
            draining: AtomicBool::new(false),
            asks: asks::Asks::default(),
        }))
    }

    /// Reloads the policy set; the old one stays when the new one is invalid.
    /// Watches the policy directories and reloads the set when a file changes, once the
    /// directory has been quiet for 200 ms (editors save in several steps). A bad set is
    /// refused as on SIGHUP. The watch lasts as long as the returned watcher.
    pub fn watch_policies(self: &Arc<Self>) -> Result<notify::RecommendedWatcher, String> {
        use notify::Watcher;
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            if e.is_ok_and(|e| !e.kind.is_access()) {
                let _ = tx.send(());
            }
        })
        .map_err(|e| format!("cannot watch the policy directories: {e}"))?;
        for dir in self.config.policy_dirs.iter().filter(|d| d.is_dir()) {
            watcher
                .watch(dir, notify::RecursiveMode::NonRecursive)
                .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
        }
        let app = self.clone();
        std::thread::Builder::new()
            .name("policy-watch".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    while rx.recv_timeout(std::time::Duration::from_millis(200)).is_ok() {}
                    match app.reload_policies() {
                        Ok(n) => tracing::info!("policy files changed: {n} policies loaded"),
                        Err(e) => tracing::error!(
                            "policy files changed; the new set is refused, the old one stays:\n{e}"
                        ),
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(watcher)
    }

    pub fn reload_policies(&self) -> Result<usize, String> {
        match policies::PolicySet::load(&self.config.policy_dirs) {
            Ok(set) => {
                let n = set.by_name.len();
                if let Ok(mut p) = self.jobs.policies.write() {
                    *p = Arc::new(set);
                }
                self.metrics.policy_reloads.with_label_values(&["ok"]).inc();
                Ok(n)
            }
            Err(e) => {
                self.metrics.policy_reloads.with_label_values(&["rejected"]).inc();
                Err(e)
            }
        }
    }
}
