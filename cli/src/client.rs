//! xpuctl as a client of xpud: submit, status, list, cancel, explain, search, sql, replay,
//! policies, engines. The server comes from `--server` or `XPU_SERVER`, the token from
//! `XPU_TOKEN`. Human output is aligned tables; `--format json` prints the server's JSON.
//! `explain --store DIR` reads a store offline (no daemon).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine as _;
use comfy_table::{Table, presets::NOTHING};
use serde_json::{Value, json};

use crate::Format;

pub struct Client {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// A 429 answer: the server is busy; `retry_after` seconds (its `Retry-After`, else 5).
#[derive(Debug)]
pub struct Busy {
    pub retry_after: u64,
    message: String,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Busy {}

/// The server's address: `--server`, else `XPU_SERVER`.
pub fn server_url(flag: Option<&str>) -> Result<String> {
    let url = flag
        .map(str::to_string)
        .or_else(|| std::env::var("XPU_SERVER").ok())
        .ok_or_else(|| crate::usage("no server: pass --server URL or set XPU_SERVER"))?;
    Ok(url.trim_end_matches('/').to_string())
}

/// A request body this large that ends in a transport error was most likely refused for
/// its size (see [`Client::post`]).
const LARGE_BODY: usize = 1 << 20;

impl Client {
    pub fn new(base: String) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .into();
        Client { base, token: std::env::var("XPU_TOKEN").ok(), agent }
    }

    fn auth<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => r.header("Authorization", &format!("Bearer {t}")),
            None => r,
        }
    }

    fn handle(
        &self,
        what: &str,
        r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<(u16, Vec<u8>)> {
        let mut r =
            r.map_err(|e| anyhow!("{}: {e}", self.base)).with_context(|| what.to_string())?;
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = r
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_vec()
            .map_err(|e| anyhow!("{what}: reading the answer: {e}"))?;
        if status >= 400 {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let msg = v["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(500).collect());
            let mut text =
                format!("{what}: {status} {}: {msg}", v["code"].as_str().unwrap_or("error"));
            if let Some(d) = v["details"]["diagnostics"].as_str() {
                text.push('\n');
                text.push_str(d);
            }
            if status == 429 {
                return Err(Busy { retry_after: retry_after.unwrap_or(5), message: text }.into());
            }
            bail!(text);
        }
        Ok((status, body))
    }

    /// A GET whose answer is raw bytes (an output file).
    pub fn get_bytes(&self, path: &str) -> Result<Vec<u8>> {
        let r = self.auth(self.agent.get(&format!("{}{path}", self.base))).call();
        Ok(self.handle(&format!("GET {path}"), r)?.1)
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.get_query(path, &[])
    }

    /// GET with query parameters (ureq encodes them).
    pub fn get_query(&self, path: &str, query: &[(&str, String)]) -> Result<Value> {
        let mut req = self.agent.get(&format!("{}{path}", self.base));
        for (k, v) in query {
            req = req.query(*k, v);
        }
        let r = self.auth(req).call();
        let (_, body) = self.handle(&format!("GET {path}"), r)?;
        serde_json::from_slice(&body).map_err(|e| anyhow!("GET {path}: not JSON: {e}"))
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        let payload = serde_json::to_vec(body)?;
        let r = self
            .auth(self.agent.post(&format!("{}{path}", self.base)))
            .header("Content-Type", "application/json")
            .send(&payload[..]);
        // A server refuses a body over its limit (413) as soon as it sees the length and
        // closes the connection, so a large upload ends in a broken pipe before the answer
        // can be read: say what that means instead of the transport error.
        if let Err(e) = &r
            && payload.len() > LARGE_BODY
            && matches!(e, ureq::Error::Io(_))
        {
            bail!(
                "POST {path}: the server closed the connection while the {:.1} MB request was \
                 sent ({e}): it is over the server's request limit (`limits.max_body_bytes`, \
                 16 MiB unless configured; the server answers 413 too_large). Send a large \
                 model by path instead: put it under one of the server's model_roots and run \
                 `xpuctl submit --on-server PATH`, or raise limits.max_body_bytes",
                payload.len() as f64 / 1e6
            );
        }
        let (status, bytes) = self.handle(&format!("POST {path}"), r)?;
        Ok((
            status,
            serde_json::from_slice(&bytes).map_err(|e| anyhow!("POST {path}: not JSON: {e}"))?,
        ))
    }
}

pub(crate) fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

pub(crate) fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(NOTHING).set_header(header.iter().map(|h| h.to_uppercase()));
    t
}

fn ms(us: &Value) -> String {
    us.as_f64().map(|u| format!("{:.1}", u / 1000.0)).unwrap_or_else(|| "-".into())
}

fn print_run(run: &Value) {
    let mut t = Table::new();
    t.load_style(NOTHING);
    let labels: Vec<String> = run["labels"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect())
        .unwrap_or_default();
    for (k, v) in [
        ("run", run["run_id"].as_str().unwrap_or("").to_string()),
        ("status", run["status"].as_str().unwrap_or("").to_string()),
        (
            "program",
            format!(
                "{} ({})",
                run["program"].as_str().unwrap_or(""),
                run["program_kind"].as_str().unwrap_or("")
            ),
        ),
        ("policy", format!("{} v{}", run["policy"].as_str().unwrap_or(""), run["policy_version"])),
        ("labels", labels.join(", ")),
        ("queue ms", ms(&run["queue_us"])),
        ("run ms", ms(&run["run_us"])),
        ("nodes", run["nodes"].to_string()),
        ("fallbacks", run["fallbacks"].to_string()),
    ] {
        t.add_row(vec![k.to_string(), v]);
    }
    if let Some(e) = run["error"].as_str() {
        t.add_row(vec!["error".to_string(), e.to_string()]);
    }
    println!("{t}");
    if let Some(outs) = run["outputs"].as_array().filter(|o| !o.is_empty()) {
        let mut t = table(&["output", "dtype", "shape", "bytes", "sha256"]);
        for o in outs {
            t.add_row(vec![
                o["name"].as_str().unwrap_or("").to_string(),
                o["dtype"].as_str().unwrap_or("").to_string(),
                o["shape"].to_string(),
                o["bytes"].to_string(),
                o["sha256"].as_str().unwrap_or("").chars().take(12).collect(),
            ]);
        }
        println!("{t}");
    }
}

/// Outputs no larger than this are fetched and printed after a waited submit.
const PRINTED_OUTPUT: u64 = 1 << 20;

/// Prints a finished run's small outputs as a local `xpuctl run` prints them (tables as
/// pandas does, tensors as numpy does); larger ones stay in the outputs table above.
fn print_outputs(client: &Client, run: &Value) -> Result<()> {
    let id = run["run_id"].as_str().unwrap_or("");
    for o in run["outputs"].as_array().into_iter().flatten() {
        let name = o["name"].as_str().unwrap_or("");
        if o["bytes"].as_u64().is_none_or(|b| b > PRINTED_OUTPUT) {
            continue;
        }
        let bytes = client.get_bytes(&format!("/v1/runs/{id}/outputs/{name}"))?;
        let tensor = if o["dtype"] == "table" {
            let table = xpu_runtime::tensors::table_from_csv(&bytes)?;
            xpu_ir::Tensor::from_vec(vec![], vec![table])?
        } else {
            xpu_runtime::tensors::read_bytes(name, "npy", &bytes)?.1
        };
        println!("{name}:\n{}", xpu_runtime::tensors::pretty(&tensor));
    }
    Ok(())
}

/// `xpuctl submit`.
pub fn submit(
    client: &Client,
    program: &Path,
    on_server: bool,
    inputs: &[String],
    policy: Option<&str>,
    labels: &[String],
    wait: bool,
    format: Format,
) -> Result<()> {
    let name = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut body = json!({"program": {"name": name}, "labels": {}, "inputs": {}});
    if on_server {
        // A file under one of the server's model roots: nothing is read or uploaded here,
        // so a model of any size can be submitted.
        body["program"] = json!({"path": program.display().to_string()});
    } else {
        let bytes =
            std::fs::read(program).with_context(|| format!("cannot read {}", program.display()))?;
        if xpu_runtime::ProgramKind::of(&name).is_some_and(|k| k.is_text()) {
            body["program"]["source"] = json!(String::from_utf8_lossy(&bytes));
        } else {
            body["program"]["source_base64"] =
                json!(base64::engine::general_purpose::STANDARD.encode(&bytes));
        }
    }
    for kv in labels {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| crate::usage(format!("--label {kv:?}: expected KEY=VALUE")))?;
        body["labels"][k] = json!(v);
    }
    // The same input forms as `run` (NAME=PATH.npy, NAME=PATH.pb, NAME=PATH.csv, or PATH.pb
    // named by its proto), sent as the API takes them: tensors as .npy, tables as CSV.
    let b64 = |bytes: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(bytes);
    for (name, (_, tensor)) in crate::read_inputs(inputs)? {
        body["inputs"][name] = match tensor.data().as_table() {
            Some(table) => json!({"csv_base64": b64(xpu_runtime::tensors::csv_bytes(table)?)}),
            None => json!({"npy_base64": b64(xpu_runtime::tensors::npy_bytes(&tensor)?)}),
        };
    }
    match policy {
        Some(p) if p.ends_with(".toml") && Path::new(p).exists() => {
            body["policy_toml"] =
                json!(std::fs::read_to_string(p).with_context(|| format!("cannot read {p}"))?);
        }
        Some(p) => body["policy"] = json!(p),
        None => {}
    }
    let (_, mut run) = client.post("/v1/jobs", &body)?;
    if wait {
        let id = run["run_id"].as_str().unwrap_or("").to_string();
        let bar = (format == Format::Text).then(|| {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(Duration::from_millis(100));
            b
        });
        let mut delay = Duration::from_millis(5);
        while matches!(run["status"].as_str(), Some("queued" | "running")) {
            if let Some(b) = &bar {
                b.set_message(format!("{id} {}", run["status"].as_str().unwrap_or("")));
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(250));
            run = client.get(&format!("/v1/runs/{id}"))?;
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
    }
    match format {
        Format::Json => print_json(&run),
        Format::Text => {
            print_run(&run);
            if wait {
                print_outputs(client, &run)?;
            }
        }
    }
    if run["status"] == "failed" || run["status"] == "timed_out" {
        return Err(anyhow::Error::new(crate::Reported));
    }
    Ok(())
}

pub fn status(client: &Client, run: &str, format: Format) -> Result<()> {
    let v = client.get(&format!("/v1/runs/{run}"))?;
    match format {
        Format::Json => print_json(&v),
        Format::Text => print_run(&v),
    }
    Ok(())
}

pub fn list(
    client: &Client,
    status: Option<&str>,
    policy: Option<&str>,
    labels: &[String],
    limit: usize,
    cursor: Option<&str>,
    format: Format,
) -> Result<()> {
    let mut q = vec![("limit", limit.to_string())];
    q.extend(status.map(|s| ("status", s.to_string())));
    q.extend(policy.map(|p| ("policy", p.to_string())));
    if !labels.is_empty() {
        q.push(("label", labels.join(",")));
    }
    q.extend(cursor.map(|c| ("cursor", c.to_string())));
    let v = client.get_query("/v1/runs", &q)?;
    if format == Format::Json {
        print_json(&v);
        return Ok(());
    }
    let mut t = table(&["run", "status", "program", "policy", "run ms", "nodes", "fallbacks"]);
    for r in v["runs"].as_array().into_iter().flatten() {
        t.add_row(vec![
            r["run_id"].as_str().unwrap_or("").to_string(),
            r["status"].as_str().unwrap_or("").to_string(),
            r["program"].as_str().unwrap_or("").to_string(),
            r["policy"].as_str().unwrap_or("").to_string(),
            ms(&r["run_us"]),
            r["nodes"].to_string(),
            r["fallbacks"].to_string(),
        ]);
    }
    println!("{t}");
    if let Some(c) = v["next_cursor"].as_str() {
        println!("more: --cursor {c}");
    }
    Ok(())
}

pub fn cancel(client: &Client, run: &str, format: Format) -> Result<()> {
    let (_, v) = client.post(&format!("/v1/runs/{run}/cancel"), &json!({}))?;
    match format {
        Format::Json => print_json(&v),
        Format::Text => {
            println!("{run}: cancellation requested (was {})", v["status"].as_str().unwrap_or(""))
        }
    }
    Ok(())
}

/// An explanation from the server, or from a store directory opened offline.
fn explanation(
    client: Option<&Client>,
    store: Option<&xpu_store::Store>,
    run: &str,
) -> Result<xpu_plan::Explanation> {
    if let Some(s) = store {
        let found = s.explanation(run, xpu_store::Scope::All)?;
        return match found {
            Some((Some(ex), _)) => Ok(ex),
            Some((None, _)) => bail!("run {run} failed before it was planned"),
            None => bail!("no run {run} in {}", s.dir().display()),
        };
    }
    let v = client
        .ok_or_else(|| crate::usage("no server and no --store"))?
        .get(&format!("/v1/runs/{run}/explain"))?;
    serde_json::from_value(v).map_err(|e| anyhow!("run {run}: unreadable explanation: {e}"))
}

/// The explanation as JSON that says which run it explains: `run_id` and `status` beside
/// the explanation's own fields (`policy`: name, version, sha256, …).
fn explained_run_json(
    client: Option<&Client>,
    store: Option<&xpu_store::Store>,
    run: &str,
    ex: &xpu_plan::Explanation,
) -> Result<String> {
    let status = match (store, client) {
        (Some(s), _) => s
            .run(run, xpu_store::Scope::All)?
            .map(|r| r.status.name().to_string())
            .unwrap_or_default(),
        (None, Some(c)) => c
            .get(&format!("/v1/runs/{run}"))?
            .get("status")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string(),
        (None, None) => String::new(),
    };
    let mut out = serde_json::Map::new();
    out.insert("run_id".into(), run.into());
    out.insert("status".into(), status.into());
    let serde_json::Value::Object(fields) = serde_json::to_value(ex)? else {
        bail!("run {run}: the explanation is not a JSON object");
    };
    out.extend(fields);
    Ok(serde_json::to_string_pretty(&serde_json::Value::Object(out))?)
}

pub fn explain(
    client: Option<&Client>,
    store_dir: Option<&PathBuf>,
    run: &str,
    node: Option<&str>,
    diff: Option<&str>,
    format: Format,
) -> Result<()> {
    let store = match store_dir {
        Some(d) => Some(xpu_store::Store::open(d)?),
        None => None,
    };
    if run.starts_with(xpu_store::ASK_ID_PREFIX) {
        if node.is_some() || diff.is_some() {
            bail!("{run} is an ask: --node and --diff are for runs");
        }
        return match (client, &store) {
            (Some(c), _) => crate::ask_cmd::remote::explain(c, run, format),
            (None, Some(store)) => {
                // Offline: the stored record as it is (the conversation is its `answer`).
                let ask = store
                    .ask(run, xpu_store::Scope::All)?
                    .ok_or_else(|| anyhow!("no ask {run} in {}", store.dir().display()))?;
                print_json(&serde_json::to_value(&ask)?);
                Ok(())
            }
            (None, None) => bail!("no store to read {run} from"),
        };
    }
    let mut ex = explanation(client, store.as_ref(), run)?;
    if let Some(n) = node {
        ex.decisions.retain(|d| d.node.to_string() == n || d.name.as_deref() == Some(n));
        if ex.decisions.is_empty() {
            bail!("run {run} has no node {n}");
        }
    }
    let Some(other) = diff else {
        match format {
            Format::Json => println!("{}", explained_run_json(client, store.as_ref(), run, &ex)?),
            Format::Text => print!("{}", xpu_plan::render::explanation_text(&ex, true)),
        }
        return Ok(());
    };
    let theirs = explanation(client, store.as_ref(), other)?;
    let mut changes = Vec::new();
    for d in &ex.decisions {
        let key = d.name.clone().unwrap_or_else(|| d.node.to_string());
        let mine = xpu_plan::render::decision_sentence(d);
        let t = theirs.decisions.iter().find(|t| t.name == d.name && t.op == d.op);
        let their = t.map(xpu_plan::render::decision_sentence).unwrap_or_else(|| "(absent)".into());
        let choice = |d: Option<&xpu_plan::Decision>| {
            d.and_then(|d| d.chosen.as_ref())
                .map(|c| {
                    format!("{}/{}/{}", c.engine, c.kernel, c.precision.map_or("-", |p| p.name()))
                })
                .unwrap_or_else(|| "-".into())
        };
        if choice(Some(d)) != choice(t) {
            let mut c = serde_json::Map::new();
            c.insert("node".into(), json!(key));
            c.insert("op".into(), json!(d.op));
            c.insert(run.to_string(), json!(choice(Some(d))));
            c.insert(other.to_string(), json!(choice(t)));
            c.insert("before".into(), json!(mine));
            c.insert("after".into(), json!(their));
            changes.push(Value::Object(c));
        }
    }
    match format {
        Format::Json => print_json(&json!({"run": run, "other": other, "changes": changes})),
        Format::Text => {
            if changes.is_empty() {
                println!("{run} and {other}: every node ran the same way");
            } else {
                let mut t = table(&["node", "op", run, other]);
                for c in &changes {
                    t.add_row(vec![
                        c["node"].as_str().unwrap_or("").to_string(),
                        c["op"].as_str().unwrap_or("").to_string(),
                        c[run].as_str().unwrap_or("").to_string(),
                        c[other].as_str().unwrap_or("").to_string(),
                    ]);
                }
                println!("{t}");
            }
        }
    }
    Ok(())
}

pub fn search(client: &Client, query: &str, limit: usize, format: Format) -> Result<()> {
    let v = client
        .get_query("/v1/search", &[("q", query.to_string()), ("limit", limit.to_string())])?;
    if format == Format::Json {
        print_json(&v);
        return Ok(());
    }
    let mut t = table(&["kind", "id", "score", "snippet"]);
    for h in v.as_array().into_iter().flatten() {
        t.add_row(vec![
            h["kind"].as_str().unwrap_or("run").to_string(),
            h["run_id"].as_str().unwrap_or("").to_string(),
            format!("{:.2}", h["score"].as_f64().unwrap_or(0.0)),
            h["snippet"].as_str().unwrap_or("").replace('\n', " "),
        ]);
    }
    println!("{t}");
    Ok(())
}

pub fn sql(client: &Client, query: &str, limit: usize, format: Format) -> Result<()> {
    let (_, v) = client.post("/v1/sql", &json!({"query": query, "limit": limit}))?;
    if format == Format::Json {
        print_json(&v);
        return Ok(());
    }
    let cols: Vec<&str> =
        v["columns"].as_array().into_iter().flatten().filter_map(|c| c.as_str()).collect();
    let mut t = table(&cols);
    for row in v["rows"].as_array().into_iter().flatten() {
        t.add_row(row.as_array().into_iter().flatten().map(|c| match c {
            Value::String(s) => s.clone(),
            Value::Null => "NULL".into(),
            other => other.to_string(),
        }));
    }
    println!("{t}");
    if v["truncated"] == true {
        println!("(more rows; raise --limit)");
    }
    Ok(())
}

pub fn replay(client: &Client, run: &str, verify: bool, format: Format) -> Result<()> {
    let (_, v) =
        client.post(&format!("/v1/runs/{run}/replay"), &json!({"verify": verify, "wait": true}))?;
    if format == Format::Json {
        print_json(&v);
    } else {
        print_run(&v["run"]);
        if v["policy_changed"] == true {
            println!(
                "note: policy {} has changed since {run} ran",
                v["run"]["policy"].as_str().unwrap_or("")
            );
        }
        if let Some(ok) = v["verified"].as_bool() {
            for o in v["outputs"].as_array().into_iter().flatten() {
                println!(
                    "{}: {}",
                    o["name"].as_str().unwrap_or(""),
                    if o["same"] == true { "same bytes" } else { "DIFFERS" }
                );
            }
            println!("verify: {}", if ok { "identical" } else { "outputs differ" });
        }
    }
    if v["verified"] == false {
        return Err(anyhow::Error::new(crate::Reported));
    }
    Ok(())
}

pub fn policies(client: &Client, format: Format) -> Result<()> {
    let v = client.get("/v1/policies")?;
    if format == Format::Json {
        print_json(&v);
        return Ok(());
    }
    let mut t = table(&["policy", "version", "priority", "match", "description"]);
    for p in v.as_array().into_iter().flatten() {
        let m: Vec<String> = p["match_labels"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect())
            .unwrap_or_default();
        t.add_row(vec![
            p["name"].as_str().unwrap_or("").to_string(),
            p["version"].to_string(),
            p["priority"].to_string(),
            m.join(","),
            p["description"].as_str().unwrap_or("").to_string(),
        ]);
    }
    println!("{t}");
    Ok(())
}

pub fn engines(client: &Client, format: Format) -> Result<()> {
    let v = client.get("/v1/engines")?;
    if format == Format::Json {
        print_json(&v);
        return Ok(());
    }
    let mut t = table(&["engine", "version", "availability", "devices", "kernels"]);
    // `list[*].key`, joined: the kernels' names, the devices' ids.
    let field_of_each = |list: &Value, key: &str| {
        let items = list.as_array().into_iter().flatten();
        items.filter_map(|item| item[key].as_str()).collect::<Vec<_>>().join(", ")
    };
    for e in v["engines"].as_array().into_iter().flatten() {
        t.add_row(vec![
            e["engine"].as_str().unwrap_or("").to_string(),
            e["version"].as_str().unwrap_or("").to_string(),
            e["availability"]["status"].as_str().unwrap_or("").to_string(),
            field_of_each(&e["devices"], "id"),
            field_of_each(&e["kernels"], "name"),
        ]);
    }
    println!("{t}");
    Ok(())
}

/// `xpuctl admin reindex`: rebuild a store's search index (the daemon must be stopped).
pub fn reindex(dir: &Path) -> Result<()> {
    let store = xpu_store::Store::open(dir)?;
    let n = store.reindex()?;
    println!("{}: {n} runs indexed", dir.display());
    Ok(())
}
