//! The CUDA libraries and tools, found by configuration and loaded at run time: NVRTC
//! (CUDA C++ → PTX), `ptxas` (PTX → a cubin for one architecture: checks PTX without a
//! GPU) and the driver (`libcuda`). cudarc loads a library by its file name; this module
//! first opens the file it found by full path, so cudarc's load by name resolves to that
//! already-loaded library (the dynamic loader matches it by its SONAME). Nothing here
//! panics on a missing library or device: each is a reason, as data.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Where to look, first match wins: the configured directory (`[engines.cuda]
/// library_dir`), `$XPU_CUDA_LIBRARY_DIR`, then the CUDA wheels `make setup` installs into
/// the checkout's `.venv` (`nvidia/cu13`, or `nvidia/cuda_nvrtc` and `cuda_nvcc` of 12.x).
pub fn search_dirs(configured: Option<&Path>, sub: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = configured.map(Path::to_path_buf).into_iter().collect();
    if let Some(d) = std::env::var_os("XPU_CUDA_LIBRARY_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(venv) = xpu_engine::dylib::find_upwards(Path::new(".venv/lib")) {
        let pythons = std::fs::read_dir(&venv).into_iter().flatten().flatten();
        for py in pythons {
            let nvidia = py.path().join("site-packages/nvidia");
            for layout in ["cu13", "cuda_nvrtc", "cuda_nvcc", "cuda_runtime", "cublas"] {
                dirs.push(nvidia.join(layout).join(sub));
            }
        }
    }
    dirs
}

/// The first of `names` in `dirs`.
pub(crate) fn find_in(dirs: &[PathBuf], names: &[&str]) -> Option<PathBuf> {
    dirs.iter().flat_map(|d| names.iter().map(move |n| d.join(n))).find(|p| p.is_file())
}

/// Libraries opened by path, kept for the life of the process (cudarc's handles to them
/// are process-wide too).
fn preloaded() -> &'static Mutex<Vec<libloading::Library>> {
    static LIBS: OnceLock<Mutex<Vec<libloading::Library>>> = OnceLock::new();
    LIBS.get_or_init(Default::default)
}

pub(crate) fn preload(path: &Path) -> Result<(), String> {
    // SAFETY: loading runs the library's initialisers; these are NVIDIA's CUDA libraries
    // found where configured, whose initialisers have no preconditions.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("{}: cannot be loaded: {e}", path.display()))?;
    preloaded().lock().map_err(|_| "the CUDA loader lock is poisoned".to_string())?.push(lib);
    Ok(())
}

/// Runs `f`, a call into cudarc, with a panic inside it turned into an error.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(format!("{what}: {}", xpu_engine::panic_message(&*p))))
}

/// NVRTC, loaded: its file and version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nvrtc {
    pub path: PathBuf,
    pub version: (i32, i32),
}

/// Finds and loads NVRTC (once per process; later calls return the first outcome).
pub fn nvrtc(configured: Option<&Path>) -> Result<Nvrtc, String> {
    static LOADED: OnceLock<Result<Nvrtc, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let dirs = search_dirs(configured, "lib");
            let names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
            let path = find_in(&dirs, &names).ok_or_else(|| {
                format!(
                    "NVRTC not found: none of {names:?} in {} (make setup installs the nvidia-cuda-nvrtc wheel; or set [engines.cuda] library_dir or XPU_CUDA_LIBRARY_DIR)",
                    dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
                )
            })?;
            // NVRTC opens its builtins library by name at compile time: load it first, from
            // the same directory, so that open finds it.
            let dir = path.parent().unwrap_or(Path::new("."));
            let builtins = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path());
            for b in builtins.filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libnvrtc-builtins.so"))
            }) {
                preload(&b)?;
            }
            preload(&path)?;
            let version = guarded("NVRTC", || {
                let (mut major, mut minor) = (0, 0);
                // SAFETY: nvrtcVersion writes two ints through the pointers given.
                let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
                if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(format!("nvrtcVersion failed: {status:?}"));
                }
                Ok((major, minor))
            })?;
            Ok(Nvrtc { path, version })
        })
        .clone()
}

/// Why a kernel did not compile or assemble.
#[derive(Debug, thiserror::Error)]
pub enum ToolkitError {
    #[error("cuda toolkit unavailable: {0}")]
    Unavailable(String),
    #[error("NVRTC rejected kernel source `{name}` for {arch}: {log}")]
    Compile { name: String, arch: String, log: String },
    #[error("ptxas rejected `{name}` for {arch}: {log}")]
    Assemble { name: String, arch: String, log: String },
    #[error("{0}")]
    Io(String),
}

/// A virtual architecture for NVRTC (`compute_90`) from a real one (`sm_90`) or itself.
pub fn virtual_arch(arch: &str) -> Result<&'static str, ToolkitError> {
    const KNOWN: [&str; 6] = ["75", "80", "86", "89", "90", "100"];
    let digits = arch.trim_start_matches("sm_").trim_start_matches("compute_");
    let known = KNOWN.iter().find(|k| **k == digits).ok_or_else(|| {
        ToolkitError::Io(format!(
            "unknown CUDA architecture `{arch}` (known: sm_{})",
            KNOWN.join(", sm_")
        ))
    })?;
    Ok(match *known {
        "75" => "compute_75",
        "80" => "compute_80",
        "86" => "compute_86",
        "89" => "compute_89",
        "90" => "compute_90",
        _ => "compute_100",
    })
}

/// How generated kernels compute floats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Math {
    /// IEEE division and square root, no flush-to-zero, no FMA contraction: the results
    /// the host emulation and the cpu engine compute (`determinism = "bitwise"`).
    #[default]
    Strict,
    /// `a·b + c` contracted to FMA and division to NVIDIA's approximate form (at most 2
    /// ulp); square root still IEEE, no flush-to-zero. Still the same bits on every run
    /// of a kernel; what `determinism` other than bitwise gets, because the row and chain
    /// kernels are bound by these instructions, not by memory, under strict math.
    Contracted,
}

impl Math {
    /// Strict under `determinism = "bitwise"`, else contracted.
    pub fn for_determinism(d: xpu_engine::options::Determinism) -> Math {
        if d == xpu_engine::options::Determinism::Bitwise { Math::Strict } else { Math::Contracted }
    }

    /// (fmad, prec-div): NVRTC's flags for the mode.
    fn flags(self) -> (bool, bool) {
        match self {
            Math::Strict => (false, true),
            Math::Contracted => (true, false),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Math::Strict => "strict (IEEE division, no FMA contraction)",
            Math::Contracted => "FMA contraction, approximate division (≤ 2 ulp)",
        }
    }
}

/// CUDA C++ → PTX for `arch`, named `name` in errors, with strict math.
pub fn compile_ptx(source: &str, name: &str, arch: &str) -> Result<String, ToolkitError> {
    compile_ptx_with(source, name, arch, Math::Strict)
}

/// CUDA C++ → PTX for `arch` with `math`.
pub fn compile_ptx_with(
    source: &str,
    name: &str,
    arch: &str,
    math: Math,
) -> Result<String, ToolkitError> {
    let varch = virtual_arch(arch)?;
    let (fmad, prec_div) = math.flags();
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(varch),
        fmad: Some(fmad),
        ftz: Some(false),
        prec_div: Some(prec_div),
        prec_sqrt: Some(true),
        options: vec!["--std=c++17".into()],
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    on_nvrtc_thread(source, name, arch, move |source| {
        cudarc::nvrtc::compile_ptx_with_opts(source, opts).map(|p| p.to_src()).map_err(
            |e| match e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                    log.to_string_lossy().into_owned()
                }
                e => e.to_string(),
            },
        )
    })
}

/// CUDA C++ → a cubin for the real architecture `arch` (`sm_90`): what the engine loads on
/// a device of exactly that architecture, so a driver older than NVRTC's PTX ISA cannot
/// refuse it (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`). Strict math, as [`compile_ptx`].
pub fn compile_cubin(source: &str, name: &str, arch: &str) -> Result<Vec<u8>, ToolkitError> {
    compile_cubin_with(source, name, arch, Math::Strict)
}

/// CUDA C++ → a cubin for `arch` with `math`.
pub fn compile_cubin_with(
    source: &str,
    name: &str,
    arch: &str,
    math: Math,
) -> Result<Vec<u8>, ToolkitError> {
    virtual_arch(arch)?;
    let (fmad, prec_div) = math.flags();
    let real = format!("sm_{}", arch.trim_start_matches("sm_").trim_start_matches("compute_"));
    let file = format!("{name}.cu");
    on_nvrtc_thread(source, name, arch, move |source| {
        use cudarc::nvrtc::{result, sys};
        let err = |what: &str, e: result::NvrtcError| format!("{what}: {e:?}");
        let src = std::ffi::CString::new(source).map_err(|e| e.to_string())?;
        let file = std::ffi::CString::new(file).map_err(|e| e.to_string())?;
        let prog = result::create_program(&src, Some(&file)).map_err(|e| err("create", e))?;
        let options = [
            format!("--gpu-architecture={real}"),
            format!("--fmad={fmad}"),
            "--ftz=false".into(),
            format!("--prec-div={prec_div}"),
            "--prec-sqrt=true".into(),
            "--std=c++17".into(),
        ];
        // SAFETY: `prog` was just created and is destroyed once, below, on every path.
        let compiled = unsafe { result::compile_program(prog, &options) };
        let cubin = match compiled {
            Err(_) => {
                // SAFETY: as above; the log belongs to `prog`.
                let log = unsafe { result::get_program_log(prog) }
                    .map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>())
                    .unwrap_or_default();
                Err(log.trim_end_matches('\0').to_string())
            }
            Ok(()) => {
                let mut size = 0usize;
                // SAFETY: `prog` compiled; the size is written through the pointer, then
                // exactly that many bytes into the buffer made for them.
                unsafe {
                    sys::nvrtcGetCUBINSize(prog, &mut size)
                        .result()
                        .map_err(|e| err("nvrtcGetCUBINSize", e))
                        .and_then(|()| {
                            let mut buf = vec![0u8; size];
                            sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                                .result()
                                .map_err(|e| err("nvrtcGetCUBIN", e))
                                .map(|()| buf)
                        })
                }
            }
        };
        // SAFETY: `prog` is not used after this.
        let _ = unsafe { result::destroy_program(prog) };
        cubin
    })
}

/// The stack NVRTC compiles on.
const NVRTC_STACK: usize = 512 << 20;

/// Runs `compile` on `source` with NVRTC loaded, on a thread with a large stack (NVRTC's
/// parser recurses on nesting: address space is reserved, touched only as deep as the
/// source goes), a panic inside it turned into an error.
fn on_nvrtc_thread<T: Send + 'static>(
    source: &str,
    name: &str,
    arch: &str,
    compile: impl FnOnce(String) -> Result<T, String> + Send + 'static,
) -> Result<T, ToolkitError> {
    nvrtc(None).map_err(ToolkitError::Unavailable)?;
    if source.contains('\0') {
        return Err(ToolkitError::Io(format!("kernel source `{name}` contains a NUL byte")));
    }
    let source = source.to_string();
    let compiled = std::thread::Builder::new()
        .name("nvrtc".into())
        .stack_size(NVRTC_STACK)
        .spawn(move || guarded("NVRTC", || compile(source)))
        .map_err(|e| ToolkitError::Io(format!("starting the NVRTC thread: {e}")))?
        .join()
        .unwrap_or_else(|_| Err("NVRTC's thread panicked".into()));
    compiled.map_err(|log| ToolkitError::Compile { name: name.into(), arch: arch.into(), log })
}

/// `ptxas`, from the configured directory's `bin`, `$XPU_CUDA_LIBRARY_DIR/../bin` or the
/// `nvidia-cuda-nvcc` wheel.
pub fn find_ptxas(configured: Option<&Path>) -> Result<PathBuf, String> {
    let mut dirs = search_dirs(configured, "bin");
    dirs.extend(search_dirs(configured, "../bin"));
    find_in(&dirs, &["ptxas"]).ok_or_else(|| {
        "ptxas not found (make setup installs the nvidia-cuda-nvcc wheel; or set [engines.cuda] library_dir)".into()
    })
}

/// Assembles `ptx` for the real architecture `arch` (`sm_90`) and returns the cubin.
pub fn assemble(ptxas: &Path, ptx: &str, name: &str, arch: &str) -> Result<Vec<u8>, ToolkitError> {
    virtual_arch(arch)?;
    let real = format!("sm_{}", arch.trim_start_matches("sm_").trim_start_matches("compute_"));
    let dir =
        tempfile::tempdir().map_err(|e| ToolkitError::Io(format!("a scratch directory: {e}")))?;
    let (input, output) = (dir.path().join("k.ptx"), dir.path().join("k.cubin"));
    std::fs::write(&input, ptx)
        .map_err(|e| ToolkitError::Io(format!("{}: {e}", input.display())))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={real}"))
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .map_err(|e| ToolkitError::Io(format!("{}: {e}", ptxas.display())))?;
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        return Err(ToolkitError::Assemble { name: name.into(), arch: real, log });
    }
    std::fs::read(&output).map_err(|e| ToolkitError::Io(format!("{}: {e}", output.display())))
}

/// What the driver says about device 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub memory_bytes: usize,
    pub driver_version: i32,
}

/// Finds `libcuda.so.1` (configured directory, `$XPU_CUDA_LIBRARY_DIR`, then the system's
/// loader path) and asks it for device 0; every failure is the reason.
pub fn probe_driver(configured: Option<&Path>) -> Result<DeviceFacts, String> {
    let dirs = search_dirs(configured, "lib");
    let explicit = dirs.iter().take(2).map(|d| d.join("libcuda.so.1")).find(|p| p.is_file());
    match explicit {
        Some(p) => preload(&p)?,
        None => {
            // SAFETY: as in `preload`: NVIDIA's driver library, found by the system loader.
            let lib = unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|e| {
                format!("no CUDA driver: libcuda.so.1 is not on the loader path ({e}) and no [engines.cuda] library_dir names one")
            })?;
            preloaded()
                .lock()
                .map_err(|_| "the CUDA loader lock is poisoned".to_string())?
                .push(lib);
        }
    }
    guarded("CUDA driver", || {
        use cudarc::driver::result;
        use cudarc::driver::sys::CUdevice_attribute as A;
        fn e(what: &str) -> impl Fn(cudarc::driver::DriverError) -> String + '_ {
            move |err| format!("{what}: {err:?}")
        }
        result::init().map_err(e("cuInit"))?;
        let count = result::device::get_count().map_err(e("cuDeviceGetCount"))?;
        if count == 0 {
            return Err("the CUDA driver sees no device".into());
        }
        let dev = result::device::get(0).map_err(e("cuDeviceGet"))?;
        // SAFETY: `dev` is a valid device handle from cuDeviceGet after cuInit.
        let attr = |a| unsafe { result::device::get_attribute(dev, a) };
        let mut driver_version = 0;
        // SAFETY: cuDriverGetVersion writes one int through the pointer.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
        Ok(DeviceFacts {
            name: result::device::get_name(dev).map_err(e("cuDeviceGetName"))?,
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).map_err(e("attribute"))?,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR).map_err(e("attribute"))?,
            ),
            multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(e("attribute"))?,
            // SAFETY: as above.
            memory_bytes: unsafe { result::device::total_mem(dev) }
                .map_err(e("cuDeviceTotalMem"))?,
            driver_version,
        })
    })
}
