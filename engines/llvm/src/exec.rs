//! Running lowered, compiled partitions: buffers bound per kernel, stages called in order,
//! a `parallel` stage's range cut into `threads` fixed chunks (chunk k is
//! `lo + n·k/t .. lo + n·(k+1)/t`), each chunk writing only its own rows. Chunk 0 runs on
//! the calling thread, the others on threads started once per process ([`pool`]).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use xpu_engine::{EngineError, Executable, Execution, Fact, NodeTiming, StopToken, check_inputs};
use xpu_ir::{Graph, Tensor, TensorData};

use crate::cache::{CodeCache, Loaded, StageFn};
use crate::codegen;
use crate::lower::{self, Program, Slot};

/// Below this many elements per thread a stage runs on one thread: starting a thread
/// costs more than the loop.
const MIN_PER_THREAD: usize = 1 << 15;

/// A program compiled for one set of input shapes.
struct Compiled {
    program: Program,
    /// Per computed value, whether a step writes it (`written_values`).
    written: Vec<bool>,
    /// Per step, its stages: the entry point and, for a parallel loop, its range.
    stages: Vec<Vec<(StageFn, Option<(i64, i64)>)>>,
    _code: Arc<Loaded>,
    facts: Vec<Fact>,
}

pub struct LlvmExecutable {
    graph: Graph,
    cache: Arc<CodeCache>,
    threads: usize,
    /// By input shapes and the values of the structural inputs.
    compiled: HashMap<(Vec<Vec<usize>>, Vec<Option<Vec<i64>>>), Arc<Compiled>>,
    /// Inputs whose values shape the code (`lower::structural_inputs`).
    structural: Vec<usize>,
}

impl LlvmExecutable {
    /// Compiles at once when every input shape is known, so errors show at prepare.
    pub fn prepare(
        graph: Graph,
        cache: Arc<CodeCache>,
        threads: usize,
    ) -> Result<Box<dyn Executable>, EngineError> {
        let structural = lower::structural_inputs(&graph);
        let mut exe =
            LlvmExecutable { graph, cache, threads, compiled: HashMap::new(), structural };
        if let Some(shapes) = lower::shapes_known_at_prepare(&exe.graph) {
            let none = vec![None; shapes.len()];
            exe.compiled_for(&shapes, &none)?;
        }
        Ok(Box::new(exe))
    }

    fn compiled_for(
        &mut self,
        shapes: &[Vec<usize>],
        structural: &[Option<Vec<i64>>],
    ) -> Result<Arc<Compiled>, EngineError> {
        let key = (shapes.to_vec(), structural.to_vec());
        if let Some(c) = self.compiled.get(&key) {
            return Ok(c.clone());
        }
        let err = |message: String| EngineError::Kernel { node: "llvm".into(), message };
        let program = lower::lower(&self.graph, shapes, structural).map_err(crate::unsupported)?;
        let module = program.module();
        xpu_lir::verify(&module)
            .map_err(|e| err(format!("lowered LIR-ML does not verify: {e}")))?;
        let kernels = &module.kernels;
        let (ir, stage_lists) = codegen::emit_module(kernels, self.cache.target.vector_bits())
            .map_err(|e| err(e.to_string()))?;
        let (code, source, ms) = self.cache.get(&ir).map_err(|e| {
            err(format!("group of {} kernel(s) [{}]: {e}", kernels.len(), names(kernels)))
        })?;
        let mut stages = Vec::new();
        for list in &stage_lists {
            let mut step = Vec::new();
            for s in list {
                let f = code.stage(&s.symbol).map_err(|e| err(e.to_string()))?;
                step.push((f, s.constant_range().map_err(err)?));
            }
            stages.push(step);
        }
        let facts = vec![
            Fact {
                node: None,
                key: "llvm.code".into(),
                value: format!("{} ({})", code.key, source.name()),
            },
            Fact { node: None, key: "llvm.compile_ms".into(), value: format!("{ms:.1}") },
            Fact {
                node: None,
                key: "llvm.target".into(),
                value: format!(
                    "{} {} ({}-bit vectors)",
                    self.cache.target.triple,
                    self.cache.target.cpu,
                    self.cache.target.vector_bits()
                ),
            },
            Fact {
                node: None,
                key: "llvm.kernels".into(),
                value: format!("{} for {} node(s)", kernels.len(), self.graph.nodes.len()),
            },
        ];
        let written = written_values(&program);
        let c = Arc::new(Compiled { program, written, stages, _code: code, facts });
        self.compiled.insert(key, c.clone());
        Ok(c)
    }
}

fn names(kernels: &[xpu_lir::Kernel]) -> String {
    kernels.iter().map(|k| format!("@{}", k.name)).collect::<Vec<_>>().join(", ")
}

/// A computed value's buffer. One some step writes in full gets room without zeroing (every
/// lowered kernel stores each element of its output before reading it back; debug builds
/// poison the room, so the engine's tests catch a kernel that does not): after the first
/// run the allocator hands back the memory the last run's outputs were freed to, neither
/// zeroed nor faulted in again. A fresh large one is marked for transparent huge pages
/// before the kernel writes it, so its first write faults in 2 MiB pages, not 4 KiB ones.
fn fresh_buffer(dtype: xpu_ir::DType, n: usize, written: bool) -> TensorData {
    let data = match written.then(|| TensorData::with_room(dtype, n)).flatten() {
        Some(room) => room,
        None => TensorData::zeros(dtype, n),
    };
    if let Some(p) = data.as_byte_ptr() {
        xpu_ir::memory::advise_huge_pages(p, n * dtype.size_bytes());
    }
    data
}

/// Per computed value, whether a step's kernel writes it (an `out`/`inout` buffer).
fn written_values(program: &Program) -> Vec<bool> {
    let mut written = vec![false; program.values.len()];
    for step in &program.steps {
        for (slot, buffer) in step.buffers.iter().zip(&step.kernel.buffers) {
            if let Slot::Computed(v) = slot
                && buffer.access != xpu_lir::Access::In
            {
                written[*v] = true;
            }
        }
    }
    written
}

/// The buffer pointers of one call, shareable across the chunk threads.
struct Args(Vec<*mut u8>);
// SAFETY: the pointers are into tensors that outlive the scoped threads using them; chunks
// of a parallel stage write disjoint ranges of the output buffers and only read the rest.
unsafe impl Send for Args {}
// SAFETY: as above: shared read-only as a pointer table.
unsafe impl Sync for Args {}

impl Executable for LlvmExecutable {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        check_inputs(&self.graph, inputs)?;
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let structural: Vec<Option<Vec<i64>>> = (0..inputs.len())
            .map(|i| self.structural.contains(&i).then(|| inputs[i].to_i64_vec()).flatten())
            .collect();
        let c = self.compiled_for(&shapes, &structural)?;
        let mut values: Vec<TensorData> = c
            .program
            .values
            .iter()
            .zip(&c.written)
            .map(|(v, &w)| fresh_buffer(v.dtype, v.shape.iter().product(), w))
            .collect();
        let mut timings = Vec::new();
        for (step, stages) in c.program.steps.iter().zip(&c.stages) {
            stop.check(|| self.graph.node(step.nodes[step.nodes.len() - 1]).label(step.nodes[0]))?;
            let mut ptrs = Vec::with_capacity(step.buffers.len());
            for slot in &step.buffers {
                // Inputs and constants where they lie (a lent input too).
                let (p, dtype) = match slot {
                    Slot::Input(i) => {
                        (inputs[*i].element_bytes().map(<[u8]>::as_ptr), inputs[*i].dtype())
                    }
                    Slot::Constant(t) => (t.element_bytes().map(<[u8]>::as_ptr), t.dtype()),
                    Slot::Computed(v) => (values[*v].as_byte_ptr(), values[*v].dtype()),
                };
                let p = p.ok_or_else(|| EngineError::Kernel {
                    node: "llvm".into(),
                    message: format!("a buffer of dtype {dtype}"),
                })?;
                ptrs.push(p as *mut u8);
            }
            let work = match step.buffers.last() {
                Some(Slot::Computed(v)) => c.program.values[*v].shape.iter().product(),
                _ => 0,
            };
            let threads = self.threads.min(work / MIN_PER_THREAD).max(1);
            let start = Instant::now();
            run_stages(stages, &Args(ptrs), threads);
            let nanos = start.elapsed().as_nanos() as u64;
            let share = nanos / step.nodes.len().max(1) as u64;
            for &n in &step.nodes {
                timings.push(NodeTiming { node: n, kernel: step.implements.into(), nanos: share });
            }
        }
        for ((data, info), &w) in values.iter_mut().zip(&c.program.values).zip(&c.written) {
            if w {
                // SAFETY: every step ran, and the step that writes a value stores each of
                // its elements (the lowering's contract, checked in debug builds by the
                // poisoned room): all of them are set.
                unsafe { data.assume_filled(info.shape.iter().product()) };
            }
        }
        let mut outputs = Vec::with_capacity(c.program.outputs.len());
        for (k, slot) in c.program.outputs.iter().enumerate() {
            outputs.push(match slot {
                Slot::Input(i) => inputs[*i].clone(),
                Slot::Constant(t) => t.clone(),
                Slot::Computed(v) => {
                    let info = &c.program.values[*v];
                    // A value returned twice is copied for all but its last output.
                    let data = if c.program.outputs[k + 1..].contains(slot) {
                        values[*v].clone()
                    } else {
                        std::mem::replace(&mut values[*v], TensorData::F32(Vec::new()))
                    };
                    Tensor::new(info.shape.clone(), data)
                        .map_err(|e| EngineError::Other(format!("llvm output: {e}")))?
                }
            });
        }
        Ok(Execution { outputs, timings, facts: c.facts.clone() })
    }
}

/// Calls a step's stages in order, splitting parallel ones across up to `threads`.
fn run_stages(stages: &[(StageFn, Option<(i64, i64)>)], args: &Args, threads: usize) {
    let syms: [i64; 1] = [0];
    for &(f, range) in stages {
        let call = |lo: i64, hi: i64| {
            // SAFETY: `f` is a stage of the compiled program whose buffers `args` binds, in
            // kernel order, to tensors of the shapes it was specialised for; the verifier
            // proved every access in bounds for those shapes. Its library stays loaded: the
            // caller holds the `Compiled` whose `_code` owns it.
            unsafe { f(args.0.as_ptr(), syms.as_ptr(), lo, hi) }
        };
        let Some((lo, hi)) = range else {
            call(0, 0);
            continue;
        };
        let n = (hi - lo).max(0) as usize;
        let t = threads.min(n).max(1);
        if t == 1 {
            call(lo, hi);
            continue;
        }
        let bound = |k: usize| lo + (n * k / t) as i64;
        match pool() {
            Some(pool) => pool.in_place_scope(|s| {
                for k in 1..t {
                    let call = &call;
                    s.spawn(move |_| call(bound(k), bound(k + 1)));
                }
                call(bound(0), bound(1));
            }),
            // The same chunks, one after another: the same results, no parallelism.
            None => (0..t).for_each(|k| call(bound(k), bound(k + 1))),
        }
    }
}

/// The threads that run parallel stages' chunks 1..t, started on first use and kept for
/// the process: one per CPU (a stage takes at most `execution.threads` − 1 of them; more
/// chunks than threads queue, each still its fixed range). Threads started per call, as
/// this engine did before, were placed by the scheduler on the caller's CPU about half the
/// time on a 2-vCPU machine, so a "parallel" stage ran serially (a 2-way split of 2 ×
/// 0.9 ms of work took 1.8 ms in 40–50% of calls; with threads kept, 0.97 ms at the median).
/// `None` where no thread can be started: then the chunks run one after another.
fn pool() -> Option<&'static rayon_core::ThreadPool> {
    static POOL: OnceLock<Option<rayon_core::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon_core::ThreadPoolBuilder::new()
            .num_threads(cpus)
            .thread_name(|i| format!("xpu-llvm-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}
