//! xpu tensors ↔ ORT values. Inputs are borrowed views (no copy) except strings, which
//! ORT stores in its own allocator; outputs are copied out into xpu tensors.

use ort::session::SessionInputValue;
use ort::value::{DynValue, Tensor as OrtTensor, TensorElementType, TensorRef, ValueType};
use xpu_ir::{BorrowedTensor, DType, Tensor, TensorData};

fn shape_of(dims: &[usize]) -> Vec<i64> {
    dims.iter().map(|&d| d as i64).collect()
}

/// The one dispatch over a tensor's data that views and copies share: `$make!(elements)`
/// for each element type (`$shape` in scope), strings copied into ORT's own allocator, a
/// table refused.
macro_rules! per_element_type {
    ($t:expr, $shape:ident, $make:ident) => {
        match $t.data() {
            TensorData::F32(v) => $make!(v),
            TensorData::F64(v) => $make!(v),
            TensorData::F16(v) => $make!(v),
            TensorData::BF16(v) => $make!(v),
            TensorData::I8(v) => $make!(v),
            TensorData::I16(v) => $make!(v),
            TensorData::I32(v) => $make!(v),
            TensorData::I64(v) => $make!(v),
            TensorData::U8(v) => $make!(v),
            TensorData::U16(v) => $make!(v),
            TensorData::U32(v) => $make!(v),
            TensorData::U64(v) => $make!(v),
            TensorData::Bool(v) => $make!(v),
            TensorData::String(v) => OrtTensor::from_string_array(($shape, &v[..]))
                .map(Into::into)
                .map_err(|e| e.to_string()),
            TensorData::Table(_) => Err("a table is not a tensor ONNX Runtime can take".into()),
            TensorData::Lowp(l, _) => {
                Err(format!("the ort engine does not hand {} values to ONNX Runtime", l.dtype()))
            }
        }
    };
}

/// A view of `t` ORT can read (lent elements where they lie, too).
pub fn input_value(t: &Tensor) -> Result<SessionInputValue<'_>, String> {
    if t.is_lent()
        && let Some(bytes) = t.element_bytes()
        && let Some(view) =
            borrowed_value(&BorrowedTensor { dtype: t.dtype(), shape: t.shape(), bytes })
    {
        return view;
    }
    let shape = shape_of(t.shape());
    macro_rules! view {
        ($v:expr) => {
            TensorRef::from_array_view((shape, &$v[..])).map(Into::into).map_err(|e| e.to_string())
        };
    }
    per_element_type!(t, shape, view)
}

/// A view of `b`'s elements where they lie, when they can be viewed as its dtype (see
/// [`BorrowedTensor::elements`]); `None` for bool and string elements and misaligned
/// bytes, which the caller copies into a tensor.
pub fn borrowed_value<'a>(b: &BorrowedTensor<'a>) -> Option<Result<SessionInputValue<'a>, String>> {
    let shape = shape_of(b.shape);
    macro_rules! view {
        ($t:ty) => {
            b.elements::<$t>().map(|v| {
                TensorRef::from_array_view((shape, v)).map(Into::into).map_err(|e| e.to_string())
            })
        };
    }
    match b.dtype {
        DType::F32 => view!(f32),
        DType::F64 => view!(f64),
        DType::F16 => view!(half::f16),
        DType::BF16 => view!(half::bf16),
        DType::I8 => view!(i8),
        DType::I16 => view!(i16),
        DType::I32 => view!(i32),
        DType::I64 => view!(i64),
        DType::U8 => view!(u8),
        DType::U16 => view!(u16),
        DType::U32 => view!(u32),
        DType::U64 => view!(u64),
        _ => None,
    }
}

/// An input ORT can take: a tensor, or one borrowed from a worker's shared memory.
pub trait OrtInput {
    fn dtype_and_shape(&self) -> (DType, &[usize]);
    /// What ORT reads: a view where it can, else an owned copy.
    fn value(&self) -> Result<SessionInputValue<'_>, String>;
}

impl OrtInput for Tensor {
    fn dtype_and_shape(&self) -> (DType, &[usize]) {
        (self.dtype(), self.shape())
    }
    fn value(&self) -> Result<SessionInputValue<'_>, String> {
        input_value(self)
    }
}

impl OrtInput for BorrowedTensor<'_> {
    fn dtype_and_shape(&self) -> (DType, &[usize]) {
        (self.dtype, self.shape)
    }
    fn value(&self) -> Result<SessionInputValue<'_>, String> {
        borrowed_value(self).unwrap_or_else(|| owned_value(&self.to_tensor()?))
    }
}

/// A value ORT owns, copied from `t` (for borrowed elements no view can take).
fn owned_value(t: &Tensor) -> Result<SessionInputValue<'static>, String> {
    let shape = shape_of(t.shape());
    macro_rules! owned {
        ($v:expr) => {
            OrtTensor::from_array((shape, $v.to_vec())).map(Into::into).map_err(|e| e.to_string())
        };
    }
    per_element_type!(t, shape, owned)
}

/// Copies an ORT output into an xpu tensor.
pub fn output_tensor(v: &DynValue) -> Result<Tensor, String> {
    let ValueType::Tensor { ty, shape, .. } = v.dtype() else {
        return Err(format!("output is a {}, not a tensor", v.dtype()));
    };
    let ty = *ty;
    let shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    macro_rules! copy {
        ($t:ty, $variant:ident) => {{
            let (_, data) = v.try_extract_tensor::<$t>().map_err(|e| e.to_string())?;
            TensorData::$variant(data.to_vec())
        }};
    }
    let data = match ty {
        TensorElementType::Float32 => copy!(f32, F32),
        TensorElementType::Float64 => copy!(f64, F64),
        TensorElementType::Float16 => copy!(half::f16, F16),
        TensorElementType::Bfloat16 => copy!(half::bf16, BF16),
        TensorElementType::Int8 => copy!(i8, I8),
        TensorElementType::Int16 => copy!(i16, I16),
        TensorElementType::Int32 => copy!(i32, I32),
        TensorElementType::Int64 => copy!(i64, I64),
        TensorElementType::Uint8 => copy!(u8, U8),
        TensorElementType::Uint16 => copy!(u16, U16),
        TensorElementType::Uint32 => copy!(u32, U32),
        TensorElementType::Uint64 => copy!(u64, U64),
        TensorElementType::Bool => copy!(bool, Bool),
        TensorElementType::String => {
            let (_, s) = v.try_extract_strings().map_err(|e| e.to_string())?;
            TensorData::String(s)
        }
        other => return Err(format!("output element type {other} has no xpu dtype")),
    };
    Tensor::new(shape, data).map_err(|e| e.to_string())
}
