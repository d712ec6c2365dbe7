//! The builtin table is what the checker and `xpuctl ask`'s language reference read: its
//! examples must be real programs, and its names must be exactly what the checker knows.

use std::sync::Arc;

use xpu_ir::DType;
use xpu_minilang::builtins::{BUILTINS, Family, is_builtin, lookup};
use xpu_minilang::lower::{Inputs, ModelLoader, lower_with};

/// Lowers `src` as `xpuctl check` does, against a fake table reader (every file has the
/// columns name, city: string, age: i64, fare: f64) and a one-node model `net.sgr`.
fn lower_example(src: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    for f in ["people.csv", "people.xlsx", "people.parquet"] {
        std::fs::write(dir.path().join(f), "unused").unwrap();
    }
    std::fs::write(
        dir.path().join("net.sgr"),
        "graph \"net\" {\n  %0: f64[N,2] = input \"x\"\n  %1: f64[N,2] = relu(%0)\n  return \"y\" = %1\n}\n",
    )
    .unwrap();
    let roots = xpu_minilang::paths::DataRoots::new([dir.path().to_path_buf()]);
    let models: ModelLoader = Arc::new(|p: &std::path::Path| {
        xpu_ir::text::parse(&std::fs::read_to_string(p).unwrap()).map_err(|e| e.to_string())
    });
    let inputs = Inputs {
        models: Some(models),
        tables: Some(Arc::new(|_, _| {
            Ok(vec![
                ("name".into(), DType::String),
                ("city".into(), DType::String),
                ("age".into(), DType::I64),
                ("fare".into(), DType::F64),
            ])
        })),
        ..Default::default()
    };
    let (program, diags) = xpu_minilang::analyze(src);
    if !diags.is_empty() {
        return Err(xpu_minilang::render("example.ml", src, &diags));
    }
    lower_with(&program, "example", Some(&roots), &inputs)
        .map(|_| ())
        .map_err(|d| xpu_minilang::render("example.ml", src, &d))
}

#[test]
fn every_example_parses_checks_and_lowers() {
    let failures: Vec<String> = BUILTINS
        .iter()
        .filter_map(|b| {
            lower_example(b.example).err().map(|e| format!("{} ({:?}):\n{e}", b.name, b.family))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_example_calls_its_own_function() {
    for b in BUILTINS {
        assert!(
            b.example.contains(&format!("{}(", b.name))
                || b.example.contains(&format!("|> {}", b.name)),
            "{}: {}",
            b.name,
            b.example
        );
    }
}

#[test]
fn the_checker_knows_exactly_the_table() {
    // Every non-row builtin is known to the checker; a name not in the table is not.
    for b in BUILTINS.iter().filter(|b| b.family != Family::Row) {
        let (_, diags) = xpu_minilang::analyze(&format!("let f = {}\n", b.name));
        assert!(diags.iter().all(|d| d.code != "E0100"), "{}: {diags:?}", b.name);
    }
    let (_, diags) = xpu_minilang::analyze("print load_cvs(\"a.csv\")\n");
    assert_eq!(diags[0].code, "E0100");
    assert!(diags[0].help.as_deref().unwrap_or("").contains("load_csv"), "{diags:?}");
    // Row functions are names only inside row expressions.
    assert!(!is_builtin("floor") && lookup("floor").count() == 1);
    assert!(is_builtin("sum") && lookup("sum").count() == 2);
}

#[test]
fn signatures_name_types_and_defaults() {
    let load = lookup("load_csv").next().unwrap();
    assert_eq!(
        load.signature(),
        "load_csv(path: string, sep: string = \",\", *, header: bool = true, na_values: list[string] = pandas' markers) -> table"
    );
    let agg = lookup("agg").next().unwrap();
    assert!(agg.signature().ends_with(", …) -> table"), "{}", agg.signature());
    // Names are unique within a family.
    let mut seen = std::collections::HashSet::new();
    for b in BUILTINS {
        assert!(seen.insert((b.name, b.family)), "{} twice in {:?}", b.name, b.family);
    }
}
