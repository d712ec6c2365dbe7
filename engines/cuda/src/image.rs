//! Loadable kernel images: a cubin for the device's exact architecture, compiled by NVRTC,
//! or — when NVRTC does not know that architecture — PTX for the newest one it knows, which
//! the driver compiles at load. Images are cached in memory and on disk, keyed by the
//! source's SHA-256, the architecture, the math mode and NVRTC's version, so a second process loads them
//! without compiling; files are written under temporary names and renamed into place.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

use crate::toolkit::{self, Math};

/// A compiled image and what it is (`cubin sm_90`, or `PTX compute_90 (…)`).
#[derive(Clone, Debug)]
pub struct Built {
    pub what: String,
    pub bytes: Arc<Vec<u8>>,
    pub cubin: bool,
}

impl Built {
    /// The image as cudarc loads it.
    pub fn module(&self) -> cudarc::nvrtc::Ptx {
        if self.cubin {
            cudarc::nvrtc::Ptx::from_binary(self.bytes.as_ref().clone())
        } else {
            cudarc::nvrtc::Ptx::from_src(String::from_utf8_lossy(&self.bytes).into_owned())
        }
    }
}

/// The cache key of `source` for `arch` and `math` under the loaded NVRTC.
pub fn key(source: &str, arch: &str, math: Math) -> Result<String, String> {
    let nvrtc = toolkit::nvrtc(None)?;
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update([0]);
    h.update(arch.as_bytes());
    if math != Math::Strict {
        // Strict keys stay as they were, so existing disk caches keep their entries.
        h.update(format!("{math:?}").as_bytes());
    }
    h.update(format!("nvrtc {}.{}", nvrtc.version.0, nvrtc.version.1).as_bytes());
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn memory() -> &'static Mutex<HashMap<String, Built>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Built>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The image of `source` for the real architecture `arch` (`sm_90`), from the memory cache,
/// the disk cache under `dir`, or NVRTC.
pub fn build(source: &str, arch: &str, math: Math, dir: Option<&Path>) -> Result<Built, String> {
    let key = key(source, arch, math)?;
    if let Some(b) = memory().lock().map_err(|_| "image cache lock poisoned")?.get(&key) {
        return Ok(b.clone());
    }
    let built = match dir.and_then(|d| read_cached(d, &key)) {
        Some(b) => b,
        None => {
            let b = compile(source, arch, math)?;
            if let Some(d) = dir {
                // A cache that cannot be written costs the next process a compile, no more.
                let _ = write_cached(d, &key, &b);
            }
            b
        }
    };
    memory().lock().map_err(|_| "image cache lock poisoned")?.insert(key, built.clone());
    Ok(built)
}

fn compile(source: &str, arch: &str, math: Math) -> Result<Built, String> {
    match toolkit::compile_cubin_with(source, "xpu_partition", arch, math) {
        Ok(bytes) => {
            Ok(Built { what: format!("cubin {arch}"), bytes: Arc::new(bytes), cubin: true })
        }
        Err(toolkit::ToolkitError::Io(why)) => {
            // An architecture NVRTC does not know: PTX for the newest it does, JIT-compiled
            // by the driver at load (forward compatible).
            let fallback = "compute_90";
            let ptx = toolkit::compile_ptx_with(source, "xpu_partition", fallback, math)
                .map_err(|e| e.to_string())?;
            Ok(Built {
                what: format!("PTX {fallback} (no cubin for {arch}: {why})"),
                bytes: Arc::new(ptx.into_bytes()),
                cubin: false,
            })
        }
        Err(e) => Err(e.to_string()),
    }
}

fn paths(dir: &Path, key: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{key}.cubin")), dir.join(format!("{key}.ptx")))
}

fn read_cached(dir: &Path, key: &str) -> Option<Built> {
    let (cubin, ptx) = paths(dir, key);
    if let Ok(bytes) = std::fs::read(&cubin) {
        return Some(Built {
            what: "cubin (disk cache)".into(),
            bytes: Arc::new(bytes),
            cubin: true,
        });
    }
    let bytes = std::fs::read(&ptx).ok()?;
    Some(Built { what: "PTX (disk cache)".into(), bytes: Arc::new(bytes), cubin: false })
}

fn write_cached(dir: &Path, key: &str, b: &Built) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (cubin, ptx) = paths(dir, key);
    let target = if b.cubin { cubin } else { ptx };
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::fs::write(tmp.path(), b.bytes.as_ref())?;
    tmp.persist(&target).map_err(|e| e.error)?;
    Ok(())
}
