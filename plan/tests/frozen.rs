//! Frozen plans are user input: hand-edited, truncated and garbage plan files are refused by
//! `FrozenPlan::from_json` / `validate` naming the field, and nothing that passes them makes
//! GraphExec panic.

use std::sync::Arc;

use serde_json::Value;
use xpu_engine::Registry;
use xpu_ir::{Graph, Tensor};
use xpu_plan::{FrozenPlan, GraphExec};

/// A graph with a constant, casts (bf16 matmul) and two partitions' worth of nodes.
const GRAPH: &str = r#"graph "t" {
  %0: f32[4,8] = input "x"
  %1: f32[8,8] = input "w"
  %2: f32[8] = constant {value = tensor<f32[8]> [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]}
  %3: f32[4,8] = matmul(%0, %1) @name("fc")
  %4: f32[4,8] = add(%3, %2) @name("fc.bias")
  %5: f32[4,8] = softmax(%4) {axis = -1} @name("probs")
  return "y" = %5
}"#;

fn setup(policy: &str) -> (Graph, Registry, String) {
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let mut reg = Registry::new();
    reg.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    let p = xpu_policy::Loader::new()
        .load_text("t.toml", None, &format!("[policy]\nname = \"t\"\n{policy}"))
        .unwrap();
    let (plan, explanation) = xpu_plan::plan(&g, &p, &reg.inventory()).unwrap();
    let frozen = FrozenPlan { version: FrozenPlan::VERSION, plan, explanation };
    (g, reg, frozen.to_json())
}

fn inputs() -> Vec<Tensor> {
    let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
    let w: Vec<f32> = (0..64).map(|i| (i as f32 * 0.11).cos()).collect();
    vec![Tensor::from_vec(vec![4, 8], x).unwrap(), Tensor::from_vec(vec![8, 8], w).unwrap()]
}

/// Reads, validates and runs a plan file; `Err` is the message a user would see.
fn load_and_run(g: &Graph, reg: &Registry, text: &str) -> Result<Vec<Tensor>, String> {
    let f = FrozenPlan::from_json(text)?;
    f.validate(g, &g.content_hash(), None).map_err(|e| e.to_string())?;
    let mut exec = GraphExec::new(Arc::new(f.plan), reg).map_err(|e| e.to_string())?;
    exec.run(&inputs()).map(|r| r.outputs).map_err(|e| e.to_string())
}

/// `text` with the JSON value at `path` (`/plan/partitions/0/id`) replaced.
fn edit(text: &str, path: &str, value: Value) -> String {
    let mut v: Value = serde_json::from_str(text).unwrap();
    *v.pointer_mut(path).unwrap_or_else(|| panic!("{path} is in the plan")) = value;
    v.to_string()
}

#[test]
fn a_valid_plan_loads_and_runs() {
    let (g, reg, text) = setup("[precision]\ndefault = \"bf16\"\n");
    let f = FrozenPlan::from_json(&text).unwrap();
    assert!(!f.plan.casts.is_empty(), "the test plan inserts casts");
    let out = load_and_run(&g, &reg, &text).unwrap();
    assert_eq!(out[0].shape(), &[4, 8]);
}

/// The hand edits the issue reported (each a panic or a silent run before) and others, each
/// refused by the field that is wrong.
#[test]
fn hand_edited_plans_are_refused_by_field() {
    let (g, reg, text) = setup("[precision]\ndefault = \"bf16\"\n");
    let short = Value::String("ab".into());
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/plan/partitions/0/nodes/0", 9999.into(), "plan.partitions[0].nodes[0]: n9999"),
        (
            "/plan/placements/0/partition",
            99.into(),
            "plan.placements[0].partition: 99 is not a partition",
        ),
        ("/plan/source_graph_hash", short.clone(), "plan.source_graph_hash: not a SHA-256"),
        ("/explanation/graph_hash", short, "explanation.graph_hash: not a SHA-256"),
        (
            "/plan/placements/1/engine",
            "warp".into(),
            "plan.placements[1].engine: \"warp\" is not an engine",
        ),
        (
            "/plan/placements/1/kernel",
            "cpu.magic".into(),
            "plan.placements[1].kernel: \"cpu.magic\"",
        ),
        ("/plan/placements/1/op", "relu".into(), "plan.placements[1].op"),
        (
            "/plan/placements/1/precision",
            "fp7".into(),
            "plan.placements[1].precision: unknown variant `fp7`",
        ),
        ("/plan/partitions/0/id", 3.into(), "plan.partitions[0].id"),
        ("/plan/partitions/0/device", "cuda:0".into(), "plan.partitions[0].nodes[0]"),
        (
            "/plan/partitions/0/device",
            "tpu:0".into(),
            "plan.partitions[0].device: device \"tpu:0\": unknown kind",
        ),
        (
            "/plan/partitions/0/assignment/options",
            serde_json::json!({ "threads": 0 }),
            "plan.partitions[0].assignment.options.threads: 0 threads",
        ),
        ("/plan/casts/0/node", 4096.into(), "plan.casts[0].node"),
        ("/plan/graph/nodes/4/op", "sub".into(), "plan.graph"),
        ("/explanation/decisions/0/node", 77.into(), "explanation.decisions[0].node"),
        ("/version", 1.into(), "frozen plan format 1 is not supported"),
        ("/plan/execution/capture", "movie".into(), "plan.execution.capture: unknown variant"),
    ];
    for (path, value, says) in cases {
        let err = load_and_run(&g, &reg, &edit(&text, path, value)).unwrap_err();
        assert!(err.contains(says), "{path}: {err}");
    }
    // Another program's plan.
    let other = xpu_ir::text::parse(&GRAPH.replace("softmax(%4) {axis = -1}", "relu(%4)")).unwrap();
    let f = FrozenPlan::from_json(&text).unwrap();
    let err = f.validate(&other, &other.content_hash(), None).unwrap_err().to_string();
    assert!(err.contains("the plan was made for graph t"), "{err}");
    // A transfer whose direction disagrees with its devices.
    let (_, _, gpu_text) = setup("");
    let mut v: Value = serde_json::from_str(&gpu_text).unwrap();
    v["plan"]["transfers"] = serde_json::json!([{ "value": 0, "from_device": "host",
        "to_device": "cuda:0", "direction": "d2h", "bytes": 128, "to_partition": 0, "reason": "" }]);
    let err = load_and_run(&g, &reg, &v.to_string()).unwrap_err();
    assert!(
        err.contains("plan.transfers[0].direction: d2h does not go from host to cuda:0"),
        "{err}"
    );
    for garbage in ["", "{", "[]", "null", "{\"version\": 2}", "{\"version\": \"2\"}"] {
        let err = load_and_run(&g, &reg, garbage).unwrap_err();
        assert!(err.contains("not a frozen plan"), "{garbage:?}: {err}");
    }
}

/// Every leaf of a real plan file replaced by out-of-range, empty, huge and mistyped values,
/// and every object key removed: each mutant is refused with a message or runs; none panics.
#[test]
fn mutated_plan_files_never_panic() {
    let (g, reg, text) = setup("[precision]\ndefault = \"bf16\"\n");
    let root: Value = serde_json::from_str(&text).unwrap();
    let mut paths = Vec::new();
    collect_paths(&root, String::new(), &mut paths);
    let replacements: Vec<Value> = vec![
        9999.into(),
        (-1).into(),
        u64::MAX.into(),
        "ab".into(),
        "".into(),
        "x".repeat(100_000).into(),
        Value::Null,
        true.into(),
        serde_json::json!([]),
        serde_json::json!({}),
    ];
    let (mut mutants, mut refused, mut ran) = (0, 0, 0);
    for path in &paths {
        let mut targets: Vec<Value> = Vec::new();
        for r in &replacements {
            let mut v = root.clone();
            *v.pointer_mut(path).unwrap() = r.clone();
            targets.push(v);
        }
        // The key itself removed.
        if let Some((parent, key)) = path.rsplit_once('/') {
            let mut v = root.clone();
            if let Some(Value::Object(m)) = v.pointer_mut(parent) {
                m.remove(key);
                targets.push(v);
            }
        }
        for v in targets {
            mutants += 1;
            let text = v.to_string();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                load_and_run(&g, &reg, &text)
            }));
            match result {
                Ok(Ok(_)) => ran += 1,
                Ok(Err(message)) => {
                    assert!(!message.trim().is_empty(), "{path}: an empty error");
                    refused += 1;
                }
                Err(_) => panic!("{path}: mutant panicked"),
            }
        }
    }
    eprintln!("{mutants} mutants of {} leaves: {refused} refused, {ran} ran", paths.len());
    assert!(mutants > 1000 && refused > mutants / 2, "{mutants} {refused} {ran}");
}

/// JSON pointers of every leaf and every object member.
fn collect_paths(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                collect_paths(child, p, out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                collect_paths(child, p, out);
            }
        }
        _ => {}
    }
}
