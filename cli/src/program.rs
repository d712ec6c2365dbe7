//! Loading a program file by extension: `.onnx`, `.sgr` (text form) or `.json` (JSON form).

use std::path::Path;

use anyhow::{Context, Result, bail};
use xpu_ir::Graph;

/// Reads, parses and verifies a program. Errors name the file (and line:col for text).
pub fn load(path: &Path) -> Result<Graph> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let g = match ext.as_str() {
        "onnx" => xpu_onnx::import_model(&bytes)
            .with_context(|| format!("{}: cannot import the ONNX model", path.display()))?,
        "sgr" => {
            let text = String::from_utf8(bytes)
                .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
            xpu_ir::text::parse(&text).map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))?
        }
        "json" => {
            let text = String::from_utf8(bytes)
                .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
            xpu_ir::from_json(&text).map_err(|e| {
                anyhow::anyhow!("{}:{}:{}: {e}", path.display(), e.line(), e.column())
            })?
        }
        _ => bail!(
            "{}: unknown program type `.{ext}` (expected .onnx, .sgr or .json)",
            path.display()
        ),
    };
    if let Err(errs) = xpu_ir::verify(&g) {
        let list: Vec<String> = errs.iter().take(20).map(|e| format!("  {e}")).collect();
        bail!(
            "{}: the graph is invalid ({} problem(s)):\n{}",
            path.display(),
            errs.len(),
            list.join("\n")
        );
    }
    Ok(g)
}
