//! `Loader::layer_over`: a layer (the Python package's keyword arguments) merged over a
//! loaded policy as `extends` would merge it, conflicts refused by key.

use std::io::Write;

use xpu_policy::{Loader, Policy};

fn file(text: &str) -> (tempfile::TempDir, Policy) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("base.toml");
    std::fs::File::create(&path).unwrap().write_all(text.as_bytes()).unwrap();
    let policy = Loader::new().load(&path).unwrap();
    (dir, policy)
}

fn codes_and_keys(result: Result<Policy, xpu_policy::Diagnostics>) -> Vec<(String, String)> {
    let diags = result.expect_err("a conflict");
    diags.0.iter().map(|d| (d.code.to_string(), d.key.clone().unwrap_or_default())).collect()
}

const BASE: &str = r#"[policy]
name = "base"

[engines]
order = ["ort", "cpu"]

[memory]
limit = "2500MiB"

[execution]
timeout = "0.5ms"
determinism = "bitwise"

[kernels]
matmul = "cpu.gemm"
"#;

#[test]
fn a_layer_merges_keeping_values_exact_and_origins_of_the_file() {
    let (_dir, base) = file(BASE);
    let merged =
        Loader::new().layer_over(&base, "<kwargs>", "[precision]\ndefault = \"fp32\"\n").unwrap();
    assert_eq!(merged.spec.memory.limit, base.spec.memory.limit, "2500MiB stays 2500MiB");
    assert_eq!(merged.spec.execution.timeout, base.spec.execution.timeout, "0.5 ms stays");
    assert_eq!(merged.spec.engines.order, ["ort", "cpu"]);
    assert_eq!(merged.spec.precision.default.map(|p| p.name()), Some("fp32"));
    assert!(
        merged.origin("engines.order").file.ends_with("base.toml"),
        "{:?}",
        merged.origin("engines.order")
    );
    assert_eq!(merged.origin("precision.default").file, "<kwargs>");
    assert_eq!(merged.files, base.files);
    // Layering again still knows the file set `execution.determinism`.
    let again =
        Loader::new().layer_over(&merged, "<kwargs2>", "[execution]\ndeterminism = \"off\"\n");
    assert_eq!(codes_and_keys(again), [("P0013".into(), "execution.determinism".into())]);
}

#[test]
fn conflicting_keys_are_refused_by_name_and_equal_ones_merge() {
    let (_dir, base) = file(BASE);
    let clash = Loader::new().layer_over(&base, "<kwargs>", "[engines]\norder = [\"cpu\"]\n");
    assert_eq!(codes_and_keys(clash), [("P0013".into(), "engines.order".into())]);
    let same =
        Loader::new().layer_over(&base, "<kwargs>", "[engines]\norder = [\"ort\", \"cpu\"]\n");
    assert!(same.is_ok(), "{same:?}");
    // A key the file leaves at its built-in default is no conflict.
    let fresh = Loader::new().layer_over(&base, "<kwargs>", "[engines]\nfallback = \"deny\"\n");
    assert!(fresh.is_ok(), "{fresh:?}");
}

#[test]
fn a_rule_for_every_node_conflicts_with_the_files_pins_and_rules() {
    let (_dir, base) = file(&format!(
        "{BASE}\n[[rule]]\nname = \"big\"\nwhen = {{ op = \"matmul\" }}\nengine = \"cpu\"\n"
    ));
    let layer = "[[rule]]\nname = \"device\"\nwhen = {}\nengine = \"ort\"\nkernel = \"ort.cuda\"\n";
    let found = codes_and_keys(Loader::new().layer_over(&base, "<kwargs>", layer));
    assert!(found.contains(&("P0013".into(), "kernels.matmul".into())), "{found:?}");
    assert!(found.contains(&("P0013".into(), "rule[0]".into())), "{found:?}");
    // Over a policy with neither, the rule merges and goes first.
    let (_dir2, plain) = file("[policy]\nname = \"plain\"\n");
    let merged = Loader::new().layer_over(&plain, "<kwargs>", layer).unwrap();
    assert_eq!(merged.spec.rules[0].kernel.as_deref(), Some("ort.cuda"));
}

#[test]
fn a_malformed_layer_is_located() {
    let (_dir, base) = file(BASE);
    let err = Loader::new().layer_over(&base, "<kwargs>", "[engines\n").unwrap_err();
    assert_eq!(err.0[0].at.file, "<kwargs>");
    assert_eq!(err.0[0].code, "P0001");
}
