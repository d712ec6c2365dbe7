//! Golden plan files: `tests/plans/*.plan` name a program, a policy, an inventory and
//! optional bindings in a `;` header; below `; ==== expected ====` is the explanation
//! text (`--why` form) the planner must produce. `XPU_BLESS=1` rewrites expectations.
//! Paths in the header are relative to the repository root.

use std::collections::BTreeMap;
use std::path::Path;

const SEPARATOR: &str = "; ==== expected ====";

fn run_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (header, expected) = match text.split_once(SEPARATOR) {
        Some((h, e)) => (h.to_string(), e.trim_start_matches('\n').to_string()),
        None => (text.clone(), String::new()),
    };
    let mut fields: BTreeMap<&str, String> = BTreeMap::new();
    for line in header.lines() {
        if let Some(rest) = line.strip_prefix("; ")
            && let Some((k, v)) = rest.split_once(':')
        {
            fields.insert(k.trim(), v.trim().to_string());
        }
    }
    let get = |k: &str| fields.get(k).cloned().ok_or(format!("header lacks `; {k}:`"));
    let program = get("program")?;
    let g = if program.ends_with(".ml") {
        let src = std::fs::read_to_string(&program).map_err(|e| format!("{program}: {e}"))?;
        let (ast, diags) = xpu_minilang::analyze(&src);
        if !diags.is_empty() {
            return Err(xpu_minilang::render(&program, &src, &diags));
        }
        let roots = xpu_minilang::paths::DataRoots::new([xpu_tests::repo_root()]);
        let stem = Path::new(&program).file_stem().unwrap().to_string_lossy().into_owned();
        xpu_minilang::lower::lower(&ast, &stem, Some(&roots))
            .map_err(|d| xpu_minilang::render(&program, &src, &d))?
            .graph
    } else if program.ends_with(".onnx") {
        let bytes = std::fs::read(&program).map_err(|e| format!("{program}: {e}"))?;
        xpu_onnx::import_model(&bytes).map_err(|e| format!("{program}: {e}"))?
    } else {
        let src = std::fs::read_to_string(&program).map_err(|e| format!("{program}: {e}"))?;
        xpu_ir::text::parse(&src).map_err(|e| format!("{program}: {e}"))?
    };
    let policy =
        xpu_policy::Loader::new().load(Path::new(&get("policy")?)).map_err(|e| e.to_string())?;
    let inv_path = get("inventory")?;
    let inv = xpu_policy::load_inventory(Path::new(&inv_path)).map_err(|e| e.to_string())?;
    let mut bindings = BTreeMap::new();
    if let Some(b) = fields.get("bind") {
        for kv in b.split_whitespace() {
            let (k, v) = kv.split_once('=').ok_or(format!("bad binding {kv}"))?;
            bindings.insert(k.to_string(), v.parse::<u64>().map_err(|e| e.to_string())?);
        }
    }
    // As runs plan: the pass pipeline first, constants folded by the cpu kernels.
    let (shared, hash) = (std::sync::Arc::new(g.clone()), g.content_hash());
    let eval = xpu_engine_cpu::CpuEvaluator;
    let ex = match xpu_plan::plan_shared(&shared, &hash, &policy, &inv, &bindings, Some(&eval)) {
        Ok((plan, ex)) => {
            xpu_ir::verify(&plan.graph)
                .map_err(|e| format!("planned graph does not verify: {}", e[0]))?;
            ex
        }
        Err(f) => *f.explanation,
    };
    let actual = xpu_plan::render::explanation_text(&ex, true);
    xpu_tests::check_golden(path, &header, SEPARATOR, &expected, &actual)
}

#[test]
fn golden_plans() {
    // Header paths and the policy locations in the expectations are repository-relative.
    std::env::set_current_dir(xpu_tests::repo_root()).unwrap();
    let mut files: Vec<_> = std::fs::read_dir("tests/plans")
        .expect("tests/plans exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "plan"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "expected the golden plans in tests/plans");
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| run_file(f).err().map(|e| format!("{}: {e}", f.display())))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
