//! The xpuctl contract: outputs, exit codes (0 ok, 1 program/run error, 2 usage) and clear
//! one-line errors naming the file for every kind of bad input.

use std::process::Command;

mod common;
use common::{repo, write_npy_f32};

fn xpuctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl")).args(args).output().expect("xpuctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn example() -> (String, String) {
    let r = repo();
    (
        r.join("examples/mlp.sgr").display().to_string(),
        format!("x={}", r.join("examples/mlp_input.npy").display()),
    )
}

#[test]
fn runs_the_example_and_writes_npy_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let (prog, input) = example();
    let out = dir.path().display().to_string();
    let (code, stdout, stderr) = xpuctl(&["run", &prog, "--input", &input, "--out", &out]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("probs: f32 [3, 4]") && stdout.contains("logits: f32 [3, 4]"),
        "{stdout}"
    );
    for name in ["probs", "logits"] {
        let bytes = std::fs::read(dir.path().join(format!("{name}.npy"))).unwrap();
        assert!(bytes.starts_with(b"\x93NUMPY"));
        assert_eq!(bytes.len() - (10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize), 12 * 4);
    }
    let (code, stdout, _) =
        xpuctl(&["run", &prog, "--input", &input, "--out", &out, "--format", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["outputs"][0]["name"], "probs");
    assert_eq!(v["outputs"][0]["shape"], serde_json::json!([3, 4]));
    assert_eq!(v["timings"].as_array().unwrap().len(), 10);
}

/// A MiniLang run's JSON lists every print in order: outputs by name, and the text of
/// values computed at compile time, which have no output.
#[test]
fn minilang_prints_are_listed_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("p.ml");
    std::fs::write(&prog, "print \"hello\"\nprint arange(3)\nprint len([1, 2])\n").unwrap();
    let out = dir.path().join("out").display().to_string();
    let (code, stdout, stderr) =
        xpuctl(&["run", &prog.display().to_string(), "--out", &out, "--format", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        v["prints"],
        serde_json::json!([{"text": "hello"}, {"output": "print_1"}, {"text": "2"}])
    );
    assert_eq!(v["outputs"][0]["name"], "print_1");
}

/// `--explain` shows the plan's memory (peak live, arena) beside what the cpu engine
/// measured running it (memory facts), and the measured peak stays within the arena.
#[test]
fn the_explanation_compares_planned_and_measured_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (prog, input) = example();
    let out = dir.path().display().to_string();
    let (code, stdout, stderr) =
        xpuctl(&["run", &prog, "--input", &input, "--out", &out, "--explain"]);
    assert_eq!(code, 0, "{stderr}");
    let number_after = |key: &str| -> u64 {
        let at = stdout.find(key).unwrap_or_else(|| panic!("no {key:?} in {stdout}"));
        let digits: String = stdout[at + key.len()..]
            .chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    let arena = number_after("arena ");
    let held = number_after("memory.peak_held_bytes = ");
    assert!(held > 0 && held <= arena + arena / 20, "held {held}, arena {arena}: {stdout}");
    assert!(
        stdout.contains("fact cpu: capture = recorded (first run for these input shapes)"),
        "{stdout}"
    );
}

#[test]
fn same_results_from_onnx_and_sgr_forms() {
    let dir = tempfile::tempdir().unwrap();
    let r = repo();
    let input = format!("x={}", r.join("examples/mlp_input.npy").display());
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    assert_eq!(
        xpuctl(&[
            "run",
            &r.join("examples/mlp.onnx").display().to_string(),
            "-i",
            &input,
            "--out",
            &a.display().to_string()
        ])
        .0,
        0
    );
    assert_eq!(
        xpuctl(&[
            "run",
            &r.join("examples/mlp.sgr").display().to_string(),
            "-i",
            &input,
            "--out",
            &b.display().to_string()
        ])
        .0,
        0
    );
    assert_eq!(
        std::fs::read(a.join("probs.npy")).unwrap(),
        std::fs::read(b.join("probs.npy")).unwrap()
    );
}

#[test]
fn output_names_with_slashes_and_string_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("p.sgr");
    std::fs::write(&prog, "graph \"g\" {\n  %0: f32[2] = input \"x\"\n  %1: f32[2] = neg(%0)\n  %2: string[2] = constant {value = tensor<string[2]> [\"ab\", \"cde\"]}\n  return \"layer/out:0\" = %1, \"names\" = %2\n}\n").unwrap();
    let x = dir.path().join("x.npy");
    write_npy_f32(&x, &[2], &[1.0, -2.0]);
    let out = dir.path().join("o");
    let (code, _, stderr) = xpuctl(&[
        "run",
        &prog.display().to_string(),
        "--input",
        &format!("x={}", x.display()),
        "--out",
        &out.display().to_string(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(out.join("layer_out:0.npy").exists());
    let names = std::fs::read(out.join("names.npy")).unwrap();
    let header = String::from_utf8_lossy(&names[10..]);
    assert!(header.contains("'descr': '<U3'"), "{header}");
}

#[test]
fn tensor_proto_inputs_take_their_name() {
    let case = repo().join(".cache/onnx-node/test_add");
    let dir = tempfile::tempdir().unwrap();
    let model = case.join("model.onnx").display().to_string();
    let (code, stdout, stderr) = xpuctl(&[
        "run",
        &model,
        "--input",
        &case.join("0/input_0.pb").display().to_string(),
        "--input",
        &case.join("0/input_1.pb").display().to_string(),
        "--out",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("sum: f32 [3, 4, 5]"), "{stdout}");
}

#[test]
fn table_inputs_are_csv_files_typed_by_their_columns() {
    let dir = tempfile::tempdir().unwrap();
    let people = dir.path().join("people.csv");
    std::fs::write(
        &people,
        "name,age,score,flag\nann,31,1.5,True\nbob,NA,2.5,False\ncid,45,,TRUE\n",
    )
    .unwrap();
    let program = |body: &str| {
        let p = dir.path().join("p.ml");
        std::fs::write(&p, format!("let t = input(\"people\", dtype=\"table\")\n{body}\n"))
            .unwrap();
        p.display().to_string()
    };
    let input = format!("people={}", people.display());
    let out = dir.path().join("out").display().to_string();
    let prog = program("print select(filter(t, age > 40 and flag), [\"name\", \"score\"])");
    let (code, stdout, stderr) = xpuctl(&["run", &prog, "--input", &input, "--out", &out]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("cid") && !stdout.contains("ann") && !stdout.contains("bob"),
        "{stdout}"
    );
    // `NA` and the empty cell are missing, as pandas reads them.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/print_0.csv")).unwrap(),
        "name,score\ncid,\n"
    );
    // Columns are checked at compile time against the file's header, with did-you-mean.
    let prog = program("print t.agee");
    let (code, _, stderr) = xpuctl(&["run", &prog, "--input", &input, "--out", &out]);
    assert_eq!(code, 1);
    assert!(stderr.contains("agee") && stderr.contains("age"), "{stderr}");
    // The README's example, as typed there.
    let example = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .current_dir(repo().join("examples"))
        .args([
            "run",
            "survival.ml",
            "--input",
            "passengers=titanic.csv",
            "--out",
            &dir.path().display().to_string(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&example.stdout);
    assert!(
        example.status.success() && stdout.contains("survived") && stdout.contains("female"),
        "{stdout}"
    );
    // A ragged file is refused naming the file and the line.
    std::fs::write(&people, "name,age\nann,31\nbob\n").unwrap();
    let prog = program("print t");
    let (code, _, stderr) = xpuctl(&["run", &prog, "--input", &input, "--out", &out]);
    assert_eq!(code, 1);
    assert!(stderr.contains("people.csv") && stderr.contains("line: 3"), "{stderr}");
}

/// Every MiniLang example shipped in examples/ compiles (`xpuctl check`): what a user
/// opens first must not fail.
#[test]
fn every_minilang_example_checks() {
    let dir = repo().join("examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "ml") {
            let (code, out, err) = xpuctl(&["check", &path.display().to_string()]);
            assert_eq!(code, 0, "{}: {out}{err}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 7, "{checked} examples");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(xpuctl(&[]).0, 2);
    assert_eq!(xpuctl(&["run"]).0, 2);
    assert_eq!(xpuctl(&["frobnicate"]).0, 2);
    let (prog, _) = example();
    let (code, _, err) = xpuctl(&["run", &prog, "--input", "examples/mlp_input.npy"]);
    assert_eq!(code, 2);
    assert!(err.contains("give NAME=PATH"), "{err}");
    let (code, _, err) = xpuctl(&["ir", "opt", &prog, "--passes", "frob"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown pass `frob`"), "{err}");
}

#[test]
fn run_errors_exit_1_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let (prog, _) = example();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let check = |args: &[&str], needle: &str| {
        let (code, _, err) = xpuctl(args);
        assert_eq!(code, 1, "args {args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "args {args:?}: {err:?} lacks {needle:?}"
        );
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    };
    check(&["run", &p("missing.onnx")], "cannot read");
    check(&["run", &p("missing.onnx")], "missing.onnx");
    std::fs::write(p("prog.txt"), "x").unwrap();
    check(&["run", &p("prog.txt")], "unknown program type `.txt`");
    std::fs::write(
        p("bad.sgr"),
        "graph \"g\" {\n  %0: f32[2] = input \"x\"\n  %1: f32[2] = relu(%7)\n}\n",
    )
    .unwrap();
    check(&["run", &p("bad.sgr")], "bad.sgr:3:21: %7 is used before it is defined");
    let onnx = std::fs::read(repo().join("examples/mlp.onnx")).unwrap();
    std::fs::write(p("trunc.onnx"), &onnx[..onnx.len() / 2]).unwrap();
    check(
        &["run", &p("trunc.onnx")],
        "trunc.onnx: cannot import the ONNX model: not a valid ONNX protobuf",
    );
    std::fs::write(p("bad.json"), "{\"name\": 1}").unwrap();
    check(&["check", &p("bad.json")], "bad.json:1:");
    check(
        &[
            "run",
            &prog,
            "--input",
            &format!("y={}", repo().join("examples/mlp_input.npy").display()),
        ],
        "has no input named \"y\" (its inputs: \"x\")",
    );
    check(&["run", &prog], "missing input(s): \"x\"");
    std::fs::write(
        p("trunc.npy"),
        &std::fs::read(repo().join("examples/mlp_input.npy")).unwrap()[..40],
    )
    .unwrap();
    check(
        &["run", &prog, "--input", &format!("x={}", p("trunc.npy"))],
        "trunc.npy: not a valid .npy file",
    );
    std::fs::write(p("garbage.pb"), b"\xff\xff\xff\xff garbage").unwrap();
    check(&["run", &prog, "--input", &p("garbage.pb")], "garbage.pb: not a valid ONNX TensorProto");
    write_npy_f32(std::path::Path::new(&p("wide.npy")), &[3, 8], &[0.0; 24]);
    check(
        &["run", &prog, "--input", &format!("x={}", p("wide.npy"))],
        "input \"x\": dim 1 must be 16",
    );
}

#[test]
fn ir_commands() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = repo().join("examples/mlp.onnx").display().to_string();
    let sgr = dir.path().join("m.sgr").display().to_string();
    assert_eq!(xpuctl(&["ir", "import", &onnx, "-o", &sgr]).0, 0);
    assert_eq!(
        std::fs::read_to_string(&sgr).unwrap(),
        std::fs::read_to_string(repo().join("examples/mlp.sgr")).unwrap()
    );
    let (code, out, _) = xpuctl(&["ir", "print", &sgr]);
    assert_eq!(code, 0);
    assert!(out.starts_with("graph \"mlp\" {"));
    let (code, out, _) = xpuctl(&["ir", "opt", &sgr, "--memory", "--bind", "N=8"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("@group(") && out.contains("peak ") && out.contains("bytes live"),
        "{out}"
    );
    let back = dir.path().join("m.onnx").display().to_string();
    assert_eq!(xpuctl(&["ir", "export", &sgr, "-o", &back]).0, 0);
    let (code, out, _) = xpuctl(&["check", &back]);
    assert_eq!(code, 0);
    assert!(out.contains("ok (1 inputs, 10 nodes, 2 outputs)"), "{out}");
    let (code, out, _) = xpuctl(&["engines", "--format", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["engines"][0]["engine"], "cpu");
    assert_eq!(v["engines"][0]["availability"]["status"], "available");
}
