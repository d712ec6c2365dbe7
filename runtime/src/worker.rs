//! Engines in worker processes, from this crate's side: which engines run isolated and how
//! their workers start ([`Workers`]), and the worker program's own entry point
//! ([`worker_main`], the `xpu-worker` binary): it builds one engine as [`SharedEngines`]
//! would and serves it to its parent.

use std::path::PathBuf;

use crate::{EngineLibraries, SharedEngines};

pub use xpu_worker::{
    DEFAULT_SPIN, EngineWorkerStats, QUARANTINE_AFTER, WorkerEngine, stats_snapshot,
};

/// Which engines run in worker processes, and how those start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workers {
    /// Engine names (cpu, ort, openvino, llvm, cuda; never table, whose DuckDB connection
    /// is the job's own).
    pub engines: Vec<String>,
    /// The `xpu-worker` program; `None`: [`default_program`].
    pub program: Option<PathBuf>,
    /// A worker past this resident memory after a run is replaced (0: no limit).
    pub max_rss_bytes: u64,
    /// Tests only: workers obey `xpu_worker::FAULT_MARKERS`.
    pub inject_faults: bool,
    /// Worker processes per engine at most (0 counts as 1): concurrent jobs on one engine
    /// run side by side up to this.
    pub processes_per_engine: usize,
    /// A worker other than an engine's first, idle this long, is closed (zero: never).
    pub idle_exit: std::time::Duration,
    /// How long each side watches its socket before blocking (zero: block at once;
    /// `xpu_worker::DEFAULT_SPIN` in xpud and xpuctl).
    pub spin: std::time::Duration,
}

impl Workers {
    /// The engines that load native code (ort, openvino, llvm, cuda) in workers, as xpud
    /// runs them by default; the worker program found by [`default_program`].
    pub fn native() -> Workers {
        Workers {
            engines: ["ort", "openvino", "llvm", "cuda"].map(String::from).to_vec(),
            spin: xpu_worker::DEFAULT_SPIN,
            ..Workers::default()
        }
    }

    /// The worker engine for `name`, configured with `libraries`.
    pub fn engine(&self, name: &str, libraries: &EngineLibraries) -> xpu_worker::WorkerEngine {
        let libraries = serde_json::to_string(libraries).unwrap_or_else(|_| "{}".into());
        xpu_worker::WorkerEngine::new(
            name,
            xpu_worker::WorkerSetup {
                program: self.program.clone().unwrap_or_else(default_program),
                args: vec!["--libraries".into(), libraries],
                inject_faults: self.inject_faults,
                max_rss_bytes: self.max_rss_bytes,
                processes: self.processes_per_engine,
                idle_exit: self.idle_exit,
                spin: self.spin,
            },
        )
    }
}

/// `$XPU_WORKER_PROGRAM`, else `xpu-worker` beside this executable (or one directory up:
/// cargo's test binaries live in `deps/` below the binaries).
pub fn default_program() -> PathBuf {
    if let Some(p) = std::env::var_os("XPU_WORKER_PROGRAM") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let beside = dir.join("xpu-worker");
    if beside.is_file() {
        return beside;
    }
    dir.parent().map_or(beside.clone(), |up| up.join("xpu-worker"))
}

/// The worker program: `xpu-worker --engine NAME [--libraries JSON] [--inject-faults]
/// [--spin-us N]`, started by its parent with the shared memory and the socket on
/// descriptors 3 and 4. Returns the process's exit status.
pub fn worker_main(args: &[String]) -> i32 {
    let mut engine = None;
    let mut libraries = EngineLibraries::default();
    let mut inject_faults = false;
    let mut spin = std::time::Duration::ZERO;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--engine" => engine = it.next().cloned(),
            "--libraries" => match it.next().map(|j| serde_json::from_str(j)) {
                Some(Ok(l)) => libraries = l,
                _ => return usage("--libraries takes the engine libraries as JSON"),
            },
            "--inject-faults" => inject_faults = true,
            "--spin-us" => match it.next().map(|n| n.parse::<u64>()) {
                Some(Ok(us)) => spin = std::time::Duration::from_micros(us),
                _ => return usage("--spin-us takes a count of microseconds"),
            },
            other => return usage(&format!("unknown argument `{other}`")),
        }
    }
    let Some(name) = engine else { return usage("--engine NAME is required") };
    let shared = SharedEngines::load(&libraries);
    let Some(engine) = shared.get(&name).cloned() else {
        return usage(&format!("no engine `{name}` in this build"));
    };
    xpu_worker::serve_inherited(engine, inject_faults, spin)
}

fn usage(problem: &str) -> i32 {
    eprintln!(
        "xpu-worker: {problem}\nusage: xpu-worker --engine NAME [--libraries JSON] [--inject-faults] [--spin-us N]\n\
         (started by xpud and xpuctl, with its shared memory and socket on descriptors 3 and 4)"
    );
    2
}
