//! A prepared partition on the GPU. Per set of input shapes: the LIR-ML lowering (the llvm
//! engine's), its kernels as CUDA C++ compiled by NVRTC to a cubin for the device (PTX as a
//! fallback) and loaded, the grid of each launch, and the memory plan ([`ArenaPlan`]). Each
//! run binds the inputs, launches the kernels in order on the executable's own
//! non-blocking stream, and returns outputs as device buffers. Under `execution.capture =
//! "graph"` with the arena pool, the second run captures the whole partition into a CUDA
//! graph (inputs copied into fixed buffers, outputs copied out of the arena) and later runs
//! replay it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use xpu_engine::options::{Capture, Pool};
use xpu_engine::{
    EngineError, EngineOptions, Executable, Execution, Fact, NodeTiming, StopToken, Value,
    check_inputs,
};
use xpu_ir::{Graph, Tensor};
use xpu_lower::{self as lower, Program, Slot};

use crate::arena::ArenaPlan;
use crate::codegen;
use crate::engine::{CudaBuffer, DEVICE, Gpu, Held, host_bytes, upload_bytes};
use crate::image;

/// A captured graph, instantiated, and the stream of its own it was captured and replays
/// on: nothing else (an output's free, a download on another thread) can join the capture.
struct Replay {
    graph: CudaGraph,
    stream: Arc<CudaStream>,
}
// SAFETY: CUDA graph objects may be used from any thread as long as calls on one graph are
// serialised (they are not internally synchronised). The graph belongs to one executable,
// which runs through `&mut self` — one call at a time — and is only ever moved between
// threads, never shared.
unsafe impl Send for Replay {}

/// A partition compiled for one set of input shapes, in one context generation.
struct Compiled {
    generation: u64,
    program: Program,
    /// Per step: its function and grid.
    launches: Vec<(CudaFunction, u32)>,
    /// Per step, per buffer: a constant's device copy, uploaded once.
    constants: Vec<Vec<Option<CudaSlice<u8>>>>,
    plan: ArenaPlan,
    /// The arena, kept between runs under `memory.pool = "arena"`.
    arena: Option<Held>,
    /// Each input's bytes at these shapes.
    input_sizes: Vec<usize>,
    /// Fixed input buffers a captured graph reads (graph mode only).
    bound_inputs: Vec<Held>,
    graph: Option<Replay>,
    runs: u64,
    /// Graphs captured for this shape set (one, unless a context reset forced another).
    captures: u64,
    facts: Vec<Fact>,
}

pub struct CudaExecutable {
    /// Shared, so a run holds it (node labels) while it borrows a compiled entry.
    graph: Arc<Graph>,
    gpu: Arc<Gpu>,
    capture: Capture,
    pool: Pool,
    /// Strict under `determinism = "bitwise"`, else contracted ([`crate::toolkit::Math`]).
    math: crate::toolkit::Math,
    memory_limit: Option<u64>,
    stream: Option<(u64, Arc<CudaStream>)>,
    compiled: HashMap<(Vec<Vec<usize>>, Vec<Option<Vec<i64>>>), Compiled>,
    structural: Vec<usize>,
    /// Facts every run reports (kernel fallbacks decided at prepare).
    notes: Vec<Fact>,
}

impl CudaExecutable {
    pub(crate) fn prepare(
        graph: Graph,
        gpu: Arc<Gpu>,
        options: &EngineOptions,
    ) -> Result<CudaExecutable, EngineError> {
        let structural = lower::structural_inputs(&graph);
        let mut exe = CudaExecutable {
            graph: Arc::new(graph),
            gpu,
            capture: options.capture,
            pool: options.memory_pool,
            math: crate::toolkit::Math::for_determinism(options.determinism),
            memory_limit: options.memory_limit,
            stream: None,
            compiled: HashMap::new(),
            structural,
            notes: Vec::new(),
        };
        // Compile at once when every shape is known, so errors show at prepare.
        if let Some(shapes) = lower::shapes_known_at_prepare(&exe.graph) {
            let none = vec![None; shapes.len()];
            exe.compiled_for(&shapes, &none)?;
        }
        Ok(exe)
    }

    /// The executable with `notes` added to every run's facts.
    pub(crate) fn with_notes(mut self, notes: Vec<Fact>) -> CudaExecutable {
        self.notes = notes;
        self
    }

    /// The executable's stream in the live context. After a context reset (a new
    /// generation) everything made in the old context is let go first — stream, modules,
    /// arenas, graphs — so the old context can be destroyed.
    fn stream(&mut self) -> Result<(Arc<CudaContext>, Arc<CudaStream>, u64), EngineError> {
        let (ctx, generation) = self.gpu.context()?;
        if let Some((g, s)) = &self.stream {
            if *g == generation {
                return Ok((ctx, s.clone(), generation));
            }
            self.compiled.clear();
            self.stream = None;
        }
        let s =
            ctx.new_stream().map_err(|e| self.gpu.driver_error("partition", "new stream", e))?;
        self.stream = Some((generation, s.clone()));
        Ok((ctx, s, generation))
    }

    /// The compiled entry for these shapes, made in the context `ctx` of `generation`.
    fn compiled_for(
        &mut self,
        shapes: &[Vec<usize>],
        structural: &[Option<Vec<i64>>],
    ) -> Result<&mut Compiled, EngineError> {
        let (ctx, stream, generation) = self.stream()?;
        let key = (shapes.to_vec(), structural.to_vec());
        if !self.compiled.contains_key(&key) {
            let c = self.compile(&ctx, &stream, generation, shapes, structural)?;
            self.compiled.insert(key.clone(), c);
        }
        self.compiled.get_mut(&key).ok_or_else(|| EngineError::Other("cuda: compiled entry".into()))
    }

    fn compile(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        generation: u64,
        shapes: &[Vec<usize>],
        structural: &[Option<Vec<i64>>],
    ) -> Result<Compiled, EngineError> {
        let gpu = &self.gpu;
        let program = lower::lower(&self.graph, shapes, structural).map_err(|e| {
            EngineError::Unsupported { engine: "cuda".into(), node: e.node, what: e.message }
        })?;
        let program = crate::rows::merge_row_steps(program);
        let kernels: Vec<_> = program.steps.iter().map(|s| s.kernel.clone()).collect();
        let source = codegen::source(&kernels).map_err(|e| kernel_error(&e.to_string()))?;
        let start = Instant::now();
        let built = image::build(&source, &gpu.arch, self.math, gpu.config.cache_dir.as_deref())
            .map_err(|e| kernel_error(&format!("{} kernel(s): {e}", kernels.len())))?;
        let compile_ms = start.elapsed().as_secs_f64() * 1e3;
        let module = ctx
            .load_module(built.module())
            .map_err(|e| gpu.driver_error("partition", &format!("loading {}", built.what), e))?;
        let mut launches = Vec::new();
        for k in &kernels {
            let f = module
                .load_function(&codegen::ident(&k.name))
                .map_err(|e| gpu.driver_error(&k.name, "kernel lookup", e))?;
            let n = codegen::parallel_iterations(k).ok_or_else(|| {
                kernel_error(&format!("{}: iteration count is not a constant", k.name))
            })?;
            let threads = n.saturating_mul(codegen::threads_per_iteration(k));
            launches.push((f, codegen::grid_for(threads, gpu.facts.multiprocessors.max(1) as u32)));
        }
        let mut constants = Vec::new();
        for step in &program.steps {
            let mut row = Vec::new();
            for slot in &step.buffers {
                row.push(match slot {
                    Slot::Constant(t) => {
                        Some(upload_bytes(stream, host_bytes(t, "constant")?).map_err(|e| {
                            gpu.driver_error(&step.kernel.name, "constant upload", e)
                        })?)
                    }
                    _ => None,
                });
            }
            constants.push(row);
        }
        let plan = ArenaPlan::of(&program);
        let input_sizes: Vec<usize> = shapes
            .iter()
            .zip(&self.graph.inputs)
            .map(|(s, &v)| s.iter().product::<usize>() * self.graph.ty(v).dtype.size_bytes())
            .collect();
        let input_bytes: u64 = input_sizes.iter().map(|&b| b as u64).sum();
        let needed = plan.bytes + input_bytes;
        if let Some(limit) = self.memory_limit
            && needed > limit
        {
            return Err(EngineError::MemoryLimit {
                what: format!(
                    "cuda partition on {DEVICE} (arena {} + inputs {input_bytes})",
                    plan.bytes
                ),
                needed,
                limit,
            });
        }
        let arena = if self.pool == Pool::Arena {
            // SAFETY: the arena's bytes are written by kernels before they are read (each
            // value is stored by the step that defines it, ahead of its readers).
            Some(Held::new(
                unsafe { crate::engine::alloc_or_trim(stream, plan.bytes.max(1) as usize) }
                    .map_err(|e| self.oom(e, plan.bytes, "arena"))?,
                gpu,
            ))
        } else {
            None
        };
        let facts = vec![
            Fact { node: None, key: "cuda.image".into(), value: built.what.clone() },
            Fact { node: None, key: "cuda.compile_ms".into(), value: format!("{compile_ms:.1}") },
            Fact { node: None, key: "cuda.math".into(), value: self.math.describe().into() },
            Fact {
                node: None,
                key: "cuda.kernels".into(),
                value: format!("{} for {} node(s)", kernels.len(), self.graph.nodes.len()),
            },
            Fact {
                node: None,
                key: "cuda.memory".into(),
                value: format!(
                    "pool {:?}: arena {} bytes (peak live {}), inputs {input_bytes}",
                    self.pool, plan.bytes, plan.peak_live
                ),
            },
        ];
        Ok(Compiled {
            generation,
            program,
            launches,
            constants,
            plan,
            arena,
            input_sizes,
            bound_inputs: Vec::new(),
            graph: None,
            runs: 0,
            captures: 0,
            facts,
        })
    }

    fn oom(&self, e: cudarc::driver::DriverError, requested: u64, what: &str) -> EngineError {
        match self.gpu.driver_error(what, "allocation", e) {
            EngineError::OutOfMemory { device, available, reserved, .. } => {
                EngineError::OutOfMemory { device, requested, available, reserved }
            }
            other => other,
        }
    }

    /// The device pointer of every input: the caller's buffers (their writers synchronised
    /// first), as `CUdeviceptr`s.
    fn input_pointers(
        &self,
        inputs: &[Value],
        stream: &CudaStream,
    ) -> Result<Vec<u64>, EngineError> {
        let mut ptrs = Vec::with_capacity(inputs.len());
        for (i, v) in inputs.iter().enumerate() {
            let b = v
                .buffer_of("cuda", DEVICE)
                .and_then(|b| b.as_any().downcast_ref::<CudaBuffer>())
                .ok_or_else(|| EngineError::NoDevice {
                    engine: "cuda".into(),
                    device: v.device(),
                    what: "take an input that is not on cuda:0 (the plan lacks a transfer)".into(),
                })?;
            if b.stream.context().cu_ctx() != stream.context().cu_ctx() {
                return Err(EngineError::Input {
                    name: format!("input {i}"),
                    message: "a device value from a CUDA context that was reset after an error: upload it again".into(),
                });
            }
            if b.stream.cu_stream() != stream.cu_stream() {
                b.stream
                    .synchronize()
                    .map_err(|e| self.gpu.driver_error(&format!("input {i}"), "synchronize", e))?;
            }
            ptrs.push(b.data.device_ptr(stream).0);
        }
        Ok(ptrs)
    }

    /// A run on device values. On any error the stream is drained before returning, so no
    /// queued kernel or copy outlives the buffers the caller drops next.
    fn run_device(
        &mut self,
        inputs: &[Value],
        stop: &StopToken,
    ) -> Result<Execution<Value>, EngineError> {
        let result = self.run_device_queued(inputs, stop);
        if result.is_err()
            && let Some((_, s)) = &self.stream
        {
            let _ = s.synchronize();
        }
        result
    }

    fn run_device_queued(
        &mut self,
        inputs: &[Value],
        stop: &StopToken,
    ) -> Result<Execution<Value>, EngineError> {
        let gpu = self.gpu.clone();
        let notes = self.notes.clone();
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|v| v.shape().to_vec()).collect();
        let structural = self.structural_values(inputs)?;
        // The stream (and with it the context generation) is fetched once per run: the
        // compiled entry below belongs to the same generation.
        let (_, stream, generation) = self.stream()?;
        let input_ptrs = self.input_pointers(inputs, &stream)?;
        let capture = self.capture;
        let pool = self.pool;
        let node_label = |g: &Graph, step: &lower::Step| g.node(step.nodes[0]).label(step.nodes[0]);
        let graph = self.graph.clone();
        let c = self.compiled_for(&shapes, &structural)?;
        if c.generation != generation {
            return Err(kernel_error(
                "the CUDA context was reset by another job's error during this run: run it again",
            ));
        }
        let per_run_arena;
        let arena_base = match &c.arena {
            Some(a) => a.device_ptr(&stream).0,
            None => {
                // SAFETY: as for the kept arena: every value is written before it is read.
                per_run_arena =
                    unsafe { crate::engine::alloc_or_trim(&stream, c.plan.bytes.max(1) as usize) }
                        .map_err(|e| gpu.allocation_error("arena", e, c.plan.bytes))?;
                per_run_arena.device_ptr(&stream).0
            }
        };
        let graphed = capture == Capture::Graph && pool == Pool::Arena;
        // In graph mode the kernels read fixed input buffers, bound by a copy per run.
        if graphed {
            if c.bound_inputs.is_empty() {
                for &bytes in &c.input_sizes {
                    // SAFETY: written by the bind copy below before any kernel reads it.
                    c.bound_inputs.push(Held::new(
                        unsafe { crate::engine::alloc_or_trim(&stream, bytes.max(1)) }
                            .map_err(|e| gpu.allocation_error("inputs", e, bytes as u64))?,
                        &gpu,
                    ));
                }
            }
            for (k, (src, dst)) in input_ptrs.iter().zip(&c.bound_inputs).enumerate() {
                let bytes = c.input_sizes[k];
                if bytes == 0 {
                    continue;
                }
                // SAFETY: both are live device allocations of at least `bytes` bytes on this
                // context (the input's shape is the one the binding buffer was made for);
                // the copy is ordered on the executable's stream.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        dst.device_ptr(&stream).0,
                        *src,
                        bytes,
                        stream.cu_stream(),
                    )
                }
                .map_err(|e| gpu.driver_error(&format!("input {k}"), "binding copy", e))?;
            }
        }
        let bound: Vec<u64> = if graphed {
            c.bound_inputs.iter().map(|b| b.device_ptr(&stream).0).collect()
        } else {
            input_ptrs.clone()
        };
        // Eager runs write outputs straight into buffers of their own; a captured graph
        // writes fixed arena addresses, copied out after each replay.
        let mut direct: HashMap<usize, Arc<CudaBuffer>> = HashMap::new();
        if !graphed {
            for slot in &c.program.outputs {
                if let Slot::Computed(v) = slot
                    && !direct.contains_key(v)
                {
                    let info = &c.program.values[*v];
                    let bytes = info.bytes();
                    // SAFETY: written by the step that defines the value before the run ends.
                    let data = unsafe { crate::engine::alloc_or_trim(&stream, bytes.max(1)) }
                        .map_err(|e| gpu.allocation_error("output", e, bytes as u64))?;
                    let b = CudaBuffer {
                        data,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        stream: stream.clone(),
                    };
                    direct.insert(*v, Arc::new(b));
                }
            }
        }
        let direct_ptrs: HashMap<usize, u64> =
            direct.iter().map(|(&v, b)| (v, b.data.device_ptr(&stream).0)).collect();
        let tables = pointer_tables(c, &bound, arena_base, &direct_ptrs, &stream);
        let mut timings = Vec::new();
        let mut facts = c.facts.clone();
        facts.extend(notes);
        if graphed && c.runs >= 1 {
            stop.check(|| "partition".into())?;
            if c.graph.is_none() {
                let start = Instant::now();
                // fork: a new stream ordered after the binding copies just queued.
                let cap = stream
                    .fork()
                    .map_err(|e| gpu.driver_error("partition", "capture stream", e))?;
                cap.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .map_err(|e| gpu.driver_error("partition", "begin capture", e))?;
                let launched = launch_all(c, &tables, &cap, &gpu, &graph);
                let ended = cap.end_capture(CUgraphInstantiate_flags(0));
                launched?;
                let captured = ended
                    .map_err(|e| gpu.driver_error("partition", "end capture", e))?
                    .ok_or_else(|| kernel_error("stream capture produced no graph"))?;
                c.graph = Some(Replay { graph: captured, stream: cap });
                c.captures += 1;
                facts.push(Fact {
                    node: None,
                    key: "cuda.capture_ms".into(),
                    value: format!("{:.3}", start.elapsed().as_secs_f64() * 1e3),
                });
            }
            let replay = c.graph.as_ref().ok_or_else(|| kernel_error("no captured graph"))?;
            let cap = &replay.stream;
            let err = |what: &'static str| |e| gpu.driver_error("partition", what, e);
            // The replay waits for this run's binding copies; the output copies wait for it.
            cap.join(&stream).map_err(err("stream order"))?;
            let t0 =
                cap.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err("event"))?;
            replay.graph.launch().map_err(err("graph launch"))?;
            let t1 =
                cap.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err("event"))?;
            stream.join(cap).map_err(err("stream order"))?;
            let ms = t0.elapsed_ms(&t1).map_err(|e| gpu.driver_error("partition", "timing", e))?;
            facts.push(Fact { node: None, key: "cuda.graph_ms".into(), value: format!("{ms:.4}") });
            let nodes: Vec<_> = c.program.steps.iter().flat_map(|s| s.nodes.clone()).collect();
            let share = (ms as f64 * 1e6) as u64 / nodes.len().max(1) as u64;
            timings.extend(nodes.into_iter().map(|n| NodeTiming {
                node: n,
                kernel: "cuda.fused".into(),
                nanos: share,
            }));
        } else {
            let mut marks = vec![event(&stream, &gpu)?];
            for (k, step) in c.program.steps.iter().enumerate() {
                stop.check(|| node_label(&graph, step))?;
                launch_step(c, k, &tables[k], &stream, &gpu, &graph)?;
                marks.push(event(&stream, &gpu)?);
            }
            for (k, step) in c.program.steps.iter().enumerate() {
                let ms = marks[k]
                    .elapsed_ms(&marks[k + 1])
                    .map_err(|e| gpu.driver_error(&node_label(&graph, step), "kernel", e))?;
                let share = (ms as f64 * 1e6) as u64 / step.nodes.len().max(1) as u64;
                for &n in &step.nodes {
                    timings.push(NodeTiming {
                        node: n,
                        kernel: kernel_name(step).into(),
                        nanos: share,
                    });
                }
            }
        }
        c.runs += 1;
        let outputs = collect_outputs(c, inputs, arena_base, &direct, &stream, &gpu)?;
        stream.synchronize().map_err(|e| gpu.driver_error("partition", "synchronize", e))?;
        // A shape change captures again: the count is over every shape set.
        let captures: u64 = self.compiled.values().map(|c| c.captures).sum();
        facts.push(Fact { node: None, key: "cuda.captures".into(), value: captures.to_string() });
        Ok(Execution { outputs, timings, facts })
    }

    /// The partition's kernels for inputs of `shapes` at device pointers `inputs`, each
    /// output written to `outputs` (a pointer per graph output, with the output's bytes),
    /// queued on `stream` with no allocation and no synchronisation — what a stream capture
    /// of a larger graph records. The shapes must have run before (compiled, arena kept).
    /// `Ok(Err(why))` when the partition cannot run that way.
    pub(crate) fn launch_into(
        &mut self,
        shapes: &[Vec<usize>],
        inputs: &[u64],
        outputs: &[u64],
        stream: &Arc<CudaStream>,
    ) -> Result<Result<(), String>, EngineError> {
        if !self.structural.is_empty() {
            return Ok(Err("a reduction's axes come from an input".into()));
        }
        let gpu = self.gpu.clone();
        let graph = self.graph.clone();
        let none = vec![None; shapes.len()];
        let c = self.compiled_for(shapes, &none)?;
        let Some(arena) = c.arena.as_ref().map(|a| a.device_ptr(stream).0) else {
            return Ok(Err("no kept arena (memory.pool is not \"arena\")".into()));
        };
        // Each computed output written straight to its pointer; an output slot repeating
        // a value, or passing an input through, copied after the kernels.
        let mut direct: HashMap<usize, u64> = HashMap::new();
        let mut copies: Vec<(u64, u64, usize)> = Vec::new();
        for (slot, &to) in c.program.outputs.iter().zip(outputs) {
            match slot {
                Slot::Computed(v) => match direct.get(v) {
                    Some(&from) => copies.push((to, from, c.program.values[*v].bytes())),
                    None => {
                        direct.insert(*v, to);
                    }
                },
                Slot::Input(i) => {
                    let bytes = shapes[*i].iter().product::<usize>()
                        * graph.ty(graph.inputs[*i]).dtype.size_bytes();
                    copies.push((to, inputs[*i], bytes));
                }
                Slot::Constant(_) => return Ok(Err("a constant output".into())),
            }
        }
        let tables = pointer_tables(c, inputs, arena, &direct, stream);
        launch_all(c, &tables, stream, &gpu, &graph)?;
        for (to, from, bytes) in copies.into_iter().filter(|c| c.2 > 0) {
            // SAFETY: both are live allocations of at least `bytes` (the caller's output
            // buffer is sized by the output's shape), ordered on `stream`.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(to, from, bytes, stream.cu_stream())
            }
            .map_err(|e| gpu.driver_error("output", "copy", e))?;
        }
        c.runs += 1;
        Ok(Ok(()))
    }

    /// The values of inputs that shape the code (a reduction's axes), read back to the host.
    fn structural_values(&self, inputs: &[Value]) -> Result<Vec<Option<Vec<i64>>>, EngineError> {
        (0..inputs.len())
            .map(|i| {
                if !self.structural.contains(&i) {
                    return Ok(None);
                }
                let t = match &inputs[i] {
                    Value::Host(t) => t.clone(),
                    Value::Device(b) => {
                        let b = b.as_any().downcast_ref::<CudaBuffer>().ok_or_else(|| {
                            EngineError::Other("cuda: an axes input of another engine".into())
                        })?;
                        crate::engine::host_tensor(b.dtype, &b.shape, |out| {
                            b.read_into(out)
                                .map_err(|e| self.gpu.driver_error("axes", "download", e))
                        })?
                    }
                };
                Ok(t.to_i64_vec())
            })
            .collect()
    }
}

fn kernel_error(message: &str) -> EngineError {
    EngineError::Kernel { node: "cuda".into(), message: message.to_string() }
}

fn kernel_name(step: &lower::Step) -> &'static str {
    if step.implements == "llvm.gemm" { "cuda.naive" } else { "cuda.fused" }
}

/// A timing event recorded on `stream`.
fn event(stream: &CudaStream, gpu: &Gpu) -> Result<CudaEvent, EngineError> {
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| gpu.driver_error("partition", "event", e))
}

/// Per step, the device pointer of each kernel buffer: computed values in the arena, except
/// those written straight into an output buffer of their own (`direct`).
fn pointer_tables(
    c: &Compiled,
    inputs: &[u64],
    arena: u64,
    direct: &HashMap<usize, u64>,
    stream: &CudaStream,
) -> Vec<Vec<u64>> {
    c.program
        .steps
        .iter()
        .enumerate()
        .map(|(k, step)| {
            step.buffers
                .iter()
                .enumerate()
                .map(|(j, slot)| match slot {
                    Slot::Input(i) => inputs[*i],
                    Slot::Constant(_) => {
                        c.constants[k][j].as_ref().map_or(0, |b| b.device_ptr(stream).0)
                    }
                    Slot::Computed(v) => match direct.get(v) {
                        Some(&p) => p,
                        None => arena + c.plan.placements[*v].map_or(0, |p| p.offset),
                    },
                })
                .collect()
        })
        .collect()
}

fn launch_step(
    c: &Compiled,
    k: usize,
    ptrs: &[u64],
    stream: &Arc<CudaStream>,
    gpu: &Gpu,
    graph: &Graph,
) -> Result<(), EngineError> {
    let (f, grid) = &c.launches[k];
    let mut args = stream.launch_builder(f);
    for p in ptrs {
        args.arg(p);
    }
    let cfg = LaunchConfig {
        grid_dim: (*grid, 1, 1),
        block_dim: (codegen::BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel's parameters are its buffers' device pointers in its declared
    // order, each an allocation of at least the bytes its LIR-ML shape says (the arena plan
    // and the inputs' shapes, checked against the graph); the verifier proved every access
    // within those shapes.
    unsafe { args.launch(cfg) }.map(|_| ()).map_err(|e| {
        let step = &c.program.steps[k];
        gpu.driver_error(&graph.node(step.nodes[0]).label(step.nodes[0]), "launch", e)
    })
}

fn launch_all(
    c: &Compiled,
    tables: &[Vec<u64>],
    stream: &Arc<CudaStream>,
    gpu: &Gpu,
    graph: &Graph,
) -> Result<(), EngineError> {
    (0..c.program.steps.len()).try_for_each(|k| launch_step(c, k, &tables[k], stream, gpu, graph))
}

/// Each output as a device buffer: written directly (eager runs), or copied out of the
/// arena, which the next run reuses (captured graphs); inputs passed through (shared, never
/// copied).
fn collect_outputs(
    c: &Compiled,
    inputs: &[Value],
    arena: u64,
    direct: &HashMap<usize, Arc<CudaBuffer>>,
    stream: &Arc<CudaStream>,
    gpu: &Gpu,
) -> Result<Vec<Value>, EngineError> {
    let mut outputs = Vec::with_capacity(c.program.outputs.len());
    for slot in &c.program.outputs {
        outputs.push(match slot {
            Slot::Input(i) => inputs[*i].clone(),
            Slot::Constant(t) => {
                let data = upload_bytes(stream, host_bytes(t, "constant output")?)
                    .map_err(|e| gpu.driver_error("output", "upload", e))?;
                Value::Device(Arc::new(CudaBuffer {
                    data,
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                    stream: stream.clone(),
                }))
            }
            Slot::Computed(v) if direct.contains_key(v) => {
                Value::Device(direct[v].clone() as Arc<dyn xpu_engine::DeviceBuffer>)
            }
            Slot::Computed(v) => {
                let info = &c.program.values[*v];
                let bytes = info.bytes();
                // SAFETY: filled by the copy right after, ordered on the same stream.
                let data = unsafe { crate::engine::alloc_or_trim(stream, bytes.max(1)) }
                    .map_err(|e| gpu.allocation_error("output", e, bytes as u64))?;
                let offset = c.plan.placements[*v].map_or(0, |p| p.offset);
                // SAFETY: source and destination are live allocations of at least `bytes`.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        data.device_ptr(stream).0,
                        arena + offset,
                        bytes,
                        stream.cu_stream(),
                    )
                }
                .map_err(|e| gpu.driver_error("output", "copy out of the arena", e))?;
                Value::Device(Arc::new(CudaBuffer {
                    data,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    stream: stream.clone(),
                }))
            }
        });
    }
    Ok(outputs)
}

impl Executable for CudaExecutable {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    /// Host tensors in and out: the inputs uploaded and the outputs downloaded around a
    /// device run, the bytes moved reported as facts.
    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        check_inputs(&self.graph, inputs)?;
        let (_, stream, _) = self.stream()?;
        let gpu = self.gpu.clone();
        run_from_host(&gpu, &stream, inputs, |values| self.run_device(values, stop))
    }

    fn run_values(
        &mut self,
        inputs: &[Value],
        stop: &StopToken,
    ) -> Result<Execution<Value>, EngineError> {
        stop.check(|| DEVICE.to_string())?;
        check_value_inputs(&self.graph, inputs)?;
        self.run_device(inputs, stop)
    }
}

/// A device run between the upload of host `inputs` (on `stream`) and the download of its
/// outputs, the bytes moved reported as facts.
pub(crate) fn run_from_host(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    inputs: &[Tensor],
    run_device: impl FnOnce(&[Value]) -> Result<Execution<Value>, EngineError>,
) -> Result<Execution, EngineError> {
    let mut values = Vec::with_capacity(inputs.len());
    let mut up = 0usize;
    for (i, t) in inputs.iter().enumerate() {
        let bytes = host_bytes(t, &format!("input {i}"))?;
        up += bytes.len();
        let data = upload_bytes(stream, bytes)
            .map_err(|e| gpu.driver_error(&format!("input {i}"), "upload", e))?;
        values.push(Value::Device(Arc::new(CudaBuffer {
            data,
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            stream: stream.clone(),
        })));
    }
    let run = run_device(&values)?;
    let mut outputs = Vec::with_capacity(run.outputs.len());
    let mut down = 0usize;
    for v in &run.outputs {
        let b = v
            .buffer_of("cuda", DEVICE)
            .and_then(|b| b.as_any().downcast_ref::<CudaBuffer>())
            .ok_or_else(|| EngineError::Other("cuda: an output not on the device".into()))?;
        down += b.data.len();
        outputs.push(crate::engine::host_tensor(b.dtype, &b.shape, |out| {
            b.read_into(out).map_err(|e| gpu.driver_error("output", "download", e))
        })?);
    }
    let mut facts = run.facts;
    facts.push(Fact { node: None, key: "cuda.h2d_bytes".into(), value: up.to_string() });
    facts.push(Fact { node: None, key: "cuda.d2h_bytes".into(), value: down.to_string() });
    Ok(Execution { outputs, timings: run.timings, facts })
}

/// Dtype and rank checks for device inputs (what `check_inputs` does for host tensors).
pub(crate) fn check_value_inputs(g: &Graph, inputs: &[Value]) -> Result<(), EngineError> {
    if inputs.len() != g.inputs.len() {
        return Err(EngineError::Other(format!(
            "cuda partition takes {} inputs, got {}",
            g.inputs.len(),
            inputs.len()
        )));
    }
    for (k, (v, &id)) in inputs.iter().zip(&g.inputs).enumerate() {
        let (dtype, rank) = match v {
            Value::Host(t) => (t.dtype(), t.shape().len()),
            Value::Device(b) => (b.dtype(), b.shape().len()),
        };
        let ty = g.ty(id);
        if dtype != ty.dtype || ty.dims.as_ref().is_some_and(|d| d.len() != rank) {
            return Err(EngineError::Input {
                name: format!("input {k}"),
                message: format!("expected {}, got {dtype} of rank {rank}", ty),
            });
        }
    }
    Ok(())
}
