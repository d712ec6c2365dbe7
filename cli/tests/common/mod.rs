//! Helpers shared by xpuctl's integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Runs xpuctl in the repository root (paths in output are repo-relative) with `env` set:
/// (exit code, stdout, stderr).
pub fn xpuctl_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_xpuctl"));
    cmd.args(args).current_dir(repo());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("xpuctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`xpuctl_env`] with the environment as it is.
pub fn xpuctl(args: &[&str]) -> (i32, String, String) {
    xpuctl_env(args, &[])
}

/// A minimal little-endian f32 .npy file.
pub fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) {
    let shape_s = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_s}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}
