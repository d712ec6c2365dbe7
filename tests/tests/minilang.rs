//! Golden diagnostics: `tests/minilang/*.ml` hold a MiniLang source, then
//! `# ==== expected ====` and the diagnostics `xpuctl check` renders for it (codespan
//! format, no colour): parse and name errors, and — when there are none — the errors of
//! lowering, which reads table files beside the sources (tests/minilang is the data root).
//! `XPU_BLESS=1` rewrites the expectations.

const SEPARATOR: &str = "# ==== expected ====";

fn run_file(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (src, expected) = match text.split_once(SEPARATOR) {
        Some((s, e)) => (s.to_string(), e.trim_start_matches('\n').to_string()),
        None => (text.clone(), String::new()),
    };
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let dir = path.parent().unwrap().to_path_buf();
    let (program, mut diags) = xpu_minilang::analyze(&src);
    if diags.is_empty() {
        let roots = xpu_minilang::paths::DataRoots::new([dir.clone()]);
        let engine = xpu_engine_table::TableEngine::new(vec![dir.clone()]);
        let inputs = xpu_minilang::lower::Inputs {
            allow_undeclared: true,
            tables: Some(std::sync::Arc::new(move |op, attrs| engine.source_schema(op, attrs))),
            ..Default::default()
        };
        if let Err(more) =
            xpu_minilang::lower::lower_with(&program, "golden", Some(&roots), &inputs)
        {
            diags = more;
        }
    }
    // The data root is wherever the clone lives; the expectations name it `$ROOT`. The roots
    // are resolved (symbolic links followed), so a clone reached through a link is named by
    // its real path in the diagnostics.
    let real = dir.canonicalize().unwrap_or_else(|_| dir.clone());
    let mut actual = xpu_minilang::render(&name, &src, &diags)
        .replace(&real.display().to_string(), "$ROOT")
        .replace(&dir.display().to_string(), "$ROOT");
    if diags.is_empty() {
        actual = "(no diagnostics)\n".into();
    }
    xpu_tests::check_golden(path, &src, SEPARATOR, &expected, &actual)
}

#[test]
fn golden_diagnostics() {
    let dir = xpu_tests::repo_root().join("tests/minilang");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/minilang exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5);
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| run_file(f).err().map(|e| format!("{}: {e}", f.display())))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
