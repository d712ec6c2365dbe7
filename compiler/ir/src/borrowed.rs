//! Tensors whose elements lie in memory someone else owns and lends for a while: a worker
//! process's shared memory, where the parent wrote a run's inputs. An engine that can read
//! elements where they lie (ONNX Runtime takes a view) runs on these without the copy into a
//! [`Tensor`] that every other engine needs ([`BorrowedTensor::to_tensor`] makes it).

use crate::{DType, Element, Tensor, TensorData};

/// A tensor's dtype, shape and little-endian element bytes (as [`TensorData::le_bytes`]
/// writes them), borrowed. Nothing about the bytes is trusted: a typed view is given only
/// where the bytes are whole, aligned elements of the dtype.
#[derive(Debug, Clone, Copy)]
pub struct BorrowedTensor<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl<'a> BorrowedTensor<'a> {
    /// The elements as `T` where they lie: when `T` is the dtype's element type, the bytes
    /// are aligned for it and as many as the shape says, on a little-endian host. `None`
    /// otherwise (bool and string elements have no such view: a bool byte other than 0 or
    /// 1 is no `bool`); the caller copies with [`BorrowedTensor::to_tensor`] instead.
    pub fn elements<T: Element + bytemuck::Pod>(&self) -> Option<&'a [T]> {
        if T::DTYPE != self.dtype || cfg!(target_endian = "big") {
            return None;
        }
        let elements = bytemuck::try_cast_slice::<u8, T>(self.bytes).ok()?;
        (Some(elements.len()) == crate::shape::checked_numel(self.shape)).then_some(elements)
    }

    /// An owned copy: the elements checked against the shape, as for any tensor.
    pub fn to_tensor(&self) -> Result<Tensor, String> {
        self.to_tensor_in(None)
    }

    /// [`BorrowedTensor::to_tensor`], copied into `reuse`'s elements when it has this dtype
    /// and shape and nothing else holds them (the same input of a run before: no
    /// allocation, no page to fault in, no zeroing), else into new ones.
    pub fn to_tensor_in(&self, reuse: Option<Tensor>) -> Result<Tensor, String> {
        if let Some(mut kept) = reuse
            && kept.dtype() == self.dtype
            && kept.shape() == self.shape
            && kept.data_mut().is_some_and(|d| d.copy_from_le_bytes(self.bytes))
        {
            return Ok(kept);
        }
        let data = TensorData::from_le_bytes(self.dtype, self.bytes)?;
        Tensor::new(self.shape.to_vec(), data).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn a_view_is_given_only_for_whole_aligned_elements_of_the_dtype() {
        let t = Tensor::from_vec(vec![2, 2], vec![1.0f32, -2.0, f32::NAN, 4.0]).unwrap();
        let bytes = t.data().le_bytes();
        let b = BorrowedTensor { dtype: DType::F32, shape: &[2, 2], bytes: &bytes };
        let v = b.elements::<f32>().expect("aligned f32 elements");
        assert_eq!(v.as_ptr().cast::<u8>(), bytes.as_ptr(), "where they lie, not a copy");
        assert_eq!(v[..2], [1.0, -2.0]);
        assert!(v[2].is_nan());
        assert_eq!(b.to_tensor().unwrap().data().le_bytes(), bytes);

        assert!(b.elements::<i32>().is_none(), "another dtype's element type");
        let wrong_shape = BorrowedTensor { shape: &[3], ..b };
        assert!(wrong_shape.elements::<f32>().is_none(), "more bytes than the shape's elements");
        assert!(wrong_shape.to_tensor().is_err());
        let huge = BorrowedTensor { shape: &[usize::MAX, 2], ..b };
        assert!(huge.elements::<f32>().is_none() && huge.to_tensor().is_err());

        // Misaligned bytes: no view, a copy still reads them.
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(&bytes);
        let odd = BorrowedTensor { bytes: &shifted[1..], ..b };
        if odd.bytes.as_ptr().align_offset(4) != 0 {
            assert!(odd.elements::<f32>().is_none());
        }
        assert_eq!(odd.to_tensor().unwrap().data().le_bytes(), bytes);
        let cut = BorrowedTensor { bytes: &bytes[..7], ..b };
        assert!(cut.elements::<f32>().is_none() && cut.to_tensor().is_err());

        let h = Tensor::from_vec(vec![1], vec![f16::from_f32(1.5)]).unwrap();
        let hb = h.data().le_bytes();
        let b = BorrowedTensor { dtype: DType::F16, shape: &[1], bytes: &hb };
        assert_eq!(b.elements::<f16>().unwrap(), [f16::from_f32(1.5)]);
    }

    #[test]
    fn bool_and_string_bytes_are_only_copied() {
        let flags = [0u8, 1, 7];
        let b = BorrowedTensor { dtype: DType::Bool, shape: &[3], bytes: &flags };
        assert_eq!(b.to_tensor().unwrap().as_slice::<bool>().unwrap(), [false, true, true]);
        let s = Tensor::from_vec(vec![1], vec!["héllo".to_string()]).unwrap();
        let sb = s.data().le_bytes();
        let b = BorrowedTensor { dtype: DType::String, shape: &[1], bytes: &sb };
        assert_eq!(b.to_tensor().unwrap(), s);
        let garbage = BorrowedTensor { bytes: &[0xff; 9], ..b };
        assert!(garbage.to_tensor().is_err());
    }
}
