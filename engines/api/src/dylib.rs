//! Engines whose runtime is a shared library loaded at run time (ONNX Runtime, OpenVINO):
//! where to find it and how it is loaded once per process.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use xpu_ir::OpClass;

use crate::{Availability, EngineError};

/// `rel` under the nearest directory that has it, looking up from the working directory,
/// the binary's directory and the source checkout: where `make setup` put an engine's
/// runtime library (`.deps/…` in the repository) when nothing configured a path.
pub fn find_upwards(rel: &Path) -> Option<PathBuf> {
    // The working directory, then where the binary is (an installed layout), then the
    // checkout it was built from (where `make setup` puts libraries), so a binary run from
    // any directory finds them.
    let starts = [
        std::env::current_dir().ok(),
        std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf)),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
    ];
    starts
        .into_iter()
        .flatten()
        .find_map(|start| start.ancestors().map(|d| d.join(rel)).find(|p| p.exists()))
}

/// A runtime loaded at most once per process (its bindings keep one global API table). A
/// failed load is not kept, so a later call may name a good file; a call naming another
/// file once one is loaded is refused with the reason. A panic inside the loader (bindings
/// that call a function the file lacks) is a failed load, not a crash.
pub struct LoadedOnce<T> {
    slot: Mutex<Option<(PathBuf, Arc<T>)>>,
}

impl<T> Default for LoadedOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> LoadedOnce<T> {
    pub const fn new() -> LoadedOnce<T> {
        LoadedOnce { slot: Mutex::new(None) }
    }

    /// The runtime loaded from `path` (by `load`, the first time); `what` names it in errors.
    pub fn get_or_load(
        &self,
        what: &str,
        path: &Path,
        load: impl FnOnce(&Path) -> Result<T, String>,
    ) -> Result<Arc<T>, String> {
        let mut slot =
            self.slot.lock().map_err(|_| format!("the {what} loader lock is poisoned"))?;
        if let Some((loaded, rt)) = &*slot {
            let same = loaded == path
                || std::fs::canonicalize(loaded).ok() == std::fs::canonicalize(path).ok();
            return if same {
                Ok(rt.clone())
            } else {
                Err(format!(
                    "{what} is already loaded from {} in this process; {} is not loaded",
                    loaded.display(),
                    path.display()
                ))
            };
        }
        if !path.exists() {
            return Err(format!("{}: no such file", path.display()));
        }
        let rt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load(path)))
            .unwrap_or_else(|p| {
                let why = crate::panic_message(&*p);
                Err(format!("{} is not a usable {what} library: {why}", path.display()))
            })?;
        let rt = Arc::new(rt);
        *slot = Some((path.to_path_buf(), rt.clone()));
        Ok(rt)
    }
}

/// A runtime as its engine holds it: loaded, or why not (a missing or unusable library).
pub type Loaded<T> = Result<Arc<T>, String>;

/// The engine's availability for its runtime's load outcome.
pub fn availability<T>(loaded: &Loaded<T>) -> Availability {
    match loaded {
        Ok(_) => Availability::Available,
        Err(reason) => Availability::Unavailable { reason: reason.clone() },
    }
}

/// The loaded runtime, or `Unavailable` naming `engine` and the reason.
pub fn require<'a, T>(engine: &str, loaded: &'a Loaded<T>) -> Result<&'a Arc<T>, EngineError> {
    loaded.as_ref().map_err(|reason| EngineError::Unavailable {
        engine: engine.into(),
        reason: reason.clone(),
    })
}

/// The op classes an ONNX runtime runs: every SGR-ML op but the table ops exports to ONNX.
pub fn onnx_classes() -> Vec<OpClass> {
    OpClass::ALL.iter().copied().filter(|c| *c != OpClass::Table).collect()
}
