//! The OpenAPI document is true to the server: schemathesis (pinned in requirements.txt,
//! installed in the venv by `make setup`) generates requests from `/openapi.json` against a
//! real xpud and checks that no answer is a 5xx, that every status is documented for its
//! operation and that every body matches its schema.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn schemathesis_finds_no_failure() {
    let st = repo().join(".venv/bin/st");
    assert!(
        st.exists(),
        "{} is missing: run `make setup` (requirements.txt pins schemathesis)",
        st.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let _d = Daemon(
        Command::new(env!("CARGO_BIN_EXE_xpud"))
            .args(["--dev", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(dir.path().join("var"))
            .env("XPU_POLICY_DIRS", format!("[\"{}\"]", repo().join("policies/examples").display()))
            .env("XPU_DATA_ROOTS", format!("[\"{}\"]", repo().join("examples").display()))
            .env("XPU_MODEL_ROOTS", format!("[\"{}\"]", repo().join("examples").display()))
            // Asks reach a port nothing listens on: each ends at once, endpoint_failed.
            .env("XPU_ASSISTANT__ENDPOINT", "http://127.0.0.1:9/v1")
            .env("XPU_ASSISTANT__MODEL", "none")
            .env("XPU_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let until = Instant::now() + Duration::from_secs(60);
    while ureq::get(format!("{url}/readyz")).call().is_err() {
        assert!(Instant::now() < until, "xpud did not become ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = Command::new(&st)
        .args(["run", &format!("{url}/openapi.json")])
        .args([
            "--checks",
            "not_a_server_error,response_schema_conformance,status_code_conformance",
        ])
        // Bounded and repeatable: a fixed seed, deterministic generation, few examples per
        // operation (the whole run takes well under a minute here).
        .args(["--max-examples", "25", "--seed", "20261123", "--generation-deterministic"])
        .args(["--workers", "1", "--request-timeout", "60"])
        .env("SCHEMATHESIS_HOOKS", "")
        .env("NO_COLOR", "1")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis found failures:\n{report}");
    println!("{report}");
}
