//! MiniLang from Python: a program's source run under a policy, with numpy arrays for its
//! `input("name")`s, returning what its `print` statements show, in order.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use xpu_ir::shape::{Dim, TensorType};
use xpu_minilang::lower::{Inputs, PrintItem};
use xpu_minilang::paths::DataRoots;

use crate::{arrays, errors, policy::PyPolicy};

/// Runs MiniLang `source` (named `name` in diagnostics) with `inputs` (name → array) under
/// `policy`, reading files inside `roots` (the working directory when empty). Returns the
/// printed items in order: `("text", str)` or `("value", name, array | {column: array})`,
/// then each chart a `plot` drew: `("plot", name, path, bytes)`.
/// Raises `ProgramError` with the rendered, located diagnostics when it does not compile.
#[pyfunction]
#[pyo3(signature = (source, inputs, policy = None, roots = Vec::new(), name = "<program>.ml"))]
pub fn run_minilang<'py>(
    py: Python<'py>,
    source: &str,
    inputs: &Bound<'py, PyDict>,
    policy: Option<&PyPolicy>,
    roots: Vec<PathBuf>,
    name: &str,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let roots = if roots.is_empty() {
        vec![std::env::current_dir().unwrap_or_else(|_| ".".into())]
    } else {
        roots
    };
    let mut names = Vec::new();
    let mut tensors = Vec::new();
    let mut types = std::collections::BTreeMap::new();
    for (key, value) in inputs.iter() {
        let key: String = key.extract()?;
        let (t, _) = arrays::to_tensor(py, &key, &value, false)?;
        let dims = t.shape().iter().map(|&n| Dim::Known(n as u64)).collect();
        types.insert(key.clone(), TensorType::new(t.dtype(), dims));
        names.push(key);
        tensors.push(t);
    }
    let policy = policy.map_or_else(crate::policy::default_policy, |p| p.policy.clone());
    let file = if name.ends_with(".ml") { name.to_string() } else { format!("{name}.ml") };
    let compiled = py.detach(|| {
        let inputs = Inputs { types, ..Default::default() };
        xpu_runtime::program::compile(
            &file,
            source.as_bytes(),
            &DataRoots::new(roots.clone()),
            &inputs,
        )
    });
    let compiled = compiled.map_err(|e| errors::plain(py, "ProgramError", e.to_string()))?;
    // The graph's inputs in its own order, fed by name.
    let mut ordered = Vec::with_capacity(compiled.graph.inputs.len());
    for &v in &compiled.graph.inputs {
        let input = compiled.graph.value(v).name.clone().unwrap_or_default();
        let Some(i) = names.iter().position(|n| *n == input) else {
            return Err(errors::plain(py, "InputError", format!("input `{input}` is missing")));
        };
        ordered.push(tensors[i].clone());
    }
    let graph = Arc::new(compiled.graph);
    let ran = py.detach(|| {
        let registry = crate::engines::registry(&roots);
        xpu_runtime::plan_and_run(&graph, &ordered, &policy, &registry, None)
    });
    let ran = ran.map_err(|e| match e {
        xpu_runtime::RunError::NoPlan { policy, failure } => {
            errors::plan_error(py, &policy, &failure)
        }
        other => errors::plain(py, "RunError", other.to_string()),
    })?;
    let mut outputs: Vec<(String, Option<xpu_ir::Tensor>)> =
        ran.outputs.into_iter().map(|(n, t)| (n, Some(t))).collect();
    let mut shown = Vec::new();
    for item in compiled.prints {
        let entry = match item {
            PrintItem::Text(text) => ("text", text).into_pyobject(py)?.into_any(),
            PrintItem::Output(output) => {
                let slot = outputs.iter_mut().find(|(n, _)| *n == output);
                let Some(tensor) = slot.and_then(|(_, t)| t.clone()) else {
                    return Err(errors::plain(
                        py,
                        "RunError",
                        format!("printed value `{output}` was not computed"),
                    ));
                };
                let value = arrays::to_numpy(py, tensor)?;
                ("value", output, value).into_pyobject(py)?.into_any()
            }
        };
        shown.push(entry);
    }
    // `write_npy` targets (resolved inside the data roots when the program was lowered).
    for (output, path) in &compiled.writes {
        if let Some((_, Some(tensor))) = outputs.iter().find(|(n, _)| n == output) {
            xpu_runtime::tensors::write_npy(path, tensor)
                .map_err(|e| errors::plain(py, "RunError", format!("{e:#}")))?;
        }
    }
    // The charts `plot` drew (outputs `plot_N`, each its node's `path`), after the printed
    // values: their files' bytes.
    for (output, path) in plot_paths(&graph) {
        let bytes = std::fs::read(&path).map_err(|e| {
            errors::plain(py, "RunError", format!("cannot read the chart {}: {e}", path.display()))
        })?;
        let bytes = pyo3::types::PyBytes::new(py, &bytes);
        let entry = ("plot", output, path.display().to_string(), bytes);
        shown.push(entry.into_pyobject(py)?.into_any());
    }
    Ok(shown)
}

/// The graph's `plot` outputs in order, with the file each writes.
fn plot_paths(graph: &xpu_ir::Graph) -> Vec<(String, PathBuf)> {
    graph
        .outputs
        .iter()
        .filter_map(|out| {
            let xpu_ir::ValueDef::Node { node, .. } = graph.value(out.value).def else {
                return None;
            };
            let node = graph.node(node);
            (node.op == xpu_ir::Op::Plot)
                .then(|| (out.name.clone(), PathBuf::from(node.attrs.str("path", ""))))
        })
        .collect()
}

/// The SGR-ML JSON form (`schemas/sgr.schema.json`) of the program in text form `text`,
/// parsed and verified first. Raises `ProgramError` naming the line and column of a parse
/// error, or every verifier finding.
#[pyfunction]
pub fn sgr_json(py: Python<'_>, text: &str) -> PyResult<String> {
    let graph =
        xpu_ir::text::parse(text).map_err(|e| errors::plain(py, "ProgramError", e.to_string()))?;
    if let Err(findings) = xpu_ir::verify(&graph) {
        let lines: Vec<String> = findings.iter().map(ToString::to_string).collect();
        return Err(errors::plain(py, "ProgramError", lines.join("\n")));
    }
    Ok(xpu_ir::to_json(&graph))
}
