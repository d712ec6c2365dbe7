//! Workspace-level test support: the ONNX node-suite conformance runner (used by the
//! `conformance` test and the `xpu-conformance` binary) and the repository root.

pub mod conformance;

use std::path::PathBuf;

/// The repository root (this crate lives in `tests/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Whether golden files should be rewritten instead of compared (`XPU_BLESS=1`).
pub fn bless() -> bool {
    std::env::var("XPU_BLESS").is_ok_and(|v| v == "1")
}
