//! ONNX model bytes (protobuf): imported to an SGR-ML graph or refused with an error, and
//! the verifier answers on whatever was imported.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(graph) = xpu_onnx::import_model(bytes) {
        let _ = xpu_ir::verify(&graph);
    }
});
