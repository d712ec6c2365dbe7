//! The `cpu.blas` kernel: row-major SGEMM/DGEMM through the system OpenBLAS (CBLAS),
//! loaded with `dlopen` at first use.

use std::any::TypeId;
use std::os::raw::c_int;

use crate::linalg::Mat;

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;

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

/// The loaded library's CBLAS entry points.
struct Cblas {
    sgemm: Gemm<f32>,
    dgemm: Gemm<f64>,
    /// Kept loaded for the process's life.
    _library: libloading::Library,
}

/// OpenBLAS, loaded at the first product that uses it rather than linked: a linked
/// OpenBLAS starts its thread pool when the process starts, and those threads spin on the
/// cores for their first ~0.1 s — a tax on every `xpuctl` run, table jobs included.
/// It is told to use one thread: `linalg::mm` splits large products over the engine's own
/// team, so two pools never compete for the cores (or wait for each other to wake).
/// `Err` (library missing or without CBLAS) makes `gemm` decline, so another kernel runs.
fn cblas() -> Result<&'static Cblas, &'static str> {
    static CBLAS: std::sync::OnceLock<Result<Cblas, String>> = std::sync::OnceLock::new();
    CBLAS
        .get_or_init(|| {
            let names = ["libopenblas.so.0", "libopenblas.so", "libopenblas.dylib"];
            let mut last = String::from("OpenBLAS not found");
            for name in names {
                // SAFETY: loading OpenBLAS runs its initialisers, which have no preconditions.
                match unsafe { libloading::Library::new(name) } {
                    Ok(library) => {
                        // SAFETY: the symbols are the CBLAS functions with these signatures.
                        let found = unsafe {
                            library.get::<Gemm<f32>>(b"cblas_sgemm\0").map(|s| *s).and_then(|s| {
                                library.get::<Gemm<f64>>(b"cblas_dgemm\0").map(|d| (s, *d))
                            })
                        };
                        // SAFETY: the symbol, where present, has this signature; one thread
                        // is a valid setting at any time.
                        unsafe {
                            if let Ok(set) =
                                library.get::<SetThreads>(b"openblas_set_num_threads\0")
                            {
                                set(1);
                            }
                        }
                        return found
                            .map(|(sgemm, dgemm)| Cblas { sgemm, dgemm, _library: library })
                            .map_err(|e| format!("{name}: {e}"));
                    }
                    Err(e) => last = format!("{name}: {e}"),
                }
            }
            Err(last)
        })
        .as_ref()
        .map_err(String::as_str)
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

const TRANS: c_int = 112;

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
