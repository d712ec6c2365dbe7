//! Policies as code: the TOML policy format ([`spec`]), layered loading with figment and
//! per-key origins ([`load`]), structural and inventory validation with located
//! diagnostics ([`validate`], [`diag`]), choosing a policy for a job by its labels
//! ([`select`]), and the policy JSON Schema. The loader also resolves every policy once
//! into the typed form the planner (xpu-plan) reads ([`resolved`]: ops, classes, dtypes,
//! kernels and cited keys); engines never see a policy.

pub mod diag;
pub mod load;
pub mod lock;
pub mod resolved;
pub mod spec;
pub mod validate;

pub use diag::{Diagnostic, Diagnostics, Origin, Severity};
pub use load::{Loader, Policy};
pub use lock::{Evidence, LockError, LockFile};
pub use resolved::{
    Cited, KernelPick, KernelSelection, Key, OpSet, ResolvedPolicy, ResolvedRule, Selector,
};
pub use spec::PolicySpec;

use std::collections::BTreeMap;

/// The JSON Schema of a policy file, generated from the Rust types.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(PolicySpec);
    let mut s = serde_json::to_string_pretty(&schema).expect("schema serializes");
    s.push('\n');
    s
}

/// The policy for a job with `labels`: among policies whose `match.labels` are all present
/// in the job's labels, the most specific (most labels) wins, then the highest priority,
/// then the name (so the choice is deterministic).
pub fn select<'a>(policies: &'a [Policy], labels: &BTreeMap<String, String>) -> Option<&'a Policy> {
    policies
        .iter()
        .filter(|p| p.spec.policy.matches.labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
        .max_by(|a, b| {
            let key = |p: &Policy| (p.spec.policy.matches.labels.len(), p.spec.policy.priority);
            key(a).cmp(&key(b)).then_with(|| b.name().cmp(a.name()))
        })
}

/// Loads an inventory file with located errors; an unnamed inventory is named after its file.
pub fn load_inventory(path: &std::path::Path) -> Result<xpu_engine::Inventory, Diagnostics> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Diagnostics(vec![Diagnostic::error(
            "P0201",
            Origin::source(path.display().to_string()),
            format!("cannot read the inventory: {e}"),
        )])
    })?;
    let mut inv = xpu_engine::Inventory::from_toml(&text).map_err(|e| {
        let (line, col) = e.location.unwrap_or((0, 0));
        Diagnostics(vec![
            Diagnostic::error(
                "P0201",
                Origin::new(path.display().to_string(), line, col),
                format!("invalid inventory: {}", e.message),
            )
            .with_help(
                diag::did_you_mean_from_message(&e.message)
                    .or_else(|| unknown_name_help(&e.message)),
            ),
        ])
    })?;
    if inv.name.is_empty() {
        inv.name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    }
    Ok(inv)
}

/// "unknown op `matmull`" → "did you mean `matmul`?" over op, op class and dtype names.
fn unknown_name_help(message: &str) -> Option<String> {
    let (_, rest) = message.split_once("unknown ")?;
    let (_, rest) = rest.split_once('`')?;
    let (word, _) = rest.split_once('`')?;
    let names = xpu_ir::Op::ALL
        .iter()
        .map(|o| o.name())
        .chain(xpu_ir::OpClass::ALL.iter().map(|c| c.name()))
        .chain(xpu_ir::DType::ALL.iter().map(|d| d.name()));
    diag::did_you_mean(word, names)
}
