//! A sticky CUDA error, end to end. A kernel that traps (what a faulting kernel does)
//! poisons the whole process's CUDA state: no context of that process works again, a new
//! one included. So recovery is a new process: the cuda engine runs in a supervised worker
//! (this binary started again as `xpu-gpu-check --engine cuda`, serving the engine through
//! `xpu_worker` as `xpu-worker` does), a run whose first input element is
//! [`TRAP_MARKER`] launches the trapping kernel inside the worker, and the check wants the
//! job's error to name the engine, device and kernel, the worker to retire and the same
//! executables — eager and captured — to run again on a fresh worker with the same bits.
//! Then the same in this process: the engine reports itself unavailable with the reason.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value as Json, json};
use xpu_engine::options::Capture;
use xpu_engine::{Assignment, Capabilities, Engine, EngineError, Executable, Execution, StopToken};
use xpu_engine_cuda::CudaEngine;
use xpu_ir::{Graph, OpClass, Tensor, TensorData};

use crate::{ADD_ROW, assignment, cuda_config, inputs, same_bits};

/// A run whose first input starts with this value traps on the GPU instead of running.
pub const TRAP_MARKER: f32 = -1007.0;

/// Worker mode: serves the cuda engine (with the trap marker) on the descriptors the
/// parent handed down; returns the exit status.
pub fn serve_worker() -> i32 {
    let engine = Arc::new(TrapOnMarker(Arc::new(CudaEngine::new(cuda_config()))));
    xpu_worker::serve_inherited(engine, false, Duration::ZERO)
}

/// The cuda engine, whose executables trap on a marked input.
struct TrapOnMarker(Arc<CudaEngine>);

impl Engine for TrapOnMarker {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn version(&self) -> String {
        self.0.version()
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    fn classes_without_loading(&self) -> Option<Vec<OpClass>> {
        self.0.classes_without_loading()
    }

    fn prepare(&self, g: &Graph, a: &Assignment) -> Result<Box<dyn Executable>, EngineError> {
        let inner = self.0.prepare(g, a)?;
        Ok(Box::new(TrapExe { inner, engine: self.0.clone() }))
    }

    fn poisoned(&self) -> Option<String> {
        self.0.poisoned()
    }
}

struct TrapExe {
    inner: Box<dyn Executable>,
    engine: Arc<CudaEngine>,
}

fn marked(inputs: &[Tensor]) -> bool {
    inputs.first().and_then(|t| t.as_slice::<f32>()?.first().copied()) == Some(TRAP_MARKER)
}

impl Executable for TrapExe {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        if marked(inputs) {
            return Err(self.engine.run_trapping_kernel());
        }
        self.inner.run_until(inputs, stop)
    }
}

/// The check (see the module doc); `engine` is this process's cuda engine, trapped last.
pub fn sticky_error(engine: &CudaEngine, programs: &[(String, Graph)]) -> Json {
    let worker = match std::env::current_exe() {
        Ok(program) => xpu_worker::WorkerEngine::new(
            "cuda",
            xpu_worker::WorkerSetup {
                program,
                args: Vec::new(),
                inject_faults: false,
                max_rss_bytes: 0,
                processes: 1,
                idle_exit: Duration::ZERO,
                spin: Duration::ZERO,
            },
        ),
        Err(e) => return json!({"ok": false, "error": format!("own path: {e}")}),
    };
    let in_worker = match trap_in_worker(&worker, programs) {
        Ok(j) => j,
        Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
    };
    let in_process = trap_in_process(engine);
    let ok = in_worker["ok"].as_bool() == Some(true) && in_process["ok"].as_bool() == Some(true);
    json!({"ok": ok, "worker": in_worker, "in_process": in_process})
}

type Prepared = (String, Box<dyn Executable>, Vec<Tensor>, Vec<Tensor>);

fn trap_in_worker(
    worker: &xpu_worker::WorkerEngine,
    programs: &[(String, Graph)],
) -> anyhow::Result<Json> {
    let mut prepared: Vec<Prepared> = Vec::new();
    for (name, g) in programs.iter().filter(|(n, _)| n == "mlp" || n == "softmax_rows") {
        for capture in [Capture::Eager, Capture::Graph] {
            let ins = inputs(g, 37)?;
            let mut exe = worker.prepare(g, &assignment("cuda", capture))?;
            let mut outs = Vec::new();
            // Two runs: a captured executable captures on its second.
            for _ in 0..2 {
                outs = exe.run(&ins)?.outputs;
            }
            prepared.push((format!("{name} {capture:?}"), exe, ins, outs));
        }
    }
    let pid = worker.worker_pid();
    let (_, first, ins, _) = prepared.first_mut().ok_or_else(|| anyhow::anyhow!("no programs"))?;
    let mut trap = ins.clone();
    if let Some(t) = trap.first_mut()
        && let Some(x) = t.as_slice::<f32>()
    {
        let mut v = x.to_vec();
        if let Some(first) = v.first_mut() {
            *first = TRAP_MARKER;
        }
        *t = Tensor::new(t.shape().to_vec(), TensorData::F32(v))?;
    }
    let error = match first.run(&trap) {
        Ok(_) => "the trapping run succeeded".to_string(),
        Err(e) => e.to_string(),
    };
    let reported = error.contains("engine cuda")
        && error.contains("xpu_trap")
        && error.contains("poisons the process's CUDA state");
    let mut after = Vec::new();
    let mut all_same = true;
    for (label, exe, ins, outs) in &mut prepared {
        let row = match exe.run(ins) {
            Ok(run) => {
                let same = run.outputs.iter().zip(outs.iter()).all(|(a, b)| same_bits(a, b));
                all_same &= same;
                json!({"run": label, "same_bits": same})
            }
            Err(e) => {
                all_same = false;
                json!({"run": label, "error": e.to_string()})
            }
        };
        after.push(row);
    }
    let replaced = worker.worker_pid().is_some() && worker.worker_pid() != pid;
    let stats = xpu_worker::stats_snapshot().get("cuda").cloned().unwrap_or_default();
    let poisoned = stats.restarts.get("poisoned").copied().unwrap_or(0);
    Ok(json!({
        "ok": reported && all_same && replaced && poisoned == 1,
        "error": error, "runs_after": after, "worker_replaced": replaced,
        "restarts": stats.restarts,
    }))
}

/// The trap in this process: the engine must report itself unavailable afterwards, with
/// the reason, and refuse a new executable with it.
fn trap_in_process(engine: &CudaEngine) -> Json {
    let error = engine.run_trapping_kernel().to_string();
    let reason = engine.poisoned();
    let refused = xpu_ir::text::parse(ADD_ROW).ok().map(|g| {
        match engine.prepare(&g, &assignment("cuda", Capture::Eager)) {
            Ok(mut exe) => match exe.run(&inputs(&g, 4).unwrap_or_default()) {
                Ok(_) => "ran".to_string(),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        }
    });
    let available = engine.capabilities().availability.is_available();
    let ok = error.contains("xpu_trap")
        && reason.is_some()
        && !available
        && refused.as_deref().is_some_and(|r| r.contains("poisoned this process's CUDA state"));
    json!({"ok": ok, "error": error, "reason": reason, "available_after": available,
           "a_new_executable": refused})
}
