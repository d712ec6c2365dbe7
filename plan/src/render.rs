//! Text rendering of an explanation: the plan table `xpuctl policy resolve` and
//! `xpuctl run --explain` print, and the golden plan files compare.

use std::fmt::Write;

use crate::model::{Decision, Explanation};

fn short(h: &str) -> &str {
    &h[..h.len().min(12)]
}

/// One decision as a sentence, for search indexes and logs: what ran the node, which policy
/// key chose it, any fallback and every rejected candidate with its reason code.
pub fn decision_sentence(d: &crate::model::Decision) -> String {
    let name = d.name.as_deref().map(|n| format!(" {n}")).unwrap_or_default();
    let mut s = match &d.chosen {
        Some(c) => format!(
            "node {}{name} ({}) ran on {} kernel {}{}",
            d.node,
            d.op,
            c.engine,
            c.kernel,
            c.precision.map(|p| format!(" at {p}")).unwrap_or_default()
        ),
        None => format!("node {}{name} ({}) could not be placed", d.node, d.op),
    };
    if let Some(r) = &d.rule {
        let _ = write!(s, ", chosen by {}", r.key);
        if let Some(at) = &r.at {
            let _ = write!(s, " ({at})");
        }
    }
    if let Some(f) = &d.fallback {
        let _ = write!(s, "; fallback from {}: {} {}", f.from, f.code.name(), f.detail);
    }
    for r in d.rejected.iter() {
        let what = r.kernel.as_deref().unwrap_or(&r.engine);
        let _ = write!(s, "; rejected {what}: {} {}", r.code.name(), r.detail);
    }
    s
}

/// Renders the plan table; with `why`, every rejected candidate under its node.
pub fn explanation_text(ex: &Explanation, why: bool) -> String {
    let mut s = String::new();
    write_header(&mut s, ex);
    write_decisions(&mut s, ex, why);
    write_missing_kernels(&mut s, ex);
    write_plan_notes(&mut s, ex);
    write_run(&mut s, ex);
    s
}

/// The graph, policy and inventory the plan is of, and the passes run before planning.
fn write_header(s: &mut String, ex: &Explanation) {
    let _ = writeln!(
        s,
        "graph {:?} ({}) · policy {} v{} ({}) · inventory {} ({})",
        ex.graph_name,
        short(&ex.graph_hash),
        ex.policy.name,
        ex.policy.version,
        short(&ex.policy.sha256),
        if ex.inventory.name.is_empty() { "-" } else { &ex.inventory.name },
        ex.inventory.fingerprint
    );
    if let Some(e) = &ex.evidence {
        let unused = e.unused.as_ref().map(|w| format!(", not used: {w}")).unwrap_or_default();
        let _ = writeln!(s, "evidence: {}{unused}", e.describe());
    }
    if !ex.passes.is_empty() {
        let passes: Vec<String> =
            ex.passes.iter().map(|p| format!("{} ({})", p.pass, p.summary)).collect();
        let _ = writeln!(s, "passes: {}", passes.join(", "));
    }
}

/// One table row per node (constants counted, unless `why`), with `why` the precision's
/// source and every rejected candidate under it.
fn write_decisions(s: &mut String, ex: &Explanation, why: bool) {
    let header = ["node", "op", "engine", "kernel", "precision", "rule"];
    let mut rows: Vec<[String; 6]> = Vec::new();
    let mut details: Vec<Vec<String>> = Vec::new();
    let mut constants = 0;
    for d in &ex.decisions {
        if d.op == "constant" && !why {
            constants += 1;
            continue;
        }
        rows.push(decision_row(d));
        details.push(if why { decision_details(d) } else { Vec::new() });
    }
    let mut widths = header.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ", w = widths[i]);
            }
        }
        l.trim_end().to_string()
    };
    let _ = writeln!(s, "{}", line(&header.map(String::from)));
    for (r, d) in rows.iter().zip(&details) {
        let _ = writeln!(s, "{}", line(r));
        for l in d {
            let _ = writeln!(s, "    {l}");
        }
    }
    if constants > 0 {
        let _ = writeln!(s, "({constants} constants are embedded in their consumers' partitions)");
    }
}

fn decision_row(d: &Decision) -> [String; 6] {
    let name = match &d.name {
        Some(n) => format!("{} {n}", d.node),
        None => d.node.to_string(),
    };
    let (engine, kernel, precision) = match &d.chosen {
        Some(c) => (
            c.engine.to_string(),
            c.kernel.to_string(),
            c.precision.map_or("-", |p| p.name()).to_string(),
        ),
        None => ("UNPLACED".into(), "-".into(), "-".into()),
    };
    let mut rule = match &d.rule {
        Some(r) => match &r.at {
            Some(at) => format!("{} ({at})", r.key),
            None => r.key.to_string(),
        },
        None => "-".into(),
    };
    if let Some(f) = &d.fallback {
        rule = format!("{rule}; fallback from {}: {}", f.from, f.code.name());
    }
    [name, d.op.to_string(), engine, kernel, precision, rule]
}

fn decision_details(d: &Decision) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(p) = &d.precision_from {
        lines.push(format!(
            "precision from {}{}",
            p.key,
            p.at.as_ref().map(|a| format!(" ({a})")).unwrap_or_default()
        ));
    }
    if let Some(m) = &d.measured {
        let how = m
            .code
            .map_or("decided".to_string(), |c| format!("{} (the static order decided)", c.name()));
        lines.push(format!("evidence: {how} — {}", m.detail));
    }
    for r in d.rejected.iter() {
        let what = match &r.kernel {
            Some(k) => k.clone(),
            None => r.engine.clone(),
        };
        let at = match (&r.key, &r.at) {
            (Some(k), Some(a)) => format!(" ({k}, {a})"),
            (Some(k), None) => format!(" ({k})"),
            (None, Some(a)) => format!(" ({a})"),
            (None, None) => String::new(),
        };
        lines.push(format!("rejected {what}: {} — {}{at}", r.code.name(), r.detail));
    }
    lines
}

/// Kernels the policy asked for that this machine lacks, once each, with what ran instead
/// (the per-node detail is under --why).
fn write_missing_kernels(s: &mut String, ex: &Explanation) {
    let mut missing: Vec<(String, String, Vec<String>)> = Vec::new();
    for d in &ex.decisions {
        for r in d.rejected.iter().filter(|r| r.code == crate::ReasonCode::KernelUnavailable) {
            let what = r.kernel.clone().unwrap_or_else(|| r.engine.clone());
            let instead = match &d.chosen {
                Some(c) => format!("{} on {}", d.node, c.kernel),
                None => format!("{} unplaced", d.node),
            };
            match missing.iter_mut().find(|(w, det, _)| *w == what && *det == r.detail) {
                Some((_, _, nodes)) => nodes.push(instead),
                None => missing.push((what, r.detail.clone(), vec![instead])),
            }
        }
    }
    for (_, detail, nodes) in &missing {
        let shown: Vec<&str> = nodes.iter().take(6).map(String::as_str).collect();
        let more =
            if nodes.len() > 6 { format!(", … ({} nodes)", nodes.len()) } else { String::new() };
        let _ = writeln!(s, "not used: {detail}; instead {}{more}", shown.join(", "));
    }
}

/// Casts, fusion groups, transfers, memory, fallbacks and the plan's notes.
fn write_plan_notes(s: &mut String, ex: &Explanation) {
    for c in &ex.casts {
        let target = match c.for_node {
            Some(n) => format!("for {n}"),
            None => "at the output".to_string(),
        };
        let how = if c.folded { " (constant, converted at plan time)" } else { "" };
        let _ = writeln!(s, "cast {} -> {} {target}{how}: {}", c.from, c.to, c.reason);
    }
    for g in &ex.groups {
        match (&g.whole, &g.split) {
            (Some((engine, kernels, partition)), _) => {
                let _ = writeln!(
                    s,
                    "fusion group {} ({} nodes): whole on {engine} ({kernels}), partition {partition}",
                    g.group,
                    g.nodes.len()
                );
            }
            (None, Some((code, detail))) => {
                let _ = writeln!(
                    s,
                    "fusion group {} ({} nodes): split ({}): {detail}",
                    g.group,
                    g.nodes.len(),
                    code.name()
                );
            }
            (None, None) => {}
        }
    }
    for t in &ex.transfers {
        let bytes = t.bytes.map(|b| format!("{b} bytes")).unwrap_or_else(|| "unknown size".into());
        let _ = writeln!(
            s,
            "transfer {} {} {} -> {} ({bytes}): {}",
            t.value, t.direction, t.from_device, t.to_device, t.reason
        );
    }
    let m = &ex.memory;
    if m.peak_bytes.is_some() || m.limit_bytes.is_some() {
        let peak = m.peak_bytes.map(|b| format!("{b} bytes")).unwrap_or_else(|| "unknown".into());
        let limit = m.limit_bytes.map(|b| format!(", limit {b} bytes")).unwrap_or_default();
        // The arena the memory plan needs (what an engine executing the plan holds at most:
        // compare the cpu engine's memory.peak_held_bytes fact).
        let arena =
            m.peak_bytes.map(|_| format!(", arena {} bytes", m.arena_bytes)).unwrap_or_default();
        let _ = writeln!(s, "memory: peak {peak} live{arena}{limit}");
    }
    let fb = ex.fallbacks();
    if fb > 0 {
        let _ = writeln!(s, "fallbacks: {fb} node(s)");
    }
    for (label, notes) in
        [("setting", &ex.settings), ("warning", &ex.warnings), ("error", &ex.errors)]
    {
        for n in notes {
            let at = n.at.as_ref().map(|a| format!(" ({a})")).unwrap_or_default();
            let _ = writeln!(s, "{label} {}: {}{at}", n.code.name(), n.message);
        }
    }
}

/// What a run measured: engine facts, prepare outcomes, transfers performed and timings.
fn write_run(s: &mut String, ex: &Explanation) {
    for f in &ex.facts {
        let node = f.node.map(|n| format!(" {n}")).unwrap_or_default();
        let _ = writeln!(s, "fact {}{node}: {} = {}", f.engine, f.key, f.value);
    }
    for p in &ex.prepared {
        let _ = writeln!(
            s,
            "partition {} ({}): {} (prepare {:.3} ms)",
            p.partition,
            p.engine,
            p.outcome.name(),
            p.prepare_nanos as f64 / 1e6
        );
    }
    for t in &ex.transfers_done {
        let how = match t.nanos {
            Some(ns) => format!("in {:.3} ms by {}", ns as f64 / 1e6, t.by),
            None => format!("inside {}'s run", t.by),
        };
        let pinned = if t.pinned_host { " through pinned host memory" } else { "" };
        let _ = writeln!(
            s,
            "moved {} {} {} -> {}: {} bytes {how}{pinned}",
            t.value, t.direction, t.from_device, t.to_device, t.bytes
        );
    }
    if !ex.timings.is_empty() {
        let total: u64 = ex.timings.iter().map(|t| t.nanos).sum();
        let _ = writeln!(
            s,
            "ran {} nodes in {:.3} ms of kernel time",
            ex.timings.len(),
            total as f64 / 1e6
        );
    }
}
