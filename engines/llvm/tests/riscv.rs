//! riscv64 builds run under qemu-riscv64 (installed by `make setup`): the same outputs as
//! the host JIT, bit for bit (the f32 math is LIR-ML's own sequences on both), and clear
//! errors for bad inputs.

use std::path::Path;
use std::process::Command;

use xpu_engine::{Assignment, Engine, HostMemory};
use xpu_engine_llvm::{LlvmEngine, riscv};
use xpu_ir::Tensor;

/// The .npy file the riscv64 device would be given.
fn write_npy(path: &Path, t: &Tensor) {
    std::fs::write(path, riscv::npy::encode(t).unwrap()).unwrap();
}

fn read_npy_f32(path: &Path) -> (String, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = String::from_utf8(bytes[10..10 + hlen].to_vec()).unwrap();
    let data = bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (header, data)
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 12.0
        })
        .collect()
}

fn program(name: &str, rows: usize) -> xpu_ir::Graph {
    let src = std::fs::read_to_string(format!(
        "{}/../../tests/programs/{name}.sgr",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let g = xpu_ir::text::parse(&src).unwrap();
    // Bind N by rewriting the input types (what `xpuctl build --bind N=…` does through planning).
    let text = xpu_ir::text::print(&g).replace("[N,", &format!("[{rows},"));
    xpu_ir::text::parse(&text).unwrap()
}

/// A program's inputs, generated for its bound shapes.
fn inputs_of(g: &xpu_ir::Graph) -> Vec<Tensor> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let shape: Vec<usize> = g
                .ty(v)
                .dims
                .as_ref()
                .unwrap()
                .iter()
                .map(|d| d.known().unwrap() as usize)
                .collect();
            let n = shape.iter().product();
            Tensor::from_vec(shape, values(n, i as u64 + 7)).unwrap()
        })
        .collect()
}

/// The build's `run` with `inputs` written beside it, through `runner` (`None`: the run
/// script's default); the outputs' directory and the process's output.
fn run_build(
    g: &xpu_ir::Graph,
    build: &Path,
    inputs: &[Tensor],
    runner: Option<&str>,
) -> (std::path::PathBuf, std::process::Output) {
    let dir = build.parent().unwrap();
    let mut cmd = Command::new(build.join("run"));
    match runner {
        Some(r) => cmd.env("XPU_RISCV_RUNNER", r),
        None => cmd.env_remove("XPU_RISCV_RUNNER"),
    };
    for (i, t) in inputs.iter().enumerate() {
        let name = g.value(g.inputs[i]).name.clone().unwrap();
        let path = dir.join(format!("{name}.npy"));
        write_npy(&path, t);
        cmd.arg("--input").arg(format!("{name}={}", path.display()));
    }
    let out_dir = tempfile::tempdir_in(dir).unwrap().keep();
    let out = cmd.arg("--out").arg(&out_dir).output().unwrap();
    (out_dir, out)
}

/// qemu with RVV 1.0 at a vector length of `vlen` bits.
fn qemu_rvv(vlen: u32) -> String {
    format!("qemu-riscv64 -cpu {},vlen={vlen}", riscv::QEMU_RVV_CPU)
}

#[test]
fn builds_run_under_qemu_with_the_host_jits_bits() {
    use xpu_engine::RiscvCpu;
    for (name, rows) in [("gelu_chain", 3), ("softmax_rows", 5), ("layernorm_rows", 2)] {
        let g = program(name, rows);
        let inputs = inputs_of(&g);
        let mut exe = LlvmEngine::new(None).prepare(&g, &Assignment::new("llvm")).unwrap();
        let host = exe.run(&inputs).unwrap().outputs;
        let want = host[0].as_slice::<f32>().unwrap();
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        // The scalar build under qemu's default CPU; the vector build (scalable vectors) at
        // two vector lengths: the same bits as the host everywhere.
        let runs = [
            (RiscvCpu::Rv64gc, None),
            (RiscvCpu::Rv64gcv, None),
            (RiscvCpu::Rv64gcv, Some(qemu_rvv(128))),
            (RiscvCpu::Rv64gcv, Some(qemu_rvv(256))),
        ];
        for (isa, runner) in runs {
            let what = format!("{name} {isa} {}", runner.as_deref().unwrap_or("run's default"));
            let dir = tempfile::tempdir().unwrap();
            let build = dir.path().join("build");
            let manifest =
                riscv::build(&g, &shapes, &build, isa).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(manifest.triple, "riscv64-unknown-linux-gnu");
            assert_eq!(manifest.abi, "lp64d");
            assert_eq!(manifest.isa, isa);
            let m: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(build.join("manifest.json")).unwrap(),
            )
            .unwrap();
            assert_eq!(m["inputs"][0]["name"], g.value(g.inputs[0]).name.clone().unwrap());
            assert_eq!(m["isa"], isa.name(), "the manifest records the ISA");
            let (out_dir, out) = run_build(&g, &build, &inputs, runner.as_deref());
            assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
            let (header, got) = read_npy_f32(&out_dir.join(format!("{}.npy", g.outputs[0].name)));
            assert!(header.contains("'descr': '<f4'"), "{header}");
            assert_eq!(got.len(), want.len(), "{what}");
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{what}[{i}]: riscv64 {a}, host {b}");
            }
        }
    }
}

#[test]
fn a_vector_build_on_a_cpu_without_rvv_refuses_to_start_and_says_why() {
    let g = program("gelu_chain", 2);
    let dir = tempfile::tempdir().unwrap();
    let build = dir.path().join("build");
    riscv::build(&g, &[vec![2, 1024], vec![1024]], &build, xpu_engine::RiscvCpu::Rv64gcv).unwrap();
    // A board without the extension: qemu's rv64 CPU with V turned off.
    let (_, out) = run_build(&g, &build, &inputs_of(&g), Some("qemu-riscv64 -cpu rv64,v=false"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("built for rv64gcv") && err.contains("does not implement it"), "{err}");
    assert!(err.contains("--cpu rv64gc"), "says how to build for this board: {err}");
}

/// Instructions the build's kernels (its `xpu_…` functions) execute for one run, counted
/// by qemu one instruction per translation block: repeatable, whatever the machine's load.
fn kernel_instructions(build: &Path, g: &xpu_ir::Graph, inputs: &[Tensor], runner: &str) -> u64 {
    let nm = Command::new("riscv64-linux-gnu-nm")
        .args(["--defined-only", "--print-size"])
        .arg(build.join("program"))
        .output()
        .expect("riscv64-linux-gnu-nm (binutils-riscv64-linux-gnu, with the cross gcc)");
    let ranges: Vec<(u64, u64)> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let ok = f.len() == 4 && matches!(f[2], "t" | "T") && f[3].starts_with("xpu");
            ok.then(|| {
                let start = u64::from_str_radix(f[0], 16).unwrap();
                (start, start + u64::from_str_radix(f[1], 16).unwrap())
            })
        })
        .collect();
    assert!(!ranges.is_empty(), "no kernel symbols in {}", build.display());
    let log = build.parent().unwrap().join(format!("exec-{}.log", runner.len()));
    let traced = format!("{runner} -singlestep -d exec,nochain -D {}", log.display());
    let (_, out) = run_build(g, build, inputs, Some(&traced));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    text.lines()
        .filter_map(|l| {
            l.split('[').nth(1)?.split('/').nth(1).map(|pc| u64::from_str_radix(pc, 16))
        })
        .filter_map(Result::ok)
        .filter(|pc| ranges.iter().any(|(a, b)| (*a..*b).contains(pc)))
        .count() as u64
}

#[test]
fn vector_builds_run_the_fused_chains_in_at_least_three_times_fewer_instructions() {
    use xpu_engine::RiscvCpu;
    for name in ["gelu_chain", "silu_chain", "mish_chain", "softplus_chain"] {
        let g = program(name, 4);
        let inputs = inputs_of(&g);
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let dir = tempfile::tempdir().unwrap();
        let count = |isa: RiscvCpu, runner: &str| {
            let build = dir.path().join(isa.name());
            if !build.exists() {
                riscv::build(&g, &shapes, &build, isa).unwrap();
            }
            kernel_instructions(&build, &g, &inputs, runner)
        };
        let scalar = count(RiscvCpu::Rv64gc, "qemu-riscv64 -cpu rv64,v=false");
        let v128 = count(RiscvCpu::Rv64gcv, &qemu_rvv(128));
        let v256 = count(RiscvCpu::Rv64gcv, &qemu_rvv(256));
        eprintln!("{name}: scalar {scalar}, vlen=128 {v128}, vlen=256 {v256} instructions");
        assert!(scalar >= 3 * v128, "{name}: scalar {scalar} vs vector {v128} at vlen=128");
        assert!(v256 < v128, "{name}: a longer vector runs fewer instructions ({v256} vs {v128})");
    }
}

#[test]
fn a_build_refuses_bad_inputs_with_a_message_naming_them() {
    let g = program("gelu_chain", 2);
    let dir = tempfile::tempdir().unwrap();
    let build = dir.path().join("b");
    riscv::build(&g, &[vec![2, 1024], vec![1024]], &build, xpu_engine::RiscvCpu::Rv64gc).unwrap();
    let x = dir.path().join("x.npy");
    write_npy(&x, &Tensor::from_vec(vec![3, 1024], vec![0f32; 3072]).unwrap());
    let b = dir.path().join("b.npy");
    write_npy(&b, &Tensor::from_vec(vec![1024], vec![0f32; 1024]).unwrap());
    let run = |args: &[String]| Command::new(build.join("run")).args(args).output().unwrap();
    let out = run(&[
        "--input".into(),
        format!("x={}", x.display()),
        "--input".into(),
        format!("b={}", b.display()),
        "--out".into(),
        dir.path().join("o").display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("input x: shape must be (2, 1024)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["--input".into(), "nope=1.npy".into(), "--out".into(), "o".into()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such input"));
    std::fs::write(&x, b"garbage").unwrap();
    let out = run(&[
        "--input".into(),
        format!("x={}", x.display()),
        "--input".into(),
        format!("b={}", b.display()),
        "--out".into(),
        "o".into(),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a .npy file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn gelu_inputs(rows: usize) -> Vec<Tensor> {
    vec![
        Tensor::from_vec(vec![rows, 1024], values(rows * 1024, 3)).unwrap(),
        Tensor::from_vec(vec![1024], values(1024, 4)).unwrap(),
    ]
}

/// The riscv64 device through the engine API: values uploaded to its memory, the partition
/// run there, results downloaded — the host JIT's bits.
#[test]
fn the_riscv64_device_runs_partitions_on_its_own_memory() {
    use xpu_engine::{DeviceKind, StopToken, Value};
    let engine = LlvmEngine::new(None);
    let caps = engine.capabilities();
    let device =
        caps.devices.iter().find(|d| d.id.kind == DeviceKind::Riscv64).expect("a riscv64 device");
    assert!(caps.kernel("llvm.riscv").is_some(), "{caps:?}");
    assert!(engine.device_memory(device.id));
    let g = program("gelu_chain", 2);
    let inputs = gelu_inputs(2);
    let mut a = Assignment::new("llvm");
    a.device = device.id;
    let mut exe = engine.prepare(&g, &a).unwrap();
    let values: Vec<Value> =
        inputs.iter().map(|t| engine.upload(t, device.id, HostMemory::Pinned).unwrap()).collect();
    assert!(values.iter().all(|v| v.device() == device.id));
    let run = exe.run_values(&values, &StopToken::default()).unwrap();
    let Value::Device(out) = &run.outputs[0] else { panic!("the output stays on the device") };
    let got = engine.download(out.as_ref(), HostMemory::Pinned).unwrap();
    let want = LlvmEngine::new(None)
        .prepare(&g, &Assignment::new("llvm"))
        .unwrap()
        .run(&inputs)
        .unwrap()
        .outputs;
    assert_eq!(got, want[0]);
    assert!(run.facts.iter().any(|f| f.key == "llvm.riscv.runner"));
}

/// A runner that fails is an error naming the device and what it said; one that hangs is
/// stopped at the run's deadline.
#[test]
fn a_runner_that_dies_or_hangs_is_an_error_not_a_hang() {
    use xpu_engine::{EngineError, StopToken};
    let dir = tempfile::tempdir().unwrap();
    let g = program("gelu_chain", 1);
    let inputs = gelu_inputs(1);
    let mut a = Assignment::new("llvm");
    a.device = xpu_engine_llvm::riscv::device::DEVICE;
    let script = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        vec!["sh".to_string(), p.display().to_string()]
    };
    let dies = LlvmEngine::new(None)
        .with_riscv_runner(Some(script("dies.sh", "echo board unreachable >&2; exit 3")));
    let err = dies.prepare(&g, &a).unwrap().run(&inputs).expect_err("a failing runner");
    let msg = err.to_string();
    assert!(msg.contains("riscv64:0") && msg.contains("board unreachable"), "{msg}");
    let hangs = LlvmEngine::new(None).with_riscv_runner(Some(script("hangs.sh", "sleep 30")));
    let stop = StopToken::new();
    stop.set_deadline(std::time::Duration::from_millis(1500));
    let start = std::time::Instant::now();
    let err =
        hangs.prepare(&g, &a).unwrap().run_until(&inputs, &stop).expect_err("a hanging runner");
    assert!(matches!(err, EngineError::Stopped { .. }), "{err}");
    assert!(start.elapsed() < std::time::Duration::from_secs(20), "{:?}", start.elapsed());
    let missing = LlvmEngine::new(None).with_riscv_runner(Some(vec!["no-such-runner-xpu".into()]));
    let caps = missing.capabilities();
    assert!(caps.kernel("llvm.riscv").is_none());
    assert!(
        caps.unavailable_kernels["llvm.riscv"].contains("not installed"),
        "{:?}",
        caps.unavailable_kernels
    );
}

/// With a disk cache, a second engine (a second process) runs the partition's riscv64 build
/// from the cache instead of building it again.
#[test]
fn riscv64_builds_are_kept_in_the_disk_cache() {
    use xpu_engine::Engine;
    let dir = tempfile::tempdir().unwrap();
    let g = program("gelu_chain", 1);
    let inputs = gelu_inputs(1);
    let mut a = Assignment::new("llvm");
    a.device = xpu_engine_llvm::riscv::device::DEVICE;
    let fact = |engine: &LlvmEngine| {
        let run = engine.prepare(&g, &a).unwrap().run(&inputs).unwrap();
        let f = run.facts.iter().find(|f| f.key == "llvm.riscv.build").unwrap().value.clone();
        (f, run.outputs)
    };
    let (first, out1) = fact(&LlvmEngine::new(Some(dir.path().into())));
    assert!(first.starts_with("built in"), "{first}");
    let (second, out2) = fact(&LlvmEngine::new(Some(dir.path().into())));
    assert!(second.starts_with("disk cache"), "{second}");
    assert_eq!(out1, out2);
}
