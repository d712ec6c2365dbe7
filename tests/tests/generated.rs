//! Generated artefacts that are committed must match what the code generates:
//! `schemas/sgr.schema.json`, `docs/sgr-ops.md`, `docs/onnx-support.md`. `XPU_BLESS=1` rewrites.

fn check_generated(rel: &str, actual: String) {
    let path = xpu_tests::repo_root().join(rel);
    if xpu_tests::bless() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != actual {
        let diff = similar::TextDiff::from_lines(&committed, &actual)
            .unified_diff()
            .header("committed", "generated")
            .to_string();
        panic!("{rel} is stale (run with XPU_BLESS=1 to regenerate):\n{diff}");
    }
}

#[test]
fn sgr_json_schema_is_current() {
    check_generated("schemas/sgr.schema.json", xpu_ir::json_schema());
}

#[test]
fn op_reference_is_current() {
    check_generated("docs/sgr-ops.md", xpu_ir::op::reference_markdown());
}

#[test]
fn onnx_support_page_is_current() {
    check_generated("docs/onnx-support.md", xpu_onnx::support_markdown());
}

#[test]
fn schema_accepts_a_real_graph() {
    // The schema describes the JSON the serializer writes: every top-level key it requires
    // appears in a serialized graph.
    let schema: serde_json::Value = serde_json::from_str(&xpu_ir::json_schema()).unwrap();
    let g = xpu_ir::text::parse("graph \"g\" {\n  %0: f32[N,2] = input \"x\"\n  %1: f32[N,2] = relu(%0)\n  return \"y\" = %1\n}").unwrap();
    let json: serde_json::Value = serde_json::from_str(&xpu_ir::to_json(&g)).unwrap();
    for key in schema["required"].as_array().unwrap() {
        assert!(json.get(key.as_str().unwrap()).is_some(), "serialized graph lacks {key}");
    }
}

#[test]
fn policy_json_schema_is_current() {
    check_generated("schemas/policy.schema.json", xpu_policy::json_schema());
}

#[test]
fn reason_code_page_is_current() {
    check_generated("docs/reason-codes.md", xpu_plan::reason::reference_markdown());
}

#[test]
fn policy_schema_describes_every_section() {
    let schema: serde_json::Value = serde_json::from_str(&xpu_policy::json_schema()).unwrap();
    for section in
        ["policy", "engines", "kernels", "precision", "memory", "execution", "rule", "test"]
    {
        assert!(schema["properties"].get(section).is_some(), "schema lacks [{section}]");
    }
    assert_eq!(
        schema["additionalProperties"],
        serde_json::json!(false),
        "unknown top-level keys must be rejected"
    );
}
