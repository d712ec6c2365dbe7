//! A small safe layer over OpenVINO's C API (`openvino-sys`, linked at run time): the core,
//! models read from ONNX bytes, compiled models, infer requests, host tensors and the
//! per-layer profile. Every call's status becomes a `Result` with OpenVINO's own message.

use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use openvino_sys as sys;
use xpu_ir::{DType, Tensor, TensorData};

pub type Result<T> = std::result::Result<T, String>;

fn check(status: sys::ov_status_e, what: &str) -> Result<()> {
    if status == sys::ov_status_e::OK {
        return Ok(());
    }
    // SAFETY: `ov_get_last_err_msg` takes no arguments and returns null or a fresh
    // NUL-terminated copy of the last message, allocated for the caller (`new[]`, released
    // by `ov_free`): `take_string` copies it and frees it once.
    let msg = unsafe { take_string(sys::ov_get_last_err_msg().cast_mut()) }.trim().to_string();
    Err(if msg.is_empty() { format!("{what}: {status:?}") } else { format!("{what}: {msg}") })
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

/// Takes ownership of a string OpenVINO allocated.
///
/// # Safety
/// `p` is null or a NUL-terminated string OpenVINO allocated for the caller (freed with
/// `ov_free`) that nothing else frees or uses afterwards.
unsafe fn take_string(p: *mut c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller passes a NUL-terminated string allocated by OpenVINO.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    // SAFETY: `p` is non-null (checked above) and OpenVINO allocated it (the caller's
    // contract); its bytes were copied into `s`, and it is freed here once and not read after.
    unsafe { sys::ov_free(p) };
    s
}

/// Loads `libopenvino_c.so` from `path` (the file, or the directory holding it).
pub fn load_library(path: &std::path::Path) -> Result<()> {
    sys::library::load_from(path)
}

pub struct Core(*mut sys::ov_core_t);

// SAFETY: an ov_core_t may be used from any thread; xpu serialises its use behind a mutex.
unsafe impl Send for Core {}

impl Drop for Core {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from a successful `ov_core_create` (`Core::new` is the only
        // constructor), and `drop` runs once, so the core is freed exactly once.
        unsafe { sys::ov_core_free(self.0) }
    }
}

impl Core {
    pub fn new() -> Result<Core> {
        let mut p = ptr::null_mut();
        // SAFETY: `p` is a live local the call writes the new core into; it is wrapped only
        // when the call succeeded.
        check(unsafe { sys::ov_core_create(&mut p) }, "creating the OpenVINO core")?;
        Ok(Core(p))
    }

    pub fn available_devices(&self) -> Result<Vec<String>> {
        let mut list = sys::ov_available_devices_t { devices: ptr::null_mut(), size: 0 };
        // SAFETY: `self.0` is a live core (see `Drop`); `list` is a live local the call fills.
        check(unsafe { sys::ov_core_get_available_devices(self.0, &mut list) }, "listing devices")?;
        let mut out = Vec::with_capacity(list.size);
        for i in 0..list.size {
            // SAFETY: `devices` holds `size` NUL-terminated names until the list is freed.
            let name = unsafe { CStr::from_ptr(*list.devices.add(i)) };
            out.push(name.to_string_lossy().into_owned());
        }
        // SAFETY: `list` was filled by the successful call above and is freed once, after its
        // names were copied into `out`.
        unsafe { sys::ov_available_devices_free(&mut list) };
        Ok(out)
    }

    pub fn set_property(&mut self, device: &str, key: &str, value: &str) -> Result<()> {
        let (d, k, v) = (cstring(device)?, cstring(key)?, cstring(value)?);
        check(
            // SAFETY: `self.0` is a live core; `d`, `k` and `v` are NUL-terminated CStrings that
            // outlive the call, which copies them. The C function is variadic (one key/value
            // pair of `char*` is read); openvino-sys declares it with fixed arguments, which
            // passes them in the same registers on x86-64 and AArch64 Linux. Keys are the
            // string-valued ones this crate sets (never CACHE_ENCRYPTION_CALLBACKS, whose value
            // OpenVINO would read as a struct pointer).
            unsafe { sys::ov_core_set_property(self.0, d.as_ptr(), k.as_ptr(), v.as_ptr()) },
            &format!("setting {device} {key} = {value}"),
        )
    }

    /// Reads an ONNX model from memory.
    pub fn read_onnx(&self, bytes: &[u8]) -> Result<Model> {
        let mut p = ptr::null_mut();
        check(
            // SAFETY: `self.0` is a live core; `bytes` is readable for `bytes.len()` bytes during
            // the call (OpenVINO copies them, and rejects a length of 0); null weights are
            // allowed; `p` is a live local for the new model, wrapped only on success.
            unsafe {
                sys::ov_core_read_model_from_memory_buffer(
                    self.0,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    ptr::null(),
                    &mut p,
                )
            },
            "reading the model",
        )?;
        Ok(Model(p))
    }

    /// Compiles for `device` with the properties set on the core for it.
    pub fn compile(&self, model: &Model, device: &str) -> Result<Compiled> {
        let d = cstring(device)?;
        let mut p = ptr::null_mut();
        check(
            // SAFETY: `self.0` and `model.0` are live (borrowed for the call); `d` is a
            // NUL-terminated CString that outlives it; 0 property arguments means no variadic
            // ones are read; `p` is a live local for the new compiled model, wrapped only on
            // success. The compiled model keeps its own reference to the model.
            unsafe { sys::ov_core_compile_model(self.0, model.0, d.as_ptr(), 0, &mut p) },
            &format!("compiling for {device}"),
        )?;
        Ok(Compiled(p))
    }
}

pub struct Model(*mut sys::ov_model_t);

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from a successful read (`Core::read_onnx` is the only
        // constructor), and `drop` runs once, so the model is freed exactly once.
        unsafe { sys::ov_model_free(self.0) }
    }
}

pub struct Compiled(*mut sys::ov_compiled_model_t);

// SAFETY: compiled models are thread-safe in OpenVINO (requests are created from any thread).
unsafe impl Send for Compiled {}
// SAFETY: the calls made through `&Compiled` (property, inputs/outputs, input_name, request)
// only read the compiled model or create new objects, which ov::CompiledModel allows from
// several threads at once.
unsafe impl Sync for Compiled {}

impl Drop for Compiled {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from a successful `ov_core_compile_model` (`Core::compile` is
        // the only constructor), and `drop` runs once, so it is freed exactly once.
        unsafe { sys::ov_compiled_model_free(self.0) }
    }
}

impl Compiled {
    pub fn property(&self, key: &str) -> Result<String> {
        let k = cstring(key)?;
        let mut v = ptr::null_mut();
        check(
            // SAFETY: `self.0` is a live compiled model; `k` is a NUL-terminated CString that
            // outlives the call; `v` is a live local the call sets to a new string.
            unsafe { sys::ov_compiled_model_get_property(self.0, k.as_ptr(), &mut v) },
            &format!("reading compiled-model property {key}"),
        )?;
        // SAFETY: on success `v` is a NUL-terminated string OpenVINO allocated for us (freed
        // with `ov_free`), and nothing else owns it.
        Ok(unsafe { take_string(v) })
    }

    pub fn inputs(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: `self.0` is a live compiled model; `n` is a live local the call writes.
        check(unsafe { sys::ov_compiled_model_inputs_size(self.0, &mut n) }, "counting inputs")?;
        Ok(n)
    }

    pub fn outputs(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: `self.0` is a live compiled model; `n` is a live local the call writes.
        check(unsafe { sys::ov_compiled_model_outputs_size(self.0, &mut n) }, "counting outputs")?;
        Ok(n)
    }

    /// The name of input `index` (OpenVINO drops model inputs nothing reads).
    pub fn input_name(&self, index: usize) -> Result<String> {
        let mut port = ptr::null_mut();
        check(
            // SAFETY: `self.0` is a live compiled model; an out-of-range `index` is an error
            // status, not UB; `port` is a live local the call sets to a new port.
            unsafe { sys::ov_compiled_model_input_by_index(self.0, index, &mut port) },
            &format!("input {index}"),
        )?;
        let mut name = ptr::null_mut();
        // SAFETY: `port` is the live port the successful call above created; `name` is a live
        // local the call sets to a new string.
        let status = unsafe { sys::ov_port_get_any_name(port, &mut name) };
        // SAFETY: `port` was created above for us, is freed once here and not used after.
        unsafe { sys::ov_output_const_port_free(port) };
        check(status, &format!("the name of input {index}"))?;
        // SAFETY: the status was OK, so `name` is a NUL-terminated string OpenVINO allocated
        // for us (freed with `ov_free`), and nothing else owns it.
        Ok(unsafe { take_string(name) })
    }

    pub fn request(&self) -> Result<Request> {
        let mut p = ptr::null_mut();
        check(
            // SAFETY: `self.0` is a live compiled model; `p` is a live local for the new
            // request, wrapped only on success.
            unsafe { sys::ov_compiled_model_create_infer_request(self.0, &mut p) },
            "creating an infer request",
        )?;
        let target = CancelTarget { request: p, run: 0 };
        Ok(Request(p, Arc::new(Mutex::new(target))))
    }
}

/// An infer request, and what its [`Canceller`]s share with it.
pub struct Request(*mut sys::ov_infer_request_t, Arc<Mutex<CancelTarget>>);

// SAFETY: one request is used by one thread at a time (behind the executable's `&mut`);
// other threads reach it only through a `Canceller`, under the lock the request's `Drop`
// takes before freeing it.
unsafe impl Send for Request {}

impl Drop for Request {
    fn drop(&mut self) {
        // A stop hook may be cancelling in another thread right now (a cancel or a deadline
        // firing as the run ended: dropping the hook's guard does not wait for a call in
        // progress). It holds the lock for its call, so taking the lock waits for it; with
        // the pointer cleared, later calls do nothing.
        lock(&self.1).request = ptr::null_mut();
        // SAFETY: `self.0` came from a successful `ov_compiled_model_create_infer_request`
        // (`Compiled::request` is the only constructor), and `drop` runs once; no canceller
        // can reach it any more (the shared pointer was cleared above, after any call in
        // progress returned).
        unsafe { sys::ov_infer_request_free(self.0) }
    }
}

/// What [`Canceller`]s reach, behind a lock the request takes too: the request while it
/// lives (null once it is freed) and the number of its current `infer` call (bumped when
/// one returns).
struct CancelTarget {
    request: *mut sys::ov_infer_request_t,
    run: u64,
}

// SAFETY: the pointer is only used, from another thread, for `ov_infer_request_cancel`
// (which OpenVINO allows concurrently with `infer`), with the lock around it held: the
// request's `Drop` clears it under that lock before freeing the request.
unsafe impl Send for CancelTarget {}

/// The lock, poisoned or not (nothing done under it can leave it inconsistent).
fn lock(target: &Mutex<CancelTarget>) -> MutexGuard<'_, CancelTarget> {
    target.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Cancels a running request from another thread (the stop token's hook): the `infer` call
/// that was next when it was made, and only while that call runs and the request lives.
#[derive(Clone)]
pub struct Canceller {
    target: Arc<Mutex<CancelTarget>>,
    run: u64,
}

impl Canceller {
    pub fn cancel(&self) {
        let target = lock(&self.target);
        // Freed, or its run over (a late hook must not cancel the next run): nothing to do.
        if target.request.is_null() || target.run != self.run {
            return;
        }
        // SAFETY: the pointer is non-null, so the request is not freed: its `Drop` clears the
        // pointer under this lock, which is held until the call returns. OpenVINO allows
        // `cancel` from another thread, concurrently with `infer`.
        unsafe { sys::ov_infer_request_cancel(target.request) };
    }
}

/// One layer of OpenVINO's per-layer profile (PERF_COUNT).
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub name: String,
    pub layer_type: String,
    /// What ran it: the primitive and its runtime precision (`jit_avx512_FP32`).
    pub exec_type: String,
    pub executed: bool,
    pub real_us: i64,
}

impl Request {
    /// A canceller of the next (or running) `infer` call.
    pub fn canceller(&self) -> Canceller {
        Canceller { target: self.1.clone(), run: lock(&self.1).run }
    }

    /// Binds input `index` to `t`'s memory (no copy). The tensor must outlive the next
    /// `infer`: the caller keeps it borrowed until then.
    pub fn set_input(&mut self, index: usize, t: &Tensor) -> Result<HostTensor> {
        let host = HostTensor::borrow(t)?;
        check(
            // SAFETY: `self.0` is a live request and `host.0` a live tensor just created; the
            // request keeps its own reference to the tensor (not to `host`); the memory it
            // wraps is `t`'s, which the callers keep borrowed until `infer` is done.
            unsafe { sys::ov_infer_request_set_input_tensor_by_index(self.0, index, host.0) },
            &format!("binding input {index}"),
        )?;
        Ok(host)
    }

    pub fn infer(&mut self) -> Result<()> {
        // SAFETY: `self.0` is a live request used by this thread alone (`&mut self`); the input
        // memory bound by `set_input` is still borrowed by the callers (lib.rs keeps the
        // inputs and the returned `HostTensor`s until the outputs are read).
        let status = unsafe { sys::ov_infer_request_infer(self.0) };
        // The run is over: its cancellers do nothing from now on (one cancelling now
        // finishes first, on a request no longer running).
        lock(&self.1).run += 1;
        check(status, "inference")
    }

    pub fn output(&self, index: usize) -> Result<Tensor> {
        let mut p = ptr::null_mut();
        check(
            // SAFETY: `self.0` is a live request; an out-of-range `index` is an error status;
            // `p` is a live local for a new tensor handle, wrapped (and so freed) only on success.
            unsafe { sys::ov_infer_request_get_output_tensor_by_index(self.0, index, &mut p) },
            &format!("reading output {index}"),
        )?;
        let t = HostTensor(p);
        t.to_xpu()
    }

    pub fn profile(&self) -> Result<Vec<Layer>> {
        let mut list = sys::ov_profiling_info_list_t { profiling_infos: ptr::null_mut(), size: 0 };
        check(
            // SAFETY: `self.0` is a live request; `list` is a live local the call fills.
            unsafe { sys::ov_infer_request_get_profiling_info(self.0, &mut list) },
            "reading the per-layer profile",
        )?;
        let s = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: `p` is a non-null field of a `list` entry: a NUL-terminated string
                // OpenVINO owns until the list is freed below, after the last call of `s`.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let mut out = Vec::with_capacity(list.size);
        for i in 0..list.size {
            // SAFETY: `profiling_infos` holds `size` entries until the list is freed.
            let info = unsafe { &*list.profiling_infos.add(i) };
            out.push(Layer {
                name: s(info.node_name),
                layer_type: s(info.node_type),
                exec_type: s(info.exec_type),
                executed: info.status == sys::ov_profiling_info_t_Status::EXECUTED,
                real_us: info.real_time,
            });
        }
        // SAFETY: `list` was filled by the successful call above and is freed once, after all
        // its strings were copied into `out`.
        unsafe { sys::ov_profiling_info_list_free(&mut list) };
        Ok(out)
    }
}

/// An OpenVINO tensor handle (over xpu's memory for inputs, OpenVINO's for outputs).
pub struct HostTensor(*mut sys::ov_tensor_t);

impl Drop for HostTensor {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from a successful create or get-output call (the only places
        // a `HostTensor` is made), and `drop` runs once; freeing the handle leaves the memory
        // it wraps alone.
        unsafe { sys::ov_tensor_free(self.0) }
    }
}

fn element_type(d: DType) -> Option<sys::ov_element_type_e> {
    use sys::ov_element_type_e as E;
    Some(match d {
        DType::F32 => E::F32,
        DType::F64 => E::F64,
        DType::F16 => E::F16,
        DType::BF16 => E::BF16,
        DType::I8 => E::I8,
        DType::I16 => E::I16,
        DType::I32 => E::I32,
        DType::I64 => E::I64,
        DType::U8 => E::U8,
        DType::U16 => E::U16,
        DType::U32 => E::U32,
        DType::U64 => E::U64,
        DType::Bool => E::OV_BOOLEAN,
        // Low precision: not handed to OpenVINO yet (it has f8 types; untested here).
        _ => return None,
    })
}

/// The xpu element types OpenVINO tensors can carry here.
pub fn dtypes() -> Vec<DType> {
    DType::ALL.iter().copied().filter(|&d| element_type(d).is_some()).collect()
}

impl HostTensor {
    fn borrow(t: &Tensor) -> Result<HostTensor> {
        let ty = element_type(t.dtype())
            .ok_or_else(|| format!("{} tensors cannot cross into OpenVINO", t.dtype()))?;
        let mut dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        // A scalar: OpenVINO's shape_create refuses rank 0, so the shape is built here.
        let scalar = dims.is_empty();
        let mut shape = sys::ov_shape_t { rank: 0, dims: dims.as_mut_ptr() };
        if !scalar {
            check(
                // SAFETY: `dims` holds `dims.len()` readable i64s for the call, which copies
                // them into a new array it stores in `shape`, a live local.
                unsafe { sys::ov_shape_create(dims.len() as i64, dims.as_ptr(), &mut shape) },
                "shape",
            )?;
        }
        // OpenVINO wants a non-null pointer even for an empty tensor.
        let mut dummy = [0u8; 8];
        // The elements where they lie (lent ones too); strings and tables through their
        // vectors.
        let data: *mut c_void = match (t.numel(), t.element_bytes()) {
            (0, _) => dummy.as_mut_ptr().cast(),
            (_, Some(bytes)) => bytes.as_ptr() as *mut c_void,
            (_, None) => xpu_ir::with_data!(t.data(), v => v.as_ptr() as *mut c_void),
        };
        let mut p = ptr::null_mut();
        // SAFETY: `shape` holds `rank` readable dims (OpenVINO's array, or none for a scalar)
        // and is copied; `data` is non-null and points at `t`'s elements of type `ty` (the
        // count the shape implies), which the tensor wraps without copying and only reads:
        // the caller keeps `t` borrowed while it is bound (see `Request::set_input`). For an
        // empty tensor `data` is `dummy`, which no one reads (0 elements); `p` is a live local.
        let status = unsafe { sys::ov_tensor_create_from_host_ptr(ty, shape, data, &mut p) };
        if !scalar {
            // SAFETY: `shape.dims` is the array `ov_shape_create` allocated above (not `dims`'s
            // buffer), freed once here.
            unsafe { sys::ov_shape_free(&mut shape) };
        }
        check(status, "wrapping an input tensor")?;
        Ok(HostTensor(p))
    }

    fn to_xpu(&self) -> Result<Tensor> {
        use sys::ov_element_type_e as E;
        let mut n = 0usize;
        // SAFETY: `self.0` is a live tensor; `n` is a live local the call writes.
        check(unsafe { sys::ov_tensor_get_size(self.0, &mut n) }, "output size")?;
        let mut shape = sys::ov_shape_t { rank: 0, dims: ptr::null_mut() };
        // SAFETY: `self.0` is a live tensor; `shape` is a live local (rank 0, null dims, as the
        // call leaves it when it cannot build a rank-0 shape) that it fills.
        let dims: Vec<usize> = match unsafe { sys::ov_tensor_get_shape(self.0, &mut shape) } {
            sys::ov_status_e::OK => {
                // SAFETY: `dims` holds `rank` entries until the shape is freed.
                let d = (0..shape.rank as usize)
                    .map(|i| unsafe { *shape.dims.add(i) }.max(0) as usize)
                    .collect();
                // SAFETY: `shape` came from the successful call above (its dims were copied
                // into `d`); freed once here, and a null `dims` is allowed.
                unsafe { sys::ov_shape_free(&mut shape) };
                d
            }
            // The C API cannot make a rank-0 shape: a scalar output fails here.
            _ if n == 1 => Vec::new(),
            status => return check(status, "output shape").map(|_| unreachable!()),
        };
        let mut ty = E::DYNAMIC;
        // SAFETY: `self.0` is a live tensor; `ty` is a live local the call writes.
        check(unsafe { sys::ov_tensor_get_element_type(self.0, &mut ty) }, "output type")?;
        let mut data: *mut c_void = ptr::null_mut();
        if n > 0 {
            // SAFETY: `self.0` is a live tensor; `data` is a live local the call writes.
            check(unsafe { sys::ov_tensor_data(self.0, &mut data) }, "output data")?;
        }
        macro_rules! copy {
            ($t:ty, $variant:ident) => {{
                let v: Vec<$t> = if n == 0 {
                    Vec::new()
                } else {
                    // SAFETY: OpenVINO's buffer holds `n` elements of the reported type.
                    unsafe { std::slice::from_raw_parts(data as *const $t, n) }.to_vec()
                };
                TensorData::$variant(v)
            }};
        }
        let d = match ty {
            E::F32 => copy!(f32, F32),
            E::F64 => copy!(f64, F64),
            E::F16 => copy!(half::f16, F16),
            E::BF16 => copy!(half::bf16, BF16),
            E::I8 => copy!(i8, I8),
            E::I16 => copy!(i16, I16),
            E::I32 => copy!(i32, I32),
            E::I64 => copy!(i64, I64),
            E::U8 => copy!(u8, U8),
            E::U16 => copy!(u16, U16),
            E::U32 => copy!(u32, U32),
            E::U64 => copy!(u64, U64),
            E::OV_BOOLEAN => {
                let v: Vec<bool> = if n == 0 {
                    Vec::new()
                } else {
                    // Read as bytes: OpenVINO's booleans are one byte, 0 or 1.
                    // SAFETY: OpenVINO's buffer (non-null, `n` > 0) holds `n` one-byte booleans
                    // while `self` lives; any byte is a valid u8 and u8 needs no alignment.
                    unsafe { std::slice::from_raw_parts(data as *const u8, n) }
                        .iter()
                        .map(|&b| b != 0)
                        .collect()
                };
                TensorData::Bool(v)
            }
            other => return Err(format!("output element type {other:?} has no xpu dtype")),
        };
        Tensor::new(dims, d).map_err(|e| e.to_string())
    }
}
