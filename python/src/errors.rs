//! Failures as the exceptions of `xpu.errors` (defined in Python, so they carry docstrings,
//! typed attributes and stubs): each is raised with its message and keyword attributes
//! (`engine`, `device`, `reason`, `diagnostics`, `input` …).

use pyo3::prelude::*;
use pyo3::types::PyDict;
use xpu_plan::{PlanFailure, ReasonCode};
use xpu_policy::Diagnostics;

/// An exception of class `class` from `xpu.errors`, with `message` and `attrs`.
pub fn raise(py: Python<'_>, class: &str, message: String, attrs: &Bound<'_, PyDict>) -> PyErr {
    let made = py
        .import("xpu.errors")
        .and_then(|m| m.getattr(class))
        .and_then(|cls| cls.call((message.clone(),), Some(attrs)));
    match made {
        Ok(e) => PyErr::from_value(e),
        // The package's Python half is missing or broken: still a clear error.
        Err(e) => e,
    }
}

/// `class` with a message and no attributes.
pub fn plain(py: Python<'_>, class: &str, message: String) -> PyErr {
    raise(py, class, message, &PyDict::new(py))
}

/// A policy that does not load or check: `xpu.PolicyError` with every diagnostic as a dict
/// (`code`, `file`, `line`, `column`, `key`, `message`, `help`).
pub fn policy_error(py: Python<'_>, d: &Diagnostics) -> PyErr {
    let attrs = PyDict::new(py);
    let list: Vec<Bound<'_, PyDict>> = d.0.iter().map(|d| diagnostic(py, d)).collect();
    let _ = attrs.set_item("diagnostics", list);
    raise(py, "PolicyError", d.to_string(), &attrs)
}

pub fn diagnostic<'py>(py: Python<'py>, d: &xpu_policy::Diagnostic) -> Bound<'py, PyDict> {
    let out = PyDict::new(py);
    let _ = out.set_item("code", d.code);
    let _ = out.set_item("severity", if d.is_error() { "error" } else { "warning" });
    let _ = out.set_item("file", &d.at.file);
    let _ = out.set_item("line", d.at.line);
    let _ = out.set_item("column", d.at.col);
    let _ = out.set_item("key", d.key.as_deref());
    let _ = out.set_item("message", &d.message);
    let _ = out.set_item("help", d.help.as_deref());
    out
}

/// A plan that cannot be made. When it failed because an engine or kernel the policy
/// requires is missing here (no GPU, no provider), `xpu.EngineUnavailable` naming the
/// engine, its device and the reason; otherwise `xpu.PlanError` with every note.
pub fn plan_error(py: Python<'_>, policy: &str, failure: &PlanFailure) -> PyErr {
    let rendered = format!("no plan under policy {policy}:\n{failure}");
    let notes = PyDict::new(py);
    let codes: Vec<&str> = failure.errors.iter().map(|n| n.code.name()).collect();
    let _ = notes.set_item("codes", codes);
    let _ = notes.set_item("policy", policy);
    if let Some(missing) = unavailable(failure) {
        let _ = notes.set_item("engine", missing.engine);
        let _ = notes.set_item("device", missing.device);
        let _ = notes.set_item("reason", missing.reason);
        return raise(py, "EngineUnavailable", rendered, &notes);
    }
    raise(py, "PlanError", rendered, &notes)
}

struct Missing {
    engine: String,
    device: String,
    reason: String,
}

/// The engine (and its device) whose absence sank the plan: a rejection the explanation
/// records with `EngineUnavailable` or `KernelUnavailable` for a node that ended
/// unplaceable.
fn unavailable(failure: &PlanFailure) -> Option<Missing> {
    let missing = [ReasonCode::EngineUnavailable, ReasonCode::KernelUnavailable];
    let ex = &failure.explanation;
    let rejected = ex.decisions.iter().flat_map(|d| d.rejected.iter());
    let found = rejected.filter(|r| missing.contains(&r.code)).min_by_key(|r| {
        // A candidate the policy asked for by name (a pinned kernel) explains best.
        (r.kernel.is_none(), r.engine.clone())
    })?;
    let kernel = found.kernel.clone().unwrap_or_default();
    let device = xpu_engine::catalog::kernel_device(&kernel)
        .map(|d| d.to_string())
        .or_else(|| device_of_engine(&found.engine))
        .unwrap_or_else(|| "host".to_string());
    Some(Missing { engine: found.engine.clone(), device, reason: found.detail.clone() })
}

fn device_of_engine(engine: &str) -> Option<String> {
    let known = xpu_engine::catalog::engine(engine)?;
    let first = known.kernels.first()?;
    xpu_engine::catalog::kernel_device(first).map(|d| d.to_string())
}
