//! The executing cuda engine, as far as it can be checked without a GPU: its availability
//! is the driver probe's verdict (a reason here, never a panic), its memory plans keep
//! values alive at once apart while sharing the bytes of dead ones, its launch shapes cover
//! every iteration, and its images (cubins for an exact architecture) are made by NVRTC and
//! cached on disk.

mod common;

use common::{CHAINS_AND_ROWS, lowered, program};
use xpu_engine::{Availability, Engine, EngineError, HostMemory};
use xpu_engine_cuda::arena::{ALIGN, ArenaPlan};
use xpu_engine_cuda::toolkit::Math;
use xpu_engine_cuda::{CudaConfig, CudaEngine, codegen, image, toolkit};
use xpu_lower as lower;

/// The chains and row groups, and two programs with matrix products.
fn programs() -> impl Iterator<Item = &'static str> {
    CHAINS_AND_ROWS.iter().copied().chain(["mlp", "matmul_square"])
}

#[test]
fn availability_is_the_driver_probes_verdict() {
    let engine = CudaEngine::new(CudaConfig::default());
    let caps = engine.capabilities();
    match toolkit::probe_driver(None) {
        Err(reason) => {
            assert_eq!(caps.availability, Availability::Unavailable { reason: reason.clone() });
            assert!(reason.contains("libcuda") || reason.contains("device"), "{reason}");
            assert!(caps.kernels.is_empty() && caps.devices.is_empty());
            assert!(!engine.device_memory(xpu_engine_cuda::DEVICE));
            let g = program("gelu_chain");
            let err = engine.prepare(&g, &xpu_engine::Assignment::new("cuda")).err().unwrap();
            assert!(
                matches!(err, EngineError::Unavailable { ref engine, .. } if engine == "cuda"),
                "{err}"
            );
            let t = xpu_ir::Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap();
            for host in [HostMemory::Pageable, HostMemory::Pinned] {
                assert!(matches!(
                    engine.upload(&t, xpu_engine_cuda::DEVICE, host),
                    Err(EngineError::Unavailable { .. })
                ));
            }
            assert_eq!(engine.pinned_staging(xpu_engine_cuda::DEVICE), None);
        }
        Ok(facts) => {
            assert!(caps.availability.is_available(), "{:?}", caps.availability);
            assert_eq!(caps.devices[0].name, facts.name);
            assert!(caps.kernels.iter().any(|k| k.name == "cuda.fused"));
        }
    }
    // What the engine does not run is said, whatever the machine.
    let missing = xpu_engine_cuda::engine::missing_kernels(Err("no cuBLASLt here"));
    assert_eq!(missing["cuda.cublaslt"], "no cuBLASLt here");
    assert!(missing.contains_key("cuda.flash_v2"));
    let loaded = xpu_engine_cuda::engine::missing_kernels(Ok(()));
    assert!(!loaded.contains_key("cuda.cublaslt") && loaded.contains_key("cuda.flash_v2"));
    // cuBLASLt claims matmul in f32, f16 and bf16 only when it is loaded.
    let with = xpu_engine_cuda::engine::kernels(true);
    let lt = with.iter().find(|k| k.name == "cuda.cublaslt").expect("claimed when loaded");
    assert_eq!(lt.ops, vec![xpu_ir::Op::MatMul, xpu_ir::Op::Gemm]);
    assert!(lt.dtypes.contains(&xpu_ir::DType::BF16) && !lt.dtypes.contains(&xpu_ir::DType::F64));
    assert!(!xpu_engine_cuda::engine::kernels(false).iter().any(|k| k.name == "cuda.cublaslt"));
    // The planner takes an engine's kernels in its order where a policy prefers none: a
    // product goes to cuBLASLt before the reference loop nest.
    let order: Vec<&str> = with.iter().map(|k| k.name.as_str()).collect();
    let pos = |n: &str| order.iter().position(|k| *k == n).unwrap();
    assert!(pos("cuda.cublaslt") < pos("cuda.naive"), "{order:?}");
}

#[test]
fn arena_plans_keep_live_values_apart_and_reuse_dead_ones() {
    for name in programs() {
        let p = lowered(&program(name), 8);
        let plan = ArenaPlan::of(&p);
        assert_eq!(plan.overlapping(), None, "{name}: two live values share bytes");
        let total: u64 = plan.placements.iter().flatten().map(|p| p.bytes).sum();
        assert!(plan.bytes >= plan.peak_live, "{name}: below the live peak");
        assert!(
            plan.bytes <= total.next_multiple_of(ALIGN) + ALIGN * p.values.len() as u64,
            "{name}"
        );
        for (v, place) in plan.placements.iter().enumerate() {
            let place = place.unwrap_or_else(|| panic!("{name}: value {v} unplaced"));
            assert_eq!(place.offset % ALIGN, 0, "{name}: value {v} misaligned");
            assert!(place.first <= place.last);
        }
    }
}

#[test]
fn arena_reuses_the_bytes_of_a_value_once_it_is_dead() {
    // Four matrix products in a row, each stored (a product is never recomputed): the first
    // product's bytes are free once the second has read it.
    let src = r#"graph "chain" {
  %0: f32[64,64] = input "x"
  %1: f32[64,64] = matmul(%0, %0)
  %2: f32[64,64] = matmul(%1, %1)
  %3: f32[64,64] = matmul(%2, %2)
  %4: f32[64,64] = matmul(%3, %3)
  return "y" = %4
}"#;
    let g = xpu_ir::text::parse(src).unwrap();
    let p = lower::lower(&g, &[vec![64, 64]], &[None]).unwrap();
    assert!(p.values.len() >= 3, "{} values", p.values.len());
    let plan = ArenaPlan::of(&p);
    let total: u64 = plan.placements.iter().flatten().map(|p| p.bytes).sum();
    assert_eq!(plan.overlapping(), None);
    assert!(plan.bytes < total, "no reuse: {} of {total} bytes", plan.bytes);
    assert_eq!(plan.bytes, plan.peak_live.next_multiple_of(ALIGN));
}

#[test]
fn launch_shapes_cover_every_iteration() {
    for name in programs() {
        for step in &lowered(&program(name), 37).steps {
            let n = codegen::parallel_iterations(&step.kernel).unwrap();
            assert!(n >= 1, "{name}/{}", step.kernel.name);
            for sms in [1, 132] {
                let grid = codegen::grid_for(n, sms) as u64;
                assert!(grid >= 1 && grid <= sms as u64 * 32);
                // One thread per iteration until the cap; the grid-stride loop covers the
                // rest, so a capped grid is full.
                if grid < sms as u64 * 32 {
                    assert!(grid * codegen::BLOCK as u64 >= n, "{name}: {grid} blocks for {n}");
                }
            }
        }
    }
    assert_eq!(codegen::grid_for(0, 132), 1);
    assert_eq!(codegen::grid_for(u64::MAX, 132), 132 * 32);
}

#[test]
fn cubins_for_an_exact_architecture_are_made_and_kept_on_disk() {
    let p = lowered(&program("softmax_rows"), 4);
    let kernels: Vec<_> = p.steps.iter().map(|s| s.kernel.clone()).collect();
    let source = codegen::source(&kernels).unwrap();
    for arch in ["sm_80", "sm_90"] {
        let cubin = toolkit::compile_cubin(&source, "softmax_rows", arch).unwrap();
        assert_eq!(&cubin[..4], b"\x7fELF", "{arch}: not an ELF image");
    }
    let dir = tempfile::tempdir().unwrap();
    let built = image::build(&source, "sm_90", Math::Strict, Some(dir.path())).unwrap();
    assert!(built.cubin && built.what == "cubin sm_90", "{}", built.what);
    let key = image::key(&source, "sm_90", Math::Strict).unwrap();
    let on_disk = std::fs::read(dir.path().join(format!("{key}.cubin"))).unwrap();
    assert_eq!(on_disk, *built.bytes);
    // A key differs by architecture and by source.
    assert_ne!(key, image::key(&source, "sm_80", Math::Strict).unwrap());
    assert_ne!(key, image::key(&format!("{source}\n"), "sm_90", Math::Strict).unwrap());
    // The math mode is part of the key: a contracted image never answers a strict request.
    assert_ne!(key, image::key(&source, "sm_90", Math::Contracted).unwrap());
    // Contracted math divides with NVIDIA's approximate form and fuses products into adds;
    // strict math keeps IEEE division and no contraction (softmax divides by its sum).
    let strict = toolkit::compile_ptx_with(&source, "softmax_rows", "sm_90", Math::Strict).unwrap();
    let fast =
        toolkit::compile_ptx_with(&source, "softmax_rows", "sm_90", Math::Contracted).unwrap();
    assert!(strict.contains("div.rn.f32") && !fast.contains("div.rn.f32"));
    assert!(fast.contains("div.full.f32") || fast.contains("div.approx"), "{fast}");
    let cubin = toolkit::compile_cubin_with(&source, "softmax_rows", "sm_90", Math::Contracted);
    assert_eq!(&cubin.unwrap()[..4], b"\x7fELF");
    // Source NVRTC rejects is an error naming it, not a crash.
    let err = toolkit::compile_cubin("extern \"C\" __global__ void k() { oops; }", "bad", "sm_90")
        .unwrap_err();
    assert!(err.to_string().contains("bad") && err.to_string().contains("oops"), "{err}");
}

#[test]
fn a_toolkit_newer_than_the_driver_is_refused_with_both_versions() {
    use xpu_engine_cuda::engine::toolkit_mismatch;
    let why = toolkit_mismatch(12080, (13, 0)).unwrap();
    assert!(why.contains("NVRTC 13.0") && why.contains("12.8"), "{why}");
    assert_eq!(toolkit_mismatch(13000, (13, 0)), None);
    assert_eq!(toolkit_mismatch(13010, (12, 9)), None);
    assert_eq!(toolkit_mismatch(12090, (12, 8)), None);
}
