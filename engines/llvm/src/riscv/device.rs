//! A riscv64 device: a board, or `qemu-riscv64` here. Its memory is a staging directory of
//! `.npy` files that the device's program reads and writes: an upload writes one, a
//! download reads one, so every transfer the plan lists really moves the bytes, and values
//! stay "on the device" between partitions. A partition runs as a riscv64 build (see
//! `super::build`) made for its shapes on first use and executed by the runner
//! (`qemu-riscv64`, or a configured command that runs it on a board), stopped when the
//! run's stop token says so (cancel, `execution.timeout`).

use std::any::Any;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use xpu_engine::{
    DeviceBuffer, DeviceId, DeviceKind, EngineError, Executable, Execution, Fact, NodeTiming,
    StopToken, Value,
};
use xpu_ir::{DType, Graph, Tensor};

use super::npy;

/// The device's id: one riscv64 device per engine.
pub const DEVICE: DeviceId = DeviceId { kind: DeviceKind::Riscv64, ordinal: 0 };

/// The device: where its memory lives and how its programs run.
pub struct RiscvDevice {
    staging: tempfile::TempDir,
    next: AtomicU64,
    /// The runner command; the program and its arguments follow.
    pub runner: Vec<String>,
    /// The ISA its programs are built for.
    pub isa: xpu_engine::RiscvCpu,
    toolchain: super::Toolchain,
}

/// A value in the device's memory: a `.npy` file in the staging directory, removed when the
/// last reference goes.
#[derive(Debug)]
pub struct RiscvBuffer {
    path: PathBuf,
    dtype: DType,
    shape: Vec<usize>,
}

impl Drop for RiscvBuffer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl DeviceBuffer for RiscvBuffer {
    fn engine(&self) -> &str {
        "llvm"
    }
    fn device(&self) -> DeviceId {
        DEVICE
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn device_err(message: impl Into<String>) -> EngineError {
    EngineError::Kernel { node: DEVICE.to_string(), message: message.into() }
}

impl RiscvDevice {
    /// A device run by `runner` (the first word found on `PATH` or a path), its partitions
    /// built with the cross compiler.
    pub fn new(runner: Vec<String>, isa: xpu_engine::RiscvCpu) -> Result<RiscvDevice, String> {
        let toolchain = super::Toolchain::find()?;
        let first = runner.first().ok_or("an empty riscv64 runner command")?;
        let found = Path::new(first).is_file()
            || std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .any(|d| d.join(first).is_file());
        if !found {
            return Err(format!(
                "the riscv64 runner {first:?} is not installed (Debian qemu-user; `make setup`)"
            ));
        }
        let staging = tempfile::Builder::new()
            .prefix("xpu-riscv64-")
            .tempdir()
            .map_err(|e| format!("a staging directory: {e}"))?;
        Ok(RiscvDevice { staging, next: AtomicU64::new(0), runner, isa, toolchain })
    }

    fn fresh_path(&self, what: &str) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.staging.path().join(format!("{what}-{n}.npy"))
    }

    pub fn upload(&self, t: &Tensor) -> Result<Value, EngineError> {
        let bytes = npy::encode(t).map_err(device_err)?;
        let path = self.fresh_path("in");
        std::fs::write(&path, bytes).map_err(|e| device_err(format!("{}: {e}", path.display())))?;
        Ok(Value::Device(Arc::new(RiscvBuffer {
            path,
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
        })))
    }

    pub fn download(&self, b: &dyn DeviceBuffer) -> Result<Tensor, EngineError> {
        let b = b
            .as_any()
            .downcast_ref::<RiscvBuffer>()
            .ok_or_else(|| device_err("a buffer of another device"))?;
        let bytes =
            std::fs::read(&b.path).map_err(|e| device_err(format!("{}: {e}", b.path.display())))?;
        npy::decode(&bytes, b.dtype, &b.shape)
            .map_err(|e| device_err(format!("{}: {e}", b.path.display())))
    }
}

/// A partition that runs on the riscv64 device.
pub struct RiscvExecutable {
    graph: Graph,
    device: Arc<RiscvDevice>,
    /// Builds are kept under `<this>/riscv64/<key>` when the engine has a disk cache.
    cache: Option<PathBuf>,
    /// Inputs whose values shape the code (a reduction's axes), read back from the device.
    structural: Vec<usize>,
    builds: HashMap<(Vec<Vec<usize>>, Vec<Option<Vec<i64>>>), Arc<Build>>,
}

struct Build {
    dir: PathBuf,
    /// Removes an uncached build's directory with the build.
    _temp: Option<tempfile::TempDir>,
    manifest: super::Manifest,
    build_ms: f64,
    cached: bool,
}

impl RiscvExecutable {
    pub fn new(graph: Graph, device: Arc<RiscvDevice>, cache: Option<PathBuf>) -> RiscvExecutable {
        let structural = crate::lower::structural_inputs(&graph);
        RiscvExecutable { graph, device, cache, structural, builds: HashMap::new() }
    }

    /// The disk-cache key of a build of this partition for these shapes and values: the
    /// partition's text, the shapes, the code generator, LLVM, the cross compiler and the
    /// runtime.
    fn key(&self, shapes: &[Vec<usize>], structural: &[Option<Vec<i64>>]) -> String {
        use sha2::{Digest, Sha256};
        let text = format!(
            "{}\n{shapes:?}\n{structural:?}\n{}\n{}\n{}\n{}\n{}",
            self.graph.content_hash(),
            self.device.isa,
            crate::cache::CODEGEN_VERSION,
            crate::compile::llvm_version(),
            self.device.toolchain.version(),
            super::RUNTIME_C
        );
        Sha256::digest(text.as_bytes()).iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    fn build_for(
        &mut self,
        shapes: &[Vec<usize>],
        structural: &[Option<Vec<i64>>],
    ) -> Result<Arc<Build>, EngineError> {
        let key = (shapes.to_vec(), structural.to_vec());
        if let Some(b) = self.builds.get(&key) {
            return Ok(b.clone());
        }
        let start = Instant::now();
        let map = |e: super::BuildError| match e {
            super::BuildError::Lower(l) => crate::unsupported(l),
            e => device_err(format!("building the partition for riscv64: {e}")),
        };
        let build_in = |dir: &Path| {
            super::build_named(
                &self.graph,
                shapes,
                structural,
                dir,
                self.device.isa,
                super::Names::Positional,
                &self.device.toolchain,
            )
            .map_err(map)
        };
        let b = match &self.cache {
            Some(root) => {
                let root = root.join("riscv64");
                let dir = root.join(self.key(shapes, structural));
                let manifest = std::fs::read_to_string(dir.join("manifest.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<super::Manifest>(&t).ok())
                    .filter(|_| dir.join("program").is_file());
                match manifest {
                    Some(manifest) => {
                        Build { dir, _temp: None, manifest, build_ms: 0.0, cached: true }
                    }
                    None => {
                        std::fs::create_dir_all(&root)
                            .map_err(|e| device_err(format!("{}: {e}", root.display())))?;
                        let work = tempfile::Builder::new()
                            .prefix("building-")
                            .tempdir_in(&root)
                            .map_err(|e| device_err(e.to_string()))?;
                        let manifest = build_in(work.path())?;
                        // Renamed into place whole; another process that got there first
                        // wins. A damaged entry (no manifest or program) is replaced.
                        let work = work.keep();
                        if dir.exists() {
                            let _ = std::fs::remove_dir_all(&dir);
                        }
                        if std::fs::rename(&work, &dir).is_err() {
                            let _ = std::fs::remove_dir_all(&work);
                        }
                        let ms = start.elapsed().as_secs_f64() * 1e3;
                        Build { dir, _temp: None, manifest, build_ms: ms, cached: false }
                    }
                }
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("xpu-riscv64-build-")
                    .tempdir()
                    .map_err(|e| device_err(e.to_string()))?;
                let manifest = build_in(temp.path())?;
                let ms = start.elapsed().as_secs_f64() * 1e3;
                Build {
                    dir: temp.path().to_path_buf(),
                    _temp: Some(temp),
                    manifest,
                    build_ms: ms,
                    cached: false,
                }
            }
        };
        let b = Arc::new(b);
        self.builds.insert(key, b.clone());
        Ok(b)
    }

    /// Runs the build's program on the device over `inputs` (device buffers), returning
    /// its outputs as device buffers.
    fn run_device(
        &mut self,
        inputs: &[Value],
        stop: &StopToken,
    ) -> Result<Execution<Value>, EngineError> {
        let mut paths = Vec::new();
        let mut shapes = Vec::new();
        for v in inputs {
            let b = v.buffer_of("llvm", DEVICE).ok_or_else(|| {
                device_err("an input not in the device's memory (the plan lacks an upload)")
            })?;
            let b = b
                .as_any()
                .downcast_ref::<RiscvBuffer>()
                .ok_or_else(|| device_err("a buffer of another device"))?;
            paths.push(b.path.clone());
            shapes.push(b.shape.clone());
        }
        // Axes given as inputs shape the code: read their (few) values back.
        let mut structural = vec![None; inputs.len()];
        for &i in &self.structural {
            if let Some(Value::Device(b)) = inputs.get(i) {
                structural[i] = self.device.download(b.as_ref())?.to_i64_vec();
            }
        }
        let build = self.build_for(&shapes, &structural)?;
        let out_dir = tempfile::tempdir_in(self.device.staging.path())
            .map_err(|e| device_err(e.to_string()))?;
        let mut cmd = Command::new(&self.device.runner[0]);
        cmd.args(&self.device.runner[1..]).arg(build.dir.join("program"));
        for (spec, path) in build.manifest.inputs.iter().zip(&paths) {
            cmd.arg("--input").arg(format!("{}={}", spec.name, path.display()));
        }
        cmd.arg("--out").arg(out_dir.path()).stdin(Stdio::null()).stdout(Stdio::null());
        // stderr goes to a file, not a pipe: a chatty program would fill a pipe no one
        // reads until it exits, and block.
        let stderr_path = out_dir.path().join("stderr.txt");
        let stderr_file = std::fs::File::create(&stderr_path)
            .map_err(|e| device_err(format!("{}: {e}", stderr_path.display())))?;
        cmd.stderr(stderr_file);
        let start = Instant::now();
        let mut child = cmd.spawn().map_err(|e| {
            device_err(format!("starting the runner {:?}: {e}", self.device.runner[0]))
        })?;
        let status = loop {
            if let Some(status) = child.try_wait().map_err(|e| device_err(e.to_string()))? {
                break status;
            }
            if let Some(reason) = stop.reason() {
                let _ = child.kill();
                let _ = child.wait();
                return Err(EngineError::Stopped { node: DEVICE.to_string(), reason });
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let nanos = start.elapsed().as_nanos() as u64;
        if !status.success() {
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            return Err(device_err(format!(
                "the program on {DEVICE} failed ({status}): {}",
                stderr.trim()
            )));
        }
        let mut outputs = Vec::new();
        for spec in &build.manifest.outputs {
            let from = out_dir.path().join(format!("{}.npy", spec.name));
            let path = self.device.fresh_path("out");
            std::fs::rename(&from, &path)
                .map_err(|e| device_err(format!("{}: {e}", from.display())))?;
            let dtype: DType =
                spec.dtype.parse().map_err(|_| device_err(format!("dtype {}", spec.dtype)))?;
            outputs.push(Value::Device(Arc::new(RiscvBuffer {
                path,
                dtype,
                shape: spec.shape.clone(),
            })));
        }
        let share = nanos / self.graph.nodes.len().max(1) as u64;
        let timings = self
            .graph
            .node_ids()
            .map(|node| NodeTiming { node, kernel: "llvm.riscv".into(), nanos: share })
            .collect();
        let facts = vec![
            Fact {
                node: None,
                key: "llvm.riscv.build".into(),
                value: if build.cached {
                    format!("disk cache ({})", build.dir.display())
                } else {
                    format!("built in {:.1} ms", build.build_ms)
                },
            },
            Fact {
                node: None,
                key: "llvm.riscv.runner".into(),
                value: self.device.runner.join(" "),
            },
            Fact {
                node: None,
                key: "llvm.riscv.lir_hash".into(),
                value: build.manifest.lir_hash.clone(),
            },
        ];
        Ok(Execution { outputs, timings, facts })
    }
}

impl Executable for RiscvExecutable {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    /// Host tensors in and out: uploads, runs, downloads (what `run_values` leaves to the
    /// plan's transfers).
    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        xpu_engine::check_inputs(&self.graph, inputs)?;
        let values = inputs.iter().map(|t| self.device.upload(t)).collect::<Result<Vec<_>, _>>()?;
        let run = self.run_device(&values, stop)?;
        let outputs = run
            .outputs
            .iter()
            .map(|v| match v {
                Value::Device(b) => self.device.download(b.as_ref()),
                Value::Host(t) => Ok(t.clone()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Execution { outputs, timings: run.timings, facts: run.facts })
    }

    fn run_values(
        &mut self,
        inputs: &[Value],
        stop: &StopToken,
    ) -> Result<Execution<Value>, EngineError> {
        stop.check(|| DEVICE.to_string())?;
        self.run_device(inputs, stop)
    }
}
