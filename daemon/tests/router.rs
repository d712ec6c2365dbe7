//! The API without a socket (tower `oneshot` on the router): jobs submitted, waited for,
//! listed, explained, searched; auth (401/403, tenants); the error format for every kind of
//! bad request; the committed OpenAPI document is the served one.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use xpud::{App, Config};

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

struct Server {
    app: Arc<App>,
    _dir: tempfile::TempDir,
}

const ADMIN: &str = "admin-token";
const ACME: &str = "acme-token";
const GLOBEX_READ: &str = "globex-read-token";

fn server(dev: bool, tweak: impl FnOnce(&mut Config)) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"admin\"\nsha256 = \"{}\"\nscopes = [\"admin\"]\n\n\
             [[token]]\nname = \"acme-ci\"\nsha256 = \"{}\"\nscopes = [\"submit\", \"read\"]\ntenant = \"acme\"\n\n\
             [[token]]\nname = \"globex-viewer\"\nsha256 = \"{}\"\nscopes = [\"read\"]\ntenant = \"globex\"\n",
            xpud::auth::digest(ADMIN),
            xpud::auth::digest(ACME),
            xpud::auth::digest(GLOBEX_READ)
        ),
    )
    .unwrap();
    let mut config = Config {
        data_dir: dir.path().join("var"),
        dev,
        policy_dirs: vec![repo().join("policies/examples")],
        data_roots: vec![repo().join("examples")],
        model_roots: vec![repo().join("examples")],
        ..Config::default()
    };
    config.auth.tokens_file = Some(tokens);
    config.limits.workers = 2;
    config.limits.max_body_bytes = 64 * 1024;
    tweak(&mut config);
    Server { app: App::start(config).unwrap(), _dir: dir }
}

impl Server {
    async fn call(&self, req: Request<Body>) -> (StatusCode, Value, axum::http::HeaderMap) {
        let r = xpud::api::router(self.app.clone()).oneshot(req).await.unwrap();
        let status = r.status();
        let headers = r.headers().clone();
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, body, headers)
    }

    async fn send(
        &self,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = match body {
            Some(v) => b
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(v.to_string()))
                .unwrap(),
            None => b.body(Body::empty()).unwrap(),
        };
        let (s, v, _) = self.call(req).await;
        (s, v)
    }
}

fn job(source: &str, wait: bool) -> Value {
    json!({"program": {"name": "job.ml", "source": source}, "wait": wait,
           "labels": {"team": "vision"}})
}

/// Every error body has the one format.
fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    // `details` is an object when there is context, absent otherwise (never null).
    assert!(body.get("details").is_none_or(Value::is_object), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_are_stored_and_explained() {
    let s = server(false, |_| {});
    let (status, run) = s
        .send(
            "POST",
            "/v1/jobs",
            Some(ACME),
            Some(job("let x = [1.0, 2.0, 3.0]\nprint sum(x * 2.0)\n", true)),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    assert!(run["seq"].as_u64().unwrap() >= 1);
    let id = run["run_id"].as_str().unwrap().to_string();
    let out = &run["outputs"][0];
    let url = format!("{}?format=json", out["url"].as_str().unwrap());
    let (status, data) = s.send("GET", &url, Some(ACME), None).await;
    assert_eq!(status, StatusCode::OK, "{data}");
    assert_eq!(data["data"][0], 12.0, "{data}");

    // Complete means explainable, at once.
    let (status, ex) = s.send("GET", &format!("/v1/runs/{id}/explain"), Some(ACME), None).await;
    assert_eq!(status, StatusCode::OK, "{ex}");
    assert!(ex["decisions"].as_array().unwrap().iter().any(|d| d["chosen"]["engine"] == "cpu"));
    let (status, text) =
        s.send("GET", &format!("/v1/runs/{id}/explain?format=text"), Some(ACME), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.as_str().unwrap().contains("policy default"), "{text}");

    // Tenants: another tenant sees nothing; admin sees all.
    let (status, body) = s.send("GET", &format!("/v1/runs/{id}"), Some(GLOBEX_READ), None).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, _) = s.send("GET", &format!("/v1/runs/{id}"), Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::OK);
    // Scopes: a read-only token cannot submit.
    let (status, body) =
        s.send("POST", "/v1/jobs", Some(GLOBEX_READ), Some(job("print 1\n", false))).await;
    assert_error(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let (status, body) = s.send("GET", "/v1/runs", None, None).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
    let (status, body) = s.send("GET", "/v1/runs", Some("nope"), None).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");

    // A table job on DuckDB, then list, filter, search.
    let (status, run2) = s
        .send(
            "POST",
            "/v1/jobs",
            Some(ACME),
            Some(job("let t = load_csv(\"titanic.csv\")\nprint stats(t, [\"mean\"])\n", true)),
        )
        .await;
    assert_eq!((status, run2["status"].as_str()), (StatusCode::OK, Some("succeeded")), "{run2}");
    let (status, list) = s.send("GET", "/v1/runs?limit=1", Some(ACME), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["runs"][0]["run_id"], run2["run_id"]);
    let cursor = list["next_cursor"].as_str().unwrap().to_string();
    let (_, older) =
        s.send("GET", &format!("/v1/runs?limit=1&cursor={cursor}"), Some(ACME), None).await;
    assert_eq!(older["runs"][0]["run_id"], id.as_str());
    let (_, labelled) = s.send("GET", "/v1/runs?label=team=vision", Some(ACME), None).await;
    assert_eq!(labelled["runs"].as_array().unwrap().len(), 2);
    // The index follows within a second.
    let mut found = Value::Null;
    for _ in 0..40 {
        let (_, hits) = s.send("GET", "/v1/search?q=engine:table", Some(ACME), None).await;
        if hits.as_array().is_some_and(|h| !h.is_empty()) {
            found = hits;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(found[0]["run_id"], run2["run_id"], "{found}");
    let (_, none) = s.send("GET", "/v1/search?q=engine:table", Some(GLOBEX_READ), None).await;
    assert_eq!(none, json!([]));

    // Replay repeats the run; verify compares the outputs' bytes.
    let (status, rep) = s
        .send("POST", &format!("/v1/runs/{id}/replay"), Some(ACME), Some(json!({"verify": true})))
        .await;
    assert_eq!(status, StatusCode::OK, "{rep}");
    assert_eq!(rep["verified"], true, "{rep}");
    assert_eq!(rep["replay_of"], id.as_str());

    // SQL is for admins, and reads only.
    let (status, body) =
        s.send("POST", "/v1/sql", Some(ACME), Some(json!({"query": "SELECT 1"}))).await;
    assert_error(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let (status, rows) = s
        .send(
            "POST",
            "/v1/sql",
            Some(ADMIN),
            Some(json!({"query": "SELECT count(*) AS n FROM runs"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{rows}");
    assert_eq!(rows["rows"][0][0], 3);
    let (status, body) =
        s.send("POST", "/v1/sql", Some(ADMIN), Some(json!({"query": "DELETE FROM runs"}))).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_sql");

    // Metrics count what happened.
    let (status, m) = s.send("GET", "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let m = m.as_str().unwrap();
    assert!(m.contains("xpu_jobs_total{policy=\"default\",status=\"succeeded\"} 3"), "{m}");
    assert!(m.contains("xpu_nodes_total{engine=\"table\""), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_error_format() {
    let s = server(true, |_| {});
    let raw = |body: &str, ctype: &str| {
        Request::builder()
            .method("POST")
            .uri("/v1/jobs")
            .header(header::CONTENT_TYPE, ctype)
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (st, b, _) = s.call(raw("{not json", "application/json")).await;
    assert_error(st, &b, StatusCode::BAD_REQUEST, "malformed_json");
    let (st, b, _) = s.call(raw("{\"program\": 3}", "application/json")).await;
    assert_error(st, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_json");
    let (st, b, _) = s.call(raw("{}", "text/plain")).await;
    assert_error(st, &b, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type");
    let big =
        format!("{{\"program\": {{\"name\": \"a.ml\", \"source\": \"{}\"}}}}", "x".repeat(100_000));
    let (st, b, _) = s.call(raw(&big, "application/json")).await;
    assert_error(st, &b, StatusCode::PAYLOAD_TOO_LARGE, "too_large");
    let (st, b) = s.send("GET", "/v1/nowhere", None, None).await;
    assert_error(st, &b, StatusCode::NOT_FOUND, "not_found");
    let (st, b) = s.send("DELETE", "/v1/jobs", None, None).await;
    assert_error(st, &b, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");

    // Programs that do not compile: 422 with the located diagnostics.
    let (st, b) = s.send("POST", "/v1/jobs", None, Some(job("let x = \nprint y\n", true))).await;
    assert_error(st, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_program");
    assert!(b["details"]["diagnostics"].as_str().unwrap().contains("job.ml:"), "{b}");
    // Paths outside the data roots.
    let (st, b) = s
        .send("POST", "/v1/jobs", None, Some(job("print load_csv(\"../Cargo.toml\")\n", true)))
        .await;
    assert_error(st, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_program");
    let (st, b) =
        s.send("POST", "/v1/jobs", None, Some(json!({"program": {"path": "../Cargo.toml"}}))).await;
    assert_error(st, &b, StatusCode::FORBIDDEN, "path_outside_roots");
    // Unknown policy, bad inline policy, both.
    let mut j = job("print 1\n", true);
    j["policy"] = json!("no-such-policy");
    let (st, b) = s.send("POST", "/v1/jobs", None, Some(j)).await;
    assert_error(st, &b, StatusCode::NOT_FOUND, "not_found");
    assert!(b["message"].as_str().unwrap().contains("cpu-only"), "lists the known ones: {b}");
    let mut j = job("print 1\n", true);
    j["policy_toml"] = json!("[policy]\nname = \"x\"\n[engines]\norder = 3\n");
    let (st, b) = s.send("POST", "/v1/jobs", None, Some(j)).await;
    assert_error(st, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_policy");
    // An inline policy's `extends` stays in the policy directories: a TOML file elsewhere
    // (here the repository's own Cargo.toml, absolute and by `..`) is not read.
    let outside = repo().join("Cargo.toml");
    for extends in [outside.display().to_string(), "../../Cargo.toml".to_string()] {
        let mut j = job("print 1\n", true);
        j["policy_toml"] = json!(format!("[policy]\nname = \"x\"\nextends = {extends:?}\n"));
        let (st, b) = s.send("POST", "/v1/jobs", None, Some(j)).await;
        assert_error(st, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_policy");
        let diagnostics = b["details"]["diagnostics"].as_str().unwrap();
        assert!(diagnostics.contains("no such policy"), "{b}");
        assert!(!b.to_string().contains("workspace"), "the file was read: {b}");
    }
    // A literal input whose shape overflows is refused, not wrapped around.
    let mut j = job("let x = input(\"x\")\nprint x\n", true);
    j["inputs"] = json!({"x": {"shape": [4294967296u64, 4294967296u64, 0], "data": []}});
    let (st, b) = s.send("POST", "/v1/jobs", None, Some(j)).await;
    assert_error(st, &b, StatusCode::BAD_REQUEST, "invalid_input");
    assert!(b["message"].as_str().unwrap().contains("more values than"), "{b}");
    // Inputs: one form each; a table's CSV is read with a located error.
    let table_job = |input: Value| {
        let mut j = job("let t = input(\"t\", dtype=\"table\")\nprint t\n", true);
        j["inputs"] = json!({ "t": input });
        j
    };
    let b64 = |s: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let both = json!({"csv_base64": b64("a\n1\n"), "npy_base64": b64("x")});
    let (st, b) = s.send("POST", "/v1/jobs", None, Some(table_job(both))).await;
    assert_error(st, &b, StatusCode::BAD_REQUEST, "invalid_input");
    assert!(b["message"].as_str().unwrap().contains("give one of"), "{b}");
    let ragged = json!({"csv_base64": b64("a,b\n1,2\n3\n")});
    let (st, b) = s.send("POST", "/v1/jobs", None, Some(table_job(ragged))).await;
    assert_error(st, &b, StatusCode::BAD_REQUEST, "invalid_input");
    assert!(
        b["message"].as_str().unwrap().contains("inputs.t")
            && b["message"].as_str().unwrap().contains("line: 3"),
        "{b}"
    );
    let mut good = table_job(json!({"csv_base64": b64("a,b\n1,x\n")}));
    good["wait"] = json!(true);
    let (st, b) = s.send("POST", "/v1/jobs", None, Some(good)).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["status"], "succeeded", "{b}");
    // Unknown fields are refused rather than ignored.
    let (st, b) = s
        .send(
            "POST",
            "/v1/jobs",
            None,
            Some(json!({"program": {"name": "a.ml", "source": "print 1"}, "wiat": true})),
        )
        .await;
    assert_error(st, &b, StatusCode::UNPROCESSABLE_ENTITY, "invalid_json");
    // Garbage in every field the server parses: never a 5xx.
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for i in 0..200 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let pieces = [
            "{",
            "}",
            "\"program\"",
            ":",
            "\"name\"",
            "\"a.ml\"",
            ",",
            "\"source\"",
            "[",
            "]",
            "null",
            "\"wait\"",
            "true",
            "\"inputs\"",
            "\"x\"",
            "{\"data\": [1]}",
            "\"\\u0000\"",
        ];
        let body: String = (0..(seed % 24) as usize)
            .map(|k| pieces[((seed >> (k % 60)) as usize + k + i) % pieces.len()])
            .collect();
        let (st, b, _) = s.call(raw(&body, "application/json")).await;
        assert!(st.is_client_error() || st.is_success(), "{body} -> {st} {b}");
        if st.is_client_error() {
            assert!(b["code"].is_string(), "{body} -> {b}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_with_retry_after() {
    let s = server(true, |c| {
        c.limits.queue_capacity = 2;
        c.limits.workers = 1;
    });
    // A job slow enough to keep the worker busy while the queue fills: seven 700³ products
    // (a few hundred milliseconds on two cores; with 300³ the worker sometimes kept up
    // with the submissions when other tests shared the cores).
    let slow =
        "let x = randn([700, 700], seed=1)\nlet y = x @ x @ x @ x @ x @ x @ x @ x\nprint sum(y)\n";
    let mut statuses = Vec::new();
    let mut retry = None;
    for _ in 0..12 {
        let req = Request::builder()
            .method("POST")
            .uri("/v1/jobs")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(job(slow, false).to_string()))
            .unwrap();
        let (st, b, h) = s.call(req).await;
        if st == StatusCode::TOO_MANY_REQUESTS {
            assert_error(st, &b, StatusCode::TOO_MANY_REQUESTS, "queue_full");
            retry = h.get(header::RETRY_AFTER).cloned();
        }
        statuses.push(st);
    }
    assert!(
        statuses.iter().all(|s| *s == StatusCode::ACCEPTED || *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    assert!(statuses.contains(&StatusCode::TOO_MANY_REQUESTS), "{statuses:?}");
    assert_eq!(retry.unwrap(), "1");
}

#[test]
fn committed_openapi_is_current() {
    let served = xpud::api::openapi_json();
    let path = repo().join("schemas/openapi.json");
    if std::env::var_os("XPU_BLESS").is_some() {
        std::fs::write(&path, format!("{served}\n")).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        committed.trim_end(),
        served.trim_end(),
        "schemas/openapi.json is stale: XPU_BLESS=1 cargo test --test router"
    );
    let doc: Value = serde_json::from_str(&served).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
    for path in [
        "/v1/jobs",
        "/v1/runs",
        "/v1/runs/{id}/explain",
        "/v1/search",
        "/v1/sql",
        "/metrics",
        "/v1/asks",
        "/v1/asks/{id}",
        "/v1/asks/{id}/accept",
        "/v1/asks/stats",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} is documented");
    }
}

#[test]
fn dev_mode_is_refused_off_loopback() {
    let flags =
        xpud::config::Flags { listen: Some("0.0.0.0:8080".into()), data_dir: None, dev: true };
    let err = Config::load(None, &flags).unwrap_err().to_string();
    assert!(err.contains("loopback"), "{err}");
    let flags =
        xpud::config::Flags { listen: Some("127.0.0.1:0".into()), data_dir: None, dev: true };
    assert!(Config::load(None, &flags).is_ok());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("xpud.toml");
    std::fs::write(&file, "listn = \"127.0.0.1:1\"\n").unwrap();
    let err = Config::load(Some(&file), &xpud::config::Flags::default()).unwrap_err().to_string();
    assert!(err.contains("listn"), "a typo is named: {err}");
    std::fs::write(&file, "[isolation]\nprocesses_per_engine = 1000000000\n").unwrap();
    let err = Config::load(Some(&file), &xpud::config::Flags::default()).unwrap_err().to_string();
    assert!(err.contains("isolation.processes_per_engine = 1000000000: at most 256"), "{err}");
    std::fs::write(&file, "[isolation]\nspin_us = 1000000\n").unwrap();
    let err = Config::load(Some(&file), &xpud::config::Flags::default()).unwrap_err().to_string();
    assert!(err.contains("isolation.spin_us = 1000000: at most 10000"), "{err}");
    std::fs::write(&file, "[isolation]\nspin_us = 0\n").unwrap();
    let config = Config::load(Some(&file), &xpud::config::Flags::default()).unwrap();
    assert_eq!(config.isolation.spin_us, 0, "0 turns the spin off");
    std::fs::write(&file, "[engines.llvm]\nhost_cpu = \"x86-64-v9\"\n").unwrap();
    let err = Config::load(Some(&file), &xpud::config::Flags::default()).unwrap_err().to_string();
    assert!(err.contains("host_cpu") && err.contains("x86-64-v9"), "{err}");
    std::fs::write(&file, "[engines.llvm]\nhost_cpu = \"x86-64-v3\"\n").unwrap();
    let config = Config::load(Some(&file), &xpud::config::Flags::default()).unwrap();
    let libraries = config.engines.libraries(std::path::Path::new("var"));
    assert_eq!(libraries.llvm_host_cpu, Some(xpu_engine::HostCpu::X86_64V3));
}

fn promtool(args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed by `make setup` (Debian package prometheus)");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_alert_rules_pass_promtool() {
    let s = server(true, |_| {});
    let (status, _) = s.send("POST", "/v1/jobs", None, Some(job("print 1 + 2\n", true))).await;
    assert_eq!(status, StatusCode::OK);
    let (_, m) = s.send("GET", "/metrics", None, None).await;
    let m = m.as_str().unwrap().to_string();
    for name in [
        "xpu_jobs_total",
        "xpu_job_duration_seconds",
        "xpu_job_queue_wait_seconds",
        "xpu_plan_cache_total",
        "xpu_engine_available",
        "xpu_store_write_seconds",
    ] {
        assert!(m.contains(name), "{name} missing:\n{m}");
    }
    let (ok, text) = promtool(&["check", "metrics"], &m);
    assert!(ok, "promtool check metrics:\n{text}");
    let rules = repo().join("deploy/prometheus/alerts.yml");
    let (ok, text) = promtool(&["check", "rules", rules.to_str().unwrap()], "");
    assert!(ok, "promtool check rules:\n{text}");
}

/// Prepare once, run many: the same job again reuses the executable its first run prepared;
/// the explanation and `xpu_prepare_total` say which; `limits.prepared_plans = 0` turns it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_job_reuses_its_prepared_executable() {
    let program = "let w = [[1.0, -2.0], [0.5, 1.0]]\nprint relu([[1.0, 2.0]] @ w)\n";
    for (kept, second) in [(256, "reused"), (0, "prepared")] {
        let s = server(true, |c| c.limits.prepared_plans = kept);
        let mut outcomes = Vec::new();
        for _ in 0..2 {
            let (status, run) = s.send("POST", "/v1/jobs", None, Some(job(program, true))).await;
            assert_eq!(status, StatusCode::OK, "{run}");
            let id = run["run_id"].as_str().unwrap();
            let (_, ex) = s.send("GET", &format!("/v1/runs/{id}/explain"), None, None).await;
            let prepared = ex["prepared"].as_array().unwrap_or_else(|| panic!("{ex}"));
            assert!(!prepared.is_empty(), "{ex}");
            assert!(prepared.iter().all(|p| p["prepare_nanos"].as_u64() > Some(0)), "{ex}");
            outcomes.push(prepared[0]["outcome"].as_str().unwrap().to_string());
        }
        assert_eq!(outcomes, ["prepared", second], "prepared_plans = {kept}");
        let (_, m) = s.send("GET", "/metrics", None, None).await;
        let m = m.as_str().unwrap();
        let line = format!("xpu_prepare_total{{engine=\"cpu\",outcome=\"{second}\"}}");
        assert!(m.contains(&line), "{line} missing:\n{m}");
        let kept_now = if kept > 0 { 1 } else { 0 };
        assert!(
            m.contains(&format!("xpu_prepared_cache{{what=\"executables\"}} {kept_now}")),
            "{m}"
        );
    }
}

/// A waited submit says where the server's time went: total, queue wait and execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waited_submits_carry_server_timing() {
    let s = server(false, |_| {});
    let submit = |body: Value| {
        Request::builder()
            .method("POST")
            .uri("/v1/jobs")
            .header(header::AUTHORIZATION, format!("Bearer {ACME}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (status, body, headers) =
        s.call(submit(job("let x = [1.0, 2.0]\nprint sum(x)\n", true))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let timing = headers.get("server-timing").expect("Server-Timing").to_str().unwrap();
    let dur = |name: &str| -> f64 {
        let part = timing.split(", ").find(|p| p.starts_with(&format!("{name};"))).unwrap();
        part.split("dur=").nth(1).unwrap().parse().unwrap()
    };
    let (total, queue, run) = (dur("total"), dur("queue"), dur("run"));
    assert!(total > 0.0 && run > 0.0 && queue >= 0.0, "{timing}");
    // The steps are each part of the request's time and together no more than it.
    let steps = ["prepare", "files", "queue", "plan", "run", "outputs", "store"];
    assert!(dur("prepare") > 0.0 && dur("store") > 0.0 && dur("plan") > 0.0, "{timing}");
    assert!(steps.iter().map(|s| dur(s)).sum::<f64>() <= total + 0.005, "{timing}");
    // An answer that is not a finished run has no timing to give.
    let (status, _, headers) = s.call(submit(job("print 1.0\n", false))).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert!(headers.get("server-timing").is_none());
}

impl Server {
    /// `xpu_job_threads_total` for each thread kind: http, request, worker.
    fn job_threads(&self) -> [u64; 3] {
        ["http", "request", "worker"]
            .map(|t| self.app.metrics.job_threads.with_label_values(&[t]).get())
    }
}

/// A waited job seen to run fast under its policy runs inline on the HTTP thread the next
/// time; a new program, another policy, a job not waited for or a slow kind does not, and
/// an inline run is stored and explained like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_fast_waited_jobs_run_on_the_http_thread() {
    // A debug build runs a tiny job in well under a second, and never in a microsecond.
    let s = server(true, |c| c.limits.inline_run_us = 1_000_000);
    let tiny = job("let x = [1.0, 2.0, 3.0]\nprint sum(x * 2.0)\n", true);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, run) = s.send("POST", "/v1/jobs", Some(ACME), Some(tiny.clone())).await;
        assert_eq!(status, StatusCode::OK, "{run}");
        assert_eq!(run["status"], "succeeded", "{run}");
        ids.push(run["run_id"].as_str().unwrap().to_string());
    }
    assert_eq!(s.job_threads(), [2, 1, 0], "the first compiles and runs off the HTTP thread");
    for id in &ids {
        let (status, ex) =
            s.send("GET", &format!("/v1/runs/{id}/explain?format=text"), Some(ACME), None).await;
        assert_eq!(status, StatusCode::OK, "{ex}");
    }
    let (_, list) = s.send("GET", "/v1/runs?limit=10", Some(ACME), None).await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 3, "{list}");

    // Another policy is another kind of run: its first goes off the HTTP thread.
    let mut other = tiny.clone();
    other["policy"] = json!("cpu-only");
    let (status, run) = s.send("POST", "/v1/jobs", Some(ACME), Some(other)).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(s.job_threads(), [2, 2, 0]);
    // Not waited for: queued for a worker.
    let (status, run) =
        s.send("POST", "/v1/jobs", Some(ACME), Some(job("print 1.0\n", false))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    let id = run["run_id"].as_str().unwrap().to_string();
    s.poll(&id, |r| r["status"] == "succeeded").await;
    assert_eq!(s.job_threads(), [2, 2, 1]);

    // No kind of run is that fast: nothing runs inline.
    let s = server(true, |c| c.limits.inline_run_us = 1);
    for _ in 0..3 {
        let (status, run) = s.send("POST", "/v1/jobs", Some(ACME), Some(tiny.clone())).await;
        assert_eq!(status, StatusCode::OK, "{run}");
    }
    assert_eq!(s.job_threads(), [0, 3, 0]);
}

/// A job of many slow nodes: what cancel and the timeout stop mid-run. `s` is an input so
/// that nothing is folded at compile time. `n` sizes its 400 matrix products: at 384 the job
/// took under a second on CI's machine, the fastest seen; the work grows as n³.
fn slow_source(n: usize) -> String {
    format!(
        "let s = input(\"s\")\nlet w = randn([{n}, {n}], seed=1) * 0.01\n\
         let mut x = randn([{n}, {n}], seed=2) + s\nfor i in 0..400 {{\n  x = tanh(x @ w)\n}}\n\
         print sum(x)\n"
    )
}

/// The size of a job that runs to its end in a few seconds (about 2.3 on CI's machine), long
/// enough to be seen running by a poll every 10 ms.
const SHORT_SLOW: usize = 512;
/// The size of a job that must still be running seconds after it starts (and is stopped).
const LONG_SLOW: usize = 1024;

fn slow_job(n: usize, wait: bool, policy_toml: Option<&str>) -> Value {
    let mut j = json!({"program": {"name": "slow.ml", "source": slow_source(n)}, "wait": wait,
        "inputs": {"s": {"dtype": "f64", "shape": [1], "data": [0.5]}}});
    if let Some(p) = policy_toml {
        j["policy_toml"] = json!(p);
    }
    j
}

impl Server {
    /// Polls a run until `done` says so (20 s at most).
    async fn poll(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let (status, run) = self.send("GET", &format!("/v1/runs/{id}"), None, None).await;
            assert_eq!(status, StatusCode::OK, "{run}");
            if done(&run) || std::time::Instant::now() > until {
                return run;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_job_between_nodes() {
    let s = server(true, |c| c.limits.workers = 1);
    let (status, run) =
        s.send("POST", "/v1/jobs", None, Some(slow_job(LONG_SLOW, false, None))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    let id = run["run_id"].as_str().unwrap().to_string();
    let running = s.poll(&id, |r| r["status"] != "queued").await;
    assert_eq!(running["status"], "running", "{running}");
    let (status, body) = s.send("POST", &format!("/v1/runs/{id}/cancel"), None, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let done = s.poll(&id, |r| r["status"] != "running").await;
    assert_eq!(done["status"], "cancelled", "{done}");
    // Stopped inside the plan (not run to its end and then discarded), with no outputs.
    let error = done["error"].as_str().unwrap();
    assert!(error.contains("cancelled in partition") && error.contains("before node"), "{error}");
    assert_eq!(done["outputs"], json!([]), "{done}");
    // A finished run cannot be cancelled again.
    let (status, body) = s.send("POST", &format!("/v1/runs/{id}/cancel"), None, None).await;
    assert_error(status, &body, StatusCode::CONFLICT, "finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_timeout_stops_a_run_mid_partition() {
    let s = server(true, |_| {});
    let policy = "[policy]\nname = \"hurried\"\nversion = 1\n\n[execution]\ntimeout = \"50ms\"\n";
    let (status, run) =
        s.send("POST", "/v1/jobs", None, Some(slow_job(LONG_SLOW, true, Some(policy)))).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "timed_out", "{run}");
    let error = run["error"].as_str().unwrap();
    assert!(
        error.contains("execution.timeout (50 ms)") && error.contains("before node"),
        "{error}"
    );
    // Stopped near its deadline, not at the end of the whole plan.
    assert!(run["run_us"].as_u64().unwrap() < 2_000_000, "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_limit_serializes_its_jobs_without_holding_workers() {
    // Two workers, one cpu job at a time: two slow jobs never overlap, and a cancel reaches
    // the one parked behind the other.
    let s = server(true, |c| {
        c.limits.workers = 2;
        c.limits.engine_concurrency = [("cpu".to_string(), 1)].into();
    });
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, run) =
            s.send("POST", "/v1/jobs", None, Some(slow_job(SHORT_SLOW, false, None))).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{run}");
        ids.push(run["run_id"].as_str().unwrap().to_string());
    }
    // The second and third wait for the cpu engine, holding no worker.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let waiting = loop {
        let (_, metrics) = s.send("GET", "/metrics", None, None).await;
        let line =
            metrics.as_str().unwrap().lines().find(|l| l.starts_with("xpu_engine_waiting_jobs "));
        let n: f64 = line.and_then(|l| l.split(' ').nth(1)?.parse().ok()).unwrap_or(-1.0);
        if n == 2.0 || std::time::Instant::now() > until {
            break n;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(waiting, 2.0);
    let first = s.poll(&ids[0], |r| r["status"] == "running").await;
    assert_eq!(first["status"], "running", "{first}");
    // Cancelled while parked, the third ends at once, never run.
    let (status, _) = s.send("POST", &format!("/v1/runs/{}/cancel", ids[2]), None, None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let third = s.poll(&ids[2], |r| r["status"] != "queued").await;
    assert_eq!(third["status"], "cancelled", "{third}");
    assert_eq!(third["error"], "cancelled while waiting for its engine", "{third}");
    assert_eq!(third["run_us"], 0, "{third}");
    let mut spans = Vec::new();
    for id in &ids[..2] {
        let r = s.poll(id, |r| r["status"] == "succeeded").await;
        assert_eq!(r["status"], "succeeded", "{r}");
        let finished = r["finished_us"].as_i64().unwrap();
        spans.push((finished - r["run_us"].as_i64().unwrap(), finished));
    }
    let (a, b) = (spans[0], spans[1]);
    assert!(a.1 <= b.0 || b.1 <= a.0, "the two cpu jobs overlapped: {a:?} {b:?}");
}

/// A waited job running in place still answers at the wait limit: 202, still running, and
/// it goes on to finish (here: is cancelled) after the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_at_its_limit_while_the_job_runs_on() {
    let s = server(true, |c| c.limits.wait_timeout_s = 1);
    let start = std::time::Instant::now();
    let (status, run) =
        s.send("POST", "/v1/jobs", None, Some(slow_job(LONG_SLOW, true, None))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    assert_eq!(run["status"], "running", "{run}");
    assert!(start.elapsed() < std::time::Duration::from_secs(3), "{:?}", start.elapsed());
    let id = run["run_id"].as_str().unwrap().to_string();
    let (status, _) = s.send("POST", &format!("/v1/runs/{id}/cancel"), None, None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let done = s.poll(&id, |r| r["status"] != "running").await;
    assert_eq!(done["status"], "cancelled", "{done}");
}

/// A store whose database is stuck (the writer held) makes list reads wait for it, up to
/// 30 s; those waits run off the async threads, so `/healthz` and `/metrics` answer at once
/// even with more stuck reads in flight than the runtime has worker threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_store_never_stalls_health_or_metrics() {
    let s = std::sync::Arc::new(server(true, |_| {}));
    let (status, body) = s.send("POST", "/v1/jobs", None, Some(job("print 1 + 1", true))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stall = s.app.jobs.store.stall_writer();
    // Journaled and acknowledged, not in the database: listing waits for it.
    let (status, body) = s.send("POST", "/v1/jobs", None, Some(job("print 2 + 2", true))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let lists: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.send("GET", "/v1/runs", None, None).await })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(lists.iter().all(|l| !l.is_finished()), "the lists wait for the stuck database");
    for uri in ["/healthz", "/metrics"] {
        let s2 = s.clone();
        let call = tokio::spawn(async move { s2.send("GET", uri, None, None).await });
        let (status, _) = tokio::time::timeout(std::time::Duration::from_secs(3), call)
            .await
            .unwrap_or_else(|_| panic!("{uri} stalled behind the store"))
            .unwrap();
        assert_eq!(status, StatusCode::OK, "{uri}");
    }
    drop(stall);
    for l in lists {
        let (status, body) =
            tokio::time::timeout(std::time::Duration::from_secs(20), l).await.unwrap().unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["runs"].as_array().map(Vec::len), Some(2), "{body}");
    }
}

/// Online tuning closes the loop: a run planned to explore times another allowed kernel,
/// the store files the time under the node's signature (`GET /v1/evidence`), and once the
/// evidence is read again a plan that does not explore chooses by it, naming the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_tuning_explores_stores_evidence_and_then_chooses_by_it() {
    let s = server(true, |c| {
        c.tuning.online = true;
        c.tuning.explore_share = 0.5; // runs 1, 3, … explore; 2, 4, … do not
        c.tuning.refresh_s = 1;
    });
    let policy = "[policy]\nname = \"tuned\"\n[engines]\norder = [\"cpu\"]\nchoose = \"measured\"\n\
                  [measured]\nmin_samples = 1\n";
    let program = "let a = input(\"a\")\nlet w = [[1.0, -2.0], [0.5, 1.0]]\nprint relu(a @ w)\n";
    let submit = |_: ()| {
        let mut j = job(program, true);
        j["inputs"] = json!({"a": {"dtype": "f64", "shape": [3, 2], "data": [1, 2, 3, 4, 5, 6]}});
        j["policy_toml"] = json!(policy);
        j
    };
    let matmul = |ex: &Value| -> Value {
        ex["decisions"].as_array().unwrap().iter().find(|d| d["op"] == "matmul").unwrap().clone()
    };
    let (status, run) = s.send("POST", "/v1/jobs", None, Some(submit(()))).await;
    assert_eq!((status, &run["status"]), (StatusCode::OK, &json!("succeeded")), "{run}");
    let id = run["run_id"].as_str().unwrap();
    let (_, ex) = s.send("GET", &format!("/v1/runs/{id}/explain"), None, None).await;
    let d = matmul(&ex);
    assert_eq!(d["measured"]["code"], "Exploring", "{d}");
    let explored = d["chosen"]["kernel"].as_str().unwrap().to_string();
    assert_ne!(explored, "cpu.blas", "the static choice is not what exploring runs");
    assert!(ex["evidence"]["sha256"].as_str().unwrap().ends_with("+explore"), "{ex}");
    let timing = ex["timings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kernel"] == explored.as_str())
        .unwrap_or_else(|| panic!("no timing of {explored}: {ex}"))
        .clone();
    let sig = timing["signature"].as_str().unwrap();
    let (status, ev) = s.send("GET", &format!("/v1/evidence?signatures={sig}"), None, None).await;
    assert_eq!(status, StatusCode::OK, "{ev}");
    let rows = ev["rows"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["kernel"] == explored.as_str() && r["samples"] == 1), "{ev}");
    // Bad signatures are a 400 naming them.
    let (status, body) = s.send("GET", "/v1/evidence?signatures=zz", None, None).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_query");
    let long = format!("/v1/evidence?signatures={}", vec!["0123456789abcdef"; 2_001].join(","));
    let (status, body) = s.send("GET", &long, None, None).await;
    assert!(
        status == StatusCode::BAD_REQUEST || status == StatusCode::URI_TOO_LONG,
        "{status} {body}"
    );
    // Run 2 does not explore: the static choice runs (and is timed) until compared.
    let run_matmul = |ex: &Value| matmul(ex)["chosen"]["kernel"].as_str().unwrap().to_string();
    let mut kernels = vec![explored.clone()];
    for _ in 0..3 {
        let (_, run) = s.send("POST", "/v1/jobs", None, Some(submit(()))).await;
        assert_eq!(run["status"], "succeeded", "{run}");
        let id = run["run_id"].as_str().unwrap();
        let (_, ex) = s.send("GET", &format!("/v1/runs/{id}/explain"), None, None).await;
        kernels.push(run_matmul(&ex));
        // The evidence is read again every refresh_s: two of them hold a read after this run.
        tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    }
    // Run 2 the static choice; run 3 explores the last candidate: every one measured.
    assert_eq!(kernels[1], "cpu.blas", "{kernels:?}");
    let (_, ev) = s.send("GET", &format!("/v1/evidence?signatures={sig}"), None, None).await;
    let rows = ev["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "every cpu kernel of the matmul measured: {ev}");
    let fastest = rows
        .iter()
        .min_by(|a, b| {
            a["median_us"].as_f64().unwrap().total_cmp(&b["median_us"].as_f64().unwrap())
        })
        .unwrap()["kernel"]
        .as_str()
        .unwrap()
        .to_string();
    // Run 5 (an exploring turn, with nothing left thin) chooses the fastest by the store's
    // evidence, and says so.
    let (_, run) = s.send("POST", "/v1/jobs", None, Some(submit(()))).await;
    let id = run["run_id"].as_str().unwrap();
    let (_, ex) = s.send("GET", &format!("/v1/runs/{id}/explain"), None, None).await;
    let d = matmul(&ex);
    assert_eq!(d["chosen"]["kernel"], fastest.as_str(), "{d}\n{ev}");
    assert!(d["measured"]["code"].is_null(), "{d}");
    let rule = d["rule"]["key"].as_str().unwrap();
    assert!(
        rule.starts_with(&format!("measured: {fastest}")) && rule.contains("store ("),
        "{rule}"
    );
    let (_, m) = s.send("GET", "/metrics", None, None).await;
    let m = m.as_str().unwrap();
    assert!(m.contains("xpu_tuning_explorations_total 2"), "{m}");
    assert!(!m.contains("xpu_tuning_evidence_signatures 0"), "{m}");
}

/// The store's evidence spans every tenant's runs: a tenant's token may not read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_is_for_tokens_that_see_every_tenant() {
    let s = server(false, |_| {});
    let (status, body) = s.send("GET", "/v1/evidence", Some(ACME), None).await;
    assert_error(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let (status, body) = s.send("GET", "/v1/evidence", Some(ADMIN), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["machine"].as_str().map(str::len), Some(16), "{body}");
    assert_eq!(body["rows"], json!([]), "{body}");
}

/// Polls an ask until it ends (or a minute passes).
async fn ask_ended(s: &Server, id: &str, token: &str) -> Value {
    for _ in 0..600 {
        let (status, body) = s.send("GET", &format!("/v1/asks/{id}"), Some(token), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["status"] != "running" {
            return body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("ask {id} did not end in a minute");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_are_judged_stored_run_searched_and_learned_from() {
    use xpu_assistant::stand_in::{StandIn, reply};
    let none = server(false, |_| {});
    let (status, body) =
        none.send("POST", "/v1/asks", Some(ACME), Some(json!({"question": "q"}))).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "assistant_not_configured");
    assert!(body["message"].as_str().unwrap().contains("[assistant]"), "{body}");

    let data = tempfile::tempdir().unwrap();
    std::fs::write(
        data.path().join("people.csv"),
        "Name,City,Age,Fare\nAnna,Oslo,34,71.5\nBo,Lund,19,8.0\nCleo,Oslo,52,30.25\nDag,Bergen,41,12.0\n",
    )
    .unwrap();
    let over_30 = "print load_csv(\"people.csv\") |> filter(Age > 30) |> select([\"Name\"])\n";
    let stand = StandIn::start(vec![
        reply("print load_csv(\"people.csv\") |> filter(Agee > 30)"),
        reply(over_30),
        reply("print load_csv(\"people.csv\") |> filter(Age > 40) |> select([\"Name\"])\n"),
        reply("load_csv(\"people.csv\") |> write_csv(\"copy.csv\")\n"),
    ]);
    let root = data.path().to_path_buf();
    let s = server(false, |c| {
        c.assistant.endpoint = Some(stand.url.clone());
        c.assistant.model = Some("tiny".into());
        c.data_roots = vec![root];
    });
    // Bad requests name the field.
    for (body, want, code) in [
        (json!({"question": " "}), StatusCode::BAD_REQUEST, "invalid_question"),
        (
            json!({"question": "q", "data": ["../etc/passwd"]}),
            StatusCode::BAD_REQUEST,
            "invalid_data",
        ),
        (json!({"question": "q", "data": ["nope.csv"]}), StatusCode::BAD_REQUEST, "invalid_data"),
        (
            json!({"question": "q", "max_attempts": 99}),
            StatusCode::BAD_REQUEST,
            "invalid_max_attempts",
        ),
        (json!({"question": "q", "policy": "nope"}), StatusCode::NOT_FOUND, "not_found"),
        (json!({"question": "q", "extra": 1}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_json"),
    ] {
        let (status, got) = s.send("POST", "/v1/asks", Some(ACME), Some(body.clone())).await;
        assert_error(status, &got, want, code);
    }
    assert_eq!(stand.requests().len(), 0, "nothing bad reached the model");

    // The first reply names a column that does not exist; the diagnostics go back and the
    // second passes the dry run on the sample, then runs as the caller's job.
    let ask = json!({"question": "people over 30", "data": ["people.csv"], "run": true});
    let (status, body) = s.send("POST", "/v1/asks", Some(ACME), Some(ask)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["ask_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("ask-") && body["status"] == "running", "{body}");
    let done = ask_ended(&s, &id, ACME).await;
    assert_eq!(done["status"], "accepted", "{done:#}");
    assert_eq!(done["program"], over_30);
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{done:#}");
    assert_eq!(attempts[0]["failed_at"], "check");
    assert_eq!(attempts[0]["findings"][0]["code"], "E0208");
    assert!(attempts[1]["dry_run"].as_str().unwrap().contains("Cleo"), "{done:#}");
    assert_eq!((done["model"].as_str(), done["tokens"].as_u64()), (Some("tiny"), Some(240)));
    let run = &done["run"];
    assert_eq!(run["status"], "succeeded", "{done:#}");
    let run_id = run["run_id"].as_str().unwrap();
    let (_, stored_run) = s.send("GET", &format!("/v1/runs/{run_id}"), Some(ACME), None).await;
    assert_eq!(stored_run["labels"]["ask"], id.as_str(), "{stored_run}");
    let system = stand.requests()[0].1["messages"][0]["content"].as_str().unwrap().to_string();
    assert!(system.contains("Name: string, City: string, Age: i64"), "{system}");
    // Another tenant sees nothing of it.
    let (status, _) = s.send("GET", &format!("/v1/asks/{id}"), Some(GLOBEX_READ), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Searchable; accepted (by the run it started), it is an example for a similar question.
    let (_, hits) = s.send("GET", "/v1/search?q=kind:ask%20over", Some(ACME), None).await;
    assert_eq!(
        (hits[0]["kind"].as_str(), hits[0]["run_id"].as_str()),
        (Some("ask"), Some(id.as_str()))
    );
    let (status, accepted) =
        s.send("POST", &format!("/v1/asks/{run_id}/accept"), Some(ACME), None).await;
    assert_eq!(status, StatusCode::OK, "{accepted}");
    assert_eq!(
        (accepted["ask_id"].as_str(), accepted["newly"].as_bool()),
        (Some(id.as_str()), Some(true))
    );
    let ask = json!({"question": "people over 40", "data": ["people.csv"]});
    let (_, body) = s.send("POST", "/v1/asks", Some(ACME), Some(ask)).await;
    let second = ask_ended(&s, body["ask_id"].as_str().unwrap(), ACME).await;
    assert_eq!(
        (second["status"].as_str(), second["examples"][0].as_str()),
        (Some("accepted"), Some(id.as_str()))
    );
    let system = stand.requests()[2].1["messages"][0]["content"].as_str().unwrap().to_string();
    assert!(system.contains("people over 30") && system.contains("filter(Age > 30)"), "{system}");
    assert!(second["run"].is_null(), "not asked to run: {second}");

    // A program that writes files is answered, not run, without allow_writes.
    let ask = json!({"question": "copy the table", "data": ["people.csv"], "run": true});
    let (_, body) = s.send("POST", "/v1/asks", Some(ACME), Some(ask)).await;
    let third = ask_ended(&s, body["ask_id"].as_str().unwrap(), ACME).await;
    assert_eq!(third["status"], "accepted", "{third:#}");
    let refused = third["run"]["refused"].as_str().unwrap();
    assert!(refused.contains("copy.csv") && refused.contains("allow_writes"), "{refused}");
    assert!(!data.path().join("copy.csv").exists(), "the dry run wrote only into its sample");
    let (status, _) =
        s.send("POST", &format!("/v1/asks/{}/accept", "ask-nope"), Some(ACME), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The loop's figures: three asks, two first replies passed, every ask answered.
    let (status, stats) = s.send("GET", "/v1/asks/stats", Some(ACME), None).await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    let row = &stats[0];
    assert_eq!((row["model"].as_str(), row["asks"].as_u64()), (Some("tiny"), Some(3)), "{stats}");
    assert!((row["first_check"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9, "{stats}");
    assert_eq!(row["answered"].as_f64(), Some(1.0));
    let metrics = s.send("GET", "/metrics", None, None).await.1;
    assert!(
        metrics.as_str().unwrap().contains("xpu_asks_total{outcome=\"accepted\"} 3"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_that_cannot_reach_the_model_are_refused_or_stored_as_failed() {
    use xpu_assistant::stand_in::{StandIn, reply};
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("broken.xlsx"), "not a workbook").unwrap();
    let stand = StandIn::start(vec![reply("print 1\n")]);
    let root = data.path().to_path_buf();
    let url = stand.url.clone();
    // A key variable that is not set fails every ask: refused at once, naming it.
    let s = server(false, |c| {
        c.assistant.endpoint = Some(url.clone());
        c.assistant.model = Some("tiny".into());
        c.assistant.api_key_env = Some("XPU_TEST_NO_SUCH_KEY_VARIABLE".into());
    });
    let (status, body) =
        s.send("POST", "/v1/asks", Some(ACME), Some(json!({"question": "q"}))).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "assistant_not_configured");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("API key") && !message.contains("XPU_TEST_NO_SUCH"), "{body}");
    // Data that cannot be read ends the ask before the model is asked: stored as failed.
    let s = server(false, |c| {
        c.assistant.endpoint = Some(url.clone());
        c.assistant.model = Some("tiny".into());
        c.data_roots = vec![root];
    });
    let ask = json!({"question": "q", "data": ["broken.xlsx"]});
    let (status, body) = s.send("POST", "/v1/asks", Some(ACME), Some(ask)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let done = ask_ended(&s, body["ask_id"].as_str().unwrap(), ACME).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    assert!(done["error"].as_str().unwrap().contains("broken.xlsx"), "{done:#}");
    assert_eq!(stand.requests().len(), 0);
    // While draining, no new ask starts.
    s.app.draining.store(true, std::sync::atomic::Ordering::Release);
    let (status, body) =
        s.send("POST", "/v1/asks", Some(ACME), Some(json!({"question": "q"}))).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "draining");
}
