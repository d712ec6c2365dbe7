//! Loading a program file by extension: `.onnx`, `.sgr` (text form), `.json` (JSON form), or
//! `.ml` (MiniLang: checked, then lowered to SGR-ML).

use std::path::Path;

use anyhow::{Context, Result};
use xpu_ir::Graph;

/// Reads, parses and verifies a program. Errors name the file (and line:col for text).
pub fn load(path: &Path) -> Result<Graph> {
    Ok(xpu_runtime::program::load(path)?)
}

pub fn is_minilang(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("ml"))
}

/// `xpuctl check prog.ml`: every diagnostic, rendered (or as JSON); Ok(false) when any is
/// an error.
pub fn check_minilang(path: &Path, json: bool) -> Result<bool> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
    let (program, mut diags) = xpu_minilang::analyze(&text);
    // A program that parses is also lowered: compile-time type, shape and path errors are
    // diagnostics too (nothing runs).
    let roots = xpu_runtime::program::data_roots_of(path);
    // Lowered when nothing is wrong: what it writes is then known (null otherwise).
    let mut writes = None;
    if !diags.iter().any(|d| d.is_error()) {
        match xpu_minilang::lower::lower_with(
            &program,
            "check",
            Some(&roots),
            &xpu_minilang::lower::Inputs {
                allow_undeclared: true,
                models: Some(xpu_runtime::program::model_loader()),
                tables: Some(xpu_runtime::program::table_loader(roots.roots())),
                ..Default::default()
            },
        ) {
            Ok(lowered) => writes = Some(lowered.written_files()),
            Err(more) => diags.extend(more),
        }
    }
    let errors = diags.iter().filter(|d| d.is_error()).count();
    let name = path.display().to_string();
    if json {
        let list: Vec<_> = diags
            .iter()
            .map(|d| {
                let (line, col) = d.line_col(&text);
                serde_json::json!({
                    "code": d.code, "severity": if d.is_error() { "error" } else { "warning" },
                    "file": name, "line": line, "col": col, "message": d.message,
                    "label": d.label, "help": d.help,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"program": name, "ok": errors == 0, "statements": program.stmts.len(), "diagnostics": list, "writes": writes})
            )?
        );
    } else {
        print!("{}", xpu_minilang::render(&name, &text, &diags));
        if errors == 0 {
            println!("{name}: ok ({} statements)", program.stmts.len());
        } else {
            println!("{name}: {errors} error(s)");
        }
    }
    Ok(errors == 0)
}

/// A MiniLang program lowered to SGR-ML, with what its `print` statements show, in order.
pub struct MiniLang {
    pub graph: Graph,
    pub prints: Vec<xpu_minilang::lower::PrintItem>,
    pub writes: Vec<(String, std::path::PathBuf)>,
}

/// Parses, checks and lowers a `.ml` file with the types of the tensors given for its
/// `input(…)`s; every diagnostic is rendered into the error.
pub fn load_minilang_with(
    path: &Path,
    bytes: Vec<u8>,
    inputs: &xpu_minilang::lower::Inputs,
) -> Result<MiniLang> {
    let name = path.display().to_string();
    let roots = xpu_runtime::program::data_roots_of(path);
    let c = xpu_runtime::program::compile(&name, &bytes, &roots, inputs)?;
    Ok(MiniLang { graph: c.graph, prints: c.prints, writes: c.writes })
}
