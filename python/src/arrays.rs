//! Numpy arrays in and out. An input of a plain numeric dtype in native byte order that is
//! C-contiguous and aligned is lent to the run — read where it lies, no copy — when its
//! memory cannot change during the run: it is read-only (numpy's `writeable` flag off) and
//! so is every array it views, down to memory numpy owns or a `bytes` object; or xpu made
//! it (`numpy.asarray` of a list); or the caller opted in (`borrow_inputs=True`: it
//! promises not to change the array during a run). Every other input is copied once (a
//! non-contiguous or misaligned one by numpy, whose copy is then lent), and why is
//! returned for the run's facts.
//! Outputs are handed to numpy without a copy: the tensor's vector becomes the array's
//! memory. Tables (MiniLang) become `ArrowTable`s ([`crate::tables`]), which the Python
//! side turns into DataFrames.

use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use xpu_ir::table::{ColumnData, Table};
use xpu_ir::{Tensor, TensorData};

use crate::errors;

/// A numpy array (or anything `numpy.asarray` takes) as a tensor for input `name`: lent
/// where the rules above allow (`borrow_writable`: writable arrays too), else copied, with
/// the reason for the copy.
pub fn to_tensor(
    py: Python<'_>,
    name: &str,
    value: &Bound<'_, PyAny>,
    borrow_writable: bool,
) -> PyResult<(Tensor, Option<String>)> {
    let (array, ours) = match value.cast::<PyUntypedArray>() {
        Ok(a) => (a.clone(), false),
        Err(_) => {
            let np = py.import("numpy")?;
            let converted = np
                .call_method1("asarray", (value,))
                .map_err(|e| input_error(py, name, format!("cannot be read as an array: {e}")))?;
            let converted = converted.cast_into::<PyUntypedArray>().map_err(|_| {
                input_error(py, name, "numpy.asarray did not return an array".to_string())
            })?;
            // Ours only if numpy made new memory (a list's numbers); an object with
            // `__array__` or the buffer protocol may be a view of the caller's memory.
            let ours = flags(&converted) & numpy::npyffi::NPY_ARRAY_OWNDATA != 0;
            (converted, ours)
        }
    };
    let dtype = array.dtype();
    if !dtype.is_native_byteorder().unwrap_or(true) {
        return Err(input_error(
            py,
            name,
            format!(
                "has non-native byte order ({dtype}); convert it with .astype(dtype.newbyteorder('='))"
            ),
        ));
    }
    let kept = if ours || borrow_writable { None } else { why_not_lent(&array)? };
    macro_rules! read_as {
        ($($t:ty => $variant:ident),* $(,)?) => {
            $(
                if dtype.is_equiv_to(&numpy::dtype::<$t>(py)) {
                    let typed = array.cast::<PyArrayDyn<$t>>()?;
                    let aligned = (typed.data() as usize).is_multiple_of(align_of::<$t>());
                    if !array.is_c_contiguous() || !aligned {
                        // A new base-class array, C-ordered and aligned, is ours: lent.
                        let why = if aligned { "not C-contiguous" } else { "not aligned for its dtype" };
                        let np = py.import("numpy")?;
                        let kwargs = PyDict::new(py);
                        kwargs.set_item("order", "C")?;
                        kwargs.set_item("copy", true)?;
                        let copy = np.call_method("array", (typed,), Some(&kwargs))?;
                        let copy = copy.cast::<PyArrayDyn<$t>>()?;
                        return match lent(copy) {
                            Some(lent) => Ok((lent, Some(why.into()))),
                            None => Err(input_error(py, name, format!("is {why}, and numpy's copy of it is too"))),
                        };
                    }
                    if let Some(why) = kept {
                        return Ok((read_typed(typed, |v| TensorData::$variant(v)), Some(why.into())));
                    }
                    let lent = lent(typed).expect("checked: C-contiguous and aligned");
                    return Ok((lent, None));
                }
            )*
        };
    }
    read_as!(
        f32 => F32, f64 => F64, half::f16 => F16, i8 => I8, i16 => I16, i32 => I32,
        i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    );
    if dtype.is_equiv_to(&numpy::dtype::<bool>(py)) {
        // A bool byte other than 0 or 1 (a view of other bytes) is no `bool`: read as bytes
        // and always copied.
        let bytes = array.call_method1("view", (numpy::dtype::<u8>(py),))?;
        let bytes = bytes.cast::<PyArrayDyn<u8>>()?;
        let shape = bytes.shape().to_vec();
        let readonly = bytes.readonly();
        let copy: Vec<bool> = readonly.as_array().iter().map(|&b| b != 0).collect();
        let copy = Tensor::new(shape, TensorData::Bool(copy)).expect("numpy's shape");
        return Ok((copy, Some("bool elements are always copied".into())));
    }
    Err(input_error(
        py,
        name,
        format!(
            "has dtype {dtype}, which xpu does not take (float16/32/64, int8-64, uint8-64, bool)"
        ),
    ))
}

/// numpy's flags of the array (`writeable`, `owndata` …).
fn flags(array: &Bound<'_, PyUntypedArray>) -> i32 {
    // SAFETY: `array` is a live numpy array (checked by the cast that made it) and the GIL
    // is held; reading its flags field is what numpy's own PyArray_FLAGS does.
    unsafe { (*numpy::npyffi::objects::_PyArray_GET_ITEM_DATA(array.as_array_ptr())).flags }
}

/// Why the array's memory may change during a run (so it is copied), or `None` when it
/// cannot: the array is read-only and so is every array it views (or that array is held
/// by the view alone), down to memory numpy owns or an immutable `bytes` object. A read-only view of a writable array, of a DLPack
/// producer (a torch tensor) or of another object's buffer may change under it.
fn why_not_lent(array: &Bound<'_, PyUntypedArray>) -> PyResult<Option<&'static str>> {
    const WRITABLE: &str =
        "writable (read-only arrays are read in place; borrow_inputs=True lends writable ones)";
    const VIEW: &str = "a read-only view of memory that may change (borrow_inputs=True lends it)";
    if flags(array) & numpy::npyffi::NPY_ARRAY_WRITEABLE != 0 {
        return Ok(Some(WRITABLE));
    }
    let mut base = array.getattr("base")?;
    // Views of views: bounded, as numpy collapses most chains to one level.
    for _ in 0..64 {
        if base.is_none() || base.is_exact_instance_of::<pyo3::types::PyBytes>() {
            return Ok(None);
        }
        match base.cast::<PyUntypedArray>() {
            // A writable array that only the view holds (the view's reference and this
            // handle: `np.load`'s result reshaped, say) is nobody else's to write.
            Ok(a) if flags(a) & numpy::npyffi::NPY_ARRAY_WRITEABLE == 0 || references(a) <= 2 => {
                base = a.getattr("base")?;
            }
            _ => return Ok(Some(VIEW)),
        }
    }
    Ok(Some(VIEW))
}

/// How many references the array has (ours included).
fn references(array: &Bound<'_, PyUntypedArray>) -> isize {
    // SAFETY: `array` is a live object and the GIL is held: reading its reference count is
    // what `sys.getrefcount` does.
    unsafe { pyo3::ffi::Py_REFCNT(array.as_ptr()) }
}

/// A C-contiguous array's elements lent to a tensor, the array itself kept alive by it;
/// `None` when `Tensor::lend` refuses (misaligned memory, which callers check first).
fn lent<T: Element + xpu_ir::Element>(array: &Bound<'_, PyArrayDyn<T>>) -> Option<Tensor> {
    if !array.is_c_contiguous() {
        return None;
    }
    let shape = array.shape().to_vec();
    let ptr = array.data().cast_const().cast::<u8>();
    let owner: Box<dyn std::any::Any + Send + Sync> = Box::new(array.clone().unbind());
    // SAFETY: the array is C-contiguous, so `ptr` holds numel elements of T; the tensor
    // holds a reference to the array (`owner`), so its memory lives as long as the tensor
    // (numpy cannot resize an array others refer to). It stays unchanged: the array is
    // read-only, ours alone (converted from a list), or the caller promised not to write it
    // during the run (`borrow_inputs=True`).
    unsafe { Tensor::lend(shape, <T as xpu_ir::Element>::DTYPE, ptr, owner) }
}

/// The elements of an aligned array in C order, in one copy, as a tensor of its shape.
fn read_typed<T: Element + Copy>(
    array: &Bound<'_, PyArrayDyn<T>>,
    wrap: impl FnOnce(Vec<T>) -> TensorData,
) -> Tensor {
    let shape = array.shape().to_vec();
    // SAFETY: the GIL is held and no Rust code holds a mutable view of this array; callers
    // pass C-contiguous, aligned arrays (checked), so the slice is the elements in order.
    // (Not through `readonly()`: its borrow tracking costs a microsecond per call.)
    let elements = match unsafe { array.as_slice() } {
        Ok(contiguous) => contiguous.to_vec(),
        Err(_) => array.readonly().as_array().iter().copied().collect(),
    };
    Tensor::new(shape, wrap(elements)).expect("numpy's shape matches its element count")
}

fn input_error(py: Python<'_>, name: &str, message: String) -> PyErr {
    let attrs = PyDict::new(py);
    let _ = attrs.set_item("input", name);
    errors::raise(py, "InputError", format!("input `{name}` {message}"), &attrs)
}

/// A tensor as a numpy array; the tensor's vector becomes the array's memory when nothing
/// else holds it (the usual case for outputs), else its elements are copied once.
pub fn to_numpy<'py>(py: Python<'py>, tensor: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let (shape, data) = match tensor.try_into_parts() {
        Ok(parts) => parts,
        // Shared (or lent) elements: one copy, not a cached copy cloned.
        Err(shared) => shared.into_parts(),
    };
    macro_rules! owned {
        ($v:expr) => {
            numpy::PyArray1::from_vec(py, $v).reshape(shape)?.into_any()
        };
    }
    Ok(match data {
        TensorData::F32(v) => owned!(v),
        TensorData::F64(v) => owned!(v),
        TensorData::F16(v) => owned!(v),
        // numpy has no bfloat16: widened to float32 (exactly).
        TensorData::BF16(v) => owned!(v.into_iter().map(f32::from).collect::<Vec<f32>>()),
        TensorData::I8(v) => owned!(v),
        TensorData::I16(v) => owned!(v),
        TensorData::I32(v) => owned!(v),
        TensorData::I64(v) => owned!(v),
        TensorData::U8(v) => owned!(v),
        TensorData::U16(v) => owned!(v),
        TensorData::U32(v) => owned!(v),
        TensorData::U64(v) => owned!(v),
        TensorData::Bool(v) => owned!(v),
        TensorData::String(v) => {
            let np = py.import("numpy")?;
            let list = PyList::new(py, v)?;
            np.call_method1("array", (list, "object"))?.call_method1("reshape", (shape,))?
        }
        TensorData::Table(tables) => match tables.into_iter().next() {
            Some(t) => Bound::new(py, crate::tables::ArrowTable::new(t)?)?.into_any(),
            None => PyDict::new(py).into_any(),
        },
        TensorData::Lowp(l, codes) => lowp_array(py, l, codes, shape)?,
    })
}

/// Low-precision elements as `ml_dtypes`' type of the same name (one byte an element, as
/// xpu holds them) when `ml_dtypes` is installed, else their values (f32; i8 for the
/// sub-byte integers), as bfloat16's are widened.
fn lowp_array<'py>(
    py: Python<'py>,
    l: xpu_ir::lowp::Lowp,
    codes: Vec<u8>,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    use xpu_ir::lowp::Lowp;
    let name = match l {
        Lowp::F8E4M3FN => "float8_e4m3fn",
        Lowp::F8E4M3FNUZ => "float8_e4m3fnuz",
        Lowp::F8E5M2 => "float8_e5m2",
        Lowp::F8E5M2FNUZ => "float8_e5m2fnuz",
        Lowp::F8E8M0 => "float8_e8m0fnu",
        Lowp::F4E2M1 => "float4_e2m1fn",
        Lowp::I4 => "int4",
        Lowp::U4 => "uint4",
        Lowp::I2 => "int2",
        Lowp::U2 => "uint2",
    };
    if let Ok(ml) = py.import("ml_dtypes")
        && let Ok(dtype) = ml.getattr(name)
    {
        let raw = numpy::PyArray1::from_vec(py, codes).reshape(shape)?;
        return raw.call_method1("view", (dtype,));
    }
    if l.is_int() {
        let v: Vec<i8> = codes.iter().map(|&c| l.to_f64(c) as i8).collect();
        Ok(numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any())
    } else {
        let v: Vec<f32> = codes.iter().map(|&c| l.to_f64(c) as f32).collect();
        Ok(numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any())
    }
}

/// A table as `{column: array}` in column order: float64 with NaN for missing floats,
/// int64 (float64 with NaN when a value is missing), bool (object with None when one is
/// missing), strings as object arrays with None.
pub fn table_columns<'py>(py: Python<'py>, table: &Table) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    let np = py.import("numpy")?;
    for column in &table.columns {
        let array: Bound<'py, PyAny> = match &column.data {
            ColumnData::F64(v) => {
                let filled: Vec<f64> = v.iter().map(|x| x.unwrap_or(f64::NAN)).collect();
                numpy::PyArray1::from_vec(py, filled).into_any()
            }
            ColumnData::I64(v) if v.iter().all(Option::is_some) => {
                numpy::PyArray1::from_vec(py, v.iter().map(|x| x.unwrap_or(0)).collect()).into_any()
            }
            ColumnData::I64(v) => {
                let filled: Vec<f64> = v.iter().map(|x| x.map_or(f64::NAN, |i| i as f64)).collect();
                numpy::PyArray1::from_vec(py, filled).into_any()
            }
            ColumnData::Bool(v) if v.iter().all(Option::is_some) => {
                numpy::PyArray1::from_vec(py, v.iter().map(|x| x.unwrap_or(false)).collect())
                    .into_any()
            }
            ColumnData::Bool(v) => np.call_method1("array", (PyList::new(py, v)?, "object"))?,
            ColumnData::String(v) => np.call_method1("array", (PyList::new(py, v)?, "object"))?,
        };
        out.set_item(&column.name, array)?;
    }
    Ok(out)
}
