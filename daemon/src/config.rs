//! xpud's settings, layered by figment: built-in defaults < `xpud.toml` (or `--config`) <
//! `XPU_*` environment variables (`XPU_LISTEN`, `XPU_LIMITS__QUEUE_CAPACITY`, …) < flags.
//! Unknown keys in the file are errors (a typo must not silently keep a default).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    pub listen: String,
    /// Where the store (DuckDB file, search index) and run outputs live.
    pub data_dir: PathBuf,
    /// No authentication; only allowed on a loopback address.
    pub dev: bool,
    /// Directories of policy files (`*.toml`); jobs name policies by `[policy] name`.
    pub policy_dirs: Vec<PathBuf>,
    /// Reload the policy set when a file in `policy_dirs` changes (as SIGHUP does).
    pub watch_policies: bool,
    /// Directories a job's program may read tables and files from (and write to).
    pub data_roots: Vec<PathBuf>,
    /// Directories a job may name a program or model file in (`program.path`).
    pub model_roots: Vec<PathBuf>,
    pub auth: Auth,
    pub limits: Limits,
    pub store: StoreSettings,
    pub engines: Engines,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// When a finished run is acknowledged: `process` (journaled to the operating system:
    /// survives xpud crashing or being killed) or `machine` (also fdatasync'ed: survives
    /// power loss, at one disk flush per run).
    pub durability: xpu_store::Durability,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Auth {
    /// TOML file of `[[token]]` entries (name, sha256 of the token, scopes, tenant).
    pub tokens_file: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Jobs waiting to run; one more is answered 429.
    pub queue_capacity: usize,
    /// Jobs running at once (0: one per core).
    pub workers: usize,
    /// Largest request body, in bytes; larger is answered 413 before it is read.
    pub max_body_bytes: usize,
    /// Longest a `wait` submit blocks before answering with the run still going (seconds).
    pub wait_timeout_s: u64,
    /// On SIGTERM, how long running and queued jobs get to finish (seconds).
    pub drain_timeout_s: u64,
    /// Most rows a SQL query returns.
    pub max_sql_rows: usize,
    /// Runs kept per list page at most.
    pub max_page: usize,
    /// Jobs using an engine at once, by engine name (`table = 1`: one DuckDB job at a time).
    /// A job whose engine is at its limit waits, without holding a worker; an engine not
    /// named here is limited by `workers` alone.
    pub engine_concurrency: std::collections::BTreeMap<String, usize>,
    /// A waited job whose program is compiled already, whose inputs are small and whose
    /// last run of the same graph under the same policy took at most this long (plan to
    /// outputs kept, microseconds) runs on the HTTP thread that received it instead of the
    /// blocking pool: no thread hand-off, about half a tiny job's server time. 0: never.
    pub inline_run_us: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Engines {
    pub ort: OrtSettings,
    pub openvino: OpenVinoSettings,
}

/// `[engines.ort]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrtSettings {
    /// ONNX Runtime's shared library (`libonnxruntime.so`). `XPU_ORT_LIBRARY` overrides it;
    /// unset, the ort engine looks in `.deps/onnxruntime/` (`make setup`).
    pub library: Option<PathBuf>,
}

/// `[engines.openvino]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenVinoSettings {
    /// The directory with OpenVINO's libraries (`libopenvino_c.so` and its plugins).
    /// `XPU_OPENVINO_DIR` overrides it; unset, the engine looks in `.deps/openvino/`.
    pub library_dir: Option<PathBuf>,
    /// OpenVINO's compiled-model cache (CACHE_DIR): a restarted daemon skips recompiling.
    /// Relative paths are under the data dir; unset: `<data dir>/openvino-cache`.
    pub cache_dir: Option<PathBuf>,
}

impl Engines {
    pub fn libraries(&self, data_dir: &std::path::Path) -> xpu_runtime::EngineLibraries {
        let cache = self.openvino.cache_dir.clone().unwrap_or_else(|| "openvino-cache".into());
        xpu_runtime::EngineLibraries {
            ort: self.ort.library.clone(),
            openvino_dir: self.openvino.library_dir.clone(),
            openvino_cache_dir: Some(data_dir.join(cache)),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".into(),
            data_dir: "var".into(),
            dev: false,
            policy_dirs: vec!["policies/examples".into()],
            watch_policies: true,
            data_roots: vec!["examples".into()],
            model_roots: vec!["examples".into()],
            auth: Auth::default(),
            limits: Limits::default(),
            store: StoreSettings::default(),
            engines: Engines::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            queue_capacity: 1024,
            workers: 0,
            max_body_bytes: 16 << 20,
            wait_timeout_s: 60,
            drain_timeout_s: 30,
            max_sql_rows: 10_000,
            max_page: 1000,
            engine_concurrency: Default::default(),
            inline_run_us: 250,
        }
    }
}

/// The top-level keys, so that other `XPU_*` variables (`XPU_SERVER`, `XPU_TOKEN`,
/// `XPU_POLICY__…`) are not taken for settings.
const KEYS: &[&str] = &[
    "listen",
    "data_dir",
    "dev",
    "policy_dirs",
    "watch_policies",
    "data_roots",
    "model_roots",
    "auth",
    "limits",
    "store",
    "engines",
];

/// Settings given on the command line (highest layer).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Flags {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dev: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Figment(Box<figment::Error>),
    #[error("listen = {0:?}: not an address (e.g. 127.0.0.1:8080)")]
    Listen(String),
    #[error(
        "--dev turns authentication off and is refused on {0}, which is not a loopback address"
    )]
    DevNotLoopback(SocketAddr),
    #[error("{0} does not exist")]
    Missing(PathBuf),
    #[error("limits.engine_concurrency.{engine}: {message}")]
    EngineLimit { engine: String, message: String },
}

impl Config {
    /// Loads the layers. `file` is `--config`; without it `xpud.toml` in the working
    /// directory is read when present.
    pub fn load(file: Option<&Path>, flags: &Flags) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        match file {
            Some(f) if !f.exists() => return Err(ConfigError::Missing(f.to_path_buf())),
            Some(f) => fig = fig.merge(Toml::file_exact(f)),
            None if Path::new("xpud.toml").exists() => {
                fig = fig.merge(Toml::file_exact("xpud.toml"))
            }
            None => {}
        }
        let env = Env::prefixed("XPU_")
            .filter(|k| {
                let k = k.as_str().to_ascii_lowercase();
                KEYS.iter().any(|key| k.split("__").next() == Some(*key))
            })
            .split("__");
        fig = fig.merge(env).merge(Serialized::defaults(flags));
        let config: Config = fig.extract().map_err(|e| ConfigError::Figment(Box::new(e)))?;
        config.check()?;
        Ok(config)
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen.parse().map_err(|_| ConfigError::Listen(self.listen.clone()))
    }

    fn check(&self) -> Result<(), ConfigError> {
        let addr = self.listen_addr()?;
        if self.dev && !addr.ip().is_loopback() {
            return Err(ConfigError::DevNotLoopback(addr));
        }
        for (engine, &limit) in &self.limits.engine_concurrency {
            let bad =
                |message: String| ConfigError::EngineLimit { engine: engine.clone(), message };
            if xpu_engine::catalog::engine(engine).is_none() {
                let known: Vec<&str> =
                    xpu_engine::catalog::ENGINES.iter().map(|e| e.name).collect();
                return Err(bad(format!("no engine of that name (known: {})", known.join(", "))));
            }
            if limit == 0 {
                return Err(bad("must be at least 1 (leave the engine out for no limit)".into()));
            }
        }
        Ok(())
    }

    pub fn workers(&self) -> usize {
        if self.limits.workers > 0 {
            self.limits.workers
        } else {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        }
    }
}
