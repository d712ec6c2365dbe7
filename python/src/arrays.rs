//! Numpy arrays in and out. An input of a plain numeric dtype in native byte order that is
//! C-contiguous and aligned is lent to the run — read where it lies, no copy — when it is
//! read-only (numpy's `writeable` flag off), when the caller opted in for writable arrays
//! (`borrow_inputs=True`: it promises not to change them during a run), or when xpu made
//! the array itself (`numpy.asarray` of a list); every other input is copied once (a
//! non-contiguous one gathered in that copy), and why is returned for the run's facts.
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
            (converted, true)
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
    let writable_kept = !ours && !borrow_writable && is_writeable(&array);
    macro_rules! read_as {
        ($($t:ty => $variant:ident),* $(,)?) => {
            $(
                if dtype.is_equiv_to(&numpy::dtype::<$t>(py)) {
                    let typed = array.cast::<PyArrayDyn<$t>>()?;
                    let aligned = (typed.data() as usize).is_multiple_of(align_of::<$t>());
                    if !array.is_c_contiguous() || !aligned {
                        // numpy's own copy, C-ordered and aligned, is ours: lent.
                        let why = if aligned { "not C-contiguous" } else { "not aligned for its dtype" };
                        let copy = typed.call_method1("copy", ("C",))?;
                        let copy = copy.cast::<PyArrayDyn<$t>>()?;
                        let lent = lent(copy).expect("numpy's copy is C-contiguous and aligned");
                        return Ok((lent, Some(why.into())));
                    }
                    if writable_kept {
                        let why = "writable (read-only arrays are read in place; borrow_inputs=True lends writable ones)";
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
        // A bool byte other than 0 or 1 (a view of other bytes) is no `bool`: always copied.
        let typed = array.cast::<PyArrayDyn<bool>>()?;
        let copy = read_typed(typed, TensorData::Bool);
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

/// Whether numpy lets the array be written (its `writeable` flag).
fn is_writeable(array: &Bound<'_, PyUntypedArray>) -> bool {
    // SAFETY: `array` is a live numpy array (checked by the cast that made it) and the GIL
    // is held; reading its flags field is what numpy's own PyArray_FLAGS does.
    let flags =
        unsafe { (*numpy::npyffi::objects::_PyArray_GET_ITEM_DATA(array.as_array_ptr())).flags };
    flags & numpy::npyffi::NPY_ARRAY_WRITEABLE != 0
}

/// A C-contiguous array's elements lent to a tensor, the array itself kept alive by it;
/// `None` when `Tensor::lend` refuses (misaligned memory, which callers check first).
fn lent<T: Element + xpu_ir::Element>(array: &Bound<'_, PyArrayDyn<T>>) -> Option<Tensor> {
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
    let readonly = array.readonly();
    let elements = match readonly.as_slice() {
        Ok(contiguous) => contiguous.to_vec(),
        Err(_) => readonly.as_array().iter().copied().collect(),
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
        Err(shared) => (shared.shape().to_vec(), shared.data().clone()),
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
    })
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
