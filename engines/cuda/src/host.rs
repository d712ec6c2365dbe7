//! Host emulation of generated kernels: the CUDA C++ source compiled by the host C++
//! compiler with a header that defines CUDA's qualifiers away and runs a 1-D grid as loops
//! over blocks and threads. It tests the kernels' logic (indexing, the grid-stride split,
//! reductions, casts) against the cpu engine on a machine without a GPU; device math
//! functions become the host libm's.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::toolkit::ToolkitError;

/// What turns the CUDA dialect the code generator writes into host C++.
pub const HEADER: &str = r#"
#include <math.h>
#include <string.h>
#include <utility>
struct float4 { float x, y, z, w; };
struct xpu_dim3 { unsigned x, y, z; };
static thread_local xpu_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
template <class F> static void xpu_launch(long long grid, long long block, F f) {
  gridDim = {(unsigned)grid, 1, 1};
  blockDim = {(unsigned)block, 1, 1};
  for (long long b = 0; b < grid; ++b)
    for (long long t = 0; t < block; ++t) {
      blockIdx = {(unsigned)b, 0, 0};
      threadIdx = {(unsigned)t, 0, 0};
      f();
    }
}
"#;

/// Generated kernels built for the host and loaded.
pub struct HostModule {
    lib: libloading::Library,
    _dir: tempfile::TempDir,
}

type Entry = unsafe extern "C" fn(*mut *mut u8, i64, i64);

impl HostModule {
    /// Compiles `source` (from [`crate::codegen::source`]) with `c++`.
    pub fn build(source: &str) -> Result<HostModule, ToolkitError> {
        let dir = tempfile::tempdir()
            .map_err(|e| ToolkitError::Io(format!("a scratch directory: {e}")))?;
        let path = |n: &str| -> PathBuf { dir.path().join(n) };
        write(&path("xpu_host.h"), HEADER)?;
        write(&path("kernels.cpp"), source)?;
        let out = Command::new("c++")
            .args(["-std=c++17", "-O1", "-shared", "-fPIC", "-DXPU_HOST_EMULATION", "-include"])
            .arg(path("xpu_host.h"))
            .arg(path("kernels.cpp"))
            .arg("-o")
            .arg(path("kernels.so"))
            .output()
            .map_err(|e| ToolkitError::Io(format!("c++: {e}")))?;
        if !out.status.success() {
            return Err(ToolkitError::Compile {
                name: "host emulation".into(),
                arch: "host".into(),
                log: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        // SAFETY: the library was just built from generated kernels; its initialisers only
        // set up thread-local grid coordinates.
        let lib = unsafe { libloading::Library::new(path("kernels.so")) }
            .map_err(|e| ToolkitError::Io(format!("loading the host build: {e}")))?;
        Ok(HostModule { lib, _dir: dir })
    }

    /// Runs the kernel LIR-ML names `kernel` over `grid` blocks of `block` threads.
    ///
    /// # Safety
    /// `buffers` must point to the kernel's buffers, in its parameter order, each as large
    /// as the kernel's shape for it says (the LIR-ML verifier proved its accesses within).
    pub unsafe fn run(
        &self,
        name: &str,
        buffers: &mut [*mut u8],
        grid: i64,
        block: i64,
    ) -> Result<(), ToolkitError> {
        let symbol = format!("{name}_host\0");
        // SAFETY: the symbol is the host entry the code generator wrote for this kernel,
        // of type `Entry`.
        let f: libloading::Symbol<Entry> = unsafe { self.lib.get(symbol.as_bytes()) }
            .map_err(|e| ToolkitError::Io(format!("kernel `{name}`: {e}")))?;
        // SAFETY: the caller guarantees the buffers (see above).
        unsafe { f(buffers.as_mut_ptr(), grid, block) };
        Ok(())
    }
}

fn write(path: &Path, text: &str) -> Result<(), ToolkitError> {
    std::fs::write(path, text).map_err(|e| ToolkitError::Io(format!("{}: {e}", path.display())))
}
