//! The injection corpus (tests/injection/corpus.toml) submitted to a real xpud: every hostile
//! program is refused with its reason in the answer, or runs with its hostile text as data;
//! nothing appears in the data root, and the daemon stays healthy.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    kind: String,
    expect: String,
    #[serde(default)]
    error: String,
    body: String,
}

#[derive(serde::Deserialize)]
struct Corpus {
    case: Vec<Case>,
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn program(case: &Case) -> (String, String) {
    match case.kind.as_str() {
        "sgr" => (
            "job.sgr".into(),
            format!(
                "graph \"f\" {{\n  %0: table[] = read_csv {{path = \"people.csv\"}}\n  {}\n  return \"out\" = %1\n}}\n",
                case.body
            ),
        ),
        "json" => ("job.json".into(), case.body.clone()),
        "ml" => ("job.ml".into(), case.body.clone()),
        other => panic!("{}: unknown kind {other}", case.name),
    }
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path().strip_prefix(dir).unwrap().to_path_buf())
        .collect();
    out.sort();
    out
}

#[test]
fn hostile_programs_are_refused_or_harmless_through_xpud() {
    let text = std::fs::read_to_string(repo().join("tests/injection/corpus.toml")).unwrap();
    let cases = toml::from_str::<Corpus>(&text).unwrap().case;
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::copy(repo().join("tests/minilang/people.csv"), root.join("people.csv")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let _d = Daemon(
        Command::new(env!("CARGO_BIN_EXE_xpud"))
            .args(["--dev", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(scratch.path().join("var"))
            .env("XPU_POLICY_DIRS", format!("[\"{}\"]", repo().join("policies/examples").display()))
            .env("XPU_DATA_ROOTS", format!("[\"{}\"]", root.display()))
            .env("XPU_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into();
    let until = Instant::now() + Duration::from_secs(30);
    while agent.get(format!("{url}/readyz")).call().map(|r| r.status() != 200).unwrap_or(true) {
        assert!(Instant::now() < until, "xpud did not become ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut failures = Vec::new();
    for case in &cases {
        let (name, source) = program(case);
        let body = json!({"program": {"name": name, "source": source}, "wait": true});
        let mut r = agent.post(format!("{url}/v1/jobs")).send_json(&body).unwrap();
        let status = r.status().as_u16();
        let answer: Value = r.body_mut().read_json().unwrap_or(Value::Null);
        let shown = answer.to_string();
        let run_status = answer.get("status").and_then(Value::as_str).unwrap_or("");
        let verdict = match case.expect.as_str() {
            // Refused: a 4xx naming why, or a run that failed with the reason (a check the
            // engine makes against the file's real columns happens in the run).
            "refused" if (400..500).contains(&status) || run_status == "failed" => {
                (!shown.contains(&case.error.replace('"', "\\\"")) && !shown.contains(&case.error))
                    .then(|| format!("the answer lacks {:?}", case.error))
            }
            "refused" => Some(format!("HTTP {status}, run status {run_status:?}")),
            "runs" if status == 200 && run_status == "succeeded" => None,
            "runs" => Some(format!("HTTP {status}, run status {run_status:?}")),
            other => Some(format!("unknown expectation {other}")),
        };
        if status >= 500 {
            failures.push(format!("{}: a server error {status}", case.name));
        }
        if let Some(v) = verdict {
            failures.push(format!("{}: {v}\n  answer: {shown}", case.name));
        }
        let left = files_in(&root);
        if left != [PathBuf::from("people.csv")] {
            failures.push(format!("{}: files appeared in the data root: {left:?}", case.name));
        }
        if files_in(scratch.path()).iter().any(|p| p.to_string_lossy().contains("pwned")) {
            failures.push(format!("{}: a file appeared beside the data root", case.name));
        }
    }
    let health = agent.get(format!("{url}/healthz")).call().unwrap().status();
    assert_eq!(health, 200, "xpud stays healthy");
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
