//! Large tensor buffers ask the kernel for transparent huge pages, as numpy does for its
//! arrays: a 36 MB buffer is ~9,000 first-touch page faults in 4 KiB pages and ~18 in 2 MiB
//! ones (several percent of a 3072³ product's time, and of reading its inputs).

/// Buffers at least this large get the advice.
pub const HUGE_PAGE_THRESHOLD: usize = 4 << 20;

/// Advises the whole 2 MiB pages inside `[start, start + bytes)` to be backed by huge pages
/// when `bytes` reaches [`HUGE_PAGE_THRESHOLD`] (Linux; elsewhere nothing). Only advice: the
/// buffer's contents and validity do not change, and a kernel without THP ignores it.
pub fn advise_huge_pages(start: *const u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGE_THRESHOLD {
        const HUGE: usize = 2 << 20;
        let start = start as usize;
        let aligned = start.next_multiple_of(HUGE);
        let end = (start + bytes) & !(HUGE - 1);
        if end > aligned {
            // SAFETY: the range lies inside the caller's allocation of `bytes` bytes at
            // `start`; MADV_HUGEPAGE is only advice and changes neither contents nor validity.
            unsafe {
                libc::madvise(aligned as *mut libc::c_void, end - aligned, libc::MADV_HUGEPAGE)
            };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, bytes);
}
