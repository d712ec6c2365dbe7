//! The shared memory between a worker and its parent: one memfd, mapped by both. The parent
//! writes inputs from offset 0, the worker writes outputs after them; whichever side needs
//! more room grows the file, and the other maps the new length when a message says so.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use memmap2::MmapMut;
use xpu_ir::{BorrowedTensor, Tensor};

use crate::protocol::Slot;

/// Offsets of tensors in the region are multiples of this (cache lines, SIMD loads).
pub const ALIGN: usize = 64;

pub fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

pub struct Region {
    file: File,
    map: Option<MmapMut>,
}

impl Region {
    /// A new, empty region (parent side), not inherited by children but on purpose.
    pub fn create() -> io::Result<Region> {
        // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new fd
        // or -1 with errno set.
        let fd = unsafe { libc::memfd_create(c"xpu-worker".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(Region { file, map: None })
    }

    /// The region a parent handed down as `fd` (worker side).
    ///
    /// # Safety
    /// `fd` must be an open memfd this process owns and uses nowhere else.
    pub unsafe fn inherited(fd: i32) -> Region {
        // SAFETY: the caller's contract.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Region { file, map: None }
    }

    fn mapped(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    fn file_len(&self) -> io::Result<usize> {
        Ok(self.file.metadata()?.len() as usize)
    }

    /// Makes at least `len` bytes writable: grows the file (doubling, so a workload's sizes
    /// settle after a few calls) and maps whatever length the file now has.
    pub fn reserve(&mut self, len: usize) -> io::Result<()> {
        if self.mapped() >= len {
            // The mapping never outruns the file: no system call on the common path.
            return Ok(());
        }
        let have = self.file_len()?;
        if have < len {
            let grown = len.max(have.saturating_mul(2)).max(1 << 16);
            self.file.set_len(grown as u64)?;
        }
        self.remap()
    }

    /// Maps the file's current length if the mapping is shorter (the other side grew it).
    pub fn remap(&mut self) -> io::Result<()> {
        let len = self.file_len()?;
        if self.map.as_ref().is_none_or(|m| m.len() < len) && len > 0 {
            // SAFETY: the file is a memfd shared only with the one peer process; the protocol
            // gives each byte range one writer at a time (the parent before a request, the
            // worker before its reply), so no range is written while the other side reads it.
            self.map = Some(unsafe { MmapMut::map_mut(&self.file)? });
        }
        Ok(())
    }

    pub fn bytes(&self, offset: usize, len: usize) -> io::Result<&[u8]> {
        let map = self.map.as_deref().unwrap_or(&[]);
        offset
            .checked_add(len)
            .and_then(|end| map.get(offset..end))
            .ok_or_else(|| io::Error::other(format!("slot {offset}+{len} outside the region")))
    }

    pub fn bytes_mut(&mut self, offset: usize, len: usize) -> io::Result<&mut [u8]> {
        let map = self.map.as_deref_mut().unwrap_or(&mut []);
        let end = offset.checked_add(len);
        end.and_then(|end| map.get_mut(offset..end))
            .ok_or_else(|| io::Error::other(format!("slot {offset}+{len} outside the region")))
    }

    /// Writes tensors one after another from `at` (aligned), growing the region as needed;
    /// returns their slots.
    pub fn put_all(&mut self, mut at: usize, tensors: &[Tensor]) -> io::Result<Vec<Slot>> {
        let mut slots = Vec::with_capacity(tensors.len());
        for t in tensors {
            let bytes = t.le_bytes();
            self.reserve(at + bytes.len())?;
            self.bytes_mut(at, bytes.len())?.copy_from_slice(&bytes);
            let len = bytes.len();
            slots.push(Slot { dtype: t.dtype(), shape: t.shape().to_vec(), offset: at, len });
            at = align(at + len);
        }
        Ok(slots)
    }

    /// Maps what the other side grew the file to when `end` lies past this side's mapping.
    pub fn map_through(&mut self, end: usize) -> io::Result<()> {
        if end > self.mapped() {
            self.remap()?;
        }
        Ok(())
    }

    /// The tensor a slot describes, borrowed where it lies (after [`Region::map_through`]
    /// its end).
    pub fn borrowed<'a>(&'a self, slot: &'a Slot) -> io::Result<BorrowedTensor<'a>> {
        let bytes = self.bytes(slot.offset, slot.len)?;
        Ok(BorrowedTensor { dtype: slot.dtype, shape: &slot.shape, bytes })
    }

    /// The tensor a slot describes (copied out of the region), mapping what the other side
    /// grew the file to if the slot lies past this side's mapping.
    pub fn get(&mut self, slot: &Slot) -> Result<Tensor, String> {
        self.get_reusing(slot, None)
    }

    /// As [`Region::get`], into `reuse`'s elements where they fit
    /// ([`BorrowedTensor::to_tensor_in`]).
    pub fn get_reusing(&mut self, slot: &Slot, reuse: Option<Tensor>) -> Result<Tensor, String> {
        self.map_through(slot.offset.saturating_add(slot.len)).map_err(|e| e.to_string())?;
        self.borrowed(slot).map_err(|e| e.to_string())?.to_tensor_in(reuse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpu_ir::TensorData;

    #[test]
    fn a_slot_is_read_into_the_last_runs_buffer_when_nothing_else_holds_it() {
        let mut region = Region::create().unwrap();
        let first = Tensor::from_vec(vec![2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let slots = region.put_all(0, std::slice::from_ref(&first)).unwrap();
        let kept = region.get(&slots[0]).unwrap();
        assert_eq!(kept, first);
        let buffer = kept.storage_id();

        let second =
            Tensor::from_vec(vec![2, 3], vec![-1.0f32, f32::NAN, 0.5, 7.0, -0.0, 9.0]).unwrap();
        let slots = region.put_all(0, std::slice::from_ref(&second)).unwrap();
        let read = region.get_reusing(&slots[0], Some(kept)).unwrap();
        assert_eq!(read.storage_id(), buffer, "the same buffer, overwritten");
        assert_eq!(read.data().le_bytes(), second.data().le_bytes());

        // Shared with another holder: a new buffer, the holder's values untouched.
        let holder = read.clone();
        let third = Tensor::from_vec(vec![2, 3], vec![0.0f32; 6]).unwrap();
        let slots = region.put_all(0, std::slice::from_ref(&third)).unwrap();
        let fresh = region.get_reusing(&slots[0], Some(read)).unwrap();
        assert_ne!(fresh.storage_id(), holder.storage_id());
        assert_eq!(fresh, third);
        assert_eq!(holder.data().le_bytes(), second.data().le_bytes());

        // Another shape or dtype: a new buffer.
        let other = Tensor::from_vec(vec![3, 2], vec![1i64, 2, 3, 4, 5, 6]).unwrap();
        let slots = region.put_all(0, std::slice::from_ref(&other)).unwrap();
        assert_eq!(region.get_reusing(&slots[0], Some(fresh)).unwrap(), other);
    }

    #[test]
    fn elements_are_overwritten_only_by_exactly_their_bytes() {
        let mut data = TensorData::F32(vec![1.0, 2.0]);
        assert!(!data.copy_from_le_bytes(&[0; 4]), "too short");
        assert!(!data.copy_from_le_bytes(&[0; 12]), "too long");
        assert_eq!(data, TensorData::F32(vec![1.0, 2.0]));
        assert!(data.copy_from_le_bytes(&[0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]));
        assert_eq!(data, TensorData::F32(vec![1.0, 2.0]));
        let mut flags = TensorData::Bool(vec![false, true]);
        assert!(flags.copy_from_le_bytes(&[3, 0]));
        assert_eq!(flags, TensorData::Bool(vec![true, false]));
        let mut words = TensorData::String(vec!["a".into()]);
        assert!(!words.copy_from_le_bytes(&[1, 0, 0, 0, 0, 0, 0, 0, b'a']));
    }
}
