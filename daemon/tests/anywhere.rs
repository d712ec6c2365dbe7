//! xpud started outside a source checkout: with no configuration it serves the example
//! policies built into the binary (written to `<data dir>/policies`), uses data and model
//! roots under its data dir, and says at start what it uses.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn built_in_policies_are_every_example_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/examples");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    files.sort();
    let built_in: Vec<&str> = xpud::policies::BUILTIN_EXAMPLES.iter().map(|(n, _)| *n).collect();
    assert_eq!(built_in, files, "policies/examples and the built-in list must agree");
}

#[test]
fn xpud_starts_in_an_empty_directory() {
    let cwd = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xpud"))
        .args(["--dev", "--listen", &format!("127.0.0.1:{port}"), "--data-dir", "state"])
        .current_dir(cwd.path())
        .env("XPU_LOG", "info")
        .env_remove("XPU_POLICY_DIRS")
        .env_remove("XPU_DATA_ROOTS")
        .env_remove("XPU_MODEL_ROOTS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    let until = Instant::now() + Duration::from_secs(60);
    for line in lines.by_ref() {
        let line = line.unwrap();
        let up = line.starts_with("xpud is up");
        said.push(line);
        if up || Instant::now() > until {
            break;
        }
    }
    let text = said.join("\n");
    let url = format!("http://127.0.0.1:{port}");
    let answer = ureq::get(format!("{url}/v1/policies"))
        .call()
        .map(|mut r| r.body_mut().read_to_string().unwrap());
    let _ = child.kill();
    let _ = child.wait();
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    assert!(text.contains("xpud is up"), "xpud did not start:\n{text}");
    // Its log is not a terminal here: plain text, no colour codes.
    assert!(log.contains("listening on") && !log.contains('\u{1b}'), "{log:?}");
    let state = cwd.path().join("state");
    assert!(
        text.contains(&format!("policies: {} (built-in default", state.join("policies").display()))
            || text.contains("policies: state/policies (built-in default"),
        "{text}"
    );
    assert!(text.contains("data roots: ") && text.contains("data (built-in default"), "{text}");
    assert!(text.contains("onnx runtime: ") && text.contains("openvino: "), "{text}");
    // The cpu engine's BLAS, as loaded: its release and the core it detected.
    assert!(text.contains("blas: OpenBLAS 0.") && text.contains(", core "), "{text}");
    for line in &said {
        assert_eq!(said.iter().filter(|l| *l == line).count(), 1, "said twice: {line}\n{text}");
    }
    assert!(state.join("policies/latency-gpu.toml").exists());
    assert!(state.join("data").is_dir() && state.join("models").is_dir());
    let policies = answer.expect("GET /v1/policies");
    for name in ["latency-gpu", "cpu-only", "ort-cpu"] {
        assert!(policies.contains(&format!("\"{name}\"")), "{name} is served: {policies}");
    }
}
