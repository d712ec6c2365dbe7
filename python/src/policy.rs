//! `xpu.Policy`'s native half: a policy loaded, merged and structurally checked by the
//! loader `xpuctl policy check` uses, checked against an inventory, and resolved against a
//! program into the plan a run would make.

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use xpu_policy::{Loader, Policy};

use crate::errors;

/// A loaded policy (immutable).
#[pyclass(name = "Policy", module = "xpu._xpu", frozen)]
pub struct PyPolicy {
    pub policy: Policy,
}

/// The policy a session or program gets when none is given: built-in defaults.
pub fn default_policy() -> Policy {
    Loader::new()
        .load_text("built-in default policy", None, "[policy]\nname = \"default\"\n")
        .expect("the built-in default policy loads (tested)")
}

#[pymethods]
impl PyPolicy {
    /// Loads a policy file and its `extends` parents, with the `XPU_POLICY__SECTION__KEY`
    /// environment variables applied as `xpuctl` applies them.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<PyPolicy> {
        let loaded = py.detach(|| Loader::new().with_process_env().load(&path));
        loaded.map(|policy| PyPolicy { policy }).map_err(|d| errors::policy_error(py, &d))
    }

    /// A policy from TOML text; `name` stands for the file in diagnostics, and relative
    /// `extends` resolve against `base_dir` when given.
    #[staticmethod]
    #[pyo3(signature = (text, name = "<string>", base_dir = None))]
    fn from_toml(
        py: Python<'_>,
        text: &str,
        name: &str,
        base_dir: Option<PathBuf>,
    ) -> PyResult<PyPolicy> {
        let anchor = base_dir.map(|d| d.join(name));
        let loaded = Loader::new().load_text(name, anchor.as_deref(), text);
        loaded.map(|policy| PyPolicy { policy }).map_err(|d| errors::policy_error(py, &d))
    }

    /// The built-in default policy (every engine of the inventory, in its order).
    #[staticmethod]
    fn default() -> PyPolicy {
        PyPolicy { policy: default_policy() }
    }

    /// `text` (a TOML layer) over this policy, as `extends` would merge it; a key set to
    /// different values in both raises `PolicyError` naming the key.
    #[pyo3(signature = (text, name = "<keyword arguments>"))]
    fn layered(&self, py: Python<'_>, text: &str, name: &str) -> PyResult<PyPolicy> {
        let merged = Loader::new().layer_over(&self.policy, name, text);
        merged.map(|policy| PyPolicy { policy }).map_err(|d| errors::policy_error(py, &d))
    }

    #[getter]
    fn name(&self) -> &str {
        self.policy.name()
    }

    #[getter]
    fn sha256(&self) -> &str {
        &self.policy.sha256
    }

    /// The policy file and its parents, child first.
    #[getter]
    fn files(&self) -> Vec<String> {
        self.policy.files.iter().map(|f| f.display().to_string()).collect()
    }

    /// The effective policy as JSON (every key after merging).
    fn to_json(&self) -> String {
        self.policy.to_json()
    }

    /// Checks the policy against an inventory file (or this process's engines when `None`):
    /// raises `PolicyError` on errors, returns the warnings (structural and contextual) as
    /// dicts with `code`, `file`, `line`, `column`, `key`, `message`, `help`.
    #[pyo3(signature = (inventory = None))]
    fn check<'py>(
        &self,
        py: Python<'py>,
        inventory: Option<PathBuf>,
    ) -> PyResult<Vec<Bound<'py, pyo3::types::PyDict>>> {
        let (inv, inv_name) = match &inventory {
            Some(path) => {
                let inv =
                    xpu_policy::load_inventory(path).map_err(|d| errors::policy_error(py, &d))?;
                (inv, path.display().to_string())
            }
            None => (py.detach(|| crate::engines::registry(&[]).inventory()), "live".into()),
        };
        let found = xpu_policy::validate::contextual(&self.policy, &inv, &inv_name);
        let (errs, mut warnings): (Vec<_>, Vec<_>) = found.into_iter().partition(|d| d.is_error());
        if !errs.is_empty() {
            return Err(errors::policy_error(py, &xpu_policy::Diagnostics(errs)));
        }
        warnings.splice(0..0, self.policy.warnings.iter().cloned());
        Ok(warnings.iter().map(|d| errors::diagnostic(py, d)).collect())
    }

    /// The plan a run of `program` would make under this policy on an inventory file (or
    /// this process's engines), with symbolic dims bound by `bind` (`{"N": 64}`): the
    /// explanation as JSON (every node's engine, kernel, precision, the rule that chose it,
    /// the rejected candidates with reason codes). Raises `EngineUnavailable`/`PlanError`
    /// when no plan can be made.
    #[pyo3(signature = (program, inventory = None, bind = None))]
    fn resolve(
        &self,
        py: Python<'_>,
        program: PathBuf,
        inventory: Option<PathBuf>,
        bind: Option<std::collections::BTreeMap<String, u64>>,
    ) -> PyResult<String> {
        let graph = crate::session::load_graph(py, &program)?;
        let inv = match &inventory {
            Some(path) => {
                xpu_policy::load_inventory(path).map_err(|d| errors::policy_error(py, &d))?
            }
            None => py.detach(|| crate::engines::registry(&[]).inventory_for(&graph)),
        };
        let bindings = bind.unwrap_or_default();
        let planned = py.detach(|| xpu_runtime::plan_graph(&graph, &self.policy, &inv, &bindings));
        match planned {
            Ok((_, explanation)) => Ok(explanation.to_json()),
            Err(failure) => Err(errors::plan_error(py, self.policy.name(), &failure)),
        }
    }

    /// Runs the policy's `[[test]]` blocks as `xpuctl policy test` does (programs and
    /// inventories relative to the policy file; to the working directory for a policy
    /// from text without `base_dir`): `(file, name, failures)` per test, `failures` empty
    /// when it passed.
    fn test(&self, py: Python<'_>) -> Vec<(String, String, Vec<String>)> {
        let file = self.policy.files.first().cloned().unwrap_or_else(|| PathBuf::from("<string>"));
        let outcomes = py.detach(|| xpu_runtime::policy_tests::run(&self.policy, &file));
        outcomes.into_iter().map(|o| (o.file.display().to_string(), o.name, o.failures)).collect()
    }

    fn __repr__(&self) -> String {
        match self.policy.files.first() {
            Some(f) => format!("<xpu.Policy {} from {}>", self.policy.name(), show(f)),
            None => format!("<xpu.Policy {}>", self.policy.name()),
        }
    }
}

fn show(p: &Path) -> String {
    p.display().to_string()
}
