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
    /// How engine worker processes start and are kept (`[engines.<name>] isolation` says
    /// which engines run in one).
    pub isolation: IsolationSettings,
    /// Online tuning: plans of policies that choose by measurement read the store's
    /// evidence, and a share of runs explores.
    pub tuning: TuningSettings,
    /// `[assistant]`: the OpenAI-compatible endpoint and model `POST /v1/asks` asks, where
    /// its API key comes from, and the limits of one ask (docs/ask.md). Without an
    /// endpoint and a model, asks are answered 503 saying how to configure them.
    pub assistant: xpu_assistant::AssistantConfig,
    /// The keys whose built-in default was replaced by a data-dir path at load (no checkout
    /// in the working directory); not a setting.
    #[serde(skip)]
    pub settled: Vec<&'static str>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// When a finished run is acknowledged: `process` (journaled to the operating system:
    /// survives xpud crashing or being killed) or `machine` (also fdatasync'ed: survives
    /// power loss, at one disk flush per run).
    pub durability: xpu_store::Durability,
    /// DuckDB's memory limit, MiB: the store's cache of the runs table stays within it
    /// instead of growing with the table (DuckDB's own default is 80% of the machine's
    /// memory); queries past it spill or fail with DuckDB's out-of-memory error. 0: DuckDB's
    /// default.
    pub memory_limit_mb: u64,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings { durability: xpu_store::Durability::default(), memory_limit_mb: 256 }
    }
}

/// `[tuning]`: what a policy with `choose = "measured"` and no lock reads in xpud.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TuningSettings {
    /// Plan such policies with the evidence of the runs this store holds for this machine
    /// (off: the static order decides them, as everywhere without a lock).
    pub online: bool,
    /// The share of those runs that may explore candidates with thin evidence (0–1; the
    /// policy's `[measured] explore_runs` bounds each node signature's exploring runs).
    pub explore_share: f64,
    /// How often the evidence is read again from the store, seconds (plans made with it
    /// are cached under its digest until then).
    pub refresh_s: u64,
}

impl Default for TuningSettings {
    fn default() -> Self {
        TuningSettings { online: false, explore_share: 0.05, refresh_s: 30 }
    }
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
    /// Plans whose prepared executables are kept between jobs (prepare once, run many);
    /// 0 prepares every job afresh.
    pub prepared_plans: usize,
    /// Bytes of weights the kept prepared executables may hold, all together; the least
    /// recently used plan's go first.
    pub prepared_bytes: u64,
    /// Asks (`POST /v1/asks`) running at once; one more is answered 429. Each holds a
    /// blocking thread while the model writes.
    pub asks_at_once: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Engines {
    pub cpu: CpuSettings,
    pub ort: OrtSettings,
    pub openvino: OpenVinoSettings,
    pub llvm: LlvmSettings,
    pub cuda: CudaSettings,
}

/// `[engines.cuda]`.
/// Where an engine runs: in a supervised worker process (a crash costs its jobs, not the
/// daemon) or in xpud's own process (no per-call overhead).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    Process,
    InProcess,
}

/// The most worker processes one engine may have (`isolation.processes_per_engine`; the
/// default, one per job that may run at once, is capped here too).
pub const MAX_PROCESSES_PER_ENGINE: usize = 256;

/// The longest `isolation.spin_us`: 10 ms of a CPU spun per message at most.
pub const MAX_SPIN_US: u64 = 10_000;

/// How worker processes start and are kept (`[isolation]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IsolationSettings {
    /// The `xpu-worker` program; default: beside xpud, or `$XPU_WORKER_PROGRAM`.
    pub program: Option<PathBuf>,
    /// A worker whose resident memory passes this after a run is replaced (0: no limit).
    pub max_rss_mb: u64,
    /// Tests only: workers obey the fault markers (docs/daemon.md, "Isolation").
    pub inject_faults: bool,
    /// Worker processes per isolated engine at most; each serves one request at a time and
    /// starts when concurrent jobs first need it. 0: as many as `limits.workers` (every
    /// running job may have its own).
    pub processes_per_engine: usize,
    /// A worker other than an engine's first that has served nothing for this many seconds
    /// is closed (0: never); concurrent use starts it again.
    pub idle_exit_s: u64,
    /// Microseconds each side of a worker's socket watches it before blocking: xpud around
    /// a run's expected end, the worker after each reply (0: block at once).
    pub spin_us: u64,
}

impl Default for IsolationSettings {
    fn default() -> Self {
        IsolationSettings {
            program: None,
            max_rss_mb: 8192,
            inject_faults: false,
            processes_per_engine: 0,
            idle_exit_s: 300,
            spin_us: xpu_runtime::worker::DEFAULT_SPIN.as_micros() as u64,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CpuSettings {
    /// Default `in-process`: xpu's own kernels.
    pub isolation: Option<Isolation>,
    /// The OpenBLAS the `cpu.blas` kernel loads (`libscipy_openblas.so` or
    /// `libopenblas.so`). `XPU_BLAS_LIBRARY` overrides it; unset, numpy's OpenBLAS from
    /// `make setup` (`.deps/openblas/`) or `make install` (`lib/xpu/`), else the system's.
    pub blas_library: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CudaSettings {
    /// Default `process` (a sticky CUDA error is thrown away with its worker).
    pub isolation: Option<Isolation>,
    /// A directory with `libcuda.so.1`, NVRTC and `ptxas` (`XPU_CUDA_LIBRARY_DIR` is looked
    /// at next, then the CUDA wheels of `make setup`, then the system loader path).
    pub library_dir: Option<PathBuf>,
    /// Compiled kernels (cubin/PTX keyed by source, architecture and NVRTC version).
    /// Relative paths are under the data dir; unset: `<data dir>/cuda-cache`.
    pub cache_dir: Option<PathBuf>,
}

/// `[engines.ort]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrtSettings {
    /// Default `process`.
    pub isolation: Option<Isolation>,
    /// ONNX Runtime's shared library (`libonnxruntime.so`). `XPU_ORT_LIBRARY` overrides it;
    /// unset, the ort engine looks in `.deps/onnxruntime/` (`make setup`).
    pub library: Option<PathBuf>,
}

/// `[engines.openvino]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenVinoSettings {
    /// Default `process`.
    pub isolation: Option<Isolation>,
    /// The directory with OpenVINO's libraries (`libopenvino_c.so` and its plugins).
    /// `XPU_OPENVINO_DIR` overrides it; unset, the engine looks in `.deps/openvino/`.
    pub library_dir: Option<PathBuf>,
    /// OpenVINO's compiled-model cache (CACHE_DIR): a restarted daemon skips recompiling.
    /// Relative paths are under the data dir; unset: `<data dir>/openvino-cache`.
    pub cache_dir: Option<PathBuf>,
}

/// `[engines.llvm]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlvmSettings {
    /// Default `process` (generated code runs there).
    pub isolation: Option<Isolation>,
    /// Compiled kernels (shared objects keyed by code, target CPU and LLVM version), so a
    /// restarted daemon compiles nothing it compiled before. Relative paths are under the
    /// data dir; unset: `<data dir>/llvm-cache`.
    pub cache_dir: Option<PathBuf>,
    /// The command that runs riscv64 programs on the llvm engine's riscv64 device, the
    /// program and its arguments appended: `["qemu-riscv64"]` (the default, or
    /// `$XPU_RISCV_RUNNER`), or a command that runs it on a board.
    pub riscv_runner: Option<Vec<String>>,
    /// The instruction set of host kernels: `native` (every feature this machine has), or
    /// `x86-64-v2`, `x86-64-v3` or `x86-64-v4` (the same code on every machine of a fleet
    /// that has the level; a level this machine lacks makes the llvm engine unavailable).
    /// Unset: `$XPU_LLVM_HOST_CPU`, else `native`.
    pub host_cpu: Option<xpu_engine::HostCpu>,
    /// The ISA of the riscv64 device's programs: `rv64gc` (scalar) or `rv64gcv` (RVV 1.0
    /// vectors; the default runner then runs qemu with the vector extension, and a board
    /// without it refuses the program). Unset: `$XPU_RISCV_CPU`, else `rv64gc`.
    pub riscv_cpu: Option<xpu_engine::RiscvCpu>,
}

impl Engines {
    /// The engines that run in worker processes, and how those start; `jobs_at_once` is
    /// what `processes_per_engine = 0` stands for.
    pub fn workers(
        &self,
        settings: &IsolationSettings,
        jobs_at_once: usize,
    ) -> xpu_runtime::worker::Workers {
        let chosen = [
            ("cpu", self.cpu.isolation, Isolation::InProcess),
            ("ort", self.ort.isolation, Isolation::Process),
            ("openvino", self.openvino.isolation, Isolation::Process),
            ("llvm", self.llvm.isolation, Isolation::Process),
            ("cuda", self.cuda.isolation, Isolation::Process),
        ];
        xpu_runtime::worker::Workers {
            engines: chosen
                .iter()
                .filter(|(_, set, default)| set.unwrap_or(*default) == Isolation::Process)
                .map(|(name, _, _)| name.to_string())
                .collect(),
            program: settings.program.clone(),
            max_rss_bytes: settings.max_rss_mb << 20,
            inject_faults: settings.inject_faults,
            processes_per_engine: match settings.processes_per_engine {
                0 => jobs_at_once.min(MAX_PROCESSES_PER_ENGINE),
                n => n,
            },
            idle_exit: std::time::Duration::from_secs(settings.idle_exit_s),
            spin: std::time::Duration::from_micros(settings.spin_us),
        }
    }

    pub fn libraries(&self, data_dir: &std::path::Path) -> xpu_runtime::EngineLibraries {
        let cache = self.openvino.cache_dir.clone().unwrap_or_else(|| "openvino-cache".into());
        xpu_runtime::EngineLibraries {
            blas: self.cpu.blas_library.clone(),
            ort: self.ort.library.clone(),
            openvino_dir: self.openvino.library_dir.clone(),
            openvino_cache_dir: Some(data_dir.join(cache)),
            llvm_cache_dir: Some(
                data_dir.join(self.llvm.cache_dir.clone().unwrap_or_else(|| "llvm-cache".into())),
            ),
            llvm_riscv_runner: self.llvm.riscv_runner.clone(),
            llvm_host_cpu: self.llvm.host_cpu,
            llvm_riscv_cpu: self.llvm.riscv_cpu,
            cuda_library_dir: self.cuda.library_dir.clone(),
            cuda_cache_dir: Some(
                data_dir.join(self.cuda.cache_dir.clone().unwrap_or_else(|| "cuda-cache".into())),
            ),
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
            isolation: IsolationSettings::default(),
            tuning: TuningSettings::default(),
            assistant: xpu_assistant::AssistantConfig::default(),
            settled: Vec::new(),
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
            prepared_plans: xpu_plan::prepared::DEFAULT_MAX_PLANS,
            prepared_bytes: xpu_plan::prepared::DEFAULT_MAX_BYTES,
            asks_at_once: 2,
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
    "isolation",
    "assistant",
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
    #[error(
        "isolation.processes_per_engine = {0}: at most {MAX_PROCESSES_PER_ENGINE} worker processes per engine"
    )]
    TooManyProcesses(usize),
    #[error("isolation.spin_us = {0}: at most {MAX_SPIN_US} (a spin is a CPU kept busy)")]
    SpinTooLong(u64),
    #[error("cannot prepare {0}")]
    Prepare(String),
    #[error("tuning.{key}: {message}")]
    Tuning { key: &'static str, message: String },
    #[error("{0}")]
    Assistant(String),
    #[error("limits.asks_at_once = {0}: must be 1 to 64")]
    AsksAtOnce(usize),
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
        let mut config: Config = fig.extract().map_err(|e| ConfigError::Figment(Box::new(e)))?;
        config.check()?;
        config.settle_defaults()?;
        Ok(config)
    }

    /// The built-in defaults name a source checkout's directories (`policies/examples`,
    /// `examples`); started anywhere else, a daemon uses its data dir instead: the example
    /// policies built into the binary in `<data dir>/policies`, and `<data dir>/data` and
    /// `<data dir>/models` as roots (made by [`Config::prepare_dirs`]). Paths an operator
    /// configured are never replaced (a missing one is an error at start, as before).
    fn settle_defaults(&mut self) -> Result<(), ConfigError> {
        let defaults = Config::default();
        let missing = |dirs: &[PathBuf]| !dirs.iter().all(|d| d.exists());
        if self.policy_dirs == defaults.policy_dirs && missing(&self.policy_dirs) {
            self.policy_dirs = vec![self.data_dir.join("policies")];
            self.settled.push("policy_dirs");
        }
        if self.data_roots == defaults.data_roots && missing(&self.data_roots) {
            self.data_roots = vec![self.data_dir.join("data")];
            self.settled.push("data_roots");
        }
        if self.model_roots == defaults.model_roots && missing(&self.model_roots) {
            self.model_roots = vec![self.data_dir.join("models")];
            self.settled.push("model_roots");
        }
        Ok(())
    }

    /// Makes what [`Config::load`] chose in the data dir exist: the built-in example
    /// policies written to `<data dir>/policies` (files already there are kept), the data
    /// and model roots created. Called when the daemon starts, not at load, so checking a
    /// configuration writes nothing.
    pub fn prepare_dirs(&self) -> Result<(), ConfigError> {
        let io = |what: &str, p: &Path, e: std::io::Error| {
            ConfigError::Prepare(format!("{what} {}: {e}", p.display()))
        };
        if self.settled.contains(&"policy_dirs") {
            for dir in &self.policy_dirs {
                crate::policies::write_builtin_examples(dir)
                    .map_err(|e| io("policy directory", dir, e))?;
            }
        }
        for (key, dirs) in [("data_roots", &self.data_roots), ("model_roots", &self.model_roots)] {
            if self.settled.contains(&key) {
                for dir in dirs {
                    std::fs::create_dir_all(dir).map_err(|e| io(key, dir, e))?;
                }
            }
        }
        Ok(())
    }

    /// What the daemon uses, for its start-up lines: policies, roots, engine libraries.
    pub fn describe(&self) -> Vec<String> {
        let list = |v: &[PathBuf]| {
            v.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        };
        let why = |key: &str| {
            if self.settled.contains(&key) { " (built-in default: no checkout here)" } else { "" }
        };
        let libs = self.engines.libraries(&self.data_dir);
        let lib = |configured: &Option<PathBuf>, env: &str, rel: &str| match std::env::var_os(env)
            .map(PathBuf::from)
            .or_else(|| configured.clone())
        {
            Some(p) => format!("{} (configured)", p.display()),
            None => match xpu_engine::find_upwards(Path::new(rel)) {
                Some(p) => format!("{} (found)", p.display()),
                None => {
                    format!("not found ({rel} from `make setup`, or configure it): unavailable")
                }
            },
        };
        vec![
            format!("data dir: {}", self.data_dir.display()),
            format!("policies: {}{}", list(&self.policy_dirs), why("policy_dirs")),
            format!("data roots: {}{}", list(&self.data_roots), why("data_roots")),
            format!("model roots: {}{}", list(&self.model_roots), why("model_roots")),
            // After the engines are loaded, so the configured library is the one described.
            format!("blas: {}", xpu_engine_cpu::blas_summary()),
            format!(
                "onnx runtime: {}",
                lib(&libs.ort, "XPU_ORT_LIBRARY", ".deps/onnxruntime/libonnxruntime.so")
            ),
            format!("openvino: {}", lib(&libs.openvino_dir, "XPU_OPENVINO_DIR", ".deps/openvino")),
            match self.assistant.target() {
                Ok((endpoint, model)) => {
                    format!("assistant: {model} at {}", xpu_assistant::client::redact(endpoint))
                }
                Err(_) => "assistant: not configured (POST /v1/asks answers 503)".into(),
            },
        ]
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen.parse().map_err(|_| ConfigError::Listen(self.listen.clone()))
    }

    fn check(&self) -> Result<(), ConfigError> {
        let addr = self.listen_addr()?;
        if self.dev && !addr.ip().is_loopback() {
            return Err(ConfigError::DevNotLoopback(addr));
        }
        if self.isolation.processes_per_engine > MAX_PROCESSES_PER_ENGINE {
            return Err(ConfigError::TooManyProcesses(self.isolation.processes_per_engine));
        }
        if self.isolation.spin_us > MAX_SPIN_US {
            return Err(ConfigError::SpinTooLong(self.isolation.spin_us));
        }
        let share = self.tuning.explore_share;
        if !(0.0..=1.0).contains(&share) {
            let message =
                format!("{share} is not a share of runs between 0 and 1 (0.05: one in 20)");
            return Err(ConfigError::Tuning { key: "explore_share", message });
        }
        if self.tuning.refresh_s == 0 || self.tuning.refresh_s > 86_400 {
            let message = format!("{} must be 1 to 86400 seconds", self.tuning.refresh_s);
            return Err(ConfigError::Tuning { key: "refresh_s", message });
        }
        self.assistant.validate().map_err(ConfigError::Assistant)?;
        if !(1..=64).contains(&self.limits.asks_at_once) {
            return Err(ConfigError::AsksAtOnce(self.limits.asks_at_once));
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
