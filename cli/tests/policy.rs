//! `xpuctl policy check|test|resolve|diff`, `engines --format toml` and `run --policy`:
//! exit codes, located diagnostics, the documented JSON shapes, and garbage input.

use std::process::Command;

mod common;
use common::{repo, write_npy_f32, xpuctl, xpuctl_env};

#[test]
fn example_policies_check_and_test_clean() {
    let (code, out, err) = xpuctl(&["policy", "check", "policies/examples"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches(": ok").count(), 9, "{out}");
    for inv in ["cpu-x86", "h100", "npu-laptop"] {
        let inv = format!("policies/inventories/{inv}.toml");
        let (code, out, err) =
            xpuctl(&["policy", "check", "policies/examples/cpu-only.toml", "--inventory", &inv]);
        assert_eq!(code, 0, "{inv}: {out}{err}");
    }
    // The board has no im2col kernel and cpu-only denies fallback: a contextual error.
    let (code, out, _) = xpuctl(&[
        "policy",
        "check",
        "policies/examples/cpu-only.toml",
        "--inventory",
        "policies/inventories/riscv-board.toml",
    ]);
    assert_eq!(code, 1);
    assert!(out.contains("cpu-only.toml:16:1: error[P0105]: kernel `cpu.im2col_conv` is not available in inventory riscv-board"), "{out}");
    let (code, out, err) = xpuctl(&["policy", "test", "policies/examples"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(" passed, 0 failed"), "{out}");
    let passed: usize =
        out.lines().last().unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(passed >= 10, "{out}");
    let (code, out, _) = xpuctl(&["policy", "test", "policies/examples", "--format", "junit"]);
    assert_eq!(code, 0);
    assert!(out.contains("<testsuites") && out.contains("mlp on the H100"), "{out}");
}

#[test]
fn bad_policies_exit_1_with_located_diagnostics() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, "[policy]\nname = \"bad\"\n[engines]\norder = [\"cuda\", \"cdua\"]\n[kernels]\nmatmul = \"cuda.cublasLt\"\n").unwrap();
    let ps = p.display().to_string();
    let (code, out, _) = xpuctl(&["policy", "check", &ps]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("{ps}:4:1: error[P0004]: unknown engine `cdua`")), "{out}");
    assert!(out.contains("help: did you mean `cuda`?"), "{out}");
    assert!(out.contains("error[P0005]: unknown kernel `cuda.cublasLt`"), "{out}");
    let (code, out, _) = xpuctl(&["policy", "check", &ps, "--format", "json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    let d = &v["files"][0]["diagnostics"][0];
    assert_eq!(
        (d["code"].as_str(), d["at"]["line"].as_u64(), d["severity"].as_str()),
        (Some("P0004"), Some(4), Some("error")),
        "{d}"
    );
    let (code, out, _) = xpuctl(&["policy", "check", &ps, "--format", "junit"]);
    assert_eq!(code, 1);
    assert!(out.contains("<failure") && out.contains("unknown engine"), "{out}");

    // Contextual: a GPU policy that denies fallback fails against a CPU inventory.
    let gpu = dir.path().join("gpu.toml");
    std::fs::write(
        &gpu,
        "[policy]\nname = \"gpu\"\n[engines]\norder = [\"cuda\"]\nfallback = \"deny\"\n",
    )
    .unwrap();
    let gs = gpu.display().to_string();
    let (code, out, _) = xpuctl(&["policy", "check", &gs]);
    assert_eq!(code, 0, "structurally fine: {out}");
    let (code, out, _) =
        xpuctl(&["policy", "check", &gs, "--inventory", "policies/inventories/cpu-x86.toml"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("error[P0104]: engine `cuda` is unavailable: no NVIDIA GPU on this machine in inventory cpu-x86"), "{out}");
    let (code, out, _) =
        xpuctl(&["policy", "check", &gs, "--inventory", "policies/inventories/h100.toml"]);
    assert_eq!(code, 0, "{out}");

    // Missing files referenced by tests, unparsable inventories.
    let t = dir.path().join("t.toml");
    std::fs::write(&t, "[policy]\nname = \"t\"\n[[test]]\nprogram = \"nope.sgr\"\ninventory = \"nope.toml\"\nexpect_error = \"Unplacable\"\n").unwrap();
    let (code, out, _) = xpuctl(&["policy", "check", &t.display().to_string()]);
    assert_eq!(code, 1);
    assert!(
        out.contains("P0012")
            && out.contains("nope.sgr")
            && out.contains("did you mean `Unplaceable`?"),
        "{out}"
    );
    let inv = dir.path().join("inv.toml");
    std::fs::write(&inv, "[[engines]]\nengine = \"cpu\"\nversion = \"1\"\navailability = { status = \"available\" }\nkernels = [{ name = \"cpu.x\", ops = [\"matmull\"], dtypes = [\"f32\"] }]\n").unwrap();
    let (code, _, err) =
        xpuctl(&["policy", "check", &gs, "--inventory", &inv.display().to_string()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("inv.toml:5:36")
            && err.contains("unknown op `matmull`")
            && err.contains("did you mean `matmul`?"),
        "{err}"
    );
}

#[test]
fn policy_check_never_panics_on_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let inputs: Vec<Vec<u8>> = vec![
        vec![0xff, 0xfe, 0x00, 0x41],
        b"[[[[".to_vec(),
        b"[policy]\nname = [1, {a = 2}]\n".to_vec(),
        b"[policy]\nname = \"x\"\nextends = \"x\"\n".to_vec(),
        b"[kernels]\nmatmul = { a = 1 }\n".to_vec(),
        b"rule = 5\n".to_vec(),
        (0..2000u32).map(|i| (i * 7919 % 251) as u8).collect(),
    ];
    for (i, bytes) in inputs.iter().enumerate() {
        let p = dir.path().join(format!("g{i}.toml"));
        std::fs::write(&p, bytes).unwrap();
        let (code, out, err) = xpuctl(&["policy", "check", &p.display().to_string()]);
        assert_eq!(code, 1, "garbage {i} must fail: {out}{err}");
        assert!(!err.contains("panicked") && !err.contains("internal error"), "{err}");
        assert!(out.contains(&format!("g{i}.toml")), "the diagnostic names the file: {out}{err}");
    }
}

#[test]
fn resolve_prints_the_plan_and_its_json() {
    let (code, out, err) = xpuctl(&[
        "policy",
        "resolve",
        "--policy",
        "latency-gpu",
        "tests/programs/mlp.sgr",
        "--inventory",
        "policies/inventories/h100.toml",
        "--bind",
        "N=64",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().nth(1).unwrap().starts_with("passes: canon ("), "{out}");
    assert!(out.lines().nth(2).unwrap().starts_with("node"), "{out}");
    assert!(
        out.contains("n0 fc1")
            && out.contains("cuda.cublaslt")
            && out.contains("kernels.matmul (policies/examples/latency-gpu.toml:18)"),
        "{out}"
    );
    let (code, out, _) = xpuctl(&[
        "policy",
        "resolve",
        "--policy",
        "policies/examples/latency-gpu.toml",
        "tests/programs/mlp.sgr",
        "--inventory",
        "policies/inventories/h100.toml",
        "--format",
        "json",
        "--why",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let n0 = &v["nodes"][0];
    for key in ["node", "op", "engine", "kernel", "precision", "rule", "rejected"] {
        assert!(n0.get(key).is_some(), "missing {key}: {n0}");
    }
    assert_eq!((n0["engine"].as_str(), n0["precision"].as_str()), (Some("cuda"), Some("bf16")));
    let r = &n0["rejected"][0];
    for key in ["engine", "kernel", "code", "detail", "key", "at"] {
        assert!(r.get(key).is_some(), "rejection lacks {key}: {r}");
    }
    // The live inventory has no usable cuda (no GPU here): the pinned matmuls cannot be
    // placed, exit 1, and --why says why.
    let (code, out, _) = xpuctl(&[
        "policy",
        "resolve",
        "--policy",
        "latency-gpu",
        "tests/programs/mlp.sgr",
        "--why",
    ]);
    assert_eq!(code, 1);
    assert!(
        out.contains("UNPLACED")
            && out.contains("rejected cuda: EngineUnavailable — cuda: unavailable: no CUDA driver"),
        "{out}"
    );
    assert!(out.contains("rejected cpu: KernelNotPinned"), "{out}");
    // Job overrides through --set: only overridable keys.
    let (code, _, err) = xpuctl(&[
        "policy",
        "resolve",
        "--policy",
        "cpu-only",
        "tests/programs/mlp.sgr",
        "--set",
        "execution.threads=3",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = xpuctl(&[
        "policy",
        "resolve",
        "--policy",
        "cpu-only",
        "tests/programs/mlp.sgr",
        "--set",
        "engines.order=[\"cuda\"]",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("P0011") && err.contains("does not allow a job to override `engines.order`"),
        "{err}"
    );
}

#[test]
fn diff_lists_changed_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let old = repo().join("policies/examples/cpu-only.toml");
    let text = std::fs::read_to_string(&old)
        .unwrap()
        .replace("matmul = [\"cpu.blas\", \"cpu.gemm\"]", "matmul = [\"cpu.gemm\", \"cpu.blas\"]");
    let new = dir.path().join("cpu-only.toml");
    std::fs::write(&new, text).unwrap();
    std::fs::copy(repo().join("policies/examples/base.toml"), dir.path().join("base.toml"))
        .unwrap();
    let args = [
        "policy",
        "diff",
        "policies/examples/cpu-only.toml",
        new.to_str().unwrap(),
        "tests/programs/mlp.sgr",
        "tests/programs/convnet.sgr",
        "--inventory",
        "policies/inventories/cpu-x86.toml",
    ];
    let (code, out, err) = xpuctl(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "tests/programs/mlp.sgr n0 matmul \"fc1\": cpu/cpu.blas/fp32 -> cpu/cpu.gemm/fp32"
        ),
        "{out}"
    );
    assert!(out.contains("4 of 17 node decisions change"), "{out}");
    let mut fail = args.to_vec();
    fail.push("--fail-on-change");
    assert_eq!(xpuctl(&fail).0, 1);
    let same = [
        "policy",
        "diff",
        "policies/examples/cpu-only.toml",
        "policies/examples/cpu-only.toml",
        "tests/programs/mlp.sgr",
        "--fail-on-change",
    ];
    let (code, out, _) = xpuctl(&same);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 of 9 node decisions change"), "{out}");
}

#[test]
fn live_inventory_round_trips_through_toml() {
    let dir = tempfile::tempdir().unwrap();
    let (code, toml, _) = xpuctl(&["engines", "--format", "toml"]);
    assert_eq!(code, 0);
    // Every engine of the build is listed; one without its library or device (cuda here:
    // no driver) is listed unavailable with the reason, which survives the round trip.
    assert!(toml.contains("engine = \"cpu\"") && toml.contains("engine = \"cuda\""), "{toml}");
    if toml.contains("no CUDA driver") {
        assert!(toml.contains("status = \"unavailable\""), "{toml}");
    }
    let inv = dir.path().join("live.toml");
    std::fs::write(&inv, &toml).unwrap();
    let (code, out, err) = xpuctl(&[
        "policy",
        "resolve",
        "--policy",
        "cpu-only",
        "tests/programs/convnet.sgr",
        "--inventory",
        inv.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cpu.im2col_conv"), "{out}");
}

#[test]
fn run_under_a_policy_explains_itself() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().display().to_string();
    let (code, out, err) = xpuctl(&[
        "run",
        "examples/mlp.sgr",
        "--input",
        "x=examples/mlp_input.npy",
        "--out",
        &out_dir,
        "--policy",
        "cpu-only",
        "--explain",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("(policy cpu-only)")
            && out.contains("cpu.blas")
            && out.contains("kernel time"),
        "{out}"
    );
    // bf16 through an operator's environment override: casts are planned and executed.
    let (code, out, err) = xpuctl_env(
        &[
            "run",
            "examples/mlp.sgr",
            "--input",
            "x=examples/mlp_input.npy",
            "--out",
            &out_dir,
            "--policy",
            "cpu-only",
            "--explain",
            "--format",
            "json",
        ],
        &[
            ("XPU_POLICY__PRECISION__DEFAULT", "bf16"),
            ("XPU_POLICY__PRECISION__ALLOW", "[\"bf16\", \"fp32\"]"),
            ("XPU_POLICY__KERNELS__MATMUL", "cpu.gemm"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!v["explanation"]["casts"].as_array().unwrap().is_empty(), "{out}");
    assert_eq!(v["explanation"]["decisions"][1]["chosen"]["precision"], "bf16");
    // A policy whose engines are absent here fails with the reason, nothing runs.
    let (code, _, err) = xpuctl(&[
        "run",
        "examples/mlp.sgr",
        "--input",
        "x=examples/mlp_input.npy",
        "--out",
        &out_dir,
        "--policy",
        "latency-gpu",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no plan under policy latency-gpu") && err.contains("Unplaceable"),
        "{err}"
    );
}

#[test]
fn frozen_plans_replay_only_for_their_program() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let plan_s = plan.to_str().unwrap();
    let out_dir = dir.path().join("out");
    let out_s = out_dir.to_str().unwrap();
    let (code, _, err) = xpuctl(&[
        "policy",
        "resolve",
        "--policy",
        "deterministic-audit",
        "examples/mlp.sgr",
        "--plan-out",
        plan_s,
    ]);
    assert_eq!(code, 0, "{err}");
    let good_plan = std::fs::read_to_string(&plan).unwrap();
    let (code, out, err) = xpuctl(&[
        "run",
        "examples/mlp.sgr",
        "--input",
        "x=examples/mlp_input.npy",
        "--out",
        out_s,
        "--plan",
        plan_s,
        "--explain",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("(policy deterministic-audit (frozen plan")
            && out.contains("cpu.naive")
            && out.contains("fact cpu: threads = 1"),
        "{out}"
    );
    // The plan replayed for a program (exit code, stderr).
    let replay = |program: &str| {
        let (code, _, err) = xpuctl(&[
            "run",
            program,
            "--input",
            "x=examples/mlp_input.npy",
            "--out",
            out_s,
            "--plan",
            plan_s,
        ]);
        (code, err)
    };
    let (code, err) = replay("examples/mlp.onnx");
    assert_eq!(code, 1);
    assert!(err.contains("the plan was made for graph mlp"), "{err}");
    std::fs::write(&plan, "{\"version\": 2, \"plan\": 5}").unwrap();
    let (code, err) = replay("examples/mlp.sgr");
    assert_eq!(code, 1);
    assert!(err.contains("plan.json: not a frozen plan: plan: invalid type"), "{err}");
    // A hand-edited plan naming a partition that does not exist: refused by field, exit 1.
    std::fs::write(&plan, good_plan.replace("\"partition\": 0", "\"partition\": 99")).unwrap();
    let (code, err) = replay("examples/mlp.sgr");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("plan.json: plan.placements[0].partition: 99 is not a partition"),
        "{err}"
    );
    std::fs::write(&plan, good_plan.replace("\"version\": 2", "\"version\": 1")).unwrap();
    let (code, err) = replay("examples/mlp.sgr");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("frozen plan format 1 is not supported"), "{err}");
    let (code, _, _) =
        xpuctl(&["run", "examples/mlp.sgr", "--plan", plan_s, "--policy", "cpu-only"]);
    assert_eq!(code, 2, "--plan and --policy conflict");
}

#[test]
fn labels_select_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let out_s = dir.path().to_str().unwrap();
    let run = |labels: &[&str]| {
        let mut args =
            vec!["run", "examples/mlp.sgr", "--input", "x=examples/mlp_input.npy", "--out", out_s];
        for l in labels {
            args.extend(["--label", l]);
        }
        xpuctl(&args)
    };
    let (code, out, err) = run(&["tier=batch"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(policy cpu-only)"), "{out}");
    let (code, out, err) = run(&["tier=batch", "audit=true"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("(policy deterministic-audit)"),
        "priority 100 beats 10 at equal specificity: {out}"
    );
    let (code, out, err) = run(&["team=none"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(policy base)"), "only the unlabelled policy matches: {out}");
    let (code, _, err) = run(&["oops"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn minilang_check_reports_every_diagnostic() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("example.ml");
    std::fs::write(&seed, "# example.ml\nlet data = load_csv(\"titanic.csv\")\nprint stats(data, [\"mean\", \"std\", \"50%\"])\n").unwrap();
    // It parses and its names check; lowering reads the CSV's header, which is missing.
    let (code, out, _) = xpuctl(&["check", seed.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("error[E0301]") && out.contains("example.ml:2:21"), "{out}");
    std::fs::write(dir.path().join("titanic.csv"), "Name,Age\n\"Doe, J\",30\nRoe,\n").unwrap();
    let (code, out, err) = xpuctl(&["check", seed.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let ok = dir.path().join("ok.ml");
    std::fs::write(&ok, "let x = [1.0, 2.0]\nprint sum(x)\n").unwrap();
    let (code, out, err) = xpuctl(&["check", ok.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok.ml: ok (2 statements)"), "{out}");
    std::fs::write(&ok, "let x = [1.0, 2.0]\nprint x @ [[1.0, 2.0, 3.0]]\n").unwrap();
    let (code, out, _) = xpuctl(&["check", ok.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        out.contains("error[E0205]") && out.contains("ok.ml:2:7"),
        "a shape mismatch known at compile time: {out}"
    );
    let p = dir.path().join("bad.ml");
    std::fs::write(&p, "let x = 1\nx = 2\nprint lod_csv(\"a.csv\")\nlet y = [1, 2\n").unwrap();
    let ps = p.to_str().unwrap();
    let (code, out, _) = xpuctl(&["check", ps]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("error[E0101]: cannot assign twice to immutable binding `x`"), "{out}");
    assert!(out.contains("bad.ml:2:1") && out.contains("first bound here"), "{out}");
    assert!(out.contains("error[E0004]"), "{out}");
    let (code, out, _) = xpuctl(&["check", ps, "--format", "json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d = &v["diagnostics"][0];
    assert_eq!(
        (d["code"].as_str(), d["line"].as_u64(), d["col"].as_u64()),
        (Some("E0101"), Some(2), Some(1)),
        "{d}"
    );
    // The seed example runs: the statistics print with their names as row labels.
    let (code, out, err) = xpuctl(&["run", seed.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("       Age\nmean  30.0\nstd    NaN\n50%   30.0\n"), "{out}");
    // An unknown column is located, with did-you-mean from the real header.
    std::fs::write(&seed, "let data = load_csv(\"titanic.csv\")\nprint data |> filter(age > 3)\n")
        .unwrap();
    let (code, out, _) = xpuctl(&["check", seed.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("error[E0208]: unknown column `age`")
            && out.contains("example.ml:2:22")
            && out.contains("did you mean `Age`?"),
        "{out}"
    );
    // Tensor programs lower, plan and run; prints come out in program order.
    let t = dir.path().join("t.ml");
    std::fs::write(&t, "let x = [[1.0, 2.0], [3.0, 4.0]]\nprint \"x @ x =\"\nprint x @ x\nfn twice(v) { v * 2 }\nprint sum(twice(x), axis=1)\n").unwrap();
    let out_dir = dir.path().join("out");
    let (code, out, err) =
        xpuctl(&["run", t.to_str().unwrap(), "--out", out_dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("x @ x =\n[[ 7.0 10.0]\n [15.0 22.0]]\n[ 6.0 14.0]\n"), "{out}");
    assert!(out_dir.join("print_1.npy").is_file());
    let (code, out, _) = xpuctl(&["ir", "print", t.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("matmul(") && out.contains("return \"print_1\""), "{out}");
    std::fs::write(&p, [0xff, 0xfe, b'\n']).unwrap();
    let (code, _, err) = xpuctl(&["check", ps]);
    assert_eq!(code, 1);
    assert!(err.contains("not UTF-8"), "{err}");
}

#[test]
fn repl_keeps_state_across_lines() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .arg("repl")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"let x = [[1.0, 2.0],\n  [3.0, 4.0]]\nx @ x\n:type x * 2\nlet y = zz\n1 + 2\nfn f(a) {\n  a * 10\n}\nf(4)\n:ir\n:quit\nprint 99\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(
            "[[ 7.0 10.0]\n [15.0 22.0]]\ntensor f64[2,2]\nerror[E0100]: unknown name `zz`"
        ),
        "{text}"
    );
    assert!(
        text.contains("\n3\n40\ngraph \"repl\" {") && text.contains("matmul(%0, %1)"),
        "{text}"
    );
    assert!(!text.contains("99"), "input after :quit is not run: {text}");
}

#[test]
fn the_tensor_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let program = repo().join("examples/tensors.ml");
    let out_dir = dir.path().join("out");
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .args(["run", program.to_str().unwrap(), "--out", out_dir.to_str().unwrap()])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("row sums (all 1):\n[1.0 1.0 1.0]\n"), "{text}");
    // write_npy resolved inside the working directory (the first data root).
    assert!(dir.path().join("probs.npy").is_file());
    // A program over an input file: --input types and binds input("x").
    let x = dir.path().join("x.npy");
    let p = dir.path().join("in.ml");
    std::fs::write(&p, "print sum(input(\"x\") * 2)\n").unwrap();
    write_npy_f32(&x, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let arg = format!("x={}", x.display());
    let (code, out, err) =
        xpuctl(&["run", p.to_str().unwrap(), "--input", &arg, "--out", out_dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("20.0\n"), "{out}");
    let (code, _, err) = xpuctl(&["run", p.to_str().unwrap(), "--out", out_dir.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("error[E0302]: input `x` is not given"), "{err}");
    // An ONNX model inlined into a MiniLang program gives what running the model gives.
    std::fs::copy(repo().join("examples/mlp.onnx"), dir.path().join("mlp.onnx")).unwrap();
    std::fs::write(&p, "let net = model(\"mlp.onnx\")\nprint net(input(\"x\"))[0]\n").unwrap();
    let arg = format!("x={}", repo().join("examples/mlp_input.npy").display());
    let (code, out, err) =
        xpuctl(&["run", p.to_str().unwrap(), "--input", &arg, "--out", out_dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("[[0.220442 0.263288 0.354519 0.161751]"), "{out}");
}

/// `xpuctl tune` measures the candidates, writes a lock beside the policy, and a policy
/// choosing by measurement plans with it: `evidence` and `policy resolve` name the figures;
/// `policy check` against another machine's inventory says the lock does not hold there.
#[test]
fn tune_writes_a_lock_that_measured_choice_reads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let policy = d.join("p.toml");
    std::fs::write(
        &policy,
        "[policy]\nname = \"cpu-first\"\n[engines]\norder = [\"cpu\", \"llvm\"]\n",
    )
    .unwrap();
    let x = d.join("x.npy");
    write_npy_f32(&x, &[8, 16], &vec![0.5; 128]);
    let mlp = repo().join("examples/mlp.onnx");
    let (p, m, xs) =
        (policy.display().to_string(), mlp.display().to_string(), format!("x={}", x.display()));
    let (code, out, err) = xpuctl(&[
        "tune",
        &m,
        "--policy",
        &p,
        "-i",
        &xs,
        "--runs",
        "3",
        "--warmup",
        "1",
        "--in-process",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("only cpu") && out.contains("only llvm") && out.contains("(locked)"),
        "{out}"
    );
    // Every kernel is measured, those of one engine too; the locked plan node by node.
    assert!(out.contains("only cpu.gemm") && out.contains("only cpu.naive"), "{out}");
    assert!(out.contains("locked plan: n1 "), "{out}");
    // Where the riscv64 device runs under qemu, its times would be the emulator's.
    let (_, engines, _) = xpuctl(&["engines"]);
    assert_eq!(
        err.contains("llvm.riscv is not measured: its riscv64 device is emulated"),
        engines.contains("(qemu-riscv64"),
        "{err}\n{engines}"
    );
    let lock_path = d.join("p.lock.toml");
    let text = std::fs::read_to_string(&lock_path).unwrap();
    let lock = xpu_policy::LockFile::parse("p.lock.toml", &text).unwrap();
    assert_eq!(lock.nodes.len(), 6, "{text}");
    assert!(lock.plans.iter().any(|p| p.name.ends_with("(locked)")));
    // A product's entry has every measured candidate: winner, runner-up and the rest.
    let matmul = lock.nodes.iter().find(|n| n.op == "matmul").unwrap();
    let kernels: Vec<&str> = matmul.figures().map(|f| f.kernel.as_str()).collect();
    for k in ["cpu.blas", "cpu.gemm", "llvm.gemm"] {
        assert!(kernels.contains(&k), "{kernels:?}");
    }
    assert!(!kernels.contains(&"llvm.riscv"), "{kernels:?}");
    // A directory of policies holds their locks too: scans take the policies only.
    let (code, out, err) = xpuctl(&["policy", "check", &d.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("p.toml: ok") && !out.contains("p.lock.toml"), "{out}");
    // A policy that chooses by measurement reads it.
    std::fs::write(
        &policy,
        "[policy]\nname = \"cpu-first\"\n[engines]\norder = [\"cpu\", \"llvm\"]\nchoose = \"measured\"\n[measured]\nlock = \"p.lock.toml\"\nmin_samples = 1\n",
    )
    .unwrap();
    let (code, out, err) = xpuctl(&["evidence", &m, "--policy", &p, "--bind", "N=8"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("evidence: lock p.lock.toml ("), "{out}");
    assert!(out.contains("measured: ") && out.contains("candidates: "), "{out}");
    // Kernels of one engine are candidates too (what measured choice compares).
    let matmul = out.lines().find(|l| l.contains("candidates: ") && l.contains("gemm")).unwrap();
    assert!(matmul.contains("cpu.gemm") && matmul.contains("cpu.naive"), "{out}");
    let (code, out, err) =
        xpuctl(&["policy", "resolve", "--policy", &p, &m, "--bind", "N=8", "--format", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["evidence"]["lock"], "p.lock.toml", "{out}");
    let rules: Vec<&str> =
        v["nodes"].as_array().unwrap().iter().filter_map(|d| d["rule"].as_str()).collect();
    assert!(rules.iter().filter(|r| r.starts_with("measured: ")).count() >= 4, "{rules:?}");
    // Another machine's inventory: the lock is not used, and check says why.
    let (code, out, _) =
        xpuctl(&["policy", "check", &p, "--inventory", "policies/inventories/cpu-x86.toml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warning[P0108]") && out.contains("its choices are not used"), "{out}");
    // A broken lock: the policy still loads, with a located warning, and plans statically.
    // (A cut alone can land between two tables and still be TOML: end on a broken line.)
    std::fs::write(&lock_path, format!("{}\n[[broken\n", &text[..text.len() / 3])).unwrap();
    let (code, out, err) = xpuctl(&["policy", "resolve", "--policy", &p, &m, "--bind", "N=8"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("warning[P0015]") || out.contains("not used"), "{out}{err}");
    assert!(!out.contains("measured: "), "{out}");
    // Bad arguments.
    let (code, _, err) = xpuctl(&["tune", &m, "--policy", &p, "--runs", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("--runs"), "{err}");
    let (code, _, err) = xpuctl(&["tune", &m, "--policy", &p, "--min-gain", "100"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a percentage"), "{err}");
}
