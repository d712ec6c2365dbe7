//! Sessions: created once per (model hash, options), kept in a bounded LRU cache, and run
//! by [`OrtExecutable`]. A run can be stopped from another thread: the stop token's hook
//! terminates ORT's run through its `RunOptions`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ort::ep::ExecutionProvider;
use ort::session::{RunOptions, Session};
use sha2::{Digest, Sha256};
use xpu_engine::{EngineError, Executable, Execution, Fact, NodeTiming, StopToken};
use xpu_ir::{BorrowedTensor, Graph, NodeId, Tensor};

use crate::convert::{self, OrtInput};
use crate::options::SessionOptions;
use crate::profile;

/// The providers this ONNX Runtime build has, among those xpu has kernels for.
pub(crate) fn available_providers() -> Vec<String> {
    let mut v = Vec::new();
    if ort::ep::CPU::is_available().unwrap_or(false) {
        v.push("CPUExecutionProvider".to_string());
    }
    if ort::ep::CUDA::is_available().unwrap_or(false) {
        v.push("CUDAExecutionProvider".to_string());
    }
    if ort::ep::TensorRT::is_available().unwrap_or(false) {
        v.push("TensorrtExecutionProvider".to_string());
    }
    v
}

/// Whether this machine has an NVIDIA GPU the driver exposes (the CUDA provider needs one).
pub(crate) fn cuda_device_present() -> bool {
    std::fs::read_dir("/proc/driver/nvidia/gpus").is_ok_and(|mut d| d.next().is_some())
}

/// A session and what was learnt about it on its first run.
pub struct CachedSession {
    session: Session,
    /// The model, kept until the first run profiles a twin session on it.
    model: Option<Vec<u8>>,
    name: String,
    /// ORT's own per-node report (provider, op, time) from the profiled first run.
    profile: Vec<profile::NodeProfile>,
}

type Key = ([u8; 16], SessionOptions);

/// Bounded LRU of sessions, shared by all clones of an engine.
pub struct SessionCache {
    capacity: usize,
    entries: Mutex<HashMap<Key, (u64, Arc<Mutex<CachedSession>>)>>,
    clock: AtomicU64,
}

impl SessionCache {
    pub fn new(capacity: usize) -> SessionCache {
        SessionCache { capacity, entries: Mutex::new(HashMap::new()), clock: AtomicU64::new(0) }
    }

    pub(crate) fn get_or_create(
        &self,
        env: &ort::environment::Environment,
        name: &str,
        model: &[u8],
        opts: &SessionOptions,
    ) -> Result<(Arc<Mutex<CachedSession>>, bool), EngineError> {
        let mut hash = [0u8; 16];
        hash.copy_from_slice(&Sha256::digest(model)[..16]);
        let key = (hash, opts.clone());
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        if let Some((used, s)) = self.entries.lock().map_err(poisoned)?.get_mut(&key) {
            *used = tick;
            return Ok((s.clone(), true));
        }
        // Built outside the lock: session creation takes milliseconds.
        let session = build(env, name, model, opts, None)?;
        let cached = Arc::new(Mutex::new(CachedSession {
            session,
            model: Some(model.to_vec()),
            name: name.to_string(),
            profile: Vec::new(),
        }));
        let mut entries = self.entries.lock().map_err(poisoned)?;
        if entries.len() >= self.capacity
            && let Some(oldest) =
                entries.iter().min_by_key(|(_, (u, _))| *u).map(|(k, _)| k.clone())
        {
            entries.remove(&oldest);
        }
        let entry = entries.entry(key).or_insert((tick, cached));
        Ok((entry.1.clone(), false))
    }
}

fn poisoned<T>(_: T) -> EngineError {
    EngineError::Other("ort: the session cache lock is poisoned".into())
}

/// A session for `model` under `opts`; profiled into `profile_prefix` when given.
fn build(
    env: &ort::environment::Environment,
    name: &str,
    model: &[u8],
    opts: &SessionOptions,
    profile_prefix: Option<&std::path::Path>,
) -> Result<Session, EngineError> {
    let reject = |reason: String| EngineError::Other(format!("ort: model {name}: {reason}"));
    let builder = Session::builder(env).map_err(|e| reject(e.to_string()))?;
    let mut builder = opts.apply(builder).map_err(reject)?;
    if let Some(prefix) = profile_prefix {
        builder = builder.with_profiling(prefix).map_err(|e| reject(e.to_string()))?;
    }
    builder.commit_from_memory(model).map_err(|e| reject(e.to_string()))
}

/// A prepared model or partition.
pub struct OrtExecutable {
    session: Arc<Mutex<CachedSession>>,
    opts: SessionOptions,
    /// The partition, for input checks and node ids; `None` for a whole model as given.
    partition: Option<Graph>,
    env: ort::environment::Environment,
    profile: bool,
    /// Facts every run reports (session created or cached, the options).
    fixed_facts: Vec<Fact>,
}

impl OrtExecutable {
    pub(crate) fn new(
        (session, cached): (Arc<Mutex<CachedSession>>, bool),
        opts: SessionOptions,
        partition: Option<Graph>,
        env: ort::environment::Environment,
        profile: bool,
    ) -> OrtExecutable {
        let mut fixed_facts: Vec<Fact> = vec![Fact {
            node: None,
            key: "ort.session".into(),
            value: if cached { "cached" } else { "created" }.into(),
        }];
        fixed_facts.extend(opts.describe().into_iter().map(|(k, v)| Fact {
            node: None,
            key: format!("ort.option.{k}"),
            value: v,
        }));
        if opts.kernel == crate::options::CPU_KERNEL && opts.gpu_mem_limit.is_some() {
            fixed_facts.push(Fact {
                node: None,
                key: "ort.memory_limit".into(),
                value: "not enforced by ORT's CPU provider (the CUDA provider takes it as gpu_mem_limit)".into(),
            });
        }
        OrtExecutable { session, opts, partition, env, profile, fixed_facts }
    }

    fn node_of(&self, ort_name: &str) -> Option<NodeId> {
        match &self.partition {
            Some(_) => profile::node_index(ort_name).map(|i| NodeId(i as u32)),
            None => None,
        }
    }
}

static PROFILES: AtomicU64 = AtomicU64::new(0);

impl Executable for OrtExecutable {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        self.run_inputs(inputs, stop)
    }

    fn reads_borrowed(&self) -> bool {
        true
    }

    fn run_borrowed(
        &mut self,
        inputs: &[BorrowedTensor<'_>],
        stop: &StopToken,
    ) -> Result<Execution, EngineError> {
        self.run_inputs(inputs, stop)
    }
}

impl OrtExecutable {
    /// A run on tensors or borrowed elements alike: ORT reads views of both.
    fn run_inputs<I: OrtInput>(
        &mut self,
        inputs: &[I],
        stop: &StopToken,
    ) -> Result<Execution, EngineError> {
        stop.check(|| "partition".into())?;
        if let Some(g) = &self.partition {
            xpu_engine::check_input_types(g, inputs.iter().map(|i| i.dtype_and_shape()))?;
        }
        let session = self.session.clone();
        let mut guard = session.lock().map_err(poisoned)?;
        let cached: &mut CachedSession = &mut guard;
        let name = cached.name.clone();
        let fail =
            |m: String| EngineError::Kernel { node: format!("ort model {name}"), message: m };
        let expected = cached.session.inputs().len();
        if inputs.len() != expected {
            return Err(EngineError::Input {
                name: name.clone(),
                message: format!(
                    "the model takes {expected} inputs ({}), got {}",
                    cached.session.inputs().iter().map(|i| i.name()).collect::<Vec<_>>().join(", "),
                    inputs.len()
                ),
            });
        }
        let values = inputs
            .iter()
            .zip(cached.session.inputs())
            .map(|(t, i)| {
                t.value().map_err(|m| EngineError::Input { name: i.name().to_string(), message: m })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let run_options = Arc::new(RunOptions::new().map_err(|e| fail(e.to_string()))?);
        let terminate = run_options.clone();
        let _hook = stop.on_stop(move || {
            let _ = terminate.terminate();
        });
        let start = Instant::now();
        let result = cached.session.run_with_options(&values[..], &run_options);
        let nanos = start.elapsed().as_nanos() as u64;
        let outputs = match result {
            Ok(out) => out
                .values()
                .map(|v| convert::output_tensor(&v).map_err(fail))
                .collect::<Result<Vec<_>, _>>()?,
            Err(e) => {
                stop.check(|| format!("ort model {name}"))?;
                return Err(fail(e.to_string()));
            }
        };
        // The first run of a session also runs a profiled twin once: ORT's own per-node
        // provider and time, kept with the session for every later explanation.
        let mut timings = Vec::new();
        if self.profile
            && let Some(model) = cached.model.take()
        {
            let n = PROFILES.fetch_add(1, Ordering::Relaxed);
            let prefix =
                std::env::temp_dir().join(format!("xpu-ort-profile-{}-{n}", std::process::id()));
            match profile::run_profiled(
                &self.env, &name, &model, &self.opts, &prefix, inputs, build,
            ) {
                Ok(p) => cached.profile = p,
                Err(e) => cached.profile = vec![profile::NodeProfile::failed(e)],
            }
            for p in &cached.profile {
                if let Some(node) = self.node_of(&p.node) {
                    timings.push(NodeTiming {
                        node,
                        kernel: self.opts.kernel.clone(),
                        nanos: p.nanos,
                    });
                }
            }
        }
        // The session and option facts are the same every run: made once, cloned here.
        let mut facts = self.fixed_facts.clone();
        for p in &cached.profile {
            facts.push(Fact {
                node: self.node_of(&p.node),
                key: "ort.provider".into(),
                value: p.describe(),
            });
        }
        facts.push(Fact {
            node: None,
            key: "ort.run_us".into(),
            value: (nanos / 1000).to_string(),
        });
        Ok(Execution { outputs, timings, facts })
    }
}
