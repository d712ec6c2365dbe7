//! The engines of the Python process: loaded once, when the first session or program asks,
//! from the libraries the package found (`xpu._engines`: the `onnxruntime` and `openvino`
//! wheels when installed, numpy's OpenBLAS from `scipy-openblas32`); each engine whose
//! library is missing stays in the inventory as unavailable, with its reason.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use pyo3::prelude::*;
use xpu_engine::Registry;
use xpu_runtime::{EngineLibraries, SharedEngines};

static LIBRARIES: Mutex<Option<EngineLibraries>> = Mutex::new(None);
static SHARED: OnceLock<SharedEngines> = OnceLock::new();

/// Where the engines' runtime libraries are (`None`: the engine's own default search, its
/// environment variable first). Takes effect if called before the first session; returns
/// whether it did (the engines of a running process are never swapped).
#[pyfunction]
#[pyo3(signature = (*, blas=None, ort=None, openvino_dir=None, cuda_library_dir=None, cache_dir=None))]
pub fn configure(
    blas: Option<PathBuf>,
    ort: Option<PathBuf>,
    openvino_dir: Option<PathBuf>,
    cuda_library_dir: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
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
    *LIBRARIES.lock().unwrap_or_else(|p| p.into_inner()) = Some(libraries);
    true
}

fn shared() -> &'static SharedEngines {
    SHARED.get_or_init(|| {
        let libraries = LIBRARIES.lock().unwrap_or_else(|p| p.into_inner()).clone();
        SharedEngines::load(&libraries.unwrap_or_default())
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
