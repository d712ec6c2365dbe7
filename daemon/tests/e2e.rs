//! The real binaries on a loopback port: xpud driven by xpuctl; xpud SIGKILLed under load
//! and restarted (every run acknowledged complete still explains, nothing twice); a flood of
//! 4× the queue capacity (only 2xx and 429, memory bounded); a second xpud on the same data
//! directory exits at once; SIGHUP reloads policies (a bad set is refused).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn xpud_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_xpud"))
}

fn xpuctl_bin() -> PathBuf {
    let p = xpud_bin().with_file_name("xpuctl");
    assert!(p.exists(), "{} is built with the workspace", p.display());
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Daemon {
    child: Child,
    url: String,
}

impl Daemon {
    fn start(data: &Path, policies: &Path, env: &[(&str, &str)]) -> Daemon {
        let port = free_port();
        let mut cmd = Command::new(xpud_bin());
        cmd.args(["--dev", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(data)
            .env("XPU_POLICY_DIRS", format!("[\"{}\"]", policies.display()))
            .env("XPU_DATA_ROOTS", format!("[\"{}\"]", repo().join("examples").display()))
            .env("XPU_MODEL_ROOTS", format!("[\"{}\"]", repo().join("examples").display()))
            .env("XPU_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let d = Daemon { child, url };
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if ureq::get(&format!("{}/readyz", d.url)).call().is_ok() {
                return d;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("xpud did not become ready");
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

fn post(a: &ureq::Agent, url: &str, body: &Value) -> Result<(u16, Value), String> {
    let mut r = a.post(url).send_json(body).map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let v = r.body_mut().read_json::<Value>().unwrap_or(Value::Null);
    Ok((status, v))
}

fn get(a: &ureq::Agent, url: &str) -> (u16, Value) {
    let mut r = a.get(url).call().unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().read_json::<Value>().unwrap_or(Value::Null))
}

fn xpuctl(url: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(xpuctl_bin())
        .args(["--server", url])
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap();
    (
        out.status.success(),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn xpuctl_drives_a_real_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("var"), &repo().join("policies/examples"), &[]);
    let (ok, out) = xpuctl(
        &d.url,
        &["submit", "examples/example.ml", "--wait", "--format", "json", "--label", "team=titanic"],
    );
    assert!(ok, "{out}");
    let run: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(run["status"], "succeeded", "{run}");
    let id = run["run_id"].as_str().unwrap();
    let (ok, out) = xpuctl(&d.url, &["explain", id]);
    assert!(ok && out.contains("describe") && out.contains("table.duckdb"), "{out}");
    // The JSON form says which run it explains.
    let (ok, out) = xpuctl(&d.url, &["explain", id, "--format", "json"]);
    assert!(ok, "{out}");
    let ex: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(ex["run_id"], id, "{out}");
    assert_eq!(ex["status"], "succeeded", "{out}");
    assert_eq!(ex["policy"]["name"], run["policy"], "{out}");
    let (ok, out) = xpuctl(&d.url, &["status", id]);
    assert!(ok && out.contains("succeeded"), "{out}");
    // A waited submit prints what the program prints, as a local run does.
    let (ok, out) = xpuctl(&d.url, &["submit", "examples/example.ml", "--wait"]);
    assert!(ok && out.contains("print_0:") && out.contains("mean") && out.contains("50%"), "{out}");
    // The statistics are row labels, as pandas and a local run print them (not an index
    // column beside a `statistic` column).
    assert!(out.lines().any(|l| l.starts_with("mean ")), "{out}");
    assert!(!out.contains("statistic"), "{out}");
    // Inputs take the forms `run` takes, and a model can be named on the server.
    let (ok, out) = xpuctl(
        &d.url,
        &[
            "submit",
            "mlp.onnx",
            "--on-server",
            "--input",
            "x=examples/mlp_input.npy",
            "--wait",
            "--format",
            "json",
        ],
    );
    assert!(ok && out.contains("succeeded"), "{out}");
    let onnx_run: Value = serde_json::from_str(&out).unwrap();
    // A body over the server's limit is explained, not a transport error.
    let big = dir.path().join("big.onnx");
    std::fs::write(&big, vec![7u8; 20 << 20]).unwrap();
    let (ok, out) = xpuctl(&d.url, &["submit", big.to_str().unwrap()]);
    // (Either the server's 413 arrives, or the connection closes mid-upload and the client
    // says what that means; both name the way out.)
    assert!(!ok && (out.contains("413") || out.contains("request limit")), "{out}");
    assert!(out.contains("--on-server") && out.contains("max_body_bytes"), "{out}");
    let (ok, out) = xpuctl(&d.url, &["list", "--label", "team=titanic"]);
    assert!(ok && out.contains(id), "{out}");
    let (ok, out) =
        xpuctl(&d.url, &["submit", "examples/tensors.ml", "--wait", "--policy", "cpu-only"]);
    assert!(ok && out.contains("cpu-only"), "{out}");
    let mut found = false;
    for _ in 0..40 {
        let (ok, out) = xpuctl(&d.url, &["search", "titanic.csv", "--format", "json"]);
        assert!(ok, "{out}");
        if out.contains(id) {
            found = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(found, "the run is searchable within seconds");
    let (ok, out) = xpuctl(&d.url, &["replay", id, "--verify"]);
    assert!(ok && out.contains("identical"), "{out}");
    let (ok, out) = xpuctl(&d.url, &["sql", "SELECT count(*) AS runs FROM runs"]);
    // example.ml twice, mlp.onnx, tensors.ml, the replay.
    assert!(ok && out.contains('5'), "{out}");
    let (ok, out) = xpuctl(&d.url, &["policies"]);
    assert!(ok && out.contains("cpu-only") && out.contains("latency-gpu"), "{out}");
    // A binary program is kept once, by content, and replays from there.
    let (ok, out) = xpuctl(&d.url, &["replay", onnx_run["run_id"].as_str().unwrap(), "--verify"]);
    assert!(ok && out.contains("identical"), "{out}");
    let kept = std::fs::read_dir(dir.path().join("var/runs")).unwrap().flatten();
    assert!(!kept.into_iter().any(|r| r.path().join("program.onnx").exists()));
    // A table input travels as CSV, types the program by its columns, and is kept for replay.
    let people = dir.path().join("people.csv");
    std::fs::write(&people, "name,age,flag\nann,31,True\nbob,NA,False\ncid,45,True\n").unwrap();
    let prog = dir.path().join("older.ml");
    std::fs::write(
        &prog,
        "let t = input(\"people\", dtype=\"table\")\nprint select(filter(t, age > 40), [\"name\"])\n",
    )
    .unwrap();
    let input = format!("people={}", people.display());
    let (ok, out) =
        xpuctl(&d.url, &["submit", prog.to_str().unwrap(), "--input", &input, "--wait"]);
    assert!(ok && out.contains("cid") && !out.contains("ann"), "{out}");
    let (ok, out) = xpuctl(
        &d.url,
        &["submit", prog.to_str().unwrap(), "--input", &input, "--wait", "--format", "json"],
    );
    assert!(ok, "{out}");
    let table_run: Value = serde_json::from_str(&out).unwrap();
    let (ok, out) = xpuctl(&d.url, &["replay", table_run["run_id"].as_str().unwrap(), "--verify"]);
    assert!(ok && out.contains("identical"), "{out}");
    let (ok, out) = xpuctl(&d.url, &["engines", "--remote"]);
    assert!(ok && out.contains("table"), "{out}");
    let (ok, out) = xpuctl(&d.url, &["submit", "examples/no-such.ml"]);
    assert!(!ok && out.contains("no-such.ml"), "{out}");
    // A program that does not compile comes back with its diagnostics; exit 1.
    let bad = dir.path().join("bad.ml");
    std::fs::write(&bad, "let x = load_csv(\"titanic.csv\")\nprint x.Agee\n").unwrap();
    let (ok, out) = xpuctl(&d.url, &["submit", bad.to_str().unwrap(), "--wait"]);
    assert!(!ok && out.contains("422") && out.contains("Agee"), "{out}");

    // A second daemon on the same data directory stops at once, saying why.
    let out = Command::new(xpud_bin())
        .args(["--dev", "--listen", &format!("127.0.0.1:{}", free_port()), "--data-dir"])
        .arg(dir.path().join("var"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("another process"), "{err}");
}

/// The names of the policies xpud serves.
fn policy_names(a: &ureq::Agent, url: &str) -> Vec<String> {
    let (_, v) = get(a, &format!("{url}/v1/policies"));
    v.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_string()).collect()
}

/// Whether xpud serves exactly `want` within `limit`.
fn policies_become(a: &ureq::Agent, url: &str, want: &[&str], limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if policy_names(a, url) == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A policy directory under `dir` holding one policy, `alpha`.
fn alpha_policy_dir(dir: &Path) -> PathBuf {
    let pol = dir.join("policies");
    std::fs::create_dir(&pol).unwrap();
    std::fs::write(pol.join("a.toml"), "[policy]\nname = \"alpha\"\n").unwrap();
    pol
}

#[test]
fn sighup_reloads_policies_and_keeps_the_old_set_when_the_new_is_bad() {
    let dir = tempfile::tempdir().unwrap();
    let pol = alpha_policy_dir(dir.path());
    // Only the signal reloads here (the file watch has its own test).
    let d = Daemon::start(&dir.path().join("var"), &pol, &[("XPU_WATCH_POLICIES", "false")]);
    let a = agent();
    let names = |a: &ureq::Agent| policy_names(a, &d.url);
    assert_eq!(names(&a), ["alpha"]);
    std::fs::write(pol.join("b.toml"), "[policy]\nname = \"beta\"\n").unwrap();
    d.signal("HUP");
    assert!(policies_become(&a, &d.url, &["alpha", "beta"], Duration::from_millis(2500)));
    std::fs::write(pol.join("c.toml"), "[policy]\nname = \"gamma\"\n[engines]\norder = 5\n")
        .unwrap();
    d.signal("HUP");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(names(&a), ["alpha", "beta"], "the bad set is refused, the old one stays");
    let (_, m) = {
        let mut r = a.get(&format!("{}/metrics", d.url)).call().unwrap();
        (r.status(), r.body_mut().read_to_string().unwrap())
    };
    assert!(m.contains("xpu_policy_reloads_total{result=\"rejected\"} 1"), "{m}");
    assert!(m.contains("xpu_policy_reloads_total{result=\"ok\"} 1"), "{m}");
}

/// A policy file written, fixed or broken while xpud runs: the watch reloads the set without
/// a signal, and a bad set is refused with the old one kept.
#[test]
fn policy_files_are_watched() {
    let dir = tempfile::tempdir().unwrap();
    let pol = alpha_policy_dir(dir.path());
    let d = Daemon::start(&dir.path().join("var"), &pol, &[]);
    let a = agent();
    let names = || policy_names(&a, &d.url);
    let becomes = |want: &[&str]| policies_become(&a, &d.url, want, Duration::from_secs(5));
    std::fs::write(pol.join("b.toml"), "[policy]\nname = \"beta\"\n").unwrap();
    assert!(becomes(&["alpha", "beta"]), "{:?}", names());
    std::fs::write(pol.join("b.toml"), "[policy]\nname = \"beta\"\n[engines]\norder = 5\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(names(), ["alpha", "beta"], "the bad set is refused, the old one stays");
    std::fs::remove_file(pol.join("b.toml")).unwrap();
    assert!(becomes(&["alpha"]), "{:?}", names());
}

/// SIGKILL under load, several times: every run acknowledged complete is stored and
/// explains after restart; no run is stored twice.
#[test]
fn acknowledged_runs_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("var");
    let policies = repo().join("policies/examples");
    let mut acknowledged: Vec<String> = Vec::new();
    let mut replayed = 0;
    for round in 0..3 {
        let d = Daemon::start(&data, &policies, &[]);
        replayed += replayed_at_start(&d);
        let url = d.url.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut threads = Vec::new();
        for t in 0..4 {
            let (url, stop) = (url.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let a = agent();
                let mut acked = Vec::new();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let src = format!("let x = [1.0, 2.0, {t}.0, {i}.0]\nprint sum(x * x)\n");
                    let body = json!({"program": {"name": "load.ml", "source": src}, "wait": true,
                                      "labels": {"round": round.to_string()}});
                    match post(&a, &format!("{url}/v1/jobs"), &body) {
                        Ok((200, v)) if v["status"] == "succeeded" => {
                            acked.push(v["run_id"].as_str().unwrap().to_string());
                        }
                        Ok(_) => {}
                        Err(_) => break, // the daemon is gone
                    }
                    i += 1;
                }
                acked
            }));
        }
        std::thread::sleep(Duration::from_millis(1500));
        d.kill();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in threads {
            acknowledged.extend(t.join().unwrap());
        }
        assert!(!acknowledged.is_empty(), "round {round}: some runs completed");
    }
    let d = Daemon::start(&data, &policies, &[]);
    replayed += replayed_at_start(&d);
    let a = agent();
    let mut missing = Vec::new();
    for id in &acknowledged {
        let (s, ex) = get(&a, &format!("{}/v1/runs/{id}/explain", d.url));
        if s != 200 || ex["decisions"].as_array().is_none_or(|d| d.is_empty()) {
            missing.push(id.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged runs lost: {missing:?}",
        missing.len(),
        acknowledged.len()
    );
    let (s, dup) = post(
        &a,
        &format!("{}/v1/sql", d.url),
        &json!({"query": "SELECT count(*) - count(DISTINCT run_id) AS dup, count(*) AS n, (SELECT count(*) FROM decisions) AS decisions FROM runs"}),
    )
    .unwrap();
    assert_eq!(s, 200, "{dup}");
    assert_eq!(dup["rows"][0][0], 0, "no run stored twice: {dup}");
    let stored = dup["rows"][0][1].as_u64().unwrap();
    assert!(
        stored >= acknowledged.len() as u64,
        "{stored} stored, {} acknowledged",
        acknowledged.len()
    );
    // The search index caught up from its payload: every stored run is found once.
    let mut hits = 0;
    for _ in 0..50 {
        let (_, v) = get(&a, &format!("{}/v1/search?q=program:load.ml&limit=1000", d.url));
        hits = v.as_array().map_or(0, |h| h.len());
        if hits as u64 == stored.min(1000) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(hits as u64, stored.min(1000));
    eprintln!(
        "crash test: 3 SIGKILLs, {} runs acknowledged, {stored} stored ({replayed} of them \
         from the journal at restart), 0 lost, 0 duplicated",
        acknowledged.len()
    );
}

/// `xpu_store_replayed_runs` of a daemon just started.
fn replayed_at_start(d: &Daemon) -> u64 {
    let text = ureq::get(&format!("{}/metrics", d.url))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("xpu_store_replayed_runs "))
        .and_then(|v| v.trim().parse().ok())
        .expect("xpu_store_replayed_runs is exported")
}

/// Four times the queue's capacity at once: only 2xx and 429, and the daemon's memory stays
/// bounded.
#[test]
fn a_flood_gets_2xx_and_429_only() {
    let dir = tempfile::tempdir().unwrap();
    // A queue of 64 behind one worker, and 256 jobs (4× the capacity) sent at once from
    // 64 connections.
    let capacity = 64;
    let d = Daemon::start(
        &dir.path().join("var"),
        &repo().join("policies/examples"),
        &[("XPU_LIMITS__QUEUE_CAPACITY", "64"), ("XPU_LIMITS__WORKERS", "1")],
    );
    let url = d.url.clone();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(64));
    let mut threads = Vec::new();
    for t in 0..64 {
        let (url, barrier) = (url.clone(), barrier.clone());
        threads.push(std::thread::spawn(move || {
            let a = agent();
            let mut codes = Vec::new();
            barrier.wait();
            for i in 0..(4 * capacity / 64) {
                let src = format!("let x = randn([96, 96], seed={t}{i})\nprint sum(x @ x @ x)\n");
                let body = json!({"program": {"name": "flood.ml", "source": src}});
                codes.push(post(&a, &format!("{url}/v1/jobs"), &body).map(|r| r.0).unwrap_or(0));
            }
            codes
        }));
    }
    let mut codes = Vec::new();
    let mut peak = 0;
    for t in threads {
        peak = peak.max(d.rss_kib());
        codes.extend(t.join().unwrap());
    }
    peak = peak.max(d.rss_kib());
    let bad: Vec<&u16> = codes.iter().filter(|c| !(**c == 202 || **c == 429)).collect();
    assert!(bad.is_empty(), "unexpected statuses: {bad:?}");
    let rejected = codes.iter().filter(|c| **c == 429).count();
    eprintln!(
        "flood: {} submitted, {} accepted, {rejected} refused with 429, peak RSS {} MiB",
        codes.len(),
        codes.len() - rejected,
        peak / 1024
    );
    assert!(rejected > 0, "a queue of {capacity} cannot take {} jobs at once", codes.len());
    assert!(peak < 1024 * 1024, "peak RSS {} MiB", peak / 1024);
    let (s, _) = get(&agent(), &format!("{url}/healthz"));
    assert_eq!(s, 200, "still serving");
}

/// The worker processes of xpud `pid` that serve `engine`.
fn worker_pids(pid: u32, engine: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
            let cmd = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains("xpu-worker") && cmd.contains(&format!("--engine {engine} ")) {
                out.push(child);
            }
        }
    }
    out
}

fn metric(url: &str, line_start: &str) -> u64 {
    let text = ureq::get(&format!("{url}/metrics")).call().unwrap().body_mut().read_to_string();
    text.unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The cpu engine in a worker process with fault injection on: a worker that segfaults,
/// aborts, exits, hangs past the timeout or is killed from outside mid-job costs that job
/// (its error names the engine and the cause), never the daemon; the next job runs on a
/// new worker; a program that keeps crashing it is quarantined; nothing acknowledged is lost.
#[test]
fn a_crashing_engine_worker_costs_its_job_not_the_daemon() {
    // xpud finds its worker program beside itself.
    assert_eq!(
        PathBuf::from(env!("CARGO_BIN_EXE_xpu-worker")),
        xpud_bin().with_file_name("xpu-worker")
    );
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("var"),
        &repo().join("policies/examples"),
        &[
            ("XPU_ENGINES__CPU__ISOLATION", "process"),
            ("XPU_ISOLATION__INJECT_FAULTS", "true"),
            // A debug worker holds ~55 MiB; one 64 MiB leak takes it past this.
            ("XPU_ISOLATION__MAX_RSS_MB", "100"),
            ("XPU_ISOLATION__PROCESSES_PER_ENGINE", "2"),
            ("XPU_ISOLATION__IDLE_EXIT_S", "5"),
            ("XPU_LIMITS__WORKERS", "3"),
        ],
    );
    let a = agent();
    let url = d.url.clone();
    // Each program is its own partition (quarantine counts crashes per partition).
    let job = |k: u32, first: f64, policy_toml: Option<&str>| {
        let src = format!("let x = input(\"x\")\nprint x * {k}.0\n");
        let mut j = json!({"program": {"name": "w.ml", "source": src}, "wait": true,
                           "inputs": {"x": {"shape": [4], "data": [first, 1.0, 2.0, 3.0]}}});
        match policy_toml {
            Some(p) => j["policy_toml"] = json!(p),
            None => j["policy"] = json!("cpu-only"),
        }
        j
    };
    let submit = |body: &Value| {
        let (s, v) = post(&a, &format!("{url}/v1/jobs"), body).unwrap();
        assert_eq!(s, 200, "{v}");
        v
    };
    let mut acknowledged = Vec::new();
    let mut ok = |k: u32| {
        let v = submit(&job(k, 0.5, None));
        assert_eq!(v["status"], "succeeded", "{v}");
        acknowledged.push(v["run_id"].as_str().unwrap().to_string());
    };
    ok(1);
    assert_eq!(worker_pids(d.child.id(), "cpu").len(), 1, "the cpu engine runs in one worker");
    // Faults inside the worker: each costs its job, with the cause.
    for (k, marker, cause) in
        [(2, -1001.0, "SIGSEGV"), (3, -1002.0, "SIGABRT"), (4, -1005.0, "exit status 3")]
    {
        let v = submit(&job(k, marker, None));
        assert_eq!(v["status"], "failed", "{v}");
        let error = v["error"].as_str().unwrap();
        assert!(error.contains(&format!("engine cpu crashed ({cause})")), "{error}");
        assert_eq!(get(&a, &format!("{url}/healthz")).0, 200);
        ok(k);
    }
    // Killed from outside mid-job (the job hangs until then), by SIGKILL and by SIGSEGV.
    let status_of = |id: &str| get(&a, &format!("{url}/v1/runs/{id}")).1;
    // Submits program `k` with the hang marker; its id once it hangs in a worker.
    let start_hanging = |k: u32| {
        let mut body = job(k, -1003.0, None);
        body["wait"] = json!(false);
        let (s, v) = post(&a, &format!("{url}/v1/jobs"), &body).unwrap();
        assert_eq!(s, 202, "{v}");
        let id = v["run_id"].as_str().unwrap().to_string();
        let until = Instant::now() + Duration::from_secs(30);
        while status_of(&id)["status"] != "running" {
            assert!(Instant::now() < until, "the hanging job starts");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Planned and handed to the worker well within this.
        std::thread::sleep(Duration::from_millis(1000));
        id
    };
    // Run `id` once it has ended (30 s at most).
    let ended = |id: &str| {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let v = status_of(id);
            if v["status"] != "running" {
                return v;
            }
            assert!(Instant::now() < until, "the job ends");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for (k, signal) in [(5, "KILL"), (6, "SEGV")] {
        let id = start_hanging(k);
        let [pid] = worker_pids(d.child.id(), "cpu")[..] else { panic!("one cpu worker") };
        let killed = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status();
        assert!(killed.unwrap().success());
        let v = ended(&id);
        assert_eq!(v["status"], "failed", "{v}");
        assert!(v["error"].as_str().unwrap().contains(&format!("crashed (SIG{signal})")), "{v}");
        ok(k);
    }
    // A hang past execution.timeout: the worker is killed, the run timed out.
    let timeout =
        "[policy]\nname = \"short\"\nextends = \"cpu-only\"\n[execution]\ntimeout = \"1s\"\n";
    let started = Instant::now();
    let v = submit(&job(7, -1003.0, Some(timeout)));
    assert_eq!(v["status"], "timed_out", "{v}");
    assert!(started.elapsed() < Duration::from_secs(20), "stopped at the timeout");
    ok(7);
    // The same program crashing the worker again and again is quarantined.
    for _ in 0..xpu_runtime::worker::QUARANTINE_AFTER {
        let v = submit(&job(8, -1001.0, None));
        assert!(v["error"].as_str().unwrap().contains("crashed (SIGSEGV)"), "{v}");
    }
    let v = submit(&job(8, 0.5, None));
    assert_eq!(v["status"], "failed", "{v}");
    assert!(v["error"].as_str().unwrap().contains("quarantined"), "{v}");
    ok(9);
    // A leak: the job succeeds, and its bloated worker is replaced after it.
    let before = worker_pids(d.child.id(), "cpu");
    let v = submit(&job(10, -1004.0, None));
    assert_eq!(v["status"], "succeeded", "{v}");
    ok(11);
    assert_ne!(worker_pids(d.child.id(), "cpu"), before, "the leaking worker was replaced");
    // Metrics count the restarts by cause and the jobs they cost.
    let restarts = |cause: &str| {
        metric(&url, &format!("xpu_worker_restarts_total{{cause=\"{cause}\",engine=\"cpu\"}}"))
    };
    assert_eq!(restarts("SIGSEGV"), 1 + 1 + 3, "in-worker, from outside, quarantined program");
    assert_eq!((restarts("SIGABRT"), restarts("SIGKILL"), restarts("timeout")), (1, 1, 1));
    assert_eq!(restarts("memory"), 1);
    assert_eq!(metric(&url, "xpu_worker_crashed_jobs_total{engine=\"cpu\"}"), 3 + 2 + 3);
    assert_eq!(metric(&url, "xpu_workers_alive{engine=\"cpu\"}"), 1, "serial jobs use one");
    // A pool of two: a job hanging in one worker does not hold up the next job, which gets
    // a second worker; cancelled, the hanging job's worker is killed after the stop grace
    // (the hang ignores stops) and the other worker lives on.
    let hung = start_hanging(12);
    ok(13);
    assert_eq!(status_of(&hung)["status"], "running", "still hanging in the other worker");
    let pool = worker_pids(d.child.id(), "cpu");
    assert_eq!(pool.len(), 2, "a second worker for the second job");
    assert_eq!(metric(&url, "xpu_workers_alive{engine=\"cpu\"}"), 2);
    let status = a.post(&format!("{url}/v1/runs/{hung}/cancel")).send_empty().unwrap().status();
    assert_eq!(status.as_u16(), 202);
    let v = ended(&hung);
    assert_eq!(v["status"], "cancelled", "{v}");
    assert_eq!(restarts("cancelled"), 1, "killed after the grace");
    let left = worker_pids(d.child.id(), "cpu");
    assert_eq!(left.len(), 1, "{pool:?} -> {left:?}");
    assert!(pool.contains(&left[0]), "the other worker lives on");
    ok(13);
    // That second worker, idle for isolation.idle_exit_s, is closed (the first was killed by
    // the cancel); program 13's executable is prepared again when it runs next.
    let until = Instant::now() + Duration::from_secs(30);
    // The reaper stops the process, then counts it: wait for both (the process table can
    // show it gone a moment before the counter moves).
    while !worker_pids(d.child.id(), "cpu").is_empty()
        || metric(&url, "xpu_worker_retired_total{engine=\"cpu\"}") == 0
    {
        assert!(Instant::now() < until, "the idle worker is closed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metric(&url, "xpu_worker_retired_total{engine=\"cpu\"}"), 1);
    assert_eq!(metric(&url, "xpu_workers_alive{engine=\"cpu\"}"), 0);
    ok(13);
    assert_eq!(worker_pids(d.child.id(), "cpu").len(), 1);
    // Quarantine is for crashes in a row: a program that crashed twice, then ran, may crash
    // twice more and still run.
    for _ in 0..2 {
        for _ in 0..xpu_runtime::worker::QUARANTINE_AFTER - 1 {
            let v = submit(&job(14, -1001.0, None));
            assert!(v["error"].as_str().unwrap().contains("crashed (SIGSEGV)"), "{v}");
        }
        ok(14);
    }
    // Every acknowledged run is stored and explains.
    for id in &acknowledged {
        let (s, ex) = get(&a, &format!("{url}/v1/runs/{id}/explain"));
        assert_eq!(s, 200, "{id}: {ex}");
    }
    eprintln!(
        "worker crash test: 9 crashes (SIGSEGV, SIGABRT, exit, SIGKILL and SIGSEGV from \
         outside, timeout, 3 before quarantine), 1 leak recycled, {} runs acknowledged, 0 lost",
        acknowledged.len()
    );
}

/// `.npy` bytes of an f32 matrix (row-major).
fn npy_f32(rows: usize, cols: usize, value: impl Fn(usize) -> f32) -> Vec<u8> {
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for i in 0..rows * cols {
        out.extend_from_slice(&value(i).to_le_bytes());
    }
    out
}

/// The real ort engine in its worker (the default isolation): its worker killed from
/// outside while it runs a model fails that job with SIGKILL, the daemon stays up, and the
/// next ort job runs on a new worker.
#[test]
fn killing_the_ort_worker_mid_model_costs_that_job_only() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("var"), &repo().join("policies/examples"), &[]);
    let (a, url) = (agent(), d.url.clone());
    // 300 chained 768² matmuls with tanh: seconds on ort with 2 threads.
    let mut src = String::from("let x = input(\"x\")\nlet y0 = x\n");
    for i in 1..=300 {
        src.push_str(&format!("let y{i} = tanh(y{} @ x)\n", i - 1));
    }
    src.push_str("print y300\n");
    let n = 768;
    let x = npy_f32(n, n, |i| ((i % 97) as f32 - 48.0) / 400.0);
    let x64 = base64::engine::general_purpose::STANDARD.encode(&x);
    let body = |wait: bool| {
        json!({"program": {"name": "chain.ml", "source": src}, "policy": "ort-cpu", "wait": wait,
               "inputs": {"x": {"npy_base64": x64}}})
    };
    let (s, first) = post(&a, &format!("{url}/v1/jobs"), &body(true)).unwrap();
    assert_eq!((s, first["status"].as_str()), (200, Some("succeeded")), "{first}");
    // The inventory asked every isolated engine's worker what it can do; a worker whose
    // engine cannot run here (cuda without a GPU) answered and was closed, not kept.
    let engines = get(&a, &format!("{url}/v1/engines")).1;
    for e in engines["engines"].as_array().unwrap() {
        let name = e["engine"].as_str().unwrap();
        if ["ort", "openvino", "llvm", "cuda"].contains(&name) {
            let available = e["availability"]["status"] == "available";
            let alive = worker_pids(d.child.id(), name).len();
            assert_eq!(alive, usize::from(available), "{name} workers ({e})");
        }
    }
    // Submits the model without waiting; returns its id once it has run for a moment.
    let start_running = || {
        let (s, v) = post(&a, &format!("{url}/v1/jobs"), &body(false)).unwrap();
        assert_eq!(s, 202, "{v}");
        let id = v["run_id"].as_str().unwrap().to_string();
        let until = Instant::now() + Duration::from_secs(60);
        while get(&a, &format!("{url}/v1/runs/{id}")).1["status"] != "running" {
            assert!(Instant::now() < until, "the job starts");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(200));
        id
    };
    let ended = |id: &str| {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let v = get(&a, &format!("{url}/v1/runs/{id}")).1;
            if v["status"] != "running" {
                return v;
            }
            assert!(Instant::now() < until, "the job ends");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let id = start_running();
    let [pid] = worker_pids(d.child.id(), "ort")[..] else { panic!("one ort worker") };
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let v = ended(&id);
    assert_eq!(v["status"], "failed", "{v}");
    assert!(v["error"].as_str().unwrap().contains("engine ort crashed (SIGKILL)"), "{v}");
    assert_eq!(get(&a, &format!("{url}/healthz")).0, 200);
    let (s, again) = post(&a, &format!("{url}/v1/jobs"), &body(true)).unwrap();
    assert_eq!((s, again["status"].as_str()), (200, Some("succeeded")), "{again}");
    assert_eq!(again["outputs"][0]["sha256"], first["outputs"][0]["sha256"], "same result");
    let workers = worker_pids(d.child.id(), "ort");
    assert_ne!(workers, vec![pid], "a new worker");
    // A cancel mid-model reaches the run inside the worker (ORT's terminate): the job ends
    // cancelled and the worker lives on — no kill, no restart, nothing prepared again.
    let id = start_running();
    let status = a.post(&format!("{url}/v1/runs/{id}/cancel")).send_empty().unwrap().status();
    assert_eq!(status.as_u16(), 202, "accepted: the run stops at its next check");
    let v = ended(&id);
    assert_eq!(v["status"], "cancelled", "{v}");
    assert_eq!(worker_pids(d.child.id(), "ort"), workers, "the same worker");
    let restarts = "xpu_worker_restarts_total{cause=\"cancelled\",engine=\"ort\"}";
    assert_eq!(metric(&url, restarts), 0, "no worker restarted for the cancel");
    let (s, last) = post(&a, &format!("{url}/v1/jobs"), &body(true)).unwrap();
    assert_eq!((s, last["status"].as_str()), (200, Some("succeeded")), "{last}");
}

#[test]
fn xpuctl_asks_through_the_daemon_and_explains_accepts_and_counts() {
    use xpu_assistant::stand_in::{StandIn, reply};
    let dir = tempfile::tempdir().unwrap();
    let stand = StandIn::start(vec![
        reply("print load_csv(\"titanic.csv\") |> filter(Agee > 60)"),
        reply("print load_csv(\"titanic.csv\") |> filter(Age > 70) |> select([\"Name\"])\n"),
    ]);
    let d = Daemon::start(
        &dir.path().join("var"),
        &repo().join("policies/examples"),
        &[("XPU_ASSISTANT__ENDPOINT", stand.url.as_str()), ("XPU_ASSISTANT__MODEL", "tiny")],
    );
    let (ok, out) = xpuctl(
        &d.url,
        &["ask", "passengers over 70", "--from-server", "--data", "titanic.csv", "--run"],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("attempt 1: check failed: E0208") && out.contains("attempt 2: passed"),
        "{out}"
    );
    assert!(
        out.contains("Asplund, Mr. Lewis") && out.contains("Andersson"),
        "the run's printed table: {out}"
    );
    let (ok, out) = xpuctl(&d.url, &["search", "kind:ask passengers", "--format", "json"]);
    assert!(ok, "{out}");
    let hits: Value = serde_json::from_str(&out).unwrap();
    let id = hits[0]["run_id"].as_str().unwrap().to_string();
    assert_eq!(hits[0]["kind"], "ask", "{hits}");
    let (ok, out) = xpuctl(&d.url, &["explain", &id]);
    assert!(ok, "{out}");
    assert!(out.contains("asked:") && out.contains("Agee") && out.contains("E0208"), "{out}");
    let (ok, out) = xpuctl(&d.url, &["ask", "--accept", &id]);
    assert!(ok && out.contains("accepted"), "{out}");
    let (ok, out) = xpuctl(&d.url, &["ask", "stats", "--format", "json"]);
    assert!(ok, "{out}");
    let stats: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((stats[0]["asks"].as_u64(), stats[0]["first_check"].as_f64()), (Some(1), Some(0.0)));
    // Flags of a local ask are refused with --from-server (usage error).
    let (ok, out) = xpuctl(&d.url, &["ask", "q", "--from-server", "--endpoint", "http://x/v1"]);
    assert!(!ok && out.contains("--endpoint is for a local ask"), "{out}");
}

#[test]
fn an_ask_refused_while_the_daemons_asks_are_busy_is_sent_again() {
    use xpu_assistant::stand_in::{StandIn, reply};
    let dir = tempfile::tempdir().unwrap();
    let mut slow = reply("print 1\n");
    slow.delay = Duration::from_millis(1500);
    let stand = StandIn::start(vec![slow]);
    let d = Daemon::start(
        &dir.path().join("var"),
        &repo().join("policies/examples"),
        &[
            ("XPU_ASSISTANT__ENDPOINT", stand.url.as_str()),
            ("XPU_ASSISTANT__MODEL", "tiny"),
            ("XPU_LIMITS__ASKS_AT_ONCE", "1"),
        ],
    );
    let url = d.url.clone();
    let first = std::thread::spawn(move || xpuctl(&url, &["ask", "one", "--from-server"]));
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (ok, out) = xpuctl(&d.url, &["ask", "two", "--from-server"]);
    assert!(ok, "{out}");
    assert!(out.contains("too_many_asks") && out.contains("asking again"), "{out}");
    assert!(started.elapsed() >= Duration::from_secs(1), "it waited for the first");
    let (ok, out) = first.join().unwrap();
    assert!(ok, "{out}");
}
