//! Loading a program file by extension: `.onnx`, `.sgr` (text form), `.json` (JSON form), or
//! `.ml` (MiniLang: checked, then lowered to SGR-ML).

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
        "ml" => return Ok(load_minilang(path, bytes)?.graph),
        _ => bail!(
            "{}: unknown program type `.{ext}` (expected .ml, .onnx, .sgr or .json)",
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
    if diags.is_empty()
        && let Err(more) = xpu_minilang::lower::lower_with(
            &program,
            "check",
            Some(&data_roots(path)),
            &xpu_minilang::lower::Inputs {
                allow_undeclared: true,
                models: Some(model_loader()),
                tables: Some(table_loader(data_roots(path).roots())),
                ..Default::default()
            },
        )
    {
        diags = more;
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
                &serde_json::json!({"program": name, "ok": errors == 0, "statements": program.stmts.len(), "diagnostics": list})
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

/// Parses, checks and lowers a `.ml` file; every diagnostic is rendered into the error.
pub fn load_minilang(path: &Path, bytes: Vec<u8>) -> Result<MiniLang> {
    load_minilang_with(path, bytes, &xpu_minilang::lower::Inputs::default())
}

/// [`load_minilang`] with the types of the tensors given for its `input(…)`s.
pub fn load_minilang_with(
    path: &Path,
    bytes: Vec<u8>,
    inputs: &xpu_minilang::lower::Inputs,
) -> Result<MiniLang> {
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
    let name = path.display().to_string();
    let (program, diags) = xpu_minilang::analyze(&text);
    let errors = diags.iter().filter(|d| d.is_error()).count();
    if errors > 0 {
        bail!("{name}: {errors} error(s):\n{}", xpu_minilang::render(&name, &text, &diags));
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let roots = data_roots(path);
    let mut inputs = inputs.clone();
    inputs.models.get_or_insert_with(model_loader);
    inputs.tables.get_or_insert_with(|| table_loader(roots.roots()));
    let lowered = xpu_minilang::lower::lower_with(&program, &stem, Some(&roots), &inputs).map_err(
        |diags| {
            anyhow::anyhow!(
                "{name}: {} error(s):\n{}",
                diags.len(),
                xpu_minilang::render(&name, &text, &diags)
            )
        },
    )?;
    if let Err(errs) = xpu_ir::verify(&lowered.graph) {
        bail!("{name}: internal error: the lowered graph is invalid: {}", errs[0]);
    }
    Ok(MiniLang { graph: lowered.graph, prints: lowered.prints, writes: lowered.writes })
}

/// Files a program names resolve in the working directory or the program's own directory.
pub fn data_roots(program: &Path) -> xpu_minilang::paths::DataRoots {
    xpu_minilang::paths::DataRoots::new([
        std::env::current_dir().unwrap_or_else(|_| ".".into()),
        program
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| ".".into()),
    ])
}

/// How MiniLang's `model("…")` reads a model: any program file xpuctl reads (.onnx, .sgr,
/// .json), verified.
fn model_loader() -> xpu_minilang::lower::ModelLoader {
    std::sync::Arc::new(|p: &Path| load(p).map_err(|e| format!("{e:#}")))
}

/// How MiniLang learns a table file's columns at compile time: the table engine's own reader
/// (DuckDB's CSV sniffer, the Parquet footer, calamine), confined to the data roots.
pub fn table_loader(roots: &[std::path::PathBuf]) -> xpu_minilang::lower::TableSchemaLoader {
    let engine = xpu_engine_table::TableEngine::new(roots.to_vec());
    std::sync::Arc::new(move |op, attrs| engine.source_schema(op, attrs))
}
