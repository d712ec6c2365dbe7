//! A partition whose matrix products run on cuBLASLt: cut into segments in node order —
//! runs of other nodes, each a partition of its own compiled as generated kernels
//! ([`CudaExecutable`]), and products (with the bias and activation that follow them, when
//! cuBLASLt's epilogue can do it) as cuBLASLt calls ([`cublaslt::GemmPlan`]). Values cross
//! segments as device buffers; nothing goes back to the host.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaStream, DevicePtr};
use xpu_engine::options::{Capture, Determinism, Fallback, PrecisionName};
use xpu_engine::{
    Assignment, EngineError, Executable, Execution, Fact, NodeTiming, StopToken, Value,
};
use xpu_ir::{Graph, NodeId, Op, Partition, Tensor, ValueId};

use crate::cublaslt::{self, Activation, Epilogue, GemmPlan, Handle, Mode};
use crate::engine::{CudaBuffer, DEVICE, Gpu, host_bytes, upload_bytes};
use crate::exec::{CudaExecutable, check_value_inputs, run_from_host};
use crate::lru_map::LruMap;

mod whole;

/// The kernel names the explanation uses.
pub const CUBLASLT: &str = "cuda.cublaslt";
pub const NAIVE: &str = "cuda.naive";

/// One product on cuBLASLt and the epilogue nodes it absorbs.
#[derive(Clone, Debug)]
pub(crate) struct Product {
    pub matmul: NodeId,
    pub a: ValueId,
    pub b: ValueId,
    pub bias: Option<ValueId>,
    /// The value the last absorbed node defines: what the call writes.
    pub out: ValueId,
    /// The matmul and the epilogue nodes, in order.
    pub nodes: Vec<NodeId>,
    pub epilogue: Epilogue,
    pub mode: Mode,
    /// ONNX Gemm's `alpha·op(A)·op(B) + beta·C` (a matmul: 1, no C, 0).
    pub alpha: f32,
    pub beta: f32,
    /// Gemm's C when it is a whole `[M, N]` matrix (a C over columns is `bias`).
    pub c_matrix: Option<ValueId>,
    /// Gemm's `transA` / `transB`.
    pub trans_a: bool,
    pub trans_b: bool,
}

/// The products of `g` that go to cuBLASLt under `assignment`, and notes for the
/// explanation: those assigned `cuda.cublaslt` (the planner's default where it is loaded,
/// or a pin), and by default every product cuBLASLt can take; `cuda.naive` keeps a product
/// in the generated kernels. A product assigned cuBLASLt that it cannot take (a 1-D
/// operand, a partly broadcast C, the library missing) runs as `cuda.naive` with a note
/// saying why — or, under `engines.fallback = "deny"`, is an error naming why.
pub(crate) fn library_products(
    g: &Graph,
    assignment: &Assignment,
    library: Result<&cublaslt::Library, &String>,
) -> Result<(Vec<Product>, Vec<Fact>), EngineError> {
    let tf32 = assignment.precision == Some(PrecisionName::Tf32);
    let mut out: Vec<Product> = Vec::new();
    let mut notes = Vec::new();
    // Nodes a product already took (its epilogue): no second product takes them.
    let mut claimed = std::collections::HashSet::new();
    // Who reads each value: what the folds and epilogues below ask of every product.
    let uses = g.uses();
    for id in g.node_ids() {
        let n = g.node(id);
        if !matches!(n.op, Op::MatMul | Op::Gemm) {
            continue;
        }
        let pinned = assignment.kernels.get(&id).map(String::as_str);
        if pinned == Some(NAIVE) {
            continue;
        }
        let why_not = product_form(g, &uses, id, tf32, library, &claimed);
        match (why_not, pinned) {
            (Ok(p), _) => {
                claimed.extend(p.nodes.iter().copied());
                out.push(p);
            }
            // The loop nest does not lower Gemm: there is nothing to fall back to.
            (Err(why), _) if n.op == Op::Gemm && pinned == Some(CUBLASLT) => {
                return Err(EngineError::Unsupported {
                    engine: "cuda".into(),
                    node: n.label(id),
                    what: format!("{CUBLASLT}: {why} (and cuda.naive does not run Gemm)"),
                });
            }
            (Err(why), Some(CUBLASLT)) if assignment.options.fallback == Fallback::Deny => {
                return Err(EngineError::Unsupported {
                    engine: "cuda".into(),
                    node: n.label(id),
                    what: format!("{CUBLASLT}: {why} (engines.fallback = \"deny\")"),
                });
            }
            (Err(why), Some(CUBLASLT)) => notes.push(Fact {
                node: Some(id),
                key: "cuda.kernel_fallback".into(),
                value: format!("{CUBLASLT} cannot take it ({why}): ran as {NAIVE}"),
            }),
            (Err(_), _) => {}
        }
    }
    Ok((out, notes))
}

/// The product at `mm` as cuBLASLt takes it, or why it cannot.
fn product_form(
    g: &Graph,
    uses: &[Vec<NodeId>],
    mm: NodeId,
    tf32: bool,
    library: Result<&cublaslt::Library, &String>,
    claimed: &std::collections::HashSet<NodeId>,
) -> Result<Product, String> {
    library.map_err(|why| format!("unavailable: {why}"))?;
    let n = g.node(mm);
    let (Some(Some(a)), Some(Some(b))) = (n.inputs.first(), n.inputs.get(1)) else {
        return Err("a product needs two inputs".into());
    };
    let out = n.outputs[0];
    let dtype = g.ty(out).dtype;
    let mode = Mode::of(dtype, tf32).ok_or_else(|| format!("dtype {dtype} (f32, f16, bf16)"))?;
    if g.ty(*a).dtype != dtype || g.ty(*b).dtype != dtype {
        return Err("operands of different dtypes".into());
    }
    let rank = |v: ValueId| g.ty(v).dims.as_ref().map(Vec::len);
    match (rank(*a), rank(*b)) {
        (Some(ra), Some(rb)) if ra >= 2 && rb >= 2 => {}
        _ => return Err("operands of rank < 2 or unknown rank".into()),
    }
    let mut p = Product {
        matmul: mm,
        a: *a,
        b: *b,
        bias: None,
        out,
        nodes: vec![mm],
        epilogue: Epilogue::default(),
        mode,
        alpha: 1.0,
        beta: 0.0,
        c_matrix: None,
        trans_a: false,
        trans_b: false,
    };
    // Static shapes are checked now, so a product cuBLASLt cannot take (a batch broadcast
    // in part, dims past 32 bits) stays in the loop nest instead of failing at run time.
    let dims = |v: ValueId| -> Option<Vec<usize>> {
        g.ty(v).dims.as_ref()?.iter().map(|d| d.known().map(|x| x as usize)).collect()
    };
    if n.op == Op::MatMul {
        fold_transposes(g, uses, &mut p, claimed);
    }
    if let (Some(sa), Some(sb)) = (dims(p.a), dims(p.b)) {
        if n.op == Op::Gemm {
            let t = |k: &str| n.attrs.int(k, 0) != 0;
            gemm_shape(&sa, &sb, t("transA"), t("transB"))?;
        } else {
            product_shape_t(&sa, &sb, p.trans_a, p.trans_b)?;
        }
    }
    if n.op == Op::Gemm {
        gemm_form(g, mm, &mut p)?;
        // C over columns is the bias epilogue already: only an activation may follow.
        absorb_activation(g, uses, &mut p, claimed);
    } else {
        absorb_epilogue(g, uses, &mut p, claimed);
    }
    Ok(p)
}

/// ONNX Gemm (`alpha·op(A)·op(B) + beta·C`, 2-D) as cuBLASLt takes it: transposes as
/// operand flags, alpha and beta as the call's scalars, C as the bias epilogue when it is a
/// vector over the output's columns and beta is 1, or as the call's C matrix when it is the
/// whole `[M, N]`; any other C (a column, a scalar) is refused with why.
fn gemm_form(g: &Graph, mm: NodeId, p: &mut Product) -> Result<(), String> {
    let n = g.node(mm);
    let rank = |v: ValueId| g.ty(v).dims.as_ref().map_or(0, Vec::len);
    if rank(p.a) != 2 || rank(p.b) != 2 {
        return Err("Gemm operands must be 2-D".into());
    }
    p.trans_a = n.attrs.int("transA", 0) != 0;
    p.trans_b = n.attrs.int("transB", 0) != 0;
    p.alpha = n.attrs.float("alpha", 1.0) as f32;
    p.beta = n.attrs.float("beta", 1.0) as f32;
    let Some(Some(c)) = n.inputs.get(2) else {
        p.beta = 0.0;
        return Ok(());
    };
    let (c_ty, out_ty) = (g.ty(*c), g.ty(p.out));
    if c_ty.dtype != out_ty.dtype {
        return Err("C of another dtype".into());
    }
    let (Some(cd), Some(od)) = (c_ty.dims.as_ref(), out_ty.dims.as_ref()) else {
        return Err("C or the output of unknown rank".into());
    };
    let over_columns = !cd.is_empty()
        && cd.last() == od.last()
        && cd[..cd.len() - 1].iter().all(|x| x.known() == Some(1));
    if over_columns && p.beta == 1.0 {
        p.bias = Some(*c);
        p.epilogue.bias = true;
    } else if cd == od && cd.iter().all(|d| d.known().is_some()) {
        p.c_matrix = Some(*c);
    } else {
        return Err(format!(
            "C of shape {cd:?} (beta {}): cuBLASLt takes a vector over the columns (beta 1) or the whole [M, N]",
            p.beta
        ));
    }
    Ok(())
}

/// The one node reading `v`, when `v` is not a graph output.
fn sole_user(g: &Graph, uses: &[Vec<NodeId>], v: ValueId) -> Option<NodeId> {
    let us = &uses[v.index()];
    (!g.is_output(v) && !us.is_empty() && us.iter().all(|u| *u == us[0])).then(|| us[0])
}

/// Whether `id` is a transpose swapping the last two dims (batch dims in place): what
/// cuBLASLt reads for free as a transposed operand.
fn swaps_last_two(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    let Some(r) =
        n.inputs.first().copied().flatten().and_then(|v| g.ty(v).dims.as_ref().map(Vec::len))
    else {
        return false;
    };
    if n.op != Op::Transpose || r < 2 {
        return false;
    }
    let want: Vec<i64> = (0..r as i64 - 2).chain([r as i64 - 1, r as i64 - 2]).collect();
    match n.attrs.ints("perm") {
        Some(p) => p == want.as_slice(),
        None => r == 2,
    }
}

/// A matmul operand made by a transpose of its last two dims, read by nothing else, is
/// taken untransposed with cuBLASLt's operand flag set: the transpose joins the product
/// (no kernel, no copy) — attention's `q · kᵀ`.
fn fold_transposes(
    g: &Graph,
    uses: &[Vec<NodeId>],
    p: &mut Product,
    claimed: &std::collections::HashSet<NodeId>,
) {
    for b_side in [false, true] {
        let v = if b_side { p.b } else { p.a };
        let Some(t) = g.producer(v).filter(|&t| swaps_last_two(g, t) && !claimed.contains(&t))
        else {
            continue;
        };
        if sole_user(g, uses, v) != Some(p.matmul) {
            continue;
        }
        let Some(Some(src)) = g.node(t).inputs.first().copied() else { continue };
        if b_side {
            p.b = src;
            p.trans_b = true;
        } else {
            p.a = src;
            p.trans_a = true;
        }
        p.nodes.insert(0, t);
    }
}

/// Takes a bias add (a vector over the output's columns) and then a ReLU or tanh-GELU into
/// the product's epilogue, when they are its only readers.
fn absorb_epilogue(
    g: &Graph,
    uses: &[Vec<NodeId>],
    p: &mut Product,
    claimed: &std::collections::HashSet<NodeId>,
) {
    // The product's columns (from its output: a folded transpose's B is stored as [n, k]).
    let n_dim = g.ty(p.out).dims.as_ref().and_then(|d| d.last().cloned());
    let out_rank = g.ty(p.out).dims.as_ref().map_or(0, Vec::len);
    if let Some(u) = sole_user(g, uses, p.out).filter(|u| !claimed.contains(u)) {
        let node = g.node(u);
        let other = node.input_values().find(|v| *v != p.out);
        let is_bias = |v: ValueId| {
            let ty = g.ty(v);
            ty.dtype == g.ty(p.out).dtype
                && ty.dims.as_ref().is_some_and(|d| {
                    // No wider than the product (a bias of higher rank would broadcast the
                    // output to a shape the call does not write).
                    !d.is_empty()
                        && d.len() <= out_rank
                        && d.last().cloned() == n_dim
                        && d[..d.len() - 1].iter().all(|x| x.known() == Some(1))
                })
        };
        if node.op == Op::Add
            && node.input_values().filter(|v| *v == p.out).count() == 1
            && let Some(bias) = other.filter(|v| is_bias(*v))
        {
            p.bias = Some(bias);
            p.epilogue.bias = true;
            p.out = node.outputs[0];
            p.nodes.push(u);
        }
    }
    absorb_activation(g, uses, p, claimed);
}

/// Takes a ReLU or tanh-GELU into the epilogue when it is the product's only reader.
fn absorb_activation(
    g: &Graph,
    uses: &[Vec<NodeId>],
    p: &mut Product,
    claimed: &std::collections::HashSet<NodeId>,
) {
    if let Some(u) = sole_user(g, uses, p.out).filter(|u| !claimed.contains(u)) {
        let node = g.node(u);
        let activation = match node.op {
            Op::Relu => Activation::Relu,
            Op::Gelu if node.attrs.str("approximate", "none") == "tanh" => Activation::GeluTanh,
            _ => return,
        };
        p.epilogue.activation = activation;
        p.out = node.outputs[0];
        p.nodes.push(u);
    }
}

/// One piece of a cut partition: a run of nodes for generated kernels, or a product.
#[derive(Debug)]
enum Piece {
    Kernels(Vec<NodeId>),
    Product(Product),
}

/// `g` cut in node order into runs of nodes and `products`, each product where its last
/// absorbed node stood (so a bias computed after the matmul is ready); constants are not
/// nodes of any run (a partition copies in the constants it reads, a product uploads its
/// own).
fn cut(g: &Graph, products: Vec<Product>) -> Vec<Piece> {
    let mut at_last: HashMap<NodeId, Product> = HashMap::new();
    let mut absorbed = vec![false; g.nodes.len()];
    for p in products {
        for n in &p.nodes {
            absorbed[n.index()] = true;
        }
        at_last.insert(*p.nodes.last().unwrap_or(&p.matmul), p);
    }
    let mut pieces = Vec::new();
    let mut run: Vec<NodeId> = Vec::new();
    for id in g.node_ids() {
        if g.node(id).op == Op::Constant {
            continue;
        }
        if let Some(p) = at_last.remove(&id) {
            if !run.is_empty() {
                pieces.push(Piece::Kernels(std::mem::take(&mut run)));
            }
            pieces.push(Piece::Product(p));
        } else if !absorbed[id.index()] {
            run.push(id);
        }
    }
    if !run.is_empty() {
        pieces.push(Piece::Kernels(run));
    }
    pieces
}

enum Segment {
    Kernels { exe: Box<CudaExecutable>, part: Partition },
    Product(Product),
}

/// State of the cuBLASLt calls in one context generation.
struct LibraryState {
    generation: u64,
    stream: Arc<CudaStream>,
    handle: Handle,
    workspace: Option<crate::engine::Held>,
}

pub(crate) struct SegmentedExecutable {
    graph: Arc<Graph>,
    gpu: Arc<Gpu>,
    segments: Vec<Segment>,
    deterministic: bool,
    /// Per product (by matmul node) and shape: the plan, the least recently used dropped
    /// (its descriptors destroyed) past the engine's capacity, so a partition fed ever new
    /// shapes does not keep a plan for each.
    plans: LruMap<(NodeId, cublaslt::Shape), GemmPlan>,
    state: Option<LibraryState>,
    /// Constants the products read, uploaded once per context generation.
    constants: HashMap<ValueId, (u64, Value)>,
    capture: Capture,
    /// `memory.limit`: a product's operands, output and workspace must fit it (the
    /// generated segments check their own arena and inputs).
    memory_limit: Option<u64>,
    /// Facts every run reports (kernel fallbacks decided at prepare).
    notes: Vec<Fact>,
    /// `execution.capture = "graph"` with the arena pool: the whole partition, cuBLASLt
    /// calls included, is captured as one graph after an eager run ([`whole`]).
    whole_capture: bool,
    /// The partition is one cuBLASLt call: run eagerly even under capture.
    single_call: bool,
    /// Per set of input shapes, every value's shape from an eager run.
    seen: HashMap<Vec<Vec<usize>>, whole::Shapes>,
    whole: Option<whole::Whole>,
    /// Per set of input shapes, why the partition could not be captured whole (it then
    /// runs eagerly with those shapes).
    not_captured: HashMap<Vec<Vec<usize>>, String>,
    /// Whole-partition graphs captured so far.
    captures: u64,
}

impl SegmentedExecutable {
    pub(crate) fn prepare(
        graph: Graph,
        gpu: Arc<Gpu>,
        assignment: &Assignment,
        products: Vec<Product>,
        notes: Vec<Fact>,
        plan_capacity: usize,
    ) -> Result<SegmentedExecutable, EngineError> {
        let pieces = cut(&graph, products);
        // One cuBLASLt call alone gains nothing from a graph: binding its inputs and copying
        // its output out of the graph's buffers cost more than the launch a replay saves
        // (H200: 31 µs eager, 42 µs replayed, at batch 37).
        let whole_capture = assignment.options.capture == Capture::Graph
            && assignment.options.memory_pool == xpu_engine::options::Pool::Arena
            && pieces.len() >= 2;
        // Captured whole, the segments run eagerly inside the one graph.
        let mut inner = assignment.options.clone();
        if whole_capture {
            inner.capture = Capture::Eager;
        }
        let single_call = pieces.len() == 1;
        let mut segments = Vec::new();
        for piece in pieces {
            segments.push(match piece {
                Piece::Kernels(nodes) => {
                    let part = graph.partition(&nodes);
                    let exe = CudaExecutable::prepare(part.graph.clone(), gpu.clone(), &inner)?;
                    Segment::Kernels { exe: Box::new(exe), part }
                }
                Piece::Product(p) => Segment::Product(p),
            });
        }
        Ok(SegmentedExecutable {
            graph: Arc::new(graph),
            gpu,
            segments,
            deterministic: assignment.options.determinism == Determinism::Bitwise,
            plans: LruMap::new(plan_capacity),
            state: None,
            constants: HashMap::new(),
            capture: assignment.options.capture,
            memory_limit: assignment.options.memory_limit,
            notes,
            whole_capture,
            single_call,
            seen: HashMap::new(),
            whole: None,
            not_captured: HashMap::new(),
            captures: 0,
        })
    }

    /// The library state of the live context (made afresh after a context reset).
    fn state(&mut self) -> Result<u64, EngineError> {
        let (ctx, generation) = self.gpu.context()?;
        if self.state.as_ref().is_some_and(|s| s.generation == generation) {
            return Ok(generation);
        }
        self.state = None;
        self.plans.clear();
        self.constants.clear();
        let stream =
            ctx.new_stream().map_err(|e| self.gpu.driver_error("cublaslt", "new stream", e))?;
        let handle = Handle::new().map_err(|e| library_error("cublaslt", &e))?;
        self.state = Some(LibraryState { generation, stream, handle, workspace: None });
        Ok(generation)
    }

    /// The value `v` of the partition: computed, an input, or a constant (uploaded once).
    fn value(
        &mut self,
        values: &HashMap<ValueId, Value>,
        v: ValueId,
        generation: u64,
    ) -> Result<Value, EngineError> {
        if let Some(x) = values.get(&v) {
            return Ok(x.clone());
        }
        if let Some((g, x)) = self.constants.get(&v)
            && *g == generation
        {
            return Ok(x.clone());
        }
        let t = self.graph.const_value(v).ok_or_else(|| {
            EngineError::Other(format!("cuda: value {v} is read before it is computed"))
        })?;
        let stream = self.library_stream()?;
        let data = upload_bytes(&stream, host_bytes(t, "constant")?)
            .map_err(|e| self.gpu.driver_error("constant", "upload", e))?;
        let x = Value::Device(Arc::new(CudaBuffer {
            data,
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            stream,
        }));
        self.constants.insert(v, (generation, x.clone()));
        Ok(x)
    }

    /// The plan cache as facts every run reports: plans held now (`cuda.cublaslt_plans`)
    /// and plans dropped to stay within the capacity so far (`cuda.cublaslt_plans_evicted`)
    /// — what a `/metrics` gauge of cache entries can read.
    fn plan_cache_facts(&self) -> [Fact; 2] {
        let fact = |key: &str, value: String| Fact { node: None, key: key.into(), value };
        [
            fact("cuda.cublaslt_plans", self.plans.len().to_string()),
            fact("cuda.cublaslt_plans_evicted", self.plans.evictions().to_string()),
        ]
    }

    fn library_stream(&self) -> Result<Arc<CudaStream>, EngineError> {
        self.state
            .as_ref()
            .map(|s| s.stream.clone())
            .ok_or_else(|| EngineError::Other("cuda: no cuBLASLt state".into()))
    }

    /// A run on device values; on an error the library stream is drained before returning,
    /// so no queued call outlives the buffers the caller drops next.
    fn run_device(
        &mut self,
        inputs: &[Value],
        stop: &StopToken,
    ) -> Result<Execution<Value>, EngineError> {
        let result = self.run_device_queued(inputs, stop);
        if result.is_err()
            && let Some(s) = &self.state
        {
            let _ = s.stream.synchronize();
        }
        result
    }

    fn run_device_queued(
        &mut self,
        inputs: &[Value],
        stop: &StopToken,
    ) -> Result<Execution<Value>, EngineError> {
        let generation = self.state()?;
        let input_shapes: Vec<Vec<usize>> = inputs.iter().map(|v| v.shape().to_vec()).collect();
        if self.whole_capture
            && !self.not_captured.contains_key(&input_shapes)
            && self.seen.contains_key(&input_shapes)
            && let Some(run) = self.run_whole(inputs, &input_shapes, generation, stop)?
        {
            return Ok(run);
        }
        let mut values: HashMap<ValueId, Value> =
            self.graph.inputs.iter().copied().zip(inputs.iter().cloned()).collect();
        let mut timings = Vec::new();
        let mut facts = self.notes.clone();
        let mut segments = std::mem::take(&mut self.segments);
        let result = (|| {
            for seg in &mut segments {
                match seg {
                    Segment::Kernels { exe, part } => {
                        stop.check(|| "partition".into())?;
                        let ins = part
                            .inputs
                            .iter()
                            .map(|&v| self.value(&values, v, generation))
                            .collect::<Result<Vec<_>, _>>()?;
                        let run = exe.run_values(&ins, stop)?;
                        for (&v, x) in part.outputs.iter().zip(run.outputs) {
                            values.insert(v, x);
                        }
                        let back = |n: NodeId| part.sources.get(n.index()).copied().flatten();
                        timings.extend(
                            run.timings
                                .into_iter()
                                .filter_map(|t| Some(NodeTiming { node: back(t.node)?, ..t })),
                        );
                        facts.extend(
                            run.facts
                                .into_iter()
                                .map(|f| Fact { node: f.node.and_then(back), ..f }),
                        );
                    }
                    Segment::Product(p) => {
                        let label = self.graph.node(p.matmul).label(p.matmul);
                        stop.check(|| label.clone())?;
                        let p = p.clone();
                        let (out, nanos, plan_facts) =
                            self.run_product(&p, &values, generation, None)?;
                        let out = out.ok_or_else(|| {
                            EngineError::Other("cuda: an eager product gave no value".into())
                        })?;
                        values.insert(p.out, out);
                        let share = nanos / p.nodes.len() as u64;
                        timings.extend(p.nodes.iter().map(|&node| NodeTiming {
                            node,
                            kernel: CUBLASLT.into(),
                            nanos: share,
                        }));
                        facts.extend(plan_facts);
                    }
                }
            }
            Ok::<(), EngineError>(())
        })();
        self.segments = segments;
        result?;
        if self.whole_capture && !self.seen.contains_key(&input_shapes) {
            let shapes: whole::Shapes = values
                .iter()
                .filter_map(|(&v, x)| match x {
                    Value::Device(b) => Some((v, (b.dtype(), b.shape().to_vec()))),
                    Value::Host(_) => None,
                })
                .collect();
            self.seen.insert(input_shapes.clone(), shapes);
        }
        if self.capture == Capture::Graph {
            let how = match (self.not_captured.get(&input_shapes), self.whole_capture) {
                (Some(why), _) => format!("eager: the partition cannot be captured whole ({why})"),
                (None, true) => "eager this run; the next run with these shapes captures the whole partition, cuBLASLt calls included".into(),
                (None, false) if self.single_call => "eager: one cuBLASLt call, which a replay would not make faster (binding its inputs and copying its output out cost more than the launch saved)".into(),
                (None, false) => "per generated-kernel segment (memory.pool is not \"arena\"); cuBLASLt calls run eagerly between them".into(),
            };
            facts.push(Fact { node: None, key: "cuda.capture".into(), value: how });
        }
        facts.extend(self.plan_cache_facts());
        // The graph is shared: hold it, not a copy of its outputs, while `value` borrows self.
        let graph = self.graph.clone();
        let outputs = graph
            .outputs
            .iter()
            .map(|o| self.value(&values, o.value, generation))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Execution { outputs, timings, facts })
    }

    /// One product: shapes from its operands, the plan for them (made once), the call
    /// between two events. Returns the output, the device time and the plan's facts.
    /// `into` (a stream being captured and the output's fixed buffer): the call is queued
    /// there with no allocation, no timing and no output value — the plan and workspace
    /// must exist already (an eager run of these shapes made them).
    fn run_product(
        &mut self,
        p: &Product,
        values: &HashMap<ValueId, Value>,
        generation: u64,
        into: Option<(&Arc<CudaStream>, u64)>,
    ) -> Result<(Option<Value>, u64, Vec<Fact>), EngineError> {
        let label = self.graph.node(p.matmul).label(p.matmul);
        let a = self.value(values, p.a, generation)?;
        let b = self.value(values, p.b, generation)?;
        let bias = p.bias.map(|v| self.value(values, v, generation)).transpose()?;
        let c_matrix = p.c_matrix.map(|v| self.value(values, v, generation)).transpose()?;
        let stream = match into {
            Some((s, _)) => s.clone(),
            None => self.library_stream()?,
        };
        let uncapturable = |what: &str| EngineError::Uncapturable {
            engine: "cuda".into(),
            node: label.clone(),
            what: what.into(),
        };
        let buf = |v: &Value,
                   what: &str|
         -> Result<Arc<dyn xpu_engine::DeviceBuffer>, EngineError> {
            let Value::Device(b) = v else {
                return Err(EngineError::NoDevice {
                    engine: "cuda".into(),
                    device: v.device(),
                    what: "take a host value as a cuBLASLt operand (the plan lacks a transfer)"
                        .into(),
                });
            };
            let cb = b.as_any().downcast_ref::<CudaBuffer>().ok_or_else(|| EngineError::Input {
                name: what.into(),
                message: "not a cuda buffer".into(),
            })?;
            if cb.stream.context().cu_ctx() != stream.context().cu_ctx() {
                return Err(EngineError::Input {
                    name: what.into(),
                    message: "a device value from a CUDA context that was reset after an error: upload it again".into(),
                });
            }
            // (A capture's operands were all made ready before it began.)
            if into.is_none() && cb.stream.cu_stream() != stream.cu_stream() {
                cb.stream
                    .synchronize()
                    .map_err(|e| self.gpu.driver_error(&label, "synchronize", e))?;
            }
            Ok(b.clone())
        };
        let (ab, bb) = (buf(&a, "a")?, buf(&b, "b")?);
        let biasb = bias.as_ref().map(|v| buf(v, "bias")).transpose()?;
        let cb = c_matrix.as_ref().map(|v| buf(v, "C")).transpose()?;
        let gemm = self.graph.node(p.matmul).op == Op::Gemm;
        let (shape, out_shape) = if gemm {
            gemm_shape(ab.shape(), bb.shape(), p.trans_a, p.trans_b)
        } else {
            product_shape_t(ab.shape(), bb.shape(), p.trans_a, p.trans_b)
        }
        .map_err(|what| EngineError::Unsupported {
            engine: "cuda".into(),
            node: label.clone(),
            what,
        })?;
        if let Some(c) = &cb
            && c.shape() != out_shape.as_slice()
        {
            return Err(EngineError::Input {
                name: label.clone(),
                message: format!("C of shape {:?} for an output of {out_shape:?}", c.shape()),
            });
        }
        if let Some(bias) = &biasb
            && bias.shape().iter().product::<usize>() as u64 != shape.n
        {
            return Err(EngineError::Input {
                name: label.clone(),
                message: format!("bias of shape {:?} for {} columns", bias.shape(), shape.n),
            });
        }
        let dtype = self.graph.ty(p.out).dtype;
        let out_bytes = out_shape.iter().product::<usize>() * dtype.size_bytes();
        let gpu = self.gpu.clone();
        let err = |what: &'static str| {
            let label = label.clone();
            let gpu = gpu.clone();
            move |e| gpu.driver_error(&label, what, e)
        };
        let empty = shape.m == 0 || shape.n == 0 || shape.batch == 0;
        if empty || shape.k == 0 {
            // Nothing to multiply: an empty output, or sums of nothing — zeros, then the
            // epilogue, which cuBLASLt is not asked to run on an empty product.
            if shape.k == 0 && !empty && (p.epilogue != Epilogue::default() || p.c_matrix.is_some())
            {
                return Err(EngineError::Unsupported {
                    engine: "cuda".into(),
                    node: label,
                    what: "a product over an empty inner dim with a fused epilogue".into(),
                });
            }
            if into.is_some() {
                return Err(uncapturable("an empty product"));
            }
            let data = crate::engine::alloc_zeros_or_trim(&stream, out_bytes.max(1))
                .map_err(|e| with_request(gpu.driver_error(&label, "allocation", e), out_bytes))?;
            let out = CudaBuffer { data, dtype, shape: out_shape, stream: stream.clone() };
            return Ok((Some(Value::Device(Arc::new(out))), 0, Vec::new()));
        }
        let key = (p.matmul, shape);
        // (A plan evicted since the eager run that made it: the capture gives up, and these
        // shapes run eagerly with the reason in `cuda.capture`.)
        if into.is_some() && !self.plans.contains(&key) {
            return Err(uncapturable("choosing an algorithm"));
        }
        if !self.plans.contains(&key) {
            let state = self
                .state
                .as_ref()
                .ok_or_else(|| EngineError::Other("cuda: no cuBLASLt state".into()))?;
            let plan = GemmPlan::new(&state.handle, p.mode, shape, p.epilogue, self.deterministic)
                .map_err(|e| library_error(&label, &e))?;
            // A full cache hands back its least recently used plan: dropped here, its
            // descriptors destroyed.
            drop(self.plans.insert(key, plan));
        }
        let plan = self
            .plans
            .get(&key)
            .ok_or_else(|| EngineError::Other("cuda: the cuBLASLt plan was not kept".into()))?;
        let operand_bytes: u64 = [Some(&ab), Some(&bb), biasb.as_ref(), cb.as_ref()]
            .into_iter()
            .flatten()
            .map(|b| (b.shape().iter().product::<usize>() * b.dtype().size_bytes()) as u64)
            .sum();
        let needed = operand_bytes + out_bytes as u64 + plan.workspace_bytes as u64;
        if let Some(limit) = self.memory_limit
            && needed > limit
        {
            return Err(EngineError::MemoryLimit {
                what: format!(
                    "{CUBLASLT} {label} on {DEVICE} (operands {operand_bytes}, output {out_bytes}, workspace {})",
                    plan.workspace_bytes
                ),
                needed,
                limit,
            });
        }
        let state = self
            .state
            .as_mut()
            .ok_or_else(|| EngineError::Other("cuda: no cuBLASLt state".into()))?;
        if state.workspace.as_ref().is_none_or(|w| w.len() < plan.workspace_bytes) {
            if into.is_some() {
                return Err(uncapturable("allocating a workspace"));
            }
            state.workspace = None;
            // SAFETY: scratch memory cuBLASLt writes before it reads.
            let slice =
                unsafe { crate::engine::alloc_or_trim(&stream, plan.workspace_bytes.max(1)) }
                    .map_err(|e| {
                        with_request(
                            gpu.driver_error(&label, "workspace allocation", e),
                            plan.workspace_bytes,
                        )
                    })?;
            state.workspace = Some(crate::engine::Held::new(slice, &gpu));
        }
        let data = match into {
            Some(_) => None,
            None => {
                // SAFETY: written by the product below before anyone reads it.
                Some(unsafe { crate::engine::alloc_or_trim(&stream, out_bytes.max(1)) }.map_err(
                    |e| with_request(gpu.driver_error(&label, "allocation", e), out_bytes),
                )?)
            }
        };
        let d = match (&data, into) {
            (Some(data), _) => data.device_ptr(&stream).0,
            (None, Some((_, fixed))) => fixed,
            (None, None) => unreachable!("allocated above"),
        };
        let ptr = |b: &Arc<dyn xpu_engine::DeviceBuffer>| {
            b.as_any().downcast_ref::<CudaBuffer>().map_or(0, |c| c.data.device_ptr(&stream).0)
        };
        let workspace = state.workspace.as_ref().map_or(0, |w| w.device_ptr(&stream).0);
        // Events recorded during a capture are not timed: the graph's time is reported.
        let t0 = match into {
            Some(_) => None,
            None => Some(
                stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err("event"))?,
            ),
        };
        // SAFETY: operands, bias and output are live allocations of this context holding the
        // shapes the plan was made for (from their own shapes, dtype checked at prepare);
        // the workspace holds the plan's bytes; all outlive the synchronisation below or
        // are kept by the output value, ordered on `stream`.
        unsafe {
            plan.run(
                &state.handle,
                stream.cu_stream(),
                cublaslt::Operands {
                    a: ptr(&ab),
                    b: ptr(&bb),
                    c: cb.as_ref().map(ptr),
                    d,
                    bias: biasb.as_ref().map(ptr),
                    alpha: p.alpha,
                    beta: if p.c_matrix.is_some() { p.beta } else { 0.0 },
                },
                workspace,
            )
        }
        .map_err(|e| library_error(&label, &e))?;
        let ms = match t0 {
            Some(t0) => {
                let t1 = stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(err("event"))?;
                t0.elapsed_ms(&t1).map_err(err("timing"))?
            }
            None => 0.0,
        };
        let facts = vec![Fact {
            node: Some(p.matmul),
            key: "cuda.cublaslt".into(),
            value: format!(
                "{} [{}×{}×{}, batch {}]{}{}, epilogue {}: algorithm {}",
                plan.mode.describe(),
                shape.m,
                shape.n,
                shape.k,
                shape.batch,
                match (shape.trans_a, shape.trans_b) {
                    (false, false) => "",
                    (true, false) => " Aᵀ",
                    (false, true) => " Bᵀ",
                    (true, true) => " Aᵀ Bᵀ",
                },
                if p.alpha != 1.0 || p.c_matrix.is_some() {
                    format!(
                        ", alpha {} beta {}",
                        p.alpha,
                        if p.c_matrix.is_some() { p.beta } else { 0.0 }
                    )
                } else {
                    String::new()
                },
                plan.epilogue.describe(),
                plan.algorithm
            ),
        }];
        let out = data.map(|data| {
            Value::Device(Arc::new(CudaBuffer { data, dtype, shape: out_shape, stream }))
        });
        Ok((out, (ms as f64 * 1e6) as u64, facts))
    }
}

/// The product's dims from its operands' shapes (numpy matmul, batch dims broadcast where
/// one side has a single matrix), and the output's shape.
/// [`product_shape`] of operands stored transposed (`trans_a` / `trans_b`: their last two
/// dims swapped), with the flags set for cuBLASLt.
pub(crate) fn product_shape_t(
    sa: &[usize],
    sb: &[usize],
    trans_a: bool,
    trans_b: bool,
) -> Result<(cublaslt::Shape, Vec<usize>), String> {
    let view = |s: &[usize], t: bool| {
        let mut v = s.to_vec();
        if t && v.len() >= 2 {
            let r = v.len();
            v.swap(r - 1, r - 2);
        }
        v
    };
    let (mut shape, out) = product_shape(&view(sa, trans_a), &view(sb, trans_b))?;
    shape.trans_a = trans_a;
    shape.trans_b = trans_b;
    Ok((shape, out))
}

pub(crate) fn product_shape(
    sa: &[usize],
    sb: &[usize],
) -> Result<(cublaslt::Shape, Vec<usize>), String> {
    if sa.len() < 2 || sb.len() < 2 {
        return Err(format!("operands {sa:?} @ {sb:?}: rank 2 or more"));
    }
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != k2 {
        return Err(format!("inner dims differ: {sa:?} @ {sb:?}"));
    }
    let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    let batch_shape = xpu_ir::infer::broadcast_shapes(ba, bb)?;
    let count: usize = batch_shape.iter().product();
    let stride = |own: &[usize], matrix: usize| -> Result<i64, String> {
        let n: usize = own.iter().product();
        if n == 1 {
            Ok(0)
        } else if n == count && own.iter().rev().zip(batch_shape.iter().rev()).all(|(x, y)| x == y)
        {
            Ok(matrix as i64)
        } else {
            Err(format!(
                "batch dims {sa:?} @ {sb:?} broadcast partly (cuBLASLt takes one stride per operand)"
            ))
        }
    };
    let big = |x: usize| u64::try_from(x).ok().filter(|&v| v <= i32::MAX as u64);
    let fits = [m, n, k, count].iter().all(|&x| big(x).is_some());
    if !fits {
        return Err(format!("dims of {sa:?} @ {sb:?} exceed cuBLASLt's 32-bit sizes"));
    }
    let shape = cublaslt::Shape {
        batch: count as u64,
        m: m as u64,
        n: n as u64,
        k: k as u64,
        stride_a: stride(ba, m * k)?,
        stride_b: stride(bb, k * n)?,
        trans_a: false,
        trans_b: false,
    };
    let mut out = batch_shape;
    out.extend([m, n]);
    Ok((shape, out))
}

/// ONNX Gemm's dims: 2-D `op(A)[M, K] · op(B)[K, N]`, `A` stored `[K, M]` under `transA`,
/// `B` stored `[N, K]` under `transB`.
pub(crate) fn gemm_shape(
    sa: &[usize],
    sb: &[usize],
    trans_a: bool,
    trans_b: bool,
) -> Result<(cublaslt::Shape, Vec<usize>), String> {
    let ([r0, r1], [s0, s1]) = (sa, sb) else {
        return Err(format!("Gemm operands {sa:?}, {sb:?}: 2-D only"));
    };
    let (m, k) = if trans_a { (*r1, *r0) } else { (*r0, *r1) };
    let (k2, n) = if trans_b { (*s1, *s0) } else { (*s0, *s1) };
    if k != k2 {
        return Err(format!(
            "inner dims differ: {sa:?} (transA {trans_a}) · {sb:?} (transB {trans_b})"
        ));
    }
    if [m, n, k].iter().any(|&x| x > i32::MAX as usize) {
        return Err(format!("dims of {sa:?} · {sb:?} exceed cuBLASLt's 32-bit sizes"));
    }
    let shape = cublaslt::Shape {
        batch: 1,
        m: m as u64,
        n: n as u64,
        k: k as u64,
        stride_a: 0,
        stride_b: 0,
        trans_a,
        trans_b,
    };
    Ok((shape, vec![m, n]))
}

/// A driver OOM with the bytes the failed allocation asked for.
fn with_request(e: EngineError, bytes: usize) -> EngineError {
    match e {
        EngineError::OutOfMemory { device, available, reserved, .. } => {
            EngineError::OutOfMemory { device, requested: bytes as u64, available, reserved }
        }
        other => other,
    }
}

fn library_error(node: &str, message: &str) -> EngineError {
    EngineError::Kernel { node: node.to_string(), message: format!("{CUBLASLT}: {message}") }
}

impl Executable for SegmentedExecutable {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        xpu_engine::check_inputs(&self.graph, inputs)?;
        self.state()?;
        let stream = self.library_stream()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Graph {
        xpu_ir::text::parse(text).unwrap()
    }

    fn loaded() -> cublaslt::Library {
        cublaslt::Library { path: "libcublasLt.so.13".into(), version: 130100 }
    }

    const MLP: &str = r#"graph "m" {
  %0: f32[N,8] = input "x"
  %1: f32[8,4] = input "w1"
  %2: f32[4] = input "b1"
  %3: f32[4,2] = input "w2"
  %4: f32[1,2] = input "b2"
  %5: f32[N,4] = matmul(%0, %1) @name("fc1")
  %6: f32[N,4] = add(%5, %2)
  %7: f32[N,4] = relu(%6)
  %8: f32[N,2] = matmul(%7, %3) @name("fc2")
  %9: f32[N,2] = add(%4, %8)
  %10: f32[N,2] = gelu(%9) {approximate = "none"}
  return "y" = %10
}"#;

    #[test]
    fn a_transpose_of_the_last_two_dims_read_only_by_a_product_is_its_operand_flag() {
        let lib = loaded();
        let text = |perm: &str, extra: &str| {
            format!(
                "graph \"att\" {{\n  %0: f32[2,5,7] = input \"q\"\n  %1: f32[2,4,7] = input \"k\"\n  %2: f32[2,7,4] = transpose(%1) {{perm = [{perm}]}}\n  %3: f32[2,5,4] = matmul(%0, %2)\n  return \"s\" = %3\n{extra}}}"
            )
        };
        let ps = library_products(&parse(&text("0, 2, 1", "")), &Assignment::new("cuda"), Ok(&lib))
            .unwrap()
            .0;
        assert_eq!(ps.len(), 1);
        let p = &ps[0];
        assert!(p.trans_b && !p.trans_a, "{p:?}");
        assert_eq!((p.b, p.nodes.len()), (ValueId(1), 2), "B is k itself; the transpose joins");
        let (shape, out) = product_shape_t(&[2, 5, 7], &[2, 4, 7], false, true).unwrap();
        assert_eq!((shape.m, shape.n, shape.k, shape.batch, shape.trans_b), (5, 4, 7, 2, true));
        assert_eq!(out, vec![2, 5, 4]);
        // Read by something else too (the transposed value is an output): stays a kernel.
        let shared = text("0, 2, 1", "  return \"kt\" = %2\n");
        let ps = library_products(&parse(&shared), &Assignment::new("cuda"), Ok(&lib)).unwrap().0;
        assert!(!ps[0].trans_b && ps[0].nodes.len() == 1);
    }

    #[test]
    fn products_take_their_bias_and_activation_when_cublaslt_can() {
        let g = parse(MLP);
        let lib = loaded();
        let ps = library_products(&g, &Assignment::new("cuda"), Ok(&lib)).unwrap().0;
        assert_eq!(ps.len(), 2);
        assert_eq!(ps[0].epilogue, Epilogue { bias: true, activation: Activation::Relu });
        assert_eq!(ps[0].nodes.len(), 3);
        // Exact GELU is not cuBLASLt's (tanh) GELU: the bias is taken, the GELU is not.
        assert_eq!(ps[1].epilogue, Epilogue { bias: true, activation: Activation::None });
        assert_eq!(ps[1].mode, Mode::F32Strict);
        let mut tf32 = Assignment::new("cuda");
        tf32.precision = Some(PrecisionName::Tf32);
        assert!(
            library_products(&g, &tf32, Ok(&lib)).unwrap().0.iter().all(|p| p.mode == Mode::Tf32)
        );
    }

    #[test]
    fn a_pin_to_naive_keeps_the_loop_nest_and_a_pin_to_cublaslt_names_why_it_cannot() {
        let g = parse(MLP);
        let fc1 = g.node_ids().find(|&n| g.node(n).op == Op::MatMul).unwrap();
        let mut a = Assignment::new("cuda");
        a.kernels.insert(fc1, NAIVE.into());
        let lib = loaded();
        assert_eq!(library_products(&g, &a, Ok(&lib)).unwrap().0.len(), 1);
        // Without the library nothing goes to it by default; an assignment to it runs the
        // loop nest with a note saying why, or under fallback = "deny" is an error.
        let missing = "cuBLASLt not found".to_string();
        assert!(
            library_products(&g, &Assignment::new("cuda"), Err(&missing)).unwrap().0.is_empty()
        );
        a.kernels.insert(fc1, CUBLASLT.into());
        let (taken, notes) = library_products(&g, &a, Err(&missing)).unwrap();
        assert!(taken.is_empty());
        assert_eq!(notes.len(), 1);
        assert!(notes[0].value.contains("cuBLASLt not found") && notes[0].node == Some(fc1));
        a.options.fallback = Fallback::Deny;
        let e = library_products(&g, &a, Err(&missing)).unwrap_err().to_string();
        assert!(e.contains("cuBLASLt not found") && e.contains("fc1"), "{e}");
        // f64 is not a cuBLASLt dtype here.
        let g64 = parse(&MLP.replace("f32", "f64"));
        let e = library_products(&g64, &a, Ok(&lib)).unwrap_err().to_string();
        assert!(e.contains("dtype f64"), "{e}");
    }

    #[test]
    fn an_epilogue_value_read_elsewhere_stays_out_of_the_call() {
        let g = parse(
            r#"graph "m" {
  %0: f32[3,8] = input "x"
  %1: f32[8,4] = input "w"
  %2: f32[4] = input "b"
  %3: f32[3,4] = matmul(%0, %1)
  %4: f32[3,4] = add(%3, %2)
  %5: f32[3,4] = relu(%4)
  return "pre" = %4
  return "y" = %5
}"#,
        );
        let lib = loaded();
        let ps = library_products(&g, &Assignment::new("cuda"), Ok(&lib)).unwrap().0;
        assert_eq!(ps[0].epilogue, Epilogue { bias: true, activation: Activation::None });
        // A bias over rows (not columns) is not cuBLASLt's bias.
        let g = parse(
            r#"graph "m" {
  %0: f32[3,8] = input "x"
  %1: f32[8,4] = input "w"
  %2: f32[3,1] = input "b"
  %3: f32[3,4] = matmul(%0, %1)
  %4: f32[3,4] = add(%3, %2)
  return "y" = %4
}"#,
        );
        let ps = library_products(&g, &Assignment::new("cuda"), Ok(&lib)).unwrap().0;
        assert_eq!(ps[0].epilogue, Epilogue::default());
        assert_eq!(ps[0].nodes.len(), 1);
    }

    fn gemm(c_shape: &str, attrs: &str) -> Graph {
        parse(&format!(
            r#"graph "g" {{
  %0: f32[3,8] = input "x"
  %1: f32[4,8] = input "w"
  %2: f32[{c_shape}] = input "c"
  %3: f32[3,4] = gemm(%0, %1, %2) {{{attrs}}} @name("fc")
  %4: f32[3,4] = relu(%3)
  return "y" = %4
}}"#
        ))
    }

    #[test]
    fn onnx_gemm_takes_its_transposes_scalars_and_c_into_the_call() {
        let lib = loaded();
        let a = Assignment::new("cuda");
        // A Linear layer as PyTorch exports it: transB = 1, C a bias over columns.
        let ps = library_products(&gemm("4", "transB = 1"), &a, Ok(&lib)).unwrap().0;
        let p = &ps[0];
        assert!(p.trans_b && !p.trans_a && p.alpha == 1.0 && p.c_matrix.is_none());
        assert_eq!(p.epilogue, Epilogue { bias: true, activation: Activation::Relu });
        // A whole C with beta 2 is the call's C matrix; the ReLU still follows.
        let ps = library_products(&gemm("3,4", "transB = 1, beta = 2.0"), &a, Ok(&lib)).unwrap().0;
        assert!(ps[0].c_matrix.is_some() && ps[0].beta == 2.0 && !ps[0].epilogue.bias);
        assert_eq!(ps[0].epilogue.activation, Activation::Relu);
        // A bias with beta ≠ 1, or a C over rows, is not cuBLASLt's: a pin names why.
        let mut pinned = Assignment::new("cuda");
        pinned.options.fallback = Fallback::Deny;
        for (c, attrs) in [("4", "transB = 1, beta = 0.5"), ("3,1", "transB = 1")] {
            let g = gemm(c, attrs);
            assert!(library_products(&g, &a, Ok(&lib)).unwrap().0.is_empty(), "{c} {attrs}");
            let fc = g.node_ids().find(|&n| g.node(n).op == Op::Gemm).unwrap();
            pinned.kernels.insert(fc, CUBLASLT.into());
            let e = library_products(&g, &pinned, Ok(&lib)).unwrap_err().to_string();
            assert!(e.contains("C of shape") && e.contains("fc"), "{e}");
        }
    }

    #[test]
    fn a_partition_is_cut_in_node_order_with_each_product_where_its_bias_is_ready() {
        // The bias (`%4`) is computed after the product (`%3`) and before the add that reads
        // it: the product runs after the bias's kernel, the softmax after the product.
        let g = parse(
            r#"graph "m" {
  %0: f32[3,8] = input "x"
  %1: f32[8,4] = input "w"
  %2: f32[4] = input "b"
  %3: f32[3,4] = matmul(%0, %1) @name("mm")
  %4: f32[4] = exp(%2)
  %5: f32[3,4] = add(%3, %4)
  %6: f32[3,4] = relu(%5)
  %7: f32[3,4] = softmax(%6) {axis = -1}
  return "y" = %7
}"#,
        );
        let lib = loaded();
        let ps = library_products(&g, &Assignment::new("cuda"), Ok(&lib)).unwrap().0;
        assert_eq!(ps[0].epilogue, Epilogue { bias: true, activation: Activation::Relu });
        let pieces = cut(&g, ps);
        let shape: Vec<String> = pieces
            .iter()
            .map(|p| match p {
                Piece::Kernels(n) => {
                    format!("k{:?}", n.iter().map(|n| g.node(*n).op.name()).collect::<Vec<_>>())
                }
                Piece::Product(p) => format!("p{}", p.nodes.len()),
            })
            .collect();
        assert_eq!(shape, ["k[\"exp\"]", "p3", "k[\"softmax\"]"]);
        // Every node lands in exactly one piece.
        let mut seen: Vec<NodeId> = pieces
            .iter()
            .flat_map(|p| match p {
                Piece::Kernels(n) => n.clone(),
                Piece::Product(p) => p.nodes.clone(),
            })
            .collect();
        seen.sort();
        assert_eq!(seen, g.node_ids().collect::<Vec<_>>());
    }

    #[test]
    fn two_products_into_one_add_share_it_without_either_losing_its_value() {
        // An RNN cell at batch 1: W·x + U·h. The second product's output has the shape of a
        // bias, but the add goes to one product only; the other is computed on its own.
        let g = parse(
            r#"graph "cell" {
  %0: f32[1,8] = input "x"
  %1: f32[8,4] = input "w"
  %2: f32[1,16] = input "h"
  %3: f32[16,4] = input "u"
  %4: f32[1,4] = matmul(%0, %1) @name("wx")
  %5: f32[1,4] = matmul(%2, %3) @name("uh")
  %6: f32[1,4] = add(%4, %5)
  return "y" = %6
}"#,
        );
        let lib = loaded();
        let ps = library_products(&g, &Assignment::new("cuda"), Ok(&lib)).unwrap().0;
        assert_eq!(ps.len(), 2);
        assert_eq!(ps.iter().filter(|p| p.epilogue.bias).count(), 1);
        let pieces = cut(&g, ps);
        let order: Vec<usize> = pieces
            .iter()
            .map(|p| match p {
                Piece::Product(p) => p.nodes.len(),
                Piece::Kernels(_) => 0,
            })
            .collect();
        // `uh` alone first (where it stood), then `wx` with the add that reads `uh`.
        assert_eq!(order, [1, 2]);
    }

    #[test]
    fn a_bias_wider_than_the_product_or_a_partial_batch_broadcast_stays_out() {
        let lib = loaded();
        let g = parse(
            r#"graph "m" {
  %0: f32[3,8] = input "x"
  %1: f32[8,4] = input "w"
  %2: f32[1,1,4] = input "b"
  %3: f32[3,4] = matmul(%0, %1)
  %4: f32[1,3,4] = add(%3, %2)
  return "y" = %4
}"#,
        );
        let ps = library_products(&g, &Assignment::new("cuda"), Ok(&lib)).unwrap().0;
        assert_eq!(ps[0].epilogue, Epilogue::default());
        let g = parse(
            r#"graph "m" {
  %0: f32[2,3,5,7] = input "a"
  %1: f32[3,7,4] = input "b"
  %2: f32[2,3,5,4] = matmul(%0, %1) @name("mm")
  return "y" = %2
}"#,
        );
        assert!(library_products(&g, &Assignment::new("cuda"), Ok(&lib)).unwrap().0.is_empty());
        let mut pinned = Assignment::new("cuda");
        pinned.options.fallback = Fallback::Deny;
        pinned.kernels.insert(g.node_ids().next().unwrap(), CUBLASLT.into());
        let e = library_products(&g, &pinned, Ok(&lib)).unwrap_err().to_string();
        assert!(e.contains("broadcast partly") && e.contains("mm"), "{e}");
        // A Gemm cuBLASLt refuses has no loop nest to fall back to: an error even when
        // fallback is allowed.
        let g = gemm("3,1", "transB = 1");
        let mut a = Assignment::new("cuda");
        a.kernels
            .insert(g.node_ids().find(|&n| g.node(n).op == Op::Gemm).unwrap(), CUBLASLT.into());
        let e = library_products(&g, &a, Ok(&lib)).unwrap_err().to_string();
        assert!(e.contains("does not run Gemm"), "{e}");
    }

    #[test]
    fn gemm_shapes_follow_the_transposes() {
        let (s, out) = gemm_shape(&[8, 3], &[4, 8], true, true).unwrap();
        assert_eq!((s.m, s.n, s.k, s.trans_a, s.trans_b, s.batch), (3, 4, 8, true, true, 1));
        assert_eq!(out, vec![3, 4]);
        assert!(gemm_shape(&[3, 8], &[4, 8], false, false).unwrap_err().contains("inner dims"));
        assert!(gemm_shape(&[2, 3, 8], &[8, 4], false, false).unwrap_err().contains("2-D"));
    }

    #[test]
    fn product_shapes_broadcast_a_whole_batch_or_name_what_they_cannot() {
        let (s, out) = product_shape(&[2, 3, 5, 7], &[7, 4]).unwrap();
        assert_eq!((s.batch, s.m, s.n, s.k, s.stride_a, s.stride_b), (6, 5, 4, 7, 35, 0));
        assert_eq!(out, vec![2, 3, 5, 4]);
        let (s, _) = product_shape(&[1, 5, 7], &[3, 7, 4]).unwrap();
        assert_eq!((s.batch, s.stride_a, s.stride_b), (3, 0, 28));
        let e = product_shape(&[2, 1, 5, 7], &[1, 3, 7, 4]).unwrap_err();
        assert!(e.contains("broadcast partly"), "{e}");
        assert!(product_shape(&[5, 7], &[6, 4]).unwrap_err().contains("inner dims differ"));
        assert!(product_shape(&[7], &[7, 4]).unwrap_err().contains("rank 2"));
        assert!(product_shape(&[1 << 32, 2], &[2, 2]).unwrap_err().contains("32-bit"));
        let (s, out) = product_shape(&[0, 7], &[7, 4]).unwrap();
        assert_eq!((s.m, out), (0, vec![0, 4]));
    }
}
