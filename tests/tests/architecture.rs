//! Enforces the crate dependency direction of ARCHITECTURE.md: frontends depend only on the
//! IR, engines only on the engine API and the IR, and nothing below the CLI/daemon depends on
//! them. A new workspace crate must be placed in this table.

use std::collections::{BTreeMap, BTreeSet};

/// The library crates: what the top-level crates (CLI, bench, workspace tests) may use.
const LIBRARIES: &[&str] = &[
    "xpu-ir",
    "xpu-lir",
    "xpu-lower",
    "xpu-onnx",
    "xpu-minilang",
    "xpu-engine",
    "xpu-engine-cpu",
    "xpu-engine-table",
    "xpu-engine-ort",
    "xpu-engine-openvino",
    "xpu-engine-llvm",
    "xpu-engine-cuda",
    "xpu-policy",
    "xpu-plan",
    "xpu-runtime",
    "xpu-tensorfile",
    "xpu-worker",
    "xpu-journal",
    "xpu-store",
    "xpu-api",
    "xpu-assistant",
    "xpu-ask-data",
];

/// Crate -> the workspace crates it may depend on (normal and build dependencies).
fn allowed() -> BTreeMap<&'static str, &'static [&'static str]> {
    BTreeMap::from([
        ("xpu-ir", &[][..]),
        ("xpu-lir", &["xpu-ir"][..]),
        // Partitions (SGR-ML) lowered to loop nests (LIR-ML): no engine, no policy.
        ("xpu-lower", &["xpu-ir", "xpu-lir"][..]),
        ("xpu-onnx", &["xpu-ir"][..]),
        ("xpu-minilang", &["xpu-ir"][..]),
        ("xpu-engine", &["xpu-ir"][..]),
        ("xpu-engine-cpu", &["xpu-engine", "xpu-ir"][..]),
        ("xpu-engine-table", &["xpu-engine", "xpu-ir"][..]),
        // Engines that take ONNX get partitions through the exporter.
        ("xpu-engine-ort", &["xpu-engine", "xpu-ir", "xpu-onnx"][..]),
        ("xpu-engine-openvino", &["xpu-engine", "xpu-ir", "xpu-onnx"][..]),
        // Codegen engines lower partitions to LIR-ML and compile it; neither depends on the
        // other (a cuda build carries no LLVM).
        ("xpu-engine-llvm", &["xpu-engine", "xpu-ir", "xpu-lir", "xpu-lower"][..]),
        ("xpu-engine-cuda", &["xpu-engine", "xpu-ir", "xpu-lir", "xpu-lower"][..]),
        ("xpu-policy", &["xpu-ir", "xpu-engine"][..]),
        ("xpu-plan", &["xpu-ir", "xpu-policy", "xpu-engine"][..]),
        // File formats: the IR's tensors and ONNX's TensorProto, nothing that runs.
        ("xpu-tensorfile", &["xpu-ir", "xpu-onnx"][..]),
        // Engines in worker processes: the engine API and the IR, no engine crate (the
        // runtime hands it the engine to serve).
        ("xpu-worker", &["xpu-engine", "xpu-ir"][..]),
        (
            "xpu-runtime",
            &[
                "xpu-tensorfile",
                "xpu-worker",
                "xpu-ir",
                "xpu-onnx",
                "xpu-minilang",
                "xpu-engine",
                "xpu-engine-cpu",
                "xpu-engine-table",
                "xpu-engine-ort",
                "xpu-engine-openvino",
                "xpu-engine-llvm",
                "xpu-engine-cuda",
                "xpu-policy",
                "xpu-plan",
            ][..],
        ),
        // The store knows explanations, not engines or programs.
        ("xpu-store", &["xpu-plan", "xpu-journal"][..]),
        // The log and the REST bodies stand alone (fuzzed without the store or the daemon).
        ("xpu-journal", &[][..]),
        ("xpu-api", &[][..]),
        // The ask loop knows MiniLang and an HTTP endpoint; lowering and running the
        // programs it judges are its callers' (a `Judge`).
        ("xpu-assistant", &["xpu-minilang"][..]),
        // An ask's data: the table engine reads the schemas the prompt shows.
        ("xpu-ask-data", &["xpu-assistant", "xpu-engine-table", "xpu-ir", "xpu-store"][..]),
        // The Python package's native module binds the runtime, as xpuctl does; it adds no
        // engine or planning of its own.
        (
            "xpu-python",
            &[
                "xpu-runtime",
                "xpu-engine",
                "xpu-engine-table",
                "xpu-ir",
                "xpu-minilang",
                "xpu-plan",
                "xpu-policy",
            ][..],
        ),
        ("xpud", LIBRARIES),
        ("xpuctl", LIBRARIES),
        ("xpu-bench", LIBRARIES),
        ("xpu-gpu-check", LIBRARIES),
        ("xpu-tests", LIBRARIES),
    ])
}

#[test]
fn dependency_direction() {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(xpu_tests::repo_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let members: BTreeSet<String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    let table = allowed();
    let mut problems = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let Some(ok) = table.get(name) else {
            problems.push(format!(
                "{name} is not in the dependency table of tests/tests/architecture.rs"
            ));
            continue;
        };
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["name"].as_str().unwrap();
            let dev = d["kind"].as_str() == Some("dev");
            if members.contains(dep) && !dev && !ok.contains(&dep) {
                problems.push(format!("{name} must not depend on {dep}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The floors of the source tree, bottom first: a crate's directory says which floor it is
/// on, and a crate may depend only on crates of its own floor or below — so a directory
/// tells a reader what a crate may import, and no arrow runs back up.
const FLOORS: &[(&str, &[&str])] = &[
    // Front ends and IRs: the IR and what is built on it, nothing that runs or decides.
    ("compiler", &["compiler/"]),
    // The engine API and the engines.
    ("engines", &["engines/"]),
    // The policy format: op names, dtypes and kernels of the engine catalogue.
    ("policies", &["policies"]),
    // The planner and GraphExec: policies and engines in, plans and runs out.
    ("plan", &["plan"]),
    // Processes that run plans: the runtime, its file formats and worker processes.
    ("runtime", &["runtime"]),
    // What users run: the daemon and its stores, the CLI, the Python package, tools.
    ("top", &["daemon", "cli", "python", "bench", "tests", "tools/", "fuzz"]),
];

fn floor_of(dir: &str) -> Option<usize> {
    FLOORS.iter().position(|(_, prefixes)| {
        prefixes.iter().any(|p| {
            dir == p.trim_end_matches('/')
                || dir.starts_with(&format!("{}/", p.trim_end_matches('/')))
        })
    })
}

#[test]
fn crates_sit_on_the_floor_their_imports_say() {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(xpu_tests::repo_root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed");
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let root = xpu_tests::repo_root().canonicalize().unwrap();
    let mut floor: BTreeMap<String, (usize, String)> = BTreeMap::new();
    let mut problems = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap().to_string();
        let manifest = std::path::Path::new(p["manifest_path"].as_str().unwrap());
        let dir =
            manifest.parent().unwrap().strip_prefix(&root).unwrap().to_string_lossy().to_string();
        match floor_of(&dir) {
            Some(f) => {
                floor.insert(name, (f, dir));
            }
            None => problems
                .push(format!("{name} ({dir}) is on no floor of tests/tests/architecture.rs")),
        }
    }
    for p in meta["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let Some((own, dir)) = floor.get(name) else { continue };
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["name"].as_str().unwrap();
            if d["kind"].as_str() == Some("dev") {
                continue;
            }
            if let Some((theirs, their_dir)) = floor.get(dep)
                && theirs > own
            {
                problems.push(format!(
                    "{name} ({dir}, floor {}) depends on {dep} ({their_dir}, floor {}): an arrow up",
                    FLOORS[*own].0, FLOORS[*theirs].0
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn heavy_native_dependencies_stay_out_of_the_core() {
    // DuckDB and other C++-heavy crates belong only in the crates that need them.
    let lock = std::fs::read_to_string(xpu_tests::repo_root().join("Cargo.toml")).unwrap();
    for core in [
        "compiler/ir/Cargo.toml",
        "compiler/onnx/Cargo.toml",
        "plan/Cargo.toml",
        "engines/api/Cargo.toml",
        "policies/Cargo.toml",
    ] {
        let text = std::fs::read_to_string(xpu_tests::repo_root().join(core)).unwrap();
        for heavy in ["duckdb", "ort", "openvino", "inkwell", "cudarc", "tantivy"] {
            assert!(
                !text.lines().any(|l| l.trim_start().starts_with(&format!("{heavy} "))
                    || l.trim_start().starts_with(&format!("{heavy}."))),
                "{core} depends on {heavy}"
            );
        }
    }
    assert!(lock.contains("[workspace.lints"), "workspace lints are configured");
}
