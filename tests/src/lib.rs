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

/// The golden-file check of filetests and plan files: `Ok` when `actual` equals `expected`;
/// under `XPU_BLESS=1` rewrites `path` as `header`, `separator`, `actual`; otherwise a
/// unified diff.
pub fn check_golden(
    path: &std::path::Path,
    header: &str,
    separator: &str,
    expected: &str,
    actual: &str,
) -> Result<(), String> {
    if actual == expected {
        return Ok(());
    }
    if bless() {
        std::fs::write(path, format!("{}\n{separator}\n{actual}", header.trim_end()))
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    let diff = similar::TextDiff::from_lines(expected, actual)
        .unified_diff()
        .header("expected", "actual")
        .to_string();
    Err(format!("output differs (XPU_BLESS=1 to accept):\n{diff}"))
}
