//! The cuda engine's generated kernels over ONNX's node suite, without a GPU: every case
//! the llvm engine takes whole (llvm pinned, fallback denied — the groups both codegen
//! engines lower through LIR-ML) is rendered as CUDA C++, compiled by NVRTC for sm_80 and
//! sm_90 and assembled by ptxas for each, and run on the host through the emulation
//! header; it must pass wherever the cpu engine's planned route passes.
//!
//! `XPU_BLESS=1` rewrites `tests/conformance/onnx-node-report-cuda-emulated.md`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use xpu_engine::{Assignment, Capabilities, Engine, EngineError, Executable, Execution, Registry};
use xpu_engine_cuda::{codegen, host::HostModule, toolkit};
use xpu_engine_llvm::lower::{self, Slot};
use xpu_ir::{Graph, Tensor, TensorData};
use xpu_tests::conformance::{Route, Status, cache_dir, run_all};

/// What every case's run shares: the assembler and the counts for the report.
#[derive(Default)]
struct Shared {
    ptxas: std::path::PathBuf,
    kernels: AtomicUsize,
    codegen_refused: Mutex<BTreeSet<String>>,
}

struct EmulatedCuda {
    registry: Registry,
    policy: xpu_policy::Policy,
    shared: Arc<Shared>,
}

impl Engine for EmulatedCuda {
    fn name(&self) -> &str {
        "cuda-emulated"
    }
    fn version(&self) -> String {
        String::new()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::absent("cuda-emulated", xpu_engine::Availability::Available)
    }
    fn prepare(&self, g: &Graph, _: &Assignment) -> Result<Box<dyn Executable>, EngineError> {
        let inventory = self.registry.inventory_for(g);
        xpu_runtime::plan_graph(g, &self.policy, &inventory, &Default::default()).map_err(|f| {
            EngineError::Unsupported {
                engine: "cuda".into(),
                node: g.name.clone(),
                what: f.to_string(),
            }
        })?;
        Ok(Box::new(EmulatedRun { g: g.clone(), shared: self.shared.clone() }))
    }
}

struct EmulatedRun {
    g: Graph,
    shared: Arc<Shared>,
}

impl Executable for EmulatedRun {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        let unsupported = |what: String| EngineError::Unsupported {
            engine: "cuda".into(),
            node: self.g.name.clone(),
            what,
        };
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let structural: Vec<Option<Vec<i64>>> = inputs.iter().map(|t| t.to_i64_vec()).collect();
        let p =
            lower::lower(&self.g, &shapes, &structural).map_err(|e| unsupported(e.to_string()))?;
        let kernels: Vec<_> = p.steps.iter().map(|s| s.kernel.clone()).collect();
        let src = match codegen::source(&kernels) {
            Ok(s) => s,
            Err(e) => {
                self.shared.codegen_refused.lock().unwrap().insert(format!("{}: {e}", self.g.name));
                return Err(unsupported(e.to_string()));
            }
        };
        let fail = |e: toolkit::ToolkitError| EngineError::Other(format!("{e}\n{src}"));
        // Ampere and Hopper: each architecture's PTX assembled by ptxas.
        for arch in ["sm_80", "sm_90"] {
            let ptx = toolkit::compile_ptx(&src, &self.g.name, arch).map_err(fail)?;
            toolkit::assemble(&self.shared.ptxas, &ptx, &self.g.name, arch).map_err(fail)?;
        }
        self.shared.kernels.fetch_add(kernels.len(), Ordering::Relaxed);
        let module = HostModule::build(&src).map_err(fail)?;
        let values: Vec<TensorData> =
            p.values.iter().map(|v| TensorData::zeros(v.dtype, v.shape.iter().product())).collect();
        for step in &p.steps {
            let mut ptrs = Vec::new();
            for s in &step.buffers {
                let data = match s {
                    Slot::Input(i) => inputs[*i].data(),
                    Slot::Constant(t) => t.data(),
                    Slot::Computed(v) => &values[*v],
                };
                let p = data
                    .as_byte_ptr()
                    .ok_or_else(|| EngineError::Other(format!("a buffer of {}", data.dtype())))?;
                ptrs.push(p as *mut u8);
            }
            // SAFETY: the buffers are live tensors of the shapes and dtypes the kernels were
            // lowered for; only Computed buffers, owned here, are written.
            unsafe { module.run(&step.kernel.name, &mut ptrs, 4, 32) }.map_err(fail)?;
        }
        let outputs = p
            .outputs
            .iter()
            .map(|s| match s {
                Slot::Input(i) => Ok(inputs[*i].clone()),
                Slot::Constant(t) => Ok(t.clone()),
                Slot::Computed(v) => Tensor::new(p.values[*v].shape.clone(), values[*v].clone())
                    .map_err(|e| EngineError::Other(e.to_string())),
            })
            .collect::<Result<_, _>>()?;
        Ok(Execution { outputs, timings: Vec::new(), facts: Vec::new() })
    }
}

fn policy(order: &str) -> xpu_policy::Policy {
    let text = format!(
        "[policy]\nname = \"conformance\"\nversion = 1\n[engines]\norder = {order}\nfallback = \"deny\"\n"
    );
    xpu_policy::Loader::new().load_text("conformance policy", None, &text).unwrap()
}

#[test]
fn generated_cuda_kernels_pass_the_cases_llvm_takes_whole() {
    let dir = cache_dir();
    let mut registry = Registry::new();
    registry.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    registry.register(Arc::new(xpu_engine_llvm::LlvmEngine::new(None)));
    let engine = EmulatedCuda {
        registry,
        policy: policy("[\"llvm\"]"),
        shared: Arc::new(Shared {
            ptxas: toolkit::find_ptxas(None).expect("make setup installs ptxas"),
            ..Default::default()
        }),
    };
    let filter = std::env::var("XPU_CONFORMANCE_FILTER").ok();
    let route = Route::Import(&engine, Assignment::new("cuda-emulated"));
    let (_, results) = run_all(&dir, filter.as_deref(), &route).unwrap_or_else(|e| panic!("{e}"));
    // The llvm engine plans a few ops it runs without a kernel (dropout, transpose, an
    // identity of i8): nothing to generate.
    let no_kernel = |r: &&xpu_tests::conformance::CaseResult| {
        r.status != Status::Unsupported && r.detail.contains("cuda does not support")
    };
    let ran: Vec<_> =
        results.iter().filter(|r| r.status != Status::Unsupported && !no_kernel(r)).collect();
    let without_kernel = results.iter().filter(|r| no_kernel(r)).count();
    let failed: Vec<String> = ran
        .iter()
        .filter(|r| r.status != Status::Pass)
        .map(|r| format!("{}: {} {}", r.name, r.status.name(), r.detail))
        .collect();
    let passed = ran.len() - failed.len();
    let refused = engine.shared.codegen_refused.lock().unwrap().clone();
    let md = format!(
        "# cuda kernels, emulated on the host\n\nONNX's node suite: every case the llvm engine takes whole (llvm pinned, fallback denied) lowered to LIR-ML, rendered as CUDA C++, compiled by NVRTC for sm_80 and sm_90 and assembled by ptxas for each, then run on the host through the emulation header.\n\n| | |\n|---|---|\n| cases run | {} |\n| pass | {passed} |\n| fail | {} |\n| kernels compiled by NVRTC and assembled by ptxas (each for sm_80 and sm_90) | {} |\n| cases the CUDA code generator refuses | {} |\n| cases planned on llvm with nothing to generate (dropout, transpose, i8 identity) | {without_kernel} |\n",
        ran.len(),
        failed.len(),
        engine.shared.kernels.load(Ordering::Relaxed),
        refused.len(),
    );
    println!("{md}");
    if xpu_tests::bless() && filter.is_none() {
        let root = xpu_tests::repo_root().join("tests/conformance");
        std::fs::write(root.join("onnx-node-report-cuda-emulated.md"), &md).unwrap();
    }
    assert!(failed.is_empty(), "{} cases fail:\n{}", failed.len(), failed.join("\n"));
    if filter.is_none() {
        assert!(passed >= 300, "only {passed} cases ran");
    }
}
