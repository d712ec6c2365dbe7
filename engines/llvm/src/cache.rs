//! Compiled code, cached in memory and on disk. A module's key hashes its IR (a pure
//! function of the LIR and this code generator's version), the target triple, CPU name and
//! feature string, and the LLVM version; the disk cache holds one shared object per key,
//! linked from LLVM's object file by the system C compiler driver (`cc -shared`), and a
//! second process loads it with `dlopen` without compiling anything. Writes go through a
//! temporary file renamed into place, so concurrent processes never see half a file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::compile::{self, CompileError, Emit, Target};

/// Bumped whenever generated code changes meaning, so old cache entries are not reused.
pub const CODEGEN_VERSION: u32 = 3;

/// Loaded code: the library stays open while any executable holds this.
pub struct Loaded {
    lib: libloading::Library,
    pub key: String,
}

/// An entry point of generated code: `(buffers, symbols, lo, hi)`.
pub type StageFn = unsafe extern "C" fn(*const *mut u8, *const i64, i64, i64);

impl Loaded {
    /// The stage function `symbol`.
    pub fn stage(&self, symbol: &str) -> Result<StageFn, CacheError> {
        // SAFETY: every exported function of a module this engine generated has the
        // `StageFn` signature (codegen emits exactly that for each stage). The pointer
        // outlives the `Symbol` borrow; it stays valid while this `Loaded` (and so the
        // library) lives, which callers ensure by holding the `Arc<Loaded>` next to it
        // (`exec::Compiled::_code`).
        let f = unsafe { self.lib.get::<StageFn>(symbol.as_bytes()) };
        f.map(|s| *s).map_err(|e| CacheError::Load(format!("symbol {symbol}: {e}")))
    }
}

/// Where a module came from on this call.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Already loaded by this process.
    Memory,
    /// Loaded from the disk cache: nothing compiled.
    Disk,
    /// Compiled now.
    Compiled,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Memory => "memory cache",
            Source::Disk => "disk cache",
            Source::Compiled => "compiled",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("linking the compiled code failed: {0}")]
    Link(String),
    #[error("loading the compiled code failed: {0}")]
    Load(String),
    #[error("the code cache at {dir}: {message}")]
    Dir { dir: String, message: String },
}

/// The code cache of one engine.
pub struct CodeCache {
    pub target: Target,
    dir: Option<PathBuf>,
    /// Where shared objects are linked when there is no disk cache: made at the first
    /// compile, kept as long as the cache (the loaded objects live there).
    scratch: std::sync::OnceLock<tempfile::TempDir>,
    linker: PathBuf,
    memory: Mutex<HashMap<String, Arc<Loaded>>>,
}

impl CodeCache {
    /// A cache for `target`, on disk under `dir` when given.
    pub fn new(
        target: Target,
        dir: Option<PathBuf>,
        linker: PathBuf,
    ) -> Result<CodeCache, CacheError> {
        let scratch = std::sync::OnceLock::new();
        Ok(CodeCache { target, dir, scratch, linker, memory: Mutex::new(HashMap::new()) })
    }

    /// The directory shared objects go to: the disk cache, else a scratch directory.
    fn out_dir(&self) -> Result<PathBuf, CacheError> {
        if let Some(dir) = &self.dir {
            std::fs::create_dir_all(dir).map_err(|e| dir_err(dir, e))?;
            return Ok(dir.clone());
        }
        if self.scratch.get().is_none() {
            let temp = tempfile::Builder::new().prefix("xpu-llvm-").tempdir().map_err(|e| {
                CacheError::Dir { dir: "a temporary directory".into(), message: e.to_string() }
            })?;
            let _ = self.scratch.set(temp);
        }
        Ok(self.scratch.get().map(|t| t.path().to_path_buf()).unwrap_or_default())
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The key of `ir` for this cache's target.
    pub fn key(&self, ir: &str) -> String {
        let mut h = Sha256::new();
        h.update(CODEGEN_VERSION.to_le_bytes());
        for part in [
            ir,
            &self.target.triple,
            &self.target.cpu,
            &self.target.features,
            self.target.abi.as_deref().unwrap_or(""),
            &compile::llvm_version(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// The loaded code of `ir`: from memory, else from disk, else compiled (and stored).
    /// Returns where it came from and the milliseconds it took.
    pub fn get(&self, ir: &str) -> Result<(Arc<Loaded>, Source, f64), CacheError> {
        let start = Instant::now();
        let key = self.key(ir);
        if let Some(l) = self.memory.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok((l.clone(), Source::Memory, ms(start)));
        }
        let dir = self.out_dir()?;
        let path = dir.join(format!("{key}.so"));
        // Only a disk cache holds objects from earlier processes.
        let mut source = if self.dir.is_some() && path.is_file() {
            Source::Disk
        } else {
            self.build(ir, &dir, &path)?;
            Source::Compiled
        };
        // SAFETY: the library is code this engine generated from verified LIR; it has no
        // initialisers beyond what the C runtime adds to a shared object.
        let lib = match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => lib,
            // A cached file that does not load (truncated by a full disk, say) is replaced.
            Err(_) if source == Source::Disk => {
                let _ = std::fs::remove_file(&path);
                self.build(ir, &dir, &path)?;
                source = Source::Compiled;
                // SAFETY: as above, for the object just built.
                unsafe { libloading::Library::new(&path) }
                    .map_err(|e| CacheError::Load(format!("{}: {e}", path.display())))?
            }
            Err(e) => return Err(CacheError::Load(format!("{}: {e}", path.display()))),
        };
        let loaded = Arc::new(Loaded { lib, key: key.clone() });
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).insert(key, loaded.clone());
        Ok((loaded, source, ms(start)))
    }

    /// Compiles `ir` to an object and links it into the shared object `out`.
    fn build(&self, ir: &str, dir: &Path, out: &Path) -> Result<(), CacheError> {
        let object = compile::compile(ir, &self.target, Emit::Object)?;
        let obj =
            tempfile::Builder::new().suffix(".o").tempfile_in(dir).map_err(|e| dir_err(dir, e))?;
        std::fs::write(obj.path(), &object).map_err(|e| dir_err(dir, e))?;
        let so =
            tempfile::Builder::new().suffix(".so").tempfile_in(dir).map_err(|e| dir_err(dir, e))?;
        let result = Command::new(&self.linker)
            .arg("-shared")
            .arg("-o")
            .arg(so.path())
            .arg(obj.path())
            .arg("-lm")
            .output()
            .map_err(|e| CacheError::Link(format!("{}: {e}", self.linker.display())))?;
        if !result.status.success() {
            return Err(CacheError::Link(format!(
                "{} exited with {}: {}",
                self.linker.display(),
                result.status,
                String::from_utf8_lossy(&result.stderr).trim()
            )));
        }
        so.persist(out).map_err(|e| dir_err(dir, e.error))?;
        Ok(())
    }
}

fn dir_err(dir: &Path, e: std::io::Error) -> CacheError {
    CacheError::Dir { dir: dir.display().to_string(), message: e.to_string() }
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// The C compiler driver that links shared objects: `$XPU_LLVM_LINKER`, else `cc` or
/// `gcc` on `PATH`.
pub fn find_linker() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("XPU_LLVM_LINKER") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["cc", "gcc"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err("no C compiler driver (cc or gcc) on PATH to link generated code; set XPU_LLVM_LINKER"
        .into())
}
