//! Layered loading. Each file is parsed strictly on its own first (syntax, unknown keys and
//! wrong types come back located at `file:line:col`), then figment merges the layers key by
//! key: built-in defaults < `extends` parents (root first) < the policy file < job overrides
//! (only keys the policy lists in `[policy] overridable`) < `XPU_POLICY__SECTION__KEY`
//! environment variables for operators. `[[rule]]` lists concatenate (the child's rules
//! first, so they win); `[[test]]` blocks belong to the file that declares them. Every
//! effective key keeps the [`Origin`] that set it, for explanations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use toml::de::{DeTable, DeValue};

use crate::diag::{Diagnostic, Diagnostics, Origin};
use crate::lock::{Evidence, LockError, LockFile};
use crate::resolved::ResolvedPolicy;
use crate::spec::PolicySpec;
use crate::validate;

/// The built-in defaults layer.
pub const BUILTIN_DEFAULTS: &str = include_str!("../builtin/defaults.toml");

/// A loaded, merged and structurally valid policy. Only the loader makes one: its typed
/// form ([`Policy::resolved`]) is computed there, from `spec` and `origins` as loaded.
#[derive(Clone, Debug)]
pub struct Policy {
    pub spec: PolicySpec,
    /// Effective key (`engines.order`, `kernels.matmul`, `rule[0]`, `rule[0].engine`) →
    /// where it was set.
    pub origins: BTreeMap<String, Origin>,
    /// The policy file and its `extends` parents, child first.
    pub files: Vec<PathBuf>,
    /// SHA-256 of the effective policy's canonical JSON.
    pub sha256: String,
    /// Non-fatal findings of the structural check.
    pub warnings: Vec<Diagnostic>,
    resolved: Arc<ResolvedPolicy>,
}

// The resolved form follows from `spec` and `origins`, so it takes no part in equality.
impl PartialEq for Policy {
    fn eq(&self, other: &Policy) -> bool {
        self.spec == other.spec
            && self.origins == other.origins
            && self.files == other.files
            && self.sha256 == other.sha256
            && self.warnings == other.warnings
    }
}

impl Policy {
    /// The policy in the typed form the planner reads.
    pub fn resolved(&self) -> &ResolvedPolicy {
        &self.resolved
    }

    /// This policy choosing by measurement (`[engines] choose = "measured"`; a rule's own
    /// `choose` still holds for its nodes) and reading `evidence` instead of the lock its
    /// file names: how `xpuctl tune` plans each candidate under evidence it writes itself.
    pub fn choosing_by(&self, evidence: Evidence) -> Policy {
        let mut p = self.clone();
        let mut resolved = ResolvedPolicy::of(&p, Some(Arc::new(evidence)));
        resolved.choose = crate::spec::Choose::Measured;
        p.resolved = Arc::new(resolved);
        p
    }

    /// This policy reading `evidence` (a daemon's store) where its own file names no lock;
    /// what chooses by measurement is unchanged.
    pub fn with_evidence(&self, evidence: Arc<Evidence>) -> Policy {
        let mut p = self.clone();
        let mut resolved = (*self.resolved).clone();
        resolved.evidence = Some(evidence);
        p.resolved = Arc::new(resolved);
        p
    }

    pub fn name(&self) -> &str {
        &self.spec.policy.name
    }

    /// Where `key` was set, falling back to its section, then to the policy file.
    pub fn origin(&self, key: &str) -> Origin {
        let mut k = key;
        loop {
            if let Some(o) = self.origins.get(k) {
                return o.clone();
            }
            match k.rfind(['.', '[']) {
                Some(i) => k = &k[..i],
                None => break,
            }
        }
        Origin::source(match self.files.first() {
            Some(f) => f.display().to_string(),
            None => "built-in defaults".to_string(),
        })
    }

    /// The engines in preference order for `inventory`: `[engines] order`, or when it is empty
    /// every engine of the inventory in its order, minus denied ones.
    pub fn effective_order(&self, inventory: &xpu_engine::Inventory) -> Vec<String> {
        let e = &self.spec.engines;
        if e.order.is_empty() {
            inventory
                .engines
                .iter()
                .map(|c| c.engine.clone())
                .filter(|name| !e.deny.contains(name))
                .collect()
        } else {
            e.order.clone()
        }
    }

    /// The engines a plan under this policy can place a node on, or `None` when that can be
    /// any engine (an empty `[engines] order`). The planner tries a node's first choice (a
    /// rule's engine or kernel, a pinned kernel's engine, the `table` engine for table ops,
    /// else the order), then the order, and rejects every other engine as `NotInOrder`
    /// before it looks at what that engine can do — so an engine outside this set changes
    /// no node's placement, and a local run need not load its library (but see
    /// `Registry::inventory_for_engines`: the first available engine is loaded whatever
    /// it is, for constants no placed node reads). The plan's inventory fingerprint does
    /// differ, as it does for any inventory that leaves an engine unloaded.
    pub fn engines_it_may_place_on(&self) -> Option<std::collections::BTreeSet<String>> {
        let spec = &self.spec;
        if spec.engines.order.is_empty() {
            return None;
        }
        let engine_of = |kernel: &str| xpu_engine::catalog::engine_of(kernel).to_string();
        let mut engines: std::collections::BTreeSet<String> =
            spec.engines.order.iter().cloned().collect();
        engines.insert("table".to_string());
        for rule in &spec.rules {
            engines.extend(rule.engine.iter().cloned());
            engines.extend(rule.kernel.as_deref().map(engine_of));
        }
        for choice in spec.kernels.values() {
            engines.extend(choice.kernels().iter().map(|k| engine_of(k)));
        }
        Some(engines)
    }

    /// The policy as canonical JSON (hashing, `policy resolve --format json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.spec).expect("policy serializes")
    }
}

/// Loads policies with optional search directories, job overrides and environment.
#[derive(Clone, Debug, Default)]
pub struct Loader {
    /// Where `extends = "name"` is looked up after the policy's own directory.
    pub search_dirs: Vec<PathBuf>,
    /// Job-level overrides: `execution.threads` → `4` (TOML value text).
    pub overrides: Vec<(String, String)>,
    /// `XPU_POLICY__…` variables (name, value).
    pub env: Vec<(String, String)>,
    /// When set, `extends` may only name a policy file inside these directories (by its
    /// canonical path): a policy from an untrusted sender (xpud's inline `policy_toml`)
    /// cannot make the loader read, and echo in its errors, a file anywhere else.
    pub confine_to: Option<Vec<PathBuf>>,
}

pub const ENV_PREFIX: &str = "XPU_POLICY__";

struct Layer {
    display: String,
    path: Option<PathBuf>,
    text: String,
    spec: PolicySpec,
    origins: BTreeMap<String, Origin>,
}

impl Loader {
    pub fn new() -> Loader {
        Loader::default()
    }

    /// Confines `extends` to policy files inside `dirs` (see [`Loader::confine_to`]).
    pub fn confined_to(mut self, dirs: Vec<PathBuf>) -> Loader {
        self.confine_to = Some(dirs.iter().filter_map(|d| d.canonicalize().ok()).collect());
        self
    }

    /// Takes the operator overrides from this process's `XPU_POLICY__*` variables.
    pub fn with_process_env(mut self) -> Loader {
        self.env = std::env::vars().filter(|(k, _)| k.starts_with(ENV_PREFIX)).collect();
        self
    }

    pub fn with_override(mut self, key: impl Into<String>, value: impl Into<String>) -> Loader {
        self.overrides.push((key.into(), value.into()));
        self
    }

    /// Loads a policy file (and its parents).
    pub fn load(&self, path: &Path) -> Result<Policy, Diagnostics> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Diagnostics(vec![Diagnostic::error(
                "P0001",
                Origin::source(path.display().to_string()),
                format!("cannot read the policy: {e}"),
            )])
        })?;
        self.load_text(&path.display().to_string(), Some(path), &text)
    }

    /// Loads a policy from text; `path` (if any) anchors relative `extends` and test paths.
    pub fn load_text(
        &self,
        display: &str,
        path: Option<&Path>,
        text: &str,
    ) -> Result<Policy, Diagnostics> {
        let mut layers = Vec::new();
        let first = parse_layer(display, path.map(Path::to_path_buf), text)?;
        let mut seen: Vec<String> = vec![canonical(path, display)];
        let mut next = first.spec.policy.extends.clone().map(|e| (e, 0usize));
        layers.push(first);
        while let Some((parent, child)) = next {
            let at = layers[child]
                .origins
                .get("policy.extends")
                .cloned()
                .unwrap_or_else(|| Origin::source(layers[child].display.clone()));
            let dir = layers[child].path.as_ref().and_then(|p| p.parent()).map(Path::to_path_buf);
            let Some(found) = self.find_parent(&parent, dir.as_deref()) else {
                return Err(Diagnostics(vec![
                    Diagnostic::error(
                        "P0009",
                        at,
                        format!("`extends = \"{parent}\"`: no such policy"),
                    )
                    .with_key("policy.extends")
                    .with_help(Some(format!(
                        "looked for {}",
                        self.candidates(&parent, dir.as_deref())
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))),
                ]));
            };
            let key = canonical(Some(&found), "");
            if let Some(pos) = seen.iter().position(|s| *s == key) {
                let mut chain: Vec<String> = seen[pos..].to_vec();
                chain.push(key);
                return Err(Diagnostics(vec![
                    Diagnostic::error(
                        "P0009",
                        at,
                        format!("`extends` cycle: {}", chain.join(" → ")),
                    )
                    .with_key("policy.extends"),
                ]));
            }
            seen.push(key);
            let text = std::fs::read_to_string(&found).map_err(|e| {
                Diagnostics(vec![Diagnostic::error(
                    "P0009",
                    at.clone(),
                    format!("cannot read parent policy {}: {e}", found.display()),
                )])
            })?;
            let layer = parse_layer(&found.display().to_string(), Some(found.clone()), &text)?;
            next = layer.spec.policy.extends.clone().map(|e| (e, layers.len()));
            layers.push(layer);
        }
        self.merge(layers)
    }

    /// `text` (a policy layer, say from keyword arguments, shown as `display`) over `base`,
    /// merged as `extends = base` would merge it; a key both set to different values is a
    /// conflict (P0013, naming the key and both places), not a silent override. Built-in
    /// defaults in `base` are not conflicts.
    pub fn layer_over(
        &self,
        base: &Policy,
        display: &str,
        text: &str,
    ) -> Result<Policy, Diagnostics> {
        let child = parse_layer(display, None, text)?;
        let conflicts = layer_conflicts(base, &child);
        if !conflicts.is_empty() {
            return Err(Diagnostics(conflicts));
        }
        let mut parent_spec = base.spec.clone();
        parent_spec.tests.clear();
        let rules = std::mem::take(&mut parent_spec.rules);
        let parent_text = toml::to_string(&parent_spec).map_err(|e| {
            Diagnostics(vec![Diagnostic::error(
                "P0003",
                Origin::source(base.name().to_string()),
                format!("cannot restate policy `{}` as TOML: {e}", base.name()),
            )])
        })?;
        parent_spec.rules = rules;
        let builtin = builtin_origins();
        // Everything the base's own files (or env, or overrides) set keeps its origin.
        let origins = base.origins.iter().filter(|(k, o)| builtin.get(*k) != Some(*o));
        let parent = Layer {
            display: base
                .files
                .first()
                .map_or_else(|| base.name().to_string(), |f| f.display().to_string()),
            path: None,
            text: parent_text,
            spec: parent_spec,
            origins: origins.map(|(k, o)| (k.clone(), o.clone())).collect(),
        };
        let mut merged = self.merge(vec![child, parent])?;
        merged.files = base.files.clone();
        Ok(merged)
    }

    fn candidates(&self, parent: &str, dir: Option<&Path>) -> Vec<PathBuf> {
        let file =
            if parent.ends_with(".toml") { parent.to_string() } else { format!("{parent}.toml") };
        let mut out = Vec::new();
        if Path::new(&file).is_absolute() {
            out.push(PathBuf::from(&file));
            return out;
        }
        if let Some(d) = dir {
            out.push(d.join(&file));
        } else {
            out.push(PathBuf::from(&file));
        }
        for d in &self.search_dirs {
            out.push(d.join(&file));
        }
        out
    }

    fn find_parent(&self, parent: &str, dir: Option<&Path>) -> Option<PathBuf> {
        let allowed = |p: &PathBuf| match &self.confine_to {
            None => true,
            Some(roots) => p.canonicalize().is_ok_and(|c| roots.iter().any(|r| c.starts_with(r))),
        };
        self.candidates(parent, dir).into_iter().find(|p| p.is_file() && allowed(p))
    }

    /// The lock `[measured] lock` names, relative to the file that sets the key, read
    /// within the policy directories when the loader is confined. A lock that cannot be
    /// read or parsed is evidence with the reason, never a failed load.
    fn evidence(&self, policy: &Policy) -> Option<Evidence> {
        let name = policy.spec.measured.lock.as_deref()?;
        let origin = policy.origin("measured.lock");
        let base = Path::new(&origin.file).parent().unwrap_or(Path::new(""));
        let path =
            if Path::new(name).is_absolute() { PathBuf::from(name) } else { base.join(name) };
        let unreadable = |message: String| {
            Evidence::unreadable(name, LockError { file: name.into(), location: None, message })
        };
        if let Some(dirs) = &self.confine_to {
            let inside = path.canonicalize().is_ok_and(|c| dirs.iter().any(|d| c.starts_with(d)));
            if !inside {
                return Some(unreadable(format!(
                    "{} is not a file inside the policy directories",
                    path.display()
                )));
            }
        }
        let bytes = match std::fs::metadata(&path) {
            Ok(m) if m.len() > crate::lock::MAX_LOCK_BYTES as u64 => {
                return Some(unreadable(format!("{} bytes, over the limit", m.len())));
            }
            Ok(_) => match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => return Some(unreadable(format!("cannot read {}: {e}", path.display()))),
            },
            Err(e) => return Some(unreadable(format!("cannot read {}: {e}", path.display()))),
        };
        let parsed = match std::str::from_utf8(&bytes) {
            Ok(text) => LockFile::parse(&path.display().to_string(), text),
            Err(e) => Err(LockError {
                file: path.display().to_string(),
                location: None,
                message: format!("not UTF-8 text: {e}"),
            }),
        };
        Some(Evidence::new(name, &bytes, parsed))
    }

    fn merge(&self, layers: Vec<Layer>) -> Result<Policy, Diagnostics> {
        let mut fig = Figment::from(Toml::string(BUILTIN_DEFAULTS));
        let mut origins: BTreeMap<String, Origin> = builtin_origins().clone();
        // Rules concatenate child first; their origins are renumbered to the merged list.
        let mut rules = Vec::new();
        let mut rule_origins = BTreeMap::new();
        for layer in &layers {
            let base = rules.len();
            for (k, o) in &layer.origins {
                if let Some(rest) = k.strip_prefix("rule[") {
                    let (idx, tail) = rest.split_once(']').expect("rule keys are rule[N]…");
                    let i: usize = idx.parse().expect("rule index");
                    rule_origins.insert(format!("rule[{}]{tail}", base + i), o.clone());
                }
            }
            rules.extend(layer.spec.rules.iter().cloned());
        }
        for layer in layers.iter().rev() {
            fig = fig.merge(Toml::string(&layer.text));
            for (k, o) in &layer.origins {
                if !k.starts_with("rule[") && !k.starts_with("test[") {
                    origins.insert(k.clone(), o.clone());
                }
            }
        }
        let own = &layers[0];
        for (k, o) in &own.origins {
            if k.starts_with("test[") {
                origins.insert(k.clone(), o.clone());
            }
        }
        origins.extend(rule_origins);

        // Job overrides: only keys the policy marks overridable.
        let overridable = own_overridable(&layers);
        let mut problems = Vec::new();
        for (key, raw) in &self.overrides {
            let allowed = overridable.iter().any(|o| key == o || key.starts_with(&format!("{o}.")));
            if !allowed {
                problems.push(
                    Diagnostic::error(
                        "P0011",
                        Origin::source("job override"),
                        format!(
                            "policy `{}` does not allow a job to override `{key}`",
                            own.spec.policy.name
                        ),
                    )
                    .with_key(key.clone())
                    .with_help(Some(if overridable.is_empty() {
                        "the policy lists no overridable keys (`[policy] overridable = [...]`)"
                            .into()
                    } else {
                        format!("overridable keys: {}", overridable.join(", "))
                    })),
                );
                continue;
            }
            fig = fig.merge(Serialized::default(key, toml_value(raw)));
            origins.insert(key.clone(), Origin::source(format!("job override {key}={raw}")));
        }
        for (var, raw) in &self.env {
            let Some(path) = var.strip_prefix(ENV_PREFIX) else { continue };
            let key =
                path.split("__").map(|s| s.to_ascii_lowercase()).collect::<Vec<_>>().join(".");
            if key.is_empty() {
                continue;
            }
            fig = fig.merge(Serialized::default(&key, toml_value(raw)));
            origins.insert(key, Origin::source(format!("env {var}")));
        }
        if !problems.is_empty() {
            return Err(Diagnostics(problems));
        }
        let mut spec: PolicySpec = fig.extract().map_err(|e| {
            Diagnostics(
                e.into_iter()
                    .map(|e| {
                        let key = e.path.join(".");
                        let at = origins.get(&key).cloned().unwrap_or_else(|| {
                            Origin::source(
                                e.metadata.as_ref().map(|m| m.name.to_string()).unwrap_or_default(),
                            )
                        });
                        Diagnostic::error("P0003", at, format!("`{key}`: {}", e.kind)).with_key(key)
                    })
                    .collect(),
            )
        })?;
        spec.rules = rules;
        spec.tests = own.spec.tests.clone();
        let mut policy = Policy {
            sha256: String::new(),
            spec,
            origins,
            files: layers.iter().filter_map(|l| l.path.clone()).collect(),
            warnings: Vec::new(),
            resolved: Arc::default(),
        };
        let diags = validate::structural(&policy);
        let (errors, warnings): (Vec<_>, Vec<_>) = diags.into_iter().partition(|d| d.is_error());
        if !errors.is_empty() {
            return Err(Diagnostics(errors));
        }
        policy.warnings = warnings;
        let evidence = self.evidence(&policy);
        if let Some(Err(e)) = evidence.as_ref().map(|e| &e.lock) {
            let at = policy.origin("measured.lock");
            let warning = Diagnostic::warning(
                "P0015",
                at,
                format!("the lock is not used (the static order decides): {e}"),
            );
            policy.warnings.push(warning.with_key("measured.lock"));
        }
        policy.resolved = Arc::new(ResolvedPolicy::of(&policy, evidence.map(Arc::new)));
        use sha2::{Digest, Sha256};
        policy.sha256 = Sha256::digest(policy.to_json().as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(policy)
    }
}

/// Keys `child` sets that `base` set (not by a built-in default) to a different value.
fn layer_conflicts(base: &Policy, child: &Layer) -> Vec<Diagnostic> {
    let (Ok(base_json), Ok(child_json)) =
        (serde_json::to_value(&base.spec), serde_json::to_value(&child.spec))
    else {
        return Vec::new();
    };
    let at = |json: &serde_json::Value, key: &str| {
        key.split('.').try_fold(json.clone(), |v, part| v.get(part).cloned())
    };
    let builtin = builtin_origins();
    let mut out = Vec::new();
    out.extend(catch_all_rule_conflicts(base, child));
    for (key, origin) in &child.origins {
        if key.starts_with("rule[") || key.starts_with("test[") || key.starts_with("policy.") {
            continue;
        }
        let Some(set_by) = base.origins.get(key) else { continue };
        if builtin.get(key) == Some(set_by) {
            continue;
        }
        let (theirs, ours) = (at(&base_json, key), at(&child_json, key));
        // Sections are compared key by key, not whole.
        if ours.as_ref().is_some_and(serde_json::Value::is_object) {
            continue;
        }
        if theirs.is_some() && theirs != ours {
            let show = |v: Option<serde_json::Value>| v.map_or("(unset)".into(), |v| v.to_string());
            out.push(
                Diagnostic::error(
                    "P0013",
                    origin.clone(),
                    format!(
                        "`{key}` is {} here and {} in {}: conflicting settings",
                        show(ours),
                        show(theirs),
                        set_by.short()
                    ),
                )
                .with_key(key.clone())
                .with_help(Some("set it in one place, or to the same value in both".into())),
            );
        }
    }
    out
}

/// A layer's `[[rule]]` that matches every node (`when = {}`, as a device keyword makes)
/// goes first and so overrides every `[kernels]` pin and `[[rule]]` of the base: each one it
/// would silently override is a conflict.
fn catch_all_rule_conflicts(base: &Policy, child: &Layer) -> Vec<Diagnostic> {
    let builtin = builtin_origins();
    let mut out = Vec::new();
    for (i, rule) in child.spec.rules.iter().enumerate() {
        if rule.when != crate::spec::RuleMatch::default() {
            continue;
        }
        let at = child
            .origins
            .get(&format!("rule[{i}]"))
            .cloned()
            .unwrap_or_else(|| Origin::source(child.display.clone()));
        let what = rule.kernel.clone().or_else(|| rule.engine.clone()).unwrap_or_default();
        let pins = base.spec.kernels.iter().filter(|(op, choice)| {
            let key = format!("kernels.{op}");
            base.origins.get(&key).is_some_and(|o| builtin.get(&key) != Some(o))
                && rule.kernel.as_ref().is_none_or(|k| choice.kernels() != std::slice::from_ref(k))
        });
        for (op, _) in pins {
            let key = format!("kernels.{op}");
            out.push(
                Diagnostic::error(
                    "P0013",
                    at.clone(),
                    format!(
                        "this layer sends every node to `{what}`, overriding `{key}` set in {}: conflicting settings",
                        base.origin(&key).short()
                    ),
                )
                .with_key(key),
            );
        }
        for (j, _) in base.spec.rules.iter().enumerate() {
            let key = format!("rule[{j}]");
            out.push(
                Diagnostic::error(
                    "P0013",
                    at.clone(),
                    format!(
                        "this layer sends every node to `{what}` ahead of the policy's {key} (set in {}): conflicting settings",
                        base.origin(&key).short()
                    ),
                )
                .with_key(key),
            );
        }
    }
    out
}

/// Where each built-in default is set, parsed once per process.
fn builtin_origins() -> &'static BTreeMap<String, Origin> {
    static ORIGINS: std::sync::OnceLock<BTreeMap<String, Origin>> = std::sync::OnceLock::new();
    ORIGINS.get_or_init(|| {
        let layer = parse_layer("built-in defaults", None, BUILTIN_DEFAULTS)
            .expect("the built-in defaults parse (tested)");
        layer
            .origins
            .into_iter()
            .map(|(k, o)| (k, Origin::source(format!("built-in default ({})", o.short()))))
            .collect()
    })
}

fn own_overridable(layers: &[Layer]) -> Vec<String> {
    // A parent's overridable keys stay overridable unless the child redeclares the list.
    layers
        .iter()
        .find(|l| l.origins.contains_key("policy.overridable"))
        .map(|l| l.spec.policy.overridable.clone())
        .unwrap_or_default()
}

fn canonical(path: Option<&Path>, display: &str) -> String {
    path.and_then(|p| std::fs::canonicalize(p).ok())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| display.to_string())
}

/// A TOML value from override text: `4`, `true`, `["cpu"]`, or else a plain string.
fn toml_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    toml::from_str::<toml::Table>(&doc)
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

fn parse_layer(display: &str, path: Option<PathBuf>, text: &str) -> Result<Layer, Diagnostics> {
    let table = DeTable::parse(text)
        .map_err(|e| Diagnostics(vec![toml_error("P0001", display, text, &e, "malformed TOML")]))?;
    let spec: PolicySpec = toml::from_str(text).map_err(|e| {
        let code = if e.message().contains("unknown field") { "P0002" } else { "P0003" };
        Diagnostics(vec![toml_error(code, display, text, &e, "")])
    })?;
    let mut origins = BTreeMap::new();
    collect_origins(display, text, table.get_ref(), "", &mut origins);
    Ok(Layer { display: display.to_string(), path, text: text.to_string(), spec, origins })
}

fn toml_error(
    code: &'static str,
    display: &str,
    text: &str,
    e: &toml::de::Error,
    prefix: &str,
) -> Diagnostic {
    let (line, col) = e.span().map(|s| xpu_engine::line_col(text, s.start)).unwrap_or((1, 1));
    let message = e.message().trim().to_string();
    let help = crate::diag::did_you_mean_from_message(&message);
    let message = if prefix.is_empty() { message } else { format!("{prefix}: {message}") };
    Diagnostic::error(code, Origin::new(display, line, col), message).with_help(help)
}

fn collect_origins(
    display: &str,
    text: &str,
    table: &DeTable<'_>,
    prefix: &str,
    out: &mut BTreeMap<String, Origin>,
) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.get_ref().to_string()
        } else {
            format!("{prefix}.{}", k.get_ref())
        };
        let (line, col) = xpu_engine::line_col(text, k.span().start);
        out.insert(key.clone(), Origin::new(display, line, col));
        match v.get_ref() {
            DeValue::Table(t) => collect_origins(display, text, t, &key, out),
            DeValue::Array(items) if key == "rule" || key == "test" => {
                for (i, item) in items.iter().enumerate() {
                    let ik = format!("{key}[{i}]");
                    let (line, col) = xpu_engine::line_col(text, item.span().start);
                    out.insert(ik.clone(), Origin::new(display, line, col));
                    if let DeValue::Table(t) = item.get_ref() {
                        collect_origins(display, text, t, &ik, out);
                    }
                }
            }
            _ => {}
        }
    }
}
