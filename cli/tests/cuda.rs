//! `xpuctl build --target cuda`: each llvm partition's kernels as CUDA C++ and PTX with a
//! manifest; the PTX assembles with ptxas for the architecture asked; bad architectures
//! and unbound sizes are errors that name them.

mod common;

/// Exit code and stderr.
fn xpuctl(args: &[&str]) -> (i32, String) {
    let (code, _, err) = common::xpuctl(args);
    (code, err)
}

#[test]
fn a_cuda_build_writes_source_ptx_and_a_manifest_that_ptxas_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gpu");
    let out_s = out.display().to_string();
    let (code, err) = xpuctl(&[
        "build",
        "tests/programs/softmax_rows.sgr",
        "--target",
        "cuda",
        "--arch",
        "sm_80",
        "--bind",
        "N=64",
        "-o",
        &out_s,
    ]);
    assert_eq!(code, 0, "{err}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["arch"], "sm_80");
    assert!(manifest["nvrtc"].as_str().unwrap().starts_with("13."), "{manifest}");
    let partitions = manifest["partitions"].as_array().unwrap();
    assert!(!partitions.is_empty());
    // At 64 rows the softmax's max, sum and division are one kernel over the rows, as the
    // engine runs it.
    assert_eq!(partitions[0]["kernels"].as_array().unwrap().len(), 1, "{manifest}");
    let ptxas = xpu_engine_cuda::toolkit::find_ptxas(None).unwrap();
    for p in partitions {
        let src = std::fs::read_to_string(out.join(p["source"].as_str().unwrap())).unwrap();
        let ptx = std::fs::read_to_string(out.join(p["ptx"].as_str().unwrap())).unwrap();
        for k in p["kernels"].as_array().unwrap() {
            let k = k.as_str().unwrap();
            assert!(src.contains(&format!("__global__ void {k}(")), "{k} not in\n{src}");
            assert!(ptx.contains(&format!(".entry {k}(")), "{k} not in the PTX");
        }
        assert!(ptx.contains(".target sm_80"), "{ptx}");
        let cubin = xpu_engine_cuda::toolkit::assemble(&ptxas, &ptx, "build", "sm_80").unwrap();
        assert_eq!(&cubin[..4], b"\x7fELF");
    }

    let (code, err) = xpuctl(&[
        "build",
        "tests/programs/softmax_rows.sgr",
        "--target",
        "cuda",
        "--arch",
        "sm_61",
        "--bind",
        "N=8",
        "-o",
        &out_s,
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown CUDA architecture `sm_61`"), "{err}");
    let (code, err) =
        xpuctl(&["build", "tests/programs/softmax_rows.sgr", "--target", "cuda", "-o", &out_s]);
    assert_ne!(code, 0);
    assert!(err.contains("--bind N=SIZE"), "{err}");
}
