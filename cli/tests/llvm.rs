//! The llvm engine through xpuctl: `run` under `llvm-host` explains what ran on llvm and the
//! compile (then the disk cache); `ir lir` prints the kernels; `build --target riscv64`
//! writes a build whose `run` gives the same output under qemu; programs llvm cannot take
//! whole are refused with the nodes named.

use std::process::Command;

mod common;

/// xpuctl with its llvm disk cache under `cache`.
fn xpuctl(args: &[&str], cache: &std::path::Path) -> (i32, String, String) {
    common::xpuctl_env(args, &[("XPU_CACHE_DIR", cache.to_str().unwrap())])
}

/// A .npy of f32 (C order) with values from a small formula.
fn npy(path: &std::path::Path, shape: &[usize]) {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 25.0 - 2.0).collect();
    common::write_npy_f32(path, shape, &data);
}

#[test]
fn run_ir_lir_and_a_riscv64_build_agree() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (x, b) = (dir.path().join("x.npy"), dir.path().join("b.npy"));
    npy(&x, &[4, 1024]);
    npy(&b, &[1024]);
    let host_out = dir.path().join("host");
    let args = |out: &std::path::Path| {
        vec![
            "run".to_string(),
            "tests/programs/gelu_chain.sgr".into(),
            "--policy".into(),
            "llvm-host".into(),
            "-i".into(),
            format!("x={}", x.display()),
            "-i".into(),
            format!("b={}", b.display()),
            "--explain".into(),
            "--out".into(),
            out.display().to_string(),
        ]
    };
    let first: Vec<String> = args(&host_out);
    let (code, out, err) = xpuctl(&first.iter().map(String::as_str).collect::<Vec<_>>(), &cache);
    assert_eq!(code, 0, "{err}{out}");
    assert!(out.contains("llvm.fused"), "{out}");
    assert!(out.contains("(compiled)"), "the first run compiles: {out}");
    let (code, out, err) = xpuctl(&first.iter().map(String::as_str).collect::<Vec<_>>(), &cache);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(disk cache)"), "a second process loads from disk: {out}");

    let (code, out, err) =
        xpuctl(&["ir", "lir", "tests/programs/softmax_rows.sgr", "--bind", "N=2"], &cache);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("reduce max : f32 lanes 8"), "{out}");
    assert_eq!(out.matches("kernel @").count(), 3, "{out}");
    let (code, out, _) = xpuctl(
        &["ir", "lir", "tests/programs/gelu_chain.sgr", "--bind", "N=2", "--emit", "llvm-ir"],
        &cache,
    );
    assert_eq!(code, 0);
    assert!(out.contains("define void @xpu_"), "{out}");
    let (code, _, err) = xpuctl(&["ir", "lir", "tests/programs/gelu_chain.sgr"], &cache);
    assert_ne!(code, 0);
    assert!(err.contains("--bind N=SIZE"), "{err}");

    let build = dir.path().join("board");
    let (code, _, err) = xpuctl(
        &[
            "build",
            "tests/programs/gelu_chain.sgr",
            "--target",
            "riscv64",
            "--bind",
            "N=4",
            "-o",
            &build.display().to_string(),
        ],
        &cache,
    );
    assert_eq!(code, 0, "{err}");
    let board_out = dir.path().join("board-out");
    let run = Command::new(build.join("run"))
        .arg("--input")
        .arg(format!("x={}", x.display()))
        .arg("--input")
        .arg(format!("b={}", b.display()))
        .arg("--out")
        .arg(&board_out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    // The same bits as the host JIT (the .npy headers may differ in padding).
    let data = |p: std::path::PathBuf| xpu_runtime::tensors::read(&p).unwrap().1;
    assert_eq!(data(board_out.join("y.npy")), data(host_out.join("y.npy")));

    // An RVV build, written to a directory named relative to the working directory: its
    // `run` enables the vector extension under qemu, and the bits are the host JIT's.
    let program = common::repo().join("tests/programs/gelu_chain.sgr");
    let built = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .args(["build", &program.display().to_string(), "--target", "riscv64"])
        .args(["--bind", "N=4", "--cpu", "rv64gcv", "-o", "rvv"])
        .env("XPU_CACHE_DIR", &cache)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let manifest = std::fs::read_to_string(dir.path().join("rvv/manifest.json")).unwrap();
    assert!(manifest.contains("\"isa\": \"rv64gcv\""), "{manifest}");
    let rvv_out = dir.path().join("rvv-out");
    let run = Command::new(dir.path().join("rvv/run"))
        .arg("--input")
        .arg(format!("x={}", x.display()))
        .arg("--input")
        .arg(format!("b={}", b.display()))
        .arg("--out")
        .arg(&rvv_out)
        .env_remove("XPU_RISCV_RUNNER")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(data(rvv_out.join("y.npy")), data(host_out.join("y.npy")));
    // An ISA xpu does not build for is a usage error naming the ones it does.
    let bad = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .args(["build", &program.display().to_string(), "--target", "riscv64"])
        .args(["--bind", "N=4", "--cpu", "rv32gc", "-o", "bad"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("rv32gc") && err.contains("known: rv64gc, rv64gcv"), "{err}");

    let (code, _, err) = xpuctl(
        &[
            "build",
            "tests/programs/convnet.sgr",
            "--target",
            "riscv64",
            "-o",
            &dir.path().join("no").display().to_string(),
        ],
        &cache,
    );
    assert_ne!(code, 0);
    assert!(err.contains("n0 (conv \"conv1\") on cpu"), "{err}");
}
