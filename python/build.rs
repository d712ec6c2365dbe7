//! The native module finds DuckDB's library beside itself (the wheel carries it in the
//! `xpu` package directory): an `$ORIGIN` run path on the module alone.

fn main() {
    println!("cargo:rustc-link-arg-cdylib=-Wl,-rpath,$ORIGIN");
}
