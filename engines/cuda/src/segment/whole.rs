//! A partition with cuBLASLt calls captured whole into one CUDA graph (`execution.capture =
//! "graph"` with `memory.pool = "arena"`). The first run with a set of input shapes is
//! eager and records every value's shape; the next captures, on a stream of its own, each
//! generated-kernel segment's launches ([`CudaExecutable::launch_into`]) and each cuBLASLt
//! call (its algorithm and workspace chosen by the eager run) into one graph over fixed
//! buffers — one per partition input and per value a segment computes — and every later
//! run binds its inputs by a device copy, replays the graph and copies the outputs out. A
//! shape change or a context reset captures again. What cannot be captured (an empty
//! product, a reduction whose axes are an input) runs eagerly, with the reason as a fact.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream, DevicePtr};
use xpu_engine::{EngineError, Execution, Fact, NodeTiming, StopToken, Value};
use xpu_ir::{DType, Op, ValueId};

use super::{CUBLASLT, Segment, SegmentedExecutable};
use crate::engine::CudaBuffer;

/// Every value's dtype and shape from an eager run with one set of input shapes.
pub(super) type Shapes = HashMap<ValueId, (DType, Vec<usize>)>;

/// The captured graph of one set of input shapes in one context generation.
pub(super) struct Whole {
    generation: u64,
    inputs: Vec<Vec<usize>>,
    graph: CudaGraph,
    stream: Arc<CudaStream>,
    /// The fixed buffers: partition inputs and every value a segment computes.
    fixed: HashMap<ValueId, Value>,
    /// Their bytes, counted as held by the engine while the graph lives.
    _held: crate::engine::HeldBytes,
    /// Each non-constant node and the kernel that runs it inside the graph (a replay's
    /// timings), and the `cuda.capture` fact — both fixed at capture.
    kernels: Vec<(xpu_ir::NodeId, &'static str)>,
    described: String,
}
// SAFETY: as for exec's `Replay`: the graph belongs to one executable, which runs through
// `&mut self` (one call at a time) and is only moved between threads, never shared.
unsafe impl Send for Whole {}

fn ptr(v: &Value) -> u64 {
    match v {
        Value::Device(b) => {
            b.as_any().downcast_ref::<CudaBuffer>().map_or(0, |c| c.data.device_ptr(&c.stream).0)
        }
        Value::Host(_) => 0,
    }
}

impl SegmentedExecutable {
    /// A replay of the captured graph for these inputs (of `input_shapes`, which an eager
    /// run has seen), capturing it first if need be; `Ok(None)` when this partition cannot
    /// be captured whole (the reason is kept and reported by the eager run that follows).
    pub(super) fn run_whole(
        &mut self,
        inputs: &[Value],
        input_shapes: &[Vec<usize>],
        generation: u64,
        stop: &StopToken,
    ) -> Result<Option<Execution<Value>>, EngineError> {
        let mut facts = self.notes.clone();
        if self
            .whole
            .as_ref()
            .is_none_or(|w| w.generation != generation || w.inputs != input_shapes)
        {
            self.whole = None;
            let start = std::time::Instant::now();
            // Cloned once per capture (the capture borrows `self` mutably).
            let shapes = self.seen.get(input_shapes).cloned().unwrap_or_default();
            match self.capture_whole(input_shapes, &shapes, generation)? {
                Ok(w) => self.whole = Some(w),
                Err(why) => {
                    self.not_captured.insert(input_shapes.to_vec(), why);
                    return Ok(None);
                }
            }
            self.captures += 1;
            facts.push(Fact {
                node: None,
                key: "cuda.capture_ms".into(),
                value: format!("{:.3}", start.elapsed().as_secs_f64() * 1e3),
            });
        }
        stop.check(|| "partition".into())?;
        let gpu = self.gpu.clone();
        let w = self.whole.as_ref().expect("captured above");
        let err = |what: &'static str| {
            let gpu = gpu.clone();
            move |e| gpu.driver_error("partition", what, e)
        };
        // Bind: each input copied into its fixed buffer (its writer finished first).
        for (k, (x, &v)) in inputs.iter().zip(&self.graph.inputs).enumerate() {
            let Value::Device(b) = x else {
                return Err(EngineError::Other(format!("cuda: input {k} is not on the device")));
            };
            let cb = b
                .as_any()
                .downcast_ref::<CudaBuffer>()
                .ok_or_else(|| EngineError::Other(format!("cuda: input {k} of another engine")))?;
            if cb.stream.cu_stream() != w.stream.cu_stream() {
                cb.stream.synchronize().map_err(err("synchronize"))?;
            }
            let bytes = b.size_bytes() as usize;
            if bytes > 0 {
                // SAFETY: both live allocations of `bytes` on this context (the fixed
                // buffer was made for this input's shape), ordered on the graph's stream.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        ptr(&w.fixed[&v]),
                        cb.data.device_ptr(&w.stream).0,
                        bytes,
                        w.stream.cu_stream(),
                    )
                }
                .map_err(err("binding copy"))?;
            }
        }
        let t0 =
            w.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err("event"))?;
        w.graph.launch().map_err(err("graph launch"))?;
        let t1 =
            w.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err("event"))?;
        // Outputs: copied out of the fixed buffers, which the next replay overwrites.
        let graph = self.graph.clone();
        let stream = w.stream.clone();
        let sources: Vec<Option<Value>> =
            graph.outputs.iter().map(|o| w.fixed.get(&o.value).cloned()).collect();
        let mut outputs = Vec::with_capacity(graph.outputs.len());
        for (o, src) in graph.outputs.iter().zip(sources) {
            let Some(src) = src else {
                // A constant output: its device copy, made once.
                outputs.push(self.value(&HashMap::new(), o.value, generation)?);
                continue;
            };
            let (dtype, shape) = (src.dtype(), src.shape().to_vec());
            let bytes = src.size_bytes() as usize;
            // SAFETY: filled by the copy right after, on the same stream.
            let data = unsafe { crate::engine::alloc_or_trim(&stream, bytes.max(1)) }
                .map_err(|e| gpu.allocation_error("partition", e, bytes as u64))?;
            if bytes > 0 {
                // SAFETY: both live allocations of at least `bytes`, ordered on the stream.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        data.device_ptr(&stream).0,
                        ptr(&src),
                        bytes,
                        stream.cu_stream(),
                    )
                }
                .map_err(err("copy out"))?;
            }
            outputs.push(Value::Device(Arc::new(CudaBuffer {
                data,
                dtype,
                shape,
                stream: stream.clone(),
            })));
        }
        stream.synchronize().map_err(err("synchronize"))?;
        let ms = t0.elapsed_ms(&t1).map_err(err("timing"))?;
        let w = self.whole.as_ref().expect("captured above");
        let share = (ms as f64 * 1e6) as u64 / w.kernels.len().max(1) as u64;
        let timings = (w.kernels.iter())
            .map(|&(node, kernel)| NodeTiming { node, kernel: kernel.into(), nanos: share })
            .collect();
        facts.push(Fact { node: None, key: "cuda.capture".into(), value: w.described.clone() });
        facts.push(Fact { node: None, key: "cuda.graph_ms".into(), value: format!("{ms:.4}") });
        facts.push(Fact {
            node: None,
            key: "cuda.captures".into(),
            value: self.captures.to_string(),
        });
        facts.extend(self.plan_cache_facts());
        Ok(Some(Execution { outputs, timings, facts }))
    }

    /// Each non-constant node with the kernel that runs it in the graph, and the
    /// `cuda.capture` fact describing the graph.
    fn replay_description(&self) -> (Vec<(xpu_ir::NodeId, &'static str)>, String) {
        let on_library: std::collections::HashSet<xpu_ir::NodeId> = (self.segments.iter())
            .filter_map(|s| match s {
                Segment::Product(p) => Some(p.nodes.iter().copied()),
                Segment::Kernels { .. } => None,
            })
            .flatten()
            .collect();
        let g = &self.graph;
        let kernels = (g.node_ids().filter(|&n| g.node(n).op != Op::Constant))
            .map(|n| (n, if on_library.contains(&n) { CUBLASLT } else { "cuda.fused" }))
            .collect();
        let calls = self.segments.iter().filter(|s| matches!(s, Segment::Product(_))).count();
        let segments = self.segments.len() - calls;
        let described = format!(
            "whole partition in one graph: {segments} generated-kernel segment(s), {calls} cuBLASLt call(s)"
        );
        (kernels, described)
    }

    /// The graph of this partition for `inputs` shapes, over fresh fixed buffers; `Ok(Err)`
    /// with the reason when some segment cannot be captured.
    fn capture_whole(
        &mut self,
        inputs: &[Vec<usize>],
        shapes: &Shapes,
        generation: u64,
    ) -> Result<Result<Whole, String>, EngineError> {
        let (ctx, _) = self.gpu.context()?;
        let gpu = self.gpu.clone();
        let err = |what: &'static str| {
            let gpu = gpu.clone();
            move |e| gpu.driver_error("partition", what, e)
        };
        let stream = ctx.new_stream().map_err(err("capture stream"))?;
        let mut fixed: HashMap<ValueId, Value> = HashMap::new();
        let mut alloc = |v: ValueId, dtype: DType, shape: Vec<usize>| -> Result<(), EngineError> {
            let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
            // SAFETY: written (bind copy or the defining segment) before any read.
            let data = unsafe { crate::engine::alloc_or_trim(&stream, bytes.max(1)) }
                .map_err(|e| gpu.allocation_error("partition", e, bytes as u64))?;
            fixed.insert(
                v,
                Value::Device(Arc::new(CudaBuffer { data, dtype, shape, stream: stream.clone() })),
            );
            Ok(())
        };
        for (&v, shape) in self.graph.inputs.iter().zip(inputs) {
            alloc(v, self.graph.ty(v).dtype, shape.clone())?;
        }
        let mut computed = Vec::new();
        for s in &self.segments {
            match s {
                Segment::Kernels { part, .. } => computed.extend(part.outputs.iter().copied()),
                Segment::Product(p) => computed.push(p.out),
            }
        }
        for v in computed {
            let Some((dtype, shape)) = shapes.get(&v) else {
                return Ok(Err(format!("value {v} was not seen by an eager run")));
            };
            alloc(v, *dtype, shape.clone())?;
        }
        // Constants the segments read, uploaded before the capture (never inside it).
        let mut reads = Vec::new();
        for s in &self.segments {
            match s {
                Segment::Kernels { part, .. } => reads.extend(part.inputs.iter().copied()),
                Segment::Product(p) => {
                    reads.extend([Some(p.a), Some(p.b), p.bias, p.c_matrix].into_iter().flatten())
                }
            }
        }
        let mut operand = HashMap::new();
        for v in reads {
            operand.insert(v, self.value(&fixed, v, generation)?);
        }
        // Nothing is synchronised inside the capture: every buffer it reads is ready now.
        stream.synchronize().map_err(err("synchronize"))?;
        self.library_stream()?.synchronize().map_err(err("synchronize"))?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(err("begin capture"))?;
        let mut segments = std::mem::take(&mut self.segments);
        let queued = (|| -> Result<Result<(), String>, EngineError> {
            for s in &mut segments {
                match s {
                    Segment::Kernels { exe, part } => {
                        let ins: Vec<u64> = part.inputs.iter().map(|v| ptr(&operand[v])).collect();
                        let shapes_in: Vec<Vec<usize>> =
                            part.inputs.iter().map(|v| operand[v].shape().to_vec()).collect();
                        let outs: Vec<u64> = part.outputs.iter().map(|v| ptr(&fixed[v])).collect();
                        if let Err(why) = exe.launch_into(&shapes_in, &ins, &outs, &stream)? {
                            return Ok(Err(why));
                        }
                    }
                    Segment::Product(p) => {
                        let out = ptr(&fixed[&p.out]);
                        self.run_product(p, &operand, generation, Some((&stream, out)))?;
                    }
                }
            }
            Ok(Ok(()))
        })();
        self.segments = segments;
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        let why = match queued {
            Ok(Ok(())) => None,
            Ok(Err(why)) => Some(why),
            Err(e @ EngineError::Uncapturable { .. }) => Some(e.to_string()),
            Err(e) => return Err(e),
        };
        let graph = ended.map_err(err("end capture"))?;
        if let Some(why) = why {
            return Ok(Err(why));
        }
        let graph =
            graph.ok_or_else(|| EngineError::Other("cuda: the capture made no graph".into()))?;
        let bytes = fixed.values().map(Value::size_bytes).sum();
        let _held = crate::engine::HeldBytes::new(bytes, &self.gpu);
        let (kernels, described) = self.replay_description();
        Ok(Ok(Whole {
            generation,
            inputs: inputs.to_vec(),
            graph,
            stream,
            fixed,
            _held,
            kernels,
            described,
        }))
    }
}
