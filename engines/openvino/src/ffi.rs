//! A small safe layer over OpenVINO's C API (`openvino-sys`, linked at run time): the core,
//! models read from ONNX bytes, compiled models, infer requests, host tensors and the
//! per-layer profile. Every call's status becomes a `Result` with OpenVINO's own message.

use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr;

use openvino_sys as sys;
use xpu_ir::{DType, Tensor, TensorData};

pub type Result<T> = std::result::Result<T, String>;

fn check(status: sys::ov_status_e, what: &str) -> Result<()> {
    if status == sys::ov_status_e::OK {
        return Ok(());
    }
    // SAFETY: OpenVINO returns a static or thread-local NUL-terminated message (or null).
    let msg = unsafe {
        let m = sys::ov_get_last_err_msg();
        if m.is_null() {
            String::new()
        } else {
            CStr::from_ptr(m).to_string_lossy().trim().to_string()
        }
    };
    Err(if msg.is_empty() { format!("{what}: {status:?}") } else { format!("{what}: {msg}") })
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

/// Takes ownership of a string OpenVINO allocated.
unsafe fn take_string(p: *mut c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller passes a NUL-terminated string allocated by OpenVINO.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
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
        unsafe { sys::ov_core_free(self.0) }
    }
}

impl Core {
    pub fn new() -> Result<Core> {
        let mut p = ptr::null_mut();
        check(unsafe { sys::ov_core_create(&mut p) }, "creating the OpenVINO core")?;
        Ok(Core(p))
    }

    pub fn available_devices(&self) -> Result<Vec<String>> {
        let mut list = sys::ov_available_devices_t { devices: ptr::null_mut(), size: 0 };
        check(unsafe { sys::ov_core_get_available_devices(self.0, &mut list) }, "listing devices")?;
        let mut out = Vec::with_capacity(list.size);
        for i in 0..list.size {
            // SAFETY: `devices` holds `size` NUL-terminated names until the list is freed.
            let name = unsafe { CStr::from_ptr(*list.devices.add(i)) };
            out.push(name.to_string_lossy().into_owned());
        }
        unsafe { sys::ov_available_devices_free(&mut list) };
        Ok(out)
    }

    pub fn set_property(&mut self, device: &str, key: &str, value: &str) -> Result<()> {
        let (d, k, v) = (cstring(device)?, cstring(key)?, cstring(value)?);
        check(
            unsafe { sys::ov_core_set_property(self.0, d.as_ptr(), k.as_ptr(), v.as_ptr()) },
            &format!("setting {device} {key} = {value}"),
        )
    }

    /// Reads an ONNX model from memory.
    pub fn read_onnx(&self, bytes: &[u8]) -> Result<Model> {
        let mut p = ptr::null_mut();
        check(
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
            unsafe { sys::ov_core_compile_model(self.0, model.0, d.as_ptr(), 0, &mut p) },
            &format!("compiling for {device}"),
        )?;
        Ok(Compiled(p))
    }
}

pub struct Model(*mut sys::ov_model_t);

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { sys::ov_model_free(self.0) }
    }
}

pub struct Compiled(*mut sys::ov_compiled_model_t);

// SAFETY: compiled models are thread-safe in OpenVINO (requests are created from any thread).
unsafe impl Send for Compiled {}
unsafe impl Sync for Compiled {}

impl Drop for Compiled {
    fn drop(&mut self) {
        unsafe { sys::ov_compiled_model_free(self.0) }
    }
}

impl Compiled {
    pub fn property(&self, key: &str) -> Result<String> {
        let k = cstring(key)?;
        let mut v = ptr::null_mut();
        check(
            unsafe { sys::ov_compiled_model_get_property(self.0, k.as_ptr(), &mut v) },
            &format!("reading compiled-model property {key}"),
        )?;
        Ok(unsafe { take_string(v) })
    }

    pub fn inputs(&self) -> Result<usize> {
        let mut n = 0;
        check(unsafe { sys::ov_compiled_model_inputs_size(self.0, &mut n) }, "counting inputs")?;
        Ok(n)
    }

    pub fn outputs(&self) -> Result<usize> {
        let mut n = 0;
        check(unsafe { sys::ov_compiled_model_outputs_size(self.0, &mut n) }, "counting outputs")?;
        Ok(n)
    }

    /// The name of input `index` (OpenVINO drops model inputs nothing reads).
    pub fn input_name(&self, index: usize) -> Result<String> {
        let mut port = ptr::null_mut();
        check(
            unsafe { sys::ov_compiled_model_input_by_index(self.0, index, &mut port) },
            &format!("input {index}"),
        )?;
        let mut name = ptr::null_mut();
        let status = unsafe { sys::ov_port_get_any_name(port, &mut name) };
        unsafe { sys::ov_output_const_port_free(port) };
        check(status, &format!("the name of input {index}"))?;
        Ok(unsafe { take_string(name) })
    }

    pub fn request(&self) -> Result<Request> {
        let mut p = ptr::null_mut();
        check(
            unsafe { sys::ov_compiled_model_create_infer_request(self.0, &mut p) },
            "creating an infer request",
        )?;
        Ok(Request(p))
    }
}

pub struct Request(*mut sys::ov_infer_request_t);

// SAFETY: one request is used by one thread at a time (behind the executable's `&mut`);
// `cancel` is the one call OpenVINO allows from another thread.
unsafe impl Send for Request {}

impl Drop for Request {
    fn drop(&mut self) {
        unsafe { sys::ov_infer_request_free(self.0) }
    }
}

/// Cancels a running request from another thread (the stop token's hook).
#[derive(Clone, Copy)]
pub struct Canceller(*mut sys::ov_infer_request_t);

// SAFETY: ov_infer_request_cancel is thread-safe; the hook holding this is dropped before
// the request is (the run that registers it outlives it).
unsafe impl Send for Canceller {}
unsafe impl Sync for Canceller {}

impl Canceller {
    pub fn cancel(self) {
        unsafe { sys::ov_infer_request_cancel(self.0) };
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
    pub fn canceller(&self) -> Canceller {
        Canceller(self.0)
    }

    /// Binds input `index` to `t`'s memory (no copy). The tensor must outlive the next
    /// `infer`: the caller keeps it borrowed until then.
    pub fn set_input(&mut self, index: usize, t: &Tensor) -> Result<HostTensor> {
        let host = HostTensor::borrow(t)?;
        check(
            unsafe { sys::ov_infer_request_set_input_tensor_by_index(self.0, index, host.0) },
            &format!("binding input {index}"),
        )?;
        Ok(host)
    }

    pub fn infer(&mut self) -> Result<()> {
        check(unsafe { sys::ov_infer_request_infer(self.0) }, "inference")
    }

    pub fn output(&self, index: usize) -> Result<Tensor> {
        let mut p = ptr::null_mut();
        check(
            unsafe { sys::ov_infer_request_get_output_tensor_by_index(self.0, index, &mut p) },
            &format!("reading output {index}"),
        )?;
        let t = HostTensor(p);
        t.to_xpu()
    }

    pub fn profile(&self) -> Result<Vec<Layer>> {
        let mut list = sys::ov_profiling_info_list_t { profiling_infos: ptr::null_mut(), size: 0 };
        check(
            unsafe { sys::ov_infer_request_get_profiling_info(self.0, &mut list) },
            "reading the per-layer profile",
        )?;
        let s = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
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
        unsafe { sys::ov_profiling_info_list_free(&mut list) };
        Ok(out)
    }
}

/// An OpenVINO tensor handle (over xpu's memory for inputs, OpenVINO's for outputs).
pub struct HostTensor(*mut sys::ov_tensor_t);

impl Drop for HostTensor {
    fn drop(&mut self) {
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
        DType::String | DType::Table => return None,
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
                unsafe { sys::ov_shape_create(dims.len() as i64, dims.as_ptr(), &mut shape) },
                "shape",
            )?;
        }
        // OpenVINO wants a non-null pointer even for an empty tensor.
        let mut dummy = [0u8; 8];
        let data: *mut c_void = match t.data() {
            d if d.is_empty() => dummy.as_mut_ptr().cast(),
            d => xpu_ir::with_data!(d, v => v.as_ptr() as *mut c_void),
        };
        let mut p = ptr::null_mut();
        let status = unsafe { sys::ov_tensor_create_from_host_ptr(ty, shape, data, &mut p) };
        if !scalar {
            unsafe { sys::ov_shape_free(&mut shape) };
        }
        check(status, "wrapping an input tensor")?;
        Ok(HostTensor(p))
    }

    fn to_xpu(&self) -> Result<Tensor> {
        use sys::ov_element_type_e as E;
        let mut n = 0usize;
        check(unsafe { sys::ov_tensor_get_size(self.0, &mut n) }, "output size")?;
        let mut shape = sys::ov_shape_t { rank: 0, dims: ptr::null_mut() };
        let dims: Vec<usize> = match unsafe { sys::ov_tensor_get_shape(self.0, &mut shape) } {
            sys::ov_status_e::OK => {
                // SAFETY: `dims` holds `rank` entries until the shape is freed.
                let d = (0..shape.rank as usize)
                    .map(|i| unsafe { *shape.dims.add(i) }.max(0) as usize)
                    .collect();
                unsafe { sys::ov_shape_free(&mut shape) };
                d
            }
            // The C API cannot make a rank-0 shape: a scalar output fails here.
            _ if n == 1 => Vec::new(),
            status => return check(status, "output shape").map(|_| unreachable!()),
        };
        let mut ty = E::DYNAMIC;
        check(unsafe { sys::ov_tensor_get_element_type(self.0, &mut ty) }, "output type")?;
        let mut data: *mut c_void = ptr::null_mut();
        if n > 0 {
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
