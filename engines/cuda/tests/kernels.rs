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

#[test]
fn max_and_min_propagate_nan_and_take_plus_zero_as_the_larger_zero_like_the_cpu_engine() {
    // Elementwise and over rows, with NaN and ±0 in either operand order. Elementwise the
    // generated selects give the cpu engine's (numpy's) bits: a NaN wins, a tie gives the
    // first operand. Over rows a NaN wins and the value is the cpu engine's; the sign of a
    // zero result is +0 for max, -0 for min whatever the order (a warp's lanes agree).
    let text = r#"graph "mm" {
  %0: f32[4,8] = input "x"
  %1: f32[4,8] = input "y"
  %2: i64[1] = constant {value = tensor<i64[1]> [-1]}
  %3: f32[4,8] = max(%0, %1)
  %4: f32[4,8] = min(%0, %1)
  %5: f32[4,1] = reduce_max(%0, %2)
  %6: f32[4,1] = reduce_min(%0, %2)
  return "max" = %3
  return "min" = %4
  return "rmax" = %5
  return "rmin" = %6
}"#;
    let g = xpu_ir::text::parse(text).unwrap();
    let specials = [0.0f32, -0.0, f32::NAN, 1.5, -2.0, f32::INFINITY, f32::NEG_INFINITY, 0.0];
    let x: Vec<f32> = (0..32).map(|i| specials[i % 8]).collect();
    // Row 1 holds no NaN, so its reductions compare ±0 and infinities only.
    let x: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, v)| if (8..16).contains(&i) && v.is_nan() { -0.0 } else { *v })
        .collect();
    let y: Vec<f32> = (0..32).map(|i| specials[(i * 3 + 1) % 8]).collect();
    let ins: Vec<Tensor> =
        [x, y].into_iter().map(|v| Tensor::new(vec![4, 8], TensorData::F32(v)).unwrap()).collect();
    let p = xpu_lower::lower(&g, &[vec![4, 8], vec![4, 8]], &[None, None]).unwrap();
    let got = emulate(&p, &ins);
    let want = xpu_engine_cpu::run_graph(&g, &ins).unwrap().outputs;
    for (name, (a, b)) in ["max", "min", "rmax", "rmin"].iter().zip(got.iter().zip(&want)) {
        let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
        for (i, (u, v)) in a.iter().zip(&b).enumerate() {
            let same = (u.is_nan() && v.is_nan())
                || if name.starts_with('r') { u == v } else { u.to_bits() == v.to_bits() };
            assert!(same, "{name}[{i}]: host {u:?}, cpu {v:?}");
        }
    }
}

/// The loads of `input` and stores of `output` in the device and host branches of the
/// single kernel `text` lowers to (row groups merged), and whether the device branch
/// unrolls a loop fully (a kept row).
fn row_traffic(text: &str, shape: &[usize]) -> ((usize, usize), (usize, usize), bool) {
    let g = xpu_ir::text::parse(text).unwrap();
    let shapes = vec![shape.to_vec(); g.inputs.len()];
    let p = xpu_lower::lower(&g, &shapes, &vec![None; shapes.len()]).unwrap();
    let m = xpu_engine_cuda::rows::merge_row_steps(p);
    assert_eq!(m.steps.len(), 1, "{text}");
    let k = &m.steps[0].kernel;
    let src = codegen::kernel_source(k).unwrap();
    let (input, output) = (&k.buffers[0].name, &k.buffers.last().unwrap().name);
    let split = src.find("#else").unwrap();
    let (device, host) = (&src[src.find("#ifdef __CUDA_ARCH__").unwrap()..split], &src[split..]);
    let count = |s: &str| {
        let loads = s.matches(&format!("b_{input}[")).count();
        let stores = s.matches(&format!("b_{output}[")).count();
        (loads, stores)
    };
    (count(device), count(host), device.contains("XPU_UNROLL_ALL"))
}

#[test]
fn a_row_kernel_reads_and_writes_its_row_once_on_the_gpu_when_it_fits_in_registers() {
    // softmax written out (max, sum of exponentials, quotients: three walks of the input)
    // and as one op (exponentials stored, then read back for the sum and the quotients):
    // on the GPU the first walk keeps the row in registers, later walks read those, and a
    // store a later walk overwrites goes to registers only. The host branch still walks
    // memory. Rows over 32 elements a lane (2048) are not kept.
    let written = |cols: usize| {
        format!(
            "graph \"s\" {{\n  %0: f32[64,{cols}] = input \"x\"\n  %1: i64[1] = constant {{value = tensor<i64[1]> [-1]}}\n  %2: f32[64,1] = reduce_max(%0, %1)\n  %3: f32[64,{cols}] = sub(%0, %2)\n  %4: f32[64,{cols}] = exp(%3)\n  %5: f32[64,1] = reduce_sum(%4, %1)\n  %6: f32[64,{cols}] = div(%4, %5)\n  return \"y\" = %6\n}}"
        )
    };
    let op = |cols: usize| {
        format!(
            "graph \"s\" {{\n  %0: f32[64,{cols}] = input \"x\"\n  %1: f32[64,{cols}] = softmax(%0) {{axis = -1}}\n  return \"y\" = %1\n}}"
        )
    };
    // (device loads of x, device stores of y), (host loads, host stores), fully unrolled
    let (device, host, kept) = row_traffic(&written(1024), &[64, 1024]);
    assert_eq!((device, kept), ((1, 1), true), "written out");
    assert_eq!(host, (3, 1));
    let (device, host, kept) = row_traffic(&written(2048), &[64, 2048]);
    assert_eq!((device, kept), ((3, 1), false), "written out, long rows");
    assert_eq!(host, (3, 1));
    let (device, host, kept) = row_traffic(&op(1024), &[64, 1024]);
    // The op's kernel reads x once and y (its own exponentials) nowhere on the device.
    assert_eq!((device, kept), ((1, 1), true), "one op");
    assert!(host.0 >= 1 && host.1 >= 2, "{host:?}");
    let (device, _, kept) = row_traffic(&op(2048), &[64, 2048]);
    assert!(!kept && device.1 >= 2, "one op, long rows: {device:?}");
}

#[test]
fn a_vectorised_chain_takes_four_elements_a_thread_and_any_alignment_still_matches() {
    // The chains' kernels move f32 rows with 16-byte loads and stores when every such
    // buffer is 16-byte aligned; with buffers 4 bytes past alignment the same kernel takes
    // its element-at-a-time path. Both match the cpu engine.
    for name in ["gelu_chain", "softplus_chain", "silu_chain", "mish_chain"] {
        let g = program(name);
        let x = inputs(&g, 6);
        let p = lowered(&g, 6);
        let kernels: Vec<_> = p.steps.iter().map(|s| s.kernel.clone()).collect();
        let src = codegen::source(&kernels).unwrap();
        assert!(src.contains("xpu_ld4(") && src.contains("xpu_st4("), "{name}: {src}");
        for step in &p.steps {
            // A quarter of the elements: each thread's iteration takes four.
            let (band_elements, vector) =
                (6 * 1024, codegen::parallel_iterations(&step.kernel).unwrap());
            assert_eq!(vector * 4, band_elements, "{name}");
        }
        let module = HostModule::build(&src).unwrap();
        let want = xpu_engine_cpu::run_graph(&g, &x).unwrap().outputs;
        for misaligned in [false, true] {
            // Every buffer an f32 vector placed at 16-byte alignment, or 4 bytes past it.
            let place = |v: &[f32]| -> (Vec<f32>, usize) {
                let mut store = vec![0f32; v.len() + 8];
                let base = store.as_ptr() as usize;
                let start = (0..4).find(|o| (base + o * 4).is_multiple_of(16)).unwrap()
                    + usize::from(misaligned);
                store[start..start + v.len()].copy_from_slice(v);
                (store, start)
            };
            let mut values: Vec<(Vec<f32>, usize)> =
                p.values.iter().map(|v| place(&vec![0f32; v.shape.iter().product()])).collect();
            let mut ins: Vec<(Vec<f32>, usize)> = x
                .iter()
                .map(|t| place(&t.to_f64_vec().iter().map(|&v| v as f32).collect::<Vec<_>>()))
                .collect();
            for step in &p.steps {
                let mut ptrs: Vec<*mut u8> = step
                    .buffers
                    .iter()
                    .map(|s| {
                        let (store, at) = match s {
                            Slot::Input(i) => &mut ins[*i],
                            Slot::Computed(v) => &mut values[*v],
                            Slot::Constant(_) => panic!("{name}: constants are folded"),
                        };
                        store[*at..].as_mut_ptr() as *mut u8
                    })
                    .collect();
                // SAFETY: each pointer is the start of an f32 vector as long as the value
                // the kernel was lowered for; only Computed vectors are written.
                unsafe { module.run(&step.kernel.name, &mut ptrs, 3, 37) }.unwrap();
            }
            for (slot, b) in p.outputs.iter().zip(&want) {
                let Slot::Computed(v) = slot else { panic!("{name}: output is computed") };
                let (store, at) = &values[*v];
                let got = &store[*at..*at + b.to_f64_vec().len()];
                for (i, (u, w)) in got.iter().zip(b.to_f64_vec()).enumerate() {
                    let u = *u as f64;
                    assert!(
                        (u - w).abs() <= 1e-5 * w.abs().max(1.0),
                        "{name}[{i}] misaligned {misaligned}: {u} vs {w}"
                    );
                }
            }
        }
    }
}
