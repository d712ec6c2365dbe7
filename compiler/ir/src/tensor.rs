//! Dense host tensors: constants in the IR and the buffers engines exchange.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use half::{bf16, f16};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::lowp::Lowp;
use crate::{DType, TensorType};

/// Typed element storage, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// Tables (dtype `table`): a table value is a tensor of shape `[]` holding one.
    Table(Vec<crate::Table>),
    /// A low-precision type's elements, one code per byte (`crate::lowp`).
    Lowp(Lowp, Vec<u8>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a [`TensorData`].
#[macro_export]
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::TensorData::F32($v) => $body,
            $crate::TensorData::F64($v) => $body,
            $crate::TensorData::F16($v) => $body,
            $crate::TensorData::BF16($v) => $body,
            $crate::TensorData::I8($v) => $body,
            $crate::TensorData::I16($v) => $body,
            $crate::TensorData::I32($v) => $body,
            $crate::TensorData::I64($v) => $body,
            $crate::TensorData::U8($v) => $body,
            $crate::TensorData::U16($v) => $body,
            $crate::TensorData::U32($v) => $body,
            $crate::TensorData::U64($v) => $body,
            $crate::TensorData::Bool($v) => $body,
            $crate::TensorData::String($v) => $body,
            $crate::TensorData::Table($v) => $body,
            $crate::TensorData::Lowp(_, $v) => $body,
        }
    };
}

/// Element types that can live in a [`TensorData`].
pub trait Element: Clone + Send + Sync + fmt::Debug + PartialEq + 'static {
    const DTYPE: DType;
    fn wrap(v: Vec<Self>) -> TensorData;
    fn slice(d: &TensorData) -> Option<&[Self]>;
    fn vec_mut(d: &mut TensorData) -> Option<&mut Vec<Self>>;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn wrap(v: Vec<Self>) -> TensorData {
                TensorData::$variant(v)
            }
            fn slice(d: &TensorData) -> Option<&[Self]> {
                match d {
                    TensorData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn vec_mut(d: &mut TensorData) -> Option<&mut Vec<Self>> {
                match d {
                    TensorData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(f16, F16);
element!(bf16, BF16);
element!(i8, I8);
element!(i16, I16);
element!(i32, I32);
element!(i64, I64);
element!(u8, U8);
element!(u16, U16);
element!(u32, U32);
element!(u64, U64);
element!(bool, Bool);
element!(String, String);
element!(crate::Table, Table);

impl TensorData {
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F64(_) => DType::F64,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::I8(_) => DType::I8,
            TensorData::I16(_) => DType::I16,
            TensorData::I32(_) => DType::I32,
            TensorData::I64(_) => DType::I64,
            TensorData::U8(_) => DType::U8,
            TensorData::U16(_) => DType::U16,
            TensorData::U32(_) => DType::U32,
            TensorData::U64(_) => DType::U64,
            TensorData::Bool(_) => DType::Bool,
            TensorData::String(_) => DType::String,
            TensorData::Table(_) => DType::Table,
            TensorData::Lowp(l, _) => l.dtype(),
        }
    }

    pub fn len(&self) -> usize {
        with_data!(self, v => v.len())
    }

    /// The table held by a table value (a tensor of shape `[]` and dtype `table`).
    pub fn as_table(&self) -> Option<&crate::Table> {
        match self {
            TensorData::Table(v) if v.len() == 1 => v.first(),
            _ => None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` default (zero / false / empty) elements of `dtype`.
    /// The first byte of the elements, for the plain numeric and bool types (what compiled
    /// kernels take as a buffer); `None` for strings and tables.
    pub fn as_byte_ptr(&self) -> Option<*const u8> {
        use TensorData::*;
        Some(match self {
            F32(v) => v.as_ptr().cast(),
            F64(v) => v.as_ptr().cast(),
            F16(v) => v.as_ptr().cast(),
            BF16(v) => v.as_ptr().cast(),
            I8(v) => v.as_ptr().cast(),
            I16(v) => v.as_ptr().cast(),
            I32(v) => v.as_ptr().cast(),
            I64(v) => v.as_ptr().cast(),
            U8(v) => v.as_ptr(),
            U16(v) => v.as_ptr().cast(),
            U32(v) => v.as_ptr().cast(),
            U64(v) => v.as_ptr().cast(),
            Bool(v) => v.as_ptr().cast(),
            Lowp(_, v) => v.as_ptr(),
            String(_) | Table(_) => return None,
        })
    }

    /// Room for `n` elements of a plain numeric or bool dtype, none of them set (length 0):
    /// for a kernel that writes every element through [`as_byte_ptr`](Self::as_byte_ptr)
    /// before [`assume_filled`](Self::assume_filled) sets the length. Cheaper than
    /// [`zeros`](Self::zeros) for large buffers: the allocator may hand back memory it
    /// already holds, neither zeroed nor faulted in again. In debug builds the room is
    /// poisoned (all bits set: NaN, −1; bools `true`), so a kernel that leaves an element
    /// unwritten shows in tests. `None` for strings and tables.
    pub fn with_room(dtype: DType, n: usize) -> Option<TensorData> {
        fn room<T>(n: usize, wrap: fn(Vec<T>) -> TensorData, poison: u8) -> TensorData {
            let mut v: Vec<T> = Vec::with_capacity(n);
            if cfg!(debug_assertions) {
                let spare = v.spare_capacity_mut();
                // SAFETY: the spare capacity is `n` elements of writable, unset memory;
                // writing bytes into it sets nothing the Vec considers initialised.
                unsafe {
                    std::ptr::write_bytes(
                        spare.as_mut_ptr().cast::<u8>(),
                        poison,
                        spare.len() * std::mem::size_of::<T>(),
                    )
                };
            }
            wrap(v)
        }
        Some(match dtype {
            DType::F32 => room(n, TensorData::F32, 0xff),
            DType::F64 => room(n, TensorData::F64, 0xff),
            DType::F16 => room(n, TensorData::F16, 0xff),
            DType::BF16 => room(n, TensorData::BF16, 0xff),
            DType::I8 => room(n, TensorData::I8, 0xff),
            DType::I16 => room(n, TensorData::I16, 0xff),
            DType::I32 => room(n, TensorData::I32, 0xff),
            DType::I64 => room(n, TensorData::I64, 0xff),
            DType::U8 => room(n, TensorData::U8, 0xff),
            DType::U16 => room(n, TensorData::U16, 0xff),
            DType::U32 => room(n, TensorData::U32, 0xff),
            DType::U64 => room(n, TensorData::U64, 0xff),
            DType::Bool => room(n, TensorData::Bool, 0x01),
            DType::String | DType::Table => return None,
            d => {
                let l = d.lowp().expect("every other dtype is listed");
                let TensorData::U8(v) = room(n, TensorData::U8, 0xff) else { unreachable!() };
                TensorData::Lowp(l, v)
            }
        })
    }

    /// Sets the length of data made by [`with_room`](Self::with_room) to `n`.
    ///
    /// # Safety
    /// All `n` elements were written (bools as 0 or 1), and `n` is at most the room made.
    pub unsafe fn assume_filled(&mut self, n: usize) {
        use TensorData::*;
        // SAFETY: the caller guarantees the first `n` elements are initialised and within
        // the capacity.
        unsafe {
            match self {
                F32(v) => v.set_len(n),
                F64(v) => v.set_len(n),
                F16(v) => v.set_len(n),
                BF16(v) => v.set_len(n),
                I8(v) => v.set_len(n),
                I16(v) => v.set_len(n),
                I32(v) => v.set_len(n),
                I64(v) => v.set_len(n),
                U8(v) => v.set_len(n),
                U16(v) => v.set_len(n),
                U32(v) => v.set_len(n),
                U64(v) => v.set_len(n),
                Bool(v) => v.set_len(n),
                Lowp(_, v) => v.set_len(n),
                String(_) | Table(_) => {}
            }
        }
    }

    pub fn zeros(dtype: DType, n: usize) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(vec![0.0; n]),
            DType::F64 => TensorData::F64(vec![0.0; n]),
            DType::F16 => TensorData::F16(vec![f16::ZERO; n]),
            DType::BF16 => TensorData::BF16(vec![bf16::ZERO; n]),
            DType::I8 => TensorData::I8(vec![0; n]),
            DType::I16 => TensorData::I16(vec![0; n]),
            DType::I32 => TensorData::I32(vec![0; n]),
            DType::I64 => TensorData::I64(vec![0; n]),
            DType::U8 => TensorData::U8(vec![0; n]),
            DType::U16 => TensorData::U16(vec![0; n]),
            DType::U32 => TensorData::U32(vec![0; n]),
            DType::U64 => TensorData::U64(vec![0; n]),
            DType::Bool => TensorData::Bool(vec![false; n]),
            DType::String => TensorData::String(vec![String::new(); n]),
            DType::Table => TensorData::Table(vec![crate::Table::default(); n]),
            d => TensorData::Lowp(d.lowp().expect("every other dtype is listed"), vec![0; n]),
        }
    }

    /// Element `i` as f64 (strings parse, bools are 0/1); used by folding and shape arithmetic.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            TensorData::F32(v) => v[i] as f64,
            TensorData::F64(v) => v[i],
            TensorData::F16(v) => v[i].to_f64(),
            TensorData::BF16(v) => v[i].to_f64(),
            TensorData::I8(v) => v[i] as f64,
            TensorData::I16(v) => v[i] as f64,
            TensorData::I32(v) => v[i] as f64,
            TensorData::I64(v) => v[i] as f64,
            TensorData::U8(v) => v[i] as f64,
            TensorData::U16(v) => v[i] as f64,
            TensorData::U32(v) => v[i] as f64,
            TensorData::U64(v) => v[i] as f64,
            TensorData::Bool(v) => v[i] as u8 as f64,
            TensorData::String(v) => v[i].parse().unwrap_or(f64::NAN),
            TensorData::Table(_) => f64::NAN,
            TensorData::Lowp(l, v) => l.to_f64(v[i]),
        }
    }

    /// The elements' little-endian bytes, borrowed where memory already holds them so (every
    /// fixed-width dtype on a little-endian machine), else as [`to_le_bytes`] makes them.
    /// What crosses to a worker process's shared memory without a per-element loop.
    ///
    /// [`to_le_bytes`]: TensorData::to_le_bytes
    pub fn le_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        use std::borrow::Cow;
        if cfg!(target_endian = "big") {
            return Cow::Owned(self.to_le_bytes());
        }
        match self {
            TensorData::F32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::F64(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::F16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::BF16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::I8(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::I16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::I32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::I64(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::U8(v) => Cow::Borrowed(v),
            TensorData::U16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::U32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::U64(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::Bool(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::Lowp(_, v) => Cow::Borrowed(v),
            TensorData::String(_) | TensorData::Table(_) => Cow::Owned(self.to_le_bytes()),
        }
    }

    /// Little-endian bytes of the elements (strings: length-prefixed UTF-8).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        macro_rules! le {
            ($v:expr) => {
                $v.iter().flat_map(|x| x.to_le_bytes()).collect()
            };
        }
        match self {
            TensorData::F32(v) => le!(v),
            TensorData::F64(v) => le!(v),
            TensorData::F16(v) => le!(v),
            TensorData::BF16(v) => le!(v),
            TensorData::I8(v) => le!(v),
            TensorData::I16(v) => le!(v),
            TensorData::I32(v) => le!(v),
            TensorData::I64(v) => le!(v),
            TensorData::U8(v) => v.clone(),
            TensorData::U16(v) => le!(v),
            TensorData::U32(v) => le!(v),
            TensorData::U64(v) => le!(v),
            TensorData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
            TensorData::Lowp(_, v) => v.clone(),
            TensorData::String(v) => {
                let mut out = Vec::new();
                for s in v {
                    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
                out
            }
            // Tables are never IR constants (the verifier rejects them), so they have no
            // byte form; an empty one keeps this infallible.
            TensorData::Table(_) => Vec::new(),
        }
    }

    /// Inverse of [`TensorData::to_le_bytes`] for `n` elements of a fixed-width dtype.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Result<TensorData, String> {
        let width = dtype.size_bytes();
        if dtype == DType::Table {
            return Err("tables have no byte form (they are never constants)".into());
        }
        if dtype == DType::String {
            let mut out = Vec::new();
            let mut rest = bytes;
            while !rest.is_empty() {
                if rest.len() < 8 {
                    return Err("truncated string length".into());
                }
                let n = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
                rest = &rest[8..];
                if rest.len() < n {
                    return Err("truncated string data".into());
                }
                out.push(String::from_utf8(rest[..n].to_vec()).map_err(|e| e.to_string())?);
                rest = &rest[n..];
            }
            return Ok(TensorData::String(out));
        }
        if !bytes.len().is_multiple_of(width) {
            return Err(format!(
                "{} bytes is not a whole number of {} elements ({} bytes each)",
                bytes.len(),
                dtype,
                width
            ));
        }
        // On a little-endian machine the bytes are the elements: where they are aligned for
        // the type (what a worker process's shared memory is read with), one copy into a
        // typed vector, not zeroed first; otherwise zeroed elements overwritten in place.
        macro_rules! aligned {
            ($t:ty, $variant:ident) => {
                bytemuck::try_cast_slice::<u8, $t>(bytes)
                    .ok()
                    .filter(|_| cfg!(target_endian = "little"))
                    .map(|elements| TensorData::$variant(elements.to_vec()))
            };
        }
        let copied = match dtype {
            DType::F32 => aligned!(f32, F32),
            DType::F64 => aligned!(f64, F64),
            DType::F16 => aligned!(f16, F16),
            DType::BF16 => aligned!(bf16, BF16),
            DType::I8 => aligned!(i8, I8),
            DType::I16 => aligned!(i16, I16),
            DType::I32 => aligned!(i32, I32),
            DType::I64 => aligned!(i64, I64),
            DType::U8 => Some(TensorData::U8(bytes.to_vec())),
            DType::U16 => aligned!(u16, U16),
            DType::U32 => aligned!(u32, U32),
            DType::U64 => aligned!(u64, U64),
            DType::Bool => Some(TensorData::Bool(bytes.iter().map(|&b| b != 0).collect())),
            DType::String | DType::Table => unreachable!("handled above"),
            d => Some(TensorData::Lowp(
                d.lowp().expect("every other dtype is listed"),
                bytes.to_vec(),
            )),
        };
        Ok(copied.unwrap_or_else(|| {
            let mut data = TensorData::zeros(dtype, bytes.len() / width);
            // As many bytes as the elements take: checked above.
            data.copy_from_le_bytes(bytes);
            data
        }))
    }

    /// Overwrites the elements with `bytes` (little-endian, as [`TensorData::le_bytes`]
    /// gives them) without allocating; false, and nothing written, where they are not
    /// exactly as many bytes as the elements take (or the elements are strings or a table).
    pub fn copy_from_le_bytes(&mut self, bytes: &[u8]) -> bool {
        macro_rules! copy {
            ($v:expr, $t:ty) => {{
                let width = std::mem::size_of::<$t>();
                if $v.len() * width != bytes.len() {
                    return false;
                }
                if cfg!(target_endian = "little") {
                    bytemuck::cast_slice_mut::<$t, u8>($v).copy_from_slice(bytes);
                } else {
                    for (x, c) in $v.iter_mut().zip(bytes.chunks_exact(width)) {
                        *x = <$t>::from_le_bytes(c.try_into().unwrap());
                    }
                }
                true
            }};
        }
        match self {
            TensorData::F32(v) => copy!(v, f32),
            TensorData::F64(v) => copy!(v, f64),
            TensorData::F16(v) => copy!(v, f16),
            TensorData::BF16(v) => copy!(v, bf16),
            TensorData::I8(v) => copy!(v, i8),
            TensorData::I16(v) => copy!(v, i16),
            TensorData::I32(v) => copy!(v, i32),
            TensorData::I64(v) => copy!(v, i64),
            TensorData::U8(v) => copy!(v, u8),
            TensorData::U16(v) => copy!(v, u16),
            TensorData::U32(v) => copy!(v, u32),
            TensorData::U64(v) => copy!(v, u64),
            TensorData::Lowp(_, v) => copy!(v, u8),
            TensorData::Bool(v) if v.len() == bytes.len() => {
                for (x, &b) in v.iter_mut().zip(bytes) {
                    *x = b != 0;
                }
                true
            }
            TensorData::Bool(_) | TensorData::String(_) | TensorData::Table(_) => false,
        }
    }
}

/// A dense, row-major tensor with a static shape.
///
/// The elements are shared (`Arc`): cloning a tensor, a graph holding it as a constant, or
/// a partition cut from that graph never copies them. They are immutable while shared;
/// [`into_parts`](Tensor::into_parts) copies only when another holder remains. They are
/// this process's own, or lent by another owner ([`Tensor::lend`]: a numpy array's buffer)
/// and read where they lie.
#[derive(Clone, Debug)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Storage,
}

#[derive(Clone, Debug)]
enum Storage {
    Owned(Arc<TensorData>),
    Lent(Arc<Lent>),
}

/// Elements another owner lends: read where they lie through [`Tensor::as_slice`],
/// [`Tensor::element_bytes`] and [`Tensor::le_bytes`], never written; copied into
/// [`TensorData`] once, on first need, for code that matches on [`Tensor::data`].
struct Lent {
    dtype: DType,
    ptr: *const u8,
    len_bytes: usize,
    /// Keeps the memory alive (and unchanged: the lender's promise) while any tensor
    /// shares it.
    _owner: Box<dyn std::any::Any + Send + Sync>,
    copy: std::sync::OnceLock<TensorData>,
}

// SAFETY: the lent bytes are only read, and `Tensor::lend`'s caller promised they stay
// valid and unchanged while the owner lives; the owner is Send + Sync itself.
unsafe impl Send for Lent {}
// SAFETY: as for Send: shared access only reads the bytes (`copy` is a OnceLock).
unsafe impl Sync for Lent {}

impl fmt::Debug for Lent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lent({} bytes of {})", self.len_bytes, self.dtype)
    }
}

impl Lent {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `Tensor::lend`'s contract: `ptr` holds `len_bytes` initialised bytes
        // that live and stay unchanged as long as `_owner`, which `self` holds.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len_bytes) }
    }

    fn data(&self) -> &TensorData {
        self.copy.get_or_init(|| self.copied())
    }

    fn copied(&self) -> TensorData {
        TensorData::from_le_bytes(self.dtype, self.bytes())
            .expect("lent elements are whole elements of a plain dtype (checked by lend)")
    }

    /// The elements as an owned vector: the copy already made when this is the last
    /// holder and one was, else one copy.
    fn into_data(self: Arc<Lent>) -> TensorData {
        match Arc::try_unwrap(self) {
            Ok(mut lent) => lent.copy.take().unwrap_or_else(|| lent.copied()),
            Err(shared) => match shared.copy.get() {
                Some(copy) => copy.clone(),
                None => shared.copied(),
            },
        }
    }
}

/// Element-wise equality, short-cut for tensors sharing one buffer (comparing a graph with
/// its rewritten copy does not walk the weights the copy shares).
impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        if self.shape != other.shape {
            return false;
        }
        if self.shares_data_with(other) {
            return true;
        }
        match (&self.data, &other.data) {
            (Storage::Owned(a), Storage::Owned(b)) => a == b,
            // Lent elements are plain numbers: compared as `data()` would be, without
            // copying them (NaN ≠ NaN, 0.0 = -0.0).
            _ => self.dtype() == other.dtype() && self.elements_eq(other),
        }
    }
}

/// Error building a tensor whose data length does not match its shape.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tensor data has {len} elements but shape {shape:?} needs {}", need.map_or_else(|| "more than can be addressed".to_string(), |n| n.to_string()))]
pub struct ShapeMismatch {
    pub shape: Vec<usize>,
    pub len: usize,
    /// `None` when the shape's element count overflows `usize`.
    pub need: Option<usize>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<Tensor, ShapeMismatch> {
        let need = crate::shape::checked_numel(&shape);
        if need != Some(data.len()) {
            return Err(ShapeMismatch { shape, len: data.len(), need });
        }
        Ok(Tensor { shape, data: Storage::Owned(Arc::new(data)) })
    }

    /// A tensor over elements another owner lends (a numpy array's buffer), read where they
    /// lie: `ptr` holds the shape's element count of `dtype` (a plain numeric dtype, not
    /// bool, string or table), aligned for it, little-endian. `None` when the dtype,
    /// alignment or size does not allow it (the caller copies instead).
    ///
    /// # Safety
    /// The bytes must stay valid and unchanged for as long as `owner` lives; the tensor
    /// (and every clone, every value an engine derives by sharing it) keeps `owner` alive.
    pub unsafe fn lend(
        shape: Vec<usize>,
        dtype: DType,
        ptr: *const u8,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Option<Tensor> {
        let plain = dtype.is_float() || dtype.is_int();
        let n = crate::shape::checked_numel(&shape)?;
        let len_bytes = n.checked_mul(dtype.size_bytes())?;
        let aligned = (ptr as usize).is_multiple_of(dtype.size_bytes().max(1));
        if !plain || !aligned || ptr.is_null() || cfg!(target_endian = "big") {
            return None;
        }
        let lent = Lent { dtype, ptr, len_bytes, _owner: owner, copy: Default::default() };
        Some(Tensor { shape, data: Storage::Lent(Arc::new(lent)) })
    }

    /// Element-wise equality of two tensors of one plain dtype, read where they lie.
    fn elements_eq(&self, other: &Tensor) -> bool {
        fn eq<T: Element>(a: &Tensor, b: &Tensor) -> bool {
            a.as_slice::<T>() == b.as_slice::<T>()
        }
        match self.dtype() {
            DType::F32 => eq::<f32>(self, other),
            DType::F64 => eq::<f64>(self, other),
            DType::F16 => eq::<f16>(self, other),
            DType::BF16 => eq::<bf16>(self, other),
            DType::I8 => eq::<i8>(self, other),
            DType::I16 => eq::<i16>(self, other),
            DType::I32 => eq::<i32>(self, other),
            DType::I64 => eq::<i64>(self, other),
            DType::U8 => eq::<u8>(self, other),
            DType::U16 => eq::<u16>(self, other),
            DType::U32 => eq::<u32>(self, other),
            DType::U64 => eq::<u64>(self, other),
            _ => self.data() == other.data(),
        }
    }

    /// Whether the elements are lent by another owner ([`Tensor::lend`]).
    pub fn is_lent(&self) -> bool {
        matches!(self.data, Storage::Lent(_))
    }

    pub fn from_vec<T: Element>(shape: Vec<usize>, v: Vec<T>) -> Result<Tensor, ShapeMismatch> {
        Tensor::new(shape, T::wrap(v))
    }

    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor { shape: vec![], data: Storage::Owned(Arc::new(T::wrap(vec![v]))) }
    }

    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor { shape, data: Storage::Owned(Arc::new(TensorData::zeros(dtype, n))) }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        match &self.data {
            Storage::Owned(d) => d.dtype(),
            Storage::Lent(l) => l.dtype,
        }
    }

    /// The elements to match on. A lent tensor's are copied here once, on first call:
    /// code that only reads them goes through [`as_slice`](Tensor::as_slice),
    /// [`element_bytes`](Tensor::element_bytes) or [`le_bytes`](Tensor::le_bytes).
    pub fn data(&self) -> &TensorData {
        match &self.data {
            Storage::Owned(d) => d,
            Storage::Lent(l) => l.data(),
        }
    }

    /// The shape and the elements, copied only if another tensor still shares them (or
    /// another owner lends them).
    pub fn into_parts(self) -> (Vec<usize>, TensorData) {
        match self.data {
            Storage::Owned(d) => {
                (self.shape, Arc::try_unwrap(d).unwrap_or_else(|shared| (*shared).clone()))
            }
            Storage::Lent(l) => (self.shape, l.into_data()),
        }
    }

    /// The shape and the elements when no other tensor shares them; the tensor back
    /// otherwise (and for lent elements). Lets an executor reuse a dead value's buffer
    /// without copying it.
    pub fn try_into_parts(self) -> Result<(Vec<usize>, TensorData), Tensor> {
        match self.data {
            Storage::Owned(d) => match Arc::try_unwrap(d) {
                Ok(data) => Ok((self.shape, data)),
                Err(d) => Err(Tensor { shape: self.shape, data: Storage::Owned(d) }),
            },
            lent @ Storage::Lent(_) => Err(Tensor { shape: self.shape, data: lent }),
        }
    }

    /// The elements for writing in place, when no other tensor shares them (never for lent
    /// elements).
    pub fn data_mut(&mut self) -> Option<&mut TensorData> {
        match &mut self.data {
            Storage::Owned(d) => Arc::get_mut(d),
            Storage::Lent(_) => None,
        }
    }

    /// Identity of the element buffer: equal for tensors that share one (see
    /// [`shares_data_with`](Tensor::shares_data_with)). Only meaningful while both live.
    pub fn storage_id(&self) -> usize {
        match &self.data {
            Storage::Owned(d) => Arc::as_ptr(d) as usize,
            Storage::Lent(l) => Arc::as_ptr(l) as *const u8 as usize,
        }
    }

    /// Whether the two tensors share one element buffer (no copy was made between them).
    pub fn shares_data_with(&self, other: &Tensor) -> bool {
        match (&self.data, &other.data) {
            (Storage::Owned(a), Storage::Owned(b)) => Arc::ptr_eq(a, b),
            (Storage::Lent(a), Storage::Lent(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The elements' bytes where they lie (little-endian, as the host is), for the plain
    /// numeric and bool dtypes; `None` for strings and tables. No copy, lent or not.
    pub fn element_bytes(&self) -> Option<&[u8]> {
        match &self.data {
            Storage::Owned(d) => {
                let p = d.as_byte_ptr()?;
                // SAFETY: `p` is the first byte of `d`'s element vector, which holds
                // len × size_bytes initialised bytes (plain dtypes have no padding) and
                // lives as long as `self`.
                Some(unsafe { std::slice::from_raw_parts(p, d.len() * d.dtype().size_bytes()) })
            }
            Storage::Lent(l) => Some(l.bytes()),
        }
    }

    /// The elements as little-endian bytes: borrowed where they lie for plain dtypes,
    /// encoded for strings.
    pub fn le_bytes(&self) -> Cow<'_, [u8]> {
        match &self.data {
            Storage::Owned(d) => d.le_bytes(),
            Storage::Lent(l) => Cow::Borrowed(l.bytes()),
        }
    }

    pub fn numel(&self) -> usize {
        match &self.data {
            Storage::Owned(d) => d.len(),
            Storage::Lent(l) => l.len_bytes / l.dtype.size_bytes().max(1),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn size_bytes(&self) -> usize {
        self.numel() * self.dtype().size_bytes()
    }

    pub fn ty(&self) -> TensorType {
        TensorType::of_shape(self.dtype(), &self.shape)
    }

    /// The elements as a typed slice, if the dtype is `T`.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        match &self.data {
            Storage::Owned(d) => T::slice(d),
            Storage::Lent(l) if T::DTYPE == l.dtype => {
                // SAFETY: `lend` admitted only plain numeric dtypes, aligned for their
                // element type, whose every bit pattern is a value; `T` is that type (its
                // DTYPE matches), and the bytes hold `numel` of them for as long as `l`.
                Some(unsafe {
                    std::slice::from_raw_parts(l.ptr.cast::<T>(), l.len_bytes / size_of::<T>())
                })
            }
            Storage::Lent(_) => None,
        }
    }

    /// Same data, new shape (element counts must agree).
    pub fn reshaped(self, shape: Vec<usize>) -> Result<Tensor, ShapeMismatch> {
        let need = crate::shape::checked_numel(&shape);
        let len = self.numel();
        if need != Some(len) {
            return Err(ShapeMismatch { shape, len, need });
        }
        Ok(Tensor { shape, data: self.data })
    }

    /// Integer view of an int tensor (shape operands: axes, pads, sizes).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        match self.data() {
            TensorData::I64(v) => Some(v.clone()),
            TensorData::I32(v) => Some(v.iter().map(|&x| x as i64).collect()),
            TensorData::I16(v) => Some(v.iter().map(|&x| x as i64).collect()),
            TensorData::I8(v) => Some(v.iter().map(|&x| x as i64).collect()),
            TensorData::U8(v) => Some(v.iter().map(|&x| x as i64).collect()),
            TensorData::U16(v) => Some(v.iter().map(|&x| x as i64).collect()),
            TensorData::U32(v) => Some(v.iter().map(|&x| x as i64).collect()),
            TensorData::U64(v) => Some(v.iter().map(|&x| x as i64).collect()),
            TensorData::Lowp(l, v) => l.sub_byte().map(|i| v.iter().map(|&c| i.value(c)).collect()),
            _ => None,
        }
    }

    pub fn to_f64_vec(&self) -> Vec<f64> {
        let data = self.data();
        (0..self.numel()).map(|i| data.get_f64(i)).collect()
    }

    /// Stable content hash (dtype, shape, bytes) used by CSE and caches.
    /// This float tensor converted to another float dtype (round to nearest even), or
    /// `None` when either dtype is not a float. Planners fold casts of constants with it.
    pub fn to_float_dtype(&self, dtype: DType) -> Option<Tensor> {
        if !self.dtype().is_float() || !dtype.is_float() {
            return None;
        }
        let v = self.to_f64_vec();
        let data = match dtype {
            DType::F32 => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F64 => TensorData::F64(v),
            DType::F16 => TensorData::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => TensorData::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
            _ => return None,
        };
        Tensor::new(self.shape().to_vec(), data).ok()
    }

    pub fn content_hash(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.dtype().name().as_bytes());
        for d in &self.shape {
            h.update((*d as u64).to_le_bytes());
        }
        h.update(self.le_bytes());
        h.finalize().into()
    }
}

/// Serialized form of a tensor: fixed-width data as base64 little-endian bytes, strings verbatim.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct TensorRepr {
    dtype: DType,
    shape: Vec<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data_b64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    strings: Option<Vec<String>>,
}

impl Serialize for Tensor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let repr = match self.dtype() {
            DType::String => TensorRepr {
                dtype: DType::String,
                shape: self.shape.clone(),
                data_b64: None,
                strings: self.as_slice::<String>().map(<[String]>::to_vec),
            },
            dtype => TensorRepr {
                dtype,
                shape: self.shape.clone(),
                data_b64: Some(base64::engine::general_purpose::STANDARD.encode(self.le_bytes())),
                strings: None,
            },
        };
        repr.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Tensor {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let repr = TensorRepr::deserialize(d)?;
        let data = match (repr.dtype, repr.strings, repr.data_b64) {
            (DType::String, Some(v), None) => TensorData::String(v),
            (dtype, None, Some(b)) if dtype != DType::String => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(D::Error::custom)?;
                TensorData::from_le_bytes(dtype, &bytes).map_err(D::Error::custom)?
            }
            _ => {
                return Err(D::Error::custom(
                    "a tensor needs `strings` (dtype string) or `data_b64` (other dtypes)",
                ));
            }
        };
        Tensor::new(repr.shape, data).map_err(D::Error::custom)
    }
}

impl JsonSchema for Tensor {
    fn schema_name() -> Cow<'static, str> {
        "Tensor".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        TensorRepr::json_schema(generator)
    }
}
