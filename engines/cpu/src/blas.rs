//! The `cpu.blas` kernel's large products: row-major SGEMM/DGEMM through OpenBLAS (CBLAS),
//! loaded with `dlopen` at first use, and what the loaded library says of itself (release,
//! the core it detected, whether that core fits this CPU).
//!
//! Which library: `$XPU_BLAS_LIBRARY`, else the path configured for the engine
//! ([`configure`]; `[engines.cpu] blas_library` in xpud), else the OpenBLAS numpy ships
//! (the `scipy-openblas32` wheel, which `make setup` unpacks to
//! `.deps/openblas/libscipy_openblas.so` and `make install` copies to `lib/xpu/`), else the
//! system's `libopenblas.so.0`. A distribution's OpenBLAS can be older than the CPU
//! (Debian 12's 0.3.21 runs its SSE3 `Prescott` kernel on Sapphire Rapids, 3× slower than
//! the AVX-512 one): such a library is loaded but reported *degraded*, and the engine then
//! prefers `cpu.gemm` (see [`BlasInfo::degraded`]).

use std::any::TypeId;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::linalg::Mat;

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

/// The environment variable that overrides every configured library path.
pub const LIBRARY_ENV: &str = "XPU_BLAS_LIBRARY";
/// Where `make setup` puts numpy's OpenBLAS, relative to the repository (searched upwards
/// from the working directory, the binary and the checkout it was built from).
pub const DEPS_PATH: &str = ".deps/openblas/libscipy_openblas.so";
/// Where `make install` puts it, relative to the directory of the installed binary.
const INSTALLED_PATH: &str = "../lib/xpu/libscipy_openblas.so";
/// The system library, by the name a linker's `-lopenblas` would find at run time.
const SYSTEM_NAME: &str = "libopenblas.so.0";

/// `cblas_?gemm(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`.
type Gemm<T> = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    T,
    *const T,
    c_int,
    *const T,
    c_int,
    T,
    *mut T,
    c_int,
);

/// `openblas_set_num_threads(n)`.
type SetThreads = unsafe extern "C" fn(c_int);
/// `openblas_get_config()` / `openblas_get_corename()`: static NUL-terminated strings.
type GetString = unsafe extern "C" fn() -> *const c_char;

/// What the loaded BLAS says of itself: an engine fact of every run that uses it, and in
/// `xpuctl engines`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlasInfo {
    /// The file it was loaded from.
    pub library: PathBuf,
    /// `OpenBLAS 0.3.34.481.3` (the first two words of `openblas_get_config`).
    pub release: String,
    /// The kernel family OpenBLAS detected for this CPU (`SkylakeX`, `Haswell`, `Zen`,
    /// `Prescott` …).
    pub core: String,
    /// Why this BLAS runs below what this CPU can do (a core without AVX2 on a CPU with
    /// AVX2 or AVX-512), or `None`.
    pub degraded: Option<String>,
}

impl std::fmt::Display for BlasInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, core {}, 1 thread a call (products split over the engine's team) from {}",
            self.release,
            self.core,
            self.library.display()
        )
    }
}

/// The loaded library's entry points.
struct Cblas {
    sgemm: Gemm<f32>,
    dgemm: Gemm<f64>,
    info: BlasInfo,
    /// Kept loaded for the process's life.
    _library: libloading::Library,
}

/// The path the engine was configured with (set once, before the first product).
static CONFIGURED: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Sets the library the engine loads when `$XPU_BLAS_LIBRARY` is unset. Only the first
/// call counts (one BLAS per process): returns false when another path was set before.
pub fn configure(path: Option<PathBuf>) -> bool {
    let wanted = path.clone();
    CONFIGURED.get_or_init(|| path).as_ref() == wanted.as_ref()
}

/// The places to try, in order, each with where it came from.
fn candidates() -> Vec<(PathBuf, &'static str)> {
    if let Some(p) = std::env::var_os(LIBRARY_ENV).filter(|p| !p.is_empty()) {
        return vec![(PathBuf::from(p), LIBRARY_ENV)];
    }
    if let Some(Some(p)) = CONFIGURED.get() {
        return vec![(p.clone(), "[engines.cpu] blas_library")];
    }
    let mut out = Vec::new();
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let installed = dir.join(INSTALLED_PATH);
        if installed.exists() {
            out.push((installed, "installed"));
        }
    }
    if let Some(p) = xpu_engine::find_upwards(Path::new(DEPS_PATH)) {
        out.push((p, "make setup"));
    }
    out.push((PathBuf::from(SYSTEM_NAME), "system"));
    out
}

/// OpenBLAS, loaded at the first product that uses it (or the first capability report)
/// rather than linked: a linked OpenBLAS starts its thread pool when the process starts,
/// and those threads spin on the cores for their first ~0.1 s — a tax on every `xpuctl`
/// run, table jobs included. It is told to use one thread: `linalg::mm` splits large
/// products over the engine's own team, so two pools never compete for the cores.
/// `Err` (no library, or one without CBLAS) makes `gemm` decline, so another kernel runs.
fn cblas() -> Result<&'static Cblas, &'static str> {
    static CBLAS: OnceLock<Result<Cblas, String>> = OnceLock::new();
    CBLAS
        .get_or_init(|| {
            let mut tried = Vec::new();
            for (path, from) in candidates() {
                match open(&path) {
                    Ok(c) => return Ok(c),
                    Err(e) => tried.push(format!("{e} ({from})")),
                }
            }
            Err(format!("no usable OpenBLAS: {}", tried.join("; ")))
        })
        .as_ref()
        .map_err(String::as_str)
}

/// Loads one library: its CBLAS products under either symbol naming (numpy's OpenBLAS
/// prefixes every symbol with `scipy_` so that it never clashes with another BLAS in the
/// process), its self-description, and one thread a call.
fn open(path: &Path) -> Result<Cblas, String> {
    let name = path.display();
    // SAFETY: loading OpenBLAS runs its initialisers (CPU detection, buffer set-up), which
    // have no preconditions; `quiet_openblas_threads` has kept it from starting threads.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{e}"))?;
    let has = |symbol: String| {
        // SAFETY: only looks the symbol up (the type is not relied on); nothing is called.
        unsafe { library.get::<*const ()>(symbol.as_bytes()) }.is_ok()
    };
    let prefix = ["scipy_", ""]
        .into_iter()
        .find(|p| has(format!("{p}cblas_sgemm\0")))
        .ok_or_else(|| format!("{name}: no cblas_sgemm (not a CBLAS library)"))?;
    let sym = |s: &str| format!("{prefix}{s}\0");
    // SAFETY: the symbols, where present, are OpenBLAS's CBLAS functions with these
    // signatures (cblas.h); the pointers stay valid while `library` is loaded, which
    // `Cblas` keeps for the process's life.
    let (sgemm, dgemm) = unsafe {
        let s =
            *library.get::<Gemm<f32>>(sym("cblas_sgemm").as_bytes()).map_err(|e| e.to_string())?;
        let d =
            *library.get::<Gemm<f64>>(sym("cblas_dgemm").as_bytes()).map_err(|e| e.to_string())?;
        (s, d)
    };
    // SAFETY: `openblas_set_num_threads` takes any positive count at any time; the string
    // getters return pointers to static NUL-terminated strings (or are absent).
    let (config, core) = unsafe {
        if let Ok(set) = library.get::<SetThreads>(sym("openblas_set_num_threads").as_bytes()) {
            set(1);
        }
        let text = |s: &str| -> Option<String> {
            let f = library.get::<GetString>(sym(s).as_bytes()).ok()?;
            let p = f();
            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
        };
        (text("openblas_get_config"), text("openblas_get_corename"))
    };
    let config = config.unwrap_or_else(|| "a CBLAS library (no openblas_get_config)".into());
    let release = config.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    let core = core.unwrap_or_else(|| "unknown".into());
    let degraded = degraded_reason(&release, &core, &host_vector_isa());
    let info = BlasInfo { library: path.to_path_buf(), release, core, degraded };
    Ok(Cblas { sgemm, dgemm, info, _library: library })
}

/// OpenBLAS's x86-64 cores with AVX2 (or wider) GEMM kernels. Any other core on a CPU
/// with AVX2 means the library did not recognise the CPU and fell back to an older family
/// (`Prescott`, `Nehalem`, `Sandybridge` …), which runs far below the machine.
const WIDE_CORES: [&str; 6] =
    ["Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"];

/// Why a BLAS whose detected core is `core` runs below a CPU whose widest vector ISA is
/// `isa` (`"AVX-512"`, `"AVX2"`, or empty for a CPU without either, which nothing degrades).
pub fn degraded_reason(release: &str, core: &str, isa: &str) -> Option<String> {
    if isa.is_empty() || WIDE_CORES.iter().any(|c| c.eq_ignore_ascii_case(core)) {
        return None;
    }
    Some(format!(
        "{release} runs its {core} kernel (no AVX2) on a CPU with {isa}: it does not know this \
         CPU; install a newer OpenBLAS (`make setup` fetches numpy's) or set {LIBRARY_ENV}"
    ))
}

/// This CPU's widest vector ISA that OpenBLAS has kernels for: `AVX-512`, `AVX2`, or "".
pub fn host_vector_isa() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "AVX-512".into();
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "AVX2".into();
        }
    }
    String::new()
}

/// What the BLAS this process loads says of itself, or why none could be loaded.
pub fn info() -> Result<&'static BlasInfo, &'static str> {
    cblas().map(|c| &c.info)
}

/// Tells OpenBLAS, before it loads, to start no threads of its own: without this its
/// pthread build starts one per core at load and they spin for ~0.1 s before `cblas`
/// gets to turn them off, competing with the engine's team for that time. A value the user
/// set stays in the environment (OpenBLAS then starts that many threads at load), but
/// `cblas` still has it run every product on the calling thread.
///
/// # Safety
/// Call at the top of `main`, before the process has started any other thread (it sets an
/// environment variable, which must not race with another thread reading the environment).
pub unsafe fn quiet_openblas_threads() {
    if std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        // SAFETY: no other thread exists yet (this function's contract).
        unsafe { std::env::set_var("OPENBLAS_NUM_THREADS", "1") };
    }
}

/// (transpose flag, leading dimension) for a strided operand CBLAS can take directly.
fn layout<T>(m: &Mat<'_, T>) -> Option<(c_int, usize)> {
    if m.cs == 1 {
        Some((NO_TRANS, m.rs))
    } else if m.rs == 1 {
        Some((TRANS, m.cs))
    } else {
        None
    }
}

/// C[m×n] (row stride `ldc`) = A[m×k]·B[k×n] for f32/f64 operands that are row-major or
/// transposed views, on the calling thread; returns false (nothing written) otherwise, or
/// for dims beyond CBLAS's 32-bit ints, so the caller falls back to another kernel.
///
/// # Safety
/// `c` points at an m×n block with row stride `ldc` that nothing else touches meanwhile,
/// and A and B cover their strided shapes (`linalg::mm` checks both).
pub unsafe fn gemm<T: 'static>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    c: *mut T,
    ldc: usize,
) -> bool {
    let (Some((ta, lda)), Some((tb, ldb))) = (layout(&a), layout(&b)) else { return false };
    let Ok(cblas) = cblas() else { return false };
    let fits = [m, n, k, lda, ldb, ldc].iter().all(|&d| d <= c_int::MAX as usize);
    if !fits || m == 0 || n == 0 || k == 0 {
        return false;
    }
    let (m, n, k) = (m as c_int, n as c_int, k as c_int);
    let (lda, ldb, ldc) = (lda as c_int, ldb as c_int, ldc as c_int);
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        // SAFETY: T is f32 (checked above); operands and C as this function's contract says.
        unsafe {
            (cblas.sgemm)(
                ROW_MAJOR,
                ta,
                tb,
                m,
                n,
                k,
                1.0,
                a.data.as_ptr().cast(),
                lda,
                b.data.as_ptr().cast(),
                ldb,
                0.0,
                c.cast(),
                ldc,
            )
        };
        true
    } else if TypeId::of::<T>() == TypeId::of::<f64>() {
        // SAFETY: as above, with T = f64.
        unsafe {
            (cblas.dgemm)(
                ROW_MAJOR,
                ta,
                tb,
                m,
                n,
                k,
                1.0,
                a.data.as_ptr().cast(),
                lda,
                b.data.as_ptr().cast(),
                ldb,
                0.0,
                c.cast(),
                ldc,
            )
        };
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_without_avx2_on_a_wide_cpu_is_degraded() {
        let check = |core: &str, isa: &str, degraded: bool| {
            let why = degraded_reason("OpenBLAS 0.3.21", core, isa);
            assert_eq!(why.is_some(), degraded, "{core} on {isa:?}: {why:?}");
            if let Some(why) = why {
                assert!(why.contains(core) && why.contains(isa) && why.contains("0.3.21"), "{why}");
            }
        };
        check("Prescott", "AVX-512", true);
        check("Sandybridge", "AVX2", true);
        check("Nehalem", "AVX2", true);
        check("unknown", "AVX2", true);
        check("SkylakeX", "AVX-512", false);
        check("Cooperlake", "AVX-512", false);
        check("SapphireRapids", "AVX-512", false);
        check("Haswell", "AVX-512", false);
        check("ZEN", "AVX2", false);
        check("Prescott", "", false);
    }

    #[test]
    fn the_loaded_library_describes_itself() {
        // `make setup` installs numpy's OpenBLAS; whichever loads, it names its release and
        // core, and it is degraded exactly when its core lacks AVX2 on a CPU that has it.
        let info = info().expect("an OpenBLAS loads (make setup)");
        assert!(info.release.starts_with("OpenBLAS 0."), "{info:?}");
        assert!(!info.core.is_empty(), "{info:?}");
        assert_eq!(info.degraded, degraded_reason(&info.release, &info.core, &host_vector_isa()));
        let text = info.to_string();
        assert!(text.contains(&info.core) && text.contains(&info.release), "{text}");
    }

    #[test]
    fn a_named_library_that_is_missing_or_not_a_blas_is_refused_with_its_path() {
        let missing = open(Path::new("/nonexistent/libopenblas.so")).err().unwrap();
        assert!(missing.contains("/nonexistent/libopenblas.so"), "{missing}");
        let not_blas = open(Path::new("libm.so.6")).err().unwrap();
        assert!(not_blas.contains("no cblas_sgemm"), "{not_blas}");
    }
}
