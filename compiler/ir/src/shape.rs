//! Shapes with static, symbolic and unknown dimensions, and tensor types.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::DType;

/// One dimension: a known size, a named symbol (`N`, `batch`) bound at run time, or unknown (`?`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Dim {
    Known(u64),
    Sym(String),
    #[serde(with = "unknown_dim")]
    #[schemars(with = "UnknownDimRepr")]
    Unknown,
}

/// JSON spelling of an unknown dimension: the string "?" would collide with symbols, so it is null.
#[derive(JsonSchema)]
#[allow(dead_code)]
struct UnknownDimRepr(());

mod unknown_dim {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(s: S) -> Result<S::Ok, S::Error> {
        s.serialize_none()
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
        Option::<()>::deserialize(d).map(|_| ())
    }
}

impl Dim {
    pub fn known(&self) -> Option<u64> {
        match self {
            Dim::Known(n) => Some(*n),
            _ => None,
        }
    }

    /// Whether two dims can describe the same run-time extent.
    pub fn compatible(&self, other: &Dim) -> bool {
        match (self, other) {
            (Dim::Known(a), Dim::Known(b)) => a == b,
            _ => true,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// The type of a value: element type plus shape; `dims == None` means the rank is unknown.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct TensorType {
    pub dtype: DType,
    pub dims: Option<Vec<Dim>>,
}

impl TensorType {
    pub fn new(dtype: DType, dims: Vec<Dim>) -> Self {
        TensorType { dtype, dims: Some(dims) }
    }

    pub fn of_shape(dtype: DType, shape: &[usize]) -> Self {
        TensorType { dtype, dims: Some(shape.iter().map(|&d| Dim::Known(d as u64)).collect()) }
    }

    pub fn unranked(dtype: DType) -> Self {
        TensorType { dtype, dims: None }
    }

    pub fn rank(&self) -> Option<usize> {
        self.dims.as_ref().map(Vec::len)
    }

    /// The static shape, when every dim is known.
    pub fn static_shape(&self) -> Option<Vec<usize>> {
        self.dims.as_ref()?.iter().map(|d| d.known().map(|n| n as usize)).collect()
    }

    /// Element count when static (and representable).
    pub fn numel(&self) -> Option<usize> {
        checked_numel(&self.static_shape()?)
    }

    /// Whether a value of type `other` may flow where `self` is declared.
    pub fn compatible(&self, other: &TensorType) -> bool {
        if self.dtype != other.dtype {
            return false;
        }
        match (&self.dims, &other.dims) {
            (Some(a), Some(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.compatible(y))
            }
            _ => true,
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        match &self.dims {
            None => f.write_str("*")?,
            Some(dims) => {
                for (i, d) in dims.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{d}")?;
                }
            }
        }
        f.write_str("]")
    }
}

/// The element count of a shape; `None` when it does not fit in `usize` (a shape from
/// untrusted input must not wrap around to a small count).
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}
