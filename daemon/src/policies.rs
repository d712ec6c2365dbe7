//! The policies a daemon serves: every `*.toml` of its policy directories, loaded and
//! validated as one set. A reload builds a new set and swaps it in only when every file
//! loads and no two policies share a name; otherwise the old set stays (and the failure is
//! logged and counted).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use xpu_policy::{Loader, Policy};

#[derive(Debug)]
pub struct PolicySet {
    pub by_name: BTreeMap<String, Arc<Policy>>,
    /// The policies that declare `match.labels`, the candidates of [`PolicySet::select`].
    selectable: Vec<Policy>,
    /// Used when a job names no policy: the one named `default`, else the built-in default.
    pub default: Arc<Policy>,
    pub dirs: Vec<PathBuf>,
}

pub const BUILTIN_DEFAULT: &str = "[policy]\nname = \"default\"\n";

/// The example policies (policies/examples), built into the binary: a daemon started outside
/// a checkout serves them from `<data dir>/policies` (written there on first start).
pub const BUILTIN_EXAMPLES: &[(&str, &str)] = &[
    ("base.toml", include_str!("../../policies/examples/base.toml")),
    ("cpu-only.toml", include_str!("../../policies/examples/cpu-only.toml")),
    ("deterministic-audit.toml", include_str!("../../policies/examples/deterministic-audit.toml")),
    ("edge-riscv.toml", include_str!("../../policies/examples/edge-riscv.toml")),
    ("latency-gpu.toml", include_str!("../../policies/examples/latency-gpu.toml")),
    ("llvm-host.toml", include_str!("../../policies/examples/llvm-host.toml")),
    ("npu-openvino.toml", include_str!("../../policies/examples/npu-openvino.toml")),
    ("openvino-cpu.toml", include_str!("../../policies/examples/openvino-cpu.toml")),
    ("ort-cpu.toml", include_str!("../../policies/examples/ort-cpu.toml")),
];

/// Writes the built-in example policies into `dir` (files already there are kept: an
/// operator's edits win) and returns how many were written.
pub fn write_builtin_examples(dir: &std::path::Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut written = 0;
    for (name, text) in BUILTIN_EXAMPLES {
        let path = dir.join(name);
        if !path.exists() {
            std::fs::write(&path, text)?;
            written += 1;
        }
    }
    Ok(written)
}

impl PolicySet {
    pub fn load(dirs: &[PathBuf]) -> Result<PolicySet, String> {
        let loader = Loader::new();
        let mut by_name: BTreeMap<String, Arc<Policy>> = BTreeMap::new();
        let mut problems = Vec::new();
        for dir in dirs {
            let entries = std::fs::read_dir(dir)
                .map_err(|e| format!("policy directory {}: {e}", dir.display()))?;
            let mut files: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| xpu_policy::lock::is_policy_file(p))
                .collect();
            files.sort();
            for f in files {
                match loader.load(&f) {
                    Ok(p) => {
                        let name = p.name().to_string();
                        if let Some(old) = by_name.get(&name) {
                            problems.push(format!(
                                "{}: policy `{name}` is also defined in {}",
                                f.display(),
                                old.files
                                    .first()
                                    .map(|f| f.display().to_string())
                                    .unwrap_or_default()
                            ));
                        } else {
                            by_name.insert(name, Arc::new(p));
                        }
                    }
                    Err(d) => problems.push(d.to_string()),
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        let default = match by_name.get("default") {
            Some(p) => p.clone(),
            None => Arc::new(
                loader
                    .load_text("built-in default policy", None, BUILTIN_DEFAULT)
                    .map_err(|d| d.to_string())?,
            ),
        };
        // Only policies that declare `match.labels` take part in selection: a policy matching
        // everything (a `base` to extend) is never picked by accident.
        let selectable = by_name
            .values()
            .filter(|p| !p.spec.policy.matches.labels.is_empty())
            .map(|p| (**p).clone())
            .collect();
        Ok(PolicySet { by_name, selectable, default, dirs: dirs.to_vec() })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Policy>> {
        if name == "default" {
            return Some(&self.default);
        }
        self.by_name.get(name)
    }

    /// The policy whose `match.labels` fit `labels` best (most specific, then priority),
    /// among those that declare `match.labels`.
    pub fn select(&self, labels: &BTreeMap<String, String>) -> Option<Arc<Policy>> {
        let chosen = xpu_policy::select(&self.selectable, labels)?;
        self.by_name.get(chosen.name()).cloned()
    }

    /// An inline policy (TOML text sent with a job); `extends` resolves in the policy dirs
    /// and nowhere else (an absolute path or `..` out of them is "no such policy").
    pub fn inline(&self, text: &str) -> Result<Policy, String> {
        // Anchored in the first policy directory, so `extends = "base"` finds base.toml.
        let anchor = self.dirs.first().map(|d| d.join("inline.toml"));
        Loader::new()
            .confined_to(self.dirs.clone())
            .load_text("inline policy", anchor.as_deref(), text)
            .map_err(|d| d.to_string())
    }
}
