//! Compiles the vendored onnx.proto with protox (a pure-Rust protobuf compiler), so the
//! build needs no `protoc` on the machine.

fn main() {
    let files = ["proto/onnx/onnx-ml.proto", "proto/onnx/onnx-data.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"]).expect("onnx.proto compiles");
    prost_build::Config::new().compile_fds(fds).expect("prost generates Rust for onnx.proto");
}
