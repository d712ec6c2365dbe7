//! `.npy` files: a tensor that reads writes back to bytes that read to the same tensor.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(tensor) = xpu_tensorfile::read_npy(bytes) else { return };
    let written = xpu_tensorfile::npy_bytes(&tensor).expect("a tensor read from .npy writes");
    let again = xpu_tensorfile::read_npy(&written).expect("written .npy reads back");
    assert_eq!(tensor.shape(), again.shape());
    let rewritten = xpu_tensorfile::npy_bytes(&again).expect("writes again");
    assert_eq!(written, rewritten, "the .npy form does not round-trip");
});
