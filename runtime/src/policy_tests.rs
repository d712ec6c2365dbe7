//! A policy's `[[test]]` blocks run: each test's program planned under the policy on its
//! inventory, and its expectations (placements, no fallback, transfers, peak memory, an
//! expected failure code) checked. `xpuctl policy test` and `xpu.Policy.test()` share it.

use std::path::{Path, PathBuf};

use xpu_policy::Policy;

/// One `[[test]]` block's result: `failures` empty when it passed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// The policy file the test is in.
    pub file: PathBuf,
    /// Its `name`, else `test[i]`.
    pub name: String,
    /// What did not hold, one sentence each.
    pub failures: Vec<String>,
}

/// Runs every `[[test]]` block of `policy`, loaded from `file` (programs and inventories
/// are relative to its directory).
pub fn run(policy: &Policy, file: &Path) -> Vec<Outcome> {
    (0..policy.spec.tests.len())
        .map(|i| Outcome {
            file: file.to_path_buf(),
            name: policy.spec.tests[i].name.clone().unwrap_or_else(|| format!("test[{i}]")),
            failures: run_one(policy, file, i),
        })
        .collect()
}

fn glob_match(pattern: &str, name: Option<&str>) -> bool {
    match (globset::Glob::new(pattern), name) {
        (Ok(g), Some(n)) => g.compile_matcher().is_match(n),
        _ => false,
    }
}

fn run_one(policy: &Policy, file: &Path, i: usize) -> Vec<String> {
    let t = &policy.spec.tests[i];
    let dir = file.parent().unwrap_or(Path::new("."));
    let graph = match crate::program::load(&dir.join(&t.program)) {
        Ok(g) => g,
        Err(e) => return vec![format!("program: {e:#}")],
    };
    let inv_path = dir.join(&t.inventory);
    let inv = match xpu_policy::load_inventory(&inv_path) {
        Ok(i) => i,
        Err(e) => return vec![format!("inventory: {e}")],
    };
    let result = crate::plan_graph(&graph, policy, &inv, &t.bind);
    let mut failures = Vec::new();
    if let Some(code) = &t.expect_error {
        match &result {
            Ok(_) => {
                failures.push(format!("expected the plan to fail with {code}, but it succeeded"))
            }
            Err(f) => {
                let found = f.errors.iter().any(|e| e.code.name() == code)
                    || f.explanation
                        .decisions
                        .iter()
                        .filter(|d| d.chosen.is_none())
                        .any(|d| d.rejected.iter().any(|r| r.code.name() == code));
                if !found {
                    failures.push(format!("expected failure {code}, got: {f}"));
                }
            }
        }
        return failures;
    }
    let (plan, ex) = match result {
        Ok(p) => p,
        Err(f) => return vec![format!("the plan failed: {f}")],
    };
    for (j, e) in t.expect.iter().enumerate() {
        let selected: Vec<_> = ex
            .decisions
            .iter()
            .filter(|d| {
                e.op.as_ref().is_none_or(|o| &d.op == o)
                    && e.class.as_ref().is_none_or(|c| &d.class == c)
                    && e.node.as_ref().is_none_or(|n| glob_match(n, d.name.as_deref()))
            })
            .collect();
        if selected.is_empty() {
            failures.push(format!("expect[{j}] selects no node of {}", t.program));
        }
        for d in selected {
            let c = d.chosen.as_ref().expect("successful plans place every node");
            let label = format!(
                "{} ({}{})",
                d.node,
                d.op,
                d.name.as_ref().map(|n| format!(" {n:?}")).unwrap_or_default()
            );
            if let Some(en) = &e.engine
                && *c.engine != **en
            {
                failures.push(format!("{label}: engine {} , expected {en}", c.engine));
            }
            if let Some(k) = &e.kernel
                && *c.kernel != **k
            {
                failures.push(format!("{label}: kernel {}, expected {k}", c.kernel));
            }
            if let Some(p) = e.precision
                && c.precision != Some(p)
            {
                failures.push(format!(
                    "{label}: precision {}, expected {p}",
                    c.precision.map_or("-", |p| p.name())
                ));
            }
        }
    }
    if t.no_fallback {
        for d in ex.decisions.iter().filter(|d| d.fallback.is_some()) {
            let f = d.fallback.as_ref().expect("filtered");
            failures.push(format!(
                "{} ({}) fell back from {}: {} {}",
                d.node,
                d.op,
                f.from,
                f.code.name(),
                f.detail
            ));
        }
    }
    if let Some(max) = t.max_transfers
        && plan.transfers.len() > max
    {
        failures.push(format!("{} transfers, at most {max} allowed", plan.transfers.len()));
    }
    if let Some(max) = t.max_peak_memory {
        match plan.memory.peak_bytes {
            Some(p) if p > max.0 => failures.push(format!("peak memory {p} bytes exceeds {max}")),
            None => {
                failures.push("peak memory is unknown (bind the dynamic dims with `bind`)".into())
            }
            _ => {}
        }
    }
    failures
}
