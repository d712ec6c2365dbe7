//! `xpuctl evidence PROGRAM --policy P`: per node, the candidates the policy allows and the
//! figures its evidence (a lock, or xpud's store with `--from-server`) has for them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use xpu_ir::Op;
use xpu_plan::evidence::node_signature;
use xpu_policy::lock::{Evidence, Figure, Machine, SignatureFigure, micros};

use xpu_plan::ReasonCode;

use super::choose::units;
use super::{optimised, plan};

/// `xpuctl evidence PROGRAM --policy P`: per node, its candidates under the policy and the
/// figures the policy's lock has for its signature, and what the plan made of them.
pub fn evidence(
    program: &Path,
    policy: &str,
    bind: &[String],
    server: Option<&crate::client::Client>,
    json: bool,
) -> Result<()> {
    let policy = crate::policy_cmd::load_policy(Some(policy), &[])?;
    for w in &policy.warnings {
        eprintln!("{w}");
    }
    let g = Arc::new(crate::program::load(program)?);
    let bindings = crate::policy_cmd::parse_bindings(bind)?;
    let roots = xpu_runtime::program::data_roots_of(program);
    let registry = xpu_runtime::registry_for(roots.roots());
    let inventory = registry.inventory_for_engines(&g, policy.engines_it_may_place_on().as_ref());
    let optimised = optimised(&g, &policy);
    let (mut policy, mut notes) = (policy, Vec::new());
    let mut stored: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
    if server.is_some() && policy.spec.measured.lock.is_some() {
        notes.push("the policy names a lock, which xpud reads instead of its store".into());
    }
    if let Some(client) = server.filter(|_| policy.spec.measured.lock.is_none()) {
        // Every node's signature, from the graph the plan is made of (no plan needed).
        let sigs: Vec<String> = optimised
            .node_ids()
            .filter(|&id| optimised.node(id).op != Op::Constant)
            .map(|id| node_signature(&optimised, id, &bindings))
            .collect();
        let (machine, figures) = store_evidence(client, &sigs, &mut stored)?;
        // The machine as xpud fingerprints it: every engine of this build, not only those
        // the program could use.
        let here = Machine::of(&registry.inventory());
        if machine == here.fingerprint() {
            policy = policy.with_evidence(Arc::new(Evidence::from_store("store", here, figures)));
        } else {
            notes.push(format!(
                "xpud's machine ({machine}) is not this one ({}): its figures are shown, the plan is this machine's without them",
                here.fingerprint()
            ));
        }
    }
    let (_, ex) = plan(&g, &policy, &inventory, &bindings)?;
    let lock = policy.resolved().evidence.clone();
    let mut rows = Vec::new();
    for u in units(&optimised, &ex, &bindings, &inventory).0 {
        let d = &ex.decisions[u.node.index()];
        let entry = lock.as_ref().and_then(|e| e.node(&u.signature)).map(|(_, n)| n.clone());
        let store_rows = stored.get(&u.signature).cloned().unwrap_or_default();
        rows.push(serde_json::json!({
            "node": u.label,
            "op": u.op,
            "signature": u.signature,
            "operands": u.operands,
            "candidates": allowed_kernels(d),
            "chosen": d.chosen.as_ref().map(|c| c.kernel.to_string()),
            "rule": d.rule.as_ref().map(|r| r.key.to_string()),
            "winner": entry.as_ref().map(|n| n.winner.to_string()),
            "runner_up": entry.as_ref().and_then(|n| n.runner_up.as_ref().map(|r| r.to_string())),
            "evidence": d.measured.as_ref().map(|m| serde_json::json!({
                "code": m.code.map(|c| c.name()),
                "detail": m.detail,
            })),
            "store": server.map(|_| store_rows),
        }));
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    if json {
        let doc = serde_json::json!({ "evidence": ex.evidence, "nodes": rows, "notes": notes });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    match &ex.evidence {
        Some(e) => println!(
            "evidence: {}{}",
            e.describe(),
            e.unused.as_ref().map(|w| format!(", not used: {w}")).unwrap_or_default()
        ),
        None => println!(
            "evidence: none (the policy sets no [measured] lock, or chooses nothing by measurement)"
        ),
    }
    for r in &rows {
        let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
        println!("{} {} [{}] {}", s("node"), s("op"), s("signature"), s("operands"));
        let candidates: Vec<&str> =
            r["candidates"].as_array().into_iter().flatten().filter_map(|c| c.as_str()).collect();
        println!(
            "    candidates: {}; chosen {} by {}",
            candidates.join(", "),
            s("chosen"),
            s("rule")
        );
        if r["winner"].is_string() {
            let runner = r["runner_up"].as_str().map(|x| format!(" vs {x}")).unwrap_or_default();
            println!("    measured: {}{runner}", s("winner"));
        }
        for f in r["store"].as_array().into_iter().flatten() {
            println!(
                "    store: {} median {} p90 {} over {} run(s)",
                f["kernel"].as_str().unwrap_or("-"),
                micros(f["median_us"].as_f64().unwrap_or(0.0)),
                micros(f["p90_us"].as_f64().unwrap_or(0.0)),
                f["samples"].as_u64().unwrap_or(0)
            );
        }
        if let Some(code) = r["evidence"]["code"].as_str() {
            println!("    {code}: {}", r["evidence"]["detail"].as_str().unwrap_or(""));
        }
    }
    Ok(())
}

/// The figures xpud's store holds for `signatures`: its machine's fingerprint, the figures
/// as evidence, and per signature the rows as it sent them (for printing).
fn store_evidence(
    client: &crate::client::Client,
    signatures: &[String],
    rows_by_signature: &mut BTreeMap<String, Vec<serde_json::Value>>,
) -> Result<(String, Vec<SignatureFigure>)> {
    let mut distinct: Vec<&String> = signatures.iter().collect();
    distinct.sort();
    distinct.dedup();
    let list = distinct.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",");
    let doc = client.get_query("/v1/evidence", &[("signatures", list)])?;
    let machine = doc["machine"].as_str().unwrap_or_default().to_string();
    let mut figures = Vec::new();
    for r in doc["rows"].as_array().into_iter().flatten() {
        let text = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        rows_by_signature.entry(text("signature")).or_default().push(r.clone());
        figures.push(SignatureFigure {
            signature: text("signature"),
            figure: Figure {
                engine: text("engine"),
                kernel: text("kernel"),
                median_us: r["median_us"].as_f64().unwrap_or(0.0),
                samples: r["samples"].as_u64().unwrap_or(0).min(u64::from(u32::MAX)) as u32,
            },
        });
    }
    Ok((machine, figures))
}

/// Every kernel the policy allows for a decided node, the chosen one first: those the walk
/// set aside only by the order, by measurement or to explore — kernels of one engine too
/// (what measured choice compares, and `tune` measures).
pub(super) fn allowed_kernels(d: &xpu_plan::Decision) -> Vec<String> {
    let mut out: Vec<String> = d.chosen.iter().map(|c| c.kernel.to_string()).collect();
    for r in d.rejected.iter() {
        let allowed = matches!(
            r.code,
            ReasonCode::Outranked
                | ReasonCode::KernelDegraded
                | ReasonCode::MeasuredSlower
                | ReasonCode::Exploring
        );
        if let (true, Some(k)) = (allowed, &r.kernel)
            && !out.contains(k)
        {
            out.push(k.clone());
        }
    }
    out
}
