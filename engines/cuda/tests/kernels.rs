//! Generated CUDA kernels without a GPU: every example program's LIR-ML (the llvm engine's
//! lowering) rendered as CUDA C++, compiled by NVRTC to PTX and assembled by ptxas for
//! sm_80 and sm_90; the same source built for the host and run against the cpu engine;
//! bad sources, PTX and architectures as errors; no driver as a reason.

use xpu_engine_cuda::{codegen, host::HostModule, toolkit};
use xpu_lower::{Program, Slot};
mod common;

use common::{CHAINS_AND_ROWS as PROGRAMS, inputs, lowered, program};
use xpu_ir::{Tensor, TensorData};

/// Runs a lowered program's kernels through the host build, as an engine would on a GPU:
/// intermediates allocated per value, steps in order, on a grid of 3 blocks of 37 threads
/// (fewer threads than elements: the grid-stride loop is exercised).
fn emulate(p: &Program, inputs: &[Tensor]) -> Vec<Tensor> {
    let kernels: Vec<_> = p.steps.iter().map(|s| s.kernel.clone()).collect();
    let module = HostModule::build(&codegen::source(&kernels).unwrap()).unwrap();
    let values: Vec<TensorData> =
        p.values.iter().map(|v| TensorData::zeros(v.dtype, v.shape.iter().product())).collect();
    for step in &p.steps {
        let mut ptrs: Vec<*mut u8> = step
            .buffers
            .iter()
            .map(|s| {
                let data = match s {
                    Slot::Input(i) => inputs[*i].data(),
                    Slot::Constant(t) => t.data(),
                    Slot::Computed(v) => &values[*v],
                };
                data.as_byte_ptr().unwrap() as *mut u8
            })
            .collect();
        // SAFETY: each pointer is a live buffer of the shape and dtype the kernel was
        // lowered for; the kernels write only Computed buffers, which nothing else holds.
        unsafe { module.run(&step.kernel.name, &mut ptrs, 3, 37) }.unwrap();
    }
    p.outputs
        .iter()
        .map(|s| match s {
            Slot::Input(i) => inputs[*i].clone(),
            Slot::Constant(t) => t.clone(),
            Slot::Computed(v) => {
                Tensor::new(p.values[*v].shape.clone(), values[*v].clone()).unwrap()
            }
        })
        .collect()
}

#[test]
fn generated_kernels_run_on_the_host_and_match_the_cpu_engine() {
    let mut kernels = 0;
    for name in PROGRAMS {
        let g = program(name);
        let x = inputs(&g, 5);
        let p = lowered(&g, 5);
        kernels += p.steps.len();
        let got = emulate(&p, &x);
        let want = xpu_engine_cpu::run_graph(&g, &x).unwrap().outputs;
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.shape(), b.shape(), "{name}");
            for (i, (u, v)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
                assert!((u - v).abs() <= 1e-5 * v.abs().max(1.0), "{name}[{i}]: host {u}, cpu {v}");
            }
        }
    }
    assert!(kernels >= PROGRAMS.len(), "{kernels} kernels");
}

#[test]
fn every_generated_kernel_compiles_to_ptx_that_ptxas_assembles_for_sm80_and_sm90() {
    let nvrtc = toolkit::nvrtc(None).expect("make setup installs NVRTC");
    assert!(nvrtc.version.0 >= 12, "{nvrtc:?}");
    let ptxas = toolkit::find_ptxas(None).expect("make setup installs ptxas");
    let mut assembled = 0;
    for name in PROGRAMS {
        let g = program(name);
        let p = lowered(&g, 64);
        let kernels: Vec<_> = p.steps.iter().map(|s| s.kernel.clone()).collect();
        let src = codegen::source(&kernels).unwrap();
        for arch in ["sm_80", "sm_90"] {
            let ptx =
                toolkit::compile_ptx(&src, name, arch).unwrap_or_else(|e| panic!("{e}\n{src}"));
            assert!(ptx.contains(".entry"), "{name}: {ptx}");
            let cubin = toolkit::assemble(&ptxas, &ptx, name, arch).unwrap();
            assert_eq!(&cubin[..4], b"\x7fELF", "{name} {arch}: a cubin is an ELF file");
            assembled += kernels.len();
        }
    }
    assert_eq!(
        assembled,
        2 * PROGRAMS
            .iter()
            .map(|n| {
                let g = program(n);
                lowered(&g, 64).steps.len()
            })
            .sum::<usize>()
    );
}

#[test]
fn bad_sources_ptx_and_architectures_are_errors_naming_them() {
    let e = toolkit::compile_ptx(
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        "bad",
        "sm_90",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bad") && e.contains("undefined_thing"), "{e}");
    let e = toolkit::compile_ptx("x", "nul", "sm_90\0").unwrap_err().to_string();
    assert!(e.contains("architecture"), "{e}");
    let e = toolkit::compile_ptx(&"(".repeat(100_000), "deep", "sm_90").unwrap_err().to_string();
    assert!(e.contains("deep"), "{e}");
    let ptxas = toolkit::find_ptxas(None).unwrap();
    let e = toolkit::assemble(&ptxas, ".version 8.0\ngarbage", "junk", "sm_90")
        .unwrap_err()
        .to_string();
    assert!(e.contains("junk") && e.contains("sm_90"), "{e}");
    let e = toolkit::assemble(&ptxas, "", "x", "sm_7").unwrap_err().to_string();
    assert!(e.contains("unknown CUDA architecture `sm_7`"), "{e}");
}

#[test]
fn without_a_gpu_the_driver_probe_is_a_reason_not_a_panic() {
    let probe = toolkit::probe_driver(None);
    if std::path::Path::new("/dev/nvidia0").exists() {
        let facts = probe.unwrap();
        assert!(!facts.name.is_empty() && facts.multiprocessors > 0, "{facts:?}");
    } else {
        let reason = probe.unwrap_err();
        assert!(reason.contains("libcuda") || reason.contains("device"), "{reason}");
    }
}

#[test]
fn a_row_reduction_takes_a_warp_per_row_on_the_gpu_and_a_thread_on_the_host() {
    let text = r#"graph "s" {
  %0: f32[16,256] = input "x"
  %1: f32[16,4] = input "small"
  %2: f32[16,256] = softmax(%0) {axis = -1}
  %3: f32[16,256] = exp(%2)
  %4: f32[16,4] = softmax(%1) {axis = -1}
  return "y" = %3
  return "z" = %4
}"#;
    let g = xpu_ir::text::parse(text).unwrap();
    let p = xpu_lower::lower(&g, &[vec![16, 256], vec![16, 4]], &[None, None]).unwrap();
    let threads: Vec<u64> =
        p.steps.iter().map(|s| codegen::threads_per_iteration(&s.kernel)).collect();
    // The softmax's reductions over 256 elements take a warp; its elementwise kernels and
    // the softmax over 4 elements keep a thread per iteration.
    assert!(threads.contains(&32) && threads.contains(&1), "{threads:?}");
    for s in &p.steps {
        let src = codegen::kernel_source(&s.kernel).unwrap();
        let warp = codegen::threads_per_iteration(&s.kernel) == 32;
        assert_eq!(src.contains("__shfl_xor_sync"), warp, "{src}");
        assert_eq!(src.contains("#ifdef __CUDA_ARCH__"), warp);
    }
}

#[test]
fn row_groups_merge_into_one_kernel_that_still_matches_the_cpu_engine() {
    for name in PROGRAMS {
        let g = program(name);
        let p = lowered(&g, 64);
        let m = xpu_engine_cuda::rows::merge_row_steps(p.clone());
        // Below 64 rows nothing merges: a grid of threads covers the rows better.
        let few = lowered(&g, 37);
        assert_eq!(xpu_engine_cuda::rows::merge_row_steps(few.clone()), few, "{name}");
        if name.ends_with("_rows") {
            // softmax, layer/RMS norm and log-sum-exp: each one kernel over the rows.
            assert_eq!(m.steps.len(), 1, "{name}: {} kernels", m.steps.len());
        } else {
            assert_eq!(m, p, "{name}: nothing to merge");
        }
        let nodes = |p: &Program| p.steps.iter().map(|s| s.nodes.len()).sum::<usize>();
        assert_eq!(nodes(&m), nodes(&p), "{name}");
        // The merged kernels compute what the cpu engine does (host emulation).
        let ins = inputs(&g, 64);
        let want = xpu_engine_cpu::run_graph(&g, &ins).unwrap().outputs;
        for (a, b) in emulate(&m, &ins).iter().zip(&want) {
            let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
            let worst =
                x.iter().zip(&y).map(|(p, q)| (p - q).abs() / q.abs().max(1.0)).fold(0.0, f64::max);
            assert!(worst < 1e-5, "{name}: {worst}");
        }
    }
}
