//! ONNX TensorProto `.pb` files (test data sets): read to a tensor or refused.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = xpu_tensorfile::read_bytes("fuzz.pb", "pb", bytes);
});
