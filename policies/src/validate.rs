//! Two-phase validation (Vector style). [`structural`] needs no environment: names of
//! engines, kernels, op classes, ops, dtypes; ranges; contradictions. [`contextual`] checks a
//! policy against an engine inventory — the live one or a declared file — so a CPU-only CI
//! can validate GPU and NPU policies.

use std::str::FromStr;

use xpu_engine::{Inventory, catalog};
use xpu_ir::{DType, Op, OpClass};

use crate::diag::{Diagnostic, did_you_mean};
use crate::load::Policy;
use crate::spec::{Choose, Fallback, PrecisionName};

fn engine_names() -> impl Iterator<Item = &'static str> {
    catalog::ENGINES.iter().map(|e| e.name)
}

/// Whether `key` names an op class or an op (what `[kernels]` and `keep_fp32` accept).
pub fn is_op_or_class(key: &str) -> bool {
    OpClass::from_str(key).is_ok() || Op::from_str(key).is_ok()
}

fn op_and_class_names() -> impl Iterator<Item = &'static str> {
    OpClass::ALL.iter().map(|c| c.name()).chain(Op::ALL.iter().map(|o| o.name()))
}

struct Checker<'a> {
    policy: &'a Policy,
    out: Vec<Diagnostic>,
}

impl Checker<'_> {
    fn error(&mut self, code: &'static str, key: &str, message: String, help: Option<String>) {
        let at = self.policy.origin(key);
        self.out.push(Diagnostic::error(code, at, message).with_key(key).with_help(help));
    }

    fn engine(&mut self, key: &str, name: &str) -> bool {
        if catalog::engine(name).is_some() {
            return true;
        }
        let help = did_you_mean(name, engine_names()).or_else(|| {
            Some(format!("known engines: {}", engine_names().collect::<Vec<_>>().join(", ")))
        });
        self.error("P0004", key, format!("unknown engine `{name}`"), help);
        false
    }

    fn kernel(&mut self, key: &str, name: &str) -> bool {
        if catalog::kernels().any(|k| k == name) {
            return true;
        }
        let help = did_you_mean(name, catalog::kernels()).or_else(|| {
            catalog::engine(catalog::engine_of(name))
                .map(|e| format!("kernels of {}: {}", e.name, e.kernels.join(", ")))
        });
        self.error("P0005", key, format!("unknown kernel `{name}`"), help);
        false
    }

    fn op_or_class(&mut self, key: &str, name: &str) {
        if !is_op_or_class(name) {
            let help = did_you_mean(name, op_and_class_names())
                .or_else(|| Some("see docs/sgr-ops.md for op names and classes".into()));
            self.error("P0006", key, format!("unknown op or op class `{name}`"), help);
        }
    }

    fn denied(&self, engine: &str) -> bool {
        self.policy.spec.engines.deny.iter().any(|d| d == engine)
    }

    fn ordered_out(&self, engine: &str) -> bool {
        let order = &self.policy.spec.engines.order;
        !order.is_empty() && !order.iter().any(|o| o == engine)
    }

    fn precision_allowed(&mut self, key: &str, p: PrecisionName) {
        let allow = &self.policy.spec.precision.allow;
        if !allow.contains(&p) {
            self.error(
                "P0008",
                key,
                format!("precision {p} is not in precision.allow ({})", names(allow)),
                Some("add it to [precision] allow or choose an allowed precision".into()),
            );
        }
    }
}

fn names(ps: &[PrecisionName]) -> String {
    ps.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
}

/// Structural checks: no environment needed. Errors and warnings.
pub fn structural(policy: &Policy) -> Vec<Diagnostic> {
    let spec = &policy.spec;
    let mut c = Checker { policy, out: Vec::new() };
    if spec.policy.name.trim().is_empty() {
        c.error(
            "P0010",
            "policy.name",
            "the policy has no name".into(),
            Some("set [policy] name = \"...\"".into()),
        );
    }
    // Engines.
    let mut seen = Vec::new();
    for (i, e) in spec.engines.order.iter().enumerate() {
        let key = "engines.order".to_string();
        if c.engine(&key, e) {
            if seen.contains(e) {
                c.error(
                    "P0008",
                    &key,
                    format!("engine `{e}` is listed twice in engines.order (position {})", i + 1),
                    None,
                );
            }
            if c.denied(e) {
                c.error(
                    "P0008",
                    &key,
                    format!(
                        "engine `{e}` is both preferred (engines.order) and denied (engines.deny)"
                    ),
                    None,
                );
            }
        }
        seen.push(e.clone());
    }
    for e in &spec.engines.deny {
        c.engine("engines.deny", e);
    }
    if !spec.engines.order.is_empty() && spec.engines.order.iter().all(|e| c.denied(e)) {
        c.error("P0008", "engines.deny", "every engine in engines.order is denied".into(), None);
    }
    if let Some(b) = &spec.engines.fallback_budget {
        for (k, v) in [("max_nodes_pct", b.max_nodes_pct), ("max_flops_pct", b.max_flops_pct)] {
            if let Some(v) = v
                && (!(0.0..=100.0).contains(&v) || v.is_nan())
            {
                c.error(
                    "P0010",
                    &format!("engines.fallback_budget.{k}"),
                    format!("{k} = {v} is out of range (0 to 100 percent)"),
                    None,
                );
            }
        }
        if spec.engines.fallback == Fallback::Deny {
            c.out.push(
                Diagnostic::warning(
                    "P0008",
                    policy.origin("engines.fallback_budget"),
                    "fallback_budget has no effect with fallback = \"deny\"".to_string(),
                )
                .with_key("engines.fallback_budget"),
            );
        }
    }
    // Kernels.
    for (class, choice) in &spec.kernels {
        let key = format!("kernels.{class}");
        c.op_or_class(&key, class);
        for k in choice.kernels() {
            if !c.kernel(&key, k) {
                continue;
            }
            let engine = catalog::engine_of(k);
            if c.denied(engine) {
                c.error(
                    "P0008",
                    &key,
                    format!("kernel `{k}` belongs to engine `{engine}`, which engines.deny denies"),
                    None,
                );
            } else if c.ordered_out(engine) {
                c.error("P0008", &key, format!("kernel `{k}` belongs to engine `{engine}`, which engines.order does not list"), Some(format!("add `{engine}` to engines.order")));
            }
        }
        if let crate::spec::KernelChoice::Prefer(list) = choice
            && list.is_empty()
        {
            c.error(
                "P0010",
                &key,
                format!("kernels.{class} is an empty list"),
                Some("give one kernel or remove the key".into()),
            );
        }
    }
    // Precision.
    let p = &spec.precision;
    if p.allow.is_empty() {
        c.error(
            "P0010",
            "precision.allow",
            "precision.allow is empty: no node could run".into(),
            None,
        );
    }
    if let Some(d) = p.default {
        c.precision_allowed("precision.default", d);
    }
    if let Some(a) = p.accumulate
        && a.storage().is_none()
    {
        c.error(
            "P0010",
            "precision.accumulate",
            format!("accumulate = \"{a}\" is not an accumulator precision (use fp32 or fp64, …)"),
            None,
        );
    }
    for k in &p.keep_fp32 {
        c.op_or_class("precision.keep_fp32", k);
    }
    if !p.keep_fp32.is_empty() {
        c.precision_allowed("precision.keep_fp32", PrecisionName::Fp32);
    }
    // Execution.
    if spec.execution.threads == Some(0) {
        c.error("P0010", "execution.threads", "threads must be at least 1".into(), None);
    }
    if spec.execution.timeout.is_some_and(|t| t.0.is_zero()) {
        c.error("P0010", "execution.timeout", "timeout must be longer than zero".into(), None);
    }
    // Overridable keys must name real keys.
    let known = known_keys();
    for k in &spec.policy.overridable {
        let section_ok = known.iter().any(|n| n == k || n.starts_with(&format!("{k}.")));
        if !section_ok {
            let help = did_you_mean(k, known.iter().map(String::as_str));
            c.error("P0002", "policy.overridable", format!("`{k}` is not a policy key"), help);
        }
    }
    // Rules.
    for (i, r) in spec.rules.iter().enumerate() {
        let key = format!("rule[{i}]");
        if let Some(op) = &r.when.op
            && Op::from_str(op).is_err()
        {
            let help = if OpClass::from_str(op).is_ok() {
                Some(format!("`{op}` is an op class: write when = {{ class = \"{op}\" }}"))
            } else {
                did_you_mean(op, Op::ALL.iter().map(|o| o.name()))
            };
            c.error("P0006", &format!("{key}.when.op"), format!("unknown op `{op}`"), help);
        }
        if let Some(cl) = &r.when.class
            && OpClass::from_str(cl).is_err()
        {
            c.error(
                "P0006",
                &format!("{key}.when.class"),
                format!("unknown op class `{cl}`"),
                did_you_mean(cl, OpClass::ALL.iter().map(|c| c.name())),
            );
        }
        if let Some(g) = &r.when.node
            && let Err(e) = globset::Glob::new(g)
        {
            c.error(
                "P0010",
                &format!("{key}.when.node"),
                format!("bad node-name glob `{g}`: {e}"),
                None,
            );
        }
        if let Some(f) = r.when.min_flops
            && (f < 0.0 || f.is_nan())
        {
            c.error(
                "P0010",
                &format!("{key}.when.min_flops"),
                format!("min_flops = {f} must be zero or more"),
                None,
            );
        }
        if let Some(d) = &r.when.dtype
            && DType::from_str(d).is_err()
        {
            c.error(
                "P0010",
                &format!("{key}.when.dtype"),
                format!("unknown dtype `{d}`"),
                did_you_mean(d, DType::ALL.iter().map(|d| d.name())),
            );
        }
        if r.engine.is_none() && r.kernel.is_none() && r.precision.is_none() && r.choose.is_none() {
            c.error(
                "P0010",
                &key,
                "the rule sets nothing (give engine, kernel, precision or choose)".into(),
                None,
            );
        }
        if let Some(e) = &r.engine
            && c.engine(&format!("{key}.engine"), e)
            && c.denied(e)
        {
            c.error(
                "P0008",
                &format!("{key}.engine"),
                format!("the rule sends nodes to `{e}`, which engines.deny denies"),
                None,
            );
        }
        if let Some(k) = &r.kernel
            && c.kernel(&format!("{key}.kernel"), k)
        {
            let ke = catalog::engine_of(k);
            if let Some(e) = &r.engine {
                if e != ke {
                    c.error(
                        "P0008",
                        &format!("{key}.kernel"),
                        format!("kernel `{k}` belongs to `{ke}`, but the rule sets engine `{e}`"),
                        None,
                    );
                }
            } else if c.denied(ke) {
                c.error(
                    "P0008",
                    &format!("{key}.kernel"),
                    format!("kernel `{k}` belongs to engine `{ke}`, which engines.deny denies"),
                    None,
                );
            }
        }
        if let Some(p) = r.precision {
            c.precision_allowed(&format!("{key}.precision"), p);
        }
    }
    // Tests.
    for (i, t) in spec.tests.iter().enumerate() {
        for (j, e) in t.expect.iter().enumerate() {
            let key = format!("test[{i}].expect");
            if e.op.is_none() && e.class.is_none() && e.node.is_none() {
                c.error(
                    "P0010",
                    &key,
                    format!("expectation {} selects no nodes (give op, class or node)", j + 1),
                    None,
                );
            }
            if let Some(op) = &e.op
                && Op::from_str(op).is_err()
            {
                c.error(
                    "P0006",
                    &key,
                    format!("unknown op `{op}`"),
                    did_you_mean(op, Op::ALL.iter().map(|o| o.name())),
                );
            }
            if let Some(cl) = &e.class
                && OpClass::from_str(cl).is_err()
            {
                c.error(
                    "P0006",
                    &key,
                    format!("unknown op class `{cl}`"),
                    did_you_mean(cl, OpClass::ALL.iter().map(|c| c.name())),
                );
            }
            if let Some(en) = &e.engine {
                c.engine(&key, en);
            }
            if let Some(k) = &e.kernel {
                c.kernel(&key, k);
            }
        }
    }
    measured_choice(&mut c);
    c.out
}

/// `choose = "measured"` needs evidence, and evidence needs something that chooses by it.
fn measured_choice(c: &mut Checker) {
    let spec = &c.policy.spec;
    let rule_measures = spec.rules.iter().position(|r| r.choose == Some(Choose::Measured));
    let measures = spec.engines.choose == Choose::Measured || rule_measures.is_some();
    let key = match rule_measures {
        Some(i) if spec.engines.choose != Choose::Measured => format!("rule[{i}].choose"),
        _ => "engines.choose".to_string(),
    };
    let m = &spec.measured;
    let most = crate::lock::SAMPLES_DIGESTED;
    if m.min_samples == 0 || m.min_samples > most {
        let msg = format!(
            "min_samples = {} must be 1 to {most} (a measured winner needs a timed run)",
            m.min_samples
        );
        c.error("P0010", "measured.min_samples", msg, None);
    }
    if !(m.max_slowdown.is_finite() && m.max_slowdown >= 1.0) {
        let msg = format!("max_slowdown = {} must be a finite ratio ≥ 1.0", m.max_slowdown);
        c.error(
            "P0010",
            "measured.max_slowdown",
            msg,
            Some("1.5: stop exploring a candidate measured 1.5× slower than the best".into()),
        );
    }
    if m.explore_runs > most {
        let msg = format!("explore_runs = {} is over {most}", m.explore_runs);
        c.error("P0010", "measured.explore_runs", msg, None);
    }
    if measures && spec.measured.lock.is_none() {
        let at = c.policy.origin(&key);
        let d = Diagnostic::warning(
            "P0014",
            at,
            "choose = \"measured\" has no lock: only a daemon tuning online (xpud [tuning] online = true) gives it evidence; elsewhere the static order decides every node",
        );
        let help = "write a lock with `xpuctl tune PROGRAM --policy P` and set [measured] lock";
        c.out.push(d.with_key(key).with_help(Some(help.into())));
    }
    if !measures && spec.measured.lock.is_some() {
        let at = c.policy.origin("measured.lock");
        let d = Diagnostic::warning(
            "P0014",
            at,
            "[measured] lock is read by nothing: no `choose = \"measured\"`",
        );
        c.out.push(d.with_key("measured.lock"));
    }
}

/// Every leaf key path of the policy format (`engines.order`, …), for `overridable`.
pub fn known_keys() -> Vec<String> {
    let schema: serde_json::Value =
        serde_json::from_str(&crate::json_schema()).expect("schema is JSON");
    let mut out = Vec::new();
    let defs = &schema["$defs"];
    for (section, prop) in schema["properties"].as_object().into_iter().flatten() {
        let r = prop["$ref"].as_str().or_else(|| prop["allOf"][0]["$ref"].as_str());
        match r.and_then(|r| r.strip_prefix("#/$defs/")) {
            Some(def) if defs[def]["properties"].is_object() => {
                for k in defs[def]["properties"].as_object().into_iter().flatten().map(|(k, _)| k) {
                    out.push(format!("{section}.{k}"));
                }
            }
            _ => out.push(section.clone()),
        }
    }
    out
}

/// Checks against an inventory: what the policy asks for that the machine lacks.
pub fn contextual(policy: &Policy, inventory: &Inventory, inventory_name: &str) -> Vec<Diagnostic> {
    let spec = &policy.spec;
    let mut out = Vec::new();
    let deny = spec.engines.fallback == Fallback::Deny;
    let available = |e: &str| inventory.engine(e).is_some_and(|c| c.availability.is_available());
    let order = policy.effective_order(inventory);
    for (i, e) in order.iter().enumerate() {
        let at = policy.origin("engines.order");
        let what = match inventory.engine(e) {
            None => Some(format!("engine `{e}` is not in inventory {inventory_name}")),
            Some(c) if !c.availability.is_available() => {
                Some(format!("engine `{e}` is {} in inventory {inventory_name}", c.availability))
            }
            _ => None,
        };
        if let Some(what) = what {
            if i == 0 && deny {
                out.push(
                    Diagnostic::error(
                        "P0104",
                        at,
                        format!("{what}, and fallback = \"deny\": every node would fail"),
                    )
                    .with_key("engines.order")
                    .with_help(Some(
                        "allow fallback, or validate against an inventory that has it".into(),
                    )),
                );
            } else {
                out.push(
                    Diagnostic::warning(
                        "P0101",
                        at,
                        format!("{what}; its nodes go to the next engine"),
                    )
                    .with_key("engines.order"),
                );
            }
        }
    }
    if !order.iter().any(|e| available(e)) {
        out.push(
            Diagnostic::error(
                "P0103",
                policy.origin("engines.order"),
                format!("no engine the policy allows is available in inventory {inventory_name}"),
            )
            .with_key("engines.order"),
        );
    }
    for (class, choice) in &spec.kernels {
        let key = format!("kernels.{class}");
        for k in choice.kernels() {
            let engine = catalog::engine_of(k);
            let has = inventory
                .engine(engine)
                .is_some_and(|c| c.availability.is_available() && c.kernel(k).is_some());
            if !has {
                let pinned = matches!(choice, crate::spec::KernelChoice::Pinned(_));
                let msg = format!("kernel `{k}` is not available in inventory {inventory_name}");
                out.push(if pinned && deny {
                    Diagnostic::error(
                        "P0105",
                        policy.origin(&key),
                        format!("{msg}, and fallback = \"deny\": {class} nodes would fail"),
                    )
                    .with_key(key.clone())
                } else {
                    Diagnostic::warning("P0105", policy.origin(&key), msg).with_key(key.clone())
                });
            }
        }
    }
    for (i, r) in spec.rules.iter().enumerate() {
        if let Some(e) = &r.engine
            && !available(e)
        {
            out.push(Diagnostic::warning("P0106", policy.origin(&format!("rule[{i}].engine")), format!("rule {} sends nodes to `{e}`, which is not available in inventory {inventory_name}", i + 1)).with_key(format!("rule[{i}].engine")));
        }
    }
    if let Some(p) = spec.precision.default {
        let dt = p.kernel_dtype();
        let any = order
            .iter()
            .filter_map(|e| inventory.engine(e))
            .filter(|c| c.availability.is_available())
            .any(|c| c.kernels.iter().any(|k| k.dtypes.contains(&dt)));
        if !any {
            out.push(Diagnostic::warning("P0107", policy.origin("precision.default"), format!("no available engine of inventory {inventory_name} has a kernel for precision {p}")).with_key("precision.default"));
        }
    }
    // A lock measured on another machine (or with other engine versions) is not applied.
    if let Some(e) = &policy.resolved().evidence
        && let Some(why) = e.mismatch(inventory)
    {
        let at = policy.origin("measured.lock");
        let message = format!(
            "lock {} does not match inventory {inventory_name}: {why}; its choices are not used",
            e.source
        );
        let help = "run `xpuctl tune` on this machine to measure again";
        out.push(
            Diagnostic::warning("P0108", at, message)
                .with_key("measured.lock")
                .with_help(Some(help.into())),
        );
    }
    out
}
