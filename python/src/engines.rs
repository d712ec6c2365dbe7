//! The engines of the Python process: loaded once, when the first session or program asks,
//! from the libraries the package found (`xpu._engines`: the `onnxruntime` and `openvino`
//! wheels when installed, numpy's OpenBLAS from `scipy-openblas32`); each engine whose
//! library is missing stays in the inventory as unavailable, with its reason. The llvm
//! engine runs in the worker program the package carries (`xpu/xpu-worker`, which links
//! LLVM 19; the module does not), as xpud runs it: without the system's LLVM its worker
//! cannot start, and the engine is unavailable with the loader's words.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use pyo3::prelude::*;
use xpu_engine::Registry;
use xpu_runtime::{EngineLibraries, SharedEngines};

/// What `configure` was told: the engines' libraries and the worker program.
static LIBRARIES: Mutex<Option<(EngineLibraries, Option<PathBuf>)>> = Mutex::new(None);
static SHARED: OnceLock<SharedEngines> = OnceLock::new();

/// Where the engines' runtime libraries are (`None`: the engine's own default search, its
/// environment variable first). Takes effect if called before the first session; returns
/// whether it did (the engines of a running process are never swapped).
/// `worker` is the `xpu-worker` program the llvm engine runs in (`None`:
/// `$XPU_WORKER_PROGRAM`, else none, and the engine is unavailable saying so).
#[pyfunction]
#[pyo3(signature = (*, blas=None, ort=None, openvino_dir=None, cuda_library_dir=None, cache_dir=None, worker=None))]
pub fn configure(
    blas: Option<PathBuf>,
    ort: Option<PathBuf>,
    openvino_dir: Option<PathBuf>,
    cuda_library_dir: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    worker: Option<PathBuf>,
) -> bool {
    if SHARED.get().is_some() {
        return false;
    }
    let libraries = EngineLibraries {
        blas,
        ort,
        openvino_dir,
        cuda_library_dir,
        llvm_cache_dir: cache_dir.as_ref().map(|d| d.join("llvm")),
        cuda_cache_dir: cache_dir.as_ref().map(|d| d.join("cuda")),
        openvino_cache_dir: cache_dir.map(|d| d.join("openvino")),
        ..EngineLibraries::default()
    };
    *LIBRARIES.lock().unwrap_or_else(|p| p.into_inner()) = Some((libraries, worker));
    true
}

fn shared() -> &'static SharedEngines {
    SHARED.get_or_init(|| {
        let (libraries, worker) =
            LIBRARIES.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default();
        let program = worker
            .or_else(|| std::env::var_os("XPU_WORKER_PROGRAM").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("xpu-worker (not found beside the package)"));
        let workers = xpu_runtime::worker::Workers {
            engines: vec!["llvm".into()],
            program: Some(program),
            ..xpu_runtime::worker::Workers::native()
        };
        SharedEngines::load_isolated(&libraries, &workers)
    })
}

/// The engines with a table engine confined to `roots` (the data a program may read).
pub fn registry(roots: &[PathBuf]) -> Registry {
    shared().registry(xpu_engine_table::TableEngine::new(roots.to_vec()))
}

/// This process's inventory as JSON: every engine, whether it is available (and why not),
/// its kernels and devices, and the facts it reports (the BLAS core, ORT's providers).
#[pyfunction]
pub fn inventory(py: Python<'_>) -> String {
    py.detach(|| {
        let inventory = registry(&[]).inventory();
        serde_json::to_string(&inventory).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    })
}

/// Every kernel xpu knows of (`cuda.cublaslt`, `ort.tensorrt` …), whether or not this
/// machine has it: what keyword arguments such as `matmul="cublasLt"` resolve against.
#[pyfunction]
pub fn kernels() -> Vec<&'static str> {
    xpu_engine::catalog::kernels().collect()
}
