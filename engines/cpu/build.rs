//! Links the system OpenBLAS when the `openblas` feature is on (the `cpu.blas` kernel).

fn main() {
    if std::env::var_os("CARGO_FEATURE_OPENBLAS").is_some() {
        println!("cargo:rustc-link-lib=dylib=openblas");
    }
}
