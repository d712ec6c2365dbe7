//! `xpu._xpu.Session`: one program, planned once under a policy on this process's engines
//! and prepared once; `run` reuses both (a plan per distinct input shape, from a small
//! cache) and releases the GIL, so one session serves many threads.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use xpu_engine::{Inventory, Registry, StopToken};
use xpu_ir::shape::Dim;
use xpu_ir::{Graph, Tensor};
use xpu_plan::{CachedPlan, Explanation, Keys, PlanCache, PreparedCache, RunRecord};
use xpu_policy::Policy;

use crate::{arrays, errors, policy::PyPolicy};

/// What a live session holds; shared by the threads running it.
struct Live {
    graph: Arc<Graph>,
    /// The graph's input names, in order (what a feed is keyed by).
    input_names: Vec<String>,
    graph_hash: String,
    registry: Registry,
    inventory: Inventory,
    fingerprint: String,
    policy: Policy,
    plans: PlanCache,
    prepared: PreparedCache,
    /// The plan's explanation made at construction, then each run's (with its timings).
    planned: Explanation,
    /// The last run's plan (with its explanation) and record, for `explain()`.
    last: Mutex<Option<(CachedPlan, RunRecord)>>,
    /// How long the last run took (`u64::MAX` before the first): whether the next is watched
    /// for Ctrl-C.
    last_nanos: AtomicU64,
    /// [`shapes_key`] of the last run's inputs.
    last_shapes: AtomicU64,
    /// Writable arrays are lent too (the caller promised not to change them during a run);
    /// by default only read-only ones are.
    borrow_writable: bool,
}

/// A program planned under a policy and prepared on this process's engines.
#[pyclass(module = "xpu._xpu", frozen)]
pub struct Session {
    live: RwLock<Option<Arc<Live>>>,
}

/// Reads and verifies a program file (`.onnx`, `.sgr`, `.json`, `.ml`): `ProgramError`
/// naming the file when it cannot be read, is a directory, or does not load.
pub fn load_graph(py: Python<'_>, path: &Path) -> PyResult<Graph> {
    if path.is_dir() {
        return Err(errors::plain(
            py,
            "ProgramError",
            format!("{}: is a directory, not a model or program file", path.display()),
        ));
    }
    let loaded = py.detach(|| xpu_runtime::program::load(path));
    loaded.map_err(|e| errors::plain(py, "ProgramError", e.to_string()))
}

#[pymethods]
impl Session {
    /// Loads `program` (a file's path, or an ONNX model's bytes), plans it under `policy`
    /// (the built-in default when `None`) and prepares it. Raises `ProgramError`,
    /// `EngineUnavailable` or `PlanError`.
    #[new]
    #[pyo3(signature = (program, policy = None, borrow_inputs = false))]
    fn new(
        py: Python<'_>,
        program: &Bound<'_, PyAny>,
        policy: Option<&PyPolicy>,
        borrow_inputs: bool,
    ) -> PyResult<Session> {
        let (graph, roots) = match program.cast::<pyo3::types::PyBytes>() {
            Ok(bytes) => {
                let bytes = bytes.as_bytes();
                let here = std::env::current_dir().unwrap_or_else(|_| ".".into());
                let roots = xpu_minilang::paths::DataRoots::new([here]);
                let loaded = py.detach(|| {
                    xpu_runtime::program::compile("model.onnx", bytes, &roots, &Default::default())
                });
                let graph = loaded.map_err(|e| errors::plain(py, "ProgramError", e.to_string()))?;
                (graph.graph, roots.roots().to_vec())
            }
            Err(_) => {
                let path: std::path::PathBuf = program.extract()?;
                let roots = xpu_runtime::program::data_roots_of(&path).roots().to_vec();
                (load_graph(py, &path)?, roots)
            }
        };
        let graph = Arc::new(graph);
        let policy = policy.map_or_else(crate::policy::default_policy, |p| p.policy.clone());
        let live = py.detach(|| Live::open(graph, policy, &roots, borrow_inputs));
        let live = live.map_err(|e| e.into_py(py))?;
        Ok(Session { live: RwLock::new(Some(Arc::new(live))) })
    }

    /// The graph's inputs: `(name, shape, dtype)`, a shape's dims ints, or strings for
    /// symbolic dims (`"N"`), or None for unknown ones.
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, Bound<'py, PyList>, String)>> {
        let live = self.live(py)?;
        let g = &live.graph;
        g.inputs.iter().map(|&v| describe(py, g, v, input_name(g, v))).collect()
    }

    /// The graph's outputs, as [`Session::inputs`].
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, Bound<'py, PyList>, String)>> {
        let live = self.live(py)?;
        let g = &live.graph;
        g.outputs.iter().map(|o| describe(py, g, o.value, o.name.clone())).collect()
    }

    /// Runs on `feed` (input name → array); returns the outputs in graph order. The GIL is
    /// released while the engines run.
    fn run<'py>(
        &self,
        py: Python<'py>,
        feed: &Bound<'py, PyDict>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let live = self.live(py)?;
        let (tensors, copied) = live.tensors(py, feed)?;
        let started = Instant::now();
        // New shapes may plan and prepare inside this call: watched, whatever the last run took.
        let shapes = shapes_key(&tensors);
        let same_shapes = live.last_shapes.swap(shapes, Ordering::Relaxed) == shapes;
        let quick = live.last_nanos.load(Ordering::Relaxed) < WATCHED_FROM.as_nanos() as u64;
        let ran = if same_shapes && quick {
            py.detach(|| live.run(&tensors, &copied, &StopToken::default()).map_err(Stop::Failed))
        } else {
            py.detach(|| watched(&live, &tensors, &copied))
        };
        live.last_nanos.store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let outputs = ran.map_err(|e| match e {
            Stop::Failed(f) => f.into_py(py),
            Stop::Interrupted(e) => e,
        })?;
        outputs.into_iter().map(|t| arrays::to_numpy(py, t)).collect()
    }

    /// The explanation as JSON: the last run's (with per-node timings, transfers and engine
    /// facts) once the session has run, else the plan's.
    fn explain(&self, py: Python<'_>) -> PyResult<String> {
        let live = self.live(py)?;
        let last = live.last.lock().unwrap_or_else(|p| p.into_inner());
        Ok(match last.as_ref() {
            Some((cached, record)) => {
                let mut explanation = cached.1.clone();
                explanation.record_run(record);
                explanation.to_json()
            }
            None => live.planned.to_json(),
        })
    }

    /// Whether the last run's explanation exists yet.
    fn has_run(&self, py: Python<'_>) -> PyResult<bool> {
        let live = self.live(py)?;
        Ok(live.last.lock().unwrap_or_else(|p| p.into_inner()).is_some())
    }

    /// The policy the session plans under.
    fn policy(&self, py: Python<'_>) -> PyResult<PyPolicy> {
        Ok(PyPolicy { policy: self.live(py)?.policy.clone() })
    }

    /// Releases the prepared executables; any later call raises `SessionClosed`.
    fn close(&self) {
        self.live.write().unwrap_or_else(|p| p.into_inner()).take();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.live.read().unwrap_or_else(|p| p.into_inner()).is_none()
    }
}

impl Session {
    fn live(&self, py: Python<'_>) -> PyResult<Arc<Live>> {
        let guard = self.live.read().unwrap_or_else(|p| p.into_inner());
        guard.clone().ok_or_else(|| {
            errors::plain(py, "SessionClosed", "the session is closed (close() was called)".into())
        })
    }
}

/// Runs at least this long (the session's last run, or its first) are watched for Ctrl-C;
/// shorter ones run on the calling thread with nothing added, and a Ctrl-C during one is
/// raised when it returns, within this bound.
const WATCHED_FROM: Duration = Duration::from_millis(20);

/// How often a watched run's caller checks for signals (Ctrl-C's `KeyboardInterrupt`).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

enum Stop {
    Failed(Failure),
    /// A signal handler raised (KeyboardInterrupt): the run was stopped.
    Interrupted(PyErr),
}

/// Runs on a scoped thread while the caller (Python's main thread, for Ctrl-C) checks for
/// signals every [`SIGNAL_POLL`]; a handler that raises stops the run (engines stop between
/// nodes, and interrupt the calls they cannot poll) and its exception is returned.
fn watched(live: &Live, inputs: &[Tensor], copied: &[String]) -> Result<Vec<Tensor>, Stop> {
    let stop = StopToken::new();
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel();
        let runner = stop.clone();
        let thread = scope.spawn(move || {
            let _ = tx.send(live.run(inputs, copied, &runner));
        });
        let mut interrupted: Option<PyErr> = None;
        let result = loop {
            match rx.recv_timeout(SIGNAL_POLL) {
                Ok(result) => break result,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if interrupted.is_none()
                        && let Err(e) = Python::attach(|py| py.check_signals())
                    {
                        stop.cancel();
                        interrupted = Some(e);
                    }
                }
                // The run's thread panicked: joined below, so the panic is not re-raised
                // into Python.
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(Failure::Lost("the run's thread ended without a result".into()));
                }
            }
        };
        let _ = thread.join();
        match interrupted {
            Some(e) => Err(Stop::Interrupted(e)),
            None => result.map_err(Stop::Failed),
        }
    })
}

/// Why a session could not open or run, turned into a Python exception with the GIL held.
enum Failure {
    Plan(String, Box<xpu_plan::PlanFailure>),
    Run(xpu_runtime::RunError),
    Lost(String),
}

impl Failure {
    fn into_py(self, py: Python<'_>) -> PyErr {
        match self {
            Failure::Plan(policy, failure) => errors::plan_error(py, &policy, &failure),
            Failure::Run(xpu_runtime::RunError::NoPlan { policy, failure }) => {
                errors::plan_error(py, &policy, &failure)
            }
            Failure::Run(e) => errors::plain(py, "RunError", e.to_string()),
            Failure::Lost(why) => errors::plain(py, "RunError", why),
        }
    }
}

impl Live {
    fn open(
        graph: Arc<Graph>,
        policy: Policy,
        roots: &[std::path::PathBuf],
        borrow_writable: bool,
    ) -> Result<Live, Failure> {
        let registry = crate::engines::registry(roots);
        let inventory = registry.inventory_for(&graph);
        let graph_hash = graph.content_hash();
        let fingerprint = inventory.fingerprint();
        let plans = PlanCache::new(16);
        let prepared = PreparedCache::new(16, 4, u64::MAX);
        let planned = match static_shapes(&graph) {
            // Every dim known: the plan for the one shape there is, prepared now.
            Some(shapes) => {
                let keys = Keys { graph_hash: &graph_hash, inventory_fingerprint: &fingerprint };
                let (cached, _) = plans
                    .get_or_plan_keyed(&graph, &policy, &inventory, &shapes, keys)
                    .map_err(|f| Failure::Plan(policy.name().to_string(), Box::new(f)))?;
                let exec = prepared
                    .checkout(&cached.0, &registry)
                    .map_err(|e| Failure::Run(xpu_runtime::RunError::Prepare(e)))?;
                prepared.checkin(exec);
                cached.1.clone()
            }
            // Symbolic dims: planned now (so a policy that cannot place the graph fails
            // here), prepared per shape at its first run.
            None => {
                let planned =
                    xpu_runtime::plan_graph(&graph, &policy, &inventory, &Default::default());
                planned.map_err(|f| Failure::Plan(policy.name().to_string(), Box::new(f)))?.1
            }
        };
        let input_names = graph.inputs.iter().map(|&v| input_name(&graph, v)).collect();
        Ok(Live {
            graph,
            input_names,
            graph_hash,
            registry,
            inventory,
            fingerprint,
            policy,
            plans,
            prepared,
            planned,
            last: Mutex::new(None),
            last_nanos: AtomicU64::new(u64::MAX),
            last_shapes: AtomicU64::new(0),
            borrow_writable,
        })
    }

    /// The feed as the graph's input tensors, in its order, each lent where numpy's rules
    /// allow (docs/python.md, "Arrays"), with why the others were copied.
    fn tensors(
        &self,
        py: Python<'_>,
        feed: &Bound<'_, PyDict>,
    ) -> PyResult<(Vec<Tensor>, Vec<String>)> {
        let (g, names) = (&self.graph, &self.input_names);
        for key in feed.keys() {
            let key = key.cast_into::<pyo3::types::PyString>().map_err(|e| {
                let key = e.into_inner();
                errors::plain(py, "InputError", format!("input names are strings, not {key}"))
            })?;
            let key = key.to_cow()?;
            if !names.iter().any(|n| *n == *key) {
                return Err(errors::plain(
                    py,
                    "InputError",
                    format!("no input named `{key}`; the inputs are {}", names.join(", ")),
                ));
            }
        }
        let mut out = Vec::with_capacity(names.len());
        let mut copied = Vec::new();
        for (name, &v) in names.iter().zip(&g.inputs) {
            let Some(value) = feed.get_item(name)? else {
                return Err(errors::plain(py, "InputError", format!("input `{name}` is missing")));
            };
            let (tensor, copy) = arrays::to_tensor(py, name, &value, self.borrow_writable)?;
            check_type(py, name, &tensor, g.ty(v))?;
            if let Some(why) = copy {
                copied.push(format!("{name}: {why}"));
            }
            out.push(tensor);
        }
        Ok((out, copied))
    }

    /// One run: the plan for these shapes from the cache, a prepared GraphExec from the
    /// pool, the record kept for `explain()` (merged into the plan's explanation only when
    /// asked: most runs are never explained, and the merge costs more than a small model).
    fn run(
        &self,
        inputs: &[Tensor],
        copied: &[String],
        stop: &StopToken,
    ) -> Result<Vec<Tensor>, Failure> {
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let keys = Keys { graph_hash: &self.graph_hash, inventory_fingerprint: &self.fingerprint };
        let (cached, _) = self
            .plans
            .get_or_plan_keyed(&self.graph, &self.policy, &self.inventory, &shapes, keys)
            .map_err(|f| Failure::Plan(self.policy.name().to_string(), Box::new(f)))?;
        let mut record =
            xpu_runtime::run_record(&cached.0, inputs, &self.registry, stop, Some(&self.prepared))
                .map_err(Failure::Run)?;
        let outputs = std::mem::take(&mut record.outputs);
        // Inputs read where they lie need no word; a copy is a run fact (the explanation's).
        record.facts.extend(copied.iter().map(|c| xpu_plan::model::EngineFact {
            engine: "python".into(),
            node: None,
            key: "input.copied".into(),
            value: c.clone(),
        }));
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((cached, record));
        Ok(outputs)
    }
}

/// A fingerprint of the inputs' shapes (FNV-1a over ranks and dims): whether a run's
/// shapes are the last run's.
fn shapes_key(inputs: &[Tensor]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in inputs {
        for &d in std::iter::once(&t.rank()).chain(t.shape()) {
            h = (h ^ d as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Every input's shape when all dims are known.
fn static_shapes(g: &Graph) -> Option<Vec<Vec<usize>>> {
    g.inputs
        .iter()
        .map(|&v| {
            let dims = g.ty(v).dims.as_ref()?;
            dims.iter()
                .map(|d| if let Dim::Known(n) = d { Some(*n as usize) } else { None })
                .collect()
        })
        .collect()
}

fn input_name(g: &Graph, v: xpu_ir::ValueId) -> String {
    g.value(v).name.clone().unwrap_or_else(|| format!("input{}", v.index()))
}

fn describe<'py>(
    py: Python<'py>,
    g: &Graph,
    v: xpu_ir::ValueId,
    name: String,
) -> PyResult<(String, Bound<'py, PyList>, String)> {
    let ty = g.ty(v);
    let dims: Vec<Bound<'py, PyAny>> = match &ty.dims {
        Some(dims) => dims
            .iter()
            .map(|d| match d {
                Dim::Known(n) => n.into_pyobject(py).map(|o| o.into_any()).map_err(PyErr::from),
                Dim::Sym(s) => Ok(s.into_pyobject(py)?.into_any()),
                Dim::Unknown => Ok(py.None().into_bound(py)),
            })
            .collect::<PyResult<_>>()?,
        None => Vec::new(),
    };
    Ok((name, PyList::new(py, dims)?, ty.dtype.name().to_string()))
}

/// An input's dtype, rank and known dims against its declared type.
fn check_type(
    py: Python<'_>,
    name: &str,
    t: &Tensor,
    ty: &xpu_ir::shape::TensorType,
) -> PyResult<()> {
    let fail = |message: String| {
        let attrs = PyDict::new(py);
        let _ = attrs.set_item("input", name);
        errors::raise(py, "InputError", format!("input `{name}` {message}"), &attrs)
    };
    if t.dtype() != ty.dtype {
        return Err(fail(format!(
            "has dtype {}, the model takes {}",
            t.dtype().name(),
            ty.dtype.name()
        )));
    }
    let Some(dims) = &ty.dims else { return Ok(()) };
    if dims.len() != t.rank() {
        return Err(fail(format!(
            "has rank {} (shape {:?}), the model takes rank {} ({})",
            t.rank(),
            t.shape(),
            dims.len(),
            show_dims(dims)
        )));
    }
    for (axis, (d, &n)) in dims.iter().zip(t.shape()).enumerate() {
        if let Dim::Known(k) = d
            && *k as usize != n
        {
            return Err(fail(format!(
                "has {n} at axis {axis} (shape {:?}), the model takes {k} there ({})",
                t.shape(),
                show_dims(dims)
            )));
        }
    }
    Ok(())
}

fn show_dims(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            Dim::Known(n) => n.to_string(),
            Dim::Sym(s) => s.clone(),
            Dim::Unknown => "?".into(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}
