//! Page-locked staging for host ↔ device copies under `memory.pinned_host`. A copy from a
//! tensor's own (pageable) pages makes the driver stage it through a small pinned buffer of
//! its own, one chunk at a time; here two pinned buffers of [`CHUNK`] bytes take turns: the
//! host fills one (its copy split over a few threads) while the device's DMA engine reads
//! the other, and the reverse for downloads. Tensors under [`MIN_BYTES`] go straight
//! through pageable memory, where the staging copy would cost more than it saves. The
//! buffers are made once per context generation, at the first pinned transfer.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, PinnedHostSlice};

/// Bytes per staging buffer (two are kept).
pub const CHUNK: usize = 8 << 20;

/// Tensors smaller than this are copied from pageable memory directly.
pub const MIN_BYTES: usize = 1 << 20;

/// Most threads a chunk's host copy is split over: one core neither fills host memory
/// bandwidth nor, on a download into a fresh tensor, takes its page faults fast enough
/// (the DMA engine moves pinned memory at the link's rate).
const COPY_THREADS: usize = 8;

/// The two staging buffers of one context and the events marking their last device copy.
pub struct Staging {
    buffers: [PinnedHostSlice<u8>; 2],
    done: [CudaEvent; 2],
}

/// `src` into `dst` (equal lengths), split over [`COPY_THREADS`] threads when large.
fn copy_parallel(dst: &mut [u8], src: &[u8]) {
    if src.len() < (1 << 20) {
        dst.copy_from_slice(src);
        return;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(COPY_THREADS);
    let part = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(part).zip(src.chunks(part)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

impl Staging {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Staging, DriverError> {
        // SAFETY: the memory starts uninitialised; every byte read from it — by a device
        // copy (upload) or by the host (download) — is first written by the other side.
        let a = unsafe { ctx.alloc_pinned_with_flags::<u8>(CHUNK, 0) }?;
        // SAFETY: as above.
        let b = unsafe { ctx.alloc_pinned_with_flags::<u8>(CHUNK, 0) }?;
        Ok(Staging { buffers: [a, b], done: [ctx.new_event(None)?, ctx.new_event(None)?] })
    }

    /// `src` into device memory at `dst` (at least `src.len()` bytes), ordered on `stream`,
    /// returning when the copy is complete.
    pub fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &[u8],
        dst: CUdeviceptr,
    ) -> Result<(), DriverError> {
        for (i, chunk) in src.chunks(CHUNK).enumerate() {
            let k = i % 2;
            // The device copy that last read buffer k is done before the host writes it.
            self.done[k].synchronize()?;
            let buf = &mut self.buffers[k].as_mut_slice()?[..chunk.len()];
            copy_parallel(buf, chunk);
            // SAFETY: `dst + i·CHUNK` has `chunk.len()` bytes left of the caller's
            // allocation; the pinned source stays untouched until `done[k]` fires, which
            // the next write to it (or the final synchronize) waits for.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    dst + (i * CHUNK) as u64,
                    buf,
                    stream.cu_stream(),
                )
            }?;
            self.done[k].record(stream)?;
        }
        stream.synchronize()
    }

    /// Device memory at `src` (at least `out.len()` bytes) into `out`, ordered on `stream`.
    pub fn download(
        &mut self,
        stream: &Arc<CudaStream>,
        src: CUdeviceptr,
        out: &mut [u8],
    ) -> Result<(), DriverError> {
        let total = out.len();
        let chunks = total.div_ceil(CHUNK);
        let len = move |i: usize| CHUNK.min(total - i * CHUNK);
        let issue = |me: &mut Staging, i: usize| -> Result<(), DriverError> {
            let k = i % 2;
            let buf = &mut me.buffers[k].as_mut_slice()?[..len(i)];
            // SAFETY: `src + i·CHUNK` has `len(i)` bytes of the caller's allocation; the
            // host reads buffer k only after `done[k]` fires.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    buf,
                    src + (i * CHUNK) as u64,
                    stream.cu_stream(),
                )
            }?;
            me.done[k].record(stream)
        };
        for i in 0..chunks.min(2) {
            issue(self, i)?;
        }
        for i in 0..chunks {
            let k = i % 2;
            self.done[k].synchronize()?;
            let at = i * CHUNK;
            copy_parallel(&mut out[at..at + len(i)], &self.buffers[k].as_slice()?[..len(i)]);
            if i + 2 < chunks {
                issue(self, i + 2)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parallel_copy_copies_every_byte_at_any_length() {
        for n in [0, 1, 4095, 1 << 20, (1 << 20) + 13, 3 * (1 << 20) + 7] {
            let src: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
            let mut dst = vec![0u8; n];
            copy_parallel(&mut dst, &src);
            assert_eq!(dst, src, "{n}");
        }
    }
}
