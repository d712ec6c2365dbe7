//! The cuda engine as the runtime sees it: what it claims (kernels, device facts, or why it
//! is unavailable), device buffers with uploads and downloads, and the CUDA context of
//! device 0 — made at first use and dropped after a sticky error (an illegal address, a
//! trap), which poisons the whole process's CUDA state: from then on the engine is
//! unavailable in this process ([`Engine::poisoned`]) and a worker hosting it is replaced.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DriverError};
use xpu_engine::{
    Assignment, Availability, Capabilities, Device, DeviceBuffer, DeviceId, DeviceKind, Engine,
    EngineError, Executable, HostMemory, KernelCaps, Value,
};
use xpu_ir::{DType, Graph, Op, OpClass, Tensor, TensorData};

use crate::exec::CudaExecutable;
use crate::toolkit::{self, DeviceFacts};

/// The device the engine drives.
pub const DEVICE: DeviceId = DeviceId { kind: DeviceKind::Cuda, ordinal: 0 };

/// Where the engine finds its libraries and keeps compiled kernels (`[engines.cuda]`).
#[derive(Clone, Debug, Default)]
pub struct CudaConfig {
    /// A directory holding `libcuda.so.1`, NVRTC and `ptxas` (`library_dir`); else
    /// `$XPU_CUDA_LIBRARY_DIR`, the checkout's CUDA wheels, the system loader path.
    pub library_dir: Option<PathBuf>,
    /// Compiled kernels (cubin/PTX) between processes; `None`: memory only.
    pub cache_dir: Option<PathBuf>,
}

/// Device 0 once found: its facts and the context jobs run in.
pub(crate) struct Gpu {
    pub facts: DeviceFacts,
    /// `sm_90` for compute capability 9.0.
    pub arch: String,
    pub config: CudaConfig,
    /// cuBLASLt, or why it is not there (`cuda.cublaslt` is then unavailable with it).
    pub cublaslt: Result<crate::cublaslt::Library, String>,
    /// The live context, if any, and its generation — bumped whenever a context is dropped,
    /// so executables prepared in an older one let go of everything they made in it. One
    /// lock for both: a context is never paired with another's generation.
    context: Mutex<(Option<Arc<CudaContext>>, u64)>,
    /// Pinned staging buffers (`memory.pinned_host`) and the generation they were made in;
    /// one transfer at a time uses them.
    staging: Mutex<Option<(u64, crate::staging::Staging)>>,
    /// Device bytes the engine holds between runs ([`Held`]): what an OOM reports as
    /// reserved.
    pub(crate) held: Arc<std::sync::atomic::AtomicU64>,
}

/// The sticky error that poisoned this process's CUDA state, if one did: CUDA then refuses
/// every context of the process, a new one included (measured on an H200 and an H100: a
/// context made after a trapping kernel fails with the trap's `LAUNCH_FAILED`), so every
/// cuda engine of the process refuses further work and a worker hosting one is replaced.
static POISONED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A device allocation the engine keeps between runs (an arena, a workspace, bound input
/// buffers), counted in [`Gpu::held`] while it lives.
pub(crate) struct Held {
    slice: CudaSlice<u8>,
    counter: Arc<std::sync::atomic::AtomicU64>,
}

impl Held {
    pub(crate) fn new(slice: CudaSlice<u8>, gpu: &Gpu) -> Held {
        gpu.held.fetch_add(slice.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Held { slice, counter: gpu.held.clone() }
    }
}

impl std::ops::Deref for Held {
    type Target = CudaSlice<u8>;
    fn deref(&self) -> &CudaSlice<u8> {
        &self.slice
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.slice.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Bytes of allocations owned elsewhere (a captured graph's fixed buffers, held as values)
/// counted in [`Gpu::held`] while this lives.
pub(crate) struct HeldBytes {
    bytes: u64,
    counter: Arc<std::sync::atomic::AtomicU64>,
}

impl HeldBytes {
    pub(crate) fn new(bytes: u64, gpu: &Gpu) -> HeldBytes {
        gpu.held.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        HeldBytes { bytes, counter: gpu.held.clone() }
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Gpu {
    /// The live context and its generation, made if there is none; refused once a sticky
    /// error poisoned the process.
    pub fn context(&self) -> Result<(Arc<CudaContext>, u64), EngineError> {
        if let Some(why) = self.poisoned() {
            return Err(EngineError::Unavailable { engine: "cuda".into(), reason: why });
        }
        let mut slot =
            self.context.lock().map_err(|_| unavailable("the context lock is poisoned"))?;
        if let Some(ctx) = slot.0.as_ref() {
            return Ok((ctx.clone(), slot.1));
        }
        let made = new_context()?;
        slot.0 = Some(made.clone());
        Ok((made, slot.1))
    }

    /// Why the process's CUDA state can run nothing more, if a sticky error poisoned it.
    pub fn poisoned(&self) -> Option<String> {
        let first = POISONED.get()?;
        Some(format!(
            "an earlier error poisoned this process's CUDA state ({first}); CUDA needs a new \
             process: run the engine in a worker (isolation = \"process\", its default), \
             which is replaced, or restart this one"
        ))
    }

    /// `f` with the staging buffers of context generation `generation` (made at first use,
    /// and again after a context reset).
    pub fn staged(
        &self,
        ctx: &Arc<CudaContext>,
        generation: u64,
        f: impl FnOnce(&mut crate::staging::Staging) -> Result<(), DriverError>,
    ) -> Result<(), DriverError> {
        let mut slot = self.staging.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.as_ref().is_none_or(|(g, _)| *g != generation) {
            *slot = None;
            *slot = Some((generation, crate::staging::Staging::new(ctx)?));
        }
        let (_, staging) = slot.as_mut().expect("made above");
        f(staging)
    }

    /// After a sticky error (the process is then poisoned: no new context is made) or a
    /// destroyed context: the context is dropped, its memory and modules with it once the
    /// executables holding them let go — they do on their next run, seeing the new
    /// generation.
    pub fn drop_context(&self) {
        if let Ok(mut slot) = self.context.lock() {
            slot.0 = None;
            slot.1 += 1;
        }
    }

    /// An error for a failed driver call on `node`, dropping the context when the error
    /// is one that poisons it.
    pub fn driver_error(&self, node: &str, what: &str, e: DriverError) -> EngineError {
        use cudarc::driver::sys::CUresult as R;
        let code = e.0;
        if code == R::CUDA_ERROR_OUT_OF_MEMORY {
            let ctx = self.context.lock().ok().and_then(|c| c.0.clone());
            let free = ctx.as_ref().and_then(|c| c.mem_get_info().ok()).map_or(0, |(f, _)| f);
            // The stream-ordered pool keeps freed memory (its release threshold is
            // unbounded): cuMemGetInfo counts it as used, but an allocation can have it.
            let idle = ctx.as_ref().map_or(0, |c| pool_idle_bytes(c));
            let available = free as u64 + idle;
            let reserved = self.held.load(std::sync::atomic::Ordering::Relaxed);
            return EngineError::OutOfMemory { device: DEVICE, requested: 0, available, reserved };
        }
        let sticky = matches!(
            code,
            R::CUDA_ERROR_ILLEGAL_ADDRESS
                | R::CUDA_ERROR_LAUNCH_FAILED
                | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
                | R::CUDA_ERROR_MISALIGNED_ADDRESS
                | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
                | R::CUDA_ERROR_INVALID_PC
                | R::CUDA_ERROR_HARDWARE_STACK_ERROR
                | R::CUDA_ERROR_ASSERT
                | R::CUDA_ERROR_ECC_UNCORRECTABLE
                | R::CUDA_ERROR_LAUNCH_TIMEOUT
        );
        let mut message = format!("engine cuda, device {DEVICE}: {what}: {code:?}");
        if code == R::CUDA_ERROR_CONTEXT_IS_DESTROYED {
            // Our context is gone, not the process's CUDA state: the next job makes another.
            self.drop_context();
        }
        if sticky {
            let _ = POISONED.set(format!("{code:?} in {what} of {node}"));
            self.drop_context();
            message.push_str(
                " (this error poisons the process's CUDA state: the engine takes no more work \
                 in this process; a worker hosting it is replaced for the next job)",
            );
        }
        EngineError::Kernel { node: node.to_string(), message }
    }

    /// [`driver_error`](Self::driver_error) for a failed allocation of `bytes` (after its
    /// retry, [`retry_after_trim`]): an OOM names the bytes asked for.
    pub fn allocation_error(&self, node: &str, e: DriverError, bytes: u64) -> EngineError {
        match self.driver_error(node, "allocation", e) {
            EngineError::OutOfMemory { device, available, reserved, .. } => {
                EngineError::OutOfMemory { device, requested: bytes, available, reserved }
            }
            other => other,
        }
    }
}

/// The device's default memory pool (the one stream-ordered allocations come from).
fn default_pool(ctx: &CudaContext) -> Option<cudarc::driver::sys::CUmemoryPool> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: writes the pool handle of the context's device into a live local.
    let ok = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        == sys::CUresult::CUDA_SUCCESS;
    (ok && !pool.is_null()).then_some(pool)
}

/// Bytes the default pool holds but no allocation uses (reserved less used).
fn pool_idle_bytes(ctx: &CudaContext) -> u64 {
    use cudarc::driver::sys;
    let Some(pool) = default_pool(ctx) else { return 0 };
    let attr = |a: sys::CUmemPool_attribute| {
        let mut v: u64 = 0;
        // SAFETY: both attributes are u64 values, read into a live local.
        let r = unsafe { sys::cuMemPoolGetAttribute(pool, a, (&mut v as *mut u64).cast()) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
    };
    let reserved = attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    let used = attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    match (reserved, used) {
        (Some(r), Some(u)) => r.saturating_sub(u),
        _ => 0,
    }
}

/// `alloc`, and when it fails with the driver's out-of-memory, `trim` (handing back memory
/// the engine holds but does not need) and `alloc` once more — whose error, an OOM again
/// included, is the answer. Any other error is returned at once, without a trim, and so is
/// a trim's own error (a failed synchronisation says more than the OOM). Every device
/// allocation the engine makes outside a graph capture goes through here (as
/// [`alloc_or_trim`] or [`alloc_zeros_or_trim`]); the callers turn the final OOM into
/// `EngineError::OutOfMemory` with the bytes asked for, available and held
/// ([`Gpu::driver_error`]).
pub(crate) fn retry_after_trim<T>(
    mut alloc: impl FnMut() -> Result<T, DriverError>,
    trim: impl FnOnce() -> Result<(), DriverError>,
) -> Result<T, DriverError> {
    match alloc() {
        Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            trim()?;
            alloc()
        }
        other => other,
    }
}

/// What the engine can let go of when an allocation meets an OOM: the default pool's unused
/// memory, handed back to the driver (the pool keeps every freed block, its release
/// threshold being unbounded, in chunks that may not fit the request) — as PyTorch's
/// caching allocator empties its cache before reporting an OOM. Arenas, workspaces and
/// bound inputs are in use by the executables that hold them and stay.
fn trim_pool(stream: &Arc<CudaStream>) -> Result<(), DriverError> {
    use cudarc::driver::sys;
    // Frees in flight on this stream complete first, so the trim can return them.
    stream.synchronize()?;
    if let Some(pool) = default_pool(stream.context()) {
        // SAFETY: trims a pool handle of this context's device; unused memory only.
        unsafe { sys::cuMemPoolTrimTo(pool, 0) };
    }
    Ok(())
}

/// `bytes` of device memory from `stream`'s pool, the pool trimmed and the allocation
/// tried once more on an OOM ([`retry_after_trim`]).
///
/// # Safety
/// The memory is not initialised: the caller writes every byte before reading it (as for
/// cudarc's `alloc`).
pub(crate) unsafe fn alloc_or_trim(
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> Result<CudaSlice<u8>, DriverError> {
    retry_after_trim(
        // SAFETY: the caller's contract (above).
        || unsafe { stream.alloc::<u8>(bytes) },
        || trim_pool(stream),
    )
}

/// `bytes` of zeroed device memory, as [`alloc_or_trim`].
pub(crate) fn alloc_zeros_or_trim(
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> Result<CudaSlice<u8>, DriverError> {
    retry_after_trim(|| stream.alloc_zeros::<u8>(bytes), || trim_pool(stream))
}

/// A context of its own for device 0 (not the primary one, which every user of the device
/// in this process shares), with cudarc's
/// per-buffer event tracking off (one stream per executable, synchronised by the engine;
/// tracking events cannot be recorded inside a capture) and the stream-ordered pool keeping
/// freed memory (a release threshold of 0 would map every run's buffers afresh).
fn new_context() -> Result<Arc<CudaContext>, EngineError> {
    let made = std::panic::catch_unwind(|| {
        CudaContext::new_non_primary(0, 0).or_else(|_| CudaContext::new(0))
    })
    .map_err(|p| unavailable(&format!("CUDA context: {}", xpu_engine::panic_message(&*p))))?
    .map_err(|e| unavailable(&format!("CUDA context: {e:?}")))?;
    // SAFETY: nothing has used the context yet; every stream the engine makes is
    // synchronised before its buffers are read by the host or freed.
    unsafe { made.disable_event_tracking() };
    if made.has_async_alloc()
        && made.bind_to_thread().is_ok()
        && let Some(pool) = default_pool(&made)
    {
        use cudarc::driver::sys;
        let mut threshold: u64 = u64::MAX;
        // SAFETY: a pool handle of the context's device; the attribute is read from a live
        // u64. A failure only leaves the driver's default threshold.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            );
        }
    }
    Ok(made)
}

/// A toolkit newer than the driver makes images the driver cannot load: refused up front
/// with both versions, rather than as a load error in the first job.
pub fn toolkit_mismatch(driver_version: i32, nvrtc: (i32, i32)) -> Option<String> {
    let driver_major = driver_version / 1000;
    (nvrtc.0 > driver_major).then(|| {
        format!(
            "NVRTC {}.{} is newer than the CUDA driver ({}.{}): its images would not load; point [engines.cuda] library_dir or XPU_CUDA_LIBRARY_DIR at an NVRTC of CUDA {driver_major}.x or older",
            nvrtc.0,
            nvrtc.1,
            driver_major,
            driver_version % 1000 / 10
        )
    })
}

fn unavailable(reason: &str) -> EngineError {
    EngineError::Unavailable { engine: "cuda".into(), reason: reason.to_string() }
}

/// A value in device memory.
pub struct CudaBuffer {
    pub(crate) data: CudaSlice<u8>,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    /// The stream that wrote it, synchronised before anyone else reads it.
    pub(crate) stream: Arc<CudaStream>,
}

/// `bytes` in a new device allocation ordered on `stream` (one byte for an empty tensor: the
/// driver refuses zero-byte allocations).
pub(crate) fn upload_bytes(
    stream: &Arc<CudaStream>,
    bytes: &[u8],
) -> Result<CudaSlice<u8>, DriverError> {
    // SAFETY: the first `bytes.len()` bytes are written by the copy below; an empty
    // tensor's padding byte is never read.
    let mut data = unsafe { alloc_or_trim(stream, bytes.len().max(1)) }?;
    if !bytes.is_empty() {
        stream.memcpy_htod(bytes, &mut data.slice_mut(..bytes.len()))?;
    }
    Ok(data)
}

impl CudaBuffer {
    /// Its bytes into `out` (as many as `out` holds: an empty tensor's buffer has a padding
    /// byte), waiting for the copy.
    pub(crate) fn read_into(&self, out: &mut [u8]) -> Result<(), DriverError> {
        if !out.is_empty() {
            self.stream.memcpy_dtoh(&self.data.slice(..out.len()), out)?;
        }
        self.stream.synchronize()
    }
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuffer({} {:?} on {DEVICE})", self.dtype, self.shape)
    }
}

impl DeviceBuffer for CudaBuffer {
    fn engine(&self) -> &str {
        "cuda"
    }
    fn device(&self) -> DeviceId {
        DEVICE
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The bytes of a tensor the kernels can take (numbers and bools), else an error naming it.
pub(crate) fn host_bytes<'t>(t: &'t Tensor, what: &str) -> Result<&'t [u8], EngineError> {
    t.element_bytes().ok_or_else(|| EngineError::Input {
        name: what.to_string(),
        message: format!("dtype {} has no device form", t.dtype()),
    })
}

/// A host tensor of `dtype` and `shape` whose bytes `fill` writes.
pub(crate) fn host_tensor(
    dtype: DType,
    shape: &[usize],
    fill: impl FnOnce(&mut [u8]) -> Result<(), EngineError>,
) -> Result<Tensor, EngineError> {
    let n: usize = shape.iter().product();
    let data = TensorData::zeros(dtype, n);
    let p = data
        .as_byte_ptr()
        .ok_or_else(|| EngineError::Other(format!("dtype {dtype} on {DEVICE}")))?;
    // SAFETY: `p` is the first byte of the fresh element vector `data` owns (n elements of
    // dtype, initialised to zero); nothing else refers to it while `fill` writes, and every
    // bit pattern the device writes is a valid element (bools are written as 0 or 1).
    let bytes = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n * dtype.size_bytes()) };
    fill(bytes)?;
    Tensor::new(shape.to_vec(), data).map_err(|e| EngineError::Other(format!("cuda output: {e}")))
}

/// The engine.
pub struct CudaEngine {
    gpu: Result<Arc<Gpu>, String>,
    /// cuBLASLt plans each executable keeps (per product and shape), the least recently
    /// used dropped past it.
    plan_cache_entries: usize,
}

impl CudaEngine {
    /// Looks for the driver and device 0 (and NVRTC, without which nothing compiles); every
    /// miss is the reason the engine reports as unavailable.
    pub fn new(config: CudaConfig) -> CudaEngine {
        let gpu = toolkit::probe_driver(config.library_dir.as_deref()).and_then(|facts| {
            let nvrtc = toolkit::nvrtc(config.library_dir.as_deref())?;
            if let Some(why) = toolkit_mismatch(facts.driver_version, nvrtc.version) {
                return Err(why);
            }
            let (major, minor) = facts.compute_capability;
            let cublaslt = crate::cublaslt::load(config.library_dir.as_deref());
            Ok(Arc::new(Gpu {
                arch: format!("sm_{major}{minor}"),
                facts,
                cublaslt,
                config,
                context: Mutex::new((None, 0)),
                staging: Mutex::new(None),
                held: Default::default(),
            }))
        });
        CudaEngine { gpu, plan_cache_entries: crate::lru_map::DEFAULT_CAPACITY }
    }

    /// The engine with each executable keeping at most `entries` cuBLASLt plans (one per
    /// product and set of shapes; at least 1, [`crate::lru_map::DEFAULT_CAPACITY`] unless
    /// set): past it the least recently used plan is dropped, and made again (cuBLASLt's
    /// heuristic asked again) if its shapes come back. Facts `cuda.cublaslt_plans` and
    /// `cuda.cublaslt_plans_evicted` report each executable's cache.
    pub fn with_plan_cache_entries(mut self, entries: usize) -> CudaEngine {
        self.plan_cache_entries = entries.max(1);
        self
    }

    /// The default disk cache: `$XPU_CACHE_DIR/cuda`, else `$XDG_CACHE_HOME/xpu/cuda`, else
    /// `~/.cache/xpu/cuda`.
    pub fn default_cache_dir() -> Option<PathBuf> {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        env("XPU_CACHE_DIR")
            .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("xpu")))
            .or_else(|| env("HOME").map(|h| h.join(".cache").join("xpu")))
            .map(|d| d.join("cuda"))
    }

    /// Seconds one device-to-device copy of `bytes` takes (events around
    /// `cuMemcpyDtoDAsync` on a fresh stream): the memory roof benchmarks compare with.
    pub fn time_device_copy(&self, bytes: usize) -> Result<f64, EngineError> {
        use cudarc::driver::DevicePtr;
        use cudarc::driver::sys::CUevent_flags;
        let gpu = self.gpu()?;
        let (ctx, _) = gpu.context()?;
        let err = |what: &'static str| move |e| gpu.driver_error("copy", what, e);
        let stream = ctx.new_stream().map_err(err("new stream"))?;
        // SAFETY: the bytes are only copied, never read as values.
        let src = unsafe { alloc_or_trim(&stream, bytes.max(1)) }.map_err(err("allocation"))?;
        // SAFETY: as above.
        let dst = unsafe { alloc_or_trim(&stream, bytes.max(1)) }.map_err(err("allocation"))?;
        let start =
            stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err("event"))?;
        // SAFETY: both allocations are live, `bytes` long, on this context; ordered on `stream`.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst.device_ptr(&stream).0,
                src.device_ptr(&stream).0,
                bytes,
                stream.cu_stream(),
            )
        }
        .map_err(err("copy"))?;
        let end =
            stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err("event"))?;
        let ms = start.elapsed_ms(&end).map_err(err("timing"))?;
        stream.synchronize().map_err(err("synchronize"))?;
        Ok(ms as f64 / 1e3)
    }

    /// Runs a kernel that executes PTX `trap` — what a faulting kernel does — and returns
    /// the error the engine makes of it, through the same path a failed run takes (which
    /// marks this process's CUDA state poisoned: the engine is unavailable here from then
    /// on, and a worker hosting it is replaced). For checking that on a real GPU
    /// (`make gpu-check`); nothing in xpud or xpuctl calls it.
    pub fn run_trapping_kernel(&self) -> EngineError {
        use cudarc::driver::LaunchConfig;
        let gpu = match self.gpu() {
            Ok(gpu) => gpu,
            Err(e) => return e,
        };
        let source = "extern \"C\" __global__ void xpu_trap() { asm volatile(\"trap;\"); }\n";
        let built = match crate::image::build(source, &gpu.arch, toolkit::Math::Strict, None) {
            Ok(b) => b,
            Err(e) => return EngineError::Other(format!("cuda: trap kernel: {e}")),
        };
        let ctx = match gpu.context() {
            Ok((ctx, _)) => ctx,
            Err(e) => return e,
        };
        let run = || -> Result<(), (&'static str, DriverError)> {
            let module = ctx.load_module(built.module()).map_err(|e| ("loading", e))?;
            let f = module.load_function("xpu_trap").map_err(|e| ("kernel lookup", e))?;
            let stream = ctx.new_stream().map_err(|e| ("new stream", e))?;
            let cfg =
                LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the kernel takes no parameters and touches no memory; it traps.
            unsafe { stream.launch_builder(&f).launch(cfg) }.map_err(|e| ("launch", e))?;
            stream.synchronize().map_err(|e| ("synchronize", e))
        };
        match run() {
            Err((what, e)) => gpu.driver_error("xpu_trap", what, e),
            Ok(()) => EngineError::Other("cuda: the trapping kernel completed".into()),
        }
    }

    /// Why the engine cannot run here, if it cannot.
    pub fn unavailable_reason(&self) -> Option<&str> {
        self.gpu.as_ref().err().map(String::as_str)
    }

    fn gpu(&self) -> Result<&Arc<Gpu>, EngineError> {
        self.gpu.as_ref().map_err(|reason| unavailable(reason))
    }
}

/// What the engine claims on a device: generated kernels for the ops the LIR-ML lowering
/// takes (elementwise chains and reductions as `cuda.fused`, matmul as the loop nest
/// `cuda.naive`), and matmul and Gemm on cuBLASLt (`cuda.cublaslt`) when `cublaslt` is
/// loaded — listed ahead of `cuda.naive`, the order the planner prefers them in.
pub fn kernels(cublaslt: bool) -> Vec<KernelCaps> {
    use xpu_lower as lower;
    let mut ops = lower::ops::OPS.to_vec();
    ops.extend(lower::REDUCE_OPS);
    ops.extend([Op::Transpose, Op::LayerNormalization, Op::Constant]);
    let mut op_dtypes = xpu_lower::narrower_dtypes(&xpu_lower::FUSED_DTYPES)
        .into_iter()
        .map(|(ops, dtypes)| xpu_engine::OpDtypes { ops, dtypes })
        .collect::<Vec<_>>();
    op_dtypes.push(xpu_engine::OpDtypes {
        ops: vec![Op::Softmax, Op::LogSoftmax],
        dtypes: lower::SOFTMAX_DTYPES.to_vec(),
    });
    op_dtypes.push(xpu_engine::OpDtypes {
        ops: lower::REDUCE_OPS.iter().copied().chain([Op::LayerNormalization]).collect(),
        dtypes: xpu_lower::FUSED_DTYPES.to_vec(),
    });
    let mut out = vec![
        KernelCaps {
            name: "cuda.fused".into(),
            ops,
            classes: Vec::new(),
            dtypes: xpu_lower::OPERAND_DTYPES.to_vec(),
            deterministic: true,
            description: "LIR-ML groups (elementwise chains with broadcasting, reductions, softmax, layer norm, transposes) as CUDA C++ compiled by NVRTC to a cubin for the device; reductions serial per thread in a fixed order, no atomics".into(),
            device: None,
            operand_dtypes: xpu_lower::OPERAND_DTYPES.to_vec(),
            op_dtypes,
            degraded: None,
        },
        KernelCaps {
            name: "cuda.naive".into(),
            ops: vec![Op::MatMul],
            classes: Vec::new(),
            dtypes: vec![DType::F32, DType::F64],
            deterministic: true,
            description: "reference matmul: the LIR-ML loop nest as a CUDA kernel, k summed in order".into(),
            device: None,
            operand_dtypes: vec![DType::F32, DType::F64],
            op_dtypes: Vec::new(),
            degraded: None,
        },
    ];
    if cublaslt {
        let dtypes = vec![DType::F32, DType::F16, DType::BF16];
        // Before `cuda.naive`: the planner takes an engine's kernels in this order where
        // the policy prefers none, and the loop nest is only the reference.
        out.insert(1, KernelCaps {
            name: crate::segment::CUBLASLT.into(),
            ops: vec![Op::MatMul, Op::Gemm],
            classes: Vec::new(),
            dtypes: dtypes.clone(),
            deterministic: true,
            description: "matmul (batched, broadcast batch) and ONNX Gemm (transposes as operand flags, alpha, beta, C as a column bias or a whole matrix) on cuBLASLt: f32 strict, tf32 under precision = \"tf32\", bf16/f16 with f32 accumulation; bias, ReLU and tanh-GELU epilogues fused; algorithm picked by the heuristic at the first run of a shape and pinned; no in-place split-K (atomics) under bitwise determinism".into(),
            device: None,
            operand_dtypes: dtypes,
            op_dtypes: Vec::new(),
            degraded: None,
        });
    }
    out
}

/// Kernels the catalogue names that this build does not run here, with why.
pub fn missing_kernels(cublaslt: Result<(), &str>) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    if let Err(why) = cublaslt {
        out.insert(crate::segment::CUBLASLT.to_string(), why.to_string());
    }
    out.insert("cuda.flash_v2".into(), "no fused attention kernel in this build".into());
    out
}

impl Engine for CudaEngine {
    fn name(&self) -> &str {
        "cuda"
    }

    fn version(&self) -> String {
        match &self.gpu {
            Ok(g) => match &g.cublaslt {
                Ok(lt) => format!(
                    "CUDA driver {}, cuBLASLt {}",
                    g.facts.driver_version,
                    lt.version_text()
                ),
                Err(_) => format!("CUDA driver {}", g.facts.driver_version),
            },
            Err(_) => String::new(),
        }
    }

    fn poisoned(&self) -> Option<String> {
        self.gpu.as_ref().ok()?.poisoned()
    }

    fn capabilities(&self) -> Capabilities {
        if let Some(reason) = self.poisoned() {
            return Capabilities::absent("cuda", Availability::Unavailable { reason });
        }
        let gpu = match &self.gpu {
            Err(reason) => {
                return Capabilities::absent(
                    "cuda",
                    Availability::Unavailable { reason: reason.clone() },
                );
            }
            Ok(g) => g,
        };
        let f = &gpu.facts;
        Capabilities {
            engine: "cuda".into(),
            version: format!(
                "CUDA driver {}.{} ({}, {}, {} SMs)",
                f.driver_version / 1000,
                f.driver_version % 1000 / 10,
                f.name,
                gpu.arch,
                f.multiprocessors
            ),
            availability: Availability::Available,
            devices: vec![Device {
                id: DEVICE,
                name: f.name.clone(),
                memory_bytes: Some(f.memory_bytes as u64),
            }],
            kernels: kernels(gpu.cublaslt.is_ok()),
            unavailable_kernels: missing_kernels(
                gpu.cublaslt.as_ref().map(|_| ()).map_err(String::as_str),
            ),
        }
    }

    fn classes_without_loading(&self) -> Option<Vec<OpClass>> {
        Some(xpu_lower::op_classes())
    }

    fn prepare(
        &self,
        partition: &Graph,
        assignment: &Assignment,
    ) -> Result<Box<dyn Executable>, EngineError> {
        let gpu = self.gpu()?.clone();
        let (products, notes) =
            crate::segment::library_products(partition, assignment, gpu.cublaslt.as_ref())?;
        if products.is_empty() {
            let exe = CudaExecutable::prepare(partition.clone(), gpu, &assignment.options)?;
            return Ok(Box::new(exe.with_notes(notes)));
        }
        Ok(Box::new(crate::segment::SegmentedExecutable::prepare(
            partition.clone(),
            gpu,
            assignment,
            products,
            notes,
            self.plan_cache_entries,
        )?))
    }

    fn device_memory(&self, device: DeviceId) -> bool {
        device == DEVICE && self.gpu.is_ok()
    }

    /// Tensors of [`crate::staging::MIN_BYTES`] or more go through pinned staging buffers
    /// when `memory.pinned_host` asks.
    fn pinned_staging(&self, device: DeviceId) -> Option<u64> {
        self.device_memory(device).then_some(crate::staging::MIN_BYTES as u64)
    }

    fn upload(
        &self,
        tensor: &Tensor,
        device: DeviceId,
        host: HostMemory,
    ) -> Result<Value, EngineError> {
        let gpu = self.gpu()?;
        if device != DEVICE {
            return Err(EngineError::NoDevice {
                engine: "cuda".into(),
                device,
                what: "upload a value to it".into(),
            });
        }
        let (ctx, generation) = gpu.context()?;
        let stream = ctx.new_stream().map_err(|e| gpu.driver_error("upload", "new stream", e))?;
        let bytes = host_bytes(tensor, "upload")?;
        let data = if host == HostMemory::Pinned && bytes.len() >= crate::staging::MIN_BYTES {
            // SAFETY: every byte is written by the staged copy below before anyone reads it.
            let data = unsafe { alloc_or_trim(&stream, bytes.len()) }
                .map_err(|e| gpu.allocation_error("upload", e, bytes.len() as u64))?;
            gpu.staged(&ctx, generation, |s| s.upload(&stream, bytes, data.device_ptr(&stream).0))
                .map_err(|e| gpu.driver_error("upload", "pinned host → device copy", e))?;
            data
        } else {
            upload_bytes(&stream, bytes)
                .map_err(|e| gpu.driver_error("upload", "host → device copy", e))?
        };
        stream.synchronize().map_err(|e| gpu.driver_error("upload", "synchronize", e))?;
        Ok(Value::Device(Arc::new(CudaBuffer {
            data,
            dtype: tensor.dtype(),
            shape: tensor.shape().to_vec(),
            stream,
        })))
    }

    fn download(&self, buffer: &dyn DeviceBuffer, host: HostMemory) -> Result<Tensor, EngineError> {
        let gpu = self.gpu()?;
        let b =
            buffer.as_any().downcast_ref::<CudaBuffer>().ok_or_else(|| EngineError::NoDevice {
                engine: "cuda".into(),
                device: buffer.device(),
                what: "download a buffer of another engine".into(),
            })?;
        host_tensor(b.dtype, &b.shape, |out| {
            if host == HostMemory::Pinned && out.len() >= crate::staging::MIN_BYTES {
                let (ctx, generation) = gpu.context()?;
                b.stream
                    .synchronize()
                    .map_err(|e| gpu.driver_error("download", "synchronize", e))?;
                let stream = &b.stream;
                gpu.staged(&ctx, generation, |s| {
                    s.download(stream, b.data.device_ptr(stream).0, out)
                })
                .map_err(|e| gpu.driver_error("download", "device → pinned host copy", e))
            } else {
                b.read_into(out).map_err(|e| gpu.driver_error("download", "device → host copy", e))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;
    use std::cell::Cell;

    /// An allocation answering `answers` in turn (`None`: it succeeds), and the number of
    /// calls made and trims asked. No driver call is made (nor a `DriverError` formatted,
    /// which would ask the driver for its message): no GPU needed.
    fn attempt(
        answers: &[Option<CUresult>],
        trim_fails: bool,
    ) -> (Result<u32, DriverError>, u32, u32) {
        let (calls, trims) = (Cell::new(0u32), Cell::new(0u32));
        let result = retry_after_trim(
            || {
                let k = calls.get();
                calls.set(k + 1);
                match answers[k as usize] {
                    None => Ok(k),
                    Some(code) => Err(DriverError(code)),
                }
            },
            || {
                trims.set(trims.get() + 1);
                match trim_fails {
                    true => Err(DriverError(CUresult::CUDA_ERROR_LAUNCH_FAILED)),
                    false => Ok(()),
                }
            },
        );
        (result, calls.get(), trims.get())
    }

    const OOM: Option<CUresult> = Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY);

    #[test]
    fn an_allocation_out_of_memory_once_is_retried_after_a_trim() {
        let (result, calls, trims) = attempt(&[OOM, None], false);
        assert!(matches!(result, Ok(1)), "the second try's allocation");
        assert_eq!((calls, trims), (2, 1));
    }

    #[test]
    fn an_allocation_out_of_memory_twice_is_the_out_of_memory_error() {
        let (result, calls, trims) = attempt(&[OOM, OOM, None], false);
        assert!(matches!(result, Err(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY))));
        assert_eq!((calls, trims), (2, 1), "one retry only");
    }

    #[test]
    fn other_allocation_errors_are_neither_trimmed_nor_retried() {
        let invalid = Some(CUresult::CUDA_ERROR_INVALID_VALUE);
        let (result, calls, trims) = attempt(&[invalid, None], false);
        assert!(matches!(result, Err(DriverError(CUresult::CUDA_ERROR_INVALID_VALUE))));
        assert_eq!((calls, trims), (1, 0));
        // A success first is the answer, with no trim.
        let (result, calls, trims) = attempt(&[None, OOM], false);
        assert!(matches!(result, Ok(0)));
        assert_eq!((calls, trims), (1, 0));
    }

    #[test]
    fn a_failed_trim_is_the_error_and_the_allocation_is_not_retried() {
        let (result, calls, trims) = attempt(&[OOM, None], true);
        assert!(matches!(result, Err(DriverError(CUresult::CUDA_ERROR_LAUNCH_FAILED))));
        assert_eq!((calls, trims), (1, 1));
    }
}
