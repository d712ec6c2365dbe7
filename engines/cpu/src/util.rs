//! Conversions between tensors and ndarray arrays, and small shared helpers.

use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, IxDyn};
use xpu_ir::{DType, Element, Tensor, TensorData};

pub type KResult<T> = Result<T, String>;

pub fn view<T: Element>(t: &Tensor) -> KResult<ArrayViewD<'_, T>> {
    let s = t
        .as_slice::<T>()
        .ok_or_else(|| format!("expected {} data, got {}", T::DTYPE, t.dtype()))?;
    ArrayViewD::from_shape(IxDyn(t.shape()), s).map_err(|e| e.to_string())
}

pub fn owned<T: Element>(t: &Tensor) -> KResult<ArrayD<T>> {
    Ok(view::<T>(t)?.to_owned())
}

pub fn tensor<T: Element>(a: ArrayD<T>) -> Tensor {
    let shape = a.shape().to_vec();
    let v = if a.is_standard_layout() {
        a.into_raw_vec_and_offset().0
    } else {
        a.iter().cloned().collect()
    };
    Tensor::from_vec(shape, v).expect("array shape matches data")
}

/// Largest tensor a kernel will allocate (elements); shapes come from untrusted inputs, and
/// an allocation failure would abort the process instead of reporting an error.
pub const MAX_ELEMENTS: usize = 1 << 32;

/// Element count of `shape`, or an error when it overflows or exceeds [`MAX_ELEMENTS`].
pub fn checked_numel(shape: &[usize]) -> KResult<usize> {
    match shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
        Some(n) if n <= MAX_ELEMENTS => Ok(n),
        _ => Err(format!(
            "a tensor of shape {shape:?} is too large to allocate (limit {MAX_ELEMENTS} elements)"
        )),
    }
}

/// An uninitialised buffer of `n` elements. Large buffers are advised to use transparent
/// huge pages (as numpy does), which removes most first-touch page faults: on a 36 MB
/// matmul output that is ~9,000 faults, several percent of the product's time.
pub fn alloc_uninit<T>(n: usize) -> Vec<std::mem::MaybeUninit<T>> {
    let mut v: Vec<std::mem::MaybeUninit<T>> = Vec::with_capacity(n);
    // SAFETY: MaybeUninit<T> needs no initialisation.
    unsafe { v.set_len(n) };
    xpu_ir::memory::advise_huge_pages(v.as_ptr().cast(), n * std::mem::size_of::<T>());
    v
}

/// Makes `v` exactly `n` elements long for a kernel that overwrites every element. A buffer
/// with room (one taken from an executable's pool) keeps its memory and is zero-filled only
/// where it grows; otherwise a zeroed allocation is made (fresh pages from the OS, no
/// fill, for large sizes) and advised to use huge pages.
pub fn resize_for_overwrite<T: crate::scalar::Scalar>(v: &mut Vec<T>, n: usize) {
    if v.capacity() < n {
        *v = vec![T::zero(); n];
        xpu_ir::memory::advise_huge_pages(v.as_ptr().cast(), n * std::mem::size_of::<T>());
    } else {
        v.resize(n, T::zero());
    }
}

pub fn ints(t: &Tensor, what: &str) -> KResult<Vec<i64>> {
    t.to_i64_vec().ok_or_else(|| format!("{what} must be an integer tensor, got {}", t.dtype()))
}

pub fn norm_axis(axis: i64, rank: usize) -> KResult<usize> {
    xpu_ir::infer::normalize_axis(axis, rank)
        .ok_or_else(|| format!("axis {axis} is out of range for rank {rank}"))
}

pub fn req<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> KResult<&'a Tensor> {
    inputs.get(i).copied().flatten().ok_or_else(|| format!("input {i} is required"))
}

pub fn opt<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Option<&'a Tensor> {
    inputs.get(i).copied().flatten()
}

/// Upcasts f16/bf16 to f32 (compute by conversion); other dtypes pass through.
pub fn widen(t: &Tensor) -> Tensor {
    match t.data() {
        TensorData::F16(v) => {
            Tensor::from_vec(t.shape().to_vec(), v.iter().map(|x| x.to_f32()).collect()).unwrap()
        }
        TensorData::BF16(v) => {
            Tensor::from_vec(t.shape().to_vec(), v.iter().map(|x| x.to_f32()).collect()).unwrap()
        }
        _ => t.clone(),
    }
}

/// Narrows an f32 result back to f16/bf16 when the op's dtype was half precision.
pub fn narrow(t: Tensor, to: DType) -> Tensor {
    match (to, t.data()) {
        (DType::F16, TensorData::F32(v)) => {
            Tensor::from_vec(t.shape().to_vec(), v.iter().map(|&x| f16::from_f32(x)).collect())
                .unwrap()
        }
        (DType::BF16, TensorData::F32(v)) => {
            Tensor::from_vec(t.shape().to_vec(), v.iter().map(|&x| bf16::from_f32(x)).collect())
                .unwrap()
        }
        _ => t,
    }
}

pub fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Runs `$body` with `$T` bound to the Rust type of a numeric dtype (f16/bf16 excluded).
#[macro_export]
macro_rules! numeric {
    ($dtype:expr, $T:ident => $body:expr, $else:expr) => {
        match $dtype {
            xpu_ir::DType::F32 => {
                type $T = f32;
                $body
            }
            xpu_ir::DType::F64 => {
                type $T = f64;
                $body
            }
            xpu_ir::DType::I8 => {
                type $T = i8;
                $body
            }
            xpu_ir::DType::I16 => {
                type $T = i16;
                $body
            }
            xpu_ir::DType::I32 => {
                type $T = i32;
                $body
            }
            xpu_ir::DType::I64 => {
                type $T = i64;
                $body
            }
            xpu_ir::DType::U8 => {
                type $T = u8;
                $body
            }
            xpu_ir::DType::U16 => {
                type $T = u16;
                $body
            }
            xpu_ir::DType::U32 => {
                type $T = u32;
                $body
            }
            xpu_ir::DType::U64 => {
                type $T = u64;
                $body
            }
            _ => $else,
        }
    };
}

/// Like [`numeric!`] but over every dtype, for ops that only move data.
#[macro_export]
macro_rules! any_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            xpu_ir::DType::F32 => {
                type $T = f32;
                $body
            }
            xpu_ir::DType::F64 => {
                type $T = f64;
                $body
            }
            xpu_ir::DType::F16 => {
                type $T = half::f16;
                $body
            }
            xpu_ir::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            xpu_ir::DType::I8 => {
                type $T = i8;
                $body
            }
            xpu_ir::DType::I16 => {
                type $T = i16;
                $body
            }
            xpu_ir::DType::I32 => {
                type $T = i32;
                $body
            }
            xpu_ir::DType::I64 => {
                type $T = i64;
                $body
            }
            xpu_ir::DType::U8 => {
                type $T = u8;
                $body
            }
            xpu_ir::DType::U16 => {
                type $T = u16;
                $body
            }
            xpu_ir::DType::U32 => {
                type $T = u32;
                $body
            }
            xpu_ir::DType::U64 => {
                type $T = u64;
                $body
            }
            xpu_ir::DType::Bool => {
                type $T = bool;
                $body
            }
            xpu_ir::DType::String => {
                type $T = String;
                $body
            }
            // Never reached: inference keeps tables out of tensor ops, and the planner sends
            // table ops to the table engine. Moving a table value is still well defined.
            xpu_ir::DType::Table => {
                type $T = xpu_ir::Table;
                $body
            }
            // Inference lets low-precision values only into casts and reshapes, which do
            // not come here.
            d => return Err(format!("{d} values are only cast or reshaped").into()),
        }
    };
}

/// Float dtypes computed natively (f16/bf16 are widened first).
#[macro_export]
macro_rules! float {
    ($dtype:expr, $T:ident => $body:expr, $else:expr) => {
        match $dtype {
            xpu_ir::DType::F32 => {
                type $T = f32;
                $body
            }
            xpu_ir::DType::F64 => {
                type $T = f64;
                $body
            }
            _ => $else,
        }
    };
}

/// `s` as `&[f32]` when `T` is f32.
pub(crate) fn as_f32<T: 'static>(s: &[T]) -> Option<&[f32]> {
    // SAFETY: T is f32 (checked), so the slice's layout is exactly `[f32]`.
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr() as *const f32, s.len()) })
}

/// `s` as `&mut [f32]` when `T` is f32.
pub(crate) fn as_f32_mut<T: 'static>(s: &mut [T]) -> Option<&mut [f32]> {
    // SAFETY: as in `as_f32`; the borrow is the caller's, exclusive.
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut f32, s.len()) })
}
