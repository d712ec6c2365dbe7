//! `xpuctl policy check|test|resolve|diff`: policies in CI. `check` validates files
//! (structure, and against an inventory when given); `test` runs every `[[test]]` placement
//! assertion; `resolve` prints the plan a policy gives a program; `diff` shows which node
//! decisions change between two versions of a policy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use xpu_engine::Inventory;
use xpu_plan::{Explanation, ReasonCode};
use xpu_policy::{Diagnostic, Loader, Policy};

use crate::program;

/// Expands directories into their `*.toml` files (sorted), keeping files as given.
pub fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("cannot list {}", p.display()))?
                .flatten()
                .map(|e| e.path())
                .filter(|f| xpu_policy::lock::is_policy_file(f))
                .collect();
            files.sort();
            out.extend(files);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Where policies are found by name or by labels: `XPU_POLICY_PATH` (colon-separated
/// directories), then `policies/examples`.
fn policy_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("XPU_POLICY_PATH")
        .map(|v| v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect())
        .unwrap_or_default();
    dirs.push(PathBuf::from("policies/examples"));
    dirs
}

/// The policy for `--policy FILE|NAME`: a file path, or a name looked up in the policy dirs.
pub fn resolve_policy_path(arg: &str) -> Result<PathBuf> {
    let p = PathBuf::from(arg);
    if p.is_file() {
        return Ok(p);
    }
    let dirs = policy_dirs();
    for d in &dirs {
        let f = d.join(format!("{arg}.toml"));
        if f.is_file() {
            return Ok(f);
        }
    }
    Err(anyhow!(
        "policy {arg:?}: no such file, and no {arg}.toml in {}",
        dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    ))
}

pub fn loader(overrides: &[String]) -> Result<Loader> {
    let mut l = Loader::new().with_process_env();
    for o in overrides {
        let (k, v) = o
            .split_once('=')
            .ok_or_else(|| crate::usage(format!("--set {o:?}: expected KEY=VALUE")))?;
        l = l.with_override(k.trim(), v.trim());
    }
    Ok(l)
}

/// The policy a job with `labels` gets among every policy in the policy dirs: the most
/// specific `match.labels` wins, then `priority` (see `xpu_policy::select`).
pub fn select_policy(labels: &[String], overrides: &[String]) -> Result<Policy> {
    let mut wanted = std::collections::BTreeMap::new();
    for kv in labels {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| crate::usage(format!("--label {kv:?}: expected KEY=VALUE")))?;
        wanted.insert(k.to_string(), v.to_string());
    }
    let l = loader(overrides)?;
    let mut policies = Vec::new();
    for dir in policy_dirs().iter().filter(|d| d.is_dir()) {
        for f in expand(std::slice::from_ref(dir))? {
            // An invalid policy never wins silently: it is an error.
            policies.push(l.load(&f).map_err(|d| anyhow!("{d}"))?);
        }
    }
    xpu_policy::select(&policies, &wanted).cloned().ok_or_else(|| {
        anyhow!(
            "no policy in {} matches labels {}",
            policy_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            labels.join(", ")
        )
    })
}

pub fn load_policy(arg: Option<&str>, overrides: &[String]) -> Result<Policy> {
    let l = loader(overrides)?;
    match arg {
        Some(a) => {
            let path = resolve_policy_path(a)?;
            l.load(&path).map_err(|d| anyhow!("{d}"))
        }
        None => l
            .load_text("built-in default policy", None, "[policy]\nname = \"default\"\n")
            .map_err(|d| anyhow!("{d}")),
    }
}

/// `--inventory FILE`, `--inventory live`, or the live inventory when absent.
pub fn load_inventory(arg: Option<&Path>) -> Result<Inventory> {
    match arg {
        None => Ok(crate::registry().inventory()),
        Some(p) if p == Path::new("live") => Ok(crate::registry().inventory()),
        Some(p) => {
            let inv = xpu_policy::load_inventory(p).map_err(|d| anyhow!("{d}"))?;
            for note in &inv.notes {
                eprintln!("note: {}: {note}", p.display());
            }
            Ok(inv)
        }
    }
}

pub fn parse_bindings(bind: &[String]) -> Result<BTreeMap<String, u64>> {
    let mut b = BTreeMap::new();
    for kv in bind {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| crate::usage(format!("--bind {kv:?}: expected NAME=SIZE")))?;
        let v: u64 = v.parse().map_err(|_| {
            crate::usage(format!("--bind {kv:?}: SIZE must be a non-negative integer"))
        })?;
        b.insert(k.to_string(), v);
    }
    Ok(b)
}

// ---------------------------------------------------------------- check

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
    Junit,
}

struct FileReport {
    file: PathBuf,
    diagnostics: Vec<Diagnostic>,
}

pub fn check(paths: &[PathBuf], inventory: Option<&Path>, format: ReportFormat) -> Result<bool> {
    let files = expand(paths)?;
    if files.is_empty() {
        return Err(crate::usage("no policy files given (or the directories hold no .toml)"));
    }
    let inv = match inventory {
        Some(p) => Some((load_inventory(Some(p))?, p.display().to_string())),
        None => None,
    };
    let mut reports = Vec::new();
    for f in &files {
        let mut diagnostics = match Loader::new().load(f) {
            Ok(policy) => {
                let mut d = policy.warnings.clone();
                d.extend(referenced_files(&policy, f));
                if let Some((inv, name)) = &inv {
                    let label = if inv.name.is_empty() { name.clone() } else { inv.name.clone() };
                    d.extend(xpu_policy::validate::contextual(&policy, inv, &label));
                }
                d
            }
            Err(e) => e.0,
        };
        diagnostics.sort_by(|a, b| (a.severity, &a.at).cmp(&(b.severity, &b.at)));
        reports.push(FileReport { file: f.clone(), diagnostics });
    }
    let errors: usize =
        reports.iter().map(|r| r.diagnostics.iter().filter(|d| d.is_error()).count()).sum();
    match format {
        ReportFormat::Text => {
            for r in &reports {
                for d in &r.diagnostics {
                    println!("{d}");
                }
                let n_err = r.diagnostics.iter().filter(|d| d.is_error()).count();
                let n_warn = r.diagnostics.len() - n_err;
                println!(
                    "{}: {}",
                    r.file.display(),
                    if n_err == 0 && n_warn == 0 {
                        "ok".to_string()
                    } else {
                        format!("{n_err} error(s), {n_warn} warning(s)")
                    }
                );
            }
        }
        ReportFormat::Json => {
            let files: Vec<_> = reports
                .iter()
                .map(|r| serde_json::json!({"file": r.file, "ok": !r.diagnostics.iter().any(|d| d.is_error()), "diagnostics": r.diagnostics}))
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"ok": errors == 0, "files": files})
                )?
            );
        }
        ReportFormat::Junit => {
            let mut report = quick_junit::Report::new("xpuctl policy check");
            let mut suite = quick_junit::TestSuite::new("policy check");
            for r in &reports {
                let errs: Vec<&Diagnostic> =
                    r.diagnostics.iter().filter(|d| d.is_error()).collect();
                let status = if errs.is_empty() {
                    quick_junit::TestCaseStatus::success()
                } else {
                    let mut s = quick_junit::TestCaseStatus::non_success(
                        quick_junit::NonSuccessKind::Failure,
                    );
                    s.set_message(format!("{} error(s)", errs.len()));
                    s.set_description(
                        errs.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("\n"),
                    );
                    s
                };
                suite.add_test_case(quick_junit::TestCase::new(
                    r.file.display().to_string(),
                    status,
                ));
            }
            report.add_test_suite(suite);
            println!("{}", report.to_string().map_err(|e| anyhow!("junit: {e}"))?);
        }
    }
    Ok(errors == 0)
}

/// `[[test]]` programs and inventories must exist.
fn referenced_files(policy: &Policy, file: &Path) -> Vec<Diagnostic> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for (i, t) in policy.spec.tests.iter().enumerate() {
        for (key, rel) in [("program", &t.program), ("inventory", &t.inventory)] {
            if !dir.join(rel).is_file() {
                out.push(
                    Diagnostic::error(
                        "P0012",
                        policy.origin(&format!("test[{i}].{key}")),
                        format!(
                            "test {key} {rel:?} does not exist (relative to {})",
                            dir.display()
                        ),
                    )
                    .with_key(format!("test[{i}].{key}")),
                );
            }
        }
        if let Some(code) = &t.expect_error
            && ReasonCode::from_name(code).is_none()
        {
            out.push(
                Diagnostic::error(
                    "P0010",
                    policy.origin(&format!("test[{i}].expect_error")),
                    format!("unknown reason code `{code}`"),
                )
                .with_help(xpu_policy::diag::did_you_mean(
                    code,
                    ReasonCode::ALL.iter().map(|c| c.name()),
                ))
                .with_key(format!("test[{i}].expect_error")),
            );
        }
    }
    out
}

// ---------------------------------------------------------------- test

pub fn test(paths: &[PathBuf], format: ReportFormat) -> Result<bool> {
    let files = expand(paths)?;
    let mut outcomes = Vec::new();
    for f in &files {
        let policy = match Loader::new().load(f) {
            Ok(p) => p,
            Err(e) => {
                outcomes.push(xpu_runtime::policy_tests::Outcome {
                    file: f.clone(),
                    name: "load".into(),
                    failures: e.0.iter().map(|d| d.to_string()).collect(),
                });
                continue;
            }
        };
        outcomes.extend(xpu_runtime::policy_tests::run(&policy, f));
    }
    let failed = outcomes.iter().filter(|o| !o.failures.is_empty()).count();
    match format {
        ReportFormat::Json => {
            let tests: Vec<_> = outcomes
                .iter()
                .map(|o| serde_json::json!({"file": o.file, "name": o.name, "ok": o.failures.is_empty(), "failures": o.failures}))
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"passed": outcomes.len() - failed, "failed": failed, "tests": tests})
                )?
            );
        }
        ReportFormat::Text => {
            for o in &outcomes {
                if o.failures.is_empty() {
                    println!("PASS {} {}", o.file.display(), o.name);
                } else {
                    println!("FAIL {} {}", o.file.display(), o.name);
                    for f in &o.failures {
                        println!("    {f}");
                    }
                }
            }
            println!("{} passed, {failed} failed", outcomes.len() - failed);
        }
        ReportFormat::Junit => {
            let mut report = quick_junit::Report::new("xpuctl policy test");
            let mut suite = quick_junit::TestSuite::new("policy test");
            for o in &outcomes {
                let status = if o.failures.is_empty() {
                    quick_junit::TestCaseStatus::success()
                } else {
                    let mut s = quick_junit::TestCaseStatus::non_success(
                        quick_junit::NonSuccessKind::Failure,
                    );
                    s.set_message(o.failures[0].clone());
                    s.set_description(o.failures.join("\n"));
                    s
                };
                let mut case = quick_junit::TestCase::new(o.name.clone(), status);
                case.set_classname(o.file.display().to_string());
                suite.add_test_case(case);
            }
            report.add_test_suite(suite);
            println!("{}", report.to_string().map_err(|e| anyhow!("junit: {e}"))?);
        }
    }
    if outcomes.is_empty() {
        eprintln!("note: no [[test]] blocks found");
    }
    Ok(failed == 0)
}

// ---------------------------------------------------------------- resolve

pub fn resolve(
    policy: &str,
    program_path: &Path,
    inventory: Option<&Path>,
    bind: &[String],
    overrides: &[String],
    json: bool,
    why: bool,
    plan_out: Option<&Path>,
) -> Result<bool> {
    let policy = load_policy(Some(policy), overrides)?;
    let inv = load_inventory(inventory)?;
    let graph = program::load(program_path)?;
    let bindings = parse_bindings(bind)?;
    let (ok, ex) = match xpu_runtime::plan_graph(&graph, &policy, &inv, &bindings) {
        Ok((plan, ex)) => {
            if let Some(path) = plan_out {
                let frozen = xpu_plan::FrozenPlan {
                    version: xpu_plan::FrozenPlan::VERSION,
                    plan,
                    explanation: ex.clone(),
                };
                std::fs::write(path, frozen.to_json())
                    .with_context(|| format!("cannot write {}", path.display()))?;
                eprintln!("wrote the plan to {}", path.display());
            }
            (true, ex)
        }
        Err(f) => (false, *f.explanation),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&resolve_json(&ex, ok))?);
    } else {
        print!("{}", xpu_plan::render::explanation_text(&ex, why));
        if !ok {
            eprintln!("error: the plan failed ({} error(s))", ex.errors.len());
        }
    }
    Ok(ok)
}

/// The documented JSON shape of `policy resolve --format json`.
fn resolve_json(ex: &Explanation, ok: bool) -> serde_json::Value {
    let nodes: Vec<_> = ex
        .decisions
        .iter()
        .map(|d| {
            let c = d.chosen.as_ref();
            serde_json::json!({
                "node": d.node.to_string(),
                "name": d.name,
                "op": d.op,
                "class": d.class,
                "engine": c.map(|c| &c.engine),
                "kernel": c.map(|c| &c.kernel),
                "precision": c.and_then(|c| c.precision.as_ref()),
                "device": c.map(|c| &c.device),
                "rule": d.rule.as_ref().map(|r| &r.key),
                "rule_at": d.rule.as_ref().and_then(|r| r.at.as_ref()),
                "fallback": d.fallback,
                "flops": d.flops,
                "rejected": d.rejected.iter().map(|r| serde_json::json!({
                    "engine": r.engine, "kernel": r.kernel, "code": r.code.name(), "detail": r.detail, "key": r.key, "at": r.at,
                })).collect::<Vec<_>>(),
                "measured": d.measured.as_ref().map(|m| serde_json::json!({
                    "code": m.code.map(|c| c.name()), "detail": m.detail,
                })),
            })
        })
        .collect();
    serde_json::json!({
        "ok": ok,
        "graph": ex.graph_name,
        "graph_hash": ex.graph_hash,
        "policy": ex.policy,
        "inventory": ex.inventory,
        "evidence": ex.evidence,
        "nodes": nodes,
        "casts": ex.casts,
        "transfers": ex.transfers,
        "memory": ex.memory,
        "warnings": ex.warnings,
        "errors": ex.errors,
    })
}

// ---------------------------------------------------------------- diff

pub fn diff(
    old: &Path,
    new: &Path,
    programs: &[PathBuf],
    inventory: Option<&Path>,
    fail_on_change: bool,
    json: bool,
) -> Result<bool> {
    let old_p = Loader::new().load(old).map_err(|d| anyhow!("{d}"))?;
    let new_p = Loader::new().load(new).map_err(|d| anyhow!("{d}"))?;
    let inv = load_inventory(inventory)?;
    let mut changes = Vec::new();
    let mut total = 0;
    let describe = |d: &xpu_plan::Decision| match &d.chosen {
        Some(c) => format!("{}/{}/{}", c.engine, c.kernel, c.precision.map_or("-", |p| p.name())),
        None => "UNPLACED".to_string(),
    };
    for prog in programs {
        let g = program::load(prog)?;
        let a = xpu_runtime::plan_graph(&g, &old_p, &inv, &Default::default())
            .map(|p| p.1)
            .unwrap_or_else(|f| *f.explanation);
        let b = xpu_runtime::plan_graph(&g, &new_p, &inv, &Default::default())
            .map(|p| p.1)
            .unwrap_or_else(|f| *f.explanation);
        for (x, y) in a.decisions.iter().zip(&b.decisions) {
            if x.op == "constant" {
                continue;
            }
            total += 1;
            let (dx, dy) = (describe(x), describe(y));
            if dx != dy {
                changes.push(serde_json::json!({
                    "program": prog, "node": x.node.to_string(), "name": x.name, "op": x.op,
                    "old": dx, "new": dy,
                    "old_rule": x.rule.as_ref().map(|r| &r.key), "new_rule": y.rule.as_ref().map(|r| &r.key),
                }));
            }
        }
        for (label, ex) in [("old", &a), ("new", &b)] {
            for e in &ex.errors {
                changes.push(serde_json::json!({"program": prog, "plan": label, "error": e.code.name(), "message": e.message}));
            }
        }
    }
    // The evidence each reads (a lock `xpuctl tune` rewrote moves measured choices).
    let lock = |p: &xpu_policy::Policy| {
        p.resolved().evidence.as_ref().map(|e| format!("{} ({})", e.source, e.sha256))
    };
    let (old_lock, new_lock) = (lock(&old_p), lock(&new_p));
    if json {
        let doc = serde_json::json!({
            "nodes": total,
            "changes": changes,
            "evidence": { "old": old_lock, "new": new_lock },
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        if old_lock != new_lock {
            let show = |l: &Option<String>| l.clone().unwrap_or_else(|| "none".into());
            println!("evidence: {} -> {}", show(&old_lock), show(&new_lock));
        }
        for c in &changes {
            if let Some(err) = c.get("error") {
                println!(
                    "{} [{} plan] fails: {} {}",
                    c["program"].as_str().unwrap_or(""),
                    c["plan"].as_str().unwrap_or(""),
                    err.as_str().unwrap_or(""),
                    c["message"].as_str().unwrap_or("")
                );
                continue;
            }
            println!(
                "{} {} {}{}: {} -> {}  (rule: {} -> {})",
                c["program"].as_str().unwrap_or(""),
                c["node"].as_str().unwrap_or(""),
                c["op"].as_str().unwrap_or(""),
                c["name"].as_str().map(|n| format!(" {n:?}")).unwrap_or_default(),
                c["old"].as_str().unwrap_or(""),
                c["new"].as_str().unwrap_or(""),
                c["old_rule"].as_str().unwrap_or("-"),
                c["new_rule"].as_str().unwrap_or("-"),
            );
        }
        println!(
            "{} of {total} node decisions change",
            changes.iter().filter(|c| c.get("error").is_none()).count()
        );
    }
    Ok(!fail_on_change || changes.is_empty())
}
