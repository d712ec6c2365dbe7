//! `cuda.cublaslt`: matrix products through NVIDIA's cuBLASLt, loaded at run time like the
//! other CUDA libraries (by full path from the configured directory, so cudarc's load by
//! name finds it). One [`GemmPlan`] per product and set of shapes: the layouts, the compute
//! mode (f32 strict, TF32 or bf16/f16 with f32 accumulation), the epilogue (bias, ReLU,
//! GELU) and the algorithm — chosen once by cuBLASLt's heuristic when the plan is made and
//! pinned, so every later run (and a captured graph) uses the same one; under bitwise
//! determinism, algorithms that reduce split-K partials with atomics are excluded.
//!
//! Row-major products are computed as column-major ones with the operands swapped:
//! `C = A·B` (row-major) is `Cᵀ = Bᵀ·Aᵀ`, and a row-major matrix read column-major is its
//! transpose, so no data moves.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use xpu_ir::DType;

/// cuBLASLt, loaded: its file and version (`major * 10000 + minor * 100 + patch`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    pub path: PathBuf,
    pub version: usize,
}

impl Library {
    pub fn version_text(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    }
}

/// Finds and loads cuBLASLt (once per process; later calls return the first outcome).
pub fn load(configured: Option<&Path>) -> Result<Library, String> {
    static LOADED: OnceLock<Result<Library, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let dirs = crate::toolkit::search_dirs(configured, "lib");
            let names = ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"];
            let path = crate::toolkit::find_in(&dirs, &names).ok_or_else(|| {
                format!(
                    "cuBLASLt not found: none of {names:?} in {} (the nvidia-cublas wheel, or set [engines.cuda] library_dir or XPU_CUDA_LIBRARY_DIR)",
                    dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
                )
            })?;
            crate::toolkit::preload(&path)?;
            let version = crate::toolkit::guarded("cuBLASLt", || {
                // SAFETY: the library was loaded above; these calls take no arguments.
                unsafe {
                    if !sys::is_culib_present() {
                        return Err(format!("{}: loaded, but cudarc cannot open it", path.display()));
                    }
                    Ok(sys::cublasLtGetVersion())
                }
            })?;
            Ok(Library { path, version })
        })
        .clone()
}

/// A cuBLASLt handle, destroyed with it.
pub struct Handle(sys::cublasLtHandle_t);

// SAFETY: a cuBLASLt handle may be used from any thread; the executable owning it makes
// one call at a time (through `&mut self`).
unsafe impl Send for Handle {}

impl Handle {
    pub fn new() -> Result<Handle, String> {
        crate::toolkit::guarded("cuBLASLt handle", || {
            lt::create_handle().map(Handle).map_err(|e| format!("cublasLtCreate: {e:?}"))
        })
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle was made by `cublasLtCreate` and is destroyed once.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

/// How the product computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// f32 in and out, IEEE f32 products (no tensor-core rounding of the inputs).
    F32Strict,
    /// f32 in and out, inputs rounded to TF32 on tensor cores (`precision = "tf32"`).
    Tf32,
    /// bf16 or f16 in and out, accumulated in f32.
    Half(DType),
}

impl Mode {
    /// The mode for operands of `dtype` (`tf32`: the plan asked for TF32 math); `None`
    /// for a dtype cuBLASLt does not take here.
    pub fn of(dtype: DType, tf32: bool) -> Option<Mode> {
        match dtype {
            DType::F32 if tf32 => Some(Mode::Tf32),
            DType::F32 => Some(Mode::F32Strict),
            DType::BF16 | DType::F16 => Some(Mode::Half(dtype)),
            _ => None,
        }
    }

    fn data_type(self) -> sys::cudaDataType {
        match self {
            Mode::Half(DType::BF16) => sys::cudaDataType::CUDA_R_16BF,
            Mode::Half(_) => sys::cudaDataType::CUDA_R_16F,
            _ => sys::cudaDataType::CUDA_R_32F,
        }
    }

    fn compute_type(self) -> sys::cublasComputeType_t {
        match self {
            Mode::Tf32 => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            _ => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Mode::F32Strict => "f32 strict (no TF32)".into(),
            Mode::Tf32 => "f32 with TF32 tensor-core math".into(),
            Mode::Half(d) => format!("{d} with f32 accumulation"),
        }
    }
}

/// What the product's epilogue adds: a bias per output column and an activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Epilogue {
    pub bias: bool,
    pub activation: Activation,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    #[default]
    None,
    Relu,
    /// GELU, tanh approximation (cuBLASLt's only GELU).
    GeluTanh,
}

impl Epilogue {
    fn code(self) -> sys::cublasLtEpilogue_t {
        use sys::cublasLtEpilogue_t as E;
        match (self.bias, self.activation) {
            (false, Activation::None) => E::CUBLASLT_EPILOGUE_DEFAULT,
            (false, Activation::Relu) => E::CUBLASLT_EPILOGUE_RELU,
            (false, Activation::GeluTanh) => E::CUBLASLT_EPILOGUE_GELU,
            (true, Activation::None) => E::CUBLASLT_EPILOGUE_BIAS,
            (true, Activation::Relu) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            (true, Activation::GeluTanh) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        }
    }

    pub fn describe(self) -> String {
        let act = match self.activation {
            Activation::None => "",
            Activation::Relu => "relu",
            Activation::GeluTanh => "gelu(tanh)",
        };
        match (self.bias, act) {
            (false, "") => "none".into(),
            (true, "") => "bias".into(),
            (false, a) => a.into(),
            (true, a) => format!("bias + {a}"),
        }
    }
}

/// A row-major product `C[batch, m, n] = A[batch, m, k] · B[batch, k, n]`, with each
/// operand's batch stride in elements (0: one matrix broadcast over the batch) and whether
/// it is stored transposed (`A` as `[k, m]`, `B` as `[n, k]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub batch: u64,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub stride_a: i64,
    pub stride_b: i64,
    pub trans_a: bool,
    pub trans_b: bool,
}

/// The device pointers and scalars of one call: `d = epilogue(alpha·op(a)·op(b) + beta·c)`
/// (`c` absent: beta 0).
#[derive(Clone, Copy, Debug)]
pub struct Operands {
    pub a: u64,
    pub b: u64,
    pub c: Option<u64>,
    pub d: u64,
    pub bias: Option<u64>,
    pub alpha: f32,
    pub beta: f32,
}

/// The most workspace a plan may ask for (cuBLASLt's recommendation for Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// A product ready to run: descriptor, layouts and the pinned algorithm.
pub struct GemmPlan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    pub workspace_bytes: usize,
    pub mode: Mode,
    pub epilogue: Epilogue,
    /// The algorithm, as cuBLASLt numbers it (id, tile, stages), and the heuristic's waves.
    pub algorithm: String,
}

// SAFETY: descriptors and layouts are plain host objects cuBLASLt reads during calls; the
// plan is used by one executable at a time (through `&mut self`).
unsafe impl Send for GemmPlan {}

impl Drop for GemmPlan {
    fn drop(&mut self) {
        // SAFETY: each object was created once by the matching create call in `new`.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn status(what: &str) -> impl Fn(lt::CublasError) -> String + '_ {
    move |e| format!("{what}: {:?}", e.0)
}

/// A column-major layout of `rows × cols` with leading dimension `ld`, `batch` matrices
/// `stride` elements apart.
fn layout(
    ty: sys::cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
    batch: u64,
    stride: i64,
) -> Result<sys::cublasLtMatrixLayout_t, String> {
    let l = lt::create_matrix_layout(ty, rows, cols, ld).map_err(status("layout"))?;
    if batch > 1 {
        let count = batch as i32;
        // SAFETY: `l` is a live layout; each attribute is read from a value of the type
        // cuBLASLt documents for it (int32 count, int64 stride), of the size given.
        let set = unsafe {
            lt::set_matrix_layout_attribute(
                l,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                (&count as *const i32).cast(),
                size_of::<i32>(),
            )
            .and_then(|()| {
                lt::set_matrix_layout_attribute(
                    l,
                    sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    (&stride as *const i64).cast(),
                    size_of::<i64>(),
                )
            })
        };
        if let Err(e) = set {
            // SAFETY: made above, destroyed once.
            let _ = unsafe { lt::destroy_matrix_layout(l) };
            return Err(format!("batched layout: {:?}", e.0));
        }
    }
    Ok(l)
}

/// Sets one matmul-descriptor attribute from `value`.
///
/// # Safety
/// `T` must be the type cuBLASLt documents for `attr`.
unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), String> {
    // SAFETY: `desc` is live; `value` is a `T` of `size_of::<T>()` bytes (caller's contract).
    unsafe { lt::set_matmul_desc_attribute(desc, attr, (value as *const T).cast(), size_of::<T>()) }
        .map_err(|e| format!("matmul attribute {attr:?}: {:?}", e.0))
}

impl GemmPlan {
    /// Describes the product and asks cuBLASLt's heuristic for its best algorithm within
    /// [`WORKSPACE_BYTES`] (excluding atomics-based split-K when `deterministic`).
    pub fn new(
        handle: &Handle,
        mode: Mode,
        shape: Shape,
        epilogue: Epilogue,
        deterministic: bool,
    ) -> Result<GemmPlan, String> {
        crate::toolkit::guarded("cuBLASLt plan", || {
            Self::make(handle, mode, shape, epilogue, deterministic)
        })
    }

    fn make(
        handle: &Handle,
        mode: Mode,
        s: Shape,
        epilogue: Epilogue,
        deterministic: bool,
    ) -> Result<GemmPlan, String> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        let ty = mode.data_type();
        let desc = lt::create_matmul_desc(mode.compute_type(), sys::cudaDataType::CUDA_R_32F)
            .map_err(status("matmul descriptor"))?;
        // Column-major view: Cᵀ[n, m] = op(B)ᵀ[n, k] · op(A)ᵀ[k, m]. cuBLASLt's first
        // operand is our B, its second our A.
        // cublasOperation_t, an int32: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 (cudarc's cuBLASLt
        // bindings do not carry the enum).
        let op = |t: bool| -> i32 { i32::from(t) };
        let mut plan = GemmPlan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            // SAFETY: a plain C struct of integers; overwritten by the heuristic's choice.
            algo: unsafe { std::mem::zeroed() },
            workspace_bytes: 0,
            mode,
            epilogue,
            algorithm: String::new(),
        };
        // SAFETY: each attribute's value has the type cuBLASLt documents for it.
        unsafe {
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &op(s.trans_b))?;
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &op(s.trans_a))?;
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue.code())?;
            if epilogue.bias {
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ty)?;
            }
        }
        // Stored first operand (our B): n × k column-major is row-major [k, n] (ld n);
        // transposed, row-major [n, k] is k × n column-major (ld k).
        let (b_rows, b_cols, b_ld) =
            if s.trans_b { (s.k, s.n, s.k as i64) } else { (s.n, s.k, s.n as i64) };
        let (a_rows, a_cols, a_ld) =
            if s.trans_a { (s.m, s.k, s.m as i64) } else { (s.k, s.m, s.k as i64) };
        plan.b = layout(ty, b_rows, b_cols, b_ld, s.batch, s.stride_b)?;
        plan.a = layout(ty, a_rows, a_cols, a_ld, s.batch, s.stride_a)?;
        plan.c = layout(ty, s.n, s.m, s.n as i64, s.batch, (s.m * s.n) as i64)?;
        plan.pick_algorithm(handle, deterministic)?;
        Ok(plan)
    }

    fn pick_algorithm(&mut self, handle: &Handle, deterministic: bool) -> Result<(), String> {
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let pref = lt::create_matmul_pref().map_err(status("preference"))?;
        let limit = WORKSPACE_BYTES as u64;
        // Split-K partials reduced in place use atomics: their sums' order varies by run.
        let schemes: u32 = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_MASK as u32
            & !(sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_INPLACE as u32);
        // SAFETY: `pref` is live; each value has the type cuBLASLt documents (u64 bytes,
        // u32 mask); the heuristic writes at most `want` results into `results`.
        let picked = unsafe {
            let mut r = lt::set_matmul_pref_attribute(
                pref,
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&limit as *const u64).cast(),
                size_of::<u64>(),
            );
            if r.is_ok() && deterministic {
                r = lt::set_matmul_pref_attribute(
                    pref,
                    P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                    (&schemes as *const u32).cast(),
                    size_of::<u32>(),
                );
            }
            let picked = r.map_err(status("preference attribute")).and_then(|()| {
                lt::get_matmul_algo_heuristic(
                    handle.0, self.desc, self.b, self.a, self.c, self.c, pref,
                )
                .map_err(|e| match e.0 {
                    sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => {
                        "cuBLASLt has no algorithm for this product".to_string()
                    }
                    other => format!("algorithm heuristic: {other:?}"),
                })
            });
            let _ = lt::destroy_matmul_pref(pref);
            picked?
        };
        self.algo = picked.algo;
        self.workspace_bytes = picked.workspaceSize;
        let config = |attr: sys::cublasLtMatmulAlgoConfigAttributes_t| -> i64 {
            let mut v: u32 = 0;
            let mut written = 0usize;
            // SAFETY: reads one small integer attribute of a live algorithm into `v`.
            let r = unsafe {
                sys::cublasLtMatmulAlgoConfigGetAttribute(
                    &self.algo,
                    attr,
                    (&mut v as *mut u32).cast(),
                    size_of::<u32>(),
                    &mut written,
                )
            };
            if r == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS { v as i64 } else { -1 }
        };
        use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
        self.algorithm = format!(
            "id {} tile {} stages {} splitK {} (heuristic, {:.2} waves, workspace {} bytes)",
            config(A::CUBLASLT_ALGO_CONFIG_ID),
            config(A::CUBLASLT_ALGO_CONFIG_TILE_ID),
            config(A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
            config(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
            picked.wavesCount,
            picked.workspaceSize
        );
        Ok(())
    }

    /// Queues the product on `stream`: `d = epilogue(alpha · op(a) · op(b) + beta · c)`.
    ///
    /// # Safety
    /// `a`, `b`, `d` (and `c`, `bias` where given) are device pointers of this plan's
    /// context holding the shapes the plan was made for, in its dtype; `workspace` holds at
    /// least `self.workspace_bytes`; all stay live until the stream passes the call.
    pub unsafe fn run(
        &self,
        handle: &Handle,
        stream: cudarc::driver::sys::CUstream,
        x: Operands,
        workspace: u64,
    ) -> Result<(), String> {
        if x.bias.is_some() != self.epilogue.bias {
            return Err("a bias pointer exactly when the epilogue adds one".into());
        }
        if let Some(bias) = x.bias {
            // SAFETY: the pointer attribute is a device pointer (u64) into live memory.
            unsafe {
                set_desc(
                    self.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias,
                )?
            };
        }
        // Without a C matrix, D is passed as C and read with beta 0.
        let (c, beta) = match x.c {
            Some(c) => (c, x.beta),
            None => (x.d, 0.0f32),
        };
        let alpha = x.alpha;
        // SAFETY: the caller's contract; alpha and beta are host f32 scalars (the default
        // pointer mode, matching the f32 scale type); C has D's layout.
        unsafe {
            lt::matmul(
                handle.0,
                self.desc,
                (&alpha as *const f32).cast::<c_void>(),
                (&beta as *const f32).cast::<c_void>(),
                x.b as *const c_void,
                self.b,
                x.a as *const c_void,
                self.a,
                c as *const c_void,
                self.c,
                x.d as *mut c_void,
                self.c,
                &self.algo,
                workspace as *mut c_void,
                self.workspace_bytes,
                stream as sys::cudaStream_t,
            )
        }
        .map_err(|e| format!("cublasLtMatmul: {:?}", e.0))
    }
}
