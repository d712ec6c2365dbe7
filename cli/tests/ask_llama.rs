//! `xpuctl ask` against llama.cpp's real `llama-server` (built by `make setup`,
//! tools/fetch_llama.py) serving a tiny model with random weights and a byte-level
//! vocabulary that this test writes (tools/tiny_gguf.py). The model writes nonsense, but
//! under MiniLang's grammar every reply it finishes parses: the server takes the grammar,
//! the attempts are recorded, the diagnostics go back, and the limits end the loop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The server process, killed when the test ends (also on a failed assertion).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(model: &Path) -> (Server, String) {
    let dir = std::env::var_os("XPU_LLAMA_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/xpu-llama")
    });
    let bin = dir.join("bin/llama-server");
    assert!(
        bin.exists(),
        "{} is missing: `make setup` builds it (tools/fetch_llama.py)",
        bin.display()
    );
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(bin)
        .args(["-m", model.to_str().unwrap(), "--host", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "-c",
            "65536",
            "--parallel",
            "1",
            "--threads",
            "1",
            "--no-ui",
            "--offline",
            "--alias",
            "tiny",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    let health = format!("http://127.0.0.1:{port}/health");
    let start = Instant::now();
    loop {
        if let Ok(r) = ureq::get(&health).call()
            && r.status() == 200
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "llama-server did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, format!("http://127.0.0.1:{port}/v1"))
}

#[test]
fn llama_server_takes_the_grammar_and_every_finished_reply_parses() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    let python = root().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: `make setup` creates it", python.display());
    let made =
        Command::new(&python).arg(root().join("tools/tiny_gguf.py")).arg(&model).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    std::fs::write(dir.path().join("people.csv"), "Name,City,Age\nAnna,Oslo,34\nBo,Lund,19\n")
        .unwrap();
    // Sampled replies (temperature 1) of at most 200 tokens, four attempts.
    std::fs::write(
        dir.path().join("ask.toml"),
        "[assistant]\ntemperature = 1.0\nseed = 7\nmax_tokens = 200\nmax_attempts = 4\ntoken_budget = 100000\n",
    )
    .unwrap();
    let (_server, url) = start_server(&model);
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .current_dir(dir.path())
        .args([
            "ask",
            "How many people live in Oslo?",
            "--data",
            "people.csv",
            "--config",
            "ask.toml",
        ])
        .args(["--endpoint", &url, "--model", "tiny", "--format", "json"])
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    let attempts = v["attempts"].as_array().unwrap();
    assert!(!attempts.is_empty() && attempts.len() <= 4, "{v:#}");
    assert!(v["grammar_used"].as_bool().unwrap(), "the server took the grammar: {v:#}");
    let outcome = v["outcome"].as_str().unwrap();
    assert!(["accepted", "out_of_attempts"].contains(&outcome), "{v:#}");
    assert_eq!(out.status.code(), Some(if outcome == "accepted" { 0 } else { 1 }));
    let mut finished = 0;
    let mut programs = 0;
    for (i, a) in attempts.iter().enumerate() {
        assert!(a["grammar_sent"].as_bool().unwrap());
        assert!(a["prompt_tokens"].as_u64().unwrap() > 1000, "the prompt reached the model: {a:#}");
        let findings = a["verdict"]["findings"].as_array().unwrap();
        if a["finish_reason"] == "stop" {
            finished += 1;
            // Under the grammar a finished reply is MiniLang: nothing fails to parse (an
            // empty reply — the model may end at once — is the one "parse" finding allowed).
            let program = a["program"].as_str().unwrap();
            programs += usize::from(!program.trim().is_empty());
            assert!(
                findings.iter().all(|f| f["stage"] != "parse" || f["code"] == "empty"),
                "attempt {i} does not parse:\n{program}\n{a:#}"
            );
        } else {
            assert_eq!(a["finish_reason"], "length");
            assert_eq!(findings[0]["code"], "cut_off");
        }
        // Each later attempt answers the previous one's diagnostics.
        if i > 0 {
            let asked = a["asked"].as_str().unwrap();
            assert!(
                asked.starts_with("That program does not work yet") || asked.contains("cut off"),
                "{asked}"
            );
        }
    }
    // The seed makes the replies the same on every run: at least one is a finished,
    // non-empty program, so the grammar's effect was seen.
    assert!(programs >= 1, "no finished program to check: {v:#}");
    assert_eq!(v["tokens"].as_u64().unwrap(), attempts.iter().map(|a| a["prompt_tokens"].as_u64().unwrap() + a["completion_tokens"].as_u64().unwrap()).sum::<u64>());
    eprintln!(
        "tiny model: {} attempt(s), {finished} finished, outcome {outcome}, {:.1} s, {} tokens",
        attempts.len(),
        elapsed.as_secs_f64(),
        v["tokens"]
    );
    through_the_daemon(dir.path(), &url);
}

/// The same model asked by xpud (`--from-server`): every attempt is stored with its
/// figures, `explain` shows the conversation, `ask stats` counts the ask.
fn through_the_daemon(data: &Path, url: &str) {
    let xpud = PathBuf::from(env!("CARGO_BIN_EXE_xpuctl")).with_file_name("xpud");
    assert!(xpud.exists(), "{} is built with the workspace", xpud.display());
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let var = tempfile::tempdir().unwrap();
    let child = Command::new(xpud)
        .args(["--dev", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(var.path())
        .env("XPU_DATA_ROOTS", format!("[\"{}\"]", data.display()))
        .env("XPU_POLICY_DIRS", format!("[\"{}\"]", root().join("policies/examples").display()))
        .envs([
            ("XPU_ASSISTANT__ENDPOINT", url),
            ("XPU_ASSISTANT__MODEL", "tiny"),
            ("XPU_ASSISTANT__TEMPERATURE", "1.0"),
            ("XPU_ASSISTANT__SEED", "7"),
            ("XPU_ASSISTANT__MAX_TOKENS", "200"),
            ("XPU_ASSISTANT__MAX_ATTEMPTS", "3"),
            ("XPU_ASSISTANT__TOKEN_BUDGET", "100000"),
            ("XPU_LOG", "warn"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _daemon = Server(child);
    let server = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    while ureq::get(&format!("{server}/readyz")).call().is_err() {
        assert!(start.elapsed() < Duration::from_secs(60), "xpud did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let xpuctl = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
            .args(["--server", &server])
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let started = Instant::now();
    let (code, text) = xpuctl(&[
        "ask",
        "How many people live in Oslo?",
        "--from-server",
        "--data",
        "people.csv",
        "--format",
        "json",
    ]);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let status = v["status"].as_str().unwrap();
    assert!(["accepted", "out_of_attempts"].contains(&status), "{v:#}");
    assert_eq!(code, Some(if status == "accepted" { 0 } else { 1 }));
    assert!(v["grammar_used"].as_bool().unwrap(), "{v:#}");
    let attempts = v["attempts"].as_array().unwrap();
    assert!(!attempts.is_empty() && attempts.len() <= 3, "{v:#}");
    for a in attempts {
        let parse_failed = a["findings"].as_array().unwrap().iter().any(|f| {
            f["stage"] == "parse" && !["empty", "cut_off"].contains(&f["code"].as_str().unwrap())
        });
        assert!(!parse_failed, "under the grammar every finished reply parses: {a:#}");
    }
    // Stored: explain reads the conversation back; stats count it.
    let id = v["ask_id"].as_str().unwrap();
    let (code, explained) = xpuctl(&["explain", id]);
    assert_eq!(code, Some(0), "{explained}");
    assert!(explained.contains("asked:") && explained.contains("How many people"), "{explained}");
    let (_, stats) = xpuctl(&["ask", "stats", "--format", "json"]);
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats[0]["asks"], 1, "{stats}");
    eprintln!(
        "tiny model through xpud: {} attempt(s), status {status}, {:.1} s, {} tokens",
        attempts.len(),
        started.elapsed().as_secs_f64(),
        v["tokens"]
    );
}
