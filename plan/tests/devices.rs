//! Values on devices: GraphExec performs every transfer the plan lists through the engines'
//! upload and download, times and records it, and hands a device buffer straight to a later
//! partition of the same engine and device (no host round trip). The device engine here is a
//! simulated cuda engine — buffers in its own memory, counted — so the protocol is checked on any
//! machine; the cuda and llvm.riscv engines implement the same three calls.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use xpu_engine::device::Device;
use xpu_engine::{
    Assignment, Availability, Capabilities, DeviceBuffer, DeviceId, DeviceKind, Engine,
    EngineError, Executable, Execution, HostMemory, KernelCaps, Registry, StopToken,
    TransferDirection, Value,
};
use xpu_ir::{DType, Graph, Op, Tensor};

/// The simulator stands in for the cuda engine (which this build lacks) on `cuda:0`.
const SIM: &str = "cuda";
const CUDA0: DeviceId = DeviceId { kind: DeviceKind::Cuda, ordinal: 0 };

#[derive(Debug)]
struct SimBuffer {
    data: Vec<f32>,
    shape: Vec<usize>,
}

impl DeviceBuffer for SimBuffer {
    fn engine(&self) -> &str {
        SIM
    }
    fn device(&self) -> DeviceId {
        CUDA0
    }
    fn dtype(&self) -> DType {
        DType::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[derive(Default)]
struct Counters {
    /// Transfers asked to go through pinned host memory.
    pinned: AtomicUsize,
    /// The sim's pinned-staging threshold in bytes.
    pinned_min: std::sync::atomic::AtomicU64,
    uploads: AtomicUsize,
    downloads: AtomicUsize,
    /// Inputs that reached a run as this engine's own buffers.
    buffers_in: AtomicUsize,
}

/// A device engine that runs relu and add on f32 "in its device memory".
struct SimEngine {
    counters: Arc<Counters>,
}

impl Engine for SimEngine {
    fn name(&self) -> &str {
        SIM
    }
    fn version(&self) -> String {
        "0".into()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            engine: SIM.into(),
            version: "0".into(),
            availability: Availability::Available,
            devices: vec![Device { id: CUDA0, name: "simulated".into(), memory_bytes: None }],
            kernels: vec![KernelCaps {
                name: "cuda.fused".into(),
                ops: vec![Op::Relu, Op::Add],
                classes: vec![],
                dtypes: vec![DType::F32],
                deterministic: true,
                description: String::new(),
                device: Some(DeviceKind::Cuda),
                operand_dtypes: Vec::new(),
                op_dtypes: Vec::new(),
                degraded: None,
            }],
            unavailable_kernels: Default::default(),
        }
    }
    fn prepare(&self, g: &Graph, _: &Assignment) -> Result<Box<dyn Executable>, EngineError> {
        Ok(Box::new(SimExec { graph: g.clone(), counters: self.counters.clone() }))
    }
    fn device_memory(&self, device: DeviceId) -> bool {
        device == CUDA0
    }
    fn pinned_staging(&self, device: DeviceId) -> Option<u64> {
        // Below this the sim copies pageable memory, as the cuda engine does for small
        // tensors.
        (device == CUDA0).then_some(self.counters.pinned_min.load(Ordering::SeqCst))
    }
    fn upload(&self, t: &Tensor, device: DeviceId, host: HostMemory) -> Result<Value, EngineError> {
        assert_eq!(device, CUDA0);
        self.counters.uploads.fetch_add(1, Ordering::SeqCst);
        self.counters.pinned.fetch_add(usize::from(host == HostMemory::Pinned), Ordering::SeqCst);
        let data = t.as_slice::<f32>().expect("f32").to_vec();
        Ok(Value::Device(Arc::new(SimBuffer { data, shape: t.shape().to_vec() })))
    }
    fn download(&self, b: &dyn DeviceBuffer, host: HostMemory) -> Result<Tensor, EngineError> {
        self.counters.downloads.fetch_add(1, Ordering::SeqCst);
        self.counters.pinned.fetch_add(usize::from(host == HostMemory::Pinned), Ordering::SeqCst);
        let b = b.as_any().downcast_ref::<SimBuffer>().expect("a sim buffer");
        Ok(Tensor::from_vec(b.shape.clone(), b.data.clone()).unwrap())
    }
}

struct SimExec {
    graph: Graph,
    counters: Arc<Counters>,
}

impl Executable for SimExec {
    fn run(&mut self, _: &[Tensor]) -> Result<Execution, EngineError> {
        unreachable!("GraphExec runs device engines on values")
    }

    fn run_values(
        &mut self,
        inputs: &[Value],
        _: &StopToken,
    ) -> Result<Execution<Value>, EngineError> {
        let g = &self.graph;
        let mut vals: Vec<Option<Vec<f32>>> = vec![None; g.values.len()];
        let mut shape = Vec::new();
        for (&v, x) in g.inputs.iter().zip(inputs) {
            let b = x.buffer_of(SIM, CUDA0).expect("inputs arrive as this engine's buffers");
            self.counters.buffers_in.fetch_add(1, Ordering::SeqCst);
            let b = b.as_any().downcast_ref::<SimBuffer>().unwrap();
            shape = b.shape.clone();
            vals[v.index()] = Some(b.data.clone());
        }
        for n in &g.nodes {
            let a = vals[n.inputs[0].unwrap().index()].clone().unwrap();
            let out = match n.op {
                Op::Relu => a.iter().map(|x| x.max(0.0)).collect(),
                Op::Add => {
                    let b = vals[n.inputs[1].unwrap().index()].as_ref().unwrap();
                    a.iter().zip(b).map(|(x, y)| x + y).collect()
                }
                op => unreachable!("{op:?}"),
            };
            vals[n.outputs[0].index()] = Some(out);
        }
        let outputs = g
            .outputs
            .iter()
            .map(|o| {
                let data = vals[o.value.index()].clone().unwrap();
                Value::Device(Arc::new(SimBuffer { data, shape: shape.clone() }) as Arc<_>)
            })
            .collect();
        Ok(Execution { outputs, timings: vec![], facts: vec![] })
    }
}

/// matmul on the cpu, relu on the device, neg on the cpu, add on the device: the relu's
/// result skips over the cpu partition and stays on the device.
const GRAPH: &str = r#"graph "t" {
  %0: f32[4,8] = input "x"
  %1: f32[8,8] = input "w"
  %2: f32[4,8] = matmul(%0, %1) @name("fc")
  %3: f32[4,8] = relu(%2) @name("act")
  %4: f32[4,8] = neg(%0) @name("flip")
  %5: f32[4,8] = add(%3, %4) @name("sum")
  return "y" = %5
}"#;

const POLICY: &str = "[policy]\nname = \"t\"\n[engines]\norder = [\"cpu\", \"cuda\"]\n\
[[rule]]\nwhen = { op = \"relu\" }\nengine = \"cuda\"\n\
[[rule]]\nwhen = { op = \"add\" }\nengine = \"cuda\"\n";

fn inputs() -> Vec<Tensor> {
    let x = Tensor::from_vec(vec![4, 8], (0..32).map(|i| (i as f32 * 0.37).sin()).collect());
    let w = Tensor::from_vec(vec![8, 8], (0..64).map(|i| (i as f32 * 0.11).cos()).collect());
    vec![x.unwrap(), w.unwrap()]
}

fn registries() -> (Registry, Registry, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    let mut with_device = Registry::new();
    with_device.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    with_device.register(Arc::new(SimEngine { counters: counters.clone() }));
    let mut cpu_only = Registry::new();
    cpu_only.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    (with_device, cpu_only, counters)
}

fn plan(reg: &Registry, policy: &str) -> xpu_plan::CapturePlan {
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let p = xpu_policy::Loader::new().load_text("t.toml", None, policy).unwrap();
    xpu_plan::plan(&g, &p, &reg.inventory()).unwrap().0
}

#[test]
fn transfers_are_performed_through_the_engines_and_buffers_stay_on_the_device() {
    let (reg, cpu_only, counters) = registries();
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let p = xpu_policy::Loader::new().load_text("t.toml", None, POLICY).unwrap();
    let (plan, mut explanation) = xpu_plan::plan(&g, &p, &reg.inventory()).unwrap();
    let devices: Vec<String> =
        plan.partitions.iter().map(|p| format!("{} {}", p.engine, p.device)).collect();
    assert_eq!(devices, ["cpu host", "cuda cuda:0", "cpu host", "cuda cuda:0"]);
    let planned: Vec<String> =
        plan.transfers.iter().map(|t| format!("{} {}", t.value, t.direction.name())).collect();

    let mut exec = xpu_plan::GraphExec::new(Arc::new(plan), &reg).unwrap();
    let run = exec.run(&inputs()).unwrap();

    let reference = plan_on(&cpu_only, "[policy]\nname = \"t\"\n");
    assert_eq!(run.outputs, reference, "same result as on the host alone");
    let done: Vec<String> = run
        .transfers
        .iter()
        .map(|t| {
            format!(
                "{} {} {} -> {} by {}",
                t.value,
                t.direction.name(),
                t.from_device,
                t.to_device,
                t.by
            )
        })
        .collect();
    assert_eq!(
        done,
        [
            "%2 h2d host -> cuda:0 by cuda",
            "%4 h2d host -> cuda:0 by cuda",
            "%5 d2h cuda:0 -> host by cuda",
        ],
        "%3 goes from one device partition to the next without a transfer"
    );
    let done_short: Vec<String> =
        run.transfers.iter().map(|t| format!("{} {}", t.value, t.direction.name())).collect();
    assert_eq!(done_short, planned, "every planned transfer is performed, and only those");
    assert!(run.transfers.iter().all(|t| t.bytes == 4 * 8 * 4 && t.nanos.is_some()));
    assert_eq!(counters.uploads.load(Ordering::SeqCst), 2);
    assert_eq!(counters.downloads.load(Ordering::SeqCst), 1);
    assert_eq!(counters.buffers_in.load(Ordering::SeqCst), 3, "%2, then %3 and %4");
    assert!(run.transfers.iter().all(|t| t.direction != TransferDirection::DeviceToDevice));
    explanation.record_run(&run);
    let text = xpu_plan::render::explanation_text(&explanation, false);
    assert!(text.contains("moved %2 h2d host -> cuda:0: 128 bytes in "), "{text}");
    assert!(text.contains("ms by cuda\n"), "{text}");
}

fn plan_on(reg: &Registry, policy: &str) -> Vec<Tensor> {
    let plan = plan(reg, policy);
    xpu_plan::GraphExec::new(Arc::new(plan), reg).unwrap().run(&inputs()).unwrap().outputs
}

#[test]
fn memory_pinned_host_reaches_every_transfer_and_the_record_says_which_were_pinned() {
    // (policy asks, the engine's threshold): the graph moves 128-byte values.
    for (pinned, least) in [(false, 0), (true, 0), (true, 128), (true, 129)] {
        let policy = if pinned {
            format!("{POLICY}[memory]\npinned_host = true\n")
        } else {
            POLICY.to_string()
        };
        let (reg, _, counters) = registries();
        counters.pinned_min.store(least, Ordering::SeqCst);
        let mut exec = xpu_plan::GraphExec::new(Arc::new(plan(&reg, &policy)), &reg).unwrap();
        let run = exec.run(&inputs()).unwrap();
        let moved =
            counters.uploads.load(Ordering::SeqCst) + counters.downloads.load(Ordering::SeqCst);
        assert!(moved >= 2, "{moved}");
        // Every upload and download was asked for pinned staging exactly when the policy
        // says so; each performed transfer records whether it was staged (asked, and as
        // large as the engine's threshold).
        assert_eq!(counters.pinned.load(Ordering::SeqCst), if pinned { moved } else { 0 });
        let staged: Vec<bool> = run.transfers.iter().map(|t| t.pinned_host).collect();
        let want: Vec<bool> = run.transfers.iter().map(|t| pinned && t.bytes >= least).collect();
        assert_eq!(staged, want, "{:?}", run.transfers);
        assert_eq!(staged.contains(&true), pinned && least <= 128);
        // The stored form names it only when set.
        for t in &run.transfers {
            let json = serde_json::to_string(t).unwrap();
            assert_eq!(json.contains("pinned_host"), t.pinned_host, "{json}");
        }
        // And the explanation says which moves were staged.
        let g = xpu_ir::text::parse(GRAPH).unwrap();
        let p = xpu_policy::Loader::new().load_text("t.toml", None, &policy).unwrap();
        let (_, mut explanation) = xpu_plan::plan(&g, &p, &reg.inventory()).unwrap();
        explanation.record_run(&run);
        let text = xpu_plan::render::explanation_text(&explanation, false);
        let said = text.matches("through pinned host memory").count();
        assert_eq!(said, staged.iter().filter(|s| **s).count(), "{text}");
    }
}

#[test]
fn host_engines_refuse_device_values_by_name() {
    let cpu = xpu_engine_cpu::CpuEngine::new();
    let err = cpu.upload(&inputs()[0], CUDA0, HostMemory::Pageable).unwrap_err();
    assert_eq!(err.to_string(), "cpu keeps no values on cuda:0: cannot upload a value to it");
    assert_eq!(err.code(), "no_device");
    let buffer = SimBuffer { data: vec![0.0; 4], shape: vec![4] };
    let err = cpu.download(&buffer, HostMemory::Pinned).unwrap_err();
    assert!(err.to_string().starts_with("cpu keeps no values on cuda:0"), "{err}");
    // A host partition handed a device buffer: an error naming the buffer's engine, never a
    // silent copy.
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let mut exe = cpu.prepare(&g, &Assignment::new("cpu")).unwrap();
    let args = [Value::Device(Arc::new(buffer)), Value::Host(inputs()[1].clone())];
    let err = exe.run_values(&args, &StopToken::default()).unwrap_err();
    assert!(err.to_string().starts_with("cuda keeps no values on cuda:0"), "{err}");
}

#[test]
fn a_failing_upload_names_the_value_and_devices() {
    struct Full(SimEngine);
    impl Engine for Full {
        fn name(&self) -> &str {
            SIM
        }
        fn version(&self) -> String {
            "0".into()
        }
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        fn prepare(&self, g: &Graph, a: &Assignment) -> Result<Box<dyn Executable>, EngineError> {
            self.0.prepare(g, a)
        }
        fn device_memory(&self, d: DeviceId) -> bool {
            self.0.device_memory(d)
        }
        fn upload(
            &self,
            t: &Tensor,
            device: DeviceId,
            _: HostMemory,
        ) -> Result<Value, EngineError> {
            Err(EngineError::OutOfMemory {
                device,
                requested: t.size_bytes() as u64,
                available: 0,
                reserved: 64,
            })
        }
    }
    let mut reg = Registry::new();
    reg.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    reg.register(Arc::new(Full(SimEngine { counters: Default::default() })));
    let plan = plan(&reg, POLICY);
    let err = xpu_plan::GraphExec::new(Arc::new(plan), &reg).unwrap().run(&inputs()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "moving %2 host -> cuda:0: cuda:0: out of memory: 128 bytes requested, 0 available, 64 held by the engine"
    );
}
